//! NodeVolumeLimits, as kube-scheduler v1.37's CSI limits plugin: a node's CSINode says
//! how many volumes each CSI driver may attach there (`allocatable.count`); the pod's new
//! volumes plus those of the pods already on the node (each volume once) must stay within
//! it. A volume's driver and handle come from its bound PersistentVolume, or, for a claim
//! not bound yet, from its StorageClass's provisioner. In-tree AWS EBS, GCE PD, Azure
//! Disk, Cinder and Portworx volumes count for their CSI drivers on nodes with a CSINode
//! (CSI migration, as upstream). With VolumeLimitScaling (beta, on in 1.37), a driver whose
//! CSIDriver sets `preventPodSchedulingIfMissing` must be on the node's CSINode.
//! VolumeAttachments on the node count as well (so that volumes still attached for pods
//! gone or unknown to the scheduler are not forgotten), each once, as upstream.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Volume};
use k8s_openapi::api::storage::v1::CSINode;

use super::volume_binding::{
    claim_class, claim_volume_name, ephemeral_claim_is_for_pod, pod_claims,
};
use crate::framework::{Cycle, Plugin, PluginCycle, Point, Status};
use crate::state::{NodeInfo, ObjectKey, Volumes};

pub struct NodeVolumeLimits;

pub const REASON_MAX_VOLUME_COUNT_EXCEEDED: &str = "node(s) exceed max volume count";

/// In-tree plugins that migrate to CSI, with their CSI driver.
const MIGRATED: [(&str, &str); 5] = [
    ("kubernetes.io/aws-ebs", "ebs.csi.aws.com"),
    ("kubernetes.io/gce-pd", "pd.csi.storage.gke.io"),
    ("kubernetes.io/azure-disk", "disk.csi.azure.com"),
    ("kubernetes.io/cinder", "cinder.csi.openstack.org"),
    ("kubernetes.io/portworx-volume", "pxd.portworx.com"),
];

fn csi_driver_of_plugin(plugin: &str) -> Option<&'static str> {
    MIGRATED.iter().find(|(p, _)| *p == plugin).map(|(_, d)| *d)
}

/// The in-tree plugin and the disk's identity of an inline or persistent volume source,
/// for the in-tree sources that migrate.
macro_rules! in_tree {
    ($source:expr) => {{
        let s = $source;
        if let Some(v) = &s.aws_elastic_block_store {
            Some(("kubernetes.io/aws-ebs", v.volume_id.clone()))
        } else if let Some(v) = &s.gce_persistent_disk {
            Some(("kubernetes.io/gce-pd", v.pd_name.clone()))
        } else if let Some(v) = &s.azure_disk {
            Some(("kubernetes.io/azure-disk", v.disk_uri.clone()))
        } else if let Some(v) = &s.cinder {
            Some(("kubernetes.io/cinder", v.volume_id.clone()))
        } else if let Some(v) = &s.portworx_volume {
            Some(("kubernetes.io/portworx-volume", v.volume_id.clone()))
        } else {
            None
        }
    }};
}

fn inline_in_tree(v: &Volume) -> Option<(&'static str, String)> {
    in_tree!(v)
}

fn pv_in_tree(pv: &PersistentVolume) -> Option<(&'static str, String)> {
    in_tree!(pv.spec.as_ref()?)
}

struct LimitsCycle<'a> {
    cycle: &'a Cycle<'a>,
}

impl Plugin for NodeVolumeLimits {
    fn name(&self) -> &'static str {
        "NodeVolumeLimits"
    }

    fn points(&self) -> &'static [Point] {
        super::points_of("NodeVolumeLimits").unwrap_or_default()
    }

    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(LimitsCycle { cycle })
    }
}

/// Unique volume name (`driver/handle`) → driver, of one pod's attachable volumes.
type Attachable = HashMap<String, String>;

