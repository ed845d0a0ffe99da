//! The engine: cluster state, the profile's plugins, and what a scheduling cycle decides
//! (the cycle itself is in `cycle.rs`). Decisions are assumed into the state until their
//! writes land, and forgotten when a write fails.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dra_allocator::{Features, SelectorCache, Snapshot, SnapshotInput};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim, ResourceClaimStatus};

use crate::changes::Changes;
use crate::claims;
use crate::device_memo::DeviceMemo;
use crate::framework::{Framework, Profile};
use crate::state::{ClusterInput, ClusterState, ObjectKey, bound_node};

/// How the engine chooses.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Pods whose `spec.schedulerName` is this are ours.
    pub scheduler_name: String,
    /// Stop looking once this share of nodes is feasible (0: kube-scheduler's adaptive
    /// default, 50% minus 1% per 125 nodes, at least 5% and at least 100 nodes).
    pub percentage_of_nodes_to_score: u32,
    /// DRA features that are on.
    pub features: Features,
    /// The plugins that run, their score weights and arguments (kube-scheduler's default
    /// profile plus this scheduler's device scores, unless configured otherwise).
    pub profile: Profile,
    /// The most one pod's device search may take, over all nodes (`filterTimeout`; like
    /// kube-scheduler's DRASchedulerFilterTimeout, 10 s by default). A pod that reaches it
    /// is unschedulable for this attempt, with a message that says so.
    pub filter_timeout: Duration,
    /// Whether [`Engine::preempt`] may evict lower-priority pods (kube-scheduler's
    /// DefaultPreemption, which the profile must also enable; on by default).
    pub preemption: bool,
}

/// kube-scheduler's default for DRASchedulerFilterTimeout.
pub const DEFAULT_FILTER_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            scheduler_name: "dra-scheduler".into(),
            percentage_of_nodes_to_score: 0,
            features: Features::default(),
            profile: Profile::default(),
            filter_timeout: DEFAULT_FILTER_TIMEOUT,
            preemption: true,
        }
    }
}

/// What happens to one of the pod's claims on the chosen node.
#[derive(Clone, Debug)]
pub struct ClaimDecision {
    pub key: ObjectKey,
    /// The claim as the engine knows it (for an extended-resource claim: the one to create).
    pub claim: ResourceClaim,
    /// The new allocation; `None` when the claim was already allocated.
    pub allocation: Option<AllocationResult>,
    /// The claim does not exist in the API yet: it serves extended resources of the pod.
    pub create: bool,
    /// For that claim: which of its requests serves each container, for the pod's
    /// `status.extendedResourceClaimStatus`. Empty for other claims.
    pub extended_mappings: Vec<k8s_openapi::api::core::v1::ContainerExtendedResourceRequest>,
    /// Who the claim is reserved for when not the pod: its PodGroup, for a claim the
    /// PodGroup lists in `spec.resourceClaims` (set by [`Engine::schedule_group`]).
    pub consumer: Option<k8s_openapi::api::resource::v1::ResourceClaimConsumerReference>,
}

impl Placement {
    /// The `reservedFor` entry the claim of `decision` gets: the pod's, or its PodGroup's.
    pub fn consumer_of(
        &self,
        decision: &ClaimDecision,
    ) -> k8s_openapi::api::resource::v1::ResourceClaimConsumerReference {
        decision
            .consumer
            .clone()
            .unwrap_or_else(|| claims::consumer(&self.pod.name, self.pod_uid.as_deref()))
    }
}

/// A pod placed on a node.
#[derive(Clone, Debug)]
pub struct Placement {
    pub pod: ObjectKey,
    pub pod_uid: Option<String>,
    pub node: String,
    pub claims: Vec<ClaimDecision>,
    /// How long the device search for the pod's claims took on the chosen node (zero when
    /// nothing was allocated). All of a pod's claims are searched together. For devices
    /// remembered from an earlier pod's attempt ([`crate::device_memo`]), the time of
    /// the search that found them.
    pub allocation_time: Duration,
    /// What VolumeBinding decided for the pod's PersistentVolumeClaims that are not bound
    /// yet; the binder writes these first (PreBind), then waits for the claims to be bound.
    pub volumes: Vec<VolumeDecision>,
    /// What the pod's devices map of the node's CPU, memory or hugepages
    /// (DRANodeAllocatableResources): the binder writes it to the pod's status before the
    /// binding, and the node counts it from now on.
    pub node_allocatable: Vec<k8s_openapi::api::core::v1::NodeAllocatableResourceClaimStatus>,
}

