//! A real Kubernetes 1.37 control plane for integration tests.
//!
//! [`TestCluster::shared`] starts one cluster per test binary the first time a test asks
//! for it: etcd, kube-apiserver and kube-controller-manager built from Go modules by
//! `tests/cluster/cluster.sh`, on loopback, in a fresh directory. A watcher process stops
//! the cluster and removes its directory when the test binary exits. Each test then takes
//! a fresh namespace with [`TestCluster::namespace`].
//!
//! [`TestCluster::with_node`] adds a real node (containerd and kubelet on this machine) to a
//! cluster of its own, for tests whose pods must run. That cluster lives in a network
//! namespace the script makes for it, so nothing it sends leaves the namespace:
//! [`TestCluster::kubectl`] and [`TestCluster::command`] run there, and in-process clients
//! reach its kube-apiserver through a relay on this machine's loopback.
//!
//! Nothing is skipped silently: if the control plane cannot be built or started, every test
//! that asks for it fails with the script's own message.
//!
//! ```no_run
//! # async fn f() {
//! let cluster = test_cluster::TestCluster::shared();
//! let ns = cluster.namespace("smoke").await;
//! let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = ns.api();
//! # }
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

mod promlint;
pub use promlint::promlint;

/// The Node name of [`TestCluster::with_node`]'s kubelet.
pub const NODE_NAME: &str = "node-1";
/// The address of [`TestCluster::with_node`]'s node (its InternalIP), in the cluster's own
/// network namespace: kubelet refuses a loopback node IP.
pub const NODE_ADDRESS: &str = "10.99.0.2";
/// An image on [`TestCluster::with_node`]'s node: Debian's static busybox, with its applets
/// in `/bin` and `sh` as its command (no entrypoint), as Docker Hub's busybox. Use `imagePullPolicy: Never` or `IfNotPresent`.
pub const BUSYBOX_IMAGE: &str = "localhost/dra-scheduler/busybox:test";
/// The node's sandbox (pause) image.
pub const PAUSE_IMAGE: &str = "localhost/dra-scheduler/pause:test";

/// A running control plane owned by this test process.
#[derive(Debug)]
pub struct TestCluster {
    dir: PathBuf,
    kubeconfig: PathBuf,
    bin: PathBuf,
    /// The network namespace the cluster lives in, if it has its own ([`Self::with_node`]).
    netns: Option<String>,
    /// For a cluster in its own network namespace: a port on this machine's loopback
    /// relayed to kube-apiserver in the namespace, for in-process clients.
    relay: OnceLock<u16>,
    /// A dedicated cluster is stopped when dropped; the shared one when the process exits.
    dedicated: bool,
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if self.dedicated {
            let _ = Command::new("bash")
                .arg(repo_root().join("tests/cluster/cluster.sh"))
                .arg("down")
                .arg(&self.dir)
                .output();
        }
    }
}

static SHARED: OnceLock<Result<TestCluster, String>> = OnceLock::new();

/// The repository root (this crate lives in `crates/test-cluster`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

