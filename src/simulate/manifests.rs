//! Reading Kubernetes manifests for `simulate`: files and directories of YAML or JSON,
//! several documents a file, each checked strictly (an unknown field is an error, as
//! `kubectl apply` does by default) and reported by file, document and object.

use std::collections::HashSet;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, ReplicationController, Service,
};
use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceTaintRule, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::api::scheduling::v1beta1::{PodGroup, Workload};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeSeed;
use serde_json::Value;

use super::limits::{
    MAX_DEPTH, MAX_DOCUMENT_BYTES, MAX_DOCUMENTS_PER_FILE, MAX_FILE_BYTES, MAX_TOTAL_BYTES,
};
use super::{validate, yaml};

/// Where a document came from: the file and the document's position in it (1-based).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub file: PathBuf,
    pub document: usize,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.document == 0 {
            // The file as a whole (it cannot be read, or is too large).
            write!(f, "{}", self.file.display())
        } else {
            write!(f, "{} (document {})", self.file.display(), self.document)
        }
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
    ReplicationController(ReplicationController),
    Job(Job),
    /// Only its selector plays a part: PodTopologySpread's default constraints.
    Service(Service),
    ResourceClaim(ResourceClaim),
    ResourceClaimTemplate(ResourceClaimTemplate),
    DeviceClass(DeviceClass),
    ResourceSlice(ResourceSlice),
    DeviceTaintRule(DeviceTaintRule),
    PriorityClass(PriorityClass),
    PersistentVolume(PersistentVolume),
    PersistentVolumeClaim(PersistentVolumeClaim),
    StorageClass(StorageClass),
    CSINode(CSINode),
    CSIDriver(CSIDriver),
    /// Counts toward its node's CSI volume limits (NodeVolumeLimits).
    VolumeAttachment(VolumeAttachment),
    /// `scheduling.k8s.io/v1beta1`: read and checked; its PodGroups are the objects that
    /// are scheduled.
    Workload(Workload),
    /// Pods that name it in `spec.schedulingGroup` are scheduled together.
    PodGroup(PodGroup),
    /// Preemption respects it where it can.
    PodDisruptionBudget(k8s_openapi::api::policy::v1::PodDisruptionBudget),
}

impl Object {
    pub fn kind(&self) -> &'static str {
        match self {
            Object::Namespace(_) => "Namespace",
            Object::Node(_) => "Node",
            Object::Pod(_) => "Pod",
            Object::Deployment(_) => "Deployment",
            Object::ReplicaSet(_) => "ReplicaSet",
            Object::StatefulSet(_) => "StatefulSet",
            Object::ReplicationController(_) => "ReplicationController",
            Object::Job(_) => "Job",
            Object::Service(_) => "Service",
            Object::ResourceClaim(_) => "ResourceClaim",
            Object::ResourceClaimTemplate(_) => "ResourceClaimTemplate",
            Object::DeviceClass(_) => "DeviceClass",
            Object::ResourceSlice(_) => "ResourceSlice",
            Object::DeviceTaintRule(_) => "DeviceTaintRule",
            Object::PriorityClass(_) => "PriorityClass",
            Object::PersistentVolume(_) => "PersistentVolume",
            Object::PersistentVolumeClaim(_) => "PersistentVolumeClaim",
            Object::StorageClass(_) => "StorageClass",
            Object::CSINode(_) => "CSINode",
            Object::CSIDriver(_) => "CSIDriver",
            Object::VolumeAttachment(_) => "VolumeAttachment",
            Object::Workload(_) => "Workload",
            Object::PodGroup(_) => "PodGroup",
            Object::PodDisruptionBudget(_) => "PodDisruptionBudget",
        }
    }

    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Object::Namespace(o) => &o.metadata,
            Object::Node(o) => &o.metadata,
            Object::Pod(o) => &o.metadata,
            Object::Deployment(o) => &o.metadata,
            Object::ReplicaSet(o) => &o.metadata,
            Object::StatefulSet(o) => &o.metadata,
            Object::ReplicationController(o) => &o.metadata,
            Object::Job(o) => &o.metadata,
            Object::Service(o) => &o.metadata,
            Object::ResourceClaim(o) => &o.metadata,
            Object::ResourceClaimTemplate(o) => &o.metadata,
            Object::DeviceClass(o) => &o.metadata,
            Object::ResourceSlice(o) => &o.metadata,
            Object::DeviceTaintRule(o) => &o.metadata,
            Object::PriorityClass(o) => &o.metadata,
            Object::PersistentVolume(o) => &o.metadata,
            Object::PersistentVolumeClaim(o) => &o.metadata,
            Object::StorageClass(o) => &o.metadata,
            Object::CSINode(o) => &o.metadata,
            Object::CSIDriver(o) => &o.metadata,
            Object::VolumeAttachment(o) => &o.metadata,
            Object::Workload(o) => &o.metadata,
            Object::PodGroup(o) => &o.metadata,
            Object::PodDisruptionBudget(o) => &o.metadata,
        }
    }

    /// `Kind namespace/name` or `Kind name`, as written (before any defaulting), the way
    /// errors name objects.
    pub fn describe(&self) -> String {
        let meta = self.metadata();
        let name = meta.name.as_deref().unwrap_or("<no name>");
        match meta.namespace.as_deref() {
            Some(ns) => format!("{} {ns}/{name}", self.kind()),
            None => format!("{} {name}", self.kind()),
        }
    }
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

