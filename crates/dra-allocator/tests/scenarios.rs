//! One scenario per allocation rule, written with the crate's builders.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dra_allocator::build::*;
use dra_allocator::{
    AllocError, Allocator, Explanation, Limits, Outcome, Resolved, Snapshot, SnapshotInput,
};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    AllocationResult, CapacityRequestPolicy, CapacityRequestPolicyRange, DeviceTaintRule,
    ResourceClaim, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::json;

const GPU: &str = "gpu.example.com";
const NIC: &str = "nic.example.com";

struct World {
    classes: Vec<ClassBuilder>,
    slices: Vec<ResourceSlice>,
    rules: Vec<DeviceTaintRule>,
    allocated: Vec<AllocationResult>,
}

fn world() -> World {
    World {
        classes: vec![class("gpu")],
        slices: Vec::new(),
        rules: Vec::new(),
        allocated: Vec::new(),
    }
}

impl World {
    fn class(mut self, c: ClassBuilder) -> Self {
        self.classes.push(c);
        self
    }
    fn slice(mut self, s: SliceBuilder) -> Self {
        self.slices.push(s.build());
        self
    }
    fn slices_built(mut self, slices: Vec<ResourceSlice>) -> Self {
        self.slices.extend(slices);
        self
    }
    fn rule(mut self, r: DeviceTaintRule) -> Self {
        self.rules.push(r);
        self
    }
    fn allocated(mut self, devices: &[(&str, &str, &str)]) -> Self {
        self.allocated.push(allocated(devices));
        self
    }
    fn snapshot(self) -> Snapshot {
        Snapshot::new(SnapshotInput {
            classes: self.classes.into_iter().map(ClassBuilder::build).collect(),
            slices: self
                .slices
                .into_iter()
                .map(|s| Arc::new(s.into()))
                .collect(),
            taint_rules: self.rules,
            allocations: self.allocated,
            features: Default::default(),
            selector_cache: None,
        })
    }
}

fn n1() -> Node {
    node("n1").label("zone", "a").build()
}

fn try_run(
    snap: &Snapshot,
    claims: &[ClaimBuilder],
    node: &Node,
) -> Result<Outcome<Resolved>, AllocError> {
    let claims: Vec<ResourceClaim> = claims.iter().map(clone_claim).collect();
    let refs: Vec<&ResourceClaim> = claims.iter().collect();
    Allocator::new(snap, &refs)?.allocate_resolved(node)
}

fn clone_claim(c: &ClaimBuilder) -> ResourceClaim {
    c.clone().build()
}

fn ok(snap: &Snapshot, claims: &[ClaimBuilder]) -> Resolved {
    match try_run(snap, claims, &n1()).expect("no error") {
        Outcome::Allocated(a) => a,
        Outcome::Unfit(e) => panic!("expected an allocation, got: {e}"),
    }
}

fn unfit(snap: &Snapshot, claims: &[ClaimBuilder]) -> Explanation {
    match try_run(snap, claims, &n1()).expect("no error") {
        Outcome::Allocated(a) => panic!("expected no fit, got {:?}", devices(&a, 0)),
        Outcome::Unfit(e) => e,
    }
}

/// `request=device` for each result of claim `i`.
fn devices(a: &Resolved, i: usize) -> Vec<String> {
    let results = a.results[i]
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap();
    results
        .iter()
        .map(|r| format!("{}={}", r.request, r.device))
        .collect()
}

fn gpus(n: usize) -> SliceBuilder {
    slice("n1-gpus", GPU)
        .pool("n1", 1, 1)
        .node("n1")
        .devices((0..n).map(|i| device(&format!("gpu-{i}"))))
}

#[test]
fn exact_count_takes_devices_in_slice_order() {
    let snap = world().slice(gpus(4)).snapshot();
    let a = ok(&snap, &[claim("c").request(request("r", "gpu").count(2))]);
    assert_eq!(devices(&a, 0), ["r=gpu-0", "r=gpu-1"]);
    let sel = a.results[0]
        .node_selector
        .as_ref()
        .expect("node-local devices pin the node");
    let field = &sel.node_selector_terms[0].match_fields.as_ref().unwrap()[0];
    assert_eq!(
        (
            field.key.as_str(),
            field.values.as_ref().unwrap()[0].as_str()
        ),
        ("metadata.name", "n1")
    );
}

#[test]
fn allocated_devices_are_skipped_and_explained() {
    let snap = world()
        .slice(gpus(3))
        .allocated(&[(GPU, "n1", "gpu-0"), (GPU, "n1", "gpu-2")])
        .snapshot();
    let a = ok(&snap, &[claim("c").request(request("r", "gpu"))]);
    assert_eq!(devices(&a, 0), ["r=gpu-1"]);
    let e = unfit(&snap, &[claim("c").request(request("r", "gpu").count(2))]);
    let r = &e.requests[0];
    assert_eq!(
        (
            r.in_class,
            r.match_selectors,
            r.in_use,
            r.available,
            r.needed
        ),
        (3, 3, 2, 1, Some(2))
    );
    let text = e.to_string();
    assert!(
        text.starts_with("node n1: claim default/c request r (needs 2): 3 in class gpu"),
        "{text}"
    );
    assert!(text.contains("2 in use, 1 available"), "{text}");
}

#[test]
fn with_the_gate_off_a_device_that_maps_node_allocatable_resources_is_never_allocated() {
    // DRANodeAllocatableResources off: nothing would count the node CPU the device maps,
    // so it is refused rather than overcommit the node (with the gate on, dra-engine's
    // DynamicResources counts it).
    let mut slice = gpus(2).build();
    let mapped: k8s_openapi::api::resource::v1::NodeAllocatableResource =
        serde_json::from_value(json!({"mapping": {"capacityKey": "gpu.example.com/cpus"}}))
            .unwrap_or_default();
    slice.spec.devices.as_mut().unwrap()[0].node_allocatable_resources =
        Some([("cpu".to_string(), mapped)].into());
    let snap = world().slices_built(vec![slice]).snapshot();
    let a = ok(&snap, &[claim("c").request(request("r", "gpu"))]);
    assert_eq!(devices(&a, 0), ["r=gpu-1"]);
    let e = unfit(&snap, &[claim("c").request(request("r", "gpu").count(2))]);
    let text = e.to_string();
    assert!(
        text.contains(
            "1 map nodeAllocatableResources, which needs the DRANodeAllocatableResources feature gate, 1 available"
        ),
        "{text}"
    );
}

