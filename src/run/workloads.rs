//! The informers of what selects pods: Services, ReplicationControllers, ReplicaSets and
//! StatefulSets. Only their selectors are kept ([`Workloads`]), for PodTopologySpread's
//! default constraints. A change here only moves scores (the System defaults are
//! ScheduleAnyway), so it retries no pod, as kube-scheduler's PodTopologySpread registers
//! no event for these kinds.

use futures::stream::BoxStream;
use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{ReplicationController, Service};
use kube::Client;
use kube::runtime::watcher::Event;

use dra_engine::state::Workloads;
use dra_engine::{Engine, ObjectKey};

use super::Informers;

/// The kinds watched here (the scheduler schedules once all have synced).
pub(super) const KINDS: [&str; 4] = [
    "Service",
    "ReplicationController",
    "ReplicaSet",
    "StatefulSet",
];

/// A change from one of these informers.
// Each change is applied as soon as it arrives; boxing the large variants buys nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Change {
    Service(Event<Service>),
    ReplicationController(Event<ReplicationController>),
    ReplicaSet(Event<ReplicaSet>),
    StatefulSet(Event<StatefulSet>),
}

/// The watches, as streams of the daemon's changes.
pub(super) fn watches(client: &Client) -> Vec<BoxStream<'static, super::Change>> {
    let wrap = |c: Change| super::Change::Workloads(c);
    vec![
        super::watch(client, KINDS[0], move |e| wrap(Change::Service(e))),
        super::watch(client, KINDS[1], move |e| {
            wrap(Change::ReplicationController(e))
        }),
        super::watch(client, KINDS[2], move |e| wrap(Change::ReplicaSet(e))),
        super::watch(client, KINDS[3], move |e| wrap(Change::StatefulSet(e))),
    ]
}

/// One kind's place in [`Workloads`], by namespace/name.
struct Kind<K> {
    kind: &'static str,
    upsert: fn(&mut Workloads, &K),
    remove: fn(&mut Workloads, &ObjectKey),
    keys: fn(&Workloads) -> Vec<ObjectKey>,
}

const SERVICES: Kind<Service> = Kind {
    kind: "Service",
    upsert: Workloads::upsert_service,
    remove: Workloads::remove_service,
    keys: |w| w.services.keys().cloned().collect(),
};

const REPLICATION_CONTROLLERS: Kind<ReplicationController> = Kind {
    kind: "ReplicationController",
    upsert: Workloads::upsert_replication_controller,
    remove: Workloads::remove_replication_controller,
    keys: |w| w.replication_controllers.keys().cloned().collect(),
};

const REPLICA_SETS: Kind<ReplicaSet> = Kind {
    kind: "ReplicaSet",
    upsert: Workloads::upsert_replica_set,
    remove: Workloads::remove_replica_set,
    keys: |w| w.replica_sets.keys().cloned().collect(),
};

const STATEFUL_SETS: Kind<StatefulSet> = Kind {
    kind: "StatefulSet",
    upsert: Workloads::upsert_stateful_set,
    remove: Workloads::remove_stateful_set,
    keys: |w| w.stateful_sets.keys().cloned().collect(),
};

fn take<K: kube::Resource>(
    workloads: &mut Workloads,
    informers: &mut Informers,
    kind: &Kind<K>,
    event: Event<K>,
) {
    match event {
        Event::Apply(o) | Event::InitApply(o) => {
            informers.seen(kind.kind, ObjectKey::of(o.meta()));
            (kind.upsert)(workloads, &o);
        }
        Event::Delete(o) => (kind.remove)(workloads, &ObjectKey::of(o.meta())),
        Event::Init => informers.listing(kind.kind),
        Event::InitDone => {
            let has = (kind.keys)(workloads);
            for gone in informers.gone(kind.kind, has.into_iter()) {
                (kind.remove)(workloads, &gone);
            }
        }
    }
}

/// Apply a change. It helps no waiting pod (see the module's docs).
pub(super) fn apply(engine: &mut Engine, informers: &mut Informers, change: Change) {
    let workloads = engine.workloads_mut();
    match change {
        Change::Service(e) => take(workloads, informers, &SERVICES, e),
        Change::ReplicationController(e) => take(workloads, informers, &REPLICATION_CONTROLLERS, e),
        Change::ReplicaSet(e) => take(workloads, informers, &REPLICA_SETS, e),
        Change::StatefulSet(e) => take(workloads, informers, &STATEFUL_SETS, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn replica_set(name: &str) -> ReplicaSet {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}}}))
        .unwrap()
    }

    #[test]
    fn a_relist_drops_replica_sets_deleted_while_the_watch_was_down() {
        let mut workloads = Workloads::default();
        let mut informers = Informers::default();
        for rs in ["web-1", "web-2"] {
            take(
                &mut workloads,
                &mut informers,
                &REPLICA_SETS,
                Event::Apply(replica_set(rs)),
            );
        }
        take(&mut workloads, &mut informers, &REPLICA_SETS, Event::Init);
        take(
            &mut workloads,
            &mut informers,
            &REPLICA_SETS,
            Event::InitApply(replica_set("web-2")),
        );
        take(
            &mut workloads,
            &mut informers,
            &REPLICA_SETS,
            Event::InitDone,
        );
        let names: Vec<&str> = workloads
            .replica_sets
            .keys()
            .map(|k| k.name.as_str())
            .collect();
        assert_eq!(names, ["web-2"]);
        assert!(informers.synced.contains("ReplicaSet"));
    }
}
