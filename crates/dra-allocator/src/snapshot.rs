//! The cluster state the allocator works on: DeviceClasses, ResourceSlices (with
//! DeviceTaintRules applied), and what is already allocated or in flight. Built once and
//! shared (`&Snapshot` or `Arc<Snapshot>`) by every per-node attempt; everything that does not
//! depend on the node or the claims is computed here, once.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use hashbrown::HashTable;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    AllocationResult, Device, DeviceClass, DeviceTaint, DeviceTaintRule, ResourceSlice,
    ResourceSliceSpec,
};

use crate::error::AllocError;
use crate::intern::ReadIds;
use crate::nodesel::node_matches;
use crate::quantity::Quantity;
use crate::{DeviceMaps, NumMap};

/// Which DRA features are on. `Default` is Kubernetes 1.37's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Features {
    pub admin_access: bool,
    pub prioritized_list: bool,
    pub partitionable_devices: bool,
    pub device_taints: bool,
    /// DRADeviceBindingConditions and DRAResourceClaimDeviceStatus.
    pub binding_conditions: bool,
    pub consumable_capacity: bool,
    pub fractional_capacity_range: bool,
    /// DRAListTypeAttributes (alpha, off): list attributes in constraints.
    pub list_type_attributes: bool,
    /// DRADeviceCompatibilityGroups (alpha, off): devices drawing on one counter set must
    /// share a compatibility group; off, slices that declare groups are ignored.
    pub compatibility_groups: bool,
    /// DRADerivedAttributes (alpha, off): requests' CEL-computed attributes, which
    /// constraints read in place of the device's.
    pub derived_attributes: bool,
    /// DRAOptionalNodeOperations (alpha, off): devices of slices with `skipNodeOperations`
    /// need it on, and a node that declares the feature; off, they are not allocated.
    pub optional_node_operations: bool,
    /// DRANodeAllocatableResources (alpha, off): devices that map node CPU, memory or
    /// hugepages (`nodeAllocatableResources`) are allocated as any other, and the
    /// scheduler (not the allocator) counts what they map; off, they are not allocated.
    pub node_allocatable_resources: bool,
}

impl Features {
    /// Whether an alpha gate only upstream's experimental allocator supports is on: that
    /// variant then runs, and reads fields the others ignore.
    pub fn alpha(&self) -> bool {
        self.list_type_attributes
            || self.compatibility_groups
            || self.derived_attributes
            || self.optional_node_operations
    }
}

impl Default for Features {
    fn default() -> Self {
        Features {
            admin_access: true,
            prioritized_list: true,
            partitionable_devices: true,
            device_taints: true,
            binding_conditions: true,
            consumable_capacity: true,
            fractional_capacity_range: true,
            list_type_attributes: false,
            compatibility_groups: false,
            derived_attributes: false,
            optional_node_operations: false,
            node_allocatable_resources: false,
        }
    }
}

/// A device's identity in the API: driver, pool and device name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// Everything a [`Snapshot`] is built from.
#[derive(Clone, Debug, Default)]
pub struct SnapshotInput {
    pub classes: Vec<DeviceClass>,
    /// Shared with the caller, not copied: a scheduler keeps its informer's slices and
    /// rebuilds snapshots from them without cloning every device.
    pub slices: Vec<Arc<crate::Slice>>,
    pub taint_rules: Vec<DeviceTaintRule>,
    /// `status.allocation` of every allocated claim, plus in-flight (assumed) allocations.
    pub allocations: Vec<AllocationResult>,
    pub features: Features,
    /// Reuse compiled selectors and their results from an earlier snapshot (same features).
    pub selector_cache: Option<Arc<SelectorCache>>,
}

/// One capacity of a device with its request policy, parsed.
#[derive(Clone, Debug)]
pub(crate) struct Capacity {
    pub name: String,
    pub value: Quantity,
    pub default: Option<Quantity>,
    pub range: Option<(Quantity, Option<Quantity>, Option<Quantity>)>,
    pub valid_values: Vec<Quantity>,
    /// The policy is present at all.
    pub has_policy: bool,
}

/// Per-device facts that depend on neither node nor claims. `repr(C)` keeps the order
/// below: the fields every attempt reads of every device of a node come first, in one
/// cache line, so a fresh snapshot costs fewer memory reads per device.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct DeviceEntry {
    /// First-level selector cache for expression ids below [`SEL_BITS`]: bit `expr` set
    /// once evaluated, with the result in bit `SEL_BITS + expr`. One word, so a result is
    /// recorded with one atomic operation and read consistently. Lock-free and next to the
    /// device's other data.
    pub sel: AtomicU64,
    /// What CEL sees of the device, as numbers: the selector-result cache key.
    pub view: crate::intern::DeviceView,
    /// Equal for devices that differ only in name: interchangeable in any solution
    /// (the signature interned to a small number, the same across the snapshot).
    pub sym: u32,
    /// `resource.kubernetes.io/numaNode` (interned), for the fragmentation score.
    pub numa: Option<u32>,
    /// The device has binding conditions.
    pub binding_conditions: bool,
    /// The device maps node allocatable resources (`nodeAllocatableResources`).
    pub node_resources: bool,
    /// The slice selects nodes per device (`perDeviceNodeSelection`).
    pub per_device: bool,
    /// The slice asks to skip node operations (`skipNodeOperations` not empty).
    pub skip_node_operations: bool,
    /// Its [`Parsed`] is [`Parsed::plain`]: nothing there to check for a request without
    /// `capacity` (the search then leaves it unread).
    pub plain_parsed: bool,
    /// Taints from the slice plus matching DeviceTaintRules (a boxed slice: most devices
    /// have none, and the entry is written once per device per snapshot).
    pub taints: Box<[DeviceTaint]>,
    /// The device's capacity and counters, parsed: its number in its slice's facts.
    pub parsed: u32,
    pub slice: u32,
    pub index: u32,
}

/// A device's capacity and counter consumption, parsed. Devices of a slice mostly declare
/// the same ones (every GPU of a node 40Gi of memory), so a device that declares what the
/// device before it declared shares that one's: no parsing or allocation per device.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub counters: Consumption,
    /// Why the device cannot be used at all (e.g. an unparsable quantity).
    pub broken: Option<String>,
    /// What a request without `capacity` consumes (`Ok(None)`: it does not fit), with
    /// DRAConsumableCapacity's fractional ranges off and on.
    unrequested: [Unrequested; 2],
    pub capacity: Vec<Capacity>,
}

type Unrequested = Result<Option<Vec<Quantity>>, crate::capacity::CapacityError>;

impl Parsed {
    pub fn new(device: &Device, maps: &DeviceMaps) -> Parsed {
        let (capacity, counters, broken) = match (parse_capacity(maps), parse_counters(device)) {
            (Ok(c), Ok(k)) => (c, k, None),
            (Err(e), _) | (_, Err(e)) => (Vec::new(), Vec::new(), Some(e)),
        };
        let unrequested =
            |fractional: bool| crate::capacity::consumption(None, &capacity, fractional);
        Parsed {
            unrequested: [unrequested(false), unrequested(true)],
            counters,
            broken,
            capacity,
        }
    }

    /// Usable, with no counters, and a request without `capacity` fits it whether
    /// fractional ranges are on or off: all a search checks of most devices.
    pub fn plain(&self) -> bool {
        self.broken.is_none()
            && self.counters.is_empty()
            && self.unrequested.iter().all(|u| matches!(u, Ok(Some(_))))
    }

    /// What a request without `capacity` consumes (`Ok(None)`: it does not fit).
    pub fn unrequested(&self, fractional_capacity_range: bool) -> &Unrequested {
        &self.unrequested[usize::from(fractional_capacity_range)]
    }
}

pub(crate) const NUMA_ATTRIBUTE: &str = "resource.kubernetes.io/numaNode";
/// The domain of [`NUMA_ATTRIBUTE`]: a driver of that name may write it unqualified.
const NUMA_DOMAIN: &str = "resource.kubernetes.io";

/// A selector expression, compiled, shared by every snapshot of the process (as Kubernetes
/// keeps one CEL compile cache per process).
#[derive(Clone, Debug)]
pub(crate) struct Compiled {
    pub selector: Arc<dra_cel::Selector>,
    /// What the expression reads of a device, when its text tells (see [`crate::reads`]).
    pub reads: Option<Arc<[crate::reads::Read]>>,
}

/// How much of a device is used by allocated and in-flight claims.
#[derive(Clone, Debug, Default)]
pub(crate) struct Usage {
    pub exclusive: u32,
    pub shares: u32,
    pub consumed: BTreeMap<String, Quantity>,
}

impl Usage {
    fn is_empty(&self) -> bool {
        self.exclusive == 0 && self.shares == 0 && self.consumed.is_empty()
    }
}

const CACHE_SHARDS: usize = 16;
/// Expression ids below this have their results in [`DeviceEntry::sel`].
const SEL_BITS: u32 = 32;
/// (expression id, device view) → selected.
type ResultShard = NumMap<(u32, u32), bool>;

/// (expression id, driver, allowMultipleAllocations, the value of each read) → selected.
type ReadShard = NumMap<Box<[u32]>, bool>;

/// Past this many remembered results a shard starts over (bounded memory).
const CACHE_SHARD_LIMIT: usize = 1 << 18;

