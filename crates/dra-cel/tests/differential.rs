//! Differential test against the real implementation: every case of the selector table plus a
//! few thousand generated expression/device pairs go through tests/cluster/cmd/celcheck (Go,
//! k8s.io/dynamic-resource-allocation/cel v0.37.2) and through dra-cel; any disagreement —
//! a different result, or an error on one side only — fails the test. Generated quantity
//! strings are compared the same way (canonical text, or rejection).
//!
//! Needs Go: the test builds celcheck with `go build` when tests/cluster/bin/celcheck is
//! missing or older than its source, and fails (never skips) when that is not possible.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{Case, Device, Outcome, evaluate, table};
use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use serde::Deserialize;

fn module_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/cluster")
}

fn modified(p: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// The celcheck binary, built if missing or stale.
fn celcheck() -> PathBuf {
    let dir = module_dir();
    let bin = dir.join("bin/celcheck");
    let src = dir.join("cmd/celcheck/main.go");
    if modified(&bin).is_some() && modified(&bin) >= modified(&src) {
        return bin;
    }
    let out = Command::new("go")
        .args(["build", "-o", "bin/celcheck", "./cmd/celcheck"])
        .current_dir(&dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "the differential test needs Go to build {}: running `go build` failed: {e}. \
                 Install Go (see tests/cluster/go.mod for the version) and rerun.",
                src.display()
            )
        });
    assert!(
        out.status.success(),
        "go build ./cmd/celcheck in {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

#[derive(Debug, Deserialize)]
struct GoCase {
    result: Option<bool>,
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct GoQuantity {
    canonical: Option<String>,
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct GoOutput {
    cases: Vec<GoCase>,
    quantities: Vec<GoQuantity>,
}

fn run_go(
    list_type_attributes: bool,
    devices: &BTreeMap<String, Device>,
    cases: &[Case],
    quantities: &[String],
) -> GoOutput {
    let input = serde_json::json!({
        "listTypeAttributes": list_type_attributes,
        "devices": devices,
        "cases": cases.iter().map(|c| serde_json::json!({"expr": c.expr, "device": c.device})).collect::<Vec<_>>(),
        "quantities": quantities,
    });
    let mut child = Command::new(celcheck())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting celcheck");
    let body = serde_json::to_vec(&input).unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(&body));
    let out = child.wait_with_output().expect("running celcheck");
    writer.join().unwrap().expect("writing to celcheck");
    assert!(
        out.status.success(),
        "celcheck failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: GoOutput = serde_json::from_slice(&out.stdout).expect("celcheck output");
    assert_eq!(parsed.cases.len(), cases.len());
    parsed
}

/// SplitMix64: a fixed seed gives the same cases on every run and machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn int(&mut self) -> i64 {
        self.pick(&[
            0,
            1,
            2,
            3,
            5,
            8,
            10,
            16,
            40,
            80,
            100,
            1024,
            -1,
            -5,
            i64::MAX,
            i64::MIN + 1,
        ])
    }
}

const DRIVERS: &[&str] = &["gpu.example.com", "nic.example.com"];
const DOMAINS: &[&str] = &[
    "gpu.example.com",
    "nic.example.com",
    "numa.example.com",
    "unknown.example.com",
];
const NAMES: &[&str] = &[
    "model", "memory", "index", "healthy", "version", "cores", "missing",
];
const DOUBLES: &[&str] = &[
    "0.5",
    "1.5",
    "2.25",
    "-0.0",
    "1234.5",
    "123456.0",
    "1234567.0",
    "123456789.0",
    "1e21",
    "1e-7",
    "0.000123",
    "-42.125",
    "double(\"NaN\")",
    "double(\"-Infinity\")",
];
const WORDS: &[&str] = &["a100", "A100", "h100-sxm", "x", "", "gpu,mig", "Tesla T4"];

/// Quantities the workspace's parsers once disagreed on (whitespace, exponents), and the ends
/// of the grammar: Kubernetes' answer for each is checked along with the generated ones.
const EDGE_QUANTITIES: &[&str] = &[
    " 1",
    "1 ",
    "\t1",
    "1\n",
    "1 Gi",
    "- 1",
    "1e 3",
    "\u{a0}1",
    " ",
    "",
    "1e3",
    "1E3",
    "1e+3",
    "1e-3",
    "1e0",
    "1.5e1",
    "1e-100",
    "-1e-100",
    "0e100",
    "1e18",
    "1e27",
    "1e4294967299",
    "1e-4294967299",
    "1e4294967296",
    "1e",
    "1E",
    "1e+",
    "1e-",
    "1ee3",
    "1e3Ki",
    "1e1.5",
    "1e9223372036854775808",
    "8Ei",
    "100Ei",
    "100E",
    "0.0001Ki",
    "1.0000000001",
    "-1.0000000001",
    "0.1n",
    "k",
    "-",
    "+",
    ".",
    "Gi",
    "-0",
    "0.000",
    "1.G",
    ".5",
    "001",
    "--1",
    "1K",
    "1ki",
    "1.5.5",
    "１",
];

fn quantity_string(r: &mut Rng) -> String {
    let mut s = String::new();
    if r.chance(15) {
        s.push('-');
    }
    s.push_str(r.pick(&[
        "0",
        "1",
        "2",
        "5",
        "10",
        "16",
        "80",
        "100",
        "1000",
        "1024",
        "1536",
        "123456789",
    ]));
    if r.chance(30) {
        s.push('.');
        s.push_str(r.pick(&["5", "25", "0", "001", "000000001", "0000000001", "75"]));
    }
    s.push_str(r.pick(&[
        "", "", "m", "k", "M", "G", "T", "Ki", "Mi", "Gi", "Ti", "e3", "e-3", "E6", "n", "u", "Ei",
    ]));
    if r.chance(3) {
        s.push_str(r.pick(&["x", "i", ".", "e"]));
    }
    s
}

fn version_string(r: &mut Rng) -> String {
    let core = format!("{}.{}.{}", r.below(3), r.below(12), r.below(3));
    match r.below(6) {
        0 => format!("{core}-alpha"),
        1 => format!("{core}-rc.{}", r.below(12)),
        2 => format!("{core}+build.{}", r.below(3)),
        3 if r.chance(30) => format!("v{core}"),
        _ => core,
    }
}

fn device(r: &mut Rng) -> Device {
    let driver = r.pick(DRIVERS).to_string();
    let mut attributes = BTreeMap::new();
    let mut capacity = BTreeMap::new();
    for _ in 0..r.below(8) {
        let domain = r.pick(&[
            "",
            "",
            "numa.example.com/",
            "nic.example.com/",
            "gpu.example.com/",
        ]);
        let name = format!("{domain}{}", r.pick(NAMES));
        let a = match r.below(6) {
            0 => DeviceAttribute {
                int: Some(r.int()),
                ..Default::default()
            },
            1 => DeviceAttribute {
                bool: Some(r.chance(50)),
                ..Default::default()
            },
            2 => DeviceAttribute {
                string: Some(r.pick(WORDS).to_string()),
                ..Default::default()
            },
            3 => DeviceAttribute {
                version: Some(format!("{}.{}.{}", r.below(3), r.below(12), r.below(3))),
                ..Default::default()
            },
            4 => DeviceAttribute {
                ints: Some((0..r.below(4)).map(|_| r.int()).collect()),
                ..Default::default()
            },
            _ => DeviceAttribute {
                strings: Some((0..r.below(3)).map(|_| r.pick(WORDS).to_string()).collect()),
                ..Default::default()
            },
        };
        // `x` and `<driver>/x` are the same attribute; with both, Kubernetes picks one at
        // random (map order), so a device never gets both here.
        let plain = match name.split_once('/') {
            Some((d, id)) if d == driver => id.to_string(),
            Some(_) => String::new(),
            None => name.clone(),
        };
        if !plain.is_empty()
            && (attributes.contains_key(&plain)
                || attributes.contains_key(&format!("{driver}/{plain}")))
        {
            continue;
        }
        attributes.insert(name, a);
    }
    for _ in 0..r.below(4) {
        let domain = r.pick(&["", "", "numa.example.com/"]);
        let name = format!("{domain}{}", r.pick(NAMES));
        let mut q = quantity_string(r);
        while q.parse::<dra_cel::Quantity>().is_err() {
            q = quantity_string(r);
        }
        capacity.insert(
            name,
            DeviceCapacity {
                value: ApiQuantity(q),
                ..Default::default()
            },
        );
    }
    Device {
        driver,
        allow_multiple_allocations: r.chance(50),
        attributes,
        capacity,
    }
}

fn attr(r: &mut Rng) -> String {
    format!("device.attributes[{:?}].{}", r.pick(DOMAINS), r.pick(NAMES))
}

fn cap(r: &mut Rng) -> String {
    format!("device.capacity[{:?}].{}", r.pick(DOMAINS), r.pick(NAMES))
}

fn literal(r: &mut Rng) -> String {
    match r.below(4) {
        0 => r.int().to_string(),
        1 => format!("{:?}", r.pick(WORDS)),
        2 => r.pick(&["true", "false"]).to_string(),
        _ => format!("{}.5", r.below(100)),
    }
}

fn int_list(r: &mut Rng) -> String {
    let items: Vec<String> = (0..r.below(5))
        .map(|_| (r.below(20) as i64 - 5).to_string())
        .collect();
    format!("[{}]", items.join(", "))
}

fn cmp(r: &mut Rng) -> &'static str {
    r.pick(&["==", "!=", "<", "<=", ">", ">="])
}

