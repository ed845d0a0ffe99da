//! `kubectl dra why POD`: the engine run on the cluster's state for one pod, read-only, and
//! what it says per node group, with the devices behind its counts named; then the smallest
//! changes that would let the pod run, each checked by running the engine again on a copy
//! of the state with that change made:
//!
//! - **Preemption**: the node and the victims the daemon's PostFilter would choose
//!   ([`Engine::preempt_with_groups`], the same call with the same PodDisruptionBudgets and
//!   PodGroups), and the other nodes where evicting lower-priority pods would also do.
//! - **Relaxing**: which single selector or constraint of the pod's claims, dropped, lets
//!   it fit, and where.
//! - **Missing devices**: per request that no node can meet, how many more devices of its
//!   class (matching its selectors) one node would need; checked by adding copies of a
//!   matching device to that node.
//!
//! [`explain`] decides (no I/O); [`text`] renders what a person reads; the same
//! [`Why`] serialises as JSON.

use std::collections::BTreeMap;

use dra_engine::explain::{self, DeviceVerdict, RequestDevices};
use dra_engine::inventory::Inventory;
use dra_engine::{Decision, Engine, ObjectKey};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use serde::Serialize;

/// Nodes of one group whose devices are named; the rest are counted.
const NODES_DETAILED: usize = 5;
/// Devices named per request on a node; the rest are counted.
const DEVICES_NAMED: usize = 8;
/// Other nodes where preemption would also do, at most, and how many nodes are tried for
/// them (each is a preemption search of its own).
const OTHER_PREEMPTIONS: usize = 5;
const NODES_TRIED_FOR_PREEMPTION: usize = 20;
/// Nodes named where a relaxed pod fits; the rest are counted.
const NODES_NAMED: usize = 5;

/// What the engine says about one pod, and what would make it fit.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Why {
    pub pod: String,
    pub priority: i32,
    pub scheduler_name: String,
    /// `bound`, `terminating`, `waiting` (for its claims), `fits`, `unschedulable` or
    /// `error`.
    pub status: String,
    /// Its node, when bound.
    pub node: Option<String>,
    /// The scheduler's own words: its unschedulable message, or why it waits.
    pub message: Option<String>,
    pub claims: Vec<PodClaim>,
    /// Where it fits now (status `fits`).
    pub fits_on: Vec<String>,
    /// Nodes that said no for the same reason, with the devices behind it named.
    pub node_groups: Vec<NodeGroup>,
    pub preemption: Option<PreemptionAnswer>,
    pub relaxations: Vec<Relaxation>,
    pub missing: Vec<Missing>,
}

