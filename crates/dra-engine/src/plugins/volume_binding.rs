//! VolumeBinding: the pod's PersistentVolumeClaims (and the claims of its generic ephemeral
//! volumes, named `<pod>-<volume>`) must be bound to volumes the node can reach, or be
//! bindable there, as kube-scheduler v1.37's plugin and its volume binder decide.
//!
//! - PreFilter: every claim exists (an ephemeral one is owned by the pod), is not lost or
//!   being deleted; a claim of an `Immediate` class that is not bound yet keeps the pod
//!   waiting for the PV controller ("pod has unbound immediate PersistentVolumeClaims").
//! - Filter: a bound claim's volume must exist and its node affinity match the node. A
//!   `WaitForFirstConsumer` claim gets the smallest Available volume of its class that fits
//!   (size, access modes, volumeMode, volumeAttributesClass, selector, node affinity), as
//!   upstream's `FindMatchingVolume`; failing that, it is provisioned if its class has a
//!   provisioner whose `allowedTopologies` admit the node. A claim already given a node
//!   (`volume.kubernetes.io/selected-node`) fits that node only.
//! - Score (StorageCapacityScoring, beta and on in 1.37): for volumes bound statically,
//!   the default shape prefers the node whose chosen volumes leave the most room
//!   (100 at 0% used, 0 at 100%), averaged over storage classes.
//! - Reserve: the decisions for the chosen node go into the placement
//!   ([`crate::VolumeDecision`]); the binder writes them before anything else (PreBind) and
//!   waits until the PV controller has bound every claim.
//!
//! Not here: CSIStorageCapacity objects are not read, so a pod whose claim would be
//! provisioned by a CSI driver with `storageCapacity: true` is refused with that named
//! (never placed as if there were room); in-tree volumes are checked with their own node
//! affinity, not the one their CSI translation would have.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use dra_cel::Quantity;
use k8s_openapi::api::core::v1::{
    Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::node_affinity::node_selector_terms_match;
use crate::engine::{Placement, VolumeDecision};
use crate::framework::{Cycle, MAX_NODE_SCORE, Plugin, PluginCycle, Point, Status};
use crate::state::{NodeInfo, ObjectKey, Volumes};

pub struct VolumeBinding;

/// Set by the PV controller on a claim whose binding it completed.
pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// Set on a volume bound by a controller (or the scheduler) rather than pre-bound by a user.
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// The node a claim is to be provisioned for.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// The class annotation that predates `storageClassName` and still wins over it.
pub const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
/// A provisioner that provisions nothing: volumes of the class are created by hand.
pub const NOT_SUPPORTED_PROVISIONER: &str = "kubernetes.io/no-provisioner";

pub const REASON_BIND_CONFLICT: &str = "node(s) didn't find available persistent volumes to bind";
pub const REASON_NODE_CONFLICT: &str = "node(s) didn't match PersistentVolume's node affinity";
pub const REASON_NOT_ENOUGH_SPACE: &str = "node(s) did not have enough free storage";
pub const REASON_PV_NOT_EXIST: &str =
    "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)";
pub const REASON_UNBOUND_IMMEDIATE: &str = "pod has unbound immediate PersistentVolumeClaims";

/// The default scoring shape with StorageCapacityScoring on: (utilization %, score).
const SHAPE: [(i64, i64); 2] = [(0, MAX_NODE_SCORE), (100, 0)];

/// A claim the pod's volumes name, with whether it belongs to a generic ephemeral volume.
pub struct PodClaim<'a> {
    pub volume: &'a Volume,
    pub name: String,
    pub ephemeral: bool,
}

/// The claims the pod's volumes use, in volume order.
pub fn pod_claims(pod: &Pod) -> Vec<PodClaim<'_>> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_deref());
    volumes
        .unwrap_or_default()
        .iter()
        .filter_map(|v| {
            if let Some(pvc) = &v.persistent_volume_claim {
                Some(PodClaim {
                    volume: v,
                    name: pvc.claim_name.clone(),
                    ephemeral: false,
                })
            } else {
                v.ephemeral.as_ref().map(|_| PodClaim {
                    volume: v,
                    name: format!("{pod_name}-{}", v.name),
                    ephemeral: true,
                })
            }
        })
        .collect()
}

fn namespace_of(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// An ephemeral volume's claim must be the pod's own (its controller, by UID), as the
/// ephemeral volume controller makes it; another object of that name is not used.
pub fn ephemeral_claim_is_for_pod(pod: &Pod, pvc: &PersistentVolumeClaim) -> Result<(), String> {
    let ns = namespace_of(pod);
    let pvc_ns = pvc.metadata.namespace.as_deref().unwrap_or("default");
    let controlled = pvc.metadata.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true) && o.uid == pod.metadata.uid.clone().unwrap_or_default()
    });
    if pvc_ns != ns || !controlled {
        return Err(format!(
            "PVC {pvc_ns}/{} was not created for pod {ns}/{} (pod is not owner)",
            pvc.metadata.name.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default()
        ));
    }
    Ok(())
}

/// The claim's storage class: the beta annotation, else `storageClassName`, else "".
pub fn claim_class(pvc: &PersistentVolumeClaim) -> &str {
    if let Some(class) = annotation(&pvc.metadata, ANN_BETA_STORAGE_CLASS) {
        return class;
    }
    pvc.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or_default()
}

