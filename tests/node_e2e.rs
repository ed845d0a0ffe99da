//! The whole path on a real node, done as a user would (`cluster.sh node`: containerd 2.4.2
//! and kubelet v1.37.2 on this machine):
//! - both images built with `images/build-local.sh` and imported into the node's containerd;
//! - `helm install dra-scheduler charts/dra-scheduler -n kube-system` with the chart's default
//!   (local) image references and the node agent on the fake backend (`1x-a5000-2x-t10`);
//! - the scheduler pods Ready through their probes, one of them holding the Lease; the
//!   agent's DaemonSet pod Ready, registered with kubelet, the node's ResourceSlices
//!   published;
//! - a user Deployment (`schedulerName: dra-scheduler`, a claim template "an A5000, else a
//!   T10") placed by the in-cluster scheduler, prepared by kubelet through the agent (CDI spec,
//!   checkpoint entry), its container's log showing the injected environment and device
//!   nodes; deleting the pod unprepares it, the claim goes, the next pod gets the device;
//! - one owner per device (issue 47): two claims whose allocations both name the A5000
//!   (written as the scheduler's ServiceAccount), for two pods bound to the node: the agent
//!   prepares the first and refuses the second, kubelet reports the refusal (naming the
//!   first claim) on the second pod and retries, and prepares it once the first pod is gone;
//! - faults, each followed by a check that no claim, device, CDI spec or checkpoint entry is
//!   lost or doubled: kubelet SIGKILLed and restarted while pods run, the agent pod killed,
//!   the scheduler leader pod killed, containerd restarted;
//! - `/metrics` of the in-cluster leader (through `kubectl port-forward`) counts allocations;
//! - the seed's rollout gotcha (issue #18), with kubelet terminating the old pods: the
//!   replacement of a `kubectl rollout restart` waits for the A5000 and gets it; opted out,
//!   it takes the T10, is reported degraded (gauge, condition) and the upgrade moves it to
//!   the A5000; kube-scheduler's replacement is refused the GPU in the chart's ownership
//!   mode (the API server's message in its events) and, in shared mode, gets the T10; an
//!   old pod that ignores SIGTERM
//!   for 600 s is waited for until the bound, then the replacement takes the T10.
//!
//! What the test cluster lacks that a user's cluster has, the test supplies, and says so:
//! - a pod network: a CNI `bridge` network (Debian's containernetworking-plugins) on a bridge
//!   the test makes, 10.244.0.0/24, inside the network namespace the whole cluster lives in
//!   (`TestCluster::with_node`): nothing the pods send leaves it;
//! - kube-proxy: the `kubernetes` Service's address 10.0.0.1:443 is put on that bridge and a
//!   TCP relay in this test (a thread in that namespace) forwards it to kube-apiserver on the
//!   namespace's loopback, so pods' in-cluster config works;
//! - a kube-scheduler for the chart's own pods (cluster.sh's reference scheduler as
//!   `default-scheduler`);
//! - GPU device files: /dev/nvidia0..2, nvidiactl, nvidia-uvm(-tools) made as copies of
//!   /dev/null, since containerd stats every CDI device node.
//!
//! Everything the test adds outside the cluster's folder and namespace is removed when it
//! ends. The two tests each start a node; they run one at a time.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use test_cluster::{BUSYBOX_IMAGE, NODE_NAME, TestCluster};

mod common;
use common::{repo, run};

