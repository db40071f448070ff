//! A follower cut off from both peers, then healed (issue 28, section 5; docs/cluster-design.md,
//! section 10). Three members under load: keep-alive clients ([`Driver`]) heartbeat 150 keys
//! every TTL/3 (TTLs 3-6 s) through any member, and a [`Writer`] has created keys with
//! services. Then thirty keys' clients stop, and a follower's links to and from both peers
//! are blackholed ([`Cluster::isolate`]) for at least 10 s: fifty checkpoints, every live
//! key's deadline as the follower last knew it passes, and the majority expires the thirty dead
//! keys meanwhile, while a second writer on the majority creates keys, deletes some of the
//! first writer's and moves others to another service. Linearizable reads are sent to the
//! cut-off follower every 250 ms. Then the links are healed.
//!
//! **What must hold** (each checked; any violation fails the test, with the members' logs):
//! - *The cut-off follower changes nothing by itself*: from 1 s after the cut (entries
//!   committed before it are applied by then) to the heal, its stream carries no event at all
//!   (no `expired` above all: only a leader with a quorum expires), and its alive and expired
//!   listings (with services) stay as they were 1 s after the cut; it still lists every dead
//!   key the majority expired meanwhile.
//! - *It serves no linearizable read*: every read sent to it after the cut is answered 503
//!   (`no_leader`/`no_quorum`: it cannot reach the leader) or not at all (a forward lost in the
//!   blackhole); never 200 or 404, which would be its own stale state. At least one 503 came.
//! - *It converges*: within [`WAIT`] of the heal every member lists, at one applied index, the
//!   same alive keys with the same services and the same expired keys; its `GET /v1/cluster`
//!   shows `applied_index` equal to the leader's `committed_index`; its stream then reports
//!   each dead key expired exactly once (as every member's does).
//! - *Nothing acknowledged is lost, nothing live expires*: at the end (clients stopped, one
//!   applied index) every member lists each written key with its last acknowledged service and
//!   none whose delete was acknowledged, and no delete found its key already gone; no live key is reported expired on any stream or
//!   listed expired; the history checker passes on every client operation and the final listing.
//! - *The scenario did what it says*: the majority expired every dead key, and the writer
//!   created, deleted and moved keys, while the follower was cut off.
//!
//! - *Webhooks converge*: every member has the same `--webhook-url`; after the heal every
//!   member's outbox empties (the leader's delivery reports reach the healed follower too),
//!   every dead key was delivered under one id, and no live key was.
//!
//! **What would make it fail**: a follower that sweeps by its own clock (the deadlines it holds
//! from checkpoints pass while it is cut off) publishes expiries and drops keys; a follower that
//! answers a linearizable read from its own state when the leader is unreachable; a follower
//! that never catches up after the blackhole (a replication stream left broken, a log conflict
//! resolved wrongly) or applies the log differently (listings differ at one index); a member
//! that publishes an entry's events twice, or none, when it catches up.
//!
//! A second, lighter test ([`a_cut_off_follower_rejoins_without_deposing_the_leader`]) cuts a
//! follower off with no other load and checks that the heal leaves the leader and its term
//! alone (the campaign gate, `src/cluster/campaign.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use tokio::sync::watch;

use super::driver::{self, Driver, DriverConfig, KeySpec, Origin, Writer, WriterConfig, Written};
use super::events::{ids_by_key, wait_for_empty_outboxes};
use super::harness::{Cluster, EventTap, HEAVY, WAIT};
use super::history::{Ms, Op};
use super::rolling::{assert_clean, fates, judge_ending, Ending};
use crate::receiver::{always, Receiver};

/// The shortest cut: fifty checkpoints (200 ms), past every live key's deadline (6 s at most)
/// as the follower last knew it.
const CUT_AT_LEAST: Duration = Duration::from_secs(10);
/// After the cut, by when the follower has applied what was committed before it.
const SETTLE_CUT: Duration = Duration::from_secs(1);
/// Between two linearizable reads sent to the cut-off follower.
const PROBE_EVERY: Duration = Duration::from_millis(250);
/// How long the clients renew before the dead ones stop.
const RENEWING: Duration = Duration::from_secs(2);

