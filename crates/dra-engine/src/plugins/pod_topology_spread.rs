//! PodTopologySpread: a pod's `topologySpreadConstraints`, as kube-scheduler v1.37 applies
//! them.
//!
//! A constraint counts the bound pods its selector matches in the pod's namespace, per
//! domain (the value of its topology key on the node). Pods being deleted do not count.
//! Only nodes with every constraint's topology key are domains, and by the constraint's
//! policies only nodes that meet the pod's node selector and required node affinity
//! (`nodeAffinityPolicy`, Honor by default) and, with `nodeTaintsPolicy: Honor` (Ignore by
//! default), nodes whose NoSchedule/NoExecute taints the pod tolerates.
//!
//! - `DoNotSchedule` (Filter): placing the pod in the node's domain must leave it at most
//!   `maxSkew` above the least-loaded domain; with fewer domains than `minDomains` the least
//!   is taken as 0. A node without the topology key does not fit, with its own reason.
//! - `ScheduleAnyway` (Score): fewer matching pods in the node's domains score higher; each
//!   constraint's count is weighed by the log of its number of domains among the feasible
//!   nodes, and normalised so the emptiest node gets 100.
//!
//! `matchLabelKeys` adds `key = the pod's value` to the selector. A selector with no
//! requirements counts no pods (upstream's quirk, kept) but still matches the pod itself.
//!
//! Cluster-level default constraints (`defaultConstraints`, `defaultingType`; System by
//! default: hostname maxSkew 3 and zone maxSkew 5, ScheduleAnyway) apply only to pods
//! without constraints of their own, and take their selector from what selects the pod in
//! its namespace ([`default_selector`], upstream's `helper.DefaultSelector`): the Services
//! whose selector matches its labels, and its controller if that is a
//! ReplicationController, ReplicaSet or StatefulSet. A pod nothing selects (no Service, no
//! such controller) gets no default constraint. So a Deployment's replicas, owned by
//! ReplicaSets, are spread softly by hostname and zone, as kube-scheduler spreads them.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::{Pod, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use rayon::prelude::*;

use super::label_selector::{Selector, labels_of};
use super::node_affinity::node_selector_terms_match;
use super::taint_toleration::{tolerates, tolerations};
use crate::framework::{Cycle, MAX_NODE_SCORE, Plugin, PluginCycle, Point, Status};
use crate::state::{ClusterState, NodeInfo, ObjectKey, Workloads};

pub const REASON: &str = "node(s) didn't match pod topology spread constraints";
pub const REASON_MISSING_LABEL: &str =
    "node(s) didn't match pod topology spread constraints (missing required label)";

const HOSTNAME: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";
const DO_NOT_SCHEDULE: &str = "DoNotSchedule";
const SCHEDULE_ANYWAY: &str = "ScheduleAnyway";

/// `PodTopologySpreadArgs`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Args {
    /// Constraints for pods without their own (`List` defaulting only; no labelSelector).
    pub default_constraints: Vec<TopologySpreadConstraint>,
    pub defaulting_type: DefaultingType,
}

/// `defaultingType`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DefaultingType {
    /// kube-scheduler's built-in defaults: hostname maxSkew 3 and zone maxSkew 5, both
    /// ScheduleAnyway.
    #[default]
    System,
    /// The `defaultConstraints` given.
    List,
}

pub struct PodTopologySpread {
    default_constraints: Vec<TopologySpreadConstraint>,
    system_defaulted: bool,
}

impl PodTopologySpread {
    pub fn new(args: &Args) -> Self {
        match args.defaulting_type {
            DefaultingType::System => PodTopologySpread {
                default_constraints: system_default_constraints(),
                system_defaulted: true,
            },
            DefaultingType::List => PodTopologySpread {
                default_constraints: args.default_constraints.clone(),
                system_defaulted: false,
            },
        }
    }

    /// The pod's constraints of one kind (`DoNotSchedule` or `ScheduleAnyway`), or the
    /// default ones when it has none of either kind, selecting what selects the pod.
    fn constraints(
        &self,
        pod: &Pod,
        namespace: &str,
        workloads: &Workloads,
        action: &str,
    ) -> Result<Vec<Constraint>, String> {
        let hard = if action == DO_NOT_SCHEDULE {
            "hard"
        } else {
            "soft"
        };
        let own = own_constraints(pod);
        if !own.is_empty() {
            return parse_constraints(own, labels_of(&pod.metadata), action)
                .map_err(|e| format!("obtaining pod's {hard} topology spread constraints: {e}"));
        }
        let defaults =
            parse_constraints(&self.default_constraints, labels_of(&pod.metadata), action)
                .map_err(|e| format!("setting default {hard} topology spread constraints: {e}"))?;
        if defaults.is_empty() {
            return Ok(defaults);
        }
        let selector = default_selector(pod, namespace, workloads);
        if selector.is_everything() {
            return Ok(Vec::new());
        }
        Ok(defaults
            .into_iter()
            .map(|c| Constraint {
                selector: selector.clone(),
                ..c
            })
            .collect())
    }
}

