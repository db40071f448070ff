//! Every route and every error of the HTTP API, against the real server over a real socket.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::server::{code, encode, TestServer};

#[tokio::test]
async fn a_heartbeat_registers_then_renews_with_the_default_ttl() {
    let server = TestServer::start().await;
    let (status, body) = server
        .post("/v1/heartbeats", json!({"key": "api-1", "service": "api"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["key"], "api-1");
    assert_eq!(body["service"], "api");
    assert_eq!(body["created"], true);
    assert_eq!(body["ttl_ms"], 30_000);
    assert_eq!(body["timer"], "wheel");
    assert_eq!(body["expires_in_ms"], 30_000);
    assert!(body["expires_at"].as_str().unwrap().ends_with('Z'));

    let (status, body) = server
        .post("/v1/heartbeats", json!({"key": "api-1", "ttl_ms": 1500}))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["created"], false);
    assert_eq!(body["service"], "api", "an absent service is kept");
    assert_eq!(body["timer"], "heap");
}

#[tokio::test]
async fn prefer_return_minimal_gets_a_204_without_a_body_and_errors_in_full() {
    let server = TestServer::start().await;
    let heartbeat = |body: Value, prefer: &'static str| {
        server
            .client
            .post(server.url("/v1/heartbeats"))
            .header("prefer", prefer)
            .json(&body)
            .send()
    };
    for prefer in [
        "return=minimal",
        "respond-async, RETURN=\"minimal\"",
        "wait=10; foo, return=minimal",
    ] {
        let response = heartbeat(json!({"key": "min-1", "ttl_s": 60}), prefer)
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NO_CONTENT, "{prefer}");
        assert_eq!(response.headers()["preference-applied"], "return=minimal");
        assert!(response.bytes().await.unwrap().is_empty());
    }
    // The heartbeat was taken all the same.
    let (status, body) = server.get("/v1/keys/min-1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["ttl_ms"], 60_000);
    // Any other preference gets the full answer; an error is answered in full either way.
    let response = heartbeat(json!({"key": "min-1"}), "return=representation")
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(crate::server::json_of(response).await.1["created"], false);
    let response = heartbeat(json!({"key": "min-2", "ttl_s": -1}), "return=minimal")
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        code(&crate::server::json_of(response).await.1),
        "invalid_ttl"
    );
}

#[tokio::test]
async fn meta_replaces_when_given_and_is_kept_when_absent() {
    let server = TestServer::start().await;
    server
        .post("/v1/heartbeats", json!({"key": "m", "meta": {"zone": "a"}}))
        .await;
    server.post("/v1/heartbeats", json!({"key": "m"})).await;
    assert_eq!(
        server.get("/v1/keys/m").await.1["meta"],
        json!({"zone": "a"})
    );
    server
        .post(
            "/v1/heartbeats",
            json!({"key": "m", "meta": {"zone": "b", "n": 2}}),
        )
        .await;
    assert_eq!(
        server.get("/v1/keys/m").await.1["meta"],
        json!({"zone": "b", "n": 2})
    );
}