impl TestCluster {
    /// The cluster of this test binary, started on first use.
    ///
    /// Panics (failing the test) with the reason when the control plane cannot start.
    pub fn shared() -> &'static TestCluster {
        match SHARED.get_or_init(|| Self::start(&[], false)) {
            Ok(cluster) => cluster,
            Err(reason) => panic!("the test control plane is not available: {reason}"),
        }
    }

    /// A cluster of its own, for a test that needs cluster-scoped objects no other test
    /// sees (or its own reference scheduler); stopped when dropped.
    ///
    /// Panics (failing the test) with the reason when the control plane cannot start.
    pub fn dedicated() -> TestCluster {
        Self::dedicated_with_runtime_config("")
    }

    /// A dedicated cluster whose kube-apiserver also gets these `--runtime-config` entries
    /// (comma-separated), e.g. `resource.k8s.io/v1/devicetaintrules=false` to serve only
    /// what an older Kubernetes release serves by default.
    pub fn dedicated_with_runtime_config(extra: &str) -> TestCluster {
        Self::dedicated_with(&[("DRA_CLUSTER_RUNTIME_CONFIG", extra)])
    }

    /// A dedicated cluster whose kube-apiserver also runs these admission plugins
    /// (comma-separated), e.g. `OwnerReferencesPermissionEnforcement`, which some
    /// distributions turn on.
    pub fn dedicated_with_admission_plugins(plugins: &str) -> TestCluster {
        Self::dedicated_with(&[("DRA_CLUSTER_ADMISSION_PLUGINS", plugins)])
    }

    /// A dedicated cluster whose kube-controller-manager has this client budget (queries
    /// per second, burst) instead of 200/400: for benchmarks, where making a claim from each
    /// pod's template must not be what limits the schedulers.
    pub fn dedicated_with_controller_budget(qps: u32, burst: u32) -> TestCluster {
        Self::dedicated_with(&[
            ("DRA_CLUSTER_KCM_QPS", &qps.to_string()),
            ("DRA_CLUSTER_KCM_BURST", &burst.to_string()),
        ])
    }

    /// A dedicated cluster started with `cluster.sh up`'s environment `env`.
    fn dedicated_with(env: &[(&str, &str)]) -> TestCluster {
        match Self::start(env, false) {
            Ok(mut cluster) => {
                cluster.dedicated = true;
                cluster
            }
            Err(reason) => panic!("the test control plane is not available: {reason}"),
        }
    }

    /// Starts a cluster (`cluster.sh up` with `env`), in a network namespace of its own
    /// when `netns`.
    fn start(env: &[(&str, &str)], netns: bool) -> Result<TestCluster, String> {
        static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let script = repo_root().join("tests/cluster/cluster.sh");
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("dra-test-cluster-{}-{n}", std::process::id());
        let dir = std::env::temp_dir().join(&name);
        let netns = netns.then_some(name);
        let out = Command::new("bash")
            .arg(&script)
            .arg("up")
            .arg(&dir)
            .env("DRA_CLUSTER_RUNTIME_CONFIG", "")
            .env("DRA_CLUSTER_ADMISSION_PLUGINS", "")
            .env("DRA_CLUSTER_NETNS", netns.as_deref().unwrap_or(""))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("could not run {}: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!(
                "`cluster.sh up` failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        // Stop the cluster when this process exits, however it exits.
        let reaper = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; exec bash {script} down {dir}",
            pid = std::process::id(),
            script = script.display(),
            dir = dir.display(),
        );
        Command::new("setsid")
            .args(["bash", "-c", &reaper])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("could not start the cluster reaper: {e}"))?;
        let bin = Command::new("bash")
            .arg(&script)
            .arg("bindir")
            .output()
            .map_err(|e| format!("could not run {}: {e}", script.display()))?;
        let bin = PathBuf::from(String::from_utf8_lossy(&bin.stdout).trim());
        Ok(TestCluster {
            kubeconfig: dir.join("admin.kubeconfig"),
            bin,
            dedicated: false,
            dir,
            netns,
            relay: OnceLock::new(),
        })
    }

    /// A cluster of its own with a real node on this machine: containerd and kubelet
    /// v1.37.2 (`cluster.sh node`), registered as Node [`NODE_NAME`]. Pods that name the
    /// node run for real; the images [`BUSYBOX_IMAGE`] and [`PAUSE_IMAGE`] are already on
    /// it. Without a CNI network the node stays NotReady, so pods use `hostNetwork: true`.
    /// Stopped when dropped, or by [`TestCluster::down`]. Meant for one node at a time on
    /// a machine: two would share kubelet's fixed device plugin socket.
    ///
    /// Panics (failing the test) with the reason when the node cannot start, naming what
    /// this machine lacks (root, runc, busybox-static, cgroups).
    pub fn with_node() -> TestCluster {
        let cluster = match Self::start(&[], true) {
            Ok(mut cluster) => {
                cluster.dedicated = true;
                cluster
            }
            Err(reason) => panic!("the test control plane is not available: {reason}"),
        };
        if let Err(reason) = cluster.script(&["node"]) {
            let logs = ["containerd", "kubelet"]
                .iter()
                .map(|name| {
                    let path = cluster.dir.join("logs").join(format!("{name}.log"));
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(20).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    format!("--- last lines of {}:\n{}", path.display(), tail.join("\n"))
                })
                .collect::<Vec<_>>()
                .join("\n");
            panic!("the test node is not available: `cluster.sh node` failed:\n{reason}\n{logs}");
        }
        cluster
    }

    /// Stop the cluster now (`cluster.sh down`): its processes, and for a node its
    /// containers, mounts, cgroups and sockets. Err carries the script's message.
    pub fn down(mut self) -> Result<(), String> {
        self.dedicated = false;
        let out = Command::new("bash")
            .arg(repo_root().join("tests/cluster/cluster.sh"))
            .arg("down")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "`cluster.sh down` failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// `ctr` against the node's containerd, in the namespace kubelet uses (`k8s.io`).
    pub fn ctr(&self) -> Command {
        let mut cmd = Command::new("bash");
        cmd.arg(repo_root().join("tests/cluster/cluster.sh"))
            .arg("ctr")
            .arg(&self.dir);
        cmd
    }

    /// The cluster's state directory (logs in `logs/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cluster-admin kubeconfig.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// A path to one of the built control-plane binaries (`kubectl`, `kube-scheduler`, ...).
    pub fn binary(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }

    /// A client config for cluster-admin (for a cluster in its own network namespace,
    /// through a relay on this machine's loopback).
    pub async fn config(&self) -> Config {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).expect("read admin kubeconfig");
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("admin kubeconfig is valid");
        if self.netns.is_some() {
            let port = *self.relay.get_or_init(|| self.start_relay());
            config.cluster_url = format!("https://127.0.0.1:{port}")
                .parse()
                .expect("relay URL");
        }
        config
    }

    /// The network namespace the cluster lives in, when it has its own.
    pub fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }

    /// A command that runs in the cluster's network namespace (or, for a cluster without
    /// one, as it is): anything that talks to the cluster's addresses.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        match &self.netns {
            None => Command::new(program),
            Some(netns) => {
                let mut cmd = Command::new("nsenter");
                cmd.arg(format!("--net=/var/run/netns/{netns}"))
                    .arg(program);
                cmd
            }
        }
    }

    /// Runs `f` on a thread in the cluster's network namespace (here, for a cluster without
    /// one): sockets it opens or binds belong to that namespace and can be used from any
    /// thread.
    pub fn in_netns<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.spawn_in_netns(f)
            .join()
            .expect("thread in the cluster's network namespace")
    }

    /// Starts a thread in the cluster's network namespace (for a cluster without one, an
    /// ordinary thread).
    pub fn spawn_in_netns<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let netns = self.netns.clone();
        std::thread::spawn(move || {
            if let Some(netns) = netns {
                enter_netns(&netns);
            }
            f()
        })
    }

    /// A TCP connection to `port` on the loopback of the cluster's network namespace.
    pub fn connect(&self, port: u16) -> std::io::Result<std::net::TcpStream> {
        self.in_netns(move || std::net::TcpStream::connect(("127.0.0.1", port)))
    }

    /// Relays a port on this machine's loopback to kube-apiserver in the cluster's network
    /// namespace; returns the port. The relay lives as long as the test process.
    fn start_relay(&self) -> u16 {
        let api_port: u16 = std::fs::read_to_string(self.dir.join("apiserver.port"))
            .expect("apiserver.port")
            .trim()
            .parse()
            .expect("a port number");
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind the relay");
        let port = listener.local_addr().expect("relay address").port();
        let netns = self.netns.clone().expect("a network namespace");
        std::thread::spawn(move || {
            for inbound in listener.incoming().flatten() {
                let netns = netns.clone();
                std::thread::spawn(move || {
                    enter_netns(&netns);
                    let Ok(outbound) = std::net::TcpStream::connect(("127.0.0.1", api_port)) else {
                        return;
                    };
                    pipe(inbound, outbound);
                });
            }
        });
        port
    }

    /// A new cluster-admin client. Make one per test: a client lives on the runtime that
    /// made it, and every `#[tokio::test]` has its own runtime.
    pub async fn client(&self) -> Client {
        Client::try_from(self.config().await).expect("build kube client")
    }

    /// `kubectl` pointed at this cluster (in its network namespace, if it has one).
    pub fn kubectl(&self) -> Command {
        let mut cmd = self.command(self.binary("kubectl"));
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        cmd
    }

    /// Start the reference kube-scheduler 1.37 for pods whose `schedulerName` is
    /// `scheduler_name`. Call it once per cluster.
    pub fn start_reference_scheduler(&self, scheduler_name: &str) -> Result<(), String> {
        self.script(&["scheduler", scheduler_name]).map(|_| ())
    }

    /// [`Self::start_reference_scheduler`] with this client budget (`clientConnection`'s
    /// `qps` and `burst`) instead of the default 100 and 200.
    pub fn start_reference_scheduler_with_budget(
        &self,
        scheduler_name: &str,
        qps: u32,
        burst: u32,
    ) -> Result<(), String> {
        let env = [
            ("DRA_SCHEDULER_QPS", qps.to_string()),
            ("DRA_SCHEDULER_BURST", burst.to_string()),
        ];
        self.script_with(&["scheduler", scheduler_name], &env)
            .map(|_| ())
    }

    /// The process id of a control-plane component this cluster started (`etcd`,
    /// `kube-apiserver`, `kube-controller-manager`, `kube-scheduler`), while it runs: for
    /// reading its CPU time and memory in `/proc`.
    pub fn pid(&self, component: &str) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.dir.join("pids").join(component))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
    }

    /// A kubeconfig for a new user `name` with no rights but what RBAC grants that user.
    pub fn user_kubeconfig(&self, name: &str) -> Result<PathBuf, String> {
        self.script(&["user", name])
            .map(|out| PathBuf::from(out.trim()))
    }

    /// Stop kube-apiserver, wait `pause_seconds`, and start it again on the same state;
    /// returns once it is ready.
    pub fn restart_apiserver(&self, pause_seconds: u32) -> Result<(), String> {
        self.script(&["restart-apiserver", &pause_seconds.to_string()])
            .map(|_| ())
    }

    /// Runs `cluster.sh COMMAND DIR ARGS...`; its standard output, or its error output.
    fn script(&self, args: &[&str]) -> Result<String, String> {
        self.script_with(args, &[])
    }

    /// [`Self::script`] with more environment for the script.
    fn script_with(&self, args: &[&str], env: &[(&str, String)]) -> Result<String, String> {
        let out = Command::new("bash")
            .arg(repo_root().join("tests/cluster/cluster.sh"))
            .arg(args[0])
            .arg(&self.dir)
            .args(&args[1..])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// A fresh namespace for one test, named after `prefix`.
    pub async fn namespace(&self, prefix: &str) -> TestNamespace {
        let client = self.client().await;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                generate_name: Some(format!("{prefix}-")),
                ..Default::default()
            },
            ..Default::default()
        };
        let created = namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("create namespace {prefix}-*: {e}"));
        TestNamespace {
            name: created.metadata.name.expect("generated namespace name"),
            client,
        }
    }
}

