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
//!
//! Before the claims, the pod's volumes, as kube-scheduler's VolumeBinding PreBind does
//! (`bindAPIUpdate`, then `checkBindings`): each PersistentVolume chosen for a claim gets
//! the claim in `spec.claimRef` (and `pv.kubernetes.io/bound-by-controller`), each claim
//! to provision gets `volume.kubernetes.io/selected-node`; both guarded by the
//! resourceVersion the decision was made on. Then the binder waits (polling once a second,
//! at most [`VOLUME_BIND_TIMEOUT`], upstream's bindTimeoutSeconds) until the PV controller
//! has bound every such claim. When a later step fails, the volume writes are undone while
//! the claim is still unbound (upstream leaves them; the PV controller would then complete
//! a binding for a pod that is not coming).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use dra_engine::plugins::volume_binding::{
    ANN_BOUND_BY_CONTROLLER, ANN_SELECTED_NODE, claim_volume_name, is_fully_bound,
    volume_node_affinity_matches,
};
use dra_engine::{ClaimDecision, ObjectKey, Placement, VolumeDecision, claims};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};

use super::bindings::Turn;
use super::metrics::{Metrics, is_not_leader};
use super::owners::{self, DeviceOwners};

pub const FINALIZER: &str = "resource.kubernetes.io/delete-protection";
const CONFLICT_RETRIES: usize = 5;
/// Reads and unwinds after a failed binding are retried this often at first, doubling up
/// to [`SETTLE_MAX_DELAY`], for as long as this replica may write.
const SETTLE_FIRST_DELAY: Duration = Duration::from_millis(200);
const SETTLE_MAX_DELAY: Duration = Duration::from_secs(5);
/// How long the binder waits for the PV controller to bind a pod's claims (kube-scheduler's
/// VolumeBinding `bindTimeoutSeconds` default).
pub const VOLUME_BIND_TIMEOUT: Duration = Duration::from_secs(600);
const VOLUME_POLL: Duration = Duration::from_secs(1);

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.reason),
        other => other.to_string(),
    }
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

fn resource_version(claim: &ResourceClaim) -> Option<&str> {
    claim.metadata.resource_version.as_deref()
}

/// Write part of a claim with a JSON merge patch guarded by the resourceVersion it was read
/// at (a conflict if it changed since): only the fields named are sent, so fields of the
/// claim that this build does not know are kept as they are.
async fn patch_claim(
    api: &Api<ResourceClaim>,
    metrics: &Metrics,
    claim: &ResourceClaim,
    status: bool,
    mut patch: serde_json::Value,
) -> Result<ResourceClaim, kube::Error> {
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    patch["metadata"]["resourceVersion"] = json!(resource_version(claim));
    let params = PatchParams::default();
    if status {
        metrics
            .write(
                "patch",
                "resourceclaims/status",
                api.patch_status(name, &params, &Patch::Merge(patch)),
            )
            .await
    } else {
        metrics
            .write(
                "patch",
                "resourceclaims",
                api.patch(name, &params, &Patch::Merge(patch)),
            )
            .await
    }
}

