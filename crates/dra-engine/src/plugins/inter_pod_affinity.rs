//! InterPodAffinity: where a pod may go, and where it would rather go, given the pods
//! already bound, as kube-scheduler v1.37 decides it.
//!
//! Filter, from counts made once per attempt (PreFilter) of the pods bound in each
//! topology domain (a pair of topology key and node label value):
//! - the pod's required affinity: every term's domain on the node holds a pod that matches
//!   *all* the terms; the first pod of a group that names itself passes where the node has
//!   every topology key, as long as no pod anywhere matches;
//! - the pod's required anti-affinity: no term's domain on the node holds a pod it matches;
//! - symmetry: no bound pod's required anti-affinity matches this pod in a domain of the node.
//!
//! Score: for each domain, the weights of the pod's preferred terms that bound pods there
//! match (anti-affinity subtracts), plus bound pods' own preferred terms that match this pod
//! and their required affinity terms at `hardPodAffinityWeight`; a node scores the sum over
//! its domains, normalised between the lowest and the highest.
//!
//! Terms are read as the API server and kube-scheduler leave them: `matchLabelKeys` and
//! `mismatchLabelKeys` merged into the selector (see [`label_selector_of`]); no namespaces
//! and no namespaceSelector mean the pod's own namespace; a namespaceSelector of the pod's
//! own terms is turned into the namespaces it selects now. Pods being deleted still count
//! (upstream does not leave them out here); terminal pods are not bound pods.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodAffinityTerm, WeightedPodAffinityTerm};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use rayon::prelude::*;

use super::label_selector::{NO_LABELS, Selector, labels_of};
use crate::framework::{Cycle, MAX_NODE_SCORE, Plugin, PluginCycle, Point, Status};
use crate::state::{ClusterState, NodeInfo, ObjectKey};

pub const REASON_AFFINITY: &str = "node(s) didn't match pod affinity rules";
pub const REASON_ANTI_AFFINITY: &str = "node(s) didn't match pod anti-affinity rules";
pub const REASON_EXISTING_ANTI_AFFINITY: &str =
    "node(s) didn't satisfy existing pods anti-affinity rules";

/// `InterPodAffinityArgs`.
#[derive(Clone, Debug, PartialEq)]
pub struct Args {
    /// What a bound pod's required affinity term that matches the pod adds to the score of
    /// its domain (0..=100).
    pub hard_pod_affinity_weight: i32,
    /// Leave bound pods' preferred terms out of the score of a pod that has none itself.
    pub ignore_preferred_terms_of_existing_pods: bool,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            hard_pod_affinity_weight: 1,
            ignore_preferred_terms_of_existing_pods: false,
        }
    }
}

pub struct InterPodAffinity {
    args: Args,
}

impl InterPodAffinity {
    pub fn new(args: &Args) -> Self {
        InterPodAffinity { args: args.clone() }
    }
}

impl Plugin for InterPodAffinity {
    fn name(&self) -> &'static str {
        "InterPodAffinity"
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
        let namespace_labels = cycle
            .state
            .namespaces
            .get(namespace_of(cycle.pod))
            .map_or(&NO_LABELS, |ns| labels_of(&ns.metadata));
        Box::new(AffinityCycle {
            cycle,
            args: &self.args,
            namespace_labels,
            existing: None,
            filter: FilterState::default(),
            scores: TopologyCounts::default(),
        })
    }
}

/// A pod affinity term ready to match pods (kube-scheduler's `AffinityTerm`).
#[derive(Debug)]
struct Term {
    namespaces: BTreeSet<String>,
    namespace_selector: Selector,
    selector: Selector,
    topology_key: String,
}

impl Term {
    fn new(owner: &Pod, term: &PodAffinityTerm) -> Result<Term, String> {
        let selector =
            Selector::parse(label_selector_of(term, labels_of(&owner.metadata)).as_ref())?;
        let listed = term.namespaces.as_deref().unwrap_or_default();
        let namespaces = if listed.is_empty() && term.namespace_selector.is_none() {
            BTreeSet::from([namespace_of(owner).to_string()])
        } else {
            listed.iter().cloned().collect()
        };
        Ok(Term {
            namespaces,
            namespace_selector: Selector::parse(term.namespace_selector.as_ref())?,
            selector,
            topology_key: term.topology_key.clone(),
        })
    }

    /// Whether `pod` is one this term selects: in one of its namespaces (or one whose labels,
    /// `namespace_labels`, the namespace selector selects) and with matching labels.
    fn matches(&self, pod: &Pod, namespace_labels: &BTreeMap<String, String>) -> bool {
        (self.namespaces.contains(namespace_of(pod))
            || self.namespace_selector.matches(namespace_labels))
            && self.selector.matches(labels_of(&pod.metadata))
    }

    /// The namespaces the namespace selector selects now, added to the listed ones, so the
    /// term no longer needs a pod's namespace labels. An empty selector (every namespace)
    /// stays as it is.
    fn unroll_namespaces(&mut self, state: &ClusterState) {
        if self.namespace_selector.is_everything() {
            return;
        }
        for (name, ns) in &state.namespaces {
            if self.namespace_selector.matches(labels_of(&ns.metadata)) {
                self.namespaces.insert(name.clone());
            }
        }
        self.namespace_selector = Selector::Nothing;
    }
}

