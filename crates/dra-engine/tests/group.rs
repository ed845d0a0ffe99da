//! PodGroups through `Engine::schedule_group`: gangs placed whole or not at all, devices
//! of an earlier member chosen again when a later one needs them (kubernetes/kubernetes
//! #138765), the counting bound's messages, topology domains, and what is refused by name.

use std::time::Duration;

use dra_engine::{
    ClusterInput, Decision, Engine, EngineConfig, GroupDecision, GroupPlacement, ObjectKey,
};
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use serde_json::{Value, json};

fn node(name: &str, labels: Value) -> k8s_openapi::api::core::v1::Node {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}}}))
    .unwrap()
}

/// A slice on `node` with one GPU per product name given.
fn slice(node: &str, products: &[&str]) -> k8s_openapi::api::resource::v1::ResourceSlice {
    let devices: Vec<Value> = products
        .iter()
        .enumerate()
        .map(|(i, p)| json!({"name": format!("gpu-{i}"), "attributes": {"productName": {"string": p}}}))
        .collect();
    serde_json::from_value(
        json!({"metadata": {"name": format!("{node}-gpus")}, "spec": {
        "driver": "gpu.example.com", "nodeName": node,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}),
    )
    .unwrap()
}

fn h100s(node: &str, n: usize) -> k8s_openapi::api::resource::v1::ResourceSlice {
    slice(node, &vec!["H100"; n])
}

fn class() -> k8s_openapi::api::resource::v1::DeviceClass {
    serde_json::from_value(json!({"metadata": {"name": "gpu"}, "spec": {"selectors": [
        {"cel": {"expression": "device.driver == 'gpu.example.com'"}}]}}))
    .unwrap()
}

fn product(name: &str) -> Value {
    json!([{"cel": {"expression": format!("device.attributes['gpu.example.com'].productName == '{name}'")}}])
}

/// A claim for `count` GPUs of the class.
fn claim(name: &str, count: i64) -> k8s_openapi::api::resource::v1::ResourceClaim {
    claim_with(
        name,
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": count}}]),
    )
}

fn claim_with(name: &str, requests: Value) -> k8s_openapi::api::resource::v1::ResourceClaim {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": requests}}}))
    .unwrap()
}

/// A pod of ours in PodGroup `group`, using claim `claim`.
fn member(name: &str, group: &str, claim: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"}, "spec": {
        "schedulerName": "dra-scheduler", "schedulingGroup": {"podGroupName": group},
        "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}, "claims": [{"name": "gpu"}]}}]}}))
    .unwrap()
}

fn gang(name: &str, min_count: i32) -> PodGroup {
    pod_group(
        name,
        json!({"schedulingPolicy": {"gang": {"minCount": min_count}}}),
    )
}

fn pod_group(name: &str, spec: Value) -> PodGroup {
    serde_json::from_value(
        json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec}),
    )
    .unwrap()
}

fn keys(names: &[&str]) -> Vec<ObjectKey> {
    names
        .iter()
        .map(|n| ObjectKey::new("default", *n))
        .collect()
}

fn engine(input: ClusterInput) -> Engine {
    Engine::new(EngineConfig::default(), input)
}

fn scheduled(decision: GroupDecision) -> GroupPlacement {
    match decision {
        GroupDecision::Scheduled(p) => p,
        other => panic!("not scheduled: {other:?}"),
    }
}

/// pod → node and devices (`pool/device`), per placement.
fn placed(group: &GroupPlacement) -> Vec<(String, String, Vec<String>)> {
    let mut out: Vec<_> = group
        .placements
        .iter()
        .map(|p| {
            let devices = p
                .claims
                .iter()
                .flat_map(|c| c.allocation.iter())
                .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
                .map(|r| format!("{}/{}", r.pool, r.device))
                .collect();
            (p.pod.name.clone(), p.node.clone(), devices)
        })
        .collect();
    out.sort();
    out
}

fn allocated_claims(engine: &Engine) -> usize {
    engine
        .state()
        .claims
        .values()
        .filter(|c| {
            c.status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .is_some()
        })
        .count()
}

fn bound_pods(engine: &Engine) -> usize {
    engine
        .state()
        .pods
        .values()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
        .count()
}

