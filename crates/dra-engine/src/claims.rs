//! One home for ResourceClaim bookkeeping: which claims a pod uses, whether a claim is
//! reserved for a pod (by UID, as upstream's `IsReservedForPod`), reserving and
//! unreserving, and whether two allocations hold the same devices. The engine's assume and
//! forget and the daemon's binder both use these.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    AllocationResult, ResourceClaim, ResourceClaimConsumerReference, ResourceClaimStatus,
};

use crate::state::{ClusterState, ObjectKey, bound_node};

/// The most consumers a claim's `status.reservedFor` may list.
pub const MAX_RESERVED_FOR: usize = 256;

/// Why a pod's claims cannot be used yet.
#[derive(Debug)]
pub struct ClaimsNotReady {
    pub message: String,
    /// A claim does not exist (yet), as opposed to existing in an unusable state.
    pub missing: bool,
    /// The claim that does not exist, when the pod names it (`None` while the claim made
    /// from a template is not named in the pod's status yet).
    pub claim: Option<ObjectKey>,
}

/// The `reservedFor` entry of a pod.
pub fn consumer(pod_name: &str, pod_uid: Option<&str>) -> ResourceClaimConsumerReference {
    ResourceClaimConsumerReference {
        resource: "pods".into(),
        name: pod_name.to_string(),
        uid: pod_uid.unwrap_or_default().to_string(),
        api_group: None,
    }
}

/// The `reservedFor` entry of a PodGroup, for a claim it lists in `spec.resourceClaims`
/// (DRAWorkloadResourceClaims: upstream's `resourceclaim.BindTo`).
pub fn pod_group_consumer(name: &str, uid: Option<&str>) -> ResourceClaimConsumerReference {
    ResourceClaimConsumerReference {
        resource: "podgroups".into(),
        name: name.to_string(),
        uid: uid.unwrap_or_default().to_string(),
        api_group: Some("scheduling.k8s.io".into()),
    }
}

/// Whether a `reservedFor` entry is this pod: by UID where the pod has one (a pod deleted
/// and created again under the same name is another consumer), else by name.
pub fn is_pod(entry: &ResourceClaimConsumerReference, name: &str, uid: Option<&str>) -> bool {
    is_consumer(entry, &consumer(name, uid))
}

/// Whether a `reservedFor` entry is the consumer `me` (a pod or a PodGroup): the same
/// resource, then by UID where `me` has one, else by name.
pub fn is_consumer(
    entry: &ResourceClaimConsumerReference,
    me: &ResourceClaimConsumerReference,
) -> bool {
    let group = |r: &ResourceClaimConsumerReference| r.api_group.clone().unwrap_or_default();
    entry.resource == me.resource
        && group(entry) == group(me)
        && if me.uid.is_empty() {
            entry.name == me.name
        } else {
            entry.uid == me.uid
        }
}

/// Whether the claim is reserved for the pod.
pub fn is_reserved_for(claim: &ResourceClaim, name: &str, uid: Option<&str>) -> bool {
    reserved_for(claim).iter().any(|r| is_pod(r, name, uid))
}

/// Whether the claim is reserved for nobody, or for this pod alone: nobody else would
/// lose its devices if they were given back.
pub fn reserved_only_for(claim: &ResourceClaim, name: &str, uid: Option<&str>) -> bool {
    match reserved_for(claim) {
        [] => true,
        [only] => is_pod(only, name, uid),
        _ => false,
    }
}

pub fn reserved_for(claim: &ResourceClaim) -> &[ResourceClaimConsumerReference] {
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_deref())
        .unwrap_or_default()
}

pub fn allocation(claim: &ResourceClaim) -> Option<&AllocationResult> {
    claim.status.as_ref()?.allocation.as_ref()
}

/// Add the consumer to `reservedFor` (once). Returns whether it was added.
pub fn reserve(status: &mut ResourceClaimStatus, me: &ResourceClaimConsumerReference) -> bool {
    let reserved = status.reserved_for.get_or_insert_with(Vec::new);
    if reserved.iter().any(|r| is_consumer(r, me)) {
        return false;
    }
    reserved.push(me.clone());
    true
}

/// Take the consumer out of `reservedFor`. Returns whether it was there.
pub fn unreserve(status: &mut ResourceClaimStatus, me: &ResourceClaimConsumerReference) -> bool {
    let Some(reserved) = status.reserved_for.as_mut() else {
        return false;
    };
    let before = reserved.len();
    reserved.retain(|r| !is_consumer(r, me));
    reserved.len() != before
}

/// Whether two allocations hold the same devices where (the timestamp aside).
pub fn same_devices(a: &AllocationResult, b: &AllocationResult) -> bool {
    a.devices == b.devices && a.node_selector == b.node_selector
}

/// Clears the claim's allocation if it is still `ours` (the same devices); false when the
/// claim holds someone else's allocation by now, which stays.
pub fn take_if_ours(status: &mut ResourceClaimStatus, ours: &AllocationResult) -> bool {
    let same = status
        .allocation
        .as_ref()
        .is_some_and(|a| same_devices(a, ours));
    if same {
        status.allocation = None;
    }
    same
}

