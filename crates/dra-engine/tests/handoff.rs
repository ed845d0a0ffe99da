//! The A5000/T10 rollout: a replacement pod whose claim prefers an A5000 and falls back to a
//! T10 is placed while its predecessor still terminates on the A5000 (`Engine::handoff`),
//! and a pod left on the T10 while the A5000 is free (`Engine::degraded`).

use std::time::Duration;

use dra_engine::handoff::Owners;
use dra_engine::{ClusterInput, Decision, Engine, EngineConfig, ObjectKey, Placement};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{Value, json};

const BUDGET: Duration = Duration::from_secs(5);
const A5000: &str = "gpu.example.com/node-1/gpu-0";
const T10: &str = "gpu.example.com/node-1/gpu-1";

fn node() -> k8s_openapi::api::core::v1::Node {
    serde_json::from_value(json!({"metadata": {"name": "node-1"},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}}}))
    .unwrap()
}

/// One A5000 (gpu-0) and one T10 (gpu-1).
fn slice() -> k8s_openapi::api::resource::v1::ResourceSlice {
    let device = |name: &str, product: &str| json!({"name": name, "attributes": {"productName": {"string": product}}});
    serde_json::from_value(json!({"metadata": {"name": "node-1-gpus"}, "spec": {
        "driver": "gpu.example.com", "nodeName": "node-1",
        "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
        "devices": [device("gpu-0", "a5000"), device("gpu-1", "t10")]}}))
    .unwrap()
}

fn class() -> k8s_openapi::api::resource::v1::DeviceClass {
    serde_json::from_value(json!({"metadata": {"name": "gpu"}, "spec": {"selectors": [
        {"cel": {"expression": "device.driver == 'gpu.example.com'"}}]}}))
    .unwrap()
}

/// A claim "an A5000, else a T10"; allocated `device` (`gpu-0` a5000, `gpu-1` t10) for
/// `user` when given.
fn claim(name: &str, held: Option<(&str, &str)>) -> ResourceClaim {
    let sub = |name: &str| {
        json!({"name": name, "deviceClassName": "gpu", "selectors": [{"cel": {"expression":
            format!("device.attributes['gpu.example.com'].productName == '{name}'")}}]})
    };
    let mut v = json!({"metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "firstAvailable": [sub("a5000"), sub("t10")]}]}}});
    if let Some((device, user)) = held {
        let chosen = if device == "gpu-0" { "a5000" } else { "t10" };
        v["status"] = json!({
            "allocation": {"devices": {"results": [{"request": format!("gpu/{chosen}"),
                "driver": "gpu.example.com", "pool": "node-1", "device": device}]}},
            "reservedFor": [{"resource": "pods", "name": user, "uid": format!("uid-{user}")}]});
    }
    serde_json::from_value(v).unwrap()
}

/// A pod of ReplicaSet `rs` (whose Deployment is `web`, or `other` for `other-*`) with
/// claim `<name>-gpu`.
fn pod(name: &str, rs: &str, node: Option<&str>, extra: Value) -> Pod {
    let mut v = json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs,
                "uid": format!("uid-{rs}"), "controller": true}]},
        "spec": {"schedulerName": "dra-scheduler",
            "resourceClaims": [{"name": "gpu", "resourceClaimName": format!("{name}-gpu")}],
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}});
    if let Some(node) = node {
        v["spec"]["nodeName"] = json!(node);
    }
    if let (Value::Object(into), Value::Object(from)) = (&mut v["metadata"], extra) {
        into.extend(from);
    }
    serde_json::from_value(v).unwrap()
}

fn replica_set(name: &str, deployment: &str) -> ReplicaSet {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml",
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment,
            "uid": format!("uid-{deployment}"), "controller": true}]},
        "spec": {"selector": {"matchLabels": {"app": deployment}}}}))
    .unwrap()
}

const TERMINATING: fn() -> Value =
    || json!({"deletionTimestamp": "2026-12-01T10:00:30Z", "deletionGracePeriodSeconds": 30});

/// Old pod `old` (of `old_rs`) on the A5000, terminating or not; `web-new` (ReplicaSet
/// web-2 of Deployment web) pending.
fn rollout(old_rs: &str, terminating: bool) -> Engine {
    rollout_to(
        old_rs,
        terminating,
        pod("web-new", "web-2", None, json!({})),
    )
}

/// [`rollout`] with `new` in place of `web-new`.
fn rollout_to(old_rs: &str, terminating: bool, new: Pod) -> Engine {
    let extra = if terminating {
        TERMINATING()
    } else {
        json!({})
    };
    let input = ClusterInput {
        nodes: vec![node()],
        slices: vec![slice()],
        classes: vec![class()],
        pods: vec![pod("old", old_rs, Some("node-1"), extra), new],
        claims: vec![
            claim("old-gpu", Some(("gpu-0", "old"))),
            claim("web-new-gpu", None),
        ],
        replica_sets: vec![
            replica_set("web-1", "web"),
            replica_set("web-2", "web"),
            replica_set("other-1", "other"),
        ],
        ..Default::default()
    };
    Engine::new(EngineConfig::default(), input)
}

