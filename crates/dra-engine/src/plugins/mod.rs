//! The scheduler plugins, one module each, named as kube-scheduler names them
//! (`pkg/scheduler/framework/plugins`).
//!
//! | plugin | extension points | state here |
//! |---|---|---|
//! | SchedulingGates | PreEnqueue | as upstream |
//! | PrioritySort | QueueSort | as upstream |
//! | NodeName | Filter | as upstream |
//! | NodeUnschedulable | Filter | as upstream |
//! | TaintToleration | Filter, PreScore, Score | as upstream |
//! | NodeAffinity | PreFilter, Filter, PreScore, Score | as upstream |
//! | NodePorts | PreFilter, Filter | as upstream |
//! | NodeResourcesFit | PreFilter, Filter, PreScore, Score | as upstream; LeastAllocated, MostAllocated, RequestedToCapacityRatio; a DRA extended resource in the scored resources is not scored on nodes without device-plugin capacity (see the module) |
//! | NodeResourcesBalancedAllocation | PreScore, Score | as upstream (same DRA extended resource note) |
//! | InterPodAffinity | PreFilter, Filter, PreScore, Score | as upstream (InterPodAffinityHostnameFastPath off, its 1.37 default); `matchLabelKeys`/`mismatchLabelKeys` merged as the API server merges them, for pods that did not come through it |
//! | PodTopologySpread | PreFilter, Filter, PreScore, Score | as upstream, with the default constraints (System or List) selecting by the Services, ReplicationControllers, ReplicaSets and StatefulSets that select the pod (`state::Workloads`) |
//! | VolumeBinding | PreFilter, Filter, Reserve, PreBind, PreScore, Score | as upstream (bound claims, Immediate claims wait, WaitForFirstConsumer with static volumes and provisioning by allowedTopologies, generic ephemeral volumes, the capacity score); CSIStorageCapacity is not read: a claim a driver with `storageCapacity: true` would provision is refused, saying so; PreBind is the binder's, with a bounded wait for the PV controller |
//! | VolumeRestrictions | PreFilter, Filter | as upstream (ReadWriteOncePod, conflicting GCE PD, EBS, RBD and iSCSI volumes) |
//! | VolumeZone | PreFilter, Filter | as upstream |
//! | NodeVolumeLimits | PreFilter, Filter | as upstream (CSI and migrated in-tree drivers, VolumeAttachments counted) |
//! | ImageLocality | Score | as upstream |
//! | DynamicResources | PreEnqueue, PreFilter, Filter, PostFilter, PreScore, Score, Reserve, PreBind | the allocator (`dra-allocator`) |
//! | DefaultBinder | Bind | the daemon's binder |
//! | DefaultPreemption | PostFilter | `Engine::preempt` (`crate::preemption`): as upstream (lower priority only, `preemptionPolicy: Never`, PodDisruptionBudgets, the reprieve loop), with victims' devices counted (a claim is freed only when all its consumers are victims), PodGroups with `disruptionMode: all` evicted whole, and the node chosen by fewest victims before their priorities; `Engine::nominate` holds the freed devices; a PodGroup does not preempt |
//! | NodeDeclaredFeatures | PreFilter, Filter | as upstream: all three features a new pod can need are inferred |
//! | GangScheduling, TopologyPlacementGenerator, PodGroupPodsCount | PreEnqueue, the PodGroup cycle | PodGroups (`crate::group`, and the daemon's queue): a gang is placed whole or not at all with its members' devices chosen jointly, `schedulingConstraints.topology` in the best-fitting domain, members wait without an attempt until `minCount` pods exist; always on where the API server serves PodGroups (behind gates off by default in 1.37): enabling them is accepted, disabling one is an error |
//! | DeferredPodScheduling | PreFilter, Filter, Permit | behind InPlacePodVerticalScalingSchedulerPreemption, alpha and off by default in 1.37; not implemented (enabling it is an error) |
//!
//! Two plugins of this scheduler's own score device placements, for pods with claims:
//! NUMAAlignment (fewer whole free NUMA domains broken into) and DevicePacking (fewer free
//! devices left on the node). Both weigh 1 in the default profile and can be disabled.

use std::sync::Arc;

use crate::framework::{PluginArgs, Point};

pub mod default_preemption;
pub mod device_scores;
pub mod dynamic_resources;
pub mod image_locality;
pub mod inter_pod_affinity;
pub mod label_selector;
pub mod node_affinity;
pub mod node_declared_features;
pub mod node_name;
pub mod node_ports;
pub mod node_resources_balanced_allocation;
pub mod node_resources_fit;
pub mod node_unschedulable;
pub mod node_volume_limits;
pub mod pod_topology_spread;
pub mod priority_sort;
pub mod scheduling_gates;
pub mod taint_toleration;
pub mod volume_binding;
pub mod volume_restrictions;
pub mod volume_zone;

