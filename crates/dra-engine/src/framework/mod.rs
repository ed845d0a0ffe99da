//! kube-scheduler's scheduling framework, in Rust: named extension points, plugins that
//! implement some of them, and a profile that says which plugins run and how much each
//! score weighs.
//!
//! A plugin ([`Plugin`]) is built once from its arguments. For every scheduling attempt it
//! makes a [`PluginCycle`]: that plugin's part of the cycle state, which the extension points
//! of the attempt run on, in kube-scheduler's order:
//!
//! | extension point | here |
//! |---|---|
//! | PreEnqueue | [`Plugin::pre_enqueue`], before a pod is tried at all |
//! | QueueSort | [`Plugin::less`] (PrioritySort) |
//! | PreFilter | [`PluginCycle::pre_filter`], once per attempt |
//! | Filter | [`PluginCycle::filter`], per node, nodes in parallel |
//! | PostFilter | [`Plugin::post_filter`], when no node fits |
//! | PreScore | [`PluginCycle::pre_score`], once, with the feasible nodes |
//! | Score / NormalizeScore | [`PluginCycle::score`] per node, [`PluginCycle::normalize_score`] |
//! | Reserve | [`PluginCycle::reserve`] fills the [`crate::Placement`]; [`crate::Engine::assume`] records it |
//! | Unreserve | [`crate::Engine::forget`] |
//! | PreBind / Bind | the daemon's binder writes what Reserve decided, in that order |
//!
//! The framework ([`Framework`]) runs the points and combines scores as kube-scheduler
//! does: each plugin scores 0..=100 after normalising, times its weight, summed per node.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use dra_allocator::{Allocation, Features, Limits, Quality, Snapshot};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};

use crate::engine::Placement;
use crate::resources::ResourceList;
use crate::state::{ClusterState, NodeInfo, ObjectKey};

mod by_node;
pub mod config;
mod profile;
mod run;
mod status;

pub use by_node::ByNode;
pub use profile::{PluginArgs, PluginEntry, Profile};
pub use run::{Attempt, Framework, NodeOutcome, Scores, fit_error, in_pool};
pub use status::{Code, Reasons, Status};

/// The most a score plugin may give a node, after normalising (kube-scheduler's MaxNodeScore).
pub const MAX_NODE_SCORE: i64 = 100;

/// The extension points a plugin can be enabled at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Point {
    PreEnqueue,
    QueueSort,
    PreFilter,
    Filter,
    PostFilter,
    PreScore,
    Score,
    Reserve,
    PreBind,
    Bind,
}

impl Point {
    /// The name in a KubeSchedulerConfiguration's `plugins` (`preFilter`, `score`, ...).
    pub fn config_name(self) -> &'static str {
        match self {
            Point::PreEnqueue => "preEnqueue",
            Point::QueueSort => "queueSort",
            Point::PreFilter => "preFilter",
            Point::Filter => "filter",
            Point::PostFilter => "postFilter",
            Point::PreScore => "preScore",
            Point::Score => "score",
            Point::Reserve => "reserve",
            Point::PreBind => "preBind",
            Point::Bind => "bind",
        }
    }

    pub const ALL: [Point; 10] = [
        Point::PreEnqueue,
        Point::QueueSort,
        Point::PreFilter,
        Point::Filter,
        Point::PostFilter,
        Point::PreScore,
        Point::Score,
        Point::Reserve,
        Point::PreBind,
        Point::Bind,
    ];
}

/// What every plugin of one attempt sees: the pod, the cluster as it is for this attempt
/// (kube-scheduler's snapshot) and the device view.
pub struct Cycle<'a> {
    pub pod: &'a Pod,
    pub key: &'a ObjectKey,
    pub state: &'a ClusterState,
    /// The pod's effective requests (containers, init containers, overhead).
    pub requests: &'a ResourceList,
    /// The allocator's view of devices.
    pub snapshot: &'a Snapshot,
    pub features: &'a Features,
    /// The device search's deadline and cancel flag (DynamicResources).
    pub limits: Limits<'a>,
    pub cancel: Option<&'a AtomicBool>,
    /// Extended resources of the pod that a DeviceClass serves (DynamicResources serves
    /// them on nodes without device-plugin capacity; NodeResourcesFit leaves them alone).
    pub served_by_devices: &'a [String],
    /// What plugins share within the attempt.
    pub shared: &'a Shared,
    /// Claims of other members of the pod's PodGroup, already placed on the one node this
    /// attempt looks at, whose devices were given back so that DynamicResources chooses
    /// them again together with this pod's (joint allocation; see `crate::group`). Empty
    /// outside a group's repair step.
    pub revise: Vec<(ObjectKey, &'a ResourceClaim)>,
    /// DynamicResources' answers per node, kept across attempts.
    pub device_memo: Option<&'a crate::device_memo::DeviceMemo>,
}

impl Cycle<'_> {
    pub fn served_by_devices(&self, resource: &str) -> bool {
        self.served_by_devices.iter().any(|r| r == resource)
    }
}