fn placed(engine: &mut Engine, pod: &str) -> Placement {
    match engine.schedule(&ObjectKey::new("ml", pod)) {
        Decision::Scheduled(p) => p,
        other => panic!("{pod} not placed: {other:?}"),
    }
}

fn devices(placement: &Placement) -> Vec<String> {
    placement
        .claims
        .iter()
        .flat_map(|c| c.allocation.iter())
        .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
        .map(|r| format!("{}/{}/{} ({})", r.driver, r.pool, r.device, r.request))
        .collect()
}

#[test]
fn the_replacement_waits_for_the_a5000_its_terminating_predecessor_holds() {
    let mut engine = rollout("web-1", true);
    let placement = placed(&mut engine, "web-new");
    assert_eq!(devices(&placement), [format!("{T10} (gpu/t10)")]);

    let handoff = engine
        .handoff(&placement, Owners::Same, BUDGET)
        .expect("a handoff from the terminating pod");
    assert_eq!(handoff.devices, [A5000]);
    assert_eq!(handoff.node, "node-1");
    assert_eq!(handoff.holders.len(), 1);
    assert_eq!(handoff.holders[0].pod, ObjectKey::new("ml", "old"));
    assert_eq!(
        handoff.holders[0]
            .deletion
            .as_ref()
            .map(|t| t.0.to_string()),
        Some("2026-12-01T10:00:30Z".to_string())
    );
    assert_eq!(
        handoff.describe(),
        "device gpu.example.com/node-1/gpu-0 (claim ml/web-new-gpu request gpu: a5000 \
         instead of t10) held by terminating pod ml/old"
    );
    // The check changed nothing: the pod is still placed on the T10 as before.
    assert_eq!(
        devices(&placed(&mut engine, "web-new")),
        [format!("{T10} (gpu/t10)")]
    );
}

/// A rollout's new ReplicaSet can reach the scheduler after its first pod (two watches):
/// the Deployment controller's naming, `<deployment>-<pod-template-hash>`, tells whose it is.
#[test]
fn a_replacement_whose_replica_set_is_not_known_yet_waits_by_the_deployments_naming() {
    let labelled = |hash: &str| json!({"labels": {"pod-template-hash": hash}});
    let new = pod("web-new", "web-7f9c", None, labelled("7f9c"));
    let mut engine = rollout_to("web-1", true, new);
    let placement = placed(&mut engine, "web-new");
    let handoff = engine.handoff(&placement, Owners::Same, BUDGET);
    assert_eq!(handoff.expect("a handoff").devices, [A5000]);

    // The name does not end in the pod's hash: not taken for web's.
    let new = pod("web-new", "web-7f9c", None, labelled("0000"));
    let mut engine = rollout_to("web-1", true, new);
    let placement = placed(&mut engine, "web-new");
    assert!(engine.handoff(&placement, Owners::Same, BUDGET).is_none());
}

#[test]
fn a_holder_gone_whose_claim_is_not_released_yet_is_still_waited_for() {
    let mut engine = rollout("web-1", true);
    let placement = placed(&mut engine, "web-new");
    let handoff = engine.handoff(&placement, Owners::Same, BUDGET).unwrap();
    let old_claim = (ObjectKey::new("ml", "old-gpu"), ObjectKey::new("ml", "old"));
    assert_eq!(handoff.claims, std::slice::from_ref(&old_claim));
    // kubelet confirmed the old pod stopped; kube-controller-manager has not released its
    // claim yet: the A5000 is still taken, and still coming.
    engine.remove_pod(&ObjectKey::new("ml", "old"));
    let placement = placed(&mut engine, "web-new");
    assert_eq!(devices(&placement), [format!("{T10} (gpu/t10)")]);
    assert!(engine.handoff(&placement, Owners::Same, BUDGET).is_none());
    let again = engine
        .handoff_with(
            &placement,
            Owners::Same,
            BUDGET,
            std::slice::from_ref(&old_claim),
        )
        .expect("still waiting for the claim's release");
    assert_eq!(again.devices, [A5000]);
    // Released: the pod gets the A5000 itself.
    engine.remove_claim(&old_claim.0);
    let placement = placed(&mut engine, "web-new");
    assert_eq!(devices(&placement), [format!("{A5000} (gpu/a5000)")]);
}

