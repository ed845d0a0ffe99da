//! `kubectl dra nodes`: per node, its devices by driver, DeviceClass and product (total,
//! allocated, free, tainted, blocked by shared counters, on which NUMA nodes), and what the
//! shared counters of its partitionable devices have left. Read from the engine's
//! [`Inventory`].

use std::collections::{BTreeMap, BTreeSet};

use dra_engine::ClusterState;
use dra_engine::explain::short_counters;
use dra_engine::inventory::{DeviceInfo, Inventory};
use serde::Serialize;

use super::table::{NONE, Table, list};

/// One node and its devices. Devices that no single node owns (a slice for several nodes)
/// are listed under a node named `""`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeDevices {
    pub name: String,
    /// The NUMA nodes its devices are on.
    pub numa_domains: Vec<i64>,
    /// By driver, class and product.
    pub groups: Vec<DeviceGroup>,
    pub devices: Vec<Device>,
    /// Shared counters of its partitionable devices: total and left.
    pub counters: Vec<Counter>,
}

/// Devices of one driver, class and product on a node. A device counts in every class it
/// matches; one in no class counts under class `""`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceGroup {
    pub driver: String,
    pub class: String,
    pub product: String,
    pub total: usize,
    pub allocated: usize,
    pub free: usize,
    pub tainted: usize,
    /// Free, but the shared counters they draw on are used up (partitions of a device
    /// whose other partitions, or the whole, are allocated).
    pub blocked: usize,
    pub numa: Vec<i64>,
    pub pools: Vec<String>,
    pub free_devices: Vec<String>,
    pub taints: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub driver: String,
    pub pool: String,
    pub name: String,
    pub product: Option<String>,
    pub numa: Option<i64>,
    pub classes: Vec<String>,
    /// `free`, `allocated`, `tainted` or `blocked` (by shared counters).
    pub state: &'static str,
    /// `namespace/name` of the claim it is allocated to.
    pub claim: Option<String>,
    pub reserved_for: Vec<String>,
    pub taints: Vec<String>,
    /// It draws on shared counters (a partition of a partitionable device).
    pub partition: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counter {
    pub driver: String,
    pub pool: String,
    pub counter_set: String,
    pub counter: String,
    pub total: String,
    pub left: String,
}

impl Device {
    fn of(d: &DeviceInfo, blocked: bool) -> Device {
        Device {
            driver: d.driver.clone(),
            pool: d.pool.clone(),
            name: d.name.clone(),
            product: d.product.clone(),
            numa: d.numa,
            classes: d.classes.clone(),
            state: state(d, blocked),
            claim: d.claim.as_ref().map(|c| c.to_string()),
            reserved_for: d.reserved_for.clone(),
            taints: d.taints.clone(),
            partition: d.partition,
        }
    }
}

/// Every node of the cluster (only those in `selected`, when given: `-l`), by name, with
/// its devices; nodes without devices have none listed.
pub fn nodes(
    state: &ClusterState,
    inventory: &Inventory,
    selected: Option<&BTreeSet<String>>,
) -> Vec<NodeDevices> {
    let mut names: BTreeSet<String> = state.nodes.keys().cloned().collect();
    names.extend(inventory.nodes().into_iter().map(String::from));
    if selected.is_none() && inventory.devices.iter().any(|d| d.node.is_none()) {
        names.insert(String::new());
    }
    let short = short_counters(state, inventory);
    let blocked: Vec<bool> = short.iter().map(|s| !s.is_empty()).collect();
    names
        .into_iter()
        .filter(|n| selected.is_none_or(|s| s.contains(n)))
        .map(|name| node(inventory, &blocked, name))
        .collect()
}

