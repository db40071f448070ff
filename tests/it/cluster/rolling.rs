//! A rolling restart under load (issue 28, section 5; docs/cluster-design.md, section 10).
//! Three members, each with a fixed API address ([`fixed_api_flags`]), as a real member keeps
//! its address across a restart. Keep-alive clients ([`Driver`]) heartbeat 300 keys every TTL/3
//! (TTLs 3-20 s) through any member, moving to the next one on a failure; a [`Writer`] creates
//! keys (10 min TTL, each with a service), deletes every third one and reads each write back
//! through another member, recording every attempt. Each member is then restarted in turn on
//! its own data directory, the next one only once the last is ready (`/readyz`) and has applied
//! what the leader had committed: a follower stopped with SIGTERM, the other follower killed
//! (`kill -9`), then the leader stopped with SIGTERM (no leadership transfer in openraft 0.9:
//! the two others elect a new one).
//!
//! **Why the leader goes last**: by then both members that may succeed it have been restarted,
//! so the member promoted gives every key its failover deadline (`max(checkpointed remaining,
//! min(TTL, grace))`) from a state rebuilt from its data directory (snapshot, log re-applied,
//! checkpoints counted again from the re-apply), not from one kept in memory since the start:
//! the restart's weakest point meets the failover's. Restarted first or in the middle, the
//! leader could be succeeded by a member that ran throughout.
//!
//! **What must not be lost** (each checked; any violation fails the test, with the members'
//! logs and the history written to a file):
//! - *No false expiration*: no `expired` event on any member's stream (each run of each member
//!   followed from its start) for a key within a TTL an acknowledged heartbeat promised, nor
//!   for a live key while its client runs (strict: a client that renews every TTL/3 and retries
//!   another member within 100 ms keeps its key through a restart or a failover, README
//!   "Failover"); no live or written key in any member's `state=expired` listing (read while
//!   the clients still run); no live key answered `created` twice.
//! - *No acknowledged write lost*: at the end, with every member at one applied index, each
//!   lists every key whose creation or move the writer saw acknowledged, with that service,
//!   none whose delete it saw acknowledged, and every live key still within its promise; their
//!   alive and expired listings are equal. No delete finds its key already gone (a 404 to the
//!   first delete that may have landed).
//! - *The history checker passes* ([`history::check_all`]) on every client operation (the
//!   writer's reads included: no stale read) and the final listing. It is given no events: SSE
//!   ids are still each member's own and restart with it, and the webhooks are left out (the
//!   outbox check comes with the events-once change).
//! - *Expiry goes on*: twenty dead keys (their clients stop just before the leader's restart)
//!   are in every member's expired listing by the end, so the checks above do not pass merely
//!   because nothing expires; a graceful stop exits with status 0.
//!
//! **What would make it fail**: a restarted member that recovers deadlines wrongly (counting a
//! checkpoint's remaining time from the old run, say) expires live keys once promoted; a log
//! store that loses its tail on `kill -9` or a shutdown, or an un-persisted commit index, loses
//! acknowledged creations and deletes or diverges (listings differ at one index); re-applying
//! entries out of order brings a deleted key back; a member that cannot take its data
//! directory again after a kill (a stale lock) never becomes ready.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::driver::{
    self, Driver, DriverConfig, Fate, KeySpec, Origin, Writer, WriterConfig, Written,
};
use super::harness::{fixed_api_flags, Cluster, EventTap, Listings, HEAVY, WAIT};
use super::history::{self, FinalState, History, Ms, Op, OpKind, Outcome, Removal, Renewal, Rules};

/// `--failover-grace`'s default (the checker's rules need it; no rule here uses failovers).
const GRACE_MS: Ms = 5_000;
/// The checker's slack on deadlines.
const SLACK_MS: Ms = 1_000;
/// How long the clients renew before the first restart.
const RENEWING: Duration = Duration::from_secs(2);
/// How long a member stays down: its clients find it gone and move on, the two others commit.
const DOWN: Duration = Duration::from_secs(1);
/// How long the load runs after a member caught up, before the next restart.
const DWELL: Duration = Duration::from_secs(2);

/// How a member is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// SIGTERM: the graceful stop a rolling restart uses.
    Term,
    /// `kill -9`: a crash, recovered from the log alone.
    Kill,
}

