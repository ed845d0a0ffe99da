//! PodGroups (`scheduling.k8s.io/v1beta1`) in the live scheduler.
//!
//! The PodGroup informer keeps every PodGroup ([`PodGroups`]). When the queue reaches a
//! pod that names a PodGroup in `spec.schedulingGroup`, every waiting member of that group
//! is taken from the queue with it ([`PodGroups::work_for`]) and the engine places them in
//! one decision (`Engine::schedule_group`); the group enters the queue where its first
//! member does, with that member's priority (kube-scheduler requires every member to have
//! the group's priority). A group whose members are not all created yet (fewer than the
//! gang's `minCount` exist) and a pod whose PodGroup does not exist yet wait without an
//! attempt, as kube-scheduler's PreEnqueue keeps them; a new member or the PodGroup
//! arriving wakes them.
//!
//! After each decision the PodGroup's `PodGroupInitiallyScheduled` condition says what
//! happened, as kube-scheduler writes it: `True`/`Scheduled` once placed (and never back
//! to `False` after that), else `False` with reason `Unschedulable` or `SchedulerError`
//! and the engine's message.

use std::collections::HashMap;

use futures::stream::BoxStream;
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::Event;
use kube::{Api, Client};
use serde_json::json;

use dra_engine::group::{names_group, pod_group_name};
use dra_engine::state::bound_node;
use dra_engine::{Engine, ObjectKey};

use super::Informers;
use super::metrics::Metrics;
use super::queue::SchedulingQueue;

/// The kind watched here, where the API server serves it.
pub(super) const KIND: &str = "PodGroup";

/// The condition kube-scheduler keeps on each PodGroup it schedules.
pub const CONDITION: &str = "PodGroupInitiallyScheduled";

/// The PodGroup watch, as a stream of the daemon's changes.
pub(super) fn watch(client: &Client) -> BoxStream<'static, super::Change> {
    super::watch(client, KIND, super::Change::PodGroup)
}

/// Every PodGroup the informer has shown, by namespace/name.
#[derive(Default)]
pub(super) struct PodGroups {
    groups: HashMap<ObjectKey, PodGroup>,
    /// A copy for the scheduling worker (preemption), until the next change.
    shared: Option<std::sync::Arc<Vec<PodGroup>>>,
}

/// What the worker is given: one pod, or a PodGroup with its waiting members.
pub(super) enum Work {
    Pod(ObjectKey),
    Group {
        group: Box<PodGroup>,
        members: Vec<ObjectKey>,
    },
}

impl Work {
    /// The pods this work decides.
    pub(super) fn pods(&self) -> Vec<ObjectKey> {
        match self {
            Work::Pod(key) => vec![key.clone()],
            Work::Group { members, .. } => members.clone(),
        }
    }
}

impl std::fmt::Display for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Work::Pod(key) => write!(f, "pod {key}"),
            Work::Group { group, members } => write!(
                f,
                "PodGroup {} ({} pending members)",
                ObjectKey::of(&group.metadata),
                members.len()
            ),
        }
    }
}

impl PodGroups {
    /// An informer's event; wakes the members of a PodGroup that appeared or changed.
    pub(super) fn apply(
        &mut self,
        engine: &Engine,
        queue: &mut SchedulingQueue,
        informers: &mut Informers,
        event: Event<PodGroup>,
    ) {
        self.shared = None;
        match event {
            Event::Apply(group) | Event::InitApply(group) => {
                let key = ObjectKey::of(&group.metadata);
                informers.seen(KIND, key.clone());
                let spec_changed = self
                    .groups
                    .get(&key)
                    .is_none_or(|old| old.spec != group.spec);
                self.groups.insert(key.clone(), group);
                if spec_changed {
                    for member in members_of(engine, &key) {
                        queue.pod_updated(&member);
                    }
                }
            }
            Event::Delete(group) => {
                self.groups.remove(&ObjectKey::of(&group.metadata));
            }
            Event::Init => informers.listing(KIND),
            Event::InitDone => {
                let has = self.groups.keys().cloned().collect::<Vec<_>>();
                for gone in informers.gone(KIND, has.into_iter()) {
                    self.groups.remove(&gone);
                }
            }
        }
    }

