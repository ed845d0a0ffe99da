//! The daemon's settings: flags, a YAML config file, or both (a flag wins over the file,
//! the file over the default).

use std::path::PathBuf;

use serde::Deserialize;

/// `dra-scheduler run` flags. Every one can also be set in the `--config` file.
#[derive(clap::Args, Debug, Default)]
pub struct RunArgs {
    /// Kubeconfig to use (default: in-cluster, then KUBECONFIG, then ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Schedule pods whose spec.schedulerName is this [default: dra-scheduler].
    #[arg(long, value_name = "NAME")]
    pub scheduler_name: Option<String>,
    /// A YAML file with any of: schedulerName, kubeconfig, logFormat, v, metricsBindAddress,
    /// percentageOfNodesToScore, maxConcurrentBinds, clientQPS, clientBurst,
    /// filterTimeoutSeconds, leaderElection {leaderElect, leaseName, leaseNamespace,
    /// leaseDurationSeconds, renewDeadlineSeconds, retryPeriodSeconds}, scoring
    /// {prioritizedList, numaAlignment, devicePacking, leastAllocated} (weights), profile
    /// (a KubeSchedulerConfiguration profile: plugins, pluginConfig), preemption {enabled},
    /// handoff {enabled, owners, marginSeconds, maxWaitSeconds}, degraded {intervalSeconds,
    /// upgrade {enabled, afterSeconds}}, featureGates {NAME: BOOL}. Or a
    /// KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1): the profile whose
    /// schedulerName is ours, clientConnection and leaderElection are read from it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_name = "FORMAT", value_parser = ["text", "json"])]
    pub log_format: Option<String>,
    /// Log verbosity, as kube components take it: 0-3 info (the default: every scheduling
    /// decision, leadership, failures), 4 adds this scheduler's debug messages, 5 the
    /// libraries' debug messages, 6 everything. RUST_LOG, when set, wins.
    #[arg(long = "v", short = 'v', value_name = "LEVEL")]
    pub verbosity: Option<u8>,
    /// Address for /metrics, /healthz and /readyz [default: 0.0.0.0:10261].
    #[arg(long, value_name = "ADDR")]
    pub metrics_bind_address: Option<String>,
    /// Stop looking for nodes once this share is feasible (0: kube-scheduler's adaptive rule).
    #[arg(long, value_name = "PERCENT")]
    pub percentage_of_nodes_to_score: Option<u32>,
    /// Bindings (claim writes + pod binding) in flight at once [default: 32]. A binding is
    /// three writes in a row (0.26 to 0.56 s in all in benches/e2e), so this caps the pods
    /// bound per second at about this number over that time, whatever the client QPS.
    #[arg(long, value_name = "N")]
    pub max_concurrent_binds: Option<usize>,
    /// API writes per second, after a burst (0: no limit) [default: 100].
    #[arg(long, value_name = "QPS")]
    pub client_qps: Option<f64>,
    /// API writes allowed at once before the QPS limit applies [default: 200].
    #[arg(long, value_name = "N")]
    pub client_burst: Option<u32>,
    /// Run several replicas, one scheduling at a time, elected with a Lease [default: true].
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub leader_elect: Option<bool>,
    /// The Lease's name [default: the scheduler name].
    #[arg(long, value_name = "NAME")]
    pub lease_name: Option<String>,
    /// The Lease's namespace [default: kube-system].
    #[arg(long, value_name = "NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// How long a leader holds the Lease without renewing it; a standby takes over at most
    /// this long after the leader dies [default: 10].
    #[arg(long, value_name = "SECONDS")]
    pub lease_duration_seconds: Option<u64>,
    /// A leader whose renewals have failed for this long stops scheduling, lets its
    /// bindings settle and exits [default: 7; less than the lease duration].
    #[arg(long, value_name = "SECONDS")]
    pub renew_deadline_seconds: Option<u64>,
    /// How often the Lease is renewed or tried [default: 2; less than the renew deadline].
    #[arg(long, value_name = "SECONDS")]
    pub retry_period_seconds: Option<u64>,
    /// The most one pod's device search may take, over all nodes; past it the pod is
    /// unschedulable for this attempt [default: 10, kube-scheduler's DRA filter timeout].
    #[arg(long, value_name = "SECONDS")]
    pub filter_timeout_seconds: Option<f64>,
}

