//! DynamicResources: a pod's ResourceClaims (and extended resources that a DeviceClass
//! serves) must get devices on the node.
//!
//! - PreEnqueue: a pod whose claims do not exist yet waits without an attempt.
//! - PreFilter: resolve the pod's claims; build one allocator for all claims to allocate
//!   (selectors compiled once for all nodes).
//! - Filter: claims already allocated must be reachable from the node; the rest are
//!   allocated on it (`dra-allocator`), within the attempt's budget. With
//!   DRANodeAllocatableResources, what the pod's devices map of the node's CPU, memory or
//!   hugepages is added to its requests and must fit, and a claim with a mapped device is
//!   not shared ([`crate::node_allocatable`]).
//! - PostFilter: a claim allocated for this pod but reserved for nobody can be given back.
//! - Score: the prioritized-list score (firstAvailable subrequests chosen), as upstream.
//! - Reserve: the allocation results for the chosen node (and the pod's node allocatable
//!   resource claim statuses) go into the placement; the binder writes them (PreBind)
//!   before the binding.
//!
//! For a PodGroup's joint allocation the cycle may carry claims of other members already
//! on the node ([`Cycle::revise`]): they are allocated again in one search with this pod's
//! claims (theirs first), so an earlier member's devices change when that lets this pod
//! fit; their new allocations go to [`crate::framework::Shared::revised`].

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use dra_allocator::{AllocError, Allocation, Allocator, Outcome};
use k8s_openapi::api::core::v1::{NodeAllocatableResourceClaimStatus, Pod};
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};

use super::node_affinity::node_selector_terms_match;
use crate::claims::{self, ClaimsNotReady};
use crate::device_memo::{self, Kept};
use crate::engine::{ClaimDecision, Placement};
use crate::extended::{self, ExtendedRequest};
use crate::framework::{
    ByNode, Code, Cycle, Plugin, PluginCycle, Point, PostFilterAction, Status,
    default_normalize_score,
};
use crate::node_allocatable;
use crate::state::{ClusterState, NodeInfo, ObjectKey};

pub struct DynamicResources;

/// The devices found on a feasible node. `AllocationResult`s (strings, configs, node
/// selectors) are built only for the node chosen, by the allocator that found them.
enum Found {
    /// No claims to allocate.
    Nothing,
    /// By the allocator of the pod's claims (shared with [`DeviceMemo`]).
    Plain(Arc<Allocation>),
    /// By the allocator of the pod's claims plus the claim for extended resources.
    Ext(Arc<Allocation>),
    /// Built at once: the allocator of a node that serves only some extended resources by
    /// DRA (a rare mix) is built for that node and not kept.
    Built(Vec<AllocationResult>),
}

struct NodeDevices {
    found: Found,
    /// What the pod's devices map of the node's resources, per claim.
    node_allocatable: Vec<NodeAllocatableResourceClaimStatus>,
    /// How good the devices found are; Filter moves it to [`crate::framework::Shared`] for Score.
    quality: Option<Arc<Allocation>>,
    /// The claim for extended resources is part of the answer.
    ext_claim: bool,
    took: Duration,
}

