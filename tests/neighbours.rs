//! dra-scheduler beside kube-scheduler on one real control plane, as platform teams run it:
//! the reference kube-scheduler v1.37.2 serves `default-scheduler`, dra-scheduler runs as
//! the chart's ServiceAccount with the chart's RBAC (and, in ownership mode, the chart's
//! device-ownership ValidatingAdmissionPolicy), and each round creates 20 one-GPU pods for
//! each scheduler at once on 8 nodes × 4 GPUs: 40 pods for 32 devices.
//!
//! - Ownership mode: no device is allocated to two claims; kube-scheduler's pods stay
//!   Pending with the policy's message in their events.
//! - Shared mode: every device that two claims hold is one dra-scheduler allocated first
//!   and kube-scheduler second (the claim informer's resourceVersions, seen by a watch of
//!   the test's own), and each is reported: the `dra_scheduler_doubled_devices` gauge,
//!   a `DoubledDevice` Warning on both pods naming the device and the other claim, and
//!   `kubectl dra claims` marking it.
//!
//! Each round's figures are printed.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;
use test_cluster::{TestCluster, eventually};

const ROUNDS: usize = 4;
const PODS_PER_SCHEDULER: usize = 20;
const NODES: usize = 8;
const GPUS_PER_NODE: usize = 4;
/// A round has settled once the bound pods and the claims' devices stay the same this long
/// (longer than both schedulers' longest backoff, 10 s).
const QUIET: Duration = Duration::from_secs(12);
const NS: &str = "default";

/// Who allocated a claim: the scheduler of the pod it is reserved for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum By {
    Dra,
    Kube,
}

/// One cluster with both schedulers and the chart's objects. Fields drop in order: the
/// watch and the scheduler stop before the cluster goes down.
struct Neighbours {
    watch: tokio::task::JoinHandle<()>,
    dra: Daemon,
    client: Client,
    cluster: TestCluster,
    /// resourceVersion at which each claim (by UID) was first seen allocated.
    allocated_at: Arc<Mutex<HashMap<String, u64>>>,
}

impl Drop for Neighbours {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

impl Neighbours {
    async fn start(ownership: bool) -> Neighbours {
        let cluster = TestCluster::dedicated();
        apply_fleet(&cluster, NODES, GPUS_PER_NODE);
        let mut show = vec!["templates/serviceaccount.yaml", "templates/rbac.yaml"];
        if ownership {
            show.push("templates/device-ownership-policy.yaml");
        }
        let mut helm = helm();
        helm.args(["template", "dra-scheduler"])
            .arg(repo().join("charts/dra-scheduler"))
            .args(["-n", "kube-system", "--kube-version", "1.37.2"])
            .args(["--set", &format!("ownership.enabled={ownership}")]);
        for template in show {
            helm.args(["--show-only", template]);
        }
        kubectl_apply_text(&cluster, "chart", &run(&mut helm).stdout);
        let token = run(cluster.kubectl().args([
            "create",
            "token",
            "dra-scheduler",
            "-n",
            "kube-system",
            "--duration",
            "1h",
        ]));
        let kubeconfig = cluster.dir().join("dra-scheduler-sa.kubeconfig");
        token_kubeconfig(
            cluster.kubeconfig_path(),
            String::from_utf8(token.stdout).unwrap().trim(),
            &kubeconfig,
        );
        let dra = start_scheduler_as(
            &kubeconfig,
            &[
                "--lease-namespace",
                "kube-system",
                "--lease-name",
                "dra-scheduler",
            ],
        );
        cluster
            .start_reference_scheduler("default-scheduler")
            .expect("start kube-scheduler");
        let client = cluster.client().await;
        eventually("dra-scheduler leads", 60, || async {
            (leader_of(&dra).await == Some(1.0)).then_some(())
        })
        .await;
        let allocated_at = Arc::new(Mutex::new(HashMap::new()));
        let watch = tokio::spawn(record_allocations(client.clone(), allocated_at.clone()));
        Neighbours {
            watch,
            dra,
            client,
            cluster,
            allocated_at,
        }
    }

