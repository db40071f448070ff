//! Keeps `openapi.yaml` honest: the routes it lists are exactly the routes the server serves,
//! and real responses from the running server (every status the tests trigger) are documented
//! and validate against the spec's schemas (JSON Schema 2020-12, formats checked).

use std::collections::BTreeSet;

use reqwest::{Method, StatusCode};
use serde_json::{json, Map, Value};
use yaml_rust2::{Yaml, YamlLoader};

use crate::receiver::{always, Receiver};
use crate::server::TestServer;
use ttlwheel::config::{Config, WebhookEvent};

const METHODS: [&str; 5] = ["GET", "POST", "PUT", "DELETE", "PATCH"];

fn spec() -> Value {
    static SPEC: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    SPEC.get_or_init(read_spec).clone()
}

fn read_spec() -> Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml"))
        .expect("openapi.yaml");
    let documents = YamlLoader::load_from_str(&text).expect("valid YAML");
    to_json(&documents[0])
}

fn to_json(yaml: &Yaml) -> Value {
    match yaml {
        Yaml::Hash(map) => {
            let object: Map<String, Value> = map
                .iter()
                .map(|(key, value)| {
                    let key = match key {
                        Yaml::String(text) => text.clone(),
                        Yaml::Integer(number) => number.to_string(),
                        other => panic!("unsupported key {other:?}"),
                    };
                    (key, to_json(value))
                })
                .collect();
            Value::Object(object)
        }
        Yaml::Array(items) => Value::Array(items.iter().map(to_json).collect()),
        Yaml::String(text) => Value::String(text.clone()),
        Yaml::Integer(number) => json!(number),
        Yaml::Real(text) => json!(text.parse::<f64>().expect("a number")),
        Yaml::Boolean(flag) => json!(flag),
        Yaml::Null => Value::Null,
        other => panic!("unsupported YAML node {other:?}"),
    }
}

/// `(path, METHOD)` pairs the spec documents.
fn spec_routes(spec: &Value) -> BTreeSet<(String, String)> {
    let mut routes = BTreeSet::new();
    for (path, item) in spec["paths"].as_object().expect("paths") {
        for method in METHODS {
            if item.get(method.to_lowercase()).is_some() {
                routes.insert((path.clone(), method.to_string()));
            }
        }
    }
    routes
}

/// Fails unless every `(route, method, status)` that a server answered, as its
/// `ttlwheel_http_requests_total` metric records them, is described by `openapi.yaml`: a
/// route's own status in its operation's responses, a method a route does not serve by the
/// shared `MethodNotAllowed` response, a path no route matches by `RouteNotFound`. Every
/// `TestServer` calls it when it stops, so every status the whole suite observes is checked.
pub fn assert_documented(metrics_text: &str) {
    let spec = spec();
    let undocumented: Vec<String> = crate::exposition::samples(metrics_text)
        .into_iter()
        .filter(|(name, _, value)| name == "ttlwheel_http_requests_total" && *value > 0.0)
        .map(|(_, labels, _)| {
            (
                labels["route"].clone(),
                labels["method"].clone(),
                labels["status"].clone(),
            )
        })
        .filter(|(route, method, status)| !is_documented(&spec, route, method, status))
        .map(|(route, method, status)| format!("{method} {route} -> {status}"))
        .collect();
    assert!(
        undocumented.is_empty(),
        "answers that openapi.yaml does not describe: {undocumented:?}"
    );
}

fn is_documented(spec: &Value, route: &str, method: &str, status: &str) -> bool {
    let shared = |name: &str, code: &str| {
        status == code
            && spec
                .pointer(&format!("/components/responses/{name}"))
                .is_some()
    };
    if route == ttlwheel::metrics::UNMATCHED_ROUTE {
        return shared("RouteNotFound", "404");
    }
    // Any route can time out (a slow body): one shared answer, referenced from the info text.
    if shared("RequestTimeout", "408") {
        return true;
    }
    // HEAD is answered by a route's GET handler, without the body.
    let method = if method == "HEAD" {
        "get".to_owned()
    } else {
        method.to_lowercase()
    };
    let operation = format!("/paths/{}/{method}", pointer_escape(route));
    match spec.pointer(&operation) {
        Some(operation) => operation["responses"].get(status).is_some(),
        None => shared("MethodNotAllowed", "405"),
    }
}

fn served_routes() -> BTreeSet<(String, String)> {
    ttlwheel::routes::ALL
        .iter()
        .flat_map(|route| {
            route
                .methods
                .iter()
                .map(move |method| (route.path.to_string(), method.to_string()))
        })
        .collect()
}