#[test]
fn claims_of_one_pod_never_share_a_device() {
    let snap = world().slice(gpus(3)).snapshot();
    let a = ok(
        &snap,
        &[
            claim("a").request(request("r", "gpu").count(2)),
            claim("b").request(request("r", "gpu")),
        ],
    );
    assert_eq!(devices(&a, 0), ["r=gpu-0", "r=gpu-1"]);
    assert_eq!(devices(&a, 1), ["r=gpu-2"]);
    unfit(
        &snap,
        &[
            claim("a").request(request("r", "gpu").count(2)),
            claim("b").request(request("r", "gpu").count(2)),
        ],
    );
}

#[test]
fn all_mode_takes_every_device_and_fails_if_one_is_in_use() {
    let snap = world().slice(gpus(3)).snapshot();
    let a = ok(&snap, &[claim("c").request(request("r", "gpu").all())]);
    assert_eq!(devices(&a, 0), ["r=gpu-0", "r=gpu-1", "r=gpu-2"]);
    let busy = world()
        .slice(gpus(3))
        .allocated(&[(GPU, "n1", "gpu-1")])
        .snapshot();
    let e = unfit(&busy, &[claim("c").request(request("r", "gpu").all())]);
    assert_eq!(e.requests[0].needed, None);
    assert_eq!(e.requests[0].in_use, 1);
}

#[test]
fn all_mode_with_no_device_does_not_fit() {
    let snap = world().snapshot();
    unfit(&snap, &[claim("c").request(request("r", "gpu").all())]);
}