/// The CSI driver and volume handle a claim's volume has, or will have once provisioned;
/// `None` when it is no CSI volume (or one whose migration is off on the node).
fn csi_volume_of_claim(
    pvc: &PersistentVolumeClaim,
    volumes: &Volumes,
    csi_node: Option<&CSINode>,
) -> Option<(String, String)> {
    let from_class = || {
        let class = claim_class(pvc);
        let provisioner = volumes.storage_classes.get(class)?.provisioner.as_str();
        // Not a real volume handle: one per claim, so that each claim counts once.
        let handle = format!("claim:{}", ObjectKey::of(&pvc.metadata));
        match csi_driver_of_plugin(provisioner) {
            Some(driver) => csi_node.map(|_| (driver.to_string(), handle)),
            None if class.is_empty() => None,
            None => Some((provisioner.to_string(), handle)),
        }
    };
    let name = claim_volume_name(pvc);
    if name.is_empty() {
        return from_class();
    }
    let Some(pv) = volumes.persistent_volumes.get(name) else {
        return from_class();
    };
    if let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) {
        return Some((csi.driver.clone(), csi.volume_handle.clone()));
    }
    let (plugin, id) = pv_in_tree(pv)?;
    csi_node?;
    Some((csi_driver_of_plugin(plugin)?.to_string(), id))
}

impl LimitsCycle<'_> {
    /// The attachable volumes of `pod` on a node with `csi_node` (`filterAttachableVolumes`).
    /// For the pod being scheduled a missing or foreign claim is an error; for pods
    /// already on the node such a claim is passed over.
    fn attachable(
        &self,
        pod: &Pod,
        csi_node: Option<&CSINode>,
        new_pod: bool,
        into: &mut Attachable,
    ) -> Result<(), Status> {
        let volumes = &self.cycle.state.volumes;
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let pod_volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_deref());
        for v in pod_volumes.unwrap_or_default() {
            if v.persistent_volume_claim.is_some() || v.ephemeral.is_some() {
                continue;
            }
            if let Some((plugin, id)) = inline_in_tree(v)
                && csi_node.is_some()
                && let Some(driver) = csi_driver_of_plugin(plugin)
            {
                into.insert(format!("{driver}/{id}"), driver.to_string());
            }
        }
        for claim in pod_claims(pod) {
            if claim.name.is_empty() {
                return Err(Status::error("PersistentVolumeClaim had no name"));
            }
            let key = ObjectKey::new(ns, claim.name.as_str());
            let Some(pvc) = volumes.claims.get(&key) else {
                if new_pod {
                    return Err(Status::unresolvable(format!(
                        "looking up PVC {key}: persistentvolumeclaim {:?} not found",
                        claim.name
                    )));
                }
                continue;
            };
            if claim.ephemeral {
                ephemeral_claim_is_for_pod(pod, pvc).map_err(Status::error)?;
            }
            if let Some((driver, handle)) = csi_volume_of_claim(pvc, volumes, csi_node)
                && !driver.is_empty()
                && !handle.is_empty()
            {
                into.insert(format!("{driver}/{handle}"), driver);
            }
        }
        Ok(())
    }

    /// Whether the driver is on the node, where its CSIDriver asks for that.
    fn driver_installed(&self, driver: &str, csi_node: Option<&CSINode>) -> bool {
        let volumes = &self.cycle.state.volumes;
        let required = volumes
            .csi_drivers
            .get(driver)
            .and_then(|d| d.spec.prevent_pod_scheduling_if_missing)
            .unwrap_or(false);
        !required || csi_node.is_some_and(|n| n.spec.drivers.iter().any(|d| d.name == driver))
    }
}

