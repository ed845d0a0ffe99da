//! Turning a pod's claims into a node-independent plan: classes resolved, selectors compiled,
//! requests and subrequests flattened into "groups" (one per request; a group with
//! `firstAvailable` has one alternative per subrequest). Invalid claims fail here, once per
//! pod, not once per node.

use std::sync::Arc;

use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceDerivedAttribute, DeviceToleration, ResourceClaim,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use crate::error::AllocError;
use crate::quantity::Quantity;
use crate::snapshot::Snapshot;

/// At most this many results per claim (resource.k8s.io/v1 AllocationResultsMaxSize).
pub const MAX_RESULTS_PER_CLAIM: usize = 32;
/// At most this many subrequests in `firstAvailable`.
pub const MAX_SUBREQUESTS: usize = 8;

#[derive(Clone, Debug)]
pub(crate) struct CompiledSelector {
    pub expr: u32,
    pub selector: Arc<dra_cel::Selector>,
    /// What the expression reads of a device, when its text tells (see [`crate::reads`]).
    pub reads: Option<Arc<[crate::intern::ReadIds]>>,
}

/// One request, or one subrequest of a `firstAvailable` request.
#[derive(Debug)]
pub(crate) struct ReqPlan {
    pub claim: usize,
    pub group: usize,
    /// `request` or `request/subrequest`: the name results carry.
    pub name: String,
    pub base: String,
    pub sub: Option<String>,
    pub sub_index: usize,
    pub class: DeviceClass,
    pub class_name: String,
    pub class_selectors: Vec<CompiledSelector>,
    pub selectors: Vec<CompiledSelector>,
    pub admin: bool,
    pub all: bool,
    pub count: usize,
    pub tolerations: Vec<DeviceToleration>,
    /// `capacity.requests`, parsed; `None` when the request has no capacity stanza.
    pub capacity: Option<Vec<(String, Quantity, ApiQuantity)>>,
    /// Indices of the claim's constraints that cover this (sub)request.
    pub constraints: Vec<usize>,
    /// DRADerivedAttributes: attribute name → its expression, compiled (or why not: an
    /// error only when a constraint looks the attribute up, as upstream compiles lazily).
    pub derived: Vec<Derived>,
}

/// A request's derived attribute.
#[derive(Debug)]
pub(crate) struct Derived {
    pub name: String,
    pub expression: String,
    pub compiled: Result<std::sync::Arc<dra_cel::Selector>, dra_cel::CelError>,
}

