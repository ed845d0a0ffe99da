//! The scheduling cycle on small clusters built in code: queue order, assume/forget,
//! device packing, already-allocated claims and the grouped message.

use dra_engine::{ClusterInput, Decision, Engine, EngineConfig, ObjectKey, Profile};
use serde_json::{Value, json};

fn node(name: &str, cpu: &str) -> k8s_openapi::api::core::v1::Node {
    serde_json::from_value(json!({"metadata": {"name": name},
        "status": {"allocatable": {"cpu": cpu, "memory": "64Gi", "pods": "110"}}}))
    .unwrap()
}

/// A slice with `gpus` plain GPUs on `node`.
fn gpus(node: &str, gpus: usize) -> k8s_openapi::api::resource::v1::ResourceSlice {
    let devices: Vec<Value> = (0..gpus)
        .map(|i| json!({"name": format!("gpu-{i}")}))
        .collect();
    serde_json::from_value(
        json!({"metadata": {"name": format!("{node}-gpus")}, "spec": {
        "driver": "gpu.example.com", "nodeName": node,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}),
    )
    .unwrap()
}

fn class() -> k8s_openapi::api::resource::v1::DeviceClass {
    serde_json::from_value(json!({"metadata": {"name": "gpu"}, "spec": {"selectors": [
        {"cel": {"expression": "device.driver == 'gpu.example.com'"}}]}}))
    .unwrap()
}

fn claim(name: &str) -> k8s_openapi::api::resource::v1::ResourceClaim {
    serde_json::from_value(
        json!({"metadata": {"name": name, "namespace": "default"}, "spec": {
        "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}}),
    )
    .unwrap()
}

/// A pod of ours using claim `claim` (if any), asking for `cpu`.
fn pod(
    name: &str,
    claim: Option<&str>,
    cpu: &str,
    priority: i32,
) -> k8s_openapi::api::core::v1::Pod {
    let claims: Vec<Value> = claim
        .into_iter()
        .map(|c| json!({"name": "gpu", "resourceClaimName": c}))
        .collect();
    serde_json::from_value(
        json!({"metadata": {"name": name, "namespace": "default"}, "spec": {
        "schedulerName": "dra-scheduler", "priority": priority, "resourceClaims": claims,
        "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}),
    )
    .unwrap()
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new("default", name)
}

fn devices(decision: &Decision) -> Vec<String> {
    let Decision::Scheduled(p) = decision else {
        panic!("not scheduled: {:?}", decision.message())
    };
    p.claims
        .iter()
        .flat_map(|c| c.allocation.iter())
        .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
        .map(|r| format!("{}/{}", r.pool, r.device))
        .collect()
}

fn engine(input: ClusterInput) -> Engine {
    Engine::new(EngineConfig::default(), input)
}

#[test]
fn higher_priority_pods_go_first() {
    let e = engine(ClusterInput {
        nodes: vec![node("n1", "8")],
        pods: vec![
            pod("low", None, "1", 0),
            pod("high", None, "1", 100),
            pod("mid", None, "1", 10),
        ],
        ..Default::default()
    });
    let order = |k: &ObjectKey| {
        ["low", "high", "mid"]
            .iter()
            .position(|n| *n == k.name)
            .unwrap()
    };
    assert_eq!(
        e.pending_pods(&order, false),
        [key("high"), key("mid"), key("low")]
    );
}

#[test]
fn assumed_devices_are_taken_until_forgotten() {
    let mut e = engine(ClusterInput {
        nodes: vec![node("n1", "8")],
        classes: vec![class()],
        slices: vec![gpus("n1", 2)],
        claims: vec![claim("a"), claim("b"), claim("c")],
        pods: vec![
            pod("a", Some("a"), "1", 0),
            pod("b", Some("b"), "1", 0),
            pod("c", Some("c"), "1", 0),
        ],
        ..Default::default()
    });
    let a = e.schedule(&key("a"));
    assert_eq!(devices(&a), ["n1/gpu-0"]);
    let Decision::Scheduled(placement_a) = &a else {
        unreachable!()
    };
    e.assume(placement_a);
    let b = e.schedule(&key("b"));
    assert_eq!(devices(&b), ["n1/gpu-1"]);
    let Decision::Scheduled(placement_b) = &b else {
        unreachable!()
    };
    e.assume(placement_b);
    // Both GPUs are taken: c waits, and says so.
    let c = e.schedule(&key("c"));
    assert_eq!(
        c.message(),
        Some(
            "0/1 nodes are available: 1 claim default/c request gpu (needs 1): \
             2 in class gpu, 2 match the selectors, 2 in use, 0 available."
        )
    );
    // a's write failed: its GPU is free again and its pod is pending again.
    e.forget(placement_a);
    assert!(
        e.state().claims[&key("a")]
            .status
            .as_ref()
            .unwrap()
            .allocation
            .is_none()
    );
    assert_eq!(
        e.pending_pods(&|_| 0, false),
        [key("a"), key("c")],
        "ties go by name"
    );
    assert_eq!(devices(&e.schedule(&key("c"))), ["n1/gpu-0"]);
}

/// Two nodes with two GPUs each, and two pods that want one GPU each.
fn two_nodes_two_pods() -> ClusterInput {
    ClusterInput {
        nodes: vec![node("n1", "8"), node("n2", "8")],
        classes: vec![class()],
        slices: vec![gpus("n1", 2), gpus("n2", 2)],
        claims: vec![claim("first"), claim("second")],
        pods: vec![
            pod("first", Some("first"), "1", 0),
            pod("second", Some("second"), "1", 0),
        ],
        ..Default::default()
    }
}

#[test]
fn a_partly_used_node_is_preferred_so_whole_nodes_stay_free() {
    let mut e = engine(two_nodes_two_pods());
    let first = e.schedule(&key("first"));
    let Decision::Scheduled(p) = &first else {
        panic!()
    };
    e.assume(p);
    let first_node = p.node.clone();
    // The second GPU pod packs next to the first instead of breaking into the empty node.
    assert_eq!(e.schedule(&key("second")).node(), Some(first_node.as_str()));
}

#[test]
fn weights_can_spread_pods_instead_of_packing_them() {
    let place_both = |profile: Profile| {
        let config = EngineConfig {
            profile,
            ..Default::default()
        };
        let mut e = Engine::new(config, two_nodes_two_pods());
        let Decision::Scheduled(p) = e.schedule(&key("first")) else {
            panic!()
        };
        e.assume(&p);
        (
            p.node,
            e.schedule(&key("second")).node().unwrap().to_string(),
        )
    };
    let mut spreading = Profile::default();
    spreading.disable("DevicePacking");
    assert_eq!(
        place_both(spreading),
        ("n1".into(), "n2".into()),
        "without packing, the emptier node wins (NodeResourcesFit, LeastAllocated)"
    );
    assert_eq!(
        place_both(Profile::default()),
        ("n1".into(), "n1".into()),
        "packing outweighs spreading in the default profile"
    );
}

#[test]
fn reasons_are_grouped_across_nodes() {
    let mut e = engine(ClusterInput {
        nodes: vec![
            node("small-1", "1"),
            node("small-2", "1"),
            node("big", "16"),
        ],
        classes: vec![class()],
        slices: vec![gpus("small-1", 1)],
        claims: vec![claim("c")],
        pods: vec![pod("p", Some("c"), "4", 0)],
        ..Default::default()
    });
    assert_eq!(
        e.schedule(&key("p")).message(),
        Some(
            "0/3 nodes are available: 1 claim default/c request gpu (needs 1): 0 in class gpu, \
             0 match the selectors, 0 available, 2 Insufficient cpu."
        )
    );
}

#[test]
fn an_allocated_claim_keeps_its_pods_on_the_devices_node() {
    let mut allocated = claim("shared");
    allocated.status = serde_json::from_value(json!({"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": "gpu.example.com", "pool": "n2", "device": "gpu-0"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}}}))
    .unwrap();
    let mut e = engine(ClusterInput {
        nodes: vec![node("n1", "8"), node("n2", "8")],
        classes: vec![class()],
        slices: vec![gpus("n1", 1), gpus("n2", 1)],
        claims: vec![allocated],
        pods: vec![pod("user", Some("shared"), "1", 0)],
        ..Default::default()
    });
    let d = e.schedule(&key("user"));
    assert_eq!(d.node(), Some("n2"));
    let Decision::Scheduled(p) = &d else {
        unreachable!()
    };
    assert!(
        p.claims[0].allocation.is_none(),
        "an allocated claim is not allocated again"
    );
    e.assume(p);
    let reserved = e.state().claims[&key("shared")]
        .status
        .as_ref()
        .unwrap()
        .reserved_for
        .clone()
        .unwrap();
    assert_eq!(reserved[0].name, "user");
}

#[test]
fn a_missing_claim_keeps_the_pod_waiting() {
    let mut e = engine(ClusterInput {
        nodes: vec![node("n1", "8")],
        pods: vec![pod("p", Some("not-there"), "1", 0)],
        ..Default::default()
    });
    assert_eq!(
        e.schedule(&key("p")).message(),
        Some("0/1 nodes are available: ResourceClaim default/not-there not found.")
    );
    assert_eq!(
        e.claims_missing(&key("p")).as_deref(),
        Some("ResourceClaim default/not-there not found"),
        "PreEnqueue keeps it waiting"
    );
    assert_eq!(
        e.claim_awaited(&key("p")),
        Some(key("not-there")),
        "what wakes it"
    );
    e.upsert_claim(claim("not-there"));
    assert_eq!(e.claims_missing(&key("p")), None);
    assert_eq!(e.claim_awaited(&key("p")), None);
}

#[test]
fn a_pod_whose_template_claim_is_not_named_yet_waits_for_its_own_update() {
    let mut from_template = pod("p", None, "1", 0);
    from_template.spec.as_mut().unwrap().resource_claims = Some(vec![
        serde_json::from_value(json!({"name": "gpu", "resourceClaimTemplateName": "one-gpu"}))
            .unwrap(),
    ]);
    let e = engine(ClusterInput {
        nodes: vec![node("n1", "8")],
        pods: vec![from_template],
        ..Default::default()
    });
    assert_eq!(
        e.claims_missing(&key("p")).as_deref(),
        Some(
            "waiting for the ResourceClaim of pod claim gpu to be created from ResourceClaimTemplate one-gpu"
        )
    );
    assert_eq!(
        e.claim_awaited(&key("p")),
        None,
        "no claim to wait for by name"
    );
}

#[test]
fn a_claim_allocated_for_an_unbound_pod_that_no_longer_fits_is_released() {
    // A scheduler allocated gpu-0 on n2 for "waiter" and died before binding; n2 is now
    // full of cpu, so the pod cannot go there, while n1 is free.
    let mut allocated = claim("mine");
    allocated.status = serde_json::from_value(json!({
        "allocation": {
            "devices": {"results": [{"request": "gpu", "driver": "gpu.example.com", "pool": "n2", "device": "gpu-0"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}},
        "reservedFor": [{"resource": "pods", "name": "waiter", "uid": "uid-waiter"}]}))
    .unwrap();
    let mut waiter = pod("waiter", Some("mine"), "4", 0);
    waiter.metadata.uid = Some("uid-waiter".into());
    let mut e = engine(ClusterInput {
        nodes: vec![node("n1", "8"), node("n2", "2")],
        classes: vec![class()],
        slices: vec![gpus("n1", 1), gpus("n2", 1)],
        claims: vec![allocated.clone()],
        pods: vec![waiter.clone()],
        ..Default::default()
    });
    let d = e.schedule(&key("waiter"));
    assert!(matches!(d, Decision::Unschedulable { .. }), "{d:?}");
    assert_eq!(e.claim_to_release(&key("waiter")), Some(key("mine")));

    // Shared with a pod that is bound: not ours to give back.
    let mut shared = allocated;
    shared.status.as_mut().unwrap().reserved_for = serde_json::from_value(json!([
        {"resource": "pods", "name": "waiter", "uid": "uid-waiter"},
        {"resource": "pods", "name": "running", "uid": "uid-running"}]))
    .unwrap();
    e.state_mut().upsert_claim(shared);
    assert_eq!(e.claim_to_release(&key("waiter")), None);
}

#[test]
fn the_search_effort_of_a_cycle_is_counted() {
    let mut e = engine(ClusterInput {
        nodes: vec![node("n1", "8"), node("n2", "8")],
        classes: vec![class()],
        slices: vec![gpus("n1", 2), gpus("n2", 2)],
        claims: vec![claim("c")],
        pods: vec![pod("p", Some("c"), "1", 0), pod("plain", None, "1", 0)],
        ..Default::default()
    });
    assert!(e.schedule(&key("p")).node().is_some());
    let steps = e.last_search_steps();
    assert!(steps >= 2, "at least one step per node tried: {steps}");
    assert!(e.schedule(&key("plain")).node().is_some());
    assert_eq!(e.last_search_steps(), 0, "no claims, no search");
}

#[test]
fn claim_updates_from_the_api_take_and_give_back_devices() {
    let mut e = engine(ClusterInput {
        nodes: vec![node("n1", "8")],
        classes: vec![class()],
        slices: vec![gpus("n1", 2)],
        claims: vec![claim("c1"), claim("c2")],
        pods: vec![pod("p1", Some("c1"), "1", 0), pod("p2", Some("c2"), "1", 0)],
        ..Default::default()
    });
    assert_eq!(devices(&e.schedule(&key("p1"))), ["n1/gpu-0"]);
    // Another scheduler instance allocated gpu-0 to c1; the API server tells us.
    let mut c1 = claim("c1");
    c1.metadata.resource_version = Some("10".into());
    c1.status = serde_json::from_value(json!({"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"}]}}}))
    .unwrap();
    assert!(e.upsert_claim(c1.clone()));
    assert_eq!(devices(&e.schedule(&key("p2"))), ["n1/gpu-1"]);
    // An older copy of c1 (sent before that write) changes nothing.
    let mut stale = claim("c1");
    stale.metadata.resource_version = Some("9".into());
    assert!(!e.upsert_claim(stale));
    assert_eq!(devices(&e.schedule(&key("p2"))), ["n1/gpu-1"]);
    // Deleted: gpu-0 is free again.
    e.remove_claim(&key("c1"));
    assert_eq!(devices(&e.schedule(&key("p2"))), ["n1/gpu-0"]);
}

#[test]
fn a_node_update_keeps_what_its_pods_use() {
    let mut running = pod("running", None, "2", 0);
    running.spec.as_mut().unwrap().node_name = Some("n1".into());
    let mut e = engine(ClusterInput {
        nodes: vec![node("n1", "2")],
        pods: vec![running, pod("waiting", None, "1", 0)],
        ..Default::default()
    });
    assert!(matches!(
        e.schedule(&key("waiting")),
        Decision::Unschedulable { .. }
    ));
    // A kubelet heartbeat: the same node again.
    e.upsert_node(node("n1", "2"));
    assert!(
        matches!(e.schedule(&key("waiting")), Decision::Unschedulable { .. }),
        "the running pod's cpu is still counted"
    );
    // More cpu: now it fits.
    e.upsert_node(node("n1", "4"));
    assert_eq!(e.schedule(&key("waiting")).node(), Some("n1"));
}

#[test]
fn a_decision_made_on_a_fork_is_taken_only_if_what_it_relies_on_did_not_change() {
    let mut e = engine(ClusterInput {
        nodes: vec![node("n1", "8"), node("n2", "8")],
        classes: vec![class()],
        slices: vec![gpus("n1", 1), gpus("n2", 1)],
        claims: vec![claim("a"), claim("b")],
        pods: vec![pod("a", Some("a"), "1", 0), pod("b", Some("b"), "1", 0)],
        ..Default::default()
    });
    let mut fork = e.fork();
    let mark = fork.forked_at().expect("a fork knows when it was made");
    let Decision::Scheduled(on_fork) = fork.schedule(&key("a")) else {
        panic!("a fits")
    };
    assert_eq!(devices(&Decision::Scheduled(on_fork.clone())), ["n1/gpu-0"]);
    // Changes elsewhere do not matter.
    e.upsert_node(node("n2", "8"));
    assert_eq!(e.admit(&on_fork, mark), Ok(()));
    // Meanwhile another scheduler gave n1's only GPU to claim b.
    let mut taken = claim("b");
    taken.status = serde_json::from_value(json!({"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"}]}}}))
    .unwrap();
    e.upsert_claim(taken);
    assert_eq!(
        e.admit(&on_fork, mark).unwrap_err(),
        "allocations in pool gpu.example.com/n1 changed while pod default/a was searched for"
    );
    // A pod bound to the node changes what it has left.
    let mut fork = e.fork();
    let mark = fork.forked_at().unwrap();
    let Decision::Scheduled(on_fork) = fork.schedule(&key("a")) else {
        panic!("a fits on n2")
    };
    assert_eq!(on_fork.node, "n2");
    let mut bound = pod("elsewhere", None, "1", 0);
    bound.spec.as_mut().unwrap().node_name = Some("n2".into());
    e.upsert_pod(bound);
    assert_eq!(
        e.admit(&on_fork, mark).unwrap_err(),
        "node n2 or its pods changed while pod default/a was searched for"
    );
}