/// Write one claim's part of the decision. Returns the claim as the API server stored it,
/// and whether this write set its allocation.
async fn write_claim(
    client: &Client,
    metrics: &Metrics,
    placement: &Placement,
    decision: &ClaimDecision,
) -> Result<(ResourceClaim, bool), String> {
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
    let me = placement.consumer_of(decision);
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
        if decision.create
            && !claim.metadata.owner_references.iter().flatten().any(|o| {
                o.kind == "Pod" && placement.pod_uid.as_deref().is_none_or(|uid| o.uid == uid)
            })
        {
            return Err(format!(
                "ResourceClaim {} belongs to another pod of the same name",
                decision.key
            ));
        }
        let current = claim.status.as_ref().and_then(|s| s.allocation.clone());
        if let Some(allocation) = &decision.allocation {
            match &current {
                Some(existing) if !claims::same_devices(existing, allocation) => {
                    return Err(format!(
                        "ResourceClaim {} was allocated by someone else meanwhile",
                        decision.key
                    ));
                }
                _ => {}
            }
            let finalizers = claim.metadata.finalizers.clone().unwrap_or_default();
            if !finalizers.iter().any(|f| f == FINALIZER) {
                let mut all = finalizers;
                all.push(FINALIZER.into());
                let patch = json!({"metadata": {"finalizers": all}});
                claim = match patch_claim(&api, metrics, &claim, false, patch).await {
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
        let mut status = claim.status.clone().unwrap_or_default();
        let mut patch = json!({"status": {}});
        if claims::reserve(&mut status, &me) {
            patch["status"]["reservedFor"] = json!(status.reserved_for);
        }
        let allocates = decision.allocation.is_some() && current.is_none();
        if let Some(allocation) = decision.allocation.as_ref().filter(|_| allocates) {
            let mut allocation = allocation.clone();
            stamp_allocation(&mut allocation, k8s_openapi::jiff::Timestamp::now());
            patch["status"]["allocation"] = json!(allocation);
        }
        if patch["status"].as_object().is_some_and(|o| o.is_empty()) {
            return Ok((claim, false));
        }
        match patch_claim(&api, metrics, &claim, true, patch).await {
            Ok(stored) => return Ok((stored, allocates)),
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

/// Retry `op` with a growing delay until it answers for sure: `Ok`, or an error that a
/// retry would not change (not a timeout, 429 or 5xx); gives up only when this replica may
/// no longer write (then nothing may be changed, and the next leader reads the truth).
async fn settled<T, F, Fut>(metrics: &Metrics, mut op: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut delay = SETTLE_FIRST_DELAY;
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if is_not_leader(&e) || !transient(&e) => return Err(e),
            Err(e) => {
                if !metrics.may_write() {
                    return Err(e);
                }
                tracing::debug!(error = %describe(&e), ?delay, "retrying after a failed API call");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(SETTLE_MAX_DELAY);
            }
        }
    }
}

/// An error that says nothing about whether the request took effect, or that a retry may
/// get past.
fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        _ => true,
    }
}

/// Take the pod out of a claim's `reservedFor`, and give its devices back if they are the
/// ones this decision allocated and nobody else uses the claim. Retried (conflicts with a
/// fresh read, failures with backoff) until it landed; an error means it did not.
async fn unwind_claim(
    client: &Client,
    metrics: &Metrics,
    placement: &Placement,
    decision: &ClaimDecision,
) -> Result<(), String> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &decision.key.namespace);
    let me = placement.consumer_of(decision);
    let failed =
        |e: kube::Error| format!("unwind ResourceClaim {}: {}", decision.key, describe(&e));
    loop {
        let claim = match settled(metrics, || api.get_opt(&decision.key.name)).await {
            Ok(Some(claim)) => claim,
            Ok(None) => return Ok(()),
            Err(e) => return Err(failed(e)),
        };
        let status = claim.status.clone().unwrap_or_default();
        let mut after = status.clone();
        let removed = claims::unreserve(&mut after, &me);
        let others = after.reserved_for.unwrap_or_default();
        let ours = match (&decision.allocation, &status.allocation) {
            (Some(mine), Some(current)) => claims::same_devices(mine, current),
            _ => false,
        };
        let mut patch = json!({"status": {}});
        if removed {
            patch["status"]["reservedFor"] = if others.is_empty() {
                serde_json::Value::Null
            } else {
                json!(others)
            };
        }
        if ours && others.is_empty() {
            patch["status"]["allocation"] = serde_json::Value::Null;
            patch["status"]["devices"] = serde_json::Value::Null;
        }
        if patch["status"].as_object().is_some_and(|o| o.is_empty()) {
            return Ok(());
        }
        match settled(metrics, || {
            patch_claim(&api, metrics, &claim, true, patch.clone())
        })
        .await
        {
            Ok(_) => return Ok(()),
            Err(e) if is_conflict(&e) => continue,
            Err(e) if is_not_found(&e) => return Ok(()),
            Err(e) => return Err(failed(e)),
        }
    }
}

