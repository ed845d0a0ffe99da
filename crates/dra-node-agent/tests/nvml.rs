//! The NVML backend on a real NVIDIA GPU, read-only: the GPUs it discovers agree with
//! `nvidia-smi` (a separate reading of the same driver), the slices it would publish name
//! them, and the health watch registers for XID and ECC events and keeps running.
//!
//! Ignored by default: it needs a GPU and the driver's `libnvidia-ml.so.1`. On a GPU
//! machine `scripts/gpu-check.sh` runs it (`cargo test -p dra-node-agent --test nvml --
//! --ignored`). It changes no GPU setting: no MIG mode, no compute mode, no time slice.

use std::process::Command;
use std::time::Duration;

use dra_node_agent::backend::GpuBackend;
use dra_node_agent::backend::nvml::NvmlBackend;
use dra_node_agent::device::Gpu;
use dra_node_agent::health::{DEFAULT_IGNORED_XIDS, HealthState};
use dra_node_agent::slices::{NodeRef, SliceContent, build_slices, pool_contents};

/// One GPU as `nvidia-smi --query-gpu` reports it.
#[derive(Debug)]
struct SmiGpu {
    uuid: String,
    name: String,
    /// `00000000:3B:00.0`, NVML's long form.
    bus_id: String,
    memory_mib: u64,
    compute_cap: String,
    driver_version: String,
    /// `Enabled`, `Disabled` or `[N/A]`.
    mig_mode: String,
}

const FIELDS: &str =
    "uuid,name,pci.bus_id,memory.total,compute_cap,driver_version,mig.mode.current";

fn nvidia_smi() -> Vec<SmiGpu> {
    let out = Command::new("nvidia-smi")
        .args([
            &format!("--query-gpu={FIELDS}"),
            "--format=csv,noheader,nounits",
        ])
        .output()
        .expect("nvidia-smi runs");
    assert!(out.status.success(), "nvidia-smi: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            assert_eq!(f.len(), 7, "{line}");
            SmiGpu {
                uuid: f[0].into(),
                name: f[1].into(),
                bus_id: f[2].into(),
                memory_mib: f[3].parse().unwrap_or_else(|_| panic!("{line}")),
                compute_cap: f[4].into(),
                driver_version: f[5].into(),
                mig_mode: f[6].into(),
            }
        })
        .collect()
}

fn discovered() -> Vec<Gpu> {
    let backend = NvmlBackend::new(None).expect("libnvidia-ml.so.1 loads");
    backend.discover().expect("NVML discovery")
}

/// The kernel's bus id (`0000:3b:00.0`) names the same function as NVML's long form.
fn same_bus(kernel: &str, nvml: &str) -> bool {
    nvml.to_ascii_lowercase().ends_with(kernel)
}

#[test]
#[ignore = "needs an NVIDIA GPU; scripts/gpu-check.sh runs it"]
fn every_gpu_nvidia_smi_lists_is_discovered_with_its_uuid_name_bus_memory_and_versions() {
    let smi = nvidia_smi();
    let gpus = discovered();
    assert!(!smi.is_empty(), "nvidia-smi lists no GPU");
    assert_eq!(gpus.len(), smi.len(), "{gpus:#?}\n{smi:#?}");
    for want in &smi {
        let gpu = gpus
            .iter()
            .find(|g| g.uuid == want.uuid)
            .unwrap_or_else(|| panic!("{} not discovered: {gpus:#?}", want.uuid));
        assert_eq!(gpu.product_name, want.name, "{gpu:#?}");
        assert!(same_bus(&gpu.pci_bus_id, &want.bus_id), "{gpu:#?} {want:?}");
        assert_eq!(gpu.memory_bytes >> 20, want.memory_mib, "{gpu:#?}");
        assert_eq!(gpu.cuda_compute_capability, want.compute_cap, "{gpu:#?}");
        assert_eq!(gpu.driver_version, want.driver_version, "{gpu:#?}");
        let mig = gpu.mig.as_ref().map(|m| m.enabled);
        match want.mig_mode.as_str() {
            "Enabled" => assert_eq!(mig, Some(true), "{gpu:#?}"),
            "Disabled" => assert_eq!(mig, Some(false), "{gpu:#?}"),
            _ => assert_eq!(mig, None, "{gpu:#?}"),
        }
        assert!(
            std::path::Path::new(&format!("/dev/nvidia{}", gpu.minor)).exists(),
            "the minor number names the device file: {gpu:#?}"
        );
        eprintln!("{gpu:#?}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU; scripts/gpu-check.sh runs it"]
fn the_slices_for_the_discovered_gpus_publish_each_by_minor_with_its_uuid() {
    let gpus = discovered();
    let node = NodeRef {
        name: "gpu-check".into(),
        uid: "00000000-0000-0000-0000-000000000001".into(),
    };
    let health = HealthState::new(DEFAULT_IGNORED_XIDS.iter().copied());
    let contents = pool_contents(&gpus, &health);
    let slices = build_slices(&node, "gpu.nvidia.com", &contents, 1);
    assert_eq!(slices.len(), contents.len());
    assert!(matches!(contents[0], SliceContent::Devices(_)));
    let devices: Vec<_> = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .collect();
    for gpu in &gpus {
        let name = format!("gpu-{}", gpu.minor);
        let device = devices
            .iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| panic!("{name} not published: {devices:#?}"));
        let uuid = device.attributes.as_ref().and_then(|a| a.get("uuid"));
        assert_eq!(
            uuid.and_then(|a| a.string.as_deref()),
            Some(gpu.uuid.as_str()),
            "{device:#?}"
        );
        assert_eq!(
            device.taints, None,
            "a healthy GPU carries no taint: {device:#?}"
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU; scripts/gpu-check.sh runs it"]
fn the_health_watch_registers_for_events_and_runs_past_its_first_poll_without_an_event() {
    let backend = NvmlBackend::new(None).expect("libnvidia-ml.so.1 loads");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    backend.watch_health(tx).expect("the event thread starts");
    // The watch waits 5 s for an event, then polls each GPU; a failed registration or
    // wait ends its thread, which closes the channel.
    std::thread::sleep(Duration::from_secs(7));
    match rx.try_recv() {
        Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {}
        other => panic!("a healthy GPU's watch should be quiet and running: {other:?}"),
    }
}
