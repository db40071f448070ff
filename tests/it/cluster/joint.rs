//! Membership changes interrupted in their joint phase, against real members (issue 28's
//! "a membership change interrupted in its joint phase"). openraft changes the voters in two
//! entries: a joint configuration (the old and the new set, a quorum needing a majority of
//! each), then the new set alone. Here the first entry is appended but cannot commit (members
//! of the new set are stopped with SIGSTOP), the API call gives up (503 `no_quorum`, never a
//! hang), and then either the leader dies (a new leader inherits the joint configuration) or
//! the stopped members come back (the same leader must still take the second step).
//!
//! What must not be lost: every acknowledged key, on every running member; the change asked
//! for (the cluster ends in the uniform configuration it was asked to reach, never stuck
//! joint); and the truth of `GET /v1/cluster` meanwhile (`membership.voters` shows both sets
//! and `changing` while joint or uncommitted).

use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::harness::{Cluster, WAIT};
use super::membership::{assert_acknowledged, batch_of, keys, members, register};

/// `membership.voters` of a `GET /v1/cluster` answer, each set sorted.
fn voter_sets(status: &Value) -> Vec<Vec<u64>> {
    (status["membership"]["voters"]
        .as_array()
        .into_iter()
        .flatten())
    .map(|set| {
        let mut ids: Vec<u64> = (set.as_array().into_iter().flatten())
            .filter_map(Value::as_u64)
            .collect();
        ids.sort_unstable();
        ids
    })
    .collect()
}

/// Whether the status shows the uniform configuration `voters`, committed, no change pending.
fn settled_on(status: &Value, voters: &[u64]) -> bool {
    voter_sets(status) == [voters.to_vec()]
        && status["membership"]["committed"] == true
        && status["membership"]["changing"] == false
}

/// Waits until member `id` holds `voters` as its settled, uniform membership ("`what`"), and
/// checks they are its only members, each a voter.
async fn settled(cluster: &Cluster, id: u64, what: &str, voters: &[u64]) {
    let status = cluster
        .wait_for_status(id, what, |status| settled_on(status, voters))
        .await;
    assert_eq!(
        members(&status),
        voters.iter().map(|&id| (id, true)).collect::<Vec<_>>(),
        "{status}"
    );
}

/// The answer to a membership call through member `via`; fails the test if none came (the
/// harness's client gives up after 15 s: the member hung).
async fn membership_call(
    cluster: &Cluster,
    via: u64,
    method: Method,
    path: &str,
) -> (StatusCode, Value) {
    let (code, body, _) =
        (cluster.call(via, method.clone(), path, None).await).unwrap_or_else(|| {
            panic!(
                "{method} {path} on member {via}: no answer\n{}",
                cluster.logs()
            )
        });
    (code, body)
}

/// Whether an answer is the cluster's "retry": 503 `no_quorum` or `no_leader`.
fn says_retry(code: StatusCode, body: &Value) -> bool {
    code == StatusCode::SERVICE_UNAVAILABLE
        && matches!(
            body["error"]["code"].as_str(),
            Some("no_quorum" | "no_leader")
        )
}

