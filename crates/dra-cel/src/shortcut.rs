//! Selectors decided without the interpreter.
//!
//! Most selectors are a conjunction of string comparisons: a class's
//! `device.driver == "gpu.example.com"`, a request's
//! `device.attributes["gpu.example.com"].model == "A100"`. A [`Shortcut`] is such a selector
//! taken apart at compile time: each term names what it reads and the literal it compares
//! with. [`Shortcut::decide`] answers from the device data directly where the answer is
//! certain, and otherwise leaves the selector to the interpreter:
//!
//! * a term whose attribute holds a string (as the interpreter converts it: no list or
//!   other scalar set beside it) is string equality, exactly the interpreter's `==`;
//! * one such term that is false makes the whole selector false: in cel-go `false && x` is
//!   false whatever `x` is, an error included;
//! * a term whose attribute is missing or of another type (an error, or `false`, in cel-go)
//!   is not decided here: unless another term is false, the interpreter runs.

use cel::common::ast::{Expr, IdedExpr, LiteralValue};

use crate::DeviceRef;

/// What a term compares with its literal.
#[derive(Clone, Debug, PartialEq)]
enum Operand {
    Driver,
    /// `device.attributes[domain].id` (or `[domain][id]`).
    Attribute {
        domain: String,
        id: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
struct Term {
    operand: Operand,
    literal: String,
}

/// A selector that is a conjunction of string comparisons (see the module notes).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Shortcut(Box<[Term]>);

impl Shortcut {
    /// The shortcut for a compiled (checked and rewritten) program, if it has the shape.
    pub fn of(program: &IdedExpr) -> Option<Shortcut> {
        let mut terms = Vec::new();
        conjunction(program, &mut terms)?;
        Some(Shortcut(terms.into_boxed_slice()))
    }

    /// The selector's answer for `dev`, where this shortcut is certain of it.
    pub fn decide(&self, dev: DeviceRef<'_>) -> Option<bool> {
        let mut certain = true;
        for term in &self.0 {
            match term.value(dev) {
                Some(v) if v != term.literal => return Some(false),
                Some(_) => {}
                None => certain = false,
            }
        }
        certain.then_some(true)
    }
}

impl Term {
    /// The string the interpreter would compare, if it is one.
    fn value<'a>(&self, dev: DeviceRef<'a>) -> Option<&'a str> {
        match &self.operand {
            Operand::Driver => Some(dev.driver),
            Operand::Attribute { domain, id } => crate::device::string_attribute(dev, domain, id),
        }
    }
}

/// Pushes the terms of `e`, a tree of `&&` over comparisons; `None` if it is anything else.
fn conjunction(e: &IdedExpr, terms: &mut Vec<Term>) -> Option<()> {
    let Expr::Call(call) = &e.expr else {
        return None;
    };
    match (
        call.func_name.as_str(),
        call.target.as_ref(),
        call.args.as_slice(),
    ) {
        ("_&&_", None, [a, b]) => {
            conjunction(a, terms)?;
            conjunction(b, terms)
        }
        // `@k8s_equals` is `==` with a left operand that may be a quantity or a version (see
        // `library::k8s_eq`): on a string it is `==`.
        ("_==_" | crate::library::EQUALS, None, [a, b]) => {
            let (operand, literal) = match (operand(a), string(b)) {
                (Some(o), Some(l)) => (o, l),
                _ => (operand(b)?, string(a)?),
            };
            terms.push(Term {
                operand,
                literal: literal.to_string(),
            });
            Some(())
        }
        _ => None,
    }
}

fn string(e: &IdedExpr) -> Option<&str> {
    match &e.expr {
        Expr::Literal(LiteralValue::String(s)) => Some(s.inner()),
        _ => None,
    }
}

/// `device.driver`, or an attribute named by literals: `device.attributes["d"].id` or
/// `device.attributes["d"]["id"]`. Names with a `/` are left to the interpreter.
fn operand(e: &IdedExpr) -> Option<Operand> {
    if let Some(("device", "driver")) = field_of_ident(e) {
        return Some(Operand::Driver);
    }
    let (domain_map, id) = member(e)?;
    let (map, domain) = member(domain_map)?;
    if field_of_ident(map) != Some(("device", "attributes")) || domain.contains('/') {
        return None;
    }
    (!id.contains('/')).then(|| Operand::Attribute {
        domain: domain.to_string(),
        id: id.to_string(),
    })
}

/// `x.field` (not `has(x.field)`) or `x["field"]`: `(x, field)`.
fn member(e: &IdedExpr) -> Option<(&IdedExpr, &str)> {
    match &e.expr {
        Expr::Select(s) if !s.test => Some((&s.operand, &s.field)),
        Expr::Call(call) if call.func_name == "_[_]" && call.target.is_none() => {
            match call.args.as_slice() {
                [x, key] => Some((x, string(key)?)),
                _ => None,
            }
        }
        _ => None,
    }
}

