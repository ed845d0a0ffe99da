//! `dra-scheduler run`: the live scheduler. Informers feed the engine's state (one
//! writer at a time: this loop, or the scheduling worker while an attempt runs); pending
//! pods of ours go through the scheduling queue and the engine; each attempt runs on a
//! blocking worker thread with the engine handed to it, so informer events, binding
//! results and the health endpoints keep flowing while a search runs (events that need
//! the engine wait for it in arrival order); each decision is assumed at once and written
//! by an asynchronous binding task ([`binder`]), at most `maxConcurrentBinds` at a time; a
//! failed write is undone and the pod backs off. Every write passes the leader fence
//! ([`leader::Fence`]).

pub mod binder;
pub mod config;
pub mod health;
pub mod leader;
pub mod metrics;
pub mod queue;
pub mod throttle;

use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use dra_engine::{
    ClusterInput, ClusterState, Decision, Engine, EngineConfig, ObjectKey, Placement,
};
use futures::stream::{BoxStream, SelectAll, StreamExt};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::{Semaphore, mpsc, watch as signal};

use self::config::Config;
use self::health::{Health, Lane};
use self::leader::{Candidate, Fence};
use self::metrics::Metrics;
use self::queue::SchedulingQueue;

/// The kinds the scheduler watches; it schedules only once every one has synced.
const KINDS: [&str; 6] = [
    "Node",
    "Pod",
    "ResourceClaim",
    "DeviceClass",
    "ResourceSlice",
    "DeviceTaintRule",
];

/// How long a pod may wait for a claim that does not exist before the user is told.
const GATED_REPORT_AFTER: Duration = Duration::from_secs(10);

/// A change from one of the informers.
// Each change is applied as soon as it arrives; boxing the large variants buys nothing.
#[allow(clippy::large_enum_variant)]
enum Change {
    Node(Event<Node>),
    Pod(Event<Pod>),
    Claim(Event<ResourceClaim>),
    Class(Event<DeviceClass>),
    Slice(Event<ResourceSlice>),
    TaintRule(Event<DeviceTaintRule>),
    /// A watch failed; the stream backs off and re-lists by itself.
    WatchError(&'static str, String),
}

fn watch<K, F>(client: &Client, kind: &'static str, wrap: F) -> BoxStream<'static, Change>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
    F: Fn(Event<K>) -> Change + Send + 'static,
{
    let api: Api<K> = Api::all(client.clone());
    watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .map(move |r| match r {
            Ok(e) => wrap(e),
            Err(e) => Change::WatchError(kind, e.to_string()),
        })
        .boxed()
}

fn pod_priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

fn pod_reference(pod: &ObjectKey, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.name.clone()),
        namespace: Some(pod.namespace.clone()),
        uid: uid.map(str::to_string),
        ..Default::default()
    }
}

/// What a scheduling attempt tells the user: an event, and for failures the pod's
/// `PodScheduled=False` condition with the engine's explanation.
async fn report(
    client: Client,
    metrics: Arc<Metrics>,
    recorder: Arc<Recorder>,
    pod: ObjectKey,
    uid: Option<String>,
    outcome: Result<String, String>,
) {
    let reference = pod_reference(&pod, uid.as_deref());
    let (type_, reason, note) = match &outcome {
        Ok(node) => (
            EventType::Normal,
            "Scheduled",
            format!("Successfully assigned {pod} to {node}"),
        ),
        Err(message) => (EventType::Warning, "FailedScheduling", message.clone()),
    };
    let event = KubeEvent {
        type_,
        reason: reason.into(),
        note: Some(note.clone()),
        action: "Scheduling".into(),
        secondary: None,
    };
    if let Err(e) = metrics
        .write_unthrottled("create", "events", recorder.publish(&event, &reference))
        .await
    {
        tracing::warn!(%pod, error = %e, "could not publish event");
    }
    if outcome.is_err() {
        let pods: Api<Pod> = Api::namespaced(client, &pod.namespace);
        let patch = serde_json::json!({"status": {"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": note,
        }]}});
        if let Err(e) = metrics
            .write(
                "patch",
                "pods/status",
                pods.patch_status(&pod.name, &PatchParams::default(), &Patch::Strategic(patch)),
            )
            .await
        {
            tracing::debug!(%pod, error = %e, "could not update the PodScheduled condition");
        }
    }
}

/// Tells users what became of their pods, without repeating a failure already told.
struct Tell {
    client: Client,
    metrics: Arc<Metrics>,
    recorder: Arc<Recorder>,
    /// The last failure told each pending pod: the same message is not written again.
    told: HashMap<ObjectKey, String>,
}

impl Tell {
    fn scheduled(&mut self, pod: ObjectKey, uid: Option<String>, node: String) {
        self.told.remove(&pod);
        let (client, metrics, recorder) = (
            self.client.clone(),
            self.metrics.clone(),
            self.recorder.clone(),
        );
        tokio::spawn(report(client, metrics, recorder, pod, uid, Ok(node)));
    }