fn bool_expr(r: &mut Rng, depth: u32) -> String {
    let leaf = depth == 0 || r.chance(45);
    if !leaf {
        return match r.below(5) {
            0 => format!(
                "({} && {})",
                bool_expr(r, depth - 1),
                bool_expr(r, depth - 1)
            ),
            1 => format!(
                "({} || {})",
                bool_expr(r, depth - 1),
                bool_expr(r, depth - 1)
            ),
            2 => format!("!({})", bool_expr(r, depth - 1)),
            3 => format!(
                "({} ? {} : {})",
                bool_expr(r, depth - 1),
                bool_expr(r, depth - 1),
                bool_expr(r, depth - 1)
            ),
            _ => format!(
                "cel.bind(b, {}, b || {})",
                bool_expr(r, depth - 1),
                bool_expr(r, depth - 1)
            ),
        };
    }
    match r.below(52) {
        0 => format!("{} {} {}", attr(r), cmp(r), literal(r)),
        1 => format!("has({})", attr(r)),
        2 => format!("device.driver == {:?}", r.pick(DRIVERS)),
        3 => format!(
            "device.driver.startsWith({:?})",
            r.pick(&["gpu", "nic", ""])
        ),
        4 => "device.allowMultipleAllocations".to_string(),
        5 => format!(
            "{}.isGreaterThan(quantity({:?}))",
            cap(r),
            quantity_string(r)
        ),
        6 => format!(
            "{}.compareTo(quantity({:?})) {} {}",
            cap(r),
            quantity_string(r),
            cmp(r),
            r.below(3) as i64 - 1
        ),
        7 => {
            // Often the same value twice (in one spelling or two), where strict and non-strict
            // comparisons differ.
            let a = quantity_string(r);
            let b = match r.below(3) {
                0 => a.clone(),
                1 => a
                    .parse::<dra_cel::Quantity>()
                    .map_or_else(|_| a.clone(), |q| q.to_string()),
                _ => quantity_string(r),
            };
            format!(
                "quantity({a:?}).{}(quantity({b:?}))",
                r.pick(&["isLessThan", "isGreaterThan"])
            )
        }
        8 => format!(
            "quantity({:?}) == quantity({:?})",
            quantity_string(r),
            quantity_string(r)
        ),
        9 => format!(
            "quantity({:?}).{}(quantity({:?})).compareTo(quantity({:?})) == {}",
            quantity_string(r),
            r.pick(&["add", "sub"]),
            quantity_string(r),
            quantity_string(r),
            r.below(3) as i64 - 1
        ),
        10 => format!("isQuantity({:?})", quantity_string(r)),
        11 => format!(
            "quantity({:?}).{}()",
            quantity_string(r),
            r.pick(&["isInteger"])
        ),
        12 => format!(
            "quantity({:?}).asInteger() {} {}",
            quantity_string(r),
            cmp(r),
            r.int()
        ),
        13 => format!(
            "sign(quantity({:?})) == {}",
            quantity_string(r),
            r.below(3) as i64 - 1
        ),
        14 => format!(
            "semver({:?}).{}(semver({:?}))",
            version_string(r),
            r.pick(&["isLessThan", "isGreaterThan"]),
            version_string(r)
        ),
        15 => format!("isSemver({:?})", version_string(r)),
        16 => format!(
            "semver({:?}) == semver({:?})",
            version_string(r),
            version_string(r)
        ),
        17 => format!("{}.isGreaterThan(semver({:?}))", attr(r), version_string(r)),
        18 => format!(
            "{}.?{}.orValue({}) {} {}",
            format_args!("device.attributes[{:?}]", r.pick(DOMAINS)),
            r.pick(NAMES),
            literal(r),
            cmp(r),
            literal(r)
        ),
        19 => format!(
            "{:?}.{}() == {:?}",
            r.pick(WORDS),
            r.pick(&["lowerAscii", "upperAscii", "trim"]),
            r.pick(WORDS)
        ),
        20 => format!("{:?}.split(\",\").size() == {}", r.pick(WORDS), r.below(3)),
        21 => format!(
            "{:?}.matches({:?})",
            r.pick(WORDS),
            r.pick(&["^a", "[0-9]+", "x$", "(?i)a100", "^$"])
        ),
        22 => format!(
            "{}.{}() {} {}",
            int_list(r),
            r.pick(&["sum", "min", "max"]),
            cmp(r),
            r.below(10)
        ),
        23 => format!("{}.isSorted()", int_list(r)),
        24 => format!("{} in {}", r.below(10), int_list(r)),
        25 => format!(
            "{}.{}(x, x {} {})",
            int_list(r),
            r.pick(&["all", "exists", "exists_one"]),
            cmp(r),
            r.below(10)
        ),
        26 => format!(
            "sets.{}({}.map(x, x + {}), {})",
            r.pick(&["contains", "intersects", "equivalent"]),
            int_list(r),
            r.below(3),
            int_list(r)
        ),
        27 => format!(
            "({} + {}) * {} {} {}",
            r.int(),
            r.int(),
            r.int(),
            cmp(r),
            r.int()
        ),
        28 => format!("{} / {} == {}", r.int(), r.below(3), r.int()),
        29 => format!(
            "{}.filter(x, x > {}).map(x, x * 2).size() == {}",
            int_list(r),
            r.below(5),
            r.below(4)
        ),
        30 => format!("device.attributes.exists(d, {})", pick_domain_pred(r)),
        31 => format!("device.attributes.all(d, {})", pick_domain_pred(r)),
        32 => format!(
            "device.attributes[{:?}].exists(n, n.startsWith({:?}))",
            r.pick(DOMAINS),
            r.pick(&["m", "i", "v", ""])
        ),
        33 => format!("{}.exists(x, x {} {})", attr(r), cmp(r), literal(r)),
        34 => format!("{}.includes({})", attr(r), literal(r)),
        35 => format!(
            "{}.{}() {} {}",
            attr(r),
            r.pick(&["min", "max", "sum"]),
            cmp(r),
            r.int()
        ),
        36 => format!("{}.size() {} {}", attr(r), cmp(r), r.below(4)),
        37 => format!("{}.lowerAscii().contains({:?})", attr(r), r.pick(WORDS)),
        38 => format!(
            "{:?}.find({:?}) == {:?}",
            r.pick(WORDS),
            r.pick(&["[0-9]+", "a", "[A-Z]"]),
            r.pick(WORDS)
        ),
        39 => format!(
            "{:?}.findAll({:?}).size() == {}",
            r.pick(WORDS),
            r.pick(&["[0-9]", "[a-z]+", "."]),
            r.below(4)
        ),
        40 => format!(
            "{}.map(x, {:?}.format([x])).join(\",\").size() > {}",
            int_list(r),
            r.pick(&["%d", "%s", "%x"]),
            r.below(6)
        ),
        41 => format!(
            "{}.add({}).isGreaterThan(quantity({:?}))",
            cap(r),
            r.int(),
            quantity_string(r)
        ),
        42 => format!(
            "cel.bind(a, device.attributes[{:?}], a.?{}.orValue({}) == {})",
            r.pick(DOMAINS),
            r.pick(NAMES),
            literal(r),
            literal(r)
        ),
        43 => format!(
            "{}.exists(x, 10 / x {} {})",
            int_list(r),
            cmp(r),
            r.below(5)
        ),
        44 => format!("{}.all(x, {} / x > 0)", int_list(r), r.below(20)),
        45 => format!("{}.isLessThan(semver({:?}))", attr(r), version_string(r)),
        46 => format!(
            "{}.{}(i, v, v {} i + {})",
            int_list(r),
            r.pick(&["all", "exists", "existsOne"]),
            cmp(r),
            r.below(3)
        ),
        47 => format!(
            "device.attributes[{:?}].{}(k, v, k.startsWith({:?}) || v == {})",
            r.pick(DOMAINS),
            r.pick(&["all", "exists"]),
            r.pick(&["m", "i", ""]),
            literal(r)
        ),
        48 => format!(
            "{}.transformList(i, v, i * v).sum() {} {}",
            int_list(r),
            cmp(r),
            r.below(20)
        ),
        50 => format!(
            "{:?}.format([{}]).size() == {}",
            r.pick(&["%s", "%f", "%.2f", "%.0f", "%e", "x%sy"]),
            r.pick(DOUBLES),
            r.below(16)
        ),
        51 => format!(
            "string({}).size() {} {}",
            r.pick(DOUBLES),
            cmp(r),
            r.below(12)
        ),
        _ => format!(
            "{}.{}().orValue({}) {} {}",
            int_list(r),
            r.pick(&["first", "last"]),
            r.below(5),
            cmp(r),
            r.below(5)
        ),
    }
}

