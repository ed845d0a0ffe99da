//! Shared by the property and conformance tests: a seeded generator of random scenarios, an
//! independent checker of allocation results (the properties every answer must have), and
//! an exhaustive enumerator for small scenarios.
#![allow(dead_code, clippy::type_complexity)]

use std::collections::{BTreeMap, HashMap, HashSet};

use dra_allocator::build::*;
use dra_allocator::quantity::Quantity;
use dra_allocator::{Features, Snapshot, SnapshotInput, node_matches};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::*;
use serde::Serialize;

pub mod cases;

pub const GPU: &str = "gpu.example.com";
pub const NIC: &str = "nic.example.com";
pub const NUMA: &str = "resource.kubernetes.io/numaNode";

/// The reference allocator (`tests/cluster/cmd/allocref`), built with `go build` each time:
/// a binary left from an older checkout would answer in an older format, and Go's build
/// cache makes an up-to-date build quick.
pub fn allocref() -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/cluster");
    let go = std::process::Command::new("go").arg("version").output();
    assert!(
        go.as_ref().is_ok_and(|o| o.status.success()),
        "the reference needs Go to build tests/cluster/cmd/allocref (go version failed: {go:?})"
    );
    let status = std::process::Command::new("go")
        .args(["build", "-o", "bin/allocref", "./cmd/allocref"])
        .current_dir(&dir)
        .status()
        .expect("run go build");
    assert!(status.success(), "go build ./cmd/allocref failed");
    dir.join("bin/allocref")
}

/// xorshift64*: small, seeded, reproducible.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

/// One scenario, in the JSON shape `allocref` reads.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Case {
    pub classes: Vec<DeviceClass>,
    pub slices: Vec<ResourceSlice>,
    pub taint_rules: Vec<DeviceTaintRule>,
    pub allocations: Vec<AllocationResult>,
    pub claims: Vec<ResourceClaim>,
    pub node: Node,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<Node>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeat: Option<u32>,
    pub timeout_ms: u64,
    /// 1.37's alpha gates the allocator reads, on (allocref: `alphaGates`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub alpha_gates: bool,
}

impl Case {
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::new(SnapshotInput {
            classes: self.classes.clone(),
            slices: self
                .slices
                .iter()
                .cloned()
                .map(|s| std::sync::Arc::new(s.into()))
                .collect(),
            taint_rules: self.taint_rules.clone(),
            allocations: self.allocations.clone(),
            features: self.features(),
            selector_cache: None,
        })
    }

    /// 1.37's defaults, or with the alpha gates the allocator reads on.
    pub fn features(&self) -> Features {
        let mut f = Features::default();
        if self.alpha_gates {
            f.list_type_attributes = true;
            f.compatibility_groups = true;
            f.derived_attributes = true;
            f.optional_node_operations = true;
            f.node_allocatable_resources = true;
        }
        f
    }
}

/// Size knobs for [`generate`].
#[derive(Clone, Copy, Debug)]
pub struct Size {
    pub max_pools: u64,
    pub max_devices_per_slice: u64,
    pub max_claims: u64,
    pub max_requests: u64,
    pub max_count: u64,
    pub selectors: bool,
}

pub const SMALL: Size = Size {
    max_pools: 2,
    max_devices_per_slice: 3,
    max_claims: 2,
    max_requests: 2,
    max_count: 2,
    selectors: true,
};

pub const MEDIUM: Size = Size {
    max_pools: 4,
    max_devices_per_slice: 6,
    max_claims: 2,
    max_requests: 3,
    max_count: 4,
    selectors: true,
};

