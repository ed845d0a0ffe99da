//! The examples, applied to a real Kubernetes 1.37 control plane and scheduled by the real
//! kube-scheduler (serving `schedulerName: dra-scheduler`), against `simulate` on the same
//! manifests: every pod kube-scheduler places, simulate places too. And the allocations
//! simulate chooses are accepted by the real API server as claim status.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use dra_scheduler::simulate;
use dra_scheduler::simulate::manifests::{self, Object};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::{Api, Client};
use test_cluster::{TestCluster, server_message};

mod common;

const EXAMPLES: &[&str] = &[
    "first-available",
    "memory-selector",
    "shared-claim",
    "numa-aligned",
    "device-taints",
    "device-taint-rule",
    "extended-resource",
    "mig-partitionable",
    "derived-attributes",
    "compatibility-groups",
    "list-attributes",
    "node-allocatable-resources",
    "optional-node-operations",
];

/// The examples of 1.37's alpha DRA features, whose devices are compared too.
const ALPHA_EXAMPLES: &[&str] = &[
    "derived-attributes",
    "compatibility-groups",
    "list-attributes",
    "node-allocatable-resources",
    "optional-node-operations",
];

/// The test cluster runs with every DRA gate on, the alpha ones included: simulate too.
fn all_gates() -> dra_engine::Features {
    dra_engine::Features {
        list_type_attributes: true,
        derived_attributes: true,
        compatibility_groups: true,
        optional_node_operations: true,
        node_allocatable_resources: true,
        ..Default::default()
    }
}

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
}

/// Pods that are interchangeable for placement: the pods of one workload, or standalone
/// pods that ask for the same claims. Schedulers may break ties between such pods
/// differently (kube-scheduler orders pods created in the same second arbitrarily).
fn interchangeable(pod: &Pod) -> String {
    let claims: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .map(|c| {
            c.resource_claim_template_name
                .clone()
                .or(c.resource_claim_name.clone())
                .unwrap_or_default()
        })
        .collect();
    format!("pods using [{}]", claims.join(", "))
}

fn group_of_reference_pod(pod: &Pod) -> String {
    match pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
    {
        Some(o) if o.kind == "ReplicaSet" => o
            .name
            .rsplit_once('-')
            .map(|(d, _)| d.to_string())
            .unwrap_or(o.name.clone()),
        Some(o) => o.name.clone(),
        None => interchangeable(pod),
    }
}

/// simulate names workload pods `<workload>-<index>`.
fn group_of_simulated_pod(pod: &Pod, workloads: &[String]) -> String {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    workloads
        .iter()
        .find(|w| {
            name.strip_prefix(w.as_str())
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|i| i.chars().all(|c| c.is_ascii_digit()))
        })
        .cloned()
        .unwrap_or_else(|| interchangeable(pod))
}

