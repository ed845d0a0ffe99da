//! # dra-allocator: one pod's ResourceClaims on one candidate node
//!
//! A pure library (no I/O, no async) that does what Kubernetes' structured allocator
//! (`k8s.io/dynamic-resource-allocation/structured`) does, with the same answers, plus
//! pruning so that hard cases finish in milliseconds and an explanation when nothing fits.
//!
//! ## Brief overview
//!
//! * [`Snapshot`] holds the cluster: DeviceClasses, ResourceSlices with DeviceTaintRules
//!   applied, and the devices already allocated or in flight ([`Snapshot::add_allocation`]).
//!   Build it once per cluster change and share it (`&Snapshot`, `Arc<Snapshot>`) across
//!   threads; per-pool indexes and a selector-result cache live inside.
//! * [`Slice`] is a ResourceSlice as the snapshot (and the scheduler) keeps it: the API
//!   object with each device's attribute and capacity maps moved out into sorted boxed
//!   slices ([`DeviceMaps`]), about a third of the `BTreeMap`s' memory. Receiving it
//!   (`Slice::from`) also works out what a snapshot needs of it alone: each device's
//!   numbers (what CEL can see of it, in a process-wide numbering), parsed capacity and
//!   counters, signature; a snapshot copies those instead of reading every device again.
//! * [`Allocator`] is built from a snapshot and one pod's unallocated claims. It resolves
//!   classes and compiles selectors once; invalid claims, missing classes and CEL errors fail
//!   here or in `allocate` with an [`AllocError`] for the whole attempt.
//! * [`Allocator::allocate`] runs for one candidate node (callable from many threads) and
//!   returns an [`Outcome`]: an [`Allocation`] (the devices picked, compact, plus a
//!   [`Quality`] for scoring) or an [`Explanation`] with counts per request.
//! * [`Allocator::results`] turns the allocation of the node the caller picks into one
//!   `resource.k8s.io/v1` `AllocationResult` per claim, so that the strings, configs and node
//!   selectors of the API objects are built once per pod, not once per feasible node.
//!   [`Allocator::allocate_resolved`] does both for a single node.
//!
//! The search is complete and tries devices in upstream's order (claims, requests,
//! subrequests, pools by driver/name, slices by name, devices in slice order), so the first
//! answer is the one Kubernetes would pick; pruning (counting bounds that also read shared
//! counters and consumable capacity, matchAttribute supply, interchangeable devices tried
//! once, failed states remembered) only skips what cannot succeed. [`Allocator::packing`]
//! switches to best fit that keeps NUMA domains whole.
//!
//! ## Kubernetes 1.37 DRA features
//!
//! Each behind its flag in [`Features`], named as the Kubernetes gate; the default is
//! 1.37's (GA and beta on, alpha off). A claim that uses a feature that is off fails with
//! upstream's message; a slice that uses one is ignored as upstream ignores it. Every
//! feature marked "same as upstream" is checked against `k8s.io/dynamic-resource-allocation`
//! v0.37.2 on 2,000 random snapshots (`tests/conformance.rs`; the alpha ones with the gates on).
//!
//! | gate (stage in 1.37) | what it reads | state here |
//! |---|---|---|
//! | DRAPrioritizedList (GA) | `firstAvailable` subrequests | same as upstream |
//! | DRAAdminAccess (GA) | `adminAccess` requests | same as upstream |
//! | DRAPartitionableDevices (beta) | `sharedCounters`, `consumesCounters`, per-device node selection | same as upstream |
//! | DRADeviceTaints, DRADeviceTaintRules (beta) | device taints, tolerations, DeviceTaintRules | same as upstream |
//! | DRADeviceBindingConditions (beta) | `bindingConditions`, `bindsToNode` | same as upstream |
//! | DRAConsumableCapacity (beta), DRAFractionalCapacityRange | `allowMultipleAllocations`, capacity requests and policies, `shareID` | same as upstream |
//! | DRAListTypeAttributes (alpha) | list-valued attributes in `matchAttribute`/`distinctAttribute` (set semantics) | same as upstream with the gate on |
//! | DRADerivedAttributes (alpha) | `derivedAttributes` of requests and subrequests, read by constraints in place of the device's | same as upstream with the gate on; the expression's cost is bounded by its static estimate (upstream: by a runtime limit) |
//! | DRADeviceCompatibilityGroups (alpha) | `compatibilityGroups` of counter consumption | same as upstream with the gate on |
//! | DRAOptionalNodeOperations (alpha) | a slice's `skipNodeOperations`, the node's `declaredFeatures` | same as upstream with the gate on |
//! | DRANodeAllocatableResources (alpha) | a device's `nodeAllocatableResources` (the node CPU, memory or hugepages it maps) | with the gate on, allocated as any device; `dra-engine`'s DynamicResources counts what the pod's devices map against the node, and the binder writes the pod's `nodeAllocatableResourceClaimStatuses`, as kube-scheduler does; with it off, such a device is never allocated, and the explanation says so |
//! | DRAPartitionableDevicesType (alpha) | a slice's `partitionTypeAttribute` | not read by any scheduling code in 1.37 (only by pool status reporting): nothing to do |
//! | DRAResourceClaimDeviceStatus, DRAResourcePoolStatus, DRAExtendedResource | device status, pool status requests; extended resources (in `dra-engine`) | not the allocator's |
//! Selector results are cached per snapshot by what CEL can see of a device, or, for
//! selectors that plainly read only `device.driver` and named attributes or capacities, by
//! just those values (one evaluation for all devices of a kind); hand
//! [`Snapshot::selector_cache`] to the next snapshot to keep them across rebuilds. Compiled
//! selectors are shared process-wide. Per-node buffers are reused per thread, so an attempt
//! allocates little besides its compact [`Allocation`].
//!
//! ## Example
//!
//! ```
//! use dra_allocator::{Allocator, Outcome, Snapshot, SnapshotInput};
//! use k8s_openapi::api::core::v1::Node;
//! use k8s_openapi::api::resource::v1::*;
//! use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
//!
//! let meta = |name: &str| ObjectMeta { name: Some(name.into()), ..Default::default() };
//! let class = DeviceClass { metadata: meta("gpu"), spec: Some(Default::default()) };
//! let slice = ResourceSlice {
//!     metadata: meta("node-1-gpus"),
//!     spec: ResourceSliceSpec {
//!         driver: "gpu.example.com".into(),
//!         node_name: Some("node-1".into()),
//!         pool: ResourcePool { name: "node-1".into(), generation: 1, resource_slice_count: 1 },
//!         devices: Some(vec![
//!             Device { name: "gpu-0".into(), ..Default::default() },
//!             Device { name: "gpu-1".into(), ..Default::default() },
//!         ]),
//!         ..Default::default()
//!     },
//! };
//! let claim = ResourceClaim {
//!     metadata: ObjectMeta { namespace: Some("default".into()), ..meta("train") },
//!     spec: Some(ResourceClaimSpec {
//!         devices: Some(DeviceClaim {
//!             requests: Some(vec![DeviceRequest {
//!                 name: "gpus".into(),
//!                 exactly: Some(ExactDeviceRequest {
//!                     device_class_name: "gpu".into(),
//!                     count: Some(2),
//!                     ..Default::default()
//!                 }),
//!                 ..Default::default()
//!             }]),
//!             ..Default::default()
//!         }),
//!     }),
//!     ..Default::default()
//! };
//! let snapshot = Snapshot::new(SnapshotInput {
//!     classes: vec![class],
//!     slices: vec![std::sync::Arc::new(slice.into())],
//!     ..Default::default()
//! });
//! let allocator = Allocator::new(&snapshot, &[&claim]).unwrap();
//! let node = Node { metadata: meta("node-1"), ..Default::default() };
//! match allocator.allocate(&node).unwrap() {
//!     Outcome::Allocated(a) => {
//!         // Built only when asked: a scheduler asks for the node it picks.
//!         let results = allocator.results(&node, &a).unwrap();
//!         let results = results[0].devices.as_ref().unwrap().results.as_ref().unwrap();
//!         let names: Vec<_> = results.iter().map(|r| r.device.as_str()).collect();
//!         assert_eq!(names, ["gpu-0", "gpu-1"]);
//!     }
//!     Outcome::Unfit(why) => panic!("{why}"),
//! }
//! ```

