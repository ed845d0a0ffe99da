//! Turning a compact [`Allocation`] (device entries, chosen subrequests) into the
//! `resource.k8s.io/v1` `AllocationResult`s the API server expects. Kept apart from the
//! search so that a scheduling cycle builds results (strings, configs, node selectors) for
//! the one node it picks, not for every feasible node.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult,
};

use crate::error::AllocError;
use crate::outcome::{Allocation, Picked};
use crate::plan::Plan;
use crate::snapshot::Snapshot;

/// The devices of claim `ci` in `a`, in result order.
fn claim_picks(a: &Allocation, ci: usize) -> impl Iterator<Item = &Picked> {
    a.picks.iter().filter(move |p| p.claim as usize == ci)
}

/// Builds one `AllocationResult` per claim. Every call gives fresh `shareID`s; everything
/// else is the same for the same allocation.
pub(crate) fn results(
    snap: &Snapshot,
    plan: &Plan,
    node_name: &str,
    a: &Allocation,
) -> Result<Vec<AllocationResult>, AllocError> {
    let features = snap.features();
    let mut out = Vec::with_capacity(plan.claims.len());
    for (ci, claim) in plan.claims.iter().enumerate() {
        let mut results = Vec::with_capacity(claim_picks(a, ci).count());
        for pick in claim_picks(a, ci) {
            let p = &plan.reqs[pick.req as usize];
            let (slice, device) = snap.device(pick.entry);
            let parsed = snap.parsed(pick.entry);
            results.push(DeviceRequestAllocationResult {
                request: p.name.clone(),
                driver: slice.spec.driver.clone(),
                pool: slice.spec.pool.name.clone(),
                device: device.name.clone(),
                admin_access: p.admin.then_some(true),
                tolerations: (!p.tolerations.is_empty()).then(|| p.tolerations.clone()),
                binding_conditions: device
                    .binding_conditions
                    .clone()
                    .filter(|_| features.binding_conditions),
                binding_failure_conditions: device
                    .binding_failure_conditions
                    .clone()
                    .filter(|_| features.binding_conditions),
                share_id: pick.share.then(crate::share_id),
                skip_node_operations: slice
                    .spec
                    .skip_node_operations
                    .clone()
                    .filter(|s| features.optional_node_operations && !s.is_empty()),
                consumed_capacity: pick.consumed.as_ref().filter(|c| !c.is_empty()).map(|c| {
                    parsed
                        .capacity
                        .iter()
                        .zip(c)
                        .map(|(cap, q)| (cap.name.clone(), q.to_openapi()))
                        .collect()
                }),
            });
        }
        let node_selector =
            node_selector(snap, a, ci, node_name).map_err(|message| AllocError::InvalidSlice {
                slice: format!("used by claim {}", claim.display),
                message,
            })?;
        out.push(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(results),
                config: Some(configs(plan, a, ci)).filter(|c| !c.is_empty()),
            }),
            node_selector,
            allocation_timestamp: None,
        });
    }
    Ok(out)
}

/// The error [`results`] would return, found without building anything: the search reports
/// it for the attempt, as when results were built eagerly.
pub(crate) fn check(snap: &Snapshot, plan: &Plan, a: &Allocation) -> Result<(), AllocError> {
    for (ci, claim) in plan.claims.iter().enumerate() {
        for pick in claim_picks(a, ci) {
            match placement(snap, pick.entry) {
                Placement::Node => break,
                Placement::Selector(sel) if sel.node_selector_terms.len() > 1 => {
                    return Err(AllocError::InvalidSlice {
                        slice: format!("used by claim {}", claim.display),
                        message: too_many_terms(sel),
                    });
                }
                Placement::Selector(_) | Placement::Anywhere => {}
            }
        }
    }
    Ok(())
}

fn too_many_terms(sel: &NodeSelector) -> String {
    format!(
        "unsupported ResourceSlice.NodeSelector with {} terms",
        sel.node_selector_terms.len()
    )
}

/// Where a device can be used, as the result's node selector sees it.
enum Placement<'a> {
    /// On one node (`nodeName`, or `bindsToNode`): the result names the node.
    Node,
    Selector(&'a NodeSelector),
    Anywhere,
}

fn placement(snap: &Snapshot, entry: u32) -> Placement<'_> {
    let (slice, device) = snap.device(entry);
    let (name, selector) = if slice.spec.per_device_node_selection == Some(true) {
        (device.node_name.as_ref(), device.node_selector.as_ref())
    } else {
        (
            slice.spec.node_name.as_ref(),
            slice.spec.node_selector.as_ref(),
        )
    };
    if name.is_some_and(|n| !n.is_empty()) || device.binds_to_node == Some(true) {
        Placement::Node
    } else if let Some(sel) = selector {
        Placement::Selector(sel)
    } else {
        Placement::Anywhere
    }
}

