//! Builds the ResourceSlices of a node's pool from discovered GPUs. Pure: the publisher
//! compares what this returns with what the API server has and writes the difference.
//!
//! Layout of a pool (named after the node, one per driver):
//! - device slices: whole GPUs (`gpu-<minor>`) and, on GPUs with MIG enabled, every MIG
//!   placement (`gpu-<minor>-mig-<profile>-<profileId>-<start>`), split so no slice exceeds
//!   the API's per-slice device limit (128, or 64 once a device has taints or consumes
//!   counters);
//! - counter slices: the `sharedCounters` of MIG GPUs (one counter set per GPU, at most 8
//!   per slice); the whole GPU and each placement consume from it, so the scheduler never
//!   hands out a GPU and an overlapping partition.

use crate::device::{Gpu, MigEngines, MigInfo, MigProfile, to_semver};
use crate::health::HealthState;
use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, Device, DeviceAttribute, DeviceCapacity, DeviceCounterConsumption,
    DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use std::collections::BTreeMap;

/// API limit on devices in one slice.
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// API limit when any device in the slice has taints or consumes counters.
pub const MAX_ADVANCED_DEVICES_PER_SLICE: usize = 64;
/// API limit on counter sets in one slice.
pub const MAX_COUNTER_SETS_PER_SLICE: usize = 8;

/// The Node that owns the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRef {
    pub name: String,
    pub uid: String,
}

/// The counter set shared by a MIG GPU's whole device and its placements.
pub fn counter_set_name(minor: u32) -> String {
    format!("gpu-{minor}-counter-set")
}

/// Deterministic slice names, so a deleted slice comes back under its old name.
pub fn slice_name(node: &str, driver: &str, index: usize) -> String {
    format!("{node}-{driver}-{index}")
}

/// A Kubernetes quantity in the form the API server keeps when it canonicalises: binary
/// suffixes for multiples of 1024, decimal suffixes for multiples of 1000, else a plain
/// integer. Emitting canonical forms keeps "what we wrote" equal to "what we read back".
pub fn quantity(n: u64) -> Quantity {
    if n == 0 {
        return Quantity("0".into());
    }
    let binary = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let decimal = ["", "k", "M", "G", "T", "P", "E"];
    if n.is_multiple_of(1024) {
        let (mut v, mut i) = (n, 0);
        while v.is_multiple_of(1024) && i < binary.len() - 1 {
            v /= 1024;
            i += 1;
        }
        return Quantity(format!("{v}{}", binary[i]));
    }
    let (mut v, mut i) = (n, 0);
    while v.is_multiple_of(1000) && i < decimal.len() - 1 {
        v /= 1000;
        i += 1;
    }
    Quantity(format!("{v}{}", decimal[i]))
}

fn string(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.to_string()),
        ..Default::default()
    }
}

fn version(raw: &str) -> Option<DeviceAttribute> {
    to_semver(raw).map(|v| DeviceAttribute {
        version: Some(v),
        ..Default::default()
    })
}

fn int(i: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i),
        ..Default::default()
    }
}

/// Attributes common to a GPU and its partitions: product, versions, PCI topology.
fn common_attributes(gpu: &Gpu, kind: &str) -> BTreeMap<String, DeviceAttribute> {
    let mut a = BTreeMap::new();
    a.insert("type".into(), string(kind));
    a.insert("productName".into(), string(&gpu.product_name));
    a.insert("brand".into(), string(&gpu.brand));
    a.insert("architecture".into(), string(&gpu.architecture));
    for (name, raw) in [
        ("cudaComputeCapability", &gpu.cuda_compute_capability),
        ("driverVersion", &gpu.driver_version),
        ("cudaDriverVersion", &gpu.cuda_driver_version),
    ] {
        if let Some(v) = version(raw) {
            a.insert(name.into(), v);
        }
    }
    a.insert(
        "resource.kubernetes.io/pciBusID".into(),
        string(&gpu.pci_bus_id),
    );
    if let Some(root) = &gpu.pcie_root {
        a.insert("resource.kubernetes.io/pcieRoot".into(), string(root));
    }
    if let Some(numa) = gpu.numa_node {
        a.insert("resource.kubernetes.io/numaNode".into(), int(numa));
    }
    a
}

