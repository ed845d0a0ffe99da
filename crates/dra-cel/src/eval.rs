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

use cel::common::ast::LiteralValue;
use cel::common::ast::{
    CallExpr, EntryExpr, Expr, IdedExpr, ListExpr, MapEntryExpr, MapExpr, SelectExpr,
};
use cel::common::types::{CelBool, CelInt, CelOptional, CelString};
use cel::common::value::{CowVal, Val};
use std::sync::LazyLock;

use cel::{Context, ExecutionError, Value};

type Owned<'v> = Box<dyn Val + 'v>;

/// Marks, by node id, the nodes whose subtree holds a comprehension.
pub(crate) fn comprehension_nodes(e: &IdedExpr, out: &mut Vec<bool>) -> bool {
    let mut found = false;
    let mut visit = |x: &IdedExpr, out: &mut Vec<bool>| {
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
        let id = e.id as usize;
        if out.len() <= id {
            out.resize(id + 1, false);
        }
        out[id] = true;
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

static TRUE: LazyLock<CelBool> = LazyLock::new(|| CelBool::from(true));
static FALSE: LazyLock<CelBool> = LazyLock::new(|| CelBool::from(false));

/// A bool result without an allocation.
fn constant<'e, 'v>(b: bool) -> Cow<'e, 'v> {
    CowVal::Borrowed(if b { &*TRUE } else { &*FALSE })
}

fn not_bool(f: &str, v: &dyn Val) -> ExecutionError {
    ExecutionError::no_such_overload(f, vec![v.get_type().name().to_owned()])
}

pub(crate) struct Evaluator<'s, 'v> {
    /// The `device` variable, looked up here rather than through the interpreter's name
    /// resolution, which is built for qualified names and containers and costs far more.
    device: &'v (dyn Val + 'v),
    /// Indexed by node id: whether the node's subtree holds a comprehension.
    comprehensions: &'s [bool],
    /// Indexed by node id: the value of a constant call folded at compile time.
    constants: &'s [Option<Box<dyn Val>>],
    /// Names bound by the comprehensions being evaluated, innermost last: `Some` when the
    /// name is bound to an error, `None` when to a value (which the `Context` holds).
    scope: Vec<(&'s str, Option<ExecutionError>)>,
}

/// A value borrowed from the program or the context, or owned.
type Cow<'e, 'v> = CowVal<'e, 'v>;

fn owned<'e, 'v>(v: Owned<'v>) -> Cow<'e, 'v> {
    CowVal::Owned(v)
}

impl<'s, 'v> Evaluator<'s, 'v> {
    pub fn new(
        device: &'v (dyn Val + 'v),
        comprehensions: &'s [bool],
        constants: &'s [Option<Box<dyn Val>>],
    ) -> Self {
        Evaluator {
            device,
            comprehensions,
            constants,
            scope: Vec::new(),
        }
    }

    fn is_namespace(&self, e: &IdedExpr) -> bool {
        matches!(&e.expr, Expr::Ident(n)
            if matches!(n.as_str(), "optional" | "sets" | "lists" | "strings")
                && !self.scope.iter().any(|(bound, _)| bound == n))
    }

    fn holds_comprehension(&self, e: &IdedExpr) -> bool {
        self.comprehensions
            .get(e.id as usize)
            .copied()
            .unwrap_or(false)
    }

    fn error_bound(&self, name: &str) -> Option<&ExecutionError> {
        match self.scope.iter().rev().find(|(n, _)| *n == name) {
            Some((_, Some(err))) => Some(err),
            _ => None,
        }
    }

    /// The innermost binding of an error-bound name `e` refers to, if any.
    fn refers_to_error(&self, e: &IdedExpr) -> Option<ExecutionError> {
        if self.scope.iter().all(|(_, err)| err.is_none()) {
            return None;
        }
        self.scope
            .iter()
            .rev()
            .filter_map(|(name, err)| err.as_ref().map(|err| (name, err)))
            .find(|(name, _)| self.error_bound(name).is_some() && mentions(e, name))
            .map(|(_, err)| err.clone())
    }

    pub fn eval<'e>(
        &mut self,
        e: &'s IdedExpr,
        ctx: &'e Context<'_, 'v>,
    ) -> Result<Cow<'e, 'v>, ExecutionError>
    where
        's: 'e,
        'v: 'e,
    {
        match &e.expr {
            Expr::Literal(l) => Ok(l.to_val()),
            Expr::Ident(name) => {
                if let Some(err) = self.error_bound(name) {
                    return Err(err.clone());
                }
                if name == "device" && !self.scope.iter().any(|(n, _)| *n == "device") {
                    return Ok(CowVal::Borrowed(self.device));
                }
                Value::resolve_val(e, ctx)
            }
            Expr::Comprehension(_) => self.comprehension(e, ctx).map(owned),
            Expr::Call(_)
                if self
                    .constants
                    .get(e.id as usize)
                    .is_some_and(Option::is_some) =>
            {
                match &self.constants[e.id as usize] {
                    Some(v) => Ok(CowVal::Borrowed(v.as_ref())),
                    None => unreachable!("checked above"),
                }
            }
            Expr::Call(call)
                if call.target.is_some()
                    && call.args.len() <= 1
                    && !self.holds_comprehension(e) =>
            {
                self.member(e, call, ctx)
            }
            Expr::Select(sel) if !sel.test => {
                let operand = self.eval(&sel.operand, ctx)?;
                if is_plain_container(operand.as_ref()) {
                    let key = CelString::from(sel.field.as_str());
                    return index(operand, &key);
                }
                self.delegate(e, ctx)
            }
            Expr::Call(call) if call.target.is_none() => {
                match (call.func_name.as_str(), call.args.as_slice()) {
                    ("_&&_", [a, b]) => self.logical(a, b, false, ctx),
                    ("_||_", [a, b]) => self.logical(a, b, true, ctx),
                    ("!_", [a]) => {
                        let v = self.eval(a, ctx)?;
                        match v.downcast_ref::<CelBool>() {
                            Some(b) => Ok(constant(!*b.inner())),
                            None => Err(not_bool("!_", v.as_ref())),
                        }
                    }
                    ("@not_strictly_false", [a]) => {
                        let v = self.eval(a, ctx);
                        let b = v
                            .as_ref()
                            .ok()
                            .and_then(|v| v.downcast_ref::<CelBool>())
                            .map(|b| *b.inner());
                        Ok(constant(b.unwrap_or(true)))
                    }
                    ("_?_:_", [c, a, b]) => {
                        let v = self.eval(c, ctx)?;
                        match v.downcast_ref::<CelBool>() {
                            Some(t) if *t.inner() => self.eval(a, ctx),
                            Some(_) => self.eval(b, ctx),
                            None => Err(not_bool("_?_:_", v.as_ref())),
                        }
                    }
                    ("_[_]", [x, k])
                        if matches!(k.expr, Expr::Literal(LiteralValue::String(_))) =>
                    {
                        let operand = self.eval(x, ctx)?;
                        if is_plain_container(operand.as_ref()) {
                            let key = self.eval(k, ctx)?;
                            return index(operand, key.as_ref());
                        }
                        self.delegate(e, ctx)
                    }
                    (op @ ("_<_" | "_<=_" | "_>_" | "_>=_"), [a, b]) => {
                        let l = self.eval(a, ctx)?;
                        let r = self.eval(b, ctx)?;
                        let overload = || {
                            ExecutionError::no_such_overload(
                                op,
                                vec![
                                    l.get_type().name().to_owned(),
                                    r.get_type().name().to_owned(),
                                ],
                            )
                        };
                        let o = l
                            .as_comparer()
                            .ok_or_else(overload)?
                            .compare(r.as_ref())
                            .map_err(|_| overload())?;
                        let b = match op {
                            "_<_" => o.is_lt(),
                            "_<=_" => o.is_le(),
                            "_>_" => o.is_gt(),
                            _ => o.is_ge(),
                        };
                        Ok(constant(b))
                    }
                    // Kubernetes' `==` (see `library::k8s_eq`): the operands evaluated
                    // here, as `_==_`'s, not by the interpreter (device lookups are direct).
                    (crate::library::EQUALS, [a, b]) => {
                        let operands = [self.eval(a, ctx)?, self.eval(b, ctx)?];
                        crate::library::k8s_eq(&operands).map(constant)
                    }
                    (op @ ("_==_" | "_!=_"), [a, b]) => {
                        let l = self.eval(a, ctx)?;
                        let r = self.eval(b, ctx)?;
                        Ok(constant(l.as_ref().equals(r.as_ref()) == (op == "_==_")))
                    }
                    _ => self.other(e, ctx),
                }
            }
            _ => self.other(e, ctx),
        }
    }

    /// `a && b` (`or` false) or `a || b` (`or` true), as cel-go: the side that decides wins
    /// over an error on the other side.
    fn logical<'e>(
        &mut self,
        a: &'s IdedExpr,
        b: &'s IdedExpr,
        or: bool,
        ctx: &Context<'_, 'v>,
    ) -> Result<Cow<'e, 'v>, ExecutionError> {
        let f = if or { "_||_" } else { "_&&_" };
        // Ok(Ok(bool)), Ok(Err(type name)) for a non-bool, or the error.
        let side = |v: Cow<'_, 'v>| truth(v.as_ref()).ok_or_else(|| v.get_type().name().to_owned());
        let left = self.eval(a, ctx).map(side);
        if matches!(left, Ok(Ok(x)) if x == or) {
            return Ok(constant(or));
        }
        let right = self.eval(b, ctx).map(side);
        if matches!(right, Ok(Ok(x)) if x == or) {
            return Ok(constant(or));
        }
        match (left, right) {
            (Ok(Ok(_)), Ok(Ok(_))) => Ok(constant(!or)),
            (Err(e), _) | (_, Err(e)) => Err(e),
            (Ok(Err(t)), _) | (_, Ok(Err(t))) => Err(ExecutionError::no_such_overload(f, vec![t])),
        }
    }

    fn comprehension(
        &mut self,
        e: &'s IdedExpr,
        ctx: &Context<'_, 'v>,
    ) -> Result<Owned<'v>, ExecutionError> {
        let Expr::Comprehension(c) = &e.expr else {
            unreachable!("called on a comprehension")
        };
        let range = self.eval(&c.iter_range, ctx)?.into_owned();
        let mut accu = self.eval(&c.accu_init, ctx).map(CowVal::into_owned);
        let iterable = range.as_iterable().ok_or_else(|| {
            ExecutionError::function_error(
                "comprehension",
                format!("cannot iterate over {}", range.get_type().name()),
            )
        })?;
        let is_list = range.get_type().name() == "list";
        let mut items = iterable.iter();
        let mut position = 0i64;
        while let Some(item) = items.next() {
            let mut child = ctx.new_inner_scope();
            let depth = self.scope.len();
            match &c.iter_var2 {
                // Two variables: index and element of a list, key and value of a map.
                Some(second) => {
                    let (first, value): (Owned<'v>, Owned<'v>) = if is_list {
                        (Box::new(CelInt::from(position)), item.clone_as_boxed())
                    } else {
                        let value = range
                            .as_indexer()
                            .ok_or_else(|| {
                                ExecutionError::function_error("comprehension", "not a map")
                            })?
                            .get(item)?
                            .into_owned();
                        (item.clone_as_boxed(), value)
                    };
                    position += 1;
                    child.add_variable_as_val(c.iter_var.clone(), first);
                    child.add_variable_as_val(second.clone(), value);
                    self.scope.push((c.iter_var.as_str(), None));
                    self.scope.push((second.as_str(), None));
                }
                None => {
                    child.add_variable_as_val(c.iter_var.clone(), item.clone_as_boxed());
                    self.scope.push((c.iter_var.as_str(), None));
                }
            }
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
            accu = self.eval(&c.loop_step, &child).map(CowVal::into_owned);
            self.scope.truncate(depth);
        }
        let mut child = ctx.new_inner_scope();
        let depth = self.scope.len();
        self.bind(&mut child, &c.accu_var, &accu);
        let result = self.eval(&c.result, &child).map(CowVal::into_owned);
        self.scope.truncate(depth);
        result
    }

    fn bind(
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

    /// `x.f(y)`: quantity and version methods are called here directly; anything else goes
    /// to the interpreter.
    fn member<'e>(
        &mut self,
        e: &'s IdedExpr,
        call: &'s CallExpr,
        ctx: &'e Context<'_, 'v>,
    ) -> Result<Cow<'e, 'v>, ExecutionError>
    where
        's: 'e,
        'v: 'e,
    {
        let is_kubernetes = matches!(
            call.func_name.as_str(),
            "compareTo"
                | "isGreaterThan"
                | "isLessThan"
                | "add"
                | "sub"
                | "asInteger"
                | "isInteger"
                | "asApproximateFloat"
                | "major"
                | "minor"
                | "patch"
        );
        let Some(target) = call.target.as_deref().filter(|_| is_kubernetes) else {
            return self.delegate(e, ctx);
        };
        let recv = self.eval(target, ctx)?;
        let arg = match call.args.first() {
            Some(a) => Some(self.eval(a, ctx)?),
            None => None,
        };
        match crate::library::kubernetes_member(&call.func_name, recv.as_ref(), arg.as_deref()) {
            Some(f) => {
                let mut args = Vec::with_capacity(2);
                args.push(recv);
                args.extend(arg);
                f(args).map(|v| owned(v.into_owned()))
            }
            None => self.delegate(e, ctx),
        }
    }

    /// The interpreter evaluates `e`, unless `e` refers to a name bound to an error (then it
    /// is that error, as any strict function of an error is in cel-go).
    fn delegate<'e>(
        &mut self,
        e: &'s IdedExpr,
        ctx: &'e Context<'_, 'v>,
    ) -> Result<Cow<'e, 'v>, ExecutionError>
    where
        's: 'e,
        'v: 'e,
    {
        if let Some(err) = self.refers_to_error(e) {
            return Err(err);
        }
        Value::resolve_val(e, ctx)
    }

    /// Any other node: the interpreter evaluates it, unless it holds a comprehension; then
    /// its children are evaluated here and the node itself is applied to their values.
    fn other<'e>(
        &mut self,
        e: &'s IdedExpr,
        ctx: &'e Context<'_, 'v>,
    ) -> Result<Cow<'e, 'v>, ExecutionError>
    where
        's: 'e,
        'v: 'e,
    {
        if !self.holds_comprehension(e) {
            return self.delegate(e, ctx);
        }
        let mut child = ctx.new_inner_scope();
        let mut n = 0;
        let mut hole = |this: &mut Self,
                        x: &'s IdedExpr,
                        child: &mut Context<'_, 'v>|
         -> Result<IdedExpr, ExecutionError> {
            let v = this.eval(x, ctx)?.into_owned();
            let name = format!("@arg{n}");
            n += 1;
            child.add_variable_as_val(name.clone(), v);
            Ok(ident(&name))
        };
        let node = match &e.expr {
            Expr::Call(call) => {
                let target = match &call.target {
                    // `optional.of(…)`, `sets.contains(…)`: a namespace, not a value.
                    Some(t) if self.is_namespace(t) => Some(t.clone()),
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
                        return self.delegate(e, ctx);
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
            _ => return self.delegate(e, ctx),
        };
        let node = IdedExpr {
            id: e.id,
            expr: node,
        };
        Value::resolve_val(&node, &child).map(|v| owned(v.into_owned()))
    }
}

/// `Some(b)` for a bool.
fn truth(v: &dyn Val) -> Option<bool> {
    v.downcast_ref::<CelBool>().map(|b| *b.inner())
}

/// A map-like value (the device views, a map) that `.field` and `["key"]` index directly;
/// anything else (optionals, lists, messages) goes through the interpreter's own rules.
fn is_plain_container(v: &dyn Val) -> bool {
    v.as_indexer().is_some()
        && v.downcast_ref::<CelOptional>().is_none()
        && v.get_type().name() != "list"
}

fn index<'e, 'v>(operand: Cow<'e, 'v>, key: &dyn Val) -> Result<Cow<'e, 'v>, ExecutionError> {
    let no_indexer = || ExecutionError::no_such_overload("_[_]", vec![]);
    match operand {
        CowVal::Borrowed(v) => v.as_indexer().ok_or_else(no_indexer)?.get(key),
        CowVal::Owned(b) => {
            let v = b
                .as_indexer()
                .ok_or_else(no_indexer)?
                .get(key)?
                .into_owned();
            Ok(CowVal::Owned(v))
        }
    }
}
