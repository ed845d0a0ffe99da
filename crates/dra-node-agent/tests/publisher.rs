//! The publisher against a real kube-apiserver 1.37: slices from the shipped profiles are
//! accepted by the server's validation, read back with the right attributes, and repaired
//! when edited or deleted; a GPU taken out of the profile disappears; a health event
//! becomes a taint.

mod common;

use common::*;
use dra_node_agent::backend::GpuBackend;
use dra_node_agent::backend::fake::{FakeBackend, Profile};
use dra_node_agent::health::{HealthEvent, HealthState};
use dra_node_agent::publisher::{Publisher, PublisherConfig, SyncOutcome};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use test_cluster::{TestCluster, eventually};

fn publisher(client: kube::Client, node: &str, backend: FakeBackend) -> Publisher {
    Publisher::new(
        client,
        PublisherConfig {
            driver: DRIVER.into(),
            node_name: node.into(),
            rediscover_every: Duration::from_millis(500),
        },
        Arc::new(backend),
        Arc::new(RwLock::new(Vec::new())),
        HealthState::new([13, 31, 43, 45, 68, 109]),
    )
}

#[tokio::test]
async fn h100_profile_is_published_read_back_and_kept_true() {
    let cluster = TestCluster::shared();
    let client = cluster.client().await;
    let node = unique("h100");
    let node_uid = create_node(&client, &node).await;

    let dir = tempfile::tempdir().unwrap();
    let profile_path = dir.path().join("profile.yaml");
    std::fs::copy(profile("8x-h100-80gb-2numa-2nic.yaml"), &profile_path).unwrap();
    let backend = FakeBackend::from_file(&profile_path).unwrap();
    let mut p = publisher(client.clone(), &node, backend.clone());

    let first = p.sync_once().await.expect("first sync");
    assert_eq!(
        first,
        SyncOutcome::Written {
            generation: 1,
            created: 1,
            updated: 0,
            deleted: 0
        }
    );
    // What the server returned is what we meant: a second pass writes nothing.
    assert_eq!(
        p.sync_once().await.unwrap(),
        SyncOutcome::InSync { generation: 1 }
    );

    let got = slices(&client, &node).await;
    assert_eq!(got.len(), 1);
    let s = &got[0];
    assert_eq!(s.spec.pool.name, node);
    assert_eq!(s.spec.pool.generation, 1);
    assert_eq!(s.spec.pool.resource_slice_count, 1);
    let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Node", node_uid.as_str())
    );
    let ds = devices(&got);
    assert_eq!(ds.len(), 8);
    let g6 = ds.iter().find(|d| d.name == "gpu-6").unwrap();
    let attrs = g6.attributes.as_ref().unwrap();
    assert_eq!(string_attr(g6, "type").as_deref(), Some("gpu"));
    assert_eq!(
        string_attr(g6, "productName").as_deref(),
        Some("NVIDIA H100 80GB HBM3")
    );
    assert_eq!(
        string_attr(g6, "uuid").as_deref(),
        Some("GPU-4f6c1d2e-h100-0000-0000-000000000006")
    );
    assert_eq!(attrs["driverVersion"].version.as_deref(), Some("550.54.15"));
    assert_eq!(
        attrs["cudaComputeCapability"].version.as_deref(),
        Some("9.0.0")
    );
    assert_eq!(attrs["resource.kubernetes.io/numaNode"].int, Some(1));
    assert_eq!(
        string_attr(g6, "resource.kubernetes.io/pcieRoot").as_deref(),
        Some("pci0000:b7")
    );
    assert_eq!(
        string_attr(g6, "resource.kubernetes.io/pciBusID").as_deref(),
        Some("0000:ba:00.0")
    );
    assert_eq!(g6.capacity.as_ref().unwrap()["memory"].value.0, "80Gi");

    // From here on the loop runs, as in the agent.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    backend.watch_health(tx).unwrap();
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(p.run(rx, async move {
        let _ = stop_rx.wait_for(|s| *s).await;
    }));
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let name = format!("{node}-{DRIVER}-0");

    // A deleted slice is put back, at a newer generation.
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    let back = eventually("the deleted slice to come back", 30, || async {
        let s = slices(&client, &node).await;
        (s.len() == 1 && s[0].spec.pool.generation > 1).then(|| s[0].clone())
    })
    .await;
    assert_eq!(devices(std::slice::from_ref(&back)).len(), 8);

    // An edited slice is repaired.
    let mut edited = back.clone();
    let d0 = &mut edited.spec.devices.as_mut().unwrap()[0];
    d0.attributes
        .as_mut()
        .unwrap()
        .get_mut("productName")
        .unwrap()
        .string = Some("tampered".into());
    api.replace(&name, &PostParams::default(), &edited)
        .await
        .unwrap();
    eventually("the edited slice to be repaired", 30, || async {
        let s = slices(&client, &node).await;
        let d = devices(&s);
        (d.len() == 8
            && string_attr(&d[0], "productName").as_deref() == Some("NVIDIA H100 80GB HBM3")
            && s[0].spec.pool.generation > back.spec.pool.generation)
            .then_some(())
    })
    .await;

    // A GPU taken out of the profile disappears from the slice.
    let mut prof = Profile::load(&profile_path).unwrap();
    prof.gpus.retain(|g| g.minor != 7);
    let yaml = serde_yaml::to_string(&serde_json::json!({ "gpus": prof.gpus })).unwrap();
    std::fs::write(&profile_path, yaml).unwrap();
    eventually("gpu-7 to vanish", 30, || async {
        let d = devices(&slices(&client, &node).await);
        (d.len() == 7 && d.iter().all(|d| d.name != "gpu-7")).then_some(())
    })
    .await;

    // A critical XID taints the GPU; an application XID does not.
    backend.inject(HealthEvent::Xid { minor: 3, xid: 13 });
    backend.inject(HealthEvent::Xid { minor: 2, xid: 79 });
    let tainted = eventually("gpu-2 to be tainted", 30, || async {
        let d = devices(&slices(&client, &node).await);
        d.into_iter()
            .find(|d| d.name == "gpu-2" && d.taints.is_some())
    })
    .await;
    let t = &tainted.taints.unwrap()[0];
    assert_eq!(
        (t.key.as_str(), t.value.as_deref(), t.effect.as_str()),
        ("gpu.nvidia.com/xid", Some("79"), "NoSchedule")
    );
    let d = devices(&slices(&client, &node).await);
    assert!(
        d.iter()
            .find(|d| d.name == "gpu-3")
            .unwrap()
            .taints
            .is_none()
    );

    // With taints (timeAdded set by us) the pool is stable: several resync ticks later
    // the generation has not moved.
    let gen_before = slices(&client, &node).await[0].spec.pool.generation;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        slices(&client, &node).await[0].spec.pool.generation,
        gen_before
    );

    // A lost GPU is NoExecute.
    backend.inject(HealthEvent::Lost { minor: 0 });
    eventually("gpu-0 to be NoExecute", 30, || async {
        let d = devices(&slices(&client, &node).await);
        d.into_iter()
            .find(|d| d.name == "gpu-0")
            .and_then(|d| d.taints)
            .filter(|t| {
                t.iter()
                    .any(|t| t.effect == "NoExecute" && t.key == "gpu.nvidia.com/lost")
            })
    })
    .await;

    stop_tx.send(true).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn mig_profile_with_shared_counters_is_accepted() {
    let cluster = TestCluster::shared();
    let client = cluster.client().await;
    let node = unique("a100");
    create_node(&client, &node).await;
    let backend = FakeBackend::from_file(profile("4x-a100-40gb-mig.yaml")).unwrap();
    let mut p = publisher(client.clone(), &node, backend);
    let out = p
        .sync_once()
        .await
        .expect("the server accepts partitionable devices");
    assert!(
        matches!(out, SyncOutcome::Written { created: 2, .. }),
        "{out:?}"
    );
    assert_eq!(
        p.sync_once().await.unwrap(),
        SyncOutcome::InSync { generation: 1 }
    );

    let got = slices(&client, &node).await;
    assert_eq!(got.len(), 2);
    let ds = devices(&got);
    assert_eq!(ds.len(), 60);
    let counters = got
        .iter()
        .find_map(|s| s.spec.shared_counters.clone())
        .expect("a counter slice");
    assert_eq!(counters.len(), 4);
    assert_eq!(counters[3].name, "gpu-3-counter-set");
    assert_eq!(counters[3].counters["memory-slice-0"].value.0, "1");
    let mig = ds
        .iter()
        .find(|d| d.name == "gpu-3-mig-2g10gb-14-4")
        .unwrap();
    assert_eq!(string_attr(mig, "type").as_deref(), Some("mig"));
    assert_eq!(string_attr(mig, "profile").as_deref(), Some("2g.10gb"));
    let used = &mig.consumes_counters.as_ref().unwrap()[0];
    assert_eq!(used.counter_set, "gpu-3-counter-set");
    assert!(used.counters.contains_key("memory-slice-5"));
    assert!(!used.counters.contains_key("memory-slice-6"));
}

