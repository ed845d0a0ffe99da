//! NodeResourcesBalancedAllocation (being written).

use crate::framework::{Cycle, Plugin, PluginCycle, Point, Status};

/// `NodeResourcesBalancedAllocationArgs`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Args {}

pub struct BalancedAllocation;

impl BalancedAllocation {
    pub fn new(_args: &Args) -> Self {
        BalancedAllocation
    }
}

struct Guard<'a>(&'a Cycle<'a>);

impl Plugin for BalancedAllocation {
    fn name(&self) -> &'static str {
        "NodeResourcesBalancedAllocation"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::PreScore, Point::Score]
    }

    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(Guard(cycle))
    }
}

impl PluginCycle for Guard<'_> {
    fn pre_filter(&mut self) -> Status {
        super::guard::reject_node_resources_balanced_allocation(self.0.pod)
    }
}