/// A conjunction of string comparisons: the shape `dra_cel` decides without its interpreter
/// (see its `shortcut` module). Half the attribute terms read a string attribute `device`
/// has, mostly comparing it with its own value; the others may be missing or of another
/// type, some literals are of another type, and some domains are unknown, where the
/// interpreter must decide.
fn string_comparisons(r: &mut Rng, device: &Device) -> String {
    let strings: Vec<(String, String, &str)> = device
        .attributes
        .iter()
        .filter_map(|(name, a)| {
            let (domain, id) = name.split_once('/').unwrap_or((&device.driver, name));
            Some((domain.to_string(), id.to_string(), a.string.as_deref()?))
        })
        .collect();
    let terms: Vec<String> = (0..1 + r.below(3))
        .map(|_| {
            let own =
                (!strings.is_empty() && r.chance(50)).then(|| &strings[r.below(strings.len())]);
            let (read, literal) = match own {
                Some((domain, id, value)) => {
                    let read = if r.chance(50) {
                        format!("device.attributes[{domain:?}].{id}")
                    } else {
                        format!("device.attributes[{domain:?}][{id:?}]")
                    };
                    let literal = if r.chance(75) { value } else { r.pick(WORDS) };
                    (read, format!("{literal:?}"))
                }
                None => {
                    let read = match r.below(3) {
                        0 => "device.driver".to_string(),
                        _ => attr(r),
                    };
                    let literal = match r.below(4) {
                        0 => literal(r),
                        1 => format!("{:?}", r.pick(DRIVERS)),
                        _ => format!("{:?}", r.pick(WORDS)),
                    };
                    (read, literal)
                }
            };
            if r.chance(20) {
                format!("{literal} == {read}")
            } else {
                format!("{read} == {literal}")
            }
        })
        .collect();
    terms.join(" && ")
}

