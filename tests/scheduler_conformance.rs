//! Differential conformance with kube-scheduler v1.37.2: random clusters and pending pods,
//! each pod decided by kube-scheduler's own framework (`tests/cluster/cmd/schedref`, built
//! from the Go module) and by our engine, on the unchanged cluster. They must agree on the
//! feasible nodes of every pod and, where kube-scheduler has a single best node among
//! several, on that node.
//!
//! One test per feature family (core, interpod, spread, volumes, images, dra, mixed, config), so that
//! plugins can land one family at a time: `cargo test --release --test scheduler_conformance
//! spread`. Deterministic: cases come from seeds. Knobs (environment):
//! - `SCHED_CONFORMANCE_CASES`: cases per family (default 1000);
//! - `SCHED_CONFORMANCE_SEED`: the first seed (default 1);
//! - `SCHED_CONFORMANCE_SHOW`: how many disagreements to print in full (default 5);
//! - `SCHED_CONFORMANCE_KIND`: print only disagreements whose kind contains this (as in the
//!   summary: "we reject (NodePorts)", "best node", "our error", ...);
//! - `SCHED_CONFORMANCE_EXACT=1`: also require every feasible node's total score to be
//!   kube-scheduler's (reported as a best-node disagreement);
//! - `SCHED_CONFORMANCE_ONLY=<family>:<seed>`: run one case and print it as JSON, a line
//!   `schedref` reads (`go run ./cmd/schedref < case.json` in tests/cluster).

#[path = "scheduler_conformance/compare.rs"]
mod compare;
#[path = "scheduler_conformance/generate.rs"]
mod generate;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use compare::{Disagreement, Kind, Reference, compare, run_ours, run_reference, schedref};
use dra_engine::{EngineConfig, Evaluation, Profile};
use generate::{Case, Family, generate};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One build of the reference for all tests of this binary.
fn reference_binary() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(schedref)
}

/// kube-scheduler's default profile on our side, without our own device scores.
fn upstream_config() -> EngineConfig {
    EngineConfig {
        profile: Profile::upstream(),
        ..EngineConfig::default()
    }
}

/// The cases of a family: `SCHED_CONFORMANCE_ONLY` picks one, else a run of seeds.
fn cases(family: Family) -> Vec<(u64, Case)> {
    if let Ok(only) = std::env::var("SCHED_CONFORMANCE_ONLY") {
        let (name, seed) = only
            .split_once(':')
            .expect("SCHED_CONFORMANCE_ONLY=<family>:<seed>");
        if name != family.name() {
            return Vec::new();
        }
        let seed: u64 = seed.parse().expect("a seed");
        let case = generate(family, seed);
        println!("{}", serde_json::to_string(&case).unwrap());
        return vec![(seed, case)];
    }
    let first = env_u64("SCHED_CONFORMANCE_SEED", 1);
    let count = env_u64("SCHED_CONFORMANCE_CASES", 1000);
    (first..first + count)
        .map(|s| (s, generate(family, s)))
        .collect()
}

/// What a run of one family found.
struct Report {
    family: Family,
    cases: usize,
    pods: usize,
    /// Pods infeasible on at least one node, per kube-scheduler (how much the cases bite).
    pods_with_unfit: usize,
    /// Pods with no feasible node at all.
    pods_unschedulable: usize,
    /// Pods with several feasible nodes and a single best one: where scores were compared.
    best_compared: usize,
    /// kube-scheduler's rejections of (pod, node) pairs, by plugin.
    rejections: BTreeMap<String, usize>,
    disagreements: Vec<(u64, Disagreement)>,
}

impl Report {
    fn print(&self) {
        let show = env_u64("SCHED_CONFORMANCE_SHOW", 5) as usize;
        println!(
            "scheduler conformance, {}: {} cases, {} pods ({} unfit somewhere, {} unschedulable, {} with a single best node), {} disagreements",
            self.family.name(),
            self.cases,
            self.pods,
            self.pods_with_unfit,
            self.pods_unschedulable,
            self.best_compared,
            self.disagreements.len()
        );
        println!(
            "  kube-scheduler's rejections by plugin: {:?}",
            self.rejections
        );
        let mut kinds: BTreeMap<String, (usize, u64)> = BTreeMap::new();
        for (seed, d) in &self.disagreements {
            kinds.entry(d.label()).or_insert((0, *seed)).0 += 1;
        }
        for (label, (count, seed)) in &kinds {
            println!(
                "  {count:5} × {label} (first in {}:{seed})",
                self.family.name()
            );
        }
        let only = std::env::var("SCHED_CONFORMANCE_KIND").unwrap_or_default();
        let shown = self
            .disagreements
            .iter()
            .filter(|(_, d)| d.label().contains(&only));
        for (seed, d) in shown.take(show) {
            println!("  [{}:{seed}] {d}", self.family.name());
        }
    }
}

