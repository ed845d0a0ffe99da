//! Exact Kubernetes resource quantities (`resource.Quantity`): the workspace's one parser.
//!
//! # Brief overview
//!
//! A [`Quantity`] is parsed with [`str::parse`] (or [`Quantity::from_openapi`]) exactly as
//! `ParseQuantity` in `k8s.io/apimachinery/pkg/api/resource` parses it, and written back with
//! [`Display`](std::fmt::Display) in the canonical text the API server stores. CEL's `quantity()`
//! (`dra-cel`), the allocator's capacity and counter arithmetic (`dra-allocator`), the engine's
//! pod resources and the node agent's memory limits all parse through here; a crate that is
//! stricter (the node agent refuses negative limits) wraps this parser rather than copying it.
//!
//! ```
//! use dra_quantity::{Format, Quantity, QuantityError};
//!
//! let q: Quantity = "1.5Gi".parse().unwrap();
//! assert_eq!(q.to_string(), "1536Mi");
//! assert_eq!(q, "1610612736".parse().unwrap());
//! assert_eq!(q.format(), Format::BinarySI);
//! assert_eq!("1e3".parse::<Quantity>().unwrap().to_string(), "1e3");
//! assert_eq!(" 1Gi".parse::<Quantity>(), Err(QuantityError::Format));
//! ```
//!
//! The grammar is Kubernetes' own, edge cases included: no whitespace anywhere (the API
//! server's JSON decoder trims it before parsing, `ParseQuantity` itself does not); suffixes
//! `n u m "" k M G T P E` (decimal), `Ki Mi Gi Ti Pi Ei` (binary) or an exponent `e`/`E` with an
//! optional sign, whose value Go truncates to 32 bits (`1e4294967299` is `1e3`); an empty
//! number is zero (`k`, `-`, `.`); `1.G` is allowed. Values are rounded away from zero to a
//! whole nano-unit, and binary quantities are capped at the largest `int64`.
//!
//! A quantity is held as a signed number of nano-units in an `i128`, so nanos are exact for
//! anything Kubernetes can represent up to about ±1.7·10²⁹ units. Larger values (`1e30`) fail
//! to parse with [`QuantityError::OutOfRange`] instead of being approximated; Kubernetes itself
//! would keep them as arbitrary-precision decimals. No floating point is used except in
//! [`Quantity::as_approximate_float`].
//!
//! Equality, ordering and hashing go by value only: `1Gi == 1024Mi == 1073741824`. The format the
//! quantity was written in (binary `Ki`…`Ei`, decimal `k`…`E`, or exponent `e3`) is kept, as
//! Kubernetes does, because it decides the canonical text [`Display`](std::fmt::Display) writes.

#![forbid(unsafe_code)]

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::{Add, Neg, Sub};
use std::str::FromStr;

const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// How a quantity was written, which decides how it is written back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Format {
    /// `Ki`, `Mi`, … `Ei` (powers of 1024).
    BinarySI,
    /// `n`, `u`, `m`, no suffix, `k`, `M`, … `E` (powers of 1000).
    #[default]
    DecimalSI,
    /// `1e3`, `5E-3`.
    DecimalExponent,
}

/// Why a string is not a quantity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error(
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    Format,
    #[error("unable to parse quantity's suffix")]
    Suffix,
    #[error("quantity {0:?} is out of the supported range (about ±1.7e29)")]
    OutOfRange(String),
}

/// How Kubernetes' `resource.Quantity` would hold the same value internally: a scaled `int64`
/// or an arbitrary-precision decimal. It does not change the value, but Kubernetes' CEL
/// `isInteger()`/`asInteger()` answer from it (`quantity("1000m").isInteger()` is false there),
/// so it is tracked through parsing and arithmetic to answer the same.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Repr {
    #[default]
    Zero,
    Int {
        value: i64,
        scale: i32,
    },
    Dec,
}

