//! What devices the cluster has and which are free: per device its node, driver, pool,
//! product, NUMA node, the DeviceClasses whose selectors it matches, the claim it is
//! allocated to (and whom that claim is reserved for) and its taints; per shared counter
//! set of a partitionable device, what its allocated devices leave. [`Inventory::of`]
//! reads it from the [`ClusterState`]; `kubectl dra nodes` and `claims` print it, and the
//! daemon exports its counts as the gauge `devices{node,class,state}`. What it reads is a
//! [`Sources`]: the DRA objects and, per allocated device, its claim, not the claims
//! themselves, so the daemon can count on another thread without copying every claim.
//!
//! A device counts in every class it matches (a MIG device and the whole GPU are
//! different classes; a device can be in two). A class whose selector fails on a device
//! does not match it; the error is kept in [`Inventory::errors`], naming class and device.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use dra_allocator::{DeviceMaps, Slice};
use dra_cel::{Environment, Quantity};
use k8s_openapi::api::resource::v1::{Device, DeviceClass, DeviceTaintRule, ResourceSlice};

use crate::claims;
use crate::state::{ClusterState, ObjectKey};

/// The NUMA attribute Kubernetes standardises (`resource.kubernetes.io/numaNode`).
const NUMA_ATTRIBUTE: &str = "resource.kubernetes.io/numaNode";

/// One device of a ResourceSlice.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceInfo {
    /// The slice's node; `None` for devices reachable from several nodes.
    pub node: Option<String>,
    pub driver: String,
    pub pool: String,
    pub name: String,
    /// `productName`, where the driver publishes it.
    pub product: Option<String>,
    pub numa: Option<i64>,
    /// The DeviceClasses whose selectors match it.
    pub classes: Vec<String>,
    /// The claim it is allocated to, and whom that claim is reserved for
    /// (`pods/name`, `podgroups/name`).
    pub claim: Option<ObjectKey>,
    pub reserved_for: Vec<String>,
    /// Its taints (in the slice and from DeviceTaintRules): `key=value:Effect`.
    pub taints: Vec<String>,
    /// Whether it draws on shared counters (a partition of a partitionable device).
    pub partition: bool,
}

impl DeviceInfo {
    /// `driver/pool/device`.
    pub fn id(&self) -> String {
        format!("{}/{}/{}", self.driver, self.pool, self.name)
    }

    /// `free`, `allocated` or `tainted` (a taint that keeps pods off: NoSchedule or
    /// NoExecute; an allocated device is `allocated` whatever its taints).
    pub fn state(&self) -> &'static str {
        if self.claim.is_some() {
            "allocated"
        } else if self
            .taints
            .iter()
            .any(|t| t.ends_with(":NoSchedule") || t.ends_with(":NoExecute"))
        {
            "tainted"
        } else {
            "free"
        }
    }
}

/// What is left of one shared counter of a pool's counter set.
#[derive(Clone, Debug, PartialEq)]
pub struct CounterLeft {
    pub node: Option<String>,
    pub driver: String,
    pub pool: String,
    pub counter_set: String,
    pub counter: String,
    pub total: String,
    pub left: String,
}

/// Every device, and what the partitionable ones leave.
#[derive(Clone, Debug, Default)]
pub struct Inventory {
    pub devices: Vec<DeviceInfo>,
    pub counters: Vec<CounterLeft>,
    /// Selectors that failed: "DeviceClass x on device d: message".
    pub errors: Vec<String>,
}

/// Who allocated each device: `driver/pool/device` -> (claim, reserved for).
type Allocated = BTreeMap<String, (ObjectKey, Vec<String>)>;

/// What an [`Inventory`] is made from: the classes, slices (shared with the state, not
/// copied) and taint rules, and who holds each allocated device.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    classes: Vec<DeviceClass>,
    slices: Vec<Arc<Slice>>,
    taint_rules: Vec<DeviceTaintRule>,
    allocated: Allocated,
}

impl Sources {
    pub fn of(state: &ClusterState) -> Sources {
        Sources {
            classes: state.classes.clone(),
            slices: state.slices.clone(),
            taint_rules: state.taint_rules.clone(),
            allocated: allocations(state),
        }
    }
}

