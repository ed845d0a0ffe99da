//! Generated input through `simulate::load` and `simulate::simulate`, in process: 10,000
//! manifest sets (nodes, slices, classes, claims, templates, pods, workloads, lists) with
//! valid values, values the API server rejects, huge counts, mutated trees and odd YAML.
//! Each case must finish without a panic and within a generous time bound, and every
//! rejection must name its file, and the document and object it came from.
//!
//! Deterministic: the cases come from a seeded generator. `SIMULATE_FUZZ_SEED` and
//! `SIMULATE_FUZZ_CASES` pick other cases; a failure prints the case's seed, its files and
//! the error, and `SIMULATE_FUZZ_ONLY=<case seed>` reruns one case. `SIMULATE_FUZZ_SHOW=1`
//! prints every rejection (with `--nocapture`).

use std::fmt::Write as _;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dra_scheduler::simulate;
use serde_json::{Value, json};

/// Cases per run unless `SIMULATE_FUZZ_CASES` says otherwise.
const CASES: u64 = 10_000;
/// A case taking this long is a hang: normal cases take milliseconds.
const CASE_LIMIT: Duration = Duration::from_secs(10);

// ---- a small seeded generator ------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// What one case is allowed to get wrong: a clean case draws only valid values and no
/// mutations, so a good share of cases reach the engine.
struct Gen {
    rng: Rng,
    clean: bool,
}

const NODES: &[&str] = &["n1", "n2", "gpu-node-1"];
const BAD_NAMES: &[&str] = &["Node_1", "-x", "", "a..b", "ñ", "x/y", "UPPER"];
const NAMESPACES: &[Option<&str>] = &[None, Some("default"), Some("ml")];
const CLASSES: &[&str] = &["gpu.example.com", "nic.example.com"];
const DRIVERS: &[&str] = &["gpu.example.com", "nic.example.com"];
const QUANTITIES: &[&str] = &[
    "1", "2", "500m", "0", "8Gi", "32Gi", "110", "1e3", "1Ki", "+2",
];
const BAD_QUANTITIES: &[&str] = &[
    "-1",
    "-500m",
    "12 GB",
    "1.5.1",
    "99999999999999999999999999999999999",
    "-0",
    "",
    "Gi",
];
const NODE_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];
const DEVICE_EFFECTS: &[&str] = &["NoSchedule", "NoExecute", "None"];
const BAD_EFFECTS: &[&str] = &["Bogus", "", "noschedule", "PreferNoSchedule"];
const CEL: &[&str] = &[
    "device.driver == 'gpu.example.com'",
    "device.attributes['gpu.example.com'].numa == 0",
    "device.capacity['gpu.example.com'].memory.compareTo(quantity('10Gi')) >= 0",
    "true",
];
const BAD_CEL: &[&str] = &[
    "device.driver ==",
    "device.attributes['x'].y.z > 1",
    "1 + 'a'",
    "((((((((((((((((((((((((((((((((((((((((true))))))))))))))))))))))))))))))))))))))))",
];
const REPLICAS: &[i64] = &[0, 1, 2, 3];
const BAD_REPLICAS: &[i64] = &[-1, 100_001, 1_000_000_000, 2_147_483_647, 150_001];

impl Gen {
    /// A valid value, or now and then (in a case that is not clean) an invalid one.
    fn either<T: Clone>(&mut self, good: &[T], bad: &[T]) -> T {
        if !self.clean && self.rng.chance(8) {
            self.rng.pick(bad).clone()
        } else {
            self.rng.pick(good).clone()
        }
    }

    fn name(&mut self, good: &[&str]) -> String {
        self.either(good, BAD_NAMES).to_string()
    }

    fn quantity(&mut self) -> String {
        self.either(QUANTITIES, BAD_QUANTITIES).to_string()
    }

    fn meta(&mut self, name: String, namespaced: bool) -> Value {
        let mut m = json!({"name": name});
        if namespaced && let Some(ns) = *self.rng.pick(NAMESPACES) {
            m["namespace"] = json!(ns);
        }
        if self.rng.chance(20) {
            let key = self.either(&["zone", "example.com/rack"], &["bad key!", "-x"]);
            m["labels"] = json!({key: self.either(&["a", "b"], &["-", "no spaces"])});
        }
        m
    }