/// `base × 10^scale`, if it fits.
fn positive_scale(base: i64, scale: i32) -> Option<i64> {
    let mut v = base;
    for _ in 0..scale {
        v = v.checked_mul(10)?;
    }
    Some(v)
}

impl Repr {
    fn int(self) -> Option<(i64, i32)> {
        match self {
            Repr::Zero => Some((0, 0)),
            Repr::Int { value, scale } => Some((value, scale)),
            Repr::Dec => None,
        }
    }

    /// Kubernetes' `int64Amount.Add`, falling back to a decimal on overflow.
    fn add(self, other: Repr) -> Repr {
        let (Some((a, sa)), Some((b, sb))) = (self.int(), other.int()) else {
            return Repr::Dec;
        };
        let sum = if b == 0 {
            Some((a, sa))
        } else if a == 0 {
            Some((b, sb))
        } else if sa == sb {
            a.checked_add(b).map(|v| (v, sa))
        } else if sa > sb {
            positive_scale(a, sa - sb)
                .and_then(|a| a.checked_add(b))
                .map(|v| (v, sb))
        } else {
            positive_scale(b, sb - sa)
                .and_then(|b| a.checked_add(b))
                .map(|v| (v, sa))
        };
        sum.map_or(Repr::Dec, |(value, scale)| Repr::Int { value, scale })
    }

    fn neg(self) -> Repr {
        match self {
            Repr::Int { value, scale } => Repr::Int {
                value: value.wrapping_neg(),
                scale,
            },
            other => other,
        }
    }
}

/// An exact Kubernetes resource quantity.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quantity {
    nanos: i128,
    format: Format,
    repr: Repr,
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}
impl Eq for Quantity {}
impl Hash for Quantity {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.nanos.hash(state);
    }
}
impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

fn pow10(exp: u32) -> Option<i128> {
    10i128.checked_pow(exp)
}

/// `a / b` rounded away from zero (Kubernetes' `inf.RoundUp`), `b > 0`.
fn div_round_up(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b == 0 {
        q
    } else if a > 0 {
        q + 1
    } else {
        q - 1
    }
}

impl Quantity {
    /// The zero quantity, `0`.
    pub const ZERO: Quantity = Quantity {
        nanos: 0,
        format: Format::DecimalSI,
        repr: Repr::Zero,
    };

    /// `value` whole units, written in `format`.
    pub fn from_integer(value: i64, format: Format) -> Self {
        Quantity {
            nanos: value as i128 * NANOS_PER_UNIT,
            format,
            repr: Repr::Int { value, scale: 0 },
        }
    }

    /// `value` thousandths of a unit (`DecimalSI`).
    pub fn from_milli(value: i64) -> Self {
        Quantity {
            nanos: value as i128 * 1_000_000,
            format: Format::DecimalSI,
            repr: Repr::Int { value, scale: -3 },
        }
    }

    /// `value` nano-units, written in `format`.
    pub fn from_nanos(nanos: i128, format: Format) -> Self {
        let repr = i64::try_from(nanos).map_or(Repr::Dec, |value| Repr::Int { value, scale: -9 });
        Quantity {
            nanos,
            format,
            repr,
        }
    }

    /// The exact value in nano-units.
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// -1, 0 or 1.
    pub fn sign(&self) -> i64 {
        self.nanos.signum() as i64
    }

    /// The value as an `i64` when it is a whole number that fits (Kubernetes' `AsInt64`).
    pub fn as_integer(&self) -> Option<i64> {
        if self.nanos % NANOS_PER_UNIT != 0 {
            return None;
        }
        i64::try_from(self.nanos / NANOS_PER_UNIT).ok()
    }

    /// The value as an `i64` exactly when Kubernetes' `Quantity.AsInt64` gives one, which is
    /// what CEL's `isInteger()` and `asInteger()` answer from. That depends on how the quantity
    /// was written and computed, not only on its value: `1000m` and `0.0` are not integers
    /// there, and neither is anything written with more than 18 digits.
    pub fn as_int64_like_kubernetes(&self) -> Option<i64> {
        match self.repr {
            Repr::Zero => Some(0),
            Repr::Int { value, scale } if scale >= 0 => positive_scale(value, scale),
            _ => None,
        }
    }

