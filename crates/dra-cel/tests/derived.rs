//! Derived attributes (DRADerivedAttributes): expressions that yield an attribute value
//! rather than a verdict, as Kubernetes 1.37 compiles and converts them.

use std::collections::BTreeMap;

use dra_cel::{CelErrorKind, DeviceRef, Environment};
use k8s_openapi::api::resource::v1::DeviceAttribute;

fn attributes() -> BTreeMap<String, DeviceAttribute> {
    let mut a = BTreeMap::new();
    a.insert(
        "model".to_string(),
        DeviceAttribute {
            string: Some("a100".into()),
            ..Default::default()
        },
    );
    a.insert(
        "numa".to_string(),
        DeviceAttribute {
            int: Some(1),
            ..Default::default()
        },
    );
    a
}

fn eval(expression: &str) -> Result<DeviceAttribute, dra_cel::CelError> {
    let env = Environment::default();
    let attrs = attributes();
    let attrs = dra_cel::sorted(Some(attrs));
    let device = DeviceRef {
        driver: "gpu.example.com",
        attributes: &attrs,
        capacity: &[],
        allow_multiple_allocations: false,
    };
    env.compile_derived(expression)?.attribute(device)
}

#[test]
fn scalars_and_lists_become_attributes() {
    let a = eval(r#"device.attributes["gpu.example.com"].numa * 2"#).unwrap();
    assert_eq!(a.int, Some(2));
    let a = eval(r#"device.attributes["gpu.example.com"].model + "-x""#).unwrap();
    assert_eq!(a.string.as_deref(), Some("a100-x"));
    assert_eq!(eval("true").unwrap().bool, Some(true));
    assert_eq!(
        eval(r#"semver("1.2.3")"#).unwrap().version.as_deref(),
        Some("1.2.3")
    );
    assert_eq!(eval("[1, 2]").unwrap().ints, Some(vec![1, 2]));
    assert_eq!(eval("[]").unwrap().strings, Some(vec![]));
}

#[test]
fn a_selector_and_a_derived_attribute_of_one_text_are_compiled_apart() {
    let env = Environment::default();
    assert!(env.compile_derived("42").is_ok());
    let selector = env.compile("42").unwrap_err();
    assert_eq!(selector.kind, CelErrorKind::NotBool);
    assert!(env.compile_derived("42").is_ok());
}

#[test]
fn a_map_is_no_attribute_and_a_missing_key_fails_at_run_time() {
    let err = eval(r#"{"a": 1}"#).unwrap_err();
    assert!(
        err.to_string()
            .contains("must evaluate to a primitive scalar"),
        "{err}"
    );
    let err = eval(r#"device.attributes["gpu.example.com"].missing"#).unwrap_err();
    assert_eq!(err.kind, CelErrorKind::Runtime);
    assert!(err.to_string().contains("no such key: missing"), "{err}");
}
