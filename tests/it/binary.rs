//! The `ttlwheel` binary itself: embedded defaults, flags, and SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BINARY: &str = env!("CARGO_BIN_EXE_ttlwheel");

#[test]
fn bad_flag_values_fail_fast_with_a_message() {
    for args in [
        &["--max-ttl", "0"][..],
        &["--default-ttl", "abc"],
        &["--listen", "nowhere"],
        &["--log-format", "xml"],
        &["--webhook-timeout", "0s"],
        &["--webhook-concurrency", "0"],
        &["--webhook-max-attempts", "0"],
        &["--webhook-events", "expired,renewed"],
        &["--threads", "many"],
        &["--fsync", "sometimes"],
        &["--fsync-interval", "0s"],
    ] {
        let output = Command::new(BINARY).args(args).output().expect("runs");
        assert!(!output.status.success(), "{args:?} accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("error: invalid value"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn webhook_urls_and_secrets_are_checked_at_start_up() {
    for (args, says) in [
        (
            &["--webhook-url", "ftp://hooks.example/x"][..],
            "must be http or https",
        ),
        (&["--webhook-url", "hooks.example/x"], "not a URL"),
        (&["--webhook-secret", "s3cret"], "starts with `whsec_`"),
        (
            &["--webhook-secret", "whsec_c2hvcnQ="],
            "24 to 64 random bytes",
        ),
    ] {
        let output = Command::new(BINARY).args(args).output().expect("runs");
        assert!(!output.status.success(), "{args:?} accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("c2hvcnQ"),
            "the secret is echoed: {stderr}"
        );
    }
}

#[test]
fn help_documents_every_flag_and_its_environment_variable() {
    let output = Command::new(BINARY).arg("--help").output().expect("runs");
    let help = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--listen",
        "--threads",
        "--max-ttl",
        "--default-ttl",
        "--expired-retention",
        "--expired-max",
        "--log-format",
        "--webhook-url",
        "--webhook-secret",
        "--webhook-events",
        "--webhook-timeout",
        "--webhook-concurrency",
        "--webhook-max-attempts",
        "--webhook-retry-schedule",
        "--webhook-queue-max",
        "--webhook-dead-letters-max",
        "--webhook-drain-timeout",
        "--data-dir",
        "--ephemeral",
        "--fsync",
        "--fsync-interval",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
    for env in [
        "TTLWHEEL_LISTEN",
        "TTLWHEEL_THREADS",
        "TTLWHEEL_MAX_TTL",
        "TTLWHEEL_DEFAULT_TTL",
        "TTLWHEEL_EXPIRED_RETENTION",
        "TTLWHEEL_LOG_FORMAT",
        "TTLWHEEL_WEBHOOK_URL",
        "TTLWHEEL_WEBHOOK_SECRET",
        "TTLWHEEL_WEBHOOK_EVENTS",
        "TTLWHEEL_WEBHOOK_TIMEOUT",
        "TTLWHEEL_WEBHOOK_CONCURRENCY",
        "TTLWHEEL_WEBHOOK_MAX_ATTEMPTS",
        "TTLWHEEL_DATA_DIR",
        "TTLWHEEL_FSYNC",
        "TTLWHEEL_SERVING",
    ] {
        assert!(help.contains(env), "{env} missing from --help");
    }
}

#[test]
fn the_binary_logs_where_it_listens_serves_and_exits_zero_on_sigterm() {
    // Per-core serving (the default) and one shared runtime, each with one thread per core (the
    // default) and with one thread (`--threads 1`: per-core, a single serving thread; shared,
    // the single event loop).
    for serving in ["per-core", "shared"] {
        for threads in ["0", "1"] {
            serves_and_exits_zero_on_sigterm(serving, threads);
        }
    }
}

fn serves_and_exits_zero_on_sigterm(serving: &str, threads: &str) {
    let data_dir = std::env::temp_dir().join(format!(
        "ttlwheel-binary-{}-{serving}-{threads}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&data_dir);
    let mut child = Command::new(BINARY)
        .env("TTLWHEEL_LISTEN", "127.0.0.1:0")
        .env("TTLWHEEL_DATA_DIR", &data_dir)
        .env("TTLWHEEL_THREADS", threads)
        .env("TTLWHEEL_SERVING", serving)
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut child = KillOnDrop(child);
    let line = lines.next().expect("a log line").expect("utf-8");
    let address = line
        .split("listening on http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (health, metrics) = runtime.block_on(async {
        ttlwheel::notify::install_tls_provider();
        let get = |path: &str| reqwest::get(format!("http://{address}{path}"));
        // 503 `recovering` until the data directory is read back, then 200.
        let mut health = get("/healthz").await.expect("served").status();
        for _ in 0..500 {
            if health != reqwest::StatusCode::SERVICE_UNAVAILABLE {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            health = get("/healthz").await.expect("served").status();
        }
        let metrics = get("/metrics").await.expect("served").text().await;
        (health, metrics.expect("metrics text"))
    });
    assert_eq!(health, reqwest::StatusCode::OK);
    crate::contract::assert_documented(&metrics);

    let killed = Command::new("kill")
        .arg("-TERM")
        .arg(child.0.id().to_string())
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(rest.iter().any(|line| line.contains("SIGTERM")), "{rest:?}");
    // stderr is a pipe here, not a terminal: plain text, no colour codes.
    for line in std::iter::once(&line).chain(&rest) {
        assert!(
            !line.contains('\x1b'),
            "an escape code in a redirected log: {line:?}"
        );
    }
}

/// Kills the server if the test fails before it exits, so no process outlives the test.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
