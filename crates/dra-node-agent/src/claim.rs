//! Deciding what preparing a claim means: which of its allocated devices are this driver's
//! on this node, which sharing config applies to each, and the CDI spec to write. Pure: the
//! caller reads the claim from the API server and performs the plan.

use crate::cdi::{self, CdiDevice, ContainerEdits, DeviceNode};
use crate::config::{DeviceSelector, MpsConfig, Sharing, SharingStrategy, decode_gpu_config};
use crate::device::{CONTROL_DEVICE_NODES, DeviceRef, Gpu, find_device};
use crate::mps::MpsSettings;
use crate::quantity::format_bytes;
use crate::validate::{is_dns1123_label, is_dns1123_subdomain, is_uid};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A claim as kubelet names it in a prepare/unprepare call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRef {
    pub namespace: String,
    pub uid: String,
    pub name: String,
}

impl ClaimRef {
    /// Checks what kubelet sent before any of it is used: the UID names the claim's CDI spec
    /// file and MPS directory, the namespace and name go into an API path. The UID must be
    /// an RFC 4122 UUID, the namespace a DNS-1123 label and the name a DNS-1123 subdomain,
    /// as the API server itself requires; so none can hold `/`, `..` or a control character.
    pub fn validate(&self) -> Result<(), String> {
        if !is_dns1123_label(&self.namespace) {
            return Err(format!(
                "claim {:?}/{:?}: namespace {:?} is not a DNS-1123 label",
                self.namespace, self.name, self.namespace
            ));
        }
        if !is_dns1123_subdomain(&self.name) {
            return Err(format!(
                "claim {}/{:?}: name {:?} is not a DNS-1123 subdomain",
                self.namespace, self.name, self.name
            ));
        }
        self.validate_uid()
    }

    /// The UID part of [`ClaimRef::validate`], for unprepare, which uses nothing else.
    pub fn validate_uid(&self) -> Result<(), String> {
        if !is_uid(&self.uid) {
            return Err(format!(
                "claim {:?}/{:?}: UID {:?} is not an RFC 4122 UUID",
                self.namespace, self.name, self.uid
            ));
        }
        Ok(())
    }
}

/// One prepared device, as returned to kubelet (and kept in the checkpoint).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    pub cdi_device_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// The allocation has admin access, and so shares the device with any other
    /// ([`crate::owners`]). Not sent to kubelet; defaults keep older checkpoints loading
    /// (and their checksums matching: a default is not written).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin_access: bool,
    /// What the allocation consumes of the device's capacities, as written in the claim
    /// (devices that allow multiple allocations; [`crate::owners`]). Not sent to kubelet.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub consumed_capacity: BTreeMap<String, String>,
}

/// Sharing to apply to one physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSharing {
    pub minor: u32,
    pub sharing: Sharing,
}

/// Everything preparing one claim does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimPlan {
    pub devices: Vec<PreparedDevice>,
    /// `None` when none of the claim's devices are this driver's on this node.
    pub spec: Option<cdi::Spec>,
    pub sharing: Vec<GpuSharing>,
    /// The claim's MPS control daemon, when any of its GPUs is shared with MPS.
    pub mps: Option<MpsSettings>,
}

/// Who we are, for deciding which results are ours.
#[derive(Debug, Clone)]
pub struct PlanContext<'a> {
    pub driver: &'a str,
    pub node: &'a str,
    pub gpus: &'a [Gpu],
    /// Where MPS pipes live, per claim (`<dir>/<claimUID>`).
    pub mps_dir: &'a str,
}

