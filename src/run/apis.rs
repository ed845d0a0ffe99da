//! What the API server serves of `resource.k8s.io`, found by discovery at start.
//!
//! The scheduler needs `resource.k8s.io/v1` ResourceClaims, ResourceSlices and
//! DeviceClasses (Kubernetes 1.34 and later serve them by default) and refuses to start
//! without them. DeviceTaintRules are optional: Kubernetes 1.37 serves them in `v1`;
//! 1.34–1.36 serve them only when an administrator turns the alpha (`v1alpha3`) or beta
//! (`v1beta2`) API on. The scheduler watches the newest version served, and none when the
//! kind is not served, so that an older control plane does not keep it from becoming
//! ready. Every version of a DeviceTaintRule has the shape of `v1` for what the scheduler
//! reads (a device selector by driver, pool and device, and a taint), except that
//! 1.34's `v1alpha3` also had `deviceClassName` and CEL `selectors`, which the scheduler
//! cannot evaluate: [`taint_rule`] then applies the taint to every device the rule's
//! driver, pool and device select (more devices than meant, never fewer), with a warning
//! that names the rule.

use k8s_openapi::api::resource::v1::DeviceTaintRule;
use kube::Client;
use kube::api::DynamicObject;
use kube::discovery::ApiResource;

/// The API group of Dynamic Resource Allocation.
pub const GROUP: &str = "resource.k8s.io";

/// Versions that may serve DeviceTaintRules, newest first.
pub const TAINT_RULE_VERSIONS: [&str; 3] = ["v1", "v1beta2", "v1alpha3"];

/// The `resource.k8s.io/v1` resources the scheduler cannot work without.
const REQUIRED: [&str; 3] = ["resourceclaims", "resourceslices", "deviceclasses"];

/// Why discovery gave no answer to run with.
#[derive(Debug)]
pub enum DiscoveryError {
    /// The server answered without what the scheduler needs: no use retrying.
    Unsupported(String),
    /// The server could not be asked (yet): retry.
    Unavailable(String),
}

impl std::fmt::Display for DiscoveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DiscoveryError::Unsupported(m) | DiscoveryError::Unavailable(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for DiscoveryError {}

/// What the API server serves of `resource.k8s.io`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedApis {
    /// The version DeviceTaintRules are read in; `None` when no version serves them.
    pub taint_rules: Option<&'static str>,
    /// Whether `scheduling.k8s.io/v1beta1` serves PodGroups (Kubernetes 1.37 with the
    /// workload-aware scheduling gates on): only then are they watched.
    pub pod_groups: bool,
}

impl ServedApis {
    /// Everything Kubernetes 1.37 serves by default.
    pub fn current() -> ServedApis {
        ServedApis {
            taint_rules: Some("v1"),
            pod_groups: false,
        }
    }

    /// Asks the API server. An error names what is missing (or why discovery failed).
    pub async fn discover(client: &Client) -> Result<ServedApis, DiscoveryError> {
        let mut served = Vec::new();
        for version in TAINT_RULE_VERSIONS {
            let found = resources(client, version)
                .await
                .map_err(DiscoveryError::Unavailable)?;
            served.push((version, found));
        }
        let mut apis = Self::from_discovery(&served).map_err(DiscoveryError::Unsupported)?;
        apis.pod_groups = group_resources(client, POD_GROUPS_API)
            .await
            .map_err(DiscoveryError::Unavailable)?
            .is_some_and(|r| r.iter().any(|r| r == "podgroups"));
        Ok(apis)
    }