/// The volume's storage class: the beta annotation, else `storageClassName`.
pub fn volume_class(pv: &PersistentVolume) -> &str {
    if let Some(class) = annotation(&pv.metadata, ANN_BETA_STORAGE_CLASS) {
        return class;
    }
    pv.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or_default()
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The claim's volume name, "" when it names none.
pub fn claim_volume_name(pvc: &PersistentVolumeClaim) -> &str {
    pvc.spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .unwrap_or_default()
}

/// Bound as the scheduler counts it: a volume named and the PV controller done with it.
pub fn is_fully_bound(pvc: &PersistentVolumeClaim) -> bool {
    !claim_volume_name(pvc).is_empty() && annotation(&pvc.metadata, ANN_BIND_COMPLETED).is_some()
}

/// Whether the volume's required node affinity admits a node with these labels (only the
/// labels: as upstream's `CheckNodeAffinity`, a term on `metadata.name` matches nothing).
pub fn volume_node_affinity_matches(
    pv: &PersistentVolume,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    let Some(required) = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
    else {
        return true;
    };
    let node = Node {
        metadata: ObjectMeta {
            labels: labels.cloned(),
            ..Default::default()
        },
        ..Default::default()
    };
    node_selector_terms_match(&required.node_selector_terms, &node)
}

fn storage_request(pvc: &PersistentVolumeClaim) -> Quantity {
    pvc.spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| q.0.parse().ok())
        .unwrap_or_default()
}

fn storage_capacity(pv: &PersistentVolume) -> Quantity {
    pv.spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(|q| q.0.parse().ok())
        .unwrap_or_default()
}

/// Whether the volume's `claimRef` names this claim (by UID too, when it has one).
pub fn is_volume_bound_to_claim(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> bool {
    let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return false;
    };
    if r.name.as_deref() != pvc.metadata.name.as_deref()
        || r.namespace.as_deref() != pvc.metadata.namespace.as_deref()
    {
        return false;
    }
    let uid = r.uid.as_deref().unwrap_or_default();
    uid.is_empty() || Some(uid) == pvc.metadata.uid.as_deref()
}

fn binding_mode_is_delayed(pvc: &PersistentVolumeClaim, volumes: &Volumes) -> Result<bool, String> {
    let class = claim_class(pvc);
    if class.is_empty() {
        return Ok(false);
    }
    let Some(sc) = volumes.storage_classes.get(class) else {
        return Ok(false);
    };
    match sc.volume_binding_mode.as_deref() {
        None => Err(format!(
            "VolumeBindingMode not set for StorageClass {class:?}"
        )),
        Some(mode) => Ok(mode == "WaitForFirstConsumer"),
    }
}

/// Whether a label selector selects these labels; `Err` for a selector the API server
/// would not turn into one (an unknown operator, values where none belong).
pub fn label_selector_matches(
    selector: &LabelSelector,
    labels: Option<&BTreeMap<String, String>>,
) -> Result<bool, String> {
    let get = |k: &str| labels.and_then(|l| l.get(k));
    let mut matches = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| get(k) == Some(v));
    for r in selector.match_expressions.iter().flatten() {
        let values = r.values.as_deref().unwrap_or_default();
        let value = get(&r.key);
        let ok = match r.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(format!(
                    "{}: values must be non-empty for {}",
                    r.key, r.operator
                ));
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(format!(
                    "{}: values must be empty for {}",
                    r.key, r.operator
                ));
            }
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => return Err(format!("{other:?} is not a valid label selector operator")),
        };
        matches &= ok;
    }
    Ok(matches)
}

/// The volumes and claims of the pod, sorted once per attempt.
struct Claims<'a> {
    bound: Vec<&'a PersistentVolumeClaim>,
    delayed: Vec<&'a PersistentVolumeClaim>,
    immediate: usize,
    /// The volumes of each delayed claim's class, by name.
    volumes_by_class: HashMap<&'a str, Vec<&'a PersistentVolume>>,
}

/// What the pod's volumes need on one node.
#[derive(Clone, Default)]
struct PodVolumes<'a> {
    /// Unbound claims and the existing volume each is to be bound to.
    static_bindings: Vec<(&'a PersistentVolumeClaim, &'a PersistentVolume)>,
    /// Unbound claims to be provisioned for the node.
    provisions: Vec<&'a PersistentVolumeClaim>,
}

struct BindingCycle<'a> {
    cycle: &'a Cycle<'a>,
    claims: Option<Claims<'a>>,
    /// What Filter found per feasible node, for Score and Reserve.
    nodes: Mutex<HashMap<String, PodVolumes<'a>>>,
}

impl Plugin for VolumeBinding {
    fn name(&self) -> &'static str {
        "VolumeBinding"
    }

    fn points(&self) -> &'static [Point] {
        super::points_of("VolumeBinding").unwrap_or_default()
    }

    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(BindingCycle {
            cycle,
            claims: None,
            nodes: Mutex::new(HashMap::new()),
        })
    }
}

