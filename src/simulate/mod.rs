//! `dra-scheduler simulate`: schedule the pending pods of a set of manifests through the
//! same engine the daemon uses, with no cluster, and report where each pod would go and
//! which devices each claim would get. Pods that name a PodGroup in
//! `spec.schedulingGroup` are scheduled with their group, in one decision
//! ([`dra_engine::Engine::schedule_group`]), and the report says per group whether it was
//! placed and why not.
//!
//! Preemption (on unless `--no-preemption`): a pod that fits nowhere is given to
//! [`dra_engine::Engine::preempt`]; when evicting pods of lower priority lets it fit, the
//! victims are removed from the simulated cluster at once (their claims lose them from
//! `reservedFor`; a freed claim is deallocated, or deleted when it was made from a template
//! for a victim, as kube-controller-manager does: [`dra_engine::Engine::evict`]) and the
//! pod is placed where the preemption nominated it, on the devices it freed. The report
//! lists each preemption and marks its victims as evicted. Evicted pods are not scheduled
//! again (in a cluster their controllers would make new ones). PodDisruptionBudgets in the
//! manifests are respected where possible, as in the cluster; PodGroups do not preempt.
//!
//! The handoff wait (on unless the daemon's `--config` turns it off, or the pod opts out): a
//! pod placed on a lower-ranked `firstAvailable` subrequest while a terminating pod of its
//! owner holds a better device waits for it, the holder finishes and the pod takes that
//! device ([`handoff`]). Pods being deleted (`metadata.deletionTimestamp`) are never
//! scheduled; the report marks them as terminating.

pub mod expand;
pub mod handoff;
pub mod limits;
pub mod live;
pub mod manifests;
pub mod report;
pub mod validate;
mod yaml;

use std::collections::HashMap;
use std::path::PathBuf;

