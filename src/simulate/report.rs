//! The two report formats of `simulate`: a table for a terminal and a JSON document for
//! tools (its schema is fixed: `pods[]` and `claims[]`; `groups[]`, one entry per PodGroup
//! with pending members, is added only when there are any).

use serde::Serialize;
use serde_json::Value;

use super::Simulation;
use dra_engine::state::bound_node;

#[derive(Serialize)]
struct PodReport {
    namespace: String,
    name: String,
    node: Option<String>,
    message: Option<String>,
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
struct Report {
    pods: Vec<PodReport>,
    claims: Vec<ClaimReport>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    groups: Vec<GroupReport>,
}

fn report(sim: &Simulation) -> Report {
    let state = sim.engine.state();
    let scheduler = &sim.engine.config().scheduler_name;
    let pods = sim
        .pods
        .iter()
        .map(|(key, decision)| {
            let pod = state.pods.get(key);
            let node = pod.and_then(bound_node).map(str::to_string);
            let message = match decision {
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
            PodReport { namespace: key.namespace.clone(), name: key.name.clone(), node, message }
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
    Report {
        pods,
        claims,
        groups,
    }
}

pub fn json(sim: &Simulation) -> String {
    serde_json::to_string_pretty(&report(sim)).expect("the report serializes")
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
        .map(|p| p.node.as_deref().unwrap_or("PENDING").len())
        .max()
        .unwrap_or(4)
        .max(4);
    out.push_str(&format!(
        "{:pod_width$}  {:node_width$}  WHY\n",
        "POD", "NODE"
    ));
    for p in &r.pods {
        let name = format!("{}/{}", p.namespace, p.name);
        let node = p.node.as_deref().unwrap_or("PENDING");
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
    out
}
