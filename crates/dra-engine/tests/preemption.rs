//! Preemption that frees devices (`Engine::preempt`): which pods are evicted, shared claims,
//! `preemptionPolicy: Never`, PodDisruptionBudgets, PodGroups evicted whole, and the hold
//! on freed devices for the nominated pod (`Engine::nominate`).

use std::collections::BTreeSet;
use std::time::Duration;

use dra_engine::{ClusterInput, Decision, Engine, EngineConfig, ObjectKey, Preemption};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{Value, json};

const BUDGET: Duration = Duration::from_secs(10);

fn node(name: &str) -> k8s_openapi::api::core::v1::Node {
    serde_json::from_value(json!({"metadata": {"name": name},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}}}))
    .unwrap()
}

/// A slice with `n` GPUs on `node`, in pool `node`.
fn gpus(node: &str, n: usize) -> k8s_openapi::api::resource::v1::ResourceSlice {
    let devices: Vec<Value> = (0..n)
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

/// A claim for `count` GPUs, not allocated.
fn claim(name: &str, count: i64) -> ResourceClaim {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": count}}]}}}))
    .unwrap()
}

/// A claim for one GPU, allocated `node/device` and reserved for `users`.
fn allocated(name: &str, node: &str, device: &str, users: &[&str]) -> ResourceClaim {
    let mut c = claim(name, 1);
    let reserved: Vec<Value> = users
        .iter()
        .map(|u| json!({"resource": "pods", "name": u, "uid": format!("uid-{u}")}))
        .collect();
    c.status = Some(
        serde_json::from_value(json!({
            "allocation": {"devices": {"results": [{"request": "gpu",
                "driver": "gpu.example.com", "pool": node, "device": device}]}},
            "reservedFor": reserved}))
        .unwrap(),
    );
    c
}

/// A pod with `claim` (if any); `started` is its start time's second within the minute.
struct PodSpec<'a> {
    name: &'a str,
    priority: i32,
    claim: Option<&'a str>,
    node: Option<&'a str>,
    started: u32,
    extra: Value,
}

