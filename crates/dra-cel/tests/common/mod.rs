//! The shared selector table (tests/data/selectors.json) and how to evaluate a case with
//! dra-cel. The same file feeds the Go reference program in the differential test.
#![allow(dead_code)]

use std::collections::BTreeMap;

use dra_cel::{CelErrorKind, DeviceRef, Environment, Options};
use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub driver: String,
    #[serde(default)]
    pub allow_multiple_allocations: bool,
    #[serde(default)]
    pub attributes: BTreeMap<String, DeviceAttribute>,
    #[serde(default)]
    pub capacity: BTreeMap<String, DeviceCapacity>,
}

impl Device {
    /// Evaluate `f` on the device in the form dra-cel reads (its maps as sorted slices).
    pub fn with_ref<R>(&self, f: impl FnOnce(DeviceRef<'_>) -> R) -> R {
        let attributes = dra_cel::sorted(Some(self.attributes.clone()));
        let capacity = dra_cel::sorted(Some(self.capacity.clone()));
        f(DeviceRef {
            driver: &self.driver,
            attributes: &attributes,
            capacity: &capacity,
            allow_multiple_allocations: self.allow_multiple_allocations,
        })
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Case {
    pub expr: String,
    pub device: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<bool>,
    /// "compile" or "runtime", as Kubernetes reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_message: Option<String>,
    /// A documented difference from Kubernetes: dra-cel answers with an error (an
    /// unsupported feature) where Kubernetes gives a result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub divergence: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct QuantityCase {
    pub input: String,
    #[serde(default)]
    pub canonical: Option<String>,
    #[serde(default)]
    pub error: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Table {
    pub list_type_attributes: bool,
    pub devices: BTreeMap<String, Device>,
    pub cases: Vec<Case>,
    pub quantities: Vec<QuantityCase>,
}

pub fn table() -> Table {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/selectors.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {path}: {e}"))
}

/// What an evaluation came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Result(bool),
    Error(CelErrorKind, String),
}

impl Outcome {
    pub fn is_error(&self) -> bool {
        matches!(self, Outcome::Error(..))
    }
}

pub fn evaluate(env: &Environment, expr: &str, device: &Device) -> Outcome {
    match env.compile(expr) {
        Err(e) => Outcome::Error(e.kind, e.message),
        Ok(selector) => match device.with_ref(|d| selector.matches(d)) {
            Ok(b) => Outcome::Result(b),
            Err(e) => Outcome::Error(e.kind, e.message),
        },
    }
}

pub fn environment(table: &Table) -> Environment {
    Environment::new(Options {
        list_type_attributes: table.list_type_attributes,
    })
}