    /// Whole units, rounded away from zero (Kubernetes' `Value`); `None` past `i64`.
    pub fn value(&self) -> Option<i64> {
        i64::try_from(div_round_up(self.nanos, NANOS_PER_UNIT)).ok()
    }

    /// Thousandths, rounded away from zero (Kubernetes' `MilliValue`); `None` past `i64`.
    pub fn milli_value(&self) -> Option<i64> {
        i64::try_from(div_round_up(self.nanos, 1_000_000)).ok()
    }

    /// The only lossy view: the value as the nearest `f64`.
    pub fn as_approximate_float(&self) -> f64 {
        let whole = self.nanos / NANOS_PER_UNIT;
        let frac = self.nanos % NANOS_PER_UNIT;
        whole as f64 + frac as f64 / NANOS_PER_UNIT as f64
    }

    /// `self + other`, `None` on overflow. The result keeps `self`'s format unless `self` is
    /// zero, as Kubernetes does.
    pub fn checked_add(&self, other: &Quantity) -> Option<Quantity> {
        let nanos = self.nanos.checked_add(other.nanos)?;
        Some(Quantity {
            nanos,
            format: self.result_format(other),
            repr: self.repr.add(other.repr),
        })
    }

    /// `self - other`, `None` on overflow.
    pub fn checked_sub(&self, other: &Quantity) -> Option<Quantity> {
        let nanos = self.nanos.checked_sub(other.nanos)?;
        let repr = self.repr.add(other.repr.neg());
        Some(Quantity {
            nanos,
            format: self.result_format(other),
            repr,
        })
    }

    fn result_format(&self, other: &Quantity) -> Format {
        if self.is_zero() {
            other.format
        } else {
            self.format
        }
    }

    /// Parses a Kubernetes API quantity.
    pub fn from_openapi(
        q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    ) -> Result<Quantity, QuantityError> {
        q.0.parse()
    }

    /// The canonical text, as the API server would store it.
    pub fn to_openapi(&self) -> k8s_openapi::apimachinery::pkg::api::resource::Quantity {
        k8s_openapi::apimachinery::pkg::api::resource::Quantity(self.to_string())
    }
}

impl Add for Quantity {
    type Output = Quantity;
    /// Saturates at the ends of the range rather than panicking; see [`Quantity::checked_add`].
    fn add(self, rhs: Quantity) -> Quantity {
        self.checked_add(&rhs).unwrap_or(Quantity {
            nanos: if rhs.nanos > 0 { i128::MAX } else { i128::MIN },
            format: self.result_format(&rhs),
            repr: Repr::Dec,
        })
    }
}

impl Sub for Quantity {
    type Output = Quantity;
    /// Saturates at the ends of the range rather than panicking; see [`Quantity::checked_sub`].
    fn sub(self, rhs: Quantity) -> Quantity {
        self.checked_sub(&rhs).unwrap_or(Quantity {
            nanos: if rhs.nanos < 0 { i128::MAX } else { i128::MIN },
            format: self.result_format(&rhs),
            repr: Repr::Dec,
        })
    }
}

impl Neg for Quantity {
    type Output = Quantity;
    fn neg(self) -> Quantity {
        Quantity {
            nanos: self.nanos.checked_neg().unwrap_or(i128::MAX),
            format: self.format,
            repr: self.repr.neg(),
        }
    }
}

const SUFFIX_CHARS: &[u8] = b"eEinumkKMGTP";

