//! What the cluster's controllers would do with the manifests before the scheduler sees
//! them: workloads become pods (`<workload>-<index>`), pods get their priority from their
//! PriorityClass, ResourceClaimTemplates become claims (`<pod>-<podClaimName>`), a
//! StatefulSet's volumeClaimTemplates become claims (`<template>-<statefulset>-<index>`) and
//! a generic ephemeral volume its pod's claim (`<pod>-<volume>`), every namespaced object
//! without a namespace lands in `default`, and the PV controller's part is done where it
//! needs nothing but the manifests: volumes without a status are Available (Bound when
//! they name a claim), a claim that names its volume is bound to it, and a claim without a
//! class gets the default StorageClass.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolumeClaim, PersistentVolumeClaimVolumeSource,
    PersistentVolumeStatus, Pod, PodResourceClaimStatus, PodStatus, PodTemplateSpec, Volume,
};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::limits::{MAX_PODS, MAX_PODS_PER_WORKLOAD};
use super::manifests::{Loaded, ManifestError, Manifests, Object, Source};
use dra_engine::ClusterInput;

const DEFAULT_NAMESPACE: &str = "default";

fn namespaced(meta: &mut ObjectMeta) {
    if meta.namespace.as_deref().is_none_or(str::is_empty) {
        meta.namespace = Some(DEFAULT_NAMESPACE.into());
    }
}

fn pod_from_template(
    template: &PodTemplateSpec,
    namespace: &str,
    name: String,
    owner: (&str, &str),
) -> Pod {
    let mut metadata = template.metadata.clone().unwrap_or_default();
    metadata.name = Some(name);
    metadata.namespace = Some(namespace.into());
    metadata.owner_references = Some(vec![OwnerReference {
        api_version: if owner.0 == "Job" {
            "batch/v1"
        } else {
            "apps/v1"
        }
        .into(),
        kind: owner.0.into(),
        name: owner.1.into(),
        controller: Some(true),
        ..Default::default()
    }]);
    Pod {
        metadata,
        spec: template.spec.clone(),
        status: None,
    }
}

/// Where a pod came from: a Pod document, or a workload's template.
struct Origin {
    source: Source,
    object: String,
    template: bool,
}

/// How many pods `object` stands for (one for a Pod, none for other objects): what its
/// controller would create at once.
fn pod_count(object: &Object) -> (i64, &'static str) {
    match object {
        Object::Pod(_) => (1, ""),
        Object::Deployment(d) => (d.spec.replicas.unwrap_or(1).into(), "spec.replicas"),
        Object::ReplicaSet(rs) => (rs.spec.replicas.unwrap_or(1).into(), "spec.replicas"),
        Object::StatefulSet(ss) => (ss.spec.replicas.unwrap_or(1).into(), "spec.replicas"),
        Object::Job(job) => {
            let spec = job.spec.as_ref();
            let parallelism = spec.and_then(|s| s.parallelism).unwrap_or(1);
            match spec.and_then(|s| s.completions) {
                Some(c) if c < parallelism => (c.into(), "spec.completions"),
                _ => (parallelism.into(), "spec.parallelism"),
            }
        }
        _ => (0, ""),
    }
}

/// Check [`MAX_PODS_PER_WORKLOAD`] and [`MAX_PODS`] before a single pod is built.
fn check_pod_counts(objects: &[Loaded]) -> Result<(), ManifestError> {
    let mut total = 0usize;
    for loaded in objects {
        let (count, field) = pod_count(&loaded.object);
        let error = |message: String| ManifestError {
            location: loaded.source.clone(),
            object: Some(loaded.object.describe()),
            message,
        };
        if count > MAX_PODS_PER_WORKLOAD {
            return Err(error(format!(
                "{field}: {count} pods is more than simulate expands from one workload (at most \
                 {MAX_PODS_PER_WORKLOAD})"
            )));
        }
        total += count.max(0) as usize;
        if total > MAX_PODS {
            return Err(error(format!(
                "with this object the input has more than {MAX_PODS} pods, more than simulate \
                 schedules in one run"
            )));
        }
    }
    Ok(())
}

