//! DRANodeAllocatableResources: GPUs that each pin node CPUs (`nodeAllocatableResources`).
//! A pod's devices add what they map to its requests, the node counts it once the pod is
//! placed, and a claim with a mapped device is not shared.

use dra_engine::{ClusterInput, Decision, Engine, EngineConfig, Features, ObjectKey, Placement};
use k8s_openapi::api::core::v1::{NodeAllocatableResourceClaimStatus, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{Value, json};

fn node(cpu: &str) -> k8s_openapi::api::core::v1::Node {
    serde_json::from_value(json!({"metadata": {"name": "node-1"},
        "status": {"allocatable": {"cpu": cpu, "memory": "64Gi", "pods": "110"}}}))
    .unwrap()
}

/// gpu-0 and gpu-1, each mapping 6 CPUs and a memory overhead of 512Mi per container
/// (and 1Gi per pod); cores-0, a shared device whose consumed `cores` map CPUs one to one.
fn slice() -> k8s_openapi::api::resource::v1::ResourceSlice {
    let gpu = |name: &str| {
        json!({"name": name, "attributes": {"type": {"string": "gpu"}},
            "nodeAllocatableResources": {
                "cpu": {"mapping": {"deviceMultiplier": "6"}},
                "memory": {"overhead": {"perPod": "1Gi", "perContainer": "512Mi"}}}})
    };
    let cores = json!({"name": "cores-0", "attributes": {"type": {"string": "cores"}},
        "allowMultipleAllocations": true,
        "capacity": {"example.com/cores": {"value": "8"}},
        "nodeAllocatableResources": {"cpu": {"mapping": {
            "capacityKey": "example.com/cores", "capacityMultiplier": "1"}}}});
    serde_json::from_value(json!({"metadata": {"name": "node-1-gpus"}, "spec": {
        "driver": "gpu.example.com", "nodeName": "node-1",
        "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
        "devices": [gpu("gpu-0"), gpu("gpu-1"), cores]}}))
    .unwrap()
}

fn class() -> k8s_openapi::api::resource::v1::DeviceClass {
    serde_json::from_value(json!({"metadata": {"name": "gpu"}, "spec": {"selectors": [
        {"cel": {"expression": "device.driver == 'gpu.example.com'"}}]}}))
    .unwrap()
}

/// A claim for one device of `kind` (`gpu`, or `cores` with `cores` of them).
fn claim(name: &str, kind: &str, cores: Option<&str>) -> ResourceClaim {
    let mut exactly = json!({"deviceClassName": "gpu", "selectors": [{"cel": {"expression":
        format!("device.attributes['gpu.example.com'].type == '{kind}'")}}]});
    if let Some(n) = cores {
        exactly["capacity"] = json!({"requests": {"example.com/cores": n}});
    }
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}}))
    .unwrap()
}

/// A pod asking for `cpu` in its container `main`, which uses claim `claim` when given
/// (a sidecar container `log` does not).
fn pod(name: &str, cpu: &str, claim: Option<&str>) -> Pod {
    let mut v = json!({"metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")},
        "spec": {"schedulerName": "dra-scheduler", "containers": [
            {"name": "main", "resources": {"requests": {"cpu": cpu}}},
            {"name": "log"}]}});
    if let Some(claim) = claim {
        v["spec"]["resourceClaims"] = json!([{"name": "dev", "resourceClaimName": claim}]);
        v["spec"]["containers"][0]["resources"]["claims"] = json!([{"name": "dev"}]);
    }
    serde_json::from_value(v).unwrap()
}

fn engine(gate: bool, cpu: &str, pods: Vec<Pod>, claims: Vec<ResourceClaim>) -> Engine {
    let config = EngineConfig {
        features: Features {
            node_allocatable_resources: gate,
            ..Default::default()
        },
        ..Default::default()
    };
    let input = ClusterInput {
        nodes: vec![node(cpu)],
        slices: vec![slice()],
        classes: vec![class()],
        pods,
        claims,
        ..Default::default()
    };
    Engine::new(config, input)
}

fn schedule(engine: &mut Engine, pod: &str) -> Decision {
    engine.schedule(&ObjectKey::new("ml", pod))
}

fn placed(engine: &mut Engine, pod: &str) -> Placement {
    match schedule(engine, pod) {
        Decision::Scheduled(p) => {
            engine.assume(&p);
            p
        }
        other => panic!("{pod} not placed: {other:?}"),
    }
}

fn unschedulable(engine: &mut Engine, pod: &str) -> String {
    match schedule(engine, pod) {
        Decision::Unschedulable { message, .. } => message,
        other => panic!("{pod} placed or failed otherwise: {other:?}"),
    }
}

fn json_of(statuses: &[NodeAllocatableResourceClaimStatus]) -> Value {
    serde_json::to_value(statuses).unwrap()
}