impl<'a> BindingCycle<'a> {
    /// The pod's claims, each checked as upstream's `podHasPVCs`.
    fn lookup(&self) -> Result<Vec<&'a PersistentVolumeClaim>, String> {
        let cx = self.cycle;
        let ns = namespace_of(cx.pod);
        let mut found = Vec::new();
        for claim in pod_claims(cx.pod) {
            let key = ObjectKey::new(ns, claim.name.as_str());
            let Some(pvc) = cx.state.volumes.claims.get(&key) else {
                return Err(if claim.ephemeral {
                    format!(
                        "waiting for ephemeral volume controller to create the persistentvolumeclaim {:?}",
                        claim.name
                    )
                } else {
                    format!("persistentvolumeclaim {:?} not found", claim.name)
                });
            };
            if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Lost") {
                return Err(format!(
                    "persistentvolumeclaim {:?} bound to non-existent persistentvolume {:?}",
                    claim.name,
                    claim_volume_name(pvc)
                ));
            }
            if pvc.metadata.deletion_timestamp.is_some() {
                return Err(format!(
                    "persistentvolumeclaim {:?} is being deleted",
                    claim.name
                ));
            }
            if claim.ephemeral {
                ephemeral_claim_is_for_pod(cx.pod, pvc)?;
            }
            found.push(pvc);
        }
        Ok(found)
    }

    /// Sort the claims into bound, delayed and immediate (`GetPodVolumeClaims`).
    fn sort(&self, pvcs: Vec<&'a PersistentVolumeClaim>) -> Result<Claims<'a>, String> {
        let volumes = &self.cycle.state.volumes;
        let mut claims = Claims {
            bound: Vec::new(),
            delayed: Vec::new(),
            immediate: 0,
            volumes_by_class: HashMap::new(),
        };
        for pvc in pvcs {
            if is_fully_bound(pvc) {
                claims.bound.push(pvc);
            } else if binding_mode_is_delayed(pvc, volumes)? && claim_volume_name(pvc).is_empty() {
                claims.delayed.push(pvc);
            } else {
                claims.immediate += 1;
            }
        }
        for pvc in &claims.delayed {
            let class = claim_class(pvc);
            claims.volumes_by_class.entry(class).or_insert_with(|| {
                volumes
                    .persistent_volumes
                    .values()
                    .filter(|pv| volume_class(pv) == class)
                    .collect()
            });
        }
        Ok(claims)
    }

    /// `FindPodVolumes`: the reasons the node does not fit, or what its volumes need there.
    fn find(&self, claims: &Claims<'a>, node: &Node) -> Result<PodVolumes<'a>, Status> {
        let volumes = &self.cycle.state.volumes;
        let labels = node.metadata.labels.as_ref();
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let mut found = PodVolumes::default();
        let mut bound_satisfied = true;
        let mut unbound_satisfied = true;
        let mut enough_space = true;
        let mut bound_found = true;
        for pvc in &claims.bound {
            match volumes.persistent_volumes.get(claim_volume_name(pvc)) {
                None => {
                    bound_found = false;
                    break;
                }
                Some(pv) if !volume_node_affinity_matches(pv, labels) => {
                    bound_satisfied = false;
                    break;
                }
                Some(_) => {}
            }
        }
        'unbound: {
            if claims.delayed.is_empty() {
                break 'unbound;
            }
            let mut to_match = Vec::new();
            let mut to_provision = Vec::new();
            for pvc in &claims.delayed {
                match annotation(&pvc.metadata, ANN_SELECTED_NODE) {
                    Some(selected) if selected != name => {
                        unbound_satisfied = false;
                        break 'unbound;
                    }
                    Some(_) => to_provision.push(*pvc),
                    None => to_match.push(*pvc),
                }
            }
            if !to_match.is_empty() {
                let (all, bindings, unmatched) = self.match_volumes(claims, to_match, node)?;
                unbound_satisfied = all;
                found.static_bindings = bindings;
                to_provision.extend(unmatched);
            }
            if !to_provision.is_empty() {
                let (satisfied, sufficient, provisions) = self.provisions(to_provision, node)?;
                unbound_satisfied = satisfied;
                enough_space = sufficient;
                found.provisions = provisions;
            }
        }
        let reasons: Vec<String> = [
            (!bound_satisfied, REASON_NODE_CONFLICT),
            (!unbound_satisfied, REASON_BIND_CONFLICT),
            (!enough_space, REASON_NOT_ENOUGH_SPACE),
            (!bound_found, REASON_PV_NOT_EXIST),
        ]
        .into_iter()
        .filter(|(failed, _)| *failed)
        .map(|(_, reason)| reason.to_string())
        .collect();
        if reasons.is_empty() {
            Ok(found)
        } else {
            Err(Status::new(
                crate::framework::Code::UnschedulableAndUnresolvable,
                reasons,
            ))
        }
    }

    /// `findMatchingVolumes`: claims smallest first, each the smallest fitting volume not
    /// chosen for an earlier one. Returns whether all matched, the bindings and the rest.
    #[allow(clippy::type_complexity)]
    fn match_volumes(
        &self,
        claims: &Claims<'a>,
        mut to_match: Vec<&'a PersistentVolumeClaim>,
        node: &Node,
    ) -> Result<
        (
            bool,
            Vec<(&'a PersistentVolumeClaim, &'a PersistentVolume)>,
            Vec<&'a PersistentVolumeClaim>,
        ),
        Status,
    > {
        to_match.sort_by_key(|pvc| storage_request(pvc));
        let mut chosen: Vec<&str> = Vec::new();
        let mut bindings = Vec::new();
        let mut unmatched = Vec::new();
        for pvc in to_match {
            let candidates = claims
                .volumes_by_class
                .get(claim_class(pvc))
                .map(Vec::as_slice)
                .unwrap_or_default();
            match find_matching_volume(pvc, candidates, node, &chosen).map_err(Status::error)? {
                Some(pv) => {
                    chosen.push(pv.metadata.name.as_deref().unwrap_or_default());
                    bindings.push((pvc, pv));
                }
                None => unmatched.push(pvc),
            }
        }
        Ok((unmatched.is_empty(), bindings, unmatched))
    }

    /// `checkVolumeProvisions`: whether every claim can be provisioned for the node.
    /// Returns (provisioning possible, enough space, the claims).
    fn provisions(
        &self,
        claims: Vec<&'a PersistentVolumeClaim>,
        node: &Node,
    ) -> Result<(bool, bool, Vec<&'a PersistentVolumeClaim>), Status> {
        let volumes = &self.cycle.state.volumes;
        for pvc in &claims {
            let key = ObjectKey::of(&pvc.metadata);
            let class = claim_class(pvc);
            if class.is_empty() {
                return Err(Status::error(format!(
                    "no class for claim {:?}",
                    key.to_string()
                )));
            }
            let Some(sc) = volumes.storage_classes.get(class) else {
                return Err(Status::error(format!(
                    "failed to find storage class {class:?}"
                )));
            };
            if sc.provisioner.is_empty() || sc.provisioner == NOT_SUPPORTED_PROVISIONER {
                return Ok((false, true, Vec::new()));
            }
            if !allowed_topologies_match(sc, node.metadata.labels.as_ref()) {
                return Ok((false, true, Vec::new()));
            }
            let tracks_capacity = volumes
                .csi_drivers
                .get(&sc.provisioner)
                .and_then(|d| d.spec.storage_capacity)
                .unwrap_or(false);
            let requests_storage = pvc
                .spec
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .is_some_and(|r| r.contains_key("storage"));
            if tracks_capacity && requests_storage {
                return Err(Status::unresolvable(format!(
                    "PersistentVolumeClaim {key} would be provisioned by CSIDriver {} with storageCapacity: true; CSIStorageCapacity is not supported by dra-scheduler yet",
                    sc.provisioner
                )));
            }
        }
        Ok((true, true, claims))
    }
}