/// One member's restart, for the summary.
#[derive(Debug)]
struct Restart {
    id: u64,
    how: Stop,
    was_leader: bool,
    /// A graceful stop's exit status.
    exit: Option<i32>,
    /// From the start of the restart to `/readyz` answering 200.
    ready_after: Duration,
    /// From the start of the restart to its applied index reaching the leader's committed one.
    caught_up_after: Duration,
    /// The leader once it caught up.
    leader_after: u64,
}

impl Restart {
    fn describe(&self) -> String {
        let role = match self.was_leader {
            true => "leader",
            false => "follower",
        };
        format!(
            "{role} {} stopped by {:?} (exit {:?}): ready {:?} and caught up {:?} after the stop; \
             leader then {}",
            self.id, self.how, self.exit, self.ready_after, self.caught_up_after, self.leader_after
        )
    }
}

/// Must hold: see the module documentation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_expires_no_live_key_and_loses_no_acknowledged_write() {
    let _one_at_a_time = HEAVY.lock().await;
    let mut cluster = Cluster::start_each("rolling", 3, |_| {
        let mut flags = fixed_api_flags();
        // The mass-expiry guard holds due keys: it would hide a false expiration.
        flags.extend(["--expiry-guard".to_owned(), "off".to_owned()]);
        flags
    })
    .await;
    let leader = cluster.leader().await;
    let origin = Origin::now();
    let all = cluster.running();
    let bases: Vec<String> = all.iter().map(|&id| cluster.base(id)).collect();
    let mut taps = Vec::new();
    for &id in &all {
        taps.push((id, EventTap::follow(&cluster.base(id)).await));
    }
    let live_keys = KeySpec::spread("live", 300, 3..=20);
    let dead_keys = KeySpec::spread("dead", 20, 3..=6);
    let live_config = DriverConfig {
        clients: 6,
        ..DriverConfig::default()
    };
    let live = Driver::start(1, bases.clone(), live_keys.clone(), live_config, origin);
    let dead = Driver::start(
        1_000,
        bases.clone(),
        dead_keys.clone(),
        DriverConfig::default(),
        origin,
    );
    let writer_config = WriterConfig {
        delete_every: 3,
        pace: Duration::from_millis(150),
        ..WriterConfig::new("written")
    };
    let writer = Writer::start(2_000, bases, writer_config, origin, Written::new());
    for driver in [&live, &dead] {
        if let Err(why) = driver.wait_registered(WAIT).await {
            panic!("{why}\n{}", cluster.logs());
        }
    }
    tokio::time::sleep(RENEWING).await;

    let followers: Vec<u64> = all.iter().copied().filter(|&id| id != leader).collect();
    let order = [
        (followers[0], Stop::Term),
        (followers[1], Stop::Kill),
        (leader, Stop::Term),
    ];
    let mut restarts = Vec::new();
    let mut dead = Some(dead);
    let mut dead_ops = Vec::new();
    for (id, how) in order {
        if id == leader {
            let (ops, _) = dead.take().expect("stopped once").stop().await;
            dead_ops = ops;
        }
        restarts.push(restart(&mut cluster, id, how, id == leader, &mut taps).await);
        tokio::time::sleep(DWELL).await;
    }

    let mut found = Vec::new();
    for restart in &restarts {
        if restart.how == Stop::Term && restart.exit != Some(0) {
            found.push(format!(
                "member {} exited {:?} on SIGTERM",
                restart.id, restart.exit
            ));
        }
    }
    let dead_set: BTreeSet<String> = dead_keys.iter().map(|spec| spec.key.clone()).collect();
    found.extend(wait_expired_everywhere(&cluster, &all, &dead_set).await);
    // Read while the live clients run: none of their keys may be listed expired.
    let mut expired_listings = BTreeMap::new();
    for &id in &all {
        let listed = (cluster.stale_keys_in(id, "expired").await)
            .unwrap_or_else(|| panic!("member {id} lists no expired keys"));
        expired_listings.insert(id, listed);
    }
    let (writer_counts, writer_refusals) = (writer.counts(), writer.refusals());
    let (writer_ops, written) = writer.stop().await;
    let live_answers = live.answers();
    let (live_ops, _) = live.stop().await;
    let live_stopped_ms = origin.ceil_now();
    let listings = cluster.settled_listings(&all).await;

    let live_set: BTreeSet<String> = live_keys.iter().map(|spec| spec.key.clone()).collect();
    let ops: Vec<Op> = (live_ops.iter().chain(&dead_ops).chain(&writer_ops))
        .cloned()
        .collect();
    let (violations, history) = judge_ending(Ending {
        taps: &taps,
        live: &live_set,
        dead: &dead_set,
        live_stopped_ms,
        live_ops: &live_ops,
        writer_ops: &writer_ops,
        ops,
        written: &written,
        expired_listings: &expired_listings,
        listings: &listings,
        origin,
    });
    found.extend(violations);

    let restarts: Vec<String> = restarts.iter().map(Restart::describe).collect();
    let summary = format!(
        "rolling: leader {leader} at the start; restarts: {restarts:#?}\nlive clients: {}; dead \
         clients: {}\nwriter: {}; {writer_counts:?}; {}; not acknowledged: \
         {writer_refusals:?}\nlive clients' answers:\n{live_answers:?}",
        driver::tally(&live_ops),
        driver::tally(&dead_ops),
        driver::tally(&writer_ops),
        fates(&written),
    );
    assert_clean(&cluster, &found, &summary, &history);
}