/// base, exponent, format of a suffix.
fn interpret_suffix(suffix: &str) -> Option<(u32, i64, Format)> {
    let decimal = |e| Some((10, e, Format::DecimalSI));
    let binary = |e| Some((2, e, Format::BinarySI));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        s if s.len() > 1 && (s.starts_with('e') || s.starts_with('E')) => {
            // Go's strconv.ParseInt: optional sign, decimal digits.
            let rest = &s[1..];
            let digits = rest.strip_prefix(['+', '-']).unwrap_or(rest);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let exp: i64 = rest.parse().ok()?;
            // Go parses 64 bits and then keeps the low 32 (`int32(parsed)`): `e4294967299` is `e3`.
            Some((10, i64::from(exp as i32), Format::DecimalExponent))
        }
        _ => None,
    }
}

/// Splits like Kubernetes' parser: sign, integer digits, fraction digits, suffix.
fn split(s: &str) -> Result<(bool, &str, &str, &str), QuantityError> {
    let b = s.as_bytes();
    let end = b.len();
    let mut pos = 0;
    let mut positive = true;
    if pos < end && (b[0] == b'-' || b[0] == b'+') {
        positive = b[0] == b'+';
        pos += 1;
    }
    while pos < end && b[pos] == b'0' {
        pos += 1;
    }
    if pos >= end {
        return Ok((positive, "0", "", ""));
    }
    let num_start = pos;
    while pos < end && b[pos].is_ascii_digit() {
        pos += 1;
    }
    let num = if pos == num_start {
        "0"
    } else {
        &s[num_start..pos]
    };
    let mut denom = "";
    if pos < end && b[pos] == b'.' {
        pos += 1;
        let start = pos;
        while pos < end && b[pos].is_ascii_digit() {
            pos += 1;
        }
        denom = &s[start..pos];
    }
    let suffix_start = pos;
    while pos < end && SUFFIX_CHARS.contains(&b[pos]) {
        pos += 1;
    }
    if pos < end && (b[pos] == b'-' || b[pos] == b'+') {
        pos += 1;
    }
    while pos < end && b[pos].is_ascii_digit() {
        pos += 1;
    }
    if pos < end {
        return Err(QuantityError::Format);
    }
    Ok((positive, num, denom, &s[suffix_start..]))
}

/// Parses a run of decimal digits, `None` if it does not fit.
fn digits_value(d: &str) -> Option<i128> {
    d.bytes().try_fold(0i128, |acc, c| {
        acc.checked_mul(10)?.checked_add((c - b'0') as i128)
    })
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(QuantityError::Format);
        }
        let (positive, num, denom, suffix) = split(s)?;
        let (base, exp, mut format) = interpret_suffix(suffix).ok_or(QuantityError::Suffix)?;
        let repr = if s == "0" {
            Repr::Zero
        } else {
            fast_repr(positive, num, denom, base, exp)
        };
        let out_of_range = || QuantityError::OutOfRange(s.to_string());
        // Trailing fraction zeros change nothing; dropping them keeps the digits small.
        let denom = denom.trim_end_matches('0');
        let num = num.trim_start_matches('0');
        // Whole numbers, by far the most common, need no copy.
        let digits: std::borrow::Cow<'_, str> = if denom.is_empty() {
            num.into()
        } else {
            format!("{num}{denom}").into()
        };
        let digits = digits.trim_start_matches('0');
        let mut nanos: i128 = if digits.is_empty() {
            0
        } else if base == 10 {
            // value = digits × 10^(exp − len(denom)); in nanos, shift by 9 more.
            let shift = exp + 9 - denom.len() as i64;
            if shift >= 0 {
                let m = pow10(u32::try_from(shift).map_err(|_| out_of_range())?)
                    .ok_or_else(out_of_range)?;
                digits_value(digits)
                    .and_then(|d| d.checked_mul(m))
                    .ok_or_else(out_of_range)?
            } else {
                let drop = usize::try_from(-shift).map_err(|_| out_of_range())?;
                if drop >= digits.len() {
                    1 // a non-zero value below one nano rounds up to one nano
                } else {
                    let (keep, rest) = digits.split_at(digits.len() - drop);
                    let v = digits_value(keep).ok_or_else(out_of_range)?;
                    if rest.bytes().any(|c| c != b'0') {
                        v + 1
                    } else {
                        v
                    }
                }
            }
        } else {
            // value = digits × 2^exp / 10^len(denom); in nanos, × 10^9.
            let d = digits_value(digits).ok_or_else(out_of_range)?;
            let scaled = d.checked_mul(1i128 << exp).ok_or_else(out_of_range)?;
            let shift = 9 - denom.len() as i64;
            if shift >= 0 {
                scaled
                    .checked_mul(pow10(shift as u32).ok_or_else(out_of_range)?)
                    .ok_or_else(out_of_range)?
            } else {
                let div = pow10(u32::try_from(-shift).map_err(|_| out_of_range())?)
                    .ok_or_else(out_of_range)?;
                div_round_up(scaled, div)
            }
        };
        if format == Format::BinarySI {
            // Kubernetes caps binary quantities at the largest int64.
            let max = i64::MAX as i128 * NANOS_PER_UNIT;
            if nanos > max {
                nanos = max;
            }
            if nanos > 0 && nanos < NANOS_PER_UNIT {
                format = Format::DecimalSI;
            }
        }
        if !positive {
            nanos = -nanos;
        }
        Ok(Quantity {
            nanos,
            format,
            repr,
        })
    }
}