/// Compiled selectors and their results per device, keyed by what CEL can see of a device
/// (driver, attributes, capacity, allowMultipleAllocations), so identical devices share an
/// entry and the cache survives snapshot rebuilds: pass the previous snapshot's
/// [`Snapshot::selector_cache`] in [`SnapshotInput::selector_cache`].
#[derive(Debug)]
pub struct SelectorCache {
    /// Unique in the process: tells caches apart where a pointer could be reused.
    id: u64,
    pub(crate) env: dra_cel::Environment,
    options: bool,
    /// The numbers results are keyed by: added to as slices arrive; a number once given
    /// never changes.
    numbering: Arc<crate::intern::Numbering>,
    expr_ids: RwLock<HashMap<String, u32>>,
    results: Vec<RwLock<ResultShard>>,
    read_results: Vec<RwLock<ReadShard>>,
}

impl SelectorCache {
    pub fn new(list_type_attributes: bool) -> Self {
        Self::numbered_in(list_type_attributes, crate::intern::Numbering::current())
    }

    fn numbered_in(list_type_attributes: bool, numbering: Arc<crate::intern::Numbering>) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        SelectorCache {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            env: dra_cel::Environment::new(dra_cel::Options {
                list_type_attributes,
            }),
            options: list_type_attributes,
            numbering,
            expr_ids: RwLock::new(HashMap::new()),
            results: (0..CACHE_SHARDS)
                .map(|_| RwLock::new(NumMap::default()))
                .collect(),
            read_results: (0..CACHE_SHARDS)
                .map(|_| RwLock::new(NumMap::default()))
                .collect(),
        }
    }
}

/// The last read-key result a thread looked up or stored: consecutive devices mostly
/// agree on what a selector reads, and the same key always gives the same result, so the
/// shared map (hash, lock) is skipped for them.
#[derive(Debug, Default)]
struct LastRead {
    /// [`SelectorCache::id`]; 0 is no cache.
    cache: u64,
    key: Vec<u32>,
    matches: bool,
}

thread_local! {
    /// A read key's buffer and the last result, per thread.
    /// (Initialised at compile time: no first-use check on each lookup.)
    static READ_KEY: std::cell::RefCell<(Vec<u32>, LastRead)> = const {
        std::cell::RefCell::new((
            Vec::new(),
            LastRead {
                cache: 0,
                key: Vec::new(),
                matches: false,
            },
        ))
    };
}

/// What a read key starts with, before the value of each read.
fn read_key_head(expr: u32, view: &crate::intern::DeviceView) -> [u32; 3] {
    [expr, view.driver, u32::from(view.multi)]
}

impl LastRead {
    /// The remembered result, if it is for this cache and the key `view` would give.
    fn holds(
        &self,
        cache: u64,
        expr: u32,
        view: &crate::intern::DeviceView,
        pairs: &[(u32, u32)],
        reads: &[ReadIds],
    ) -> Option<bool> {
        let head = read_key_head(expr, view);
        let (key_head, values) = self.key.split_at_checked(head.len())?;
        let same = self.cache == cache
            && key_head == head
            && values.len() == reads.len()
            && reads
                .iter()
                .zip(values)
                .all(|(r, &v)| view.value(pairs, r) == v);
        same.then_some(self.matches)
    }

    fn remember(&mut self, cache: u64, key: &[u32], matches: bool) {
        self.cache = cache;
        self.key.clear();
        self.key.extend_from_slice(key);
        self.matches = matches;
    }
}

impl DeviceEntry {
    /// The first-level cache's result for selector `expr` on this device, if recorded.
    #[inline]
    pub(crate) fn known_selector(&self, expr: u32) -> Option<bool> {
        if expr >= SEL_BITS {
            return None;
        }
        let sel = self.sel.load(Ordering::Relaxed);
        (sel & (1 << expr) != 0).then_some(sel & (1 << (SEL_BITS + expr)) != 0)
    }
}

/// The allocator's view of the cluster. `Sync`: share it between threads; the only writes
/// after construction are [`Snapshot::add_allocation`]/[`Snapshot::remove_allocation`]
/// (`&mut`, one writer) and the internal selector-result cache.
#[derive(Debug)]
pub struct Snapshot {
    pub(crate) features: Features,
    pub(crate) cache: Arc<SelectorCache>,
    classes: HashMap<String, DeviceClass>,
    pub(crate) slices: Vec<Arc<crate::Slice>>,
    pub(crate) devices: Vec<DeviceEntry>,
    /// Per slice, its facts (what [`DeviceEntry::parsed`] numbers is there).
    facts: Vec<Arc<crate::facts::SliceFacts>>,
    pub(crate) slice_devices: Vec<(u32, u32)>,
    /// (hash of a node's name, with `id_seed`; slice), sorted: the slices listed under each
    /// node's name (`nodeName`), in input order. No map entry (and name copy) per node.
    node_slices: Vec<(u64, u32)>,
    shared_slices: Vec<u32>,
    /// Pools sorted by (driver, pool): the index is the search order rank.
    /// Slice numbers grouped by pool (in input order within one); `pool_ranges[p]` is pool
    /// p's part. Pools are sorted by (driver, pool), the search order.
    pool_order: Vec<u32>,
    pool_ranges: Vec<(u32, u32)>,
    /// Slices ignored because they use compatibility groups (feature off).
    compat_slices: Vec<bool>,
    /// Per slice what placement needs, without touching the (large) API objects.
    slice_info: Vec<SliceInfo>,
    /// The values behind [`DeviceEntry::numa`] ids.
    numa_values: Vec<crate::attr::AttrValue>,
    usage: HashMap<DeviceId, Usage>,
    /// Per device entry, its usage (several entries can share one DeviceId); empty until
    /// an allocation is recorded.
    entry_usage: Vec<Option<Usage>>,
    /// (hash of driver, pool and device name, entry), sorted: the entries of a device id
    /// without a map entry (and three strings) per device. Built when first needed (the
    /// first allocation recorded, or [`Snapshot::devices_named`]): a snapshot of a cluster
    /// with nothing allocated never looks a device up by name.
    id_entries: OnceLock<Vec<(u64, u32)>>,
    /// The seed of the hashes in `id_entries`.
    id_seed: foldhash::fast::RandomState,
    /// Complete pools, built once: (driver, pool) → (generation, #slices, pool).
    pool_cache: Vec<Option<(i64, usize, Arc<PoolStatic>)>>,
    /// Some device maps node allocatable resources (DRANodeAllocatableResources).
    maps_node_resources: bool,
    /// Unique in the process: a memo of answers from this snapshot is not used with another.
    id: u64,
    /// Per pool, how many times an allocation there was added or removed.
    pool_versions: Vec<u64>,
    /// Pools with slices that are not tied to one node by `nodeName` (any node may see them).
    shared_pools: Vec<u32>,
}

/// The parts of a slice that deciding which pools a node sees reads.
#[derive(Clone, Copy, Debug)]
struct SliceInfo {
    pool: u32,
    generation: i64,
    /// Skipped while DRAPartitionableDevices is off (per-device placement or counters).
    partitionable_only: bool,
}

/// A device id's hash (for [`Snapshot`]'s sorted entry index; equal strings are compared
/// on lookup, so collisions cost a comparison, never a wrong answer). The names come from
/// the API: `seed` is the snapshot's own random seed.
fn id_hash(seed: &foldhash::fast::RandomState, driver: &str, pool: &str, device: &str) -> u64 {
    seed.hash_one((driver, pool, device))
}

/// Numbers for the JSON text of values (the rarer parts of a device's signature: the API
/// types cannot be hashed), equal exactly when the texts are.
#[derive(Default)]
pub(crate) struct Texts {
    ids: HashMap<String, u32>,
    /// The text being looked up: written here, copied into `ids` only when it is new (was
    /// a fresh `String` per device).
    buf: Vec<u8>,
}

impl Texts {
    fn id(&mut self, value: &impl serde::Serialize) -> u32 {
        self.buf.clear();
        if serde_json::to_writer(&mut self.buf, value).is_err() {
            self.buf.clear();
        }
        let text = std::str::from_utf8(&self.buf).unwrap_or_default();
        if let Some(&id) = self.ids.get(text) {
            return id;
        }
        let id = self.ids.len() as u32;
        self.ids.insert(text.to_owned(), id);
        id
    }
}

/// Numbers for the rarer fields of devices' signatures (counters, capacity with request
/// policies, per-device placement, binding conditions): equal exactly when the fields are.
/// A device is found by a hash of some of those fields and compared with the first device
/// of that number field by field (was the fields' JSON text per device: serialising it was
/// 11% of the profile samples of `Snapshot::new` in benchmark e, where every device
/// consumes counters).
#[derive(Default)]
pub(crate) struct Rests<'a> {
    /// The fields come from the API: a seeded hash, so collisions cost comparisons only.
    seed: foldhash::fast::RandomState,
    /// (hash, number).
    table: HashTable<(u64, u32)>,
    /// Per number, the first device that had it.
    first: Vec<(&'a Device, &'a DeviceMaps)>,
}

impl<'a> Rests<'a> {
    fn id(&mut self, device: (&'a Device, &'a DeviceMaps)) -> u32 {
        let hash = self.hash(device);
        let first = &self.first;
        if let Some(&(_, id)) = self.table.find(hash, |&(h, id)| {
            h == hash && same_rest(first[id as usize], device)
        }) {
            return id;
        }
        let id = self.first.len() as u32;
        self.first.push(device);
        self.table.insert_unique(hash, (hash, id), |&(h, _)| h);
        id
    }

