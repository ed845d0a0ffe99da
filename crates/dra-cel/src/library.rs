//! The Kubernetes CEL libraries the `cel` crate lacks: quantity, semver, regex `find`/`findAll`,
//! Kubernetes' lists library (`isSorted`, `sum`, `min`, `max`, `indexOf`, `lastIndexOf`,
//! `includes`), sets, and the `cel.bind` macro.

use std::cmp::Ordering;

use cel::common::ast::{ComprehensionExpr, Expr, ListExpr, LiteralValue};
use cel::common::types::{
    BOOL_TYPE, CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelOptional, CelString,
    DYN_TYPE, INT_TYPE, LIST_TYPE, STRING_TYPE, Type,
};
use cel::common::value::{CowVal, Val};
use cel::parser::Macro;
use cel::{DeclarationError, Env, ExecutionError};

use crate::quantity::{Format, Quantity};
use crate::semver::Version;
use crate::values::{QUANTITY_TYPE, QuantityVal, SEMVER_TYPE, SemverVal};

type Args<'b, 'v> = Vec<CowVal<'b, 'v>>;
type Ret<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

fn t(ty: &Type) -> Type {
    ToOwned::to_owned(ty)
}

fn arg<'x, T: cel::common::value::StaticVal>(
    args: &'x [CowVal<'_, '_>],
    i: usize,
    what: &str,
) -> Result<&'x T, ExecutionError> {
    let v = args
        .get(i)
        .ok_or_else(|| ExecutionError::invalid_argument_count(i + 1, args.len()))?;
    v.downcast_ref::<T>()
        .ok_or_else(|| ExecutionError::UnexpectedType {
            got: v.get_type().name().to_owned(),
            want: what.to_owned(),
        })
}

fn string<'x>(args: &'x [CowVal<'_, '_>], i: usize) -> Result<&'x str, ExecutionError> {
    let v = args
        .get(i)
        .ok_or_else(|| ExecutionError::invalid_argument_count(i + 1, args.len()))?;
    v.downcast_ref::<CelString>()
        .map(CelString::inner)
        .ok_or_else(|| ExecutionError::UnexpectedType {
            got: v.get_type().name().to_owned(),
            want: "string".to_owned(),
        })
}

fn int(args: &[CowVal<'_, '_>], i: usize) -> Result<i64, ExecutionError> {
    let v = args
        .get(i)
        .ok_or_else(|| ExecutionError::invalid_argument_count(i + 1, args.len()))?;
    v.downcast_ref::<CelInt>()
        .map(|x| *x.inner())
        .ok_or_else(|| ExecutionError::UnexpectedType {
            got: v.get_type().name().to_owned(),
            want: "int".to_owned(),
        })
}

fn boolean(args: &[CowVal<'_, '_>], i: usize) -> Result<bool, ExecutionError> {
    let v = args
        .get(i)
        .ok_or_else(|| ExecutionError::invalid_argument_count(i + 1, args.len()))?;
    v.downcast_ref::<CelBool>()
        .map(|x| *x.inner())
        .ok_or_else(|| ExecutionError::UnexpectedType {
            got: v.get_type().name().to_owned(),
            want: "bool".to_owned(),
        })
}

fn quantity<'x>(args: &'x [CowVal<'_, '_>], i: usize) -> Result<&'x Quantity, ExecutionError> {
    arg::<QuantityVal>(args, i, "kubernetes.Quantity").map(|q| &q.0)
}

fn semver<'x>(args: &'x [CowVal<'_, '_>], i: usize) -> Result<&'x Version, ExecutionError> {
    arg::<SemverVal>(args, i, "kubernetes.Semver").map(|v| &v.0)
}

fn ok<'b, 'v>(v: impl Val + 'v) -> Ret<'b, 'v> {
    Ok(CowVal::owned(v))
}

fn cmp_int(o: Ordering) -> i64 {
    match o {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    }
}

// ---- quantity ----

fn quantity_of<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let q: Quantity = string(&args, 0)?
        .parse()
        .map_err(|e| ExecutionError::function_error("quantity", e))?;
    ok(QuantityVal(q))
}
fn is_quantity<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(CelBool::from(string(&args, 0)?.parse::<Quantity>().is_ok()))
}
fn q_compare_to<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(CelInt::from(cmp_int(
        quantity(&args, 0)?.cmp(quantity(&args, 1)?),
    )))
}
fn q_greater<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(CelBool::from(quantity(&args, 0)? > quantity(&args, 1)?))
}
fn q_less<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(CelBool::from(quantity(&args, 0)? < quantity(&args, 1)?))
}
fn overflow(f: &str) -> ExecutionError {
    ExecutionError::function_error(f, "quantity out of range")
}
fn q_add<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(QuantityVal(
        quantity(&args, 0)?
            .checked_add(quantity(&args, 1)?)
            .ok_or_else(|| overflow("add"))?,
    ))
}
fn q_add_int<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let rhs = Quantity::from_integer(int(&args, 1)?, Format::DecimalExponent);
    ok(QuantityVal(
        quantity(&args, 0)?
            .checked_add(&rhs)
            .ok_or_else(|| overflow("add"))?,
    ))
}
fn q_sub<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(QuantityVal(
        quantity(&args, 0)?
            .checked_sub(quantity(&args, 1)?)
            .ok_or_else(|| overflow("sub"))?,
    ))
}
fn q_sub_int<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let rhs = Quantity::from_integer(int(&args, 1)?, Format::DecimalExponent);
    ok(QuantityVal(
        quantity(&args, 0)?
            .checked_sub(&rhs)
            .ok_or_else(|| overflow("sub"))?,
    ))
}
fn q_as_integer<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = quantity(&args, 0)?
        .as_int64_like_kubernetes()
        .ok_or_else(|| {
            ExecutionError::function_error("asInteger", "cannot convert value to integer")
        })?;
    ok(CelInt::from(v))
}
fn q_is_integer<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(CelBool::from(
        quantity(&args, 0)?.as_int64_like_kubernetes().is_some(),
    ))
}
fn q_float<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(CelDouble::from(quantity(&args, 0)?.as_approximate_float()))
}
fn q_sign<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(CelInt::from(quantity(&args, 0)?.sign()))
}

