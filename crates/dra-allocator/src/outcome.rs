//! What an allocation attempt on one node returns: an [`Allocation`] with its quality for
//! scoring, or an [`Explanation`] of why nothing fits, with counts.

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use k8s_openapi::api::resource::v1::AllocationResult;

use crate::quantity::Quantity;

/// The result for one node: by default a compact [`Allocation`];
/// [`crate::Allocator::allocate_resolved`] gives [`Resolved`] results instead.
#[derive(Clone, Debug)]
pub enum Outcome<A = Allocation> {
    Allocated(A),
    Unfit(Explanation),
}

impl<A> Outcome<A> {
    pub fn allocation(&self) -> Option<&A> {
        match self {
            Outcome::Allocated(a) => Some(a),
            Outcome::Unfit(_) => None,
        }
    }

    pub fn explanation(&self) -> Option<&Explanation> {
        match self {
            Outcome::Allocated(_) => None,
            Outcome::Unfit(e) => Some(e),
        }
    }
}

/// Devices found for every claim, compact: which devices, for which (sub)requests, with
/// what consumed capacity, and the [`Quality`] for scoring. Cheap to build and drop on
/// every feasible node; [`crate::Allocator::results`] builds the `AllocationResult`s (for
/// the node a scheduler picks) from it and the allocator that found it.
#[derive(Clone, Debug)]
pub struct Allocation {
    pub quality: Quality,
    /// Every device picked, claim by claim, in result order.
    pub(crate) picks: Vec<Picked>,
}

impl Allocation {
    /// How many devices were picked, over all claims (a PodGroup's counting bound reads
    /// it for an `allocationMode: All` probe).
    pub fn device_count(&self) -> usize {
        self.picks.len()
    }
}

/// One device of an [`Allocation`].
#[derive(Clone, Debug)]
pub(crate) struct Picked {
    pub claim: u32,
    /// Index into the plan's requests (a subrequest for `firstAvailable`).
    pub req: u32,
    /// The device's entry in the snapshot.
    pub entry: u32,
    /// A shared device (`allowMultipleAllocations`): the result gets a fresh `shareID`.
    pub share: bool,
    /// Capacity consumed, aligned with the device's capacities.
    pub consumed: Option<Vec<Quantity>>,
}

/// An allocation with its `AllocationResult`s built: one `status.allocation` per claim, in
/// claim order.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub results: Vec<AllocationResult>,
    pub quality: Quality,
}

/// How good a solution is, for node scoring.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Quality {
    /// Per request of the pod (claims in order, each claim's requests in order): the index
    /// of the `firstAvailable` subrequest chosen (`None` for plain requests).
    pub ranks: Vec<Option<usize>>,
    /// Kubernetes' prioritized-list node score: the sum over `firstAvailable` requests of
    /// (8 − chosen index). Higher is better.
    pub prioritized_score: u32,
    /// Devices on the node that no claim uses after this allocation.
    pub free_devices_after: usize,
    /// NUMA domains (`resource.kubernetes.io/numaNode`) whose devices are all free after
    /// this allocation.
    pub free_numa_domains_after: usize,
    /// Fully free NUMA domains that this allocation starts to use: lower keeps larger
    /// free blocks.
    pub numa_domains_broken: usize,
}

/// Why nothing fits on a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Explanation {
    pub node: String,
    /// One entry per request alternative (requests; subrequests of `firstAvailable`).
    pub requests: Vec<RequestExplanation>,
    /// Constraint, counter and combination findings when each request could be met alone.
    pub notes: Vec<String>,
    /// Pools skipped because they are being updated (fewer slices than `resourceSliceCount`).
    pub incomplete_pools: Vec<String>,
    /// Pools skipped as invalid, with the reason.
    pub invalid_pools: Vec<String>,
}

/// Counts for one request (or subrequest) on one node, each a subset of the one before.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestExplanation {
    pub claim: String,
    /// `request` or `request/subrequest`.
    pub request: String,
    pub class: String,
    /// Devices needed (`None`: all matching devices).
    pub needed: Option<usize>,
    /// Devices in usable pools on the node.
    pub on_node: usize,
    /// Selected by the DeviceClass selectors.
    pub in_class: usize,
    /// Also selected by the request's selectors.
    pub match_selectors: usize,
    /// Excluded by per-device node selection.
    pub other_node: usize,
    /// Excluded by a NoSchedule/NoExecute taint the request does not tolerate.
    pub tainted: usize,
    /// Excluded because the requested capacity does not fit the device at all.
    pub capacity_mismatch: usize,
    /// Already allocated to other claims.
    pub in_use: usize,
    /// Shared counters of the pool do not allow the device now.
    pub blocked_by_counters: usize,
    /// Not enough capacity left on a shared device.
    pub blocked_by_capacity: usize,
    /// Excluded because they map node allocatable resources and DRANodeAllocatableResources
    /// is off: never allocated rather than overcommit the node's CPU or memory.
    pub node_allocatable: usize,
    /// Excluded because their slice skips node operations (DRAOptionalNodeOperations) and
    /// the node does not declare the feature (or the gate is off).
    pub node_operations: usize,
    /// Usable now, before constraints.
    pub available: usize,
}

impl fmt::Display for RequestExplanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let needed = match self.needed {
            Some(n) => format!("needs {n}"),
            None => "needs all".to_string(),
        };
        write!(
            f,
            "claim {} request {} ({needed}): {} in class {}, {} match the selectors",
            self.claim, self.request, self.in_class, self.class, self.match_selectors
        )?;
        let parts = [
            (self.other_node, "for other nodes"),
            (self.tainted, "tainted"),
            (self.capacity_mismatch, "too small"),
            (self.in_use, "in use"),
            (self.blocked_by_counters, "blocked by shared counters"),
            (self.blocked_by_capacity, "without enough capacity left"),
            (
                self.node_allocatable,
                "map nodeAllocatableResources, which needs the DRANodeAllocatableResources feature gate",
            ),
            (
                self.node_operations,
                "skip node operations (skipNodeOperations) the node does not declare it can skip (DRAOptionalNodeOperations)",
            ),
        ];
        for (n, what) in parts {
            if n > 0 {
                write!(f, ", {n} {what}")?;
            }
        }
        write!(f, ", {} available", self.available)
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {}:", self.node)?;
        let mut sep = " ";
        for r in &self.requests {
            write!(f, "{sep}{r}")?;
            sep = "; ";
        }
        for n in &self.notes {
            write!(f, "{sep}{n}")?;
            sep = "; ";
        }
        if !self.incomplete_pools.is_empty() {
            write!(
                f,
                "{sep}pools being updated: {}",
                self.incomplete_pools.join(", ")
            )?;
            sep = "; ";
        }
        if !self.invalid_pools.is_empty() {
            write!(f, "{sep}invalid pools: {}", self.invalid_pools.join(", "))?;
        }
        Ok(())
    }
}

/// Bounds on one attempt. The pruning should make both unnecessary: reaching them is a bug.
#[derive(Clone, Copy, Debug, Default)]
pub struct Limits<'a> {
    pub deadline: Option<Instant>,
    pub cancel: Option<&'a AtomicBool>,
}
