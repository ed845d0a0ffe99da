//! Errors that fail the whole scheduling attempt for a pod (upstream semantics: the pod backs
//! off), as opposed to "does not fit on this node", which is an [`crate::Explanation`].

/// An error for the whole attempt. Every variant names the object at fault.
#[derive(Clone, Debug, thiserror::Error)]
pub enum AllocError {
    /// A request names a DeviceClass that does not exist.
    #[error("claim {claim}, request {request}: device class {class} not found")]
    MissingClass {
        claim: String,
        request: String,
        class: String,
    },
    /// A selector failed to compile or to evaluate.
    #[error("{context}: {source}")]
    Cel {
        context: String,
        #[source]
        source: dra_cel::CelError,
    },
    /// The claim cannot be handled as written (unsupported field, feature off, too many
    /// devices, empty constraint, ...).
    #[error("claim {claim}: {message}")]
    InvalidClaim { claim: String, message: String },
    /// A ResourceSlice cannot be interpreted (bad node selector, unparsable quantity).
    #[error("resource slice {slice}: {message}")]
    InvalidSlice { slice: String, message: String },
    /// An `All` request meets a pool that is being updated or is invalid.
    #[error(
        "claim {claim}, request {request}: asks for all devices, but resource pool {pool} is {why}"
    )]
    PoolNotReady {
        claim: String,
        request: String,
        pool: String,
        why: &'static str,
    },
    /// An `All` request cannot take one of its devices because a constraint forbids it.
    #[error(
        "claim {claim}, request {request}: cannot add device {device} because a claim constraint would not be satisfied"
    )]
    AllConstraint {
        claim: String,
        request: String,
        device: String,
    },
    /// The search ran past its deadline or was cancelled. Hitting this is a bug report: the
    /// pruning should keep every search short.
    #[error("allocation aborted after {steps} search steps{}: {why}", claim.as_ref().map(|c| format!(" in claim {c}")).unwrap_or_default())]
    Aborted {
        steps: u64,
        why: &'static str,
        /// The claim the search was in when it stopped.
        claim: Option<String>,
    },
}