/// What happens to one of the pod's unbound PersistentVolumeClaims on the chosen node: the
/// writes kube-scheduler's volume binder makes (`bindAPIUpdate`).
// A pod has a handful of these at most; boxing the volumes would only add noise.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum VolumeDecision {
    /// Bind the claim to an existing PersistentVolume: the volume's `spec.claimRef` names
    /// the claim (with `pv.kubernetes.io/bound-by-controller: "yes"` when it did not name it
    /// before); the PV controller then completes the claim's side.
    Bind {
        claim: ObjectKey,
        /// The volume as it is to be written.
        volume: PersistentVolume,
        /// The volume as it was when the decision was made (its resourceVersion guards the
        /// write; forgetting the decision puts it back).
        before: PersistentVolume,
    },
    /// Have a volume provisioned for the node: the claim gets the annotation
    /// `volume.kubernetes.io/selected-node`, which the provisioner acts on.
    Provision {
        claim: ObjectKey,
        node: String,
        /// The claim as it was when the decision was made.
        before: PersistentVolumeClaim,
    },
}

impl VolumeDecision {
    pub fn claim(&self) -> &ObjectKey {
        match self {
            VolumeDecision::Bind { claim, .. } | VolumeDecision::Provision { claim, .. } => claim,
        }
    }
}

/// The outcome of one scheduling cycle.
#[derive(Clone, Debug)]
pub enum Decision {
    Scheduled(Placement),
    /// No node fits now; `message` says why, grouped by reason.
    Unschedulable {
        pod: ObjectKey,
        message: String,
        /// The plugins that rejected it (on some node, or in PreFilter): which cluster
        /// events may make it fit (kube-scheduler's queueing hints).
        rejected_by: BTreeSet<&'static str>,
    },
    /// The attempt itself failed (a CEL error, a missing class, an invalid pool...): the
    /// message names the object and the cause; the pod should back off.
    Error {
        pod: ObjectKey,
        message: String,
    },
    /// The device search ran out of its budget before it found devices or proved there
    /// are none; `message` names the claims. The pod is unschedulable for now.
    OutOfTime {
        pod: ObjectKey,
        message: String,
    },
}

impl Decision {
    pub fn node(&self) -> Option<&str> {
        match self {
            Decision::Scheduled(p) => Some(&p.node),
            _ => None,
        }
    }

    pub fn message(&self) -> Option<&str> {
        match self {
            Decision::Scheduled(_) => None,
            Decision::Unschedulable { message, .. }
            | Decision::Error { message, .. }
            | Decision::OutOfTime { message, .. } => Some(message),
        }
    }

    pub fn pod(&self) -> &ObjectKey {
        match self {
            Decision::Scheduled(p) => &p.pod,
            Decision::Unschedulable { pod, .. }
            | Decision::Error { pod, .. }
            | Decision::OutOfTime { pod, .. } => pod,
        }
    }
}

/// Cluster state plus the scheduling cycle.
pub struct Engine {
    config: EngineConfig,
    /// The profile's plugins; why they cannot be built, if the profile is wrong (every
    /// attempt then fails with that message).
    framework: Result<Arc<Framework>, String>,
    state: ClusterState,
    /// The allocator's view, rebuilt when slices, classes or taint rules change and kept up
    /// to date with allocations in between.
    snapshot: Option<Arc<Snapshot>>,
    /// Compiled selectors and their per-device results, kept across snapshot rebuilds.
    selector_cache: Option<Arc<SelectorCache>>,
    /// Allocator search steps (requests and devices tried) in the last cycle, all nodes.
    search_steps: AtomicU64,
    /// When each part of the state last changed, to check decisions made on a fork.
    changes: Changes,
    /// For a fork: the engine's clock when it was made.
    forked_at: Option<u64>,
    /// Claims of other PodGroup members whose devices the last cycle chose again
    /// (`crate::group`'s repair step), with their new allocations.
    revised: std::sync::Mutex<Vec<(ObjectKey, AllocationResult)>>,
    /// Devices held for pods nominated by a preemption ([`Engine::nominate`]), by pod.
    nominations: BTreeMap<ObjectKey, Hold>,
    /// DynamicResources' answers per node and claim shape ([`DeviceMemo`]).
    device_memo: Arc<DeviceMemo>,
    /// Where the next pod's search for feasible nodes starts, in node order
    /// (kube-scheduler's nextStartNodeIndex): after the nodes the last search examined, so
    /// that each node gets its turn when a search stops at numFeasibleNodesToFind.
    pub(crate) next_start_node: usize,
}

