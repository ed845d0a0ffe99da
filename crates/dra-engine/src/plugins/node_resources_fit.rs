//! NodeResourcesFit: the pod's requests must fit in what the node has left (Filter); nodes
//! are ranked by a scoring strategy over their requested resources (Score).

use crate::framework::{Cycle, Plugin, PluginCycle, Point, Status};
use crate::resources::ResourceList;
use crate::state::NodeInfo;

/// How nodes are scored (`scoringStrategy.type`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Strategy {
    LeastAllocated,
    MostAllocated,
    /// Points (utilisation 0..=100, score 0..=10) of the shape, in order.
    RequestedToCapacityRatio(Vec<(i64, i64)>),
}

/// `NodeResourcesFitArgs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Args {
    pub strategy: Strategy,
    /// Resources the score looks at, with weights (`scoringStrategy.resources`).
    pub resources: Vec<(String, i64)>,
    /// Resources the filter does not check (`ignoredResources`).
    pub ignored_resources: Vec<String>,
    /// Resource groups (the part before `/`) the filter does not check.
    pub ignored_resource_groups: Vec<String>,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            strategy: Strategy::LeastAllocated,
            resources: vec![("cpu".into(), 1), ("memory".into(), 1)],
            ignored_resources: Vec::new(),
            ignored_resource_groups: Vec::new(),
        }
    }
}

pub struct NodeResourcesFit {
    args: Args,
}

impl NodeResourcesFit {
    pub fn new(args: &Args) -> Self {
        NodeResourcesFit { args: args.clone() }
    }

    fn ignored(&self, resource: &str) -> bool {
        self.args.ignored_resources.iter().any(|r| r == resource)
            || resource.split_once('/').is_some_and(|(group, _)| {
                self.args.ignored_resource_groups.iter().any(|g| g == group)
            })
    }
}

struct FitCycle<'a> {
    plugin: &'a NodeResourcesFit,
    cycle: &'a Cycle<'a>,
}

impl Plugin for NodeResourcesFit {
    fn name(&self) -> &'static str {
        "NodeResourcesFit"
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
        Box::new(FitCycle {
            plugin: self,
            cycle,
        })
    }
}

impl PluginCycle for FitCycle<'_> {
    fn pre_filter(&mut self) -> Status {
        Status::success()
    }

    fn filter(&self, node: &NodeInfo) -> Status {
        match self.insufficient(self.cycle.requests, node) {
            reasons if reasons.is_empty() => Status::success(),
            reasons => Status::new(crate::framework::Code::Unschedulable, reasons),
        }
    }
}

impl FitCycle<'_> {
    /// What does not fit, one reason per resource ("Too many pods", "Insufficient cpu").
    /// Extended resources the node has no capacity for but a DeviceClass serves go to
    /// DynamicResources instead.
    fn insufficient(&self, requests: &ResourceList, node: &NodeInfo) -> Vec<String> {
        let mut reasons = Vec::new();
        let max_pods = node
            .allocatable
            .0
            .get("pods")
            .map(|q| q.value().unwrap_or(i64::MAX) as i128)
            .unwrap_or(0);
        if node.pods as i128 + 1 > max_pods {
            reasons.push("Too many pods".to_string());
        }
        for (name, want) in &requests.0 {
            if want.is_zero() || name == "pods" || self.plugin.ignored(name) {
                continue;
            }
            let have = node.allocatable.0.get(name);
            if have.is_none() && self.cycle.served_by_devices(name) {
                continue;
            }
            let free = have.copied().unwrap_or_default() - node.used.get(name);
            if *want > free {
                reasons.push(format!("Insufficient {name}"));
            }
        }
        reasons
    }
}