/// kube-scheduler v1.37's default plugins in its order (DynamicResources before
/// DefaultPreemption, as upstream inserts it), with score weights; then ours.
pub const DEFAULT: &[(&str, i64)] = &[
    ("SchedulingGates", 0),
    ("PrioritySort", 0),
    ("NodeName", 0),
    ("NodeUnschedulable", 0),
    ("TaintToleration", 3),
    ("NodeAffinity", 2),
    ("NodePorts", 0),
    ("NodeResourcesFit", 1),
    ("VolumeRestrictions", 0),
    ("NodeVolumeLimits", 0),
    ("VolumeBinding", 1),
    ("VolumeZone", 0),
    ("PodTopologySpread", 2),
    ("InterPodAffinity", 2),
    ("DynamicResources", 2),
    ("DefaultPreemption", 0),
    ("NodeResourcesBalancedAllocation", 1),
    ("ImageLocality", 1),
    ("NodeDeclaredFeatures", 0),
    ("NUMAAlignment", 1),
    ("DevicePacking", 1),
];

/// Plugins of this scheduler's own, not in kube-scheduler.
pub const OUT_OF_TREE: &[&str] = &["NUMAAlignment", "DevicePacking"];

/// kube-scheduler's PodGroup plugins: what they do is always done here (`crate::group`),
/// so a profile may enable them but not disable them.
pub const ALWAYS_ON: &[&str] = &[
    "GangScheduling",
    "TopologyPlacementGenerator",
    "PodGroupPodsCount",
];

/// Plugins kube-scheduler has that are not implemented here, and why.
pub const NOT_IMPLEMENTED: &[(&str, &str)] = &[(
    "DeferredPodScheduling",
    "in-place resize preemption is not supported",
)];

/// The extension points a plugin implements, by name; `None` for an unknown plugin.
pub fn points_of(name: &str) -> Option<&'static [Point]> {
    use Point::*;
    Some(match name {
        "SchedulingGates" => &[PreEnqueue],
        "PrioritySort" => &[QueueSort],
        "NodeName" | "NodeUnschedulable" => &[Filter],
        "TaintToleration" => &[Filter, PreScore, Score],
        "NodeAffinity" | "NodeResourcesFit" | "PodTopologySpread" | "InterPodAffinity" => {
            &[PreFilter, Filter, PreScore, Score]
        }
        "NodePorts"
        | "VolumeRestrictions"
        | "VolumeZone"
        | "NodeVolumeLimits"
        | "NodeDeclaredFeatures" => &[PreFilter, Filter],
        "VolumeBinding" => &[PreFilter, Filter, Reserve, PreBind, PreScore, Score],
        "NodeResourcesBalancedAllocation" => &[PreScore, Score],
        "ImageLocality" | "NUMAAlignment" | "DevicePacking" => &[Score],
        "DynamicResources" => &[
            PreEnqueue, PreFilter, Filter, PostFilter, PreScore, Score, Reserve, PreBind,
        ],
        "DefaultBinder" => &[Bind],
        "DefaultPreemption" => &[PostFilter],
        _ => return None,
    })
}

/// The plugin's name as a `'static` string (for statuses).
pub fn static_name(name: &str) -> &'static str {
    DEFAULT
        .iter()
        .map(|(n, _)| *n)
        .chain(["DefaultBinder"])
        .find(|n| *n == name)
        .unwrap_or("unknown")
}

/// Build a plugin by name with the profile's arguments.
pub fn build(name: &str, args: &PluginArgs) -> Option<Arc<dyn crate::framework::Plugin>> {
    Some(match name {
        "SchedulingGates" => Arc::new(scheduling_gates::SchedulingGates),
        "PrioritySort" => Arc::new(priority_sort::PrioritySort),
        "NodeName" => Arc::new(node_name::NodeName),
        "NodeUnschedulable" => Arc::new(node_unschedulable::NodeUnschedulable),
        "TaintToleration" => Arc::new(taint_toleration::TaintToleration),
        "NodeAffinity" => Arc::new(node_affinity::NodeAffinity),
        "NodePorts" => Arc::new(node_ports::NodePorts),
        "NodeResourcesFit" => Arc::new(node_resources_fit::NodeResourcesFit::new(
            &args.node_resources_fit,
        )),
        "NodeResourcesBalancedAllocation" => Arc::new(
            node_resources_balanced_allocation::BalancedAllocation::new(&args.balanced_allocation),
        ),
        "ImageLocality" => Arc::new(image_locality::ImageLocality),
        "InterPodAffinity" => Arc::new(inter_pod_affinity::InterPodAffinity::new(
            &args.inter_pod_affinity,
        )),
        "PodTopologySpread" => Arc::new(pod_topology_spread::PodTopologySpread::new(
            &args.pod_topology_spread,
        )),
        "VolumeBinding" => Arc::new(volume_binding::VolumeBinding),
        "VolumeRestrictions" => Arc::new(volume_restrictions::VolumeRestrictions),
        "VolumeZone" => Arc::new(volume_zone::VolumeZone),
        "NodeVolumeLimits" => Arc::new(node_volume_limits::NodeVolumeLimits),
        "NodeDeclaredFeatures" => Arc::new(node_declared_features::NodeDeclaredFeatures),
        "DynamicResources" => Arc::new(dynamic_resources::DynamicResources),
        "NUMAAlignment" => Arc::new(device_scores::NumaAlignment),
        "DevicePacking" => Arc::new(device_scores::DevicePacking),
        "DefaultPreemption" => Arc::new(default_preemption::DefaultPreemption),
        _ => return None,
    })
}
