//! The upgrade path against real processes (issue 28, section 1): a single node's data
//! directory becomes a cluster's first member. What must not be lost: every key the single
//! node held (its service and TTL), on every member, and exactly once: a restart of the
//! founder after the import does not import it again, and nothing of it reaches a webhook or
//! stream as a new registration.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::harness::Cluster;
use crate::process::{temp_data_dir, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_nodes_keys_become_the_clusters_when_its_directory_founds_one() {
    // A single node with keys of two services and two TTLs, stopped cleanly.
    let dir = temp_data_dir("upgrade-single");
    let single = Server::start(&dir, &[]);
    single.ready().await;
    let keys: Vec<String> = (0..300)
        .map(|i| format!("svc-{}/i-{i:04}", i % 2))
        .collect();
    for chunk in keys.chunks(100) {
        let heartbeats: Vec<Value> = chunk
            .iter()
            .enumerate()
            .map(|(i, key)| json!({ "key": key, "ttl_s": 600 + i, "service": &key[..5] }))
            .collect();
        let (status, body) = single
            .call(
                Method::POST,
                "/v1/heartbeats/batch",
                Some(json!({ "heartbeats": heartbeats })),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    single.signal("-TERM");
    assert_eq!(single.wait(), Some(0));

    // Member 1 (the founder) starts on it; members 2 and 3 on empty directories.
    let mut cluster = Cluster::start_seeded("upgrade", 3, &[], Some((1, dir))).await;
    let mut want = keys.clone();
    want.sort();
    for id in cluster.running() {
        cluster.wait_for_keys(id, &want).await;
    }
    // A key keeps its service and TTL, read on a follower.
    let leader = cluster.leader().await;
    let follower = cluster.running_other_than(&[leader]);
    let (status, body, _) = cluster
        .call(
            follower,
            Method::GET,
            "/v1/keys/svc-1%2Fi-0001?consistency=stale",
            None,
        )
        .await
        .expect("an answer");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["service"], "svc-1");
    assert_eq!(body["ttl_ms"], 601_000, "{body}");

    // The import finished: the single node's files moved aside, the marker gone.
    let member_dir = cluster.data_dir(1);
    let moved = member_dir.join("single-node-imported");
    let wait_for_move = std::time::Instant::now();
    while member_dir.join("raft").join("IMPORTING").exists() || !moved.exists() {
        assert!(
            wait_for_move.elapsed() < super::harness::WAIT,
            "the import never finished\n{}",
            cluster.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(std::fs::read_dir(&moved).unwrap().count() >= 1);

    // A restart of the founder imports nothing again; writes go on; every key is still there.
    cluster.kill(1);
    cluster.restart(1);
    cluster.leader().await; // the founder may have led: an election, then a ready leader
    let (status, body, _) = cluster
        .call(
            2,
            Method::POST,
            "/v1/heartbeats",
            Some(json!({ "key": "after", "ttl_s": 600 })),
        )
        .await
        .expect("an answer");
    assert_eq!(status, StatusCode::OK, "{body}");
    want.push("after".to_owned());
    want.sort();
    for id in cluster.running() {
        cluster.wait_for_keys(id, &want).await;
    }
    let log = cluster.log_of(1).join("\n");
    assert!(
        !log.contains("founding a cluster with them") && log.contains("cluster member started"),
        "the restarted founder imports nothing again:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_is_not_the_founder_refuses_a_single_nodes_directory() {
    let dir = temp_data_dir("upgrade-refuse");
    let single = Server::start(&dir, &[]);
    single.ready().await;
    let (status, _) = single
        .call(
            Method::POST,
            "/v1/heartbeats",
            Some(json!({ "key": "k", "ttl_s": 60 })),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    single.signal("-TERM");
    assert_eq!(single.wait(), Some(0));
    let member = std::process::Command::new(env!("CARGO_BIN_EXE_ttlwheel"))
        .args(["--listen", "127.0.0.1:0", "--node-id", "2"])
        .args(["--cluster-listen", "127.0.0.1:0"])
        .args(["--initial-cluster", "1=127.0.0.1:1,2=127.0.0.1:2"])
        .arg("--data-dir")
        .arg(&dir)
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&member.stderr);
    assert!(!member.status.success(), "{stderr}");
    assert!(stderr.contains("only the founding member"), "{stderr}");
    // Nothing was changed: the single node still starts on it with its key.
    let again = Server::start(&dir, &[]);
    again.ready().await;
    let (status, _) = again.call(Method::GET, "/v1/keys/k", None).await;
    assert_eq!(status, StatusCode::OK);
    let _ = std::fs::remove_dir_all(&dir);
}
