//! PostFilter preemption, shaped as kube-scheduler's DefaultPreemption: for a pod that fits
//! on no node, which pods of lower priority to evict, and where, so that it fits, counting
//! the devices their ResourceClaims give back.
//!
//! [`Engine::preempt`] decides and changes nothing (it works on a fork of the state). The
//! caller evicts the [`Victim`]s and holds what they free for the pod with
//! [`Engine::nominate`] until the pod is placed; `simulate` evicts them at once with
//! [`Engine::evict`].
//!
//! How it decides, as upstream where upstream applies:
//! - **Eligible**: not `preemptionPolicy: Never`; not bound; not a PodGroup member (a
//!   PodGroup preempts as a whole, with [`Engine::preempt_group`]: `preempt` refuses a
//!   member and says so); not while victims of its earlier preemption still terminate on
//!   its `status.nominatedNodeName`. Victims are pods bound to a node, not terminating, of
//!   lower priority than the pod.
//! - **Candidate nodes**: those where Filter said Unschedulable; a node that said
//!   UnschedulableAndUnresolvable is one that evicting pods cannot fix, and is skipped.
//! - **Per node**: every candidate victim there is removed, and a claim's devices count as
//!   freed only when every consumer in its `reservedFor` is removed (a shared claim used by
//!   a pod that stays keeps its devices; a claim reserved for a PodGroup is never freed by
//!   evicting pods, and the pod's own claims are never freed). Then the pod's ordinary cycle
//!   runs on that node alone, so the backtracking device search decides whether it fits.
//!   If it does, victims are reprieved one at a time (those whose eviction would violate a
//!   PodDisruptionBudget first, then the others; each group from the most important: higher
//!   priority, a PodGroup before a pod, a larger group, the longer running) and kept only
//!   when the pod still fits with them back.
//! - **The node**: the fewest PodDisruptionBudget violations, then the fewest victims, then
//!   the lowest highest victim priority, then the lowest sum of victim priorities, then the
//!   youngest victims (latest start of the highest-priority ones: the least work lost),
//!   then the first by name. Upstream ranks the victims' priorities before their number;
//!   here fewer evictions come first, since every evicted pod is work lost and a device
//!   job restarts from its last checkpoint whatever its priority.
//! - Like upstream, the nodes are tried in name order until at least
//!   max(10% of them, 100) candidates are found, one of them without PDB violations.
//! - **PodGroups as victims**: the bound members of a PodGroup whose `disruptionMode` is
//!   `all` (or, with no `disruptionMode`, whose policy is `gang`) are one victim: all of
//!   them are evicted, wherever they run, or none. A member's PodGroup that is not given is
//!   treated so too (never half a group).
//! - **Budget**: the whole search, every node's device searches included, stops at
//!   `budget`; with candidates found by then the best of them is taken, else it fails
//!   saying so.
//!
//! Start times are `status.startTime`, else `metadata.creationTimestamp`; a pod with
//! neither counts as just started.
//!
//! ## A PodGroup as preemptor
//!
//! [`Engine::preempt_group`] takes a PodGroup and its pending members and returns a
//! [`GroupPreemption`]: the victims, and one [`Preemption`] per member placed (its node,
//! its placement, the victims on its node) so that the caller holds each member's devices
//! with [`Engine::nominate`], evicts the victims, and then schedules the group (each
//! member's cycle sees its own hold free, the others' taken; the group's counting bound
//! stands aside while any hold exists, so the holds do not keep the group out).
//! - **Priority**: the group's (`spec.priority`, else its members'); every member must
//!   have it, as [`Engine::schedule_group`] requires.
//! - **Eligible**: neither the PodGroup's `spec.preemptionPolicy` nor any member's is
//!   `Never`; every member is pending, not terminating, and names the group; not while
//!   victims of an earlier preemption still terminate on a member's nominated node; and
//!   the group does not fit already (gang: a placement for `minCount`; basic: as many
//!   members as fit with every candidate victim gone).
//! - **Candidates**: every pod in the cluster that may be a victim (as above: lower
//!   priority, bound, not terminating; a PodGroup with `disruptionMode: All` one unit with
//!   all its bound members). They are all removed on a fork, claims freed only when every
//!   consumer is removed, and the group is placed there by
//!   [`Engine::schedule_group_with`] (the same search as without preemption: gang
//!   `minCount`, joint allocation, topology). If it does not fit even so, nothing is
//!   evicted: `Err` says why (the group's own message).
//! - **Reprieve**: units come back one step at a time and stay back when the group still
//!   fits. First whole nodes, the costliest to empty first (the most PDB violations, then
//!   the most pods, then the highest priority), so that the group goes where evicting costs
//!   least; then single units on the nodes left (those violating a PDB first, then the
//!   most important first, as for a pod). A step that touches neither a node nor a device
//!   of the group's current placement is taken without a search; one search with all of
//!   those back checks them at the end (and, if the group no longer fits, each is tried
//!   again with a search). The group's placement with the final victims gone gives each
//!   member's node and placement.
//! - **Whole victims**: a victim PodGroup evicted as a whole is reprieved or evicted as
//!   one unit, so the victims never hold half of one.
//! - **Budget**: every search shares `budget`. Out of time before the group fits with
//!   every candidate gone, or during the reprieve, it fails saying so: a victim set not
//!   minimised yet would evict pods the group does not need.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimConsumerReference};
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::claims;
use crate::cycle::{NodeStatuses, Scope};
use crate::engine::{Decision, Engine, Placement};
use crate::framework::{Code, Point};
use crate::group::{GroupDecision, GroupPlacement, names_group, pod_group_name};
use crate::plugins::label_selector::{Selector, labels_of};
use crate::plugins::priority_sort::priority;
use crate::state::{ObjectKey, bound_node, is_terminal};

/// A pod to evict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Victim {
    pub pod: ObjectKey,
    pub uid: Option<String>,
    pub priority: i32,
    /// The node it runs on (the preemption's node, or another one for a member of a
    /// PodGroup evicted as a whole).
    pub node: String,
    /// Claims whose devices come back when this victim goes (every consumer in their
    /// `reservedFor` is a victim).
    pub freed_claims: Vec<ObjectKey>,
}

/// Where the pod goes once its victims are gone.
#[derive(Clone, Debug)]
pub struct Preemption {
    pub pod: ObjectKey,
    pub node: String,
    /// Most important first (higher priority, then the longer running).
    pub victims: Vec<Victim>,
    /// The pod's placement on that node once the victims are gone: what to hold for it
    /// ([`Engine::nominate`]).
    pub placement: Placement,
    /// PodDisruptionBudgets the evictions violate (counted per pod, as upstream).
    pub pdb_violations: usize,
    /// For the pod's events: which pods are preempted where, for which devices.
    pub message: String,
}

