//! The NVML backend: libnvidia-ml is loaded with dlopen when the backend is created, so the
//! same binary runs on nodes without a GPU (with `--backend fake`) and fails with a message
//! naming the library when NVML is missing.
//!
//! PCIe root and NUMA node come from sysfs (`/sys/bus/pci/devices/<bus id>`), as NVML does
//! not report them. MIG: the current mode is reported; on GPUs with MIG enabled the
//! GPU-instance profiles and their possible placements are read with the raw NVML calls
//! (nvml-wrapper 0.13 does not wrap them), so partitions are published as on NVIDIA's driver.

use super::{BackendError, GpuBackend};
use crate::config::{Sharing, SharingStrategy};
use crate::device::{Gpu, MigEngines, MigInfo, MigInstance, MigProfile};
use crate::health::HealthEvent;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

/// The library NVML is loaded from.
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

pub struct NvmlBackend {
    nvml: Arc<Nvml>,
    sysfs: std::path::PathBuf,
}

fn nvml_err(call: &str) -> impl Fn(NvmlError) -> BackendError + '_ {
    move |e| BackendError::Nvml {
        call: call.to_string(),
        reason: e.to_string(),
    }
}

impl NvmlBackend {
    /// Loads and initialises NVML: from the driver root when one is given and holds
    /// [`NVML_LIBRARY`] (see [`super::driver_root`]), else by name through the dynamic
    /// loader's search path (where the NVIDIA container runtime puts it).
    pub fn new(driver_root: Option<&Path>) -> Result<NvmlBackend, BackendError> {
        let found =
            driver_root.and_then(|root| super::driver_root::find_library(root, NVML_LIBRARY));
        let mut builder = Nvml::builder();
        if let Some(path) = &found {
            builder.lib_path(path.as_os_str());
        }
        let nvml = builder.init().map_err(|e| match e {
            NvmlError::LibloadingError(inner) => BackendError::LibraryMissing {
                library: match (&found, driver_root) {
                    (Some(path), _) => path.display().to_string(),
                    (None, Some(root)) => format!(
                        "{NVML_LIBRARY} (not in {} under the driver root {}, nor on the loader's path)",
                        super::driver_root::LIBRARY_DIRS.join(", "),
                        root.display()
                    ),
                    (None, None) => NVML_LIBRARY.into(),
                },
                reason: inner.to_string(),
            },
            NvmlError::DriverNotLoaded => BackendError::LibraryMissing {
                library: NVML_LIBRARY.into(),
                reason: "the NVIDIA kernel driver is not loaded".into(),
            },
            other => BackendError::Nvml {
                call: "nvmlInit_v2".into(),
                reason: other.to_string(),
            },
        })?;
        tracing::info!(
            library = %found.as_deref().map_or(NVML_LIBRARY.into(), |p| p.display().to_string()),
            "loaded NVML"
        );
        Ok(NvmlBackend {
            nvml: Arc::new(nvml),
            sysfs: "/sys/bus/pci/devices".into(),
        })
    }
}

/// NVML's bus id (`00000000:3B:00.0`) in the kernel's form (`0000:3b:00.0`).
pub fn kernel_bus_id(nvml_bus_id: &str) -> String {
    let lower = nvml_bus_id.to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => lower,
    }
}

/// The PCIe root complex of a device, from the sysfs path it resolves to:
/// `/sys/devices/pci0000:3a/0000:3a:00.0/.../0000:3b:00.0` → `pci0000:3a`.
pub fn pcie_root_from_sysfs(resolved: &Path) -> Option<String> {
    resolved
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .find(|s| s.starts_with("pci") && s.len() > 3)
        .map(str::to_string)
}

/// NUMA node from sysfs: `-1` (no NUMA information) means unknown.
pub fn numa_from_sysfs(text: &str) -> Option<i64> {
    text.trim().parse::<i64>().ok().filter(|n| *n >= 0)
}