/// Whether the pod may be added to the claim's `reservedFor`: it is there already, or
/// there is room.
pub fn may_reserve(claim: &ResourceClaim, pod: &Pod) -> Result<(), String> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let uid = pod.metadata.uid.as_deref();
    if reserved_for(claim).len() >= MAX_RESERVED_FOR && !is_reserved_for(claim, name, uid) {
        return Err(format!(
            "is reserved for the maximum of {MAX_RESERVED_FOR} consumers"
        ));
    }
    Ok(())
}

/// The claims a pod references, in pod order, or why one is not usable yet.
pub fn of_pod(pod: &Pod, state: &ClusterState) -> Result<Vec<ObjectKey>, ClaimsNotReady> {
    Ok(named_of_pod(pod, state)?
        .into_iter()
        .map(|(_, key)| key)
        .collect())
}

/// [`of_pod`], each claim with its name in the pod (`spec.resourceClaims[].name`).
pub fn named_of_pod(
    pod: &Pod,
    state: &ClusterState,
) -> Result<Vec<(String, ObjectKey)>, ClaimsNotReady> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut keys = Vec::new();
    let pod_claims = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref());
    for pc in pod_claims.into_iter().flatten() {
        let Some(name) = claim_name(pod, pc)? else {
            // The controller decided the pod needs no claim here.
            continue;
        };
        let key = ObjectKey::new(ns, name);
        let Some(claim) = state.claims.get(&key) else {
            return Err(ClaimsNotReady {
                message: format!("ResourceClaim {key} not found"),
                missing: true,
                claim: Some(key),
            });
        };
        check_usable(pod, pc, &key, claim)?;
        keys.push((pc.name.clone(), key));
    }
    Ok(keys)
}

/// Whether `pod` uses the claim `key` (by name, or as the claim made from one of its
/// templates), whether or not the claim exists.
pub fn uses_claim(pod: &Pod, key: &ObjectKey) -> bool {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    ns == key.namespace
        && pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .into_iter()
            .flatten()
            .any(|pc| matches!(claim_name(pod, pc), Ok(Some(name)) if name == key.name))
}

/// The name of the claim a pod claim stands for; `None` when its template made none.
fn claim_name(
    pod: &Pod,
    pc: &k8s_openapi::api::core::v1::PodResourceClaim,
) -> Result<Option<String>, ClaimsNotReady> {
    if let Some(name) = pc.resource_claim_name.as_deref() {
        return Ok(Some(name.to_string()));
    }
    let Some(template) = pc.resource_claim_template_name.as_deref() else {
        return Err(ClaimsNotReady {
            message: format!("pod claim {} names neither a claim nor a template", pc.name),
            missing: false,
            claim: None,
        });
    };
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref());
    match statuses.and_then(|s| s.iter().find(|s| s.name == pc.name)) {
        Some(s) => Ok(s.resource_claim_name.clone()),
        None => Err(ClaimsNotReady {
            message: format!(
                "waiting for the ResourceClaim of pod claim {} to be created from ResourceClaimTemplate {template}",
                pc.name
            ),
            missing: true,
            claim: None,
        }),
    }
}

/// A claim being deleted, or one made from a template for another pod, cannot be used.
fn check_usable(
    pod: &Pod,
    pc: &k8s_openapi::api::core::v1::PodResourceClaim,
    key: &ObjectKey,
    claim: &ResourceClaim,
) -> Result<(), ClaimsNotReady> {
    let unusable = |message: String| ClaimsNotReady {
        message,
        missing: false,
        claim: None,
    };
    if claim.metadata.deletion_timestamp.is_some() {
        return Err(unusable(format!("ResourceClaim {key} is being deleted")));
    }
    if let (Some(template), Some(owner)) = (
        pc.resource_claim_template_name.as_deref(),
        pod.metadata.name.as_deref(),
    ) {
        let group = crate::group::pod_group_name(pod);
        let owned = claim.metadata.owner_references.iter().flatten().any(|o| {
            let by_pod = o.kind == "Pod"
                && o.name == owner
                && (pod.metadata.uid.is_none() || pod.metadata.uid.as_deref() == Some(&o.uid));
            // Made from the template of the pod's PodGroup (upstream's IsForPod with
            // DRAWorkloadResourceClaims): the PodGroup controls it.
            let by_group = o.kind == "PodGroup"
                && o.controller == Some(true)
                && Some(o.name.as_str()) == group
                && o.api_version.starts_with("scheduling.k8s.io/");
            by_pod || by_group
        });
        if !owned {
            return Err(unusable(format!(
                "ResourceClaim {key} was not created for this pod from template {template}"
            )));
        }
    }
    Ok(())
}

/// A claim of this unbound pod that is allocated but reserved for nobody else, which
/// could be given back so the pod can be placed elsewhere (DynamicResources' PostFilter;
/// also what a restarted scheduler finds for a pod it never bound).
pub fn to_release(pod: &Pod, state: &ClusterState) -> Option<ObjectKey> {
    if bound_node(pod).is_some() {
        return None;
    }
    let uid = pod.metadata.uid.as_deref()?;
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    of_pod(pod, state).ok()?.into_iter().find(|key| {
        let claim = &state.claims[key];
        allocation(claim).is_some() && reserved_only_for(claim, name, Some(uid))
    })
}
