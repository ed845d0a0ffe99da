//! Keeping the better device across rollouts: the handoff wait and degraded pods.
//!
//! A claim whose request lists `firstAvailable` subrequests ("an A5000, else a T10") gets
//! the first one that can be satisfied when the pod is scheduled. When a Deployment's pod
//! is replaced, the replacement is usually created while the old pod still terminates and
//! still holds the preferred device; it then gets the fallback, and keeps it for its life.
//!
//! - [`Engine::handoff`]: for a placement that uses a lower-ranked subrequest, whether the
//!   pod would get a higher-ranked one from devices held by *terminating* pods (by default
//!   of the same owner: the same ReplicaSet, Deployment or StatefulSet). The engine runs
//!   the pod's cycle on a fork with those pods gone and their claims released; the answer
//!   names the devices, the subrequests and the holders, whose deletion times bound the
//!   wait. The caller (the daemon) decides how long to wait and when the bound has passed.
//! - [`Engine::degraded`]: the bound pods of this scheduler that run on a lower-ranked
//!   subrequest while, with their own claims released, their cycle would now choose a
//!   higher-ranked one (a device that satisfies it is free where the pod may run).
//!
//! A placement is *better* than another when, request by request, every firstAvailable
//! choice ranks at least as high and one ranks higher. Only claims allocated for the pod
//! alone count (a shared claim is not the pod's to move).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::claims;
use crate::engine::{Decision, Engine, Placement};
use crate::state::{ClusterState, ObjectKey, bound_node, is_terminal};

/// Annotation on a pod: `"false"` opts it out of the handoff wait (it takes the best
/// device free now).
pub const HANDOFF_ANNOTATION: &str = "dra-scheduler.io/handoff-wait";

/// Whether the pod opts out of the wait: the annotation [`HANDOFF_ANNOTATION`] is `"false"`.
pub fn opts_out(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HANDOFF_ANNOTATION))
        .is_some_and(|v| v.eq_ignore_ascii_case("false"))
}

/// Whose terminating pods a pod may wait for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Owners {
    /// Pods of the same owner: ReplicaSet, the Deployment through its ReplicaSets, or
    /// StatefulSet (any controller, by kind and name).
    #[default]
    Same,
    /// Any terminating pod.
    Any,
}

/// One firstAvailable request's choice: which subrequest, by name and rank (0 = first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub claim: ObjectKey,
    pub request: String,
    pub subrequest: String,
    pub rank: usize,
}

/// A request that would get a higher-ranked subrequest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upgrade {
    pub claim: ObjectKey,
    pub request: String,
    /// The subrequest chosen now, and the better one.
    pub from: String,
    pub to: String,
}

/// A terminating pod whose devices the better placement would use.
#[derive(Clone, Debug)]
pub struct Holder {
    pub pod: ObjectKey,
    /// When kubelet is due to kill it (`metadata.deletionTimestamp`).
    pub deletion: Option<Time>,
}

/// Why a pod should wait rather than take its placement.
#[derive(Clone, Debug)]
pub struct Handoff {
    pub pod: ObjectKey,
    /// The node of the better placement.
    pub node: String,
    pub upgrades: Vec<Upgrade>,
    /// The held devices it would get, `driver/pool/device`.
    pub devices: Vec<String>,
    pub holders: Vec<Holder>,
    /// The holders' claims whose devices it would get, with their holders: once a holder
    /// is gone, its claim still holds the devices until kube-controller-manager releases
    /// it; pass them to [`Engine::handoff_with`] to go on waiting meanwhile.
    pub claims: Vec<(ObjectKey, ObjectKey)>,
}

impl Handoff {
    /// "device gpu.nvidia.com/node-1/gpu-0 (claim ml/x request gpu: a5000 instead of t10)
    /// held by terminating pod ml/old".
    pub fn describe(&self) -> String {
        let upgrades: Vec<String> = self.upgrades.iter().map(Upgrade::describe).collect();
        let holders: Vec<String> = self.holders.iter().map(|h| h.pod.to_string()).collect();
        format!(
            "device {} ({}) held by terminating pod {}",
            self.devices.join(", "),
            upgrades.join("; "),
            holders.join(", ")
        )
    }
}

impl Upgrade {
    pub fn describe(&self) -> String {
        format!(
            "claim {} request {}: {} instead of {}",
            self.claim, self.request, self.to, self.from
        )
    }
}