    fn failed(&mut self, pod: ObjectKey, uid: Option<String>, message: String) {
        if self.told.get(&pod) == Some(&message) {
            return;
        }
        self.told.insert(pod.clone(), message.clone());
        let (client, metrics, recorder) = (
            self.client.clone(),
            self.metrics.clone(),
            self.recorder.clone(),
        );
        tokio::spawn(report(client, metrics, recorder, pod, uid, Err(message)));
    }
}

/// Who this replica is, in the Lease: the pod name (or host name) and something unique
/// to this process, so a restarted replica is a new holder.
fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_else(|| "dra-scheduler".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{host}_{}_{nanos:x}", std::process::id())
}

/// The next change of leadership; never, when leader election is off. `None` when the
/// election task stopped.
async fn leadership_change(rx: &mut Option<signal::Receiver<bool>>) -> Option<bool> {
    match rx {
        Some(rx) => match rx.changed().await {
            Ok(()) => Some(*rx.borrow_and_update()),
            Err(_) => None,
        },
        None => std::future::pending().await,
    }
}

async fn client_for(config: &Config) -> anyhow::Result<Client> {
    let kube_config = match &config.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        // In-cluster first, then KUBECONFIG, then ~/.kube/config.
        None => kube::Config::infer()
            .await
            .context("no kubeconfig: not in a cluster, no KUBECONFIG, no ~/.kube/config")?,
    };
    Ok(Client::try_from(kube_config)?)
}

/// How long a pod's first try may search for devices. Almost every pod is decided well
/// within it; one that is not gets its whole budget (`filterTimeout`) on a fork of the
/// engine in the long-search lane, while the worker goes on with the pods behind it.
const FIRST_TRY: Duration = Duration::from_millis(500);

/// One scheduling attempt, run on a blocking thread with the engine handed over, so that
/// the event loop keeps turning while it searches.
struct Attempt {
    engine: Engine,
    key: ObjectKey,
    decision: Decision,
    elapsed: f64,
    /// For a pod whose first try ran out of time: a fork of the engine to search on.
    fork: Option<Engine>,
}

fn run_attempt(mut engine: Engine, key: ObjectKey, cancel: Arc<AtomicBool>) -> Attempt {
    let started = Instant::now();
    let budget = engine.config().filter_timeout;
    let first_try = FIRST_TRY.min(budget);
    let decision = decide(&mut engine, &key, first_try, &cancel);
    let fork = (matches!(decision, Decision::OutOfTime { .. }) && first_try < budget)
        .then(|| engine.fork());
    Attempt {
        engine,
        key,
        decision,
        elapsed: started.elapsed().as_secs_f64(),
        fork,
    }
}

/// A pod's search with its whole budget, on a fork of the engine.
struct LongSearch {
    key: ObjectKey,
    decision: Decision,
    elapsed: f64,
    /// When the fork was made, to check its decision on the engine ([`Engine::admit`]).
    forked_at: u64,
}

fn run_long_search(mut fork: Engine, key: ObjectKey, cancel: Arc<AtomicBool>) -> LongSearch {
    let started = Instant::now();
    let budget = fork.config().filter_timeout;
    let decision = decide(&mut fork, &key, budget, &cancel);
    LongSearch {
        forked_at: fork.forked_at().unwrap_or_default(),
        key,
        decision,
        elapsed: started.elapsed().as_secs_f64(),
    }
}

/// The engine's decision; a panic in it is caught and reported on the pod, and the
/// scheduler keeps running.
fn decide(engine: &mut Engine, key: &ObjectKey, budget: Duration, cancel: &AtomicBool) -> Decision {
    guarded(engine, key, |engine| {
        engine.schedule_within(key, budget, Some(cancel))
    })
}

/// Runs one attempt; a panic in it becomes an error decision for that pod.
fn guarded(
    engine: &mut Engine,
    key: &ObjectKey,
    attempt: impl FnOnce(&mut Engine) -> Decision,
) -> Decision {
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| attempt(&mut *engine)));
    outcome.unwrap_or_else(|panic| {
        // The cycle does not change the state, only the allocator's view, which is rebuilt.
        engine.state_mut();
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        tracing::error!(pod = %key, panic = %what, "internal error in a scheduling attempt; the pod backs off");
        Decision::Error {
            pod: key.clone(),
            message: format!(
                "internal error in dra-scheduler while scheduling this pod ({what}); it will be retried, please report it"
            ),
        }
    })
}

/// Work on a blocking thread, and how to cancel it.
struct Running<T> {
    task: tokio::task::JoinHandle<T>,
    cancel: Arc<AtomicBool>,
}

impl<T: Send + 'static> Running<T> {
    fn spawn(work: impl FnOnce(Arc<AtomicBool>) -> T + Send + 'static) -> Running<T> {
        let cancel = Arc::new(AtomicBool::new(false));
        let flag = cancel.clone();
        Running {
            task: tokio::task::spawn_blocking(move || work(flag)),
            cancel,
        }
    }

    fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

/// Why the loop ended.
enum Ending {
    Shutdown,
    LostLease,
}