#[test]
fn a_fork_shares_the_objects_and_what_it_assumes_stays_in_the_fork() {
    let mut e = engine(ClusterInput {
        nodes: vec![node("n1", "8")],
        classes: vec![class()],
        slices: vec![gpus("n1", 1)],
        claims: vec![claim("a")],
        pods: vec![pod("a", Some("a"), "1", 0)],
        ..Default::default()
    });
    let mut fork = e.fork();
    let claim_key = ObjectKey::new("default", "a");
    // Not copied: the fork holds the very same pod, claim and node objects.
    assert!(std::sync::Arc::ptr_eq(
        &e.state().pods[&key("a")],
        &fork.state().pods[&key("a")]
    ));
    assert!(std::sync::Arc::ptr_eq(
        &e.state().claims[&claim_key],
        &fork.state().claims[&claim_key]
    ));
    assert!(std::sync::Arc::ptr_eq(
        &e.state().nodes["n1"].node,
        &fork.state().nodes["n1"].node
    ));
    let Decision::Scheduled(placement) = fork.schedule(&key("a")) else {
        panic!("a fits")
    };
    fork.assume(&placement);
    // The fork's claim is allocated and its pod bound; the original's are as they were.
    assert!(fork.state().claims[&claim_key].status.is_some());
    assert_eq!(
        fork.state().pods[&key("a")]
            .spec
            .as_ref()
            .unwrap()
            .node_name
            .as_deref(),
        Some("n1")
    );
    assert!(e.state().claims[&claim_key].status.is_none());
    assert_eq!(
        e.state().pods[&key("a")].spec.as_ref().unwrap().node_name,
        None
    );
    assert_eq!(
        e.schedule(&key("a")).node(),
        Some("n1"),
        "the GPU is still free here"
    );
}