    /// The decision, from the resources each version of the group serves (`None`: the
    /// version is not served at all).
    pub fn from_discovery(served: &[(&'static str, Option<Vec<String>>)]) -> Result<Self, String> {
        let v1 = served
            .iter()
            .find(|(v, _)| *v == "v1")
            .and_then(|(_, r)| r.as_ref());
        let missing: Vec<&str> = REQUIRED
            .iter()
            .copied()
            .filter(|r| !v1.is_some_and(|have| have.iter().any(|h| h == r)))
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "the API server does not serve {GROUP}/v1 {} (Kubernetes 1.34 or later serves them); dra-scheduler cannot run without them",
                missing.join(", ")
            ));
        }
        let taint_rules = served.iter().find_map(|(version, resources)| {
            resources
                .as_ref()
                .is_some_and(|r| r.iter().any(|r| r == "devicetaintrules"))
                .then_some(*version)
        });
        Ok(ServedApis {
            taint_rules,
            pod_groups: false,
        })
    }

    /// One line for the log: what was found and what follows from it.
    pub fn describe(&self) -> String {
        let groups = if self.pod_groups {
            format!("; PodGroups read from {POD_GROUPS_API}")
        } else {
            format!(
                "; {POD_GROUPS_API} PodGroups are not served: pods naming a PodGroup cannot exist"
            )
        };
        self.describe_taint_rules() + &groups
    }

    fn describe_taint_rules(&self) -> String {
        match self.taint_rules {
            Some(version) => format!("DeviceTaintRules read from {GROUP}/{version}"),
            None => format!(
                "DeviceTaintRules are not served by any version of {GROUP} ({}): none are watched; taints in ResourceSlices still apply",
                TAINT_RULE_VERSIONS.join(", ")
            ),
        }
    }
}

/// The group and version PodGroups are served in.
const POD_GROUPS_API: &str = "scheduling.k8s.io/v1beta1";

/// The resources one version of the group serves; `None` when the version is not served.
async fn resources(client: &Client, version: &str) -> Result<Option<Vec<String>>, String> {
    group_resources(client, &format!("{GROUP}/{version}")).await
}

/// The resources `group/version` serves; `None` when it is not served.
async fn group_resources(
    client: &Client,
    group_version: &str,
) -> Result<Option<Vec<String>>, String> {
    match client.list_api_group_resources(group_version).await {
        Ok(list) => Ok(Some(list.resources.into_iter().map(|r| r.name).collect())),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(format!("discovering {group_version}: {e}")),
    }
}

/// DeviceTaintRules in `version` of the group, for a dynamic watch.
pub fn taint_rule_resource(version: &str) -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: version.into(),
        api_version: format!("{GROUP}/{version}"),
        kind: "DeviceTaintRule".into(),
        plural: "devicetaintrules".into(),
    }
}

