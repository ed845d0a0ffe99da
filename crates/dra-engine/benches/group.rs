//! One PodGroup decision (`Engine::schedule_group`), from the group to its placements:
//! an 8-pod gang of 8 GPUs each on 500 nodes of 8 GPUs (placed), the same gang when only 7
//! nodes have all 8 free (refused by the counting bound before any search), and the
//! kubernetes/kubernetes#138765 pair that needs an earlier member's devices chosen again;
//! and a 64-pod gang of 2 GPUs each that must fit in one rack
//! (`schedulingConstraints.topology`) of a 512-node fleet in 32 racks of 16 nodes of 8 GPUs,
//! every rack free, or all but the last with a GPU in use.
//! `cargo bench -p dra-engine --bench group`.

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use dra_engine::{ClusterInput, Engine, EngineConfig, GroupDecision, ObjectKey};
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use serde_json::{Value, json};

fn node(name: &str) -> k8s_openapi::api::core::v1::Node {
    serde_json::from_value(json!({"metadata": {"name": name},
        "status": {"allocatable": {"cpu": "96", "memory": "1Ti", "pods": "110"}}}))
    .unwrap()
}

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

fn class() -> k8s_openapi::api::resource::v1::DeviceClass {
    serde_json::from_value(json!({"metadata": {"name": "gpu"}, "spec": {"selectors": [
        {"cel": {"expression": "device.driver == 'gpu.example.com'"}}]}}))
    .unwrap()
}

fn claim(name: &str, requests: Value) -> k8s_openapi::api::resource::v1::ResourceClaim {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": requests}}}))
    .unwrap()
}

fn member(name: &str, claim: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"}, "spec": {
        "schedulerName": "dra-scheduler", "schedulingGroup": {"podGroupName": "g"},
        "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}, "claims": [{"name": "gpu"}]}}]}}))
    .unwrap()
}

fn gang(min_count: i32) -> PodGroup {
    serde_json::from_value(json!({"metadata": {"name": "g", "namespace": "default"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}}))
    .unwrap()
}

/// `nodes` nodes of 8 GPUs (`busy` of their GPUs in use by placed pods' claims) and
/// an 8-pod gang of 8 GPUs each.
fn fleet(nodes: usize, busy: usize) -> (Engine, Vec<ObjectKey>) {
    let mut input = ClusterInput {
        classes: vec![class()],
        ..Default::default()
    };
    for i in 0..nodes {
        let name = format!("n{i:03}");
        input.nodes.push(node(&name));
        input.slices.push(slice(&name, &["H100"; 8]));
    }
    let eight = json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 8}}]);
    let mut members = Vec::new();
    for i in 0..8 {
        let name = format!("w{i}");
        input.claims.push(claim(&name, eight.clone()));
        input.pods.push(member(&name, &name));
        members.push(ObjectKey::new("default", name));
    }
    let mut engine = Engine::new(EngineConfig::default(), input);
    // Existing load: `busy` single-GPU pods, placed where the scheduler puts them.
    let one = json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]);
    for i in 0..busy {
        let name = format!("busy{i}");
        let mut pod = member(&name, &name);
        pod.spec.as_mut().unwrap().scheduling_group = None;
        pod.spec.as_mut().unwrap().node_name = None;
        engine.upsert_claim(claim(&name, one.clone()));
        engine.upsert_pod(pod);
        let key = ObjectKey::new("default", name);
        let decision = engine.schedule(&key);
        let dra_engine::Decision::Scheduled(p) = decision else {
            panic!("{decision:?}")
        };
        engine.assume(&p);
    }
    (engine, members)
}

/// The label kube-scheduler's TopologyPlacementGenerator and our engine group nodes by (as
/// in examples/gang-rack).
const RACK: &str = "topology.kubernetes.io/rack";