    /// A hash of the strings of the fields devices mostly differ in; [`same_rest`] decides.
    fn hash(&self, (device, maps): (&Device, &DeviceMaps)) -> u64 {
        let mut h = self.seed.build_hasher();
        for c in device.consumes_counters.iter().flatten() {
            h.write(c.counter_set.as_bytes());
            for (name, counter) in &c.counters {
                h.write(name.as_bytes());
                h.write(counter.value.0.as_bytes());
            }
        }
        for (name, c) in &maps.capacity {
            h.write(name.as_bytes());
            h.write(c.value.0.as_bytes());
        }
        h.write(device.node_name.as_deref().unwrap_or_default().as_bytes());
        h.finish()
    }
}

/// Whether two devices agree on every field [`Rests`] numbers.
fn same_rest((a, a_maps): (&Device, &DeviceMaps), (b, b_maps): (&Device, &DeviceMaps)) -> bool {
    a.all_nodes == b.all_nodes
        && a.binding_conditions == b.binding_conditions
        && a.binding_failure_conditions == b.binding_failure_conditions
        && a.binds_to_node == b.binds_to_node
        && a_maps.capacity == b_maps.capacity
        && a.consumes_counters == b.consumes_counters
        && a.node_allocatable_resources == b.node_allocatable_resources
        && a.node_name == b.node_name
        && a.node_selector == b.node_selector
}

/// The first name met twice (as upstream names it in its error), if any.
pub(crate) fn first_duplicate<'a>(names: impl Iterator<Item = &'a str> + Clone) -> Option<&'a str> {
    // Sorted, not hashed: a pool has a few devices, mostly.
    let mut sorted: Vec<&str> = names.clone().collect();
    sorted.sort_unstable();
    if !sorted.windows(2).any(|w| w[0] == w[1]) {
        return None;
    }
    let mut seen = HashSet::new();
    names.into_iter().find(|n| !seen.insert(*n))
}

/// Whether `device` has one of the rarer fields (counters, per-device placement, binding
/// conditions, capacity request policies) that [`signature`] compares field by field.
pub(crate) fn has_rare_fields(device: &Device, maps: &DeviceMaps) -> bool {
    // Every field of `Device` is named here, so a new one fails to compile until it is
    // placed: in the view (what CEL sees), or here and in `same_rest`. The attributes and
    // capacity are in `maps` (see [`crate::Slice`]).
    let Device {
        name: _,
        attributes: _,
        allow_multiple_allocations: _,
        taints: _,
        all_nodes,
        binding_conditions,
        binding_failure_conditions,
        binds_to_node,
        capacity: _,
        consumes_counters,
        node_allocatable_resources,
        node_name,
        node_selector,
    } = device;
    all_nodes.is_some()
        || binding_conditions.is_some()
        || binding_failure_conditions.is_some()
        || binds_to_node.is_some()
        || consumes_counters.is_some()
        || node_allocatable_resources.is_some()
        || node_name.is_some()
        || node_selector.is_some()
        || maps
            .capacity
            .iter()
            .any(|(_, c)| c.request_policy.is_some())
}

/// Everything but the name that makes two devices of one pool interchangeable, as numbers:
/// the slice's placement, the CEL view, taints (as text), and the rarer fields when the
/// device has some (`rare`, see [`has_rare_fields`]). The device is read only for those.
pub(crate) fn signature<'a>(
    texts: &mut Texts,
    rests: &mut Rests<'a>,
    placement: u32,
    view: u32,
    device: (&'a Device, &'a DeviceMaps),
    rare: bool,
    taints: &[DeviceTaint],
) -> [u32; 4] {
    let rest = if rare {
        rests.id(device)
    } else {
        crate::intern::ABSENT
    };
    let taints = if taints.is_empty() {
        crate::intern::ABSENT
    } else {
        let taints: Vec<_> = taints
            .iter()
            .map(|t| (&t.key, &t.value, &t.effect))
            .collect();
        texts.id(&taints)
    };
    [placement, view, rest, taints]
}

/// Where a slice's devices may be used, as [`signature`] compares it: driver, pool and,
/// unless the slice selects nodes per device, its node name, `allNodes` and node selector.
/// Borrowed from the slice and hashed as is (was JSON text per slice); only a node selector,
/// whose API type cannot be hashed, is written as JSON text, equal exactly when it is equal.
type PlacementKey<'a> = (
    &'a str,
    &'a str,
    Option<(Option<&'a str>, Option<bool>, Option<String>)>,
);

fn placement_key(spec: &ResourceSliceSpec) -> PlacementKey<'_> {
    let nodes = (!spec.per_device_node_selection.unwrap_or(false)).then(|| {
        (
            spec.node_name.as_deref(),
            spec.all_nodes,
            spec.node_selector
                .as_ref()
                .map(|s| serde_json::to_string(s).unwrap_or_default()),
        )
    });
    (&spec.driver, &spec.pool.name, nodes)
}

fn parse_q(
    q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity,
) -> Result<Quantity, String> {
    Quantity::from_openapi(q).map_err(|e| e.to_string())
}

pub(crate) fn parse_capacity(maps: &DeviceMaps) -> Result<Vec<Capacity>, String> {
    let mut out = Vec::new();
    for (name, cap) in &maps.capacity {
        let policy = cap.request_policy.as_ref();
        let range = match policy.and_then(|p| p.valid_range.as_ref()) {
            Some(r) => Some((
                parse_q(&r.min)?,
                r.max.as_ref().map(parse_q).transpose()?,
                r.step.as_ref().map(parse_q).transpose()?,
            )),
            None => None,
        };
        out.push(Capacity {
            name: name.clone(),
            value: parse_q(&cap.value)?,
            default: policy
                .and_then(|p| p.default.as_ref())
                .map(parse_q)
                .transpose()?,
            range,
            valid_values: policy
                .and_then(|p| p.valid_values.as_ref())
                .map(|v| v.iter().map(parse_q).collect::<Result<Vec<_>, _>>())
                .transpose()?
                .unwrap_or_default(),
            has_policy: policy.is_some(),
        });
    }
    Ok(out)
}

/// Counter consumption: (counter set, [(counter, amount)]).
pub(crate) type Consumption = Vec<(String, Vec<(String, Quantity)>)>;

fn parse_counters(device: &Device) -> Result<Consumption, String> {
    let mut out = Vec::new();
    for c in device.consumes_counters.iter().flatten() {
        let mut counters = Vec::new();
        for (name, v) in &c.counters {
            counters.push((name.clone(), parse_q(&v.value)?));
        }
        out.push((c.counter_set.clone(), counters));
    }
    Ok(out)
}

/// A device's taints: its own (`own`: its facts say it has some) and those of the rules
/// that match it. Most devices have none: the empty boxed slice is then made directly, as
/// moving an empty `Vec` into one stalls on the store of its fields just written.
/// The device is read only then (its slice's objects are not touched for most).
fn device_taints<'d>(
    own: bool,
    rules: &[DeviceTaintRule],
    spec: &ResourceSliceSpec,
    device: impl FnOnce() -> &'d Device,
) -> Box<[DeviceTaint]> {
    if !own && rules.is_empty() {
        return Box::default();
    }
    let device = device();
    let mut taints: Vec<DeviceTaint> = Vec::new();
    if own {
        taints.extend(device.taints.iter().flatten().cloned());
    }
    for rule in rules {
        if rule_matches(rule, &spec.driver, &spec.pool.name, &device.name) {
            taints.push(rule.spec.taint.clone());
        }
    }
    taints.into_boxed_slice()
}

fn rule_matches(rule: &DeviceTaintRule, driver: &str, pool: &str, device: &str) -> bool {
    let Some(sel) = rule.spec.device_selector.as_ref() else {
        return true;
    };
    sel.driver.as_deref().is_none_or(|d| d == driver)
        && sel.pool.as_deref().is_none_or(|p| p == pool)
        && sel.device.as_deref().is_none_or(|n| n == device)
}