fn system_default_constraints() -> Vec<TopologySpreadConstraint> {
    let constraint = |key: &str, max_skew| TopologySpreadConstraint {
        topology_key: key.to_string(),
        when_unsatisfiable: SCHEDULE_ANYWAY.to_string(),
        max_skew,
        ..Default::default()
    };
    vec![constraint(HOSTNAME, 3), constraint(ZONE, 5)]
}

/// The selector default constraints use (`helper.DefaultSelector`): the selectors of the
/// Services in the pod's namespace that match its labels, merged; then, by the pod's
/// controller found by name in its namespace, a ReplicationController's selector merged
/// into those labels, or the requirements of a ReplicaSet's or StatefulSet's selector added
/// (none from a selector that is invalid). Selects everything when nothing selects the pod.
pub fn default_selector(pod: &Pod, namespace: &str, workloads: &Workloads) -> Selector {
    let labels = labels_of(&pod.metadata);
    let mut set = BTreeMap::new();
    for selector in workloads.services_in(namespace) {
        if Selector::from_labels(selector).matches(labels) {
            set.extend(selector.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
    }
    let Some(owner) = controller_of(pod) else {
        return Selector::from_labels(&set);
    };
    let key = ObjectKey::new(namespace, owner.name.as_str());
    let added = match (group_version(&owner.api_version), owner.kind.as_str()) {
        (("", "v1"), "ReplicationController") => {
            if let Some(rc) = workloads.replication_controllers.get(&key) {
                set.extend(rc.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            None
        }
        (("apps", "v1"), "ReplicaSet") => workloads.replica_sets.get(&key),
        (("apps", "v1"), "StatefulSet") => workloads.stateful_sets.get(&key),
        _ => None,
    };
    match (Selector::from_labels(&set), added) {
        (Selector::All(mut requirements), Some(Selector::All(more))) => {
            requirements.extend(more.iter().cloned());
            Selector::All(requirements)
        }
        (selector, _) => selector,
    }
}

/// `metav1.GetControllerOf`: the owner reference marked as the controller.
fn controller_of(pod: &Pod) -> Option<&OwnerReference> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

/// `schema.ParseGroupVersion`: `group/version`, or a version of the core group; anything
/// with more than one `/` names no group version the switch above knows.
fn group_version(api_version: &str) -> (&str, &str) {
    match api_version.split('/').collect::<Vec<_>>().as_slice() {
        [version] => ("", version),
        [group, version] => (group, version),
        _ => ("", ""),
    }
}

fn own_constraints(pod: &Pod) -> &[TopologySpreadConstraint] {
    pod.spec
        .as_ref()
        .and_then(|s| s.topology_spread_constraints.as_deref())
        .unwrap_or_default()
}

/// A constraint ready to count pods.
#[derive(Clone, Debug)]
struct Constraint {
    max_skew: i64,
    topology_key: String,
    selector: Selector,
    min_domains: i64,
    honor_node_affinity: bool,
    honor_node_taints: bool,
}

fn parse_constraints(
    constraints: &[TopologySpreadConstraint],
    pod_labels: &BTreeMap<String, String>,
    action: &str,
) -> Result<Vec<Constraint>, String> {
    let mut parsed = Vec::new();
    for c in constraints
        .iter()
        .filter(|c| c.when_unsatisfiable == action)
    {
        let mut selector = Selector::parse(c.label_selector.as_ref())?;
        let keys = c.match_label_keys.as_deref().unwrap_or_default();
        let pairs: Vec<(&str, &str)> = keys
            .iter()
            .filter_map(|k| Some((k.as_str(), pod_labels.get(k)?.as_str())))
            .collect();
        if !pairs.is_empty() {
            selector = selector.and_labels(pairs);
        }
        parsed.push(Constraint {
            max_skew: i64::from(c.max_skew),
            topology_key: c.topology_key.clone(),
            selector,
            min_domains: i64::from(c.min_domains.unwrap_or(1)),
            // Unset is Honor for node affinity and Ignore for taints; anything but
            // "Honor" ignores.
            honor_node_affinity: c
                .node_affinity_policy
                .as_deref()
                .is_none_or(|p| p == "Honor"),
            honor_node_taints: c.node_taints_policy.as_deref() == Some("Honor"),
        });
    }
    Ok(parsed)
}

impl Constraint {
    /// Whether the node's domain counts for this constraint, by its node policies.
    fn includes(&self, pod: &Pod, node: &NodeInfo) -> bool {
        if self.honor_node_affinity && !meets_required_node_affinity(pod, node) {
            return false;
        }
        if self.honor_node_taints {
            let tolerations = tolerations(pod);
            let untolerated = node
                .node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_deref())
                .unwrap_or_default()
                .iter()
                .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
                .any(|taint| !tolerations.iter().any(|t| tolerates(t, taint)));
            if untolerated {
                return false;
            }
        }
        true
    }
}

/// The pod's `nodeSelector` and required node affinity (`GetRequiredNodeAffinity`).
fn meets_required_node_affinity(pod: &Pod, node: &NodeInfo) -> bool {
    let spec = pod.spec.as_ref();
    let labels = labels_of(&node.node.metadata);
    let selector_ok = spec
        .and_then(|s| s.node_selector.as_ref())
        .is_none_or(|sel| sel.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let required = spec
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    selector_ok
        && required.is_none_or(|r| node_selector_terms_match(&r.node_selector_terms, &node.node))
}

fn has_all_keys(node: &NodeInfo, constraints: &[Constraint]) -> bool {
    let labels = labels_of(&node.node.metadata);
    constraints
        .iter()
        .all(|c| labels.contains_key(&c.topology_key))
}

/// Bound pods on `node` in `namespace`, not being deleted, that `selector` matches. A
/// selector with no requirements counts none.
fn count_matching(
    state: &ClusterState,
    node: &NodeInfo,
    selector: &Selector,
    namespace: &str,
) -> i64 {
    if selector.is_everything() {
        return 0;
    }
    node.pod_keys
        .iter()
        .filter(|key| key.namespace == namespace)
        .filter_map(|key| state.pods.get(key))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| selector.matches(labels_of(&p.metadata)))
        .count() as i64
}

impl Plugin for PodTopologySpread {
    fn name(&self) -> &'static str {
        "PodTopologySpread"
    }

    fn points(&self) -> &'static [Point] {
        &[
            Point::PreFilter,
            Point::Filter,
            Point::PreScore,
            Point::Score,
        ]
    }

    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(SpreadCycle {
            plugin: self,
            cycle,
            filter: FilterState::default(),
            score: ScoreState::default(),
        })
    }
}

