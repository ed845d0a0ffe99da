//! Label selectors (`metav1.LabelSelector`) as apimachinery reads them: what a pod affinity
//! term or a topology spread constraint selects pods with, and a namespace selector
//! namespaces with.
//!
//! Two corner cases decide real outcomes and are kept exactly: no selector at all selects
//! nothing, and a selector with no requirements (`{}`) selects everything.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Labels of an object with none.
pub static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// The labels of an object's metadata (none when it has no `labels`).
pub fn labels_of(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> &BTreeMap<String, String> {
    meta.labels.as_ref().unwrap_or(&NO_LABELS)
}

/// A parsed selector (apimachinery's `labels.Selector`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selector {
    /// Selects nothing (a missing selector).
    Nothing,
    /// Selects what meets every requirement; none selects everything.
    All(Vec<Requirement>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operator {
    /// From `matchLabels`.
    Equals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl Requirement {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::Equals | Operator::In => value.is_some_and(|v| self.values.contains(v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }
}

impl Selector {
    pub fn everything() -> Selector {
        Selector::All(Vec::new())
    }

    /// `labels.Set.AsSelector()`: `key = value` for each label, not validated; no labels
    /// select everything.
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Selector {
        Selector::everything().and_labels(labels.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    /// `metav1.LabelSelectorAsSelector`: the first invalid requirement is the error.
    pub fn parse(selector: Option<&LabelSelector>) -> Result<Selector, String> {
        let Some(selector) = selector else {
            return Ok(Selector::Nothing);
        };
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            requirements.push(requirement(
                key,
                Operator::Equals,
                std::slice::from_ref(value),
            )?);
        }
        for expr in selector.match_expressions.iter().flatten() {
            let operator = match expr.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => return Err(format!("{other:?} is not a valid label selector operator")),
            };
            let values = expr.values.as_deref().unwrap_or_default();
            requirements.push(requirement(&expr.key, operator, values)?);
        }
        Ok(Selector::All(requirements))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Selector::Nothing => false,
            Selector::All(requirements) => requirements.iter().all(|r| r.matches(labels)),
        }
    }

    /// Selects everything (apimachinery's `Empty()`: no requirements; `Nothing` is not).
    pub fn is_everything(&self) -> bool {
        matches!(self, Selector::All(r) if r.is_empty())
    }

    /// This selector and `key = value` for each pair; `Nothing` stays `Nothing`.
    pub fn and_labels<'a>(self, pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Selector {
        match self {
            Selector::Nothing => Selector::Nothing,
            Selector::All(mut requirements) => {
                for (key, value) in pairs {
                    requirements.push(Requirement {
                        key: key.to_string(),
                        operator: Operator::Equals,
                        values: vec![value.to_string()],
                    });
                }
                Selector::All(requirements)
            }
        }
    }
}

/// `labels.NewRequirement`: a valid key, values as the operator needs them, valid values.
fn requirement(key: &str, operator: Operator, values: &[String]) -> Result<Requirement, String> {
    if let Err(e) = valid_key(key) {
        return Err(format!("key: Invalid value: {key:?}: {e}"));
    }
    match operator {
        Operator::In | Operator::NotIn if values.is_empty() => {
            return Err(
                "values: Invalid value: []: for 'in', 'notin' operators, values set can't be empty"
                    .into(),
            );
        }
        Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
            return Err(format!(
                "values: Invalid value: {values:?}: values set must be empty for exists and does not exist"
            ));
        }
        _ => {}
    }
    for (i, value) in values.iter().enumerate() {
        if let Err(e) = valid_value(value) {
            return Err(format!("values[{i}]: Invalid value: {value:?}: {e}"));
        }
    }
    Ok(Requirement {
        key: key.to_string(),
        operator,
        values: values.to_vec(),
    })
}

/// A qualified name: an optional DNS subdomain prefix and `/`, then a name of at most 63
/// characters, alphanumeric at both ends, with `-`, `_` and `.` inside.
fn valid_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        None => (None, key),
        Some((prefix, name)) => (Some(prefix), name),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Err("prefix part must be non-empty".into());
        }
        if !is_dns_subdomain(prefix) {
            return Err("prefix part must be a lowercase RFC 1123 subdomain".into());
        }
    }
    if name.is_empty() {
        return Err("name part must be non-empty".into());
    }
    if name.len() > 63 {
        return Err("name part must be no more than 63 characters".into());
    }
    if !is_name(name) {
        return Err("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character".into());
    }
    Ok(())
}

/// A label value: empty, or at most 63 characters of a name's kind.
fn valid_value(value: &str) -> Result<(), String> {
    if value.len() > 63 {
        return Err("must be no more than 63 characters".into());
    }
    if !value.is_empty() && !is_name(value) {
        return Err("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character".into());
    }
    Ok(())
}

fn is_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
                && (b[b.len() - 1].is_ascii_lowercase() || b[b.len() - 1].is_ascii_digit())
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: serde_json::Value) -> Result<Selector, String> {
        let selector: Option<LabelSelector> = serde_json::from_value(value).unwrap();
        Selector::parse(selector.as_ref())
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn no_selector_selects_nothing_and_an_empty_one_everything() {
        let none = parse(json!(null)).unwrap();
        assert!(!none.matches(&labels(&[])));
        assert!(!none.is_everything());
        let empty = parse(json!({})).unwrap();
        assert!(empty.matches(&labels(&[("app", "web")])));
        assert!(empty.is_everything());
    }

    #[test]
    fn requirements_are_all_met() {
        let s = parse(json!({"matchLabels": {"app": "web"}, "matchExpressions": [
            {"key": "tier", "operator": "NotIn", "values": ["db"]},
            {"key": "canary", "operator": "DoesNotExist"}]}))
        .unwrap();
        assert!(s.matches(&labels(&[("app", "web")])));
        assert!(s.matches(&labels(&[("app", "web"), ("tier", "front")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "db")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("canary", "")])));
        assert!(!s.matches(&labels(&[("app", "api")])));
    }

    #[test]
    fn invalid_selectors_are_refused_as_apimachinery_refuses_them() {
        assert!(parse(json!({"matchExpressions": [{"key": "a", "operator": "In"}]})).is_err());
        assert!(
            parse(
                json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]})
            )
            .is_err()
        );
        assert!(
            parse(json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}))
                .is_err()
        );
        assert!(parse(json!({"matchLabels": {"a b": "x"}})).is_err());
        assert!(parse(json!({"matchLabels": {"a": "-x"}})).is_err());
        assert!(parse(json!({"matchLabels": {"example.com/a": ""}})).is_ok());
    }
}
