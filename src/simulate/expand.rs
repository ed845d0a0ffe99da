//! What the cluster's controllers would do with the manifests before the scheduler sees
//! them: workloads become pods (`<workload>-<index>`), pods get their priority from their
//! PriorityClass, ResourceClaimTemplates become claims (`<pod>-<podClaimName>`), a
//! StatefulSet's volumeClaimTemplates become claims (`<template>-<statefulset>-<index>`) and
//! a generic ephemeral volume its pod's claim (`<pod>-<volume>`), every namespaced object
//! without a namespace lands in `default`, and the PV controller's part is done where it
//! needs nothing but the manifests: volumes without a status are Available (Bound when
//! they name a claim), a claim that names its volume is bound to it, and a claim without a
//! class gets the default StorageClass.
//!
//! A Deployment's pods are what its ReplicaSet `<deployment>-<hash>` would create: the
//! deployment controller adds `pod-template-hash: <hash>` to the template's labels and to
//! the ReplicaSet's selector (the Deployment's own plus that label), and kube-scheduler's
//! default topology spreading selects the pods by that ReplicaSet. The hash is made here
//! from the template (not the controller's own hash of the Go object, which only a live
//! cluster computes), so it is stable and one per Deployment, like the real one. Services,
//! ReplicationControllers, ReplicaSets and StatefulSets are kept for their selectors.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetSpec};
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

/// The label the deployment controller puts on its ReplicaSets' pods and selectors.
const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// A Deployment's `pod-template-hash`: FNV-1a of the template, written as the deployment
/// controller writes its own (`rand.SafeEncodeString` of the number: no vowels, no 0, 1, 3).
fn pod_template_hash(template: &PodTemplateSpec) -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let json = serde_json::to_vec(template).unwrap_or_default();
    let hash = json.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    });
    hash.to_string()
        .bytes()
        .map(|b| char::from(ALPHANUMS[usize::from(b) % ALPHANUMS.len()]))
        .collect()
}

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
        api_version: match owner.0 {
            "Job" => "batch/v1",
            "ReplicationController" => "v1",
            _ => "apps/v1",
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
        Object::ReplicationController(rc) => (
            rc.spec
                .as_ref()
                .and_then(|s| s.replicas)
                .unwrap_or(1)
                .into(),
            "spec.replicas",
        ),
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
    expand_all(manifests).map(|(input, _)| input)
}