/// A pod's parsed terms (what kube-scheduler keeps in its PodInfo).
#[derive(Debug, Default)]
struct PodTerms {
    affinity: Vec<Term>,
    anti_affinity: Vec<Term>,
    preferred_affinity: Vec<(Term, i64)>,
    preferred_anti_affinity: Vec<(Term, i64)>,
}

impl PodTerms {
    /// Each of the four lists on its own; a list with an invalid term is left empty and
    /// named in the errors.
    fn of(pod: &Pod) -> (PodTerms, Vec<String>) {
        let affinity = pod.spec.as_ref().and_then(|s| s.affinity.as_ref());
        let pod_affinity = affinity.and_then(|a| a.pod_affinity.as_ref());
        let anti = affinity.and_then(|a| a.pod_anti_affinity.as_ref());
        let mut errors = Vec::new();
        let mut required = |terms: Option<&Vec<PodAffinityTerm>>, what: &str| {
            terms
                .into_iter()
                .flatten()
                .map(|t| Term::new(pod, t))
                .collect::<Result<Vec<_>, _>>()
                .unwrap_or_else(|e| {
                    errors.push(format!("{what}: {e}"));
                    Vec::new()
                })
        };
        let affinity_terms = required(
            pod_affinity.and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            }),
            "requiredAffinityTerms",
        );
        let anti_terms = required(
            anti.and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            }),
            "requiredAntiAffinityTerms",
        );
        let mut preferred = |terms: Option<&Vec<WeightedPodAffinityTerm>>, what: &str| {
            terms
                .into_iter()
                .flatten()
                .map(|t| {
                    Term::new(pod, &t.pod_affinity_term).map(|term| (term, i64::from(t.weight)))
                })
                .collect::<Result<Vec<_>, _>>()
                .unwrap_or_else(|e| {
                    errors.push(format!("{what}: {e}"));
                    Vec::new()
                })
        };
        let preferred_affinity = preferred(
            pod_affinity.and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            }),
            "preferredAffinityTerms",
        );
        let preferred_anti_affinity = preferred(
            anti.and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            }),
            "preferredAntiAffinityTerms",
        );
        (
            PodTerms {
                affinity: affinity_terms,
                anti_affinity: anti_terms,
                preferred_affinity,
                preferred_anti_affinity,
            },
            errors,
        )
    }
}

/// The selector of a term with `matchLabelKeys` (`key In (the pod's value)`) and
/// `mismatchLabelKeys` (`key NotIn (the pod's value)`) merged in, as the API server merges
/// them when it creates the pod; keys the pod has no label for add nothing, and a term
/// without a selector selects nothing still.
///
/// Pods read from the API server come merged already. Merging again changes nothing: a
/// `matchLabelKeys` key that already has an `In` requirement is taken as merged (the API
/// server refuses a pod whose own selector names the key), and a second `NotIn` with the
/// same value selects the same pods.
pub fn label_selector_of(
    term: &PodAffinityTerm,
    labels: &BTreeMap<String, String>,
) -> Option<LabelSelector> {
    let mut selector = term.label_selector.clone()?;
    let keys = |k: &Option<Vec<String>>| k.clone().unwrap_or_default();
    let (matching, mismatching) = (
        keys(&term.match_label_keys),
        keys(&term.mismatch_label_keys),
    );
    if matching.is_empty() && mismatching.is_empty() {
        return Some(selector);
    }
    let expressions = selector.match_expressions.get_or_insert_with(Vec::new);
    for (keys, operator) in [(matching, "In"), (mismatching, "NotIn")] {
        for key in keys {
            let Some(value) = labels.get(&key) else {
                continue;
            };
            let merged = expressions.iter().any(|e| {
                e.key == key
                    && e.operator == operator
                    && (operator == "In"
                        || e.values.as_deref() == Some(std::slice::from_ref(value)))
            });
            if !merged {
                expressions.push(LabelSelectorRequirement {
                    key,
                    operator: operator.to_string(),
                    values: Some(vec![value.clone()]),
                });
            }
        }
    }
    Some(selector)
}

