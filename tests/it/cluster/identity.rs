//! Two clusters whose peer addresses cross: each member belongs to one cluster only.

use reqwest::{Method, StatusCode};
use serde_json::json;

use super::harness::Cluster;

/// Registers `key` through member `via` of `cluster`; panics unless it is acknowledged.
async fn register(cluster: &Cluster, via: u64, key: &str) {
    let heartbeat = json!({ "key": key, "ttl_s": 600 });
    let answer = cluster
        .call(via, Method::POST, "/v1/heartbeats", Some(heartbeat))
        .await;
    let Some((status, body, _)) = answer else {
        panic!("no answer for {key} from member {via}\n{}", cluster.logs());
    };
    assert_eq!(status, StatusCode::OK, "{key}: {body}\n{}", cluster.logs());
}

/// The value of counter `name` in member `id`'s `/metrics`.
async fn counter(cluster: &Cluster, id: u64, name: &str) -> Option<f64> {
    let text = reqwest::get(format!("{}/metrics", cluster.base(id)))
        .await
        .expect("a /metrics answer")
        .text()
        .await
        .expect("its text");
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// Cluster `b`'s members route their member 2 to cluster `a`'s member 2 (a peer address that
/// names a member of another cluster: a reused port or host, an old peer list). Both clusters
/// elect "term 1, node 1" and start their logs alike, so before clusters had ids, `a`'s member
/// 2 took `b`'s leader's entries as its own leader's: measured, a key written to `b` was listed
/// on it. Must not happen: `b`'s key on any member of `a`, or `a`'s member 2 missing `a`'s own
/// key. `b`'s leader must be refused (409 `cluster_mismatch`) and say so in its log, and `a`'s
/// member must count the refusals in `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_reached_by_another_clusters_leader_refuses_it_and_keeps_its_own_log() {
    let a = Cluster::start("identity-a", 3, &[]).await;
    let a_leader = a.leader().await;
    let crossed = a.running_other_than(&[a_leader]);
    let route = format!("{crossed}={}", a.peer_addr(crossed));
    let b = Cluster::start_each("identity-b", 3, |id| {
        if id == crossed {
            Vec::new()
        } else {
            vec!["--peer-route".to_owned(), route.clone()]
        }
    })
    .await;
    // b's own member `crossed` hears from nobody (its peers dial a's): it stays pristine.
    let reachable: Vec<u64> = b
        .running()
        .into_iter()
        .filter(|&id| id != crossed)
        .collect();
    let b_leader = b.leader_among(&reachable).await;

    register(&b, b_leader, "written-to-b").await;
    register(&a, a_leader, "written-to-a").await;
    for member in a.running() {
        // The write was acknowledged by a quorum, not by every member: each applies it in its
        // own time. A member that took `b`'s key never lists exactly `a`'s, and fails here.
        a.wait_for_keys(member, &["written-to-a".to_owned()]).await;
        let keys = a.stale_keys(member).await.expect("a listing");
        assert_eq!(keys, ["written-to-a"], "cluster a's member {member}");
    }
    let refused = |line: &String| line.contains("cluster_mismatch");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !b.log_of(b_leader).iter().any(refused) {
        assert!(
            std::time::Instant::now() < deadline,
            "b's leader was never refused by a's member {crossed}\n{}",
            b.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Counted before the refusal is answered, so the refusal logged above is in it.
    let counted = counter(&a, crossed, "ttlwheel_cluster_foreign_peer_requests_total").await;
    assert!(
        counted.is_some_and(|n| n >= 1.0),
        "a's member {crossed} counts the requests it refused: {counted:?}"
    );
}

/// Member 3 starts with another `--cluster-secret` than members 1 and 2. Must not happen: its
/// peers' requests accepted (it applying the cluster's keys), or the refusals uncounted. The
/// two that agree still form a quorum and take writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_another_secret_refuses_its_peers_and_counts_the_refusals() {
    let cluster = Cluster::start_each("identity-secret", 3, |id| {
        let secret = if id == 3 { "not-the-same" } else { "shared" };
        vec!["--cluster-secret".to_owned(), secret.to_owned()]
    })
    .await;
    let leader = cluster.leader_among(&[1, 2]).await;
    register(&cluster, leader, "signed").await;
    let follower = if leader == 1 { 2 } else { 1 };
    cluster
        .wait_for_keys(follower, &["signed".to_owned()])
        .await;
    let unauthorized = "ttlwheel_cluster_unauthorized_peer_requests_total";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let counted = counter(&cluster, 3, unauthorized).await;
        if counted.is_some_and(|n| n >= 1.0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "member 3 never counted a refused request: {counted:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        cluster.stale_keys(3).await,
        Some(Vec::new()),
        "member 3 applied nothing from peers whose signatures it refuses"
    );
}
