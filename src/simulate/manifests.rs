//! Reading Kubernetes manifests for `simulate`: files and directories of YAML or JSON,
//! several documents a file, each checked strictly (an unknown field is an error, as
//! `kubectl apply` does by default) and reported by file, document and object.

use std::fmt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceTaintRule, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use serde::Deserialize;
use serde_json::Value;

/// Where a document came from: the file and the document's position in it (1-based).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub file: PathBuf,
    pub document: usize,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (document {})", self.file.display(), self.document)
    }
}

/// One object `simulate` understands.
// Objects are read once per document and moved straight into the cluster input; boxing the
// large variants would only add noise.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Object {
    Namespace(Namespace),
    Node(Node),
    Pod(Pod),
    Deployment(Deployment),
    ReplicaSet(ReplicaSet),
    StatefulSet(StatefulSet),
    Job(Job),
    ResourceClaim(ResourceClaim),
    ResourceClaimTemplate(ResourceClaimTemplate),
    DeviceClass(DeviceClass),
    ResourceSlice(ResourceSlice),
    DeviceTaintRule(DeviceTaintRule),
    PriorityClass(PriorityClass),
}

/// Invalid input: names the file, the document, the object when known, and the cause.
#[derive(Debug, thiserror::Error)]
#[error("{location}{}: {message}", object.as_ref().map(|o| format!(": {o}")).unwrap_or_default())]
pub struct ManifestError {
    pub location: Source,
    /// `Kind namespace/name` or `Kind name`.
    pub object: Option<String>,
    pub message: String,
}

/// A document that was read and understood.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub source: Source,
    pub object: Object,
}

/// A document of a kind that plays no part in scheduling (a Service, a ConfigMap, ...).
#[derive(Clone, Debug)]
pub struct Ignored {
    pub source: Source,
    pub object: String,
}

#[derive(Debug, Default)]
pub struct Manifests {
    pub objects: Vec<Loaded>,
    pub ignored: Vec<Ignored>,
}

/// Kinds that may sit beside workloads in a manifest folder but do not affect placement.
const IGNORED_KINDS: &[&str] = &[
    "Service",
    "ConfigMap",
    "Secret",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
    "Ingress",
    "NetworkPolicy",
    "PodDisruptionBudget",
    "HorizontalPodAutoscaler",
    "PersistentVolumeClaim",
    "StorageClass",
    "CustomResourceDefinition",
    "LimitRange",
    "ResourceQuota",
    "Endpoints",
    "EndpointSlice",
];

/// Every manifest file below `paths`: files as given, directories walked in lexical order.
pub fn files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if meta.is_dir() {
            walk(path, &mut out)?;
        } else {
            out.push(path.clone());
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for entry in entries {
        if entry.is_dir() {
            walk(&entry, out)?;
        } else if matches!(
            entry.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            out.push(entry);
        }
    }
    Ok(())
}

/// Read every document below `paths`.
pub fn load(paths: &[PathBuf]) -> Result<Manifests, ManifestError> {
    let files = files(paths).map_err(|message| ManifestError {
        location: Source {
            file: PathBuf::new(),
            document: 0,
        },
        object: None,
        message,
    })?;
    let mut manifests = Manifests::default();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|e| ManifestError {
            location: Source {
                file: file.clone(),
                document: 0,
            },
            object: None,
            message: e.to_string(),
        })?;
        parse_file(&file, &text, &mut manifests)?;
    }
    Ok(manifests)
}

/// Parse one file's documents into `into`.
pub fn parse_file(file: &Path, text: &str, into: &mut Manifests) -> Result<(), ManifestError> {
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let index = index + 1;
        let source = Source {
            file: file.to_path_buf(),
            document: index,
        };
        let value = serde_yaml::Value::deserialize(document).map_err(|e| ManifestError {
            location: source.clone(),
            object: None,
            message: format!("not valid YAML: {e}"),
        })?;
        if value.is_null() {
            continue; // an empty document (`---` at the end)
        }
        let value: Value = serde_json::to_value(&value).map_err(|e| ManifestError {
            location: source.clone(),
            object: None,
            message: format!("not a Kubernetes object: {e}"),
        })?;
        parse_object(value, &source, into)?;
    }
    Ok(())
}