struct DraCycle<'a> {
    cycle: &'a Cycle<'a>,
    /// The pod's claims, in pod order, once PreFilter resolved them.
    keys: Vec<ObjectKey>,
    /// The same, each with its name in the pod.
    named: Vec<(String, ObjectKey)>,
    allocated: Vec<(ObjectKey, &'a ResourceClaim)>,
    to_allocate: Vec<(ObjectKey, &'a ResourceClaim)>,
    /// Extended resources DeviceClasses serve, resolved per node.
    ext: Vec<ExtendedRequest>,
    plain: Option<Allocator<'a>>,
    with_ext: Option<Allocator<'a>>,
    /// DRANodeAllocatableResources is on and some device maps node resources: the
    /// pod's devices are counted against the node ([`node_allocatable`]).
    maps_node_resources: bool,
    /// What Filter found per node ([`NodeInfo::object_version`]), for Score and Reserve.
    nodes: ByNode<NodeDevices>,
    /// The memo's answers for the claims' shape, when what is found on a node may be kept
    /// for later pods ([`DeviceMemo`]): only this pod's own claims, no extended resources.
    memo: Option<Arc<device_memo::Table>>,
    /// Kept reasons in the words of this pod's claims (of that shape).
    renamed: device_memo::Renamed,
}

impl Plugin for DynamicResources {
    fn name(&self) -> &'static str {
        "DynamicResources"
    }

    fn points(&self) -> &'static [Point] {
        super::points_of("DynamicResources").unwrap_or_default()
    }

    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(DraCycle {
            cycle,
            keys: Vec::new(),
            named: Vec::new(),
            allocated: Vec::new(),
            to_allocate: Vec::new(),
            ext: Vec::new(),
            plain: None,
            with_ext: None,
            maps_node_resources: false,
            nodes: ByNode::with_room_for(cycle.state.nodes.len()),
            memo: None,
            renamed: device_memo::Renamed::default(),
        })
    }

    fn pre_enqueue(&self, pod: &Pod, state: &ClusterState) -> Status {
        match claims::of_pod(pod, state) {
            Err(ClaimsNotReady {
                message,
                missing: true,
                ..
            }) => Status::unresolvable(message),
            _ => Status::success(),
        }
    }

    fn post_filter(&self, pod: &Pod, state: &ClusterState) -> Option<PostFilterAction> {
        claims::to_release(pod, state).map(PostFilterAction::ReleaseClaim)
    }
}

impl<'a> PluginCycle for DraCycle<'a> {
    fn pre_filter(&mut self) -> Status {
        let cx = self.cycle;
        self.named = match claims::named_of_pod(cx.pod, cx.state) {
            Ok(named) => named,
            Err(e) => return Status::unresolvable(e.message),
        };
        self.keys = self.named.iter().map(|(_, key)| key.clone()).collect();
        self.maps_node_resources =
            cx.features.node_allocatable_resources && cx.snapshot.maps_node_resources();
        self.ext = extended::requests_served_by_dra(cx.requests, &cx.state.classes);
        if self.keys.is_empty() && self.ext.is_empty() {
            return Status::skip();
        }
        for key in &self.keys {
            if cx.revise.iter().any(|(k, _)| k == key) {
                // Shared with a member whose devices are chosen again: allocated with them.
                continue;
            }
            let claim = &cx.state.claims[key];
            if let Err(reason) = claims::may_reserve(claim, cx.pod) {
                return Status::unresolvable(format!("ResourceClaim {key} {reason}"));
            }
            if claims::allocation(claim).is_some() {
                self.allocated.push((key.clone(), claim));
            } else if !self.to_allocate.iter().any(|(k, _)| k == key) {
                self.to_allocate.push((key.clone(), claim));
            }
        }
        // Claims are checked and their selectors compiled once for all nodes.
        let plain = self.claims_to_allocate();
        if !plain.is_empty() {
            match Allocator::new(cx.snapshot, &plain) {
                Ok(a) => self.plain = Some(a),
                Err(e) => return Status::error(e.to_string()),
            }
            if let Some(memo) = cx.device_memo
                && cx.revise.is_empty()
                && self.ext.is_empty()
            {
                let shape = device_memo::shape_of(&plain);
                self.memo = Some(memo.begin(cx.snapshot, shape, cx.state.node_slots.end()));
                self.renamed = device_memo::Renamed::new(
                    plain
                        .iter()
                        .map(|c| {
                            format!(
                                "{}/{}",
                                c.metadata.namespace.as_deref().unwrap_or_default(),
                                c.metadata.name.as_deref().unwrap_or_default()
                            )
                        })
                        .collect(),
                );
            }
        }
        if !self.ext.is_empty() {
            let (claim, _) = extended::claim_for(cx.pod, &self.ext.iter().collect::<Vec<_>>());
            let mut all = plain;
            all.push(&claim);
            match Allocator::new(cx.snapshot, &all) {
                Ok(a) => self.with_ext = Some(a),
                Err(e) => return Status::error(e.to_string()),
            }
        }
        Status::success()
    }