/// A document of a kind that plays no part in scheduling (a ConfigMap, a Secret, ...).
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
    "CustomResourceDefinition",
    "LimitRange",
    "ResourceQuota",
    "Endpoints",
    "EndpointSlice",
];

/// Every manifest file below `paths`, each once: files as given, directories walked in
/// lexical order (only `.yaml`, `.yml` and `.json` files in them). Symbolic links are
/// followed; a directory or file reached again (a link cycle, or two paths to the same
/// place) is read the first time only. Only regular files are read: a FIFO, socket or
/// device named on the command line, or given a manifest's name inside a directory, is an
/// error rather than a read that blocks or never ends.
pub fn files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, ManifestError> {
    let mut walk = Walk::default();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|e| file_error(path, e.to_string()))?;
        if meta.is_dir() {
            walk.dir(path)?;
        } else {
            walk.file(path, &meta)?;
        }
    }
    Ok(walk.out)
}

#[derive(Default)]
struct Walk {
    out: Vec<PathBuf>,
    dirs: HashSet<PathBuf>,
    files: HashSet<PathBuf>,
}

impl Walk {
    fn dir(&mut self, dir: &Path) -> Result<(), ManifestError> {
        let canonical = std::fs::canonicalize(dir).map_err(|e| file_error(dir, e.to_string()))?;
        if !self.dirs.insert(canonical) {
            return Ok(()); // walked already: a symlink cycle or a second path to it
        }
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| file_error(dir, e.to_string()))?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .map_err(|e| file_error(dir, e.to_string()))?;
        entries.sort();
        for entry in entries {
            let manifest = matches!(
                entry.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            );
            match std::fs::metadata(&entry) {
                Ok(meta) if meta.is_dir() => self.dir(&entry)?,
                Ok(meta) if manifest => self.file(&entry, &meta)?,
                // A dangling link with a manifest's name is a manifest that cannot be read.
                Err(e) if manifest => return Err(file_error(&entry, e.to_string())),
                _ => {}
            }
        }
        Ok(())
    }

    fn file(&mut self, path: &Path, meta: &std::fs::Metadata) -> Result<(), ManifestError> {
        if !meta.is_file() {
            return Err(file_error(path, not_regular(meta)));
        }
        let canonical = std::fs::canonicalize(path).map_err(|e| file_error(path, e.to_string()))?;
        if self.files.insert(canonical) {
            self.out.push(path.to_path_buf());
        }
        Ok(())
    }
}

fn file_error(path: &Path, message: String) -> ManifestError {
    ManifestError {
        location: Source {
            file: path.to_path_buf(),
            document: 0,
        },
        object: None,
        message,
    }
}

/// Why a path that is not a directory is not a manifest file either.
fn not_regular(meta: &std::fs::Metadata) -> String {
    let what = {
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            let t = meta.file_type();
            if t.is_fifo() {
                "a FIFO (named pipe)"
            } else if t.is_socket() {
                "a socket"
            } else if t.is_char_device() {
                "a character device"
            } else if t.is_block_device() {
                "a block device"
            } else {
                "not a regular file"
            }
        }
        #[cfg(not(unix))]
        {
            let _ = meta;
            "not a regular file"
        }
    };
    format!(
        "{what}: simulate reads only regular files (a stream could block or never end; \
         save it to a file first)"
    )
}

