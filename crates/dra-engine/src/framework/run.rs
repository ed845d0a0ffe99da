//! Running a profile's plugins over one attempt, as kube-scheduler's framework runtime and
//! its `schedulePod` do.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use rayon::prelude::*;

use super::{Code, Cycle, MAX_NODE_SCORE, Plugin, PluginCycle, Point, PostFilterAction, Status};
use super::{PluginEntry, Profile};
use crate::engine::Placement;
use crate::plugins;
use crate::state::{ClusterState, NodeInfo};

/// A profile's plugins, built once.
pub struct Framework {
    plugins: Vec<(Arc<dyn Plugin>, PluginEntry)>,
}

/// One plugin in one attempt.
struct Slot<'a> {
    entry: &'a PluginEntry,
    cycle: Box<dyn PluginCycle + 'a>,
    /// PreFilter said Skip: its Filter is not run.
    skip_filter: bool,
    /// PreScore said Skip: its Score is not run.
    skip_score: bool,
}

/// How one node fared in Filter.
pub struct NodeOutcome<'a> {
    pub node: &'a NodeInfo,
    pub status: Status,
}

/// The scores of the feasible nodes: total and per plugin (weighted), in node order.
#[derive(Clone, Debug, Default)]
pub struct Scores {
    pub totals: Vec<i64>,
    pub per_plugin: BTreeMap<String, Vec<i64>>,
}

/// One scheduling attempt in progress.
pub struct Attempt<'a> {
    slots: Vec<Slot<'a>>,
}

impl Framework {
    /// Build the profile's plugins. Fails when the profile names a plugin that does not
    /// exist here, with its name.
    pub fn new(profile: &Profile) -> Result<Framework, String> {
        let plugins = profile
            .plugins
            .iter()
            .map(|entry| {
                plugins::build(&entry.name, &profile.args)
                    .map(|p| (p, entry.clone()))
                    .ok_or_else(|| format!("unknown plugin {:?}", entry.name))
            })
            .collect::<Result<_, _>>()?;
        Ok(Framework { plugins })
    }

    fn at(&self, point: Point) -> impl Iterator<Item = &Arc<dyn Plugin>> {
        self.plugins
            .iter()
            .filter(move |(_, e)| e.points.contains(&point))
            .map(|(p, _)| p)
    }

    /// PreEnqueue: the first plugin that keeps the pod waiting, with why.
    pub fn pre_enqueue(&self, pod: &Pod, state: &ClusterState) -> Status {
        for plugin in self.at(Point::PreEnqueue) {
            let status = plugin.pre_enqueue(pod, state);
            if !status.is_success() {
                return status.with_plugin(plugin.name());
            }
        }
        Status::success()
    }

    /// QueueSort: whether `a` goes before `b` (the first QueueSort plugin decides).
    pub fn less(&self, a: &Pod, b: &Pod) -> bool {
        self.at(Point::QueueSort)
            .next()
            .is_some_and(|plugin| plugin.less(a, b))
    }

    /// PostFilter: what the first plugin that can help asks for.
    pub fn post_filter(&self, pod: &Pod, state: &ClusterState) -> Option<PostFilterAction> {
        self.at(Point::PostFilter)
            .find_map(|plugin| plugin.post_filter(pod, state))
    }

    /// Start an attempt: every plugin makes its part of the cycle state.
    pub fn start<'a>(&'a self, cycle: &'a Cycle<'a>) -> Attempt<'a> {
        let slots = self
            .plugins
            .iter()
            .map(|(plugin, entry)| Slot {
                entry,
                cycle: plugin.cycle(cycle),
                skip_filter: !entry.points.contains(&Point::Filter),
                skip_score: !entry.points.contains(&Point::Score),
            })
            .collect();
        Attempt { slots }
    }
}

/// Nodes one thread scores at a time: a score reads what Filter found and costs less than
/// handing the node to another thread. (Filter is not batched: a node whose devices are
/// searched, not remembered, can take long, and small clusters must still search in
/// parallel.)
const SCORE_BATCH: usize = 512;
/// Fewer feasible nodes than this are scored on the attempt's own thread: every plugin's
/// score of them takes less than waking another thread for a share and waiting for it.
const SCORE_ALONE: usize = 2 * SCORE_BATCH;

/// How long one attempt filters nodes on its own thread before it shares the rest out
/// ([`Attempt::filter_nodes`]): a few hundred remembered answers, or one device search.
const ALONE: Duration = Duration::from_millis(1);
/// [`ALONE`] is checked every this many nodes: reading the clock costs about as much as
/// a remembered answer. (A node whose devices are searched for takes longer: at most
/// this many such searches run alone past [`ALONE`].)
const CLOCK_EVERY: usize = 4;