#[test]
fn a_gpus_pinned_cpus_count_against_the_node_and_go_into_the_pods_status() {
    let mut engine = engine(
        true,
        "16",
        vec![
            pod("a", "4", Some("a-gpu")),
            pod("b", "4", Some("b-gpu")),
            pod("web", "6", None),
            pod("web-7", "7", None),
        ],
        vec![claim("a-gpu", "gpu", None), claim("b-gpu", "gpu", None)],
    );
    let a = placed(&mut engine, "a");
    assert_eq!(
        json_of(&a.node_allocatable),
        json!([{"resourceClaimName": "a-gpu", "containers": ["main"],
            "mapping": [{"name": "cpu", "quantity": "6"}],
            "overhead": [{"name": "memory", "perPod": "1Gi", "perContainer": "512Mi"}]}])
    );
    // 4 + 6 of 16 taken: b's 4 + 6 do not fit, though its containers' 4 would.
    let message = unschedulable(&mut engine, "b");
    assert!(message.contains("Insufficient cpu"), "{message}");
    // The node counts a's 10: 6 more fit, 7 do not.
    assert!(unschedulable(&mut engine, "web-7").contains("Insufficient cpu"));
    placed(&mut engine, "web");
}

#[test]
fn with_the_gate_off_the_mapping_devices_are_not_allocated() {
    let mut engine = engine(
        false,
        "16",
        vec![pod("a", "4", Some("a-gpu"))],
        vec![claim("a-gpu", "gpu", None)],
    );
    let message = unschedulable(&mut engine, "a");
    assert!(
        message.contains("needs the DRANodeAllocatableResources feature gate"),
        "{message}"
    );
}

#[test]
fn consumed_capacity_maps_its_amount_times_the_multiplier() {
    let mut engine = engine(
        true,
        "8",
        vec![
            pod("a", "1", Some("a-cores")),
            pod("b", "1", Some("b-cores")),
        ],
        vec![
            claim("a-cores", "cores", Some("3")),
            claim("b-cores", "cores", Some("3")),
        ],
    );
    let a = placed(&mut engine, "a");
    assert_eq!(
        json_of(&a.node_allocatable),
        json!([{"resourceClaimName": "a-cores", "containers": ["main"],
            "mapping": [{"name": "cpu", "quantity": "3"}], "overhead": []}])
    );
    // 1 + 3 of 8 taken, b's 1 + 3 fit exactly.
    let b = placed(&mut engine, "b");
    assert_eq!(b.node_allocatable[0].resource_claim_name, "b-cores");
}

#[test]
fn a_demand_larger_than_the_node_is_unresolvable() {
    let mut engine = engine(
        true,
        "8",
        vec![pod("a", "4", Some("a-gpu"))],
        vec![claim("a-gpu", "gpu", None)],
    );
    match schedule(&mut engine, "a") {
        Decision::Unschedulable { message, .. } => {
            assert!(message.contains("Insufficient cpu"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_claim_with_a_mapped_device_is_not_shared_between_pods() {
    let mut engine = engine(
        true,
        "32",
        vec![pod("a", "1", Some("shared")), pod("b", "1", Some("shared"))],
        vec![claim("shared", "gpu", None)],
    );
    placed(&mut engine, "a");
    let message = unschedulable(&mut engine, "b");
    assert!(
        message.contains(
            "node allocatable resource claim shared has a mapped device and cannot be shared across pods"
        ),
        "{message}"
    );
}

#[test]
fn pod_level_resources_must_cover_what_the_devices_map() {
    let with_pod_level = |name: &str, resources: Value| {
        let mut v = serde_json::to_value(pod(name, "4", Some(&format!("{name}-gpu")))).unwrap();
        v["spec"]["resources"] = resources;
        serde_json::from_value::<Pod>(v).unwrap()
    };
    let mut engine = engine(
        true,
        "32",
        vec![
            with_pod_level("short", json!({"requests": {"cpu": "8"}})),
            with_pod_level("capped", json!({"limits": {"cpu": "8"}})),
            with_pod_level("covered", json!({"requests": {"cpu": "10"}})),
        ],
        vec![
            claim("short-gpu", "gpu", None),
            claim("capped-gpu", "gpu", None),
            claim("covered-gpu", "gpu", None),
        ],
    );
    // 4 for the container + 6 the GPU maps > 8.
    let message = unschedulable(&mut engine, "short");
    assert!(
        message.contains("pod level request for cpu is insufficient to cover the aggregated container and node-allocatable DRA requests"),
        "{message}"
    );
    placed(&mut engine, "covered");
    // With a container limit of 4: 4 + the 6 the GPU maps for it > the pod's limit of 8.
    let mut v =
        serde_json::to_value(&*engine.state().pods[&ObjectKey::new("ml", "capped")]).unwrap();
    v["spec"]["containers"][0]["resources"]["limits"] = json!({"cpu": "4"});
    let capped: Pod = serde_json::from_value(v).unwrap();
    engine.upsert_pod(capped);
    let message = unschedulable(&mut engine, "capped");
    assert!(
        message.contains("pod level limit for cpu is insufficient to cover the limit and DRA overhead for container main"),
        "{message}"
    );
}