/// The config file; unknown keys are an error naming the key.
#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct File {
    scheduler_name: Option<String>,
    kubeconfig: Option<PathBuf>,
    log_format: Option<String>,
    /// `--v`.
    #[serde(rename = "v")]
    verbosity: Option<u8>,
    metrics_bind_address: Option<String>,
    percentage_of_nodes_to_score: Option<u32>,
    max_concurrent_binds: Option<usize>,
    #[serde(rename = "clientQPS")]
    client_qps: Option<f64>,
    client_burst: Option<u32>,
    /// Seconds, as kube-scheduler's `filterTimeout` of its DynamicResources plugin args.
    filter_timeout_seconds: Option<f64>,
    #[serde(default)]
    leader_election: LeaderElectionFile,
    /// `preemption: {enabled: false}` turns preemption off.
    preemption: Option<PreemptionFile>,
    /// The handoff wait (`dra_engine::handoff`).
    handoff: Option<HandoffFile>,
    /// Degraded-pod reporting and the optional upgrade.
    degraded: Option<DegradedFile>,
    /// Kubernetes' DRA feature gates, by name, as kube-scheduler's `--feature-gates`.
    feature_gates: Option<std::collections::BTreeMap<String, bool>>,
    scoring: Option<ScoringFile>,
    /// A KubeSchedulerConfiguration profile (`plugins`, `pluginConfig`), merged onto the
    /// default profile as kube-scheduler merges it.
    profile: Option<serde_json::Value>,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PreemptionFile {
    enabled: bool,
}

#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct HandoffFile {
    enabled: Option<bool>,
    /// `same` or `any`.
    owners: Option<String>,
    margin_seconds: Option<f64>,
    max_wait_seconds: Option<f64>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DegradedFile {
    interval_seconds: Option<f64>,
    #[serde(default)]
    upgrade: UpgradeFile,
}

#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct UpgradeFile {
    enabled: Option<bool>,
    after_seconds: Option<f64>,
}

/// The handoff wait: a pod placed on a lower-ranked `firstAvailable` subrequest waits for
/// the better device a terminating pod holds (`dra_engine::handoff`).
#[derive(Debug, Clone, PartialEq)]
pub struct Handoff {
    pub enabled: bool,
    /// Whose terminating pods are waited for.
    pub owners: dra_engine::Owners,
    /// Added to the holder's remaining grace period: the time for its claim to be released
    /// once it is gone.
    pub margin: std::time::Duration,
    /// The most a pod waits, whatever the holder's grace period.
    pub max_wait: std::time::Duration,
}

impl Default for Handoff {
    fn default() -> Self {
        Handoff {
            enabled: true,
            owners: dra_engine::Owners::Same,
            margin: std::time::Duration::from_secs(30),
            max_wait: std::time::Duration::from_secs(60),
        }
    }
}

/// Degraded pods: how often bound pods are checked, and the optional upgrade.
#[derive(Debug, Clone, PartialEq)]
pub struct Degraded {
    pub interval: std::time::Duration,
    /// Evict a degraded pod (one per owner at a time, through the Eviction API, so
    /// PodDisruptionBudgets hold) once it has been degraded this long; off when `None`.
    pub upgrade_after: Option<std::time::Duration>,
}

impl Default for Degraded {
    fn default() -> Self {
        Degraded {
            interval: std::time::Duration::from_secs(10),
            upgrade_after: None,
        }
    }
}

/// Seconds from the file, checked to lie in `range`.
fn seconds(
    name: &str,
    value: Option<f64>,
    default: std::time::Duration,
    range: std::ops::RangeInclusive<f64>,
) -> Result<std::time::Duration, String> {
    match value {
        None => Ok(default),
        Some(v) if range.contains(&v) => Ok(std::time::Duration::from_secs_f64(v)),
        Some(v) => Err(format!(
            "{name} {v}: must be between {} and {}",
            range.start(),
            range.end()
        )),
    }
}

