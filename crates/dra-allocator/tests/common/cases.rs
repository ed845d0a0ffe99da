//! The benchmark scenarios (issue 4, a–e; issue 12, f–h), shared by the criterion benches,
//! the reference-timing test (a–e) and the scenario tests, so all run the same snapshots.
#![allow(dead_code, clippy::type_complexity)]

use dra_allocator::build::*;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde::Deserialize;

use super::Case;

pub const GPU: &str = "gpu.nvidia.com";
pub const NIC: &str = "nic.example.com";
pub const NUMA: &str = "resource.kubernetes.io/numaNode";

fn classes() -> Vec<DeviceClass> {
    vec![
        class("gpu.nvidia.com").selector("device.driver == \"gpu.nvidia.com\" && device.attributes[\"gpu.nvidia.com\"].type == \"gpu\"").build(),
        class("mig.nvidia.com").selector("device.driver == \"gpu.nvidia.com\" && device.attributes[\"gpu.nvidia.com\"].type == \"mig\"").build(),
        class("nic").selector("device.driver == \"nic.example.com\"").build(),
    ]
}

fn base(
    nodes: usize,
    slice_for: impl Fn(&str) -> Vec<SliceBuilder>,
    claims: Vec<ResourceClaim>,
) -> Case {
    let names: Vec<String> = (0..nodes).map(|i| format!("node-{i}")).collect();
    let slices = names
        .iter()
        .flat_map(|n| slice_for(n))
        .map(SliceBuilder::build)
        .collect();
    let nodes: Vec<_> = names.iter().map(|n| node(n).build()).collect();
    Case {
        classes: classes(),
        slices,
        taint_rules: Vec::new(),
        allocations: Vec::new(),
        claims,
        node: nodes[0].clone(),
        nodes,
        repeat: None,
        timeout_ms: 60_000,
        alpha_gates: false,
    }
}

fn gpus(node: &str, n: usize, numa: usize) -> SliceBuilder {
    let per = n.div_ceil(numa.max(1));
    slice(&format!("{node}-gpus"), GPU)
        .pool(node, 1, 1)
        .node(node)
        .devices((0..n).map(|i| {
            device(&format!("gpu-{i}"))
                .string("type", "gpu")
                .string("uuid", &format!("GPU-{node}-{i:04}"))
                .string("productName", "NVIDIA A100-SXM4-40GB")
                .int(NUMA, (i / per) as i64)
                .capacity("memory", "40Gi")
        }))
}

/// a) 500 nodes × 8 GPUs, one claim for 1 GPU.
pub fn a_500_nodes_one_gpu() -> Case {
    let c = claim("one-gpu")
        .request(request("gpu", "gpu.nvidia.com"))
        .build();
    base(500, |n| vec![gpus(n, 8, 2)], vec![c])
}

/// b) 5,000 nodes × 8 GPUs (2 NUMA) + 2 NICs, a claim for 4 GPUs + 1 NIC on one NUMA node.
pub fn b_5000_nodes_numa() -> Case {
    let c = claim("gpu-nic")
        .request(request("gpus", "gpu.nvidia.com").count(4))
        .request(request("nic", "nic"))
        .match_attribute(NUMA, &["gpus", "nic"])
        .build();
    base(
        5000,
        |n| {
            let nics = slice(&format!("{n}-nics"), NIC)
                .pool(n, 1, 1)
                .node(n)
                .devices((0..2).map(|i| {
                    device(&format!("nic-{i}"))
                        .string("uuid", &format!("NIC-{n}-{i}"))
                        .int(NUMA, i)
                }));
            vec![gpus(n, 8, 2), nics]
        },
        vec![c],
    )
}

/// c) Ask for N = 32 GPUs where only 31 exist (all distinct).
pub fn c_n_of_n_minus_one() -> Case {
    let c = claim("too-many")
        .request(request("gpus", "gpu.nvidia.com").count(32))
        .build();
    base(1, |n| vec![gpus(n, 31, 1)], vec![c])
}

/// d) 20 one-GPU requests that must share one NUMA node; 32 GPUs over 4 NUMA nodes.
pub fn d_twenty_shared_attribute() -> Case {
    let mut c = claim("twenty");
    for i in 0..20 {
        c = c.request(request(&format!("g{i}"), "gpu.nvidia.com"));
    }
    let c = c.match_attribute(NUMA, &[]).build();
    base(1, |n| vec![gpus(n, 32, 4)], vec![c])
}

