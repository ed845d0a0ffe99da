//! The device inventory (`Inventory::of`): which classes each device is in, who holds it,
//! its taints, the counts per node, class and state, and what shared counters are left.

use dra_engine::inventory::{Inventory, Sources};
use dra_engine::{ClusterInput, ClusterState, ObjectKey};
use serde_json::json;

fn class(name: &str, expression: &str) -> k8s_openapi::api::resource::v1::DeviceClass {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"selectors": [
        {"cel": {"expression": expression}}]}}))
    .unwrap()
}

/// node-1: an A5000 (gpu-0), two T10s (gpu-1 tainted NoSchedule, gpu-2), and a
/// partitionable GPU with 40Gi of memory counters and two 20Gi MIG slices.
fn state() -> ClusterState {
    let gpu = |name: &str, product: &str, numa: i64| {
        json!({"name": name, "attributes": {"type": {"string": "gpu"},
            "productName": {"string": product}, "resource.kubernetes.io/numaNode": {"int": numa}}})
    };
    let mut t10 = gpu("gpu-1", "Tesla T10", 0);
    t10["taints"] = json!([{"key": "xid", "value": "79", "effect": "NoSchedule"}]);
    let mig = |name: &str| {
        json!({"name": name, "attributes": {"type": {"string": "mig"}},
            "consumesCounters": [{"counterSet": "gpu-3-counters",
                "counters": {"memory": {"value": "20Gi"}}}]})
    };
    let slice = serde_json::from_value(json!({"metadata": {"name": "node-1-gpus"}, "spec": {
        "driver": "gpu.nvidia.com", "nodeName": "node-1",
        "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
        "sharedCounters": [{"name": "gpu-3-counters", "counters": {"memory": {"value": "40Gi"}}}],
        "devices": [gpu("gpu-0", "NVIDIA RTX A5000", 0), t10, gpu("gpu-2", "Tesla T10", 1),
            mig("gpu-3-mig-0"), mig("gpu-3-mig-1")]}}))
    .unwrap();
    let allocated = |name: &str, device: &str, pod: &str| {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
            "status": {"allocation": {"devices": {"results": [{"request": "gpu",
                "driver": "gpu.nvidia.com", "pool": "node-1", "device": device}]}},
                "reservedFor": [{"resource": "pods", "name": pod, "uid": "u"}]}}))
        .unwrap()
    };
    ClusterState::new(ClusterInput {
        slices: vec![slice],
        classes: vec![
            class(
                "gpu.nvidia.com",
                "device.attributes['gpu.nvidia.com'].type == 'gpu'",
            ),
            class(
                "mig.nvidia.com",
                "device.attributes['gpu.nvidia.com'].type == 'mig'",
            ),
            class(
                "big-gpu",
                "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA RTX A5000'",
            ),
        ],
        claims: vec![
            allocated("train-0-gpu", "gpu-0", "train-0"),
            allocated("infer-0-mig", "gpu-3-mig-0", "infer-0"),
        ],
        ..Default::default()
    })
}

#[test]
fn each_device_has_its_classes_holder_and_taints() {
    let inventory = Inventory::of(&state());
    // big-gpu's selector reads an attribute the MIG devices lack: an error, named, and the
    // devices are not in the class.
    assert_eq!(
        inventory.errors,
        [
            "DeviceClass big-gpu on device gpu-3-mig-0: no such key: productName",
            "DeviceClass big-gpu on device gpu-3-mig-1: no such key: productName"
        ]
    );
    let a5000 = &inventory.devices[0];
    assert_eq!(a5000.id(), "gpu.nvidia.com/node-1/gpu-0");
    assert_eq!(a5000.product.as_deref(), Some("NVIDIA RTX A5000"));
    assert_eq!(a5000.numa, Some(0));
    assert_eq!(a5000.classes, ["gpu.nvidia.com", "big-gpu"]);
    assert_eq!(a5000.claim, Some(ObjectKey::new("ml", "train-0-gpu")));
    assert_eq!(a5000.reserved_for, ["pods/train-0"]);
    assert_eq!(a5000.state(), "allocated");
    let tainted = &inventory.devices[1];
    assert_eq!(tainted.taints, ["xid=79:NoSchedule"]);
    assert_eq!(tainted.state(), "tainted");
    assert_eq!(inventory.devices[2].state(), "free");
    assert!(inventory.devices[3].partition && inventory.devices[3].classes == ["mig.nvidia.com"]);
}

#[test]
fn counts_per_node_class_and_state() {
    let counts = Inventory::of(&state()).counts();
    let n = |class: &str, state: &'static str| {
        counts
            .get(&("node-1".to_string(), class.to_string(), state))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(
        (
            n("gpu.nvidia.com", "allocated"),
            n("gpu.nvidia.com", "tainted"),
            n("gpu.nvidia.com", "free")
        ),
        (1, 1, 1)
    );
    assert_eq!(
        (
            n("mig.nvidia.com", "allocated"),
            n("mig.nvidia.com", "free")
        ),
        (1, 1)
    );
    assert_eq!((n("big-gpu", "allocated"), n("big-gpu", "free")), (1, 0));
    // The daemon's count, made without holding every device, is the same.
    assert_eq!(Inventory::counts_of(&Sources::of(&state())), counts);
}

#[test]
fn a_partitionable_device_shows_what_its_counters_have_left() {
    let inventory = Inventory::of(&state());
    assert_eq!(inventory.counters.len(), 1);
    let c = &inventory.counters[0];
    assert_eq!(
        (
            c.counter_set.as_str(),
            c.counter.as_str(),
            c.total.as_str(),
            c.left.as_str()
        ),
        ("gpu-3-counters", "memory", "40Gi", "20Gi")
    );
}