/// A random scenario: several drivers, NUMA attributes, taints, firstAvailable, counters,
/// consumable capacity, placement variants, allocated devices.
pub fn generate(seed: u64, size: Size) -> Case {
    let mut rng = Rng::new(seed);
    let node = node("n1").label("zone", "a").build();
    let mut slices = Vec::new();
    let mut allocations = Vec::new();
    let mut taint_rules = Vec::new();
    let npools = rng.range(1, size.max_pools);
    for p in 0..npools {
        let driver = if rng.chance(60) { GPU } else { NIC };
        let pool = format!("pool-{p}");
        let nslices = if rng.chance(80) { 1 } else { 2 };
        let declared = if rng.chance(5) { nslices + 1 } else { nslices };
        let placement = if p == 0 { 0 } else { rng.below(100) };
        let with_counters = driver == GPU && rng.chance(20);
        let mut sb_list = Vec::new();
        let mut names: Vec<String> = Vec::new();
        for s in 0..nslices {
            let mut sb = slice(&format!("{pool}-s{s}"), driver).pool(&pool, 1, declared as i64);
            sb = match placement {
                0..=69 => sb.node("n1"),
                70..=74 => sb.node("n2"),
                75..=84 => sb.all_nodes(),
                85..=94 => sb.node_selector(label_selector(
                    "zone",
                    &[if rng.chance(70) { "a" } else { "b" }],
                )),
                _ => sb.per_device_nodes(),
            };
            let ndev = rng.range(
                2.min(size.max_devices_per_slice),
                size.max_devices_per_slice,
            );
            for d in 0..ndev {
                let name = if rng.chance(3) && !names.is_empty() {
                    names[0].clone()
                } else {
                    format!("{}-{s}-{d}", &driver[..3])
                };
                names.push(name.clone());
                let mut db = device(&name).string("model", if rng.chance(50) { "x" } else { "y" });
                if rng.chance(90) {
                    db = db.int(NUMA, rng.below(2) as i64);
                }
                if placement >= 95 {
                    db = if rng.chance(70) {
                        db.on_node("n1")
                    } else {
                        db.on_node("n2")
                    };
                }
                if rng.chance(10) {
                    let effect = ["NoSchedule", "NoExecute", "None"][rng.below(3) as usize];
                    db = db.taint("k", "v", effect);
                }
                if with_counters {
                    db = db.consumes("cs", &[("mem", &rng.range(1, 4).to_string())]);
                }
                let multi = rng.chance(15);
                if multi {
                    db = db.multi().capacity("mem", "10");
                } else if rng.chance(20) {
                    db = db.capacity("mem", &rng.range(2, 10).to_string());
                }
                if rng.chance(3) {
                    db = db.binding_conditions(&["Ready"], &["Failed"]);
                }
                if rng.chance(20) {
                    allocations.push(allocated(&[(driver, &pool, &name)]));
                } else if multi && rng.chance(30) {
                    let mut a = allocated(&[(driver, &pool, &name)]);
                    let r = &mut a.devices.as_mut().unwrap().results.as_mut().unwrap()[0];
                    r.share_id = Some("4f1ad2b8-0f5e-4c62-9a7b-2b1e5c9d0a11".into());
                    r.consumed_capacity = Some(
                        [(
                            "mem".to_string(),
                            k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                                rng.range(1, 8).to_string(),
                            ),
                        )]
                        .into(),
                    );
                    allocations.push(a);
                }
                sb = sb.device(db);
            }
            sb_list.push(sb);
        }
        if with_counters {
            let total = if rng.chance(50) { "4" } else { "8" };
            sb_list.push(
                slice(&format!("{pool}-counters"), driver)
                    .pool(&pool, 1, declared as i64)
                    .node("n1")
                    .counter_set("cs", &[("mem", total)]),
            );
            // The counter slice counts towards resourceSliceCount.
            for sb in &mut sb_list {
                let n = (nslices + 1 + (declared - nslices)) as i64;
                *sb = sb.clone().pool(&pool, 1, n);
            }
        }
        if rng.chance(5) {
            sb_list.push(
                slice(&format!("{pool}-old"), driver)
                    .pool(&pool, 0, 1)
                    .node("n1")
                    .device(device("old-0")),
            );
        }
        for sb in sb_list {
            slices.push(sb.build());
        }
        if rng.chance(5) {
            taint_rules.push(taint_rule(
                &format!("rule-{p}"),
                Some(driver),
                Some(&pool),
                None,
                "k",
                "NoSchedule",
            ));
        }
    }
    let mut classes = vec![
        class("gpu")
            .selector(&format!("device.driver == \"{GPU}\""))
            .build(),
        class("nic")
            .selector(&format!("device.driver == \"{NIC}\""))
            .build(),
        class("any")
            .config(GPU, serde_json::json!({"k": "v"}))
            .build(),
    ];
    if !size.selectors {
        classes = vec![
            class("gpu").build(),
            class("nic").build(),
            class("any").build(),
        ];
    }
    let mut claims = Vec::new();
    for c in 0..rng.range(1, size.max_claims) {
        let mut cb = claim(&format!("claim-{c}"));
        let nreq = rng.range(1, size.max_requests);
        let mut names = Vec::new();
        for r in 0..nreq {
            let name = format!("r{r}");
            names.push(name.clone());
            let one = |rng: &mut Rng, name: &str| {
                let class_name = ["gpu", "nic", "any"][rng.below(3) as usize];
                let mut rb = request(name, class_name).count(rng.range(1, size.max_count) as i64);
                if rng.chance(8) {
                    rb = rb.all();
                }
                if size.selectors && class_name == "gpu" && rng.chance(25) {
                    rb = rb.selector(&format!("device.attributes[\"{GPU}\"].model == \"x\""));
                }
                if rng.chance(20) {
                    rb = rb.tolerate("k", None, "");
                }
                if rng.chance(15) {
                    rb = rb.capacity("mem", &rng.range(1, 6).to_string());
                }
                rb
            };
            let rb = if rng.chance(15) {
                let subs = (0..rng.range(2, 3))
                    .map(|s| one(&mut rng, &format!("s{s}")))
                    .collect();
                first_available(&name, subs)
            } else {
                let mut rb = one(&mut rng, &name);
                if rng.chance(5) {
                    rb = rb.admin();
                }
                rb
            };
            cb = cb.request(rb);
        }
        if rng.chance(25) {
            let reqs: Vec<&str> = if rng.chance(50) {
                Vec::new()
            } else {
                names.iter().take(2).map(String::as_str).collect()
            };
            cb = cb.match_attribute(NUMA, &reqs);
        }
        if rng.chance(8) {
            cb = cb.distinct_attribute(NUMA, &[]);
        }
        if rng.chance(10) {
            cb = cb.config(&[], GPU, serde_json::json!({"all": 1}));
        }
        claims.push(cb.build());
    }
    Case {
        classes,
        slices,
        taint_rules,
        allocations,
        claims,
        node,
        nodes: Vec::new(),
        repeat: None,
        timeout_ms: 10_000,
        alpha_gates: false,
    }
}

