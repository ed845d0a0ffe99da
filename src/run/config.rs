//! The daemon's settings: flags, a YAML config file, or both (a flag wins over the file,
//! the file over the default).

use std::path::PathBuf;

use serde::Deserialize;

/// `dra-scheduler run` flags. Every one can also be set in the `--config` file.
#[derive(clap::Args, Debug, Default)]
pub struct RunArgs {
    /// Kubeconfig to use (default: in-cluster, then KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Schedule pods whose spec.schedulerName is this [default: dra-scheduler].
    #[arg(long)]
    pub scheduler_name: Option<String>,
    /// A YAML file with any of: schedulerName, kubeconfig, logFormat, metricsBindAddress,
    /// percentageOfNodesToScore, maxConcurrentBinds.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_parser = ["text", "json"])]
    pub log_format: Option<String>,
    /// Address for /metrics, /healthz and /readyz [default: 0.0.0.0:10261].
    #[arg(long)]
    pub metrics_bind_address: Option<String>,
    /// Stop looking for nodes once this share is feasible (0: kube-scheduler's adaptive rule).
    #[arg(long)]
    pub percentage_of_nodes_to_score: Option<u32>,
    /// Bindings (claim writes + pod binding) in flight at once [default: 16].
    #[arg(long)]
    pub max_concurrent_binds: Option<usize>,
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
        Ok(Config {
            scheduler_name: args
                .scheduler_name
                .or(file.scheduler_name)
                .unwrap_or_else(|| "dra-scheduler".into()),
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
            "schedulerName: gpu-scheduler\nmaxConcurrentBinds: 4\nlogFormat: json\n",
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
