//! One measured run: a fresh control plane, a workload's objects, one of the three runners
//! (kube-scheduler, `dra-scheduler run`, or the write ceiling), the measured pods, and
//! what it cost: pods/s, creation-to-binding latencies, the scheduler's CPU time and peak
//! RSS, and the API server's requests.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Binding, Namespace, Node, ObjectReference, Pod, ServiceAccount};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use test_cluster::TestCluster;
use tokio::sync::mpsc;

use crate::common;
use crate::workload::{self, Arrival, Plan, Refill, Workload};

/// The schedulerName of every measured pod, served by whichever scheduler runs.
pub const SCHEDULER: &str = "dra-scheduler";
/// Requests in flight from the harness: creating objects, and the ceiling's writes.
const CONCURRENCY: usize = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Runner {
    KubeScheduler,
    DraScheduler,
    /// No scheduler: the harness writes what `dra-scheduler run` writes for each pod
    /// (the claim's finalizer, its status with allocation and reservedFor, the Binding, the
    /// Scheduled event) with allocations chosen in advance, as fast as the API server takes them.
    Ceiling,
}

impl Runner {
    pub const ALL: [Runner; 3] = [Runner::KubeScheduler, Runner::DraScheduler, Runner::Ceiling];

    pub fn name(self) -> &'static str {
        match self {
            Runner::KubeScheduler => "kube-scheduler",
            Runner::DraScheduler => "dra-scheduler",
            Runner::Ceiling => "write ceiling",
        }
    }

    pub fn parse(s: &str) -> Option<Runner> {
        match s {
            "kube-scheduler" | "kube" => Some(Runner::KubeScheduler),
            "dra-scheduler" | "dra" | "ours" => Some(Runner::DraScheduler),
            "ceiling" => Some(Runner::Ceiling),
            _ => None,
        }
    }
}

/// API server requests in the measured window, from its `apiserver_request_total`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Requests {
    pub reads: f64,
    pub writes: f64,
    /// "VERB resource[/subresource]" → count.
    pub by_kind: BTreeMap<String, f64>,
    /// Writes' "VERB resource[/subresource]" → the API server's mean time for one, ms.
    pub server_ms: BTreeMap<String, f64>,
    /// What the API server sent to watchers, and the watchers it closed because they did
    /// not take their events in time (each such close holds up the delivery of that
    /// resource's events to every watcher for up to the watch cache's dispatch budget):
    /// "what: resource" → count.
    pub watch: BTreeMap<String, f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub runner: Runner,
    pub workload: Workload,
    /// Which of the workload's rounds (`E2E_ROUNDS`) this run was, from 1.
    pub round: usize,
    /// Measured pods bound (in SteadyState, within the window).
    pub pods: usize,
    /// Pods the run waited for (a burst's size; SteadyState: 0).
    pub expected: usize,
    /// From the first measured pod's creation to the last binding (SteadyState: the window).
    pub seconds: f64,
    /// Creation to binding of each bound pod, seconds, sorted.
    pub latencies: Vec<f64>,
    /// The two parts of each bound pod's latency, seconds, each sorted: creation to the
    /// harness's watch seeing the pod's claim named in its status (kube-controller-manager
    /// made it from the template: the same work for every runner), and from there to
    /// binding (what the scheduler, or the write ceiling, adds).
    pub to_claim: Vec<f64>,
    pub claim_to_bound: Vec<f64>,
    /// Seconds since the start at which each pod was seen bound, sorted.
    pub curve: Vec<f64>,
    /// The scheduler process's CPU seconds (user + system) in the measured window.
    pub cpu_s: Option<f64>,
    /// Its peak resident set (VmHWM), MiB.
    pub rss_mib: Option<f64>,
    pub requests: Requests,
    /// Lines from dra-scheduler's own metrics about where the time went.
    pub notes: Vec<String>,
}

