//! SchedulingGates: a pod with `spec.schedulingGates` is not tried until they are all removed.

use k8s_openapi::api::core::v1::Pod;

use crate::framework::{Code, Cycle, Nothing, Plugin, PluginCycle, Point, Status};
use crate::state::ClusterState;

pub struct SchedulingGates;

impl Plugin for SchedulingGates {
    fn name(&self) -> &'static str {
        "SchedulingGates"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::PreEnqueue]
    }

    fn cycle<'a>(&'a self, _cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(Nothing)
    }

    fn pre_enqueue(&self, pod: &Pod, _state: &ClusterState) -> Status {
        let gates: Vec<&str> = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.as_ref())
            .into_iter()
            .flatten()
            .map(|g| g.name.as_str())
            .collect();
        if gates.is_empty() {
            return Status::success();
        }
        Status::new(
            Code::UnschedulableAndUnresolvable,
            vec![format!(
                "waiting for scheduling gates: [{}]",
                gates.join(" ")
            )],
        )
    }
}