// ---- semver ----

fn parse_semver(s: &str, normalize: bool) -> Result<Version, String> {
    if normalize {
        Version::parse_normalized(s)
    } else {
        Version::parse(s)
    }
}
fn semver_of<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = parse_semver(string(&args, 0)?, false)
        .map_err(|e| ExecutionError::function_error("semver", e))?;
    ok(SemverVal(v))
}
fn semver_of_norm<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = parse_semver(string(&args, 0)?, boolean(&args, 1)?)
        .map_err(|e| ExecutionError::function_error("semver", e))?;
    ok(SemverVal(v))
}
fn is_semver<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(CelBool::from(
        parse_semver(string(&args, 0)?, false).is_ok(),
    ))
}
fn is_semver_norm<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(CelBool::from(
        parse_semver(string(&args, 0)?, boolean(&args, 1)?).is_ok(),
    ))
}
fn v_compare_to<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(CelInt::from(cmp_int(
        semver(&args, 0)?.compare(semver(&args, 1)?),
    )))
}
fn v_greater<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(CelBool::from(
        semver(&args, 0)?.compare(semver(&args, 1)?) == Ordering::Greater,
    ))
}
fn v_less<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(CelBool::from(
        semver(&args, 0)?.compare(semver(&args, 1)?) == Ordering::Less,
    ))
}
fn v_major<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(CelInt::from(semver(&args, 0)?.major as i64))
}
fn v_minor<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(CelInt::from(semver(&args, 0)?.minor as i64))
}
fn v_patch<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(CelInt::from(semver(&args, 0)?.patch as i64))
}

// ---- regex ----

fn regex(pattern: &str, f: &str) -> Result<regex::Regex, ExecutionError> {
    regex::Regex::new(pattern).map_err(|e| ExecutionError::function_error(f, e))
}
fn find<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let re = regex(string(&args, 1)?, "find")?;
    let found = re
        .find(string(&args, 0)?)
        .map(|m| m.as_str().to_string())
        .unwrap_or_default();
    ok(CelString::from(found))
}
fn find_all_n(s: &str, pattern: &str, n: i64) -> Result<CelList<'static>, ExecutionError> {
    let re = regex(pattern, "findAll")?;
    let limit = if n < 0 { usize::MAX } else { n as usize };
    let items: Vec<Box<dyn Val>> = re
        .find_iter(s)
        .take(limit)
        .map(|m| Box::new(CelString::from(m.as_str().to_string())) as Box<dyn Val>)
        .collect();
    Ok(CelList::from(items))
}
fn find_all<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(find_all_n(string(&args, 0)?, string(&args, 1)?, -1)?)
}
fn find_all_limit<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(find_all_n(
        string(&args, 0)?,
        string(&args, 1)?,
        int(&args, 2)?,
    )?)
}

// ---- Kubernetes lists ----

fn items<'x, 'v>(v: &'x CowVal<'_, 'v>) -> Result<Vec<&'x (dyn Val + 'v)>, ExecutionError> {
    let it = v
        .as_iterable()
        .ok_or_else(|| ExecutionError::UnexpectedType {
            got: v.get_type().name().to_owned(),
            want: "list".to_owned(),
        })?;
    let mut out = Vec::new();
    let mut iter = it.iter();
    while let Some(x) = iter.next() {
        out.push(x);
    }
    Ok(out)
}

fn compare(a: &dyn Val, b: &dyn Val, f: &str) -> Result<Ordering, ExecutionError> {
    let c = a
        .as_comparer()
        .ok_or_else(|| ExecutionError::no_such_overload(f, vec![a.get_type().name().to_owned()]))?;
    c.compare(b)
}

fn is_sorted<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let list = items(&args[0])?;
    for w in list.windows(2) {
        if compare(w[0], w[1], "isSorted")? == Ordering::Greater {
            return ok(CelBool::from(false));
        }
    }
    ok(CelBool::from(true))
}

