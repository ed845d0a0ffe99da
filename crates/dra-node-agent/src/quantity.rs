//! A strict reading of Kubernetes quantities (`resource.Quantity`), for the memory limits of a
//! claim's opaque config. The value comes from `dra_quantity`, the workspace's one
//! implementation of Kubernetes' `ParseQuantity`; this module only refuses more, and says why
//! in words a config author can act on:
//!
//! ```text
//! quantity = [ "+" | "-" ] number suffix
//! number   = digits | digits "." [ digits ] | "." digits
//! suffix   = "" | "m" | "k" | "M" | "G" | "T" | "P" | "E"      (decimal)
//!          | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"           (binary)
//!          | ( "e" | "E" ) [ "+" | "-" ] digits                 (exponent)
//! ```
//!
//! Stricter than Kubernetes on purpose: the number must have a digit (Kubernetes reads `Gi`,
//! `.` and `-` as zero, which in a limit is surely a typo), and negative values are refused (a
//! limit cannot be negative). Like Kubernetes: no whitespace, no control characters, no units
//! such as `GB`, and the value is exact, rounded up to a whole unit as `Value()` does, with
//! binary quantities capped at the largest `int64`.

use std::fmt;

use dra_quantity::Quantity;

/// Why a quantity string was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantityError {
    /// Not a quantity at all; says what is wrong.
    Syntax(String),
    /// A valid quantity below zero.
    Negative,
    /// A valid quantity too large (or too long) to compute exactly here.
    OutOfRange,
}

impl fmt::Display for QuantityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuantityError::Syntax(why) => write!(f, "not a Kubernetes quantity: {why}"),
            QuantityError::Negative => f.write_str("negative"),
            QuantityError::OutOfRange => f.write_str("out of range"),
        }
    }
}

/// Parses `text` as a non-negative Kubernetes quantity and returns its value in whole units,
/// rounded up (`"1.5Ki"` is 1536, `"100m"` is 1).
pub fn parse_units(text: &str) -> Result<u128, QuantityError> {
    if text.is_empty() {
        return Err(QuantityError::Syntax("empty".into()));
    }
    if let Some(c) = text
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    {
        return Err(QuantityError::Syntax(format!("unexpected character {c:?}")));
    }
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    let number_end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_end);
    if !number.bytes().any(|b| b.is_ascii_digit()) {
        return Err(QuantityError::Syntax("no digits".into()));
    }
    if number.matches('.').count() > 1 {
        return Err(QuantityError::Syntax("more than one decimal point".into()));
    }
    let quantity: Quantity = text.parse().map_err(|e| match e {
        dra_quantity::QuantityError::OutOfRange(_) => QuantityError::OutOfRange,
        _ => QuantityError::Syntax(format!("unknown suffix {suffix:?}")),
    })?;
    if quantity.sign() < 0 {
        return Err(QuantityError::Negative);
    }
    const NANOS_PER_UNIT: i128 = 1_000_000_000;
    let units = quantity.nanos().div_euclid(NANOS_PER_UNIT)
        + i128::from(quantity.nanos().rem_euclid(NANOS_PER_UNIT) != 0);
    u128::try_from(units).map_err(|_| QuantityError::OutOfRange)
}

