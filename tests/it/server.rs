//! A real ttlwheel server on `127.0.0.1:0` and a real HTTP client, for the API suites.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, Response, StatusCode};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use ttlwheel::config::Config;
use ttlwheel::metrics::Metrics;
use ttlwheel::placement::Placement;
use ttlwheel::Service;

pub struct TestServer {
    pub base: String,
    pub client: reqwest::Client,
    /// The server's metrics: when the server stops, every (route, method, status) it answered
    /// must be documented in `openapi.yaml` (see `contract::assert_documented`).
    metrics: Arc<Metrics>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::with_config(Config::ephemeral()).await
    }

    pub async fn with_config(config: Config) -> Self {
        Self::with_placement(config, Placement::shared()).await
    }

    /// With connections and the ticker on `placement`'s runtimes (see `ttlwheel::placement`).
    pub async fn with_placement(config: Config, placement: Placement) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
        let base = format!("http://{}", listener.local_addr().expect("bound"));
        let (stop, stopped) = oneshot::channel::<()>();
        let service = Service::start_on(&config, placement).expect("the service starts");
        let metrics = Arc::clone(service.metrics());
        let task = tokio::spawn(service.serve(listener, async {
            let _ = stopped.await;
        }));
        ttlwheel::notify::install_tls_provider();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("client");
        Self {
            base,
            client,
            metrics,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends `body` (if any) as JSON; returns the status and the JSON body (`Null` when empty, a
    /// string when the body is not JSON).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self.client.request(method, self.url(path));
        if let Some(body) = body {
            request = request.json(&body);
        }
        json_of(request.send().await.expect("request sent")).await
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(body)).await
    }

    /// Posts raw bytes with a given content type.
    pub async fn post_raw(
        &self,
        path: &str,
        content_type: &str,
        body: impl Into<reqwest::Body>,
    ) -> (StatusCode, Value) {
        let request = self
            .client
            .post(self.url(path))
            .header("content-type", content_type)
            .body(body);
        json_of(request.send().await.expect("request sent")).await
    }

    /// Stops the server the way SIGTERM does, and waits for it to finish.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        let _ = self.stop.take().expect("running").send(());
        self.task
            .take()
            .expect("running")
            .await
            .expect("server task")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // A test that already failed says why; do not bury it under a second panic.
        if !std::thread::panicking() {
            crate::contract::assert_documented(&self.metrics.render());
        }
    }
}

pub async fn json_of(response: Response) -> (StatusCode, Value) {
    let status = response.status();
    let bytes = response.bytes().await.expect("body read");
    let value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    (status, value)
}

/// The error code of an error body.
pub fn code(body: &Value) -> &str {
    body["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("not an error body: {body}"))
}

/// Percent-encodes a key for a path segment.
pub fn encode(key: &str) -> String {
    key.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