fn sum<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let list = items(&args[0])?;
    // Kubernetes declares `sum` for lists of int, uint, double and duration only, and adds
    // from a zero of that type: a string, or a second numeric type, is no overload.
    let summable = |v: &dyn Val| {
        matches!(
            v.get_type().name(),
            "int" | "uint" | "double" | "google.protobuf.Duration"
        )
    };
    if let Some(bad) = list
        .iter()
        .find(|x| !summable(**x) || x.get_type() != list[0].get_type())
    {
        return Err(ExecutionError::no_such_overload(
            "sum",
            vec![bad.get_type().name().to_owned()],
        ));
    }
    let mut acc: Option<Box<dyn Val + 'v>> = None;
    for x in list {
        acc = Some(match acc {
            None => x.clone_as_boxed(),
            Some(a) => {
                let adder = a.as_adder().ok_or_else(|| {
                    ExecutionError::no_such_overload("sum", vec![a.get_type().name().to_owned()])
                })?;
                adder.add(x)?.into_owned()
            }
        });
    }
    match acc {
        Some(a) => Ok(CowVal::Owned(a)),
        None => ok(CelInt::from(0)),
    }
}

fn extreme<'b, 'v>(args: Args<'b, 'v>, name: &str, prefer: Ordering) -> Ret<'b, 'v> {
    let list = items(&args[0])?;
    let mut best: Option<&(dyn Val + 'v)> = None;
    for x in list {
        best = Some(match best {
            None => {
                compare(x, x, name)?;
                x
            }
            Some(b) if compare(b, x, name)? == prefer => x,
            Some(b) => b,
        });
    }
    match best {
        Some(b) => Ok(CowVal::Owned(b.clone_as_boxed())),
        None => Err(ExecutionError::function_error(
            name,
            format!("{name} called on empty list"),
        )),
    }
}
fn min<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    extreme(args, "min", Ordering::Greater)
}
fn max<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    extreme(args, "max", Ordering::Less)
}
fn index_of<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let list = items(&args[0])?;
    let i = list.iter().position(|x| x.equals(args[1].as_ref()));
    ok(CelInt::from(i.map_or(-1, |i| i as i64)))
}
fn last_index_of<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let list = items(&args[0])?;
    let i = list.iter().rposition(|x| x.equals(args[1].as_ref()));
    ok(CelInt::from(i.map_or(-1, |i| i as i64)))
}
fn includes<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let target = &args[0];
    let found = if target.get_type().name() == "list" {
        items(target)?.iter().any(|x| x.equals(args[1].as_ref()))
    } else {
        target.equals(args[1].as_ref())
    };
    ok(CelBool::from(found))
}

// ---- sets ----

fn contains_all(a: &[&dyn Val], b: &[&dyn Val]) -> bool {
    b.iter().all(|y| a.iter().any(|x| x.equals(*y)))
}
fn sets_contains<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(CelBool::from(contains_all(
        &items(&args[0])?,
        &items(&args[1])?,
    )))
}
fn sets_equivalent<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let (a, b) = (items(&args[0])?, items(&args[1])?);
    ok(CelBool::from(contains_all(&a, &b) && contains_all(&b, &a)))
}
fn sets_intersects<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let (a, b) = (items(&args[0])?, items(&args[1])?);
    ok(CelBool::from(
        b.iter().any(|y| a.iter().any(|x| x.equals(*y))),
    ))
}

// ---- equality with Kubernetes' own types ----

/// The name `==` is rewritten to where its left operand may be a quantity or a version
/// (`!=` never fails in cel-go, so it keeps CEL's own semantics).
pub(crate) const EQUALS: &str = "@k8s_equals";

/// cel-go asks the left operand: a quantity or a version compared with a value of another type
/// is a "no such overload" error there, where CEL's own types just answer false.
pub(crate) fn k8s_eq(args: &[CowVal<'_, '_>]) -> Result<bool, ExecutionError> {
    let (a, b) = (args[0].as_ref(), args[1].as_ref());
    let special =
        a.downcast_ref::<QuantityVal>().is_some() || a.downcast_ref::<SemverVal>().is_some();
    if special && a.get_type() != b.get_type() {
        return Err(ExecutionError::no_such_overload(
            "_==_",
            vec![
                a.get_type().name().to_owned(),
                b.get_type().name().to_owned(),
            ],
        ));
    }
    Ok(a.equals(b))
}
fn k8s_equals<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    ok(CelBool::from(k8s_eq(&args)?))
}

// ---- string(double) and format(), as cel-go renders them ----

/// The name `string(x)` is rewritten to when `x` may be a double: cel-go writes doubles with
/// Go's `strconv.FormatFloat(d, 'g', -1, 64)` (`1.23456789e+08`, `1e-06`), the `cel` crate
/// positionally.
pub(crate) const STRING: &str = "@k8s_string";
/// The name `s.format(list)` is rewritten to.
pub(crate) const FORMAT: &str = "@k8s_format";

/// Go's shortest `%g` rendering of a double.
pub(crate) fn go_float(d: f64) -> String {
    if d.is_nan() {
        return "NaN".into();
    }
    if d.is_infinite() {
        return if d > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    let sign = if d.is_sign_negative() { "-" } else { "" };
    if d == 0.0 {
        return format!("{sign}0");
    }
    // Rust's `{:e}` gives the shortest digits that read back as `d`, as Go's does.
    let sci = format!("{:e}", d.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if !(-4..6).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{frac}e{esign}{:02}", exp.unsigned_abs());
    }
    if exp < 0 {
        return format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize));
    }
    let point = exp as usize + 1;
    if digits.len() <= point {
        format!("{sign}{digits}{}", "0".repeat(point - digits.len()))
    } else {
        format!("{sign}{}.{}", &digits[..point], &digits[point..])
    }
}

