//! `dra-node-agent`: the binary. Parses flags, wires discovery, the publisher, the kubelet
//! plugin and the HTTP endpoints together, and stops them on SIGTERM/SIGINT.

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use dra_node_agent::backend::GpuBackend;
use dra_node_agent::backend::fake::FakeBackend;
use dra_node_agent::backend::nvml::NvmlBackend;
use dra_node_agent::claim::{ClaimRef, PlanContext, plan_claim};
use dra_node_agent::health::{DEFAULT_IGNORED_XIDS, HealthState};
use dra_node_agent::metrics::{Health, Metrics, router};
use dra_node_agent::plugin::{self, PluginConfig};
use dra_node_agent::prepare::{ClaimSource, Preparer, PreparerConfig};
use dra_node_agent::publisher::{Publisher, PublisherConfig};
use dra_node_agent::slices::{NodeRef, build_slices, pool_contents};
use k8s_openapi::api::resource::v1::ResourceClaim;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "dra-node-agent",
    version,
    about = "Publishes a node's NVIDIA GPUs as ResourceSlices and prepares allocated claims for containers (kubelet DRA plugin)"
)]
struct Cli {
    #[command(flatten)]
    opts: Opts,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent (the default).
    Run,
    /// Discover GPUs once and print the ResourceSlices that would be published (YAML);
    /// talks to no API server.
    Discover,
    /// Plan the preparation of a ResourceClaim read from a YAML file and print the devices
    /// and the CDI spec it would write; changes nothing.
    PrepareDryRun {
        /// A ResourceClaim (YAML or JSON) with status.allocation.
        #[arg(long)]
        claim: PathBuf,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    Nvml,
    Fake,
}

#[derive(Args)]
struct Opts {
    /// This node's name (the pool is named after it).
    #[arg(long, env = "NODE_NAME", global = true)]
    node_name: Option<String>,
    /// The DRA driver name.
    #[arg(long, default_value = "gpu.nvidia.com", global = true)]
    driver_name: String,
    /// Kubeconfig file; in-cluster configuration when absent.
    #[arg(long, env = "KUBECONFIG", global = true)]
    kubeconfig: Option<PathBuf>,
    /// Directory for the DRA socket and the checkpoint [default: /var/lib/kubelet/plugins/<driver>].
    #[arg(long, global = true)]
    plugin_dir: Option<PathBuf>,
    /// Kubelet's plugin registration directory.
    #[arg(
        long,
        default_value = "/var/lib/kubelet/plugins_registry",
        global = true
    )]
    registry_dir: PathBuf,
    /// Where CDI specs are written.
    #[arg(long, default_value = "/var/run/cdi", global = true)]
    cdi_dir: PathBuf,
    /// Where GPUs come from.
    #[arg(long, value_enum, default_value = "nvml", global = true)]
    backend: BackendKind,
    /// Where the host's NVIDIA driver files are mounted (the host's `/`, or the GPU
    /// Operator's driver root): `--backend nvml` loads libnvidia-ml.so.1 from its library
    /// folders, links followed inside it. Without it, or when it lacks the library, the
    /// dynamic loader's search path is used.
    #[arg(long, env = "NVIDIA_DRIVER_ROOT", global = true, value_name = "DIR")]
    driver_root: Option<PathBuf>,
    /// Profile for `--backend fake` (see profiles/*.yaml).
    #[arg(long, global = true)]
    fake_profile: Option<PathBuf>,
    /// Address for /metrics and /healthz.
    #[arg(long, default_value = "0.0.0.0:8080", global = true)]
    http_address: SocketAddr,
    /// XIDs that do not taint a GPU (application errors).
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_IGNORED_XIDS.to_vec(), global = true)]
    ignored_xids: Vec<u64>,
    /// The MPS control program, run once per claim that asks for MPS [default with
    /// `--backend nvml`: nvidia-cuda-mps-control; with `--backend fake`: none, MPS claims
    /// get the environment only].
    #[arg(long, global = true, value_name = "PATH")]
    mps_control_binary: Option<PathBuf>,
    /// Seconds between discoveries (GPUs appearing or vanishing).
    #[arg(long, default_value_t = 10, global = true)]
    rediscover_seconds: u64,
    /// Log format: text, or json (one object a line, one `message` key, fields such as
    /// `node` and `claim` as keys of their own). Logs go to stderr.
    #[arg(long, value_enum, default_value = "text", global = true)]
    log_format: LogFormat,
    /// Log verbosity, as kube components take it: 0-3 info (the default), 4 adds the
    /// agent's debug messages, 5 the libraries' debug messages, 6 everything. RUST_LOG,
    /// when set, wins.
    #[arg(long = "v", short = 'v', value_name = "LEVEL", global = true)]
    verbosity: Option<u8>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