/// The scaled `int64` Kubernetes' parser produces on its fast path, or `Dec` where it falls
/// back to a decimal. `num` has no leading zeros ("0" when empty); `denom` is as written.
fn fast_repr(positive: bool, num: &str, denom: &str, base: u32, exp: i64) -> Repr {
    let digits = num.len() as i64 + denom.len() as i64;
    let (precision, scale, mantissa) = if base == 10 {
        (18 - digits, exp - denom.len() as i64, 1i64)
    } else if exp >= 0 && denom.is_empty() {
        // 2^exp has about exp·3/10 decimal digits.
        (15 - num.len() as i64 - exp * 3 / 10 - 1, 0, 1i64 << exp)
    } else {
        return Repr::Dec;
    };
    if precision < 0 || scale < -9 {
        return Repr::Dec;
    }
    let shifted = num.bytes().chain(denom.bytes()).try_fold(0i64, |acc, c| {
        acc.checked_mul(10)?.checked_add(i64::from(c - b'0'))
    });
    let Some(shifted) = shifted else {
        return Repr::Dec;
    };
    match (shifted.checked_mul(mantissa), i32::try_from(scale)) {
        (Some(v), Ok(scale)) => Repr::Int {
            value: if positive { v } else { -v },
            scale,
        },
        _ => Repr::Dec,
    }
}

fn decimal_suffix(exp: i64) -> Option<&'static str> {
    Some(match exp {
        -9 => "n",
        -6 => "u",
        -3 => "m",
        0 => "",
        3 => "k",
        6 => "M",
        9 => "G",
        12 => "T",
        15 => "P",
        18 => "E",
        _ => return None,
    })
}

