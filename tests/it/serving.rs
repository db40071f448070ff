//! Per-core serving in process (`ttlwheel::placement`): connections served by threads of their
//! own share one registry; events made by a request on one thread reach a stream on another;
//! keys expire on the ticker's thread; and a stop ends streams and returns.
//!
//! Real time: paused time reaches only the test's own runtime, not the serving threads'.

use std::collections::BTreeSet;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use ttlwheel::config::Config;
use ttlwheel::placement::Placement;

use crate::server::{json_of, TestServer};
use crate::stream::SseClient;

/// A client with a connection of its own.
fn own_connection() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_on_different_serving_threads_share_keys_events_and_expiry() {
    let placement = Placement::per_core(2).expect("serving threads start");
    let server = TestServer::with_placement(Config::ephemeral(), placement).await;
    // Connections go to the serving threads in turn: the stream's on one, the next client's on
    // the other, and so on.
    let streaming = own_connection();
    let mut stream = SseClient::connect_with(&streaming, &server, "", None).await;
    let clients: Vec<reqwest::Client> = (0..4).map(|_| own_connection()).collect();
    for (index, client) in clients.iter().enumerate() {
        let response = client
            .post(server.url("/v1/heartbeats"))
            .json(&json!({"key": format!("k{index}"), "ttl_s": 60}))
            .send()
            .await
            .expect("sent");
        let (status, body) = json_of(response).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["created"], true);
    }
    // Every connection sees the keys registered on the others.
    for (index, client) in clients.iter().enumerate() {
        let other = format!("k{}", (index + 1) % clients.len());
        let response = client
            .get(server.url(&format!("/v1/keys/{other}")))
            .send()
            .await
            .expect("sent");
        let (status, body) = json_of(response).await;
        assert_eq!(status, StatusCode::OK, "{other}: {body}");
    }
    // The stream sees them all, in the order they were made.
    for index in 0..clients.len() {
        let event = stream.next().await;
        assert_eq!(event.event, "registered");
        assert_eq!(event.data["key"], format!("k{index}"));
    }
    // A short TTL expires on the ticker's thread, and the stream hears of it.
    let response = clients[1]
        .post(server.url("/v1/heartbeats"))
        .json(&json!({"key": "short", "ttl_ms": 200}))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), StatusCode::OK);
    let registered = stream.next().await;
    assert_eq!(
        (registered.event.as_str(), &registered.data["key"]),
        ("registered", &json!("short"))
    );
    let expired = stream.next().await;
    assert_eq!(
        (expired.event.as_str(), &expired.data["key"]),
        ("expired", &json!("short"))
    );
    let (status, _) = server.get("/v1/keys/short").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A stop ends the stream served on its thread and returns.
    let stopped = tokio::time::timeout(Duration::from_secs(20), server.shutdown()).await;
    stopped.expect("stops in time").expect("stops cleanly");
    assert!(stream.ends().await, "the stream ends at the stop");
}

