//! The binary's behaviour without a cluster: NVML missing is a clear error naming the
//! library; `discover` prints the fake profile's slices; `prepare-dry-run` prints a plan.

use std::process::Command;

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dra-node-agent"))
}

fn profile(name: &str) -> String {
    format!("{}/profiles/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Whether this machine has the NVIDIA driver: the device node it creates when loaded.
fn nvidia_driver_present() -> bool {
    std::path::Path::new("/dev/nvidiactl").exists()
}

const NVML_MISSING: &str = "error: libnvidia-ml.so.1 could not be loaded: ";
const WAY_OUT: &str =
    "(run on a node with the NVIDIA driver, or pass --backend fake --fake-profile FILE)";

/// Both kinds of machine are asserted on: without the driver NVML cannot load and the agent
/// names the library; with it the real backend lists the GPUs, or, where NVML still cannot be
/// used (a container without the library), the agent says why in the same words.
#[test]
fn discover_finds_the_real_gpus_or_says_why_not() {
    let out = agent()
        .args(["--node-name", "n1", "discover"])
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let slices = String::from_utf8_lossy(&out.stdout);
    if !nvidia_driver_present() {
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(NVML_MISSING) && err.contains(WAY_OUT), "{err}");
    } else if out.status.success() {
        assert!(
            err.contains("gpu-0: "),
            "no GPU listed on a machine with the driver: {err}"
        );
        assert!(
            slices.contains("kind: ResourceSlice") && slices.contains("driver: gpu.nvidia.com"),
            "{slices}"
        );
    } else {
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.starts_with("error: ") && err.contains(WAY_OUT),
            "the driver is here but NVML failed without saying why: {err}"
        );
    }
}

/// `run` loads the backend before it looks for a cluster, so with no cluster it stops at the
/// first that is missing, and says which.
#[test]
fn run_without_a_cluster_names_what_is_missing() {
    let out = agent()
        .args(["--node-name", "n1"])
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let no_cluster = "error: no --kubeconfig and not running in a cluster";
    if nvidia_driver_present() {
        assert!(
            err.contains(no_cluster) || (err.starts_with("error: ") && err.contains(WAY_OUT)),
            "{err}"
        );
    } else {
        assert!(err.contains(NVML_MISSING) && err.contains(WAY_OUT), "{err}");
    }
}

#[test]
fn node_name_is_required_to_run() {
    let out = agent()
        .args([
            "--backend",
            "fake",
            "--fake-profile",
            &profile("1x-a5000-2x-t10.yaml"),
        ])
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("the node name is required: pass --node-name or set NODE_NAME")
    );
}

#[test]
fn discover_prints_the_shipped_slices() {
    let out = agent()
        .args([
            "--backend",
            "fake",
            "--fake-profile",
            &profile("4x-a100-40gb-mig.yaml"),
        ])
        .args(["--node-name", "a100-node", "discover"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let golden = std::fs::read_to_string(profile("slices/4x-a100-40gb-mig.yaml")).unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), golden);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("gpu-3: NVIDIA A100-SXM4-40GB") && err.contains("mig=enabled (5 profiles)"),
        "{err}"
    );
}

#[test]
fn prepare_dry_run_prints_devices_and_cdi_spec() {
    let dir = tempfile::tempdir().unwrap();
    let claim = dir.path().join("claim.yaml");
    std::fs::write(
        &claim,
        r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: c, namespace: ns, uid: 5d9c2b1a-7e3f-4a6b-8c0d-1e2f3a4b5c6d}
spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}
status:
  allocation:
    devices:
      results: [{request: gpu, driver: gpu.nvidia.com, pool: n1, device: gpu-5}]
"#,
    )
    .unwrap();
    let out = agent()
        .args([
            "--backend",
            "fake",
            "--fake-profile",
            &profile("8x-h100-80gb-2numa-2nic.yaml"),
        ])
        .args(["--cdi-dir", "/cdi", "prepare-dry-run", "--claim"])
        .arg(&claim)
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["devices"][0]["cdiDeviceIds"][0],
        "k8s.gpu.nvidia.com/claim=5d9c2b1a-7e3f-4a6b-8c0d-1e2f3a4b5c6d-gpu-5"
    );
    assert_eq!(
        v["cdiSpecFile"],
        "/cdi/k8s.gpu.nvidia.com_claim_5d9c2b1a-7e3f-4a6b-8c0d-1e2f3a4b5c6d.json"
    );
    assert_eq!(
        v["cdiSpec"]["devices"][0]["containerEdits"]["deviceNodes"][0]["path"],
        "/dev/nvidia5"
    );
}