fn describe(value: &Value) -> String {
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("<no kind>");
    let meta = value.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("<no name>");
    match meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
    {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

fn parse_object(value: Value, source: &Source, into: &mut Manifests) -> Result<(), ManifestError> {
    let error = |message: String| ManifestError {
        location: source.clone(),
        object: Some(describe(&value)),
        message,
    };
    if !value.is_object() {
        return Err(ManifestError {
            location: source.clone(),
            object: None,
            message: "a document must be a Kubernetes object (a mapping with apiVersion and kind)"
                .into(),
        });
    }
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
    if api_version.is_empty() || kind.is_empty() {
        return Err(error("apiVersion and kind are required".into()));
    }
    if kind == "List" {
        for item in value
            .get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
        {
            parse_object(item, source, into)?;
        }
        return Ok(());
    }
    if value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(error("metadata.name is required".into()));
    }
    let expect = |want: &str| -> Result<(), ManifestError> {
        if api_version == want {
            Ok(())
        } else {
            Err(error(format!(
                "apiVersion {api_version} is not supported for {kind}; use {want}"
            )))
        }
    };
    let object = match kind {
        "Namespace" => expect("v1").and_then(|_| strict(&value).map(Object::Namespace)),
        "Node" => expect("v1").and_then(|_| strict(&value).map(Object::Node)),
        "Pod" => expect("v1").and_then(|_| strict(&value).map(Object::Pod)),
        "Deployment" => expect("apps/v1").and_then(|_| strict(&value).map(Object::Deployment)),
        "ReplicaSet" => expect("apps/v1").and_then(|_| strict(&value).map(Object::ReplicaSet)),
        "StatefulSet" => expect("apps/v1").and_then(|_| strict(&value).map(Object::StatefulSet)),
        "Job" => expect("batch/v1").and_then(|_| strict(&value).map(Object::Job)),
        "PriorityClass" => {
            expect("scheduling.k8s.io/v1").and_then(|_| strict(&value).map(Object::PriorityClass))
        }
        "ResourceClaim" => {
            expect("resource.k8s.io/v1").and_then(|_| strict(&value).map(Object::ResourceClaim))
        }
        "ResourceClaimTemplate" => expect("resource.k8s.io/v1")
            .and_then(|_| strict(&value).map(Object::ResourceClaimTemplate)),
        "DeviceClass" => {
            expect("resource.k8s.io/v1").and_then(|_| strict(&value).map(Object::DeviceClass))
        }
        "ResourceSlice" => {
            expect("resource.k8s.io/v1").and_then(|_| strict(&value).map(Object::ResourceSlice))
        }
        "DeviceTaintRule" => {
            expect("resource.k8s.io/v1").and_then(|_| strict(&value).map(Object::DeviceTaintRule))
        }
        other if IGNORED_KINDS.contains(&other) => {
            into.ignored.push(Ignored {
                source: source.clone(),
                object: describe(&value),
            });
            return Ok(());
        }
        other => Err(error(format!(
            "kind {other} is not one simulate understands (Namespace, Node, Pod, Deployment, \
             ReplicaSet, StatefulSet, Job, PriorityClass, ResourceClaim, ResourceClaimTemplate, \
             DeviceClass, ResourceSlice, DeviceTaintRule)"
        ))),
    };
    let object = object.map_err(|mut e| {
        e.location = source.clone();
        e.object = Some(describe(&value));
        e
    })?;
    if let Err(message) = validate(&object) {
        return Err(error(message));
    }
    into.objects.push(Loaded {
        source: source.clone(),
        object,
    });
    Ok(())
}

/// A DNS label (RFC 1123): what the API server requires of device and request names.
fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

fn label(what: &str, path: &str, name: &str) -> Result<(), String> {
    if is_dns_label(name) {
        Ok(())
    } else {
        Err(format!(
            "{path}: invalid {what} {name:?}: must be a DNS label (lower case letters, digits and \
             '-', at most 63 characters, starting and ending with a letter or digit)"
        ))
    }
}

/// The checks of the API server's validation that most often catch a hand-written manifest:
/// names the API server would reject are rejected here too, so `simulate` never places a
/// workload on objects that could not exist.
fn validate(object: &Object) -> Result<(), String> {
    let claim_spec = |spec: Option<&k8s_openapi::api::resource::v1::ResourceClaimSpec>,
                      path: &str|
     -> Result<(), String> {
        let requests = spec
            .and_then(|s| s.devices.as_ref())
            .and_then(|d| d.requests.as_ref());
        for (i, r) in requests.into_iter().flatten().enumerate() {
            label(
                "request name",
                &format!("{path}.devices.requests[{i}].name"),
                &r.name,
            )?;
            for (j, sub) in r.first_available.iter().flatten().enumerate() {
                let at = format!("{path}.devices.requests[{i}].firstAvailable[{j}].name");
                label("subrequest name", &at, &sub.name)?;
            }
        }
        Ok(())
    };
    match object {
        Object::ResourceSlice(slice) => {
            for (i, d) in slice.spec.devices.iter().flatten().enumerate() {
                label("device name", &format!("spec.devices[{i}].name"), &d.name)?;
            }
            Ok(())
        }
        Object::ResourceClaim(c) => claim_spec(c.spec.as_ref(), "spec"),
        Object::ResourceClaimTemplate(t) => {
            claim_spec(t.spec.as_ref().and_then(|s| s.spec.as_ref()), "spec.spec")
        }
        _ => Ok(()),
    }
}

/// Deserialize `value` as `T`, rejecting fields `T` does not have.
fn strict<T>(value: &Value) -> Result<T, ManifestError>
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    let err = |message: String| ManifestError {
        location: Source {
            file: PathBuf::new(),
            document: 0,
        },
        object: None,
        message,
    };
    let typed: T = serde_json::from_value(value.clone()).map_err(|e| err(e.to_string()))?;
    // k8s-openapi ignores unknown fields; writing the object back and comparing keys finds them.
    let back = serde_json::to_value(&typed).map_err(|e| err(e.to_string()))?;
    if let Some(path) = unknown_field(value, &back, "") {
        return Err(err(format!("unknown field \"{path}\"")));
    }
    Ok(typed)
}