#[tokio::test]
async fn bad_heartbeats_get_the_documented_4xx_errors() {
    let server = TestServer::start().await;
    let cases: Vec<(Value, &str)> = vec![
        (json!({"key": 5}), "invalid_json"),
        (json!({"key": "k", "ttl": 5}), "invalid_json"),
        (json!({}), "invalid_json"),
        (json!({"key": ""}), "invalid_key"),
        (json!({"key": "k".repeat(257)}), "invalid_key"),
        (json!({"key": "a\u{0007}b"}), "invalid_key"),
        (
            json!({"key": "k", "service": "has space"}),
            "invalid_service",
        ),
        (
            json!({"key": "k", "service": "s".repeat(129)}),
            "invalid_service",
        ),
        (json!({"key": "k", "meta": [1, 2]}), "invalid_meta"),
        (json!({"key": "k", "meta": "text"}), "invalid_meta"),
        (
            json!({"key": "k", "meta": {"x": "y".repeat(4096)}}),
            "invalid_meta",
        ),
        (
            json!({"key": "k", "ttl_s": 1, "ttl_ms": 1000}),
            "invalid_ttl",
        ),
        (json!({"key": "k", "ttl_ms": 0}), "invalid_ttl"),
        (json!({"key": "k", "ttl_ms": -5}), "invalid_ttl"),
        (json!({"key": "k", "ttl_s": 31_536_001}), "invalid_ttl"),
        (json!({"key": "k", "ttl_ms": 1.5}), "invalid_ttl"),
    ];
    for (body, expected) in cases {
        let (status, answer) = server.post("/v1/heartbeats", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {answer}");
        assert_eq!(code(&answer), expected, "{body} -> {answer}");
        assert!(!answer["error"]["message"].as_str().unwrap().is_empty());
    }
    let (status, answer) = server
        .post_raw("/v1/heartbeats", "application/json", "{\"key\": ")
        .await;
    assert_eq!(
        (status, code(&answer)),
        (StatusCode::BAD_REQUEST, "invalid_json")
    );
    let (status, answer) = server
        .post_raw("/v1/heartbeats", "text/plain", "{\"key\":\"k\"}")
        .await;
    assert_eq!(
        (status, code(&answer)),
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
    );
    let big = format!(
        "{{\"key\":\"k\",\"meta\":{{\"x\":\"{}\"}}}}",
        "y".repeat(70 * 1024)
    );
    let (status, answer) = server
        .post_raw("/v1/heartbeats", "application/json", big)
        .await;
    assert_eq!(
        (status, code(&answer)),
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
    );
    // Nothing was registered by any of them.
    assert_eq!(server.get("/v1/keys").await.1["keys"], json!([]));
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_even_without_a_content_length() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = TestServer::start().await;
    let address = server.base.trim_start_matches("http://").to_string();
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = "POST /v1/heartbeats HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
                transfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    socket.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b' '; 16 * 1024];
    for _ in 0..6 {
        let sent = socket
            .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
            .await;
        if sent.is_err()
            || socket.write_all(&chunk).await.is_err()
            || socket.write_all(b"\r\n").await.is_err()
        {
            break; // the server may stop reading once the limit is passed
        }
    }
    let _ = socket.write_all(b"0\r\n\r\n").await;
    let mut answer = String::new();
    socket.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
}

#[tokio::test]
async fn unknown_routes_and_wrong_methods_are_json_404_and_405() {
    let server = TestServer::start().await;
    let (status, body) = server.get("/v2/nothing").await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::NOT_FOUND, "route_not_found")
    );
    let (status, body) = server.call(Method::PATCH, "/v1/heartbeats", None).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
    );
    let (status, body) = server.call(Method::POST, "/v1/keys/k", None).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
    );
}

#[tokio::test]
async fn keys_with_slashes_work_percent_encoded_on_every_key_route() {
    let server = TestServer::start().await;
    let key = "svc/host:8080/π ünïcode";
    assert_eq!(
        server
            .post("/v1/heartbeats", json!({"key": key, "ttl_s": 60}))
            .await
            .0,
        StatusCode::OK
    );
    let path = format!("/v1/keys/{}", encode(key));
    let (status, body) = server.get(&path).await;
    assert_eq!((status, body["key"].as_str()), (StatusCode::OK, Some(key)));
    let (status, body) = server.get(&format!("{path}/ttl")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body["ttl_ms"].as_i64().unwrap() > 59_000);
    let (status, body) = server
        .call(
            Method::PUT,
            &format!("{path}/ttl"),
            Some(json!({"ttl_ms": 5000})),
        )
        .await;
    assert_eq!((status, &body["applied"]), (StatusCode::OK, &json!(true)));
    let (status, body) = server
        .call(Method::DELETE, &format!("{path}/ttl"), None)
        .await;
    assert_eq!((status, &body["applied"]), (StatusCode::OK, &json!(true)));
    assert_eq!(
        server.call(Method::DELETE, &path, None).await.0,
        StatusCode::NO_CONTENT
    );
    let (status, body) = server.get(&path).await;
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "not_found"));
}