fn pod(spec: PodSpec<'_>) -> Pod {
    let claims: Vec<Value> = spec
        .claim
        .into_iter()
        .map(|c| json!({"name": "gpu", "resourceClaimName": c}))
        .collect();
    let mut v = json!({
        "metadata": {"name": spec.name, "namespace": "default", "uid": format!("uid-{}", spec.name),
            "labels": {"app": spec.name}},
        "spec": {"schedulerName": "dra-scheduler", "priority": spec.priority,
            "resourceClaims": claims,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
        "status": {"startTime": format!("2026-01-01T00:00:{:02}Z", spec.started)}});
    if let Some(node) = spec.node {
        v["spec"]["nodeName"] = json!(node);
    }
    merge(&mut v, spec.extra);
    serde_json::from_value(v).unwrap()
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// A bound pod of priority `priority` using one GPU of `node` through its own claim.
fn running(
    name: &str,
    node: &str,
    device: &str,
    priority: i32,
    started: u32,
) -> (Pod, ResourceClaim) {
    let claim_name = format!("{name}-gpu");
    (
        pod(PodSpec {
            name,
            priority,
            claim: Some(&claim_name),
            node: Some(node),
            started,
            extra: json!({}),
        }),
        allocated(&claim_name, node, device, &[name]),
    )
}

/// A pending pod asking for `gpus` GPUs through claim `<name>-gpu`.
fn pending(name: &str, priority: i32, gpus: i64) -> (Pod, ResourceClaim) {
    let claim_name = format!("{name}-gpu");
    (
        pod(PodSpec {
            name,
            priority,
            claim: Some(&claim_name),
            node: None,
            started: 0,
            extra: json!({}),
        }),
        claim(&claim_name, gpus),
    )
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new("default", name)
}

struct Cluster {
    input: ClusterInput,
}

impl Cluster {
    fn new(nodes: &[(&str, usize)]) -> Cluster {
        Cluster {
            input: ClusterInput {
                nodes: nodes.iter().map(|(n, _)| node(n)).collect(),
                slices: nodes.iter().map(|(n, g)| gpus(n, *g)).collect(),
                classes: vec![class()],
                ..Default::default()
            },
        }
    }

    fn with(mut self, (pod, claim): (Pod, ResourceClaim)) -> Cluster {
        self.input.pods.push(pod);
        self.input.claims.push(claim);
        self
    }

    fn with_pod(mut self, pod: Pod) -> Cluster {
        self.input.pods.push(pod);
        self
    }

    fn with_claim(mut self, claim: ResourceClaim) -> Cluster {
        self.input.claims.push(claim);
        self
    }

    fn engine(self) -> Engine {
        Engine::new(EngineConfig::default(), self.input)
    }
}

/// A node with four GPUs, each used by a priority-0 pod started at 0 s, 10 s, 20 s, 30 s
/// (`batch-0` oldest).
fn full_node() -> Cluster {
    let mut c = Cluster::new(&[("n1", 4)]);
    for i in 0..4 {
        c = c.with(running(
            &format!("batch-{i}"),
            "n1",
            &format!("gpu-{i}"),
            0,
            i * 10,
        ));
    }
    c
}

fn victims(p: &Preemption) -> Vec<String> {
    let mut v: Vec<String> = p.victims.iter().map(|v| v.pod.name.clone()).collect();
    v.sort();
    v
}

fn devices(placement: &dra_engine::Placement) -> Vec<String> {
    let mut d: Vec<String> = placement
        .claims
        .iter()
        .flat_map(|c| c.allocation.iter())
        .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
        .map(|r| format!("{}/{}", r.pool, r.device))
        .collect();
    d.sort();
    d
}

#[test]
fn a_pod_asking_two_gpus_of_a_full_node_evicts_exactly_the_two_youngest() {
    let mut e = full_node().with(pending("urgent", 1000, 2)).engine();
    assert!(matches!(
        e.schedule(&key("urgent")),
        Decision::Unschedulable { .. }
    ));
    let p = e.preempt(&key("urgent"), BUDGET, &[]).unwrap();
    assert_eq!(p.node, "n1");
    assert_eq!(victims(&p), ["batch-2", "batch-3"]);
    assert_eq!(devices(&p.placement), ["n1/gpu-2", "n1/gpu-3"]);
    assert_eq!(p.victims[0].freed_claims, [key("batch-2-gpu")]);
    assert_eq!(p.victims[0].uid.as_deref(), Some("uid-batch-2"));
    assert_eq!(
        p.message,
        "preempting 2 pods on n1 (default/batch-2, default/batch-3) for 2 devices of DeviceClass gpu"
    );
    // Nothing changed: the victims still run, their claims still hold their devices.
    assert!(e.state().pods.contains_key(&key("batch-3")));
    assert!(matches!(
        e.schedule(&key("urgent")),
        Decision::Unschedulable { .. }
    ));
}

#[test]
fn after_the_victims_are_evicted_the_pod_fits_where_it_was_nominated() {
    let mut e = full_node().with(pending("urgent", 1000, 2)).engine();
    let p = e.preempt(&key("urgent"), BUDGET, &[]).unwrap();
    e.evict(&p);
    assert!(!e.state().pods.contains_key(&key("batch-2")));
    let freed = &e.state().claims[&key("batch-2-gpu")];
    assert!(freed.status.as_ref().unwrap().allocation.is_none());
    let Decision::Scheduled(placed) = e.schedule(&key("urgent")) else {
        panic!("urgent does not fit after the eviction")
    };
    assert_eq!(devices(&placed), ["n1/gpu-2", "n1/gpu-3"]);
}

#[test]
fn a_shared_claim_is_not_freed_by_evicting_only_its_low_priority_co_user() {
    // gpu-0 is one claim shared by a priority-2000 pod and a priority-0 pod; gpu-1 is a
    // priority-0 pod's own.
    let cluster = || {
        Cluster::new(&[("n1", 2)])
            .with_claim(allocated("shared", "n1", "gpu-0", &["keeper", "co-user"]))
            .with_pod(pod(PodSpec {
                name: "keeper",
                priority: 2000,
                claim: Some("shared"),
                node: Some("n1"),
                started: 0,
                extra: json!({}),
            }))
            .with_pod(pod(PodSpec {
                name: "co-user",
                priority: 0,
                claim: Some("shared"),
                node: Some("n1"),
                started: 30,
                extra: json!({}),
            }))
            .with(running("alone", "n1", "gpu-1", 0, 10))
    };
    // Two GPUs: evicting both low-priority pods frees only gpu-1.
    let mut e = cluster().with(pending("urgent", 1000, 2)).engine();
    let err = e.preempt(&key("urgent"), BUDGET, &[]).unwrap_err();
    assert_eq!(
        err,
        "no node: the 1 device on n1 is held by pods of priority 1000 or higher (default/keeper)"
    );
    // One GPU: only the pod whose claim is its own is evicted; the co-user would free nothing.
    let mut e = cluster().with(pending("urgent", 1000, 1)).engine();
    let p = e.preempt(&key("urgent"), BUDGET, &[]).unwrap();
    assert_eq!(victims(&p), ["alone"]);
    assert_eq!(devices(&p.placement), ["n1/gpu-1"]);
}

#[test]
fn devices_held_by_higher_priority_pods_are_named() {
    let mut e = Cluster::new(&[("n1", 2)])
        .with(running("a", "n1", "gpu-0", 1000, 0))
        .with(running("b", "n1", "gpu-1", 5000, 0))
        .with(pending("urgent", 1000, 1))
        .engine();
    assert_eq!(
        e.preempt(&key("urgent"), BUDGET, &[]).unwrap_err(),
        "no node: n1 has no pods of priority below 1000"
    );
    let mut e = Cluster::new(&[("n1", 2)])
        .with(running("low", "n1", "gpu-0", 0, 0))
        .with(running("b", "n1", "gpu-1", 5000, 0))
        .with(pending("urgent", 1000, 2))
        .engine();
    assert_eq!(
        e.preempt(&key("urgent"), BUDGET, &[]).unwrap_err(),
        "no node: the 1 device on n1 is held by pods of priority 1000 or higher (default/b)"
    );
}

#[test]
fn a_pod_with_preemption_policy_never_evicts_nothing() {
    let (mut urgent, claim) = pending("urgent", 1000, 2);
    urgent.spec.as_mut().unwrap().preemption_policy = Some("Never".into());
    let mut e = full_node().with((urgent, claim)).engine();
    assert_eq!(
        e.preempt(&key("urgent"), BUDGET, &[]).unwrap_err(),
        "preemptionPolicy is Never"
    );
}

#[test]
fn preemption_can_be_turned_off() {
    let mut cluster = full_node().with(pending("urgent", 1000, 2));
    let config = EngineConfig {
        preemption: false,
        ..Default::default()
    };
    let mut e = Engine::new(config, std::mem::take(&mut cluster.input));
    assert_eq!(
        e.preempt(&key("urgent"), BUDGET, &[]).unwrap_err(),
        "preemption is disabled"
    );
    let mut profile = dra_engine::Profile::default();
    profile.disable("DefaultPreemption");
    let config = EngineConfig {
        profile,
        ..Default::default()
    };
    let mut e = Engine::new(config, full_node().with(pending("urgent", 1000, 2)).input);
    assert!(
        e.preempt(&key("urgent"), BUDGET, &[])
            .unwrap_err()
            .starts_with("preemption is disabled")
    );
}

fn pdb(app: &str, allowed: i32) -> k8s_openapi::api::policy::v1::PodDisruptionBudget {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{app}-pdb"), "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": app}}},
        "status": {"disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1,
            "expectedPods": 1}}))
    .unwrap()
}

