//! A synthetic GPU fleet for trying `simulate` at scale: nodes with 8 GPUs on 2 NUMA nodes
//! and 2 NICs each, as NVIDIA's driver and a NIC driver would publish them, plus a mix of
//! pending pods (1-GPU inference, 4-GPU + NIC training aligned on one NUMA node).

use std::fmt::Write;

/// What to generate.
#[derive(clap::Args, Clone, Debug)]
pub struct FleetSpec {
    /// Number of GPU nodes.
    #[arg(long, default_value_t = 500)]
    pub nodes: usize,
    /// GPUs per node (split evenly over 2 NUMA nodes).
    #[arg(long, default_value_t = 8)]
    pub gpus: usize,
    /// Pending pods: three in four ask for one GPU, one in four for 4 GPUs and a NIC on one
    /// NUMA node.
    #[arg(long, default_value_t = 2000)]
    pub pods: usize,
}

impl Default for FleetSpec {
    fn default() -> Self {
        FleetSpec {
            nodes: 500,
            gpus: 8,
            pods: 2000,
        }
    }
}

const CLASSES: &str = r#"apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.nvidia.com}
spec:
  selectors:
  - cel: {expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: nic.example.com}
spec:
  selectors:
  - cel: {expression: "device.driver == 'nic.example.com'"}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
          selectors:
          - cel: {expression: "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: four-gpus-one-nic}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {deviceClassName: gpu.nvidia.com, count: 4}
      - name: nic
        exactly: {deviceClassName: nic.example.com}
      constraints:
      - {requests: [gpus, nic], matchAttribute: resource.kubernetes.io/numaNode}
"#;

/// The fleet and workload as one multi-document YAML text.
pub fn generate_yaml(spec: &FleetSpec) -> String {
    let mut out = String::from(CLASSES);
    let per_numa = spec.gpus.div_ceil(2).max(1);
    for n in 0..spec.nodes {
        let node = format!("gpu-node-{n:04}");
        let _ = write!(
            out,
            "---\napiVersion: v1\nkind: Node\nmetadata: {{name: {node}, labels: {{kubernetes.io/hostname: {node}}}}}\n\
             status: {{allocatable: {{cpu: \"128\", memory: 1Ti, pods: \"110\"}}}}\n"
        );
        let _ = write!(
            out,
            "---\napiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {{name: {node}-gpus}}\nspec:\n  \
             driver: gpu.nvidia.com\n  nodeName: {node}\n  pool: {{name: {node}, generation: 1, resourceSliceCount: 1}}\n  devices:\n"
        );
        for g in 0..spec.gpus {
            let _ = write!(
                out,
                "  - name: gpu-{g}\n    attributes: {{type: {{string: gpu}}, productName: {{string: NVIDIA H100 80GB HBM3}}, \
                 resource.kubernetes.io/numaNode: {{int: {}}}}}\n    capacity: {{memory: {{value: 80Gi}}}}\n",
                g / per_numa
            );
        }
        let _ = write!(
            out,
            "---\napiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {{name: {node}-nics}}\nspec:\n  \
             driver: nic.example.com\n  nodeName: {node}\n  pool: {{name: {node}, generation: 1, resourceSliceCount: 1}}\n  devices:\n\
             \x20 - {{name: nic-0, attributes: {{resource.kubernetes.io/numaNode: {{int: 0}}}}}}\n\
             \x20 - {{name: nic-1, attributes: {{resource.kubernetes.io/numaNode: {{int: 1}}}}}}\n"
        );
    }
    for p in 0..spec.pods {
        let (name, template) = if p % 4 == 3 {
            (format!("train-{p:05}"), "four-gpus-one-nic")
        } else {
            (format!("infer-{p:05}"), "one-gpu")
        };
        let _ = write!(
            out,
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  schedulerName: dra-scheduler\n  \
             resourceClaims: [{{name: devices, resourceClaimTemplateName: {template}}}]\n  \
             containers: [{{name: c, image: busybox, resources: {{requests: {{cpu: \"1\", memory: 4Gi}}, claims: [{{name: devices}}]}}}}]\n"
        );
    }
    out
}
