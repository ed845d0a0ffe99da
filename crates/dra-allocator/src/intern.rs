//! Small numbers for what devices carry: driver and attribute names, attribute and
//! capacity values, and whole "views" (everything CEL can see of a device).
//!
//! A slice's devices are numbered once, when the slice is received (see
//! [`crate::facts`]), in the process's current [`Numbering`]; a snapshot copies those
//! numbers instead of working them out per device. From then on the selector-result cache
//! is keyed by these numbers: comparing and hashing a few `u32`s per device instead of
//! reading the attribute maps (string comparisons) on every first look at a device. A
//! [`crate::SelectorCache`] is tied to one numbering, so its results stay valid across
//! snapshot rebuilds for as long as that numbering is used.

use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, Mutex, RwLock};

use foldhash::HashMap;
use hashbrown::HashTable;
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};

/// The value number of "the device has no such attribute or capacity".
pub(crate) const ABSENT: u32 = u32::MAX;

/// Past this many numbers the process starts a fresh [`Numbering`] (bounded memory):
/// slices received after that are numbered in the new one, and the next snapshot renumbers
/// the others and starts a fresh selector cache.
pub(crate) const LIMIT: usize = 1 << 20;

/// The numbers of one process-wide era: an [`Interner`] that slices are numbered in as
/// they arrive, and that snapshots and selector caches read. Replaced by a fresh one once
/// it holds [`LIMIT`] numbers (UUIDs of devices long gone would otherwise stay forever).
#[derive(Debug)]
pub(crate) struct Numbering {
    interner: RwLock<Interner>,
    limit: usize,
}

impl Numbering {
    pub fn new(limit: usize) -> Arc<Numbering> {
        Arc::new(Numbering {
            interner: RwLock::default(),
            limit,
        })
    }

    /// The numbering new slices are numbered in: the process's last one, unless it is full.
    pub fn current() -> Arc<Numbering> {
        static CURRENT: Current = Current(Mutex::new(None));
        CURRENT.get(LIMIT)
    }

    /// It holds as many numbers as it may: no snapshot should start on it any more.
    pub fn full(&self) -> bool {
        self.read().len() >= self.limit
    }

    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, Interner> {
        self.interner.read().expect("not poisoned")
    }

    /// The views of a slice's devices (of `driver`), in order, their pairs appended to
    /// `pairs` (each view's start counts from the first of them).
    pub fn number<'a>(
        &self,
        driver: &str,
        devices: impl Iterator<Item = (&'a Device, &'a crate::DeviceMaps)>,
        pairs: &mut Pairs,
    ) -> Vec<DeviceView> {
        let mut interner = self.interner.write().expect("not poisoned");
        let mut views = Vec::with_capacity(devices.size_hint().1.unwrap_or(0));
        let mut buf = Vec::new();
        let mut previous = None;
        for (device, maps) in devices {
            views.push(interner.device(&mut buf, pairs, driver, device, maps, previous));
            previous = Some(maps);
        }
        views
    }
}

/// The numbering in use, replaced by a fresh one of `limit` numbers once it is full.
struct Current(Mutex<Option<Arc<Numbering>>>);

impl Current {
    fn get(&self, limit: usize) -> Arc<Numbering> {
        let mut current = self.0.lock().expect("not poisoned");
        match &*current {
            Some(n) if !n.full() => Arc::clone(n),
            _ => Arc::clone(current.insert(Numbering::new(limit))),
        }
    }
}

/// Numbers for names, values and views. Names and values come from the API (untrusted
/// text), so they are hashed with a randomly seeded hasher (foldhash's `RandomState`: a
/// seed per process and per map, so no list of inputs collides in every map).
///
/// Values and views are kept in one array each ([`Arena`]), not one allocation per entry:
/// a device with a value no other device has (a UUID) adds a value and a view, so a
/// snapshot of N such devices would otherwise allocate 2N times.
#[derive(Debug, Default)]
pub(crate) struct Interner {
    names: HashMap<Box<str>, u32>,
    values: Arena<u8, foldhash::fast::RandomState>,
    views: Arena<u32, foldhash::fast::FixedState>,
    /// Scratch space for a view's key.
    key: Vec<u32>,
    /// The device interned last (its address, never dereferenced: only compared with the
    /// `previous` a caller passes), its driver's number, its (name, value) numbers in map
    /// order (attributes, then capacity) and how many of them are attributes. Devices of a
    /// slice mostly repeat their neighbour's names and most of its values: comparing with
    /// it is cheaper than hashing.
    last_device: usize,
    last_driver: u32,
    last: Vec<(u32, u32)>,
    last_attributes: usize,
}