fn allocations(state: &ClusterState) -> Allocated {
    let mut out = BTreeMap::new();
    for (key, claim) in &state.claims {
        let Some(allocation) = claims::allocation(claim) else {
            continue;
        };
        let reserved: Vec<String> = claims::reserved_for(claim)
            .iter()
            .map(|r| format!("{}/{}", r.resource, r.name))
            .collect();
        let results = allocation
            .devices
            .iter()
            .flat_map(|d| d.results.iter().flatten());
        for r in results {
            let id = format!("{}/{}/{}", r.driver, r.pool, r.device);
            out.insert(id, (key.clone(), reserved.clone()));
        }
    }
    out
}

fn taints(slice: &ResourceSlice, device: &Device, rules: &[DeviceTaintRule]) -> Vec<String> {
    let spec = &slice.spec;
    let from_rules = rules.iter().filter(|rule| {
        rule.spec.device_selector.as_ref().is_some_and(|s| {
            s.driver.as_deref().is_none_or(|d| d == spec.driver)
                && s.pool.as_deref().is_none_or(|p| p == spec.pool.name)
                && s.device.as_deref().is_none_or(|d| d == device.name)
        })
    });
    device
        .taints
        .iter()
        .flatten()
        .chain(from_rules.map(|r| &r.spec.taint))
        .map(|t| {
            format!(
                "{}={}:{}",
                t.key,
                t.value.as_deref().unwrap_or(""),
                t.effect
            )
        })
        .collect()
}

/// The classes among `classes` whose selectors all match the device.
fn classes_of(
    env: &Environment,
    classes: &[DeviceClass],
    driver: &str,
    device: &Device,
    maps: &DeviceMaps,
    errors: &mut Vec<String>,
) -> Vec<String> {
    let device_ref = maps.device_ref(driver, device);
    let mut out = Vec::new();
    'classes: for class in classes {
        let name = class.metadata.name.clone().unwrap_or_default();
        let selectors = class.spec.iter().flat_map(|s| s.selectors.iter().flatten());
        for selector in selectors {
            let Some(cel) = &selector.cel else { continue };
            let verdict = env
                .compile(&cel.expression)
                .and_then(|s| s.matches(device_ref));
            match verdict {
                Ok(true) => {}
                Ok(false) => continue 'classes,
                Err(e) => {
                    errors.push(format!("DeviceClass {name} on device {}: {e}", device.name));
                    continue 'classes;
                }
            }
        }
        out.push(name);
    }
    out
}

fn string_attribute(maps: &DeviceMaps, name: &str) -> Option<String> {
    maps.attribute(name)?.string.clone()
}

fn numa_of(maps: &DeviceMaps) -> Option<i64> {
    maps.attribute(NUMA_ATTRIBUTE)
        .or_else(|| maps.attribute("numaNode"))
        .or_else(|| maps.attribute("numa"))?
        .int
}

impl Inventory {
    pub fn of(state: &ClusterState) -> Inventory {
        Inventory::from_sources(&Sources::of(state))
    }

    pub fn from_sources(sources: &Sources) -> Inventory {
        let mut inventory = Inventory::default();
        let mut devices = Vec::new();
        inventory.errors = each_device(sources, |device| devices.push(device));
        inventory.devices = devices;
        inventory.counters = counters_left(&sources.slices, &sources.allocated);
        inventory
            .devices
            .sort_by(|a, b| (&a.node, a.id()).cmp(&(&b.node, b.id())));
        inventory
    }

    /// [`Inventory::counts`] of [`Inventory::from_sources`], without holding every
    /// device's [`DeviceInfo`] at once: what the daemon exports every few seconds.
    pub fn counts_of(sources: &Sources) -> Counts {
        let mut out = Counts::new();
        each_device(sources, |device| count(&mut out, &device));
        out
    }

    /// Devices per node, class and state (`free`, `allocated`, `tainted`); a device with
    /// no node counts under node `""`, one in no class under class `""`.
    pub fn counts(&self) -> Counts {
        let mut out = Counts::new();
        for d in &self.devices {
            count(&mut out, d);
        }
        out
    }

