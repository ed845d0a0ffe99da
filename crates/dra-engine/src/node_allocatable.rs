//! DRANodeAllocatableResources: devices that stand for node CPU, memory or hugepages.
//!
//! A device may map node allocatable resources (`nodeAllocatableResources`): each
//! allocated device adds a fixed amount (`mapping.deviceMultiplier`), or the capacity its
//! allocation consumed times a factor (`mapping.capacityKey`, `capacityMultiplier`), and an
//! overhead per pod and per container that uses the claim. kube-scheduler (v1.37, gate on)
//! does, in DynamicResources' Filter, after the pod's claims got devices on the node:
//! - per claim whose devices map anything, a [`NodeAllocatableResourceClaimStatus`]:
//!   mapped amounts and overheads (each sorted by resource), the containers that use the
//!   claim (init containers first); the statuses sorted by claim name;
//! - the pod's demand is its requests with those added (containers' sum plus each
//!   status's mappings, per-pod overhead and per-container overhead times its containers;
//!   then pod-level requests and pod overhead as usual);
//! - the demand must fit in what the node has left for cpu, memory, ephemeral-storage and
//!   hugepages ("Insufficient cpu"; unresolvable when more than the node's allocatable);
//! - a claim with a mapped device cannot be shared: reserved for another pod, the pod is
//!   unschedulable;
//! - pod-level `spec.resources` must cover the containers plus what the devices map.
//!
//! The statuses go into the pod's status before binding (the binder writes them), and the
//! pods bound to a node count them in what the node has requested
//! ([`crate::resources::pod_requests`]).

use std::collections::BTreeMap;

use dra_allocator::Snapshot;
use dra_cel::Quantity;
use k8s_openapi::api::core::v1::{
    NodeAllocatableMappedResources, NodeAllocatableOverheadResources,
    NodeAllocatableResourceClaimStatus, Pod,
};
use k8s_openapi::api::resource::v1::{
    AllocationResult, Device, DeviceRequestAllocationResult, NodeAllocatableResource,
    ResourceClaim, ResourceSlice,
};

use crate::plugins::node_affinity::node_selector_terms_match;
use crate::plugins::node_resources_fit::Units;
use crate::resources::{ResourceList, containers_with_dra, pod_requests_with};
use crate::state::NodeInfo;

/// One of the pod's claims: its name in the pod (`spec.resourceClaims[].name`), the
/// claim's own name, and its devices (the claim's allocation, or the one found now).
pub struct PodClaim<'a> {
    pub pod_claim: &'a str,
    pub claim_name: &'a str,
    pub allocation: &'a AllocationResult,
}

fn maps_anything(device: &Device) -> bool {
    device
        .node_allocatable_resources
        .as_ref()
        .is_some_and(|m| !m.is_empty())
}