    fn node(&mut self, name: &str) -> Value {
        let mut n = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": self.meta(name.to_string(), false),
            "status": {"allocatable": {"cpu": self.quantity(), "memory": self.quantity(),
                "pods": self.either(&["110", "2"], &["-1", "many"])}}});
        if self.rng.chance(30) {
            let effect = self.either(NODE_EFFECTS, BAD_EFFECTS);
            n["spec"] = json!({"taints": [{"key": "gpu", "value": "true", "effect": effect}]});
        }
        if self.rng.chance(10) {
            n["spec"]["unschedulable"] = json!(true);
        }
        n
    }

    fn device(&mut self, i: usize, driver: &str) -> Value {
        let memory = format!("{driver}/memory");
        let mut d = json!({"name": self.either(&[format!("gpu-{i}")], &[format!("GPU_{i}")]),
            "attributes": {"numa": {"int": i % 2}, "type": {"string": "gpu"}},
            "capacity": {memory: {"value": self.quantity()}}});
        if self.rng.chance(15) {
            d["attributes"]["driverVersion"] =
                json!({"version": self.either(&["1.2.3"], &["1.2", "v1"])});
        }
        if !self.clean && self.rng.chance(5) {
            d["attributes"]["both"] = json!({"int": 1, "bool": true});
        }
        if self.rng.chance(15) {
            let effect = self.either(DEVICE_EFFECTS, BAD_EFFECTS);
            d["taints"] = json!([{"key": "example.com/xid", "effect": effect}]);
        }
        d
    }

    fn slice(&mut self, node: &str, index: usize) -> Value {
        let driver = *self.rng.pick(DRIVERS);
        let devices: Vec<Value> = if !self.clean && self.rng.chance(3) {
            (0..129).map(|i| json!({"name": format!("d{i}")})).collect()
        } else {
            (0..self.rng.below(5))
                .map(|i| self.device(i, driver))
                .collect()
        };
        let mut spec = json!({"driver": self.either(&[driver], &["Not A Driver", ""]),
            "pool": {"name": node, "generation": self.either(&[0, 1, 2], &[-1]),
                "resourceSliceCount": self.either(&[1], &[0, -3])},
            "devices": devices});
        match (self.clean, self.rng.below(12)) {
            (false, 0) => {
                spec["nodeName"] = json!(node);
                spec["allNodes"] = json!(true);
            }
            (false, 1) => {}
            (false, 2) => spec["allNodes"] = json!(false),
            (_, 3) => spec["allNodes"] = json!(true),
            (_, 4) => {
                let (operator, values) = self.either(
                    &[("In", json!(["a"])), ("Exists", json!(null))],
                    &[("Like", json!(["a"])), ("Exists", json!(["a"]))],
                );
                spec["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "zone", "operator": operator, "values": values}]}]});
            }
            _ => spec["nodeName"] = json!(node),
        }
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": self.meta(format!("{node}-{driver}-{index}"), false), "spec": spec})
    }

    fn class(&mut self, name: &str) -> Value {
        let mut c = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": self.meta(name.to_string(), false),
            "spec": {"selectors": [{"cel": {"expression": self.either(CEL, BAD_CEL)}}]}});
        if self.rng.chance(20) {
            c["spec"]["extendedResourceName"] =
                json!(self.either(&["example.com/gpu"], &["kubernetes.io/gpu", "gpu"]));
        }
        c
    }

    fn request(&mut self, name: &str) -> Value {
        let exact = |g: &mut Gen| {
            let mut e =
                json!({"deviceClassName": g.either(CLASSES, &["missing-class", "", "Bad"])});
            match g.rng.below(6) {
                0 => e["count"] = json!(g.either(&[1, 2], &[0, -1, 33, 1_000_000_000])),
                1 => e["allocationMode"] = json!(g.either(&["All"], &["Some", "all"])),
                2 => {
                    e["selectors"] = json!([{"cel": {"expression": g.either(CEL, BAD_CEL)}}]);
                }
                3 => {
                    e["tolerations"] = json!([{"key": "example.com/xid",
                        "operator": g.either(&["Exists"], &["Matches"]),
                        "effect": g.either(DEVICE_EFFECTS, BAD_EFFECTS)}]);
                }
                _ => {}
            }
            e
        };
        if self.rng.chance(25) {
            let n = if !self.clean && self.rng.chance(10) {
                9
            } else {
                1 + self.rng.below(3)
            };
            let subs: Vec<Value> = (0..n)
                .map(|i| {
                    let mut s = exact(self);
                    s["name"] = json!(format!("s{i}"));
                    s
                })
                .collect();
            json!({"name": name, "firstAvailable": subs})
        } else {
            json!({"name": name, "exactly": exact(self)})
        }
    }

    fn claim_spec(&mut self) -> Value {
        let n = if !self.clean && self.rng.chance(3) {
            33
        } else {
            1 + self.rng.below(2)
        };
        let requests: Vec<Value> = (0..n).map(|i| self.request(&format!("r{i}"))).collect();
        let mut devices = json!({"requests": requests});
        if self.rng.chance(15) {
            devices["constraints"] = json!([{"requests": [self.either(&["r0"], &["nope"])],
                "matchAttribute": self.either(&["gpu.example.com/numa"], &["numa", "a/b/c"])}]);
        }
        json!({"devices": devices})
    }

    fn claim(&mut self, name: &str) -> Value {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": self.meta(name.to_string(), true), "spec": self.claim_spec()})
    }

    fn template(&mut self, name: &str) -> Value {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": self.meta(name.to_string(), true),
            "spec": {"spec": self.claim_spec()}})
    }

    fn pod_spec(&mut self) -> Value {
        let mut resources = json!({});
        if self.rng.chance(70) {
            resources["requests"] = json!({"cpu": self.quantity(), "memory": self.quantity()});
        }
        if self.rng.chance(30) {
            // A clean case keeps the request at the limit, as the API server wants.
            let cpu = match &resources["requests"]["cpu"] {
                Value::String(cpu) if self.clean => cpu.clone(),
                _ => self.quantity(),
            };
            resources["limits"] = json!({"cpu": cpu});
        }
        if self.rng.chance(10) {
            // An extended resource needs a limit; only a case that is not clean asks for
            // one by its request alone.
            let which = self.either(&["limits"], &["requests"]);
            let key = self.either(&["example.com/gpu"], &["gpus"]);
            resources[which][key] = json!(self.either(&["1", "2"], BAD_QUANTITIES));
        }
        let mut spec = json!({"schedulerName": self.either(&["dra-scheduler", "default-scheduler"], &["Dra Scheduler"]),
            "containers": [{"name": "c", "image": "busybox", "resources": resources}]});
        if self.rng.chance(50) {
            let mut claims = Vec::new();
            if self.rng.chance(70) {
                claims.push(json!({"name": "gpu",
                    "resourceClaimTemplateName": self.name(&["one-gpu", "two-gpu"])}));
            } else {
                claims.push(json!({"name": "gpu", "resourceClaimName": self.name(&["shared"])}));
            }
            if !self.clean && self.rng.chance(5) {
                claims[0]["resourceClaimName"] = json!("both");
            }
            spec["resourceClaims"] = json!(claims);
            spec["containers"][0]["resources"]["claims"] =
                json!([{"name": self.either(&["gpu"], &["nic"])}]);
        }
        if self.rng.chance(25) {
            spec["tolerations"] = json!([{"key": self.either(&["gpu"], &["", "bad key!"]),
                "operator": self.either(&["Exists", "Equal"], &["Matches"]),
                "effect": self.either(NODE_EFFECTS, BAD_EFFECTS)}]);
        }
        if self.rng.chance(15) {
            spec["nodeSelector"] = json!({"zone": "a"});
        }
        if self.rng.chance(15) {
            let (operator, values) = self.either(
                &[
                    ("Gt", json!(["4"])),
                    ("Exists", json!(null)),
                    ("In", json!(["8"])),
                ],
                &[
                    ("Lt", json!(["x"])),
                    ("Between", json!(["1"])),
                    ("In", json!([])),
                ],
            );
            spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpus",
                    "operator": operator, "values": values}]}]}}});
        }
        if self.rng.chance(10) {
            spec["nodeName"] = json!(self.name(NODES));
        }
        if self.rng.chance(if self.clean { 3 } else { 15 }) {
            // The class may be missing from the case: invalid input naming the pod.
            spec["priorityClassName"] = json!(self.either(&["high", "low"], &["missing"]));
        }
        if self.rng.chance(5) {
            spec["containers"][0]["ports"] = json!([{"containerPort": 80,
                "hostPort": self.either(&[8080], &[70000, -1])}]);
        }
        spec
    }

    fn pod(&mut self, name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": self.meta(name.to_string(), true),
            "spec": self.pod_spec()})
    }

    fn workload(&mut self, name: &str) -> Value {
        let replicas = self.either(REPLICAS, BAD_REPLICAS);
        let template = json!({"metadata": {"labels": {"app": name}}, "spec": self.pod_spec()});
        let (api, kind, spec) = match self.rng.below(4) {
            0 => (
                "apps/v1",
                "Deployment",
                json!({"replicas": replicas,
                "selector": {"matchLabels": {"app": name}}, "template": template}),
            ),
            1 => (
                "apps/v1",
                "ReplicaSet",
                json!({"replicas": replicas,
                "selector": {"matchLabels": {"app": name}}, "template": template}),
            ),
            2 => (
                "apps/v1",
                "StatefulSet",
                json!({"replicas": replicas, "serviceName": name,
                "selector": {"matchLabels": {"app": name}}, "template": template}),
            ),
            _ => (
                "batch/v1",
                "Job",
                json!({"parallelism": replicas,
                "completions": self.either(&[1, 2, 5], &[-2, 1_000_000_000]),
                "template": template}),
            ),
        };
        json!({"apiVersion": api, "kind": kind, "metadata": self.meta(name.to_string(), true),
            "spec": spec})
    }

    fn priority_class(&mut self, name: &str) -> Value {
        json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": self.either(&[100, 1000, -5], &[1_000_000_001]),
            "globalDefault": self.rng.chance(10)})
    }

    fn taint_rule(&mut self) -> Value {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": "drain"},
            "spec": {"deviceSelector": {"driver": "gpu.example.com", "pool": self.name(NODES)},
                "taint": {"key": "example.com/maintenance",
                    "effect": self.either(DEVICE_EFFECTS, BAD_EFFECTS)}}})
    }

    /// A random object of any kind simulate reads (or ignores, or rejects).
    fn object(&mut self, index: usize) -> Value {
        let node = NODES[index % NODES.len()];
        match self.rng.below(16) {
            0 | 1 => self.node(node),
            2 | 3 => self.slice(node, index),
            4 => {
                let name = self.name(CLASSES);
                self.class(&name)
            }
            5 => self.claim("shared"),
            6 | 7 => {
                let name = *self.rng.pick(&["one-gpu", "two-gpu"]);
                self.template(name)
            }
            8 | 9 => self.pod(&format!("p{index}")),
            10 | 11 => self.workload(&format!("w{index}")),
            12 => {
                let name = *self.rng.pick(&["high", "low"]);
                self.priority_class(name)
            }
            13 => self.taint_rule(),
            14 => json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"}}),
            _ => {
                let items: Vec<Value> = (0..1 + self.rng.below(3))
                    .map(|i| self.object(index * 10 + i + 1))
                    .collect();
                json!({"apiVersion": "v1", "kind": "List", "items": items})
            }
        }
    }

    /// Replace something at a random place in the tree (a few levels down).
    fn mutate(&mut self, v: &mut Value) {
        let depth = self.rng.below(6);
        self.mutate_at(v, depth);
    }

    fn mutate_at(&mut self, v: &mut Value, depth: usize) {
        if depth > 0 {
            match v {
                Value::Object(m) if !m.is_empty() => {
                    let key = m.keys().nth(self.rng.below(m.len())).unwrap().clone();
                    return self.mutate_at(m.get_mut(&key).unwrap(), depth - 1);
                }
                Value::Array(a) if !a.is_empty() => {
                    let i = self.rng.below(a.len());
                    return self.mutate_at(&mut a[i], depth - 1);
                }
                _ => {}
            }
        }
        *v = match self.rng.below(9) {
            0 => json!(null),
            1 => json!(-1),
            2 => json!("Bogus"),
            3 => json!([]),
            4 => json!({"typo": 1}),
            5 => json!(1e300),
            6 => json!(i64::MIN),
            7 => json!(true),
            _ => json!({"kind": 7, "metadata": "x"}),
        };
    }
}