/// A random scenario with the alpha gates on: [`generate`]'s, plus compatibility groups on
/// devices that consume counters, list-valued attributes with constraints on them, slices
/// that skip node operations on a node that may or may not declare the feature, and
/// devices that map node allocatable resources.
pub fn generate_gated(seed: u64, size: Size) -> Case {
    let mut case = generate(seed, size);
    case.alpha_gates = true;
    let mut rng = Rng::new(seed ^ 0x9A7E5);
    let groups = [vec![], vec!["a"], vec!["b"], vec!["a", "b"]];
    let links = ["l1", "l2", "l3"];
    for slice in &mut case.slices {
        if rng.chance(15) {
            slice.spec.skip_node_operations = Some(vec!["NodePrepareResources".into()]);
        }
        let driver = slice.spec.driver.clone();
        for device in slice.spec.devices.iter_mut().flatten() {
            // DRANodeAllocatableResources: the allocator takes such devices as any other
            // (the scheduler counts what they map).
            if rng.chance(20) {
                device.node_allocatable_resources = Some(
                    [(
                        "cpu".to_string(),
                        serde_json::from_value(
                            serde_json::json!({"mapping": {"deviceMultiplier": "2"}}),
                        )
                        .unwrap(),
                    )]
                    .into(),
                );
            }
            for c in device.consumes_counters.iter_mut().flatten() {
                let g = &groups[rng.below(4) as usize];
                c.compatibility_groups =
                    (!g.is_empty()).then(|| g.iter().map(|s| s.to_string()).collect());
            }
            if rng.chance(60) {
                let n = rng.range(1, 3) as usize;
                let start = rng.below(3) as usize;
                let values: Vec<String> =
                    (0..n).map(|i| links[(start + i) % 3].to_string()).collect();
                device
                    .attributes
                    .get_or_insert_with(Default::default)
                    .insert(
                        format!("{driver}/links"),
                        DeviceAttribute {
                            strings: Some(values),
                            ..Default::default()
                        },
                    );
            }
        }
    }
    if rng.chance(60) {
        case.node
            .status
            .get_or_insert_with(Default::default)
            .declared_features = Some(vec!["DRAOptionalNodeOperations".into()]);
    }
    // Derived attributes: a constant, a string every GPU has (an error on a NIC: no such
    // key), NUMA doubled (an error on the devices without it); named after the constraints'
    // attributes (shadowing the device's) or a name of their own.
    let expressions = [
        r#""same""#.to_string(),
        format!(r#"device.attributes["{GPU}"].model"#),
        r#"device.attributes["resource.kubernetes.io"].numaNode * 2"#.to_string(),
    ];
    let names = [
        NUMA.to_string(),
        format!("{GPU}/links"),
        "derived/x".to_string(),
    ];
    let derive = |rng: &mut Rng| -> Option<Vec<DeviceDerivedAttribute>> {
        rng.chance(35).then(|| {
            vec![DeviceDerivedAttribute {
                name: names[rng.below(3) as usize].clone(),
                expression: expressions[rng.below(3) as usize].clone(),
            }]
        })
    };
    for claim in &mut case.claims {
        let Some(spec) = claim.spec.as_mut().and_then(|s| s.devices.as_mut()) else {
            continue;
        };
        for request in spec.requests.iter_mut().flatten() {
            if let Some(e) = request.exactly.as_mut() {
                e.derived_attributes = derive(&mut rng);
            }
            for sub in request.first_available.iter_mut().flatten() {
                sub.derived_attributes = derive(&mut rng);
            }
        }
        if rng.chance(15) {
            spec.constraints
                .get_or_insert_with(Vec::new)
                .push(DeviceConstraint {
                    match_attribute: Some("derived/x".into()),
                    ..Default::default()
                });
        }
        if rng.chance(30) {
            let attribute = format!("{GPU}/links");
            let constraint = if rng.chance(70) {
                DeviceConstraint {
                    match_attribute: Some(attribute),
                    ..Default::default()
                }
            } else {
                DeviceConstraint {
                    distinct_attribute: Some(attribute),
                    ..Default::default()
                }
            };
            spec.constraints
                .get_or_insert_with(Vec::new)
                .push(constraint);
        }
    }
    case
}

// ---------------------------------------------------------------------------------------
// The checker: every property an allocation must have, written independently of the solver.

struct Visible<'a> {
    /// (driver, pool) → usable devices (slice, device) of the slices targeting the node.
    devices: Vec<(&'a ResourceSlice, &'a Device)>,
    /// (driver, pool) → available counters (counter name → value) after allocated devices.
    counters: HashMap<(String, String), BTreeMap<String, i128>>,
    /// Pools that are incomplete or invalid.
    broken: Vec<String>,
}