/// `FindMatchingVolume` for a delayed-binding claim on a node: a volume already bound to
/// the claim wins (if the node can reach it); otherwise the smallest Available one that
/// fits. `Err` for a claim whose selector is not valid.
fn find_matching_volume<'v>(
    pvc: &PersistentVolumeClaim,
    volumes: &[&'v PersistentVolume],
    node: &Node,
    excluded: &[&str],
) -> Result<Option<&'v PersistentVolume>, String> {
    let spec = pvc.spec.clone().unwrap_or_default();
    let requested = storage_request(pvc);
    let class = claim_class(pvc);
    let mode = |m: Option<&String>| m.map_or("Filesystem", |m| m.as_str()).to_string();
    let mut smallest: Option<(&PersistentVolume, Quantity)> = None;
    for pv in volumes.iter().copied() {
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        if excluded.contains(&name) {
            continue;
        }
        let pv_spec = pv.spec.clone().unwrap_or_default();
        let bound_here = is_volume_bound_to_claim(pv, pvc);
        if pv_spec.claim_ref.is_some() && !bound_here {
            continue;
        }
        let capacity = storage_capacity(pv);
        if capacity < requested {
            continue;
        }
        if mode(spec.volume_mode.as_ref()) != mode(pv_spec.volume_mode.as_ref()) {
            continue;
        }
        if spec
            .volume_attributes_class_name
            .as_deref()
            .unwrap_or_default()
            != pv_spec
                .volume_attributes_class_name
                .as_deref()
                .unwrap_or_default()
        {
            continue;
        }
        if pv.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let reachable = volume_node_affinity_matches(pv, node.metadata.labels.as_ref());
        if bound_here {
            return Ok(reachable.then_some(pv));
        }
        if pv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Available") {
            continue;
        }
        if let Some(selector) = &spec.selector {
            let selected =
                label_selector_matches(selector, pv.metadata.labels.as_ref()).map_err(|e| {
                    format!(
                        "error creating internal label selector for claim: {}: {e}",
                        ObjectKey::of(&pvc.metadata)
                    )
                })?;
            if !selected {
                continue;
            }
        }
        if volume_class(pv) != class || !reachable {
            continue;
        }
        let modes = pv_spec.access_modes.unwrap_or_default();
        if !spec
            .access_modes
            .iter()
            .flatten()
            .all(|m| modes.contains(m))
        {
            continue;
        }
        if smallest.as_ref().is_none_or(|(_, q)| *q > capacity) {
            smallest = Some((pv, capacity));
        }
    }
    Ok(smallest.map(|(pv, _)| pv))
}

/// A class's `allowedTopologies` against the node's labels: no terms admit every node; a
/// term admits it when each of its expressions has the node's value among its values.
pub fn allowed_topologies_match(
    class: &StorageClass,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    let terms = class.allowed_topologies.as_deref().unwrap_or_default();
    if terms.is_empty() {
        return true;
    }
    terms.iter().any(|term| {
        let exprs = term.match_label_expressions.as_deref().unwrap_or_default();
        !exprs.is_empty()
            && exprs.iter().all(|e| {
                !e.values.is_empty()
                    && labels
                        .and_then(|l| l.get(&e.key))
                        .is_some_and(|v| e.values.contains(v))
            })
    })
}

/// The claim reference a volume gets for a claim (as `reference.GetReference` makes it).
fn claim_reference(pvc: &PersistentVolumeClaim) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        name: pvc.metadata.name.clone(),
        namespace: pvc.metadata.namespace.clone(),
        uid: pvc.metadata.uid.clone(),
        resource_version: pvc.metadata.resource_version.clone(),
        ..Default::default()
    }
}

/// The volume as binding it to the claim writes it (`GetBindVolumeToClaim`).
pub fn bind_volume_to_claim(
    pv: &PersistentVolume,
    pvc: &PersistentVolumeClaim,
) -> PersistentVolume {
    let mut bound = pv.clone();
    let already = is_volume_bound_to_claim(pv, pvc);
    let spec = bound.spec.get_or_insert_with(Default::default);
    let r = spec.claim_ref.as_ref();
    if r.is_none_or(|r| {
        r.name != pvc.metadata.name
            || r.namespace != pvc.metadata.namespace
            || r.uid != pvc.metadata.uid
    }) {
        spec.claim_ref = Some(claim_reference(pvc));
    }
    if !already {
        bound
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .entry(ANN_BOUND_BY_CONTROLLER.to_string())
            .or_insert_with(|| "yes".to_string());
    }
    bound
}