/// What a PodGroup's preemption evicts, and where its members go
/// ([`Engine::preempt_group`]).
#[derive(Clone, Debug)]
pub struct GroupPreemption {
    pub group: ObjectKey,
    /// The victims on every node, each once, the most important first; a victim PodGroup
    /// evicted as a whole is there with all its bound members, or not at all.
    pub victims: Vec<Victim>,
    /// One per member placed, as [`Engine::schedule_group`] places them once the victims
    /// are gone: the member, its node, its own placement (what [`Engine::nominate`] holds
    /// for it) and the victims that make room on its node (a victim PodGroup whole, with
    /// its members on other nodes). A member placed where nothing is evicted has none.
    pub preemptions: Vec<Preemption>,
    /// PodDisruptionBudgets the evictions violate (counted per pod, as upstream).
    pub pdb_violations: usize,
    /// For the group's events: which pods are preempted where, for which devices.
    pub message: String,
}

/// Pods evicted together: one pod, or the bound members of a PodGroup.
#[derive(Clone, Debug)]
struct Unit {
    pods: Vec<ObjectKey>,
    priority: i32,
    group: bool,
    /// The earliest start among the pods; `None`: not started.
    earliest: Option<Time>,
}

impl Unit {
    /// Upstream's MoreImportantVictim, as an order: the more important first.
    fn importance(&self, other: &Unit) -> Ordering {
        Reverse(self.priority)
            .cmp(&Reverse(other.priority))
            .then(Reverse(self.group).cmp(&Reverse(other.group)))
            .then(Reverse(self.pods.len()).cmp(&Reverse(other.pods.len())))
            .then(older(&self.earliest, &other.earliest))
            .then(self.pods.cmp(&other.pods))
    }
}

/// Earlier start first; not started last.
fn older(a: &Option<Time>, b: &Option<Time>) -> Ordering {
    match (a, b) {
        (Some(a), Some(b)) => a.cmp(b),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

fn start_time(pod: &Pod) -> Option<Time> {
    pod.status
        .as_ref()
        .and_then(|s| s.start_time.clone())
        .or_else(|| pod.metadata.creation_timestamp.clone())
}

/// A node where evicting its victims lets the pod fit.
struct Candidate {
    node: String,
    /// Most important first.
    victims: Vec<Unit>,
    placement: Placement,
    pdb_violations: usize,
    /// Claims freed by the victims, per victim pod.
    freed: BTreeMap<ObjectKey, Vec<ObjectKey>>,
}

impl Candidate {
    fn pods(&self) -> usize {
        self.victims.iter().map(|u| u.pods.len()).sum()
    }

    fn highest(&self) -> i32 {
        self.victims
            .iter()
            .map(|u| u.priority)
            .max()
            .unwrap_or(i32::MIN)
    }

    fn sum(&self) -> i64 {
        self.victims
            .iter()
            .map(|u| (i64::from(u.priority) + i64::from(i32::MAX) + 1) * u.pods.len() as i64)
            .sum()
    }

    /// The earliest start among the highest-priority victims.
    fn earliest_of_highest(&self) -> Option<Time> {
        let highest = self.highest();
        self.victims
            .iter()
            .filter(|u| u.priority == highest)
            .map(|u| u.earliest.clone())
            .min_by(older)
            .flatten()
    }

    /// The order of the module doc: the better candidate first.
    fn better(&self, other: &Candidate) -> Ordering {
        self.pdb_violations
            .cmp(&other.pdb_violations)
            .then(self.pods().cmp(&other.pods()))
            .then(self.highest().cmp(&other.highest()))
            .then(self.sum().cmp(&other.sum()))
            .then(older(
                &other.earliest_of_highest(),
                &self.earliest_of_highest(),
            ))
            .then(self.node.cmp(&other.node))
    }
}

/// How one candidate node fared.
enum NodeResult {
    Candidate(Box<Candidate>),
    /// No pod there has lower priority than the preemptor.
    NoVictims,
    /// The pod does not fit even with every candidate victim there gone.
    Unfit(String),
}

/// Why the search stopped.
enum Abort {
    OutOfTime,
    Error(String),
}

impl Engine {
    /// PostFilter: find the pods of lower priority to evict so that `pod` fits (see the
    /// module doc). Changes nothing. `Err` says why no preemption helps (per node where
    /// it can), or why the pod may not preempt. The search stops at `budget`.
    /// Members of PodGroups among the victims are evicted whole (their PodGroups are not
    /// known here: see [`Engine::preempt_with_groups`]).
    pub fn preempt(
        &mut self,
        pod: &ObjectKey,
        budget: Duration,
        pdbs: &[PodDisruptionBudget],
    ) -> Result<Preemption, String> {
        self.preempt_with_groups(pod, budget, pdbs, &[])
    }

    /// [`Engine::preempt`] knowing the PodGroups of possible victims: a member of one whose
    /// `disruptionMode` is `single` (or unset, with the `basic` policy) is a victim alone.
    pub fn preempt_with_groups(
        &mut self,
        pod_key: &ObjectKey,
        budget: Duration,
        pdbs: &[PodDisruptionBudget],
        pod_groups: &[PodGroup],
    ) -> Result<Preemption, String> {
        let deadline = Instant::now() + budget;
        self.preemption_enabled()?;
        let pod = self
            .state()
            .pods
            .get(pod_key)
            .cloned()
            .ok_or_else(|| format!("pod {pod_key} not found"))?;
        eligible(pod_key, &pod)?;
        let mut scratch = Scratch::new(self.fork(), pod_key, priority(&pod), &[&pod], pod_groups);
        let out_of_time = |checked: usize, total: usize| {
            format!(
                "preemption ran out of its {budget:?} budget after {checked} of {total} candidate nodes"
            )
        };
        let statuses = match scratch.engine.node_statuses(pod_key, budget)? {
            NodeStatuses::Stopped(status) => match status.code {
                Code::Stopped { .. } => return Err(out_of_time(0, 0)),
                Code::Error => return Err(status.message()),
                // PreFilter's "unschedulable" stands for every node.
                Code::Unschedulable => scratch
                    .engine
                    .state()
                    .nodes
                    .keys()
                    .map(|n| (n.clone(), status.clone()))
                    .collect(),
                _ => {
                    return Err(format!("preemption cannot help: {}", status.message()));
                }
            },
            NodeStatuses::Nodes(nodes) => nodes,
        };
        if let Some((node, _)) = statuses.iter().find(|(_, s)| s.is_success()) {
            return Err(format!(
                "pod {pod_key} fits on node {node} without preemption"
            ));
        }
        let unresolvable: BTreeMap<String, Option<&str>> = statuses
            .iter()
            .filter(|(_, s)| s.code != Code::Unschedulable)
            .map(|(n, s)| (n.clone(), s.reasons.first().map(String::as_str)))
            .collect();
        if let Some(nominated) = nominated_node(&pod)
            && !unresolvable.contains_key(nominated)
            && let Some(terminating) = scratch.terminating_victim(nominated)
        {
            return Err(format!(
                "pod {terminating} on node {nominated}, preempted for this pod, is still terminating"
            ));
        }
        let nodes: Vec<String> = statuses
            .iter()
            .filter(|(_, s)| s.code == Code::Unschedulable)
            .map(|(n, _)| n.clone())
            .collect();
        let wanted = (nodes.len() / 10).max(100).min(nodes.len());
        let mut candidates: Vec<Candidate> = Vec::new();
        let mut no_victims: Vec<&str> = Vec::new();
        let mut unfit: Vec<String> = Vec::new();
        for (checked, node) in nodes.iter().enumerate() {
            if candidates.len() >= wanted && candidates.iter().any(|c| c.pdb_violations == 0) {
                break;
            }
            let units = scratch.units_on(node);
            match scratch.try_node(node, units, pdbs, deadline) {
                Ok(NodeResult::Candidate(c)) => candidates.push(*c),
                Ok(NodeResult::NoVictims) => no_victims.push(node),
                Ok(NodeResult::Unfit(why)) => unfit.push(why),
                Err(Abort::Error(message)) => return Err(message),
                Err(Abort::OutOfTime) if candidates.is_empty() => {
                    return Err(out_of_time(checked, nodes.len()));
                }
                // The best of those found so far.
                Err(Abort::OutOfTime) => break,
            }
        }
        let Some(best) = candidates.into_iter().min_by(Candidate::better) else {
            return Err(no_node(
                scratch.priority,
                &unfit,
                &no_victims,
                &unresolvable,
            ));
        };
        Ok(scratch.preemption(best))
    }

    fn preemption_enabled(&self) -> Result<(), String> {
        if !self.config().preemption {
            return Err("preemption is disabled".into());
        }
        let in_profile = self
            .config()
            .profile
            .at(Point::PostFilter)
            .any(|p| p.name == "DefaultPreemption");
        if !in_profile {
            return Err(
                "preemption is disabled: the profile does not enable DefaultPreemption".into(),
            );
        }
        Ok(())
    }

    /// What happens once a preemption's victims are deleted, for `simulate` (in a cluster
    /// the informers bring it): the victims are gone, they leave every claim's
    /// `reservedFor`, a freed claim made from a template for a victim is deleted (as
    /// kube-controller-manager deletes it) and any other freed claim is deallocated.
    pub fn evict(&mut self, preemption: &Preemption) {
        let victims: Vec<&Victim> = preemption.victims.iter().collect();
        let freed: BTreeSet<&ObjectKey> =
            victims.iter().flat_map(|v| v.freed_claims.iter()).collect();
        let is_victim = |ns: &str, r: &ResourceClaimConsumerReference| {
            victims
                .iter()
                .any(|v| v.pod.namespace == ns && claims::is_pod(r, &v.pod.name, v.uid.as_deref()))
        };
        let mut updates: Vec<ResourceClaim> = Vec::new();
        let mut deletes: Vec<ObjectKey> = Vec::new();
        for (key, claim) in &self.state().claims {
            let reserved = claims::reserved_for(claim);
            if !reserved.iter().any(|r| is_victim(&key.namespace, r)) {
                continue;
            }
            let owned_by_victim = claim.metadata.owner_references.iter().flatten().any(|o| {
                o.kind == "Pod"
                    && victims
                        .iter()
                        .any(|v| v.pod.namespace == key.namespace && v.pod.name == o.name)
            });
            if freed.contains(key) && owned_by_victim {
                deletes.push(key.clone());
                continue;
            }
            let mut claim = ResourceClaim::clone(claim);
            let status = claim.status.get_or_insert_with(Default::default);
            if let Some(reserved) = status.reserved_for.as_mut() {
                reserved.retain(|r| !is_victim(&key.namespace, r));
            }
            if freed.contains(key) {
                status.allocation = None;
            }
            updates.push(claim);
        }
        for victim in &victims {
            self.remove_pod(&victim.pod);
        }
        for key in &deletes {
            self.remove_claim(key);
        }
        for claim in updates {
            self.upsert_claim(claim);
        }
    }
}

/// Whether the pod may preempt at all (upstream's PodEligibleToPreemptOthers, and what
/// this scheduler does not do).
fn eligible(key: &ObjectKey, pod: &Pod) -> Result<(), String> {
    if never(pod) {
        return Err("preemptionPolicy is Never".into());
    }
    eligible_pending(key, pod)?;
    if let Some(group) = pod_group_name(pod) {
        return Err(format!(
            "pod {key} is a member of PodGroup {}/{group}: a PodGroup preempts as a whole (Engine::preempt_group), its members do not preempt one by one",
            key.namespace
        ));
    }
    Ok(())
}

fn never(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.preemption_policy.as_deref())
        == Some("Never")
}

/// Pending and not terminating.
fn eligible_pending(key: &ObjectKey, pod: &Pod) -> Result<(), String> {
    if let Some(node) = bound_node(pod) {
        return Err(format!("pod {key} is already bound to node {node}"));
    }
    if is_terminal(pod) || pod.metadata.deletion_timestamp.is_some() {
        return Err(format!("pod {key} is terminating or terminated"));
    }
    Ok(())
}

fn nominated_node(pod: &Pod) -> Option<&str> {
    pod.status
        .as_ref()?
        .nominated_node_name
        .as_deref()
        .filter(|n| !n.is_empty())
}

/// Whether the pod is being deleted because the scheduler preempted it.
fn terminating_by_preemption(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "DisruptionTarget")
            .is_some_and(|c| {
                c.status == "True" && c.reason.as_deref() == Some("PreemptionByScheduler")
            })
}