    /// 20 pods for each scheduler, created at once, interleaved.
    async fn create_pods(&self, round: usize) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NS);
        let creates = (0..PODS_PER_SCHEDULER).flat_map(|i| {
            [("dra", "dra-scheduler"), ("kube", "default-scheduler")].map(|(who, scheduler)| {
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": format!("r{round}-{who}-{i}"), "labels": {"race": "yes"}},
                    "spec": {
                        "schedulerName": scheduler,
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                        "containers": [{"name": "c", "image": "busybox",
                            "resources": {"claims": [{"name": "gpu"}]}}],
                    },
                }))
                .unwrap();
                let pods = pods.clone();
                async move { pods.create(&PostParams::default(), &pod).await.unwrap() }
            })
        });
        futures::future::join_all(creates).await;
    }

    /// The pods and claims once nothing has changed for [`QUIET`].
    async fn settled(&self) -> (Vec<Pod>, Vec<ResourceClaim>) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NS);
        let claims: Api<ResourceClaim> = Api::namespaced(self.client.clone(), NS);
        let mut last = None;
        let mut since = Instant::now();
        let started = Instant::now();
        loop {
            let p = pods.list(&ListParams::default()).await.unwrap().items;
            let c = claims.list(&ListParams::default()).await.unwrap().items;
            let shape = (
                p.iter()
                    .map(|p| (name(&p.metadata), node_of(p).map(str::to_string)))
                    .collect::<BTreeSet<_>>(),
                c.iter()
                    .map(|c| (name(&c.metadata), devices(c)))
                    .collect::<BTreeSet<_>>(),
            );
            if last.as_ref() != Some(&shape) {
                last = Some(shape);
                since = Instant::now();
            } else if since.elapsed() >= QUIET && c.len() == 2 * PODS_PER_SCHEDULER {
                return (p, c);
            }
            assert!(
                started.elapsed() < Duration::from_secs(240),
                "the round did not settle in 240 s"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Delete the round's pods (no kubelet: at once) and wait until
    /// kube-controller-manager has deleted their claims.
    async fn clear(&self) {
        kubectl_ok(
            &self.cluster,
            &[
                "delete",
                "pods",
                "-n",
                NS,
                "-l",
                "race",
                "--grace-period=0",
                "--force",
                "--wait=false",
            ],
        );
        let claims: Api<ResourceClaim> = Api::namespaced(self.client.clone(), NS);
        eventually("the round's claims deleted", 120, || async {
            claims
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        })
        .await;
    }

    fn kubectl_dra_claims(&self) -> String {
        let out = run(Command::new(env!("CARGO_BIN_EXE_kubectl-dra"))
            .args(["--kubeconfig"])
            .arg(self.cluster.kubeconfig_path())
            .args(["claims", "-n", NS]));
        String::from_utf8(out.stdout).unwrap()
    }
}

/// Records the resourceVersion at which each claim was first seen with an allocation:
/// the revision its allocation was written at (the watch shows every change in order).
async fn record_allocations(client: Client, at: Arc<Mutex<HashMap<String, u64>>>) {
    let claims: Api<ResourceClaim> = Api::namespaced(client, NS);
    let mut events = watcher::watcher(claims, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        if let Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) = event
            && c.status.as_ref().is_some_and(|s| s.allocation.is_some())
        {
            let rv = c.metadata.resource_version.as_deref().unwrap_or("0");
            at.lock()
                .unwrap()
                .entry(c.metadata.uid.clone().unwrap_or_default())
                .or_insert_with(|| rv.parse().unwrap());
        }
    }
}