/// Run the scheduler until SIGTERM or Ctrl-C.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let client = client_for(&config).await?;
    let mut candidate = config
        .leader_election
        .as_ref()
        .map(|le| Candidate::new(client.clone(), le, identity()));
    let fence = candidate
        .as_ref()
        .map_or_else(|| Arc::new(Fence::open()), Candidate::fence);
    let metrics = Arc::new(
        Metrics::new()?
            .with_throttle(throttle::Throttle::new(
                config.client_qps,
                config.client_burst,
            ))
            .with_fence(fence.clone()),
    );
    let ready = Arc::new(AtomicBool::new(false));
    let health = Arc::new(Health::new(config.filter_timeout));
    let listener = tokio::net::TcpListener::bind(&config.metrics_bind_address)
        .await
        .with_context(|| format!("listen on {}", config.metrics_bind_address))?;
    tracing::info!(address = %listener.local_addr()?, "serving /metrics, /healthz and /readyz");
    tokio::spawn(metrics::serve(
        listener,
        metrics.clone(),
        ready.clone(),
        health.clone(),
    ));

    // The engine is here, or with the worker while an attempt runs.
    let mut engine = Some(Engine::new(
        EngineConfig {
            scheduler_name: config.scheduler_name.clone(),
            percentage_of_nodes_to_score: config.percentage_of_nodes_to_score,
            weights: config.scoring.clone(),
            filter_timeout: config.filter_timeout,
            ..Default::default()
        },
        ClusterInput::default(),
    ));
    let mut running: Option<Running<Attempt>> = None;
    // The long-search lane: one search at a time, the others wait with their forks.
    let mut long: Option<Running<LongSearch>> = None;
    let mut long_waiting: std::collections::VecDeque<(ObjectKey, Engine)> = Default::default();
    // Changes that arrived while the engine was with the worker, in arrival order.
    let mut deferred: Vec<Change> = Vec::new();
    let mut queue = SchedulingQueue::default();
    let mut changes: SelectAll<BoxStream<'static, Change>> = futures::stream::select_all([
        watch(&client, "Node", Change::Node),
        watch(&client, "Pod", Change::Pod),
        watch(&client, "ResourceClaim", Change::Claim),
        watch(&client, "DeviceClass", Change::Class),
        watch(&client, "ResourceSlice", Change::Slice),
        watch(&client, "DeviceTaintRule", Change::TaintRule),
    ]);
    let recorder = Arc::new(Recorder::new(
        client.clone(),
        Reporter {
            controller: config.scheduler_name.clone(),
            instance: std::env::var("POD_NAME").ok(),
        },
    ));
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
    let binds = Arc::new(Semaphore::new(config.max_concurrent_binds.max(1)));
    let mut book = Bookkeeping::default();
    let mut user = Tell {
        client: client.clone(),
        metrics: metrics.clone(),
        recorder: recorder.clone(),
        told: HashMap::new(),
    };

    // Leader election: every replica keeps its caches warm; only the leader takes pods
    // from the queue, and only while its fence is open. A standby that takes over has
    // never assumed anything, so its state is what the API server says (claim status is
    // the source of truth).
    let mut leading = candidate.is_none();
    let mut leader_rx = None;
    let (stop_election, stop_rx) = signal::channel(false);
    let mut election = None;
    if let Some(candidate) = candidate.take() {
        let le = config
            .leader_election
            .as_ref()
            .expect("a candidate has its settings");
        tracing::info!(lease = %format!("{}/{}", le.lease_namespace, le.lease_name), "waiting to become the leader");
        let (tx, rx) = signal::channel(false);
        leader_rx = Some(rx);
        election = Some(tokio::spawn(candidate.run(tx, stop_rx)));
    }
    metrics.leader.set(i64::from(leading));
    let mut informers = Informers::default();
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);

    let ending = loop {
        tokio::select! {
            Some(change) = changes.next() => match engine.as_mut() {
                Some(engine) => apply(engine, &mut queue, &mut book, &mut informers, change),
                None => deferred.push(change),
            },
            Some(done) = done_rx.recv(), if engine.is_some() => {
                let engine = engine.as_mut().expect("checked by the guard");
                book.binding_done(engine, &mut queue, &metrics, &mut user, done);
            }
            finished = async { (&mut running.as_mut().expect("guarded").task).await }, if running.is_some() => {
                running = None;
                health.attempt_finished(Lane::Main, Instant::now());
                let attempt = finished.context("the scheduling worker was lost")?;
                let mut e = attempt.engine;
                if let Some(fork) = attempt.fork {
                    tracing::info!(pod = %attempt.key, "the first try ran out of time: searching with the whole budget while other pods go on");
                    long_waiting.push_back((attempt.key, fork));
                } else if leading {
                    let ctx = Ctx { client: &client, metrics: &metrics, done: &done_tx, binds: &binds };
                    book.decided(&mut e, &mut queue, &mut user, &ctx, attempt.key, attempt.decision, attempt.elapsed);
                } else {
                    queue.backoff(&attempt.key, Instant::now());
                }
                for change in deferred.drain(..) {
                    apply(&mut e, &mut queue, &mut book, &mut informers, change);
                }
                engine = Some(e);
            }
            finished = async { (&mut long.as_mut().expect("guarded").task).await }, if long.is_some() && engine.is_some() => {
                long = None;
                health.attempt_finished(Lane::Long, Instant::now());
                let search = finished.context("the long-search lane was lost")?;
                let e = engine.as_mut().expect("checked by the guard");
                if leading {
                    let ctx = Ctx { client: &client, metrics: &metrics, done: &done_tx, binds: &binds };
                    book.decided_on_fork(e, &mut queue, &mut user, &ctx, search);
                } else {
                    queue.backoff(&search.key, Instant::now());
                }
            }
            change = leadership_change(&mut leader_rx) => match change {
                Some(true) if !leading => {
                    tracing::info!("became the leader: scheduling");
                    leading = true;
                    metrics.leader.set(1);
                }
                Some(true) => {}
                Some(false) | None if leading => break Ending::LostLease,
                Some(false) => {}
                None => anyhow::bail!("leader election stopped"),
            },
            _ = tick.tick() => {
                let now = Instant::now();
                queue.flush_backoff(now);
                queue.flush_unschedulable(now);
                // A claim that has not appeared for a while is worth telling the user about.
                if let Some(engine) = engine.as_ref() {
                    for pod in queue.overdue_gated(now, GATED_REPORT_AFTER) {
                        if let Some(message) = engine.claims_missing(&pod) {
                            let uid = engine.state().pods.get(&pod).and_then(|p| p.metadata.uid.clone());
                            user.failed(pod, uid, message);
                        }
                    }
                }
            }
            _ = &mut shutdown => {
                tracing::info!("shutting down: no new pods; waiting for bindings in flight");
                break Ending::Shutdown;
            }
        }
        let now = Instant::now();
        health.beat(now);
        // Whatever the election task believes: no renewal within the deadline, no leading.
        if leading && !fence.may_schedule(now) {
            break Ending::LostLease;
        }
        if informers.synced.len() < KINDS.len() {
            continue;
        }
        ready.store(true, Ordering::Relaxed);
        if !leading {
            continue;
        }
        if long.is_none()
            && let Some((key, fork)) = long_waiting.pop_front()
        {
            health.attempt_started(Lane::Long, now);
            long = Some(Running::spawn(move |cancel| {
                run_long_search(fork, key, cancel)
            }));
        }
        if running.is_none()
            && let Some(e) = engine.take()
        {
            match next_pod(&e, &mut queue, &book) {
                Some(key) => {
                    health.attempt_started(Lane::Main, now);
                    running = Some(Running::spawn(move |cancel| run_attempt(e, key, cancel)));
                }
                None => engine = Some(e),
            }
        }
        if user.told.len() > 64 && user.told.len() > 2 * queue.len() {
            user.told.retain(|pod, _| queue.contains(pod));
        }
        metrics.set_pending(queue.lengths());
    };

    // Stop: no new attempt; the one running is cancelled; bindings in flight finish or
    // undo themselves while the fence still lets them write.
    ready.store(false, Ordering::Relaxed);
    if let Some(running) = &running {
        running.cancel();
    }
    if let Some(long) = &long {
        long.cancel();
    }
    if matches!(ending, Ending::LostLease) {
        metrics.leader.set(0);
        tracing::error!(
            "the leader Lease was not renewed within the renew deadline: stopped scheduling; letting bindings in flight settle, then exiting"
        );
    }
    let all = u32::try_from(config.max_concurrent_binds.max(1)).unwrap_or(u32::MAX);
    let settle = async {
        let _ = binds.acquire_many(all).await;
    };
    let _ = tokio::time::timeout(Duration::from_secs(30), settle).await;
    // The election task releases the Lease (if still held), so a standby takes over at once.
    let _ = stop_election.send(true);
    if let Some(task) = election {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    match ending {
        Ending::Shutdown => Ok(()),
        Ending::LostLease => anyhow::bail!(
            "lost the leader Lease; exiting so that a restart rebuilds from the API server"
        ),
    }
}