impl fmt::Display for Quantity {
    /// Kubernetes' canonical form: `1Gi`, `1536Mi`, `1500m`, `1k`, `1e3`, `0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let mut format = self.format;
        if format == Format::BinarySI {
            let small = self.nanos.abs() < 1024 * NANOS_PER_UNIT;
            if small || self.nanos % NANOS_PER_UNIT != 0 {
                format = Format::DecimalSI;
            }
        }
        if format == Format::BinarySI {
            let mut units = self.nanos / NANOS_PER_UNIT;
            let mut exp = 0;
            while exp < 6 && units % 1024 == 0 {
                units /= 1024;
                exp += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][exp];
            return write!(f, "{units}{suffix}");
        }
        let mut mantissa = self.nanos;
        let mut exp: i64 = -9;
        while mantissa % 10 == 0 {
            mantissa /= 10;
            exp += 1;
        }
        while exp.rem_euclid(3) != 0 {
            // `mantissa` lost a factor of ten above, so this cannot overflow.
            mantissa *= 10;
            exp -= 1;
        }
        match (format, decimal_suffix(exp)) {
            (Format::DecimalSI, Some(suffix)) => write!(f, "{mantissa}{suffix}"),
            (_, _) if exp == 0 => write!(f, "{mantissa}"),
            _ => write!(f, "{mantissa}e{exp}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn canonical_forms_match_kubernetes() {
        let cases = [
            ("0", "0"),
            ("0Gi", "0"),
            ("1", "1"),
            ("1Gi", "1Gi"),
            ("1024Mi", "1Gi"),
            ("1.5Gi", "1536Mi"),
            ("0.5Ki", "512"),
            ("1023", "1023"),
            ("1000", "1k"),
            ("1100", "1100"),
            ("1.5", "1500m"),
            ("0.1", "100m"),
            ("100m", "100m"),
            ("1000m", "1"),
            ("1e3", "1e3"),
            ("1E3", "1e3"),
            ("1000e0", "1e3"),
            ("1.5e3", "1500"),
            ("5e-3", "5e-3"),
            ("1e-10", "1e-9"),
            ("0.0000000001", "1n"),
            ("-1.5Gi", "-1536Mi"),
            ("-100m", "-100m"),
            ("20G", "20G"),
            ("20Gi", "20Gi"),
            ("1M", "1M"),
            ("1E", "1E"),
            ("1Ei", "1Ei"),
            ("16Ei", "9223372036854775807"),
            ("+5", "5"),
            ("12e1", "120"),
            ("1.G", "1G"),
            (".5", "500m"),
            ("-", "0"),
            ("k", "0"),
            ("001", "1"),
        ];
        for (input, want) in cases {
            assert_eq!(q(input).to_string(), want, "{input}");
        }
    }

    #[test]
    fn values_compare_exactly() {
        assert_eq!(q("1Gi"), q("1024Mi"));
        assert_eq!(q("1Gi"), q("1073741824"));
        assert!(q("20Gi") > q("20G"));
        assert_eq!(q("1.5Gi").nanos(), 1_610_612_736 * NANOS_PER_UNIT);
        assert_eq!(q("1m").nanos(), 1_000_000);
        assert_eq!(q("1e3"), q("1k"));
        assert!(q("-1") < q("1m"));
        assert_eq!(q("0.1") + q("0.2"), q("300m"));
        assert_eq!(q("1Gi") - q("512Mi"), q("512Mi"));
        assert_eq!((q("1Gi") - q("512Mi")).to_string(), "512Mi");
        assert_eq!((Quantity::ZERO + q("1Ki")).to_string(), "1Ki");
    }

    #[test]
    fn malformed_strings_are_rejected() {
        for bad in [
            "", "abc", "1Gix", "1.5.5", "1K", "1ki", "1e", "1ee3", "Gi1", " 1", "1 ", "1e3.5",
            "--1",
        ] {
            assert!(bad.parse::<Quantity>().is_err(), "{bad:?} parsed");
        }
        assert!(matches!(
            "1e40".parse::<Quantity>(),
            Err(QuantityError::OutOfRange(_))
        ));
    }

    /// The copies this crate replaced disagreed on whitespace: the allocator's trimmed it, CEL's
    /// and the node agent's refused it. `ParseQuantity` refuses it, so all of them now do.
    #[test]
    fn whitespace_is_refused_anywhere() {
        for bad in [
            " 1", "1 ", "\t1", "1\n", "1 Gi", "1. 5", "- 1", "1e 3", "1e3 ", "\u{a0}1", " ",
        ] {
            assert_eq!(
                bad.parse::<Quantity>(),
                Err(QuantityError::Format),
                "{bad:?}"
            );
        }
        let api = k8s_openapi::apimachinery::pkg::api::resource::Quantity(" 1Gi".into());
        assert!(Quantity::from_openapi(&api).is_err());
    }

    /// The copies also disagreed on exponents: the allocator refused any beyond ±60 and
    /// accepted what Kubernetes truncates. Pinned here as Go's `ParseQuantity` answers.
    #[test]
    fn exponents_as_kubernetes_reads_them() {
        for (input, want) in [
            ("1e3", "1e3"),
            ("1E3", "1e3"),
            ("1e+3", "1e3"),
            ("1e-3", "1e-3"),
            ("1e0", "1"),
            ("1.5e1", "15"),
            ("1e-100", "1e-9"),
            ("-1e-100", "-1e-9"),
            ("0e100", "0"),
            ("0e-100", "0"),
            ("1e18", "1e18"),
            ("1e27", "1e27"),
            // Go keeps the low 32 bits of the exponent.
            ("1e4294967299", "1e3"),
            ("1e-4294967299", "1e-3"),
            ("1e4294967296", "1"),
        ] {
            assert_eq!(q(input).to_string(), want, "{input}");
        }
        assert_eq!(q("1e3").format(), Format::DecimalExponent);
        assert_eq!(q("1e-100").nanos(), 1, "below a nano rounds up to one");
        for (bad, err) in [
            ("1e", QuantityError::Suffix),
            ("1e+", QuantityError::Suffix),
            ("1e-", QuantityError::Suffix),
            ("1ee3", QuantityError::Suffix),
            ("1e3Ki", QuantityError::Format),
            ("1e1.5", QuantityError::Format),
            ("1e9223372036854775808", QuantityError::Suffix),
        ] {
            assert_eq!(bad.parse::<Quantity>(), Err(err), "{bad:?}");
        }
        // Exactly `E` alone is the exa suffix, not an exponent.
        assert_eq!(q("1E").to_string(), "1E");
        assert!(matches!(
            "1e30".parse::<Quantity>(),
            Err(QuantityError::OutOfRange(_))
        ));
    }

    #[test]
    fn maximum_sizes_and_rounding() {
        // Binary quantities are capped at the largest int64, decimal ones are not.
        assert_eq!(q("8Ei").to_string(), "9223372036854775807");
        assert_eq!(q("100Ei"), q("8Ei"));
        assert_eq!(q("100E").to_string(), "100E");
        // Below one, a binary quantity is written in decimal.
        assert_eq!(q("0.5").format(), Format::DecimalSI);
        assert_eq!(q("0.0001Ki").format(), Format::DecimalSI);
        // Rounded away from zero to a whole nano-unit.
        assert_eq!(q("1.0000000001").nanos(), 1_000_000_001);
        assert_eq!(q("-1.0000000001").nanos(), -1_000_000_001);
        assert_eq!(q("0.1n").to_string(), "1n");
        // Empty numbers are zero, as in Go.
        for zero in ["k", "-", "+", ".", "Gi", "-0", "0.000"] {
            assert!(q(zero).is_zero(), "{zero}");
        }
        assert!(matches!(
            "170141183460469231731687303716e0".parse::<Quantity>(),
            Err(QuantityError::OutOfRange(_))
        ));
    }

    #[test]
    fn integer_views() {
        assert_eq!(q("1Gi").as_integer(), Some(1 << 30));
        assert_eq!(q("1.5").as_integer(), None);
        assert_eq!(q("1.5").value(), Some(2));
        assert_eq!(q("-1.5").value(), Some(-2));
        assert_eq!(q("1.0001m").milli_value(), Some(2));
        assert_eq!(q("10E").as_integer(), None);
        assert_eq!(q("-5").sign(), -1);
        assert_eq!(q("2.5").as_approximate_float(), 2.5);
    }

    #[test]
    fn openapi_round_trip() {
        let api = k8s_openapi::apimachinery::pkg::api::resource::Quantity("1.5Gi".into());
        let parsed = Quantity::from_openapi(&api).unwrap();
        assert_eq!(parsed.to_openapi().0, "1536Mi");
    }
}
