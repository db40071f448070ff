//! `ttlwheel-client` against the real binary: keep-alive (batched, through a key deleted
//! elsewhere, a paused server and a killed one), failover past a dead endpoint and a 503, the
//! leader hint, typed errors, every API call, paging and the event stream's resumption.
//!
//! The 503 endpoint is a real TCP listener of the test's that answers every request with 503
//! (as a server still `recovering` does); a dead endpoint is a port that was bound and closed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use ttlwheel_client::{
    Client, Code, Error, EventsQuery, ExpireAt, Heartbeat, KeepAlive, KeyTtl, ListQuery, Liveness,
    Loss,
};

use crate::process::{temp_data_dir, Server};

/// A ttlwheel process, memory only, ready.
pub async fn server(name: &str) -> Server {
    let server = Server::start(&temp_data_dir(name), &["--ephemeral"]);
    server.ready().await;
    server
}

/// A client of `endpoints` that retries quickly (tests wait for nothing longer than needed).
fn client_of(endpoints: &[&str]) -> Client {
    Client::builder()
        .endpoints(endpoints.iter().copied())
        .timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_millis(500))
        .retry_delays(Duration::from_millis(10), Duration::from_millis(100))
        .build()
        .expect("a valid client")
}

/// An address nothing listens on, for the rest of the test process: a socket bound to it and
/// never listening (connections are refused), kept open so that no other test's server, which
/// binds port 0, is given the port. A port bound and released was given to another test's
/// server running alongside, and the "dead" endpoint answered (`404 no such key`).
pub fn dead_endpoint() -> String {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a socket");
    let any_port: std::net::SocketAddr = "127.0.0.1:0".parse().expect("an address");
    socket.bind(&any_port.into()).expect("bind");
    let address = socket
        .local_addr()
        .expect("address")
        .as_socket()
        .expect("an IP address");
    // Kept, never listening, until the process ends.
    std::mem::forget(socket);
    format!("http://{address}")
}