/// A binding task's report: the placement, when its pod entered the queue, and the result.
type Done = (
    Placement,
    Option<Instant>,
    Result<Vec<ResourceClaim>, binder::BindFailure>,
);

/// What starting a binding needs.
struct Ctx<'a> {
    client: &'a Client,
    metrics: &'a Arc<Metrics>,
    done: &'a mpsc::UnboundedSender<Done>,
    binds: &'a Arc<Semaphore>,
}

/// The next pod to try, if any; pods whose claims do not exist yet are gated on the way.
fn next_pod(engine: &Engine, queue: &mut SchedulingQueue, book: &Bookkeeping) -> Option<ObjectKey> {
    while let Some(key) = queue.pop() {
        if book.in_flight.contains_key(&key) {
            continue;
        }
        if engine.claims_missing(&key).is_some() {
            queue.gate(&key, Instant::now());
            continue;
        }
        return Some(key);
    }
    None
}

/// Decisions whose writes are in flight or not yet seen by the informers, keyed by pod
/// and checked against the pod's UID (a pod deleted and created again under the same name
/// is another pod).
#[derive(Default)]
struct Bookkeeping {
    in_flight: HashMap<ObjectKey, Placement>,
    /// Bound pods whose binding the pod informer has not shown yet: until it does, an
    /// older event must not make them pending again.
    confirming: HashMap<ObjectKey, Placement>,
}

