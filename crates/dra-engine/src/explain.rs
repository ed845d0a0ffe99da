//! Which devices a claim's requests could use, device by device, for `kubectl dra why`.
//!
//! The allocator counts per node what a request finds ("3 in class gpu.nvidia.com, 1 match
//! the selectors, 1 in use, 0 available"); this names the devices behind those counts. For
//! each request (each subrequest of a `firstAvailable` list): every device of its
//! DeviceClass (as the [`Inventory`] found them), the first of the request's selectors the
//! device fails, the attribute and capacity values those selectors read, and the taints
//! that keep the request off it. Who holds an allocated device is the inventory's answer.
//!
//! It decides nothing and changes nothing: whether a pod fits is the scheduling cycle's
//! answer ([`crate::Engine::evaluate`]); this is what a person reads next to it.

use std::collections::HashMap;

use dra_allocator::DeviceMaps;
use dra_cel::{Environment, Quantity};
use k8s_openapi::api::resource::v1::{Device, DeviceSelector, DeviceToleration, ResourceClaim};

use crate::inventory::{DeviceInfo, Inventory};
use crate::state::{ClusterState, ObjectKey};

/// One request (or one subrequest of a `firstAvailable` list) of a claim, and what it makes
/// of every device of its class.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestDevices {
    pub claim: ObjectKey,
    /// `request`, or `request/subrequest` for an entry of a `firstAvailable` list.
    pub request: String,
    pub class: String,
    /// Devices needed; `None` for `allocationMode: All`.
    pub count: Option<i64>,
    /// The request's CEL selectors, in order.
    pub selectors: Vec<String>,
    /// Every device of the class, in the inventory's order (by node, then id).
    pub devices: Vec<DeviceVerdict>,
}

/// What one request makes of one device of its class.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceVerdict {
    /// Its index in [`Inventory::devices`].
    pub device: usize,
    /// The first selector (an index into [`RequestDevices::selectors`]) the device does not
    /// match, with the CEL error where the selector failed to evaluate.
    pub rejected_by: Option<(usize, Option<String>)>,
    /// Its NoSchedule and NoExecute taints that the request does not tolerate.
    pub untolerated: Vec<String>,
    /// The attributes and capacities the selectors read, with this device's values
    /// (`("memory", "16Gi")`), in the order the selectors name them.
    pub reads: Vec<(String, String)>,
    /// Shared counters it would draw more of than its pool has left (a partition whose
    /// siblings are allocated); none for an allocated device.
    pub short_counters: Vec<CounterShortfall>,
}

/// One shared counter a device needs more of than is left.
#[derive(Clone, Debug, PartialEq)]
pub struct CounterShortfall {
    /// `counterSet/counter`.
    pub counter: String,
    pub needs: String,
    pub left: String,
    /// The allocated devices (indices into [`Inventory::devices`]) that draw on the same
    /// counter set.
    pub used_by: Vec<usize>,
}

impl DeviceVerdict {
    /// It passes every selector of the request.
    pub fn matches(&self) -> bool {
        self.rejected_by.is_none()
    }

    /// It matches, is allocated to no claim, has no taint the request does not tolerate and
    /// its shared counters allow it.
    pub fn usable(&self, inventory: &Inventory) -> bool {
        self.matches()
            && self.untolerated.is_empty()
            && self.short_counters.is_empty()
            && inventory.devices[self.device].claim.is_none()
    }
}

impl RequestDevices {
    /// The devices of its class on `node`.
    pub fn on_node<'a>(
        &'a self,
        inventory: &'a Inventory,
        node: &'a str,
    ) -> Vec<&'a DeviceVerdict> {
        self.devices
            .iter()
            .filter(|v| inventory.devices[v.device].node.as_deref() == Some(node))
            .collect()
    }
}

