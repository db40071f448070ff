//! Only whom you let in: every route's access for each kind of token (a matrix: route x token
//! kind -> status), per-item checks in a batch, sessions for the dashboard, SIGHUP reloads, and
//! the secure-by-default start rule.

use std::collections::BTreeMap;
use std::path::PathBuf;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use ttlwheel::auth::{new_token, parse_scope};
use ttlwheel::config::Config;

use crate::server::TestServer;

/// The kinds of caller the matrix walks.
const KINDS: [&str; 6] = ["none", "bad", "admin", "read", "read_a", "hb_a"];

/// A token file with one token per kind; returns its path and the bearer strings.
fn token_file(name: &str) -> (PathBuf, BTreeMap<&'static str, String>) {
    let specs: [(&str, &[&str]); 4] = [
        ("admin", &["admin"]),
        ("read", &["read"]),
        ("read_a", &["read:prefix=a/"]),
        ("hb_a", &["heartbeat:prefix=a/"]),
    ];
    let mut entries = Vec::new();
    let mut bearers = BTreeMap::new();
    for (kind, scopes) in specs {
        let scopes: Vec<_> = scopes.iter().map(|s| parse_scope(s).unwrap()).collect();
        let id = kind.replace('_', "-");
        let (token, entry) = new_token(&id, kind, &scopes).unwrap();
        entries.push(entry);
        bearers.insert(kind, token);
    }
    bearers.insert("bad", "ttlw_admin_not-the-secret".to_owned());
    let path = std::env::temp_dir().join(format!(
        "ttlwheel-tokens-{name}-{}.json",
        std::process::id()
    ));
    std::fs::write(&path, json!({ "tokens": entries }).to_string()).unwrap();
    (path, bearers)
}

async fn server_with_tokens(name: &str) -> (TestServer, BTreeMap<&'static str, String>, PathBuf) {
    let (path, bearers) = token_file(name);
    let mut config = Config::ephemeral();
    config.auth_tokens = Some(path.clone());
    (TestServer::with_config(config).await, bearers, path)
}

