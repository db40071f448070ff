//! The HTTP edge under hostile input: bodies that are JSON but not objects, path parameters
//! whose percent-encoding decodes to garbage, a key sent with an unencoded `/`. Every answer
//! is a JSON 4xx (or the route's normal answer), never a 5xx and never plain text.
//!
//! Requests go over a raw TCP connection so that the bytes of the path reach the server exactly
//! as written here: an HTTP client would normalise or refuse them first.

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::server::{code, TestServer};
use ttlwheel::routes;

/// A response as read off the wire.
#[derive(Debug)]
struct Raw {
    status: u16,
    content_type: String,
    body: Value,
}

/// Sends one request with `path` written verbatim and reads the whole response.
async fn raw(server: &TestServer, method: &str, path: &str, body: &str) -> Raw {
    let address = server.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).await.expect("connect");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).await.expect("read");
    let text = String::from_utf8_lossy(&bytes);
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|status| status.parse().ok())
        .expect("a status line");
    let content_type = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default();
    let body = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()));
    Raw {
        status,
        content_type,
        body,
    }
}

/// JSON values that are not objects, as bodies.
const NOT_OBJECTS: [&str; 7] = [
    r#"["k1",null,5,null,null]"#,
    "[]",
    r#""k1""#,
    "5",
    "null",
    "true",
    r#" [{"key":"k1"}]"#,
];

#[tokio::test]
async fn every_json_route_refuses_a_body_that_is_not_an_object() {
    let server = TestServer::start().await;
    server
        .post("/v1/heartbeats", json!({"key": "present"}))
        .await;
    let routes = [
        ("POST", "/v1/heartbeats"),
        ("POST", "/v1/heartbeats/batch"),
        ("PUT", "/v1/keys/present/ttl"),
    ];
    for (method, path) in routes {
        for body in NOT_OBJECTS {
            let answer = raw(&server, method, path, body).await;
            assert_eq!(answer.status, 400, "{method} {path} {body}: {answer:?}");
            assert_eq!(code(&answer.body), "invalid_json", "{method} {path} {body}");
        }
    }
    // The array read positionally registered nothing.
    assert_eq!(server.get("/v1/keys/k1").await.0, 404);
    // Inside a batch, each item must be an object too; the others go on.
    let (status, answer) = server
        .post(
            "/v1/heartbeats/batch",
            json!({"heartbeats": [["k2", null, 5], {"key": "k3"}, "k4"]}),
        )
        .await;
    assert_eq!(status, 200);
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results[0]["error"]["code"], "invalid_json", "{answer}");
    assert_eq!(results[1]["key"], "k3", "{answer}");
    assert_eq!(results[2]["error"]["code"], "invalid_json", "{answer}");
    assert_eq!(server.get("/v1/keys/k2").await.0, 404);
}

/// Path-parameter values whose percent-encoding is hostile: invalid UTF-8 once decoded
/// (lone continuation bytes, overlong forms, surrogates, truncated sequences), stray `%`, NUL
/// and control characters, encoded slashes and dots, and lengths past the key limit.
fn hostile_segments() -> Vec<String> {
    let mut segments: Vec<String> = [
        "%ff",
        "%80",
        "%c0%af",
        "%e0%80%af",
        "%ed%a0%80",
        "%f4%90%80%80",
        "%e2%82",
        "a%ffb",
        "%",
        "%%",
        "%zz",
        "%2",
        "%00",
        "%0a",
        "%7f",
        "%1b%5b31m",
        "%2F",
        "a%2Fb",
        "%2e%2e",
        "..",
        ".",
        "%20",
        "%E2%80%AE",
        "%EF%BF%BF",
        "%F0%9F%92%A9",
    ]
    .iter()
    .map(|segment| segment.to_string())
    .collect();
    segments.push("k".repeat(257));
    segments.push("%e2%82%ac".repeat(90)); // 270 bytes once decoded
    segments.push("%ff".repeat(1000));
    segments
}

#[tokio::test]
async fn hostile_percent_encoding_in_every_path_parameter_gets_a_json_answer() {
    let server = TestServer::start().await;
    let with_parameters: Vec<_> = routes::ALL
        .iter()
        .filter(|route| route.path.contains('{'))
        .collect();
    assert_eq!(with_parameters.len(), 5, "the fuzz covers every such route");
    let mut n_requests = 0;
    for route in with_parameters {
        for segment in hostile_segments() {
            let path = route
                .path
                .replace("{key}", &segment)
                .replace("{id}", &segment);
            for method in ["GET", "PUT", "POST", "DELETE"] {
                let body = if method == "PUT" {
                    r#"{"ttl_ms":5000}"#
                } else {
                    "{}"
                };
                let answer = raw(&server, method, &path, body).await;
                let what = format!("{method} {path}: {answer:?}");
                assert!((200..500).contains(&answer.status), "{what}");
                if answer.status == 204 {
                    continue; // a DELETE that found the key: no body
                }
                assert!(
                    answer.content_type.starts_with("application/json"),
                    "{what}"
                );
                if answer.status >= 400 {
                    code(&answer.body);
                }
                n_requests += 1;
            }
        }
    }
    assert!(n_requests > 300);
    // The one the issue names, and what it says.
    let answer = raw(&server, "POST", "/v1/webhooks/dead-letters/%ff/retry", "").await;
    assert_eq!(answer.status, 400);
    assert_eq!(code(&answer.body), "invalid_path");
    let answer = raw(&server, "GET", "/v1/keys/%ff", "").await;
    assert_eq!(answer.status, 400);
    assert_eq!(code(&answer.body), "invalid_key");
    assert!(
        answer.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not valid UTF-8"),
        "{answer:?}"
    );
}

#[tokio::test]
async fn a_key_with_an_unencoded_slash_is_told_to_encode_it() {
    let server = TestServer::start().await;
    for (path, example) in [
        ("/v1/keys/api/host-1:8080", "/v1/keys/api%2Fhost-1:8080"),
        (
            "/v1/keys/api/host-1:8080/ttl",
            "/v1/keys/api%2Fhost-1:8080/ttl",
        ),
    ] {
        let (status, body) = server.get(path).await;
        assert_eq!(status, 404);
        assert_eq!(code(&body), "route_not_found");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("%2F") && message.contains(example),
            "{message}"
        );
    }
    let (_, body) = server.get("/v2/nothing").await;
    assert_eq!(body["error"]["message"], "no such route");
}

#[tokio::test]
async fn query_errors_read_like_every_other_error() {
    let server = TestServer::start().await;
    for path in ["/v1/keys?limit=x", "/v1/keys?nope=1", "/v1/keys?state=dead"] {
        let (status, body) = server.get(path).await;
        assert_eq!(status, 400, "{path}");
        assert_eq!(code(&body), "invalid_query");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(!message.contains("Failed to deserialize"), "{message}");
        assert!(message.starts_with("query: "), "{message}");
    }
}
