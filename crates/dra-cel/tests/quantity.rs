//! Properties of the exact quantity type the allocator does its capacity arithmetic with.

use dra_cel::Quantity;
use proptest::prelude::*;

fn quantity_text() -> impl Strategy<Value = String> {
    (
        prop::bool::ANY,
        0u64..10_000_000,
        prop::option::of(0u64..1_000_000_000),
        prop::sample::select(vec![
            "", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
            "e3", "e-3", "E9", "e-12", "e21",
        ]),
    )
        .prop_map(|(negative, whole, fraction, suffix)| {
            let sign = if negative { "-" } else { "" };
            match fraction {
                Some(f) => format!("{sign}{whole}.{f}{suffix}"),
                None => format!("{sign}{whole}{suffix}"),
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

    /// The canonical text reads back as the same value.
    #[test]
    fn canonical_text_round_trips(text in quantity_text()) {
        let q: Quantity = text.parse().unwrap();
        let again: Quantity = q.to_string().parse().unwrap();
        prop_assert_eq!(q, again, "{} -> {}", text, q);
        prop_assert_eq!(q.to_openapi().0, q.to_string());
    }

    /// Arithmetic is exact: adding and taking away gives back what there was, and order
    /// follows the value.
    #[test]
    fn arithmetic_is_exact(a in quantity_text(), b in quantity_text()) {
        let (a, b): (Quantity, Quantity) = (a.parse().unwrap(), b.parse().unwrap());
        let sum = a.checked_add(&b).unwrap();
        prop_assert_eq!(sum.checked_sub(&b).unwrap(), a);
        prop_assert_eq!(a + b, sum);
        prop_assert_eq!(a < b, a.nanos() < b.nanos());
        prop_assert_eq!((a - b).is_zero(), a == b);
        prop_assert_eq!((a - b).sign(), (a.nanos() - b.nanos()).signum() as i64);
    }

    /// Anything at all either parses or is rejected; nothing panics.
    #[test]
    fn parsing_never_panics(text in "\\PC{0,30}") {
        let _ = text.parse::<Quantity>();
    }
}

#[test]
fn binary_and_decimal_units_compare_exactly() {
    let q = |s: &str| s.parse::<Quantity>().unwrap();
    assert_eq!(q("1Gi"), q("1024Mi"));
    assert_eq!(q("1.5Gi"), q("1536Mi"));
    assert!(q("20Gi") > q("20G"));
    assert_eq!(q("1e3"), q("1k"));
    assert_eq!(q("100m") + q("900m"), q("1"));
    assert_eq!(q("1Gi").as_integer(), Some(1 << 30));
    assert_eq!(q("1500m").milli_value(), Some(1500));
    assert_eq!(q("1Gi").to_string(), "1Gi");
    assert_eq!((q("1Gi") + q("512Mi")).to_string(), "1536Mi");
}