impl GpuBackend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn discover(&self) -> Result<Vec<Gpu>, BackendError> {
        let n = &self.nvml;
        let driver_version = n
            .sys_driver_version()
            .map_err(nvml_err("nvmlSystemGetDriverVersion"))?;
        let cuda = n
            .sys_cuda_driver_version()
            .map_err(nvml_err("nvmlSystemGetCudaDriverVersion"))?;
        let cuda_driver_version = format!("{}.{}", cuda / 1000, (cuda % 1000) / 10);
        let count = n.device_count().map_err(nvml_err("nvmlDeviceGetCount"))?;
        let mut gpus = Vec::new();
        // One GPU that stops answering must not hide the others: it is left out (and so
        // removed from the pool), with a warning naming it.
        let one = |i: u32| -> Result<Gpu, BackendError> {
            let d = n
                .device_by_index(i)
                .map_err(nvml_err("nvmlDeviceGetHandleByIndex"))?;
            let pci = d.pci_info().map_err(nvml_err("nvmlDeviceGetPciInfo"))?;
            let bus = kernel_bus_id(&pci.bus_id);
            let sys = self.sysfs.join(&bus);
            let cc = d
                .cuda_compute_capability()
                .map_err(nvml_err("nvmlDeviceGetCudaComputeCapability"))?;
            let mig = match d.mig_mode() {
                Ok(mode) if mode.current == 1 => Some(mig_profiles(n, &d)),
                Ok(_) => Some(MigInfo {
                    enabled: false,
                    memory_slices: 0,
                    engines: MigEngines::default(),
                    profiles: Vec::new(),
                }),
                Err(NvmlError::NotSupported) => None,
                Err(e) => return Err(nvml_err("nvmlDeviceGetMigMode")(e)),
            };
            Ok(Gpu {
                minor: d
                    .minor_number()
                    .map_err(nvml_err("nvmlDeviceGetMinorNumber"))?,
                uuid: d.uuid().map_err(nvml_err("nvmlDeviceGetUUID"))?,
                product_name: d.name().map_err(nvml_err("nvmlDeviceGetName"))?,
                brand: format!("{:?}", d.brand().map_err(nvml_err("nvmlDeviceGetBrand"))?),
                architecture: d
                    .architecture()
                    .map_err(nvml_err("nvmlDeviceGetArchitecture"))?
                    .to_string(),
                cuda_compute_capability: format!("{}.{}", cc.major, cc.minor),
                driver_version: driver_version.clone(),
                cuda_driver_version: cuda_driver_version.clone(),
                pci_bus_id: bus,
                pcie_root: std::fs::canonicalize(&sys)
                    .ok()
                    .and_then(|p| pcie_root_from_sysfs(&p)),
                numa_node: std::fs::read_to_string(sys.join("numa_node"))
                    .ok()
                    .and_then(|t| numa_from_sysfs(&t)),
                memory_bytes: d
                    .memory_info()
                    .map_err(nvml_err("nvmlDeviceGetMemoryInfo"))?
                    .total,
                mig,
            })
        };
        for i in 0..count {
            match one(i) {
                Ok(gpu) => gpus.push(gpu),
                Err(e) => tracing::warn!(index = i, error = %e, "skipping a GPU NVML cannot read"),
            }
        }
        gpus.sort_by_key(|g| g.minor);
        Ok(gpus)
    }

    fn watch_health(&self, events: UnboundedSender<HealthEvent>) -> Result<(), BackendError> {
        let nvml = self.nvml.clone();
        std::thread::Builder::new()
            .name("nvml-events".into())
            .spawn(move || {
                if let Err(e) = watch_events(&nvml, &events) {
                    tracing::error!(error = %e, "NVML health watch stopped");
                }
            })
            .map_err(|e| BackendError::Nvml {
                call: "spawn event thread".into(),
                reason: e.to_string(),
            })?;
        Ok(())
    }

    fn apply_sharing(&self, gpu: &Gpu, sharing: &Sharing) -> Result<(), BackendError> {
        match sharing.strategy {
            SharingStrategy::TimeSlicing => {
                let interval = sharing
                    .time_slicing_config
                    .as_ref()
                    .map(|t| t.interval)
                    .unwrap_or_default();
                set_timeslice(gpu, interval.nvml_value())
            }
            // The claim's MPS control daemon is started by the preparer (crate::mps).
            SharingStrategy::Mps => Ok(()),
        }
    }

    fn reset_sharing(&self, gpu: &Gpu) -> Result<(), BackendError> {
        set_timeslice(gpu, 0)
    }

    fn create_mig(
        &self,
        gpu: &Gpu,
        profile: &MigProfile,
        start: u32,
    ) -> Result<MigInstance, BackendError> {
        let device = self
            .nvml
            .device_by_uuid(gpu.uuid.as_str())
            .map_err(nvml_err("nvmlDeviceGetHandleByUUID"))?;
        // SAFETY: the handle belongs to `self.nvml`, which outlives this call.
        let handle = unsafe { device.handle() };
        let mut instance = mig::create(&self.nvml, handle, gpu.minor, profile.profile_id, start)?;
        instance.device_name = profile.device_name(gpu.minor, start);
        let minors = std::fs::read_to_string(MIG_MINORS).unwrap_or_default();
        instance.device_nodes = crate::device::mig_cap_device_nodes(
            &minors,
            gpu.minor,
            instance.gpu_instance_id,
            instance.compute_instance_id,
        )
        .ok_or_else(|| BackendError::Mig {
            gpu: gpu.minor,
            reason: format!(
                "no capability device for gi{} ci{} in {MIG_MINORS}",
                instance.gpu_instance_id, instance.compute_instance_id
            ),
        })?;
        Ok(instance)
    }

    fn destroy_mig(&self, gpu: &Gpu, instance: &MigInstance) -> Result<(), BackendError> {
        let device = self
            .nvml
            .device_by_uuid(gpu.uuid.as_str())
            .map_err(nvml_err("nvmlDeviceGetHandleByUUID"))?;
        // SAFETY: the handle belongs to `self.nvml`, which outlives this call.
        let handle = unsafe { device.handle() };
        mig::destroy(&self.nvml, handle, gpu.minor, instance)
    }
}

