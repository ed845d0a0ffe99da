//! Evaluation with cel-go's error semantics.
//!
//! In cel-go an error is a value: `cel.bind(b, 1/0 == 1, b || true)` is true, and so is
//! `[0, 1].exists(x, 1 / x == 1)`, because `||` and `&&` absorb an error when the other side
//! decides, and comprehensions carry an error in their accumulator until a later step decides.
//! The `cel` crate stops at the first error instead. This evaluator walks the control flow
//! itself — `&&`, `||`, `!`, `?:`, comprehensions (every macro and `cel.bind` expands to one)
//! and identifiers bound to an error — and hands every other subexpression to the `cel`
//! interpreter unchanged. A call whose arguments contain a comprehension is evaluated argument
//! by argument here and then dispatched by the interpreter on the values, so an error inside
//! the comprehension is decided here too.

use std::collections::HashSet;

use cel::common::ast::{
    CallExpr, EntryExpr, Expr, IdedExpr, ListExpr, MapEntryExpr, MapExpr, SelectExpr,
};
use cel::common::types::CelBool;
use cel::common::value::{CowVal, Val};
use cel::{Context, ExecutionError, Value};

type Owned<'v> = Box<dyn Val + 'v>;

/// The ids of the nodes whose subtree holds a comprehension.
pub(crate) fn comprehension_nodes(e: &IdedExpr, out: &mut HashSet<u64>) -> bool {
    let mut found = false;
    let mut visit = |x: &IdedExpr, out: &mut HashSet<u64>| {
        found |= comprehension_nodes(x, out);
    };
    match &e.expr {
        Expr::Comprehension(c) => {
            for x in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                visit(x, out);
            }
            found = true;
        }
        Expr::Call(call) => {
            if let Some(t) = &call.target {
                visit(t, out);
            }
            call.args.iter().for_each(|a| visit(a, out));
        }
        Expr::List(l) => l.elements.iter().for_each(|x| visit(x, out)),
        Expr::Map(m) => {
            for entry in &m.entries {
                if let EntryExpr::MapEntry(me) = &entry.expr {
                    visit(&me.key, out);
                    visit(&me.value, out);
                }
            }
        }
        Expr::Select(s) => visit(&s.operand, out),
        _ => {}
    }
    if found {
        out.insert(e.id);
    }
    found
}

/// Whether `name` occurs in `e` as an identifier.
fn mentions(e: &IdedExpr, name: &str) -> bool {
    match &e.expr {
        Expr::Ident(n) => n == name,
        Expr::Comprehension(c) => [
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ]
        .iter()
        .any(|x| mentions(x, name)),
        Expr::Call(call) => {
            call.target.as_deref().is_some_and(|t| mentions(t, name))
                || call.args.iter().any(|a| mentions(a, name))
        }
        Expr::List(l) => l.elements.iter().any(|x| mentions(x, name)),
        Expr::Map(m) => m.entries.iter().any(|entry| match &entry.expr {
            EntryExpr::MapEntry(me) => mentions(&me.key, name) || mentions(&me.value, name),
            _ => false,
        }),
        Expr::Select(s) => mentions(&s.operand, name),
        _ => false,
    }
}

fn ident(name: &str) -> IdedExpr {
    IdedExpr {
        id: 0,
        expr: Expr::Ident(name.to_string()),
    }
}

fn as_bool(v: &Result<Owned<'_>, ExecutionError>) -> Option<bool> {
    v.as_ref()
        .ok()
        .and_then(|v| v.downcast_ref::<CelBool>())
        .map(|b| *b.inner())
}

fn boolean<'v>(b: bool) -> Owned<'v> {
    Box::new(CelBool::from(b))
}

fn not_bool(f: &str, v: &dyn Val) -> ExecutionError {
    ExecutionError::no_such_overload(f, vec![v.get_type().name().to_owned()])
}

pub(crate) struct Evaluator<'s> {
    comprehensions: &'s HashSet<u64>,
    /// Names bound by the comprehensions being evaluated, innermost last: `Some` when the
    /// name is bound to an error, `None` when to a value (which the `Context` holds).
    scope: Vec<(&'s str, Option<ExecutionError>)>,
}

impl<'s> Evaluator<'s> {
    pub fn new(comprehensions: &'s HashSet<u64>) -> Self {
        Evaluator {
            comprehensions,
            scope: Vec::new(),
        }
    }

