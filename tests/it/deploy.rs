//! `deploy/`, checked so it cannot rot: the systemd unit's command line run as the unit runs it
//! (with `$NOTIFY_SOCKET`: `READY=1` once recovered, `STOPPING=1` on SIGTERM), the container
//! image's settings and health check run against the binary (no container engine is needed;
//! building the image itself needs one, see the README), and the Grafana dashboard's queries
//! against the metrics a real server exposes.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::process::{temp_data_dir, Server};

const BINARY: &str = env!("CARGO_BIN_EXE_ttlwheel");

fn deploy_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// A token file with one admin token, next to `dir`.
fn tokens_next_to(dir: &Path) -> (PathBuf, String) {
    let file = dir.with_extension("tokens.json");
    let scope = ttlwheel::auth::parse_scope("admin").unwrap();
    let (token, entry) = ttlwheel::auth::new_token("ops", "deploy test", &[scope]).unwrap();
    std::fs::write(&file, serde_json::json!({ "tokens": [entry] }).to_string()).unwrap();
    (file, token)
}

/// The value of `key=` in the unit's `[Service]` section (continuation lines joined).
fn unit_setting(unit: &str, key: &str) -> Option<String> {
    let joined = unit.replace("\\\n", " ");
    joined
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{key}=")))
        .map(str::to_owned)
}

