//! The Kubernetes DRA CEL environment for device selectors, on top of the `cel` crate.
//!
//! # Brief overview
//!
//! An [`Environment`] compiles selector expressions into [`Selector`]s and caches them by
//! expression text, so a DeviceClass selector seen on every scheduling cycle is parsed and
//! checked once. [`Selector::matches`] evaluates against one device given as a [`DeviceRef`]:
//! borrowed ResourceSlice data, never copied (see the `device` module notes below). Every
//! failure is a [`CelError`] whose [`CelErrorKind`] says whether the expression did not
//! compile, failed at run time, did not produce a bool, or is too expensive.
//!
//! ```
//! use std::collections::BTreeMap;
//! use dra_cel::{DeviceRef, Environment, Options};
//! use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
//! use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
//!
//! let env = Environment::new(Options::default());
//! let selector = env
//!     .compile(r#"device.attributes["gpu.example.com"].memoryGiB >= 80 &&
//!                 device.capacity["gpu.example.com"].memory.isGreaterThan(quantity("40Gi"))"#)
//!     .unwrap();
//!
//! let attributes = dra_cel::sorted(Some(BTreeMap::from([(
//!     "memoryGiB".to_string(),
//!     DeviceAttribute { int: Some(80), ..Default::default() },
//! )])));
//! let capacity = dra_cel::sorted(Some(BTreeMap::from([(
//!     "memory".to_string(),
//!     DeviceCapacity { value: Quantity("80Gi".into()), ..Default::default() },
//! )])));
//! let device = DeviceRef {
//!     driver: "gpu.example.com",
//!     attributes: &attributes,
//!     capacity: &capacity,
//!     allow_multiple_allocations: false,
//! };
//! assert_eq!(selector.matches(device).unwrap(), true);
//! ```
//!
//! # What Kubernetes does, and what this crate does
//!
//! Behaviour is pinned to `k8s.io/dynamic-resource-allocation/cel` v0.37.2 by a differential
//! test (`tests/differential.rs`) that runs the Go implementation (`tests/cluster/cmd/celcheck`)
//! and this crate on the same table of expressions (`tests/data/selectors.json`) and on
//! thousands of generated expression/device pairs.
//!
//! * **Compile** (`check` module): Kubernetes type-checks the expression; the `cel` crate does
//!   not. Our pass infers the static types it can (literals, the `device` fields, library
//!   results; attribute values are `dyn`, as in Kubernetes) and rejects what cel-go's checker
//!   rejects: `1 == 1.0`, `'a' == 1`, `quantity(..) < quantity(..)`, `device.foo`, unknown
//!   functions, invalid literal regexes, statically non-bool results ([`CelErrorKind::NotBool`]).
//!   Nesting is limited like cel-go's parser (250 levels).
//! * **Cost**: Kubernetes stops an evaluation after 1,000,000 cost units. We bound cost
//!   statically: the checker estimates the worst case from the AST and Kubernetes' limits on
//!   device data (32 attributes, 64-character values, 48 list values), and rejects an
//!   expression over [`MAX_COST`] with [`CelErrorKind::Cost`] before it ever runs, so an
//!   evaluation cannot hang. The bound is conservative: an expression whose worst case exceeds
//!   it is rejected even where Kubernetes would finish a cheap device. `lists.range(n)` needs a
//!   literal `n`, since a data-dependent size cannot be bounded.
//! * **Errors are values** (`eval` module): in cel-go `cel.bind(b, 1/0 == 1, b || true)` and
//!   `[0, 1].exists(x, 1 / x == 1)` are true, because `&&`/`||` and comprehensions carry an
//!   error until something decides. The `cel` crate stops at the first error, so our evaluator
//!   runs control flow (`&&`, `||`, `!`, `?:`, comprehensions, hence every macro and
//!   `cel.bind`) itself and hands the rest to the interpreter.
//! * **Rendering**: `string(double)` and `format()` produce Kubernetes' text (Go's float
//!   formatting, its locale-aware `%f`/`%e`); the calls are routed to our implementation at
//!   compile time. Kubernetes rejects a bad literal format string while compiling; here it is
//!   an error when evaluated.
//! * **Equality**: `quantity == x` and `semver == x` with `x` of another type are errors in
//!   Kubernetes, not `false`; such `==` calls are routed to a typed equality at compile time.
//! * **The `device` variable** is a set of views over the borrowed maps, built on the stack for
//!   each evaluation: `device.attributes["d"].x` converts only the attribute it reaches, and
//!   strings are borrowed, not copied. Only iterating a map or comparing a whole map with `==`
//!   builds a `cel` map of that map, for that evaluation. Unqualified names belong to the
//!   driver's domain; an unknown domain is an empty map; a missing name is "no such key".
//! * **String comparisons without the interpreter** (`shortcut` module): a selector that is
//!   only `&&` of `device.driver == "…"` and `device.attributes["d"].x == "…"` (most class
//!   and request selectors) is answered from the device data where each compared attribute
//!   is a string, or one comparison is false; anything else runs the interpreter. The
//!   differential test generates 2,000 such selectors besides the others.
//! * **Compile once**: [`Environment::compile`] caches by expression text; `quantity("…")` and
//!   `semver("…")` of literals are computed at compile time.
//! * **Quantities** are exact ([`Quantity`], nano-units in an `i128`); `isInteger`/`asInteger`
//!   answer as Kubernetes does, from how the value was written (`quantity("1000m")` is not an
//!   integer there either).
//! * **Panics**: none are expected on any input (a proptest fuzzes this). Compiling, and
//!   evaluating very deep expressions, run on a thread with a large stack, so nesting cannot
//!   overflow the caller's; as a last line of defence a panic becomes an error.
//!
//! # Functions
//!
//! | library | functions | here |
//! |---|---|---|
//! | CEL standard | operators, `size`, `contains`, `startsWith`, `endsWith`, `matches`, conversions, `type`, `dyn`, `has`, `all`, `exists`, `exists_one`, `map`, `filter` | yes (`cel` crate) |
//! | cross-type numeric comparisons | `1 < 1.5`, `dyn(1) == 1.0` | yes |
//! | optional types | `.?f`, `[?k]`, `optional.of/none/ofNonZeroValue`, `hasValue`, `value`, `orValue`, `or` | yes (`cel` crate) |
//! | optional types | `optMap`, `optFlatMap` | yes (`cel` crate macros) |
//! | Kubernetes quantity | `quantity`, `isQuantity`, `compareTo`, `isGreaterThan`, `isLessThan`, `add`, `sub`, `asInteger`, `isInteger`, `asApproximateFloat`, `sign(q)` | yes (ours, exact) |
//! | Kubernetes semver | `semver` (1 and 2 arguments), `isSemver` (1 and 2), `compareTo`, `isGreaterThan`, `isLessThan`, `major`, `minor`, `patch` | yes (ours, blang/semver rules) |
//! | strings ext v2 | `charAt`, `indexOf`, `lastIndexOf`, `lowerAscii`, `upperAscii`, `replace`, `split`, `substring`, `trim`, `join`, `strings.quote` | yes (`cel` crate) |
//! | strings ext v2 | `format` with `%s` (strings, numbers, bools, bytes, null, types), `%d`, `%f`, `%e`, `%b`, `%o`, `%x`, `%X`, `%%`, rendered as Kubernetes' en-US printer does (`1,234.500000`, `1.500000×10⁰⁰`) | yes (ours) |
//! | strings ext v2 | `format` `%s` of lists, maps, durations, timestamps | no: an error here, a text in Kubernetes |
//! | conversions | `string(double)` as Go writes doubles (`1.23456789e+08`) | yes (ours) |
//! | Kubernetes regex | `find`, `findAll` (1 and 2 arguments) | yes (ours; Rust `regex`, RE2 syntax as Go's) |
//! | Kubernetes lists v1 | `isSorted`, `sum`, `min`, `max`, `indexOf`, `lastIndexOf`, `includes` | yes (ours) |
//! | lists ext v3 | `slice`, `flatten`, `distinct`, `reverse`, `sort`, `sortBy`, `lists.range` | yes (`cel` crate) |
//! | lists ext v3 | `first`, `last` | yes (ours) |
//! | sets ext | `sets.contains`, `sets.intersects`, `sets.equivalent` | yes (ours) |
//! | bindings | `cel.bind` | yes (ours, macro) |
//! | two-variable comprehensions | `all(i, v, …)`, `exists`, `existsOne`, `transformList`, `transformMap`, `transformMapEntry` | yes (ours, macros + evaluator) |
//! | Kubernetes URLs, IP, CIDR, format, authz | `url`, `isURL`, `ip`, `isIP`, `cidr`, `isCIDR`, `format.named`, `format.dns1123Label`, … | no |
//! | timestamps, durations | `timestamp`, `duration`, `getHours`, … | `cel` crate, not differentially tested |
//!
//! A function marked "no" is a compile error here ("undeclared reference"), never a silent
//! wrong answer.

