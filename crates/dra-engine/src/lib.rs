#![forbid(unsafe_code)]
//! The scheduling engine of dra-scheduler: cluster state in, decisions out.
//!
//! Brief overview:
//! - [`ClusterState`] holds nodes (with what their bound pods use), pods, claims and the DRA
//!   objects; one writer applies updates (the daemon's informers or `simulate`).
//! - [`Engine::schedule`] runs one pod's scheduling cycle over the profile's plugins
//!   ([`framework`], [`plugins`]), shaped as kube-scheduler's framework: PreFilter,
//!   Filter per node (DynamicResources asks the allocator, `dra-allocator`, for devices),
//!   PreScore and Score on the feasible nodes, the best node, Reserve. It returns a
//!   [`Decision`]; [`Engine::evaluate`] returns every node's verdict and score instead.
//! - [`Engine::assume`] records a decision so the next pod sees it before any API write
//!   lands; [`Engine::forget`] takes it back when a write fails.
//! - [`Engine::schedule_group`] places a PodGroup's members in one decision ([`group`]:
//!   gang `minCount`, joint allocation of the members' devices, topology domains), taken
//!   with [`Engine::assume_group`] and given back with [`Engine::forget_group`].
//! - [`Engine::preempt`] (PostFilter, [`preemption`]) finds the pods of lower priority to
//!   evict so that a pod that fits nowhere fits, counting the devices their claims give
//!   back; [`Engine::nominate`] holds those devices for the pod while the victims go.
//!   [`Engine::preempt_group`] does so for a PodGroup's pending members as one.
//! - [`Engine::handoff`] says when a pod placed on a lower-ranked `firstAvailable`
//!   subrequest would get a better one from a terminating pod's devices ([`handoff`]), and
//!   [`Engine::degraded`] which bound pods run on a worse device than is free now.
//!
//! Nothing here does I/O: the same code serves the live daemon and the offline simulator.
//!
//! ```
//! use dra_engine::{ClusterInput, Engine, EngineConfig, Decision, ObjectKey};
//! let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
//!     "metadata": {"name": "n1"},
//!     "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}})).unwrap();
//! let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
//!     "metadata": {"name": "p", "namespace": "default"},
//!     "spec": {"schedulerName": "dra-scheduler", "containers": [
//!         {"name": "c", "resources": {"requests": {"cpu": "1"}}}]}})).unwrap();
//! let mut engine = Engine::new(EngineConfig::default(),
//!     ClusterInput { nodes: vec![node], pods: vec![pod], ..Default::default() });
//! let decision = engine.schedule(&ObjectKey::new("default", "p"));
//! assert_eq!(decision.node(), Some("n1"));
//! ```

mod changes;
pub mod claims;
mod cycle;
pub mod device_memo;
pub mod engine;
pub mod explain;
pub mod extended;
pub mod framework;
pub mod group;
pub mod handoff;
pub mod inventory;
pub mod node_allocatable;
pub mod node_tree;
pub mod plugins;
pub mod preemption;
pub mod queueing_hints;
pub mod resources;
pub mod state;

pub use cycle::Evaluation;
pub use dra_allocator::Features;
pub use engine::{
    ClaimDecision, DEFAULT_FILTER_TIMEOUT, Decision, Engine, EngineConfig, Placement,
    VolumeDecision,
};
pub use framework::Profile;
pub use framework::in_pool;
pub use group::{GroupDecision, GroupPlacement};
pub use handoff::{Degradation, Handoff, Owners};
pub use preemption::{GroupPreemption, Preemption, Victim};
pub use state::{ClusterInput, ClusterState, NodeInfo, ObjectKey};
