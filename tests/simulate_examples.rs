//! `dra-scheduler simulate` on every example and on bad input: placements, devices and
//! messages, read from the JSON report.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dra-scheduler"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run dra-scheduler")
}

/// The JSON report of `simulate` on `paths`.
struct Report(Value);

fn simulate(paths: &[&str]) -> Report {
    let mut args = vec!["simulate", "--output", "json"];
    args.extend_from_slice(paths);
    let out = run(&args);
    assert!(
        out.status.success(),
        "simulate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Report(serde_json::from_slice(&out.stdout).expect("the report is JSON"))
}

impl Report {
    fn pod(&self, name: &str) -> &Value {
        let (ns, name) = name.split_once('/').unwrap();
        self.0["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["namespace"] == ns && p["name"] == name)
            .unwrap_or_else(|| panic!("pod {ns}/{name} is not in the report"))
    }

    fn node(&self, pod: &str) -> Option<&str> {
        self.pod(pod)["node"].as_str()
    }

    fn message(&self, pod: &str) -> &str {
        self.pod(pod)["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{pod} has no message"))
    }

    fn claim(&self, name: &str) -> &Value {
        let (ns, name) = name.split_once('/').unwrap();
        self.0["claims"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["namespace"] == ns && c["name"] == name)
            .unwrap_or_else(|| panic!("claim {ns}/{name} is not in the report"))
    }

    /// `driver/pool/device` of each allocated device, in result order.
    fn devices(&self, claim: &str) -> Vec<String> {
        self.claim(claim)["allocation"]["devices"]["results"]
            .as_array()
            .map(|results| {
                results
                    .iter()
                    .map(|r| {
                        format!(
                            "{}/{}/{}",
                            r["driver"].as_str().unwrap(),
                            r["pool"].as_str().unwrap(),
                            r["device"].as_str().unwrap()
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn result_requests(&self, claim: &str) -> Vec<String> {
        self.claim(claim)["allocation"]["devices"]["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["request"].as_str().unwrap().to_string())
            .collect()
    }

    fn reserved_for(&self, claim: &str) -> Vec<String> {
        self.claim(claim)["reservedFor"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                format!(
                    "{}/{}",
                    r["resource"].as_str().unwrap(),
                    r["name"].as_str().unwrap()
                )
            })
            .collect()
    }
}

#[test]
fn first_available_a5000_then_t10() {
    let r = simulate(&["examples/first-available"]);
    assert_eq!(r.node("default/inference-0"), Some("gpu-node-1"));
    assert_eq!(r.node("default/inference-1"), Some("gpu-node-1"));
    assert_eq!(
        r.devices("default/inference-0-gpu"),
        ["gpu.nvidia.com/gpu-node-1/gpu-0"]
    );
    assert_eq!(r.result_requests("default/inference-0-gpu"), ["gpu/a5000"]);
    assert_eq!(
        r.devices("default/inference-1-gpu"),
        ["gpu.nvidia.com/gpu-node-1/gpu-1"]
    );
    assert_eq!(r.result_requests("default/inference-1-gpu"), ["gpu/t10"]);
    assert_eq!(
        r.reserved_for("default/inference-1-gpu"),
        ["pods/inference-1"]
    );
    // The node-local devices pin the claim to the node.
    let selector = &r.claim("default/inference-0-gpu")["allocation"]["nodeSelector"];
    assert_eq!(
        selector["nodeSelectorTerms"][0]["matchFields"][0]["values"][0],
        "gpu-node-1"
    );
}

#[test]
fn memory_selector_leaves_one_replica_pending_and_says_why() {
    let r = simulate(&["examples/memory-selector"]);
    assert_eq!(r.node("default/trainer-0"), Some("gpu-node-1"));
    assert_eq!(
        r.devices("default/trainer-0-gpu"),
        ["gpu.nvidia.com/gpu-node-1/gpu-0"]
    );
    assert_eq!(r.node("default/trainer-1"), None);
    assert_eq!(
        r.message("default/trainer-1"),
        "0/1 nodes are available: 1 claim default/trainer-1-gpu request gpu (needs 1): \
         3 in class gpu.nvidia.com, 1 match the selectors, 1 in use, 0 available."
    );
    assert!(r.claim("default/trainer-1-gpu")["allocation"].is_null());
}

#[test]
fn one_claim_shared_by_four_pods() {
    let r = simulate(&["examples/shared-claim"]);
    for i in 0..4 {
        assert_eq!(r.node(&format!("default/nbody-{i}")), Some("gpu-node-1"));
    }
    assert_eq!(
        r.devices("default/shared-t10"),
        ["gpu.nvidia.com/gpu-node-1/gpu-1"]
    );
    assert_eq!(
        r.reserved_for("default/shared-t10"),
        [
            "pods/nbody-0",
            "pods/nbody-1",
            "pods/nbody-2",
            "pods/nbody-3"
        ]
    );
    // The claim's opaque config travels into the allocation.
    let config = &r.claim("default/shared-t10")["allocation"]["devices"]["config"][0];
    assert_eq!(config["source"], "FromClaim");
    assert_eq!(
        config["opaque"]["parameters"]["sharing"]["strategy"],
        "TimeSlicing"
    );
}

#[test]
fn gpus_and_nic_on_the_same_numa_node() {
    let r = simulate(&["examples/numa-aligned"]);
    assert_eq!(
        r.node("default/notebook"),
        Some("dgx-1"),
        "existing load stays where it is"
    );
    assert_eq!(r.node("default/allreduce-0"), Some("dgx-1"));
    // NUMA 0 has one free GPU only (gpu-0 is the notebook's), so everything comes from NUMA 1.
    assert_eq!(
        r.devices("default/allreduce-0-devices"),
        [
            "gpu.nvidia.com/dgx-1/gpu-2",
            "gpu.nvidia.com/dgx-1/gpu-3",
            "nic.example.com/dgx-1/nic-1"
        ]
    );
}

#[test]
fn tainted_gpu_needs_a_toleration() {
    let r = simulate(&["examples/device-taints"]);
    assert_eq!(
        r.devices("default/train-a-gpu"),
        ["gpu.nvidia.com/gpu-node-1/gpu-1"]
    );
    assert_eq!(r.node("default/train-b"), None);
    assert!(
        r.message("default/train-b")
            .contains("1 tainted, 1 in use, 0 available"),
        "{}",
        r.message("default/train-b")
    );
    assert_eq!(
        r.devices("default/gpu-diagnostics-gpu"),
        ["gpu.nvidia.com/gpu-node-1/gpu-0"]
    );
    let tolerations = &r.claim("default/gpu-diagnostics-gpu")["allocation"]["devices"]["results"]
        [0]["tolerations"];
    assert_eq!(tolerations[0]["key"], "gpu.nvidia.com/xid");
}

#[test]
fn device_taint_rule_drains_a_pool() {
    let r = simulate(&["examples/device-taint-rule"]);
    assert_eq!(r.node("default/sweep-0"), Some("node-a"));
    assert_eq!(r.node("default/sweep-1"), Some("node-a"));
    assert_eq!(r.node("default/sweep-2"), None);
    let message = r.message("default/sweep-2");
    assert!(
        message.starts_with("0/2 nodes are available: "),
        "{message}"
    );
    assert!(message.contains("2 tainted, 0 available"), "{message}");
    assert!(message.contains("2 in use, 0 available"), "{message}");
}

#[test]
fn extended_resource_is_served_by_dra() {
    let r = simulate(&["examples/extended-resource"]);
    assert_eq!(
        r.node("default/legacy-cuda"),
        Some("gpu-node-1"),
        "cpu-node-1 has no GPU devices"
    );
    assert_eq!(
        r.devices("default/legacy-cuda-extended-resources"),
        ["gpu.nvidia.com/gpu-node-1/gpu-0"]
    );
    assert_eq!(
        r.reserved_for("default/legacy-cuda-extended-resources"),
        ["pods/legacy-cuda"]
    );
}

#[test]
fn mig_instances_exclude_the_whole_gpu() {
    let r = simulate(&["examples/mig-partitionable"]);
    assert_eq!(
        r.devices("default/inference-0-mig"),
        ["gpu.nvidia.com/a100-node/gpu-0-mig-3g20gb-0"]
    );
    assert_eq!(
        r.devices("default/inference-1-mig"),
        ["gpu.nvidia.com/a100-node/gpu-0-mig-3g20gb-4"]
    );
    assert_eq!(r.node("default/full-training"), None);
    assert!(
        r.message("default/full-training")
            .contains("1 blocked by shared counters"),
        "{}",
        r.message("default/full-training")
    );
}

#[test]
fn a_generated_fleet_of_500_nodes() {
    let dir = std::env::temp_dir().join(format!("fleet-500-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = run(&["generate-fleet", "--nodes", "500", "--pods", "200"]);
    assert!(out.status.success());
    std::fs::write(dir.join("fleet.yaml"), &out.stdout).unwrap();
    let r = simulate(&[dir.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    let pods = r.0["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 200);
    assert!(
        pods.iter().all(|p| p["node"].is_string()),
        "500 nodes x 8 GPUs fit 200 pods"
    );
    // Every 4-GPU training claim has its GPUs and NIC on one NUMA node of one node.
    let claims = r.0["claims"].as_array().unwrap();
    let mut seen = std::collections::HashSet::new();
    for c in claims {
        for d in c["allocation"]["devices"]["results"].as_array().unwrap() {
            let id = format!("{}/{}/{}", d["driver"], d["pool"], d["device"]);
            assert!(seen.insert(id.clone()), "device {id} allocated twice");
        }
    }
    assert_eq!(seen.len(), 150 + 50 * 5);
}

#[test]
fn broken_cel_in_a_class_only_holds_back_its_own_pods() {
    let r = simulate(&["tests/data/broken-cel"]);
    let message = r.message("default/victim");
    assert!(message.contains("broken-gpu"), "{message}");
    assert!(message.contains("Syntax error"), "{message}");
    assert_eq!(r.node("default/bystander"), Some("node-a"));
    assert_eq!(
        r.devices("default/wants-good"),
        ["gpu.example.com/node-a/gpu-0"]
    );
    assert_eq!(r.node("default/plain"), Some("node-a"));
    assert_eq!(r.node("default/someone-elses"), None);
    assert!(
        r.message("default/someone-elses")
            .contains("schedulerName is default-scheduler")
    );
}

#[test]
fn all_schedulers_takes_every_pending_pod() {
    let out = run(&[
        "simulate",
        "-o",
        "json",
        "--all-schedulers",
        "tests/data/broken-cel",
    ]);
    let r = Report(serde_json::from_slice(&out.stdout).unwrap());
    assert_eq!(r.node("default/someone-elses"), Some("node-a"));
}

#[test]
fn a_typo_is_invalid_input_naming_file_document_object_and_field() {
    let out = run(&["simulate", "tests/data/typo"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim(),
        "error: tests/data/typo/all.yaml (document 2): ResourceClaimTemplate ml/one-gpu: \
         unknown field \"spec.spec.devices.requests[0].exactly.cuont\""
    );
    assert!(out.stdout.is_empty(), "no report for invalid input");
}

#[test]
fn fail_on_pending_exits_2() {
    assert_eq!(
        run(&["simulate", "--fail-on-pending", "examples/memory-selector"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        run(&["simulate", "--fail-on-pending", "examples/first-available"])
            .status
            .code(),
        Some(0)
    );
    assert_eq!(
        run(&["simulate", "examples/memory-selector"]).status.code(),
        Some(0)
    );
}

#[test]
fn table_output_reads_in_a_terminal() {
    let out = run(&["simulate", "examples/memory-selector"]);
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("POD") && lines[0].contains("NODE"),
        "{text}"
    );
    assert!(
        lines[1].starts_with("default/trainer-0") && lines[1].contains("gpu-node-1"),
        "{text}"
    );
    assert!(
        lines[2].starts_with("default/trainer-1") && lines[2].contains("PENDING"),
        "{text}"
    );
    assert!(text.contains("gpu.nvidia.com/gpu-node-1/gpu-0"), "{text}");
}

impl Report {
    fn group(&self, name: &str) -> &Value {
        let (ns, name) = name.split_once('/').unwrap();
        self.0["groups"]
            .as_array()
            .expect("the report has groups")
            .iter()
            .find(|g| g["namespace"] == ns && g["name"] == name)
            .unwrap_or_else(|| panic!("PodGroup {ns}/{name} is not in the report"))
    }
}

#[test]
fn gang_8x8_fills_eight_nodes_whole_and_the_second_gang_holds_nothing() {
    let r = simulate(&["examples/gang-8x8"]);
    let mut nodes = Vec::new();
    for i in 0..8 {
        let pod = format!("default/pretrain-{i}");
        let node = r.node(&pod).expect("placed").to_string();
        let devices = r.devices(&format!("{pod}-gpus"));
        let want: Vec<String> = (0..8)
            .map(|d| format!("gpu.nvidia.com/{node}/gpu-{d}"))
            .collect();
        assert_eq!(devices, want, "{pod} has all 8 GPUs of its node");
        nodes.push(node);
    }
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 8, "one worker per node");
    let message = "PodGroup default/eval: minCount (2) cannot be satisfied: 2 pods need 16 devices of DeviceClass gpu.nvidia.com; 0 are free";
    for pod in ["default/eval-0", "default/eval-1"] {
        assert_eq!(r.node(pod), None);
        assert_eq!(r.message(pod), message);
        assert!(r.devices(&format!("{pod}-gpus")).is_empty());
    }
    let pretrain = r.group("default/pretrain");
    assert_eq!(pretrain["placed"], true);
    assert_eq!(
        (pretrain["pods"].as_u64(), pretrain["placedPods"].as_u64()),
        (Some(8), Some(8))
    );
    assert_eq!(pretrain["workload"], "llm/pretrain");
    assert_eq!(pretrain["message"], Value::Null);
    let eval = r.group("default/eval");
    assert_eq!(eval["placed"], false);
    assert_eq!(eval["placedPods"], 0);
    assert_eq!(eval["message"], message);
}

#[test]
fn gang_backtracking_gives_pod_1_the_t4_so_pod_2_gets_the_a100() {
    let r = simulate(&["examples/gang-backtracking"]);
    assert_eq!(r.node("default/pod-1"), Some("gpu-node-1"));
    assert_eq!(r.node("default/pod-2"), Some("gpu-node-1"));
    assert_eq!(
        r.devices("default/pod-1-gpu"),
        ["gpu.nvidia.com/gpu-node-1/gpu-1"]
    );
    assert_eq!(r.result_requests("default/pod-1-gpu"), ["gpu/t4"]);
    assert_eq!(
        r.devices("default/pod-2-gpu"),
        ["gpu.nvidia.com/gpu-node-1/gpu-0"]
    );
    assert_eq!(r.reserved_for("default/pod-2-gpu"), ["pods/pod-2"]);
    let pair = r.group("default/pair");
    assert_eq!(
        (pair["placed"].as_bool(), pair["placedPods"].as_u64()),
        (Some(true), Some(2))
    );
}

#[test]
fn gang_rack_puts_the_small_gang_in_the_tighter_rack_so_the_big_one_fits() {
    let r = simulate(&["examples/gang-rack"]);
    assert_eq!(r.node("default/ring-0"), Some("b1"));
    assert_eq!(r.node("default/ring-1"), Some("b2"));
    for (i, node) in ["a1", "a2", "a3", "a4"].iter().enumerate() {
        assert_eq!(r.node(&format!("default/big-{i}")), Some(*node));
    }
    assert_eq!(
        r.group("default/ring")["domain"],
        "topology.kubernetes.io/rack=rack-b"
    );
    assert_eq!(
        r.group("default/big")["domain"],
        "topology.kubernetes.io/rack=rack-a"
    );
    let wide = r.group("default/wide");
    assert_eq!(wide["placed"], false);
    assert_eq!(
        wide["message"],
        "PodGroup default/wide: minCount (3) cannot be satisfied in one domain of schedulingConstraints.topology (topology.kubernetes.io/rack) among 3 domains: topology.kubernetes.io/rack=rack-c: 3 pods need 24 devices of DeviceClass gpu.nvidia.com; 12 are free; topology.kubernetes.io/rack=rack-a: 3 pods need 24 devices of DeviceClass gpu.nvidia.com; 0 are free; topology.kubernetes.io/rack=rack-b: 3 pods need 24 devices of DeviceClass gpu.nvidia.com; 0 are free"
    );
    for i in 0..3 {
        assert_eq!(r.node(&format!("default/wide-{i}")), None);
    }
}

#[test]
fn gang_shared_claim_allocates_the_groups_claim_once_and_puts_every_member_on_its_node() {
    let r = simulate(&["examples/gang-shared-claim"]);
    for i in 0..3 {
        assert_eq!(r.node(&format!("default/worker-{i}")), Some("node-b"));
    }
    assert_eq!(
        r.devices("default/train-fabric"),
        ["fabric.example.com/node-b/channel-0"]
    );
    assert_eq!(r.reserved_for("default/train-fabric"), ["podgroups/train"]);
    assert_eq!(r.reserved_for("default/worker-0-gpus"), ["pods/worker-0"]);
    assert_eq!(r.group("default/train")["placedPods"].as_u64(), Some(3));
}

#[test]
fn a_member_of_a_pod_group_that_does_not_exist_waits_and_says_so() {
    let dir = std::env::temp_dir().join(format!("dra-sim-no-group-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fleet =
        std::fs::read_to_string(root().join("examples/gang-backtracking/fleet.yaml")).unwrap();
    std::fs::write(dir.join("fleet.yaml"), fleet).unwrap();
    std::fs::write(
        dir.join("pod.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: lonely}\nspec:\n  schedulerName: dra-scheduler\n  schedulingGroup: {podGroupName: missing}\n  containers: [{name: c, image: busybox}]\n",
    )
    .unwrap();
    let r = simulate(&[dir.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(r.node("default/lonely"), None);
    assert_eq!(
        r.message("default/lonely"),
        "waiting for PodGroup default/missing, which does not exist"
    );
}

#[test]
fn preemption_evicts_the_two_youngest_batch_pods_for_the_urgent_one() {
    let r = simulate(&["examples/preemption"]);
    assert_eq!(r.node("default/inference"), Some("gpu-node-1"));
    assert_eq!(
        r.devices("default/inference-gpus"),
        [
            "gpu.nvidia.com/gpu-node-1/gpu-2",
            "gpu.nvidia.com/gpu-node-1/gpu-3"
        ]
    );
    assert_eq!(
        r.message("default/inference"),
        "preempting 2 pods on gpu-node-1 (default/batch-2, default/batch-3) \
         for 2 devices of DeviceClass gpu.nvidia.com"
    );
    // Exactly the two youngest go; the older two keep running on their GPUs.
    for old in ["default/batch-0", "default/batch-1"] {
        assert_eq!(r.node(old), Some("gpu-node-1"));
    }
    for young in ["default/batch-2", "default/batch-3"] {
        assert_eq!(r.node(young), None);
        assert_eq!(
            r.message(young),
            "evicted from gpu-node-1: preempted by default/inference (priority 1000 > 0)"
        );
        assert!(
            r.devices(&format!("{young}-gpu")).is_empty(),
            "{young}'s GPU is freed"
        );
        assert!(r.reserved_for(&format!("{young}-gpu")).is_empty());
    }
    let preemptions = r.0["preemptions"].as_array().unwrap();
    assert_eq!(preemptions.len(), 1);
    assert_eq!(preemptions[0]["name"], "inference");
    assert_eq!(preemptions[0]["node"], "gpu-node-1");
    let victims: Vec<(&str, &str)> = preemptions[0]["victims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap(),
                v["freedClaims"][0].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        victims,
        [
            ("batch-2", "default/batch-2-gpu"),
            ("batch-3", "default/batch-3-gpu")
        ]
    );
    // A pod of the victims' own priority cannot preempt them; nothing is said of it.
    assert_eq!(r.node("default/batch-late"), None);
    assert!(!r.message("default/batch-late").contains("preemption"));
}

#[test]
fn no_preemption_leaves_the_urgent_pod_pending_and_evicts_nothing() {
    let r = simulate(&["--no-preemption", "examples/preemption"]);
    assert_eq!(r.node("default/inference"), None);
    for i in 0..4 {
        assert_eq!(r.node(&format!("default/batch-{i}")), Some("gpu-node-1"));
    }
    assert!(r.0.get("preemptions").is_none());
    let out = run(&["simulate", "examples/preemption"]);
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table.contains("default/batch-3     EVICTED"),
        "the table marks evicted pods:\n{table}"
    );
    assert!(
        table.contains("\nEVICTED          NODE        FOR\n"),
        "{table}"
    );
}

#[test]
fn the_config_files_preemption_switch_and_a_disruption_budget_are_read() {
    let dir = std::env::temp_dir().join(format!("dra-sim-preempt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let off = dir.join("off.yaml");
    std::fs::write(&off, "preemption: {enabled: false}\n").unwrap();
    let r = simulate(&["--config", off.to_str().unwrap(), "examples/preemption"]);
    assert_eq!(
        r.node("default/inference"),
        None,
        "the file turned preemption off"
    );
    assert!(r.0.get("preemptions").is_none());

    // A budget that allows no disruption of the batch pods: every choice violates it, so
    // the fewest violations is still two evictions, and simulate reads the budget without
    // complaint.
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    for f in ["fleet.yaml", "running.yaml", "workload.yaml"] {
        std::fs::copy(
            root().join("examples/preemption").join(f),
            manifests.join(f),
        )
        .unwrap();
    }
    std::fs::write(
        manifests.join("pdb.yaml"),
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: batch}\n\
         spec: {maxUnavailable: 0, selector: {matchLabels: {app: batch}}}\n",
    )
    .unwrap();
    let r = simulate(&[manifests.to_str().unwrap()]);
    assert_eq!(r.node("default/inference"), Some("gpu-node-1"));
    assert_eq!(
        r.0["preemptions"][0]["pdbViolations"], 2,
        "both evictions violate it"
    );
    let plain = simulate(&["examples/preemption"]);
    assert_eq!(plain.0["preemptions"][0]["pdbViolations"], 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

impl Report {
    /// `driver/pool/device (request)` of each allocated device.
    fn devices_for_requests(&self, claim: &str) -> Vec<String> {
        let devices = self.devices(claim).into_iter();
        devices
            .zip(self.result_requests(claim))
            .map(|(device, request)| format!("{device} ({request})"))
            .collect()
    }
}

#[test]
fn rollout_handoff_the_replacement_waits_for_the_a5000_its_terminating_predecessor_holds() {
    let r = simulate(&["examples/rollout-handoff"]);
    assert_eq!(r.node("default/web-new"), Some("gpu-node-1"));
    assert_eq!(
        r.devices_for_requests("default/web-new-gpu"),
        ["gpu.nvidia.com/gpu-node-1/gpu-0 (gpu/a5000)"]
    );
    assert_eq!(
        r.message("default/web-new"),
        "waited for device gpu.nvidia.com/gpu-node-1/gpu-0 (claim default/web-new-gpu request \
         gpu: a5000 instead of t10) held by terminating pod default/web-old, up to 60s (30s of \
         grace period left plus the 30s margin, at most maxWaitSeconds 60s)"
    );
    // The old pod finished terminating: it is gone and its claim deallocated.
    assert_eq!(r.node("default/web-old"), None);
    assert!(r.devices("default/web-old-gpu").is_empty());
    assert!(r.reserved_for("default/web-old-gpu").is_empty());
    let handoffs = r.0["handoffs"].as_array().unwrap();
    assert_eq!(handoffs.len(), 1);
    assert_eq!(handoffs[0]["name"], "web-new");
    assert_eq!(handoffs[0]["holders"][0]["name"], "web-old");
    assert_eq!(
        handoffs[0]["holders"][0]["deletionTimestamp"],
        "2026-03-02T10:00:30Z"
    );
    assert_eq!(handoffs[0]["upgrades"][0]["from"], "t10");
    assert_eq!(handoffs[0]["upgrades"][0]["to"], "a5000");
    assert_eq!(handoffs[0]["waitSeconds"], 60.0);
    let out = run(&["simulate", "examples/rollout-handoff"]);
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table.contains("default/web-old  TERMINATING  terminating: default/web-new waited"),
        "{table}"
    );
}

/// `simulate --config` with the daemon's config `yaml` (in a file named after `test`).
fn simulate_with_config(test: &str, yaml: &str, paths: &[&str]) -> Report {
    let file = std::env::temp_dir().join(format!("{test}-{}.yaml", std::process::id()));
    std::fs::write(&file, yaml).unwrap();
    let mut args = vec!["--config", file.to_str().unwrap()];
    args.extend_from_slice(paths);
    let report = simulate(&args);
    std::fs::remove_file(&file).unwrap();
    report
}

#[test]
fn rollout_handoff_with_the_wait_off_in_the_config_takes_a_t10_at_once() {
    let r = simulate_with_config(
        "handoff-off",
        "handoff: {enabled: false}\n",
        &["examples/rollout-handoff"],
    );
    assert_eq!(r.node("default/web-new"), Some("gpu-node-1"));
    assert_eq!(
        r.devices_for_requests("default/web-new-gpu"),
        ["gpu.nvidia.com/gpu-node-1/gpu-1 (gpu/t10)"]
    );
    assert!(r.pod("default/web-new")["message"].is_null());
    assert!(r.0.get("handoffs").is_none());
    // The old pod still terminates on the A5000.
    assert_eq!(r.node("default/web-old"), Some("gpu-node-1"));
    assert_eq!(r.message("default/web-old"), "terminating on gpu-node-1");
    assert_eq!(
        r.devices("default/web-old-gpu"),
        ["gpu.nvidia.com/gpu-node-1/gpu-0"]
    );
}

/// The alpha examples, with the daemon's config that turns 1.37's alpha DRA gates on.
fn with_alpha_gates(example: &str) -> Report {
    simulate(&["--config", "examples/alpha-gates.yaml", example])
}

#[test]
fn derived_attributes_align_a_gpu_and_a_nic_whose_drivers_name_the_pcie_root_differently() {
    let r = with_alpha_gates("examples/derived-attributes");
    assert_eq!(
        r.devices("default/first-gpu"),
        ["gpu.nvidia.com/node-1-gpus/gpu-0"]
    );
    assert_eq!(
        r.devices("default/aligned-devices"),
        [
            "gpu.nvidia.com/node-1-gpus/gpu-1",
            "nic.example.com/node-1-nics/nic-1"
        ]
    );
    // With the gate off (1.37's default), the claim is refused, naming the feature.
    let off = simulate(&["examples/derived-attributes"]);
    assert_eq!(off.node("default/aligned"), None);
    assert!(
        off.message("default/aligned")
            .contains("cannot handle request with derived attributes, the feature is disabled"),
        "{}",
        off.message("default/aligned")
    );
}

#[test]
fn compatibility_groups_keep_a_time_sliced_share_off_a_gpu_split_into_mig_instances() {
    let r = with_alpha_gates("examples/compatibility-groups");
    assert_eq!(
        r.devices("default/training-gpu"),
        ["gpu.nvidia.com/node-1/gpu-0-mig-0"]
    );
    assert_eq!(
        r.devices("default/notebook-gpu"),
        ["gpu.nvidia.com/node-1/gpu-1-shared-0"]
    );
}

#[test]
fn list_attributes_match_when_the_lists_share_a_value() {
    let r = with_alpha_gates("examples/list-attributes");
    assert_eq!(
        r.devices("default/single-gpu"),
        ["gpu.nvidia.com/node-1/gpu-0"]
    );
    assert_eq!(
        r.devices("default/pair-gpus"),
        ["gpu.nvidia.com/node-1/gpu-1", "gpu.nvidia.com/node-1/gpu-2"]
    );
    assert_eq!(r.node("default/another-pair"), None);
}

#[test]
fn a_gpus_pinned_cpus_keep_the_second_trainer_pending() {
    let r = with_alpha_gates("examples/node-allocatable-resources");
    let trainers: Vec<&str> = ["default/trainer-0", "default/trainer-1"]
        .into_iter()
        .filter(|p| r.node(p).is_some())
        .collect();
    assert_eq!(trainers, ["default/trainer-0"]);
    assert_eq!(r.node("default/web"), Some("node-1"));
    assert!(
        r.message("default/trainer-1")
            .contains("1 Insufficient cpu"),
        "{}",
        r.message("default/trainer-1")
    );
    assert_eq!(
        r.pod("default/trainer-0")["nodeAllocatableResourceClaimStatuses"],
        serde_json::json!([{"resourceClaimName": "trainer-0-gpu", "containers": ["train"],
            "mapping": [{"name": "cpu", "quantity": "6"}],
            "overhead": [{"name": "memory", "perContainer": "512Mi"}]}])
    );
    // With the gate off (1.37's default), the GPUs are not allocated, naming the gate.
    let off = simulate(&["examples/node-allocatable-resources"]);
    assert_eq!(off.node("default/trainer-0"), None);
    assert!(
        off.message("default/trainer-0")
            .contains("2 map nodeAllocatableResources, which needs the DRANodeAllocatableResources feature gate"),
        "{}",
        off.message("default/trainer-0")
    );
}

#[test]
fn devices_that_skip_node_operations_go_only_to_a_node_that_declares_it_can() {
    let r = with_alpha_gates("examples/optional-node-operations");
    assert_eq!(r.node("default/first"), Some("node-a"));
    let results = &r.claim("default/first-fpga")["allocation"]["devices"]["results"][0];
    assert_eq!(
        results["skipNodeOperations"],
        serde_json::json!(["NodePrepareResources", "NodeUnprepareResources"])
    );
    assert_eq!(r.node("default/second"), None);
    assert!(
        r.message("default/second").contains(
            "1 skip node operations (skipNodeOperations) the node does not declare it can skip (DRAOptionalNodeOperations)"
        ),
        "{}",
        r.message("default/second")
    );
}
