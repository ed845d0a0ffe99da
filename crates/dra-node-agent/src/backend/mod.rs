//! Discovery behind one trait: [`GpuBackend`], with an NVML backend for real nodes and a
//! fake backend driven by a YAML profile for development, tests and the simulator.

pub mod driver_root;
pub mod fake;
pub mod nvml;

use crate::config::Sharing;
use crate::device::{Gpu, MigInstance, MigProfile};
use crate::health::HealthEvent;
use tokio::sync::mpsc::UnboundedSender;

/// Errors of a backend; the message names what failed (a library, a file, a GPU).
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{library} could not be loaded: {reason}")]
    LibraryMissing { library: String, reason: String },
    #[error("NVML call {call} failed: {reason}")]
    Nvml { call: String, reason: String },
    #[error("fake profile {path}: {reason}")]
    Profile { path: String, reason: String },
    #[error("MIG on GPU {gpu}: {reason}")]
    Mig { gpu: u32, reason: String },
    #[error("setting sharing on GPU {gpu}: {reason}")]
    Sharing { gpu: String, reason: String },
}

/// Where GPUs come from. Implementations are synchronous (NVML is); callers run them on a
/// blocking thread when needed.
pub trait GpuBackend: Send + Sync + 'static {
    /// "nvml" or "fake", for logs.
    fn name(&self) -> &'static str;

    /// The GPUs present now. Called at start and again periodically, so GPUs can appear and
    /// vanish.
    fn discover(&self) -> Result<Vec<Gpu>, BackendError>;

    /// Starts delivering health events (XID, ECC, lost GPU) to `events`. Called once.
    fn watch_health(&self, events: UnboundedSender<HealthEvent>) -> Result<(), BackendError>;

    /// Applies a claim's sharing settings to a GPU.
    fn apply_sharing(&self, gpu: &Gpu, sharing: &Sharing) -> Result<(), BackendError>;

    /// Puts a GPU's sharing settings back to the default.
    fn reset_sharing(&self, gpu: &Gpu) -> Result<(), BackendError>;

    /// Creates the MIG partition a claim was allocated: a GPU instance of `profile` at
    /// memory slice `start` of `gpu`, with one compute instance filling it. A backend that
    /// cannot fails, so a claim for a partition never gets the whole GPU instead.
    fn create_mig(
        &self,
        gpu: &Gpu,
        profile: &MigProfile,
        start: u32,
    ) -> Result<MigInstance, BackendError> {
        let _ = (profile, start);
        Err(BackendError::Mig {
            gpu: gpu.minor,
            reason: format!("the {} backend cannot create MIG instances", self.name()),
        })
    }

    /// Destroys a partition made by [`GpuBackend::create_mig`]; one already gone is fine.
    fn destroy_mig(&self, gpu: &Gpu, instance: &MigInstance) -> Result<(), BackendError> {
        let _ = instance;
        Err(BackendError::Mig {
            gpu: gpu.minor,
            reason: format!("the {} backend cannot destroy MIG instances", self.name()),
        })
    }
}