/// Interned sequences: entry `i` is `items[spans[i]]`, `table` finds an entry by content.
struct Arena<T, S> {
    items: Vec<T>,
    spans: Vec<(usize, usize)>,
    /// (hash, entry number).
    table: HashTable<(u64, u32)>,
    hasher: S,
}

impl<T, S: Default> Default for Arena<T, S> {
    fn default() -> Self {
        Arena {
            items: Vec::new(),
            spans: Vec::new(),
            table: HashTable::new(),
            hasher: S::default(),
        }
    }
}

impl<T, S> std::fmt::Debug for Arena<T, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("entries", &self.spans.len())
            .field("items", &self.items.len())
            .finish()
    }
}

impl<T: Copy + Eq + Hash, S: BuildHasher> Arena<T, S> {
    fn len(&self) -> usize {
        self.spans.len()
    }

    /// The number of `seq`, a new one if it is not there yet.
    fn intern(&mut self, seq: &[T]) -> u32 {
        let hash = self.hasher.hash_one(seq);
        let Arena {
            items,
            spans,
            table,
            ..
        } = self;
        let found = table.find(hash, |&(h, id)| {
            h == hash && {
                let (start, end) = spans[id as usize];
                &items[start..end] == seq
            }
        });
        if let Some(&(_, id)) = found {
            return id;
        }
        let id = spans.len() as u32;
        let start = items.len();
        items.extend_from_slice(seq);
        spans.push((start, items.len()));
        table.insert_unique(hash, (hash, id), |&(h, _)| h);
        id
    }
}

/// What a CEL selector can see of a device, as numbers: driver, `allowMultipleAllocations`,
/// and the attribute and capacity maps as (map key, value) pairs sorted by key. The pairs
/// of a slice's devices sit in one array of its facts ([`Pairs`]), so looking at a node's
/// devices reads one stretch of memory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeviceView {
    pub driver: u32,
    /// `allowMultipleAllocations` is true.
    pub multi: bool,
    /// Where this device's attribute pairs start in [`Pairs`], followed by its capacities.
    start: u32,
    attributes: u16,
    capacity: u16,
    /// Equal for devices CEL cannot tell apart.
    pub id: u32,
}

/// The (map key, value) pairs of the [`DeviceView`]s of a slice.
pub(crate) type Pairs = Vec<(u32, u32)>;

/// One value an expression reads (see [`crate::reads::Read`]), resolved to numbers: the
/// map keys to look for, `None` where no device has such a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReadIds {
    pub capacity: bool,
    /// The read's domain as a driver name: the unqualified key applies to that driver only.
    pub domain: Option<u32>,
    /// The unqualified key (`name`), when it may be written so.
    pub plain: Option<u32>,
    /// The qualified key (`domain/name`).
    pub qualified: Option<u32>,
}

impl DeviceView {
    /// The value number `read` finds in this device, looked up the way the CEL environment
    /// looks (the unqualified key first when the domain is the driver's), or [`ABSENT`].
    pub fn value(&self, pairs: &[(u32, u32)], read: &ReadIds) -> u32 {
        let start = self.start as usize;
        let (attributes, capacity) = (usize::from(self.attributes), usize::from(self.capacity));
        let map = if read.capacity {
            &pairs[start + attributes..start + attributes + capacity]
        } else {
            &pairs[start..start + attributes]
        };
        let find = |key: Option<u32>| {
            let key = key?;
            map.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
        };
        if read.domain == Some(self.driver)
            && let Some(v) = find(read.plain)
        {
            return v;
        }
        find(read.qualified).unwrap_or(ABSENT)
    }
}

impl Interner {
    pub fn len(&self) -> usize {
        self.names.len() + self.values.len() + self.views.len()
    }

    pub fn name(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.names.get(s) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.insert(s.into(), id);
        id
    }

    pub fn name_id(&self, s: &str) -> Option<u32> {
        self.names.get(s).copied()
    }