/// Where the pod is after a binding that failed or whose answer was lost.
enum PodNow {
    /// Bound to the placement's node: the binding landed.
    BoundHere,
    /// Not bound, bound elsewhere, or replaced by another pod of the same name.
    NotHere,
}

async fn pod_now(
    pods: &Api<Pod>,
    metrics: &Metrics,
    placement: &Placement,
) -> Result<PodNow, String> {
    let pod = settled(metrics, || pods.get_opt(&placement.pod.name))
        .await
        .map_err(|e| format!("read pod {}: {}", placement.pod, describe(&e)))?;
    let here = pod.is_some_and(|pod| {
        (placement.pod_uid.is_none() || pod.metadata.uid == placement.pod_uid)
            && pod.spec.and_then(|s| s.node_name).as_deref() == Some(placement.node.as_str())
    });
    Ok(if here {
        PodNow::BoundHere
    } else {
        PodNow::NotHere
    })
}

/// A binding that did not happen.
#[derive(Debug)]
pub struct BindFailure {
    /// What failed, naming the object and the cause.
    pub message: String,
    /// Every claim write was undone (or none was made): the assumed devices may be
    /// forgotten. `false` when the undoing could not be confirmed (this replica stopped
    /// leading first): the devices stay taken in the cache until the API server says
    /// otherwise.
    pub unwound: bool,
}

/// What a placement's writes before the binding (PreBind) did, to finish or undo them.
#[derive(Default)]
struct Written<'a> {
    /// Claim writes that may have landed.
    claims: Vec<&'a ClaimDecision>,
    /// Volume writes that may have landed.
    volumes: Vec<&'a VolumeDecision>,
    /// The claims as the API server stored them.
    stored: Vec<ResourceClaim>,
}

/// Make `placement` real. Returns the claims as the API server stored them. On failure the
/// pod is read first: a binding that landed although its answer was lost is a success;
/// otherwise everything this call may have written is undone before it returns.
pub async fn bind(
    client: &Client,
    metrics: &Metrics,
    owners: &DeviceOwners,
    turn: &mut Turn,
    placement: &Placement,
) -> Result<Vec<ResourceClaim>, BindFailure> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &placement.pod.namespace);
    let mut written = Written::default();
    let checks = (owners, &mut *turn);
    let mut result = prebind(client, metrics, checks, &pods, placement, &mut written).await;
    if result.is_ok() {
        result = create_binding(&pods, metrics, placement).await;
    }
    finish(client, metrics, &pods, placement, written, result).await
}

