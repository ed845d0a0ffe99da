//! Until a plugin is complete, a pod that uses what it checks is refused with the field
//! named: never placed while a constraint is ignored.

use k8s_openapi::api::core::v1::Pod;

use crate::framework::Status;

fn unsupported(field: &str) -> Status {
    Status::unresolvable(format!("{field} is not supported by dra-scheduler yet"))
}

pub fn reject_inter_pod_affinity(pod: &Pod) -> Status {
    let affinity = pod.spec.as_ref().and_then(|s| s.affinity.as_ref());
    if affinity.is_some_and(|a| a.pod_affinity.is_some()) {
        return unsupported("spec.affinity.podAffinity");
    }
    if affinity.is_some_and(|a| a.pod_anti_affinity.is_some()) {
        return unsupported("spec.affinity.podAntiAffinity");
    }
    Status::skip()
}

pub fn reject_pod_topology_spread(pod: &Pod) -> Status {
    let spec = pod.spec.as_ref();
    if spec.is_some_and(|s| {
        s.topology_spread_constraints
            .as_ref()
            .is_some_and(|c| !c.is_empty())
    }) {
        return unsupported("spec.topologySpreadConstraints");
    }
    Status::skip()
}

pub fn reject_node_resources_balanced_allocation(_pod: &Pod) -> Status {
    Status::skip()
}

pub fn reject_volumes(pod: &Pod) -> Status {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    for (i, v) in volumes.into_iter().flatten().enumerate() {
        if v.persistent_volume_claim.is_some() {
            return unsupported(&format!("spec.volumes[{i}].persistentVolumeClaim"));
        }
        if v.ephemeral.is_some() {
            return unsupported(&format!("spec.volumes[{i}].ephemeral"));
        }
    }
    Status::skip()
}