/// What plugins of one attempt share (kube-scheduler's CycleState, for the parts more
/// than one plugin reads).
#[derive(Default)]
pub struct Shared {
    /// Allocator search steps (requests and devices tried), all nodes.
    pub search_steps: AtomicU64,
    /// The devices DynamicResources found on each node, for the device scores to read how
    /// good they are ([`Allocation::quality`]), by [`NodeInfo::object_version`]. Read by
    /// every device score on every feasible node, at once: a read lock.
    quality: ByNode<Arc<Allocation>>,
    /// The new allocations of [`Cycle::revise`]'s claims on the chosen node (Reserve).
    pub revised: Mutex<Vec<(ObjectKey, AllocationResult)>>,
}

impl Shared {
    /// For an attempt on a cluster of `nodes` nodes.
    pub fn for_nodes(nodes: usize) -> Self {
        Shared {
            quality: ByNode::with_room_for(nodes),
            ..Shared::default()
        }
    }

    /// Keep `found` (the same `Arc` the memo and Reserve hold: no copy) for its quality.
    pub fn record_quality(&self, node: &NodeInfo, found: Arc<Allocation>) {
        self.quality.insert(node, found);
    }

    /// `read` of the quality of the devices found on `node`, if any, without a copy.
    pub fn read_quality<T>(&self, node: &NodeInfo, read: impl FnOnce(&Quality) -> T) -> Option<T> {
        self.quality.read(node, |a| read(&a.quality))
    }
}

/// A scheduler plugin, built once from the profile. The per-attempt work happens in the
/// [`PluginCycle`] it makes.
pub trait Plugin: Send + Sync {
    /// The name kube-scheduler gives the plugin.
    fn name(&self) -> &'static str;

    /// The extension points the plugin implements.
    fn points(&self) -> &'static [Point];

    /// Start one attempt for the pod in `cycle`. Plugins that keep nothing per attempt
    /// return a cycle that only filters or scores.
    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a>;

    /// PreEnqueue: whether the pod may be tried at all now (a gate, claims not created
    /// yet). Anything but success keeps it waiting, with the message.
    fn pre_enqueue(&self, _pod: &Pod, _state: &ClusterState) -> Status {
        Status::success()
    }

    /// QueueSort: whether `a` goes before `b`.
    fn less(&self, _a: &Pod, _b: &Pod) -> bool {
        false
    }

    /// PostFilter, after no node fitted: something the caller can do so the pod fits on
    /// a later attempt (DynamicResources: a claim to give back). `None`: nothing.
    fn post_filter(&self, _pod: &Pod, _state: &ClusterState) -> Option<PostFilterAction> {
        None
    }
}

/// What a PostFilter plugin asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PostFilterAction {
    /// Deallocate this claim (allocated for the pod, reserved for nobody else).
    ReleaseClaim(ObjectKey),
}

/// One plugin's part of one scheduling attempt (its slot in kube-scheduler's CycleState).
pub trait PluginCycle: Send + Sync {
    /// PreFilter. `Skip` leaves this plugin's Filter out of the attempt; anything else
    /// but success makes the pod unschedulable with the status's message.
    fn pre_filter(&mut self) -> Status {
        Status::skip()
    }

    /// Filter: whether the pod fits on `node`.
    fn filter(&self, _node: &NodeInfo) -> Status {
        Status::success()
    }

    /// PreScore, with the nodes that passed the filters. `Skip` leaves Score out.
    fn pre_score(&mut self, _feasible: &[&NodeInfo]) -> Status {
        Status::skip()
    }

    /// Score: the node's raw score for this plugin.
    fn score(&self, _node: &NodeInfo) -> Result<i64, Status> {
        Ok(0)
    }

    /// NormalizeScore: bring the raw scores (in the order of the feasible nodes) to
    /// 0..=[`MAX_NODE_SCORE`]. The default leaves them as they are.
    fn normalize_score(&self, _scores: &mut [i64]) {}

    /// Reserve: record in `placement` what this plugin decided for the chosen node.
    fn reserve(&mut self, _node: &NodeInfo, _placement: &mut Placement) -> Status {
        Status::success()
    }
}

/// A cycle for plugins that only filter or score: the closure-free default.
pub struct Nothing;

impl PluginCycle for Nothing {}

/// Normalise `scores` to 0..=MAX_NODE_SCORE by the highest (kube-scheduler's
/// DefaultNormalizeScore); `reverse` makes the highest raw score the lowest.
pub fn default_normalize_score(scores: &mut [i64], reverse: bool) {
    let max = scores.iter().copied().max().unwrap_or(0);
    if max == 0 {
        if reverse {
            scores.iter_mut().for_each(|s| *s = MAX_NODE_SCORE);
        }
        return;
    }
    for s in scores.iter_mut() {
        *s = MAX_NODE_SCORE * *s / max;
        if reverse {
            *s = MAX_NODE_SCORE - *s;
        }
    }
}

/// Plugin names, for messages ("node(s) didn't satisfy plugin(s) [...]").
pub fn names(plugins: &BTreeSet<&'static str>) -> String {
    plugins.iter().copied().collect::<Vec<_>>().join(", ")
}
