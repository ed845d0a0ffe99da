//! The fake backend: GPUs from a YAML profile, re-read on every discovery so a test (or a
//! person) can take a GPU away by editing the file; health events injected by the profile's
//! `healthEvents` list or by [`FakeBackend::inject`].
//!
//! Profile format (see `profiles/*.yaml`): top-level `driverVersion` and `cudaDriverVersion`
//! are defaults for every GPU; `gpus` lists [`Gpu`] objects in camelCase; `nics` describes
//! the node's NICs for other drivers and the simulator (this agent does not publish them).

use super::{BackendError, GpuBackend};
use crate::config::Sharing;
use crate::device::{Gpu, MigInstance, MigProfile};
use crate::health::HealthEvent;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc::UnboundedSender;

/// A NIC on the node, described so the simulator can align GPUs and NICs by PCIe root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Nic {
    pub name: String,
    #[serde(rename = "pciBusID")]
    pub pci_bus_id: String,
    pub pcie_root: String,
    #[serde(default)]
    pub numa_node: Option<i64>,
}

/// A MIG partition that exists and the memory slices it occupies.
type Partition = (MigInstance, std::ops::Range<u32>);

/// A parsed profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub description: String,
    pub gpus: Vec<Gpu>,
    pub nics: Vec<Nic>,
    pub health_events: Vec<HealthEvent>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawProfile {
    #[serde(default)]
    description: String,
    #[serde(default)]
    driver_version: Option<String>,
    #[serde(default)]
    cuda_driver_version: Option<String>,
    #[serde(default)]
    gpus: Vec<serde_yaml::Value>,
    #[serde(default)]
    nics: Vec<Nic>,
    #[serde(default)]
    health_events: Vec<HealthEvent>,
}

impl Profile {
    /// Parses a profile; unknown fields are errors so typos don't silently drop data.
    pub fn parse(text: &str) -> Result<Profile, String> {
        let raw: RawProfile = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        let mut gpus = Vec::with_capacity(raw.gpus.len());
        for (i, mut value) in raw.gpus.into_iter().enumerate() {
            if let serde_yaml::Value::Mapping(m) = &mut value {
                for (key, default) in [
                    ("driverVersion", &raw.driver_version),
                    ("cudaDriverVersion", &raw.cuda_driver_version),
                ] {
                    if let Some(d) = default
                        && !m.contains_key(key)
                    {
                        m.insert(key.into(), d.clone().into());
                    }
                }
            }
            let gpu: Gpu = serde_yaml::from_value(value).map_err(|e| format!("gpus[{i}]: {e}"))?;
            gpus.push(gpu);
        }
        let mut seen = std::collections::BTreeSet::new();
        for g in &gpus {
            if !seen.insert(g.minor) {
                return Err(format!("two GPUs have minor number {}", g.minor));
            }
        }
        Ok(Profile {
            description: raw.description,
            gpus,
            nics: raw.nics,
            health_events: raw.health_events,
        })
    }

    pub fn load(path: &Path) -> Result<Profile, BackendError> {
        let err = |reason: String| BackendError::Profile {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        Profile::parse(&text).map_err(err)
    }
}

/// Where the fake backend's GPUs come from.
#[derive(Debug, Clone)]
enum Source {
    File(PathBuf),
    Fixed(Profile),
}

/// The fake backend. Cheap to clone; clones share injected events and sharing state.
#[derive(Clone)]
pub struct FakeBackend {
    source: Arc<Mutex<Source>>,
    events: Arc<Mutex<Option<UnboundedSender<HealthEvent>>>>,
    pending: Arc<Mutex<Vec<HealthEvent>>>,
    sharing: Arc<Mutex<BTreeMap<u32, Sharing>>>,
    /// MIG partitions that exist, with the memory slices each occupies.
    mig: Arc<Mutex<Vec<Partition>>>,
}

impl FakeBackend {
    /// A backend that re-reads `path` on every discovery.
    pub fn from_file(path: impl Into<PathBuf>) -> Result<FakeBackend, BackendError> {
        let path = path.into();
        let profile = Profile::load(&path)?;
        Ok(Self::new(Source::File(path), profile.health_events))
    }

    /// A backend with a fixed profile (tests); see [`FakeBackend::set_profile`].
    pub fn from_profile(profile: Profile) -> FakeBackend {
        let events = profile.health_events.clone();
        Self::new(Source::Fixed(profile), events)
    }

