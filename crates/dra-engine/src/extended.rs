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

/// A container's request for `resource`, as a whole number of devices (requests, else
/// limits; kubelet defaults one from the other for extended resources).
fn container_count(container: &k8s_openapi::api::core::v1::Container, resource: &str) -> i64 {
    let resources = container.resources.as_ref();
    [
        resources.and_then(|r| r.requests.as_ref()),
        resources.and_then(|r| r.limits.as_ref()),
    ]
    .into_iter()
    .flatten()
    .find_map(|list| list.get(resource))
    .and_then(|q| q.0.parse::<i64>().ok())
    .unwrap_or(0)
}

/// The device requests of the claim for the pod's DRA-served extended resources and which
/// request serves each container, built as kube-scheduler builds them: per resource (in name
/// order), each long-lived container (regular or sidecar) gets its own request
/// `container-<i>-request-<j>` (i: index among init then regular containers; j: index of the
/// resource among the container's sorted requests); an init container that runs before
/// others first reuses the requests of the long-lived containers from its position on, and
/// only asks for what they do not cover; of those extra init requests only the largest is
/// kept, and every init container maps to it. Requests are sorted by name.
fn requests_and_mappings(
    pod: &Pod,
    served: &[&ExtendedRequest],
) -> (Vec<DeviceRequest>, Vec<ContainerExtendedResourceRequest>) {
    let Some(spec) = pod.spec.as_ref() else {
        return (Vec::new(), Vec::new());
    };
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    let containers: Vec<&k8s_openapi::api::core::v1::Container> =
        inits.iter().chain(spec.containers.iter()).collect();
    let short_lived =
        |i: usize| i < inits.len() && containers[i].restart_policy.as_deref() != Some("Always");
    let mut sorted: Vec<&&ExtendedRequest> = served.iter().collect();
    sorted.sort_by(|a, b| a.resource.cmp(&b.resource));
    let mut requests = Vec::new();
    let mut mappings = Vec::new();
    for served in sorted {
        let resource = served.resource.as_str();
        let map = |c: &k8s_openapi::api::core::v1::Container, request: &str| {
            ContainerExtendedResourceRequest {
                container_name: c.name.clone(),
                resource_name: resource.to_string(),
                request_name: request.to_string(),
            }
        };
        let name_for = |i: usize| {
            let mut keys: Vec<&String> = containers[i]
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref().or(r.limits.as_ref()))
                .map(|l| l.keys().collect())
                .unwrap_or_default();
            keys.sort();
            let j = keys.iter().position(|k| *k == resource).unwrap_or(0);
            format!("container-{i}-request-{j}")
        };
        // Long-lived containers: a request each.
        let mut long: Vec<Option<(String, i64)>> = vec![None; containers.len()];
        let mut long_mappings = Vec::new();
        for (i, slot) in long.iter_mut().enumerate() {
            let count = container_count(containers[i], resource);
            if short_lived(i) || count <= 0 {
                continue;
            }
            let name = name_for(i);
            long_mappings.push(map(containers[i], &name));
            *slot = Some((name, count));
        }
        // Init containers that run to completion first: reuse, then the largest extra.
        let mut short_mappings = Vec::new();
        let mut largest: Option<(String, i64)> = None;
        let mut extra_names = Vec::new();
        for i in (0..containers.len()).filter(|&i| short_lived(i)) {
            let count = container_count(containers[i], resource);
            if count <= 0 {
                continue;
            }
            let mut covered = 0;
            for (name, n) in long[i..].iter().flatten() {
                if covered >= count {
                    break;
                }
                covered += n;
                short_mappings.push(map(containers[i], name));
            }
            if covered < count {
                let name = name_for(i);
                short_mappings.push(map(containers[i], &name));
                extra_names.push(name.clone());
                if largest.as_ref().is_none_or(|(_, n)| *n < count - covered) {
                    largest = Some((name, count - covered));
                }
            }
        }
        if let Some((keep, _)) = &largest {
            for m in &mut short_mappings {
                if extra_names.contains(&m.request_name) {
                    m.request_name = keep.clone();
                }
            }
        }
        let request = |(name, count)| exact_request(name, &served.class, count);
        requests.extend(largest.map(request));
        requests.extend(long.into_iter().flatten().map(request));
        mappings.extend(long_mappings);
        mappings.extend(short_mappings);
    }
    requests.sort_by(|a, b| a.name.cmp(&b.name));
    (requests, mappings)
}

