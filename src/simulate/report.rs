//! The two report formats of `simulate`: a table for a terminal and a JSON document for
//! tools (its schema is fixed: `pods[]` and `claims[]`; `groups[]`, one entry per PodGroup
//! with pending members, is added only when there are any; so is `preemptions[]`, one
//! entry per pod placed by evicting others, with its victims, and `handoffs[]`, one entry
//! per pod that waited for devices terminating pods held).

use serde::Serialize;
use serde_json::Value;

use std::collections::HashMap;

use super::handoff::Waited;
use super::{Simulation, terminating};
use dra_engine::ObjectKey;
use dra_engine::state::bound_node;

#[derive(Serialize)]
struct PodReport {
    namespace: String,
    name: String,
    node: Option<String>,
    message: Option<String>,
    /// What the pod's devices map of its node's resources (DRANodeAllocatableResources),
    /// as the binder would write it to the pod's status.
    #[serde(
        rename = "nodeAllocatableResourceClaimStatuses",
        skip_serializing_if = "Option::is_none"
    )]
    node_allocatable: Option<Value>,
    /// Evicted by a preemption (the table says so in place of PENDING).
    #[serde(skip)]
    evicted: bool,
    /// Being deleted: never scheduled (the table says so in place of the node).
    #[serde(skip)]
    terminating: bool,
}

#[derive(Serialize)]
struct ConsumerReport {
    resource: String,
    name: String,
}

#[derive(Serialize)]
struct ClaimReport {
    namespace: String,
    name: String,
    allocation: Option<Value>,
    #[serde(rename = "reservedFor")]
    reserved_for: Vec<ConsumerReport>,
}

#[derive(Serialize)]
struct GroupReport {
    namespace: String,
    name: String,
    /// `spec.workloadRef` as `workload/template`.
    #[serde(skip_serializing_if = "Option::is_none")]
    workload: Option<String>,
    /// Whether the group was placed (a gang: at least minCount members at once).
    placed: bool,
    /// Its pending members when it was tried, and how many of them were placed.
    pods: usize,
    #[serde(rename = "placedPods")]
    placed_pods: usize,
    /// With schedulingConstraints.topology: the domain chosen.
    #[serde(skip_serializing_if = "Option::is_none")]
    domain: Option<String>,
    message: Option<String>,
}

#[derive(Serialize)]
struct VictimReport {
    namespace: String,
    name: String,
    /// Where it ran.
    node: String,
    priority: i32,
    /// Claims whose devices its eviction gave back, `namespace/name`.
    #[serde(rename = "freedClaims")]
    freed_claims: Vec<String>,
}

#[derive(Serialize)]
struct PreemptionReport {
    /// The pod that preempted.
    namespace: String,
    name: String,
    /// Where it was placed.
    node: String,
    victims: Vec<VictimReport>,
    /// PodDisruptionBudgets the evictions violate (the fewest any node allowed).
    #[serde(rename = "pdbViolations")]
    pdb_violations: usize,
    message: String,
}

#[derive(Serialize)]
struct UpgradeReport {
    /// `namespace/name`.
    claim: String,
    request: String,
    /// The subrequest the pod would have had, and the one it got by waiting.
    from: String,
    to: String,
}

#[derive(Serialize)]
struct HolderReport {
    namespace: String,
    name: String,
    #[serde(rename = "deletionTimestamp")]
    deletion_timestamp: Option<String>,
}

#[derive(Serialize)]
struct HandoffReport {
    /// The pod that waited.
    namespace: String,
    name: String,
    /// Where the devices it waited for are.
    node: String,
    /// `driver/pool/device`.
    devices: Vec<String>,
    upgrades: Vec<UpgradeReport>,
    /// The terminating pods that held the devices.
    holders: Vec<HolderReport>,
    /// The most the live scheduler would wait.
    #[serde(rename = "waitSeconds")]
    wait_seconds: f64,
    message: String,
}

impl HandoffReport {
    fn of(waited: &Waited) -> Self {
        let h = &waited.handoff;
        HandoffReport {
            namespace: h.pod.namespace.clone(),
            name: h.pod.name.clone(),
            node: h.node.clone(),
            devices: h.devices.clone(),
            upgrades: h
                .upgrades
                .iter()
                .map(|u| UpgradeReport {
                    claim: u.claim.to_string(),
                    request: u.request.clone(),
                    from: u.from.clone(),
                    to: u.to.clone(),
                })
                .collect(),
            holders: h
                .holders
                .iter()
                .map(|holder| HolderReport {
                    namespace: holder.pod.namespace.clone(),
                    name: holder.pod.name.clone(),
                    deletion_timestamp: holder.deletion.as_ref().map(|t| t.0.to_string()),
                })
                .collect(),
            wait_seconds: waited.bound.as_secs_f64(),
            message: waited.message(),
        }
    }
}

