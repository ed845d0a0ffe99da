//! Small builders for the API objects the allocator reads, so tests, benches and examples
//! read like the scenario they describe: `slice("s", "gpu.example.com").node("n1").device(
//! device("gpu-0").int("numa", 0))`. Not needed by the engine.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::*;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    }
}

/// A Node with labels.
pub fn node(name: &str) -> NodeBuilder {
    NodeBuilder(Node {
        metadata: meta(name),
        ..Default::default()
    })
}

#[derive(Clone, Debug)]
pub struct NodeBuilder(Node);

impl NodeBuilder {
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
        self
    }
    pub fn build(self) -> Node {
        self.0
    }
}

/// A one-term node selector `key In [values]`.
pub fn label_selector(key: &str, values: &[&str]) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: key.into(),
                operator: "In".into(),
                values: Some(values.iter().map(|s| s.to_string()).collect()),
            }]),
            match_fields: None,
        }],
    }
}

/// A device in a slice.
pub fn device(name: &str) -> DeviceBuilder {
    DeviceBuilder(Device {
        name: name.into(),
        ..Default::default()
    })
}

#[derive(Clone, Debug)]
pub struct DeviceBuilder(Device);

impl DeviceBuilder {
    fn attr(mut self, k: &str, a: DeviceAttribute) -> Self {
        self.0
            .attributes
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), a);
        self
    }
    pub fn int(self, k: &str, v: i64) -> Self {
        self.attr(
            k,
            DeviceAttribute {
                int: Some(v),
                ..Default::default()
            },
        )
    }
    pub fn string(self, k: &str, v: &str) -> Self {
        self.attr(
            k,
            DeviceAttribute {
                string: Some(v.into()),
                ..Default::default()
            },
        )
    }
    pub fn bool(self, k: &str, v: bool) -> Self {
        self.attr(
            k,
            DeviceAttribute {
                bool: Some(v),
                ..Default::default()
            },
        )
    }
    pub fn version(self, k: &str, v: &str) -> Self {
        self.attr(
            k,
            DeviceAttribute {
                version: Some(v.into()),
                ..Default::default()
            },
        )
    }
    pub fn strings(self, k: &str, v: &[&str]) -> Self {
        let list = v.iter().map(|s| s.to_string()).collect();
        self.attr(
            k,
            DeviceAttribute {
                strings: Some(list),
                ..Default::default()
            },
        )
    }
    pub fn capacity(mut self, k: &str, v: &str) -> Self {
        let cap = DeviceCapacity {
            value: Quantity(v.into()),
            request_policy: None,
        };
        self.0
            .capacity
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), cap);
        self
    }
    /// Capacity with a request policy.
    pub fn capacity_policy(mut self, k: &str, v: &str, policy: CapacityRequestPolicy) -> Self {
        let cap = DeviceCapacity {
            value: Quantity(v.into()),
            request_policy: Some(policy),
        };
        self.0
            .capacity
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), cap);
        self
    }
    pub fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
        self.0
            .taints
            .get_or_insert_with(Vec::new)
            .push(DeviceTaint {
                key: key.into(),
                value: Some(value.into()).filter(|v: &String| !v.is_empty()),
                effect: effect.into(),
                time_added: None,
            });
        self
    }
    pub fn consumes(mut self, set: &str, counters: &[(&str, &str)]) -> Self {
        self.0
            .consumes_counters
            .get_or_insert_with(Vec::new)
            .push(DeviceCounterConsumption {
                counter_set: set.into(),
                counters: counters
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.to_string(),
                            Counter {
                                value: Quantity(v.to_string()),
                            },
                        )
                    })
                    .collect(),
                ..Default::default()
            });
        self
    }
    pub fn multi(mut self) -> Self {
        self.0.allow_multiple_allocations = Some(true);
        self
    }
    pub fn binding_conditions(mut self, conditions: &[&str], failure: &[&str]) -> Self {
        self.0.binding_conditions = Some(conditions.iter().map(|s| s.to_string()).collect());
        self.0.binding_failure_conditions = Some(failure.iter().map(|s| s.to_string()).collect());
        self
    }
    pub fn binds_to_node(mut self) -> Self {
        self.0.binds_to_node = Some(true);
        self
    }
    /// Per-device placement (for slices with `perDeviceNodeSelection`).
    pub fn on_node(mut self, n: &str) -> Self {
        self.0.node_name = Some(n.into());
        self
    }
    pub fn on_all_nodes(mut self) -> Self {
        self.0.all_nodes = Some(true);
        self
    }
    pub fn build(self) -> Device {
        self.0
    }
}

/// A ResourceSlice of `driver`, in a pool named like the slice unless [`SliceBuilder::pool`]
/// says otherwise; generation 1, one slice per pool.
pub fn slice(name: &str, driver: &str) -> SliceBuilder {
    SliceBuilder(ResourceSlice {
        metadata: meta(name),
        spec: ResourceSliceSpec {
            driver: driver.into(),
            pool: ResourcePool {
                name: name.into(),
                generation: 1,
                resource_slice_count: 1,
            },
            ..Default::default()
        },
    })
}

