//! A real node on this machine (`cluster.sh node`): containerd v2.4.2 and kubelet v1.37.2
//! built from Go modules, registered with the test control plane.
//! - the kubelet registers Node `node-1` (kubelet v1.37.2, containerd 2.4.2) with the
//!   address cluster.sh gave it in the cluster's own network namespace as InternalIP (the
//!   whole cluster lives there: nothing it sends leaves the namespace);
//! - a hostNetwork busybox pod (an image made on this machine, no registry) reaches
//!   Running, and `kubectl logs` reads its output through kube-apiserver and kubelet;
//! - `cluster.sh down` leaves nothing behind: no process, mount, container cgroup,
//!   network namespace, shim socket, log link or changed kernel setting, and no folder.
//!
//! Where this machine lacks something the node needs (root, runc, busybox-static,
//! cgroups), the test fails with the missing piece named.

use std::collections::BTreeSet;
use std::path::Path;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::PostParams;
use test_cluster::{
    BUSYBOX_IMAGE, NODE_ADDRESS, NODE_NAME, TestCluster, eventually, server_message,
};

/// Kernel settings kubelet changes when it starts; `down` puts them back.
const SYSCTLS: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// Paths outside the node's folder that kubelet or containerd may create.
const FIXED_PATHS: [&str; 9] = [
    "/var/lib/kubelet",
    KUBELET_SOCKET,
    "/var/log/containers",
    "/var/log/pods",
    "/run/containerd/s",
    "/run/containerd/containerd.sock",
    "/opt/containerd",
    "/var/run/nri",
    "/etc/kubernetes",
];

/// kubelet's device plugin socket: a fixed path, whatever kubelet's root folder.
const KUBELET_SOCKET: &str = "/var/lib/kubelet/device-plugins/kubelet.sock";

/// What a node could leave on the machine outside its own folder.
#[derive(Debug, PartialEq)]
struct Host {
    sysctls: Vec<String>,
    netns: BTreeSet<String>,
    shim_sockets: BTreeSet<String>,
    log_links: BTreeSet<String>,
    /// Which of the fixed paths kubelet and containerd use whatever their root folders.
    fixed_paths: BTreeSet<&'static str>,
    k8s_io_cgroups: BTreeSet<String>,
    kube_iptables_chains: BTreeSet<String>,
}

fn names(dir: &str) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn host() -> Host {
    let mut k8s_io_cgroups = BTreeSet::new();
    for hierarchy in std::iter::once("/sys/fs/cgroup".to_string()).chain(
        names("/sys/fs/cgroup")
            .into_iter()
            .map(|h| format!("/sys/fs/cgroup/{h}")),
    ) {
        let k8s = format!("{hierarchy}/k8s.io");
        if Path::new(&k8s).is_dir() {
            k8s_io_cgroups.insert(k8s.clone());
            for child in names(&k8s) {
                if Path::new(&format!("{k8s}/{child}")).is_dir() {
                    k8s_io_cgroups.insert(format!("{k8s}/{child}"));
                }
            }
        }
    }
    let mut kube_iptables_chains = BTreeSet::new();
    for table in ["filter", "nat", "mangle"] {
        if let Ok(out) = std::process::Command::new("iptables")
            .args(["-t", table, "-S"])
            .output()
        {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if line.contains("KUBE-") {
                    kube_iptables_chains.insert(format!("{table}: {line}"));
                }
            }
        }
    }
    Host {
        sysctls: SYSCTLS
            .iter()
            .map(|s| {
                let value = std::fs::read_to_string(format!("/proc/sys/{s}")).unwrap_or_default();
                format!("{s}={}", value.trim())
            })
            .collect(),
        netns: names("/run/netns"),
        shim_sockets: names("/run/containerd/s"),
        log_links: names("/var/log/containers"),
        fixed_paths: FIXED_PATHS
            .iter()
            .copied()
            .filter(|p| Path::new(p).exists())
            .collect(),
        k8s_io_cgroups,
        kube_iptables_chains,
    }
}

/// Processes whose command line names `dir` (kubelet, containerd, shims).
fn processes_naming(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for pid in names("/proc") {
        if !pid.chars().all(|c| c.is_ascii_digit()) || pid == std::process::id().to_string() {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            // The cluster's reaper (`bash -c '... down DIR'`) ends on its own once it ran.
            if cmdline.contains(&needle) && !cmdline.contains("kill -0") {
                found.push(format!("{pid}: {cmdline}"));
            }
        }
    }
    found
}

/// kubelet and containerd processes now running (of other clusters: ours are stopped).
fn other_nodes() -> Vec<String> {
    names("/proc")
        .into_iter()
        .filter(|pid| pid.chars().all(|c| c.is_ascii_digit()))
        .filter_map(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            let comm = comm.trim();
            (comm == "kubelet" || comm == "containerd").then(|| format!("{pid} {comm}"))
        })
        .collect()
}

fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = format!("{}/", dir.display());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix) || *m == prefix.trim_end_matches('/'))
        .map(String::from)
        .collect()
}