#[derive(Serialize)]
struct Report {
    pods: Vec<PodReport>,
    claims: Vec<ClaimReport>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    groups: Vec<GroupReport>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    preemptions: Vec<PreemptionReport>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    handoffs: Vec<HandoffReport>,
}

fn report(sim: &Simulation) -> Report {
    let state = sim.engine.state();
    let scheduler = &sim.engine.config().scheduler_name;
    // Pods that preempted, and pods evicted: what the table and `message` say of them.
    let mut preempted: std::collections::HashMap<&dra_engine::ObjectKey, String> =
        Default::default();
    let mut evicted: std::collections::HashMap<&dra_engine::ObjectKey, String> = Default::default();
    for p in &sim.preemptions {
        preempted.insert(&p.pod, p.message.clone());
        let priority = state
            .pods
            .get(&p.pod)
            .and_then(|pod| pod.spec.as_ref()?.priority)
            .unwrap_or(0);
        for v in &p.victims {
            evicted.insert(
                &v.pod,
                format!(
                    "evicted from {}: preempted by {} (priority {priority} > {})",
                    v.node, p.pod, v.priority
                ),
            );
        }
    }
    let (waited, handed_off) = handoff_messages(sim);
    let pods = sim
        .pods
        .iter()
        .map(|(key, decision)| {
            let pod = state.pod(key);
            let node = pod.and_then(bound_node).map(str::to_string);
            let is_terminating = handed_off.contains_key(key) || pod.is_some_and(terminating);
            let message = match decision {
                _ if evicted.contains_key(key) => evicted.get(key).cloned(),
                _ if handed_off.contains_key(key) => handed_off.get(key).cloned(),
                _ if is_terminating => Some(match &node {
                    Some(node) => format!("terminating on {node}"),
                    None => "terminating (metadata.deletionTimestamp is set): not scheduled".into(),
                }),
                Some(_) if preempted.contains_key(key) => preempted.get(key).cloned(),
                Some(_) if waited.contains_key(key) => waited.get(key).cloned(),
                Some(d) => d.message().map(str::to_string),
                None if node.is_none() => {
                    let theirs = pod
                        .and_then(|p| p.spec.as_ref()?.scheduler_name.clone())
                        .unwrap_or_else(|| "default-scheduler".into());
                    Some(format!(
                        "not simulated: schedulerName is {theirs}, not {scheduler} (use --all-schedulers to include it)"
                    ))
                }
                None => None,
            };
            PodReport {
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                node,
                message,
                node_allocatable: pod
                    .and_then(|p| p.status.as_ref()?.node_allocatable_resource_claim_statuses.as_ref())
                    .filter(|s| !s.is_empty())
                    .map(|s| serde_json::to_value(s).unwrap_or(Value::Null)),
                evicted: evicted.contains_key(key),
                terminating: is_terminating,
            }
        })
        .collect();
    let claims = sim
        .claim_order
        .iter()
        .filter_map(|key| {
            let claim = state.claims.get(key)?;
            let status = claim.status.as_ref();
            Some(ClaimReport {
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                allocation: status
                    .and_then(|s| s.allocation.as_ref())
                    .map(|a| serde_json::to_value(a).unwrap_or(Value::Null)),
                reserved_for: status
                    .and_then(|s| s.reserved_for.as_ref())
                    .into_iter()
                    .flatten()
                    .map(|r| ConsumerReport {
                        resource: r.resource.clone(),
                        name: r.name.clone(),
                    })
                    .collect(),
            })
        })
        .collect();
    let groups = sim
        .groups
        .iter()
        .map(|g| GroupReport {
            namespace: g.group.namespace.clone(),
            name: g.group.name.clone(),
            workload: g.workload.clone(),
            placed: g.placed > 0,
            pods: g.members.len(),
            placed_pods: g.placed,
            domain: g.domain.clone(),
            message: g.message.clone(),
        })
        .collect();
    let preemptions = sim
        .preemptions
        .iter()
        .map(|p| PreemptionReport {
            namespace: p.pod.namespace.clone(),
            name: p.pod.name.clone(),
            node: p.node.clone(),
            victims: p
                .victims
                .iter()
                .map(|v| VictimReport {
                    namespace: v.pod.namespace.clone(),
                    name: v.pod.name.clone(),
                    node: v.node.clone(),
                    priority: v.priority,
                    freed_claims: v.freed_claims.iter().map(|c| c.to_string()).collect(),
                })
                .collect(),
            pdb_violations: p.pdb_violations,
            message: p.message.clone(),
        })
        .collect();
    Report {
        pods,
        claims,
        groups,
        preemptions,
        handoffs: sim.handoffs.iter().map(HandoffReport::of).collect(),
    }
}

