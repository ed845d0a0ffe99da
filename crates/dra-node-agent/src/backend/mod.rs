//! Discovery behind one trait: [`GpuBackend`], with an NVML backend for real nodes and a
//! fake backend driven by a YAML profile for development, tests and the simulator.

pub mod fake;
pub mod nvml;

use crate::config::Sharing;
use crate::device::Gpu;
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

    /// Whether preparing a MIG partition is supported (creating its GPU instance). When not,
    /// claims for partitions fail with a clear error instead of handing out the whole GPU.
    fn can_prepare_mig(&self) -> bool {
        true
    }
}