/// What a preemption freed, held for the nominated pod while its victims terminate: in
/// the allocator's view these devices are taken, except in the cycles of the nominated pod
/// itself and of pods of higher priority (kube-scheduler's nominated pods count only for
/// pods of lower or equal priority).
#[derive(Clone, Debug)]
struct Hold {
    uid: Option<String>,
    priority: i32,
    node: String,
    allocations: Vec<AllocationResult>,
}

impl Engine {
    pub fn new(config: EngineConfig, input: ClusterInput) -> Self {
        Engine {
            framework: Framework::new(&config.profile).map(Arc::new),
            config,
            state: ClusterState::new(input),
            snapshot: None,
            selector_cache: None,
            search_steps: AtomicU64::new(0),
            changes: Changes::default(),
            forked_at: None,
            revised: Default::default(),
            nominations: BTreeMap::new(),
            device_memo: Arc::default(),
            next_start_node: 0,
        }
    }

    /// A copy of the engine for one long search, so that this one can go on placing other
    /// pods meanwhile. The copy builds its own allocator view (selector results are shared).
    /// What it decides is checked with [`Engine::admit`] before it is taken here.
    pub fn fork(&self) -> Engine {
        Engine {
            config: self.config.clone(),
            framework: self.framework.clone(),
            state: self.state.clone(),
            snapshot: None,
            selector_cache: self.selector_cache.clone(),
            search_steps: AtomicU64::new(0),
            changes: Changes::default(),
            forked_at: Some(self.changes.now()),
            revised: Default::default(),
            nominations: self.nominations.clone(),
            device_memo: Arc::default(),
            next_start_node: self.next_start_node,
        }
    }

    /// Whether anything at all changed since `mark` (a fork's [`Engine::forked_at`]): a
    /// fork's "nothing fits" may then be out of date.
    pub fn changed_since(&self, mark: u64) -> bool {
        self.changes.now() > mark
    }

    /// For a fork, when it was made (pass it to [`Engine::admit`] on the original).
    pub fn forked_at(&self) -> Option<u64> {
        self.forked_at
    }

    /// Whether a placement decided on a fork made at `forked_at` still holds here: the pod
    /// is the same and unbound, its claims are as the fork saw them, and nothing changed on
    /// its node, in the pools of its devices or among the DRA objects. `Err` says what
    /// changed; the pod should then be tried again.
    pub fn admit(&self, placement: &Placement, forked_at: u64) -> Result<(), String> {
        let key = &placement.pod;
        match self.state.pods.get(key) {
            Some(pod) if pod.metadata.uid == placement.pod_uid && bound_node(pod).is_none() => {}
            _ => return Err(format!("pod {key} changed while it was searched for")),
        }
        for decision in placement.claims.iter().filter(|d| !d.create) {
            let now = self.state.claims.get(&decision.key);
            if now.map(|c| &c.metadata.resource_version)
                != Some(&decision.claim.metadata.resource_version)
            {
                return Err(format!(
                    "ResourceClaim {} changed while it was searched for",
                    decision.key
                ));
            }
        }
        let pools = placement
            .claims
            .iter()
            .flat_map(|d| d.allocation.iter())
            .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
            .map(|r| (r.driver.as_str(), r.pool.as_str()));
        match self.changes.since(forked_at, key, &placement.node, pools) {
            Some(what) => Err(format!("{what} while pod {key} was searched for")),
            None => Ok(()),
        }
    }

    /// How hard the allocator searched in the last [`Engine::schedule`]: steps summed over
    /// the nodes it tried.
    pub fn last_search_steps(&self) -> u64 {
        self.search_steps.load(Ordering::Relaxed)
    }

    pub(crate) fn record_search_steps(&self, steps: u64) {
        self.search_steps.store(steps, Ordering::Relaxed);
    }

    /// How many node answers DynamicResources took from its memo instead of searching.
    pub fn device_memo_hits(&self) -> u64 {
        self.device_memo.hits()
    }

    pub(crate) fn device_memo(&self) -> Arc<DeviceMemo> {
        self.device_memo.clone()
    }

    pub(crate) fn record_revised(&self, revised: Vec<(ObjectKey, AllocationResult)>) {
        *self.revised.lock().expect("not poisoned") = revised;
    }