fn name(meta: &kube::api::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

fn by(claim: &ResourceClaim) -> Option<By> {
    let pod = claim.status.as_ref()?.reserved_for.as_ref()?.first()?;
    if pod.name.contains("-dra-") {
        Some(By::Dra)
    } else {
        Some(By::Kube)
    }
}

/// Devices (driver/pool/device) held by more than one claim, with those claims.
fn doubled(claims: &[ResourceClaim]) -> BTreeMap<String, Vec<&ResourceClaim>> {
    let mut holders: BTreeMap<String, Vec<&ResourceClaim>> = BTreeMap::new();
    for c in claims {
        for (_, device) in devices(c) {
            holders.entry(device).or_default().push(c);
        }
    }
    holders.retain(|_, claims| claims.len() > 1);
    holders
}

/// What one round ended with.
#[derive(Debug, Default)]
struct Round {
    bound: BTreeMap<By, usize>,
    devices_allocated: usize,
    doubled: usize,
    first_writer_conflicts: f64,
}

impl Round {
    fn of(pods: &[Pod], claims: &[ResourceClaim], conflicts: f64) -> Round {
        let mut round = Round {
            first_writer_conflicts: conflicts,
            ..Default::default()
        };
        for p in pods.iter().filter(|p| node_of(p).is_some()) {
            let who = if name(&p.metadata).contains("-dra-") {
                By::Dra
            } else {
                By::Kube
            };
            *round.bound.entry(who).or_default() += 1;
        }
        round.devices_allocated = claims
            .iter()
            .flat_map(devices)
            .map(|(_, d)| d)
            .collect::<BTreeSet<_>>()
            .len();
        round.doubled = doubled(claims).len();
        round
    }
}

async fn conflicts(dra: &Daemon) -> f64 {
    let text = scrape(&dra.metrics).await.unwrap_or_default();
    metric(&text, "dra_scheduler_first_writer_conflicts_total")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beside_kube_scheduler_in_ownership_mode_no_device_is_ever_doubled() {
    let n = Neighbours::start(true).await;
    let mut rounds = Vec::new();
    for round in 1..=ROUNDS {
        n.create_pods(round).await;
        let (pods, claims) = n.settled().await;
        let figures = Round::of(&pods, &claims, conflicts(&n.dra).await);
        eprintln!("ownership mode, round {round}: {figures:?}");
        assert_eq!(figures.doubled, 0, "{:?}", doubled(&claims).keys());
        assert_eq!(figures.bound.get(&By::Dra), Some(&PODS_PER_SCHEDULER));
        assert_eq!(
            figures.bound.get(&By::Kube),
            None,
            "kube-scheduler bound none"
        );
        assert!(
            claims.iter().all(|c| by(c) != Some(By::Kube)),
            "no claim allocated for a kube-scheduler pod"
        );
        let kube_pod = format!("r{round}-kube-0");
        let told = eventually("kube-scheduler's pod told why", 60, || async {
            events_about(&n.client, &kube_pod)
                .await
                .into_iter()
                .find(|e| e.contains("is allocated only by dra-scheduler here"))
        })
        .await;
        assert!(
            told.contains("set spec.schedulerName: dra-scheduler"),
            "{told}"
        );
        rounds.push(figures);
        n.clear().await;
    }
    eprintln!(
        "ownership mode: {} rounds of {} pods, doubled devices per round: {:?}",
        ROUNDS,
        2 * PODS_PER_SCHEDULER,
        rounds.iter().map(|r| r.doubled).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beside_kube_scheduler_in_shared_mode_the_first_writer_keeps_the_device_and_the_rest_is_reported()
 {
    let n = Neighbours::start(false).await;
    let mut rounds = Vec::new();
    for round in 1..=ROUNDS {
        n.create_pods(round).await;
        let (pods, claims) = n.settled().await;
        let figures = Round::of(&pods, &claims, conflicts(&n.dra).await);
        eprintln!("shared mode, round {round}: {figures:?}");
        let doubles = doubled(&claims);
        let at = n.allocated_at.lock().unwrap().clone();
        for (device, holders) in &doubles {
            let mut order: Vec<(u64, By, String)> = holders
                .iter()
                .map(|c| {
                    let uid = c.metadata.uid.clone().unwrap_or_default();
                    (at[&uid], by(c).unwrap(), name(&c.metadata))
                })
                .collect();
            order.sort();
            assert_eq!(
                order.iter().map(|(_, who, _)| *who).collect::<Vec<_>>(),
                [By::Dra, By::Kube],
                "{device}: dra-scheduler's write came first, kube-scheduler's second: {order:?}"
            );
            let (ours, theirs) = (&order[0].2, &order[1].2);
            for (claim, other) in [(ours, theirs), (theirs, ours)] {
                let pod = holders
                    .iter()
                    .find(|c| &name(&c.metadata) == claim)
                    .and_then(|c| c.status.as_ref()?.reserved_for.as_ref()?.first())
                    .map(|r| r.name.clone())
                    .unwrap();
                let device_name = device.rsplit('/').next().unwrap();
                eventually(&format!("a DoubledDevice event on {pod}"), 30, || async {
                    events_about(&n.client, &pod).await.into_iter().find(|e| {
                        e.starts_with("DoubledDevice")
                            && e.contains(device_name)
                            && e.contains(other.as_str())
                    })
                })
                .await;
            }
        }
        let gauge = eventually("the doubled-devices gauge", 30, || async {
            let text = scrape(&n.dra.metrics).await?;
            let value = metric(&text, "dra_scheduler_doubled_devices");
            (value == doubles.len() as f64).then_some(value)
        })
        .await;
        let table = n.kubectl_dra_claims();
        assert_eq!(
            table.matches("DOUBLED").count(),
            2 * doubles.len(),
            "kubectl dra claims marks both claims of each doubled device:\n{table}"
        );
        eprintln!(
            "shared mode, round {round}: gauge {gauge}, doubled devices {:?}",
            doubles.keys()
        );
        rounds.push(figures);
        n.clear().await;
    }
    eprintln!(
        "shared mode: {} rounds of {} pods; doubled devices per round (kube-scheduler wrote second each time): {:?}; allocations dra-scheduler gave up (kube-scheduler wrote first), cumulative: {:?}",
        ROUNDS,
        2 * PODS_PER_SCHEDULER,
        rounds.iter().map(|r| r.doubled).collect::<Vec<_>>(),
        rounds
            .iter()
            .map(|r| r.first_writer_conflicts)
            .collect::<Vec<_>>()
    );
}
