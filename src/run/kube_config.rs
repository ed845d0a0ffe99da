//! `--config` given a KubeSchedulerConfiguration (`kubescheduler.config.k8s.io/v1`), the
//! file platform teams already have for kube-scheduler: the profile whose schedulerName is
//! ours (plugins, weights, pluginConfig, percentageOfNodesToScore), clientConnection's
//! kubeconfig, QPS and burst, and leaderElection. Settings this scheduler does not
//! implement are errors that name the field; nothing is ignored silently.

use serde_json::Value;

use dra_engine::framework::config::{ProfileConfig, go_duration, percentage, profile_config};

/// What the file sets, in the daemon's own terms (see [`super::config`]).
#[derive(Debug, Default)]
pub struct Translated {
    pub kubeconfig: Option<std::path::PathBuf>,
    pub client_qps: Option<f64>,
    pub client_burst: Option<u32>,
    pub percentage_of_nodes_to_score: Option<u32>,
    pub leader_elect: Option<bool>,
    pub lease_name: Option<String>,
    pub lease_namespace: Option<String>,
    pub lease_duration_seconds: Option<u64>,
    pub renew_deadline_seconds: Option<u64>,
    pub retry_period_seconds: Option<u64>,
    pub profile: Option<ProfileConfig>,
}

pub const API_VERSION: &str = "kubescheduler.config.k8s.io/v1";

/// Whether the document is a KubeSchedulerConfiguration.
pub fn is_kube_scheduler_configuration(value: &Value) -> bool {
    value.get("kind").and_then(Value::as_str) == Some("KubeSchedulerConfiguration")
}

/// Read the file; `scheduler_name` picks the profile (default `dra-scheduler`).
pub fn translate(value: &Value, scheduler_name: Option<&str>) -> Result<Translated, String> {
    let api_version = value.get("apiVersion").and_then(Value::as_str);
    if api_version != Some(API_VERSION) {
        return Err(format!(
            "apiVersion: {api_version:?}: KubeSchedulerConfiguration must be {API_VERSION}"
        ));
    }
    let object = value.as_object().ok_or("the file must be an object")?;
    let mut out = Translated::default();
    for (key, v) in object {
        match key.as_str() {
            "apiVersion" | "kind" => {}
            "profiles" => out.profile = Some(ours(v, scheduler_name)?),
            "percentageOfNodesToScore" => {
                out.percentage_of_nodes_to_score = Some(percentage(v, key)?)
            }
            "clientConnection" => client_connection(&mut out, v)?,
            "leaderElection" => leader_election(&mut out, v)?,
            "parallelism" | "podInitialBackoffSeconds" | "podMaxBackoffSeconds" => {
                default_only(key, v)?
            }
            "enableProfiling" | "enableContentionProfiling" | "delayCacheUntilActive" => {
                if v.as_bool() == Some(true) {
                    return Err(format!("{key}: not supported by dra-scheduler"));
                }
            }
            "extenders" => {
                if v.as_array().is_some_and(|e| !e.is_empty()) {
                    return Err("extenders: not supported by dra-scheduler".into());
                }
            }
            _ => return Err(format!("{key}: unknown field")),
        }
    }
    Ok(out)
}

/// Settings that may only be kube-scheduler's defaults here.
fn default_only(key: &str, v: &Value) -> Result<(), String> {
    let default = match key {
        "parallelism" => 16,
        "podInitialBackoffSeconds" => 1,
        _ => 10,
    };
    if v.as_i64() == Some(default) {
        Ok(())
    } else {
        Err(format!(
            "{key}: only kube-scheduler's default ({default}) is supported by dra-scheduler"
        ))
    }
}

/// The profile for our scheduler name: the only one, or the one named so.
fn ours(profiles: &Value, scheduler_name: Option<&str>) -> Result<ProfileConfig, String> {
    let list = profiles.as_array().ok_or("profiles: must be a list")?;
    let wanted = scheduler_name.unwrap_or("dra-scheduler");
    let mut found = None;
    for (i, p) in list.iter().enumerate() {
        let config = profile_config(p, &format!("profiles[{i}]"))?;
        let name = config
            .scheduler_name
            .as_deref()
            .unwrap_or("default-scheduler");
        if name == wanted || (scheduler_name.is_none() && list.len() == 1) {
            found = Some(config);
        }
    }
    found.ok_or_else(|| format!("profiles: no profile has schedulerName {wanted:?}"))
}

fn client_connection(out: &mut Translated, v: &Value) -> Result<(), String> {
    let object = v.as_object().ok_or("clientConnection: must be an object")?;
    for (key, value) in object {
        let here = format!("clientConnection.{key}");
        match key.as_str() {
            "kubeconfig" => {
                let path = value.as_str().ok_or(format!("{here}: must be a string"))?;
                if !path.is_empty() {
                    out.kubeconfig = Some(path.into());
                }
            }
            "qps" => out.client_qps = Some(value.as_f64().ok_or(format!("{here}: a number"))?),
            "burst" => {
                let burst = value.as_u64().ok_or(format!("{here}: a whole number"))?;
                let burst =
                    u32::try_from(burst).map_err(|_| format!("{here}: {burst} is too large"))?;
                out.client_burst = Some(burst);
            }
            "acceptContentTypes" | "contentType" => {
                let text = value.as_str().unwrap_or_default();
                if !text.is_empty() && !text.contains("application/json") {
                    return Err(format!(
                        "{here}: dra-scheduler speaks application/json only"
                    ));
                }
            }
            _ => return Err(format!("{here}: unknown field")),
        }
    }
    Ok(())
}

