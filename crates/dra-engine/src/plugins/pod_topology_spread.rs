//! PodTopologySpread (being written).

use crate::framework::{Cycle, Plugin, PluginCycle, Point, Status};

/// `PodTopologySpreadArgs`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Args {}

pub struct PodTopologySpread;

impl PodTopologySpread {
    pub fn new(_args: &Args) -> Self {
        PodTopologySpread
    }
}

struct Guard<'a>(&'a Cycle<'a>);

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
        Box::new(Guard(cycle))
    }
}

impl PluginCycle for Guard<'_> {
    fn pre_filter(&mut self) -> Status {
        super::guard::reject_pod_topology_spread(self.0.pod)
    }
}