// ---- odd YAML ----------------------------------------------------------------------------

/// A document of odd YAML, and whether it may contain document markers of its own.
fn odd_document(rng: &mut Rng) -> (String, bool) {
    let deep = [64, 101, 150, 1000, 100_000][rng.below(5)];
    let text = match rng.below(22) {
        0 => "[".repeat(deep),
        1 => format!("a: {}", "{b: ".repeat(deep)),
        2 => format!("{}x", "- ".repeat(deep)),
        3 => format!("{}1{}", "[".repeat(deep), "]".repeat(deep)),
        4 => {
            let mut s = String::from("a: &a [x, x, x, x, x, x, x, x]\n");
            for i in 0..8 {
                let p = if i == 0 { "a".to_string() } else { format!("b{}", i - 1) };
                let _ = writeln!(s, "b{i}: &b{i} [{}]", vec![format!("*{p}"); 8].join(", "));
            }
            s
        }
        5 => "apiVersion: v1\nkind: Node\nmetadata: {name: !Ref n1}\n".into(),
        6 => "apiVersion: v1\nkind: Node\nkind: Pod\nmetadata: {name: n1}\n".into(),
        7 => "? [a, b]\n: c\n".into(),
        8 => "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nstatus: {allocatable: {cpu: .nan, pods: 1e400}}\n".into(),
        9 => "\tapiVersion: v1\n\tkind: Node\n".into(),
        10 => "apiVersion: v1\nkind: Node\nmetadata: {name: \"unterminated\n".into(),
        11 => "- just\n- a\n- list\n".into(),
        12 => "42".into(),
        13 => "'a string'".into(),
        14 => "apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n  name: n2\n".into(),
        15 => "%YAML 1.2\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: ns}\n".into(),
        16 => "a: |\n  [[[[[[[[[[\n  ---\nb: 1\n".into(),
        17 => "...\n---\n...\n".into(),
        18 => (0..rng.below(200)).map(|_| char::from(32 + rng.below(95) as u8)).collect(),
        19 => "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nspec: {taints: [{key: k, effect: NoSchedule, value: *undefined}]}\n".into(),
        20 => format!("x: {}", "y".repeat(rng.below(100_000))),
        _ => "{\"apiVersion\": \"v1\", \"kind\": \"Node\", \"metadata\": {\"name\": 5}}".into(),
    };
    let markers = text
        .lines()
        .any(|l| l.starts_with("---") || l.starts_with("...") || l.starts_with('%'));
    (text, markers)
}

