//! Events from a cluster (issue 28, section 3, "Events once"), against real members, a real
//! receiver and real streams. Webhooks: every member holds every expiry's event under the id
//! its log entry gives it, only the leader sends, and its reports through the log empty the
//! other members' outboxes; after a failover the next leader sends what was not settled,
//! under the same ids. Live streams: every member numbers an event by its place in the log,
//! so a client resumes on any member with the id another one gave it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::harness::{Cluster, EventTap, StreamFrame, WAIT};
use crate::receiver::{always, Received, Receiver};

/// Registers `keys` for `ttl_s` through member `via`; panics unless each is created.
async fn register(cluster: &Cluster, via: u64, keys: &[String], ttl_s: u64) {
    for key in keys {
        let body = json!({ "key": key, "ttl_s": ttl_s, "service": "hooks" });
        let answer = cluster
            .call(via, Method::POST, "/v1/heartbeats", Some(body))
            .await;
        let Some((status, body, _)) = answer else {
            panic!("{key}: no answer\n{}", cluster.logs());
        };
        assert_eq!(status, StatusCode::OK, "{key}: {body}\n{}", cluster.logs());
        assert_eq!(body["created"], true, "{key}: {body}");
    }
}

/// Registers `keys` through member `via` as a client would with one member stopped: a 503
/// (`no_quorum`: the one follower left acknowledged late, as happens on a loaded machine) is
/// retried after its `Retry-After`, for up to [`WAIT`]; anything else fails the test.
async fn register_retrying(cluster: &Cluster, via: u64, keys: &[String]) {
    let deadline = tokio::time::Instant::now() + WAIT;
    for key in keys {
        loop {
            let body = json!({ "key": key, "ttl_s": 600, "service": "hooks" });
            let answer = cluster
                .call(via, Method::POST, "/v1/heartbeats", Some(body))
                .await;
            let Some((status, body, _)) = answer else {
                panic!("{key}: no answer\n{}", cluster.logs());
            };
            if status == StatusCode::OK {
                break;
            }
            assert!(
                status == StatusCode::SERVICE_UNAVAILABLE && tokio::time::Instant::now() < deadline,
                "{key}: {status} {body}\n{}",
                cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Member `id`'s `GET /v1/webhooks` entry for its one URL.
pub(super) async fn delivery(cluster: &Cluster, id: u64) -> Option<Value> {
    let (status, body, _) = cluster.call(id, Method::GET, "/v1/webhooks", None).await?;
    (status == StatusCode::OK).then(|| body["webhooks"][0].clone())
}

/// Waits until every member in `ids` holds nothing for its URL (`pending` 0).
pub(super) async fn wait_for_empty_outboxes(cluster: &Cluster, ids: &[u64]) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let mut views = Vec::new();
        for &id in ids {
            views.push((id, delivery(cluster, id).await));
        }
        if views
            .iter()
            .all(|(_, view)| view.as_ref().is_some_and(|view| view["pending"] == 0))
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "outboxes still hold events after {WAIT:?}: {views:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The ids each key's `key.expired` requests carried, by key.
pub(super) fn ids_by_key(requests: &[Received]) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_key: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for request in requests {
        assert_eq!(request.json["type"], "key.expired", "{}", request.json);
        by_key
            .entry(request.key().to_owned())
            .or_default()
            .insert(request.id().to_owned());
    }
    by_key
}

/// Registers keys (one entry each) through `leader` until its log no longer holds entry
/// `index` (its `purged_index` reaches it); the keys it registered.
async fn purge_past(cluster: &Cluster, leader: u64, index: u64) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut fillers = Vec::new();
    loop {
        let status = cluster.status(leader).await.unwrap_or_default();
        if status["purged_index"]
            .as_u64()
            .is_some_and(|purged| purged >= index)
        {
            return fillers;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leader never purged its log through entry {index}: {status}\n{}",
            cluster.logs()
        );
        let filler = format!("filler-{:03}", fillers.len());
        register_retrying(cluster, leader, std::slice::from_ref(&filler)).await;
        fillers.push(filler);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:03}")).collect()
}

/// Must not happen: a receiver getting an expiry from every member (three requests for one
/// event), or an event under two ids. Must not be kept: events the leader delivered, on the
/// other members (they would be sent again by the next leader). Fails if followers send, or if
/// the leader's delivery reports do not reach them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_sends_each_expiry_once_and_every_member_drops_it() {
    let receiver = Receiver::start(always(StatusCode::OK)).await;
    let url = receiver.url().to_string();
    let cluster = Cluster::start("hooks-once", 3, &["--webhook-url", &url]).await;
    let leader = cluster.leader().await;
    let doomed = keys("once", 30);
    register(&cluster, leader, &doomed, 1).await;

    receiver
        .wait_until(WAIT, |requests| ids_by_key(requests).len() == doomed.len())
        .await;
    // Every member holds the events as soon as it applies their entry; a member that sent
    // them would have within this.
    wait_for_empty_outboxes(&cluster, &cluster.running()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let requests = receiver.requests();
    let by_key = ids_by_key(&requests);
    assert_eq!(
        by_key.keys().cloned().collect::<Vec<_>>(),
        doomed,
        "every key's expiry arrived"
    );
    for (key, ids) in &by_key {
        assert_eq!(ids.len(), 1, "{key}: one id, {ids:?}");
        let id = ids.first().expect("one");
        assert!(
            id.starts_with("msg_log_"),
            "{key}: an id from the log, {id}"
        );
    }
    assert_eq!(
        requests.len(),
        doomed.len(),
        "one request per expiry in all: {:?}",
        requests.iter().map(Received::id).collect::<Vec<_>>()
    );
    for id in cluster.running() {
        let view = delivery(&cluster, id).await.expect("an answer");
        let delivered = if id == leader { doomed.len() } else { 0 };
        assert_eq!(view["delivered"], delivered, "member {id}: {view}");
    }
}

/// Must not be lost: an expiry the leader could not deliver before it was killed; the next
/// leader sends it. Must not happen: one expiry under two ids (the receiver deduplicates on
/// them). Fails if followers drop events they were never told were settled, if the new leader
/// does not send, or if ids are each member's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_sends_what_the_old_one_could_not_under_the_same_ids() {
    // A 400 fails one event at a time without pausing the URL: the leader tries every one.
    let receiver = Receiver::start(always(StatusCode::BAD_REQUEST)).await;
    let url = receiver.url().to_string();
    let mut cluster = Cluster::start(
        "hooks-failover",
        3,
        &["--webhook-url", &url, "--webhook-max-attempts", "100"],
    )
    .await;
    let leader = cluster.leader().await;
    let doomed = keys("failover", 20);
    register(&cluster, leader, &doomed, 1).await;
    receiver
        .wait_until(WAIT, |requests| ids_by_key(requests).len() == doomed.len())
        .await;
    let before = ids_by_key(&receiver.requests());
    for (key, ids) in &before {
        assert_eq!(ids.len(), 1, "{key}: one id while retried, {ids:?}");
    }

    cluster.kill(leader);
    let killed_at = std::time::Instant::now();
    receiver.answer_with(always(StatusCode::OK));
    let survivors = cluster.running();
    let next = cluster.leader_among(&survivors).await;
    assert_ne!(next, leader);
    receiver
        .wait_until(WAIT, |requests| {
            let delivered: BTreeSet<&str> = requests
                .iter()
                .filter(|request| request.arrived > killed_at)
                .map(Received::key)
                .collect();
            delivered.len() == doomed.len()
        })
        .await;
    wait_for_empty_outboxes(&cluster, &survivors).await;

    let after = ids_by_key(&receiver.requests());
    assert_eq!(
        after, before,
        "each expiry keeps the one id it had before the failover"
    );
    let view = delivery(&cluster, next).await.expect("an answer");
    assert_eq!(
        view["delivered"],
        doomed.len(),
        "the new leader sent: {view}"
    );
}

/// Member `via`'s dead letters as `(id, event_id)`, oldest first; `stale` reads its own
/// applied state (a follower's), otherwise the leader's (a follower forwards the read).
async fn dead_letters(cluster: &Cluster, via: u64, stale: bool) -> Option<Vec<(u64, String)>> {
    let query = if stale { "?consistency=stale" } else { "" };
    let path = format!("/v1/webhooks/dead-letters{query}");
    let (status, body, _) = cluster.call(via, Method::GET, &path, None).await?;
    if status != StatusCode::OK {
        return None;
    }
    let letters = body["dead_letters"].as_array()?;
    let pair = |letter: &Value| {
        Some((
            letter["id"].as_u64()?,
            letter["event_id"].as_str()?.to_owned(),
        ))
    };
    letters.iter().map(pair).collect()
}

/// Waits until member `via`'s dead letters (`stale`: its own) satisfy `done`; the last read.
async fn dead_letters_until(
    cluster: &Cluster,
    via: u64,
    stale: bool,
    done: impl Fn(&[(u64, String)]) -> bool,
) -> Vec<(u64, String)> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let letters = dead_letters(cluster, via, stale).await;
        if let Some(letters) = letters.as_ref().filter(|letters| done(letters)) {
            return letters.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "member {via}'s dead letters never got there: {letters:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A dead letter has one id on every member, so that an operator who lists the letters on one
/// member retries the same letter through any other, also after a failover. The letters are
/// filed, one is re-sent and given up on again (a gap in the ids), a follower restarts from a
/// snapshot of them, and the leader is killed. Must not happen: a member showing a letter
/// under another id (before the fix, each member counted its own: the restarted follower
/// numbered the snapshot's letters 1, 2, 3 where the others had 2, 3, 4), or a retry through
/// a follower re-sending another letter than the one it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_has_one_id_on_every_member_before_and_after_a_failover() {
    let receiver = Receiver::start(always(StatusCode::BAD_REQUEST)).await;
    let url = receiver.url().to_string();
    let flags = ["--webhook-url", &url, "--webhook-max-attempts", "1"];
    let mut cluster = Cluster::start("hooks-letters", 3, &flags).await;
    let leader = cluster.leader().await;
    let doomed = keys("letter", 3);
    register(&cluster, leader, &doomed, 1).await;
    let filed = dead_letters_until(&cluster, leader, false, |l| l.len() == doomed.len()).await;

    // Re-sent, refused again: the same event, filed again under a new, higher id.
    let (first_id, first_event) = filed[0].clone();
    let path = format!("/v1/webhooks/dead-letters/{first_id}/retry");
    let (status, body, _) =
        (cluster.call(leader, Method::POST, &path, None).await).expect("an answer");
    assert_eq!(status, StatusCode::ACCEPTED, "{body}\n{}", cluster.logs());
    let letters = dead_letters_until(&cluster, leader, false, |letters| {
        letters.len() == doomed.len()
            && letters
                .last()
                .is_some_and(|(_, event)| *event == first_event)
    })
    .await;
    assert!(letters.iter().all(|(id, _)| *id != first_id), "{letters:?}");
    // Each member, once it applied the retry, shows the leader's letters, ids and all. (Waiting
    // for three letters was not enough: a member that had not applied the retry yet still
    // showed the three letters before it, and failed the test under load.)
    for member in cluster.running() {
        dead_letters_until(&cluster, member, true, |theirs| {
            theirs == letters.as_slice()
        })
        .await;
    }

    // A follower restarted from a snapshot that holds the letters.
    let follower = cluster.running_other_than(&[leader]);
    let (status, body, _) = (cluster.call(follower, Method::POST, "/v1/cluster/snapshot", None))
        .await
        .expect("an answer");
    assert_eq!(status, StatusCode::OK, "{body}\n{}", cluster.logs());
    assert_eq!(
        cluster.terminate(follower).await,
        Some(0),
        "{}",
        cluster.logs()
    );
    cluster.restart(follower);
    let theirs = dead_letters_until(&cluster, follower, true, |l| l.len() == letters.len()).await;
    assert_eq!(
        theirs, letters,
        "the restarted follower's letters, ids and all"
    );

    // The leader killed: the next one shows the same ids, and a retry through the other
    // member re-sends the letter it names.
    cluster.kill(leader);
    let survivors = cluster.running();
    let next = cluster.leader_among(&survivors).await;
    let other = *survivors.iter().find(|&&id| id != next).expect("two left");
    let theirs = dead_letters_until(&cluster, next, true, |l| l.len() == letters.len()).await;
    assert_eq!(theirs, letters, "the new leader's letters, ids and all");
    let (id, event) = letters[1].clone();
    let path = format!("/v1/webhooks/dead-letters/{id}/retry");
    let deadline = tokio::time::Instant::now() + WAIT;
    let body = loop {
        let answer = cluster.call(other, Method::POST, &path, None).await;
        match answer {
            Some((StatusCode::ACCEPTED, body, _)) => break body,
            // The new leader may not serve yet (it is taking over).
            Some((StatusCode::SERVICE_UNAVAILABLE, ..)) | None
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("retry of letter {id}: {other:?}\n{}", cluster.logs()),
        }
    };
    assert_eq!(body["id"], id, "{body}");
    assert_eq!(
        body["event_id"],
        event.as_str(),
        "the letter it named: {body}"
    );
}

/// Waits until `tap` has received a frame `done` accepts; its frames so far.
async fn frames_until(
    tap: &EventTap,
    cluster: &Cluster,
    done: impl Fn(&[StreamFrame]) -> bool,
) -> Vec<StreamFrame> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let frames = tap.frames();
        if done(&frames) {
            return frames;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stream never got there: {frames:?} ({:?})\n{}",
            tap.ended(),
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `(event, key)` of each frame, and each frame's id by key.
fn seen(frames: &[StreamFrame]) -> (Vec<(String, String)>, BTreeMap<String, String>) {
    let key = |frame: &StreamFrame| frame.data["key"].as_str().unwrap_or("").to_owned();
    let events = frames.iter().map(|f| (f.event.clone(), key(f))).collect();
    let ids = frames.iter().map(|f| (key(f), f.id.clone())).collect();
    (events, ids)
}

/// Must hold: a client that read a member's stream up to some event and reconnects to another
/// member with that event's id (`Last-Event-ID`) gets exactly the events after it, under the
/// same ids: none twice, none missing, no `reset`; also from a member that had not applied
/// them yet when the client came (it waits for them). Fails if ids are each member's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_resumes_on_another_member_after_the_last_event_it_read() {
    let cluster = Cluster::start("events-resume", 3, &[]).await;
    let leader = cluster.leader().await;
    let first = cluster.running_other_than(&[leader]);
    let lagging = cluster.running_other_than(&[leader, first]);
    let on_leader = EventTap::follow(&cluster.base(leader)).await;
    let created = keys("resume", 10);
    register(&cluster, leader, &created[..5], 600).await;
    let frames = frames_until(&on_leader, &cluster, |f| f.len() >= 5).await;
    let (events, ids) = seen(&frames);
    let registered = |names: &[String]| -> Vec<(String, String)> {
        names
            .iter()
            .map(|key| ("registered".to_owned(), key.clone()))
            .collect()
    };
    assert_eq!(events, registered(&created[..5]));
    for id in ids.values() {
        assert!(id.starts_with("log-"), "an id from the log: {id}");
    }

    // After the third event, on a follower: the fourth and fifth, under the leader's ids.
    let third = &ids[&created[2]];
    let on_follower = EventTap::resume(&cluster.base(first), Some(third)).await;
    let resumed = frames_until(&on_follower, &cluster, |f| f.len() >= 2).await;
    let (events, resumed_ids) = seen(&resumed);
    assert_eq!(events, registered(&created[3..5]));
    for (key, id) in &resumed_ids {
        assert_eq!(id, &ids[key], "{key}: the same id on both members");
    }

    // A member that has not applied the next events yet: the client waits for them, and
    // gets only what comes after its id.
    cluster.pause(lagging).await;
    register(&cluster, leader, &created[5..], 600).await;
    let frames = frames_until(&on_leader, &cluster, |f| f.len() >= 10).await;
    let (events, ids) = seen(&frames);
    assert_eq!(events, registered(&created));
    let (base, seventh) = (cluster.base(lagging), ids[&created[6]].clone());
    // Sent while the member is stopped: it reads the request when it runs again, before or
    // after it applies what it missed.
    let connecting = tokio::spawn(async move { EventTap::resume(&base, Some(&seventh)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.resume(lagging);
    let on_lagging = connecting.await.expect("the stream answers");
    let resumed = frames_until(&on_lagging, &cluster, |f| f.len() >= 3).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (events, resumed_ids) = seen(&on_lagging.frames());
    assert_eq!(events, registered(&created[7..]), "{resumed:?}");
    for (key, id) in &resumed_ids {
        assert_eq!(id, &ids[key], "{key}: the same id on both members");
    }
}

/// Must not be lost: a live client's knowledge that it missed events. A follower stopped long
/// enough that the leader's log no longer holds what it lacks catches up from a snapshot, and
/// never produces the events of the entries the snapshot covers: a client reading its stream
/// all along must be told (`reset`) where they would have been, then get the events after
/// it, on the same stream. Fails if the stream goes from the events before to those after
/// as if nothing had happened in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_on_a_member_that_catches_up_from_a_snapshot_is_told_to_re_read() {
    let cluster = Cluster::start("events-snapshot", 3, &[]).await;
    let leader = cluster.leader().await;
    let behind = cluster.running_other_than(&[leader]);
    let reader = EventTap::follow(&cluster.base(behind)).await;
    let before = keys("before", 3);
    register(&cluster, leader, &before, 600).await;
    frames_until(&reader, &cluster, |f| f.len() >= before.len()).await;
    let status = cluster.status(behind).await.expect("its status");
    let lacks_from = status["applied_index"].as_u64().expect("an index") + 1;

    cluster.pause(behind).await;
    // One entry each: more than the 256 a member keeps behind its snapshot.
    let missed = keys("missed", 300);
    register_retrying(&cluster, leader, &missed).await;
    let (status, body, _) = cluster
        .call(leader, Method::POST, "/v1/cluster/snapshot", None)
        .await
        .expect("an answer");
    assert_eq!(status, StatusCode::OK, "{body}\n{}", cluster.logs());
    let covered = body["snapshot_index"].as_u64().expect("an index");
    // openraft drops the log behind the snapshot only while no replication reads it, and a
    // stopped follower's retries may: write until the leader no longer holds an entry the
    // stopped member lacks, so that it must catch up from the snapshot.
    let fillers = purge_past(&cluster, leader, lacks_from).await;
    cluster.resume(behind);
    let after = keys("after", 3);
    register(&cluster, leader, &after, 600).await;
    let all: Vec<String> = [&before[..], &missed[..], &fillers[..], &after[..]].concat();
    cluster.wait_for_keys(behind, &all).await;

    let frames = frames_until(&reader, &cluster, |f| {
        f.iter().any(|frame| frame.data["key"] == after[2].as_str())
    })
    .await;
    assert_eq!(reader.ended(), None, "the stream goes on after the reset");
    let (events, _) = seen(&frames);
    let resets: Vec<usize> = (events.iter().enumerate())
        .filter(|(_, (event, _))| event == "reset")
        .map(|(at, _)| at)
        .collect();
    let registered = |names: &[String]| -> Vec<(String, String)> {
        names
            .iter()
            .map(|key| ("registered".to_owned(), key.clone()))
            .collect()
    };
    assert_eq!(
        resets.len(),
        1,
        "one reset for one snapshot installed (covering entry {covered}): {events:?}"
    );
    let reset = resets[0];
    assert_eq!(
        events[..before.len()],
        registered(&before)[..],
        "{events:?}"
    );
    assert!(
        (events[before.len()..reset].iter()).all(|(_, key)| key.starts_with("missed-")),
        "before the reset, only events of entries applied before the snapshot: {events:?}"
    );
    assert_eq!(
        events[reset + 1..],
        registered(&[&fillers[..], &after[..]].concat())[..],
        "after the reset, the events after the snapshot"
    );
    let reason = frames[reset].data["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("snapshot"), "{:?}", frames[reset]);
}
