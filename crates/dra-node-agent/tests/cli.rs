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