impl Snapshot {
    pub fn new(input: SnapshotInput) -> Snapshot {
        let SnapshotInput {
            classes,
            slices,
            taint_rules,
            allocations,
            features,
            selector_cache,
        } = input;
        // A cache whose numbering is full is left to the snapshots still using it.
        let cache = selector_cache
            .filter(|c| c.options == features.list_type_attributes && !c.numbering.full())
            .unwrap_or_else(|| Arc::new(SelectorCache::new(features.list_type_attributes)));
        // Worked out when the slices were received: only slices of another numbering (one
        // that filled up since) are worked out here.
        let facts: Vec<_> = slices.iter().map(|s| s.facts(&cache.numbering)).collect();
        let n_devices = facts.iter().map(|f| f.devices.len()).sum();
        let mut maps_node_resources = false;
        let mut texts = Texts::default();
        let mut rests = Rests::default();
        let mut placements: HashMap<PlacementKey<'_>, u32> = HashMap::new();
        let mut devices = Vec::with_capacity(n_devices);
        let mut slice_devices = Vec::with_capacity(slices.len());
        let id_seed = foldhash::fast::RandomState::default();
        let mut node_slices: Vec<(u64, u32)> = Vec::new();
        let mut sigs: NumMap<[u32; 4], u32> = NumMap::default();
        let mut numa_values: Vec<crate::attr::AttrValue> = Vec::new();
        let mut shared_slices = Vec::new();
        let mut numa_ids: HashMap<crate::attr::AttrValue, u32> = HashMap::new();
        let mut compat_slices: Vec<bool> = Vec::with_capacity(slices.len());
        // The NUMA id of each value number met under NUMA_ATTRIBUTE.
        let mut numa_by_value: NumMap<u32, Option<u32>> = NumMap::default();
        // Recent (value number, NUMA id) pairs, by the value number's low bits: a node's
        // few NUMA values repeat on every node, so most devices skip the map.
        let mut numa_memo = [(crate::intern::ABSENT, None); 4];
        // Sorted by (driver, pool), then input order: one sort, no map entry per pool.
        let keyed = pool_sorted(&slices);
        let mut slice_pool = vec![0u32; slices.len()];
        let mut pool_ranges: Vec<(u32, u32)> = Vec::new();
        for (i, &(driver, pool, si)) in keyed.iter().enumerate() {
            let next = i.checked_sub(1).is_none_or(|p| {
                let (d, p, _) = keyed[p];
                (d, p) != (driver, pool)
            });
            if next {
                pool_ranges.push((i as u32, i as u32));
            }
            let last = pool_ranges.last_mut().expect("pushed");
            last.1 += 1;
            slice_pool[si as usize] = pool_ranges.len() as u32 - 1;
        }
        let pool_order: Vec<u32> = keyed.iter().map(|&(_, _, si)| si).collect();
        drop(keyed);
        // Per slice its placement, and per placement how many slices have it. A placement
        // names the pool, so the slice alone in its pool (most) is alone with its
        // placement: no key is built for it.
        let mut slice_placement = vec![0u32; slices.len()];
        let mut placement_slices: Vec<u32> = Vec::new();
        for &(from, to) in &pool_ranges {
            for &si in &pool_order[from as usize..to as usize] {
                let placement = if to - from == 1 {
                    placement_slices.len() as u32
                } else {
                    let next = placement_slices.len() as u32;
                    let key = placement_key(&slices[si as usize].spec);
                    *placements.entry(key).or_insert(next)
                };
                if placement as usize == placement_slices.len() {
                    placement_slices.push(0);
                }
                placement_slices[placement as usize] += 1;
                slice_placement[si as usize] = placement;
            }
        }
        let mut next_sym = 0;
        for (si, (slice, facts)) in slices.iter().zip(&facts).enumerate() {
            let spec = &slice.spec;
            let start = devices.len() as u32;
            let placement = slice_placement[si];
            // A slice alone with its placement and untouched by taint rules: its devices'
            // signatures are those it was received with (numbered within it), offset.
            let local_syms = (placement_slices[placement as usize] == 1 && taint_rules.is_empty())
                .then(|| {
                    let base = next_sym;
                    next_sym += facts.syms;
                    base
                });
            let api_devices = spec.devices.as_deref().unwrap_or_default();
            for (di, f) in facts.devices.iter().enumerate() {
                // The device itself is read only where its facts say there is more to see.
                let device = || (&api_devices[di], slice.maps(di));
                let taints = device_taints(f.taints, &taint_rules, spec, || device().0);
                maps_node_resources |= f.node_resources;
                let view = f.view;
                let mut numa_of = |v: crate::attr::AttrValue| match numa_ids.get(&v) {
                    Some(&id) => id,
                    None => {
                        let id = numa_ids.len() as u32;
                        numa_ids.insert(v.clone(), id);
                        numa_values.push(v);
                        id
                    }
                };
                let lookup = || crate::attr::lookup(device().1, &spec.driver, NUMA_ATTRIBUTE);
                let numa = if spec.driver == NUMA_DOMAIN {
                    // The unqualified `numaNode` counts too.
                    lookup().map(&mut numa_of)
                } else if f.numa == crate::intern::ABSENT {
                    None
                } else if let memo = &mut numa_memo[f.numa as usize % 4]
                    && memo.0 == f.numa
                {
                    memo.1
                } else {
                    // Only the qualified name counts, and equal value numbers are equal
                    // attributes, so each is converted once.
                    let id = *numa_by_value
                        .entry(f.numa)
                        .or_insert_with(|| lookup().map(&mut numa_of));
                    numa_memo[f.numa as usize % 4] = (f.numa, id);
                    id
                };
                let sym = match local_syms {
                    Some(base) => base + f.sym,
                    None => *sigs
                        .entry(signature(
                            &mut texts,
                            &mut rests,
                            placement,
                            view.id,
                            device(),
                            f.rare_fields,
                            &taints,
                        ))
                        .or_insert_with(|| {
                            next_sym += 1;
                            next_sym - 1
                        }),
                };
                devices.push(DeviceEntry {
                    slice: si as u32,
                    index: di as u32,
                    parsed: f.parsed,
                    numa,
                    binding_conditions: f.binding_conditions,
                    node_resources: f.node_resources,
                    per_device: spec.per_device_node_selection == Some(true),
                    skip_node_operations: spec
                        .skip_node_operations
                        .as_ref()
                        .is_some_and(|s| !s.is_empty()),
                    plain_parsed: f.plain_parsed,
                    sym,
                    view,
                    sel: AtomicU64::new(0),
                    taints,
                });
            }
            slice_devices.push((start, devices.len() as u32));
            // DRADeviceCompatibilityGroups is off in 1.37: such slices are ignored (their pool
            // then looks incomplete), as upstream does.
            let ignored = facts.uses_groups && !features.compatibility_groups;
            compat_slices.push(ignored);
            if ignored {
                continue;
            }
            match spec.node_name.as_deref() {
                Some(n) if !n.is_empty() => node_slices.push((id_seed.hash_one(n), si as u32)),
                _ => shared_slices.push(si as u32),
            }
        }
        node_slices.sort_unstable();
        let pool_keys_len = pool_ranges.len();
        let mut snapshot = Snapshot {
            features,
            cache,
            classes: classes
                .into_iter()
                .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
                .collect(),
            slice_info: slices
                .iter()
                .zip(&facts)
                .zip(&slice_pool)
                .map(|((s, f), &pool)| SliceInfo {
                    pool,
                    generation: s.spec.pool.generation,
                    partitionable_only: f.partitionable_only,
                })
                .collect(),
            numa_values,
            slices,
            devices,
            facts,
            slice_devices,
            node_slices,
            shared_slices,
            pool_order,
            pool_ranges,
            compat_slices,
            usage: HashMap::new(),
            entry_usage: Vec::new(),
            id_entries: OnceLock::new(),
            id_seed,
            pool_cache: Vec::new(),
            maps_node_resources,
            id: {
                static NEXT: AtomicU64 = AtomicU64::new(1);
                NEXT.fetch_add(1, Ordering::Relaxed)
            },
            pool_versions: vec![0; pool_keys_len],
            shared_pools: Vec::new(),
        };
        let mut shared_pools: Vec<u32> = snapshot
            .shared_slices
            .iter()
            .map(|&s| snapshot.slice_info[s as usize].pool)
            .collect();
        shared_pools.sort_unstable();
        shared_pools.dedup();
        snapshot.shared_pools = shared_pools;
        let mut cache = Vec::with_capacity(snapshot.pool_ranges.len());
        for pi in 0..snapshot.pool_ranges.len() as u32 {
            let all = snapshot.pool_slices(pi);
            cache.push(None);
            let newest = all
                .iter()
                .map(|&s| snapshot.slices[s as usize].spec.pool.generation)
                .max();
            let Some(generation) = newest else { continue };
            let same: Vec<u32> = all
                .iter()
                .copied()
                .filter(|&s| snapshot.slices[s as usize].spec.pool.generation == generation)
                .filter(|&s| !snapshot.compat_slices[s as usize])
                .collect();
            if same.is_empty() {
                continue;
            }
            if same.len() as i64
                != snapshot.slices[same[0] as usize]
                    .spec
                    .pool
                    .resource_slice_count
            {
                continue;
            }
            let n = same.len();
            let stat = snapshot.build_static(pi, same, Vec::new());
            cache[pi as usize] = Some((generation, n, Arc::new(stat)));
        }
        snapshot.pool_cache = cache;
        for a in &allocations {
            snapshot.add_allocation(a);
        }
        snapshot
    }

    pub fn features(&self) -> &Features {
        &self.features
    }

    pub fn class(&self, name: &str) -> Option<&DeviceClass> {
        self.classes.get(name)
    }

    /// Records an allocation (an allocated claim, or one assumed in flight).
    /// Admin-access results are not counted, as upstream.
    pub fn add_allocation(&mut self, allocation: &AllocationResult) {
        self.apply_allocation(allocation, true)
    }

    /// Forgets an allocation recorded with [`Snapshot::add_allocation`].
    pub fn remove_allocation(&mut self, allocation: &AllocationResult) {
        self.apply_allocation(allocation, false)
    }

