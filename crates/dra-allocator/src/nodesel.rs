//! Node selector matching with Kubernetes' `nodeaffinity` semantics: terms are ORed, the
//! requirements inside a term ANDed, an empty term matches nothing, `matchFields` knows only
//! `metadata.name`. A malformed selector is an error, never a silent "no".

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement};

/// Why a node selector could not be evaluated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid node selector: {0}")]
pub struct NodeSelectorError(pub String);

/// Whether `node` matches `selector`.
pub fn node_matches(node: &Node, selector: &NodeSelector) -> Result<bool, NodeSelectorError> {
    let mut any = false;
    for term in &selector.node_selector_terms {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        if exprs.is_empty() && fields.is_empty() {
            continue;
        }
        // Every requirement is validated even after a term already matched, like upstream
        // which parses the whole selector before matching.
        let mut ok = true;
        for r in exprs {
            let labels = node.metadata.labels.as_ref();
            let value = labels.and_then(|l| l.get(&r.key)).map(String::as_str);
            ok &= requirement_matches(r, value, true)?;
        }
        for r in fields {
            if r.key != "metadata.name" {
                return Err(NodeSelectorError(format!(
                    "unsupported field key {:?}",
                    r.key
                )));
            }
            let name = node.metadata.name.as_deref();
            ok &= requirement_matches(r, name, false)?;
        }
        any |= ok;
    }
    Ok(any)
}

fn requirement_matches(
    r: &NodeSelectorRequirement,
    value: Option<&str>,
    label: bool,
) -> Result<bool, NodeSelectorError> {
    let values = r.values.as_deref().unwrap_or_default();
    let bad =
        |why: &str| NodeSelectorError(format!("{} {} {:?}: {why}", r.key, r.operator, values));
    if !label && !matches!(r.operator.as_str(), "In" | "NotIn") {
        return Err(bad("field selectors support only In and NotIn"));
    }
    match r.operator.as_str() {
        "In" | "NotIn" => {
            if values.is_empty() {
                return Err(bad("needs values"));
            }
            if !label && values.len() != 1 {
                return Err(bad("a field requirement takes exactly one value"));
            }
            let found = value.is_some_and(|v| values.iter().any(|x| x == v));
            Ok(if r.operator == "In" { found } else { !found })
        }
        "Exists" | "DoesNotExist" => {
            if !values.is_empty() {
                return Err(bad("takes no values"));
            }
            Ok((r.operator == "Exists") == value.is_some())
        }
        "Gt" | "Lt" => {
            let [bound] = values else {
                return Err(bad("takes exactly one value"));
            };
            let bound: i64 = bound.parse().map_err(|_| bad("value is not an integer"))?;
            let Some(v) = value.and_then(|v| v.parse::<i64>().ok()) else {
                return Ok(false);
            };
            Ok(if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            })
        }
        _ => Err(bad("unknown operator")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSelectorTerm;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str, labels: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|s| s.to_string()).collect()),
        }
    }

    fn sel(
        terms: Vec<(Vec<NodeSelectorRequirement>, Vec<NodeSelectorRequirement>)>,
    ) -> NodeSelector {
        NodeSelector {
            node_selector_terms: terms
                .into_iter()
                .map(|(e, f)| NodeSelectorTerm {
                    match_expressions: Some(e),
                    match_fields: Some(f),
                })
                .collect(),
        }
    }

    #[test]
    fn operators() {
        let n = node("n1", &[("zone", "a"), ("gpus", "8")]);
        let m = |r| node_matches(&n, &sel(vec![(vec![r], vec![])])).unwrap();
        assert!(m(req("zone", "In", &["a", "b"])));
        assert!(!m(req("zone", "NotIn", &["a"])));
        assert!(
            m(req("rack", "NotIn", &["a"])),
            "NotIn matches a missing label"
        );
        assert!(m(req("zone", "Exists", &[])));
        assert!(m(req("rack", "DoesNotExist", &[])));
        assert!(m(req("gpus", "Gt", &["4"])));
        assert!(!m(req("gpus", "Lt", &["4"])));
        assert!(
            !m(req("zone", "Gt", &["4"])),
            "non-numeric label never matches Gt"
        );
    }

    #[test]
    fn terms_or_fields_and_errors() {
        let n = node("n1", &[("zone", "a")]);
        let s = sel(vec![
            (vec![req("zone", "In", &["b"])], vec![]),
            (vec![], vec![req("metadata.name", "In", &["n1"])]),
        ]);
        assert!(node_matches(&n, &s).unwrap());
        assert!(
            !node_matches(&n, &sel(vec![(vec![], vec![])])).unwrap(),
            "empty term"
        );
        let bad = sel(vec![(vec![req("zone", "Foo", &["a"])], vec![])]);
        assert!(node_matches(&n, &bad).is_err());
        let bad_field = sel(vec![(vec![], vec![req("metadata.uid", "In", &["x"])])]);
        assert!(node_matches(&n, &bad_field).is_err());
    }
}
