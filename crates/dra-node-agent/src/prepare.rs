//! The stateful side of NodePrepareResources / NodeUnprepareResources: reads claims, runs
//! the pure plan from [`crate::claim`], refuses a device that another live claim holds
//! ([`crate::owners`]), applies sharing, writes CDI specs, and records every step in the
//! checkpoint so a restart in the middle continues correctly.

use crate::backend::GpuBackend;
use crate::cdi;
use crate::checkpoint::{self, CheckpointData, ClaimEntry, ClaimState, Loaded};
use crate::claim::{ClaimRef, PlanContext, PreparedDevice, plan_claim};
use crate::device::Gpu;
use crate::health::HealthState;
use crate::metrics::Metrics;
use crate::owners::{self, Holder};
use k8s_openapi::api::resource::v1::ResourceClaim;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

/// Where claims are read from: the API server, or a fixed map (unit tests, dry runs).
#[derive(Clone)]
pub enum ClaimSource {
    Api(kube::Client),
    Static(Arc<Mutex<HashMap<(String, String), ResourceClaim>>>),
}

impl ClaimSource {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        self.get_opt(namespace, name)
            .await?
            .ok_or_else(|| format!("reading claim {namespace}/{name}: not found"))
    }

    /// The claim, or `None` when the API server has none of this name.
    async fn get_opt(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String> {
        match self {
            ClaimSource::Api(client) => {
                let api: kube::Api<ResourceClaim> =
                    kube::Api::namespaced(client.clone(), namespace);
                api.get_opt(name)
                    .await
                    .map_err(|e| format!("reading claim {namespace}/{name}: {e}"))
            }
            ClaimSource::Static(map) => Ok(map
                .lock()
                .unwrap()
                .get(&(namespace.to_string(), name.to_string()))
                .cloned()),
        }
    }
}

/// Fixed settings of a preparer.
#[derive(Debug, Clone)]
pub struct PreparerConfig {
    pub driver: String,
    pub node: String,
    pub cdi_dir: PathBuf,
    pub checkpoint_path: PathBuf,
    pub mps_dir: PathBuf,
    pub boot_id: String,
    /// `nvidia-cuda-mps-control`, to run a daemon per MPS claim; `None` (the fake backend
    /// without one): MPS claims get the environment only.
    pub mps_control: Option<PathBuf>,
}

/// What [`Preparer::open`] found in the checkpoint, for logs and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    Fresh,
    Resumed {
        claims: usize,
    },
    /// The checkpoint was from an earlier boot; its claims were dropped.
    Rebooted {
        dropped: usize,
    },
    /// The checkpoint was corrupt; it was moved to `moved_to` and every CDI spec of this
    /// driver was removed.
    Corrupt {
        reason: String,
        moved_to: PathBuf,
    },
}

/// Prepares and unprepares claims. One per agent; calls are serialised.
pub struct Preparer {
    cfg: PreparerConfig,
    kind: String,
    backend: Arc<dyn GpuBackend>,
    claims: ClaimSource,
    inventory: Arc<RwLock<Vec<Gpu>>>,
    state: tokio::sync::Mutex<CheckpointData>,
    metrics: Option<Arc<Metrics>>,
}

impl Preparer {
    /// Loads the checkpoint and cleans up after a reboot or corruption: CDI specs of this
    /// driver that no checkpointed claim owns are removed.
    pub fn open(
        cfg: PreparerConfig,
        backend: Arc<dyn GpuBackend>,
        claims: ClaimSource,
        inventory: Arc<RwLock<Vec<Gpu>>>,
        metrics: Option<Arc<Metrics>>,
    ) -> anyhow::Result<(Preparer, Recovery)> {
        let kind = cdi::claim_kind(&cfg.driver);
        let (data, recovery) = match checkpoint::load(&cfg.checkpoint_path, &cfg.boot_id) {
            Loaded::Missing => (CheckpointData::default(), Recovery::Fresh),
            Loaded::Valid(d) => {
                let n = d.claims.len();
                (d, Recovery::Resumed { claims: n })
            }
            Loaded::PreviousBoot(d) => (
                CheckpointData::default(),
                Recovery::Rebooted {
                    dropped: d.claims.len(),
                },
            ),
            Loaded::Corrupt { reason } => {
                let moved_to = cfg.checkpoint_path.with_extension("corrupt");
                std::fs::rename(&cfg.checkpoint_path, &moved_to)?;
                tracing::error!(
                    checkpoint = %cfg.checkpoint_path.display(), %reason, moved_to = %moved_to.display(),
                    "checkpoint is corrupt: starting empty and removing this driver's CDI specs; \
                     kubelet will prepare running claims again when it retries"
                );
                // Sharing settings of unknown claims cannot be known: reset every GPU.
                for gpu in inventory.read().unwrap().iter() {
                    if let Err(e) = backend.reset_sharing(gpu) {
                        tracing::warn!(gpu = gpu.minor, error = %e, "resetting sharing after corrupt checkpoint");
                    }
                }
                (
                    CheckpointData::default(),
                    Recovery::Corrupt { reason, moved_to },
                )
            }
        };
        for uid in cdi::list_spec_claims(&cfg.cdi_dir, &kind)? {
            if !data.claims.contains_key(&uid) {
                tracing::info!(claim_uid = %uid, "removing stale CDI spec");
                cdi::remove_spec(&cfg.cdi_dir, &kind, &uid)?;
            }
        }
        checkpoint::store(&cfg.checkpoint_path, &cfg.boot_id, &data)?;
        Ok((
            Preparer {
                cfg,
                kind,
                backend,
                claims,
                inventory,
                state: tokio::sync::Mutex::new(data),
                metrics,
            },
            recovery,
        ))
    }

    /// The claims currently in the checkpoint, by UID.
    pub async fn checkpointed(&self) -> CheckpointData {
        self.state.lock().await.clone()
    }

    /// Prepares each claim; an error affects only its own claim.
    pub async fn prepare(
        &self,
        claims: &[ClaimRef],
    ) -> BTreeMap<String, Result<Vec<PreparedDevice>, String>> {
        let mut state = self.state.lock().await;
        let mut out = BTreeMap::new();
        for c in claims {
            let start = Instant::now();
            let r = self.prepare_one(&mut state, c).await;
            if let Some(m) = &self.metrics {
                m.prepare_seconds.observe(start.elapsed().as_secs_f64());
                if r.is_err() {
                    m.prepare_errors.inc();
                }
            }
            match &r {
                // Debug-quoted: what kubelet sent may not have been valid.
                Ok(d) => {
                    tracing::info!(namespace = ?c.namespace, name = ?c.name, uid = ?c.uid, devices = d.len(), "prepared")
                }
                Err(e) => {
                    tracing::warn!(namespace = ?c.namespace, name = ?c.name, uid = ?c.uid, error = %e, "prepare failed")
                }
            }
            out.insert(c.uid.clone(), r);
        }
        out
    }

