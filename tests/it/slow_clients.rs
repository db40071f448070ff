//! An edge that holds, against the real binary: slow or greedy clients cannot take the service
//! down. What must not be lost: a normal client's heartbeat is answered while 2,000 slowloris
//! connections hang on a half-sent header (they are closed at the header timeout) and while
//! 10,000 connections are open; a body sent one byte a second is cut off with a JSON 408; event
//! streams past their cap get a JSON 429.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::process::{temp_data_dir, Server};

/// The server's `host:port`.
fn address(server: &Server) -> String {
    server.base.trim_start_matches("http://").to_owned()
}

/// Opens `n` connections (as many at a time as the machine allows), each sending `send`.
async fn open(address: &str, n: usize, send: &'static [u8]) -> Vec<TcpStream> {
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        let mut stream = TcpStream::connect(address).await.expect("connects");
        if !send.is_empty() {
            stream.write_all(send).await.expect("sends");
        }
        streams.push(stream);
    }
    streams
}

/// A heartbeat from a new client, on a new connection. The test is about connections: the
/// harness's pooled connection, idle while the slow ones are waited for, reaches the header
/// timeout (which also closes idle keep-alive connections) just as it would be reused, and a
/// request written as the server closes is lost in transit (the keep-alive race every HTTP/1.1
/// client has; it failed CI once).
async fn heartbeat(server: &Server, key: &str) -> StatusCode {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a client");
    let answer = client
        .post(format!("{}/v1/heartbeats", server.base))
        .json(&json!({"key": key, "ttl_s": 60}))
        .send()
        .await;
    match answer {
        Ok(response) => response.status(),
        Err(error) => panic!("the heartbeat {key:?} got no answer: {error:?}"),
    }
}

/// Whether the server closed `stream` (a read returns end-of-file or a reset) within `limit`.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut buffer = [0u8; 1024];
    loop {
        match tokio::time::timeout(limit, stream.read(&mut buffer)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // A 408 or an error answer before the close is fine: keep reading to the end.
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_connections_are_closed_at_the_header_timeout_and_others_are_served() {
    ttlwheel::edge::raise_open_files_limit();
    let dir = temp_data_dir("slowloris");
    let server = Server::start(&dir, &["--header-read-timeout", "10s"]);
    server.ready().await;
    let address = address(&server);
    let mut slow = open(
        &address,
        2_000,
        b"POST /v1/heartbeats HTTP/1.1\r\nHost: x\r\nContent-",
    )
    .await;
    // While all 2,000 hang on their half-sent header, a normal client is served.
    assert_eq!(heartbeat(&server, "normal").await, StatusCode::OK);
    let mut still_open = 0;
    // The last ones opened: opening 2,000 can take seconds on a loaded machine.
    for stream in slow.iter_mut().rev().take(50) {
        if !closed_within(stream, Duration::from_millis(1)).await {
            still_open += 1;
        }
    }
    assert_eq!(
        still_open, 50,
        "the slow connections were still open when it was served"
    );
    // Then every one of them is closed by the header timeout (3 s; generous patience here).
    for stream in &mut slow {
        assert!(
            closed_within(stream, Duration::from_secs(20)).await,
            "a slowloris survived"
        );
    }
    assert_eq!(heartbeat(&server, "after").await, StatusCode::OK);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_connections_at_once_leave_the_server_serving() {
    ttlwheel::edge::raise_open_files_limit();
    let dir = temp_data_dir("many-connections");
    let server = Server::start(&dir, &[]);
    server.ready().await;
    let address = address(&server);
    let idle = open(&address, 10_000, b"").await;
    assert_eq!(
        heartbeat(&server, "through-the-crowd").await,
        StatusCode::OK
    );
    let (status, metrics) = server.call(reqwest::Method::GET, "/healthz", None).await;
    assert_eq!(status, StatusCode::OK, "{metrics}");
    drop(idle);
    assert_eq!(heartbeat(&server, "after").await, StatusCode::OK);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_one_byte_a_second_is_cut_off_with_a_json_408() {
    let dir = temp_data_dir("slow-body");
    let server = Server::start(&dir, &["--request-timeout", "2s"]);
    server.ready().await;
    let mut stream = TcpStream::connect(address(&server)).await.unwrap();
    let body = br#"{"key":"slow","ttl_s":60}"#;
    let head = format!(
        "POST /v1/heartbeats HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    for &byte in body.iter() {
        if stream.write_all(&[byte]).await.is_err() {
            break;
        }
        let mut buffer = [0u8; 4096];
        match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => answer.extend_from_slice(&buffer[..n]),
            Err(_) => {}
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#""code":"request_timeout""#), "{answer}");
    assert!(closed_within(&mut stream, Duration::from_secs(5)).await);
    // Nothing was registered from the cut-off body.
    let (status, _) = server
        .call(reqwest::Method::GET, "/v1/keys/slow", None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_streams_past_their_cap_get_a_json_429() {
    let dir = temp_data_dir("stream-cap");
    let server = Server::start(&dir, &["--max-stream-clients", "2"]);
    server.ready().await;
    let url = format!("{}/v1/events", server.base);
    let first = server.client.get(&url).send().await.unwrap();
    let second = server.client.get(&url).send().await.unwrap();
    assert_eq!(
        (first.status(), second.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    let (status, body) = server.call(reqwest::Method::GET, "/v1/events", None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["error"]["code"], "too_many_stream_clients");
    drop(first);
    // A slot frees once a client leaves.
    let mut freed = false;
    for _ in 0..100 {
        let third = server.client.get(&url).send().await.unwrap();
        if third.status() == StatusCode::OK {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(freed, "the slot of the client that left was never freed");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