    fn filter(&self, node: &NodeInfo) -> Status {
        for (key, claim) in &self.allocated {
            if let Some(selector) = claims::allocation(claim).and_then(|a| a.node_selector.as_ref())
                && !node_selector_terms_match(&selector.node_selector_terms, &node.node)
            {
                return Status::unresolvable(format!(
                    "ResourceClaim {key} is allocated to devices not reachable from the node"
                ));
            }
        }
        if self.maps_node_resources
            && let Some(status) = self.shared_mapped_claim()
        {
            return status;
        }
        match self
            .allocate(node)
            .and_then(|d| self.count_node_resources(node, d))
        {
            Ok(mut devices) => {
                // Kept once, where the device scores read it too.
                if let Some(q) = devices.quality.take() {
                    self.cycle.shared.record_quality(node, q);
                }
                self.nodes.insert(node, devices);
                Status::success()
            }
            Err(status) => status,
        }
    }

    fn pre_score(&mut self, _feasible: &[&NodeInfo]) -> Status {
        if self.plain.is_none() && self.with_ext.is_none() {
            Status::skip()
        } else {
            Status::success()
        }
    }

    fn score(&self, node: &NodeInfo) -> Result<i64, Status> {
        Ok(self
            .cycle
            .shared
            .read_quality(node, |q| i64::from(q.prioritized_score))
            .unwrap_or(0))
    }

    fn normalize_score(&self, scores: &mut [i64]) {
        default_normalize_score(scores, false);
    }

    fn reserve(&mut self, node: &NodeInfo, placement: &mut Placement) -> Status {
        let Some(devices) = self.nodes.remove(node) else {
            return Status::success();
        };
        let built = match devices.found {
            Found::Nothing => Ok(Vec::new()),
            Found::Built(results) => Ok(results),
            Found::Plain(a) => results(self.plain.as_ref(), node, &a),
            Found::Ext(a) => results(self.with_ext.as_ref(), node, &a),
        };
        let mut allocations = match built {
            Ok(results) => results.into_iter(),
            Err(e) => return Status::error(e.to_string()),
        };
        placement.allocation_time = devices.took;
        placement.node_allocatable = devices.node_allocatable;
        let revised: Vec<(ObjectKey, AllocationResult)> = self
            .cycle
            .revise
            .iter()
            .filter_map(|(key, _)| Some((key.clone(), allocations.next()?)))
            .collect();
        if revised.len() != self.cycle.revise.len() {
            return Status::error("joint allocation returned fewer results than claims");
        }
        *self.cycle.shared.revised.lock().expect("not poisoned") = revised;
        for key in &self.keys {
            if placement.claims.iter().any(|c| &c.key == key) {
                continue;
            }
            if self.cycle.revise.iter().any(|(k, _)| k == key) {
                // A claim shared with a member whose devices were chosen again: its new
                // allocation is that member's decision; this pod only joins reservedFor.
                placement.claims.push(ClaimDecision {
                    key: key.clone(),
                    claim: ResourceClaim::clone(&self.cycle.state.claims[key]),
                    allocation: None,
                    create: false,
                    extended_mappings: Vec::new(),
                    consumer: None,
                });
                continue;
            }
            let allocated = self.allocated.iter().any(|(k, _)| k == key);
            placement.claims.push(ClaimDecision {
                key: key.clone(),
                claim: ResourceClaim::clone(&self.cycle.state.claims[key]),
                allocation: if allocated { None } else { allocations.next() },
                create: false,
                extended_mappings: Vec::new(),
                consumer: None,
            });
        }
        if devices.ext_claim {
            let (claim, extended_mappings) =
                extended::claim_for(self.cycle.pod, &self.ext_here(node));
            placement.claims.push(ClaimDecision {
                key: ObjectKey::of(&claim.metadata),
                claim,
                allocation: allocations.next(),
                create: true,
                extended_mappings,
                consumer: None,
            });
        }
        Status::success()
    }
}

fn results(
    allocator: Option<&Allocator<'_>>,
    node: &NodeInfo,
    found: &Allocation,
) -> Result<Vec<AllocationResult>, AllocError> {
    allocator
        .expect("found by this allocator")
        .results(&node.node, found)
}

