//! The five workloads, modelled on scheduler_perf's DRA suite (Kubernetes 1.37,
//! `test/integration/scheduler_perf/dra`): the cluster's objects (nodes, ResourceSlices,
//! DeviceClasses), the claims already allocated before the measurement (scheduler_perf's
//! `allocResourceClaims`), the template every measured pod's claim comes from, and, for the
//! write ceiling, a valid allocation for the n-th measured pod that needs no search.

use serde_json::{Value, json};

/// The driver of scheduler_perf's test devices.
pub const TEST_DRIVER: &str = "test-driver.cdi.k8s.io";
const GPU_DRIVER: &str = "gpu.example.com";
const NIC_DRIVER: &str = "nic.example.com";
/// Devices per node in the basic slices (scheduler_perf's `numDevices: 10`).
const BASIC_DEVICES: usize = 10;
/// GPUs per node in the matchAttribute case, half on each NUMA node; one NIC per NUMA node.
const GPUS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Workload {
    /// SchedulingWithResourceClaimTemplate 5000pods_500nodes: 10 devices per node, half of
    /// them allocated first, then a burst of one-device pods that fills the rest.
    Template,
    /// SteadyStateClusterResourceClaimTemplate half_500nodes: half of the devices allocated;
    /// batches of a few pods, each batch deleted once bound and replaced by the next
    /// ([`Refill`]).
    SteadyState,
    /// FirstAvailable: the request's first subrequest names a class no device matches.
    FirstAvailable,
    /// Partitionable: two devices per node drawing on one shared counter set; a pod takes
    /// both (a whole node).
    Partitionable,
    /// Two GPUs and a NIC on one NUMA node (`matchAttribute`), on nodes with 8 GPUs and 2 NICs.
    MatchAttribute,
}

/// How the measured pods arrive.
#[derive(Clone, Copy, Debug)]
pub enum Arrival {
    /// All at once; measured until the last is bound.
    Burst { pods: usize },
    /// `pending` pods at a time, replaced as `refill` says, for `seconds`.
    Steady {
        pending: usize,
        seconds: u64,
        refill: Refill,
    },
}

/// How SteadyState replaces its bound pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Refill {
    /// scheduler_perf's `createPodsSteadily`: a batch of `pending` pods created at once;
    /// when all of them are bound, they are deleted together (one DeleteCollection, grace
    /// period 0) and the next batch is created.
    Batch,
    /// Each pod seen bound is deleted and replaced at once, so that `pending` pods wait at
    /// all times: paced by one pod's round trip, not by a batch's slowest pod.
    EachPod,
}

impl Refill {
    /// The name `E2E_STEADY_REFILL` uses.
    pub fn parse(s: &str) -> Option<Refill> {
        match s {
            "batch" => Some(Refill::Batch),
            "each" => Some(Refill::EachPod),
            _ => None,
        }
    }
}

/// A workload at one size.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub workload: Workload,
    pub nodes: usize,
    /// Claims allocated before the measurement, in namespace `init`.
    pub init: usize,
    pub arrival: Arrival,
}

impl Workload {
    pub const ALL: [Workload; 5] = [
        Workload::Template,
        Workload::SteadyState,
        Workload::FirstAvailable,
        Workload::Partitionable,
        Workload::MatchAttribute,
    ];

    /// The name `E2E_WORKLOADS` uses.
    pub fn key(self) -> &'static str {
        match self {
            Workload::Template => "template",
            Workload::SteadyState => "steady",
            Workload::FirstAvailable => "first-available",
            Workload::Partitionable => "partitionable",
            Workload::MatchAttribute => "match-attribute",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Workload::Template => "SchedulingWithResourceClaimTemplate",
            Workload::SteadyState => "SteadyState, half full",
            Workload::FirstAvailable => "FirstAvailable",
            Workload::Partitionable => "Partitionable",
            Workload::MatchAttribute => "matchAttribute: 2 GPUs + NIC on one NUMA node",
        }
    }

    /// The plan at `nodes` nodes; `pods` overrides the template burst's size.
    pub fn plan(self, nodes: usize, pods: Option<usize>, steady: (usize, u64, Refill)) -> Plan {
        let half = nodes * BASIC_DEVICES / 2;
        let (init, arrival) = match self {
            Workload::Template => (
                half,
                Arrival::Burst {
                    pods: pods.unwrap_or(half),
                },
            ),
            Workload::SteadyState => (
                half,
                Arrival::Steady {
                    pending: steady.0,
                    seconds: steady.1,
                    refill: steady.2,
                },
            ),
            Workload::FirstAvailable => (half, Arrival::Burst { pods: 2 * nodes }),
            // A quarter of the nodes taken; the burst takes half of them.
            Workload::Partitionable => (nodes / 4, Arrival::Burst { pods: nodes / 2 }),
            // Room for two such pods per node; the burst fills half of it.
            Workload::MatchAttribute => (0, Arrival::Burst { pods: nodes }),
        };
        Plan {
            workload: self,
            nodes,
            init,
            arrival,
        }
    }
}