    /// What the last cycle's joint allocation chose for other members' claims.
    pub(crate) fn take_revised(&self) -> Vec<(ObjectKey, AllocationResult)> {
        std::mem::take(&mut *self.revised.lock().expect("not poisoned"))
    }

    /// Give back the devices of an assumed placement's new allocations while the pod stays
    /// assumed on its node (a PodGroup's repair step chooses them again). Returns the keys
    /// of the claims whose devices were given back, in placement order.
    pub(crate) fn release_devices(&mut self, placement: &Placement) -> Vec<ObjectKey> {
        let mut released = Vec::new();
        for decision in &placement.claims {
            let Some(allocation) = &decision.allocation else {
                continue;
            };
            let Some(status) = self
                .state
                .claims
                .get_mut(&decision.key)
                .and_then(|c| Arc::make_mut(c).status.as_mut())
            else {
                continue;
            };
            if claims::take_if_ours(status, allocation) {
                self.release(allocation);
                released.push(decision.key.clone());
            }
        }
        released
    }

    /// Undo [`Engine::release_devices`], or take the devices a repair chose instead.
    pub(crate) fn retake_devices(&mut self, placement: &Placement) {
        for decision in &placement.claims {
            let Some(allocation) = &decision.allocation else {
                continue;
            };
            let Some(claim) = self.state.claims.get_mut(&decision.key) else {
                continue;
            };
            Arc::make_mut(claim)
                .status
                .get_or_insert_with(ResourceClaimStatus::default)
                .allocation = Some(allocation.clone());
            self.changes.allocation(allocation);
            if let Some(snapshot) = self.snapshot.as_mut().and_then(Arc::get_mut) {
                snapshot.add_allocation(allocation);
            } else {
                self.snapshot = None;
            }
        }
    }

    /// The profile's plugins, or why the profile cannot be used.
    pub fn framework(&self) -> Result<Arc<Framework>, String> {
        self.framework
            .clone()
            .map_err(|e| format!("scheduler profile: {e}"))
    }

    /// Why the pod cannot be tried yet (PreEnqueue): a scheduling gate, or a claim it
    /// names does not exist yet (the claim of a template that kube-controller-manager has
    /// not created). Such a pod waits without an attempt.
    pub fn claims_missing(&self, pod_key: &ObjectKey) -> Option<String> {
        let pod = self.state.pods.get(pod_key)?;
        let framework = self.framework.as_ref().ok()?;
        let status = framework.pre_enqueue(pod, &self.state);
        (!status.is_success()).then(|| status.message())
    }

    /// The claim the pod names that does not exist yet, if one is why it waits (`None`
    /// also while its claim made from a template is not named in its status yet).
    pub fn claim_awaited(&self, pod_key: &ObjectKey) -> Option<ObjectKey> {
        let pod = self.state.pods.get(pod_key)?;
        crate::claims::named_of_pod(pod, &self.state).err()?.claim
    }

