//! A profile from a KubeSchedulerConfiguration (`kubescheduler.config.k8s.io/v1`), merged
//! onto the default profile as kube-scheduler merges it: `plugins` per extension point
//! (and `multiPoint`) with `enabled` and `disabled` (`*` for all), score weights, and the
//! `pluginConfig` of the plugins that take arguments. Anything this scheduler does not
//! implement, or does not know, is an error that names the field.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

use super::{Point, Profile};
use k8s_openapi::api::core::v1::TopologySpreadConstraint;

use crate::plugins::{self, node_resources_fit, pod_topology_spread};

/// What a profile of the file sets.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileConfig {
    pub scheduler_name: Option<String>,
    pub profile: Profile,
    pub percentage_of_nodes_to_score: Option<u32>,
    /// DynamicResourcesArgs' `filterTimeout`.
    pub filter_timeout: Option<Duration>,
}

type Result<T> = std::result::Result<T, String>;

/// Read one entry of `profiles` (at `path`, for messages, e.g. `profiles[0]`).
pub fn profile_config(value: &Value, path: &str) -> Result<ProfileConfig> {
    let object = as_object(value, path)?;
    let mut config = ProfileConfig {
        scheduler_name: None,
        profile: Profile::default(),
        percentage_of_nodes_to_score: None,
        filter_timeout: None,
    };
    for (key, v) in object {
        let here = format!("{path}.{key}");
        match key.as_str() {
            "schedulerName" => config.scheduler_name = Some(as_str(v, &here)?.to_string()),
            "percentageOfNodesToScore" => {
                config.percentage_of_nodes_to_score = Some(percentage(v, &here)?)
            }
            "plugins" => apply_plugins(&mut config.profile, v, &here)?,
            "pluginConfig" => {}
            _ => return Err(format!("{here}: unknown field")),
        }
    }
    if let Some(args) = object.get("pluginConfig") {
        let here = format!("{path}.pluginConfig");
        for (i, entry) in as_array(args, &here)?.iter().enumerate() {
            apply_plugin_config(&mut config, entry, &format!("{here}[{i}]"))?;
        }
    }
    Ok(config)
}

/// `percentageOfNodesToScore`: 0..=100.
pub fn percentage(v: &Value, path: &str) -> Result<u32> {
    match v.as_u64() {
        Some(p) if p <= 100 => Ok(p as u32),
        _ => Err(format!("{path}: must be a whole number from 0 to 100")),
    }
}

/// The extension points of a KubeSchedulerConfiguration's `plugins`, as named there.
fn point_named(name: &str) -> Option<Option<Point>> {
    if name == "multiPoint" {
        return Some(None);
    }
    Point::ALL
        .into_iter()
        .find(|p| p.config_name() == name)
        .map(Some)
}

/// Extension points kube-scheduler has that no plugin here implements.
const OTHER_POINTS: &[&str] = &["permit", "postBind"];

fn apply_plugins(profile: &mut Profile, value: &Value, path: &str) -> Result<()> {
    let sets = as_object(value, path)?;
    // multiPoint first: it decides which plugins exist; the points refine them.
    if let Some(set) = sets.get("multiPoint") {
        apply_set(profile, None, set, &format!("{path}.multiPoint"))?;
    }
    for (name, set) in sets.iter().filter(|(n, _)| *n != "multiPoint") {
        let here = format!("{path}.{name}");
        match point_named(name) {
            Some(point) => apply_set(profile, point, set, &here)?,
            None if OTHER_POINTS.contains(&name.as_str()) => {
                let enabled = set.get("enabled").and_then(Value::as_array);
                if enabled.is_some_and(|e| !e.is_empty()) {
                    return Err(format!(
                        "{here}.enabled: no plugin of dra-scheduler runs at {name}"
                    ));
                }
            }
            None => return Err(format!("{here}: unknown extension point")),
        }
    }
    Ok(())
}