/// Make a PodGroup's placements real, all or nothing as far as the API allows: every
/// member's PreBind writes first (volumes, claims), in order; when one fails, every
/// member's writes are undone and no pod is bound. Then each pod is bound. A binding that
/// fails then is undone for that member alone (a bound pod cannot be unbound). One result
/// per placement, in order.
pub async fn bind_group(
    client: &Client,
    metrics: &Metrics,
    owners: &DeviceOwners,
    turn: &mut Turn,
    placements: &[Placement],
) -> Vec<Result<Vec<ResourceClaim>, BindFailure>> {
    let api = |p: &Placement| -> Api<Pod> { Api::namespaced(client.clone(), &p.pod.namespace) };
    let mut written: Vec<Written<'_>> = Vec::new();
    let mut failed: Option<(usize, String)> = None;
    for (i, placement) in placements.iter().enumerate() {
        let mut w = Written::default();
        let checks = (owners, &mut *turn);
        let result = prebind(client, metrics, checks, &api(placement), placement, &mut w).await;
        written.push(w);
        if let Err(message) = result {
            failed = Some((i, message));
            break;
        }
    }
    let mut results = Vec::new();
    if let Some((at, message)) = failed {
        for (i, (placement, w)) in placements.iter().zip(written).enumerate() {
            let why = if i == at {
                message.clone()
            } else {
                format!(
                    "another member of its PodGroup could not be written, so none is bound ({}: {message})",
                    placements[at].pod
                )
            };
            results.push(finish(client, metrics, &api(placement), placement, w, Err(why)).await);
        }
        for placement in &placements[at + 1..] {
            results.push(Err(BindFailure {
                message: format!(
                    "pod {} was not bound: another member of its PodGroup could not be written ({}: {message})",
                    placement.pod, placements[at].pod
                ),
                unwound: true,
            }));
        }
        return results;
    }
    for (placement, mut w) in placements.iter().zip(written) {
        let pods = api(placement);
        let result = create_binding(&pods, metrics, placement).await;
        // A claim reserved for the PodGroup is shared with members that may be bound by
        // now: one member's failure leaves it as it is (and its devices taken).
        let shared = w.claims.iter().any(|d| d.consumer.is_some());
        w.claims.retain(|d| d.consumer.is_none());
        let mut result = finish(client, metrics, &pods, placement, w, result).await;
        if let Err(failure) = &mut result {
            failure.unwound &= !shared;
        }
        results.push(result);
    }
    results
}

/// The writes before the binding, in kube-scheduler's order: volumes (and the wait for the
/// PV controller), the claims, the pod's extended-resource claim status. Once the claims'
/// allocations have landed, another scheduler's earlier allocation of one of their devices
/// fails the binding ([`DeviceOwners::first_writer`]); the task gives its `turn` to write
/// up while it waits for the informer. `written` records what may have landed.
async fn prebind<'a>(
    client: &Client,
    metrics: &Metrics,
    (owners, turn): (&DeviceOwners, &mut Turn),
    pods: &Api<Pod>,
    placement: &'a Placement,
    written: &mut Written<'a>,
) -> Result<(), String> {
    for decision in &placement.volumes {
        written.volumes.push(decision);
        write_volume(client, metrics, decision).await?;
    }
    if !placement.volumes.is_empty() {
        wait_for_volumes(client, pods, placement, VOLUME_BIND_TIMEOUT).await?;
    }
    let mut allocated = Vec::new();
    for decision in &placement.claims {
        written.claims.push(decision);
        let (mut stored, allocates) = write_claim(client, metrics, placement, decision).await?;
        if allocates {
            allocated.push(owners::Written::of(&stored));
        }
        // The engine keeps it; like the informers' objects, without managedFields.
        super::drop_managed_fields(&mut stored);
        written.stored.push(stored);
    }
    if !allocated.is_empty() {
        let waited = std::time::Instant::now();
        let checked = turn
            .away(owners.first_writer(&allocated, owners::CATCH_UP_TIMEOUT))
            .await;
        metrics
            .first_writer_wait
            .observe(waited.elapsed().as_secs_f64());
        if let Err(not_first) = checked {
            if matches!(not_first, owners::NotFirst::Earlier { .. }) {
                metrics.first_writer_conflicts.inc();
            }
            return Err(not_first.to_string());
        }
    }
    // kubelet learns from the pod's status which claim serves its extended resources and
    // which request serves each container; written before binding, as kube-scheduler does.
    if let Some(decision) = placement.claims.iter().find(|d| d.create) {
        let patch = json!({"status": {"extendedResourceClaimStatus": {
            "resourceClaimName": decision.key.name,
            "requestMappings": decision.extended_mappings,
        }}});
        patch_pod_status(pods, metrics, placement, patch)
            .await
            .map_err(|e| {
                format!(
                    "record the extended-resource claim of pod {}: {}",
                    placement.pod,
                    describe(&e)
                )
            })?;
    }
    // DRANodeAllocatableResources: what the pod's devices map of the node's resources, in
    // its status before binding (kubelet sizes the pod's cgroups by it, and every
    // scheduler counts it), as kube-scheduler's PreBind writes it.
    if !placement.node_allocatable.is_empty() {
        let patch = json!({"status": {
            "nodeAllocatableResourceClaimStatuses": placement.node_allocatable,
        }});
        patch_pod_status(pods, metrics, placement, patch)
            .await
            .map_err(|e| {
                format!(
                    "record the node allocatable resources of pod {}: {}",
                    placement.pod,
                    describe(&e)
                )
            })?;
    }
    Ok(())
}