/// The message when no node helps: each node's reason, grouped.
fn no_node(
    priority: i32,
    unfit: &[String],
    no_victims: &[&str],
    unresolvable: &BTreeMap<String, Option<&str>>,
) -> String {
    let mut parts: Vec<String> = unfit.to_vec();
    if !no_victims.is_empty() {
        parts.push(format!(
            "{} {} no pods of priority below {priority}",
            nodes_named(no_victims),
            if no_victims.len() == 1 { "has" } else { "have" }
        ));
    }
    let mut by_reason: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (node, reason) in unresolvable {
        by_reason
            .entry(reason.unwrap_or("unschedulable"))
            .or_default()
            .push(node);
    }
    for (reason, nodes) in by_reason {
        parts.push(format!(
            "evicting pods does not help on {} ({reason})",
            nodes_named(&nodes)
        ));
    }
    if parts.is_empty() {
        return "no node: the cluster has no nodes".into();
    }
    format!("no node: {}", parts.join("; "))
}

/// `node-1`, `node-1 and node-2`, `5 nodes (node-1, node-2, node-3, ...)`.
fn nodes_named(nodes: &[&str]) -> String {
    match nodes {
        [one] => one.to_string(),
        [a, b] => format!("{a} and {b}"),
        [a, b, c] => format!("{a}, {b} and {c}"),
        _ => format!("{} nodes ({}, ...)", nodes.len(), nodes[..3].join(", ")),
    }
}

/// Names in a message: all of them up to five, else the first five and a count.
fn listed(keys: &[String]) -> String {
    if keys.len() <= 5 {
        keys.join(", ")
    } else {
        format!("{}, and {} more", keys[..5].join(", "), keys.len() - 5)
    }
}

/// "0/1 nodes are available: 1 cannot allocate ..." → "cannot allocate ...".
fn node_reason(message: &str) -> String {
    let rest = message
        .split_once(" nodes are available: ")
        .map_or(message, |(_, r)| r);
    let rest = rest.strip_prefix("1 ").unwrap_or(rest);
    rest.trim_end_matches('.').to_string()
}