    fn apply_allocation(&mut self, allocation: &AllocationResult, add: bool) {
        let results = allocation.devices.as_ref().and_then(|d| d.results.as_ref());
        for r in results.into_iter().flatten() {
            if r.admin_access == Some(true) {
                continue;
            }
            let id = DeviceId {
                driver: r.driver.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
            };
            let usage = self.usage.entry(id.clone()).or_default();
            let step = |v: &mut u32| *v = if add { *v + 1 } else { v.saturating_sub(1) };
            if r.share_id.is_some() {
                step(&mut usage.shares);
                for (name, q) in r.consumed_capacity.iter().flatten() {
                    let q = Quantity::from_openapi(q).unwrap_or_default();
                    let e = usage.consumed.entry(name.clone()).or_default();
                    if add {
                        *e += q;
                    } else {
                        *e -= q;
                    }
                }
                if !add && usage.shares == 0 {
                    usage.consumed.clear();
                }
            } else {
                step(&mut usage.exclusive);
            }
            let now = (!usage.is_empty()).then(|| usage.clone());
            if now.is_none() {
                self.usage.remove(&id);
            }
            let h = id_hash(&self.id_seed, &id.driver, &id.pool, &id.device);
            if self.entry_usage.is_empty() {
                self.entry_usage = vec![None; self.devices.len()];
            }
            let (from, to) = {
                let ids = self.id_entries();
                (ids.partition_point(|&(x, _)| x < h), ids.len())
            };
            for i in from..to {
                let (x, e) = self.id_entries()[i];
                if x != h {
                    break;
                }
                let (slice, device) = self.device(e);
                if slice.spec.driver == id.driver
                    && slice.spec.pool.name == id.pool
                    && device.name == id.device
                {
                    self.entry_usage[e as usize] = now.clone();
                    let pool = self.slice_info[self.devices[e as usize].slice as usize].pool;
                    self.pool_versions[pool as usize] += 1;
                }
            }
        }
    }

    /// Which snapshot this is: unique in the process, the same after allocations are added
    /// or removed (see [`Snapshot::pools_stamp`]).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The slices listed under `node`'s name (`nodeName`), in input order.
    fn node_slices<'s>(&'s self, node: &'s str) -> impl Iterator<Item = u32> + 's {
        let h = self.id_seed.hash_one(node);
        let from = self.node_slices.partition_point(|&(x, _)| x < h);
        self.node_slices[from..]
            .iter()
            .take_while(move |&&(x, _)| x == h)
            .map(|&(_, s)| s)
            .filter(move |&s| self.slices[s as usize].spec.node_name.as_deref() == Some(node))
    }

    /// The slices of pool `pool`, in input order.
    fn pool_slices(&self, pool: u32) -> &[u32] {
        let (start, end) = self.pool_ranges[pool as usize];
        &self.pool_order[start as usize..end as usize]
    }

    /// A slice of pool `pool`: its driver and pool name name the pool.
    fn pool_named_by(&self, pool: u32) -> &Arc<crate::Slice> {
        &self.slices[self.pool_slices(pool)[0] as usize]
    }

    /// The pools `node` may see: its own slices' pools, and every pool of slices not tied
    /// to one node (numbers for [`Snapshot::pools_stamp`], valid in this snapshot).
    pub fn node_pools(&self, node: &str) -> Vec<u32> {
        let mut pools: Vec<u32> = self
            .node_slices(node)
            .map(|s| self.slice_info[s as usize].pool)
            .chain(self.shared_pools.iter().copied())
            .collect();
        pools.sort_unstable();
        pools.dedup();
        pools
    }

    /// Changes whenever an allocation is added to or removed from one of `pools`: an
    /// answer for a node found with the stamp of its [`Snapshot::node_pools`], on this
    /// snapshot ([`Snapshot::id`]), for the same claims and the same Node object, is still
    /// the answer while the stamp is the same.
    pub fn pools_stamp(&self, pools: &[u32]) -> u64 {
        // Versions only grow, so the sum changes whenever one of them does.
        pools.iter().map(|&p| self.pool_versions[p as usize]).sum()
    }

    /// The value of `resource.kubernetes.io/numaNode` behind a [`DeviceEntry::numa`] id.
    pub(crate) fn numa_value(&self, id: u32) -> &crate::attr::AttrValue {
        &self.numa_values[id as usize]
    }

    /// The capacity and counters of device `entry`, parsed.
    pub(crate) fn parsed(&self, entry: u32) -> &Parsed {
        let e = &self.devices[entry as usize];
        &self.facts[e.slice as usize].parsed[e.parsed as usize]
    }

    pub(crate) fn entry_usage(&self, entry: u32) -> Option<&Usage> {
        self.entry_usage.get(entry as usize)?.as_ref()
    }

    /// [`Snapshot::id_entries`], built on first use.
    fn id_entries(&self) -> &[(u64, u32)] {
        self.id_entries.get_or_init(|| {
            let mut id_entries: Vec<(u64, u32)> = (0..self.devices.len() as u32)
                .map(|entry| {
                    let (slice, device) = self.device(entry);
                    let spec = &slice.spec;
                    (
                        id_hash(&self.id_seed, &spec.driver, &spec.pool.name, &device.name),
                        entry,
                    )
                })
                .collect();
            id_entries.sort_unstable();
            id_entries
        })
    }

    pub(crate) fn device(&self, entry: u32) -> (&ResourceSlice, &Device) {
        let e = &self.devices[entry as usize];
        let slice = &self.slices[e.slice as usize];
        (
            slice,
            &slice.spec.devices.as_ref().expect("entry exists")[e.index as usize],
        )
    }

    /// The attributes and capacity of a device entry (not in its API object: see [`crate::Slice`]).
    pub(crate) fn maps(&self, entry: u32) -> &crate::DeviceMaps {
        let e = &self.devices[entry as usize];
        self.slices[e.slice as usize].maps(e.index as usize)
    }

