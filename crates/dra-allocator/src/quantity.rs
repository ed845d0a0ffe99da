//! The allocator's view of a Kubernetes quantity: its exact value and nothing else, for the
//! search's capacity and counter arithmetic.
//!
//! Parsing is `dra_quantity`'s, the workspace's one implementation of Kubernetes'
//! `ParseQuantity` (no whitespace, exponents as Go reads them, rounding up to a nano-unit,
//! binary values capped at the largest `int64`). What this type adds is size: a signed count of
//! nano-units (10⁻⁹) in an `i128`, 16 bytes, where `dra_quantity::Quantity` also carries the
//! format and Kubernetes' internal representation. The solver keeps vectors of these per device
//! and adds them in its inner loops, and it never needs the text they were written as.

use std::fmt;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

const NANO: i128 = 1_000_000_000;

/// An exact quantity in nano-units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    nano: i128,
}

/// A quantity string the parser rejects, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {text:?}: {cause}")]
pub struct QuantityError {
    pub text: String,
    pub cause: dra_quantity::QuantityError,
}

impl From<dra_quantity::Quantity> for Quantity {
    fn from(q: dra_quantity::Quantity) -> Self {
        Quantity { nano: q.nanos() }
    }
}

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
        s.parse::<dra_quantity::Quantity>()
            .map(Quantity::from)
            .map_err(|cause| QuantityError {
                text: s.to_string(),
                cause,
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

    /// This module once had its own parser, which trimmed whitespace and refused exponents
    /// past ±60; it now answers as Kubernetes' `ParseQuantity` does.
    #[test]
    fn parses_as_kubernetes_does() {
        for bad in [" 1Gi", "1Gi ", "1\n", "1 Gi"] {
            let err = bad.parse::<Quantity>().unwrap_err();
            assert_eq!(err.cause, dra_quantity::QuantityError::Format, "{bad:?}");
            assert!(err.to_string().starts_with("invalid quantity"), "{err}");
        }
        assert_eq!(q("1e-100").nano(), 1, "rounds up to one nano-unit");
        assert_eq!(
            q("1e4294967299"),
            Quantity::from_int(1000),
            "Go's 32-bit exponent"
        );
        assert_eq!(
            q("16Ei"),
            Quantity::from_int(i64::MAX),
            "binary capped at int64"
        );
        assert!("1e61".parse::<Quantity>().is_err(), "past the exact range");
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