/// The requests of `claim`, in its order (a `firstAvailable` list gives one entry per
/// subrequest), each with every device of its class.
pub fn requests(
    state: &ClusterState,
    inventory: &Inventory,
    claim: &ResourceClaim,
) -> Vec<RequestDevices> {
    let key = ObjectKey::of(&claim.metadata);
    let devices = devices_by_id(state);
    let counters = Counters::of(inventory, &devices);
    let env = Environment::default();
    let mut out = Vec::new();
    let requests = claim
        .spec
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .and_then(|d| d.requests.as_ref());
    for request in requests.into_iter().flatten() {
        let mut entries = Vec::new();
        if let Some(exact) = &request.exactly {
            entries.push(Entry {
                name: request.name.clone(),
                class: &exact.device_class_name,
                mode: exact.allocation_mode.as_deref(),
                count: exact.count,
                selectors: exact.selectors.as_deref().unwrap_or_default(),
                tolerations: exact.tolerations.as_deref().unwrap_or_default(),
            });
        }
        for sub in request.first_available.iter().flatten() {
            entries.push(Entry {
                name: format!("{}/{}", request.name, sub.name),
                class: &sub.device_class_name,
                mode: sub.allocation_mode.as_deref(),
                count: sub.count,
                selectors: sub.selectors.as_deref().unwrap_or_default(),
                tolerations: sub.tolerations.as_deref().unwrap_or_default(),
            });
        }
        for entry in entries {
            out.push(entry.devices(&key, &env, inventory, &devices, &counters));
        }
    }
    out
}

/// One request or subrequest, borrowed from the claim.
struct Entry<'a> {
    name: String,
    class: &'a str,
    mode: Option<&'a str>,
    count: Option<i64>,
    selectors: &'a [DeviceSelector],
    tolerations: &'a [DeviceToleration],
}

impl Entry<'_> {
    fn devices(
        self,
        claim: &ObjectKey,
        env: &Environment,
        inventory: &Inventory,
        by_id: &HashMap<String, (&str, &Device, &DeviceMaps)>,
        counters: &Counters,
    ) -> RequestDevices {
        let selectors: Vec<String> = self
            .selectors
            .iter()
            .filter_map(|s| s.cel.as_ref().map(|c| c.expression.clone()))
            .collect();
        let mut verdicts = Vec::new();
        for (index, info) in inventory.devices.iter().enumerate() {
            if !info.classes.iter().any(|c| c == self.class) {
                continue;
            }
            let Some((driver, device, maps)) = by_id.get(&info.id()) else {
                continue;
            };
            let device_ref = maps.device_ref(driver, device);
            let rejected_by = selectors.iter().enumerate().find_map(|(i, expression)| {
                match env.compile(expression).and_then(|s| s.matches(device_ref)) {
                    Ok(true) => None,
                    Ok(false) => Some((i, None)),
                    Err(e) => Some((i, Some(e.to_string()))),
                }
            });
            let mut reads = Vec::new();
            for expression in &selectors {
                for (name, value) in values_read(expression, driver, maps) {
                    if !reads.iter().any(|(n, _)| *n == name) {
                        reads.push((name, value));
                    }
                }
            }
            verdicts.push(DeviceVerdict {
                device: index,
                rejected_by,
                untolerated: info
                    .taints
                    .iter()
                    .filter(|t| keeps_off(t) && !self.tolerations.iter().any(|x| tolerates(x, t)))
                    .cloned()
                    .collect(),
                reads,
                short_counters: match info.claim {
                    Some(_) => Vec::new(),
                    None => counters.short(info, device),
                },
            });
        }
        RequestDevices {
            claim: claim.clone(),
            request: self.name,
            class: self.class.to_string(),
            count: match self.mode {
                Some("All") => None,
                _ => Some(self.count.unwrap_or(1)),
            },
            selectors,
            devices: verdicts,
        }
    }
}

/// Per device of the inventory (same order), the shared counters it would draw more of
/// than its pool has left: a free partition that cannot be allocated now. Empty for an
/// allocated device and one on no counters.
pub fn short_counters(state: &ClusterState, inventory: &Inventory) -> Vec<Vec<CounterShortfall>> {
    let devices = devices_by_id(state);
    let counters = Counters::of(inventory, &devices);
    inventory
        .devices
        .iter()
        .map(|info| match (&info.claim, devices.get(&info.id())) {
            (None, Some((_, device, _))) => counters.short(info, device),
            _ => Vec::new(),
        })
        .collect()
}