    /// The nodes that have devices, in order.
    pub fn nodes(&self) -> BTreeSet<&str> {
        self.devices
            .iter()
            .filter_map(|d| d.node.as_deref())
            .collect()
    }
}

/// How many devices per (node, class, state): [`Inventory::counts`].
pub type Counts = BTreeMap<(String, String, &'static str), usize>;

/// Count `d` once in each of its classes (under class `""` if none), under node `""` if
/// it has none.
fn count(out: &mut Counts, d: &DeviceInfo) {
    let node = d.node.clone().unwrap_or_default();
    if d.classes.is_empty() {
        *out.entry((node, String::new(), d.state())).or_default() += 1;
        return;
    }
    for class in &d.classes {
        *out.entry((node.clone(), class.clone(), d.state()))
            .or_default() += 1;
    }
}

/// Each device of the slices, in slice order, as a [`DeviceInfo`] handed to `f`; returns
/// the selector errors met.
fn each_device(sources: &Sources, mut f: impl FnMut(DeviceInfo)) -> Vec<String> {
    let env = Environment::default();
    let allocated = &sources.allocated;
    let mut errors = Vec::new();
    for slice in &sources.slices {
        let spec = &slice.spec;
        for (device, maps) in slice.devices() {
            let classes = classes_of(
                &env,
                &sources.classes,
                &spec.driver,
                device,
                maps,
                &mut errors,
            );
            let id = format!("{}/{}/{}", spec.driver, spec.pool.name, device.name);
            let (claim, reserved_for) = match allocated.get(&id) {
                Some((claim, reserved)) => (Some(claim.clone()), reserved.clone()),
                None => (None, Vec::new()),
            };
            f(DeviceInfo {
                node: spec.node_name.clone().or_else(|| device.node_name.clone()),
                driver: spec.driver.clone(),
                pool: spec.pool.name.clone(),
                name: device.name.clone(),
                product: string_attribute(maps, "productName"),
                numa: numa_of(maps),
                classes,
                claim,
                reserved_for,
                taints: taints(slice, device, &sources.taint_rules),
                partition: device
                    .consumes_counters
                    .as_ref()
                    .is_some_and(|c| !c.is_empty()),
            });
        }
    }
    errors
}

/// Per pool's shared counter, the total less what allocated devices consume.
fn counters_left(slices: &[Arc<Slice>], allocated: &Allocated) -> Vec<CounterLeft> {
    // (driver, pool, set, counter) -> consumed
    let mut used: BTreeMap<(String, String, String, String), Quantity> = BTreeMap::new();
    for slice in slices {
        let spec = &slice.spec;
        for device in spec.devices.iter().flatten() {
            let id = format!("{}/{}/{}", spec.driver, spec.pool.name, device.name);
            if !allocated.contains_key(&id) {
                continue;
            }
            for consumption in device.consumes_counters.iter().flatten() {
                for (counter, value) in &consumption.counters {
                    let key = (
                        spec.driver.clone(),
                        spec.pool.name.clone(),
                        consumption.counter_set.clone(),
                        counter.clone(),
                    );
                    let q = Quantity::from_openapi(&value.value).unwrap_or_default();
                    let sum = used.remove(&key).unwrap_or_default() + q;
                    used.insert(key, sum);
                }
            }
        }
    }
    let mut out = Vec::new();
    for slice in slices {
        let spec = &slice.spec;
        for set in spec.shared_counters.iter().flatten() {
            for (counter, value) in &set.counters {
                let total = Quantity::from_openapi(&value.value).unwrap_or_default();
                let key = (
                    spec.driver.clone(),
                    spec.pool.name.clone(),
                    set.name.clone(),
                    counter.clone(),
                );
                let consumed = used.get(&key).copied().unwrap_or_default();
                out.push(CounterLeft {
                    node: spec.node_name.clone(),
                    driver: spec.driver.clone(),
                    pool: spec.pool.name.clone(),
                    counter_set: set.name.clone(),
                    counter: counter.clone(),
                    left: (total - consumed).to_string(),
                    total: total.to_string(),
                });
            }
        }
    }
    out
}