#[tokio::test]
async fn a_bad_key_in_the_path_is_invalid_key() {
    let server = TestServer::start().await;
    let long = "k".repeat(257);
    for path in [
        format!("/v1/keys/{long}"),
        "/v1/keys/a%07b".to_string(),
        "/v1/keys/%FF%FE/ttl".to_string(),
    ] {
        let (status, body) = server.get(&path).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::BAD_REQUEST, "invalid_key"),
            "{path}"
        );
    }
}

#[tokio::test]
async fn the_liveness_list_is_sorted_paged_and_filtered() {
    let server = TestServer::start().await;
    for (key, service) in [
        ("b/2", "web"),
        ("a/1", "web"),
        ("c/3", "db"),
        ("a/2", "db"),
        ("a/3", "web"),
    ] {
        server
            .post(
                "/v1/heartbeats",
                json!({"key": key, "service": service, "ttl_s": 60}),
            )
            .await;
    }
    let keys = |body: &Value| {
        body["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["key"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let (status, page) = server.get("/v1/keys?limit=2").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(keys(&page), ["a/1", "a/2"]);
    assert_eq!(page["next_cursor"], "a/2");
    let (_, page) = server.get("/v1/keys?limit=2&cursor=a%2F2").await;
    assert_eq!(keys(&page), ["a/3", "b/2"]);
    let (_, page) = server.get("/v1/keys?limit=2&cursor=b%2F2").await;
    assert_eq!(keys(&page), ["c/3"]);
    assert_eq!(page["next_cursor"], Value::Null);
    assert_eq!(
        keys(&server.get("/v1/keys?service=web").await.1),
        ["a/1", "a/3", "b/2"]
    );
    assert_eq!(
        keys(&server.get("/v1/keys?prefix=a%2F").await.1),
        ["a/1", "a/2", "a/3"]
    );
    assert_eq!(
        keys(&server.get("/v1/keys?service=db&prefix=c").await.1),
        ["c/3"]
    );
    assert_eq!(
        keys(&server.get("/v1/keys?service=nobody").await.1),
        Vec::<String>::new()
    );
    let entry = &server.get("/v1/keys?prefix=c").await.1["keys"][0];
    for field in [
        "key",
        "service",
        "meta",
        "ttl_ms",
        "expires_in_ms",
        "expires_at",
        "registered_at",
        "last_heartbeat_at",
        "timer",
    ] {
        assert!(entry.get(field).is_some(), "{field} missing in {entry}");
    }
    for bad in [
        "limit=0",
        "limit=1001",
        "limit=x",
        "state=dead",
        "colour=red",
        "service=bad%20name",
    ] {
        let (status, body) = server.get(&format!("/v1/keys?{bad}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert!(
            ["invalid_query", "invalid_service"].contains(&code(&body)),
            "{bad}: {body}"
        );
    }
}

#[tokio::test]
async fn a_key_that_stops_heartbeating_moves_from_the_alive_list_to_the_expired_one() {
    let server = TestServer::start().await;
    server
        .post(
            "/v1/heartbeats",
            json!({"key": "short", "service": "jobs", "ttl_ms": 200, "meta": {"pid": 7}}),
        )
        .await;
    server
        .post(
            "/v1/heartbeats",
            json!({"key": "long", "service": "jobs", "ttl_s": 60}),
        )
        .await;
    assert_eq!(server.get("/v1/keys/short").await.0, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let alive = server.get("/v1/keys?service=jobs").await.1;
    assert_eq!(alive["keys"].as_array().unwrap().len(), 1, "{alive}");
    assert_eq!(alive["keys"][0]["key"], "long");
    assert_eq!(server.get("/v1/keys/short").await.0, StatusCode::NOT_FOUND);
    let (status, expired) = server.get("/v1/keys?state=expired").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(expired["keys"][0]["key"], "short");
    assert_eq!(expired["keys"][0]["meta"], json!({"pid": 7}));
    assert!(expired["keys"][0]["expired_at"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    server
        .post("/v1/heartbeats", json!({"key": "loner", "ttl_s": 60}))
        .await;
    let services = server.get("/v1/services").await.1;
    assert_eq!(
        services,
        json!({
            "services": [{"service": "jobs", "alive": 1, "expired": 1}],
            "without_service": {"alive": 1, "expired": 0},
            "total": {"alive": 2, "expired": 1},
            "max_keys": 50_000_000,
        })
    );
    // Registering again takes it off the expired list.
    server
        .post("/v1/heartbeats", json!({"key": "short", "ttl_s": 60}))
        .await;
    assert_eq!(
        server.get("/v1/keys?state=expired").await.1["keys"],
        json!([])
    );
}

#[tokio::test]
async fn a_batch_applies_good_items_and_reports_bad_ones_in_order() {
    let server = TestServer::start().await;
    let batch = json!({"heartbeats": [
        {"key": "b1", "ttl_s": 10},
        {"key": ""},
        {"key": "b2", "ttl_ms": 250, "service": "svc"},
        {"key": "b3", "bogus": 1},
        "not an object",
    ]});
    let (status, body) = server.post("/v1/heartbeats/batch", batch).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 5);
    assert_eq!(
        (results[0]["key"].as_str(), results[0]["created"].as_bool()),
        (Some("b1"), Some(true))
    );
    assert_eq!(code(&results[1]), "invalid_key");
    assert_eq!(results[2]["timer"], "heap");
    assert_eq!(code(&results[3]), "invalid_json");
    assert_eq!(code(&results[4]), "invalid_json");
    assert_eq!(server.get("/v1/keys/b1").await.0, StatusCode::OK);

    let compact = json!({"heartbeats": [
        {"key": "b4"},
        {"key": "b5", "ttl_s": 0},
        {"key": "b6", "ttl_ms": 1500},
        7,
    ]});
    let (status, body) = server
        .post("/v1/heartbeats/batch?results=errors", compact)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (body["accepted"].as_u64(), body["failed"].as_u64()),
        (Some(2), Some(2))
    );
    let errors = body["errors"].as_array().unwrap();
    assert_eq!(
        errors
            .iter()
            .map(|e| (
                e["index"].as_u64().unwrap(),
                e["error"]["code"].as_str().unwrap()
            ))
            .collect::<Vec<_>>(),
        vec![(1, "invalid_ttl"), (3, "invalid_json")]
    );
    assert_eq!(server.get("/v1/keys/b6").await.0, StatusCode::OK);
    let (status, body) = server
        .post(
            "/v1/heartbeats/batch?results=every",
            json!({"heartbeats": []}),
        )
        .await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::BAD_REQUEST, "invalid_query")
    );

    let too_many: Vec<Value> = (0..1001).map(|i| json!({"key": format!("k{i}")})).collect();
    let (status, body) = server
        .post("/v1/heartbeats/batch", json!({"heartbeats": too_many}))
        .await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::BAD_REQUEST, "batch_too_large")
    );
    let huge: Vec<Value> = (0..1000)
        .map(|i| json!({"key": format!("k{i}"), "meta": {"pad": "x".repeat(1100)}}))
        .collect();
    let (status, body) = server
        .post("/v1/heartbeats/batch", json!({"heartbeats": huge}))
        .await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
    );
    let (status, body) = server
        .post("/v1/heartbeats/batch", json!({"items": []}))
        .await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::BAD_REQUEST, "invalid_json")
    );
}