/// One `PluginSet` (`enabled`, `disabled`) at a point, or at every point (`multiPoint`).
fn apply_set(profile: &mut Profile, point: Option<Point>, set: &Value, path: &str) -> Result<()> {
    let set = as_object(set, path)?;
    if let Some(key) = set.keys().find(|k| *k != "enabled" && *k != "disabled") {
        return Err(format!("{path}.{key}: unknown field"));
    }
    let list = |key: &str| -> Result<Vec<(String, Option<i64>, String)>> {
        let Some(v) = set.get(key) else {
            return Ok(Vec::new());
        };
        let here = format!("{path}.{key}");
        as_array(v, &here)?
            .iter()
            .enumerate()
            .map(|(i, p)| plugin_ref(p, &format!("{here}[{i}]")))
            .collect()
    };
    let disabled = list("disabled")?;
    let enabled = list("enabled")?;
    for (name, _, here) in &disabled {
        if name != "*" && !known(name) {
            return Err(format!("{here}.name: unknown plugin {name:?}"));
        }
        if plugins::ALWAYS_ON.contains(&name.as_str()) {
            return Err(format!(
                "{here}: plugin {name} cannot be disabled: dra-scheduler always schedules a PodGroup's pods as a group"
            ));
        }
    }
    let all = disabled.iter().any(|(n, _, _)| n == "*");
    let names: BTreeSet<&str> = disabled.iter().map(|(n, _, _)| n.as_str()).collect();
    for entry in &mut profile.plugins {
        let enabled_here = enabled.iter().any(|(n, _, _)| *n == entry.name);
        if (all || names.contains(entry.name.as_str())) && !enabled_here {
            match point {
                None => entry.points.clear(),
                Some(p) => {
                    entry.points.remove(&p);
                }
            }
        }
    }
    for (name, weight, here) in &enabled {
        enable(profile, point, name, *weight, here)?;
    }
    profile.plugins.retain(|p| !p.points.is_empty());
    Ok(())
}

fn known(name: &str) -> bool {
    plugins::points_of(name).is_some()
        || plugins::NOT_IMPLEMENTED.iter().any(|(n, _)| *n == name)
        || plugins::ALWAYS_ON.contains(&name)
}

/// Enable a plugin at a point (or at all of its points), with its score weight.
fn enable(
    profile: &mut Profile,
    point: Option<Point>,
    name: &str,
    weight: Option<i64>,
    path: &str,
) -> Result<()> {
    if let Some((_, why)) = plugins::NOT_IMPLEMENTED.iter().find(|(n, _)| *n == name) {
        return Err(format!("{path}: plugin {name} is not supported: {why}"));
    }
    if plugins::ALWAYS_ON.contains(&name) {
        return Ok(());
    }
    let Some(points) = plugins::points_of(name) else {
        return Err(format!("{path}.name: unknown plugin {name:?}"));
    };
    let wanted: Vec<Point> = match point {
        None => points.to_vec(),
        Some(p) if points.contains(&p) => vec![p],
        Some(p) => {
            return Err(format!(
                "{path}: plugin {name} does not run at {}",
                p.config_name()
            ));
        }
    };
    if weight.is_some() && !matches!(point, None | Some(Point::Score)) {
        return Err(format!(
            "{path}.weight: only score and multiPoint plugins have weights"
        ));
    }
    if name == "DefaultBinder" {
        // Binding is the daemon's binder; nothing to add to the profile.
        return Ok(());
    }
    let index = match profile.plugins.iter().position(|p| p.name == name) {
        Some(i) => i,
        None => {
            profile.plugins.push(super::PluginEntry {
                name: name.to_string(),
                points: Default::default(),
                weight: 1,
            });
            profile.plugins.len() - 1
        }
    };
    let entry = &mut profile.plugins[index];
    entry.points.extend(wanted);
    // kube-scheduler takes a score plugin's weight from its entry at score (else at
    // multiPoint), and a weight left out or 0 counts as 1 (getValidScoreWeights); an entry
    // at another point leaves the weight as it was.
    if points.contains(&Point::Score) && matches!(point, None | Some(Point::Score)) {
        entry.weight = weight.filter(|w| *w > 0).unwrap_or(1);
    }
    Ok(())
}

/// `{name, weight}` of an enabled or disabled plugin.
fn plugin_ref(value: &Value, path: &str) -> Result<(String, Option<i64>, String)> {
    let (object, name) = named(value, "weight", path)?;
    let weight = match object.get("weight") {
        None | Some(Value::Null) => None,
        Some(w) => match w.as_i64() {
            Some(w) if (0..=100).contains(&w) => Some(w),
            _ => {
                return Err(format!(
                    "{path}.weight: must be a whole number from 0 to 100"
                ));
            }
        },
    };
    Ok((name.to_string(), weight, path.to_string()))
}