/// The CSI volumes the node's VolumeAttachments attach, by unique name (`attacher/handle`
/// of the attached PersistentVolume) → attacher. An attachment with no attacher, of no
/// PersistentVolume, of one that does not exist or of one that is no CSI volume is passed
/// over, as upstream's `getNodeVolumeAttachmentInfo`.
fn attached_by_volume_attachments(volumes: &Volumes, node: &str) -> Attachable {
    let mut attached = Attachable::new();
    for attachment in volumes.volume_attachments.on_node(node) {
        let attacher = &attachment.spec.attacher;
        if attacher.is_empty() {
            continue;
        }
        let Some(pv_name) = attachment.spec.source.persistent_volume_name.as_deref() else {
            continue;
        };
        let Some(csi) = volumes
            .persistent_volumes
            .get(pv_name)
            .and_then(|pv| pv.spec.as_ref()?.csi.as_ref())
        else {
            continue;
        };
        attached.insert(
            format!("{attacher}/{}", csi.volume_handle),
            attacher.clone(),
        );
    }
    attached
}

/// Each driver's `allocatable.count` on the node.
fn limits(csi_node: Option<&CSINode>) -> BTreeMap<&str, i64> {
    csi_node
        .into_iter()
        .flat_map(|n| &n.spec.drivers)
        .filter_map(|d| {
            let count = d.allocatable.as_ref()?.count?;
            Some((d.name.as_str(), i64::from(count)))
        })
        .collect()
}

impl PluginCycle for LimitsCycle<'_> {
    fn pre_filter(&mut self) -> Status {
        let pod_volumes = self
            .cycle
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_deref());
        let relevant = pod_volumes.unwrap_or_default().iter().any(|v| {
            v.persistent_volume_claim.is_some()
                || v.ephemeral.is_some()
                || inline_in_tree(v).is_some()
        });
        if relevant {
            Status::success()
        } else {
            Status::skip()
        }
    }

    fn filter(&self, node: &NodeInfo) -> Status {
        let state = self.cycle.state;
        let csi_node = state.volumes.csi_nodes.get(node.name());
        let mut new_volumes = Attachable::new();
        if let Err(status) = self.attachable(self.cycle.pod, csi_node, true, &mut new_volumes) {
            return status;
        }
        if new_volumes.is_empty() {
            return Status::success();
        }
        let mut drivers: Vec<&String> = new_volumes.values().collect();
        drivers.sort();
        drivers.dedup();
        for driver in drivers {
            if !self.driver_installed(driver, csi_node) {
                return Status::unschedulable(format!(
                    "{driver} CSI driver is not installed on the node"
                ));
            }
        }
        let limits = limits(csi_node);
        if limits.is_empty() {
            return Status::success();
        }
        let mut attached = Attachable::new();
        for pod in node.pod_keys.iter().filter_map(|k| state.pods.get(k)) {
            if let Err(status) = self.attachable(pod, csi_node, false, &mut attached) {
                return status;
            }
        }
        let mut attached_count: HashMap<&str, i64> = HashMap::new();
        for (name, driver) in &attached {
            new_volumes.remove(name);
            *attached_count.entry(driver.as_str()).or_default() += 1;
        }
        // A volume that a VolumeAttachment attaches and a pod here uses counts once. One
        // that the new pod uses stays among its new volumes (as upstream: it counts twice).
        let by_attachments = attached_by_volume_attachments(&state.volumes, node.name());
        for (name, driver) in &by_attachments {
            if !attached.contains_key(name) {
                *attached_count.entry(driver.as_str()).or_default() += 1;
            }
        }
        let mut new_count: HashMap<&str, i64> = HashMap::new();
        for driver in new_volumes.values() {
            *new_count.entry(driver.as_str()).or_default() += 1;
        }
        for (driver, count) in new_count {
            if let Some(limit) = limits.get(driver)
                && attached_count.get(driver).copied().unwrap_or(0) + count > *limit
            {
                return Status::unschedulable(REASON_MAX_VOLUME_COUNT_EXCEEDED);
            }
        }
        Status::success()
    }
}

#[cfg(test)]
mod tests {
    use super::super::volume_binding::fixtures::*;
    use super::*;
    use crate::{Engine, EngineConfig};
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    use serde_json::{Value, json};

