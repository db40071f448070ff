//! A slow peer link (issue 28's faults): openraft 0.9 gives an AppendEntries its heartbeat
//! interval (150 ms) and then sends the same payload again, forever, so an entry that a link
//! cannot carry in that time would stall replication for good. The proposer keeps entries
//! small (`cluster::types::MAX_ENTRY_BYTES`, `group_commit`): this checks it on a throttled
//! link with the API's largest batch.

use std::time::Instant;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use ttlwheel_faultproxy::Fault;

use super::harness::Cluster;

/// The leader's links carry this many bytes a second: a 1 MiB batch in one entry (~1.3 MB of
/// base64 JSON) would take ~430 ms, three times openraft's AppendEntries timeout.
const LINK_BYTES_PER_S: u64 = 3_000_000;

/// One batch body of `n` heartbeats with ~900 bytes of metadata each (about 0.93 MB, under
/// the API's 1 MiB batch limit).
fn fat_batch(keys: &[String]) -> Value {
    let pad = "m".repeat(880);
    let items: Vec<Value> = (keys.iter())
        .map(|key| json!({ "key": key, "ttl_s": 600, "meta": { "pad": pad } }))
        .collect();
    json!({ "heartbeats": items })
}

/// Must not be lost: every item of the API's largest batch, acknowledged through the leader
/// while its links to both followers carry 3 MB/s, on every member; and the cluster keeps
/// committing: a write sent after it is acknowledged too. Before entries were capped by
/// bytes, the batch was one entry that could never cross the link: the batch and every write
/// after it were answered 503 once their proposals timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_batch_crosses_a_slow_peer_link_and_writes_after_it_commit() {
    let cluster = Cluster::start("slow-link", 3, &[]).await;
    let leader = cluster.leader().await;
    for (&(from, _), link) in &cluster.links {
        if from == leader {
            link.set(Fault::throttle(LINK_BYTES_PER_S).expect("a rate"));
        }
    }
    let keys: Vec<String> = (0..1000).map(|i| format!("fat-{i:04}")).collect();
    let body = fat_batch(&keys);
    let bytes = serde_json::to_vec(&body).unwrap().len();
    assert!((900_000..1_048_576).contains(&bytes), "{bytes} bytes");
    let sent = Instant::now();
    let answer = (cluster.call(leader, Method::POST, "/v1/heartbeats/batch", Some(body))).await;
    let took = sent.elapsed();
    let Some((status, body, _)) = answer else {
        panic!("no answer to the batch\n{}", cluster.logs());
    };
    assert_eq!(
        status,
        StatusCode::OK,
        "after {took:?}: {body}\n{}",
        cluster.logs()
    );
    let results = body["results"].as_array().expect("results");
    let created = (results.iter())
        .filter(|item| item["created"] == true)
        .count();
    assert_eq!(created, keys.len(), "{body}");

    let after = "after-the-batch".to_owned();
    let single = json!({ "key": after, "ttl_s": 600 });
    let (status, body, _) = (cluster.call(leader, Method::POST, "/v1/heartbeats", Some(single)))
        .await
        .expect("an answer");
    assert_eq!(status, StatusCode::OK, "{body}\n{}", cluster.logs());

    let all: Vec<String> = keys.iter().cloned().chain([after]).collect();
    for id in cluster.running() {
        cluster.wait_for_keys(id, &all).await;
    }
    cluster.heal();
    eprintln!("slow link: the 1,000-item batch ({bytes} bytes) was acknowledged in {took:?}");
}