/// A byte count as a quantity, in the largest binary unit that writes it exactly
/// (`24Gi`, `1536Mi`, `1000`).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes == 0 {
        return "0".into();
    }
    let mut value = bytes;
    let mut unit = "";
    for u in UNITS {
        if !value.is_multiple_of(1024) {
            break;
        }
        value /= 1024;
        unit = u;
    }
    format!("{value}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_binary_decimal_and_exponent_forms() {
        for (text, want) in [
            ("0", 0),
            ("1024", 1024),
            ("+2", 2),
            ("1Ki", 1024),
            ("4Gi", 4 << 30),
            ("1.5Gi", 3 << 29),
            ("0.5Mi", 1 << 19),
            (".5Ki", 512),
            ("1.Ki", 1024),
            ("10G", 10_000_000_000),
            ("1M", 1_000_000),
            ("1e9", 1_000_000_000),
            ("1E3", 1000),
            ("1E", 1_000_000_000_000_000_000),
            ("25e-1", 3),
            ("100m", 1),
            ("1500m", 2),
            ("1e-100", 1),
            ("-0", 0),
            ("0.000Gi", 0),
        ] {
            assert_eq!(parse_units(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn anything_outside_the_grammar_is_refused_with_the_reason() {
        let syntax = |t: &str| match parse_units(t) {
            Err(QuantityError::Syntax(why)) => why,
            other => panic!("{t:?}: {other:?}"),
        };
        assert_eq!(syntax(""), "empty");
        assert_eq!(syntax("4Gi\nquit"), "unexpected character '\\n'");
        assert_eq!(syntax("4Gi quit"), "unexpected character ' '");
        assert_eq!(syntax(" 4Gi"), "unexpected character ' '");
        assert_eq!(syntax("4Gi\0"), "unexpected character '\\0'");
        assert_eq!(syntax("../4Gi"), "unexpected character '/'");
        assert_eq!(syntax("4GB"), "unknown suffix \"GB\"");
        assert_eq!(syntax("4gi"), "unknown suffix \"gi\"");
        assert_eq!(syntax("lots"), "no digits");
        assert_eq!(syntax("1e"), "unknown suffix \"e\"");
        assert_eq!(syntax("1e+"), "unknown suffix \"e+\"");
        assert_eq!(syntax("1e1.5"), "unknown suffix \"e1.5\"");
        assert_eq!(syntax("1.2.3"), "more than one decimal point");
        assert_eq!(syntax("Gi"), "no digits");
        assert_eq!(syntax("--1"), "no digits");
        assert_eq!(syntax("."), "no digits");
        assert_eq!(syntax("4Gi4"), "unknown suffix \"Gi4\"");
        assert_eq!(syntax("１Gi"), "unexpected character '１'");
    }

    /// Kubernetes reads an empty number as zero; a limit written that way is a typo.
    #[test]
    fn stricter_than_kubernetes_where_a_limit_needs_it() {
        for no_digits in ["Gi", "k", ".", "-", "+", "e3"] {
            assert_eq!(
                parse_units(no_digits),
                Err(QuantityError::Syntax("no digits".into())),
                "{no_digits:?}"
            );
            assert!(no_digits.parse::<Quantity>().is_ok(), "{no_digits:?}");
        }
        assert_eq!(parse_units("-1"), Err(QuantityError::Negative));
        // As Kubernetes: binary values are capped at the largest int64.
        assert_eq!(parse_units("100Ei"), Ok(i64::MAX as u128));
    }

    #[test]
    fn negative_and_huge_values_are_refused() {
        assert_eq!(parse_units("-1Gi"), Err(QuantityError::Negative));
        assert_eq!(parse_units("-0.5"), Err(QuantityError::Negative));
        assert_eq!(parse_units("1e39"), Err(QuantityError::OutOfRange));
        assert_eq!(parse_units("1e999999999"), Err(QuantityError::OutOfRange));
        assert_eq!(parse_units(&"9".repeat(39)), Err(QuantityError::OutOfRange));
        assert_eq!(
            parse_units(&format!("{}Ei", "9".repeat(30))),
            Err(QuantityError::OutOfRange)
        );
    }

    #[test]
    fn bytes_are_written_in_the_largest_exact_binary_unit() {
        assert_eq!(format_bytes(0), "0");
        assert_eq!(format_bytes(1000), "1000");
        assert_eq!(format_bytes(1536 << 20), "1536Mi");
        assert_eq!(format_bytes(24 << 30), "24Gi");
        assert_eq!(format_bytes(1 << 50), "1Pi");
    }
}