#![forbid(unsafe_code)]

/// Quantities are the workspace's one implementation, `dra-quantity`; re-exported here so that
/// CEL's `quantity()` and its callers name the same type.
pub use dra_quantity as quantity;
pub use dra_quantity::{Format as QuantityFormat, Quantity, QuantityError};

mod check;
mod device;
mod eval;
mod library;
mod semver;
mod shortcut;
mod values;

pub use check::MAX_COST;

use std::collections::{BTreeMap, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, OnceLock, RwLock};

use cel::common::ast::{Expr, IdedExpr};
use cel::common::types::CelBool;
use cel::common::value::CowVal;
use cel::context::VariableResolver;
use cel::{Context, Env, ExecutionError};
use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};

/// Which optional parts of the Kubernetes environment are on.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// DRAListTypeAttributes (alpha in 1.37): list-valued attributes and `includes`.
    ///
    /// Kept for callers that track the gate, but it changes nothing here: the environment
    /// Kubernetes 1.37 evaluates stored selectors in has `includes` (lists library v1) and
    /// reads list-valued attributes whether or not the gate is on; the differential test
    /// checks both settings against it.
    pub list_type_attributes: bool,
}

/// The device a selector is evaluated against, borrowed from a ResourceSlice.
#[derive(Clone, Copy, Debug)]
pub struct DeviceRef<'a> {
    /// The driver of the slice the device is in; also the domain of unqualified attributes.
    pub driver: &'a str,
    /// The device's attributes, sorted by name as the API's map is (see [`sorted`]).
    pub attributes: &'a [(String, DeviceAttribute)],
    /// The device's capacity, sorted by name.
    pub capacity: &'a [(String, DeviceCapacity)],
    pub allow_multiple_allocations: bool,
}