impl Bookkeeping {
    /// The placement recorded for this very pod (same UID), in flight or being confirmed.
    fn placement_of(&self, pod: &Pod) -> Option<&Placement> {
        let key = ObjectKey::of(&pod.metadata);
        self.in_flight
            .get(&key)
            .or_else(|| self.confirming.get(&key))
            .filter(|p| p.pod_uid.is_none() || p.pod_uid == pod.metadata.uid)
    }

    fn placements(&self) -> impl Iterator<Item = &Placement> {
        self.in_flight.values().chain(self.confirming.values())
    }

    /// Take a decision made by the worker.
    #[allow(clippy::too_many_arguments)]
    fn decided(
        &mut self,
        engine: &mut Engine,
        queue: &mut SchedulingQueue,
        user: &mut Tell,
        ctx: &Ctx<'_>,
        key: ObjectKey,
        decision: Decision,
        elapsed: f64,
    ) {
        let metrics = ctx.metrics;
        metrics
            .search_steps
            .observe(engine.last_search_steps() as f64);
        let uid = engine
            .state()
            .pods
            .get(&key)
            .and_then(|p| p.metadata.uid.clone());
        match decision {
            Decision::Scheduled(placement) => {
                metrics
                    .attempts
                    .with_label_values(&["scheduled"])
                    .observe(elapsed);
                for _ in placement.claims.iter().filter(|c| c.allocation.is_some()) {
                    metrics.allocation_latency.observe(elapsed);
                }
                engine.assume(&placement);
                self.in_flight.insert(key.clone(), placement.clone());
                metrics.in_flight.set(self.in_flight.len() as i64);
                let added = queue.added_at(&key);
                let client = ctx.client.clone();
                let done = ctx.done.clone();
                let binds = ctx.binds.clone();
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    let _permit = binds.acquire_owned().await;
                    let started = Instant::now();
                    let result = binder::bind(&client, &metrics, &placement).await;
                    metrics
                        .bind_latency
                        .with_label_values(&[if result.is_ok() { "ok" } else { "error" }])
                        .observe(started.elapsed().as_secs_f64());
                    let _ = done.send((placement, added, result));
                });
            }
            Decision::Unschedulable { pod, message } | Decision::OutOfTime { pod, message } => {
                metrics
                    .attempts
                    .with_label_values(&["unschedulable"])
                    .observe(elapsed);
                queue.unschedulable(&pod, Instant::now());
                // A claim allocated for this pod that keeps it where it cannot go
                // (e.g. allocated before a restart) is given back; the claim's update
                // then retries the pod.
                if let (Some(claim), Some(uid)) = (engine.claim_to_release(&pod), uid.clone()) {
                    let client = ctx.client.clone();
                    let metrics = metrics.clone();
                    let pod = pod.clone();
                    tokio::spawn(async move {
                        match binder::release_claim(&client, &metrics, &claim, &uid).await {
                            Ok(true) => {
                                tracing::info!(%pod, %claim, "deallocated the claim of an unschedulable pod")
                            }
                            Ok(false) => {}
                            Err(message) => {
                                tracing::warn!(%pod, %claim, %message, "could not deallocate")
                            }
                        }
                    });
                }
                user.failed(pod, uid, message);
            }
            Decision::Error { pod, message } => {
                metrics
                    .attempts
                    .with_label_values(&["error"])
                    .observe(elapsed);
                queue.backoff(&pod, Instant::now());
                user.failed(pod, uid, message);
            }
        }
    }

    /// Take a decision made on a fork: a placement only if it still holds on the engine,
    /// "nothing fits" then retried soon if anything changed meanwhile.
    fn decided_on_fork(
        &mut self,
        engine: &mut Engine,
        queue: &mut SchedulingQueue,
        user: &mut Tell,
        ctx: &Ctx<'_>,
        search: LongSearch,
    ) {
        let LongSearch {
            key,
            decision,
            elapsed,
            forked_at,
        } = search;
        if let Decision::Scheduled(placement) = &decision
            && let Err(why) = engine.admit(placement, forked_at)
        {
            tracing::info!(pod = %key, %why, "a placement found on a fork no longer holds; trying again");
            queue.backoff(&key, Instant::now());
            return;
        }
        let stale = engine.changed_since(forked_at);
        let unplaced = !matches!(decision, Decision::Scheduled(_));
        self.decided(engine, queue, user, ctx, key.clone(), decision, elapsed);
        if unplaced && stale {
            // An event that could help came while the pod was away from the queue.
            queue.backoff(&key, Instant::now());
        }
    }

    /// A binding task finished.
    fn binding_done(
        &mut self,
        engine: &mut Engine,
        queue: &mut SchedulingQueue,
        metrics: &Metrics,
        user: &mut Tell,
        (placement, added, result): Done,
    ) {
        self.in_flight.remove(&placement.pod);
        metrics.in_flight.set(self.in_flight.len() as i64);
        let uid = placement.pod_uid.clone();
        match result {
            Ok(stored) => {
                // What the API server stored is newer than anything the informers have
                // shown; late events cannot undo it.
                for claim in stored {
                    engine.upsert_claim(claim);
                }
                engine.reassert(&placement);
                self.confirming
                    .insert(placement.pod.clone(), placement.clone());
                if let Some(added) = added {
                    metrics
                        .pod_scheduling
                        .observe(added.elapsed().as_secs_f64());
                }
                queue.remove(&placement.pod);
                user.scheduled(placement.pod.clone(), uid, placement.node.clone());
            }
            Err(failure) => {
                if failure.unwound {
                    tracing::warn!(pod = %placement.pod, message = %failure.message, "binding failed; undone, backing off");
                    engine.forget(&placement);
                } else {
                    // The claims may still hold the devices: keep them taken, free only
                    // the pod; the informers bring the claims' truth.
                    tracing::warn!(pod = %placement.pod, message = %failure.message, "binding failed and could not be undone; its devices stay taken");
                    engine.forget_pod(&placement);
                }
                queue.backoff(&placement.pod, Instant::now());
                // What it had assumed is free again.
                queue.cluster_changed();
                user.failed(placement.pod.clone(), uid, failure.message);
            }
        }
    }
}

