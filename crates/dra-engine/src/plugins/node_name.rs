//! NodeName: a pod with `spec.nodeName` fits only the node of that name.

use crate::framework::{Cycle, Plugin, PluginCycle, Point, Status};
use crate::state::NodeInfo;

pub struct NodeName;

pub const REASON: &str = "node(s) didn't match the requested node name";

struct NodeNameCycle<'a>(Option<&'a str>);

impl Plugin for NodeName {
    fn name(&self) -> &'static str {
        "NodeName"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::Filter]
    }

    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        let wanted = cycle.pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        Box::new(NodeNameCycle(wanted.filter(|n| !n.is_empty())))
    }
}

impl PluginCycle for NodeNameCycle<'_> {
    fn pre_filter(&mut self) -> Status {
        Status::success()
    }

    fn filter(&self, node: &NodeInfo) -> Status {
        match self.0 {
            Some(name) if name != node.name() => Status::unresolvable(REASON),
            _ => Status::success(),
        }
    }
}
