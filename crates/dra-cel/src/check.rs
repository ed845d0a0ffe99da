//! Compile-time checks the `cel` crate does not do: the subset of cel-go's type checker that
//! decides whether Kubernetes accepts a selector, and the static cost bound.
//!
//! Kubernetes type-checks a selector before running it: `1 == 1.0`, `'a' == 1`,
//! `quantity('1') < quantity('2')`, `device.foo`, an unknown function or a result that is
//! statically not a bool are compile errors there, even in a branch that never runs. The `cel`
//! crate is dynamically typed, so this pass infers static types where they are known (literals,
//! the `device` fields, the libraries' result types) and rejects the same mismatches. Values
//! read from attributes are `dyn`, as in Kubernetes, and checked at run time.
//!
//! The cost bound is a static worst-case estimate in the spirit of cel-go's estimator: every
//! node costs one unit, operations on strings and lists cost their size, and a comprehension
//! costs its range's size times its body. Sizes come from literals, from Kubernetes' limits on
//! device data (32 attributes per device, 64-character strings, 48 list values) and from how
//! each function grows its input; a size this pass cannot bound counts as [`UNKNOWN_SIZE`].
//! An expression whose estimate exceeds [`MAX_COST`] is rejected at compile time, so evaluation
//! never needs to be interrupted.

use cel::common::ast::{Expr, IdedExpr, LiteralValue, operators};

/// Kubernetes' CELSelectorExpressionMaxCost.
pub const MAX_COST: u64 = 1_000_000;
/// The size assumed for a string or list whose size this pass cannot bound.
pub const UNKNOWN_SIZE: u64 = 1024;
const DEVICE_MAP_ENTRIES: u64 = 32;
const ATTRIBUTE_VALUE_SIZE: u64 = 64;
const DRIVER_NAME_SIZE: u64 = 63;

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Ty {
    Dyn,
    Null,
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Quantity,
    Semver,
    Device,
    Type,
    Duration,
    Timestamp,
    List(Box<Ty>),
    Map(Box<Ty>, Box<Ty>),
    Opt(Box<Ty>),
}

impl Ty {
    fn name(&self) -> String {
        match self {
            Ty::Dyn => "dyn".into(),
            Ty::Null => "null_type".into(),
            Ty::Bool => "bool".into(),
            Ty::Int => "int".into(),
            Ty::Uint => "uint".into(),
            Ty::Double => "double".into(),
            Ty::String => "string".into(),
            Ty::Bytes => "bytes".into(),
            Ty::Quantity => "kubernetes.Quantity".into(),
            Ty::Semver => "kubernetes.Semver".into(),
            Ty::Device => "kubernetes.DRADevice".into(),
            Ty::Type => "type".into(),
            Ty::Duration => "google.protobuf.Duration".into(),
            Ty::Timestamp => "google.protobuf.Timestamp".into(),
            Ty::List(e) => format!("list({})", e.name()),
            Ty::Map(k, v) => format!("map({}, {})", k.name(), v.name()),
            Ty::Opt(e) => format!("optional_type({})", e.name()),
        }
    }
    fn numeric(&self) -> bool {
        matches!(self, Ty::Int | Ty::Uint | Ty::Double)
    }
    fn known(&self) -> bool {
        *self != Ty::Dyn
    }
    fn elem(&self) -> Ty {
        match self {
            Ty::List(e) => (**e).clone(),
            _ => Ty::Dyn,
        }
    }
}

/// Whether values of the two types may be compared with `==`.
fn compatible(a: &Ty, b: &Ty) -> bool {
    match (a, b) {
        (Ty::Dyn, _) | (_, Ty::Dyn) | (Ty::Null, _) | (_, Ty::Null) => true,
        (Ty::List(x), Ty::List(y)) => compatible(x, y),
        (Ty::Map(k1, v1), Ty::Map(k2, v2)) => compatible(k1, k2) && compatible(v1, v2),
        (Ty::Opt(x), Ty::Opt(y)) => compatible(x, y),
        _ => a == b,
    }
}

/// The estimate for one node.
#[derive(Clone, Debug)]
pub(crate) struct Est {
    pub ty: Ty,
    pub cost: u64,
    /// Upper bound of the length (string, bytes) or number of elements (list, map).
    pub size: u64,
    /// Upper bound of the size of each element.
    pub inner: u64,
}

impl Est {
    fn new(ty: Ty, cost: u64) -> Est {
        Est {
            ty,
            cost,
            size: 1,
            inner: 1,
        }
    }
    fn sized(ty: Ty, cost: u64, size: u64, inner: u64) -> Est {
        Est {
            ty,
            cost,
            size,
            inner,
        }
    }
}

/// A compile-time rejection: the message and the AST node it is about.
pub(crate) struct Reject {
    pub message: String,
    pub node: u64,
    pub cost: bool,
}

fn reject<T>(node: u64, message: impl Into<String>) -> Result<T, Reject> {
    Err(Reject {
        message: message.into(),
        node,
        cost: false,
    })
}