#[test]
fn all_mode_errors_on_an_incomplete_pool() {
    let snap = world().slice(gpus(2).pool("n1", 1, 2)).snapshot();
    let err = try_run(
        &snap,
        &[claim("c").request(request("r", "gpu").all())],
        &n1(),
    )
    .unwrap_err();
    assert!(matches!(err, AllocError::PoolNotReady { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("resource pool gpu.example.com/n1 is currently being updated"),
        "{err}"
    );
}

#[test]
fn exact_count_skips_incomplete_pools_and_uses_complete_ones() {
    let snap = world()
        .slice(gpus(2).pool("n1", 1, 2))
        .slice(
            slice("n1-b", GPU)
                .pool("other", 1, 1)
                .node("n1")
                .device(device("b-0")),
        )
        .snapshot();
    let a = ok(&snap, &[claim("c").request(request("r", "gpu"))]);
    assert_eq!(devices(&a, 0), ["r=b-0"]);
    let e = unfit(&snap, &[claim("c").request(request("r", "gpu").count(2))]);
    assert_eq!(e.incomplete_pools, ["gpu.example.com/n1"]);
}

#[test]
fn only_the_newest_pool_generation_counts() {
    let snap = world()
        .slice(
            slice("old", GPU)
                .pool("n1", 1, 1)
                .node("n1")
                .device(device("old-0")),
        )
        .slice(
            slice("new", GPU)
                .pool("n1", 2, 1)
                .node("n1")
                .device(device("new-0")),
        )
        .snapshot();
    let a = ok(&snap, &[claim("c").request(request("r", "gpu"))]);
    assert_eq!(devices(&a, 0), ["r=new-0"]);
    unfit(&snap, &[claim("c").request(request("r", "gpu").count(2))]);
}

#[test]
fn duplicate_device_names_make_a_pool_invalid() {
    let snap = world()
        .slice(
            slice("s1", GPU)
                .pool("p", 1, 2)
                .node("n1")
                .device(device("gpu-0")),
        )
        .slice(
            slice("s2", GPU)
                .pool("p", 1, 2)
                .node("n1")
                .device(device("gpu-0")),
        )
        .snapshot();
    let e = unfit(&snap, &[claim("c").request(request("r", "gpu"))]);
    assert_eq!(
        e.invalid_pools,
        ["gpu.example.com/p (duplicate device name gpu-0)"]
    );
}

#[test]
fn pools_are_searched_by_driver_then_name() {
    let snap = world()
        .slice(
            slice("z", GPU)
                .pool("zz", 1, 1)
                .node("n1")
                .device(device("z-0")),
        )
        .slice(
            slice("a", GPU)
                .pool("aa", 1, 1)
                .node("n1")
                .device(device("a-0")),
        )
        .slice(
            slice("x", "aaa.example.com")
                .pool("zz", 1, 1)
                .node("n1")
                .device(device("x-0")),
        )
        .snapshot();
    let a = ok(&snap, &[claim("c").request(request("r", "gpu").count(3))]);
    assert_eq!(devices(&a, 0), ["r=x-0", "r=a-0", "r=z-0"]);
}

#[test]
fn slices_for_other_nodes_are_invisible() {
    let snap = world()
        .slice(slice("n2", GPU).node("n2").device(device("gpu-0")))
        .snapshot();
    let e = unfit(&snap, &[claim("c").request(request("r", "gpu"))]);
    assert_eq!(e.requests[0].on_node, 0);
}

#[test]
fn node_selector_slices_match_by_label_and_the_result_carries_the_selector() {
    let snap = world()
        .slice(
            slice("net", GPU)
                .node_selector(label_selector("zone", &["a"]))
                .device(device("d0")),
        )
        .slice(
            slice("other", GPU)
                .node_selector(label_selector("zone", &["b"]))
                .device(device("d1")),
        )
        .snapshot();
    let a = ok(&snap, &[claim("c").request(request("r", "gpu"))]);
    assert_eq!(devices(&a, 0), ["r=d0"]);
    let sel = a.results[0].node_selector.as_ref().unwrap();
    assert_eq!(sel, &label_selector("zone", &["a"]));
}

#[test]
fn all_nodes_devices_need_no_node_selector() {
    let snap = world()
        .slice(slice("shared", GPU).all_nodes().device(device("d0")))
        .snapshot();
    let a = ok(&snap, &[claim("c").request(request("r", "gpu"))]);
    assert_eq!(devices(&a, 0), ["r=d0"]);
    assert_eq!(a.results[0].node_selector, None);
}

#[test]
fn per_device_node_selection_filters_devices() {
    let snap = world()
        .slice(
            slice("pd", GPU)
                .per_device_nodes()
                .device(device("far").on_node("n2"))
                .device(device("near").on_node("n1"))
                .device(device("any").on_all_nodes()),
        )
        .snapshot();
    let a = ok(&snap, &[claim("c").request(request("r", "gpu").count(2))]);
    assert_eq!(devices(&a, 0), ["r=near", "r=any"]);
    unfit(&snap, &[claim("c").request(request("r", "gpu").count(3))]);
}

#[test]
fn first_available_falls_back_in_order_and_reports_the_rank() {
    let snap = world().slice(gpus(2)).snapshot();
    let c = claim("c").request(first_available(
        "r",
        vec![
            request("big", "gpu").count(4),
            request("mid", "gpu").count(2),
            request("one", "gpu"),
        ],
    ));
    let a = ok(&snap, &[c]);
    assert_eq!(devices(&a, 0), ["r/mid=gpu-0", "r/mid=gpu-1"]);
    assert_eq!(a.quality.ranks, vec![Some(1)]);
    assert_eq!(a.quality.prioritized_score, 7);
}

#[test]
fn admin_access_may_use_allocated_devices_and_is_marked() {
    let snap = world()
        .slice(gpus(1))
        .allocated(&[(GPU, "n1", "gpu-0")])
        .snapshot();
    let a = ok(&snap, &[claim("c").request(request("r", "gpu").admin())]);
    let r = &a.results[0]
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap()[0];
    assert_eq!((r.device.as_str(), r.admin_access), ("gpu-0", Some(true)));
    // Admin results are not counted as allocated.
    let mut snap2 = world().slice(gpus(1)).snapshot();
    snap2.add_allocation(&a.results[0]);
    let b = ok(&snap2, &[claim("d").request(request("r", "gpu"))]);
    assert_eq!(devices(&b, 0), ["r=gpu-0"]);
}

#[test]
fn in_flight_allocations_can_be_added_and_removed() {
    let mut snap = world().slice(gpus(1)).snapshot();
    let a = ok(&snap, &[claim("c").request(request("r", "gpu"))]);
    snap.add_allocation(&a.results[0]);
    unfit(&snap, &[claim("d").request(request("r", "gpu"))]);
    snap.remove_allocation(&a.results[0]);
    ok(&snap, &[claim("d").request(request("r", "gpu"))]);
}

fn numa_gpus() -> SliceBuilder {
    // gpu-0..3 on NUMA 0, gpu-4..7 on NUMA 1.
    gpu_slice("n1", GPU, 8, 2)
}

#[test]
fn match_attribute_keeps_devices_on_one_numa_node() {
    let snap = world()
        .slice(numa_gpus())
        .allocated(&[(GPU, "n1", "gpu-1")])
        .snapshot();
    let c = claim("c")
        .request(request("r", "gpu").count(4))
        .match_attribute("resource.kubernetes.io/numaNode", &[]);
    let a = ok(&snap, &[c]);
    assert_eq!(devices(&a, 0), ["r=gpu-4", "r=gpu-5", "r=gpu-6", "r=gpu-7"]);
    assert_eq!(a.quality.numa_domains_broken, 1);
    assert_eq!(a.quality.free_numa_domains_after, 0);
}

#[test]
fn match_attribute_across_drivers_uses_the_qualified_name() {
    let snap = world()
        .slice(numa_gpus())
        .slice(
            slice("n1-nics", NIC)
                .pool("n1", 1, 1)
                .node("n1")
                .device(device("nic-0").int("resource.kubernetes.io/numaNode", 1)),
        )
        .snapshot();
    // Without CEL, both classes see both drivers; the NIC request is for the NIC only by name.
    let c = claim("c")
        .request(request("gpu", "gpu").count(2))
        .request(request("nic", "gpu").count(1))
        .match_attribute("resource.kubernetes.io/numaNode", &["gpu", "nic"]);
    let a = ok(&snap, &[c]);
    // Pools sorted by driver: gpu.example.com before nic.example.com.
    assert_eq!(devices(&a, 0), ["gpu=gpu-0", "gpu=gpu-1", "nic=gpu-2"]);
}

#[test]
fn match_attribute_unsatisfiable_is_explained() {
    let snap = world().slice(numa_gpus()).snapshot();
    let c = claim("c")
        .request(request("r", "gpu").count(5))
        .match_attribute("resource.kubernetes.io/numaNode", &[]);
    let e = unfit(&snap, &[c]);
    assert!(
        e.notes[0].contains(
            "matchAttribute resource.kubernetes.io/numaNode: at most 4 free devices share one value"
        ),
        "{e}"
    );
}

#[test]
fn match_attribute_with_a_driver_local_name() {
    let snap = world()
        .slice(
            slice("s", GPU)
                .node("n1")
                .device(device("a").string("model", "x"))
                .device(device("b").string("model", "y"))
                .device(device("c").string("model", "y")),
        )
        .snapshot();
    let c = claim("c")
        .request(request("r", "gpu").count(2))
        .match_attribute("gpu.example.com/model", &[]);
    assert_eq!(devices(&ok(&snap, &[c]), 0), ["r=b", "r=c"]);
}

#[test]
fn distinct_attribute_takes_different_values() {
    let snap = world().slice(numa_gpus()).snapshot();
    let c = claim("c")
        .request(request("r", "gpu").count(2))
        .distinct_attribute("resource.kubernetes.io/numaNode", &[]);
    assert_eq!(devices(&ok(&snap, &[c]), 0), ["r=gpu-0", "r=gpu-4"]);
    let c3 = claim("c")
        .request(request("r", "gpu").count(3))
        .distinct_attribute("resource.kubernetes.io/numaNode", &[]);
    let e = unfit(&snap, &[c3]);
    assert!(
        e.notes[0].contains("2 distinct values among free devices, 3 needed"),
        "{e}"
    );
}

#[test]
fn constraint_on_named_requests_ignores_others() {
    let snap = world().slice(numa_gpus()).snapshot();
    let c = claim("c")
        .request(request("a", "gpu").count(1))
        .request(request("b", "gpu").count(4))
        .match_attribute("resource.kubernetes.io/numaNode", &["b"]);
    assert_eq!(
        devices(&ok(&snap, &[c]), 0),
        ["a=gpu-0", "b=gpu-4", "b=gpu-5", "b=gpu-6", "b=gpu-7"]
    );
}

#[test]
fn taints_block_unless_tolerated_and_tolerations_are_copied() {
    let snap = world()
        .slice(
            slice("s", GPU)
                .node("n1")
                .device(device("bad").taint("broken", "", "NoSchedule"))
                .device(device("info").taint("note", "x", "None"))
                .device(device("evict").taint("maint", "now", "NoExecute")),
        )
        .snapshot();
    let a = ok(&snap, &[claim("c").request(request("r", "gpu"))]);
    assert_eq!(devices(&a, 0), ["r=info"], "effect None does not block");
    let e = unfit(&snap, &[claim("c").request(request("r", "gpu").count(2))]);
    assert_eq!(e.requests[0].tainted, 2);
    let c = claim("c").request(
        request("r", "gpu")
            .count(2)
            .tolerate("broken", None, "NoSchedule"),
    );
    let a = ok(&snap, &[c]);
    assert_eq!(devices(&a, 0), ["r=bad", "r=info"]);
    let r = &a.results[0]
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        r.tolerations.as_ref().unwrap()[0].key.as_deref(),
        Some("broken")
    );
    let wrong_value = claim("c").request(request("r", "gpu").count(2).tolerate(
        "maint",
        Some("later"),
        "",
    ));
    unfit(&snap, &[wrong_value]);
    let right_value = claim("c").request(request("r", "gpu").count(2).tolerate(
        "maint",
        Some("now"),
        "",
    ));
    assert_eq!(
        devices(&ok(&snap, &[right_value]), 0),
        ["r=info", "r=evict"]
    );
}

#[test]
fn device_taint_rules_apply_like_slice_taints() {
    let snap = world()
        .slice(gpus(2))
        .rule(taint_rule(
            "drain",
            Some(GPU),
            Some("n1"),
            Some("gpu-0"),
            "drain",
            "NoSchedule",
        ))
        .snapshot();
    let a = ok(&snap, &[claim("c").request(request("r", "gpu"))]);
    assert_eq!(devices(&a, 0), ["r=gpu-1"]);
    let all = world()
        .slice(gpus(2))
        .rule(taint_rule("all", Some(GPU), None, None, "k", "NoExecute"))
        .snapshot();
    let e = unfit(&all, &[claim("c").request(request("r", "gpu"))]);
    assert_eq!(e.requests[0].tainted, 2);
}

#[test]
fn configs_from_class_then_claim_collapse_to_all() {
    let snap = world()
        .class(class("cfg").config(GPU, json!({"sharing": "mps"})))
        .slice(gpus(3))
        .snapshot();
    let c = claim("c")
        .request(request("a", "cfg"))
        .request(request("b", "cfg"))
        .request(request("x", "gpu"))
        .config(&["a"], GPU, json!({"a": 1}))
        .config(&[], GPU, json!({"all": true}))
        .config(&["nope"], GPU, json!({"never": true}));
    let a = ok(&snap, &[c]);
    let cfg = a.results[0]
        .devices
        .as_ref()
        .unwrap()
        .config
        .as_ref()
        .unwrap();
    let summary: Vec<_> = cfg
        .iter()
        .map(|c| {
            (
                c.source.as_str(),
                c.requests.clone(),
                c.opaque.as_ref().unwrap().parameters.0.clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                "FromClass",
                Some(vec!["a".to_string(), "b".to_string()]),
                json!({"sharing": "mps"})
            ),
            ("FromClaim", Some(vec!["a".to_string()]), json!({"a": 1})),
            ("FromClaim", None, json!({"all": true})),
        ]
    );
}

#[test]
fn more_than_32_results_per_claim_is_an_error() {
    let snap = world().slice(gpus(40)).snapshot();
    let err = try_run(
        &snap,
        &[claim("c").request(request("r", "gpu").count(33))],
        &n1(),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("exceeds the claim limit of 32"),
        "{err}"
    );
    let a = ok(&snap, &[claim("c").request(request("r", "gpu").count(32))]);
    assert_eq!(devices(&a, 0).len(), 32);
}

#[test]
fn missing_class_is_an_error_naming_claim_and_request() {
    let snap = world().slice(gpus(1)).snapshot();
    let err = try_run(&snap, &[claim("c").request(request("r", "nope"))], &n1()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "claim default/c, request r: device class nope not found"
    );
}

fn mig_slices() -> Vec<SliceBuilder> {
    // One A100 (40Gi, 7 compute slices) shared by the full GPU and its MIG profiles.
    let counters = slice("n1-counters", GPU)
        .pool("n1", 1, 2)
        .node("n1")
        .counter_set("gpu-0", &[("memory", "40Gi"), ("slices", "7")]);
    let devices = slice("n1-devices", GPU)
        .pool("n1", 1, 2)
        .node("n1")
        .device(
            device("gpu-0")
                .string("type", "gpu")
                .consumes("gpu-0", &[("memory", "40Gi"), ("slices", "7")]),
        )
        .devices((0..7).map(|i| {
            device(&format!("gpu-0-mig-1g-{i}"))
                .string("type", "mig")
                .consumes("gpu-0", &[("memory", "5Gi"), ("slices", "1")])
        }))
        .device(
            device("gpu-0-mig-3g-0")
                .string("type", "mig")
                .consumes("gpu-0", &[("memory", "20Gi"), ("slices", "3")]),
        );
    vec![counters, devices]
}

#[test]
fn partitionable_counters_exclude_the_full_gpu_when_a_mig_slice_is_used() {
    let mut w = world();
    for s in mig_slices() {
        w = w.slice(s);
    }
    let snap = w.allocated(&[(GPU, "n1", "gpu-0-mig-1g-3")]).snapshot();
    let a = ok(&snap, &[claim("c").request(request("r", "gpu").count(2))]);
    assert_eq!(
        devices(&a, 0),
        ["r=gpu-0-mig-1g-0", "r=gpu-0-mig-1g-1"],
        "the full GPU no longer fits"
    );
    // 6 of 7 slices left: six 1g, or one 3g plus three 1g, but never seven.
    let e = unfit(&snap, &[claim("c").request(request("r", "gpu").count(7))]);
    assert_eq!(e.requests[0].blocked_by_counters, 1, "{e}");
    let a = ok(&snap, &[claim("c").request(request("r", "gpu").count(6))]);
    assert_eq!(devices(&a, 0).len(), 6);
}

#[test]
fn invalid_counter_reference_makes_the_pool_invalid() {
    let snap = world()
        .slice(
            slice("s", GPU)
                .node("n1")
                .device(device("d").consumes("missing", &[("memory", "1")])),
        )
        .snapshot();
    let e = unfit(&snap, &[claim("c").request(request("r", "gpu"))]);
    assert_eq!(
        e.invalid_pools,
        ["gpu.example.com/s (counter set missing not found)"]
    );
}

#[test]
fn consumable_capacity_shares_a_device_within_its_capacity() {
    let snap = world()
        .slice(
            slice("s", GPU)
                .node("n1")
                .device(device("shared").multi().capacity("memory", "40Gi")),
        )
        .snapshot();
    let c = claim("c")
        .request(request("a", "gpu").capacity("memory", "30Gi"))
        .request(request("b", "gpu").capacity("memory", "10Gi"));
    let a = ok(&snap, &[c]);
    let results = a.results[0]
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap();
    assert_eq!(devices(&a, 0), ["a=shared", "b=shared"]);
    assert_eq!(
        results[0].consumed_capacity.as_ref().unwrap()["memory"],
        Quantity((30u64 << 30).to_string())
    );
    let (s0, s1) = (
        results[0].share_id.clone().unwrap(),
        results[1].share_id.clone().unwrap(),
    );
    assert_ne!(s0, s1, "each share gets its own shareID");
    assert_eq!(s0.len(), 36);
    let too_much = claim("c")
        .request(request("a", "gpu").capacity("memory", "30Gi"))
        .request(request("b", "gpu").capacity("memory", "11Gi"));
    let e = unfit(&snap, &[too_much]);
    assert!(e.to_string().contains("can be met alone"), "{e}");
    // What is allocated already counts against the capacity.
    let mut snap = snap;
    snap.add_allocation(&a.results[0]);
    let e = unfit(
        &snap,
        &[claim("d").request(request("a", "gpu").capacity("memory", "1"))],
    );
    assert_eq!(e.requests[0].blocked_by_capacity, 1, "{e}");
}

#[test]
fn capacity_request_policy_rounds_up() {
    let policy = CapacityRequestPolicy {
        default: Some(Quantity("1Gi".into())),
        valid_range: Some(CapacityRequestPolicyRange {
            min: Quantity("1Gi".into()),
            max: Some(Quantity("8Gi".into())),
            step: Some(Quantity("1Gi".into())),
        }),
        valid_values: None,
    };
    let snap = world()
        .slice(
            slice("s", GPU).node("n1").device(
                device("d")
                    .multi()
                    .capacity_policy("memory", "10Gi", policy),
            ),
        )
        .snapshot();
    let a = ok(
        &snap,
        &[claim("c").request(request("a", "gpu").capacity("memory", "1500Mi"))],
    );
    let r = &a.results[0]
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        r.consumed_capacity.as_ref().unwrap()["memory"],
        Quantity((2u64 << 30).to_string())
    );
    let none = ok(&snap, &[claim("c").request(request("a", "gpu"))]);
    let r = &none.results[0]
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        r.consumed_capacity.as_ref().unwrap()["memory"],
        Quantity((1u64 << 30).to_string()),
        "default"
    );
    let e = unfit(
        &snap,
        &[claim("c").request(request("a", "gpu").capacity("memory", "9Gi"))],
    );
    assert_eq!(e.requests[0].capacity_mismatch, 1);
}