/// Read `file` whole, within [`MAX_FILE_BYTES`] and what is left of `total` (the bytes all
/// files may still take, of [`MAX_TOTAL_BYTES`]).
fn read(file: &Path, total: &mut u64) -> Result<String, ManifestError> {
    let error = |message: String| file_error(file, message);
    let handle = std::fs::File::open(file).map_err(|e| error(e.to_string()))?;
    // Checked again on the open file: the path may have changed since the walk.
    let meta = handle.metadata().map_err(|e| error(e.to_string()))?;
    if !meta.is_file() {
        return Err(error(not_regular(&meta)));
    }
    let too_big = |size: u64| {
        error(format!(
            "the file is {size} bytes, more than simulate reads from one file ({} MiB); \
             split it into several files",
            MAX_FILE_BYTES >> 20
        ))
    };
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_big(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    handle
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| error(e.to_string()))?;
    let size = bytes.len() as u64;
    if size > MAX_FILE_BYTES {
        return Err(too_big(size));
    }
    match total.checked_sub(size) {
        Some(left) => *total = left,
        None => {
            return Err(error(format!(
                "the manifests add up to more than simulate reads in one run ({} MiB)",
                MAX_TOTAL_BYTES >> 20
            )));
        }
    }
    String::from_utf8(bytes).map_err(|e| {
        error(format!(
            "not UTF-8 text (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        ))
    })
}

/// Read every document below `paths`.
pub fn load(paths: &[PathBuf]) -> Result<Manifests, ManifestError> {
    let files = files(paths)?;
    let mut manifests = Manifests::default();
    let mut total = MAX_TOTAL_BYTES;
    for file in files {
        let text = read(&file, &mut total)?;
        parse_file(&file, &text, &mut manifests)?;
    }
    Ok(manifests)
}

/// Parse one file's documents into `into`. Every document is measured against
/// [`MAX_DOCUMENT_BYTES`] and [`MAX_DEPTH`] before any is parsed, and parsed within a
/// budget of values, so no text makes this slow or large.
pub fn parse_file(file: &Path, text: &str, into: &mut Manifests) -> Result<(), ManifestError> {
    let documents = yaml::split_documents(text);
    let at = |document: usize| Source {
        file: file.to_path_buf(),
        document,
    };
    let error = |document: usize, message: String| ManifestError {
        location: at(document),
        object: None,
        message,
    };
    if documents.len() > MAX_DOCUMENTS_PER_FILE {
        return Err(error(
            0,
            format!(
                "{} documents, more than simulate reads from one file ({MAX_DOCUMENTS_PER_FILE})",
                documents.len()
            ),
        ));
    }
    for (index, document) in documents.iter().enumerate() {
        let size = document.range.len();
        if size > MAX_DOCUMENT_BYTES {
            return Err(error(
                index + 1,
                format!(
                    "the document (from line {}) is {size} bytes, more than simulate parses \
                     at once ({} MiB); split it into several documents",
                    document.first_line,
                    MAX_DOCUMENT_BYTES >> 20
                ),
            ));
        }
        if let Some(line) = yaml::flow_depth_exceeds(&text[document.range.clone()], MAX_DEPTH) {
            return Err(error(
                index + 1,
                format!(
                    "not valid YAML: mappings and sequences are nested more than {MAX_DEPTH} \
                     levels deep at line {}",
                    document.first_line + line - 1
                ),
            ));
        }
    }
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let index = index + 1;
        let source = at(index);
        let size = documents
            .get(index - 1)
            .map_or(text.len(), |d| d.range.len());
        let budget = yaml::Budget::for_document(size.min(MAX_DOCUMENT_BYTES));
        let value = yaml::ValueSeed {
            budget: &budget,
            depth: 0,
        }
        .deserialize(document)
        .map_err(|e| {
            // A limit's own message, at the parser's position, without the parser's path of
            // keys to the value.
            let message = match (budget.failure(), e.location()) {
                (Some(m), Some(at)) => format!("{m} at line {} column {}", at.line(), at.column()),
                (Some(m), None) => m,
                (None, _) => e.to_string(),
            };
            error(index, format!("not valid YAML: {message}"))
        })?;
        if value.is_null() {
            continue; // an empty document (`---` at the end)
        }
        parse_object(value, &source, into)?;
    }
    Ok(())
}

/// `Kind namespace/name` (or `Kind name`) of a parsed document, as errors name objects.
pub fn describe(value: &Value) -> String {
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
        "ReplicationController" => {
            expect("v1").and_then(|_| strict(&value).map(Object::ReplicationController))
        }
        "Job" => expect("batch/v1").and_then(|_| strict(&value).map(Object::Job)),
        "Service" => expect("v1").and_then(|_| strict(&value).map(Object::Service)),
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
        "PersistentVolume" => {
            expect("v1").and_then(|_| strict(&value).map(Object::PersistentVolume))
        }
        "PersistentVolumeClaim" => {
            expect("v1").and_then(|_| strict(&value).map(Object::PersistentVolumeClaim))
        }
        "StorageClass" => {
            expect("storage.k8s.io/v1").and_then(|_| strict(&value).map(Object::StorageClass))
        }
        "CSINode" => expect("storage.k8s.io/v1").and_then(|_| strict(&value).map(Object::CSINode)),
        "CSIDriver" => {
            expect("storage.k8s.io/v1").and_then(|_| strict(&value).map(Object::CSIDriver))
        }
        "VolumeAttachment" => {
            expect("storage.k8s.io/v1").and_then(|_| strict(&value).map(Object::VolumeAttachment))
        }
        "Workload" => {
            expect("scheduling.k8s.io/v1beta1").and_then(|_| strict(&value).map(Object::Workload))
        }
        "PodGroup" => {
            expect("scheduling.k8s.io/v1beta1").and_then(|_| strict(&value).map(Object::PodGroup))
        }
        "PodDisruptionBudget" => {
            expect("policy/v1").and_then(|_| strict(&value).map(Object::PodDisruptionBudget))
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
             ReplicaSet, StatefulSet, ReplicationController, Job, Service, PriorityClass, \
             ResourceClaim, ResourceClaimTemplate, DeviceClass, ResourceSlice, DeviceTaintRule, \
             PersistentVolume, PersistentVolumeClaim, StorageClass, CSINode, CSIDriver, \
             VolumeAttachment, Workload, PodGroup, PodDisruptionBudget)"
        ))),
    };
    let object = object.map_err(|mut e| {
        e.location = source.clone();
        e.object = Some(describe(&value));
        e
    })?;
    if let Err(message) = validate::validate(&object) {
        return Err(error(message));
    }
    into.objects.push(Loaded {
        source: source.clone(),
        object,
    });
    Ok(())
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
                "fleet.yaml (document 1): ResourceSlice s: spec.devices[1].name: invalid value \
                 \"gpu-0-mig-1g.5gb\": must be a DNS label"
            ),
            "{err}"
        );
    }

    #[test]
    fn files_stop_being_read_past_the_total() {
        let dir = std::env::temp_dir().join(format!("simulate-total-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("node.yaml");
        std::fs::write(&file, "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n").unwrap();
        let mut total = 60;
        assert!(read(&file, &mut total).is_ok());
        assert_eq!(total, 60 - 47);
        let err = read(&file, &mut total).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}: the manifests add up to more than simulate reads in one run (256 MiB)",
                file.display()
            )
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn services_are_read_for_their_selector_and_config_maps_ignored() {
        let m = parse(
            "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {selector: {app: web}}\n\
             ---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\n",
        )
        .unwrap();
        assert!(matches!(m.objects[0].object, Object::Service(_)));
        assert_eq!(m.ignored[0].object, "ConfigMap settings");
    }

    #[test]
    fn a_volume_attachment_is_read_and_one_without_attacher_is_invalid() {
        let attachment = |attacher: &str| {
            format!(
                "apiVersion: storage.k8s.io/v1\nkind: VolumeAttachment\nmetadata: {{name: va}}\n\
                 spec: {{attacher: '{attacher}', nodeName: n1, source: {{persistentVolumeName: pv}}}}\n"
            )
        };
        let m = parse(&attachment("disk.csi.example.com")).unwrap();
        assert!(matches!(m.objects[0].object, Object::VolumeAttachment(_)));
        let err = parse(&attachment("")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "fleet.yaml (document 1): VolumeAttachment va: spec.attacher: required"
        );
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