pub(crate) fn env_name(device: &str) -> String {
    device
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// Whether a config entry naming `requests` applies to a result for `request`
/// (`req` or `req/sub`); an empty list applies to all requests.
fn config_applies(requests: &[String], request: &str) -> bool {
    let parent = request.split('/').next().unwrap_or(request);
    requests.is_empty() || requests.iter().any(|r| r == request || r == parent)
}

/// Plans the preparation of `claim`, which kubelet asked for as `want`.
pub fn plan_claim(
    claim: &ResourceClaim,
    want: &ClaimRef,
    ctx: &PlanContext<'_>,
) -> Result<ClaimPlan, String> {
    want.validate()?;
    let id = format!("{}/{}", want.namespace, want.name);
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    if uid != want.uid {
        return Err(format!(
            "claim {id} has UID {uid} in the API server, kubelet asked for {}: it was deleted and recreated",
            want.uid
        ));
    }
    let allocation = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .ok_or_else(|| format!("claim {id} is not allocated"))?;

    if let Some(selector) = &allocation.node_selector {
        // Node-local allocations select the node by name; other selectors need the Node's
        // labels, which kubelet already checked before calling us.
        let mut names = Vec::new();
        let mut only_by_name = true;
        for term in &selector.node_selector_terms {
            if term
                .match_expressions
                .as_ref()
                .is_some_and(|e| !e.is_empty())
            {
                only_by_name = false;
            }
            for f in term.match_fields.iter().flatten() {
                if f.key == "metadata.name" && f.operator == "In" {
                    names.extend(f.values.iter().flatten().cloned());
                } else {
                    only_by_name = false;
                }
            }
        }
        if only_by_name && !names.is_empty() && !names.iter().any(|n| n == ctx.node) {
            return Err(format!(
                "claim {id} is allocated to node {}, not to this node {}",
                names.join(","),
                ctx.node
            ));
        }
    }

    let devices = allocation.devices.as_ref();
    let results: Vec<_> = devices
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.driver == ctx.driver)
        .collect();

    // Configs in the allocation come class-first, then claim; a later one overrides.
    let mut configs: Vec<(Vec<String>, Option<Sharing>)> = Vec::new();
    for c in devices
        .and_then(|d| d.config.as_ref())
        .into_iter()
        .flatten()
    {
        let Some(opaque) = c.opaque.as_ref().filter(|o| o.driver == ctx.driver) else {
            continue;
        };
        let requests = c.requests.clone().unwrap_or_default();
        let config = decode_gpu_config(&opaque.parameters.0).map_err(|e| {
            format!(
                "claim {id}: {} config for requests [{}]: {e}",
                c.source,
                requests.join(",")
            )
        })?;
        configs.push((requests, config.sharing));
    }

    let kind = cdi::claim_kind(ctx.driver);
    let mut prepared = Vec::new();
    let mut cdi_devices = Vec::new();
    let mut sharing: Vec<GpuSharing> = Vec::new();
    let mut spec_env = Vec::new();
    // (GPU minor, allocated device name) of every result, for naming devices in mpsConfig.
    let mut allocated: Vec<(u32, &str)> = Vec::new();
    for r in results {
        if r.pool != ctx.node {
            return Err(format!(
                "claim {id}: device {}/{} is in pool {}, not this node's pool {}",
                r.pool, r.device, r.pool, ctx.node
            ));
        }
        let device = find_device(ctx.gpus, &r.device).ok_or_else(|| {
            format!(
                "claim {id}: device {} is not present on node {}",
                r.device, ctx.node
            )
        })?;
        let effective = configs
            .iter()
            .rev()
            .find(|(reqs, _)| config_applies(reqs, &r.request))
            .and_then(|(_, s)| s.clone());

        let parent = device.parent();
        allocated.push((parent.minor, &r.device));
        let prefix = format!("DRA_GPU_{}", env_name(&r.device));
        let mut env = Vec::new();
        match &device {
            DeviceRef::Gpu(g) => env.push(format!("{prefix}_UUID={}", g.uuid)),
            DeviceRef::Mig {
                parent,
                profile,
                start,
            } => {
                env.push(format!("{prefix}_PARENT_UUID={}", parent.uuid));
                env.push(format!("{prefix}_MIG_PROFILE={}", profile.name));
                env.push(format!("{prefix}_MIG_PLACEMENT={start}"));
            }
        }
        if let Some(s) = &effective {
            match s.strategy {
                SharingStrategy::TimeSlicing => {
                    let interval = s
                        .time_slicing_config
                        .as_ref()
                        .map(|t| t.interval)
                        .unwrap_or_default();
                    env.push(format!("{prefix}_SHARING=TimeSlicing"));
                    env.push(format!("{prefix}_TIMESLICE_INTERVAL={interval:?}"));
                }
                SharingStrategy::Mps => {
                    env.push(format!("{prefix}_SHARING=MPS"));
                    let dir = format!("{}/{}", ctx.mps_dir, want.uid);
                    spec_env.push(format!("CUDA_MPS_PIPE_DIRECTORY={dir}/pipe"));
                    spec_env.push(format!("CUDA_MPS_LOG_DIRECTORY={dir}/log"));
                    if let Some(p) = s
                        .mps_config
                        .as_ref()
                        .and_then(|m| m.default_active_thread_percentage)
                    {
                        spec_env.push(format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={p}"));
                    }
                }
            }
            if !sharing.iter().any(|g| g.minor == parent.minor) {
                sharing.push(GpuSharing {
                    minor: parent.minor,
                    sharing: s.clone(),
                });
            }
        }
        cdi_devices.push(CdiDevice {
            name: cdi::device_name(&want.uid, &r.device),
            container_edits: ContainerEdits {
                env,
                device_nodes: parent
                    .device_nodes()
                    .into_iter()
                    .map(|path| DeviceNode { path })
                    .collect(),
            },
        });
        prepared.push(PreparedDevice {
            request_names: vec![r.request.clone()],
            pool_name: r.pool.clone(),
            device_name: r.device.clone(),
            cdi_device_ids: vec![cdi::device_id(&kind, &want.uid, &r.device)],
            share_id: r.share_id.clone(),
            admin_access: r.admin_access == Some(true),
            consumed_capacity: r
                .consumed_capacity
                .iter()
                .flatten()
                .map(|(name, q)| (name.clone(), q.0.clone()))
                .collect(),
        });
    }
    // One daemon per claim, on all of its MPS GPUs, with the config of the first; every MPS
    // config of the claim is checked against those GPUs all the same.
    let mps_gpus: Vec<MpsGpu<'_>> = sharing
        .iter()
        .filter(|s| s.sharing.strategy == SharingStrategy::Mps)
        .map(|s| MpsGpu {
            gpu: ctx
                .gpus
                .iter()
                .find(|g| g.minor == s.minor)
                .expect("planned from this inventory"),
            devices: allocated
                .iter()
                .filter(|(minor, _)| *minor == s.minor)
                .map(|(_, name)| *name)
                .collect(),
        })
        .collect();
    let mut mps = None;
    for s in sharing
        .iter()
        .filter(|s| s.sharing.strategy == SharingStrategy::Mps)
    {
        let settings = mps_settings(&id, s.sharing.mps_config.as_ref(), &mps_gpus)?;
        mps.get_or_insert(settings);
    }
    spec_env.sort();
    spec_env.dedup();
    let spec = (!cdi_devices.is_empty()).then(|| cdi::Spec {
        cdi_version: cdi::CDI_VERSION.into(),
        kind,
        devices: cdi_devices,
        container_edits: ContainerEdits {
            env: spec_env,
            device_nodes: CONTROL_DEVICE_NODES
                .iter()
                .map(|p| DeviceNode {
                    path: p.to_string(),
                })
                .collect(),
        },
    });
    Ok(ClaimPlan {
        devices: prepared,
        spec,
        sharing,
        mps,
    })
}

/// A GPU of a claim's MPS daemon and the claim's devices on it.
struct MpsGpu<'a> {
    gpu: &'a Gpu,
    devices: Vec<&'a str>,
}