fn q(s: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> i128 {
    s.0.parse::<Quantity>().map(|q| q.nano()).unwrap_or(0)
}

fn device_on_node(node: &Node, d: &Device) -> bool {
    match (&d.node_name, d.all_nodes, &d.node_selector) {
        (Some(n), _, _) => Some(n) == node.metadata.name.as_ref(),
        (_, Some(true), _) => true,
        (_, _, Some(s)) => node_matches(node, s).unwrap_or(false),
        _ => false,
    }
}

fn allocated_ids(
    case: &Case,
) -> (
    HashSet<(String, String, String)>,
    HashMap<(String, String, String), BTreeMap<String, i128>>,
) {
    let mut exclusive = HashSet::new();
    let mut shared: HashMap<_, BTreeMap<String, i128>> = HashMap::new();
    for a in &case.allocations {
        for r in a.devices.iter().flat_map(|d| d.results.iter().flatten()) {
            if r.admin_access == Some(true) {
                continue;
            }
            let id = (r.driver.clone(), r.pool.clone(), r.device.clone());
            if r.share_id.is_some() {
                let e = shared.entry(id).or_default();
                for (k, v) in r.consumed_capacity.iter().flatten() {
                    *e.entry(k.clone()).or_default() += q(v);
                }
            } else {
                exclusive.insert(id);
            }
        }
    }
    (exclusive, shared)
}

fn visible(case: &Case) -> Visible<'_> {
    let node = &case.node;
    let mut by_pool: BTreeMap<(String, String), Vec<&ResourceSlice>> = BTreeMap::new();
    for s in &case.slices {
        let sp = &s.spec;
        let relevant = match (
            &sp.node_name,
            sp.all_nodes,
            &sp.node_selector,
            sp.per_device_node_selection,
        ) {
            (Some(n), _, _, _) => Some(n) == node.metadata.name.as_ref(),
            (_, Some(true), _, _) => true,
            (_, _, Some(sel), _) => node_matches(node, sel).unwrap_or(false),
            (_, _, _, Some(true)) => sp.devices.iter().flatten().any(|d| device_on_node(node, d)),
            _ => false,
        };
        if relevant {
            by_pool
                .entry((sp.driver.clone(), sp.pool.name.clone()))
                .or_default()
                .push(s);
        }
    }
    let (exclusive, shared) = allocated_ids(case);
    let mut out = Visible {
        devices: Vec::new(),
        counters: HashMap::new(),
        broken: Vec::new(),
    };
    for ((driver, pool), slices) in by_pool {
        let generation = slices.iter().map(|s| s.spec.pool.generation).max().unwrap();
        let mut targeting: Vec<&ResourceSlice> = slices
            .into_iter()
            .filter(|s| s.spec.pool.generation == generation)
            .collect();
        let count = targeting[0].spec.pool.resource_slice_count;
        let mut others: Vec<&ResourceSlice> = Vec::new();
        if targeting.len() as i64 != count {
            let all: Vec<&ResourceSlice> = case
                .slices
                .iter()
                .filter(|s| s.spec.driver == driver && s.spec.pool.name == pool)
                .collect();
            if all.iter().any(|s| s.spec.pool.generation > generation) {
                continue;
            }
            let same: Vec<&ResourceSlice> = all
                .into_iter()
                .filter(|s| s.spec.pool.generation == generation)
                .collect();
            if same.len() as i64 != count {
                out.broken.push(format!("{driver}/{pool}"));
                continue;
            }
            others = same
                .into_iter()
                .filter(|s| !targeting.iter().any(|t| t.metadata.name == s.metadata.name))
                .collect();
        }
        targeting.sort_by_key(|s| s.metadata.name.clone());
        let has_counters = |s: &&ResourceSlice| {
            s.spec
                .shared_counters
                .as_ref()
                .is_some_and(|c| !c.is_empty())
        };
        let mut sets: BTreeMap<String, BTreeMap<String, i128>> = BTreeMap::new();
        let mut invalid = false;
        for s in targeting
            .iter()
            .chain(others.iter())
            .filter(|s| has_counters(s))
        {
            for cs in s.spec.shared_counters.iter().flatten() {
                invalid |= sets
                    .insert(
                        cs.name.clone(),
                        cs.counters
                            .iter()
                            .map(|(k, v)| (k.clone(), q(&v.value)))
                            .collect(),
                    )
                    .is_some();
            }
        }
        let device_slices: Vec<&ResourceSlice> = targeting
            .iter()
            .copied()
            .filter(|s| !has_counters(s))
            .collect();
        let other_devices: Vec<&ResourceSlice> = others
            .iter()
            .copied()
            .filter(|s| !has_counters(s))
            .collect();
        let mut names = HashSet::new();
        for s in &device_slices {
            for d in s.spec.devices.iter().flatten() {
                invalid |= !names.insert(d.name.clone());
            }
        }
        let mut available: BTreeMap<String, i128> = BTreeMap::new();
        for (set, cs) in &sets {
            for (c, v) in cs {
                available.insert(format!("{set}/{c}"), *v);
            }
        }
        for s in device_slices.iter().chain(other_devices.iter()) {
            for d in s.spec.devices.iter().flatten() {
                let id = (driver.clone(), pool.clone(), d.name.clone());
                let used = exclusive.contains(&id) || shared.contains_key(&id);
                for c in d.consumes_counters.iter().flatten() {
                    for (name, v) in &c.counters {
                        let key = format!("{}/{name}", c.counter_set);
                        match available.get_mut(&key) {
                            Some(a) if used => *a -= q(&v.value),
                            Some(_) => {}
                            None => invalid = true,
                        }
                    }
                }
            }
        }
        if invalid {
            out.broken.push(format!("{driver}/{pool}"));
            continue;
        }
        out.counters
            .insert((driver.clone(), pool.clone()), available);
        for s in device_slices {
            for d in s.spec.devices.iter().flatten() {
                out.devices.push((s, d));
            }
        }
    }
    out
}

