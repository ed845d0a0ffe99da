//! PodGroups in the live scheduler, on a real Kubernetes 1.37 control plane with the
//! workload-aware scheduling gates on (`scheduling.k8s.io/v1beta1` served): a gang is bound
//! whole or not at all, two gangs competing for the same GPUs never end up both half
//! placed, a kill -9 during a gang's writes leaves it whole after the restart, and the
//! PodGroup's `PodGroupInitiallyScheduled` condition says what happened.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use kube::Api;
use kube::api::ListParams;
use test_cluster::{TestCluster, eventually};

mod common;
use common::{
    apply_fleet, assert_claims_agree_with_pods, assert_no_device_twice, events_about,
    kubectl_apply_text, node_of, start_scheduler_with,
};

/// A template for two GPUs, and a gang PodGroup `name` of `pods` pods each using it
/// (`gpus` per pod), with `minCount` all of them.
fn gang(name: &str, pods: usize, gpus: usize) -> String {
    let mut text = format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {{name: {name}-gpus}}\n\
         spec:\n  spec:\n    devices:\n      requests:\n      - name: gpu\n        \
         exactly: {{deviceClassName: gpu.nvidia.com, count: {gpus}}}\n---\n\
         apiVersion: scheduling.k8s.io/v1beta1\nkind: PodGroup\nmetadata: {{name: {name}}}\n\
         spec:\n  schedulingPolicy:\n    gang: {{minCount: {pods}}}\n"
    );
    for i in 0..pods {
        text += &format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-{i}, labels: {{gang: {name}}}}}\n\
             spec:\n  schedulerName: dra-scheduler\n  schedulingGroup: {{podGroupName: {name}}}\n  \
             resourceClaims: [{{name: gpu, resourceClaimTemplateName: {name}-gpus}}]\n  \
             containers: [{{name: c, image: busybox, resources: {{claims: [{{name: gpu}}]}}}}]\n"
        );
    }
    text
}

/// Pods of gang `name`: how many are bound.
async fn bound_in(pods: &Api<Pod>, name: &str) -> usize {
    let list = pods
        .list(&ListParams::default().labels(&format!("gang={name}")))
        .await
        .unwrap()
        .items;
    list.iter().filter(|p| node_of(p).is_some()).count()
}

/// Claims of gang `name`'s pods that hold devices.
async fn allocated_in(claims: &Api<ResourceClaim>, name: &str) -> usize {
    let list = claims.list(&ListParams::default()).await.unwrap().items;
    list.iter()
        .filter(|c| {
            c.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(&format!("{name}-")))
        })
        .filter(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
        .count()
}

