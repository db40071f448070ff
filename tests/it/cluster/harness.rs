//! N real `ttlwheel` members on loopback, each with its own temp data directory, and a fault
//! proxy ([`ttlwheel_faultproxy::Link`]) on every ordered peer link: member `i` reaches member
//! `j` through `links[(i, j)]` (`--peer-route j=<link>`), so a test can cut, blackhole or slow
//! any one direction between two members without root or network namespaces.
//!
//! Every process is killed by PID when its [`Member`] is dropped (the harness drops them all
//! when a test fails too), and each wait is bounded ([`WAIT`]): a test never hangs. A member
//! can be killed (`kill -9`), stopped gracefully (SIGTERM, [`Cluster::terminate`]), restarted
//! on its data directory (at the same API address with [`fixed_api_flags`]), paused and resumed
//! (`kill -STOP`/`-CONT`, by PID) and isolated; an [`EventTap`] follows a member's live stream
//! (`GET /v1/events`) and keeps every frame with the instant it arrived;
//! [`Cluster::settled_listings`] reads what every member lists at one applied index.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use ttlwheel_faultproxy::{Fault, Link, LinkHandle};

use crate::process::Server;

/// Members print a start-up error as one line, not a backtrace that would push it out of
/// the log tail a failing test shows.
fn no_backtrace() -> [(&'static str, &'static std::ffi::OsStr); 1] {
    [("RUST_BACKTRACE", std::ffi::OsStr::new("0"))]
}

/// The longest any wait for the cluster lasts before the test fails.
pub const WAIT: Duration = Duration::from_secs(30);

/// One member: its process (if running) and how to start it again.
pub struct Member {
    pub id: u64,
    pub process: Option<Server>,
    args: Vec<String>,
}

/// A running cluster. See the module documentation.
pub struct Cluster {
    pub members: BTreeMap<u64, Member>,
    /// `(from, to)`: the proxy `from` dials `to` through.
    pub links: BTreeMap<(u64, u64), LinkHandle>,
    dirs: Vec<PathBuf>,
    pub client: reqwest::Client,
}

/// A free port on 127.0.0.1 for a member's peer listener (bound and released: the member
/// binds it right after). Taken below Linux's ephemeral range (32768-60999), where the kernel
/// never hands out ports for `:0` binds and outgoing connections: a port from that range,
/// released, was sometimes given to another test's listener or connection before the member
/// bound it, and the member failed to start. Chosen at random and tried, so parallel tests
/// rarely pick the same one (and a bind check catches most of those). A port is handed out
/// once per test process: two tests of one run never share one (a member restarted keeps its
/// port, and between its stop and its start the bind check sees it free). Before, two tests
/// once did: the second member failed to start, and the first cluster's leader, dialling it,
/// reached the other cluster's member (see `cluster::identity`).
fn free_port() -> SocketAddr {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static HANDED_OUT: std::sync::Mutex<BTreeSet<u16>> = std::sync::Mutex::new(BTreeSet::new());
    let seed = u64::from(std::process::id()) << 20
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |now| u64::from(now.subsec_nanos()));
    for _ in 0..1000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        // A cheap mix of the seed and a counter (splitmix64's finalizer).
        let mut x = seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
        let port = 20_000 + (x % 12_000) as u16;
        let mut handed_out = HANDED_OUT
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if handed_out.contains(&port) {
            continue;
        }
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            handed_out.insert(port);
            return listener.local_addr().expect("its address");
        }
    }
    panic!("no free port below the ephemeral range after 1,000 tries");
}

impl Cluster {
    /// Starts `n` members founding one cluster (ids 1..=n), each with `extra` flags.
    pub async fn start(name: &str, n: u64, extra: &[&str]) -> Self {
        Self::start_seeded(name, n, extra, None).await
    }

    /// [`Cluster::start`], with member `seed.0`'s data directory moved in from `seed.1` (a
    /// single node's, say) instead of empty.
    pub async fn start_seeded(
        name: &str,
        n: u64,
        extra: &[&str],
        seed: Option<(u64, PathBuf)>,
    ) -> Self {
        let extra: Vec<String> = extra.iter().map(|arg| (*arg).to_owned()).collect();
        Self::start_with(name, n, |_| extra.clone(), seed).await
    }

    /// Starts `n` members founding one cluster (ids 1..=n), member `id` with `extra(id)`'s
    /// flags (a webhook receiver of its own, say).
    pub async fn start_each(name: &str, n: u64, extra: impl Fn(u64) -> Vec<String>) -> Self {
        Self::start_with(name, n, extra, None).await
    }