/// What the shared counters of each pool have left, and who draws on each counter set.
struct Counters {
    /// `(driver, pool, set, counter)` -> left.
    left: HashMap<(String, String, String, String), Quantity>,
    /// `(driver, pool, set)` -> allocated devices (inventory indices) that draw on it.
    users: HashMap<(String, String, String), Vec<usize>>,
}

impl Counters {
    fn of(
        inventory: &Inventory,
        by_id: &HashMap<String, (&str, &Device, &DeviceMaps)>,
    ) -> Counters {
        let left = inventory
            .counters
            .iter()
            .filter_map(|c| {
                let key = (
                    c.driver.clone(),
                    c.pool.clone(),
                    c.counter_set.clone(),
                    c.counter.clone(),
                );
                Some((key, c.left.parse().ok()?))
            })
            .collect();
        let mut users: HashMap<_, Vec<usize>> = HashMap::new();
        for (index, info) in inventory.devices.iter().enumerate() {
            let Some((_, device, _)) = by_id.get(&info.id()).filter(|_| info.claim.is_some())
            else {
                continue;
            };
            for consumption in device.consumes_counters.iter().flatten() {
                let key = (
                    info.driver.clone(),
                    info.pool.clone(),
                    consumption.counter_set.clone(),
                );
                users.entry(key).or_default().push(index);
            }
        }
        Counters { left, users }
    }

    /// The counters `device` needs more of than is left.
    fn short(&self, info: &DeviceInfo, device: &Device) -> Vec<CounterShortfall> {
        let mut out = Vec::new();
        for consumption in device.consumes_counters.iter().flatten() {
            let set = &consumption.counter_set;
            for (counter, value) in &consumption.counters {
                let key = (
                    info.driver.clone(),
                    info.pool.clone(),
                    set.clone(),
                    counter.clone(),
                );
                let (Ok(needs), Some(left)) =
                    (Quantity::from_openapi(&value.value), self.left.get(&key))
                else {
                    continue;
                };
                if needs > *left {
                    let users = (info.driver.clone(), info.pool.clone(), set.clone());
                    out.push(CounterShortfall {
                        counter: format!("{set}/{counter}"),
                        needs: needs.to_string(),
                        left: left.to_string(),
                        used_by: self.users.get(&users).cloned().unwrap_or_default(),
                    });
                }
            }
        }
        out
    }
}

/// Every device of every slice by `driver/pool/device`, with its driver.
fn devices_by_id(state: &ClusterState) -> HashMap<String, (&str, &Device, &DeviceMaps)> {
    let mut out = HashMap::new();
    for slice in &state.slices {
        let spec = &slice.spec;
        for (device, maps) in slice.devices() {
            let id = format!("{}/{}/{}", spec.driver, spec.pool.name, device.name);
            out.insert(id, (spec.driver.as_str(), device, maps));
        }
    }
    out
}

/// An inventory taint (`key=value:Effect`) that keeps pods off the device.
fn keeps_off(taint: &str) -> bool {
    taint.ends_with(":NoSchedule") || taint.ends_with(":NoExecute")
}

/// Whether `toleration` tolerates the inventory taint `key=value:Effect`, as the allocator
/// reads a DeviceToleration: no effect tolerates every effect, `Exists` with no key every
/// key, `Equal` (the default) the same key and value.
fn tolerates(toleration: &DeviceToleration, taint: &str) -> bool {
    let (key_value, effect) = taint.rsplit_once(':').unwrap_or((taint, ""));
    let (key, value) = key_value.split_once('=').unwrap_or((key_value, ""));
    if toleration.effect.as_deref().is_some_and(|e| e != effect) {
        return false;
    }
    match toleration.operator.as_deref() {
        Some("Exists") => toleration
            .key
            .as_deref()
            .is_none_or(|k| k.is_empty() || k == key),
        _ => {
            toleration.key.as_deref() == Some(key)
                && toleration.value.as_deref().unwrap_or("") == value
        }
    }
}