/// A device's attribute or capacity map as [`DeviceRef`] reads it: one allocation of
/// `(name, value)` pairs, sorted by name. A `BTreeMap` leaf has room for eleven entries
/// however few it holds, so a device's two maps take several kilobytes; this takes what
/// its entries need.
pub fn sorted<T>(map: Option<BTreeMap<String, T>>) -> Box<[(String, T)]> {
    map.into_iter().flatten().collect()
}

/// What went wrong, by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CelErrorKind {
    Compile,
    Runtime,
    NotBool,
    Cost,
}

/// A typed CEL error that names the expression and, once the caller attaches it, the object.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct CelError {
    pub kind: CelErrorKind,
    pub expression: String,
    /// Byte offset into the expression, where the parser or checker gives one.
    pub position: Option<usize>,
    pub message: String,
    pub context: Option<String>,
}

impl CelError {
    /// Attach where the expression came from, e.g. `DeviceClass gpu.nvidia.com`.
    pub fn with_context(mut self, context: impl Into<String>) -> Self {
        self.context = Some(context.into());
        self
    }

    fn new(kind: CelErrorKind, expression: &str, position: Option<usize>, message: String) -> Self {
        CelError {
            kind,
            expression: expression.to_string(),
            position,
            message,
            context: None,
        }
    }
}