#[tokio::test]
async fn ttl_control_follows_redis_semantics_over_http() {
    let server = TestServer::start().await;
    server
        .post("/v1/heartbeats", json!({"key": "t", "ttl_s": 100}))
        .await;
    let put = |body: Value| server.call(Method::PUT, "/v1/keys/t/ttl", Some(body));
    let (status, body) = put(json!({"ttl_ms": 50_000, "condition": "gt"})).await;
    assert_eq!(
        (status, body.clone()),
        (
            StatusCode::OK,
            json!({"applied": false, "deleted": false, "ttl_ms": body["ttl_ms"]})
        )
    );
    assert!(body["ttl_ms"].as_i64().unwrap() > 99_000);
    let (_, body) = put(json!({"ttl_ms": 50_000, "condition": "lt"})).await;
    assert_eq!(
        body,
        json!({"applied": true, "deleted": false, "ttl_ms": 50_000})
    );
    let (_, body) = put(json!({"ttl_ms": 50_000, "condition": "nx"})).await;
    assert_eq!(body["applied"], false);
    let (_, body) = server.call(Method::DELETE, "/v1/keys/t/ttl", None).await;
    assert_eq!(body, json!({"applied": true}));
    assert_eq!(server.get("/v1/keys/t/ttl").await.1, json!({"ttl_ms": -1}));
    let persisted = server.get("/v1/keys/t").await.1;
    assert_eq!(
        (persisted["ttl_ms"].clone(), persisted["timer"].clone()),
        (Value::Null, Value::Null)
    );
    let (_, body) = server.call(Method::DELETE, "/v1/keys/t/ttl", None).await;
    assert_eq!(body, json!({"applied": false}));
    let (_, body) = put(json!({"ttl_ms": 20_000, "condition": "xx"})).await;
    assert_eq!(body["applied"], false);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let (_, body) = put(json!({"at_ms": now_ms + 30_000})).await;
    assert_eq!(body["applied"], true);
    // The server's wall clock is its start-up wall time plus monotonic time since, so it may
    // differ from this process's clock by a few milliseconds either way.
    assert!(
        (29_000..=31_000).contains(&body["ttl_ms"].as_i64().unwrap()),
        "{body}"
    );
    let (_, body) = put(json!({"ttl_ms": 0})).await;
    assert_eq!(body, json!({"applied": true, "deleted": true}));
    assert_eq!(server.get("/v1/keys/t").await.0, StatusCode::NOT_FOUND);

    for (body, expected) in [
        (json!({}), "invalid_ttl"),
        (json!({"ttl_ms": 1, "at_ms": 1}), "invalid_ttl"),
        (json!({"ttl_ms": 31_536_000_001i64}), "invalid_ttl"),
        (json!({"ttl_ms": 1, "condition": "maybe"}), "invalid_json"),
    ] {
        server.post("/v1/heartbeats", json!({"key": "t"})).await;
        let (status, answer) = put(body.clone()).await;
        assert_eq!(
            (status, code(&answer)),
            (StatusCode::BAD_REQUEST, expected),
            "{body}"
        );
    }
    for method in [Method::GET, Method::DELETE] {
        let (status, body) = server.call(method, "/v1/keys/missing/ttl", None).await;
        assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "not_found"));
    }
    let (status, body) = server
        .call(
            Method::PUT,
            "/v1/keys/missing/ttl",
            Some(json!({"ttl_ms": 5})),
        )
        .await;
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "not_found"));
    let (status, body) = server.call(Method::DELETE, "/v1/keys/missing", None).await;
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "not_found"));
}

#[tokio::test]
async fn health_and_the_spec_are_served() {
    let server = TestServer::start().await;
    assert_eq!(
        server.get("/healthz").await,
        (StatusCode::OK, json!({"status": "ok"}))
    );
    let response = server
        .client
        .get(server.url("/openapi.yaml"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/yaml");
    let text = response.text().await.unwrap();
    assert_eq!(
        text,
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml")).unwrap()
    );
}

#[tokio::test]
async fn shutdown_finishes_and_then_refuses_connections() {
    let server = TestServer::start().await;
    let url = server.url("/healthz");
    assert_eq!(
        server.post("/v1/heartbeats", json!({"key": "k"})).await.0,
        StatusCode::OK
    );
    let client = server.client.clone();
    tokio::time::timeout(Duration::from_secs(5), server.shutdown())
        .await
        .expect("stops promptly")
        .expect("clean stop");
    assert!(client.get(url).send().await.is_err(), "no longer accepting");
}