/// `%f` as Kubernetes' en-US printer writes it: thousands grouped, `∞` for infinity.
fn fixed_point(d: f64, precision: usize) -> String {
    if d.is_nan() {
        return "NaN".into();
    }
    if d.is_infinite() {
        return if d > 0.0 { "∞".into() } else { "-∞".into() };
    }
    let d = if d == 0.0 { 0.0 } else { d };
    let text = format!("{d:.precision$}");
    let (sign, unsigned) = text
        .strip_prefix('-')
        .map_or(("", text.as_str()), |t| ("-", t));
    let (whole, fraction) = unsigned
        .split_once('.')
        .map_or((unsigned, None), |(w, f)| (w, Some(f)));
    let mut grouped = String::with_capacity(whole.len() + whole.len() / 3);
    for (i, c) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    match fraction {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

/// `%e` as Kubernetes' printer writes it: six decimals whatever the precision, and the
/// exponent as a superscript power of ten (`1.500000×10⁰⁰`).
fn scientific(d: f64) -> String {
    if d.is_nan() {
        return "   NaN".into();
    }
    if d.is_infinite() {
        return if d > 0.0 {
            "     ∞".into()
        } else {
            "    -∞".into()
        };
    }
    let d = if d == 0.0 { 0.0 } else { d };
    let text = format!("{d:.6e}");
    let (mantissa, exp) = text.split_once('e').unwrap_or((&text, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    const SUPER: [char; 10] = ['⁰', '¹', '²', '³', '⁴', '⁵', '⁶', '⁷', '⁸', '⁹'];
    let digits: String = format!("{:02}", exp.unsigned_abs())
        .chars()
        .map(|c| SUPER[c.to_digit(10).unwrap_or(0) as usize])
        .collect();
    format!("{mantissa}×10{}{digits}", if exp < 0 { "⁻" } else { "" })
}

fn k8s_string<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let v = args[0].as_ref();
    let s = if let Some(d) = v.downcast_ref::<CelDouble>() {
        go_float(*d.inner())
    } else if let Some(i) = v.downcast_ref::<CelInt>() {
        i.inner().to_string()
    } else if let Some(u) = v.downcast_ref::<cel::common::types::CelUInt>() {
        u.inner().to_string()
    } else if let Some(b) = v.downcast_ref::<CelBool>() {
        b.inner().to_string()
    } else if let Some(s) = v.downcast_ref::<CelString>() {
        s.inner().to_string()
    } else if let Some(b) = v.downcast_ref::<cel::common::types::CelBytes>() {
        std::str::from_utf8(b.inner())
            .map_err(|_| {
                ExecutionError::function_error(
                    "string",
                    "invalid UTF-8 in bytes, cannot convert to string",
                )
            })?
            .to_string()
    } else {
        return Err(ExecutionError::no_such_overload(
            "string",
            vec![v.get_type().name().to_owned()],
        ));
    };
    ok(CelString::from(s))
}

/// `format()` for the clauses and arguments where it renders as Kubernetes does. Kubernetes'
/// `%f`, `%e`, and `%s` of lists and maps go through a locale-aware printer
/// (`1.500000×10⁰⁰`, `100,000.000000`); those are an error here rather than a different text.
fn k8s_format<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let f = "format";
    let err = |m: String| ExecutionError::function_error(f, m);
    let template = string(&args, 0)?;
    let list = items(&args[1])?;
    let mut out = String::with_capacity(template.len());
    let mut chars = template.chars().peekable();
    let mut next = 0usize;
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            out.push('%');
            continue;
        }
        // An optional precision, which only `%f` uses.
        let mut precision = 6usize;
        if chars.peek() == Some(&'.') {
            chars.next();
            let mut digits = String::new();
            while let Some(d) = chars.next_if(char::is_ascii_digit) {
                digits.push(d);
            }
            precision = digits
                .parse()
                .map_err(|_| err("could not parse precision".into()))?;
            if precision > 100 {
                return Err(err(format!(
                    "precision {precision} exceeds maximum allowed precision 100"
                )));
            }
        }
        let verb = chars
            .next()
            .ok_or_else(|| err("unexpected end of string".into()))?;
        let arg = *list
            .get(next)
            .ok_or_else(|| err(format!("index {next} out of range")))?;
        next += 1;
        let type_name = arg.get_type().name();
        let int = arg.downcast_ref::<CelInt>().map(|i| *i.inner());
        let uint = arg
            .downcast_ref::<cel::common::types::CelUInt>()
            .map(|u| *u.inner());
        let text = |v: &dyn Val| -> Option<String> {
            if let Some(s) = v.downcast_ref::<CelString>() {
                Some(s.inner().to_string())
            } else if let Some(b) = v.downcast_ref::<cel::common::types::CelBytes>() {
                std::str::from_utf8(b.inner()).ok().map(str::to_string)
            } else {
                None
            }
        };
        let signed = |i: i64, radix: &dyn Fn(u64) -> String| {
            format!(
                "{}{}",
                if i < 0 { "-" } else { "" },
                radix(i.unsigned_abs())
            )
        };
        let rendered = match verb {
            's' => {
                if let Some(d) = arg.downcast_ref::<CelDouble>() {
                    go_float(*d.inner())
                } else if let Some(i) = int {
                    i.to_string()
                } else if let Some(u) = uint {
                    u.to_string()
                } else if let Some(b) = arg.downcast_ref::<CelBool>() {
                    b.inner().to_string()
                } else if let Some(t) = text(arg) {
                    t
                } else if type_name == "null_type" {
                    "null".into()
                } else if let Some(t) = arg.downcast_ref::<cel::common::types::CelType>() {
                    t.name().to_string()
                } else {
                    return Err(err(format!(
                        "%s of {type_name} is rendered differently by Kubernetes and is not supported"
                    )));
                }
            }
            'd' => match (int, uint) {
                (Some(i), _) => i.to_string(),
                (_, Some(u)) => u.to_string(),
                _ => {
                    return Err(err(format!(
                        "decimal clause can only be used on integers, was given {type_name}"
                    )));
                }
            },
            'b' | 'o' | 'x' | 'X' => {
                let radix = |u: u64| match verb {
                    'b' => format!("{u:b}"),
                    'o' => format!("{u:o}"),
                    'x' => format!("{u:x}"),
                    _ => format!("{u:X}"),
                };
                if let Some(i) = int {
                    signed(i, &radix)
                } else if let Some(u) = uint {
                    radix(u)
                } else if let (Some(b), 'b') = (arg.downcast_ref::<CelBool>(), verb) {
                    u8::from(*b.inner()).to_string()
                } else if let (true, Some(s)) =
                    (matches!(verb, 'x' | 'X'), arg.downcast_ref::<CelString>())
                {
                    s.inner()
                        .bytes()
                        .map(|b| radix(u64::from(b)).to_string())
                        .map(|h| if h.len() == 1 { format!("0{h}") } else { h })
                        .collect()
                } else if let (true, Some(b)) = (
                    matches!(verb, 'x' | 'X'),
                    arg.downcast_ref::<cel::common::types::CelBytes>(),
                ) {
                    b.inner()
                        .iter()
                        .map(|b| radix(u64::from(*b)))
                        .map(|h| if h.len() == 1 { format!("0{h}") } else { h })
                        .collect()
                } else {
                    return Err(err(format!("clause %{verb} cannot format {type_name}")));
                }
            }
            'f' | 'e' => match arg.downcast_ref::<CelDouble>() {
                Some(d) if verb == 'f' => fixed_point(*d.inner(), precision),
                Some(d) => scientific(*d.inner()),
                None => {
                    let clause = if verb == 'f' {
                        "fixed-point"
                    } else {
                        "scientific"
                    };
                    return Err(err(format!(
                        "{clause} clause can only be used on doubles, was given {type_name}"
                    )));
                }
            },
            other => {
                return Err(err(format!(
                    "could not parse formatting clause: unrecognized formatting clause \"{other}\""
                )));
            }
        };
        out.push_str(&rendered);
    }
    ok(CelString::from(out))
}