/// Runs `work` on a thread of the pool that filters and scores nodes in parallel, so that
/// every cycle in it shares that work with the pool's other threads directly. Called from
/// outside, each parallel step of a cycle is queued for the pool and waits to be woken:
/// about a fifth of `simulate`'s time at 1,000 nodes. For one caller that runs cycles one
/// after the other (`simulate`); the daemon's lanes must not take a pool thread each.
pub fn in_pool<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| work())
}

impl<'a> Attempt<'a> {
    /// PreFilter, in profile order; the first rejection or error ends the attempt.
    pub fn pre_filter(&mut self) -> Result<(), Status> {
        for slot in &mut self.slots {
            let runs = slot.entry.points.contains(&Point::PreFilter)
                || slot.entry.points.contains(&Point::Filter);
            if !runs {
                continue;
            }
            let status = slot.cycle.pre_filter();
            match status.code {
                Code::Success => {}
                Code::Skip => slot.skip_filter = true,
                _ => return Err(status.with_plugin(plugin_name(slot))),
            }
        }
        Ok(())
    }

    /// Filter one node: the plugins in order, up to the first that says no.
    pub fn filter(&self, node: &NodeInfo) -> Status {
        for slot in self.slots.iter().filter(|s| !s.skip_filter) {
            let status = slot.cycle.filter(node);
            if !status.is_success() {
                return status.with_plugin(plugin_name(slot));
            }
        }
        Status::success()
    }