#[test]
fn binding_condition_pools_come_last_and_conditions_are_copied() {
    let snap = world()
        .slice(
            slice("a-bind", GPU)
                .pool("a", 1, 1)
                .node("n1")
                .device(device("slow").binding_conditions(&["Ready"], &["Failed"])),
        )
        .slice(
            slice("z-plain", GPU)
                .pool("z", 1, 1)
                .node("n1")
                .device(device("fast")),
        )
        .snapshot();
    let a = ok(&snap, &[claim("c").request(request("r", "gpu").count(2))]);
    assert_eq!(devices(&a, 0), ["r=fast", "r=slow"]);
    let r = &a.results[0]
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap()[1];
    assert_eq!(
        r.binding_conditions.as_deref(),
        Some(&["Ready".to_string()][..])
    );
    assert_eq!(
        r.binding_failure_conditions.as_deref(),
        Some(&["Failed".to_string()][..])
    );
}

#[test]
fn binds_to_node_pins_the_node_even_for_shared_devices() {
    let snap = world()
        .slice(
            slice("s", GPU)
                .all_nodes()
                .device(device("d").binds_to_node()),
        )
        .snapshot();
    let a = ok(&snap, &[claim("c").request(request("r", "gpu"))]);
    let sel = a.results[0]
        .node_selector
        .as_ref()
        .expect("bindsToNode pins the node");
    assert_eq!(
        sel.node_selector_terms[0].match_fields.as_ref().unwrap()[0]
            .values
            .as_ref()
            .unwrap(),
        &["n1"]
    );
}