fn handoff(file: Option<HandoffFile>) -> Result<Handoff, String> {
    let file = file.unwrap_or_default();
    let default = Handoff::default();
    Ok(Handoff {
        enabled: file.enabled.unwrap_or(true),
        owners: match file.owners.as_deref() {
            None | Some("same") => dra_engine::Owners::Same,
            Some("any") => dra_engine::Owners::Any,
            Some(other) => return Err(format!("handoff.owners {other:?}: must be same or any")),
        },
        margin: seconds(
            "handoff.marginSeconds",
            file.margin_seconds,
            default.margin,
            0.0..=600.0,
        )?,
        max_wait: seconds(
            "handoff.maxWaitSeconds",
            file.max_wait_seconds,
            default.max_wait,
            0.0..=3600.0,
        )?,
    })
}

fn degraded(file: Option<DegradedFile>) -> Result<Degraded, String> {
    let file = file.unwrap_or_default();
    let default = Degraded::default();
    let upgrade_after = seconds(
        "degraded.upgrade.afterSeconds",
        file.upgrade.after_seconds,
        std::time::Duration::from_secs(300),
        0.0..=86400.0,
    )?;
    Ok(Degraded {
        interval: seconds(
            "degraded.intervalSeconds",
            file.interval_seconds,
            default.interval,
            1.0..=3600.0,
        )?,
        upgrade_after: file
            .upgrade
            .enabled
            .unwrap_or(false)
            .then_some(upgrade_after),
    })
}

/// The DRA features the allocator reads, from Kubernetes' gate names: 1.37's defaults
/// (the beta and GA gates on, the alpha ones off) with `gates` applied. An unknown name is
/// an error that names it.
fn features(
    gates: Option<&std::collections::BTreeMap<String, bool>>,
) -> Result<dra_engine::Features, String> {
    let mut f = dra_engine::Features::default();
    for (gate, &on) in gates.into_iter().flatten() {
        let slot = match gate.as_str() {
            "DRAAdminAccess" => &mut f.admin_access,
            "DRAPrioritizedList" => &mut f.prioritized_list,
            "DRAPartitionableDevices" => &mut f.partitionable_devices,
            "DRADeviceTaints" => &mut f.device_taints,
            "DRADeviceBindingConditions" => &mut f.binding_conditions,
            "DRAConsumableCapacity" => &mut f.consumable_capacity,
            "DRAListTypeAttributes" => &mut f.list_type_attributes,
            "DRADerivedAttributes" => &mut f.derived_attributes,
            "DRADeviceCompatibilityGroups" => &mut f.compatibility_groups,
            "DRAOptionalNodeOperations" => &mut f.optional_node_operations,
            "DRANodeAllocatableResources" => &mut f.node_allocatable_resources,
            other => {
                return Err(format!(
                    "featureGates.{other}: not a DRA feature gate the allocator reads"
                ));
            }
        };
        *slot = on;
    }
    Ok(f)
}

/// Scoring weights; a criterion left out weighs 0.
#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ScoringFile {
    #[serde(default)]
    prioritized_list: u32,
    #[serde(default)]
    numa_alignment: u32,
    #[serde(default)]
    device_packing: u32,
    #[serde(default)]
    least_allocated: u32,
}

