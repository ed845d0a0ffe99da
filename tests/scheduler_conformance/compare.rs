//! The reference (`schedref`, kube-scheduler's framework), our engine on the same case, and
//! the comparison of the two, pod by pod.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use dra_engine::{ClusterInput, Engine, EngineConfig, Evaluation, ObjectKey};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::generate::Case;

/// kube-scheduler's verdict on one pending pod, as `schedref` writes it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Reference {
    pub pod: String,
    pub feasible: Option<Vec<String>>,
    pub unfit: Option<BTreeMap<String, String>>,
    pub scores: Option<BTreeMap<String, i64>>,
    pub plugin_scores: Option<BTreeMap<String, BTreeMap<String, i64>>>,
    pub pre_filter: Option<String>,
    pub error: Option<String>,
}

/// `schedref`'s answer to one case.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct RefAnswer {
    pub pods: Option<Vec<Reference>>,
    pub error: Option<String>,
}

/// The reference program, built with `go build` each time: a binary left from an older
/// checkout would answer in an older format, and Go's build cache makes an up-to-date build
/// quick.
pub fn schedref() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/cluster");
    let go = Command::new("go").arg("version").output();
    assert!(
        go.as_ref().is_ok_and(|o| o.status.success()),
        "the reference needs Go to build tests/cluster/cmd/schedref (go version failed: {go:?})"
    );
    let status = Command::new("go")
        .args(["build", "-o", "bin/schedref", "./cmd/schedref"])
        .current_dir(&dir)
        .status()
        .expect("run go build");
    assert!(status.success(), "go build ./cmd/schedref failed");
    dir.join("bin/schedref")
}

/// Decide every case with the reference, one line each; a writer thread feeds stdin so
/// that neither side waits on a full pipe.
pub fn run_reference(bin: &PathBuf, cases: &[Case]) -> Vec<RefAnswer> {
    let mut child = Command::new(bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start schedref");
    let mut stdin = child.stdin.take().unwrap();
    let lines: Vec<String> = cases
        .iter()
        .map(|c| serde_json::to_string(c).unwrap())
        .collect();
    let writer = std::thread::spawn(move || {
        for line in lines {
            stdin.write_all(line.as_bytes()).unwrap();
            stdin.write_all(b"\n").unwrap();
        }
    });
    let out = BufReader::new(child.stdout.take().unwrap());
    let answers: Vec<RefAnswer> = out
        .lines()
        .map(|l| serde_json::from_str(&l.expect("read schedref")).expect("schedref's JSON"))
        .collect();
    writer.join().unwrap();
    assert!(child.wait().unwrap().success(), "schedref failed");
    assert_eq!(answers.len(), cases.len(), "schedref answered every case");
    answers
}

fn objects<T: DeserializeOwned>(values: &[Value], what: &str) -> Vec<T> {
    values
        .iter()
        .map(|v| {
            serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("generated {what}: {e}"))
        })
        .collect()
}

/// The same case as our engine's input.
pub fn cluster_input(case: &Case) -> ClusterInput {
    ClusterInput {
        namespaces: objects(&case.namespaces, "Namespace"),
        nodes: objects(&case.nodes, "Node"),
        pods: objects(&case.pods, "Pod"),
        claims: objects(&case.resource_claims, "ResourceClaim"),
        classes: objects(&case.device_classes, "DeviceClass"),
        slices: objects(&case.resource_slices, "ResourceSlice"),
        taint_rules: Vec::new(),
        persistent_volumes: objects(&case.persistent_volumes, "PersistentVolume"),
        persistent_volume_claims: objects(&case.persistent_volume_claims, "PersistentVolumeClaim"),
        storage_classes: objects(&case.storage_classes, "StorageClass"),
        csi_nodes: objects(&case.csi_nodes, "CSINode"),
        csi_drivers: objects(&case.csi_drivers, "CSIDriver"),
        volume_attachments: objects(&case.volume_attachments, "VolumeAttachment"),
        services: objects(&case.services, "Service"),
        replication_controllers: objects(&case.replication_controllers, "ReplicationController"),
        replica_sets: objects(&case.replica_sets, "ReplicaSet"),
        stateful_sets: objects(&case.stateful_sets, "StatefulSet"),
    }
}

