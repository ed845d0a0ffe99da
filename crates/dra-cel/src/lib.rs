//! CONTRACT STUB — the public API other crates build against. The dra-cel work replaces the
//! bodies (and may add to the API) but keeps these names and signatures.

pub mod quantity;
pub use quantity::{Format as QuantityFormat, Quantity, QuantityError};

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};

/// Which optional parts of the Kubernetes environment are on.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// DRAListTypeAttributes (alpha in 1.37): list-valued attributes and `includes`.
    pub list_type_attributes: bool,
}

/// The device a selector is evaluated against, borrowed from a ResourceSlice.
#[derive(Clone, Copy, Debug)]
pub struct DeviceRef<'a> {
    /// The driver of the slice the device is in; also the domain of unqualified attributes.
    pub driver: &'a str,
    pub attributes: &'a BTreeMap<String, DeviceAttribute>,
    pub capacity: &'a BTreeMap<String, DeviceCapacity>,
    pub allow_multiple_allocations: bool,
}

/// What went wrong, by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CelErrorKind {
    Compile,
    Runtime,
    NotBool,
    Cost,
}

/// A typed CEL error that names the expression and, once the caller attaches it, the object.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct CelError {
    pub kind: CelErrorKind,
    pub expression: String,
    pub position: Option<usize>,
    pub message: String,
    pub context: Option<String>,
}

impl CelError {
    /// Attach where the expression came from, e.g. `DeviceClass gpu.nvidia.com`.
    pub fn with_context(mut self, context: impl Into<String>) -> Self {
        self.context = Some(context.into());
        self
    }
}

/// A compiled selector expression.
#[derive(Debug)]
pub struct Selector {
    expression: String,
}

impl Selector {
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// Evaluate against one device: `Ok(true)` when it selects the device.
    pub fn matches(&self, _device: DeviceRef<'_>) -> Result<bool, CelError> {
        Err(CelError {
            kind: CelErrorKind::Runtime,
            expression: self.expression.clone(),
            position: None,
            message: "dra-cel is not implemented yet".into(),
            context: None,
        })
    }
}

/// The environment: options plus a compiled-program cache keyed by expression.
/// `Send + Sync`; `compile` may be called from many threads.
#[derive(Debug, Default)]
pub struct Environment {
    _options: Options,
}

impl Environment {
    pub fn new(options: Options) -> Self {
        Self { _options: options }
    }

    pub fn compile(&self, expression: &str) -> Result<Arc<Selector>, CelError> {
        Ok(Arc::new(Selector {
            expression: expression.to_string(),
        }))
    }
}
