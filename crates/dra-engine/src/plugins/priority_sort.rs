//! PrioritySort: pods with a higher `spec.priority` are tried first; among equals, the one
//! that has waited longer (the caller's order breaks the tie).

use k8s_openapi::api::core::v1::Pod;

use crate::framework::{Cycle, Nothing, Plugin, PluginCycle, Point};

pub struct PrioritySort;

pub fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

impl Plugin for PrioritySort {
    fn name(&self) -> &'static str {
        "PrioritySort"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::QueueSort]
    }

    fn cycle<'a>(&'a self, _cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(Nothing)
    }

    fn less(&self, a: &Pod, b: &Pod) -> bool {
        priority(a) > priority(b)
    }
}
