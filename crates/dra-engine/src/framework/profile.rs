//! Which plugins run, at which extension points, with which score weights and arguments:
//! a KubeSchedulerConfiguration profile after defaulting.

use std::collections::BTreeSet;

use super::Point;
use crate::plugins;

/// One plugin of the profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginEntry {
    /// kube-scheduler's name for the plugin.
    pub name: String,
    /// The extension points it runs at (those of the plugin's that are not disabled).
    pub points: BTreeSet<Point>,
    /// Its score's weight (kube-scheduler's `weight`; meaningful when it scores).
    pub weight: i64,
}

/// The arguments of the plugins that take any (`pluginConfig`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PluginArgs {
    pub node_resources_fit: plugins::node_resources_fit::Args,
    pub balanced_allocation: plugins::node_resources_balanced_allocation::Args,
    pub inter_pod_affinity: plugins::inter_pod_affinity::Args,
    pub pod_topology_spread: plugins::pod_topology_spread::Args,
}

/// A scheduling profile: plugins in the order they run, and their arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub plugins: Vec<PluginEntry>,
    pub args: PluginArgs,
}

impl Default for Profile {
    /// kube-scheduler v1.37's default profile (with DynamicResources, on by default), plus
    /// this scheduler's own device scores, which score only pods with device claims.
    fn default() -> Self {
        let plugins = plugins::DEFAULT
            .iter()
            .map(|(name, weight)| PluginEntry {
                name: (*name).to_string(),
                points: plugins::points_of(name)
                    .expect("default plugins are known")
                    .iter()
                    .copied()
                    .collect(),
                weight: *weight,
            })
            .collect();
        Profile {
            plugins,
            args: PluginArgs::default(),
        }
    }
}

impl Profile {
    /// kube-scheduler's default profile alone, without this scheduler's own scores: what
    /// the conformance suite compares with kube-scheduler.
    pub fn upstream() -> Profile {
        let mut profile = Profile::default();
        profile
            .plugins
            .retain(|p| !plugins::OUT_OF_TREE.contains(&p.name.as_str()));
        profile
    }

    /// The entry of a plugin that runs at `point`, if any.
    pub fn at(&self, point: Point) -> impl Iterator<Item = &PluginEntry> {
        self.plugins
            .iter()
            .filter(move |p| p.points.contains(&point))
    }

    /// Disable a plugin everywhere.
    pub fn disable(&mut self, name: &str) {
        self.plugins.retain(|p| p.name != name);
    }

    pub fn entry_mut(&mut self, name: &str) -> Option<&mut PluginEntry> {
        self.plugins.iter_mut().find(|p| p.name == name)
    }
}
