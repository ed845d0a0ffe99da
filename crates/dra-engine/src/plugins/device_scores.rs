//! This scheduler's own device scores, for pods with claims (not in kube-scheduler):
//! - NUMAAlignment: nodes where the devices found break fewer whole free NUMA domains
//!   score higher (keep whole domains for pods that need them);
//! - DevicePacking: nodes left with fewer free devices score higher (pack devices, keep
//!   whole nodes free).
//!
//! Both read what DynamicResources found on each node; nodes where it allocated nothing
//! score 0, and pods without claims are not scored at all.

use dra_allocator::Quality;

use crate::framework::{Cycle, Plugin, PluginCycle, Point, Status, default_normalize_score};
use crate::state::NodeInfo;

pub struct NumaAlignment;
pub struct DevicePacking;

/// The score of one criterion: lower `cost` is better.
struct DeviceScore<'a> {
    cycle: &'a Cycle<'a>,
    cost: fn(&Quality) -> i64,
}

impl PluginCycle for DeviceScore<'_> {
    fn pre_score(&mut self, feasible: &[&NodeInfo]) -> Status {
        let any = feasible
            .iter()
            .any(|n| self.cycle.shared.read_quality(n, |_| ()).is_some());
        if any {
            Status::success()
        } else {
            Status::skip()
        }
    }

    fn score(&self, node: &NodeInfo) -> Result<i64, Status> {
        Ok(self.cycle.shared.read_quality(node, self.cost).unwrap_or(0))
    }

    /// Lowest cost gets 100; scores are cost relative to the highest, reversed.
    fn normalize_score(&self, scores: &mut [i64]) {
        default_normalize_score(scores, true);
    }
}

impl Plugin for NumaAlignment {
    fn name(&self) -> &'static str {
        "NUMAAlignment"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::Score]
    }

    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(DeviceScore {
            cycle,
            cost: |q| q.numa_domains_broken as i64,
        })
    }
}

impl Plugin for DevicePacking {
    fn name(&self) -> &'static str {
        "DevicePacking"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::Score]
    }

    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(DeviceScore {
            cycle,
            cost: |q| q.free_devices_after as i64,
        })
    }
}