/// e) One A100 with its MIG placements (shared counters); a claim for 3g + 2g + two 1g.
pub fn e_partitionable_a100() -> Case {
    let c = claim("migs")
        .request(
            request("big", "mig.nvidia.com")
                .selector("device.attributes[\"gpu.nvidia.com\"].profile == \"3g.20gb\""),
        )
        .request(
            request("mid", "mig.nvidia.com")
                .selector("device.attributes[\"gpu.nvidia.com\"].profile == \"2g.10gb\""),
        )
        .request(
            request("small", "mig.nvidia.com")
                .count(2)
                .selector("device.attributes[\"gpu.nvidia.com\"].profile == \"1g.5gb\""),
        )
        .build();
    base(
        1,
        |n| {
            let counters = slice(&format!("{n}-counters"), GPU)
                .pool(n, 1, 2)
                .node(n)
                .counter_set(
                    "gpu-0",
                    &[
                        ("memory", "40Gi"),
                        ("slice0", "1"),
                        ("slice1", "1"),
                        ("slice2", "1"),
                        ("slice3", "1"),
                        ("slice4", "1"),
                        ("slice5", "1"),
                        ("slice6", "1"),
                    ],
                );
            let mut devs = slice(&format!("{n}-devices"), GPU).pool(n, 1, 2).node(n);
            let all: Vec<(String, String)> = (0..7)
                .map(|i| (format!("slice{i}"), "1".to_string()))
                .collect();
            let all_ref: Vec<(&str, &str)> =
                all.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
            let mut full = all_ref.clone();
            full.push(("memory", "40Gi"));
            devs = devs.device(
                device("gpu-0")
                    .string("type", "gpu")
                    .int(NUMA, 0)
                    .consumes("gpu-0", &full),
            );
            // (profile, size in slices, memory, valid start slices)
            let profiles: [(&str, usize, &str, &[usize]); 5] = [
                ("1g.5gb", 1, "5Gi", &[0, 1, 2, 3, 4, 5, 6]),
                ("2g.10gb", 2, "10Gi", &[0, 2, 4]),
                ("3g.20gb", 3, "20Gi", &[0, 4]),
                ("4g.20gb", 4, "20Gi", &[0]),
                ("7g.40gb", 7, "40Gi", &[0]),
            ];
            for (profile, size, memory, starts) in profiles {
                for &start in starts {
                    let mut consumes: Vec<(&str, &str)> = all_ref[start..start + size].to_vec();
                    consumes.push(("memory", memory));
                    devs = devs.device(
                        device(&format!("gpu-0-mig-{profile}-{start}"))
                            .string("type", "mig")
                            .string("profile", profile)
                            .int(NUMA, 0)
                            .consumes("gpu-0", &consumes),
                    );
                }
            }
            vec![counters, devs]
        },
        vec![c],
    )
}

/// All scenarios with their names.
pub fn all() -> Vec<(&'static str, fn() -> Case)> {
    vec![
        ("a_500_nodes_one_gpu", a_500_nodes_one_gpu as fn() -> Case),
        ("b_5000_nodes_numa", b_5000_nodes_numa),
        ("c_n_of_n_minus_one", c_n_of_n_minus_one),
        ("d_twenty_shared_attribute", d_twenty_shared_attribute),
        ("e_partitionable_a100", e_partitionable_a100),
    ]
}

// ---- Issue 12: bounds over shared counters and consumable capacity ----

/// The ResourceSlices the node agent publishes for its 4×A100-40GB MIG profile (node
/// `a100-node`, one pool: a slice of 60 devices, 4 full GPUs and 56 MIG placements, and a
/// slice of 4 counter sets), read from the agent's golden file as data.
pub fn a100_profile_slices() -> Vec<ResourceSlice> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../dra-node-agent/profiles/slices/4x-a100-40gb-mig.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| ResourceSlice::deserialize(doc).expect("a ResourceSlice"))
        .collect()
}

