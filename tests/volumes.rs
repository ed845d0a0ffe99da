//! Volumes on a real Kubernetes 1.37 control plane, as kube-scheduler places them:
//! - a StatefulSet replica whose WaitForFirstConsumer claim can only be met by a local
//!   PersistentVolume (no provisioner) lands on that volume's node, and the claim ends up
//!   bound to it: our PreBind names the claim in the volume's claimRef, the PV controller
//!   completes the binding, and only then is the pod bound;
//! - a pod whose claim is bound to a volume in zone-b lands in zone-b;
//! - `simulate` gives the same nodes on the same manifests.

use std::path::PathBuf;

use dra_scheduler::simulate;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Api;
use test_cluster::{TestCluster, eventually};

mod common;
use common::{apply, node_of, start_scheduler_with};

fn data(name: &str) -> String {
    format!("tests/data/volumes/{name}")
}

/// The node `simulate` gives the pod on the scenario's manifests.
fn simulated(name: &str, pod: &str) -> Option<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(data(name));
    let sim = simulate::simulate(
        &simulate::Options::default(),
        simulate::load(&[path]).expect("manifests load"),
    );
    sim.pods
        .iter()
        .find(|(k, _)| k.name == pod)
        .and_then(|(_, d)| d.as_ref()?.node().map(String::from))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_decide_where_pods_go_and_our_prebind_binds_local_volumes() {
    let cluster = TestCluster::dedicated();
    let client = cluster.client().await;
    let _scheduler = start_scheduler_with(&cluster, &[]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let volumes: Api<PersistentVolume> = Api::all(client.clone());

    // A StatefulSet with a WaitForFirstConsumer claim template; the local PV is on vol-b.
    apply(&cluster, &[&data("local-statefulset.yaml")]);
    let node = eventually("the StatefulSet replica is bound", 120, || async {
        let pod = pods.get("vol-db-0").await.ok()?;
        node_of(&pod).map(String::from)
    })
    .await;
    assert_eq!(node, "vol-b", "the node of the only volume that fits");
    let pv = volumes.get("vol-b-disk").await.unwrap();
    let claim_ref = pv.spec.unwrap().claim_ref.expect("claimRef written");
    assert_eq!(
        (claim_ref.namespace.as_deref(), claim_ref.name.as_deref()),
        (Some("default"), Some("data-vol-db-0"))
    );
    let claim = claims.get("data-vol-db-0").await.unwrap();
    assert_eq!(
        claim.spec.unwrap().volume_name.as_deref(),
        Some("vol-b-disk"),
        "the claim is bound to the volume before the pod was bound"
    );
    assert_eq!(
        simulated("local-statefulset.yaml", "vol-db-0").as_deref(),
        Some("vol-b")
    );

    // A claim bound to a zonal volume: the pod goes to the volume's zone.
    apply(&cluster, &[&data("zonal-claim.yaml")]);
    let node = eventually("the zonal pod is bound", 120, || async {
        let pod = pods.get("zv-app").await.ok()?;
        node_of(&pod).map(String::from)
    })
    .await;
    assert_eq!(node, "zv-b");
    assert_eq!(
        simulated("zonal-claim.yaml", "zv-app").as_deref(),
        Some("zv-b")
    );
}
