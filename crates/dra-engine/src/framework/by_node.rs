//! What an attempt's Filter found per node, for its Score and Reserve: written by the
//! threads that filter nodes at once, so it is split into shards by node, each with its own
//! lock, instead of one lock that every feasible node takes in turn.

use std::sync::RwLock;

use crossbeam_utils::CachePadded;

use crate::state::NodeInfo;

const SHARDS: usize = 16;
/// The most values [`ByNode::with_room_for`] makes room for up front: about as many as
/// kube-scheduler's percentageOfNodesToScore looks at in a large cluster.
const ROOM: usize = 4096;

/// A value per node, by [`NodeInfo::object_version`].
pub struct ByNode<V> {
    shards: [CachePadded<RwLock<foldhash::HashMap<u64, V>>>; SHARDS],
}

impl<V> Default for ByNode<V> {
    fn default() -> Self {
        ByNode {
            shards: std::array::from_fn(|_| CachePadded::new(RwLock::default())),
        }
    }
}

impl<V> ByNode<V> {
    /// Room for about `nodes` values without growing (at most [`ROOM`] in all): an
    /// attempt's Filter fills it node after node, and each growth copies what is there.
    pub fn with_room_for(nodes: usize) -> Self {
        let per_shard = nodes.min(ROOM).div_ceil(SHARDS);
        ByNode {
            shards: std::array::from_fn(|_| {
                CachePadded::new(RwLock::new(foldhash::HashMap::with_capacity_and_hasher(
                    per_shard,
                    Default::default(),
                )))
            }),
        }
    }

    fn shard(&self, node: &NodeInfo) -> &RwLock<foldhash::HashMap<u64, V>> {
        &self.shards[node.object_version as usize % SHARDS]
    }

    pub fn insert(&self, node: &NodeInfo, value: V) {
        self.shard(node)
            .write()
            .expect("not poisoned")
            .insert(node.object_version, value);
    }

    /// `read` of the node's value, if any, without a copy.
    pub fn read<T>(&self, node: &NodeInfo, read: impl FnOnce(&V) -> T) -> Option<T> {
        self.shard(node)
            .read()
            .expect("not poisoned")
            .get(&node.object_version)
            .map(read)
    }

    pub fn remove(&mut self, node: &NodeInfo) -> Option<V> {
        self.shards[node.object_version as usize % SHARDS]
            .get_mut()
            .expect("not poisoned")
            .remove(&node.object_version)
    }
}