// ---- lists ext v3: first, last ----

fn first<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let list = items(&args[0])?;
    ok(match list.first() {
        Some(x) => CelOptional::of(x.clone_as_boxed()),
        None => CelOptional::none(),
    })
}
fn last<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let list = items(&args[0])?;
    ok(match list.last() {
        Some(x) => CelOptional::of(x.clone_as_boxed()),
        None => CelOptional::none(),
    })
}

// ---- two-variable comprehensions ----

/// What the two-variable macros build their maps with: `@mapInsert(map, key, value)` adds one
/// entry, `@mapInsert(map, other)` all of `other`'s; a key already there is an error.
const MAP_INSERT: &str = "@mapInsert";

fn map_entries<'x, 'v>(m: &'x CowVal<'_, 'v>) -> Result<&'x CelMap<'v>, ExecutionError> {
    m.downcast_ref::<CelMap>()
        .ok_or_else(|| ExecutionError::UnexpectedType {
            got: m.get_type().name().to_owned(),
            want: "map".to_owned(),
        })
}

fn insert<'v>(
    out: &mut std::collections::HashMap<CelMapKey<'v>, Box<dyn Val + 'v>>,
    key: CelMapKey<'v>,
    value: Box<dyn Val + 'v>,
) -> Result<(), ExecutionError> {
    if out.contains_key(&key) {
        return Err(ExecutionError::function_error(
            MAP_INSERT,
            "insert failed: key already exists",
        ));
    }
    out.insert(key, value);
    Ok(())
}