/// The config file: this scheduler's own YAML, or a KubeSchedulerConfiguration (whose
/// profile then replaces the default one).
fn read_file(
    path: &std::path::Path,
    scheduler_name: Option<&str>,
) -> Result<(File, Option<dra_engine::Profile>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let value: serde_json::Value = serde_yaml::from_str(&text).map_err(|e| e.to_string())?;
    if !super::kube_config::is_kube_scheduler_configuration(&value) {
        let file = serde_json::from_value(value).map_err(|e| e.to_string())?;
        return Ok((file, None));
    }
    let t = super::kube_config::translate(&value, scheduler_name)?;
    let profile = t.profile;
    let file = File {
        scheduler_name: profile.as_ref().and_then(|p| p.scheduler_name.clone()),
        kubeconfig: t.kubeconfig,
        percentage_of_nodes_to_score: profile
            .as_ref()
            .and_then(|p| p.percentage_of_nodes_to_score)
            .or(t.percentage_of_nodes_to_score),
        client_qps: t.client_qps,
        client_burst: t.client_burst,
        filter_timeout_seconds: profile
            .as_ref()
            .and_then(|p| p.filter_timeout)
            .map(|d| d.as_secs_f64()),
        leader_election: LeaderElectionFile {
            leader_elect: t.leader_elect,
            lease_name: t.lease_name,
            lease_namespace: t.lease_namespace,
            lease_duration_seconds: t.lease_duration_seconds,
            renew_deadline_seconds: t.renew_deadline_seconds,
            retry_period_seconds: t.retry_period_seconds,
        },
        ..File::default()
    };
    Ok((file, profile.map(|p| p.profile)))
}

/// `profile:` in this scheduler's own file: plugins and pluginConfig only (the scheduler
/// name, node percentage and filter timeout have their own keys).
fn own_profile(value: &serde_json::Value) -> Result<dra_engine::Profile, String> {
    let config = dra_engine::framework::config::profile_config(value, "profile")?;
    if config.scheduler_name.is_some() {
        return Err("profile.schedulerName: set schedulerName at the top of the file".into());
    }
    if config.percentage_of_nodes_to_score.is_some() {
        return Err("profile.percentageOfNodesToScore: set it at the top of the file".into());
    }
    if config.filter_timeout.is_some() {
        return Err(
            "profile.pluginConfig: set DynamicResources' filterTimeout as filterTimeoutSeconds"
                .into(),
        );
    }
    Ok(config.profile)
}

/// The default profile with the `scoring:` weights on the plugins they name: the
/// prioritized list is DynamicResources' score, least allocated NodeResourcesFit's.
fn profile_with(scoring: Option<ScoringFile>) -> dra_engine::Profile {
    let mut profile = dra_engine::Profile::default();
    let Some(w) = scoring else {
        return profile;
    };
    for (name, weight) in [
        ("DynamicResources", w.prioritized_list),
        ("NUMAAlignment", w.numa_alignment),
        ("DevicePacking", w.device_packing),
        ("NodeResourcesFit", w.least_allocated),
    ] {
        if let Some(entry) = profile.entry_mut(name) {
            entry.weight = i64::from(weight);
        }
    }
    profile
}

#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LeaderElectionFile {
    leader_elect: Option<bool>,
    lease_name: Option<String>,
    lease_namespace: Option<String>,
    lease_duration_seconds: Option<u64>,
    renew_deadline_seconds: Option<u64>,
    retry_period_seconds: Option<u64>,
}

/// Leader election: one replica schedules, the others keep their caches warm and wait.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaderElection {
    pub lease_name: String,
    pub lease_namespace: String,
    pub lease_duration_seconds: u64,
    /// Renewals failing this long end the leadership (see [`super::leader::Fence`]).
    pub renew_deadline_seconds: u64,
    pub retry_period_seconds: u64,
}

/// The settings in force.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub scheduler_name: String,
    pub kubeconfig: Option<PathBuf>,
    pub log_format: String,
    /// `--v`; `None` when neither the flag nor the file sets it.
    pub verbosity: Option<u8>,
    pub metrics_bind_address: String,
    pub percentage_of_nodes_to_score: u32,
    pub max_concurrent_binds: usize,
    pub client_qps: f64,
    pub client_burst: u32,
    /// The scheduling profile: kube-scheduler's default plugins plus the device scores,
    /// with the weights of `scoring:` in the file applied.
    pub profile: dra_engine::Profile,
    /// `None` when leader election is off: this replica schedules alone.
    pub leader_election: Option<LeaderElection>,
    /// One pod's device search budget.
    pub filter_timeout: std::time::Duration,
    /// PostFilter preemption (on unless `preemption: {enabled: false}`, or the profile
    /// disables DefaultPreemption).
    pub preemption: bool,
    /// `handoff:`: the wait for a better device a terminating pod holds.
    pub handoff: Handoff,
    /// `degraded:`: reporting pods on a worse device than is free, and the upgrade.
    pub degraded: Degraded,
    /// `featureGates:`: the DRA features the allocator reads.
    pub features: dra_engine::Features,
}