#[test]
fn a_finished_holder_whose_claim_is_reserved_for_nobody_is_still_waited_for() {
    // kubelet reported the old pod finished and kube-controller-manager took it out of the
    // claim's reservedFor; the claim still holds the A5000 until it is deleted.
    let mut engine = rollout("web-1", true);
    let old = ObjectKey::new("ml", "old");
    let mut finished = Pod::clone(&engine.state().pods[&old]);
    finished.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).unwrap());
    engine.upsert_pod(finished);
    let key = ObjectKey::new("ml", "old-gpu");
    let mut claim = ResourceClaim::clone(&engine.state().claims[&key]);
    claim.status.as_mut().unwrap().reserved_for = None;
    engine.upsert_claim(claim);
    let placement = placed(&mut engine, "web-new");
    assert_eq!(devices(&placement), [format!("{T10} (gpu/t10)")]);
    let handoff = engine
        .handoff(&placement, Owners::Same, BUDGET)
        .expect("a handoff");
    assert_eq!(handoff.devices, [A5000]);
    assert_eq!(handoff.holders[0].pod, old);
}

#[test]
fn a_terminating_pod_of_another_owner_is_waited_for_only_when_any_owner_is_configured() {
    let mut engine = rollout("other-1", true);
    let placement = placed(&mut engine, "web-new");
    assert!(engine.handoff(&placement, Owners::Same, BUDGET).is_none());
    let any = engine.handoff(&placement, Owners::Any, BUDGET).unwrap();
    assert_eq!(any.devices, [A5000]);
}

#[test]
fn a_running_holder_is_not_waited_for() {
    let mut engine = rollout("web-1", false);
    let placement = placed(&mut engine, "web-new");
    assert_eq!(devices(&placement), [format!("{T10} (gpu/t10)")]);
    assert!(engine.handoff(&placement, Owners::Any, BUDGET).is_none());
}

#[test]
fn a_pod_that_gets_its_first_choice_never_waits() {
    let mut engine = rollout("web-1", true);
    engine.remove_pod(&ObjectKey::new("ml", "old"));
    engine.remove_claim(&ObjectKey::new("ml", "old-gpu"));
    let placement = placed(&mut engine, "web-new");
    assert_eq!(devices(&placement), [format!("{A5000} (gpu/a5000)")]);
    assert!(engine.handoff(&placement, Owners::Any, BUDGET).is_none());
}

/// `web-0` bound on the T10; the A5000 held by `holder` (a claim) or free.
fn on_the_t10(a5000_held: bool, scheduler: &str) -> Engine {
    let mut on_t10 = pod("web-0", "web-1", Some("node-1"), json!({}));
    on_t10.spec.as_mut().unwrap().scheduler_name = Some(scheduler.into());
    let mut pods = vec![on_t10];
    let mut claims = vec![claim("web-0-gpu", Some(("gpu-1", "web-0")))];
    if a5000_held {
        pods.push(pod("holder", "other-1", Some("node-1"), json!({})));
        claims.push(claim("holder-gpu", Some(("gpu-0", "holder"))));
    }
    Engine::new(
        EngineConfig::default(),
        ClusterInput {
            nodes: vec![node()],
            slices: vec![slice()],
            classes: vec![class()],
            pods,
            claims,
            replica_sets: vec![replica_set("web-1", "web")],
            ..Default::default()
        },
    )
}

#[test]
fn a_pod_on_the_t10_while_the_a5000_is_free_is_degraded() {
    let engine = on_the_t10(false, "dra-scheduler");
    assert!(engine.may_have_degraded());
    let degraded = engine.degraded(BUDGET);
    assert_eq!(degraded.len(), 1, "{degraded:?}");
    let d = &degraded[0];
    assert_eq!(d.pod, ObjectKey::new("ml", "web-0"));
    assert_eq!(d.owner, "Deployment/web");
    assert_eq!(
        (d.node.as_str(), d.preferred_node.as_str()),
        ("node-1", "node-1")
    );
    assert_eq!(d.devices, [A5000]);
    assert_eq!(
        d.describe(),
        "runs on a lower-ranked device (claim ml/web-0-gpu request gpu: a5000 instead of \
         t10) while gpu.example.com/node-1/gpu-0 on node node-1 is free"
    );
    // The check leaves the pod bound with its claim as it was.
    let state = engine.state();
    let pod = &state.pods[&ObjectKey::new("ml", "web-0")];
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some("node-1")
    );
    let claim = &state.claims[&ObjectKey::new("ml", "web-0-gpu")];
    assert!(claim.status.as_ref().unwrap().allocation.is_some());
    assert_eq!(engine.degraded(BUDGET).len(), 1);
}

#[test]
fn a_pod_on_the_t10_while_the_a5000_is_taken_is_not_degraded() {
    let engine = on_the_t10(true, "dra-scheduler");
    assert!(engine.may_have_degraded());
    assert!(engine.degraded(BUDGET).is_empty());
}

#[test]
fn pods_of_other_schedulers_are_not_reported() {
    let engine = on_the_t10(false, "default-scheduler");
    assert!(!engine.may_have_degraded());
    assert!(engine.degraded(BUDGET).is_empty());
}