/// A real listener that answers every request `503 recovering`, optionally naming a leader in
/// the `x-ttlwheel-leader` header; counts the requests. Stops when dropped.
pub struct Answers503 {
    pub base: String,
    pub hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Answers503 {
    pub async fn start(leader: Option<String>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&hits);
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let counted = Arc::clone(&counted);
                let leader = leader.clone();
                tokio::spawn(async move {
                    // Read the head and its body (Content-Length), then answer and close.
                    let mut request = Vec::new();
                    let mut buffer = [0u8; 4096];
                    loop {
                        let Ok(read) = socket.read(&mut buffer).await else {
                            return;
                        };
                        if read == 0 {
                            return;
                        }
                        request.extend_from_slice(&buffer[..read]);
                        let text = String::from_utf8_lossy(&request);
                        if let Some(end) = text.find("\r\n\r\n") {
                            let length = text[..end]
                                .lines()
                                .find_map(|line| {
                                    let (name, value) = line.split_once(':')?;
                                    name.eq_ignore_ascii_case("content-length")
                                        .then(|| value.trim().parse::<usize>().ok())
                                        .flatten()
                                })
                                .unwrap_or(0);
                            if request.len() >= end + 4 + length {
                                break;
                            }
                        }
                    }
                    counted.fetch_add(1, Ordering::SeqCst);
                    let body = r#"{"error":{"code":"recovering","message":"the service is recovering its state from disk; try again shortly"}}"#;
                    let leader = leader
                        .map(|leader| format!("x-ttlwheel-leader: {leader}\r\n"))
                        .unwrap_or_default();
                    let answer = format!(
                        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n{leader}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(answer.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        Self { base, hits, task }
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Answers503 {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The events of `stream` until `until` holds for one of them (at most `limit`).
async fn events_until(
    stream: &mut (impl futures_util::Stream<Item = Result<ttlwheel_client::Event, Error>> + Unpin),
    limit: Duration,
    until: impl Fn(&ttlwheel_client::Event) -> bool,
) -> Vec<ttlwheel_client::Event> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    while let Ok(Some(event)) = tokio::time::timeout_at(deadline, stream.next()).await {
        let event = event.expect("the stream goes on");
        let done = until(&event);
        seen.push(event);
        if done {
            return seen;
        }
    }
    panic!("the awaited event never came; seen: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_keeps_a_short_ttl_key_alive_and_shutdown_deregisters_it() {
    let server = server("client-keepalive").await;
    let client = client_of(&[&server.base]);
    let mut events = Box::pin(
        client
            .events(EventsQuery {
                prefix: Some("svc/".into()),
                ..EventsQuery::default()
            })
            .await
            .expect("connected"),
    );
    let handle = client
        .keep_alive(
            "svc/host-1:8080",
            KeepAlive::ttl(Duration::from_secs(1))
                .service("svc")
                .meta(serde_json::json!({"zone": "eu-1"})),
        )
        .await
        .expect("registered");
    assert_eq!(handle.key(), "svc/host-1:8080");
    // Three TTLs: without heartbeats it would have expired twice over.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let info = client.get("svc/host-1:8080").await.expect("alive");
    assert_eq!(info.service.as_deref(), Some("svc"));
    assert_eq!(info.meta, Some(serde_json::json!({"zone": "eu-1"})));
    let status = handle.status();
    assert_eq!(status.liveness, Liveness::Alive);
    assert_eq!(status.losses, 0);
    // One heartbeat every 267-333 ms: 11 or more in 3.5 s; 8 leaves room for a loaded machine.
    assert!(status.accepted >= 8, "{status:?}");

    handle.shutdown().await.expect("deregistered");
    let gone = client.get("svc/host-1:8080").await.expect_err("deleted");
    assert!(gone.is_not_found(), "{gone}");
    assert_eq!(gone.code(), Some(&Code::NotFound));
    let seen = events_until(&mut events, Duration::from_secs(5), |event| {
        event.kind == "deleted"
    })
    .await;
    let kinds: Vec<&str> = seen.iter().map(|event| event.kind.as_str()).collect();
    assert_eq!(kinds, ["registered", "deleted"], "never expired: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_keys_of_one_process_heartbeat_in_batches_and_list_in_pages() {
    let server = server("client-batches").await;
    let client = client_of(&[&server.base]);
    let handles = futures_util::future::join_all((0..300).map(|n| {
        let client = client.clone();
        async move {
            client
                .keep_alive(
                    format!("fleet/{n:03}"),
                    KeepAlive::ttl(Duration::from_secs(2)).service("fleet"),
                )
                .await
                .expect("registered")
        }
    }))
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let listed: Vec<String> = client
        .list(ListQuery::all().service("fleet").page_size(100))
        .map(|key| key.expect("a page").key)
        .collect()
        .await;
    let expected: Vec<String> = (0..300).map(|n| format!("fleet/{n:03}")).collect();
    assert_eq!(
        listed, expected,
        "every key alive, in order, over three pages"
    );
    for handle in &handles {
        assert_eq!(handle.status().losses, 0, "{}", handle.key());
        // A registration and a renewal every 533-667 ms: 5 or more in 3 s.
        assert!(handle.status().accepted >= 3, "{:?}", handle.status());
    }
    // 300 keys x (1 registration + at least 3 renewals) went in a few dozen requests.
    let metrics = server
        .client
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let requests = |route: &str| -> u64 {
        metrics
            .lines()
            .filter(|line| {
                line.starts_with("ttlwheel_http_requests_total")
                    && line.contains(&format!("route=\"{route}\""))
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let batches = requests("/v1/heartbeats/batch");
    assert_eq!(requests("/v1/heartbeats"), 0, "no single heartbeats");
    assert!(
        (1..=60).contains(&batches),
        "{batches} batch requests for 300 keys over 3 s"
    );
    for handle in handles {
        handle.shutdown().await.expect("deregistered");
    }
    assert_eq!(client.services().await.unwrap().total.alive, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_fail_over_past_a_dead_endpoint_and_a_503_to_a_live_one() {
    let server = server("client-failover").await;
    let dead = dead_endpoint();
    let recovering = Answers503::start(None).await;
    let client = client_of(&[&dead, &recovering.base, &server.base]);
    let answer = client
        .heartbeat(&Heartbeat::new("failover/1", Duration::from_secs(30)))
        .await
        .expect("the third endpoint answers");
    assert!(answer.created);
    assert_eq!(recovering.hits(), 1, "the 503 endpoint was tried once");
    // The client sticks to the endpoint that answered.
    client.get("failover/1").await.expect("alive");
    assert_eq!(recovering.hits(), 1);
    let handle = client
        .keep_alive("failover/2", KeepAlive::ttl(Duration::from_secs(1)))
        .await
        .expect("kept alive");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(handle.status().losses, 0);

    // No live endpoint: every attempt is listed.
    let nowhere = Client::builder()
        .endpoints([dead.as_str(), recovering.base.as_str()])
        .retry_delays(Duration::from_millis(5), Duration::from_millis(20))
        .build()
        .unwrap();
    match nowhere.get("failover/1").await {
        Err(Error::Unavailable { failures }) => {
            assert_eq!(failures.len(), 6, "three rounds of two: {failures:?}");
            assert!(failures[0].contains("cannot connect"), "{failures:?}");
            assert!(failures[1].contains("recovering"), "{failures:?}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let refused = nowhere
        .keep_alive("failover/3", KeepAlive::ttl(Duration::from_secs(10)))
        .await
        .expect_err("nothing answers");
    assert!(refused.is_unavailable(), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_naming_the_leader_sends_the_next_attempt_to_it() {
    let server = server("client-leader").await;
    let follower = Answers503::start(Some(server.base.clone())).await;
    let bystander = Answers503::start(None).await;
    let client = client_of(&[&follower.base, &bystander.base, &server.base]);
    client
        .heartbeat(&Heartbeat::new("leader/1", Duration::from_secs(30)))
        .await
        .expect("the named leader answers");
    assert_eq!(follower.hits(), 1);
    assert_eq!(
        bystander.hits(),
        0,
        "skipped: the follower named the leader"
    );
    // A leader that is not a configured endpoint is not followed (the token stays home).
    let stranger = Answers503::start(Some("http://192.0.2.1:7878".into())).await;
    let client = client_of(&[&stranger.base, &server.base]);
    client.get("leader/1").await.expect("the next endpoint");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_elsewhere_is_reported_lost_and_registered_again() {
    let server = server("client-deleted").await;
    let client = client_of(&[&server.base]);
    let mut handle = client
        .keep_alive(
            "lost/1",
            KeepAlive::ttl(Duration::from_secs(2)).service("lost"),
        )
        .await
        .expect("registered");
    let operator = client_of(&[&server.base]);
    operator.delete("lost/1").await.expect("deleted");
    let loss = tokio::time::timeout(Duration::from_secs(3), handle.lost())
        .await
        .expect("reported within an interval")
        .expect("the task runs");
    assert_eq!(loss, Loss::Recreated);
    let info = operator.get("lost/1").await.expect("registered again");
    assert_eq!(info.service.as_deref(), Some("lost"));
    assert_eq!(handle.status().liveness, Liveness::Alive);
    assert_eq!(handle.status().losses, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_a_server_is_killed_its_keys_move_to_the_next_endpoint_and_the_loss_is_reported() {
    let first = server("client-killed-a").await;
    let second = server("client-killed-b").await;
    let client = client_of(&[&first.base, &second.base]);
    let mut handles = Vec::new();
    for n in 0..5 {
        handles.push(
            client
                .keep_alive(format!("moved/{n}"), KeepAlive::ttl(Duration::from_secs(2)))
                .await
                .expect("registered"),
        );
    }
    first.signal("-KILL");
    for handle in &mut handles {
        let loss = tokio::time::timeout(Duration::from_secs(3), handle.lost())
            .await
            .expect("reported before the TTL has passed twice")
            .expect("the task runs");
        // The second server never had the key: its first heartbeat there created it.
        assert_eq!(loss, Loss::Recreated, "{}", handle.key());
    }
    let on_second = client_of(&[&second.base]);
    for n in 0..5 {
        on_second
            .get(&format!("moved/{n}"))
            .await
            .expect("alive on the second server");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_deadline_passes_without_an_answer_is_reported_lost_then_alive_again() {
    let server = server("client-stopped").await;
    let client = client_of(&[&server.base]);
    let mut handle = client
        .keep_alive("paused/1", KeepAlive::ttl(Duration::from_secs(1)))
        .await
        .expect("registered");
    // The server stops answering (SIGSTOP): no heartbeat gets through.
    server.signal("-STOP");
    let loss = tokio::time::timeout(Duration::from_secs(3), handle.lost()).await;
    server.signal("-CONT");
    assert_eq!(
        loss.expect("reported").expect("the task runs"),
        Loss::DeadlinePassed
    );
    let mut watch = handle.watch();
    tokio::time::timeout(
        Duration::from_secs(5),
        watch.wait_for(|status| status.liveness == Liveness::Alive),
    )
    .await
    .expect("alive again once the server answers")
    .expect("the task runs");
    assert_eq!(handle.status().losses, 1, "one loss, counted once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_typed_errors_with_the_api_code() {
    let server = server("client-errors").await;
    let client = client_of(&[&server.base]);
    let missing = client.get("no/such/key").await.expect_err("missing");
    assert!(matches!(
        &missing,
        Error::Api {
            status: 404,
            code: Code::NotFound,
            ..
        }
    ));
    let invalid = client
        .heartbeat(&Heartbeat::new("", Duration::from_secs(1)))
        .await
        .expect_err("an empty key");
    assert!(matches!(
        &invalid,
        Error::Api {
            status: 400,
            code: Code::InvalidKey,
            ..
        }
    ));
    let refused = client
        .keep_alive("x", KeepAlive::ttl(Duration::from_secs(400 * 24 * 3600)))
        .await
        .expect_err("a TTL past 365 days");
    assert_eq!(refused.code(), Some(&Code::InvalidTtl), "{refused}");
    assert!(matches!(
        client.cluster_status().await,
        Err(Error::NotClustered)
    ));
    // A batch answers item by item.
    let results = client
        .heartbeat_batch(&[
            Heartbeat::new("batch/ok", Duration::from_secs(5)),
            Heartbeat::new("batch/bad", Duration::from_secs(5)).service("no spaces"),
        ])
        .await
        .expect("answered");
    assert!(results[0].as_ref().is_ok_and(|outcome| outcome.created));
    assert_eq!(
        results[1].as_ref().expect_err("refused").code(),
        Some(&Code::InvalidService)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_sent_and_a_missing_one_is_refused_as_unauthorized() {
    let dir = temp_data_dir("client-tokens");
    let file = dir.with_extension("tokens.json");
    let scope = ttlwheel::auth::parse_scope("admin").unwrap();
    let (token, entry) = ttlwheel::auth::new_token("ops", "test", &[scope]).unwrap();
    std::fs::write(&file, serde_json::json!({ "tokens": [entry] }).to_string()).unwrap();
    let server = Server::start(
        &dir,
        &["--ephemeral", "--auth-tokens", file.to_str().unwrap()],
    );
    server.ready().await;
    let anonymous = client_of(&[&server.base]);
    let refused = anonymous.guard_status().await.expect_err("no token");
    assert_eq!(refused.code(), Some(&Code::Unauthorized));
    let operator = Client::builder()
        .endpoint(&server.base)
        .token(token)
        .build()
        .unwrap();
    assert_eq!(operator.guard_status().await.unwrap().state, "armed");
    let handle = operator
        .keep_alive("tokens/1", KeepAlive::ttl(Duration::from_secs(5)))
        .await
        .expect("registered with the token");
    handle.shutdown().await.expect("deleted with the token");
    let _ = std::fs::remove_file(file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expire_persist_and_delete_behave_as_redis_does() {
    let server = server("client-ttl").await;
    let client = client_of(&[&server.base]);
    client
        .heartbeat(&Heartbeat::new("ttl/1", Duration::from_secs(30)).service("ttl"))
        .await
        .unwrap();
    match client.ttl("ttl/1").await.unwrap() {
        KeyTtl::ExpiresIn(left) => {
            assert!(left <= Duration::from_secs(30) && left > Duration::from_secs(25))
        }
        KeyTtl::Persistent => panic!("has a TTL"),
    }
    let outcome = client
        .expire(
            "ttl/1",
            ExpireAt::In(100_000),
            Some(ttlwheel_client::ExpireCondition::Gt),
        )
        .await
        .unwrap();
    assert!(outcome.applied && !outcome.deleted);
    let outcome = client
        .expire(
            "ttl/1",
            ExpireAt::In(5_000),
            Some(ttlwheel_client::ExpireCondition::Gt),
        )
        .await
        .unwrap();
    assert!(!outcome.applied, "GT refuses an earlier deadline");
    assert!(client.persist("ttl/1").await.unwrap());
    assert_eq!(client.ttl("ttl/1").await.unwrap(), KeyTtl::Persistent);
    assert!(
        !client.persist("ttl/1").await.unwrap(),
        "no TTL left to remove"
    );
    let info = client.get("ttl/1").await.unwrap();
    assert_eq!((info.ttl_ms, info.state.as_str()), (None, "alive"));
    let outcome = client.expire("ttl/1", ExpireAt::In(0), None).await.unwrap();
    assert!(outcome.deleted);
    assert!(client.delete("ttl/1").await.unwrap_err().is_not_found());
    let expired: Vec<_> = client
        .list_expired(ListQuery::all().prefix("ttl/"))
        .collect()
        .await;
    assert!(expired.is_empty(), "deleted, not expired: {expired:?}");
    let guard = client.guard_status().await.unwrap();
    assert!(guard.enabled && guard.held == 0, "{guard:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_resumes_after_the_last_event_id() {
    let server = server("client-events").await;
    let client = client_of(&[&server.base]);
    let mut events = Box::pin(client.events(EventsQuery::default()).await.unwrap());
    client
        .heartbeat(&Heartbeat::new("ev/1", Duration::from_secs(30)))
        .await
        .unwrap();
    let seen = events_until(&mut events, Duration::from_secs(5), |event| {
        event.key() == Some("ev/1")
    })
    .await;
    let last_id = seen.last().unwrap().id.clone();
    drop(events);
    // Missed while away: a registration and a deletion.
    client
        .heartbeat(&Heartbeat::new("ev/2", Duration::from_secs(30)))
        .await
        .unwrap();
    client.delete("ev/1").await.unwrap();
    let mut resumed = Box::pin(
        client
            .events(EventsQuery {
                last_event_id: Some(last_id),
                ..EventsQuery::default()
            })
            .await
            .unwrap(),
    );
    let seen = events_until(&mut resumed, Duration::from_secs(5), |event| {
        event.kind == "deleted"
    })
    .await;
    let got: Vec<(&str, Option<&str>)> = seen
        .iter()
        .map(|event| (event.kind.as_str(), event.key()))
        .collect();
    assert_eq!(
        got,
        [("registered", Some("ev/2")), ("deleted", Some("ev/1"))]
    );
    // An id from another run gets a reset.
    let mut stranger = Box::pin(
        client
            .events(EventsQuery {
                last_event_id: Some("00000000-1".into()),
                ..EventsQuery::default()
            })
            .await
            .unwrap(),
    );
    let seen = events_until(&mut stranger, Duration::from_secs(5), |_| true).await;
    assert_eq!(seen[0].kind, "reset");
}

#[test]
fn the_readme_quickstart_is_the_client_crates_compiled_example() {
    let root = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let crate_readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/client/README.md")).unwrap();
    let rust_block = |text: &str| -> String {
        let start = text.find("```rust,no_run").expect("a rust,no_run block");
        let body = &text[start..];
        let body = &body[body.find('\n').unwrap() + 1..];
        body[..body.find("```").unwrap()].to_owned()
    };
    let example = rust_block(&crate_readme);
    assert_eq!(
        rust_block(&root),
        example,
        "README.md's example must be client/README.md's, which `cargo test --doc -p ttlwheel-client` compiles"
    );
    let lines = example
        .lines()
        .skip_while(|line| !line.contains("async fn main"))
        .skip(1)
        .take_while(|line| *line != "}")
        .filter(|line| !line.trim_start().starts_with("//"))
        .count();
    assert_eq!(lines, 3, "the body of main is the promised few lines");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_moves_to_the_next_endpoint_when_its_server_dies() {
    let first = server("client-events-a").await;
    let second = server("client-events-b").await;
    let client = client_of(&[&first.base, &second.base]);
    let mut events = Box::pin(client.events(EventsQuery::default()).await.unwrap());
    client
        .heartbeat(&Heartbeat::new("before", Duration::from_secs(30)))
        .await
        .unwrap();
    events_until(&mut events, Duration::from_secs(5), |event| {
        event.key() == Some("before")
    })
    .await;
    first.signal("-KILL");
    // The second server has another run's ids: it answers the resumption with a reset, then
    // streams. Heartbeats go to it (the client moved there) until one is seen.
    let on_second = client_of(&[&second.base]);
    let mut seen = Vec::new();
    for n in 0..50 {
        on_second
            .heartbeat(&Heartbeat::new(
                format!("after/{n}"),
                Duration::from_secs(30),
            ))
            .await
            .unwrap();
        if let Ok(Some(event)) =
            tokio::time::timeout(Duration::from_millis(200), events.next()).await
        {
            seen.push(event.expect("the stream goes on"));
            if seen.iter().any(|event| event.kind == "registered") {
                break;
            }
        }
    }
    assert_eq!(
        seen.first().map(|event| event.kind.as_str()),
        Some("reset"),
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|event| event.kind == "registered"
            && event.key().is_some_and(|key| key.starts_with("after/"))),
        "{seen:?}"
    );
}

/// A pool that lets an idle connection go before the server closes it never sends a request
/// on a connection the server is closing. The server closes a kept-alive connection idle for
/// its `--header-read-timeout` (here 100 ms); requests sent after idle gaps swept across that
/// instant all succeed at the first attempt (no retry allowed) when the client keeps idle
/// connections 50 ms. With reqwest's default pool (90 s) the same sweep, measured with a
/// throwaway program against a 200 ms timeout, failed 10 requests of 400 (`IncompleteMessage`
/// or a reset): what `DEFAULT_POOL_IDLE_TIMEOUT` (20 s, under the server's 30 s) prevents.
#[tokio::test]
async fn a_pool_that_lets_idle_connections_go_first_never_sends_on_a_closing_one() {
    let server = Server::start(
        &temp_data_dir("client-pool-idle"),
        &["--ephemeral", "--header-read-timeout", "100ms"],
    );
    server.ready().await;
    let client = Client::builder()
        .endpoint(&server.base)
        .pool_idle_timeout(Duration::from_millis(50))
        .max_attempts(1)
        .build()
        .expect("a valid client");
    let heartbeat = Heartbeat::new("pool/1", Duration::from_secs(30));
    for step in 0..100u64 {
        // Idle gaps from 95 to 104.9 ms, across the server's close at 100 ms.
        tokio::time::sleep(Duration::from_micros(95_000 + step * 100)).await;
        client
            .heartbeat(&heartbeat)
            .await
            .unwrap_or_else(|error| panic!("request {step} failed: {error}"));
    }
}