fn env() -> std::sync::Arc<dra_cel::Environment> {
    thread_local! {
        static ENV: std::sync::Arc<dra_cel::Environment> = std::sync::Arc::new(dra_cel::Environment::new(Default::default()));
    }
    ENV.with(|e| e.clone())
}

/// Evaluates a CEL selector list with dra-cel.
fn selected(
    env: &dra_cel::Environment,
    sels: Option<&Vec<DeviceSelector>>,
    s: &ResourceSlice,
    d: &Device,
) -> bool {
    let attributes = dra_cel::sorted(d.attributes.clone());
    let capacity = dra_cel::sorted(d.capacity.clone());
    sels.into_iter().flatten().all(|sel| {
        let expr = &sel.cel.as_ref().unwrap().expression;
        env.compile(expr)
            .and_then(|p| {
                p.matches(dra_cel::DeviceRef {
                    driver: &s.spec.driver,
                    attributes: &attributes,
                    capacity: &capacity,
                    allow_multiple_allocations: d.allow_multiple_allocations.unwrap_or(false),
                })
            })
            .unwrap_or(false)
    })
}

/// A request or subrequest, flattened.
#[derive(Clone, Debug)]
struct Alt {
    name: String,
    base: String,
    class: String,
    all: bool,
    count: usize,
    admin: bool,
    selectors: Option<Vec<DeviceSelector>>,
    tolerations: Vec<DeviceToleration>,
    capacity: BTreeMap<String, i128>,
}

fn alts(r: &DeviceRequest) -> Vec<Alt> {
    let mk = |name: String,
              class: &str,
              mode: Option<&String>,
              count: Option<i64>,
              admin: bool,
              sel: &Option<Vec<DeviceSelector>>,
              tol: &Option<Vec<DeviceToleration>>,
              cap: &Option<CapacityRequirements>| Alt {
        name,
        base: r.name.clone(),
        class: class.to_string(),
        all: mode.map(String::as_str) == Some("All"),
        count: count.unwrap_or(1) as usize,
        admin,
        selectors: sel.clone(),
        tolerations: tol.clone().unwrap_or_default(),
        capacity: cap
            .iter()
            .flat_map(|c| c.requests.iter().flatten())
            .map(|(k, v)| (k.clone(), q(v)))
            .collect(),
    };
    match (&r.exactly, &r.first_available) {
        (Some(e), _) => vec![mk(
            r.name.clone(),
            &e.device_class_name,
            e.allocation_mode.as_ref(),
            e.count,
            e.admin_access == Some(true),
            &e.selectors,
            &e.tolerations,
            &e.capacity,
        )],
        (None, Some(subs)) => subs
            .iter()
            .map(|s| {
                mk(
                    format!("{}/{}", r.name, s.name),
                    &s.device_class_name,
                    s.allocation_mode.as_ref(),
                    s.count,
                    false,
                    &s.selectors,
                    &s.tolerations,
                    &s.capacity,
                )
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn tolerated(tols: &[DeviceToleration], t: &DeviceTaint) -> bool {
    tols.iter().any(|tol| {
        tol.effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == t.effect)
            && tol
                .key
                .as_deref()
                .is_none_or(|k| k.is_empty() || k == t.key)
            && match tol.operator.as_deref().unwrap_or("Equal") {
                "Exists" => true,
                "Equal" => tol.value.as_deref().unwrap_or("") == t.value.as_deref().unwrap_or(""),
                _ => false,
            }
    })
}

fn taints_of<'a>(case: &'a Case, s: &ResourceSlice, d: &'a Device) -> Vec<DeviceTaint> {
    let mut t = d.taints.clone().unwrap_or_default();
    for rule in &case.taint_rules {
        let sel = rule.spec.device_selector.as_ref();
        let m = sel.is_none_or(|sel| {
            sel.driver.as_ref().is_none_or(|x| *x == s.spec.driver)
                && sel.pool.as_ref().is_none_or(|x| *x == s.spec.pool.name)
                && sel.device.as_ref().is_none_or(|x| *x == d.name)
        });
        if m {
            t.push(rule.spec.taint.clone());
        }
    }
    t
}

/// Whether a device is selectable for a request alternative: class and request selectors,
/// per-device placement, static capacity fit. (Taints are checked separately: they block.)
fn matches_alt(
    case: &Case,
    env: &dra_cel::Environment,
    alt: &Alt,
    s: &ResourceSlice,
    d: &Device,
) -> bool {
    let Some(class) = case
        .classes
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(&alt.class))
    else {
        return false;
    };
    let class_sel = class.spec.as_ref().and_then(|s| s.selectors.as_ref());
    if !selected(env, class_sel, s, d) || !selected(env, alt.selectors.as_ref(), s, d) {
        return false;
    }
    if s.spec.per_device_node_selection == Some(true) && !device_on_node(&case.node, d) {
        return false;
    }
    let caps: BTreeMap<String, i128> = d
        .capacity
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), q(&v.value)))
        .collect();
    alt.capacity
        .iter()
        .all(|(k, v)| caps.get(k).is_some_and(|c| v <= c))
}

fn attr<'a>(s: &ResourceSlice, d: &'a Device, name: &str) -> Option<&'a DeviceAttribute> {
    let attrs = d.attributes.as_ref()?;
    attrs.get(name).or_else(|| {
        let (domain, short) = name.split_once('/')?;
        (domain == s.spec.driver)
            .then(|| attrs.get(short))
            .flatten()
    })
}

