//! `kubectl dra claims`: each ResourceClaim, its state (pending: no devices yet;
//! allocated: devices but nobody reserved them; reserved: in use by the pods or PodGroups it
//! is reserved for), the devices, the node they are on and whom it is reserved for. A device
//! another claim holds too (two schedulers each allocated it; admin access and shared
//! capacity aside) is marked with the other claims.

use std::collections::{BTreeMap, BTreeSet};

use dra_engine::ClusterState;
use dra_engine::claims::{allocation, reserved_for};
use dra_engine::inventory::Inventory;
use serde::Serialize;

use super::table::{Table, list};

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    pub namespace: String,
    pub name: String,
    /// `pending`, `allocated` or `reserved`.
    pub state: &'static str,
    /// The nodes its devices are on (from the slices, else from the allocation's node
    /// selector).
    pub nodes: Vec<String>,
    pub devices: Vec<AllocatedDevice>,
    pub reserved_for: Vec<Consumer>,
    /// `Kind/name` of its controller (the pod a template made it for).
    pub owner: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocatedDevice {
    pub request: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
    /// Other claims (`namespace/name`) allocated this same device: a doubled device.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub also_allocated_to: Vec<String>,
}

/// The claims holding each device that no two claims may hold, in every namespace.
fn holders(state: &ClusterState) -> BTreeMap<String, Vec<String>> {
    let mut holders: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (key, claim) in &state.claims {
        for device in crate::run::owners::exclusive_devices(claim) {
            holders
                .entry(device.to_string())
                .or_default()
                .push(key.to_string());
        }
    }
    holders
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Consumer {
    pub resource: String,
    pub name: String,
}

impl Consumer {
    /// A pod by its name, anything else as `resource/name`.
    fn short(&self) -> String {
        if self.resource == "pods" {
            self.name.clone()
        } else {
            format!("{}/{}", self.resource, self.name)
        }
    }
}

/// The claims in `namespace` (every namespace: `None`), by namespace and name.
pub fn claims(state: &ClusterState, inventory: &Inventory, namespace: Option<&str>) -> Vec<Claim> {
    let node_of: BTreeMap<String, &str> = inventory
        .devices
        .iter()
        .filter_map(|d| Some((d.id(), d.node.as_deref()?)))
        .collect();
    let holders = holders(state);
    let mut keys: Vec<_> = state
        .claims
        .keys()
        .filter(|k| namespace.is_none_or(|ns| k.namespace == ns))
        .collect();
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let claim = &state.claims[key];
            let allocated = allocation(claim);
            let devices: Vec<AllocatedDevice> = allocated
                .iter()
                .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
                .map(|r| {
                    let id = format!("{}/{}/{}", r.driver, r.pool, r.device);
                    let me = key.to_string();
                    let shared = r.admin_access == Some(true) || r.share_id.is_some();
                    AllocatedDevice {
                        request: r.request.clone(),
                        driver: r.driver.clone(),
                        pool: r.pool.clone(),
                        device: r.device.clone(),
                        also_allocated_to: holders
                            .get(&id)
                            .into_iter()
                            .flatten()
                            .filter(|other| !shared && **other != me)
                            .cloned()
                            .collect(),
                    }
                })
                .collect();
            let mut nodes: BTreeSet<String> = devices
                .iter()
                .filter_map(|d| node_of.get(&format!("{}/{}/{}", d.driver, d.pool, d.device)))
                .map(|n| n.to_string())
                .collect();
            if nodes.is_empty() {
                let terms = allocated
                    .and_then(|a| a.node_selector.as_ref())
                    .map(|s| &s.node_selector_terms[..])
                    .unwrap_or_default();
                let fields = terms.iter().flat_map(|t| t.match_fields.iter().flatten());
                nodes.extend(
                    fields
                        .filter(|f| f.key == "metadata.name" && f.operator == "In")
                        .flat_map(|f| f.values.iter().flatten().cloned()),
                );
            }
            let reserved: Vec<Consumer> = reserved_for(claim)
                .iter()
                .map(|r| Consumer {
                    resource: r.resource.clone(),
                    name: r.name.clone(),
                })
                .collect();
            let state = match (allocated.is_some(), reserved.is_empty()) {
                (false, _) => "pending",
                (true, true) => "allocated",
                (true, false) => "reserved",
            };
            let owner = claim
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
                .map(|o| format!("{}/{}", o.kind, o.name));
            Claim {
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                state,
                nodes: nodes.into_iter().collect(),
                devices,
                reserved_for: reserved,
                owner,
            }
        })
        .collect()
}

