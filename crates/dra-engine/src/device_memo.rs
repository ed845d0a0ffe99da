//! What DynamicResources' Filter found for a node, kept for the next pods whose claims ask
//! for the same thing.
//!
//! A device search on a node depends on the claims to allocate (their specs and
//! namespaces), on the snapshot (classes, slices, taint rules, features), on what is
//! allocated in the pools the node sees, and on the Node object (device and slice node
//! selectors). Between two pods of one Deployment only one node's pools changed: the
//! node the first went to. Every other node gives the same answer again, so it is taken
//! from here instead of searched for. An entry is used only when all of those inputs are
//! the same: the same claim specs (by a 128-bit hash), the same snapshot
//! ([`Snapshot::id`]), the same allocations on the node's pools ([`Snapshot::pools_stamp`]),
//! and the same Node object ([`NodeInfo::object_version`]). Searches that ran out of time
//! or failed are not kept. A kept reason has the names of the claims it was found for
//! taken out ([`Unfit`]), so that nodes and pods with the same reasons share one; each pod
//! reads it with its own claims' names ([`Renamed`]: written once per attempt).
//!
//! The answers for one claim shape are a [`Table`], an array by [`NodeInfo::slot`]: a
//! pod's Filter reads it node after node, in the order the slots were given, instead of
//! one hash lookup (and cache miss) a node. A slot a removed node gave back may hold its
//! answer when a new node takes it; the Node object check turns that away.
//!
//! kube-scheduler searches every node again for every pod; the answers are the same.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use smallvec::SmallVec;

use dra_allocator::{Allocation, Snapshot};
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::framework::{Code, Status};
use crate::state::NodeInfo;

/// Past this many answers in all tables the memo starts over (bounded memory: five claim
/// shapes on 50,000 nodes fit).
const ENTRY_LIMIT: usize = 1 << 18;
/// Past this many distinct reasons the shared ones start over.
const UNFIT_LIMIT: usize = 1 << 12;

/// Why no devices fit on a node, with the names of the claims it was found for taken out
/// ([`Part::Claim`]): one for every node and every pod that gave the same reasons.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct Unfit {
    code: Code,
    plugin: &'static str,
    /// Each reason, in parts.
    reasons: Vec<Vec<Part>>,
}

/// A piece of a kept reason: text, or the name of the pod's claim at that place in its
/// list of claims to allocate.
#[derive(Debug, PartialEq, Eq, Hash)]
enum Part {
    Text(String),
    Claim(usize),
}
/// What is kept for one node: the devices found (with how good they are) and how long
/// the search for them took; or why none fit.
#[derive(Clone)]
pub(crate) enum Kept {
    Found(Arc<Allocation>, Duration),
    Unfit(Arc<Unfit>),
}

/// The shared [`Unfit`]s.
type UnfitByReasons = foldhash::HashSet<Arc<Unfit>>;

struct Entry {
    /// The Node object it was found for ([`NodeInfo::object_version`]).
    object_version: u64,
    /// The pools the node sees ([`Snapshot::node_pools`]) and their stamp when found;
    /// inline (a node sees a pool or two): one memory read less on every lookup.
    pools: SmallVec<[u32; 4]>,
    stamp: u64,
    kept: Kept,
}

/// A node's place in a [`Table`]: its lock is its own, so the threads that filter nodes
/// at once do not wait for each other.
#[derive(Default)]
struct Slot {
    entry: Option<Entry>,
    /// Answers taken from this slot.
    hits: u64,
}

/// The answers for one claim shape, by [`NodeInfo::slot`]: a pod's Filter reads them node
/// after node, from one array (a hash map's entries, spread over memory, cost a cache
/// miss each).
pub(crate) struct Table {
    slots: Box<[Mutex<Slot>]>,
}

/// The memo; one per engine (a fork starts with an empty one).
#[derive(Default)]
pub struct DeviceMemo {
    /// The snapshot the entries were found on; another one empties the memo.
    snapshot: AtomicU64,
    tables: RwLock<foldhash::HashMap<u128, Arc<Table>>>,
    /// Hits counted in tables since dropped.
    dropped_hits: AtomicU64,
    unfit: Mutex<UnfitByReasons>,
}

impl std::fmt::Debug for DeviceMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMemo")
            .field("hits", &self.hits())
            .finish()
    }
}