/// What the report says of each pod that waited for a handoff, and of each terminating pod
/// it waited for.
fn handoff_messages(
    sim: &Simulation,
) -> (HashMap<&ObjectKey, String>, HashMap<&ObjectKey, String>) {
    let mut waited = HashMap::new();
    let mut handed_off = HashMap::new();
    for w in &sim.handoffs {
        waited.insert(&w.handoff.pod, w.message());
        for h in &w.handoff.holders {
            let message = format!(
                "terminating: {} waited for its devices and took them once it was gone",
                w.handoff.pod
            );
            handed_off.insert(&h.pod, message);
        }
    }
    (waited, handed_off)
}

pub fn json(sim: &Simulation) -> String {
    serde_json::to_string_pretty(&report(sim)).expect("the report serializes")
}

/// The node, else why there is none: PENDING, or EVICTED by a preemption; TERMINATING for a
/// pod being deleted, wherever it is.
fn node_or_state(p: &PodReport) -> &str {
    match &p.node {
        _ if p.terminating => "TERMINATING",
        Some(node) => node,
        None if p.evicted => "EVICTED",
        None => "PENDING",
    }
}

pub fn table(sim: &Simulation) -> String {
    let r = report(sim);
    let mut out = String::new();
    let pod_width = r
        .pods
        .iter()
        .map(|p| p.namespace.len() + p.name.len() + 1)
        .max()
        .unwrap_or(3)
        .max(3);
    let node_width = r
        .pods
        .iter()
        .map(|p| node_or_state(p).len())
        .max()
        .unwrap_or(4)
        .max(4);
    out.push_str(&format!(
        "{:pod_width$}  {:node_width$}  WHY\n",
        "POD", "NODE"
    ));
    for p in &r.pods {
        let name = format!("{}/{}", p.namespace, p.name);
        let node = node_or_state(p);
        out.push_str(
            format!(
                "{name:pod_width$}  {node:node_width$}  {}\n",
                p.message.as_deref().unwrap_or("")
            )
            .trim_end(),
        );
        out.push('\n');
    }
    if !r.claims.is_empty() {
        let claim_width = r
            .claims
            .iter()
            .map(|c| c.namespace.len() + c.name.len() + 1)
            .max()
            .unwrap_or(5)
            .max(5);
        out.push_str(&format!(
            "\n{:claim_width$}  DEVICES (driver/pool/device)  RESERVED FOR\n",
            "CLAIM"
        ));
        for c in &r.claims {
            let devices: Vec<String> = c
                .allocation
                .as_ref()
                .and_then(|a| a.pointer("/devices/results"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|d| {
                    format!(
                        "{}/{}/{}",
                        d["driver"].as_str().unwrap_or(""),
                        d["pool"].as_str().unwrap_or(""),
                        d["device"].as_str().unwrap_or("")
                    )
                })
                .collect();
            let devices = if devices.is_empty() {
                "-".to_string()
            } else {
                devices.join(",")
            };
            let users: Vec<&str> = c.reserved_for.iter().map(|r| r.name.as_str()).collect();
            let name = format!("{}/{}", c.namespace, c.name);
            out.push_str(
                format!("{name:claim_width$}  {devices:28}  {}\n", users.join(",")).trim_end(),
            );
            out.push('\n');
        }
    }
    if !r.groups.is_empty() {
        let group_width = r
            .groups
            .iter()
            .map(|g| g.namespace.len() + g.name.len() + 1)
            .max()
            .unwrap_or(8)
            .max(8);
        out.push_str(&format!("\n{:group_width$}  PLACED  WHY\n", "PODGROUP"));
        for g in &r.groups {
            let name = format!("{}/{}", g.namespace, g.name);
            let placed = format!("{}/{}", g.placed_pods, g.pods);
            let why = match (&g.domain, &g.message) {
                (Some(d), Some(m)) => format!("in {d}; {m}"),
                (Some(d), None) => format!("in {d}"),
                (None, Some(m)) => m.clone(),
                (None, None) => String::new(),
            };
            out.push_str(format!("{name:group_width$}  {placed:6}  {why}\n").trim_end());
            out.push('\n');
        }
    }
    let victims: Vec<(String, &str, String)> = r
        .preemptions
        .iter()
        .flat_map(|p| {
            p.victims.iter().map(move |v| {
                (
                    format!("{}/{}", v.namespace, v.name),
                    v.node.as_str(),
                    format!("{}/{}", p.namespace, p.name),
                )
            })
        })
        .collect();
    if !victims.is_empty() {
        let victim_width = victims.iter().map(|v| v.0.len()).max().unwrap_or(7).max(7);
        let node_width = victims.iter().map(|v| v.1.len()).max().unwrap_or(4).max(4);
        out.push_str(&format!(
            "\n{:victim_width$}  {:node_width$}  FOR\n",
            "EVICTED", "NODE"
        ));
        for (victim, node, by) in &victims {
            out.push_str(&format!(
                "{victim:victim_width$}  {node:node_width$}  {by}\n"
            ));
        }
    }
    out
}