#[test]
fn a_pod_disruption_budget_steers_preemption_to_the_other_node() {
    // a on n1 is younger than b on n2, so without a budget n1 is chosen.
    let cluster = || {
        Cluster::new(&[("n1", 1), ("n2", 1)])
            .with(running("a", "n1", "gpu-0", 0, 30))
            .with(running("b", "n2", "gpu-0", 0, 10))
            .with(pending("urgent", 1000, 1))
    };
    let mut e = cluster().engine();
    let p = e.preempt(&key("urgent"), BUDGET, &[]).unwrap();
    assert_eq!(
        (p.node.as_str(), victims(&p)),
        ("n1", vec!["a".to_string()])
    );
    assert_eq!(p.pdb_violations, 0);
    let mut e = cluster().engine();
    let p = e.preempt(&key("urgent"), BUDGET, &[pdb("a", 0)]).unwrap();
    assert_eq!(
        (p.node.as_str(), victims(&p)),
        ("n2", vec!["b".to_string()])
    );
    // With budgets on both, a violation cannot be avoided: it is counted.
    let mut e = cluster().engine();
    let p = e
        .preempt(&key("urgent"), BUDGET, &[pdb("a", 0), pdb("b", 0)])
        .unwrap();
    assert_eq!(p.pdb_violations, 1);
}