#[tokio::test]
async fn mixed_profile_and_a_split_pool_are_accepted() {
    let cluster = TestCluster::shared();
    let client = cluster.client().await;

    let node = unique("mixed");
    create_node(&client, &node).await;
    let backend = FakeBackend::from_file(profile("1x-a5000-2x-t10.yaml")).unwrap();
    let mut p = publisher(client.clone(), &node, backend);
    p.sync_once().await.unwrap();
    let ds = devices(&slices(&client, &node).await);
    let names: Vec<_> = ds
        .iter()
        .filter_map(|d| string_attr(d, "productName"))
        .collect();
    assert_eq!(names, ["NVIDIA RTX A5000", "NVIDIA T10", "NVIDIA T10"]);
    assert!(
        !ds[1]
            .attributes
            .as_ref()
            .unwrap()
            .contains_key("resource.kubernetes.io/numaNode")
    );

    // 150 GPUs: more than one slice may hold.
    let node = unique("big");
    create_node(&client, &node).await;
    let mut prof = Profile::load(&profile("1x-a5000-2x-t10.yaml")).unwrap();
    let template = prof.gpus[0].clone();
    prof.gpus = (0..150)
        .map(|i| dra_node_agent::device::Gpu {
            minor: i,
            uuid: format!("GPU-{i}"),
            ..template.clone()
        })
        .collect();
    let mut p = publisher(client.clone(), &node, FakeBackend::from_profile(prof));
    p.sync_once().await.unwrap();
    let got = slices(&client, &node).await;
    let sizes: Vec<_> = got
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, |d| d.len()))
        .collect();
    assert_eq!(sizes, [128, 22]);
    assert!(got.iter().all(|s| s.spec.pool.resource_slice_count == 2));
}