#[derive(Debug)]
pub(crate) struct GroupPlan {
    pub claim: usize,
    pub alts: Vec<usize>,
    pub first_available: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConstraintKind {
    Match,
    Distinct,
}

#[derive(Debug)]
pub(crate) struct ConstraintPlan {
    pub kind: ConstraintKind,
    pub attribute: String,
}

#[derive(Debug)]
pub(crate) struct ClaimPlan {
    pub claim: ResourceClaim,
    pub display: String,
    pub constraints: Vec<ConstraintPlan>,
    pub groups: std::ops::Range<usize>,
}

#[derive(Debug)]
pub(crate) struct Plan {
    /// Prefer devices that keep whole NUMA domains free (off: upstream's first fit).
    pub packing: bool,
    pub claims: Vec<ClaimPlan>,
    pub groups: Vec<GroupPlan>,
    pub reqs: Vec<ReqPlan>,
}

pub(crate) fn claim_display(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

fn compile(
    snapshot: &Snapshot,
    selectors: Option<&Vec<k8s_openapi::api::resource::v1::DeviceSelector>>,
    claim: &str,
    request: &str,
    context: impl Fn(usize) -> String,
) -> Result<Vec<CompiledSelector>, AllocError> {
    let mut out = Vec::new();
    for (i, sel) in selectors.into_iter().flatten().enumerate() {
        let Some(cel) = &sel.cel else {
            return Err(AllocError::InvalidClaim {
                claim: claim.to_string(),
                message: format!(
                    "request {request}, selector #{i}: CEL expression empty (unsupported selector type?)"
                ),
            });
        };
        let compiled = snapshot
            .compile(&cel.expression)
            .map_err(|e| AllocError::Cel {
                context: context(i),
                source: e.with_context(context(i)),
            })?;
        out.push(CompiledSelector {
            expr: snapshot.expr_id(&cel.expression),
            selector: compiled.selector,
            reads: compiled.reads.map(|r| snapshot.resolve_reads(&r).into()),
        });
    }
    Ok(out)
}

impl Plan {
    pub(crate) fn new(snapshot: &Snapshot, claims: &[&ResourceClaim]) -> Result<Plan, AllocError> {
        let features = snapshot.features();
        let mut plan = Plan {
            packing: false,
            claims: Vec::new(),
            groups: Vec::new(),
            reqs: Vec::new(),
        };
        for (ci, claim) in claims.iter().enumerate() {
            let display = claim_display(claim);
            let invalid = |message: String| AllocError::InvalidClaim {
                claim: display.clone(),
                message,
            };
            let devices = claim.spec.as_ref().and_then(|s| s.devices.as_ref());
            let requests = devices
                .and_then(|d| d.requests.as_deref())
                .unwrap_or_default();
            let mut constraints = Vec::new();
            let mut constraint_requests = Vec::new();
            for (i, c) in devices
                .and_then(|d| d.constraints.as_deref())
                .unwrap_or_default()
                .iter()
                .enumerate()
            {
                let (kind, attribute) = match (&c.match_attribute, &c.distinct_attribute) {
                    (Some(a), _) => (ConstraintKind::Match, a.clone()),
                    (None, Some(a)) => (ConstraintKind::Distinct, a.clone()),
                    (None, None) => {
                        return Err(invalid(format!(
                            "constraint #{i}: empty constraint (unsupported constraint type?)"
                        )));
                    }
                };
                constraints.push(ConstraintPlan { kind, attribute });
                constraint_requests.push(c.requests.clone().unwrap_or_default());
            }
            let group_start = plan.groups.len();
            let mut min_devices = 0usize;
            for request in requests {
                let group = plan.groups.len();
                let mut alts = Vec::new();
                let subs = request.first_available.as_deref().unwrap_or_default();
                let first_available = !subs.is_empty();
                if first_available && !features.prioritized_list {
                    return Err(invalid(format!(
                        "request {}: has subrequests, but the DRAPrioritizedList feature is disabled",
                        request.name
                    )));
                }
                if subs.len() > MAX_SUBREQUESTS {
                    return Err(invalid(format!(
                        "request {}: more than {MAX_SUBREQUESTS} subrequests",
                        request.name
                    )));
                }
                let mut min_for_request = usize::MAX;
                let mut add = |plan: &mut Plan, r: ReqPlan| {
                    min_for_request = if r.all {
                        0
                    } else {
                        min_for_request.min(r.count)
                    };
                    alts.push(plan.reqs.len());
                    plan.reqs.push(r);
                };
                let make = |name: &str,
                            sub: Option<(usize, &str)>,
                            class_name: &str,
                            mode: Option<&str>,
                            count: Option<i64>,
                            admin: Option<bool>,
                            selectors,
                            tolerations: Option<&Vec<DeviceToleration>>,
                            capacity: Option<
                    &k8s_openapi::api::resource::v1::CapacityRequirements,
                >,
                            derived: Option<&Vec<DeviceDerivedAttribute>>|
                 -> Result<ReqPlan, AllocError> {
                    let full = match sub {
                        Some((_, s)) => format!("{name}/{s}"),
                        None => name.to_string(),
                    };
                    let derived = derived.map(Vec::as_slice).unwrap_or_default();
                    if !derived.is_empty() && !features.derived_attributes {
                        return Err(invalid(format!(
                            "request {full}: cannot handle request with derived attributes, the feature is disabled"
                        )));
                    }
                    let derived = derived
                        .iter()
                        .map(|d| Derived {
                            name: d.name.clone(),
                            expression: d.expression.clone(),
                            compiled: snapshot.compile_derived(&d.expression),
                        })
                        .collect();
                    if admin.is_some() && !features.admin_access {
                        return Err(invalid(format!(
                            "request {full}: admin access is requested, but the feature is disabled"
                        )));
                    }
                    if capacity.is_some() && !features.consumable_capacity {
                        return Err(invalid(format!(
                            "request {full}: has capacity requests, but the DRAConsumableCapacity feature is disabled"
                        )));
                    }
                    if class_name.is_empty() {
                        return Err(invalid(format!(
                            "request {full}: missing device class name (unsupported request type?)"
                        )));
                    }
                    let Some(class) = snapshot.class(class_name) else {
                        return Err(AllocError::MissingClass {
                            claim: display.clone(),
                            request: full,
                            class: class_name.to_string(),
                        });
                    };
                    let class_selectors = compile(
                        snapshot,
                        class.spec.as_ref().and_then(|s| s.selectors.as_ref()),
                        &display,
                        &full,
                        |i| format!("class {class_name}: selector #{i}"),
                    )?;
                    let req_selectors = compile(snapshot, selectors, &display, &full, |i| {
                        format!("claim {display}, request {full}: selector #{i}")
                    })?;
                    let (all, count) = match mode.unwrap_or("ExactCount") {
                        "ExactCount" => {
                            let c = count.unwrap_or(1);
                            if c < 1 {
                                return Err(invalid(format!(
                                    "request {full}: count {c} must be positive"
                                )));
                            }
                            (false, c as usize)
                        }
                        "All" => (true, 0),
                        other => {
                            return Err(invalid(format!(
                                "request {full}: unsupported count mode {other}"
                            )));
                        }
                    };
                    let capacity = match capacity.and_then(|c| c.requests.as_ref()) {
                        None => None,
                        Some(reqs) => {
                            let mut v = Vec::new();
                            for (k, q) in reqs {
                                let parsed = Quantity::from_openapi(q).map_err(|e| {
                                    invalid(format!("request {full}: capacity {k}: {e}"))
                                })?;
                                v.push((k.clone(), parsed, q.clone()));
                            }
                            Some(v)
                        }
                    };
                    let constraints = constraint_requests
                        .iter()
                        .enumerate()
                        .filter(|(_, names)| {
                            names.is_empty() || names.iter().any(|n| n == name || *n == full)
                        })
                        .map(|(i, _)| i)
                        .collect();
                    Ok(ReqPlan {
                        claim: ci,
                        group,
                        name: full,
                        base: name.to_string(),
                        sub: sub.map(|(_, s)| s.to_string()),
                        sub_index: sub.map(|(i, _)| i).unwrap_or(0),
                        class: class.clone(),
                        class_name: class_name.to_string(),
                        class_selectors,
                        selectors: req_selectors,
                        admin: admin.unwrap_or(false),
                        all,
                        count,
                        tolerations: tolerations.cloned().unwrap_or_default(),
                        capacity,
                        constraints,
                        derived,
                    })
                };
                if first_available {
                    for (si, s) in subs.iter().enumerate() {
                        let r = make(
                            &request.name,
                            Some((si, &s.name)),
                            &s.device_class_name,
                            s.allocation_mode.as_deref(),
                            s.count,
                            None,
                            s.selectors.as_ref(),
                            s.tolerations.as_ref(),
                            s.capacity.as_ref(),
                            s.derived_attributes.as_ref(),
                        )?;
                        add(&mut plan, r);
                    }
                } else {
                    let Some(e) = &request.exactly else {
                        return Err(invalid(format!(
                            "request {}: neither exactly nor firstAvailable is set",
                            request.name
                        )));
                    };
                    let r = make(
                        &request.name,
                        None,
                        &e.device_class_name,
                        e.allocation_mode.as_deref(),
                        e.count,
                        e.admin_access,
                        e.selectors.as_ref(),
                        e.tolerations.as_ref(),
                        e.capacity.as_ref(),
                        e.derived_attributes.as_ref(),
                    )?;
                    add(&mut plan, r);
                }
                if min_for_request > MAX_RESULTS_PER_CLAIM - min_devices {
                    return Err(invalid(format!(
                        "request {}: adding {min_for_request} devices exceeds the claim limit of {MAX_RESULTS_PER_CLAIM}, with {min_devices} already accounted for",
                        request.name
                    )));
                }
                min_devices += min_for_request;
                plan.groups.push(GroupPlan {
                    claim: ci,
                    alts,
                    first_available,
                });
            }
            plan.claims.push(ClaimPlan {
                claim: (*claim).clone(),
                display,
                constraints,
                groups: group_start..plan.groups.len(),
            });
        }
        Ok(plan)
    }
}