fn namespace_of(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// The pods bound to `node`.
fn bound_pods<'a>(state: &'a ClusterState, node: &'a NodeInfo) -> impl Iterator<Item = &'a Pod> {
    node.pod_keys
        .iter()
        .filter_map(|key| state.pods.get(key).map(Arc::as_ref))
}

/// `terms` is not empty and `pod` matches every one (the pod's own terms, namespaces
/// unrolled: no namespace labels needed).
fn matches_all(terms: &[Term], pod: &Pod) -> bool {
    !terms.is_empty() && terms.iter().all(|t| t.matches(pod, &NO_LABELS))
}

/// Counts (or weights) per topology domain: topology key → node label value → count.
/// A domain once touched stays, even at 0 (kube-scheduler's maps keep such entries too,
/// and whether any exists decides).
#[derive(Debug, Default)]
struct TopologyCounts(HashMap<String, HashMap<String, i64>>);

impl TopologyCounts {
    /// Add `n` to the domain of `node` for `key`, when the node has that label.
    fn add(&mut self, node: &NodeInfo, key: &str, n: i64) {
        if let Some(value) = labels_of(&node.node.metadata).get(key) {
            *self
                .0
                .entry(key.to_string())
                .or_default()
                .entry(value.clone())
                .or_default() += n;
        }
    }

    fn get(&self, key: &str, value: &str) -> i64 {
        self.0
            .get(key)
            .and_then(|values| values.get(value))
            .copied()
            .unwrap_or(0)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn merge(mut self, other: TopologyCounts) -> TopologyCounts {
        for (key, values) in other.0 {
            let mine = self.0.entry(key).or_default();
            for (value, n) in values {
                *mine.entry(value).or_default() += n;
            }
        }
        self
    }

    /// Whether a domain the node is in has a count above 0.
    fn any_positive_for(&self, node: &NodeInfo) -> bool {
        let labels = labels_of(&node.node.metadata);
        self.0.iter().any(|(key, values)| {
            labels
                .get(key)
                .and_then(|value| values.get(value))
                .is_some_and(|n| *n > 0)
        })
    }

    /// The sum over the domains the node is in.
    fn sum_for(&self, node: &NodeInfo) -> i64 {
        let labels = labels_of(&node.node.metadata);
        self.0
            .iter()
            .filter_map(|(key, values)| values.get(labels.get(key)?))
            .sum()
    }
}

/// A bound pod with pod (anti-)affinity and its parsed terms.
struct Existing<'a> {
    node: &'a NodeInfo,
    key: &'a ObjectKey,
    pod: &'a Pod,
    terms: PodTerms,
}

/// What PreFilter leaves for Filter.
#[derive(Default)]
struct FilterState {
    /// The pod's required terms, namespaces unrolled.
    affinity: Vec<Term>,
    anti_affinity: Vec<Term>,
    /// The pod matches all its own affinity terms.
    matches_itself: bool,
    /// Bound pods that match all of the pod's affinity terms, per domain of each term.
    affinity_counts: TopologyCounts,
    /// Bound pods that a required anti-affinity term of the pod matches, per domain.
    anti_affinity_counts: TopologyCounts,
    /// Bound pods whose required anti-affinity matches the pod, per domain.
    existing_anti_affinity_counts: TopologyCounts,
}

struct AffinityCycle<'a> {
    cycle: &'a Cycle<'a>,
    args: &'a Args,
    /// The labels of the pod's namespace (none when the namespace is unknown).
    namespace_labels: &'a BTreeMap<String, String>,
    /// Bound pods with pod affinity or anti-affinity, parsed once per attempt.
    existing: Option<Vec<Existing<'a>>>,
    filter: FilterState,
    /// Score per domain, from PreScore.
    scores: TopologyCounts,
}

impl<'a> AffinityCycle<'a> {
    fn existing(&mut self) -> &[Existing<'a>] {
        let state = self.cycle.state;
        self.existing.get_or_insert_with(|| {
            // Usually none: only the nodes with such pods, in name order, go to the pool.
            let nodes: Vec<&NodeInfo> = state
                .nodes_with_affinity_pods
                .iter()
                .filter_map(|name| state.nodes.get(name))
                .collect();
            nodes
                .par_iter()
                .flat_map_iter(|node| {
                    node.pods_with_affinity
                        .iter()
                        .filter_map(|key| Some((key, state.pods.get(key)?)))
                        .map(move |(key, pod)| Existing {
                            node,
                            key,
                            pod,
                            terms: PodTerms::of(pod).0,
                        })
                })
                .collect()
        })
    }

    /// A bound pod's part of the score: the pod's preferred terms that match it, and its
    /// own terms that match the pod.
    fn score_existing(
        &self,
        scores: &mut TopologyCounts,
        incoming: &PodTerms,
        pod: &Pod,
        node: &NodeInfo,
        terms: Option<&PodTerms>,
    ) {
        if labels_of(&node.node.metadata).is_empty() {
            return;
        }
        let this = self.cycle.pod;
        for (term, weight) in &incoming.preferred_affinity {
            if term.matches(pod, &NO_LABELS) {
                scores.add(node, &term.topology_key, *weight);
            }
        }
        for (term, weight) in &incoming.preferred_anti_affinity {
            if term.matches(pod, &NO_LABELS) {
                scores.add(node, &term.topology_key, -weight);
            }
        }
        let Some(terms) = terms else {
            return;
        };
        let hard = i64::from(self.args.hard_pod_affinity_weight);
        if hard > 0 {
            for term in &terms.affinity {
                if term.matches(this, self.namespace_labels) {
                    scores.add(node, &term.topology_key, hard);
                }
            }
        }
        for (term, weight) in &terms.preferred_affinity {
            if term.matches(this, self.namespace_labels) {
                scores.add(node, &term.topology_key, *weight);
            }
        }
        for (term, weight) in &terms.preferred_anti_affinity {
            if term.matches(this, self.namespace_labels) {
                scores.add(node, &term.topology_key, -weight);
            }
        }
    }
}