/// The statuses of the pod's claims whose devices map node resources, as kube-scheduler
/// writes them to `status.nodeAllocatableResourceClaimStatuses`.
pub fn claim_statuses(
    pod: &Pod,
    claims: &[PodClaim<'_>],
    snapshot: &Snapshot,
    node: &NodeInfo,
) -> Result<Vec<NodeAllocatableResourceClaimStatus>, String> {
    let mut out = Vec::new();
    for claim in claims {
        let results: Vec<&DeviceRequestAllocationResult> = claim
            .allocation
            .devices
            .iter()
            .flat_map(|d| d.results.iter().flatten())
            .collect();
        // Only claims one of whose devices maps something count (a device not found is
        // passed over here, as upstream does).
        if !results
            .iter()
            .any(|r| device_of(snapshot, r, node).is_ok_and(maps_anything))
        {
            continue;
        }
        let mut mapped: BTreeMap<String, Quantity> = BTreeMap::new();
        let mut overhead: BTreeMap<String, (Option<Quantity>, Option<Quantity>)> = BTreeMap::new();
        for result in results {
            let device = device_of(snapshot, result, node).map_err(|e| {
                format!(
                    "claim {}, device {}, driver {}: {e}",
                    claim.claim_name, result.device, result.driver
                )
            })?;
            for (resource, how) in device.node_allocatable_resources.iter().flatten() {
                add_mapping(resource, how, result, claim.claim_name, &mut mapped)?;
                add_overhead(resource, how, &mut overhead)?;
            }
        }
        if mapped.is_empty() && overhead.is_empty() {
            continue;
        }
        out.push(NodeAllocatableResourceClaimStatus {
            resource_claim_name: claim.claim_name.to_string(),
            containers: Some(containers_using(pod, claim.pod_claim)),
            mapping: Some(
                mapped
                    .into_iter()
                    .map(|(name, q)| NodeAllocatableMappedResources {
                        name,
                        quantity: q.to_openapi(),
                    })
                    .collect(),
            ),
            overhead: Some(
                overhead
                    .into_iter()
                    .map(
                        |(name, (per_pod, per_container))| NodeAllocatableOverheadResources {
                            name,
                            per_pod: per_pod.map(|q| q.to_openapi()),
                            per_container: per_container.map(|q| q.to_openapi()),
                        },
                    )
                    .collect(),
            ),
        });
    }
    out.sort_by(|a, b| a.resource_claim_name.cmp(&b.resource_claim_name));
    Ok(out)
}

/// The device a result names, in the slices that reach the node (the first slice of the
/// driver and pool that has it).
fn device_of<'s>(
    snapshot: &'s Snapshot,
    result: &DeviceRequestAllocationResult,
    node: &NodeInfo,
) -> Result<&'s Device, String> {
    let found = snapshot
        .devices_named(&result.driver, &result.pool, &result.device)
        .find(|(slice, _)| slice_reaches(slice, node));
    if let Some((slice, device)) = found {
        if slice.spec.per_device_node_selection == Some(true) && !device_reaches(device, node) {
            return Err(format!("device {} does not match node", result.device));
        }
        return Ok(device);
    }
    Err(format!(
        "device {} not found in pool {} for driver {}",
        result.device, result.pool, result.driver
    ))
}

fn slice_reaches(slice: &ResourceSlice, node: &NodeInfo) -> bool {
    let spec = &slice.spec;
    if let Some(name) = &spec.node_name {
        return name == node.name();
    }
    if spec.all_nodes == Some(true) {
        return true;
    }
    if let Some(selector) = &spec.node_selector {
        return node_selector_terms_match(&selector.node_selector_terms, &node.node);
    }
    spec.per_device_node_selection == Some(true)
}

fn device_reaches(device: &Device, node: &NodeInfo) -> bool {
    device.node_name.as_deref() == Some(node.name())
        || device.all_nodes == Some(true)
        || device
            .node_selector
            .as_ref()
            .is_some_and(|s| node_selector_terms_match(&s.node_selector_terms, &node.node))
}

fn quantity(
    q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    what: &str,
) -> Result<Quantity, String> {
    q.0.parse()
        .map_err(|e| format!("{what}: quantity {:?}: {e}", q.0))
}

/// What one device maps of `resource`: the capacity it consumed (of `capacityKey`) times
/// `capacityMultiplier`, or `deviceMultiplier`.
fn add_mapping(
    resource: &str,
    how: &NodeAllocatableResource,
    result: &DeviceRequestAllocationResult,
    claim: &str,
    mapped: &mut BTreeMap<String, Quantity>,
) -> Result<(), String> {
    let Some(mapping) = &how.mapping else {
        return Ok(());
    };
    let amount = match mapping.capacity_key.as_deref().filter(|k| !k.is_empty()) {
        Some(key) => {
            let Some(consumed) = result.consumed_capacity.as_ref() else {
                return Err(format!(
                    "claim {claim}, device {}: no consumed capacity, but capacity key {key:?} is set in nodeAllocatableResources for resource {resource}",
                    result.device
                ));
            };
            let Some(consumed) = consumed.get(key) else {
                // Not consumed by this allocation: nothing mapped.
                return Ok(());
            };
            let consumed = quantity(consumed, "consumed capacity")?;
            match &mapping.capacity_multiplier {
                Some(m) => times(consumed, quantity(m, "capacityMultiplier")?),
                None => consumed,
            }
        }
        None => match &mapping.device_multiplier {
            Some(m) => quantity(m, "deviceMultiplier")?,
            None => return Ok(()),
        },
    };
    let total = mapped.entry(resource.to_string()).or_default();
    *total = total.checked_add(&amount).unwrap_or(*total);
    Ok(())
}

