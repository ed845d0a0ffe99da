//! `kubectl-dra`: the kubectl plugin for DRA devices. On PATH, `kubectl dra nodes`,
//! `kubectl dra claims` and `kubectl dra why POD` run it. It reads through the user's
//! kubeconfig (list requests only) and writes nothing.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use dra_engine::inventory::Inventory;
use dra_engine::{Engine, ObjectKey};
use dra_scheduler::kubectl::{self, claims, live, nodes, why};

/// What the cluster's DRA devices are doing, and why a pod does not fit.
#[derive(Parser, Debug)]
#[command(name = "kubectl-dra", bin_name = "kubectl dra", version)]
struct Cli {
    /// The kubeconfig (default: KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, global = true, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: the current one).
    #[arg(long, global = true)]
    context: Option<String>,
    /// The namespace (default: the context's, else `default`).
    #[arg(short, long, global = true)]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Per node: devices by driver, class and product (total, allocated, free, tainted,
    /// blocked by shared counters), their NUMA nodes, and the shared counters
    /// partitionable devices have left.
    Nodes {
        /// Only nodes with these labels (a label selector, as `kubectl get -l`).
        #[arg(short = 'l', long)]
        selector: Option<String>,
        #[arg(short, long, value_enum)]
        output: Option<Format>,
    },
    /// Each ResourceClaim: pending, allocated or reserved; its devices, node and pods.
    Claims {
        /// Claims of every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        #[arg(short, long, value_enum)]
        output: Option<Format>,
    },
    /// Why a pod does not fit, per node, and what would make it fit: preemption as the
    /// scheduler would do it, one selector or constraint dropped, devices that are missing.
    Why {
        /// The pod's name.
        pod: String,
        /// The scheduler's config file (as for `dra-scheduler run --config`): the same
        /// profile, filter timeout and preemption switch.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// `json` or `yaml` for structured output (default and `wide`: text).
        #[arg(short, long, value_enum)]
        output: Option<Format>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
enum Format {
    Wide,
    Json,
    Yaml,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Rows as a table (`wide` or not), JSON or YAML.
fn print<T: serde::Serialize>(
    rows: &T,
    format: Option<Format>,
    table: impl FnOnce(bool) -> String,
) -> anyhow::Result<String> {
    Ok(match format {
        None => table(false),
        Some(Format::Wide) => table(true),
        Some(Format::Json) => serde_json::to_string_pretty(rows)? + "\n",
        Some(Format::Yaml) => serde_yaml::to_string(rows)?,
    })
}

async fn run(cli: Cli) -> anyhow::Result<String> {
    let (client, context_namespace) =
        live::connect(cli.kubeconfig.as_deref(), cli.context.as_deref()).await?;
    let namespace = cli.namespace.unwrap_or(context_namespace);
    let selected = match &cli.command {
        Command::Nodes {
            selector: Some(s), ..
        } => Some(live::selected_nodes(&client, s).await?),
        _ => None,
    };
    let (input, groups) = live::read(&client).await?;
    let config = match &cli.command {
        Command::Why { config, .. } => {
            kubectl::engine_config(config.as_deref()).map_err(anyhow::Error::msg)?
        }
        _ => Default::default(),
    };
    let mut engine = Engine::new(config, input);
    match cli.command {
        Command::Nodes { output, .. } => {
            let inventory = Inventory::of(engine.state());
            let rows = nodes::nodes(engine.state(), &inventory, selected.as_ref());
            if rows.is_empty() && output.is_none_or(|o| o == Format::Wide) {
                eprintln!("No nodes found.");
                return Ok(String::new());
            }
            print(&serde_json::json!({ "nodes": rows }), output, |wide| {
                nodes::table(&rows, wide)
            })
        }
        Command::Claims {
            all_namespaces,
            output,
        } => {
            let inventory = Inventory::of(engine.state());
            let only = (!all_namespaces).then_some(namespace.as_str());
            let rows = claims::claims(engine.state(), &inventory, only);
            if rows.is_empty() && output.is_none_or(|o| o == Format::Wide) {
                let place = if all_namespaces {
                    String::new()
                } else {
                    format!(" in {namespace} namespace")
                };
                eprintln!("No resource claims found{place}.");
                return Ok(String::new());
            }
            print(&serde_json::json!({ "claims": rows }), output, |wide| {
                claims::table(&rows, all_namespaces, wide)
            })
        }
        Command::Why { pod, output, .. } => {
            let key = ObjectKey::new(namespace, pod);
            let answer = why::explain(&mut engine, &key, &groups.pdbs, &groups.pod_groups)
                .map_err(anyhow::Error::msg)?;
            print(&answer, output, |_| why::text(&answer))
        }
    }
}
