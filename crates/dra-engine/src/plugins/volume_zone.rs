//! VolumeZone, as kube-scheduler v1.37's plugin: a bound PersistentVolume labelled with a
//! zone or region (`topology.kubernetes.io/zone`, `.../region`, or their beta
//! `failure-domain.beta.kubernetes.io` forms; several zones joined by `__`) admits only
//! nodes in one of them. Nodes without any zone or region label are not checked; claims
//! of a `WaitForFirstConsumer` class that are not bound yet are VolumeBinding's to place.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::PersistentVolume;

use super::volume_binding::{claim_class, claim_volume_name};
use crate::framework::{Cycle, Plugin, PluginCycle, Point, Status};
use crate::state::{NodeInfo, ObjectKey};

pub struct VolumeZone;

pub const REASON_CONFLICT: &str = "node(s) had no available volume zone";

const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
const BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
const ZONE: &str = "topology.kubernetes.io/zone";
const REGION: &str = "topology.kubernetes.io/region";
/// The labels looked at, in upstream's order.
const TOPOLOGY_LABELS: [&str; 4] = [BETA_ZONE, BETA_REGION, ZONE, REGION];

/// One topology label of one of the pod's volumes: the node needs one of the values.
struct Topology {
    key: &'static str,
    values: BTreeSet<String>,
}

struct ZoneCycle<'a> {
    cycle: &'a Cycle<'a>,
    topologies: Vec<Topology>,
}

impl Plugin for VolumeZone {
    fn name(&self) -> &'static str {
        "VolumeZone"
    }

    fn points(&self) -> &'static [Point] {
        super::points_of("VolumeZone").unwrap_or_default()
    }

    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(ZoneCycle {
            cycle,
            topologies: Vec::new(),
        })
    }
}

/// The GA label a beta one stands for.
fn ga(key: &str) -> &str {
    match key {
        BETA_ZONE => ZONE,
        BETA_REGION => REGION,
        other => other,
    }
}

/// The volume's zone and region labels. A value that does not parse (an empty zone in the
/// list) is skipped, as upstream does.
fn topologies(pv: &PersistentVolume) -> Vec<Topology> {
    let labels = pv.metadata.labels.as_ref();
    TOPOLOGY_LABELS
        .iter()
        .filter_map(|key| {
            let value = labels?.get(*key)?;
            let zones: Vec<&str> = value.split("__").map(str::trim).collect();
            if zones.iter().any(|z| z.is_empty()) {
                return None;
            }
            Some(Topology {
                key,
                values: zones.into_iter().map(String::from).collect(),
            })
        })
        .collect()
}

impl ZoneCycle<'_> {
    /// The topologies of the pod's bound volumes (`getPVbyPod`), or why the pod cannot be
    /// placed at all.
    fn pod_topologies(&self) -> Result<Vec<Topology>, String> {
        let cx = self.cycle;
        let volumes = &cx.state.volumes;
        let mut found = Vec::new();
        let pod_volumes = cx.pod.spec.as_ref().and_then(|s| s.volumes.as_deref());
        for v in pod_volumes.unwrap_or_default() {
            let Some(source) = &v.persistent_volume_claim else {
                continue;
            };
            let name = source.claim_name.as_str();
            if name.is_empty() {
                return Err("PersistentVolumeClaim had no name".into());
            }
            let key = ObjectKey::new(cx.key.namespace.as_str(), name);
            let Some(pvc) = volumes.claims.get(&key) else {
                return Err(format!("persistentvolumeclaim {name:?} not found"));
            };
            let pv_name = claim_volume_name(pvc);
            if pv_name.is_empty() {
                let class = claim_class(pvc);
                if class.is_empty() {
                    return Err("PersistentVolumeClaim had no pv name and storageClass name".into());
                }
                let Some(sc) = volumes.storage_classes.get(class) else {
                    return Err(format!("storageclass.storage.k8s.io {class:?} not found"));
                };
                match sc.volume_binding_mode.as_deref() {
                    None => {
                        return Err(format!(
                            "VolumeBindingMode not set for StorageClass {class:?}"
                        ));
                    }
                    Some("WaitForFirstConsumer") => continue,
                    Some(_) => return Err("PersistentVolume had no name".into()),
                }
            }
            let Some(pv) = volumes.persistent_volumes.get(pv_name) else {
                return Err(format!("persistentvolume {pv_name:?} not found"));
            };
            found.extend(topologies(pv));
        }
        Ok(found)
    }
}

impl PluginCycle for ZoneCycle<'_> {
    fn pre_filter(&mut self) -> Status {
        match self.pod_topologies() {
            Err(message) => Status::unresolvable(message),
            Ok(t) if t.is_empty() => Status::skip(),
            Ok(t) => {
                self.topologies = t;
                Status::success()
            }
        }
    }

    fn filter(&self, node: &NodeInfo) -> Status {
        let Some(labels) = node.node.metadata.labels.as_ref() else {
            return Status::success();
        };
        if !TOPOLOGY_LABELS.iter().any(|k| labels.contains_key(*k)) {
            return Status::success();
        }
        for t in &self.topologies {
            let value = labels.get(t.key).or_else(|| labels.get(ga(t.key)));
            if value.is_none_or(|v| !t.values.contains(v)) {
                return Status::unresolvable(REASON_CONFLICT);
            }
        }
        Status::success()
    }
}

#[cfg(test)]
mod tests {
    use super::super::volume_binding::fixtures::*;
    use super::*;

    fn zonal(zone_label: &str) -> Vec<Object> {
        vec![
            node("a1").zone("zone-a"),
            node("b1").zone("zone-b"),
            node("bare"),
            pv("disk", "10Gi").claimed_by("data").zone(zone_label),
            pvc("data", "10Gi").bound_to("disk"),
            pod("p").claim("data", "data"),
        ]
    }

    #[test]
    fn a_zonal_volume_admits_only_nodes_of_its_zone_and_nodes_without_zones() {
        let evaluation = engine(zonal("zone-b")).evaluate(&key("p"));
        assert_eq!(evaluation.feasible, ["b1", "bare"]);
        assert_eq!(evaluation.unfit["a1"], REASON_CONFLICT);
    }

    #[test]
    fn a_volume_in_several_zones_admits_each() {
        assert_eq!(
            feasible(&mut engine(zonal("zone-a__zone-b")), "p"),
            ["a1", "b1", "bare"]
        );
    }

    #[test]
    fn a_beta_zone_label_on_the_volume_is_matched_against_the_ga_label_of_the_node() {
        let mut objects = zonal("zone-b");
        objects[3] = pv("disk", "10Gi")
            .claimed_by("data")
            .label(BETA_ZONE, "zone-a");
        assert_eq!(feasible(&mut engine(objects), "p"), ["a1", "bare"]);
    }

    #[test]
    fn an_unbound_claim_of_an_immediate_class_has_no_volume_to_look_at() {
        let mut objects = zonal("zone-b");
        objects[4] = pvc("data", "10Gi").class("fast");
        objects.push(storage_class("fast", "csi.example.com", "Immediate"));
        let mut config = crate::EngineConfig::default();
        config.profile.disable("VolumeBinding");
        let mut engine = crate::Engine::new(config, cluster(objects));
        assert_eq!(
            refused(&mut engine, "p"),
            "0/3 nodes are available: PersistentVolume had no name."
        );
    }
}
