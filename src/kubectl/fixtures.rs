//! Small builders for the kubectl-dra unit tests: a cluster of nodes, GPUs, claims and pods
//! built in code (`slice("n1", vec![gpu("gpu-0", "RTX A5000", 0, "24Gi")])`).

use dra_engine::{ClusterInput, Engine, EngineConfig};
use serde_json::{Value, json};

pub const DRIVER: &str = "gpu.example.com";

/// One object of the cluster.
pub enum Obj {
    Node(Value),
    Class(Value),
    Slice(Value),
    Claim(Value),
    Pod(Value),
}

impl Obj {
    /// A pod created at `at` (RFC 3339): preemption evicts the youngest first.
    pub fn created(self, at: &str) -> Obj {
        let Obj::Pod(mut v) = self else {
            panic!("a pod")
        };
        v["metadata"]["creationTimestamp"] = json!(at);
        Obj::Pod(v)
    }
}

pub fn cluster(objects: Vec<Obj>) -> Engine {
    let mut input = ClusterInput::default();
    for o in objects {
        match o {
            Obj::Node(v) => input.nodes.push(parse(v)),
            Obj::Class(v) => input.classes.push(parse(v)),
            Obj::Slice(v) => input.slices.push(parse(v)),
            Obj::Claim(v) => input.claims.push(parse(v)),
            Obj::Pod(v) => input.pods.push(parse(v)),
        }
    }
    Engine::new(EngineConfig::default(), input)
}

fn parse<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

pub fn node(name: &str) -> Obj {
    Obj::Node(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"}}
    }))
}

/// The class `gpu`: every device of [`DRIVER`].
pub fn gpu_class() -> Obj {
    Obj::Class(json!({
        "metadata": {"name": "gpu"},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]}
    }))
}

/// A GPU: name, product, NUMA node, memory.
pub struct Gpu(Value);

pub fn gpu(name: &str, product: &str, numa: i64, memory: &str) -> Gpu {
    Gpu(json!({
        "name": name,
        "attributes": {
            "productName": {"string": product},
            "resource.kubernetes.io/numaNode": {"int": numa}
        },
        "capacity": {"memory": {"value": memory}}
    }))
}

impl Gpu {
    /// With the taint `key=bad:NoSchedule`.
    pub fn tainted(mut self, key: &str) -> Gpu {
        self.0["taints"] = json!([{"key": key, "value": "bad", "effect": "NoSchedule"}]);
        self
    }
}

/// The slice of `node`'s GPUs (pool `node`).
pub fn slice(node: &str, gpus: Vec<Gpu>) -> Obj {
    Obj::Slice(json!({
        "metadata": {"name": format!("{node}-gpus")},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": gpus.into_iter().map(|g| g.0).collect::<Vec<_>>()
        }
    }))
}

/// A claim in `default` with these requests (`{"name": ..., "exactly": ...}`).
pub fn claim(name: &str, requests: Value) -> Obj {
    claim_with(name, requests, json!([]))
}

pub fn claim_with(name: &str, requests: Value, constraints: Value) -> Obj {
    Obj::Claim(json!({
        "metadata": {"name": name, "namespace": "default", "resourceVersion": "1"},
        "spec": {"devices": {"requests": requests, "constraints": constraints}}
    }))
}

/// One GPU of class `gpu` with these CEL selectors.
pub fn one_gpu(selectors: &[&str]) -> Value {
    let selectors: Vec<Value> = selectors
        .iter()
        .map(|s| json!({"cel": {"expression": s}}))
        .collect();
    json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu", "selectors": selectors}}])
}

/// `claim`, allocated the devices of `node`'s pool (`(request, device)`) and reserved for
/// the pod `pod`, if any.
pub fn allocated(claim: Obj, node: &str, devices: &[(&str, &str)], pod: Option<&str>) -> Obj {
    let Obj::Claim(mut v) = claim else {
        panic!("a claim")
    };
    let results: Vec<Value> = devices
        .iter()
        .map(|(request, device)| {
            json!({"request": request, "driver": DRIVER, "pool": node, "device": device})
        })
        .collect();
    v["status"] = json!({
        "allocation": {
            "devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
        },
        "reservedFor": pod.map(|p| vec![json!({"resource": "pods", "name": p, "uid": format!("uid-{p}")})]).unwrap_or_default()
    });
    Obj::Claim(v)
}

/// A pod of this scheduler in `default` using the claim `claim` (pod claim `gpu`), of
/// `priority`, bound to `node` when given.
pub fn pod(name: &str, claim: &str, priority: i32, node: Option<&str>) -> Obj {
    let mut v = json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {
            "schedulerName": "dra-scheduler",
            "priority": priority,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{"name": "c", "image": "busybox",
                            "resources": {"claims": [{"name": "gpu"}]}}]
        }
    });
    if let Some(node) = node {
        v["spec"]["nodeName"] = json!(node);
        v["status"] = json!({"phase": "Running"});
    }
    Obj::Pod(v)
}