fn overload_error<T>(node: u64, f: &str, args: &[&Ty]) -> Result<T, Reject> {
    let names: Vec<String> = args.iter().map(|t| t.name()).collect();
    reject(
        node,
        format!(
            "found no matching overload for '{f}' applied to '({})'",
            names.join(", ")
        ),
    )
}

const GLOBALS: &[&str] = &[
    "size",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "bool",
    "dyn",
    "type",
    "duration",
    "timestamp",
    "matches",
    "quantity",
    "sign",
    "isQuantity",
    "semver",
    "isSemver",
    "sets.contains",
    "sets.equivalent",
    "sets.intersects",
    "lists.range",
    "strings.quote",
    "optional.of",
    "optional.none",
    "optional.ofNonZeroValue",
];

const TYPE_NAMES: &[&str] = &[
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "bool",
    "list",
    "map",
    "null_type",
    "type",
    "dyn",
];

/// Receiver kinds each member function accepts.
fn member_receivers(f: &str) -> Option<&'static [&'static str]> {
    Some(match f {
        "contains" | "startsWith" | "endsWith" | "matches" | "charAt" | "lowerAscii"
        | "upperAscii" | "replace" | "split" | "substring" | "trim" | "format" | "find"
        | "findAll" => &["string"],
        "indexOf" | "lastIndexOf" => &["string", "list"],
        "size" => &["string", "bytes", "list", "map"],
        "join" | "isSorted" | "sum" | "min" | "max" | "slice" | "flatten" | "distinct"
        | "reverse" | "sort" | "first" | "last" => &["list"],
        "compareTo" | "isGreaterThan" | "isLessThan" => &["quantity", "semver"],
        "add" | "sub" | "asInteger" | "isInteger" | "asApproximateFloat" => &["quantity"],
        // The lists extension's expansion of `sortBy`.
        "@sortByAssociatedKeys" => &["list"],
        "major" | "minor" | "patch" => &["semver"],
        "hasValue" | "value" | "orValue" | "or" => &["optional"],
        "includes" => &["any"],
        "getFullYear" | "getMonth" | "getDayOfYear" | "getDayOfMonth" | "getDate"
        | "getDayOfWeek" | "getHours" | "getMinutes" | "getSeconds" | "getMilliseconds" => {
            &["timestamp", "duration"]
        }
        _ => return None,
    })
}

fn kind(t: &Ty) -> &'static str {
    match t {
        Ty::String => "string",
        Ty::Bytes => "bytes",
        Ty::List(_) => "list",
        Ty::Map(..) => "map",
        Ty::Quantity => "quantity",
        Ty::Semver => "semver",
        Ty::Opt(_) => "optional",
        Ty::Timestamp => "timestamp",
        Ty::Duration => "duration",
        _ => "other",
    }
}

struct Var {
    name: String,
    est: Est,
}

pub(crate) struct Checker {
    scope: Vec<Var>,
    /// `string(x)` calls with `x` possibly a double, and every `format` call: rendered as
    /// cel-go does by `library::STRING`/`library::FORMAT`.
    pub k8s_rendering: Vec<u64>,
    /// `==` calls whose left operand may be a quantity or a version at run time: they
    /// go through `library::EQUALS`, which fails on a type mismatch as cel-go does.
    pub k8s_equality: Vec<u64>,
}

fn add(a: u64, b: u64) -> u64 {
    a.saturating_add(b)
}
fn mul(a: u64, b: u64) -> u64 {
    a.saturating_mul(b)
}

impl Checker {
    pub fn new() -> Self {
        Checker {
            scope: Vec::new(),
            k8s_equality: Vec::new(),
            k8s_rendering: Vec::new(),
        }
    }

    /// Type and cost of the whole expression; rejects estimates over [`MAX_COST`] and
    /// statically non-bool results (for a derived attribute, `derived`: anything but a
    /// primitive scalar, string, int, bool or semver, or a list of them).
    pub fn check(&mut self, e: &IdedExpr, derived: bool) -> Result<Est, Reject> {
        let est = self.expr(e)?;
        let scalar = |t: &Ty| matches!(t, Ty::Bool | Ty::Int | Ty::String | Ty::Semver | Ty::Dyn);
        let allowed = if derived {
            scalar(&est.ty) || matches!(&est.ty, Ty::List(t) if scalar(t))
        } else {
            matches!(est.ty, Ty::Bool | Ty::Dyn)
        };
        if !allowed {
            let message = if derived {
                format!(
                    "must evaluate to a primitive scalar (string, integer, boolean, semver) or a list of these scalars, not {}",
                    est.ty.name()
                )
            } else {
                format!(
                    "must evaluate to bool or the unknown type, not {}",
                    est.ty.name()
                )
            };
            return reject(e.id, message);
        }
        if est.cost > MAX_COST {
            return Err(Reject {
                message: format!(
                    "estimated cost {} exceeds the limit of {MAX_COST} cost units",
                    if est.cost == u64::MAX {
                        "(unbounded)".to_string()
                    } else {
                        est.cost.to_string()
                    }
                ),
                node: e.id,
                cost: true,
            });
        }
        Ok(est)
    }