fn add_overhead(
    resource: &str,
    how: &NodeAllocatableResource,
    overhead: &mut BTreeMap<String, (Option<Quantity>, Option<Quantity>)>,
) -> Result<(), String> {
    let Some(o) = &how.overhead else {
        return Ok(());
    };
    if o.per_pod.is_none() && o.per_container.is_none() {
        return Ok(());
    }
    let (per_pod, per_container) = overhead.entry(resource.to_string()).or_default();
    for (total, add, what) in [
        (per_pod, &o.per_pod, "perPod"),
        (per_container, &o.per_container, "perContainer"),
    ] {
        if let Some(add) = add {
            let add = quantity(add, what)?;
            *total = Some(match total {
                Some(t) => t.checked_add(&add).unwrap_or(*t),
                None => add,
            });
        }
    }
    Ok(())
}

/// `a × b`, exactly to the nano, rounded up below that.
fn times(a: Quantity, b: Quantity) -> Quantity {
    let product = a.nanos().saturating_mul(b.nanos());
    let nanos = product / 1_000_000_000 + i128::from(product % 1_000_000_000 > 0);
    Quantity::from_nanos(nanos, a.format())
}

/// The pod's containers (init containers first) that name `pod_claim` in
/// `resources.claims`.
fn containers_using(pod: &Pod, pod_claim: &str) -> Vec<String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .filter(|c| {
            c.resources
                .as_ref()
                .and_then(|r| r.claims.as_ref())
                .is_some_and(|claims| claims.iter().any(|rc| rc.name == pod_claim))
        })
        .map(|c| c.name.clone())
        .collect()
}

/// Whether the pod's demand with `statuses` fits what the node has left: the reasons
/// ("Insufficient cpu") and whether any exceeds the node's whole allocatable.
pub fn insufficient(
    pod: &Pod,
    statuses: &[NodeAllocatableResourceClaimStatus],
    node: &NodeInfo,
) -> Result<(Vec<String>, bool), String> {
    let demand = Units::of(&pod_requests_with(pod, Some(statuses))?);
    // Holds every name checked below (cpu, memory, ephemeral-storage, hugepages-*).
    let allocatable = &node.allocatable_units;
    let used = &node.requested.units;
    let mut reasons = Vec::new();
    let mut unresolvable = false;
    let checked = |name: &str| {
        name == "cpu"
            || name == "memory"
            || name == "ephemeral-storage"
            || name.starts_with("hugepages-")
    };
    for (name, want) in demand.iter().filter(|(n, _)| checked(n)) {
        let have = allocatable.get(name);
        let hugepages = name.starts_with("hugepages-");
        if (want > 0 || hugepages) && want > have.saturating_sub(used.get(name)) {
            reasons.push(format!("Insufficient {name}"));
            unresolvable |= want > have;
        }
    }
    Ok((reasons, unresolvable))
}