// ---- one case ----------------------------------------------------------------------------

struct Doc {
    text: String,
    /// The objects an error about this document may name (`Kind ns/name`); empty when the
    /// document is not a well-formed object and an error may name none.
    objects: Vec<String>,
}

struct File {
    path: PathBuf,
    bytes: Vec<u8>,
    docs: Vec<Doc>,
    /// Whether document numbers in errors map onto `docs`.
    mapped: bool,
}

struct Case {
    seed: u64,
    files: Vec<File>,
    by_directory: bool,
    all_schedulers: bool,
}

/// What an error about the document of `v` may name: the object, or an item of a List.
fn namable(v: &Value) -> Vec<String> {
    if !v.is_object() {
        return Vec::new();
    }
    let mut out = vec![dra_scheduler::simulate::manifests::describe(v)];
    if v.get("kind").and_then(Value::as_str) == Some("List")
        && let Some(items) = v.get("items").and_then(Value::as_array)
    {
        if items.iter().any(|i| !i.is_object()) {
            return Vec::new(); // an item that is no object has nothing to name
        }
        out.extend(items.iter().flat_map(namable));
    }
    out
}

fn render(rng: &mut Rng, v: &Value) -> String {
    match rng.below(3) {
        0 => serde_json::to_string(v).unwrap(),
        1 => serde_json::to_string_pretty(v).unwrap(),
        _ => serde_yaml::to_string(v).unwrap(),
    }
}