fn apply(
    engine: &mut Engine,
    queue: &mut SchedulingQueue,
    book: &mut Bookkeeping,
    informers: &mut Informers,
    change: Change,
) {
    let mut touched_claims = false;
    // Whether the change may free or add what an unschedulable pod lacked.
    let mut changed = true;
    match change {
        Change::Pod(event) => match event {
            Event::Apply(pod) | Event::InitApply(pod) => {
                let key = ObjectKey::of(&pod.metadata);
                informers.seen("Pod", key.clone());
                let bound = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_some();
                let terminal = dra_engine::state::is_terminal(&pod);
                if bound {
                    book.confirming.remove(&key);
                }
                let old = engine.state().pods.get(&key);
                if bound || terminal || pod.metadata.deletion_timestamp.is_some() {
                    queue.remove(&key);
                } else if engine.is_ours(&pod) && book.placement_of(&pod).is_none() {
                    queue.add(key.clone(), pod_priority(&pod));
                    // Our own writes (the PodScheduled condition) change only the status:
                    // they do not retry the pod.
                    if old.is_none_or(|old| pod_changed_for_scheduling(old, &pod)) {
                        queue.pod_updated(&key);
                    }
                }
                let was_bound = old.is_some_and(|p| dra_engine::state::bound_node(p).is_some());
                let placement = book.placement_of(&pod).cloned();
                engine.upsert_pod(pod);
                if let Some(p) = placement {
                    engine.reassert(&p);
                }
                // A bound pod that finished frees its node; other pod updates change nothing
                // for the pods that wait.
                changed = terminal && was_bound;
            }
            Event::Delete(pod) => {
                let key = ObjectKey::of(&pod.metadata);
                queue.remove(&key);
                book.confirming.remove(&key);
                // Only a pod that held a node frees anything.
                changed = engine
                    .state()
                    .pods
                    .get(&key)
                    .is_some_and(|p| dra_engine::state::bound_node(p).is_some());
                engine.remove_pod(&key);
            }
            Event::Init => {
                informers.listing("Pod");
                changed = false;
            }
            Event::InitDone => {
                // Pods deleted while the watch was down are not in the new list.
                let gone = informers.gone("Pod", engine.state().pods.keys().cloned());
                changed = !gone.is_empty();
                for key in gone {
                    queue.remove(&key);
                    book.confirming.remove(&key);
                    engine.remove_pod(&key);
                }
            }
        },
        Change::Claim(event) => {
            touched_claims = true;
            match event {
                Event::Apply(c) | Event::InitApply(c) => {
                    informers.seen("ResourceClaim", ObjectKey::of(&c.metadata));
                    let old = engine.state().claims.get(&ObjectKey::of(&c.metadata));
                    changed = claim_may_help(old, &c);
                    engine.upsert_claim(c);
                }
                Event::Delete(c) => engine.remove_claim(&ObjectKey::of(&c.metadata)),
                Event::Init => {
                    informers.listing("ResourceClaim");
                    changed = false;
                }
                Event::InitDone => {
                    let gone =
                        informers.gone("ResourceClaim", engine.state().claims.keys().cloned());
                    changed = !gone.is_empty();
                    for key in gone {
                        engine.remove_claim(&key);
                    }
                }
            }
        }
        Change::Node(event) => {
            if let Event::Apply(node) = &event {
                let old = engine.state().nodes.get(&name(&node.metadata));
                changed = node_may_help(old.map(|i| &i.node), node);
            }
            cluster_scoped(
                engine,
                informers,
                "Node",
                event,
                (Engine::upsert_node, Engine::remove_node),
                |s| s.nodes.keys().cloned().collect(),
            )
        }
        Change::Class(event) => cluster_scoped(
            engine,
            informers,
            "DeviceClass",
            event,
            (
                |e, o| e.state_mut().upsert_class(o),
                |e, name| e.state_mut().remove_class(name),
            ),
            |s| s.classes.iter().map(|o| name(&o.metadata)).collect(),
        ),
        Change::Slice(event) => cluster_scoped(
            engine,
            informers,
            "ResourceSlice",
            event,
            (
                |e, o| e.state_mut().upsert_slice(o),
                |e, name| e.state_mut().remove_slice(name),
            ),
            |s| s.slices.iter().map(|o| name(&o.metadata)).collect(),
        ),
        Change::TaintRule(event) => cluster_scoped(
            engine,
            informers,
            "DeviceTaintRule",
            event,
            (
                |e, o| e.state_mut().upsert_taint_rule(o),
                |e, name| e.state_mut().remove_taint_rule(name),
            ),
            |s| s.taint_rules.iter().map(|o| name(&o.metadata)).collect(),
        ),
        Change::WatchError(kind, message) => {
            tracing::warn!(kind, %message, "watch failed; backing off and re-listing");
            return;
        }
    }
    if touched_claims {
        // The API server's copy replaced what was assumed for bindings still in flight.
        for placement in book.placements() {
            engine.reassert(placement);
        }
    }
    if changed {
        queue.cluster_changed();
    }
}