fn capacity(entries: &[(&str, u64)]) -> BTreeMap<String, DeviceCapacity> {
    entries
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                DeviceCapacity {
                    value: quantity(*v),
                    ..Default::default()
                },
            )
        })
        .collect()
}

fn counters(entries: impl IntoIterator<Item = (String, u64)>) -> BTreeMap<String, Counter> {
    entries
        .into_iter()
        .map(|(k, v)| (k, Counter { value: quantity(v) }))
        .collect()
}

fn engine_counters(e: &MigEngines, memory: u64) -> Vec<(String, u64)> {
    vec![
        ("multiprocessors".into(), e.multiprocessors as u64),
        ("copy-engines".into(), e.copy_engines as u64),
        ("decoders".into(), e.decoders as u64),
        ("encoders".into(), e.encoders as u64),
        ("jpeg-engines".into(), e.jpeg_engines as u64),
        ("ofa-engines".into(), e.ofa_engines as u64),
        ("memory".into(), memory),
    ]
}

fn memory_slice_counters(range: std::ops::Range<u32>) -> Vec<(String, u64)> {
    range.map(|i| (format!("memory-slice-{i}"), 1)).collect()
}

/// The counter set of a MIG GPU: everything its partitions compete for.
pub fn gpu_counter_set(gpu: &Gpu, mig: &MigInfo) -> CounterSet {
    let mut all = engine_counters(&mig.engines, gpu.memory_bytes);
    all.extend(memory_slice_counters(0..mig.memory_slices));
    CounterSet {
        name: counter_set_name(gpu.minor),
        counters: counters(all),
    }
}

fn taints(gpu: &Gpu, health: &HealthState) -> Option<Vec<DeviceTaint>> {
    let t: Vec<DeviceTaint> = health
        .taints_for(gpu.minor)
        .into_iter()
        .map(|t| DeviceTaint {
            key: t.key,
            value: t.value,
            effect: t.effect,
            time_added: chrono_time(&t.time_added),
        })
        .collect();
    (!t.is_empty()).then_some(t)
}

fn chrono_time(rfc3339: &str) -> Option<Time> {
    serde_json::from_value(serde_json::Value::String(rfc3339.to_string())).ok()
}

/// The whole-GPU device.
pub fn gpu_device(gpu: &Gpu, health: &HealthState) -> Device {
    let mut attributes = common_attributes(gpu, "gpu");
    attributes.insert("uuid".into(), string(&gpu.uuid));
    let consumes_counters = gpu.publishes_mig().then(|| {
        let mig = gpu.mig.as_ref().expect("publishes_mig checked");
        let mut all = engine_counters(&mig.engines, gpu.memory_bytes);
        all.extend(memory_slice_counters(0..mig.memory_slices));
        vec![DeviceCounterConsumption {
            counter_set: counter_set_name(gpu.minor),
            counters: counters(all),
            ..Default::default()
        }]
    });
    Device {
        name: gpu.device_name(),
        attributes: Some(attributes),
        capacity: Some(capacity(&[("memory", gpu.memory_bytes)])),
        consumes_counters,
        taints: taints(gpu, health),
        ..Default::default()
    }
}

/// A MIG placement as a partitionable device.
pub fn mig_device(gpu: &Gpu, profile: &MigProfile, start: u32, health: &HealthState) -> Device {
    let mut attributes = common_attributes(gpu, "mig");
    attributes.insert("parentUUID".into(), string(&gpu.uuid));
    attributes.insert("profile".into(), string(&profile.name));
    let e = &profile.engines;
    let mut used = engine_counters(e, profile.memory_bytes);
    used.extend(memory_slice_counters(start..start + profile.memory_slices));
    Device {
        name: profile.device_name(gpu.minor, start),
        attributes: Some(attributes),
        capacity: Some(capacity(&[
            ("multiprocessors", e.multiprocessors as u64),
            ("copyEngines", e.copy_engines as u64),
            ("decoders", e.decoders as u64),
            ("encoders", e.encoders as u64),
            ("jpegEngines", e.jpeg_engines as u64),
            ("ofaEngines", e.ofa_engines as u64),
            ("memory", profile.memory_bytes),
        ])),
        consumes_counters: Some(vec![DeviceCounterConsumption {
            counter_set: counter_set_name(gpu.minor),
            counters: counters(used),
            ..Default::default()
        }]),
        taints: taints(gpu, health),
        ..Default::default()
    }
}

