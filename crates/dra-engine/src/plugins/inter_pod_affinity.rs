//! InterPodAffinity (being written).

use crate::framework::{Cycle, Plugin, PluginCycle, Point, Status};

/// `InterPodAffinityArgs`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Args {}

pub struct InterPodAffinity;

impl InterPodAffinity {
    pub fn new(_args: &Args) -> Self {
        InterPodAffinity
    }
}

struct Guard<'a>(&'a Cycle<'a>);

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
        Box::new(Guard(cycle))
    }
}

impl PluginCycle for Guard<'_> {
    fn pre_filter(&mut self) -> Status {
        super::guard::reject_inter_pod_affinity(self.0.pod)
    }
}
