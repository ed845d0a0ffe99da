//! PodGroups (`scheduling.k8s.io/v1beta1`): the pods that name a PodGroup in
//! `spec.schedulingGroup` are placed together, in one decision.
//!
//! [`Engine::schedule_group`] takes the PodGroup and its pending members and returns a
//! [`GroupDecision`]:
//!
//! - **gang** (`schedulingPolicy.gang.minCount`): placements for at least `minCount`
//!   members (already bound members count), or none. Members are tried largest device
//!   demand first, each through the ordinary cycle with the earlier ones assumed. When a
//!   member fits nowhere, the members already on a node give their devices back and one
//!   device search on that node chooses theirs and its own together (joint allocation:
//!   kubernetes/kubernetes#138765, where upstream keeps the first member's first fit and
//!   refuses the group). A counting bound (devices of each requested kind, in total and per
//!   node) proves most impossible groups before any search, and says what is missing; the
//!   whole search has one time budget (`filterTimeout`) and says so when it runs out.
//!   Members that share a claim not allocated yet follow the first member that uses it
//!   (a node's device pins them to its node): when that leaves the group unplaced, the
//!   whole group is tried on one node at a time, the nodes with the most free devices of
//!   the kinds asked for first.
//! - **basic**: the members one by one, as single pods.
//! - `schedulingConstraints.topology`: every member in one domain (the nodes sharing the
//!   values of the label keys); the domains are tried best fit first (fewest free devices of
//!   the kinds the group asks for), so the first domain where the whole group fits is the
//!   best one.
//!
//! - `spec.resourceClaims` (DRAWorkloadResourceClaims): a member's claim that the PodGroup
//!   lists (the same name, and the same claim or template) is reserved for the PodGroup,
//!   not the pod; the first member that uses it allocates it and the others share its
//!   devices, as upstream's `resourceclaim.BindTo` decides.
//!
//! Not implemented, so refused by name (the group stays unplaced with a message naming the
//! field, never placed while it is ignored): `spec.parentCompositePodGroupName`
//! (CompositePodGroup).
//! `disruptionMode` decides whether preemption evicts the members as one victim
//! ([`crate::preemption`]); `preemptionPolicy: Never` keeps the group from preempting
//! ([`Engine::preempt_group`]); `priority` orders the queue, which is the caller's.
//!
//! Like [`Engine::schedule`], nothing changes in the state: [`Engine::assume_group`] takes
//! a scheduled group (every member's placement, in order), [`Engine::forget_group`] takes it
//! all back. The daemon (`src/run/groups.rs`) and `simulate` use it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use dra_allocator::{Allocator, Outcome};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceRequest, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
};
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rayon::prelude::*;

use crate::claims;
use crate::cycle::Scope;
use crate::engine::{Decision, Engine, Placement};
use crate::state::{NodeInfo, ObjectKey, bound_node, is_terminal};

/// Members of one PodGroup placed in one decision.
#[derive(Clone, Debug)]
pub struct GroupPlacement {
    pub group: ObjectKey,
    /// One per member placed, in the order they are to be assumed and written.
    pub placements: Vec<Placement>,
    /// Members not placed, with why (gang: those beyond `minCount` that do not fit; basic:
    /// every member that does not fit).
    pub pending: Vec<(ObjectKey, String)>,
    /// With `schedulingConstraints.topology`: the domain chosen, `key=value[,key=value]`.
    pub domain: Option<String>,
}

/// The outcome of one PodGroup's scheduling attempt.
#[derive(Clone, Debug)]
pub enum GroupDecision {
    Scheduled(GroupPlacement),
    /// No member is placed; `message` says what is missing.
    Unschedulable {
        group: ObjectKey,
        message: String,
    },
    /// The group or a member is wrong, or the attempt itself failed.
    Error {
        group: ObjectKey,
        message: String,
    },
}

impl GroupDecision {
    pub fn group(&self) -> &ObjectKey {
        match self {
            GroupDecision::Scheduled(p) => &p.group,
            GroupDecision::Unschedulable { group, .. } | GroupDecision::Error { group, .. } => {
                group
            }
        }
    }

