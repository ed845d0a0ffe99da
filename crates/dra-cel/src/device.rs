//! The `device` variable, as views over the borrowed ResourceSlice data.
//!
//! Nothing is copied up front: `device.attributes["d"].x` walks three small views (a box each)
//! and converts the one attribute it reaches, borrowing strings from the slice. Only operations
//! that need the whole map — iterating it (`.exists(...)`, `.all(...)`) or comparing it with
//! `==` — build a `cel` map of the domain, once per evaluation and only for that view.
//!
//! Kubernetes' rules, kept here: an attribute or capacity name without a domain belongs to the
//! driver's domain; indexing an unknown domain gives an empty map; a missing name inside a
//! domain is a "no such key" error (which `has()` and `.?name` turn into false / none).
//!
//! A device that has both `x` and `<driver>/x` names one attribute twice; Kubernetes keeps
//! whichever its map iteration meets last (at random), here the unqualified one wins, and
//! sizes count the name once.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cel::ExecutionError;
use cel::common::traits::{self, Container, Indexer, Iterable, Sizer};
use cel::common::types::{CelBool, CelInt, CelList, CelMap, CelMapKey, CelString, MAP_TYPE, Type};
use cel::common::value::{CowVal, Val};
use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};

use crate::DeviceRef;
use crate::quantity::Quantity;
use crate::semver::Version;
use crate::values::{QuantityVal, SemverVal};

static DEVICE_TYPE: Type = Type::new_unspecified_type("kubernetes.DRADevice");

/// Which of the device's two maps a view looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Attributes,
    Capacity,
}

/// One entry of either map.
#[derive(Clone, Copy)]
enum Entry<'a> {
    Attribute(&'a DeviceAttribute),
    Capacity(&'a DeviceCapacity),
}

/// `(domain, id)` of a qualified name; unqualified names are in the driver's domain.
fn split_name<'a>(driver: &'a str, key: &'a str) -> (&'a str, &'a str) {
    match key.find('/') {
        Some(i) => (&key[..i], &key[i + 1..]),
        None => (driver, key),
    }
}

/// The entries of `map` (sorted by name) whose names start with `domain`.
fn from_domain<'a, T>(map: &'a [(String, T)], domain: &str) -> &'a [(String, T)] {
    let start = map.partition_point(|(k, _)| k.as_str() < domain);
    let rest = &map[start..];
    &rest[..rest.partition_point(|(k, _)| k.starts_with(domain))]
}

/// The entry `domain`/`id` of `map`, without building the qualified name.
fn find<'a, T>(map: &'a [(String, T)], driver: &str, domain: &str, id: &str) -> Option<&'a T> {
    if domain == driver
        && !id.contains('/')
        && let Ok(i) = map.binary_search_by(|(k, _)| k.as_str().cmp(id))
    {
        return Some(&map[i].1);
    }
    from_domain(map, domain)
        .iter()
        .find(|(k, _)| {
            k.as_bytes().get(domain.len()) == Some(&b'/') && &k[domain.len() + 1..] == id
        })
        .map(|(_, v)| v)
}

/// `domain` as borrowed from the device data, if any entry is in it.
fn known_domain<'a, T>(map: &'a [(String, T)], driver: &'a str, domain: &str) -> Option<&'a str> {
    let qualified = from_domain(map, domain)
        .iter()
        .find(|(k, _)| k.as_bytes().get(domain.len()) == Some(&b'/'))
        .map(|(k, _)| &k[..domain.len()]);
    qualified.or_else(|| {
        (domain == driver && map.iter().any(|(k, _)| !k.contains('/'))).then_some(driver)
    })
}

