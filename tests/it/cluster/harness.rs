//! N real `ttlwheel` members on loopback, each with its own temp data directory, and a fault
//! proxy ([`ttlwheel_faultproxy::Link`]) on every ordered peer link: member `i` reaches member
//! `j` through `links[(i, j)]` (`--peer-route j=<link>`), so a test can cut, blackhole or slow
//! any one direction between two members without root or network namespaces.
//!
//! Every process is killed by PID when its [`Member`] is dropped (the harness drops them all
//! when a test fails too), and each wait is bounded ([`WAIT`]): a test never hangs.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::Value;
use ttlwheel_faultproxy::{Fault, Link, LinkHandle};

use crate::process::Server;

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

/// A free port on 127.0.0.1 (bound and released: the member binds it right after).
fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address")
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
            let mut args: Vec<String> = [
                "--listen",
                "127.0.0.1:0",
                "--log-format",
                "text",
                "--node-id",
            ]
            .iter()
            .map(|arg| (*arg).to_owned())
            .collect();
            args.push(id.to_string());
            args.extend(["--cluster-listen".into(), addr.to_string()]);
            args.extend(["--initial-cluster".into(), initial.clone()]);
            args.extend(["--data-dir".into(), dir.display().to_string()]);
            for &to in peers.keys().filter(|&&to| to != id) {
                let link = links[&(id, to)].addr();
                args.extend(["--peer-route".into(), format!("{to}={link}")]);
            }
            args.extend(extra.iter().map(|arg| (*arg).to_owned()));
            dirs.push(dir);
            let process = Some(Server::spawn(&args, &[]));
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
        let mut keys = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut url = reqwest::Url::parse(&format!("{}/v1/keys", self.base(id))).ok()?;
            url.query_pairs_mut()
                .append_pair("consistency", "stale")
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
                keys.push(key["key"].as_str()?.to_owned());
            }
            match body["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => break,
            }
        }
        keys.sort();
        Some(keys)
    }

    /// `kill -9` member `id`.
    pub fn kill(&mut self, id: u64) {
        let member = self.members.get_mut(&id).expect("a member");
        let process = member.process.take().expect("running");
        process.signal("-KILL");
        drop(process);
    }

    /// Starts member `id` again with its flags and data directory.
    pub fn restart(&mut self, id: u64) {
        let member = self.members.get_mut(&id).expect("a member");
        assert!(member.process.is_none(), "member {id} is running");
        member.process = Some(Server::spawn(&member.args, &[]));
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
        let process = Some(Server::spawn(&args, &[]));
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
                let tail = &log[log.len().saturating_sub(40)..];
                out.push_str(&format!(
                    "--- member {} ---\n{}\n",
                    member.id,
                    tail.join("\n")
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