    pub fn message(&self) -> Option<&str> {
        match self {
            GroupDecision::Scheduled(_) => None,
            GroupDecision::Unschedulable { message, .. } | GroupDecision::Error { message, .. } => {
                Some(message)
            }
        }
    }

    /// The members placed (none unless scheduled).
    pub fn placements(&self) -> &[Placement] {
        match self {
            GroupDecision::Scheduled(p) => &p.placements,
            _ => &[],
        }
    }
}

/// How the members are placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Policy {
    Basic,
    Gang { min_count: usize },
}

/// The placements of one try and the members left pending, with why.
type Placed = (Vec<Placement>, Vec<(ObjectKey, String)>);

/// Why a try did not place the group.
enum Failure {
    Unschedulable(String),
    Error(String),
}

/// One kind of device the members ask for, for the counting bound: an exact-count request's
/// class, selectors and tolerations.
struct Shape {
    class: String,
    selectors: bool,
    request: ExactDeviceRequest,
}

/// What the members ask for, per shape; and how many free devices of each shape each node
/// has (`None`: not known, that shape bounds nothing).
struct Demand {
    shapes: Vec<Shape>,
    /// Per member (in the members' order), devices per shape.
    per_member: Vec<Vec<u64>>,
    /// Per member, the fewest devices it can do with (exact counts, and the smallest count
    /// among `firstAvailable` subrequests): the order members are tried in.
    least: Vec<u64>,
    /// Per shape, per node name, free devices.
    supply: Vec<Option<BTreeMap<String, u64>>>,
    /// Members share a claim not allocated yet: the first member to use it chooses its
    /// devices, and so the node of every other member that uses it.
    shared: bool,
}

impl Engine {
    /// Schedule a PodGroup's pending `members` in one decision (see the module doc). Does
    /// not change the state: call [`Engine::assume_group`] with a scheduled decision.
    pub fn schedule_group(&mut self, group: &PodGroup, members: &[ObjectKey]) -> GroupDecision {
        self.schedule_group_with(group, members, self.config().filter_timeout, None)
    }

    /// [`Engine::schedule_group`] with a budget for the whole search and a cancel flag.
    pub fn schedule_group_with(
        &mut self,
        group: &PodGroup,
        members: &[ObjectKey],
        budget: Duration,
        cancel: Option<&AtomicBool>,
    ) -> GroupDecision {
        let key = ObjectKey::of(&group.metadata);
        let unschedulable = |message: String| unschedulable(&key, message);
        let error = |message: String| error(&key, message);
        let (policy, topology) = match policy_of(group) {
            Ok(p) => p,
            Err(message) => return unschedulable(message),
        };
        if let Err(message) = self.check_members(&key, group.spec.priority, members) {
            return error(message);
        }
        let bound = self.bound_members(&key);
        let (required, gang) = match policy {
            Policy::Basic => (members.len().min(1), false),
            Policy::Gang { min_count } => {
                if bound + members.len() < min_count {
                    return unschedulable(format!(
                        "waiting for members: minCount is {min_count}, {} pods of the group exist",
                        bound + members.len()
                    ));
                }
                match min_count.saturating_sub(bound) {
                    0 => (members.len().min(1), false),
                    n => (n, true),
                }
            }
        };
        if members.is_empty() {
            return unschedulable("no pending members".into());
        }
        let deadline = Instant::now() + budget;
        let demand = match self.demand(members) {
            Ok(d) => d,
            Err(message) => return unschedulable(message),
        };
        // Largest demand first (ties: as given): big members are the hard ones to fit late.
        let mut order: Vec<usize> = (0..members.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(demand.least[i]));
        let ordered: Vec<ObjectKey> = order.iter().map(|&i| members[i].clone()).collect();
        let ordered_demand: Vec<Vec<u64>> = order
            .iter()
            .map(|&i| demand.per_member[i].clone())
            .collect();
        let demand = Demand {
            per_member: ordered_demand,
            ..demand
        };
        let context = Context {
            required,
            gang,
            min_count: match policy {
                Policy::Gang { min_count } => min_count,
                Policy::Basic => 0,
            },
            budget,
            deadline,
            cancel,
            pod_group: group,
        };

        if topology.is_empty() {
            self.place_anywhere(&key, &ordered, &demand, &context)
        } else {
            self.place_in_one_domain(&key, &ordered, &demand, &context, &topology)
        }
    }

