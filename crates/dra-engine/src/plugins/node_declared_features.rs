//! NodeDeclaredFeatures (GA in 1.37): a pod that needs a node feature goes only to nodes
//! whose kubelet declares it in `node.status.declaredFeatures`.
//!
//! What a pod needs is inferred from its spec as component-helpers' registry
//! (`nodedeclaredfeatures/features`) infers it for scheduling in v1.37. Of its nine
//! features, three are inferred from a new pod; the other six (DRANodeAllocatableResources,
//! DRAOptionalNodeOperations, ExtendWebSocketsToKubelet and the three in-place resize
//! features) are only ever needed by updates of running pods, never to schedule one:
//!
//! | feature | the pod needs it when |
//! |---|---|
//! | RestartAllContainersOnContainerExits | a container or init container has a `restartPolicyRules` action `RestartAllContainers` |
//! | UserNamespacesHostNetworkSupport | `hostNetwork: true` with `hostUsers: false` |
//! | VolumeBindMountOptions | a volume mount of any container (regular, init or ephemeral) has `bindMountOptions` |
//!
//! Every inference is implemented; none is refused or ignored. Names a node declares that
//! the registry does not know are ignored, as upstream.

use k8s_openapi::api::core::v1::{Pod, PodSpec, VolumeMount};

use crate::framework::{Cycle, Plugin, PluginCycle, Point, Status};
use crate::state::NodeInfo;

pub const REASON: &str = "node(s) didn't match Pod's required features";

pub const RESTART_ALL_CONTAINERS: &str = "RestartAllContainersOnContainerExits";
pub const USER_NAMESPACES_HOST_NETWORK: &str = "UserNamespacesHostNetworkSupport";
pub const VOLUME_BIND_MOUNT_OPTIONS: &str = "VolumeBindMountOptions";

pub struct NodeDeclaredFeatures;

/// The features the pod needs of its node, by name, sorted.
pub fn required_features(pod: &Pod) -> Vec<&'static str> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let mut features = Vec::new();
    if restarts_all_containers(spec) {
        features.push(RESTART_ALL_CONTAINERS);
    }
    if spec.host_network == Some(true) && spec.host_users == Some(false) {
        features.push(USER_NAMESPACES_HOST_NETWORK);
    }
    if uses_bind_mount_options(spec) {
        features.push(VOLUME_BIND_MOUNT_OPTIONS);
    }
    features.sort_unstable();
    features
}

fn restarts_all_containers(spec: &PodSpec) -> bool {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.restart_policy_rules.iter().flatten())
        .any(|rule| rule.action == "RestartAllContainers")
}

fn uses_bind_mount_options(spec: &PodSpec) -> bool {
    let has = |mounts: &Option<Vec<VolumeMount>>| {
        mounts
            .iter()
            .flatten()
            .any(|m| m.bind_mount_options.as_ref().is_some_and(|o| !o.is_empty()))
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| has(&c.volume_mounts))
        || spec
            .ephemeral_containers
            .iter()
            .flatten()
            .any(|c| has(&c.volume_mounts))
}

fn declared(node: &NodeInfo) -> &[String] {
    node.node
        .status
        .as_ref()
        .and_then(|s| s.declared_features.as_deref())
        .unwrap_or_default()
}

struct FeaturesCycle {
    required: Vec<&'static str>,
}

impl Plugin for NodeDeclaredFeatures {
    fn name(&self) -> &'static str {
        "NodeDeclaredFeatures"
    }

    fn points(&self) -> &'static [Point] {
        &[Point::PreFilter, Point::Filter]
    }

    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(FeaturesCycle {
            required: required_features(cycle.pod),
        })
    }
}

impl PluginCycle for FeaturesCycle {
    fn pre_filter(&mut self) -> Status {
        if self.required.is_empty() {
            Status::skip()
        } else {
            Status::success()
        }
    }

    fn filter(&self, node: &NodeInfo) -> Status {
        let declared = declared(node);
        if self
            .required
            .iter()
            .all(|f| declared.iter().any(|d| d == f))
        {
            Status::success()
        } else {
            Status::unresolvable(REASON)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::node_resources_fit::scenario::*;
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pod_that_needs_a_feature_goes_only_where_it_is_declared() {
        let new = pod("new")
            .container(&[])
            .spec("hostNetwork", json!(true))
            .spec("hostUsers", json!(false))
            .build();
        let verdicts = filter(
            &NodeDeclaredFeatures,
            vec![
                node("declares")
                    .declares(&[USER_NAMESPACES_HOST_NETWORK, "SomethingNew"])
                    .build(),
                node("old").build(),
            ],
            vec![new],
            "new",
        );
        assert!(verdicts[0].1.is_success());
        assert_eq!(verdicts[1].1, Status::unresolvable(REASON));
    }

    #[test]
    fn a_plain_pod_needs_nothing() {
        let verdicts = filter(
            &NodeDeclaredFeatures,
            vec![node("old").build()],
            vec![
                pod("new")
                    .container(&[])
                    .spec("hostNetwork", json!(true))
                    .build(),
            ],
            "new",
        );
        assert!(verdicts[0].1.is_success());
    }

    #[test]
    fn features_are_inferred_from_restart_rules_user_namespaces_and_bind_mount_options() {
        let p = pod("p")
            .spec(
                "containers",
                json!([{"name": "a", "restartPolicy": "Never", "restartPolicyRules": [
                    {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}]}]),
            )
            .spec(
                "ephemeralContainers",
                json!([{"name": "debug", "volumeMounts": [
                    {"name": "v", "mountPath": "/v", "bindMountOptions": ["nosuid"]}]}]),
            )
            .spec("hostNetwork", json!(true))
            .spec("hostUsers", json!(false))
            .build();
        assert_eq!(
            required_features(&p),
            [
                RESTART_ALL_CONTAINERS,
                USER_NAMESPACES_HOST_NETWORK,
                VOLUME_BIND_MOUNT_OPTIONS
            ]
        );
        let host_users = pod("p")
            .container(&[])
            .spec("hostNetwork", json!(true))
            .spec("hostUsers", json!(true))
            .build();
        assert!(required_features(&host_users).is_empty());
    }
}