impl Config {
    /// What the engine is told of these settings.
    pub fn engine_config(&self) -> dra_engine::EngineConfig {
        dra_engine::EngineConfig {
            scheduler_name: self.scheduler_name.clone(),
            percentage_of_nodes_to_score: self.percentage_of_nodes_to_score,
            profile: self.profile.clone(),
            filter_timeout: self.filter_timeout,
            preemption: self.preemption,
            features: self.features.clone(),
        }
    }

    pub fn resolve(args: RunArgs) -> Result<Config, String> {
        let (file, profile) = match &args.config {
            Some(path) => read_file(path, args.scheduler_name.as_deref())
                .map_err(|e| format!("{}: {e}", path.display()))?,
            None => (File::default(), None),
        };
        let log_format = args
            .log_format
            .or(file.log_format)
            .unwrap_or_else(|| "text".into());
        if log_format != "text" && log_format != "json" {
            return Err(format!("logFormat {log_format:?}: must be text or json"));
        }
        let scheduler_name = args
            .scheduler_name
            .or(file.scheduler_name)
            .unwrap_or_else(|| "dra-scheduler".into());
        let election = file.leader_election;
        let leader_election = if args.leader_elect.or(election.leader_elect).unwrap_or(true) {
            let lease_duration_seconds = args
                .lease_duration_seconds
                .or(election.lease_duration_seconds)
                .unwrap_or(10);
            if lease_duration_seconds < 2 {
                return Err(format!(
                    "leaseDurationSeconds {lease_duration_seconds}: must be at least 2"
                ));
            }
            let renew_deadline_seconds = args
                .renew_deadline_seconds
                .or(election.renew_deadline_seconds)
                .unwrap_or_else(|| (lease_duration_seconds * 7 / 10).max(1));
            let retry_period_seconds = args
                .retry_period_seconds
                .or(election.retry_period_seconds)
                .unwrap_or_else(|| (renew_deadline_seconds / 3).clamp(1, 2));
            // As client-go requires: the leader gives up before a standby may take over, and
            // tries more than once before it gives up. The fence stops writes one second
            // before the lease duration, so at least one second lies between.
            if renew_deadline_seconds + 1 > lease_duration_seconds {
                return Err(format!(
                    "renewDeadlineSeconds {renew_deadline_seconds}: must be at least 1 less than leaseDurationSeconds {lease_duration_seconds}"
                ));
            }
            if retry_period_seconds == 0 || retry_period_seconds >= renew_deadline_seconds {
                return Err(format!(
                    "retryPeriodSeconds {retry_period_seconds}: must be at least 1 and less than renewDeadlineSeconds {renew_deadline_seconds}"
                ));
            }
            Some(LeaderElection {
                lease_name: args
                    .lease_name
                    .or(election.lease_name)
                    .unwrap_or_else(|| scheduler_name.clone()),
                lease_namespace: args
                    .lease_namespace
                    .or(election.lease_namespace)
                    .unwrap_or_else(|| "kube-system".into()),
                lease_duration_seconds,
                renew_deadline_seconds,
                retry_period_seconds,
            })
        } else {
            None
        };
        let filter_timeout = args
            .filter_timeout_seconds
            .or(file.filter_timeout_seconds)
            .unwrap_or(dra_engine::DEFAULT_FILTER_TIMEOUT.as_secs_f64());
        if !(filter_timeout > 0.0 && filter_timeout <= 600.0) {
            return Err(format!(
                "filterTimeoutSeconds {filter_timeout}: must be more than 0 and at most 600"
            ));
        }
        Ok(Config {
            scheduler_name,
            kubeconfig: args.kubeconfig.or(file.kubeconfig),
            log_format,
            verbosity: args.verbosity.or(file.verbosity),
            metrics_bind_address: args
                .metrics_bind_address
                .or(file.metrics_bind_address)
                .unwrap_or_else(|| "0.0.0.0:10261".into()),
            percentage_of_nodes_to_score: args
                .percentage_of_nodes_to_score
                .or(file.percentage_of_nodes_to_score)
                .unwrap_or(0),
            max_concurrent_binds: args
                .max_concurrent_binds
                .or(file.max_concurrent_binds)
                .unwrap_or(32),
            profile: match (profile, file.profile, file.scoring) {
                (Some(p), _, _) => p,
                (None, Some(_), Some(_)) => {
                    return Err("scoring and profile: set the weights in one of them".into());
                }
                (None, Some(p), None) => own_profile(&p)?,
                (None, None, scoring) => profile_with(scoring),
            },
            client_qps: args.client_qps.or(file.client_qps).unwrap_or(100.0),
            client_burst: args.client_burst.or(file.client_burst).unwrap_or(200),
            leader_election,
            filter_timeout: std::time::Duration::from_secs_f64(filter_timeout),
            preemption: file.preemption.is_none_or(|p| p.enabled),
            handoff: handoff(file.handoff)?,
            degraded: degraded(file.degraded)?,
            features: features(file.feature_gates.as_ref())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_gates_turn_the_alpha_dra_features_on_and_an_unknown_gate_is_named() {
        let gates = |yaml: &str| {
            let map: std::collections::BTreeMap<String, bool> = serde_yaml::from_str(yaml).unwrap();
            features(Some(&map))
        };
        let default = features(None).unwrap();
        assert!(!default.derived_attributes && !default.compatibility_groups);
        assert!(default.prioritized_list && default.device_taints);
        let on = gates("{DRADerivedAttributes: true, DRADeviceCompatibilityGroups: true, DRAListTypeAttributes: true, DRAOptionalNodeOperations: true, DRADeviceTaints: false}").unwrap();
        assert!(on.derived_attributes && on.compatibility_groups);
        assert!(on.list_type_attributes && on.optional_node_operations);
        assert!(!on.device_taints);
        assert_eq!(
            gates("{DRAResourceClaimDeviceStatus: true}").unwrap_err(),
            "featureGates.DRAResourceClaimDeviceStatus: not a DRA feature gate the allocator reads"
        );
    }

    #[test]
    fn flags_win_over_the_file_and_the_file_over_defaults() {
        let dir = std::env::temp_dir().join(format!("run-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.yaml");
        std::fs::write(
            &path,
            "schedulerName: gpu-scheduler\nmaxConcurrentBinds: 4\nlogFormat: json\nclientQPS: 20\nv: 2\n",
        )
        .unwrap();
        let config = Config::resolve(RunArgs {
            config: Some(path.clone()),
            max_concurrent_binds: Some(8),
            verbosity: Some(4),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(config.scheduler_name, "gpu-scheduler");
        assert_eq!(config.verbosity, Some(4), "--v wins over the file's v");
        let from_file = Config::resolve(RunArgs {
            config: Some(path.clone()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(from_file.verbosity, Some(2));
        assert_eq!(config.max_concurrent_binds, 8);
        assert_eq!(config.log_format, "json");
        assert_eq!(config.metrics_bind_address, "0.0.0.0:10261");
        assert_eq!((config.client_qps, config.client_burst), (20.0, 200));
        assert_eq!(
            config.leader_election,
            Some(LeaderElection {
                lease_name: "gpu-scheduler".into(),
                lease_namespace: "kube-system".into(),
                lease_duration_seconds: 10,
                renew_deadline_seconds: 7,
                retry_period_seconds: 2,
            }),
            "on by default, the lease named after the scheduler"
        );
        assert_eq!(config.filter_timeout, std::time::Duration::from_secs(10));

        std::fs::write(
            &path,
            "leaderElection:\n  leaderElect: true\n  leaseNamespace: dra\n  leaseDurationSeconds: 15\n\
             scoring: {leastAllocated: 2, devicePacking: 1}\n",
        )
        .unwrap();
        let config = Config::resolve(RunArgs {
            config: Some(path.clone()),
            ..Default::default()
        })
        .unwrap();
        let weight = |name: &str| {
            config
                .profile
                .plugins
                .iter()
                .find(|p| p.name == name)
                .map(|p| p.weight)
        };
        assert_eq!(weight("NodeResourcesFit"), Some(2));
        assert_eq!(weight("DevicePacking"), Some(1));
        assert_eq!(weight("NUMAAlignment"), Some(0));
        assert_eq!(weight("DynamicResources"), Some(0));
        assert_eq!(
            weight("TaintToleration"),
            Some(3),
            "others keep their weights"
        );
        let election = config.leader_election.unwrap();
        assert_eq!(
            (
                election.lease_namespace.as_str(),
                election.lease_duration_seconds
            ),
            ("dra", 15)
        );
        let off = Config::resolve(RunArgs {
            config: Some(path.clone()),
            leader_elect: Some(false),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(off.leader_election, None, "the flag wins");

        std::fs::write(&path, "filterTimeoutSeconds: 2.5\nleaderElection: {leaseDurationSeconds: 15, renewDeadlineSeconds: 15}\n").unwrap();
        let err = Config::resolve(RunArgs {
            config: Some(path.clone()),
            filter_timeout_seconds: Some(0.5),
            ..Default::default()
        })
        .unwrap_err();
        assert!(
            err.starts_with("renewDeadlineSeconds 15: must be at least 1 less"),
            "{err}"
        );
        std::fs::write(&path, "filterTimeoutSeconds: 2.5\n").unwrap();
        let config = Config::resolve(RunArgs {
            config: Some(path.clone()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            config.filter_timeout,
            std::time::Duration::from_millis(2500)
        );

        std::fs::write(&path, "schedulerNmae: typo\n").unwrap();
        let err = Config::resolve(RunArgs {
            config: Some(path),
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.contains("unknown field `schedulerNmae`"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_kube_scheduler_configuration_file_configures_the_daemon() {
        let dir = std::env::temp_dir().join(format!("run-kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("scheduler.yaml");
        std::fs::write(
            &path,
            "apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {qps: 30, burst: 60}
leaderElection: {leaseDuration: 15s, renewDeadline: 10s, retryPeriod: 2s}
profiles:
- schedulerName: gpu-scheduler
  plugins:
    multiPoint:
      disabled: [{name: ImageLocality}]
  pluginConfig:
  - name: DynamicResources
    args: {filterTimeout: 20s}
",
        )
        .unwrap();
        let config = Config::resolve(RunArgs {
            config: Some(path.clone()),
            scheduler_name: Some("gpu-scheduler".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(config.scheduler_name, "gpu-scheduler");
        assert_eq!((config.client_qps, config.client_burst), (30.0, 60));
        assert_eq!(config.leader_election.unwrap().lease_duration_seconds, 15);
        assert_eq!(config.filter_timeout, std::time::Duration::from_secs(20));
        assert!(
            !config
                .profile
                .plugins
                .iter()
                .any(|p| p.name == "ImageLocality"),
            "the profile comes from the file"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_own_file_takes_a_profile_with_plugins_and_their_arguments() {
        let dir = std::env::temp_dir().join(format!("run-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.yaml");
        std::fs::write(
            &path,
            "profile:
  plugins:
    score:
      disabled: [{name: DevicePacking}]
  pluginConfig:
  - name: NodeResourcesFit
    args: {scoringStrategy: {type: MostAllocated}}
",
        )
        .unwrap();
        let config = Config::resolve(RunArgs {
            config: Some(path.clone()),
            ..Default::default()
        })
        .unwrap();
        let packing = config
            .profile
            .plugins
            .iter()
            .find(|p| p.name == "DevicePacking");
        assert!(
            packing.is_none(),
            "a score-only plugin disabled at score is gone"
        );
        assert_eq!(
            config.profile.args.node_resources_fit.strategy,
            dra_engine::plugins::node_resources_fit::Strategy::MostAllocated
        );
        std::fs::write(&path, "scoring: {leastAllocated: 1}\nprofile: {}\n").unwrap();
        let err = Config::resolve(RunArgs {
            config: Some(path),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(err, "scoring and profile: set the weights in one of them");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
