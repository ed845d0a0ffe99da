//! Preemption in the live scheduler, on a real Kubernetes 1.37 control plane: a pod of
//! higher priority that fits nowhere evicts the fewest lower-priority pods whose devices
//! make it fit, the youngest first, and gets those devices once their claims are given
//! back; nothing of lower priority takes them meanwhile; PodDisruptionBudgets steer it to
//! another node; `preemptionPolicy: Never` evicts nobody; a restart between the evictions
//! and the binding still ends with the preemptor on the freed devices.
//!
//! These control planes have no kubelet: a deleted pod that was bound to a node stays
//! Terminating until its kubelet confirms it stopped. The tests confirm it for the victims
//! the scheduler deleted (a delete with grace period 0, what the kubelet's final delete
//! does), after checking that the scheduler asked for it.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use test_cluster::{TestCluster, eventually};

mod common;
use common::{
    Daemon, apply_fleet, assert_no_device_twice, events_about, kubectl_apply_text, node_of,
    start_scheduler_with,
};

const CLASSES: &str = "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: urgent}\nvalue: 1000\n---\n\
apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: middle}\nvalue: 500\n---\n\
apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: urgent-never}\nvalue: 1000\npreemptionPolicy: Never\n---\n\
apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: two-gpus}\n\
spec:\n  spec:\n    devices:\n      requests:\n      - name: gpu\n        exactly: {deviceClassName: gpu.nvidia.com, count: 2}\n";

/// A pod of `class` (none: priority 0) using template `template`, with `labels`, kept to
/// `node` when given.
fn pod(
    name: &str,
    class: Option<&str>,
    template: &str,
    labels: &str,
    node: Option<&str>,
) -> String {
    let class = class.map_or(String::new(), |c| format!("  priorityClassName: {c}\n"));
    let node = node.map_or(String::new(), |n| {
        format!("  nodeSelector: {{kubernetes.io/hostname: {n}}}\n")
    });
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{{labels}}}}}\nspec:\n  schedulerName: dra-scheduler\n{class}{node}  \
         resourceClaims: [{{name: gpu, resourceClaimTemplateName: {template}}}]\n  \
         containers: [{{name: c, image: busybox, resources: {{claims: [{{name: gpu}}]}}}}]\n"
    )
}