#[derive(Clone, Debug)]
pub struct SliceBuilder(ResourceSlice);

impl SliceBuilder {
    pub fn pool(mut self, pool: &str, generation: i64, slice_count: i64) -> Self {
        self.0.spec.pool = ResourcePool {
            name: pool.into(),
            generation,
            resource_slice_count: slice_count,
        };
        self
    }
    pub fn node(mut self, n: &str) -> Self {
        self.0.spec.node_name = Some(n.into());
        self
    }
    pub fn all_nodes(mut self) -> Self {
        self.0.spec.all_nodes = Some(true);
        self
    }
    pub fn node_selector(mut self, s: NodeSelector) -> Self {
        self.0.spec.node_selector = Some(s);
        self
    }
    pub fn per_device_nodes(mut self) -> Self {
        self.0.spec.per_device_node_selection = Some(true);
        self
    }
    pub fn device(mut self, d: DeviceBuilder) -> Self {
        self.0
            .spec
            .devices
            .get_or_insert_with(Vec::new)
            .push(d.build());
        self
    }
    pub fn devices(mut self, ds: impl IntoIterator<Item = DeviceBuilder>) -> Self {
        for d in ds {
            self = self.device(d);
        }
        self
    }
    pub fn counter_set(mut self, name: &str, counters: &[(&str, &str)]) -> Self {
        self.0
            .spec
            .shared_counters
            .get_or_insert_with(Vec::new)
            .push(CounterSet {
                name: name.into(),
                counters: counters
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.to_string(),
                            Counter {
                                value: Quantity(v.to_string()),
                            },
                        )
                    })
                    .collect(),
            });
        self
    }
    pub fn build(self) -> ResourceSlice {
        self.0
    }
}

/// A DeviceClass.
pub fn class(name: &str) -> ClassBuilder {
    ClassBuilder(DeviceClass {
        metadata: meta(name),
        spec: Some(DeviceClassSpec::default()),
    })
}

#[derive(Clone, Debug)]
pub struct ClassBuilder(DeviceClass);

impl ClassBuilder {
    pub fn selector(mut self, cel: &str) -> Self {
        let spec = self.0.spec.get_or_insert_with(Default::default);
        spec.selectors
            .get_or_insert_with(Vec::new)
            .push(cel_selector(cel));
        self
    }
    pub fn config(mut self, driver: &str, parameters: serde_json::Value) -> Self {
        let spec = self.0.spec.get_or_insert_with(Default::default);
        spec.config
            .get_or_insert_with(Vec::new)
            .push(DeviceClassConfiguration {
                opaque: Some(opaque(driver, parameters)),
            });
        self
    }
    pub fn build(self) -> DeviceClass {
        self.0
    }
}

fn cel_selector(cel: &str) -> DeviceSelector {
    DeviceSelector {
        cel: Some(CELDeviceSelector {
            expression: cel.into(),
        }),
    }
}

fn opaque(driver: &str, parameters: serde_json::Value) -> OpaqueDeviceConfiguration {
    OpaqueDeviceConfiguration {
        driver: driver.into(),
        parameters: RawExtension(parameters),
    }
}

/// A ResourceClaim in namespace `default`.
pub fn claim(name: &str) -> ClaimBuilder {
    ClaimBuilder(ResourceClaim {
        metadata: ObjectMeta {
            namespace: Some("default".into()),
            ..meta(name)
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim::default()),
        }),
        status: None,
    })
}

#[derive(Clone, Debug)]
pub struct ClaimBuilder(ResourceClaim);

impl ClaimBuilder {
    fn devices(&mut self) -> &mut DeviceClaim {
        self.0
            .spec
            .get_or_insert_with(Default::default)
            .devices
            .get_or_insert_with(Default::default)
    }
    pub fn request(mut self, r: RequestBuilder) -> Self {
        self.devices()
            .requests
            .get_or_insert_with(Vec::new)
            .push(r.build());
        self
    }
    pub fn match_attribute(mut self, attribute: &str, requests: &[&str]) -> Self {
        self.devices()
            .constraints
            .get_or_insert_with(Vec::new)
            .push(DeviceConstraint {
                match_attribute: Some(attribute.into()),
                requests: Some(requests.iter().map(|s| s.to_string()).collect())
                    .filter(|r: &Vec<_>| !r.is_empty()),
                ..Default::default()
            });
        self
    }
    pub fn distinct_attribute(mut self, attribute: &str, requests: &[&str]) -> Self {
        self.devices()
            .constraints
            .get_or_insert_with(Vec::new)
            .push(DeviceConstraint {
                distinct_attribute: Some(attribute.into()),
                requests: Some(requests.iter().map(|s| s.to_string()).collect())
                    .filter(|r: &Vec<_>| !r.is_empty()),
                ..Default::default()
            });
        self
    }
    pub fn config(
        mut self,
        requests: &[&str],
        driver: &str,
        parameters: serde_json::Value,
    ) -> Self {
        self.devices()
            .config
            .get_or_insert_with(Vec::new)
            .push(DeviceClaimConfiguration {
                requests: Some(requests.iter().map(|s| s.to_string()).collect())
                    .filter(|r: &Vec<_>| !r.is_empty()),
                opaque: Some(opaque(driver, parameters)),
            });
        self
    }
    pub fn build(self) -> ResourceClaim {
        self.0
    }
}