fn generate(seed: u64, dir: &Path) -> Case {
    let mut g = Gen {
        rng: Rng(seed),
        clean: false,
    };
    g.clean = g.rng.chance(45);
    let file_count = 1 + g.rng.below(3);
    let mut files = Vec::new();
    let mut index = 0;
    for f in 0..file_count {
        let ext = ["yaml", "yml", "json"][g.rng.below(3)];
        let mut docs = Vec::new();
        let mut mapped = true;
        for _ in 0..1 + g.rng.below(6) {
            index += 1;
            if !g.clean && g.rng.chance(8) {
                let (text, markers) = odd_document(&mut g.rng);
                mapped &= !markers;
                docs.push(Doc {
                    text,
                    objects: Vec::new(),
                });
                continue;
            }
            let mut value = g.object(index);
            if !g.clean && g.rng.chance(15) {
                g.mutate(&mut value);
            }
            let mut text = render(&mut g.rng, &value);
            let mut objects = namable(&value);
            if !g.clean && g.rng.chance(3) {
                // Cut it short: whatever is left, it is no longer this object.
                let mut cut = g.rng.below(text.len() + 1);
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                text.truncate(cut);
                mapped &= !text
                    .lines()
                    .any(|l| l.starts_with("---") || l.starts_with("..."));
                objects.clear();
            }
            docs.push(Doc { text, objects });
        }
        // Objects are written after `---` lines; serde_yaml's own output starts bare.
        let mut text = String::new();
        for (i, d) in docs.iter().enumerate() {
            if i > 0 || g.rng.chance(30) {
                text.push_str("---\n");
            } else if d.text.lines().all(|l| {
                let l = l.trim();
                l.is_empty() || l.starts_with('#')
            }) {
                // A bare first document of nothing but comments is no document at all:
                // the ones after it are numbered one lower.
                mapped = false;
            }
            text.push_str(&d.text);
            if !d.text.ends_with('\n') {
                text.push('\n');
            }
        }
        let mut bytes = text.into_bytes();
        if !g.clean && g.rng.chance(1) {
            let at = g.rng.below(bytes.len() + 1);
            bytes.insert(at, 0xff); // not UTF-8
        }
        files.push(File {
            path: dir.join(format!("f{f}.{ext}")),
            bytes,
            docs,
            mapped,
        });
    }
    Case {
        seed,
        by_directory: g.rng.chance(50),
        all_schedulers: g.rng.chance(50),
        files,
    }
}