impl Outcome {
    pub fn pods_per_s(&self) -> f64 {
        self.pods as f64 / self.seconds.max(1e-9)
    }

    pub fn quantile(&self, q: f64) -> Option<f64> {
        quantile(&self.latencies, q)
    }

    pub fn complete(&self) -> bool {
        self.pods >= self.expected
    }
}

/// The `q` quantile of `sorted`.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    (n > 0).then(|| sorted[((n as f64 * q).ceil() as usize).clamp(1, n) - 1])
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// Knobs every run shares.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Client QPS and burst of both schedulers and of kube-controller-manager.
    pub qps: u32,
    /// Longest a run waits for its pods.
    pub timeout: Duration,
    /// Pods the write ceiling writes for at once.
    pub ceiling_concurrency: usize,
    /// Where the schedulers' metrics and the API server's request counts go.
    pub report_dir: std::path::PathBuf,
}

pub async fn run(plan: &Plan, runner: Runner, round: usize, settings: &Settings) -> Outcome {
    let cluster = TestCluster::dedicated_with_controller_budget(settings.qps, settings.qps);
    let client = cluster.client().await;
    setup(&client, plan).await;

    let qps = settings.qps.to_string();
    let mut daemon = None;
    let mut oracle = None;
    let write_times = WriteTimes::default();
    let pid = match runner {
        Runner::KubeScheduler => {
            cluster
                .start_reference_scheduler_with_budget(SCHEDULER, settings.qps, settings.qps)
                .expect("kube-scheduler starts");
            let pid = cluster.pid("kube-scheduler").expect("kube-scheduler runs");
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            assert_eq!(
                comm.trim(),
                "kube-scheduler",
                "pid {pid} is kube-scheduler itself"
            );
            // It has no port to ask whether its informers are synced (cluster.sh starts it
            // with --secure-port 0); listing a few thousand objects on loopback takes well
            // under this.
            tokio::time::sleep(Duration::from_secs(5)).await;
            Some(pid)
        }
        Runner::DraScheduler => {
            let d = common::start_scheduler_with(
                &cluster,
                &[
                    "--leader-elect=false",
                    "--client-qps",
                    &qps,
                    "--client-burst",
                    &qps,
                ],
            );
            let pid = d.child.id();
            test_cluster::eventually("dra-scheduler ready", 60, || async {
                matches!(common::get(&d.metrics, "/readyz"), Some((200, _))).then_some(())
            })
            .await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            daemon = Some(d);
            Some(pid)
        }
        Runner::Ceiling => {
            oracle = Some(tokio::spawn(ceiling(
                client.clone(),
                *plan,
                settings.ceiling_concurrency,
                write_times.clone(),
            )));
            None
        }
    };

    let cpu_before = pid.and_then(cpu_seconds);
    let requests_before = api_requests(&cluster);
    let trace = match plan.arrival {
        Arrival::Burst { pods } => burst(&client, pods, settings.timeout).await,
        Arrival::Steady {
            pending,
            seconds,
            refill: Refill::Batch,
        } => steady_batches(&client, pending, seconds).await,
        Arrival::Steady {
            pending,
            seconds,
            refill: Refill::EachPod,
        } => steady_each_pod(&client, pending, seconds).await,
    };
    let requests_after = api_requests(&cluster);
    let cpu_after = pid.and_then(cpu_seconds);
    let rss_mib = pid.and_then(peak_rss_mib);
    if let Some(oracle) = oracle {
        oracle.abort();
    }

    let requests = requests_after.since(&requests_before);
    let tag = format!(
        "{}-{}{}",
        plan.workload.key(),
        runner.name().replace(' ', "-"),
        if round > 1 {
            format!("-{round}")
        } else {
            String::new()
        }
    );
    let dir = &settings.report_dir;
    let _ = std::fs::create_dir_all(dir);
    let by_kind: String = requests
        .by_kind
        .iter()
        .map(|(k, v)| match requests.server_ms.get(k) {
            Some(ms) => format!("{v:>8} {k} ({ms:.1} ms each in the API server)\n"),
            None => format!("{v:>8} {k}\n"),
        })
        .chain(requests.watch.iter().map(|(k, v)| format!("{v:>8} {k}\n")))
        .collect();
    let _ = std::fs::write(dir.join(format!("{tag}.apiserver-requests.txt")), by_kind);
    let mut notes = Vec::new();
    if let Some(d) = &daemon
        && let Some(text) = common::scrape(&d.metrics).await
    {
        let _ = std::fs::write(dir.join(format!("{tag}.metrics.txt")), &text);
        notes = where_the_time_went(&text);
    }
    if runner == Runner::Ceiling {
        notes = write_times.lines();
    }
    drop(daemon);
    drop(cluster);

    let expected = match plan.arrival {
        Arrival::Burst { pods } => pods,
        Arrival::Steady { .. } => 0,
    };
    let between = |from: &HashMap<String, Instant>, to: &HashMap<String, Instant>| {
        sorted(
            trace
                .bound
                .keys()
                .filter_map(|name| Some((*to.get(name)? - *from.get(name)?).as_secs_f64()))
                .collect(),
        )
    };
    let latencies = between(&trace.created, &trace.bound);
    let to_claim = between(&trace.created, &trace.claimed);
    let claim_to_bound = between(&trace.claimed, &trace.bound);
    let curve = sorted(
        trace
            .bound
            .values()
            .map(|at| (*at - trace.start).as_secs_f64())
            .collect(),
    );
    Outcome {
        runner,
        workload: plan.workload,
        round,
        pods: trace.bound.len(),
        expected,
        seconds: trace.seconds,
        latencies,
        to_claim,
        claim_to_bound,
        curve,
        cpu_s: cpu_before.zip(cpu_after).map(|(a, b)| b - a),
        rss_mib,
        requests,
        notes,
    }
}

