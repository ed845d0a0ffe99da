//! VolumeRestrictions (being written).

use crate::framework::{Cycle, Plugin, PluginCycle, Point, Status};

pub struct VolumeRestrictions;

struct Guard<'a>(&'a Cycle<'a>);

impl Plugin for VolumeRestrictions {
    fn name(&self) -> &'static str {
        "VolumeRestrictions"
    }

    fn points(&self) -> &'static [Point] {
        super::points_of("VolumeRestrictions").unwrap_or_default()
    }

    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(Guard(cycle))
    }
}

impl PluginCycle for Guard<'_> {
    fn pre_filter(&mut self) -> Status {
        super::guard::reject_volumes(self.0.pod)
    }
}