#[test]
fn n_of_n_minus_one_is_refused_without_search() {
    let snap = world().slice(gpu_slice("n1", GPU, 31, 1)).snapshot();
    let claims = [claim("c").request(request("r", "gpu").count(32))];
    let refs: Vec<ResourceClaim> = claims.iter().map(clone_claim).collect();
    let allocator = Allocator::new(&snap, &refs.iter().collect::<Vec<_>>()).unwrap();
    let (outcome, stats) = allocator.allocate_with(&n1(), Limits::default()).unwrap();
    assert!(outcome.explanation().is_some());
    assert!(stats.steps < 10, "steps {}", stats.steps);
    // Split over two requests the union bound catches it too.
    let two = [claim("c")
        .request(request("a", "gpu").count(16))
        .request(request("b", "gpu").count(16))];
    let refs: Vec<ResourceClaim> = two.iter().map(clone_claim).collect();
    let allocator = Allocator::new(&snap, &refs.iter().collect::<Vec<_>>()).unwrap();
    let (outcome, stats) = allocator.allocate_with(&n1(), Limits::default()).unwrap();
    assert!(outcome.explanation().is_some());
    assert!(stats.steps < 10, "steps {}", stats.steps);
}

#[test]
fn twenty_requests_sharing_one_value_are_refused_fast() {
    // 32 unique GPUs (distinct uuid) over 4 NUMA domains: 8 per value, 20 needed.
    let s = slice("n1-gpus", GPU)
        .pool("n1", 1, 1)
        .node("n1")
        .devices((0..32).map(|i| {
            device(&format!("gpu-{i}"))
                .string("uuid", &format!("GPU-{i:04}"))
                .int("resource.kubernetes.io/numaNode", i / 8)
        }));
    let snap = world().slice(s).snapshot();
    let mut c = claim("c");
    for i in 0..20 {
        c = c.request(request(&format!("r{i}"), "gpu"));
    }
    let c = c.match_attribute("resource.kubernetes.io/numaNode", &[]);
    let refs = [clone_claim(&c)];
    let allocator = Allocator::new(&snap, &[&refs[0]]).unwrap();
    let (outcome, stats) = allocator
        .allocate_with(
            &n1(),
            Limits {
                deadline: Some(Instant::now() + Duration::from_secs(5)),
                cancel: None,
            },
        )
        .unwrap();
    let e = outcome.explanation().expect("no value has 20 devices");
    assert!(
        e.notes[0].contains("at most 8 free devices share one value"),
        "{e}"
    );
    assert!(stats.steps < 1000, "steps {}", stats.steps);
    // With 8 requests it fits on NUMA 0.
    let mut c8 = claim("c");
    for i in 0..8 {
        c8 = c8.request(request(&format!("r{i}"), "gpu"));
    }
    let a = ok(
        &snap,
        &[c8.match_attribute("resource.kubernetes.io/numaNode", &[])],
    );
    assert_eq!(devices(&a, 0).last().unwrap(), "r7=gpu-7");
}

