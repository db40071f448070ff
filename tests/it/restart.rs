//! The restart rule and what is logged, at the registry's door, with time driven by hand: a
//! registry is filled, its records are read back into a new one "after a restart", and each
//! key's deadline, listing and events are checked.

use ttlwheel::events::EventKind;
use ttlwheel::persist::journal::FsyncMode;
use ttlwheel::persist::record::{Expiry, KeyState, Record};
use ttlwheel::persist::store::DataDir;
use ttlwheel::registry::ExpireAt;
use ttlwheel::types::{Key, Meta, ServiceName};

use crate::{key_of, Harness, UNIX_AT_EPOCH};

fn state(key: &str, expiry: Expiry) -> Record {
    Record::Upsert(KeyState {
        key: key_of(key),
        service: Some(ServiceName::new("api").unwrap()),
        meta: Some(Meta::from_value(&serde_json::json!({"zone": "a"})).unwrap()),
        expiry,
        registered_unix_ms: UNIX_AT_EPOCH - 60_000,
        last_heartbeat_unix_ms: UNIX_AT_EPOCH - 1_000,
    })
}

#[test]
fn a_relative_deadline_restarts_from_the_restart_and_an_absolute_one_is_kept() {
    let mut harness = Harness::new(60);
    harness.stall(10_000);
    let restart = harness.now();
    let at = |ms: u64| Expiry::Absolute {
        at_unix_ms: UNIX_AT_EPOCH + ms,
    };
    for record in [
        state("relative", Expiry::Relative { ttl_ms: 5_000 }),
        state("absolute", at(12_500)),
        state("passed", at(4_000)),
        state("persistent", Expiry::Never),
    ] {
        harness.registry.restore(record, restart);
    }
    harness.registry.check_invariants();
    assert!(harness.drain_all().is_empty(), "recovery publishes nothing");
    // The absolute instant that passed during the downtime expires at start-up.
    harness.advance(0);
    let expired = harness.drain();
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].key.as_str(), "passed");
    assert!(expired[0].restored);
    assert_eq!(
        expired[0].lateness_ms, 6_000,
        "late by the downtime, honestly"
    );
    harness.advance(2_499);
    assert!(harness.drain().is_empty());
    harness.advance(1);
    assert_eq!(harness.drained_keys(EventKind::Expired), ["absolute"]);
    // Never earlier than a client that kept heartbeating could have renewed it: restart + TTL.
    harness.advance(2_499);
    assert!(harness.drain().is_empty());
    harness.advance(1);
    let expired = harness.drain();
    assert_eq!(expired[0].key.as_str(), "relative");
    assert!(expired[0].restored);
    assert_eq!(expired[0].service.as_ref().unwrap().as_str(), "api");
    assert!(harness.alive("persistent"));
    harness.registry.check_invariants();
}

#[test]
fn a_heartbeat_after_the_restart_makes_the_key_an_ordinary_one() {
    let mut harness = Harness::new(60);
    let restart = harness.now();
    harness
        .registry
        .restore(state("k", Expiry::Relative { ttl_ms: 2_000 }), restart);
    harness.advance(1_000);
    harness.heartbeat("k", 2_000);
    harness.advance(3_000);
    let expired = harness.drain();
    assert_eq!(expired.len(), 1);
    assert!(!expired[0].restored, "renewed after the restart");
}

/// Replayed expiries move their keys from the entries to the expired list, with the metadata
/// they had: a short key with metadata, and a fleet name (27 bytes, kept inline) without.
#[test]
fn deletions_and_expiries_replay_and_the_expired_list_comes_back() {
    let harness = Harness::new(60);
    let restart = harness.now();
    let fleet_name = "svc-042/instance-0000000042";
    let without_meta = |key: &str| match state(key, Expiry::Relative { ttl_ms: 5_000 }) {
        Record::Upsert(state) => Record::Upsert(KeyState {
            meta: None,
            ..state
        }),
        _ => unreachable!("state() makes an upsert"),
    };
    let expired = |key: &str| Record::Expired {
        key: key_of(key),
        at_unix_ms: UNIX_AT_EPOCH - 200,
        last_heartbeat_unix_ms: UNIX_AT_EPOCH - 5_200,
    };
    for record in [
        state("deleted", Expiry::Relative { ttl_ms: 5_000 }),
        Record::Deleted {
            key: key_of("deleted"),
            at_unix_ms: UNIX_AT_EPOCH - 500,
        },
        state("expired", Expiry::Relative { ttl_ms: 5_000 }),
        expired("expired"),
        without_meta(fleet_name),
        expired(fleet_name),
    ] {
        harness.registry.restore(record, restart);
    }
    assert!(!harness.alive("deleted") && !harness.alive("expired") && !harness.alive(fleet_name));
    let (listed, _) = harness.registry.list_expired(&Default::default(), 10);
    let keys: Vec<&str> = listed.iter().map(|view| view.key.as_str()).collect();
    assert_eq!(keys, ["expired", fleet_name]);
    for view in &listed {
        assert_eq!(view.service.as_ref().unwrap().as_str(), "api");
        assert_eq!(view.expired_at_ms, UNIX_AT_EPOCH - 200);
        assert_eq!(view.last_heartbeat_at_ms, UNIX_AT_EPOCH - 5_200);
    }
    let zone = listed[0].meta.as_ref().map(|meta| meta.raw().get());
    assert_eq!(zone, Some(r#"{"zone":"a"}"#));
    assert!(listed[1].meta.is_none());
    harness.registry.check_invariants();
}

/// What a registry writes to its log, read back.
fn logged(dir: &DataDir) -> Vec<Record> {
    let mut records = Vec::new();
    dir.recover(|record| records.push(record)).unwrap();
    records
}

#[tokio::test]
async fn renewals_that_change_nothing_but_the_deadline_write_no_record() {
    let path = std::env::temp_dir().join(format!("ttlwheel-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    let dir = DataDir::open(&path).unwrap();
    let recovery = dir.recover(|_| {}).unwrap();
    let journal = std::sync::Arc::new(dir.open_journal(&recovery, FsyncMode::Always).unwrap());
    let mut harness = Harness::new(60);
    harness
        .registry
        .attach_journal(std::sync::Arc::clone(&journal));
    harness.heartbeat("k", 5_000); // created: a record
    for _ in 0..10 {
        harness.advance(1_000);
        harness.heartbeat("k", 5_000); // renewals: none
    }
    harness.heartbeat("k", 9_000); // a new TTL: a record
    let key = Key::new("k").unwrap();
    harness
        .registry
        .expire(
            &key,
            ExpireAt::AtUnixMs((UNIX_AT_EPOCH + 60_000) as i64),
            None,
            harness.now(),
        )
        .unwrap(); // an absolute deadline: a record
    harness.registry.delete(&key, harness.now()).unwrap(); // a deletion: a record
    journal.close().unwrap();
    let records = logged(&dir);
    assert_eq!(records.len(), 4, "{records:#?}");
    assert!(matches!(
        &records[1],
        Record::Upsert(KeyState {
            expiry: Expiry::Relative { ttl_ms: 9_000 },
            ..
        })
    ));
    assert!(matches!(
        &records[2],
        Record::Upsert(KeyState {
            expiry: Expiry::Absolute { .. },
            ..
        })
    ));
    assert!(matches!(&records[3], Record::Deleted { .. }));
}