    fn var(&self, name: &str) -> Option<&Est> {
        self.scope
            .iter()
            .rev()
            .find(|v| v.name == name)
            .map(|v| &v.est)
    }

    fn expr(&mut self, e: &IdedExpr) -> Result<Est, Reject> {
        match &e.expr {
            Expr::Unspecified => reject(e.id, "unspecified expression"),
            Expr::Literal(l) => Ok(match l {
                LiteralValue::Boolean(_) => Est::new(Ty::Bool, 1),
                LiteralValue::Int(_) => Est::new(Ty::Int, 1),
                LiteralValue::UInt(_) => Est::new(Ty::Uint, 1),
                LiteralValue::Double(_) => Est::new(Ty::Double, 1),
                LiteralValue::Null => Est::new(Ty::Null, 1),
                LiteralValue::String(s) => Est::sized(Ty::String, 1, s.inner().len() as u64, 1),
                LiteralValue::Bytes(b) => Est::sized(Ty::Bytes, 1, b.inner().len() as u64, 1),
            }),
            Expr::Ident(name) => {
                if let Some(v) = self.var(name) {
                    return Ok(Est {
                        cost: 1,
                        ..v.clone()
                    });
                }
                if name == "device" {
                    return Ok(Est::new(Ty::Device, 1));
                }
                if TYPE_NAMES.contains(&name.as_str()) {
                    return Ok(Est::new(Ty::Type, 1));
                }
                reject(e.id, format!("undeclared reference to '{name}'"))
            }
            Expr::List(l) => {
                let mut cost = 1u64;
                let mut ty: Option<Ty> = None;
                let mut inner = 1u64;
                for x in &l.elements {
                    let est = self.expr(x)?;
                    cost = add(cost, est.cost);
                    inner = inner.max(est.size);
                    let t = if l.optional_indices.is_empty() {
                        est.ty
                    } else {
                        Ty::Dyn
                    };
                    ty = Some(match ty {
                        None => t,
                        Some(prev) if prev == t => prev,
                        Some(_) => Ty::Dyn,
                    });
                }
                Ok(Est::sized(
                    Ty::List(Box::new(ty.unwrap_or(Ty::Dyn))),
                    cost,
                    l.elements.len() as u64,
                    inner,
                ))
            }
            Expr::Map(m) => {
                let mut cost = 1u64;
                let mut inner = 1u64;
                let (mut kt, mut vt): (Option<Ty>, Option<Ty>) = (None, None);
                for entry in &m.entries {
                    let cel::common::ast::EntryExpr::MapEntry(me) = &entry.expr else {
                        return reject(entry.id, "struct field in a map literal");
                    };
                    let k = self.expr(&me.key)?;
                    let v = self.expr(&me.value)?;
                    if matches!(
                        k.ty,
                        Ty::Double | Ty::Null | Ty::List(_) | Ty::Map(..) | Ty::Bytes
                    ) {
                        return reject(
                            me.key.id,
                            format!("unsupported map key type: {}", k.ty.name()),
                        );
                    }
                    cost = add(cost, add(k.cost, v.cost));
                    inner = inner.max(v.size);
                    let join = |prev: Option<Ty>, t: Ty| match prev {
                        None => t,
                        Some(p) if p == t => p,
                        Some(_) => Ty::Dyn,
                    };
                    kt = Some(join(kt, k.ty));
                    vt = Some(join(vt, if me.optional { Ty::Dyn } else { v.ty }));
                }
                let ty = Ty::Map(
                    Box::new(kt.unwrap_or(Ty::Dyn)),
                    Box::new(vt.unwrap_or(Ty::Dyn)),
                );
                Ok(Est::sized(ty, cost, m.entries.len() as u64, inner))
            }
            Expr::Struct(_) => reject(
                e.id,
                "message construction is not supported in device selectors",
            ),
            Expr::Select(s) => {
                let operand = self.expr(&s.operand)?;
                let field = self.field(e.id, &operand, &s.field)?;
                if s.test {
                    return Ok(Est::new(Ty::Bool, add(operand.cost, 1)));
                }
                Ok(Est {
                    cost: add(operand.cost, 1),
                    ..field
                })
            }
            Expr::Comprehension(c) => {
                let range = self.expr(&c.iter_range)?;
                let (iter_ty, iter2_ty) = match &range.ty {
                    Ty::List(el) => ((**el).clone(), Some((Ty::Int, (**el).clone()))),
                    Ty::Map(k, v) => ((**k).clone(), Some(((**k).clone(), (**v).clone()))),
                    Ty::Dyn => (Ty::Dyn, Some((Ty::Dyn, Ty::Dyn))),
                    other => {
                        return reject(
                            c.iter_range.id,
                            format!(
                                "expression of type '{}' cannot be range of a comprehension",
                                other.name()
                            ),
                        );
                    }
                };
                let n = range.size;
                let init = self.expr(&c.accu_init)?;
                self.scope.push(Var {
                    name: c.accu_var.clone(),
                    est: init.clone(),
                });
                let (first_ty, second) = match (&c.iter_var2, iter2_ty) {
                    (Some(v2), Some((k, v))) => (k, Some((v2.clone(), v))),
                    _ => (iter_ty, None),
                };
                self.scope.push(Var {
                    name: c.iter_var.clone(),
                    est: Est::sized(first_ty, 1, range.inner, UNKNOWN_SIZE.min(range.inner)),
                });
                if let Some((name, ty)) = &second {
                    self.scope.push(Var {
                        name: name.clone(),
                        est: Est::sized(ty.clone(), 1, range.inner, range.inner),
                    });
                }
                let cond = self.expr(&c.loop_cond);
                let step = self.expr(&c.loop_step);
                if second.is_some() {
                    self.scope.pop();
                }
                self.scope.pop();
                let (cond, step) = match (cond, step) {
                    (Ok(c), Ok(s)) => (c, s),
                    (Err(err), _) | (_, Err(err)) => {
                        self.scope.pop();
                        return Err(err);
                    }
                };
                let growth = step.size.saturating_sub(init.size);
                let accu_ty = if init.ty == step.ty || !step.ty.known() {
                    init.ty.clone()
                } else if matches!(init.ty, Ty::List(ref x) if **x == Ty::Dyn) {
                    step.ty.clone()
                } else {
                    init.ty.clone()
                };
                let accu = Est::sized(
                    accu_ty,
                    1,
                    add(init.size, mul(n, growth)),
                    init.inner.max(step.inner),
                );
                if let Some(v) = self.scope.last_mut() {
                    v.est = accu;
                }
                let result = self.expr(&c.result);
                self.scope.pop();
                let result = result?;
                let cost = add(
                    add(range.cost, init.cost),
                    add(mul(n, add(cond.cost, step.cost)), result.cost),
                );
                Ok(Est { cost, ..result })
            }
            Expr::Call(call) => self.call(e, call),
        }
    }