/// Why pod-level `spec.resources` does not cover the containers plus what the devices map
/// (upstream's `validatePodLevelResourcesCoverDRA`): a pod-level request for cpu, memory or
/// hugepages below the containers' sum with the statuses added, or a container's limit plus
/// what the devices map for it above the pod-level limit. `None` when covered. (Upstream's
/// third check, aggregated hugepages limits, is not made.)
pub fn pod_level_shortfall(
    pod: &Pod,
    statuses: &[NodeAllocatableResourceClaimStatus],
) -> Result<Option<String>, String> {
    let Some(level) = pod.spec.as_ref().and_then(|s| s.resources.as_ref()) else {
        return Ok(None);
    };
    if statuses.is_empty() {
        return Ok(None);
    }
    let supported =
        |name: &str| name == "cpu" || name == "memory" || name.starts_with("hugepages-");
    let aggregate = containers_with_dra(pod, Some(statuses))?;
    for (name, wanted) in ResourceList::parse(level.requests.as_ref())?.0 {
        if supported(&name) && aggregate.0.get(&name).is_some_and(|have| *have > wanted) {
            return Ok(Some(format!(
                "pod level request for {name} is insufficient to cover the aggregated container and node-allocatable DRA requests"
            )));
        }
    }
    let pod_limits = ResourceList::parse(level.limits.as_ref())?;
    for c in &pod.spec.as_ref().expect("spec checked").containers {
        let limits = ResourceList::parse(c.resources.as_ref().and_then(|r| r.limits.as_ref()))?;
        let mapped = container_allocations(statuses, &c.name)?;
        for (name, limit) in limits.0 {
            let Some(pod_limit) = pod_limits.0.get(&name) else {
                continue;
            };
            if name.starts_with("hugepages-") {
                continue;
            }
            if limit + mapped.get(&name) > *pod_limit {
                return Ok(Some(format!(
                    "pod level limit for {name} is insufficient to cover the limit and DRA overhead for container {}",
                    c.name
                )));
            }
        }
    }
    Ok(None)
}

/// What the statuses that list `container` map for it: each mapping, and the per-pod and
/// per-container overheads once (upstream's `GetContainerDRAAllocations`).
fn container_allocations(
    statuses: &[NodeAllocatableResourceClaimStatus],
    container: &str,
) -> Result<ResourceList, String> {
    let mut out = ResourceList::default();
    for status in statuses {
        if !status.containers.iter().flatten().any(|c| c == container) {
            continue;
        }
        let mut add = |name: &str, q: Quantity| {
            let entry = out.0.entry(name.to_string()).or_default();
            *entry = entry.checked_add(&q).unwrap_or(*entry);
        };
        for m in status.mapping.iter().flatten() {
            add(&m.name, quantity(&m.quantity, &m.name)?);
        }
        for o in status.overhead.iter().flatten() {
            for q in [&o.per_pod, &o.per_container].into_iter().flatten() {
                add(&o.name, quantity(q, &o.name)?);
            }
        }
    }
    Ok(out)
}

/// Whether the claim's devices map node resources (`mapping`, not overhead alone): such a
/// claim is not shared between pods.
pub fn has_mapped_device(claim: &ResourceClaim, snapshot: &Snapshot) -> bool {
    let Some(allocation) = crate::claims::allocation(claim) else {
        return false;
    };
    allocation
        .devices
        .iter()
        .flat_map(|d| d.results.iter().flatten())
        .filter_map(|r| {
            snapshot
                .devices_named(&r.driver, &r.pool, &r.device)
                .next()
                .map(|(_, d)| d)
        })
        .any(|d| {
            d.node_allocatable_resources
                .iter()
                .flatten()
                .any(|(_, how)| how.mapping.is_some())
        })
}

/// What the statuses add to a pod's requests: each mapping, the per-pod overhead, and the
/// per-container overhead once per container that uses the claim.
pub fn added_requests(
    statuses: &[NodeAllocatableResourceClaimStatus],
) -> Result<ResourceList, String> {
    let mut out = ResourceList::default();
    for status in statuses {
        let mut add = |name: &str, q: Quantity| {
            let entry = out.0.entry(name.to_string()).or_default();
            *entry = entry.checked_add(&q).unwrap_or(*entry);
        };
        for m in status.mapping.iter().flatten() {
            add(&m.name, quantity(&m.quantity, &m.name)?);
        }
        let containers = status.containers.as_ref().map_or(0, Vec::len) as i128;
        for o in status.overhead.iter().flatten() {
            if let Some(q) = &o.per_pod {
                add(&o.name, quantity(q, &o.name)?);
            }
            if let Some(q) = &o.per_container
                && containers > 0
            {
                let q = quantity(q, &o.name)?;
                add(
                    &o.name,
                    Quantity::from_nanos(q.nanos() * containers, q.format()),
                );
            }
        }
    }
    Ok(out)
}
