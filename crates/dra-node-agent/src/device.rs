//! What discovery finds on a node: GPUs, their MIG placements, and the device nodes a
//! container needs to use them. Backends produce these; the slice builder and the claim
//! preparer consume them. No I/O here.

use serde::{Deserialize, Serialize};

/// Device nodes every GPU container needs besides its own `/dev/nvidia<minor>`.
pub const CONTROL_DEVICE_NODES: &[&str] =
    &["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];

/// One physical GPU as discovery sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gpu {
    /// NVML minor number: the device is `/dev/nvidia<minor>` and is published as `gpu-<minor>`.
    pub minor: u32,
    pub uuid: String,
    pub product_name: String,
    pub brand: String,
    pub architecture: String,
    /// As NVML reports it, e.g. "9.0"; published as a semver version.
    pub cuda_compute_capability: String,
    /// e.g. "550.54.15"; published as a semver version.
    pub driver_version: String,
    /// e.g. "12.4"; published as a semver version.
    pub cuda_driver_version: String,
    /// PCI bus id in the kernel's form, `0000:3b:00.0`.
    #[serde(rename = "pciBusID")]
    pub pci_bus_id: String,
    /// `pci<domain>:<bus>` of the root complex, when known.
    #[serde(default)]
    pub pcie_root: Option<String>,
    /// NUMA node of the PCI device, when the platform reports one.
    #[serde(default)]
    pub numa_node: Option<i64>,
    /// Framebuffer memory in bytes.
    pub memory_bytes: u64,
    /// MIG support; `None` for GPUs that cannot do MIG.
    #[serde(default)]
    pub mig: Option<MigInfo>,
}

/// MIG capability of a GPU and the placements it offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigInfo {
    /// Whether MIG mode is currently enabled (reported; partitions are published only when
    /// enabled).
    pub enabled: bool,
    /// Total memory slices of the GPU (8 on A100/H100).
    pub memory_slices: u32,
    /// Engines of the whole GPU, shared by its partitions.
    pub engines: MigEngines,
    #[serde(default)]
    pub profiles: Vec<MigProfile>,
}

/// Countable engines of a GPU or of a MIG partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigEngines {
    pub multiprocessors: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpeg_engines: u32,
    pub ofa_engines: u32,
}

/// A GPU-instance profile such as `1g.10gb` and where it may be placed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigProfile {
    /// Profile name as NVML prints it, e.g. `3g.40gb`.
    pub name: String,
    /// NVML GPU-instance profile id.
    pub profile_id: u32,
    pub memory_bytes: u64,
    /// How many consecutive memory slices a placement occupies.
    pub memory_slices: u32,
    pub engines: MigEngines,
    /// Possible placement starts (memory slice index).
    pub placements: Vec<u32>,
}

impl Gpu {
    /// The published device name, stable across GPUs falling off the bus.
    pub fn device_name(&self) -> String {
        format!("gpu-{}", self.minor)
    }

    /// Device nodes specific to this GPU.
    pub fn device_nodes(&self) -> Vec<String> {
        vec![format!("/dev/nvidia{}", self.minor)]
    }

    /// Whether partitions of this GPU are published.
    pub fn publishes_mig(&self) -> bool {
        self.mig
            .as_ref()
            .is_some_and(|m| m.enabled && !m.profiles.is_empty())
    }
}

impl MigProfile {
    /// NVIDIA's device name for a placement: `gpu-<minor>-mig-<profile without dots>-<profileId>-<start>`.
    pub fn device_name(&self, parent_minor: u32, start: u32) -> String {
        let profile: String = self
            .name
            .to_ascii_lowercase()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        format!(
            "gpu-{parent_minor}-mig-{profile}-{}-{start}",
            self.profile_id
        )
    }
}

/// A MIG partition created for a claim: a GPU instance at a placement with one compute
/// instance filling it. Kept in the checkpoint so unprepare (or a restart) can destroy it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigInstance {
    /// The published device it serves, e.g. `gpu-1-mig-3g20gb-9-4`.
    pub device_name: String,
    pub parent_minor: u32,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// `MIG-<uuid>`, what CUDA and the container toolkit address the partition by.
    pub uuid: String,
    /// The capability device nodes that grant access to this GPU and compute instance
    /// (`/dev/nvidia-caps/nvidia-cap<N>`).
    pub device_nodes: Vec<String>,
}

