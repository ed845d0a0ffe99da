//! What a snapshot needs of one ResourceSlice that depends on that slice alone: each
//! device's numbers (what CEL can see of it, see [`crate::intern`]), its parsed capacity
//! and counters, its NUMA node's value number and a few flags. Worked out once, when the
//! slice is received ([`crate::Slice`] keeps its [`SliceFacts`]), so that building a
//! snapshot copies a few numbers per device instead of reading every device's maps and
//! strings again (that was most of `Snapshot::new`'s time: 0.6–1.4 µs a device).

use std::sync::Arc;

use k8s_openapi::api::resource::v1::Device;

use crate::DeviceMaps;
use crate::intern::{ABSENT, DeviceView, Numbering, Pairs, ReadIds};
use crate::snapshot::{NUMA_ATTRIBUTE, Parsed};

/// One slice's facts, in one [`Numbering`].
pub(crate) struct SliceFacts {
    pub numbering: Arc<Numbering>,
    /// The pairs of every device's view (a view's start counts from the first).
    pub pairs: Pairs,
    /// One per device of the slice, in order.
    pub devices: Box<[DeviceFacts]>,
    /// How many signatures the slice's devices have.
    pub syms: u32,
    /// What [`DeviceFacts::parsed`] numbers: devices that declare what the one before them
    /// declared share its entry.
    pub parsed: Box<[Parsed]>,
    /// The first device name met twice in the slice, if any.
    pub duplicate_name: Option<String>,
    /// Some device consumes counters with compatibility groups.
    pub uses_groups: bool,
    /// Per-device node selection or shared counters: DRAPartitionableDevices' fields.
    pub partitionable_only: bool,
    /// The slice declares shared counters.
    pub shared_counters: bool,
    /// Some device consumes counters.
    pub consumes_counters: bool,
    /// Some device has binding conditions.
    pub binding_conditions: bool,
}

/// One device's facts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeviceFacts {
    pub view: DeviceView,
    /// The value number of the qualified `resource.kubernetes.io/numaNode`, or [`ABSENT`].
    pub numa: u32,
    /// Its entry in [`SliceFacts::parsed`].
    pub parsed: u32,
    /// Its signature (see [`crate::snapshot::signature`]) numbered within the slice: equal
    /// for the slice's devices that differ in name alone, below [`SliceFacts::syms`].
    pub sym: u32,
    pub binding_conditions: bool,
    pub consumes_counters: bool,
    /// It maps node allocatable resources (`nodeAllocatableResources` not empty).
    pub node_resources: bool,
    /// It has a field of the rarer ones a device's signature compares one by one
    /// (counters, per-device placement, binding conditions, capacity request policies).
    pub rare_fields: bool,
    pub taints: bool,
    /// Its parsed entry is [`Parsed::plain`].
    pub plain_parsed: bool,
}

impl std::fmt::Debug for SliceFacts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SliceFacts")
            .field("devices", &self.devices.len())
            .field("parsed", &self.parsed.len())
            .finish_non_exhaustive()
    }
}

impl SliceFacts {
    /// The facts of `slice`, numbered in `numbering`.
    pub fn new(numbering: &Arc<Numbering>, slice: &crate::Slice) -> SliceFacts {
        let spec = &slice.spec;
        let mut pairs = Pairs::new();
        let views = numbering.number(&spec.driver, slice.devices(), &mut pairs);
        let numa = ReadIds {
            capacity: false,
            domain: None,
            plain: None,
            qualified: numbering.read().name_id(NUMA_ATTRIBUTE),
        };
        let mut parsed: Vec<Parsed> = Vec::new();
        let mut devices = Vec::with_capacity(views.len());
        let mut previous: Option<(&Device, &DeviceMaps)> = None;
        let (mut texts, mut rests) = Default::default();
        let mut syms: foldhash::HashMap<[u32; 4], u32> = Default::default();
        for ((device, maps), view) in slice.devices().zip(views) {
            let same = previous.is_some_and(|(p, p_maps)| {
                p_maps.capacity == maps.capacity && p.consumes_counters == device.consumes_counters
            });
            if !same {
                parsed.push(Parsed::new(device, maps));
            }
            previous = Some((device, maps));
            let rare_fields = crate::snapshot::has_rare_fields(device, maps);
            let signature = crate::snapshot::signature(
                &mut texts,
                &mut rests,
                0,
                view.id,
                (device, maps),
                rare_fields,
                device.taints.as_deref().unwrap_or_default(),
            );
            let next = syms.len() as u32;
            devices.push(DeviceFacts {
                sym: *syms.entry(signature).or_insert(next),
                numa: if numa.qualified.is_some() {
                    view.value(&pairs, &numa)
                } else {
                    ABSENT
                },
                view,
                parsed: parsed.len() as u32 - 1,
                binding_conditions: device.binding_conditions.is_some(),
                consumes_counters: !parsed.last().expect("pushed").counters.is_empty(),
                plain_parsed: parsed.last().expect("pushed").plain(),
                node_resources: device
                    .node_allocatable_resources
                    .as_ref()
                    .is_some_and(|m| !m.is_empty()),
                rare_fields,
                taints: device.taints.as_ref().is_some_and(|t| !t.is_empty()),
            });
        }
        let uses_groups = spec.devices.iter().flatten().any(|d| {
            d.consumes_counters.iter().flatten().any(|c| {
                c.compatibility_groups
                    .as_ref()
                    .is_some_and(|g| !g.is_empty())
            })
        });
        let shared_counters = spec.shared_counters.as_ref().is_some_and(|c| !c.is_empty());
        SliceFacts {
            shared_counters,
            consumes_counters: devices.iter().any(|d| d.consumes_counters),
            binding_conditions: devices.iter().any(|d| d.binding_conditions),
            numbering: Arc::clone(numbering),
            pairs,
            syms: syms.len() as u32,
            devices: devices.into(),
            parsed: parsed.into(),
            uses_groups,
            duplicate_name: crate::snapshot::first_duplicate(
                spec.devices.iter().flatten().map(|d| d.name.as_str()),
            )
            .map(str::to_string),
            partitionable_only: spec.per_device_node_selection.is_some() || shared_counters,
        }
    }
}