/// kubernetes/kubernetes#138765 with plain requests: pod 1 takes any GPU, pod 2 only the
/// A100. First fit gives pod 1 the A100 and refuses pod 2; the joint search gives pod 1
/// the T4.
#[test]
fn an_earlier_members_gpu_is_chosen_again_so_the_second_member_gets_the_a100() {
    let input = ClusterInput {
        nodes: vec![node("n1", json!({}))],
        classes: vec![class()],
        slices: vec![slice("n1", &["A100", "T4"])],
        claims: vec![
            claim("any-gpu", 1),
            claim_with(
                "a100",
                json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "selectors": product("A100")}}]),
            ),
        ],
        pods: vec![member("p1", "g", "any-gpu"), member("p2", "g", "a100")],
        ..Default::default()
    };
    // What first fit does: pod 1 on the A100, then nothing for pod 2.
    let mut first_fit = engine(input.clone());
    let group = scheduled(first_fit.schedule_group(
        &pod_group("g", json!({"schedulingPolicy": {"basic": {}}})),
        &keys(&["p1", "p2"]),
    ));
    assert_eq!(
        placed(&group),
        [("p1".into(), "n1".into(), vec!["n1/gpu-0".to_string()])]
    );
    assert!(
        group.pending[0].1.contains("0/1 nodes are available"),
        "{:?}",
        group.pending
    );

    let mut e = engine(input);
    let group = scheduled(e.schedule_group(&gang("g", 2), &keys(&["p1", "p2"])));
    assert_eq!(
        placed(&group),
        [
            ("p1".into(), "n1".into(), vec!["n1/gpu-1".to_string()]),
            ("p2".into(), "n1".into(), vec!["n1/gpu-0".to_string()]),
        ]
    );
    assert!(group.pending.is_empty());
    assert_eq!(
        (allocated_claims(&e), bound_pods(&e)),
        (0, 0),
        "nothing assumed yet"
    );
    e.assume_group(&group);
    assert_eq!((allocated_claims(&e), bound_pods(&e)), (2, 2));
    e.forget_group(&group);
    assert_eq!(
        (allocated_claims(&e), bound_pods(&e)),
        (0, 0),
        "forgetting the group forgets every member"
    );
}

/// The issue's own case: pod 1 prefers the A100 and falls back to the T4 (firstAvailable),
/// pod 2 needs the A100. kube-scheduler 1.37 refuses it ("minCount (2) cannot be
/// satisfied: 1 scheduled"); both are placed here.
#[test]
fn the_first_available_gang_upstream_refuses_is_placed_with_pod_1_on_the_t4() {
    let mut e = engine(ClusterInput {
        nodes: vec![node("n1", json!({}))],
        classes: vec![class()],
        slices: vec![slice("n1", &["A100", "T4"])],
        claims: vec![
            claim_with(
                "a100-else-t4",
                json!([{"name": "gpu", "firstAvailable": [
                    {"name": "a100", "deviceClassName": "gpu", "selectors": product("A100")},
                    {"name": "t4", "deviceClassName": "gpu", "selectors": product("T4")}]}]),
            ),
            claim_with(
                "a100-only",
                json!([{"name": "gpu", "firstAvailable": [
                    {"name": "a100", "deviceClassName": "gpu", "selectors": product("A100")}]}]),
            ),
        ],
        pods: vec![
            member("p1", "g", "a100-else-t4"),
            member("p2", "g", "a100-only"),
        ],
        ..Default::default()
    });
    let group = scheduled(e.schedule_group(&gang("g", 2), &keys(&["p1", "p2"])));
    assert_eq!(
        placed(&group),
        [
            ("p1".into(), "n1".into(), vec!["n1/gpu-1".to_string()]),
            ("p2".into(), "n1".into(), vec!["n1/gpu-0".to_string()]),
        ]
    );
    let p1 = group
        .placements
        .iter()
        .find(|p| p.pod.name == "p1")
        .unwrap();
    let result = &p1.claims[0]
        .allocation
        .as_ref()
        .unwrap()
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap()[0];
    assert_eq!(result.request, "gpu/t4");
}

fn four_nodes(gpus: [usize; 4]) -> ClusterInput {
    let names = ["n1", "n2", "n3", "n4"];
    ClusterInput {
        nodes: names.iter().map(|n| node(n, json!({}))).collect(),
        classes: vec![class()],
        slices: names.iter().zip(gpus).map(|(n, g)| h100s(n, g)).collect(),
        claims: (1..=4).map(|i| claim(&format!("c{i}"), 2)).collect(),
        pods: (1..=4)
            .map(|i| member(&format!("p{i}"), "train", &format!("c{i}")))
            .collect(),
        ..Default::default()
    }
}

