//! Which cluster events may make a pod schedulable again, by the plugin that rejected it:
//! kube-scheduler's `EventsToRegister` (each plugin's `EnqueueExtensions`) as one table.
//!
//! A pod that no node fits waits as unschedulable with the plugins that rejected it. An
//! event moves it back only when one of those plugins registers that event (a node's
//! labels changing can make NodeAffinity pass, never DynamicResources' device count); a
//! pod rejected by no named plugin (out of search time) is moved by any event. Events
//! about one object that only the pods using it care for (a pod's own update, its own
//! claim appearing or changing) are handled apart, by the queue's callers.
//!
//! The table follows kube-scheduler v1.37's registrations, with the events this
//! scheduler's informers tell apart; where it registers more (NodeResourcesFit's node
//! label and taint updates, DynamicResources' node events for slices that select nodes by
//! label), so does this.

/// A change in the cluster that may free or add what an unschedulable pod lacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClusterEvent {
    /// A bound pod was deleted or finished, or a pod assumed here was forgotten (its
    /// binding failed): its node's resources, ports and volumes are free, and affinity or
    /// spread that counted it no longer does.
    AssignedPodDeleted,
    /// A pod was bound (or assumed), or a bound pod's labels changed.
    AssignedPodAdded,
    NodeAdded,
    NodeDeleted,
    NodeLabelsChanged,
    /// Taints or `spec.unschedulable`.
    NodeTaintsChanged,
    NodeAllocatableChanged,
    /// A namespace's labels (pod affinity terms' `namespaceSelector`).
    NamespaceLabelsChanged,
    /// A claim's devices were given back, one of its reservations ended, or it was
    /// deleted: devices (or a shared claim's room) are free.
    ClaimFreed,
    SliceChanged,
    DeviceClassChanged,
    DeviceTaintRuleChanged,
    PersistentVolumeClaimChanged,
    PersistentVolumeChanged,
    StorageClassChanged,
    CsiNodeChanged,
    CsiDriverChanged,
    VolumeAttachmentDeleted,
}

/// Whether `event` may make a pod that `plugin` rejected pass it. An unknown plugin's
/// rejection is retried on any event.
pub fn may_help(plugin: &str, event: ClusterEvent) -> bool {
    use ClusterEvent::*;
    match plugin {
        "NodeName" => matches!(event, NodeAdded),
        "NodeUnschedulable" | "TaintToleration" => matches!(event, NodeAdded | NodeTaintsChanged),
        "NodeAffinity" => matches!(event, NodeAdded | NodeLabelsChanged),
        "NodePorts" => matches!(event, AssignedPodDeleted | NodeAdded),
        // Extended resources that DeviceClasses map to devices count devices too.
        "NodeResourcesFit" => matches!(
            event,
            AssignedPodDeleted
                | NodeAdded
                | NodeAllocatableChanged
                | NodeTaintsChanged
                | NodeLabelsChanged
                | ClaimFreed
                | SliceChanged
                | DeviceClassChanged
        ),
        "InterPodAffinity" => matches!(
            event,
            AssignedPodDeleted
                | AssignedPodAdded
                | NodeAdded
                | NodeLabelsChanged
                | NamespaceLabelsChanged
        ),
        "PodTopologySpread" => matches!(
            event,
            AssignedPodDeleted
                | AssignedPodAdded
                | NodeAdded
                | NodeDeleted
                | NodeLabelsChanged
                | NodeTaintsChanged
        ),
        "VolumeBinding" => matches!(
            event,
            PersistentVolumeClaimChanged
                | PersistentVolumeChanged
                | StorageClassChanged
                | CsiNodeChanged
                | CsiDriverChanged
                | NodeAdded
                | NodeLabelsChanged
        ),
        "VolumeRestrictions" => matches!(event, AssignedPodDeleted | PersistentVolumeClaimChanged),
        "VolumeZone" => matches!(
            event,
            PersistentVolumeClaimChanged
                | PersistentVolumeChanged
                | StorageClassChanged
                | NodeAdded
                | NodeLabelsChanged
        ),
        "NodeVolumeLimits" => matches!(
            event,
            AssignedPodDeleted
                | NodeAdded
                | CsiNodeChanged
                | PersistentVolumeClaimChanged
                | VolumeAttachmentDeleted
        ),
        "DynamicResources" => matches!(
            event,
            ClaimFreed
                | SliceChanged
                | DeviceClassChanged
                | DeviceTaintRuleChanged
                | NodeAdded
                | NodeLabelsChanged
        ),
        "NodeDeclaredFeatures" => matches!(event, NodeAdded | NodeAllocatableChanged),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::ClusterEvent::*;
    use super::*;

    #[test]
    fn a_pod_short_of_devices_waits_for_devices_not_for_node_taints_or_namespaces() {
        for helps in [
            ClaimFreed,
            SliceChanged,
            DeviceClassChanged,
            DeviceTaintRuleChanged,
        ] {
            assert!(may_help("DynamicResources", helps), "{helps:?}");
        }
        for unrelated in [
            NodeTaintsChanged,
            NamespaceLabelsChanged,
            AssignedPodAdded,
            PersistentVolumeClaimChanged,
        ] {
            assert!(!may_help("DynamicResources", unrelated), "{unrelated:?}");
        }
    }

    #[test]
    fn a_placed_pod_helps_only_affinity_and_spread() {
        let helped: Vec<_> = crate::plugins::DEFAULT
            .iter()
            .map(|(name, _)| *name)
            .filter(|p| {
                crate::plugins::points_of(p)
                    .is_some_and(|points| points.contains(&crate::framework::Point::Filter))
            })
            .filter(|p| may_help(p, AssignedPodAdded))
            .collect();
        assert_eq!(helped, ["PodTopologySpread", "InterPodAffinity"]);
    }

    #[test]
    fn every_filter_plugin_has_its_own_row() {
        for (name, _) in crate::plugins::DEFAULT {
            let filters = crate::plugins::points_of(name)
                .is_some_and(|points| points.contains(&crate::framework::Point::Filter));
            if filters {
                assert!(
                    !may_help(name, NamespaceLabelsChanged) || *name == "InterPodAffinity",
                    "{name} falls through to 'any event'"
                );
            }
        }
    }

    #[test]
    fn a_plugin_the_table_does_not_know_is_retried_on_any_event() {
        assert!(may_help("SomeoneElses", VolumeAttachmentDeleted));
    }
}