fn entries<'a>(
    dev: DeviceRef<'a>,
    kind: Kind,
) -> Box<dyn Iterator<Item = (&'a str, &'a str, Entry<'a>)> + 'a> {
    let driver = dev.driver;
    match kind {
        Kind::Attributes => Box::new(dev.attributes.iter().map(move |(k, v)| {
            let (d, id) = split_name(driver, k);
            (d, id, Entry::Attribute(v))
        })),
        Kind::Capacity => Box::new(dev.capacity.iter().map(move |(k, v)| {
            let (d, id) = split_name(driver, k);
            (d, id, Entry::Capacity(v))
        })),
    }
}

fn lookup<'a>(dev: DeviceRef<'a>, kind: Kind, domain: &str, id: &str) -> Option<Entry<'a>> {
    match kind {
        Kind::Attributes => find(dev.attributes, dev.driver, domain, id).map(Entry::Attribute),
        Kind::Capacity => find(dev.capacity, dev.driver, domain, id).map(Entry::Capacity),
    }
}

fn domain_of<'a>(dev: DeviceRef<'a>, kind: Kind, domain: &str) -> Option<&'a str> {
    match kind {
        Kind::Attributes => known_domain(dev.attributes, dev.driver, domain),
        Kind::Capacity => known_domain(dev.capacity, dev.driver, domain),
    }
}

/// The attribute `domain`/`id` of `dev` if the interpreter sees it as a string (see
/// [`member`]).
pub(crate) fn string_attribute<'a>(dev: DeviceRef<'a>, domain: &str, id: &str) -> Option<&'a str> {
    match member(find(dev.attributes, dev.driver, domain, id)?)? {
        Member::String(s) => Some(s),
        _ => None,
    }
}

fn version(s: &str) -> Result<SemverVal, ExecutionError> {
    Version::parse(s).map(SemverVal).map_err(|e| {
        ExecutionError::function_error("semver", format!("parse semantic version: {e}"))
    })
}