/// Expand the manifests into the cluster the engine schedules.
pub fn expand(manifests: Manifests) -> Result<ClusterInput, ManifestError> {
    check_pod_counts(&manifests.objects)?;
    let mut input = ClusterInput::default();
    let mut templates: HashMap<(String, String), ResourceClaimTemplate> = HashMap::new();
    let mut priority_classes: Vec<PriorityClass> = Vec::new();
    let mut pvcs: Vec<PersistentVolumeClaim> = Vec::new();
    // Each pod with the object it came from, shared by a workload's pods.
    let mut pods: Vec<(Rc<Origin>, Pod)> = Vec::new();

    for loaded in manifests.objects {
        let origin = Rc::new(Origin {
            source: loaded.source.clone(),
            object: loaded.object.describe(),
            template: !matches!(loaded.object, Object::Pod(_)),
        });
        match loaded.object {
            Object::Namespace(ns) => input.namespaces.push(ns),
            Object::Node(node) => input.nodes.push(node),
            Object::Pod(mut pod) => {
                namespaced(&mut pod.metadata);
                pods.push((origin, pod));
            }
            Object::Deployment(mut d) => {
                namespaced(&mut d.metadata);
                let spec = d.spec;
                let name = d.metadata.name.unwrap_or_default();
                let ns = d.metadata.namespace.unwrap_or_default();
                for i in 0..spec.replicas.unwrap_or(1).max(0) {
                    let pod = pod_from_template(
                        &spec.template,
                        &ns,
                        format!("{name}-{i}"),
                        ("Deployment", &name),
                    );
                    pods.push((origin.clone(), pod));
                }
            }
            Object::ReplicaSet(mut rs) => {
                namespaced(&mut rs.metadata);
                let spec = rs.spec;
                let name = rs.metadata.name.unwrap_or_default();
                let ns = rs.metadata.namespace.unwrap_or_default();
                let template = spec.template.unwrap_or_default();
                for i in 0..spec.replicas.unwrap_or(1).max(0) {
                    let pod = pod_from_template(
                        &template,
                        &ns,
                        format!("{name}-{i}"),
                        ("ReplicaSet", &name),
                    );
                    pods.push((origin.clone(), pod));
                }
            }
            Object::StatefulSet(mut ss) => {
                namespaced(&mut ss.metadata);
                let spec = ss.spec;
                let name = ss.metadata.name.unwrap_or_default();
                let ns = ss.metadata.namespace.unwrap_or_default();
                for i in 0..spec.replicas.unwrap_or(1).max(0) {
                    let mut pod = pod_from_template(
                        &spec.template,
                        &ns,
                        format!("{name}-{i}"),
                        ("StatefulSet", &name),
                    );
                    // The StatefulSet controller: one claim per template and replica, used
                    // by the volume of the template's name.
                    for template in spec.volume_claim_templates.iter().flatten() {
                        let template_name = template.metadata.name.clone().unwrap_or_default();
                        let claim_name = format!("{template_name}-{name}-{i}");
                        let mut claim = template.clone();
                        claim.metadata.name = Some(claim_name.clone());
                        claim.metadata.namespace = Some(ns.clone());
                        claim.status = None;
                        pvcs.push(claim);
                        let volumes = pod
                            .spec
                            .get_or_insert_with(Default::default)
                            .volumes
                            .get_or_insert_with(Vec::new);
                        volumes.retain(|v| v.name != template_name);
                        volumes.push(Volume {
                            name: template_name,
                            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                                claim_name,
                                read_only: None,
                            }),
                            ..Default::default()
                        });
                    }
                    pods.push((origin.clone(), pod));
                }
            }
            Object::Job(mut job) => {
                namespaced(&mut job.metadata);
                let spec = job.spec.unwrap_or_default();
                let name = job.metadata.name.unwrap_or_default();
                let ns = job.metadata.namespace.unwrap_or_default();
                let mut parallelism = spec.parallelism.unwrap_or(1);
                if let Some(completions) = spec.completions {
                    parallelism = parallelism.min(completions);
                }
                for i in 0..parallelism.max(0) {
                    let pod = pod_from_template(
                        &spec.template,
                        &ns,
                        format!("{name}-{i}"),
                        ("Job", &name),
                    );
                    pods.push((origin.clone(), pod));
                }
            }
            Object::ResourceClaim(mut claim) => {
                namespaced(&mut claim.metadata);
                input.claims.push(claim);
            }
            Object::ResourceClaimTemplate(mut t) => {
                namespaced(&mut t.metadata);
                let key = (
                    t.metadata.namespace.clone().unwrap_or_default(),
                    t.metadata.name.clone().unwrap_or_default(),
                );
                templates.insert(key, t);
            }
            Object::DeviceClass(c) => input.classes.push(c),
            Object::ResourceSlice(s) => input.slices.push(s),
            Object::DeviceTaintRule(r) => input.taint_rules.push(r),
            Object::PriorityClass(pc) => priority_classes.push(pc),
            Object::PersistentVolume(pv) => input.persistent_volumes.push(pv),
            Object::PersistentVolumeClaim(mut pvc) => {
                namespaced(&mut pvc.metadata);
                pvcs.push(pvc);
            }
            Object::StorageClass(mut sc) => {
                // The API server's default.
                sc.volume_binding_mode
                    .get_or_insert_with(|| "Immediate".to_string());
                input.storage_classes.push(sc);
            }
            Object::CSINode(n) => input.csi_nodes.push(n),
            Object::CSIDriver(d) => input.csi_drivers.push(d),
        }
    }

    let priorities: BTreeMap<String, i32> = priority_classes
        .iter()
        .map(|pc| {
            (
                pc.metadata.name.clone().unwrap_or_default(),
                pc.value.unwrap_or(0),
            )
        })
        .collect();
    let global_default = priority_classes
        .iter()
        .find(|pc| pc.global_default == Some(true))
        .map(|pc| pc.value.unwrap_or(0));

    for (origin, mut pod) in pods {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let spec = pod.spec.get_or_insert_with(Default::default);
        // Priority admission: the class's value, or the global default, or 0.
        if spec.priority.is_none() {
            spec.priority = match spec.priority_class_name.as_deref() {
                Some(name) if !name.is_empty() => match priorities.get(name) {
                    Some(v) => Some(*v),
                    None if name == "system-cluster-critical" => Some(2_000_000_000),
                    None if name == "system-node-critical" => Some(2_000_001_000),
                    None => {
                        let field = if origin.template {
                            "spec.template.spec.priorityClassName"
                        } else {
                            "spec.priorityClassName"
                        };
                        return Err(ManifestError {
                            location: origin.source.clone(),
                            object: Some(origin.object.clone()),
                            message: format!(
                                "{field}: no PriorityClass with name {name} was found"
                            ),
                        });
                    }
                },
                _ => Some(global_default.unwrap_or(0)),
            };
        }
        // The resourceclaim controller: one claim per template reference.
        let mut statuses = Vec::new();
        for pod_claim in spec.resource_claims.iter().flatten() {
            let Some(template_name) = pod_claim.resource_claim_template_name.as_deref() else {
                continue;
            };
            let Some(template) = templates.get(&(ns.clone(), template_name.to_string())) else {
                // Like the controller, leave the pod waiting; the engine reports why.
                continue;
            };
            let claim_name = format!("{pod_name}-{}", pod_claim.name);
            let tspec = template.spec.clone().unwrap_or_default();
            let tmeta = tspec.metadata.clone().unwrap_or_default();
            input.claims.push(ResourceClaim {
                metadata: ObjectMeta {
                    name: Some(claim_name.clone()),
                    namespace: Some(ns.clone()),
                    labels: tmeta.labels,
                    annotations: Some(
                        tmeta
                            .annotations
                            .unwrap_or_default()
                            .into_iter()
                            .chain([(
                                "resource.kubernetes.io/pod-claim-name".to_string(),
                                pod_claim.name.clone(),
                            )])
                            .collect(),
                    ),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Pod".into(),
                        name: pod_name.clone(),
                        controller: Some(true),
                        block_owner_deletion: Some(true),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
                spec: tspec.spec,
                status: None,
            });
            statuses.push(PodResourceClaimStatus {
                name: pod_claim.name.clone(),
                resource_claim_name: Some(claim_name),
            });
        }
        if !statuses.is_empty() {
            pod.status
                .get_or_insert_with(PodStatus::default)
                .resource_claim_statuses = Some(statuses);
        }
        // The ephemeral volume controller: the claim of each generic ephemeral volume.
        let spec = pod.spec.as_ref();
        for volume in spec.and_then(|s| s.volumes.as_deref()).unwrap_or_default() {
            let Some(template) = volume
                .ephemeral
                .as_ref()
                .and_then(|e| e.volume_claim_template.as_ref())
            else {
                continue;
            };
            let tmeta = template.metadata.clone().unwrap_or_default();
            pvcs.push(PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some(format!("{pod_name}-{}", volume.name)),
                    namespace: Some(ns.clone()),
                    labels: tmeta.labels,
                    annotations: tmeta.annotations,
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Pod".into(),
                        name: pod_name.clone(),
                        uid: pod.metadata.uid.clone().unwrap_or_default(),
                        controller: Some(true),
                        block_owner_deletion: Some(true),
                    }]),
                    ..Default::default()
                },
                spec: Some(template.spec.clone()),
                status: None,
            });
        }
        input.pods.push(pod);
    }
    pv_controller(&mut input, pvcs);
    Ok(input)
}