/// Create pods one at a time, each bound before the next (and a second apart, so that
/// their ages differ), all priority 0.
async fn fill(cluster: &TestCluster, pods: &Api<Pod>, names: &[(&str, &str, &str)]) {
    for (name, labels, node) in names {
        kubectl_apply_text(
            cluster,
            name,
            pod(name, None, "one-gpu", labels, Some(node)).as_bytes(),
        );
        eventually(&format!("{name} bound"), 60, || async {
            node_of(&pods.get(name).await.ok()?).map(|_| ())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
}

/// The pods the scheduler deleted (Terminating), confirmed gone as a kubelet would.
async fn victims(pods: &Api<Pod>, n: usize) -> BTreeSet<String> {
    let deleted = eventually(&format!("{n} victims deleted"), 60, || async {
        let list = pods.list(&ListParams::default()).await.ok()?.items;
        let deleted: BTreeSet<String> = list
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        (deleted.len() >= n).then_some(deleted)
    })
    .await;
    for name in &deleted {
        let pod = pods.get(name).await.unwrap();
        let conditions = pod.status.and_then(|s| s.conditions).unwrap_or_default();
        assert!(
            conditions.iter().any(|c| c.type_ == "DisruptionTarget"
                && c.reason.as_deref() == Some("PreemptionByScheduler")),
            "{name} is marked as preempted: {conditions:?}"
        );
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    }
    deleted
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// A pod of `class` using the claim `claim` by name, kept to `node`.
fn sharing(name: &str, class: Option<&str>, claim: &str, node: &str) -> String {
    pod(name, class, "x", "", Some(node)).replace(
        "resourceClaimTemplateName: x",
        &format!("resourceClaimName: {claim}"),
    )
}

async fn started(cluster: &TestCluster) -> (Daemon, Api<Pod>, kube::Client) {
    let daemon = start_scheduler_with(cluster, &["--leader-elect=false"]);
    kubectl_apply_text(cluster, "classes", CLASSES.as_bytes());
    let client = cluster.client().await;
    (daemon, Api::namespaced(client.clone(), "default"), client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_urgent_pod_evicts_the_two_youngest_and_nothing_else_takes_their_gpus() {
    let cluster = TestCluster::dedicated();
    apply_fleet(&cluster, 1, 4);
    let (_daemon, pods, client) = started(&cluster).await;
    let node = "gpu-node-0000";
    fill(
        &cluster,
        &pods,
        &[
            ("low-0", "", node),
            ("low-1", "", node),
            ("low-2", "", node),
            ("low-3", "", node),
        ],
    )
    .await;
    // A pod of priority 0 waits for a GPU too: it must not get the freed ones.
    kubectl_apply_text(
        &cluster,
        "waiting",
        pod("waiting", None, "one-gpu", "", None).as_bytes(),
    );
    kubectl_apply_text(
        &cluster,
        "urgent",
        pod("urgent", Some("urgent"), "two-gpus", "", None).as_bytes(),
    );
    let deleted = victims(&pods, 2).await;
    assert_eq!(deleted, names(&["low-2", "low-3"]), "the two youngest");
    let bound = eventually("the urgent pod bound", 90, || async {
        node_of(&pods.get("urgent").await.ok()?).map(String::from)
    })
    .await;
    assert_eq!(bound, node);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        node_of(&pods.get("waiting").await.unwrap()).is_none(),
        "the waiting pod got nothing"
    );
    let remaining: BTreeSet<String> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(remaining, names(&["low-0", "low-1", "urgent", "waiting"]));
    assert_eq!(assert_no_device_twice(&client).await, 4);
    let told = events_about(&client, "urgent").await;
    assert!(
        told.iter()
            .any(|e| e.contains("low-2") && e.contains("low-3")),
        "the urgent pod's events name its victims: {told:?}"
    );
    let victim_events = events_about(&client, "low-3").await;
    assert!(
        victim_events.iter().any(|e| e.starts_with("Preempted:")),
        "{victim_events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disruption_budget_steers_preemption_to_the_other_node_and_policy_never_evicts_nobody() {
    let cluster = TestCluster::dedicated();
    apply_fleet(&cluster, 2, 1);
    let (_daemon, pods, _client) = started(&cluster).await;
    fill(
        &cluster,
        &pods,
        &[
            ("guarded", "app: guarded", "gpu-node-0000"),
            ("free", "app: free", "gpu-node-0001"),
        ],
    )
    .await;
    kubectl_apply_text(
        &cluster,
        "pdb",
        b"apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: guarded}\nspec:\n  maxUnavailable: 0\n  selector: {matchLabels: {app: guarded}}\n",
    );
    // preemptionPolicy: Never first: it waits, and nobody is evicted.
    kubectl_apply_text(
        &cluster,
        "never",
        pod("never", Some("urgent-never"), "one-gpu", "", None).as_bytes(),
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    let list = pods.list(&ListParams::default()).await.unwrap().items;
    assert!(
        list.iter().all(|p| p.metadata.deletion_timestamp.is_none()),
        "nobody evicted"
    );
    assert!(node_of(&pods.get("never").await.unwrap()).is_none());
    pods.delete("never", &DeleteParams::default())
        .await
        .unwrap();

    kubectl_apply_text(
        &cluster,
        "urgent",
        pod("urgent", Some("urgent"), "one-gpu", "", None).as_bytes(),
    );
    let deleted = victims(&pods, 1).await;
    assert_eq!(deleted, names(&["free"]), "the PDB keeps the guarded pod");
    let bound = eventually("the urgent pod bound", 90, || async {
        node_of(&pods.get("urgent").await.ok()?).map(String::from)
    })
    .await;
    assert_eq!(bound, "gpu-node-0001");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_between_the_evictions_and_the_binding_still_gives_the_preemptor_the_gpus() {
    let cluster = TestCluster::dedicated();
    apply_fleet(&cluster, 1, 2);
    let (daemon, pods, client) = started(&cluster).await;
    let node = "gpu-node-0000";
    fill(&cluster, &pods, &[("low-0", "", node), ("low-1", "", node)]).await;
    kubectl_apply_text(
        &cluster,
        "waiting",
        pod("waiting", None, "one-gpu", "", None).as_bytes(),
    );
    kubectl_apply_text(
        &cluster,
        "urgent",
        pod("urgent", Some("urgent"), "two-gpus", "", None).as_bytes(),
    );
    // The victims are marked and deleted; the scheduler dies (SIGKILL) before the
    // preemptor is bound, and the victims are confirmed gone while it is down.
    eventually("both victims deleted", 60, || async {
        let list = pods.list(&ListParams::default()).await.ok()?.items;
        let n = list
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .count();
        (n == 2).then_some(())
    })
    .await;
    drop(daemon);
    let deleted = victims(&pods, 2).await;
    assert_eq!(deleted, names(&["low-0", "low-1"]));
    let nominated = pods
        .get("urgent")
        .await
        .unwrap()
        .status
        .and_then(|s| s.nominated_node_name);
    assert_eq!(
        nominated.as_deref(),
        Some(node),
        "the nomination survives in the API"
    );
    let _daemon = start_scheduler_with(&cluster, &["--leader-elect=false"]);
    let bound = eventually("the urgent pod bound after the restart", 90, || async {
        node_of(&pods.get("urgent").await.ok()?).map(String::from)
    })
    .await;
    assert_eq!(bound, node);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(node_of(&pods.get("waiting").await.unwrap()).is_none());
    assert_eq!(assert_no_device_twice(&client).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_claim_is_not_freed_by_evicting_only_its_low_priority_co_user() {
    let cluster = TestCluster::dedicated();
    apply_fleet(&cluster, 1, 2);
    let (_daemon, pods, client) = started(&cluster).await;
    let node = "gpu-node-0000";
    kubectl_apply_text(
        &cluster,
        "shared",
        b"apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: shared}\n\
spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}\n",
    );
    // One GPU shared by a pod of priority 1000 and one of priority 0; the other GPU is a
    // priority-0 pod's own.
    for (name, class) in [("keeper", Some("urgent")), ("co-user", None)] {
        kubectl_apply_text(
            &cluster,
            name,
            sharing(name, class, "shared", node).as_bytes(),
        );
        eventually(&format!("{name} bound"), 60, || async {
            node_of(&pods.get(name).await.ok()?).map(|_| ())
        })
        .await;
    }
    fill(&cluster, &pods, &[("other", "", node)]).await;
    // A pod of priority 500 asks for both GPUs: evicting the co-user frees nothing (the
    // keeper still uses the shared GPU), so no eviction helps and nobody is evicted.
    kubectl_apply_text(
        &cluster,
        "mid",
        pod("mid", Some("middle"), "two-gpus", "", None).as_bytes(),
    );
    let told = eventually("mid told why it cannot preempt", 60, || async {
        let events = events_about(&client, "mid").await;
        events.into_iter().find(|e| e.contains("preemption:"))
    })
    .await;
    eprintln!("mid: {told}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let list = pods.list(&ListParams::default()).await.unwrap().items;
    assert!(
        list.iter().all(|p| p.metadata.deletion_timestamp.is_none()),
        "nobody evicted"
    );
    assert!(node_of(&pods.get("mid").await.unwrap()).is_none());
}

/// What one scheduler did with the urgent pod on a node full of priority-0 pods.
async fn urgent_on_a_full_node(
    cluster: &TestCluster,
    pods: &Api<Pod>,
    client: &kube::Client,
    confirm: bool,
) -> [String; 3] {
    let node = "gpu-node-0000";
    fill(
        cluster,
        pods,
        &[
            ("low-0", "", node),
            ("low-1", "", node),
            ("low-2", "", node),
            ("low-3", "", node),
        ],
    )
    .await;
    kubectl_apply_text(
        cluster,
        "urgent",
        pod("urgent", Some("urgent"), "two-gpus", "", None).as_bytes(),
    );
    // Both schedulers say what preemption did in the pod's FailedScheduling event.
    eventually(
        "the urgent pod's attempt, preemption included",
        60,
        || async {
            let events = events_about(client, "urgent").await;
            events
                .iter()
                .any(|e| e.contains("preemption"))
                .then_some(())
        },
    )
    .await;
    let deleted: Vec<String> = if confirm {
        let victims = victims(pods, 2).await;
        eventually("the urgent pod bound", 90, || async {
            node_of(&pods.get("urgent").await.ok()?).map(|_| ())
        })
        .await;
        victims.into_iter().collect()
    } else {
        // Time for a deletion to show, if kube-scheduler made one.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        list.iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .map(|p| p.metadata.name.clone().unwrap())
            .collect()
    };
    let urgent = pods.get("urgent").await.unwrap();
    let outcome = match node_of(&urgent) {
        Some(node) => format!("bound to {node}"),
        None => {
            let events = events_about(client, "urgent").await;
            format!("pending: {}", events.last().cloned().unwrap_or_default())
        }
    };
    let evicted = if deleted.is_empty() {
        "none".to_string()
    } else {
        deleted.join(", ")
    };
    [
        evicted,
        outcome,
        assert_no_device_twice(client).await.to_string(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn side_by_side_kube_scheduler_frees_no_devices_and_we_do() {
    let theirs = {
        let cluster = TestCluster::dedicated();
        apply_fleet(&cluster, 1, 4);
        kubectl_apply_text(&cluster, "classes", CLASSES.as_bytes());
        cluster
            .start_reference_scheduler("dra-scheduler")
            .expect("kube-scheduler starts");
        let client = cluster.client().await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        urgent_on_a_full_node(&cluster, &pods, &client, false).await
    };
    let ours = {
        let cluster = TestCluster::dedicated();
        apply_fleet(&cluster, 1, 4);
        let (_daemon, pods, client) = started(&cluster).await;
        urgent_on_a_full_node(&cluster, &pods, &client, true).await
    };
    println!("scheduler              evicted        urgent pod (2 GPUs, priority 1000)");
    println!("kube-scheduler 1.37.2  {:13}  {}", theirs[0], theirs[1]);
    println!("dra-scheduler          {:13}  {}", ours[0], ours[1]);
    // kube-scheduler 1.37's preemption does not count devices: evicting pods frees no
    // claim in its eyes, so it evicts nobody and the pod waits.
    assert_eq!(theirs[0], "none");
    assert!(theirs[1].starts_with("pending"), "{}", theirs[1]);
    assert_eq!(ours[0], "low-2, low-3");
    assert_eq!(ours[1], "bound to gpu-node-0000");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_urgent_gang_preempts_as_a_group_and_is_placed_whole() {
    let cluster = TestCluster::dedicated();
    apply_fleet(&cluster, 2, 2);
    let (_daemon, pods, client) = started(&cluster).await;
    fill(
        &cluster,
        &pods,
        &[
            ("low-0", "", "gpu-node-0000"),
            ("low-1", "", "gpu-node-0000"),
            ("low-2", "", "gpu-node-0001"),
            ("low-3", "", "gpu-node-0001"),
        ],
    )
    .await;
    // A gang of 2 pods of priority 1000, 2 GPUs each: only evicting all four makes room.
    // (The PodGroup carries the priority too: kube-scheduler requires the members' to be
    // the group's.)
    let mut text = String::from(
        "apiVersion: scheduling.k8s.io/v1beta1\nkind: PodGroup\nmetadata: {name: train}\n\
         spec: {priorityClassName: urgent, schedulingPolicy: {gang: {minCount: 2}}}\n",
    );
    for i in 0..2 {
        text += "---\n";
        text += &pod(
            &format!("train-{i}"),
            Some("urgent"),
            "two-gpus",
            "gang: train",
            None,
        )
        .replace(
            "  schedulerName: dra-scheduler\n",
            "  schedulerName: dra-scheduler\n  schedulingGroup: {podGroupName: train}\n",
        );
    }
    kubectl_apply_text(&cluster, "gang", text.as_bytes());
    let deleted = victims(&pods, 4).await;
    assert_eq!(deleted, names(&["low-0", "low-1", "low-2", "low-3"]));
    let nodes = eventually("both members bound", 90, || async {
        let mut nodes = BTreeSet::new();
        for i in 0..2 {
            nodes.insert(node_of(&pods.get(&format!("train-{i}")).await.ok()?)?.to_string());
        }
        Some(nodes)
    })
    .await;
    assert_eq!(nodes.len(), 2, "one member per node: {nodes:?}");
    assert_eq!(assert_no_device_twice(&client).await, 4);
    let told = events_about(&client, "low-0").await;
    assert!(
        told.iter()
            .any(|e| e.contains("Preempted by PodGroup default/train")),
        "{told:?}"
    );
}