/// Our engine's verdict on every pending pod of the case, each on the unchanged cluster.
/// A case with its own KubeSchedulerConfiguration runs with that profile instead of
/// `config`'s (without this scheduler's own scores, as kube-scheduler has none of them).
pub fn run_ours(config: &EngineConfig, case: &Case) -> Vec<Evaluation> {
    let mut config = config.clone();
    if let Some(kube) = &case.config {
        match dra_engine::framework::config::profile_config(&kube["profiles"][0], "profiles[0]") {
            Ok(c) => {
                config.profile = c.profile;
                config
                    .profile
                    .plugins
                    .retain(|p| !dra_engine::plugins::OUT_OF_TREE.contains(&p.name.as_str()));
            }
            Err(e) => {
                let error = Evaluation {
                    error: Some(format!(
                        "our reading of the KubeSchedulerConfiguration: {e}"
                    )),
                    ..Evaluation::default()
                };
                return vec![error; case.pending.len()];
            }
        }
    }
    let mut engine = Engine::new(config, cluster_input(case));
    case.pending
        .iter()
        .map(|key| {
            let (namespace, name) = key.split_once('/').unwrap();
            engine.evaluate(&ObjectKey::new(namespace, name))
        })
        .collect()
}

/// Per plugin and node, weighted scores that differ: (kube-scheduler's, ours); `None` where
/// that side did not score.
pub type ScoreDiffs = BTreeMap<String, BTreeMap<String, (Option<i64>, Option<i64>)>>;

/// One way our engine and kube-scheduler differ on a pod.
#[derive(Clone, Debug)]
pub enum Kind {
    /// kube-scheduler puts the pod on the node, we do not.
    WeReject { node: String, ours: String },
    /// We put the pod on the node, kube-scheduler does not.
    WeAccept { node: String, theirs: String },
    /// kube-scheduler has a single best node; ours is another (or several tie).
    BestNode {
        theirs: String,
        ours: Vec<String>,
        their_scores: BTreeMap<String, i64>,
        our_scores: BTreeMap<String, i64>,
        /// Per plugin and node where the weighted scores differ.
        plugins: ScoreDiffs,
    },
    /// Our engine failed on a pod kube-scheduler decided.
    OurError { error: String },
    /// The reference could not decide: a problem of the generator or of `schedref`.
    ReferenceError { error: String },
}

#[derive(Clone, Debug)]
pub struct Disagreement {
    pub pod: String,
    pub kind: Kind,
}

impl Disagreement {
    /// A short name of the kind, with the plugin to blame when one can be told, for the
    /// summary's counts.
    pub fn label(&self) -> String {
        match &self.kind {
            Kind::WeReject { ours, .. } => format!("we reject ({})", plugin_of(ours)),
            Kind::WeAccept { theirs, .. } => format!("we accept ({})", plugin_of(theirs)),
            Kind::BestNode { plugins, .. } => format!(
                "best node ({})",
                plugins.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
            Kind::OurError { .. } => "our error".into(),
            Kind::ReferenceError { .. } => "reference error".into(),
        }
    }
}

/// The plugin a reason names ("Plugin: reason"), or the reason's first words.
pub fn plugin_of(reason: &str) -> String {
    match reason.split_once(": ") {
        Some((plugin, _)) if !plugin.contains(' ') => plugin.to_string(),
        _ => reason.chars().take(60).collect(),
    }
}

impl fmt::Display for Disagreement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pod {}: ", self.pod)?;
        match &self.kind {
            Kind::WeReject { node, ours } => write!(
                f,
                "kube-scheduler accepts node {node}; we reject it: {ours}"
            ),
            Kind::WeAccept { node, theirs } => write!(
                f,
                "we accept node {node}; kube-scheduler rejects it: {theirs}"
            ),
            Kind::BestNode {
                theirs,
                ours,
                their_scores,
                our_scores,
                plugins,
            } => {
                write!(
                    f,
                    "kube-scheduler's best node is {theirs}, ours {ours:?}\n    totals theirs {their_scores:?}\n    totals ours   {our_scores:?}"
                )?;
                for (plugin, nodes) in plugins {
                    write!(f, "\n    {plugin}:")?;
                    for (node, (t, o)) in nodes {
                        let show = |v: &Option<i64>| v.map_or("-".into(), |v| v.to_string());
                        write!(f, " {node} theirs {} ours {};", show(t), show(o))?;
                    }
                }
                Ok(())
            }
            Kind::OurError { error } => write!(f, "our engine failed: {error}"),
            Kind::ReferenceError { error } => write!(f, "the reference failed: {error}"),
        }
    }
}