/// The PodDisruptionBudgets each unit's eviction would violate, in the units' order (upstream's
/// FilterVictimsWithPDBViolation: a unit violates when any of its pods does).
fn pdb_violations(
    units: &[Unit],
    pods: &HashMap<ObjectKey, Arc<Pod>>,
    pdbs: &[PodDisruptionBudget],
) -> Vec<usize> {
    let parsed: Vec<Option<Selector>> = pdbs
        .iter()
        .map(|pdb| {
            let selector = Selector::parse(pdb.spec.as_ref()?.selector.as_ref()).ok()?;
            // An empty selector matches nothing here.
            (!selector.is_everything()).then_some(selector)
        })
        .collect();
    let mut allowed: Vec<i32> = pdbs
        .iter()
        .map(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.disruptions_allowed)
                .unwrap_or(0)
        })
        .collect();
    let mut violates = |pod: &Pod| -> bool {
        let labels = labels_of(&pod.metadata);
        if labels.is_empty() {
            return false;
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        for (i, pdb) in pdbs.iter().enumerate() {
            if pdb.metadata.namespace.as_deref().unwrap_or("default") != namespace {
                continue;
            }
            let Some(selector) = &parsed[i] else { continue };
            if !selector.matches(labels) {
                continue;
            }
            let disrupted = pdb
                .status
                .as_ref()
                .and_then(|s| s.disrupted_pods.as_ref())
                .is_some_and(|d| d.contains_key(name));
            if disrupted {
                continue;
            }
            allowed[i] -= 1;
            if allowed[i] < 0 {
                return true;
            }
        }
        false
    };
    units
        .iter()
        .map(|unit| {
            unit.pods
                .iter()
                .filter_map(|k| pods.get(k))
                .filter(|p| violates(p))
                .count()
        })
        .collect()
}

/// The class of the device a result's request (`request` or `request/subrequest`) asks for.
fn class_of(claim: &ResourceClaim, request: &str) -> Option<String> {
    let (main, sub) = match request.split_once('/') {
        Some((m, s)) => (m, Some(s)),
        None => (request, None),
    };
    let r = claim
        .spec
        .as_ref()?
        .devices
        .as_ref()?
        .requests
        .as_ref()?
        .iter()
        .find(|r| r.name == main)?;
    match sub {
        None => r.exactly.as_ref().map(|e| e.device_class_name.clone()),
        Some(sub) => r
            .first_available
            .as_ref()?
            .iter()
            .find(|s| s.name == sub)
            .map(|s| s.device_class_name.clone()),
    }
}

/// The fork a preemption is tried on: victims are removed and put back, and claims
/// freed and taken again as their consumers go and come.
struct Scratch {
    engine: Engine,
    preemptor: ObjectKey,
    priority: i32,
    /// Claims the preemptor (or its PodGroup's members) names: never freed.
    own_claims: BTreeSet<ObjectKey>,
    /// Per pod, the allocated claims reserved for it.
    claims_of: HashMap<ObjectKey, Vec<ObjectKey>>,
    /// Those claims as they were.
    original_claims: HashMap<ObjectKey, ResourceClaim>,
    /// Every pod as it was (before removals).
    original_pods: HashMap<ObjectKey, Arc<Pod>>,
    removed: BTreeSet<ObjectKey>,
    freed: BTreeSet<ObjectKey>,
    /// PodGroups evicted whole: their bound members.
    whole_groups: HashMap<ObjectKey, Vec<ObjectKey>>,
    /// PodGroup priorities, where set.
    group_priority: HashMap<ObjectKey, i32>,
}

impl Scratch {
    /// `own`: the preemptor's pods (one, or a PodGroup's pending members), whose claims
    /// are never freed; `priority`: theirs.
    fn new(
        engine: Engine,
        preemptor: &ObjectKey,
        priority: i32,
        own: &[&Pod],
        pod_groups: &[PodGroup],
    ) -> Scratch {
        let state = engine.state();
        let own_claims = own
            .iter()
            .flat_map(|pod| claims::of_pod(pod, state).unwrap_or_default())
            .collect();
        let mut claims_of: HashMap<ObjectKey, Vec<ObjectKey>> = HashMap::new();
        let mut original_claims = HashMap::new();
        for (key, claim) in &state.claims {
            if claims::allocation(claim).is_none() {
                continue;
            }
            for r in claims::reserved_for(claim) {
                if r.resource != "pods" || r.api_group.as_deref().is_some_and(|g| !g.is_empty()) {
                    continue;
                }
                let pod_key = ObjectKey::new(key.namespace.clone(), r.name.clone());
                let same = state
                    .pods
                    .get(&pod_key)
                    .is_some_and(|p| claims::is_pod(r, &r.name, p.metadata.uid.as_deref()));
                if same {
                    claims_of.entry(pod_key).or_default().push(key.clone());
                    original_claims.insert(key.clone(), ResourceClaim::clone(claim));
                }
            }
        }
        let policies: HashMap<ObjectKey, &PodGroup> = pod_groups
            .iter()
            .map(|g| (ObjectKey::of(&g.metadata), g))
            .collect();
        let mut whole_groups: HashMap<ObjectKey, Vec<ObjectKey>> = HashMap::new();
        for (key, p) in &state.pods {
            let Some(name) = pod_group_name(p) else {
                continue;
            };
            if bound_node(p).is_none() || is_terminal(p) || p.metadata.deletion_timestamp.is_some()
            {
                continue;
            }
            let group = ObjectKey::new(key.namespace.clone(), name);
            let whole = policies
                .get(&group)
                .is_none_or(|g| match &g.spec.disruption_mode {
                    Some(mode) => mode.all.is_some(),
                    None => g.spec.scheduling_policy.gang.is_some(),
                });
            if whole {
                whole_groups.entry(group).or_default().push(key.clone());
            }
        }
        for members in whole_groups.values_mut() {
            members.sort();
        }
        let group_priority = pod_groups
            .iter()
            .filter_map(|g| Some((ObjectKey::of(&g.metadata), g.spec.priority?)))
            .collect();
        Scratch {
            priority,
            preemptor: preemptor.clone(),
            own_claims,
            claims_of,
            original_claims,
            original_pods: state.pods.clone(),
            removed: BTreeSet::new(),
            freed: BTreeSet::new(),
            whole_groups,
            group_priority,
            engine,
        }
    }

    /// A pod on `node` preempted for this pod that is still terminating.
    fn terminating_victim(&self, node: &str) -> Option<ObjectKey> {
        let info = self.engine.state().nodes.get(node)?;
        info.pod_keys
            .iter()
            .find(|k| {
                self.original_pods
                    .get(*k)
                    .is_some_and(|p| priority(p) < self.priority && terminating_by_preemption(p))
            })
            .cloned()
    }

