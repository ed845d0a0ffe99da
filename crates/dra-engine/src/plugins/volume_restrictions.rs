//! VolumeRestrictions, as kube-scheduler v1.37's plugin:
//! - a PersistentVolumeClaim with the `ReadWriteOncePod` access mode that a pod bound to
//!   any node already uses keeps the pod out of every node;
//! - an inline GCE PD, AWS EBS, RBD or iSCSI volume may not be mounted beside the same disk
//!   of a pod already on the node (GCE PD, iSCSI and RBD may, when both are read-only).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Pod, Volume};

use crate::framework::{Cycle, Plugin, PluginCycle, Point, Status};
use crate::state::{NodeInfo, ObjectKey, bound_node, is_terminal};

pub struct VolumeRestrictions;

pub const REASON_DISK_CONFLICT: &str = "node(s) had no available disk";
pub const REASON_READ_WRITE_ONCE_POD_CONFLICT: &str = "node(s) unavailable due to PersistentVolumeClaim with ReadWriteOncePod access mode already in-use by another pod";

struct RestrictionsCycle<'a> {
    cycle: &'a Cycle<'a>,
    /// The pod has inline volumes that may conflict with those of pods on the node.
    inline: bool,
    /// A ReadWriteOncePod claim of the pod is in use by a bound pod.
    rwop_in_use: bool,
}

impl Plugin for VolumeRestrictions {
    fn name(&self) -> &'static str {
        "VolumeRestrictions"
    }

    fn points(&self) -> &'static [Point] {
        super::points_of("VolumeRestrictions").unwrap_or_default()
    }

    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(RestrictionsCycle {
            cycle,
            inline: false,
            rwop_in_use: false,
        })
    }
}

fn volumes(pod: &Pod) -> &[Volume] {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default()
}

fn needs_check(v: &Volume) -> bool {
    v.gce_persistent_disk.is_some()
        || v.aws_elastic_block_store.is_some()
        || v.rbd.is_some()
        || v.iscsi.is_some()
}

/// Whether mounting `volume` conflicts with a volume of `existing`.
fn conflicts(volume: &Volume, existing: &Pod) -> bool {
    let ro = |r: Option<bool>| r.unwrap_or(false);
    volumes(existing).iter().any(|e| {
        if let (Some(a), Some(b)) = (&volume.gce_persistent_disk, &e.gce_persistent_disk)
            && a.pd_name == b.pd_name
            && !(ro(a.read_only) && ro(b.read_only))
        {
            return true;
        }
        if let (Some(a), Some(b)) = (&volume.aws_elastic_block_store, &e.aws_elastic_block_store)
            && a.volume_id == b.volume_id
        {
            return true;
        }
        if let (Some(a), Some(b)) = (&volume.iscsi, &e.iscsi)
            && a.iqn == b.iqn
            && !(ro(a.read_only) && ro(b.read_only))
        {
            return true;
        }
        if let (Some(a), Some(b)) = (&volume.rbd, &e.rbd) {
            let overlap = a.monitors.iter().any(|m| b.monitors.contains(m));
            // The API server defaults the pool to "rbd".
            let pool = |p: &Option<String>| p.clone().unwrap_or_else(|| "rbd".into());
            if overlap
                && pool(&a.pool) == pool(&b.pool)
                && a.image == b.image
                && !(ro(a.read_only) && ro(b.read_only))
            {
                return true;
            }
        }
        false
    })
}

impl RestrictionsCycle<'_> {
    /// The pod's claims (by name) with the ReadWriteOncePod access mode; `Err` names a
    /// claim that does not exist.
    fn read_write_once_pod_claims(&self) -> Result<BTreeSet<&str>, String> {
        let cx = self.cycle;
        let ns = cx.key.namespace.as_str();
        let mut names = BTreeSet::new();
        for v in volumes(cx.pod) {
            let Some(source) = &v.persistent_volume_claim else {
                continue;
            };
            let name = source.claim_name.as_str();
            let Some(pvc) = cx.state.volumes.claims.get(&ObjectKey::new(ns, name)) else {
                return Err(format!("persistentvolumeclaim {name:?} not found"));
            };
            let modes = pvc.spec.as_ref().and_then(|s| s.access_modes.as_deref());
            if modes
                .unwrap_or_default()
                .iter()
                .any(|m| m == "ReadWriteOncePod")
            {
                names.insert(name);
            }
        }
        Ok(names)
    }

    /// Whether a pod bound to a node (not terminal) names one of these claims.
    fn in_use(&self, names: &BTreeSet<&str>) -> bool {
        let cx = self.cycle;
        let ns = cx.key.namespace.as_str();
        cx.state
            .nodes
            .values()
            .flat_map(|n| &n.pod_keys)
            .any(|key| {
                key.namespace == ns
                    && cx.state.pods.get(key).is_some_and(|p| {
                        bound_node(p).is_some()
                            && !is_terminal(p)
                            && volumes(p).iter().any(|v| {
                                v.persistent_volume_claim
                                    .as_ref()
                                    .is_some_and(|c| names.contains(c.claim_name.as_str()))
                            })
                    })
            })
    }
}