/// A request for one device of `class` (`exactly`).
pub fn request(name: &str, class: &str) -> RequestBuilder {
    RequestBuilder {
        name: name.into(),
        exact: ExactDeviceRequest {
            device_class_name: class.into(),
            allocation_mode: Some("ExactCount".into()),
            count: Some(1),
            ..Default::default()
        },
        subs: Vec::new(),
    }
}

/// A `firstAvailable` request made of `subrequests` (built with [`request`]).
pub fn first_available(name: &str, subrequests: Vec<RequestBuilder>) -> RequestBuilder {
    let mut r = request(name, "");
    r.subs = subrequests;
    r
}

#[derive(Clone, Debug)]
pub struct RequestBuilder {
    name: String,
    exact: ExactDeviceRequest,
    subs: Vec<RequestBuilder>,
}

impl RequestBuilder {
    pub fn count(mut self, n: i64) -> Self {
        self.exact.count = Some(n);
        self
    }
    pub fn all(mut self) -> Self {
        self.exact.allocation_mode = Some("All".into());
        self.exact.count = None;
        self
    }
    pub fn admin(mut self) -> Self {
        self.exact.admin_access = Some(true);
        self
    }
    pub fn selector(mut self, cel: &str) -> Self {
        self.exact
            .selectors
            .get_or_insert_with(Vec::new)
            .push(cel_selector(cel));
        self
    }
    /// Tolerate `key` (`Exists` when `value` is `None`) for `effect` (any when empty).
    pub fn tolerate(mut self, key: &str, value: Option<&str>, effect: &str) -> Self {
        self.exact
            .tolerations
            .get_or_insert_with(Vec::new)
            .push(DeviceToleration {
                key: Some(key.into()),
                operator: Some(if value.is_some() { "Equal" } else { "Exists" }.into()),
                value: value.map(Into::into),
                effect: Some(effect.into()).filter(|e: &String| !e.is_empty()),
                toleration_seconds: None,
            });
        self
    }
    pub fn capacity(mut self, name: &str, q: &str) -> Self {
        let caps = self.exact.capacity.get_or_insert_with(Default::default);
        caps.requests
            .get_or_insert_with(BTreeMap::new)
            .insert(name.into(), Quantity(q.into()));
        self
    }
    pub fn build(self) -> DeviceRequest {
        if self.subs.is_empty() {
            return DeviceRequest {
                name: self.name,
                exactly: Some(self.exact),
                first_available: None,
            };
        }
        let subs = self
            .subs
            .into_iter()
            .map(|s| DeviceSubRequest {
                name: s.name,
                device_class_name: s.exact.device_class_name,
                allocation_mode: s.exact.allocation_mode,
                count: s.exact.count,
                selectors: s.exact.selectors,
                tolerations: s.exact.tolerations,
                capacity: s.exact.capacity,
                derived_attributes: None,
            })
            .collect();
        DeviceRequest {
            name: self.name,
            exactly: None,
            first_available: Some(subs),
        }
    }
}

/// A DeviceTaintRule for devices matching driver/pool/device (each optional).
pub fn taint_rule(
    name: &str,
    driver: Option<&str>,
    pool: Option<&str>,
    device: Option<&str>,
    key: &str,
    effect: &str,
) -> DeviceTaintRule {
    DeviceTaintRule {
        metadata: meta(name),
        spec: DeviceTaintRuleSpec {
            device_selector: Some(DeviceTaintSelector {
                driver: driver.map(Into::into),
                pool: pool.map(Into::into),
                device: device.map(Into::into),
            }),
            taint: DeviceTaint {
                key: key.into(),
                value: None,
                effect: effect.into(),
                time_added: None,
            },
        },
        status: None,
    }
}

/// A node-local slice of `n` GPUs spread over `numa` NUMA domains
/// (`resource.kubernetes.io/numaNode`), named `gpu-<i>`, in pool `<node>`.
pub fn gpu_slice(node: &str, driver: &str, n: usize, numa: usize) -> SliceBuilder {
    let per = n.div_ceil(numa.max(1));
    slice(&format!("{node}-{driver}"), driver)
        .pool(node, 1, 1)
        .node(node)
        .devices((0..n).map(|i| {
            device(&format!("gpu-{i}"))
                .string("type", "gpu")
                .int("resource.kubernetes.io/numaNode", (i / per) as i64)
                .capacity("memory", "80Gi")
        }))
}

/// An AllocationResult that marks devices as allocated (for snapshot inputs).
pub fn allocated(devices: &[(&str, &str, &str)]) -> AllocationResult {
    AllocationResult {
        devices: Some(DeviceAllocationResult {
            results: Some(
                devices
                    .iter()
                    .map(|(driver, pool, device)| DeviceRequestAllocationResult {
                        request: "r".into(),
                        driver: driver.to_string(),
                        pool: pool.to_string(),
                        device: device.to_string(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            config: None,
        }),
        ..Default::default()
    }
}
