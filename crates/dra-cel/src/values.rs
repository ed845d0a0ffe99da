//! The two Kubernetes value types selectors use besides CEL's own: `kubernetes.Quantity` and
//! `kubernetes.Semver`, as `cel` values.

use std::any::Any;

use cel::common::types::Type;
use cel::common::value::{StaticVal, Val};

use crate::quantity::Quantity;
use crate::semver::Version;

pub(crate) static QUANTITY_TYPE: Type = Type::new_unspecified_type("kubernetes.Quantity");
pub(crate) static SEMVER_TYPE: Type = Type::new_unspecified_type("kubernetes.Semver");

/// A quantity as a CEL value. Equality is by value (`quantity("1Gi") == quantity("1024Mi")`);
/// there is no `<`: Kubernetes orders quantities only through `compareTo` and friends.
#[derive(Clone, Debug)]
pub(crate) struct QuantityVal(pub Quantity);

impl Val for QuantityVal {
    fn get_type(&self) -> &Type {
        &QUANTITY_TYPE
    }
    fn cel_type() -> &'static Type {
        &QUANTITY_TYPE
    }
    fn equals(&self, other: &dyn Val) -> bool {
        other
            .downcast_ref::<QuantityVal>()
            .is_some_and(|o| o.0 == self.0)
    }
    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}
impl StaticVal for QuantityVal {}

/// A semantic version as a CEL value; equality ignores build metadata, as blang/semver does.
#[derive(Clone, Debug)]
pub(crate) struct SemverVal(pub Version);

impl Val for SemverVal {
    fn get_type(&self) -> &Type {
        &SEMVER_TYPE
    }
    fn cel_type() -> &'static Type {
        &SEMVER_TYPE
    }
    fn equals(&self, other: &dyn Val) -> bool {
        other
            .downcast_ref::<SemverVal>()
            .is_some_and(|o| o.0 == self.0)
    }
    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}
impl StaticVal for SemverVal {}