/// What the PV controller (and the DefaultStorageClass admission) would have done with the
/// storage objects before any pod is scheduled, as far as it needs no provisioner.
fn pv_controller(input: &mut ClusterInput, mut pvcs: Vec<PersistentVolumeClaim>) {
    use dra_engine::plugins::volume_binding::ANN_BIND_COMPLETED;
    let default_class = input
        .storage_classes
        .iter()
        .find(|sc| {
            sc.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("storageclass.kubernetes.io/is-default-class"))
                .is_some_and(|v| v == "true")
        })
        .and_then(|sc| sc.metadata.name.clone());
    for pvc in &mut pvcs {
        let spec = pvc.spec.get_or_insert_with(Default::default);
        if spec.storage_class_name.is_none() {
            spec.storage_class_name = default_class.clone();
        }
        let Some(volume) = spec.volume_name.clone().filter(|v| !v.is_empty()) else {
            continue;
        };
        let Some(pv) = input
            .persistent_volumes
            .iter_mut()
            .find(|pv| pv.metadata.name.as_deref() == Some(volume.as_str()))
        else {
            continue;
        };
        let pv_spec = pv.spec.get_or_insert_with(Default::default);
        let claim_ref = pv_spec.claim_ref.get_or_insert_with(|| ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            namespace: pvc.metadata.namespace.clone(),
            name: pvc.metadata.name.clone(),
            ..Default::default()
        });
        if claim_ref.name != pvc.metadata.name || claim_ref.namespace != pvc.metadata.namespace {
            continue;
        }
        pvc.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .entry(ANN_BIND_COMPLETED.to_string())
            .or_insert_with(|| "yes".to_string());
        pvc.status.get_or_insert_with(Default::default).phase = Some("Bound".into());
    }
    for pv in &mut input.persistent_volumes {
        let claimed = pv.spec.as_ref().is_some_and(|s| s.claim_ref.is_some());
        let status = pv
            .status
            .get_or_insert_with(PersistentVolumeStatus::default);
        if status.phase.is_none() {
            status.phase = Some(if claimed { "Bound" } else { "Available" }.into());
        }
    }
    input.persistent_volume_claims = pvcs;
}