/// `copies` × the agent's 4×A100 profile on node `node`: copy `c` > 0 is its own pool with
/// devices and counter sets renamed (`gpu-c{c}-…`), so 4 × `copies` GPUs.
pub fn a100_node(node: &str, copies: usize) -> Vec<ResourceSlice> {
    let base = a100_profile_slices();
    let mut out = Vec::new();
    for c in 0..copies {
        for s in &base {
            let mut s = s.clone();
            s.spec.node_name = Some(node.to_string());
            s.spec.pool.name = node.to_string();
            if c > 0 {
                let json = serde_json::to_string(&s)
                    .unwrap()
                    .replace("\"gpu-", &format!("\"gpu-c{c}-"));
                s = serde_json::from_str(&json).unwrap();
                s.spec.pool.name = format!("{node}-c{c}");
                let name = s.metadata.name.as_deref().unwrap_or_default();
                s.metadata.name = Some(format!("{name}-c{c}"));
            }
            out.push(s);
        }
    }
    out
}

/// One claim per entry of `counts` for that many MIG devices (any profile) on `copies` ×
/// the agent's 4×A100: 7 fit per GPU (seven 1g.5gb use all its compute), so 28 × `copies`
/// in all (and at most 32 per claim).
pub fn mig_count(copies: usize, counts: &[usize]) -> Case {
    let claims = counts
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let name = if i == 0 {
                "migs".to_string()
            } else {
                format!("migs-{i}")
            };
            claim(&name)
                .request(request("migs", "mig.nvidia.com").count(n as i64))
                .build()
        })
        .collect();
    let n = node("node-0").build();
    Case {
        classes: classes(),
        slices: a100_node("node-0", copies),
        taint_rules: Vec::new(),
        allocations: Vec::new(),
        claims,
        node: n.clone(),
        nodes: vec![n],
        repeat: None,
        timeout_ms: 60_000,
        alpha_gates: false,
    }
}

/// `devices` distinct GPUs (each its own uuid) that each take one of `slots` shared counter
/// slots; one claim for `count` of them.
pub fn slots_count(devices: usize, slots: usize, count: usize) -> Case {
    let c = claim("slots")
        .request(request("gpus", "gpu.nvidia.com").count(count as i64))
        .build();
    base(
        1,
        |n| {
            let counters = slice(&format!("{n}-counters"), GPU)
                .pool(n, 1, 2)
                .node(n)
                .counter_set("slots", &[("slots", &slots.to_string())]);
            let devs = slice(&format!("{n}-devices"), GPU)
                .pool(n, 1, 2)
                .node(n)
                .devices((0..devices).map(|i| {
                    device(&format!("gpu-{i}"))
                        .string("type", "gpu")
                        .string("uuid", &format!("GPU-{n}-{i:04}"))
                        .consumes("slots", &[("slots", "1")])
                }));
            vec![counters, devs]
        },
        vec![c],
    )
}

/// `devices` shared GPUs (allowMultipleAllocations, 4Gi of memory each) and `claims`
/// claims of `per_claim` one-GPU requests for 1Gi each: 4 shares per GPU fit.
pub fn shared_capacity(devices: usize, claims: usize, per_claim: usize) -> Case {
    let cs = (0..claims)
        .map(|c| {
            let mut cb = claim(&format!("share-{c}"));
            for r in 0..per_claim {
                cb = cb
                    .request(request(&format!("r{r}"), "gpu.nvidia.com").capacity("memory", "1Gi"));
            }
            cb.build()
        })
        .collect();
    base(
        1,
        |n| {
            vec![
                slice(&format!("{n}-gpus"), GPU)
                    .pool(n, 1, 1)
                    .node(n)
                    .devices((0..devices).map(|i| {
                        device(&format!("gpu-{i}"))
                            .string("type", "gpu")
                            .string("uuid", &format!("GPU-{n}-{i:04}"))
                            .multi()
                            .capacity("memory", "4Gi")
                    })),
            ]
        },
        cs,
    )
}

/// Issue 12's scenarios: infeasible because of shared counters or capacity, each with a
/// bigger variant.
pub fn bounds() -> Vec<(&'static str, fn() -> Case)> {
    vec![
        ("f_mig_29_of_28", || mig_count(1, &[29])),
        ("f_mig_57_of_56", || mig_count(2, &[29, 28])),
        ("g_slots_12_of_11", || slots_count(32, 11, 12)),
        ("g_slots_23_of_22", || slots_count(64, 22, 23)),
        ("h_shared_capacity_33_of_32", || shared_capacity(8, 3, 11)),
        ("h_shared_capacity_65_of_64", || shared_capacity(16, 5, 13)),
    ]
}