/// How much of its source an error was checked to name.
enum Named {
    File,
    Document,
    Object,
}

/// Check that `error` names a file of the case, and the document and object when it can.
fn names_its_source(case: &Case, error: &str) -> Result<Named, String> {
    for file in &case.files {
        let path = file.path.display().to_string();
        let Some(rest) = error.strip_prefix(&path) else {
            continue;
        };
        if rest.starts_with(": ") {
            return Ok(Named::File); // about the file as a whole
        }
        let Some(rest) = rest.strip_prefix(" (document ") else {
            continue;
        };
        let (number, message) = rest
            .split_once("): ")
            .ok_or("the document is not followed by a message")?;
        let n: usize = number.parse().map_err(|_| "no document number")?;
        if n == 0 {
            return Err("document 0".into());
        }
        if !file.mapped {
            return Ok(Named::Document);
        }
        let doc = file
            .docs
            .get(n - 1)
            .ok_or_else(|| format!("document {n} of a file with {}", file.docs.len()))?;
        if doc.objects.is_empty() {
            return Ok(Named::Document);
        }
        if doc
            .objects
            .iter()
            .any(|o| message.starts_with(&format!("{o}: ")))
        {
            return Ok(Named::Object);
        }
        return Err(format!("the error names none of {:?}", doc.objects));
    }
    Err("the error names no file of the case".into())
}

/// Load and simulate the case's files; an error message on invalid input.
fn run_case(case: &Case, dir: &Path) -> Result<usize, String> {
    let paths: Vec<PathBuf> = if case.by_directory {
        vec![dir.to_path_buf()]
    } else {
        case.files.iter().map(|f| f.path.clone()).collect()
    };
    let input = simulate::load(&paths).map_err(|e| e.to_string())?;
    let options = simulate::Options {
        scheduler_name: "dra-scheduler".into(),
        all_schedulers: case.all_schedulers,
        ..Default::default()
    };
    let sim = simulate::simulate(&options, input);
    let _ = simulate::report::table(&sim);
    let _ = simulate::report::json(&sim);
    Ok(sim.pods.len())
}

fn describe_case(case: &Case, outcome: &str) -> String {
    let mut s = format!("case seed {:#x} ({outcome}):\n", case.seed);
    for f in &case.files {
        let text = String::from_utf8_lossy(&f.bytes);
        let shown: String = text.chars().take(4000).collect();
        let _ = writeln!(s, "--- {} ---\n{shown}", f.path.display());
    }
    s
}

