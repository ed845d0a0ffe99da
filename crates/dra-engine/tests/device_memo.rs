//! DynamicResources keeps what it found per node for the next pods with the same claims
//! (`dra_engine::device_memo`): later pods get the same devices a fresh search would give,
//! a node whose allocations or Node object changed is searched again, and a pod that fits
//! nowhere is told about its own claims, not the claims the answers were found for.

use dra_engine::{ClusterInput, Decision, Engine, EngineConfig, ObjectKey, Placement};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::json;

fn node(name: &str, zone: &str) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"zone": zone}},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}}}))
    .unwrap()
}

/// Two GPUs on `node`.
fn slice(node: &str) -> ResourceSlice {
    serde_json::from_value(
        json!({"metadata": {"name": format!("{node}-gpus")}, "spec": {
        "driver": "gpu.example.com", "nodeName": node,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}]}}),
    )
    .unwrap()
}

fn class() -> DeviceClass {
    serde_json::from_value(json!({"metadata": {"name": "gpu"}, "spec": {"selectors": [
        {"cel": {"expression": "device.driver == 'gpu.example.com'"}}]}}))
    .unwrap()
}

fn claim(name: &str) -> ResourceClaim {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}}))
    .unwrap()
}

/// A pod with claim `<name>-gpu`, only for nodes of `zone`.
fn pod(name: &str, zone: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")},
        "spec": {"schedulerName": "dra-scheduler",
            "nodeSelector": {"zone": zone},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": format!("{name}-gpu")}],
            "containers": [{"name": "c"}]}}))
    .unwrap()
}

/// Nodes a and b (zone x, two GPUs each); `pods` pods of zone x, each with its own claim.
fn cluster(pods: &[&str]) -> Engine {
    let input = ClusterInput {
        nodes: vec![node("a", "x"), node("b", "x")],
        slices: vec![slice("a"), slice("b")],
        classes: vec![class()],
        pods: pods.iter().map(|p| pod(p, "x")).collect(),
        claims: pods.iter().map(|p| claim(&format!("{p}-gpu"))).collect(),
        ..Default::default()
    };
    Engine::new(EngineConfig::default(), input)
}

fn place(engine: &mut Engine, name: &str) -> String {
    match engine.schedule(&ObjectKey::new("ml", name)) {
        Decision::Scheduled(p) => {
            engine.assume(&p);
            device(&p)
        }
        other => panic!("{name} not placed: {other:?}"),
    }
}

fn device(p: &Placement) -> String {
    let r = &p.claims[0]
        .allocation
        .as_ref()
        .unwrap()
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap()[0];
    format!("{}/{}", p.node, r.device)
}

#[test]
fn later_pods_get_every_free_gpu_once_and_the_last_is_told_about_its_own_claim() {
    let names = ["p1", "p2", "p3", "p4", "p5"];
    let mut engine = cluster(&names);
    let mut got: Vec<String> = names[..4].iter().map(|p| place(&mut engine, p)).collect();
    got.sort();
    assert_eq!(got, ["a/gpu-0", "a/gpu-1", "b/gpu-0", "b/gpu-1"]);
    // p2..p4 read the answer for the node that p1 (p2, p3) did not change.
    assert!(
        engine.device_memo_hits() >= 3,
        "{}",
        engine.device_memo_hits()
    );
    match engine.schedule(&ObjectKey::new("ml", "p5")) {
        Decision::Unschedulable { message, .. } => {
            assert!(message.contains("ml/p5-gpu"), "{message}");
            assert!(!message.contains("ml/p4-gpu"), "{message}");
        }
        other => panic!("p5 placed: {other:?}"),
    }
}

/// Two GPUs reachable from every node of zone x (a slice with a node selector).
fn zone_slice() -> ResourceSlice {
    serde_json::from_value(json!({"metadata": {"name": "zone-x-gpus"}, "spec": {
        "driver": "gpu.example.com",
        "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["x"]}]}]},
        "pool": {"name": "zone-x", "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}]}}))
    .unwrap()
}

#[test]
fn a_node_whose_labels_changed_is_searched_again() {
    // The pod has no node selector of its own: only the slice's selects nodes.
    let mut p1 = pod("p1", "x");
    p1.spec.as_mut().unwrap().node_selector = None;
    let input = ClusterInput {
        nodes: vec![node("a", "x"), node("b", "x")],
        slices: vec![zone_slice()],
        classes: vec![class()],
        pods: vec![p1],
        claims: vec![claim("p1-gpu")],
        ..Default::default()
    };
    let mut engine = Engine::new(EngineConfig::default(), input);
    let key = ObjectKey::new("ml", "p1");
    let Decision::Scheduled(first) = engine.schedule(&key) else {
        panic!("p1 not placed")
    };
    assert_eq!(first.node, "a", "equal scores: the first node by name");
    // Not assumed: nothing was allocated, so only the Node object tells node a apart now.
    engine.upsert_node(node("a", "y"));
    let Decision::Scheduled(second) = engine.schedule(&key) else {
        panic!("p1 not placed")
    };
    assert_eq!(
        second.node, "b",
        "node a left zone x: its devices are out of reach"
    );
}

#[test]
fn answers_match_a_fresh_engine_for_each_pod() {
    // The same pods, one engine placing them in turn (with the memo) and, for each pod, a
    // new engine built from the state so far (no memo): the same node and device each time.
    let names = ["p1", "p2", "p3", "p4"];
    let mut engine = cluster(&names);
    let mut assumed: Vec<Placement> = Vec::new();
    for name in names {
        let mut fresh = cluster(&names);
        for p in &assumed {
            fresh.assume(p);
        }
        let want = match fresh.schedule(&ObjectKey::new("ml", name)) {
            Decision::Scheduled(p) => device(&p),
            other => panic!("{name}: {other:?}"),
        };
        let Decision::Scheduled(p) = engine.schedule(&ObjectKey::new("ml", name)) else {
            panic!("{name} not placed")
        };
        assert_eq!(device(&p), want, "{name}");
        engine.assume(&p);
        assumed.push(p);
    }
}

#[test]
fn a_node_added_in_the_place_of_a_removed_one_is_searched_not_answered_for_it() {
    // Only node b has GPUs. Node c, added after b is removed, takes b's place in the
    // memo's table (its slot) but has no GPUs of its own: what was found on b is not c's.
    let input = ClusterInput {
        nodes: vec![node("a", "x"), node("b", "x")],
        slices: vec![slice("b")],
        classes: vec![class()],
        pods: vec![pod("p1", "x")],
        claims: vec![claim("p1-gpu")],
        ..Default::default()
    };
    let mut engine = Engine::new(EngineConfig::default(), input);
    let key = ObjectKey::new("ml", "p1");
    let slot_of = |engine: &Engine, n: &str| engine.state().nodes[n].slot;
    let Decision::Scheduled(first) = engine.schedule(&key) else {
        panic!("p1 not placed")
    };
    assert_eq!(first.node, "b");
    let b_slot = slot_of(&engine, "b");
    engine.remove_node("b");
    engine.upsert_node(node("c", "x"));
    assert_eq!(slot_of(&engine, "c"), b_slot, "c reuses b's slot");
    match engine.schedule(&key) {
        Decision::Unschedulable { message, .. } => {
            assert!(message.contains("0/2 nodes are available"), "{message}");
        }
        other => panic!("p1 placed on a node without GPUs: {other:?}"),
    }
}
