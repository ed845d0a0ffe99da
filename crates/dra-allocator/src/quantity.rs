//! Exact Kubernetes quantities, kept behind this module so the crate can switch to
//! `dra_cel::Quantity` once that lands without touching the solver.
//!
//! A quantity is held as a signed count of nano-units (10⁻⁹) in an `i128`: every value
//! the API accepts (up to exa-scale with binary suffixes) fits, and sums stay exact.
//! Precision below a nano-unit is rounded up, as the API server does.

use std::fmt;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

const NANO: i128 = 1_000_000_000;

/// An exact quantity in nano-units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    nano: i128,
}

/// A quantity string the parser rejects.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {0:?}")]
pub struct QuantityError(pub String);

impl Quantity {
    pub const ZERO: Quantity = Quantity { nano: 0 };

    pub fn from_nano(nano: i128) -> Self {
        Quantity { nano }
    }

    pub fn from_int(v: i64) -> Self {
        Quantity {
            nano: v as i128 * NANO,
        }
    }

    pub fn nano(self) -> i128 {
        self.nano
    }

    /// Parses an API quantity; errors name the offending string.
    pub fn from_openapi(q: &ApiQuantity) -> Result<Self, QuantityError> {
        q.0.parse()
    }

    /// The canonical decimal form (`12`, `1500m`, `3n`).
    pub fn to_openapi(self) -> ApiQuantity {
        ApiQuantity(self.to_string())
    }

    pub fn checked_add(self, o: Self) -> Option<Self> {
        self.nano.checked_add(o.nano).map(Self::from_nano)
    }

    pub fn saturating_add(self, o: Self) -> Self {
        Self::from_nano(self.nano.saturating_add(o.nano))
    }

    pub fn saturating_sub(self, o: Self) -> Self {
        Self::from_nano(self.nano.saturating_sub(o.nano))
    }

    pub fn is_negative(self) -> bool {
        self.nano < 0
    }

    /// Whole units, rounded up (Kubernetes' `Value()`).
    pub fn ceil_units(self) -> i128 {
        self.nano.div_euclid(NANO) + i128::from(self.nano.rem_euclid(NANO) != 0)
    }

    /// Milli-units, rounded up (Kubernetes' `MilliValue()`), and whether that is exact.
    pub fn ceil_milli(self) -> (i128, bool) {
        let m = 1_000_000;
        (
            self.nano.div_euclid(m) + i128::from(self.nano.rem_euclid(m) != 0),
            self.nano % m == 0,
        )
    }
}

impl std::ops::Add for Quantity {
    type Output = Quantity;
    fn add(self, o: Self) -> Self {
        self.saturating_add(o)
    }
}

impl std::ops::Sub for Quantity {
    type Output = Quantity;
    fn sub(self, o: Self) -> Self {
        self.saturating_sub(o)
    }
}

impl std::ops::AddAssign for Quantity {
    fn add_assign(&mut self, o: Self) {
        *self = *self + o;
    }
}

impl std::ops::SubAssign for Quantity {
    fn sub_assign(&mut self, o: Self) {
        *self = *self - o;
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || QuantityError(s.to_string());
        let t = s.trim();
        let (neg, body) = match t.as_bytes().first() {
            Some(b'-') => (true, &t[1..]),
            Some(b'+') => (false, &t[1..]),
            _ => (false, t),
        };
        let num_end = body
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(body.len());
        let (number, suffix) = body.split_at(num_end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(err());
        }
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        let mut mantissa: i128 = 0;
        for c in int_part.chars().chain(frac_part.chars()) {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add((c as u8 - b'0') as i128))
                .ok_or_else(err)?;
        }
        // value = mantissa * 10^exp10 * 2^exp2, in units; we want nano-units.
        let mut exp10: i32 = 9 - frac_part.len() as i32;
        let mut exp2: u32 = 0;
        match suffix {
            "" => {}
            "n" => exp10 -= 9,
            "u" => exp10 -= 6,
            "m" => exp10 -= 3,
            "k" => exp10 += 3,
            "M" => exp10 += 6,
            "G" => exp10 += 9,
            "T" => exp10 += 12,
            "P" => exp10 += 15,
            "E" => exp10 += 18,
            "Ki" => exp2 = 10,
            "Mi" => exp2 = 20,
            "Gi" => exp2 = 30,
            "Ti" => exp2 = 40,
            "Pi" => exp2 = 50,
            "Ei" => exp2 = 60,
            _ if suffix.starts_with(['e', 'E']) => {
                let e: i32 = suffix[1..].parse().map_err(|_| err())?;
                if !(-60..=60).contains(&e) {
                    return Err(err());
                }
                exp10 += e;
            }
            _ => return Err(err()),
        }
        let mut v = mantissa.checked_mul(1i128 << exp2).ok_or_else(err)?;
        if exp10 >= 0 {
            v = v
                .checked_mul(10i128.checked_pow(exp10 as u32).ok_or_else(err)?)
                .ok_or_else(err)?;
        } else {
            let d = 10i128.checked_pow((-exp10) as u32).ok_or_else(err)?;
            v = v / d + i128::from(v % d != 0);
        }
        Ok(Quantity {
            nano: if neg { -v } else { v },
        })
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.nano;
        if n % NANO == 0 {
            write!(f, "{}", n / NANO)
        } else if n % 1_000_000 == 0 {
            write!(f, "{}m", n / 1_000_000)
        } else if n % 1_000 == 0 {
            write!(f, "{}u", n / 1_000)
        } else {
            write!(f, "{}n", n)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap()
    }

    #[test]
    fn parses_suffixes_exactly() {
        assert_eq!(q("1Gi"), Quantity::from_int(1 << 30));
        assert_eq!(q("1.5k"), Quantity::from_int(1500));
        assert_eq!(q("100m").nano(), 100_000_000);
        assert_eq!(q("2e3"), Quantity::from_int(2000));
        assert_eq!(q("-3"), Quantity::from_int(-3));
        assert_eq!(q("0.5Ki"), Quantity::from_int(512));
        assert_eq!(
            q("1.0000000001").nano(),
            1_000_000_001,
            "sub-nano rounds up"
        );
        assert!("1Xi".parse::<Quantity>().is_err());
        assert!("".parse::<Quantity>().is_err());
    }

    #[test]
    fn displays_canonically_and_rounds() {
        assert_eq!(q("1500m").to_string(), "1500m");
        assert_eq!(q("1.5").to_string(), "1500m");
        assert_eq!(q("4Gi").to_string(), "4294967296");
        assert_eq!(q("1500m").ceil_units(), 2);
        assert_eq!(q("1500m").ceil_milli(), (1500, true));
    }
}