fn node(inventory: &Inventory, blocked: &[bool], name: String) -> NodeDevices {
    let here = |node: &Option<String>| node.as_deref().unwrap_or_default() == name;
    let devices: Vec<(&DeviceInfo, bool)> = inventory
        .devices
        .iter()
        .zip(blocked.iter().copied())
        .filter(|(d, _)| here(&d.node))
        .collect();
    let mut groups: BTreeMap<(String, String, String), DeviceGroup> = BTreeMap::new();
    for &(d, blocked) in &devices {
        let classes = if d.classes.is_empty() {
            vec![String::new()]
        } else {
            d.classes.clone()
        };
        for class in classes {
            let product = d.product.clone().unwrap_or_default();
            let g = groups
                .entry((d.driver.clone(), class.clone(), product.clone()))
                .or_insert_with(|| DeviceGroup {
                    driver: d.driver.clone(),
                    class,
                    product,
                    total: 0,
                    allocated: 0,
                    free: 0,
                    tainted: 0,
                    blocked: 0,
                    numa: Vec::new(),
                    pools: Vec::new(),
                    free_devices: Vec::new(),
                    taints: Vec::new(),
                });
            g.total += 1;
            match state(d, blocked) {
                "allocated" => g.allocated += 1,
                "tainted" => g.tainted += 1,
                "blocked" => g.blocked += 1,
                _ => {
                    g.free += 1;
                    g.free_devices.push(d.name.clone());
                }
            }
            add_once(&mut g.numa, d.numa);
            add_once(&mut g.pools, Some(d.pool.clone()));
            for t in &d.taints {
                add_once(&mut g.taints, Some(t.clone()));
            }
        }
    }
    let mut groups: Vec<DeviceGroup> = groups.into_values().collect();
    for g in &mut groups {
        g.numa.sort();
    }
    let numa_domains: BTreeSet<i64> = devices.iter().filter_map(|(d, _)| d.numa).collect();
    NodeDevices {
        counters: inventory
            .counters
            .iter()
            .filter(|c| here(&c.node))
            .map(|c| Counter {
                driver: c.driver.clone(),
                pool: c.pool.clone(),
                counter_set: c.counter_set.clone(),
                counter: c.counter.clone(),
                total: c.total.clone(),
                left: c.left.clone(),
            })
            .collect(),
        name,
        numa_domains: numa_domains.into_iter().collect(),
        groups,
        devices: devices.into_iter().map(|(d, b)| Device::of(d, b)).collect(),
    }
}

/// The inventory's state, and `blocked` for a free device its counters do not allow.
fn state(d: &DeviceInfo, blocked: bool) -> &'static str {
    match d.state() {
        "free" if blocked => "blocked",
        state => state,
    }
}

fn add_once<T: PartialEq>(to: &mut Vec<T>, item: Option<T>) {
    if let Some(item) = item
        && !to.contains(&item)
    {
        to.push(item);
    }
}