/// The workload's objects, before any scheduler starts.
async fn setup(client: &Client, plan: &Plan) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in ["init", "test"] {
        let object = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("create namespace {ns}: {e}"));
    }
    create_all::<DeviceClass>(&Api::all(client.clone()), plan.classes()).await;
    create_all::<Node>(
        &Api::all(client.clone()),
        (0..plan.nodes).map(workload::node).collect(),
    )
    .await;
    create_all::<ResourceSlice>(
        &Api::all(client.clone()),
        (0..plan.nodes).flat_map(|i| plan.slices(i)).collect(),
    )
    .await;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "init");
    futures::stream::iter(0..plan.init)
        .map(|k| {
            let claims = claims.clone();
            async move {
                let (claim, allocation) = plan.init_claim(k);
                let claim: ResourceClaim = serde_json::from_value(claim).expect("a claim");
                let name = claim.metadata.name.clone().unwrap();
                claims.create(&PostParams::default(), &claim).await?;
                let patch = json!({"status": {"allocation": allocation}});
                claims
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await
        .unwrap_or_else(|e| panic!("allocate the init claims: {e}"));
    create_all::<ResourceClaimTemplate>(
        &Api::namespaced(client.clone(), "test"),
        vec![plan.template()],
    )
    .await;
    // Pods are admitted only once the namespace has its default ServiceAccount.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "test");
    test_cluster::eventually("the default ServiceAccount in test", 60, || async {
        accounts.get_opt("default").await.ok().flatten()
    })
    .await;
}

async fn create_all<K>(api: &Api<K>, objects: Vec<Value>)
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    K::DynamicType: Default,
{
    futures::stream::iter(objects)
        .map(|o| async move {
            let object: K = serde_json::from_value(o).expect("a valid object");
            api.create(&PostParams::default(), &object).await
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await
        .unwrap_or_else(|e| panic!("create {}: {e}", K::kind(&Default::default())));
}

/// When each measured pod was sent for creation, seen with its claim, and seen bound.
struct Trace {
    start: Instant,
    seconds: f64,
    created: HashMap<String, Instant>,
    claimed: HashMap<String, Instant>,
    bound: HashMap<String, Instant>,
}

/// The first time the watch saw each pod's claim named in its status.
type Claimed = Arc<Mutex<HashMap<String, Instant>>>;

/// A watch on namespace `test` that reports each pod the first time it is seen bound, and
/// notes when it was first seen with its claim. Returns once the watch has listed, so no
/// binding is missed.
async fn watch_bound(client: &Client) -> (mpsc::UnboundedReceiver<(String, Instant)>, Claimed) {
    let (tx, rx) = mpsc::unbounded_channel();
    let claimed = Claimed::default();
    let claims = claimed.clone();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "test");
    tokio::spawn(async move {
        let mut ready = Some(ready_tx);
        let mut seen = HashSet::new();
        let mut stream = watcher::watcher(pods, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = stream.next().await {
            let pod = match event {
                Ok(Event::Apply(pod) | Event::InitApply(pod)) => pod,
                Ok(Event::InitDone) => {
                    if let Some(r) = ready.take() {
                        let _ = r.send(());
                    }
                    continue;
                }
                _ => continue,
            };
            let at = Instant::now();
            if let Some(name) = pod.metadata.name.as_ref()
                && has_claim(&pod)
            {
                claims.lock().unwrap().entry(name.clone()).or_insert(at);
            }
            if common::node_of(&pod).is_some()
                && let Some(name) = pod.metadata.name
                && seen.insert(name.clone())
                && tx.send((name, at)).is_err()
            {
                return;
            }
        }
    });
    let _ = ready_rx.await;
    (rx, claimed)
}

/// Whether the pod's status names a claim made for it.
fn has_claim(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .is_some_and(|s| s.iter().any(|c| c.resource_claim_name.is_some()))
}

async fn create_pod(pods: &Api<Pod>, name: String) -> (String, Instant) {
    let pod: Pod = serde_json::from_value(workload::pod(&name, SCHEDULER)).expect("a pod");
    let sent = Instant::now();
    // The API server may refuse a burst's request for a moment (429): ask again.
    for attempt in 0.. {
        match pods.create(&PostParams::default(), &pod).await {
            Ok(_) => break,
            Err(e) if attempt < 20 => {
                eprintln!("  create pod {name}: {e}; again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("create pod {name}: {e}"),
        }
    }
    (name, sent)
}

/// `n` pods at once; until all are bound or `timeout` passes.
async fn burst(client: &Client, n: usize, timeout: Duration) -> Trace {
    let (mut bound_rx, claimed) = watch_bound(client).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "test");
    let start = Instant::now();
    let creator = tokio::spawn(async move {
        futures::stream::iter(0..n)
            .map(|i| create_pod(&pods, format!("p-{i:05}")))
            .buffer_unordered(CONCURRENCY)
            .collect::<HashMap<_, _>>()
            .await
    });
    let mut bound = HashMap::new();
    let deadline = tokio::time::Instant::from_std(start + timeout);
    while bound.len() < n {
        match tokio::time::timeout_at(deadline, bound_rx.recv()).await {
            Ok(Some((name, at))) => {
                bound.insert(name, at);
            }
            _ => {
                eprintln!("  only {} of {n} pods bound in {timeout:?}", bound.len());
                break;
            }
        }
    }
    let created = creator.await.expect("pods created");
    let last = bound.values().max().copied().unwrap_or(start);
    Trace {
        start,
        seconds: (last - start).as_secs_f64(),
        created,
        claimed: claimed.lock().unwrap().clone(),
        bound,
    }
}

/// scheduler_perf's steady state (`createPodsSteadily`), for `seconds`: `pending` pods
/// created at once; when the watch has seen all of them bound, one DeleteCollection of the
/// namespace's pods (grace period 0, in the background), then the next batch.
async fn steady_batches(client: &Client, pending: usize, seconds: u64) -> Trace {
    let (mut bound_rx, claimed) = watch_bound(client).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "test");
    let start = Instant::now();
    let stop = tokio::time::Instant::from_std(start + Duration::from_secs(seconds));
    let mut created = HashMap::new();
    let mut bound = HashMap::new();
    'window: for batch in 0.. {
        let names: HashSet<String> = (0..pending)
            .map(|i| format!("p-{:06}", batch * pending + i))
            .collect();
        let made = futures::future::join_all(names.iter().map(|n| create_pod(&pods, n.clone())));
        match tokio::time::timeout_at(stop, made).await {
            Ok(made) => created.extend(made),
            Err(_) => break,
        }
        let mut waiting = names;
        while !waiting.is_empty() {
            match tokio::time::timeout_at(stop, bound_rx.recv()).await {
                Ok(Some((name, at))) => {
                    if waiting.remove(&name) {
                        bound.insert(name, at);
                    }
                }
                _ => break 'window,
            }
        }
        let all = DeleteParams {
            grace_period_seconds: Some(0),
            propagation_policy: Some(kube::api::PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        let every_pod = kube::api::ListParams::default();
        match tokio::time::timeout_at(stop, pods.delete_collection(&all, &every_pod)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!("delete the bound batch: {e}"),
            Err(_) => break,
        }
    }
    Trace {
        start,
        seconds: seconds as f64,
        created,
        claimed: claimed.lock().unwrap().clone(),
        bound,
    }
}

/// Each pod seen bound is deleted and replaced by a new one at once, so that `pending`
/// pods wait at all times; for `seconds`.
async fn steady_each_pod(client: &Client, pending: usize, seconds: u64) -> Trace {
    let (mut bound_rx, claimed) = watch_bound(client).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "test");
    let created = Arc::new(Mutex::new(HashMap::new()));
    let spawn_create = |i: usize| {
        let (pods, created) = (pods.clone(), created.clone());
        tokio::spawn(async move {
            let (name, sent) = create_pod(&pods, format!("p-{i:06}")).await;
            created.lock().unwrap().insert(name, sent);
        });
    };
    let start = Instant::now();
    for i in 0..pending {
        spawn_create(i);
    }
    let mut next = pending;
    let mut bound = HashMap::new();
    let stop = tokio::time::Instant::from_std(start + Duration::from_secs(seconds));
    while let Ok(Some((name, at))) = tokio::time::timeout_at(stop, bound_rx.recv()).await {
        let api = pods.clone();
        let gone = name.clone();
        tokio::spawn(async move {
            let _ = api
                .delete(&gone, &DeleteParams::default().grace_period(0))
                .await;
        });
        bound.insert(name, at);
        spawn_create(next);
        next += 1;
    }
    let created = created.lock().unwrap().clone();
    Trace {
        start,
        seconds: seconds as f64,
        created,
        claimed: claimed.lock().unwrap().clone(),
        bound,
    }
}

/// The write ceiling: for each measured pod whose claim exists, the writes
/// `dra-scheduler run` makes for it (src/run/binder.rs and the Scheduled event), with the
/// plan's precomputed allocation, at most `concurrency` pods at once.
async fn ceiling(client: Client, plan: Plan, concurrency: usize, times: WriteTimes) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "test");
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "e2e-write-ceiling".into(),
            instance: None,
        },
    );
    let permits = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut handled = HashSet::new();
    let mut slot = 0;
    let mut stream = watcher::watcher(pods.clone(), watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(Ok(pod)) = stream.next().await {
        let claim = pod
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref())
            .and_then(|s| s.first())
            .and_then(|s| s.resource_claim_name.clone());
        let (Some(claim), Some(name), Some(uid)) = (claim, pod.metadata.name, pod.metadata.uid)
        else {
            continue;
        };
        let bound = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some();
        if bound || !handled.insert(name.clone()) {
            continue;
        }
        let (node, allocation) = plan.oracle(slot);
        slot += 1;
        let permit = permits.clone().acquire_owned().await.expect("semaphore");
        let (client, pods, recorder) = (client.clone(), pods.clone(), recorder.clone());
        let times = times.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = write_one(
                &client, &pods, &recorder, &times, &name, &uid, &claim, &node, allocation,
            )
            .await
            {
                eprintln!("  write ceiling: pod {name}: {e}");
            }
        });
    }
}