/// One of the pod's `resourceClaims`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodClaim {
    /// Its name in the pod spec.
    pub name: String,
    /// `namespace/name` of the ResourceClaim, once there is one.
    pub claim: Option<String>,
    /// `pending`, `allocated` or `reserved`; `missing` before it exists.
    pub state: String,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeGroup {
    /// What Filter said on each of these nodes.
    pub reason: String,
    pub nodes: Vec<String>,
    /// For the first nodes of the group: the requests that cannot be met there.
    pub details: Vec<NodeDetail>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeDetail {
    pub node: String,
    pub requests: Vec<RequestOnNode>,
}

/// One request (or `firstAvailable` subrequest) that the node cannot meet, with its devices.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestOnNode {
    /// The pod's name for the claim.
    pub claim: String,
    pub request: String,
    pub class: String,
    /// `None`: all matching devices.
    pub needed: Option<i64>,
    /// Devices of the class on the node.
    pub in_class: usize,
    /// The devices that match the selectors, each with its state and holder.
    pub matching: Vec<DeviceUse>,
    /// Per selector that rejects devices of the class here: which, and what it read.
    pub rejected: Vec<Rejection>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceUse {
    pub device: String,
    /// `free`, `allocated`, `tainted` or `blocked` (by shared counters).
    pub state: String,
    /// Who holds it: the pods (or PodGroups) its claim is reserved for, else the claim.
    pub holder: Option<String>,
    pub taints: Vec<String>,
    /// For a blocked device: each counter short, and who uses that counter set.
    pub counters: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rejection {
    pub selector: String,
    /// Each rejected device with the values the selector read (or the CEL error).
    pub devices: Vec<RejectedDevice>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RejectedDevice {
    pub device: String,
    pub values: Vec<(String, String)>,
    pub error: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreemptionAnswer {
    /// The daemon's choice: the node and the pods it would evict.
    pub node: Option<String>,
    pub victims: Vec<String>,
    /// Why preemption does not help, when it does not.
    pub reason: Option<String>,
    /// Other nodes where evicting lower-priority pods would also let it fit.
    pub others: Vec<PreemptionOption>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreemptionOption {
    pub node: String,
    pub victims: Vec<String>,
}

/// One selector or constraint dropped, and where the pod then fits.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Relaxation {
    pub claim: String,
    /// `selector` or `constraint`.
    pub kind: String,
    /// The request (`request/subrequest`) whose selector it is; for a constraint, its
    /// requests.
    pub request: String,
    /// The selector's expression, or the constraint (`matchAttribute ...`).
    pub what: String,
    pub fits_on: Vec<String>,
    /// The devices the claim would get on the node the scheduler would pick.
    pub devices: Vec<String>,
}

/// A request no node can meet: how many more devices one node needs.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Missing {
    pub claim: String,
    pub request: String,
    pub class: String,
    pub needed: i64,
    /// Devices of the class matching the request's selectors, anywhere; how many are free.
    pub matching: usize,
    pub free: usize,
    /// The node with the most free matching devices, and how many it has.
    pub node: Option<String>,
    pub free_on_node: usize,
    pub missing: i64,
    /// Checked by the engine with that many copies of a matching device added to `node`:
    /// whether the pod then fits there. `None`: no device matches to copy.
    pub fits_with_them: Option<bool>,
}

/// What the engine says about `pod_key`, and what would make it fit. The engine's state is
/// not changed (every change is tried on a fork).
pub fn explain(
    engine: &mut Engine,
    pod_key: &ObjectKey,
    pdbs: &[PodDisruptionBudget],
    pod_groups: &[PodGroup],
) -> Result<Why, String> {
    let pod = engine
        .state()
        .pods
        .get(pod_key)
        .cloned()
        .ok_or_else(|| format!("pod {pod_key} not found"))?;
    let spec = pod.spec.clone().unwrap_or_default();
    let mut why = Why {
        pod: pod_key.to_string(),
        priority: spec.priority.unwrap_or(0),
        scheduler_name: spec
            .scheduler_name
            .clone()
            .unwrap_or("default-scheduler".into()),
        claims: pod_claims(engine, &pod, pod_key),
        ..Default::default()
    };
    if let Some(node) = spec.node_name.filter(|n| !n.is_empty()) {
        why.status = "bound".into();
        why.node = Some(node);
        return Ok(why);
    }
    if pod.metadata.deletion_timestamp.is_some() {
        why.status = "terminating".into();
        return Ok(why);
    }
    let claims = match dra_engine::claims::of_pod(&pod, engine.state()) {
        Ok(keys) => keys,
        Err(e) => {
            why.status = "waiting".into();
            why.message = Some(e.message);
            return Ok(why);
        }
    };
    let evaluation = engine.evaluate(pod_key);
    if let Some(error) = evaluation.error {
        why.status = "error".into();
        why.message = Some(error);
        return Ok(why);
    }
    if !evaluation.feasible.is_empty() {
        why.status = "fits".into();
        why.fits_on = evaluation.feasible;
        return Ok(why);
    }
    why.status = "unschedulable".into();
    why.message = engine.schedule(pod_key).message().map(String::from);
    let inventory = Inventory::of(engine.state());
    let to_allocate: Vec<&ResourceClaim> = claims
        .iter()
        .map(|k| &*engine.state().claims[k])
        .filter(|c| dra_engine::claims::allocation(c).is_none())
        .collect();
    let requests: Vec<RequestDevices> = to_allocate
        .iter()
        .flat_map(|c| explain::requests(engine.state(), &inventory, c))
        .collect();
    let names = claim_names(&why.claims);
    why.node_groups = node_groups(&evaluation.unfit, &requests, &inventory, &names);
    why.preemption = Some(preemption(engine, pod_key, pdbs, pod_groups));
    let to_allocate: Vec<ResourceClaim> = to_allocate.into_iter().cloned().collect();
    why.relaxations = relaxations(engine, pod_key, &to_allocate, &names);
    why.missing = missing(engine, pod_key, &requests, &inventory, &names);
    Ok(why)
}

fn pod_claims(engine: &Engine, pod: &Pod, pod_key: &ObjectKey) -> Vec<PodClaim> {
    let spec = pod.spec.as_ref();
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref());
    let mut out = Vec::new();
    for pc in spec
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
    {
        let name = pc.resource_claim_name.clone().or_else(|| {
            statuses?
                .iter()
                .find(|s| s.name == pc.name)?
                .resource_claim_name
                .clone()
        });
        let key = name.map(|n| ObjectKey::new(&pod_key.namespace, n));
        let state = match key.as_ref().and_then(|k| engine.state().claims.get(k)) {
            None => "missing",
            Some(c) if dra_engine::claims::allocation(c).is_none() => "pending",
            Some(c) if dra_engine::claims::reserved_for(c).is_empty() => "allocated",
            Some(_) => "reserved",
        };
        out.push(PodClaim {
            name: pc.name.clone(),
            claim: key.map(|k| k.to_string()),
            state: state.into(),
        });
    }
    out
}

/// The pod's name for each claim it uses: `namespace/claim` -> name in the pod spec.
fn claim_names(claims: &[PodClaim]) -> BTreeMap<String, String> {
    claims
        .iter()
        .filter_map(|c| Some((c.claim.clone()?, c.name.clone())))
        .collect()
}

fn name_of(names: &BTreeMap<String, String>, claim: &ObjectKey) -> String {
    names
        .get(&claim.to_string())
        .cloned()
        .unwrap_or_else(|| claim.to_string())
}

/// The top-level request of a request or subrequest name.
fn top(request: &str) -> &str {
    request.split('/').next().unwrap_or(request)
}

/// Requests grouped as the allocator meets them: a request, or all the subrequests of one
/// `firstAvailable` list (any one of them will do).
fn alternatives(requests: &[RequestDevices]) -> Vec<Vec<&RequestDevices>> {
    let mut groups: Vec<Vec<&RequestDevices>> = Vec::new();
    for r in requests {
        match groups.last_mut() {
            Some(g) if g[0].claim == r.claim && top(&g[0].request) == top(&r.request) => g.push(r),
            _ => groups.push(vec![r]),
        }
    }
    groups
}

/// Whether the request can be met by these devices alone (count or all).
fn met_by(request: &RequestDevices, devices: &[&DeviceVerdict], inventory: &Inventory) -> bool {
    let usable = devices.iter().filter(|v| v.usable(inventory)).count();
    match request.count {
        Some(n) => usable as i64 >= n,
        None => {
            let matching = devices.iter().filter(|v| v.matches()).count();
            matching > 0 && usable == matching
        }
    }
}

fn node_groups(
    unfit: &BTreeMap<String, String>,
    requests: &[RequestDevices],
    inventory: &Inventory,
    names: &BTreeMap<String, String>,
) -> Vec<NodeGroup> {
    let mut by_reason: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (node, reason) in unfit {
        by_reason.entry(reason).or_default().push(node);
    }
    let mut groups: Vec<NodeGroup> = by_reason
        .into_iter()
        .map(|(reason, nodes)| NodeGroup {
            reason: reason.to_string(),
            details: nodes
                .iter()
                .take(NODES_DETAILED)
                .map(|node| NodeDetail {
                    node: node.to_string(),
                    requests: unmet_on(node, requests, inventory, names),
                })
                .filter(|d| !d.requests.is_empty())
                .collect(),
            nodes: nodes.into_iter().map(String::from).collect(),
        })
        .collect();
    // The most nodes first, as the scheduler's message counts them.
    groups.sort_by_key(|g| std::cmp::Reverse(g.nodes.len()));
    groups
}

/// The requests `node` cannot meet, each with the devices of its class there.
fn unmet_on(
    node: &str,
    requests: &[RequestDevices],
    inventory: &Inventory,
    names: &BTreeMap<String, String>,
) -> Vec<RequestOnNode> {
    let mut out = Vec::new();
    for group in alternatives(requests) {
        let here: Vec<Vec<&DeviceVerdict>> =
            group.iter().map(|r| r.on_node(inventory, node)).collect();
        if group
            .iter()
            .zip(&here)
            .any(|(r, d)| met_by(r, d, inventory))
        {
            continue;
        }
        for (request, devices) in group.into_iter().zip(here) {
            out.push(request_on_node(request, &devices, inventory, names));
        }
    }
    out
}

fn request_on_node(
    request: &RequestDevices,
    devices: &[&DeviceVerdict],
    inventory: &Inventory,
    names: &BTreeMap<String, String>,
) -> RequestOnNode {
    let matching = devices
        .iter()
        .filter(|v| v.matches())
        .map(|v| {
            let info = &inventory.devices[v.device];
            let (state, holder) = match &info.claim {
                Some(claim) => ("allocated", Some(holder(claim, &info.reserved_for))),
                None if !v.untolerated.is_empty() => ("tainted", None),
                None if !v.short_counters.is_empty() => ("blocked", None),
                None => ("free", None),
            };
            let counters = counters_short(v, inventory);
            DeviceUse {
                device: info.name.clone(),
                state: state.into(),
                holder,
                taints: v.untolerated.clone(),
                counters,
            }
        })
        .collect();
    let mut rejected: Vec<Rejection> = Vec::new();
    for (i, selector) in request.selectors.iter().enumerate() {
        let devices: Vec<RejectedDevice> = devices
            .iter()
            .filter_map(|v| {
                let (at, error) = v.rejected_by.as_ref()?;
                (*at == i).then(|| {
                    let info = &inventory.devices[v.device];
                    let mut values = v.reads.clone();
                    // The product, so that "16Gi" reads as "a Tesla T10's 16Gi".
                    if let Some(product) = &info.product
                        && !values.iter().any(|(_, value)| value == product)
                    {
                        values.insert(0, ("productName".into(), product.clone()));
                    }
                    RejectedDevice {
                        device: info.name.clone(),
                        values,
                        error: error.clone(),
                    }
                })
            })
            .collect();
        if !devices.is_empty() {
            rejected.push(Rejection {
                selector: selector.clone(),
                devices,
            });
        }
    }
    RequestOnNode {
        claim: name_of(names, &request.claim),
        request: request.request.clone(),
        class: request.class.clone(),
        needed: request.count,
        in_class: devices.len(),
        matching,
        rejected,
    }
}

/// Per counter set a device is short of: the counters short, then who uses the set.
fn counters_short(v: &DeviceVerdict, inventory: &Inventory) -> Vec<String> {
    let mut by_set: BTreeMap<&str, (Vec<String>, &[usize])> = BTreeMap::new();
    for c in &v.short_counters {
        let (set, counter) = c.counter.split_once('/').unwrap_or(("", &c.counter));
        let entry = by_set.entry(set).or_insert((Vec::new(), &c.used_by));
        entry
            .0
            .push(format!("{counter} needs {}, {} left", c.needs, c.left));
    }
    by_set
        .into_iter()
        .map(|(set, (short, used_by))| {
            let users: Vec<String> = used_by
                .iter()
                .map(|&i| {
                    let user = &inventory.devices[i];
                    match &user.claim {
                        Some(claim) => {
                            format!("{} for {}", user.name, holder(claim, &user.reserved_for))
                        }
                        None => user.name.clone(),
                    }
                })
                .collect();
            let used = if users.is_empty() {
                String::new()
            } else {
                format!("; used by {}", named(&users, DEVICES_NAMED))
            };
            format!("{set}: {}{used}", named(&short, 2))
        })
        .collect()
}

/// Who holds a device allocated to `claim`: the pods (`namespace/name`) or PodGroups its
/// claim is reserved for, else the claim itself.
fn holder(claim: &ObjectKey, reserved_for: &[String]) -> String {
    if reserved_for.is_empty() {
        return format!("claim {claim} (reserved for nobody)");
    }
    reserved_for
        .iter()
        .map(|r| match r.split_once('/') {
            Some(("pods", name)) => format!("{}/{name}", claim.namespace),
            Some(("podgroups", name)) => format!("PodGroup {}/{name}", claim.namespace),
            _ => r.clone(),
        })
        .collect::<Vec<_>>()
        .join(" and ")
}

fn victims(preemption: &dra_engine::Preemption) -> Vec<String> {
    preemption
        .victims
        .iter()
        .map(|v| v.pod.to_string())
        .collect()
}

/// The daemon's PostFilter on a fork: its node and victims; then, for the other nodes in
/// name order, the same search with every node but that one cordoned.
fn preemption(
    engine: &Engine,
    pod_key: &ObjectKey,
    pdbs: &[PodDisruptionBudget],
    pod_groups: &[PodGroup],
) -> PreemptionAnswer {
    let budget = engine.config().filter_timeout;
    let chosen = match engine
        .fork()
        .preempt_with_groups(pod_key, budget, pdbs, pod_groups)
    {
        Ok(p) => p,
        Err(reason) => {
            return PreemptionAnswer {
                reason: Some(reason),
                ..Default::default()
            };
        }
    };
    let mut others = Vec::new();
    let started = std::time::Instant::now();
    let candidates = engine.state().nodes.keys().filter(|n| **n != chosen.node);
    for name in candidates.take(NODES_TRIED_FOR_PREEMPTION) {
        // The other nodes are a courtesy: they get one search budget between them.
        if others.len() >= OTHER_PREEMPTIONS || started.elapsed() > budget {
            break;
        }
        let mut fork = engine.fork();
        for (other, info) in &engine.state().nodes {
            if other != name {
                let mut node = Node::clone(&info.node);
                node.spec.get_or_insert_default().unschedulable = Some(true);
                fork.upsert_node(node);
            }
        }
        if let Ok(p) = fork.preempt_with_groups(pod_key, budget, pdbs, pod_groups)
            && p.node == *name
        {
            others.push(PreemptionOption {
                node: p.node.clone(),
                victims: victims(&p),
            });
        }
    }
    PreemptionAnswer {
        node: Some(chosen.node.clone()),
        victims: victims(&chosen),
        reason: None,
        others,
    }
}

/// Each selector of each request, and each constraint, of the claims to allocate, dropped
/// one at a time on a fork: those with which the pod fits.
fn relaxations(
    engine: &Engine,
    pod_key: &ObjectKey,
    claims: &[ResourceClaim],
    names: &BTreeMap<String, String>,
) -> Vec<Relaxation> {
    let mut out = Vec::new();
    for claim in claims {
        let key = ObjectKey::of(&claim.metadata);
        for (variant, kind, request, what) in variants(claim) {
            let mut fork = engine.fork();
            fork.state_mut().upsert_claim(variant);
            let fits_on = fork.evaluate(pod_key).feasible;
            if fits_on.is_empty() {
                continue;
            }
            let devices = match fork.schedule(pod_key) {
                Decision::Scheduled(p) => p
                    .claims
                    .iter()
                    .filter(|c| c.key == key)
                    .flat_map(|c| c.allocation.iter())
                    .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
                    .map(|r| format!("{}/{}/{}", r.driver, r.pool, r.device))
                    .collect(),
                _ => Vec::new(),
            };
            out.push(Relaxation {
                claim: name_of(names, &key),
                kind: kind.into(),
                request,
                what,
                fits_on,
                devices,
            });
        }
    }
    out
}

/// The claim with one selector or one constraint dropped, each way it can be:
/// `(claim, kind, request, what)`.
fn variants(claim: &ResourceClaim) -> Vec<(ResourceClaim, &'static str, String, String)> {
    let mut out = Vec::new();
    let Some(devices) = claim.spec.as_ref().and_then(|s| s.devices.as_ref()) else {
        return out;
    };
    let with = |change: &dyn Fn(&mut k8s_openapi::api::resource::v1::DeviceClaim)| {
        let mut copy = claim.clone();
        change(
            copy.spec
                .as_mut()
                .and_then(|s| s.devices.as_mut())
                .expect("a device claim"),
        );
        copy
    };
    let cel = |s: &k8s_openapi::api::resource::v1::DeviceSelector| {
        s.cel
            .as_ref()
            .map(|c| c.expression.clone())
            .unwrap_or_default()
    };
    for (r, request) in devices.requests.iter().flatten().enumerate() {
        if let Some(exact) = &request.exactly {
            for (s, selector) in exact.selectors.iter().flatten().enumerate() {
                let variant = with(&|d| {
                    let requests = d.requests.as_mut().expect("requests");
                    let exact = requests[r].exactly.as_mut().expect("exactly");
                    exact.selectors.as_mut().expect("selectors").remove(s);
                });
                out.push((variant, "selector", request.name.clone(), cel(selector)));
            }
        }
        for (u, sub) in request.first_available.iter().flatten().enumerate() {
            for (s, selector) in sub.selectors.iter().flatten().enumerate() {
                let variant = with(&|d| {
                    let requests = d.requests.as_mut().expect("requests");
                    let subs = requests[r].first_available.as_mut().expect("subrequests");
                    subs[u].selectors.as_mut().expect("selectors").remove(s);
                });
                let name = format!("{}/{}", request.name, sub.name);
                out.push((variant, "selector", name, cel(selector)));
            }
        }
    }
    for (c, constraint) in devices.constraints.iter().flatten().enumerate() {
        let variant = with(&|d| {
            d.constraints.as_mut().expect("constraints").remove(c);
        });
        let what = match (&constraint.match_attribute, &constraint.distinct_attribute) {
            (Some(a), _) => format!("matchAttribute {a}"),
            (_, Some(a)) => format!("distinctAttribute {a}"),
            _ => "constraint".into(),
        };
        let requests = constraint
            .requests
            .as_ref()
            .map_or("all requests".into(), |r| r.join(", "));
        out.push((variant, "constraint", requests, what));
    }
    out
}

/// Requests that no node can meet (no alternative of a `firstAvailable` list either): how
/// many devices the best node lacks, checked by adding that many copies of a matching
/// device to it on a fork.
fn missing(
    engine: &Engine,
    pod_key: &ObjectKey,
    requests: &[RequestDevices],
    inventory: &Inventory,
    names: &BTreeMap<String, String>,
) -> Vec<Missing> {
    let nodes: Vec<&String> = engine.state().nodes.keys().collect();
    let mut out = Vec::new();
    for group in alternatives(requests) {
        let met_somewhere = group.iter().any(|r| {
            nodes
                .iter()
                .any(|n| met_by(r, &r.on_node(inventory, n), inventory))
        });
        if met_somewhere {
            continue;
        }
        for request in group {
            let Some(needed) = request.count else {
                continue;
            };
            // The node with the most free matching devices; ties: the most matching, then
            // the first by name.
            let best = nodes.iter().max_by_key(|n| {
                let here = request.on_node(inventory, n);
                let free = here.iter().filter(|v| v.usable(inventory)).count();
                let matching = here.iter().filter(|v| v.matches()).count();
                (free, matching, std::cmp::Reverse(**n))
            });
            let free_on_node = best.map_or(0, |n| {
                let here = request.on_node(inventory, n);
                here.iter().filter(|v| v.usable(inventory)).count()
            });
            let lacking = needed - free_on_node as i64;
            let template = request.devices.iter().find(|v| v.matches());
            let fits_with_them = match (best, template) {
                (Some(node), Some(template)) => Some(fits_with_copies(
                    engine,
                    pod_key,
                    node,
                    &inventory.devices[template.device].id(),
                    lacking,
                )),
                _ => None,
            };
            out.push(Missing {
                claim: name_of(names, &request.claim),
                request: request.request.clone(),
                class: request.class.clone(),
                needed,
                matching: request.devices.iter().filter(|v| v.matches()).count(),
                free: request
                    .devices
                    .iter()
                    .filter(|v| v.usable(inventory))
                    .count(),
                node: best.map(|n| n.to_string()),
                free_on_node,
                missing: lacking,
                fits_with_them,
            });
        }
    }
    out
}

/// Whether the pod fits on `node` once `n` copies of the device `id` (free, untainted, on
/// no shared counters) are added there, in a slice of their own, on a fork.
fn fits_with_copies(engine: &Engine, pod_key: &ObjectKey, node: &str, id: &str, n: i64) -> bool {
    let Some((slice, device)) =
        engine.state().slices.iter().find_map(|s| {
            let index =
                s.spec.devices.iter().flatten().position(|d| {
                    format!("{}/{}/{}", s.spec.driver, s.spec.pool.name, d.name) == id
                })?;
            Some((s, s.device(index)))
        })
    else {
        return false;
    };
    let pool = format!("kubectl-dra-missing-{node}");
    let copies = (0..n.max(0))
        .map(|i| {
            let mut copy = device.clone();
            copy.name = format!("missing-{i}");
            copy.taints = None;
            copy.consumes_counters = None;
            copy.node_name = None;
            copy.node_selector = None;
            copy.all_nodes = None;
            copy
        })
        .collect();
    let added = ResourceSlice {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(pool.clone()),
            ..Default::default()
        },
        spec: k8s_openapi::api::resource::v1::ResourceSliceSpec {
            driver: slice.spec.driver.clone(),
            node_name: Some(node.to_string()),
            pool: k8s_openapi::api::resource::v1::ResourcePool {
                name: pool,
                generation: 1,
                resource_slice_count: 1,
            },
            devices: Some(copies),
            ..Default::default()
        },
    };
    let mut fork = engine.fork();
    fork.state_mut().upsert_slice(added);
    fork.evaluate(pod_key).feasible.iter().any(|n| n == node)
}

/// `a, b, c` for the first `max`, then how many more.
fn named(items: &[String], max: usize) -> String {
    let mut out = items
        .iter()
        .take(max)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > max {
        out.push_str(&format!(" and {} more", items.len() - max));
    }
    out
}

fn plural(n: i64, word: &str) -> String {
    if n == 1 {
        word.to_string()
    } else {
        format!("{word}s")
    }
}

/// What a person reads.
pub fn text(why: &Why) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!(
        "Pod {} (priority {}, schedulerName {}): {}",
        why.pod,
        why.priority,
        why.scheduler_name,
        match (why.status.as_str(), &why.node) {
            ("bound", Some(node)) => format!("bound to node {node}"),
            ("fits", _) => format!(
                "fits now on {} (not bound yet)",
                named(&why.fits_on, NODES_NAMED)
            ),
            (status, _) => status.to_string(),
        }
    ));
    for c in &why.claims {
        line(format!(
            "  claim {}: {} ({})",
            c.name,
            c.claim.as_deref().unwrap_or("not created yet"),
            c.state
        ));
    }
    if let Some(message) = &why.message {
        line(String::new());
        line(format!("The scheduler says: {message}"));
    }
    if !why.node_groups.is_empty() {
        line(String::new());
        line("Per node:".into());
    }
    for group in &why.node_groups {
        let indent = if let [node] = &group.nodes[..] {
            line(format!("  {node}: {}", group.reason));
            "    "
        } else {
            line(format!(
                "  {} nodes ({}): {}",
                group.nodes.len(),
                named(&group.nodes, NODES_NAMED),
                group.reason
            ));
            "      "
        };
        for detail in &group.details {
            if group.nodes.len() > 1 {
                line(format!("    {}:", detail.node));
            }
            for r in &detail.requests {
                for l in request_lines(r) {
                    line(format!("{indent}{l}"));
                }
            }
        }
    }
    if why.status != "unschedulable" {
        return out;
    }
    line(String::new());
    line("What would make it fit (each checked by the engine on a copy of the state):".into());
    if let Some(p) = &why.preemption {
        match (&p.node, &p.reason) {
            (Some(node), _) => {
                line(format!(
                    "  preemption: on {node}, evicting {} (the scheduler's choice)",
                    p.victims.join(", ")
                ));
                for o in &p.others {
                    line(format!(
                        "    or on {}, evicting {}",
                        o.node,
                        o.victims.join(", ")
                    ));
                }
            }
            (None, Some(reason)) => line(format!("  preemption: does not help: {reason}")),
            (None, None) => {}
        }
    }
    if why.relaxations.is_empty() {
        line("  relax: no single selector or constraint, dropped, makes it fit".into());
    }
    for r in &why.relaxations {
        let place = if r.devices.is_empty() {
            String::new()
        } else {
            format!(" (devices {})", r.devices.join(", "))
        };
        let what = match r.kind.as_str() {
            "selector" => format!(
                "without selector {} of claim {}, request {}",
                r.what, r.claim, r.request
            ),
            _ => format!(
                "without constraint {} of claim {} ({})",
                r.what, r.claim, r.request
            ),
        };
        line(format!(
            "  relax: {what}: fits on {}{place}",
            named(&r.fits_on, NODES_NAMED)
        ));
    }
    for m in &why.missing {
        let node = m.node.as_deref().unwrap_or("any node");
        let check = match m.fits_with_them {
            Some(true) => format!("with {} more on {node} it fits", m.missing),
            Some(false) => format!("even with {} more on {node} it does not fit", m.missing),
            None => "no device matches its selectors, so none could be added to check".into(),
        };
        line(format!(
            "  add devices: claim {}, request {}: {} more free {} of class {} matching its selectors on one node ({} {} in the cluster, {} free; at most {} free on one node, {node}); {check}",
            m.claim,
            m.request,
            m.missing,
            plural(m.missing, "device"),
            m.class,
            m.matching,
            if m.matching == 1 { "matches" } else { "match" },
            m.free,
            m.free_on_node,
        ));
    }
    out
}

