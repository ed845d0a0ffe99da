//! Extended resources backed by DRA (DRAExtendedResource): a pod that asks for
//! `nvidia.com/gpu: 1` in its container limits is served by a DeviceClass whose
//! `extendedResourceName` is `nvidia.com/gpu` (or by the implicit name
//! `deviceclass.resource.kubernetes.io/<class>`), on nodes that have no device-plugin
//! capacity for that resource, through a claim made for the pod like Kubernetes makes it.

use k8s_openapi::api::core::v1::{ContainerExtendedResourceRequest, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClass, DeviceRequest, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::resources::ResourceList;

const IMPLICIT_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// One extended resource of the pod that a DeviceClass can serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtendedRequest {
    pub resource: String,
    pub class: String,
    pub count: i64,
}

fn is_extended(name: &str) -> bool {
    name.contains('/')
        && !name.starts_with("hugepages-")
        && (!name.contains("kubernetes.io/") || name.starts_with(IMPLICIT_PREFIX))
}

/// The pod's extended resources that some DeviceClass serves.
pub fn requests_served_by_dra(
    requests: &ResourceList,
    classes: &[DeviceClass],
) -> Vec<ExtendedRequest> {
    let mut sorted: Vec<&DeviceClass> = classes.iter().collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut out = Vec::new();
    for (resource, quantity) in &requests.0 {
        if !is_extended(resource) || quantity.is_zero() {
            continue;
        }
        let class = sorted.iter().find(|c| {
            let name = c.metadata.name.as_deref().unwrap_or_default();
            c.spec
                .as_ref()
                .and_then(|s| s.extended_resource_name.as_deref())
                == Some(resource.as_str())
                || resource.strip_prefix(IMPLICIT_PREFIX) == Some(name)
        });
        if let Some(class) = class {
            out.push(ExtendedRequest {
                resource: resource.clone(),
                class: class.metadata.name.clone().unwrap_or_default(),
                count: quantity.value().unwrap_or(i64::MAX),
            });
        }
    }
    out
}

/// The claim that serves `requests` for pod `pod` (`<pod>-extended-resources`), one
/// request per resource.
pub fn claim_for(namespace: &str, pod: &str, requests: &[&ExtendedRequest]) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(format!("{pod}-extended-resources")),
            namespace: Some(namespace.into()),
            annotations: Some(
                [(
                    "resource.kubernetes.io/extended-resource-claim".to_string(),
                    "true".to_string(),
                )]
                .into(),
            ),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: pod.into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(
                    requests
                        .iter()
                        .enumerate()
                        .map(|(i, r)| DeviceRequest {
                            name: format!("request-{i}"),
                            exactly: Some(ExactDeviceRequest {
                                device_class_name: r.class.clone(),
                                allocation_mode: Some("ExactCount".into()),
                                count: Some(r.count),
                                ..Default::default()
                            }),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
        }),
        status: None,
    }
}

/// Which request of the claim made by [`claim_for`] serves each container's extended
/// resources: what the pod's `status.extendedResourceClaimStatus.requestMappings` tells
/// kubelet, so each container gets the devices of its requests. The claim has one request
/// per resource (sized for the whole pod), so every container that asks for a resource is
/// mapped to that resource's request; kube-scheduler instead gives each container a request
/// of its own, which only differs for pods with several containers asking for one resource.
pub fn request_mappings(
    pod: &Pod,
    requests: &[&ExtendedRequest],
) -> Vec<ContainerExtendedResourceRequest> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    let mut out = Vec::new();
    for container in containers {
        let resources = container.resources.as_ref();
        let asks = |name: &str| {
            [
                resources.and_then(|r| r.requests.as_ref()),
                resources.and_then(|r| r.limits.as_ref()),
            ]
            .into_iter()
            .flatten()
            .any(|list| list.get(name).is_some_and(|q| q.0 != "0"))
        };
        for (i, r) in requests.iter().enumerate() {
            if asks(&r.resource) {
                out.push(ContainerExtendedResourceRequest {
                    container_name: container.name.clone(),
                    resource_name: r.resource.clone(),
                    request_name: format!("request-{i}"),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_with_the_resource_name_serves_it() {
        let class: DeviceClass = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gpu.nvidia.com"},
            "spec": {"extendedResourceName": "nvidia.com/gpu"}}))
        .unwrap();
        let requests = ResourceList(
            [
                ("nvidia.com/gpu".to_string(), "2".parse().unwrap()),
                ("cpu".to_string(), "1".parse().unwrap()),
            ]
            .into(),
        );
        let served = requests_served_by_dra(&requests, &[class]);
        assert_eq!(
            served,
            vec![ExtendedRequest {
                resource: "nvidia.com/gpu".into(),
                class: "gpu.nvidia.com".into(),
                count: 2
            }]
        );
        let claim = claim_for("ml", "trainer", &served.iter().collect::<Vec<_>>());
        assert_eq!(
            claim.metadata.name.as_deref(),
            Some("trainer-extended-resources")
        );
        let req = &claim.spec.unwrap().devices.unwrap().requests.unwrap()[0];
        assert_eq!(req.exactly.as_ref().unwrap().count, Some(2));
    }

    #[test]
    fn implicit_class_resource_name() {
        let class: DeviceClass = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "fpga"}, "spec": {}}))
        .unwrap();
        let requests = ResourceList(
            [(
                "deviceclass.resource.kubernetes.io/fpga".to_string(),
                "1".parse().unwrap(),
            )]
            .into(),
        );
        assert_eq!(requests_served_by_dra(&requests, &[class])[0].class, "fpga");
    }

    #[test]
    fn each_container_is_mapped_to_the_request_for_its_resource() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "trainer", "namespace": "ml"},
            "spec": {
                "initContainers": [{"name": "warmup", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "containers": [
                    {"name": "main", "resources": {"requests": {"nvidia.com/gpu": "2", "example.com/fpga": "1"}}},
                    {"name": "sidecar", "resources": {"requests": {"cpu": "1"}}}]}}))
        .unwrap();
        let gpu = ExtendedRequest {
            resource: "nvidia.com/gpu".into(),
            class: "gpu.nvidia.com".into(),
            count: 2,
        };
        let fpga = ExtendedRequest {
            resource: "example.com/fpga".into(),
            class: "fpga".into(),
            count: 1,
        };
        let mappings: Vec<(String, String, String)> = request_mappings(&pod, &[&fpga, &gpu])
            .into_iter()
            .map(|m| (m.container_name, m.resource_name, m.request_name))
            .collect();
        let m = |c: &str, r: &str, q: &str| (c.to_string(), r.to_string(), q.to_string());
        assert_eq!(
            mappings,
            [
                m("warmup", "nvidia.com/gpu", "request-1"),
                m("main", "example.com/fpga", "request-0"),
                m("main", "nvidia.com/gpu", "request-1"),
            ]
        );
    }
}