/// The claims to allocate, as the search sees them: their specs, in order, and their
/// namespaces (admin access depends on the namespace).
pub(crate) fn shape_of(claims: &[&ResourceClaim]) -> u128 {
    let text: Vec<(Option<&str>, String)> = claims
        .iter()
        .map(|c| {
            (
                c.metadata.namespace.as_deref(),
                serde_json::to_string(&c.spec).unwrap_or_default(),
            )
        })
        .collect();
    let half = |salt: u8| {
        let mut h = DefaultHasher::new();
        salt.hash(&mut h);
        text.hash(&mut h);
        h.finish()
    };
    (u128::from(half(1)) << 64) | u128::from(half(2))
}

impl DeviceMemo {
    /// Starts a pod's attempt on `snapshot`: answers found on another snapshot are
    /// dropped. Returns the table for claims of `shape` on a cluster whose node slots end
    /// at `slots` ([`crate::state::NodeSlots::end`]).
    pub(crate) fn begin(&self, snapshot: &Snapshot, shape: u128, slots: usize) -> Arc<Table> {
        if self.snapshot.swap(snapshot.id(), Ordering::Relaxed) != snapshot.id() {
            self.start_over(&mut self.tables.write().expect("not poisoned"));
            self.unfit.lock().expect("not poisoned").clear();
        }
        if let Some(table) = self.tables.read().expect("not poisoned").get(&shape)
            && table.slots.len() >= slots
        {
            return table.clone();
        }
        let mut tables = self.tables.write().expect("not poisoned");
        let old = tables.remove(&shape);
        let len = slots.max(old.as_ref().map_or(0, |t| t.slots.len()));
        let in_all: usize = tables.values().map(|t| t.slots.len()).sum();
        if in_all + len > ENTRY_LIMIT {
            self.start_over(&mut tables);
        }
        let table = Arc::new(Table::grown_from(old.as_deref(), len));
        tables.insert(shape, table.clone());
        table
    }

    fn start_over(&self, tables: &mut foldhash::HashMap<u128, Arc<Table>>) {
        let hits: u64 = tables.values().map(|t| t.hits()).sum();
        self.dropped_hits.fetch_add(hits, Ordering::Relaxed);
        tables.clear();
    }

    /// Keep what was found for `claims` on `node`, in `table`.
    pub(crate) fn put(
        &self,
        table: &Table,
        claims: &[String],
        snapshot: &Snapshot,
        node: &NodeInfo,
        answer: Result<(&Arc<Allocation>, Duration), &Status>,
    ) {
        let Some(slot) = table.slots.get(node.slot as usize) else {
            return;
        };
        let kept = match answer {
            Ok((a, took)) => Kept::Found(a.clone(), took),
            Err(status) => Kept::Unfit(self.unfit(claims, status)),
        };
        let pools: SmallVec<[u32; 4]> = snapshot.node_pools(node.name()).into_iter().collect();
        let entry = Entry {
            object_version: node.object_version,
            stamp: snapshot.pools_stamp(&pools),
            pools,
            kept,
        };
        slot.lock().expect("not poisoned").entry = Some(entry);
    }

    /// The one [`Unfit`] for these reasons, found for `claims`.
    fn unfit(&self, claims: &[String], status: &Status) -> Arc<Unfit> {
        let unfit = Unfit {
            code: status.code,
            plugin: status.plugin,
            reasons: status.reasons.iter().map(|r| parts(r, claims)).collect(),
        };
        let mut all = self.unfit.lock().expect("not poisoned");
        if let Some(u) = all.get(&unfit) {
            return u.clone();
        }
        if all.len() >= UNFIT_LIMIT {
            all.clear();
        }
        let u = Arc::new(unfit);
        all.insert(u.clone());
        u
    }

    /// How many answers were taken from the memo (for tests and benches).
    pub fn hits(&self) -> u64 {
        let kept: u64 = self
            .tables
            .read()
            .expect("not poisoned")
            .values()
            .map(|t| t.hits())
            .sum();
        kept + self.dropped_hits.load(Ordering::Relaxed)
    }
}