/// An object with a required `name` and one other field, `other`.
fn named<'v>(
    value: &'v Value,
    other: &str,
    path: &str,
) -> Result<(&'v serde_json::Map<String, Value>, &'v str)> {
    let object = as_object(value, path)?;
    if let Some(key) = object.keys().find(|k| *k != "name" && *k != other) {
        return Err(format!("{path}.{key}: unknown field"));
    }
    let name = object
        .get("name")
        .map(|n| as_str(n, &format!("{path}.name")))
        .transpose()?
        .ok_or_else(|| format!("{path}.name: required"))?;
    Ok((object, name))
}

fn apply_plugin_config(config: &mut ProfileConfig, entry: &Value, path: &str) -> Result<()> {
    let (object, name) = named(entry, "args", path)?;
    let empty = Value::Object(Default::default());
    let args = object.get("args").unwrap_or(&empty);
    let here = format!("{path}.args");
    let args_object = as_object(args, &here)?;
    let fields = |allowed: &[&str]| -> Result<()> {
        match args_object
            .keys()
            .find(|k| !allowed.contains(&k.as_str()) && *k != "apiVersion" && *k != "kind")
        {
            Some(key) => Err(format!("{here}.{key}: unknown or unsupported field")),
            None => Ok(()),
        }
    };
    let plugin_args = &mut config.profile.args;
    match name {
        "NodeResourcesFit" => {
            fields(&[
                "scoringStrategy",
                "ignoredResources",
                "ignoredResourceGroups",
            ])?;
            plugin_args.node_resources_fit = fit_args(args_object, &here)?;
        }
        "InterPodAffinity" => {
            fields(&[
                "hardPodAffinityWeight",
                "ignorePreferredTermsOfExistingPods",
            ])?;
            let ipa = &mut plugin_args.inter_pod_affinity;
            if let Some(w) = args_object.get("hardPodAffinityWeight") {
                ipa.hard_pod_affinity_weight = match w.as_i64() {
                    Some(w) if (0..=100).contains(&w) => w as i32,
                    _ => {
                        return Err(format!(
                            "{here}.hardPodAffinityWeight: must be a whole number from 0 to 100"
                        ));
                    }
                };
            }
            if let Some(v) = args_object.get("ignorePreferredTermsOfExistingPods") {
                ipa.ignore_preferred_terms_of_existing_pods = v.as_bool().ok_or_else(|| {
                    format!("{here}.ignorePreferredTermsOfExistingPods: must be true or false")
                })?;
            }
        }
        "PodTopologySpread" => {
            fields(&["defaultConstraints", "defaultingType"])?;
            plugin_args.pod_topology_spread = spread_args(args_object, &here)?;
        }
        "NodeResourcesBalancedAllocation" => {
            fields(&["resources"])?;
            if let Some(r) = args_object.get("resources") {
                plugin_args.balanced_allocation.resources =
                    resource_weights(r, &format!("{here}.resources"))?;
            }
        }
        "DynamicResources" => {
            fields(&["filterTimeout"])?;
            if let Some(t) = args_object.get("filterTimeout") {
                let here = format!("{here}.filterTimeout");
                let timeout = go_duration(as_str(t, &here)?)
                    .ok_or_else(|| format!("{here}: not a duration (like 10s)"))?;
                if timeout.is_zero() || timeout > Duration::from_secs(600) {
                    return Err(format!("{here}: must be more than 0 and at most 10m"));
                }
                config.filter_timeout = Some(timeout);
            }
        }
        other => {
            return Err(format!(
                "{path}.name: arguments of plugin {other:?} are not supported"
            ));
        }
    }
    Ok(())
}