#[test]
fn a_pod_of_a_pod_group_is_refused_not_placed_alone() {
    let mut member = pod("member", None, "1", 0);
    member.spec.as_mut().unwrap().scheduling_group =
        Some(serde_json::from_value(json!({"podGroupName": "trainers"})).unwrap());
    let mut e = engine(ClusterInput {
        nodes: vec![node("n1", "8")],
        pods: vec![member],
        ..Default::default()
    });
    assert_eq!(
        e.schedule(&key("member")).message(),
        Some(
            "0/1 nodes are available: spec.schedulingGroup: a member of a PodGroup is \
             scheduled with its group, not alone."
        )
    );
}

/// 200 nodes of 4 CPUs, the first 50 too small for a pod of 1 CPU: kube-scheduler looks for
/// 100 feasible nodes (numFeasibleNodesToFind), and each search starts after the nodes the
/// last one examined (nextStartNodeIndex).
#[test]
fn each_search_starts_where_the_last_one_stopped() {
    let nodes = (0..200)
        .map(|i| node(&format!("node-{i:03}"), if i < 50 { "500m" } else { "4" }))
        .collect();
    let names = ["a", "b", "c", "d"];
    let mut e = engine(ClusterInput {
        nodes,
        pods: names.iter().map(|n| pod(n, None, "1", 0)).collect(),
        ..Default::default()
    });
    let mut placed = Vec::new();
    for name in names {
        let decision = e.schedule(&key(name));
        let Decision::Scheduled(p) = &decision else {
            panic!("{name} not scheduled: {:?}", decision.message())
        };
        placed.push(p.node.clone());
        e.assume(p);
    }
    // a: nodes 0-149 (50 too small, then 100 that fit), the first of the equals.
    // b: 150-199, then 0-99 (the 100th fit is node 99); node-050 has a's pod.
    // c: 100-199; d: 0-149 again, past the two used.
    assert_eq!(placed, ["node-050", "node-051", "node-100", "node-052"]);
}