/// A merge patch of the placed pod's status.
async fn patch_pod_status(
    pods: &Api<Pod>,
    metrics: &Metrics,
    placement: &Placement,
    patch: serde_json::Value,
) -> Result<Pod, kube::Error> {
    metrics
        .write(
            "patch",
            "pods/status",
            pods.patch_status(
                &placement.pod.name,
                &PatchParams::default(),
                &Patch::Merge(patch),
            ),
        )
        .await
}

/// Take back the node allocatable resource claim statuses of a pod that is not bound
/// (kube-scheduler's Unreserve does): an explicit empty list, guarded by the pod's uid.
/// A failure is logged; the next placement overwrites them.
async fn clear_node_allocatable(pods: &Api<Pod>, metrics: &Metrics, placement: &Placement) {
    if placement.node_allocatable.is_empty() {
        return;
    }
    let patch = json!({"metadata": {"uid": placement.pod_uid},
        "status": {"nodeAllocatableResourceClaimStatuses": []}});
    if let Err(e) = patch_pod_status(pods, metrics, placement, patch).await {
        tracing::warn!(pod = %placement.pod, error = %describe(&e), "could not clear the pod's node allocatable resource claim statuses");
    }
}

/// The end of a binding: the stored claims on success, else the failure settled.
async fn finish(
    client: &Client,
    metrics: &Metrics,
    pods: &Api<Pod>,
    placement: &Placement,
    written: Written<'_>,
    result: Result<(), String>,
) -> Result<Vec<ResourceClaim>, BindFailure> {
    let Err(message) = result else {
        return Ok(written.stored);
    };
    settle(
        client,
        metrics,
        pods,
        placement,
        (&written.claims, &written.volumes),
        message,
    )
    .await
}

fn volume_name(decision: &VolumeDecision) -> String {
    match decision {
        VolumeDecision::Bind { volume, .. } => volume.metadata.name.clone().unwrap_or_default(),
        VolumeDecision::Provision { .. } => String::new(),
    }
}

/// Write one volume decision (`bindAPIUpdate`), guarded by the resourceVersion it was made
/// on, with a JSON merge patch of the fields it sets.
async fn write_volume(
    client: &Client,
    metrics: &Metrics,
    decision: &VolumeDecision,
) -> Result<(), String> {
    let params = PatchParams::default();
    match decision {
        VolumeDecision::Bind {
            claim,
            volume,
            before,
        } => {
            let api: Api<PersistentVolume> = Api::all(client.clone());
            let name = volume_name(decision);
            let mut patch = json!({
                "metadata": {"resourceVersion": before.metadata.resource_version},
                "spec": {"claimRef": volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref())},
            });
            if let Some(v) = volume
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANN_BOUND_BY_CONTROLLER))
            {
                patch["metadata"]["annotations"] = json!({ ANN_BOUND_BY_CONTROLLER: v });
            }
            metrics
                .write(
                    "patch",
                    "persistentvolumes",
                    api.patch(&name, &params, &Patch::Merge(patch)),
                )
                .await
                .map(|_| ())
                .map_err(|e| {
                    format!(
                        "bind PersistentVolume {name} to PersistentVolumeClaim {claim}: {}",
                        describe(&e)
                    )
                })
        }
        VolumeDecision::Provision {
            claim,
            node,
            before,
        } => {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &claim.namespace);
            let patch = json!({"metadata": {
                "resourceVersion": before.metadata.resource_version,
                "annotations": { ANN_SELECTED_NODE: node },
            }});
            metrics
                .write(
                    "patch",
                    "persistentvolumeclaims",
                    api.patch(&claim.name, &params, &Patch::Merge(patch)),
                )
                .await
                .map(|_| ())
                .map_err(|e| {
                    format!(
                        "select node {node} for provisioning PersistentVolumeClaim {claim}: {}",
                        describe(&e)
                    )
                })
        }
    }
}

