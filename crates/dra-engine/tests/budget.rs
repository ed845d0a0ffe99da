//! Every pod's device search is bounded: a claim whose search would run for hours makes its
//! pod unschedulable once `filterTimeout` has passed, with a message naming the claim, and a
//! cancelled attempt stops at once.
//!
//! The hard claim: an `All` request tied by `matchAttribute` to a request for 31 of the
//! 30 GPUs that share the marker's zone. An `All` request under a constraint makes the
//! search follow upstream's order without pruning (so that errors are met where upstream
//! meets them), which here means walking 2^30 combinations.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::time::Duration;

use dra_engine::{ClusterInput, Decision, Engine, EngineConfig, ObjectKey};
use serde_json::{Value, json};

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn hard_cluster() -> ClusterInput {
    let mut devices: Vec<Value> = vec![json!({"name": "marker", "attributes": {
        "kind": {"string": "marker"}, "zone": {"string": "a"}}})];
    for i in 0..40 {
        let zone = if i < 30 { "a" } else { "b" };
        devices.push(json!({"name": format!("gpu-{i}"), "attributes": {
            "kind": {"string": "gpu"}, "zone": {"string": zone}}}));
    }
    let class = |name: &str, kind: &str| {
        from(json!({"metadata": {"name": name}, "spec": {"selectors": [
            {"cel": {"expression": format!("device.attributes['example.com'].kind == '{kind}'")}}]}}))
    };
    let pod = |name: &str, claim: Option<&str>| {
        let claims: Vec<Value> = claim
            .into_iter()
            .map(|c| json!({"name": "devices", "resourceClaimName": c}))
            .collect();
        from(
            json!({"metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "spec": {"schedulerName": "dra-scheduler", "resourceClaims": claims,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}),
        )
    };
    ClusterInput {
        nodes: vec![from(json!({"metadata": {"name": "n1"},
            "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110"}}}))],
        classes: vec![class("marker", "marker"), class("gpu", "gpu")],
        slices: vec![from(json!({"metadata": {"name": "n1"}, "spec": {
            "driver": "example.com", "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": devices}}))],
        claims: vec![
            from(json!({"metadata": {"name": "easy", "namespace": "default"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": "gpu",
                    "selectors": [{"cel": {"expression": "device.attributes['example.com'].zone == 'b'"}}]}}]}}})),
            from(
                json!({"metadata": {"name": "zoned", "namespace": "default"},
                "spec": {"devices": {
                    "requests": [
                        {"name": "marker", "exactly": {"deviceClassName": "marker", "allocationMode": "All"}},
                        {"name": "gpus", "exactly": {"deviceClassName": "gpu", "count": 31}}],
                    "constraints": [{"requests": ["marker", "gpus"], "matchAttribute": "example.com/zone"}]}}}),
            ),
        ],
        pods: vec![pod("hard", Some("zoned")), pod("plain", None), two_claims()],
        ..Default::default()
    }
}

/// A pod with an easy claim first and the hard one second.
fn two_claims() -> k8s_openapi::api::core::v1::Pod {
    from(
        json!({"metadata": {"name": "both", "namespace": "default", "uid": "uid-both"},
        "spec": {"schedulerName": "dra-scheduler", "resourceClaims": [
            {"name": "easy", "resourceClaimName": "easy"},
            {"name": "zoned", "resourceClaimName": "zoned"}],
        "containers": [{"name": "c"}]}}),
    )
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new("default", name)
}

/// Runs `f` on a thread; fails the test instead of hanging if it has not answered in 60 s
/// (the budgets below are a fraction of a second).
fn answered<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the attempt did not stop within 60 s: the search is unbounded")
}

#[test]
fn a_search_past_the_filter_timeout_makes_the_pod_unschedulable_naming_the_claim() {
    let decision = answered(|| {
        let config = EngineConfig {
            filter_timeout: Duration::from_millis(200),
            ..Default::default()
        };
        let mut engine = Engine::new(config, hard_cluster());
        let hard = engine.schedule(&key("hard"));
        // The engine is usable afterwards: the next pod is placed.
        let plain = engine.schedule(&key("plain"));
        assert_eq!(plain.node(), Some("n1"), "{:?}", plain.message());
        (hard, engine.last_search_steps())
    });
    let (hard, _) = &decision;
    let Decision::OutOfTime { message, .. } = hard else {
        panic!("expected out of time, got {hard:?}");
    };
    assert!(
        message.starts_with("timed out trying to allocate devices: the search for ResourceClaim default/zoned ran past the filterTimeout of 200ms"),
        "{message}"
    );
    assert!(message.ends_with("(0 of 1 nodes checked)"), "{message}");
}

#[test]
fn the_timeout_names_the_claim_the_search_was_stuck_in() {
    let decision = answered(|| {
        let config = EngineConfig {
            filter_timeout: Duration::from_millis(200),
            ..Default::default()
        };
        Engine::new(config, hard_cluster()).schedule(&key("both"))
    });
    let message = decision.message().unwrap_or_default();
    assert!(
        message.starts_with("timed out trying to allocate devices: the search for ResourceClaim default/zoned ran past"),
        "{decision:?}"
    );
}

#[test]
fn a_cancelled_attempt_stops_at_once_and_says_so() {
    let decision = answered(|| {
        let mut engine = Engine::new(EngineConfig::default(), hard_cluster());
        let cancel = AtomicBool::new(true);
        engine.schedule_with(&key("hard"), Some(&cancel))
    });
    assert!(
        matches!(&decision, Decision::Error { message, .. } if message == "scheduling attempt cancelled"),
        "{decision:?}"
    );
}