fn fit_args(args: &serde_json::Map<String, Value>, path: &str) -> Result<node_resources_fit::Args> {
    let mut fit = node_resources_fit::Args::default();
    if let Some(v) = args.get("ignoredResources") {
        fit.ignored_resources = strings(v, &format!("{path}.ignoredResources"))?;
    }
    if let Some(v) = args.get("ignoredResourceGroups") {
        fit.ignored_resource_groups = strings(v, &format!("{path}.ignoredResourceGroups"))?;
    }
    let Some(strategy) = args.get("scoringStrategy") else {
        return Ok(fit);
    };
    let here = format!("{path}.scoringStrategy");
    let strategy = as_object(strategy, &here)?;
    if let Some(key) = strategy
        .keys()
        .find(|k| !["type", "resources", "requestedToCapacityRatio"].contains(&k.as_str()))
    {
        return Err(format!("{here}.{key}: unknown field"));
    }
    if let Some(resources) = strategy.get("resources") {
        fit.resources = resource_weights(resources, &format!("{here}.resources"))?;
    }
    let kind = strategy
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("LeastAllocated");
    fit.strategy = match kind {
        "LeastAllocated" => node_resources_fit::Strategy::LeastAllocated,
        "MostAllocated" => node_resources_fit::Strategy::MostAllocated,
        "RequestedToCapacityRatio" => {
            let shape = strategy
                .get("requestedToCapacityRatio")
                .and_then(|r| r.get("shape"))
                .ok_or_else(|| format!("{here}.requestedToCapacityRatio.shape: required"))?;
            node_resources_fit::Strategy::RequestedToCapacityRatio(shape_points(
                shape,
                &format!("{here}.requestedToCapacityRatio.shape"),
            )?)
        }
        other => return Err(format!("{here}.type: unknown strategy {other:?}")),
    };
    Ok(fit)
}

fn spread_args(
    args: &serde_json::Map<String, Value>,
    path: &str,
) -> Result<pod_topology_spread::Args> {
    use pod_topology_spread::DefaultingType;
    let defaulting_type = match args.get("defaultingType").map(Value::as_str) {
        None | Some(Some("System")) => DefaultingType::System,
        Some(Some("List")) => DefaultingType::List,
        _ => return Err(format!("{path}.defaultingType: must be System or List")),
    };
    let here = format!("{path}.defaultConstraints");
    let constraints: Vec<TopologySpreadConstraint> = match args.get("defaultConstraints") {
        None => Vec::new(),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| format!("{here}: {e}"))?,
    };
    if defaulting_type == DefaultingType::System && !constraints.is_empty() {
        return Err(format!(
            "{here}: must be empty when defaultingType is System"
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, c) in constraints.iter().enumerate() {
        let at = format!("{here}[{i}]");
        if c.label_selector.is_some() {
            return Err(format!(
                "{at}.labelSelector: not allowed in default constraints"
            ));
        }
        if c.max_skew <= 0 {
            return Err(format!("{at}.maxSkew: must be greater than 0"));
        }
        if c.topology_key.is_empty() {
            return Err(format!("{at}.topologyKey: required"));
        }
        if !["DoNotSchedule", "ScheduleAnyway"].contains(&c.when_unsatisfiable.as_str()) {
            return Err(format!(
                "{at}.whenUnsatisfiable: must be DoNotSchedule or ScheduleAnyway"
            ));
        }
        if !seen.insert((c.topology_key.clone(), c.when_unsatisfiable.clone())) {
            return Err(format!("{at}: duplicate topologyKey and whenUnsatisfiable"));
        }
    }
    Ok(pod_topology_spread::Args {
        default_constraints: constraints,
        defaulting_type,
    })
}

fn resource_weights(value: &Value, path: &str) -> Result<Vec<(String, i64)>> {
    as_array(value, path)?
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let here = format!("{path}[{i}]");
            let name = r
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("{here}.name: required"))?;
            let weight = r.get("weight").and_then(Value::as_i64).unwrap_or(1);
            if !(1..=100).contains(&weight) {
                return Err(format!("{here}.weight: must be from 1 to 100"));
            }
            Ok((name.to_string(), weight))
        })
        .collect()
}