fn pick_domain_pred(r: &mut Rng) -> String {
    match r.below(4) {
        0 => format!("d == {:?}", r.pick(DOMAINS)),
        1 => format!(
            "device.attributes[d].{} {} {}",
            r.pick(NAMES),
            cmp(r),
            literal(r)
        ),
        2 => format!("has(device.attributes[d].{})", r.pick(NAMES)),
        _ => format!("device.attributes[d].size() > {}", r.below(3)),
    }
}

fn describe(o: &Outcome) -> String {
    match o {
        Outcome::Result(b) => b.to_string(),
        Outcome::Error(k, m) => format!("{k:?} error: {m}"),
    }
}

#[test]
fn dra_cel_agrees_with_kubernetes() {
    let t = table();
    let mut devices = t.devices.clone();
    let mut cases: Vec<Case> = t
        .cases
        .iter()
        .filter(|c| c.divergence.is_none())
        .cloned()
        .collect();
    let table_cases = cases.len();

    let mut r = Rng(0x05EE_DD7A_0CE1);
    for i in 0..200 {
        devices.insert(format!("gen{i}"), device(&mut r));
    }
    for _ in 0..4000 {
        let device = format!("gen{}", r.below(200));
        cases.push(Case {
            expr: bool_expr(&mut r, 3),
            device,
            result: None,
            error: None,
            kubernetes_message: None,
            divergence: None,
        });
    }
    let quantities: Vec<String> = EDGE_QUANTITIES
        .iter()
        .map(|s| s.to_string())
        .chain((0..2000).map(|_| quantity_string(&mut r)))
        .collect();
    let generated = cases.len();
    for _ in 0..2000 {
        let device = format!("gen{}", r.below(200));
        cases.push(Case {
            expr: string_comparisons(&mut r, &devices[&device]),
            device,
            result: None,
            error: None,
            kubernetes_message: None,
            divergence: None,
        });
    }
    let first: Vec<Case> = cases[..table_cases + 1000]
        .iter()
        .chain(&cases[generated..])
        .cloned()
        .collect();
    let off = compare(!t.list_type_attributes, &devices, &first, &[]);

    let on = compare(t.list_type_attributes, &devices, &cases, &quantities);
    eprintln!(
        "compared {} selector cases ({table_cases} from the table, {} generated, {} of them conjunctions of \
         string comparisons; {} true, {} errors on both sides) and {} quantities with list-type attributes {}, \
         and {} of the cases again with them {} ({} true, {} errors)",
        cases.len(),
        cases.len() - table_cases,
        cases.len() - generated,
        on.trues,
        on.errors,
        quantities.len(),
        t.list_type_attributes,
        first.len(),
        !t.list_type_attributes,
        off.trues,
        off.errors,
    );
    let all: Vec<String> = on
        .disagreements
        .into_iter()
        .chain(off.disagreements)
        .collect();
    assert!(
        all.is_empty(),
        "{} disagreements:\n{}",
        all.len(),
        all.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
    );
}

