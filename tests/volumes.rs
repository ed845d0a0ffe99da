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

/// Our PreBind is undone when the binding cannot finish: a claim to provision gets the
/// selected-node annotation, the binder waits for a provisioner that never comes, the pod
/// is deleted meanwhile, and the annotation is taken back (the claim is not left promised
/// to a node for a pod that is not coming).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_write_is_undone_when_the_pod_goes_away_before_its_binding() {
    let cluster = TestCluster::dedicated();
    let client = cluster.client().await;
    let _scheduler = start_scheduler_with(&cluster, &[]);
    common::kubectl_apply_text(
        &cluster,
        "unwind",
        b"apiVersion: v1\nkind: Node\nmetadata: {name: unwind-node, labels: {kubernetes.io/hostname: unwind-node}}\n\
status: {allocatable: {cpu: '8', memory: 32Gi, pods: '110'}, capacity: {cpu: '8', memory: 32Gi, pods: '110'}}\n---\n\
apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: never-provisioned}\n\
provisioner: example.com/no-such-provisioner\nvolumeBindingMode: WaitForFirstConsumer\n---\n\
apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: scratch}\n\
spec: {accessModes: [ReadWriteOnce], storageClassName: never-provisioned, resources: {requests: {storage: 1Gi}}}\n---\n\
apiVersion: v1\nkind: Pod\nmetadata: {name: waits-for-its-volume}\n\
spec:\n  schedulerName: dra-scheduler\n  containers: [{name: c, image: busybox}]\n  \
volumes: [{name: data, persistentVolumeClaim: {claimName: scratch}}]\n",
    );
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let selected = |pvc: &PersistentVolumeClaim| {
        pvc.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("volume.kubernetes.io/selected-node").cloned())
    };
    let node = eventually("the claim is told its node", 60, || async {
        selected(&claims.get("scratch").await.ok()?)
    })
    .await;
    assert_eq!(node, "unwind-node");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    assert!(node_of(&pods.get("waits-for-its-volume").await.unwrap()).is_none());
    pods.delete("waits-for-its-volume", &Default::default())
        .await
        .unwrap();
    eventually("the selected node is taken back", 60, || async {
        let pvc = claims.get("scratch").await.ok()?;
        selected(&pvc).is_none().then_some(())
    })
    .await;
}