fn map_insert<'b, 'v>(args: Args<'b, 'v>) -> Ret<'b, 'v> {
    let base = map_entries(&args[0])?;
    let mut out: std::collections::HashMap<CelMapKey<'v>, Box<dyn Val + 'v>> = base
        .inner()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone_as_boxed()))
        .collect();
    let mut args = args.into_iter().skip(1);
    match (args.next(), args.next()) {
        (Some(key), Some(value)) => {
            let key = CelMapKey::try_from(key)
                .map_err(|_| ExecutionError::function_error(MAP_INSERT, "unsupported map key"))?;
            insert(&mut out, key, value.into_owned())?;
        }
        (Some(entries), None) => {
            for (k, v) in map_entries(&entries)?.inner() {
                insert(&mut out, k.clone(), v.clone_as_boxed())?;
            }
        }
        _ => return Err(ExecutionError::invalid_argument_count(3, 1)),
    }
    ok(CelMap::from(out))
}

#[derive(Clone, Copy)]
enum TwoVar {
    All,
    Exists,
    ExistsOne,
    TransformList,
    TransformMap,
    TransformMapEntry,
}

/// `range.all(i, v, p)` and friends: comprehensions with two iteration variables (index and
/// element of a list, key and value of a map), which the evaluator runs.
fn two_var_macro(name: &'static str, kind: TwoVar, with_filter: bool) -> Macro {
    Macro::receiver(
        name,
        if with_filter { 4 } else { 3 },
        move |helper, target, args| {
            let ident =
                |helper: &mut cel::parser::MacroExprHelper<'_>, e: &cel::IdedExpr| match &e.expr {
                    Expr::Ident(n) => Ok(n.clone()),
                    _ => Err(helper.new_error(e.id, "argument must be a simple name")),
                };
            let v1 = ident(helper, &args[0])?;
            let v2 = ident(helper, &args[1])?;
            let body = args.pop().expect("arguments");
            let filter = if with_filter { args.pop() } else { None };
            let accu = "@result".to_string();
            let next = |helper: &mut cel::parser::MacroExprHelper<'_>, e: Expr| helper.next_expr(e);
            let call = |helper: &mut cel::parser::MacroExprHelper<'_>,
                        f: &str,
                        args: Vec<cel::IdedExpr>| {
                helper.next_expr(Expr::Call(cel::common::ast::CallExpr {
                    func_name: f.to_string(),
                    target: None,
                    args,
                }))
            };
            let lit_bool = |helper: &mut cel::parser::MacroExprHelper<'_>, b: bool| {
                helper.next_expr(Expr::Literal(LiteralValue::Boolean(b.into())))
            };
            let acc = |helper: &mut cel::parser::MacroExprHelper<'_>| {
                helper.next_expr(Expr::Ident("@result".to_string()))
            };
            let (init, cond, step, result) = match kind {
                TwoVar::All => {
                    let init = lit_bool(helper, true);
                    let a = acc(helper);
                    let cond = call(helper, "@not_strictly_false", vec![a]);
                    let a = acc(helper);
                    let step = call(helper, "_&&_", vec![a, body]);
                    (init, cond, step, acc(helper))
                }
                TwoVar::Exists => {
                    let init = lit_bool(helper, false);
                    let a = acc(helper);
                    let not = call(helper, "!_", vec![a]);
                    let cond = call(helper, "@not_strictly_false", vec![not]);
                    let a = acc(helper);
                    let step = call(helper, "_||_", vec![a, body]);
                    (init, cond, step, acc(helper))
                }
                TwoVar::ExistsOne => {
                    let init = next(helper, Expr::Literal(LiteralValue::Int(0.into())));
                    let cond = lit_bool(helper, true);
                    let a = acc(helper);
                    let one = next(helper, Expr::Literal(LiteralValue::Int(1.into())));
                    let plus = call(helper, "_+_", vec![a, one]);
                    let a = acc(helper);
                    let step = call(helper, "_?_:_", vec![body, plus, a]);
                    let a = acc(helper);
                    let one = next(helper, Expr::Literal(LiteralValue::Int(1.into())));
                    let result = call(helper, "_==_", vec![a, one]);
                    (init, cond, step, result)
                }
                TwoVar::TransformList | TwoVar::TransformMap | TwoVar::TransformMapEntry => {
                    let init = match kind {
                        TwoVar::TransformList => {
                            next(helper, Expr::List(ListExpr::new(Vec::new())))
                        }
                        _ => next(
                            helper,
                            Expr::Map(cel::common::ast::MapExpr {
                                entries: Vec::new(),
                            }),
                        ),
                    };
                    let cond = lit_bool(helper, true);
                    let a = acc(helper);
                    let grown = match kind {
                        TwoVar::TransformList => {
                            let one = next(helper, Expr::List(ListExpr::new(vec![body])));
                            call(helper, "_+_", vec![a, one])
                        }
                        TwoVar::TransformMap => {
                            let key = next(helper, Expr::Ident(v1.clone()));
                            call(helper, MAP_INSERT, vec![a, key, body])
                        }
                        _ => call(helper, MAP_INSERT, vec![a, body]),
                    };
                    let step = match filter {
                        Some(f) => {
                            let a = acc(helper);
                            call(helper, "_?_:_", vec![f, grown, a])
                        }
                        None => grown,
                    };
                    (init, cond, step, acc(helper))
                }
            };
            let range = target.take().expect("receiver macro");
            Ok(Some(helper.next_expr(Expr::Comprehension(Box::new(
                ComprehensionExpr {
                    iter_range: range,
                    iter_var: v1,
                    iter_var2: Some(v2),
                    accu_var: accu,
                    accu_init: init,
                    loop_cond: cond,
                    loop_step: step,
                    result,
                },
            )))))
        },
    )
}