/// The attributes and capacities a selector names (`device.attributes["domain"].name`,
/// `device.capacity['domain'].name`), with the device's values: what a person needs to see
/// why it does or does not match. A name the device lacks reads `<none>`.
pub fn values_read(expression: &str, driver: &str, maps: &DeviceMaps) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (map, domain, name) in names_read(expression) {
        let qualified = format!("{domain}/{name}");
        // An attribute of the driver's own domain is published unqualified.
        let keys = if domain == driver {
            vec![name.clone(), qualified]
        } else {
            vec![qualified]
        };
        let value = match map {
            Map::Attributes => keys.iter().find_map(|k| maps.attribute(k)).map(|a| {
                a.string
                    .clone()
                    .or(a.int.map(|i| i.to_string()))
                    .or(a.bool.map(|b| b.to_string()))
                    .or(a.version.clone())
                    .or(a.strings.as_ref().map(|s| s.join(",")))
                    .or(a
                        .ints
                        .as_ref()
                        .map(|v| v.iter().map(i64::to_string).collect::<Vec<_>>().join(",")))
                    .unwrap_or_default()
            }),
            Map::Capacity => keys
                .iter()
                .find_map(|k| maps.capacity(k))
                .map(|c| c.value.0.clone()),
        };
        if !out.iter().any(|(n, _)| *n == name) {
            out.push((name, value.unwrap_or_else(|| "<none>".into())));
        }
    }
    out
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Map {
    Attributes,
    Capacity,
}