    /// A group without a topology constraint: the counting bound, then the search over
    /// every node.
    fn place_anywhere(
        &mut self,
        key: &ObjectKey,
        ordered: &[ObjectKey],
        demand: &Demand,
        context: &Context<'_>,
    ) -> GroupDecision {
        if context.gang
            && let Some(why) = demand.impossible(context.required, None)
        {
            return unschedulable(
                key,
                format!(
                    "minCount ({}) cannot be satisfied: {why}",
                    context.min_count
                ),
            );
        }
        match self.place(ordered, None, context) {
            Ok((placements, pending)) => GroupDecision::Scheduled(GroupPlacement {
                group: key.clone(),
                placements,
                pending,
                domain: None,
            }),
            Err(Failure::Unschedulable(message)) if demand.shared => self
                .place_on_one_node(key, ordered, demand, context)
                .unwrap_or_else(|| unschedulable(key, message)),
            Err(Failure::Unschedulable(message)) => unschedulable(key, message),
            Err(Failure::Error(message)) => error(key, message),
        }
    }

    /// Members sharing a claim that is not allocated yet: where the first member went, its
    /// devices (and so every member that shares them) went too, and the others may not fit
    /// there. Try the whole group on one node at a time, the nodes with the most free
    /// devices of the kinds asked for first, within the budget. `None` when no node works.
    fn place_on_one_node(
        &mut self,
        key: &ObjectKey,
        ordered: &[ObjectKey],
        demand: &Demand,
        context: &Context<'_>,
    ) -> Option<GroupDecision> {
        let mut nodes: Vec<(u64, String)> = self
            .state()
            .nodes
            .values()
            .map(|n| {
                let only = BTreeSet::from([n.name().to_string()]);
                (demand.free(Some(&only)), n.name().to_string())
            })
            .collect();
        nodes.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        for (_, node) in nodes {
            if Instant::now() >= context.deadline {
                return None;
            }
            let only = BTreeSet::from([node]);
            if context.gang && demand.impossible(context.required, Some(&only)).is_some() {
                continue;
            }
            match self.place(ordered, Some(&only), context) {
                Ok((placements, pending)) => {
                    return Some(GroupDecision::Scheduled(GroupPlacement {
                        group: key.clone(),
                        placements,
                        pending,
                        domain: None,
                    }));
                }
                Err(Failure::Error(message)) => return Some(error(key, message)),
                Err(Failure::Unschedulable(_)) => {}
            }
        }
        None
    }

    /// The topology domains: nodes grouped by their values of every key (nodes lacking a
    /// key are in none).
    fn topology_domains(&self, topology: &[String]) -> BTreeMap<String, BTreeSet<String>> {
        let mut domains: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for node in self.state().nodes.values() {
            let labels = node.node.metadata.labels.as_ref();
            let values: Option<Vec<String>> = topology
                .iter()
                .map(|k| labels.and_then(|l| l.get(k)).map(|v| format!("{k}={v}")))
                .collect();
            if let Some(values) = values {
                domains
                    .entry(values.join(","))
                    .or_default()
                    .insert(node.name().to_string());
            }
        }
        domains
    }