/// Datagrams received on `socket` within `limit`, until one contains `wanted`.
fn receive_until(socket: &UnixDatagram, wanted: &str, limit: Duration) -> Vec<String> {
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let deadline = std::time::Instant::now() + limit;
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    while std::time::Instant::now() < deadline {
        if let Ok(length) = socket.recv(&mut buffer) {
            let text = String::from_utf8_lossy(&buffer[..length]).into_owned();
            let done = text.contains(wanted);
            received.push(text);
            if done {
                return received;
            }
        }
    }
    panic!("no `{wanted}` within {limit:?}; received {received:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_systemd_units_command_line_serves_and_tells_systemd_when_ready_and_stopping() {
    let unit = deploy_file("ttlwheel.service");
    assert_eq!(unit_setting(&unit, "Type").as_deref(), Some("notify"));
    assert!(unit_setting(&unit, "Restart").is_some_and(|policy| policy != "no"));
    assert_eq!(
        unit_setting(&unit, "StateDirectory").as_deref(),
        Some("ttlwheel")
    );
    let exec = unit_setting(&unit, "ExecStart").expect("an ExecStart");
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/ttlwheel"));
    // The unit's own flags, with its paths moved to the test's and the address to loopback.
    let dir = temp_data_dir("systemd");
    let (tokens, token) = tokens_next_to(&dir);
    let args: Vec<&OsStr> = words
        .map(|word| match word {
            "0.0.0.0:7878" => OsStr::new("127.0.0.1:0"),
            "/var/lib/ttlwheel" => dir.as_os_str(),
            "/etc/ttlwheel/tokens.json" => tokens.as_os_str(),
            other => OsStr::new(other),
        })
        .collect();
    assert!(
        args.contains(&tokens.as_os_str()) && args.contains(&dir.as_os_str()),
        "the unit names its token file and data directory: {exec}"
    );
    let socket_path = dir.with_extension("notify.sock");
    let _ = std::fs::remove_file(&socket_path);
    let systemd = UnixDatagram::bind(&socket_path).expect("the notify socket");

    let server = Server::spawn(&args, &[("NOTIFY_SOCKET", socket_path.as_os_str())]);
    let messages = receive_until(&systemd, "READY=1", Duration::from_secs(30));
    // Ready means serving: the key routes answer, with the unit's token.
    let client = ttlwheel_client::Client::builder()
        .endpoint(&server.base)
        .token(&token)
        .build()
        .unwrap();
    client.guard_status().await.expect("served at READY=1");
    client
        .heartbeat(&ttlwheel_client::Heartbeat::new(
            "deploy/1",
            Duration::from_secs(60),
        ))
        .await
        .expect("a heartbeat is taken at READY=1");
    assert!(
        messages.iter().all(|message| !message.contains("STOPPING")),
        "{messages:?}"
    );
    server.signal("-TERM");
    receive_until(&systemd, "STOPPING=1", Duration::from_secs(30));
    assert_eq!(server.wait(), Some(0));
    // The data directory kept the key (the unit's state directory is the data directory).
    assert!(dir.read_dir().unwrap().next().is_some());
    let _ = std::fs::remove_file(socket_path);
    let _ = std::fs::remove_file(tokens);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn ready_reaches_an_abstract_notify_socket_too() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("ttlwheel-test-notify-{}", std::process::id());
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let systemd = UnixDatagram::bind_addr(&address).expect("an abstract socket");
    ttlwheel::systemd::notify_to(OsStr::new(&format!("@{name}")), "READY=1").expect("sent");
    let mut buffer = [0u8; 64];
    systemd
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let length = systemd.recv(&mut buffer).expect("received");
    assert_eq!(&buffer[..length], b"READY=1");
}

/// The lines of the Containerfile with continuations joined.
fn containerfile() -> Vec<String> {
    deploy_file("Containerfile")
        .replace("\\\n", " ")
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_container_images_settings_serve_and_its_health_check_passes() {
    let lines = containerfile();
    let from: Vec<&str> = lines
        .iter()
        .filter_map(|line| line.strip_prefix("FROM "))
        .collect();
    assert_eq!(from.len(), 2, "a build stage and a run stage: {from:?}");
    assert!(
        from[0].contains("bookworm") && from[1].contains("debian:12"),
        "Debian 12: {from:?}"
    );
    let build = lines
        .iter()
        .find(|line| line.starts_with("RUN cargo build"))
        .expect("the build");
    assert!(
        build.contains("--locked") && build.contains("--release"),
        "{build}"
    );
    let ignore = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/.dockerignore"))
        .expect("a .dockerignore: target/ is gigabytes");
    assert!(ignore.lines().any(|line| line.trim() == "target"));

    // The image's environment, run by the binary, with its paths moved to the test's.
    let env_line = lines
        .iter()
        .find_map(|line| line.strip_prefix("ENV "))
        .expect("ENV");
    let dir = temp_data_dir("container");
    let (tokens, _) = tokens_next_to(&dir);
    let mut env: Vec<(String, std::ffi::OsString)> = Vec::new();
    for pair in env_line.split_whitespace() {
        let (name, value) = pair.split_once('=').expect("NAME=value");
        let value: std::ffi::OsString = match name {
            "TTLWHEEL_LISTEN" => {
                assert_eq!(value, "0.0.0.0:7878");
                "127.0.0.1:0".into()
            }
            "TTLWHEEL_DATA_DIR" => dir.clone().into(),
            "TTLWHEEL_AUTH_TOKENS" => tokens.clone().into(),
            _ => value.into(),
        };
        env.push((name.to_owned(), value));
    }
    assert!(
        env.iter().any(|(name, _)| name == "TTLWHEEL_AUTH_TOKENS"),
        "tokens on"
    );
    let env: Vec<(&str, &OsStr)> = env
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_os_str()))
        .collect();
    let no_args: [&str; 0] = [];
    let server = Server::spawn(&no_args, &env);
    server.ready().await;

    // The health check as the image runs it, pointed at the test's port.
    let check: Vec<String> = serde_json::from_str(
        lines
            .iter()
            .find_map(|line| line.split_once(" CMD ").map(|(_, cmd)| cmd))
            .expect("HEALTHCHECK ... CMD [...]"),
    )
    .expect("an exec-form CMD");
    assert_eq!(check[0], "/usr/local/bin/ttlwheel");
    let args: Vec<String> = check[1..]
        .iter()
        .map(|arg| {
            if arg == "http://127.0.0.1:7878" {
                server.base.clone()
            } else {
                arg.clone()
            }
        })
        .collect();
    let healthy = std::process::Command::new(BINARY)
        .args(&args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(healthy.status.success(), "{healthy:?}");
    server.signal("-TERM");
    assert_eq!(server.wait(), Some(0));
    let unhealthy = std::process::Command::new(BINARY)
        .args(&args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert_eq!(unhealthy.status.code(), Some(4), "{unhealthy:?}");
    let _ = std::fs::remove_file(tokens);
    let _ = std::fs::remove_dir_all(dir);
}

/// Every query of the dashboard, wherever it is nested: panels' `expr`s and the variables'
/// `query` / `definition`.
fn expressions(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr" | "query" | "definition", Value::String(expr)) => {
                        found.push(expr.clone())
                    }
                    _ => expressions(value, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| expressions(item, found)),
        _ => {}
    }
}

