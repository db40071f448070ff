//! Tools outside Rust that a few tests need (the tests that use them are `#[ignore]`d with the
//! reason; `.ci/run` installs the tools and runs them). [`require`] checks them all first and
//! fails with one line naming every missing tool and how to get it, never with a wall of
//! output from a half-run command.

use std::path::Path;
use std::process::{Command, Stdio};

/// A tool a test needs.
pub enum Tool {
    /// Python 3 (see [`python`]).
    Python,
    /// Python can `import` this module; the string says how to install it.
    PythonModule(&'static str, &'static str),
    /// `node` on the PATH.
    Node,
    /// Chromium at `$CHROMIUM`, or `/usr/bin/chromium`.
    Chromium,
    /// The npm packages of `tests/browser` (`npm ci --prefix tests/browser`).
    BrowserPackages,
}

/// The Python interpreter: `$PYTHON`, or `python3` on the PATH (`.ci/run` points `PYTHON` at
/// Debian's `/usr/bin/python3` when another `python3` comes first on the PATH).
pub fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Chromium's path: `$CHROMIUM`, or Debian's.
pub fn chromium() -> String {
    std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into())
}

fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// What is missing of `tool`, with how to get it; `None` when it is there.
fn missing(tool: &Tool) -> Option<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    match tool {
        Tool::Python => (!runs(&python(), &["--version"]))
            .then(|| format!("{} (`apt-get install python3`)", python())),
        Tool::PythonModule(module, install) => {
            let import = format!("import {module}");
            (!runs(&python(), &["-c", &import]))
                .then(|| format!("the Python module {module} (`{install}`)"))
        }
        Tool::Node => (!runs("node", &["--version"]))
            .then(|| "node (`apt-get install nodejs npm`)".to_owned()),
        Tool::Chromium => {
            let path = chromium();
            (!Path::new(&path).exists()).then(|| {
                format!("Chromium at {path} (`apt-get install chromium`, or set CHROMIUM)")
            })
        }
        Tool::BrowserPackages => (!root
            .join("tests/browser/node_modules/playwright-core")
            .exists())
        .then(|| "playwright-core (`npm ci --prefix tests/browser`)".to_owned()),
    }
}

/// Panics with one line naming every tool of `tools` that is missing.
pub fn require(tools: &[Tool]) {
    let missing: Vec<String> = tools.iter().filter_map(missing).collect();
    assert!(
        missing.is_empty(),
        "missing: {} (.ci/run installs them all)",
        missing.join("; ")
    );
}
