//! Acting as the kubelet: runs the real `dra-node-agent` binary with a fake profile against
//! a real kube-apiserver 1.37 and talks gRPC to it over its Unix sockets: registration,
//! prepare/unprepare of claims allocated on the API server, the CDI files, idempotency, a
//! kill -9 and restart in the middle, a corrupt checkpoint, per-claim errors, /metrics; and
//! MPS claims against a stand-in `nvidia-cuda-mps-control`, whose input is checked.

mod common;

use common::*;
use dra_node_agent::plugin::connect_unix;
use dra_node_agent::proto::dra_health_v1 as health_pb;
use dra_node_agent::proto::dra_v1 as v1;
use dra_node_agent::proto::dra_v1beta1 as v1beta1;
use dra_node_agent::proto::pluginregistration as reg;
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult, DeviceClaim,
    DeviceClass, DeviceRequest, DeviceRequestAllocationResult, ExactDeviceRequest,
    OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimSpec, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use test_cluster::{TestCluster, eventually};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Agent {
    child: Child,
    http: String,
}

struct Dirs {
    _tmp: tempfile::TempDir,
    plugin: PathBuf,
    registry: PathBuf,
    cdi: PathBuf,
    log: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().to_path_buf();
    Dirs {
        plugin: p.join("plugins/gpu.nvidia.com"),
        registry: p.join("plugins_registry"),
        cdi: p.join("cdi"),
        log: p.join("agent.log"),
        _tmp: tmp,
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_agent(cluster: &TestCluster, node: &str, d: &Dirs) -> Agent {
    start_agent_with(cluster, node, d, &[])
}

fn start_agent_with(
    cluster: &TestCluster,
    node: &str,
    d: &Dirs,
    extra: &[&std::ffi::OsStr],
) -> Agent {
    let http = format!("127.0.0.1:{}", free_port());
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&d.log)
        .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_dra-node-agent"))
        .args([
            "--node-name",
            node,
            "--backend",
            "fake",
            "--http-address",
            &http,
        ])
        .arg("--fake-profile")
        .arg(profile("1x-a5000-2x-t10.yaml"))
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .arg("--plugin-dir")
        .arg(&d.plugin)
        .arg("--registry-dir")
        .arg(&d.registry)
        .arg("--cdi-dir")
        .arg(&d.cdi)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start dra-node-agent");
    Agent { child, http }
}

fn kill(agent: &mut Agent) {
    agent.child.kill().unwrap(); // SIGKILL: no cleanup
    agent.child.wait().unwrap();
}

async fn wait_for_socket(path: &Path, log: &Path) {
    let p = path.to_path_buf();
    let log = log.to_path_buf();
    eventually(&format!("socket {}", p.display()), 60, || {
        let p = p.clone();
        let log = log.clone();
        async move {
            if p.exists() && connect_unix(&p).await.is_ok() {
                Some(())
            } else {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                assert!(!text.contains("error:"), "agent failed:\n{text}");
                None
            }
        }
    })
    .await;
}

async fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let code = buf[9..12].parse().unwrap();
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

fn claim_spec() -> ResourceClaimSpec {
    ResourceClaimSpec {
        devices: Some(DeviceClaim {
            requests: Some(vec![DeviceRequest {
                name: "gpu".into(),
                exactly: Some(ExactDeviceRequest {
                    device_class_name: "gpu.nvidia.com".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

/// Creates a claim and, when `device` is given, allocates it on `node` as a scheduler
/// would (status.allocation), optionally with an opaque config.
async fn claim(
    api: &Api<ResourceClaim>,
    name: &str,
    alloc: Option<(&str, &str)>,
    config: Option<serde_json::Value>,
) -> (String, ResourceClaim) {
    let created = api
        .create(
            &PostParams::default(),
            &ResourceClaim {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                spec: Some(claim_spec()),
                status: None,
            },
        )
        .await
        .unwrap_or_else(|e| panic!("create claim {name}: {e}"));
    let uid = created.metadata.uid.clone().unwrap();
    let Some((node, device)) = alloc else {
        return (uid, created);
    };
    let mut c = created;
    c.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(vec![DeviceRequestAllocationResult {
                    request: "gpu".into(),
                    driver: DRIVER.into(),
                    pool: node.into(),
                    device: device.into(),
                    ..Default::default()
                }]),
                config: config.map(|p| {
                    vec![DeviceAllocationConfiguration {
                        source: "FromClaim".into(),
                        requests: Some(vec!["gpu".into()]),
                        opaque: Some(OpaqueDeviceConfiguration {
                            driver: DRIVER.into(),
                            parameters: RawExtension(p),
                        }),
                    }]
                }),
            }),
            node_selector: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec![node.into()]),
                    }]),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let c = api
        .replace_status(name, &PostParams::default(), &c)
        .await
        .unwrap_or_else(|e| panic!("allocate claim {name}: {e}"));
    (uid, c)
}

/// A well-formed UID no claim has.
const NOT_THE_UID: &str = "00000000-0000-4000-8000-000000000000";

fn v1_claim(ns: &str, name: &str, uid: &str) -> v1::Claim {
    v1::Claim {
        namespace: ns.into(),
        uid: uid.into(),
        name: name.into(),
    }
}

#[tokio::test]
async fn kubelet_registers_prepares_restarts_and_unprepares() {
    let cluster = TestCluster::shared();
    let client = cluster.client().await;
    let ns = cluster.namespace("agent").await;
    let node = unique("kubelet");
    create_node(&client, &node).await;
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let _ = classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "gpu.nvidia.com"},
                "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}
            }))
            .unwrap(),
        )
        .await; // AlreadyExists from another test is fine

    let d = dirs();
    let mut agent = start_agent(cluster, &node, &d);
    let reg_sock = d.registry.join("gpu.nvidia.com-reg.sock");
    wait_for_socket(&reg_sock, &d.log).await;

    // Registration, as kubelet's plugin watcher does it.
    let mut r =
        reg::registration_client::RegistrationClient::new(connect_unix(&reg_sock).await.unwrap());
    let info = r.get_info(reg::InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.nvidia.com");
    assert_eq!(
        info.endpoint,
        d.plugin.join("dra.sock").display().to_string()
    );
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    r.notify_registration_status(reg::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .unwrap();

    // The agent publishes the profile's GPUs for this Node.
    eventually("slices for the node", 60, || async {
        (devices(&slices(&client, &node).await).len() == 3).then_some(())
    })
    .await;

    // kubelet's health stream reports every published device as healthy.
    let dra_sock = d.plugin.join("dra.sock");
    let mut h = health_pb::dra_resource_health_client::DraResourceHealthClient::new(
        connect_unix(&dra_sock).await.unwrap(),
    );
    let mut stream = h
        .node_watch_resources(health_pb::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let snapshot = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            let m = stream.message().await.unwrap().expect("stream open");
            if m.devices.len() == 3 {
                return m;
            }
        }
    })
    .await
    .expect("a health snapshot with 3 devices");
    let d0 = &snapshot.devices[0];
    assert_eq!(d0.device.as_ref().unwrap().pool_name, node);
    assert_eq!(d0.device.as_ref().unwrap().device_name, "gpu-0");
    assert_eq!(d0.health, health_pb::HealthStatus::Healthy as i32);
    drop(stream);

    let claims: Api<ResourceClaim> = ns.api();
    let ts = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}});
    let (good_uid, _) = claim(&claims, "good", Some((&node, "gpu-1")), Some(ts)).await;
    let (plain_uid, _) = claim(&claims, "plain", Some((&node, "gpu-2")), None).await;
    let (unalloc_uid, _) = claim(&claims, "unallocated", None, None).await;
    let other = unique("other-node");
    let (other_uid, _) = claim(&claims, "elsewhere", Some((&other, "gpu-0")), None).await;
    let bad = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                     "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long", "priority": 3}}});
    let (bad_uid, _) = claim(&claims, "badconfig", Some((&node, "gpu-0")), Some(bad)).await;

    let mut dra =
        v1::dra_plugin_client::DraPluginClient::new(connect_unix(&dra_sock).await.unwrap());
    let all = vec![
        v1_claim(&ns.name, "good", &good_uid),
        v1_claim(&ns.name, "plain", &plain_uid),
        v1_claim(&ns.name, "unallocated", &unalloc_uid),
        v1_claim(&ns.name, "elsewhere", &other_uid),
        v1_claim(&ns.name, "badconfig", &bad_uid),
        v1_claim(&ns.name, "plain", NOT_THE_UID),
    ];
    let resp = dra
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: all.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let good = &resp.claims[&good_uid];
    assert_eq!(good.error, "");
    assert_eq!(good.devices.len(), 1);
    assert_eq!(good.devices[0].pool_name, node);
    assert_eq!(good.devices[0].device_name, "gpu-1");
    assert_eq!(good.devices[0].request_names, ["gpu"]);
    assert_eq!(
        good.devices[0].cdi_device_ids,
        [format!("k8s.gpu.nvidia.com/claim={good_uid}-gpu-1")]
    );
    assert_eq!(resp.claims[&plain_uid].error, "");
    assert_eq!(
        resp.claims[&unalloc_uid].error,
        format!("claim {}/unallocated is not allocated", ns.name)
    );
    assert_eq!(
        resp.claims[&other_uid].error,
        format!(
            "claim {}/elsewhere is allocated to node {other}, not to this node {node}",
            ns.name
        )
    );
    assert!(
        resp.claims[&bad_uid]
            .error
            .contains("unknown field `priority`"),
        "{}",
        resp.claims[&bad_uid].error
    );
    assert!(
        resp.claims[NOT_THE_UID]
            .error
            .contains(&format!("kubelet asked for {NOT_THE_UID}")),
        "{}",
        resp.claims[NOT_THE_UID].error
    );

    // The CDI spec of the good claim.
    let spec_path = d
        .cdi
        .join(format!("k8s.gpu.nvidia.com_claim_{good_uid}.json"));
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&spec_path).unwrap()).unwrap();
    assert_eq!(spec["cdiVersion"], "0.6.0");
    assert_eq!(spec["kind"], "k8s.gpu.nvidia.com/claim");
    assert_eq!(spec["devices"][0]["name"], format!("{good_uid}-gpu-1"));
    assert_eq!(
        spec["devices"][0]["containerEdits"]["deviceNodes"],
        json!([{"path": "/dev/nvidia1"}])
    );
    let env: Vec<String> =
        serde_json::from_value(spec["devices"][0]["containerEdits"]["env"].clone()).unwrap();
    assert!(
        env.contains(&"DRA_GPU_GPU_1_UUID=GPU-1b2c3d4e-t10-0000-0000-000000000001".to_string()),
        "{env:?}"
    );
    assert!(
        env.contains(&"DRA_GPU_GPU_1_TIMESLICE_INTERVAL=Long".to_string()),
        "{env:?}"
    );
    assert_eq!(
        spec["containerEdits"]["deviceNodes"],
        json!([{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}, {"path": "/dev/nvidia-uvm-tools"}])
    );
    let mut files: Vec<_> = std::fs::read_dir(&d.cdi)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    let mut want = vec![
        format!("k8s.gpu.nvidia.com_claim_{good_uid}.json"),
        format!("k8s.gpu.nvidia.com_claim_{plain_uid}.json"),
    ];
    want.sort();
    assert_eq!(files, want, "only the successful claims have specs");

    // Idempotent: the same call gives the same answers.
    let two = vec![
        v1_claim(&ns.name, "good", &good_uid),
        v1_claim(&ns.name, "plain", &plain_uid),
    ];
    let again = dra
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: two.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.claims[&good_uid], resp.claims[&good_uid]);
    assert_eq!(again.claims[&plain_uid], resp.claims[&plain_uid]);

    // /metrics and /healthz.
    let (code, body) = http_get(&agent.http, "/healthz").await;
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let (code, metrics) = http_get(&agent.http, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        metrics.contains("dra_node_agent_published_devices 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("dra_node_agent_prepare_errors_total 4"),
        "{metrics}"
    );
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("dra_node_agent_prepare_duration_seconds_"))
    {
        eprintln!("measured: {line}");
    }
    assert!(
        metrics.contains("dra_node_agent_prepare_duration_seconds_count 8"),
        "{metrics}"
    );

    // kill -9 after prepare; a new agent gives the same answer, even with the claim gone
    // from the API server (it answers from the checkpoint).
    kill(&mut agent);
    let mut agent = start_agent(cluster, &node, &d);
    wait_for_socket(&reg_sock, &d.log).await;
    let mut dra =
        v1::dra_plugin_client::DraPluginClient::new(connect_unix(&dra_sock).await.unwrap());
    let after = dra
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: two.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after.claims[&good_uid], resp.claims[&good_uid]);

    // v1beta1 serves the same claims.
    let mut beta =
        v1beta1::dra_plugin_client::DraPluginClient::new(connect_unix(&dra_sock).await.unwrap());
    let b = beta
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
            claims: vec![v1beta1::Claim {
                namespace: ns.name.clone(),
                uid: plain_uid.clone(),
                name: "plain".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(b.claims[&plain_uid].devices[0].device_name, "gpu-2");

    // A corrupt checkpoint: reported, moved aside, specs removed, and prepare works again
    // (from the API server).
    kill(&mut agent);
    std::fs::write(d.plugin.join("checkpoint.json"), b"{\"version\":1,").unwrap();
    let mut agent = start_agent(cluster, &node, &d);
    wait_for_socket(&reg_sock, &d.log).await;
    let log = std::fs::read_to_string(&d.log).unwrap();
    assert!(log.contains("checkpoint is corrupt"), "{log}");
    assert!(d.plugin.join("checkpoint.corrupt").exists());
    assert_eq!(
        std::fs::read_dir(&d.cdi).unwrap().count(),
        0,
        "no stale CDI spec survives"
    );
    let mut dra =
        v1::dra_plugin_client::DraPluginClient::new(connect_unix(&dra_sock).await.unwrap());
    let recovered = dra
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: two.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(recovered.claims[&good_uid], resp.claims[&good_uid]);
    assert!(spec_path.exists());

    // Unprepare: the spec goes away; unknown claims are a success.
    let un = dra
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![
                v1_claim(&ns.name, "good", &good_uid),
                v1_claim(&ns.name, "ghost", NOT_THE_UID),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(un.claims[&good_uid].error, "");
    assert_eq!(un.claims[NOT_THE_UID].error, "");
    assert!(!spec_path.exists());
    assert!(
        d.cdi
            .join(format!("k8s.gpu.nvidia.com_claim_{plain_uid}.json"))
            .exists()
    );

    // SIGTERM: a clean stop removes the sockets.
    let pid = agent.child.id();
    Command::new("kill").arg(pid.to_string()).status().unwrap();
    let status = agent.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!reg_sock.exists() && !dra_sock.exists());
}

/// A DeviceClass for the claims (another test may have made it already).
async fn gpu_class(client: &kube::Client) {
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let _ = classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "gpu.nvidia.com"},
                "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}
            }))
            .unwrap(),
        )
        .await;
}