    /// What PostFilter asks for after the pod did not fit: a claim of this unbound pod that
    /// is allocated but reserved for nobody else, to give back so the pod can be placed
    /// elsewhere (so does a restarted scheduler find claims it allocated for a pod it never
    /// bound).
    pub fn claim_to_release(&self, pod_key: &ObjectKey) -> Option<ObjectKey> {
        let pod = self.state.pods.get(pod_key)?;
        match self
            .framework
            .as_ref()
            .ok()?
            .post_filter(pod, &self.state)?
        {
            crate::framework::PostFilterAction::ReleaseClaim(key) => Some(key),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    /// Change the state; the allocator's view is rebuilt on the next cycle.
    pub fn state_mut(&mut self) -> &mut ClusterState {
        self.snapshot = None;
        self.changes.dra_objects();
        &mut self.state
    }

    /// Pods waiting for this scheduler, in queue order: higher priority first, then the
    /// order they were given in (`order` maps a pod to its position).
    pub fn pending_pods(&self, order: &dyn Fn(&ObjectKey) -> usize, all: bool) -> Vec<ObjectKey> {
        let mut pending: Vec<(&ObjectKey, &Pod)> = self
            .state
            .pods
            .iter()
            .map(|(k, p)| (k, &**p))
            .filter(|(_, p)| bound_node(p).is_none() && !crate::state::is_terminal(p))
            .filter(|(_, p)| all || self.is_ours(p))
            .collect();
        // QueueSort (PrioritySort), then the order given; then namespace/name.
        let framework = self.framework.as_ref().ok();
        pending.sort_by(|(ka, a), (kb, b)| {
            let less = |x, y| framework.is_some_and(|f| f.less(x, y));
            if less(a, b) {
                std::cmp::Ordering::Less
            } else if less(b, a) {
                std::cmp::Ordering::Greater
            } else {
                (order(ka), *ka).cmp(&(order(kb), *kb))
            }
        });
        pending.into_iter().map(|(k, _)| k.clone()).collect()
    }

    /// Whether `pod` names this scheduler.
    pub fn is_ours(&self, pod: &Pod) -> bool {
        let name = pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref());
        name.unwrap_or("default-scheduler") == self.config.scheduler_name
    }

    pub(crate) fn snapshot(&mut self) -> Arc<Snapshot> {
        if let Some(s) = &self.snapshot {
            return s.clone();
        }
        let allocations = self
            .state
            .claims
            .values()
            .filter_map(|c| c.status.as_ref()?.allocation.clone())
            .chain(
                self.nominations
                    .values()
                    .flat_map(|h| h.allocations.iter().cloned()),
            )
            .collect();
        let snapshot = Arc::new(Snapshot::new(SnapshotInput {
            classes: self.state.classes.clone(),
            slices: self.state.slices.clone(),
            taint_rules: self.state.taint_rules.clone(),
            allocations,
            features: self.config.features.clone(),
            selector_cache: self.selector_cache.clone(),
        }));
        self.selector_cache = Some(snapshot.selector_cache());
        self.snapshot = Some(snapshot.clone());
        snapshot
    }

    pub(crate) fn feasible_nodes_to_find(&self, total: usize) -> usize {
        if total < 100 {
            return total.max(1);
        }
        let pct = match self.config.percentage_of_nodes_to_score {
            0 => (50 - total as i64 / 125).max(5) as usize,
            p => p.min(100) as usize,
        };
        (total * pct / 100).max(100)
    }

    /// Take a scheduled decision: claims get their allocation and the pod in `reservedFor`,
    /// the pod is bound to the node, and every later cycle sees it. A nomination of the pod
    /// ([`Engine::nominate`]) ends: its own claims hold its devices now.
    pub fn assume(&mut self, placement: &Placement) {
        self.release_nomination(&placement.pod);
        for decision in &placement.claims {
            let claim = self
                .state
                .claims
                .entry(decision.key.clone())
                .or_insert_with(|| Arc::new(decision.claim.clone()));
            let status = Arc::make_mut(claim)
                .status
                .get_or_insert_with(ResourceClaimStatus::default);
            if let Some(allocation) = &decision.allocation {
                status.allocation = Some(allocation.clone());
                self.changes.allocation(allocation);
                if let Some(snapshot) = self.snapshot.as_mut().and_then(Arc::get_mut) {
                    snapshot.add_allocation(allocation);
                } else {
                    self.snapshot = None;
                }
            }
            claims::reserve(status, &placement.consumer_of(decision));
        }
        for decision in &placement.volumes {
            self.assume_volume(decision);
        }
        if let Some(mut pod) = self.state.pods.get(&placement.pod).map(|p| Pod::clone(p))
            && (placement.pod_uid.is_none() || pod.metadata.uid == placement.pod_uid)
        {
            pod.spec.get_or_insert_with(Default::default).node_name = Some(placement.node.clone());
            if !placement.node_allocatable.is_empty() {
                pod.status
                    .get_or_insert_with(Default::default)
                    .node_allocatable_resource_claim_statuses =
                    Some(placement.node_allocatable.clone());
            }
            self.upsert_pod(pod);
        }
    }

    /// Undo [`Engine::assume`] (a write failed): the pod is pending again and the devices it
    /// was given are free again.
    pub fn forget(&mut self, placement: &Placement) {
        for decision in &placement.claims {
            let Some(claim) = self.state.claims.get_mut(&decision.key) else {
                continue;
            };
            if decision.create {
                self.state.claims.remove(&decision.key);
                if let Some(allocation) = &decision.allocation {
                    self.release(allocation);
                }
                continue;
            }
            let status = Arc::make_mut(claim)
                .status
                .get_or_insert_with(ResourceClaimStatus::default);
            claims::unreserve(status, &placement.consumer_of(decision));
            // Give back only what is still ours: the claim may hold someone else's
            // allocation by now, which stays.
            if let Some(allocation) = &decision.allocation
                && claims::take_if_ours(status, allocation)
            {
                self.release(allocation);
            }
        }
        for decision in &placement.volumes {
            self.forget_volume(decision);
        }
        self.forget_pod(placement);
    }

    /// Record a volume decision in the state, so the next pod sees the volume taken or the
    /// claim's node chosen (kube-scheduler's assume cache). Only where the API server's
    /// copy does not already say otherwise: an update that arrived first wins.
    fn assume_volume(&mut self, decision: &VolumeDecision) {
        let volumes = &mut self.state.volumes;
        match decision {
            VolumeDecision::Bind { volume, .. } => {
                let name = volume.metadata.name.clone().unwrap_or_default();
                let free = volumes.persistent_volumes.get(&name).is_some_and(|pv| {
                    pv.spec
                        .as_ref()
                        .and_then(|s| s.claim_ref.as_ref())
                        .is_none()
                });
                if free {
                    volumes.persistent_volumes.insert(name, volume.clone());
                }
            }
            VolumeDecision::Provision { claim, node, .. } => {
                if let Some(pvc) = volumes.claims.get_mut(claim)
                    && pvc
                        .spec
                        .as_ref()
                        .and_then(|s| s.volume_name.as_deref())
                        .is_none_or(str::is_empty)
                {
                    pvc.metadata
                        .annotations
                        .get_or_insert_with(Default::default)
                        .entry(crate::plugins::volume_binding::ANN_SELECTED_NODE.to_string())
                        .or_insert_with(|| node.clone());
                }
            }
        }
    }

    /// Undo [`Engine::assume_volume`] where the state still holds the assumption (not an
    /// update from the API server).
    fn forget_volume(&mut self, decision: &VolumeDecision) {
        let volumes = &mut self.state.volumes;
        match decision {
            VolumeDecision::Bind { volume, before, .. } => {
                let name = volume.metadata.name.clone().unwrap_or_default();
                if volumes.persistent_volumes.get(&name).is_some_and(|pv| {
                    pv.metadata.resource_version == before.metadata.resource_version
                        && pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref())
                            == volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref())
                }) {
                    volumes.persistent_volumes.insert(name, before.clone());
                }
            }
            VolumeDecision::Provision {
                claim,
                node,
                before,
            } => {
                if let Some(pvc) = volumes.claims.get_mut(claim)
                    && pvc.metadata.resource_version == before.metadata.resource_version
                    && pvc
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(crate::plugins::volume_binding::ANN_SELECTED_NODE))
                        == Some(node)
                {
                    *pvc = before.clone();
                }
            }
        }
    }

    /// The storage objects, to update from the informers. Unlike [`Engine::state_mut`] this
    /// leaves the allocator's view alone: volumes play no part in it.
    pub fn volumes_mut(&mut self) -> &mut crate::state::Volumes {
        &mut self.state.volumes
    }

    /// What selects pods (Services, ReplicationControllers, ReplicaSets, StatefulSets), to
    /// update from the informers. Only PodTopologySpread's default constraints read it, so
    /// the allocator's view is left alone.
    pub fn workloads_mut(&mut self) -> &mut crate::state::Workloads {
        &mut self.state.workloads
    }

    /// Undo only the pod's part of [`Engine::assume`]: it is pending again, while its
    /// claims keep what was assumed (their writes may have landed; the API server's copy
    /// replaces them when the informers bring it).
    pub fn forget_pod(&mut self, placement: &Placement) {
        if let Some(mut pod) = self.state.pods.get(&placement.pod).map(|p| Pod::clone(p))
            && (placement.pod_uid.is_none() || pod.metadata.uid == placement.pod_uid)
        {
            if let Some(spec) = pod.spec.as_mut() {
                spec.node_name = None;
            }
            if !placement.node_allocatable.is_empty()
                && let Some(status) = pod.status.as_mut()
            {
                status.node_allocatable_resource_claim_statuses = None;
            }
            self.upsert_pod(pod);
        }
    }

    fn release(&mut self, allocation: &AllocationResult) {
        self.changes.allocation(allocation);
        if let Some(snapshot) = self.snapshot.as_mut().and_then(Arc::get_mut) {
            snapshot.remove_allocation(allocation);
        } else {
            self.snapshot = None;
        }
    }
}

