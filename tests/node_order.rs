//! The order in which a scheduling cycle examines nodes, against kube-scheduler's own cache
//! (`tests/cluster/cmd/nodeorder`, k8s.io/kubernetes v1.37.2 built from the Go module).
//!
//! With 100 nodes or more a cycle stops after enough feasible nodes and the next goes on
//! from there, so which nodes are scored depends on this order: kube-scheduler lists its
//! nodes zone by zone in turn, each zone in arrival order. Random sequences of nodes that
//! come (first as an informer's initial list, in name order), change labels and go are
//! replayed on both sides; the lists must be the same at every snapshot.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

use dra_engine::state::{ClusterInput, ClusterState};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;
use serde_json::{Value, json};

/// kube-scheduler's cache, one case a line.
struct Reference {
    _child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Reference {
    fn start() -> Reference {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/cluster");
        let status = Command::new("go")
            .args(["build", "-o", "bin/nodeorder", "./cmd/nodeorder"])
            .current_dir(&dir)
            .status()
            .expect("go build (the reference needs Go)");
        assert!(status.success(), "go build ./cmd/nodeorder failed");
        let mut child = Command::new(dir.join("bin/nodeorder"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start nodeorder");
        Reference {
            stdin: child.stdin.take().unwrap(),
            stdout: BufReader::new(child.stdout.take().unwrap()),
            _child: child,
        }
    }

    fn snapshots(&mut self, steps: &[Value]) -> Vec<Vec<String>> {
        writeln!(self.stdin, "{}", json!({ "steps": steps })).unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let out: Value = serde_json::from_str(&line).unwrap();
        assert!(out.get("error").is_none(), "{out}");
        serde_json::from_value(out["snapshots"].clone()).unwrap()
    }
}

static REFERENCE: Mutex<Option<Reference>> = Mutex::new(None);

const NAMES: [&str; 10] = [
    "a-1", "a-2", "b-1", "b-10", "b-2", "c", "gpu-0", "gpu-1", "n-7", "zz",
];

/// The zone labels a node may carry: none, a GA zone, a beta zone over a GA one, a
/// region and zone, a region alone.
fn labels(choice: usize) -> Vec<(&'static str, &'static str)> {
    const ZONE: &str = "topology.kubernetes.io/zone";
    const REGION: &str = "topology.kubernetes.io/region";
    const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
    match choice {
        0 => vec![],
        1 => vec![(ZONE, "a")],
        2 => vec![(ZONE, "b")],
        3 => vec![(ZONE, "c")],
        4 => vec![(ZONE, "b"), (BETA_ZONE, "a")],
        5 => vec![(REGION, "r2"), (ZONE, "a")],
        _ => vec![(REGION, "r2"), ("kubernetes.io/hostname", "x")],
    }
}

fn node(name: &str, label_choice: usize) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels(label_choice)
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[derive(Clone, Debug)]
enum Step {
    /// The node comes, or changes its labels.
    Put(usize, usize),
    Delete(usize),
    Snapshot,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..NAMES.len(), 0..7usize).prop_map(|(n, l)| Step::Put(n, l)),
        2 => (0..NAMES.len()).prop_map(Step::Delete),
        1 => Just(Step::Snapshot),
    ]
}

/// Our lists at each snapshot, and the reference's steps for the same sequence.
fn replay(initial: &[(usize, usize)], steps: &[Step]) -> (Vec<Vec<String>>, Vec<Value>) {
    let mut first: Vec<Node> = Vec::new();
    for &(n, l) in initial {
        if !first
            .iter()
            .any(|f| f.metadata.name.as_deref() == Some(NAMES[n]))
        {
            first.push(node(NAMES[n], l));
        }
    }
    first.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut go: Vec<Value> = first.iter().map(|n| json!({ "add": n })).collect();
    let mut state = ClusterState::new(ClusterInput {
        nodes: first,
        ..Default::default()
    });
    let mut ours = Vec::new();
    let listed = |state: &ClusterState| -> Vec<String> {
        state
            .nodes_in_order()
            .iter()
            .map(|n| n.name().to_string())
            .collect()
    };
    for step in steps.iter().chain([&Step::Snapshot]) {
        match *step {
            Step::Put(n, l) => {
                let known = state.nodes.contains_key(NAMES[n]);
                let verb = if known { "update" } else { "add" };
                go.push(json!({ verb: node(NAMES[n], l) }));
                state.upsert_node(node(NAMES[n], l));
            }
            Step::Delete(n) => {
                if state.nodes.contains_key(NAMES[n]) {
                    go.push(json!({ "remove": NAMES[n] }));
                    state.remove_node(NAMES[n]);
                }
            }
            Step::Snapshot => {
                go.push(json!({ "snapshot": true }));
                ours.push(listed(&state));
            }
        }
    }
    (ours, go)
}

proptest! {
    // 300 cases unless PROPTEST_CASES asks for another number.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(300),
        ..ProptestConfig::default()
    })]

    #[test]
    fn nodes_are_examined_in_kube_schedulers_order(
        initial in prop::collection::vec((0..NAMES.len(), 0..7usize), 0..8),
        steps in prop::collection::vec(step(), 0..30),
    ) {
        let (ours, go) = replay(&initial, &steps);
        let mut reference = REFERENCE.lock().unwrap_or_else(|e| e.into_inner());
        let theirs = reference.get_or_insert_with(Reference::start).snapshots(&go);
        prop_assert_eq!(ours, theirs, "steps: {}", serde_json::to_string(&go).unwrap());
    }
}

#[test]
fn two_zones_of_nodes_named_apart_are_examined_in_turn() {
    let mut nodes: Vec<Node> = (0..3).map(|i| node(&format!("a-{i}"), 1)).collect();
    nodes.extend((0..2).map(|i| node(&format!("b-{i}"), 2)));
    let mut state = ClusterState::new(ClusterInput {
        nodes,
        ..Default::default()
    });
    state.upsert_node(node("0-late", 2));
    let order: Vec<&str> = state.nodes_in_order().iter().map(|n| n.name()).collect();
    assert_eq!(order, ["a-0", "b-0", "a-1", "b-1", "a-2", "0-late"]);
}