fn scalar(a: &DeviceAttribute) -> Option<String> {
    a.string
        .clone()
        .map(|s| format!("s:{s}"))
        .or(a.int.map(|i| format!("i:{i}")))
        .or(a.bool.map(|b| format!("b:{b}")))
        .or(a.version.clone().map(|v| format!("v:{v}")))
}

/// A value's items: the list's, or the scalar alone.
fn items(a: &DeviceAttribute) -> HashSet<String> {
    if let Some(s) = scalar(a) {
        return HashSet::from([s]);
    }
    let strings = a.strings.iter().flatten().map(|s| format!("s:{s}"));
    let ints = a.ints.iter().flatten().map(|i| format!("i:{i}"));
    let bools = a.bools.iter().flatten().map(|b| format!("b:{b}"));
    let versions = a.versions.iter().flatten().map(|v| format!("v:{v}"));
    strings.chain(ints).chain(bools).chain(versions).collect()
}

/// Checks one answer against every rule. `Err` names the first violation.
pub fn check(case: &Case, results: &[AllocationResult]) -> Result<(), String> {
    let env = env();
    let env = &*env;
    let vis = visible(case);
    let (exclusive, shared) = allocated_ids(case);
    if results.len() != case.claims.len() {
        return Err(format!(
            "{} results for {} claims",
            results.len(),
            case.claims.len()
        ));
    }
    // Device → (claim index, admin) of every use in this answer.
    let mut uses: HashMap<(String, String, String), Vec<(usize, bool)>> = HashMap::new();
    let mut counter_use: HashMap<(String, String), BTreeMap<String, i128>> = HashMap::new();
    let mut capacity_use: HashMap<(String, String, String), BTreeMap<String, i128>> =
        HashMap::new();
    let mut shared_new: HashSet<(String, String, String)> = HashSet::new();
    for (ci, (claim, result)) in case.claims.iter().zip(results).enumerate() {
        let spec = claim.spec.as_ref().unwrap().devices.as_ref().unwrap();
        let rs = result
            .devices
            .as_ref()
            .and_then(|d| d.results.as_ref())
            .cloned()
            .unwrap_or_default();
        if rs.len() > 32 {
            return Err(format!("claim {ci}: {} results", rs.len()));
        }
        let mut by_request: BTreeMap<String, Vec<&DeviceRequestAllocationResult>> = BTreeMap::new();
        for r in &rs {
            by_request.entry(r.request.clone()).or_default().push(r);
        }
        let mut chosen_devices: Vec<(String, &ResourceSlice, &Device)> = Vec::new();
        for req in spec.requests.iter().flatten() {
            let options = alts(req);
            let used: Vec<&Alt> = options
                .iter()
                .filter(|a| by_request.contains_key(&a.name))
                .collect();
            let [alt] = used.as_slice() else {
                return Err(format!(
                    "claim {ci} request {}: results for {} alternatives",
                    req.name,
                    used.len()
                ));
            };
            let picks = &by_request[&alt.name];
            let matching: Vec<(&ResourceSlice, &Device)> = vis
                .devices
                .iter()
                .copied()
                .filter(|(s, d)| matches_alt(case, env, alt, s, d))
                .collect();
            let want = if alt.all { matching.len() } else { alt.count };
            if picks.len() != want || want == 0 {
                return Err(format!(
                    "claim {ci} request {}: {} devices, want {want}",
                    alt.name,
                    picks.len()
                ));
            }
            for p in picks.iter() {
                let Some(&(s, d)) = matching.iter().find(|(s, d)| {
                    s.spec.driver == p.driver && s.spec.pool.name == p.pool && d.name == p.device
                }) else {
                    return Err(format!(
                        "claim {ci} request {}: device {}/{}/{} not selectable",
                        alt.name, p.driver, p.pool, p.device
                    ));
                };
                for t in taints_of(case, s, d) {
                    if matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")
                        && !tolerated(&alt.tolerations, &t)
                    {
                        return Err(format!("device {} tainted {}", d.name, t.key));
                    }
                }
                if p.admin_access.unwrap_or(false) != alt.admin {
                    return Err(format!(
                        "device {}: adminAccess {:?}",
                        d.name, p.admin_access
                    ));
                }
                let id = (p.driver.clone(), p.pool.clone(), p.device.clone());
                let multi = d.allow_multiple_allocations == Some(true);
                if !alt.admin && exclusive.contains(&id) {
                    return Err(format!("device {} already allocated", d.name));
                }
                if multi {
                    if p.share_id.is_none() {
                        return Err(format!("device {}: shared without shareID", d.name));
                    }
                    let caps: BTreeMap<String, i128> = d
                        .capacity
                        .iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), q(&v.value)))
                        .collect();
                    let consumed = p.consumed_capacity.clone().unwrap_or_default();
                    for (k, full) in &caps {
                        let got = consumed
                            .get(k)
                            .map(q)
                            .ok_or(format!("device {}: no consumedCapacity {k}", d.name))?;
                        let want = alt.capacity.get(k).copied().unwrap_or(*full);
                        if got < want {
                            return Err(format!(
                                "device {}: consumed {got} < requested {want}",
                                d.name
                            ));
                        }
                        *capacity_use
                            .entry(id.clone())
                            .or_default()
                            .entry(k.clone())
                            .or_default() += got;
                    }
                } else {
                    if let Some(consumed) = shared.get(&id).filter(|_| !alt.admin) {
                        // A device not shared here whose id shares use (another slice's
                        // device of that name): as upstream, its whole capacity (or what
                        // the request asks) must fit beside what the shares consumed.
                        for c in d.capacity.iter().flatten() {
                            let full = q(&c.1.value);
                            let want = alt.capacity.get(c.0).copied().unwrap_or(full);
                            let used = consumed.get(c.0).copied().unwrap_or(0);
                            if used + want > full {
                                return Err(format!(
                                    "device {}: capacity {} used by shares elsewhere",
                                    d.name, c.0
                                ));
                            }
                        }
                    }
                    uses.entry(id.clone()).or_default().push((ci, alt.admin));
                }
                let first_share =
                    multi && !shared.contains_key(&id) && shared_new.insert(id.clone());
                if (!multi || first_share)
                    && !d.consumes_counters.as_ref().is_none_or(|c| c.is_empty())
                {
                    {
                        let e = counter_use
                            .entry((p.driver.clone(), p.pool.clone()))
                            .or_default();
                        for c in d.consumes_counters.iter().flatten() {
                            for (n, v) in &c.counters {
                                *e.entry(format!("{}/{n}", c.counter_set)).or_default() +=
                                    q(&v.value);
                            }
                        }
                    }
                }
                chosen_devices.push((alt.base.clone(), s, d));
                let _ = alt.name.clone();
            }
        }
        if by_request.values().map(Vec::len).sum::<usize>() != rs.len() {
            return Err(format!("claim {ci}: results for unknown requests"));
        }
        // Attributes some request derives (DRADerivedAttributes): a CEL value per device and
        // request, which this checker does not compute; the reference comparison covers them.
        let derived: HashSet<&str> = spec
            .requests
            .iter()
            .flatten()
            .flat_map(|r| {
                let exact = r
                    .exactly
                    .iter()
                    .flat_map(|e| e.derived_attributes.iter().flatten());
                let subs = r
                    .first_available
                    .iter()
                    .flatten()
                    .flat_map(|s| s.derived_attributes.iter().flatten());
                exact.chain(subs)
            })
            .map(|d| d.name.as_str())
            .collect();
        for c in spec.constraints.iter().flatten() {
            let names = c.requests.clone().unwrap_or_default();
            let covered: Vec<&(String, &ResourceSlice, &Device)> = chosen_devices
                .iter()
                .filter(|(base, _, _)| names.is_empty() || names.contains(base))
                .collect();
            let attr_name = c
                .match_attribute
                .as_ref()
                .or(c.distinct_attribute.as_ref())
                .unwrap();
            if derived.contains(attr_name.as_str()) {
                continue;
            }
            let values: Vec<Option<String>> = covered
                .iter()
                .map(|(_, s, d)| {
                    attr(s, d, attr_name).map(|a| scalar(a).unwrap_or_else(|| "list".into()))
                })
                .collect();
            if values.iter().any(Option::is_none) {
                return Err(format!("claim {ci}: a device lacks {attr_name}"));
            }
            if case.alpha_gates {
                // DRAListTypeAttributes: a value is the set of its items (one for a scalar);
                // matching sets share an item, distinct ones none.
                let sets: Vec<HashSet<String>> = covered
                    .iter()
                    .map(|(_, s, d)| attr(s, d, attr_name).map(items).unwrap_or_default())
                    .collect();
                let shared = sets.iter().skip(1).fold(sets.first().cloned(), |acc, s| {
                    acc.map(|a| a.intersection(s).cloned().collect::<HashSet<String>>())
                });
                if c.match_attribute.is_some() && shared.is_some_and(|s| s.is_empty()) {
                    return Err(format!(
                        "claim {ci}: matchAttribute {attr_name} broken: {sets:?}"
                    ));
                }
                let overlap = sets
                    .iter()
                    .enumerate()
                    .any(|(i, a)| sets[i + 1..].iter().any(|b| !a.is_disjoint(b)));
                if c.distinct_attribute.is_some() && overlap {
                    return Err(format!(
                        "claim {ci}: distinctAttribute {attr_name} broken: {sets:?}"
                    ));
                }
                continue;
            }
            let distinct: HashSet<&Option<String>> = values.iter().collect();
            if c.match_attribute.is_some() && distinct.len() > 1 {
                return Err(format!(
                    "claim {ci}: matchAttribute {attr_name} broken: {values:?}"
                ));
            }
            if c.distinct_attribute.is_some() && distinct.len() != values.len() {
                return Err(format!(
                    "claim {ci}: distinctAttribute {attr_name} broken: {values:?}"
                ));
            }
        }
    }
    for (id, list) in &uses {
        for (i, (ci, admin)) in list.iter().enumerate() {
            for (cj, admin_j) in &list[i + 1..] {
                let _ = admin;
                let ok = ci != cj && *admin_j; // only an admin use in a later claim may reuse it
                if !ok {
                    return Err(format!("device {id:?} used twice: {list:?}"));
                }
            }
        }
    }
    for (pool, used) in &counter_use {
        let avail = &vis.counters[pool];
        for (name, a) in avail {
            if *a < used.get(name).copied().unwrap_or(0) {
                return Err(format!(
                    "pool {pool:?}: counter {name} over: available {a}, used {:?}",
                    used.get(name)
                ));
            }
        }
    }
    for (id, used) in &capacity_use {
        let (s, d) = vis
            .devices
            .iter()
            .find(|(s, d)| {
                (
                    s.spec.driver.clone(),
                    s.spec.pool.name.clone(),
                    d.name.clone(),
                ) == *id
            })
            .unwrap();
        let _ = s;
        for (k, v) in used {
            let cap = q(&d.capacity.as_ref().unwrap()[k].value);
            let before = shared.get(id).and_then(|m| m.get(k)).copied().unwrap_or(0);
            if before + v > cap {
                return Err(format!(
                    "device {id:?}: capacity {k} over: {before} + {v} > {cap}"
                ));
            }
        }
    }
    Ok(())
}