    /// [`Cluster::start_each`], with an optional seed directory as [`Cluster::start_seeded`].
    async fn start_with(
        name: &str,
        n: u64,
        extra: impl Fn(u64) -> Vec<String>,
        seed: Option<(u64, PathBuf)>,
    ) -> Self {
        let peers: BTreeMap<u64, SocketAddr> = (1..=n).map(|id| (id, free_port())).collect();
        let initial = peers
            .iter()
            .map(|(id, addr)| format!("{id}={addr}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut links = BTreeMap::new();
        for &from in peers.keys() {
            for (&to, &addr) in &peers {
                if from != to {
                    let link = Link::start(addr).await.expect("a proxy link");
                    links.insert((from, to), link);
                }
            }
        }
        let mut members = BTreeMap::new();
        let mut dirs = Vec::new();
        for (&id, addr) in &peers {
            let dir = std::env::temp_dir().join(format!(
                "ttlwheel-cluster-{name}-{id}-{}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            if let Some((_, from)) = seed.as_ref().filter(|(seeded, _)| *seeded == id) {
                std::fs::rename(from, &dir).expect("the seed directory moves in");
            }
            let mut extra = extra(id);
            // clap takes `--listen` once: one among the extra flags replaces port 0.
            let listen = take_flag(&mut extra, "--listen").unwrap_or_else(|| "127.0.0.1:0".into());
            let mut args: Vec<String> = vec!["--listen".into(), listen];
            args.extend(["--log-format", "text", "--node-id"].map(str::to_owned));
            args.push(id.to_string());
            args.extend(["--cluster-listen".into(), addr.to_string()]);
            args.extend(["--initial-cluster".into(), initial.clone()]);
            args.extend(["--data-dir".into(), dir.display().to_string()]);
            for &to in peers.keys().filter(|&&to| to != id) {
                let link = links[&(id, to)].addr();
                args.extend(["--peer-route".into(), format!("{to}={link}")]);
            }
            args.extend(extra);
            dirs.push(dir);
            let process = Some(Server::spawn(&args, &no_backtrace()));
            members.insert(id, Member { id, process, args });
        }
        ttlwheel::notify::install_tls_provider();
        Self {
            members,
            links,
            dirs,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(15))
                .build()
                .expect("a client"),
        }
    }

    /// The address member `id` listens for peers on (`--cluster-listen`).
    pub fn peer_addr(&self, id: u64) -> String {
        let args = &self.members[&id].args;
        let at = args.iter().position(|arg| arg == "--cluster-listen");
        at.and_then(|at| args.get(at + 1))
            .cloned()
            .unwrap_or_else(|| panic!("member {id} has no --cluster-listen"))
    }

    /// The API base URL of running member `id`.
    pub fn base(&self, id: u64) -> String {
        self.process(id).base.clone()
    }

    fn process(&self, id: u64) -> &Server {
        self.members[&id]
            .process
            .as_ref()
            .unwrap_or_else(|| panic!("member {id} is not running"))
    }

    /// The ids of running members.
    pub fn running(&self) -> Vec<u64> {
        self.members
            .values()
            .filter(|member| member.process.is_some())
            .map(|member| member.id)
            .collect()
    }

    /// A running member that is none of `but` (a follower, given the leader).
    pub fn running_other_than(&self, but: &[u64]) -> u64 {
        self.running()
            .into_iter()
            .find(|id| !but.contains(id))
            .unwrap_or_else(|| panic!("no running member but {but:?}"))
    }

    /// `GET /v1/cluster` on member `id`, if it answers.
    pub async fn status(&self, id: u64) -> Option<Value> {
        let answer = self
            .client
            .get(format!("{}/v1/cluster", self.base(id)))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        answer.json().await.ok()
    }

    /// Waits until every member of `among` names the same leader, itself one of `among`, in the
    /// same term, and that leader is ready (`/readyz`: it has taken over and holds its lease,
    /// so it serves rather than answering 503); returns it.
    pub async fn leader_among(&self, among: &[u64]) -> u64 {
        let started = std::time::Instant::now();
        loop {
            let mut seen = Vec::new();
            for &id in among {
                let status = self.status(id).await;
                seen.push(status.and_then(|status| {
                    Some((status["leader_id"].as_u64()?, status["term"].as_u64()?))
                }));
            }
            if let Some(Some((leader, term))) = seen.first().copied() {
                if among.contains(&leader)
                    && seen.iter().all(|s| *s == Some((leader, term)))
                    && self.ready(leader).await
                {
                    return leader;
                }
            }
            assert!(
                started.elapsed() < WAIT,
                "members {among:?} agree on no leader within {WAIT:?}: {seen:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether member `id` answers `/readyz` with 200.
    pub async fn ready(&self, id: u64) -> bool {
        let answer = self
            .client
            .get(format!("{}/readyz", self.base(id)))
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        answer.is_ok_and(|answer| answer.status() == StatusCode::OK)
    }

    /// The leader all running members agree on.
    pub async fn leader(&self) -> u64 {
        self.leader_among(&self.running()).await
    }

    /// Sends a request to member `id`; the status, the body, and the `x-ttlwheel-leader`
    /// header. A request that gets no answer is `None`.
    pub async fn call(
        &self,
        id: u64,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Option<(StatusCode, Value, Option<String>)> {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base(id)));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.ok()?;
        let leader = response
            .headers()
            .get("x-ttlwheel-leader")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let status = response.status();
        let body = response.json().await.unwrap_or(Value::Null);
        Some((status, body, leader))
    }

    /// Waits until member `id`'s stale listing holds exactly `keys`.
    pub async fn wait_for_keys(&self, id: u64, keys: &[String]) {
        let started = std::time::Instant::now();
        let mut want = keys.to_vec();
        want.sort();
        loop {
            let listed = self.stale_keys(id).await;
            if listed.as_deref() == Some(&want[..]) {
                return;
            }
            assert!(
                started.elapsed() < WAIT,
                "member {id} never held {} keys; it lists {:?}\n{}",
                want.len(),
                listed.map(|keys| keys.len()),
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every alive key member `id` has applied, sorted (pages of 1,000).
    pub async fn stale_keys(&self, id: u64) -> Option<Vec<String>> {
        self.stale_keys_in(id, "alive").await
    }

    /// Every key in `state` (`alive`, `expired`) that member `id` has applied, sorted.
    pub async fn stale_keys_in(&self, id: u64, state: &str) -> Option<Vec<String>> {
        let keys = self.stale_services_in(id, state).await?;
        Some(keys.into_keys().collect())
    }

    /// `kill -9` member `id`.
    pub fn kill(&mut self, id: u64) {
        let member = self.members.get_mut(&id).expect("a member");
        let process = member.process.take().expect("running");
        process.signal("-KILL");
        drop(process);
    }

    /// `kill -STOP` member `id`, and waits until every thread of it is stopped (`kill`
    /// returns before they all are: a thread may still answer a request meanwhile). From then
    /// on it keeps its sockets but runs nothing until resumed.
    pub async fn pause(&self, id: u64) {
        let process = self.process(id);
        process.signal("-STOP");
        let tasks = format!("/proc/{}/task", process.pid());
        let started = std::time::Instant::now();
        while !all_stopped(&tasks) {
            assert!(
                started.elapsed() < WAIT,
                "member {id} is not stopped {WAIT:?} after SIGSTOP"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// `kill -CONT` member `id`.
    pub fn resume(&self, id: u64) {
        self.process(id).signal("-CONT");
    }

    /// Member `id`'s applied log index, per `GET /v1/cluster`.
    pub async fn applied_index(&self, id: u64) -> Option<u64> {
        self.status(id).await?["applied_index"].as_u64()
    }

    /// Starts member `id` again with its flags and data directory.
    pub fn restart(&mut self, id: u64) {
        let member = self.members.get_mut(&id).expect("a member");
        assert!(member.process.is_none(), "member {id} is running");
        member.process = Some(Server::spawn(&member.args, &no_backtrace()));
    }

    /// Starts a new member `id` that joins through member `via` (`--join`), with `extra`
    /// flags; no proxy sits on its links (it is dialled at its own peer address).
    pub fn join(&mut self, name: &str, id: u64, via: u64, extra: &[&str]) {
        assert!(!self.members.contains_key(&id), "member {id} exists");
        let dir = std::env::temp_dir().join(format!(
            "ttlwheel-cluster-{name}-{id}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let mut args: Vec<String> = ["--listen", "127.0.0.1:0", "--log-format", "text"]
            .iter()
            .map(|arg| (*arg).to_owned())
            .collect();
        args.extend(["--node-id".into(), id.to_string()]);
        args.extend(["--cluster-listen".into(), free_port().to_string()]);
        args.extend(["--join".into(), self.base(via)]);
        args.extend(["--data-dir".into(), dir.display().to_string()]);
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        self.dirs.push(dir);
        let process = Some(Server::spawn(&args, &no_backtrace()));
        self.members.insert(id, Member { id, process, args });
    }

    /// Waits until member `id`'s `GET /v1/cluster` satisfies `holds`; returns that status.
    pub async fn wait_for_status(
        &self,
        id: u64,
        what: &str,
        holds: impl Fn(&Value) -> bool,
    ) -> Value {
        let started = std::time::Instant::now();
        loop {
            let status = self.status(id).await;
            if let Some(status) = status.filter(|status| holds(status)) {
                return status;
            }
            assert!(
                started.elapsed() < WAIT,
                "member {id}: never {what} within {WAIT:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops member `id` for good (`kill -9`) and forgets it.
    pub fn forget(&mut self, id: u64) {
        if self.members[&id].process.is_some() {
            self.kill(id);
        }
        self.members.remove(&id);
    }

    /// Blackholes every link between `isolated` and the other members, both ways.
    pub fn isolate(&self, isolated: u64) {
        for (&(from, to), link) in &self.links {
            if from == isolated || to == isolated {
                link.set(Fault::Blackhole);
            }
        }
    }

    /// Passes every link again.
    pub fn heal(&self) {
        for link in self.links.values() {
            link.heal();
        }
    }

    /// Member `id`'s data directory (its `--data-dir`).
    pub fn data_dir(&self, id: u64) -> PathBuf {
        let args = &self.members[&id].args;
        let at = args
            .iter()
            .position(|arg| arg == "--data-dir")
            .expect("every member has a --data-dir");
        PathBuf::from(&args[at + 1])
    }

    /// Running member `id`'s whole log.
    pub fn log_of(&self, id: u64) -> Vec<String> {
        self.process(id).log()
    }

    /// Every running member's log, for a failure's message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for member in self.members.values() {
            if let Some(process) = &member.process {
                let log = process.log();
                let start = log.len().saturating_sub(40);
                // A panic (a Raft core's, say) is often long before the tail: show it too.
                let panics = log[..start].iter().filter(|line| line.contains("panicked"));
                let panics: Vec<&String> = panics.take(5).collect();
                for line in panics {
                    out.push_str(&format!(
                        "--- member {} panicked earlier ---\n{line}\n",
                        member.id
                    ));
                }
                out.push_str(&format!(
                    "--- member {} ---\n{}\n",
                    member.id,
                    log[start..].join("\n")
                ));
            }
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Each member's process is killed by its own drop; then the directories go.
        self.members.clear();
        for dir in &self.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Whether every thread under `tasks` (`/proc/<pid>/task`) is stopped (state `T`).
fn all_stopped(tasks: &str) -> bool {
    let Ok(threads) = std::fs::read_dir(tasks) else {
        return false;
    };
    threads.flatten().all(|thread| {
        let stat = std::fs::read_to_string(thread.path().join("stat")).unwrap_or_default();
        // `pid (comm) state ...`: the state follows the last parenthesis.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        state == Some('T')
    })
}

/// One frame of a member's live stream (`GET /v1/events`) as the test received it.
#[derive(Clone, Debug)]
pub struct StreamFrame {
    /// The event's place in the log, `log-<16 hex digits>` (the same on every member; a
    /// member's own events, the guard's, add `.<n>`).
    pub id: String,
    /// `registered`, `expired`, `deleted`, `reset`, ...
    pub event: String,
    pub data: Value,
    pub received: std::time::Instant,
}

/// A member's live stream, followed from when [`EventTap::follow`] returns until the tap is
/// dropped (its reading task is aborted then) or the stream ends (recorded, not retried: a
/// stream that ends is incomplete, which the test must know).
pub struct EventTap {
    frames: Arc<Mutex<Vec<StreamFrame>>>,
    ended: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl EventTap {
    /// Connects to `base`'s stream; returns once the member answered 200 (events from then on
    /// are received).
    pub async fn follow(base: &str) -> Self {
        Self::resume(base, None).await
    }

    /// [`EventTap::follow`], resuming after `last_event_id` (`Last-Event-ID`) if given.
    pub async fn resume(base: &str, last_event_id: Option<&str>) -> Self {
        // No overall timeout: the stream lasts the whole test.
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .expect("a client");
        let mut request = client.get(format!("{base}/v1/events"));
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.expect("the stream answers");
        assert_eq!(response.status(), StatusCode::OK, "GET {base}/v1/events");
        let frames = Arc::new(Mutex::new(Vec::new()));
        let ended = Arc::new(Mutex::new(None));
        let task = tokio::spawn(read_frames(
            response,
            Arc::clone(&frames),
            Arc::clone(&ended),
        ));
        Self {
            frames,
            ended,
            task,
        }
    }

    /// Every frame received so far, in order.
    pub fn frames(&self) -> Vec<StreamFrame> {
        self.frames.lock().clone()
    }

    /// Why the stream ended, if it did.
    pub fn ended(&self) -> Option<String> {
        self.ended.lock().clone()
    }
}

impl Drop for EventTap {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads SSE frames (`id:`, `event:`, `data:` lines, a blank line after each) until the
/// stream ends; comments (keep-alives) are skipped.
async fn read_frames(
    mut response: reqwest::Response,
    frames: Arc<Mutex<Vec<StreamFrame>>>,
    ended: Arc<Mutex<Option<String>>>,
) {
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let chunk = match response.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => {
                *ended.lock() = Some("the member closed the stream".into());
                return;
            }
            Err(error) => {
                *ended.lock() = Some(format!("the stream failed: {error}"));
                return;
            }
        };
        let received = std::time::Instant::now();
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.windows(2).position(|pair| pair == b"\n\n") {
            let frame: Vec<u8> = pending.drain(..end + 2).collect();
            if let Some(frame) = parse_frame(&String::from_utf8_lossy(&frame), received) {
                frames.lock().push(frame);
            }
        }
    }
}

fn parse_frame(text: &str, received: std::time::Instant) -> Option<StreamFrame> {
    let (mut id, mut event, mut data) = (None, None, None);
    for line in text.lines() {
        if let Some(value) = line.strip_prefix("id: ") {
            id = Some(value.to_owned());
        } else if let Some(value) = line.strip_prefix("event: ") {
            event = Some(value.to_owned());
        } else if let Some(value) = line.strip_prefix("data: ") {
            data = Some(serde_json::from_str(value).unwrap_or(Value::Null));
        }
    }
    Some(StreamFrame {
        id: id.unwrap_or_default(),
        event: event?,
        data: data.unwrap_or(Value::Null),
        received,
    })
}

/// Removes `flag` and the value after it from `args`; returns the value.
fn take_flag(args: &mut Vec<String>, flag: &str) -> Option<String> {
    let at = args.iter().position(|arg| arg == flag)?;
    let value = args.get(at + 1).cloned();
    args.drain(at..(at + 2).min(args.len()));
    value
}

/// `--listen` on a port of the member's own below the ephemeral range ([`free_port`]), for
/// [`Cluster::start_each`]: a member restarted with it comes back where its clients know it,
/// as a real member does. (With the default port 0 a restarted member gets a new address,
/// and a port from the ephemeral range, free between a stop and a start, may be taken by any
/// connection meanwhile.)
pub fn fixed_api_flags() -> Vec<String> {
    vec!["--listen".to_owned(), free_port().to_string()]
}

/// One heavy scenario at a time (the rolling restart, the isolated follower): each runs three
/// debug members and hundreds of clients on a 2-core machine, and a second one beside it would
/// starve both of CPU.
pub static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Cluster {
    /// Stops member `id` with SIGTERM (the graceful stop: the API stops accepting, requests in
    /// flight finish, then Raft stops) and waits for it to exit, at most 10 s (then it is
    /// killed and the test fails); returns its exit code.
    pub async fn terminate(&mut self, id: u64) -> Option<i32> {
        let member = self.members.get_mut(&id).expect("a member");
        let process = member.process.take().expect("running");
        process.signal("-TERM");
        // `wait` polls with a blocking sleep: off the runtime, whose workers run the clients.
        match tokio::task::spawn_blocking(move || process.wait()).await {
            Ok(code) => code,
            Err(failed) => std::panic::resume_unwind(failed.into_panic()),
        }
    }

    /// Every key in `state` (`alive`, `expired`) that member `id` has applied, with its service
    /// (`None`: it has none).
    pub async fn stale_services_in(
        &self,
        id: u64,
        state: &str,
    ) -> Option<BTreeMap<String, Option<String>>> {
        let mut keys = BTreeMap::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut url = reqwest::Url::parse(&format!("{}/v1/keys", self.base(id))).ok()?;
            url.query_pairs_mut()
                .append_pair("consistency", "stale")
                .append_pair("state", state)
                .append_pair("limit", "1000");
            if let Some(cursor) = &cursor {
                url.query_pairs_mut().append_pair("cursor", cursor);
            }
            let response = self.client.get(url).send().await.ok()?;
            if response.status() != StatusCode::OK {
                return None;
            }
            let body: Value = response.json().await.ok()?;
            for key in body["keys"].as_array()? {
                let service = key["service"].as_str().map(str::to_owned);
                keys.insert(key["key"].as_str()?.to_owned(), service);
            }
            match body["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => break,
            }
        }
        Some(keys)
    }
}

impl EventTap {
    /// Every `expired` frame received so far: its key and when it arrived.
    pub fn expiries(&self) -> Vec<(String, std::time::Instant)> {
        (self.frames.lock().iter())
            .filter(|frame| frame.event == "expired")
            .map(|frame| {
                let key = frame.data["key"].as_str().unwrap_or_default().to_owned();
                (key, frame.received)
            })
            .collect()
    }
}

/// What members list at one applied index ([`Cluster::settled_listings`]).
#[derive(Clone, Debug)]
pub struct Listings {
    /// The applied index every member reported before and after listing.
    pub index: u64,
    /// When the first listing was asked for.
    pub started: std::time::Instant,
    /// When the last one was answered.
    pub completed: std::time::Instant,
    /// Each member's alive keys and their services.
    pub alive: BTreeMap<u64, BTreeMap<String, Option<String>>>,
    /// Each member's expired keys (`state=expired`) and their services.
    pub expired: BTreeMap<u64, BTreeMap<String, Option<String>>>,
}

impl Listings {
    /// The members whose alive or expired listing differs from the first member's, described.
    pub fn differences(&self) -> Vec<String> {
        let mut found = Vec::new();
        for (what, listings) in [("alive", &self.alive), ("expired", &self.expired)] {
            let Some((&first, reference)) = listings.iter().next() else {
                continue;
            };
            for (&id, listed) in listings {
                if listed == reference {
                    continue;
                }
                let only_here: Vec<_> = (listed.iter())
                    .filter(|(key, service)| reference.get(*key) != Some(*service))
                    .take(10)
                    .collect();
                let only_there: Vec<_> = (reference.iter())
                    .filter(|(key, service)| listed.get(*key) != Some(*service))
                    .take(10)
                    .collect();
                found.push(format!(
                    "at applied index {}, member {id}'s {what} listing ({} keys) differs from \
                     member {first}'s ({} keys): only member {id} has {only_here:?}; only \
                     member {first} has {only_there:?} (10 at most each)",
                    self.index,
                    listed.len(),
                    reference.len(),
                ));
            }
        }
        found
    }
}

impl Cluster {
    /// Lists the alive and expired keys (with their services) of each of `members` once they
    /// all report one applied index, the same before and after the listings: what they have
    /// applied is then the same log prefix, so a difference between them is a divergence, not
    /// a lag. Retries until then, at most [`WAIT`] (then the test fails, saying why).
    pub async fn settled_listings(&self, members: &[u64]) -> Listings {
        let started_waiting = std::time::Instant::now();
        loop {
            let before = self.applied_indexes(members).await;
            let started = std::time::Instant::now();
            let (mut alive, mut expired) = (BTreeMap::new(), BTreeMap::new());
            for &id in members {
                if let Some(keys) = self.stale_services_in(id, "alive").await {
                    alive.insert(id, keys);
                }
                if let Some(keys) = self.stale_services_in(id, "expired").await {
                    expired.insert(id, keys);
                }
            }
            let completed = std::time::Instant::now();
            let after = self.applied_indexes(members).await;
            let one_index = (before.len() == members.len())
                .then(|| before[0])
                .filter(|index| before.iter().chain(&after).all(|i| i == index));
            let whole = alive.len() == members.len() && expired.len() == members.len();
            if let (Some(index), true) = (one_index, whole && before == after) {
                return Listings {
                    index,
                    started,
                    completed,
                    alive,
                    expired,
                };
            }
            assert!(
                started_waiting.elapsed() < WAIT,
                "members {members:?} never listed at one applied index within {WAIT:?}: \
                 {before:?} then {after:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The applied index of each of `members` that answers.
    async fn applied_indexes(&self, members: &[u64]) -> Vec<u64> {
        let mut indexes = Vec::new();
        for &id in members {
            indexes.extend(self.applied_index(id).await);
        }
        indexes
    }
}