/// Where the driver lists the capability device minors of MIG instances.
const MIG_MINORS: &str = "/proc/driver/nvidia-caps/mig-minors";

/// Creating and destroying MIG partitions with raw NVML calls (nvml-wrapper has no safe
/// wrappers for GPU and compute instances).
mod mig {
    use super::{BackendError, MigInstance, Nvml};
    use nvml_wrapper_sys::bindings as sys;

    fn check(gpu: u32, call: &str, rc: sys::nvmlReturn_t) -> Result<(), BackendError> {
        if rc == sys::nvmlReturn_enum_NVML_SUCCESS {
            Ok(())
        } else {
            Err(BackendError::Mig {
                gpu,
                reason: format!("{call} returned NVML error {rc}"),
            })
        }
    }

    fn missing(gpu: u32, call: &str) -> BackendError {
        BackendError::Mig {
            gpu,
            reason: format!("this libnvidia-ml has no {call}"),
        }
    }

    /// A GPU instance at the placement, then the largest compute instance it supports.
    pub fn create(
        nvml: &Nvml,
        device: sys::nvmlDevice_t,
        gpu: u32,
        profile_id: u32,
        start: u32,
    ) -> Result<MigInstance, BackendError> {
        let lib = nvml.lib();
        let create_gi = lib
            .nvmlDeviceCreateGpuInstanceWithPlacement
            .as_ref()
            .map_err(|_| missing(gpu, "nvmlDeviceCreateGpuInstanceWithPlacement"))?;
        let gi_info = lib
            .nvmlGpuInstanceGetInfo
            .as_ref()
            .map_err(|_| missing(gpu, "nvmlGpuInstanceGetInfo"))?;
        let ci_profile = lib
            .nvmlGpuInstanceGetComputeInstanceProfileInfo
            .as_ref()
            .map_err(|_| missing(gpu, "nvmlGpuInstanceGetComputeInstanceProfileInfo"))?;
        let create_ci = lib
            .nvmlGpuInstanceCreateComputeInstance
            .as_ref()
            .map_err(|_| missing(gpu, "nvmlGpuInstanceCreateComputeInstance"))?;
        let ci_info = lib
            .nvmlComputeInstanceGetInfo_v2
            .as_ref()
            .map_err(|_| missing(gpu, "nvmlComputeInstanceGetInfo_v2"))?;
        let destroy_gi = lib
            .nvmlGpuInstanceDestroy
            .as_ref()
            .map_err(|_| missing(gpu, "nvmlGpuInstanceDestroy"))?;

        let placement = sys::nvmlGpuInstancePlacement_t { start, size: 0 };
        let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: valid device handle, a placement struct and an out pointer.
        check(gpu, "nvmlDeviceCreateGpuInstanceWithPlacement", unsafe {
            create_gi(device, profile_id, &placement, &mut gi)
        })?;
        let made = (|| {
            // SAFETY: a zeroed plain C struct filled by NVML.
            let mut info: sys::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: `gi` was just created; `info` is a valid out pointer.
            check(gpu, "nvmlGpuInstanceGetInfo", unsafe {
                gi_info(gi, &mut info)
            })?;
            // The compute-instance profile that fills the GPU instance: the largest one.
            let mut best: Option<sys::nvmlComputeInstanceProfileInfo_t> = None;
            for index in 0..sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
                // SAFETY: as above.
                let mut p: sys::nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
                // SAFETY: valid instance handle and out pointer.
                let rc = unsafe {
                    ci_profile(
                        gi,
                        index,
                        sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                        &mut p,
                    )
                };
                if rc == sys::nvmlReturn_enum_NVML_SUCCESS
                    && best.is_none_or(|b| p.sliceCount > b.sliceCount)
                {
                    best = Some(p);
                }
            }
            let best = best.ok_or_else(|| BackendError::Mig {
                gpu,
                reason: "the GPU instance offers no compute-instance profile".into(),
            })?;
            let mut ci: sys::nvmlComputeInstance_t = std::ptr::null_mut();
            // SAFETY: valid instance handle, profile id from NVML, out pointer.
            check(gpu, "nvmlGpuInstanceCreateComputeInstance", unsafe {
                create_ci(gi, best.id, &mut ci)
            })?;
            // SAFETY: as above.
            let mut cinfo: sys::nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: `ci` was just created; out pointer.
            check(gpu, "nvmlComputeInstanceGetInfo_v2", unsafe {
                ci_info(ci, &mut cinfo)
            })?;
            let uuid = mig_device_uuid(nvml, device, gpu, info.id, cinfo.id)?;
            Ok(MigInstance {
                device_name: String::new(),
                parent_minor: gpu,
                gpu_instance_id: info.id,
                compute_instance_id: cinfo.id,
                uuid,
                device_nodes: Vec::new(),
            })
        })();
        if made.is_err() {
            // Leave nothing half made: the GPU instance goes (with any compute instance).
            // SAFETY: `gi` is a live instance handle.
            let _ = unsafe { destroy_gi(gi) };
        }
        made
    }

    /// The UUID of the MIG device with these GPU and compute instance ids.
    fn mig_device_uuid(
        nvml: &Nvml,
        device: sys::nvmlDevice_t,
        gpu: u32,
        gi: u32,
        ci: u32,
    ) -> Result<String, BackendError> {
        let lib = nvml.lib();
        let (Ok(max), Ok(by_index), Ok(gi_id), Ok(ci_id), Ok(uuid)) = (
            lib.nvmlDeviceGetMaxMigDeviceCount.as_ref(),
            lib.nvmlDeviceGetMigDeviceHandleByIndex.as_ref(),
            lib.nvmlDeviceGetGpuInstanceId.as_ref(),
            lib.nvmlDeviceGetComputeInstanceId.as_ref(),
            lib.nvmlDeviceGetUUID.as_ref(),
        ) else {
            return Err(missing(gpu, "the MIG device handle calls"));
        };
        let mut count = 0;
        // SAFETY: valid handle, out pointer.
        check(gpu, "nvmlDeviceGetMaxMigDeviceCount", unsafe {
            max(device, &mut count)
        })?;
        for index in 0..count {
            let mut mig: sys::nvmlDevice_t = std::ptr::null_mut();
            // SAFETY: valid handle, index below the maximum, out pointer.
            if unsafe { by_index(device, index, &mut mig) } != sys::nvmlReturn_enum_NVML_SUCCESS {
                continue;
            }
            let (mut g, mut c) = (0, 0);
            // SAFETY: `mig` is a MIG device handle from NVML; out pointers.
            let ids = unsafe { (gi_id(mig, &mut g), ci_id(mig, &mut c)) };
            if ids
                != (
                    sys::nvmlReturn_enum_NVML_SUCCESS,
                    sys::nvmlReturn_enum_NVML_SUCCESS,
                )
                || (g, c) != (gi, ci)
            {
                continue;
            }
            let mut buf = [0 as std::os::raw::c_char; 96];
            // SAFETY: the buffer is larger than NVML's UUID buffer size (80).
            check(gpu, "nvmlDeviceGetUUID", unsafe {
                uuid(mig, buf.as_mut_ptr(), buf.len() as u32)
            })?;
            // SAFETY: NVML wrote a NUL-terminated string into the buffer.
            let text = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
            return Ok(text.to_string_lossy().into_owned());
        }
        Err(BackendError::Mig {
            gpu,
            reason: format!("no MIG device for gi{gi} ci{ci}"),
        })
    }

    /// The compute instance, then the GPU instance. Instances already gone are fine.
    pub fn destroy(
        nvml: &Nvml,
        device: sys::nvmlDevice_t,
        gpu: u32,
        instance: &MigInstance,
    ) -> Result<(), BackendError> {
        let lib = nvml.lib();
        let (Ok(gi_by_id), Ok(ci_by_id), Ok(destroy_ci), Ok(destroy_gi)) = (
            lib.nvmlDeviceGetGpuInstanceById.as_ref(),
            lib.nvmlGpuInstanceGetComputeInstanceById.as_ref(),
            lib.nvmlComputeInstanceDestroy.as_ref(),
            lib.nvmlGpuInstanceDestroy.as_ref(),
        ) else {
            return Err(missing(gpu, "the MIG destroy calls"));
        };
        let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: valid handle, out pointer.
        let rc = unsafe { gi_by_id(device, instance.gpu_instance_id, &mut gi) };
        if rc == sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND {
            return Ok(());
        }
        check(gpu, "nvmlDeviceGetGpuInstanceById", rc)?;
        let mut ci: sys::nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: `gi` is a live instance handle; out pointer.
        let rc = unsafe { ci_by_id(gi, instance.compute_instance_id, &mut ci) };
        if rc == sys::nvmlReturn_enum_NVML_SUCCESS {
            // SAFETY: `ci` is a live compute instance handle.
            check(gpu, "nvmlComputeInstanceDestroy", unsafe { destroy_ci(ci) })?;
        } else if rc != sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND {
            check(gpu, "nvmlGpuInstanceGetComputeInstanceById", rc)?;
        }
        // SAFETY: `gi` is a live instance handle.
        check(gpu, "nvmlGpuInstanceDestroy", unsafe { destroy_gi(gi) })
    }
}