#[test]
fn a_gang_member_is_evicted_with_its_whole_group() {
    let member = |name: &str, node: &str| {
        let (mut pod, claim) = running(name, node, "gpu-0", 0, 0);
        pod.spec.as_mut().unwrap().scheduling_group =
            Some(serde_json::from_value(json!({"podGroupName": "training"})).unwrap());
        (pod, claim)
    };
    let cluster = || {
        Cluster::new(&[("n1", 1), ("n2", 1)])
            .with(member("worker-0", "n1"))
            .with(member("worker-1", "n2"))
            .with(pending("urgent", 1000, 1))
    };
    let mut e = cluster().engine();
    let p = e.preempt(&key("urgent"), BUDGET, &[]).unwrap();
    assert_eq!(victims(&p), ["worker-0", "worker-1"]);
    assert_eq!(
        p.message,
        format!(
            "preempting 2 pods on {} (default/worker-0{}, default/worker-1{}) for 1 device of DeviceClass gpu",
            p.node,
            if p.node == "n1" { "" } else { " on n1" },
            if p.node == "n2" { "" } else { " on n2" },
        )
    );
    // A PodGroup whose members may be disrupted one by one loses only one.
    let group: k8s_openapi::api::scheduling::v1beta1::PodGroup = serde_json::from_value(json!({
        "metadata": {"name": "training", "namespace": "default"},
        "spec": {"disruptionMode": {"single": {}},
            "schedulingPolicy": {"gang": {"minCount": 1}}}}))
    .unwrap();
    let mut e = cluster().engine();
    let p = e
        .preempt_with_groups(&key("urgent"), BUDGET, &[], &[group])
        .unwrap();
    assert_eq!(p.victims.len(), 1);
}

#[test]
fn freed_devices_are_held_for_the_nominated_pod_only() {
    let mut e = full_node()
        .with(pending("urgent", 1000, 2))
        .with(pending("same-priority", 1000, 1))
        .with(pending("lower", 500, 1))
        .with(pending("higher", 2000, 1))
        .engine();
    let p = e.preempt(&key("urgent"), BUDGET, &[]).unwrap();
    e.nominate(&p);
    assert_eq!(e.nominated_node(&key("urgent")), Some("n1"));
    e.evict(&p);
    // The victims are gone, their GPUs are free, yet pods of lower or equal priority
    // cannot take them.
    for other in ["lower", "same-priority"] {
        assert!(
            matches!(e.schedule(&key(other)), Decision::Unschedulable { .. }),
            "{other} took a held device"
        );
    }
    // A pod of higher priority may (kube-scheduler's nominated pods count only for pods
    // of lower or equal priority).
    assert!(matches!(e.schedule(&key("higher")), Decision::Scheduled(_)));
    // The nominated pod sees them free.
    let Decision::Scheduled(placed) = e.schedule(&key("urgent")) else {
        panic!("the nominated pod does not fit")
    };
    assert_eq!(devices(&placed), ["n1/gpu-2", "n1/gpu-3"]);
    // Released: anyone may take them.
    e.release_nomination(&key("urgent"));
    assert!(matches!(e.schedule(&key("lower")), Decision::Scheduled(_)));
    // Assuming the nominated pod ends its hold: its claims hold the devices now.
    e.nominate(&p);
    e.assume(&placed);
    assert_eq!(e.nominated_node(&key("urgent")), None);
    assert!(matches!(
        e.schedule(&key("lower")),
        Decision::Unschedulable { .. }
    ));
}