#[test]
fn four_pods_of_two_gpus_on_four_nodes_of_two_are_placed_whole() {
    let mut e = engine(four_nodes([2, 2, 2, 2]));
    let group = scheduled(e.schedule_group(&gang("train", 4), &keys(&["p1", "p2", "p3", "p4"])));
    let placed = placed(&group);
    assert_eq!(placed.len(), 4);
    let nodes: std::collections::BTreeSet<_> = placed.iter().map(|(_, n, _)| n.clone()).collect();
    assert_eq!(nodes.len(), 4, "one pod per node: {placed:?}");
    for (_, node, devices) in &placed {
        assert_eq!(devices, &[format!("{node}/gpu-0"), format!("{node}/gpu-1")]);
    }
    e.assume_group(&group);
    assert_eq!((allocated_claims(&e), bound_pods(&e)), (4, 4));
}

#[test]
fn one_gpu_short_no_member_is_placed_and_the_bound_says_what_is_missing() {
    let mut e = engine(four_nodes([2, 2, 2, 1]));
    let decision = e.schedule_group(&gang("train", 4), &keys(&["p1", "p2", "p3", "p4"]));
    assert!(decision.placements().is_empty());
    assert_eq!(
        decision.message(),
        Some(
            "PodGroup default/train: minCount (4) cannot be satisfied: 4 pods need 8 devices of DeviceClass gpu; 7 are free"
        )
    );
    assert_eq!((allocated_claims(&e), bound_pods(&e)), (0, 0));

    // Enough GPUs in total, but not two free on one node for the fourth pod.
    let mut e = engine(four_nodes([3, 2, 2, 1]));
    let decision = e.schedule_group(&gang("train", 4), &keys(&["p1", "p2", "p3", "p4"]));
    assert_eq!(
        decision.message(),
        Some(
            "PodGroup default/train: minCount (4) cannot be satisfied: 4 pods need at least 2 devices of DeviceClass gpu each, on one node; the nodes' free devices hold 3 such pods (the most free on a node: 3)"
        )
    );
}

#[test]
fn a_gang_with_min_count_below_its_size_places_what_fits_and_leaves_the_rest_pending() {
    let mut e = engine(four_nodes([2, 2, 2, 1]));
    let group = scheduled(e.schedule_group(&gang("train", 3), &keys(&["p1", "p2", "p3", "p4"])));
    assert_eq!(group.placements.len(), 3);
    assert_eq!(group.pending.len(), 1);
    assert!(
        group.pending[0].1.contains("cannot allocate")
            || group.pending[0].1.contains("0/4 nodes are available"),
        "{:?}",
        group.pending
    );
}

#[test]
fn two_competing_gangs_with_room_for_one_place_exactly_one_whole() {
    let mut input = ClusterInput {
        nodes: vec![node("n1", json!({})), node("n2", json!({}))],
        classes: vec![class()],
        slices: vec![h100s("n1", 2), h100s("n2", 2)],
        ..Default::default()
    };
    for g in ["a", "b"] {
        for i in 1..=2 {
            input.claims.push(claim(&format!("{g}{i}"), 2));
            input
                .pods
                .push(member(&format!("{g}{i}"), g, &format!("{g}{i}")));
        }
    }
    let mut e = engine(input);
    let a = scheduled(e.schedule_group(&gang("a", 2), &keys(&["a1", "a2"])));
    e.assume_group(&a);
    let b = e.schedule_group(&gang("b", 2), &keys(&["b1", "b2"]));
    assert_eq!(
        b.message(),
        Some(
            "PodGroup default/b: minCount (2) cannot be satisfied: 2 pods need 4 devices of DeviceClass gpu; 0 are free"
        )
    );
    assert_eq!((allocated_claims(&e), bound_pods(&e)), (2, 2));
    let bound: Vec<_> = e
        .state()
        .pods
        .values()
        .filter(|p| p.spec.as_ref().unwrap().node_name.is_some())
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    assert!(bound.iter().all(|n| n.starts_with('a')), "{bound:?}");
}

