//! One pod's scheduling cycle over the profile's plugins, as kube-scheduler's
//! `schedulePod`: PreFilter, Filter on the nodes (until enough fit), PreScore and Score on
//! the feasible ones, the best node (ties: the first by name), Reserve.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dra_allocator::Limits;

use crate::engine::{Decision, Engine, Placement};
use crate::extended;
use crate::framework::{Code, Cycle, NodeOutcome, Shared, Status, fit_error};
use crate::resources::pod_requests;
use crate::state::{NodeInfo, ObjectKey};

/// Every node's verdict and score for one pod, without deciding: what the conformance
/// suite compares with kube-scheduler.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Evaluation {
    /// Nodes that passed every filter, by name.
    pub feasible: Vec<String>,
    /// Why each other node did not.
    pub unfit: BTreeMap<String, String>,
    /// The total weighted score of each feasible node (empty when only one is feasible).
    pub scores: BTreeMap<String, i64>,
    /// Per score plugin, each feasible node's weighted score.
    pub plugin_scores: BTreeMap<String, BTreeMap<String, i64>>,
    /// Why the attempt failed as a whole (PreFilter rejected the pod, or an error).
    pub error: Option<String>,
}

/// How far to look: kube-scheduler's numFeasibleNodesToFind, or every node.
#[derive(Clone, Copy)]
enum Search {
    Enough,
    AllNodes,
}

/// Where one attempt may look, for a PodGroup's members (`crate::group`); the default
/// is a plain pod's attempt over every node.
#[derive(Clone, Copy, Default)]
pub(crate) struct Scope<'s> {
    /// Only these nodes (a topology domain, or the one node of a repair step).
    pub nodes: Option<&'s BTreeSet<String>>,
    /// Claims of other members on that node to allocate again with this pod's.
    pub revise: &'s [ObjectKey],
    /// The pod is a member of a PodGroup scheduled through `Engine::schedule_group`
    /// (a plain attempt refuses `spec.schedulingGroup`).
    pub group: bool,
}

/// Every node's Filter status for one pod ([`Engine::node_statuses`]).
pub(crate) enum NodeStatuses {
    /// The attempt stopped as a whole: PreFilter rejected the pod, a plugin failed, or the
    /// device search ran out of time.
    Stopped(Status),
    /// Each node by name, with its status (success: the pod fits there).
    Nodes(Vec<(String, Status)>),
}

/// What the framework made of an attempt, before it is turned into a decision.
enum Verdict<'a> {
    /// The pod went no further than PreFilter, or a plugin failed.
    Stopped(Status),
    Filtered {
        outcomes: Vec<NodeOutcome<'a>>,
        /// Feasible nodes with their scores, in node order.
        scored: Vec<(&'a NodeInfo, i64)>,
        per_plugin: BTreeMap<String, Vec<i64>>,
        placement: Option<Box<Placement>>,
    },
}

impl Engine {
    /// Run the scheduling cycle for one pod. Does not change the state: call
    /// [`Engine::assume`] with a `Scheduled` decision to take it.
    pub fn schedule(&mut self, pod_key: &ObjectKey) -> Decision {
        self.schedule_with(pod_key, None)
    }

    /// [`Engine::schedule`] that stops early when `cancel` is set (the daemon sets it when
    /// it stops leading or shuts down). Either way the device search of one pod is bounded
    /// by [`crate::EngineConfig::filter_timeout`].
    pub fn schedule_with(&mut self, pod_key: &ObjectKey, cancel: Option<&AtomicBool>) -> Decision {
        self.schedule_within(pod_key, self.config().filter_timeout, cancel)
    }

    /// [`Engine::schedule_with`] with a budget of its own for the device search (a first,
    /// short try; the daemon gives a pod that needs more the whole budget on a fork).
    pub fn schedule_within(
        &mut self,
        pod_key: &ObjectKey,
        budget: Duration,
        cancel: Option<&AtomicBool>,
    ) -> Decision {
        self.schedule_scoped(pod_key, budget, cancel, Scope::default())
    }