/// A compiled selector expression.
pub struct Selector {
    expression: String,
    program: IdedExpr,
    depth: usize,
    /// Nodes whose subtree holds a comprehension: see the `eval` module.
    comprehensions: Vec<bool>,
    /// By node id: `quantity("…")`/`semver("…")` of a literal, folded at compile time.
    constants: Vec<Option<Box<dyn cel::common::value::Val>>>,
    env: Arc<Env>,
    estimated_cost: u64,
    /// The selector as string comparisons, where it is only that (see `shortcut`).
    shortcut: Option<shortcut::Shortcut>,
}

impl std::fmt::Debug for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selector")
            .field("expression", &self.expression)
            .field("estimated_cost", &self.estimated_cost)
            .finish()
    }
}

/// Resolves the one variable there is, `device`, to the view of the device being evaluated.
struct DeviceResolver<'a>(device::DeviceVal<'a>);

impl VariableResolver for DeviceResolver<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        (variable == "device").then(|| CowVal::Borrowed(&self.0 as &dyn cel::common::value::Val))
    }
}

impl Selector {
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The static worst-case cost estimate this selector was admitted with.
    pub fn estimated_cost(&self) -> u64 {
        self.estimated_cost
    }

    /// Evaluate against one device: `Ok(true)` when it selects the device.
    pub fn matches(&self, device: DeviceRef<'_>) -> Result<bool, CelError> {
        match self.shortcut.as_ref().and_then(|s| s.decide(device)) {
            Some(known) => Ok(known),
            None => self.interpret(device),
        }
    }

    /// [`Selector::matches`] by the interpreter alone.
    fn interpret(&self, device: DeviceRef<'_>) -> Result<bool, CelError> {
        self.run(device, |v| match v.downcast_ref::<CelBool>() {
            Some(b) => Ok(*b.inner()),
            None => Err((
                CelErrorKind::NotBool,
                format!("expression evaluated to {}, not bool", v.get_type().name()),
            )),
        })
    }

    /// Evaluate a derived attribute's expression (compiled with
    /// [`Environment::compile_derived`]) against one device: the attribute it yields.
    pub fn attribute(&self, device: DeviceRef<'_>) -> Result<DeviceAttribute, CelError> {
        self.run(device, |v| {
            values::to_attribute(v).map_err(|m| (CelErrorKind::Runtime, m))
        })
    }

    /// Evaluates against `device` and reads the result with `read`; deep expressions on a
    /// thread with a big stack, a panic in the interpreter an error naming the expression.
    fn run<T: Send>(
        &self,
        device: DeviceRef<'_>,
        read: impl Fn(&dyn cel::common::value::Val) -> Result<T, (CelErrorKind, String)> + Send + Sync,
    ) -> Result<T, CelError> {
        let evaluate = || {
            let resolver = DeviceResolver(device::DeviceVal::new(device));
            let mut ctx = Context::with_env(Arc::clone(&self.env));
            ctx.set_variable_resolver(&resolver);
            match eval::Evaluator::new(&resolver.0, &self.comprehensions, &self.constants)
                .eval(&self.program, &ctx)
            {
                Ok(v) => read(&*v),
                Err(e) => Err((CelErrorKind::Runtime, runtime_message(&e))),
            }
        };
        let outcome = if self.depth > SHALLOW_AST_DEPTH {
            // Deep expressions recurse deeper than a caller's thread may allow.
            on_big_stack(evaluate).ok_or(())
        } else {
            catch_unwind(AssertUnwindSafe(evaluate)).map_err(|_| ())
        };
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err((kind, message))) => Err(CelError::new(kind, &self.expression, None, message)),
            Err(()) => Err(CelError::new(
                CelErrorKind::Runtime,
                &self.expression,
                None,
                "internal error: the CEL interpreter panicked".into(),
            )),
        }
    }
}

/// Runs `f` on a thread with [`BIG_STACK`] of stack; `None` if it panicked. Where no thread
/// can be started (a restricted sandbox), `f` runs on the caller's thread instead.
fn on_big_stack<T: Send>(f: impl FnOnce() -> T + Send) -> Option<T> {
    let f = std::sync::Mutex::new(Some(f));
    let take = || f.lock().ok().and_then(|mut f| f.take());
    let spawned = std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("dra-cel".into())
            .stack_size(BIG_STACK)
            .spawn_scoped(scope, || take().map(|f| f()));
        handle.ok().map(|h| h.join().ok().flatten())
    });
    match spawned {
        Some(result) => result,
        None => take().and_then(|f| catch_unwind(AssertUnwindSafe(f)).ok()),
    }
}