impl<'a> DraCycle<'a> {
    /// DRANodeAllocatableResources: an allocated claim whose devices map node resources,
    /// reserved for another pod, cannot be shared.
    fn shared_mapped_claim(&self) -> Option<Status> {
        let pod = self.cycle.pod;
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let uid = pod.metadata.uid.as_deref();
        self.allocated.iter().find_map(|(key, claim)| {
            let shared = !claims::reserved_for(claim).is_empty()
                && !claims::is_reserved_for(claim, name, uid)
                && node_allocatable::has_mapped_device(claim, self.cycle.snapshot);
            shared.then(|| {
                Status::unresolvable(format!(
                    "node allocatable resource claim {} has a mapped device and cannot be shared across pods",
                    key.name
                ))
            })
        })
    }

    /// DRANodeAllocatableResources: what the pod's devices (those it has, and those just
    /// found) map of the node's resources, added to its requests, must fit what the node
    /// has left. The devices found are built into results now (they are needed).
    fn count_node_resources(
        &self,
        node: &NodeInfo,
        mut devices: NodeDevices,
    ) -> Result<NodeDevices, Status> {
        if !self.maps_node_resources {
            return Ok(devices);
        }
        let built = match std::mem::replace(&mut devices.found, Found::Nothing) {
            Found::Nothing => Vec::new(),
            Found::Built(results) => results,
            Found::Plain(a) => {
                results(self.plain.as_ref(), node, &a).map_err(|e| Status::error(e.to_string()))?
            }
            Found::Ext(a) => results(self.with_ext.as_ref(), node, &a)
                .map_err(|e| Status::error(e.to_string()))?,
        };
        let cx = self.cycle;
        let found_for = |key: &ObjectKey| -> Option<&AllocationResult> {
            let revised = cx.revise.iter().position(|(k, _)| k == key);
            let new = || {
                let i = self.to_allocate.iter().position(|(k, _)| k == key)?;
                Some(cx.revise.len() + i)
            };
            built.get(revised.or_else(new)?)
        };
        let pod_claims: Vec<node_allocatable::PodClaim<'_>> = self
            .named
            .iter()
            .filter_map(|(pod_claim, key)| {
                let allocation = claims::allocation(&cx.state.claims[key]).or(found_for(key))?;
                Some(node_allocatable::PodClaim {
                    pod_claim,
                    claim_name: &key.name,
                    allocation,
                })
            })
            .collect();
        let statuses = node_allocatable::claim_statuses(cx.pod, &pod_claims, cx.snapshot, node)
            .map_err(Status::error)?;
        if let Some(why) =
            node_allocatable::pod_level_shortfall(cx.pod, &statuses).map_err(Status::error)?
        {
            return Err(Status::unresolvable(why));
        }
        if !statuses.is_empty() {
            let (reasons, unresolvable) =
                node_allocatable::insufficient(cx.pod, &statuses, node).map_err(Status::error)?;
            if !reasons.is_empty() {
                let code = if unresolvable {
                    Code::UnschedulableAndUnresolvable
                } else {
                    Code::Unschedulable
                };
                return Err(Status::new(code, reasons));
            }
        }
        drop(pod_claims);
        devices.found = Found::Built(built);
        devices.node_allocatable = statuses;
        Ok(devices)
    }