    fn value(&mut self, bytes: &[u8]) -> u32 {
        self.values.intern(bytes)
    }

    /// The numbers of one device, its pairs appended to `pairs`; `buf` is scratch space.
    /// `previous`: the device of the same slice (same driver) given to this interner just
    /// before, if any.
    pub fn device(
        &mut self,
        buf: &mut Vec<u8>,
        pairs: &mut Pairs,
        driver: &str,
        device: &Device,
        maps: &crate::DeviceMaps,
        previous: Option<&crate::DeviceMaps>,
    ) -> DeviceView {
        let previous = previous.filter(|p| std::ptr::from_ref(*p) as usize == self.last_device);
        let driver = match previous {
            Some(_) => self.last_driver,
            None => self.name(driver),
        };
        let multi = device.allow_multiple_allocations.unwrap_or(false);
        let start = pairs.len();
        let last = std::mem::take(&mut self.last);
        // Position i of `previous`'s maps is `last[i]` (capacities after the attributes).
        let mut same_place = previous
            .map_or(&[][..], |p| &p.attributes)
            .iter()
            .zip(&last);
        for (k, a) in &maps.attributes {
            let pair = match same_place.next() {
                Some(((pk, pa), &(name, value))) if pk == k => {
                    if pa == a {
                        (name, value)
                    } else {
                        buf.clear();
                        attribute_bytes(buf, a);
                        (name, self.value(buf))
                    }
                }
                _ => {
                    buf.clear();
                    attribute_bytes(buf, a);
                    (self.name(k), self.value(buf))
                }
            };
            pairs.push(pair);
        }
        let attributes = pairs.len() - start;
        let mut same_place = previous
            .map_or(&[][..], |p| &p.capacity)
            .iter()
            .zip(last.get(self.last_attributes..).unwrap_or_default());
        for (k, c) in &maps.capacity {
            // CEL sees the quantity; the request policy is not visible to it.
            let pair = match same_place.next() {
                Some(((pk, pc), &(name, value))) if pk == k && pc.value == c.value => (name, value),
                _ => {
                    buf.clear();
                    buf.push(b'q');
                    buf.extend_from_slice(c.value.0.as_bytes());
                    (self.name(k), self.value(buf))
                }
            };
            pairs.push(pair);
        }
        let mut last = last;
        last.clear();
        last.extend_from_slice(&pairs[start..]);
        self.last = last;
        self.last_attributes = attributes;
        self.last_device = std::ptr::from_ref(maps) as usize;
        self.last_driver = driver;
        let capacity = pairs.len() - start - attributes;
        pairs[start..start + attributes].sort_unstable();
        pairs[start + attributes..].sort_unstable();
        let mine = &pairs[start..];
        let mut key = std::mem::take(&mut self.key);
        key.clear();
        key.extend([driver, u32::from(multi), attributes as u32]);
        key.extend(mine.iter().flat_map(|&(k, v)| [k, v]));
        let id = self.views.intern(&key);
        self.key = key;
        // The API allows at most 32 attributes and capacities per device; more than a u16
        // holds would have been refused by the API server long before.
        DeviceView {
            driver,
            multi,
            start: start as u32,
            attributes: attributes.min(u16::MAX as usize) as u16,
            capacity: capacity.min(u16::MAX as usize) as u16,
            id,
        }
    }

    /// Resolves what an expression reads to map-key numbers.
    pub fn reads(&self, reads: &[crate::reads::Read]) -> Vec<ReadIds> {
        reads
            .iter()
            .map(|r| ReadIds {
                capacity: r.capacity,
                domain: self.name_id(&r.domain),
                plain: (!r.name.contains('/'))
                    .then(|| self.name_id(&r.name))
                    .flatten(),
                qualified: self.name_id(&r.qualified),
            })
            .collect()
    }
}

fn put(buf: &mut Vec<u8>, bytes: &[u8]) {
    buf.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    buf.extend_from_slice(bytes);
}

fn put_list<T>(buf: &mut Vec<u8>, list: &Option<Vec<T>>, item: impl Fn(&mut Vec<u8>, &T)) {
    match list {
        None => buf.push(0),
        Some(v) => {
            buf.push(1);
            buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
            for x in v {
                item(buf, x);
            }
        }
    }
}

