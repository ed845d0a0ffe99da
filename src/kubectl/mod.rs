//! `kubectl dra`, the kubectl plugin (the `kubectl-dra` binary): what the cluster's devices
//! are doing and why a pod does not fit, read through the user's kubeconfig; nothing is
//! written.
//!
//! Brief overview:
//! - [`live`] lists the cluster once (every kind the scheduler watches) and builds the
//!   engine's input from it, as `simulate --from-cluster` does.
//! - [`nodes`] and [`claims`] turn the engine's [`dra_engine::inventory::Inventory`] into
//!   rows: devices per node, driver, class and product; each claim's state, devices, node
//!   and consumers. [`table`] prints rows as kubectl does; JSON and YAML are the same rows
//!   serialised.
//! - [`why`] runs the engine for one pod on that state and names the devices behind each
//!   node's answer, then tries, each on a fork of the engine, what would make it fit:
//!   preemption as the daemon's PostFilter would do it, one selector or constraint dropped,
//!   devices added.
//!
//! Deciding and printing are separate from reading: everything but [`live`] works on an
//! [`dra_engine::Engine`] built in memory, which is how the tests build it.

pub mod claims;
#[cfg(test)]
mod fixtures;
pub mod live;
pub mod nodes;
pub mod table;
pub mod why;

use std::path::Path;

use dra_engine::EngineConfig;

/// The engine's configuration: the daemon's (`--config`, its YAML or a
/// KubeSchedulerConfiguration: profile, percentageOfNodesToScore, filter timeout,
/// preemption), else the default one.
pub fn engine_config(config: Option<&Path>) -> Result<EngineConfig, String> {
    let Some(path) = config else {
        return Ok(EngineConfig::default());
    };
    let c = crate::run::config::Config::resolve(crate::run::config::RunArgs {
        config: Some(path.to_path_buf()),
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    Ok(c.engine_config())
}