/// The GPU-instance profiles of a MIG-enabled GPU with their possible placements. A call
/// that fails leaves that profile out (logged): the GPU is still published whole.
fn mig_profiles(nvml: &Nvml, device: &nvml_wrapper::Device<'_>) -> MigInfo {
    use nvml_wrapper_sys::bindings as sys;
    let lib = nvml.lib();
    // SAFETY: the handle belongs to `nvml`, which outlives this call.
    let handle = unsafe { device.handle() };
    let mut profiles = Vec::new();
    let mut engines = MigEngines::default();
    let mut memory_slices = 0;
    let (Ok(info_v), Ok(placements_v2)) = (
        lib.nvmlDeviceGetGpuInstanceProfileInfoV.as_ref(),
        lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2.as_ref(),
    ) else {
        tracing::warn!(
            "this libnvidia-ml has no GPU-instance profile calls: MIG partitions not published"
        );
        return MigInfo {
            enabled: true,
            memory_slices: 0,
            engines,
            profiles,
        };
    };
    for index in 0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
        // SAFETY: a zeroed plain C struct with its version set, as nvml.h asks.
        let mut info: sys::nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
        info.version =
            (std::mem::size_of::<sys::nvmlGpuInstanceProfileInfo_v2_t>() as u32) | (2 << 24);
        // SAFETY: valid handle and a pointer to a properly sized, versioned struct.
        if unsafe { info_v(handle, index, &mut info) } != sys::nvmlReturn_enum_NVML_SUCCESS {
            continue; // profile not supported on this GPU
        }
        let mut count: u32 = 0;
        // SAFETY: a null array asks for the count only.
        let rc = unsafe { placements_v2(handle, info.id, std::ptr::null_mut(), &mut count) };
        if rc != sys::nvmlReturn_enum_NVML_SUCCESS || count == 0 {
            continue;
        }
        let mut raw = vec![sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
        // SAFETY: the array has room for `count` placements.
        let rc = unsafe { placements_v2(handle, info.id, raw.as_mut_ptr(), &mut count) };
        if rc != sys::nvmlReturn_enum_NVML_SUCCESS {
            tracing::warn!(profile_id = info.id, rc, "reading MIG placements failed");
            continue;
        }
        raw.truncate(count as usize);
        // SAFETY: NVML writes a NUL-terminated name into the fixed array.
        let name = unsafe { std::ffi::CStr::from_ptr(info.name.as_ptr()) }
            .to_string_lossy()
            .trim_start_matches("MIG ")
            .to_string();
        let e = MigEngines {
            multiprocessors: info.multiprocessorCount,
            copy_engines: info.copyEngineCount,
            decoders: info.decoderCount,
            encoders: info.encoderCount,
            jpeg_engines: info.jpegCount,
            ofa_engines: info.ofaCount,
        };
        // The GPU's shared counters are the most any one partition can use.
        engines = MigEngines {
            multiprocessors: engines.multiprocessors.max(e.multiprocessors),
            copy_engines: engines.copy_engines.max(e.copy_engines),
            decoders: engines.decoders.max(e.decoders),
            encoders: engines.encoders.max(e.encoders),
            jpeg_engines: engines.jpeg_engines.max(e.jpeg_engines),
            ofa_engines: engines.ofa_engines.max(e.ofa_engines),
        };
        memory_slices = raw
            .iter()
            .map(|p| p.start + p.size)
            .fold(memory_slices, u32::max);
        let size = raw.first().map_or(info.sliceCount, |p| p.size);
        profiles.push(MigProfile {
            name,
            profile_id: info.id,
            memory_bytes: info.memorySizeMB * 1024 * 1024,
            memory_slices: size,
            engines: e,
            placements: raw.iter().map(|p| p.start).collect(),
        });
    }
    MigInfo {
        enabled: true,
        memory_slices,
        engines,
        profiles,
    }
}