/// Wait until the PV controller has bound every claim of the placement's volume decisions
/// (`checkBindings`), polling once a second up to `timeout`. Fails at once when a binding
/// was undone by someone else, provisioning failed, or the pod is gone.
async fn wait_for_volumes(
    client: &Client,
    pods: &Api<Pod>,
    placement: &Placement,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let nodes: Api<Node> = Api::all(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let read =
        |what: &str, e: kube::Error| format!("binding volumes: read {what}: {}", describe(&e));
    let node = nodes
        .get(&placement.node)
        .await
        .map_err(|e| read(&format!("node {}", placement.node), e))?;
    let labels = node.metadata.labels.as_ref();
    loop {
        let pod = pods
            .get_opt(&placement.pod.name)
            .await
            .map_err(|e| read(&format!("pod {}", placement.pod), e))?;
        if pod.is_none_or(|p| placement.pod_uid.is_some() && p.metadata.uid != placement.pod_uid) {
            return Err(format!(
                "binding volumes: pod {} does not exist any more",
                placement.pod
            ));
        }
        let mut waiting: Option<&ObjectKey> = None;
        for decision in &placement.volumes {
            let key = decision.claim();
            let claims: Api<PersistentVolumeClaim> =
                Api::namespaced(client.clone(), &key.namespace);
            let pvc = claims
                .get(&key.name)
                .await
                .map_err(|e| read(&format!("PersistentVolumeClaim {key}"), e))?;
            let volume = match decision {
                VolumeDecision::Bind { .. } => {
                    let name = volume_name(decision);
                    let pv = pvs
                        .get(&name)
                        .await
                        .map_err(|e| read(&format!("PersistentVolume {name}"), e))?;
                    let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
                    if claim_ref.is_none_or(|r| r.uid.as_deref().unwrap_or_default().is_empty()) {
                        return Err(format!(
                            "binding volumes: ClaimRef got reset for pv {name:?}"
                        ));
                    }
                    Some(pv)
                }
                VolumeDecision::Provision { node, .. } => {
                    let selected = pvc
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(ANN_SELECTED_NODE));
                    if selected != Some(node) {
                        return Err(format!(
                            "binding volumes: provisioning failed for PVC {:?}",
                            key.name
                        ));
                    }
                    match claim_volume_name(&pvc) {
                        "" => None,
                        name => pvs
                            .get_opt(name)
                            .await
                            .map_err(|e| read(&format!("PersistentVolume {name}"), e))?,
                    }
                }
            };
            if let Some(pv) = &volume
                && !volume_node_affinity_matches(pv, labels)
            {
                return Err(format!(
                    "binding volumes: pv {:?} node affinity doesn't match node {:?}",
                    pv.metadata.name.as_deref().unwrap_or_default(),
                    placement.node
                ));
            }
            if !is_fully_bound(&pvc) {
                waiting = Some(key);
                break;
            }
        }
        let Some(claim) = waiting else {
            return Ok(());
        };
        if tokio::time::Instant::now() + VOLUME_POLL > deadline {
            return Err(format!(
                "binding volumes: PersistentVolumeClaim {claim} was not bound within {}s",
                timeout.as_secs()
            ));
        }
        tokio::time::sleep(VOLUME_POLL).await;
    }
}