struct Comparison {
    disagreements: Vec<String>,
    trues: usize,
    errors: usize,
}

fn compare(
    list_type_attributes: bool,
    devices: &BTreeMap<String, Device>,
    cases: &[Case],
    quantities: &[String],
) -> Comparison {
    let go = run_go(list_type_attributes, devices, cases, quantities);
    let env = dra_cel::Environment::new(dra_cel::Options {
        list_type_attributes,
    });
    let mut out = Comparison {
        disagreements: Vec::new(),
        trues: 0,
        errors: 0,
    };
    for (case, theirs) in cases.iter().zip(&go.cases) {
        let ours = evaluate(&env, &case.expr, &devices[&case.device]);
        let agree = match (&ours, theirs.result) {
            (Outcome::Result(a), Some(b)) => {
                out.trues += usize::from(*a);
                *a == b
            }
            (Outcome::Error(..), None) => {
                out.errors += 1;
                true
            }
            _ => false,
        };
        if !agree {
            out.disagreements.push(format!(
                "{:?} on {} ({:?}, list-type attributes {list_type_attributes}): dra-cel {}, Kubernetes {}",
                case.expr,
                case.device,
                devices[&case.device],
                describe(&ours),
                theirs.result.map_or_else(|| format!("error: {}", theirs.error.as_deref().unwrap_or("")), |b| b.to_string())
            ));
        }
    }
    for (s, theirs) in quantities.iter().zip(&go.quantities) {
        let ours = s.parse::<dra_cel::Quantity>().map(|q| q.to_string()).ok();
        if ours != theirs.canonical {
            out.disagreements.push(format!(
                "quantity {s:?}: dra-cel {ours:?}, Kubernetes {:?} {:?}",
                theirs.canonical, theirs.error
            ));
        }
    }
    out
}