impl Table {
    /// A table of `len` slots with what `old` kept.
    fn grown_from(old: Option<&Table>, len: usize) -> Table {
        let mut slots: Vec<Mutex<Slot>> = Vec::with_capacity(len);
        if let Some(old) = old {
            slots.extend(
                old.slots
                    .iter()
                    .map(|s| Mutex::new(std::mem::take(&mut *s.lock().expect("not poisoned")))),
            );
        }
        slots.resize_with(len, Mutex::default);
        Table {
            slots: slots.into_boxed_slice(),
        }
    }

    /// What was found for this table's claims on `node` with the same inputs, if anything.
    pub(crate) fn get(&self, snapshot: &Snapshot, node: &NodeInfo) -> Option<Kept> {
        let mut slot = self
            .slots
            .get(node.slot as usize)?
            .lock()
            .expect("not poisoned");
        let found = slot
            .entry
            .as_ref()
            .filter(|e| {
                e.object_version == node.object_version && e.stamp == snapshot.pools_stamp(&e.pools)
            })
            .map(|e| e.kept.clone());
        slot.hits += u64::from(found.is_some());
        found
    }

    fn hits(&self) -> u64 {
        self.slots
            .iter()
            .map(|s| s.lock().expect("not poisoned").hits)
            .sum()
    }
}

/// Kept reasons in the words of one attempt's claims, each written out once per attempt.
#[derive(Default)]
pub(crate) struct Renamed {
    claims: Vec<String>,
    /// By the [`Unfit`]'s address; the `Arc` held here keeps that address its own.
    done: RwLock<foldhash::HashMap<usize, (Arc<Unfit>, Status)>>,
}

impl Renamed {
    /// For an attempt whose claims (namespace/name, in order) are `claims`.
    pub(crate) fn new(claims: Vec<String>) -> Self {
        Renamed {
            claims,
            done: RwLock::default(),
        }
    }

    pub(crate) fn claims(&self) -> &[String] {
        &self.claims
    }

    /// The status of `unfit`, naming this attempt's claims.
    pub(crate) fn status(&self, unfit: &Arc<Unfit>) -> Status {
        let at = Arc::as_ptr(unfit) as usize;
        if let Some((_, status)) = self.done.read().expect("not poisoned").get(&at) {
            return status.clone();
        }
        let reasons = unfit
            .reasons
            .iter()
            .map(|r| written(r, &self.claims))
            .collect();
        let status = Status::new(unfit.code, reasons).with_plugin(unfit.plugin);
        let mut done = self.done.write().expect("not poisoned");
        done.insert(at, (unfit.clone(), status.clone()));
        status
    }
}

/// `text` in parts: each of the names `claims` (whole names: not after a character a name
/// or a namespace may have, nor before one a name may have) taken out as its place in
/// `claims`.
fn parts(text: &str, claims: &[String]) -> Vec<Part> {
    let part_of_name = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    let mut parts = Vec::new();
    let mut plain = String::new();
    let mut before: Option<char> = None;
    let mut rest = text;
    'scan: while !rest.is_empty() {
        if before.is_none_or(|c| !part_of_name(c) && c != '/') {
            for (i, name) in claims.iter().enumerate() {
                if let Some(after) = rest.strip_prefix(name.as_str())
                    && !after.starts_with(part_of_name)
                {
                    if !plain.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut plain)));
                    }
                    parts.push(Part::Claim(i));
                    before = name.chars().last();
                    rest = after;
                    continue 'scan;
                }
            }
        }
        let c = rest.chars().next().expect("not empty");
        plain.push(c);
        before = Some(c);
        rest = &rest[c.len_utf8()..];
    }
    if !plain.is_empty() {
        parts.push(Part::Text(plain));
    }
    parts
}

/// A reason in `parts` written with the names `claims`.
fn written(parts: &[Part], claims: &[String]) -> String {
    parts
        .iter()
        .map(|p| match p {
            Part::Text(t) => t.as_str(),
            Part::Claim(i) => claims.get(*i).map_or("", String::as_str),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{parts, written};

    #[test]
    fn a_kept_reason_names_the_claims_of_the_pod_that_reads_it() {
        let from = ["default/a".to_string(), "default/b".to_string()];
        let to = ["default/b".to_string(), "default/a-2".to_string()];
        assert_eq!(
            written(
                &parts(
                    "claim default/a request gpu: 0 available; claim default/b request nic; default/ab, xdefault/a",
                    &from,
                ),
                &to
            ),
            "claim default/b request gpu: 0 available; claim default/a-2 request nic; default/ab, xdefault/a"
        );
    }
}
