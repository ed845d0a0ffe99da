//! `dra-scheduler simulate`: schedule the pending pods of a set of manifests through the
//! same engine the daemon uses, with no cluster, and report where each pod would go and
//! which devices each claim would get.

pub mod expand;
pub mod limits;
pub mod manifests;
pub mod report;
pub mod validate;
mod yaml;

use std::collections::HashMap;
use std::path::PathBuf;

use dra_engine::{ClusterInput, Decision, Engine, EngineConfig, ObjectKey, Profile};

/// What to simulate and how to report it.
#[derive(Clone, Debug)]
pub struct Options {
    pub scheduler_name: String,
    pub all_schedulers: bool,
    /// The scheduling profile (the daemon's `--config` gives the same one).
    pub profile: Profile,
    pub percentage_of_nodes_to_score: u32,
    pub filter_timeout: std::time::Duration,
}

impl Default for Options {
    fn default() -> Self {
        let engine = EngineConfig::default();
        Options {
            scheduler_name: engine.scheduler_name,
            all_schedulers: false,
            profile: engine.profile,
            percentage_of_nodes_to_score: engine.percentage_of_nodes_to_score,
            filter_timeout: engine.filter_timeout,
        }
    }
}

/// Why the simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error(transparent)]
    Manifest(#[from] manifests::ManifestError),
}

/// The outcome for every pod and claim.
pub struct Simulation {
    pub engine: Engine,
    /// Every pod, in input order, with its decision if it was ours to schedule.
    pub pods: Vec<(ObjectKey, Option<Decision>)>,
    /// Claims, in input order (generated claims after the pod that made them).
    pub claim_order: Vec<ObjectKey>,
}

impl Simulation {
    pub fn pending(&self) -> usize {
        self.pods
            .iter()
            .filter(|(_, d)| matches!(d, Some(d) if d.node().is_none()))
            .count()
    }
}

pub fn load(paths: &[PathBuf]) -> Result<ClusterInput, SimulateError> {
    let manifests = manifests::load(paths)?;
    for ignored in &manifests.ignored {
        eprintln!(
            "note: {}: {} is not used by the simulation",
            ignored.source, ignored.object
        );
    }
    Ok(expand::expand(manifests)?)
}

/// Schedule every pending pod that is ours, in queue order, assuming each decision.
pub fn simulate(options: &Options, input: ClusterInput) -> Simulation {
    let pod_order: Vec<ObjectKey> = input
        .pods
        .iter()
        .map(|p| ObjectKey::of(&p.metadata))
        .collect();
    let claim_order: Vec<ObjectKey> = input
        .claims
        .iter()
        .map(|c| ObjectKey::of(&c.metadata))
        .collect();
    let position: HashMap<ObjectKey, usize> = pod_order
        .iter()
        .enumerate()
        .map(|(i, k)| (k.clone(), i))
        .collect();
    let config = EngineConfig {
        scheduler_name: options.scheduler_name.clone(),
        profile: options.profile.clone(),
        percentage_of_nodes_to_score: options.percentage_of_nodes_to_score,
        filter_timeout: options.filter_timeout,
        ..Default::default()
    };
    let mut engine = Engine::new(config, input);
    let queue = engine.pending_pods(
        &|k| position.get(k).copied().unwrap_or(usize::MAX),
        options.all_schedulers,
    );
    let mut decisions: HashMap<ObjectKey, Decision> = HashMap::new();
    let mut claim_order = claim_order;
    for key in queue {
        let decision = engine.schedule(&key);
        if let Decision::Scheduled(placement) = &decision {
            engine.assume(placement);
            for c in placement.claims.iter().filter(|c| c.create) {
                claim_order.push(c.key.clone());
            }
        }
        decisions.insert(key, decision);
    }
    let pods = pod_order
        .into_iter()
        .map(|k| {
            let d = decisions.remove(&k);
            (k, d)
        })
        .collect();
    Simulation {
        engine,
        pods,
        claim_order,
    }
}