/// The capability device nodes of a GPU instance and its compute instance, read from
/// `/proc/driver/nvidia-caps/mig-minors` (lines `gpu<G>/gi<I>/access <minor>` and
/// `gpu<G>/gi<I>/ci<C>/access <minor>`). `None` when either line is missing.
pub fn mig_cap_device_nodes(mig_minors: &str, gpu: u32, gi: u32, ci: u32) -> Option<Vec<String>> {
    let find = |key: String| {
        mig_minors.lines().find_map(|line| {
            let (name, minor) = line.trim().split_once(' ')?;
            (name == key)
                .then(|| minor.trim().parse::<u32>().ok())
                .flatten()
        })
    };
    let gi_minor = find(format!("gpu{gpu}/gi{gi}/access"))?;
    let ci_minor = find(format!("gpu{gpu}/gi{gi}/ci{ci}/access"))?;
    Some(vec![
        format!("/dev/nvidia-caps/nvidia-cap{gi_minor}"),
        format!("/dev/nvidia-caps/nvidia-cap{ci_minor}"),
    ])
}

/// What a published device is, resolved back from its name: used when preparing a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceRef<'a> {
    Gpu(&'a Gpu),
    Mig {
        parent: &'a Gpu,
        profile: &'a MigProfile,
        start: u32,
    },
}

impl DeviceRef<'_> {
    pub fn parent(&self) -> &Gpu {
        match self {
            DeviceRef::Gpu(g) => g,
            DeviceRef::Mig { parent, .. } => parent,
        }
    }
}

/// Finds a published device by name among the discovered GPUs.
pub fn find_device<'a>(gpus: &'a [Gpu], name: &str) -> Option<DeviceRef<'a>> {
    for gpu in gpus {
        if gpu.device_name() == name {
            return Some(DeviceRef::Gpu(gpu));
        }
        if gpu.publishes_mig() {
            let mig = gpu.mig.as_ref().expect("publishes_mig checked");
            for profile in &mig.profiles {
                for &start in &profile.placements {
                    if profile.device_name(gpu.minor, start) == name {
                        return Some(DeviceRef::Mig {
                            parent: gpu,
                            profile,
                            start,
                        });
                    }
                }
            }
        }
    }
    None
}

/// Turns NVML's version strings ("535.104.05", "12.4", "9.0") into semver ("535.104.5",
/// "12.4.0", "9.0.0"): DRA version attributes must be semver, which forbids leading zeros
/// and needs three parts. Returns `None` for a string with no leading number.
pub fn to_semver(raw: &str) -> Option<String> {
    let mut parts: Vec<u64> = Vec::new();
    for p in raw.trim().split('.') {
        let digits: String = p.chars().take_while(|c| c.is_ascii_digit()).collect();
        if digits.is_empty() {
            break;
        }
        parts.push(digits.parse().ok()?);
        if digits.len() != p.len() || parts.len() == 3 {
            break;
        }
    }
    if parts.is_empty() {
        return None;
    }
    parts.resize(3, 0);
    Some(format!("{}.{}.{}", parts[0], parts[1], parts[2]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semver_normalises_nvml_versions() {
        assert_eq!(to_semver("535.104.05").as_deref(), Some("535.104.5"));
        assert_eq!(to_semver("12.4").as_deref(), Some("12.4.0"));
        assert_eq!(to_semver("9.0").as_deref(), Some("9.0.0"));
        assert_eq!(to_semver("550.54.15.1").as_deref(), Some("550.54.15"));
        assert_eq!(to_semver("8").as_deref(), Some("8.0.0"));
        assert_eq!(to_semver("n/a"), None);
    }

    #[test]
    fn mig_device_name_drops_dots() {
        let p = MigProfile {
            name: "3g.40gb".into(),
            profile_id: 9,
            memory_bytes: 0,
            memory_slices: 4,
            engines: MigEngines::default(),
            placements: vec![0, 4],
        };
        assert_eq!(p.device_name(2, 4), "gpu-2-mig-3g40gb-9-4");
    }
}

#[cfg(test)]
mod mig_caps {
    use super::mig_cap_device_nodes;

    #[test]
    fn capability_nodes_come_from_the_drivers_minor_table() {
        let table = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n\
                     gpu1/gi2/access 147\ngpu1/gi2/ci0/access 148\n";
        assert_eq!(
            mig_cap_device_nodes(table, 1, 2, 0).unwrap(),
            [
                "/dev/nvidia-caps/nvidia-cap147",
                "/dev/nvidia-caps/nvidia-cap148"
            ]
        );
        assert_eq!(
            mig_cap_device_nodes(table, 1, 3, 0),
            None,
            "no such instance"
        );
    }
}
