//! Helpers shared by the live tests: a `dra-scheduler run` process and a synthetic fleet.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};

use test_cluster::{TestCluster, free_port};

/// A scheduler process, stopped (SIGKILL) when dropped.
pub struct Daemon {
    pub child: Child,
    /// Base URL of its /metrics, /healthz and /readyz.
    pub metrics: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start_scheduler_with(cluster: &TestCluster, extra: &[&str]) -> Daemon {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_dra-scheduler"))
        .args(["run", "--kubeconfig"])
        .arg(cluster.kubeconfig_path())
        .args(["--metrics-bind-address", &format!("127.0.0.1:{port}")])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start dra-scheduler run");
    Daemon {
        child,
        metrics: format!("http://127.0.0.1:{port}"),
    }
}

fn kubectl_apply_text(cluster: &TestCluster, name: &str, text: &[u8]) {
    let dir = std::env::temp_dir().join(format!("apply-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, text).unwrap();
    let out = cluster
        .kubectl()
        .args(["apply", "-f"])
        .arg(&file)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        out.status.success(),
        "kubectl apply {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fleet of `nodes` x `gpus` from `generate-fleet` (with its class and templates).
pub fn apply_fleet(cluster: &TestCluster, nodes: usize, gpus: usize) {
    let out = Command::new(env!("CARGO_BIN_EXE_dra-scheduler"))
        .args(["generate-fleet", "--nodes", &nodes.to_string()])
        .args(["--gpus", &gpus.to_string(), "--pods", "0"])
        .output()
        .unwrap();
    assert!(out.status.success());
    kubectl_apply_text(cluster, "fleet", &out.stdout);
}

/// A Deployment `burst` of `replicas` pods for `scheduler`, each wanting one GPU.
pub fn apply_burst(cluster: &TestCluster, replicas: usize, scheduler: &str) {
    let workload = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: burst}}\nspec:\n  replicas: {replicas}\n  \
         selector: {{matchLabels: {{app: burst}}}}\n  template:\n    metadata: {{labels: {{app: burst}}}}\n    \
         spec:\n      schedulerName: {scheduler}\n      resourceClaims: [{{name: gpu, resourceClaimTemplateName: one-gpu}}]\n      \
         containers: [{{name: c, image: busybox, resources: {{claims: [{{name: gpu}}]}}}}]\n"
    );
    kubectl_apply_text(cluster, "burst", workload.as_bytes());
}

pub fn apply_fleet_and_burst(cluster: &TestCluster, nodes: usize, gpus: usize, replicas: usize) {
    apply_fleet(cluster, nodes, gpus);
    apply_burst(cluster, replicas, "dra-scheduler");
}