fn run_family(family: Family, config: &EngineConfig) -> Report {
    run_cases(family, cases(family), config)
}

fn run_cases(family: Family, cases: Vec<(u64, Case)>, config: &EngineConfig) -> Report {
    let started = Instant::now();
    let answers = run_reference(
        reference_binary(),
        &cases.iter().map(|(_, c)| c.clone()).collect::<Vec<_>>(),
    );
    let reference_time = started.elapsed();
    let mut report = Report {
        family,
        cases: cases.len(),
        pods: 0,
        pods_with_unfit: 0,
        pods_unschedulable: 0,
        best_compared: 0,
        rejections: BTreeMap::new(),
        disagreements: Vec::new(),
    };
    let started = Instant::now();
    for ((seed, case), answer) in cases.iter().zip(&answers) {
        if let Some(error) = &answer.error {
            report.disagreements.push((
                *seed,
                Disagreement {
                    pod: "(whole case)".into(),
                    kind: Kind::ReferenceError {
                        error: error.clone(),
                    },
                },
            ));
            continue;
        }
        let theirs = answer.pods.clone().unwrap_or_default();
        assert_eq!(
            theirs.len(),
            case.pending.len(),
            "schedref answered every pod"
        );
        let ours = run_ours(config, case);
        for (t, o) in theirs.iter().zip(&ours) {
            report.pods += 1;
            if t.unfit.as_ref().is_some_and(|u| !u.is_empty()) {
                report.pods_with_unfit += 1;
            }
            let scores = t.scores.clone().unwrap_or_default();
            let max = scores.values().max();
            if scores.len() > 1 && scores.values().filter(|s| Some(*s) == max).count() == 1 {
                report.best_compared += 1;
            }
            for reason in t.unfit.iter().flat_map(|u| u.values()) {
                *report
                    .rejections
                    .entry(compare::plugin_of(reason))
                    .or_default() += 1;
            }
            if t.feasible.as_ref().is_none_or(|f| f.is_empty()) {
                report.pods_unschedulable += 1;
            }
            report
                .disagreements
                .extend(compare(t, o).into_iter().map(|d| (*seed, d)));
        }
    }
    println!(
        "scheduler conformance, {}: reference {:.1?}, ours {:.1?}",
        family.name(),
        reference_time,
        started.elapsed()
    );
    report
}

fn check(family: Family) {
    let report = run_family(family, &upstream_config());
    report.print();
    assert!(
        report.disagreements.is_empty(),
        "{} disagreements with kube-scheduler in family {} (see above)",
        report.disagreements.len(),
        family.name()
    );
}

#[test]
fn core_plugins_agree_with_kube_scheduler() {
    check(Family::Core);
}

#[test]
fn inter_pod_affinity_agrees_with_kube_scheduler() {
    check(Family::InterPod);
}

#[test]
fn topology_spread_agrees_with_kube_scheduler() {
    check(Family::Spread);
}

#[test]
fn volume_plugins_agree_with_kube_scheduler() {
    check(Family::Volumes);
}

#[test]
fn image_locality_agrees_with_kube_scheduler() {
    check(Family::Images);
}

#[test]
fn all_plugins_together_agree_with_kube_scheduler() {
    check(Family::Mixed);
}

#[test]
fn scheduler_configurations_agree_with_kube_scheduler() {
    check(Family::Config);
}

#[test]
fn dynamic_resources_agree_with_kube_scheduler() {
    check(Family::Dra);
}