/// The score of one node: per class, how full the chosen volumes are, through the shape.
fn capacity_score(volumes: &PodVolumes<'_>) -> i64 {
    let mut classes: BTreeMap<&str, (i128, i128)> = BTreeMap::new();
    for (pvc, pv) in &volumes.static_bindings {
        let entry = classes.entry(volume_class(pv)).or_default();
        entry.0 += i128::from(storage_request(pvc).value().unwrap_or(i64::MAX));
        entry.1 += i128::from(storage_capacity(pv).value().unwrap_or(i64::MAX));
    }
    if classes.is_empty() {
        return 0;
    }
    let total: i64 = classes
        .values()
        .map(|&(requested, capacity)| {
            let utilization = if capacity == 0 || requested > capacity {
                100
            } else {
                (requested * 100 / capacity) as i64
            };
            shape(utilization)
        })
        .sum();
    (total as f64 / classes.len() as f64).round() as i64
}

/// The broken-line function through [`SHAPE`].
fn shape(utilization: i64) -> i64 {
    for (i, &(u, score)) in SHAPE.iter().enumerate() {
        if utilization <= u {
            if i == 0 {
                return score;
            }
            let (pu, ps) = SHAPE[i - 1];
            return ps + (score - ps) * (utilization - pu) / (u - pu);
        }
    }
    SHAPE[SHAPE.len() - 1].1
}

impl PluginCycle for BindingCycle<'_> {
    fn pre_filter(&mut self) -> Status {
        let pvcs = match self.lookup() {
            Ok(pvcs) => pvcs,
            Err(message) => return Status::unresolvable(message),
        };
        if pvcs.is_empty() {
            return Status::skip();
        }
        let claims = match self.sort(pvcs) {
            Ok(c) => c,
            Err(message) => return Status::error(message),
        };
        if claims.immediate > 0 {
            return Status::unresolvable(REASON_UNBOUND_IMMEDIATE);
        }
        self.claims = Some(claims);
        Status::success()
    }

    fn filter(&self, node: &NodeInfo) -> Status {
        let Some(claims) = &self.claims else {
            return Status::success();
        };
        match self.find(claims, &node.node) {
            Ok(volumes) => {
                self.nodes
                    .lock()
                    .expect("not poisoned")
                    .insert(node.name().to_string(), volumes);
                Status::success()
            }
            Err(status) => status,
        }
    }

    fn pre_score(&mut self, _feasible: &[&NodeInfo]) -> Status {
        // With StorageCapacityScoring on, upstream scores every pod (zero for nodes
        // without volume decisions).
        Status::success()
    }

    fn score(&self, node: &NodeInfo) -> Result<i64, Status> {
        let nodes = self.nodes.lock().expect("not poisoned");
        Ok(nodes.get(node.name()).map_or(0, capacity_score))
    }

    fn reserve(&mut self, node: &NodeInfo, placement: &mut Placement) -> Status {
        let Some(volumes) = self
            .nodes
            .get_mut()
            .expect("not poisoned")
            .remove(node.name())
        else {
            return Status::success();
        };
        for (pvc, pv) in volumes.static_bindings {
            placement.volumes.push(VolumeDecision::Bind {
                claim: ObjectKey::of(&pvc.metadata),
                volume: bind_volume_to_claim(pv, pvc),
                before: pv.clone(),
            });
        }
        for pvc in volumes.provisions {
            placement.volumes.push(VolumeDecision::Provision {
                claim: ObjectKey::of(&pvc.metadata),
                node: node.name().to_string(),
                before: pvc.clone(),
            });
        }
        Status::success()
    }
}

/// Small builders for the volume plugins' scenarios.
#[cfg(test)]
pub(crate) mod fixtures {
    use serde_json::{Value, json};

    use crate::{ClusterInput, Decision, Engine, EngineConfig, ObjectKey, Placement};

    /// A Kubernetes object being built, as JSON.
    pub struct Object(pub Value);

    impl Object {
        /// Set the field at a dotted path (`spec.capacity.storage`), making the maps on the way.
        pub fn set(mut self, path: &str, value: Value) -> Self {
            let mut at = &mut self.0;
            let parts: Vec<&str> = path.split('.').collect();
            for part in &parts[..parts.len() - 1] {
                at = at
                    .as_object_mut()
                    .expect("a map")
                    .entry(part.to_string())
                    .or_insert_with(|| json!({}));
            }
            at[parts[parts.len() - 1]] = value;
            self
        }

        fn kind(&self) -> &str {
            self.0["kind"].as_str().unwrap_or_default()
        }

        pub fn label(mut self, key: &str, value: &str) -> Self {
            self.0["metadata"]["labels"][key] = json!(value);
            self
        }

        pub fn annotate(mut self, key: &str, value: &str) -> Self {
            self.0["metadata"]["annotations"][key] = json!(value);
            self
        }

        pub fn zone(self, zone: &str) -> Self {
            self.label("topology.kubernetes.io/zone", zone)
        }

        pub fn class(self, class: &str) -> Self {
            self.set("spec.storageClassName", json!(class))
        }

        pub fn modes(self, modes: &[&str]) -> Self {
            self.set("spec.accessModes", json!(modes))
        }

