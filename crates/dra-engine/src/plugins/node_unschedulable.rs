//! NodeUnschedulable: a cordoned node (`spec.unschedulable`) takes only pods that tolerate
//! the `node.kubernetes.io/unschedulable:NoSchedule` taint.

use k8s_openapi::api::core::v1::Taint;

use super::taint_toleration::{tolerates, tolerations};
use crate::framework::{Cycle, Plugin, PluginCycle, Point, Status};
use crate::state::NodeInfo;

pub struct NodeUnschedulable;

pub const REASON: &str = "node(s) were unschedulable";

struct Unschedulable {
    tolerated: bool,
}

impl Plugin for NodeUnschedulable {
    fn name(&self) -> &'static str {
        "NodeUnschedulable"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::Filter]
    }

    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        let taint = Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        let tolerated = tolerations(cycle.pod).iter().any(|t| tolerates(t, &taint));
        Box::new(Unschedulable { tolerated })
    }
}

impl PluginCycle for Unschedulable {
    fn pre_filter(&mut self) -> Status {
        Status::success()
    }

    fn filter(&self, node: &NodeInfo) -> Status {
        let cordoned = node.node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
        if cordoned && !self.tolerated {
            Status::unresolvable(REASON)
        } else {
            Status::success()
        }
    }
}