/// NVML has no wrapped call for the time-slice policy; nvidia-smi sets it.
fn set_timeslice(gpu: &Gpu, value: u32) -> Result<(), BackendError> {
    let out = std::process::Command::new("nvidia-smi")
        .args([
            "compute-policy",
            "-i",
            &gpu.uuid,
            &format!("--set-timeslice={value}"),
        ])
        .output()
        .map_err(|e| BackendError::Sharing {
            gpu: gpu.device_name(),
            reason: format!("running nvidia-smi: {e}"),
        })?;
    if !out.status.success() {
        return Err(BackendError::Sharing {
            gpu: gpu.device_name(),
            reason: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

fn watch_events(nvml: &Nvml, tx: &UnboundedSender<HealthEvent>) -> Result<(), NvmlError> {
    let mut set = nvml.create_event_set()?;
    let count = nvml.device_count()?;
    let mut minors = Vec::new();
    for i in 0..count {
        let d = nvml.device_by_index(i)?;
        let minor = d.minor_number()?;
        minors.push((d.uuid()?, minor));
        let supported = d.supported_event_types().unwrap_or(EventTypes::empty());
        let wanted =
            supported & (EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR);
        if !wanted.is_empty() {
            set = d.register_events(wanted, set).map_err(|e| e.error)?;
        }
    }
    loop {
        match set.wait(5000) {
            Ok(ev) => {
                let uuid = ev.device.uuid().unwrap_or_default();
                let Some(&(_, minor)) = minors.iter().find(|(u, _)| *u == uuid) else {
                    continue;
                };
                let event = if ev.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                    HealthEvent::Ecc { minor }
                } else {
                    match ev.event_data {
                        Some(XidError::Value(xid)) => HealthEvent::Xid { minor, xid },
                        _ => continue,
                    }
                };
                if tx.send(event).is_err() {
                    return Ok(());
                }
            }
            Err(NvmlError::Timeout) => {
                // Poll each GPU: one that stopped answering is lost.
                for (uuid, minor) in &minors {
                    if let Err(NvmlError::GpuLost) = nvml.device_by_uuid(uuid.as_str()) {
                        let _ = tx.send(HealthEvent::Lost { minor: *minor });
                    }
                }
                if tx.is_closed() {
                    return Ok(());
                }
            }
            Err(NvmlError::GpuLost) => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_id_is_converted_to_kernel_form() {
        assert_eq!(kernel_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
        assert_eq!(kernel_bus_id("0000:3b:00.0"), "0000:3b:00.0");
    }

    #[test]
    fn pcie_root_comes_from_the_resolved_sysfs_path() {
        let p = Path::new("/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0");
        assert_eq!(pcie_root_from_sysfs(p).as_deref(), Some("pci0000:3a"));
        assert_eq!(
            pcie_root_from_sysfs(Path::new("/sys/devices/platform/x")),
            None
        );
    }

    #[test]
    fn unknown_numa_is_none() {
        assert_eq!(numa_from_sysfs("-1\n"), None);
        assert_eq!(numa_from_sysfs("1\n"), Some(1));
    }

    /// No GPU here: loading NVML fails with a message naming the library.
    #[test]
    fn missing_library_is_named() {
        if std::path::Path::new("/dev/nvidiactl").exists() {
            return; // a GPU machine: nothing to check here
        }
        let err = NvmlBackend::new(None)
            .err()
            .expect("no NVML on this machine");
        let msg = err.to_string();
        assert!(
            msg.starts_with("libnvidia-ml.so.1 could not be loaded: "),
            "{msg}"
        );
    }

    /// With a driver root, the library found there is the one loaded (a stand-in that is
    /// not an ELF file here, so loading it fails naming that path); a root without it says
    /// where it was looked for.
    #[test]
    fn the_driver_roots_library_is_loaded_by_path() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libnvidia-ml.so.535.1"), b"not a library").unwrap();
        std::os::unix::fs::symlink(
            "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.1",
            dir.join(NVML_LIBRARY),
        )
        .unwrap();
        let msg = NvmlBackend::new(Some(root.path()))
            .err()
            .expect("a stand-in")
            .to_string();
        let loaded = dir.join("libnvidia-ml.so.535.1");
        assert!(
            msg.starts_with(&format!("{} could not be loaded: ", loaded.display())),
            "{msg}"
        );

        if std::path::Path::new("/dev/nvidiactl").exists() {
            return; // a GPU machine: the loader's path may well have it
        }
        let empty = tempfile::tempdir().unwrap();
        let msg = NvmlBackend::new(Some(empty.path()))
            .err()
            .expect("no NVML")
            .to_string();
        assert!(
            msg.contains(&format!("not in usr/lib64, usr/lib/x86_64-linux-gnu, usr/lib/aarch64-linux-gnu, lib64, lib/x86_64-linux-gnu, lib/aarch64-linux-gnu, usr/lib, lib under the driver root {}", empty.path().display())),
            "{msg}"
        );
    }
}