fn busybox_pod(name: &str, script: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE_NAME,
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
            }],
        },
    }))
    .expect("pod manifest")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_node_runs_a_pod_and_down_leaves_nothing_behind() {
    let before = host();
    let cluster = TestCluster::with_node();
    let dir = cluster.dir().to_path_buf();
    let netns = cluster
        .netns()
        .expect("the node's cluster has its own network namespace");
    assert!(
        names("/run/netns").contains(netns),
        "{netns} is not in /run/netns"
    );
    let client = cluster.client().await;

    // The kubelet registered its Node with an InternalIP (the node's address in the
    // cluster's network namespace: kubelet refuses loopback), where kube-apiserver reaches it.
    let nodes: Api<Node> = Api::all(client.clone());
    let node = eventually("Node node-1 with an InternalIP", 60, || {
        let nodes = nodes.clone();
        async move {
            let node = nodes.get(NODE_NAME).await.ok()?;
            let addresses = node.status.as_ref()?.addresses.as_ref()?;
            addresses
                .iter()
                .any(|a| a.type_ == "InternalIP" && a.address == NODE_ADDRESS)
                .then_some(node)
        }
    })
    .await;
    println!(
        "node {NODE_NAME}: addresses {:?}",
        node.status.as_ref().and_then(|s| s.addresses.as_ref())
    );
    let kubelet_version = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| {
            (
                i.kubelet_version.clone(),
                i.container_runtime_version.clone(),
            )
        });
    println!("node {NODE_NAME}: kubelet, runtime = {kubelet_version:?}");
    assert_eq!(
        kubelet_version,
        Some(("v1.37.2".to_string(), "containerd://2.4.2".to_string()))
    );

    // A hostNetwork busybox pod reaches Running; its log comes back through kubelet.
    let ns = cluster.namespace("node").await;
    let pods: Api<Pod> = ns.api();
    let pod = busybox_pod(
        "hello",
        "echo hello from $(hostname); echo uid=$(id -u); sleep 3600",
    );
    // The namespace's default ServiceAccount comes from the controller manager.
    eventually("the pod to be admitted", 60, || {
        let pods = pods.clone();
        let pod = pod.clone();
        async move {
            match pods.create(&PostParams::default(), &pod).await {
                Ok(_) => Some(()),
                Err(e) => {
                    println!("create pod: {}", server_message(&e));
                    None
                }
            }
        }
    })
    .await;
    eventually("pod hello to be Running on node-1", 180, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("hello").await.ok()?;
            let phase = pod.status.as_ref()?.phase.clone()?;
            (phase == "Running").then_some(())
        }
    })
    .await;
    let log = eventually("kubectl logs hello", 60, || {
        let out = cluster
            .kubectl()
            .args(["-n", &ns.name, "logs", "hello"])
            .output()
            .expect("run kubectl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            println!("kubectl logs: {}", String::from_utf8_lossy(&out.stderr));
        }
        async move { text.contains("uid=").then_some(text) }
    })
    .await;
    println!("kubectl logs hello:\n{log}");
    assert!(log.contains("hello from"), "log: {log}");
    assert!(log.contains("uid=0"), "log: {log}");

    // The containers as containerd sees them, for the cleanup check.
    let out = cluster
        .ctr()
        .args(["containers", "ls", "-q"])
        .output()
        .expect("run ctr");
    let containers: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(
        containers.len(),
        2,
        "a sandbox and a container: {containers:?}"
    );
    let during = host();
    println!("while running: {during:#?}");
    for id in &containers {
        assert!(
            during.k8s_io_cgroups.iter().any(|c| c.ends_with(id)),
            "no cgroup for container {id} while it runs: {:?}",
            during.k8s_io_cgroups
        );
    }
    assert!(
        !mounts_under(&dir).is_empty(),
        "no mounts while the pod runs"
    );

    // `down` with the pod still running leaves nothing behind.
    cluster.down().expect("cluster.sh down");
    let after = host();
    let others = other_nodes();
    if others.is_empty() {
        // `down` also clears kubelet's device plugin socket when no kubelet runs, so one an
        // earlier run left behind (its kubelet killed while another ran) is gone too.
        let mut expected = before;
        if !after.fixed_paths.contains(KUBELET_SOCKET) {
            expected.fixed_paths.remove(KUBELET_SOCKET);
        }
        assert_eq!(
            after, expected,
            "the machine after down differs from before up"
        );
    } else {
        // Another node on this machine (another test process) changes the shared places
        // too: check only what is this node's own.
        println!(
            "other kubelets or containerds run ({others:?}): checking this node's own traces only"
        );
        let dir_text = dir.to_string_lossy().into_owned();
        for link in &after.log_links {
            let target = std::fs::read_link(format!("/var/log/containers/{link}"))
                .map(|t| t.to_string_lossy().into_owned())
                .unwrap_or_default();
            assert!(
                !target.starts_with(&dir_text),
                "log link {link} -> {target} left"
            );
        }
    }
    for id in &containers {
        assert!(
            !after.k8s_io_cgroups.iter().any(|c| c.ends_with(id)),
            "cgroup of container {id} left: {:?}",
            after.k8s_io_cgroups
        );
    }
    assert_eq!(
        processes_naming(&dir),
        Vec::<String>::new(),
        "processes left"
    );
    assert_eq!(mounts_under(&dir), Vec::<String>::new(), "mounts left");
    assert!(!dir.exists(), "{} left", dir.display());
}