fn pointer_escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// The JSON pointer of the schema the spec gives for a response, or `None` when the response has
/// no JSON body. Panics when the status is not documented for that route.
fn response_schema_pointer(
    spec: &Value,
    path: &str,
    method: &str,
    status: StatusCode,
) -> Option<String> {
    let operation = format!("/paths/{}/{}", pointer_escape(path), method.to_lowercase());
    let responses = &spec
        .pointer(&operation)
        .unwrap_or_else(|| panic!("{method} {path} not in spec"))["responses"];
    let code = status.as_u16().to_string();
    let response = responses
        .get(&code)
        .unwrap_or_else(|| panic!("{method} {path}: status {code} not documented"));
    let base = match response.get("$ref").and_then(Value::as_str) {
        Some(reference) => reference.trim_start_matches('#').to_string(),
        None => format!("{operation}/responses/{code}"),
    };
    let resolved = spec.pointer(&base).expect("response reference resolves");
    resolved.get("content")?.get("application/json")?;
    Some(format!("{base}/content/application~1json/schema"))
}

/// Validates `body` against the schema at `pointer`, resolving references within the spec.
fn validate(spec: &Value, pointer: &str, body: &Value) -> Vec<String> {
    let mut root = spec.clone();
    root["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
    // A fragment is part of a URI: `{` and `}` (from `{key}`) must be percent-encoded.
    root["$ref"] = json!(format!(
        "#{}",
        pointer.replace('{', "%7B").replace('}', "%7D")
    ));
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .should_validate_formats(true)
        .build(&root)
        .expect("the spec's schemas compile");
    validator
        .iter_errors(body)
        .map(|error| format!("{error} at {}", error.instance_path()))
        .collect()
}

struct Checker {
    spec: Value,
    server: TestServer,
    n_checked: usize,
}

impl Checker {
    /// Sends the request; the status must be documented for `template` and the body must match.
    async fn check(
        &mut self,
        method: Method,
        template: &str,
        path: &str,
        body: Option<Value>,
    ) -> Value {
        let (status, answer) = self.server.call(method.clone(), path, body).await;
        match response_schema_pointer(&self.spec, template, method.as_str(), status) {
            Some(pointer) => {
                let errors = validate(&self.spec, &pointer, &answer);
                assert!(
                    errors.is_empty(),
                    "{method} {path} -> {status}: {answer}\n{errors:#?}"
                );
            }
            None => assert_eq!(
                answer,
                Value::Null,
                "{method} {path} -> {status}: undocumented body"
            ),
        }
        self.n_checked += 1;
        answer
    }
}

#[test]
fn the_spec_lists_exactly_the_served_routes() {
    let spec = spec();
    assert_eq!(spec["openapi"], "3.1.0");
    assert_eq!(spec_routes(&spec), served_routes());
}

#[tokio::test]
async fn every_route_answers_as_the_spec_says_for_every_method() {
    let spec = spec();
    let documented = spec_routes(&spec);
    let server = TestServer::start().await;
    for template in ttlwheel::routes::ALL.iter().map(|route| route.path) {
        let path = template.replace("{key}", "probe").replace("{id}", "1");
        for method in METHODS {
            if (template, method) == (ttlwheel::routes::EVENTS.path, "GET") {
                // A stream never ends: check the head only.
                let response = server.client.get(server.url(&path)).send().await.unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                assert_eq!(response.headers()["content-type"], "text/event-stream");
                continue;
            }
            let response = server
                .client
                .request(
                    Method::from_bytes(method.as_bytes()).unwrap(),
                    server.url(&path),
                )
                .json(&json!({}))
                .send()
                .await
                .unwrap();
            let allow = response.headers().get("allow").cloned();
            let (status, body) = crate::server::json_of(response).await;
            let listed = documented.contains(&(template.to_string(), method.to_string()));
            if listed {
                assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
                assert_ne!(body["error"]["code"], "route_not_found", "{method} {path}");
            } else {
                assert_eq!(
                    status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path} is served but not in the spec"
                );
                let pointer =
                    "/components/responses/MethodNotAllowed/content/application~1json/schema";
                assert_eq!(validate(&spec, pointer, &body), Vec::<String>::new());
                let allow = allow.expect("a 405 names the allowed methods");
                let route = ttlwheel::routes::ALL
                    .iter()
                    .find(|route| route.path == template)
                    .unwrap();
                for served in route.methods {
                    assert!(
                        allow.to_str().unwrap().contains(served),
                        "{method} {path}: Allow {allow:?}"
                    );
                }
            }
        }
    }
}