/// One attribute or capacity as a CEL value; strings are borrowed, not copied.
fn convert<'a>(entry: Entry<'a>) -> Result<Box<dyn Val + 'a>, ExecutionError> {
    match entry {
        Entry::Capacity(c) => {
            let q: Quantity = c
                .value
                .0
                .parse()
                .map_err(|e| ExecutionError::function_error("quantity", e))?;
            Ok(Box::new(QuantityVal(q)))
        }
        Entry::Attribute(a) => match member(a) {
            Some(Member::Ints(v)) => {
                let items = v
                    .iter()
                    .map(|i| Box::new(CelInt::from(*i)) as Box<dyn Val + 'a>);
                Ok(Box::new(CelList::from(items.collect::<Vec<_>>())))
            }
            Some(Member::Bools(v)) => {
                let items = v
                    .iter()
                    .map(|b| Box::new(CelBool::from(*b)) as Box<dyn Val + 'a>);
                Ok(Box::new(CelList::from(items.collect::<Vec<_>>())))
            }
            Some(Member::Strings(v)) => {
                let items = v
                    .iter()
                    .map(|s| Box::new(CelString::from(s.as_str())) as Box<dyn Val + 'a>);
                Ok(Box::new(CelList::from(items.collect::<Vec<_>>())))
            }
            Some(Member::Versions(v)) => {
                let mut items: Vec<Box<dyn Val + 'a>> = Vec::with_capacity(v.len());
                for s in v {
                    items.push(Box::new(version(s)?));
                }
                Ok(Box::new(CelList::from(items)))
            }
            Some(Member::Int(i)) => Ok(Box::new(CelInt::from(i))),
            Some(Member::Bool(b)) => Ok(Box::new(CelBool::from(b))),
            Some(Member::String(s)) => Ok(Box::new(CelString::from(s))),
            Some(Member::Version(s)) => Ok(Box::new(version(s)?)),
            None => Err(ExecutionError::function_error(
                "attribute",
                "unsupported attribute value",
            )),
        },
    }
}

/// The member of an attribute's union that CEL sees.
enum Member<'a> {
    Ints(&'a [i64]),
    Bools(&'a [bool]),
    Strings(&'a [String]),
    Versions(&'a [String]),
    Int(i64),
    Bool(bool),
    String(&'a str),
    Version(&'a str),
}

/// Lists first, then scalars: the order Kubernetes reads the union in.
fn member(a: &DeviceAttribute) -> Option<Member<'_>> {
    let list = a
        .ints
        .as_deref()
        .map(Member::Ints)
        .or_else(|| a.bools.as_deref().map(Member::Bools))
        .or_else(|| a.strings.as_deref().map(Member::Strings))
        .or_else(|| a.versions.as_deref().map(Member::Versions));
    list.or_else(|| a.int.map(Member::Int))
        .or_else(|| a.bool.map(Member::Bool))
        .or_else(|| a.string.as_deref().map(Member::String))
        .or_else(|| a.version.as_deref().map(Member::Version))
}

fn key_str(key: &dyn Val) -> Result<&str, ExecutionError> {
    key.downcast_ref::<CelString>()
        .map(CelString::inner)
        .ok_or_else(|| ExecutionError::UnexpectedType {
            got: key.get_type().name().to_owned(),
            want: "string".to_owned(),
        })
}

/// The `device` variable. Its fields are built once per evaluation, on the stack, and handed
/// out by reference: reading `device.driver` or `device.attributes` allocates nothing.
#[derive(Debug)]
pub(crate) struct DeviceVal<'a> {
    pub dev: DeviceRef<'a>,
    driver: CelString<'a>,
    allow_multiple_allocations: CelBool,
    attributes: DomainsView<'a>,
    capacity: DomainsView<'a>,
}

impl<'a> DeviceVal<'a> {
    pub fn new(dev: DeviceRef<'a>) -> Self {
        DeviceVal {
            dev,
            driver: CelString::from(dev.driver),
            allow_multiple_allocations: CelBool::from(dev.allow_multiple_allocations),
            attributes: DomainsView::new(dev, Kind::Attributes),
            capacity: DomainsView::new(dev, Kind::Capacity),
        }
    }
}

impl<'a> Indexer for DeviceVal<'a> {
    fn get<'b, 'w>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'w>, ExecutionError>
    where
        Self: 'w,
    {
        match key_str(idx)? {
            "driver" => Ok(CowVal::Borrowed(&self.driver)),
            "allowMultipleAllocations" => Ok(CowVal::Borrowed(&self.allow_multiple_allocations)),
            "attributes" => Ok(CowVal::Borrowed(&self.attributes)),
            "capacity" => Ok(CowVal::Borrowed(&self.capacity)),
            other => Err(ExecutionError::no_such_key(other)),
        }
    }

    fn steal<'w>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'w>, ExecutionError>
    where
        Self: 'w,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

impl<'a> Val for DeviceVal<'a> {
    fn get_type(&self) -> &Type {
        &DEVICE_TYPE
    }
    fn cel_type() -> &'static Type {
        &DEVICE_TYPE
    }
    fn as_indexer<'b, 'w>(&'b self) -> Option<&'b (dyn Indexer + 'w)>
    where
        Self: 'w,
    {
        Some(self)
    }
    fn clone_as_boxed<'w>(&self) -> Box<dyn Val + 'w>
    where
        Self: 'w,
    {
        Box::new(DeviceVal::new(self.dev))
    }
}

/// `device.attributes` or `device.capacity`: domain → map of names.
#[derive(Debug)]
struct DomainsView<'a> {
    dev: DeviceRef<'a>,
    kind: Kind,
    full: OnceLock<CelMap<'a>>,
    /// The driver's own domain, by far the most looked up: built once, then lent.
    driver_domain: OnceLock<Option<DomainView<'a>>>,
}

impl<'a> DomainsView<'a> {
    fn new(dev: DeviceRef<'a>, kind: Kind) -> Self {
        DomainsView {
            dev,
            kind,
            full: OnceLock::new(),
            driver_domain: OnceLock::new(),
        }
    }

    fn fresh(&self) -> Self {
        DomainsView::new(self.dev, self.kind)
    }

    fn domains(&self) -> Vec<&'a str> {
        let mut v: Vec<&'a str> = entries(self.dev, self.kind).map(|(d, _, _)| d).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    fn full(&self) -> &CelMap<'a> {
        self.full.get_or_init(|| {
            let map: HashMap<CelMapKey<'a>, Box<dyn Val + 'a>> = self
                .domains()
                .into_iter()
                .map(|d| {
                    let view = DomainView {
                        dev: self.dev,
                        kind: self.kind,
                        domain: d,
                        full: OnceLock::new(),
                    };
                    (CelMapKey::from(d), Box::new(view) as Box<dyn Val + 'a>)
                })
                .collect();
            CelMap::from(map)
        })
    }
}

impl<'a> Indexer for DomainsView<'a> {
    fn get<'b, 'w>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'w>, ExecutionError>
    where
        Self: 'w,
    {
        let domain = key_str(idx)?;
        if domain == self.dev.driver {
            let view = self.driver_domain.get_or_init(|| {
                domain_of(self.dev, self.kind, domain).map(|domain| DomainView {
                    dev: self.dev,
                    kind: self.kind,
                    domain,
                    full: OnceLock::new(),
                })
            });
            if let Some(view) = view {
                return Ok(CowVal::Borrowed(view));
            }
        }
        Ok(match domain_of(self.dev, self.kind, domain) {
            Some(domain) => CowVal::owned(DomainView {
                dev: self.dev,
                kind: self.kind,
                domain,
                full: OnceLock::new(),
            }),
            // Kubernetes: an unknown domain is an empty map, not an error.
            None => CowVal::owned(CelMap::from(HashMap::new())),
        })
    }

    fn steal<'w>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'w>, ExecutionError>
    where
        Self: 'w,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

impl Container for DomainsView<'_> {
    fn contains(&self, key: &dyn Val) -> Result<bool, ExecutionError> {
        Ok(domain_of(self.dev, self.kind, key_str(key)?).is_some())
    }
}

impl Sizer for DomainsView<'_> {
    fn size(&self) -> CelInt {
        CelInt::from(self.domains().len() as i64)
    }
}

impl<'a> Iterable for DomainsView<'a> {
    fn iter<'b, 'w>(&'b self) -> Box<dyn traits::Iterator<'b, 'w> + 'b>
    where
        Self: 'w,
    {
        match self.full().as_iterable() {
            Some(it) => it.iter(),
            None => Box::new(Empty),
        }
    }
}

/// `device.attributes["domain"]` for a domain the device has.
#[derive(Debug)]
struct DomainView<'a> {
    dev: DeviceRef<'a>,
    kind: Kind,
    domain: &'a str,
    full: OnceLock<CelMap<'a>>,
}

impl<'a> DomainView<'a> {
    fn fresh(&self) -> Self {
        DomainView {
            dev: self.dev,
            kind: self.kind,
            domain: self.domain,
            full: OnceLock::new(),
        }
    }

    fn members(&self) -> impl Iterator<Item = (&'a str, Entry<'a>)> + 'a {
        let domain = self.domain;
        entries(self.dev, self.kind)
            .filter(move |(d, _, _)| *d == domain)
            .map(|(_, id, e)| (id, e))
    }

    fn full(&self) -> &CelMap<'a> {
        self.full.get_or_init(|| {
            let map: HashMap<CelMapKey<'a>, Box<dyn Val + 'a>> = self
                .members()
                .filter_map(|(id, e)| convert(e).ok().map(|v| (CelMapKey::from(id), v)))
                .collect();
            CelMap::from(map)
        })
    }
}

impl<'a> Indexer for DomainView<'a> {
    fn get<'b, 'w>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'w>, ExecutionError>
    where
        Self: 'w,
    {
        let id = key_str(idx)?;
        match lookup(self.dev, self.kind, self.domain, id) {
            Some(e) => convert(e).map(CowVal::Owned),
            None => Err(ExecutionError::NoSuchKey(Arc::new(id.to_string()))),
        }
    }

    fn steal<'w>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'w>, ExecutionError>
    where
        Self: 'w,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

impl Container for DomainView<'_> {
    fn contains(&self, key: &dyn Val) -> Result<bool, ExecutionError> {
        Ok(lookup(self.dev, self.kind, self.domain, key_str(key)?).is_some())
    }
}

impl Sizer for DomainView<'_> {
    fn size(&self) -> CelInt {
        // `x` and `<driver>/x` name the same attribute: count names, not entries.
        let mut ids: Vec<&str> = self.members().map(|(id, _)| id).collect();
        ids.sort_unstable();
        ids.dedup();
        CelInt::from(ids.len() as i64)
    }
}

impl<'a> Iterable for DomainView<'a> {
    fn iter<'b, 'w>(&'b self) -> Box<dyn traits::Iterator<'b, 'w> + 'b>
    where
        Self: 'w,
    {
        match self.full().as_iterable() {
            Some(it) => it.iter(),
            None => Box::new(Empty),
        }
    }
}

struct Empty;
impl<'b, 'v> traits::Iterator<'b, 'v> for Empty {
    fn next(&mut self) -> Option<&'b (dyn Val + 'v)> {
        None
    }
}

macro_rules! map_view_val {
    ($t:ident) => {
        impl<'a> Val for $t<'a> {
            fn get_type(&self) -> &Type {
                &MAP_TYPE
            }
            fn cel_type() -> &'static Type {
                &MAP_TYPE
            }
            fn as_indexer<'b, 'w>(&'b self) -> Option<&'b (dyn Indexer + 'w)>
            where
                Self: 'w,
            {
                Some(self)
            }
            fn as_container(&self) -> Option<&dyn Container> {
                Some(self)
            }
            fn as_sizer(&self) -> Option<&dyn Sizer> {
                Some(self)
            }
            fn as_iterable<'b, 'w>(&'b self) -> Option<&'b (dyn Iterable + 'w)>
            where
                Self: 'w,
            {
                Some(self)
            }
            fn equals(&self, other: &dyn Val) -> bool {
                self.full().equals(other)
            }
            fn clone_as_boxed<'w>(&self) -> Box<dyn Val + 'w>
            where
                Self: 'w,
            {
                Box::new(self.fresh())
            }
        }
    };
}

map_view_val!(DomainsView);
map_view_val!(DomainView);

#[cfg(test)]
mod tests {
    use super::*;

    /// Names sorted as a ResourceSlice's map is: `a.example.com.b/x` comes before
    /// `a.example.com/x` ('.' sorts before '/'), so a domain's names are found among all
    /// names that start with it.
    fn entries() -> Vec<(String, i32)> {
        let mut entries: Vec<(String, i32)> = [
            ("a.example.com/x", 1),
            ("a.example.com.b/x", 2),
            ("x", 3),
            ("a.example.com/y", 4),
        ]
        .map(|(k, v)| (k.to_string(), v))
        .to_vec();
        entries.sort();
        entries
    }

    #[test]
    fn names_are_found_by_domain_and_id_in_the_sorted_entries() {
        let e = entries();
        assert_eq!(find(&e, "drv", "a.example.com", "x"), Some(&1));
        assert_eq!(find(&e, "drv", "a.example.com", "y"), Some(&4));
        assert_eq!(find(&e, "drv", "a.example.com.b", "x"), Some(&2));
        assert_eq!(
            find(&e, "drv", "drv", "x"),
            Some(&3),
            "unqualified: the driver's"
        );
        assert_eq!(find(&e, "drv", "a.example", "x"), None);
        assert_eq!(find(&e, "drv", "a.example.com", "z"), None);
    }

    #[test]
    fn a_domain_is_known_when_a_name_is_in_it() {
        let e = entries();
        assert_eq!(
            known_domain(&e, "drv", "a.example.com"),
            Some("a.example.com")
        );
        assert_eq!(
            known_domain(&e, "drv", "a.example.com.b"),
            Some("a.example.com.b")
        );
        assert_eq!(known_domain(&e, "drv", "a.example"), None);
        assert_eq!(known_domain(&e, "drv", "drv"), Some("drv"));
        assert_eq!(known_domain(&e[..0], "drv", "drv"), None);
    }
}