/// `(map, domain, name)` for each `attributes[...]`/`capacity[...]` lookup in the text,
/// in order. A plain scan, not a parse: it only chooses which values to show.
fn names_read(expression: &str) -> Vec<(Map, String, String)> {
    let mut out = Vec::new();
    for (map, marker) in [
        (Map::Attributes, "attributes["),
        (Map::Capacity, "capacity["),
    ] {
        let mut rest = expression;
        while let Some(at) = rest.find(marker) {
            let position = expression.len() - rest.len() + at;
            rest = &rest[at + marker.len()..];
            let Some(quote) = rest.chars().next().filter(|c| *c == '"' || *c == '\'') else {
                continue;
            };
            let Some(end) = rest[1..].find(quote) else {
                continue;
            };
            let domain = rest[1..1 + end].to_string();
            let after = &rest[1 + end + 1..];
            let Some(after) = after.strip_prefix(']') else {
                continue;
            };
            let name = if let Some(field) = after.strip_prefix('.') {
                field
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<String>()
            } else if let Some(index) = after.strip_prefix("[\"").or(after.strip_prefix("['")) {
                index
                    .chars()
                    .take_while(|c| *c != '"' && *c != '\'')
                    .collect()
            } else {
                String::new()
            };
            if !name.is_empty() {
                out.push((position, map, domain, name));
            }
        }
    }
    out.sort_by_key(|(position, ..)| *position);
    out.into_iter().map(|(_, m, d, n)| (m, d, n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ClusterInput;

    fn state() -> ClusterState {
        let class = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gpu"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.example.com'"}}]}
        }))
        .unwrap();
        let slice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1-gpus"},
            "spec": {"driver": "gpu.example.com", "nodeName": "n1",
                "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "gpu-0", "attributes": {"productName": {"string": "A5000"}},
                     "capacity": {"memory": {"value": "24Gi"}}},
                    {"name": "gpu-1", "attributes": {"productName": {"string": "T10"}},
                     "capacity": {"memory": {"value": "16Gi"}},
                     "taints": [{"key": "broken", "value": "fan", "effect": "NoSchedule"}]}
                ]}
        }))
        .unwrap();
        ClusterState::new(ClusterInput {
            classes: vec![class],
            slices: vec![slice],
            ..Default::default()
        })
    }

    fn claim(request: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"devices": {"requests": [request]}}
        }))
        .unwrap()
    }

    #[test]
    fn each_device_of_the_class_says_which_selector_it_fails_and_what_that_selector_read() {
        let state = state();
        let inventory = Inventory::of(&state);
        let claim = claim(serde_json::json!({"name": "gpu", "exactly": {
        "deviceClassName": "gpu", "count": 1,
        "selectors": [
            {"cel": {"expression": "device.attributes['gpu.example.com'].productName != ''"}},
            {"cel": {"expression": "device.capacity[\"gpu.example.com\"].memory.isGreaterThan(quantity(\"20Gi\"))"}}
        ]}}));
        let requests = requests(&state, &inventory, &claim);
        assert_eq!(requests.len(), 1);
        let r = &requests[0];
        assert_eq!((r.request.as_str(), r.count), ("gpu", Some(1)));
        let verdicts: Vec<_> = r
            .devices
            .iter()
            .map(|v| {
                (
                    inventory.devices[v.device].name.as_str(),
                    v.rejected_by.clone(),
                    v.untolerated.clone(),
                    v.reads.clone(),
                )
            })
            .collect();
        let reads = |product: &str, memory: &str| {
            vec![
                ("productName".to_string(), product.to_string()),
                ("memory".to_string(), memory.to_string()),
            ]
        };
        assert_eq!(
            verdicts,
            [
                ("gpu-0", None, vec![], reads("A5000", "24Gi")),
                (
                    "gpu-1",
                    Some((1, None)),
                    vec!["broken=fan:NoSchedule".to_string()],
                    reads("T10", "16Gi")
                ),
            ]
        );
        assert!(r.devices[0].usable(&inventory));
    }

    #[test]
    fn a_first_available_list_gives_one_entry_per_subrequest_and_tolerations_count() {
        let state = state();
        let inventory = Inventory::of(&state);
        let claim = claim(serde_json::json!({"name": "gpu", "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu", "allocationMode": "All"},
            {"name": "any", "deviceClassName": "gpu",
             "tolerations": [{"key": "broken", "operator": "Exists"}]}
        ]}));
        let requests = requests(&state, &inventory, &claim);
        let names: Vec<_> = requests
            .iter()
            .map(|r| (r.request.as_str(), r.count))
            .collect();
        assert_eq!(names, [("gpu/big", None), ("gpu/any", Some(1))]);
        assert_eq!(requests[0].devices[1].untolerated.len(), 1);
        assert!(requests[1].devices[1].usable(&inventory), "tolerated");
    }

    #[test]
    fn a_partition_whose_siblings_took_the_counters_names_them() {
        let class = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gpu"}, "spec": {}
        }))
        .unwrap();
        let partition = |name: &str, memory: &str| {
            serde_json::json!({"name": name, "consumesCounters": [
                {"counterSet": "gpu-0", "counters": {"memory": {"value": memory}}}]})
        };
        let slice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"},
            "spec": {"driver": "d", "nodeName": "n1",
                "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                "sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "40Gi"}}}],
                "devices": [partition("whole", "40Gi"), partition("half", "20Gi")]}
        }))
        .unwrap();
        let taken = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "taken", "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu"}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": "d", "pool": "n1", "device": "half"}]}}}
        }))
        .unwrap();
        let state = ClusterState::new(ClusterInput {
            classes: vec![class],
            slices: vec![slice],
            claims: vec![taken],
            ..Default::default()
        });
        let inventory = Inventory::of(&state);
        let wanted = claim(serde_json::json!({"name": "r", "exactly": {"deviceClassName": "gpu"}}));
        let r = &requests(&state, &inventory, &wanted)[0];
        let whole = r
            .devices
            .iter()
            .find(|v| inventory.devices[v.device].name == "whole")
            .unwrap();
        assert_eq!(whole.short_counters.len(), 1);
        let short = &whole.short_counters[0];
        assert_eq!(
            (
                short.counter.as_str(),
                short.needs.as_str(),
                short.left.as_str()
            ),
            ("gpu-0/memory", "40Gi", "20Gi")
        );
        let users: Vec<&str> = short
            .used_by
            .iter()
            .map(|&i| inventory.devices[i].name.as_str())
            .collect();
        assert_eq!(users, ["half"]);
        assert!(!whole.usable(&inventory));
    }

    #[test]
    fn names_read_finds_attribute_and_capacity_lookups_in_order() {
        let found = names_read(
            r#"device.capacity["d"].memory.isGreaterThan(quantity("1")) && device.attributes['d'].model == "x" && device.attributes["e"]["numa"] == 1"#,
        );
        assert_eq!(
            found,
            [
                (Map::Capacity, "d".to_string(), "memory".to_string()),
                (Map::Attributes, "d".to_string(), "model".to_string()),
                (Map::Attributes, "e".to_string(), "numa".to_string()),
            ]
        );
    }
}