fn binom(n: usize, k: usize) -> f64 {
    if k > n {
        return 0.0;
    }
    (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
}

/// Whether any valid answer exists, by enumerating every combination; `None` when the case
/// is too large to enumerate.
pub fn exists(case: &Case) -> Option<bool> {
    let env = env();
    let env = &*env;
    let vis = visible(case);
    let mut groups: Vec<(usize, Vec<(Alt, Vec<usize>)>)> = Vec::new();
    for (ci, claim) in case.claims.iter().enumerate() {
        for req in claim
            .spec
            .as_ref()
            .unwrap()
            .devices
            .as_ref()
            .unwrap()
            .requests
            .iter()
            .flatten()
        {
            let options = alts(req)
                .into_iter()
                .map(|a| {
                    let m = (0..vis.devices.len())
                        .filter(|&i| matches_alt(case, env, &a, vis.devices[i].0, vis.devices[i].1))
                        .collect();
                    (a, m)
                })
                .collect();
            groups.push((ci, options));
        }
    }
    let mut space = 1f64;
    for (_, options) in &groups {
        let n: f64 = options
            .iter()
            .map(|(a, m)| if a.all { 1.0 } else { binom(m.len(), a.count) })
            .sum();
        space *= n.max(1.0);
    }
    if space > 2e5 {
        return None;
    }
    let mut picks: Vec<Vec<DeviceRequestAllocationResult>> = vec![Vec::new(); case.claims.len()];
    Some(enumerate(case, &vis, &groups, 0, &mut picks))
}

fn enumerate(
    case: &Case,
    vis: &Visible<'_>,
    groups: &[(usize, Vec<(Alt, Vec<usize>)>)],
    g: usize,
    picks: &mut Vec<Vec<DeviceRequestAllocationResult>>,
) -> bool {
    if g == groups.len() {
        let results: Vec<AllocationResult> = picks
            .iter()
            .map(|r| AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(r.clone()),
                    config: None,
                }),
                ..Default::default()
            })
            .collect();
        return check(case, &results).is_ok();
    }
    let (ci, options) = &groups[g];
    for (alt, matching) in options {
        let combos: Vec<Vec<usize>> = if alt.all {
            vec![matching.clone()]
        } else {
            combinations(matching, alt.count)
        };
        for combo in combos {
            let before = picks[*ci].len();
            for &i in &combo {
                let (s, d) = vis.devices[i];
                let multi = d.allow_multiple_allocations == Some(true);
                let consumed = multi.then(|| {
                    d.capacity
                        .iter()
                        .flatten()
                        .map(|(k, v)| {
                            let want = alt
                                .capacity
                                .get(k)
                                .map(|n| Quantity::from_nano(*n).to_openapi())
                                .unwrap_or(v.value.clone());
                            (k.clone(), want)
                        })
                        .collect()
                });
                picks[*ci].push(DeviceRequestAllocationResult {
                    request: alt.name.clone(),
                    driver: s.spec.driver.clone(),
                    pool: s.spec.pool.name.clone(),
                    device: d.name.clone(),
                    admin_access: alt.admin.then_some(true),
                    share_id: multi.then(|| "x".to_string()),
                    consumed_capacity: consumed,
                    ..Default::default()
                });
            }
            if enumerate(case, vis, groups, g + 1, picks) {
                return true;
            }
            picks[*ci].truncate(before);
        }
    }
    false
}

