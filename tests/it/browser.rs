//! The dashboard in a real browser: `tests/browser/dashboard.mjs` drives Debian's headless
//! Chromium (through playwright-core) against a real server. It registers keys, sees them
//! appear, picks a service, watches a countdown, lets a key expire, checks the expired list and
//! the feed, and saves screenshots in light and dark themes. A cluster member's page also shows
//! the members and the leader (`cluster.mjs`).
//!
//! It needs `/usr/bin/chromium` (or `$CHROMIUM`), node and `npm ci --prefix tests/browser`, so it
//! is ignored by a plain `cargo test`; `.ci/run` installs them and runs it. Run by hand without
//! them, it fails with one line naming what is missing: it never passes silently. `TTLWHEEL_UPDATE_SCREENSHOT=1` also copies the light screenshot to
//! `docs/dashboard.png` (the README's picture).

use std::path::Path;
use std::process::Command;

use crate::server::TestServer;
use crate::tools::{self, Tool};

#[tokio::test]
#[ignore = "needs chromium, node and playwright-core: .ci/run installs them"]
async fn the_dashboard_shows_keys_appearing_counting_down_and_expiring() {
    tools::require(&[Tool::Chromium, Tool::Node, Tool::BrowserPackages]);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("browser");
    std::fs::create_dir_all(&out_dir).unwrap();
    let server = TestServer::start().await;
    let out = out_dir.to_str().expect("a UTF-8 path").to_owned();
    run_scenario(
        "dashboard.mjs",
        vec![server.base.clone(), out],
        "ok: dashboard works",
    )
    .await;
    for shot in ["dashboard.png", "dashboard-dark.png"] {
        let bytes = std::fs::read(out_dir.join(shot)).expect("screenshot saved");
        assert!(bytes.starts_with(b"\x89PNG"), "{shot} is a PNG");
    }
    if std::env::var_os("TTLWHEEL_UPDATE_SCREENSHOT").is_some() {
        std::fs::create_dir_all(root.join("docs")).unwrap();
        for shot in ["dashboard.png", "dashboard-dark.png"] {
            std::fs::copy(out_dir.join(shot), root.join("docs").join(shot)).unwrap();
        }
    }
    server.shutdown().await.expect("clean shutdown");
}

/// With tokens on: the page asks for a token, and a read token's session carries the lists and
/// the live stream (`tests/browser/dashboard-auth.mjs`).
#[tokio::test]
#[ignore = "needs chromium, node and playwright-core: .ci/run installs them"]
async fn the_dashboard_signs_in_with_a_token_and_streams_through_its_session() {
    tools::require(&[Tool::Chromium, Tool::Node, Tool::BrowserPackages]);
    let mut tokens = Vec::new();
    let mut entries = Vec::new();
    for (id, scope) in [("viewer", "read"), ("writer", "heartbeat")] {
        let scope = ttlwheel::auth::parse_scope(scope).unwrap();
        let (token, entry) = ttlwheel::auth::new_token(id, id, &[scope]).unwrap();
        tokens.push(token);
        entries.push(entry);
    }
    let file = std::env::temp_dir().join(format!(
        "ttlwheel-browser-tokens-{}.json",
        std::process::id()
    ));
    std::fs::write(&file, serde_json::json!({ "tokens": entries }).to_string()).unwrap();
    let mut config = ttlwheel::config::Config::ephemeral();
    config.auth_tokens = Some(file.clone());
    let server = TestServer::with_config(config).await;
    let args = [vec![server.base.clone()], tokens].concat();
    run_scenario("dashboard-auth.mjs", args, "ok: dashboard with auth works").await;
    server.shutdown().await.expect("clean shutdown");
    let _ = std::fs::remove_file(file);
}

/// A cluster member's page names every member and marks the leader
/// (`tests/browser/cluster.mjs`), opened on a follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium, node and playwright-core: .ci/run installs them"]
async fn a_members_dashboard_shows_the_members_and_the_leader() {
    tools::require(&[Tool::Chromium, Tool::Node, Tool::BrowserPackages]);
    let cluster = crate::cluster::harness::Cluster::start("browser", 3, &[]).await;
    let leader = cluster.leader().await;
    let follower = cluster.running_other_than(&[leader]);
    let args = vec![cluster.base(follower), leader.to_string(), "3".to_owned()];
    run_scenario("cluster.mjs", args, "ok: the cluster's dashboard works").await;
}

/// Runs `tests/browser/<script>` with `args` in node, against Chromium; fails with its output
/// unless it succeeds and prints `done`.
async fn run_scenario(script: &str, args: Vec<String>, done: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/browser")
        .join(script);
    let chromium = tools::chromium();
    let output = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(script)
            .args(args)
            .env("CHROMIUM", chromium)
            .output()
            .expect("node runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the browser scenario failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains(done), "{stdout}");
}
