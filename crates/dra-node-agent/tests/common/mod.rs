//! Helpers shared by the integration tests: Nodes, profiles, slices as the API server has
//! them.

#![allow(dead_code)]

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::Api;
use kube::api::{ListParams, ObjectMeta, PostParams};
use std::path::PathBuf;

pub const DRIVER: &str = "gpu.nvidia.com";

/// A unique name for this test run (tests share one cluster).
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}-{}-{nanos:x}", std::process::id())
}

/// Creates a Node object (no kubelet behind it) and returns its UID.
pub async fn create_node(client: &kube::Client, name: &str) -> String {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    nodes
        .create(&PostParams::default(), &node)
        .await
        .unwrap_or_else(|e| panic!("create Node {name}: {e}"))
        .metadata
        .uid
        .unwrap()
}

pub fn profile(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("profiles")
        .join(name)
}

/// The node's slices of our driver, sorted by name.
pub async fn slices(client: &kube::Client, node: &str) -> Vec<ResourceSlice> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let mut items = api
        .list(&ListParams::default().fields(&format!("spec.nodeName={node},spec.driver={DRIVER}")))
        .await
        .expect("list slices")
        .items;
    items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    items
}

/// All devices of the node's slices, in slice order.
pub fn devices(slices: &[ResourceSlice]) -> Vec<Device> {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
        .collect()
}

pub fn string_attr(d: &Device, name: &str) -> Option<String> {
    d.attributes.as_ref()?.get(name)?.string.clone()
}