/// Updates from an informer. Pod changes leave the allocator's view alone; claim changes
/// update it in place (a busy cluster changes claims many times a second, and rebuilding
/// the view of every device each time would not keep up); everything else goes through
/// [`Engine::state_mut`], which rebuilds it on the next cycle.
impl Engine {
    pub fn upsert_pod(&mut self, pod: Pod) {
        let key = ObjectKey::of(&pod.metadata);
        self.changes.pod(&key);
        let old = self
            .state
            .pods
            .get(&key)
            .and_then(|p| bound_node(p))
            .map(str::to_string);
        for node in old.iter().map(String::as_str).chain(bound_node(&pod)) {
            self.changes.node(node);
        }
        self.state.upsert_pod(pod);
    }

    /// Remove a pod; a nomination of it ends.
    pub fn remove_pod(&mut self, key: &ObjectKey) {
        self.release_nomination(key);
        self.changes.forget_pod(key);
        if let Some(node) = self.state.remove_pod(key).as_deref().and_then(bound_node) {
            self.changes.node(node);
        }
    }

    /// Nodes are not part of the allocator's view (it is given the node per attempt), so
    /// node updates, frequent in a real cluster, leave it alone.
    pub fn upsert_node(&mut self, node: k8s_openapi::api::core::v1::Node) {
        self.changes
            .node(node.metadata.name.as_deref().unwrap_or_default());
        self.state.upsert_node(node);
    }

