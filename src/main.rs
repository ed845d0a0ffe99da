//! `dra-scheduler`: a standalone Kubernetes scheduler built around Dynamic Resource Allocation.

use dra_scheduler::{fleet, simulate};

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
    /// Schedule every pending pod, whatever its schedulerName.
    #[arg(long)]
    all_schedulers: bool,
    /// Exit with status 2 when any pod stays pending.
    #[arg(long)]
    fail_on_pending: bool,
    /// Manifest files and directories (YAML or JSON, several documents a file).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Simulate(args) => run_simulate(args),
        Command::GenerateFleet(spec) => {
            print!("{}", fleet::generate_yaml(&spec));
            ExitCode::SUCCESS
        }
    }
}

fn run_simulate(args: SimulateArgs) -> ExitCode {
    let input = match simulate::load(&args.paths) {
        Ok(input) => input,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let options = simulate::Options {
        scheduler_name: args.scheduler_name,
        all_schedulers: args.all_schedulers,
    };
    let sim = simulate::simulate(&options, input);
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