/// 100 nodes of 2 CPUs in zone a and 100 of 8 in zone b, every zone-a node first by name.
/// kube-scheduler's node tree takes the zones in turn, so the 100 nodes a search looks at
/// are half of each zone, and a pod of 1 CPU goes to the emptiest: a node of zone b (by
/// name order alone, all 100 would have been of zone a).
#[test]
fn a_search_that_stops_early_looks_at_every_zone_in_turn() {
    let zoned = |name: String, cpu: &str, zone: &str| {
        let mut n = node(&name, cpu);
        n.metadata.labels = Some([("topology.kubernetes.io/zone".into(), zone.into())].into());
        n
    };
    let nodes = (0..100)
        .map(|i| zoned(format!("a-{i:03}"), "2", "a"))
        .chain((0..100).map(|i| zoned(format!("b-{i:03}"), "8", "b")))
        .collect();
    let mut e = engine(ClusterInput {
        nodes,
        pods: vec![pod("web", None, "1", 0), pod("next", None, "1", 0)],
        ..Default::default()
    });
    let Decision::Scheduled(p) = e.schedule(&key("web")) else {
        panic!("web not scheduled")
    };
    assert_eq!(p.node, "b-000");
    e.assume(&p);
    // The next search starts after the 100 examined (a-000, b-000, ..., a-049, b-049).
    let Decision::Scheduled(p) = e.schedule(&key("next")) else {
        panic!("next not scheduled")
    };
    assert_eq!(p.node, "b-050");
}