    /// Namespaces matter only for pod affinity terms' namespaceSelector: the device view
    /// is left alone.
    pub fn upsert_namespace(&mut self, namespace: k8s_openapi::api::core::v1::Namespace) {
        let name = namespace.metadata.name.clone().unwrap_or_default();
        self.state.namespaces.insert(name, namespace);
    }

    pub fn remove_namespace(&mut self, name: &str) {
        self.state.namespaces.remove(name);
    }

    pub fn remove_node(&mut self, name: &str) {
        self.changes.node(name);
        self.state.remove_node(name);
    }

    /// Add or replace a claim (unless the state holds a newer version); its devices are
    /// taken or given back in the allocator's view. Returns whether it was taken.
    pub fn upsert_claim(&mut self, claim: ResourceClaim) -> bool {
        let key = ObjectKey::of(&claim.metadata);
        let old = allocation_of(self.state.claims.get(&key).map(Arc::as_ref));
        let new = allocation_of(Some(&claim));
        if !self.state.upsert_claim(claim) {
            return false;
        }
        self.replace_allocation(old.as_ref(), new.as_ref());
        true
    }

    pub fn remove_claim(&mut self, key: &ObjectKey) {
        let old = allocation_of(self.state.claims.get(key).map(Arc::as_ref));
        self.state.remove_claim(key);
        self.replace_allocation(old.as_ref(), None);
    }

    fn replace_allocation(
        &mut self,
        old: Option<&AllocationResult>,
        new: Option<&AllocationResult>,
    ) {
        if old == new {
            return;
        }
        for allocation in old.into_iter().chain(new) {
            self.changes.allocation(allocation);
        }
        match self.snapshot.as_mut().and_then(Arc::get_mut) {
            Some(snapshot) => {
                if let Some(old) = old {
                    snapshot.remove_allocation(old);
                }
                if let Some(new) = new {
                    snapshot.add_allocation(new);
                }
            }
            None => self.snapshot = None,
        }
    }

    /// Record `placement` in the state again after an update from the API server replaced
    /// the objects it touched (their writes have not all landed yet). Claims that already
    /// hold the placement's devices are left as they are.
    pub fn reassert(&mut self, placement: &Placement) {
        let mut missing = placement.clone();
        for decision in &mut missing.claims {
            if decision.allocation.is_none() {
                continue;
            }
            // Already ours, or someone else's (the API server's word wins; our write will
            // be refused): only an unallocated claim gets our devices again.
            if allocation_of(self.state.claims.get(&decision.key).map(Arc::as_ref)).is_some() {
                decision.allocation = None;
            }
        }
        self.assume(&missing);
    }
}