#[allow(clippy::too_many_arguments)]
async fn write_one(
    client: &Client,
    pods: &Api<Pod>,
    recorder: &Recorder,
    times: &WriteTimes,
    name: &str,
    uid: &str,
    claim: &str,
    node: &str,
    allocation: Value,
) -> Result<(), kube::Error> {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "test");
    let params = PatchParams::default();
    let finalizer =
        json!({"metadata": {"finalizers": ["resource.kubernetes.io/delete-protection"]}});
    let finalizer = Patch::Merge(finalizer);
    let patch = claims.patch(claim, &params, &finalizer);
    times.time("PATCH resourceclaims", patch).await?;
    let status = json!({"status": {"allocation": allocation,
        "reservedFor": [{"resource": "pods", "name": name, "uid": uid}]}});
    let status = Patch::Merge(status);
    let patch = claims.patch_status(claim, &params, &status);
    times.time("PATCH resourceclaims/status", patch).await?;
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("test".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            ..Default::default()
        },
    };
    let post = PostParams::default();
    let bind = pods.create_subresource::<_, Value>("binding", name, &post, &binding);
    times.time("POST pods/binding", bind).await?;
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(name.into()),
        namespace: Some("test".into()),
        uid: Some(uid.into()),
        ..Default::default()
    };
    let event = KubeEvent {
        type_: EventType::Normal,
        reason: "Scheduled".into(),
        note: Some(format!("Successfully assigned test/{name} to {node}")),
        action: "Scheduling".into(),
        secondary: None,
    };
    times
        .time("POST events", recorder.publish(&event, &reference))
        .await
}

