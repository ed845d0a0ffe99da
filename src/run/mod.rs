//! `dra-scheduler run`: the live scheduler, a `Daemon` whose loop hands each event to the
//! method for its kind (an informer's change, a finished attempt or long search, a finished
//! binding, a leadership change, the tick, shutdown).
//!
//! Informers feed the engine's state (one writer at a time: this loop, or the scheduling
//! worker while an attempt runs); pending pods of ours go through the scheduling queue and
//! the engine; each attempt runs on a blocking worker thread with the engine handed to it,
//! so informer events, binding results and the health endpoints keep flowing while a search
//! runs (events that need the engine wait for it in arrival order); each decision is
//! assumed at once and written by an asynchronous binding task ([`binder`]), at most
//! `maxConcurrentBinds` at a time; a failed write is undone and the pod backs off. Every
//! write passes the leader fence ([`leader::Fence`]).

pub mod apis;
pub mod binder;
pub mod bindings;
pub mod config;
mod degraded;
mod events;
mod groups;
mod handoff;
pub mod health;
pub mod kube_config;
pub mod leader;
pub mod metrics;
pub mod owners;
mod preemption;
pub mod queue;
mod storage;
pub mod throttle;
pub mod transport;
mod workloads;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use dra_engine::group::GroupDecision;
use dra_engine::{
    ClusterInput, ClusterState, Decision, Engine, GroupPreemption, ObjectKey, Placement, Preemption,
};
use futures::stream::{BoxStream, SelectAll, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, ObjectReference, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event as KubeEvent, EventType, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch as signal};

use self::config::Config;
use self::events::Recorder;
use self::groups::{PodGroups, Work};
use self::health::{Health, LONG_LANES, Lane};
use self::leader::{Candidate, Fence};
use self::metrics::Metrics;
use self::preemption::Budgets;
use self::queue::{SchedulingQueue, Wake};
use dra_engine::queueing_hints::ClusterEvent;

/// The kinds the scheduler always watches; it schedules only once every kind it watches
/// has synced (these, DeviceTaintRule where served, storage's and workloads' kinds).
const KINDS: [&str; 6] = [
    "Namespace",
    "Node",
    "Pod",
    "ResourceClaim",
    "DeviceClass",
    "ResourceSlice",
];

/// How often the `devices` gauge is counted again.
const INVENTORY_EVERY: Duration = Duration::from_secs(15);

/// How long a pod may wait for a claim that does not exist before the user is told.
const GATED_REPORT_AFTER: Duration = Duration::from_secs(10);

/// The same when every claim of the pod is made from a template (see [`report_after`]).
const TEMPLATE_CLAIMS_REPORT_AFTER: Duration = Duration::from_secs(60);

/// How long a pod may wait for its claims before the user is told. A claim the pod names
/// is the user's to create: 10 s. Claims made from templates are kube-controller-manager's
/// to create, and a burst of pods is a backlog there that clears by itself: in benches/e2e's
/// template burst 963 of 2,500 pods waited more than 10 s, and telling each (an event and a
/// status patch) took 11% more writes while the API server was the limit. A controller
/// that makes no claims at all (DRA off there) is still told, after 60 s.
fn report_after(pod: Option<&Pod>) -> Duration {
    let claims = pod
        .and_then(|p| p.spec.as_ref())
        .and_then(|s| s.resource_claims.as_deref())
        .unwrap_or_default();
    let from_templates =
        |c: &k8s_openapi::api::core::v1::PodResourceClaim| c.resource_claim_template_name.is_some();
    if !claims.is_empty() && claims.iter().all(from_templates) {
        TEMPLATE_CLAIMS_REPORT_AFTER
    } else {
        GATED_REPORT_AFTER
    }
}

/// A change from one of the informers.
// Each change is applied as soon as it arrives; boxing the large variants buys nothing.
#[allow(clippy::large_enum_variant)]
enum Change {
    /// Namespaces' labels, for pod affinity terms' namespaceSelector.
    Namespace(Event<Namespace>),
    Node(Event<Node>),
    Pod(Event<Pod>),
    Claim(Event<ResourceClaim>),
    Class(Event<DeviceClass>),
    Slice(Event<ResourceSlice>),
    TaintRule(Event<DeviceTaintRule>),
    /// PersistentVolumeClaims, PersistentVolumes, StorageClasses, CSINodes, CSIDrivers,
    /// VolumeAttachments.
    Storage(storage::Change),
    /// Services, ReplicationControllers, ReplicaSets, StatefulSets: their selectors.
    Workloads(workloads::Change),
    /// PodGroups (`scheduling.k8s.io/v1beta1`), where served.
    PodGroup(Event<k8s_openapi::api::scheduling::v1beta1::PodGroup>),
    /// PodDisruptionBudgets, which preemption respects where it can.
    Pdb(Event<k8s_openapi::api::policy::v1::PodDisruptionBudget>),
    /// A watch failed; the stream backs off and re-lists by itself.
    WatchError(&'static str, String),
}

/// Forgets which field manager wrote which fields: nothing here reads them, and every
/// stored pod and claim carried them as JSON trees (kube-scheduler's pod informer drops
/// them too). Dropping them took benches/e2e's template run from 356 to 250 MiB peak RSS.
pub(crate) fn drop_managed_fields<K: kube::Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// Forgets what no scheduling plugin reads of a pod: its managedFields, and the volumes
/// whose sources only the kubelet reads (projected, configMap, secret, downwardAPI; every
/// pod's service-account token is such a volume). The plugins that read volumes
/// (VolumeBinding, VolumeRestrictions, VolumeZone, NodeVolumeLimits, ImageLocality's
/// image volumes) read other kinds. `Volume` holds every kind of source inline (3,280
/// bytes) and the token's projected sources add about 2.6 KB: about 15 MB of the heap for
/// benches/e2e template's 2,500 pods.
pub(crate) fn trim_pod(pod: &mut Pod) {
    drop_managed_fields(pod);
    let Some(volumes) = pod.spec.as_mut().and_then(|s| s.volumes.as_mut()) else {
        return;
    };
    volumes.retain(|v| {
        v.projected.is_none()
            && v.config_map.is_none()
            && v.secret.is_none()
            && v.downward_api.is_none()
    });
    volumes.shrink_to_fit();
}

/// What a watched kind is.
trait Watched:
    kube::Resource<DynamicType = ()>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + 'static
{
}

impl<K> Watched for K where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static
{
}

/// Objects a watch's list asks for at a time (kube's default is 500).
///
/// A page is decoded whole before its first object is applied, so every object of a page is
/// in memory at once in its API form. A ResourceSlice of ten GPUs takes about 80 KiB in that
/// form and about a third of it once applied (see `dra_allocator::Slice`): with 500 slices a
/// page, the first list of a 500-node cluster held some 40 MiB at once, which set the
/// daemon's peak memory. A hundred a page keeps that to a fifth, for four more requests per
/// 500 objects.
const LIST_PAGE_SIZE: u32 = 100;

fn watch_config() -> watcher::Config {
    watcher::Config::default().page_size(LIST_PAGE_SIZE)
}

fn watch<K, F>(client: &Client, kind: &'static str, wrap: F) -> BoxStream<'static, Change>
where
    K: Watched,
    F: Fn(Event<K>) -> Change + Send + 'static,
{
    watch_trimmed(client, kind, wrap, drop_managed_fields)
}

/// The watch of one kind, each object trimmed by `trim` before it is applied.
fn watch_trimmed<K, F>(
    client: &Client,
    kind: &'static str,
    wrap: F,
    trim: fn(&mut K),
) -> BoxStream<'static, Change>
where
    K: Watched,
    F: Fn(Event<K>) -> Change + Send + 'static,
{
    let api: Api<K> = Api::all(client.clone());
    watcher::watcher(api, watch_config())
        .default_backoff()
        .map(move |r| match r {
            Ok(e) => wrap(e.modify(trim)),
            Err(e) => Change::WatchError(kind, e.to_string()),
        })
        .boxed()
}

/// DeviceTaintRules in the version the API server serves them in, read as `v1`. A rule
/// that cannot be read is a watch error that names it (the others still apply).
fn watch_taint_rules(client: &Client, version: &str) -> BoxStream<'static, Change> {
    let resource = apis::taint_rule_resource(version);
    let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
    watcher::watcher(api, watch_config())
        .default_backoff()
        .map(|r| {
            let event = match r {
                Ok(e) => e.modify(drop_managed_fields),
                Err(e) => return Change::WatchError("DeviceTaintRule", e.to_string()),
            };
            let read = |o| match apis::taint_rule(o) {
                Ok((rule, warning)) => {
                    if let Some(warning) = warning {
                        tracing::warn!("{warning}");
                    }
                    Ok(rule)
                }
                Err(e) => Err(e),
            };
            let converted = match event {
                Event::Apply(o) => read(o).map(Event::Apply),
                Event::Delete(o) => read(o).map(Event::Delete),
                Event::InitApply(o) => read(o).map(Event::InitApply),
                Event::Init => Ok(Event::Init),
                Event::InitDone => Ok(Event::InitDone),
            };
            match converted {
                Ok(event) => Change::TaintRule(event),
                Err(message) => Change::WatchError("DeviceTaintRule", message),
            }
        })
        .boxed()
}

/// One stream of every kind's changes; each kind re-lists by itself after a failure.
fn watch_all(client: &Client, served: &apis::ServedApis) -> SelectAll<BoxStream<'static, Change>> {
    let taint_rules = served.taint_rules.map(|version| match version {
        "v1" => watch(client, "DeviceTaintRule", Change::TaintRule),
        older => watch_taint_rules(client, older),
    });
    futures::stream::select_all(
        [
            watch(client, "Namespace", Change::Namespace),
            watch(client, "Node", Change::Node),
            watch_trimmed(client, "Pod", Change::Pod, trim_pod),
            watch(client, "ResourceClaim", Change::Claim),
            watch(client, "DeviceClass", Change::Class),
            watch(client, "ResourceSlice", Change::Slice),
        ]
        .into_iter()
        .chain(taint_rules)
        .chain(storage::watches(client))
        .chain(workloads::watches(client))
        .chain(served.pod_groups.then(|| groups::watch(client)))
        .chain([preemption::watch(client)]),
    )
}

/// The number of kinds `watch_all` watches: readiness waits for each to sync.
fn watched_kinds(served: &apis::ServedApis) -> usize {
    KINDS.len()
        + usize::from(served.taint_rules.is_some())
        + storage::KINDS.len()
        + workloads::KINDS.len()
        + usize::from(served.pod_groups)
        + 1 // PodDisruptionBudget
}

