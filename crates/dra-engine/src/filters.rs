//! The core node filters that make the engine usable as a real scheduler: each answers
//! "can this pod go on this node?" with `Ok(())` or a short reason that is grouped across
//! nodes in the pod's message ("3 nodes: insufficient cpu").
//!
//! They follow kube-scheduler's NodeName, NodeUnschedulable, TaintToleration, NodeAffinity,
//! NodeResourcesFit and NodePorts plugins.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint, Toleration,
};

use crate::resources::ResourceList;

/// `spec.nodeName` on a pod names the only node it may go to.
pub fn node_name(pod: &Pod, node: &Node) -> Result<(), String> {
    match pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
        Some(name) if Some(name) != node.metadata.name.as_deref() => {
            Err("node(s) didn't match the requested node name".into())
        }
        _ => Ok(()),
    }
}

/// An unschedulable (cordoned) node takes only pods that tolerate that.
pub fn unschedulable(pod: &Pod, node: &Node) -> Result<(), String> {
    if node.spec.as_ref().and_then(|s| s.unschedulable) != Some(true) {
        return Ok(());
    }
    let taint = Taint {
        key: "node.kubernetes.io/unschedulable".into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    };
    if tolerations(pod).iter().any(|t| tolerates(t, &taint)) {
        Ok(())
    } else {
        Err("node(s) were unschedulable".into())
    }
}

fn tolerations(pod: &Pod) -> &[Toleration] {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default()
}

/// Whether `toleration` tolerates `taint` (core/v1 semantics).
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref()
        && !effect.is_empty()
        && effect != taint.effect
    {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => key.is_empty() || key == taint.key,
        "Equal" => {
            key == taint.key
                && toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

/// NoSchedule and NoExecute node taints must be tolerated; PreferNoSchedule only scores.
pub fn taints(pod: &Pod, node: &Node) -> Result<(), String> {
    let tols = tolerations(pod);
    for taint in node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
    {
        if taint.effect == "PreferNoSchedule" {
            continue;
        }
        if !tols.iter().any(|t| tolerates(t, taint)) {
            let value = taint
                .value
                .as_deref()
                .map(|v| format!("={v}"))
                .unwrap_or_default();
            return Err(format!(
                "node(s) had untolerated taint {{{}{}: {}}}",
                taint.key, value, taint.effect
            ));
        }
    }
    Ok(())
}

/// `spec.nodeSelector` and required node affinity.
pub fn node_affinity(pod: &Pod, node: &Node) -> Result<(), String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(());
    };
    let labels = node.metadata.labels.clone().unwrap_or_default();
    if let Some(selector) = spec.node_selector.as_ref()
        && !selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return Err("node(s) didn't match Pod's node affinity/selector".into());
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    if let Some(required) = required
        && !node_selector_terms_match(&required.node_selector_terms, node)
    {
        return Err("node(s) didn't match Pod's node affinity/selector".into());
    }
    Ok(())
}

/// Terms are ORed; an empty list matches nothing (as for a NodeSelector).
pub fn node_selector_terms_match(terms: &[NodeSelectorTerm], node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let fields = BTreeMap::from([(
        "metadata.name".to_string(),
        node.metadata.name.clone().unwrap_or_default(),
    )]);
    terms.iter().any(|term| {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let field_exprs = term.match_fields.as_deref().unwrap_or_default();
        // A term with no requirements matches nothing.
        (!exprs.is_empty() || !field_exprs.is_empty())
            && exprs.iter().all(|r| requirement_matches(r, &labels))
            && field_exprs.iter().all(|r| requirement_matches(r, &fields))
    })
}

fn requirement_matches(req: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let values = req.values.as_deref().unwrap_or_default();
    let value = labels.get(&req.key);
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), [bound]) = (value, values) else {
                return false;
            };
            let (Ok(v), Ok(bound)) = (v.parse::<i64>(), bound.parse::<i64>()) else {
                return false;
            };
            if req.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

/// Requests against allocatable minus what is already used. Extended resources that
/// `dra_served` names are served by DRA devices instead and are not checked here.
pub fn resources_fit(
    requests: &ResourceList,
    allocatable: &ResourceList,
    used: &ResourceList,
    pods_on_node: usize,
    dra_served: &dyn Fn(&str) -> bool,
) -> Result<(), String> {
    let max_pods = allocatable
        .0
        .get("pods")
        .map(|q| q.value().unwrap_or(i64::MAX) as i128)
        .unwrap_or(110);
    if pods_on_node as i128 + 1 > max_pods {
        return Err("Too many pods".into());
    }
    let mut short = Vec::new();
    for (name, want) in &requests.0 {
        if want.is_zero() || name == "pods" {
            continue;
        }
        let have = allocatable.0.get(name);
        if have.is_none() && dra_served(name) {
            continue;
        }
        let free = have.copied().unwrap_or_default() - used.get(name);
        if *want > free {
            short.push(name.as_str());
        }
    }
    if short.is_empty() {
        Ok(())
    } else {
        Err(short
            .iter()
            .map(|n| format!("Insufficient {n}"))
            .collect::<Vec<_>>()
            .join(", "))
    }
}

/// A host port the pod wants: (protocol, ip, port).
pub type HostPort = (String, String, i32);

pub fn host_ports(pod: &Pod) -> Vec<HostPort> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|p| *p > 0)?;
            Some((
                p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                p.host_ip
                    .clone()
                    .filter(|ip| !ip.is_empty())
                    .unwrap_or_else(|| "0.0.0.0".into()),
                port,
            ))
        })
        .collect()
}

