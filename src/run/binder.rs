//! The binding cycle: the API writes that make one scheduling decision real, in the order
//! kube-scheduler's DynamicResources plugin uses, and their undoing when one fails.
//!
//! Per claim: (1) a claim made for extended resources is created; (2) the finalizer
//! `resource.kubernetes.io/delete-protection` is added (plain update, guarded by
//! resourceVersion); (3) one status update sets `allocation` and adds the pod to
//! `reservedFor`, retried on conflict with a fresh read and refused if someone else
//! allocated the claim meanwhile. For a claim made for extended resources, the pod's
//! `status.extendedResourceClaimStatus` names it and maps containers to its requests. Then
//! the pod is bound with `pods/binding`.

use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::api::resource::v1::{
    AllocationResult, ResourceClaim, ResourceClaimConsumerReference,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use dra_engine::{ClaimDecision, ObjectKey, Placement};

use super::metrics::Metrics;

pub const FINALIZER: &str = "resource.kubernetes.io/delete-protection";
const CONFLICT_RETRIES: usize = 5;

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.reason),
        other => other.to_string(),
    }
}

/// Whether two allocations name the same devices and placement (the timestamp aside).
fn same_devices(a: &AllocationResult, b: &AllocationResult) -> bool {
    a.devices == b.devices && a.node_selector == b.node_selector
}

/// Kubernetes records when an allocation with binding conditions was made, so that a
/// binding that never completes can time out: set `allocationTimestamp` for those.
pub fn stamp_allocation(allocation: &mut AllocationResult, now: k8s_openapi::jiff::Timestamp) {
    let waits = allocation
        .devices
        .iter()
        .flat_map(|d| d.results.iter().flatten())
        .any(|r| r.binding_conditions.as_ref().is_some_and(|c| !c.is_empty()));
    if waits && allocation.allocation_timestamp.is_none() {
        allocation.allocation_timestamp = Some(Time(now));
    }
}

fn consumer(placement: &Placement) -> ResourceClaimConsumerReference {
    ResourceClaimConsumerReference {
        api_group: None,
        resource: "pods".into(),
        name: placement.pod.name.clone(),
        uid: placement.pod_uid.clone().unwrap_or_default(),
    }
}

