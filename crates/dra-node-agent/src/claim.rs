//! Deciding what preparing a claim means: which of its allocated devices are this driver's
//! on this node, which sharing config applies to each, and the CDI spec to write. Pure: the
//! caller reads the claim from the API server and performs the plan.

use crate::cdi::{self, CdiDevice, ContainerEdits, DeviceNode};
use crate::config::{Sharing, SharingStrategy, decode_gpu_config};
use crate::device::{CONTROL_DEVICE_NODES, DeviceRef, Gpu, find_device};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};

/// A claim as kubelet names it in a prepare/unprepare call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRef {
    pub namespace: String,
    pub uid: String,
    pub name: String,
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
        });
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
    })
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

    pub(crate) fn with_config(
        mut c: ResourceClaim,
        source: &str,
        requests: &[&str],
        params: serde_json::Value,
    ) -> ResourceClaim {
        let d = c
            .status
            .as_mut()
            .unwrap()
            .allocation
            .as_mut()
            .unwrap()
            .devices
            .as_mut()
            .unwrap();
        d.config
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
            &claim("u1", "node-a", &[("gpu", "gpu-3"), ("gpu", "gpu-4")]),
            &want("u1"),
            &ctx(&g),
        )
        .unwrap();
        assert_eq!(
            plan.devices[0],
            PreparedDevice {
                request_names: vec!["gpu".into()],
                pool_name: "node-a".into(),
                device_name: "gpu-3".into(),
                cdi_device_ids: vec!["k8s.gpu.nvidia.com/claim=u1-gpu-3".into()],
                share_id: None,
            }
        );
        let spec = plan.spec.unwrap();
        assert_eq!(spec.kind, "k8s.gpu.nvidia.com/claim");
        assert_eq!(spec.devices[1].name, "u1-gpu-4");
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
            &claim("u2", "node-a", &[("gpu", "gpu-0")]),
            &want("u1"),
            &ctx(&g),
        )
        .unwrap_err();
        assert_eq!(
            e,
            "claim ns/c1 has UID u2 in the API server, kubelet asked for u1: it was deleted and recreated"
        );
        let mut c = claim("u1", "node-a", &[]);
        c.status = None;
        assert_eq!(
            plan_claim(&c, &want("u1"), &ctx(&g)).unwrap_err(),
            "claim ns/c1 is not allocated"
        );
        let e = plan_claim(
            &claim("u1", "node-b", &[("gpu", "gpu-0")]),
            &want("u1"),
            &ctx(&g),
        )
        .unwrap_err();
        assert_eq!(
            e,
            "claim ns/c1 is allocated to node node-b, not to this node node-a"
        );
        let e = plan_claim(
            &claim("u1", "node-a", &[("gpu", "gpu-9")]),
            &want("u1"),
            &ctx(&g),
        )
        .unwrap_err();
        assert_eq!(e, "claim ns/c1: device gpu-9 is not present on node node-a");
    }

    #[test]
    fn other_drivers_results_are_ignored() {
        let g = gpus("8x-h100-80gb-2numa-2nic.yaml");
        let mut c = claim("u1", "node-a", &[("nic", "eth0")]);
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
        let plan = plan_claim(&c, &want("u1"), &ctx(&g)).unwrap();
        assert!(plan.devices.is_empty() && plan.spec.is_none());
    }

    #[test]
    fn claim_config_overrides_class_config_per_request() {
        let g = gpus("8x-h100-80gb-2numa-2nic.yaml");
        let ts = |i: &str| json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": i}}});
        let c = claim("u1", "node-a", &[("a", "gpu-0"), ("b/small", "gpu-1")]);
        let c = with_config(c, "FromClass", &[], ts("Short"));
        let c = with_config(c, "FromClaim", &["b"], ts("Long"));
        let plan = plan_claim(&c, &want("u1"), &ctx(&g)).unwrap();
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
            claim("u1", "node-a", &[("gpu", "gpu-0")]),
            "FromClaim",
            &["gpu"],
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "bogus": 1}}),
        );
        let e = plan_claim(&c, &want("u1"), &ctx(&g)).unwrap_err();
        assert!(e.starts_with("claim ns/c1: FromClaim config for requests [gpu]: invalid GpuConfig: unknown field `bogus`"), "{e}");
    }

    #[test]
    fn mig_device_gets_parent_node_and_profile_env() {
        let g = gpus("4x-a100-40gb-mig.yaml");
        let c = with_config(
            claim("u1", "node-a", &[("mig", "gpu-2-mig-1g5gb-19-3")]),
            "FromClaim",
            &[],
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25}}}),
        );
        let plan = plan_claim(&c, &want("u1"), &ctx(&g)).unwrap();
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
                .contains(&"CUDA_MPS_PIPE_DIRECTORY=/run/mps/u1/pipe".to_string())
        );
        assert!(
            spec.container_edits
                .env
                .contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25".to_string())
        );
        assert_eq!(plan.sharing[0].minor, 2);
    }
}