/// A namespace that belongs to one test, with a client for it.
#[derive(Clone)]
pub struct TestNamespace {
    pub name: String,
    pub client: Client,
}

impl TestNamespace {
    /// An `Api` for a namespaced kind in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// An `Api` for a cluster-scoped kind.
    pub fn cluster_api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::all(self.client.clone())
    }
}

/// The API server's own message for a rejected request, or the error as text.
pub fn server_message(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => {
            format!("{} ({}): {}", status.reason, status.code, status.message)
        }
        other => other.to_string(),
    }
}

/// A TCP port on 127.0.0.1 that is free now (for a daemon's metrics address).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
}

/// Poll `check` until it returns `Some`, for at most `seconds`; panics naming `what` if not.
pub async fn eventually<T, F, Fut>(what: &str, seconds: u64, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(seconds);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {seconds}s waiting for {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Moves the calling thread into network namespace `name` (`/var/run/netns/NAME`).
fn enter_netns(name: &str) {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(format!("/var/run/netns/{name}"))
        .unwrap_or_else(|e| panic!("open network namespace {name}: {e}"));
    // SAFETY: setns on a valid namespace file descriptor only changes this thread's
    // network namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(
        rc,
        0,
        "enter network namespace {name}: {}",
        std::io::Error::last_os_error()
    );
}

/// Copies bytes both ways between two connections until each side closes.
fn pipe(a: std::net::TcpStream, b: std::net::TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    for (mut from, mut to) in [(a, b2), (b, a2)] {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(std::net::Shutdown::Write);
        });
    }
}
