//! Membership against real members (issue 28, sections 1 and 5): a 4th member joins a running
//! cluster with `--join` (a learner that catches up, then a voter), every key acknowledged
//! before and while it joined reaches it, and a voter is removed with the cluster carrying on.
//! What must not be lost: any acknowledged key, on every member, the new one included; the
//! quorum, through both changes.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::harness::{Cluster, WAIT};

/// The `(id, voter)` pairs of a `GET /v1/cluster` answer, sorted.
pub(super) fn members(status: &Value) -> Vec<(u64, bool)> {
    let mut members: Vec<(u64, bool)> = status["members"]
        .as_array()
        .map(|members| {
            members
                .iter()
                .filter_map(|m| Some((m["id"].as_u64()?, m["voter"].as_bool()?)))
                .collect()
        })
        .unwrap_or_default();
    members.sort_unstable();
    members
}

/// Registers `keys` through member `via` in one batch; panics unless each is acknowledged.
pub(super) async fn register(cluster: &Cluster, via: u64, keys: &[String]) {
    let heartbeats: Vec<Value> = keys
        .iter()
        .map(|key| json!({ "key": key, "ttl_s": 600 }))
        .collect();
    let (status, body, _) = cluster
        .call(
            via,
            Method::POST,
            "/v1/heartbeats/batch",
            Some(json!({ "heartbeats": heartbeats })),
        )
        .await
        .expect("an answer");
    assert_eq!(status, StatusCode::OK, "{body}\n{}", cluster.logs());
    let results = body["results"].as_array().map_or(&[][..], Vec::as_slice);
    let failed = results
        .iter()
        .filter(|result| result.get("error").is_some());
    assert!(
        results.len() == keys.len() && failed.count() == 0,
        "not every heartbeat acknowledged: {body}"
    );
}

/// `n` keys named `{prefix}-0000`, `{prefix}-0001`...
pub(super) fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:04}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_joins_catches_up_becomes_a_voter_and_a_voter_is_removed() {
    let mut cluster = Cluster::start("members", 3, &[]).await;
    let leader = cluster.leader().await;
    let follower = cluster.running_other_than(&[leader]);
    let mut all = keys("before", 1000);
    // In 200 entries: a joining member catches up over several AppendEntries, not one.
    for entry in all.chunks(5) {
        register(&cluster, leader, entry).await;
    }

    // The 4th member joins through a follower (forwarded to the leader). It must not say it
    // is ready (`/readyz`) before it holds what was committed before it joined.
    cluster.join("members", 4, follower, &[]);
    let committed_before = all.clone();
    let first_ready = async {
        let started = std::time::Instant::now();
        while !cluster.ready(4).await {
            assert!(
                started.elapsed() < WAIT,
                "member 4 never ready\n{}",
                cluster.logs()
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        cluster.stale_keys(4).await.unwrap_or_default()
    };
    let during = keys("during", 500);
    let (held, ()) = tokio::join!(first_ready, register(&cluster, follower, &during));
    let missing = (committed_before.iter())
        .filter(|key| !held.contains(key))
        .count();
    assert_eq!(
        missing,
        0,
        "member 4 answered /readyz 200 holding {} keys, without {missing} committed before it joined",
        held.len()
    );
    all.extend(during);
    let status = cluster
        .wait_for_status(leader, "made member 4 a voter", |status| {
            // `voter` holds in the joint phase already: wait for the change to be finished.
            members(status).contains(&(4, true)) && status["membership"]["changing"] == false
        })
        .await;
    assert_eq!(
        members(&status),
        vec![(1, true), (2, true), (3, true), (4, true)],
        "{status}"
    );
    let api = status["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == 4)
        .unwrap()["api_addr"]
        .clone();
    assert_eq!(
        api,
        json!(cluster.base(4)),
        "member 4's API address as it gave it"
    );
    cluster.wait_for_keys(4, &all).await;
    // It takes writes like any member (forwarded), and sees the same leader.
    let after = keys("after", 10);
    register(&cluster, 4, &after).await;
    all.extend(after);
    assert_eq!(cluster.leader().await, leader);

    // Idempotent and refused cases, answered in the API's error format.
    let me = json!({ "id": 4, "peer_addr": status["members"].as_array().unwrap().iter()
        .find(|m| m["id"] == 4).unwrap()["peer_addr"], "api_addr": cluster.base(4) });
    let (code, body, _) = cluster
        .call(2, Method::POST, "/v1/cluster/members", Some(me))
        .await
        .unwrap();
    assert_eq!(
        code,
        StatusCode::OK,
        "adding a member again is a no-op: {body}"
    );
    let other = json!({ "id": 4, "peer_addr": "127.0.0.1:1", "api_addr": "http://127.0.0.1:1" });
    let (code, body, _) = cluster
        .call(1, Method::POST, "/v1/cluster/members", Some(other))
        .await
        .unwrap();
    assert_eq!(code, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "membership_conflict");
    let bad = json!({ "id": 9, "peer_addr": "nowhere", "api_addr": "http://127.0.0.1:1" });
    let (code, body, _) = cluster
        .call(1, Method::POST, "/v1/cluster/members", Some(bad))
        .await
        .unwrap();
    assert_eq!(code, StatusCode::BAD_REQUEST, "{body}");
    let (code, body, _) = cluster
        .call(3, Method::POST, "/v1/cluster/members/9/promote", None)
        .await
        .unwrap();
    assert_eq!(
        (code, body["error"]["code"].clone()),
        (StatusCode::NOT_FOUND, json!("no_such_member")),
        "{body}"
    );

    // Remove a voter that is not the leader, through another member; then stop it.
    let removed = cluster.running_other_than(&[leader, 4]);
    let via = cluster.running_other_than(&[removed]);
    let (code, body, _) = cluster
        .call(
            via,
            Method::DELETE,
            &format!("/v1/cluster/members/{removed}"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(code, StatusCode::OK, "{body}\n{}", cluster.logs());
    let status = cluster
        .wait_for_status(leader, "dropped the removed member", |status| {
            members(status).len() == 3
        })
        .await;
    assert!(
        members(&status)
            .iter()
            .all(|&(id, voter)| id != removed && voter),
        "{status}"
    );
    cluster.forget(removed);
    // Three voters left: writes still commit, and every member holds every key.
    let last = keys("last", 10);
    register(&cluster, 4, &last).await;
    all.extend(last);
    for id in cluster.running() {
        cluster.wait_for_keys(id, &all).await;
    }
    let (code, body, _) = cluster
        .call(
            leader,
            Method::DELETE,
            &format!("/v1/cluster/members/{removed}"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        (code, body["error"]["code"].clone()),
        (StatusCode::NOT_FOUND, json!("no_such_member")),
        "{body}"
    );
}