impl PluginCycle for AffinityCycle<'_> {
    fn pre_filter(&mut self) -> Status {
        let pod = self.cycle.pod;
        let state = self.cycle.state;
        let (terms, errors) = PodTerms::of(pod);
        if !errors.is_empty() {
            return Status::unresolvable(format!("parsing pod: {}", aggregate(&errors)));
        }
        let mut s = FilterState {
            affinity: terms.affinity,
            anti_affinity: terms.anti_affinity,
            ..FilterState::default()
        };
        for term in s.affinity.iter_mut().chain(s.anti_affinity.iter_mut()) {
            term.unroll_namespaces(state);
        }
        let namespace_labels = self.namespace_labels;
        for existing in self.existing() {
            for term in &existing.terms.anti_affinity {
                if term.matches(pod, namespace_labels) {
                    s.existing_anti_affinity_counts
                        .add(existing.node, &term.topology_key, 1);
                }
            }
        }
        if !s.affinity.is_empty() || !s.anti_affinity.is_empty() {
            let nodes: Vec<&NodeInfo> = state.nodes.values().collect();
            let (affinity, anti_affinity) = nodes
                .par_iter()
                .map(|node| {
                    let mut affinity = TopologyCounts::default();
                    let mut anti_affinity = TopologyCounts::default();
                    for other in bound_pods(state, node) {
                        if matches_all(&s.affinity, other) {
                            for term in &s.affinity {
                                affinity.add(node, &term.topology_key, 1);
                            }
                        }
                        for term in &s.anti_affinity {
                            if term.matches(other, &NO_LABELS) {
                                anti_affinity.add(node, &term.topology_key, 1);
                            }
                        }
                    }
                    (affinity, anti_affinity)
                })
                .reduce(Default::default, |(a1, b1), (a2, b2)| {
                    (a1.merge(a2), b1.merge(b2))
                });
            s.affinity_counts = affinity;
            s.anti_affinity_counts = anti_affinity;
        }
        if s.existing_anti_affinity_counts.is_empty()
            && s.affinity.is_empty()
            && s.anti_affinity.is_empty()
        {
            return Status::skip();
        }
        s.matches_itself = matches_all(&s.affinity, pod);
        self.filter = s;
        Status::success()
    }

    fn filter(&self, node: &NodeInfo) -> Status {
        let s = &self.filter;
        let labels = labels_of(&node.node.metadata);
        if !s.affinity.is_empty() {
            let mut pods_there = true;
            for term in &s.affinity {
                let Some(value) = labels.get(&term.topology_key) else {
                    return Status::unresolvable(REASON_AFFINITY);
                };
                if s.affinity_counts.get(&term.topology_key, value) <= 0 {
                    pods_there = false;
                }
            }
            // The first of a group of pods that want each other: nothing matches anywhere
            // yet, and the pod matches its own terms.
            let first = s.affinity_counts.is_empty() && s.matches_itself;
            if !pods_there && !first {
                return Status::unresolvable(REASON_AFFINITY);
            }
        }
        let anti_affinity_violated = s.anti_affinity.iter().any(|term| {
            labels
                .get(&term.topology_key)
                .is_some_and(|value| s.anti_affinity_counts.get(&term.topology_key, value) > 0)
        });
        if anti_affinity_violated {
            return Status::unschedulable(REASON_ANTI_AFFINITY);
        }
        if s.existing_anti_affinity_counts.any_positive_for(node) {
            return Status::unschedulable(REASON_EXISTING_ANTI_AFFINITY);
        }
        Status::success()
    }

    fn pre_score(&mut self, _feasible: &[&NodeInfo]) -> Status {
        let pod = self.cycle.pod;
        let state = self.cycle.state;
        let affinity = pod.spec.as_ref().and_then(|s| s.affinity.as_ref());
        let has_preferred = affinity.is_some_and(|a| {
            a.pod_affinity.as_ref().is_some_and(|p| {
                p.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
                    .is_some_and(|t| !t.is_empty())
            }) || a.pod_anti_affinity.as_ref().is_some_and(|p| {
                p.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
                    .is_some_and(|t| !t.is_empty())
            })
        });
        if self.args.ignore_preferred_terms_of_existing_pods && !has_preferred {
            return Status::skip();
        }
        let (mut incoming, errors) = PodTerms::of(pod);
        if !errors.is_empty() {
            return Status::error(format!("failed to parse pod: {}", aggregate(&errors)));
        }
        for (term, _) in incoming
            .preferred_affinity
            .iter_mut()
            .chain(incoming.preferred_anti_affinity.iter_mut())
        {
            term.unroll_namespaces(state);
        }
        self.existing();
        let existing = self.existing.take().unwrap_or_default();
        let scores = if has_preferred {
            // Every bound pod may match the pod's preferred terms.
            let terms: HashMap<&ObjectKey, &PodTerms> =
                existing.iter().map(|e| (e.key, &e.terms)).collect();
            let nodes: Vec<&NodeInfo> = state.nodes.values().collect();
            nodes
                .par_iter()
                .map(|node| {
                    let mut scores = TopologyCounts::default();
                    for key in &node.pod_keys {
                        if let Some(other) = state.pods.get(key) {
                            let own = terms.get(key).copied();
                            self.score_existing(&mut scores, &incoming, other, node, own);
                        }
                    }
                    scores
                })
                .reduce(TopologyCounts::default, TopologyCounts::merge)
        } else {
            let mut scores = TopologyCounts::default();
            for e in &existing {
                self.score_existing(&mut scores, &incoming, e.pod, e.node, Some(&e.terms));
            }
            scores
        };
        self.existing = Some(existing);
        if scores.is_empty() {
            return Status::skip();
        }
        self.scores = scores;
        Status::success()
    }

    fn score(&self, node: &NodeInfo) -> Result<i64, Status> {
        Ok(self.scores.sum_for(node))
    }

    /// Between the lowest (0) and the highest (100); all equal: all 0.
    fn normalize_score(&self, scores: &mut [i64]) {
        if self.scores.is_empty() {
            return;
        }
        let min = scores.iter().copied().min().unwrap_or(0);
        let max = scores.iter().copied().max().unwrap_or(0);
        let spread = max - min;
        for s in scores.iter_mut() {
            *s = if spread > 0 {
                (MAX_NODE_SCORE as f64 * ((*s - min) as f64 / spread as f64)) as i64
            } else {
                0
            };
        }
    }
}