    /// The candidate victims on a node: its pods (PodGroups evicted whole with all their
    /// bound members) of lower priority, not terminating.
    fn units_on(&self, node: &str) -> Vec<Unit> {
        let Some(info) = self.engine.state().nodes.get(node) else {
            return Vec::new();
        };
        let mut units = Vec::new();
        let mut groups_seen = BTreeSet::new();
        for key in &info.pod_keys {
            let Some(pod) = self.original_pods.get(key) else {
                continue;
            };
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let group = pod_group_name(pod).map(|n| ObjectKey::new(key.namespace.clone(), n));
            let unit = match group.filter(|g| self.whole_groups.contains_key(g)) {
                Some(group) => {
                    if !groups_seen.insert(group.clone()) {
                        continue;
                    }
                    let pods = self.whole_groups[&group].clone();
                    let members: Vec<&Pod> = pods
                        .iter()
                        .filter_map(|k| self.original_pods.get(k).map(Arc::as_ref))
                        .collect();
                    Unit {
                        priority: self.group_priority.get(&group).copied().unwrap_or_else(|| {
                            members.iter().map(|p| priority(p)).max().unwrap_or(0)
                        }),
                        earliest: members
                            .iter()
                            .map(|p| start_time(p))
                            .min_by(older)
                            .flatten(),
                        group: true,
                        pods,
                    }
                }
                None => Unit {
                    pods: vec![key.clone()],
                    priority: priority(pod),
                    group: false,
                    earliest: start_time(pod),
                },
            };
            if unit.priority < self.priority {
                units.push(unit);
            }
        }
        units
    }

    fn remove(&mut self, pods: &[ObjectKey]) {
        for key in pods {
            if self.removed.insert(key.clone()) {
                self.engine.remove_pod(key);
            }
        }
        self.settle(pods);
    }

    fn restore(&mut self, pods: &[ObjectKey]) {
        for key in pods {
            if self.removed.remove(key)
                && let Some(pod) = self.original_pods.get(key)
            {
                self.engine.upsert_pod(Pod::clone(pod));
            }
        }
        self.settle(pods);
    }

    /// Free or take again the claims of `pods`, as their consumers now are.
    fn settle(&mut self, pods: &[ObjectKey]) {
        let keys: BTreeSet<ObjectKey> = pods
            .iter()
            .filter_map(|p| self.claims_of.get(p))
            .flatten()
            .cloned()
            .collect();
        for key in keys {
            let frees = self.frees(&key);
            if frees == self.freed.contains(&key) {
                continue;
            }
            let original = self.original_claims[&key].clone();
            if frees {
                self.freed.insert(key.clone());
                let mut claim = original;
                if let Some(status) = claim.status.as_mut() {
                    status.allocation = None;
                    if let Some(reserved) = status.reserved_for.as_mut() {
                        reserved.clear();
                    }
                }
                self.engine.upsert_claim(claim);
            } else {
                self.freed.remove(&key);
                self.engine.upsert_claim(original);
            }
        }
    }

    /// Whether the claim's devices come back with the pods removed now: every consumer
    /// is a removed pod or gone already.
    fn frees(&self, key: &ObjectKey) -> bool {
        if self.own_claims.contains(key) {
            return false;
        }
        let claim = &self.original_claims[key];
        let reserved = claims::reserved_for(claim);
        !reserved.is_empty()
            && reserved.iter().all(|r| {
                if r.resource != "pods" || r.api_group.as_deref().is_some_and(|g| !g.is_empty()) {
                    return false;
                }
                let pod = ObjectKey::new(key.namespace.clone(), r.name.clone());
                if self.removed.contains(&pod) {
                    return true;
                }
                match self.engine.state().pods.get(&pod) {
                    None => true,
                    Some(p) => {
                        is_terminal(p) || !claims::is_pod(r, &r.name, p.metadata.uid.as_deref())
                    }
                }
            })
    }