/// Resolves an `mpsConfig` against the GPUs of the claim's daemon: every per-device key must
/// name one of them (by index, UUID or allocated device name), no GPU twice, and no limit
/// may exceed the memory of the GPU it applies to.
fn mps_settings(
    id: &str,
    config: Option<&MpsConfig>,
    gpus: &[MpsGpu<'_>],
) -> Result<MpsSettings, String> {
    let mut settings = MpsSettings {
        gpu_uuids: gpus.iter().map(|g| g.gpu.uuid.clone()).collect(),
        ..Default::default()
    };
    let Some(config) = config else {
        return Ok(settings);
    };
    let too_large = |field: &str, limit: &crate::config::MemoryLimit, gpu: &Gpu| {
        (limit.bytes() > gpu.memory_bytes).then(|| {
            format!(
                "claim {id}: {field} {limit} is more than the {} of memory of GPU {}",
                format_bytes(gpu.memory_bytes),
                gpu.device_name()
            )
        })
    };
    if let Some(limit) = &config.default_pinned_device_memory_limit {
        for g in gpus {
            if let Some(e) = too_large("mpsConfig.defaultPinnedDeviceMemoryLimit", limit, g.gpu) {
                return Err(e);
            }
        }
    }
    let mut keys: BTreeMap<usize, &DeviceSelector> = BTreeMap::new();
    for (key, limit) in config
        .default_per_device_pinned_memory_limit
        .iter()
        .flatten()
    {
        let field = "mpsConfig.defaultPerDevicePinnedMemoryLimit";
        let index = match key {
            DeviceSelector::Index(i) => (*i < gpus.len()).then_some(*i).ok_or_else(|| {
                format!(
                    "device index {i}, but the claim has {} GPU(s) shared with MPS",
                    gpus.len()
                )
            }),
            DeviceSelector::Uuid(uuid) => gpus
                .iter()
                .position(|g| g.gpu.uuid == *uuid)
                .ok_or_else(|| "no GPU of the claim has this UUID".to_string()),
            DeviceSelector::Name(name) => gpus
                .iter()
                .position(|g| g.devices.contains(&name.as_str()))
                .ok_or_else(|| "no device of the claim shared with MPS has this name".to_string()),
        }
        .map_err(|cause| format!("claim {id}: {field} key \"{key}\": {cause}"))?;
        if let Some(other) = keys.insert(index, key) {
            return Err(format!(
                "claim {id}: {field} keys \"{other}\" and \"{key}\" name the same GPU"
            ));
        }
        if let Some(e) = too_large(&format!("{field}[{key}]"), limit, gpus[index].gpu) {
            return Err(e);
        }
        settings.pinned_memory_limits.insert(index, limit.clone());
    }
    settings.active_thread_percentage = config.default_active_thread_percentage;
    settings.default_pinned_memory_limit = config.default_pinned_device_memory_limit.clone();
    Ok(settings)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::backend::fake::Profile;
    use crate::config::TimeSliceInterval;
    use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
        DeviceRequestAllocationResult, OpaqueDeviceConfiguration, ResourceClaimStatus,
    };
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
    use serde_json::json;

    /// Claim UIDs as the API server writes them.
    pub(crate) const U1: &str = "8a3f5c2e-0001-4b7d-9e21-5f6a7b8c9d01";
    pub(crate) const U2: &str = "8a3f5c2e-0002-4b7d-9e21-5f6a7b8c9d02";
    pub(crate) const U3: &str = "8a3f5c2e-0003-4b7d-9e21-5f6a7b8c9d03";
    pub(crate) const U4: &str = "8a3f5c2e-0004-4b7d-9e21-5f6a7b8c9d04";
    pub(crate) const U5: &str = "8a3f5c2e-0005-4b7d-9e21-5f6a7b8c9d05";
    /// A UID nothing was prepared for.
    pub(crate) const NOPE: &str = "8a3f5c2e-0000-4b7d-9e21-000000000000";

    pub(crate) fn gpus(profile: &str) -> Vec<Gpu> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("profiles")
            .join(profile);
        Profile::load(&path).unwrap().gpus
    }

    /// A claim allocated on `node` with `(request, device)` results.
    pub(crate) fn claim(uid: &str, node: &str, results: &[(&str, &str)]) -> ResourceClaim {
        let mut c = ResourceClaim::default();
        c.metadata.name = Some("c1".into());
        c.metadata.namespace = Some("ns".into());
        c.metadata.uid = Some(uid.into());
        c.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(
                        results
                            .iter()
                            .map(|(req, dev)| DeviceRequestAllocationResult {
                                request: req.to_string(),
                                driver: "gpu.nvidia.com".into(),
                                pool: node.into(),
                                device: dev.to_string(),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                    config: None,
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
        c
    }

    /// The devices of the claim's allocation.
    pub(crate) fn allocated_devices(c: &mut ResourceClaim) -> &mut DeviceAllocationResult {
        c.status
            .as_mut()
            .unwrap()
            .allocation
            .as_mut()
            .unwrap()
            .devices
            .as_mut()
            .unwrap()
    }

    pub(crate) fn with_config(
        mut c: ResourceClaim,
        source: &str,
        requests: &[&str],
        params: serde_json::Value,
    ) -> ResourceClaim {
        allocated_devices(&mut c)
            .config
            .get_or_insert_with(Vec::new)
            .push(DeviceAllocationConfiguration {
                source: source.into(),
                requests: Some(requests.iter().map(|s| s.to_string()).collect()),
                opaque: Some(OpaqueDeviceConfiguration {
                    driver: "gpu.nvidia.com".into(),
                    parameters: RawExtension(params),
                }),
            });
        c
    }

    fn want(uid: &str) -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            uid: uid.into(),
            name: "c1".into(),
        }
    }

    fn ctx<'a>(gpus: &'a [Gpu]) -> PlanContext<'a> {
        PlanContext {
            driver: "gpu.nvidia.com",
            node: "node-a",
            gpus,
            mps_dir: "/run/mps",
        }
    }

    #[test]
    fn plans_cdi_spec_with_device_nodes_env_and_ids() {
        let g = gpus("8x-h100-80gb-2numa-2nic.yaml");
        let plan = plan_claim(
            &claim(U1, "node-a", &[("gpu", "gpu-3"), ("gpu", "gpu-4")]),
            &want(U1),
            &ctx(&g),
        )
        .unwrap();
        assert_eq!(
            plan.devices[0],
            PreparedDevice {
                request_names: vec!["gpu".into()],
                pool_name: "node-a".into(),
                device_name: "gpu-3".into(),
                cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim={U1}-gpu-3")],
                share_id: None,
                admin_access: false,
                consumed_capacity: Default::default(),
            }
        );
        let spec = plan.spec.unwrap();
        assert_eq!(spec.kind, "k8s.gpu.nvidia.com/claim");
        assert_eq!(spec.devices[1].name, format!("{U1}-gpu-4"));
        assert_eq!(
            spec.devices[1].container_edits.device_nodes,
            vec![DeviceNode {
                path: "/dev/nvidia4".into()
            }]
        );
        assert_eq!(
            spec.devices[1].container_edits.env,
            vec![format!("DRA_GPU_GPU_4_UUID={}", g[4].uuid)]
        );
        let control: Vec<_> = spec
            .container_edits
            .device_nodes
            .iter()
            .map(|d| d.path.as_str())
            .collect();
        assert_eq!(
            control,
            ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        );
        assert!(plan.sharing.is_empty());
    }

    #[test]
    fn uid_mismatch_unallocated_and_other_node_are_errors() {
        let g = gpus("8x-h100-80gb-2numa-2nic.yaml");
        let e = plan_claim(
            &claim(U2, "node-a", &[("gpu", "gpu-0")]),
            &want(U1),
            &ctx(&g),
        )
        .unwrap_err();
        assert_eq!(
            e,
            format!(
                "claim ns/c1 has UID {U2} in the API server, kubelet asked for {U1}: it was deleted and recreated"
            )
        );
        let mut c = claim(U1, "node-a", &[]);
        c.status = None;
        assert_eq!(
            plan_claim(&c, &want(U1), &ctx(&g)).unwrap_err(),
            "claim ns/c1 is not allocated"
        );
        let e = plan_claim(
            &claim(U1, "node-b", &[("gpu", "gpu-0")]),
            &want(U1),
            &ctx(&g),
        )
        .unwrap_err();
        assert_eq!(
            e,
            "claim ns/c1 is allocated to node node-b, not to this node node-a"
        );
        let e = plan_claim(
            &claim(U1, "node-a", &[("gpu", "gpu-9")]),
            &want(U1),
            &ctx(&g),
        )
        .unwrap_err();
        assert_eq!(e, "claim ns/c1: device gpu-9 is not present on node node-a");
    }

    #[test]
    fn other_drivers_results_are_ignored() {
        let g = gpus("8x-h100-80gb-2numa-2nic.yaml");
        let mut c = claim(U1, "node-a", &[("nic", "eth0")]);
        c.status
            .as_mut()
            .unwrap()
            .allocation
            .as_mut()
            .unwrap()
            .devices
            .as_mut()
            .unwrap()
            .results
            .as_mut()
            .unwrap()[0]
            .driver = "net.example.com".into();
        let plan = plan_claim(&c, &want(U1), &ctx(&g)).unwrap();
        assert!(plan.devices.is_empty() && plan.spec.is_none());
    }

    #[test]
    fn claim_config_overrides_class_config_per_request() {
        let g = gpus("8x-h100-80gb-2numa-2nic.yaml");
        let ts = |i: &str| json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": i}}});
        let c = claim(U1, "node-a", &[("a", "gpu-0"), ("b/small", "gpu-1")]);
        let c = with_config(c, "FromClass", &[], ts("Short"));
        let c = with_config(c, "FromClaim", &["b"], ts("Long"));
        let plan = plan_claim(&c, &want(U1), &ctx(&g)).unwrap();
        let interval = |m: u32| {
            plan.sharing
                .iter()
                .find(|s| s.minor == m)
                .unwrap()
                .sharing
                .time_slicing_config
                .as_ref()
                .unwrap()
                .interval
        };
        assert_eq!(interval(0), TimeSliceInterval::Short);
        assert_eq!(interval(1), TimeSliceInterval::Long);
        let env = &plan.spec.unwrap().devices[1].container_edits.env;
        assert!(
            env.contains(&"DRA_GPU_GPU_1_TIMESLICE_INTERVAL=Long".to_string()),
            "{env:?}"
        );
    }

    #[test]
    fn malformed_config_is_an_error_for_the_claim() {
        let g = gpus("8x-h100-80gb-2numa-2nic.yaml");
        let c = with_config(
            claim(U1, "node-a", &[("gpu", "gpu-0")]),
            "FromClaim",
            &["gpu"],
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "bogus": 1}}),
        );
        let e = plan_claim(&c, &want(U1), &ctx(&g)).unwrap_err();
        assert!(e.starts_with("claim ns/c1: FromClaim config for requests [gpu]: invalid GpuConfig: unknown field `bogus`"), "{e}");
    }

    #[test]
    fn mig_device_gets_parent_node_and_profile_env() {
        let g = gpus("4x-a100-40gb-mig.yaml");
        let c = with_config(
            claim(U1, "node-a", &[("mig", "gpu-2-mig-1g5gb-19-3")]),
            "FromClaim",
            &[],
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25}}}),
        );
        let plan = plan_claim(&c, &want(U1), &ctx(&g)).unwrap();
        let spec = plan.spec.unwrap();
        assert_eq!(
            spec.devices[0].container_edits.device_nodes[0].path,
            "/dev/nvidia2"
        );
        let env = &spec.devices[0].container_edits.env;
        assert!(
            env.contains(&"DRA_GPU_GPU_2_MIG_1G5GB_19_3_MIG_PROFILE=1g.5gb".to_string()),
            "{env:?}"
        );
        assert!(
            spec.container_edits
                .env
                .contains(&format!("CUDA_MPS_PIPE_DIRECTORY=/run/mps/{U1}/pipe"))
        );
        assert!(
            spec.container_edits
                .env
                .contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25".to_string())
        );
        assert_eq!(plan.sharing[0].minor, 2);
    }

    fn mps_config(config: serde_json::Value) -> serde_json::Value {
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
               "sharing": {"strategy": "MPS", "mpsConfig": config}})
    }

    #[test]
    fn the_mps_daemon_settings_resolve_keys_to_the_claims_gpus() {
        let g = gpus("8x-h100-80gb-2numa-2nic.yaml");
        let c = with_config(
            claim(U1, "node-a", &[("gpu", "gpu-3"), ("gpu", "gpu-4")]),
            "FromClaim",
            &[],
            mps_config(json!({
                "defaultActiveThreadPercentage": 30,
                "defaultPinnedDeviceMemoryLimit": "8Gi",
                "defaultPerDevicePinnedMemoryLimit": {"1": "2Gi", g[3].uuid.clone(): "4Gi"},
            })),
        );
        let plan = plan_claim(&c, &want(U1), &ctx(&g)).unwrap();
        let limit = |t: &str| crate::config::MemoryLimit::parse(t).unwrap();
        assert_eq!(
            plan.mps.unwrap(),
            MpsSettings {
                gpu_uuids: vec![g[3].uuid.clone(), g[4].uuid.clone()],
                active_thread_percentage: crate::config::Percentage::new(30),
                default_pinned_memory_limit: Some(limit("8Gi")),
                pinned_memory_limits: [(0, limit("4Gi")), (1, limit("2Gi"))].into(),
            }
        );
        // Without MPS there is no daemon.
        let plain = plan_claim(
            &claim(U1, "node-a", &[("gpu", "gpu-3")]),
            &want(U1),
            &ctx(&g),
        );
        assert_eq!(plain.unwrap().mps, None);
    }

    #[test]
    fn a_mig_partition_is_named_in_mps_config_by_its_device_name() {
        let g = gpus("4x-a100-40gb-mig.yaml");
        let with = |key: &str| {
            with_config(
                claim(U1, "node-a", &[("mig", "gpu-2-mig-1g5gb-19-3")]),
                "FromClaim",
                &[],
                mps_config(json!({"defaultPerDevicePinnedMemoryLimit": {key: "1Gi"}})),
            )
        };
        let plan = plan_claim(&with("gpu-2-mig-1g5gb-19-3"), &want(U1), &ctx(&g)).unwrap();
        let mps = plan.mps.unwrap();
        assert_eq!(mps.gpu_uuids, [g[2].uuid.clone()]);
        assert_eq!(mps.pinned_memory_limits[&0].bytes(), 1 << 30);
        // The parent GPU is not a device of the claim.
        let e = plan_claim(&with("gpu-2"), &want(U1), &ctx(&g)).unwrap_err();
        assert_eq!(
            e,
            "claim ns/c1: mpsConfig.defaultPerDevicePinnedMemoryLimit key \"gpu-2\": no device of the claim shared with MPS has this name"
        );
    }

    #[test]
    fn every_mps_config_of_a_claim_is_checked_not_only_the_one_used() {
        let g = gpus("8x-h100-80gb-2numa-2nic.yaml");
        let c = claim(U1, "node-a", &[("a", "gpu-3"), ("b", "gpu-4")]);
        let c = with_config(c, "FromClaim", &["a"], mps_config(json!({})));
        let c = with_config(
            c,
            "FromClaim",
            &["b"],
            mps_config(json!({"defaultPerDevicePinnedMemoryLimit": {"2": "1Gi"}})),
        );
        let e = plan_claim(&c, &want(U1), &ctx(&g)).unwrap_err();
        assert_eq!(
            e,
            "claim ns/c1: mpsConfig.defaultPerDevicePinnedMemoryLimit key \"2\": device index 2, but the claim has 2 GPU(s) shared with MPS"
        );
    }

    #[test]
    fn claim_references_must_be_names_and_a_uid_the_api_server_could_write() {
        let g = gpus("8x-h100-80gb-2numa-2nic.yaml");
        let c = claim(U1, "node-a", &[("gpu", "gpu-0")]);
        let plan = |namespace: &str, uid: &str, name: &str| {
            plan_claim(
                &c,
                &ClaimRef {
                    namespace: namespace.into(),
                    uid: uid.into(),
                    name: name.into(),
                },
                &ctx(&g),
            )
            .unwrap_err()
        };
        assert_eq!(
            plan("ns", "../../etc", "c1"),
            "claim \"ns\"/\"c1\": UID \"../../etc\" is not an RFC 4122 UUID"
        );
        assert_eq!(
            plan("ns", "u1", "c1"),
            "claim \"ns\"/\"c1\": UID \"u1\" is not an RFC 4122 UUID"
        );
        assert_eq!(
            plan("ns", U1, "c1/../../x"),
            "claim ns/\"c1/../../x\": name \"c1/../../x\" is not a DNS-1123 subdomain"
        );
        assert_eq!(
            plan("ns", U1, "c1\nx"),
            "claim ns/\"c1\\nx\": name \"c1\\nx\" is not a DNS-1123 subdomain"
        );
        assert_eq!(
            plan("kube-system/..", U1, "c1"),
            "claim \"kube-system/..\"/\"c1\": namespace \"kube-system/..\" is not a DNS-1123 label"
        );
    }
}
