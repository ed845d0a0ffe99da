//! # dra-node-agent
//!
//! The node side of DRA for NVIDIA GPUs: one agent per GPU node, run as a kubelet DRA
//! plugin, publishing the same attribute names as NVIDIA's driver (`gpu.nvidia.com`).
//!
//! ## Brief overview
//!
//! - [`backend::GpuBackend`] discovers [`device::Gpu`]s: [`backend::nvml::NvmlBackend`]
//!   (libnvidia-ml loaded at run time) or [`backend::fake::FakeBackend`] (a YAML profile
//!   from `profiles/`). It also reports [`health::HealthEvent`]s.
//! - [`slices`] turns GPUs (+ [`health::HealthState`] taints) into the ResourceSlices of the
//!   node's pool. Pure. [`publisher::Publisher`] reconciles them with the API server.
//! - [`claim::plan_claim`] decides what preparing an allocated claim means (devices, CDI
//!   spec, sharing from the strict [`config::GpuConfig`], the claim's [`mps::MpsSettings`]).
//!   Pure. What kubelet and the claim provide is checked before it reaches a path or a
//!   process ([`validate`], [`quantity`]).
//!   [`prepare::Preparer`] carries plans out and keeps the [`checkpoint`]; it refuses a
//!   device that another live claim holds, as [`owners`] decides (pure).
//! - [`plugin`] serves kubelet's registration and `DRAPlugin` (v1 and v1beta1) gRPC services
//!   on Unix sockets (registration through the small HTTP/2 server of
//!   [`registration_server`], since kubelet sends a path as `:authority` there);
//!   [`metrics`] serves `/metrics` and `/healthz`.
//!
//! ```
//! use dra_node_agent::backend::fake::Profile;
//! use dra_node_agent::health::HealthState;
//! use dra_node_agent::slices::{NodeRef, build_slices, pool_contents};
//!
//! let profile = Profile::parse(include_str!("../profiles/1x-a5000-2x-t10.yaml")).unwrap();
//! let node = NodeRef { name: "node-1".into(), uid: "1234".into() };
//! let slices = build_slices(&node, "gpu.nvidia.com", &pool_contents(&profile.gpus, &HealthState::default()), 1);
//! assert_eq!(slices[0].spec.devices.as_ref().unwrap().len(), 3);
//! ```

pub mod backend;
pub mod cdi;
pub mod checkpoint;
pub mod claim;
pub mod config;
pub mod device;
pub mod health;
pub mod metrics;
pub mod mps;
pub mod owners;
pub mod plugin;
pub mod prepare;
pub mod publisher;
pub mod quantity;
pub mod registration_server;
pub mod slices;
pub mod validate;

/// Code generated from the kubelet protos in `proto/`.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    pub mod pluginregistration {
        tonic::include_proto!("pluginregistration");
    }
    pub mod dra_v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    pub mod dra_v1beta1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
    }
    pub mod dra_health_v1 {
        tonic::include_proto!("v1");
    }
}
