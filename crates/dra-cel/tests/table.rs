//! Table-driven selector tests: every case of tests/data/selectors.json, whose expected
//! results are what Kubernetes' own implementation answers (the differential test keeps them
//! honest), evaluated with dra-cel.

mod common;

use common::{Outcome, environment, evaluate, table};
use dra_cel::{CelErrorKind, Quantity};

#[test]
fn table_has_enough_cases() {
    let t = table();
    assert!(t.cases.len() >= 150, "only {} cases", t.cases.len());
}

#[test]
fn every_selector_case_matches_kubernetes() {
    let t = table();
    let env = environment(&t);
    let mut failures = Vec::new();
    for case in &t.cases {
        let device = &t.devices[&case.device];
        let got = evaluate(&env, &case.expr, device);
        if case.divergence.is_some() {
            if !got.is_error() {
                failures.push(format!(
                    "{:?}: documented as unsupported (an error here), got {got:?}",
                    case.expr
                ));
            }
            continue;
        }
        let cost_limit = case
            .kubernetes_message
            .as_deref()
            .is_some_and(|m| m.contains("cost limit"));
        let ok = match (&case.result, case.error.as_deref(), &got) {
            (Some(want), _, Outcome::Result(b)) => want == b,
            (None, Some(kind), Outcome::Error(k, _)) => {
                // A type error Kubernetes finds while compiling must be found while compiling
                // here too; errors Kubernetes finds by folding constants may come at run time.
                // Kubernetes also validates constant arguments while compiling (a literal
                // format string, a literal timestamp); those checks run when evaluating here.
                let constant_check = [
                    "error during formatting",
                    "out of range",
                    "unexpected end of string",
                    "invalid timestamp",
                    "invalid duration",
                ];
                let static_error = case.kubernetes_message.as_deref().is_some_and(|m| {
                    (m.starts_with("compilation failed") || m.starts_with("must evaluate"))
                        && !constant_check.iter().any(|c| m.contains(c))
                });
                match (kind, static_error) {
                    // Kubernetes stops at run time what the static bound rejects up front.
                    ("runtime", _) if cost_limit => *k == CelErrorKind::Cost,
                    ("compile", true) => matches!(
                        k,
                        CelErrorKind::Compile | CelErrorKind::NotBool | CelErrorKind::Cost
                    ),
                    ("runtime", _) => matches!(k, CelErrorKind::Runtime | CelErrorKind::NotBool),
                    _ => true,
                }
            }
            _ => false,
        };
        if !ok {
            failures.push(format!(
                "{:?} on {}: want {:?}/{:?} ({:?}), got {got:?}",
                case.expr, case.device, case.result, case.error, case.kubernetes_message
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        t.cases.len(),
        failures.join("\n")
    );
}

#[test]
fn quantities_print_in_kubernetes_canonical_form() {
    let t = table();
    let mut failures = Vec::new();
    for q in &t.quantities {
        let got = q.input.parse::<Quantity>();
        match (&q.canonical, &got) {
            (Some(want), Ok(v)) if *want == v.to_string() => {}
            (None, Err(_)) if q.error => {}
            _ => failures.push(format!(
                "{:?}: want {:?}, got {:?}",
                q.input,
                q.canonical,
                got.map(|v| v.to_string())
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