#[derive(Default)]
struct Tally {
    cases: u64,
    documents: u64,
    loaded: u64,
    rejected: u64,
    /// Rejections checked to name their object (the rest: their file, or file and document
    /// where the document was no object).
    named_objects: u64,
    pods: u64,
    slowest: Duration,
}

fn run_worker(worker: usize, seeds: Vec<u64>) -> Tally {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("simulate_fuzz")
        .join(worker.to_string());
    let mut tally = Tally::default();
    for seed in seeds {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let case = generate(seed, &dir);
        for f in &case.files {
            std::fs::write(&f.path, &f.bytes).unwrap();
        }
        let case = std::sync::Arc::new(case);
        let (tx, rx) = mpsc::channel();
        let (for_thread, dir_for_thread) = (case.clone(), dir.clone());
        let start = Instant::now();
        std::thread::Builder::new()
            .name(format!("fuzz-case-{seed:#x}"))
            .spawn(move || {
                let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    run_case(&for_thread, &dir_for_thread)
                }));
                let _ = tx.send(outcome);
            })
            .unwrap();
        let outcome = match rx.recv_timeout(CASE_LIMIT) {
            Ok(outcome) => outcome,
            Err(_) => panic!(
                "{}",
                describe_case(&case, &format!("still running after {CASE_LIMIT:?}"))
            ),
        };
        tally.slowest = tally.slowest.max(start.elapsed());
        tally.cases += 1;
        tally.documents += case.files.iter().map(|f| f.docs.len() as u64).sum::<u64>();
        match outcome {
            Err(_) => panic!("{}", describe_case(&case, "panicked")),
            Ok(Ok(pods)) => {
                tally.loaded += 1;
                tally.pods += pods as u64;
            }
            Ok(Err(error)) => {
                tally.rejected += 1;
                if std::env::var_os("SIMULATE_FUZZ_SHOW").is_some() {
                    println!("{seed:#x}: {error}");
                }
                match names_its_source(&case, &error) {
                    Ok(Named::Object) => tally.named_objects += 1,
                    Ok(Named::File | Named::Document) => {}
                    Err(why) => panic!("{}", describe_case(&case, &format!("{why}: {error}"))),
                }
            }
        }
    }
    tally
}

fn env_number(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

#[test]
fn generated_manifests_never_panic_hang_or_go_unnamed() {
    let base = env_number("SIMULATE_FUZZ_SEED").unwrap_or(0x5eed_0012);
    let cases = env_number("SIMULATE_FUZZ_CASES").unwrap_or(CASES);
    let seeds: Vec<u64> = match env_number("SIMULATE_FUZZ_ONLY") {
        Some(seed) => vec![seed],
        None => {
            let mut rng = Rng(base);
            (0..cases).map(|_| rng.next()).collect()
        }
    };
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(4);
    let start = Instant::now();
    let handles: Vec<_> = (0..workers)
        .map(|w| {
            let mine: Vec<u64> = seeds.iter().skip(w).step_by(workers).copied().collect();
            std::thread::spawn(move || run_worker(w, mine))
        })
        .collect();
    let mut total = Tally::default();
    for h in handles {
        let t = h.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
        total.cases += t.cases;
        total.documents += t.documents;
        total.loaded += t.loaded;
        total.rejected += t.rejected;
        total.named_objects += t.named_objects;
        total.pods += t.pods;
        total.slowest = total.slowest.max(t.slowest);
    }
    println!(
        "simulate fuzz (seed {base:#x}): {} cases, {} documents: {} loaded and simulated \
         ({} pods), {} rejected naming their file ({} of them checked to name the object); \
         slowest case {:?}, all in {:?}",
        total.cases,
        total.documents,
        total.loaded,
        total.pods,
        total.rejected,
        total.named_objects,
        total.slowest,
        start.elapsed()
    );
    assert_eq!(total.cases, seeds.len() as u64);
    if seeds.len() >= 1000 {
        // Both paths get real coverage: a generator that only makes broken input, or only
        // valid input, would test half of what it claims.
        assert!(total.loaded * 10 >= total.cases, "too few cases load");
        assert!(
            total.rejected * 10 >= total.cases,
            "too few cases are rejected"
        );
    }
}
