//! NodeAffinity: `spec.nodeSelector` and required node affinity must match the node
//! (Filter); preferred node affinity terms add their weight to the nodes they match (Score).
//! The node selector matching here also serves claims' and volumes' node selectors.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, PreferredSchedulingTerm,
};

use crate::framework::{Cycle, Plugin, PluginCycle, Point, Status, default_normalize_score};
use crate::state::NodeInfo;

pub struct NodeAffinity;

pub const REASON: &str = "node(s) didn't match Pod's node affinity/selector";
pub const REASON_CONFLICT: &str = "pod affinity terms conflict";

struct AffinityCycle<'a> {
    node_selector: Option<&'a BTreeMap<String, String>>,
    required: Option<&'a [NodeSelectorTerm]>,
    preferred: &'a [PreferredSchedulingTerm],
}

impl Plugin for NodeAffinity {
    fn name(&self) -> &'static str {
        "NodeAffinity"
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
        let spec = cycle.pod.spec.as_ref();
        let affinity = spec
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref());
        Box::new(AffinityCycle {
            node_selector: spec.and_then(|s| s.node_selector.as_ref()),
            required: affinity
                .and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .map(|r| r.node_selector_terms.as_slice()),
            preferred: affinity
                .and_then(|a| {
                    a.preferred_during_scheduling_ignored_during_execution
                        .as_deref()
                })
                .unwrap_or_default(),
        })
    }
}

impl PluginCycle for AffinityCycle<'_> {
    fn pre_filter(&mut self) -> Status {
        if self.node_selector.is_none() && self.required.is_none() {
            return Status::skip();
        }
        if let Some(terms) = self.required
            && names_conflict(terms)
        {
            return Status::unresolvable(REASON_CONFLICT);
        }
        Status::success()
    }

    fn filter(&self, node: &NodeInfo) -> Status {
        let labels = node.node.metadata.labels.as_ref();
        let selector_matches = self.node_selector.is_none_or(|selector| {
            selector
                .iter()
                .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        });
        let affinity_matches = self
            .required
            .is_none_or(|terms| node_selector_terms_match(terms, &node.node));
        if selector_matches && affinity_matches {
            Status::success()
        } else {
            Status::unresolvable(REASON)
        }
    }

    fn pre_score(&mut self, _feasible: &[&NodeInfo]) -> Status {
        if self.preferred.is_empty() {
            Status::skip()
        } else {
            Status::success()
        }
    }

    fn score(&self, node: &NodeInfo) -> Result<i64, Status> {
        Ok(self
            .preferred
            .iter()
            .filter(|t| t.weight != 0 && term_matches(&t.preference, &node.node))
            .map(|t| i64::from(t.weight))
            .sum())
    }

    fn normalize_score(&self, scores: &mut [i64]) {
        default_normalize_score(scores, false);
    }
}

/// Every term names nodes by `metadata.name In`, and no name is left in any of them.
fn names_conflict(terms: &[NodeSelectorTerm]) -> bool {
    let mut any_names = false;
    for term in terms {
        let mut names: Option<Vec<&String>> = None;
        for r in term.match_fields.iter().flatten() {
            if r.key == "metadata.name" && r.operator == "In" {
                let values: Vec<&String> = r.values.iter().flatten().collect();
                names = Some(match names {
                    None => values,
                    Some(n) => n.into_iter().filter(|v| values.contains(v)).collect(),
                });
            }
        }
        match names {
            None => return false,
            Some(n) if !n.is_empty() => any_names = true,
            Some(_) => {}
        }
    }
    !terms.is_empty() && !any_names
}

/// Terms are ORed; an empty list matches nothing (as for a NodeSelector).
pub fn node_selector_terms_match(terms: &[NodeSelectorTerm], node: &Node) -> bool {
    terms.iter().any(|term| term_matches(term, node))
}

/// A term's requirements are ANDed; a term with none matches nothing.
pub fn term_matches(term: &NodeSelectorTerm, node: &Node) -> bool {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let fields = BTreeMap::from([(
        "metadata.name".to_string(),
        node.metadata.name.clone().unwrap_or_default(),
    )]);
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let field_exprs = term.match_fields.as_deref().unwrap_or_default();
    (!exprs.is_empty() || !field_exprs.is_empty())
        && exprs.iter().all(|r| requirement_matches(r, labels))
        && field_exprs.iter().all(|r| requirement_matches(r, &fields))
}

pub fn requirement_matches(
    req: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> bool {
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
