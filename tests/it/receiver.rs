//! A real webhook receiver on `127.0.0.1:0` for the webhook suites: it records every request and
//! answers as the test says. It can be stopped (connections closed, port refused) and started
//! again on the same port.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;

/// One request as the receiver got it.
#[derive(Clone, Debug)]
pub struct Received {
    pub headers: HeaderMap,
    pub body: Bytes,
    pub json: Value,
    pub arrived: std::time::Instant,
}

impl Received {
    pub fn id(&self) -> &str {
        self.headers["webhook-id"].to_str().expect("ascii id")
    }

    pub fn key(&self) -> &str {
        self.json["data"]["key"].as_str().expect("data.key")
    }
}

/// How to answer: given the request and how many times this `webhook-id` came before (0 for the
/// first), a status and extra headers.
pub type Answer =
    Arc<dyn Fn(&Received, usize) -> (StatusCode, Vec<(&'static str, String)>) + Send + Sync>;

pub fn always(status: StatusCode) -> Answer {
    Arc::new(move |_, _| (status, Vec::new()))
}

#[derive(Default)]
struct Log {
    requests: Vec<Received>,
    seen: HashMap<String, usize>,
}

#[derive(Clone)]
struct Shared {
    log: Arc<Mutex<Log>>,
    answer: Arc<Mutex<Answer>>,
    arrived: Arc<Notify>,
    /// `(n, hold)`: requests after the first `n` are recorded on arrival but answered only
    /// after `hold` (a receiver that hangs).
    hold_after: Arc<Mutex<Option<(usize, Duration)>>>,
}

pub struct Receiver {
    pub address: SocketAddr,
    shared: Shared,
    running: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl Receiver {
    pub async fn start(answer: Answer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let shared = Shared {
            log: Arc::default(),
            answer: Arc::new(Mutex::new(answer)),
            arrived: Arc::new(Notify::new()),
            hold_after: Arc::default(),
        };
        let mut receiver = Self {
            address: listener.local_addr().expect("bound"),
            shared,
            running: None,
        };
        receiver.serve(listener);
        receiver
    }

    pub fn url(&self) -> reqwest::Url {
        format!("http://{}/hooks/ttl", self.address)
            .parse()
            .expect("url")
    }

    pub fn answer_with(&self, answer: Answer) {
        *self.shared.answer.lock() = answer;
    }

    /// From now on, requests after the first `n` (counted since start) are recorded at once
    /// but answered only after `hold`.
    pub fn hold_after(&self, n: usize, hold: Duration) {
        *self.shared.hold_after.lock() = Some((n, hold));
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Received> {
        self.shared.log.lock().requests.clone()
    }

    /// The first request of each `webhook-id`, by id.
    pub fn unique(&self) -> BTreeMap<String, Received> {
        let mut unique = BTreeMap::new();
        for request in self.requests() {
            unique.entry(request.id().to_owned()).or_insert(request);
        }
        unique
    }

    /// Waits until `done` holds for the requests so far, or panics after `limit`.
    pub async fn wait_until(&self, limit: Duration, done: impl Fn(&[Received]) -> bool) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let arrived = self.shared.arrived.notified();
            if done(&self.shared.log.lock().requests) {
                return;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                let n = self.shared.log.lock().requests.len();
                panic!("receiver: condition not met within {limit:?} ({n} requests)");
            }
        }
    }

    /// Closes every connection and the port: attempts get "connection refused".
    pub async fn stop(&mut self) {
        if let Some((stop, task)) = self.running.take() {
            let _ = stop.send(());
            task.await.expect("receiver task");
        }
    }

    /// Listens again on the same port.
    pub async fn restart(&mut self) {
        let listener = TcpListener::bind(self.address).await.expect("rebind");
        self.serve(listener);
    }

    fn serve(&mut self, listener: TcpListener) {
        let app = Router::new()
            .fallback(record)
            .with_state(self.shared.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .expect("receiver serves");
        });
        self.running = Some((stop, task));
    }
}

async fn record(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let json = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let received = Received {
        headers,
        body,
        json,
        arrived: std::time::Instant::now(),
    };
    let answer = Arc::clone(&*shared.answer.lock());
    let (status, extra, hold) = {
        let mut log = shared.log.lock();
        let hold = shared
            .hold_after
            .lock()
            .filter(|(n, _)| log.requests.len() >= *n)
            .map(|(_, hold)| hold);
        let seen = log.seen.entry(received.id().to_owned()).or_insert(0);
        let before = *seen;
        *seen += 1;
        let reply = answer(&received, before);
        log.requests.push(received);
        (reply.0, reply.1, hold)
    };
    shared.arrived.notify_waiters();
    if let Some(hold) = hold {
        tokio::time::sleep(hold).await;
    }
    let mut response = status.into_response();
    for (name, value) in extra {
        response
            .headers_mut()
            .insert(name, value.parse().expect("header value"));
    }
    response
}