    /// The pod's cycle on `node` alone: its placement, or why it does not fit.
    fn fits(
        &mut self,
        node: &str,
        deadline: Instant,
    ) -> Result<Result<Placement, (String, bool)>, Abort> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Abort::OutOfTime);
        }
        let nodes = BTreeSet::from([node.to_string()]);
        let scope = Scope {
            nodes: Some(&nodes),
            ..Default::default()
        };
        match self
            .engine
            .schedule_scoped(&self.preemptor, left, None, scope)
        {
            Decision::Scheduled(p) => Ok(Ok(p)),
            Decision::Unschedulable {
                message,
                rejected_by,
                ..
            } => Ok(Err((
                node_reason(&message),
                rejected_by.contains("DynamicResources"),
            ))),
            Decision::OutOfTime { .. } => Err(Abort::OutOfTime),
            Decision::Error { message, .. } => Err(Abort::Error(message)),
        }
    }

    /// Remove every candidate victim on the node; if the pod then fits, reprieve as many
    /// as it still fits with. The scratch is as before on return.
    fn try_node(
        &mut self,
        node: &str,
        mut units: Vec<Unit>,
        pdbs: &[PodDisruptionBudget],
        deadline: Instant,
    ) -> Result<NodeResult, Abort> {
        if units.is_empty() {
            return Ok(NodeResult::NoVictims);
        }
        units.sort_by(Unit::importance);
        let all: Vec<ObjectKey> = units.iter().flat_map(|u| u.pods.iter().cloned()).collect();
        self.remove(&all);
        let mut placement = match self.fits(node, deadline)? {
            Ok(p) => p,
            Err((reason, devices)) => {
                let why = match self.held_on(node).filter(|_| devices) {
                    Some(held) => held,
                    None => format!(
                        "{node}: {reason}, even with its {} pods of lower priority evicted",
                        all.len()
                    ),
                };
                self.restore(&all);
                return Ok(NodeResult::Unfit(why));
            }
        };
        let violations = pdb_violations(&units, &self.original_pods, pdbs);
        let order: Vec<usize> = (0..units.len())
            .filter(|i| violations[*i] > 0)
            .chain((0..units.len()).filter(|i| violations[*i] == 0))
            .collect();
        let mut victims: Vec<usize> = Vec::new();
        let mut pdb_count = 0;
        for i in order {
            self.restore(&units[i].pods);
            match self.fits(node, deadline)? {
                Ok(p) => placement = p,
                Err(_) => {
                    self.remove(&units[i].pods);
                    victims.push(i);
                    pdb_count += violations[i];
                }
            }
        }
        victims.sort();
        let mut freed = BTreeMap::new();
        for i in &victims {
            for pod in &units[*i].pods {
                let mine: Vec<ObjectKey> = self
                    .claims_of
                    .get(pod)
                    .into_iter()
                    .flatten()
                    .filter(|c| self.freed.contains(*c))
                    .cloned()
                    .collect();
                freed.insert(pod.clone(), mine);
            }
        }
        self.restore(&all);
        let victims = victims.into_iter().map(|i| units[i].clone()).collect();
        Ok(NodeResult::Candidate(Box::new(Candidate {
            node: node.to_string(),
            victims,
            placement,
            pdb_violations: pdb_count,
            freed,
        })))
    }

    /// With the candidate victims removed: who holds the devices left allocated to pods on
    /// the node, as a sentence; `None` when no pod there holds any.
    fn held_on(&self, node: &str) -> Option<String> {
        let state = self.engine.state();
        let info = state.nodes.get(node)?;
        let mut devices: BTreeSet<(String, String, String)> = BTreeSet::new();
        let mut holders: Vec<(i32, String)> = Vec::new();
        for key in &info.pod_keys {
            let Some(pod) = state.pods.get(key) else {
                continue;
            };
            let mut holds = false;
            for claim in claims::of_pod(pod, state).unwrap_or_default() {
                let Some(allocation) = state.claims.get(&claim).and_then(|c| claims::allocation(c))
                else {
                    continue;
                };
                for r in allocation
                    .devices
                    .iter()
                    .flat_map(|d| d.results.iter().flatten())
                {
                    holds = true;
                    devices.insert((r.driver.clone(), r.pool.clone(), r.device.clone()));
                }
            }
            if holds {
                holders.push((priority(pod), key.to_string()));
            }
        }
        if devices.is_empty() {
            return None;
        }
        let names: Vec<String> = holders.iter().map(|(_, n)| n.clone()).collect();
        let n = devices.len();
        let devices = if n == 1 {
            "device on {node} is"
        } else {
            "devices on {node} are"
        }
        .replace("{node}", node);
        let p = self.priority;
        Some(if holders.iter().all(|(prio, _)| *prio >= p) {
            format!(
                "the {n} {devices} held by pods of priority {p} or higher ({})",
                listed(&names)
            )
        } else {
            format!(
                "the {n} {devices} held by pods that cannot be evicted for it ({}): of priority {p} or higher, terminating, or sharing a claim with such a pod",
                listed(&names)
            )
        })
    }

    /// A pod of a victim unit; `node`: where it runs if the pod is not known.
    fn victim(
        &self,
        key: &ObjectKey,
        unit: &Unit,
        node: &str,
        freed: &BTreeMap<ObjectKey, Vec<ObjectKey>>,
    ) -> Victim {
        let pod = self.original_pods.get(key);
        Victim {
            pod: key.clone(),
            uid: pod.and_then(|p| p.metadata.uid.clone()),
            priority: pod.map(|p| priority(p)).unwrap_or(unit.priority),
            node: pod.and_then(|p| bound_node(p)).unwrap_or(node).to_string(),
            freed_claims: freed.get(key).cloned().unwrap_or_default(),
        }
    }

    /// The decision for the chosen candidate.
    fn preemption(&self, best: Candidate) -> Preemption {
        let victims: Vec<Victim> = best
            .victims
            .iter()
            .flat_map(|unit| {
                unit.pods
                    .iter()
                    .map(|key| self.victim(key, unit, &best.node, &best.freed))
            })
            .collect();
        let names: Vec<String> = victims
            .iter()
            .map(|v| {
                if v.node == best.node {
                    v.pod.to_string()
                } else {
                    format!("{} on {}", v.pod, v.node)
                }
            })
            .collect();
        let message = format!(
            "preempting {} pod{} on {} ({}){}",
            victims.len(),
            if victims.len() == 1 { "" } else { "s" },
            best.node,
            listed(&names),
            self.for_devices(&best.freed, &[&best.placement])
        );
        Preemption {
            pod: self.preemptor.clone(),
            node: best.node,
            victims,
            placement: best.placement,
            pdb_violations: best.pdb_violations,
            message,
        }
    }

    /// " for 2 devices of DeviceClass gpu.nvidia.com": the freed devices (`freed`: per victim,
    /// its freed claims) the placements get.
    fn for_devices(
        &self,
        freed: &BTreeMap<ObjectKey, Vec<ObjectKey>>,
        placements: &[&Placement],
    ) -> String {
        let freed: BTreeSet<(&str, &str, &str)> = freed
            .values()
            .flatten()
            .filter_map(|k| self.original_claims.get(k).and_then(claims::allocation))
            .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
            .map(|r| (r.driver.as_str(), r.pool.as_str(), r.device.as_str()))
            .collect();
        let mut by_class: BTreeMap<String, usize> = BTreeMap::new();
        for decision in placements.iter().flat_map(|p| p.claims.iter()) {
            let results = decision
                .allocation
                .iter()
                .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()));
            for r in results {
                if freed.contains(&(r.driver.as_str(), r.pool.as_str(), r.device.as_str())) {
                    let class = class_of(&decision.claim, &r.request)
                        .map(|c| format!("DeviceClass {c}"))
                        .unwrap_or_else(|| format!("driver {}", r.driver));
                    *by_class.entry(class).or_default() += 1;
                }
            }
        }
        if by_class.is_empty() {
            return String::new();
        }
        let parts: Vec<String> = by_class
            .into_iter()
            .map(|(class, n)| format!("{n} device{} of {class}", if n == 1 { "" } else { "s" }))
            .collect();
        format!(" for {}", parts.join(" and "))
    }
}