/// A linearizable read sent to the cut-off follower and its answer.
struct ReadProbe {
    path: String,
    invoked_ms: Ms,
    /// `None`: no answer within the probe's timeout.
    status: Option<StatusCode>,
    code: Option<String>,
}

/// Must hold: see the module documentation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_follower_expires_nothing_serves_no_linearizable_read_and_converges() {
    let _one_at_a_time = HEAVY.lock().await;
    let receiver = Receiver::start(always(StatusCode::OK)).await;
    let url = receiver.url().to_string();
    let cluster = Cluster::start(
        "partition",
        3,
        // The mass-expiry guard holds due keys: it would hide a false expiration.
        &["--expiry-guard", "off", "--webhook-url", &url],
    )
    .await;
    let leader = cluster.leader().await;
    let term_before = term_of(&cluster, leader).await;
    let cut = cluster.running_other_than(&[leader]);
    let majority: Vec<u64> = (cluster.running().into_iter())
        .filter(|&id| id != cut)
        .collect();
    let all = cluster.running();
    let origin = Origin::now();
    let mut taps = Vec::new();
    for &id in &all {
        taps.push((id, EventTap::follow(&cluster.base(id)).await));
    }
    let bases: Vec<String> = all.iter().map(|&id| cluster.base(id)).collect();
    let live_keys = KeySpec::spread("live", 150, 3..=6);
    let dead_keys = KeySpec::spread("dead", 30, 3..=5);
    let live = Driver::start(
        1,
        bases.clone(),
        live_keys.clone(),
        DriverConfig::default(),
        origin,
    );
    let dead = Driver::start(
        1_000,
        bases.clone(),
        dead_keys.clone(),
        DriverConfig::default(),
        origin,
    );
    let before = Writer::start(
        2_000,
        bases,
        WriterConfig::new("before"),
        origin,
        Written::new(),
    );
    for driver in [&live, &dead] {
        if let Err(why) = driver.wait_registered(WAIT).await {
            panic!("{why}\n{}", cluster.logs());
        }
    }
    tokio::time::sleep(RENEWING).await;
    let (before_ops, before_written) = before.stop().await;
    let (dead_ops, _) = dead.stop().await;

    cluster.isolate(cut);
    let isolated = Instant::now();
    let majority_bases: Vec<String> = majority.iter().map(|&id| cluster.base(id)).collect();
    let during_config = WriterConfig {
        delete_every: 2,
        move_every: 2,
        ..WriterConfig::new("during")
    };
    let during = Writer::start(3_000, majority_bases, during_config, origin, before_written);
    let (stop_probing, probing) = watch::channel(false);
    let dead_set: BTreeSet<String> = dead_keys.iter().map(|spec| spec.key.clone()).collect();
    let cut_off = async {
        tokio::time::sleep(SETTLE_CUT).await;
        let at_cut = cut_off_state(&cluster, cut).await;
        let majority_expired = wait_cut(&cluster, leader, &dead_set, &during, isolated).await;
        let at_heal = cut_off_state(&cluster, cut).await;
        let _ = stop_probing.send(true);
        (at_cut, majority_expired, at_heal)
    };
    let (probes, (at_cut, majority_expired, at_heal)) =
        tokio::join!(probe_reads(&cluster, cut, origin, probing), cut_off);
    let (during_counts, during_refusals) = (during.counts(), during.refusals());
    let (during_ops, written) = during.stop().await;
    let healed_ms = origin.floor_now();
    let healed = Instant::now();
    cluster.heal();

    let mut found = Vec::new();
    found.extend(majority_expired);
    if during_counts.created == 0 || during_counts.deleted == 0 || during_counts.moved == 0 {
        found.push(format!(
            "the majority's writer did not create, delete and move keys while {cut} was cut off: \
             {during_counts:?}; not acknowledged: {during_refusals:?}"
        ));
    }
    found.extend(unchanged_while_cut_off(cut, &at_cut, &at_heal, &dead_set));
    let cut_ms = origin.ceil(isolated);
    found.extend(events_while_cut_off(
        &taps,
        cut,
        origin,
        cut_ms + SETTLE_CUT.as_millis() as Ms,
        healed_ms,
    ));
    found.extend(served_reads(cut, cut_ms, &probes));

    // Under load (the live clients run, checkpoints go on): bounded by `settled_listings`.
    let converged = cluster.settled_listings(&all).await;
    let converged_after = healed.elapsed();
    found.extend(converged.differences());
    let (leader_after, caught_up) = caught_up(&cluster, cut).await;
    let caught_up_after = healed.elapsed();
    let term_after = term_of(&cluster, leader_after).await;
    found.extend(expired_once_each(&taps, &dead_set, origin).await);
    wait_for_empty_outboxes(&cluster, &all).await;
    found.extend(webhooks_of(&receiver, &dead_set));
    let mut expired_listings = BTreeMap::new();
    for &id in &all {
        let listed = (cluster.stale_keys_in(id, "expired").await)
            .unwrap_or_else(|| panic!("member {id} lists no expired keys"));
        expired_listings.insert(id, listed);
    }
    let live_answers = live.answers();
    let (live_ops, _) = live.stop().await;
    let live_stopped_ms = origin.ceil_now();
    let listings = cluster.settled_listings(&all).await;

    let live_set: BTreeSet<String> = live_keys.iter().map(|spec| spec.key.clone()).collect();
    let ops: Vec<Op> = (live_ops.iter())
        .chain(&dead_ops)
        .chain(&before_ops)
        .chain(&during_ops)
        .cloned()
        .collect();
    let (violations, history) = judge_ending(Ending {
        taps: &taps,
        live: &live_set,
        dead: &dead_set,
        live_stopped_ms,
        live_ops: &live_ops,
        writer_ops: &during_ops,
        ops,
        written: &written,
        expired_listings: &expired_listings,
        listings: &listings,
        origin,
    });
    found.extend(violations);

    let answered: BTreeMap<String, usize> =
        probes.iter().fold(BTreeMap::new(), |mut seen, probe| {
            let status = probe.status.map(|status| status.as_u16());
            let answer = format!("{}: {status:?} {:?}", probe.path, probe.code);
            *seen.entry(answer).or_default() += 1;
            seen
        });
    let summary = format!(
        "partition: leader {leader} (term {term_before}), member {cut} cut off at {cut_ms} ms, \
         healed at {healed_ms} ms ({} ms later); {} linearizable reads sent to it: \
         {answered:?}\nconverged (one applied index, {}) {converged_after:?} after the heal; \
         caught up with leader {leader_after} (term {term_after}, index {caught_up}) \
         {caught_up_after:?} after it\nlive clients: {}; dead \
         clients: {}\nwriters: {}; {}; during the cut {during_counts:?}, not acknowledged: \
         {during_refusals:?}; {}\nlive clients' answers:\n{live_answers:?}",
        healed_ms - cut_ms,
        probes.len(),
        converged.index,
        driver::tally(&live_ops),
        driver::tally(&dead_ops),
        driver::tally(&before_ops),
        driver::tally(&during_ops),
        fates(&written),
    );
    assert_clean(&cluster, &found, &summary, &history);
}