    async fn prepare_one(
        &self,
        state: &mut CheckpointData,
        c: &ClaimRef,
    ) -> Result<Vec<PreparedDevice>, String> {
        // The UID names files and directories below, the namespace and name an API path.
        c.validate()?;
        if let Some(entry) = state.claims.get(&c.uid)
            && entry.state == ClaimState::Prepared
        {
            // Idempotent: same answer, no API call; only put back a lost spec file.
            if let Some(spec) = &entry.spec
                && !cdi::spec_path(&self.cfg.cdi_dir, &self.kind, &c.uid).exists()
            {
                cdi::write_spec(&self.cfg.cdi_dir, &c.uid, spec)
                    .map_err(|e| format!("rewriting CDI spec: {e}"))?;
            }
            return Ok(entry.devices.clone());
        }
        let claim = self.claims.get(&c.namespace, &c.name).await?;
        let gpus = self.inventory.read().unwrap().clone();
        let mps_dir = self.cfg.mps_dir.display().to_string();
        let plan = plan_claim(
            &claim,
            c,
            &PlanContext {
                driver: &self.cfg.driver,
                node: &self.cfg.node,
                gpus: &gpus,
                mps_dir: &mps_dir,
            },
        )?;
        self.refuse_held_devices(state, c, &plan.devices, &gpus)
            .await?;
        // A crash between creating partitions and finishing left them recorded: destroy
        // them before starting over, so none leaks.
        if let Some(entry) = state.claims.get(&c.uid).cloned() {
            self.destroy_mig(&gpus, &entry.mig)?;
            self.stop_mps(&c.uid)?;
        }
        state.claims.insert(
            c.uid.clone(),
            ClaimEntry {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                state: ClaimState::PrepareStarted,
                devices: plan.devices.clone(),
                sharing: plan.sharing.clone(),
                spec: plan.spec.clone(),
                mig: Vec::new(),
            },
        );
        self.save(state)?;
        let mut spec = plan.spec.clone();
        for (index, d) in plan.devices.iter().enumerate() {
            let Some(crate::device::DeviceRef::Mig {
                parent,
                profile,
                start,
            }) = crate::device::find_device(&gpus, &d.device_name)
            else {
                continue;
            };
            let instance = match self.backend.create_mig(parent, profile, start) {
                Ok(i) => i,
                Err(e) => {
                    // Give back the partitions made so far; the claim is not prepared.
                    let made = state
                        .claims
                        .remove(&c.uid)
                        .map(|e| e.mig)
                        .unwrap_or_default();
                    let _ = self.destroy_mig(&gpus, &made);
                    self.save(state)?;
                    return Err(format!(
                        "claim {}/{}: device {}: {e}",
                        c.namespace, c.name, d.device_name
                    ));
                }
            };
            if let Some(edits) = spec
                .as_mut()
                .and_then(|s| s.devices.get_mut(index))
                .map(|d| &mut d.container_edits)
            {
                let prefix = format!("DRA_GPU_{}", crate::claim::env_name(&d.device_name));
                edits.env.push(format!("{prefix}_UUID={}", instance.uuid));
                edits.device_nodes.extend(
                    instance
                        .device_nodes
                        .iter()
                        .map(|path| cdi::DeviceNode { path: path.clone() }),
                );
            }
            let entry = state.claims.get_mut(&c.uid).expect("inserted above");
            entry.mig.push(instance);
            entry.spec = spec.clone();
            self.save(state)?;
        }
        let plan = crate::claim::ClaimPlan { spec, ..plan };
        for s in &plan.sharing {
            let gpu = gpus
                .iter()
                .find(|g| g.minor == s.minor)
                .expect("planned from this inventory");
            self.backend
                .apply_sharing(gpu, &s.sharing)
                .map_err(|e| e.to_string())?;
        }
        if let Some(settings) = &plan.mps {
            match &self.cfg.mps_control {
                Some(binary) => crate::mps::MpsControl {
                    binary: binary.clone(),
                }
                .start(&self.cfg.mps_dir.join(&c.uid), settings)
                .map_err(|e| format!("claim {}/{}: {e}", c.namespace, c.name))?,
                None => tracing::warn!(
                    uid = %c.uid,
                    "MPS requested, but no MPS control binary is configured: the CDI spec carries the MPS environment only"
                ),
            }
        }
        if let Some(spec) = &plan.spec {
            cdi::write_spec(&self.cfg.cdi_dir, &c.uid, spec)
                .map_err(|e| format!("writing CDI spec: {e}"))?;
        }
        state.claims.get_mut(&c.uid).expect("inserted above").state = ClaimState::Prepared;
        self.save(state)?;
        Ok(plan.devices)
    }

    /// Refuses `c` while a live claim, one the API server still has under the UID the
    /// checkpoint records, holds one of its `devices` and the two may not share it
    /// ([`crate::owners`]). An entry whose claim is gone or was recreated holds nothing: its
    /// pod is gone, and kubelet unprepares it in time. Nothing is written before this.
    async fn refuse_held_devices(
        &self,
        state: &CheckpointData,
        c: &ClaimRef,
        devices: &[PreparedDevice],
        gpus: &[Gpu],
    ) -> Result<(), String> {
        let published = crate::slices::devices(gpus, &HealthState::default());
        let mut live: Vec<Holder> = Vec::new();
        let mut known: BTreeMap<String, bool> = BTreeMap::new();
        for holder in owners::holders(state, &c.uid, devices, &published) {
            let is_live = match known.get(&holder.uid) {
                Some(is_live) => *is_live,
                None => {
                    let is_live = self.is_live(c, &holder).await?;
                    known.insert(holder.uid.clone(), is_live);
                    is_live
                }
            };
            if is_live {
                live.push(holder);
            }
        }
        if live.is_empty() {
            Ok(())
        } else {
            Err(owners::refusal(c, &live))
        }
    }

    /// Whether the API server still has `holder`'s claim under the UID the checkpoint
    /// records. When it cannot say, `c` is refused: kubelet retries.
    async fn is_live(&self, c: &ClaimRef, holder: &Holder) -> Result<bool, String> {
        let found = self
            .claims
            .get_opt(&holder.namespace, &holder.name)
            .await
            .map_err(|e| {
                format!(
                    "claim {}/{}: device {}/{} is already prepared for claim {}/{} (UID {}), and \
                     whether that claim still exists is unknown ({e}); kubelet retries the prepare",
                    c.namespace,
                    c.name,
                    holder.pool,
                    holder.device,
                    holder.namespace,
                    holder.name,
                    holder.uid
                )
            })?;
        let found_uid = found.and_then(|f| f.metadata.uid);
        let is_live = found_uid.as_deref() == Some(holder.uid.as_str());
        if !is_live {
            tracing::warn!(
                namespace = ?c.namespace, name = ?c.name, uid = ?c.uid,
                device = %format!("{}/{}", holder.pool, holder.device),
                holder = %format!("{}/{}", holder.namespace, holder.name),
                holder_uid = %holder.uid,
                found_uid = found_uid.as_deref().unwrap_or("none"),
                "the checkpoint has this device prepared for another claim, which is gone or was \
                 recreated: not refusing"
            );
        }
        Ok(is_live)
    }