/// The write ceiling's own time for each kind of write, from sending it to its answer:
/// "VERB resource[/subresource]" → (seconds, writes). Beside the API server's time for the
/// same writes, it shows what a write spends outside the server's handlers.
#[derive(Clone, Default)]
struct WriteTimes(Arc<Mutex<BTreeMap<&'static str, (f64, u64)>>>);

impl WriteTimes {
    async fn time<T>(&self, kind: &'static str, write: impl Future<Output = T>) -> T {
        let start = Instant::now();
        let answer = write.await;
        let mut times = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let entry = times.entry(kind).or_default();
        entry.0 += start.elapsed().as_secs_f64();
        entry.1 += 1;
        answer
    }

    fn lines(&self) -> Vec<String> {
        let times = self.0.lock().unwrap_or_else(|e| e.into_inner());
        times
            .iter()
            .map(|(kind, (seconds, count))| {
                format!(
                    "writes {kind}: {count} taking {seconds:.2} s in all, {:.2} ms each at the client",
                    seconds / *count as f64 * 1000.0
                )
            })
            .collect()
    }
}

/// The API server's request counter by verb and resource.
/// Per "VERB resource[/subresource]": requests, and the API server's seconds and count of
/// its request-duration histogram.
#[derive(Default)]
struct Counts {
    requests: BTreeMap<String, f64>,
    seconds: BTreeMap<String, (f64, f64)>,
    watch: BTreeMap<String, f64>,
}

fn api_requests(cluster: &TestCluster) -> Counts {
    let out = cluster
        .kubectl()
        .args(["get", "--raw", "/metrics"])
        .output()
        .expect("kubectl get --raw /metrics");
    let mut counts = Counts::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((family, rest)) = line.split_once('{') else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let value = value.parse::<f64>().unwrap_or(0.0);
        let label = |key: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        let (verb, resource, sub) = (label("verb"), label("resource"), label("subresource"));
        let key = if sub.is_empty() {
            format!("{verb} {resource}")
        } else {
            format!("{verb} {resource}/{sub}")
        };
        match family {
            "apiserver_request_total" => *counts.requests.entry(key).or_default() += value,
            "apiserver_request_duration_seconds_sum" => {
                counts.seconds.entry(key).or_default().0 += value
            }
            "apiserver_request_duration_seconds_count" => {
                counts.seconds.entry(key).or_default().1 += value
            }
            "apiserver_watch_cache_terminated_watchers_total" => {
                *counts
                    .watch
                    .entry(format!("watchers closed as unresponsive: {resource}"))
                    .or_default() += value
            }
            "apiserver_watch_events_total" => {
                *counts
                    .watch
                    .entry(format!("watch events sent: {resource}"))
                    .or_default() += value
            }
            "apiserver_watch_events_sizes_sum" => {
                *counts
                    .watch
                    .entry(format!("watch event bytes sent: {resource}"))
                    .or_default() += value
            }
            _ => {}
        }
    }
    counts
}

