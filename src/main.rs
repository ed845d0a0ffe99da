//! `dra-scheduler`: a standalone Kubernetes scheduler built around Dynamic Resource Allocation.

use clap::Parser;

/// A Kubernetes scheduler for pods that use Dynamic Resource Allocation.
#[derive(Parser, Debug)]
#[command(name = "dra-scheduler", version, about)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
}