/// A string setting, or an error that names it.
fn text(value: &Value, here: &str) -> Result<String, String> {
    value
        .as_str()
        .map(str::to_string)
        .ok_or(format!("{here}: must be a string"))
}

fn leader_election(out: &mut Translated, v: &Value) -> Result<(), String> {
    let object = v.as_object().ok_or("leaderElection: must be an object")?;
    let seconds = |value: &Value, here: &str| -> Result<u64, String> {
        let text = value
            .as_str()
            .ok_or(format!("{here}: must be a duration"))?;
        let d = go_duration(text).ok_or(format!("{here}: not a duration (like 15s)"))?;
        if d.subsec_nanos() != 0 {
            return Err(format!("{here}: whole seconds only"));
        }
        Ok(d.as_secs())
    };
    for (key, value) in object {
        let here = format!("leaderElection.{key}");
        match key.as_str() {
            "leaderElect" => {
                out.leader_elect = Some(value.as_bool().ok_or(format!("{here}: true or false"))?)
            }
            "leaseDuration" => out.lease_duration_seconds = Some(seconds(value, &here)?),
            "renewDeadline" => out.renew_deadline_seconds = Some(seconds(value, &here)?),
            "retryPeriod" => out.retry_period_seconds = Some(seconds(value, &here)?),
            "resourceLock" => {
                if value.as_str() != Some("leases") {
                    return Err(format!("{here}: only leases is supported"));
                }
            }
            "resourceName" => out.lease_name = Some(text(value, &here)?),
            "resourceNamespace" => out.lease_namespace = Some(text(value, &here)?),
            _ => return Err(format!("{here}: unknown field")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(yaml: &str) -> Result<Translated, String> {
        let value: Value = serde_yaml::from_str(yaml).unwrap();
        translate(&value, None)
    }

    #[test]
    fn a_kube_scheduler_configuration_sets_profile_client_and_election() {
        let t = read(
            "apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: /etc/k/config, qps: 50, burst: 100}
leaderElection: {leaderElect: true, leaseDuration: 15s, renewDeadline: 10s, retryPeriod: 2s,
  resourceLock: leases, resourceName: dra, resourceNamespace: kube-system}
profiles:
- schedulerName: default-scheduler
- schedulerName: dra-scheduler
  percentageOfNodesToScore: 40
  plugins:
    score:
      enabled: [{name: NodeResourcesBalancedAllocation, weight: 5}]
",
        )
        .unwrap();
        assert_eq!(t.client_qps, Some(50.0));
        assert_eq!(t.client_burst, Some(100));
        assert_eq!(
            (
                t.lease_duration_seconds,
                t.renew_deadline_seconds,
                t.retry_period_seconds
            ),
            (Some(15), Some(10), Some(2))
        );
        let profile = t.profile.unwrap();
        assert_eq!(profile.percentage_of_nodes_to_score, Some(40));
        let balanced = profile
            .profile
            .plugins
            .iter()
            .find(|p| p.name == "NodeResourcesBalancedAllocation")
            .unwrap();
        assert_eq!(balanced.weight, 5);
    }

    #[test]
    fn unsupported_settings_name_the_field() {
        let head = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n";
        assert_eq!(
            read(&format!("{head}extenders: [{{urlPrefix: http://x}}]\n")).unwrap_err(),
            "extenders: not supported by dra-scheduler"
        );
        assert_eq!(
            read(&format!(
                "{head}leaderElection: {{resourceLock: endpoints}}\n"
            ))
            .unwrap_err(),
            "leaderElection.resourceLock: only leases is supported"
        );
        assert_eq!(
            read(&format!(
                "{head}profiles: [{{schedulerName: other}}, {{schedulerName: x}}]\n"
            ))
            .unwrap_err(),
            "profiles: no profile has schedulerName \"dra-scheduler\""
        );
        assert_eq!(
            read(&format!("{head}podMaxBackoffSeconds: 30\n")).unwrap_err(),
            "podMaxBackoffSeconds: only kube-scheduler's default (10) is supported by dra-scheduler"
        );
    }

    #[test]
    fn a_setting_of_the_wrong_type_or_size_is_an_error_not_a_default() {
        let head = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n";
        let err = |rest: &str| read(&format!("{head}{rest}\n")).unwrap_err();
        assert_eq!(
            err("leaderElection: {leaderElect: \"yes\"}"),
            "leaderElection.leaderElect: true or false"
        );
        assert_eq!(
            err("leaderElection: {resourceName: 7}"),
            "leaderElection.resourceName: must be a string"
        );
        assert_eq!(
            err("clientConnection: {burst: 5000000000}"),
            "clientConnection.burst: 5000000000 is too large"
        );
    }
}