fn combinations(items: &[usize], k: usize) -> Vec<Vec<usize>> {
    if k == 0 {
        return vec![Vec::new()];
    }
    if items.len() < k {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, &x) in items.iter().enumerate() {
        for mut rest in combinations(&items[i + 1..], k - 1) {
            rest.insert(0, x);
            out.push(rest);
        }
    }
    out
}

/// What a scheduling cycle asks of the allocator for one pod: `Allocator::new`, `allocate`
/// on every node (keeping each compact answer until scoring is done, as the engine does),
/// then the `AllocationResult`s of one node, here the first that fits. Returns how many
/// nodes fit.
pub fn one_pod(snap: &Snapshot, case: &Case) -> usize {
    let claims: Vec<_> = case.claims.iter().collect();
    let allocator = dra_allocator::Allocator::new(snap, &claims).expect("valid claims");
    let found: Vec<(&Node, dra_allocator::Allocation)> = case
        .nodes
        .iter()
        .filter_map(|n| match allocator.allocate(n).expect("no error") {
            dra_allocator::Outcome::Allocated(a) => Some((n, a)),
            dra_allocator::Outcome::Unfit(_) => None,
        })
        .collect();
    if let Some((node, a)) = found.first() {
        let results = allocator.results(node, a).expect("results");
        assert_eq!(results.len(), claims.len());
    }
    found.len()
}
