//! `kubectl dra` on a real Kubernetes 1.37 control plane: the seed examples placed by the
//! daemon, then `nodes` and `claims` compared with golden tables (tests/data/kubectl-dra/;
//! `UPDATE_GOLDEN=1` writes them), `why` on memory-selector's pending replica, and `why` on
//! a pod that fits only by preempting, whose victims the daemon then evicts. Every run of
//! the plugin uses an identity that may only get and list: nothing it needs is a write.
//! `kubectl dra nodes` runs through kubectl itself, the plugin found on PATH.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use test_cluster::{TestCluster, eventually};

mod common;
use common::{apply, apply_fleet, kubectl_apply_text, node_of, run, start_scheduler_with};

/// A user who may get and list everything and do nothing else.
fn viewer(cluster: &TestCluster) -> PathBuf {
    let kubeconfig = cluster.user_kubeconfig("dra-viewer").expect("a user");
    kubectl_apply_text(
        cluster,
        "viewer",
        b"apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: dra-viewer}\n\
rules: [{apiGroups: ['*'], resources: ['*'], verbs: [get, list]}]\n---\n\
apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: dra-viewer}\n\
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: dra-viewer}\n\
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: dra-viewer}]\n",
    );
    // RBAC takes a moment to see the binding.
    for _ in 0..60 {
        let out = Command::new(cluster.binary("kubectl"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["get", "resourceslices"])
            .output()
            .unwrap();
        if out.status.success() {
            return kubeconfig;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!("the viewer cannot list ResourceSlices after 30 s");
}

/// `kubectl-dra --kubeconfig KUBECONFIG ARGS...`: its output; it must succeed.
fn kubectl_dra(kubeconfig: &Path, args: &[&str]) -> String {
    let out = run(Command::new(env!("CARGO_BIN_EXE_kubectl-dra"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args));
    String::from_utf8(out.stdout).unwrap()
}

/// Generated names and what they read as in the golden files: a claim made from a
/// template is `<pod>-<pod claim>-xxxxx`, a Deployment's pod `<deployment>-HASH-xxxxx`, a
/// Job's `<job>-xxxxx`. Longest first, so a claim is replaced before its pod's name in it.
async fn generated_names(client: &kube::Client) -> Vec<(String, String)> {
    let pods = Api::<Pod>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let pod_name = |pod: &Pod| -> Option<(String, String)> {
        let generate = pod.metadata.generate_name.as_deref()?;
        let mut stable = generate.to_string();
        if let Some(hash) = pod.metadata.labels.as_ref()?.get("pod-template-hash") {
            stable = stable.replace(&format!("-{hash}-"), "-HASH-");
        }
        Some((pod.metadata.name.clone()?, stable + "xxxxx"))
    };
    let mut names: Vec<(String, String)> = pods.iter().filter_map(pod_name).collect();
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    for claim in claims {
        let (Some(name), Some(_)) = (&claim.metadata.name, &claim.metadata.generate_name) else {
            continue;
        };
        let owners = claim.metadata.owner_references.iter().flatten();
        let Some(pod) = owners.filter(|o| o.kind == "Pod").map(|o| &o.name).next() else {
            continue;
        };
        let stable_pod = names
            .iter()
            .find(|(p, _)| p == pod)
            .map_or(pod.clone(), |(_, s)| s.clone());
        let middle = &name[pod.len()..name.len() - 5];
        names.push((name.clone(), format!("{stable_pod}{middle}xxxxx")));
    }
    names.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    names
}

/// A kubectl table's cells: split where the header's columns start. Checks that every
/// row's cells start where the header's do (kubectl's alignment).
fn cells(table: &str) -> Vec<Vec<String>> {
    let mut lines = table.lines();
    let header = lines.next().expect("a header");
    let mut starts = vec![0];
    let bytes = header.as_bytes();
    for i in 1..bytes.len() {
        if bytes[i] != b' ' && header[..i].ends_with("   ") {
            starts.push(i);
        }
    }
    std::iter::once(header)
        .chain(lines)
        .map(|line| {
            starts
                .iter()
                .enumerate()
                .map(|(c, &start)| {
                    let end = starts
                        .get(c + 1)
                        .copied()
                        .unwrap_or(line.len())
                        .min(line.len());
                    let cell = &line[start.min(line.len())..end];
                    assert!(
                        !cell.starts_with(' ') && (c == 0 || line[..start].ends_with(' ')),
                        "column {c} of {line:?} starts at {start}, where the header's does"
                    );
                    cell.trim_end().to_string()
                })
                .collect()
        })
        .collect()
}

/// The tables of `output` (separated by blank lines) with generated names replaced, rows
/// sorted (generated names decide kubectl's order) and columns aligned again.
fn normalise(output: &str, names: &[(String, String)]) -> String {
    let mut out = Vec::new();
    for table in output.split("\n\n") {
        let mut rows = cells(table);
        for cell in rows.iter_mut().flatten() {
            for (name, stable) in names {
                *cell = cell.replace(name.as_str(), stable);
            }
        }
        let header = rows.remove(0);
        rows.sort();
        let widths: Vec<usize> = (0..header.len())
            .map(|c| {
                std::iter::once(&header)
                    .chain(&rows)
                    .map(|r| r[c].len())
                    .max()
                    .unwrap()
            })
            .collect();
        let text: Vec<String> = std::iter::once(&header)
            .chain(&rows)
            .map(|row| {
                let padded: Vec<String> = row
                    .iter()
                    .enumerate()
                    .map(|(c, cell)| format!("{cell:<w$}", w = widths[c]))
                    .collect();
                padded.join("   ").trim_end().to_string()
            })
            .collect();
        out.push(text.join("\n") + "\n");
    }
    out.join("\n")
}

/// Compare with `tests/data/kubectl-dra/NAME.txt`, or write it with `UPDATE_GOLDEN=1`.
fn golden(name: &str, actual: &str) {
    let path = common::repo().join(format!("tests/data/kubectl-dra/{name}.txt"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    assert_eq!(actual, expected, "{name} differs from {}", path.display());
}

/// `nodes` and `claims`, plain and wide, against their golden tables.
async fn tables_match_golden(cluster: &TestCluster, example: &str, kubeconfig: &Path) {
    let names = generated_names(&cluster.client().await).await;
    for (form, args) in [
        ("nodes", &["nodes"][..]),
        ("nodes-wide", &["nodes", "-o", "wide"]),
        ("claims", &["claims"]),
        ("claims-wide", &["claims", "-o", "wide"]),
    ] {
        let output = kubectl_dra(kubeconfig, args);
        println!("kubectl dra {}\n{output}", args.join(" "));
        golden(&format!("{example}-{form}"), &normalise(&output, &names));
    }
}

/// Every pod of the example decided by the daemon: `bound` bound and the rest marked
/// unschedulable.
async fn placed(cluster: &TestCluster, total: usize, bound: usize) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.client().await, "default");
    eventually(&format!("{bound} of {total} pods bound"), 120, || async {
        let list = pods.list(&ListParams::default()).await.ok()?.items;
        let decided = list.iter().filter(|p| {
            node_of(p).is_some()
                || p.status
                    .iter()
                    .flat_map(|s| s.conditions.iter().flatten())
                    .any(|c| c.type_ == "PodScheduled" && c.status == "False")
        });
        let n = list.iter().filter(|p| node_of(p).is_some()).count();
        (list.len() == total && decided.count() == total && n == bound).then_some(list)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_available_tables_and_the_plugin_found_by_kubectl() {
    let cluster = TestCluster::dedicated();
    let _daemon = start_scheduler_with(&cluster, &["--leader-elect=false"]);
    apply(&cluster, &["examples/first-available"]);
    placed(&cluster, 2, 2).await;
    let kubeconfig = viewer(&cluster);
    tables_match_golden(&cluster, "first-available", &kubeconfig).await;

    // kubectl finds kubectl-dra on PATH: `kubectl dra nodes` is the plugin's own output.
    let plugin_dir = Path::new(env!("CARGO_BIN_EXE_kubectl-dra"))
        .parent()
        .unwrap();
    let path = std::env::join_paths(std::iter::once(plugin_dir.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let through_kubectl = run(cluster
        .command(cluster.binary("kubectl"))
        .args(["dra", "nodes"])
        .env("KUBECONFIG", &kubeconfig)
        .env("PATH", path));
    assert_eq!(
        String::from_utf8(through_kubectl.stdout).unwrap(),
        kubectl_dra(&kubeconfig, &["nodes"])
    );
    // A selector the API server reads: no node has this label.
    let none = run(Command::new(env!("CARGO_BIN_EXE_kubectl-dra"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["nodes", "-l", "pool=nope"]));
    assert_eq!(String::from_utf8_lossy(&none.stderr), "No nodes found.\n");
    let json: serde_json::Value =
        serde_json::from_str(&kubectl_dra(&kubeconfig, &["nodes", "-o", "json"])).unwrap();
    assert_eq!(json["nodes"][0]["numaDomains"], serde_json::json!([0, 1]));
    let yaml: serde_json::Value =
        serde_yaml::from_str(&kubectl_dra(&kubeconfig, &["claims", "-o", "yaml"])).unwrap();
    assert_eq!(yaml["claims"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_selector_tables_and_why_the_second_replica_waits() {
    let cluster = TestCluster::dedicated();
    let _daemon = start_scheduler_with(&cluster, &["--leader-elect=false"]);
    apply(&cluster, &["examples/memory-selector"]);
    let pods = placed(&cluster, 2, 1).await;
    let kubeconfig = viewer(&cluster);
    tables_match_golden(&cluster, "memory-selector", &kubeconfig).await;

    let name = |p: &Pod| p.metadata.name.clone().unwrap();
    let pending = pods
        .iter()
        .find(|p| node_of(p).is_none())
        .map(name)
        .unwrap();
    let holder = pods
        .iter()
        .find(|p| node_of(p).is_some())
        .map(name)
        .unwrap();
    let why = kubectl_dra(&kubeconfig, &["why", &pending]);
    println!("kubectl dra why {pending}\n{why}");
    for expected in [
        r#"selector device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("20Gi")) rejects gpu-1 (Tesla T10, memory 16Gi), gpu-2 (Tesla T10, memory 16Gi)"#,
        &format!("gpu-0 allocated to default/{holder}"),
        "relax: without selector device.capacity[\"gpu.nvidia.com\"].memory.isGreaterThan(quantity(\"20Gi\")) of claim gpu, request gpu: fits on gpu-node-1 (devices gpu.nvidia.com/gpu-node-1/gpu-1)",
        "add devices: claim gpu, request gpu: 1 more free device of class gpu.nvidia.com",
    ] {
        assert!(why.contains(expected), "{expected:?} in:\n{why}");
    }
    let names = generated_names(&cluster.client().await).await;
    let mut stable = why.clone();
    for (name, replacement) in &names {
        stable = stable.replace(name.as_str(), replacement);
    }
    golden("memory-selector-why", &stable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numa_aligned_tables() {
    let cluster = TestCluster::dedicated();
    // The notebook's claim holds GPU 0 (its status is written as the example gives it, for
    // the notebook pod's UID) before the daemon starts and the job comes.
    apply(&cluster, &["examples/numa-aligned/fleet.yaml"]);
    let client = cluster.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let uid = pods.get("notebook").await.unwrap().metadata.uid.unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let text =
        std::fs::read_to_string(common::repo().join("examples/numa-aligned/fleet.yaml")).unwrap();
    let wanted = serde_yaml::Deserializer::from_str(&text)
        .map(|d| <serde_json::Value as serde::Deserialize>::deserialize(d).unwrap())
        .find(|d| d["kind"] == "ResourceClaim")
        .unwrap();
    let mut status: k8s_openapi::api::resource::v1::ResourceClaimStatus =
        serde_json::from_value(wanted["status"].clone()).unwrap();
    status.reserved_for.as_mut().unwrap()[0].uid = uid;
    let mut claim = claims.get("notebook-gpu").await.unwrap();
    claim.status = Some(status);
    claims
        .replace_status("notebook-gpu", &PostParams::default(), &claim)
        .await
        .unwrap();
    let _daemon = start_scheduler_with(&cluster, &["--leader-elect=false"]);
    apply(&cluster, &["examples/numa-aligned/workload.yaml"]);
    placed(&cluster, 2, 2).await;
    let kubeconfig = viewer(&cluster);
    tables_match_golden(&cluster, "numa-aligned", &kubeconfig).await;
}

const URGENT: &str = "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: urgent}\nvalue: 1000\n---\n\
apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: two-gpus}\n\
spec:\n  spec:\n    devices:\n      requests:\n      - name: gpu\n        exactly: {deviceClassName: gpu.nvidia.com, count: 2}\n";

/// A pod of this scheduler using `template`, of priority class `class`, kept to `node`.
fn pod(name: &str, class: Option<&str>, template: &str, node: Option<&str>) -> String {
    let class = class.map_or(String::new(), |c| format!("  priorityClassName: {c}\n"));
    let node = node.map_or(String::new(), |n| {
        format!("  nodeSelector: {{kubernetes.io/hostname: {n}}}\n")
    });
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  schedulerName: dra-scheduler\n{class}{node}  \
         resourceClaims: [{{name: gpu, resourceClaimTemplateName: {template}}}]\n  \
         containers: [{{name: c, image: busybox, resources: {{claims: [{{name: gpu}}]}}}}]\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_names_the_victims_the_daemon_then_evicts() {
    let cluster = TestCluster::dedicated();
    apply_fleet(&cluster, 2, 2);
    kubectl_apply_text(&cluster, "urgent", URGENT.as_bytes());
    let no_preemption = cluster.dir().join("no-preemption.yaml");
    std::fs::write(&no_preemption, "preemption: {enabled: false}\n").unwrap();
    let daemon = start_scheduler_with(
        &cluster,
        &[
            "--leader-elect=false",
            "--config",
            no_preemption.to_str().unwrap(),
        ],
    );
    let client = cluster.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // Four pods of priority 0, two per node, each a second younger than the one before.
    for (i, node) in [
        "gpu-node-0000",
        "gpu-node-0000",
        "gpu-node-0001",
        "gpu-node-0001",
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("low-{i}");
        kubectl_apply_text(
            &cluster,
            &name,
            pod(&name, None, "one-gpu", Some(node)).as_bytes(),
        );
        eventually(&format!("{name} bound"), 60, || async {
            node_of(&pods.get(&name).await.ok()?).map(|_| ())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    kubectl_apply_text(
        &cluster,
        "urgent",
        pod("urgent", Some("urgent"), "two-gpus", None).as_bytes(),
    );
    placed(&cluster, 5, 4).await;

    let kubeconfig = viewer(&cluster);
    let why = kubectl_dra(&kubeconfig, &["why", "urgent"]);
    println!("kubectl dra why urgent\n{why}");
    let answer: serde_json::Value =
        serde_json::from_str(&kubectl_dra(&kubeconfig, &["why", "urgent", "-o", "json"])).unwrap();
    let node = answer["preemption"]["node"].as_str().unwrap().to_string();
    let named: BTreeSet<String> = answer["preemption"]["victims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            v.as_str()
                .unwrap()
                .trim_start_matches("default/")
                .to_string()
        })
        .collect();
    assert_eq!(named.len(), 2, "{why}");
    assert!(
        why.contains(&format!(
            "preemption: on {node}, evicting {} (the scheduler's choice)",
            answer["preemption"]["victims"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        "{why}"
    );
    assert_eq!(
        answer["preemption"]["others"].as_array().unwrap().len(),
        1,
        "the other node would do too: {why}"
    );

    // The daemon with preemption on evicts exactly those and binds the pod where `why`
    // said. Without a kubelet, its deletions are confirmed here, as a kubelet would.
    drop(daemon);
    let _daemon = start_scheduler_with(&cluster, &["--leader-elect=false"]);
    let deleted = eventually("the victims deleted", 60, || async {
        let list = pods.list(&ListParams::default()).await.ok()?.items;
        let deleted: BTreeSet<String> = list
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        (deleted.len() >= 2).then_some(deleted)
    })
    .await;
    assert_eq!(deleted, named, "the daemon evicts the pods `why` named");
    for name in &deleted {
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    }
    let bound = eventually("the urgent pod bound", 90, || async {
        node_of(&pods.get("urgent").await.ok()?).map(String::from)
    })
    .await;
    assert_eq!(bound, node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mig_partitionable_counters_and_why_the_whole_gpu_waits() {
    let cluster = TestCluster::dedicated();
    let _daemon = start_scheduler_with(&cluster, &["--leader-elect=false"]);
    apply(&cluster, &["examples/mig-partitionable/fleet.yaml"]);
    // One document at a time, each pod decided before the next comes: which pod gets which
    // partition is then the same every run.
    let workload =
        std::fs::read_to_string(common::repo().join("examples/mig-partitionable/workload.yaml"))
            .unwrap();
    let mut pods = 0;
    for (i, document) in workload.split("\n---\n").enumerate() {
        kubectl_apply_text(&cluster, &format!("workload-{i}"), document.as_bytes());
        if document.contains("\nkind: Pod\n") {
            pods += 1;
            placed(&cluster, pods, pods.min(2)).await;
        }
    }
    let kubeconfig = viewer(&cluster);
    tables_match_golden(&cluster, "mig-partitionable", &kubeconfig).await;
    let why = kubectl_dra(&kubeconfig, &["why", "full-training"]);
    println!("kubectl dra why full-training\n{why}");
    for expected in [
        "gpu-0 blocked by shared counters (gpu-0-counter-set: memory-slice-0 needs 1, 0 left",
        "for default/inference-0",
        "for default/inference-1",
    ] {
        assert!(why.contains(expected), "{expected:?} in:\n{why}");
    }
}