    fn error_names(&self) -> impl Iterator<Item = &'s str> + '_ {
        self.scope
            .iter()
            .enumerate()
            .filter_map(|(i, (name, err))| {
                // Only the innermost binding of a name counts.
                let shadowed = self.scope[i + 1..].iter().any(|(n, _)| n == name);
                (err.is_some() && !shadowed).then_some(*name)
            })
    }

    pub fn eval<'v>(
        &mut self,
        e: &'s IdedExpr,
        ctx: &Context<'_, 'v>,
    ) -> Result<Owned<'v>, ExecutionError> {
        match &e.expr {
            Expr::Ident(name) => {
                if let Some((_, Some(err))) = self.scope.iter().rev().find(|(n, _)| n == name) {
                    return Err(err.clone());
                }
                Value::resolve_val(e, ctx).map(CowVal::into_owned)
            }
            Expr::Comprehension(_) => self.comprehension(e, ctx),
            Expr::Call(call) if call.target.is_none() => {
                match (call.func_name.as_str(), call.args.as_slice()) {
                    ("_&&_", [a, b]) => self.logical(a, b, false, ctx),
                    ("_||_", [a, b]) => self.logical(a, b, true, ctx),
                    ("!_", [a]) => {
                        let v = self.eval(a, ctx)?;
                        match v.downcast_ref::<CelBool>() {
                            Some(b) => Ok(boolean(!*b.inner())),
                            None => Err(not_bool("!_", v.as_ref())),
                        }
                    }
                    ("@not_strictly_false", [a]) => {
                        let v = self.eval(a, ctx);
                        Ok(boolean(as_bool(&v).unwrap_or(true)))
                    }
                    ("_?_:_", [c, a, b]) => {
                        let v = self.eval(c, ctx)?;
                        match v.downcast_ref::<CelBool>() {
                            Some(t) if *t.inner() => self.eval(a, ctx),
                            Some(_) => self.eval(b, ctx),
                            None => Err(not_bool("_?_:_", v.as_ref())),
                        }
                    }
                    _ => self.other(e, ctx),
                }
            }
            _ => self.other(e, ctx),
        }
    }

    /// `a && b` (`or` false) or `a || b` (`or` true), as cel-go: the side that decides wins
    /// over an error on the other side.
    fn logical<'v>(
        &mut self,
        a: &'s IdedExpr,
        b: &'s IdedExpr,
        or: bool,
        ctx: &Context<'_, 'v>,
    ) -> Result<Owned<'v>, ExecutionError> {
        let f = if or { "_||_" } else { "_&&_" };
        let left = self.eval(a, ctx);
        if as_bool(&left) == Some(or) {
            return Ok(boolean(or));
        }
        let right = self.eval(b, ctx);
        if as_bool(&right) == Some(or) {
            return Ok(boolean(or));
        }
        match (as_bool(&left), as_bool(&right)) {
            (Some(_), Some(_)) => Ok(boolean(!or)),
            _ => Err(match (left, right) {
                (Err(e), _) | (_, Err(e)) => e,
                (Ok(l), Ok(r)) => {
                    let bad = if l.downcast_ref::<CelBool>().is_none() {
                        l
                    } else {
                        r
                    };
                    not_bool(f, bad.as_ref())
                }
            }),
        }
    }

    fn comprehension<'v>(
        &mut self,
        e: &'s IdedExpr,
        ctx: &Context<'_, 'v>,
    ) -> Result<Owned<'v>, ExecutionError> {
        let Expr::Comprehension(c) = &e.expr else {
            unreachable!("called on a comprehension")
        };
        let range = self.eval(&c.iter_range, ctx)?;
        let mut accu = self.eval(&c.accu_init, ctx);
        let iterable = range.as_iterable().ok_or_else(|| {
            ExecutionError::function_error(
                "comprehension",
                format!("cannot iterate over {}", range.get_type().name()),
            )
        })?;
        let mut items = iterable.iter();
        while let Some(item) = items.next() {
            let mut child = ctx.new_inner_scope();
            child.add_variable_as_val(c.iter_var.clone(), item.clone_as_boxed());
            let depth = self.scope.len();
            self.scope.push((c.iter_var.as_str(), None));
            self.bind(&mut child, &c.accu_var, &accu);
            let go_on = self.eval(&c.loop_cond, &child).and_then(|v| {
                v.downcast_ref::<CelBool>()
                    .map(|b| *b.inner())
                    .ok_or_else(|| not_bool("loop condition", v.as_ref()))
            });
            let go_on = match go_on {
                Ok(b) => b,
                Err(err) => {
                    self.scope.truncate(depth);
                    return Err(err);
                }
            };
            if !go_on {
                self.scope.truncate(depth);
                break;
            }
            accu = self.eval(&c.loop_step, &child);
            self.scope.truncate(depth);
        }
        let mut child = ctx.new_inner_scope();
        let depth = self.scope.len();
        self.bind(&mut child, &c.accu_var, &accu);
        let result = self.eval(&c.result, &child);
        self.scope.truncate(depth);
        result
    }

    fn bind<'v>(
        &mut self,
        child: &mut Context<'_, 'v>,
        name: &'s str,
        value: &Result<Owned<'v>, ExecutionError>,
    ) {
        match value {
            Ok(v) => {
                child.add_variable_as_val(name.to_string(), v.clone_as_boxed());
                self.scope.push((name, None));
            }
            Err(err) => self.scope.push((name, Some(err.clone()))),
        }
    }

    /// Any other node: the interpreter evaluates it, unless it holds a comprehension or refers
    /// to a name bound to an error; then its children are evaluated here and the node itself
    /// is applied to their values.
    fn other<'v>(
        &mut self,
        e: &'s IdedExpr,
        ctx: &Context<'_, 'v>,
    ) -> Result<Owned<'v>, ExecutionError> {
        let erroring: Vec<&'s str> = self.error_names().collect();
        if !self.comprehensions.contains(&e.id) {
            // Strict: a reference to an error-bound name makes the node that error.
            if let Some(name) = erroring.iter().find(|n| mentions(e, n)) {
                if let Some((_, Some(err))) = self.scope.iter().rev().find(|(n, _)| n == name) {
                    return Err(err.clone());
                }
            }
            return Value::resolve_val(e, ctx).map(CowVal::into_owned);
        }
        let mut child = ctx.new_inner_scope();
        let mut n = 0;
        let mut hole = |this: &mut Self,
                        x: &'s IdedExpr,
                        child: &mut Context<'_, 'v>|
         -> Result<IdedExpr, ExecutionError> {
            let v = this.eval(x, ctx)?;
            let name = format!("@arg{n}");
            n += 1;
            child.add_variable_as_val(name.clone(), v);
            Ok(ident(&name))
        };
        let node = match &e.expr {
            Expr::Call(call) => {
                let target = match &call.target {
                    Some(t) => Some(Box::new(hole(self, t, &mut child)?)),
                    None => None,
                };
                let mut args = Vec::with_capacity(call.args.len());
                for a in &call.args {
                    args.push(hole(self, a, &mut child)?);
                }
                Expr::Call(CallExpr {
                    func_name: call.func_name.clone(),
                    target,
                    args,
                })
            }
            Expr::Select(s) => Expr::Select(SelectExpr {
                operand: Box::new(hole(self, &s.operand, &mut child)?),
                field: s.field.clone(),
                test: s.test,
            }),
            Expr::List(l) => {
                let mut elements = Vec::with_capacity(l.elements.len());
                for x in &l.elements {
                    elements.push(hole(self, x, &mut child)?);
                }
                Expr::List(ListExpr::new_with_optionals(
                    elements,
                    l.optional_indices.clone(),
                ))
            }
            Expr::Map(m) => {
                let mut entries = Vec::with_capacity(m.entries.len());
                for entry in &m.entries {
                    let EntryExpr::MapEntry(me) = &entry.expr else {
                        return Value::resolve_val(e, ctx).map(CowVal::into_owned);
                    };
                    let key = hole(self, &me.key, &mut child)?;
                    let value = hole(self, &me.value, &mut child)?;
                    entries.push(cel::common::ast::IdedEntryExpr {
                        id: entry.id,
                        expr: EntryExpr::MapEntry(MapEntryExpr {
                            key,
                            value,
                            optional: me.optional,
                        }),
                    });
                }
                Expr::Map(MapExpr { entries })
            }
            _ => return Value::resolve_val(e, ctx).map(CowVal::into_owned),
        };
        let node = IdedExpr {
            id: e.id,
            expr: node,
        };
        Value::resolve_val(&node, &child).map(CowVal::into_owned)
    }
}