/// A DeviceTaintRule of any served version, read as `v1`, with a warning when the rule
/// selects devices by class or CEL (Kubernetes 1.34's `v1alpha3`): those selectors only
/// narrow the rule, so without them the taint covers a superset of its devices, and no
/// pod is placed on a device the rule meant to taint.
pub fn taint_rule(object: DynamicObject) -> Result<(DeviceTaintRule, Option<String>), String> {
    let name = object.metadata.name.clone().unwrap_or_default();
    let selector = &object.data["spec"]["deviceSelector"];
    let unsupported: Vec<&str> = ["deviceClassName", "selectors"]
        .into_iter()
        .filter(|field| !selector[*field].is_null())
        .collect();
    let warning = (!unsupported.is_empty()).then(|| {
        format!(
            "DeviceTaintRule {name}: spec.deviceSelector.{} cannot be evaluated (removed from the API after 1.34); the taint applies to every device of the rule's driver, pool and device",
            unsupported.join(" and ")
        )
    });
    let mut value =
        serde_json::to_value(&object).map_err(|e| format!("DeviceTaintRule {name}: {e}"))?;
    value["apiVersion"] = format!("{GROUP}/v1").into();
    let rule = serde_json::from_value(value).map_err(|e| format!("DeviceTaintRule {name}: {e}"))?;
    Ok((rule, warning))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(list: &[(&'static str, &[&str])]) -> Vec<(&'static str, Option<Vec<String>>)> {
        TAINT_RULE_VERSIONS
            .iter()
            .map(|v| {
                let resources = list
                    .iter()
                    .find(|(have, _)| have == v)
                    .map(|(_, r)| r.iter().map(|s| s.to_string()).collect());
                (*v, resources)
            })
            .collect()
    }

    const CORE: &[&str] = &[
        "resourceclaims",
        "resourceslices",
        "deviceclasses",
        "resourceclaimtemplates",
    ];

    #[test]
    fn kubernetes_1_37_serves_taint_rules_in_v1() {
        let v1: Vec<&str> = CORE.iter().copied().chain(["devicetaintrules"]).collect();
        let apis = ServedApis::from_discovery(&served(&[
            ("v1", &v1),
            ("v1alpha3", &["devicetaintrules"]),
        ]))
        .unwrap();
        assert_eq!(apis, ServedApis::current());
    }

    #[test]
    fn a_1_34_cluster_with_default_gates_has_no_taint_rules() {
        let apis = ServedApis::from_discovery(&served(&[("v1", CORE)])).unwrap();
        assert_eq!(apis.taint_rules, None);
        assert!(
            apis.describe().contains("none are watched"),
            "{}",
            apis.describe()
        );
    }

    #[test]
    fn the_alpha_or_beta_api_is_used_when_only_it_serves_taint_rules() {
        let alpha = ServedApis::from_discovery(&served(&[
            ("v1", CORE),
            ("v1alpha3", &["devicetaintrules"]),
        ]))
        .unwrap();
        assert_eq!(alpha.taint_rules, Some("v1alpha3"));
        let beta = ServedApis::from_discovery(&served(&[
            ("v1", CORE),
            ("v1beta2", &["devicetaintrules"]),
            ("v1alpha3", &["devicetaintrules"]),
        ]))
        .unwrap();
        assert_eq!(beta.taint_rules, Some("v1beta2"));
    }

    #[test]
    fn a_cluster_without_resource_v1_is_refused_with_what_is_missing() {
        let err =
            ServedApis::from_discovery(&served(&[("v1beta2", &["resourceclaims"])])).unwrap_err();
        assert!(
            err.to_string().contains(
                "does not serve resource.k8s.io/v1 resourceclaims, resourceslices, deviceclasses"
            ),
            "{err}"
        );
    }

    fn rule(selector: serde_json::Value) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1alpha3",
            "kind": "DeviceTaintRule",
            "metadata": {"name": "maintenance"},
            "spec": {
                "deviceSelector": selector,
                "taint": {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"},
            },
        }))
        .unwrap()
    }

    #[test]
    fn an_alpha_rule_reads_as_v1() {
        let (r, warning) = taint_rule(rule(
            serde_json::json!({"driver": "gpu.nvidia.com", "pool": "node-1"}),
        ))
        .unwrap();
        assert_eq!(warning, None);
        assert_eq!(r.metadata.name.as_deref(), Some("maintenance"));
        let selector = r.spec.device_selector.unwrap();
        assert_eq!(selector.driver.as_deref(), Some("gpu.nvidia.com"));
        assert_eq!(selector.pool.as_deref(), Some("node-1"));
        assert_eq!(r.spec.taint.effect, "NoSchedule");
    }

    #[test]
    fn a_1_34_rule_with_cel_selectors_taints_every_device_of_its_driver_with_a_warning() {
        let (r, warning) = taint_rule(rule(serde_json::json!({
            "driver": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": "true"}}],
        })))
        .unwrap();
        let selector = r.spec.device_selector.unwrap();
        assert_eq!(selector.driver.as_deref(), Some("gpu.nvidia.com"));
        assert_eq!((selector.pool, selector.device), (None, None));
        assert_eq!(
            warning.as_deref(),
            Some(
                "DeviceTaintRule maintenance: spec.deviceSelector.selectors cannot be evaluated (removed from the API after 1.34); the taint applies to every device of the rule's driver, pool and device"
            )
        );
    }
}
