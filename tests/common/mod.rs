//! Helpers shared by the live tests: a `dra-scheduler run` process and a synthetic fleet.
#![allow(dead_code)]

use std::collections::HashSet;
use std::process::{Child, Command, Stdio};

use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::ListParams;
use test_cluster::{TestCluster, eventually, free_port};

/// A scheduler process, stopped (SIGKILL) when dropped.
pub struct Daemon {
    pub child: Child,
    /// Base URL of its /metrics, /healthz and /readyz.
    pub metrics: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start_scheduler_with(cluster: &TestCluster, extra: &[&str]) -> Daemon {
    start_scheduler_as(cluster.kubeconfig_path(), extra)
}

/// A scheduler that talks to the API server with `kubeconfig` (another identity than
/// cluster-admin). Its log (stderr) is the test's, at warn unless RUST_LOG says otherwise:
/// a line per scheduling decision would bury a failure's message.
pub fn start_scheduler_as(kubeconfig: &std::path::Path, extra: &[&str]) -> Daemon {
    let rust_log = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into());
    spawn_scheduler(kubeconfig, extra, Stdio::inherit(), &rust_log)
}

/// A scheduler whose whole log, at the default level, goes to the file `log`.
pub fn start_scheduler_logging_to(
    cluster: &TestCluster,
    log: &std::path::Path,
    extra: &[&str],
) -> Daemon {
    let file = std::fs::File::create(log).expect("create the scheduler's log file");
    spawn_scheduler(cluster.kubeconfig_path(), extra, file.into(), "")
}

fn spawn_scheduler(
    kubeconfig: &std::path::Path,
    extra: &[&str],
    stderr: Stdio,
    rust_log: &str,
) -> Daemon {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_dra-scheduler"))
        .args(["run", "--kubeconfig"])
        .arg(kubeconfig)
        .args(["--metrics-bind-address", &format!("127.0.0.1:{port}")])
        .args(extra)
        .env("RUST_LOG", rust_log)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start dra-scheduler run");
    Daemon {
        child,
        metrics: format!("http://127.0.0.1:{port}"),
    }
}

/// Every line of a JSON log, parsed; each must be one JSON object with exactly one
/// `message` key. The key is also counted in the raw text, because a parser keeps one of
/// two duplicate keys without a word.
pub fn json_log(text: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
    text.lines()
        .map(|line| {
            let object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON object ({e}): {line}"));
            assert_eq!(
                line.matches("\"message\":").count(),
                1,
                "one message key: {line}"
            );
            assert!(object["message"].is_string(), "{line}");
            for key in ["timestamp", "level", "target"] {
                assert!(object.contains_key(key), "{key} missing: {line}");
            }
            object
        })
        .collect()
}

pub fn kubectl_apply_text(cluster: &TestCluster, name: &str, text: &[u8]) {
    // One folder per call: the tests of one binary run at once and may apply the same name.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("apply-{}-{call}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, text).unwrap();
    let out = cluster
        .kubectl()
        .args(["apply", "-f"])
        .arg(&file)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        out.status.success(),
        "kubectl apply {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fleet of `nodes` x `gpus` from `generate-fleet` (with its class and templates).
pub fn apply_fleet(cluster: &TestCluster, nodes: usize, gpus: usize) {
    let out = Command::new(env!("CARGO_BIN_EXE_dra-scheduler"))
        .args(["generate-fleet", "--nodes", &nodes.to_string()])
        .args(["--gpus", &gpus.to_string(), "--pods", "0"])
        .output()
        .unwrap();
    assert!(out.status.success());
    kubectl_apply_text(cluster, "fleet", &out.stdout);
}

/// A Deployment `burst` of `replicas` pods for `scheduler`, each wanting one GPU.
pub fn apply_burst(cluster: &TestCluster, replicas: usize, scheduler: &str) {
    let workload = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: burst}}\nspec:\n  replicas: {replicas}\n  \
         selector: {{matchLabels: {{app: burst}}}}\n  template:\n    metadata: {{labels: {{app: burst}}}}\n    \
         spec:\n      schedulerName: {scheduler}\n      resourceClaims: [{{name: gpu, resourceClaimTemplateName: one-gpu}}]\n      \
         containers: [{{name: c, image: busybox, resources: {{claims: [{{name: gpu}}]}}}}]\n"
    );
    kubectl_apply_text(cluster, "burst", workload.as_bytes());
}