    fn field(&self, node: u64, operand: &Est, field: &str) -> Result<Est, Reject> {
        Ok(match &operand.ty {
            Ty::Device => match field {
                "driver" => Est::sized(Ty::String, 1, DRIVER_NAME_SIZE, 1),
                "allowMultipleAllocations" => Est::new(Ty::Bool, 1),
                "attributes" => Est::sized(
                    Ty::Map(
                        Box::new(Ty::String),
                        Box::new(Ty::Map(Box::new(Ty::String), Box::new(Ty::Dyn))),
                    ),
                    1,
                    DEVICE_MAP_ENTRIES,
                    DEVICE_MAP_ENTRIES,
                ),
                "capacity" => Est::sized(
                    Ty::Map(
                        Box::new(Ty::String),
                        Box::new(Ty::Map(Box::new(Ty::String), Box::new(Ty::Quantity))),
                    ),
                    1,
                    DEVICE_MAP_ENTRIES,
                    DEVICE_MAP_ENTRIES,
                ),
                _ => return reject(node, format!("undefined field '{field}'")),
            },
            Ty::Map(_, v) => self.value_of(operand, v),
            Ty::Dyn => Est::sized(Ty::Dyn, 1, UNKNOWN_SIZE, UNKNOWN_SIZE),
            other => {
                return reject(
                    node,
                    format!("type '{}' does not support field selection", other.name()),
                );
            }
        })
    }

    /// An element of the map or list `of`, of type `ty`.
    fn value_of(&self, of: &Est, ty: &Ty) -> Est {
        let size = match ty {
            // An attribute value: a string of at most 64 characters or a list of at most 48.
            Ty::Dyn if of.inner == DEVICE_MAP_ENTRIES => ATTRIBUTE_VALUE_SIZE,
            Ty::Map(..) => DEVICE_MAP_ENTRIES.min(of.inner),
            _ => of.inner,
        };
        let inner = if size == ATTRIBUTE_VALUE_SIZE {
            ATTRIBUTE_VALUE_SIZE
        } else {
            of.inner
        };
        Est::sized(ty.clone(), 1, size, inner)
    }

    fn call(&mut self, e: &IdedExpr, call: &cel::common::ast::CallExpr) -> Result<Est, Reject> {
        let f = call.func_name.as_str();
        // `ns.fn(...)` parses as a member call on the identifier `ns`.
        if let Some(target) = &call.target {
            if let Expr::Ident(ns) = &target.expr {
                let qualified = format!("{ns}.{f}");
                if self.var(ns).is_none() && ns != "device" && GLOBALS.contains(&qualified.as_str())
                {
                    return self.global(e, &qualified, &call.args);
                }
            }
            let recv = self.expr(target)?;
            return self.member(e, f, recv, &call.args);
        }
        self.global(e, f, &call.args)
    }

    fn args(&mut self, args: &[IdedExpr]) -> Result<Vec<Est>, Reject> {
        args.iter().map(|a| self.expr(a)).collect()
    }

