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

/// A derived attribute's value as the API's `DeviceAttribute`: a string, int, bool or
/// semver, or a list of one of them (an empty list is an empty string list), as
/// Kubernetes converts it.
pub(crate) fn to_attribute(
    v: &dyn cel::common::value::Val,
) -> Result<k8s_openapi::api::resource::v1::DeviceAttribute, String> {
    use cel::common::types::{CelBool, CelInt, CelString};
    use k8s_openapi::api::resource::v1::DeviceAttribute;
    if let Some(b) = v.downcast_ref::<CelBool>() {
        return Ok(DeviceAttribute {
            bool: Some(*b.inner()),
            ..Default::default()
        });
    }
    if let Some(i) = v.downcast_ref::<CelInt>() {
        return Ok(DeviceAttribute {
            int: Some(*i.inner()),
            ..Default::default()
        });
    }
    if let Some(s) = v.downcast_ref::<CelString>() {
        return Ok(DeviceAttribute {
            string: Some(s.inner().to_string()),
            ..Default::default()
        });
    }
    if let Some(s) = v.downcast_ref::<SemverVal>() {
        return Ok(DeviceAttribute {
            version: Some(s.0.to_string()),
            ..Default::default()
        });
    }
    let Some(iterable) = v.as_iterable() else {
        return Err(format!(
            "unsupported derived attribute type {}",
            v.get_type().name()
        ));
    };
    let mut items = Vec::new();
    let mut iter = iterable.iter();
    while let Some(x) = iter.next() {
        items.push(x);
    }
    let Some(first) = items.first() else {
        return Ok(DeviceAttribute {
            strings: Some(Vec::new()),
            ..Default::default()
        });
    };
    let wrong = |i: usize, want: &str, x: &dyn cel::common::value::Val| {
        format!(
            "expected list element at index {i} to be {want}, got {}",
            x.get_type().name()
        )
    };
    macro_rules! list {
        ($ty:ty, $want:expr, $get:expr, $field:ident) => {{
            let mut out = Vec::with_capacity(items.len());
            for (i, x) in items.iter().enumerate() {
                let Some(v) = x.downcast_ref::<$ty>() else {
                    return Err(wrong(i, $want, *x));
                };
                out.push($get(v));
            }
            Ok(DeviceAttribute {
                $field: Some(out),
                ..Default::default()
            })
        }};
    }
    if first.downcast_ref::<CelBool>().is_some() {
        list!(CelBool, "bool", |v: &CelBool| *v.inner(), bools)
    } else if first.downcast_ref::<CelInt>().is_some() {
        list!(CelInt, "int", |v: &CelInt| *v.inner(), ints)
    } else if first.downcast_ref::<CelString>().is_some() {
        list!(
            CelString,
            "string",
            |v: &CelString| v.inner().to_string(),
            strings
        )
    } else if first.downcast_ref::<SemverVal>().is_some() {
        list!(
            SemverVal,
            "semver",
            |v: &SemverVal| v.0.to_string(),
            versions
        )
    } else {
        Err(format!(
            "unsupported list element type {} in derived attribute",
            first.get_type().name()
        ))
    }
}
