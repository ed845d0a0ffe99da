//! ImageLocality (being written).

use crate::framework::{Cycle, Plugin, PluginCycle, Point, Status};

pub struct ImageLocality;

struct Guard<'a>(&'a Cycle<'a>);

impl Plugin for ImageLocality {
    fn name(&self) -> &'static str {
        "ImageLocality"
    }

    fn points(&self) -> &'static [Point] {
        super::points_of("ImageLocality").unwrap_or_default()
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