    /// All of them, for one attempt (shared until the next change).
    pub(super) fn all(&mut self) -> std::sync::Arc<Vec<PodGroup>> {
        self.shared
            .get_or_insert_with(|| std::sync::Arc::new(self.groups.values().cloned().collect()))
            .clone()
    }

    /// The PodGroup a pod names, if it names one: `Err` with why it waits when the group
    /// does not exist yet.
    pub(super) fn group_of(
        &self,
        engine: &Engine,
        pod: &ObjectKey,
    ) -> Option<Result<&PodGroup, String>> {
        let name = engine.state().pod(pod).and_then(pod_group_name)?;
        let key = ObjectKey::new(pod.namespace.clone(), name);
        Some(
            self.groups
                .get(&key)
                .ok_or_else(|| format!("waiting for PodGroup {key}, which does not exist yet")),
        )
    }

    /// The work for a pod just taken from the queue: the pod alone, or its PodGroup with
    /// every member that waits in the queue (taken from it too). `Err` with why the pod
    /// (and its group) waits without an attempt.
    pub(super) fn work_for(
        &self,
        engine: &Engine,
        queue: &mut SchedulingQueue,
        in_flight: &dyn Fn(&ObjectKey) -> bool,
        pod: ObjectKey,
    ) -> Result<Work, String> {
        let group = match self.group_of(engine, &pod) {
            None => return Ok(Work::Pod(pod)),
            Some(Err(why)) => return Err(why),
            Some(Ok(group)) => group,
        };
        let key = ObjectKey::of(&group.metadata);
        let waiting: Vec<ObjectKey> = members_of(engine, &key)
            .into_iter()
            .filter(|m| *m == pod || (queue.contains(m) && !in_flight(m)))
            .collect();
        if let Some(min_count) = gang_min_count(group) {
            let exist = waiting.len() + bound_members(engine, &key);
            if exist < min_count {
                return Err(format!(
                    "waiting for the members of PodGroup {key}: minCount is {min_count}, {exist} pods of the group exist"
                ));
            }
        }
        // Members whose claims kube-controller-manager has not made yet: the group waits
        // for them, as a single pod does.
        if let Some(member) = waiting.iter().find(|m| engine.claims_missing(m).is_some()) {
            return Err(format!(
                "waiting for the ResourceClaims of PodGroup {key}'s member {member}"
            ));
        }
        for member in waiting.iter().filter(|m| **m != pod) {
            queue.take(member);
        }
        Ok(Work::Group {
            group: Box::new(group.clone()),
            members: waiting,
        })
    }