    /// A group with a topology constraint: all its members in one domain, the best fit
    /// first (the fewest free devices of the kinds asked for that passes the counting
    /// bound); the message names the domains that came closest.
    fn place_in_one_domain(
        &mut self,
        key: &ObjectKey,
        ordered: &[ObjectKey],
        demand: &Demand,
        context: &Context<'_>,
        topology: &[String],
    ) -> GroupDecision {
        let domains = self.topology_domains(topology);
        let keys = topology.join(", ");
        if domains.is_empty() {
            return unschedulable(
                key,
                format!("schedulingConstraints.topology: no node has the label {keys}"),
            );
        }
        let mut candidates: Vec<(u64, String)> = Vec::new();
        let mut refused: Vec<(u64, String, String)> = Vec::new();
        for (name, nodes) in &domains {
            let free = demand.free(Some(nodes));
            match context
                .gang
                .then(|| demand.impossible(context.required, Some(nodes)))
                .flatten()
            {
                Some(why) => refused.push((free, name.clone(), why)),
                None => candidates.push((free, name.clone())),
            }
        }
        candidates.sort();
        // In the message, the domains that came closest first.
        refused.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let mut tried: Vec<(String, String)> = Vec::new();
        for (_, name) in &candidates {
            match self.place(ordered, Some(&domains[name]), context) {
                Ok((placements, pending)) => {
                    return GroupDecision::Scheduled(GroupPlacement {
                        group: key.clone(),
                        placements,
                        pending,
                        domain: Some(name.clone()),
                    });
                }
                Err(Failure::Error(message)) => return error(key, message),
                Err(Failure::Unschedulable(message)) => tried.push((name.clone(), message)),
            }
            if Instant::now() >= context.deadline {
                break;
            }
        }
        let mut why: Vec<String> = tried
            .into_iter()
            .chain(refused.into_iter().map(|(_, name, why)| (name, why)))
            .map(|(domain, message)| format!("{domain}: {message}"))
            .collect();
        if why.len() > 3 {
            let more = why.len() - 3;
            why.truncate(3);
            why.push(format!("and {more} more domains"));
        }
        unschedulable(
            key,
            format!(
                "minCount ({}) cannot be satisfied in one domain of schedulingConstraints.topology ({keys}) among {} domains: {}",
                context.min_count.max(context.required),
                domains.len(),
                why.join("; ")
            ),
        )
    }

    /// Take a scheduled group: every member's placement, as [`Engine::assume`] does for one.
    pub fn assume_group(&mut self, group: &GroupPlacement) {
        for placement in &group.placements {
            self.assume(placement);
        }
    }

    /// Undo [`Engine::assume_group`]: every member is pending again and every device free.
    pub fn forget_group(&mut self, group: &GroupPlacement) {
        for placement in group.placements.iter().rev() {
            self.forget(placement);
        }
    }