/// `cel.bind(name, init, body)`: `body` with `name` bound to `init`, evaluated once. Expanded,
/// as cel-go does, into a comprehension over an empty list whose accumulator is the binding.
fn bind_macro() -> Macro {
    Macro::receiver("bind", 3, |helper, target, args| {
        let is_cel = matches!(target.as_ref().map(|t| &t.expr), Some(Expr::Ident(n)) if n == "cel");
        if !is_cel {
            return Ok(None);
        }
        let name = match &args[0].expr {
            Expr::Ident(n) => n.clone(),
            _ => {
                return Err(helper.new_error(
                    args[0].id,
                    "cel.bind() variable names must be simple identifiers",
                ));
            }
        };
        let body = args.pop().expect("three arguments");
        let init = args.pop().expect("three arguments");
        let bind = ComprehensionExpr {
            iter_range: helper.next_expr(Expr::List(ListExpr::new(Vec::new()))),
            iter_var: "#unused".to_owned(),
            iter_var2: None,
            accu_var: name.clone(),
            accu_init: init,
            loop_cond: helper.next_expr(Expr::Literal(LiteralValue::Boolean(false.into()))),
            loop_step: helper.next_expr(Expr::Ident(name)),
            result: body,
        };
        Ok(Some(helper.next_expr(Expr::Comprehension(Box::new(bind)))))
    })
}

/// The quantity or version method `name` for a receiver of that type with an argument like
/// `arg`: the evaluator calls these directly, skipping the interpreter's overload lookup.
pub(crate) fn kubernetes_member(
    name: &str,
    recv: &dyn Val,
    arg: Option<&dyn Val>,
) -> Option<cel::common::functions::Function> {
    let quantity = recv.downcast_ref::<QuantityVal>().is_some();
    let version = recv.downcast_ref::<SemverVal>().is_some();
    let same = arg.is_some_and(|a| a.get_type() == recv.get_type());
    let int_arg = arg.is_some_and(|a| a.downcast_ref::<CelInt>().is_some());
    Some(match (name, quantity, version, arg.is_some()) {
        ("compareTo", true, _, _) if same => q_compare_to,
        ("isGreaterThan", true, _, _) if same => q_greater,
        ("isLessThan", true, _, _) if same => q_less,
        ("add", true, _, _) if same => q_add,
        ("add", true, _, _) if int_arg => q_add_int,
        ("sub", true, _, _) if same => q_sub,
        ("sub", true, _, _) if int_arg => q_sub_int,
        ("asInteger", true, _, false) => q_as_integer,
        ("isInteger", true, _, false) => q_is_integer,
        ("asApproximateFloat", true, _, false) => q_float,
        ("compareTo", _, true, _) if same => v_compare_to,
        ("isGreaterThan", _, true, _) if same => v_greater,
        ("isLessThan", _, true, _) if same => v_less,
        ("major", _, true, false) => v_major,
        ("minor", _, true, false) => v_minor,
        ("patch", _, true, false) => v_patch,
        _ => return None,
    })
}

/// `quantity("…")` and `semver("…")` of a valid literal, computed once at compile time.
pub(crate) fn fold_constant(call: &cel::common::ast::CallExpr) -> Option<Box<dyn Val>> {
    let [arg] = call.args.as_slice() else {
        return None;
    };
    let Expr::Literal(LiteralValue::String(s)) = &arg.expr else {
        return None;
    };
    if call.target.is_some() {
        return None;
    }
    match call.func_name.as_str() {
        "quantity" => s
            .inner()
            .parse::<Quantity>()
            .ok()
            .map(|q| Box::new(QuantityVal(q)) as Box<dyn Val>),
        "semver" => Version::parse(s.inner())
            .ok()
            .map(|v| Box::new(SemverVal(v)) as Box<dyn Val>),
        _ => None,
    }
}