/// Several errors in one line, as apimachinery's aggregate writes them.
fn aggregate(errors: &[String]) -> String {
    match errors {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Namespace, Node};
    use serde_json::{Value, json};

    use super::*;
    use crate::{ClusterInput, Decision, Engine, EngineConfig, Evaluation};

    const HOSTNAME: &str = "kubernetes.io/hostname";
    const ZONE: &str = "topology.kubernetes.io/zone";

    /// A node with its hostname label and, if given, a zone.
    fn node(name: &str, zone: Option<&str>) -> Node {
        let mut labels = json!({HOSTNAME: name});
        if let Some(zone) = zone {
            labels[ZONE] = json!(zone);
        }
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}}}))
        .unwrap()
    }

    fn namespace(name: &str, labels: Value) -> Namespace {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    }

    struct PodBuilder(Value);

    fn pod(name: &str) -> PodBuilder {
        PodBuilder(
            json!({"metadata": {"name": name, "namespace": "default", "labels": {}},
            "spec": {"containers": [{"name": "c"}]}}),
        )
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

        fn terms(&mut self, kind: &str, field: &str) -> &mut Vec<Value> {
            let list = &mut self.0["spec"]["affinity"][kind][field];
            if list.is_null() {
                *list = json!([]);
            }
            list.as_array_mut().unwrap()
        }

        /// A required `podAffinity` term.
        fn with(mut self, term: Value) -> Self {
            let field = "requiredDuringSchedulingIgnoredDuringExecution";
            self.terms("podAffinity", field).push(term);
            self
        }

        /// A required `podAntiAffinity` term.
        fn away_from(mut self, term: Value) -> Self {
            let field = "requiredDuringSchedulingIgnoredDuringExecution";
            self.terms("podAntiAffinity", field).push(term);
            self
        }

        fn prefers_with(mut self, weight: i32, term: Value) -> Self {
            let field = "preferredDuringSchedulingIgnoredDuringExecution";
            self.terms("podAffinity", field)
                .push(json!({"weight": weight, "podAffinityTerm": term}));
            self
        }

        fn prefers_away_from(mut self, weight: i32, term: Value) -> Self {
            let field = "preferredDuringSchedulingIgnoredDuringExecution";
            self.terms("podAntiAffinity", field)
                .push(json!({"weight": weight, "podAffinityTerm": term}));
            self
        }

        fn build(self) -> Pod {
            serde_json::from_value(self.0).unwrap()
        }
    }

    /// A term on `topology` selecting pods labelled `app=<app>`.
    fn app(app: &str, topology: &str) -> Value {
        json!({"topologyKey": topology, "labelSelector": {"matchLabels": {"app": app}}})
    }

    fn engine(nodes: Vec<Node>, pods: Vec<PodBuilder>) -> Engine {
        engine_with(Args::default(), nodes, Vec::new(), pods)
    }

    fn engine_with(
        args: Args,
        nodes: Vec<Node>,
        namespaces: Vec<Namespace>,
        pods: Vec<PodBuilder>,
    ) -> Engine {
        let mut config = EngineConfig::default();
        config.profile.args.inter_pod_affinity = args;
        let input = ClusterInput {
            nodes,
            namespaces,
            pods: pods.into_iter().map(PodBuilder::build).collect(),
            ..Default::default()
        };
        Engine::new(config, input)
    }

    fn evaluate(engine: &mut Engine, name: &str) -> Evaluation {
        evaluate_in(engine, "default", name)
    }

    fn evaluate_in(engine: &mut Engine, ns: &str, name: &str) -> Evaluation {
        let evaluation = engine.evaluate(&ObjectKey::new(ns, name));
        assert_eq!(evaluation.error, None);
        evaluation
    }

    fn unfit<'a>(evaluation: &'a Evaluation, node: &str) -> &'a str {
        evaluation.unfit.get(node).map_or("fits", String::as_str)
    }

    /// This plugin's weighted scores (weight 2 in the default profile), by node.
    fn scores(evaluation: &Evaluation) -> Option<Vec<(&str, i64)>> {
        let scores = evaluation.plugin_scores.get("InterPodAffinity")?;
        Some(scores.iter().map(|(n, s)| (n.as_str(), *s)).collect())
    }

    fn web(name: &str) -> PodBuilder {
        pod(name)
            .label("app", "web")
            .away_from(app("web", HOSTNAME))
    }

    #[test]
    fn a_third_replica_with_hostname_anti_affinity_does_not_fit_on_two_nodes() {
        let nodes = vec![node("n1", None), node("n2", None)];
        let mut engine = engine(nodes, vec![web("web-0"), web("web-1"), web("web-2")]);
        let mut placed = Vec::new();
        for name in ["web-0", "web-1"] {
            let Decision::Scheduled(p) = engine.schedule(&ObjectKey::new("default", name)) else {
                panic!("{name} not scheduled");
            };
            placed.push(p.node.clone());
            engine.assume(&p);
        }
        placed.sort();
        assert_eq!(placed, ["n1", "n2"], "one replica per node");
        let third = engine.schedule(&ObjectKey::new("default", "web-2"));
        assert_eq!(
            third.message(),
            Some("0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules.")
        );
    }

    #[test]
    fn a_bound_pods_anti_affinity_keeps_matching_pods_off_its_node() {
        let db = pod("db")
            .label("app", "db")
            .on("n1")
            .away_from(app("web", HOSTNAME));
        let mut engine = engine(
            vec![node("n1", None), node("n2", None)],
            vec![db, pod("web").label("app", "web")],
        );
        let e = evaluate(&mut engine, "web");
        assert_eq!(unfit(&e, "n1"), REASON_EXISTING_ANTI_AFFINITY);
        assert_eq!(e.feasible, ["n2"]);
    }

    #[test]
    fn anti_affinity_by_zone_rules_out_the_whole_zone() {
        let nodes = vec![
            node("a1", Some("a")),
            node("a2", Some("a")),
            node("b1", Some("b")),
            node("plain", None),
        ];
        let pods = vec![
            pod("web-0").label("app", "web").on("a1"),
            pod("web-1").label("app", "web").away_from(app("web", ZONE)),
        ];
        let e = evaluate(&mut engine(nodes, pods), "web-1");
        assert_eq!(unfit(&e, "a1"), REASON_ANTI_AFFINITY);
        assert_eq!(unfit(&e, "a2"), REASON_ANTI_AFFINITY);
        assert_eq!(e.feasible, ["b1", "plain"], "no zone label: no conflict");
    }

    #[test]
    fn affinity_to_a_zone_needs_a_matching_pod_in_that_zone() {
        let nodes = vec![
            node("a1", Some("a")),
            node("a2", Some("a")),
            node("b1", Some("b")),
            node("plain", None),
        ];
        let pods = vec![
            pod("db").label("app", "db").on("a1"),
            pod("api").with(app("db", ZONE)),
        ];
        let e = evaluate(&mut engine(nodes, pods), "api");
        assert_eq!(e.feasible, ["a1", "a2"]);
        assert_eq!(unfit(&e, "b1"), REASON_AFFINITY);
        assert_eq!(unfit(&e, "plain"), REASON_AFFINITY);
    }

    #[test]
    fn the_first_pod_of_a_group_that_wants_itself_fits_where_the_topology_key_is() {
        let nodes = vec![node("a1", Some("a")), node("plain", None)];
        let pods = vec![
            pod("cache-0")
                .label("app", "cache")
                .with(app("cache", ZONE)),
        ];
        let e = evaluate(&mut engine(nodes, pods), "cache-0");
        assert_eq!(e.feasible, ["a1"]);
        assert_eq!(unfit(&e, "plain"), REASON_AFFINITY);
    }

    #[test]
    fn once_one_of_the_group_is_placed_the_others_follow_it() {
        let nodes = vec![node("a1", Some("a")), node("b1", Some("b"))];
        let pods = vec![
            pod("cache-0").label("app", "cache").on("b1"),
            pod("cache-1")
                .label("app", "cache")
                .with(app("cache", ZONE)),
        ];
        let e = evaluate(&mut engine(nodes, pods), "cache-1");
        assert_eq!(e.feasible, ["b1"]);
        assert_eq!(unfit(&e, "a1"), REASON_AFFINITY);
    }

    #[test]
    fn a_pod_that_does_not_match_its_own_affinity_waits_for_a_match() {
        let nodes = vec![node("a1", Some("a"))];
        let pods = vec![pod("api").label("app", "api").with(app("db", ZONE))];
        let e = evaluate(&mut engine(nodes, pods), "api");
        assert!(e.feasible.is_empty());
        assert_eq!(unfit(&e, "a1"), REASON_AFFINITY);
    }

    #[test]
    fn terms_look_in_the_pods_own_namespace_unless_told_otherwise() {
        let nodes = vec![node("n1", None), node("n2", None)];
        let other = pod("web-other")
            .namespace("team-b")
            .label("app", "web")
            .on("n1");
        let pods = vec![other, web("web").namespace("team-a")];
        let e = evaluate_in(&mut engine(nodes.clone(), pods), "team-a", "web");
        assert_eq!(e.feasible, ["n1", "n2"], "team-b's pod is not looked at");

        let everywhere = json!({"topologyKey": HOSTNAME, "namespaceSelector": {},
            "labelSelector": {"matchLabels": {"app": "web"}}});
        let other = pod("web-other")
            .namespace("team-b")
            .label("app", "web")
            .on("n1");
        let web = pod("web")
            .namespace("team-a")
            .label("app", "web")
            .away_from(everywhere);
        let e = evaluate_in(&mut engine(nodes, vec![other, web]), "team-a", "web");
        assert_eq!(
            e.feasible,
            ["n2"],
            "an empty namespaceSelector is every namespace"
        );
    }

    #[test]
    fn a_namespace_selector_picks_namespaces_by_their_labels() {
        let nodes = vec![node("n1", None), node("n2", None), node("n3", None)];
        let namespaces = vec![
            namespace("prod-a", json!({"env": "prod"})),
            namespace("prod-b", json!({"env": "prod"})),
            namespace("dev", json!({"env": "dev"})),
        ];
        let term = json!({"topologyKey": HOSTNAME,
            "namespaceSelector": {"matchLabels": {"env": "prod"}},
            "labelSelector": {"matchLabels": {"app": "web"}}});
        let pods = vec![
            pod("a").namespace("prod-b").label("app", "web").on("n1"),
            pod("b").namespace("dev").label("app", "web").on("n2"),
            pod("web")
                .namespace("prod-a")
                .label("app", "web")
                .away_from(term),
        ];
        let mut engine = engine_with(Args::default(), nodes, namespaces, pods);
        let e = evaluate_in(&mut engine, "prod-a", "web");
        assert_eq!(unfit(&e, "n1"), REASON_ANTI_AFFINITY);
        assert_eq!(e.feasible, ["n2", "n3"]);
    }

    #[test]
    fn a_bound_pods_namespace_selector_reads_the_incoming_pods_namespace_labels() {
        let nodes = vec![node("n1", None), node("n2", None)];
        let namespaces = vec![namespace("shared", json!({"tenant": "shared"}))];
        let term = json!({"topologyKey": HOSTNAME,
            "namespaceSelector": {"matchLabels": {"tenant": "shared"}},
            "labelSelector": {"matchLabels": {"app": "noisy"}}});
        let pods = vec![
            pod("quiet").label("app", "quiet").on("n1").away_from(term),
            pod("noisy").namespace("shared").label("app", "noisy"),
        ];
        let mut engine = engine_with(Args::default(), nodes, namespaces, pods);
        let e = evaluate_in(&mut engine, "shared", "noisy");
        assert_eq!(unfit(&e, "n1"), REASON_EXISTING_ANTI_AFFINITY);
        assert_eq!(e.feasible, ["n2"]);
    }

    #[test]
    fn match_label_keys_keep_each_rollout_apart_from_itself_only() {
        let nodes = vec![node("n1", None), node("n2", None)];
        let same_rev = json!({"topologyKey": HOSTNAME, "matchLabelKeys": ["rev"],
            "labelSelector": {"matchLabels": {"app": "web"}}});
        let pods = vec![
            pod("old").label("app", "web").label("rev", "1").on("n1"),
            pod("new-0").label("app", "web").label("rev", "2").on("n2"),
            pod("new-1")
                .label("app", "web")
                .label("rev", "2")
                .away_from(same_rev),
        ];
        let e = evaluate(&mut engine(nodes, pods), "new-1");
        assert_eq!(e.feasible, ["n1"], "only rev 2 pods are kept away from");
        assert_eq!(unfit(&e, "n2"), REASON_ANTI_AFFINITY);
    }

    #[test]
    fn label_keys_merge_as_the_api_server_merges_them_and_only_once() {
        let labels = BTreeMap::from([
            ("app".to_string(), "web".to_string()),
            ("rev".to_string(), "2".to_string()),
            ("team".to_string(), "a".to_string()),
        ]);
        let term: PodAffinityTerm = serde_json::from_value(json!({"topologyKey": HOSTNAME,
            "matchLabelKeys": ["rev", "missing"], "mismatchLabelKeys": ["team"],
            "labelSelector": {"matchLabels": {"app": "web"}}}))
        .unwrap();
        let merged = label_selector_of(&term, &labels).unwrap();
        let expressions = serde_json::to_value(&merged.match_expressions).unwrap();
        assert_eq!(
            expressions,
            json!([{"key": "rev", "operator": "In", "values": ["2"]},
                   {"key": "team", "operator": "NotIn", "values": ["a"]}])
        );
        let from_api_server = PodAffinityTerm {
            label_selector: Some(merged.clone()),
            ..term.clone()
        };
        assert_eq!(
            label_selector_of(&from_api_server, &labels),
            Some(merged),
            "a merged term stays as it is"
        );
        let no_selector = PodAffinityTerm {
            label_selector: None,
            ..term
        };
        assert_eq!(label_selector_of(&no_selector, &labels), None);
    }

    #[test]
    fn pods_being_deleted_still_count() {
        let nodes = vec![node("n1", None), node("n2", None)];
        let pods = vec![
            pod("web-0").label("app", "web").on("n1").deleting(),
            web("web-1"),
        ];
        let e = evaluate(&mut engine(nodes, pods), "web-1");
        assert_eq!(e.feasible, ["n2"]);
    }

    #[test]
    fn an_invalid_selector_makes_the_pod_unschedulable_with_the_cause() {
        let bad = json!({"topologyKey": HOSTNAME,
            "labelSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}});
        let mut engine = engine(vec![node("n1", None)], vec![pod("p").away_from(bad)]);
        let decision = engine.schedule(&ObjectKey::new("default", "p"));
        let message = decision.message().unwrap();
        assert!(
            message.starts_with(
                "0/1 nodes are available: parsing pod: requiredAntiAffinityTerms: values:"
            ),
            "{message}"
        );
    }

    #[test]
    fn preferred_affinity_scores_the_node_with_the_matching_pod_highest() {
        let nodes = vec![node("n1", None), node("n2", None), node("n3", None)];
        let pods = vec![
            pod("cache").label("app", "cache").on("n2"),
            pod("web").prefers_with(10, app("cache", HOSTNAME)),
        ];
        let e = evaluate(&mut engine(nodes, pods), "web");
        assert_eq!(scores(&e), Some(vec![("n1", 0), ("n2", 200), ("n3", 0)]));
    }

    #[test]
    fn preferred_anti_affinity_scores_between_the_least_and_the_most_wanted() {
        let nodes = vec![node("n1", None), node("n2", None), node("n3", None)];
        let pods = vec![
            pod("batch-0").label("app", "batch").on("n1"),
            pod("batch-1").label("app", "batch").on("n1"),
            pod("batch-2").label("app", "batch").on("n2"),
            pod("web").prefers_away_from(5, app("batch", HOSTNAME)),
        ];
        let e = evaluate(&mut engine(nodes, pods), "web");
        // Raw -10, -5, 0: normalised 0, 50, 100, times the weight 2.
        assert_eq!(scores(&e), Some(vec![("n1", 0), ("n2", 100), ("n3", 200)]));
    }

    #[test]
    fn a_bound_pods_required_affinity_draws_the_pods_it_wants_at_the_hard_weight() {
        let nodes = vec![node("n1", None), node("n2", None)];
        let pods = || {
            vec![
                pod("client")
                    .label("app", "client")
                    .on("n1")
                    .with(app("web", HOSTNAME)),
                pod("web").label("app", "web"),
            ]
        };
        let e = evaluate(&mut engine(nodes.clone(), pods()), "web");
        assert_eq!(scores(&e), Some(vec![("n1", 200), ("n2", 0)]));

        let args = Args {
            hard_pod_affinity_weight: 0,
            ..Args::default()
        };
        let e = evaluate(&mut engine_with(args, nodes, Vec::new(), pods()), "web");
        assert_eq!(scores(&e), None, "nothing to score: the plugin skips");
    }

    #[test]
    fn bound_pods_preferred_terms_count_unless_the_args_say_to_ignore_them() {
        let nodes = vec![node("n1", None), node("n2", None)];
        let pods = || {
            vec![
                pod("client")
                    .label("app", "client")
                    .on("n2")
                    .prefers_with(30, app("web", HOSTNAME))
                    .prefers_away_from(50, app("web", HOSTNAME)),
                pod("web").label("app", "web"),
            ]
        };
        let e = evaluate(&mut engine(nodes.clone(), pods()), "web");
        assert_eq!(scores(&e), Some(vec![("n1", 200), ("n2", 0)]));

        let args = Args {
            ignore_preferred_terms_of_existing_pods: true,
            ..Args::default()
        };
        let e = evaluate(&mut engine_with(args, nodes, Vec::new(), pods()), "web");
        assert_eq!(scores(&e), None);
    }

    #[test]
    fn equal_scores_everywhere_normalise_to_zero() {
        let nodes = vec![node("a1", Some("a")), node("a2", Some("a"))];
        let pods = vec![
            pod("cache").label("app", "cache").on("a1"),
            pod("web").prefers_with(10, app("cache", ZONE)),
        ];
        let e = evaluate(&mut engine(nodes, pods), "web");
        assert_eq!(scores(&e), Some(vec![("a1", 0), ("a2", 0)]));
    }
}