    /// Every member exists, is pending and names the group; all have the group's priority
    /// (the PodGroup's `spec.priority` where set, else the first member's), as
    /// kube-scheduler requires, so that the group has one place in the queue.
    fn check_members(
        &self,
        group: &ObjectKey,
        priority: Option<i32>,
        members: &[ObjectKey],
    ) -> Result<(), String> {
        let mut priority = priority;
        let mut seen = BTreeSet::new();
        for key in members {
            let pod = self
                .state()
                .pods
                .get(key)
                .ok_or_else(|| format!("member pod {key} not found"))?;
            if !seen.insert(key) {
                return Err(format!("member pod {key} is given twice"));
            }
            if bound_node(pod).is_some() {
                return Err(format!("member pod {key} is already bound"));
            }
            if !names_group(pod, group) {
                return Err(format!(
                    "pod {key} does not name the PodGroup in spec.schedulingGroup.podGroupName"
                ));
            }
            let own = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
            match *priority.get_or_insert(own) {
                p if p == own => {}
                p => {
                    return Err(format!(
                        "all its pods must have the group's priority {p}; pod {key} has {own}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Members already bound (or assumed): they count toward `minCount`.
    fn bound_members(&self, group: &ObjectKey) -> usize {
        self.state()
            .pods
            .values()
            .filter(|p| names_group(p, group) && bound_node(p).is_some() && !is_terminal(p))
            .count()
    }

    /// What each member asks for, per device shape, and the free devices of each shape on
    /// every node (one `allocationMode: All` probe per shape and node).
    fn demand(&mut self, members: &[ObjectKey]) -> Result<Demand, String> {
        let mut shapes: Vec<Shape> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut per_member: Vec<Vec<(usize, u64)>> = Vec::new();
        let mut least: Vec<u64> = Vec::new();
        let mut seen: BTreeSet<ObjectKey> = BTreeSet::new();
        let mut shared = false;
        for key in members {
            let pod = &self.state().pods[key];
            let keys = claims::of_pod(pod, self.state())
                .map_err(|e| format!("waiting for member {key}: {}", e.message))?;
            let mut mine = Vec::new();
            let mut fewest = 0;
            for claim_key in keys {
                if !seen.insert(claim_key.clone()) {
                    let claim = &self.state().claims[&claim_key];
                    shared |= claims::allocation(claim).is_none();
                    continue;
                }
                let claim = &self.state().claims[&claim_key];
                if claims::allocation(claim).is_some() {
                    continue;
                }
                let requests = claim
                    .spec
                    .as_ref()
                    .and_then(|s| s.devices.as_ref())
                    .and_then(|d| d.requests.as_ref());
                for request in requests.into_iter().flatten() {
                    let Some(exact) = &request.exactly else {
                        let counts = request.first_available.iter().flatten();
                        fewest += counts
                            .map(|s| s.count.unwrap_or(1).max(0) as u64)
                            .min()
                            .unwrap_or(0);
                        continue;
                    };
                    if exact.allocation_mode.as_deref().unwrap_or("ExactCount") == "ExactCount" {
                        fewest += exact.count.unwrap_or(1).max(0) as u64;
                    }
                    let counted = exact.allocation_mode.as_deref().unwrap_or("ExactCount")
                        == "ExactCount"
                        && exact.admin_access != Some(true)
                        && exact.capacity.is_none();
                    if !counted {
                        continue;
                    }
                    let shape = ExactDeviceRequest {
                        device_class_name: exact.device_class_name.clone(),
                        selectors: exact.selectors.clone(),
                        tolerations: exact.tolerations.clone(),
                        allocation_mode: Some("All".into()),
                        ..Default::default()
                    };
                    let id = format!("{shape:?}");
                    let next = shapes.len();
                    let i = *index.entry(id).or_insert(next);
                    if i == next {
                        shapes.push(Shape {
                            class: exact.device_class_name.clone(),
                            selectors: exact.selectors.as_ref().is_some_and(|s| !s.is_empty()),
                            request: shape,
                        });
                    }
                    mine.push((i, exact.count.unwrap_or(1).max(0) as u64));
                }
            }
            per_member.push(mine);
            least.push(fewest);
        }
        let per_member = per_member
            .into_iter()
            .map(|mine| {
                let mut row = vec![0; shapes.len()];
                for (i, n) in mine {
                    row[i] += n;
                }
                row
            })
            .collect();
        // Devices held for nominated pods (`Engine::nominate`, after a preemption) are taken
        // in the allocator's view; the members' own holds, and those of pods of lower
        // priority, are free for the group, as each member's cycle sees them.
        let lifted = match members
            .first()
            .and_then(|k| self.state().pods.get(k))
            .cloned()
        {
            Some(pod) => self.lift_holds_of(members, &pod),
            None => Vec::new(),
        };
        let snapshot = self.snapshot();
        let nodes: Vec<&NodeInfo> = self.state().nodes.values().collect();
        let supply = shapes
            .iter()
            .map(|shape| {
                let probe = probe_claim(&shape.request);
                let allocator = Allocator::new(&snapshot, &[&probe]).ok()?;
                nodes
                    .par_iter()
                    .map(|node| {
                        let free = match allocator.allocate(&node.node).ok()? {
                            Outcome::Allocated(a) => a.device_count() as u64,
                            Outcome::Unfit(e) => {
                                e.requests.first().map_or(0, |r| r.available) as u64
                            }
                        };
                        Some((node.name().to_string(), free))
                    })
                    .collect::<Option<BTreeMap<_, _>>>()
            })
            .collect();
        drop(snapshot);
        self.restore_holds(lifted);
        Ok(Demand {
            shared,
            shapes,
            per_member,
            least,
            supply,
        })
    }

    /// Place the members (in order) on `nodes` (all when `None`), each with the earlier
    /// ones assumed; for a gang, repair a member that fits nowhere by choosing devices on a
    /// node again together with the members there. The state is as before on return.
    fn place(
        &mut self,
        members: &[ObjectKey],
        nodes: Option<&BTreeSet<String>>,
        cx: &Context<'_>,
    ) -> Result<Placed, Failure> {
        let mut placed: Vec<Placement> = Vec::new();
        let mut pending: Vec<(ObjectKey, String)> = Vec::new();
        let mut outcome = Ok(());
        for (i, key) in members.iter().enumerate() {
            if cx.gang && placed.len() + (members.len() - i) < cx.required {
                break;
            }
            let left = cx.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                outcome = Err(Failure::Unschedulable(format!(
                    "the joint search ran past its budget of {:?} with {} of {} members placed (minCount {})",
                    cx.budget,
                    placed.len(),
                    members.len(),
                    cx.min_count
                )));
                break;
            }
            let scope = Scope {
                nodes,
                revise: &[],
                group: true,
            };
            match self.schedule_scoped(key, left, cx.cancel, scope) {
                Decision::Scheduled(mut p) => {
                    self.reserve_for_group(cx.pod_group, &mut p);
                    self.assume(&p);
                    placed.push(p);
                }
                Decision::Error { message, .. } => {
                    outcome = Err(Failure::Error(format!("pod {key}: {message}")));
                    break;
                }
                Decision::Unschedulable { message, .. } | Decision::OutOfTime { message, .. } => {
                    if cx.gang {
                        match self.repair(key, &mut placed, nodes, cx) {
                            Ok(Some(p)) => {
                                placed.push(p);
                                continue;
                            }
                            Ok(None) => {}
                            Err(failure) => {
                                outcome = Err(failure);
                                break;
                            }
                        }
                    }
                    pending.push((key.clone(), message));
                }
            }
        }
        for placement in placed.iter().rev() {
            self.forget(placement);
        }
        outcome?;
        if placed.len() >= cx.required && !placed.is_empty() {
            return Ok((placed, pending));
        }
        let first = pending
            .first()
            .map(|(key, message)| format!("; pod {key}: {message}"))
            .unwrap_or_default();
        Err(Failure::Unschedulable(if cx.gang {
            format!(
                "minCount ({}) cannot be satisfied: {} of {} pending pods can be placed at once{first}",
                cx.min_count,
                placed.len(),
                members.len()
            )
        } else {
            format!("no member can be placed{first}")
        }))
    }

    /// A member that fits nowhere with the others' devices as they are: on each node that
    /// holds members, give their devices back and search that node's devices for them and
    /// this member at once. Returns the member's placement (the others' are updated in
    /// `placed`, everything assumed), or `None` when no node works.
    fn repair(
        &mut self,
        key: &ObjectKey,
        placed: &mut [Placement],
        nodes: Option<&BTreeSet<String>>,
        cx: &Context<'_>,
    ) -> Result<Option<Placement>, Failure> {
        let mut by_node: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, p) in placed.iter().enumerate() {
            if nodes.is_none_or(|n| n.contains(&p.node)) {
                by_node.entry(p.node.clone()).or_default().push(i);
            }
        }
        for (node, mates) in by_node {
            let left = cx.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut revise = Vec::new();
            for &j in &mates {
                revise.extend(self.release_devices(&placed[j]));
            }
            if revise.is_empty() {
                continue;
            }
            let only = BTreeSet::from([node]);
            let scope = Scope {
                nodes: Some(&only),
                revise: &revise,
                group: true,
            };
            let decision = self.schedule_scoped(key, left, cx.cancel, scope);
            let revised = self.take_revised();
            match decision {
                Decision::Scheduled(mut p) => {
                    self.reserve_for_group(cx.pod_group, &mut p);
                    for &j in &mates {
                        let mut mate = placed[j].clone();
                        for claim in mate.claims.iter_mut().filter(|c| c.allocation.is_some()) {
                            if let Some((_, a)) = revised.iter().find(|(k, _)| *k == claim.key) {
                                claim.allocation = Some(a.clone());
                            }
                        }
                        self.retake_devices(&mate);
                        placed[j] = mate;
                    }
                    self.assume(&p);
                    return Ok(Some(p));
                }
                Decision::Error { message, .. } => {
                    for &j in &mates {
                        self.retake_devices(&placed[j]);
                    }
                    return Err(Failure::Error(format!("pod {key}: {message}")));
                }
                _ => {
                    for &j in &mates {
                        self.retake_devices(&placed[j]);
                    }
                }
            }
        }
        Ok(None)
    }
}

impl Engine {
    /// A member's claims that its PodGroup lists in `spec.resourceClaims` (the same name,
    /// and the same claim or template, as upstream's `resourceclaim.BindTo` matches them)
    /// are reserved for the PodGroup, shared by the members that use them.
    fn reserve_for_group(&self, group: &PodGroup, placement: &mut Placement) {
        let Some(pod) = self.state().pods.get(&placement.pod) else {
            return;
        };
        let keys = group_claims_of(group, pod);
        if keys.is_empty() {
            return;
        }
        let consumer = claims::pod_group_consumer(
            group.metadata.name.as_deref().unwrap_or_default(),
            group.metadata.uid.as_deref(),
        );
        for decision in placement.claims.iter_mut() {
            if keys.contains(&decision.key.name) {
                decision.consumer = Some(consumer.clone());
            }
        }
    }
}

/// The names of the pod's claims that stand for claims of its PodGroup.
fn group_claims_of(group: &PodGroup, pod: &Pod) -> BTreeSet<String> {
    let listed = group.spec.resource_claims.as_deref().unwrap_or_default();
    let pod_claims = pod.spec.as_ref().and_then(|s| s.resource_claims.as_deref());
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_deref())
        .unwrap_or_default();
    let mut names = BTreeSet::new();
    for pc in pod_claims.unwrap_or_default() {
        let of_group = listed.iter().any(|g| {
            g.name == pc.name
                && g.resource_claim_name == pc.resource_claim_name
                && g.resource_claim_template_name == pc.resource_claim_template_name
        });
        if !of_group {
            continue;
        }
        let name = match &pc.resource_claim_name {
            Some(name) => Some(name.clone()),
            None => statuses
                .iter()
                .find(|s| s.name == pc.name)
                .and_then(|s| s.resource_claim_name.clone()),
        };
        names.extend(name);
    }
    names
}

/// What one try of a group needs.
struct Context<'a> {
    /// Members to place at once (gang: minCount less those bound).
    required: usize,
    gang: bool,
    min_count: usize,
    budget: Duration,
    deadline: Instant,
    cancel: Option<&'a AtomicBool>,
    /// The PodGroup: its `spec.resourceClaims` are reserved for it, not for the members.
    pod_group: &'a PodGroup,
}

impl Demand {
    /// Why `required` members cannot all get devices on `nodes` (all when `None`): per
    /// shape, the `required` smallest demands against the free devices in total and per
    /// node. `None` when the bound finds no reason (the search decides).
    fn impossible(&self, required: usize, nodes: Option<&BTreeSet<String>>) -> Option<String> {
        for (s, shape) in self.shapes.iter().enumerate() {
            let Some(supply) = &self.supply[s] else {
                continue;
            };
            let free: Vec<u64> = supply
                .iter()
                .filter(|(n, _)| nodes.is_none_or(|only| only.contains(*n)))
                .map(|(_, f)| *f)
                .collect();
            let mut wants: Vec<u64> = self.per_member.iter().map(|row| row[s]).collect();
            wants.sort();
            wants.truncate(required);
            let need: u64 = wants.iter().sum();
            let total: u64 = free.iter().sum();
            let what = format!(
                "devices of DeviceClass {}{}",
                shape.class,
                if shape.selectors {
                    " that match the requests' selectors"
                } else {
                    ""
                }
            );
            let pods = |n: usize| if n == 1 { "pod" } else { "pods" };
            if need > total {
                return Some(format!(
                    "{required} {} need {need} {what}; {total} are free",
                    pods(required)
                ));
            }
            let asking: Vec<u64> = wants.into_iter().filter(|&w| w > 0).collect();
            if let Some(&least) = asking.first() {
                let room: u64 = free.iter().map(|f| f / least).sum();
                if room < asking.len() as u64 {
                    let best = free.iter().max().copied().unwrap_or(0);
                    return Some(format!(
                        "{} {} need at least {least} {what} each, on one node; the nodes' free devices hold {room} such {} (the most free on a node: {best})",
                        asking.len(),
                        pods(asking.len()),
                        pods(room as usize)
                    ));
                }
            }
        }
        None
    }

    /// Free devices of every shape on `nodes`: the best-fit order of topology domains.
    fn free(&self, nodes: Option<&BTreeSet<String>>) -> u64 {
        self.supply
            .iter()
            .flatten()
            .flat_map(|supply| supply.iter())
            .filter(|(n, _)| nodes.is_none_or(|only| only.contains(*n)))
            .map(|(_, f)| *f)
            .sum()
    }
}

/// The policy and topology keys of a PodGroup, or the field this scheduler does not
/// implement (or that is invalid), by name.
fn policy_of(group: &PodGroup) -> Result<(Policy, Vec<String>), String> {
    let spec = &group.spec;
    if spec.parent_composite_pod_group_name.is_some() {
        return Err(
            "spec.parentCompositePodGroupName: composite PodGroups are not supported by dra-scheduler yet"
                .into(),
        );
    }
    let policy = match (&spec.scheduling_policy.basic, &spec.scheduling_policy.gang) {
        (Some(_), None) => Policy::Basic,
        (None, Some(gang)) if gang.min_count >= 1 => Policy::Gang {
            min_count: gang.min_count as usize,
        },
        (None, Some(gang)) => {
            return Err(format!(
                "spec.schedulingPolicy.gang.minCount must be at least 1, not {}",
                gang.min_count
            ));
        }
        _ => {
            return Err("spec.schedulingPolicy must set exactly one of basic and gang".into());
        }
    };
    let mut keys = Vec::new();
    let topology = spec
        .scheduling_constraints
        .as_ref()
        .and_then(|c| c.topology.as_ref());
    for constraint in topology.into_iter().flatten() {
        if constraint.key.is_empty() {
            return Err("spec.schedulingConstraints.topology[].key must not be empty".into());
        }
        if !keys.contains(&constraint.key) {
            keys.push(constraint.key.clone());
        }
    }
    Ok((policy, keys))
}

/// Whether the pod names the PodGroup (same namespace) in `spec.schedulingGroup`.
pub fn names_group(pod: &Pod, group: &ObjectKey) -> bool {
    pod.metadata.namespace.as_deref().unwrap_or("default") == group.namespace
        && pod_group_name(pod) == Some(group.name.as_str())
}

/// The PodGroup a pod names in `spec.schedulingGroup.podGroupName`.
pub fn pod_group_name(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()?
        .scheduling_group
        .as_ref()?
        .pod_group_name
        .as_deref()
}

/// A claim asking for every free device of a shape: what the allocator finds (or counts
/// as available) on a node is that node's supply.
fn probe_claim(request: &ExactDeviceRequest) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some("podgroup-counting-bound".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: "probe".into(),
                    exactly: Some(request.clone()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

/// The group stays unplaced, with `message` prefixed by the group's name.
fn unschedulable(group: &ObjectKey, message: String) -> GroupDecision {
    GroupDecision::Unschedulable {
        group: group.clone(),
        message: format!("PodGroup {group}: {message}"),
    }
}

/// The group could not be decided, with `message` prefixed by the group's name.
fn error(group: &ObjectKey, message: String) -> GroupDecision {
    GroupDecision::Error {
        group: group.clone(),
        message: format!("PodGroup {group}: {message}"),
    }
}