/// Undo one volume write while its claim is not bound yet: the volume's claimRef (and the
/// annotation the write added), or the claim's selected node. A claim the PV controller
/// already bound is left bound. Retried until it lands; an error means it did not.
async fn unwind_volume(
    client: &Client,
    metrics: &Metrics,
    decision: &VolumeDecision,
) -> Result<(), String> {
    let key = decision.claim();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &key.namespace);
    let failed = |e: kube::Error| {
        format!(
            "unwind volumes of PersistentVolumeClaim {key}: {}",
            describe(&e)
        )
    };
    loop {
        let pvc = settled(metrics, || claims.get_opt(&key.name))
            .await
            .map_err(failed)?;
        if pvc
            .as_ref()
            .is_some_and(|c| !claim_volume_name(c).is_empty())
        {
            return Ok(());
        }
        let result = match decision {
            VolumeDecision::Bind { before, .. } => {
                let pvs: Api<PersistentVolume> = Api::all(client.clone());
                let name = volume_name(decision);
                let Some(pv) = settled(metrics, || pvs.get_opt(&name))
                    .await
                    .map_err(failed)?
                else {
                    return Ok(());
                };
                let ours = pv
                    .spec
                    .as_ref()
                    .and_then(|s| s.claim_ref.as_ref())
                    .is_some_and(|r| {
                        r.name.as_deref() == Some(key.name.as_str())
                            && r.namespace.as_deref() == Some(key.namespace.as_str())
                    });
                if !ours {
                    return Ok(());
                }
                let mut patch = json!({
                    "metadata": {"resourceVersion": pv.metadata.resource_version},
                    "spec": {"claimRef": null},
                });
                let had = before
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(ANN_BOUND_BY_CONTROLLER));
                if !had {
                    patch["metadata"]["annotations"] = json!({ ANN_BOUND_BY_CONTROLLER: null });
                }
                settled(metrics, || {
                    let (pvs, name, patch) = (&pvs, &name, patch.clone());
                    async move {
                        let (params, patch) = (PatchParams::default(), Patch::Merge(patch));
                        let call = pvs.patch(name, &params, &patch);
                        metrics.write("patch", "persistentvolumes", call).await
                    }
                })
                .await
                .map(|_| ())
            }
            VolumeDecision::Provision { node, .. } => {
                let Some(pvc) = pvc else { return Ok(()) };
                let selected = pvc
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(ANN_SELECTED_NODE));
                if selected != Some(node) {
                    return Ok(());
                }
                let patch = json!({"metadata": {
                    "resourceVersion": pvc.metadata.resource_version,
                    "annotations": { ANN_SELECTED_NODE: null },
                }});
                settled(metrics, || {
                    let (claims, patch) = (&claims, patch.clone());
                    async move {
                        let (params, patch) = (PatchParams::default(), Patch::Merge(patch));
                        let call = claims.patch(&key.name, &params, &patch);
                        metrics.write("patch", "persistentvolumeclaims", call).await
                    }
                })
                .await
                .map(|_| ())
            }
        };
        match result {
            Ok(()) => return Ok(()),
            Err(e) if is_conflict(&e) => continue,
            Err(e) if is_not_found(&e) => return Ok(()),
            Err(e) => return Err(failed(e)),
        }
    }
}

async fn create_binding(
    pods: &Api<Pod>,
    metrics: &Metrics,
    placement: &Placement,
) -> Result<(), String> {
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
    metrics
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
        .map(|_| ())
        .map_err(|e| {
            format!(
                "bind pod {} to node {}: {}",
                placement.pod,
                placement.node,
                describe(&e)
            )
        })
}