pub fn apply_fleet_and_burst(cluster: &TestCluster, nodes: usize, gpus: usize, replicas: usize) {
    apply_fleet(cluster, nodes, gpus);
    apply_burst(cluster, replicas, "dra-scheduler");
}

pub fn apply(cluster: &TestCluster, paths: &[&str]) {
    let mut cmd = cluster.kubectl();
    cmd.arg("apply");
    for p in paths {
        cmd.arg("-f")
            .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(p));
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn kubectl_ok(cluster: &TestCluster, args: &[&str]) {
    let out = cluster.kubectl().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

pub fn devices(claim: &ResourceClaim) -> Vec<(String, String)> {
    claim
        .status
        .iter()
        .flat_map(|s| s.allocation.iter())
        .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
        .map(|r| {
            (
                r.request.clone(),
                format!("{}/{}/{}", r.driver, r.pool, r.device),
            )
        })
        .collect()
}

pub async fn wait_bound(pods: &Api<Pod>, n: usize) -> Vec<Pod> {
    eventually(&format!("{n} pods bound"), 120, || async {
        let list = pods.list(&ListParams::default()).await.ok()?.items;
        (list.iter().filter(|p| node_of(p).is_some()).count() >= n).then_some(list)
    })
    .await
}

pub async fn scrape(url: &str) -> Option<String> {
    get(url, "/metrics")
        .filter(|(code, _)| *code == 200)
        .map(|(_, body)| body)
}

/// `GET base/path`: the HTTP status and the body, if anything answered.
pub fn get(base: &str, path: &str) -> Option<(u16, String)> {
    let out = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", &format!("{base}{path}")])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n')?;
    let code: u16 = code.trim().parse().ok()?;
    (code != 0).then(|| (code, body.to_string()))
}

pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} not found"))
}

/// Every allocated device appears once; returns how many there are.
pub async fn assert_no_device_twice(client: &kube::Client) -> usize {
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut seen = HashSet::new();
    for claim in &claims {
        for (_, device) in devices(claim) {
            assert!(seen.insert(device.clone()), "{device} is allocated twice");
        }
    }
    seen.len()
}

/// Events about one object, as "reason: message".
pub async fn events_about(client: &kube::Client, name: &str) -> Vec<String> {
    Api::<Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect()
}

/// The `dra_scheduler_leader` gauge of a replica, if it answers.
pub async fn leader_of(daemon: &Daemon) -> Option<f64> {
    scrape(&daemon.metrics)
        .await
        .map(|text| metric(&text, "dra_scheduler_leader"))
}

/// Every claim in `default` agrees with its pod: a claim made for a bound pod (of `pods`)
/// is allocated and reserved, by UID, for that pod alone; the claim of a pending pod holds
/// no devices and no reservation. Returns the bound pods whose claims were checked.
pub async fn assert_claims_agree_with_pods(client: &kube::Client, pods: &[Pod]) -> usize {
    let bound: std::collections::HashMap<String, String> = pods
        .iter()
        .filter(|p| node_of(p).is_some())
        .map(|p| {
            let meta = &p.metadata;
            (meta.name.clone().unwrap(), meta.uid.clone().unwrap())
        })
        .collect();
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut users = HashSet::new();
    for claim in &claims {
        let owner = claim
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == "Pod")
            .map(|o| o.name.clone())
            .unwrap_or_default();
        let status = claim.status.clone().unwrap_or_default();
        let reserved = status.reserved_for.unwrap_or_default();
        match bound.get(&owner) {
            Some(uid) => {
                assert!(
                    status.allocation.is_some(),
                    "claim of bound pod {owner} is allocated"
                );
                assert_eq!(reserved.len(), 1, "claim of {owner}: {reserved:?}");
                assert_eq!((&reserved[0].name, &reserved[0].uid), (&owner, uid));
                users.insert(owner);
            }
            None => assert!(
                status.allocation.is_none() && reserved.is_empty(),
                "claim of pending pod {owner} holds {:?} for {reserved:?}",
                status.allocation
            ),
        }
    }
    users.len()
}