fn shape_points(value: &Value, path: &str) -> Result<Vec<(i64, i64)>> {
    let points: Vec<(i64, i64)> = as_array(value, path)?
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let here = format!("{path}[{i}]");
            let get = |k: &str, max: i64| match p.get(k).and_then(Value::as_i64) {
                Some(v) if (0..=max).contains(&v) => Ok(v),
                _ => Err(format!("{here}.{k}: must be from 0 to {max}")),
            };
            Ok((get("utilization", 100)?, get("score", 10)?))
        })
        .collect::<Result<_>>()?;
    if points.is_empty() || points.windows(2).any(|w| w[0].0 >= w[1].0) {
        return Err(format!(
            "{path}: needs at least one point, utilization strictly increasing"
        ));
    }
    Ok(points)
}

fn strings(value: &Value, path: &str) -> Result<Vec<String>> {
    as_array(value, path)?
        .iter()
        .enumerate()
        .map(|(i, v)| as_str(v, &format!("{path}[{i}]")).map(str::to_string))
        .collect()
}

fn as_object<'v>(value: &'v Value, path: &str) -> Result<&'v serde_json::Map<String, Value>> {
    value
        .as_object()
        .ok_or_else(|| format!("{path}: must be an object"))
}

fn as_array<'v>(value: &'v Value, path: &str) -> Result<&'v Vec<Value>> {
    value
        .as_array()
        .ok_or_else(|| format!("{path}: must be a list"))
}

fn as_str<'v>(value: &'v Value, path: &str) -> Result<&'v str> {
    value
        .as_str()
        .ok_or_else(|| format!("{path}: must be a string"))
}

