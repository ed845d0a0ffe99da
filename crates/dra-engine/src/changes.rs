//! When each part of the engine's state last changed, on a logical clock, so that a
//! decision made on a fork of the engine (a copy given to a long search while the engine
//! goes on placing other pods, see [`crate::Engine::fork`]) can be checked before it is
//! taken: it still holds when nothing it relies on changed since the fork.
//!
//! A placement relies on its node (the node object and the pods bound there, for the node
//! filters and resources), on the pools its devices come from (what is allocated there,
//! for devices in use, counters and capacity), on the pod itself, and on the DRA objects
//! that the allocator's view is built from (classes, slices, taint rules). The check is
//! conservative: any change there, even one that would not matter, refuses the decision
//! and the pod is tried again.

use std::collections::HashMap;

use k8s_openapi::api::resource::v1::AllocationResult;

use crate::state::ObjectKey;

#[derive(Clone, Debug, Default)]
pub(crate) struct Changes {
    clock: u64,
    /// Classes, slices or taint rules.
    dra_objects: u64,
    /// (driver, pool): an allocation there was added or removed.
    pools: HashMap<(String, String), u64>,
    /// A node's object, or a pod bound to it.
    nodes: HashMap<String, u64>,
    pods: HashMap<ObjectKey, u64>,
}

impl Changes {
    /// The current time on the clock: everything changed later is "since".
    pub(crate) fn now(&self) -> u64 {
        self.clock
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    pub(crate) fn dra_objects(&mut self) {
        self.dra_objects = self.tick();
    }

    pub(crate) fn allocation(&mut self, allocation: &AllocationResult) {
        let t = self.tick();
        for result in allocation
            .devices
            .iter()
            .flat_map(|d| d.results.iter().flatten())
        {
            self.pools
                .insert((result.driver.clone(), result.pool.clone()), t);
        }
    }

    pub(crate) fn node(&mut self, name: &str) {
        let t = self.tick();
        self.nodes.insert(name.to_string(), t);
    }

    pub(crate) fn pod(&mut self, key: &ObjectKey) {
        let t = self.tick();
        self.pods.insert(key.clone(), t);
    }

    pub(crate) fn forget_pod(&mut self, key: &ObjectKey) {
        self.pods.remove(key);
    }

    /// What changed after `mark` among what a placement of `pod` on `node` with devices
    /// from `pools` relies on, in words; `None` when nothing did.
    pub(crate) fn since<'a>(
        &self,
        mark: u64,
        pod: &ObjectKey,
        node: &str,
        mut pools: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> Option<String> {
        let after = |t: Option<&u64>| t.is_some_and(|t| *t > mark);
        if self.dra_objects > mark {
            return Some("device classes, slices or taint rules changed".into());
        }
        if after(self.pods.get(pod)) {
            return Some(format!("pod {pod} changed"));
        }
        if after(self.nodes.get(node)) {
            return Some(format!("node {node} or its pods changed"));
        }
        pools
            .find(|(driver, pool)| after(self.pools.get(&(driver.to_string(), pool.to_string()))))
            .map(|(driver, pool)| format!("allocations in pool {driver}/{pool} changed"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocation(pool: &str) -> AllocationResult {
        serde_json::from_value(serde_json::json!({"devices": {"results": [
            {"request": "gpu", "driver": "gpu.example.com", "pool": pool, "device": "gpu-0"}]}}))
        .unwrap()
    }

    #[test]
    fn only_changes_after_the_mark_to_what_the_placement_uses_count() {
        let pod = ObjectKey::new("default", "p");
        let mut c = Changes::default();
        c.allocation(&allocation("n1"));
        c.node("n1");
        let mark = c.now();
        let pools = || [("gpu.example.com", "n1")].into_iter();
        assert_eq!(
            c.since(mark, &pod, "n1", pools()),
            None,
            "all before the mark"
        );
        c.allocation(&allocation("n2"));
        c.node("n2");
        c.pod(&ObjectKey::new("default", "other"));
        assert_eq!(c.since(mark, &pod, "n1", pools()), None, "elsewhere");
        c.allocation(&allocation("n1"));
        assert_eq!(
            c.since(mark, &pod, "n1", pools()).as_deref(),
            Some("allocations in pool gpu.example.com/n1 changed")
        );
        let mark = c.now();
        c.node("n1");
        assert_eq!(
            c.since(mark, &pod, "n1", pools()).as_deref(),
            Some("node n1 or its pods changed")
        );
        let mark = c.now();
        c.pod(&pod);
        assert_eq!(
            c.since(mark, &pod, "n1", pools()).as_deref(),
            Some("pod default/p changed")
        );
        c.dra_objects();
        assert!(c.since(mark, &pod, "n1", pools()).is_some());
    }
}
