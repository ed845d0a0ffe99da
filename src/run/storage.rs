//! The storage informers: PersistentVolumeClaims, PersistentVolumes, StorageClasses,
//! CSINodes, CSIDrivers and VolumeAttachments, feeding the engine's volume state for the
//! volume plugins.
//! Kept apart from the daemon loop, which only routes their changes here.

use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass, VolumeAttachment};
use kube::Client;
use kube::runtime::watcher::Event;

use dra_engine::queueing_hints::ClusterEvent;
use dra_engine::state::Volumes;
use dra_engine::{Engine, ObjectKey, Placement};

use super::Informers;

/// The storage kinds the scheduler watches (it schedules once all have synced).
pub(super) const KINDS: [&str; 6] = [
    "PersistentVolumeClaim",
    "PersistentVolume",
    "StorageClass",
    "CSINode",
    "CSIDriver",
    "VolumeAttachment",
];

/// A change from one of the storage informers.
// Each change is applied as soon as it arrives; boxing the large variants buys nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Change {
    Claim(Event<PersistentVolumeClaim>),
    Volume(Event<PersistentVolume>),
    Class(Event<StorageClass>),
    CsiNode(Event<CSINode>),
    CsiDriver(Event<CSIDriver>),
    VolumeAttachment(Event<VolumeAttachment>),
}

/// The storage watches, as streams of the daemon's changes.
pub(super) fn watches(client: &Client) -> Vec<BoxStream<'static, super::Change>> {
    let wrap = |c: Change| super::Change::Storage(c);
    vec![
        super::watch(client, KINDS[0], move |e| wrap(Change::Claim(e))),
        super::watch(client, KINDS[1], move |e| wrap(Change::Volume(e))),
        super::watch(client, KINDS[2], move |e| wrap(Change::Class(e))),
        super::watch(client, KINDS[3], move |e| wrap(Change::CsiNode(e))),
        super::watch(client, KINDS[4], move |e| wrap(Change::CsiDriver(e))),
        super::watch(client, KINDS[5], move |e| wrap(Change::VolumeAttachment(e))),
    ]
}

/// One kind's place in [`Volumes`]: objects by key (namespace/name, or "" and the name).
struct Kind<K> {
    kind: &'static str,
    key: fn(&K) -> ObjectKey,
    insert: fn(&mut Volumes, K),
    remove: fn(&mut Volumes, &ObjectKey),
    keys: fn(&Volumes) -> Vec<ObjectKey>,
}

fn cluster_key(meta: &kube::api::ObjectMeta) -> ObjectKey {
    ObjectKey::new("", meta.name.clone().unwrap_or_default())
}

const CLAIMS: Kind<PersistentVolumeClaim> = Kind {
    kind: "PersistentVolumeClaim",
    key: |o| ObjectKey::of(&o.metadata),
    insert: |v, o| {
        v.claims.insert(ObjectKey::of(&o.metadata), o);
    },
    remove: |v, k| {
        v.claims.remove(k);
    },
    keys: |v| v.claims.keys().cloned().collect(),
};

const VOLUMES: Kind<PersistentVolume> = Kind {
    kind: "PersistentVolume",
    key: |o| cluster_key(&o.metadata),
    insert: |v, o| {
        v.persistent_volumes
            .insert(cluster_key(&o.metadata).name, o);
    },
    remove: |v, k| {
        v.persistent_volumes.remove(&k.name);
    },
    keys: |v| {
        v.persistent_volumes
            .keys()
            .map(|n| ObjectKey::new("", n.as_str()))
            .collect()
    },
};

const CLASSES: Kind<StorageClass> = Kind {
    kind: "StorageClass",
    key: |o| cluster_key(&o.metadata),
    insert: |v, o| {
        v.storage_classes.insert(cluster_key(&o.metadata).name, o);
    },
    remove: |v, k| {
        v.storage_classes.remove(&k.name);
    },
    keys: |v| {
        v.storage_classes
            .keys()
            .map(|n| ObjectKey::new("", n.as_str()))
            .collect()
    },
};