    /// Unprepares each claim; unknown claims are a success.
    pub async fn unprepare(&self, claims: &[ClaimRef]) -> BTreeMap<String, Result<(), String>> {
        let mut state = self.state.lock().await;
        let mut out = BTreeMap::new();
        for c in claims {
            let start = Instant::now();
            let r = self.unprepare_one(&mut state, c);
            if let Some(m) = &self.metrics {
                m.unprepare_seconds.observe(start.elapsed().as_secs_f64());
                if r.is_err() {
                    m.unprepare_errors.inc();
                }
            }
            match &r {
                Ok(()) => tracing::info!(uid = ?c.uid, "unprepared"),
                Err(e) => tracing::warn!(uid = ?c.uid, error = %e, "unprepare failed"),
            }
            out.insert(c.uid.clone(), r);
        }
        out
    }

    fn unprepare_one(&self, state: &mut CheckpointData, c: &ClaimRef) -> Result<(), String> {
        // The UID names the CDI spec file and the MPS directory removed below.
        c.validate_uid()?;
        let Some(entry) = state.claims.get(&c.uid).cloned() else {
            cdi::remove_spec(&self.cfg.cdi_dir, &self.kind, &c.uid)
                .map_err(|e| format!("removing CDI spec: {e}"))?;
            return Ok(());
        };
        let gpus = self.inventory.read().unwrap().clone();
        for s in &entry.sharing {
            // A GPU that vanished has no settings left to reset.
            if let Some(gpu) = gpus.iter().find(|g| g.minor == s.minor) {
                self.backend.reset_sharing(gpu).map_err(|e| e.to_string())?;
            }
        }
        self.stop_mps(&c.uid)?;
        self.destroy_mig(&gpus, &entry.mig)?;
        cdi::remove_spec(&self.cfg.cdi_dir, &self.kind, &c.uid)
            .map_err(|e| format!("removing CDI spec: {e}"))?;
        state.claims.remove(&c.uid);
        self.save(state)
    }

    /// Stops the claim's MPS daemon, if it has one.
    fn stop_mps(&self, uid: &str) -> Result<(), String> {
        match &self.cfg.mps_control {
            Some(binary) => crate::mps::MpsControl {
                binary: binary.clone(),
            }
            .stop(&self.cfg.mps_dir.join(uid)),
            None => Ok(()),
        }
    }

    /// Destroys MIG partitions; those of a GPU that vanished are gone already.
    fn destroy_mig(
        &self,
        gpus: &[Gpu],
        instances: &[crate::device::MigInstance],
    ) -> Result<(), String> {
        for m in instances {
            if let Some(gpu) = gpus.iter().find(|g| g.minor == m.parent_minor) {
                self.backend
                    .destroy_mig(gpu, m)
                    .map_err(|e| format!("destroying {}: {e}", m.device_name))?;
            }
        }
        Ok(())
    }

