//! The result of running a plugin at an extension point, as kube-scheduler's `fwk.Status`.

use std::sync::Arc;

/// What happened, as kube-scheduler's status codes (plus why a search stopped).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    Success,
    /// Something went wrong that is not the pod's fit: the attempt fails and backs off.
    Error,
    /// The pod does not fit; preempting pods might help.
    Unschedulable,
    /// The pod does not fit and preemption would not change that.
    UnschedulableAndUnresolvable,
    /// The plugin has nothing to do for this pod (PreFilter, PreScore).
    Skip,
    /// The device search ran out of the attempt's budget (`cancelled`: it was told to stop).
    Stopped {
        cancelled: bool,
    },
}

/// A code with the reasons, and the plugin that gave it. The reasons are shared: a status
/// is copied for every node that gives it (a kept device answer, the same fit error), and a
/// copy costs no allocation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Status {
    pub code: Code,
    pub reasons: Reasons,
    pub plugin: &'static str,
}

/// A status's reasons, shared between copies. None (every success, for every plugin on
/// every node) takes no allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Reasons(Option<Arc<[String]>>);

impl From<Vec<String>> for Reasons {
    fn from(reasons: Vec<String>) -> Self {
        Reasons((!reasons.is_empty()).then(|| reasons.into()))
    }
}

impl std::ops::Deref for Reasons {
    type Target = [String];

    fn deref(&self) -> &[String] {
        self.0.as_deref().unwrap_or(&[])
    }
}

impl Status {
    pub fn success() -> Status {
        Status::new(Code::Success, Vec::new())
    }

    pub fn skip() -> Status {
        Status::new(Code::Skip, Vec::new())
    }

    pub fn new(code: Code, reasons: Vec<String>) -> Status {
        Status {
            code,
            reasons: reasons.into(),
            plugin: "",
        }
    }

    pub fn unschedulable(reason: impl Into<String>) -> Status {
        Status::new(Code::Unschedulable, vec![reason.into()])
    }

    pub fn unresolvable(reason: impl Into<String>) -> Status {
        Status::new(Code::UnschedulableAndUnresolvable, vec![reason.into()])
    }

    pub fn error(message: impl Into<String>) -> Status {
        Status::new(Code::Error, vec![message.into()])
    }

    /// From a check that says `Err(reason)` when the pod does not fit.
    pub fn from_fit(fit: Result<(), String>, unresolvable: bool) -> Status {
        match fit {
            Ok(()) => Status::success(),
            Err(reason) if unresolvable => Status::unresolvable(reason),
            Err(reason) => Status::unschedulable(reason),
        }
    }

    pub fn is_success(&self) -> bool {
        self.code == Code::Success
    }

    pub fn is_skip(&self) -> bool {
        self.code == Code::Skip
    }

    pub fn is_rejection(&self) -> bool {
        matches!(
            self.code,
            Code::Unschedulable | Code::UnschedulableAndUnresolvable
        )
    }

    /// The reasons in one line.
    pub fn message(&self) -> String {
        self.reasons.join(", ")
    }

    pub fn with_plugin(mut self, plugin: &'static str) -> Status {
        self.plugin = plugin;
        self
    }
}