    fn new(source: Source, initial: Vec<HealthEvent>) -> FakeBackend {
        FakeBackend {
            source: Arc::new(Mutex::new(source)),
            events: Arc::new(Mutex::new(None)),
            pending: Arc::new(Mutex::new(initial)),
            sharing: Arc::new(Mutex::new(BTreeMap::new())),
            mig: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The MIG partitions that exist now (for tests and dry runs).
    pub fn mig_instances(&self) -> Vec<MigInstance> {
        self.mig
            .lock()
            .unwrap()
            .iter()
            .map(|(m, _)| m.clone())
            .collect()
    }

    /// Replaces the profile (the next discovery sees it).
    pub fn set_profile(&self, profile: Profile) {
        *self.source.lock().unwrap() = Source::Fixed(profile);
    }

    /// Delivers a health event as if NVML had reported it.
    pub fn inject(&self, event: HealthEvent) {
        match &*self.events.lock().unwrap() {
            Some(tx) => {
                let _ = tx.send(event);
            }
            None => self.pending.lock().unwrap().push(event),
        }
    }

    /// The sharing settings currently applied, by GPU minor (for tests and dry runs).
    pub fn sharing(&self) -> BTreeMap<u32, Sharing> {
        self.sharing.lock().unwrap().clone()
    }
}

impl GpuBackend for FakeBackend {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn discover(&self) -> Result<Vec<Gpu>, BackendError> {
        let source = self.source.lock().unwrap().clone();
        match source {
            Source::File(path) => Ok(Profile::load(&path)?.gpus),
            Source::Fixed(p) => Ok(p.gpus),
        }
    }

    fn watch_health(&self, events: UnboundedSender<HealthEvent>) -> Result<(), BackendError> {
        for e in self.pending.lock().unwrap().drain(..) {
            let _ = events.send(e);
        }
        *self.events.lock().unwrap() = Some(events);
        Ok(())
    }

    fn apply_sharing(&self, gpu: &Gpu, sharing: &Sharing) -> Result<(), BackendError> {
        self.sharing
            .lock()
            .unwrap()
            .insert(gpu.minor, sharing.clone());
        Ok(())
    }

    fn reset_sharing(&self, gpu: &Gpu) -> Result<(), BackendError> {
        self.sharing.lock().unwrap().remove(&gpu.minor);
        Ok(())
    }

    /// Like NVML: a placement that overlaps an existing partition of the GPU is refused;
    /// ids count up per GPU; capability nodes are numbered as the driver would.
    fn create_mig(
        &self,
        gpu: &Gpu,
        profile: &MigProfile,
        start: u32,
    ) -> Result<MigInstance, BackendError> {
        let err = |reason: String| BackendError::Mig {
            gpu: gpu.minor,
            reason,
        };
        if !gpu.mig.as_ref().is_some_and(|m| m.enabled) {
            return Err(err("MIG mode is not enabled".into()));
        }
        if !profile.placements.contains(&start) {
            return Err(err(format!(
                "profile {} cannot be placed at memory slice {start}",
                profile.name
            )));
        }
        let slices = start..start + profile.memory_slices;
        let mut mig = self.mig.lock().unwrap();
        if let Some((other, _)) = mig.iter().find(|(m, r)| {
            m.parent_minor == gpu.minor && r.start < slices.end && slices.start < r.end
        }) {
            return Err(err(format!(
                "memory slices {slices:?} overlap partition {} (insufficient resources)",
                other.device_name
            )));
        }
        let gi = (1..)
            .find(|id| {
                !mig.iter()
                    .any(|(m, _)| m.parent_minor == gpu.minor && m.gpu_instance_id == *id)
            })
            .expect("a free id");
        let instance = MigInstance {
            device_name: profile.device_name(gpu.minor, start),
            parent_minor: gpu.minor,
            gpu_instance_id: gi,
            compute_instance_id: 0,
            uuid: format!("MIG-{}-{gi}", gpu.uuid.trim_start_matches("GPU-")),
            device_nodes: vec![
                format!(
                    "/dev/nvidia-caps/nvidia-cap{}",
                    100 + gpu.minor * 20 + gi * 2
                ),
                format!(
                    "/dev/nvidia-caps/nvidia-cap{}",
                    101 + gpu.minor * 20 + gi * 2
                ),
            ],
        };
        mig.push((instance.clone(), slices));
        Ok(instance)
    }

    fn destroy_mig(&self, gpu: &Gpu, instance: &MigInstance) -> Result<(), BackendError> {
        self.mig.lock().unwrap().retain(|(m, _)| {
            !(m.parent_minor == gpu.minor && m.gpu_instance_id == instance.gpu_instance_id)
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile_path(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("profiles")
            .join(name)
    }

    #[test]
    fn shipped_h100_profile_has_8_gpus_on_2_numa_nodes_and_2_nics() {
        let p = Profile::load(&profile_path("8x-h100-80gb-2numa-2nic.yaml")).unwrap();
        assert_eq!(p.gpus.len(), 8);
        assert_eq!(p.nics.len(), 2);
        let numa: std::collections::BTreeSet<_> = p.gpus.iter().map(|g| g.numa_node).collect();
        assert_eq!(numa, [Some(0), Some(1)].into_iter().collect());
        assert!(
            p.gpus
                .iter()
                .all(|g| g.product_name == "NVIDIA H100 80GB HBM3")
        );
        assert!(p.gpus.iter().all(|g| g.driver_version == "550.54.15"));
        assert_eq!(p.gpus[0].memory_bytes, 80 * 1024 * 1024 * 1024);
        // Each NIC shares a PCIe root with some GPU.
        for nic in &p.nics {
            assert!(
                p.gpus
                    .iter()
                    .any(|g| g.pcie_root.as_deref() == Some(&nic.pcie_root))
            );
        }
    }

    #[test]
    fn shipped_mixed_profile_has_a5000_and_two_t10() {
        let p = Profile::load(&profile_path("1x-a5000-2x-t10.yaml")).unwrap();
        let names: Vec<_> = p.gpus.iter().map(|g| g.product_name.as_str()).collect();
        assert_eq!(names, ["NVIDIA RTX A5000", "NVIDIA T10", "NVIDIA T10"]);
        assert!(p.gpus.iter().all(|g| g.mig.is_none()));
    }

    #[test]
    fn shipped_a100_profile_has_mig_placements() {
        let p = Profile::load(&profile_path("4x-a100-40gb-mig.yaml")).unwrap();
        assert_eq!(p.gpus.len(), 4);
        for g in &p.gpus {
            let mig = g.mig.as_ref().expect("A100 is MIG capable");
            assert!(mig.enabled);
            assert_eq!(mig.memory_slices, 8);
            let one_g = mig.profiles.iter().find(|p| p.name == "1g.5gb").unwrap();
            assert_eq!(one_g.placements, (0..7).collect::<Vec<_>>());
            let seven_g = mig.profiles.iter().find(|p| p.name == "7g.40gb").unwrap();
            assert_eq!(seven_g.placements, vec![0]);
        }
    }

    #[test]
    fn unknown_field_in_profile_is_an_error_naming_it() {
        let err = Profile::parse(
            "gpus:\n- minor: 0\n  uuid: GPU-x\n  productName: x\n  brand: x\n  architecture: x\n  cudaComputeCapability: '8.0'\n  driverVersion: '1.0'\n  cudaDriverVersion: '12.0'\n  pciBusID: '0000:01:00.0'\n  memoryBytes: 1\n  colour: red\n",
        )
        .unwrap_err();
        assert!(err.contains("gpus[0]") && err.contains("colour"), "{err}");
    }

    #[test]
    fn profile_health_events_parse() {
        let p = Profile::parse(
            "gpus: []\nhealthEvents:\n- {kind: xid, minor: 2, xid: 79}\n- {kind: ecc, minor: 0}\n- {kind: lost, minor: 1}\n",
        )
        .unwrap();
        assert_eq!(
            p.health_events,
            vec![
                HealthEvent::Xid { minor: 2, xid: 79 },
                HealthEvent::Ecc { minor: 0 },
                HealthEvent::Lost { minor: 1 }
            ]
        );
        let err = Profile::parse("healthEvents:\n- {kind: xid, minor: 2, xid: 79, when: now}\n")
            .unwrap_err();
        assert!(err.contains("when"), "{err}");
    }

    #[test]
    fn duplicate_minor_is_rejected() {
        let gpu = "- {minor: 0, uuid: a, productName: x, brand: x, architecture: x, cudaComputeCapability: '8.0', driverVersion: '1', cudaDriverVersion: '1', pciBusID: p, memoryBytes: 1}\n";
        let err = Profile::parse(&format!("gpus:\n{gpu}{gpu}")).unwrap_err();
        assert_eq!(err, "two GPUs have minor number 0");
    }

    #[test]
    fn discovery_rereads_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.yaml");
        let src = std::fs::read_to_string(profile_path("1x-a5000-2x-t10.yaml")).unwrap();
        std::fs::write(&path, &src).unwrap();
        let backend = FakeBackend::from_file(&path).unwrap();
        assert_eq!(backend.discover().unwrap().len(), 3);
        let mut p = Profile::parse(&src).unwrap();
        p.gpus.pop();
        let yaml = format!(
            "gpus:\n{}",
            serde_yaml::to_string(&p.gpus)
                .unwrap()
                .lines()
                .map(|l| format!("  {l}\n"))
                .collect::<String>()
        );
        std::fs::write(&path, yaml).unwrap();
        let gpus = backend.discover().unwrap();
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[1].product_name, "NVIDIA T10");
    }

    #[tokio::test]
    async fn injected_events_reach_the_watcher_including_ones_sent_before_it_started() {
        let b = FakeBackend::from_profile(Profile::parse("gpus: []").unwrap());
        b.inject(HealthEvent::Lost { minor: 3 });
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        b.watch_health(tx).unwrap();
        b.inject(HealthEvent::Xid { minor: 1, xid: 79 });
        assert_eq!(rx.recv().await, Some(HealthEvent::Lost { minor: 3 }));
        assert_eq!(
            rx.recv().await,
            Some(HealthEvent::Xid { minor: 1, xid: 79 })
        );
    }
}