#[test]
fn identical_devices_are_tried_once() {
    // 2 requests of 16 from 31 identical devices: the union bound refuses; 15+17 of 32
    // with one device broken by a taint for the second request only explores little.
    let snap = world().slice(gpus(32)).snapshot();
    let c = claim("c")
        .request(request("a", "gpu").count(15))
        .request(request("b", "gpu").count(17));
    let refs = [clone_claim(&c)];
    let (outcome, stats) = Allocator::new(&snap, &[&refs[0]])
        .unwrap()
        .allocate_with(&n1(), Limits::default())
        .unwrap();
    assert!(outcome.allocation().is_some());
    assert!(stats.steps < 100, "steps {}", stats.steps);
}

// ---- Selectors (CEL via dra-cel) ----

fn two_drivers() -> World {
    world()
        .class(class("gpu-only").selector(&format!("device.driver == \"{GPU}\"")))
        .class(class("nic-only").selector(&format!("device.driver == \"{NIC}\"")))
        .slice(
            slice("n1-gpus", GPU)
                .node("n1")
                .device(
                    device("g0")
                        .string("model", "a100")
                        .int("resource.kubernetes.io/numaNode", 0),
                )
                .device(
                    device("g1")
                        .string("model", "h100")
                        .int("resource.kubernetes.io/numaNode", 1),
                ),
        )
        .slice(
            slice("n1-nics", NIC)
                .node("n1")
                .device(device("nic0").int("resource.kubernetes.io/numaNode", 0))
                .device(device("nic1").int("resource.kubernetes.io/numaNode", 1)),
        )
}

#[test]
fn class_and_request_selectors_both_apply() {
    let snap = two_drivers().snapshot();
    let c = claim("c").request(
        request("r", "gpu-only")
            .selector(&format!("device.attributes[\"{GPU}\"].model == \"h100\"")),
    );
    assert_eq!(devices(&ok(&snap, &[c]), 0), ["r=g1"]);
    let none = claim("c").request(
        request("r", "gpu-only")
            .selector(&format!("device.attributes[\"{GPU}\"].model == \"v100\"")),
    );
    let e = unfit(&snap, &[none]);
    assert_eq!(
        (
            e.requests[0].on_node,
            e.requests[0].in_class,
            e.requests[0].match_selectors
        ),
        (4, 2, 0)
    );
}

/// A selector's result is shared with the devices after the first evaluated that read the
/// same, up to the first that does not: a different device in the middle of a slice, and
/// the like devices after it, each get their own answer, cold and warm.
#[test]
fn a_selector_result_is_shared_only_by_devices_that_read_the_same() {
    let models = ["a100", "a100", "h100", "a100", "h100", "h100"];
    let six = || {
        slice("n1-gpus", GPU).pool("n1", 1, 1).node("n1").devices(
            models
                .iter()
                .enumerate()
                .map(|(i, m)| device(&format!("gpu-{i}")).string("model", m)),
        )
    };
    let snap = world().slice(six()).snapshot();
    let model_is = |model: &str| {
        claim("c").request(request("r", "gpu").all().selector(&format!(
            "device.attributes[\"{GPU}\"].model == \"{model}\""
        )))
    };
    for _ in 0..2 {
        assert_eq!(
            devices(&ok(&snap, &[model_is("a100")]), 0),
            ["r=gpu-0", "r=gpu-1", "r=gpu-3"]
        );
        assert_eq!(
            devices(&ok(&snap, &[model_is("h100")]), 0),
            ["r=gpu-2", "r=gpu-4", "r=gpu-5"]
        );
    }
    // A fresh snapshot asked for h100 first: gpu-0's "no" is not carried past gpu-1.
    let fresh = world().slice(six()).snapshot();
    assert_eq!(
        devices(&ok(&fresh, &[model_is("h100")]), 0),
        ["r=gpu-2", "r=gpu-4", "r=gpu-5"]
    );
}

#[test]
fn gpu_and_nic_on_the_same_numa_node_across_drivers() {
    let snap = two_drivers()
        .allocated(&[(NIC, "n1-nics", "nic0")])
        .snapshot();
    let c = claim("c")
        .request(request("gpu", "gpu-only"))
        .request(request("nic", "nic-only"))
        .match_attribute("resource.kubernetes.io/numaNode", &[]);
    // nic0 (NUMA 0) is taken, so g0 must give way to g1 to pair with nic1.
    assert_eq!(devices(&ok(&snap, &[c]), 0), ["gpu=g1", "nic=nic1"]);
}