    const DRIVER: &str = "disk.csi.example.com";

    fn csi_pv(name: &str) -> Object {
        pv(name, "1Gi").set("spec.hostPath", json!(null)).set(
            "spec.csi",
            json!({"driver": DRIVER, "volumeHandle": format!("h-{name}")}),
        )
    }

    /// Two nodes that each attach at most two volumes of the driver; n1 has two already.
    fn cluster_with(new_claims: &[&str]) -> Vec<Object> {
        let mut objects = vec![
            node("n1"),
            node("n2"),
            csi_node("n1", &[(DRIVER, 2)]),
            csi_node("n2", &[(DRIVER, 2)]),
        ];
        for name in ["v1", "v2", "v3"] {
            objects.push(csi_pv(name).claimed_by(name));
            objects.push(pvc(name, "1Gi").bound_to(name));
        }
        objects.push(pod("old").claim("a", "v1").claim("b", "v2").on("n1"));
        let mut new = pod("new");
        for (i, claim) in new_claims.iter().enumerate() {
            new = new.claim(&format!("vol{i}"), claim);
        }
        objects.push(new);
        objects
    }

    #[test]
    fn a_third_volume_of_the_driver_does_not_fit_a_node_that_allows_two() {
        let evaluation = engine(cluster_with(&["v3"])).evaluate(&key("new"));
        assert_eq!(evaluation.feasible, ["n2"]);
        assert_eq!(evaluation.unfit["n1"], REASON_MAX_VOLUME_COUNT_EXCEEDED);
    }

    #[test]
    fn a_volume_already_attached_for_another_pod_counts_once() {
        assert_eq!(
            feasible(&mut engine(cluster_with(&["v1", "v2"])), "new"),
            ["n1", "n2"]
        );
    }

    #[test]
    fn a_claim_to_be_provisioned_counts_for_its_classs_driver() {
        let mut objects = cluster_with(&["fresh"]);
        objects.push(storage_class("csi", DRIVER, "WaitForFirstConsumer"));
        objects.push(pvc("fresh", "1Gi").class("csi"));
        assert_eq!(feasible(&mut engine(objects), "new"), ["n2"]);
    }

    #[test]
    fn an_in_tree_ebs_volume_counts_for_the_ebs_csi_driver_where_a_csinode_exists() {
        let ebs = |id: &str| json!({"name": id, "awsElasticBlockStore": {"volumeID": id}});
        let mut engine = engine(vec![
            node("n1"),
            node("n2"),
            csi_node("n1", &[("ebs.csi.aws.com", 1)]),
            pod("old").volume(ebs("vol-1")).on("n1"),
            pod("old2").volume(ebs("vol-2")).on("n2"),
            pod("new").volume(ebs("vol-3")),
        ]);
        let evaluation = engine.evaluate(&key("new"));
        assert_eq!(evaluation.feasible, ["n2"], "n2 has no CSINode: no limit");
        assert_eq!(evaluation.unfit["n1"], REASON_MAX_VOLUME_COUNT_EXCEEDED);
    }

    /// An attachment by `attacher` of `source` (a VolumeAttachment's `spec.source`) to `node`.
    fn attachment(name: &str, attacher: &str, node: &str, source: Value) -> VolumeAttachment {
        serde_json::from_value(json!({"apiVersion": "storage.k8s.io/v1",
            "kind": "VolumeAttachment", "metadata": {"name": name},
            "spec": {"attacher": attacher, "nodeName": node, "source": source}}))
        .expect("a valid VolumeAttachment")
    }

    /// An attachment of the PersistentVolume `pv` to `node` by the driver.
    fn attached(pv: &str, node: &str) -> VolumeAttachment {
        attachment(
            &format!("va-{pv}-{node}"),
            DRIVER,
            node,
            json!({"persistentVolumeName": pv}),
        )
    }