/// The nodes with the highest total score.
fn best(scores: &BTreeMap<String, i64>) -> Vec<String> {
    let Some(max) = scores.values().max() else {
        return Vec::new();
    };
    scores
        .iter()
        .filter(|(_, s)| *s == max)
        .map(|(n, _)| n.clone())
        .collect()
}

/// How our verdict on one pod differs from kube-scheduler's: the same feasible nodes, and,
/// where kube-scheduler has a single best node among several feasible ones, the same best
/// node. Reasons and the exact scores are not compared, only reported.
pub fn compare(theirs: &Reference, ours: &Evaluation) -> Vec<Disagreement> {
    let pod = theirs.pod.clone();
    let one = |kind| {
        vec![Disagreement {
            pod: pod.clone(),
            kind,
        }]
    };
    if let Some(error) = &theirs.error {
        return one(Kind::ReferenceError {
            error: error.clone(),
        });
    }
    let their_feasible: BTreeSet<&String> = theirs.feasible.iter().flatten().collect();
    let our_feasible: BTreeSet<&String> = ours.feasible.iter().collect();
    // An error on our side is acceptable only where kube-scheduler's PreFilter rejected the
    // pod (our Evaluation reports a PreFilter rejection as its error) or nothing is feasible.
    if let Some(error) = &ours.error
        && !their_feasible.is_empty()
    {
        return one(Kind::OurError {
            error: error.clone(),
        });
    }
    let mut out = Vec::new();
    let no_reason = String::from("(no reason given)");
    for node in their_feasible.difference(&our_feasible) {
        out.push(Disagreement {
            pod: pod.clone(),
            kind: Kind::WeReject {
                node: (*node).clone(),
                ours: ours
                    .unfit
                    .get(*node)
                    .or(ours.error.as_ref())
                    .unwrap_or(&no_reason)
                    .clone(),
            },
        });
    }
    for node in our_feasible.difference(&their_feasible) {
        let theirs_reason = theirs
            .unfit
            .as_ref()
            .and_then(|u| u.get(*node))
            .or(theirs.pre_filter.as_ref())
            .unwrap_or(&no_reason);
        out.push(Disagreement {
            pod: pod.clone(),
            kind: Kind::WeAccept {
                node: (*node).clone(),
                theirs: theirs_reason.clone(),
            },
        });
    }
    if !out.is_empty() || their_feasible.len() < 2 {
        return out;
    }
    let their_scores = theirs.scores.clone().unwrap_or_default();
    let their_best = best(&their_scores);
    if their_best.len() != 1 {
        return out; // a tie: kube-scheduler picks at random among them
    }
    let our_best = best(&ours.scores);
    let exact = std::env::var_os("SCHED_CONFORMANCE_EXACT").is_some();
    if our_best != their_best || (exact && their_scores != ours.scores) {
        let mut plugins = ScoreDiffs::new();
        let empty = BTreeMap::new();
        let their_plugins = theirs.plugin_scores.clone().unwrap_or_default();
        let names: BTreeSet<&String> = their_plugins
            .keys()
            .chain(ours.plugin_scores.keys())
            .collect();
        for name in names {
            let t = their_plugins.get(name).unwrap_or(&empty);
            let o = ours.plugin_scores.get(name).unwrap_or(&empty);
            for node in &their_feasible {
                let (tv, ov) = (t.get(*node).copied(), o.get(*node).copied());
                // A plugin that scores 0 everywhere may be skipped on one side.
                if tv.unwrap_or(0) != ov.unwrap_or(0) {
                    plugins
                        .entry(name.clone())
                        .or_default()
                        .insert((*node).clone(), (tv, ov));
                }
            }
        }
        out.push(Disagreement {
            pod,
            kind: Kind::BestNode {
                theirs: their_best[0].clone(),
                ours: our_best,
                their_scores,
                our_scores: ours.scores.clone(),
                plugins,
            },
        });
    }
    out
}
