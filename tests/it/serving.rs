//! Per-core serving in process (`ttlwheel::placement`): connections served by threads of their
//! own share one registry; events made by a request on one thread reach a stream on another;
//! keys expire on the ticker's thread; and a stop ends streams and returns.
//!
//! Real time: paused time reaches only the test's own runtime, not the serving threads'.

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