#[test]
fn a_gang_that_fails_in_the_search_unwinds_every_member() {
    // Enough GPUs on enough nodes, but the pods do not fit for CPU: the counting bound
    // passes and the search finds room for 2 of 3.
    let mut input = four_nodes([2, 2, 0, 0]);
    input.nodes.truncate(2);
    input.slices.truncate(2);
    input.nodes.push(node("n3", json!({})));
    input.slices.push(h100s("n3", 2));
    input.nodes[2]
        .status
        .as_mut()
        .unwrap()
        .allocatable
        .as_mut()
        .unwrap()
        .insert(
            "cpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("500m".into()),
        );
    let mut e = engine(input);
    let decision = e.schedule_group(&gang("train", 3), &keys(&["p1", "p2", "p3"]));
    let message = decision.message().unwrap();
    assert!(
        message.starts_with("PodGroup default/train: minCount (3) cannot be satisfied: 2 of 3 pending pods can be placed at once; pod default/p3: 0/3 nodes are available:"),
        "{message}"
    );
    assert_eq!((allocated_claims(&e), bound_pods(&e)), (0, 0));
}

fn racks() -> ClusterInput {
    // rack-a: two nodes of 8 GPUs; rack-b: two nodes of 4; rack-c: one node of 8.
    let nodes = [
        ("a1", "rack-a", 8),
        ("a2", "rack-a", 8),
        ("b1", "rack-b", 4),
        ("b2", "rack-b", 4),
        ("c1", "rack-c", 8),
    ];
    ClusterInput {
        nodes: nodes
            .iter()
            .map(|(n, r, _)| node(n, json!({"topology.kubernetes.io/rack": r})))
            .collect(),
        classes: vec![class()],
        slices: nodes.iter().map(|(n, _, g)| h100s(n, *g)).collect(),
        ..Default::default()
    }
}

fn rack_gang(input: &mut ClusterInput, pods: usize, gpus: i64) -> Vec<ObjectKey> {
    let mut names = Vec::new();
    for i in 1..=pods {
        let name = format!("w{i}");
        input.claims.push(claim(&name, gpus));
        input.pods.push(member(&name, "ring", &name));
        names.push(name);
    }
    keys(&names.iter().map(String::as_str).collect::<Vec<_>>())
}

fn ring(min_count: i32) -> PodGroup {
    pod_group(
        "ring",
        json!({"schedulingPolicy": {"gang": {"minCount": min_count}},
            "schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/rack"}]}}),
    )
}

#[test]
fn a_rack_constrained_gang_goes_to_the_rack_where_it_fits_best() {
    // 2 pods x 4 GPUs fit in every rack; rack-b (8 free) is the tightest.
    let mut input = racks();
    let members = rack_gang(&mut input, 2, 4);
    let group = scheduled(engine(input).schedule_group(&ring(2), &members));
    assert_eq!(
        group.domain.as_deref(),
        Some("topology.kubernetes.io/rack=rack-b")
    );
    let nodes: Vec<_> = placed(&group).into_iter().map(|(_, n, _)| n).collect();
    assert_eq!(nodes, ["b1", "b2"]);

    // 2 pods x 8 GPUs: only rack-a holds them (rack-c has 8 free in all, rack-b no node of 8).
    let mut input = racks();
    let members = rack_gang(&mut input, 2, 8);
    let group = scheduled(engine(input).schedule_group(&ring(2), &members));
    assert_eq!(
        group.domain.as_deref(),
        Some("topology.kubernetes.io/rack=rack-a")
    );

    // 3 pods x 8 with minCount 2: rack-a holds two of them; the third stays pending.
    let mut input = racks();
    let members = rack_gang(&mut input, 3, 8);
    let group = scheduled(engine(input).schedule_group(&ring(2), &members));
    assert_eq!(
        group.domain.as_deref(),
        Some("topology.kubernetes.io/rack=rack-a")
    );
    assert_eq!((group.placements.len(), group.pending.len()), (2, 1));

    // With minCount 3: no rack.
    let mut input = racks();
    let members = rack_gang(&mut input, 3, 8);
    let decision = engine(input).schedule_group(&ring(3), &members);
    assert_eq!(
        decision.message(),
        Some(
            "PodGroup default/ring: minCount (3) cannot be satisfied in one domain of schedulingConstraints.topology (topology.kubernetes.io/rack) among 3 domains: topology.kubernetes.io/rack=rack-a: 3 pods need 24 devices of DeviceClass gpu; 16 are free; topology.kubernetes.io/rack=rack-b: 3 pods need 24 devices of DeviceClass gpu; 8 are free; topology.kubernetes.io/rack=rack-c: 3 pods need 24 devices of DeviceClass gpu; 8 are free"
        )
    );
}