/// After a failure: if the pod is bound here after all (a lost answer, a retried request),
/// that is success; otherwise undo the claim writes that may have landed.
async fn settle(
    client: &Client,
    metrics: &Metrics,
    pods: &Api<Pod>,
    placement: &Placement,
    (attempted, volumes): (&[&ClaimDecision], &[&VolumeDecision]),
    message: String,
) -> Result<Vec<ResourceClaim>, BindFailure> {
    let uncertain = |why: String| BindFailure {
        message: format!("{message}; {why}"),
        unwound: false,
    };
    match pod_now(pods, metrics, placement).await {
        Ok(PodNow::BoundHere) => {
            tracing::info!(pod = %placement.pod, node = %placement.node, error = %message, "the binding landed although a write failed");
            let mut stored = Vec::new();
            for decision in &placement.claims {
                let api: Api<ResourceClaim> =
                    Api::namespaced(client.clone(), &decision.key.namespace);
                match settled(metrics, || api.get(&decision.key.name)).await {
                    Ok(claim) => stored.push(claim),
                    Err(e) => {
                        return Err(uncertain(format!(
                            "read ResourceClaim {}: {}",
                            decision.key,
                            describe(&e)
                        )));
                    }
                }
            }
            Ok(stored)
        }
        Ok(PodNow::NotHere) => {
            clear_node_allocatable(pods, metrics, placement).await;
            for decision in attempted {
                if let Err(e) = unwind_claim(client, metrics, placement, decision).await {
                    return Err(uncertain(e));
                }
            }
            for decision in volumes {
                if let Err(e) = unwind_volume(client, metrics, decision).await {
                    return Err(uncertain(e));
                }
            }
            Err(BindFailure {
                message,
                unwound: true,
            })
        }
        Err(e) => Err(uncertain(e)),
    }
}

/// Give back a claim allocated for `pod_uid` that the pod cannot use where it is allocated
/// (kube-scheduler's PostFilter): clear its allocation and reservations, guarded by
/// resourceVersion; a conflict reads the claim again, and a claim someone started using
/// meanwhile is left alone.
pub async fn release_claim(
    client: &Client,
    metrics: &Metrics,
    claim: &ObjectKey,
    pod_uid: &str,
) -> Result<bool, String> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &claim.namespace);
    for _ in 0..CONFLICT_RETRIES {
        let current = match api.get_opt(&claim.name).await {
            Ok(Some(c)) => c,
            Ok(None) => return Ok(false),
            Err(e) => return Err(format!("read ResourceClaim {claim}: {}", describe(&e))),
        };
        let Some(status) = current.status.as_ref() else {
            return Ok(false);
        };
        let only_this_pod = claims::reserved_only_for(&current, "", Some(pod_uid));
        if status.allocation.is_none() || !only_this_pod {
            return Ok(false);
        }
        let patch = json!({"status": {"allocation": null, "reservedFor": null, "devices": null}});
        match patch_claim(&api, metrics, &current, true, patch).await {
            Ok(_) => return Ok(true),
            Err(e) if is_conflict(&e) => continue,
            Err(e) => {
                return Err(format!(
                    "deallocate ResourceClaim {claim}: {}",
                    describe(&e)
                ));
            }
        }
    }
    Err(format!(
        "deallocate ResourceClaim {claim}: it kept changing ({CONFLICT_RETRIES} conflicts)"
    ))
}

/// Evict a pod through the Eviction API, so that PodDisruptionBudgets hold, with its UID
/// as precondition (a pod of the same name created since is left alone): `evicted`,
/// `blocked` (429: a budget allows no disruption now) or `error`.
pub async fn evict(
    client: &Client,
    metrics: &Metrics,
    pod: &ObjectKey,
    uid: Option<&str>,
) -> &'static str {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let params = kube::api::EvictParams {
        delete_options: Some(kube::api::DeleteParams {
            preconditions: uid.map(|uid| kube::api::Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    match metrics
        .write("create", "pods/eviction", api.evict(&pod.name, &params))
        .await
    {
        Ok(_) => "evicted",
        Err(kube::Error::Api(s)) if s.code == 429 => {
            tracing::info!(%pod, reason = %s.message, "eviction refused by a PodDisruptionBudget; tried again later");
            "blocked"
        }
        Err(e) => {
            tracing::warn!(%pod, error = %describe(&e), "eviction failed");
            "error"
        }
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
        assert!(claims::same_devices(
            &waits,
            &allocation(Some(vec!["attached".into()]))
        ));
    }
}
