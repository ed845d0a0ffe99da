//! One pod's scheduling cycle: claims → core filters → allocator per node → score → pick.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dra_allocator::{
    AllocError, Allocation, Allocator, Features, Limits, Outcome, SelectorCache, Snapshot,
    SnapshotInput,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    AllocationResult, ResourceClaim, ResourceClaimConsumerReference, ResourceClaimStatus,
};
use rayon::prelude::*;

use crate::changes::Changes;
use crate::extended;
use crate::filters;
use crate::resources::pod_requests;
use crate::state::{ClusterInput, ClusterState, NodeInfo, ObjectKey, bound_node};

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
    /// How feasible nodes are ranked: `None` (the default) compares the criteria in strict
    /// order (firstAvailable rank, NUMA domains kept whole, device packing, least allocated
    /// cpu and memory); weights rank by a weighted sum of the criteria, each normalised to
    /// 0..100 across the feasible nodes, as kube-scheduler combines its score plugins.
    pub weights: Option<ScoreWeights>,
    /// The most one pod's device search may take, over all nodes (`filterTimeout`; like
    /// kube-scheduler's DRASchedulerFilterTimeout, 10 s by default). A pod that reaches it
    /// is unschedulable for this attempt, with a message that says so.
    pub filter_timeout: Duration,
}

/// Weights of the scoring criteria (see [`EngineConfig::weights`]); 0 ignores one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScoreWeights {
    /// Better-ranked firstAvailable subrequests chosen.
    pub prioritized_list: u32,
    /// Fewer whole free NUMA domains broken into.
    pub numa_alignment: u32,
    /// Fewer free devices left on the node (pack devices, keep whole nodes free).
    pub device_packing: u32,
    /// More cpu and memory left free (spread pods).
    pub least_allocated: u32,
}

/// kube-scheduler's default for DRASchedulerFilterTimeout.
pub const DEFAULT_FILTER_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            scheduler_name: "dra-scheduler".into(),
            percentage_of_nodes_to_score: 0,
            features: Features::default(),
            weights: None,
            filter_timeout: DEFAULT_FILTER_TIMEOUT,
        }
    }
}

/// Why a pod's claims cannot be used yet.
#[derive(Debug)]
struct ClaimsNotReady {
    message: String,
    /// A claim does not exist (yet), as opposed to existing in an unusable state.
    missing: bool,
}

impl ClaimsNotReady {
    fn missing(message: String) -> Self {
        ClaimsNotReady {
            message,
            missing: true,
        }
    }