fn kubectl_apply(cluster: &TestCluster, namespace: &str, object: &serde_json::Value) {
    use std::io::Write;
    let mut child = cluster
        .kubectl()
        .args(["apply", "-n", namespace, "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kubectl");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(object.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// How many pods a document makes.
fn pods_made_by(object: &Object) -> Option<usize> {
    let n = |r: Option<i32>| r.unwrap_or(1).max(0) as usize;
    match object {
        Object::Pod(_) => Some(1),
        Object::Deployment(d) => Some(n(d.spec.replicas)),
        Object::ReplicaSet(r) => Some(n(r.spec.replicas)),
        Object::StatefulSet(s) => Some(n(s.spec.replicas)),
        Object::ReplicationController(r) => Some(n(r.spec.as_ref().and_then(|s| s.replicas))),
        Object::Job(j) => {
            let spec = j.spec.clone().unwrap_or_default();
            let parallelism = n(spec.parallelism);
            Some(
                spec.completions
                    .map_or(parallelism, |c| parallelism.min(c.max(0) as usize)),
            )
        }
        _ => None,
    }
}

fn as_json(object: &Object) -> serde_json::Value {
    match object {
        Object::Namespace(o) => serde_json::to_value(o),
        Object::Node(o) => serde_json::to_value(o),
        Object::Pod(o) => serde_json::to_value(o),
        Object::Deployment(o) => serde_json::to_value(o),
        Object::ReplicaSet(o) => serde_json::to_value(o),
        Object::StatefulSet(o) => serde_json::to_value(o),
        Object::ReplicationController(o) => serde_json::to_value(o),
        Object::Job(o) => serde_json::to_value(o),
        Object::Service(o) => serde_json::to_value(o),
        Object::ResourceClaim(o) => serde_json::to_value(o),
        Object::ResourceClaimTemplate(o) => serde_json::to_value(o),
        Object::DeviceClass(o) => serde_json::to_value(o),
        Object::ResourceSlice(o) => serde_json::to_value(o),
        Object::DeviceTaintRule(o) => serde_json::to_value(o),
        Object::PriorityClass(o) => serde_json::to_value(o),
        Object::PersistentVolume(o) => serde_json::to_value(o),
        Object::PersistentVolumeClaim(o) => serde_json::to_value(o),
        Object::StorageClass(o) => serde_json::to_value(o),
        Object::CSINode(o) => serde_json::to_value(o),
        Object::PodDisruptionBudget(o) => serde_json::to_value(o),
        Object::CSIDriver(o) => serde_json::to_value(o),
        Object::VolumeAttachment(o) => serde_json::to_value(o),
        Object::Workload(o) => serde_json::to_value(o),
        Object::PodGroup(o) => serde_json::to_value(o),
    }
    .unwrap()
}

/// Apply an example the way simulate reads it: first everything that is not a workload
/// (ResourceClaims that come with a status get it written afterwards: the API server
/// drops status on create), then each workload in input order, waiting until
/// kube-scheduler has decided its pods. So both schedulers see pods in the same order;
/// otherwise the order in which kube-controller-manager creates claims decides which
/// contended pod kube-scheduler tries first.
async fn apply_in_order(
    cluster: &TestCluster,
    client: &Client,
    dir: &Path,
    namespace: &str,
) -> Vec<Pod> {
    let documents = manifests::load(&[dir.to_path_buf()])
        .expect("example loads")
        .objects;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
    for doc in documents
        .iter()
        .filter(|d| pods_made_by(&d.object).is_none())
    {
        kubectl_apply(cluster, namespace, &as_json(&doc.object));
        if let Object::ResourceClaim(claim) = &doc.object
            && claim.status.is_some()
        {
            let name = claim.metadata.name.clone().unwrap();
            let mut current = claims.get(&name).await.unwrap();
            current.status = claim.status.clone();
            claims
                .replace_status(&name, &PostParams::default(), &current)
                .await
                .unwrap_or_else(|e| panic!("status of claim {name}: {}", server_message(&e)));
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut expected = 0;
    let mut decided = Vec::new();
    for doc in &documents {
        let Some(n) = pods_made_by(&doc.object) else {
            continue;
        };
        kubectl_apply(cluster, namespace, &as_json(&doc.object));
        expected += n;
        decided = settle(&pods, expected).await;
    }
    decided
}

/// Wait until kube-scheduler has decided every pod (bound, or PodScheduled=False), then a
/// little longer for pods that were retried.
async fn settle(pods: &Api<Pod>, expected: usize) -> Vec<Pod> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        let decided = list
            .iter()
            .filter(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
                    || p.status
                        .iter()
                        .flat_map(|s| s.conditions.iter().flatten())
                        .any(|c| c.type_ == "PodScheduled" && c.status == "False")
            })
            .count();
        if list.len() >= expected && decided == list.len() {
            tokio::time::sleep(Duration::from_secs(3)).await;
            return pods.list(&ListParams::default()).await.unwrap().items;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "kube-scheduler did not decide all {expected} pods in 180s ({decided} of {} decided)",
            list.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The examples in two halves, one test each, so that two run at once (each example has a
/// control plane of its own, mostly waited on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_scheduler_and_simulate_place_the_same_pods() {
    compare_with_kube_scheduler(&EXAMPLES[..EXAMPLES.len() / 2]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_scheduler_and_simulate_place_the_same_pods_second_half() {
    compare_with_kube_scheduler(&EXAMPLES[EXAMPLES.len() / 2..]).await;
}

/// REFERENCE_EXAMPLES=a,b runs only those examples (for debugging one of them).
fn selected(name: &str) -> bool {
    std::env::var("REFERENCE_EXAMPLES")
        .map(|only| only.split(',').any(|x| x == name))
        .unwrap_or(true)
}

async fn compare_with_kube_scheduler(examples: &[&str]) {
    let mut report = Vec::new();
    for name in examples.iter().filter(|name| selected(name)) {
        eprintln!("example {name}");
        // Each example has its own cluster: examples reuse node and class names.
        let cluster = TestCluster::dedicated();
        cluster
            .start_reference_scheduler("dra-scheduler")
            .expect("kube-scheduler starts");
        let client = cluster.client().await;
        let dir = example(name);
        let reference = apply_in_order(&cluster, &client, &dir, "default").await;

        let sim = simulate::simulate(
            &simulate::Options {
                scheduler_name: "dra-scheduler".into(),
                all_schedulers: false,
                features: all_gates(),
                ..Default::default()
            },
            simulate::load(std::slice::from_ref(&dir)).unwrap(),
        );
        assert_eq!(
            reference.len(),
            sim.pods.len(),
            "example {name}: pods in the cluster"
        );

        let mut placed_by_reference: BTreeMap<String, usize> = BTreeMap::new();
        for pod in &reference {
            if pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some()
            {
                *placed_by_reference
                    .entry(group_of_reference_pod(pod))
                    .or_default() += 1;
            }
        }
        let workloads: Vec<String> = reference
            .iter()
            .filter(|p| p.metadata.owner_references.is_some())
            .map(group_of_reference_pod)
            .collect();
        let mut placed_by_simulate: BTreeMap<String, usize> = BTreeMap::new();
        for (key, _) in &sim.pods {
            let pod = &sim.engine.state().pods[key];
            if pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some()
            {
                *placed_by_simulate
                    .entry(group_of_simulated_pod(pod, &workloads))
                    .or_default() += 1;
            }
        }
        for (workload, n) in &placed_by_reference {
            let ours = placed_by_simulate.get(workload).copied().unwrap_or(0);
            assert!(
                ours >= *n,
                "example {name}: kube-scheduler placed {n} pod(s) of {workload}, simulate {ours}\n\
                 reference: {placed_by_reference:?}\nsimulate: {placed_by_simulate:?}"
            );
        }
        report.push(format!(
            "{name}: kube-scheduler {placed_by_reference:?}, simulate {placed_by_simulate:?}"
        ));

        // The alpha examples' point is which devices: the same as kube-scheduler's.
        if ALPHA_EXAMPLES.contains(name) {
            let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
            let theirs = claims.list(&ListParams::default()).await.unwrap().items;
            assert_eq!(
                allocated_devices(theirs.iter()),
                allocated_devices(sim.engine.state().claims.values().map(|c| &**c)),
                "example {name}: kube-scheduler's devices vs simulate's"
            );
            // And what the devices map of the nodes' resources, in the pods' status
            // (DRANodeAllocatableResources), with the same pods placed.
            assert!(
                *name != "node-allocatable-resources"
                    || !node_allocatable(reference.iter()).is_empty(),
                "example {name}: kube-scheduler wrote no nodeAllocatableResourceClaimStatuses"
            );
            assert_eq!(
                node_allocatable(reference.iter()),
                node_allocatable(simulated_pods(&sim)),
                "example {name}: kube-scheduler's nodeAllocatableResourceClaimStatuses vs simulate's"
            );
            assert_eq!(
                placed_by_reference, placed_by_simulate,
                "example {name}: pods placed"
            );
        }
        // simulate's allocations are valid claim status for the real API server.
        common::api_server_accepts_allocations(&cluster, &sim, name).await;
        drop(cluster);
    }
    println!("{}", report.join("\n"));
}

/// The examples the issue names for the live daemon, plus the taint and partitionable ones.
const LIVE_EXAMPLES: &[&str] = &[
    "numa-aligned",
    "extended-resource",
    "device-taint-rule",
    "mig-partitionable",
];

fn simulated_pods(sim: &simulate::Simulation) -> impl Iterator<Item = &Pod> {
    sim.pods
        .iter()
        .map(|(key, _)| &*sim.engine.state().pods[key])
}

/// Each placed pod's `status.nodeAllocatableResourceClaimStatuses` without the claim names
/// (generated names differ between runs) and with quantities in nanos (the API server
/// writes them in canonical form); sorted.
fn node_allocatable<'a>(pods: impl Iterator<Item = &'a Pod>) -> Vec<serde_json::Value> {
    fn canonical(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                map.remove("resourceClaimName");
                for (key, value) in map.iter_mut() {
                    if let ("quantity" | "perPod" | "perContainer", Some(q)) =
                        (key.as_str(), value.as_str())
                    {
                        let q: dra_cel::Quantity = q.parse().expect("a quantity");
                        *value = q.nanos().to_string().into();
                    } else {
                        canonical(value);
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(canonical),
            _ => {}
        }
    }
    let mut all: Vec<serde_json::Value> = pods
        .filter_map(|p| {
            p.status
                .as_ref()?
                .node_allocatable_resource_claim_statuses
                .as_ref()
        })
        .filter(|s| !s.is_empty())
        .map(|s| {
            let mut v = serde_json::to_value(s).unwrap();
            canonical(&mut v);
            v
        })
        .collect();
    all.sort_by_key(|v| v.to_string());
    all
}

/// Allocated devices per claim, each claim's list sorted, the claims sorted.
fn allocated_devices<'a>(claims: impl Iterator<Item = &'a ResourceClaim>) -> Vec<Vec<String>> {
    let mut all: Vec<Vec<String>> = claims
        .filter_map(|c| c.status.as_ref()?.allocation.as_ref())
        .map(|a| {
            let mut devices: Vec<String> = a
                .devices
                .iter()
                .flat_map(|d| d.results.iter().flatten())
                .map(|r| format!("{} {}/{}/{}", r.request, r.driver, r.pool, r.device))
                .collect();
            devices.sort();
            devices
        })
        .collect();
    all.sort();
    all
}

/// `dra-scheduler run` against the real control plane places the examples' pods exactly as
/// `simulate` does, on the same devices: claims generated by the real
/// kube-controller-manager, status written by the daemon and accepted by the API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_scheduler_run_places_like_simulate() {
    run_like_simulate(LIVE_EXAMPLES, &[], dra_engine::Features::default()).await;
}

/// The alpha examples by the live daemon with the alpha gates on (`featureGates:` in its
/// config), on the same devices as simulate, which are kube-scheduler's (above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_scheduler_run_with_the_alpha_gates_places_like_simulate() {
    let config = example("alpha-gates.yaml");
    let config = config.to_str().unwrap();
    run_like_simulate(ALPHA_EXAMPLES, &["--config", config], all_gates()).await;
}

async fn run_like_simulate(examples: &[&str], extra: &[&str], features: dra_engine::Features) {
    for name in examples.iter().filter(|name| selected(name)) {
        eprintln!("example {name}");
        let cluster = TestCluster::dedicated();
        // Killed when dropped, also when an assertion below fails.
        let args: Vec<&str> = ["--leader-elect=false"]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        let _daemon = common::start_scheduler_with(&cluster, &args);
        let client = cluster.client().await;
        let dir = example(name);
        let live = apply_in_order(&cluster, &client, &dir, "default").await;
        let sim = simulate::simulate(
            &simulate::Options {
                scheduler_name: "dra-scheduler".into(),
                all_schedulers: false,
                features: features.clone(),
                ..Default::default()
            },
            simulate::load(std::slice::from_ref(&dir)).unwrap(),
        );
        let live_nodes: Vec<Option<String>> = {
            let mut v: Vec<_> = live
                .iter()
                .map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
                .collect();
            v.sort();
            v
        };
        let sim_nodes: Vec<Option<String>> = {
            let mut v: Vec<_> = sim
                .pods
                .iter()
                .map(|(key, _)| {
                    let pod = &sim.engine.state().pods[key];
                    pod.spec.as_ref().and_then(|s| s.node_name.clone())
                })
                .collect();
            v.sort();
            v
        };
        assert_eq!(live_nodes, sim_nodes, "example {name}: nodes of the pods");
        let claims = Api::<ResourceClaim>::namespaced(client.clone(), "default")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let live_devices = allocated_devices(claims.iter());
        assert!(
            !live_devices.is_empty(),
            "example {name}: devices allocated"
        );
        assert_eq!(
            live_devices,
            allocated_devices(sim.engine.state().claims.values().map(|c| &**c)),
            "example {name}: devices chosen by the daemon and by simulate"
        );
        // The pods' nodeAllocatableResourceClaimStatuses as the daemon wrote them (and the
        // API server took them) are simulate's.
        assert_eq!(
            node_allocatable(live.iter()),
            node_allocatable(simulated_pods(&sim)),
            "example {name}: nodeAllocatableResourceClaimStatuses written by the daemon and by simulate"
        );
        drop(cluster);
    }
}

#[test]
fn simulated_pods_map_back_to_their_workload() {
    let pod = |name: &str| Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let workloads = vec!["inference".to_string(), "sweep".to_string()];
    assert_eq!(
        group_of_simulated_pod(&pod("inference-1"), &workloads),
        "inference"
    );
    assert_eq!(
        group_of_simulated_pod(&pod("inference-extra"), &workloads),
        "pods using []"
    );
}

/// A device-plugin era pod with init, sidecar and regular containers asking for
/// `nvidia.com/gpu`: the claim kube-scheduler makes for it (requests, counts, classes) and
/// the container-to-request mappings it writes to the pod's status are the reference for
/// what `dra-scheduler` builds for the same pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_resource_claims_are_built_like_kube_schedulers() {
    use dra_engine::extended;
    use k8s_openapi::api::resource::v1::DeviceClass;

    let cluster = TestCluster::dedicated();
    cluster
        .start_reference_scheduler("dra-scheduler")
        .expect("kube-scheduler starts");
    let out = cluster
        .kubectl()
        .args(["apply", "-f"])
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/extended-multi"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let client = cluster.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = test_cluster::eventually("kube-scheduler binds the pod", 120, || async {
        let pod = pods.get("multi").await.ok()?;
        pod.spec.as_ref()?.node_name.as_ref()?;
        Some(pod)
    })
    .await;
    let status = pod
        .status
        .clone()
        .unwrap()
        .extended_resource_claim_status
        .expect("kube-scheduler wrote extendedResourceClaimStatus");
    let theirs = Api::<ResourceClaim>::namespaced(client.clone(), "default")
        .get(&status.resource_claim_name)
        .await
        .unwrap();
    let requests = |claim: ResourceClaim| -> Vec<(String, String, Option<i64>)> {
        claim
            .spec
            .unwrap()
            .devices
            .unwrap()
            .requests
            .unwrap()
            .into_iter()
            .map(|r| {
                let e = r.exactly.unwrap();
                (r.name, e.device_class_name, e.count)
            })
            .collect()
    };
    let classes = Api::<DeviceClass>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let needs = dra_engine::resources::pod_requests(&pod).unwrap();
    let served = extended::requests_served_by_dra(&needs, &classes);
    let (ours, our_mappings) = extended::claim_for(&pod, &served.iter().collect::<Vec<_>>());
    let theirs = requests(theirs);
    eprintln!("kube-scheduler's requests: {theirs:?}");
    assert_eq!(requests(ours), theirs, "the claim's requests");
    assert_eq!(
        our_mappings, status.request_mappings,
        "container to request mappings"
    );
}