    /// The claims one allocator searches: other members' claims to choose again first,
    /// then this pod's unallocated claims.
    fn claims_to_allocate(&self) -> Vec<&'a ResourceClaim> {
        self.cycle
            .revise
            .iter()
            .map(|(_, c)| *c)
            .chain(self.to_allocate.iter().map(|(_, c)| *c))
            .collect()
    }

    /// Extended resources the node has no device-plugin capacity for: DRA serves them.
    fn ext_here(&self, node: &NodeInfo) -> Vec<&ExtendedRequest> {
        self.ext
            .iter()
            .filter(|e| !node.allocatable.0.contains_key(&e.resource))
            .collect()
    }

    /// Allocate the pod's claims on the node, or say why not: the answer kept for the same
    /// claims on the same node in the same state, or a search.
    fn allocate(&self, node: &NodeInfo) -> Result<NodeDevices, Status> {
        let (Some(table), Some(memo)) = (&self.memo, self.cycle.device_memo) else {
            return self.search(node);
        };
        match table.get(self.cycle.snapshot, node) {
            // The time is the search's that found it: a remembered answer is read in a
            // fraction of a microsecond, less than reading the clock twice costs.
            Some(Kept::Found(a, took)) => {
                return Ok(NodeDevices {
                    quality: Some(a.clone()),
                    found: Found::Plain(a),
                    node_allocatable: Vec::new(),
                    ext_claim: false,
                    took,
                });
            }
            Some(Kept::Unfit(unfit)) => return Err(self.renamed.status(&unfit)),
            None => {}
        }
        let searched = self.search(node);
        let claims = self.renamed.claims();
        let snapshot = self.cycle.snapshot;
        match &searched {
            Ok(NodeDevices {
                found: Found::Plain(a),
                took,
                ..
            }) => memo.put(table, claims, snapshot, node, Ok((a, *took))),
            Err(status)
                if matches!(
                    status.code,
                    Code::Unschedulable | Code::UnschedulableAndUnresolvable
                ) =>
            {
                memo.put(table, claims, snapshot, node, Err(status))
            }
            _ => {}
        }
        searched
    }

    /// Search for devices for the pod's claims on the node, or say why none fit.
    fn search(&self, node: &NodeInfo) -> Result<NodeDevices, Status> {
        let ext_here = self.ext_here(node);
        let own;
        // How a compact answer is kept for later; `None`: results are built at once.
        type Keep = Option<fn(Arc<Allocation>) -> Found>;
        let (allocator, keep): (_, Keep) = if ext_here.is_empty() {
            (self.plain.as_ref(), Some(Found::Plain))
        } else if ext_here.len() == self.ext.len() {
            (self.with_ext.as_ref(), Some(Found::Ext))
        } else {
            // Some extended resources by device plugin, others by DRA: a rare mix.
            let (claim, _) = extended::claim_for(self.cycle.pod, &ext_here);
            let mut claims = self.claims_to_allocate();
            claims.push(&claim);
            own = Allocator::new(self.cycle.snapshot, &claims)
                .map_err(|e| Status::error(e.to_string()))?;
            (Some(&own), None)
        };
        let ext_claim = !ext_here.is_empty();
        let Some(allocator) = allocator else {
            return Ok(NodeDevices {
                found: Found::Nothing,
                node_allocatable: Vec::new(),
                quality: None,
                ext_claim,
                took: Duration::ZERO,
            });
        };
        let started = Instant::now();
        let answer = allocator.allocate_with(&node.node, self.cycle.limits);
        let took = started.elapsed();
        match answer {
            Ok((outcome, stats)) => {
                self.cycle
                    .shared
                    .search_steps
                    .fetch_add(stats.steps, Ordering::Relaxed);
                match outcome {
                    Outcome::Allocated(a) => {
                        let a = Arc::new(a);
                        let quality = Some(a.clone());
                        let found = match keep {
                            Some(keep) => keep(a),
                            None => Found::Built(
                                allocator
                                    .results(&node.node, &a)
                                    .map_err(|e| Status::error(e.to_string()))?,
                            ),
                        };
                        Ok(NodeDevices {
                            found,
                            node_allocatable: Vec::new(),
                            quality,
                            ext_claim,
                            took,
                        })
                    }
                    Outcome::Unfit(explanation) => {
                        Err(Status::unschedulable(describe_unfit(&explanation)))
                    }
                }
            }
            Err(AllocError::Aborted { steps, claim, .. }) => {
                self.cycle
                    .shared
                    .search_steps
                    .fetch_add(steps, Ordering::Relaxed);
                let cancelled = self.cycle.cancel.is_some_and(|c| c.load(Ordering::Relaxed));
                Err(Status::new(
                    Code::Stopped { cancelled },
                    claim.into_iter().collect(),
                ))
            }
            Err(e) => Err(Status::error(e.to_string())),
        }
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