    fn save(&self, state: &CheckpointData) -> Result<(), String> {
        checkpoint::store(&self.cfg.checkpoint_path, &self.cfg.boot_id, state)
            .map_err(|e| format!("writing checkpoint: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fake::{FakeBackend, Profile};
    use crate::claim::tests::{
        NOPE, U1, U2, U3, U4, U5, allocated_devices, claim, gpus, with_config,
    };
    use crate::config::{SharingStrategy, TimeSliceInterval};
    use serde_json::json;

    struct Rig {
        dir: tempfile::TempDir,
        backend: FakeBackend,
        claims: Arc<Mutex<HashMap<(String, String), ResourceClaim>>>,
        inventory: Arc<RwLock<Vec<Gpu>>>,
    }

    impl Rig {
        fn new() -> Rig {
            let g = gpus("8x-h100-80gb-2numa-2nic.yaml");
            let backend = FakeBackend::from_profile(Profile {
                description: String::new(),
                gpus: g.clone(),
                nics: vec![],
                health_events: vec![],
            });
            Rig {
                dir: tempfile::tempdir().unwrap(),
                backend,
                claims: Arc::default(),
                inventory: Arc::new(RwLock::new(g)),
            }
        }
        fn cfg(&self, boot: &str) -> PreparerConfig {
            PreparerConfig {
                driver: "gpu.nvidia.com".into(),
                node: "node-a".into(),
                cdi_dir: self.dir.path().join("cdi"),
                checkpoint_path: self.dir.path().join("plugin/checkpoint.json"),
                mps_dir: self.dir.path().join("mps"),
                mps_control: None,
                boot_id: boot.into(),
            }
        }
        fn open(&self, boot: &str) -> (Preparer, Recovery) {
            Preparer::open(
                self.cfg(boot),
                Arc::new(self.backend.clone()),
                ClaimSource::Static(self.claims.clone()),
                self.inventory.clone(),
                None,
            )
            .unwrap()
        }
        fn add(&self, name: &str, c: ResourceClaim) {
            let mut c = c;
            c.metadata.name = Some(name.into());
            self.claims
                .lock()
                .unwrap()
                .insert(("ns".into(), name.into()), c);
        }
        /// Marks `uid`'s checkpoint entry `PrepareStarted`, as a crash in the middle of its
        /// prepare leaves it (no preparer may be open).
        fn crashed_while_preparing(&self, uid: &str) {
            let path = self.cfg("b1").checkpoint_path;
            let Loaded::Valid(mut data) = checkpoint::load(&path, "b1") else {
                panic!("a valid checkpoint")
            };
            data.claims.get_mut(uid).unwrap().state = ClaimState::PrepareStarted;
            checkpoint::store(&path, "b1", &data).unwrap();
        }
        fn spec_files(&self) -> Vec<String> {
            cdi::list_spec_claims(&self.dir.path().join("cdi"), "k8s.gpu.nvidia.com/claim").unwrap()
        }
    }

    fn r(uid: &str, name: &str) -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            uid: uid.into(),
            name: name.into(),
        }
    }

    #[tokio::test]
    async fn prepare_writes_spec_and_is_idempotent_without_reading_the_claim_again() {
        let rig = Rig::new();
        rig.add("a", claim(U1, "node-a", &[("gpu", "gpu-1")]));
        let (p, rec) = rig.open("b1");
        assert_eq!(rec, Recovery::Fresh);
        let first = p.prepare(&[r(U1, "a")]).await;
        let devices = first[U1].as_ref().unwrap();
        assert_eq!(
            devices[0].cdi_device_ids,
            [format!("k8s.gpu.nvidia.com/claim={U1}-gpu-1")]
        );
        let file = rig
            .dir
            .path()
            .join(format!("cdi/k8s.gpu.nvidia.com_claim_{U1}.json"));
        let spec: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(spec["devices"][0]["name"], format!("{U1}-gpu-1"));
        assert_eq!(
            spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"],
            "/dev/nvidia1"
        );
        // The claim vanishing from the API does not matter: the checkpoint answers.
        rig.claims.lock().unwrap().clear();
        let second = p.prepare(&[r(U1, "a")]).await;
        assert_eq!(first, second);
    }

    #[tokio::test]
    async fn errors_are_per_claim() {
        let rig = Rig::new();
        rig.add("good", claim(U1, "node-a", &[("gpu", "gpu-0")]));
        let mut unallocated = claim(U2, "node-a", &[]);
        unallocated.status = None;
        rig.add("unallocated", unallocated);
        rig.add("elsewhere", claim(U3, "node-b", &[("gpu", "gpu-0")]));
        rig.add(
            "badconfig",
            with_config(claim(U4, "node-a", &[("gpu", "gpu-2")]), "FromClaim", &[], json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "extra": true})),
        );
        let (p, _) = rig.open("b1");
        let out = p
            .prepare(&[
                r(U1, "good"),
                r(U2, "unallocated"),
                r(U3, "elsewhere"),
                r(U4, "badconfig"),
                r(U5, "missing"),
            ])
            .await;
        assert!(out[U1].is_ok());
        assert_eq!(
            out[U2].as_ref().unwrap_err(),
            "claim ns/unallocated is not allocated"
        );
        assert_eq!(
            out[U3].as_ref().unwrap_err(),
            "claim ns/elsewhere is allocated to node node-b, not to this node node-a"
        );
        assert!(
            out[U4]
                .as_ref()
                .unwrap_err()
                .contains("unknown field `extra`")
        );
        assert_eq!(
            out[U5].as_ref().unwrap_err(),
            "reading claim ns/missing: not found"
        );
        assert_eq!(rig.spec_files(), [U1]);
        assert_eq!(
            p.checkpointed().await.claims.keys().collect::<Vec<_>>(),
            [U1]
        );
    }

    /// The claim with its one allocation result changed by `f`.
    fn with_result(
        mut c: ResourceClaim,
        f: impl FnOnce(&mut k8s_openapi::api::resource::v1::DeviceRequestAllocationResult),
    ) -> ResourceClaim {
        f(&mut allocated_devices(&mut c).results.as_mut().unwrap()[0]);
        c
    }

    /// What kubelet is told when `name` is refused because `holder` (UID `uid`) holds
    /// node-a's `device`.
    fn held(name: &str, device: &str, holder: &str, uid: &str) -> String {
        format!(
            "claim ns/{name}: device node-a/{device} is already prepared for claim ns/{holder} \
             (UID {uid}), and the device does not allow multiple allocations and neither \
             allocation has admin access; kubelet retries the prepare, which succeeds once \
             ns/{holder} is unprepared"
        )
    }

    #[tokio::test]
    async fn a_device_prepared_for_another_live_claim_is_refused_naming_that_claim() {
        let rig = Rig::new();
        // Two schedulers racing gave gpu-1 to both a and b.
        rig.add("a", claim(U1, "node-a", &[("gpu", "gpu-1")]));
        rig.add("b", claim(U2, "node-a", &[("gpu", "gpu-1")]));
        rig.add("c", claim(U3, "node-a", &[("gpu", "gpu-2")]));
        let (p, _) = rig.open("b1");
        let out = p.prepare(&[r(U1, "a"), r(U2, "b"), r(U3, "c")]).await;
        assert!(out[U1].is_ok() && out[U3].is_ok(), "{out:?}");
        assert_eq!(out[U2].as_ref().unwrap_err(), &held("b", "gpu-1", "a", U1));
        // Nothing of b was done: no checkpoint entry, no CDI spec.
        assert_eq!(rig.spec_files(), [U1, U3]);
        assert_eq!(
            p.checkpointed().await.claims.keys().collect::<Vec<_>>(),
            [U1, U3]
        );
        // kubelet's retry is refused the same way while a runs; so is b after an agent
        // restart, from the checkpoint.
        assert_eq!(
            p.prepare(&[r(U2, "b")]).await[U2].as_ref().unwrap_err(),
            &held("b", "gpu-1", "a", U1)
        );
        drop(p);
        let (p, _) = rig.open("b1");
        assert_eq!(
            p.prepare(&[r(U2, "b")]).await[U2].as_ref().unwrap_err(),
            &held("b", "gpu-1", "a", U1)
        );
    }

    #[tokio::test]
    async fn a_claim_that_only_started_preparing_holds_its_device_too() {
        let rig = Rig::new();
        rig.add("a", claim(U1, "node-a", &[("gpu", "gpu-1")]));
        rig.add("b", claim(U2, "node-a", &[("gpu", "gpu-1")]));
        {
            let (p, _) = rig.open("b1");
            assert!(p.prepare(&[r(U1, "a")]).await[U1].is_ok());
        }
        // The agent crashed while preparing a: its entry says PrepareStarted.
        rig.crashed_while_preparing(U1);
        let (p, _) = rig.open("b1");
        assert_eq!(
            p.prepare(&[r(U2, "b")]).await[U2].as_ref().unwrap_err(),
            &held("b", "gpu-1", "a", U1)
        );
    }

    #[tokio::test]
    async fn the_refused_claim_is_prepared_once_the_other_is_unprepared() {
        let rig = Rig::new();
        rig.add("a", claim(U1, "node-a", &[("gpu", "gpu-1")]));
        rig.add("b", claim(U2, "node-a", &[("gpu", "gpu-1")]));
        let (p, _) = rig.open("b1");
        assert!(p.prepare(&[r(U1, "a")]).await[U1].is_ok());
        assert!(p.prepare(&[r(U2, "b")]).await[U2].is_err());
        // a's pod is gone: kubelet unprepares a, then retries b.
        assert!(p.unprepare(&[r(U1, "a")]).await[U1].is_ok());
        let retried = p.prepare(&[r(U2, "b")]).await;
        let devices = retried[U2].as_ref().unwrap();
        assert_eq!(devices[0].device_name, "gpu-1");
        assert_eq!(rig.spec_files(), [U2]);
        // Now a is the one refused, naming b.
        assert_eq!(
            p.prepare(&[r(U1, "a")]).await[U1].as_ref().unwrap_err(),
            &held("a", "gpu-1", "b", U2)
        );
    }

    #[tokio::test]
    async fn admin_access_shares_a_device_with_any_claim() {
        let rig = Rig::new();
        let admin = |uid: &str, device: &str, admin: bool| {
            with_result(claim(uid, "node-a", &[("gpu", device)]), |r| {
                r.admin_access = Some(admin)
            })
        };
        rig.add("a", claim(U1, "node-a", &[("gpu", "gpu-1")]));
        rig.add("monitor", admin(U2, "gpu-1", true));
        rig.add("monitor-first", admin(U3, "gpu-2", true));
        rig.add("after-monitor", claim(U4, "node-a", &[("gpu", "gpu-2")]));
        rig.add("not-admin", admin(U5, "gpu-2", false));
        let (p, _) = rig.open("b1");
        // Admin access beside a claim prepared before, and a claim beside admin access
        // prepared before: both share.
        let out = p
            .prepare(&[
                r(U1, "a"),
                r(U2, "monitor"),
                r(U3, "monitor-first"),
                r(U4, "after-monitor"),
            ])
            .await;
        assert!(out.values().all(|r| r.is_ok()), "{out:?}");
        // The checkpoint records it, for the next claim and for a restarted agent.
        let data = p.checkpointed().await;
        assert!(data.claims[U2].devices[0].admin_access);
        assert!(!data.claims[U1].devices[0].admin_access);
        // `adminAccess: false` is no admin access: refused beside after-monitor (the
        // monitor beside it holds nothing).
        assert_eq!(
            p.prepare(&[r(U5, "not-admin")]).await[U5]
                .as_ref()
                .unwrap_err(),
            &held("not-admin", "gpu-2", "after-monitor", U4)
        );
    }

    #[tokio::test]
    async fn shareids_do_not_share_a_device_the_agent_publishes_for_one_claim() {
        let rig = Rig::new();
        let shared = |uid: &str, share: &str| {
            with_result(claim(uid, "node-a", &[("gpu", "gpu-1")]), |r| {
                r.share_id = Some(share.into());
                r.consumed_capacity = Some(
                    [(
                        "memory".to_string(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".into()),
                    )]
                    .into(),
                );
            })
        };
        rig.add("a", shared(U1, "s1"));
        rig.add("b", shared(U2, "s2"));
        let (p, _) = rig.open("b1");
        let out = p.prepare(&[r(U1, "a"), r(U2, "b")]).await;
        assert!(out[U1].is_ok(), "{out:?}");
        assert_eq!(out[U2].as_ref().unwrap_err(), &held("b", "gpu-1", "a", U1));
        let recorded = &p.checkpointed().await.claims[U1].devices[0];
        assert_eq!(recorded.share_id.as_deref(), Some("s1"));
        assert_eq!(recorded.consumed_capacity["memory"], "1Gi");
    }

    #[tokio::test]
    async fn an_entry_whose_claim_is_gone_or_recreated_does_not_block() {
        let rig = Rig::new();
        rig.add("a", claim(U1, "node-a", &[("gpu", "gpu-1")]));
        rig.add("b", claim(U2, "node-a", &[("gpu", "gpu-1")]));
        rig.add("c", claim(U3, "node-a", &[("gpu", "gpu-2")]));
        rig.add("d", claim(U4, "node-a", &[("gpu", "gpu-2")]));
        let (p, _) = rig.open("b1");
        assert!(
            p.prepare(&[r(U1, "a"), r(U3, "c")])
                .await
                .values()
                .all(|r| r.is_ok())
        );
        // a was deleted, c deleted and created again under its name: kubelet has not
        // unprepared them yet, but their pods are gone.
        rig.claims
            .lock()
            .unwrap()
            .remove(&("ns".to_string(), "a".to_string()));
        rig.add("c", claim(NOPE, "node-a", &[("gpu", "gpu-3")]));
        let out = p.prepare(&[r(U2, "b"), r(U4, "d")]).await;
        assert!(out.values().all(|r| r.is_ok()), "{out:?}");
        assert_eq!(rig.spec_files(), [U1, U2, U3, U4]);
    }

    #[tokio::test]
    async fn preparing_the_same_claim_again_is_not_a_conflict() {
        let rig = Rig::new();
        rig.add(
            "a",
            claim(U1, "node-a", &[("gpu", "gpu-1"), ("gpu", "gpu-2")]),
        );
        let (p, _) = rig.open("b1");
        let first = p.prepare(&[r(U1, "a")]).await;
        assert!(first[U1].is_ok());
        // kubelet asks again (after its own restart), twice in one call too.
        assert_eq!(p.prepare(&[r(U1, "a")]).await, first);
        assert_eq!(p.prepare(&[r(U1, "a"), r(U1, "a")]).await, first);
        // A crash in the middle of a's prepare left its own entry: redone, not refused.
        drop(p);
        rig.crashed_while_preparing(U1);
        let (p, _) = rig.open("b1");
        assert_eq!(p.prepare(&[r(U1, "a")]).await, first);
    }

    #[tokio::test]
    async fn sharing_is_applied_and_reset_and_unknown_unprepare_succeeds() {
        let rig = Rig::new();
        rig.add(
            "ts",
            with_config(claim(U1, "node-a", &[("gpu", "gpu-6")]), "FromClaim", &[], json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Medium"}}})),
        );
        let (p, _) = rig.open("b1");
        assert!(p.prepare(&[r(U1, "ts")]).await[U1].is_ok());
        let s = &rig.backend.sharing()[&6];
        assert_eq!(s.strategy, SharingStrategy::TimeSlicing);
        assert_eq!(
            s.time_slicing_config.as_ref().unwrap().interval,
            TimeSliceInterval::Medium
        );
        let out = p.unprepare(&[r(U1, "ts"), r(NOPE, "x")]).await;
        assert!(out.values().all(|r| r.is_ok()));
        assert!(rig.backend.sharing().is_empty());
        assert!(rig.spec_files().is_empty());
        assert!(p.checkpointed().await.claims.is_empty());
    }

    #[tokio::test]
    async fn restart_keeps_answers_and_crash_mid_prepare_is_redone() {
        let rig = Rig::new();
        rig.add("a", claim(U1, "node-a", &[("gpu", "gpu-1")]));
        rig.add("b", claim(U2, "node-a", &[("gpu", "gpu-2")]));
        let first = {
            let (p, _) = rig.open("b1");
            p.prepare(&[r(U1, "a")]).await
        };
        // Simulate a crash after "PrepareStarted" was recorded for u2.
        let mut data = match checkpoint::load(&rig.cfg("b1").checkpoint_path, "b1") {
            Loaded::Valid(d) => d,
            other => panic!("{other:?}"),
        };
        let mut started = data.claims[U1].clone();
        started.state = ClaimState::PrepareStarted;
        started.name = "b".into();
        started.devices[0].device_name = "stale".into();
        data.claims.insert(U2.into(), started);
        checkpoint::store(&rig.cfg("b1").checkpoint_path, "b1", &data).unwrap();

        let (p, rec) = rig.open("b1");
        assert_eq!(rec, Recovery::Resumed { claims: 2 });
        assert_eq!(p.prepare(&[r(U1, "a")]).await, first);
        let redone = p.prepare(&[r(U2, "b")]).await;
        assert_eq!(redone[U2].as_ref().unwrap()[0].device_name, "gpu-2");
        assert_eq!(rig.spec_files(), [U1, U2]);
    }

    #[tokio::test]
    async fn reboot_and_corruption_drop_claims_and_stale_specs() {
        let rig = Rig::new();
        rig.add("a", claim(U1, "node-a", &[("gpu", "gpu-1")]));
        {
            let (p, _) = rig.open("b1");
            p.prepare(&[r(U1, "a")]).await;
        }
        assert_eq!(rig.spec_files(), [U1]);
        let (_, rec) = rig.open("b2");
        assert_eq!(rec, Recovery::Rebooted { dropped: 1 });
        assert!(rig.spec_files().is_empty());

        {
            let (p, _) = rig.open("b2");
            p.prepare(&[r(U1, "a")]).await;
        }
        let path = rig.cfg("b2").checkpoint_path;
        std::fs::write(&path, b"{ garbage").unwrap();
        let (p, rec) = rig.open("b2");
        match rec {
            Recovery::Corrupt { reason, moved_to } => {
                assert!(reason.starts_with("not a checkpoint"), "{reason}");
                assert_eq!(std::fs::read(moved_to).unwrap(), b"{ garbage");
            }
            other => panic!("{other:?}"),
        }
        assert!(rig.spec_files().is_empty(), "no stale CDI spec left behind");
        // And the agent works again: prepare re-reads the claim.
        assert!(p.prepare(&[r(U1, "a")]).await[U1].is_ok());
        assert_eq!(rig.spec_files(), [U1]);
    }

    /// A backend that cannot create MIG instances (the trait's default).
    struct NoMig(FakeBackend);

    impl GpuBackend for NoMig {
        fn name(&self) -> &'static str {
            "nvml"
        }
        fn discover(&self) -> Result<Vec<Gpu>, crate::backend::BackendError> {
            self.0.discover()
        }
        fn watch_health(
            &self,
            events: tokio::sync::mpsc::UnboundedSender<crate::health::HealthEvent>,
        ) -> Result<(), crate::backend::BackendError> {
            self.0.watch_health(events)
        }
        fn apply_sharing(
            &self,
            gpu: &Gpu,
            sharing: &crate::config::Sharing,
        ) -> Result<(), crate::backend::BackendError> {
            self.0.apply_sharing(gpu, sharing)
        }
        fn reset_sharing(&self, gpu: &Gpu) -> Result<(), crate::backend::BackendError> {
            self.0.reset_sharing(gpu)
        }
    }

    #[tokio::test]
    async fn mig_partition_is_refused_when_the_backend_cannot_create_it() {
        let rig = Rig::new();
        let g = gpus("4x-a100-40gb-mig.yaml");
        *rig.inventory.write().unwrap() = g.clone();
        rig.add(
            "mig",
            claim(U1, "node-a", &[("mig", "gpu-1-mig-3g20gb-9-4")]),
        );
        rig.add("whole", claim(U2, "node-a", &[("gpu", "gpu-2")]));
        let (p, _) = Preparer::open(
            rig.cfg("b1"),
            Arc::new(NoMig(rig.backend.clone())),
            ClaimSource::Static(rig.claims.clone()),
            rig.inventory.clone(),
            None,
        )
        .unwrap();
        let out = p.prepare(&[r(U1, "mig"), r(U2, "whole")]).await;
        assert_eq!(
            out[U1].as_ref().unwrap_err(),
            "claim ns/mig: device gpu-1-mig-3g20gb-9-4: MIG on GPU 1: the nvml backend cannot create MIG instances"
        );
        assert!(out[U2].is_ok());
        assert_eq!(rig.spec_files(), [U2]);
    }

    #[tokio::test]
    async fn a_mig_partition_is_created_for_its_claim_and_destroyed_after() {
        let rig = Rig::new();
        *rig.inventory.write().unwrap() = gpus("4x-a100-40gb-mig.yaml");
        rig.add(
            "big",
            claim(U1, "node-a", &[("mig", "gpu-1-mig-3g20gb-9-4")]),
        );
        // Memory slices 4..6 of GPU 1: inside the partition above.
        rig.add(
            "overlap",
            claim(U2, "node-a", &[("mig", "gpu-1-mig-2g10gb-14-4")]),
        );
        rig.add(
            "small",
            claim(U3, "node-a", &[("mig", "gpu-1-mig-1g5gb-19-0")]),
        );
        let (p, _) = rig.open("b1");
        let out = p
            .prepare(&[r(U1, "big"), r(U2, "overlap"), r(U3, "small")])
            .await;
        assert!(out[U1].is_ok() && out[U3].is_ok(), "{out:?}");
        let err = out[U2].as_ref().unwrap_err();
        assert!(
            err.starts_with("claim ns/overlap: device gpu-1-mig-2g10gb-14-4: MIG on GPU 1: memory slices 4..6 overlap partition gpu-1-mig-3g20gb-9-4"),
            "{err}"
        );
        let made = rig.backend.mig_instances();
        assert_eq!(
            made.iter()
                .map(|m| m.device_name.as_str())
                .collect::<Vec<_>>(),
            ["gpu-1-mig-3g20gb-9-4", "gpu-1-mig-1g5gb-19-0"],
            "the failed claim left no partition behind"
        );
        // The container gets the partition's UUID and its capability devices.
        let file = rig
            .dir
            .path()
            .join(format!("cdi/k8s.gpu.nvidia.com_claim_{U1}.json"));
        let spec: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let edits = &spec["devices"][0]["containerEdits"];
        let env: Vec<&str> = edits["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap())
            .collect();
        assert!(
            env.contains(&format!("DRA_GPU_GPU_1_MIG_3G20GB_9_4_UUID={}", made[0].uuid).as_str()),
            "{env:?}"
        );
        let nodes: Vec<&str> = edits["deviceNodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["path"].as_str().unwrap())
            .collect();
        assert_eq!(nodes[0], "/dev/nvidia1");
        assert_eq!(&nodes[1..], made[0].device_nodes.as_slice());

        // A restarted agent still knows the partition and destroys it on unprepare.
        drop(p);
        let (p, _) = rig.open("b1");
        assert!(p.unprepare(&[r(U1, "big")]).await[U1].is_ok());
        assert_eq!(
            rig.backend
                .mig_instances()
                .iter()
                .map(|m| m.device_name.as_str())
                .collect::<Vec<_>>(),
            ["gpu-1-mig-1g5gb-19-0"]
        );
        // The freed slices can be partitioned again.
        assert!(p.prepare(&[r(U2, "overlap")]).await[U2].is_ok());
    }

    /// A stand-in for nvidia-cuda-mps-control that logs how it was called and, for control
    /// calls, the commands it read: `(script, log)`.
    fn mps_stand_in(rig: &Rig) -> (PathBuf, PathBuf) {
        let log = rig.dir.path().join("mps-calls.log");
        let script = rig.dir.path().join("mps-control");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho \"args=$* visible=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY\" >> {log}\n\
                 if [ \"$1\" != -d ]; then cat >> {log}; fi\n",
                log = log.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        (script, log)
    }

    /// A preparer that runs `script` as its MPS control binary.
    fn open_with_mps(rig: &Rig, script: &std::path::Path) -> Preparer {
        let mut cfg = rig.cfg("b1");
        cfg.mps_control = Some(script.to_path_buf());
        Preparer::open(
            cfg,
            Arc::new(rig.backend.clone()),
            ClaimSource::Static(rig.claims.clone()),
            rig.inventory.clone(),
            None,
        )
        .unwrap()
        .0
    }

    fn mps_claim(
        uid: &str,
        devices: &[(&str, &str)],
        mps_config: serde_json::Value,
    ) -> ResourceClaim {
        with_config(
            claim(uid, "node-a", devices),
            "FromClaim",
            &[],
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": mps_config}}),
        )
    }

    #[tokio::test]
    async fn an_mps_claim_gets_its_own_control_daemon_until_unprepared() {
        let rig = Rig::new();
        let (script, log) = mps_stand_in(&rig);
        rig.add(
            "mps",
            mps_claim(
                U1,
                &[("gpu", "gpu-3")],
                json!({"defaultActiveThreadPercentage": 25}),
            ),
        );
        let p = open_with_mps(&rig, &script);
        assert!(p.prepare(&[r(U1, "mps")]).await[U1].is_ok());
        let uuid = &rig.inventory.read().unwrap()[3].uuid.clone();
        let pipe = rig.dir.path().join(format!("mps/{U1}/pipe"));
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            format!(
                "args=-d visible={uuid} pipe={pipe}\nargs= visible= pipe={pipe}\n\
                 set_default_active_thread_percentage 25\n",
                pipe = pipe.display()
            )
        );
        assert!(pipe.is_dir(), "the pipe directory the CDI spec points at");
        assert!(p.unprepare(&[r(U1, "mps")]).await[U1].is_ok());
        assert!(
            std::fs::read_to_string(&log)
                .unwrap()
                .ends_with(&format!("args= visible= pipe={}\nquit\n", pipe.display())),
            "told to quit"
        );
        assert!(
            !rig.dir.path().join(format!("mps/{U1}")).exists(),
            "its directories removed"
        );
    }

    #[tokio::test]
    async fn memory_limits_reach_the_daemon_as_whole_mebibytes_per_device_index() {
        let rig = Rig::new();
        let (script, log) = mps_stand_in(&rig);
        let gpu4 = rig.inventory.read().unwrap()[4].uuid.clone();
        rig.add(
            "mps",
            mps_claim(
                U1,
                &[("gpu", "gpu-3"), ("gpu", "gpu-4"), ("gpu", "gpu-5")],
                json!({
                    "defaultActiveThreadPercentage": 50,
                    "defaultPinnedDeviceMemoryLimit": "10Gi",
                    "defaultPerDevicePinnedMemoryLimit": {"0": "4Gi", gpu4.clone(): "1.5Gi", "gpu-5": "10G"},
                }),
            ),
        );
        let p = open_with_mps(&rig, &script);
        assert!(p.prepare(&[r(U1, "mps")]).await[U1].is_ok());
        let uuids: Vec<String> = rig.inventory.read().unwrap()[3..6]
            .iter()
            .map(|g| g.uuid.clone())
            .collect();
        let pipe = rig.dir.path().join(format!("mps/{U1}/pipe"));
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            format!(
                "args=-d visible={visible} pipe={pipe}\nargs= visible= pipe={pipe}\n\
                 set_default_active_thread_percentage 50\n\
                 set_default_device_pinned_mem_limit 0 10240M\n\
                 set_default_device_pinned_mem_limit 1 10240M\n\
                 set_default_device_pinned_mem_limit 2 10240M\n\
                 set_default_device_pinned_mem_limit 0 4096M\n\
                 set_default_device_pinned_mem_limit 1 1536M\n\
                 set_default_device_pinned_mem_limit 2 9536M\n",
                visible = uuids.join(","),
                pipe = pipe.display()
            )
        );
        // The checkpoint holds the config as it was written: a restart finds it intact.
        drop(p);
        let (_, recovery) = rig.open("b1");
        assert_eq!(recovery, Recovery::Resumed { claims: 1 });
    }

    #[tokio::test]
    async fn a_newline_in_an_mps_config_never_reaches_the_control_daemon() {
        let rig = Rig::new();
        let (script, log) = mps_stand_in(&rig);
        rig.add(
            "in-default",
            mps_claim(
                U1,
                &[("gpu", "gpu-1")],
                json!({"defaultPinnedDeviceMemoryLimit": "1Gi\nset_default_active_thread_percentage 100"}),
            ),
        );
        rig.add(
            "in-key",
            mps_claim(
                U2,
                &[("gpu", "gpu-2")],
                json!({"defaultPerDevicePinnedMemoryLimit": {"0 1Gi\nquit\n0": "1Gi"}}),
            ),
        );
        rig.add(
            "in-value",
            mps_claim(
                U3,
                &[("gpu", "gpu-3")],
                json!({"defaultPerDevicePinnedMemoryLimit": {"0": "1Gi\nquit"}}),
            ),
        );
        rig.add(
            "good",
            mps_claim(
                U4,
                &[("gpu", "gpu-4")],
                json!({"defaultActiveThreadPercentage": 20}),
            ),
        );
        let p = open_with_mps(&rig, &script);
        let out = p
            .prepare(&[
                r(U1, "in-default"),
                r(U2, "in-key"),
                r(U3, "in-value"),
                r(U4, "good"),
            ])
            .await;
        assert_eq!(
            out[U1].as_ref().unwrap_err(),
            "claim ns/in-default: FromClaim config for requests []: invalid GpuConfig: \
             mpsConfig.defaultPinnedDeviceMemoryLimit \"1Gi\\nset_default_active_thread_percentage 100\": \
             not a Kubernetes quantity: unexpected character '\\n'"
        );
        assert_eq!(
            out[U2].as_ref().unwrap_err(),
            "claim ns/in-key: FromClaim config for requests []: invalid GpuConfig: \
             mpsConfig.defaultPerDevicePinnedMemoryLimit key \"0 1Gi\\nquit\\n0\": \
             not a device index, a GPU UUID or a device name"
        );
        assert_eq!(
            out[U3].as_ref().unwrap_err(),
            "claim ns/in-value: FromClaim config for requests []: invalid GpuConfig: \
             mpsConfig.defaultPerDevicePinnedMemoryLimit[0] \"1Gi\\nquit\": \
             not a Kubernetes quantity: unexpected character '\\n'"
        );
        assert!(out[U4].is_ok(), "{out:?}");
        // Only the good claim's daemon was started and configured.
        let pipe = rig.dir.path().join(format!("mps/{U4}/pipe"));
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            format!(
                "args=-d visible={uuid} pipe={pipe}\nargs= visible= pipe={pipe}\n\
                 set_default_active_thread_percentage 20\n",
                uuid = rig.inventory.read().unwrap()[4].uuid,
                pipe = pipe.display()
            )
        );
        // Nothing of the refused claims is left: no MPS directory, CDI spec or checkpoint entry.
        let mut mps_dirs: Vec<String> = std::fs::read_dir(rig.dir.path().join("mps"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        mps_dirs.sort();
        assert_eq!(mps_dirs, [U4]);
        assert_eq!(rig.spec_files(), [U4]);
        assert_eq!(
            p.checkpointed().await.claims.keys().collect::<Vec<_>>(),
            [U4]
        );
        assert!(
            rig.backend.sharing().keys().eq([&4]),
            "sharing applied to gpu-4 only"
        );
    }

    #[tokio::test]
    async fn mps_keys_must_name_the_claims_own_gpus_and_limits_fit_them() {
        let rig = Rig::new();
        let (script, log) = mps_stand_in(&rig);
        let other_uuid = rig.inventory.read().unwrap()[0].uuid.clone();
        let cases = [
            ("index", json!({"defaultPerDevicePinnedMemoryLimit": {"1": "1Gi"}}),
             "claim ns/index: mpsConfig.defaultPerDevicePinnedMemoryLimit key \"1\": device index 1, but the claim has 1 GPU(s) shared with MPS".to_string()),
            ("uuid", json!({"defaultPerDevicePinnedMemoryLimit": {other_uuid.clone(): "1Gi"}}),
             format!("claim ns/uuid: mpsConfig.defaultPerDevicePinnedMemoryLimit key \"{other_uuid}\": no GPU of the claim has this UUID")),
            ("name", json!({"defaultPerDevicePinnedMemoryLimit": {"gpu-0": "1Gi"}}),
             "claim ns/name: mpsConfig.defaultPerDevicePinnedMemoryLimit key \"gpu-0\": no device of the claim shared with MPS has this name".to_string()),
            ("twice", json!({"defaultPerDevicePinnedMemoryLimit": {"0": "1Gi", "gpu-6": "2Gi"}}),
             "claim ns/twice: mpsConfig.defaultPerDevicePinnedMemoryLimit keys \"0\" and \"gpu-6\" name the same GPU".to_string()),
            ("too-big", json!({"defaultPinnedDeviceMemoryLimit": "81Gi"}),
             "claim ns/too-big: mpsConfig.defaultPinnedDeviceMemoryLimit 81Gi is more than the 80Gi of memory of GPU gpu-6".to_string()),
        ];
        let uids = [U1, U2, U3, U4, U5];
        for ((name, config, _), uid) in cases.iter().zip(uids) {
            rig.add(name, mps_claim(uid, &[("gpu", "gpu-6")], config.clone()));
        }
        let p = open_with_mps(&rig, &script);
        let refs: Vec<ClaimRef> = cases
            .iter()
            .zip(uids)
            .map(|((name, _, _), uid)| r(uid, name))
            .collect();
        let out = p.prepare(&refs).await;
        for ((_, _, want), uid) in cases.iter().zip(uids) {
            assert_eq!(out[uid].as_ref().unwrap_err(), want);
        }
        assert!(!log.exists(), "the control binary never ran");
        assert!(!rig.dir.path().join("mps").exists());
        assert!(rig.spec_files().is_empty());
        assert!(p.checkpointed().await.claims.is_empty());
        assert!(rig.backend.sharing().is_empty());
    }

    #[tokio::test]
    async fn claim_references_with_path_characters_touch_nothing() {
        let rig = Rig::new();
        let (script, log) = mps_stand_in(&rig);
        rig.add("a", claim(U1, "node-a", &[("gpu", "gpu-1")]));
        let p = open_with_mps(&rig, &script);
        // Something an escaping path would hit: the MPS directory's parent holds it.
        let precious = rig.dir.path().join("precious");
        std::fs::write(&precious, "keep").unwrap();
        let bad = |namespace: &str, uid: &str, name: &str| ClaimRef {
            namespace: namespace.into(),
            uid: uid.into(),
            name: name.into(),
        };
        let out = p
            .prepare(&[
                bad("ns", "..", "a"),
                bad("ns", "../../precious", "a"),
                bad("..", U1, "a"),
                bad("ns", &format!("{U1}\n"), "a"),
            ])
            .await;
        assert_eq!(
            out[".."].as_ref().unwrap_err(),
            "claim \"ns\"/\"a\": UID \"..\" is not an RFC 4122 UUID"
        );
        assert_eq!(
            out["../../precious"].as_ref().unwrap_err(),
            "claim \"ns\"/\"a\": UID \"../../precious\" is not an RFC 4122 UUID"
        );
        assert_eq!(
            out[&format!("{U1}\n")].as_ref().unwrap_err(),
            &format!("claim \"ns\"/\"a\": UID \"{U1}\\n\" is not an RFC 4122 UUID")
        );
        assert_eq!(
            out[U1].as_ref().unwrap_err(),
            "claim \"..\"/\"a\": namespace \"..\" is not a DNS-1123 label"
        );
        let name_err = p.prepare(&[bad("ns", U1, "../a")]).await;
        assert_eq!(
            name_err[U1].as_ref().unwrap_err(),
            "claim ns/\"../a\": name \"../a\" is not a DNS-1123 subdomain"
        );
        // Unprepare with a UID of `..` would otherwise stop a daemon in, and remove, the
        // directory above the MPS directory.
        let out = p
            .unprepare(&[bad("ns", "..", "a"), bad("ns", "../cdi", "a")])
            .await;
        assert_eq!(
            out[".."].as_ref().unwrap_err(),
            "claim \"ns\"/\"a\": UID \"..\" is not an RFC 4122 UUID"
        );
        assert!(out["../cdi"].is_err());
        assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep");
        assert!(rig.dir.path().join("plugin/checkpoint.json").exists());
        assert!(!log.exists(), "the control binary never ran");
        assert!(rig.spec_files().is_empty());
        assert!(p.checkpointed().await.claims.is_empty());
    }
}
