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
    /// A YAML file with any of: schedulerName, kubeconfig, logFormat, metricsBindAddress,
    /// percentageOfNodesToScore, maxConcurrentBinds, clientQPS, clientBurst, leaderElection
    /// {leaderElect, leaseName, leaseNamespace, leaseDurationSeconds}, scoring
    /// {prioritizedList, numaAlignment, devicePacking, leastAllocated} (weights).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_name = "FORMAT", value_parser = ["text", "json"])]
    pub log_format: Option<String>,
    /// Address for /metrics, /healthz and /readyz [default: 0.0.0.0:10261].
    #[arg(long, value_name = "ADDR")]
    pub metrics_bind_address: Option<String>,
    /// Stop looking for nodes once this share is feasible (0: kube-scheduler's adaptive rule).
    #[arg(long, value_name = "PERCENT")]
    pub percentage_of_nodes_to_score: Option<u32>,
    /// Bindings (claim writes + pod binding) in flight at once [default: 16].
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
}

/// The config file; unknown keys are an error naming the key.
#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct File {
    scheduler_name: Option<String>,
    kubeconfig: Option<PathBuf>,
    log_format: Option<String>,
    metrics_bind_address: Option<String>,
    percentage_of_nodes_to_score: Option<u32>,
    max_concurrent_binds: Option<usize>,
    #[serde(rename = "clientQPS")]
    client_qps: Option<f64>,
    client_burst: Option<u32>,
    #[serde(default)]
    leader_election: LeaderElectionFile,
    scoring: Option<ScoringFile>,
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

#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LeaderElectionFile {
    leader_elect: Option<bool>,
    lease_name: Option<String>,
    lease_namespace: Option<String>,
    lease_duration_seconds: Option<u64>,
}

/// Leader election: one replica schedules, the others keep their caches warm and wait.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaderElection {
    pub lease_name: String,
    pub lease_namespace: String,
    pub lease_duration_seconds: u64,
}

/// The settings in force.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub scheduler_name: String,
    pub kubeconfig: Option<PathBuf>,
    pub log_format: String,
    pub metrics_bind_address: String,
    pub percentage_of_nodes_to_score: u32,
    pub max_concurrent_binds: usize,
    pub client_qps: f64,
    pub client_burst: u32,
    /// `scoring:` in the file; `None`: the criteria in strict order.
    pub scoring: Option<dra_engine::ScoreWeights>,
    /// `None` when leader election is off: this replica schedules alone.
    pub leader_election: Option<LeaderElection>,
}

impl Config {
    pub fn resolve(args: RunArgs) -> Result<Config, String> {
        let file: File = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
            }
            None => File::default(),
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
            })
        } else {
            None
        };
        Ok(Config {
            scheduler_name,
            kubeconfig: args.kubeconfig.or(file.kubeconfig),
            log_format,
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
                .unwrap_or(16),
            scoring: file.scoring.map(|w| dra_engine::ScoreWeights {
                prioritized_list: w.prioritized_list,
                numa_alignment: w.numa_alignment,
                device_packing: w.device_packing,
                least_allocated: w.least_allocated,
            }),
            client_qps: args.client_qps.or(file.client_qps).unwrap_or(100.0),
            client_burst: args.client_burst.or(file.client_burst).unwrap_or(200),
            leader_election,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_file_and_the_file_over_defaults() {
        let dir = std::env::temp_dir().join(format!("run-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.yaml");
        std::fs::write(
            &path,
            "schedulerName: gpu-scheduler\nmaxConcurrentBinds: 4\nlogFormat: json\nclientQPS: 20\n",
        )
        .unwrap();
        let config = Config::resolve(RunArgs {
            config: Some(path.clone()),
            max_concurrent_binds: Some(8),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(config.scheduler_name, "gpu-scheduler");
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
            }),
            "on by default, the lease named after the scheduler"
        );

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
        assert_eq!(
            config.scoring,
            Some(dra_engine::ScoreWeights {
                least_allocated: 2,
                device_packing: 1,
                ..Default::default()
            })
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

        std::fs::write(&path, "schedulerNmae: typo\n").unwrap();
        let err = Config::resolve(RunArgs {
            config: Some(path),
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.contains("unknown field `schedulerNmae`"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