    /// What CEL sees of a device entry.
    pub(crate) fn device_ref(&self, entry: u32) -> dra_cel::DeviceRef<'_> {
        let (slice, device) = self.device(entry);
        self.maps(entry).device_ref(&slice.spec.driver, device)
    }

    pub(crate) fn device_id(&self, entry: u32) -> DeviceId {
        let (slice, device) = self.device(entry);
        DeviceId {
            driver: slice.spec.driver.clone(),
            pool: slice.spec.pool.name.clone(),
            device: device.name.clone(),
        }
    }

    pub(crate) fn expr_id(&self, expression: &str) -> u32 {
        let ids = &self.cache.expr_ids;
        if let Some(id) = ids.read().expect("not poisoned").get(expression) {
            return *id;
        }
        let mut ids = ids.write().expect("not poisoned");
        let next = ids.len() as u32;
        *ids.entry(expression.to_string()).or_insert(next)
    }

    /// The result for selector `expr` on device `entry`, if known. With `reads` (what the
    /// expression reads, see [`crate::reads`]) devices that agree on those share a result.
    pub(crate) fn cached_selector(
        &self,
        expr: u32,
        entry: u32,
        reads: Option<&[ReadIds]>,
    ) -> Option<bool> {
        let e = &self.devices[entry as usize];
        if let Some(known) = e.known_selector(expr) {
            return Some(known);
        }
        let hit = match reads {
            Some(reads) => self.read_result(expr, entry, reads),
            None => self
                .shard(expr, e.view.id)
                .read()
                .expect("not poisoned")
                .get(&(expr, e.view.id))
                .copied(),
        };
        if let Some(b) = hit {
            self.remember_here(expr, entry, reads, b);
        }
        hit
    }

    /// The cached result for what `reads` sees of a device: this thread's last one when
    /// the device reads the same (compared in place: no key built), else the shared map's.
    fn read_result(&self, expr: u32, entry: u32, reads: &[ReadIds]) -> Option<bool> {
        let e = &self.devices[entry as usize];
        let pairs = self.read_pairs(e, reads);
        READ_KEY
            .with_borrow_mut(|(_, last)| last.holds(self.cache.id, expr, &e.view, pairs, reads))
            .or_else(|| {
                self.with_read_key(expr, entry, reads, |last, key| {
                    let hit = self
                        .read_shard(key)
                        .read()
                        .expect("not poisoned")
                        .get(key)
                        .copied();
                    if let Some(b) = hit {
                        last.remember(self.cache.id, key, b);
                    }
                    hit
                })
            })
    }

    /// Runs `f` with this thread's last read-key result and the key for what `reads` sees
    /// of a device (per-thread buffers: no allocation per lookup).
    fn with_read_key<T>(
        &self,
        expr: u32,
        entry: u32,
        reads: &[ReadIds],
        f: impl FnOnce(&mut LastRead, &[u32]) -> T,
    ) -> T {
        let e = &self.devices[entry as usize];
        let (view, pairs) = (&e.view, self.read_pairs(e, reads));
        READ_KEY.with_borrow_mut(|(buf, last)| {
            buf.clear();
            buf.extend(read_key_head(expr, view));
            buf.extend(reads.iter().map(|r| view.value(pairs, r)));
            f(last, buf)
        })
    }

    /// The pairs `reads` are looked up in: none when the expression reads nothing beyond
    /// the driver (the usual class selector), so its slice's facts are not touched (in a
    /// fresh snapshot, a memory miss per node).
    fn read_pairs(&self, e: &DeviceEntry, reads: &[ReadIds]) -> &[(u32, u32)] {
        if reads.is_empty() {
            &[]
        } else {
            &self.facts[e.slice as usize].pairs
        }
    }

    fn read_shard(&self, key: &[u32]) -> &RwLock<ReadShard> {
        let h = foldhash::fast::FixedState::default().hash_one(key);
        &self.cache.read_results[h as usize % CACHE_SHARDS]
    }

    fn shard(&self, expr: u32, view: u32) -> &RwLock<ResultShard> {
        &self.cache.results[(view as usize ^ expr as usize) % CACHE_SHARDS]
    }

    /// Records the result in the device's first-level cache, and in that of the devices
    /// after it in its slice that agree on what the expression reads (`reads`, see
    /// [`crate::reads`]), up to the first that does not, or that has a result already: a
    /// slice's devices mostly agree (every GPU of a node is the same model), so the rest of
    /// them skip the lookup. Each device is filled at most once per expression, whatever
    /// order the devices are looked at in.
    fn remember_here(&self, expr: u32, entry: u32, reads: Option<&[ReadIds]>, matches: bool) {
        if expr >= SEL_BITS {
            return;
        }
        let bits = 1 << expr | u64::from(matches) << (SEL_BITS + expr);
        let e = &self.devices[entry as usize];
        e.sel.fetch_or(bits, Ordering::Relaxed);
        let Some(reads) = reads else { return };
        let pairs = self.read_pairs(e, reads);
        let head = read_key_head(expr, &e.view);
        let (_, to) = self.slice_devices[e.slice as usize];
        for other in &self.devices[entry as usize + 1..to as usize] {
            let same = other.known_selector(expr).is_none()
                && read_key_head(expr, &other.view) == head
                && reads
                    .iter()
                    .all(|r| other.view.value(pairs, r) == e.view.value(pairs, r));
            if !same {
                break;
            }
            other.sel.fetch_or(bits, Ordering::Relaxed);
        }
    }

    pub(crate) fn cache_selector(
        &self,
        expr: u32,
        entry: u32,
        reads: Option<&[ReadIds]>,
        matches: bool,
    ) {
        self.remember_here(expr, entry, reads, matches);
        match reads {
            Some(reads) => self.with_read_key(expr, entry, reads, |last, key| {
                last.remember(self.cache.id, key, matches);
                let mut map = self.read_shard(key).write().expect("not poisoned");
                if map.len() >= CACHE_SHARD_LIMIT {
                    map.clear();
                }
                map.insert(key.into(), matches);
            }),
            None => {
                let view = self.devices[entry as usize].view.id;
                let mut map = self.shard(expr, view).write().expect("not poisoned");
                if map.len() >= CACHE_SHARD_LIMIT {
                    map.clear();
                }
                map.insert((expr, view), matches);
            }
        }
    }

    /// What an expression reads (see [`crate::reads`]), as the numbers of this snapshot's
    /// selector cache.
    pub(crate) fn resolve_reads(&self, reads: &[crate::reads::Read]) -> Vec<ReadIds> {
        self.cache.numbering.read().reads(reads)
    }

    /// The devices of the snapshot with this driver, pool and name, each with its slice
    /// (more than one only where slices of a pool repeat a name).
    pub fn devices_named<'s, 'a>(
        &'s self,
        driver: &'a str,
        pool: &'a str,
        name: &'a str,
    ) -> impl Iterator<Item = (&'s ResourceSlice, &'s Device)> + use<'s, 'a> {
        let h = id_hash(&self.id_seed, driver, pool, name);
        let ids = self.id_entries();
        let from = ids.partition_point(|&(x, _)| x < h);
        ids[from..]
            .iter()
            .take_while(move |&&(x, _)| x == h)
            .map(|&(_, e)| self.device(e))
            .filter(move |(slice, device)| {
                slice.spec.driver == driver && slice.spec.pool.name == pool && device.name == name
            })
    }

    /// Whether some device maps node allocatable resources (`nodeAllocatableResources`):
    /// only then does a scheduler have anything of DRANodeAllocatableResources to count.
    pub fn maps_node_resources(&self) -> bool {
        self.maps_node_resources
    }

    /// A derived attribute's expression, compiled by the snapshot's CEL environment (which
    /// caches it).
    pub(crate) fn compile_derived(
        &self,
        expression: &str,
    ) -> Result<Arc<dra_cel::Selector>, dra_cel::CelError> {
        self.cache.env.compile_derived(expression)
    }

    /// Compiles a selector expression. Compiled programs are shared by every snapshot in
    /// the process (as Kubernetes keeps one CEL compile cache per process): a fresh
    /// snapshot evaluates selectors anew but does not compile them again. With what the
    /// expression's text reads of a device ([`crate::reads`]), worked out once per
    /// expression as part of compiling it.
    pub(crate) fn compile(&self, expression: &str) -> Result<Compiled, dra_cel::CelError> {
        /// Per `list_type_attributes` option; expressions are text from the API.
        type Shared = [RwLock<HashMap<String, Compiled>>; 2];
        static SHARED: std::sync::OnceLock<Shared> = std::sync::OnceLock::new();
        /// Selectors come from DeviceClasses and claims: a cluster stays far below this.
        const LIMIT: usize = 10_000;
        let shared = &SHARED.get_or_init(Default::default)[usize::from(self.cache.options)];
        if let Some(c) = shared.read().expect("not poisoned").get(expression) {
            return Ok(c.clone());
        }
        let compiled = Compiled {
            selector: self.cache.env.compile(expression)?,
            reads: crate::reads::reads(expression).map(Arc::from),
        };
        let mut map = shared.write().expect("not poisoned");
        if map.len() >= LIMIT {
            map.clear();
        }
        map.insert(expression.to_string(), compiled.clone());
        Ok(compiled)
    }

    /// The compiled selectors and results, to hand to the next snapshot.
    pub fn selector_cache(&self) -> Arc<SelectorCache> {
        Arc::clone(&self.cache)
    }

    /// The pools a node sees, in upstream order, with their devices, into `pools` (empty);
    /// `seen` is a buffer.
    pub(crate) fn gather_pools(
        &self,
        node: &Node,
        pools: &mut Vec<PoolInfo>,
        seen: &mut Vec<(u32, i64, u32)>,
    ) -> Result<(), AllocError> {
        let node_name = node.metadata.name.as_deref().unwrap_or_default();
        let features = &self.features;
        // (pool index = search rank, generation, slice) of every slice the node sees.
        seen.clear();
        // Slices listed under the node's name target it by `nodeName`: nothing to check.
        for si in self.node_slices(node_name) {
            let info = self.slice_info[si as usize];
            if !features.partitionable_devices && info.partitionable_only {
                continue;
            }
            seen.push((info.pool, info.generation, si));
        }
        for &si in &self.shared_slices {
            let info = self.slice_info[si as usize];
            if !features.partitionable_devices && info.partitionable_only {
                continue;
            }
            let slice = &self.slices[si as usize];
            let spec = &slice.spec;
            let slice_err = |e: crate::nodesel::NodeSelectorError| AllocError::InvalidSlice {
                slice: slice.metadata.name.clone().unwrap_or_default(),
                message: e.to_string(),
            };
            let is_relevant = if spec.all_nodes == Some(true) {
                true
            } else if let Some(sel) = &spec.node_selector {
                node_matches(node, sel).map_err(slice_err)?
            } else if spec.per_device_node_selection == Some(true) {
                let mut any = false;
                for d in spec.devices.iter().flatten() {
                    if device_node_matches(node, d).map_err(slice_err)? {
                        any = true;
                        break;
                    }
                }
                any
            } else {
                false
            };
            if is_relevant {
                seen.push((info.pool, info.generation, si));
            }
        }
        // Stable: slices of one pool keep the order they were met in.
        seen.sort_by_key(|t| t.0);

        let mut with_binding = Vec::new();
        let mut rest = seen.as_slice();
        while let Some(&(pi, _, _)) = rest.first() {
            let n_all = rest.iter().take_while(|t| t.0 == pi).count();
            let (group, tail) = rest.split_at(n_all);
            rest = tail;
            // Only the newest generation the node sees counts.
            let generation = group.iter().map(|t| t.1).max().expect("not empty");
            let newest = || group.iter().filter(|t| t.1 == generation).map(|t| t.2);
            let n = newest().count();
            let first = newest().next().expect("not empty");
            let count = self.slices[first as usize].spec.pool.resource_slice_count;
            let mut not_targeting = Vec::new();
            if n as i64 != count {
                let all = self.pool_slices(pi);
                if all
                    .iter()
                    .any(|&s| self.slice_info[s as usize].generation > generation)
                {
                    continue; // obsolete: a newer generation exists elsewhere
                }
                let same: Vec<u32> = all
                    .iter()
                    .copied()
                    .filter(|&s| self.slice_info[s as usize].generation == generation)
                    .filter(|&s| !self.compat_slices[s as usize])
                    .collect();
                if same.len() as i64 != count {
                    pools.push(PoolInfo::broken(
                        self.pool_named_by(pi),
                        PoolState::Incomplete,
                    ));
                    continue;
                }
                not_targeting = same
                    .into_iter()
                    .filter(|s| !newest().any(|t| t == *s))
                    .collect();
            }
            let cached = self.pool_cache[pi as usize]
                .as_ref()
                .filter(|(g, c, _)| *g == generation && *c == n && not_targeting.is_empty());
            let stat = match cached {
                Some((_, _, s)) => Arc::clone(s),
                None => Arc::new(self.build_static(pi, newest().collect(), not_targeting)),
            };
            let info = self.instantiate(stat);
            if info.has_binding_conditions {
                with_binding.push(info);
            } else {
                pools.push(info);
            }
        }
        pools.extend(with_binding);
        Ok(())
    }

    /// The node-independent part of a pool: slices sorted by name, validity, shared
    /// counters flattened, each device's consumption resolved.
    fn build_static(&self, pi: u32, mut slices: Vec<u32>, not_targeting: Vec<u32>) -> PoolStatic {
        slices.sort_by(|a, b| {
            self.slices[*a as usize]
                .metadata
                .name
                .cmp(&self.slices[*b as usize].metadata.name)
        });
        let has_counters =
            |s: u32| self.features.partitionable_devices && self.facts[s as usize].shared_counters;
        let (mut device_slices, mut counter_slices, mut other_slices): (
            Vec<u32>,
            Vec<u32>,
            Vec<u32>,
        ) = Default::default();
        if slices
            .iter()
            .chain(&not_targeting)
            .any(|&s| has_counters(s))
        {
            for &s in &slices {
                if has_counters(s) {
                    counter_slices.push(s)
                } else {
                    device_slices.push(s)
                }
            }
            for &s in &not_targeting {
                if has_counters(s) {
                    counter_slices.push(s)
                } else {
                    other_slices.push(s)
                }
            }
        } else {
            // No shared counters (most pools): the lists are the ones given.
            (device_slices, other_slices) = (slices, not_targeting);
        }
        let mut info = PoolStatic::new(self.pool_named_by(pi), PoolState::Usable);
        let twice = match device_slices.as_slice() {
            // Known since the slice was received: the pool of one slice (most) reads no name.
            [one] => self.facts[*one as usize].duplicate_name.as_deref(),
            _ => first_duplicate(
                device_slices
                    .iter()
                    .flat_map(|&s| self.slices[s as usize].spec.devices.iter().flatten())
                    .map(|d| d.name.as_str()),
            ),
        };
        if let Some(twice) = twice {
            info.state = PoolState::Invalid(format!("duplicate device name {twice}"));
            return info;
        }
        if self.features.partitionable_devices {
            let mut sets: HashMap<&str, usize> = HashMap::new();
            let mut index: HashMap<(&str, &str), usize> = HashMap::new();
            for &s in &counter_slices {
                for set in self.slices[s as usize]
                    .spec
                    .shared_counters
                    .iter()
                    .flatten()
                {
                    if sets.insert(set.name.as_str(), sets.len()).is_some() {
                        info.state =
                            PoolState::Invalid(format!("duplicate counter set name {}", set.name));
                        return info;
                    }
                    let ordinal = (sets.len() - 1) as u32;
                    for (counter, value) in &set.counters {
                        index.insert((set.name.as_str(), counter.as_str()), info.base.len());
                        info.counter_set.push(ordinal);
                        info.base
                            .push(Quantity::from_openapi(&value.value).unwrap_or_default());
                    }
                }
            }
            for &s in device_slices.iter().chain(other_slices.iter()) {
                if !self.facts[s as usize].consumes_counters {
                    continue;
                }
                let (a, b) = self.slice_devices[s as usize];
                for entry in a..b {
                    let mut flat = Vec::new();
                    for (set, counters) in &self.parsed(entry).counters {
                        if !sets.contains_key(set.as_str()) {
                            info.state = PoolState::Invalid(format!("counter set {set} not found"));
                            return info;
                        }
                        for (c, q) in counters {
                            let Some(&i) = index.get(&(set.as_str(), c.as_str())) else {
                                info.state = PoolState::Invalid(format!(
                                    "counter {c} not found in counter set {set}"
                                ));
                                return info;
                            };
                            flat.push((i, *q));
                        }
                    }
                    if !flat.is_empty() {
                        info.consumes.insert(entry, flat);
                    }
                }
            }
            if self.features.compatibility_groups {
                self.compat_of(&mut info, &sets, device_slices.iter().chain(&other_slices));
            }
        }
        for &s in &device_slices {
            let (a, b) = self.slice_devices[s as usize];
            info.has_binding_conditions |= self.facts[s as usize].binding_conditions;
            info.entries.extend(a..b);
        }
        info
    }

    /// A pool as seen now: counters minus what allocated devices consume.
    fn instantiate(&self, s: Arc<PoolStatic>) -> PoolInfo {
        let mut available = s.base.clone();
        if !available.is_empty() {
            for (entry, flat) in &s.consumes {
                if self.entry_usage(*entry).is_some() {
                    for (i, q) in flat {
                        available[*i] -= *q;
                    }
                }
            }
        }
        let mut compat_base = Vec::new();
        if !s.compat.is_empty() {
            let sets = s
                .counter_set
                .iter()
                .map(|&c| c as usize + 1)
                .max()
                .unwrap_or(0);
            compat_base.resize(sets, crate::compat::Intersection::default());
            let mut allocated: Vec<u32> = s
                .compat
                .keys()
                .copied()
                .filter(|e| self.entry_usage(*e).is_some())
                .collect();
            allocated.sort_unstable();
            for entry in allocated {
                for (set, groups) in &s.compat[&entry] {
                    if let Some(base) = compat_base.get_mut(*set as usize) {
                        *base = base.add(groups);
                    }
                }
            }
        }
        PoolInfo {
            s,
            available,
            compat_base,
        }
    }

    /// Each device's compatibility groups per counter set it consumes, where some device of
    /// the pool declares groups (else every device is compatible with every other).
    fn compat_of<'s>(
        &self,
        info: &mut PoolStatic,
        sets: &HashMap<&str, usize>,
        slices: impl Iterator<Item = &'s u32>,
    ) {
        let mut names: HashMap<&str, u32> = HashMap::new();
        let mut any = false;
        for &s in slices {
            let (a, _) = self.slice_devices[s as usize];
            for (k, device) in self.slices[s as usize]
                .spec
                .devices
                .iter()
                .flatten()
                .enumerate()
            {
                let mut per_set = Vec::new();
                for c in device.consumes_counters.iter().flatten() {
                    let Some(&set) = sets.get(c.counter_set.as_str()) else {
                        continue;
                    };
                    let mut ids: Vec<u32> = c
                        .compatibility_groups
                        .iter()
                        .flatten()
                        .map(|g| {
                            let next = names.len() as u32;
                            *names.entry(g.as_str()).or_insert(next)
                        })
                        .collect();
                    ids.sort_unstable();
                    ids.dedup();
                    any |= !ids.is_empty();
                    per_set.push((set as u32, crate::compat::Groups::new(&ids)));
                }
                if !per_set.is_empty() {
                    info.compat.insert(a + k as u32, per_set);
                }
            }
        }
        if !any {
            info.compat.clear();
        }
    }
}