#![forbid(unsafe_code)]

mod attr;
pub mod build;
mod capacity;
mod compat;
mod error;
mod facts;
mod intern;
mod materialise;
mod nodesel;
mod outcome;
mod plan;
pub mod quantity;
mod reads;
mod search;
mod slice;
mod snapshot;

use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};

pub use error::AllocError;
pub use nodesel::{NodeSelectorError, node_matches};
pub use outcome::{
    Allocation, Explanation, Limits, Outcome, Quality, RequestExplanation, Resolved,
};
pub use plan::{MAX_RESULTS_PER_CLAIM, MAX_SUBREQUESTS};
pub use slice::{DeviceMaps, Slice};
pub use snapshot::{DeviceId, Features, SelectorCache, Snapshot, SnapshotInput};

/// Maps and sets keyed by numbers this crate makes itself (no text from the API, so no
/// HashDoS exposure): foldhash with its fixed seed, deterministic as the hand-written Fx
/// hasher it replaces and about as cheap per key.
pub(crate) type NumMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::FixedState>;
pub(crate) type NumSet<K> = std::collections::HashSet<K, foldhash::fast::FixedState>;

/// One pod's claims, checked and compiled against a snapshot; allocate them per node.
#[derive(Debug)]
pub struct Allocator<'s> {
    snapshot: &'s Snapshot,
    plan: plan::Plan,
}