const DRIVER: &str = "gpu.nvidia.com";
const PROFILE: &str = "/usr/share/dra-node-agent/profiles/1x-a5000-2x-t10.yaml";
const A5000_UUID: &str = "GPU-9a8b7c6d-a5000-0000-0000-000000000000";
const T10_UUIDS: [&str; 2] = [
    "GPU-1b2c3d4e-t10-0000-0000-000000000001",
    "GPU-1b2c3d4e-t10-0000-0000-000000000002",
];
const BRIDGE: &str = "dra-e2e0";
const SUBNET_GATEWAY: &str = "10.244.0.1";
/// The `kubernetes` Service's ClusterIP (first address of cluster.sh's service range).
const SERVICE_IP: &str = "10.0.0.1";
const CDI_DIR: &str = "/var/run/cdi";
const DEVICE_FILES: [&str; 6] = [
    "/dev/nvidia0",
    "/dev/nvidia1",
    "/dev/nvidia2",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
];
const NS: &str = "inference";

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Poll `check` every half second until it returns `Some`, for at most `seconds`.
fn wait<T>(what: &str, seconds: u64, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {seconds}s waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// What the test adds to the machine outside the cluster's folder; removed on drop (after
/// the cluster, which is declared later, is down).
#[derive(Default)]
struct HostAdditions {
    device_files: Vec<&'static str>,
    cdi_dir_made: bool,
    relay_stop: Option<Arc<AtomicBool>>,
}

impl Drop for HostAdditions {
    fn drop(&mut self) {
        if let Some(stop) = &self.relay_stop {
            stop.store(true, Ordering::SeqCst);
        }
        for f in &self.device_files {
            let _ = std::fs::remove_file(f);
        }
        if self.cdi_dir_made {
            let _ = std::fs::remove_dir(CDI_DIR);
        }
    }
}

impl HostAdditions {
    fn make_device_files(&mut self) {
        for f in DEVICE_FILES {
            assert!(
                !Path::new(f).exists(),
                "{f} exists: this machine has an NVIDIA driver; the test makes stand-ins"
            );
            run(Command::new("mknod").args(["-m", "666", f, "c", "1", "3"]));
            self.device_files.push(f);
        }
        self.cdi_dir_made = !Path::new(CDI_DIR).exists();
    }

    /// A CNI bridge network for the node, and the `kubernetes` Service address relayed to
    /// kube-apiserver on loopback, all in the cluster's own network namespace (deleted
    /// with the cluster).
    fn pod_network(&mut self, cluster: &TestCluster, node_dir: &Path, api_port: u16) {
        assert!(
            cluster.netns().is_some(),
            "the node's cluster has its own network namespace"
        );
        let ip = || cluster.command("ip");
        assert!(
            Path::new("/usr/lib/cni/bridge").exists()
                && Path::new("/usr/lib/cni/host-local").exists(),
            "/usr/lib/cni/bridge and host-local are missing: apt-get install containernetworking-plugins"
        );
        // A fixed MAC: a bridge without one takes the lowest MAC of its ports, so it
        // changes as pods come and go, and the pods' cached neighbour entry for the gateway
        // goes stale: their traffic to the API server stalls for seconds (CI runs saw the
        // leader's Lease renewals and its events hang right after pods were replaced).
        run(ip().args([
            "link",
            "add",
            BRIDGE,
            "address",
            "02:00:0a:f4:00:01",
            "type",
            "bridge",
        ]));
        run(ip().args([
            "addr",
            "add",
            &format!("{SUBNET_GATEWAY}/24"),
            "dev",
            BRIDGE,
        ]));
        run(ip().args(["addr", "add", &format!("{SERVICE_IP}/32"), "dev", BRIDGE]));
        run(ip().args(["link", "set", BRIDGE, "up"]));
        let cni = node_dir.join("cni");
        std::os::unix::fs::symlink("/usr/lib/cni", cni.join("bin")).expect("link CNI plugins");
        let conf = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "dra-e2e",
            "plugins": [{
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": false,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "dataDir": cni.join("ipam"),
                    "ranges": [[{"subnet": "10.244.0.0/24", "gateway": SUBNET_GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }, {"type": "loopback"}],
        });
        std::fs::write(cni.join("net.d/10-dra-e2e.conflist"), conf.to_string()).unwrap();

        let stop = Arc::new(AtomicBool::new(false));
        self.relay_stop = Some(stop.clone());
        // The relay's thread lives in the cluster's namespace: the Service address it binds
        // and kube-apiserver's loopback it connects to are both there.
        cluster.spawn_in_netns(move || {
            let listener = TcpListener::bind((SERVICE_IP, 443)).expect("bind the Service address");
            listener.set_nonblocking(true).unwrap();
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((inbound, _)) => {
                        inbound.set_nonblocking(false).unwrap();
                        let Ok(outbound) = TcpStream::connect(("127.0.0.1", api_port)) else {
                            continue;
                        };
                        for (mut from, mut to) in [
                            (inbound.try_clone().unwrap(), outbound.try_clone().unwrap()),
                            (outbound, inbound),
                        ] {
                            std::thread::spawn(move || {
                                let _ = std::io::copy(&mut from, &mut to);
                                let _ = to.shutdown(std::net::Shutdown::Write);
                            });
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
    }
}

/// The test build's binaries, with dra-node-agent built next to them if it is not.
fn binaries_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_dra-scheduler"))
        .parent()
        .unwrap()
        .to_path_buf();
    if !dir.join("dra-node-agent").exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "dra-node-agent"]);
        if dir.ends_with("release") {
            cmd.arg("--release");
        }
        run(cmd.current_dir(repo()));
    }
    dir
}

fn helm_binary() -> PathBuf {
    let out = run(Command::new("bash").arg(repo().join("tests/chart/build-helm.sh")));
    PathBuf::from(text(&out).trim())
}

/// A node's ResourceSlices by name: resourceVersion, and (device, product) pairs.
type Slices = BTreeMap<String, (String, Vec<(String, String)>)>;

struct Kube<'a> {
    cluster: &'a TestCluster,
}

impl Kube<'_> {
    fn try_run(&self, args: &[&str]) -> Result<String, String> {
        let out = self
            .cluster
            .kubectl()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run kubectl");
        if out.status.success() {
            Ok(text(&out))
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    fn run(&self, args: &[&str]) -> String {
        self.try_run(args)
            .unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"))
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        serde_json::from_str(&self.run(&args)).expect("kubectl JSON")
    }

    fn items(&self, args: &[&str]) -> Vec<Value> {
        self.json(args)["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Merge-patches the status of ResourceClaim `namespace/name` as `user` (impersonated)
    /// with one PATCH, as a scheduler writes an allocation (`kubectl patch` would read the
    /// status first, which a scheduler's role need not allow); the claim as written.
    fn patch_claim_status_as(
        &self,
        user: &str,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Value {
        use k8s_openapi::api::resource::v1::ResourceClaim;
        use kube::api::{Api, Patch, PatchParams};
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let claim = runtime.block_on(async {
            let mut config = self.cluster.config().await;
            config.auth_info.impersonate = Some(user.to_string());
            let claims: Api<ResourceClaim> =
                Api::namespaced(kube::Client::try_from(config).unwrap(), namespace);
            claims
                .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
                .await
        });
        let claim = claim
            .unwrap_or_else(|e| panic!("patch the status of {namespace}/{name} as {user}: {e}"));
        serde_json::to_value(claim).unwrap()
    }

    fn apply(&self, manifest: &str) {
        let mut child = self
            .cluster
            .kubectl()
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl apply");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(manifest.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kubectl apply: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn name(obj: &Value) -> String {
    obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    }) && pod["metadata"]["deletionTimestamp"].is_null()
}

/// A user pod as seen for the checks: its claim and what it got.
#[derive(Debug, Clone, PartialEq)]
struct Placed {
    pod: String,
    container_id: String,
    restarts: i64,
    claim: String,
    claim_uid: String,
    device: String,
}

/// The node's state for "nothing lost or doubled".
#[derive(Debug, Clone, PartialEq)]
struct NodeState {
    placed: Vec<Placed>,
    /// Claim UID -> (state, devices) from the agent's checkpoint.
    checkpoint: BTreeMap<String, (String, Vec<String>)>,
    /// Claim UID -> the CDI spec file's contents.
    cdi_specs: BTreeMap<String, String>,
}

struct E2e<'a> {
    kube: Kube<'a>,
    node_dir: PathBuf,
}

impl E2e<'_> {
    fn user_pods(&self) -> Vec<Value> {
        self.kube
            .items(&["-n", NS, "get", "pods", "-l", "app=inference"])
            .into_iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .collect()
    }

    fn claims(&self) -> Vec<Value> {
        self.kube.items(&["-n", NS, "get", "resourceclaims"])
    }

    fn checkpoint(&self) -> BTreeMap<String, (String, Vec<String>)> {
        let path = self
            .node_dir
            .join("kubelet/plugins")
            .join(DRIVER)
            .join("checkpoint.json");
        let Ok(bytes) = std::fs::read(&path) else {
            return BTreeMap::new();
        };
        let v: Value = serde_json::from_slice(&bytes).expect("checkpoint JSON");
        v["data"]["claims"]
            .as_object()
            .map(|claims| {
                claims
                    .iter()
                    .map(|(uid, e)| {
                        let devices = e["devices"]
                            .as_array()
                            .map(|ds| {
                                ds.iter()
                                    .map(|d| d["deviceName"].as_str().unwrap_or("").to_string())
                                    .collect()
                            })
                            .unwrap_or_default();
                        (
                            uid.clone(),
                            (e["state"].as_str().unwrap_or("").to_string(), devices),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn cdi_specs(&self) -> BTreeMap<String, String> {
        let mut specs = BTreeMap::new();
        for entry in std::fs::read_dir(CDI_DIR).into_iter().flatten().flatten() {
            let file = entry.file_name().to_string_lossy().into_owned();
            if let Some(uid) = file
                .strip_suffix(".json")
                .and_then(|f| f.rsplit('_').next())
            {
                specs.insert(
                    uid.to_string(),
                    std::fs::read_to_string(entry.path()).unwrap_or_default(),
                );
            }
        }
        specs
    }

    /// The Running user pods with their claims, once every one is Running and allocated.
    fn placed(&self, want: usize) -> Option<Vec<Placed>> {
        let pods = self.user_pods();
        if pods.len() != want {
            return None;
        }
        let claims = self.claims();
        let mut placed = Vec::new();
        for pod in &pods {
            if pod["status"]["phase"] != "Running" || pod["spec"]["nodeName"] != NODE_NAME {
                return None;
            }
            let status = &pod["status"]["containerStatuses"][0];
            let claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
                .as_str()?
                .to_string();
            let claim = claims.iter().find(|c| name(c) == claim_name)?;
            let results = claim["status"]["allocation"]["devices"]["results"].as_array()?;
            assert_eq!(results.len(), 1, "claim {claim_name}: {results:?}");
            placed.push(Placed {
                pod: name(pod),
                container_id: status["containerID"].as_str()?.to_string(),
                restarts: status["restartCount"].as_i64()?,
                claim: claim_name,
                claim_uid: claim["metadata"]["uid"].as_str()?.to_string(),
                device: results[0]["device"].as_str()?.to_string(),
            });
        }
        placed.sort_by(|a, b| a.device.cmp(&b.device));
        Some(placed)
    }

    /// Waits for `want` Running user pods, each prepared, and checks nothing is lost or
    /// doubled: one device per claim and no device twice, one Prepared checkpoint entry and
    /// one CDI spec per claim, and nothing for a claim that is gone.
    fn settled(&self, what: &str, want: usize) -> NodeState {
        let state = wait(what, 180, || {
            let placed = self.placed(want)?;
            let state = NodeState {
                checkpoint: self.checkpoint(),
                cdi_specs: self.cdi_specs(),
                placed,
            };
            let uids: BTreeSet<&str> = state.placed.iter().map(|p| p.claim_uid.as_str()).collect();
            (state
                .checkpoint
                .keys()
                .map(String::as_str)
                .collect::<BTreeSet<_>>()
                == uids
                && state
                    .cdi_specs
                    .keys()
                    .map(String::as_str)
                    .collect::<BTreeSet<_>>()
                    == uids)
                .then_some(state)
        });
        let devices: BTreeSet<&str> = state.placed.iter().map(|p| p.device.as_str()).collect();
        assert_eq!(
            devices.len(),
            want,
            "a device given twice: {:#?}",
            state.placed
        );
        for p in &state.placed {
            let (entry_state, devices) = &state.checkpoint[&p.claim_uid];
            assert_eq!(entry_state, "Prepared", "{p:?}: {:?}", state.checkpoint);
            assert_eq!(devices, &vec![p.device.clone()], "{p:?}");
        }
        let claims = self.claims();
        assert_eq!(
            claims.len(),
            want,
            "claims left behind or missing: {claims:#?}"
        );
        println!(
            "fault check [{what}]: {want} pods Running, devices {:?}, {} checkpoint entries (all prepared), {} CDI specs, {} claims: nothing lost or doubled",
            state
                .placed
                .iter()
                .map(|p| format!("{}={}", p.pod, p.device))
                .collect::<Vec<_>>(),
            state.checkpoint.len(),
            state.cdi_specs.len(),
            claims.len(),
        );
        state
    }

    /// The container's log once it has printed its devices.
    fn log(&self, pod: &str) -> String {
        wait(&format!("the log of {pod}"), 60, || {
            let log = self.kube.try_run(&["-n", NS, "logs", pod]).ok()?;
            log.contains("end of devices").then_some(log)
        })
    }

    fn scheduled_by(&self, pod: &str) -> String {
        wait(&format!("the Scheduled event of {pod}"), 60, || {
            let events = self.kube.items(&[
                "-n",
                NS,
                "get",
                "events",
                "--field-selector",
                &format!("involvedObject.name={pod},reason=Scheduled"),
            ]);
            events.first().map(|e| {
                format!(
                    "{} ({}): {}",
                    e["reportingComponent"].as_str().unwrap_or(""),
                    e["reportingInstance"].as_str().unwrap_or(""),
                    e["message"].as_str().unwrap_or("")
                )
            })
        })
    }

    fn scale(&self, replicas: usize) {
        self.kube.run(&[
            "-n",
            NS,
            "scale",
            "deployment/inference",
            &format!("--replicas={replicas}"),
        ]);
    }

    fn slices(&self) -> Slices {
        self.kube
            .items(&["get", "resourceslices.v1.resource.k8s.io"])
            .iter()
            .filter(|s| s["spec"]["nodeName"] == NODE_NAME && s["spec"]["driver"] == DRIVER)
            .map(|s| {
                let devices = s["spec"]["devices"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|d| {
                        (
                            d["name"].as_str().unwrap_or("").to_string(),
                            d["attributes"]["productName"]["string"]
                                .as_str()
                                .unwrap_or("")
                                .to_string(),
                        )
                    })
                    .collect();
                (
                    name(s),
                    (
                        s["metadata"]["resourceVersion"]
                            .as_str()
                            .unwrap_or("")
                            .to_string(),
                        devices,
                    ),
                )
            })
            .collect()
    }

    fn agent_pod(&self) -> Option<Value> {
        self.kube
            .items(&[
                "-n",
                "kube-system",
                "get",
                "pods",
                "-l",
                "app.kubernetes.io/component=node-agent",
            ])
            .into_iter()
            .find(ready)
    }

    fn lease_holder(&self) -> Option<String> {
        // The identity is `<pod>_<pid>_<nonce>` (pod names have no `_`).
        self.lease_identity()
            .and_then(|h| h.split('_').next().map(String::from))
    }

    /// The Lease's holder identity: a restarted process in the same pod has a new one.
    fn lease_identity(&self) -> Option<String> {
        let lease = self
            .kube
            .try_run(&[
                "-n",
                "kube-system",
                "get",
                "lease",
                "dra-scheduler",
                "-o",
                "json",
            ])
            .ok()?;
        let lease: Value = serde_json::from_str(&lease).ok()?;
        lease["spec"]["holderIdentity"].as_str().map(String::from)
    }

    /// The scheduler pods with their containers' restart counts, for a message.
    fn scheduler_restarts(&self) -> String {
        self.scheduler_pods()
            .iter()
            .map(|p| {
                let status = &p["status"]["containerStatuses"][0];
                let previous = self
                    .kube
                    .try_run(&[
                        "-n",
                        "kube-system",
                        "logs",
                        &name(p),
                        "--previous",
                        "--tail=15",
                    ])
                    .unwrap_or_else(|e| e);
                format!(
                    "{} (restarts {}, last state {}, ready {})\nprevious log:\n{previous}",
                    name(p),
                    status["restartCount"],
                    status["lastState"],
                    status["ready"]
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn scheduler_pods(&self) -> Vec<Value> {
        self.kube.items(&[
            "-n",
            "kube-system",
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/component=scheduler",
        ])
    }
}

/// `/metrics` of whichever scheduler pod holds the Lease, read from its pod IP in the
/// cluster's network namespace, as Prometheus scrapes it.
struct LeaderMetrics<'a> {
    cluster: &'a TestCluster,
    e2e: &'a E2e<'a>,
}

impl<'a> LeaderMetrics<'a> {
    fn new(cluster: &'a TestCluster, e2e: &'a E2e<'a>) -> Self {
        Self { cluster, e2e }
    }

    /// The body, or "" when the leader's pod did not answer.
    fn scrape(&self) -> String {
        let leader = wait("a Lease holder", 60, || self.e2e.lease_holder());
        let pod = self
            .e2e
            .kube
            .json(&["-n", "kube-system", "get", "pod", &leader]);
        let Some(ip) = pod["status"]["podIP"].as_str().map(String::from) else {
            return String::new();
        };
        self.cluster.in_netns(move || {
            let mut body = String::new();
            if let Ok(mut conn) = TcpStream::connect((ip.as_str(), 10261)) {
                let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                let _ = write!(conn, "GET /metrics HTTP/1.0\r\nHost: {ip}\r\n\r\n");
                let _ = conn.read_to_string(&mut body);
            }
            body
        })
    }
}

/// `/metrics` of a scheduler pod through `kubectl port-forward`, as a user reads it; "" when
/// nothing came back.
fn port_forward_scrape(cluster: &TestCluster, pod: &str) -> String {
    let mut child = cluster
        .kubectl()
        .args([
            "-n",
            "kube-system",
            "port-forward",
            &format!("pod/{pod}"),
            ":10261",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl port-forward");
    let mut stdout = child.stdout.take().unwrap();
    let mut first_line = Vec::new();
    let mut byte = [0u8; 1];
    while stdout.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
        first_line.push(byte[0]);
    }
    let first_line = String::from_utf8_lossy(&first_line).into_owned();
    let port: Option<u16> = first_line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|p| p.parse().ok());
    let mut body = String::new();
    if let Some(Ok(mut conn)) = port.map(|port| cluster.connect(port)) {
        let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
        let _ = write!(conn, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n");
        let _ = conn.read_to_string(&mut body);
    }
    let _ = child.kill();
    let _ = child.wait();
    body
}

/// Kills the cluster.sh-started process `component` (kubelet or containerd) with `signal`
/// and starts it again with the same command line, environment and log, recording its new
/// pid where `cluster.sh down` looks for it. Returns the new pid.
fn restart_node_process(cluster: &TestCluster, component: &str, signal: &str) -> u32 {
    let dir = cluster.dir();
    let pid_file = dir.join("pids").join(component);
    let pid = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .to_string();
    let split = |bytes: Vec<u8>| -> Vec<String> {
        bytes
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect()
    };
    let cmdline = split(std::fs::read(format!("/proc/{pid}/cmdline")).unwrap());
    let environ = split(std::fs::read(format!("/proc/{pid}/environ")).unwrap());
    assert!(
        cmdline[0].ends_with(component),
        "pid {pid} is not {component}: {cmdline:?}"
    );
    run(Command::new("kill").args([&format!("-{signal}"), &pid]));
    wait(&format!("{component} ({pid}) to exit"), 30, || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        (stat.is_empty() || stat.contains(") Z ")).then_some(())
    });
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("logs").join(format!("{component}.log")))
        .unwrap();
    // In the cluster's network namespace, as cluster.sh started it (nsenter and setsid
    // exec in place: the child's pid is the component's).
    let mut cmd = cluster.command("setsid");
    cmd.args(&cmdline)
        .env_clear()
        .envs(environ.iter().filter_map(|kv| kv.split_once('=')))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("restart {component}: {e}"));
    let new_pid = child.id();
    std::fs::write(&pid_file, format!("{new_pid}\n")).unwrap();
    // setsid execs in place (the child leads no group), so the child is the component;
    // cluster.sh down stops it by this pid. Its exit status is not ours to wait for.
    std::mem::forget(child);
    new_pid
}

/// The agent pod's log once kubelet has registered its plugin; on timeout, the agent's log
/// and kubelet's lines about plugins.
fn registered(kube: &Kube<'_>, dir: &Path, agent: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let log = kube
            .try_run(&["-n", "kube-system", "logs", agent])
            .unwrap_or_else(|e| e);
        if log.contains("registered with kubelet") {
            return log;
        }
        if Instant::now() > deadline {
            let kubelet = std::fs::read_to_string(dir.join("logs/kubelet.log")).unwrap_or_default();
            let plugin_lines: Vec<&str> = kubelet
                .lines()
                .filter(|l| l.contains("lugin") || l.contains(DRIVER))
                .collect();
            panic!(
                "kubelet did not register the agent {agent} in 60s; its log:\n{log}\nkubelet about plugins:\n{}",
                plugin_lines.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The user container's command: it prints the devices it got (environment, device
/// nodes), then sleeps. As a YAML flow sequence.
fn print_devices_command() -> String {
    let script = "env | grep -E '^(DRA_|NVIDIA_|CUDA_)' | sort | sed 's/^/env: /'\n\
                  ls -l /dev/nvidia* | sed 's/^/dev: /'\n\
                  echo end of devices\n\
                  exec sleep 100000\n";
    serde_json::json!(["sh", "-c", script]).to_string()
}

fn workload() -> String {
    let command = print_devices_command();
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {NS}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: a5000-else-t10
  namespace: {NS}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        firstAvailable:
        - name: a5000
          deviceClassName: {DRIVER}
          selectors:
          - cel:
              expression: device.attributes["{DRIVER}"].productName == "NVIDIA RTX A5000"
        - name: t10
          deviceClassName: {DRIVER}
          selectors:
          - cel:
              expression: device.attributes["{DRIVER}"].productName == "NVIDIA T10"
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: inference
  namespace: {NS}
spec:
  replicas: 1
  selector:
    matchLabels: {{app: inference}}
  template:
    metadata:
      labels: {{app: inference}}
    spec:
      schedulerName: dra-scheduler
      terminationGracePeriodSeconds: 1
      resourceClaims:
      - name: gpu
        resourceClaimTemplateName: a5000-else-t10
      containers:
      - name: server
        image: {BUSYBOX_IMAGE}
        imagePullPolicy: Never
        command: {command}
        resources:
          requests: {{cpu: 10m, memory: 16Mi}}
          claims:
          - name: gpu
"#
    )
}

/// Where the doubled-prepare step puts its claims and pods, apart from the Deployment's.
const ONE_OWNER_NS: &str = "one-owner";
/// Who writes allocations: the chart's scheduler ServiceAccount (a cluster may admit
/// allocations of the driver from it alone).
const SCHEDULER_SA: &str = "system:serviceaccount:kube-system:dra-scheduler";

/// A claim for one GPU and a pod that uses it, bound to the node directly (no scheduler),
/// with the busybox container of the Deployment that prints its devices.
fn claim_and_pod(name: &str) -> String {
    let command = print_devices_command();
    format!(
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: {name}
  namespace: {ONE_OWNER_NS}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: {DRIVER}
---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ONE_OWNER_NS}
spec:
  nodeName: {NODE_NAME}
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - name: gpu
    resourceClaimName: {name}
  containers:
  - name: server
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: {command}
    resources:
      claims:
      - name: gpu
"#
    )
}

/// Issue 47 (one owner per device), through the real kubelet: two claims whose allocations
/// both name `device` of the node, as two schedulers racing could write them, reserved for
/// two pods bound to the node. The agent prepares the first and refuses the second, naming
/// the first; kubelet reports that on the second pod and retries; once the first pod is
/// deleted (kubelet unprepares its claim), a retry prepares the second, which runs with the
/// device. Both pods and claims are removed after.
fn one_owner_per_device(e2e: &E2e<'_>, device: &str, uuid: &str) {
    let kube = &e2e.kube;
    kube.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ONE_OWNER_NS}\n"
    ));
    // The claim allocated `device` and reserved for its pod, written as the scheduler's
    // ServiceAccount (impersonated) writes it; the claim's UID.
    let allocate = |name: &str| -> String {
        kube.apply(&claim_and_pod(name));
        let pod = kube.json(&["-n", ONE_OWNER_NS, "get", "pod", name]);
        let status = serde_json::json!({"status": {
            "allocation": {
                "devices": {"results": [
                    {"request": "gpu", "driver": DRIVER, "pool": NODE_NAME, "device": device},
                ]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [NODE_NAME]},
                ]}]},
            },
            "reservedFor": [{"resource": "pods", "name": name, "uid": pod["metadata"]["uid"]}],
        }});
        let claim = kube.patch_claim_status_as(SCHEDULER_SA, ONE_OWNER_NS, name, &status);
        claim["metadata"]["uid"].as_str().unwrap().to_string()
    };
    let phase = |pod: &str| -> String {
        kube.json(&["-n", ONE_OWNER_NS, "get", "pod", pod])["status"]["phase"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let prepared = |uid: &str| -> Option<()> {
        let (state, devices) = e2e.checkpoint().get(uid)?.clone();
        (state == "Prepared" && e2e.cdi_specs().contains_key(uid)).then(|| {
            assert_eq!(devices, [device], "claim {uid}");
        })
    };
    let log = |pod: &str| -> String {
        wait(&format!("the log of {pod}"), 60, || {
            let log = kube.try_run(&["-n", ONE_OWNER_NS, "logs", pod]).ok()?;
            log.contains("end of devices").then_some(log)
        })
    };

    let first = allocate("first");
    wait("pod first Running, its claim prepared", 120, || {
        (phase("first") == "Running").then_some(())?;
        prepared(&first)
    });
    assert!(log("first").contains(&format!("_UUID={uuid}")));

    let second = allocate("second");
    let refused = wait("kubelet's event: the second claim refused", 120, || {
        assert_ne!(
            phase("second"),
            "Running",
            "pod second runs with {device} while pod first has it"
        );
        kube.items(&[
            "-n",
            ONE_OWNER_NS,
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=second,type=Warning",
        ])
        .into_iter()
        .find(|e| e["message"].as_str().is_some_and(|m| m.contains(&first)))
    });
    let message = refused["message"].as_str().unwrap();
    println!(
        "one owner per device: pod second refused by kubelet ({}): {message}",
        refused["reason"]
    );
    assert_eq!(refused["reason"], "FailedPrepareDynamicResources");
    assert!(
        message.contains(&format!(
            "device {NODE_NAME}/{device} is already prepared for claim {ONE_OWNER_NS}/first (UID {first})"
        )),
        "{message}"
    );
    assert!(
        message.contains(
            "kubelet retries the prepare, which succeeds once one-owner/first is unprepared"
        ),
        "{message}"
    );
    // Still refused on kubelet's retries: the second pod does not run, nothing is prepared
    // for its claim, and the first keeps the device.
    std::thread::sleep(Duration::from_secs(15));
    assert_ne!(phase("second"), "Running");
    assert!(!e2e.checkpoint().contains_key(&second));
    assert!(!e2e.cdi_specs().contains_key(&second));
    assert_eq!(phase("first"), "Running");

    // The first pod deleted: kubelet unprepares its claim, and its next retry prepares the
    // second.
    let deleted = Instant::now();
    kube.run(&["-n", ONE_OWNER_NS, "delete", "pod", "first", "--wait=true"]);
    wait("the first claim unprepared", 60, || {
        (!e2e.checkpoint().contains_key(&first) && !e2e.cdi_specs().contains_key(&first))
            .then_some(())
    });
    // kubelet backs off between retries of a pod whose prepare failed: a run saw the
    // second pod Running 71 s after the first was deleted.
    wait("pod second Running, its claim prepared", 180, || {
        (phase("second") == "Running").then_some(())?;
        prepared(&second)
    });
    let log = log("second");
    assert!(log.contains(&format!("_UUID={uuid}")), "{log}");
    // The agent's word on each of kubelet's calls for the second claim: refused until
    // the first was unprepared, then prepared.
    let agent = e2e.agent_pod().expect("the agent pod");
    let calls: Vec<String> = kube
        .run(&["-n", "kube-system", "logs", &name(&agent)])
        .lines()
        .filter(|l| l.contains(&second) && (l.contains("prepare failed") || l.contains("prepared")))
        .map(String::from)
        .collect();
    let refusals = calls
        .iter()
        .filter(|l| l.contains("prepare failed"))
        .count();
    assert!(
        refusals >= 1 && calls.last().is_some_and(|l| !l.contains("prepare failed")),
        "{calls:#?}"
    );
    println!(
        "one owner per device: pod first deleted, pod second Running {:?} later with {device} \
         (checkpoint Prepared, CDI spec written); the agent refused it {refusals} times, then \
         prepared it:\n{}\n{log}",
        deleted.elapsed(),
        calls.join("\n")
    );

    kube.run(&[
        "-n",
        ONE_OWNER_NS,
        "delete",
        "pod,resourceclaim",
        "--all",
        "--wait=true",
    ]);
    wait("the second claim unprepared", 60, || {
        (!e2e.checkpoint().contains_key(&second) && !e2e.cdi_specs().contains_key(&second))
            .then_some(())
    });
}

/// One node at a time on a machine (kubelet's device plugin socket is fixed).
static ONE_NODE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `helm install` on a real node: the scheduler replicas Ready with a Lease holder, the
/// agent's DaemonSet pod Ready and its ResourceSlices published.
#[test]
fn helm_install_on_a_real_node_starts_the_scheduler_and_the_agent() {
    end_to_end(false);
}

/// The rest of the path, from kubelet's plugin registration on.
#[test]
fn a_user_pod_gets_its_device_and_the_node_survives_faults() {
    end_to_end(true);
}

fn end_to_end(full: bool) {
    let _one = ONE_NODE.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let step = |what: &str| println!("[{:>4}s] {what}", started.elapsed().as_secs());

    // The images, from this build's binaries; helm.
    let bin_dir = binaries_dir();
    let archives: Vec<PathBuf> = text(&run(Command::new("bash")
        .arg(repo().join("images/build-local.sh"))
        .arg("--binaries")
        .arg(&bin_dir)))
    .lines()
    .map(PathBuf::from)
    .collect();
    assert_eq!(archives.len(), 2, "{archives:?}");
    let references = text(&run(Command::new("bash")
        .arg(repo().join("images/build-local.sh"))
        .arg("--list")));
    let helm = helm_binary();
    step("images built, helm ready");

    let mut host = HostAdditions::default();
    host.make_device_files();
    let cluster = TestCluster::with_node();
    let dir = cluster.dir().to_path_buf();
    let node_dir = dir.join("node");
    let api_port: u16 = std::fs::read_to_string(dir.join("apiserver.port"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    host.pod_network(&cluster, &node_dir, api_port);
    let kube = Kube { cluster: &cluster };
    let e2e = E2e {
        kube: Kube { cluster: &cluster },
        node_dir: node_dir.clone(),
    };
    cluster
        .start_reference_scheduler("default-scheduler")
        .expect("start kube-scheduler as default-scheduler");
    wait("Node node-1 Ready (CNI network)", 120, || {
        let node = kube.json(&["get", "node", NODE_NAME]);
        node["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
            .then_some(())
    });
    // A GPU node is labelled so (by NFD or the GPU operator); the chart's DaemonSet selects it.
    kube.run(&["label", "node", NODE_NAME, "nvidia.com/gpu.present=true"]);
    step("node Ready with a pod network");

    for archive in &archives {
        run(cluster
            .ctr()
            .args(["images", "import", "--snapshotter", "native"])
            .arg(archive));
    }
    let images = text(&run(cluster.ctr().args(["images", "ls", "-q"])));
    for reference in references.lines() {
        assert!(
            images.lines().any(|i| i == reference),
            "{reference} not imported: {images}"
        );
    }
    println!(
        "imported into the node's containerd: {:?}",
        references.lines().collect::<Vec<_>>()
    );

    // helm install, as the README says, with the fake backend and the node's kubelet folder.
    let helm_home = dir.join("helm");
    let out = run(cluster
        .command(&helm)
        .env("HELM_CONFIG_HOME", helm_home.join("config"))
        .env("HELM_CACHE_HOME", helm_home.join("cache"))
        .env("HELM_DATA_HOME", helm_home.join("data"))
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .args(["install", "dra-scheduler"])
        .arg(repo().join("charts/dra-scheduler"))
        .args(["-n", "kube-system"])
        .args(["--set", "nodeAgent.backend=fake"])
        .args(["--set", &format!("nodeAgent.fakeProfile={PROFILE}")])
        // The rollout checks: a 45 s bound on the handoff wait, degraded pods looked for
        // every 2 s and upgraded after 5 s (off by default).
        .args(["--set", "config.handoff.maxWaitSeconds=45"])
        .args(["--set", "config.degraded.intervalSeconds=2"])
        .args(["--set", "config.degraded.upgrade.enabled=true"])
        .args(["--set", "config.degraded.upgrade.afterSeconds=5"])
        .args([
            "--set",
            &format!(
                "nodeAgent.kubeletDir={}",
                node_dir.join("kubelet").display()
            ),
        ]));
    println!(
        "{}",
        text(&out).lines().take(6).collect::<Vec<_>>().join("\n")
    );

    // The scheduler: two Ready replicas (probes on /healthz and /readyz), one leader.
    let schedulers = wait("two Ready scheduler pods", 240, || {
        let pods = e2e.scheduler_pods();
        (pods.len() == 2 && pods.iter().all(ready))
            .then(|| pods.iter().map(name).collect::<Vec<_>>())
    });
    let leader = wait("a scheduler pod holding the Lease", 60, || {
        e2e.lease_holder().filter(|h| schedulers.contains(h))
    });
    println!(
        "scheduler pods Ready: {schedulers:?}; Lease kube-system/dra-scheduler held by {leader}"
    );

    // The agent: Ready, its slices published, registered with kubelet.
    let agent = wait("the node agent pod Ready", 180, || e2e.agent_pod());
    let agent_name = name(&agent);
    let published = wait("the node's ResourceSlices", 60, || {
        let slices = e2e.slices();
        (slices.values().map(|(_, d)| d.len()).sum::<usize>() == 3).then_some(slices)
    });
    println!("agent pod {agent_name} Ready; ResourceSlices of {NODE_NAME}: {published:?}");
    if !full {
        step("chart installed: schedulers, leader, agent, slices");
        return;
    }
    let agent_log = registered(&kube, &dir, &agent_name);
    for line in agent_log.lines().filter(|l| {
        [
            "discovered GPUs",
            "kubelet plugin serving",
            "registered with kubelet",
        ]
        .iter()
        .any(|m| l.contains(m))
    }) {
        println!("agent {agent_name}: {line}");
    }
    let product = |device: &str| -> String {
        published
            .values()
            .flat_map(|(_, d)| d.iter())
            .find(|(n, _)| n == device)
            .map(|(_, p)| p.clone())
            .unwrap_or_default()
    };
    step("agent registered with kubelet");

    // The user's Deployment: placed by dra-scheduler, prepared, the devices in the container.
    kube.apply(&workload());
    let first = e2e.settled("first pod prepared", 1);
    let p1 = first.placed[0].clone();
    assert_eq!(product(&p1.device), "NVIDIA RTX A5000", "{p1:?}");
    let by = e2e.scheduled_by(&p1.pod);
    println!("pod {} scheduled by {by}", p1.pod);
    assert!(by.starts_with("dra-scheduler ("), "{by}");
    assert!(by.contains(&leader), "not the leader {leader}: {by}");
    let log = e2e.log(&p1.pod);
    println!("kubectl logs {}:\n{log}", p1.pod);
    assert!(log.contains(&format!("_UUID={A5000_UUID}")), "{log}");
    assert!(
        log.contains("/dev/nvidia0") && log.contains("/dev/nvidiactl"),
        "{log}"
    );
    assert!(!log.contains("/dev/nvidia1"), "{log}");
    println!(
        "CDI spec of claim {}: {}",
        p1.claim, first.cdi_specs[&p1.claim_uid]
    );

    // Removing the pod unprepares it; its claim goes; the next pod gets the A5000 again.
    // Scaled to 0 and back rather than the pod deleted: a ReplicaSet's replacement for a
    // deleted pod is created at once, while the old claim still holds the A5000, and the
    // scheduler rightly gives it the template's fallback, a T10.
    e2e.scale(0);
    kube.run(&[
        "-n",
        NS,
        "wait",
        "--for=delete",
        &format!("pod/{}", p1.pod),
        "--timeout=120s",
    ]);
    wait("claim 1's CDI spec and checkpoint entry to go", 60, || {
        (!e2e.cdi_specs().contains_key(&p1.claim_uid)
            && !e2e.checkpoint().contains_key(&p1.claim_uid))
        .then_some(())
    });
    wait("claim 1 to be deleted", 60, || {
        e2e.claims()
            .iter()
            .all(|c| c["metadata"]["uid"] != p1.claim_uid.as_str())
            .then_some(())
    });
    println!(
        "pod {} deleted: CDI spec and checkpoint entry of claim {} gone, claim deleted",
        p1.pod, p1.claim
    );
    step("prepare, unprepare");

    // The node's devices are free: two claims given the A5000 both, bound to the node.
    one_owner_per_device(&e2e, &p1.device, A5000_UUID);
    step("one owner per device");

    e2e.scale(1);
    let second = e2e.settled("second pod prepared", 1);
    let p2 = second.placed[0].clone();
    assert_eq!(product(&p2.device), "NVIDIA RTX A5000", "{p2:?}");
    assert_ne!(p2.claim_uid, p1.claim_uid);
    let log = e2e.log(&p2.pod);
    assert!(log.contains(A5000_UUID), "{log}");
    println!("second pod {} got {} again:\n{log}", p2.pod, p2.device);
    step("second pod");

    // Fault 1: kubelet SIGKILLed and restarted while the pod runs.
    let listens = |_: ()| {
        std::fs::read_to_string(dir.join("logs/kubelet.log"))
            .unwrap_or_default()
            .matches("Starting to listen")
            .count()
    };
    let listened = listens(());
    let before_restart = e2e.slices();
    let kubelet = restart_node_process(&cluster, "kubelet", "KILL");
    wait(
        "the restarted kubelet to report the Node Ready",
        120,
        || {
            let node = kube.json(&["get", "node", NODE_NAME]);
            let ready = node["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Ready")?
                .clone();
            (ready["status"] == "True" && listens(()) > listened).then_some(())
        },
    );
    // kubelet deletes every ResourceSlice of its node when it starts (a driver that does
    // not come back must not keep advertising devices); the running agent publishes
    // them again, on the deletion it watches or at its next rediscovery at the latest.
    let started = Instant::now();
    let republished = wait(
        "the agent to publish the slices kubelet wiped at start",
        60,
        || {
            let slices = e2e.slices();
            let devices = |s: &Slices| s.values().map(|(_, d)| d.clone()).collect::<Vec<_>>();
            let versions = |s: &Slices| s.values().map(|(v, _)| v.clone()).collect::<Vec<_>>();
            let recreated = versions(&slices) != versions(&before_restart);
            (recreated && devices(&slices) == devices(&published)).then_some(slices)
        },
    );
    println!(
        "fault check [kubelet restart]: kubelet wiped the slices of {NODE_NAME} ({before_restart:?}); the agent published them again within {:?} of the Node Ready: {republished:?}",
        started.elapsed()
    );
    std::thread::sleep(Duration::from_secs(5));
    let after = e2e.settled("after kubelet SIGKILL and restart", 1);
    assert_eq!(
        after, second,
        "kubelet restart changed the running pod's state"
    );
    println!(
        "fault check [kubelet SIGKILL, restarted as pid {kubelet}]: pod {} kept container {} ({} restarts) and device {}; checkpoint and CDI spec unchanged",
        p2.pod, p2.container_id, p2.restarts, p2.device
    );

    // Fault 2: the agent pod killed; the DaemonSet starts another, which registers again
    // without rewriting the slices, and prepares a new pod.
    let slices_before = e2e.slices();
    kube.run(&[
        "-n",
        "kube-system",
        "delete",
        "pod",
        &agent_name,
        "--wait=true",
    ]);
    let agent2 = wait("a new agent pod Ready", 120, || {
        e2e.agent_pod().filter(|p| name(p) != agent_name)
    });
    let agent2_name = name(&agent2);
    registered(&kube, &dir, &agent2_name);
    std::thread::sleep(Duration::from_secs(3));
    let slices_after = e2e.slices();
    assert_eq!(
        slices_after, slices_before,
        "the new agent rewrote the slices"
    );
    let after = e2e.settled("after the agent pod was killed", 1);
    assert_eq!(
        after, second,
        "the agent restart changed the running pod's state"
    );
    e2e.scale(2);
    let two = e2e.settled("a new pod prepared by the new agent", 2);
    let p3 = two.placed.iter().find(|p| p.pod != p2.pod).unwrap().clone();
    assert_eq!(product(&p3.device), "NVIDIA T10", "{p3:?}");
    assert!(two.placed.contains(&p2), "{two:?}");
    let log = e2e.log(&p3.pod);
    assert!(T10_UUIDS.iter().any(|u| log.contains(u)), "{log}");
    println!(
        "fault check [agent pod {agent_name} killed]: {agent2_name} registered again, slices unchanged (resourceVersions {:?}), new pod {} prepared with {}:\n{log}",
        slices_after.values().map(|(rv, _)| rv).collect::<Vec<_>>(),
        p3.pod,
        p3.device
    );
    step("kubelet and agent faults");

    // Fault 3: the scheduler leader pod killed; another replica takes the Lease and places
    // the next pod. Which one is a race, as with kube-scheduler: the standby, or the pod the
    // Deployment starts in the killed one's place, whichever acquires the expired Lease first.
    let standby = schedulers.iter().find(|s| **s != leader).unwrap().clone();
    kube.run(&[
        "-n",
        "kube-system",
        "delete",
        "pod",
        &leader,
        "--grace-period=0",
        "--force",
    ]);
    let new_leader = wait("another scheduler pod to take the Lease", 60, || {
        e2e.lease_holder().filter(|h| *h != leader)
    });
    let took_over = if new_leader == standby {
        "the standby"
    } else {
        "the Deployment's replacement replica"
    };
    e2e.scale(3);
    let three = e2e.settled("the next pod placed by the new leader", 3);
    let p4 = three
        .placed
        .iter()
        .find(|p| p.pod != p2.pod && p.pod != p3.pod)
        .unwrap()
        .clone();
    assert_eq!(product(&p4.device), "NVIDIA T10", "{p4:?}");
    let by = e2e.scheduled_by(&p4.pod);
    assert!(by.contains(&new_leader), "{by}");
    println!(
        "fault check [scheduler leader {leader} killed]: {new_leader} ({took_over}) took the Lease; pod {} scheduled by {by}, device {}",
        p4.pod, p4.device
    );

    // The new leader's metrics, through kubectl port-forward: its own decisions count
    // there. (Its claim allocation count can be 0: a claim the old leader allocated before
    // it was killed is not allocated again.)
    let scheduled = "dra_scheduler_scheduling_attempt_duration_seconds_count{result=\"scheduled\"}";
    let body = wait(
        "the new leader's scheduled attempts in /metrics",
        60,
        || {
            let body = port_forward_scrape(&cluster, &new_leader);
            body.lines()
                .any(|l| l.starts_with(scheduled))
                .then_some(body)
        },
    );
    let line = body.lines().find(|l| l.starts_with(scheduled)).unwrap();
    let count: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    println!("/metrics of {new_leader} (kubectl port-forward): {line}");
    assert!(count >= 1.0, "{line}");
    step("leader metrics");

    // Fault 4: containerd restarted; the pods keep running, and the node still prepares.
    let containerd = restart_node_process(&cluster, "containerd", "TERM");
    wait("containerd back", 60, || {
        cluster
            .ctr()
            .args(["version"])
            .output()
            .ok()
            .filter(|o| o.status.success())
    });
    std::thread::sleep(Duration::from_secs(10));
    let after = e2e.settled("after containerd restart", 3);
    assert_eq!(
        after, three,
        "containerd restart changed the running pods' state"
    );
    kube.run(&["-n", NS, "delete", "pod", &p4.pod, "--wait=true"]);
    let again = e2e.settled("a replacement pod prepared after containerd restart", 3);
    let p5 = again
        .placed
        .iter()
        .find(|p| ![&p2.pod, &p3.pod, &p4.pod].contains(&&p.pod))
        .unwrap()
        .clone();
    assert_eq!(p5.device, p4.device, "{again:?}");
    assert!(!again.checkpoint.contains_key(&p4.claim_uid));
    println!(
        "fault check [containerd restarted as pid {containerd}]: pods {:?} kept their containers; pod {} deleted and unprepared, its replacement {} got {}",
        three.placed.iter().map(|p| &p.pod).collect::<Vec<_>>(),
        p4.pod,
        p5.pod,
        p5.device
    );
    step("scheduler and containerd faults");

    // From here the scrape follows the Lease and reads the leader's pod IP from the
    // cluster's network, as Prometheus does: leadership can move (a CI run saw the
    // leader's renewals hang for its renew deadline around the containerd restart, and
    // it exited as it must), and port-forwards to pods that predate the containerd
    // restart returned nothing.
    let metrics = LeaderMetrics::new(&cluster, &e2e);
    let scrape = || metrics.scrape();

    rollouts(&e2e, &product, &scrape);
    step("done");
}

/// The seed's rollout gotcha on the real node, with kubelet terminating the old pods: the
/// Deployment (one replica, "an A5000, else a T10"; the old pod deleted first, as
/// `maxSurge: 0` does) rolled by `kubectl rollout restart` and by template changes.
/// dra-scheduler's replacement waits for the A5000 and gets it; with the opt-out
/// annotation it takes the T10 at once, is reported degraded once the A5000 is free, and
/// the upgrade moves it back; kube-scheduler's replacement gets the T10; an old pod that
/// does not finish (a 600 s grace period, a container that ignores SIGTERM) is waited for
/// until the bound (45 s here), then the replacement takes the T10.
fn rollouts(e2e: &E2e<'_>, product: &dyn Fn(&str) -> String, scrape: &dyn Fn() -> String) {
    let kube = &e2e.kube;
    let patch = |json: &str| {
        kube.run(&["-n", NS, "patch", "deployment/inference", "-p", json]);
    };
    let events = |pod: &str, reason: &str| -> Vec<String> {
        kube.items(&[
            "-n",
            NS,
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={pod},reason={reason}"),
        ])
        .iter()
        .map(|e| {
            e["message"]
                .as_str()
                .or(e["note"].as_str())
                .unwrap_or("")
                .to_string()
        })
        .collect()
    };
    let gauge =
        "dra_scheduler_degraded_pods{namespace=\"inference\",owner=\"Deployment/inference\"}";
    let degraded = || -> Option<f64> {
        scrape()
            .lines()
            .find(|l| l.starts_with(gauge))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    };
    // The next pod of the rollout: Running on its device, not one of `old`.
    let next = |what: &str, old: &[&str], seconds: u64| -> Placed {
        wait(what, seconds, || {
            let placed = e2e.placed(1)?;
            (!old.contains(&placed[0].pod.as_str())).then(|| placed[0].clone())
        })
    };
    // `kubectl rollout restart` stamps the second: a second restart within the same
    // second is refused, so it is asked again (a CI run saw a pod Running within it).
    let restart = || {
        wait("kubectl rollout restart", 10, || {
            match kube.try_run(&["-n", NS, "rollout", "restart", "deployment/inference"]) {
                Ok(_) => Some(()),
                Err(e) if e.contains("within the past second") => None,
                Err(e) => panic!("kubectl rollout restart: {e}"),
            }
        })
    };
    let mut rows: Vec<(String, String, String)> = Vec::new();
    // What the leader said, for a failure's message.
    let leader_log = || -> String {
        let Some(leader) = e2e.lease_holder() else {
            return "no leader".into();
        };
        let log = kube
            .try_run(&["-n", "kube-system", "logs", &leader, "--tail=40"])
            .unwrap_or_else(|e| e);
        format!(
            "last lines of {leader}:\n{log}\nscheduler pods: {}",
            e2e.scheduler_restarts()
        )
    };

    e2e.scale(0);
    wait("the pods and claims to go", 120, || {
        (kube.items(&["-n", NS, "get", "pods"]).is_empty() && e2e.claims().is_empty()).then_some(())
    });
    // The old pods hold their device for 10 s after their deletion (the container ignores
    // SIGTERM; kubelet kills it when the grace period ends), so that each replacement is
    // placed while its predecessor still terminates: with 1 s, a CI run saw the A5000
    // released before the replacement's first attempt, and nothing to wait for.
    patch(
        r#"{"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}, "template": {"spec": {"terminationGracePeriodSeconds": 10}}}}"#,
    );
    e2e.scale(1);
    let x = next("the rollout's first pod", &[], 120);
    assert_eq!(product(&x.device), "NVIDIA RTX A5000", "{x:?}");

    // 1. kubectl rollout restart: the replacement waits for the A5000 and gets it.
    restart();
    let y = next("the restart's replacement", &[&x.pod], 120);
    let waited = events(&y.pod, "WaitingForDevice");
    println!(
        "rollout restart: {} -> {} on {} ({}); {waited:?}",
        x.pod,
        y.pod,
        y.device,
        product(&y.device)
    );
    assert_eq!(
        product(&y.device),
        "NVIDIA RTX A5000",
        "{y:?}\n{}",
        leader_log()
    );
    assert!(
        waited
            .iter()
            .any(|m| m.contains(&format!("held by terminating pod {NS}/{}", x.pod))),
        "the replacement got the A5000 without waiting for it: {waited:?}"
    );
    rows.push((
        "dra-scheduler".into(),
        "kubectl rollout restart".into(),
        product(&y.device),
    ));

    // 2. Opted out (the template change rolls the Deployment): the T10 at once; degraded
    // once the old pod is gone; the upgrade evicts it and its replacement gets the A5000.
    patch(
        r#"{"spec": {"template": {"metadata": {"annotations": {"dra-scheduler.io/handoff-wait": "false"}}}}}"#,
    );
    let z = next("the opted-out replacement", &[&y.pod], 120);
    assert_eq!(product(&z.device), "NVIDIA T10", "{z:?}");
    assert!(events(&z.pod, "WaitingForDevice").is_empty());
    rows.push((
        "dra-scheduler, opted out".into(),
        "template change".into(),
        product(&z.device),
    ));
    wait("the degraded gauge at 1", 60, || {
        (degraded()? == 1.0).then_some(())
    });
    let condition = wait("the PreferredDevice condition", 30, || {
        let pod = kube.json(&["-n", NS, "get", "pod", &z.pod]);
        pod["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "dra-scheduler.io/PreferredDevice")
            .cloned()
    });
    println!("degraded: {gauge} 1; {} condition {condition}", z.pod);
    assert_eq!(condition["status"], "False");
    let z2 = next("the upgrade's replacement", &[&z.pod], 120);
    assert_eq!(
        product(&z2.device),
        "NVIDIA RTX A5000",
        "{z2:?}\n{}",
        leader_log()
    );
    let evicted = events(&z.pod, "UpgradeEviction");
    assert!(!evicted.is_empty(), "{} not evicted by the upgrade", z.pod);
    wait("the degraded gauge at 0", 60, || {
        (degraded()? == 0.0).then_some(())
    });
    println!(
        "upgrade: {evicted:?}; {} on {}; {gauge} 0",
        z2.pod, z2.device
    );

    // 3. The same rollout under kube-scheduler 1.37 (the template change hands the
    // Deployment to it). In the chart's ownership mode kube-scheduler may not allocate
    // the agent's GPUs: its replacement stays Pending, told why by the API server's
    // refusal. In shared mode (the policy removed, as `helm upgrade --set
    // ownership.enabled=false` removes it) the replacement gets the T10.
    patch(
        r#"{"spec": {"template": {"metadata": {"annotations": null}, "spec": {"schedulerName": "default-scheduler"}}}}"#,
    );
    let refused = wait("kube-scheduler's replacement refused the GPU", 120, || {
        let pending = kube
            .items(&["-n", NS, "get", "pods"])
            .into_iter()
            .find(|p| {
                p["spec"]["schedulerName"] == "default-scheduler" && p["spec"]["nodeName"].is_null()
            })?;
        let claim = pending["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
            .as_str()?
            .to_string();
        events(&name(&pending), "FailedScheduling")
            .into_iter()
            .find(|m| m.contains("is allocated only by dra-scheduler here"))
            .map(|m| (name(&pending), m, claim))
    });
    let claim = e2e.claims().into_iter().find(|c| name(c) == refused.2);
    assert!(
        claim.is_some_and(|c| c["status"]["allocation"].is_null()),
        "{}'s claim {} holds no device",
        refused.0,
        refused.2
    );
    println!("ownership mode: {} Pending: {}", refused.0, refused.1);
    for kind in [
        "validatingadmissionpolicybinding",
        "validatingadmissionpolicy",
    ] {
        kube.run(&["delete", kind, "dra-scheduler-device-ownership"]);
    }
    let w = next("kube-scheduler's replacement", &[&z2.pod], 120);
    assert_eq!(product(&w.device), "NVIDIA T10", "{w:?}");
    rows.push((
        "kube-scheduler v1.37.2".into(),
        "template change".into(),
        product(&w.device),
    ));
    // And `kubectl rollout restart` from the A5000: its next pod gets the free A5000 (once
    // the claim of our last pod there is gone), the restart's replacement the T10.
    wait("the A5000's last claim to go", 120, || {
        (!e2e
            .claims()
            .iter()
            .any(|c| c["metadata"]["uid"] == z2.claim_uid.as_str()))
        .then_some(())
    });
    restart();
    let w2 = next("kube-scheduler's pod on the free A5000", &[&w.pod], 120);
    assert_eq!(product(&w2.device), "NVIDIA RTX A5000", "{w2:?}");
    restart();
    let w3 = next("kube-scheduler's restart replacement", &[&w2.pod], 120);
    assert_eq!(product(&w3.device), "NVIDIA T10", "{w3:?}");
    rows.push((
        "kube-scheduler v1.37.2".into(),
        "kubectl rollout restart".into(),
        product(&w3.device),
    ));

    // 4. Back to dra-scheduler, with pods that ignore SIGTERM for 600 s: the first gets
    // the free A5000; its restart's replacement waits 45 s for it, then takes the T10.
    patch(
        r#"{"spec": {"template": {"spec": {"schedulerName": "dra-scheduler", "terminationGracePeriodSeconds": 600}}}}"#,
    );
    let v = next("a pod that ignores SIGTERM", &[&w3.pod], 120);
    assert_eq!(product(&v.device), "NVIDIA RTX A5000", "{v:?}");
    let restarted = Instant::now();
    restart();
    let v2 = next(
        "the replacement of a pod that does not finish",
        &[&v.pod],
        120,
    );
    let after = restarted.elapsed();
    assert_eq!(product(&v2.device), "NVIDIA T10", "{v2:?}");
    assert!(
        after >= Duration::from_secs(44),
        "{v2:?} placed after {after:?}, before the bound; its WaitingForDevice events: {:?}\n{}",
        events(&v2.pod, "WaitingForDevice"),
        leader_log()
    );
    let old = kube.json(&["-n", NS, "get", "pod", &v.pod]);
    assert!(
        !old["metadata"]["deletionTimestamp"].is_null(),
        "{} finished",
        v.pod
    );
    println!(
        "bound: {} still terminating; {} on {} after {after:?}",
        v.pod, v2.pod, v2.device
    );
    rows.push((
        "dra-scheduler, old pod never finishes".into(),
        "kubectl rollout restart".into(),
        product(&v2.device),
    ));
    kube.run(&[
        "-n",
        NS,
        "delete",
        "pod",
        &v.pod,
        "--grace-period=0",
        "--force",
    ]);

    println!("| scheduler | rollout | the replacement got |\n|---|---|---|");
    for (scheduler, how, got) in rows {
        println!("| {scheduler} | {how} | {got} |");
    }
}