/// An attribute value as bytes, length-prefixed field by field, so that two attributes
/// give equal bytes exactly when they are equal.
fn attribute_bytes(buf: &mut Vec<u8>, a: &DeviceAttribute) {
    let DeviceAttribute {
        bool,
        bools,
        int,
        ints,
        string,
        strings,
        version,
        versions,
    } = a;
    buf.push(b'a');
    let opt_str = |buf: &mut Vec<u8>, s: &Option<String>| match s {
        None => buf.push(0),
        Some(s) => {
            buf.push(1);
            put(buf, s.as_bytes());
        }
    };
    match bool {
        None => buf.push(0),
        Some(b) => buf.push(2 + u8::from(*b)),
    }
    match int {
        None => buf.push(0),
        Some(i) => {
            buf.push(1);
            buf.extend_from_slice(&i.to_le_bytes());
        }
    }
    opt_str(buf, string);
    opt_str(buf, version);
    put_list(buf, bools, |buf, b| buf.push(u8::from(*b)));
    put_list(buf, ints, |buf, i| buf.extend_from_slice(&i.to_le_bytes()));
    put_list(buf, strings, |buf, s| put(buf, s.as_bytes()));
    put_list(buf, versions, |buf, s| put(buf, s.as_bytes()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::device;

    fn view(
        i: &mut Interner,
        pairs: &mut Pairs,
        driver: &str,
        d: crate::build::DeviceBuilder,
    ) -> DeviceView {
        let mut device = d.build();
        let maps = crate::slice::DeviceMaps::take(&mut device);
        i.device(&mut Vec::new(), pairs, driver, &device, &maps, None)
    }

    #[test]
    fn devices_cel_cannot_tell_apart_share_a_view() {
        let mut i = Interner::default();
        let p = &mut Pairs::new();
        let mut id = |driver: &str, d: crate::build::DeviceBuilder| view(&mut i, p, driver, d).id;
        let a = id("g", device("a").string("model", "h100").int("n", 1));
        let b = id("g", device("b").int("n", 1).string("model", "h100"));
        let c = id("g", device("c").string("model", "h100").int("n", 2));
        let d = id("other", device("d").string("model", "h100").int("n", 1));
        let e = id("g", device("e").string("model", "h100").version("n", "1"));
        assert_eq!(a, b, "names and map order are invisible to CEL");
        assert_ne!(a, c);
        assert_ne!(a, d, "the driver is visible");
        assert_ne!(a, e, "an int and a version are different values");
    }

    #[test]
    fn a_full_numbering_is_replaced_and_the_old_one_kept_by_its_users() {
        let current = Current(Mutex::new(None));
        let first = current.get(4);
        assert!(Arc::ptr_eq(&first, &current.get(4)), "not full: the same");
        let mut pairs = Pairs::new();
        let mut gpu = device("a").string("model", "h100").build();
        let maps = crate::slice::DeviceMaps::take(&mut gpu);
        first.number("g", [(&gpu, &maps)].into_iter(), &mut pairs);
        // The driver, "model", "h100" and the view: four numbers.
        assert!(first.full());
        let second = current.get(4);
        assert!(!Arc::ptr_eq(&first, &second), "full: a fresh one");
        assert_eq!(second.read().len(), 0);
        assert_eq!(first.read().len(), 4, "left as it was for whoever holds it");
    }

    #[test]
    fn reads_find_values_as_cel_does() {
        let mut i = Interner::default();
        let p = &mut Pairs::new();
        let plain = view(&mut i, p, "g", device("a").string("model", "h100"));
        let qualified = view(&mut i, p, "g", device("b").string("g/model", "h100"));
        let foreign = view(&mut i, p, "nic", device("c").string("model", "h100"));
        let read = |domain: &str, name: &str| crate::reads::Read {
            capacity: false,
            domain: domain.into(),
            name: name.into(),
            qualified: format!("{domain}/{name}"),
        };
        let ids = i.reads(&[read("g", "model"), read("g", "absent")]);
        assert_eq!(plain.value(p, &ids[0]), qualified.value(p, &ids[0]));
        assert_ne!(plain.value(p, &ids[0]), ABSENT);
        assert_eq!(plain.value(p, &ids[1]), ABSENT);
        // `model` on a device of driver "nic" is nic's attribute, not g's.
        assert_eq!(foreign.value(p, &ids[0]), ABSENT);
    }
}