/// What PreFilter leaves for Filter: per DoNotSchedule constraint, the matching pods per
/// domain and the count the skew is measured from.
#[derive(Default)]
struct FilterState {
    constraints: Vec<Constraint>,
    counts: Vec<HashMap<String, i64>>,
    least: Vec<i64>,
}

/// What PreScore leaves for Score: per ScheduleAnyway constraint, the matching pods in
/// each domain of the feasible nodes (hostname domains are counted per node in Score) and
/// the constraint's weight; the feasible nodes without every topology key.
#[derive(Default)]
struct ScoreState {
    constraints: Vec<Constraint>,
    counts: Vec<HashMap<String, i64>>,
    weights: Vec<f64>,
    ignored: HashSet<String>,
    /// Whether each feasible node, in order, is ignored (for NormalizeScore).
    ignored_in_order: Vec<bool>,
}

struct SpreadCycle<'a> {
    plugin: &'a PodTopologySpread,
    cycle: &'a Cycle<'a>,
    filter: FilterState,
    score: ScoreState,
}

impl PluginCycle for SpreadCycle<'_> {
    fn pre_filter(&mut self) -> Status {
        let (pod, state) = (self.cycle.pod, self.cycle.state);
        let namespace = self.cycle.key.namespace.as_str();
        let constraints =
            match self
                .plugin
                .constraints(pod, namespace, &state.workloads, DO_NOT_SCHEDULE)
            {
                Ok(c) => c,
                Err(e) => return Status::error(format!("get constraints from pod: {e}")),
            };
        if constraints.is_empty() {
            return Status::skip();
        }
        let nodes: Vec<&NodeInfo> = state.nodes.values().collect();
        let per_node: Vec<Vec<(usize, &String, i64)>> = nodes
            .par_iter()
            .filter(|node| has_all_keys(node, &constraints))
            .map(|node| {
                let labels = labels_of(&node.node.metadata);
                constraints
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.includes(pod, node))
                    .map(|(i, c)| {
                        let n = count_matching(state, node, &c.selector, namespace);
                        (i, &labels[&c.topology_key], n)
                    })
                    .collect()
            })
            .collect();
        let mut counts: Vec<HashMap<String, i64>> = vec![HashMap::new(); constraints.len()];
        for (i, value, n) in per_node.into_iter().flatten() {
            *counts[i].entry(value.clone()).or_default() += n;
        }
        let least = constraints
            .iter()
            .zip(&counts)
            .map(|(c, domains)| {
                if (domains.len() as i64) < c.min_domains {
                    0
                } else {
                    domains
                        .values()
                        .copied()
                        .min()
                        .unwrap_or(i64::from(i32::MAX))
                }
            })
            .collect();
        self.filter = FilterState {
            constraints,
            counts,
            least,
        };
        Status::success()
    }

    fn filter(&self, node: &NodeInfo) -> Status {
        let s = &self.filter;
        let labels = labels_of(&node.node.metadata);
        let pod_labels = labels_of(&self.cycle.pod.metadata);
        for (i, c) in s.constraints.iter().enumerate() {
            let Some(value) = labels.get(&c.topology_key) else {
                return Status::unresolvable(REASON_MISSING_LABEL);
            };
            let itself = i64::from(c.selector.matches(pod_labels));
            let there = s.counts[i].get(value).copied().unwrap_or(0);
            if there + itself - s.least[i] > c.max_skew {
                return Status::unschedulable(REASON);
            }
        }
        Status::success()
    }

    fn pre_score(&mut self, feasible: &[&NodeInfo]) -> Status {
        let (pod, state) = (self.cycle.pod, self.cycle.state);
        if state.nodes.is_empty() {
            return Status::skip();
        }
        let namespace = self.cycle.key.namespace.as_str();
        let constraints =
            match self
                .plugin
                .constraints(pod, namespace, &state.workloads, SCHEDULE_ANYWAY)
            {
                Ok(c) => c,
                Err(e) => return Status::error(format!("calculating preScoreState: {e}")),
            };
        if constraints.is_empty() {
            return Status::skip();
        }
        // Built-in defaults spread by hostname on nodes without a zone too.
        let require_all = !own_constraints(pod).is_empty() || !self.plugin.system_defaulted;
        let mut s = ScoreState {
            counts: vec![HashMap::new(); constraints.len()],
            ..ScoreState::default()
        };
        for node in feasible {
            let ignored = require_all && !has_all_keys(node, &constraints);
            s.ignored_in_order.push(ignored);
            if ignored {
                s.ignored.insert(node.name().to_string());
                continue;
            }
            let labels = labels_of(&node.node.metadata);
            for (i, c) in constraints.iter().enumerate() {
                if c.topology_key != HOSTNAME {
                    let value = labels.get(&c.topology_key).cloned().unwrap_or_default();
                    s.counts[i].entry(value).or_insert(0);
                }
            }
        }
        let scored_nodes = feasible.len() - s.ignored.len();
        s.weights = constraints
            .iter()
            .zip(&s.counts)
            .map(|(c, domains)| {
                let size = if c.topology_key == HOSTNAME {
                    scored_nodes
                } else {
                    domains.len()
                };
                ((size + 2) as f64).ln()
            })
            .collect();
        let nodes: Vec<&NodeInfo> = state.nodes.values().collect();
        let domains = &s.counts;
        let per_node: Vec<Vec<(usize, &str, i64)>> = nodes
            .par_iter()
            .filter(|node| !require_all || has_all_keys(node, &constraints))
            .map(|node| {
                let labels = labels_of(&node.node.metadata);
                constraints
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.includes(pod, node))
                    .filter_map(|(i, c)| {
                        let value = labels.get(&c.topology_key).map_or("", String::as_str);
                        // Only domains of feasible nodes are scored (hostname ones in Score).
                        domains[i].contains_key(value).then(|| {
                            (
                                i,
                                value,
                                count_matching(state, node, &c.selector, namespace),
                            )
                        })
                    })
                    .collect()
            })
            .collect();
        for (i, value, n) in per_node.into_iter().flatten() {
            if let Some(count) = s.counts[i].get_mut(value) {
                *count += n;
            }
        }
        s.constraints = constraints;
        self.score = s;
        Status::success()
    }

    /// The matching pods in the node's domains, each weighed, plus `maxSkew - 1` per
    /// constraint (so that small skews matter less).
    fn score(&self, node: &NodeInfo) -> Result<i64, Status> {
        let s = &self.score;
        if s.ignored.contains(node.name()) {
            return Ok(0);
        }
        let labels = labels_of(&node.node.metadata);
        let namespace = self.cycle.key.namespace.as_str();
        let mut score = 0.0;
        for (i, c) in s.constraints.iter().enumerate() {
            let Some(value) = labels.get(&c.topology_key) else {
                continue;
            };
            let count = if c.topology_key == HOSTNAME {
                count_matching(self.cycle.state, node, &c.selector, namespace)
            } else {
                s.counts[i].get(value).copied().unwrap_or(0)
            };
            score += count as f64 * s.weights[i] + (c.max_skew - 1) as f64;
        }
        Ok(score.round() as i64)
    }

    /// The fewest pods get 100: `100 * (max + min - score) / max`; ignored nodes get 0.
    fn normalize_score(&self, scores: &mut [i64]) {
        let ignored = &self.score.ignored_in_order;
        let is_ignored = |i: usize| ignored.get(i).copied().unwrap_or(false);
        let counted = || {
            scores
                .iter()
                .enumerate()
                .filter(|(i, _)| !is_ignored(*i))
                .map(|(_, s)| *s)
        };
        let min = counted().min().unwrap_or(i64::MAX);
        let max = counted().max().unwrap_or(0).max(0);
        for (i, s) in scores.iter_mut().enumerate() {
            *s = if is_ignored(i) {
                0
            } else if max == 0 {
                MAX_NODE_SCORE
            } else {
                MAX_NODE_SCORE * (max + min - *s) / max
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Node;
    use serde_json::{Value, json};

    use super::*;
    use crate::{ClusterInput, Decision, Engine, EngineConfig, Evaluation, ObjectKey};

    /// A node with its hostname label and, if given, a zone.
    fn node(name: &str, zone: Option<&str>) -> NodeBuilder {
        let mut labels = json!({HOSTNAME: name});
        if let Some(zone) = zone {
            labels[ZONE] = json!(zone);
        }
        NodeBuilder(
            json!({"metadata": {"name": name, "labels": labels}, "spec": {},
            "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}}}),
        )
    }

    struct NodeBuilder(Value);

    impl NodeBuilder {
        fn label(mut self, key: &str, value: &str) -> Self {
            self.0["metadata"]["labels"][key] = json!(value);
            self
        }

        /// A taint no test pod tolerates.
        fn tainted(mut self) -> Self {
            self.0["spec"]["taints"] = json!([{"key": "dedicated", "effect": "NoSchedule"}]);
            self
        }

        fn build(self) -> Node {
            serde_json::from_value(self.0).unwrap()
        }
    }

    struct PodBuilder(Value);

    fn pod(name: &str) -> PodBuilder {
        PodBuilder(
            json!({"metadata": {"name": name, "namespace": "default", "labels": {}},
            "spec": {"containers": [{"name": "c"}]}}),
        )
    }

    /// A pod of the `web` app, bound to `node`.
    fn web_on(name: &str, node: &str) -> PodBuilder {
        pod(name).label("app", "web").on(node)
    }

    impl PodBuilder {
        fn label(mut self, key: &str, value: &str) -> Self {
            self.0["metadata"]["labels"][key] = json!(value);
            self
        }

        fn namespace(mut self, ns: &str) -> Self {
            self.0["metadata"]["namespace"] = json!(ns);
            self
        }

        fn on(mut self, node: &str) -> Self {
            self.0["spec"]["nodeName"] = json!(node);
            self
        }

        fn deleting(mut self) -> Self {
            self.0["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            self
        }

        fn node_selector(mut self, key: &str, value: &str) -> Self {
            self.0["spec"]["nodeSelector"][key] = json!(value);
            self
        }

        /// Controlled by `kind` `name` (apps/v1, or v1 for a ReplicationController).
        fn owned_by(mut self, kind: &str, name: &str) -> Self {
            let api_version = if kind == "ReplicationController" {
                "v1"
            } else {
                "apps/v1"
            };
            self.0["metadata"]["ownerReferences"] = json!([{"apiVersion": api_version,
                "kind": kind, "name": name, "uid": format!("uid-{name}"), "controller": true}]);
            self
        }

        /// A replica of the `web-5d8f` ReplicaSet.
        fn owned_by_a_replica_set(self) -> Self {
            self.owned_by("ReplicaSet", "web-5d8f")
        }

        /// A constraint spreading `app=<own app label>` pods; `extra` adds or overrides
        /// fields (`minDomains`, policies, ...).
        fn spread(mut self, key: &str, max_skew: i32, when: &str, extra: Value) -> Self {
            let app = self.0["metadata"]["labels"]["app"].clone();
            let mut c = json!({"topologyKey": key, "maxSkew": max_skew,
                "whenUnsatisfiable": when, "labelSelector": {"matchLabels": {"app": app}}});
            for (k, v) in extra.as_object().into_iter().flatten() {
                c[k] = v.clone();
            }
            let list = &mut self.0["spec"]["topologySpreadConstraints"];
            if list.is_null() {
                *list = json!([]);
            }
            list.as_array_mut().unwrap().push(c);
            self
        }

        fn build(self) -> Pod {
            serde_json::from_value(self.0).unwrap()
        }
    }

    /// What selects pods in `default`: Services, ReplicationControllers, ReplicaSets and
    /// StatefulSets, given by their selectors.
    #[derive(Default)]
    struct Selecting(ClusterInput);

    fn selecting() -> Selecting {
        Selecting::default()
    }

    impl Selecting {
        fn service(mut self, name: &str, selector: Value) -> Self {
            let spec = if selector.is_null() {
                json!({})
            } else {
                json!({"selector": selector})
            };
            let service = json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec});
            self.0
                .services
                .push(serde_json::from_value(service).unwrap());
            self
        }

        fn replication_controller(mut self, name: &str, selector: Value) -> Self {
            let rc = json!({"metadata": {"name": name, "namespace": "default"},
                "spec": {"selector": selector}});
            self.0
                .replication_controllers
                .push(serde_json::from_value(rc).unwrap());
            self
        }

        /// The `web-5d8f` ReplicaSet of a `web` Deployment: `app=web` and its template hash.
        fn web_replica_set(self) -> Self {
            self.replica_set(
                "web-5d8f",
                json!({"matchLabels": {"app": "web", "pod-template-hash": "5d8f"}}),
            )
        }

        fn replica_set(mut self, name: &str, selector: Value) -> Self {
            let rs = json!({"metadata": {"name": name, "namespace": "default"},
                "spec": {"selector": selector}});
            self.0
                .replica_sets
                .push(serde_json::from_value(rs).unwrap());
            self
        }

        fn stateful_set(mut self, name: &str, selector: Value) -> Self {
            let ss = json!({"metadata": {"name": name, "namespace": "default"},
                "spec": {"selector": selector, "template": {}}});
            self.0
                .stateful_sets
                .push(serde_json::from_value(ss).unwrap());
            self
        }
    }

    /// A replica of the `web` Deployment, bound to `node`.
    fn replica_on(name: &str, node: &str) -> PodBuilder {
        replica(name).on(node)
    }

    /// A pending replica of the `web` Deployment, controlled by its ReplicaSet.
    fn replica(name: &str) -> PodBuilder {
        pod(name)
            .label("app", "web")
            .label("pod-template-hash", "5d8f")
            .owned_by_a_replica_set()
    }

    fn engine_with(
        nodes: Vec<NodeBuilder>,
        pods: Vec<PodBuilder>,
        selecting: Selecting,
        config: EngineConfig,
    ) -> Engine {
        let input = ClusterInput {
            nodes: nodes.into_iter().map(NodeBuilder::build).collect(),
            pods: pods.into_iter().map(PodBuilder::build).collect(),
            ..selecting.0
        };
        Engine::new(config, input)
    }

    fn evaluate(nodes: Vec<NodeBuilder>, pods: Vec<PodBuilder>, name: &str) -> Evaluation {
        evaluate_with(nodes, pods, selecting(), name)
    }

    fn evaluate_with(
        nodes: Vec<NodeBuilder>,
        pods: Vec<PodBuilder>,
        selecting: Selecting,
        name: &str,
    ) -> Evaluation {
        let mut engine = engine_with(nodes, pods, selecting, EngineConfig::default());
        let evaluation = engine.evaluate(&ObjectKey::new("default", name));
        assert_eq!(evaluation.error, None);
        evaluation
    }

    fn unfit<'a>(evaluation: &'a Evaluation, node: &str) -> &'a str {
        evaluation.unfit.get(node).map_or("fits", String::as_str)
    }

    /// This plugin's weighted scores (weight 2 in the default profile), by node.
    fn scores(evaluation: &Evaluation) -> Option<Vec<(&str, i64)>> {
        let scores = evaluation.plugin_scores.get("PodTopologySpread")?;
        Some(scores.iter().map(|(n, s)| (n.as_str(), *s)).collect())
    }

    fn two_zones() -> Vec<NodeBuilder> {
        vec![
            node("a1", Some("a")),
            node("a2", Some("a")),
            node("b1", Some("b")),
        ]
    }

    fn hard(name: &str) -> PodBuilder {
        pod(name)
            .label("app", "web")
            .spread(ZONE, 1, DO_NOT_SCHEDULE, json!({}))
    }

    #[test]
    fn max_skew_one_over_two_zones_sends_the_next_replica_to_the_emptier_zone() {
        let pods = vec![web_on("web-0", "a1"), hard("web-1")];
        let e = evaluate(two_zones(), pods, "web-1");
        assert_eq!(e.feasible, ["b1"]);
        assert_eq!(unfit(&e, "a1"), REASON);
        assert_eq!(unfit(&e, "a2"), REASON);

        let pods = vec![web_on("web-0", "a1"), web_on("web-1", "b1"), hard("web-2")];
        let e = evaluate(two_zones(), pods, "web-2");
        assert_eq!(e.feasible, ["a1", "a2", "b1"], "balanced: either zone");
    }

    #[test]
    fn a_node_without_the_topology_key_does_not_fit_with_its_own_reason() {
        let mut nodes = two_zones();
        nodes.push(node("plain", None));
        let e = evaluate(nodes, vec![hard("web-0")], "web-0");
        assert_eq!(unfit(&e, "plain"), REASON_MISSING_LABEL);
        assert_eq!(e.feasible, ["a1", "a2", "b1"]);
    }

    #[test]
    fn pods_of_other_apps_namespaces_and_pods_being_deleted_do_not_count() {
        let pods = vec![
            pod("api").label("app", "api").on("a1"),
            web_on("elsewhere", "a1").namespace("other"),
            web_on("leaving", "a2").deleting(),
            hard("web-0"),
        ];
        let e = evaluate(two_zones(), pods, "web-0");
        assert_eq!(e.feasible, ["a1", "a2", "b1"]);
    }

    #[test]
    fn min_domains_counts_missing_domains_as_empty() {
        let pods = |min_domains: Value| {
            vec![
                web_on("web-0", "a1"),
                web_on("web-1", "b1"),
                pod("web-2").label("app", "web").spread(
                    ZONE,
                    1,
                    DO_NOT_SCHEDULE,
                    json!({"minDomains": min_domains}),
                ),
            ]
        };
        let e = evaluate(two_zones(), pods(json!(2)), "web-2");
        assert_eq!(e.feasible, ["a1", "a2", "b1"], "two zones are enough");
        let e = evaluate(two_zones(), pods(json!(3)), "web-2");
        assert!(
            e.feasible.is_empty(),
            "a third zone is wanted: the least is 0"
        );
        assert_eq!(unfit(&e, "b1"), REASON);
    }

    #[test]
    fn node_affinity_policy_decides_whether_zones_the_pod_cannot_use_count() {
        let nodes = vec![
            node("a1", Some("a")).label("disk", "ssd"),
            node("b1", Some("b")).label("disk", "ssd"),
            node("c1", Some("c")),
        ];
        let pods = |policy: &str| {
            vec![
                web_on("web-0", "a1"),
                web_on("web-1", "b1"),
                pod("web-2")
                    .label("app", "web")
                    .node_selector("disk", "ssd")
                    .spread(
                        ZONE,
                        1,
                        DO_NOT_SCHEDULE,
                        json!({"nodeAffinityPolicy": policy}),
                    ),
            ]
        };
        let e = evaluate(nodes, pods("Honor"), "web-2");
        assert_eq!(
            e.feasible,
            ["a1", "b1"],
            "zone c is not the pod's: skew counts a and b"
        );
        let nodes = vec![
            node("a1", Some("a")).label("disk", "ssd"),
            node("b1", Some("b")).label("disk", "ssd"),
            node("c1", Some("c")),
        ];
        let e = evaluate(nodes, pods("Ignore"), "web-2");
        assert!(e.feasible.is_empty(), "empty zone c is the least");
        assert_eq!(unfit(&e, "a1"), REASON);
    }

    #[test]
    fn node_taints_policy_honor_leaves_out_zones_of_untolerated_nodes() {
        let nodes = || {
            vec![
                node("a1", Some("a")),
                node("b1", Some("b")),
                node("c1", Some("c")).tainted(),
            ]
        };
        let pods = |policy: Value| {
            vec![
                web_on("web-0", "a1"),
                web_on("web-1", "b1"),
                pod("web-2").label("app", "web").spread(
                    ZONE,
                    1,
                    DO_NOT_SCHEDULE,
                    json!({"nodeTaintsPolicy": policy}),
                ),
            ]
        };
        let e = evaluate(nodes(), pods(json!("Honor")), "web-2");
        assert_eq!(e.feasible, ["a1", "b1"]);
        let e = evaluate(nodes(), pods(Value::Null), "web-2");
        assert!(
            e.feasible.is_empty(),
            "by default the tainted zone c counts, empty"
        );
    }

    #[test]
    fn match_label_keys_spread_each_revision_on_its_own() {
        let pods = vec![
            web_on("old-0", "a1").label("rev", "1"),
            web_on("old-1", "a2").label("rev", "1"),
            pod("new-0").label("app", "web").label("rev", "2").spread(
                ZONE,
                1,
                DO_NOT_SCHEDULE,
                json!({"matchLabelKeys": ["rev"]}),
            ),
        ];
        let e = evaluate(two_zones(), pods, "new-0");
        assert_eq!(e.feasible, ["a1", "a2", "b1"], "rev 1 pods are not counted");
    }

    #[test]
    fn an_empty_selector_counts_no_pods_but_matches_the_pod() {
        let pods = vec![
            web_on("web-0", "a1"),
            web_on("web-1", "a2"),
            pod("p").spread(ZONE, 1, DO_NOT_SCHEDULE, json!({"labelSelector": {}})),
        ];
        let e = evaluate(two_zones(), pods, "p");
        assert_eq!(e.feasible, ["a1", "a2", "b1"]);
    }

    #[test]
    fn schedule_anyway_scores_the_emptier_zone_higher() {
        let mut nodes = two_zones();
        nodes.push(node("plain", None));
        let pods = vec![
            web_on("web-0", "a1"),
            web_on("web-1", "a2"),
            pod("web-2")
                .label("app", "web")
                .spread(ZONE, 1, SCHEDULE_ANYWAY, json!({})),
        ];
        let e = evaluate(nodes, pods, "web-2");
        assert_eq!(e.feasible, ["a1", "a2", "b1", "plain"], "only a preference");
        // Zone a holds 2 pods: raw round(2 * ln 4) = 3 against 0 in zone b, normalised 0 and
        // 100, times the weight 2; the node without a zone is not scored.
        assert_eq!(
            scores(&e),
            Some(vec![("a1", 0), ("a2", 0), ("b1", 200), ("plain", 0)])
        );
    }

    #[test]
    fn hostname_spreading_counts_each_nodes_own_pods() {
        let nodes = vec![node("n1", None), node("n2", None), node("n3", None)];
        let pods = vec![
            web_on("web-0", "n1"),
            web_on("web-1", "n1"),
            web_on("web-2", "n2"),
            pod("web-3")
                .label("app", "web")
                .spread(HOSTNAME, 2, SCHEDULE_ANYWAY, json!({})),
        ];
        let e = evaluate(nodes, pods, "web-3");
        // Weight ln 5; raw round(2*1.609 + 1) = 4, round(1.609 + 1) = 3, 1: normalised
        // 100 * (4 + 1 - s) / 4 = 25, 50, 100.
        assert_eq!(scores(&e), Some(vec![("n1", 50), ("n2", 100), ("n3", 200)]));
    }

    fn two_by_two() -> Vec<NodeBuilder> {
        vec![
            node("a1", Some("a")),
            node("a2", Some("a")),
            node("b1", Some("b")),
            node("b2", Some("b")),
        ]
    }

    #[test]
    fn three_replicas_of_a_replica_set_on_four_nodes_in_two_zones_go_two_and_one() {
        let pods = vec![replica("web-0"), replica("web-1"), replica("web-2")];
        let mut engine = engine_with(
            two_by_two(),
            pods,
            selecting().web_replica_set(),
            EngineConfig::default(),
        );
        let mut placed = Vec::new();
        for name in ["web-0", "web-1", "web-2"] {
            let Decision::Scheduled(p) = engine.schedule(&ObjectKey::new("default", name)) else {
                panic!("{name} not scheduled");
            };
            placed.push(p.node.clone());
            engine.assume(&p);
        }
        // The first on a1 (ties go to the first node); the second to the other zone; the
        // third to an empty node, zone a by name.
        assert_eq!(placed, ["a1", "b1", "a2"]);
    }

    #[test]
    fn system_defaults_score_the_emptier_zone_and_node_higher_for_a_replica_set() {
        let pods = vec![
            replica_on("web-0", "a1"),
            replica_on("web-1", "a2"),
            replica("web-2"),
        ];
        let e = evaluate_with(two_by_two(), pods, selecting().web_replica_set(), "web-2");
        assert_eq!(e.feasible, ["a1", "a2", "b1", "b2"], "only a preference");
        // Hostname (maxSkew 3) weighs ln 6, zone (maxSkew 5) ln 4: on a1 round(1.79 + 2 +
        // 2 * 1.39 + 4) = 11, on b1 6; normalised 100 * (11 + 6 - s) / 11, times 2.
        assert_eq!(
            scores(&e),
            Some(vec![("a1", 108), ("a2", 108), ("b1", 200), ("b2", 200)])
        );
    }

    #[test]
    fn a_pod_that_nothing_selects_gets_no_default_spreading() {
        let pods = |pending: PodBuilder| {
            vec![
                replica_on("web-0", "a1"),
                replica_on("web-1", "a2"),
                pending,
            ]
        };
        let workloads = || {
            selecting()
                .web_replica_set()
                .service("api", json!({"app": "api"}))
                .service("headless", Value::Null)
        };
        let no_owner = pod("web-2").label("app", "web");
        let e = evaluate_with(two_by_two(), pods(no_owner), workloads(), "web-2");
        assert_eq!(scores(&e), None, "no owner, no Service: the plugin skips");

        let unknown = pod("web-2")
            .label("app", "web")
            .owned_by("ReplicaSet", "gone");
        let e = evaluate_with(two_by_two(), pods(unknown), workloads(), "web-2");
        assert_eq!(scores(&e), None, "a ReplicaSet not in the cluster");

        let deployment = pod("web-2")
            .label("app", "web")
            .owned_by("Deployment", "web");
        let e = evaluate_with(two_by_two(), pods(deployment), workloads(), "web-2");
        assert_eq!(scores(&e), None, "a Deployment does not own pods itself");
    }

    #[test]
    fn a_service_that_selects_the_pod_gives_the_default_selector() {
        let pods = vec![
            web_on("web-0", "a1"),
            web_on("web-1", "a2"),
            pod("web-2").label("app", "web"),
        ];
        let services = selecting().service("web", json!({"app": "web"}));
        let e = evaluate_with(two_by_two(), pods, services, "web-2");
        assert_eq!(
            scores(&e),
            Some(vec![("a1", 108), ("a2", 108), ("b1", 200), ("b2", 200)])
        );
    }

    #[test]
    fn the_default_selector_merges_services_and_adds_the_controllers_selector() {
        let pod = |owner: Option<(&str, &str)>| {
            let p = pod("p").label("app", "web").label("tier", "front");
            match owner {
                Some((kind, name)) => p.owned_by(kind, name),
                None => p,
            }
            .build()
        };
        let workloads = selecting()
            .service("web", json!({"app": "web"}))
            .service("front", json!({"tier": "front"}))
            .service("other", json!({"app": "db"}))
            .service("everything", json!({}))
            .replication_controller("rc", json!({"app": "web", "rc": "1"}))
            .replica_set(
                "rs",
                json!({"matchExpressions": [{"key": "canary", "operator": "DoesNotExist"}]}),
            )
            .replica_set("bad", json!({"matchLabels": {"-bad": "x"}}))
            .stateful_set("ss", json!({"matchLabels": {"app": "web"}}));
        let state = ClusterState::new(workloads.0);
        let selector = |owner| default_selector(&pod(owner), "default", &state.workloads);
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let web_front = labels(&[("app", "web"), ("tier", "front")]);
        let services = selector(None);
        assert!(services.matches(&web_front));
        assert!(
            !services.matches(&labels(&[("app", "web")])),
            "both Services"
        );

        let rc = selector(Some(("ReplicationController", "rc")));
        assert!(!rc.matches(&web_front), "the RC's labels merged in");
        assert!(rc.matches(&labels(&[("app", "web"), ("tier", "front"), ("rc", "1")])));

        let rs = selector(Some(("ReplicaSet", "rs")));
        assert!(rs.matches(&web_front));
        assert!(!rs.matches(&labels(&[
            ("app", "web"),
            ("tier", "front"),
            ("canary", "")
        ])));

        assert_eq!(
            selector(Some(("ReplicaSet", "bad"))),
            services,
            "invalid: not added"
        );
        assert_eq!(selector(Some(("StatefulSet", "missing"))), services);
        assert!(selector(Some(("StatefulSet", "ss"))).matches(&web_front));
        assert!(
            default_selector(&pod(None), "other", &state.workloads).is_everything(),
            "Services of another namespace"
        );
    }

    #[test]
    fn list_default_constraints_apply_to_replicas_without_their_own() {
        let args = Args {
            default_constraints: vec![
                serde_json::from_value(json!({"topologyKey": ZONE,
                "maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}))
                .unwrap(),
            ],
            defaulting_type: DefaultingType::List,
        };
        let mut config = EngineConfig::default();
        config.profile.args.pod_topology_spread = args;
        let pods = |pending| vec![replica_on("web-0", "a1"), pending];
        let mut engine = engine_with(
            two_zones(),
            pods(replica("web-1")),
            selecting().web_replica_set(),
            config.clone(),
        );
        let e = engine.evaluate(&ObjectKey::new("default", "web-1"));
        assert_eq!(e.feasible, ["b1"], "zone b, as the default constraint asks");
        assert_eq!(unfit(&e, "a2"), REASON);

        let lone = pod("web-1").label("app", "web");
        let mut engine = engine_with(two_zones(), pods(lone), selecting(), config);
        let e = engine.evaluate(&ObjectKey::new("default", "web-1"));
        assert_eq!(
            e.feasible,
            ["a1", "a2", "b1"],
            "nothing selects it: no default"
        );
    }
}
