//! No input makes the server answer 5xx: random JSON (deterministic, from proptest's strategies)
//! in every body field of every route, and random query strings, against the real server.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::server::TestServer;

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,300}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn assert_not_5xx(status: StatusCode, what: &str) {
    assert!(
        status.is_success() || status.is_client_error(),
        "{what} -> {status}"
    );
}

#[tokio::test]
async fn no_input_makes_the_server_answer_5xx() {
    let server = TestServer::start().await;
    let mut runner = TestRunner::deterministic();
    let values = arbitrary_json();
    let queries = "[ -~]{0,60}";
    for _ in 0..150 {
        let value = values.new_tree(&mut runner).expect("a value").current();
        let bodies = [
            ("/v1/heartbeats", Method::POST, value.clone()),
            (
                "/v1/heartbeats",
                Method::POST,
                json!({"key": value.clone()}),
            ),
            (
                "/v1/heartbeats",
                Method::POST,
                json!({"key": "k", "ttl_ms": value.clone()}),
            ),
            (
                "/v1/heartbeats",
                Method::POST,
                json!({"key": "k", "ttl_s": value.clone(), "service": "s"}),
            ),
            (
                "/v1/heartbeats",
                Method::POST,
                json!({"key": "k", "service": value.clone()}),
            ),
            (
                "/v1/heartbeats",
                Method::POST,
                json!({"key": "k", "meta": value.clone()}),
            ),
            ("/v1/heartbeats/batch", Method::POST, value.clone()),
            (
                "/v1/heartbeats/batch",
                Method::POST,
                json!({"heartbeats": [value.clone(), {"key": "k"}]}),
            ),
            ("/v1/keys/k/ttl", Method::PUT, value.clone()),
            (
                "/v1/keys/k/ttl",
                Method::PUT,
                json!({"ttl_ms": value.clone()}),
            ),
            (
                "/v1/keys/k/ttl",
                Method::PUT,
                json!({"at_ms": value.clone(), "condition": "gt"}),
            ),
        ];
        for (path, method, body) in bodies {
            let (status, _) = server.call(method.clone(), path, Some(body.clone())).await;
            assert_not_5xx(status, &format!("{method} {path} {body}"));
        }
        let query = queries.new_tree(&mut runner).expect("a query").current();
        let encoded: String = query
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"=&_-.".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        for path in [
            format!("/v1/keys?{encoded}"),
            format!("/v1/keys/{encoded}"),
            format!("/v1/keys/{encoded}/ttl"),
        ] {
            let (status, _) = server.get(&path).await;
            assert_not_5xx(status, &path);
        }
    }
}