fn unknown_field(input: &Value, known: &Value, path: &str) -> Option<String> {
    match (input, known) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                if value.is_null() {
                    continue;
                }
                let here = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match b.get(key) {
                    None => return Some(here),
                    Some(other) => {
                        if let Some(p) = unknown_field(value, other, &here) {
                            return Some(p);
                        }
                    }
                }
            }
            None
        }
        (Value::Array(a), Value::Array(b)) => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (x, y))| unknown_field(x, y, &format!("{path}[{i}]"))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Manifests, ManifestError> {
        let mut m = Manifests::default();
        parse_file(Path::new("fleet.yaml"), text, &mut m).map(|_| m)
    }

    #[test]
    fn reads_several_documents_in_order() {
        let m = parse(
            "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {name: p1}\nspec: {containers: []}\n---\n",
        )
        .unwrap();
        assert_eq!(m.objects.len(), 2);
        assert!(matches!(m.objects[0].object, Object::Node(_)));
        assert_eq!(m.objects[1].source.document, 2);
    }

    #[test]
    fn a_typo_names_the_file_document_object_and_field() {
        let err = parse(
            "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {name: p1, namespace: ml}\n\
             spec:\n  containers:\n  - name: c\n    resourcse: {}\n",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "fleet.yaml (document 2): Pod ml/p1: unknown field \"spec.containers[0].resourcse\""
        );
    }

    #[test]
    fn wrong_api_version_and_unknown_kind_are_errors() {
        let err = parse(
            "apiVersion: resource.k8s.io/v1beta1\nkind: DeviceClass\nmetadata: {name: gpu}\n",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "fleet.yaml (document 1): DeviceClass gpu: apiVersion resource.k8s.io/v1beta1 is not \
             supported for DeviceClass; use resource.k8s.io/v1"
        );
        let err =
            parse("apiVersion: apps/v1\nkind: Deploymnet\nmetadata: {name: x}\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("kind Deploymnet is not one simulate understands")
        );
    }

    #[test]
    fn device_names_the_api_server_would_reject_are_invalid_input() {
        let err = parse(
            "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: s}\n\
             spec:\n  driver: gpu.example.com\n  nodeName: n1\n  \
             pool: {name: n1, generation: 1, resourceSliceCount: 1}\n  \
             devices: [{name: gpu-0}, {name: gpu-0-mig-1g.5gb}]\n",
        )
        .unwrap_err();
        assert!(
            err.to_string().starts_with(
                "fleet.yaml (document 1): ResourceSlice s: spec.devices[1].name: invalid device \
                 name \"gpu-0-mig-1g.5gb\": must be a DNS label"
            ),
            "{err}"
        );
    }

    #[test]
    fn services_are_ignored_not_rejected() {
        let m = parse("apiVersion: v1\nkind: Service\nmetadata: {name: web}\n").unwrap();
        assert!(m.objects.is_empty());
        assert_eq!(m.ignored[0].object, "Service web");
    }

    #[test]
    fn wrong_type_is_reported() {
        let err = parse(
            "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nspec: {unschedulable: maybe}\n",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("fleet.yaml (document 1): Node n1: invalid type"),
            "{err}"
        );
    }
}
