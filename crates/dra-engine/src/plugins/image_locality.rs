//! ImageLocality: prefer nodes that already have the pod's images (`node.status.images`),
//! so the pod starts without pulling them.
//!
//! As kube-scheduler v1.37: each image of the pod (init containers, containers, then image
//! volumes) found on the node adds its size, scaled by the share of all nodes that have it
//! (an image on every node says nothing about this one). The sum is clamped between 23 MiB
//! and 1000 MiB per image of the pod and mapped to 0..=100. Names are compared as written,
//! except that a name without a tag gets `:latest` (upstream no longer adds the
//! `docker.io/library/` prefix; kubelets report both forms in `names`).

use k8s_openapi::api::core::v1::Pod;

use crate::framework::{Cycle, MAX_NODE_SCORE, Plugin, PluginCycle, Point, Status};
use crate::state::NodeInfo;

const MIB: i64 = 1024 * 1024;
/// Below this the images found are worth nothing (upstream's minThreshold).
const MIN_THRESHOLD: i64 = 23 * MIB;
/// Per image of the pod, the most its presence can be worth (maxContainerThreshold).
const MAX_CONTAINER_THRESHOLD: i64 = 1000 * MIB;

pub struct ImageLocality;

/// The name kube-scheduler looks an image up by: `:latest` added when there is no tag.
pub fn normalized_image_name(name: &str) -> String {
    let tag = name.rfind(':');
    let path = name.rfind('/');
    if tag.is_none_or(|t| path.is_some_and(|p| t <= p)) {
        format!("{name}:latest")
    } else {
        name.to_string()
    }
}

/// The pod's images, normalised: init containers, containers, then image volumes.
fn pod_images(pod: &Pod) -> Vec<String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .map(|c| c.image.as_deref().unwrap_or_default());
    let volumes = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.image.as_ref())
        .map(|i| i.reference.as_deref().unwrap_or_default());
    containers
        .chain(volumes)
        .map(normalized_image_name)
        .collect()
}

/// The size of the image named `name` on the node, if it has it (a later entry with the
/// same name wins, as in upstream's snapshot).
fn image_size(node: &NodeInfo, name: &str) -> Option<i64> {
    node.node
        .status
        .as_ref()
        .and_then(|s| s.images.as_ref())
        .into_iter()
        .flatten()
        .filter(|image| image.names.iter().flatten().any(|n| n == name))
        .map(|image| image.size_bytes.unwrap_or(0))
        .next_back()
}

struct ImageCycle<'a> {
    cycle: &'a Cycle<'a>,
    images: Vec<String>,
    /// For each image of the pod (in `images` order), on how many nodes of the cluster it is.
    spread: Vec<usize>,
}

impl Plugin for ImageLocality {
    fn name(&self) -> &'static str {
        "ImageLocality"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::Score]
    }

    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(ImageCycle {
            cycle,
            images: pod_images(cycle.pod),
            spread: Vec::new(),
        })
    }
}

impl PluginCycle for ImageCycle<'_> {
    /// On how many nodes of the cluster each of the pod's images is (kept by the state).
    fn pre_score(&mut self, _feasible: &[&NodeInfo]) -> Status {
        let spread = &self.cycle.state.image_spread;
        self.spread = self.images.iter().map(|i| spread.nodes_with(i)).collect();
        Status::success()
    }

    fn score(&self, node: &NodeInfo) -> Result<i64, Status> {
        let total = self.cycle.state.nodes.len();
        let sum: i64 = self
            .images
            .iter()
            .zip(&self.spread)
            .filter_map(|(image, &having)| {
                let size = image_size(node, image)?;
                Some((size as f64 * (having as f64 / total as f64)) as i64)
            })
            .sum();
        Ok(priority(sum, self.images.len() as i64))
    }
}

/// The sum of the images' scaled sizes, clamped and mapped to 0..=100.
fn priority(sum: i64, images: i64) -> i64 {
    let max = MAX_CONTAINER_THRESHOLD * images;
    let clamped = if sum < MIN_THRESHOLD {
        MIN_THRESHOLD
    } else if sum > max {
        max
    } else {
        sum
    };
    MAX_NODE_SCORE * (clamped - MIN_THRESHOLD) / (max - MIN_THRESHOLD)
}

#[cfg(test)]
mod tests {
    use super::super::node_resources_fit::scenario::*;
    use super::*;
    use crate::framework::PluginArgs;

    const PLUGIN: &str = "ImageLocality";

    fn image_scores(nodes: Vec<k8s_openapi::api::core::v1::Node>, new: Pod) -> Vec<(String, i64)> {
        let e = evaluate(
            profile(&[PLUGIN], PluginArgs::default()),
            nodes,
            vec![new],
            "new",
        );
        scores(&e, PLUGIN)
    }

    #[test]
    fn the_node_that_has_the_image_wins() {
        let s = image_scores(
            vec![
                node("n1").image(&["registry.example/app:1"], 500).build(),
                node("n2").build(),
                node("n3").build(),
            ],
            pod("new").image("registry.example/app:1").build(),
        );
        // 500 MiB on 1 of 3 nodes counts 166.7 MiB: (166.7 − 23) / (1000 − 23) of 100.
        assert_eq!(s, [("n1".into(), 14), ("n2".into(), 0), ("n3".into(), 0)]);
    }

    #[test]
    fn an_image_on_every_node_counts_whole_on_each() {
        let s = image_scores(
            vec![
                node("n1").image(&["app:1"], 500).build(),
                node("n2").image(&["app:1"], 500).build(),
            ],
            pod("new").image("app:1").build(),
        );
        // (500 − 23) / (1000 − 23) of 100.
        assert_eq!(s, [("n1".into(), 48), ("n2".into(), 48)]);
    }

    #[test]
    fn small_images_are_worth_nothing_and_big_ones_are_capped() {
        let s = image_scores(
            vec![
                node("small").image(&["tiny:1"], 20).build(),
                node("huge").image(&["huge:1"], 5000).build(),
            ],
            pod("new").image("tiny:1").image("huge:1").build(),
        );
        // huge: 2500 MiB counted, under the cap of 2000 for two images: (2000 − 23) / (2000 − 23).
        assert_eq!(s, [("huge".into(), 100), ("small".into(), 0)]);
    }

    #[test]
    fn an_untagged_name_means_latest() {
        assert_eq!(normalized_image_name("nginx"), "nginx:latest");
        assert_eq!(normalized_image_name("nginx:1.27"), "nginx:1.27");
        assert_eq!(
            normalized_image_name("localhost:5000/app"),
            "localhost:5000/app:latest"
        );
        assert_eq!(
            normalized_image_name("repo/app@sha256:abcd"),
            "repo/app@sha256:abcd"
        );
        let s = image_scores(
            vec![
                node("n1").image(&["nginx:latest"], 300).build(),
                node("n2")
                    .image(&["docker.io/library/nginx:latest"], 300)
                    .build(),
            ],
            pod("new").image("nginx").build(),
        );
        // No docker.io/library/ prefix is added (as upstream): only n1 matches, with
        // 300 MiB on 1 of 2 nodes: (150 − 23) / (1000 − 23) of 100.
        assert_eq!(s, [("n1".into(), 12), ("n2".into(), 0)]);
    }
}