#[test]
fn a_selector_error_fails_the_whole_attempt_naming_the_class() {
    let snap = world()
        .class(class("broken").selector("device.attributes[\"gpu.example.com\"].missing == 1"))
        .slice(
            slice("s", GPU)
                .node("n1")
                .device(device("d").string("model", "x")),
        )
        .snapshot();
    let err = try_run(&snap, &[claim("c").request(request("r", "broken"))], &n1()).unwrap_err();
    assert!(matches!(err, AllocError::Cel { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("class broken: selector #0 on device gpu.example.com/s/d"),
        "{err}"
    );
}

#[test]
fn a_selector_error_on_a_device_in_use_is_never_met() {
    // Upstream checks "in use" before CEL; so do we.
    let snap = world()
        .class(class("picky").selector("device.attributes[\"gpu.example.com\"].model == \"x\""))
        .slice(
            slice("s", GPU)
                .node("n1")
                .device(device("bad"))
                .device(device("good").string("model", "x")),
        )
        .allocated(&[(GPU, "s", "bad")])
        .snapshot();
    let a = ok(&snap, &[claim("c").request(request("r", "picky"))]);
    assert_eq!(devices(&a, 0), ["r=good"]);
}

#[test]
fn admin_access_never_takes_a_device_twice_in_one_claim() {
    let snap = world().slice(gpus(1)).snapshot();
    let c = claim("c")
        .request(request("a", "gpu").admin())
        .request(request("b", "gpu").admin());
    unfit(&snap, &[c]);
    let two = [
        claim("c").request(request("a", "gpu").admin()),
        claim("d").request(request("b", "gpu").admin()),
    ];
    let a = ok(&snap, &two);
    assert_eq!(
        (devices(&a, 0), devices(&a, 1)),
        (vec!["a=gpu-0".to_string()], vec!["b=gpu-0".to_string()])
    );
}

#[test]
fn list_attributes_match_by_intersection_when_the_feature_is_on() {
    let world = world().slice(
        slice("s", GPU)
            .node("n1")
            .device(device("a").strings("pcieRoots", &["p1", "p2"]))
            .device(device("b").strings("pcieRoots", &["p3"]))
            .device(device("c").strings("pcieRoots", &["p2", "p3"])),
    );
    let snap = Snapshot::new(SnapshotInput {
        classes: world.classes.into_iter().map(ClassBuilder::build).collect(),
        slices: world
            .slices
            .into_iter()
            .map(|s| Arc::new(s.into()))
            .collect(),
        features: dra_allocator::Features {
            list_type_attributes: true,
            ..Default::default()
        },
        ..Default::default()
    });
    let c = claim("c")
        .request(request("r", "gpu").count(2))
        .match_attribute("gpu.example.com/pcieRoots", &[]);
    assert_eq!(devices(&ok(&snap, &[c]), 0), ["r=a", "r=c"]);
    let d = claim("c")
        .request(request("r", "gpu").count(2))
        .distinct_attribute("gpu.example.com/pcieRoots", &[]);
    assert_eq!(devices(&ok(&snap, &[d]), 0), ["r=a", "r=b"]);
}

#[test]
fn the_snapshot_is_shared_between_threads() {
    let snap = std::sync::Arc::new(world().slice(gpus(8)).snapshot());
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let snap = snap.clone();
            std::thread::spawn(move || {
                let c = claim("c").request(request("r", "gpu").count(2)).build();
                let a = Allocator::new(&snap, &[&c])
                    .unwrap()
                    .allocate_resolved(&n1())
                    .unwrap();
                let a = a.allocation().unwrap().results[0].clone();
                a.devices.unwrap().results.unwrap().len()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 2);
    }
}

#[test]
fn cancellation_and_deadline_abort_a_long_search() {
    // An `All` request under a constraint makes the search exactly upstream's (no pruning):
    // eight requests over 16 distinct GPUs succeed in many ways, then "all" fails each time.
    let s = slice("n1-gpus", GPU)
        .pool("n1", 1, 1)
        .node("n1")
        .devices((0..16).map(|i| device(&format!("gpu-{i}")).int("id", i)));
    let snap = world().slice(s).snapshot();
    let mut c = claim("c");
    for i in 0..8 {
        c = c.request(request(&format!("r{i}"), "gpu"));
    }
    let c = c
        .request(request("rest", "gpu").all())
        .distinct_attribute("gpu.example.com/id", &[])
        .build();
    let allocator = Allocator::new(&snap, &[&c]).unwrap();
    let cancel = std::sync::atomic::AtomicBool::new(true);
    let err = allocator
        .allocate_with(
            &n1(),
            Limits {
                deadline: None,
                cancel: Some(&cancel),
            },
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            AllocError::Aborted {
                why: "cancelled",
                ..
            }
        ),
        "{err}"
    );
    let soon = Instant::now() + Duration::from_millis(20);
    let err = allocator
        .allocate_with(
            &n1(),
            Limits {
                deadline: Some(soon),
                cancel: None,
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("deadline exceeded"), "{err}");
}

#[test]
fn packing_keeps_whole_numa_domains_free() {
    // gpu-0..3 on NUMA 0 (all free), gpu-4..7 on NUMA 1 with gpu-5 in use.
    let snap = world()
        .slice(numa_gpus())
        .allocated(&[(GPU, "n1", "gpu-5")])
        .snapshot();
    let c = claim("c").request(request("r", "gpu").count(2)).build();
    let first_fit = Allocator::new(&snap, &[&c])
        .unwrap()
        .allocate_resolved(&n1())
        .unwrap();
    let first_fit = first_fit.allocation().unwrap();
    assert_eq!(
        devices(first_fit, 0),
        ["r=gpu-0", "r=gpu-1"],
        "upstream order"
    );
    assert_eq!(first_fit.quality.numa_domains_broken, 1);
    let packed = Allocator::new(&snap, &[&c])
        .unwrap()
        .packing(true)
        .allocate_resolved(&n1())
        .unwrap();
    let packed = packed.allocation().unwrap();
    assert_eq!(devices(packed, 0), ["r=gpu-4", "r=gpu-6"]);
    assert_eq!(packed.quality.numa_domains_broken, 0);
    assert_eq!(packed.quality.free_numa_domains_after, 1);
}

#[test]
fn selector_results_survive_a_snapshot_rebuild() {
    let first = two_drivers().snapshot();
    let c = claim("c").request(
        request("r", "gpu-only")
            .selector(&format!("device.attributes[\"{GPU}\"].model == \"h100\"")),
    );
    assert_eq!(devices(&ok(&first, std::slice::from_ref(&c)), 0), ["r=g1"]);
    let w = two_drivers();
    let second = Snapshot::new(SnapshotInput {
        classes: w.classes.into_iter().map(ClassBuilder::build).collect(),
        slices: w.slices.into_iter().map(|s| Arc::new(s.into())).collect(),
        selector_cache: Some(first.selector_cache()),
        ..Default::default()
    });
    assert!(std::sync::Arc::ptr_eq(
        &first.selector_cache(),
        &second.selector_cache()
    ));
    assert_eq!(
        devices(&ok(&second, &[c]), 0),
        ["r=g1"],
        "same answer from cached results"
    );
    // A cache built for other CEL options is not reused.
    let third = Snapshot::new(SnapshotInput {
        selector_cache: Some(first.selector_cache()),
        features: dra_allocator::Features {
            list_type_attributes: true,
            ..Default::default()
        },
        ..Default::default()
    });
    assert!(!std::sync::Arc::ptr_eq(
        &first.selector_cache(),
        &third.selector_cache()
    ));
}

#[test]
fn slices_using_compatibility_groups_are_ignored_while_the_feature_is_off() {
    let mut grouped = slice("s2", GPU)
        .pool("p", 1, 2)
        .node("n1")
        .device(device("g1").consumes("cs", &[("mem", "1")]))
        .build();
    grouped.spec.devices.as_mut().unwrap()[0]
        .consumes_counters
        .as_mut()
        .unwrap()[0]
        .compatibility_groups = Some(vec!["mig".into()]);
    let mut w = world().slice(
        slice("s1", GPU)
            .pool("p", 1, 2)
            .node("n1")
            .device(device("g0")),
    );
    w.slices.push(grouped);
    let snap = w.snapshot();
    let e = unfit(&snap, &[claim("c").request(request("r", "gpu"))]);
    assert_eq!(e.incomplete_pools, ["gpu.example.com/p"], "{e}");
}

#[test]
fn one_allocator_serves_many_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Snapshot>();
    shareable::<Allocator<'static>>();
    let snap = world().slice(gpus(2)).snapshot();
    let c = claim("c").request(request("r", "gpu")).build();
    let allocator = Allocator::new(&snap, &[&c]).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| allocator.allocate_resolved(&n1()).unwrap()))
            .collect();
        for h in handles {
            assert_eq!(
                devices(h.join().unwrap().allocation().unwrap(), 0),
                ["r=gpu-0"]
            );
        }
    });
}