#[test]
fn composite_groups_are_refused_by_name() {
    let mut input = four_nodes([2, 2, 2, 2]);
    input.pods.truncate(1);
    let mut e = engine(input);
    let child = pod_group(
        "train",
        json!({"schedulingPolicy": {"gang": {"minCount": 1}}, "parentCompositePodGroupName": "job"}),
    );
    assert_eq!(
        e.schedule_group(&child, &keys(&["p1"])).message(),
        Some(
            "PodGroup default/train: spec.parentCompositePodGroupName: composite PodGroups are not supported by dra-scheduler yet"
        )
    );
    assert_eq!(bound_pods(&e), 0);
}

/// A member using claim `own` for its GPU and, under the entry name `entry`, the claim
/// `fabric` (the PodGroup lists `fabric` under the entry name `fabric`).
fn fabric_member(name: &str, own: &str, entry: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")}, "spec": {
        "schedulerName": "dra-scheduler", "schedulingGroup": {"podGroupName": "train"},
        "resourceClaims": [{"name": "gpu", "resourceClaimName": own},
                           {"name": entry, "resourceClaimName": "fabric"}],
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"},
            "claims": [{"name": "gpu"}, {"name": entry}]}}]}}))
    .unwrap()
}

#[test]
fn a_claim_the_podgroup_lists_is_allocated_once_reserved_for_the_group_and_shared_on_one_node() {
    let input = ClusterInput {
        nodes: vec![node("n1", json!({})), node("n2", json!({}))],
        classes: vec![class()],
        // 3 GPUs a node: the fabric device and one for each member.
        slices: vec![h100s("n1", 3), h100s("n2", 3)],
        claims: vec![claim("c1", 1), claim("c2", 1), claim("fabric", 1)],
        pods: vec![
            fabric_member("p1", "c1", "fabric"),
            fabric_member("p2", "c2", "fabric"),
        ],
        ..Default::default()
    };
    let mut e = engine(input);
    let group: PodGroup = serde_json::from_value(json!({
        "metadata": {"name": "train", "namespace": "default", "uid": "uid-train"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 2}},
                 "resourceClaims": [{"name": "fabric", "resourceClaimName": "fabric"}]}}))
    .unwrap();
    let placed_group = scheduled(e.schedule_group(&group, &keys(&["p1", "p2"])));
    let placed = placed(&placed_group);
    assert_eq!(placed.len(), 2);
    assert_eq!(
        placed[0].1, placed[1].1,
        "the shared device holds both on one node: {placed:?}"
    );
    let fabric: Vec<_> = placed_group
        .placements
        .iter()
        .flat_map(|p| p.claims.iter().filter(|c| c.key.name == "fabric"))
        .collect();
    assert_eq!(fabric.len(), 2);
    assert_eq!(
        fabric.iter().filter(|c| c.allocation.is_some()).count(),
        1,
        "allocated once"
    );
    for decision in &fabric {
        let consumer = decision
            .consumer
            .as_ref()
            .expect("reserved for the PodGroup");
        assert_eq!(
            (
                consumer.api_group.as_deref(),
                consumer.resource.as_str(),
                consumer.name.as_str(),
                consumer.uid.as_str()
            ),
            (Some("scheduling.k8s.io"), "podgroups", "train", "uid-train")
        );
    }
    e.assume_group(&placed_group);
    let claim = &e.state().claims[&ObjectKey::new("default", "fabric")];
    let reserved = claim.status.as_ref().unwrap().reserved_for.clone().unwrap();
    assert_eq!(reserved.len(), 1, "one entry, the PodGroup's: {reserved:?}");
    assert_eq!(reserved[0].resource, "podgroups");
    let own = &e.state().claims[&ObjectKey::new("default", "c1")];
    let own_reserved = own.status.as_ref().unwrap().reserved_for.clone().unwrap();
    assert_eq!(
        (
            own_reserved[0].resource.as_str(),
            own_reserved[0].uid.as_str()
        ),
        ("pods", "uid-p1")
    );
    e.forget_group(&placed_group);
    let claim = &e.state().claims[&ObjectKey::new("default", "fabric")];
    let status = claim.status.clone().unwrap_or_default();
    assert!(status.allocation.is_none(), "given back");
    assert!(status.reserved_for.unwrap_or_default().is_empty());
}