/// `count` devices of `class`, by the name `name`.
fn exact_request(name: String, class: &str, count: i64) -> DeviceRequest {
    DeviceRequest {
        name,
        exactly: Some(ExactDeviceRequest {
            device_class_name: class.to_string(),
            allocation_mode: Some("ExactCount".into()),
            count: Some(count),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The claim that serves the pod's DRA-served extended resources
/// (`<pod>-extended-resources`), and which of its requests serves each container (for the
/// pod's `status.extendedResourceClaimStatus`).
pub fn claim_for(
    pod: &Pod,
    served: &[&ExtendedRequest],
) -> (ResourceClaim, Vec<ContainerExtendedResourceRequest>) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let (mut requests, mappings) = requests_and_mappings(pod, served);
    if requests.is_empty() {
        // No container names the resources (they came from elsewhere): one request each.
        requests = served
            .iter()
            .enumerate()
            .map(|(i, r)| exact_request(format!("request-{i}"), &r.class, r.count))
            .collect();
    }
    let claim = ResourceClaim {
        metadata: ObjectMeta {
            name: Some(format!("{name}-extended-resources")),
            namespace: Some(
                pod.metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
            ),
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
                name,
                // The pod itself, not any pod of the same name.
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(requests),
                ..Default::default()
            }),
        }),
        status: None,
    };
    (claim, mappings)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claim's requests as (name, class, count).
    fn requests_of(claim: ResourceClaim) -> Vec<(String, String, i64)> {
        let requests = claim.spec.unwrap().devices.unwrap().requests.unwrap();
        requests
            .into_iter()
            .map(|r| {
                let e = r.exactly.unwrap();
                (r.name, e.device_class_name, e.count.unwrap())
            })
            .collect()
    }

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
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "trainer", "namespace": "ml"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}))
        .unwrap();
        let (claim, mappings) = claim_for(&pod, &served.iter().collect::<Vec<_>>());
        assert_eq!(
            claim.metadata.name.as_deref(),
            Some("trainer-extended-resources")
        );
        assert_eq!(claim.metadata.namespace.as_deref(), Some("ml"));
        let req = &claim.spec.unwrap().devices.unwrap().requests.unwrap()[0];
        assert_eq!(req.name, "container-0-request-0");
        assert_eq!(req.exactly.as_ref().unwrap().count, Some(2));
        assert_eq!(mappings[0].request_name, "container-0-request-0");
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
    fn each_container_gets_its_own_request_and_init_containers_reuse_them() {
        // Kubernetes' own case: a run-to-completion init container needing 3 GPUs before a
        // sidecar (1) and two containers (1 and 2 GPUs, one also wanting an FPGA).
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "trainer", "namespace": "ml"},
            "spec": {
                "initContainers": [
                    {"name": "warmup", "resources": {"requests": {"nvidia.com/gpu": "3"}}},
                    {"name": "proxy", "restartPolicy": "Always",
                     "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
                "containers": [
                    {"name": "main", "resources": {"requests": {"nvidia.com/gpu": "2", "example.com/fpga": "1"}}},
                    {"name": "side", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    {"name": "plain", "resources": {"requests": {"cpu": "1"}}}]}}))
        .unwrap();
        let gpu = ExtendedRequest {
            resource: "nvidia.com/gpu".into(),
            class: "gpu.nvidia.com".into(),
            count: 4,
        };
        let fpga = ExtendedRequest {
            resource: "example.com/fpga".into(),
            class: "fpga".into(),
            count: 1,
        };
        let (claim, mappings) = claim_for(&pod, &[&gpu, &fpga]);
        let requests = requests_of(claim);
        let q = |n: &str, c: &str, k: i64| (n.to_string(), c.to_string(), k);
        assert_eq!(
            requests,
            [
                // The sidecar and the containers after warmup cover 1+2+1 >= 3: no extra.
                q("container-1-request-0", "gpu.nvidia.com", 1),
                // example.com/fpga is index 0 of main's sorted requests, the GPU index 1.
                q("container-2-request-0", "fpga", 1),
                q("container-2-request-1", "gpu.nvidia.com", 2),
                q("container-3-request-0", "gpu.nvidia.com", 1),
            ]
        );
        let mappings: Vec<(String, String, String)> = mappings
            .into_iter()
            .map(|m| (m.container_name, m.resource_name, m.request_name))
            .collect();
        let m = |c: &str, r: &str, q: &str| (c.to_string(), r.to_string(), q.to_string());
        assert_eq!(
            mappings,
            [
                m("main", "example.com/fpga", "container-2-request-0"),
                m("proxy", "nvidia.com/gpu", "container-1-request-0"),
                m("main", "nvidia.com/gpu", "container-2-request-1"),
                m("side", "nvidia.com/gpu", "container-3-request-0"),
                m("warmup", "nvidia.com/gpu", "container-1-request-0"),
                m("warmup", "nvidia.com/gpu", "container-2-request-1"),
            ]
        );
    }

    #[test]
    fn an_init_container_needing_more_than_the_rest_gets_the_largest_extra_request() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [
                    {"name": "a", "resources": {"requests": {"nvidia.com/gpu": "3"}}},
                    {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "4"}}}],
                "containers": [{"name": "main", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}))
        .unwrap();
        let gpu = ExtendedRequest {
            resource: "nvidia.com/gpu".into(),
            class: "gpu".into(),
            count: 4,
        };
        let (claim, mappings) = claim_for(&pod, &[&gpu]);
        let requests = requests_of(claim);
        // a needs 3 - 1 = 2 more, b 4 - 1 = 3 more: only b's extra request is kept.
        assert_eq!(
            requests,
            [
                ("container-1-request-0".to_string(), "gpu".to_string(), 3),
                ("container-2-request-0".to_string(), "gpu".to_string(), 1)
            ]
        );
        let to: Vec<(&str, &str)> = mappings
            .iter()
            .map(|m| (m.container_name.as_str(), m.request_name.as_str()))
            .collect();
        assert_eq!(
            to,
            [
                ("main", "container-2-request-0"),
                ("a", "container-2-request-0"),
                ("a", "container-1-request-0"),
                ("b", "container-2-request-0"),
                ("b", "container-1-request-0"),
            ]
        );
    }
}