        /// A volume reachable only from this node (a local volume).
        pub fn on_node(self, node: &str) -> Self {
            self.set(
                "spec.nodeAffinity",
                json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}),
            )
        }

        /// A volume whose claimRef names the claim (the PV side of a binding).
        pub fn claimed_by(self, claim: &str) -> Self {
            self.set(
                "spec.claimRef",
                json!({"namespace": "default", "name": claim}),
            )
            .set("status.phase", json!("Bound"))
        }

        /// A claim the PV controller has bound to the volume.
        pub fn bound_to(self, volume: &str) -> Self {
            self.set("spec.volumeName", json!(volume))
                .annotate(super::ANN_BIND_COMPLETED, "yes")
                .set("status.phase", json!("Bound"))
        }

        /// A pod volume using the claim.
        pub fn claim(self, volume: &str, claim: &str) -> Self {
            self.volume(json!({"name": volume, "persistentVolumeClaim": {"claimName": claim}}))
        }

        /// A generic ephemeral volume of the pod.
        pub fn ephemeral(self, volume: &str) -> Self {
            self.volume(
                json!({"name": volume, "ephemeral": {"volumeClaimTemplate": {
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}}}}}),
            )
        }

        pub fn volume(mut self, volume: Value) -> Self {
            let volumes = &mut self.0["spec"]["volumes"];
            if volumes.is_null() {
                *volumes = json!([]);
            }
            volumes.as_array_mut().expect("a list").push(volume);
            self
        }

        /// A pod bound to the node.
        pub fn on(self, node: &str) -> Self {
            self.set("spec.nodeName", json!(node))
        }

        /// An ephemeral volume's claim, as the controller makes it for the pod.
        pub fn owned_by_pod(self, pod: &str, uid: &str) -> Self {
            self.set(
                "metadata.ownerReferences",
                json!([{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid,
                        "controller": true}]),
            )
        }
    }

    pub fn node(name: &str) -> Object {
        Object(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"}}}))
    }

    /// An Available volume of `size`, ReadWriteOnce.
    pub fn pv(name: &str, size: &str) -> Object {
        Object(json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "resourceVersion": "7"},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                     "hostPath": {"path": format!("/mnt/{name}")}},
            "status": {"phase": "Available"}}))
    }

    /// A claim in `default` asking for `size`, ReadWriteOnce.
    pub fn pvc(name: &str, size: &str) -> Object {
        Object(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                         "resourceVersion": "3"},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": size}}}}))
    }

    /// A StorageClass; `mode` is `Immediate` or `WaitForFirstConsumer`.
    pub fn storage_class(name: &str, provisioner: &str, mode: &str) -> Object {
        Object(
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name}, "provisioner": provisioner,
            "volumeBindingMode": mode}),
        )
    }

    /// A CSINode saying how many volumes each driver may attach to the node.
    pub fn csi_node(name: &str, drivers: &[(&str, i32)]) -> Object {
        let drivers: Vec<Value> = drivers
            .iter()
            .map(|(d, n)| json!({"name": d, "nodeID": name, "allocatable": {"count": n}}))
            .collect();
        Object(json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
            "metadata": {"name": name}, "spec": {"drivers": drivers}}))
    }

    pub fn csi_driver(name: &str) -> Object {
        Object(
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": name}, "spec": {}}),
        )
    }

    pub fn pod(name: &str) -> Object {
        Object(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "spec": {"schedulerName": "dra-scheduler", "containers": [{"name": "c",
                "resources": {"requests": {"cpu": "100m"}}}]}}))
    }

    fn from<T: serde::de::DeserializeOwned>(o: Object) -> T {
        serde_json::from_value(o.0).expect("a valid object")
    }

    /// The cluster of these objects.
    pub fn cluster(objects: Vec<Object>) -> ClusterInput {
        let mut input = ClusterInput::default();
        for o in objects {
            match o.kind() {
                "Node" => input.nodes.push(from(o)),
                "Pod" => input.pods.push(from(o)),
                "PersistentVolume" => input.persistent_volumes.push(from(o)),
                "PersistentVolumeClaim" => input.persistent_volume_claims.push(from(o)),
                "StorageClass" => input.storage_classes.push(from(o)),
                "CSINode" => input.csi_nodes.push(from(o)),
                "CSIDriver" => input.csi_drivers.push(from(o)),
                other => panic!("no builder for {other}"),
            }
        }
        input
    }

    pub fn engine(objects: Vec<Object>) -> Engine {
        Engine::new(EngineConfig::default(), cluster(objects))
    }

    pub fn key(name: &str) -> ObjectKey {
        ObjectKey::new("default", name)
    }

    /// The pod's placement; panics with the message when it is not placed.
    pub fn placed(engine: &mut Engine, pod: &str) -> Placement {
        match engine.schedule(&key(pod)) {
            Decision::Scheduled(p) => p,
            other => panic!("pod {pod} not placed: {:?}", other.message()),
        }
    }

    /// Why the pod is not placed.
    pub fn refused(engine: &mut Engine, pod: &str) -> String {
        match engine.schedule(&key(pod)) {
            Decision::Scheduled(p) => panic!("pod {pod} placed on {}", p.node),
            other => other.message().unwrap_or_default().to_string(),
        }
    }

    /// The nodes the pod fits on, by name.
    pub fn feasible(engine: &mut Engine, pod: &str) -> Vec<String> {
        engine.evaluate(&key(pod)).feasible
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;
    use serde_json::json;

    fn local_class() -> Object {
        storage_class("local", NOT_SUPPORTED_PROVISIONER, "WaitForFirstConsumer")
    }

    #[test]
    fn a_claim_bound_to_a_local_volume_keeps_the_pod_on_the_volumes_node() {
        let mut engine = engine(vec![
            node("n1"),
            node("n2"),
            pv("pv1", "10Gi")
                .class("local")
                .on_node("n2")
                .claimed_by("data"),
            pvc("data", "10Gi").class("local").bound_to("pv1"),
            pod("p").claim("data", "data"),
        ]);
        let placement = placed(&mut engine, "p");
        assert_eq!(placement.node, "n2");
        assert!(placement.volumes.is_empty(), "nothing to bind");
        let why = engine.evaluate(&key("p")).unfit["n1"].clone();
        assert_eq!(why, REASON_NODE_CONFLICT);
    }

    #[test]
    fn a_claim_bound_to_a_volume_that_is_gone_says_so() {
        let objects = || {
            vec![
                node("n1"),
                pvc("data", "10Gi").class("local").bound_to("pv-gone"),
                pod("p").claim("data", "data"),
            ]
        };
        // VolumeZone's PreFilter looks the volume up first, as upstream's does.
        assert_eq!(
            refused(&mut engine(objects()), "p"),
            "0/1 nodes are available: persistentvolume \"pv-gone\" not found."
        );
        let mut config = crate::EngineConfig::default();
        config.profile.disable("VolumeZone");
        let mut engine = crate::Engine::new(config, cluster(objects()));
        assert_eq!(
            refused(&mut engine, "p"),
            format!("0/1 nodes are available: 1 {REASON_PV_NOT_EXIST}.")
        );
    }

    #[test]
    fn a_pod_whose_claim_does_not_exist_waits_with_the_claims_name() {
        let mut engine = engine(vec![node("n1"), pod("p").claim("data", "nope")]);
        assert_eq!(
            refused(&mut engine, "p"),
            "0/1 nodes are available: persistentvolumeclaim \"nope\" not found."
        );
    }

    #[test]
    fn an_immediate_claim_not_bound_yet_waits_for_the_pv_controller() {
        let mut engine = engine(vec![
            node("n1"),
            storage_class("fast", "example.com/csi", "Immediate"),
            pv("pv1", "10Gi").class("fast"),
            pvc("data", "10Gi").class("fast"),
            pod("p").claim("data", "data"),
        ]);
        assert_eq!(
            refused(&mut engine, "p"),
            format!("0/1 nodes are available: {REASON_UNBOUND_IMMEDIATE}.")
        );
    }

    #[test]
    fn wait_for_first_consumer_binds_a_local_volume_on_a_node_that_reaches_it() {
        let mut engine = engine(vec![
            node("n1"),
            node("n2"),
            node("n3"),
            local_class(),
            pv("big", "100Gi").class("local").on_node("n1"),
            pv("small", "10Gi").class("local").on_node("n2"),
            pv("tiny", "1Gi").class("local").on_node("n3"),
            pvc("data", "5Gi").class("local"),
            pod("p").claim("data", "data"),
        ]);
        let evaluation = engine.evaluate(&key("p"));
        assert_eq!(evaluation.feasible, ["n1", "n2"]);
        assert_eq!(
            evaluation.unfit["n3"], REASON_BIND_CONFLICT,
            "1Gi is too small"
        );
        // The default shape scores room left: 5 of 100Gi used beats 5 of 10Gi.
        let scores = &evaluation.plugin_scores["VolumeBinding"];
        assert_eq!((scores["n1"], scores["n2"]), (95, 50));
        let placement = placed(&mut engine, "p");
        assert_eq!(placement.node, "n1");
        let [VolumeDecision::Bind { claim, volume, .. }] = placement.volumes.as_slice() else {
            panic!("one binding: {:?}", placement.volumes);
        };
        assert_eq!(claim, &key("data"));
        assert_eq!(volume.metadata.name.as_deref(), Some("big"));
        let claim_ref = volume.spec.as_ref().unwrap().claim_ref.as_ref().unwrap();
        assert_eq!(
            (
                claim_ref.namespace.as_deref(),
                claim_ref.name.as_deref(),
                claim_ref.uid.as_deref()
            ),
            (Some("default"), Some("data"), Some("uid-data"))
        );
        assert_eq!(
            annotation(&volume.metadata, ANN_BOUND_BY_CONTROLLER),
            Some("yes")
        );
    }

    #[test]
    fn the_smallest_volume_that_fits_is_chosen_on_a_node() {
        let mut engine = engine(vec![
            node("n1"),
            local_class(),
            pv("a-large", "50Gi").class("local").on_node("n1"),
            pv("b-fits", "6Gi").class("local").on_node("n1"),
            pv("c-small", "4Gi").class("local").on_node("n1"),
            pvc("data", "5Gi").class("local"),
            pod("p").claim("data", "data"),
        ]);
        let placement = placed(&mut engine, "p");
        let VolumeDecision::Bind { volume, .. } = &placement.volumes[0] else {
            panic!("a binding");
        };
        assert_eq!(volume.metadata.name.as_deref(), Some("b-fits"));
    }

    #[test]
    fn a_volume_must_match_access_modes_volume_mode_class_and_selector() {
        let mut engine = engine(vec![
            node("n1"),
            local_class(),
            storage_class("other", NOT_SUPPORTED_PROVISIONER, "WaitForFirstConsumer"),
            pv("rwx-only", "10Gi")
                .class("local")
                .on_node("n1")
                .modes(&["ReadWriteMany"]),
            pv("block", "10Gi")
                .class("local")
                .on_node("n1")
                .set("spec.volumeMode", json!("Block")),
            pv("other-class", "10Gi").class("other").on_node("n1"),
            pv("unlabelled", "10Gi").class("local").on_node("n1"),
            pv("released", "10Gi")
                .class("local")
                .on_node("n1")
                .set("status.phase", json!("Released")),
            pvc("data", "5Gi")
                .class("local")
                .set("spec.selector", json!({"matchLabels": {"tier": "gold"}})),
            pod("p").claim("data", "data"),
        ]);
        let why = engine.evaluate(&key("p")).unfit["n1"].clone();
        assert_eq!(why, REASON_BIND_CONFLICT);
        engine.volumes_mut().persistent_volumes.insert(
            "gold".into(),
            serde_json::from_value(
                pv("gold", "10Gi")
                    .class("local")
                    .on_node("n1")
                    .label("tier", "gold")
                    .0,
            )
            .unwrap(),
        );
        assert_eq!(placed(&mut engine, "p").node, "n1");
    }

    #[test]
    fn two_claims_of_a_pod_never_get_the_same_volume() {
        let mut engine = engine(vec![
            node("n1"),
            node("n2"),
            local_class(),
            pv("n1-a", "10Gi").class("local").on_node("n1"),
            pv("n2-a", "10Gi").class("local").on_node("n2"),
            pv("n2-b", "10Gi").class("local").on_node("n2"),
            pvc("logs", "1Gi").class("local"),
            pvc("data", "5Gi").class("local"),
            pod("p").claim("logs", "logs").claim("data", "data"),
        ]);
        assert_eq!(feasible(&mut engine, "p"), ["n2"]);
        let placement = placed(&mut engine, "p");
        let mut volumes: Vec<_> = placement
            .volumes
            .iter()
            .map(|d| match d {
                VolumeDecision::Bind { volume, claim, .. } => {
                    (claim.name.clone(), volume.metadata.name.clone().unwrap())
                }
                other => panic!("{other:?}"),
            })
            .collect();
        volumes.sort();
        assert_eq!(
            volumes,
            [
                ("data".into(), "n2-b".into()),
                ("logs".into(), "n2-a".into())
            ],
            "claims smallest first, each the first fitting volume by name"
        );
    }

    #[test]
    fn a_volume_taken_by_one_pod_is_not_offered_to_the_next_until_forgotten() {
        let mut engine = engine(vec![
            node("n1"),
            local_class(),
            pv("only", "10Gi").class("local").on_node("n1"),
            pvc("first", "5Gi").class("local"),
            pvc("second", "5Gi").class("local"),
            pod("p1").claim("data", "first"),
            pod("p2").claim("data", "second"),
        ]);
        let placement = placed(&mut engine, "p1");
        engine.assume(&placement);
        assert_eq!(
            refused(&mut engine, "p2"),
            format!("0/1 nodes are available: 1 {REASON_BIND_CONFLICT}.")
        );
        engine.forget(&placement);
        assert_eq!(placed(&mut engine, "p2").node, "n1");
    }

    #[test]
    fn dynamic_provisioning_follows_the_classs_allowed_topologies() {
        let mut engine = engine(vec![
            node("n1").zone("a"),
            node("n2").zone("b"),
            storage_class("zonal", "csi.example.com", "WaitForFirstConsumer").set(
                "allowedTopologies",
                json!([{"matchLabelExpressions": [
                    {"key": "topology.kubernetes.io/zone", "values": ["b"]}]}]),
            ),
            pvc("data", "5Gi").class("zonal"),
            pod("p").claim("data", "data"),
        ]);
        assert_eq!(feasible(&mut engine, "p"), ["n2"]);
        let placement = placed(&mut engine, "p");
        assert!(matches!(
            placement.volumes.as_slice(),
            [VolumeDecision::Provision { claim, node, .. }] if claim == &key("data") && node == "n2"
        ));
        engine.assume(&placement);
        let claim = &engine.state().volumes.claims[&key("data")];
        assert_eq!(annotation(&claim.metadata, ANN_SELECTED_NODE), Some("n2"));
        engine.forget(&placement);
        let claim = &engine.state().volumes.claims[&key("data")];
        assert_eq!(annotation(&claim.metadata, ANN_SELECTED_NODE), None);
    }

    #[test]
    fn a_claim_given_a_node_for_provisioning_fits_only_that_node() {
        let mut engine = engine(vec![
            node("n1"),
            node("n2"),
            storage_class("dyn", "csi.example.com", "WaitForFirstConsumer"),
            pvc("data", "5Gi")
                .class("dyn")
                .annotate(ANN_SELECTED_NODE, "n2"),
            pod("p").claim("data", "data"),
        ]);
        assert_eq!(feasible(&mut engine, "p"), ["n2"]);
    }

    #[test]
    fn a_driver_that_tracks_storage_capacity_is_refused_not_ignored() {
        let mut engine = engine(vec![
            node("n1"),
            csi_driver("csi.example.com").set("spec.storageCapacity", json!(true)),
            storage_class("dyn", "csi.example.com", "WaitForFirstConsumer"),
            pvc("data", "5Gi").class("dyn"),
            pod("p").claim("data", "data"),
        ]);
        assert!(
            refused(&mut engine, "p").contains("CSIStorageCapacity is not supported"),
            "named, not placed"
        );
    }

    #[test]
    fn a_generic_ephemeral_volume_uses_the_claim_made_for_its_pod() {
        let objects = || {
            vec![
                node("n1"),
                storage_class("dyn", "csi.example.com", "WaitForFirstConsumer"),
                pod("p")
                    .ephemeral("scratch")
                    .set("spec.storageClassName", json!(null)),
            ]
        };
        let mut engine_ = engine(objects());
        assert_eq!(
            refused(&mut engine_, "p"),
            "0/1 nodes are available: waiting for ephemeral volume controller to create the persistentvolumeclaim \"p-scratch\"."
        );
        let mut foreign = objects();
        foreign.push(
            pvc("p-scratch", "1Gi")
                .class("dyn")
                .owned_by_pod("p", "uid-other"),
        );
        assert_eq!(
            refused(&mut engine(foreign), "p"),
            "0/1 nodes are available: PVC default/p-scratch was not created for pod default/p (pod is not owner)."
        );
        let mut owned = objects();
        owned.push(
            pvc("p-scratch", "1Gi")
                .class("dyn")
                .owned_by_pod("p", "uid-p"),
        );
        let placement = placed(&mut engine(owned), "p");
        assert!(matches!(
            placement.volumes.as_slice(),
            [VolumeDecision::Provision { .. }]
        ));
    }
}