    /// Set the PodGroup's `PodGroupInitiallyScheduled` condition, unless it says so
    /// already or was `True` before (kube-scheduler never turns it back).
    pub(super) fn set_condition(
        &self,
        client: &Client,
        metrics: &std::sync::Arc<Metrics>,
        group: &ObjectKey,
        scheduled: Result<(), (&'static str, String)>,
    ) {
        let Some(current) = self.groups.get(group) else {
            return;
        };
        let Some(conditions) = with_condition(current, scheduled) else {
            return;
        };
        let api: Api<PodGroup> = Api::namespaced(client.clone(), &group.namespace);
        let (metrics, group) = (metrics.clone(), group.clone());
        let patch = json!({"status": {"conditions": conditions}});
        tokio::spawn(async move {
            let (params, patch) = (PatchParams::default(), Patch::Merge(patch));
            let write = api.patch_status(&group.name, &params, &patch);
            if let Err(e) = metrics.write("patch", "podgroups/status", write).await {
                tracing::warn!(podgroup = %group, error = %e, "could not write the PodGroup's condition");
            }
        });
    }
}

/// The conditions with ours set (`Ok`: placed; `Err((reason, message))`: not), or `None`
/// when nothing would change.
pub fn with_condition(
    group: &PodGroup,
    scheduled: Result<(), (&'static str, String)>,
) -> Option<Vec<Condition>> {
    let mut conditions = group
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let existing = conditions.iter().position(|c| c.type_ == CONDITION);
    let (status, reason, message) = match scheduled {
        Ok(()) => ("True", "Scheduled", String::new()),
        Err((reason, message)) => ("False", reason, message),
    };
    if let Some(i) = existing {
        let old = &conditions[i];
        if old.status == "True" && status != "True" {
            return None;
        }
        if old.status == status && old.reason == reason && old.message == message {
            return None;
        }
    }
    let transition = existing
        .map(|i| &conditions[i])
        .filter(|old| old.status == status)
        .map(|old| old.last_transition_time.clone())
        .unwrap_or_else(|| Time(k8s_openapi::jiff::Timestamp::now()));
    let condition = Condition {
        type_: CONDITION.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: group.metadata.generation,
        last_transition_time: transition,
    };
    match existing {
        Some(i) => conditions[i] = condition,
        None => conditions.push(condition),
    }
    Some(conditions)
}

/// `schedulingPolicy.gang.minCount`, for a gang.
fn gang_min_count(group: &PodGroup) -> Option<usize> {
    let gang = group.spec.scheduling_policy.gang.as_ref()?;
    Some(usize::try_from(gang.min_count).unwrap_or(0))
}

/// Pending pods of the state that name the group, in name order.
fn members_of(engine: &Engine, group: &ObjectKey) -> Vec<ObjectKey> {
    let mut members: Vec<ObjectKey> = engine
        .state()
        .pods
        .iter()
        .filter(|(_, p)| names_group(p, group) && bound_node(p).is_none())
        .filter(|(_, p)| p.metadata.deletion_timestamp.is_none())
        .map(|(k, _)| k.clone())
        .collect();
    members.sort();
    members
}

/// Members bound (or assumed) and not finished.
fn bound_members(engine: &Engine, group: &ObjectKey) -> usize {
    engine
        .state()
        .pods
        .values()
        .filter(|p| names_group(p, group) && bound_node(p).is_some())
        .filter(|p| !dra_engine::state::is_terminal(p))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::scheduling::v1beta1::PodGroupStatus;

    fn group_with(conditions: Vec<Condition>) -> PodGroup {
        PodGroup {
            status: Some(PodGroupStatus {
                conditions: Some(conditions),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn condition(status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: CONDITION.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: None,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn an_unschedulable_group_gets_the_reason_and_message() {
        let set = with_condition(
            &PodGroup::default(),
            Err(("Unschedulable", "minCount (2) cannot be satisfied".into())),
        )
        .expect("a new condition");
        assert_eq!(set.len(), 1);
        assert_eq!(
            (set[0].status.as_str(), set[0].reason.as_str()),
            ("False", "Unschedulable")
        );
        assert_eq!(set[0].message, "minCount (2) cannot be satisfied");
    }

    #[test]
    fn a_placed_group_never_goes_back_to_false() {
        let placed = group_with(vec![condition("True", "Scheduled", "")]);
        assert!(with_condition(&placed, Err(("Unschedulable", "later".into()))).is_none());
        assert!(
            with_condition(&placed, Ok(())).is_none(),
            "nothing to change"
        );
    }

    #[test]
    fn the_same_message_is_not_written_again_and_a_change_keeps_the_transition_time() {
        let waiting = group_with(vec![condition("False", "Unschedulable", "one short")]);
        assert!(with_condition(&waiting, Err(("Unschedulable", "one short".into()))).is_none());
        let changed = with_condition(&waiting, Err(("Unschedulable", "two short".into())))
            .expect("a new message");
        assert_eq!(changed[0].message, "two short");
        assert_eq!(
            changed[0].last_transition_time,
            Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
        );
        let placed = with_condition(&waiting, Ok(())).expect("now placed");
        assert_eq!(
            (placed[0].status.as_str(), placed[0].reason.as_str()),
            ("True", "Scheduled")
        );
        assert_ne!(
            placed[0].last_transition_time,
            Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
        );
    }
}