async fn call_as(
    server: &TestServer,
    bearer: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = server.client.request(method, server.url(path));
    if let Some(bearer) = bearer {
        request = request.bearer_auth(bearer);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("sent");
    let status = response.status();
    // A stream's body never ends: only its status matters here.
    if response.headers().get("content-type").is_some_and(|value| {
        value
            .to_str()
            .unwrap_or("")
            .starts_with("text/event-stream")
    }) {
        return (status, Value::Null);
    }
    crate::server::json_of(response).await
}

#[tokio::test]
async fn every_route_answers_each_kind_of_token_as_its_scope_says() {
    let (server, bearers, path) = server_with_tokens("matrix").await;
    let admin = bearers["admin"].clone();
    for (key, service) in [("a/1", "svc"), ("b/1", "svc")] {
        let body = json!({"key": key, "service": service, "ttl_s": 600});
        let (status, _) = call_as(
            &server,
            Some(&admin),
            Method::POST,
            "/v1/heartbeats",
            Some(body),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    // (method, path, body, [none, bad, admin, read, read_a, hb_a])
    let matrix: Vec<(Method, &str, Option<Value>, [u16; 6])> = vec![
        (
            Method::POST,
            "/v1/heartbeats",
            Some(json!({"key": "a/2"})),
            [401, 401, 200, 403, 403, 200],
        ),
        (
            Method::POST,
            "/v1/heartbeats",
            Some(json!({"key": "b/2"})),
            [401, 401, 200, 403, 403, 403],
        ),
        (
            Method::POST,
            "/v1/heartbeats/batch",
            Some(json!({"heartbeats": [{"key": "a/3"}]})),
            [401, 401, 200, 403, 403, 200],
        ),
        (
            Method::GET,
            "/v1/keys",
            None,
            [401, 401, 200, 200, 403, 403],
        ),
        (
            Method::GET,
            "/v1/keys?prefix=a/",
            None,
            [401, 401, 200, 200, 200, 403],
        ),
        (
            Method::GET,
            "/v1/keys/a%2F1",
            None,
            [401, 401, 200, 200, 200, 403],
        ),
        (
            Method::GET,
            "/v1/keys/b%2F1",
            None,
            [401, 401, 200, 200, 403, 403],
        ),
        (
            Method::GET,
            "/v1/keys/a%2F1/ttl",
            None,
            [401, 401, 200, 200, 200, 403],
        ),
        (
            Method::DELETE,
            "/v1/keys/a%2Fmissing",
            None,
            [401, 401, 404, 403, 403, 404],
        ),
        (
            Method::DELETE,
            "/v1/keys/b%2Fmissing",
            None,
            [401, 401, 404, 403, 403, 403],
        ),
        (
            Method::PUT,
            "/v1/keys/a%2F1/ttl",
            Some(json!({"ttl_ms": 600_000})),
            [401, 401, 200, 403, 403, 403],
        ),
        (
            Method::DELETE,
            "/v1/keys/a%2Fmissing/ttl",
            None,
            [401, 401, 404, 403, 403, 403],
        ),
        (
            Method::GET,
            "/v1/services",
            None,
            [401, 401, 200, 200, 403, 403],
        ),
        (
            Method::GET,
            "/v1/webhooks",
            None,
            [401, 401, 200, 403, 403, 403],
        ),
        (
            Method::GET,
            "/v1/webhooks/dead-letters",
            None,
            [401, 401, 200, 403, 403, 403],
        ),
        (
            Method::POST,
            "/v1/webhooks/dead-letters/1/retry",
            None,
            [401, 401, 404, 403, 403, 403],
        ),
        (
            Method::GET,
            "/v1/guard",
            None,
            [401, 401, 200, 200, 403, 403],
        ),
        (
            Method::POST,
            "/v1/guard/release",
            None,
            [401, 401, 200, 403, 403, 403],
        ),
        (
            Method::POST,
            "/v1/guard/engage",
            None,
            [401, 401, 200, 403, 403, 403],
        ),
        (
            Method::GET,
            "/v1/events?prefix=a/",
            None,
            [401, 401, 200, 200, 200, 403],
        ),
        (
            Method::GET,
            "/v1/events",
            None,
            [401, 401, 200, 200, 403, 403],
        ),
        (
            Method::GET,
            "/metrics",
            None,
            [401, 401, 200, 200, 403, 403],
        ),
        (
            Method::GET,
            "/healthz",
            None,
            [200, 200, 200, 200, 200, 200],
        ),
        (Method::GET, "/readyz", None, [200, 200, 200, 200, 200, 200]),
        // A single node: a caller who may read everything learns it is not a cluster.
        (
            Method::GET,
            "/v1/cluster",
            None,
            [401, 401, 404, 404, 403, 403],
        ),
        // Membership: admin only; a single node then says it is not a cluster.
        (
            Method::POST,
            "/v1/cluster/members",
            Some(
                json!({ "id": 4, "peer_addr": "127.0.0.1:7004", "api_addr": "http://127.0.0.1:7881" }),
            ),
            [401, 401, 404, 403, 403, 403],
        ),
        (
            Method::POST,
            "/v1/cluster/members/4/promote",
            None,
            [401, 401, 404, 403, 403, 403],
        ),
        (
            Method::DELETE,
            "/v1/cluster/members/4",
            None,
            [401, 401, 404, 403, 403, 403],
        ),
        (
            Method::POST,
            "/v1/cluster/snapshot",
            None,
            [401, 401, 404, 403, 403, 403],
        ),
        (
            Method::GET,
            "/openapi.yaml",
            None,
            [200, 200, 200, 200, 200, 200],
        ),
        (Method::GET, "/", None, [200, 200, 200, 200, 200, 200]),
    ];
    let mut wrong = Vec::new();
    for (method, path, body, expected) in &matrix {
        for (kind, &want) in KINDS.iter().zip(expected) {
            let bearer = bearers.get(kind).map(String::as_str);
            let (status, answer) =
                call_as(&server, bearer, method.clone(), path, body.clone()).await;
            if status.as_u16() != want {
                wrong.push(format!(
                    "{method} {path} as {kind}: {status} (wanted {want}) {answer}"
                ));
            }
            if status == StatusCode::UNAUTHORIZED {
                assert_eq!(answer["error"]["code"], "unauthorized");
            }
            if status == StatusCode::FORBIDDEN {
                assert_eq!(answer["error"]["code"], "forbidden");
                assert!(answer["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("scope"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Every route and method the server serves is in the matrix (or is a session route,
    // tested below).
    for route in ttlwheel::routes::ALL {
        for method in route.methods {
            let covered = matrix
                .iter()
                .any(|(m, path, _, _)| m.as_str() == *method && route_of(path) == route.path);
            assert!(
                covered || route.path == "/v1/session",
                "{method} {} is not in the matrix",
                route.path
            );
        }
    }
    let _ = std::fs::remove_file(path);
}

/// The route template a concrete path of the matrix belongs to.
fn route_of(path: &str) -> &'static str {
    let path = path.split('?').next().unwrap();
    ttlwheel::routes::ALL
        .iter()
        .map(|route| route.path)
        .find(|template| {
            let (t, p): (Vec<_>, Vec<_>) =
                (template.split('/').collect(), path.split('/').collect());
            t.len() == p.len() && t.iter().zip(&p).all(|(t, p)| t.starts_with('{') || t == p)
        })
        .unwrap_or("?")
}

#[tokio::test]
async fn a_batch_is_checked_item_by_item() {
    let (server, bearers, path) = server_with_tokens("batch").await;
    let body = json!({"heartbeats": [{"key": "a/ok"}, {"key": "b/not-mine"}, {"key": "a/also"}]});
    let (status, answer) = call_as(
        &server,
        Some(&bearers["hb_a"]),
        Method::POST,
        "/v1/heartbeats/batch",
        Some(body),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["results"][0]["created"], true);
    assert_eq!(answer["results"][1]["error"]["code"], "forbidden");
    assert_eq!(answer["results"][2]["created"], true);
    let (status, _) = call_as(
        &server,
        Some(&bearers["admin"]),
        Method::GET,
        "/v1/keys/b%2Fnot-mine",
        None,
    )
    .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "the refused item changed nothing"
    );
    let _ = std::fs::remove_file(path);
}

#[tokio::test]
async fn a_session_cookie_carries_a_token_for_the_dashboard_and_its_stream() {
    let (server, bearers, path) = server_with_tokens("session").await;
    let client = &server.client;
    // What a browser does: keep the cookie the sign-in sets, and send it back.
    let with_cookie = |request: reqwest::RequestBuilder, cookie: &str| {
        request.header("cookie", cookie.to_owned())
    };
    let services = server.url("/v1/services");
    assert_eq!(
        client.get(&services).send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    let signed_in = client
        .post(server.url("/v1/session"))
        .json(&json!({"token": bearers["read"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), StatusCode::NO_CONTENT);
    let set_cookie = signed_in.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Strict"),
        "{set_cookie}"
    );
    let cookie = set_cookie.split(';').next().unwrap().to_owned();
    let answer = with_cookie(client.get(&services), &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let stream = with_cookie(client.get(server.url("/v1/events")), &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    drop(stream);
    // The session has the token's scopes, no more.
    let engage = with_cookie(client.post(server.url("/v1/guard/engage")), &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(engage.status(), StatusCode::FORBIDDEN);
    // A wrong token gets no session; a made-up cookie is no session.
    let refused = client
        .post(server.url("/v1/session"))
        .json(&json!({"token": bearers["bad"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let forged = with_cookie(client.get(&services), "ttlwheel_session=made-up")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), StatusCode::UNAUTHORIZED);
    // Signing out ends it.
    let out = with_cookie(client.delete(server.url("/v1/session")), &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), StatusCode::NO_CONTENT);
    let after = with_cookie(client.get(&services), &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(after.status(), StatusCode::UNAUTHORIZED);
    let _ = std::fs::remove_file(path);
}

#[test]
fn without_tokens_only_loopback_is_served_unless_insecure_is_asked_for() {
    let mut config = Config::ephemeral();
    assert!(config.check_secure_start().is_ok(), "loopback is fine");
    config.listen = "0.0.0.0:7878".parse().unwrap();
    let refusal = config.check_secure_start().unwrap_err();
    assert!(
        refusal.contains("--auth-tokens") && refusal.contains("token new"),
        "{refusal}"
    );
    config.insecure_no_auth = true;
    assert!(config.check_secure_start().is_ok());
    config.insecure_no_auth = false;
    config.auth_tokens = Some("tokens.json".into());
    assert!(config.check_secure_start().is_ok());
}

/// The binary refuses to start on a non-loopback address without tokens, saying how to add
/// them; `token new` prints a token and its entry; SIGHUP reloads the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_refuses_an_open_start_and_reloads_tokens_on_sighup() {
    const BINARY: &str = env!("CARGO_BIN_EXE_ttlwheel");
    let refused = std::process::Command::new(BINARY)
        .args(["--listen", "0.0.0.0:0", "--ephemeral"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("refusing to listen") && stderr.contains("--auth-tokens"),
        "{stderr}"
    );

    let minted = std::process::Command::new(BINARY)
        .args([
            "token",
            "new",
            "--id",
            "ops",
            "--scope",
            "admin",
            "--description",
            "ops team",
        ])
        .output()
        .unwrap();
    assert!(minted.status.success());
    let stdout = String::from_utf8_lossy(&minted.stdout);
    let token = stdout
        .split_whitespace()
        .find(|word| word.starts_with("ttlw_ops_"))
        .expect("a token")
        .to_owned();
    let entry: Value = stdout
        .lines()
        .find(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).unwrap())
        .expect("an entry");
    assert!(
        !stdout
            .lines()
            .any(|line| line.starts_with('{') && line.contains(&token[9..])),
        "the file entry holds no secret"
    );

    // Start with an empty token list; the minted token is refused, then accepted after SIGHUP.
    let dir = crate::process::temp_data_dir("sighup");
    let file = dir.with_extension("tokens.json");
    std::fs::write(&file, json!({"tokens": []}).to_string()).unwrap();
    let server = crate::process::Server::start(&dir, &["--auth-tokens", file.to_str().unwrap()]);
    server.ready().await;
    let client = &server.client;
    let guard = format!("{}/v1/guard", server.base);
    let before = client.get(&guard).bearer_auth(&token).send().await.unwrap();
    assert_eq!(before.status(), StatusCode::UNAUTHORIZED);
    assert!(before.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .starts_with("Bearer"));
    std::fs::write(&file, json!({"tokens": [entry]}).to_string()).unwrap();
    server.signal("-HUP");
    let mut accepted = false;
    for _ in 0..300 {
        let answer = client.get(&guard).bearer_auth(&token).send().await.unwrap();
        if answer.status() == StatusCode::OK {
            accepted = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(
        accepted,
        "the reloaded token was never accepted: {:?}",
        server.log()
    );
    // A broken file on reload keeps the tokens in force.
    std::fs::write(&file, "not json").unwrap();
    server.signal("-HUP");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let still = client.get(&guard).bearer_auth(&token).send().await.unwrap();
    assert_eq!(still.status(), StatusCode::OK);
    assert!(
        server.log().iter().all(|line| !line.contains(&token[9..])),
        "a secret was logged"
    );
    drop(server);
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_dir_all(&dir);
}