// ---- Issue 12: bounds over shared counters and consumable capacity ----

/// One attempt on the case's node: the devices picked (`request=device`, all claims) or the
/// explanation, and the steps taken. The deadline only keeps a missing bound from hanging
/// the test run (these searches are exponential without it); the assertions are on steps,
/// which are deterministic.
fn attempt(case: &common::Case) -> (Result<Vec<String>, Explanation>, dra_allocator::Stats) {
    let snap = case.snapshot();
    let claims: Vec<&ResourceClaim> = case.claims.iter().collect();
    let allocator = Allocator::new(&snap, &claims).unwrap();
    let limits = Limits {
        deadline: Some(Instant::now() + Duration::from_secs(60)),
        cancel: None,
    };
    let (outcome, stats) = allocator.allocate_with(&case.node, limits).unwrap();
    let answer = match outcome {
        Outcome::Allocated(a) => {
            let results = allocator.results(&case.node, &a).unwrap();
            let a = Resolved {
                results,
                quality: a.quality,
            };
            Ok((0..case.claims.len())
                .flat_map(|i| devices(&a, i))
                .collect())
        }
        Outcome::Unfit(e) => Err(e),
    };
    (answer, stats)
}

#[test]
fn mig_29_of_28_on_the_agent_a100_profile_is_refused_by_counters() {
    use common::cases::{a100_profile_slices, mig_count};
    let slices = a100_profile_slices();
    let devices: usize = slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    assert_eq!(
        (slices.len(), devices),
        (2, 60),
        "the profile: 4 full GPUs and 56 MIG placements"
    );
    // Every one of the 56 MIG devices is free, but at most 7 fit per GPU at once.
    let (answer, stats) = attempt(&mig_count(1, &[29]));
    let e = answer.expect_err("28 MIG devices at most");
    assert_eq!(
        (e.requests[0].available, e.requests[0].blocked_by_counters),
        (56, 0),
        "{e}"
    );
    assert_eq!(
        e.notes,
        [
            "claim default/migs: request migs: shared counters allow at most 28 of its 56 available devices at once, 29 needed"
        ]
    );
    assert!(stats.steps < 10, "steps {}", stats.steps);
    // 28: seven 1g.5gb on each GPU, found without backtracking over the counters.
    let (answer, stats) = attempt(&mig_count(1, &[28]));
    let picked = answer.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(picked.len(), 28);
    assert!(
        picked.iter().all(|d| d.contains("-mig-1g5gb-")),
        "{picked:?}"
    );
    assert!(stats.steps < 100, "steps {}", stats.steps);
}

#[test]
fn twelve_of_eleven_counter_slots_is_refused_by_counters() {
    use common::cases::slots_count;
    let (answer, stats) = attempt(&slots_count(32, 11, 12));
    let e = answer.expect_err("11 slots");
    assert_eq!(
        e.notes,
        [
            "claim default/slots: request gpus: shared counters allow at most 11 of its 32 available devices at once, 12 needed"
        ]
    );
    assert!(stats.steps < 10, "steps {}", stats.steps);
    let (answer, stats) = attempt(&slots_count(32, 11, 11));
    let picked = answer.unwrap_or_else(|e| panic!("{e}"));
    let first: Vec<String> = (0..11).map(|i| format!("gpus=gpu-{i}")).collect();
    assert_eq!(picked, first);
    assert!(stats.steps < 20, "steps {}", stats.steps);
}

#[test]
fn requests_beyond_shared_capacity_are_refused_by_capacity() {
    use common::cases::shared_capacity;
    // 8 shared GPUs × 4Gi, 33 requests for 1Gi in three claims.
    let (answer, stats) = attempt(&shared_capacity(8, 3, 11));
    let e = answer.expect_err("32 shares fit");
    assert_eq!(
        e.notes,
        [
            "each request can be met alone, but together they need 33 devices or shares, and shared counters and capacity leave room for at most 32"
        ]
    );
    assert!(stats.steps < 10, "steps {}", stats.steps);
    let (answer, _) = attempt(&shared_capacity(8, 4, 8));
    let picked = answer.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(picked.len(), 32);
    assert_eq!(
        picked[..5],
        ["r0=gpu-0", "r1=gpu-0", "r2=gpu-0", "r3=gpu-0", "r4=gpu-1"]
    );
}

#[test]
fn the_counter_and_capacity_bench_cases_are_refused_in_a_handful_of_steps() {
    for (name, make) in common::cases::bounds() {
        let (answer, stats) = attempt(&make());
        eprintln!("{name}: {} steps", stats.steps);
        assert!(answer.is_err(), "{name}: {answer:?}");
        assert!(stats.steps < 10, "{name}: steps {}", stats.steps);
    }
}