/// The PodGroup's `PodGroupInitiallyScheduled` condition, once it has one: (status,
/// reason, message).
async fn condition(groups: &Api<PodGroup>, name: &str) -> (String, String, String) {
    eventually(&format!("PodGroup {name}'s condition"), 60, || async {
        let group = groups.get(name).await.ok()?;
        let c = group
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodGroupInitiallyScheduled")?;
        Some((c.status, c.reason, c.message))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_of_four_pods_with_two_gpus_each_is_placed_whole_on_four_nodes() {
    let cluster = TestCluster::dedicated();
    let _daemon = start_scheduler_with(&cluster, &[]);
    apply_fleet(&cluster, 4, 2);
    kubectl_apply_text(&cluster, "gang", gang("train", 4, 2).as_bytes());
    let client = cluster.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    eventually("all 4 members bound", 90, || async {
        (bound_in(&pods, "train").await == 4).then_some(())
    })
    .await;
    let list = pods.list(&ListParams::default()).await.unwrap().items;
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for p in &list {
        *per_node.entry(node_of(p).unwrap().to_string()).or_default() += 1;
    }
    assert_eq!(per_node.len(), 4, "one member per node: {per_node:?}");
    assert_eq!(assert_no_device_twice(&client).await, 8);
    assert_eq!(assert_claims_agree_with_pods(&client, &list).await, 4);
    let groups: Api<PodGroup> = Api::namespaced(client.clone(), "default");
    let (status, reason, _) = condition(&groups, "train").await;
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Scheduled"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_one_gpu_short_binds_no_member_and_holds_no_device() {
    let cluster = TestCluster::dedicated();
    let _daemon = start_scheduler_with(&cluster, &[]);
    apply_fleet(&cluster, 4, 2);
    // Another pod takes one of the 8 GPUs first.
    kubectl_apply_text(&cluster, "blocker", gang("blocker", 1, 1).as_bytes());
    let client = cluster.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    eventually("the blocker bound", 60, || async {
        (bound_in(&pods, "blocker").await == 1).then_some(())
    })
    .await;
    kubectl_apply_text(&cluster, "gang", gang("train", 4, 2).as_bytes());
    let groups: Api<PodGroup> = Api::namespaced(client.clone(), "default");
    let (status, reason, message) = condition(&groups, "train").await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "Unschedulable")
    );
    assert!(
        message.contains("minCount (4) cannot be satisfied"),
        "the message says why: {message}"
    );
    // Every member is told the group's reason.
    let told = eventually("a FailedScheduling event on a member", 30, || async {
        let events = events_about(&client, "train-3").await;
        events.into_iter().find(|e| e.contains("minCount (4)"))
    })
    .await;
    eprintln!("train-3: {told}");
    // And it stays so: nothing bound, no device held, for a while.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    assert_eq!(bound_in(&pods, "train").await, 0);
    assert_eq!(allocated_in(&claims, "train").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gangs_competing_for_room_for_one_end_with_exactly_one_whole() {
    let cluster = TestCluster::dedicated();
    let _daemon = start_scheduler_with(&cluster, &[]);
    apply_fleet(&cluster, 4, 2);
    let both = gang("red", 4, 2) + "---\n" + &gang("blue", 4, 2);
    kubectl_apply_text(&cluster, "gangs", both.as_bytes());
    let client = cluster.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let winner = eventually("one gang bound whole", 90, || async {
        let (red, blue) = (bound_in(&pods, "red").await, bound_in(&pods, "blue").await);
        match (red, blue) {
            (4, _) => Some(("red", "blue")),
            (_, 4) => Some(("blue", "red")),
            _ => None,
        }
    })
    .await;
    let groups: Api<PodGroup> = Api::namespaced(client.clone(), "default");
    let (status, _, message) = condition(&groups, winner.1).await;
    assert_eq!(status, "False", "the other gang waits: {message}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(bound_in(&pods, winner.0).await, 4);
    assert_eq!(
        bound_in(&pods, winner.1).await,
        0,
        "{} is not half placed",
        winner.1
    );
    assert_eq!(allocated_in(&claims, winner.1).await, 0);
    assert_eq!(assert_no_device_twice(&client).await, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_scheduler_during_gangs_writes_leaves_every_gang_whole_after_restart() {
    let cluster = TestCluster::dedicated();
    apply_fleet(&cluster, 8, 2);
    // 4 gangs of 4 one-GPU pods: room for all 16.
    let names = ["g0", "g1", "g2", "g3"];
    let text: Vec<String> = names.iter().map(|n| gang(n, 4, 1)).collect();
    let client = cluster.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // One replica, no Lease to wait for after each restart; writes slowed down (about 12
    // per gang) so that kills land while gangs are being written.
    let args = [
        "--leader-elect=false",
        "--client-qps",
        "8",
        "--client-burst",
        "1",
    ];
    let mut daemon = start_scheduler_with(&cluster, &args);
    kubectl_apply_text(&cluster, "gangs", text.join("---\n").as_bytes());
    let mut seen = Vec::new();
    for delay_ms in [1500, 1100, 1900, 900, 1300, 1700, 1000] {
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        drop(daemon); // SIGKILL, mid-flight
        let mut bound = Vec::new();
        for n in names {
            bound.push(bound_in(&pods, n).await);
        }
        seen.push(bound);
        daemon = start_scheduler_with(&cluster, &args);
    }
    eprintln!("members bound per gang at each kill: {seen:?}");
    assert!(
        seen.iter()
            .any(|b| (1..16).contains(&b.iter().sum::<usize>())),
        "at least one kill happened while the gangs were being written: {seen:?}"
    );
    eventually("every gang whole", 120, || async {
        let mut all = 0;
        for n in names {
            all += bound_in(&pods, n).await;
        }
        (all == 16).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(daemon);
    let list = pods.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(list.iter().filter(|p| node_of(p).is_some()).count(), 16);
    assert_eq!(assert_no_device_twice(&client).await, 16);
    assert_eq!(assert_claims_agree_with_pods(&client, &list).await, 16);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_the_podgroup_is_made_once_reserved_for_the_group_and_shared_by_its_pods() {
    let cluster = TestCluster::dedicated();
    let _daemon = start_scheduler_with(&cluster, &[]);
    apply_fleet(&cluster, 2, 3);
    // Each pod has a GPU of its own and shares the group's "fabric" device, which
    // kube-controller-manager makes once, for the PodGroup, from the template.
    let mut text = gang("train", 2, 1).replace(
        "spec:\n  schedulingPolicy:",
        "spec:\n  resourceClaims: [{name: fabric, resourceClaimTemplateName: train-gpus}]\n  schedulingPolicy:",
    );
    text = text.replace(
        "resourceClaims: [{name: gpu, resourceClaimTemplateName: train-gpus}]",
        "resourceClaims: [{name: gpu, resourceClaimTemplateName: train-gpus}, {name: fabric, resourceClaimTemplateName: train-gpus}]",
    );
    kubectl_apply_text(&cluster, "gang", text.as_bytes());
    let client = cluster.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    eventually("both members bound", 90, || async {
        (bound_in(&pods, "train").await == 2).then_some(())
    })
    .await;
    let list = pods
        .list(&ListParams::default().labels("gang=train"))
        .await
        .unwrap()
        .items;
    assert_eq!(
        node_of(&list[0]),
        node_of(&list[1]),
        "the shared device holds both on one node"
    );
    let groups: Api<PodGroup> = Api::namespaced(client.clone(), "default");
    let group = groups.get("train").await.unwrap();
    let fabric = group
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .and_then(|s| s.iter().find(|s| s.name == "fabric"))
        .and_then(|s| s.resource_claim_name.clone())
        .expect("kube-controller-manager made the group's claim");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let claim = claims.get(&fabric).await.unwrap();
    let status = claim.status.unwrap();
    assert!(status.allocation.is_some());
    let reserved = status.reserved_for.unwrap();
    assert_eq!(reserved.len(), 1, "{reserved:?}");
    assert_eq!(
        (
            reserved[0].api_group.as_deref(),
            reserved[0].resource.as_str(),
            reserved[0].name.as_str()
        ),
        (Some("scheduling.k8s.io"), "podgroups", "train")
    );
    assert_eq!(Some(&reserved[0].uid), group.metadata.uid.as_ref());
    // 2 GPUs of the pods' own and the fabric device, each once.
    assert_eq!(assert_no_device_twice(&client).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_whose_members_are_not_all_created_waits_without_an_attempt() {
    let cluster = TestCluster::dedicated();
    let _daemon = start_scheduler_with(&cluster, &[]);
    apply_fleet(&cluster, 4, 2);
    // minCount 4, but only 3 pods exist at first.
    let text = gang("train", 4, 2);
    let (first, last) = text.rsplit_once("---\n").unwrap();
    kubectl_apply_text(&cluster, "three", first.as_bytes());
    let client = cluster.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(bound_in(&pods, "train").await, 0);
    for i in 0..3 {
        let events = events_about(&client, &format!("train-{i}")).await;
        assert!(events.is_empty(), "no attempt, so nothing told: {events:?}");
    }
    let groups: Api<PodGroup> = Api::namespaced(client.clone(), "default");
    let group = groups.get("train").await.unwrap();
    assert!(
        group
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .is_empty(),
        "no condition before an attempt"
    );
    // The fourth member arrives: the whole gang is placed.
    kubectl_apply_text(&cluster, "fourth", last.as_bytes());
    eventually("all 4 members bound", 90, || async {
        (bound_in(&pods, "train").await == 4).then_some(())
    })
    .await;
}