/// A bound pod on a lower-ranked subrequest that could have a higher-ranked one now.
#[derive(Clone, Debug)]
pub struct Degradation {
    pub pod: ObjectKey,
    pub uid: Option<String>,
    /// Its owner (`Deployment/name`, `StatefulSet/name`, ...; `""` for none).
    pub owner: String,
    pub node: String,
    pub upgrades: Vec<Upgrade>,
    /// Where the better placement is, and the free devices it would use.
    pub preferred_node: String,
    pub devices: Vec<String>,
}

impl Degradation {
    pub fn describe(&self) -> String {
        let upgrades: Vec<String> = self.upgrades.iter().map(Upgrade::describe).collect();
        format!(
            "runs on a lower-ranked device ({}) while {} on node {} is free",
            upgrades.join("; "),
            self.devices.join(", "),
            self.preferred_node
        )
    }
}

/// The firstAvailable choices of an allocation of `claim`.
pub fn choices(
    key: &ObjectKey,
    claim: &ResourceClaim,
    allocation: &AllocationResult,
) -> Vec<Choice> {
    let mut out = Vec::new();
    let results = allocation
        .devices
        .iter()
        .flat_map(|d| d.results.iter().flatten());
    let mut seen = BTreeSet::new();
    for result in results {
        let Some((request, sub)) = result.request.split_once('/') else {
            continue;
        };
        if !seen.insert(request.to_string()) {
            continue;
        }
        let listed = claim
            .spec
            .as_ref()
            .and_then(|s| s.devices.as_ref())
            .and_then(|d| d.requests.as_ref())
            .and_then(|r| r.iter().find(|r| r.name == request))
            .and_then(|r| r.first_available.as_ref());
        if let Some(rank) = listed.and_then(|subs| subs.iter().position(|s| s.name == sub)) {
            out.push(Choice {
                claim: key.clone(),
                request: request.to_string(),
                subrequest: sub.to_string(),
                rank,
            });
        }
    }
    out
}

/// The choices of a placement's new allocations.
fn placement_choices(placement: &Placement) -> Vec<Choice> {
    placement
        .claims
        .iter()
        .filter_map(|d| Some((d, d.allocation.as_ref()?)))
        .flat_map(|(d, a)| choices(&d.key, &d.claim, a))
        .collect()
}

/// The requests where `better` ranks higher than `now`, if it ranks no lower anywhere.
fn upgrades(now: &[Choice], better: &[Choice]) -> Option<Vec<Upgrade>> {
    let mut out = Vec::new();
    for choice in now {
        let other = better
            .iter()
            .find(|b| b.claim == choice.claim && b.request == choice.request)?;
        if other.rank > choice.rank {
            return None;
        }
        if other.rank < choice.rank {
            out.push(Upgrade {
                claim: choice.claim.clone(),
                request: choice.request.clone(),
                from: choice.subrequest.clone(),
                to: other.subrequest.clone(),
            });
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The pod's controller, with a ReplicaSet's Deployment in its place: `Kind/name`.
///
/// A rollout's new ReplicaSet and its first pod come through different watches, so the
/// pod can arrive first: a ReplicaSet not known yet whose name is `<name>-<hash>`, with
/// the pod labelled `pod-template-hash: <hash>`, is taken for Deployment `<name>`'s (the
/// Deployment controller names them so). A CI run saw the replacement of a rollout take
/// the fallback at once because its ReplicaSet was not yet known.
pub fn owner_of(pod: &Pod, state: &ClusterState) -> Option<String> {
    let controller = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))?;
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    if controller.kind == "ReplicaSet" {
        let key = ObjectKey::new(namespace, controller.name.clone());
        if let Some(deployment) = state.workloads.replica_set_owners.get(&key) {
            return Some(deployment.clone());
        }
        if !state.workloads.replica_sets.contains_key(&key)
            && let Some(deployment) = deployment_by_name(pod, &controller.name)
        {
            return Some(format!("Deployment/{deployment}"));
        }
    }
    Some(format!("{}/{}", controller.kind, controller.name))
}

/// `<name>` of a ReplicaSet named `<name>-<hash>` whose pod has `pod-template-hash: <hash>`.
fn deployment_by_name<'a>(pod: &Pod, replica_set: &'a str) -> Option<&'a str> {
    let hash = pod.metadata.labels.as_ref()?.get("pod-template-hash")?;
    replica_set
        .strip_suffix(hash.as_str())?
        .strip_suffix('-')
        .filter(|name| !name.is_empty())
}