/// The table `kubectl dra nodes` prints (`wide`: with pools, free devices and taints),
/// then, where partitionable devices are, the table of their shared counters.
pub fn table(nodes: &[NodeDevices], wide: bool) -> String {
    let mut headers = vec![
        "node",
        "driver",
        "class",
        "product",
        "total",
        "allocated",
        "free",
        "tainted",
        "blocked",
        "numa",
    ];
    if wide {
        headers.extend(["pool", "free devices", "taints"]);
    }
    let mut devices = Table::new(&headers);
    let mut counters = Table::new(&[
        "node",
        "driver",
        "pool",
        "counter set",
        "counter",
        "total",
        "left",
    ]);
    for node in nodes {
        if node.groups.is_empty() {
            let mut row = vec![node.name.clone(), NONE.into(), NONE.into(), NONE.into()];
            row.extend(["0", "0", "0", "0", "0"].map(String::from));
            row.push(NONE.into());
            if wide {
                row.extend([NONE, NONE, NONE].map(String::from));
            }
            devices.push(row);
        }
        for g in &node.groups {
            let numa: Vec<String> = g.numa.iter().map(i64::to_string).collect();
            let mut row = vec![
                node.name.clone(),
                g.driver.clone(),
                g.class.clone(),
                g.product.clone(),
                g.total.to_string(),
                g.allocated.to_string(),
                g.free.to_string(),
                g.tainted.to_string(),
                g.blocked.to_string(),
                list(&numa),
            ];
            if wide {
                row.extend([list(&g.pools), list(&g.free_devices), list(&g.taints)]);
            }
            devices.push(row);
        }
        for c in &node.counters {
            counters.push(vec![
                node.name.clone(),
                c.driver.clone(),
                c.pool.clone(),
                c.counter_set.clone(),
                c.counter.clone(),
                c.total.clone(),
                c.left.clone(),
            ]);
        }
    }
    let mut out = devices.render();
    if !counters.is_empty() {
        out.push('\n');
        out.push_str(&counters.render());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{
        DRIVER, Obj, allocated, claim, cluster, gpu, gpu_class, node, one_gpu, slice,
    };
    use super::*;

    #[test]
    fn devices_are_counted_per_driver_class_and_product_with_their_numa_nodes() {
        let engine = cluster(vec![
            node("gpu-node-1"),
            node("cpu-node"),
            gpu_class(),
            slice(
                "gpu-node-1",
                vec![
                    gpu("gpu-0", "RTX A5000", 0, "24Gi"),
                    gpu("gpu-1", "T10", 0, "16Gi"),
                    gpu("gpu-2", "T10", 1, "16Gi").tainted("fan"),
                    gpu("gpu-3", "T10", 1, "16Gi"),
                ],
            ),
            allocated(
                claim("train-0-gpu", one_gpu(&[])),
                "gpu-node-1",
                &[("gpu", "gpu-1")],
                Some("train-0"),
            ),
        ]);
        let inventory = Inventory::of(engine.state());
        let report = nodes(engine.state(), &inventory, None);
        assert_eq!(
            table(&report, false),
            "\
NODE         DRIVER            CLASS    PRODUCT     TOTAL   ALLOCATED   FREE   TAINTED   BLOCKED   NUMA
cpu-node     <none>            <none>   <none>      0       0           0      0         0         <none>
gpu-node-1   gpu.example.com   gpu      RTX A5000   1       0           1      0         0         0
gpu-node-1   gpu.example.com   gpu      T10         3       1           1      1         0         0,1
"
        );
        assert_eq!(
            table(&report, true),
            "\
NODE         DRIVER            CLASS    PRODUCT     TOTAL   ALLOCATED   FREE   TAINTED   BLOCKED   NUMA     POOL         FREE DEVICES   TAINTS
cpu-node     <none>            <none>   <none>      0       0           0      0         0         <none>   <none>       <none>         <none>
gpu-node-1   gpu.example.com   gpu      RTX A5000   1       0           1      0         0         0        gpu-node-1   gpu-0          <none>
gpu-node-1   gpu.example.com   gpu      T10         3       1           1      1         0         0,1      gpu-node-1   gpu-3          fan=bad:NoSchedule
"
        );
        assert_eq!(report[1].numa_domains, [0, 1]);
        let selected = BTreeSet::from(["cpu-node".to_string()]);
        assert_eq!(nodes(engine.state(), &inventory, Some(&selected)).len(), 1);
    }

    #[test]
    fn partitionable_devices_show_what_their_shared_counters_have_left() {
        let partition = |name: &str, memory: &str| {
            serde_json::json!({"name": name,
                "attributes": {"productName": {"string": "A100 MIG"}},
                "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": memory}}}]})
        };
        let engine = cluster(vec![
            node("n1"),
            gpu_class(),
            Obj::Slice(serde_json::json!({
                "metadata": {"name": "n1-mig"},
                "spec": {"driver": DRIVER, "nodeName": "n1",
                    "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                    "sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "40Gi"}}}],
                    "devices": [
                        partition("mig-0", "10Gi"),
                        partition("mig-1", "20Gi"),
                        partition("whole", "40Gi"),
                    ]}
            })),
            allocated(
                claim("a", one_gpu(&[])),
                "n1",
                &[("gpu", "mig-1")],
                Some("p"),
            ),
        ]);
        let inventory = Inventory::of(engine.state());
        let report = nodes(engine.state(), &inventory, None);
        assert_eq!(
            table(&report, false),
            "\
NODE   DRIVER            CLASS   PRODUCT    TOTAL   ALLOCATED   FREE   TAINTED   BLOCKED   NUMA
n1     gpu.example.com   gpu     A100 MIG   3       1           1      0         1         <none>

NODE   DRIVER            POOL   COUNTER SET   COUNTER   TOTAL   LEFT
n1     gpu.example.com   n1     gpu-0         memory    40Gi    20Gi
"
        );
        assert!(report[0].devices.iter().all(|d| d.partition));
        let states: Vec<_> = report[0].devices.iter().map(|d| d.state).collect();
        assert_eq!(states, ["free", "allocated", "blocked"]);
    }
}