/// `ident.field`: `(ident, field)`.
fn field_of_ident(e: &IdedExpr) -> Option<(&str, &str)> {
    match &e.expr {
        Expr::Select(s) if !s.test => match &s.operand.expr {
            Expr::Ident(name) => Some((name, &s.field)),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::resource::v1::DeviceAttribute;

    use crate::{DeviceRef, Environment, Options, Selector};

    fn compile(expression: &str) -> std::sync::Arc<Selector> {
        Environment::new(Options::default())
            .compile(expression)
            .unwrap_or_else(|e| panic!("{expression}: {e}"))
    }

    fn has_shortcut(expression: &str) -> bool {
        compile(expression).shortcut.is_some()
    }

    fn string(s: &str) -> DeviceAttribute {
        DeviceAttribute {
            string: Some(s.into()),
            ..Default::default()
        }
    }

    /// A GPU of driver `gpu.example.com`: model "A100" (unqualified), a qualified
    /// `numa.example.com/zone` "z0", an int `index` and a list `profiles`.
    fn gpu() -> Box<[(String, DeviceAttribute)]> {
        crate::sorted(Some(BTreeMap::from([
            ("model".to_string(), string("A100")),
            ("numa.example.com/zone".to_string(), string("z0")),
            (
                "index".to_string(),
                DeviceAttribute {
                    int: Some(3),
                    ..Default::default()
                },
            ),
            (
                "profiles".to_string(),
                DeviceAttribute {
                    strings: Some(vec!["A100".into()]),
                    string: Some("A100".into()),
                    ..Default::default()
                },
            ),
        ])))
    }

    fn device(attributes: &[(String, DeviceAttribute)]) -> DeviceRef<'_> {
        DeviceRef {
            driver: "gpu.example.com",
            attributes,
            capacity: &[],
            allow_multiple_allocations: false,
        }
    }

    #[test]
    fn conjunctions_of_string_comparisons_have_a_shortcut_and_nothing_else_does() {
        for yes in [
            r#"device.driver == "gpu.example.com""#,
            r#""gpu.example.com" == device.driver"#,
            r#"device.attributes["gpu.example.com"].model == "A100""#,
            r#"device.attributes["gpu.example.com"]["model"] == "A100""#,
            r#"device.driver == "gpu.example.com" && device.attributes["gpu.example.com"].model == "A100" && "z0" == device.attributes["numa.example.com"].zone"#,
        ] {
            assert!(has_shortcut(yes), "{yes}");
        }
        for no in [
            r#"device.driver != "gpu.example.com""#,
            r#"device.driver == "gpu.example.com" || device.attributes["gpu.example.com"].model == "A100""#,
            r#"has(device.attributes["gpu.example.com"].model)"#,
            r#"device.attributes["gpu.example.com"].index == 3"#,
            r#"device.attributes["gpu.example.com/model"].x == "A100""#,
            r#"device.attributes["gpu.example.com"]["x/model"] == "A100""#,
            r#"device.capacity["gpu.example.com"].memory == quantity("1Gi")"#,
            r#"!(device.driver == "gpu.example.com")"#,
            r#"device.attributes["gpu.example.com"].model.lowerAscii() == "a100""#,
        ] {
            assert!(!has_shortcut(no), "{no}");
        }
    }

    /// Each case: the expression, and the shortcut's answer on [`gpu`] (`None`: it leaves
    /// the device to the interpreter). Where it answers, the interpreter must agree.
    #[test]
    fn the_shortcut_answers_only_what_the_interpreter_answers_the_same() {
        let attributes = gpu();
        let dev = device(&attributes);
        let cases: [(&str, Option<bool>); 10] = [
            (r#"device.driver == "gpu.example.com""#, Some(true)),
            (r#"device.driver == "nic.example.com""#, Some(false)),
            (
                r#"device.attributes["gpu.example.com"].model == "A100""#,
                Some(true),
            ),
            (
                r#"device.attributes["gpu.example.com"]["model"] == "a100""#,
                Some(false),
            ),
            (
                r#"device.attributes["numa.example.com"].zone == "z0""#,
                Some(true),
            ),
            // Missing: "no such key" in cel-go, an error the shortcut does not make.
            (r#"device.attributes["gpu.example.com"].uuid == "x""#, None),
            (
                r#"device.attributes["other.example.com"].model == "A100""#,
                None,
            ),
            // An int, and a list read before the string: the interpreter decides.
            (r#"device.attributes["gpu.example.com"].index == "3""#, None),
            (
                r#"device.attributes["gpu.example.com"].profiles == "A100""#,
                None,
            ),
            // False on one side decides `&&`, whatever the other side is (an error here).
            (
                r#"device.attributes["gpu.example.com"].uuid == "x" && device.driver == "nic.example.com""#,
                Some(false),
            ),
        ];
        for (expression, want) in cases {
            let selector = compile(expression);
            let shortcut = selector.shortcut.as_ref().expect("the shape has one");
            assert_eq!(shortcut.decide(dev), want, "{expression}");
            let interpreted = selector.interpret(dev).ok();
            if let Some(answer) = want {
                assert_eq!(interpreted, Some(answer), "{expression}");
            }
            assert_eq!(selector.matches(dev).ok(), interpreted, "{expression}");
        }
    }
}