/// Write one claim's part of the decision. Returns whether this call allocated it, and the
/// claim as the API server stored it.
async fn write_claim(
    client: &Client,
    metrics: &Metrics,
    placement: &Placement,
    decision: &ClaimDecision,
) -> Result<(bool, ResourceClaim), String> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &decision.key.namespace);
    let name = &decision.key.name;
    // The claim as the informer had it when the decision was made saves a read: when this
    // decision allocates it, nobody else's assumption can be in it. A conflict reads afresh.
    let mut known = decision
        .allocation
        .is_some()
        .then(|| decision.claim.clone());
    if decision.create {
        let mut claim = decision.claim.clone();
        for owner in claim.metadata.owner_references.iter_mut().flatten() {
            owner.uid = placement.pod_uid.clone().unwrap_or_default();
        }
        match metrics
            .write(
                "create",
                "resourceclaims",
                api.create(&PostParams::default(), &claim),
            )
            .await
        {
            Ok(created) => known = Some(created),
            Err(kube::Error::Api(s)) if s.code == 409 => known = None,
            Err(e) => {
                return Err(format!(
                    "create ResourceClaim {}: {}",
                    decision.key,
                    describe(&e)
                ));
            }
        }
    }
    let me = consumer(placement);
    for _ in 0..CONFLICT_RETRIES {
        let mut claim = match known.take() {
            Some(claim) => claim,
            None => api
                .get(name)
                .await
                .map_err(|e| format!("read ResourceClaim {}: {}", decision.key, describe(&e)))?,
        };
        if claim.metadata.deletion_timestamp.is_some() {
            return Err(format!("ResourceClaim {} is being deleted", decision.key));
        }
        let current = claim.status.as_ref().and_then(|s| s.allocation.clone());
        if let Some(allocation) = &decision.allocation {
            match &current {
                Some(existing) if !same_devices(existing, allocation) => {
                    return Err(format!(
                        "ResourceClaim {} was allocated by someone else meanwhile",
                        decision.key
                    ));
                }
                _ => {}
            }
            let finalizers = claim.metadata.finalizers.get_or_insert_with(Vec::new);
            if !finalizers.iter().any(|f| f == FINALIZER) {
                finalizers.push(FINALIZER.into());
                claim = match metrics
                    .write(
                        "update",
                        "resourceclaims",
                        api.replace(name, &PostParams::default(), &claim),
                    )
                    .await
                {
                    Ok(c) => c,
                    Err(e) if is_conflict(&e) => continue,
                    Err(e) => {
                        return Err(format!(
                            "add finalizer to ResourceClaim {}: {}",
                            decision.key,
                            describe(&e)
                        ));
                    }
                };
            }
        } else if current.is_none() {
            return Err(format!(
                "ResourceClaim {} is no longer allocated",
                decision.key
            ));
        }
        let status = claim.status.get_or_insert_with(Default::default);
        if let Some(allocation) = &decision.allocation
            && status.allocation.is_none()
        {
            let mut allocation = allocation.clone();
            stamp_allocation(&mut allocation, k8s_openapi::jiff::Timestamp::now());
            status.allocation = Some(allocation);
        }
        let reserved = status.reserved_for.get_or_insert_with(Vec::new);
        if !reserved
            .iter()
            .any(|r| r.resource == "pods" && r.name == me.name)
        {
            reserved.push(me.clone());
        }
        match metrics
            .write(
                "update",
                "resourceclaims/status",
                api.replace_status(name, &PostParams::default(), &claim),
            )
            .await
        {
            Ok(stored) => {
                return Ok((decision.allocation.is_some() && current.is_none(), stored));
            }
            Err(e) if is_conflict(&e) => continue,
            Err(e) => {
                return Err(format!(
                    "update status of ResourceClaim {}: {}",
                    decision.key,
                    describe(&e)
                ));
            }
        }
    }
    Err(format!(
        "ResourceClaim {} kept changing: {CONFLICT_RETRIES} conflicts",
        decision.key
    ))
}

/// Take the pod out of a claim's `reservedFor`, and give the devices back if this binding
/// allocated them and nobody else uses the claim.
async fn unwind_claim(
    client: &Client,
    metrics: &Metrics,
    placement: &Placement,
    decision: &ClaimDecision,
    allocated: bool,
) {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &decision.key.namespace);
    for _ in 0..CONFLICT_RETRIES {
        let Ok(mut claim) = api.get(&decision.key.name).await else {
            return;
        };
        let status = claim.status.get_or_insert_with(Default::default);
        if let Some(reserved) = status.reserved_for.as_mut() {
            reserved.retain(|r| !(r.resource == "pods" && r.name == placement.pod.name));
        }
        if allocated && status.reserved_for.as_ref().is_none_or(Vec::is_empty) {
            status.allocation = None;
            status.reserved_for = None;
        }
        match metrics
            .write(
                "update",
                "resourceclaims/status",
                api.replace_status(&decision.key.name, &PostParams::default(), &claim),
            )
            .await
        {
            Ok(_) => return,
            Err(e) if is_conflict(&e) => continue,
            Err(e) => {
                tracing::warn!(claim = %decision.key, error = %describe(&e), "could not unwind claim");
                return;
            }
        }
    }
}