pub fn node_name(i: usize) -> String {
    format!("node-{i:04}")
}

pub fn node(i: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node_name(i), "labels": {"node-with-dra": "true"}},
        "spec": {},
        "status": {
            "capacity": {"pods": "110", "cpu": "4", "memory": "32Gi"},
            "allocatable": {"pods": "110", "cpu": "4", "memory": "32Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
            "phase": "Running",
        },
    })
}

fn selector_for(node: &str) -> Value {
    json!({"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}
    ]}]})
}

impl Plan {
    /// DeviceClasses.
    pub fn classes(&self) -> Vec<Value> {
        let class = |name: &str, cel: &str| {
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": cel}}]}})
        };
        match self.workload {
            Workload::MatchAttribute => vec![
                class("gpu", &format!("device.driver == '{GPU_DRIVER}'")),
                class("nic", &format!("device.driver == '{NIC_DRIVER}'")),
            ],
            _ => vec![
                class("test-class", &format!("device.driver == '{TEST_DRIVER}'")),
                class(
                    "no-devices-class",
                    "device.driver == 'no-such-driver.example.com'",
                ),
            ],
        }
    }

    /// The ResourceSlices of node `i`.
    pub fn slices(&self, i: usize) -> Vec<Value> {
        let node = node_name(i);
        let slice = |name: String, driver: &str, count: usize, spec: Value| {
            let mut s = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": name},
                "spec": {"driver": driver, "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": count}}});
            for (k, v) in spec.as_object().unwrap() {
                s["spec"][k] = v.clone();
            }
            s
        };
        match self.workload {
            Workload::Partitionable => vec![
                slice(
                    format!("{node}-counters"),
                    TEST_DRIVER,
                    2,
                    json!({"sharedCounters": [{"name": "counter-set", "counters": {
                        "counter1": {"value": "1"}, "counter2": {"value": "1"},
                        "counter3": {"value": "1"}, "counter4": {"value": "1"}}}]}),
                ),
                slice(
                    format!("{node}-devices"),
                    TEST_DRIVER,
                    2,
                    json!({"devices": [
                        {"name": "device-1", "consumesCounters": [{"counterSet": "counter-set",
                            "counters": {"counter1": {"value": "1"}, "counter2": {"value": "1"}}}]},
                        {"name": "device-2", "consumesCounters": [{"counterSet": "counter-set",
                            "counters": {"counter3": {"value": "1"}, "counter4": {"value": "1"}}}]},
                    ]}),
                ),
            ],
            Workload::MatchAttribute => {
                let gpus: Vec<Value> = (0..GPUS)
                    .map(|g| {
                        json!({"name": format!("gpu-{g}"), "attributes": {
                            "type": {"string": "gpu"},
                            "resource.kubernetes.io/numaNode": {"int": g / (GPUS / 2)},
                            "resource.kubernetes.io/pciBusID": {"string": format!("0000:{:02x}:00.0", g + 1)}},
                            "capacity": {"memory": {"value": "80Gi"}}})
                    })
                    .collect();
                let nics: Vec<Value> = (0..2)
                    .map(|n| {
                        json!({"name": format!("nic-{n}"), "attributes": {
                            "resource.kubernetes.io/numaNode": {"int": n}}})
                    })
                    .collect();
                vec![
                    slice(
                        format!("{node}-gpus"),
                        GPU_DRIVER,
                        1,
                        json!({"devices": gpus}),
                    ),
                    slice(
                        format!("{node}-nics"),
                        NIC_DRIVER,
                        1,
                        json!({"devices": nics}),
                    ),
                ]
            }
            _ => {
                // scheduler_perf's resourceslice-basic-devices: an Intel GPU's attributes,
                // PCI roots alternating.
                let devices: Vec<Value> = (0..BASIC_DEVICES)
                    .map(|d| {
                        json!({"name": format!("basic-device-{d}"), "attributes": {
                            "driver": {"string": "xe"},
                            "driverVersion": {"version": "1.2.3"},
                            "family": {"string": "Arc Pro B-Series"},
                            "health": {"string": "Healthy"},
                            "model": {"string": "B60"},
                            "pciAddress": {"string": format!("0000:0{d}:00.0")},
                            "pciId": {"string": "0xe211"},
                            "pciRoot": {"string": format!("0{}", d % 2)},
                            "sriov": {"bool": true},
                            "type": {"string": "gpu"},
                            "resource.kubernetes.io/pciBusID": {"string": format!("0000:0{d}:00.0")},
                            "resource.kubernetes.io/pciRoot": {"string": format!("pci0000:0{}", d % 2)}},
                            "capacity": {"memory": {"value": "24480Mi"}, "millicores": {"value": "1k"}}})
                    })
                    .collect();
                vec![slice(
                    node.clone(),
                    TEST_DRIVER,
                    1,
                    json!({"devices": devices}),
                )]
            }
        }
    }

    /// The spec of the claims in namespace `init`.
    fn init_claim_spec(&self) -> Value {
        let count = if self.workload == Workload::Partitionable {
            2
        } else {
            1
        };
        json!({"devices": {"requests": [{"name": "req-0",
            "exactly": {"deviceClassName": "test-class", "count": count}}]}})
    }

    /// Init claim `k` and the status that allocates it (no consumer, as scheduler_perf's
    /// `allocResourceClaims` leaves them): spread over the nodes, lowest devices first.
    pub fn init_claim(&self, k: usize) -> (Value, Value) {
        let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": format!("init-{k:05}"), "namespace": "init"},
            "spec": self.init_claim_spec()});
        let (node, results) = match self.workload {
            Workload::Partitionable => (
                node_name(k),
                vec![
                    result("req-0", TEST_DRIVER, &node_name(k), "device-1"),
                    result("req-0", TEST_DRIVER, &node_name(k), "device-2"),
                ],
            ),
            _ => {
                let node = node_name(k % self.nodes);
                let device = format!("basic-device-{}", k / self.nodes);
                let r = result("req-0", TEST_DRIVER, &node, &device);
                (node, vec![r])
            }
        };
        (claim, allocation(&node, results))
    }

    /// The template each measured pod's claim is made from (namespace `test`).
    pub fn template(&self) -> Value {
        let spec = match self.workload {
            Workload::FirstAvailable => json!({"devices": {"requests": [{"name": "req-0",
                "firstAvailable": [
                    {"name": "sub-0", "deviceClassName": "no-devices-class"},
                    {"name": "sub-1", "deviceClassName": "test-class"}]}]}}),
            Workload::Partitionable => self.init_claim_spec(),
            Workload::MatchAttribute => json!({"devices": {
                "requests": [
                    {"name": "gpus", "exactly": {"deviceClassName": "gpu", "count": 2}},
                    {"name": "nic", "exactly": {"deviceClassName": "nic"}}],
                "constraints": [{"requests": ["gpus", "nic"],
                    "matchAttribute": "resource.kubernetes.io/numaNode"}]}}),
            _ => json!({"devices": {"requests": [{"name": "req-0",
                "exactly": {"deviceClassName": "test-class"}}]}}),
        };
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "test-claim-template", "namespace": "test"},
            "spec": {"spec": spec}})
    }

    /// The write ceiling's choice for the `s`-th measured pod: a node and the allocation of
    /// its claim, on devices the init claims left free (wrapping round for SteadyState,
    /// whose bound pods are deleted).
    pub fn oracle(&self, s: usize) -> (String, Value) {
        let n = self.nodes;
        let (node, results) = match self.workload {
            Workload::Partitionable => {
                let node = node_name(self.init + s % (n - self.init).max(1));
                let r = vec![
                    result("req-0", TEST_DRIVER, &node, "device-1"),
                    result("req-0", TEST_DRIVER, &node, "device-2"),
                ];
                (node, r)
            }
            Workload::MatchAttribute => {
                let node = node_name(s % n);
                let numa = (s / n) % 2;
                let mut r: Vec<Value> = (0..2)
                    .map(|g| {
                        let gpu = format!("gpu-{}", numa * GPUS / 2 + g);
                        result("gpus", GPU_DRIVER, &node, &gpu)
                    })
                    .collect();
                r.push(result("nic", NIC_DRIVER, &node, &format!("nic-{numa}")));
                (node, r)
            }
            _ => {
                let used = self.init.div_ceil(n);
                let free = (BASIC_DEVICES - used).max(1);
                let node = node_name(s % n);
                let device = format!("basic-device-{}", used + (s / n) % free);
                let request = if self.workload == Workload::FirstAvailable {
                    "req-0/sub-1"
                } else {
                    "req-0"
                };
                let r = vec![result(request, TEST_DRIVER, &node, &device)];
                (node, r)
            }
        };
        let alloc = allocation(&node, results);
        (node, alloc)
    }
}

fn result(request: &str, driver: &str, pool: &str, device: &str) -> Value {
    json!({"request": request, "driver": driver, "pool": pool, "device": device})
}

fn allocation(node: &str, results: Vec<Value>) -> Value {
    json!({"devices": {"results": results}, "nodeSelector": selector_for(node)})
}

/// Measured pod `name`: one claim from the template, for `scheduler`.
pub fn pod(name: &str, scheduler: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "test"},
        "spec": {"schedulerName": scheduler,
            "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10.1",
                "resources": {"claims": [{"name": "resource"}]}}],
            "resourceClaims": [{"name": "resource", "resourceClaimTemplateName": "test-claim-template"}]}})
}