/// Member `id`'s Raft term, per `GET /v1/cluster`.
/// Every dead key delivered, each under one id, and nothing else (a live key's expiry).
fn webhooks_of(receiver: &Receiver, dead: &BTreeSet<String>) -> Vec<String> {
    let by_key = ids_by_key(&receiver.requests());
    let mut found = Vec::new();
    for key in dead {
        match by_key.get(key).map(BTreeSet::len) {
            Some(1) => {}
            Some(n) => found.push(format!("webhooks: {key} expired under {n} ids")),
            None => found.push(format!("webhooks: {key}'s expiry was never delivered")),
        }
    }
    for key in by_key.keys().filter(|key| !dead.contains(*key)) {
        found.push(format!(
            "webhooks: {key} was delivered expired, and it was not dead"
        ));
    }
    found
}

async fn term_of(cluster: &Cluster, id: u64) -> u64 {
    (cluster.status(id).await)
        .and_then(|status| status["term"].as_u64())
        .unwrap_or_else(|| panic!("member {id} shows no term"))
}

/// The cut-off member's listings (alive and expired, with services) and applied index.
#[derive(Debug, PartialEq)]
struct CutOffState {
    alive: BTreeMap<String, Option<String>>,
    expired: BTreeMap<String, Option<String>>,
    applied_index: Option<u64>,
}