    /// Filter nodes until `wanted` are feasible or a plugin stops the attempt (an error, or
    /// the device search out of time). Returns the nodes examined, in order: as
    /// kube-scheduler's search with one thread, up to the `wanted`-th feasible node (or
    /// all of the parallel chunk where a plugin stopped).
    ///
    /// The first nodes are filtered on this thread, for about [`ALONE`]: most answers are
    /// remembered ones, a fraction of a microsecond each, and waking other threads for
    /// them costs more than they do (and moves each node's data from core to core). What
    /// is left after that goes to the pool, a chunk at a time.
    pub fn filter_nodes(&self, nodes: &[&'a NodeInfo], wanted: usize) -> Vec<NodeOutcome<'a>> {
        let mut outcomes: Vec<NodeOutcome<'a>> =
            Vec::with_capacity(nodes.len().min(wanted.saturating_mul(2)));
        let mut feasible = 0;
        let started = Instant::now();
        let mut rest = nodes;
        while let Some((node, tail)) = rest.split_first() {
            let look_at_clock = outcomes.len().is_multiple_of(CLOCK_EVERY);
            if feasible >= wanted || (look_at_clock && started.elapsed() >= ALONE) {
                break;
            }
            let status = self.filter(node);
            let stop = matches!(status.code, Code::Error | Code::Stopped { .. });
            feasible += usize::from(status.is_success());
            outcomes.push(NodeOutcome { node, status });
            rest = tail;
            if stop {
                return outcomes;
            }
        }
        if feasible < wanted {
            outcomes.extend(self.filter_in_parallel(rest, wanted - feasible));
        }
        outcomes
    }

    /// [`Attempt::filter_nodes`] on the pool's threads, a chunk at a time.
    fn filter_in_parallel(&self, nodes: &[&'a NodeInfo], wanted: usize) -> Vec<NodeOutcome<'a>> {
        let mut outcomes: Vec<NodeOutcome<'a>> = Vec::new();
        let mut feasible = 0;
        let chunk = 64.max(wanted.min(nodes.len()));
        for part in nodes.chunks(chunk) {
            let mut results: Vec<NodeOutcome<'a>> = part
                .par_iter()
                .map(|node| NodeOutcome {
                    node,
                    status: self.filter(node),
                })
                .collect();
            let stop = results
                .iter()
                .any(|o| matches!(o.status.code, Code::Error | Code::Stopped { .. }));
            if !stop {
                let mut missing = wanted.saturating_sub(feasible);
                let last = results.iter().position(|o| {
                    missing -= usize::from(o.status.is_success() && missing > 0);
                    missing == 0
                });
                results.truncate(last.map_or(results.len(), |i| i + 1));
            }
            feasible += results.iter().filter(|o| o.status.is_success()).count();
            outcomes.extend(results);
            if stop || feasible >= wanted {
                break;
            }
        }
        outcomes
    }

    /// PreScore and Score over the feasible nodes: each plugin's scores normalised to
    /// 0..=100 and weighted; the totals summed per node.
    pub fn score(&mut self, feasible: &[&'a NodeInfo]) -> Result<Scores, Status> {
        let mut scores = Scores {
            totals: vec![0; feasible.len()],
            per_plugin: BTreeMap::new(),
        };
        if feasible.len() <= 1 {
            return Ok(scores);
        }
        for slot in &mut self.slots {
            if slot.skip_score {
                continue;
            }
            let status = slot.cycle.pre_score(feasible);
            match status.code {
                Code::Success => {}
                Code::Skip => {
                    slot.skip_score = true;
                    continue;
                }
                _ => return Err(status.with_plugin(plugin_name(slot))),
            }
        }
        let scoring: Vec<&Slot<'a>> = self.slots.iter().filter(|s| !s.skip_score).collect();
        // Every plugin's score of a node, node after node, in one table (a row a node).
        let width = scoring.len();
        if width == 0 {
            return Ok(scores);
        }
        let mut all = vec![0_i64; feasible.len() * width];
        let failed = FirstError::default();
        let score_row = |(n, (row, node)): (usize, (&mut [i64], &&'a NodeInfo))| {
            for (at, (cell, slot)) in row.iter_mut().zip(&scoring).enumerate() {
                match slot.cycle.score(node) {
                    Ok(s) => *cell = s,
                    Err(status) => failed.keep((at, n), status),
                }
            }
        };
        if feasible.len() < SCORE_ALONE {
            all.chunks_mut(width)
                .zip(feasible)
                .enumerate()
                .for_each(score_row);
        } else {
            all.par_chunks_mut(width)
                .zip(feasible.par_iter())
                .enumerate()
                .with_min_len(SCORE_BATCH)
                .for_each(score_row);
        }
        let mut failed = failed.into_inner();
        for (at, slot) in scoring.iter().enumerate() {
            let name = plugin_name(slot);
            if let Some(((_, _), status)) = failed.take_if(|((plugin, _), _)| *plugin == at) {
                return Err(status.with_plugin(name));
            }
            let mut raw: Vec<i64> = all.iter().skip(at).step_by(width).copied().collect();
            slot.cycle.normalize_score(&mut raw);
            if let Some(bad) = raw.iter().find(|s| !(0..=MAX_NODE_SCORE).contains(*s)) {
                return Err(Status::error(format!(
                    "plugin {name} gave a score of {bad}, outside 0..={MAX_NODE_SCORE}"
                )));
            }
            for s in &mut raw {
                *s *= slot.entry.weight;
            }
            for (total, s) in scores.totals.iter_mut().zip(&raw) {
                *total += s;
            }
            scores.per_plugin.insert(slot.entry.name.clone(), raw);
        }
        Ok(scores)
    }

    /// Reserve: every plugin records its part of the placement on the chosen node.
    pub fn reserve(&mut self, node: &NodeInfo, placement: &mut Placement) -> Result<(), Status> {
        for slot in &mut self.slots {
            let status = slot.cycle.reserve(node, placement);
            if !status.is_success() {
                return Err(status.with_plugin(plugin_name(slot)));
            }
        }
        Ok(())
    }
}

/// The score error of the first plugin (in profile order) that gave one, on the first
/// node (in feasible order) it gave one for, from threads that score nodes at once.
#[derive(Default)]
struct FirstError(std::sync::Mutex<Option<((usize, usize), Status)>>);

impl FirstError {
    /// `status` from plugin and node `at`.
    fn keep(&self, at: (usize, usize), status: Status) {
        let mut first = self.0.lock().expect("not poisoned");
        if first.as_ref().is_none_or(|(kept, _)| at < *kept) {
            *first = Some((at, status));
        }
    }

    fn into_inner(self) -> Option<((usize, usize), Status)> {
        self.0.into_inner().expect("not poisoned")
    }
}

fn plugin_name(slot: &Slot<'_>) -> &'static str {
    plugins::static_name(&slot.entry.name)
}

/// kube-scheduler's "0/N nodes are available: ..." message: each reason with the number of
/// nodes that gave it, sorted as text.
pub fn fit_error(total: usize, outcomes: &[NodeOutcome<'_>]) -> String {
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for outcome in outcomes.iter().filter(|o| o.status.is_rejection()) {
        for reason in outcome.status.reasons.iter() {
            *reasons.entry(reason.as_str()).or_default() += 1;
        }
    }
    let mut lines: Vec<String> = reasons
        .into_iter()
        .map(|(reason, n)| format!("{n} {reason}"))
        .collect();
    lines.sort();
    if total == 0 {
        return "0/0 nodes are available: no nodes in the cluster.".into();
    }
    format!("0/{total} nodes are available: {}.", lines.join(", "))
}

#[cfg(test)]
mod tests {
    use super::{FirstError, Status};

    #[test]
    fn the_error_kept_is_the_first_plugins_on_its_first_node_whatever_order_they_came_in() {
        let failed = FirstError::default();
        for (plugin, node) in [(1, 5), (2, 0), (0, 7), (0, 3), (1, 0), (0, 4)] {
            failed.keep((plugin, node), Status::error(format!("{plugin} on {node}")));
        }
        let ((plugin, node), status) = failed.into_inner().expect("an error kept");
        assert_eq!((plugin, node), (0, 3));
        assert_eq!(status.reasons.iter().collect::<Vec<_>>(), ["0 on 3"]);
    }
}