/// Whether a pod's update could change where it fits: anything but its status, resource
/// version and managed fields (as kube-scheduler's queue ignores them), except the claims
/// kube-controller-manager records in the status for the pod's templates.
fn pod_changed_for_scheduling(old: &Pod, new: &Pod) -> bool {
    let strip = |pod: &Pod| {
        let mut p = pod.clone();
        p.metadata.resource_version = None;
        p.metadata.managed_fields = None;
        p.metadata.generation = None;
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            resource_claim_statuses: pod
                .status
                .as_ref()
                .and_then(|s| s.resource_claim_statuses.clone()),
            ..Default::default()
        });
        p
    };
    strip(old) != strip(new)
}

/// Whether a node's update could make an unschedulable pod fit: a new node, or a change
/// of what filters look at (labels, taints, unschedulable, allocatable). Kubelets update
/// their Node status all the time for other reasons; those do not retry every pod.
fn node_may_help(old: Option<&Node>, new: &Node) -> bool {
    let Some(old) = old else { return true };
    let allocatable = |n: &Node| n.status.as_ref().and_then(|s| s.allocatable.clone());
    old.metadata.labels != new.metadata.labels
        || old.spec != new.spec
        || allocatable(old) != allocatable(new)
}

/// Whether a claim's update could make an unschedulable pod fit (the queueing hint): a new
/// claim (pods wait for their generated claims), devices given back, or a reservation
/// freed. A claim becoming allocated or reserved only takes things away.
fn claim_may_help(
    old: Option<&k8s_openapi::api::resource::v1::ResourceClaim>,
    new: &k8s_openapi::api::resource::v1::ResourceClaim,
) -> bool {
    let Some(old) = old else { return true };
    let allocated = |c: &ResourceClaim| c.status.as_ref().is_some_and(|s| s.allocation.is_some());
    let reservations = |c: &ResourceClaim| {
        c.status
            .as_ref()
            .and_then(|s| s.reserved_for.as_ref())
            .map_or(0, Vec::len)
    };
    (allocated(old) && !allocated(new))
        || reservations(new) < reservations(old)
        || old.spec != new.spec
        || new.metadata.deletion_timestamp != old.metadata.deletion_timestamp
}