/// A Go duration ("10s", "1m30s", "500ms", "1.5h").
pub fn go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|n| *n > 0)?;
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += number * seconds;
    }
    Some(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry<'p>(profile: &'p Profile, name: &str) -> Option<&'p super::super::PluginEntry> {
        profile.plugins.iter().find(|p| p.name == name)
    }

    #[test]
    fn score_weights_and_disabled_plugins_merge_onto_the_defaults() {
        let config = profile_config(
            &json!({
                "schedulerName": "dra-scheduler",
                "plugins": {
                    "multiPoint": {"disabled": [{"name": "ImageLocality"}]},
                    "score": {"enabled": [{"name": "NodeAffinity", "weight": 7}],
                              "disabled": [{"name": "TaintToleration"}]}
                },
                "pluginConfig": [
                    {"name": "NodeResourcesFit", "args": {"scoringStrategy": {
                        "type": "MostAllocated", "resources": [{"name": "cpu", "weight": 2}]}}},
                    {"name": "DynamicResources", "args": {"filterTimeout": "30s"}}
                ]
            }),
            "profiles[0]",
        )
        .unwrap();
        let p = &config.profile;
        assert!(entry(p, "ImageLocality").is_none());
        assert_eq!(entry(p, "NodeAffinity").unwrap().weight, 7);
        let taints = entry(p, "TaintToleration").unwrap();
        assert!(taints.points.contains(&Point::Filter) && !taints.points.contains(&Point::Score));
        assert_eq!(
            p.args.node_resources_fit.strategy,
            node_resources_fit::Strategy::MostAllocated
        );
        assert_eq!(p.args.node_resources_fit.resources, vec![("cpu".into(), 2)]);
        assert_eq!(config.filter_timeout, Some(Duration::from_secs(30)));
    }

    #[test]
    fn a_score_plugin_enabled_without_a_weight_or_with_0_weighs_1_as_upstream() {
        let weight = |plugins: Value, name: &str| {
            let config = profile_config(&json!({ "plugins": plugins }), "profiles[0]").unwrap();
            entry(&config.profile, name).unwrap().weight
        };
        let score = |p: Value| json!({"score": {"enabled": [p]}});
        assert_eq!(
            weight(score(json!({"name": "NodeAffinity"})), "NodeAffinity"),
            1
        );
        let zero = json!({"name": "TaintToleration", "weight": 0});
        assert_eq!(weight(score(zero), "TaintToleration"), 1);
        let multi = json!({"multiPoint": {"enabled": [{"name": "InterPodAffinity"}]}});
        assert_eq!(weight(multi, "InterPodAffinity"), 1);
        // The entry at score wins over multiPoint's; another point keeps the default's.
        let both = json!({"multiPoint": {"enabled": [{"name": "NodeAffinity", "weight": 5}]},
                          "score": {"enabled": [{"name": "NodeAffinity"}]}});
        assert_eq!(weight(both, "NodeAffinity"), 1);
        let pre_score = json!({"preScore": {"enabled": [{"name": "NodeAffinity"}]}});
        assert_eq!(weight(pre_score, "NodeAffinity"), 2);
    }

    #[test]
    fn disabling_everything_at_a_point_keeps_what_is_enabled_there() {
        let config = profile_config(
            &json!({"plugins": {"score": {
                "disabled": [{"name": "*"}],
                "enabled": [{"name": "NodeResourcesFit", "weight": 1}]}}}),
            "profiles[0]",
        )
        .unwrap();
        let scoring: Vec<&str> = config
            .profile
            .at(Point::Score)
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(scoring, ["NodeResourcesFit"]);
    }

    #[test]
    fn what_is_not_supported_is_an_error_naming_the_field() {
        let err = |v: Value| profile_config(&v, "profiles[0]").unwrap_err();
        assert_eq!(
            err(json!({"plugins": {"filter": {"enabled": [{"name": "DeferredPodScheduling"}]}}})),
            "profiles[0].plugins.filter.enabled[0]: plugin DeferredPodScheduling is not supported: \
             in-place resize preemption is not supported"
        );
        assert_eq!(
            err(json!({"plugins": {"filter": {"enabled": [{"name": "Coscheduling"}]}}})),
            "profiles[0].plugins.filter.enabled[0].name: unknown plugin \"Coscheduling\""
        );
        assert_eq!(
            err(json!({"plugins": {"filter": {"enabled": [{"name": "ImageLocality"}]}}})),
            "profiles[0].plugins.filter.enabled[0]: plugin ImageLocality does not run at filter"
        );
        assert_eq!(
            err(json!({"pluginConfig": [{"name": "NodeResourcesFit", "args": {"foo": 1}}]})),
            "profiles[0].pluginConfig[0].args.foo: unknown or unsupported field"
        );
        assert_eq!(
            err(json!({"frameworkOutOfTreeRegistry": {}})),
            "profiles[0].frameworkOutOfTreeRegistry: unknown field"
        );
    }

    #[test]
    fn the_podgroup_plugins_may_be_enabled_but_not_disabled() {
        let enabled = json!({"plugins": {"multiPoint": {"enabled": [
            {"name": "GangScheduling"}, {"name": "TopologyPlacementGenerator"},
            {"name": "PodGroupPodsCount"}]}}});
        assert!(profile_config(&enabled, "profiles[0]").is_ok());
        assert_eq!(
            profile_config(
                &json!({"plugins": {"multiPoint": {"disabled": [{"name": "GangScheduling"}]}}}),
                "profiles[0]"
            )
            .unwrap_err(),
            "profiles[0].plugins.multiPoint.disabled[0]: plugin GangScheduling cannot be disabled: \
             dra-scheduler always schedules a PodGroup's pods as a group"
        );
    }

    #[test]
    fn affinity_and_spread_arguments() {
        let config = profile_config(
            &json!({"pluginConfig": [
                {"name": "InterPodAffinity", "args": {"hardPodAffinityWeight": 5}},
                {"name": "PodTopologySpread", "args": {"defaultingType": "List",
                    "defaultConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                            "whenUnsatisfiable": "ScheduleAnyway"}]}}
            ]}),
            "profiles[0]",
        )
        .unwrap();
        let args = &config.profile.args;
        assert_eq!(args.inter_pod_affinity.hard_pod_affinity_weight, 5);
        assert_eq!(
            args.pod_topology_spread.defaulting_type,
            pod_topology_spread::DefaultingType::List
        );
        assert_eq!(args.pod_topology_spread.default_constraints.len(), 1);
        let err = profile_config(
            &json!({"pluginConfig": [{"name": "PodTopologySpread", "args": {
                "defaultConstraints": [{"maxSkew": 1, "topologyKey": "zone",
                                        "whenUnsatisfiable": "ScheduleAnyway"}]}}]}),
            "profiles[0]",
        )
        .unwrap_err();
        assert_eq!(
            err,
            "profiles[0].pluginConfig[0].args.defaultConstraints: must be empty when defaultingType is System"
        );
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(go_duration("10"), None);
        assert_eq!(go_duration("5x"), None);
    }
}