/// [`expand`], also returning the Workloads and PodGroups (the engine schedules a PodGroup
/// through its own call, so they are not part of the cluster input).
pub fn expand_all(manifests: Manifests) -> Result<(ClusterInput, super::Groups), ManifestError> {
    check_pod_counts(&manifests.objects)?;
    let mut input = ClusterInput::default();
    let mut groups = super::Groups::default();
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
                // The deployment controller's ReplicaSet for this template.
                let hash = pod_template_hash(&spec.template);
                let rs_name = format!("{name}-{hash}");
                let mut template = spec.template;
                template
                    .metadata
                    .get_or_insert_with(Default::default)
                    .labels
                    .get_or_insert_with(Default::default)
                    .insert(POD_TEMPLATE_HASH.into(), hash.clone());
                let mut selector = spec.selector;
                selector
                    .match_labels
                    .get_or_insert_with(Default::default)
                    .insert(POD_TEMPLATE_HASH.into(), hash);
                input.replica_sets.push(ReplicaSet {
                    metadata: ObjectMeta {
                        name: Some(rs_name.clone()),
                        namespace: Some(ns.clone()),
                        ..Default::default()
                    },
                    spec: ReplicaSetSpec {
                        replicas: spec.replicas,
                        selector,
                        ..Default::default()
                    },
                    status: None,
                });
                for i in 0..spec.replicas.unwrap_or(1).max(0) {
                    let pod = pod_from_template(
                        &template,
                        &ns,
                        format!("{name}-{i}"),
                        ("ReplicaSet", &rs_name),
                    );
                    pods.push((origin.clone(), pod));
                }
            }
            Object::ReplicaSet(mut rs) => {
                namespaced(&mut rs.metadata);
                input.replica_sets.push(ReplicaSet {
                    metadata: rs.metadata.clone(),
                    spec: ReplicaSetSpec {
                        selector: rs.spec.selector.clone(),
                        ..Default::default()
                    },
                    status: None,
                });
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
                let mut selecting = ss.clone();
                selecting.spec.template = Default::default();
                selecting.spec.volume_claim_templates = None;
                input.stateful_sets.push(selecting);
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
            Object::ReplicationController(mut rc) => {
                namespaced(&mut rc.metadata);
                let name = rc.metadata.name.clone().unwrap_or_default();
                let ns = rc.metadata.namespace.clone().unwrap_or_default();
                let spec = rc.spec.get_or_insert_with(Default::default);
                let template = spec.template.clone().unwrap_or_default();
                // The API server's default: an empty selector is the template's labels.
                if spec.selector.as_ref().is_none_or(BTreeMap::is_empty) {
                    spec.selector = template.metadata.as_ref().and_then(|m| m.labels.clone());
                }
                for i in 0..spec.replicas.unwrap_or(1).max(0) {
                    let pod = pod_from_template(
                        &template,
                        &ns,
                        format!("{name}-{i}"),
                        ("ReplicationController", &name),
                    );
                    pods.push((origin.clone(), pod));
                }
                if let Some(spec) = rc.spec.as_mut() {
                    spec.template = None;
                }
                input.replication_controllers.push(rc);
            }
            Object::Service(mut service) => {
                namespaced(&mut service.metadata);
                input.services.push(service);
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
            Object::VolumeAttachment(a) => input.volume_attachments.push(a),
            Object::Workload(mut w) => {
                namespaced(&mut w.metadata);
                groups.workloads.push(w);
            }
            Object::PodGroup(mut g) => {
                namespaced(&mut g.metadata);
                groups.pod_groups.push(g);
            }
            Object::PodDisruptionBudget(mut b) => {
                namespaced(&mut b.metadata);
                groups.pdbs.push(b);
            }
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
        // The resourceclaim controller: one claim per template reference, unless the pod's
        // status names its claim already (a pod read from a cluster).
        let made: Vec<PodResourceClaimStatus> = pod
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.clone())
            .unwrap_or_default();
        let spec = pod.spec.get_or_insert_with(Default::default);
        let mut statuses = made.clone();
        for pod_claim in spec.resource_claims.iter().flatten() {
            let Some(template_name) = pod_claim.resource_claim_template_name.as_deref() else {
                continue;
            };
            if made.iter().any(|s| s.name == pod_claim.name) {
                continue;
            }
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
    Ok((input, groups))
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::simulate::manifests::parse_file;
    use crate::simulate::{Options, simulate};

    fn expanded(yaml: &str) -> ClusterInput {
        let mut manifests = Manifests::default();
        parse_file(Path::new("test.yaml"), yaml, &mut manifests).unwrap();
        expand(manifests).unwrap()
    }

    const NODES: &str = "
apiVersion: v1
kind: Node
metadata: {name: a1, labels: {kubernetes.io/hostname: a1, topology.kubernetes.io/zone: a}}
status: {allocatable: {cpu: '8', memory: 32Gi, pods: '110'}}
---
apiVersion: v1
kind: Node
metadata: {name: a2, labels: {kubernetes.io/hostname: a2, topology.kubernetes.io/zone: a}}
status: {allocatable: {cpu: '8', memory: 32Gi, pods: '110'}}
---
apiVersion: v1
kind: Node
metadata: {name: b1, labels: {kubernetes.io/hostname: b1, topology.kubernetes.io/zone: b}}
status: {allocatable: {cpu: '8', memory: 32Gi, pods: '110'}}
---
apiVersion: v1
kind: Node
metadata: {name: b2, labels: {kubernetes.io/hostname: b2, topology.kubernetes.io/zone: b}}
status: {allocatable: {cpu: '8', memory: 32Gi, pods: '110'}}
";

    fn web(kind: &str, replicas: u32) -> String {
        let api_version = if kind == "ReplicationController" {
            "v1"
        } else {
            "apps/v1"
        };
        let selector = if kind == "ReplicationController" {
            "{}"
        } else {
            "{matchLabels: {app: web}}"
        };
        format!(
            "---
apiVersion: {api_version}
kind: {kind}
metadata: {{name: web}}
spec:
  replicas: {replicas}
  selector: {selector}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      schedulerName: dra-scheduler
      containers: [{{name: c, image: nginx}}]
"
        )
    }

    #[test]
    fn volume_attachments_are_kept_for_the_node_volume_limits() {
        let input = expanded(
            "apiVersion: storage.k8s.io/v1\nkind: VolumeAttachment\nmetadata: {name: va}\n\
             spec: {attacher: disk.csi.example.com, nodeName: a1, \
             source: {persistentVolumeName: pv}}\n",
        );
        assert_eq!(input.volume_attachments.len(), 1);
        assert_eq!(input.volume_attachments[0].spec.node_name, "a1");
    }

    #[test]
    fn a_deployments_pods_are_its_replica_sets_with_the_template_hash() {
        let input = expanded(&web("Deployment", 2));
        let [rs] = input.replica_sets.as_slice() else {
            panic!("one ReplicaSet: {:?}", input.replica_sets);
        };
        let rs_name = rs.metadata.name.clone().unwrap();
        let hash = rs_name.strip_prefix("web-").unwrap();
        assert!(!hash.is_empty());
        let selector = rs.spec.selector.match_labels.clone().unwrap();
        assert_eq!(selector["app"], "web");
        assert_eq!(selector[POD_TEMPLATE_HASH], hash);
        for pod in &input.pods {
            let labels = pod.metadata.labels.clone().unwrap();
            assert_eq!(labels[POD_TEMPLATE_HASH], hash);
            let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
            assert_eq!(
                (owner.api_version.as_str(), owner.kind.as_str()),
                ("apps/v1", "ReplicaSet")
            );
            assert_eq!(owner.name, rs_name);
        }
        assert_eq!(
            expanded(&web("Deployment", 2)).replica_sets[0]
                .metadata
                .name,
            Some(rs_name),
            "the same template, the same hash"
        );
    }

    #[test]
    fn a_replication_controllers_empty_selector_is_its_templates_labels() {
        let input = expanded(&web("ReplicationController", 2));
        assert_eq!(input.pods.len(), 2);
        let selector = input.replication_controllers[0]
            .spec
            .as_ref()
            .and_then(|s| s.selector.clone());
        assert_eq!(
            selector,
            Some(BTreeMap::from([("app".into(), "web".into())]))
        );
        let owner = &input.pods[0].metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.api_version, "v1");
    }

    /// Where each replica of `web` went, by pod name.
    fn placed(yaml: &str) -> Vec<String> {
        let sim = simulate(&Options::default(), expanded(yaml));
        sim.pods
            .iter()
            .map(|(_, d)| d.as_ref().and_then(|d| d.node()).unwrap_or("-").to_string())
            .collect()
    }

    #[test]
    fn replicas_spread_by_zone_and_node_as_kube_scheduler_defaults_do() {
        for kind in [
            "Deployment",
            "ReplicaSet",
            "StatefulSet",
            "ReplicationController",
        ] {
            let yaml = format!("{NODES}{}", web(kind, 3));
            // a1 first (ties go to the first node), then the other zone, then an empty
            // node of zone a.
            assert_eq!(placed(&yaml), ["a1", "b1", "a2"], "{kind}");
        }
        let job = web("Job", 3)
            .replace("apps/v1", "batch/v1")
            .replace("replicas", "parallelism")
            .replace("  selector: {matchLabels: {app: web}}\n", "");
        assert_eq!(
            placed(&format!("{NODES}{job}")),
            ["a1", "a2", "b1"],
            "nothing kube-scheduler follows selects a Job's pods"
        );
        let service = "---\napiVersion: v1\nkind: Service\nmetadata: {name: web}\n\
                       spec: {selector: {app: web}}\n";
        let yaml = format!("{NODES}{job}{service}");
        assert_eq!(placed(&yaml), ["a1", "b1", "a2"], "a Service selects them");
    }
}