/// The request chosen for group `g` (its subrequest for `firstAvailable`).
fn chosen_req(plan: &Plan, a: &Allocation, g: usize) -> usize {
    let group = &plan.groups[g];
    match a.quality.ranks[g] {
        Some(i) => group.alts[i],
        None => group.alts[0],
    }
}

fn configs(plan: &Plan, a: &Allocation, ci: usize) -> Vec<DeviceAllocationConfiguration> {
    let claim = &plan.claims[ci];
    let mut out: Vec<DeviceAllocationConfiguration> = Vec::new();
    // Few requests per claim: a list is cheaper than a map.
    let mut class_ranges: Vec<(&str, (usize, usize))> = Vec::new();
    let chosen: Vec<usize> = claim
        .groups
        .clone()
        .map(|g| chosen_req(plan, a, g))
        .collect();
    for &r in &chosen {
        let p = &plan.reqs[r];
        if let Some(&(_, (a, b))) = class_ranges.iter().find(|(n, _)| *n == p.class_name) {
            for c in &mut out[a..b] {
                c.requests.get_or_insert_with(Vec::new).push(p.name.clone());
            }
            continue;
        }
        let a = out.len();
        for cfg in p.class.spec.iter().flat_map(|s| s.config.iter().flatten()) {
            out.push(DeviceAllocationConfiguration {
                source: "FromClass".into(),
                requests: Some(vec![p.name.clone()]),
                opaque: cfg.opaque.clone(),
            });
        }
        class_ranges.push((&p.class_name, (a, out.len())));
    }
    let claim_configs = claim
        .claim
        .spec
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .and_then(|d| d.config.as_ref());
    for cfg in claim_configs.into_iter().flatten() {
        let names = cfg.requests.clone().unwrap_or_default();
        let applies = names.is_empty()
            || chosen.iter().any(|&r| {
                let p = &plan.reqs[r];
                names.contains(&p.base) || (p.sub.is_some() && names.contains(&p.name))
            });
        if applies {
            out.push(DeviceAllocationConfiguration {
                source: "FromClaim".into(),
                requests: cfg.requests.clone().filter(|r| !r.is_empty()),
                opaque: cfg.opaque.clone(),
            });
        }
    }
    // A config naming every request applies to all: say so with an empty list.
    for c in &mut out {
        let Some(names) = &c.requests else { continue };
        let covers_all = chosen.iter().all(|&r| {
            let p = &plan.reqs[r];
            names.contains(&p.base) || (p.sub.is_some() && names.contains(&p.name))
        });
        if covers_all {
            c.requests = None;
        }
    }
    out
}

fn node_selector(
    snap: &Snapshot,
    a: &Allocation,
    ci: usize,
    node_name: &str,
) -> Result<Option<NodeSelector>, String> {
    let mut fields: Vec<NodeSelectorRequirement> = Vec::new();
    let mut exprs: Vec<NodeSelectorRequirement> = Vec::new();
    for pick in claim_picks(a, ci) {
        match placement(snap, pick.entry) {
            Placement::Node => {
                return Ok(Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_fields: Some(vec![NodeSelectorRequirement {
                            key: "metadata.name".into(),
                            operator: "In".into(),
                            values: Some(vec![node_name.to_string()]),
                        }]),
                        match_expressions: None,
                    }],
                }));
            }
            Placement::Selector(sel) => match sel.node_selector_terms.as_slice() {
                [] => {}
                [term] => {
                    merge_requirements(
                        term.match_fields.as_deref().unwrap_or_default(),
                        &mut fields,
                    );
                    merge_requirements(
                        term.match_expressions.as_deref().unwrap_or_default(),
                        &mut exprs,
                    );
                }
                _ => return Err(too_many_terms(sel)),
            },
            Placement::Anywhere => {}
        }
    }
    if fields.is_empty() && exprs.is_empty() {
        return Ok(None);
    }
    Ok(Some(NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: (!exprs.is_empty()).then_some(exprs),
            match_fields: (!fields.is_empty()).then_some(fields),
        }],
    }))
}

fn merge_requirements(from: &[NodeSelectorRequirement], to: &mut Vec<NodeSelectorRequirement>) {
    for r in from {
        let values: HashSet<&String> = r.values.iter().flatten().collect();
        let dup = to.iter().any(|e| {
            e.key == r.key
                && e.operator == r.operator
                && e.values.iter().flatten().collect::<HashSet<_>>() == values
        });
        if !dup {
            to.push(r.clone());
        }
    }
}