    /// [`Engine::schedule_within`] over the nodes and with the claims of `scope`.
    pub(crate) fn schedule_scoped(
        &mut self,
        pod_key: &ObjectKey,
        budget: Duration,
        cancel: Option<&AtomicBool>,
        scope: Scope<'_>,
    ) -> Decision {
        let whole = budget == self.config().filter_timeout;
        let pod = pod_key.clone();
        let total = scope
            .nodes
            .map_or(self.state().nodes.len(), |nodes| nodes.len());
        let unschedulable = |message, rejected_by| Decision::Unschedulable {
            pod: pod.clone(),
            message,
            rejected_by,
        };
        let error = |message| Decision::Error {
            pod: pod.clone(),
            message,
        };
        let result =
            self.run(
                pod_key,
                budget,
                cancel,
                Search::Enough,
                scope,
                |verdict| match verdict {
                    Verdict::Stopped(status) => match status.code {
                        Code::Error => error(status.message()),
                        Code::Stopped { cancelled } => {
                            stopped(pod_key, &status, cancelled, whole, budget, 0, total)
                        }
                        _ => unschedulable(
                            format!("0/{total} nodes are available: {}.", status.message()),
                            BTreeSet::from([status.plugin]),
                        ),
                    },
                    Verdict::Filtered {
                        outcomes,
                        placement,
                        ..
                    } => {
                        if let Some(o) = outcomes.iter().find(|o| o.status.code == Code::Error) {
                            return error(o.status.message());
                        }
                        if let Some(o) = outcomes
                            .iter()
                            .find(|o| matches!(o.status.code, Code::Stopped { .. }))
                        {
                            let Code::Stopped { cancelled } = o.status.code else {
                                unreachable!()
                            };
                            let checked = outcomes
                                .iter()
                                .filter(|o| !matches!(o.status.code, Code::Stopped { .. }))
                                .count();
                            return stopped(
                                pod_key, &o.status, cancelled, whole, budget, checked, total,
                            );
                        }
                        match placement {
                            Some(p) => Decision::Scheduled(*p),
                            None => unschedulable(
                                fit_error(total, &outcomes),
                                outcomes
                                    .iter()
                                    .filter(|o| o.status.is_rejection())
                                    .map(|o| o.status.plugin)
                                    .collect(),
                            ),
                        }
                    }
                },
            );
        result.unwrap_or_else(|message| Decision::Error { pod, message })
    }

    /// Every node's verdict and score for the pod (all nodes, nothing reserved or assumed).
    pub fn evaluate(&mut self, pod_key: &ObjectKey) -> Evaluation {
        let budget = self.config().filter_timeout;
        let scope = Scope::default();
        let result = self.run(pod_key, budget, None, Search::AllNodes, scope, |verdict| {
            let mut evaluation = Evaluation::default();
            match verdict {
                Verdict::Stopped(status) => evaluation.error = Some(status.message()),
                Verdict::Filtered {
                    outcomes,
                    scored,
                    per_plugin,
                    ..
                } => {
                    for o in &outcomes {
                        if o.status.is_success() {
                            evaluation.feasible.push(o.node.name().to_string());
                        } else {
                            evaluation
                                .unfit
                                .insert(o.node.name().to_string(), o.status.message());
                        }
                    }
                    // Examined in the node tree's order, zone by zone; told by name.
                    evaluation.feasible.sort();
                    if scored.len() > 1 {
                        for (i, (node, total)) in scored.iter().enumerate() {
                            evaluation.scores.insert(node.name().to_string(), *total);
                            for (plugin, scores) in &per_plugin {
                                evaluation
                                    .plugin_scores
                                    .entry(plugin.clone())
                                    .or_default()
                                    .insert(node.name().to_string(), scores[i]);
                            }
                        }
                    }
                }
            }
            evaluation
        });
        result.unwrap_or_else(|message| Evaluation {
            error: Some(message),
            ..Default::default()
        })
    }

