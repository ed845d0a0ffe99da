//! Fuzzing with proptest: random token soup and random well-formed-ish selectors never panic
//! and never run long, whatever they are evaluated against.

mod common;

use std::time::{Duration, Instant};

use common::{Outcome, evaluate, table};
use dra_cel::{CelErrorKind, Environment, Options};
use proptest::prelude::*;

const TOKENS: &[&str] = &[
    "device",
    ".",
    "driver",
    "attributes",
    "capacity",
    "allowMultipleAllocations",
    "[",
    "]",
    "(",
    ")",
    "\"gpu.example.com\"",
    "\"memoryGiB\"",
    "memoryGiB",
    "model",
    "driverVersion",
    "memory",
    "==",
    "!=",
    "<",
    ">=",
    "&&",
    "||",
    "!",
    "?",
    ":",
    "+",
    "-",
    "*",
    "/",
    "%",
    "in",
    "1",
    "0",
    "-1",
    "2.5",
    "80u",
    "true",
    "false",
    "null",
    "'a'",
    "\"\"",
    ",",
    "{",
    "}",
    "has",
    "exists",
    "all",
    "map",
    "filter",
    "x",
    "cel.bind",
    "quantity",
    "semver",
    "isQuantity",
    "\"1Gi\"",
    "\"1.2.3\"",
    "compareTo",
    "isGreaterThan",
    "sign",
    "add",
    "sub",
    "asInteger",
    "lists.range",
    "(1000)",
    "sets.contains",
    "size",
    "matches",
    "\"(\"",
    "find",
    "findAll",
    "split",
    "join",
    "format",
    "replace",
    "?.",
    ".?",
    "orValue",
    "optional.of",
    "sortBy",
    "sort",
    "min",
    "max",
    "sum",
    "includes",
    "dyn",
    "int",
    "string",
    "type",
    "[1,2,3]",
    "{'a':1}",
    "\\",
    "'unterminated",
    "e3",
    "Gi",
];

fn soup() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(TOKENS), 0..40).prop_map(|t| t.join(" "))
}

fn check(env: &Environment, expr: &str) {
    let t = table();
    for device in t.devices.values() {
        let start = Instant::now();
        let got = evaluate(env, expr, device);
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{expr:?} took {:?}",
            start.elapsed()
        );
        if let Outcome::Error(kind, message) = &got {
            assert!(
                !message.contains("panicked"),
                "{expr:?} panicked inside: {message}"
            );
            assert!(matches!(
                kind,
                CelErrorKind::Compile
                    | CelErrorKind::Runtime
                    | CelErrorKind::NotBool
                    | CelErrorKind::Cost
            ));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

    #[test]
    fn token_soup_never_panics_or_hangs(expr in soup()) {
        let env = Environment::new(Options { list_type_attributes: true });
        check(&env, &expr);
    }

    #[test]
    fn arbitrary_strings_never_panic(expr in "\\PC{0,80}") {
        let env = Environment::new(Options::default());
        check(&env, &expr);
    }
}

#[test]
fn deep_nesting_is_rejected_not_a_stack_overflow() {
    let env = Environment::default();
    for depth in [50, 200, 2000] {
        let expr = format!("{}true{}", "(".repeat(depth), ")".repeat(depth));
        check(&env, &expr);
        let expr = format!("{}true{}", "!".repeat(depth), "");
        check(&env, &expr);
        let expr = vec!["1"; depth].join(" + ") + " > 0";
        check(&env, &expr);
        let expr = format!("{}[1]{}", "[".repeat(depth), "]".repeat(depth));
        check(&env, &format!("size({expr}) > 0"));
    }
}
