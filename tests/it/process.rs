//! The real binary as a child process, for fault tests: started on `127.0.0.1:0` with its own
//! data directory, its log collected, signalled by PID (`kill -9`, `-STOP`, `-CONT`, `-TERM`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

const BINARY: &str = env!("CARGO_BIN_EXE_ttlwheel");

/// A ttlwheel process on `127.0.0.1:0` with its own data directory, its log collected.
pub struct Server {
    child: Child,
    pub base: String,
    pub log: Arc<Mutex<Vec<String>>>,
    pub client: reqwest::Client,
}

impl Server {
    /// Starts the binary on `data_dir` with `args`; returns once it listens (not yet ready).
    pub fn start(data_dir: &Path, args: &[&str]) -> Self {
        let mut all: Vec<&std::ffi::OsStr> = ["--listen", "127.0.0.1:0", "--log-format", "text"]
            .iter()
            .map(std::ffi::OsStr::new)
            .collect();
        all.push("--data-dir".as_ref());
        all.push(data_dir.as_os_str());
        all.extend(args.iter().map(std::ffi::OsStr::new));
        Self::spawn(&all, &[])
    }

    /// Starts the binary with exactly `args` (which must listen on a loopback port 0) and
    /// `env`; returns once it listens.
    pub fn spawn(args: &[impl AsRef<std::ffi::OsStr>], env: &[(&str, &std::ffi::OsStr)]) -> Self {
        let mut child = Command::new(BINARY)
            .args(args)
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (address_tx, address_rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().expect("stderr");
        std::thread::spawn({
            let log = Arc::clone(&log);
            move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(rest) = line.split("listening on http://").nth(1) {
                        // Text logs end the address with a space, JSON logs with a quote.
                        let address: String = rest
                            .chars()
                            .take_while(|c| !c.is_whitespace() && *c != '"')
                            .collect();
                        let _ = address_tx.send(address);
                    }
                    log.lock().unwrap().push(line);
                }
            }
        });
        let address = address_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the server says where it listens");
        ttlwheel::notify::install_tls_provider();
        Self {
            child,
            base: format!("http://{address}"),
            log,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        }
    }

    /// Waits until `/healthz` answers 200 (recovery done).
    pub async fn ready(&self) {
        for _ in 0..3000 {
            let answer = self
                .client
                .get(format!("{}/healthz", self.base))
                .send()
                .await;
            if answer.is_ok_and(|answer| answer.status() == StatusCode::OK) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never ready: {:?}", self.log());
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        match request.send().await {
            Ok(response) => crate::server::json_of(response).await,
            // A connection cut by the kill: not acknowledged. The error is kept for the message
            // of a test that did not expect it.
            Err(error) => (StatusCode::BAD_GATEWAY, Value::String(format!("{error:?}"))),
        }
    }

    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// The process's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success());
    }

    /// Waits for the process to exit; returns its exit code.
    pub fn wait(mut self) -> Option<i32> {
        for _ in 0..1000 {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("did not exit: {:?}", self.log());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn temp_data_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("ttlwheel-durability-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}