/// [`membership_call`], asked again while the answer says retry, at most [`WAIT`]: what an
/// operator does once the cluster should serve. With a dead voter among four, every commit
/// and the leader's lease need all three others, and one of them slow on a loaded machine
/// makes a passing 503.
async fn served_call(
    cluster: &Cluster,
    via: u64,
    method: Method,
    path: &str,
) -> (StatusCode, Value) {
    let started = std::time::Instant::now();
    loop {
        let (code, body) = membership_call(cluster, via, method.clone(), path).await;
        if !says_retry(code, &body) || started.elapsed() > WAIT {
            return (code, body);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Registers `keys` through member `via` in one batch, asked again while the answer says
/// retry (as [`served_call`]); panics unless each is then acknowledged.
async fn register_served(cluster: &Cluster, via: u64, keys: &[String]) {
    let started = std::time::Instant::now();
    loop {
        let (code, body, _) = (cluster
            .call(
                via,
                Method::POST,
                "/v1/heartbeats/batch",
                Some(batch_of(keys)),
            )
            .await)
            .unwrap_or_else(|| panic!("no answer from member {via}\n{}", cluster.logs()));
        let refused = (body["results"].as_array().into_iter().flatten())
            .any(|result| result["error"]["code"] == "no_quorum");
        if !(says_retry(code, &body) || refused) || started.elapsed() > WAIT {
            assert_eq!(code, StatusCode::OK, "{body}\n{}", cluster.logs());
            return assert_acknowledged(&body, keys.len());
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// A retry while the joint entry is uncommitted is told to retry later, not that it is done:
/// 503 `no_quorum` (the leader cannot confirm its lease, which needs a majority of each set)
/// or 409 `membership_changing` (openraft refuses a change before the last one commits).
fn assert_retry_later(code: StatusCode, body: &Value) {
    let answer = (code, body["error"]["code"].as_str().unwrap_or_default());
    assert!(
        matches!(
            answer,
            (StatusCode::SERVICE_UNAVAILABLE, "no_quorum")
                | (StatusCode::CONFLICT, "membership_changing")
        ),
        "a retry while the joint entry is uncommitted: {code} {body}"
    );
}

/// 3 voters and learner 4. With one follower and 4 stopped, promoting 4 appends the joint
/// configuration ({1,2,3} and {1,2,3,4}), which the leader and the other follower hold but
/// cannot commit (the new set needs 3 of 4): the call answers 503 `no_quorum`, and so does a
/// retry (or 409 `membership_changing`). The leader is killed, the stopped members resumed:
/// the new leader holds the joint entry (no one wins without the vote of the follower that
/// has it), commits the joint configuration in its term and finishes the change by itself;
/// the operator's retry of the promotion answers 200 with the uniform configuration. The dead
/// leader is then removed and writes commit with the three voters left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_cut_off_in_its_joint_phase_by_a_failover_is_finished_and_loses_nothing() {
    let mut cluster = Cluster::start("joint-promote", 3, &[]).await;
    let old_leader = cluster.leader().await;
    let mut acknowledged = keys("before", 200);
    register(&cluster, old_leader, &acknowledged).await;
    cluster.join("joint-promote", 4, old_leader, &["--learner"]);
    cluster.wait_for_keys(4, &acknowledged).await;
    cluster
        .wait_for_status(old_leader, "replicated to learner 4", |status| {
            members(status).contains(&(4, false))
                && (status["members"].as_array().into_iter().flatten())
                    .any(|m| m["id"] == 4 && m["matched_index"].is_u64())
        })
        .await;

    let holder = cluster.running_other_than(&[old_leader, 4]);
    let stopped = cluster.running_other_than(&[old_leader, holder, 4]);
    cluster.pause(stopped).await;
    cluster.pause(4).await;
    // The old configuration's quorum (the leader and `holder`) still commits.
    let while_stopped = keys("while-stopped", 50);
    register_served(&cluster, old_leader, &while_stopped).await;
    acknowledged.extend(while_stopped);

    let promote = "/v1/cluster/members/4/promote";
    let (code, body) = membership_call(&cluster, old_leader, Method::POST, promote).await;
    assert_eq!(
        (code, body["error"]["code"].clone()),
        (StatusCode::SERVICE_UNAVAILABLE, "no_quorum".into()),
        "the joint configuration cannot commit: {body}"
    );
    let joint = vec![vec![1, 2, 3], vec![1, 2, 3, 4]];
    for id in [old_leader, holder] {
        let status = cluster
            .wait_for_status(id, "held the joint configuration", |status| {
                voter_sets(status) == joint
            })
            .await;
        assert_eq!(
            (
                status["membership"]["committed"].clone(),
                status["membership"]["changing"].clone()
            ),
            (false.into(), true.into()),
            "member {id}: the joint configuration is neither committed nor finished: {status}"
        );
    }
    let (code, body) = membership_call(&cluster, holder, Method::POST, promote).await;
    assert_retry_later(code, &body);

    cluster.kill(old_leader);
    cluster.resume(stopped);
    cluster.resume(4);
    // Whoever wins holds the joint entry: `holder` votes only for a log as long as its own
    // (and the resumed members may still read the dead leader's requests from their sockets).
    let new_leader = cluster.leader().await;
    // By itself: nobody asks for anything until the change is finished.
    let status = cluster
        .wait_for_status(new_leader, "finished the inherited change", |status| {
            settled_on(status, &[1, 2, 3, 4])
        })
        .await;
    assert!(members(&status).contains(&(4, true)), "{status}");
    // The operator's retry of the same call finishes it (here: finds it finished).
    let (code, body) = served_call(&cluster, stopped, Method::POST, promote).await;
    assert_eq!(code, StatusCode::OK, "{body}\n{}", cluster.logs());
    assert!(settled_on(&body, &[1, 2, 3, 4]), "{body}");
    for id in cluster.running() {
        cluster
            .wait_for_status(id, "learnt the uniform configuration", |status| {
                settled_on(status, &[1, 2, 3, 4])
            })
            .await;
    }
    let after = keys("after-failover", 50);
    register_served(&cluster, 4, &after).await;
    acknowledged.extend(after);
    for id in cluster.running() {
        cluster.wait_for_keys(id, &acknowledged).await;
    }

    // The dead leader is removed: the three voters left commit alone.
    let remove = format!("/v1/cluster/members/{old_leader}");
    let (code, body) = served_call(&cluster, 4, Method::DELETE, &remove).await;
    assert_eq!(code, StatusCode::OK, "{body}\n{}", cluster.logs());
    let remaining: Vec<u64> = [1, 2, 3, 4]
        .into_iter()
        .filter(|&id| id != old_leader)
        .collect();
    assert!(settled_on(&body, &remaining), "{body}");
    cluster.forget(old_leader);
    let last = keys("after-removal", 50);
    register_served(&cluster, stopped, &last).await;
    acknowledged.extend(last);
    for id in cluster.running() {
        settled(&cluster, id, "learnt the removal", &remaining).await;
        cluster.wait_for_keys(id, &acknowledged).await;
    }
}

/// 3 voters. With one follower stopped, removing the other appends the joint configuration
/// (the three and the leader with the stopped one), which cannot commit: the call answers 503
/// `no_quorum`, and gives up waiting, but not the change. The stopped follower is resumed:
/// the joint configuration commits and the same leader takes the second step, to the two
/// voters asked for (a call dropped between openraft's two steps would leave it joint).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_whose_call_gave_up_in_its_joint_phase_is_finished_when_the_quorum_is_back() {
    let mut cluster = Cluster::start("joint-remove", 3, &[]).await;
    let leader = cluster.leader().await;
    let stopped = cluster.running_other_than(&[leader]);
    let removed = cluster.running_other_than(&[leader, stopped]);
    let mut acknowledged = keys("before", 100);
    register(&cluster, leader, &acknowledged).await;

    cluster.pause(stopped).await;
    let remove = format!("/v1/cluster/members/{removed}");
    let (code, body) = membership_call(&cluster, leader, Method::DELETE, &remove).await;
    assert_eq!(
        (code, body["error"]["code"].clone()),
        (StatusCode::SERVICE_UNAVAILABLE, "no_quorum".into()),
        "the new set needs the stopped member: {body}"
    );
    let mut remaining = vec![leader, stopped];
    remaining.sort_unstable();
    let status = cluster
        .wait_for_status(leader, "held the joint configuration", |status| {
            voter_sets(status) == [vec![1, 2, 3], remaining.clone()]
        })
        .await;
    assert_eq!(status["membership"]["changing"], true, "{status}");
    let (code, body) = membership_call(&cluster, removed, Method::DELETE, &remove).await;
    assert_retry_later(code, &body);

    cluster.resume(stopped);
    // The removed member left the membership.
    settled(&cluster, leader, "finished the removal", &remaining).await;
    // A retry once done: the member is gone.
    let (code, body) = served_call(&cluster, leader, Method::DELETE, &remove).await;
    assert_eq!(
        (code, body["error"]["code"].clone()),
        (StatusCode::NOT_FOUND, "no_such_member".into()),
        "{body}"
    );
    cluster.forget(removed);
    let after = keys("after", 50);
    register_served(&cluster, stopped, &after).await;
    acknowledged.extend(after);
    for id in cluster.running() {
        cluster
            .wait_for_status(id, "learnt the removal", |status| {
                settled_on(status, &remaining)
            })
            .await;
        cluster.wait_for_keys(id, &acknowledged).await;
    }
}