/// The table `kubectl dra claims` prints: with a NAMESPACE column for `-A`; `wide` adds
/// each device's request and driver and the claim's owner.
pub fn table(claims: &[Claim], all_namespaces: bool, wide: bool) -> String {
    let mut headers = vec!["name", "state", "node", "devices", "reserved for"];
    if all_namespaces {
        headers.insert(0, "namespace");
    }
    if wide {
        headers.extend(["requests", "owner"]);
    }
    let mut t = Table::new(&headers);
    for c in claims {
        let devices: Vec<String> = c
            .devices
            .iter()
            .map(|d| match &d.also_allocated_to[..] {
                [] => format!("{}/{}", d.pool, d.device),
                others => format!(
                    "{}/{} (DOUBLED: also {})",
                    d.pool,
                    d.device,
                    others.join(" ")
                ),
            })
            .collect();
        let reserved: Vec<String> = c.reserved_for.iter().map(Consumer::short).collect();
        let mut row = vec![
            c.name.clone(),
            c.state.to_string(),
            list(&c.nodes),
            list(&devices),
            list(&reserved),
        ];
        if all_namespaces {
            row.insert(0, c.namespace.clone());
        }
        if wide {
            let requests: Vec<String> = c
                .devices
                .iter()
                .map(|d| format!("{}={}/{}/{}", d.request, d.driver, d.pool, d.device))
                .collect();
            row.push(list(&requests));
            row.push(c.owner.clone().unwrap_or_default());
        }
        t.push(row);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{allocated, claim, cluster, gpu, gpu_class, node, one_gpu, slice};
    use super::*;

    fn engine() -> dra_engine::Engine {
        cluster(vec![
            node("n1"),
            gpu_class(),
            slice(
                "n1",
                vec![
                    gpu("gpu-0", "RTX A5000", 0, "24Gi"),
                    gpu("gpu-1", "T10", 1, "16Gi"),
                ],
            ),
            allocated(
                claim("train-0-gpu", one_gpu(&[])),
                "n1",
                &[("gpu", "gpu-0")],
                Some("train-0"),
            ),
            allocated(
                claim("left-over", one_gpu(&[])),
                "n1",
                &[("gpu", "gpu-1")],
                None,
            ),
            claim("waiting", one_gpu(&[])),
        ])
    }

    #[test]
    fn each_claim_with_its_state_devices_node_and_pods() {
        let engine = engine();
        let inventory = Inventory::of(engine.state());
        let rows = claims(engine.state(), &inventory, Some("default"));
        assert_eq!(
            table(&rows, false, false),
            "\
NAME          STATE       NODE     DEVICES    RESERVED FOR
left-over     allocated   n1       n1/gpu-1   <none>
train-0-gpu   reserved    n1       n1/gpu-0   train-0
waiting       pending     <none>   <none>     <none>
"
        );
        assert_eq!(
            table(&rows[1..2], true, true),
            "\
NAMESPACE   NAME          STATE      NODE   DEVICES    RESERVED FOR   REQUESTS                       OWNER
default     train-0-gpu   reserved   n1     n1/gpu-0   train-0        gpu=gpu.example.com/n1/gpu-0   <none>
"
        );
    }

    #[test]
    fn a_device_two_claims_hold_is_marked_on_both() {
        let engine = cluster(vec![
            node("n1"),
            gpu_class(),
            slice("n1", vec![gpu("gpu-0", "RTX A5000", 0, "24Gi")]),
            allocated(
                claim("ours", one_gpu(&[])),
                "n1",
                &[("gpu", "gpu-0")],
                Some("a"),
            ),
            allocated(
                claim("theirs", one_gpu(&[])),
                "n1",
                &[("gpu", "gpu-0")],
                Some("b"),
            ),
        ]);
        let inventory = Inventory::of(engine.state());
        let rows = claims(engine.state(), &inventory, Some("default"));
        assert_eq!(
            table(&rows, false, false),
            "\
NAME     STATE      NODE   DEVICES                                   RESERVED FOR
ours     reserved   n1     n1/gpu-0 (DOUBLED: also default/theirs)   a
theirs   reserved   n1     n1/gpu-0 (DOUBLED: also default/ours)     b
"
        );
        assert_eq!(rows[0].devices[0].also_allocated_to, ["default/theirs"]);
    }

    #[test]
    fn another_namespace_has_none_of_them() {
        let engine = engine();
        let inventory = Inventory::of(engine.state());
        assert!(claims(engine.state(), &inventory, Some("ml")).is_empty());
        assert_eq!(claims(engine.state(), &inventory, None).len(), 3);
    }
}
