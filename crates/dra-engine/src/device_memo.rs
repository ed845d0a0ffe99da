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
//! or failed are not kept. A kept reason names the claims of the pod it was found for;
//! another pod gets it with its own claims' names ([`Renamed`]: once per attempt for each
//! distinct reason, which many nodes share).
//!
//! kube-scheduler searches every node again for every pod; the answers are the same.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use dra_allocator::{Allocation, Snapshot};
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::framework::Status;
use crate::state::NodeInfo;

/// Shards of the map: Filter runs on several threads at once.
const SHARDS: usize = 16;
/// Past this many answers a shard starts over (bounded memory: two claim shapes on
/// 50,000 nodes fit).
const SHARD_LIMIT: usize = 1 << 14;
/// Past this many distinct reasons the shared ones start over.
const UNFIT_LIMIT: usize = 1 << 12;

/// Why no devices fit on a node, as found for the pod whose claims are `claims`
/// (namespace/name, in order); one for every node that gave the same reasons.
#[derive(Debug)]
pub(crate) struct Unfit {
    claims: Vec<String>,
    status: Status,
}

/// What is kept for one node.
#[derive(Clone)]
pub(crate) enum Kept {
    Found(Allocation),
    Unfit(Arc<Unfit>),
}

/// The shared [`Unfit`]s, by their claims and status.
type UnfitByReasons = foldhash::HashMap<(Vec<String>, Status), Arc<Unfit>>;

struct Entry {
    /// The pools the node sees ([`Snapshot::node_pools`]) and their stamp when found.
    pools: Vec<u32>,
    stamp: u64,
    kept: Kept,
}

/// The memo; one per engine (a fork starts with an empty one).
#[derive(Default)]
pub struct DeviceMemo {
    /// The snapshot the entries were found on; another one empties the memo.
    snapshot: AtomicU64,
    shards: [Mutex<foldhash::HashMap<(u128, u64), Entry>>; SHARDS],
    unfit: Mutex<UnfitByReasons>,
    hits: AtomicU64,
}

impl std::fmt::Debug for DeviceMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMemo")
            .field("hits", &self.hits.load(Ordering::Relaxed))
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
    /// Starts a pod's attempt on `snapshot`: answers found on another snapshot are dropped.
    pub(crate) fn begin(&self, snapshot: &Snapshot) {
        if self.snapshot.swap(snapshot.id(), Ordering::Relaxed) != snapshot.id() {
            for shard in &self.shards {
                shard.lock().expect("not poisoned").clear();
            }
            self.unfit.lock().expect("not poisoned").clear();
        }
    }

    fn shard(&self, key: (u128, u64)) -> &Mutex<foldhash::HashMap<(u128, u64), Entry>> {
        &self.shards[(key.1 as usize) % SHARDS]
    }

    /// The key: the claims' shape and the Node object (its version is unique in the
    /// process, so it names the node too).
    fn key(shape: u128, node: &NodeInfo) -> (u128, u64) {
        (shape, node.object_version)
    }

    /// What was found for claims of `shape` on `node` with the same inputs, if anything.
    pub(crate) fn get(&self, shape: u128, snapshot: &Snapshot, node: &NodeInfo) -> Option<Kept> {
        let key = Self::key(shape, node);
        let shard = self.shard(key).lock().expect("not poisoned");
        let found = shard
            .get(&key)
            .filter(|e| e.stamp == snapshot.pools_stamp(&e.pools))
            .map(|e| e.kept.clone());
        if found.is_some() {
            self.hits.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// Keep what was found for `claims` (of `shape`) on `node`.
    pub(crate) fn put(
        &self,
        shape: u128,
        claims: &[String],
        snapshot: &Snapshot,
        node: &NodeInfo,
        answer: Result<&Allocation, &Status>,
    ) {
        let kept = match answer {
            Ok(a) => Kept::Found(a.clone()),
            Err(status) => Kept::Unfit(self.unfit(claims, status)),
        };
        let key = Self::key(shape, node);
        let pools = snapshot.node_pools(node.name());
        let entry = Entry {
            stamp: snapshot.pools_stamp(&pools),
            pools,
            kept,
        };
        let mut shard = self.shard(key).lock().expect("not poisoned");
        if shard.len() >= SHARD_LIMIT && !shard.contains_key(&key) {
            shard.clear();
        }
        shard.insert(key, entry);
    }

    /// The one [`Unfit`] for these claims and reasons.
    fn unfit(&self, claims: &[String], status: &Status) -> Arc<Unfit> {
        let mut all = self.unfit.lock().expect("not poisoned");
        let key = (claims.to_vec(), status.clone());
        if let Some(u) = all.get(&key) {
            return u.clone();
        }
        if all.len() >= UNFIT_LIMIT {
            all.clear();
        }
        let u = Arc::new(Unfit {
            claims: key.0.clone(),
            status: key.1.clone(),
        });
        all.insert(key, u.clone());
        u
    }

    /// How many answers were taken from the memo (for tests and benches).
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }
}

/// Kept reasons in the words of one attempt's claims, each renamed once per attempt.
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
        let mut status = unfit.status.clone();
        if unfit.claims != self.claims {
            for reason in &mut status.reasons {
                *reason = rename(reason, &unfit.claims, &self.claims);
            }
        }
        let mut done = self.done.write().expect("not poisoned");
        done.insert(at, (unfit.clone(), status.clone()));
        status
    }
}

/// `text` with each of the names `from` (whole names: not followed by a character a name
/// may have) replaced by the name at the same place in `to`, in one pass.
fn rename(text: &str, from: &[String], to: &[String]) -> String {
    let part_of_name = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    'scan: while !rest.is_empty() {
        let before_ok = out
            .chars()
            .last()
            .is_none_or(|c| !part_of_name(c) && c != '/');
        if before_ok {
            for (old, new) in from.iter().zip(to) {
                if let Some(after) = rest.strip_prefix(old.as_str())
                    && !after.starts_with(part_of_name)
                {
                    out.push_str(new);
                    rest = after;
                    continue 'scan;
                }
            }
        }
        let c = rest.chars().next().expect("not empty");
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::rename;

    #[test]
    fn a_kept_reason_names_the_claims_of_the_pod_that_reads_it() {
        let from = ["default/a".to_string(), "default/b".to_string()];
        let to = ["default/b".to_string(), "default/a-2".to_string()];
        assert_eq!(
            rename(
                "claim default/a request gpu: 0 available; claim default/b request nic; default/ab, xdefault/a",
                &from,
                &to
            ),
            "claim default/b request gpu: 0 available; claim default/a-2 request nic; default/ab, xdefault/a"
        );
    }
}
