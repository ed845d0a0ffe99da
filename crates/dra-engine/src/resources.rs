//! What a pod asks of a node's allocatable resources, computed as kube-scheduler's
//! NodeResourcesFit plugin does: regular containers add up; an init container runs alone
//! (beside the sidecars started before it), so the pod needs the larger of the two; sidecars
//! (init containers with `restartPolicy: Always`) keep running; pod overhead is added on top;
//! pod-level `spec.resources` replaces the container sum where it is set; what the pod's
//! devices map of the node's resources (DRANodeAllocatableResources) is added to the
//! container sum.

use std::collections::BTreeMap;

use dra_cel::Quantity;
use k8s_openapi::api::core::v1::{Container, NodeAllocatableResourceClaimStatus, Pod};

/// Resource name → amount, in exact quantities.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceList(pub BTreeMap<String, Quantity>);

impl ResourceList {
    pub fn get(&self, name: &str) -> Quantity {
        self.0.get(name).copied().unwrap_or_default()
    }

    pub fn add(&mut self, other: &ResourceList) {
        for (name, q) in &other.0 {
            let entry = self.0.entry(name.clone()).or_default();
            *entry = *entry + *q;
        }
    }

    pub fn sub(&mut self, other: &ResourceList) {
        for (name, q) in &other.0 {
            let entry = self.0.entry(name.clone()).or_default();
            *entry = *entry - *q;
        }
    }

    /// Per resource, the larger of the two.
    fn max_with(&mut self, other: &ResourceList) {
        for (name, q) in &other.0 {
            let entry = self.0.entry(name.clone()).or_default();
            if *q > *entry {
                *entry = *q;
            }
        }
    }

    /// Parse a Kubernetes resource map; a malformed quantity is reported with its name.
    pub fn parse(
        map: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    ) -> Result<ResourceList, String> {
        let mut out = ResourceList::default();
        for (name, q) in map.into_iter().flatten() {
            let parsed: Quantity =
                q.0.parse()
                    .map_err(|e| format!("resource {name}: quantity {:?}: {e}", q.0))?;
            out.0.insert(name.clone(), parsed);
        }
        Ok(out)
    }
}

fn container_requests(c: &Container) -> Result<ResourceList, String> {
    let resources = c.resources.as_ref();
    let mut requests = ResourceList::parse(resources.and_then(|r| r.requests.as_ref()))?;
    // A limit without a request defaults the request (API defaulting does this for pods;
    // manifests read by `simulate` may not have been defaulted).
    let limits = ResourceList::parse(resources.and_then(|r| r.limits.as_ref()))?;
    for (name, q) in limits.0 {
        requests.0.entry(name).or_insert(q);
    }
    Ok(requests)
}

/// The resources `pod` needs on its node, as kube-scheduler counts them, with what the
/// devices of its claims map (`status.nodeAllocatableResourceClaimStatuses`,
/// DRANodeAllocatableResources; the API server drops the field while the gate is off).
pub fn pod_requests(pod: &Pod) -> Result<ResourceList, String> {
    pod_requests_with(pod, None)
}

/// [`pod_requests`] with `statuses` in place of the pod's own node allocatable resource
/// claim statuses (those a placement is about to give it).
pub fn pod_requests_with(
    pod: &Pod,
    statuses: Option<&[NodeAllocatableResourceClaimStatus]>,
) -> Result<ResourceList, String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(ResourceList::default());
    };
    let statuses = statuses.or_else(|| {
        pod.status
            .as_ref()
            .and_then(|s| s.node_allocatable_resource_claim_statuses.as_deref())
    });
    let mut total = containers_with_dra(pod, statuses)?;
    if let Some(pod_level) = spec.resources.as_ref() {
        let pod_requests = ResourceList::parse(pod_level.requests.as_ref())?;
        let pod_limits = ResourceList::parse(pod_level.limits.as_ref())?;
        for (name, q) in pod_limits.0.iter() {
            if (name == "cpu" || name == "memory") && !pod_requests.0.contains_key(name) {
                total.0.insert(name.clone(), *q);
            }
        }
        for (name, q) in pod_requests.0 {
            if name == "cpu" || name == "memory" {
                total.0.insert(name, q);
            }
        }
    }
    let overhead = ResourceList::parse(spec.overhead.as_ref())?;
    total.add(&overhead);
    Ok(total)
}

/// The pod's containers' requests (regular, sidecar and the init peak) with what its devices
/// map (`statuses`), before pod-level resources and pod overhead: upstream's
/// `AggregateContainerRequests`.
pub fn containers_with_dra(
    pod: &Pod,
    statuses: Option<&[NodeAllocatableResourceClaimStatus]>,
) -> Result<ResourceList, String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(ResourceList::default());
    };
    let mut total = ResourceList::default();
    for c in &spec.containers {
        total.add(&container_requests(c)?);
    }
    let mut sidecars = ResourceList::default();
    let mut init_peak = ResourceList::default();
    for c in spec.init_containers.iter().flatten() {
        let requests = container_requests(c)?;
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars.add(&requests);
            init_peak.max_with(&sidecars);
        } else {
            let mut running = sidecars.clone();
            running.add(&requests);
            init_peak.max_with(&running);
        }
    }
    total.add(&sidecars);
    total.max_with(&init_peak);
    if let Some(statuses) = statuses.filter(|s| !s.is_empty()) {
        total.add(&crate::node_allocatable::added_requests(statuses)?);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    fn q(s: &str) -> Quantity {
        s.parse().unwrap()
    }

    #[test]
    fn containers_add_up_and_limits_default_requests() {
        let p = pod(json!({"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
            {"name": "b", "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": "1"}}},
        ]}));
        let r = pod_requests(&p).unwrap();
        assert_eq!(r.get("cpu"), q("1500m"));
        assert_eq!(r.get("memory"), q("1Gi"));
        assert_eq!(r.get("nvidia.com/gpu"), q("1"));
    }

    #[test]
    fn init_container_peak_and_sidecars_and_overhead() {
        let p = pod(json!({
            "initContainers": [
                {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "200m"}}},
                {"name": "setup", "resources": {"requests": {"cpu": "2"}}},
            ],
            "containers": [{"name": "main", "resources": {"requests": {"cpu": "1"}}}],
            "overhead": {"cpu": "100m"},
        }));
        // setup runs beside the sidecar: 2.2 > 1 + 0.2; plus 0.1 overhead.
        assert_eq!(pod_requests(&p).unwrap().get("cpu"), q("2300m"));
    }

    #[test]
    fn malformed_quantity_names_the_resource() {
        let p = pod(json!({"containers": [
            {"name": "a", "resources": {"requests": {"memory": "12 GB"}}}]}));
        let err = pod_requests(&p).unwrap_err();
        assert!(
            err.contains("resource memory") && err.contains("12 GB"),
            "{err}"
        );
    }
}