impl PluginCycle for RestrictionsCycle<'_> {
    fn pre_filter(&mut self) -> Status {
        self.inline = volumes(self.cycle.pod).iter().any(needs_check);
        let names = match self.read_write_once_pod_claims() {
            Ok(names) => names,
            Err(message) => return Status::unresolvable(message),
        };
        self.rwop_in_use = !names.is_empty() && self.in_use(&names);
        if !self.inline && !self.rwop_in_use {
            return Status::skip();
        }
        Status::success()
    }

    fn filter(&self, node: &NodeInfo) -> Status {
        let state = self.cycle.state;
        if self.inline {
            for v in volumes(self.cycle.pod).iter().filter(|v| needs_check(v)) {
                let existing = node.pod_keys.iter().filter_map(|k| state.pods.get(k));
                if existing.into_iter().any(|p| conflicts(v, p)) {
                    return Status::unschedulable(REASON_DISK_CONFLICT);
                }
            }
        }
        if self.rwop_in_use {
            return Status::unschedulable(REASON_READ_WRITE_ONCE_POD_CONFLICT);
        }
        Status::success()
    }
}

#[cfg(test)]
mod tests {
    use super::super::volume_binding::fixtures::*;
    use super::*;
    use serde_json::json;

    fn gce_pd(disk: &str, read_only: bool) -> serde_json::Value {
        json!({"name": "disk", "gcePersistentDisk": {"pdName": disk, "readOnly": read_only}})
    }

    #[test]
    fn a_read_write_once_pod_claim_in_use_keeps_a_second_pod_off_every_node() {
        let mut engine = engine(vec![
            node("n1"),
            node("n2"),
            pvc("solo", "1Gi")
                .modes(&["ReadWriteOncePod"])
                .bound_to("pv1"),
            pv("pv1", "1Gi").claimed_by("solo"),
            pod("first").claim("data", "solo").on("n1"),
            pod("second").claim("data", "solo"),
        ]);
        assert_eq!(
            refused(&mut engine, "second"),
            format!("0/2 nodes are available: 2 {REASON_READ_WRITE_ONCE_POD_CONFLICT}.")
        );
        engine.remove_pod(&key("first"));
        assert_eq!(feasible(&mut engine, "second"), ["n1", "n2"]);
    }

    #[test]
    fn the_same_gce_disk_is_mounted_twice_on_a_node_only_read_only() {
        let objects = |existing: bool, new: bool| {
            vec![
                node("n1"),
                node("n2"),
                pod("old").volume(gce_pd("pd-1", existing)).on("n1"),
                pod("new").volume(gce_pd("pd-1", new)),
            ]
        };
        let evaluation = engine(objects(false, true)).evaluate(&key("new"));
        assert_eq!(evaluation.feasible, ["n2"]);
        assert_eq!(evaluation.unfit["n1"], REASON_DISK_CONFLICT);
        assert_eq!(
            feasible(&mut engine(objects(true, true)), "new"),
            ["n1", "n2"]
        );
    }

    #[test]
    fn the_same_ebs_volume_conflicts_even_read_only() {
        let ebs = json!({"name": "disk", "awsElasticBlockStore": {"volumeID": "vol-1", "readOnly": true}});
        let mut engine = engine(vec![
            node("n1"),
            pod("old").volume(ebs.clone()).on("n1"),
            pod("new").volume(ebs),
        ]);
        assert_eq!(
            refused(&mut engine, "new"),
            format!("0/1 nodes are available: 1 {REASON_DISK_CONFLICT}.")
        );
    }
}