/// One request of the contract walk: method, the route's template in the spec, the concrete
/// path, and the body.
type Step = (Method, &'static str, &'static str, Option<Value>);

#[tokio::test]
async fn real_responses_validate_against_the_spec() {
    let (get, post, put, delete) = (Method::GET, Method::POST, Method::PUT, Method::DELETE);
    let (heartbeats, batch, keys) = ("/v1/heartbeats", "/v1/heartbeats/batch", "/v1/keys");
    let (key, ttl) = ("/v1/keys/{key}", "/v1/keys/{key}/ttl");
    let before_expiry: Vec<Step> = vec![
        (
            post.clone(),
            heartbeats,
            heartbeats,
            Some(json!({"key": "c/1", "service": "svc", "meta": {"a": 1}})),
        ),
        (
            post.clone(),
            heartbeats,
            heartbeats,
            Some(json!({"key": "c/2", "ttl_ms": 150})),
        ),
        (
            post.clone(),
            heartbeats,
            heartbeats,
            Some(json!({"key": ""})),
        ),
        (
            post.clone(),
            heartbeats,
            heartbeats,
            Some(json!({"key": "x", "ttl": 1})),
        ),
        (
            post.clone(),
            batch,
            batch,
            Some(
                json!({"heartbeats": [{"key": "c/3"}, {"key": "bad\u{1}"}, {"key": "c/4", "ttl_s": 5, "service": "svc"}]}),
            ),
        ),
        (
            post.clone(),
            batch,
            "/v1/heartbeats/batch?results=errors",
            Some(json!({"heartbeats": [{"key": "c/5"}, {"key": ""}]})),
        ),
        (
            post.clone(),
            batch,
            "/v1/heartbeats/batch?results=some",
            Some(json!({"heartbeats": []})),
        ),
        (post.clone(), batch, batch, Some(json!({"heartbeats": 5}))),
        (get.clone(), keys, "/v1/keys?limit=2", None),
        (get.clone(), keys, "/v1/keys?service=svc", None),
        (get.clone(), keys, "/v1/keys?limit=0", None),
        (get.clone(), key, "/v1/keys/c%2F1", None),
        (get.clone(), key, "/v1/keys/none", None),
        (get.clone(), ttl, "/v1/keys/c%2F1/ttl", None),
        (get.clone(), ttl, "/v1/keys/none/ttl", None),
        (
            put.clone(),
            ttl,
            "/v1/keys/c%2F3/ttl",
            Some(json!({"ttl_ms": 9000, "condition": "lt"})),
        ),
        (
            put.clone(),
            ttl,
            "/v1/keys/c%2F3/ttl",
            Some(json!({"ttl_ms": 9000, "condition": "nx"})),
        ),
        (put.clone(), ttl, "/v1/keys/c%2F3/ttl", Some(json!({}))),
        (
            put.clone(),
            ttl,
            "/v1/keys/c%2F3/ttl",
            Some(json!({"ttl_ms": -1})),
        ),
        (
            put.clone(),
            ttl,
            "/v1/keys/none/ttl",
            Some(json!({"ttl_ms": 5})),
        ),
        (delete.clone(), ttl, "/v1/keys/c%2F4/ttl", None),
        (get.clone(), key, "/v1/keys/c%2F4", None), // persistent: nulls
        (delete.clone(), ttl, "/v1/keys/none/ttl", None),
    ];
    let after_expiry: Vec<Step> = vec![
        // Reading a due key expires it on the spot, so the expired list below does not depend on
        // how soon the ticker ran on a loaded machine.
        (get.clone(), key, "/v1/keys/c%2F2", None),
        (get.clone(), keys, "/v1/keys?state=expired", None),
        (get.clone(), "/v1/services", "/v1/services", None),
        (delete.clone(), key, "/v1/keys/c%2F1", None),
        (delete.clone(), key, "/v1/keys/c%2F1", None),
        (get.clone(), "/healthz", "/healthz", None),
    ];
    let mut checker = Checker {
        spec: spec(),
        server: TestServer::start().await,
        n_checked: 0,
    };
    for (method, template, path, body) in before_expiry {
        checker.check(method, template, path, body).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await; // c/2 expires
    for (method, template, path, body) in after_expiry {
        checker.check(method, template, path, body).await;
    }
    // A body that is not JSON: 415, documented too.
    let (status, body) = checker.server.post_raw(heartbeats, "text/plain", "x").await;
    let pointer = response_schema_pointer(&checker.spec, heartbeats, "POST", status)
        .expect("a JSON error body");
    assert_eq!(
        validate(&checker.spec, &pointer, &body),
        Vec::<String>::new()
    );
    assert_eq!(checker.n_checked, 29);
}

/// Batched deliveries (`--webhook-batch-max` above 1) match `WebhookBatchPayload`, with
/// expiry and deletion events inside.
#[tokio::test]
async fn batched_webhook_payloads_validate_against_the_spec() {
    let receiver = Receiver::start(always(StatusCode::OK)).await;
    let mut config = Config::ephemeral();
    config.webhook_urls = vec![receiver.url()];
    config.webhook_batch_max = 10;
    config.webhook_events = vec![WebhookEvent::Expired, WebhookEvent::Deleted];
    let server = TestServer::with_config(config).await;
    let items: Vec<Value> = (0..5)
        .map(|i| json!({"key": format!("b{i}"), "service": "s", "meta": {"i": i}, "ttl_ms": 30}))
        .collect();
    server
        .post("/v1/heartbeats/batch", json!({ "heartbeats": items }))
        .await;
    server.post("/v1/heartbeats", json!({"key": "gone"})).await;
    server.call(Method::DELETE, "/v1/keys/gone", None).await;
    let events = |requests: &[crate::receiver::Received]| {
        requests
            .iter()
            .map(|r| r.json["data"]["events"].as_array().map_or(0, Vec::len))
            .sum::<usize>()
    };
    receiver
        .wait_until(std::time::Duration::from_secs(30), |r| events(r) == 6)
        .await;
    let spec = spec();
    for request in receiver.requests() {
        let errors = validate(
            &spec,
            "/components/schemas/WebhookBatchPayload",
            &request.json,
        );
        assert!(errors.is_empty(), "{}\n{errors:#?}", request.json);
    }
    let mut broken = receiver.requests()[0].json.clone();
    broken["data"]["events"][0]
        .as_object_mut()
        .unwrap()
        .remove("id");
    assert!(
        !validate(&spec, "/components/schemas/WebhookBatchPayload", &broken).is_empty(),
        "the schema requires each event's id"
    );
    server.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn webhook_routes_and_payloads_validate_against_the_spec() {
    let receiver = Receiver::start(always(StatusCode::INTERNAL_SERVER_ERROR)).await;
    let mut config = Config::ephemeral();
    config.webhook_urls = vec![receiver.url()];
    config.webhook_max_attempts = 1;
    config.webhook_events = vec![WebhookEvent::Expired, WebhookEvent::Deleted];
    let mut checker = Checker {
        spec: spec(),
        server: TestServer::with_config(config).await,
        n_checked: 0,
    };
    let (get, post) = (Method::GET, Method::POST);
    let (status, letters) = ("/v1/webhooks", "/v1/webhooks/dead-letters");
    let retry = "/v1/webhooks/dead-letters/{id}/retry";
    checker.check(get.clone(), status, status, None).await;
    for key in ["w1", "w2"] {
        checker
            .server
            .post("/v1/heartbeats", json!({"key": key, "ttl_ms": 20}))
            .await;
    }
    checker
        .server
        .post("/v1/heartbeats", json!({"key": "w3", "meta": {"a": 1}}))
        .await;
    checker
        .server
        .call(Method::DELETE, "/v1/keys/w3", None)
        .await;
    receiver
        .wait_until(std::time::Duration::from_secs(30), |r| r.len() >= 3)
        .await;
    for request in receiver.requests() {
        let errors = validate(
            &checker.spec,
            "/components/schemas/WebhookPayload",
            &request.json,
        );
        assert!(errors.is_empty(), "{}\n{errors:#?}", request.json);
    }
    // The last failure is filed just after the receiver answers.
    for _ in 0..100 {
        if checker.server.get(letters).await.1["count"] == 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let listed = checker.check(get.clone(), letters, letters, None).await;
    assert_eq!(listed["count"], 3, "{listed}");
    for query in ["?limit=1", "?limit=0", "?cursor=x"] {
        let path = format!("{letters}{query}");
        checker.check(get.clone(), letters, &path, None).await;
    }
    checker.check(get.clone(), status, status, None).await;
    let first = format!(
        "/v1/webhooks/dead-letters/{}/retry",
        listed["dead_letters"][0]["id"]
    );
    checker.check(post.clone(), retry, &first, None).await;
    checker.check(post.clone(), retry, &first, None).await;
    checker
        .check(
            post.clone(),
            retry,
            "/v1/webhooks/dead-letters/zzz/retry",
            None,
        )
        .await;
    assert_eq!(checker.n_checked, 9);
}
