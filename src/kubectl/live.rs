//! What `kubectl dra` reads from the cluster, through the user's kubeconfig: every kind the
//! scheduler watches, listed once as `simulate --from-cluster` lists them, and for `-l` the
//! nodes the API server selects. Only `list` requests are made; nothing is written.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::Context;
use dra_engine::ClusterInput;
use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};

use crate::simulate::{self, Groups};

/// A client for the kubeconfig (`path`, else KUBECONFIG, ~/.kube/config, in-cluster) and
/// its `context` (else the current one), with the context's namespace (else `default`).
pub async fn connect(
    path: Option<&Path>,
    context: Option<&str>,
) -> anyhow::Result<(Client, String)> {
    let config = match context {
        None => crate::run::kube_config(path).await?,
        Some(context) => {
            let kubeconfig = match path {
                Some(path) => Kubeconfig::read_from(path)
                    .with_context(|| format!("read kubeconfig {}", path.display()))?,
                None => Kubeconfig::read().context("read the kubeconfig")?,
            };
            let options = KubeConfigOptions {
                context: Some(context.to_string()),
                ..Default::default()
            };
            kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?
        }
    };
    let namespace = config.default_namespace.clone();
    Ok((Client::try_from(config)?, namespace))
}

/// The cluster's state, as the engine's input, and its PodDisruptionBudgets and PodGroups.
pub async fn read(client: &Client) -> anyhow::Result<(ClusterInput, Groups)> {
    let manifests = simulate::live::read(client).await?;
    Ok(simulate::load_onto(manifests, &[])?)
}

/// The names of the nodes a label selector (`-l`) selects, as the API server reads it.
pub async fn selected_nodes(client: &Client, selector: &str) -> anyhow::Result<BTreeSet<String>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes
        .list(&ListParams::default().labels(selector))
        .await
        .with_context(|| format!("list Nodes with selector {selector:?}"))?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect())
}
