//! `dra-scheduler`: a standalone Kubernetes scheduler built around Dynamic Resource Allocation.

use dra_scheduler::{fleet, run, simulate};

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// A Kubernetes scheduler for pods that use Dynamic Resource Allocation.
#[derive(Parser, Debug)]
#[command(name = "dra-scheduler", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Schedule the pending pods of a set of manifests, with no cluster, and report where
    /// each pod would go and which devices each claim would get.
    Simulate(SimulateArgs),
    /// Run the scheduler against a cluster: pods with `schedulerName: dra-scheduler` get
    /// devices allocated and are bound.
    Run(Box<run::config::RunArgs>),
    /// Write a synthetic GPU fleet and workload as manifests, for trying `simulate` at scale.
    GenerateFleet(fleet::FleetSpec),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(clap::Args, Debug)]
struct SimulateArgs {
    /// Report format.
    #[arg(long, short, value_enum, default_value = "table")]
    output: Output,
    /// Schedule pods whose spec.schedulerName is this.
    #[arg(long, default_value = "dra-scheduler")]
    scheduler_name: String,
    /// The daemon's config file (its own YAML or a KubeSchedulerConfiguration): simulate
    /// with the same profile, percentageOfNodesToScore, filter timeout, preemption and
    /// handoff wait.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Schedule every pending pod, whatever its schedulerName.
    #[arg(long)]
    all_schedulers: bool,
    /// Exit with status 2 when any pod stays pending.
    #[arg(long)]
    fail_on_pending: bool,
    /// Never evict pods of lower priority for a pod that fits nowhere (by default such a
    /// pod preempts them, as in the cluster, and the report lists who is evicted).
    #[arg(long)]
    no_preemption: bool,
    /// Start from the live cluster's state (read through the kubeconfig; nothing is
    /// written): its nodes, devices, pods and claims, with the manifests applied on top.
    #[arg(long)]
    from_cluster: bool,
    /// The kubeconfig for --from-cluster (default: in-cluster, KUBECONFIG, ~/.kube/config).
    #[arg(long, value_name = "FILE", requires = "from_cluster")]
    kubeconfig: Option<PathBuf>,
    /// Manifest files and directories (YAML or JSON, several documents a file).
    #[arg(required_unless_present = "from_cluster")]
    paths: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Simulate(args) => run_simulate(args),
        Command::Run(args) => run_daemon(*args),
        Command::GenerateFleet(spec) => {
            print!("{}", fleet::generate_yaml(&spec));
            ExitCode::SUCCESS
        }
    }
}

/// The cluster's objects for `--from-cluster`, else none.
fn starting_state(args: &SimulateArgs) -> anyhow::Result<simulate::manifests::Manifests> {
    if !args.from_cluster {
        return Ok(Default::default());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = simulate::live::client(args.kubeconfig.as_deref()).await?;
        simulate::live::read(&client).await
    })
}

fn run_simulate(args: SimulateArgs) -> ExitCode {
    let cluster = match starting_state(&args) {
        Ok(cluster) => cluster,
        Err(e) => {
            eprintln!("error: reading the cluster: {e:#}");
            return ExitCode::from(1);
        }
    };
    let (input, groups) = match simulate::load_onto(cluster, &args.paths) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let mut options = simulate::Options {
        scheduler_name: args.scheduler_name.clone(),
        all_schedulers: args.all_schedulers,
        preemption: !args.no_preemption,
        ..Default::default()
    };
    if let Some(path) = args.config {
        let config = run::config::Config::resolve(run::config::RunArgs {
            config: Some(path),
            scheduler_name: Some(args.scheduler_name),
            ..Default::default()
        });
        match config {
            Ok(c) => {
                options.scheduler_name = c.scheduler_name;
                options.profile = c.profile;
                options.percentage_of_nodes_to_score = c.percentage_of_nodes_to_score;
                options.filter_timeout = c.filter_timeout;
                // The file can turn preemption off; --no-preemption always does.
                options.preemption &= c.preemption;
                options.handoff = c.handoff.enabled.then(|| c.handoff.clone());
                options.features = c.features;
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(1);
            }
        }
    }
    let sim = simulate::simulate_groups(&options, input, groups);
    match args.output {
        Output::Table => print!("{}", simulate::report::table(&sim)),
        Output::Json => println!("{}", simulate::report::json(&sim)),
    }
    if args.fail_on_pending && sim.pending() > 0 {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}

fn run_daemon(args: run::config::RunArgs) -> ExitCode {
    let config = match run::config::Config::resolve(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    // Config::resolve accepts text and json only.
    let format = config.log_format.parse().unwrap_or_default();
    dra_telemetry::log::init(format, config.verbosity);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            dra_telemetry::log::fatal(format, &format!("{e:#}"));
            ExitCode::from(1)
        }
    }
}
