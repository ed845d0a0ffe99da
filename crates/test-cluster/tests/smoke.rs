//! Smoke tests against the real Kubernetes 1.37 control plane from `tests/cluster/`:
//! the DRA API is served, the controller manager generates claims from templates, and the
//! server's validation messages reach the test.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodResourceClaim, PodSpec, ResourceRequirements};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, Device, DeviceAttribute, DeviceClaim, DeviceClass, DeviceClassSpec,
    DeviceRequest, DeviceSelector, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
    ResourceClaimTemplate, ResourceClaimTemplateSpec, ResourcePool, ResourceSlice,
    ResourceSliceSpec,
};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use test_cluster::{TestCluster, eventually, server_message};

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    }
}

fn gpu_class(name: &str) -> DeviceClass {
    DeviceClass {
        metadata: meta(name),
        spec: Some(DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: "device.driver == 'gpu.example.com'".into(),
                }),
            }]),
            ..Default::default()
        }),
    }
}

fn slice(name: &str, node: &str, devices: &[&str]) -> ResourceSlice {
    ResourceSlice {
        metadata: meta(name),
        spec: ResourceSliceSpec {
            driver: "gpu.example.com".into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation: 1,
                resource_slice_count: 1,
            },
            devices: Some(
                devices
                    .iter()
                    .map(|d| Device {
                        name: d.to_string(),
                        attributes: Some(BTreeMap::from([(
                            "model".to_string(),
                            DeviceAttribute {
                                string: Some("A100".into()),
                                ..Default::default()
                            },
                        )])),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        },
    }
}

fn one_device(class: &str) -> ResourceClaimSpec {
    ResourceClaimSpec {
        devices: Some(DeviceClaim {
            requests: Some(vec![DeviceRequest {
                name: "gpu".into(),
                exactly: Some(ExactDeviceRequest {
                    device_class_name: class.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

#[tokio::test]
async fn device_class_slice_and_claim_round_trip() {
    let ns = TestCluster::shared().namespace("smoke-roundtrip").await;
    let class_name = format!("{}.gpu.example.com", ns.name);
    let classes = ns.cluster_api::<DeviceClass>();
    classes
        .create(&PostParams::default(), &gpu_class(&class_name))
        .await
        .unwrap();

    let slices = ns.cluster_api::<ResourceSlice>();
    let slice_name = format!("{}-node-a", ns.name);
    slices
        .create(
            &PostParams::default(),
            &slice(&slice_name, "node-a", &["gpu-0", "gpu-1"]),
        )
        .await
        .unwrap();

    let claims = ns.api::<ResourceClaim>();
    let claim = ResourceClaim {
        metadata: meta("single-gpu"),
        spec: Some(one_device(&class_name)),
        status: None,
    };
    claims.create(&PostParams::default(), &claim).await.unwrap();

    let class = classes.get(&class_name).await.unwrap();
    let selector = &class.spec.unwrap().selectors.unwrap()[0];
    assert_eq!(
        selector.cel.as_ref().unwrap().expression,
        "device.driver == 'gpu.example.com'"
    );

    let read = slices.get(&slice_name).await.unwrap();
    let names: Vec<_> = read
        .spec
        .devices
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert_eq!(names, ["gpu-0", "gpu-1"]);
    assert_eq!(read.spec.pool.name, "node-a");

    let read = claims.get("single-gpu").await.unwrap();
    let request = &read.spec.unwrap().devices.unwrap().requests.unwrap()[0];
    assert_eq!(
        request.exactly.as_ref().unwrap().device_class_name,
        class_name
    );
    // The API server defaults allocationMode and count.
    assert_eq!(
        request.exactly.as_ref().unwrap().allocation_mode.as_deref(),
        Some("ExactCount")
    );
    assert_eq!(request.exactly.as_ref().unwrap().count, Some(1));
    assert!(read.status.is_none_or(|s| s.allocation.is_none()));

    slices
        .delete(&slice_name, &DeleteParams::default())
        .await
        .unwrap();
    classes
        .delete(&class_name, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn controller_manager_generates_claim_from_template() {
    let ns = TestCluster::shared().namespace("smoke-template").await;
    let templates = ns.api::<ResourceClaimTemplate>();
    let template = ResourceClaimTemplate {
        metadata: meta("one-gpu"),
        spec: Some(ResourceClaimTemplateSpec {
            spec: Some(one_device("gpu.example.com")),
            metadata: None,
        }),
    };
    templates
        .create(&PostParams::default(), &template)
        .await
        .unwrap();

    let pods = ns.api::<Pod>();
    let pod = Pod {
        metadata: meta("trainer"),
        spec: Some(PodSpec {
            scheduler_name: Some("dra-scheduler".into()),
            resource_claims: Some(vec![PodResourceClaim {
                name: "gpu".into(),
                resource_claim_template_name: Some("one-gpu".into()),
                ..Default::default()
            }]),
            containers: vec![Container {
                name: "main".into(),
                image: Some("registry.k8s.io/pause:3.10".into()),
                resources: Some(ResourceRequirements {
                    claims: Some(vec![k8s_openapi::api::core::v1::ResourceClaim {
                        name: "gpu".into(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    };
    pods.create(&PostParams::default(), &pod).await.unwrap();

    // kube-controller-manager's resourceclaim controller creates the claim and records its
    // name in the pod's status.
    let generated = eventually("pod.status.resourceClaimStatuses", 60, || async {
        let pod = pods.get("trainer").await.ok()?;
        let statuses = pod.status?.resource_claim_statuses?;
        let status = statuses.into_iter().find(|s| s.name == "gpu")?;
        status.resource_claim_name
    })
    .await;
    assert!(
        generated.starts_with("trainer-gpu-"),
        "generated claim name {generated}"
    );

    let claim = ns.api::<ResourceClaim>().get(&generated).await.unwrap();
    let owner = &claim.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Pod", "trainer")
    );
    assert_eq!(owner.controller, Some(true));
    let annotations = claim.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations
            .get("resource.kubernetes.io/pod-claim-name")
            .map(String::as_str),
        Some("gpu")
    );
    let request = &claim.spec.unwrap().devices.unwrap().requests.unwrap()[0];
    assert_eq!(
        request.exactly.as_ref().unwrap().device_class_name,
        "gpu.example.com"
    );
}

#[tokio::test]
async fn invalid_slice_is_rejected_with_the_servers_message() {
    let ns = TestCluster::shared().namespace("smoke-invalid").await;
    let slices = ns.cluster_api::<ResourceSlice>();
    let name = format!("{}-bad", ns.name);
    let err = slices
        .create(&PostParams::default(), &slice(&name, "node-a", &["GPU_0"]))
        .await
        .expect_err("a device name that is not a DNS label must be rejected");
    let message = server_message(&err);
    assert!(message.starts_with("Invalid (422)"), "{message}");
    assert!(message.contains("spec.devices[0].name"), "{message}");
    assert!(message.contains("GPU_0"), "{message}");
    // Nothing was stored.
    assert!(slices.get_opt(&name).await.unwrap().is_none());
}
