//! `simulate --from-cluster` on a real Kubernetes 1.37 control plane: with 50 pods placed by
//! the live scheduler, "what if I apply these manifests now?" is answered from the
//! cluster's state, and the daemon then places the new pods exactly there (the same node,
//! the same devices).

use std::collections::BTreeMap;
use std::process::Command;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::ListParams;
use serde_json::Value;
use test_cluster::{TestCluster, eventually};

mod common;
use common::{
    apply_fleet_and_burst, devices, kubectl_apply_text, node_of, start_scheduler_with, wait_bound,
};

/// Twelve pods, each with its own claim: two GPUs and a NIC on one NUMA node for every
/// third, one GPU for the others (claims first, so each pod's claim exists when it comes).
fn new_pods() -> String {
    let mut claims = String::new();
    let mut pods = String::new();
    for i in 0..12 {
        let template = if i % 3 == 0 {
            "four-gpus-one-nic"
        } else {
            "one-gpu"
        };
        claims.push_str(&format!(
            "---\napiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: new-{i}}}\n\
             spec: {}\n",
            template_spec(template)
        ));
        pods.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: new-{i}}}\nspec:\n  schedulerName: dra-scheduler\n  \
             resourceClaims: [{{name: gpu, resourceClaimName: new-{i}}}]\n  \
             containers: [{{name: c, image: busybox, resources: {{claims: [{{name: gpu}}]}}}}]\n"
        ));
    }
    claims + &pods
}

/// The spec of generate-fleet's template `name`, as a claim's spec (flow style).
fn template_spec(name: &str) -> String {
    match name {
        "one-gpu" => "{devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}".into(),
        _ => "{devices: {requests: [{name: gpus, exactly: {deviceClassName: gpu.nvidia.com, count: 2}}, \
              {name: nic, exactly: {deviceClassName: nic.example.com}}], \
              constraints: [{matchAttribute: resource.kubernetes.io/numaNode}]}}"
            .into(),
    }
}

/// Pod -> (node, devices of its claim) from simulate's JSON report.
fn predicted(report: &Value) -> BTreeMap<String, (String, Vec<String>)> {
    let claims: BTreeMap<String, Vec<String>> = report["claims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let devices = c["allocation"]["devices"]["results"]
                .as_array()
                .map(|rs| {
                    rs.iter()
                        .map(|r| {
                            format!(
                                "{}/{}",
                                r["pool"].as_str().unwrap(),
                                r["device"].as_str().unwrap()
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            (c["name"].as_str().unwrap().to_string(), devices)
        })
        .collect();
    report["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"].as_str().unwrap().starts_with("new-"))
        .map(|p| {
            let name = p["name"].as_str().unwrap().to_string();
            let node = p["node"].as_str().unwrap_or("<pending>").to_string();
            let mut got = claims.get(&name).cloned().unwrap_or_default();
            got.sort();
            (name, (node, got))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_from_the_cluster_predicts_where_the_daemon_places_new_pods() {
    let cluster = TestCluster::dedicated();
    let _daemon = start_scheduler_with(&cluster, &[]);
    apply_fleet_and_burst(&cluster, 10, 8, 50);
    let client = cluster.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let bound = wait_bound(&pods, 50).await;
    assert_eq!(bound.iter().filter(|p| node_of(p).is_some()).count(), 50);

    let manifest = cluster.dir().join("new-pods.yaml");
    std::fs::write(&manifest, new_pods()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dra-scheduler"))
        .args(["simulate", "--from-cluster", "--kubeconfig"])
        .arg(cluster.kubeconfig_path())
        .args(["-o", "json"])
        .arg(&manifest)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let prediction = predicted(&report);
    assert_eq!(prediction.len(), 12, "{prediction:?}");
    let burst_in_report = report["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"].as_str().unwrap().starts_with("burst-") && p["node"].is_string())
        .count();
    assert_eq!(
        burst_in_report, 50,
        "the cluster's bound pods are the starting load"
    );

    kubectl_apply_text(&cluster, "new-pods", new_pods().as_bytes());
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let placed = eventually("the 12 new pods bound", 120, || async {
        let list = pods.list(&ListParams::default()).await.ok()?.items;
        let new: Vec<&Pod> = list
            .iter()
            .filter(|p| p.metadata.name.as_deref().unwrap().starts_with("new-"))
            .collect();
        (new.len() == 12 && new.iter().all(|p| node_of(p).is_some()))
            .then(|| new.iter().map(|p| (*p).clone()).collect::<Vec<Pod>>())
    })
    .await;
    let mut actual = BTreeMap::new();
    for pod in &placed {
        let name = pod.metadata.name.clone().unwrap();
        let claim = claims.get(&name).await.unwrap();
        let mut got: Vec<String> = devices(&claim)
            .into_iter()
            .map(|(_, d)| d.split_once('/').unwrap().1.to_string())
            .collect();
        got.sort();
        actual.insert(name, (node_of(pod).unwrap().to_string(), got));
    }
    for (pod, want) in &prediction {
        println!("{pod}: simulate {want:?}, daemon {:?}", actual[pod]);
    }
    assert_eq!(actual, prediction);
}