impl Counts {
    fn since(&self, before: &Counts) -> Requests {
        let mut requests = Requests::default();
        for (key, after) in &self.requests {
            let n = after - before.requests.get(key).copied().unwrap_or(0.0);
            if n <= 0.0 {
                continue;
            }
            let verb = key.split(' ').next().unwrap_or_default();
            if matches!(verb, "GET" | "LIST" | "WATCH") {
                requests.reads += n;
            } else {
                requests.writes += n;
                let (sum, count) = self.seconds.get(key).copied().unwrap_or_default();
                let (sum0, count0) = before.seconds.get(key).copied().unwrap_or_default();
                if count > count0 {
                    requests
                        .server_ms
                        .insert(key.clone(), (sum - sum0) / (count - count0) * 1000.0);
                }
            }
            requests.by_kind.insert(key.clone(), n);
        }
        for (key, after) in &self.watch {
            let n = after - before.watch.get(key).copied().unwrap_or(0.0);
            if n > 0.0 {
                requests.watch.insert(key.clone(), n);
            }
        }
        requests
    }
}

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// utime + stime of process `pid`, in seconds (`/proc/PID/stat`).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): state is the first, utime
    // the 12th, stime the 13th.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
}

/// Peak resident set of process `pid`, MiB (`VmHWM` in `/proc/PID/status`).
fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// dra-scheduler's own account of the run: attempts and their time, writes and theirs.
fn where_the_time_went(metrics: &str) -> Vec<String> {
    let mut sums: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in metrics.lines() {
        for (family, what) in [
            (
                "dra_scheduler_scheduling_attempt_duration_seconds",
                "attempts",
            ),
            ("dra_scheduler_api_write_duration_seconds", "writes"),
            ("dra_scheduler_binding_duration_seconds", "bindings"),
        ] {
            let Some(rest) = line.strip_prefix(family) else {
                continue;
            };
            let (kind, rest) = if let Some(r) = rest.strip_prefix("_sum") {
                (0, r)
            } else if let Some(r) = rest.strip_prefix("_count") {
                (1, r)
            } else {
                continue;
            };
            let (labels, value) = rest.rsplit_once(' ').unwrap_or(("", "0"));
            let value: f64 = value.parse().unwrap_or(0.0);
            let entry = sums.entry(format!("{what} {labels}")).or_default();
            if kind == 0 {
                entry.0 += value;
            } else {
                entry.1 += value;
            }
        }
    }
    sums.into_iter()
        .filter(|(_, (_, count))| *count > 0.0)
        .map(|(k, (sum, count))| {
            format!(
                "{k}: {count} taking {sum:.2} s in all, {:.2} ms each",
                sum / count * 1000.0
            )
        })
        .collect()
}