    fn global(&mut self, e: &IdedExpr, f: &str, args: &[IdedExpr]) -> Result<Est, Reject> {
        let a = self.args(args)?;
        let cost: u64 = a.iter().fold(1, |c, x| add(c, x.cost));
        let tys: Vec<&Ty> = a.iter().map(|x| &x.ty).collect();
        let id = e.id;
        let bool_est = |c| Ok(Est::new(Ty::Bool, c));
        match (f, a.as_slice()) {
            (operators::LOGICAL_AND | operators::LOGICAL_OR, [x, y]) => {
                for t in [&x.ty, &y.ty] {
                    if !matches!(t, Ty::Bool | Ty::Dyn) {
                        return overload_error(id, f, &tys);
                    }
                }
                bool_est(cost)
            }
            (operators::LOGICAL_NOT | operators::NOT_STRICTLY_FALSE, [x]) => {
                if !matches!(x.ty, Ty::Bool | Ty::Dyn) {
                    return overload_error(id, f, &tys);
                }
                bool_est(cost)
            }
            (operators::CONDITIONAL, [c, x, y]) => {
                if !matches!(c.ty, Ty::Bool | Ty::Dyn) {
                    return overload_error(id, f, &tys);
                }
                let ty = if x.ty == y.ty { x.ty.clone() } else { Ty::Dyn };
                Ok(Est::sized(
                    ty,
                    cost,
                    x.size.max(y.size),
                    x.inner.max(y.inner),
                ))
            }
            (operators::EQUALS | operators::NOT_EQUALS, [x, y]) => {
                if !compatible(&x.ty, &y.ty) {
                    return overload_error(id, f, &tys);
                }
                if f == operators::EQUALS && matches!(x.ty, Ty::Dyn | Ty::Quantity | Ty::Semver) {
                    self.k8s_equality.push(id);
                }
                bool_est(add(cost, x.size.min(y.size)))
            }
            (
                operators::LESS
                | operators::LESS_EQUALS
                | operators::GREATER
                | operators::GREATER_EQUALS,
                [x, y],
            ) => {
                let orderable = |t: &Ty| {
                    matches!(
                        t,
                        Ty::Int
                            | Ty::Uint
                            | Ty::Double
                            | Ty::String
                            | Ty::Bool
                            | Ty::Bytes
                            | Ty::Duration
                            | Ty::Timestamp
                            | Ty::Dyn
                    )
                };
                let ok = orderable(&x.ty)
                    && orderable(&y.ty)
                    && (!x.ty.known()
                        || !y.ty.known()
                        || x.ty == y.ty
                        || (x.ty.numeric() && y.ty.numeric()));
                if !ok {
                    return overload_error(id, f, &tys);
                }
                bool_est(add(cost, x.size.min(y.size)))
            }
            (operators::ADD, [x, y]) => {
                let ty = match (&x.ty, &y.ty) {
                    (Ty::Dyn, t) | (t, Ty::Dyn) => match t {
                        Ty::List(_) => Ty::List(Box::new(Ty::Dyn)),
                        Ty::Int
                        | Ty::Uint
                        | Ty::Double
                        | Ty::String
                        | Ty::Bytes
                        | Ty::Dyn
                        | Ty::Duration
                        | Ty::Timestamp => {
                            if x.ty.known() || y.ty.known() {
                                t.clone()
                            } else {
                                Ty::Dyn
                            }
                        }
                        _ => return overload_error(id, f, &tys),
                    },
                    (Ty::List(a), Ty::List(b)) => Ty::List(Box::new(if a == b {
                        (**a).clone()
                    } else if **a == Ty::Dyn {
                        (**b).clone()
                    } else if **b == Ty::Dyn {
                        (**a).clone()
                    } else {
                        Ty::Dyn
                    })),
                    (Ty::Int, Ty::Int)
                    | (Ty::Uint, Ty::Uint)
                    | (Ty::Double, Ty::Double)
                    | (Ty::String, Ty::String)
                    | (Ty::Bytes, Ty::Bytes)
                    | (Ty::Duration, Ty::Duration) => x.ty.clone(),
                    (Ty::Timestamp, Ty::Duration) | (Ty::Duration, Ty::Timestamp) => Ty::Timestamp,
                    _ => return overload_error(id, f, &tys),
                };
                let size = if matches!(ty, Ty::String | Ty::Bytes | Ty::List(_) | Ty::Dyn) {
                    add(x.size, y.size)
                } else {
                    1
                };
                Ok(Est::sized(ty, add(cost, size), size, x.inner.max(y.inner)))
            }
            (
                operators::SUBSTRACT | operators::MULTIPLY | operators::DIVIDE | operators::MODULO,
                [x, y],
            ) => {
                let numeric_ok = |t: &Ty| match f {
                    operators::MODULO => matches!(t, Ty::Int | Ty::Uint),
                    _ => t.numeric(),
                };
                let ty = match (&x.ty, &y.ty) {
                    (Ty::Dyn, Ty::Dyn) => Ty::Dyn,
                    (Ty::Dyn, t) | (t, Ty::Dyn)
                        if numeric_ok(t)
                            || (f == operators::SUBSTRACT
                                && matches!(t, Ty::Timestamp | Ty::Duration)) =>
                    {
                        if f == operators::SUBSTRACT && matches!(t, Ty::Timestamp) {
                            Ty::Dyn
                        } else {
                            t.clone()
                        }
                    }
                    (a, b) if a == b && numeric_ok(a) => a.clone(),
                    (Ty::Timestamp, Ty::Timestamp) if f == operators::SUBSTRACT => Ty::Duration,
                    (Ty::Timestamp, Ty::Duration) if f == operators::SUBSTRACT => Ty::Timestamp,
                    (Ty::Duration, Ty::Duration) if f == operators::SUBSTRACT => Ty::Duration,
                    _ => return overload_error(id, f, &tys),
                };
                Ok(Est::new(ty, cost))
            }
            (operators::NEGATE, [x]) => {
                if !matches!(x.ty, Ty::Int | Ty::Double | Ty::Dyn | Ty::Duration) {
                    return overload_error(id, f, &tys);
                }
                Ok(Est::new(x.ty.clone(), cost))
            }
            (operators::IN, [x, y]) => {
                let ok = match &y.ty {
                    Ty::List(el) => compatible(&x.ty, el),
                    Ty::Map(k, _) => compatible(&x.ty, k),
                    Ty::Dyn => true,
                    _ => false,
                };
                if !ok {
                    return overload_error(id, f, &tys);
                }
                bool_est(add(cost, y.size))
            }
            (operators::INDEX | operators::OPT_INDEX, [x, y]) => {
                let opt = f == operators::OPT_INDEX;
                let value = match &x.ty {
                    Ty::List(el) if matches!(y.ty, Ty::Int | Ty::Uint | Ty::Dyn) => {
                        self.value_of(x, el)
                    }
                    Ty::Map(k, v)
                        if compatible(k, &y.ty) && !matches!(y.ty, Ty::Double | Ty::Null)
                            || (matches!(**k, Ty::Dyn)) =>
                    {
                        self.value_of(x, v)
                    }
                    Ty::Dyn => Est::sized(Ty::Dyn, 1, UNKNOWN_SIZE, UNKNOWN_SIZE),
                    Ty::Opt(inner) if opt => Est::sized((**inner).clone(), 1, x.size, x.inner),
                    _ => return overload_error(id, f, &tys),
                };
                let ty = if opt {
                    Ty::Opt(Box::new(value.ty.clone()))
                } else {
                    value.ty.clone()
                };
                Ok(Est {
                    ty,
                    cost: add(cost, 1),
                    ..value
                })
            }
            (operators::OPT_SELECT, [x, field]) => {
                let _ = field;
                let name = match &args[1].expr {
                    Expr::Literal(LiteralValue::String(s)) => s.inner().to_string(),
                    _ => return reject(id, "optional select needs a field name"),
                };
                let inner = match &x.ty {
                    Ty::Opt(t) => Est::sized((**t).clone(), 1, x.size, x.inner),
                    _ => x.clone(),
                };
                let value = self.field(id, &inner, &name)?;
                Ok(Est {
                    ty: Ty::Opt(Box::new(value.ty.clone())),
                    cost: add(cost, 1),
                    ..value
                })
            }
            ("size", [x]) => {
                if !matches!(
                    x.ty,
                    Ty::String | Ty::Bytes | Ty::List(_) | Ty::Map(..) | Ty::Dyn
                ) {
                    return overload_error(id, f, &tys);
                }
                Ok(Est::new(Ty::Int, cost))
            }
            ("int", [x]) => conv(
                id,
                f,
                x,
                &[Ty::Int, Ty::Uint, Ty::Double, Ty::String, Ty::Timestamp],
                Ty::Int,
                cost,
            ),
            ("uint", [x]) => conv(
                id,
                f,
                x,
                &[Ty::Int, Ty::Uint, Ty::Double, Ty::String],
                Ty::Uint,
                cost,
            ),
            ("double", [x]) => conv(
                id,
                f,
                x,
                &[Ty::Int, Ty::Uint, Ty::Double, Ty::String],
                Ty::Double,
                cost,
            ),
            ("bool", [x]) => conv(id, f, x, &[Ty::Bool, Ty::String], Ty::Bool, cost),
            ("bytes", [x]) => {
                conv(id, f, x, &[Ty::Bytes, Ty::String], Ty::Bytes, cost).map(|mut est| {
                    est.size = x.size;
                    est
                })
            }
            ("string", [x]) => {
                if matches!(x.ty, Ty::Double | Ty::Dyn) {
                    self.k8s_rendering.push(id);
                }
                let mut est = conv(
                    id,
                    f,
                    x,
                    &[
                        Ty::Int,
                        Ty::Uint,
                        Ty::Double,
                        Ty::String,
                        Ty::Bytes,
                        Ty::Bool,
                        Ty::Timestamp,
                        Ty::Duration,
                    ],
                    Ty::String,
                    cost,
                )?;
                est.size = x.size.max(32);
                Ok(est)
            }
            ("dyn", [x]) => Ok(Est {
                ty: Ty::Dyn,
                cost,
                ..x.clone()
            }),
            ("type", [_]) => Ok(Est::new(Ty::Type, cost)),
            ("duration", [x]) => conv(id, f, x, &[Ty::String, Ty::Duration], Ty::Duration, cost),
            ("timestamp", [x]) => conv(
                id,
                f,
                x,
                &[Ty::String, Ty::Timestamp, Ty::Int],
                Ty::Timestamp,
                cost,
            ),
            ("matches", [s, r]) => {
                if !matches!(s.ty, Ty::String | Ty::Dyn) || !matches!(r.ty, Ty::String | Ty::Dyn) {
                    return overload_error(id, f, &tys);
                }
                check_regex(&args[1], "matches")?;
                bool_est(add(cost, mul(s.size, r.size.max(1))))
            }
            ("quantity", [s]) => string_fn(id, f, s, Ty::Quantity, cost),
            ("sign", [q]) => {
                if !matches!(q.ty, Ty::Quantity | Ty::Dyn) {
                    return overload_error(id, f, &tys);
                }
                Ok(Est::new(Ty::Int, cost))
            }
            ("semver", [s]) => string_fn(id, f, s, Ty::Semver, cost),
            ("isQuantity" | "isSemver", [s]) => string_fn(id, f, s, Ty::Bool, cost),
            ("semver" | "isSemver", [s, b]) => {
                if !matches!(s.ty, Ty::String | Ty::Dyn) || !matches!(b.ty, Ty::Bool | Ty::Dyn) {
                    return overload_error(id, f, &tys);
                }
                Ok(Est::new(
                    if f == "semver" { Ty::Semver } else { Ty::Bool },
                    cost,
                ))
            }
            ("sets.contains" | "sets.equivalent" | "sets.intersects", [x, y]) => {
                for t in [&x.ty, &y.ty] {
                    if !matches!(t, Ty::List(_) | Ty::Dyn) {
                        return overload_error(id, f, &tys);
                    }
                }
                let (ex, ey) = (x.ty.elem(), y.ty.elem());
                if ex.known() && ey.known() && ex != ey {
                    return overload_error(id, f, &tys);
                }
                bool_est(add(cost, mul(x.size, y.size)))
            }
            ("lists.range", [n]) => {
                if !matches!(n.ty, Ty::Int | Ty::Dyn) {
                    return overload_error(id, f, &tys);
                }
                let size = match &args[0].expr {
                    Expr::Literal(LiteralValue::Int(i)) => (*i.inner()).max(0) as u64,
                    _ => u64::MAX,
                };
                Ok(Est::sized(
                    Ty::List(Box::new(Ty::Int)),
                    add(cost, size),
                    size,
                    1,
                ))
            }
            ("strings.quote", [s]) => {
                let mut est = string_fn(id, f, s, Ty::String, cost)?;
                est.size = add(mul(s.size, 2), 2);
                Ok(est)
            }
            ("optional.of" | "optional.ofNonZeroValue", [x]) => Ok(Est {
                ty: Ty::Opt(Box::new(x.ty.clone())),
                cost,
                ..x.clone()
            }),
            ("optional.none", []) => Ok(Est::new(Ty::Opt(Box::new(Ty::Dyn)), cost)),
            ("@mapInsert", [m, ..]) => {
                let size = add(
                    m.size,
                    a.get(2)
                        .map_or_else(|| a.get(1).map_or(1, |x| x.size), |_| 1),
                );
                Ok(Est::sized(
                    m.ty.clone(),
                    add(cost, size),
                    size,
                    m.inner.max(a.last().map_or(1, |x| x.size)),
                ))
            }
            _ if GLOBALS.contains(&f) => overload_error(id, f, &tys),
            _ => reject(id, format!("undeclared reference to '{f}'")),
        }
    }