/// More stream clients than one relay group on each serving thread (`stream::relay`): every
/// client gets every event, in order, through the relays' groups and their yields, while the
/// requests that make the events are served on the same threads; and clients that come after
/// the others left (from a relay that ended with its readers, or the same one if the server
/// had not yet seen them go) get the events made after they came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_streams_on_both_serving_threads_get_every_event_in_order() {
    const STREAMS: usize = 2 * ttlwheel::stream::relay::GROUP + 3;
    const EVENTS: usize = 40;
    let placement = Placement::per_core(2).expect("serving threads start");
    let server = TestServer::with_placement(Config::ephemeral(), placement).await;
    let mut streams = Vec::with_capacity(STREAMS);
    for _ in 0..STREAMS {
        streams.push(SseClient::connect_with(&own_connection(), &server, "", None).await);
    }
    let writers: Vec<reqwest::Client> = (0..2).map(|_| own_connection()).collect();
    let made = async {
        for index in 0..EVENTS {
            let response = writers[index % 2]
                .post(server.url("/v1/heartbeats"))
                .json(&json!({"key": format!("m{index:02}"), "ttl_s": 60}))
                .send()
                .await
                .expect("sent");
            assert_eq!(response.status(), StatusCode::OK);
        }
    };
    let heard = futures_util::future::join_all(streams.iter_mut().map(|stream| async move {
        let mut keys = Vec::with_capacity(EVENTS);
        for _ in 0..EVENTS {
            let event = stream.next().await;
            assert_eq!(event.event, "registered");
            keys.push(event.data["key"].as_str().expect("a key").to_owned());
        }
        keys
    }));
    let ((), heard) = tokio::join!(made, heard);
    let expected: Vec<String> = (0..EVENTS).map(|index| format!("m{index:02}")).collect();
    for (client, keys) in heard.iter().enumerate() {
        assert_eq!(keys, &expected, "client {client}");
    }

    // Every client leaves, then an event comes: a relay whose pass finds no reader ends.
    drop(streams);
    let (status, _) = server
        .post("/v1/heartbeats", json!({"key": "unread", "ttl_s": 60}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let mut late = Vec::new();
    for _ in 0..2 {
        late.push(SseClient::connect_with(&own_connection(), &server, "", None).await);
    }
    let (status, _) = server
        .post("/v1/heartbeats", json!({"key": "after", "ttl_s": 60}))
        .await;
    assert_eq!(status, StatusCode::OK);
    for stream in &mut late {
        let event = stream.next().await;
        assert_eq!(
            (event.event.as_str(), &event.data["key"]),
            ("registered", &json!("after"))
        );
    }
    let stopped = tokio::time::timeout(Duration::from_secs(20), server.shutdown()).await;
    stopped.expect("stops in time").expect("stops cleanly");
}

/// Nanoseconds on a CPU of each of this process's threads named `ttlwheel-bulk-*`
/// (`/proc/self/task/*/schedstat`, whose first field is that time).
fn bulk_threads_cpu_ns() -> Vec<u64> {
    let mut times = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc") {
        let path = task.expect("a task").path();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if name.trim().starts_with("ttlwheel-bulk-") {
            let stat = std::fs::read_to_string(path.join("schedstat")).expect("schedstat");
            times.push(stat.split_whitespace().next().unwrap().parse().unwrap());
        }
    }
    times
}

/// Must hold: a batch large enough for the bulk threads (`ttlwheel::bulk`) is applied there,
/// every item on its own and in order, as on a serving thread: a bad item gets its own error at
/// its place, the others are created, and sent again they are renewed; and every item of a
/// batch gets one deadline, the batch's arrival + TTL, however long the thread takes to apply
/// it (the expiry guard counts a partition's keys by the second they fall due).
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_batch_is_applied_on_a_bulk_thread_item_by_item_in_order() {
    let placement = Placement::per_core(2).expect("serving threads start");
    let server = TestServer::with_placement(Config::ephemeral(), placement).await;
    let items: Vec<serde_json::Value> = (0..1000)
        .map(|i| match i {
            10 => json!({"key": "k/with/a/slash?", "ttl_s": 60, "extra": 1}),
            500 => json!({"key": format!("big-{i:04}"), "ttl_s": -5}),
            _ => json!({"key": format!("big-{i:04}"), "ttl_s": 60}),
        })
        .collect();
    let body = json!({ "heartbeats": items });
    assert!(serde_json::to_vec(&body).unwrap().len() > 8 * 1024);
    let before: u64 = bulk_threads_cpu_ns().iter().sum();
    let client = own_connection();
    for round in ["created", "renewed"] {
        let response = client
            .post(server.url("/v1/heartbeats/batch"))
            .json(&body)
            .send()
            .await
            .expect("sent");
        let (status, answer) = json_of(response).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        let results = answer["results"].as_array().expect("results");
        assert_eq!(results.len(), 1000);
        let deadlines: BTreeSet<&str> = (results.iter())
            .filter_map(|result| result["expires_at"].as_str())
            .collect();
        assert_eq!(deadlines.len(), 1, "{round}: one deadline: {deadlines:?}");
        for (i, result) in results.iter().enumerate() {
            match i {
                10 => assert_eq!(result["error"]["code"], "invalid_json", "{result}"),
                500 => assert_eq!(result["error"]["code"], "invalid_ttl", "{result}"),
                _ => {
                    assert_eq!(result["key"], format!("big-{i:04}"), "{round}: in order");
                    assert_eq!(result["created"], round == "created", "{round}: {result}");
                }
            }
        }
    }
    let (status, _) = server.get("/v1/keys/big-0999").await;
    assert_eq!(status, StatusCode::OK);
    let threads = bulk_threads_cpu_ns();
    assert!(
        threads.len() >= 2,
        "a bulk thread per serving thread: {threads:?}"
    );
    let after: u64 = threads.iter().sum();
    assert!(
        after > before,
        "the bulk threads did the work: {before} ns on a CPU before, {after} after"
    );
    drop(server);
}