/// Make `placement` real. Returns the claims as the API server stored them. On failure
/// everything this call wrote is undone and the error names the object and the cause.
pub async fn bind(
    client: &Client,
    metrics: &Metrics,
    placement: &Placement,
) -> Result<Vec<ResourceClaim>, String> {
    let mut written: Vec<(&ClaimDecision, bool)> = Vec::new();
    let mut stored = Vec::new();
    let mut result = Ok(());
    for decision in &placement.claims {
        match write_claim(client, metrics, placement, decision).await {
            Ok((allocated, claim)) => {
                written.push((decision, allocated));
                stored.push(claim);
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &placement.pod.namespace);
    // kubelet learns from the pod's status which claim serves its extended resources and
    // which request serves each container; written before binding, as kube-scheduler does.
    if result.is_ok()
        && let Some(decision) = placement.claims.iter().find(|d| d.create)
    {
        let patch = serde_json::json!({"status": {"extendedResourceClaimStatus": {
            "resourceClaimName": decision.key.name,
            "requestMappings": decision.extended_mappings,
        }}});
        if let Err(e) = metrics
            .write(
                "patch",
                "pods/status",
                pods.patch_status(
                    &placement.pod.name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(patch),
                ),
            )
            .await
        {
            result = Err(format!(
                "record the extended-resource claim of pod {}: {}",
                placement.pod,
                describe(&e)
            ));
        }
    }
    if result.is_ok() {
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(placement.pod.name.clone()),
                namespace: Some(placement.pod.namespace.clone()),
                uid: placement.pod_uid.clone(),
                ..Default::default()
            },
            target: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(placement.node.clone()),
                ..Default::default()
            },
        };
        if let Err(e) = metrics
            .write(
                "create",
                "pods/binding",
                pods.create_subresource::<_, serde_json::Value>(
                    "binding",
                    &placement.pod.name,
                    &PostParams::default(),
                    &binding,
                ),
            )
            .await
        {
            // A binding that landed although its answer was lost, or a retry of one: the
            // pod is already on this node, which is success.
            let already_here = is_conflict(&e)
                && pods.get(&placement.pod.name).await.is_ok_and(|pod| {
                    pod.spec.and_then(|s| s.node_name).as_deref() == Some(placement.node.as_str())
                });
            if !already_here {
                result = Err(format!(
                    "bind pod {} to node {}: {}",
                    placement.pod,
                    placement.node,
                    describe(&e)
                ));
            }
        }
    }
    if result.is_err() {
        for (decision, allocated) in written {
            unwind_claim(client, metrics, placement, decision, allocated).await;
        }
    }
    result.map(|()| stored)
}

/// Give back a claim allocated for `pod_uid` that the pod cannot use where it is allocated
/// (kube-scheduler's PostFilter): clear its allocation and reservations, guarded by
/// resourceVersion so that a claim someone started using meanwhile is left alone.
pub async fn release_claim(
    client: &Client,
    metrics: &Metrics,
    claim: &ObjectKey,
    pod_uid: &str,
) -> Result<bool, String> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &claim.namespace);
    let mut current = match api.get(&claim.name).await {
        Ok(c) => c,
        Err(e) => return Err(format!("read ResourceClaim {claim}: {}", describe(&e))),
    };
    let Some(status) = current.status.as_mut() else {
        return Ok(false);
    };
    let reserved = status.reserved_for.as_deref().unwrap_or_default();
    let only_this_pod = reserved.is_empty() || (reserved.len() == 1 && reserved[0].uid == pod_uid);
    if status.allocation.is_none() || !only_this_pod {
        return Ok(false);
    }
    status.allocation = None;
    status.reserved_for = None;
    status.devices = None;
    match metrics
        .write(
            "update",
            "resourceclaims/status",
            api.replace_status(&claim.name, &PostParams::default(), &current),
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if is_conflict(&e) => Ok(false),
        Err(e) => Err(format!(
            "deallocate ResourceClaim {claim}: {}",
            describe(&e)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocation(conditions: Option<Vec<String>>) -> AllocationResult {
        serde_json::from_value(serde_json::json!({"devices": {"results": [{
            "request": "gpu", "driver": "gpu.example.com", "pool": "n1", "device": "gpu-0",
            "bindingConditions": conditions, "bindingFailureConditions": conditions}]}}))
        .unwrap()
    }

    #[test]
    fn only_allocations_with_binding_conditions_get_a_timestamp() {
        let now: k8s_openapi::jiff::Timestamp = "2026-12-01T04:00:00Z".parse().unwrap();
        let mut waits = allocation(Some(vec!["attached".into()]));
        stamp_allocation(&mut waits, now);
        assert_eq!(waits.allocation_timestamp, Some(Time(now)));
        let mut plain = allocation(None);
        stamp_allocation(&mut plain, now);
        assert_eq!(plain.allocation_timestamp, None);
        assert!(same_devices(
            &waits,
            &allocation(Some(vec!["attached".into()]))
        ));
    }
}