impl Engine {
    /// PostFilter for a PodGroup: find the pods of lower priority to evict so that the
    /// group's pending `members` fit as [`Engine::schedule_group`] places them (see the
    /// module doc). Changes nothing. `Err` says why no preemption helps, or why the group
    /// may not preempt. The search stops at `budget`. `pod_groups`: the PodGroups of
    /// possible victims, as for [`Engine::preempt_with_groups`].
    pub fn preempt_group(
        &mut self,
        group: &PodGroup,
        members: &[ObjectKey],
        budget: Duration,
        pdbs: &[PodDisruptionBudget],
        pod_groups: &[PodGroup],
    ) -> Result<GroupPreemption, String> {
        let deadline = Instant::now() + budget;
        self.preemption_enabled()?;
        let key = ObjectKey::of(&group.metadata);
        if group.spec.preemption_policy.as_deref() == Some("Never") {
            return Err(format!("PodGroup {key}: preemptionPolicy is Never"));
        }
        if members.is_empty() {
            return Err(format!("PodGroup {key}: no pending members to preempt for"));
        }
        let mut pods: Vec<Pod> = Vec::new();
        for member in members {
            let pod = self
                .state()
                .pods
                .get(member)
                .ok_or_else(|| format!("PodGroup {key}: member pod {member} not found"))?;
            if never(pod) {
                return Err(format!(
                    "PodGroup {key}: pod {member} has preemptionPolicy Never"
                ));
            }
            eligible_pending(member, pod).map_err(|e| format!("PodGroup {key}: {e}"))?;
            if !names_group(pod, &key) {
                return Err(format!(
                    "PodGroup {key}: pod {member} does not name it in spec.schedulingGroup.podGroupName"
                ));
            }
            pods.push(Pod::clone(pod));
        }
        let group_priority = group.spec.priority.unwrap_or_else(|| priority(&pods[0]));
        if let Some((member, pod)) = members
            .iter()
            .zip(&pods)
            .find(|(_, p)| priority(p) != group_priority)
        {
            return Err(format!(
                "PodGroup {key}: all its pods must have the group's priority {group_priority}; pod {member} has {}",
                priority(pod)
            ));
        }
        let own: Vec<&Pod> = pods.iter().collect();
        let mut scratch = Scratch::new(self.fork(), &members[0], group_priority, &own, pod_groups);
        for (member, pod) in members.iter().zip(&pods) {
            if let Some(node) = nominated_node(pod)
                && let Some(terminating) = scratch.terminating_victim(node)
            {
                return Err(format!(
                    "PodGroup {key}: pod {terminating} on node {node}, preempted for member {member}, is still terminating"
                ));
            }
        }
        let abort = |abort: Abort, when: &str| match abort {
            Abort::OutOfTime => {
                format!("PodGroup {key}: preemption ran out of its {budget:?} budget {when}")
            }
            Abort::Error(message) => message,
        };
        let gang = group.spec.scheduling_policy.gang.is_some();
        let before = scratch
            .place_group(group, members, deadline)
            .map_err(|a| abort(a, "before choosing any victim"))?;
        if gang && before.is_ok() {
            return Err(format!("PodGroup {key} fits without preemption"));
        }
        let units = scratch.all_units();
        if units.is_empty() {
            let why = before.err().unwrap_or_default();
            return Err(format!(
                "no preemption helps PodGroup {key}: no pod of priority below {group_priority} runs in the cluster; {}",
                without_group(&why, &key)
            ));
        }
        let all: Vec<ObjectKey> = units.iter().flat_map(|u| u.pods.iter().cloned()).collect();
        let evicted_all = format!(
            "with all {} pods of priority below {group_priority} evicted",
            all.len()
        );
        scratch.remove(&all);
        let placement = match scratch
            .place_group(group, members, deadline)
            .map_err(|a| abort(a, &evicted_all))?
        {
            Ok(p) => p,
            Err(message) => {
                return Err(format!(
                    "no preemption helps PodGroup {key}: even {evicted_all}, {}",
                    without_group(&message, &key)
                ));
            }
        };
        let target = if gang { 1 } else { placement.placements.len() };
        if before.is_ok_and(|p| p.placements.len() >= target) {
            return Err(format!("PodGroup {key} fits without preemption"));
        }
        let violations = pdb_violations(&units, &scratch.original_pods, pdbs);
        let mut search = GroupSearch {
            group,
            members,
            target,
            deadline,
            footprint: Footprint::of(&placement),
            placement,
            unverified: Vec::new(),
        };
        let victim = scratch
            .group_reprieve(&mut search, &units, &violations)
            .map_err(|a| {
                abort(
                    a,
                    &format!(
                        "while choosing the fewest of {} candidate victims",
                        all.len()
                    ),
                )
            })?;
        Ok(scratch.group_preemption(&key, &units, &victim, &violations, search.placement))
    }
}

/// "PodGroup ns/name: why" → "why".
fn without_group<'m>(message: &'m str, group: &ObjectKey) -> &'m str {
    message
        .strip_prefix(&format!("PodGroup {group}: "))
        .unwrap_or(message)
}

/// The reprieve of a PodGroup's preemption: what the group must fit with, and where it
/// fits as the victims stand.
struct GroupSearch<'a> {
    group: &'a PodGroup,
    members: &'a [ObjectKey],
    /// Members to place at least (gang: any scheduled decision, which holds `minCount`;
    /// basic: as many as with every candidate victim gone).
    target: usize,
    deadline: Instant,
    /// The group's placement as of the last search, and its nodes and devices.
    placement: GroupPlacement,
    footprint: Footprint,
    /// Units put back since the last search without one (they touch neither the nodes nor
    /// the devices of its placement).
    unverified: Vec<usize>,
}

/// The nodes and devices a group's placement takes.
struct Footprint {
    nodes: BTreeSet<String>,
    devices: BTreeSet<(String, String, String)>,
}

impl Footprint {
    fn of(placement: &GroupPlacement) -> Footprint {
        Footprint {
            nodes: placement
                .placements
                .iter()
                .map(|p| p.node.clone())
                .collect(),
            devices: placement
                .placements
                .iter()
                .flat_map(|p| p.claims.iter())
                .flat_map(|c| c.allocation.iter())
                .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
                .map(|r| (r.driver.clone(), r.pool.clone(), r.device.clone()))
                .collect(),
        }
    }
}