/// Work done by one [`Allocator::allocate_with`] call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Search steps (requests and devices tried).
    pub steps: u64,
}

impl<'s> Allocator<'s> {
    /// Checks the claims (classes exist, selectors compile, counts fit in 32 results,
    /// features on) once for all nodes.
    pub fn new(snapshot: &'s Snapshot, claims: &[&ResourceClaim]) -> Result<Self, AllocError> {
        Ok(Allocator {
            snapshot,
            plan: plan::Plan::new(snapshot, claims)?,
        })
    }

    /// Prefer devices that keep whole NUMA domains (`resource.kubernetes.io/numaNode`) free:
    /// best fit instead of upstream's first fit. Off by default, so that answers are the ones
    /// Kubernetes would give; the search stays complete either way.
    pub fn packing(mut self, on: bool) -> Self {
        self.plan.packing = on;
        self
    }

    /// Finds devices for every claim on `node`, or explains why there are none.
    pub fn allocate(&self, node: &Node) -> Result<Outcome, AllocError> {
        self.allocate_with(node, Limits::default()).map(|(o, _)| o)
    }

    /// [`Allocator::allocate`] with a deadline or cancellation flag, also reporting the work
    /// done.
    pub fn allocate_with(
        &self,
        node: &Node,
        limits: Limits<'_>,
    ) -> Result<(Outcome, Stats), AllocError> {
        let (outcome, steps) = search::run(self.snapshot, &self.plan, node, limits)?;
        Ok((outcome, Stats { steps }))
    }

    /// The `resource.k8s.io/v1` `AllocationResult`s (one per claim, in claim order) of an
    /// allocation this allocator found on `node`. A scheduler calls it for the node it picks
    /// only. Each call gives fresh `shareID`s for shared devices; everything else is the same
    /// every time. An allocation from another allocator gives wrong results or panics.
    pub fn results(
        &self,
        node: &Node,
        allocation: &Allocation,
    ) -> Result<Vec<AllocationResult>, AllocError> {
        materialise::results(
            self.snapshot,
            &self.plan,
            node.metadata.name.as_deref().unwrap_or_default(),
            allocation,
        )
    }

    /// [`Allocator::allocate`] followed by [`Allocator::results`]: convenient where one node
    /// is tried, wasteful across many.
    pub fn allocate_resolved(&self, node: &Node) -> Result<Outcome<Resolved>, AllocError> {
        Ok(match self.allocate(node)? {
            Outcome::Allocated(a) => Outcome::Allocated(Resolved {
                results: self.results(node, &a)?,
                quality: a.quality,
            }),
            Outcome::Unfit(e) => Outcome::Unfit(e),
        })
    }
}

/// A fresh RFC 4122 version-4 UUID for `shareID`, from the standard library's randomly
/// keyed hasher (no extra dependency) mixed with a process-wide counter.
pub(crate) fn share_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let state = std::collections::hash_map::RandomState::new();
    let mut a = state.build_hasher();
    a.write_u64(n);
    let mut b = state.build_hasher();
    b.write_u64(!n);
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&a.finish().to_le_bytes());
    bytes[8..].copy_from_slice(&b.finish().to_le_bytes());
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let h: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}
