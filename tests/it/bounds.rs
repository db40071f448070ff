//! Bounded growth: `--max-keys` refuses creations past it (renewals go on), and service names
//! are a limit on names *in use*: a name whose last key is gone is freed when room is needed.

use reqwest::StatusCode;
use serde_json::json;
use ttlwheel::config::Config;
use ttlwheel::registry::{GuardConfig, Heartbeat, RegistryConfig, RegistryError, MAX_SERVICES};
use ttlwheel::types::{ServiceName, Ttl};

use crate::server::TestServer;
use crate::{key_of, Harness};

fn try_heartbeat(harness: &Harness, key: &str, service: Option<&str>) -> Result<(), RegistryError> {
    let heartbeat = Heartbeat {
        key: key_of(key),
        ttl: Ttl::from_millis(10_000).unwrap(),
        service: service.map(|name| ServiceName::new(name).unwrap()),
        meta: None,
    };
    harness
        .registry
        .heartbeat(heartbeat, harness.now())
        .map(drop)
}

#[test]
fn past_max_keys_creations_are_refused_and_renewals_go_on() {
    let mut harness = Harness::with_config(RegistryConfig {
        max_keys: 10,
        guard: GuardConfig::off(),
        ..RegistryConfig::default()
    });
    for n in 0..10 {
        try_heartbeat(&harness, &format!("k{n}"), None).unwrap();
    }
    assert_eq!(
        try_heartbeat(&harness, "k10", None),
        Err(RegistryError::TooManyKeys { max: 10 })
    );
    assert!(!harness.alive("k10"), "nothing was created");
    try_heartbeat(&harness, "k3", None).expect("a renewal goes on");
    assert!(harness
        .registry
        .delete(&key_of("k3"), harness.now())
        .unwrap());
    try_heartbeat(&harness, "k10", None).expect("room again after a deletion");
    // Expiry frees room too.
    harness.advance(10_000);
    assert_eq!(harness.registry.len(), 0);
    for n in 20..30 {
        try_heartbeat(&harness, &format!("k{n}"), None).unwrap();
    }
    harness.registry.check_invariants();
}

#[test]
fn service_names_are_freed_when_their_last_key_is_gone() {
    let mut harness = Harness::new(60);
    for n in 0..MAX_SERVICES {
        try_heartbeat(&harness, &format!("k{n}"), Some(&format!("svc-{n}"))).unwrap();
    }
    // Every name has a key: a new one is refused.
    assert_eq!(
        try_heartbeat(&harness, "new", Some("brand-new")),
        Err(RegistryError::TooManyServices)
    );
    // Keys of the first half are deleted (gone), the next 100 expire (still listed, so their
    // names are still in use), the rest stay alive.
    for n in 0..MAX_SERVICES / 2 {
        assert!(harness
            .registry
            .delete(&key_of(&format!("k{n}")), harness.now())
            .unwrap());
    }
    harness.stall(5_000);
    for n in MAX_SERVICES / 2..MAX_SERVICES {
        if n >= MAX_SERVICES / 2 + 100 {
            try_heartbeat(&harness, &format!("k{n}"), None).unwrap();
        }
    }
    harness.advance(5_001);
    // A new name is accepted now: the deleted keys' names were freed.
    try_heartbeat(&harness, "new", Some("brand-new")).unwrap();
    let overview = harness.registry.service_counts();
    let expired_listed = overview.services.iter().filter(|s| s.expired == 1).count();
    assert_eq!(expired_listed, 100, "listed-expired keys keep their names");
    assert!(overview
        .services
        .iter()
        .any(|s| s.service.as_str() == "brand-new"));
    assert_eq!(
        overview.services.len(),
        MAX_SERVICES - MAX_SERVICES / 2 + 1,
        "the freed names are gone from the overview"
    );
    assert!(harness.registry.service_names() <= MAX_SERVICES);
    harness.registry.check_invariants();
    // The kept keys still carry their own names.
    let kept = harness
        .registry
        .get(&key_of(&format!("k{}", MAX_SERVICES - 1)), harness.now())
        .unwrap();
    assert_eq!(
        kept.service.map(|name| name.as_str().to_owned()),
        Some(format!("svc-{}", MAX_SERVICES - 1))
    );
}

#[tokio::test]
async fn too_many_keys_is_a_429_json_error_for_singles_and_batch_items() {
    let mut config = Config::ephemeral();
    config.max_keys = 2;
    let server = TestServer::with_config(config).await;
    for key in ["a", "b"] {
        let (status, _) = server.post("/v1/heartbeats", json!({"key": key})).await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, body) = server.post("/v1/heartbeats", json!({"key": "c"})).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "too_many_keys");
    let (status, body) = server
        .post(
            "/v1/heartbeats/batch",
            json!({"heartbeats": [{"key": "a"}, {"key": "d"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(body["results"][0]["created"] == false, "{body}");
    assert_eq!(
        body["results"][1]["error"]["code"], "too_many_keys",
        "{body}"
    );
}