/// A request a node cannot meet: the devices, then each selector with the devices it
/// rejects.
fn request_lines(r: &RequestOnNode) -> Vec<String> {
    let needs = match r.needed {
        Some(n) => format!("needs {n}"),
        None => "needs all".into(),
    };
    let head = format!("claim {}, request {} ({needs})", r.claim, r.request);
    let mut lines = vec![match (r.in_class, r.matching.len()) {
        (0, _) => format!("{head}: no device of class {} here", r.class),
        (n, 0) => format!(
            "{head}: none of the {n} devices of class {} here match the selectors",
            r.class
        ),
        (n, m) => {
            let uses: Vec<String> = r
                .matching
                .iter()
                .map(|u| match (&u.holder, u.state.as_str()) {
                    (Some(holder), _) => format!("{} allocated to {holder}", u.device),
                    (None, "tainted") => {
                        format!("{} tainted ({})", u.device, u.taints.join(", "))
                    }
                    (None, "blocked") => format!(
                        "{} blocked by shared counters ({})",
                        u.device,
                        u.counters.join("; ")
                    ),
                    (None, state) => format!("{} {state}", u.device),
                })
                .collect();
            format!(
                "{head}: {m} of the {n} devices of class {} here match the selectors: {}",
                r.class,
                named(&uses, DEVICES_NAMED)
            )
        }
    }];
    for rejection in &r.rejected {
        let devices: Vec<String> = rejection
            .devices
            .iter()
            .map(|d| match &d.error {
                Some(e) => format!("{} (error: {e})", d.device),
                None if d.values.is_empty() => d.device.clone(),
                None => {
                    let values: Vec<String> = d
                        .values
                        .iter()
                        .map(|(k, v)| match k.as_str() {
                            "productName" => v.clone(),
                            _ => format!("{k} {v}"),
                        })
                        .collect();
                    format!("{} ({})", d.device, values.join(", "))
                }
            })
            .collect();
        lines.push(format!(
            "  selector {} rejects {}",
            rejection.selector,
            named(&devices, DEVICES_NAMED)
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::super::fixtures::{
        allocated, claim, claim_with, cluster, gpu, gpu_class, node, one_gpu, pod, slice,
    };
    use super::*;

    const LARGE: &str =
        r#"device.capacity["gpu.example.com"].memory.isGreaterThan(quantity("20Gi"))"#;

    fn why(engine: &mut Engine, pod: &str) -> Why {
        explain(engine, &ObjectKey::new("default", pod), &[], &[]).unwrap()
    }

    /// examples/memory-selector in the state the daemon leaves it: the A5000 taken by the
    /// first replica, the second pending.
    fn memory_selector() -> Engine {
        cluster(vec![
            node("gpu-node-1"),
            gpu_class(),
            slice(
                "gpu-node-1",
                vec![
                    gpu("gpu-0", "RTX A5000", 0, "24Gi"),
                    gpu("gpu-1", "Tesla T10", 0, "16Gi"),
                    gpu("gpu-2", "Tesla T10", 1, "16Gi"),
                ],
            ),
            allocated(
                claim("trainer-0-gpu", one_gpu(&[LARGE])),
                "gpu-node-1",
                &[("gpu", "gpu-0")],
                Some("trainer-0"),
            ),
            pod("trainer-0", "trainer-0-gpu", 0, Some("gpu-node-1")),
            claim("trainer-1-gpu", one_gpu(&[LARGE])),
            pod("trainer-1", "trainer-1-gpu", 0, None),
        ])
    }

    #[test]
    fn a_pod_whose_selector_only_the_taken_gpu_meets_is_told_who_holds_it_and_what_the_others_lack()
    {
        let mut engine = memory_selector();
        let answer = why(&mut engine, "trainer-1");
        assert_eq!(
            text(&answer),
            r#"Pod default/trainer-1 (priority 0, schedulerName dra-scheduler): unschedulable
  claim gpu: default/trainer-1-gpu (pending)

The scheduler says: 0/1 nodes are available: 1 claim default/trainer-1-gpu request gpu (needs 1): 3 in class gpu, 1 match the selectors, 1 in use, 0 available.

Per node:
  gpu-node-1: claim default/trainer-1-gpu request gpu (needs 1): 3 in class gpu, 1 match the selectors, 1 in use, 0 available
    claim gpu, request gpu (needs 1): 1 of the 3 devices of class gpu here match the selectors: gpu-0 allocated to default/trainer-0
      selector device.capacity["gpu.example.com"].memory.isGreaterThan(quantity("20Gi")) rejects gpu-1 (Tesla T10, memory 16Gi), gpu-2 (Tesla T10, memory 16Gi)

What would make it fit (each checked by the engine on a copy of the state):
  preemption: does not help: no node: gpu-node-1 has no pods of priority below 0
  relax: without selector device.capacity["gpu.example.com"].memory.isGreaterThan(quantity("20Gi")) of claim gpu, request gpu: fits on gpu-node-1 (devices gpu.example.com/gpu-node-1/gpu-1)
  add devices: claim gpu, request gpu: 1 more free device of class gpu matching its selectors on one node (1 matches in the cluster, 0 free; at most 0 free on one node, gpu-node-1); with 1 more on gpu-node-1 it fits
"#
        );
        let json = serde_json::to_value(&answer).unwrap();
        assert_eq!(json["status"], "unschedulable");
        assert_eq!(json["relaxations"][0]["fitsOn"], json!(["gpu-node-1"]));
        assert_eq!(json["missing"][0]["fitsWithThem"], true);
        assert_eq!(
            engine.state().pods.len(),
            2,
            "the engine's state is not changed"
        );
        assert!(
            engine.state().claims[&ObjectKey::new("default", "trainer-1-gpu")]
                .status
                .is_none()
        );
    }

    #[test]
    fn an_urgent_pod_is_told_the_victims_the_daemons_post_filter_chooses_and_the_other_node() {
        let two = json!([{"name": "gpus", "exactly": {"deviceClassName": "gpu", "count": 2}}]);
        let gpus = || {
            vec![
                gpu("gpu-0", "A100", 0, "40Gi"),
                gpu("gpu-1", "A100", 0, "40Gi"),
            ]
        };
        let mut objects = vec![
            node("n1"),
            node("n2"),
            gpu_class(),
            slice("n1", gpus()),
            slice("n2", gpus()),
        ];
        for (i, node) in ["n1", "n1", "n2", "n2"].into_iter().enumerate() {
            let name = format!("low-{i}");
            let device = format!("gpu-{}", i % 2);
            objects.push(allocated(
                claim(&name, one_gpu(&[])),
                node,
                &[("gpu", &device)],
                Some(&name),
            ));
            objects
                .push(pod(&name, &name, 0, Some(node)).created(&format!("2026-01-01T00:00:0{i}Z")));
        }
        objects.extend([claim("urgent", two), pod("urgent", "urgent", 1000, None)]);
        let mut engine = cluster(objects);
        let answer = why(&mut engine, "urgent");
        let daemon = engine
            .fork()
            .preempt_with_groups(
                &ObjectKey::new("default", "urgent"),
                Duration::from_secs(10),
                &[],
                &[],
            )
            .unwrap();
        let preemption = answer.preemption.clone().unwrap();
        assert_eq!(preemption.node.as_deref(), Some(daemon.node.as_str()));
        assert_eq!(preemption.victims, victims(&daemon));
        let text = text(&answer);
        assert!(
            text.contains(
                "  preemption: on n2, evicting default/low-2, default/low-3 (the scheduler's choice)\n    or on n1, evicting default/low-0, default/low-1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("gpu-0 allocated to default/low-2, gpu-1 allocated to default/low-3"),
            "{text}"
        );
        assert!(
            text.contains("2 more free devices of class gpu matching its selectors on one node (4 match in the cluster, 0 free; at most 0 free on one node, n1); with 2 more on n1 it fits"),
            "{text}"
        );
    }

    #[test]
    fn a_numa_constraint_no_single_node_meets_is_the_one_thing_to_relax() {
        let two = json!([{"name": "gpus", "exactly": {"deviceClassName": "gpu", "count": 2}}]);
        let numa = json!([{"matchAttribute": "resource.kubernetes.io/numaNode"}]);
        let mut engine = cluster(vec![
            node("n1"),
            gpu_class(),
            slice(
                "n1",
                vec![
                    gpu("gpu-0", "A100", 0, "40Gi"),
                    gpu("gpu-1", "A100", 1, "40Gi"),
                ],
            ),
            claim_with("job", two, numa),
            pod("job", "job", 0, None),
        ]);
        let answer = why(&mut engine, "job");
        assert_eq!(answer.relaxations.len(), 1);
        let text = text(&answer);
        assert!(
            text.contains("at most 1 free devices share one value (1), 2 needed"),
            "{text}"
        );
        assert!(
            text.contains("  relax: without constraint matchAttribute resource.kubernetes.io/numaNode of claim gpu (all requests): fits on n1 (devices gpu.example.com/n1/gpu-0, gpu.example.com/n1/gpu-1)\n"),
            "{text}"
        );
        assert!(answer.missing.is_empty(), "every request alone can be met");
    }

    #[test]
    fn a_bound_pod_and_a_pod_that_fits_now_say_so() {
        let mut engine = memory_selector();
        let bound = why(&mut engine, "trainer-0");
        assert_eq!(
            text(&bound),
            "Pod default/trainer-0 (priority 0, schedulerName dra-scheduler): bound to node gpu-node-1\n  claim gpu: default/trainer-0-gpu (reserved)\n"
        );
        engine.remove_pod(&ObjectKey::new("default", "trainer-0"));
        engine.remove_claim(&ObjectKey::new("default", "trainer-0-gpu"));
        let fits = why(&mut engine, "trainer-1");
        assert_eq!(fits.status, "fits");
        assert!(
            text(&fits).starts_with("Pod default/trainer-1 (priority 0, schedulerName dra-scheduler): fits now on gpu-node-1 (not bound yet)\n"),
        );
        assert!(explain(&mut engine, &ObjectKey::new("default", "nope"), &[], &[]).is_err());
    }
}