/// 512 nodes of 8 GPUs in 32 racks of 16 (`rack-00` ... `rack-31`); in each of the first
/// `busy_racks` racks one GPU is in use; and a 64-pod gang of 2 GPUs each, which fills a
/// whole rack.
fn rack_fleet(busy_racks: usize) -> (Engine, Vec<ObjectKey>) {
    let mut input = ClusterInput {
        classes: vec![class()],
        ..Default::default()
    };
    for i in 0..512 {
        let name = format!("n{i:03}");
        let mut n = node(&name);
        n.metadata.labels = Some(
            [
                (RACK.to_string(), format!("rack-{:02}", i / 16)),
                ("kubernetes.io/hostname".to_string(), name.clone()),
            ]
            .into(),
        );
        input.nodes.push(n);
        input.slices.push(slice(&name, &["H100"; 8]));
    }
    let two = json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 2}}]);
    let mut members = Vec::new();
    for i in 0..64 {
        let name = format!("w{i:02}");
        input.claims.push(claim(&name, two.clone()));
        input.pods.push(member(&name, &name));
        members.push(ObjectKey::new("default", name));
    }
    let mut engine = Engine::new(EngineConfig::default(), input);
    let one = json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]);
    for rack in 0..busy_racks {
        let name = format!("busy{rack}");
        let mut pod = member(&name, &name);
        let spec = pod.spec.as_mut().unwrap();
        spec.scheduling_group = None;
        spec.node_selector = Some(
            [(
                "kubernetes.io/hostname".to_string(),
                format!("n{:03}", rack * 16),
            )]
            .into(),
        );
        engine.upsert_claim(claim(&name, one.clone()));
        engine.upsert_pod(pod);
        let key = ObjectKey::new("default", name);
        let decision = engine.schedule(&key);
        let dra_engine::Decision::Scheduled(p) = decision else {
            panic!("{decision:?}")
        };
        engine.assume(&p);
    }
    (engine, members)
}

fn rack_gang(min_count: i32) -> PodGroup {
    serde_json::from_value(json!({"metadata": {"name": "g", "namespace": "default"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}},
            "schedulingConstraints": {"topology": [{"key": RACK}]}}}))
    .unwrap()
}

fn group_decisions(c: &mut Criterion) {
    let mut group = c.benchmark_group("podgroup");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(20));

    let (mut engine, members) = fleet(500, 0);
    group.bench_function("8 pods x 8 GPUs on 500 nodes of 8, placed", |b| {
        b.iter(|| {
            let decision = engine.schedule_group(&gang(8), &members);
            assert!(matches!(decision, GroupDecision::Scheduled(ref p) if p.placements.len() == 8));
        })
    });

    // 8 nodes with 2 GPUs in use: 62 GPUs free for a gang that needs 64.
    let (mut engine, members) = fleet(8, 2);
    group.bench_function(
        "8 pods x 8 GPUs on 8 nodes with 62 GPUs free, refused by the bound",
        |b| {
            b.iter(|| {
                let decision = engine.schedule_group(&gang(8), &members);
                assert!(
                    decision.message().unwrap().contains("need 64 devices"),
                    "{decision:?}"
                );
            })
        },
    );

    let mut input = ClusterInput {
        nodes: vec![node("n1")],
        classes: vec![class()],
        slices: vec![slice("n1", &["A100", "T4"])],
        ..Default::default()
    };
    let a100 = json!([{"cel": {"expression": "device.attributes['gpu.example.com'].productName == 'A100'"}}]);
    let t4 = json!([{"cel": {"expression": "device.attributes['gpu.example.com'].productName == 'T4'"}}]);
    input.claims.push(claim(
        "c1",
        json!([{"name": "gpu", "firstAvailable": [
        {"name": "a100", "deviceClassName": "gpu", "selectors": a100},
        {"name": "t4", "deviceClassName": "gpu", "selectors": t4}]}]),
    ));
    input.claims.push(claim(
        "c2",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "selectors": a100}}]),
    ));
    input.pods.push(member("p1", "c1"));
    input.pods.push(member("p2", "c2"));
    let mut engine = Engine::new(EngineConfig::default(), input);
    let pair = [
        ObjectKey::new("default", "p1"),
        ObjectKey::new("default", "p2"),
    ];
    group.bench_function("kubernetes#138765 pair, pod 1's GPU chosen again", |b| {
        b.iter(|| {
            let decision = engine.schedule_group(&gang(2), &pair);
            assert_eq!(decision.placements().len(), 2);
        })
    });

    for (busy_racks, rack, what) in [
        (0, "rack-00", "every rack free"),
        (31, "rack-31", "31 racks with a GPU in use"),
    ] {
        let (mut engine, members) = rack_fleet(busy_racks);
        let name =
            format!("64 pods x 2 GPUs in one rack of 16 nodes, 512 nodes in 32 racks, {what}");
        let domain = format!("{RACK}={rack}");
        group.bench_function(name, |b| {
            b.iter(|| {
                let decision = engine.schedule_group(&rack_gang(64), &members);
                let GroupDecision::Scheduled(p) = &decision else {
                    panic!("{decision:?}")
                };
                assert_eq!(p.placements.len(), 64);
                assert_eq!(p.domain.as_deref(), Some(domain.as_str()));
            })
        });
    }
    let (mut engine, members) = numa_fleet();
    group.bench_function(
        "4 pods x 20 one-GPU requests on one NUMA node, none has 20: refused",
        |b| {
            b.iter(|| {
                let decision = engine.schedule_group(&gang(4), &members);
                assert!(
                    matches!(decision, GroupDecision::Unschedulable { .. }),
                    "{decision:?}"
                );
            })
        },
    );
    group.finish();
}