    /// What Filter says about every node for the pod, for PostFilter (preemption): nothing
    /// is reserved or assumed.
    pub(crate) fn node_statuses(
        &mut self,
        pod_key: &ObjectKey,
        budget: Duration,
    ) -> Result<NodeStatuses, String> {
        let scope = Scope::default();
        self.run(
            pod_key,
            budget,
            None,
            Search::AllNodes,
            scope,
            |verdict| match verdict {
                Verdict::Stopped(status) => NodeStatuses::Stopped(status),
                Verdict::Filtered { outcomes, .. } => {
                    let stop = outcomes
                        .iter()
                        .find(|o| matches!(o.status.code, Code::Error | Code::Stopped { .. }));
                    match stop {
                        Some(o) => NodeStatuses::Stopped(o.status.clone()),
                        None => NodeStatuses::Nodes(
                            outcomes
                                .into_iter()
                                .map(|o| (o.node.name().to_string(), o.status))
                                .collect(),
                        ),
                    }
                }
            },
        )
    }

    /// Run the plugins for one pod and hand the verdict to `decide`. `Err` when the
    /// attempt cannot start (no such pod, unreadable requests, a wrong profile). Devices
    /// held for nominated pods (`Engine::nominate`) are free in the attempt of the pod
    /// itself and of pods of higher priority, taken in every other.
    fn run<T>(
        &mut self,
        pod_key: &ObjectKey,
        budget: Duration,
        cancel: Option<&AtomicBool>,
        search: Search,
        scope: Scope<'_>,
        decide: impl FnOnce(Verdict<'_>) -> T,
    ) -> Result<T, String> {
        let pod = self
            .state()
            .pods
            .get(pod_key)
            .cloned()
            .ok_or_else(|| format!("pod {pod_key} not found"))?;
        let lifted = self.lift_holds(pod_key, &pod);
        let result = self.run_as_seen(&pod, pod_key, budget, cancel, search, scope, decide);
        self.restore_holds(lifted);
        result
    }

    /// [`Engine::run`] with the holds that do not apply to the pod given back.
    #[allow(clippy::too_many_arguments)]
    fn run_as_seen<T>(
        &mut self,
        pod: &k8s_openapi::api::core::v1::Pod,
        pod_key: &ObjectKey,
        budget: Duration,
        cancel: Option<&AtomicBool>,
        search: Search,
        scope: Scope<'_>,
        decide: impl FnOnce(Verdict<'_>) -> T,
    ) -> Result<T, String> {
        let framework = self.framework()?;
        let pod = pod.clone();
        let requests = pod_requests(&pod).map_err(|e| format!("pod {pod_key}: {e}"))?;
        let served: Vec<String> =
            extended::requests_served_by_dra(&requests, &self.state().classes)
                .into_iter()
                .map(|e| e.resource)
                .collect();
        let snapshot = self.snapshot();
        let device_memo = self.device_memo();
        let state = self.state();
        let shared = Shared::for_nodes(state.nodes.len());
        let revise = scope
            .revise
            .iter()
            .map(|key| {
                state
                    .claims
                    .get(key)
                    .map(|c| (key.clone(), &**c))
                    .ok_or_else(|| format!("ResourceClaim {key} not found"))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let cycle = Cycle {
            pod: &pod,
            key: pod_key,
            state,
            requests: &requests,
            snapshot: &snapshot,
            features: &self.config().features,
            limits: Limits {
                deadline: Some(Instant::now() + budget),
                cancel,
            },
            cancel,
            served_by_devices: &served,
            shared: &shared,
            revise,
            device_memo: Some(&device_memo),
        };
        let mut nodes: Vec<&NodeInfo> = match scope.nodes {
            Some(only) => only.iter().filter_map(|n| state.nodes.get(n)).collect(),
            None => state.nodes_in_order(),
        };
        let wanted = match search {
            Search::Enough => self.feasible_nodes_to_find(nodes.len()),
            Search::AllNodes => nodes.len(),
        };
        // A plain pod's search starts where the last one stopped (a PodGroup's members
        // search their own domains; every-node evaluations have no start).
        let rotates = matches!(search, Search::Enough) && scope.nodes.is_none();
        if rotates && !nodes.is_empty() {
            let start = self.next_start_node % nodes.len();
            nodes.rotate_left(start);
        }
        let mut examined = None;
        let mut attempt = framework.start(&cycle);
        let verdict = (|| {
            if let Some(status) = unsupported(&pod).filter(|_| !scope.group) {
                return Verdict::Stopped(status);
            }
            if let Err(status) = attempt.pre_filter() {
                return Verdict::Stopped(status);
            }
            let outcomes = attempt.filter_nodes(&nodes, wanted);
            examined = Some(outcomes.len());
            let stop = outcomes
                .iter()
                .any(|o| matches!(o.status.code, Code::Error | Code::Stopped { .. }));
            let feasible: Vec<&NodeInfo> = outcomes
                .iter()
                .filter(|o| o.status.is_success())
                .map(|o| o.node)
                .collect();
            if stop || feasible.is_empty() {
                return Verdict::Filtered {
                    outcomes,
                    scored: Vec::new(),
                    per_plugin: BTreeMap::new(),
                    placement: None,
                };
            }
            let scores = match attempt.score(&feasible) {
                Ok(s) => s,
                Err(status) => return Verdict::Stopped(status),
            };
            let scored: Vec<(&NodeInfo, i64)> = feasible
                .iter()
                .copied()
                .zip(scores.totals.iter().copied())
                .collect();
            let best = select_host(&scored);
            let mut placement = Placement {
                pod: pod_key.clone(),
                pod_uid: pod.metadata.uid.clone(),
                node: best.name().to_string(),
                claims: Vec::new(),
                allocation_time: Duration::ZERO,
                volumes: Vec::new(),
                node_allocatable: Vec::new(),
            };
            if let Err(status) = attempt.reserve(best, &mut placement) {
                return Verdict::Stopped(status);
            }
            Verdict::Filtered {
                outcomes,
                scored,
                per_plugin: scores.per_plugin,
                placement: Some(Box::new(placement)),
            }
        })();
        let decided = decide(verdict);
        drop(attempt);
        if let Some(examined) = examined.filter(|_| rotates) {
            let total = nodes.len().max(1);
            self.next_start_node = (self.next_start_node % total + examined) % total;
        }
        self.record_search_steps(shared.search_steps.load(Ordering::Relaxed));
        let revised = std::mem::take(&mut *shared.revised.lock().expect("not poisoned"));
        self.record_revised(revised);
        Ok(decided)
    }
}

/// A pod that asks for what no plugin here implements is refused, naming the field: it is
/// never placed while a constraint is ignored.
fn unsupported(pod: &k8s_openapi::api::core::v1::Pod) -> Option<Status> {
    let spec = pod.spec.as_ref()?;
    spec.scheduling_group.as_ref().map(|_| {
        // A PodGroup's members are placed together by `Engine::schedule_group` (the daemon
        // and simulate send them there); a member alone is never placed past its group.
        Status::unresolvable(
            "spec.schedulingGroup: a member of a PodGroup is scheduled with its group, not alone",
        )
    })
}

/// The node with the highest total; among equals, the first by name (kube-scheduler picks
/// one of them at random; deterministic answers are easier to check and to explain).
fn select_host<'a>(scored: &[(&'a NodeInfo, i64)]) -> &'a NodeInfo {
    let mut best = scored[0];
    for candidate in &scored[1..] {
        if candidate.1 > best.1 || (candidate.1 == best.1 && candidate.0.name() < best.0.name()) {
            best = *candidate;
        }
    }
    best.0
}

/// The decision for a device search that ran out of its budget or was cancelled.
fn stopped(
    pod: &ObjectKey,
    status: &Status,
    cancelled: bool,
    whole: bool,
    budget: Duration,
    checked: usize,
    total: usize,
) -> Decision {
    if cancelled {
        return Decision::Error {
            pod: pod.clone(),
            message: "scheduling attempt cancelled".into(),
        };
    }
    let claims = if status.reasons.is_empty() {
        "of the pod".to_string()
    } else {
        status.reasons.join(", ")
    };
    Decision::OutOfTime {
        pod: pod.clone(),
        message: format!(
            "timed out trying to allocate devices: the search for ResourceClaim {claims} ran past {} of {budget:?} ({checked} of {total} nodes checked)",
            if whole {
                "the filterTimeout"
            } else {
                "a first try"
            },
        ),
    }
}
