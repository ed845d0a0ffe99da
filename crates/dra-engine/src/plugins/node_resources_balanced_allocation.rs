//! NodeResourcesBalancedAllocation: prefer the node on which placing the pod brings the
//! fractions of its resources in use closer together (or moves them apart the least).
//!
//! As kube-scheduler v1.37: the fractions are what the node's pods request (no non-zero
//! defaults) plus what the pod requests (pod-level `spec.resources` included), each capped
//! at 1, over the node's allocatable; resources the node has none of, and scalar resources
//! the pod does not ask for, are left out. Balance is 1 minus the standard deviation of the
//! fractions. The score is 50 plus half of (50 + balance with the pod − balance without),
//! so that a pod that improves a node's balance scores higher than one that spoils it.
//! A pod that requests none of the resources is not scored (PreScore skips). The
//! resources' weights are accepted and, as upstream, not used.
//!
//! Difference from upstream: a DRA extended resource in `resources` that the node has no
//! allocatable for is left out of the node's score (see NodeResourcesFit).

use crate::framework::{Cycle, MAX_NODE_SCORE, Plugin, PluginCycle, Point, Status};
use crate::state::NodeInfo;

use smallvec::SmallVec;

use super::node_resources_fit::{Counting, Units, allocation, default_resources};

/// `NodeResourcesBalancedAllocationArgs`.
#[derive(Clone, Debug, PartialEq)]
pub struct Args {
    /// The resources to balance, with weights (`resources`; default cpu and memory).
    pub resources: Vec<(String, i64)>,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            resources: default_resources(),
        }
    }
}

pub struct BalancedAllocation {
    resources: Vec<(String, i64)>,
}

impl BalancedAllocation {
    pub fn new(args: &Args) -> Self {
        BalancedAllocation {
            resources: args.resources.clone(),
        }
    }
}

struct BalanceCycle<'a> {
    plugin: &'a BalancedAllocation,
    cycle: &'a Cycle<'a>,
    /// The pod's requests of the balanced resources, in units.
    pod: Vec<i64>,
}

impl Plugin for BalancedAllocation {
    fn name(&self) -> &'static str {
        "NodeResourcesBalancedAllocation"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::PreScore, Point::Score]
    }

    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(BalanceCycle {
            plugin: self,
            cycle,
            pod: Vec::new(),
        })
    }
}

impl PluginCycle for BalanceCycle<'_> {
    fn pre_score(&mut self, _feasible: &[&NodeInfo]) -> Status {
        let requests = Units::of(self.cycle.requests);
        self.pod = self
            .plugin
            .resources
            .iter()
            .map(|(name, _)| requests.get(name))
            .collect();
        if self.pod.iter().all(|r| *r == 0) {
            return Status::skip();
        }
        Status::success()
    }

    fn score(&self, node: &NodeInfo) -> Result<i64, Status> {
        if self.plugin.resources.is_empty() {
            return Err(Status::error("resources not found"));
        }
        let a = allocation(&self.plugin.resources, &self.pod, node, Counting::Requested);
        let with_pod = balance(&a.requested, &a.allocatable);
        let without_pod = balance(&a.allocated, &a.allocatable);
        Ok(MAX_NODE_SCORE / 2 + (MAX_NODE_SCORE / 2 + with_pod - without_pod) / 2)
    }
}

/// (1 − the standard deviation of the fractions requested/allocatable) × 100, truncated;
/// resources with no allocatable are left out, fractions are capped at 1.
fn balance(requested: &[i64], allocatable: &[i64]) -> i64 {
    let fractions: SmallVec<[f64; 4]> = requested
        .iter()
        .zip(allocatable)
        .filter(|(_, capacity)| **capacity != 0)
        .map(|(r, c)| (*r as f64 / *c as f64).min(1.0))
        .collect();
    let std = match fractions.len() {
        0 | 1 => 0.0,
        2 => ((fractions[0] - fractions[1]) / 2.0).abs(),
        n => {
            let mean = fractions.iter().sum::<f64>() / n as f64;
            let sum: f64 = fractions.iter().map(|f| (f - mean) * (f - mean)).sum();
            (sum / n as f64).sqrt()
        }
    };
    ((1.0 - std) * MAX_NODE_SCORE as f64) as i64
}

#[cfg(test)]
mod tests {
    use super::super::node_resources_fit::scenario::*;
    use crate::framework::PluginArgs;

    const PLUGIN: &str = "NodeResourcesBalancedAllocation";

    #[test]
    fn a_memory_heavy_pod_goes_where_cpu_is_used_more() {
        let e = evaluate(
            profile(&[PLUGIN], PluginArgs::default()),
            vec![node("cpu-busy").build(), node("memory-busy").build()],
            vec![
                pod("compute")
                    .container(&[("cpu", "2"), ("memory", "1Gi")])
                    .on("cpu-busy")
                    .build(),
                pod("cache")
                    .container(&[("cpu", "500m"), ("memory", "4Gi")])
                    .on("memory-busy")
                    .build(),
                pod("new")
                    .container(&[("cpu", "500m"), ("memory", "3Gi")])
                    .build(),
            ],
            "new",
        );
        // cpu-busy: balance 81 before (0.5 vs 0.125), 93 after (0.625 vs 0.5): 50 + 62/2.
        // memory-busy: 81 before (0.125 vs 0.5), 68 after (0.25 vs 0.875): 50 + 37/2.
        assert_eq!(
            scores(&e, PLUGIN),
            [("cpu-busy".into(), 81), ("memory-busy".into(), 68)]
        );
    }

    #[test]
    fn pods_without_requests_do_not_unbalance_a_node() {
        let mut pods: Vec<_> = (0..10)
            .map(|i| pod(&format!("idle-{i}")).container(&[]).on("n1").build())
            .collect();
        pods.push(
            pod("new")
                .container(&[("cpu", "1"), ("memory", "1Gi")])
                .build(),
        );
        let e = evaluate(
            profile(&[PLUGIN], PluginArgs::default()),
            vec![node("n1").build(), node("n2").build()],
            pods,
            "new",
        );
        let s = scores(&e, PLUGIN);
        assert_eq!(s[0].1, s[1].1, "{s:?}");
    }

    #[test]
    fn a_pod_that_requests_nothing_is_not_scored() {
        let e = evaluate(
            profile(&[PLUGIN], PluginArgs::default()),
            vec![node("n1").build(), node("n2").build()],
            vec![pod("new").container(&[]).build()],
            "new",
        );
        assert_eq!(e.feasible.len(), 2);
        assert!(!e.plugin_scores.contains_key(PLUGIN), "{e:?}");
    }

    #[test]
    fn three_resources_use_the_standard_deviation() {
        let args = PluginArgs {
            balanced_allocation: super::Args {
                resources: vec![
                    ("cpu".into(), 1),
                    ("memory".into(), 1),
                    ("example.com/foo".into(), 1),
                ],
            },
            ..PluginArgs::default()
        };
        let e = evaluate(
            profile(&[PLUGIN], args),
            vec![
                node("n1").allocatable("example.com/foo", "4").build(),
                node("n2").build(),
            ],
            vec![
                pod("new")
                    .container(&[("cpu", "2"), ("memory", "2Gi"), ("example.com/foo", "4")])
                    .build(),
            ],
            "new",
        );
        // n1: fractions 0.5, 0.25, 1 → std 0.3118 → 68 with the pod, 100 without: 50 + 18/2.
        // n2 has no foo: 0.5 vs 0.25 → 87 with the pod: 50 + 37/2.
        assert_eq!(scores(&e, PLUGIN), [("n1".into(), 59), ("n2".into(), 68)]);
    }
}
