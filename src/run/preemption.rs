//! Preemption in the live scheduler: the PodDisruptionBudget informer, and carrying out
//! what `Engine::preempt` decided, in kube-scheduler's order (`prepareCandidate`):
//!
//! 1. the preemptor's `status.nominatedNodeName` names the node (so that a restarted or
//!    standby scheduler, and the user, see where it is going);
//! 2. each victim gets the `DisruptionTarget` condition (reason `PreemptionByScheduler`),
//!    a `Preempted` event, and is deleted with its own grace period;
//! 3. the preemptor's FailedScheduling event says which pods are preempted where, for which
//!    devices (the engine's message).
//!
//! Meanwhile the engine holds the freed devices for the preemptor (`Engine::nominate`):
//! pods of lower or equal priority cannot take them while the victims terminate. Once they
//! are gone and kube-controller-manager has given their claims back, the informers' events
//! retry the preemptor, which takes the held devices.

use std::collections::HashMap;
use std::sync::Arc;

use dra_engine::{GroupPreemption, ObjectKey, Preemption, Victim};
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::runtime::watcher::Event;
use kube::{Api, Client};

use super::Informers;
use super::events::Recorder;
use super::metrics::Metrics;

/// The kind watched here.
pub(super) const KIND: &str = "PodDisruptionBudget";

/// The PodDisruptionBudget watch, as a stream of the daemon's changes.
pub(super) fn watch(client: &Client) -> BoxStream<'static, super::Change> {
    super::watch(client, KIND, super::Change::Pdb)
}

/// Every PodDisruptionBudget, and a shared copy for the scheduling worker.
#[derive(Default)]
pub(super) struct Budgets {
    pdbs: HashMap<ObjectKey, PodDisruptionBudget>,
    shared: Option<Arc<Vec<PodDisruptionBudget>>>,
}

impl Budgets {
    pub(super) fn apply(&mut self, informers: &mut Informers, event: Event<PodDisruptionBudget>) {
        self.shared = None;
        match event {
            Event::Apply(pdb) | Event::InitApply(pdb) => {
                let key = ObjectKey::of(&pdb.metadata);
                informers.seen(KIND, key.clone());
                self.pdbs.insert(key, pdb);
            }
            Event::Delete(pdb) => {
                self.pdbs.remove(&ObjectKey::of(&pdb.metadata));
            }
            Event::Init => informers.listing(KIND),
            Event::InitDone => {
                let has: Vec<ObjectKey> = self.pdbs.keys().cloned().collect();
                for gone in informers.gone(KIND, has.into_iter()) {
                    self.pdbs.remove(&gone);
                }
            }
        }
    }

    /// All of them, for one attempt (shared until the next change).
    pub(super) fn all(&mut self) -> Arc<Vec<PodDisruptionBudget>> {
        self.shared
            .get_or_insert_with(|| Arc::new(self.pdbs.values().cloned().collect()))
            .clone()
    }
}

/// Carry out a preemption: the preemptor's nominated node, then each victim's condition,
/// event and deletion. Failures are logged and the rest goes on: a victim that cannot be
/// deleted keeps its devices, and the preemptor is tried again when anything changes.
pub(super) async fn carry_out(
    client: Client,
    metrics: Arc<Metrics>,
    recorder: Arc<Recorder>,
    scheduler: String,
    preemption: Preemption,
) {
    nominate(&client, &metrics, &preemption.pod, &preemption.node).await;
    let by = format!("pod {}", preemption.pod);
    evict(
        &client,
        &metrics,
        &recorder,
        &scheduler,
        &by,
        &preemption.victims,
    )
    .await;
}

/// A PodGroup's preemption: every member's nominated node, then each victim once.
pub(super) async fn carry_out_group(
    client: Client,
    metrics: Arc<Metrics>,
    recorder: Arc<Recorder>,
    scheduler: String,
    preemption: GroupPreemption,
) {
    for member in &preemption.preemptions {
        nominate(&client, &metrics, &member.pod, &member.node).await;
    }
    let by = format!("PodGroup {}", preemption.group);
    evict(
        &client,
        &metrics,
        &recorder,
        &scheduler,
        &by,
        &preemption.victims,
    )
    .await;
}

/// The preemptor's `status.nominatedNodeName`.
async fn nominate(client: &Client, metrics: &Metrics, pod: &ObjectKey, node: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let nominated = serde_json::json!({"status": {"nominatedNodeName": node}});
    if let Err(e) = metrics
        .write(
            "patch",
            "pods/status",
            pods.patch_status(&pod.name, &PatchParams::default(), &Patch::Merge(nominated)),
        )
        .await
    {
        tracing::warn!(%pod, error = %e, "could not record the nominated node");
    }
}

/// Each victim: the DisruptionTarget condition, a Preempted event, the deletion.
async fn evict(
    client: &Client,
    metrics: &Metrics,
    recorder: &Recorder,
    scheduler: &str,
    by: &str,
    victims: &[Victim],
) {
    for victim in victims {
        let api: Api<Pod> = Api::namespaced(client.clone(), &victim.pod.namespace);
        let condition = serde_json::json!({"status": {"conditions": [{
            "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
            "message": format!("{scheduler}: preempting to accommodate a higher priority pod"),
        }]}});
        if let Err(e) = metrics
            .write(
                "patch",
                "pods/status",
                api.patch_status(
                    &victim.pod.name,
                    &PatchParams::default(),
                    &Patch::Strategic(condition),
                ),
            )
            .await
        {
            tracing::warn!(victim = %victim.pod, error = %e, "could not mark the victim");
        }
        let event = KubeEvent {
            type_: EventType::Normal,
            reason: "Preempted".into(),
            note: Some(format!("Preempted by {by} on node {}", victim.node)),
            action: "Preempting".into(),
            secondary: None,
        };
        let reference = super::pod_reference(&victim.pod, victim.uid.as_deref());
        if let Err(e) = metrics
            .write_unthrottled("create", "events", recorder.publish(&event, &reference))
            .await
        {
            tracing::warn!(victim = %victim.pod, error = %e, "could not publish the Preempted event");
        }
        // The pod's own grace period; only this very pod (a new pod of the same name is
        // not a victim).
        let params = DeleteParams {
            preconditions: victim.uid.clone().map(|uid| kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match metrics
            .write("delete", "pods", api.delete(&victim.pod.name, &params))
            .await
        {
            Ok(_) => {
                tracing::info!(victim = %victim.pod, node = %victim.node, preemptor = %by, "preempted")
            }
            Err(e) => {
                tracing::warn!(victim = %victim.pod, error = %e, "could not delete the victim")
            }
        }
    }
}