/// Host ports conflict when protocol and port match and either IP is the wildcard or both equal.
pub fn host_ports_free(wanted: &[HostPort], in_use: &[HostPort]) -> Result<(), String> {
    let conflict = wanted.iter().any(|(proto, ip, port)| {
        in_use.iter().any(|(p2, ip2, port2)| {
            proto == p2 && port == port2 && (ip == "0.0.0.0" || ip2 == "0.0.0.0" || ip == ip2)
        })
    });
    if conflict {
        Err("node(s) didn't have free ports for the requested pod ports".into())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }
    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn taints_need_tolerations_except_prefer_no_schedule() {
        let n = node(json!({"metadata": {"name": "n1"}, "spec": {"taints": [
            {"key": "gpu", "value": "true", "effect": "NoSchedule"},
            {"key": "soft", "effect": "PreferNoSchedule"}]}}));
        let plain = pod(json!({"containers": []}));
        assert_eq!(
            taints(&plain, &n).unwrap_err(),
            "node(s) had untolerated taint {gpu=true: NoSchedule}"
        );
        let tolerant = pod(json!({"containers": [], "tolerations": [
            {"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]}));
        assert!(taints(&tolerant, &n).is_ok());
        let wrong_value = pod(json!({"containers": [], "tolerations": [
            {"key": "gpu", "operator": "Equal", "value": "false"}]}));
        assert!(taints(&wrong_value, &n).is_err());
        let everything = pod(json!({"containers": [], "tolerations": [{"operator": "Exists"}]}));
        assert!(taints(&everything, &n).is_ok());
    }

    #[test]
    fn cordoned_node_needs_the_unschedulable_toleration() {
        let n = node(json!({"metadata": {"name": "n1"}, "spec": {"unschedulable": true}}));
        assert_eq!(
            unschedulable(&pod(json!({"containers": []})), &n).unwrap_err(),
            "node(s) were unschedulable"
        );
        let p = pod(json!({"containers": [], "tolerations": [
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]}));
        assert!(unschedulable(&p, &n).is_ok());
    }

    #[test]
    fn node_selector_and_required_affinity() {
        let n = node(json!({"metadata": {"name": "n1", "labels": {"zone": "a", "gpus": "8"}}}));
        assert!(
            node_affinity(
                &pod(json!({"containers": [], "nodeSelector": {"zone": "a"}})),
                &n
            )
            .is_ok()
        );
        assert!(
            node_affinity(
                &pod(json!({"containers": [], "nodeSelector": {"zone": "b"}})),
                &n
            )
            .is_err()
        );
        let affinity = |op: &str, values: serde_json::Value| {
            pod(json!({"containers": [], "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpus", "operator": op, "values": values}]}]}}}}))
        };
        assert!(node_affinity(&affinity("Gt", json!(["4"])), &n).is_ok());
        assert!(node_affinity(&affinity("Lt", json!(["4"])), &n).is_err());
        assert!(node_affinity(&affinity("In", json!(["8", "16"])), &n).is_ok());
        assert!(node_affinity(&affinity("NotIn", json!(["8"])), &n).is_err());
        let by_name = pod(json!({"containers": [], "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}));
        assert!(node_affinity(&by_name, &n).is_ok(), "terms are ORed");
    }

    #[test]
    fn resources_fit_reports_each_short_resource() {
        let list = |pairs: &[(&str, &str)]| {
            ResourceList(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
                    .collect(),
            )
        };
        let alloc = list(&[("cpu", "4"), ("memory", "8Gi"), ("pods", "110")]);
        let used = list(&[("cpu", "3500m")]);
        let err = resources_fit(
            &list(&[("cpu", "1"), ("memory", "9Gi")]),
            &alloc,
            &used,
            0,
            &|_| false,
        )
        .unwrap_err();
        assert_eq!(err, "Insufficient cpu, Insufficient memory");
        assert!(resources_fit(&list(&[("cpu", "500m")]), &alloc, &used, 0, &|_| false).is_ok());
        // An extended resource the node lacks fails unless DRA serves it.
        let gpu = list(&[("nvidia.com/gpu", "1")]);
        assert_eq!(
            resources_fit(&gpu, &alloc, &used, 0, &|_| false).unwrap_err(),
            "Insufficient nvidia.com/gpu"
        );
        assert!(resources_fit(&gpu, &alloc, &used, 0, &|n| n == "nvidia.com/gpu").is_ok());
        assert_eq!(
            resources_fit(&list(&[]), &list(&[("pods", "2")]), &used, 2, &|_| false).unwrap_err(),
            "Too many pods"
        );
    }

    #[test]
    fn host_ports_conflict_on_wildcard_or_same_ip() {
        let p = pod(
            json!({"containers": [{"name": "a", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}),
        );
        let wanted = host_ports(&p);
        assert_eq!(
            wanted,
            vec![("TCP".to_string(), "0.0.0.0".to_string(), 8080)]
        );
        assert!(host_ports_free(&wanted, &[("TCP".into(), "10.0.0.1".into(), 8080)]).is_err());
        assert!(host_ports_free(&wanted, &[("UDP".into(), "10.0.0.1".into(), 8080)]).is_ok());
        assert!(host_ports_free(&wanted, &[("TCP".into(), "0.0.0.0".into(), 9090)]).is_ok());
    }
}