/// `run` on the fake backend, with an API server that never answers: the agent starts,
/// serves /metrics, and logs in `log_format` until SIGTERM. Returns what it wrote on stderr
/// and its /metrics.
fn run_against_nobody(log_format: &str) -> (String, String) {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let api_port = test_cluster::free_port();
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:{api_port}'}}}}]\n\
             users: [{{name: u, user: {{token: t}}}}]\n\
             contexts: [{{name: c, context: {{cluster: c, user: u}}}}]\n"
        ),
    )
    .unwrap();
    let http = format!("127.0.0.1:{}", test_cluster::free_port());
    let mut cmd = agent();
    cmd.args([
        "--node-name",
        "n1",
        "--backend",
        "fake",
        "--log-format",
        log_format,
    ])
    .args(["--fake-profile", &profile("1x-a5000-2x-t10.yaml")])
    .args(["--http-address", &http])
    .arg("--kubeconfig")
    .arg(&kubeconfig);
    for (flag, sub) in [
        ("--plugin-dir", "plugin"),
        ("--registry-dir", "registry"),
        ("--cdi-dir", "cdi"),
    ] {
        let path = dir.path().join(sub);
        std::fs::create_dir_all(&path).unwrap();
        cmd.arg(flag).arg(path);
    }
    let mut child = cmd
        .env("RUST_LOG", "")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // The discovery line, the HTTP address, then the publisher failing to reach nobody.
    let mut seen: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen
        .iter()
        .filter(|l| l.contains("serving /metrics"))
        .count()
        == 0
        || seen.len() < 4
    {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!("the agent wrote too little in 30 s: {seen:#?}");
            }
        }
    }
    let metrics = Command::new("curl")
        .args(["-sf", &format!("http://{http}/metrics")])
        .output()
        .unwrap();
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let _ = child.wait();
    seen.extend(rx.try_iter());
    assert!(metrics.status.success(), "/metrics: {seen:#?}");
    (
        seen.iter().map(|l| format!("{l}\n")).collect(),
        String::from_utf8(metrics.stdout).unwrap(),
    )
}

#[test]
fn json_logs_are_one_object_a_line_with_one_message_and_fields_as_keys() {
    let (log, _) = run_against_nobody("json");
    let mut discovered = 0;
    for line in log.lines() {
        let object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON object ({e}): {line}"));
        assert_eq!(line.matches("\"message\":").count(), 1, "{line}");
        for key in ["timestamp", "level", "message", "target"] {
            assert!(object.contains_key(key), "{key} missing: {line}");
        }
        if object["message"] == "discovered GPUs" {
            discovered += 1;
            assert_eq!(object["node"], "n1", "{line}");
            assert_eq!(object["gpus"], 3, "a number stays a number: {line}");
            assert_eq!(object["backend"], "fake", "{line}");
        }
    }
    assert_eq!(discovered, 1, "{log}");
}

#[test]
fn text_logs_carry_no_colour_codes_when_stderr_is_not_a_terminal() {
    let (log, _) = run_against_nobody("text");
    assert!(
        log.lines()
            .any(|l| l.contains(" INFO ") && l.contains("discovered GPUs")),
        "{log}"
    );
    assert!(!log.contains('\x1b'), "colour codes in a pipe: {log:?}");
}

#[test]
fn metrics_follow_prometheus_conventions_and_name_the_build() {
    let (_, text) = run_against_nobody("text");
    assert_eq!(
        test_cluster::promlint(&text),
        Vec::<String>::new(),
        "{text}"
    );
    let build_info = format!(
        "dra_node_agent_build_info{{git_commit=\"{}\",rustc_version=\"{}\",version=\"{}\"}} 1\n",
        dra_telemetry::GIT_COMMIT,
        dra_telemetry::RUSTC_VERSION,
        env!("CARGO_PKG_VERSION")
    );
    assert!(text.contains(&build_info), "{text}");
    for family in [
        "prepare_duration_seconds histogram",
        "prepare_errors_total counter",
        "published_devices gauge",
    ] {
        assert!(
            text.contains(&format!("# TYPE dra_node_agent_{family}\n")),
            "{family}: {text}"
        );
    }
}