fn runtime_message(e: &ExecutionError) -> String {
    match e {
        ExecutionError::NoSuchKey(k) => format!("no such key: {k}"),
        other => other.to_string(),
    }
}

/// cel-go's parser recursion limit, which Kubernetes keeps.
const MAX_NESTING: u16 = 250;
/// Stack for compiling, and for evaluating deep expressions: enough for [`MAX_NESTING`]
/// levels in a debug build. Only touched pages are ever committed.
const BIG_STACK: usize = 256 << 20;
/// The deepest AST accepted; cel-go stops a little past 250 chained operators.
const MAX_AST_DEPTH: usize = 256;
/// Expressions up to this depth are evaluated on the caller's thread (well inside a 2 MiB
/// stack even in a debug build); deeper ones on a thread with [`BIG_STACK`].
const SHALLOW_AST_DEPTH: usize = 24;

fn ast_depth(e: &IdedExpr) -> usize {
    let children: Vec<&IdedExpr> = match &e.expr {
        Expr::Call(call) => call
            .target
            .as_deref()
            .into_iter()
            .chain(call.args.iter())
            .collect(),
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
        Expr::List(l) => l.elements.iter().collect(),
        Expr::Map(m) => m
            .entries
            .iter()
            .filter_map(|entry| match &entry.expr {
                cel::common::ast::EntryExpr::MapEntry(me) => Some([&me.key, &me.value]),
                _ => None,
            })
            .flatten()
            .collect(),
        Expr::Select(s) => vec![&s.operand],
        _ => Vec::new(),
    };
    1 + children.into_iter().map(ast_depth).max().unwrap_or(0)
}

/// How many compiled selectors the cache keeps before it starts over; selectors come from
/// DeviceClasses and claims, so a real cluster stays far below this.
const CACHE_LIMIT: usize = 10_000;

/// The environment: options plus a compiled-program cache keyed by expression.
/// `Send + Sync`; `compile` may be called from many threads.
pub struct Environment {
    options: Options,
    env: Arc<Env>,
    cache: RwLock<HashMap<String, Arc<Selector>>>,
}

impl std::fmt::Debug for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Environment")
            .field("options", &self.options)
            .finish()
    }
}

impl Default for Environment {
    fn default() -> Self {
        Environment::new(Options::default())
    }
}

fn build_env() -> Result<Env, cel::DeclarationError> {
    let mut env = Env::stdlib();
    env.add_extension(cel::extensions::strings)?;
    env.add_extension(cel::extensions::lists)?;
    library::register(&mut env)?;
    Ok(env)
}

impl Environment {
    pub fn new(options: Options) -> Self {
        // The declarations are fixed (options do not change them), so one `Env` serves every
        // environment of the process: building it (stdlib, extensions, our library) costs
        // more than a small snapshot, and a fresh selector cache makes a fresh environment.
        static ENV: OnceLock<Arc<Env>> = OnceLock::new();
        let env = ENV.get_or_init(|| {
            // A failure here is a bug in this crate, caught by every test.
            let env = build_env()
                .unwrap_or_else(|e| panic!("dra-cel: building the CEL environment: {e}"));
            Arc::new(env)
        });
        Environment {
            options,
            env: Arc::clone(env),
            cache: RwLock::new(HashMap::new()),
        }
    }

    /// Compiles a derived attribute's expression (DRADerivedAttributes): it must yield a
    /// string, int, bool or semver, or a list of them; evaluate it with
    /// [`Selector::attribute`]. Cached apart from selectors.
    pub fn compile_derived(&self, expression: &str) -> Result<Arc<Selector>, CelError> {
        self.compile_cached(expression, true)
    }

    /// Compiles `expression`, or returns the cached selector compiled from the same text.
    pub fn compile(&self, expression: &str) -> Result<Arc<Selector>, CelError> {
        self.compile_cached(expression, false)
    }