use dra_engine::group::pod_group_name;
use dra_engine::plugins::priority_sort::priority;
use dra_engine::{
    ClusterInput, Decision, Engine, EngineConfig, GroupDecision, ObjectKey, Preemption, Profile,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::v1beta1::{PodGroup, Workload};

/// What to simulate and how to report it.
#[derive(Clone, Debug)]
pub struct Options {
    pub scheduler_name: String,
    pub all_schedulers: bool,
    /// The scheduling profile (the daemon's `--config` gives the same one).
    pub profile: Profile,
    pub percentage_of_nodes_to_score: u32,
    pub filter_timeout: std::time::Duration,
    /// Evict pods of lower priority for a pod that fits nowhere (`--no-preemption`: off).
    pub preemption: bool,
    /// The handoff wait, as the daemon's `handoff:` config sets it; `None`: off.
    pub handoff: Option<handoff::Config>,
    /// The DRA features (the daemon's `featureGates:`).
    pub features: dra_engine::Features,
}

impl Default for Options {
    fn default() -> Self {
        let engine = EngineConfig::default();
        Options {
            scheduler_name: engine.scheduler_name,
            all_schedulers: false,
            profile: engine.profile,
            percentage_of_nodes_to_score: engine.percentage_of_nodes_to_score,
            filter_timeout: engine.filter_timeout,
            preemption: engine.preemption,
            handoff: Some(handoff::Config::default()),
            features: engine.features,
        }
    }
}

/// Why the simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error(transparent)]
    Manifest(#[from] manifests::ManifestError),
}

/// The outcome for every pod and claim.
pub struct Simulation {
    pub engine: Engine,
    /// Every pod, in input order, with its decision if it was ours to schedule.
    pub pods: Vec<(ObjectKey, Option<Decision>)>,
    /// Claims, in input order (generated claims after the pod that made them).
    pub claim_order: Vec<ObjectKey>,
    /// Every PodGroup with pending members, in the order they were scheduled.
    pub groups: Vec<GroupOutcome>,
    /// The preemptions made, in order: each pod placed by evicting others.
    pub preemptions: Vec<Preemption>,
    /// The handoff waits, in order: each pod placed on devices terminating pods held.
    pub handoffs: Vec<handoff::Waited>,
}

/// The scheduling objects of `scheduling.k8s.io/v1beta1` in the manifests.
#[derive(Clone, Debug, Default)]
pub struct Groups {
    pub workloads: Vec<Workload>,
    pub pod_groups: Vec<PodGroup>,
    /// PodDisruptionBudgets, which preemption respects where it can.
    pub pdbs: Vec<k8s_openapi::api::policy::v1::PodDisruptionBudget>,
}

/// What became of one PodGroup.
#[derive(Clone, Debug)]
pub struct GroupOutcome {
    pub group: ObjectKey,
    /// `spec.workloadRef`: `workload/template`.
    pub workload: Option<String>,
    /// Members scheduled with the group (pending when it was tried).
    pub members: Vec<ObjectKey>,
    /// How many of them were placed.
    pub placed: usize,
    /// With `schedulingConstraints.topology`: the domain chosen.
    pub domain: Option<String>,
    /// Why the group (or some member) was not placed.
    pub message: Option<String>,
}

impl Simulation {
    pub fn pending(&self) -> usize {
        self.pods
            .iter()
            .filter(|(_, d)| matches!(d, Some(d) if d.node().is_none()))
            .count()
    }
}

pub fn load(paths: &[PathBuf]) -> Result<ClusterInput, SimulateError> {
    load_all(paths).map(|(input, _)| input)
}

/// [`load`], also returning the Workloads and PodGroups for [`simulate_groups`].
pub fn load_all(paths: &[PathBuf]) -> Result<(ClusterInput, Groups), SimulateError> {
    load_onto(manifests::Manifests::default(), paths)
}

/// [`load_all`] on top of objects already read (`simulate --from-cluster`: the cluster's).
pub fn load_onto(
    base: manifests::Manifests,
    paths: &[PathBuf],
) -> Result<(ClusterInput, Groups), SimulateError> {
    let files = if paths.is_empty() {
        manifests::Manifests::default()
    } else {
        manifests::load(paths)?
    };
    let manifests = live::apply(base, files);
    for ignored in &manifests.ignored {
        eprintln!(
            "note: {}: {} is not used by the simulation",
            ignored.source, ignored.object
        );
    }
    Ok(expand::expand_all(manifests)?)
}

/// Schedule every pending pod that is ours, in queue order, assuming each decision.
/// Pods that name a PodGroup wait for it (there is none here): see [`simulate_groups`].
pub fn simulate(options: &Options, input: ClusterInput) -> Simulation {
    simulate_groups(options, input, Groups::default())
}

/// [`simulate`] with PodGroups: when the queue reaches the first pending member of a group,
/// all its pending members are scheduled together and the group's decision is assumed.
/// Runs on a thread of the engine's pool ([`dra_engine::in_pool`]): one cycle after another,
/// each sharing its parallel steps with the pool directly.
pub fn simulate_groups(options: &Options, input: ClusterInput, groups: Groups) -> Simulation {
    dra_engine::in_pool(|| simulate_in_pool(options, input, groups))
}

fn simulate_in_pool(options: &Options, input: ClusterInput, groups: Groups) -> Simulation {
    let pod_order: Vec<ObjectKey> = input
        .pods
        .iter()
        .map(|p| ObjectKey::of(&p.metadata))
        .collect();
    let claim_order: Vec<ObjectKey> = input
        .claims
        .iter()
        .map(|c| ObjectKey::of(&c.metadata))
        .collect();
    let position: HashMap<ObjectKey, usize> = pod_order
        .iter()
        .enumerate()
        .map(|(i, k)| (k.clone(), i))
        .collect();
    let config = EngineConfig {
        scheduler_name: options.scheduler_name.clone(),
        profile: options.profile.clone(),
        percentage_of_nodes_to_score: options.percentage_of_nodes_to_score,
        filter_timeout: options.filter_timeout,
        preemption: options.preemption,
        features: options.features.clone(),
    };
    let mut engine = Engine::new(config, input);
    let mut queue = engine.pending_pods(
        &|k| position.get(k).copied().unwrap_or(usize::MAX),
        options.all_schedulers,
    );
    // A pod being deleted is not scheduled (kube-scheduler skips it too).
    queue.retain(|k| !engine.state().pod(k).is_some_and(terminating));
    let mut decisions: HashMap<ObjectKey, Decision> = HashMap::new();
    let mut claim_order = claim_order;
    let mut group_outcomes = Vec::new();
    let mut preemptions = Vec::new();
    let mut handoffs = Vec::new();
    for key in &queue {
        if decisions.contains_key(key) {
            continue;
        }
        let group = engine
            .state()
            .pod(key)
            .and_then(pod_group_name)
            .map(|name| ObjectKey::new(key.namespace.clone(), name));
        if let Some(group) = group {
            let outcome = schedule_group(&mut engine, &groups, &group, &queue, &mut decisions);
            for p in outcome.1 {
                for c in p.claims.iter().filter(|c| c.create) {
                    claim_order.push(c.key.clone());
                }
            }
            group_outcomes.push(outcome.0);
            continue;
        }
        let key = key.clone();
        let mut decision = engine.schedule(&key);
        if let Decision::Scheduled(placement) = &decision
            && let Some(config) = &options.handoff
            && let Some((waited, placed)) =
                handoff::wait_for_holders(&mut engine, config, placement)
        {
            decision = placed;
            handoffs.push(waited);
        }
        if let Decision::Unschedulable { message, .. } = &mut decision
            && options.preemption
        {
            match preempt(&mut engine, &groups, &key) {
                Some(Ok(preemption)) => {
                    engine.evict(&preemption);
                    decision = Decision::Scheduled(preemption.placement.clone());
                    preemptions.push(preemption);
                }
                Some(Err(why)) => *message = format!("{message} preemption: {why}"),
                None => {}
            }
        }
        if let Decision::Scheduled(placement) = &decision {
            engine.assume(placement);
            for c in placement.claims.iter().filter(|c| c.create) {
                claim_order.push(c.key.clone());
            }
        }
        decisions.insert(key, decision);
    }
    let pods = pod_order
        .into_iter()
        .map(|k| {
            let d = decisions.remove(&k);
            (k, d)
        })
        .collect();
    Simulation {
        engine,
        pods,
        claim_order,
        groups: group_outcomes,
        preemptions,
        handoffs,
    }
}

/// Whether the pod is being deleted (`metadata.deletionTimestamp`).
pub fn terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// PostFilter for a pod that fits nowhere: a preemption, or why none helps. `None` when
/// no pod of lower priority is bound anywhere (nothing to say about preemption then).
fn preempt(
    engine: &mut Engine,
    groups: &Groups,
    key: &ObjectKey,
) -> Option<Result<Preemption, String>> {
    let mine = priority(engine.state().pods.get(key)?);
    let lower = engine
        .state()
        .nodes
        .values()
        .any(|n| n.lowest_priority().is_some_and(|p| p < mine));
    if !lower {
        return None;
    }
    let budget = engine.config().filter_timeout;
    Some(engine.preempt_with_groups(key, budget, &groups.pdbs, &groups.pod_groups))
}

/// Schedule the pending members of `group` (in queue order) in one decision, assume it,
/// and record a decision for each member.
fn schedule_group(
    engine: &mut Engine,
    groups: &Groups,
    group: &ObjectKey,
    queue: &[ObjectKey],
    decisions: &mut HashMap<ObjectKey, Decision>,
) -> (GroupOutcome, Vec<dra_engine::Placement>) {
    let members: Vec<ObjectKey> = queue
        .iter()
        .filter(|k| !decisions.contains_key(*k))
        .filter(|k| {
            let pod = engine.state().pods.get(*k);
            pod.is_some_and(|p| dra_engine::group::names_group(p, group))
        })
        .cloned()
        .collect();
    let found = groups
        .pod_groups
        .iter()
        .find(|g| ObjectKey::of(&g.metadata) == *group);
    let mut outcome = GroupOutcome {
        group: group.clone(),
        workload: found
            .and_then(|g| g.spec.workload_ref.as_ref())
            .map(|w| format!("{}/{}", w.workload_name, w.template_name)),
        members: members.clone(),
        placed: 0,
        domain: None,
        message: None,
    };
    let Some(pod_group) = found else {
        let message = format!("waiting for PodGroup {group}, which does not exist");
        unschedulable_all(decisions, &members, &message);
        outcome.message = Some(message);
        return (outcome, Vec::new());
    };
    match engine.schedule_group(pod_group, &members) {
        GroupDecision::Scheduled(placed) => {
            engine.assume_group(&placed);
            outcome.placed = placed.placements.len();
            outcome.domain = placed.domain.clone();
            if !placed.pending.is_empty() {
                outcome.message = Some(format!(
                    "{} of {} members placed; the others did not fit",
                    placed.placements.len(),
                    members.len()
                ));
            }
            for (key, message) in &placed.pending {
                decisions.insert(
                    key.clone(),
                    Decision::Unschedulable {
                        pod: key.clone(),
                        message: format!("PodGroup {group} was placed without this pod: {message}"),
                        rejected_by: Default::default(),
                    },
                );
            }
            for p in &placed.placements {
                decisions.insert(p.pod.clone(), Decision::Scheduled(p.clone()));
            }
            (outcome, placed.placements)
        }
        GroupDecision::Unschedulable { message, .. } => {
            unschedulable_all(decisions, &members, &message);
            outcome.message = Some(message);
            (outcome, Vec::new())
        }
        GroupDecision::Error { message, .. } => {
            for key in &members {
                decisions.insert(
                    key.clone(),
                    Decision::Error {
                        pod: key.clone(),
                        message: message.clone(),
                    },
                );
            }
            outcome.message = Some(message);
            (outcome, Vec::new())
        }
    }
}

/// Every member of a group that was not placed gets the group's reason.
fn unschedulable_all(
    decisions: &mut HashMap<ObjectKey, Decision>,
    members: &[ObjectKey],
    message: &str,
) {
    for key in members {
        decisions.insert(
            key.clone(),
            Decision::Unschedulable {
                pod: key.clone(),
                message: message.to_string(),
                rejected_by: Default::default(),
            },
        );
    }
}
