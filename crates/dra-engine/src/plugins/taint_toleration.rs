//! TaintToleration: a node's NoSchedule and NoExecute taints must be tolerated (Filter);
//! nodes with fewer PreferNoSchedule taints the pod does not tolerate score higher.

use k8s_openapi::api::core::v1::{Pod, Taint, Toleration};

use crate::framework::{
    Cycle, MAX_NODE_SCORE, Plugin, PluginCycle, Point, Status, default_normalize_score,
};
use crate::state::NodeInfo;

pub struct TaintToleration;

pub const REASON: &str = "node(s) had untolerated taint(s)";

pub fn tolerations(pod: &Pod) -> &[Toleration] {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default()
}

/// Whether `toleration` tolerates `taint` (core/v1 `ToleratesTaint`; the Gt and Lt
/// operators are behind a gate that is off in 1.37 and tolerate nothing).
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default()
        }
        "Exists" => true,
        _ => false,
    }
}

fn taints(node: &NodeInfo) -> &[Taint] {
    node.node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

struct TaintCycle<'a> {
    tolerations: &'a [Toleration],
}

impl Plugin for TaintToleration {
    fn name(&self) -> &'static str {
        "TaintToleration"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::Filter, Point::PreScore, Point::Score]
    }

    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(TaintCycle {
            tolerations: tolerations(cycle.pod),
        })
    }
}

impl PluginCycle for TaintCycle<'_> {
    fn pre_filter(&mut self) -> Status {
        Status::success()
    }

    fn filter(&self, node: &NodeInfo) -> Status {
        let untolerated = taints(node).iter().any(|taint| {
            (taint.effect == "NoSchedule" || taint.effect == "NoExecute")
                && !self.tolerations.iter().any(|t| tolerates(t, taint))
        });
        if untolerated {
            Status::unresolvable(REASON)
        } else {
            Status::success()
        }
    }

    fn pre_score(&mut self, _feasible: &[&NodeInfo]) -> Status {
        Status::success()
    }

    /// PreferNoSchedule taints not tolerated by a toleration for that effect (or any).
    fn score(&self, node: &NodeInfo) -> Result<i64, Status> {
        let prefer: Vec<&Toleration> = self
            .tolerations
            .iter()
            .filter(|t| {
                matches!(
                    t.effect.as_deref(),
                    None | Some("") | Some("PreferNoSchedule")
                )
            })
            .collect();
        let count = taints(node)
            .iter()
            .filter(|taint| taint.effect == "PreferNoSchedule")
            .filter(|taint| !prefer.iter().any(|t| tolerates(t, taint)))
            .count();
        Ok(count as i64)
    }

    fn normalize_score(&self, scores: &mut [i64]) {
        default_normalize_score(scores, true);
        debug_assert!(scores.iter().all(|s| *s <= MAX_NODE_SCORE));
    }
}