    fn compile_cached(&self, expression: &str, derived: bool) -> Result<Arc<Selector>, CelError> {
        let key = if derived {
            format!("derived:{expression}")
        } else {
            expression.to_string()
        };
        if let Some(s) = self
            .cache
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(Arc::clone(s));
        }
        // The generated parser needs a lot of stack for nested expressions (tens of KiB per
        // level in debug builds), more than a caller's thread may have, and the checks recurse
        // over the AST: compile on a thread of our own. Compiling is cached, so the thread is
        // paid once per expression.
        let compiled =
            on_big_stack(|| self.compile_uncached(expression, derived)).unwrap_or_else(|| {
                Err(CelError::new(
                    CelErrorKind::Compile,
                    expression,
                    None,
                    "internal error: compiling panicked".into(),
                ))
            });
        let selector = Arc::new(compiled?);
        let mut cache = self.cache.write().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CACHE_LIMIT {
            cache.clear();
        }
        cache.insert(key, Arc::clone(&selector));
        Ok(selector)
    }

    fn compile_uncached(&self, expression: &str, derived: bool) -> Result<Selector, CelError> {
        let parsed = catch_unwind(AssertUnwindSafe(|| {
            self.env
                .parser()
                .max_recursion_depth(MAX_NESTING)
                .parse_with_source_info(expression)
        }));
        let (mut program, source_info) = match parsed {
            Ok(Ok(p)) => p,
            Ok(Err(errors)) => {
                let position = errors
                    .errors
                    .first()
                    .and_then(|e| line_col_offset(expression, e.pos));
                return Err(CelError::new(
                    CelErrorKind::Compile,
                    expression,
                    position,
                    format!("compilation failed: {errors}"),
                ));
            }
            Err(_) => {
                return Err(CelError::new(
                    CelErrorKind::Compile,
                    expression,
                    None,
                    "internal error: the CEL parser panicked".into(),
                ));
            }
        };
        let depth = ast_depth(&program);
        if depth > MAX_AST_DEPTH {
            return Err(CelError::new(
                CelErrorKind::Compile,
                expression,
                None,
                format!("expression nesting depth {depth} exceeds the limit of {MAX_AST_DEPTH}"),
            ));
        }
        let mut checker = check::Checker::new();
        let est = match checker.check(&program, derived) {
            Ok(est) => est,
            Err(reject) => {
                let position = source_info
                    .offset_for(reject.node)
                    .map(|(start, _)| start as usize);
                let kind = if reject.cost {
                    CelErrorKind::Cost
                } else if reject.message.starts_with("must evaluate to bool") {
                    CelErrorKind::NotBool
                } else {
                    CelErrorKind::Compile
                };
                return Err(CelError::new(kind, expression, position, reject.message));
            }
        };
        rewrite_equality(&mut program, &checker.k8s_equality);
        rewrite_rendering(&mut program, &checker.k8s_rendering);
        let mut comprehensions = Vec::new();
        eval::comprehension_nodes(&program, &mut comprehensions);
        let mut constants = Vec::new();
        fold_constants(&program, &mut constants);
        Ok(Selector {
            expression: expression.to_string(),
            depth,
            comprehensions,
            constants,
            env: Arc::clone(&self.env),
            estimated_cost: est.cost,
            shortcut: (!derived)
                .then(|| shortcut::Shortcut::of(&program))
                .flatten(),
            program,
        })
    }
}

fn fold_constants(e: &IdedExpr, out: &mut Vec<Option<Box<dyn cel::common::value::Val>>>) {
    match &e.expr {
        Expr::Call(call) => {
            if let Some(v) = library::fold_constant(call) {
                let id = e.id as usize;
                if out.len() <= id {
                    out.resize_with(id + 1, || None);
                }
                out[id] = Some(v);
            }
            call.target.iter().for_each(|t| fold_constants(t, out));
            call.args.iter().for_each(|a| fold_constants(a, out));
        }
        Expr::Comprehension(c) => {
            for x in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                fold_constants(x, out);
            }
        }
        Expr::List(l) => l.elements.iter().for_each(|x| fold_constants(x, out)),
        Expr::Map(m) => {
            for entry in &m.entries {
                if let cel::common::ast::EntryExpr::MapEntry(me) = &entry.expr {
                    fold_constants(&me.key, out);
                    fold_constants(&me.value, out);
                }
            }
        }
        Expr::Select(s) => fold_constants(&s.operand, out),
        _ => {}
    }
}