/// The repository root.
pub fn repo() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Run a command to success (no stdin) and return its output; a failure panics with the
/// command, its status and both outputs.
pub fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `helm`, built from Go modules by `tests/chart/build-helm.sh` on first use (the script
/// keeps a built one), with its config, cache and data in a folder of this test process so
/// that nothing of the user's Helm setup (repositories, plugins) plays a part.
pub fn helm() -> Command {
    static HELM: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let binary = HELM.get_or_init(|| {
        let out = run(Command::new("bash").arg(repo().join("tests/chart/build-helm.sh")));
        std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    });
    let home = std::env::temp_dir().join(format!("dra-test-helm-{}", std::process::id()));
    let mut cmd = Command::new(binary);
    cmd.env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .stdin(Stdio::null());
    cmd
}

/// A kubeconfig at `path` for the same cluster as the kubeconfig `admin`, whose user is
/// `token` (a ServiceAccount's, from `kubectl create token`).
pub fn token_kubeconfig(admin: &std::path::Path, token: &str, path: &std::path::Path) {
    let text = std::fs::read_to_string(admin).unwrap();
    let mut kc: serde_json::Value = serde_yaml::from_str(&text).unwrap();
    kc["users"] = serde_json::json!([{"name": "token", "user": {"token": token}}]);
    for ctx in kc["contexts"].as_array_mut().unwrap() {
        ctx["context"]["user"] = serde_json::json!("token");
    }
    std::fs::write(path, serde_json::to_vec_pretty(&kc).unwrap()).unwrap();
}

/// Write every claim `sim` allocated, with that allocation as its status, to a fresh
/// namespace of the real API server: it must accept each one (`case` names the run in the
/// panic). Returns how many were written.
pub async fn api_server_accepts_allocations(
    cluster: &TestCluster,
    sim: &dra_scheduler::simulate::Simulation,
    case: &str,
) -> usize {
    use kube::api::{ObjectMeta, PostParams};
    let scratch = cluster.namespace("sim-allocations").await;
    let claims: Api<ResourceClaim> = scratch.api();
    let mut written = 0;
    for (key, claim) in sim.engine.state().claims.iter() {
        let Some(mut status) = claim.status.clone().filter(|s| s.allocation.is_some()) else {
            continue;
        };
        // simulate's pods have no UIDs; the API requires one per consumer.
        for (i, consumer) in status.reserved_for.iter_mut().flatten().enumerate() {
            consumer.uid = format!("00000000-0000-0000-0000-{i:012}");
        }
        let copy = ResourceClaim {
            metadata: ObjectMeta {
                name: Some(key.name.clone()),
                ..Default::default()
            },
            spec: claim.spec.clone(),
            status: None,
        };
        let mut created = claims
            .create(&PostParams::default(), &copy)
            .await
            .unwrap_or_else(|e| {
                panic!("{case}: claim {key}: {}", test_cluster::server_message(&e))
            });
        created.status = Some(status);
        claims
            .replace_status(&key.name, &PostParams::default(), &created)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{case}: the API server rejects simulate's allocation of {key}: {}",
                    test_cluster::server_message(&e)
                )
            });
        written += 1;
    }
    written
}