impl Opts {
    fn plugin_dir(&self) -> PathBuf {
        self.plugin_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("/var/lib/kubelet/plugins").join(&self.driver_name))
    }

    fn node_name(&self) -> anyhow::Result<String> {
        self.node_name
            .clone()
            .filter(|n| !n.is_empty())
            .context("the node name is required: pass --node-name or set NODE_NAME")
    }

    fn backend(&self) -> anyhow::Result<Arc<dyn GpuBackend>> {
        Ok(match self.backend {
            BackendKind::Fake => {
                let path = self
                    .fake_profile
                    .as_ref()
                    .context("--backend fake needs --fake-profile FILE")?;
                Arc::new(FakeBackend::from_file(path)?)
            }
            BackendKind::Nvml => Arc::new(NvmlBackend::new(self.driver_root.as_deref()).map_err(|e| {
                anyhow::anyhow!("{e} (run on a node with the NVIDIA driver, or pass --backend fake --fake-profile FILE)")
            })?),
        })
    }

    async fn client(&self) -> anyhow::Result<kube::Client> {
        let config = match &self.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("reading kubeconfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
            }
            None => kube::Config::incluster().context(
                "no --kubeconfig and not running in a cluster (KUBERNETES_SERVICE_HOST unset)",
            )?,
        };
        Ok(kube::Client::try_from(config)?)
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let format = match cli.opts.log_format {
        LogFormat::Text => dra_telemetry::log::Format::Text,
        LogFormat::Json => dra_telemetry::log::Format::Json,
    };
    dra_telemetry::log::init(format, cli.opts.verbosity);
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let result = rt.block_on(async {
        match cli.command.unwrap_or(Command::Run) {
            Command::Run => run(cli.opts).await,
            Command::Discover => discover(cli.opts).await,
            Command::PrepareDryRun { claim } => prepare_dry_run(cli.opts, claim).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            dra_telemetry::log::fatal(format, &format!("{e:#}"));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn discover(opts: Opts) -> anyhow::Result<()> {
    let backend = opts.backend()?;
    let gpus = backend.discover()?;
    for g in &gpus {
        eprintln!(
            "{}: {} uuid={} bus={} numa={} memory={}B mig={}",
            g.device_name(),
            g.product_name,
            g.uuid,
            g.pci_bus_id,
            g.numa_node.map_or("unknown".into(), |n| n.to_string()),
            g.memory_bytes,
            match &g.mig {
                None => "unsupported".to_string(),
                Some(m) if m.enabled => format!("enabled ({} profiles)", m.profiles.len()),
                Some(_) => "disabled".to_string(),
            }
        );
    }
    let node = opts.node_name().unwrap_or_else(|_| "this-node".into());
    let slices = build_slices(
        &NodeRef {
            name: node,
            uid: "<node-uid>".into(),
        },
        &opts.driver_name,
        &pool_contents(&gpus, &HealthState::new(opts.ignored_xids.clone())),
        1,
    );
    print!("{}", dra_node_agent::slices::to_manifests(&slices));
    Ok(())
}

async fn prepare_dry_run(opts: Opts, claim_path: PathBuf) -> anyhow::Result<()> {
    let backend = opts.backend()?;
    let gpus = backend.discover()?;
    let text = std::fs::read_to_string(&claim_path)
        .with_context(|| format!("reading {}", claim_path.display()))?;
    let claim: ResourceClaim = serde_yaml::from_str(&text)
        .with_context(|| format!("parsing {} as a ResourceClaim", claim_path.display()))?;
    let want = ClaimRef {
        namespace: claim.metadata.namespace.clone().unwrap_or_default(),
        uid: claim.metadata.uid.clone().unwrap_or_default(),
        name: claim.metadata.name.clone().unwrap_or_default(),
    };
    // Without --node-name, act as the node the claim's devices were allocated on.
    let node = opts.node_name().ok().unwrap_or_else(|| {
        claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .and_then(|r| r.iter().find(|r| r.driver == opts.driver_name))
            .map(|r| r.pool.clone())
            .unwrap_or_default()
    });
    let mps_dir = opts.plugin_dir().join("mps").display().to_string();
    let plan = plan_claim(
        &claim,
        &want,
        &PlanContext {
            driver: &opts.driver_name,
            node: &node,
            gpus: &gpus,
            mps_dir: &mps_dir,
        },
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    let out = serde_json::json!({
        "devices": plan.devices,
        "sharing": plan.sharing,
        "cdiSpecFile": plan.spec.as_ref().map(|s| dra_node_agent::cdi::spec_path(&opts.cdi_dir, &s.kind, &want.uid)),
        "cdiSpec": plan.spec,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

async fn run(opts: Opts) -> anyhow::Result<()> {
    let node = opts.node_name()?;
    let backend = opts.backend()?;
    let client = opts.client().await?;
    let plugin_dir = opts.plugin_dir();
    let gpus = backend.discover()?;
    tracing::info!(backend = backend.name(), gpus = gpus.len(), node = %node, "discovered GPUs");
    let inventory = Arc::new(RwLock::new(gpus));

    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    let listener = tokio::net::TcpListener::bind(opts.http_address)
        .await
        .with_context(|| format!("listening on {}", opts.http_address))?;
    tracing::info!(address = %listener.local_addr()?, "serving /metrics and /healthz");
    let app = router(metrics.clone(), health.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "HTTP server stopped");
        }
    });

    let boot_id = dra_node_agent::checkpoint::read_boot_id().context("reading the boot id")?;
    let (preparer, recovery) = Preparer::open(
        PreparerConfig {
            driver: opts.driver_name.clone(),
            node: node.clone(),
            cdi_dir: opts.cdi_dir.clone(),
            checkpoint_path: plugin_dir.join("checkpoint.json"),
            mps_dir: plugin_dir.join("mps"),
            boot_id,
            mps_control: opts.mps_control_binary.clone().or_else(|| {
                matches!(opts.backend, BackendKind::Nvml).then(|| "nvidia-cuda-mps-control".into())
            }),
        },
        backend.clone(),
        ClaimSource::Api(client.clone()),
        inventory.clone(),
        Some(metrics.clone()),
    )?;
    tracing::info!(?recovery, "checkpoint loaded");
    let preparer = Arc::new(preparer);

    let (health_tx, health_rx) = tokio::sync::mpsc::unbounded_channel();
    backend.watch_health(health_tx)?;
    let (device_health_tx, device_health_rx) = tokio::sync::watch::channel(Vec::new());
    let publisher = Publisher::new(
        client,
        PublisherConfig {
            driver: opts.driver_name.clone(),
            node_name: node,
            rediscover_every: Duration::from_secs(opts.rediscover_seconds.max(1)),
        },
        backend,
        inventory,
        HealthState::new(opts.ignored_xids.clone()),
    )
    .with_metrics(metrics, health.clone())
    .with_device_health(device_health_tx);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let publisher_task = tokio::spawn(publisher.run(health_rx, async move {
        let mut rx = stop_rx;
        let _ = rx.wait_for(|s| *s).await;
    }));

    let plugin = plugin::start(
        &PluginConfig {
            driver: opts.driver_name.clone(),
            plugin_dir,
            registry_dir: opts.registry_dir.clone(),
        },
        preparer,
        device_health_rx,
    )
    .await?;
    health.plugin_serving.store(true, Ordering::Relaxed);

    shutdown_signal().await;
    tracing::info!("shutting down");
    health.plugin_serving.store(false, Ordering::Relaxed);
    plugin.stop().await;
    let _ = stop_tx.send(true);
    let _ = publisher_task.await;
    Ok(())
}