/// Per-device node placement for slices with `perDeviceNodeSelection`.
pub(crate) fn device_node_matches(
    node: &Node,
    d: &Device,
) -> Result<bool, crate::nodesel::NodeSelectorError> {
    let node_name = node.metadata.name.as_deref().unwrap_or_default();
    match (&d.node_name, d.all_nodes, &d.node_selector) {
        (Some(n), _, _) if !n.is_empty() => Ok(n == node_name),
        (_, Some(true), _) => Ok(true),
        (_, _, Some(sel)) => node_matches(node, sel),
        _ => Ok(false),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PoolState {
    Usable,
    Incomplete,
    Invalid(String),
}

/// Every slice as (driver, pool, its index), sorted. Strings are compared only where the
/// cheap keys tie: drivers (few) by rank, pool names first by their first 8 bytes.
fn pool_sorted(slices: &[Arc<crate::Slice>]) -> Vec<(&str, &str, u32)> {
    let mut drivers: Vec<&str> = Vec::new();
    for s in slices {
        let d = s.spec.driver.as_str();
        if drivers.last() != Some(&d) && !drivers.contains(&d) {
            drivers.push(d);
        }
    }
    drivers.sort_unstable();
    let rank = |d: &str| drivers.iter().position(|&x| x == d).expect("listed") as u32;
    let mut keyed: Vec<(u32, u64, &str, u32)> = Vec::with_capacity(slices.len());
    let mut last: Option<(&str, u32)> = None;
    for (i, s) in slices.iter().enumerate() {
        let d = s.spec.driver.as_str();
        let r = match last {
            Some((x, r)) if x == d => r,
            _ => rank(d),
        };
        last = Some((d, r));
        let pool = s.spec.pool.name.as_str();
        keyed.push((r, name_prefix(pool), pool, i as u32));
    }
    // Equal prefixes order as the names do (a name's end pads with zeros, below any
    // byte but zero, where the names tie anyway), so the full order is the strings'.
    keyed.sort_unstable_by(|a, b| {
        (a.0, a.1)
            .cmp(&(b.0, b.1))
            .then_with(|| (a.2, a.3).cmp(&(b.2, b.3)))
    });
    keyed
        .into_iter()
        .map(|(r, _, pool, i)| (drivers[r as usize], pool, i))
        .collect()
}

/// A name's first 8 bytes as a big-endian number (zeros past its end).
fn name_prefix(name: &str) -> u64 {
    let mut bytes = [0u8; 8];
    let n = name.len().min(8);
    bytes[..n].copy_from_slice(&name.as_bytes()[..n]);
    u64::from_be_bytes(bytes)
}

/// The node-independent part of a pool, shared between nodes.
#[derive(Debug)]
pub(crate) struct PoolStatic {
    /// A slice of the pool: its driver and pool name name the pool (no copy of either).
    named_by: Arc<crate::Slice>,
    pub state: PoolState,
    /// Device entries of the slices that target the node, in order (slices by name).
    pub entries: Vec<u32>,
    pub has_binding_conditions: bool,
    /// Per flat counter: which counter set (in order of appearance) it belongs to.
    pub counter_set: Vec<u32>,
    /// Shared counter values, flattened.
    pub base: Vec<Quantity>,
    /// Per device entry (targeting the node or not): (flat counter index, amount).
    pub consumes: NumMap<u32, Vec<(usize, Quantity)>>,
    /// With DRADeviceCompatibilityGroups, where some device of the pool declares groups:
    /// per device entry, each counter set it consumes and its groups (interned ids).
    pub compat: NumMap<u32, Vec<(u32, crate::compat::Groups)>>,
    /// The search's counter groups of `entries` (devices by position), built when a search
    /// first needs them.
    pub counter_groups: OnceLock<Vec<crate::search::CounterGroup>>,
}

impl PoolStatic {
    fn new(named_by: &Arc<crate::Slice>, state: PoolState) -> Self {
        PoolStatic {
            named_by: Arc::clone(named_by),
            state,
            entries: Vec::new(),
            has_binding_conditions: false,
            counter_set: Vec::new(),
            base: Vec::new(),
            consumes: NumMap::default(),
            compat: NumMap::default(),
            counter_groups: OnceLock::new(),
        }
    }

    pub fn id(&self) -> String {
        let spec = &self.named_by.spec;
        format!("{}/{}", spec.driver, spec.pool.name)
    }
}

/// A pool as one node sees it.
#[derive(Debug)]
pub(crate) struct PoolInfo {
    pub s: Arc<PoolStatic>,
    /// Counter values minus what allocated devices consume.
    pub available: Vec<Quantity>,
    /// Per counter set, the compatibility groups of the allocated devices on it (empty
    /// unless the pool declares groups).
    pub compat_base: Vec<crate::compat::Intersection>,
}

impl std::ops::Deref for PoolInfo {
    type Target = PoolStatic;
    fn deref(&self) -> &PoolStatic {
        &self.s
    }
}

impl PoolInfo {
    fn broken(named_by: &Arc<crate::Slice>, state: PoolState) -> Self {
        PoolInfo {
            s: Arc::new(PoolStatic::new(named_by, state)),
            available: Vec::new(),
            compat_base: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::*;

    fn snapshot(devices: Vec<DeviceBuilder>, cache: Option<Arc<SelectorCache>>) -> Snapshot {
        Snapshot::new(SnapshotInput {
            slices: vec![Arc::new(
                slice("s", "g")
                    .pool("p", 1, 1)
                    .node("n")
                    .devices(devices)
                    .build()
                    .into(),
            )],
            selector_cache: cache,
            ..Default::default()
        })
    }

    fn gpu(name: &str) -> DeviceBuilder {
        device(name).string("model", "h100").int(NUMA_ATTRIBUTE, 0)
    }

    #[test]
    fn only_devices_that_differ_in_name_alone_are_interchangeable() {
        let policy = k8s_openapi::api::resource::v1::CapacityRequestPolicy {
            default: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                "1".into(),
            )),
            ..Default::default()
        };
        let snap = snapshot(
            vec![
                gpu("a").capacity("mem", "8"),
                gpu("b").capacity("mem", "8"),
                gpu("tainted")
                    .capacity("mem", "8")
                    .taint("k", "v", "NoSchedule"),
                gpu("other-model")
                    .capacity("mem", "8")
                    .string("model", "a100"),
                gpu("more-memory").capacity("mem", "16"),
                gpu("policy").capacity_policy("mem", "8", policy),
                gpu("counters")
                    .capacity("mem", "8")
                    .consumes("set", &[("c", "1")]),
                gpu("own-node").capacity("mem", "8").on_node("n"),
                gpu("conditions")
                    .capacity("mem", "8")
                    .binding_conditions(&["ready"], &["failed"]),
                // Twins of earlier devices, apart from them in the slice.
                gpu("tainted-2")
                    .capacity("mem", "8")
                    .taint("k", "v", "NoSchedule"),
                gpu("counters-2")
                    .capacity("mem", "8")
                    .consumes("set", &[("c", "1")]),
            ],
            None,
        );
        let sym: Vec<u32> = snap.devices.iter().map(|d| d.sym).collect();
        assert_eq!(sym[0], sym[1], "a and b differ in name only");
        assert_eq!(sym[2], sym[9], "equal taints");
        assert_eq!(sym[6], sym[10], "equal counters");
        for (i, s) in sym.iter().enumerate().take(9).skip(2) {
            assert!(
                !sym[..i].contains(s),
                "device {i} must not be interchangeable with an earlier one: {sym:?}"
            );
        }
        // CEL sees neither taints nor capacity policies: those share a view.
        let view: Vec<u32> = snap.devices.iter().map(|d| d.view.id).collect();
        assert_eq!(view[0], view[2]);
        assert_eq!(view[0], view[5]);
        assert_ne!(view[0], view[3]);
        assert_ne!(view[0], view[4]);
    }

    #[test]
    fn a_cache_that_grew_too_large_is_not_reused() {
        let small = Arc::new(SelectorCache::numbered_in(
            false,
            crate::intern::Numbering::new(12),
        ));
        let first = snapshot(vec![gpu("a"), gpu("b")], Some(Arc::clone(&small)));
        assert!(Arc::ptr_eq(&first.cache, &small), "under the limit: reused");
        let many = (0..20)
            .map(|i| gpu(&format!("g{i}")).int("serial", i))
            .collect();
        let second = snapshot(many, Some(Arc::clone(&small)));
        assert!(Arc::ptr_eq(&second.cache, &small));
        let third = snapshot(vec![gpu("a")], Some(Arc::clone(&small)));
        assert!(
            !Arc::ptr_eq(&third.cache, &small),
            "past the limit a fresh cache is started"
        );
        assert!(
            !Arc::ptr_eq(&third.cache.numbering, &small.numbering),
            "in another numbering"
        );
    }

    fn sym_of(snap: &Snapshot) -> Vec<u32> {
        snap.devices.iter().map(|d| d.sym).collect()
    }

    #[test]
    fn twins_in_two_slices_of_one_pool_and_node_are_interchangeable() {
        let two_slices = |name: &str, twin: &str| {
            slice(name, "g")
                .pool("p", 1, 2)
                .node("n")
                .devices(vec![gpu(twin), gpu(&format!("{twin}-x")).int("x", 1)])
                .build()
        };
        let elsewhere = slice("s3", "g")
            .pool("q", 1, 1)
            .node("m")
            .devices(vec![gpu("e")])
            .build();
        let snap = Snapshot::new(SnapshotInput {
            slices: [two_slices("s1", "a"), two_slices("s2", "c"), elsewhere]
                .into_iter()
                .map(|s| Arc::new(s.into()))
                .collect(),
            ..Default::default()
        });
        let sym = sym_of(&snap);
        assert_eq!(
            sym[0], sym[2],
            "a and c: one pool, one node, differ in name only"
        );
        assert_eq!(sym[1], sym[3], "a-x and c-x likewise");
        assert_ne!(sym[0], sym[1]);
        assert!(
            !sym[..4].contains(&sym[4]),
            "e is on another node, in another pool: {sym:?}"
        );
    }

    #[test]
    fn a_taint_rule_sets_apart_the_devices_it_taints() {
        let with_rules = |taint_rules| {
            Snapshot::new(SnapshotInput {
                slices: vec![Arc::new(
                    slice("s", "g")
                        .pool("p", 1, 1)
                        .node("n")
                        .devices(vec![gpu("a"), gpu("b"), gpu("c")])
                        .build()
                        .into(),
                )],
                taint_rules,
                ..Default::default()
            })
        };
        let untainted = sym_of(&with_rules(Vec::new()));
        assert!(
            untainted.iter().all(|&s| s == untainted[0]),
            "{untainted:?}"
        );
        let rule = taint_rule("r", None, None, Some("b"), "k", "NoSchedule");
        let tainted = sym_of(&with_rules(vec![rule]));
        assert_eq!(tainted[0], tainted[2]);
        assert_ne!(tainted[0], tainted[1], "only b is tainted: {tainted:?}");
    }

    #[test]
    fn pools_are_sorted_by_driver_then_pool_name_as_strings_are() {
        // Names that tie on their first 8 bytes, end inside them, or hold a zero byte.
        let names = [
            "node-10",
            "node-1",
            "node-100000",
            "node-10000",
            "",
            "a\0",
            "a",
            "nodes-b",
            "node-100001",
            "node-1",
            "zz",
            "node-99999999",
        ];
        let drivers = ["gpu.example.com", "a.example.com", "gpu.example.com"];
        let slices: Vec<Arc<crate::Slice>> = names
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let driver = drivers[i % drivers.len()];
                Arc::new(slice(&format!("s{i}"), driver).pool(p, 1, 1).build().into())
            })
            .collect();
        let mut want: Vec<(&str, &str, u32)> = slices
            .iter()
            .enumerate()
            .map(|(i, s)| (s.spec.driver.as_str(), s.spec.pool.name.as_str(), i as u32))
            .collect();
        want.sort();
        assert_eq!(pool_sorted(&slices), want);
    }
}