/// Devices held for nominated pods (see [`crate::preemption`]).
impl Engine {
    /// Hold what `preemption` freed for its pod: the devices of `preemption.placement`
    /// count as taken for every other pod of lower or equal priority until
    /// [`Engine::release_nomination`] (or until the pod is assumed or removed); the
    /// nominated pod itself, and pods of higher priority, see them free. A second
    /// nomination of the same pod replaces the first.
    ///
    /// Only devices are held: CPU, memory and other node resources the victims free are
    /// not (kube-scheduler holds those too, through the nominated pod's requests).
    pub fn nominate(&mut self, preemption: &crate::preemption::Preemption) {
        self.release_nomination(&preemption.pod);
        let priority = self
            .state
            .pods
            .get(&preemption.pod)
            .map(|p| crate::plugins::priority_sort::priority(p))
            .unwrap_or(0);
        let allocations: Vec<AllocationResult> = preemption
            .placement
            .claims
            .iter()
            .filter_map(|d| d.allocation.clone())
            .collect();
        for allocation in &allocations {
            self.take(allocation);
        }
        self.nominations.insert(
            preemption.pod.clone(),
            Hold {
                uid: preemption.placement.pod_uid.clone(),
                priority,
                node: preemption.node.clone(),
                allocations,
            },
        );
    }

    /// End the hold of [`Engine::nominate`]: the devices are free for every pod again
    /// (unless something else holds them). Nothing happens when the pod holds nothing.
    pub fn release_nomination(&mut self, pod: &ObjectKey) {
        if let Some(hold) = self.nominations.remove(pod) {
            for allocation in &hold.allocations {
                self.release(allocation);
            }
        }
    }

    /// The node a preemption nominated the pod for, while it holds devices there.
    pub fn nominated_node(&self, pod: &ObjectKey) -> Option<&str> {
        self.nominations.get(pod).map(|h| h.node.as_str())
    }

    /// Before a cycle of `pod`: give back, in the allocator's view, the holds that do not
    /// apply to it (its own, and those of pods of lower priority). Returns them for
    /// [`Engine::restore_holds`] after the cycle.
    pub(crate) fn lift_holds(&mut self, key: &ObjectKey, pod: &Pod) -> Vec<AllocationResult> {
        let uid = pod.metadata.uid.clone();
        let priority = crate::plugins::priority_sort::priority(pod);
        self.lift(|k, h| (k == key && (h.uid.is_none() || h.uid == uid)) || priority > h.priority)
    }

    /// [`Engine::lift_holds`] for a PodGroup's members (who share `pod`'s priority): their
    /// own holds and those of pods of lower priority.
    pub(crate) fn lift_holds_of(
        &mut self,
        members: &[ObjectKey],
        pod: &Pod,
    ) -> Vec<AllocationResult> {
        let priority = crate::plugins::priority_sort::priority(pod);
        self.lift(|k, h| members.contains(k) || priority > h.priority)
    }

    /// Give back, in the allocator's view, the holds `lifted` picks.
    fn lift(&mut self, lifted: impl Fn(&ObjectKey, &Hold) -> bool) -> Vec<AllocationResult> {
        let lifted: Vec<AllocationResult> = self
            .nominations
            .iter()
            .filter(|(k, h)| lifted(k, h))
            .flat_map(|(_, h)| h.allocations.iter().cloned())
            .collect();
        if lifted.is_empty() {
            return lifted;
        }
        if self.snapshot.as_mut().and_then(Arc::get_mut).is_none() {
            // Shared (or not built): a view of our own, with every hold in it.
            self.snapshot = None;
        }
        self.snapshot();
        let snapshot = self
            .snapshot
            .as_mut()
            .and_then(Arc::get_mut)
            .expect("just built, not shared");
        for allocation in &lifted {
            snapshot.remove_allocation(allocation);
        }
        lifted
    }

    /// After the cycle: the holds [`Engine::lift_holds`] gave back are taken again.
    pub(crate) fn restore_holds(&mut self, lifted: Vec<AllocationResult>) {
        if lifted.is_empty() {
            return;
        }
        match self.snapshot.as_mut().and_then(Arc::get_mut) {
            Some(snapshot) => {
                for allocation in &lifted {
                    snapshot.add_allocation(allocation);
                }
            }
            // Rebuilt from the state and every hold on the next cycle.
            None => self.snapshot = None,
        }
    }

    /// Count `allocation`'s devices as taken in the allocator's view.
    fn take(&mut self, allocation: &AllocationResult) {
        self.changes.allocation(allocation);
        if let Some(snapshot) = self.snapshot.as_mut().and_then(Arc::get_mut) {
            snapshot.add_allocation(allocation);
        } else {
            self.snapshot = None;
        }
    }
}

fn allocation_of(claim: Option<&ResourceClaim>) -> Option<AllocationResult> {
    claims::allocation(claim?).cloned()
}
