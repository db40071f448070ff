//! The operator's CLI (`ttlwheel keys|services|events|guard|cluster|health`), end to end: the
//! binary as a client of the binary, its output (tables and JSON) and its exit codes.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::client::{dead_endpoint, server, Answers503};
use crate::process::{temp_data_dir, Server};

const BINARY: &str = env!("CARGO_BIN_EXE_ttlwheel");

/// What one CLI run left: its exit code, stdout and stderr.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|error| panic!("not JSON ({error}): {self:?}"))
    }
}

/// Runs `ttlwheel <args>` with `env` (and none of the caller's `TTLWHEEL_*` client variables).
fn cli_with_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let output = Command::new(BINARY)
        .args(args)
        .env_remove("TTLWHEEL_ENDPOINT")
        .env_remove("TTLWHEEL_TOKEN")
        .env_remove("TTLWHEEL_TOKEN_FILE")
        .envs(env.iter().copied())
        .output()
        .expect("the binary runs");
    Run {
        code: output.status.code().expect("exited"),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Runs `ttlwheel <args> --endpoint <server>`.
fn cli(server: &Server, args: &[&str]) -> Run {
    let mut all = args.to_vec();
    all.extend(["--endpoint", &server.base]);
    cli_with_env(&all, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_commands_register_show_retime_and_delete_a_key() {
    let server = server("cli-keys").await;
    let run = cli(
        &server,
        &[
            "keys",
            "heartbeat",
            "api/host-1:8080",
            "--ttl",
            "30s",
            "--service",
            "api",
            "--meta",
            r#"{"zone":"eu-1"}"#,
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .starts_with("registered api/host-1:8080 (TTL 30s"),
        "{run:?}"
    );
    let run = cli(
        &server,
        &["keys", "heartbeat", "api/host-1:8080", "--ttl", "30s"],
    );
    assert!(run.stdout.starts_with("renewed api/host-1:8080"), "{run:?}");

    let shown = cli(
        &server,
        &["keys", "get", "api/host-1:8080", "--output", "json"],
    )
    .json();
    assert_eq!(shown["service"], "api");
    assert_eq!(shown["meta"]["zone"], "eu-1");
    assert_eq!(shown["ttl_ms"], 30_000);
    let table = cli(&server, &["keys", "get", "api/host-1:8080"]).stdout;
    assert!(table.contains("service         api\n"), "{table}");

    let listed = cli(&server, &["keys", "ls", "--service", "api"]);
    let lines: Vec<&str> = listed.stdout.lines().collect();
    assert!(
        lines[0].starts_with("KEY ") && lines[0].contains("EXPIRES IN"),
        "{listed:?}"
    );
    assert!(
        lines[1].starts_with("api/host-1:8080  api      alive  30s"),
        "{listed:?}"
    );
    assert_eq!(lines.len(), 2);
    let none = cli(
        &server,
        &["keys", "ls", "--service", "web", "--output", "json"],
    )
    .json();
    assert_eq!(none, serde_json::json!([]));

    let ttl = cli(
        &server,
        &["keys", "ttl", "api/host-1:8080", "--output", "json"],
    )
    .json();
    assert!(ttl["ttl_ms"].as_i64().unwrap() > 25_000, "{ttl}");
    let expired = cli(
        &server,
        &[
            "keys",
            "expire",
            "api/host-1:8080",
            "100s",
            "--condition",
            "gt",
            "--output",
            "json",
        ],
    )
    .json();
    assert_eq!(expired["applied"], true);
    let unchanged = cli(
        &server,
        &[
            "keys",
            "expire",
            "api/host-1:8080",
            "5s",
            "--condition",
            "gt",
        ],
    );
    assert!(unchanged.stdout.contains("unchanged"), "{unchanged:?}");
    let persisted = cli(&server, &["keys", "persist", "api/host-1:8080"]);
    assert_eq!(persisted.stdout, "api/host-1:8080: no longer expires\n");
    let ttl = cli(&server, &["keys", "ttl", "api/host-1:8080"]);
    assert_eq!(ttl.stdout, "no TTL (it never expires)\n");

    let deleted = cli(&server, &["keys", "del", "api/host-1:8080"]);
    assert_eq!(
        (deleted.code, deleted.stdout.as_str()),
        (0, "deleted api/host-1:8080\n")
    );
    let gone = cli(&server, &["keys", "get", "api/host-1:8080"]);
    assert_eq!(gone.code, 3, "not found: {gone:?}");
    assert!(gone.stderr.contains("not_found"), "{gone:?}");
    let gone = cli(&server, &["keys", "del", "api/host-1:8080"]);
    assert_eq!(gone.code, 3, "{gone:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_pages_past_the_servers_page_and_lists_expired_keys() {
    let server = server("cli-ls").await;
    let client = ttlwheel_client::Client::builder()
        .endpoint(&server.base)
        .build()
        .unwrap();
    for chunk in (0..1100).collect::<Vec<u32>>().chunks(1000) {
        let batch: Vec<_> = chunk
            .iter()
            .map(|n| {
                ttlwheel_client::Heartbeat::new(format!("many/{n:04}"), Duration::from_secs(60))
            })
            .collect();
        client.heartbeat_batch(&batch).await.unwrap();
    }
    let all = cli(&server, &["keys", "ls", "--limit", "0", "--output", "json"]).json();
    let keys: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|key| key["key"].as_str().unwrap())
        .collect();
    let expected: Vec<String> = (0..1100).map(|n| format!("many/{n:04}")).collect();
    assert_eq!(keys, expected, "two pages of the server's, in order");
    let capped = cli(&server, &["keys", "ls", "--limit", "5"]);
    assert_eq!(capped.stdout.lines().count(), 6, "a header and five keys");
    assert!(capped.stderr.contains("--limit 0"), "{capped:?}");

    let short = cli(&server, &["keys", "heartbeat", "job-42", "--ttl", "200ms"]);
    assert_eq!(short.code, 0, "{short:?}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let expired = cli(
        &server,
        &["keys", "ls", "--state", "expired", "--output", "json"],
    )
    .json();
    assert_eq!(expired[0]["key"], "job-42", "{expired}");
    assert!(expired[0]["expired_at"].is_string());
    let table = cli(&server, &["keys", "ls", "--state", "expired"]).stdout;
    assert!(table.starts_with("KEY     SERVICE  EXPIRED AT"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_and_the_token_come_from_flags_or_the_environment() {
    let dir = temp_data_dir("cli-tokens");
    let file = dir.with_extension("tokens.json");
    let scope = ttlwheel::auth::parse_scope("admin").unwrap();
    let (token, entry) = ttlwheel::auth::new_token("ops", "cli test", &[scope]).unwrap();
    std::fs::write(&file, serde_json::json!({ "tokens": [entry] }).to_string()).unwrap();
    let server = Server::start(
        &dir,
        &["--ephemeral", "--auth-tokens", file.to_str().unwrap()],
    );
    server.ready().await;
    let dead = dead_endpoint();
    let endpoints = format!("{dead},{}", server.base);

    let anonymous = cli_with_env(&["services"], &[("TTLWHEEL_ENDPOINT", &endpoints)]);
    assert_eq!(anonymous.code, 1, "refused: {anonymous:?}");
    assert!(anonymous.stderr.contains("unauthorized"), "{anonymous:?}");

    let from_env = cli_with_env(
        &["services", "--output", "json"],
        &[
            ("TTLWHEEL_ENDPOINT", &endpoints),
            ("TTLWHEEL_TOKEN", &token),
        ],
    );
    assert_eq!(from_env.code, 0, "past the dead endpoint: {from_env:?}");
    assert_eq!(from_env.json()["total"]["alive"], 0);

    let token_file = dir.with_extension("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let from_flags = cli_with_env(
        &[
            "guard",
            "status",
            "--endpoint",
            &dead,
            "--endpoint",
            &server.base,
            "--token-file",
            token_file.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(from_flags.code, 0, "{from_flags:?}");
    assert!(from_flags.stdout.starts_with("state "), "{from_flags:?}");
    let _ = std::fs::remove_file(file);
    let _ = std::fs::remove_file(token_file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_tell_not_found_unavailable_single_node_and_usage_apart() {
    let server = server("cli-exit").await;
    assert_eq!(cli(&server, &["keys", "get", "missing"]).code, 3);
    let nowhere = cli_with_env(&["keys", "ls", "--endpoint", &dead_endpoint()], &[]);
    assert_eq!(nowhere.code, 4, "{nowhere:?}");
    assert!(
        nowhere.stderr.contains("no endpoint answered"),
        "{nowhere:?}"
    );
    let single = cli(&server, &["cluster", "status"]);
    assert_eq!(single.code, 5, "{single:?}");
    assert!(
        single
            .stderr
            .contains("this server is a single node (no /v1/cluster)"),
        "{single:?}"
    );
    let usage = cli(&server, &["keys", "expire", "k", "soon"]);
    assert_eq!(usage.code, 2, "{usage:?}");
    let usage = cli(&server, &["keys", "heartbeat", "k", "--meta", "[1]"]);
    assert_eq!(usage.code, 2, "{usage:?}");
    let refused = cli(&server, &["keys", "heartbeat", "k", "--ttl", "400days"]);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(refused.stderr.contains("invalid_ttl"), "{refused:?}");

    assert_eq!(cli(&server, &["health"]).stdout, "ok\n");
    let recovering = Answers503::start(None).await;
    let unhealthy = cli_with_env(&["health", "--endpoint", &recovering.base], &[]);
    assert_eq!(unhealthy.code, 4, "{unhealthy:?}");
    assert!(unhealthy.stderr.contains("recovering"), "{unhealthy:?}");

    let released = cli(&server, &["guard", "release", "--output", "json"]).json();
    assert_eq!(released["state"], "armed");
}

/// A CLI process following the event stream, killed by PID when dropped.
struct Following {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Drop for Following {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_follows_the_stream_until_it_is_stopped() {
    let server = server("cli-events").await;
    let mut child = Command::new(BINARY)
        .args([
            "events",
            "--output",
            "json",
            "--prefix",
            "ev/",
            "--endpoint",
            &server.base,
        ])
        .env_remove("TTLWHEEL_ENDPOINT")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    let stdout = child.stdout.take().unwrap();
    let (sender, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    let following = Following { child, lines };
    // Register keys until the follower shows one: then it is connected.
    let mut first = None;
    for n in 0..100 {
        cli(
            &server,
            &["keys", "heartbeat", &format!("ev/{n}"), "--ttl", "60s"],
        );
        if let Ok(line) = following.lines.recv_timeout(Duration::from_millis(100)) {
            first = Some(line);
            break;
        }
    }
    let first: Value =
        serde_json::from_str(&first.expect("the follower saw a registration")).unwrap();
    assert_eq!(first["type"], "registered");
    // Drain what came after, then a deletion, in order.
    while following
        .lines
        .recv_timeout(Duration::from_millis(300))
        .is_ok()
    {}
    cli(&server, &["keys", "heartbeat", "other/1", "--ttl", "60s"]);
    cli(
        &server,
        &["keys", "del", first["data"]["key"].as_str().unwrap()],
    );
    let line = following
        .lines
        .recv_timeout(Duration::from_secs(5))
        .expect("the deletion");
    let deleted: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        deleted["type"], "deleted",
        "other/ is filtered out: {deleted}"
    );
    assert_eq!(deleted["data"]["key"], first["data"]["key"]);
    assert!(deleted["id"].as_str().is_some_and(|id| id.contains('-')));
}

/// `ttlwheel cluster add|promote|remove` against a real cluster, through a follower (which
/// forwards to the leader): a learner is added and shown, its promotion is refused while it
/// has not caught up (it does not exist: it never will), it is removed, and a voter is removed.
/// Each prints the cluster the leader answers with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_commands_add_promote_and_remove_members() {
    let cluster = crate::cluster::harness::Cluster::start("cli-members", 3, &[]).await;
    let leader = cluster.leader().await;
    let follower = cluster.running_other_than(&[leader]);
    let endpoint = cluster.base(follower);
    let run = |args: &[&str]| {
        let mut all = vec!["cluster"];
        all.extend(args);
        all.extend(["--endpoint", &endpoint, "--output", "json"]);
        cli_with_env(&all, &[])
    };
    let ids = |run: &Run| -> Vec<(u64, bool)> {
        let members = run.json()["members"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        (members.iter())
            .map(|m| (m["id"].as_u64().unwrap(), m["voter"].as_bool().unwrap()))
            .collect()
    };

    let nowhere = [
        "--peer-addr",
        "127.0.0.1:1",
        "--api-addr",
        "http://127.0.0.1:1",
    ];
    let added = run(&[&["add", "9"][..], &nowhere[..]].concat());
    assert_eq!(added.code, 0, "{added:?}");
    assert_eq!(
        ids(&added),
        [(1, true), (2, true), (3, true), (9, false)],
        "{added:?}"
    );
    let promoted = run(&["promote", "9"]);
    assert_eq!(promoted.code, 1, "{promoted:?}");
    assert!(promoted.stderr.contains("not_caught_up"), "{promoted:?}");
    let removed = run(&["remove", "9"]);
    assert_eq!(removed.code, 0, "{removed:?}");
    assert_eq!(ids(&removed), [(1, true), (2, true), (3, true)]);

    let voter = cluster.running_other_than(&[leader, follower]);
    let removed = run(&["remove", &voter.to_string()]);
    assert_eq!(removed.code, 0, "{removed:?}");
    let left: Vec<(u64, bool)> = (1..=3)
        .filter(|&id| id != voter)
        .map(|id| (id, true))
        .collect();
    assert_eq!(ids(&removed), left, "{removed:?}");
    let table = cli_with_env(&["cluster", "status", "--endpoint", &endpoint], &[]);
    assert_eq!(table.code, 0, "{table:?}");
    assert!(table.stdout.contains("ROLE"), "{table:?}");
}
