//! A strict parser for Kubernetes quantities (`resource.Quantity`), for the memory limits of a
//! claim's opaque config. Only the quantity grammar is accepted:
//!
//! ```text
//! quantity = [ "+" | "-" ] number suffix
//! number   = digits | digits "." [ digits ] | "." digits
//! suffix   = "" | "m" | "k" | "M" | "G" | "T" | "P" | "E"      (decimal)
//!          | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"           (binary)
//!          | ( "e" | "E" ) [ "+" | "-" ] digits                 (exponent)
//! ```
//!
//! Nothing else: no whitespace, no control characters, no units such as `GB`. The value is
//! computed exactly with integers and rounded up to a whole unit, as Kubernetes' `Value()`
//! does. Negative values are refused (a limit cannot be negative). To keep the arithmetic
//! in `u128`, the number may have at most 38 digits and the result must fit; memory limits
//! are nowhere near either bound.

use std::fmt;

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

const MAX_DIGITS: usize = 38;

/// What the suffix multiplies by.
enum Scale {
    /// 1024^n.
    Binary(u32),
    /// 10^n.
    Decimal(i64),
}

fn scale(suffix: &str) -> Result<Scale, QuantityError> {
    Ok(match suffix {
        "" => Scale::Decimal(0),
        "m" => Scale::Decimal(-3),
        "k" => Scale::Decimal(3),
        "M" => Scale::Decimal(6),
        "G" => Scale::Decimal(9),
        "T" => Scale::Decimal(12),
        "P" => Scale::Decimal(15),
        "E" => Scale::Decimal(18),
        "Ki" => Scale::Binary(1),
        "Mi" => Scale::Binary(2),
        "Gi" => Scale::Binary(3),
        "Ti" => Scale::Binary(4),
        "Pi" => Scale::Binary(5),
        "Ei" => Scale::Binary(6),
        _ => {
            let unknown = || QuantityError::Syntax(format!("unknown suffix {suffix:?}"));
            let exponent = suffix.strip_prefix(['e', 'E']).ok_or_else(unknown)?;
            let (negative, digits) = match exponent.as_bytes().first() {
                Some(b'-') => (true, &exponent[1..]),
                Some(b'+') => (false, &exponent[1..]),
                _ => (false, exponent),
            };
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(unknown());
            }
            // Anything past a few digits is far outside what fits anyway.
            let magnitude: i64 = if digits.trim_start_matches('0').len() > 6 {
                1_000_000
            } else {
                digits.parse().expect("at most 6 digits")
            };
            Scale::Decimal(if negative { -magnitude } else { magnitude })
        }
    })
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
    let (negative, rest) = match text.as_bytes()[0] {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let number_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if fraction.contains('.') {
        return Err(QuantityError::Syntax("more than one decimal point".into()));
    }
    if whole.is_empty() && fraction.is_empty() {
        return Err(QuantityError::Syntax("no digits".into()));
    }
    if whole.len() + fraction.len() > MAX_DIGITS {
        return Err(QuantityError::OutOfRange);
    }
    let scale = scale(suffix)?;
    let fraction = fraction.trim_end_matches('0');
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().expect("at most 38 ASCII digits")
    };
    if mantissa == 0 {
        return Ok(0);
    }
    if negative {
        return Err(QuantityError::Negative);
    }
    let fraction_digits = fraction.len() as i64;
    match scale {
        Scale::Binary(power) => {
            let numerator = mantissa
                .checked_mul(1u128 << (10 * power))
                .ok_or(QuantityError::OutOfRange)?;
            Ok(numerator.div_ceil(10u128.pow(fraction_digits as u32)))
        }
        Scale::Decimal(exponent) => {
            let net = exponent - fraction_digits;
            if net >= 0 {
                u32::try_from(net)
                    .ok()
                    .and_then(|n| 10u128.checked_pow(n))
                    .and_then(|m| mantissa.checked_mul(m))
                    .ok_or(QuantityError::OutOfRange)
            } else if -net > MAX_DIGITS as i64 {
                // mantissa < 10^38 <= 10^-net: a positive fraction of a unit, rounded up.
                Ok(1)
            } else {
                Ok(mantissa.div_ceil(10u128.pow((-net) as u32)))
            }
        }
    }
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