/// `driver/pool/device` of each device an allocation holds.
fn device_names(allocation: &AllocationResult) -> impl Iterator<Item = String> + '_ {
    allocation
        .devices
        .iter()
        .flat_map(|d| d.results.iter().flatten())
        .map(|r| format!("{}/{}/{}", r.driver, r.pool, r.device))
}

/// The allocated claims reserved for this pod and nobody else.
fn own_claims(state: &ClusterState, pod: &Pod) -> Vec<(ObjectKey, ResourceClaim)> {
    allocated_claims(state, pod, false)
}

/// The allocated claims a finishing pod leaves: reserved for it alone, or already for
/// nobody (kube-controller-manager takes a finished pod out of `reservedFor` before it
/// deletes or deallocates the claim).
fn claims_left_by(state: &ClusterState, pod: &Pod) -> Vec<(ObjectKey, ResourceClaim)> {
    allocated_claims(state, pod, true)
}

/// The pod's allocated claims reserved for it alone (or, with `unreserved`, for nobody).
fn allocated_claims(
    state: &ClusterState,
    pod: &Pod,
    unreserved: bool,
) -> Vec<(ObjectKey, ResourceClaim)> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let Ok(keys) = claims::of_pod(pod, state) else {
        return Vec::new();
    };
    keys.into_iter()
        .filter_map(|k| Some((k.clone(), ResourceClaim::clone(state.claims.get(&k)?))))
        .filter(|(_, c)| {
            claims::allocation(c).is_some()
                && ((unreserved && claims::reserved_for(c).is_empty())
                    || claims::reserved_only_for(c, name, pod.metadata.uid.as_deref()))
        })
        .collect()
}

/// The claim with its allocation and reservations taken away, as after the pod is gone.
fn released(mut claim: ResourceClaim) -> ResourceClaim {
    if let Some(status) = claim.status.as_mut() {
        status.allocation = None;
        status.reserved_for = None;
    }
    claim
}

impl Engine {
    /// For a placement that uses a lower-ranked firstAvailable subrequest: the better
    /// placement the pod would get from devices that terminating pods (of its owner, for
    /// [`Owners::Same`]) hold, if there is one. `budget` bounds the extra cycle.
    pub fn handoff(
        &self,
        placement: &Placement,
        owners: Owners,
        budget: Duration,
    ) -> Option<Handoff> {
        self.handoff_with(placement, owners, budget, &[])
    }

    /// [`Engine::handoff`] where the `releasing` claims (claim, holder) of an earlier
    /// [`Handoff`] also count as held by a finishing holder while their holder is gone but
    /// they still hold devices.
    pub fn handoff_with(
        &self,
        placement: &Placement,
        owners: Owners,
        budget: Duration,
        releasing: &[(ObjectKey, ObjectKey)],
    ) -> Option<Handoff> {
        let now = placement_choices(placement);
        if now.iter().all(|c| c.rank == 0) {
            return None;
        }
        let state = self.state();
        let pod = state.pods.get(&placement.pod)?;
        let owner = owner_of(pod, state);
        if owners == Owners::Same && owner.is_none() {
            return None;
        }
        let holders: Vec<(&ObjectKey, &Pod)> = state
            .pods
            .iter()
            .map(|(k, p)| (k, &**p))
            .filter(|(_, p)| {
                // Terminating, or finished (kubelet reports the phase before the pod goes).
                (p.metadata.deletion_timestamp.is_some() || is_terminal(p))
                    && bound_node(p).is_some()
                    && (owners == Owners::Any || owner_of(p, state) == owner)
            })
            .collect();
        let mut held_claims: Vec<(&ObjectKey, Vec<(ObjectKey, ResourceClaim)>)> = holders
            .iter()
            .map(|(key, holder)| (*key, claims_left_by(state, holder)))
            .filter(|(_, claims)| !claims.is_empty())
            .collect();
        for (claim_key, holder) in releasing {
            let left_behind = state
                .claims
                .get(claim_key)
                .filter(|c| claims::allocation(c).is_some() && !state.pods.contains_key(holder));
            if let Some(claim) = left_behind {
                held_claims.push((
                    holder,
                    vec![(claim_key.clone(), ResourceClaim::clone(claim))],
                ));
            }
        }
        if held_claims.is_empty() {
            return None;
        }
        // Only now the copy of the state: most placements stop at one of the checks above.
        let mut held: BTreeMap<String, (ObjectKey, ObjectKey)> = BTreeMap::new();
        let mut fork = self.fork();
        for (key, claims) in held_claims {
            fork.remove_pod(key);
            for (claim_key, claim) in claims {
                for device in claims::allocation(&claim)
                    .into_iter()
                    .flat_map(device_names)
                {
                    held.insert(device, (claim_key.clone(), key.clone()));
                }
                fork.upsert_claim(released(claim));
            }
        }
        let Decision::Scheduled(better) = fork.schedule_within(&placement.pod, budget, None) else {
            return None;
        };
        let upgrades = upgrades(&now, &placement_choices(&better))?;
        let devices: Vec<String> = better
            .claims
            .iter()
            .filter_map(|d| d.allocation.as_ref())
            .flat_map(device_names)
            .filter(|d| held.contains_key(d))
            .collect();
        let used: BTreeSet<&(ObjectKey, ObjectKey)> = devices.iter().map(|d| &held[d]).collect();
        let from: BTreeSet<&ObjectKey> = used.iter().map(|(_, holder)| holder).collect();
        if from.is_empty() {
            return None;
        }
        Some(Handoff {
            pod: placement.pod.clone(),
            node: better.node,
            upgrades,
            holders: from
                .into_iter()
                .map(|key| Holder {
                    pod: key.clone(),
                    deletion: state
                        .pods
                        .get(key)
                        .and_then(|p| p.metadata.deletion_timestamp.clone()),
                })
                .collect(),
            claims: used.into_iter().cloned().collect(),
            devices,
        })
    }