/// Every device of the node, in a stable order: by GPU minor, the whole GPU first, then its
/// placements by profile and start.
pub fn devices(gpus: &[Gpu], health: &HealthState) -> Vec<Device> {
    let mut gpus: Vec<&Gpu> = gpus.iter().collect();
    gpus.sort_by_key(|g| g.minor);
    let mut out = Vec::new();
    for gpu in gpus {
        out.push(gpu_device(gpu, health));
        if gpu.publishes_mig() {
            let mig = gpu.mig.as_ref().expect("publishes_mig checked");
            for profile in &mig.profiles {
                for &start in &profile.placements {
                    out.push(mig_device(gpu, profile, start, health));
                }
            }
        }
    }
    out
}

fn is_advanced(d: &Device) -> bool {
    d.taints.as_ref().is_some_and(|t| !t.is_empty())
        || d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
}

/// Splits devices into slices that respect the per-slice limits, keeping order.
pub fn split_devices(devices: Vec<Device>) -> Vec<Vec<Device>> {
    let mut out: Vec<Vec<Device>> = Vec::new();
    let mut current: Vec<Device> = Vec::new();
    let mut advanced = false;
    for d in devices {
        let adv = advanced || is_advanced(&d);
        let limit = if adv {
            MAX_ADVANCED_DEVICES_PER_SLICE
        } else {
            MAX_DEVICES_PER_SLICE
        };
        if current.len() + 1 > limit {
            out.push(std::mem::take(&mut current));
            advanced = is_advanced(&d);
        } else {
            advanced = adv;
        }
        current.push(d);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// The content of each slice of the pool, without pool generation and count.
#[derive(Debug, Clone, PartialEq)]
pub enum SliceContent {
    Devices(Vec<Device>),
    Counters(Vec<CounterSet>),
}

/// Everything the pool should contain, split into slices.
pub fn pool_contents(gpus: &[Gpu], health: &HealthState) -> Vec<SliceContent> {
    let mut out: Vec<SliceContent> = split_devices(devices(gpus, health))
        .into_iter()
        .map(SliceContent::Devices)
        .collect();
    let mut sets: Vec<CounterSet> = Vec::new();
    let mut sorted: Vec<&Gpu> = gpus.iter().filter(|g| g.publishes_mig()).collect();
    sorted.sort_by_key(|g| g.minor);
    for gpu in sorted {
        sets.push(gpu_counter_set(gpu, gpu.mig.as_ref().expect("filtered")));
    }
    for chunk in sets.chunks(MAX_COUNTER_SETS_PER_SLICE) {
        out.push(SliceContent::Counters(chunk.to_vec()));
    }
    // An empty pool is still published (one empty slice), so consumers see the node has
    // no GPUs rather than a pool that vanished.
    if out.is_empty() {
        out.push(SliceContent::Devices(Vec::new()));
    }
    out
}

/// The full ResourceSlice objects for a pool at `generation`.
pub fn build_slices(
    node: &NodeRef,
    driver: &str,
    contents: &[SliceContent],
    generation: i64,
) -> Vec<ResourceSlice> {
    let count = contents.len() as i64;
    contents
        .iter()
        .enumerate()
        .map(|(i, content)| {
            let (devices, shared_counters) = match content {
                SliceContent::Devices(d) => (Some(d.clone()), None),
                SliceContent::Counters(c) => (None, Some(c.clone())),
            };
            ResourceSlice {
                metadata: ObjectMeta {
                    name: Some(slice_name(&node.name, driver, i)),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: node.name.clone(),
                        uid: node.uid.clone(),
                        controller: Some(true),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
                spec: ResourceSliceSpec {
                    driver: driver.to_string(),
                    node_name: Some(node.name.clone()),
                    pool: ResourcePool {
                        name: node.name.clone(),
                        generation,
                        resource_slice_count: count,
                    },
                    devices,
                    shared_counters,
                    ..Default::default()
                },
            }
        })
        .collect()
}

/// The slices of a pool as YAML manifests (`---` separated, with apiVersion and kind), the
/// form `dra-node-agent discover` prints and the simulator reads.
pub fn to_manifests(slices: &[ResourceSlice]) -> String {
    let mut out = String::new();
    for s in slices {
        let mut v = serde_json::to_value(s).expect("slice serialises");
        v["apiVersion"] = "resource.k8s.io/v1".into();
        v["kind"] = "ResourceSlice".into();
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&v).expect("slice as YAML"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fake::Profile;
    use crate::health::HealthEvent;

    fn profile(name: &str) -> Vec<Gpu> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("profiles")
            .join(name);
        Profile::load(&path).unwrap().gpus
    }

    fn node() -> NodeRef {
        NodeRef {
            name: "node-a".into(),
            uid: "uid-1".into(),
        }
    }

    fn attr<'a>(d: &'a Device, name: &str) -> &'a DeviceAttribute {
        d.attributes
            .as_ref()
            .unwrap()
            .get(name)
            .unwrap_or_else(|| panic!("{} has no attribute {name}", d.name))
    }

    #[test]
    fn quantities_are_canonical() {
        assert_eq!(quantity(80 * 1024 * 1024 * 1024).0, "80Gi");
        assert_eq!(quantity(4864 * 1024 * 1024).0, "4864Mi");
        assert_eq!(quantity(14).0, "14");
        assert_eq!(quantity(2000).0, "2k");
        assert_eq!(quantity(1).0, "1");
        assert_eq!(quantity(0).0, "0");
    }

    #[test]
    fn h100_gpus_carry_nvidia_attribute_names() {
        let gpus = profile("8x-h100-80gb-2numa-2nic.yaml");
        let slices = build_slices(
            &node(),
            "gpu.nvidia.com",
            &pool_contents(&gpus, &HealthState::default()),
            1,
        );
        assert_eq!(slices.len(), 1, "8 plain GPUs fit in one slice");
        let s = &slices[0];
        assert_eq!(s.metadata.name.as_deref(), Some("node-a-gpu.nvidia.com-0"));
        assert_eq!(s.spec.pool.name, "node-a");
        assert_eq!(s.spec.pool.resource_slice_count, 1);
        assert_eq!(s.spec.node_name.as_deref(), Some("node-a"));
        let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Node", "node-a", "uid-1")
        );
        let devices = s.spec.devices.as_ref().unwrap();
        let names: Vec<_> = devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"
            ]
        );
        let d = &devices[5];
        assert_eq!(attr(d, "type").string.as_deref(), Some("gpu"));
        assert_eq!(
            attr(d, "uuid").string.as_deref(),
            Some(gpus[5].uuid.as_str())
        );
        assert_eq!(
            attr(d, "productName").string.as_deref(),
            Some("NVIDIA H100 80GB HBM3")
        );
        assert_eq!(attr(d, "architecture").string.as_deref(), Some("Hopper"));
        assert_eq!(attr(d, "brand").string.as_deref(), Some("Nvidia"));
        assert_eq!(
            attr(d, "cudaComputeCapability").version.as_deref(),
            Some("9.0.0")
        );
        assert_eq!(
            attr(d, "driverVersion").version.as_deref(),
            Some("550.54.15")
        );
        assert_eq!(
            attr(d, "cudaDriverVersion").version.as_deref(),
            Some("12.4.0")
        );
        assert_eq!(
            attr(d, "resource.kubernetes.io/pciBusID").string.as_deref(),
            Some("0000:ab:00.0")
        );
        assert_eq!(
            attr(d, "resource.kubernetes.io/pcieRoot").string.as_deref(),
            Some("pci0000:97")
        );
        assert_eq!(attr(d, "resource.kubernetes.io/numaNode").int, Some(1));
        assert_eq!(d.capacity.as_ref().unwrap()["memory"].value.0, "80Gi");
        assert!(d.consumes_counters.is_none(), "MIG disabled: no counters");
        assert!(s.spec.shared_counters.is_none());
    }

    #[test]
    fn unknown_numa_node_is_omitted_and_old_driver_version_is_semver() {
        let gpus = profile("1x-a5000-2x-t10.yaml");
        let ds = devices(&gpus, &HealthState::default());
        assert_eq!(attr(&ds[0], "resource.kubernetes.io/numaNode").int, Some(0));
        assert!(
            !ds[1]
                .attributes
                .as_ref()
                .unwrap()
                .contains_key("resource.kubernetes.io/numaNode")
        );
        assert_eq!(
            attr(&ds[1], "driverVersion").version.as_deref(),
            Some("535.104.5")
        );
        assert_eq!(
            attr(&ds[1], "productName").string.as_deref(),
            Some("NVIDIA T10")
        );
        assert_eq!(ds[1].capacity.as_ref().unwrap()["memory"].value.0, "16Gi");
    }

    #[test]
    fn mig_gpus_publish_partitions_with_shared_counters_in_their_own_slice() {
        let gpus = profile("4x-a100-40gb-mig.yaml");
        let contents = pool_contents(&gpus, &HealthState::default());
        let slices = build_slices(&node(), "gpu.nvidia.com", &contents, 3);
        // 4 GPUs x (1 whole + 7 + 3 + 2 + 1 + 1 placements) = 60 devices: one device slice
        // (limit 64 with counters), then one counter slice.
        assert_eq!(slices.len(), 2);
        assert!(
            slices
                .iter()
                .all(|s| s.spec.pool.generation == 3 && s.spec.pool.resource_slice_count == 2)
        );
        let devices = slices[0].spec.devices.as_ref().unwrap();
        assert_eq!(devices.len(), 60);
        assert!(slices[0].spec.shared_counters.is_none());
        let sets = slices[1].spec.shared_counters.as_ref().unwrap();
        assert!(slices[1].spec.devices.is_none());
        assert_eq!(sets.len(), 4);
        assert_eq!(sets[0].name, "gpu-0-counter-set");
        assert_eq!(sets[0].counters["memory-slice-7"].value.0, "1");
        assert_eq!(sets[0].counters["multiprocessors"].value.0, "108");
        assert_eq!(sets[0].counters["memory"].value.0, "40Gi");
        assert_eq!(sets[0].counters.len(), 15);

        let mig = devices
            .iter()
            .find(|d| d.name == "gpu-1-mig-3g20gb-9-4")
            .expect("3g.20gb at 4");
        assert_eq!(attr(mig, "type").string.as_deref(), Some("mig"));
        assert_eq!(attr(mig, "profile").string.as_deref(), Some("3g.20gb"));
        assert_eq!(
            attr(mig, "parentUUID").string.as_deref(),
            Some(gpus[1].uuid.as_str())
        );
        assert!(!mig.attributes.as_ref().unwrap().contains_key("uuid"));
        let cap = mig.capacity.as_ref().unwrap();
        assert_eq!(cap["multiprocessors"].value.0, "42");
        assert_eq!(cap["memory"].value.0, "19968Mi");
        let used = &mig.consumes_counters.as_ref().unwrap()[0];
        assert_eq!(used.counter_set, "gpu-1-counter-set");
        let slices_used: Vec<_> = used
            .counters
            .keys()
            .filter(|k| k.starts_with("memory-slice-"))
            .cloned()
            .collect();
        assert_eq!(
            slices_used,
            [
                "memory-slice-4",
                "memory-slice-5",
                "memory-slice-6",
                "memory-slice-7"
            ]
        );

        // The whole GPU consumes everything, so it excludes every partition.
        let whole = devices.iter().find(|d| d.name == "gpu-1").unwrap();
        let c = &whole.consumes_counters.as_ref().unwrap()[0];
        assert_eq!(c.counters.len(), 15);
        assert_eq!(c.counters["memory"].value.0, "40Gi");
    }

    #[test]
    fn device_and_counter_names_are_dns_labels() {
        let gpus = profile("4x-a100-40gb-mig.yaml");
        let is_label = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !s.starts_with('-')
                && !s.ends_with('-')
        };
        for d in devices(&gpus, &HealthState::default()) {
            assert!(is_label(&d.name), "{}", d.name);
            assert!(
                d.attributes.as_ref().unwrap().len() + d.capacity.as_ref().unwrap().len() <= 32
            );
            for c in d.consumes_counters.unwrap() {
                assert!(c.counters.keys().all(|k| is_label(k)));
            }
        }
    }

    #[test]
    fn splits_at_128_plain_devices_and_64_with_taints() {
        let template = profile("1x-a5000-2x-t10.yaml").remove(0);
        let gpus: Vec<Gpu> = (0..200)
            .map(|i| Gpu {
                minor: i,
                uuid: format!("GPU-{i}"),
                ..template.clone()
            })
            .collect();
        let plain = pool_contents(&gpus, &HealthState::default());
        let sizes: Vec<usize> = plain
            .iter()
            .map(|c| match c {
                SliceContent::Devices(d) => d.len(),
                SliceContent::Counters(_) => 0,
            })
            .collect();
        assert_eq!(sizes, [128, 72]);

        let mut health = HealthState::new([]);
        health.apply(
            &HealthEvent::Xid { minor: 0, xid: 79 },
            "2026-01-01T00:00:00Z",
        );
        let tainted = pool_contents(&gpus, &health);
        let sizes: Vec<usize> = tainted
            .iter()
            .map(|c| match c {
                SliceContent::Devices(d) => d.len(),
                SliceContent::Counters(_) => 0,
            })
            .collect();
        assert_eq!(sizes, [64, 128, 8]);
        let slices = build_slices(&node(), "gpu.nvidia.com", &tainted, 1);
        assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 3));
        let names: Vec<_> = slices
            .iter()
            .map(|s| s.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "node-a-gpu.nvidia.com-0",
                "node-a-gpu.nvidia.com-1",
                "node-a-gpu.nvidia.com-2"
            ]
        );
    }

    #[test]
    fn taints_apply_to_the_gpu_and_its_partitions() {
        let gpus = profile("4x-a100-40gb-mig.yaml");
        let mut health = HealthState::new([]);
        health.apply(&HealthEvent::Lost { minor: 2 }, "2026-01-01T00:00:00Z");
        let ds = devices(&gpus, &health);
        let tainted: Vec<_> = ds
            .iter()
            .filter(|d| d.taints.is_some())
            .map(|d| d.name.clone())
            .collect();
        assert_eq!(tainted.len(), 15);
        assert!(
            tainted
                .iter()
                .all(|n| n == "gpu-2" || n.starts_with("gpu-2-mig-"))
        );
        let t = &ds
            .iter()
            .find(|d| d.name == "gpu-2")
            .unwrap()
            .taints
            .as_ref()
            .unwrap()[0];
        assert_eq!(
            (t.key.as_str(), t.effect.as_str()),
            ("gpu.nvidia.com/lost", "NoExecute")
        );
        assert!(t.time_added.is_some());
    }

    #[test]
    fn a_node_without_gpus_still_publishes_an_empty_pool() {
        let contents = pool_contents(&[], &HealthState::default());
        assert_eq!(contents, vec![SliceContent::Devices(vec![])]);
    }

    /// `profiles/slices/<profile>.yaml` hold what each shipped profile publishes, for the
    /// simulator and examples; they must not drift from the code. `UPDATE_GOLDEN=1`
    /// rewrites them.
    #[test]
    fn shipped_slice_manifests_match_the_profiles() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles");
        for (profile_name, node) in [
            ("8x-h100-80gb-2numa-2nic", "h100-node"),
            ("1x-a5000-2x-t10", "mixed-node"),
            ("4x-a100-40gb-mig", "a100-node"),
        ] {
            let gpus = profile(&format!("{profile_name}.yaml"));
            let node = NodeRef {
                name: node.into(),
                uid: "<node-uid>".into(),
            };
            let text = to_manifests(&build_slices(
                &node,
                "gpu.nvidia.com",
                &pool_contents(&gpus, &HealthState::default()),
                1,
            ));
            let path = dir.join("slices").join(format!("{profile_name}.yaml"));
            if std::env::var_os("UPDATE_GOLDEN").is_some() {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &text).unwrap();
            }
            let golden = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
            assert!(
                golden == text,
                "{} is stale: run with UPDATE_GOLDEN=1",
                path.display()
            );
        }
    }
}
