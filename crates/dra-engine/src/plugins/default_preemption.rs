//! DefaultPreemption: when a pod fits on no node, evict pods of lower priority so that it
//! fits. The search is [`crate::Engine::preempt`] (`crate::preemption`); this plugin is its
//! place in the profile: a profile that disables DefaultPreemption at `postFilter` turns
//! preemption off, as in kube-scheduler.

use crate::framework::{Cycle, Nothing, Plugin, PluginCycle, Point};

pub struct DefaultPreemption;

impl Plugin for DefaultPreemption {
    fn name(&self) -> &'static str {
        "DefaultPreemption"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::PostFilter]
    }

    fn cycle<'a>(&'a self, _cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(Nothing)
    }
}
