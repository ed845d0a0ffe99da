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
//! ([`Snapshot::id`]), the same allocations on the node's pools ([`Snapshot::node_stamp`]),
//! and the same Node object ([`NodeInfo::object_version`]). Searches that ran out of time
//! or failed are not kept. A kept reason names the claims of the pod it was found for;
//! another pod gets it with its own claims' names.
//!
//! kube-scheduler searches every node again for every pod; the answers are the same.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use dra_allocator::{Allocation, Snapshot};
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::framework::Status;
use crate::state::NodeInfo;

/// Shards of the map: Filter runs on several threads at once.
const SHARDS: usize = 16;
/// Past this many answers a shard starts over (bounded memory: two claim shapes on
/// 50,000 nodes fit).
const SHARD_LIMIT: usize = 1 << 14;

/// An answer for one node: the devices found (with their quality), or why none fit.
pub(crate) type Answer = Result<Allocation, Status>;

struct Entry {
    /// The claims (namespace/name) the answer was found for, in order.
    claims: Vec<String>,
    stamp: u64,
    answer: Answer,
}

/// The memo; one per engine (a fork starts with an empty one).
#[derive(Default)]
pub struct DeviceMemo {
    /// The snapshot the entries were found on; another one empties the memo.
    snapshot: AtomicU64,
    shards: [Mutex<foldhash::HashMap<(u128, u64), Entry>>; SHARDS],
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

    /// The answer for claims of `shape` on `node`, if one was found with the same inputs.
    pub(crate) fn get(
        &self,
        shape: u128,
        claims: &[String],
        snapshot: &Snapshot,
        node: &NodeInfo,
    ) -> Option<Answer> {
        let key = Self::key(shape, node);
        let stamp = snapshot.node_stamp(node.name());
        let shard = self.shard(key).lock().expect("not poisoned");
        let found = shard
            .get(&key)
            .filter(|e| e.stamp == stamp)
            .map(|e| match &e.answer {
                Err(status) if e.claims != claims => {
                    let mut status = status.clone();
                    for reason in &mut status.reasons {
                        *reason = rename(reason, &e.claims, claims);
                    }
                    Err(status)
                }
                answer => answer.clone(),
            });
        if found.is_some() {
            self.hits.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// Keep the answer found for claims of `shape` on `node`.
    pub(crate) fn put(
        &self,
        shape: u128,
        claims: &[String],
        snapshot: &Snapshot,
        node: &NodeInfo,
        answer: &Answer,
    ) {
        let key = Self::key(shape, node);
        let entry = Entry {
            claims: claims.to_vec(),
            stamp: snapshot.node_stamp(node.name()),
            answer: answer.clone(),
        };
        let mut shard = self.shard(key).lock().expect("not poisoned");
        if shard.len() >= SHARD_LIMIT && !shard.contains_key(&key) {
            shard.clear();
        }
        shard.insert(key, entry);
    }

    /// How many answers were taken from the memo (for tests and benches).
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
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