fn name(meta: &kube::api::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

/// The informers' progress: which kinds have synced, and during a (re-)list the objects
/// seen so far, so that objects deleted while a watch was down are dropped at its end.
#[derive(Default)]
struct Informers {
    synced: HashSet<&'static str>,
    listing: HashMap<&'static str, HashSet<ObjectKey>>,
}

impl Informers {
    fn listing(&mut self, kind: &'static str) {
        self.listing.insert(kind, HashSet::new());
    }

    fn seen(&mut self, kind: &'static str, key: ObjectKey) {
        if let Some(seen) = self.listing.get_mut(kind) {
            seen.insert(key);
        }
    }

    /// The list of `kind` is complete: of the objects the state `has`, those it did not
    /// contain.
    fn gone(&mut self, kind: &'static str, has: impl Iterator<Item = ObjectKey>) -> Vec<ObjectKey> {
        self.synced.insert(kind);
        match self.listing.remove(kind) {
            Some(seen) => has.filter(|k| !seen.contains(k)).collect(),
            None => Vec::new(),
        }
    }
}

/// How the state takes in and lets go of one cluster-scoped kind.
type UpsertRemove<K> = (fn(&mut Engine, K), fn(&mut Engine, &str));

/// Apply a change to a cluster-scoped kind the state keeps by name.
fn cluster_scoped<K: kube::Resource>(
    engine: &mut Engine,
    informers: &mut Informers,
    kind: &'static str,
    event: Event<K>,
    (upsert, remove): UpsertRemove<K>,
    names: fn(&ClusterState) -> Vec<String>,
) {
    let key = |name: String| ObjectKey::new("", name);
    match event {
        Event::Apply(o) | Event::InitApply(o) => {
            informers.seen(kind, key(name(o.meta())));
            upsert(engine, o)
        }
        Event::Delete(o) => remove(engine, &name(o.meta())),
        Event::Init => informers.listing(kind),
        Event::InitDone => {
            let has = names(engine.state()).into_iter().map(key);
            for gone in informers.gone(kind, has) {
                remove(engine, &gone.name);
            }
        }
    }
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relist_drops_what_was_deleted_while_the_watch_was_down() {
        let mut informers = Informers::default();
        let pods = |names: &[&str]| {
            names
                .iter()
                .map(|n| ObjectKey::new("default", *n))
                .collect::<Vec<_>>()
        };
        // The first list: nothing known yet, nothing gone.
        informers.listing("Pod");
        informers.seen("Pod", ObjectKey::new("default", "a"));
        assert!(informers.gone("Pod", std::iter::empty()).is_empty());
        assert!(informers.synced.contains("Pod"));
        // A re-list after an outage in which "b" was deleted.
        informers.listing("Pod");
        informers.seen("Pod", ObjectKey::new("default", "a"));
        assert_eq!(
            informers.gone("Pod", pods(&["a", "b"]).into_iter()),
            pods(&["b"])
        );
        // Without a list in progress, nothing is called gone.
        assert!(informers.gone("Pod", pods(&["a"]).into_iter()).is_empty());
    }

    #[test]
    fn a_panic_in_one_attempt_is_reported_on_its_pod_and_the_next_pod_is_placed() {
        let node: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": "n1"},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}))
        .unwrap();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "next", "namespace": "default"},
            "spec": {"schedulerName": "dra-scheduler", "containers": [{"name": "c"}]}}))
        .unwrap();
        let mut engine = Engine::new(
            EngineConfig::default(),
            ClusterInput {
                nodes: vec![node],
                pods: vec![pod],
                ..Default::default()
            },
        );
        let bad = ObjectKey::new("default", "bad");
        let decision = guarded(&mut engine, &bad, |_| panic!("index out of bounds"));
        match decision {
            Decision::Error { pod, message } => {
                assert_eq!(pod, bad);
                assert_eq!(
                    message,
                    "internal error in dra-scheduler while scheduling this pod (index out of bounds); it will be retried, please report it"
                );
            }
            other => panic!("{other:?}"),
        }
        let next = ObjectKey::new("default", "next");
        let cancel = AtomicBool::new(false);
        let placed = decide(&mut engine, &next, Duration::from_secs(10), &cancel);
        assert_eq!(placed.node(), Some("n1"));
    }

    #[test]
    fn our_own_status_writes_do_not_retry_a_pod_but_its_claims_and_spec_do() {
        let pod = |status: serde_json::Value, rv: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "default", "resourceVersion": rv},
                "spec": {"containers": [{"name": "c"}]}, "status": status}))
            .unwrap()
        };
        let old = pod(serde_json::json!({}), "1");
        let condition = pod(
            serde_json::json!({"conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": "0/3 nodes are available"}]}),
            "2",
        );
        assert!(!pod_changed_for_scheduling(&old, &condition));
        let claims = pod(
            serde_json::json!({"resourceClaimStatuses": [
                {"name": "gpu", "resourceClaimName": "p-gpu-x7k2"}]}),
            "3",
        );
        assert!(pod_changed_for_scheduling(&condition, &claims));
        let mut labelled = old.clone();
        labelled.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        assert!(pod_changed_for_scheduling(&old, &labelled));
    }

    #[test]
    fn only_node_changes_that_filters_see_retry_pods() {
        let node = |labels: serde_json::Value, heartbeat: &str| -> Node {
            serde_json::from_value(
                serde_json::json!({"metadata": {"name": "n1", "labels": labels},
                "status": {"allocatable": {"cpu": "8"}, "conditions": [
                    {"type": "Ready", "status": "True", "lastHeartbeatTime": heartbeat}]}}),
            )
            .unwrap()
        };
        let old = node(serde_json::json!({"a": "1"}), "2026-12-01T00:00:00Z");
        assert!(node_may_help(None, &old), "a new node");
        assert!(
            !node_may_help(
                Some(&old),
                &node(serde_json::json!({"a": "1"}), "2026-12-01T00:01:00Z")
            ),
            "a heartbeat"
        );
        assert!(node_may_help(
            Some(&old),
            &node(serde_json::json!({"a": "2"}), "2026-12-01T00:00:00Z")
        ));
    }
}