    /// Whether any bound pod of ours holds a claim on a lower-ranked subrequest: the cheap
    /// check before [`Engine::degraded`].
    pub fn may_have_degraded(&self) -> bool {
        !self.lower_ranked().is_empty()
    }

    /// Bound pods of ours, not terminating, with claims of their own on a lower-ranked
    /// subrequest, and those choices.
    fn lower_ranked(&self) -> Vec<(ObjectKey, Vec<Choice>)> {
        let state = self.state();
        let mut out = Vec::new();
        for (key, pod) in &state.pods {
            if bound_node(pod).is_none()
                || is_terminal(pod)
                || pod.metadata.deletion_timestamp.is_some()
                || !self.is_ours(pod)
            {
                continue;
            }
            let choices: Vec<Choice> = own_claims(state, pod)
                .iter()
                .flat_map(|(k, c)| {
                    claims::allocation(c)
                        .map(|a| choices(k, c, a))
                        .unwrap_or_default()
                })
                .collect();
            if choices.iter().any(|c| c.rank > 0) {
                out.push((key.clone(), choices));
            }
        }
        out
    }

    /// The bound pods of ours that run on a lower-ranked subrequest while their cycle,
    /// with their own claims released, would now choose a higher-ranked one. Each pod's
    /// cycle has `budget`.
    pub fn degraded(&self, budget: Duration) -> Vec<Degradation> {
        let candidates = self.lower_ranked();
        if candidates.is_empty() {
            return Vec::new();
        }
        let mut fork = self.fork();
        let mut out = Vec::new();
        for (key, now) in candidates {
            let Some(pod) = self.state().pods.get(&key).map(|p| Pod::clone(p)) else {
                continue;
            };
            let own = own_claims(self.state(), &pod);
            let mut unbound = pod.clone();
            if let Some(spec) = unbound.spec.as_mut() {
                spec.node_name = None;
            }
            fork.remove_pod(&key);
            fork.upsert_pod(unbound);
            for (_, claim) in &own {
                fork.upsert_claim(released(claim.clone()));
            }
            let decision = fork.schedule_within(&key, budget, None);
            for (_, claim) in own {
                fork.upsert_claim(claim);
            }
            fork.upsert_pod(pod.clone());
            let Decision::Scheduled(better) = decision else {
                continue;
            };
            let Some(upgrades) = upgrades(&now, &placement_choices(&better)) else {
                continue;
            };
            out.push(Degradation {
                owner: owner_of(&pod, self.state()).unwrap_or_default(),
                uid: pod.metadata.uid.clone(),
                node: bound_node(&pod).unwrap_or_default().to_string(),
                upgrades,
                preferred_node: better.node.clone(),
                devices: better
                    .claims
                    .iter()
                    .filter_map(|d| d.allocation.as_ref())
                    .flat_map(device_names)
                    .collect(),
                pod: key,
            });
        }
        out
    }
}