/// Points `string(x)` and `s.format(list)` calls the checker picked at cel-go's rendering.
fn rewrite_rendering(e: &mut IdedExpr, ids: &[u64]) {
    if ids.is_empty() {
        return;
    }
    let id = e.id;
    match &mut e.expr {
        Expr::Call(call) => {
            if ids.contains(&id) {
                if call.func_name == "string" && call.target.is_none() {
                    call.func_name = library::STRING.to_string();
                } else if call.func_name == "format"
                    && let Some(target) = call.target.take()
                {
                    call.args.insert(0, *target);
                    call.func_name = library::FORMAT.to_string();
                }
            }
            if let Some(t) = call.target.as_deref_mut() {
                rewrite_rendering(t, ids);
            }
            for a in &mut call.args {
                rewrite_rendering(a, ids);
            }
        }
        Expr::Comprehension(c) => {
            for x in [
                &mut c.iter_range,
                &mut c.accu_init,
                &mut c.loop_cond,
                &mut c.loop_step,
                &mut c.result,
            ] {
                rewrite_rendering(x, ids);
            }
        }
        Expr::List(l) => l
            .elements
            .iter_mut()
            .for_each(|x| rewrite_rendering(x, ids)),
        Expr::Map(m) => {
            for entry in &mut m.entries {
                if let cel::common::ast::EntryExpr::MapEntry(me) = &mut entry.expr {
                    rewrite_rendering(&mut me.key, ids);
                    rewrite_rendering(&mut me.value, ids);
                }
            }
        }
        Expr::Select(s) => rewrite_rendering(&mut s.operand, ids),
        _ => {}
    }
}

/// Points the `==` calls the checker picked at the Kubernetes-typed equality.
fn rewrite_equality(e: &mut IdedExpr, ids: &[u64]) {
    if ids.is_empty() {
        return;
    }
    let id = e.id;
    match &mut e.expr {
        Expr::Call(call) => {
            if ids.contains(&id) && call.func_name == "_==_" {
                call.func_name = library::EQUALS.to_string();
            }
            if let Some(t) = call.target.as_deref_mut() {
                rewrite_equality(t, ids);
            }
            for a in &mut call.args {
                rewrite_equality(a, ids);
            }
        }
        Expr::Comprehension(c) => {
            for x in [
                &mut c.iter_range,
                &mut c.accu_init,
                &mut c.loop_cond,
                &mut c.loop_step,
                &mut c.result,
            ] {
                rewrite_equality(x, ids);
            }
        }
        Expr::List(l) => l.elements.iter_mut().for_each(|x| rewrite_equality(x, ids)),
        Expr::Map(m) => {
            for entry in &mut m.entries {
                if let cel::common::ast::EntryExpr::MapEntry(me) = &mut entry.expr {
                    rewrite_equality(&mut me.key, ids);
                    rewrite_equality(&mut me.value, ids);
                }
            }
        }
        Expr::Select(s) => rewrite_equality(&mut s.operand, ids),
        _ => {}
    }
}

/// Byte offset of a 1-based line and 0-based column.
fn line_col_offset(src: &str, (line, col): (isize, isize)) -> Option<usize> {
    if line < 1 || col < 0 {
        return None;
    }
    let start: usize = src
        .split_inclusive('\n')
        .take(line as usize - 1)
        .map(str::len)
        .sum();
    Some(start + col as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn environment_is_shareable() {
        assert_send_sync::<Environment>();
        assert_send_sync::<Selector>();
    }

    #[test]
    fn compile_is_cached() {
        let env = Environment::default();
        let a = env.compile("device.driver == 'x'").unwrap();
        let b = env.compile("device.driver == 'x'").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
    }
}
