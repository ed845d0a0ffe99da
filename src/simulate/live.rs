//! `simulate --from-cluster`: the live cluster as the simulation's starting state. Every kind
//! the scheduler's informers watch is listed once through the user's kubeconfig (nothing is
//! written), and taken as if it were a manifest: bound pods are the existing load, their
//! claims hold their devices, pending pods of this scheduler are scheduled first, as the
//! daemon would. The manifests given beside it are what the user is about to apply; an
//! object of the same kind, namespace and name replaces the cluster's.
//!
//! Controllers (ReplicaSets, StatefulSets, ReplicationControllers) are kept for their
//! selectors only: their pods exist already, so they make none here. Deployments, Jobs and
//! DaemonSets are not read (their pods and ReplicaSets are). Kinds the API server does not
//! serve (DeviceTaintRules before 1.37, PodGroups without the gate) are skipped.

use std::path::{Path, PathBuf};

use anyhow::Context;
use kube::api::ListParams;
use kube::{Api, Client};
use serde::de::DeserializeOwned;

use super::manifests::{Loaded, Manifests, Object, Source};

/// Where cluster objects come from, in messages: `cluster (Kind)`.
fn source() -> Source {
    Source {
        file: PathBuf::from("cluster"),
        document: 0,
    }
}

/// A client for the user's kubeconfig: `path`, else in-cluster, KUBECONFIG, ~/.kube/config.
pub async fn client(path: Option<&Path>) -> anyhow::Result<Client> {
    Ok(Client::try_from(crate::run::kube_config(path).await?)?)
}

/// Every object of kind `K`; none when the API server does not serve it and `optional`.
async fn list<K>(
    client: &Client,
    optional: bool,
    wrap: fn(K) -> Object,
) -> anyhow::Result<Vec<Loaded>>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    let kind = K::kind(&());
    let items = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(s)) if optional && s.code == 404 => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("list {kind}s")),
    };
    Ok(items
        .into_iter()
        .map(|o| Loaded {
            source: source(),
            object: wrap(o),
        })
        .collect())
}

/// A controller whose pods exist already: kept for its selector, making no pods.
fn no_replicas(mut object: Object) -> Object {
    match &mut object {
        Object::ReplicaSet(o) => o.spec.replicas = Some(0),
        Object::StatefulSet(o) => o.spec.replicas = Some(0),
        Object::ReplicationController(o) => {
            o.spec.get_or_insert_with(Default::default).replicas = Some(0)
        }
        _ => {}
    }
    object
}

/// The cluster's objects, as manifests.
pub async fn read(client: &Client) -> anyhow::Result<Manifests> {
    use k8s_openapi::api::{
        apps::v1 as apps, core::v1 as core, policy::v1 as policy, resource::v1 as resource,
        scheduling::v1 as scheduling, scheduling::v1beta1 as groups, storage::v1 as storage,
    };
    let c = client;
    let lists = [
        list::<core::Namespace>(c, false, Object::Namespace).await?,
        list::<core::Node>(c, false, Object::Node).await?,
        list::<resource::DeviceClass>(c, false, Object::DeviceClass).await?,
        list::<resource::ResourceSlice>(c, false, Object::ResourceSlice).await?,
        list::<resource::DeviceTaintRule>(c, true, Object::DeviceTaintRule).await?,
        list::<scheduling::PriorityClass>(c, false, Object::PriorityClass).await?,
        list::<storage::StorageClass>(c, false, Object::StorageClass).await?,
        list::<storage::CSINode>(c, false, Object::CSINode).await?,
        list::<storage::CSIDriver>(c, false, Object::CSIDriver).await?,
        list::<storage::VolumeAttachment>(c, false, Object::VolumeAttachment).await?,
        list::<core::PersistentVolume>(c, false, Object::PersistentVolume).await?,
        list::<core::PersistentVolumeClaim>(c, false, Object::PersistentVolumeClaim).await?,
        list::<core::Service>(c, false, Object::Service).await?,
        list::<core::ReplicationController>(c, false, Object::ReplicationController).await?,
        list::<apps::ReplicaSet>(c, false, Object::ReplicaSet).await?,
        list::<apps::StatefulSet>(c, false, Object::StatefulSet).await?,
        list::<policy::PodDisruptionBudget>(c, false, Object::PodDisruptionBudget).await?,
        list::<groups::PodGroup>(c, true, Object::PodGroup).await?,
        list::<resource::ResourceClaimTemplate>(c, false, Object::ResourceClaimTemplate).await?,
        list::<resource::ResourceClaim>(c, false, Object::ResourceClaim).await?,
        list::<core::Pod>(c, false, Object::Pod).await?,
    ];
    let objects = lists
        .into_iter()
        .flatten()
        .map(|l| Loaded {
            object: no_replicas(l.object),
            source: l.source,
        })
        .collect();
    Ok(Manifests {
        objects,
        ignored: Vec::new(),
    })
}

/// The cluster's objects with the manifests applied on top: an object of the same kind,
/// namespace and name is replaced, the others added after the cluster's.
pub fn apply(cluster: Manifests, files: Manifests) -> Manifests {
    let key = |l: &Loaded| {
        let meta = l.object.metadata();
        (l.object.kind(), meta.namespace.clone(), meta.name.clone())
    };
    let replaced: std::collections::BTreeSet<_> = files.objects.iter().map(key).collect();
    let mut objects: Vec<Loaded> = cluster
        .objects
        .into_iter()
        .filter(|l| !replaced.contains(&key(l)))
        .collect();
    objects.extend(files.objects);
    Manifests {
        objects,
        ignored: files.ignored,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loaded(kind: &str, name: &str, file: &str) -> Loaded {
        let object = match kind {
            "Pod" => Object::Pod(
                serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default"}}))
                .unwrap(),
            ),
            _ => Object::ReplicaSet(
                serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"replicas": 3, "selector": {}}}))
                .unwrap(),
            ),
        };
        Loaded {
            source: Source {
                file: PathBuf::from(file),
                document: 1,
            },
            object,
        }
    }

    #[test]
    fn a_manifest_replaces_the_clusters_object_of_the_same_kind_and_name() {
        let cluster = Manifests {
            objects: vec![loaded("Pod", "a", "cluster"), loaded("Pod", "b", "cluster")],
            ignored: vec![],
        };
        let files = Manifests {
            objects: vec![
                loaded("Pod", "b", "new.yaml"),
                loaded("Pod", "c", "new.yaml"),
            ],
            ignored: vec![],
        };
        let merged = apply(cluster, files);
        let names: Vec<(String, String)> = merged
            .objects
            .iter()
            .map(|l| {
                (
                    l.object.metadata().name.clone().unwrap(),
                    l.source.file.display().to_string(),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("a".to_string(), "cluster".to_string()),
                ("b".to_string(), "new.yaml".to_string()),
                ("c".to_string(), "new.yaml".to_string())
            ]
        );
    }

    #[test]
    fn the_clusters_controllers_make_no_pods_of_their_own() {
        let Object::ReplicaSet(rs) = no_replicas(loaded("ReplicaSet", "web", "cluster").object)
        else {
            panic!("a ReplicaSet");
        };
        assert_eq!(rs.spec.replicas, Some(0));
    }
}
