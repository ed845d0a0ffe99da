//! The benchmark scenarios (issue 4, a–e), shared by the criterion benches and the
//! reference-timing test so both run exactly the same snapshots.
#![allow(dead_code, clippy::type_complexity)]

use dra_allocator::build::*;
use k8s_openapi::api::resource::v1::ResourceClaim;

use super::Case;

pub const GPU: &str = "gpu.nvidia.com";
pub const NIC: &str = "nic.example.com";
pub const NUMA: &str = "resource.kubernetes.io/numaNode";

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
        classes: vec![
            class("gpu.nvidia.com").selector("device.driver == \"gpu.nvidia.com\" && device.attributes[\"gpu.nvidia.com\"].type == \"gpu\"").build(),
            class("mig.nvidia.com").selector("device.driver == \"gpu.nvidia.com\" && device.attributes[\"gpu.nvidia.com\"].type == \"mig\"").build(),
            class("nic").selector("device.driver == \"nic.example.com\"").build(),
        ],
        slices,
        taint_rules: Vec::new(),
        allocations: Vec::new(),
        claims,
        node: nodes[0].clone(),
        nodes,
        repeat: None,
        timeout_ms: 60_000,
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