/// kube-scheduler's verdict written as our engine's, i.e. a perfect engine.
fn as_evaluation(r: &Reference) -> Evaluation {
    Evaluation {
        feasible: r.feasible.clone().unwrap_or_default(),
        unfit: r.unfit.clone().unwrap_or_default(),
        scores: r.scores.clone().unwrap_or_default(),
        plugin_scores: r.plugin_scores.clone().unwrap_or_default(),
        error: r.pre_filter.clone().or(r.error.clone()),
    }
}

/// The harness can fail: the comparator finds a dropped feasible node, an added one and a
/// changed best node, and an engine with a rule switched off disagrees with kube-scheduler.
#[test]
fn the_harness_reports_a_broken_rule() {
    let cases: Vec<Case> = (1..=150).map(|s| generate(Family::Core, s)).collect();
    let answers = run_reference(reference_binary(), &cases);
    let pods: Vec<Reference> = answers
        .iter()
        .flat_map(|a| a.pods.clone().unwrap_or_default())
        .collect();
    for pod in &pods {
        assert!(
            compare(pod, &as_evaluation(pod)).is_empty(),
            "kube-scheduler agrees with itself on {}",
            pod.pod
        );
    }

    // A feasible node dropped.
    let pod = pods
        .iter()
        .find(|p| p.feasible.as_ref().is_some_and(|f| !f.is_empty()))
        .expect("some pod is feasible somewhere");
    let mut broken = as_evaluation(pod);
    let dropped = broken.feasible.remove(0);
    broken
        .unfit
        .insert(dropped.clone(), "broken on purpose".into());
    let found = compare(pod, &broken);
    assert!(
        found
            .iter()
            .any(|d| matches!(&d.kind, Kind::WeReject { node, .. } if *node == dropped)),
        "a dropped feasible node is reported: {found:?}"
    );

    // An infeasible node accepted.
    let pod = pods
        .iter()
        .find(|p| p.unfit.as_ref().is_some_and(|u| !u.is_empty()))
        .expect("some pod is unfit somewhere");
    let mut broken = as_evaluation(pod);
    let added = broken.unfit.keys().next().unwrap().clone();
    broken.unfit.remove(&added);
    broken.feasible.push(added.clone());
    broken.error = None;
    let found = compare(pod, &broken);
    assert!(
        found
            .iter()
            .any(|d| matches!(&d.kind, Kind::WeAccept { node, .. } if *node == added)),
        "an accepted infeasible node is reported: {found:?}"
    );

    // Another best node.
    let pod = pods
        .iter()
        .find(|p| {
            let scores = p.scores.clone().unwrap_or_default();
            let max = scores.values().max().copied();
            scores.len() > 1 && scores.values().filter(|s| Some(**s) == max).count() == 1
        })
        .expect("some pod has a single best node");
    let mut broken = as_evaluation(pod);
    let low = broken
        .scores
        .iter()
        .min_by_key(|(_, s)| **s)
        .map(|(n, _)| n.clone())
        .unwrap();
    *broken.scores.get_mut(&low).unwrap() += 10_000;
    let found = compare(pod, &broken);
    assert!(
        found
            .iter()
            .any(|d| matches!(&d.kind, Kind::BestNode { ours, .. } if *ours == vec![low.clone()])),
        "another best node is reported: {found:?}"
    );

    // Our engine with one plugin switched off disagrees with kube-scheduler in the
    // plugin's family: filters accept nodes they should not, scores pick other nodes.
    for (plugin, family) in [
        ("TaintToleration", Family::Core),
        ("NodeResourcesBalancedAllocation", Family::Core),
        ("InterPodAffinity", Family::InterPod),
        ("PodTopologySpread", Family::Spread),
        ("VolumeBinding", Family::Volumes),
        ("VolumeRestrictions", Family::Volumes),
        ("ImageLocality", Family::Images),
        ("DynamicResources", Family::Dra),
    ] {
        let mut config = upstream_config();
        config.profile.disable(plugin);
        let cases = (1..=200).map(|s| (s, generate(family, s))).collect();
        let report = run_cases(family, cases, &config);
        println!(
            "with {plugin} off: {} disagreements in family {}",
            report.disagreements.len(),
            family.name()
        );
        assert!(
            !report.disagreements.is_empty(),
            "with {plugin} off, the harness reports disagreements in family {}",
            family.name()
        );
    }
}