/// Discovery of what the API server serves, retried while the server cannot answer;
/// an error when it answers without what the scheduler needs; `None` at shutdown.
async fn discover_apis(
    client: &Client,
    shutdown: &Shutdown,
) -> anyhow::Result<Option<apis::ServedApis>> {
    let mut backoff = Duration::from_millis(500);
    loop {
        let attempt = tokio::select! {
            attempt = apis::ServedApis::discover(client) => attempt,
            () = shutdown.requested() => return Ok(None),
        };
        match attempt {
            Ok(served) => return Ok(Some(served)),
            Err(apis::DiscoveryError::Unsupported(message)) => anyhow::bail!(message),
            Err(e) => tracing::warn!(error = %e, retry_in = ?backoff, "API discovery failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            () = shutdown.requested() => return Ok(None),
        }
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
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
    let condition = outcome.is_err().then(|| {
        serde_json::json!({
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": note,
        })
    });
    notify(
        &metrics,
        &recorder,
        &reference,
        (type_, reason, "Scheduling", note),
    )
    .await;
    if let Some(condition) = condition {
        set_condition(client, &metrics, &pod, condition).await;
    }
}

/// Publish an event about a pod: its type, reason, action and note.
async fn notify(
    metrics: &Metrics,
    recorder: &Recorder,
    reference: &ObjectReference,
    (type_, reason, action, note): (EventType, &str, &str, String),
) {
    let event = KubeEvent {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = metrics
        .write_unthrottled("create", "events", recorder.publish(&event, reference))
        .await
    {
        tracing::warn!(pod = ?reference.name, error = %e, "could not publish event");
    }
}

/// Write one condition of the pod's status (a strategic merge by type).
async fn set_condition(
    client: Client,
    metrics: &Metrics,
    pod: &ObjectKey,
    condition: serde_json::Value,
) {
    let pods: Api<Pod> = Api::namespaced(client, &pod.namespace);
    let kind = condition["type"].as_str().unwrap_or_default().to_string();
    let patch = serde_json::json!({"status": {"conditions": [condition]}});
    if let Err(e) = metrics
        .write(
            "patch",
            "pods/status",
            pods.patch_status(&pod.name, &PatchParams::default(), &Patch::Strategic(patch)),
        )
        .await
    {
        tracing::debug!(%pod, error = %e, condition = %kind, "could not update the pod's condition");
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

    /// An event about the pod, and a condition of its status when given.
    fn note(
        &self,
        pod: ObjectKey,
        uid: Option<String>,
        event: (EventType, &'static str, &'static str, String),
        condition: Option<serde_json::Value>,
    ) {
        let (client, metrics, recorder) = (
            self.client.clone(),
            self.metrics.clone(),
            self.recorder.clone(),
        );
        tokio::spawn(async move {
            let reference = pod_reference(&pod, uid.as_deref());
            notify(&metrics, &recorder, &reference, event).await;
            if let Some(condition) = condition {
                set_condition(client, &metrics, &pod, condition).await;
            }
        });
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

/// The client configuration for a kubeconfig file, else in-cluster, then KUBECONFIG, then
/// ~/.kube/config.
pub async fn kube_config(path: Option<&std::path::Path>) -> anyhow::Result<kube::Config> {
    Ok(match path {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig: not in a cluster, no KUBECONFIG, no ~/.kube/config")?,
    })
}

/// The daemon's API clients, each on a connection of its own. Both that write ask the
/// fence before every attempt ([`transport::FenceLayer`]).
struct Clients {
    /// Every write but evictions, with kube's retries of 429, 503 and 504 (backing off,
    /// as client-go does).
    writes: Client,
    /// Discovery and the informers' lists and watches, apart from the writes: a burst's
    /// watch events then share no connection with the binder's requests and responses.
    watches: Client,
    /// Evictions, without retries: their 429 is a PodDisruptionBudget's refusal to be
    /// tried again later, not the server's load.
    evictions: Client,
    /// The leader Lease, outside the fence (its renewals are what open it) and without
    /// retries (the candidate tries again every retry period; a renewal retried past the
    /// renew deadline would be worth nothing).
    lease: Client,
}

async fn clients_for(config: &Config, fence: &Arc<Fence>) -> anyhow::Result<Clients> {
    let kube_config = kube_config(config.kubeconfig.as_deref()).await?;
    let mut no_retry = kube_config.clone();
    no_retry.default_retry = false;
    Ok(Clients {
        writes: transport::client(kube_config.clone(), Some(fence.clone()))?,
        watches: transport::client(kube_config, None)?,
        evictions: transport::client(no_retry.clone(), Some(fence.clone()))?,
        lease: transport::client(no_retry, None)?,
    })
}

/// How long a pod's first try may search for devices. Almost every pod is decided well
/// within it; one that is not gets its whole budget (`filterTimeout`) on a fork of the
/// engine in a long-search lane, while the worker goes on with the pods behind it.
const FIRST_TRY: Duration = Duration::from_millis(500);

/// One scheduling attempt, run on a blocking thread with the engine handed over, so that
/// the event loop keeps turning while it searches.
struct Attempt {
    engine: Engine,
    work: Work,
    outcome: Outcome,
    elapsed: f64,
    /// For work whose first try ran out of time: a fork of the engine to search on.
    fork: Option<Engine>,
    /// For a pod that fits nowhere: whom to preempt where, or why nobody.
    preemption: Option<Result<Preemption, String>>,
    /// The same for a PodGroup that cannot be placed.
    group_preemption: Option<Result<GroupPreemption, String>>,
    /// For a pod placed on a lower-ranked subrequest: the better device a terminating pod
    /// holds, to wait for instead.
    handoff: Option<dra_engine::Handoff>,
}

/// What a preemption search needs besides the engine, shared with the worker.
struct PreemptionInputs {
    pdbs: Arc<Vec<k8s_openapi::api::policy::v1::PodDisruptionBudget>>,
    groups: Arc<Vec<k8s_openapi::api::scheduling::v1beta1::PodGroup>>,
}

/// The engine's answer for a pod, or for a PodGroup's members.
enum Outcome {
    Pod(Decision),
    Group(GroupDecision),
}

fn run_attempt(
    mut engine: Engine,
    work: Work,
    cancel: Arc<AtomicBool>,
    inputs: Option<PreemptionInputs>,
    check: Option<handoff::Check>,
) -> Attempt {
    let started = Instant::now();
    let budget = engine.config().filter_timeout;
    let first_try = FIRST_TRY.min(budget);
    let outcome = decide(&mut engine, &work, first_try, &cancel);
    let (mut preemption, mut group_preemption, mut handoff) = (None, None, None);
    match (&work, &outcome, inputs) {
        (Work::Pod(key), Outcome::Pod(Decision::Scheduled(placement)), _) => {
            if let Some((owners, releasing)) = check {
                handoff = guarded(
                    &mut engine,
                    key,
                    |engine| engine.handoff_with(placement, owners, first_try, &releasing),
                    |_| None,
                );
            }
        }
        (Work::Pod(key), Outcome::Pod(Decision::Unschedulable { .. }), Some(inputs)) => {
            preemption = Some(preempt(&mut engine, key, first_try, &inputs));
        }
        (
            Work::Group { group, members },
            Outcome::Group(GroupDecision::Unschedulable { .. }),
            Some(inputs),
        ) => {
            let key = ObjectKey::of(&group.metadata);
            group_preemption = Some(guarded(
                &mut engine,
                &key,
                |engine| {
                    engine.preempt_group(group, members, first_try, &inputs.pdbs, &inputs.groups)
                },
                Err,
            ));
        }
        _ => {}
    }
    let elapsed = started.elapsed().as_secs_f64();
    let out_of_time = match &outcome {
        Outcome::Pod(decision) => matches!(decision, Decision::OutOfTime { .. }),
        // A group's search says so in its message; one that used its whole first try
        // gets the whole budget.
        Outcome::Group(decision) => {
            !matches!(decision, GroupDecision::Scheduled(_)) && elapsed >= first_try.as_secs_f64()
        }
    };
    let fork = (out_of_time && first_try < budget).then(|| engine.fork());
    Attempt {
        engine,
        work,
        outcome,
        elapsed,
        fork,
        preemption,
        group_preemption,
        handoff,
    }
}

/// PostFilter: whom to preempt so that the pod fits (the search has the first try's
/// budget, on the worker; a panic in it is the pod's error, as for any attempt).
fn preempt(
    engine: &mut Engine,
    key: &ObjectKey,
    budget: Duration,
    inputs: &PreemptionInputs,
) -> Result<Preemption, String> {
    guarded(
        engine,
        key,
        |engine| engine.preempt_with_groups(key, budget, &inputs.pdbs, &inputs.groups),
        Err,
    )
}

/// Work whose first try ran out of time, waiting for a long-search lane.
struct LongWaiting {
    work: Work,
    fork: Engine,
    /// How long the first try took, in seconds: part of the attempt.
    first_try: f64,
}

/// A search with the whole budget, on a fork of the engine.
struct LongSearch {
    work: Work,
    outcome: Outcome,
    /// Both tries, in seconds (the wait for the lane aside): the attempt's duration.
    elapsed: f64,
    /// When the fork was made, to check its decision on the engine ([`Engine::admit`]).
    forked_at: u64,
}

fn run_long_search(waiting: LongWaiting, cancel: Arc<AtomicBool>) -> LongSearch {
    let LongWaiting {
        work,
        mut fork,
        first_try,
    } = waiting;
    let started = Instant::now();
    let budget = fork.config().filter_timeout;
    let outcome = decide(&mut fork, &work, budget, &cancel);
    LongSearch {
        forked_at: fork.forked_at().unwrap_or_default(),
        work,
        outcome,
        elapsed: first_try + started.elapsed().as_secs_f64(),
    }
}

/// The engine's decision; a panic in it is caught and reported on the pod (every member
/// of a group), and the scheduler keeps running.
fn decide(engine: &mut Engine, work: &Work, budget: Duration, cancel: &AtomicBool) -> Outcome {
    match work {
        Work::Pod(key) => Outcome::Pod(guarded(
            engine,
            key,
            |engine| engine.schedule_within(key, budget, Some(cancel)),
            |message| Decision::Error {
                pod: key.clone(),
                message,
            },
        )),
        Work::Group { group, members } => {
            let key = ObjectKey::of(&group.metadata);
            Outcome::Group(guarded(
                engine,
                &key,
                |engine| engine.schedule_group_with(group, members, budget, Some(cancel)),
                |message| GroupDecision::Error {
                    group: key.clone(),
                    message,
                },
            ))
        }
    }
}

/// Runs one attempt; a panic in it becomes an error decision (`failed`) for what it
/// decides (`what`).
fn guarded<T>(
    engine: &mut Engine,
    what: &ObjectKey,
    attempt: impl FnOnce(&mut Engine) -> T,
    failed: impl FnOnce(String) -> T,
) -> T {
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| attempt(&mut *engine)));
    outcome.unwrap_or_else(|panic| {
        // The cycle does not change the state, only the allocator's view, which is rebuilt.
        engine.state_mut();
        let what_panicked = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        tracing::error!(pod = %what, panic = %what_panicked, "internal error in a scheduling attempt; backing off");
        failed(format!(
            "internal error in dra-scheduler while scheduling this pod ({what_panicked}); it will be retried, please report it"
        ))
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
    let shutdown = Shutdown::listen();
    let fence = Arc::new(
        config
            .leader_election
            .as_ref()
            .map_or_else(Fence::open, Fence::elected),
    );
    let clients = clients_for(&config, &fence).await?;
    let candidate = config
        .leader_election
        .as_ref()
        .map(|le| Candidate::new(clients.lease.clone(), le, identity(), fence.clone()));
    let (done_tx, done_rx) = mpsc::unbounded_channel::<Done>();
    let mut daemon = Daemon::new(&config, clients.writes, fence, done_tx).await?;
    daemon.eviction_client = Some(clients.evictions);
    let Some(served) = discover_apis(&clients.watches, &shutdown).await? else {
        tracing::info!("shut down before API discovery succeeded");
        return Ok(());
    };
    tracing::info!("{}", served.describe());
    daemon.watched_kinds = watched_kinds(&served);
    // Leader election: every replica keeps its caches warm; only the leader takes pods
    // from the queue, and only while its fence is open. A standby that takes over has
    // never assumed anything, so its state is what the API server says (claim status is
    // the source of truth).
    daemon.leading = candidate.is_none();
    let (election, leader) = Election::start(candidate, &config);
    daemon.metrics.leader.set(i64::from(daemon.leading));
    let mut events = Events {
        changes: watch_all(&clients.watches, &served),
        done: done_rx,
        leader,
        tick: tokio::time::interval(Duration::from_millis(200)),
        shutdown: Box::pin(async move { shutdown.requested().await }),
    };
    let ending = daemon.serve(&mut events).await?;
    daemon.stop(ending, election).await
}

/// Where the daemon's events come from, apart from its own workers.
struct Events {
    changes: SelectAll<BoxStream<'static, Change>>,
    /// Binding tasks' reports.
    done: mpsc::UnboundedReceiver<Done>,
    /// Leadership changes; `None` when leader election is off.
    leader: Option<signal::Receiver<bool>>,
    tick: tokio::time::Interval,
    shutdown: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

/// The leader election task, when leader election is on.
struct Election {
    stop: signal::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Election {
    /// Campaigns for the Lease when there is a candidate; the receiver says whether this
    /// replica leads.
    fn start(
        candidate: Option<Candidate>,
        config: &Config,
    ) -> (Election, Option<signal::Receiver<bool>>) {
        let (stop, stop_rx) = signal::channel(false);
        let Some(candidate) = candidate else {
            return (Election { stop, task: None }, None);
        };
        let le = config
            .leader_election
            .as_ref()
            .expect("a candidate has its settings");
        tracing::info!(lease = %format!("{}/{}", le.lease_namespace, le.lease_name), "waiting to become the leader");
        let (tx, rx) = signal::channel(false);
        let task = tokio::spawn(candidate.run(tx, stop_rx));
        (
            Election {
                stop,
                task: Some(task),
            },
            Some(rx),
        )
    }

    /// The election task releases the Lease (if still held), so a standby takes over at once.
    async fn stop(self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }
}

/// The live scheduler between two events: the engine (here, or with the worker while an
/// attempt runs), the queue, what is in flight, and the handles it writes through. The loop
/// in [`Daemon::serve`] waits for the next event and hands it to the method for its kind;
/// each method decides what to do and starts any write as a task of its own.
struct Daemon {
    client: Client,
    /// How many kinds the informers watch (what the API server serves decides).
    watched_kinds: usize,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    ready: Arc<AtomicBool>,
    fence: Arc<Fence>,
    /// The engine is here, or with the worker while an attempt runs.
    engine: Option<Engine>,
    running: Option<Running<Attempt>>,
    /// The long-search lanes ([`LONG_LANES`]): searches beyond them wait with their forks.
    long: Vec<(usize, Running<LongSearch>)>,
    long_waiting: VecDeque<LongWaiting>,
    /// Changes that arrived while the engine was with the worker, in arrival order.
    deferred: Vec<Change>,
    queue: SchedulingQueue,
    book: Bookkeeping,
    /// PodGroups, and why members wait without an attempt (for the report when overdue).
    groups: PodGroups,
    group_waits: HashMap<ObjectKey, String>,
    /// PodDisruptionBudgets, for preemption; `preemption` says whether it is on.
    budgets: Budgets,
    preemption: bool,
    /// Pods waiting for a better device a terminating pod holds.
    handoffs: handoff::Waits,
    /// Degraded pods, the round that looks for them, and upgrades.
    degraded: degraded::DegradedPods,
    degraded_round: Option<Running<Vec<dra_engine::Degradation>>>,
    /// The device counts for the `devices` gauge, made on a thread of their own every
    /// [`INVENTORY_EVERY`] from a copy of the DRA objects.
    inventory: Option<Running<dra_engine::inventory::Counts>>,
    next_inventory: Instant,
    /// Namespaces and owners the degraded gauge has had.
    degraded_owners: BTreeSet<(String, String)>,
    /// The client for evictions (no retries of 429); the main one where none is set.
    eviction_client: Option<Client>,
    scheduler_name: String,
    user: Tell,
    informers: Informers,
    leading: bool,
    done: mpsc::UnboundedSender<Done>,
    bindings: bindings::Bindings,
    /// Who holds each device, from the claim informer: the binder's first-writer check
    /// and the report of doubled devices.
    owners: Arc<owners::DeviceOwners>,
}

/// The engine, which is here between attempts (the callers' guards check it).
fn here(engine: &mut Option<Engine>) -> &mut Engine {
    engine
        .as_mut()
        .expect("the engine is here between attempts")
}

impl Daemon {
    async fn new(
        config: &Config,
        client: Client,
        fence: Arc<Fence>,
        done: mpsc::UnboundedSender<Done>,
    ) -> anyhow::Result<Daemon> {
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
        serve_endpoints(config, &metrics, &ready, &health).await?;
        let user = Tell {
            client: client.clone(),
            metrics: metrics.clone(),
            recorder: Arc::new(recorder(&client, config)),
            told: HashMap::new(),
        };
        let owners: Arc<owners::DeviceOwners> = Arc::default();
        Ok(Daemon {
            watched_kinds: watched_kinds(&apis::ServedApis::current()),
            engine: Some(engine_for(config)),
            running: None,
            long: Vec::new(),
            long_waiting: VecDeque::new(),
            deferred: Vec::new(),
            queue: SchedulingQueue::default(),
            book: Bookkeeping::default(),
            groups: PodGroups::default(),
            group_waits: HashMap::new(),
            budgets: Budgets::default(),
            preemption: config.preemption,
            handoffs: handoff::Waits::new(config.handoff.clone()),
            degraded: degraded::DegradedPods::new(config.degraded.clone()),
            degraded_round: None,
            degraded_owners: BTreeSet::new(),
            inventory: None,
            next_inventory: Instant::now(),
            eviction_client: None,
            scheduler_name: config.scheduler_name.clone(),
            informers: Informers::default(),
            leading: false,
            bindings: bindings::Bindings::new(
                client.clone(),
                metrics.clone(),
                owners.clone(),
                config.max_concurrent_binds,
            ),
            owners,
            client,
            metrics,
            health,
            ready,
            fence,
            user,
            done,
        })
    }

    /// Waits for events and handles each, until the scheduler should stop.
    async fn serve(&mut self, events: &mut Events) -> anyhow::Result<Ending> {
        loop {
            let ending = tokio::select! {
                Some(change) = events.changes.next() => { self.on_change(change); None }
                Some(done) = events.done.recv(), if self.engine.is_some() => {
                    self.on_binding_done(done);
                    None
                }
                finished = joined(&mut self.running), if self.running.is_some() => {
                    self.on_attempt_finished(finished)?;
                    None
                }
                (lane, finished) = joined_any(&mut self.long), if !self.long.is_empty() && self.engine.is_some() => {
                    self.on_long_search_finished(lane, finished)?;
                    None
                }
                counted = joined(&mut self.inventory), if self.inventory.is_some() => {
                    self.inventory = None;
                    match counted {
                        Ok(counts) => self.metrics.set_devices(&counts),
                        Err(e) => tracing::error!(error = %e, "counting devices failed"),
                    }
                    None
                }
                found = joined(&mut self.degraded_round), if self.degraded_round.is_some() => {
                    self.on_degraded_round(found);
                    None
                }
                change = leadership_change(&mut events.leader) => self.on_leadership(change)?,
                _ = events.tick.tick() => { self.on_tick(); None }
                _ = &mut events.shutdown => {
                    tracing::info!("shutting down: no new pods; waiting for bindings in flight");
                    Some(Ending::Shutdown)
                }
            };
            if let Some(ending) = ending.or_else(|| self.after_event()) {
                return Ok(ending);
            }
        }
    }

    /// After every event: the health beat, the fence, and new work for idle lanes.
    fn after_event(&mut self) -> Option<Ending> {
        let now = Instant::now();
        self.health.beat(now);
        // Whatever the election task believes: no renewal within the deadline, no leading.
        if self.leading && !self.fence.may_schedule(now) {
            return Some(Ending::LostLease);
        }
        if self.informers.synced.len() < self.watched_kinds {
            return None;
        }
        self.ready.store(true, Ordering::Relaxed);
        if !self.leading {
            return None;
        }
        self.start_long_search(now);
        self.start_attempt(now);
        if self.user.told.len() > 64 && self.user.told.len() > 2 * self.queue.len() {
            self.user.told.retain(|pod, _| self.queue.contains(pod));
        }
        self.metrics.set_pending(self.queue.lengths());
        None
    }

    /// A change from an informer: applied now, or once the engine is back from the worker.
    /// Who holds which device is taken in at once, engine or not: a binding waits for it.
    fn on_change(&mut self, change: Change) {
        if let Change::Claim(event) = &change {
            let doubled = self.owners.observe(event);
            self.tell_doubled(doubled);
        }
        match self.engine.as_mut() {
            Some(engine) => apply(
                engine,
                &mut self.queue,
                &mut self.book,
                (&mut self.informers, &mut self.groups, &mut self.budgets),
                change,
            ),
            None => self.deferred.push(change),
        }
    }

    /// Devices that a new allocation made doubled: counted, and told on the pods of both
    /// claims (by the leader, which may write), naming the device and the other claim.
    fn tell_doubled(&self, doubled: Vec<owners::Doubled>) {
        self.metrics
            .doubled_devices
            .set(self.owners.doubled_devices() as i64);
        for d in doubled {
            tracing::warn!(device = %d.device, first = %d.first.claim, second = %d.second.claim, "a device is allocated to two claims: the second was written by another scheduler after the first");
            if !self.leading {
                continue;
            }
            let tell = |holder: &owners::Holder, other: &owners::Holder, order: &str| {
                for pod in &holder.pods {
                    let note = format!(
                        "device {} of ResourceClaim {} is also allocated to ResourceClaim {}, whose allocation was written {order} this one's: two pods may use the device at once",
                        d.device, holder.claim, other.claim
                    );
                    self.user.note(
                        ObjectKey::new(holder.claim.namespace.clone(), pod.clone()),
                        None,
                        (EventType::Warning, "DoubledDevice", "Allocating", note),
                        None,
                    );
                }
            };
            tell(&d.first, &d.second, "after");
            tell(&d.second, &d.first, "before");
        }
    }

    /// The worker is done with a pod: take its decision (or send the pod to the long-search
    /// lane), then the changes that waited for the engine.
    fn on_attempt_finished(
        &mut self,
        finished: Result<Attempt, tokio::task::JoinError>,
    ) -> anyhow::Result<()> {
        self.running = None;
        self.health.attempt_finished(Lane::Main, Instant::now());
        let attempt = finished.context("the scheduling worker was lost")?;
        self.engine = Some(attempt.engine);
        if let Some(fork) = attempt.fork {
            tracing::info!(work = %attempt.work, "the first try ran out of time: searching with the whole budget while other pods go on");
            self.long_waiting.push_back(LongWaiting {
                work: attempt.work,
                fork,
                first_try: attempt.elapsed,
            });
        } else if self.leading {
            match (attempt.work, attempt.outcome) {
                (Work::Pod(key), Outcome::Pod(Decision::Scheduled(placement)))
                    if attempt.handoff.is_some() =>
                {
                    let handoff = attempt.handoff.expect("checked");
                    self.wait_for_handoff(key, placement, handoff, attempt.elapsed);
                }
                (Work::Pod(key), Outcome::Pod(decision)) => {
                    self.decided(key, decision, attempt.elapsed, attempt.preemption)
                }
                (Work::Group { members, .. }, Outcome::Group(decision)) => self.group_decided(
                    &members,
                    decision,
                    attempt.elapsed,
                    attempt.group_preemption,
                ),
                (work, outcome) => self.outcome(work, outcome, attempt.elapsed),
            }
        } else {
            self.back_off(&attempt.work);
        }
        for change in std::mem::take(&mut self.deferred) {
            self.on_change(change);
        }
        Ok(())
    }

    fn on_long_search_finished(
        &mut self,
        lane: usize,
        finished: Result<LongSearch, tokio::task::JoinError>,
    ) -> anyhow::Result<()> {
        self.health
            .attempt_finished(Lane::Long(lane), Instant::now());
        let search = finished.context("the long-search lane was lost")?;
        if self.leading {
            self.decided_on_fork(search);
        } else {
            self.back_off(&search.work);
        }
        Ok(())
    }

    fn on_leadership(&mut self, change: Option<bool>) -> anyhow::Result<Option<Ending>> {
        match change {
            Some(true) if !self.leading => {
                tracing::info!("became the leader: scheduling");
                self.leading = true;
                self.metrics.leader.set(1);
            }
            Some(true) => {}
            Some(false) | None if self.leading => return Ok(Some(Ending::LostLease)),
            Some(false) => {}
            None => anyhow::bail!("leader election stopped"),
        }
        Ok(None)
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
        self.queue.flush_backoff(now);
        self.queue.flush_unschedulable(now);
        for pod in self.handoffs.due(now) {
            tracing::info!(%pod, "handoff wait bound passed: placing the pod on the best device free now");
            self.queue.pod_updated(&pod);
        }
        self.metrics
            .set_unschedulable(&self.queue.unschedulable_by_plugin());
        if self.leading {
            self.start_degraded_round(now);
        }
        self.start_inventory(now);
        // A claim that has not appeared for a while is worth telling the user about.
        if let Some(engine) = self.engine.as_ref() {
            let (state, group_waits) = (engine.state(), &self.group_waits);
            let after = |pod: &ObjectKey| match group_waits.contains_key(pod) {
                true => GATED_REPORT_AFTER,
                false => report_after(state.pod(pod)),
            };
            for pod in self.queue.overdue_gated(now, after) {
                let waits = self.group_waits.get(&pod).cloned();
                if let Some(message) = engine.claims_missing(&pod).or(waits) {
                    let uid = engine
                        .state()
                        .pods
                        .get(&pod)
                        .and_then(|p| p.metadata.uid.clone());
                    self.user.failed(pod, uid, message);
                }
            }
        }
    }

    /// Starts searches with the whole budget while a lane is free.
    fn start_long_search(&mut self, now: Instant) {
        while let Some(lane) = (0..LONG_LANES).find(|l| self.long.iter().all(|(x, _)| x != l))
            && let Some(waiting) = self.long_waiting.pop_front()
        {
            self.health.attempt_started(Lane::Long(lane), now);
            let search = Running::spawn(move |cancel| run_long_search(waiting, cancel));
            self.long.push((lane, search));
        }
    }

    /// Hands the engine to the worker with the next pod, when the worker is idle.
    fn start_attempt(&mut self, now: Instant) {
        if self.running.is_some() {
            return;
        }
        let Some(engine) = self.engine.take() else {
            return;
        };
        match self.next_work(&engine, now) {
            Some(work) => {
                self.health.attempt_started(Lane::Main, now);
                let inputs = self.preemption.then(|| PreemptionInputs {
                    pdbs: self.budgets.all(),
                    groups: self.groups.all(),
                });
                let check = match &work {
                    Work::Pod(key) => self.handoffs.check_for(key, engine.state().pod(key), now),
                    Work::Group { .. } => None,
                };
                self.running = Some(Running::spawn(move |cancel| {
                    run_attempt(engine, work, cancel, inputs, check)
                }));
            }
            None => self.engine = Some(engine),
        }
    }

    /// The next pod from the queue, with its PodGroup's waiting members if it names one.
    /// Pods waiting for their claims, or for their PodGroup and its members, are gated.
    fn next_work(&mut self, engine: &Engine, now: Instant) -> Option<Work> {
        while let Some(key) = self.queue.pop() {
            if self.book.in_flight.contains_key(&key) {
                continue;
            }
            if engine.claims_missing(&key).is_some() {
                let wake = engine
                    .claim_awaited(&key)
                    .map_or(Wake::OwnUpdate, Wake::Claim);
                self.queue.gate(&key, now, wake);
                continue;
            }
            let in_flight = |k: &ObjectKey| self.book.in_flight.contains_key(k);
            match self
                .groups
                .work_for(engine, &mut self.queue, &in_flight, key.clone())
            {
                Ok(work) => {
                    self.group_waits.remove(&key);
                    return Some(work);
                }
                Err(why) => {
                    self.queue.gate(&key, now, Wake::AnyChange);
                    self.group_waits.insert(key, why);
                }
            }
        }
        None
    }

    /// Every pod of the work backs off.
    fn back_off(&mut self, work: &Work) {
        for pod in work.pods() {
            self.queue.backoff(&pod, Instant::now());
        }
    }

    /// Take a decision made by the worker (the engine is back).
    fn decided(
        &mut self,
        key: ObjectKey,
        decision: Decision,
        elapsed: f64,
        preemption: Option<Result<Preemption, String>>,
    ) {
        let engine = here(&mut self.engine);
        self.metrics
            .search_steps
            .observe(engine.last_search_steps() as f64);
        let uid = engine
            .state()
            .pods
            .get(&key)
            .and_then(|p| p.metadata.uid.clone());
        let result = match &decision {
            Decision::Scheduled(_) => "scheduled",
            Decision::Unschedulable { .. } | Decision::OutOfTime { .. } => "unschedulable",
            Decision::Error { .. } => "error",
        };
        self.metrics
            .attempts
            .with_label_values(&[result])
            .observe(elapsed);
        // One line per decision: a placement's once its binding is done (`bound`,
        // `binding_failed`).
        match &decision {
            Decision::Scheduled(_) => {}
            Decision::Unschedulable { pod, message, .. } | Decision::OutOfTime { pod, message } => {
                tracing::info!(%pod, attempt_seconds = elapsed, reason = %message, "pod is unschedulable")
            }
            Decision::Error { pod, message } => {
                tracing::warn!(%pod, attempt_seconds = elapsed, error = %message, "scheduling attempt failed; backing off")
            }
        }
        match decision {
            Decision::Scheduled(placement) => self.scheduled(key, placement, elapsed),
            Decision::Unschedulable {
                pod,
                message,
                rejected_by,
            } => {
                let message = self.with_preemption(&pod, message, preemption);
                self.unschedulable(pod, uid, message, rejected_by)
            }
            Decision::OutOfTime { pod, message } => {
                self.unschedulable(pod, uid, message, BTreeSet::new())
            }
            Decision::Error { pod, message } => {
                self.queue.backoff(&pod, Instant::now());
                self.user.failed(pod, uid, message);
            }
        }
    }

    /// Assume the placement and start writing it.
    fn scheduled(&mut self, key: ObjectKey, placement: Placement, attempt_seconds: f64) {
        if let Some(outcome) = self.handoffs.placed(&placement, Instant::now()) {
            tracing::info!(pod = %key, outcome, "handoff wait ended");
            self.metrics
                .handoff_waits
                .with_label_values(&[outcome])
                .inc();
            self.metrics.handoff_waiting.set(self.handoffs.len() as i64);
        }
        if placement.claims.iter().any(|c| c.allocation.is_some()) {
            self.metrics
                .allocation_latency
                .observe(placement.allocation_time.as_secs_f64());
        }
        here(&mut self.engine).assume(&placement);
        // The pod counts from now on for others' pod affinity and spread.
        self.queue
            .cluster_event(ClusterEvent::AssignedPodAdded, Instant::now());
        self.book.in_flight.insert(key.clone(), placement.clone());
        self.metrics.in_flight.set(self.book.in_flight.len() as i64);
        let timing = Timing {
            queued: self.queue.added_at(&key),
            attempt_seconds,
        };
        self.bindings
            .spawn(vec![(placement, timing)], false, self.done.clone());
    }

    fn unschedulable(
        &mut self,
        pod: ObjectKey,
        uid: Option<String>,
        message: String,
        rejected_by: BTreeSet<&'static str>,
    ) {
        self.queue.unschedulable(&pod, Instant::now(), rejected_by);
        // A claim allocated for this pod that keeps it where it cannot go (e.g. allocated
        // before a restart) is given back; the claim's update then retries the pod.
        if let (Some(claim), Some(uid)) = (here(&mut self.engine).claim_to_release(&pod), &uid) {
            self.release_claim(pod.clone(), claim, uid.clone());
        }
        self.user.failed(pod, uid, message);
    }

    /// The pod's placement takes a worse device than a terminating pod holds: it waits
    /// for that device (parked as unschedulable; the holder's release retries it), telling
    /// the user once what it waits for.
    fn wait_for_handoff(
        &mut self,
        key: ObjectKey,
        placement: Placement,
        handoff: dra_engine::Handoff,
        elapsed: f64,
    ) {
        let now = Instant::now();
        self.metrics
            .attempts
            .with_label_values(&["waiting"])
            .observe(elapsed);
        if let Some(started) =
            self.handoffs
                .wait(&handoff, now, k8s_openapi::jiff::Timestamp::now())
        {
            tracing::info!(pod = %key, instead_of = %placement.node, reason = %started.message, "pod waits for a better device");
            self.user.note(
                key.clone(),
                placement.pod_uid.clone(),
                (
                    EventType::Normal,
                    "WaitingForDevice",
                    "Scheduling",
                    started.message,
                ),
                None,
            );
        }
        self.metrics.handoff_waiting.set(self.handoffs.len() as i64);
        self.queue
            .unschedulable(&key, now, BTreeSet::from(["DynamicResources"]));
    }

    /// Every [`INVENTORY_EVERY`], once synced: count the devices per node, class and state
    /// (the class selectors are evaluated per device, so not on the event loop).
    fn start_inventory(&mut self, now: Instant) {
        if self.inventory.is_some()
            || now < self.next_inventory
            || self.informers.synced.len() < self.watched_kinds
        {
            return;
        }
        let Some(engine) = self.engine.as_ref() else {
            return;
        };
        self.next_inventory = now + INVENTORY_EVERY;
        // Who holds each device, not the claims: copying every claim here for the count
        // was the largest transient in benches/e2e's heap profile.
        let sources = dra_engine::inventory::Sources::of(engine.state());
        self.inventory = Some(Running::spawn(move |_| {
            dra_engine::inventory::Inventory::counts_of(&sources)
        }));
    }

    /// Every `degraded.intervalSeconds`: upgrades that are due, then a search for degraded
    /// pods on a fork of the engine (on a thread of its own).
    fn start_degraded_round(&mut self, now: Instant) {
        if self.degraded_round.is_some() {
            return;
        }
        let Some(engine) = self.engine.as_ref() else {
            return;
        };
        let abandoned = self.handoffs.forget(|k| {
            engine
                .state()
                .pods
                .get(k)
                .is_some_and(|p| dra_engine::state::bound_node(p).is_none())
        });
        if abandoned > 0 {
            self.metrics
                .handoff_waits
                .with_label_values(&["abandoned"])
                .inc_by(abandoned as u64);
            self.metrics.handoff_waiting.set(self.handoffs.len() as i64);
        }
        if !self.degraded.round_due(now) {
            return;
        }
        self.upgrade(now);
        let engine = here(&mut self.engine);
        if !engine.may_have_degraded() && !self.degraded.any() {
            return;
        }
        let fork = engine.fork();
        self.degraded_round = Some(Running::spawn(move |_| fork.degraded(FIRST_TRY)));
    }

    /// Evict the degraded pods whose upgrade is due.
    fn upgrade(&mut self, now: Instant) {
        let engine = here(&mut self.engine);
        let state = engine.state();
        let terminating = |k: &ObjectKey| {
            state
                .pods
                .get(k)
                .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
        };
        let busy = |namespace: &str, owner: &str| {
            state.pods.iter().any(|(k, p)| {
                k.namespace == namespace
                    && dra_engine::state::bound_node(p).is_none()
                    && dra_engine::handoff::owner_of(p, state).as_deref() == Some(owner)
            })
        };
        for upgrade in self.degraded.upgrades(now, terminating, busy) {
            tracing::info!(pod = %upgrade.pod, owner = %upgrade.owner, reason = %upgrade.message, "evicting a degraded pod for an upgrade");
            let client = self.eviction_client.clone().unwrap_or(self.client.clone());
            let metrics = self.metrics.clone();
            self.user.note(
                upgrade.pod.clone(),
                upgrade.uid.clone(),
                (
                    EventType::Normal,
                    "UpgradeEviction",
                    "Evicting",
                    upgrade.message.clone(),
                ),
                None,
            );
            tokio::spawn(async move {
                let result =
                    binder::evict(&client, &metrics, &upgrade.pod, upgrade.uid.as_deref()).await;
                metrics.upgrade_evictions.with_label_values(&[result]).inc();
            });
        }
    }

    /// A round's findings: events, conditions and the gauge.
    fn on_degraded_round(
        &mut self,
        found: Result<Vec<dra_engine::Degradation>, tokio::task::JoinError>,
    ) {
        self.degraded_round = None;
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                tracing::error!(error = %e, "the search for degraded pods failed");
                return;
            }
        };
        let pods: HashSet<ObjectKey> = match self.engine.as_ref() {
            Some(engine) => engine.state().pods.keys().cloned().collect(),
            None => found.iter().map(|d| d.pod.clone()).collect(),
        };
        for note in self
            .degraded
            .found(found, |k| pods.contains(k), Instant::now())
        {
            self.tell_degraded(note);
        }
        // An owner seen degraded before reads 0 (not absent) once it no longer is.
        let counts = self.degraded.counts();
        for (namespace, owner) in self
            .degraded_owners
            .difference(&counts.keys().cloned().collect())
        {
            self.metrics
                .degraded_pods
                .with_label_values(&[namespace, owner])
                .set(0);
        }
        for ((namespace, owner), n) in counts {
            self.metrics
                .degraded_pods
                .with_label_values(&[&namespace, &owner])
                .set(n);
            self.degraded_owners.insert((namespace, owner));
        }
    }

    fn tell_degraded(&self, note: degraded::Note) {
        let condition = |status: &str, reason: &str, message: &str| {
            serde_json::json!({
                "type": degraded::CONDITION, "status": status, "reason": reason,
                "message": message,
                "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
            })
        };
        match note {
            degraded::Note::Degraded { pod, uid, message } => {
                tracing::info!(%pod, reason = %message, "pod is degraded");
                let c = condition("False", "LowerRankedDevice", &message);
                self.user.note(
                    pod,
                    uid,
                    (EventType::Warning, "DegradedDevice", "Scheduling", message),
                    Some(c),
                );
            }
            degraded::Note::Restored { pod, uid } => {
                let message = "no device of a higher-ranked subrequest is free for this pod";
                tracing::info!(%pod, "pod is no longer degraded");
                let c = condition("True", "NoBetterDeviceFree", message);
                self.user.note(
                    pod,
                    uid,
                    (
                        EventType::Normal,
                        "PreferredDevice",
                        "Scheduling",
                        message.to_string(),
                    ),
                    Some(c),
                );
            }
        }
    }

    /// The unschedulable pod's message with what preemption did for it: the pods it
    /// preempts (the preemption is carried out now), or why none helps (for a pod of
    /// priority above 0; for the others it is the rule that nobody ranks below them).
    fn with_preemption(
        &mut self,
        pod: &ObjectKey,
        message: String,
        preemption: Option<Result<Preemption, String>>,
    ) -> String {
        let priority = here(&mut self.engine)
            .state()
            .pod(pod)
            .map_or(0, pod_priority);
        match preemption {
            // kube-scheduler's words: the filters' message, then `preemption: ...`.
            Some(Ok(preemption)) => {
                let message = format!("{message} preemption: {}", preemption.message);
                self.preempted(preemption);
                message
            }
            Some(Err(why)) if priority > 0 => format!("{message} preemption: {why}"),
            _ => message,
        }
    }

    /// [`Daemon::with_preemption`] for a PodGroup: every member's devices are held and the
    /// victims evicted once.
    fn with_group_preemption(
        &mut self,
        members: &[ObjectKey],
        message: String,
        preemption: Option<Result<GroupPreemption, String>>,
    ) -> String {
        let priority = members
            .first()
            .and_then(|m| here(&mut self.engine).state().pod(m))
            .map_or(0, pod_priority);
        match preemption {
            Some(Ok(preemption)) => {
                let message = format!("{message} preemption: {}", preemption.message);
                let engine = here(&mut self.engine);
                for member in &preemption.preemptions {
                    engine.nominate(member);
                }
                self.metrics
                    .preemptions
                    .inc_by(preemption.victims.len() as u64);
                tracing::info!(podgroup = %preemption.group, victims = preemption.victims.len(), reason = %preemption.message, "preempting for a PodGroup");
                tokio::spawn(preemption::carry_out_group(
                    self.client.clone(),
                    self.metrics.clone(),
                    self.user.recorder.clone(),
                    self.scheduler_name.clone(),
                    preemption,
                ));
                message
            }
            Some(Err(why)) if priority > 0 => format!("{message} preemption: {why}"),
            _ => message,
        }
    }

    /// Hold the freed devices for the preemptor and evict the victims.
    fn preempted(&mut self, preemption: Preemption) {
        here(&mut self.engine).nominate(&preemption);
        self.metrics
            .preemptions
            .inc_by(preemption.victims.len() as u64);
        tracing::info!(pod = %preemption.pod, node = %preemption.node, victims = preemption.victims.len(), reason = %preemption.message, "preempting");
        tokio::spawn(preemption::carry_out(
            self.client.clone(),
            self.metrics.clone(),
            self.user.recorder.clone(),
            self.scheduler_name.clone(),
            preemption,
        ));
    }

    fn release_claim(&self, pod: ObjectKey, claim: ObjectKey, uid: String) {
        let (client, metrics) = (self.client.clone(), self.metrics.clone());
        tokio::spawn(async move {
            match binder::release_claim(&client, &metrics, &claim, &uid).await {
                Ok(true) => {
                    tracing::info!(%pod, %claim, "deallocated the claim of an unschedulable pod")
                }
                Ok(false) => {}
                Err(message) => {
                    tracing::warn!(%pod, %claim, error = %message, "could not deallocate")
                }
            }
        });
    }

    /// Take a decision made on a fork: placements only if they still hold on the engine,
    /// "nothing fits" then retried soon if anything changed meanwhile.
    fn decided_on_fork(&mut self, search: LongSearch) {
        let LongSearch {
            work,
            outcome,
            elapsed,
            forked_at,
        } = search;
        let engine = here(&mut self.engine);
        let placements: &[Placement] = match &outcome {
            Outcome::Pod(Decision::Scheduled(placement)) => std::slice::from_ref(placement),
            Outcome::Group(decision) => decision.placements(),
            Outcome::Pod(_) => &[],
        };
        if let Some(why) = placements
            .iter()
            .find_map(|p| engine.admit(p, forked_at).err())
        {
            tracing::info!(%work, %why, "a placement found on a fork no longer holds; trying again");
            self.metrics
                .attempts
                .with_label_values(&["error"])
                .observe(elapsed);
            self.back_off(&work);
            return;
        }
        let stale = engine.changed_since(forked_at);
        let unplaced = placements.is_empty();
        let pods = work.pods();
        self.outcome(work, outcome, elapsed);
        if unplaced && stale {
            // An event that could help came while the pods were away from the queue.
            for pod in &pods {
                self.queue.backoff(pod, Instant::now());
            }
        }
    }

    /// Take the outcome of an attempt (the engine is back).
    fn outcome(&mut self, work: Work, outcome: Outcome, elapsed: f64) {
        match (work, outcome) {
            (Work::Pod(key), Outcome::Pod(decision)) => self.decided(key, decision, elapsed, None),
            (Work::Group { members, .. }, Outcome::Group(decision)) => {
                self.group_decided(&members, decision, elapsed, None)
            }
            (work, _) => {
                tracing::error!(%work, "an attempt answered for other work; backing off");
                self.back_off(&work);
            }
        }
    }

    /// Take a PodGroup's decision: assume every member's placement and write them as one
    /// ([`binder::bind_group`]); or tell every member why the group waits. The PodGroup's
    /// condition says which.
    fn group_decided(
        &mut self,
        members: &[ObjectKey],
        decision: GroupDecision,
        elapsed: f64,
        preemption: Option<Result<GroupPreemption, String>>,
    ) {
        let group = decision.group().clone();
        let result = match &decision {
            GroupDecision::Scheduled(_) => "scheduled",
            GroupDecision::Unschedulable { .. } => "unschedulable",
            GroupDecision::Error { .. } => "error",
        };
        self.metrics
            .attempts
            .with_label_values(&[result])
            .observe(elapsed);
        let uid = |engine: &Engine, pod: &ObjectKey| {
            engine
                .state()
                .pods
                .get(pod)
                .and_then(|p| p.metadata.uid.clone())
        };
        match decision {
            GroupDecision::Scheduled(placed) => {
                tracing::info!(podgroup = %group, placed = placed.placements.len(), pending = placed.pending.len(), domain = placed.domain.as_deref().unwrap_or(""), attempt_seconds = elapsed, "PodGroup scheduled");
                for (pod, message) in placed.pending {
                    self.queue
                        .unschedulable(&pod, Instant::now(), BTreeSet::new());
                    let uid = uid(here(&mut self.engine), &pod);
                    self.user.failed(
                        pod,
                        uid,
                        format!("PodGroup {group} was placed without this pod: {message}"),
                    );
                }
                self.groups
                    .set_condition(&self.client, &self.metrics, &group, Ok(()));
                self.scheduled_group(placed.placements, elapsed);
            }
            GroupDecision::Unschedulable { message, .. } => {
                let message = self.with_group_preemption(members, message, preemption);
                tracing::info!(podgroup = %group, attempt_seconds = elapsed, reason = %message, "PodGroup is unschedulable");
                for pod in members {
                    self.queue
                        .unschedulable(pod, Instant::now(), BTreeSet::new());
                    let uid = uid(here(&mut self.engine), pod);
                    self.user.failed(pod.clone(), uid, message.clone());
                }
                let reason = ("Unschedulable", message);
                self.groups
                    .set_condition(&self.client, &self.metrics, &group, Err(reason));
            }
            GroupDecision::Error { message, .. } => {
                tracing::warn!(podgroup = %group, attempt_seconds = elapsed, error = %message, "PodGroup scheduling attempt failed; backing off");
                for pod in members {
                    self.queue.backoff(pod, Instant::now());
                    let uid = uid(here(&mut self.engine), pod);
                    self.user.failed(pod.clone(), uid, message.clone());
                }
                let reason = ("SchedulerError", message);
                self.groups
                    .set_condition(&self.client, &self.metrics, &group, Err(reason));
            }
        }
    }

    /// Assume a PodGroup's placements and write them in one task: every member's claims
    /// before any pod is bound, all undone when one fails. Each member's result comes back
    /// as a binding of its own.
    fn scheduled_group(&mut self, placements: Vec<Placement>, attempt_seconds: f64) {
        let engine = here(&mut self.engine);
        let mut timings = Vec::new();
        for placement in &placements {
            engine.assume(placement);
            self.book
                .in_flight
                .insert(placement.pod.clone(), placement.clone());
            timings.push(Timing {
                queued: self.queue.added_at(&placement.pod),
                attempt_seconds,
            });
        }
        self.queue
            .cluster_event(ClusterEvent::AssignedPodAdded, Instant::now());
        self.metrics.in_flight.set(self.book.in_flight.len() as i64);
        let work = placements.into_iter().zip(timings).collect();
        self.bindings.spawn(work, true, self.done.clone());
    }

    /// A binding task finished.
    fn on_binding_done(&mut self, (placement, timing, result): Done) {
        self.book.in_flight.remove(&placement.pod);
        self.metrics.in_flight.set(self.book.in_flight.len() as i64);
        match result {
            Ok(stored) => self.bound(placement, timing, stored),
            Err(failure) => self.binding_failed(placement, failure),
        }
    }

    fn bound(&mut self, placement: Placement, timing: Timing, stored: Vec<ResourceClaim>) {
        let engine = here(&mut self.engine);
        // What the API server stored is newer than anything the informers have shown;
        // late events cannot undo it.
        for claim in stored {
            engine.upsert_claim(claim);
        }
        engine.reassert(&placement);
        self.book
            .confirming
            .insert(placement.pod.clone(), placement.clone());
        let waited = timing.queued.map(|added| added.elapsed().as_secs_f64());
        if let Some(waited) = waited {
            self.metrics.pod_scheduling.observe(waited);
        }
        let (claims, devices) = claims_and_devices(&placement);
        tracing::info!(
            pod = %placement.pod,
            node = %placement.node,
            %claims,
            %devices,
            attempt_seconds = timing.attempt_seconds,
            queued_to_bound_seconds = waited,
            "bound pod to node"
        );
        self.queue.remove(&placement.pod);
        self.user
            .scheduled(placement.pod, placement.pod_uid, placement.node);
    }

    fn binding_failed(&mut self, placement: Placement, failure: binder::BindFailure) {
        let engine = here(&mut self.engine);
        if failure.unwound {
            tracing::warn!(pod = %placement.pod, node = %placement.node, error = %failure.message, "binding failed; undone, backing off");
            engine.forget(&placement);
        } else {
            // The claims may still hold the devices: keep them taken, free only the pod;
            // the informers bring the claims' truth.
            tracing::warn!(pod = %placement.pod, node = %placement.node, error = %failure.message, "binding failed and could not be undone; its devices stay taken");
            engine.forget_pod(&placement);
        }
        let now = Instant::now();
        self.queue.backoff(&placement.pod, now);
        // What it had assumed is free again.
        self.queue
            .cluster_event(ClusterEvent::AssignedPodDeleted, now);
        self.queue.cluster_event(ClusterEvent::ClaimFreed, now);
        self.user
            .failed(placement.pod, placement.pod_uid, failure.message);
    }

    /// Stop: no new attempt; the one running is cancelled; bindings in flight finish or
    /// undo themselves while the fence still lets them write.
    async fn stop(self, ending: Ending, election: Election) -> anyhow::Result<()> {
        self.ready.store(false, Ordering::Relaxed);
        if let Some(running) = &self.running {
            running.cancel();
        }
        for (_, long) in &self.long {
            long.cancel();
        }
        if matches!(ending, Ending::LostLease) {
            self.metrics.leader.set(0);
            tracing::error!(
                "the leader Lease was not renewed within the renew deadline: stopped scheduling; letting bindings in flight settle, then exiting"
            );
        }
        self.bindings.settled(Duration::from_secs(30)).await;
        election.stop().await;
        match ending {
            Ending::Shutdown => Ok(()),
            Ending::LostLease => anyhow::bail!(
                "lost the leader Lease; exiting so that a restart rebuilds from the API server"
            ),
        }
    }
}

/// The result of a lane's work; the caller's guard checks that there is some.
async fn joined<T>(lane: &mut Option<Running<T>>) -> Result<T, tokio::task::JoinError> {
    (&mut lane.as_mut().expect("guarded").task).await
}

/// The first of `lanes` to finish, taken out, with its lane.
async fn joined_any<T>(
    lanes: &mut Vec<(usize, Running<T>)>,
) -> (usize, Result<T, tokio::task::JoinError>) {
    let (finished, index, _) =
        futures::future::select_all(lanes.iter_mut().map(|(_, r)| &mut r.task)).await;
    let (lane, _) = lanes.remove(index);
    (lane, finished)
}

fn engine_for(config: &Config) -> Engine {
    Engine::new(config.engine_config(), ClusterInput::default())
}

fn recorder(client: &Client, config: &Config) -> Recorder {
    Recorder::new(
        client.clone(),
        Reporter {
            controller: config.scheduler_name.clone(),
            instance: std::env::var("POD_NAME").ok(),
        },
    )
}

/// /metrics, /healthz and /readyz, served from a task of their own.
async fn serve_endpoints(
    config: &Config,
    metrics: &Arc<Metrics>,
    ready: &Arc<AtomicBool>,
    health: &Arc<Health>,
) -> anyhow::Result<()> {
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
    Ok(())
}

/// A binding task's report: the placement, when its pod entered the queue, and the result.
type Done = bindings::Report<Timing>;

/// What a placement's line and `pod_scheduling_duration_seconds` say once it is bound.
#[derive(Clone, Copy, Debug)]
struct Timing {
    /// When the pod entered the queue (`None` if it has left it since).
    queued: Option<Instant>,
    /// The scheduling attempt that chose the node.
    attempt_seconds: f64,
}

/// A placement's claims and the devices they hold, for its log line: `ns/name,...` and
/// `driver/pool/device,...` (claims that were allocated already included).
fn claims_and_devices(placement: &Placement) -> (String, String) {
    let claims: Vec<String> = placement.claims.iter().map(|c| c.key.to_string()).collect();
    let devices: Vec<String> = placement
        .claims
        .iter()
        .filter_map(|c| {
            c.allocation
                .as_ref()
                .or_else(|| c.claim.status.as_ref()?.allocation.as_ref())
        })
        .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
        .map(|r| format!("{}/{}/{}", r.driver, r.pool, r.device))
        .collect();
    (claims.join(","), devices.join(","))
}

/// The next pod to try, if any; pods whose claims do not exist yet are gated on the way.
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
}

/// Applies an informer's change to the engine and the queue: the state takes it in, and
/// the cluster events it amounts to send back the unschedulable pods they may help
/// ([`dra_engine::queueing_hints`]).
fn apply(
    engine: &mut Engine,
    queue: &mut SchedulingQueue,
    book: &mut Bookkeeping,
    (informers, groups, budgets): (&mut Informers, &mut PodGroups, &mut Budgets),
    change: Change,
) {
    let now = Instant::now();
    let events: Vec<ClusterEvent> = match change {
        Change::Pod(event) => match apply_pod(engine, queue, book, informers, event) {
            PodHint::Freed => vec![ClusterEvent::AssignedPodDeleted],
            PodHint::Placed => vec![ClusterEvent::AssignedPodAdded],
            PodHint::Nothing => Vec::new(),
        },
        Change::Claim(event) => {
            // The claim the event is about; a relist's end may remove any.
            let key = match &event {
                Event::Apply(c) | Event::InitApply(c) | Event::Delete(c) => {
                    Some(ObjectKey::of(&c.metadata))
                }
                Event::Init | Event::InitDone => None,
            };
            let freed = apply_claim(engine, informers, event);
            if let Some(key) = &key {
                queue.claim_changed(key);
                // DynamicResources' hint: a claim's own pods may fit once it changes.
                let state = engine.state();
                queue.requeue_if(now, |pod, _| {
                    state
                        .pod(pod)
                        .is_some_and(|p| dra_engine::claims::uses_claim(p, key))
                });
            }
            // The API server's copy replaced what was assumed for bindings still in flight
            // that use the claim (only those: one event per claim re-asserting every
            // placement in flight made a burst's cost grow with its square).
            for placement in book.placements() {
                if key
                    .as_ref()
                    .is_none_or(|k| placement.claims.iter().any(|d| &d.key == k))
                {
                    engine.reassert(placement);
                }
            }
            freed
                .then_some(ClusterEvent::ClaimFreed)
                .into_iter()
                .collect()
        }
        Change::Node(event) => apply_node(engine, informers, event),
        Change::Namespace(event) => {
            let relabelled = namespace_relabelled(engine, &event);
            cluster_scoped(engine, informers, &NAMESPACES, event);
            relabelled
                .then_some(ClusterEvent::NamespaceLabelsChanged)
                .into_iter()
                .collect()
        }
        Change::Class(event) => {
            cluster_scoped(engine, informers, &CLASSES, event);
            vec![ClusterEvent::DeviceClassChanged]
        }
        Change::Slice(event) => {
            cluster_scoped(engine, informers, &SLICES, event);
            vec![ClusterEvent::SliceChanged]
        }
        Change::TaintRule(event) => {
            cluster_scoped(engine, informers, &TAINT_RULES, event);
            vec![ClusterEvent::DeviceTaintRuleChanged]
        }
        Change::Storage(change) => storage::apply(engine, informers, book.placements(), change)
            .into_iter()
            .collect(),
        // Selectors of default spread constraints only move scores (see workloads.rs).
        Change::Workloads(change) => {
            workloads::apply(engine, informers, change);
            Vec::new()
        }
        // A PodGroup's members are woken by the group itself.
        Change::PodGroup(event) => {
            groups.apply(engine, queue, informers, event);
            Vec::new()
        }
        // Preemption prefers victims whose budgets allow it but is never stopped by one
        // (kube-scheduler's DefaultPreemption): a budget's change makes no pod fit.
        Change::Pdb(event) => {
            budgets.apply(informers, event);
            Vec::new()
        }
        Change::WatchError(kind, message) => {
            tracing::warn!(kind, error = %message, "watch failed; backing off and re-listing");
            Vec::new()
        }
    };
    for event in events {
        queue.cluster_event(event, now);
    }
}

/// Whether a namespace's event changes the labels pod affinity terms select namespaces by.
fn namespace_relabelled(engine: &Engine, event: &Event<Namespace>) -> bool {
    match event {
        Event::Apply(ns) | Event::InitApply(ns) => engine
            .state()
            .namespaces
            .get(&name(&ns.metadata))
            .is_none_or(|old| old.metadata.labels != ns.metadata.labels),
        Event::Delete(_) | Event::InitDone => true,
        Event::Init => false,
    }
}

/// What a pod's event may do for the pods that wait (kube-scheduler's queueing hints for
/// pod events, coarsely).
#[derive(Debug, PartialEq, Eq)]
enum PodHint {
    Nothing,
    /// A bound pod left or finished: its node's resources, ports and volumes are free, and
    /// anti-affinity or spread that counted it no longer does.
    Freed,
    /// A pod was bound or a bound pod's labels changed: pods waiting for pod affinity or a
    /// spread domain may fit now.
    Placed,
}

/// A pod's event; whether it may help the pods that wait.
fn apply_pod(
    engine: &mut Engine,
    queue: &mut SchedulingQueue,
    book: &mut Bookkeeping,
    informers: &mut Informers,
    event: Event<Pod>,
) -> PodHint {
    match event {
        Event::Apply(pod) | Event::InitApply(pod) => {
            informers.seen("Pod", ObjectKey::of(&pod.metadata));
            pod_applied(engine, queue, book, pod)
        }
        Event::Delete(pod) => {
            let key = ObjectKey::of(&pod.metadata);
            queue.remove(&key);
            book.confirming.remove(&key);
            // Only a pod that held a node frees anything.
            let freed = engine
                .state()
                .pods
                .get(&key)
                .is_some_and(|p| dra_engine::state::bound_node(p).is_some());
            engine.remove_pod(&key);
            if freed {
                PodHint::Freed
            } else {
                PodHint::Nothing
            }
        }
        Event::Init => {
            informers.listing("Pod");
            PodHint::Nothing
        }
        Event::InitDone => {
            // Pods deleted while the watch was down are not in the new list.
            let gone = informers.gone("Pod", engine.state().pods.keys().cloned());
            for key in &gone {
                queue.remove(key);
                book.confirming.remove(key);
                engine.remove_pod(key);
            }
            if gone.is_empty() {
                PodHint::Nothing
            } else {
                PodHint::Freed
            }
        }
    }
}

/// A pod created or updated: ours and pending goes to the queue, bound or finished leaves
/// it. Only a bound pod that finished frees its node for the pods that wait.
fn pod_applied(
    engine: &mut Engine,
    queue: &mut SchedulingQueue,
    book: &mut Bookkeeping,
    pod: Pod,
) -> PodHint {
    let key = ObjectKey::of(&pod.metadata);
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
        // Our own writes (the PodScheduled condition) change only the status: they do
        // not retry the pod.
        if old.is_none_or(|old| pod_changed_for_scheduling(old, &pod)) {
            queue.pod_updated(&key);
        }
    }
    let was_bound = old.is_some_and(|p| dra_engine::state::bound_node(p).is_some());
    let relabelled = old.is_some_and(|p| p.metadata.labels != pod.metadata.labels);
    let hint = if terminal && was_bound {
        PodHint::Freed
    } else if bound && !terminal && (!was_bound || relabelled) {
        PodHint::Placed
    } else {
        PodHint::Nothing
    };
    let placement = book.placement_of(&pod).cloned();
    engine.upsert_pod(pod);
    if let Some(p) = placement {
        engine.reassert(&p);
    }
    hint
}

/// A claim's event; whether it freed devices or room for the pods that wait
/// ([`ClusterEvent::ClaimFreed`]).
fn apply_claim(
    engine: &mut Engine,
    informers: &mut Informers,
    event: Event<ResourceClaim>,
) -> bool {
    match event {
        Event::Apply(c) | Event::InitApply(c) => {
            informers.seen("ResourceClaim", ObjectKey::of(&c.metadata));
            let old = engine.state().claim(&ObjectKey::of(&c.metadata));
            let freed = old.is_some_and(|old| claim_freed(old, &c));
            engine.upsert_claim(c);
            freed
        }
        Event::Delete(c) => {
            engine.remove_claim(&ObjectKey::of(&c.metadata));
            true
        }
        Event::Init => {
            informers.listing("ResourceClaim");
            false
        }
        Event::InitDone => {
            let gone = informers.gone("ResourceClaim", engine.state().claims.keys().cloned());
            for key in &gone {
                engine.remove_claim(key);
            }
            !gone.is_empty()
        }
    }
}

/// A node's event, as the cluster events it amounts to.
fn apply_node(
    engine: &mut Engine,
    informers: &mut Informers,
    event: Event<Node>,
) -> Vec<ClusterEvent> {
    let events = match &event {
        Event::Apply(node) | Event::InitApply(node) => {
            let old = engine.state().nodes.get(&name(&node.metadata));
            node_events(old.map(|i| &*i.node), node)
        }
        Event::Delete(_) => vec![ClusterEvent::NodeDeleted],
        Event::Init => Vec::new(),
        Event::InitDone => vec![ClusterEvent::NodeDeleted],
    };
    cluster_scoped(engine, informers, &NODES, event);
    events
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

/// What a node's update may change for a filter: a new node, its labels, its taints or
/// `spec.unschedulable`, its allocatable resources. Kubelets update their Node status all
/// the time for other reasons; those retry no pod.
fn node_events(old: Option<&Node>, new: &Node) -> Vec<ClusterEvent> {
    let Some(old) = old else {
        return vec![ClusterEvent::NodeAdded];
    };
    let taints = |n: &Node| n.spec.as_ref().map(|s| (s.taints.clone(), s.unschedulable));
    let allocatable = |n: &Node| n.status.as_ref().and_then(|s| s.allocatable.clone());
    [
        (
            old.metadata.labels != new.metadata.labels,
            ClusterEvent::NodeLabelsChanged,
        ),
        (taints(old) != taints(new), ClusterEvent::NodeTaintsChanged),
        (
            allocatable(old) != allocatable(new),
            ClusterEvent::NodeAllocatableChanged,
        ),
    ]
    .into_iter()
    .filter_map(|(changed, event)| changed.then_some(event))
    .collect()
}

/// Whether a claim's update gave devices or room back: its allocation cleared, or a
/// reservation ended (a shared claim's room). A claim becoming allocated or reserved
/// only takes things away.
fn claim_freed(old: &ResourceClaim, new: &ResourceClaim) -> bool {
    let allocated = |c: &ResourceClaim| c.status.as_ref().is_some_and(|s| s.allocation.is_some());
    let reservations = |c: &ResourceClaim| {
        c.status
            .as_ref()
            .and_then(|s| s.reserved_for.as_ref())
            .map_or(0, Vec::len)
    };
    (allocated(old) && !allocated(new)) || reservations(new) < reservations(old)
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

/// How the state takes in, lets go of and lists one cluster-scoped kind it keeps by name.
struct Kept<K> {
    kind: &'static str,
    upsert: fn(&mut Engine, K),
    remove: fn(&mut Engine, &str),
    names: fn(&ClusterState) -> Vec<String>,
}

const NAMESPACES: Kept<Namespace> = Kept {
    kind: "Namespace",
    upsert: Engine::upsert_namespace,
    remove: Engine::remove_namespace,
    names: |s| s.namespaces.keys().cloned().collect(),
};

const NODES: Kept<Node> = Kept {
    kind: "Node",
    upsert: Engine::upsert_node,
    remove: Engine::remove_node,
    names: |s| s.nodes.keys().cloned().collect(),
};

const CLASSES: Kept<DeviceClass> = Kept {
    kind: "DeviceClass",
    upsert: |e, o| e.state_mut().upsert_class(o),
    remove: |e, name| e.state_mut().remove_class(name),
    names: |s| s.classes.iter().map(|o| name(&o.metadata)).collect(),
};

const SLICES: Kept<ResourceSlice> = Kept {
    kind: "ResourceSlice",
    upsert: |e, o| e.state_mut().upsert_slice(o),
    remove: |e, name| e.state_mut().remove_slice(name),
    names: |s| s.slices.iter().map(|o| name(&o.metadata)).collect(),
};

const TAINT_RULES: Kept<DeviceTaintRule> = Kept {
    kind: "DeviceTaintRule",
    upsert: |e, o| e.state_mut().upsert_taint_rule(o),
    remove: |e, name| e.state_mut().remove_taint_rule(name),
    names: |s| s.taint_rules.iter().map(|o| name(&o.metadata)).collect(),
};

/// Apply a change to a cluster-scoped kind the state keeps by name. Any such change may
/// help a pod that waits.
fn cluster_scoped<K: kube::Resource>(
    engine: &mut Engine,
    informers: &mut Informers,
    kept: &Kept<K>,
    event: Event<K>,
) -> bool {
    let key = |name: String| ObjectKey::new("", name);
    match event {
        Event::Apply(o) | Event::InitApply(o) => {
            informers.seen(kept.kind, key(name(o.meta())));
            (kept.upsert)(engine, o)
        }
        Event::Delete(o) => (kept.remove)(engine, &name(o.meta())),
        Event::Init => informers.listing(kept.kind),
        Event::InitDone => {
            let has = (kept.names)(engine.state()).into_iter().map(key);
            for gone in informers.gone(kept.kind, has) {
                (kept.remove)(engine, &gone.name);
            }
        }
    }
    true
}

/// SIGTERM or Ctrl-C, listened for from the start of [`run`] to its end.
///
/// A signal listener only sees signals that arrive after it is made, and once the first is
/// made the process no longer dies of the signal by default. So there is one listener,
/// made first: a SIGTERM that arrives while the daemon waits for something else (an API
/// server that accepts connections but does not answer discovery) is remembered, not lost.
#[derive(Clone)]
struct Shutdown(signal::Receiver<bool>);

impl Shutdown {
    fn listen() -> Shutdown {
        use tokio::signal::unix::{SignalKind, signal as unix_signal};
        let mut term = unix_signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut interrupt = unix_signal(SignalKind::interrupt()).expect("SIGINT handler");
        let (tx, rx) = signal::channel(false);
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = interrupt.recv() => {}
            }
            let _ = tx.send(true);
        });
        Shutdown(rx)
    }

    /// Ends once a signal has arrived (at once if one already has).
    async fn requested(&self) {
        let mut rx = self.0.clone();
        let _ = rx.wait_for(|&stop| stop).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_waiting_for_claims_from_templates_is_told_later_than_one_naming_its_claim() {
        let pod = |claims: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "default"},
                "spec": {"containers": [], "resourceClaims": claims}}))
            .unwrap()
        };
        let templates = pod(serde_json::json!([
            {"name": "gpu", "resourceClaimTemplateName": "one-gpu"},
            {"name": "nic", "resourceClaimTemplateName": "one-nic"}]));
        let named = pod(serde_json::json!([{"name": "gpu", "resourceClaimName": "shared-gpu"}]));
        let both = pod(serde_json::json!([
            {"name": "gpu", "resourceClaimTemplateName": "one-gpu"},
            {"name": "data", "resourceClaimName": "dataset"}]));
        assert_eq!(report_after(Some(&templates)), Duration::from_secs(60));
        assert_eq!(report_after(Some(&named)), Duration::from_secs(10));
        assert_eq!(report_after(Some(&both)), Duration::from_secs(10));
        assert_eq!(
            report_after(Some(&pod(serde_json::json!([])))),
            Duration::from_secs(10)
        );
        assert_eq!(report_after(None), Duration::from_secs(10));
    }

    #[test]
    fn a_trimmed_pod_keeps_the_volumes_scheduling_reads_and_forgets_the_kubelets() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "trainer", "namespace": "team-a",
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"containers": [{"name": "c", "image": "trainer:1"}], "volumes": [
                {"name": "kube-api-access-x", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                    {"configMap": {"name": "kube-root-ca.crt"}},
                    {"downwardAPI": {"items": [{"path": "namespace",
                        "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}},
                {"name": "settings", "configMap": {"name": "settings"}},
                {"name": "keys", "secret": {"secretName": "keys"}},
                {"name": "labels", "downwardAPI": {"items": []}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                {"name": "disk", "csi": {"driver": "disk.csi.example.com"}},
                {"name": "model", "image": {"reference": "models/llama:1"}},
                {"name": "tmp", "emptyDir": {}}]}
        }))
        .unwrap();
        trim_pod(&mut pod);
        assert_eq!(pod.metadata.managed_fields, None);
        let spec = pod.spec.unwrap();
        let kept: Vec<&str> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(kept, ["data", "scratch", "disk", "model", "tmp"]);
        assert_eq!(spec.containers[0].image.as_deref(), Some("trainer:1"));
    }

    #[test]
    fn a_placements_line_names_its_claims_and_every_device_they_hold() {
        let allocation = |devices: &[&str]| -> k8s_openapi::api::resource::v1::AllocationResult {
            let results: Vec<_> = devices
                .iter()
                .map(|d| serde_json::json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": d}))
                .collect();
            serde_json::from_value(serde_json::json!({"devices": {"results": results}})).unwrap()
        };
        let claim = |name: &str, allocated: Option<&[&str]>| -> ResourceClaim {
            let mut claim: ResourceClaim = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default"}, "spec": {}}))
            .unwrap();
            if let Some(devices) = allocated {
                claim.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
                    allocation: Some(allocation(devices)),
                    ..Default::default()
                });
            }
            claim
        };
        let decision =
            |name: &str, new: Option<&[&str]>, before: Option<&[&str]>| dra_engine::ClaimDecision {
                key: ObjectKey::new("default", name),
                claim: claim(name, before),
                allocation: new.map(allocation),
                create: false,
                extended_mappings: Vec::new(),
                consumer: None,
            };
        let placement = Placement {
            pod: ObjectKey::new("default", "p"),
            pod_uid: None,
            node: "n1".into(),
            claims: vec![
                decision("new", Some(&["gpu-0", "gpu-1"]), None),
                decision("kept", None, Some(&["nic-0"])),
            ],
            allocation_time: Duration::ZERO,
            volumes: Vec::new(),
            node_allocatable: Vec::new(),
        };
        assert_eq!(
            claims_and_devices(&placement),
            (
                "default/new,default/kept".to_string(),
                "gpu.nvidia.com/n1/gpu-0,gpu.nvidia.com/n1/gpu-1,gpu.nvidia.com/n1/nic-0"
                    .to_string()
            )
        );
    }

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
            dra_engine::EngineConfig::default(),
            ClusterInput {
                nodes: vec![node],
                pods: vec![pod],
                ..Default::default()
            },
        );
        let bad = ObjectKey::new("default", "bad");
        let decision = guarded(
            &mut engine,
            &bad,
            |_| panic!("index out of bounds"),
            |message| Decision::Error {
                pod: bad.clone(),
                message,
            },
        );
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
        let Outcome::Pod(placed) = decide(
            &mut engine,
            &Work::Pod(next),
            Duration::from_secs(10),
            &cancel,
        ) else {
            panic!("a pod's work has a pod's decision");
        };
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
        assert_eq!(node_events(None, &old), [ClusterEvent::NodeAdded]);
        assert_eq!(
            node_events(
                Some(&old),
                &node(serde_json::json!({"a": "1"}), "2026-12-01T00:01:00Z")
            ),
            [],
            "a heartbeat"
        );
        assert_eq!(
            node_events(
                Some(&old),
                &node(serde_json::json!({"a": "2"}), "2026-12-01T00:00:00Z")
            ),
            [ClusterEvent::NodeLabelsChanged]
        );
        let mut cordoned = old.clone();
        cordoned.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            unschedulable: Some(true),
            ..Default::default()
        });
        assert_eq!(
            node_events(Some(&old), &cordoned),
            [ClusterEvent::NodeTaintsChanged]
        );
    }
}
