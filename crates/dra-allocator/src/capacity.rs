//! Consumable capacity: what one allocation of a device consumes under the device's request
//! policy (default, validRange with step, validValues; rounding up), and whether it fits.

use crate::quantity::Quantity;
use crate::snapshot::Capacity;

/// What went wrong computing a consumption: an error for the whole attempt, as upstream.
#[derive(Clone, Debug, thiserror::Error)]
#[error("capacity {name:?}: {message}")]
pub(crate) struct CapacityError {
    pub name: String,
    pub message: String,
}

/// The consumption per device capacity (aligned with `caps`) when the request fits the
/// device's policies and total capacity on an otherwise unused device; `Ok(None)` when it
/// does not fit (a requested capacity the device lacks, a policy violation, too much).
pub(crate) fn consumption(
    requests: Option<
        &[(
            String,
            Quantity,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        )],
    >,
    caps: &[Capacity],
    fractional: bool,
) -> Result<Option<Vec<Quantity>>, CapacityError> {
    if let Some(reqs) = requests
        && reqs
            .iter()
            .any(|(n, _, _)| !caps.iter().any(|c| &c.name == n))
    {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(caps.len());
    for cap in caps {
        let requested = requests
            .and_then(|r| r.iter().find(|(n, _, _)| n == &cap.name))
            .map(|r| r.1);
        let err = |message: String| CapacityError {
            name: cap.name.clone(),
            message,
        };
        let consumed = consumed_for(requested, cap, fractional).map_err(err)?;
        if consumed.is_negative() {
            return Err(CapacityError {
                name: cap.name.clone(),
                message: "capacity value is negative".into(),
            });
        }
        out.push(consumed);
    }
    for (cap, consumed) in caps.iter().zip(&out) {
        if violates_policy(*consumed, cap, fractional) || *consumed > cap.value {
            return Ok(None);
        }
    }
    Ok(Some(out))
}

fn consumed_for(
    requested: Option<Quantity>,
    cap: &Capacity,
    fractional: bool,
) -> Result<Quantity, String> {
    let Some(req) = requested else {
        return Ok(cap.default.unwrap_or(cap.value));
    };
    if !cap.has_policy {
        return Ok(req);
    }
    if let Some((min, max, step)) = cap.range {
        return round_up_range(req, min, max, step, fractional);
    }
    if !cap.valid_values.is_empty() {
        return Ok(cap
            .valid_values
            .iter()
            .copied()
            .find(|v| req <= *v)
            .unwrap_or(req));
    }
    Ok(req)
}

fn exact_milli(q: Quantity) -> Option<i128> {
    let (m, exact) = q.ceil_milli();
    exact.then_some(m)
}

fn use_milli(
    min: Quantity,
    max: Option<Quantity>,
    step: Option<Quantity>,
    fractional: bool,
) -> bool {
    if !fractional {
        return false;
    }
    for q in [Some(min), max, step].into_iter().flatten() {
        if exact_milli(q).is_none() {
            return false;
        }
    }
    step.is_none_or(|s| exact_milli(s).is_none_or(|m| m >= 1))
}

fn round_up_range(
    req: Quantity,
    min: Quantity,
    max: Option<Quantity>,
    step: Option<Quantity>,
    fractional: bool,
) -> Result<Quantity, String> {
    if req < min {
        return Ok(min);
    }
    let Some(step) = step else { return Ok(req) };
    let (r, s, m, unit) = if use_milli(min, max, step.into(), fractional) {
        let r = exact_milli(req).ok_or("request is not a representable milli value")?;
        (
            r,
            exact_milli(step).unwrap_or(1),
            exact_milli(min).unwrap_or(0),
            1_000_000i128,
        )
    } else {
        (
            req.ceil_units(),
            step.ceil_units(),
            min.ceil_units(),
            1_000_000_000i128,
        )
    };
    if s <= 0 {
        return Err("step must be positive".into());
    }
    let added = r - m;
    let n = added / s + i128::from(added % s != 0);
    Ok(Quantity::from_nano((m + s * n) * unit))
}

fn violates_policy(v: Quantity, cap: &Capacity, fractional: bool) -> bool {
    if !cap.has_policy || cap.default == Some(v) {
        return false;
    }
    if let Some((min, max, step)) = cap.range {
        if max.is_some_and(|m| v > m) {
            return true;
        }
        if let Some(step) = step {
            let (r, s, m) = if use_milli(min, max, Some(step), fractional) {
                match exact_milli(v) {
                    Some(r) => (
                        r,
                        exact_milli(step).unwrap_or(1),
                        exact_milli(min).unwrap_or(0),
                    ),
                    None => return true,
                }
            } else {
                (v.ceil_units(), step.ceil_units(), min.ceil_units())
            };
            return s == 0 || (r - m) % s != 0;
        }
        return false;
    }
    if !cap.valid_values.is_empty() {
        return !cap.valid_values.contains(&v);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap()
    }

    fn cap(value: &str) -> Capacity {
        Capacity {
            name: "memory".into(),
            value: q(value),
            default: None,
            range: None,
            valid_values: Vec::new(),
            has_policy: false,
        }
    }

    fn req(
        v: &str,
    ) -> Vec<(
        String,
        Quantity,
        k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    )> {
        vec![(
            "memory".into(),
            q(v),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.into()),
        )]
    }

    #[test]
    fn no_request_takes_default_or_everything() {
        let mut c = cap("40Gi");
        assert_eq!(
            consumption(None, std::slice::from_ref(&c), true).unwrap(),
            Some(vec![q("40Gi")])
        );
        c.has_policy = true;
        c.default = Some(q("10Gi"));
        assert_eq!(
            consumption(None, &[c], true).unwrap(),
            Some(vec![q("10Gi")])
        );
    }

    #[test]
    fn range_rounds_up_to_step_and_caps_at_max() {
        let mut c = cap("40Gi");
        c.has_policy = true;
        c.range = Some((q("1Gi"), Some(q("20Gi")), Some(q("1Gi"))));
        let r = consumption(Some(&req("1500Mi")), std::slice::from_ref(&c), true).unwrap();
        assert_eq!(r, Some(vec![q("2Gi")]));
        assert_eq!(
            consumption(Some(&req("100Mi")), std::slice::from_ref(&c), true).unwrap(),
            Some(vec![q("1Gi")])
        );
        assert_eq!(
            consumption(Some(&req("21Gi")), &[c], true).unwrap(),
            None,
            "above max"
        );
    }

    #[test]
    fn valid_values_round_up_and_unknown_capacity_never_fits() {
        let mut c = cap("100");
        c.has_policy = true;
        c.valid_values = vec![q("10"), q("50"), q("100")];
        assert_eq!(
            consumption(Some(&req("20")), std::slice::from_ref(&c), true).unwrap(),
            Some(vec![q("50")])
        );
        assert_eq!(
            consumption(Some(&req("200")), std::slice::from_ref(&c), true).unwrap(),
            None
        );
        let other = vec![(
            "cores".to_string(),
            q("1"),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
        )];
        assert_eq!(consumption(Some(&other), &[c], true).unwrap(), None);
    }
}