/// 4 nodes of 32 GPUs over 4 NUMA nodes of 8, and a gang of 4 pods whose claims each ask
/// for 20 one-GPU requests on one NUMA node (`matchAttribute`): no node has 20 on one NUMA
/// node. Each member's claim is the allocator benches' case d), which upstream's allocator
/// (`allocref`, `cargo test --release -p dra-allocator --test reference_times -- --ignored
/// --nocapture`) does not decide within kube-scheduler's 10 s filter timeout.
fn numa_fleet() -> (Engine, Vec<ObjectKey>) {
    let names: Vec<String> = (0..4).map(|i| format!("n{i}")).collect();
    let slices = names
        .iter()
        .map(|n| {
            let devices: Vec<Value> = (0..32)
                .map(|d| json!({"name": format!("gpu-{d}"), "attributes": {
                    "resource.kubernetes.io/numaNode": {"int": d / 8}}}))
                .collect();
            serde_json::from_value(json!({"metadata": {"name": format!("{n}-gpus")}, "spec": {
                "driver": "gpu.example.com", "nodeName": n,
                "pool": {"name": n, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}))
            .unwrap()
        })
        .collect();
    let requests: Vec<Value> = (0..20)
        .map(|i| json!({"name": format!("g{i}"), "exactly": {"deviceClassName": "gpu"}}))
        .collect();
    let names_of: Vec<String> = (0..20).map(|i| format!("g{i}")).collect();
    let mut input = ClusterInput {
        nodes: names.iter().map(|n| node(n)).collect(),
        classes: vec![class()],
        slices,
        ..Default::default()
    };
    let mut members = Vec::new();
    for m in 0..4 {
        let name = format!("c{m}");
        input.claims.push(
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
                "spec": {"devices": {"requests": requests, "constraints": [
                    {"requests": names_of, "matchAttribute": "resource.kubernetes.io/numaNode"}]}}}))
            .unwrap(),
        );
        input.pods.push(member(&format!("p{m}"), &name));
        members.push(ObjectKey::new("default", format!("p{m}")));
    }
    (Engine::new(EngineConfig::default(), input), members)
}

criterion_group!(benches, group_decisions);
criterion_main!(benches);