/// Stops member `id` (`how`), starts it again on its data directory after [`DOWN`] (a leader:
/// once the others have a new one), follows its new stream at once (so that this run's events
/// are all seen), and waits until it is ready and has applied what the leader had committed
/// when it became ready.
async fn restart(
    cluster: &mut Cluster,
    id: u64,
    how: Stop,
    was_leader: bool,
    taps: &mut Vec<(u64, EventTap)>,
) -> Restart {
    let started = Instant::now();
    let exit = match how {
        Stop::Term => cluster.terminate(id).await,
        Stop::Kill => {
            cluster.kill(id);
            None
        }
    };
    tokio::time::sleep(DOWN).await;
    if was_leader {
        // Back too soon, it would be elected again (its log is the newest, and the others wait
        // out the leader lease before they vote): it stays down until the others promoted a
        // leader, as a real restart often takes that long.
        cluster.leader_among(&cluster.running()).await;
    }
    cluster.restart(id);
    taps.push((id, EventTap::follow(&cluster.base(id)).await));
    while !cluster.ready(id).await {
        assert!(
            started.elapsed() < DOWN + WAIT,
            "member {id} never ready after its restart\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready_after = started.elapsed();
    let leader_after = cluster.leader().await;
    let committed = (cluster.status(leader_after).await)
        .and_then(|status| status["committed_index"].as_u64())
        .unwrap_or_else(|| panic!("leader {leader_after} shows no committed index"));
    cluster
        .wait_for_status(id, "caught up with the leader", |status| {
            status["applied_index"].as_u64() >= Some(committed)
        })
        .await;
    Restart {
        id,
        how,
        was_leader,
        exit,
        ready_after,
        caught_up_after: started.elapsed(),
        leader_after,
    }
}

/// Waits until every member of `members` lists each of `dead` expired, at most [`WAIT`]; the
/// keys some member still does not list then, as violations.
async fn wait_expired_everywhere(
    cluster: &Cluster,
    members: &[u64],
    dead: &BTreeSet<String>,
) -> Vec<String> {
    let started = Instant::now();
    loop {
        let mut missing = Vec::new();
        for &id in members {
            let listed: BTreeSet<String> = (cluster.stale_keys_in(id, "expired").await)
                .unwrap_or_default()
                .into_iter()
                .collect();
            let absent: Vec<&String> = dead.difference(&listed).collect();
            if !absent.is_empty() {
                missing.push(format!(
                    "member {id} does not list dead keys {absent:?} expired {WAIT:?} after the \
                     restarts"
                ));
            }
        }
        if missing.is_empty() || started.elapsed() >= WAIT {
            return missing;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What a scenario under load saw once its clients stopped and the members settled.
pub(super) struct Ending<'a> {
    pub taps: &'a [(u64, EventTap)],
    pub live: &'a BTreeSet<String>,
    pub dead: &'a BTreeSet<String>,
    /// When the live keys' clients stopped.
    pub live_stopped_ms: Ms,
    pub live_ops: &'a [Op],
    /// The writers' operations (creations, deletes, moves).
    pub writer_ops: &'a [Op],
    /// Every client's operations.
    pub ops: Vec<Op>,
    pub written: &'a Written,
    pub expired_listings: &'a BTreeMap<u64, Vec<String>>,
    pub listings: &'a Listings,
    pub origin: Origin,
}

/// The checks the rolling restart and the partition share at their end: no live or written
/// key expired (streams, listings), none created twice, no acknowledged write lost, listings
/// equal, and the history checker over every operation and the final listing. The dead keys
/// are judged by the listings (each scenario checks their expiry its own way).
pub(super) fn judge_ending(ending: Ending<'_>) -> (Vec<String>, History) {
    let Ending {
        taps,
        live,
        dead,
        live_stopped_ms,
        live_ops,
        writer_ops,
        ops,
        written,
        expired_listings,
        listings,
        origin,
    } = ending;
    let promised = driver::promises(&ops);
    let mut found = stream_expiries(taps, live, live_stopped_ms, &promised, origin);
    found.extend(listed_expired(expired_listings, live, written));
    found.extend(created_twice(live_ops, live));
    found.extend(deletes_of_lost_keys(writer_ops));
    found.extend(listings.differences());
    found.extend(lost_writes(
        listings, written, live, dead, &promised, origin,
    ));
    let history = History {
        ops,
        events: Vec::new(),
        streams: BTreeMap::new(),
        stopped: Vec::new(),
        failovers: Vec::new(),
        final_state: Some(final_state(listings, origin)),
        rules: Rules {
            grace_ms: GRACE_MS,
            slack_ms: SLACK_MS,
        },
        ended_ms: origin.ceil_now(),
    };
    found.extend(history::check_all(&history).iter().map(ToString::to_string));
    (found, history)
}

/// `expired` events, on any run of any member's stream, for a key within a TTL an acknowledged
/// heartbeat promised, or for a live key before its clients stopped.
fn stream_expiries(
    taps: &[(u64, EventTap)],
    live: &BTreeSet<String>,
    live_stopped_ms: Ms,
    promised: &BTreeMap<String, Ms>,
    origin: Origin,
) -> Vec<String> {
    let mut found = Vec::new();
    for (id, tap) in taps {
        for (key, received) in tap.expiries() {
            let received_ms = origin.ceil(received);
            let promise = promised.get(&key).copied().unwrap_or(0);
            let kept_until = match live.contains(&key) {
                true => promise.max(live_stopped_ms),
                false => promise,
            };
            if received_ms < kept_until {
                found.push(format!(
                    "false expiration: member {id}'s stream reported {key} expired at \
                     {received_ms} ms; it was promised until {promise} ms (live clients stopped \
                     at {live_stopped_ms} ms)"
                ));
            }
        }
    }
    found
}

/// Live keys and written keys (none of which may have expired) in a member's `state=expired`
/// listing.
fn listed_expired(
    listings: &BTreeMap<u64, Vec<String>>,
    live: &BTreeSet<String>,
    written: &Written,
) -> Vec<String> {
    let mut found = Vec::new();
    for (id, listed) in listings {
        for key in listed {
            if live.contains(key) {
                found.push(format!(
                    "live key {key} is in member {id}'s expired listing"
                ));
            } else if let Some(fate) = written.get(key) {
                found.push(format!(
                    "written key {key} ({fate:?}) is in member {id}'s expired listing"
                ));
            }
        }
    }
    found
}

/// Deletes answered 404 although no earlier delete of the key may have landed: the writer
/// deletes only keys it saw created (10 min TTL) and never deleted, so the key was lost.
fn deletes_of_lost_keys(ops: &[Op]) -> Vec<String> {
    let mut deletes: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in ops
        .iter()
        .filter(|op| matches!(op.kind, OpKind::Delete { .. }))
    {
        deletes.entry(&op.key).or_default().push(op);
    }
    let mut found = Vec::new();
    for (key, mut attempts) in deletes {
        attempts.sort_by_key(|op| op.invoked_ms);
        let first_effect = attempts.iter().find(|op| {
            !matches!(
                op.kind,
                OpKind::Delete {
                    outcome: Outcome::Failed
                }
            )
        });
        if let Some(op) = first_effect.filter(|op| {
            op.kind
                == OpKind::Delete {
                    outcome: Outcome::Ok(Removal::Missing),
                }
        }) {
            found.push(format!(
                "lost key: written key {key} was already gone when deleted: {op}"
            ));
        }
    }
    found
}

/// Live keys answered `created` more than once: each time after the first, the key was gone.
fn created_twice(ops: &[Op], live: &BTreeSet<String>) -> Vec<String> {
    let mut created: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        if let OpKind::Heartbeat {
            outcome: Outcome::Ok(Renewal::Created),
            ..
        } = op.kind
        {
            created.entry(&op.key).or_default().push(op);
        }
    }
    (created.into_iter())
        .filter(|(key, creations)| live.contains(*key) && creations.len() > 1)
        .map(|(key, creations)| {
            let at: Vec<String> = creations.iter().map(ToString::to_string).collect();
            format!("live key {key} was created {} times: {at:?}", at.len())
        })
        .collect()
}

/// What the final listing must hold on every member: each written key kept with its service,
/// none deleted, each live key still within its promise when the listings ended, no dead key.
fn lost_writes(
    listings: &Listings,
    written: &Written,
    live: &BTreeSet<String>,
    dead: &BTreeSet<String>,
    promised: &BTreeMap<String, Ms>,
    origin: Origin,
) -> Vec<String> {
    let completed_ms = origin.ceil(listings.completed);
    let mut found = Vec::new();
    for (id, alive) in &listings.alive {
        for (key, fate) in written {
            match fate {
                Fate::Kept { service, .. } => {
                    let listed = alive.get(key);
                    if listed != Some(&Some(service.clone())) {
                        found.push(format!(
                            "lost write: member {id} lists written key {key} as {listed:?}, its \
                             acknowledged service was {service}"
                        ));
                    }
                }
                Fate::Deleted if alive.contains_key(key) => found.push(format!(
                    "lost delete: member {id} lists {key}, whose delete was acknowledged"
                )),
                Fate::Deleted | Fate::Uncertain => {}
            }
        }
        for key in live {
            let promise = promised.get(key).copied().unwrap_or(0);
            if promise > completed_ms && !alive.contains_key(key) {
                found.push(format!(
                    "lost key: member {id} does not list live key {key}, promised until \
                     {promise} ms (listed by {completed_ms} ms)"
                ));
            }
        }
        for key in dead.iter().filter(|key| alive.contains_key(*key)) {
            found.push(format!("member {id} still lists dead key {key} alive"));
        }
    }
    found
}

/// The listings as the checker's final state (its rule 4).
fn final_state(listings: &Listings, origin: Origin) -> FinalState {
    FinalState {
        started_ms: origin.floor(listings.started),
        completed_ms: origin.ceil(listings.completed),
        members: (listings.alive.iter())
            .map(|(id, keys)| (format!("n{id}"), keys.keys().cloned().collect()))
            .collect(),
    }
}

/// How many written keys ended each way.
pub(super) fn fates(written: &Written) -> String {
    let (mut kept, mut deleted, mut uncertain) = (0, 0, 0);
    for fate in written.values() {
        match fate {
            Fate::Kept { .. } => kept += 1,
            Fate::Deleted => deleted += 1,
            Fate::Uncertain => uncertain += 1,
        }
    }
    format!("{kept} keys kept, {deleted} deleted, {uncertain} uncertain")
}

/// Panics with every violation, the summary and the members' logs if there is any; the
/// history goes to a file then.
pub(super) fn assert_clean(cluster: &Cluster, found: &[String], summary: &str, history: &History) {
    eprintln!("{summary}");
    if found.is_empty() {
        return;
    }
    let path = std::env::temp_dir().join(format!(
        "ttlwheel-{}-history-{}.json",
        summary.split(':').next().unwrap_or("cluster"),
        std::process::id()
    ));
    let written = serde_json::to_vec(history)
        .ok()
        .map(|json| std::fs::write(&path, json));
    let history = match written {
        Some(Ok(())) => format!("the history is in {}", path.display()),
        _ => "the history could not be written".to_owned(),
    };
    let shown: Vec<String> = found.iter().take(40).map(|v| format!("- {v}")).collect();
    panic!(
        "{} violation(s), the first {}:\n{}\n{summary}\n{history}\n{}",
        found.len(),
        shown.len(),
        shown.join("\n"),
        cluster.logs()
    );
}