    fn member(
        &mut self,
        e: &IdedExpr,
        f: &str,
        recv: Est,
        args: &[IdedExpr],
    ) -> Result<Est, Reject> {
        let id = e.id;
        let Some(kinds) = member_receivers(f) else {
            return reject(id, format!("undeclared reference to '{f}'"));
        };
        let a = self.args(args)?;
        let mut all: Vec<&Ty> = vec![&recv.ty];
        all.extend(a.iter().map(|x| &x.ty));
        if recv.ty.known() && !kinds.contains(&"any") && !kinds.contains(&kind(&recv.ty)) {
            let names: Vec<String> = all[1..].iter().map(|t| t.name()).collect();
            return reject(
                id,
                format!(
                    "found no matching overload for '{f}' applied to '{}.({})'",
                    recv.ty.name(),
                    names.join(", ")
                ),
            );
        }
        let cost = a.iter().fold(add(recv.cost, 1), |c, x| add(c, x.cost));
        let n = recv.size;
        let string_result = |size: u64| Ok(Est::sized(Ty::String, add(cost, n), size, 1));
        let same_kind_arg = |a: &[Est]| -> bool {
            a.first()
                .is_some_and(|x| !x.ty.known() || !recv.ty.known() || x.ty == recv.ty)
        };
        match f {
            "size" => Ok(Est::new(Ty::Int, cost)),
            "contains" | "startsWith" | "endsWith" => Ok(Est::new(Ty::Bool, add(cost, n))),
            "matches" | "find" | "findAll" if check_regex(&args[0], f).is_err() => {
                check_regex(&args[0], f).map(|_| Est::new(Ty::Bool, cost))
            }
            "matches" => Ok(Est::new(
                Ty::Bool,
                add(cost, mul(n, a.first().map_or(1, |r| r.size.max(1)))),
            )),
            "charAt" => string_result(1),
            "lowerAscii" | "upperAscii" | "trim" | "substring" => string_result(n),
            "find" => string_result(n),
            "replace" => {
                let rep = a.get(1).map_or(UNKNOWN_SIZE, |x| x.size);
                let size = add(mul(n, add(rep, 1)), rep);
                Ok(Est::sized(Ty::String, add(cost, size), size, 1))
            }
            "split" | "findAll" => Ok(Est::sized(
                Ty::List(Box::new(Ty::String)),
                add(cost, n),
                add(n, 1),
                n,
            )),
            "format" => {
                self.k8s_rendering.push(id);
                let list = a
                    .first()
                    .map_or((UNKNOWN_SIZE, UNKNOWN_SIZE), |x| (x.size, x.inner));
                let size = add(n, mul(list.0, list.1.max(32)));
                Ok(Est::sized(Ty::String, add(cost, size), size, 1))
            }
            "join" => {
                let sep = a.first().map_or(0, |x| x.size);
                let size = mul(n, add(recv.inner, sep));
                Ok(Est::sized(Ty::String, add(cost, size), size, 1))
            }
            "indexOf" | "lastIndexOf" => Ok(Est::new(Ty::Int, add(cost, n))),
            "isSorted" => Ok(Est::new(Ty::Bool, add(cost, n))),
            "first" | "last" => Ok(Est::sized(
                Ty::Opt(Box::new(recv.ty.elem())),
                add(cost, 1),
                recv.inner,
                recv.inner,
            )),
            "sum" | "min" | "max" => Ok(Est::sized(
                recv.ty.elem(),
                add(cost, n),
                recv.inner,
                recv.inner,
            )),
            "@sortByAssociatedKeys" => Ok(Est {
                cost: add(cost, mul(n, 64)),
                ..recv.clone()
            }),
            "slice" | "distinct" | "reverse" => Ok(Est {
                cost: add(cost, mul(n, n.max(1))),
                ..recv.clone()
            }),
            "sort" => Ok(Est {
                cost: add(cost, mul(n, 64)),
                ..recv.clone()
            }),
            "flatten" => {
                let size = mul(n, recv.inner.max(1));
                Ok(Est::sized(
                    Ty::List(Box::new(Ty::Dyn)),
                    add(cost, size),
                    size,
                    UNKNOWN_SIZE,
                ))
            }
            "compareTo" | "isGreaterThan" | "isLessThan" => {
                if !same_kind_arg(&a) {
                    return overload_error(id, f, &all);
                }
                Ok(Est::new(
                    if f == "compareTo" { Ty::Int } else { Ty::Bool },
                    cost,
                ))
            }
            "add" | "sub" => {
                if !a
                    .first()
                    .is_some_and(|x| matches!(x.ty, Ty::Quantity | Ty::Int | Ty::Dyn))
                {
                    return overload_error(id, f, &all);
                }
                Ok(Est::new(Ty::Quantity, cost))
            }
            "asInteger" | "sign" | "major" | "minor" | "patch" => Ok(Est::new(Ty::Int, cost)),
            "isInteger" => Ok(Est::new(Ty::Bool, cost)),
            "asApproximateFloat" => Ok(Est::new(Ty::Double, cost)),
            "hasValue" => Ok(Est::new(Ty::Bool, cost)),
            "value" | "orValue" => {
                let ty = match &recv.ty {
                    Ty::Opt(t) => (**t).clone(),
                    _ => Ty::Dyn,
                };
                Ok(Est::sized(ty, cost, recv.size, recv.inner))
            }
            "or" => Ok(Est {
                cost,
                ..recv.clone()
            }),
            "includes" => Ok(Est::new(Ty::Bool, add(cost, n))),
            _ => Ok(Est::new(Ty::Int, cost)),
        }
    }
}

/// A literal pattern must compile, as Kubernetes checks while compiling.
fn check_regex(pattern: &IdedExpr, f: &str) -> Result<(), Reject> {
    if let Expr::Literal(LiteralValue::String(p)) = &pattern.expr
        && regex::Regex::new(p.inner()).is_err()
    {
        return reject(pattern.id, format!("invalid {f} argument"));
    }
    Ok(())
}

fn conv(id: u64, f: &str, x: &Est, from: &[Ty], to: Ty, cost: u64) -> Result<Est, Reject> {
    if x.ty.known() && !from.contains(&x.ty) {
        return overload_error(id, f, &[&x.ty]);
    }
    Ok(Est::new(to, add(cost, x.size)))
}

fn string_fn(id: u64, f: &str, s: &Est, to: Ty, cost: u64) -> Result<Est, Reject> {
    if !matches!(s.ty, Ty::String | Ty::Dyn) {
        return overload_error(id, f, &[&s.ty]);
    }
    Ok(Est::new(to, add(cost, s.size)))
}
