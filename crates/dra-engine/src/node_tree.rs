//! The order in which a scheduling cycle examines nodes: kube-scheduler's node tree.
//!
//! kube-scheduler keeps its nodes by zone, each zone's nodes in the order they arrived
//! (zones in the order their first node arrived), and lists them one zone at a time in
//! turn: the first node of each zone, then the second of each, and so on. A cycle that
//! stops after enough feasible nodes (`percentageOfNodesToScore`) so looks at every zone
//! alike, and the next cycle goes on from where it stopped (`nextStartNodeIndex`).
//!
//! A node's zone is its region and zone labels (the `failure-domain.beta.kubernetes.io`
//! ones first, then `topology.kubernetes.io`), as kube-scheduler reads them. A node whose
//! zone changes moves to the end of its new zone.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;

const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
const ZONE: &str = "topology.kubernetes.io/zone";
const BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
const REGION: &str = "topology.kubernetes.io/region";

/// The zone a node is listed under: region and zone, or empty when the node has neither.
pub fn zone_key(node: &Node) -> String {
    let Some(labels) = node.metadata.labels.as_ref() else {
        return String::new();
    };
    let label = |first: &str, then: &str| {
        labels
            .get(first)
            .or_else(|| labels.get(then))
            .cloned()
            .unwrap_or_default()
    };
    let zone = label(BETA_ZONE, ZONE);
    let region = label(BETA_REGION, REGION);
    if region.is_empty() && zone.is_empty() {
        return String::new();
    }
    // A NUL between them: neither may hold one, though either may hold a colon.
    format!("{region}:\0:{zone}")
}

/// Node names by zone, each zone in arrival order; zones in the order they appeared.
#[derive(Clone, Debug, Default)]
pub struct NodeTree {
    zones: Vec<(String, Vec<String>)>,
    /// Each node's zone, to find it again.
    zone_of: BTreeMap<String, String>,
}

impl NodeTree {
    pub fn len(&self) -> usize {
        self.zone_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.zone_of.is_empty()
    }

    /// A new node goes at the end of its zone; a node already here stays where it is.
    pub fn add(&mut self, name: &str, zone: String) {
        if self.zone_of.contains_key(name) {
            return;
        }
        match self.zones.iter_mut().find(|(z, _)| *z == zone) {
            Some((_, names)) => names.push(name.to_string()),
            None => self.zones.push((zone.clone(), vec![name.to_string()])),
        }
        self.zone_of.insert(name.to_string(), zone);
    }

    /// Takes the node out (a zone left empty goes too); whether it was here.
    pub fn remove(&mut self, name: &str) -> bool {
        let Some(zone) = self.zone_of.remove(name) else {
            return false;
        };
        if let Some(at) = self.zones.iter().position(|(z, _)| *z == zone) {
            let names = &mut self.zones[at].1;
            names.retain(|n| n != name);
            if names.is_empty() {
                self.zones.remove(at);
            }
        }
        true
    }

    /// A node whose zone changed moves to the end of its new zone; otherwise nothing moves.
    pub fn update(&mut self, name: &str, zone: String) {
        if self.zone_of.get(name) == Some(&zone) {
            return;
        }
        self.remove(name);
        self.add(name, zone);
    }

    /// Every node, one zone at a time in turn.
    pub fn list(&self) -> Vec<&str> {
        let mut out = Vec::with_capacity(self.len());
        for round in 0.. {
            let before = out.len();
            out.extend(
                self.zones
                    .iter()
                    .filter_map(|(_, names)| names.get(round).map(String::as_str)),
            );
            if out.len() == before {
                break;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(labels: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn the_zone_key_is_region_and_zone_with_the_beta_labels_first() {
        assert_eq!(zone_key(&node(&[])), "");
        assert_eq!(zone_key(&node(&[(ZONE, "a")])), ":\0:a");
        assert_eq!(zone_key(&node(&[(REGION, "r"), (ZONE, "a")])), "r:\0:a");
        assert_eq!(
            zone_key(&node(&[(ZONE, "a"), (BETA_ZONE, "old"), (REGION, "r")])),
            "r:\0:old"
        );
        assert_eq!(zone_key(&node(&[(BETA_REGION, "r")])), "r:\0:");
    }

    #[test]
    fn zones_take_turns_and_each_keeps_its_arrival_order() {
        let mut tree = NodeTree::default();
        for (name, zone) in [
            ("a1", "a"),
            ("b1", "b"),
            ("a2", "a"),
            ("a3", "a"),
            ("c1", "c"),
        ] {
            tree.add(name, zone.into());
        }
        assert_eq!(tree.list(), ["a1", "b1", "c1", "a2", "a3"]);
    }

    #[test]
    fn a_node_that_changes_zone_goes_last_in_its_new_zone_and_an_empty_zone_goes() {
        let mut tree = NodeTree::default();
        for (name, zone) in [("a1", "a"), ("b1", "b"), ("a2", "a")] {
            tree.add(name, zone.into());
        }
        tree.update("b1", "a".into());
        assert_eq!(tree.list(), ["a1", "a2", "b1"]);
        tree.update("a1", "a".into());
        assert_eq!(tree.list(), ["a1", "a2", "b1"], "same zone: nothing moves");
        assert!(tree.remove("a2"));
        assert!(!tree.remove("a2"));
        tree.add("c1", "c".into());
        tree.add("c1", "c".into());
        assert_eq!(tree.list(), ["a1", "c1", "b1"]);
        assert_eq!(tree.len(), 3);
    }
}
