//! Preemption that frees devices (`Engine::preempt`): which pods are evicted, shared claims,
//! `preemptionPolicy: Never`, PodDisruptionBudgets, PodGroups evicted whole, and the hold
//! on freed devices for the nominated pod (`Engine::nominate`).

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
