//! The scheduler on the API server of each Kubernetes release the chart supports, shown
//! on the real control plane serving what that release serves (README "Kubernetes
//! versions"): 1.37 serves DeviceTaintRules in `resource.k8s.io/v1`; 1.34–1.36 with
//! default gates serve none; 1.34–1.35 with the alpha API on serve them in `v1alpha3`;
//! 1.36 with the beta API on, in `v1beta2`.
//!
//! In each, the scheduler becomes ready and places the device-taint-rule example's jobs
//! (and, without DeviceTaintRules, the first-available example):
//! where a version serves DeviceTaintRules, the example's rule (node-b's GPUs in
//! maintenance) keeps every job off node-b; where none is served, node-b's GPUs are usable.

mod common;

use std::time::Duration;

use common::{Daemon, get, node_of, start_scheduler_with, wait_bound};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use test_cluster::TestCluster;

/// The example's fleet without its DeviceTaintRule, which each case writes (or cannot).
fn fleet_without_rule() -> String {
    let text =
        std::fs::read_to_string(common::repo().join("examples/device-taint-rule/fleet.yaml"))
            .unwrap();
    text.split("\n---\n")
        .filter(|doc| !doc.contains("kind: DeviceTaintRule"))
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// The example's rule, in `version` of resource.k8s.io.
fn rule(version: &str) -> String {
    let text =
        std::fs::read_to_string(common::repo().join("examples/device-taint-rule/fleet.yaml"))
            .unwrap();
    let rule = text
        .split("\n---\n")
        .find(|doc| doc.contains("kind: DeviceTaintRule"))
        .expect("the example has a DeviceTaintRule")
        .to_string();
    rule.replace(
        "resource.k8s.io/v1\n",
        &format!("resource.k8s.io/{version}\n"),
    )
}

fn kubectl_apply(cluster: &TestCluster, yaml: &str) -> Result<String, String> {
    use std::io::Write;
    let mut child = cluster
        .kubectl()
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

async fn ready(daemon: &Daemon) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let status = get(&daemon.metrics, "/readyz");
        if matches!(status, Some((200, _))) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the scheduler did not become ready in 60 s: /readyz {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What the API server serves: the `--runtime-config` that turns off what the release
/// does not serve, and the version the DeviceTaintRule can be written in (if any).
struct Release {
    name: &'static str,
    runtime_config: &'static str,
    taint_rules: Option<&'static str>,
}

/// Runs the example on a control plane serving what `release` serves: the nodes the jobs
/// were placed on.
async fn jobs_placed_on(release: &Release) -> Vec<String> {
    let cluster = TestCluster::dedicated_with_runtime_config(release.runtime_config);
    kubectl_apply(&cluster, &fleet_without_rule()).unwrap();
    for version in ["v1", "v1beta2", "v1alpha3"] {
        let written = kubectl_apply(&cluster, &rule(version));
        assert_eq!(
            written.is_ok(),
            release.taint_rules == Some(version),
            "{}: writing the DeviceTaintRule in {version}: {written:?}",
            release.name
        );
    }
    let daemon = start_scheduler_with(&cluster, &[]);
    ready(&daemon).await;
    let workload =
        std::fs::read_to_string(common::repo().join("examples/device-taint-rule/workload.yaml"))
            .unwrap();
    kubectl_apply(&cluster, &workload).unwrap();
    let client = cluster.client().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let expected = if release.taint_rules.is_some() { 2 } else { 3 };
    let bound = wait_bound(&pods, expected).await;
    let mut nodes: Vec<String> = bound
        .iter()
        .filter_map(|p| node_of(p).map(str::to_string))
        .collect();
    nodes.sort();
    // The third job of a tainted fleet stays Pending: nothing more is bound later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = pods.list(&Default::default()).await.unwrap().items;
    let bound_now = all.iter().filter(|p| node_of(p).is_some()).count();
    assert_eq!(bound_now, expected, "{}: {nodes:?}", release.name);
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_1_37_taint_rules_in_v1_keep_jobs_off_the_tainted_node() {
    let nodes = jobs_placed_on(&Release {
        name: "1.37",
        runtime_config: "resource.k8s.io/v1beta2/devicetaintrules=false,resource.k8s.io/v1alpha3/devicetaintrules=false",
        taint_rules: Some("v1"),
    })
    .await;
    assert_eq!(nodes, ["node-a", "node-a"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_1_34_to_1_36_with_default_gates_serve_no_taint_rules_and_the_scheduler_runs() {
    let nodes = jobs_placed_on(&Release {
        name: "1.34-1.36 (default gates)",
        runtime_config: "resource.k8s.io/v1/devicetaintrules=false,resource.k8s.io/v1beta2/devicetaintrules=false,resource.k8s.io/v1alpha3/devicetaintrules=false",
        taint_rules: None,
    })
    .await;
    assert_eq!(nodes, ["node-a", "node-a", "node-b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_1_34_and_1_35_with_the_alpha_api_use_v1alpha3_taint_rules() {
    let nodes = jobs_placed_on(&Release {
        name: "1.34-1.35 (DRADeviceTaints, v1alpha3 on)",
        runtime_config: "resource.k8s.io/v1/devicetaintrules=false,resource.k8s.io/v1beta2/devicetaintrules=false",
        taint_rules: Some("v1alpha3"),
    })
    .await;
    assert_eq!(nodes, ["node-a", "node-a"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_1_36_with_the_beta_api_uses_v1beta2_taint_rules() {
    let nodes = jobs_placed_on(&Release {
        name: "1.36 (v1beta2 on)",
        runtime_config: "resource.k8s.io/v1/devicetaintrules=false,resource.k8s.io/v1alpha3/devicetaintrules=false",
        taint_rules: Some("v1beta2"),
    })
    .await;
    assert_eq!(nodes, ["node-a", "node-a"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_1_34_to_1_36_with_default_gates_places_the_first_available_example() {
    let cluster = TestCluster::dedicated_with_runtime_config(
        "resource.k8s.io/v1/devicetaintrules=false,resource.k8s.io/v1beta2/devicetaintrules=false,resource.k8s.io/v1alpha3/devicetaintrules=false",
    );
    let daemon = start_scheduler_with(&cluster, &[]);
    ready(&daemon).await;
    for file in ["fleet.yaml", "workload.yaml"] {
        let text =
            std::fs::read_to_string(common::repo().join("examples/first-available").join(file))
                .unwrap();
        kubectl_apply(&cluster, &text).unwrap();
    }
    let client = cluster.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let bound = wait_bound(&pods, 2).await;
    assert!(
        bound.iter().all(|p| node_of(p) == Some("gpu-node-1")),
        "{:?}",
        bound.iter().map(node_of).collect::<Vec<_>>()
    );
    // One replica got the A5000, the other fell back to a T10.
    let claims: Api<k8s_openapi::api::resource::v1::ResourceClaim> =
        Api::namespaced(client, "default");
    let mut requests: Vec<String> = Vec::new();
    for claim in claims.list(&Default::default()).await.unwrap().items {
        let allocation = claim.status.and_then(|s| s.allocation).expect("allocated");
        for r in allocation.devices.unwrap().results.unwrap() {
            requests.push(r.request);
        }
    }
    requests.sort();
    assert_eq!(requests, ["gpu/a5000", "gpu/t10"]);
}
