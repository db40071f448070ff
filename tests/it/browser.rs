//! The dashboard in a real browser: `tests/browser/dashboard.mjs` drives Debian's headless
//! Chromium (through playwright-core) against a real server. It registers keys, sees them
//! appear, picks a service, watches a countdown, lets a key expire, checks the expired list and
//! the feed, and saves screenshots in light and dark themes.
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
    let chromium = tools::chromium();
    let browser_dir = root.join("tests/browser");
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("browser");
    std::fs::create_dir_all(&out_dir).unwrap();
    let server = TestServer::start().await;
    let script = browser_dir.join("dashboard.mjs");
    let (base, out) = (server.base.clone(), out_dir.clone());
    let output = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(script)
            .arg(base)
            .arg(out)
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
    assert!(stdout.contains("ok: dashboard works"), "{stdout}");
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
