//! Cluster scenarios against real members (issue 28, section 5), each stating what must not be
//! lost: election, writes through the log from any member, a leader's `kill -9` and its
//! rejoining, and an isolated leader (fenced: it renews and expires nothing). The failover
//! rules under load are in `failover.rs`.

use reqwest::{Method, StatusCode};
use serde_json::json;

use super::harness::Cluster;

fn heartbeat(key: &str) -> serde_json::Value {
    json!({ "key": key, "ttl_s": 600, "service": "checkout" })
}

/// Registers `keys` through member `via`, each acknowledged; panics otherwise.
async fn register(cluster: &Cluster, via: u64, keys: &[String]) {
    for key in keys {
        let answer = cluster
            .call(via, Method::POST, "/v1/heartbeats", Some(heartbeat(key)))
            .await;
        let Some((status, body, _)) = answer else {
            panic!("no answer for {key} from member {via}\n{}", cluster.logs());
        };
        assert_eq!(status, StatusCode::OK, "{key}: {body}\n{}", cluster.logs());
        assert_eq!(body["created"], true, "{key}: {body}");
    }
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:03}")).collect()
}

/// Member `id`'s `/metrics` text.
async fn metrics_text(cluster: &Cluster, id: u64) -> String {
    reqwest::get(format!("{}/metrics", cluster.base(id)))
        .await
        .expect("a /metrics answer")
        .text()
        .await
        .expect("its text")
}

/// The value of an unlabelled sample `name` in an OpenMetrics `text`.
fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// Polls member `id`'s metric `name` (for up to 10 s) until `holds`; returns its last value.
async fn leader_metric_eventually(
    cluster: &Cluster,
    id: u64,
    name: &str,
    holds: impl Fn(f64) -> bool,
) -> f64 {
    let mut value = f64::NAN;
    for _ in 0..100 {
        value = metric_value(&metrics_text(cluster, id).await, name).unwrap_or(f64::NAN);
        if holds(value) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    value
}

/// Must not be lost: a write acknowledged through a follower, on every member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_elect_one_leader_and_a_write_through_a_follower_reaches_every_member() {
    let cluster = Cluster::start("elect", 3, &[]).await;
    let leader = cluster.leader().await;
    let follower = cluster
        .running()
        .into_iter()
        .find(|&id| id != leader)
        .unwrap();
    let (status, body, served_by) = cluster
        .call(
            follower,
            Method::POST,
            "/v1/heartbeats",
            Some(heartbeat("a")),
        )
        .await
        .expect("an answer");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["created"], true);
    assert_eq!(
        served_by,
        Some(cluster.base(leader)),
        "names the leader's API"
    );
    for id in cluster.running() {
        cluster.wait_for_keys(id, &["a".to_owned()]).await;
    }
    // A renewal through another member is not a creation; a default read is the leader's.
    let other = cluster
        .running()
        .into_iter()
        .find(|&id| id != leader && id != follower)
        .unwrap();
    let (status, body, _) = cluster
        .call(other, Method::POST, "/v1/heartbeats", Some(heartbeat("a")))
        .await
        .expect("an answer");
    assert_eq!(
        (status, body["created"].clone()),
        (StatusCode::OK, json!(false))
    );
    // The renewal stayed in the leader's memory; its checkpoint commits and is counted.
    let metric = leader_metric_eventually(
        &cluster,
        leader,
        "ttlwheel_cluster_checkpoints_total",
        |v| v >= 1.0,
    )
    .await;
    assert!(metric >= 1.0);
    let text = metrics_text(&cluster, leader).await;
    assert_eq!(
        metric_value(&text, "ttlwheel_cluster_role"),
        Some(3.0),
        "{text}"
    );
    assert!(metric_value(&text, "ttlwheel_cluster_term").is_some_and(|term| term >= 1.0));
    assert_eq!(
        metric_value(&text, "ttlwheel_cluster_leader_id"),
        Some(leader as f64)
    );
    assert!(
        metric_value(&text, "ttlwheel_cluster_leader_changes_total").is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert!(
        text.contains("ttlwheel_cluster_replication_lag_entries{member="),
        "{text}"
    );
    // A stale read on a follower says how stale it may be.
    let answer = reqwest::get(format!(
        "{}/v1/keys/a?consistency=stale",
        cluster.base(follower)
    ))
    .await
    .expect("a stale read");
    let header = |name: &str| {
        answer
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok()?.parse::<u64>().ok())
    };
    assert!(header("x-ttlwheel-applied-index").is_some_and(|index| index >= 2));
    let contact = header("x-ttlwheel-last-contact");
    assert!(
        contact.is_some_and(|ms| ms < 10_000),
        "a follower in touch with its leader: {contact:?}"
    );
    let text = metrics_text(&cluster, follower).await;
    assert_eq!(
        metric_value(&text, "ttlwheel_cluster_role"),
        Some(1.0),
        "{text}"
    );
    assert!(
        !text.contains("ttlwheel_cluster_replication_lag_entries{"),
        "{text}"
    );
    let (status, body, _) = cluster
        .call(other, Method::GET, "/v1/keys/a", None)
        .await
        .expect("an answer");
    assert_eq!(
        (status, body["service"].clone()),
        (StatusCode::OK, json!("checkout"))
    );
    // A delete through a follower leaves every member without the key.
    let (status, _, _) = cluster
        .call(follower, Method::DELETE, "/v1/keys/a", None)
        .await
        .expect("an answer");
    assert_eq!(status, StatusCode::NO_CONTENT);
    for id in cluster.running() {
        cluster.wait_for_keys(id, &[]).await;
    }
    let status = cluster.status(leader).await.expect("a status");
    let members = status["members"].as_array().expect("members");
    assert_eq!(members.len(), 3);
    assert!(members.iter().all(|member| member["voter"] == true));
    // The initializer asked the other founders for their API addresses before it founded the
    // cluster, so every member's is known from the first election (for `leader_api` and the
    // leader named in forwarded answers), not filled in by a membership change a second later.
    let founded = cluster.log_of(1);
    let founded = (founded.iter())
        .find(|line| line.contains("founding the cluster"))
        .expect("member 1, the smallest id, founded the cluster");
    assert_eq!(founded.matches("api_addr: \"http").count(), 3, "{founded}");
}

