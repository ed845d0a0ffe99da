//! Attribute values as constraints see them, and the `matchAttribute` / `distinctAttribute`
//! bookkeeping (with the list-type rules when DRAListTypeAttributes is on).

use k8s_openapi::api::resource::v1::DeviceAttribute;

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Scalar {
    Str(String),
    Int(i64),
    Bool(bool),
    Version(String),
}

/// One device's value of one attribute.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct AttrValue {
    /// Set for a single value; `None` for a list.
    pub scalar: Option<Scalar>,
    /// The values of a list (empty for a scalar: see [`AttrValue::values`]).
    pub items: Vec<Scalar>,
}

impl AttrValue {
    /// All values: the list, or the single scalar (no allocation either way).
    pub fn values(&self) -> &[Scalar] {
        match &self.scalar {
            Some(s) => std::slice::from_ref(s),
            None => &self.items,
        }
    }

    pub fn from_api(a: &DeviceAttribute) -> Option<AttrValue> {
        let scalar = if let Some(s) = &a.string {
            Some(Scalar::Str(s.clone()))
        } else if let Some(i) = a.int {
            Some(Scalar::Int(i))
        } else if let Some(b) = a.bool {
            Some(Scalar::Bool(b))
        } else {
            a.version.as_ref().map(|v| Scalar::Version(v.clone()))
        };
        if let Some(s) = scalar {
            return Some(AttrValue {
                items: Vec::new(),
                scalar: Some(s),
            });
        }
        let mut items: Vec<Scalar> = Vec::new();
        items.extend(a.strings.iter().flatten().map(|s| Scalar::Str(s.clone())));
        items.extend(a.ints.iter().flatten().map(|i| Scalar::Int(*i)));
        items.extend(a.bools.iter().flatten().map(|b| Scalar::Bool(*b)));
        items.extend(
            a.versions
                .iter()
                .flatten()
                .map(|v| Scalar::Version(v.clone())),
        );
        if a.strings.is_none() && a.ints.is_none() && a.bools.is_none() && a.versions.is_none() {
            return None;
        }
        items.sort();
        items.dedup();
        Some(AttrValue {
            scalar: None,
            items,
        })
    }

    pub fn describe(&self) -> String {
        let one = |s: &Scalar| match s {
            Scalar::Str(s) | Scalar::Version(s) => s.clone(),
            Scalar::Int(i) => i.to_string(),
            Scalar::Bool(b) => b.to_string(),
        };
        match &self.scalar {
            Some(s) => one(s),
            None => format!(
                "[{}]",
                self.items.iter().map(one).collect::<Vec<_>>().join(",")
            ),
        }
    }
}

/// Looks an attribute up by its fully qualified name: first verbatim, then, when the domain
/// is the device's driver, by the short name.
pub(crate) fn lookup(maps: &crate::DeviceMaps, driver: &str, name: &str) -> Option<AttrValue> {
    if let Some(a) = maps.attribute(name) {
        return AttrValue::from_api(a);
    }
    let (domain, short) = name.split_once('/')?;
    if domain != driver {
        return None;
    }
    maps.attribute(short).and_then(AttrValue::from_api)
}

/// The running state of one constraint while devices are added and removed (LIFO).
#[derive(Clone, Debug)]
pub(crate) enum ConstraintState {
    Match {
        first: Option<AttrValue>,
        count: usize,
        intersections: Vec<Vec<Scalar>>,
    },
    Distinct {
        values: Vec<AttrValue>,
    },
}

impl ConstraintState {
    pub fn new(kind: crate::plan::ConstraintKind) -> Self {
        match kind {
            crate::plan::ConstraintKind::Match => ConstraintState::Match {
                first: None,
                count: 0,
                intersections: Vec::new(),
            },
            crate::plan::ConstraintKind::Distinct => {
                ConstraintState::Distinct { values: Vec::new() }
            }
        }
    }

    /// Whether a device with `value` may join, without changing the state.
    pub fn admits(&self, value: Option<&AttrValue>, lists: bool) -> bool {
        let Some(v) = value else { return false };
        match self {
            ConstraintState::Match {
                first,
                count,
                intersections,
            } => {
                if *count == 0 {
                    return true;
                }
                if lists {
                    let cur = intersections.last().expect("set when count > 0");
                    v.values().iter().any(|x| cur.contains(x))
                } else {
                    let first = first.as_ref().expect("set when count > 0");
                    v.scalar.is_some() && v.scalar == first.scalar
                }
            }
            ConstraintState::Distinct { values } => {
                if lists {
                    values
                        .iter()
                        .all(|o| !o.values().iter().any(|x| v.values().contains(x)))
                } else {
                    match &v.scalar {
                        None => values.is_empty(),
                        Some(s) => values.iter().all(|o| o.scalar.as_ref() != Some(s)),
                    }
                }
            }
        }
    }

    /// Adds a device; returns false (state unchanged) when the constraint forbids it.
    pub fn add(&mut self, value: Option<&AttrValue>, lists: bool) -> bool {
        if !self.admits(value, lists) {
            return false;
        }
        let v = value.expect("admitted");
        match self {
            ConstraintState::Match {
                first,
                count,
                intersections,
            } => {
                if *count == 0 {
                    *first = Some(v.clone());
                    intersections.push(v.values().to_vec());
                } else if lists {
                    let cur = intersections.last().expect("set");
                    let next = cur
                        .iter()
                        .filter(|x| v.values().contains(x))
                        .cloned()
                        .collect();
                    intersections.push(next);
                }
                *count += 1;
            }
            ConstraintState::Distinct { values } => values.push(v.clone()),
        }
        true
    }

    pub fn remove(&mut self, lists: bool) {
        match self {
            ConstraintState::Match {
                first,
                count,
                intersections,
            } => {
                *count -= 1;
                if *count == 0 {
                    *first = None;
                    intersections.clear();
                } else if lists {
                    intersections.pop();
                }
            }
            ConstraintState::Distinct { values } => {
                values.pop();
            }
        }
    }

    /// A canonical description of the state for memoisation.
    pub fn key(&self, lists: bool) -> Vec<AttrValue> {
        match self {
            ConstraintState::Match {
                first,
                count,
                intersections,
            } => {
                if *count == 0 {
                    Vec::new()
                } else if lists {
                    let items = intersections.last().cloned().unwrap_or_default();
                    vec![AttrValue {
                        scalar: None,
                        items,
                    }]
                } else {
                    first.iter().cloned().collect()
                }
            }
            ConstraintState::Distinct { values } => {
                let mut v = values.clone();
                v.sort_by(|a, b| a.scalar.cmp(&b.scalar).then(a.items.cmp(&b.items)));
                v
            }
        }
    }
}