const CSI_NODES: Kind<CSINode> = Kind {
    kind: "CSINode",
    key: |o| cluster_key(&o.metadata),
    insert: |v, o| {
        v.csi_nodes.insert(cluster_key(&o.metadata).name, o);
    },
    remove: |v, k| {
        v.csi_nodes.remove(&k.name);
    },
    keys: |v| {
        v.csi_nodes
            .keys()
            .map(|n| ObjectKey::new("", n.as_str()))
            .collect()
    },
};

const CSI_DRIVERS: Kind<CSIDriver> = Kind {
    kind: "CSIDriver",
    key: |o| cluster_key(&o.metadata),
    insert: |v, o| {
        v.csi_drivers.insert(cluster_key(&o.metadata).name, o);
    },
    remove: |v, k| {
        v.csi_drivers.remove(&k.name);
    },
    keys: |v| {
        v.csi_drivers
            .keys()
            .map(|n| ObjectKey::new("", n.as_str()))
            .collect()
    },
};

const VOLUME_ATTACHMENTS: Kind<VolumeAttachment> = Kind {
    kind: "VolumeAttachment",
    key: |o| cluster_key(&o.metadata),
    insert: |v, o| v.volume_attachments.upsert(o),
    remove: |v, k| {
        v.volume_attachments.remove(&k.name);
    },
    keys: |v| {
        v.volume_attachments
            .names()
            .map(|n| ObjectKey::new("", n.as_str()))
            .collect()
    },
};

/// Apply one kind's event; returns whether objects went away (a deletion, or objects
/// missing from a fresh listing).
fn take<K>(
    engine: &mut Engine,
    informers: &mut Informers,
    kind: &Kind<K>,
    event: Event<K>,
) -> bool {
    let volumes = engine.volumes_mut();
    match event {
        Event::Apply(o) | Event::InitApply(o) => {
            informers.seen(kind.kind, (kind.key)(&o));
            (kind.insert)(volumes, o);
            false
        }
        Event::Delete(o) => {
            (kind.remove)(volumes, &(kind.key)(&o));
            true
        }
        Event::Init => {
            informers.listing(kind.kind);
            false
        }
        Event::InitDone => {
            let has = (kind.keys)(volumes);
            let mut removed = false;
            for gone in informers.gone(kind.kind, has.into_iter()) {
                (kind.remove)(volumes, &gone);
                removed = true;
            }
            removed
        }
    }
}

/// Apply a storage change; returns the cluster event it amounts to, if any may help a pod
/// that waits. The API server's copies replace what was assumed for bindings still in
/// flight, so those are asserted again. Any change of the other kinds may help a pod that
/// waits (a volume freed or created, a claim bound, a class or limit changed); of
/// VolumeAttachments only one that goes away does (a node attaches fewer volumes), as
/// kube-scheduler's NodeVolumeLimits registers only their deletion.
pub(super) fn apply<'a>(
    engine: &mut Engine,
    informers: &mut Informers,
    in_flight: impl Iterator<Item = &'a Placement>,
    change: Change,
) -> Option<ClusterEvent> {
    let volumes_changed = matches!(change, Change::Claim(_) | Change::Volume(_));
    let event = match change {
        Change::Claim(e) => {
            take(engine, informers, &CLAIMS, e);
            ClusterEvent::PersistentVolumeClaimChanged
        }
        Change::Volume(e) => {
            take(engine, informers, &VOLUMES, e);
            ClusterEvent::PersistentVolumeChanged
        }
        Change::Class(e) => {
            take(engine, informers, &CLASSES, e);
            ClusterEvent::StorageClassChanged
        }
        Change::CsiNode(e) => {
            take(engine, informers, &CSI_NODES, e);
            ClusterEvent::CsiNodeChanged
        }
        Change::CsiDriver(e) => {
            take(engine, informers, &CSI_DRIVERS, e);
            ClusterEvent::CsiDriverChanged
        }
        Change::VolumeAttachment(e) => {
            let removed = take(engine, informers, &VOLUME_ATTACHMENTS, e);
            return removed.then_some(ClusterEvent::VolumeAttachmentDeleted);
        }
    };
    if volumes_changed {
        for placement in in_flight.filter(|p| !p.volumes.is_empty()) {
            engine.reassert(placement);
        }
    }
    Some(event)
}