#[test]
fn a_claim_used_under_another_entry_name_than_the_podgroups_is_the_pods_own() {
    let input = ClusterInput {
        nodes: vec![node("n1", json!({}))],
        classes: vec![class()],
        slices: vec![h100s("n1", 2)],
        claims: vec![claim("c1", 1), claim("fabric", 1)],
        pods: vec![fabric_member("p1", "c1", "net")],
        ..Default::default()
    };
    let mut e = engine(input);
    let group: PodGroup = serde_json::from_value(json!({
        "metadata": {"name": "train", "namespace": "default", "uid": "uid-train"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 1}},
                 "resourceClaims": [{"name": "fabric", "resourceClaimName": "fabric"}]}}))
    .unwrap();
    let placed_group = scheduled(e.schedule_group(&group, &keys(&["p1"])));
    let fabric = placed_group.placements[0]
        .claims
        .iter()
        .find(|c| c.key.name == "fabric")
        .unwrap();
    assert!(
        fabric.consumer.is_none(),
        "upstream's BindTo matches the entry name too"
    );
}

#[test]
fn a_gang_waits_for_its_members_and_a_plain_cycle_still_refuses_a_member() {
    let mut input = four_nodes([2, 2, 2, 2]);
    input.pods.truncate(3);
    let mut e = engine(input);
    assert_eq!(
        e.schedule_group(&gang("train", 4), &keys(&["p1", "p2", "p3"]))
            .message(),
        Some(
            "PodGroup default/train: waiting for members: minCount is 4, 3 pods of the group exist"
        )
    );
    let decision = e.schedule(&ObjectKey::new("default", "p1"));
    assert!(matches!(decision, Decision::Unschedulable { .. }));
    assert!(decision.message().unwrap().contains("spec.schedulingGroup"));
}

#[test]
fn a_group_out_of_budget_says_so() {
    let mut e = engine(four_nodes([2, 2, 2, 2]));
    let decision = e.schedule_group_with(
        &gang("train", 4),
        &keys(&["p1", "p2", "p3", "p4"]),
        Duration::ZERO,
        None,
    );
    assert_eq!(
        decision.message(),
        Some(
            "PodGroup default/train: the joint search ran past its budget of 0ns with 0 of 4 members placed (minCount 4)"
        )
    );
}

#[test]
fn a_gang_packs_onto_the_fewest_nodes_and_leaves_the_big_node_whole_for_the_next_group() {
    let input = ClusterInput {
        nodes: ["n1", "n2", "n3"]
            .iter()
            .map(|n| node(n, json!({})))
            .collect(),
        classes: vec![class()],
        // n1 and n2 have 8 GPUs, n3 has 4.
        slices: vec![h100s("n1", 8), h100s("n2", 8), h100s("n3", 4)],
        claims: (1..=4).map(|i| claim(&format!("c{i}"), 2)).collect(),
        pods: (1..=4)
            .map(|i| member(&format!("p{i}"), "train", &format!("c{i}")))
            .collect(),
        ..Default::default()
    };
    let mut e = engine(input);
    // Two pods of 2: both on n3, the node they fill, not one on each of two big nodes.
    let small = scheduled(e.schedule_group(&gang("train", 2), &keys(&["p1", "p2"])));
    let nodes: Vec<String> = placed(&small).into_iter().map(|(_, n, _)| n).collect();
    assert_eq!(nodes, ["n3", "n3"]);
    e.assume_group(&small);
    // The next two pods of 2 go together onto one of the 8-GPU nodes, the other stays whole.
    let next = scheduled(e.schedule_group(&gang("train", 4), &keys(&["p3", "p4"])));
    let nodes: Vec<String> = placed(&next).into_iter().map(|(_, n, _)| n).collect();
    assert_eq!(nodes.len(), 2);
    assert_eq!(nodes[0], nodes[1], "one node, not two: {nodes:?}");
}

#[test]
fn members_of_another_priority_than_the_group_are_an_error_that_names_them() {
    let mut input = four_nodes([2, 2, 2, 2]);
    input.pods[1].spec.as_mut().unwrap().priority = Some(100);
    let mut e = engine(input);
    let decision = e.schedule_group(&gang("train", 2), &keys(&["p1", "p2"]));
    assert!(
        matches!(decision, GroupDecision::Error { .. }),
        "{decision:?}"
    );
    assert_eq!(
        decision.message(),
        Some(
            "PodGroup default/train: all its pods must have the group's priority 0; pod default/p2 has 100"
        )
    );
    let with_priority = pod_group(
        "train",
        json!({"schedulingPolicy": {"gang": {"minCount": 1}}, "priority": 100}),
    );
    assert!(matches!(
        e.schedule_group(&with_priority, &keys(&["p2"])),
        GroupDecision::Scheduled(_)
    ));
}