/// Registers everything above on `env`.
pub(crate) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let q = || t(&QUANTITY_TYPE);
    let v = || t(&SEMVER_TYPE);
    let s = || t(&STRING_TYPE);
    let l = || t(&LIST_TYPE);

    env.add_overload("quantity", "string_to_quantity", vec![s()], quantity_of)?;
    env.add_overload("isQuantity", "is_quantity_string", vec![s()], is_quantity)?;
    env.add_member_overload(
        "compareTo",
        "quantity_compare_to",
        q(),
        vec![q()],
        q_compare_to,
    )?;
    env.add_member_overload(
        "isGreaterThan",
        "quantity_is_greater_than",
        q(),
        vec![q()],
        q_greater,
    )?;
    env.add_member_overload(
        "isLessThan",
        "quantity_is_less_than",
        q(),
        vec![q()],
        q_less,
    )?;
    env.add_member_overload("add", "quantity_add", q(), vec![q()], q_add)?;
    env.add_member_overload(
        "add",
        "quantity_add_int",
        q(),
        vec![t(&INT_TYPE)],
        q_add_int,
    )?;
    env.add_member_overload("sub", "quantity_sub", q(), vec![q()], q_sub)?;
    env.add_member_overload(
        "sub",
        "quantity_sub_int",
        q(),
        vec![t(&INT_TYPE)],
        q_sub_int,
    )?;
    env.add_member_overload("asInteger", "quantity_get_int", q(), vec![], q_as_integer)?;
    env.add_member_overload(
        "isInteger",
        "quantity_is_integer",
        q(),
        vec![],
        q_is_integer,
    )?;
    env.add_member_overload(
        "asApproximateFloat",
        "quantity_get_float",
        q(),
        vec![],
        q_float,
    )?;
    env.add_overload("sign", "quantity_sign", vec![q()], q_sign)?;

    env.add_overload("semver", "string_to_semver", vec![s()], semver_of)?;
    env.add_overload(
        "semver",
        "string_bool_to_semver",
        vec![s(), t(&BOOL_TYPE)],
        semver_of_norm,
    )?;
    env.add_overload("isSemver", "is_semver_string", vec![s()], is_semver)?;
    env.add_overload(
        "isSemver",
        "is_semver_string_bool",
        vec![s(), t(&BOOL_TYPE)],
        is_semver_norm,
    )?;
    env.add_member_overload(
        "compareTo",
        "semver_compare_to",
        v(),
        vec![v()],
        v_compare_to,
    )?;
    env.add_member_overload(
        "isGreaterThan",
        "semver_is_greater_than",
        v(),
        vec![v()],
        v_greater,
    )?;
    env.add_member_overload("isLessThan", "semver_is_less_than", v(), vec![v()], v_less)?;
    env.add_member_overload("major", "semver_major", v(), vec![], v_major)?;
    env.add_member_overload("minor", "semver_minor", v(), vec![], v_minor)?;
    env.add_member_overload("patch", "semver_patch", v(), vec![], v_patch)?;

    env.add_member_overload("find", "string_find_string", s(), vec![s()], find)?;
    env.add_member_overload(
        "findAll",
        "string_find_all_string",
        s(),
        vec![s()],
        find_all,
    )?;
    env.add_member_overload(
        "findAll",
        "string_find_all_string_int",
        s(),
        vec![s(), t(&INT_TYPE)],
        find_all_limit,
    )?;

    env.add_member_overload("isSorted", "list_is_sorted", l(), vec![], is_sorted)?;
    env.add_member_overload("sum", "list_sum", l(), vec![], sum)?;
    env.add_member_overload("min", "list_min", l(), vec![], min)?;
    env.add_member_overload("max", "list_max", l(), vec![], max)?;
    env.add_member_overload(
        "indexOf",
        "list_index_of",
        l(),
        vec![t(&DYN_TYPE)],
        index_of,
    )?;
    env.add_member_overload(
        "lastIndexOf",
        "list_last_index_of",
        l(),
        vec![t(&DYN_TYPE)],
        last_index_of,
    )?;
    env.add_member_overload(
        "includes",
        "list_includes_dyn_dyn",
        t(&DYN_TYPE),
        vec![t(&DYN_TYPE)],
        includes,
    )?;

    env.add_overload(
        "sets.contains",
        "list_sets_contains_list",
        vec![l(), l()],
        sets_contains,
    )?;
    env.add_overload(
        "sets.equivalent",
        "list_sets_equivalent_list",
        vec![l(), l()],
        sets_equivalent,
    )?;
    env.add_overload(
        "sets.intersects",
        "list_sets_intersects_list",
        vec![l(), l()],
        sets_intersects,
    )?;

    env.add_overload(
        EQUALS,
        "k8s_equals",
        vec![t(&DYN_TYPE), t(&DYN_TYPE)],
        k8s_equals,
    )?;
    env.add_macro(bind_macro())?;
    env.add_overload(STRING, "k8s_string", vec![t(&DYN_TYPE)], k8s_string)?;
    env.add_overload(FORMAT, "k8s_format", vec![s(), t(&DYN_TYPE)], k8s_format)?;
    env.add_member_overload("first", "list_first", l(), vec![], first)?;
    env.add_member_overload("last", "list_last", l(), vec![], last)?;
    env.add_overload(
        MAP_INSERT,
        "map_insert_key_value",
        vec![t(&DYN_TYPE), t(&DYN_TYPE), t(&DYN_TYPE)],
        map_insert,
    )?;
    env.add_overload(
        MAP_INSERT,
        "map_insert_map",
        vec![t(&DYN_TYPE), t(&DYN_TYPE)],
        map_insert,
    )?;
    for (name, kind) in [
        ("all", TwoVar::All),
        ("exists", TwoVar::Exists),
        ("existsOne", TwoVar::ExistsOne),
        ("exists_one", TwoVar::ExistsOne),
        ("transformList", TwoVar::TransformList),
        ("transformMap", TwoVar::TransformMap),
        ("transformMapEntry", TwoVar::TransformMapEntry),
    ] {
        env.add_macro(two_var_macro(name, kind, false))?;
        if matches!(
            kind,
            TwoVar::TransformList | TwoVar::TransformMap | TwoVar::TransformMapEntry
        ) {
            env.add_macro(two_var_macro(name, kind, true))?;
        }
    }
    Ok(())
}