async fn cut_off_state(cluster: &Cluster, id: u64) -> CutOffState {
    let listed = |state| async move {
        (cluster.stale_services_in(id, state).await)
            .unwrap_or_else(|| panic!("member {id} lists no {state} keys while cut off"))
    };
    CutOffState {
        alive: listed("alive").await,
        expired: listed("expired").await,
        applied_index: cluster.applied_index(id).await,
    }
}

/// Waits, at most [`WAIT`] past [`CUT_AT_LEAST`], until the cut has lasted that long, the
/// leader lists every dead key expired and the writer on the majority has created, deleted
/// and moved keys. What the majority did not do by then, as violations.
async fn wait_cut(
    cluster: &Cluster,
    leader: u64,
    dead: &BTreeSet<String>,
    writer: &Writer,
    isolated: Instant,
) -> Vec<String> {
    loop {
        let expired: BTreeSet<String> = (cluster.stale_keys_in(leader, "expired").await)
            .unwrap_or_default()
            .into_iter()
            .collect();
        let counts = writer.counts();
        let wrote = counts.created > 0 && counts.deleted > 0 && counts.moved > 0;
        let waited = isolated.elapsed();
        if waited >= CUT_AT_LEAST && dead.is_subset(&expired) && wrote {
            return Vec::new();
        }
        if waited >= CUT_AT_LEAST + WAIT {
            let missing: Vec<&String> = dead.difference(&expired).collect();
            return match missing.is_empty() {
                true => Vec::new(),
                false => vec![format!(
                    "the majority's leader {leader} did not expire dead keys {missing:?} while \
                     the follower was cut off ({waited:?})"
                )],
            };
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Linearizable reads (one key, a page of the list) sent to member `id` every
/// [`PROBE_EVERY`] until `stop` turns true.
async fn probe_reads(
    cluster: &Cluster,
    id: u64,
    origin: Origin,
    mut stop: watch::Receiver<bool>,
) -> Vec<ReadProbe> {
    let http = reqwest::Client::new();
    let base = cluster.base(id);
    let mut probes = Vec::new();
    for n in 0.. {
        if *stop.borrow() {
            break;
        }
        // A key the majority deletes first, and the list.
        let path = match n % 2 {
            0 => "/v1/keys/before-00001",
            _ => "/v1/keys?limit=5",
        };
        let invoked_ms = origin.floor_now();
        let answer = (http.get(format!("{base}{path}")))
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        let (status, code) = match answer {
            Ok(answer) => {
                let status = answer.status();
                let body: serde_json::Value = answer.json().await.unwrap_or_default();
                (
                    Some(status),
                    body["error"]["code"].as_str().map(str::to_owned),
                )
            }
            Err(_) => (None, None),
        };
        probes.push(ReadProbe {
            path: path.to_owned(),
            invoked_ms,
            status,
            code,
        });
        tokio::select! {
            () = tokio::time::sleep(PROBE_EVERY) => {}
            _ = stop.changed() => {}
        }
    }
    probes
}

/// The cut-off member's listings changed between 1 s after the cut and the heal, or it no
/// longer lists a dead key the majority expired.
fn unchanged_while_cut_off(
    id: u64,
    at_cut: &CutOffState,
    at_heal: &CutOffState,
    dead: &BTreeSet<String>,
) -> Vec<String> {
    let mut found = Vec::new();
    if at_cut != at_heal {
        let dropped: Vec<&String> = (at_cut.alive.keys())
            .filter(|key| !at_heal.alive.contains_key(*key))
            .take(10)
            .collect();
        let expired: Vec<&String> = (at_heal.expired.keys())
            .filter(|key| !at_cut.expired.contains_key(*key))
            .take(10)
            .collect();
        found.push(format!(
            "member {id} changed while cut off: applied index {:?} then {:?}; {} alive keys then \
             {} (no longer alive: {dropped:?}); {} expired then {} (newly expired: {expired:?})",
            at_cut.applied_index,
            at_heal.applied_index,
            at_cut.alive.len(),
            at_heal.alive.len(),
            at_cut.expired.len(),
            at_heal.expired.len(),
        ));
    }
    for key in dead.iter().filter(|key| !at_heal.alive.contains_key(*key)) {
        found.push(format!(
            "member {id} no longer listed dead key {key} alive while cut off"
        ));
    }
    found
}

/// Events the cut-off member's stream carried between `from_ms` and `to_ms`: it can apply
/// nothing then, so it has nothing to publish.
fn events_while_cut_off(
    taps: &[(u64, EventTap)],
    id: u64,
    origin: Origin,
    from_ms: Ms,
    to_ms: Ms,
) -> Vec<String> {
    (taps.iter().filter(|(tapped, _)| *tapped == id))
        .flat_map(|(_, tap)| tap.frames())
        .filter(|frame| (from_ms..to_ms).contains(&origin.ceil(frame.received)))
        .map(|frame| {
            format!(
                "member {id} published {} {} at {} ms while cut off",
                frame.event,
                frame.data,
                origin.ceil(frame.received)
            )
        })
        .collect()
}

/// Linearizable reads the cut-off member answered with its own state (200 or 404) although
/// sent after the cut; and a violation if none was answered 503.
fn served_reads(id: u64, cut_ms: Ms, probes: &[ReadProbe]) -> Vec<String> {
    let after: Vec<&ReadProbe> = (probes.iter())
        .filter(|probe| probe.invoked_ms >= cut_ms)
        .collect();
    let mut found: Vec<String> = (after.iter())
        .filter(|probe| {
            probe
                .status
                .is_some_and(|status| status.is_success() || status == StatusCode::NOT_FOUND)
        })
        .map(|probe| {
            format!(
                "member {id} answered a linearizable read of {} sent {} ms after the cut: {:?} {:?}",
                probe.path,
                probe.invoked_ms - cut_ms,
                probe.status,
                probe.code
            )
        })
        .collect();
    let refused = (after.iter())
        .filter(|probe| probe.status == Some(StatusCode::SERVICE_UNAVAILABLE))
        .count();
    if refused == 0 {
        found.push(format!(
            "none of the {} linearizable reads sent to member {id} while cut off was answered 503",
            after.len()
        ));
    }
    found
}

/// Waits until member `id` reports as applied exactly what the leader reports as committed
/// (the leader's read before and after its own, so that no entry slipped in between); returns
/// the leader and that index. At most [`WAIT`].
async fn caught_up(cluster: &Cluster, id: u64) -> (u64, u64) {
    let leader = cluster.leader().await;
    let committed = |status: Option<serde_json::Value>| {
        status.and_then(|status| status["committed_index"].as_u64())
    };
    let started = Instant::now();
    loop {
        let first = committed(cluster.status(leader).await);
        let applied = cluster.applied_index(id).await;
        let then = committed(cluster.status(leader).await);
        if let (Some(index), true) = (first, first == applied && applied == then) {
            return (leader, index);
        }
        assert!(
            started.elapsed() < WAIT,
            "member {id} never applied what leader {leader} had committed within {WAIT:?}: \
             {first:?}, {applied:?}, {then:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Each dead key's `expired` event exactly once on every member's stream (waited for, at most
/// [`WAIT`], until every stream has each: the members have applied every expiry by now, but
/// publishing may lag).
async fn expired_once_each(
    taps: &[(u64, EventTap)],
    dead: &BTreeSet<String>,
    origin: Origin,
) -> Vec<String> {
    let started = Instant::now();
    loop {
        let mut found = Vec::new();
        let mut missing = false;
        for (id, tap) in taps {
            let mut times: BTreeMap<&String, Vec<Ms>> = BTreeMap::new();
            for (key, received) in tap.expiries() {
                if let Some(key) = dead.get(&key) {
                    times.entry(key).or_default().push(origin.ceil(received));
                }
            }
            for key in dead {
                let seen = times.get(key).map_or(&[][..], Vec::as_slice);
                missing |= seen.is_empty();
                if seen.len() != 1 {
                    found.push(format!(
                        "member {id}'s stream reported dead key {key} expired {} times (at \
                         {seen:?} ms)",
                        seen.len()
                    ));
                }
            }
        }
        if !missing || started.elapsed() >= WAIT {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How long the quiet-rejoin test keeps a follower cut off: three or more of its election
/// timeouts (1.2-1.6 s after its last contact with the leader, then 0.4-0.8 s each).
const QUIET_CUT: Duration = Duration::from_secs(4);
/// How long the quiet-rejoin test watches the leader after the heal.
const QUIET_WATCH: Duration = Duration::from_secs(3);
/// Between two single-heartbeat writes to the leader.
const QUIET_WRITE_EVERY: Duration = Duration::from_millis(25);

/// One write of the quiet-rejoin test: a new key's heartbeat sent to the leader.
struct QuietWrite {
    key: String,
    sent: Instant,
    /// `None`: no answer (the client's timeout, 10 s, is above the 5 s proposal bound).
    status: Option<StatusCode>,
    code: Option<String>,
}

/// A follower cut off (every link to and from it blackholed) for [`QUIET_CUT`], then healed,
/// rejoins quietly: it never campaigns while it cannot win (`campaign.rs`'s gate, openraft
/// 0.9 having no pre-vote), so no higher term reaches the healthy leader at the heal.
///
/// **What must hold** (each checked): a steady stream of single heartbeats, each creating a
/// key through the log, sent to the leader from before the cut until [`QUIET_WATCH`] after
/// the heal, is answered 200 (no 503 across the heal: the leader never steps down), but for
/// a lone 503 `no_quorum` between two 200s ([`refused_writes`]); the leader's `GET
/// /v1/cluster`, polled all along, names the same leader in the same term; the cut-off
/// follower's gate is shut while it is cut off; the healed follower ends in that term too,
/// following that leader, and holds every key acknowledged (those written while it was cut
/// off included).
///
/// **What would make it fail**: a cut-off follower that campaigns (its term climbs with each
/// election timeout) and, at the heal, hands the higher term to the leader (in an
/// AppendEntries answer or a vote request), which steps down: the term jumps and the writes
/// meanwhile get 503s; a follower that never catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_follower_rejoins_without_deposing_the_leader() {
    let _one_at_a_time = HEAVY.lock().await;
    let cluster = Cluster::start("quiet-rejoin", 3, &[]).await;
    let leader = cluster.leader().await;
    // The leader records members' API addresses with a membership change (`SetNodes`), which
    // restarts replication: one during the cut briefly fenced the leader (a 503 `no_quorum`).
    // That is not what this test is about; it starts once the addresses are in.
    let every_api_addr = |status: &serde_json::Value| {
        (status["members"].as_array()).is_some_and(|members| {
            (members.iter())
                .all(|member| member["api_addr"].as_str().is_some_and(|a| !a.is_empty()))
        })
    };
    (cluster.wait_for_status(leader, "knew every member's API address", every_api_addr)).await;
    let term = term_of(&cluster, leader).await;
    let cut = cluster.running_other_than(&[leader]);
    let (stop, stopped) = watch::channel(false);
    let watched = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        cluster.isolate(cut);
        let during = leader_views(&cluster, leader, QUIET_CUT).await;
        let campaigning_while_cut = may_campaign(&cluster, cut).await;
        cluster.heal();
        let healed = Instant::now();
        let after = leader_views(&cluster, leader, QUIET_WATCH).await;
        let _ = stop.send(true);
        (during, campaigning_while_cut, healed, after)
    };
    let (writes, (during, campaigning_while_cut, healed, after)) =
        tokio::join!(write_steadily(&cluster, leader, stopped), watched);

    let mut found = Vec::new();
    for (phase, views) in [("while cut off", &during), ("after the heal", &after)] {
        if views.iter().any(|view| *view != Some((leader, term))) {
            found.push(format!(
                "{phase}: the leader's GET /v1/cluster, every 100 ms, showed (leader, term) \
                 {:?} (each with how many polls in a row), not ({leader}, {term}) throughout",
                runs(views)
            ));
        }
    }
    found.extend(refused_writes(&writes, healed));
    if campaigning_while_cut != Some(false) {
        found.push(format!(
            "member {cut}'s GET /v1/cluster showed may_campaign {campaigning_while_cut:?} while \
             it was cut off (false expected: it can reach no voter)"
        ));
    }
    let written: Vec<String> = (writes.iter())
        .filter(|write| write.status == Some(StatusCode::OK))
        .map(|write| write.key.clone())
        .collect();
    let (cut_view, missing) = rejoined(&cluster, cut, &written).await;
    if cut_view != Some((leader, term)) {
        found.push(format!(
            "member {cut} rejoined with (leader, term) {cut_view:?}, not ({leader}, {term})"
        ));
    }
    if !missing.is_empty() {
        found.push(format!(
            "member {cut} lacks {} acknowledged keys within {WAIT:?} of the heal, the first: \
             {:?}",
            missing.len(),
            &missing[..missing.len().min(10)]
        ));
    }
    let summary = format!(
        "quiet rejoin: leader {leader} in term {term}; member {cut} cut off for {QUIET_CUT:?}; \
         {} writes to the leader; {} and {} views of the leader polled during and after",
        writes.len(),
        during.len(),
        after.len()
    );
    eprintln!("{summary}");
    assert!(
        found.is_empty(),
        "{} violation(s):\n- {}\n{summary}\n{}",
        found.len(),
        found.join("\n- "),
        cluster.logs()
    );
}

/// The writes of [`write_steadily`] not answered 200, as violations, but for a lone 503
/// `no_quorum` between two 200s: the leader's fence refusing one write when a round of
/// AppendEntries to the healthy follower timed out (150 ms) on a loaded machine, which
/// happened once in some twenty-five runs, two seconds after the heal, in the leader's term. A
/// step-down answers `no_leader`, then `no_quorum` until the new leader is promoted, for a
/// second or more (58 and 67 writes refused in two runs before the campaign gate).
fn refused_writes(writes: &[QuietWrite], healed: Instant) -> Vec<String> {
    let refused = |at: usize| {
        writes
            .get(at)
            .is_some_and(|w| w.status != Some(StatusCode::OK))
    };
    let lone_fence = |at: usize| {
        let write = &writes[at];
        write.status == Some(StatusCode::SERVICE_UNAVAILABLE)
            && write.code.as_deref() == Some("no_quorum")
            && !refused(at + 1)
            && (at == 0 || !refused(at - 1))
    };
    let describe = |write: &QuietWrite| {
        let since_heal = write.sent.checked_duration_since(healed);
        format!(
            "{} {:?} {:?} (sent {since_heal:?} after the heal; None: before it)",
            write.key, write.status, write.code
        )
    };
    let (lone, counted): (Vec<usize>, Vec<usize>) = (0..writes.len())
        .filter(|&at| refused(at))
        .partition(|&at| lone_fence(at));
    if !lone.is_empty() {
        let lone: Vec<String> = lone.iter().map(|&at| describe(&writes[at])).collect();
        eprintln!("lone fence refusals, allowed: {lone:?}");
    }
    match (counted.first(), counted.last()) {
        (Some(&first), Some(&last)) => vec![format!(
            "{} of {} writes to the leader were not answered 200 (lone 503 no_quorum left \
             out): the first, {}; the last, {}",
            counted.len(),
            writes.len(),
            describe(&writes[first]),
            describe(&writes[last]),
        )],
        _ => Vec::new(),
    }
}

/// Sends single heartbeats, each creating a new key, to member `leader` one after another
/// until `stop` turns true; every attempt with its answer.
async fn write_steadily(
    cluster: &Cluster,
    leader: u64,
    mut stop: watch::Receiver<bool>,
) -> Vec<QuietWrite> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a client");
    let url = format!("{}/v1/heartbeats", cluster.base(leader));
    let mut writes = Vec::new();
    for n in 0.. {
        if *stop.borrow() {
            break;
        }
        let key = format!("quiet-{n:05}");
        let sent = Instant::now();
        let body = serde_json::json!({ "key": key, "ttl_s": 600 });
        let (status, code) = match http.post(&url).json(&body).send().await {
            Ok(answer) => {
                let status = answer.status();
                let body: serde_json::Value = answer.json().await.unwrap_or_default();
                let code = body["error"]["code"].as_str().map(str::to_owned);
                (Some(status), code)
            }
            Err(_) => (None, None),
        };
        writes.push(QuietWrite {
            key,
            sent,
            status,
            code,
        });
        tokio::select! {
            () = tokio::time::sleep(QUIET_WRITE_EVERY) => {}
            _ = stop.changed() => {}
        }
    }
    writes
}

/// `views` as runs of equal values: each value and how many times in a row.
fn runs<T: PartialEq + Copy>(views: &[T]) -> Vec<(T, usize)> {
    let mut runs: Vec<(T, usize)> = Vec::new();
    for &view in views {
        match runs.last_mut() {
            Some((last, count)) if *last == view => *count += 1,
            _ => runs.push((view, 1)),
        }
    }
    runs
}

/// `(leader_id, term)` from member `id`'s `GET /v1/cluster` every 100 ms for `lasting`
/// (`None`: no answer, or no leader).
async fn leader_views(cluster: &Cluster, id: u64, lasting: Duration) -> Vec<Option<(u64, u64)>> {
    let started = Instant::now();
    let mut views = Vec::new();
    while started.elapsed() < lasting {
        views.push(leader_view(cluster, id).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    views
}

async fn leader_view(cluster: &Cluster, id: u64) -> Option<(u64, u64)> {
    let status = cluster.status(id).await?;
    Some((status["leader_id"].as_u64()?, status["term"].as_u64()?))
}

/// Member `id`'s `may_campaign` in `GET /v1/cluster`.
async fn may_campaign(cluster: &Cluster, id: u64) -> Option<bool> {
    cluster.status(id).await?["may_campaign"].as_bool()
}

/// Waits (at most [`WAIT`]) until member `id` lists every key of `written` alive; then its
/// `(leader_id, term)` and the keys it still lacks.
async fn rejoined(
    cluster: &Cluster,
    id: u64,
    written: &[String],
) -> (Option<(u64, u64)>, Vec<String>) {
    let started = Instant::now();
    loop {
        let listed: BTreeSet<String> = (cluster.stale_keys(id).await)
            .unwrap_or_default()
            .into_iter()
            .collect();
        let missing: Vec<String> = (written.iter())
            .filter(|key| !listed.contains(*key))
            .cloned()
            .collect();
        if missing.is_empty() || started.elapsed() >= WAIT {
            return (leader_view(cluster, id).await, missing);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