/// The metric names an OpenMetrics exposition has samples or families for (a counter family
/// `x` stands for `x_total`, a histogram for its `_bucket`, `_sum` and `_count`).
fn exposed_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                continue;
            };
            match kind {
                "counter" => names.insert(format!("{name}_total")),
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{suffix}"));
                    }
                    true
                }
                _ => names.insert(name.to_owned()),
            };
        } else if !line.starts_with('#') {
            let name: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                names.insert(name);
            }
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grafana_dashboard_queries_only_metrics_a_server_exposes() {
    let dashboard: Value =
        serde_json::from_str(&deploy_file("grafana/ttlwheel.json")).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    expressions(&dashboard, &mut exprs);
    assert!(exprs.len() >= 20, "{} queries", exprs.len());
    // Persistence on and a webhook URL, so every family has its series.
    let dir = temp_data_dir("grafana");
    let server = Server::start(&dir, &["--webhook-url", "http://127.0.0.1:9/hook"]);
    server.ready().await;
    let exposition = server
        .client
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let exposed = exposed_names(&exposition);
    assert!(exposed.contains("ttlwheel_heartbeats_total"), "{exposed:?}");
    // PromQL's functions and keywords the dashboard uses, and Prometheus's own `up`: any other
    // word followed by `(` or `{`, or starting with `ttlwheel_`, must be an exposed metric.
    let promql: BTreeSet<&str> = [
        "sum",
        "max",
        "min",
        "avg",
        "rate",
        "increase",
        "histogram_quantile",
        "by",
        "up",
        "label_values",
    ]
    .into();
    let mut queried = BTreeSet::new();
    for expr in &exprs {
        assert_eq!(
            expr.matches('(').count(),
            expr.matches(')').count(),
            "unbalanced: {expr}"
        );
        let mut rest = expr.as_str();
        while let Some(start) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
            rest = &rest[start..];
            let word: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[word.len()..];
            let next = rest.trim_start().chars().next();
            if word.starts_with("ttlwheel_") {
                queried.insert(word);
            } else if matches!(next, Some('(')) {
                assert!(
                    promql.contains(word.as_str()),
                    "unknown function `{word}` in {expr}"
                );
            }
            // Skip label values and matchers' strings.
            if let Some(quoted) = rest
                .strip_prefix("=~\"")
                .or_else(|| rest.strip_prefix("=\""))
            {
                rest = &quoted[quoted.find('"').map_or(quoted.len(), |end| end + 1)..];
            }
        }
    }
    let missing: Vec<&String> = queried
        .iter()
        .filter(|name| !exposed.contains(*name))
        .collect();
    assert!(missing.is_empty(), "queried but not exposed: {missing:?}");
    // The topics the issue names each have a row.
    let rows: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|panel| panel["type"] == "row")
        .map(|panel| panel["title"].as_str().unwrap())
        .collect();
    for topic in [
        "Traffic",
        "Expiry",
        "Mass-expiry guard",
        "Webhooks",
        "Cluster",
    ] {
        assert!(rows.contains(&topic), "no {topic} row: {rows:?}");
    }
    assert!(queried.contains("ttlwheel_expiry_lateness_seconds_bucket"));
    let _ = std::fs::remove_dir_all(dir);
}