#[test]
fn a_pod_that_fits_or_is_bound_does_not_preempt() {
    let mut e = Cluster::new(&[("n1", 2)])
        .with(running("low", "n1", "gpu-0", 0, 0))
        .with(pending("urgent", 1000, 1))
        .engine();
    assert_eq!(
        e.preempt(&key("urgent"), BUDGET, &[]).unwrap_err(),
        "pod default/urgent fits on node n1 without preemption"
    );
    assert_eq!(
        e.preempt(&key("low"), BUDGET, &[]).unwrap_err(),
        "pod default/low is already bound to node n1"
    );
}

// A PodGroup as preemptor (`Engine::preempt_group`).

type PodGroup = k8s_openapi::api::scheduling::v1beta1::PodGroup;

/// A gang PodGroup `name` of `min_count`, with `extra` merged into its spec.
fn gang(name: &str, min_count: i32, extra: Value) -> PodGroup {
    let mut v = json!({"metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}});
    merge(&mut v["spec"], extra);
    serde_json::from_value(v).unwrap()
}

fn in_group(mut pod: Pod, group: &str) -> Pod {
    pod.spec.as_mut().unwrap().scheduling_group =
        Some(serde_json::from_value(json!({"podGroupName": group})).unwrap());
    pod
}

/// A pending member of PodGroup `group` asking for `gpus` GPUs.
fn member(name: &str, group: &str, priority: i32, gpus: i64) -> (Pod, ResourceClaim) {
    let (pod, claim) = pending(name, priority, gpus);
    (in_group(pod, group), claim)
}

fn group_victims(p: &dra_engine::GroupPreemption) -> Vec<String> {
    let mut v: Vec<String> = p.victims.iter().map(|v| v.pod.name.clone()).collect();
    v.sort();
    v
}

/// Each member placed: (member, node, its victims).
fn members_placed(p: &dra_engine::GroupPreemption) -> Vec<(String, String, Vec<String>)> {
    let mut m: Vec<(String, String, Vec<String>)> = p
        .preemptions
        .iter()
        .map(|x| (x.pod.name.clone(), x.node.clone(), victims(x)))
        .collect();
    m.sort();
    m
}

/// Nodes of 2 GPUs, each `(name, pods)` running that many priority-0 one-GPU pods
/// (`<node>-0` started at 0 s, `<node>-1` at 10 s); and a pending gang `train` of two
/// priority-1000 members, each asking 2 GPUs.
fn gang_cluster(nodes: &[(&str, u32)]) -> Cluster {
    let mut c = Cluster::new(&nodes.iter().map(|(n, _)| (*n, 2)).collect::<Vec<_>>());
    for (n, pods) in nodes {
        for i in 0..*pods {
            c = c.with(running(
                &format!("{n}-{i}"),
                n,
                &format!("gpu-{i}"),
                0,
                i * 10,
            ));
        }
    }
    c.with(member("train-0", "train", 1000, 2))
        .with(member("train-1", "train", 1000, 2))
}

fn train() -> (PodGroup, [ObjectKey; 2]) {
    (
        gang("train", 2, json!({})),
        [key("train-0"), key("train-1")],
    )
}

#[test]
fn a_gang_on_two_full_nodes_evicts_exactly_their_four_pods() {
    let mut e = gang_cluster(&[("n1", 2), ("n2", 2)]).engine();
    let (group, members) = train();
    assert!(e.schedule_group(&group, &members).message().is_some());
    let p = e.preempt_group(&group, &members, BUDGET, &[], &[]).unwrap();
    assert_eq!(p.group, key("train"));
    assert_eq!(group_victims(&p), ["n1-0", "n1-1", "n2-0", "n2-1"]);
    let placed = members_placed(&p);
    let mut nodes: Vec<&str> = placed.iter().map(|(_, n, _)| n.as_str()).collect();
    nodes.sort();
    assert_eq!(nodes, ["n1", "n2"]);
    for (_, node, victims) in &placed {
        assert_eq!(victims, &[format!("{node}-0"), format!("{node}-1")]);
    }
    assert_eq!(p.pdb_violations, 0);
    assert_eq!(
        p.message,
        "preempting 4 pods (default/n1-0 on n1, default/n1-1 on n1, default/n2-0 on n2, default/n2-1 on n2) for 4 devices of DeviceClass gpu for PodGroup default/train: 2 members to n1 and n2"
    );
    // Nothing changed.
    assert!(e.state().pods.contains_key(&key("n1-0")));
    assert!(e.schedule_group(&group, &members).message().is_some());
}

#[test]
fn a_gang_evicts_the_fewest_pods_and_takes_the_spare_gpu() {
    // n1 and n2 are full; n3 has one pod and one GPU free. Each member needs a whole
    // node: n3 (one eviction) and one of n1, n2 (two), not n1 and n2 (four).
    let mut e = gang_cluster(&[("n1", 2), ("n2", 2), ("n3", 1)]).engine();
    let (group, members) = train();
    let p = e.preempt_group(&group, &members, BUDGET, &[], &[]).unwrap();
    assert_eq!(group_victims(&p), ["n2-0", "n2-1", "n3-0"]);
    let placed = members_placed(&p);
    let nodes: BTreeSet<&str> = placed.iter().map(|(_, n, _)| n.as_str()).collect();
    assert_eq!(nodes, BTreeSet::from(["n2", "n3"]));
    for (_, node, v) in &placed {
        let expected: Vec<String> = group_victims(&p)
            .into_iter()
            .filter(|name| name.starts_with(node.as_str()))
            .collect();
        assert_eq!(v, &expected);
    }
    // A PodDisruptionBudget on n2's pods steers the group to n1.
    let mut e2 = gang_cluster(&[("n1", 2), ("n2", 2), ("n3", 1)]).engine();
    let steered = e2
        .preempt_group(&group, &members, BUDGET, &[pdb("n2-0", 0)], &[])
        .unwrap();
    assert_eq!(group_victims(&steered), ["n1-0", "n1-1", "n3-0"]);
    assert_eq!(steered.pdb_violations, 0);
    // The daemon's sequence: hold each member's devices, evict, schedule the group: each
    // member lands where it was nominated, and a pod of lower priority cannot take them.
    for preemption in &p.preemptions {
        e.nominate(preemption);
    }
    let all = Preemption {
        victims: p.victims.clone(),
        ..p.preemptions[0].clone()
    };
    e.evict(&all);
    e.upsert_pod(pending("lower", 500, 1).0);
    e.upsert_claim(pending("lower", 500, 1).1);
    assert!(matches!(
        e.schedule(&key("lower")),
        Decision::Unschedulable { .. }
    ));
    let decision = e.schedule_group(&group, &members);
    let placed_now: BTreeSet<(String, String)> = decision
        .placements()
        .iter()
        .map(|p| (p.pod.name.clone(), p.node.clone()))
        .collect();
    let nominated: BTreeSet<(String, String)> = p
        .preemptions
        .iter()
        .map(|p| (p.pod.name.clone(), p.node.clone()))
        .collect();
    assert_eq!(placed_now, nominated, "{:?}", decision.message());
}

#[test]
fn a_gang_that_cannot_fit_even_with_every_lower_priority_pod_gone_evicts_nobody() {
    // n2's GPUs are held by priority-5000 pods: only n1 can be emptied, and the gang needs
    // two nodes.
    let mut e = gang_cluster(&[("n1", 2)])
        .with(running("keep-0", "n2", "gpu-0", 5000, 0))
        .with(running("keep-1", "n2", "gpu-1", 5000, 0))
        .engine();
    e.upsert_node(node("n2"));
    let (group, members) = train();
    let err = e
        .preempt_group(&group, &members, BUDGET, &[], &[])
        .unwrap_err();
    assert_eq!(
        err,
        "no preemption helps PodGroup default/train: even with all 2 pods of priority below 1000 evicted, minCount (2) cannot be satisfied: 2 pods need 4 devices of DeviceClass gpu; 2 are free"
    );
    assert!(e.state().pods.contains_key(&key("n1-0")));
    assert!(e.state().pods.contains_key(&key("n1-1")));
}

#[test]
fn a_pod_group_with_preemption_policy_never_does_not_preempt() {
    let mut e = gang_cluster(&[("n1", 2), ("n2", 2)]).engine();
    let (_, members) = train();
    let group = gang("train", 2, json!({"preemptionPolicy": "Never"}));
    assert_eq!(
        e.preempt_group(&group, &members, BUDGET, &[], &[])
            .unwrap_err(),
        "PodGroup default/train: preemptionPolicy is Never"
    );
    // A member's own preemptionPolicy: Never stops the group too.
    let (mut pod, claim) = member("train-1", "train", 1000, 2);
    pod.spec.as_mut().unwrap().preemption_policy = Some("Never".into());
    let mut c = gang_cluster(&[("n1", 2), ("n2", 2)]);
    c.input
        .pods
        .retain(|p| p.metadata.name.as_deref() != Some("train-1"));
    c.input
        .claims
        .retain(|c| c.metadata.name.as_deref() != Some("train-1-gpu"));
    let mut e = c.with((pod, claim)).engine();
    let (group, members) = train();
    assert_eq!(
        e.preempt_group(&group, &members, BUDGET, &[], &[])
            .unwrap_err(),
        "PodGroup default/train: pod default/train-1 has preemptionPolicy Never"
    );
}

#[test]
fn a_group_member_is_sent_to_preempt_group() {
    let mut e = gang_cluster(&[("n1", 2), ("n2", 2)]).engine();
    assert_eq!(
        e.preempt(&key("train-0"), BUDGET, &[]).unwrap_err(),
        "pod default/train-0 is a member of PodGroup default/train: a PodGroup preempts as a whole (Engine::preempt_group), its members do not preempt one by one"
    );
}

#[test]
fn a_gang_that_fits_or_has_no_time_does_not_preempt() {
    let mut e = gang_cluster(&[("n1", 0), ("n2", 1), ("n3", 0)]).engine();
    let (group, members) = train();
    assert_eq!(
        e.preempt_group(&group, &members, BUDGET, &[], &[])
            .unwrap_err(),
        "PodGroup default/train fits without preemption"
    );
    let mut e = gang_cluster(&[("n1", 2), ("n2", 2)]).engine();
    let err = e
        .preempt_group(&group, &members, Duration::ZERO, &[], &[])
        .unwrap_err();
    assert!(
        err.starts_with("PodGroup default/train: preemption ran out of its 0ns budget"),
        "{err}"
    );
}

#[test]
fn a_victim_gang_is_evicted_whole_for_a_preempting_group() {
    // One GPU per node. n1 is free; worker-0 and worker-1 (gang `batch`, priority 0) hold
    // n2 and n3; n4 is held by a priority-5000 pod. The preempting gang needs two GPUs: one
    // more than is free, yet `batch` goes as a whole.
    let cluster = || {
        let mut c = Cluster::new(&[("n1", 1), ("n2", 1), ("n3", 1), ("n4", 1)])
            .with(running("keep", "n4", "gpu-0", 5000, 0))
            .with(member("train-0", "train", 1000, 1))
            .with(member("train-1", "train", 1000, 1));
        for (i, n) in ["n2", "n3"].iter().enumerate() {
            let (pod, claim) = running(&format!("worker-{i}"), n, "gpu-0", 0, 0);
            c = c.with((in_group(pod, "batch"), claim));
        }
        c
    };
    let (group, members) = train();
    let mut e = cluster().engine();
    let p = e.preempt_group(&group, &members, BUDGET, &[], &[]).unwrap();
    assert_eq!(group_victims(&p), ["worker-0", "worker-1"]);
    let placed = members_placed(&p);
    assert!(placed.iter().any(|(_, n, _)| n == "n1"), "{placed:?}");
    for (_, node, v) in &placed {
        match node.as_str() {
            "n1" => assert!(v.is_empty()),
            // The member's preemption names the whole victim gang.
            _ => assert_eq!(v, &["worker-0", "worker-1"]),
        }
    }
    // With disruptionMode single, one worker is enough.
    let batch = gang("batch", 2, json!({"disruptionMode": {"single": {}}}));
    let mut e = cluster().engine();
    let p = e
        .preempt_group(&group, &members, BUDGET, &[], &[batch])
        .unwrap();
    assert_eq!(p.victims.len(), 1, "{:?}", p.victims);
}