    fn other(message: String) -> Self {
        ClaimsNotReady {
            message,
            missing: false,
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
}

/// A pod placed on a node.
#[derive(Clone, Debug)]
pub struct Placement {
    pub pod: ObjectKey,
    pub pod_uid: Option<String>,
    pub node: String,
    pub claims: Vec<ClaimDecision>,
    /// How long the device search for the pod's claims took on the chosen node (zero when
    /// nothing was allocated). All of a pod's claims are searched together.
    pub allocation_time: Duration,
}

/// The outcome of one scheduling cycle.
#[derive(Clone, Debug)]
pub enum Decision {
    Scheduled(Placement),
    /// No node fits now; `message` says why, grouped by reason.
    Unschedulable {
        pod: ObjectKey,
        message: String,
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
}

/// A node that passed or failed, with why.
enum NodeResult {
    Feasible {
        node: String,
        allocations: Found,
        score: Score,
        ext_claim: bool,
        took: Duration,
    },
    Unfit(String),
    Error(String),
    /// The search ran out of the pod's budget, or was cancelled; `claim` is the claim it
    /// was searching in.
    Stopped {
        cancelled: bool,
        claim: Option<String>,
    },
}

/// The devices of a feasible node. `AllocationResult`s (strings, configs, node selectors)
/// are built only for the node picked, from the allocator that found them.
enum Found {
    /// No claims to allocate.
    Nothing,
    /// By the allocator of the pod's claims.
    Plain(Allocation),
    /// By the allocator of the pod's claims plus the claim for extended resources.
    Ext(Allocation),
    /// Built at once: the allocator of a node that serves only some extended resources by
    /// DRA (a rare mix) is built for that node and not kept.
    Built(Vec<AllocationResult>),
}

/// Higher is better, compared in field order; ties go to the node name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Score {
    /// firstAvailable: sum over requests of (8 - chosen index), like upstream.
    prioritized: u32,
    /// Fewer fully free NUMA domains broken into.
    numa_kept: i64,
    /// Fewer free devices left on the node: pack devices, keep whole nodes free.
    packing: i64,
    /// Least allocated cpu and memory, in per-mille of allocatable.
    least_allocated: i64,
}

impl Engine {
    pub fn new(config: EngineConfig, input: ClusterInput) -> Self {
        Engine {
            config,
            state: ClusterState::new(input),
            snapshot: None,
            selector_cache: None,
            search_steps: AtomicU64::new(0),
            changes: Changes::default(),
            forked_at: None,
        }
    }

    /// A copy of the engine for one long search, so that this one can go on placing other
    /// pods meanwhile. The copy builds its own allocator view (selector results are shared).
    /// What it decides is checked with [`Engine::admit`] before it is taken here.
    pub fn fork(&self) -> Engine {
        Engine {
            config: self.config.clone(),
            state: self.state.clone(),
            snapshot: None,
            selector_cache: self.selector_cache.clone(),
            search_steps: AtomicU64::new(0),
            changes: Changes::default(),
            forked_at: Some(self.changes.now()),
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

    /// Why the pod cannot be tried yet because a claim it names does not exist (yet): the
    /// claim of a template that kube-controller-manager has not created, or a claim not
    /// found. Such a pod waits without an attempt (kube-scheduler's PreEnqueue).
    pub fn claims_missing(&self, pod_key: &ObjectKey) -> Option<String> {
        let pod = self.state.pods.get(pod_key)?;
        match self.pod_claims(pod) {
            Err(e) if e.missing => Some(e.message),
            _ => None,
        }
    }

    /// A claim of this unbound pod that is allocated but reserved for nobody else, which
    /// could be given back so the pod can be placed elsewhere. kube-scheduler does this
    /// after a pod turns out unschedulable (PostFilter); so does a restarted scheduler find
    /// claims it allocated for a pod it never bound.
    pub fn claim_to_release(&self, pod_key: &ObjectKey) -> Option<ObjectKey> {
        let pod = self.state.pods.get(pod_key)?;
        if bound_node(pod).is_some() {
            return None;
        }
        let uid = pod.metadata.uid.as_deref()?;
        self.pod_claims(pod).ok()?.into_iter().find(|key| {
            let Some(status) = self.state.claims.get(key).and_then(|c| c.status.as_ref()) else {
                return false;
            };
            let reserved = status.reserved_for.as_deref().unwrap_or_default();
            status.allocation.is_some()
                && (reserved.is_empty() || (reserved.len() == 1 && reserved[0].uid == uid))
        })
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
            .filter(|(_, p)| bound_node(p).is_none() && !crate::state::is_terminal(p))
            .filter(|(_, p)| all || self.is_ours(p))
            .collect();
        // Ties (same priority and position) fall back to namespace/name: deterministic.
        pending.sort_by_key(|(k, p)| {
            let priority = p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
            (std::cmp::Reverse(priority), order(k), (*k).clone())
        });
        pending.into_iter().map(|(k, _)| k.clone()).collect()
    }

    /// Whether `pod` names this scheduler.
    pub fn is_ours(&self, pod: &Pod) -> bool {
        let name = pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref());
        name.unwrap_or("default-scheduler") == self.config.scheduler_name
    }

    fn snapshot(&mut self) -> Arc<Snapshot> {
        if let Some(s) = &self.snapshot {
            return s.clone();
        }
        let allocations = self
            .state
            .claims
            .values()
            .filter_map(|c| c.status.as_ref()?.allocation.clone())
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

    /// The claims a pod references, by pod claim name, or why one is not usable yet.
    fn pod_claims(&self, pod: &Pod) -> Result<Vec<ObjectKey>, ClaimsNotReady> {
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref());
        let mut keys = Vec::new();
        for pc in pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .into_iter()
            .flatten()
        {
            let name = if let Some(name) = pc.resource_claim_name.as_deref() {
                name.to_string()
            } else if pc.resource_claim_template_name.is_some() {
                match statuses.and_then(|s| s.iter().find(|s| s.name == pc.name)) {
                    Some(s) => match s.resource_claim_name.as_deref() {
                        Some(n) => n.to_string(),
                        // The controller decided the pod needs no claim here.
                        None => continue,
                    },
                    None => {
                        return Err(ClaimsNotReady::missing(format!(
                            "waiting for the ResourceClaim of pod claim {} to be created from ResourceClaimTemplate {}",
                            pc.name,
                            pc.resource_claim_template_name
                                .as_deref()
                                .unwrap_or_default()
                        )));
                    }
                }
            } else {
                return Err(ClaimsNotReady::other(format!(
                    "pod claim {} names neither a claim nor a template",
                    pc.name
                )));
            };
            let key = ObjectKey::new(ns.clone(), name);
            let Some(claim) = self.state.claims.get(&key) else {
                return Err(ClaimsNotReady::missing(format!(
                    "ResourceClaim {key} not found"
                )));
            };
            if claim.metadata.deletion_timestamp.is_some() {
                return Err(ClaimsNotReady::other(format!(
                    "ResourceClaim {key} is being deleted"
                )));
            }
            if let (Some(template), Some(owner)) = (
                pc.resource_claim_template_name.as_deref(),
                pod.metadata.name.as_deref(),
            ) {
                let owned = claim.metadata.owner_references.iter().flatten().any(|o| {
                    o.kind == "Pod"
                        && o.name == owner
                        && (pod.metadata.uid.is_none()
                            || pod.metadata.uid.as_deref() == Some(&o.uid))
                });
                if !owned {
                    return Err(ClaimsNotReady::other(format!(
                        "ResourceClaim {key} was not created for this pod from template {template}"
                    )));
                }
            }
            keys.push(key);
        }
        Ok(keys)
    }

    /// Run the scheduling cycle for one pod. Does not change the state: call
    /// [`Engine::assume`] with a `Scheduled` decision to take it.
    pub fn schedule(&mut self, pod_key: &ObjectKey) -> Decision {
        self.schedule_with(pod_key, None)
    }

    /// [`Engine::schedule`] that stops early when `cancel` is set (the daemon sets it when
    /// it stops leading or shuts down). Either way the device search of one pod is bounded
    /// by [`EngineConfig::filter_timeout`].
    pub fn schedule_with(&mut self, pod_key: &ObjectKey, cancel: Option<&AtomicBool>) -> Decision {
        self.schedule_within(pod_key, self.config.filter_timeout, cancel)
    }

    /// [`Engine::schedule_with`] with a budget of its own for the device search (a first,
    /// short try; the daemon gives a pod that needs more the whole budget on a fork).
    pub fn schedule_within(
        &mut self,
        pod_key: &ObjectKey,
        budget: Duration,
        cancel: Option<&AtomicBool>,
    ) -> Decision {
        self.search_steps.store(0, Ordering::Relaxed);
        let limits = Limits {
            deadline: Some(Instant::now() + budget),
            cancel,
        };
        let Some(pod) = self.state.pods.get(pod_key).cloned() else {
            return Decision::Error {
                pod: pod_key.clone(),
                message: format!("pod {pod_key} not found"),
            };
        };
        let unschedulable = |message: String| Decision::Unschedulable {
            pod: pod_key.clone(),
            message,
        };
        let claim_keys = match self.pod_claims(&pod) {
            Ok(k) => k,
            Err(e) => return unschedulable(e.message),
        };
        let requests = match pod_requests(&pod) {
            Ok(r) => r,
            Err(e) => {
                return Decision::Error {
                    pod: pod_key.clone(),
                    message: format!("pod {pod_key}: {e}"),
                };
            }
        };
        let pod_uid = pod.metadata.uid.clone();
        let pod_name = pod.metadata.name.clone().unwrap_or_default();

        // Claims already allocated are checked by node selector; the rest are allocated.
        let mut allocated: Vec<(ObjectKey, ResourceClaim)> = Vec::new();
        let mut to_allocate: Vec<(ObjectKey, ResourceClaim)> = Vec::new();
        for key in &claim_keys {
            let claim = self.state.claims[key].clone();
            let status = claim.status.as_ref();
            let reserved = status
                .and_then(|s| s.reserved_for.as_ref())
                .map(Vec::len)
                .unwrap_or(0);
            let reserved_for_us = status
                .and_then(|s| s.reserved_for.as_ref())
                .is_some_and(|r| r.iter().any(|c| is_pod(c, &pod_name, pod_uid.as_deref())));
            if reserved >= 256 && !reserved_for_us {
                return unschedulable(format!(
                    "ResourceClaim {key} is reserved for the maximum of 256 consumers"
                ));
            }
            if status.and_then(|s| s.allocation.as_ref()).is_some() {
                allocated.push((key.clone(), claim));
            } else if !to_allocate.iter().any(|(k, _)| k == key) {
                to_allocate.push((key.clone(), claim));
            }
        }

        // Extended resources served by DRA, resolved per node below.
        let ext = extended::requests_served_by_dra(&requests, &self.state.classes);

        let snapshot = self.snapshot();
        // Claims are checked and their selectors compiled once for all nodes.
        let plain: Vec<&ResourceClaim> = to_allocate.iter().map(|(_, c)| c).collect();
        let allocator_plain = match (!plain.is_empty()).then(|| Allocator::new(&snapshot, &plain)) {
            None => None,
            Some(Ok(a)) => Some(a),
            Some(Err(e)) => {
                return Decision::Error {
                    pod: pod_key.clone(),
                    message: attempt_error(&e),
                };
            }
        };
        let ext_claim_all =
            (!ext.is_empty()).then(|| extended::claim_for(&pod, &ext.iter().collect::<Vec<_>>()).0);
        let allocator_ext = match ext_claim_all.as_ref().map(|c| {
            let mut claims = plain.clone();
            claims.push(c);
            Allocator::new(&snapshot, &claims)
        }) {
            None => None,
            Some(Ok(a)) => Some(a),
            Some(Err(e)) => {
                return Decision::Error {
                    pod: pod_key.clone(),
                    message: attempt_error(&e),
                };
            }
        };
        let node_names: Vec<String> = self.state.nodes.keys().cloned().collect();
        let total = node_names.len();
        let wanted = self.feasible_nodes_to_find(total);
        let state = &self.state;
        let steps = &self.search_steps;
        let ports = filters::host_ports(&pod);

        let evaluate = |name: &String| -> NodeResult {
            let info = &state.nodes[name];
            let node = &info.node;
            let check = filters::node_name(&pod, node)
                .and_then(|_| filters::unschedulable(&pod, node))
                .and_then(|_| filters::taints(&pod, node))
                .and_then(|_| filters::node_affinity(&pod, node))
                .and_then(|_| match &info.broken {
                    Some(b) => Err(b.clone()),
                    None => Ok(()),
                })
                .and_then(|_| {
                    filters::resources_fit(
                        &requests,
                        &info.allocatable,
                        &info.used,
                        info.pods,
                        &|r| ext.iter().any(|e| e.resource == r),
                    )
                })
                .and_then(|_| filters::host_ports_free(&ports, &info.ports));
            if let Err(reason) = check {
                return NodeResult::Unfit(reason);
            }
            for (key, claim) in &allocated {
                if let Some(sel) = claim
                    .status
                    .as_ref()
                    .and_then(|s| s.allocation.as_ref())
                    .and_then(|a| a.node_selector.as_ref())
                    && !filters::node_selector_terms_match(&sel.node_selector_terms, node)
                {
                    return NodeResult::Unfit(format!(
                        "ResourceClaim {key} is allocated to devices not reachable from the node"
                    ));
                }
            }
            // Extended resources the node has no device-plugin capacity for go to DRA.
            let ext_here: Vec<&extended::ExtendedRequest> = ext
                .iter()
                .filter(|e| !info.allocatable.0.contains_key(&e.resource))
                .collect();
            let own;
            // How a compact answer is kept for later; `None`: results are built at once.
            type Keep = Option<fn(Allocation) -> Found>;
            let (allocator, keep): (_, Keep) = if ext_here.is_empty() {
                (allocator_plain.as_ref(), Some(Found::Plain))
            } else if ext_here.len() == ext.len() {
                (allocator_ext.as_ref(), Some(Found::Ext))
            } else {
                // Some extended resources by device plugin, others by DRA: a rare mix.
                let (claim, _) = extended::claim_for(&pod, &ext_here);
                let mut claims: Vec<&ResourceClaim> = to_allocate.iter().map(|(_, c)| c).collect();
                claims.push(&claim);
                own = match Allocator::new(&snapshot, &claims) {
                    Ok(a) => a,
                    Err(e) => return NodeResult::Error(attempt_error(&e)),
                };
                (Some(&own), None)
            };
            let mut took = Duration::ZERO;
            let (allocations, score) = match allocator {
                None => (Found::Nothing, score(info, &requests, None)),
                Some(allocator) => match {
                    let started = Instant::now();
                    let r = allocator.allocate_with(node, limits);
                    took = started.elapsed();
                    r
                } {
                    Ok((outcome, stats)) => {
                        steps.fetch_add(stats.steps, Ordering::Relaxed);
                        match outcome {
                            Outcome::Allocated(a) => {
                                let score = score(info, &requests, Some(&a.quality));
                                match keep {
                                    Some(keep) => (keep(a), score),
                                    None => match allocator.results(node, &a) {
                                        Ok(r) => (Found::Built(r), score),
                                        Err(e) => return NodeResult::Error(attempt_error(&e)),
                                    },
                                }
                            }
                            Outcome::Unfit(explanation) => {
                                return NodeResult::Unfit(describe_unfit(&explanation));
                            }
                        }
                    }
                    Err(AllocError::Aborted {
                        steps: n, claim, ..
                    }) => {
                        steps.fetch_add(n, Ordering::Relaxed);
                        return NodeResult::Stopped {
                            cancelled: cancel.is_some_and(|c| c.load(Ordering::Relaxed)),
                            claim,
                        };
                    }
                    Err(e) => return NodeResult::Error(attempt_error(&e)),
                },
            };
            NodeResult::Feasible {
                node: name.clone(),
                allocations,
                score,
                ext_claim: !ext_here.is_empty(),
                took,
            }
        };

        // Evaluate nodes in parallel, a chunk at a time, until enough are feasible.
        let mut results: Vec<NodeResult> = Vec::with_capacity(total);
        let mut feasible = 0;
        let chunk = 64.max(wanted.min(total));
        for names in node_names.chunks(chunk) {
            let part: Vec<NodeResult> = names.par_iter().map(&evaluate).collect();
            if let Some(NodeResult::Stopped { cancelled, claim }) = part
                .iter()
                .find(|r| matches!(r, NodeResult::Stopped { .. }))
            {
                let cancelled = *cancelled;
                // The claim the search was in; all the pod's claims if it was between two.
                let claims: Vec<String> = match claim {
                    Some(claim) => vec![claim.clone()],
                    None => to_allocate
                        .iter()
                        .map(|(k, _)| k.to_string())
                        .chain(ext_claim_all.iter().map(|_| "(extended resources)".into()))
                        .collect(),
                };
                let checked = results.len()
                    + part
                        .iter()
                        .filter(|r| !matches!(r, NodeResult::Stopped { .. }))
                        .count();
                if cancelled {
                    return Decision::Error {
                        pod: pod_key.clone(),
                        message: "scheduling attempt cancelled".into(),
                    };
                }
                return Decision::OutOfTime {
                    pod: pod_key.clone(),
                    message: format!(
                        "timed out trying to allocate devices: the search for ResourceClaim {} ran past {} of {budget:?} ({checked} of {total} nodes checked)",
                        claims.join(", "),
                        if budget == self.config.filter_timeout {
                            "the filterTimeout"
                        } else {
                            "a first try"
                        },
                    ),
                };
            }
            if let Some(NodeResult::Error(message)) =
                part.iter().find(|r| matches!(r, NodeResult::Error(_)))
            {
                return Decision::Error {
                    pod: pod_key.clone(),
                    message: message.clone(),
                };
            }
            feasible += part
                .iter()
                .filter(|r| matches!(r, NodeResult::Feasible { .. }))
                .count();
            results.extend(part);
            if feasible >= wanted {
                break;
            }
        }

        let feasible: Vec<(&Score, &String)> = results
            .iter()
            .filter_map(|r| match r {
                NodeResult::Feasible { node, score, .. } => Some((score, node)),
                _ => None,
            })
            .collect();
        let best = pick(&feasible, self.config.weights.as_ref());
        let Some(best) = best else {
            return unschedulable(group_reasons(total, &results));
        };
        let Some(NodeResult::Feasible {
            node,
            allocations,
            ext_claim,
            took,
            ..
        }) = results
            .into_iter()
            .find(|r| matches!(r, NodeResult::Feasible { node, .. } if *node == best))
        else {
            unreachable!("the best node is among the results")
        };

        // Results are built for the chosen node only.
        let built = match allocations {
            Found::Nothing => Ok(Vec::new()),
            Found::Built(results) => Ok(results),
            Found::Plain(a) => allocator_plain
                .as_ref()
                .expect("found by this allocator")
                .results(&self.state.nodes[&node].node, &a),
            Found::Ext(a) => allocator_ext
                .as_ref()
                .expect("found by this allocator")
                .results(&self.state.nodes[&node].node, &a),
        };
        let mut allocations = match built {
            Ok(results) => results.into_iter(),
            Err(e) => {
                return Decision::Error {
                    pod: pod_key.clone(),
                    message: attempt_error(&e),
                };
            }
        };
        let mut claims: Vec<ClaimDecision> = Vec::new();
        for key in &claim_keys {
            if let Some((_, claim)) = allocated.iter().find(|(k, _)| k == key) {
                claims.push(ClaimDecision {
                    key: key.clone(),
                    claim: claim.clone(),
                    allocation: None,
                    create: false,
                    extended_mappings: Vec::new(),
                });
            } else if !claims.iter().any(|c| &c.key == key) {
                let claim = self.state.claims[key].clone();
                claims.push(ClaimDecision {
                    key: key.clone(),
                    claim,
                    allocation: allocations.next(),
                    create: false,
                    extended_mappings: Vec::new(),
                });
            }
        }
        if ext_claim {
            let info = &self.state.nodes[&node];
            let ext_here: Vec<&extended::ExtendedRequest> = ext
                .iter()
                .filter(|e| !info.allocatable.0.contains_key(&e.resource))
                .collect();
            let (claim, extended_mappings) = extended::claim_for(&pod, &ext_here);
            let key = ObjectKey::of(&claim.metadata);
            claims.push(ClaimDecision {
                key,
                claim,
                allocation: allocations.next(),
                create: true,
                extended_mappings,
            });
        }
        Decision::Scheduled(Placement {
            pod: pod_key.clone(),
            pod_uid,
            node,
            claims,
            allocation_time: took,
        })
    }

    fn feasible_nodes_to_find(&self, total: usize) -> usize {
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
    /// the pod is bound to the node, and every later cycle sees it.
    pub fn assume(&mut self, placement: &Placement) {
        let pod_ref = ResourceClaimConsumerReference {
            resource: "pods".into(),
            name: placement.pod.name.clone(),
            uid: placement.pod_uid.clone().unwrap_or_default(),
            api_group: None,
        };
        for decision in &placement.claims {
            let claim = self
                .state
                .claims
                .entry(decision.key.clone())
                .or_insert_with(|| decision.claim.clone());
            let status = claim
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
            let reserved = status.reserved_for.get_or_insert_with(Vec::new);
            let uid = placement.pod_uid.as_deref();
            if !reserved.iter().any(|r| is_pod(r, &pod_ref.name, uid)) {
                reserved.push(pod_ref.clone());
            }
        }
        if let Some(mut pod) = self.state.pods.get(&placement.pod).cloned()
            && (placement.pod_uid.is_none() || pod.metadata.uid == placement.pod_uid)
        {
            pod.spec.get_or_insert_with(Default::default).node_name = Some(placement.node.clone());
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
            let status = claim
                .status
                .get_or_insert_with(ResourceClaimStatus::default);
            if let Some(reserved) = status.reserved_for.as_mut() {
                let uid = placement.pod_uid.as_deref();
                reserved.retain(|r| !is_pod(r, &placement.pod.name, uid));
            }
            // Give back only what is still ours: the claim may hold someone else's
            // allocation by now, which stays.
            if let Some(allocation) = &decision.allocation
                && status
                    .allocation
                    .as_ref()
                    .is_some_and(|a| same_devices(a, allocation))
            {
                status.allocation = None;
                let allocation = allocation.clone();
                self.release(&allocation);
            }
        }
        self.forget_pod(placement);
    }

    /// Undo only the pod's part of [`Engine::assume`]: it is pending again, while its
    /// claims keep what was assumed (their writes may have landed; the API server's copy
    /// replaces them when the informers bring it).
    pub fn forget_pod(&mut self, placement: &Placement) {
        if let Some(mut pod) = self.state.pods.get(&placement.pod).cloned()
            && (placement.pod_uid.is_none() || pod.metadata.uid == placement.pod_uid)
        {
            if let Some(spec) = pod.spec.as_mut() {
                spec.node_name = None;
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

/// The best of the feasible nodes: by weighted sum when weights are set, then by the
/// criteria in order; among equals, the first node by name.
fn pick(feasible: &[(&Score, &String)], weights: Option<&ScoreWeights>) -> Option<String> {
    let criteria = |s: &Score| {
        [
            i64::from(s.prioritized),
            s.numa_kept,
            s.packing,
            s.least_allocated,
        ]
    };
    let totals: Vec<i64> = match weights {
        None => vec![0; feasible.len()],
        Some(w) => {
            let w = [
                w.prioritized_list,
                w.numa_alignment,
                w.device_packing,
                w.least_allocated,
            ];
            let mut totals = vec![0i64; feasible.len()];
            for (c, weight) in w.iter().enumerate() {
                let values: Vec<i64> = feasible.iter().map(|(s, _)| criteria(s)[c]).collect();
                let (Some(&lo), Some(&hi)) = (values.iter().min(), values.iter().max()) else {
                    continue;
                };
                for (total, v) in totals.iter_mut().zip(&values) {
                    let normalised = if hi == lo {
                        100
                    } else {
                        (v - lo) * 100 / (hi - lo)
                    };
                    *total += i64::from(*weight) * normalised;
                }
            }
            totals
        }
    };
    feasible
        .iter()
        .zip(totals)
        .max_by(|((sa, na), ta), ((sb, nb), tb)| ta.cmp(tb).then(sa.cmp(sb)).then(nb.cmp(na)))
        .map(|((_, n), _)| (*n).clone())
}

fn score(
    info: &NodeInfo,
    requests: &crate::resources::ResourceList,
    quality: Option<&dra_allocator::Quality>,
) -> Score {
    let free_share = |name: &str| -> i64 {
        let alloc = info.allocatable.get(name).nanos();
        if alloc <= 0 {
            return 0;
        }
        let used = info.used.get(name).nanos() + requests.get(name).nanos();
        (((alloc - used).max(0) * 1000) / alloc) as i64
    };
    Score {
        prioritized: quality.map(|q| q.prioritized_score).unwrap_or(0),
        numa_kept: -(quality.map(|q| q.numa_domains_broken).unwrap_or(0) as i64),
        packing: -(quality.map(|q| q.free_devices_after).unwrap_or(0) as i64),
        least_allocated: (free_share("cpu") + free_share("memory")) / 2,
    }
}

/// The allocator's explanation without the node name, so equal reasons group.
fn describe_unfit(explanation: &dra_allocator::Explanation) -> String {
    let mut parts: Vec<String> = explanation.requests.iter().map(|r| r.to_string()).collect();
    parts.extend(explanation.notes.iter().cloned());
    if !explanation.incomplete_pools.is_empty() {
        parts.push(format!(
            "pools being updated: {}",
            explanation.incomplete_pools.join(", ")
        ));
    }
    if !explanation.invalid_pools.is_empty() {
        parts.push(format!(
            "invalid pools: {}",
            explanation.invalid_pools.join(", ")
        ));
    }
    if parts.is_empty() {
        "cannot allocate all claims".into()
    } else {
        parts.join("; ")
    }
}

fn attempt_error(e: &AllocError) -> String {
    e.to_string()
}

/// "0/8 nodes are available: 3 nodes: Insufficient cpu; 5 nodes: claim ...".
fn group_reasons(total: usize, results: &[NodeResult]) -> String {
    let mut groups: BTreeMap<&str, usize> = BTreeMap::new();
    for r in results {
        if let NodeResult::Unfit(reason) = r {
            *groups.entry(reason.as_str()).or_default() += 1;
        }
    }
    if total == 0 {
        return "0/0 nodes are available: no nodes in the cluster".into();
    }
    let mut groups: Vec<(&str, usize)> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let body = groups
        .iter()
        .map(|(reason, n)| format!("{n} node{}: {reason}", if *n == 1 { "" } else { "s" }))
        .collect::<Vec<_>>()
        .join("; ");
    format!("0/{total} nodes are available: {body}")
}

/// Whether a `reservedFor` entry is this pod: by UID where the pod has one (a pod deleted
/// and created again under the same name is another consumer), else by name.
fn is_pod(entry: &ResourceClaimConsumerReference, name: &str, uid: Option<&str>) -> bool {
    entry.resource == "pods"
        && entry.api_group.as_deref().unwrap_or_default().is_empty()
        && match uid {
            Some(uid) if !uid.is_empty() => entry.uid == uid,
            _ => entry.name == name,
        }
}

/// Whether two allocations hold the same devices where (the timestamp aside).
fn same_devices(a: &AllocationResult, b: &AllocationResult) -> bool {
    a.devices == b.devices && a.node_selector == b.node_selector
}

fn allocation_of(claim: Option<&ResourceClaim>) -> Option<AllocationResult> {
    claim?.status.as_ref()?.allocation.clone()
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
            .and_then(bound_node)
            .map(str::to_string);
        for node in old.iter().map(String::as_str).chain(bound_node(&pod)) {
            self.changes.node(node);
        }
        self.state.upsert_pod(pod);
    }

    pub fn remove_pod(&mut self, key: &ObjectKey) {
        self.changes.forget_pod(key);
        if let Some(node) = self.state.remove_pod(key).as_ref().and_then(bound_node) {
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

    pub fn remove_node(&mut self, name: &str) {
        self.changes.node(name);
        self.state.remove_node(name);
    }

    /// Add or replace a claim (unless the state holds a newer version); its devices are
    /// taken or given back in the allocator's view. Returns whether it was taken.
    pub fn upsert_claim(&mut self, claim: ResourceClaim) -> bool {
        let key = ObjectKey::of(&claim.metadata);
        let old = allocation_of(self.state.claims.get(&key));
        let new = allocation_of(Some(&claim));
        if !self.state.upsert_claim(claim) {
            return false;
        }
        self.replace_allocation(old.as_ref(), new.as_ref());
        true
    }

    pub fn remove_claim(&mut self, key: &ObjectKey) {
        let old = allocation_of(self.state.claims.get(key));
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
            if allocation_of(self.state.claims.get(&decision.key)).is_some() {
                decision.allocation = None;
            }
        }
        self.assume(&missing);
    }
}