fn mps_config(config: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
           "sharing": {"strategy": "MPS", "mpsConfig": config}})
}

#[tokio::test]
async fn mps_config_from_a_claim_reaches_the_control_daemon_only_as_checked_values() {
    let cluster = TestCluster::shared();
    let client = cluster.client().await;
    let ns = cluster.namespace("agent-mps").await;
    let node = unique("kubelet-mps");
    create_node(&client, &node).await;
    gpu_class(&client).await;

    // A stand-in for nvidia-cuda-mps-control that records its calls and its input.
    let d = dirs();
    let calls = d.plugin.parent().unwrap().join("mps-calls.log");
    let script = d.plugin.parent().unwrap().join("mps-control");
    std::fs::create_dir_all(script.parent().unwrap()).unwrap();
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"args=$* visible=$CUDA_VISIBLE_DEVICES\" >> {log}\n\
             if [ \"$1\" != -d ]; then cat >> {log}; fi\n",
            log = calls.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut agent = start_agent_with(
        cluster,
        &node,
        &d,
        &["--mps-control-binary".as_ref(), script.as_os_str()],
    );
    let reg_sock = d.registry.join("gpu.nvidia.com-reg.sock");
    wait_for_socket(&reg_sock, &d.log).await;
    let dra_sock = d.plugin.join("dra.sock");

    let claims: Api<ResourceClaim> = ns.api();
    let good = mps_config(json!({
        "defaultActiveThreadPercentage": 40,
        "defaultPinnedDeviceMemoryLimit": "2Gi",
        "defaultPerDevicePinnedMemoryLimit": {"0": "1536Mi"},
    }));
    let (good_uid, _) = claim(&claims, "mps-good", Some((&node, "gpu-1")), Some(good)).await;
    let injections = [
        (
            "in-default",
            json!({"defaultPinnedDeviceMemoryLimit": "1Gi\nset_default_active_thread_percentage 100"}),
            "mpsConfig.defaultPinnedDeviceMemoryLimit \"1Gi\\nset_default_active_thread_percentage 100\": not a Kubernetes quantity: unexpected character '\\n'",
        ),
        (
            "in-key",
            json!({"defaultPerDevicePinnedMemoryLimit": {"0 1Gi\nquit\n0": "1Gi"}}),
            "mpsConfig.defaultPerDevicePinnedMemoryLimit key \"0 1Gi\\nquit\\n0\": not a device index, a GPU UUID or a device name",
        ),
        (
            "in-value",
            json!({"defaultPerDevicePinnedMemoryLimit": {"0": "1Gi\nquit"}}),
            "mpsConfig.defaultPerDevicePinnedMemoryLimit[0] \"1Gi\\nquit\": not a Kubernetes quantity: unexpected character '\\n'",
        ),
        (
            "negative",
            json!({"defaultPinnedDeviceMemoryLimit": "-1Gi"}),
            "mpsConfig.defaultPinnedDeviceMemoryLimit \"-1Gi\": negative",
        ),
        (
            "percent",
            json!({"defaultActiveThreadPercentage": "50%x"}),
            "mpsConfig.defaultActiveThreadPercentage \"50%x\": not an integer in 1..=100",
        ),
    ];
    let mut refused = Vec::new();
    for (name, config, _) in &injections {
        let (uid, _) = claim(
            &claims,
            name,
            Some((&node, "gpu-2")),
            Some(mps_config(config.clone())),
        )
        .await;
        refused.push(uid);
    }

    let mut dra =
        v1::dra_plugin_client::DraPluginClient::new(connect_unix(&dra_sock).await.unwrap());
    let mut refs = vec![v1_claim(&ns.name, "mps-good", &good_uid)];
    for ((name, _, _), uid) in injections.iter().zip(&refused) {
        refs.push(v1_claim(&ns.name, name, uid));
    }
    // What kubelet might send if it were confused: path characters in the reference itself.
    refs.push(v1_claim(&ns.name, "mps-good", "../../.."));
    refs.push(v1_claim(&ns.name, "../mps-good", NOT_THE_UID));
    let resp = dra
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: refs })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.claims[&good_uid].error, "");
    for ((name, _, cause), uid) in injections.iter().zip(&refused) {
        assert_eq!(
            resp.claims[uid].error,
            format!(
                "claim {}/{name}: FromClaim config for requests [gpu]: invalid GpuConfig: {cause}",
                ns.name
            )
        );
        assert!(resp.claims[uid].devices.is_empty());
    }
    assert_eq!(
        resp.claims["../../.."].error,
        format!(
            "claim {:?}/\"mps-good\": UID \"../../..\" is not an RFC 4122 UUID",
            ns.name
        )
    );
    assert_eq!(
        resp.claims[NOT_THE_UID].error,
        format!(
            "claim {}/\"../mps-good\": name \"../mps-good\" is not a DNS-1123 subdomain",
            ns.name
        )
    );

    // Only the good claim's daemon ran, and it was told exactly its typed settings.
    assert_eq!(
        std::fs::read_to_string(&calls).unwrap(),
        "args=-d visible=GPU-1b2c3d4e-t10-0000-0000-000000000001\n\
         args= visible=\n\
         set_default_active_thread_percentage 40\n\
         set_default_device_pinned_mem_limit 0 2048M\n\
         set_default_device_pinned_mem_limit 0 1536M\n"
    );
    let listing = |dir: &Path| {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    assert_eq!(listing(&d.plugin.join("mps")), [good_uid.as_str()]);
    assert_eq!(
        listing(&d.cdi),
        [format!("k8s.gpu.nvidia.com_claim_{good_uid}.json")]
    );
    let spec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            d.cdi
                .join(format!("k8s.gpu.nvidia.com_claim_{good_uid}.json")),
        )
        .unwrap(),
    )
    .unwrap();
    let env: Vec<String> = serde_json::from_value(spec["containerEdits"]["env"].clone()).unwrap();
    assert!(
        env.contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40".to_string()),
        "{env:?}"
    );

    // Unprepare quits the daemon; a UID of `..` would have meant the plugin directory.
    let un = dra
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![
                v1_claim(&ns.name, "mps-good", &good_uid),
                v1_claim(&ns.name, "mps-good", ".."),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(un.claims[&good_uid].error, "");
    assert_eq!(
        un.claims[".."].error,
        format!(
            "claim {:?}/\"mps-good\": UID \"..\" is not an RFC 4122 UUID",
            ns.name
        )
    );
    assert!(
        std::fs::read_to_string(&calls)
            .unwrap()
            .ends_with("args= visible=\nquit\n"),
        "told to quit, once"
    );
    assert!(listing(&d.plugin.join("mps")).is_empty());
    assert!(d.plugin.join("checkpoint.json").exists());
    assert!(dra_sock.exists());

    let pid = agent.child.id();
    Command::new("kill").arg(pid.to_string()).status().unwrap();
    assert!(agent.child.wait().unwrap().success());
}