    fn engine_with(objects: Vec<Object>, attachments: Vec<VolumeAttachment>) -> Engine {
        let mut input = cluster(objects);
        input.volume_attachments = attachments;
        Engine::new(EngineConfig::default(), input)
    }

    /// Nodes n1 and n2 that each attach at most `limit` volumes of the driver, CSI volumes
    /// v1 to v3 with their claims, and the pod `new` using `new_claims`; no pod is bound.
    fn bare_cluster(limit: i32, new_claims: &[&str]) -> Vec<Object> {
        let mut objects = cluster_with(new_claims);
        objects.retain(|o| o.0["metadata"]["name"] != "old");
        objects[2] = csi_node("n1", &[(DRIVER, limit)]);
        objects[3] = csi_node("n2", &[(DRIVER, limit)]);
        objects
    }

    #[test]
    fn a_node_full_only_through_volume_attachments_refuses_a_new_volume() {
        let objects = bare_cluster(2, &["v3"]);
        let mut engine = engine_with(objects, vec![attached("v1", "n1"), attached("v2", "n1")]);
        let evaluation = engine.evaluate(&key("new"));
        assert_eq!(evaluation.feasible, ["n2"]);
        assert_eq!(evaluation.unfit["n1"], REASON_MAX_VOLUME_COUNT_EXCEEDED);

        engine.volumes_mut().volume_attachments.remove("va-v2-n1");
        assert_eq!(
            feasible(&mut engine, "new"),
            ["n1", "n2"],
            "a detached volume frees its place"
        );
    }

    #[test]
    fn an_attachment_of_a_volume_a_pod_on_the_node_uses_counts_once() {
        let mut objects = bare_cluster(2, &["v3"]);
        objects.push(pod("old").claim("a", "v1").on("n1"));
        let mut engine = engine_with(objects, vec![attached("v1", "n1")]);
        assert_eq!(feasible(&mut engine, "new"), ["n1", "n2"]);
    }

    #[test]
    fn an_attached_volume_the_new_pod_uses_counts_as_attached_and_as_new_as_upstream() {
        let objects = bare_cluster(1, &["v1"]);
        let mut engine = engine_with(objects, vec![attached("v1", "n1")]);
        assert_eq!(feasible(&mut engine, "new"), ["n2"]);
    }

    #[test]
    fn attachments_without_attacher_pv_name_existing_pv_or_csi_pv_do_not_count() {
        let mut objects = bare_cluster(1, &["v3"]);
        objects.push(pv("local", "1Gi"));
        let inline =
            json!({"inlineVolumeSpec": {"csi": {"driver": DRIVER, "volumeHandle": "h-x"}}});
        let of = |pv: &str| json!({"persistentVolumeName": pv});
        let attachments = vec![
            attachment("no-attacher", "", "n1", of("v1")),
            attachment("no-pv-name", DRIVER, "n1", inline),
            attachment("missing-pv", DRIVER, "n1", of("gone")),
            attachment("not-csi", DRIVER, "n1", of("local")),
            attached("v2", "n2"),
        ];
        let mut engine = engine_with(objects, attachments);
        let evaluation = engine.evaluate(&key("new"));
        assert_eq!(evaluation.feasible, ["n1"], "only n2's attachment counts");
        assert_eq!(evaluation.unfit["n2"], REASON_MAX_VOLUME_COUNT_EXCEEDED);
    }

    #[test]
    fn a_driver_that_must_be_installed_keeps_pods_off_nodes_without_it() {
        let mut objects = cluster_with(&["v3"]);
        objects.push(csi_driver(DRIVER).set("spec.preventPodSchedulingIfMissing", json!(true)));
        objects[3] = csi_node("n2", &[]);
        let evaluation = engine(objects).evaluate(&key("new"));
        assert_eq!(
            evaluation.unfit["n2"],
            format!("{DRIVER} CSI driver is not installed on the node")
        );
    }
}