/// A PodGroup as preemptor.
impl Scratch {
    /// The group's decision as the scratch stands: its placement, or why it does not fit.
    fn place_group(
        &mut self,
        group: &PodGroup,
        members: &[ObjectKey],
        deadline: Instant,
    ) -> Result<Result<GroupPlacement, String>, Abort> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Abort::OutOfTime);
        }
        match self.engine.schedule_group_with(group, members, left, None) {
            GroupDecision::Scheduled(p) => Ok(Ok(p)),
            GroupDecision::Unschedulable { .. } if Instant::now() >= deadline => {
                Err(Abort::OutOfTime)
            }
            GroupDecision::Unschedulable { message, .. } => Ok(Err(message)),
            GroupDecision::Error { message, .. } => Err(Abort::Error(message)),
        }
    }

    /// Every candidate victim in the cluster, each once (a PodGroup evicted whole is one
    /// unit, whichever nodes its members run on), the most important first.
    fn all_units(&self) -> Vec<Unit> {
        let mut seen = BTreeSet::new();
        let mut units: Vec<Unit> = Vec::new();
        for node in self.engine.state().nodes.keys() {
            for unit in self.units_on(node) {
                if seen.insert(unit.pods.clone()) {
                    units.push(unit);
                }
            }
        }
        units.sort_by(Unit::importance);
        units
    }

    /// Whether putting `unit` back may change where the group goes: a pod of it runs on a
    /// node of the placement, or a claim of it holds a device the placement takes.
    fn touches(&self, unit: &Unit, footprint: &Footprint) -> bool {
        unit.pods.iter().any(|pod| {
            let on = self
                .original_pods
                .get(pod)
                .and_then(|p| bound_node(p))
                .is_some_and(|n| footprint.nodes.contains(n));
            on || self
                .claims_of
                .get(pod)
                .into_iter()
                .flatten()
                .filter_map(|c| self.original_claims.get(c).and_then(claims::allocation))
                .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
                .any(|r| {
                    footprint.devices.contains(&(
                        r.driver.clone(),
                        r.pool.clone(),
                        r.device.clone(),
                    ))
                })
        })
    }

    /// Put the units `idx` that are still victims back, and keep them back when the group
    /// still fits. With `trust`, units that touch nothing of the group's placement are kept
    /// back without a search (checked by the next search, or the final check). Returns
    /// whether they stay back.
    fn try_reprieve(
        &mut self,
        search: &mut GroupSearch<'_>,
        units: &[Unit],
        idx: &[usize],
        victim: &mut [bool],
        trust: bool,
    ) -> Result<bool, Abort> {
        let idx: Vec<usize> = idx.iter().copied().filter(|i| victim[*i]).collect();
        if idx.is_empty() {
            return Ok(false);
        }
        let pods: Vec<ObjectKey> = idx
            .iter()
            .flat_map(|i| units[*i].pods.iter().cloned())
            .collect();
        let touches = idx
            .iter()
            .any(|i| self.touches(&units[*i], &search.footprint));
        self.restore(&pods);
        if trust && !touches {
            search.unverified.extend(&idx);
        } else {
            match self.place_group(search.group, search.members, search.deadline)? {
                Ok(p) if p.placements.len() >= search.target => {
                    search.footprint = Footprint::of(&p);
                    search.placement = p;
                    search.unverified.clear();
                }
                _ => {
                    self.remove(&pods);
                    return Ok(false);
                }
            }
        }
        for i in &idx {
            victim[*i] = false;
        }
        Ok(true)
    }

    /// With every candidate victim removed and the group placed: put back as many as the
    /// group still fits with. First whole nodes, the costliest to empty first (the most
    /// PodDisruptionBudget violations, the most pods, the highest priority), then single
    /// units (those violating a budget first, then the most important first). Returns,
    /// per unit, whether it is a victim; `search.placement` is the group's placement with
    /// those victims gone.
    fn group_reprieve(
        &mut self,
        search: &mut GroupSearch<'_>,
        units: &[Unit],
        violations: &[usize],
    ) -> Result<Vec<bool>, Abort> {
        let mut victim = vec![true; units.len()];
        // Units that could not come back alone: not tried alone again.
        let mut failed_alone = vec![false; units.len()];
        let mut by_node: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, unit) in units.iter().enumerate() {
            for pod in &unit.pods {
                if let Some(node) = self.original_pods.get(pod).and_then(|p| bound_node(p)) {
                    let list = by_node.entry(node.to_string()).or_default();
                    if !list.contains(&i) {
                        list.push(i);
                    }
                }
            }
        }
        loop {
            let next = by_node
                .iter()
                .map(|(node, idx)| {
                    let live: Vec<usize> = idx.iter().copied().filter(|i| victim[*i]).collect();
                    let pdb: usize = live.iter().map(|i| violations[*i]).sum();
                    let pods: usize = live.iter().map(|i| units[*i].pods.len()).sum();
                    let highest = live.iter().map(|i| units[*i].priority).max();
                    let touches = live
                        .iter()
                        .any(|i| self.touches(&units[*i], &search.footprint));
                    (
                        (Reverse(pdb), Reverse(pods), Reverse(highest), touches),
                        node.clone(),
                        live,
                    )
                })
                .min_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
            let Some((_, node, live)) = next else {
                break;
            };
            by_node.remove(&node);
            if !self.try_reprieve(search, units, &live, &mut victim, true)? && live.len() == 1 {
                failed_alone[live[0]] = true;
            }
        }
        let order: Vec<usize> = (0..units.len())
            .filter(|i| violations[*i] > 0)
            .chain((0..units.len()).filter(|i| violations[*i] == 0))
            .collect();
        for i in order {
            if victim[i] && !failed_alone[i] {
                self.try_reprieve(search, units, &[i], &mut victim, true)?;
            }
        }
        // The units kept back on trust: the group must still fit with them all back; if it
        // does not (a pod elsewhere that matters to it: affinity, spreading), each of them
        // is tried again with a search.
        if !search.unverified.is_empty() {
            match self.place_group(search.group, search.members, search.deadline)? {
                Ok(p) if p.placements.len() >= search.target => {
                    search.footprint = Footprint::of(&p);
                    search.placement = p;
                    search.unverified.clear();
                }
                _ => {
                    let trusted = std::mem::take(&mut search.unverified);
                    let pods: Vec<ObjectKey> = trusted
                        .iter()
                        .flat_map(|i| units[*i].pods.iter().cloned())
                        .collect();
                    self.remove(&pods);
                    for i in &trusted {
                        victim[*i] = true;
                    }
                    for i in trusted {
                        self.try_reprieve(search, units, &[i], &mut victim, false)?;
                    }
                }
            }
        }
        Ok(victim)
    }

    /// The decision: the victims, and each member's place.
    fn group_preemption(
        &self,
        key: &ObjectKey,
        units: &[Unit],
        victim: &[bool],
        violations: &[usize],
        placement: GroupPlacement,
    ) -> GroupPreemption {
        let chosen: Vec<usize> = (0..units.len()).filter(|i| victim[*i]).collect();
        let mut freed: BTreeMap<ObjectKey, Vec<ObjectKey>> = BTreeMap::new();
        for i in &chosen {
            for pod in &units[*i].pods {
                let mine: Vec<ObjectKey> = self
                    .claims_of
                    .get(pod)
                    .into_iter()
                    .flatten()
                    .filter(|c| self.freed.contains(*c))
                    .cloned()
                    .collect();
                freed.insert(pod.clone(), mine);
            }
        }
        let node_of = |pod: &ObjectKey| self.original_pods.get(pod).and_then(|p| bound_node(p));
        let victims: Vec<Victim> = chosen
            .iter()
            .flat_map(|i| {
                let unit = &units[*i];
                unit.pods
                    .iter()
                    .map(|k| self.victim(k, unit, node_of(k).unwrap_or_default(), &freed))
            })
            .collect();
        let mut preemptions = Vec::new();
        for p in &placement.placements {
            let here: Vec<usize> = chosen
                .iter()
                .copied()
                .filter(|i| units[*i].pods.iter().any(|k| node_of(k) == Some(&p.node)))
                .collect();
            if here.is_empty() {
                preemptions.push(Preemption {
                    pod: p.pod.clone(),
                    node: p.node.clone(),
                    victims: Vec::new(),
                    placement: p.clone(),
                    pdb_violations: 0,
                    message: format!(
                        "nothing preempted on {} (PodGroup {key} preempts on other nodes)",
                        p.node
                    ),
                });
                continue;
            }
            let candidate = Candidate {
                node: p.node.clone(),
                victims: here.iter().map(|i| units[*i].clone()).collect(),
                placement: p.clone(),
                pdb_violations: here.iter().map(|i| violations[*i]).sum(),
                freed: here
                    .iter()
                    .flat_map(|i| units[*i].pods.iter())
                    .map(|k| (k.clone(), freed.get(k).cloned().unwrap_or_default()))
                    .collect(),
            };
            let mut preemption = self.preemption(candidate);
            preemption.pod = p.pod.clone();
            preemptions.push(preemption);
        }
        let mut by_node: Vec<&Victim> = victims.iter().collect();
        by_node.sort_by(|a, b| a.node.cmp(&b.node));
        let names: Vec<String> = by_node
            .iter()
            .map(|v| format!("{} on {}", v.pod, v.node))
            .collect();
        let nodes: Vec<&str> = placement
            .placements
            .iter()
            .map(|p| p.node.as_str())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let placed: Vec<&Placement> = placement.placements.iter().collect();
        let n = placement.placements.len();
        let message = format!(
            "preempting {} pod{} ({}){} for PodGroup {key}: {n} member{} to {}",
            victims.len(),
            if victims.len() == 1 { "" } else { "s" },
            listed(&names),
            self.for_devices(&freed, &placed),
            if n == 1 { "" } else { "s" },
            nodes_named(&nodes),
        );
        GroupPreemption {
            group: key.clone(),
            victims,
            preemptions,
            pdb_violations: chosen.iter().map(|i| violations[*i]).sum(),
            message,
        }
    }
}
