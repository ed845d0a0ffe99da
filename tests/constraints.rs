//! Constraints kube-scheduler enforces, enforced by dra-scheduler on a real Kubernetes 1.37
//! control plane, and `simulate` giving the same answers on the same manifests:
//! - three replicas with required pod anti-affinity on two nodes: the third stays Pending
//!   with kube-scheduler's message;
//! - four replicas spread over two zones with maxSkew 1: two in each zone, although one
//!   zone has far more room;
//! - a pod with a GPU claim and a zonal PersistentVolume: the node that satisfies both.

use std::collections::BTreeMap;
use std::path::PathBuf;

use dra_scheduler::simulate;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::ListParams;
use test_cluster::{TestCluster, eventually};

mod common;
use common::{apply, devices, events_about, node_of, start_scheduler_with};

fn data(name: &str) -> String {
    format!("tests/data/constraints/{name}")
}

/// `simulate` on one scenario's manifests: each pod's node, or its message.
fn simulated(name: &str) -> BTreeMap<String, Result<String, String>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(data(name));
    let sim = simulate::simulate(
        &simulate::Options::default(),
        simulate::load(&[path]).expect("manifests load"),
    );
    sim.pods
        .iter()
        .filter_map(|(key, d)| {
            let d = d.as_ref()?;
            let outcome = match d.node() {
                Some(node) => Ok(node.to_string()),
                None => Err(d.message().unwrap_or_default().to_string()),
            };
            Some((key.name.clone(), outcome))
        })
        .collect()
}

async fn pods_with(client: &kube::Client, label: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), "default")
        .list(&ListParams::default().labels(label))
        .await
        .unwrap()
        .items
}

/// The message of the last FailedScheduling event about the pod.
async fn failed_scheduling(client: &kube::Client, pod: &str) -> Option<String> {
    events_about(client, pod)
        .await
        .into_iter()
        .rev()
        .find_map(|e| e.strip_prefix("FailedScheduling: ").map(str::to_string))
}

async fn zone_of(client: &kube::Client, node: &str) -> String {
    let node = Api::<Node>::all(client.clone()).get(node).await.unwrap();
    node.metadata.labels.unwrap_or_default()["topology.kubernetes.io/zone"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_enforces_affinity_spread_and_volumes_like_kube_scheduler() {
    let cluster = TestCluster::dedicated();
    let client = cluster.client().await;
    let _scheduler = start_scheduler_with(&cluster, &[]);

    // Anti-affinity: two replicas on distinct nodes, the third Pending with the message
    // simulate gives too.
    apply(&cluster, &[&data("anti-affinity.yaml")]);
    let (placed, pending) = eventually("two web replicas placed and one pending", 60, || async {
        let pods = pods_with(&client, "app=web").await;
        let placed: Vec<String> = pods.iter().filter_map(node_of).map(String::from).collect();
        let pending: Vec<String> = pods
            .iter()
            .filter(|p| node_of(p).is_none())
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect();
        (placed.len() == 2 && pending.len() == 1).then_some((placed, pending))
    })
    .await;
    assert_ne!(placed[0], placed[1], "replicas that must not share a node");
    let live_message = eventually("the pending replica is told why", 30, || async {
        failed_scheduling(&client, &pending[0]).await
    })
    .await;
    assert_eq!(
        live_message,
        "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules."
    );
    let sim = simulated("anti-affinity.yaml");
    let sim_pending: Vec<&String> = sim.values().filter_map(|o| o.as_ref().err()).collect();
    assert_eq!(sim_pending, [&live_message], "simulate says the same");
    assert_eq!(sim.values().filter(|o| o.is_ok()).count(), 2);

    // Topology spread: two replicas per zone.
    apply(&cluster, &[&data("zone-spread.yaml")]);
    let nodes = eventually("four spread replicas placed", 60, || async {
        let pods = pods_with(&client, "app=spread").await;
        let nodes: Vec<String> = pods.iter().filter_map(node_of).map(String::from).collect();
        (nodes.len() == 4).then_some(nodes)
    })
    .await;
    let mut per_zone: BTreeMap<String, usize> = BTreeMap::new();
    for node in &nodes {
        *per_zone.entry(zone_of(&client, node).await).or_default() += 1;
    }
    assert_eq!(
        per_zone,
        BTreeMap::from([("zone-a".into(), 2), ("zone-b".into(), 2)])
    );
    let mut sim_zones: BTreeMap<String, usize> = BTreeMap::new();
    for outcome in simulated("zone-spread.yaml").values() {
        let node = outcome
            .as_ref()
            .expect("simulate places every spread replica");
        let zone = if node.starts_with("zs-a") {
            "zone-a"
        } else {
            "zone-b"
        };
        *sim_zones.entry(zone.into()).or_default() += 1;
    }
    assert_eq!(sim_zones, per_zone, "simulate spreads the same way");

    // A GPU and a zonal volume: only gz-b has both.
    apply(&cluster, &[&data("gpu-zonal-volume.yaml")]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let node = eventually("the training pod is placed", 60, || async {
        let pod = pods.get("gz-train").await.ok()?;
        node_of(&pod).map(String::from)
    })
    .await;
    assert_eq!(node, "gz-b");
    let claim = Api::<ResourceClaim>::namespaced(client.clone(), "default")
        .get("gz-gpu")
        .await
        .unwrap();
    assert_eq!(
        devices(&claim),
        [(
            "gpu".to_string(),
            "gz-gpu.example.com/gz-b/gpu-0".to_string()
        )],
        "the GPU is on the volume's node"
    );
    assert_eq!(
        simulated("gpu-zonal-volume.yaml")["gz-train"],
        Ok("gz-b".to_string())
    );
}
