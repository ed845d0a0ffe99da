//! The `dra-scheduler` binary's library: `run` (the live scheduler), `simulate`
//! (manifests in, report out), `kubectl` (the `kubectl-dra` plugin) and the
//! fleet generator used by the 500-node example and the benchmarks. The decisions
//! themselves live in `dra-engine`.

pub mod fleet;
pub mod kubectl;
pub mod run;
pub mod simulate;