/// Must not be lost: any key acknowledged before the leader's `kill -9` or after the new
/// election, on every member, the killed one included once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_and_rejoins_with_every_acknowledged_key() {
    let mut cluster = Cluster::start("kill", 3, &[]).await;
    let old = cluster.leader().await;
    let before = keys("before", 30);
    let via = cluster.running().into_iter().find(|&id| id != old).unwrap();
    register(&cluster, via, &before).await;
    cluster.kill(old);
    let new = cluster.leader().await;
    assert_ne!(new, old);
    let after = keys("after", 30);
    register(&cluster, via, &after).await;
    cluster.restart(old);
    let all: Vec<String> = before.iter().chain(&after).cloned().collect();
    for id in cluster.running() {
        cluster.wait_for_keys(id, &all).await;
    }
    let leader = cluster.leader().await;
    assert!(cluster.running().contains(&leader));
}

/// Must not happen: an isolated leader acknowledging a write it cannot commit. Must not be
/// lost: what the majority acknowledged meanwhile, on every member once healed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_acknowledges_no_write_and_the_majority_carries_on() {
    let cluster = Cluster::start("isolate", 3, &[]).await;
    let old = cluster.leader().await;
    register(&cluster, old, &keys("first", 5)).await;
    // A key whose client stops: only a leader with a quorum may expire it.
    let short = json!({ "key": "short", "ttl_s": 2 });
    let (status, body, _) = cluster
        .call(old, Method::POST, "/v1/heartbeats", Some(short))
        .await
        .expect("an answer");
    assert_eq!(status, StatusCode::OK, "{body}");
    cluster.isolate(old);
    let majority: Vec<u64> = cluster
        .running()
        .into_iter()
        .filter(|&id| id != old)
        .collect();
    let new = cluster.leader_among(&majority).await;
    assert_ne!(new, old);
    // The isolated member cannot commit: it answers 503 (no_quorum or no_leader), never 2xx.
    let (status, body, _) = cluster
        .call(old, Method::POST, "/v1/heartbeats", Some(heartbeat("lost")))
        .await
        .expect("an answer within the proposal timeout");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        ["no_quorum", "no_leader"].contains(&body["error"]["code"].as_str().unwrap_or("")),
        "{body}"
    );
    // Nor a renewal, which a leader applies in memory: past its lease it must not acknowledge.
    let (status, body, _) = cluster
        .call(
            old,
            Method::POST,
            "/v1/heartbeats",
            Some(heartbeat("first-000")),
        )
        .await
        .expect("an answer");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    register(&cluster, majority[0], &keys("second", 5)).await;
    // The majority expires the stopped key; the isolated member, which cannot commit, keeps it.
    let mut majority_keys = keys("first", 5);
    majority_keys.extend(keys("second", 5));
    for &id in &majority {
        cluster.wait_for_keys(id, &majority_keys).await;
    }
    let mut isolated_keys = keys("first", 5);
    isolated_keys.push("short".into());
    isolated_keys.sort();
    assert_eq!(
        cluster.stale_keys(old).await,
        Some(isolated_keys),
        "the isolated member changes nothing by itself"
    );
    cluster.heal();
    let mut all = keys("first", 5);
    all.extend(keys("second", 5));
    for id in cluster.running() {
        cluster.wait_for_keys(id, &all).await;
    }
    assert_eq!(
        cluster.leader().await,
        new,
        "the healed member does not depose the new leader"
    );
}
