//! The API server's validation rules for the fields the engine reads, one function per
//! kind: what the API server would refuse to store, `simulate` refuses to place workloads
//! on. Each error names the field (`spec.taints[0].effect`) and the rule; the caller adds
//! the file, the document and the object.
//!
//! The rules follow Kubernetes' `pkg/apis/core/validation` and
//! `pkg/apis/resource/validation` as of 1.37, with every DRA feature on. CEL expressions are
//! only checked for length here: compiling them is the engine's job, which reports a
//! broken selector on the pods that use it.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Display;

use dra_engine::resources::ResourceList;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Container, Namespace, Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodSpec, PodTemplateSpec, ReplicationController, ResourceRequirements, Service, Taint,
    Toleration,
};
use k8s_openapi::api::resource::v1::{
    CounterSet, Device, DeviceAttribute, DeviceClaim, DeviceClass, DeviceSelector, DeviceTaint,
    DeviceTaintRule, DeviceToleration, OpaqueDeviceConfiguration, ResourceClaim,
    ResourceClaimStatus, ResourceClaimTemplate, ResourceSlice,
};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::manifests::Object;

/// One rule broken: `field: what is wrong`.
pub type Check = Result<(), String>;

/// Requests in one claim, and results in one allocation.
pub const MAX_REQUESTS: usize = 32;
/// Subrequests of one `firstAvailable` request.
pub const MAX_SUBREQUESTS: usize = 8;
/// Selectors of one request or class, constraints and configs of one claim.
pub const MAX_SELECTORS: usize = 32;
/// Devices in one ResourceSlice; 64 when any device has taints or consumes counters.
pub const MAX_DEVICES: usize = 128;
pub const MAX_DEVICES_ADVANCED: usize = 64;
/// Attributes and capacities of one device together.
pub const MAX_ATTRIBUTES: usize = 32;
/// Taints of one device, tolerations of one request.
pub const MAX_DEVICE_TAINTS: usize = 16;
/// Counter sets in one slice, counters in one set, counter consumptions of one device.
pub const MAX_COUNTER_SETS: usize = 8;
pub const MAX_COUNTERS: usize = 32;
pub const MAX_CONSUMPTIONS: usize = 2;
/// Length of a CEL selector expression.
pub const MAX_CEL_LENGTH: usize = 10 * 1024;
/// Consumers of one claim.
pub const MAX_RESERVED_FOR: usize = 256;
/// The highest priority a PriorityClass not named `system-...` may have.
pub const MAX_USER_PRIORITY: i32 = 1_000_000_000;

const NODE_TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];
const DEVICE_TAINT_EFFECTS: &[&str] = &["NoSchedule", "NoExecute", "None"];

/// Check `object` as the API server would on create.
pub fn validate(object: &Object) -> Check {
    match object {
        Object::Namespace(ns) => namespace(ns),
        Object::Node(node) => self::node(node),
        Object::Pod(pod) => self::pod(pod),
        Object::Deployment(d) => deployment(d),
        Object::ReplicaSet(rs) => replica_set(rs),
        Object::StatefulSet(ss) => stateful_set(ss),
        Object::ReplicationController(rc) => replication_controller(rc),
        Object::Job(job) => self::job(job),
        Object::Service(service) => self::service(service),
        Object::ResourceClaim(claim) => resource_claim(claim),
        Object::ResourceClaimTemplate(t) => resource_claim_template(t),
        Object::DeviceClass(class) => device_class(class),
        Object::ResourceSlice(slice) => resource_slice(slice),
        Object::DeviceTaintRule(rule) => device_taint_rule(rule),
        Object::PriorityClass(pc) => priority_class(pc),
        Object::PersistentVolume(pv) => persistent_volume(pv),
        Object::PersistentVolumeClaim(pvc) => persistent_volume_claim(pvc),
        Object::StorageClass(sc) => storage_class(sc),
        Object::CSINode(n) => metadata(&n.metadata, NameRule::Subdomain, false),
        Object::CSIDriver(d) => metadata(&d.metadata, NameRule::Subdomain, false),
        Object::VolumeAttachment(a) => volume_attachment(a),
        Object::Workload(w) => metadata(&w.metadata, NameRule::Subdomain, true),
        Object::PodGroup(g) => pod_group(g),
        Object::PodDisruptionBudget(b) => metadata(&b.metadata, NameRule::Subdomain, true),
    }
}

// ---- storage -----------------------------------------------------------------------------

const ACCESS_MODES: &[&str] = &[
    "ReadWriteOnce",
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOncePod",
];
const VOLUME_MODES: &[&str] = &["Filesystem", "Block"];
const BINDING_MODES: &[&str] = &["Immediate", "WaitForFirstConsumer"];

fn access_modes(modes: Option<&Vec<String>>) -> Check {
    for (i, mode) in modes.into_iter().flatten().enumerate() {
        if !ACCESS_MODES.contains(&mode.as_str()) {
            return unsupported(format!("spec.accessModes[{i}]"), mode, ACCESS_MODES);
        }
    }
    Ok(())
}

fn volume_mode(mode: Option<&String>) -> Check {
    match mode {
        Some(m) if !VOLUME_MODES.contains(&m.as_str()) => {
            unsupported("spec.volumeMode", m, VOLUME_MODES)
        }
        _ => Ok(()),
    }
}

fn persistent_volume(pv: &k8s_openapi::api::core::v1::PersistentVolume) -> Check {
    metadata(&pv.metadata, NameRule::Subdomain, false)?;
    let Some(spec) = pv.spec.as_ref() else {
        return required("spec");
    };
    match spec.capacity.as_ref().and_then(|c| c.get("storage")) {
        Some(q) => quantity("spec.capacity.storage".into(), q)?,
        None => return required("spec.capacity.storage"),
    }
    access_modes(spec.access_modes.as_ref())?;
    volume_mode(spec.volume_mode.as_ref())?;
    if let Some(required_terms) = spec
        .node_affinity
        .as_ref()
        .and_then(|a| a.required.as_ref())
    {
        node_selector("spec.nodeAffinity.required", required_terms)?;
    }
    Ok(())
}

fn persistent_volume_claim(pvc: &k8s_openapi::api::core::v1::PersistentVolumeClaim) -> Check {
    metadata(&pvc.metadata, NameRule::Subdomain, true)?;
    let Some(spec) = pvc.spec.as_ref() else {
        return required("spec");
    };
    access_modes(spec.access_modes.as_ref())?;
    volume_mode(spec.volume_mode.as_ref())?;
    let requests = spec.resources.as_ref().and_then(|r| r.requests.as_ref());
    if let Some(q) = requests.and_then(|r| r.get("storage")) {
        quantity("spec.resources.requests.storage".into(), q)?;
    }
    Ok(())
}

fn storage_class(sc: &k8s_openapi::api::storage::v1::StorageClass) -> Check {
    metadata(&sc.metadata, NameRule::Subdomain, false)?;
    if sc.provisioner.is_empty() {
        return required("provisioner");
    }
    match sc.volume_binding_mode.as_deref() {
        Some(m) if !BINDING_MODES.contains(&m) => {
            unsupported("volumeBindingMode", m, BINDING_MODES)
        }
        _ => Ok(()),
    }
}

/// What the API server checks of a VolumeAttachment's spec: an attacher, a node, and one
/// source (a PersistentVolume's name, or an inline volume).
fn volume_attachment(a: &k8s_openapi::api::storage::v1::VolumeAttachment) -> Check {
    metadata(&a.metadata, NameRule::Subdomain, false)?;
    if a.spec.attacher.is_empty() {
        return required("spec.attacher");
    }
    dns_subdomain("spec.nodeName", &a.spec.node_name)?;
    let source = &a.spec.source;
    let one = "spec.source: must name exactly one of persistentVolumeName and inlineVolumeSpec";
    match (&source.persistent_volume_name, &source.inline_volume_spec) {
        (Some(pv), None) => dns_subdomain("spec.source.persistentVolumeName", pv),
        (None, Some(_)) => Ok(()),
        _ => Err(one.into()),
    }
}

// ---- messages ----------------------------------------------------------------------------

fn invalid(path: impl Display, value: impl std::fmt::Debug, why: impl Display) -> Check {
    Err(format!("{path}: invalid value {value:?}: {why}"))
}

fn required(path: impl Display) -> Check {
    Err(format!("{path}: required"))
}

fn unsupported(path: impl Display, value: &str, allowed: &[&str]) -> Check {
    Err(format!(
        "{path}: unsupported value {value:?}: must be one of {}",
        allowed.join(", ")
    ))
}

fn too_many(path: impl Display, len: usize, max: usize) -> Check {
    if len > max {
        Err(format!("{path}: {len} entries, at most {max} are allowed"))
    } else {
        Ok(())
    }
}

fn non_negative(path: impl Display, value: i64) -> Check {
    if value < 0 {
        invalid(path, value, "must be greater than or equal to 0")
    } else {
        Ok(())
    }
}

// ---- names -------------------------------------------------------------------------------

fn alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// An RFC 1123 label: at most 63 lower-case letters, digits and '-', alphanumeric at both ends.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| alnum(b) || b == b'-')
        && alnum(s.as_bytes()[0])
        && alnum(s.as_bytes()[s.len() - 1])
}

/// An RFC 1123 subdomain: at most 253 characters, dot-separated labels.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part.bytes().all(|b| alnum(b) || b == b'-')
                && alnum(part.as_bytes()[0])
                && alnum(part.as_bytes()[part.len() - 1])
        })
}

/// The name part of a label key, and a non-empty label value: at most 63 characters,
/// alphanumeric at both ends, '-', '_' and '.' between.
fn is_label_token(s: &str) -> bool {
    let ok = |b: u8| b.is_ascii_alphanumeric();
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| ok(b) || b == b'-' || b == b'_' || b == b'.')
        && ok(s.as_bytes()[0])
        && ok(s.as_bytes()[s.len() - 1])
}

/// A label key (a "qualified name"): `name` or `dns-subdomain/name`.
pub fn is_qualified_name(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => {
            is_dns_subdomain(prefix) && !name.contains('/') && is_label_token(name)
        }
        None => is_label_token(s),
    }
}

fn dns_label(path: impl Display, s: &str) -> Check {
    if is_dns_label(s) {
        Ok(())
    } else {
        invalid(
            path,
            s,
            "must be a DNS label (at most 63 lower-case letters, digits and '-', starting and \
             ending with a letter or digit)",
        )
    }
}

fn dns_subdomain(path: impl Display, s: &str) -> Check {
    if is_dns_subdomain(s) {
        Ok(())
    } else {
        invalid(
            path,
            s,
            "must be a DNS subdomain (at most 253 lower-case letters, digits, '-' and '.', \
             starting and ending with a letter or digit)",
        )
    }
}

fn qualified_name(path: impl Display, s: &str) -> Check {
    if is_qualified_name(s) {
        Ok(())
    } else {
        invalid(
            path,
            s,
            "must be a qualified name (an optional DNS subdomain and '/', then at most 63 \
             letters, digits, '-', '_' and '.', starting and ending with a letter or digit)",
        )
    }
}

fn label_value(path: impl Display, s: &str) -> Check {
    if s.is_empty() || is_label_token(s) {
        Ok(())
    } else {
        invalid(
            path,
            s,
            "must be a label value (empty, or at most 63 letters, digits, '-', '_' and '.', \
             starting and ending with a letter or digit)",
        )
    }
}

/// A DRA driver name (the rules of a CSI driver name): a DNS subdomain of at most 63
/// characters, case aside.
fn driver_name(path: impl Display, s: &str) -> Check {
    if s.is_empty() {
        return required(path);
    }
    if s.len() <= 63 && is_dns_subdomain(&s.to_ascii_lowercase()) {
        Ok(())
    } else {
        invalid(
            path,
            s,
            "must be a DNS subdomain of at most 63 characters (a driver name)",
        )
    }
}

/// A pool name: at most 253 characters, DNS subdomains separated by '/'.
fn pool_name(path: impl Display, s: &str) -> Check {
    if s.is_empty() {
        return required(path);
    }
    if s.len() <= 253 && s.split('/').all(is_dns_subdomain) {
        Ok(())
    } else {
        invalid(
            path,
            s,
            "must be at most 253 characters of DNS subdomains separated by '/'",
        )
    }
}

/// A C identifier of at most 32 characters: the name of an attribute or capacity.
fn is_c_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && (s.as_bytes()[0].is_ascii_alphabetic() || s.as_bytes()[0] == b'_')
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A device attribute or capacity name: `identifier` or `driver.domain/identifier`.
fn attribute_name(path: impl Display, s: &str) -> Check {
    let ok = match s.split_once('/') {
        Some((domain, id)) => {
            domain.len() <= 63
                && is_dns_subdomain(&domain.to_ascii_lowercase())
                && is_c_identifier(id)
        }
        None => is_c_identifier(s),
    };
    if ok {
        Ok(())
    } else {
        invalid(
            path,
            s,
            "must be a C identifier of at most 32 characters, optionally after a driver \
             domain and '/'",
        )
    }
}

/// A name with a domain: `domain/identifier`, as `matchAttribute` needs.
fn fully_qualified_name(path: impl Display + Copy, s: &str) -> Check {
    attribute_name(path, s)?;
    if s.contains('/') {
        Ok(())
    } else {
        invalid(path, s, "must be a domain and a name separated by '/'")
    }
}

// ---- metadata ----------------------------------------------------------------------------

#[derive(Clone, Copy)]
enum NameRule {
    Label,
    Subdomain,
}

fn metadata(meta: &ObjectMeta, rule: NameRule, namespaced: bool) -> Check {
    let name = meta.name.as_deref().unwrap_or_default();
    match rule {
        NameRule::Label => dns_label("metadata.name", name)?,
        NameRule::Subdomain => dns_subdomain("metadata.name", name)?,
    }
    if namespaced
        && let Some(ns) = meta.namespace.as_deref()
        && !ns.is_empty()
    {
        dns_label("metadata.namespace", ns)?;
    }
    labels("metadata.labels", meta.labels.as_ref())
}

fn labels(path: &str, labels: Option<&BTreeMap<String, String>>) -> Check {
    for (key, value) in labels.into_iter().flatten() {
        qualified_name(path, key)?;
        label_value(format!("{path}[{key}]"), value)?;
    }
    Ok(())
}

// ---- core/v1 -----------------------------------------------------------------------------

fn namespace(ns: &Namespace) -> Check {
    metadata(&ns.metadata, NameRule::Label, false)
}

fn node(node: &Node) -> Check {
    metadata(&node.metadata, NameRule::Subdomain, false)?;
    let mut seen = HashSet::new();
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref());
    for (i, taint) in taints.unwrap_or_default().iter().enumerate() {
        node_taint(&format!("spec.taints[{i}]"), taint)?;
        if !seen.insert((taint.key.as_str(), taint.effect.as_str())) {
            return Err(format!(
                "spec.taints[{i}]: duplicate taint {}:{}: taints must be unique by key and effect",
                taint.key, taint.effect
            ));
        }
    }
    if let Some(status) = node.status.as_ref() {
        for (what, list) in [
            ("status.capacity", status.capacity.as_ref()),
            ("status.allocatable", status.allocatable.as_ref()),
        ] {
            resource_list(what, list, qualified_name)?;
        }
    }
    Ok(())
}

fn node_taint(path: &str, taint: &Taint) -> Check {
    taint_fields(
        path,
        (&taint.key, taint.value.as_deref(), &taint.effect),
        NODE_TAINT_EFFECTS,
    )
}

/// A taint's key, value and effect, for node taints and device taints alike (only the
/// allowed effects differ).
fn taint_fields(
    path: &str,
    (key, value, effect): (&str, Option<&str>, &str),
    effects: &[&str],
) -> Check {
    if key.is_empty() {
        return required(format!("{path}.key"));
    }
    qualified_name(format!("{path}.key"), key)?;
    label_value(format!("{path}.value"), value.unwrap_or_default())?;
    match effect {
        "" => required(format!("{path}.effect")),
        e if effects.contains(&e) => Ok(()),
        e => unsupported(format!("{path}.effect"), e, effects),
    }
}

/// Parse a resource map the way the engine does, naming the field of a malformed quantity,
/// and check every name and that no amount is negative.
fn resource_list(
    path: &str,
    list: Option<&BTreeMap<String, Quantity>>,
    name_rule: impl Fn(String, &str) -> Check,
) -> Result<ResourceList, String> {
    for name in list.into_iter().flatten().map(|(name, _)| name) {
        name_rule(format!("{path}[{name}]"), name)?;
    }
    let parsed = ResourceList::parse(list).map_err(|e| format!("{path}: {e}"))?;
    for (name, q) in &parsed.0 {
        if q.sign() < 0 {
            return invalid(
                format!("{path}[{name}]"),
                q.to_string(),
                "must be greater than or equal to 0",
            )
            .map(|_| ResourceList::default());
        }
    }
    Ok(parsed)
}

/// A resource a container may ask for: a standard one (`cpu`, `memory`,
/// `ephemeral-storage`, `hugepages-<size>`) or a name with a domain.
fn container_resource_name(path: String, name: &str) -> Check {
    qualified_name(&path, name)?;
    if !name.contains('/')
        && !matches!(name, "cpu" | "memory" | "ephemeral-storage")
        && !name.starts_with("hugepages-")
    {
        return invalid(
            path,
            name,
            "must be a standard resource for containers or have a domain",
        );
    }
    Ok(())
}

/// Native resources (no domain, or a `kubernetes.io/` one) may be requested below their
/// limit; extended resources and huge pages may not.
fn overcommit_allowed(name: &str) -> bool {
    (!name.contains('/') || name.contains("kubernetes.io/")) && !name.starts_with("hugepages-")
}

fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

fn container_resources(path: &str, resources: Option<&ResourceRequirements>) -> Check {
    let Some(r) = resources else { return Ok(()) };
    let limits = resource_list(
        &format!("{path}.limits"),
        r.limits.as_ref(),
        container_resource_name,
    )?;
    let requests = resource_list(
        &format!("{path}.requests"),
        r.requests.as_ref(),
        container_resource_name,
    )?;
    for (which, list) in [("limits", &limits), ("requests", &requests)] {
        for (name, q) in &list.0 {
            if is_extended_resource(name) && q.nanos() % 1_000_000_000 != 0 {
                return invalid(
                    format!("{path}.{which}[{name}]"),
                    q.to_string(),
                    "must be an integer (an extended resource)",
                );
            }
        }
    }
    for (name, request) in &requests.0 {
        match limits.0.get(name) {
            Some(limit) if !overcommit_allowed(name) && request != limit => {
                return invalid(
                    format!("{path}.requests[{name}]"),
                    request.to_string(),
                    format!("must be equal to the {name} limit of {limit}"),
                );
            }
            Some(limit) if request > limit => {
                return invalid(
                    format!("{path}.requests[{name}]"),
                    request.to_string(),
                    format!("must be less than or equal to the {name} limit of {limit}"),
                );
            }
            None if !overcommit_allowed(name) => {
                return Err(format!(
                    "{path}.limits[{name}]: required: a limit must be set for a resource that \
                     cannot be overcommitted"
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

fn pod_resources(path: &str, resources: Option<&ResourceRequirements>) -> Check {
    let Some(r) = resources else { return Ok(()) };
    let name_rule = |path: String, name: &str| {
        if matches!(name, "cpu" | "memory") || name.starts_with("hugepages-") {
            Ok(())
        } else {
            unsupported(path, name, &["cpu", "memory", "hugepages-<size>"])
        }
    };
    let limits = resource_list(&format!("{path}.limits"), r.limits.as_ref(), name_rule)?;
    let requests = resource_list(&format!("{path}.requests"), r.requests.as_ref(), name_rule)?;
    for (name, request) in &requests.0 {
        if let Some(limit) = limits.0.get(name)
            && request > limit
        {
            return invalid(
                format!("{path}.requests[{name}]"),
                request.to_string(),
                format!("must be less than or equal to the pod {name} limit of {limit}"),
            );
        }
    }
    Ok(())
}

fn container(path: &str, c: &Container, claim_names: &HashSet<&str>) -> Check {
    container_resources(&format!("{path}.resources"), c.resources.as_ref())?;
    let claims = c.resources.as_ref().and_then(|r| r.claims.as_deref());
    for (j, claim) in claims.unwrap_or_default().iter().enumerate() {
        if !claim_names.contains(claim.name.as_str()) {
            return invalid(
                format!("{path}.resources.claims[{j}].name"),
                &claim.name,
                "must be the name of an entry in spec.resourceClaims",
            );
        }
    }
    for (j, port) in c.ports.iter().flatten().enumerate() {
        let at = format!("{path}.ports[{j}]");
        if let Some(host_port) = port.host_port
            && host_port != 0
            && !(1..=65535).contains(&host_port)
        {
            return invalid(
                format!("{at}.hostPort"),
                host_port,
                "must be between 1 and 65535, inclusive",
            );
        }
        if let Some(protocol) = port.protocol.as_deref()
            && !matches!(protocol, "TCP" | "UDP" | "SCTP")
        {
            return unsupported(format!("{at}.protocol"), protocol, &["TCP", "UDP", "SCTP"]);
        }
        if let Some(ip) = port.host_ip.as_deref()
            && !ip.is_empty()
            && ip.parse::<std::net::IpAddr>().is_err()
        {
            return invalid(format!("{at}.hostIP"), ip, "must be a valid IP address");
        }
    }
    Ok(())
}

/// A toleration as core/v1 validates it.
fn toleration(path: &str, t: &Toleration) -> Check {
    let key = t.key.as_deref().unwrap_or_default();
    let operator = t.operator.as_deref().unwrap_or_default();
    let value = t.value.as_deref().unwrap_or_default();
    let effect = t.effect.as_deref().unwrap_or_default();
    if !key.is_empty() {
        qualified_name(format!("{path}.key"), key)?;
    } else if operator != "Exists" {
        return invalid(
            format!("{path}.operator"),
            operator,
            "must be Exists when key is empty (matching every key and value)",
        );
    }
    if t.toleration_seconds.is_some() && effect != "NoExecute" {
        return invalid(
            format!("{path}.effect"),
            effect,
            "must be NoExecute when tolerationSeconds is set",
        );
    }
    match operator {
        "" | "Equal" => label_value(format!("{path}.value"), value)?,
        "Exists" if !value.is_empty() => {
            return invalid(
                format!("{path}.value"),
                value,
                "must be empty when operator is Exists",
            );
        }
        "Exists" => {}
        "Lt" | "Gt" if value.parse::<i64>().is_err() => {
            return invalid(
                format!("{path}.value"),
                value,
                "must be an integer when operator is Lt or Gt",
            );
        }
        "Lt" | "Gt" => {}
        other => {
            return unsupported(
                format!("{path}.operator"),
                other,
                &["Equal", "Exists", "Lt", "Gt"],
            );
        }
    }
    if !effect.is_empty() && !NODE_TAINT_EFFECTS.contains(&effect) {
        return unsupported(format!("{path}.effect"), effect, NODE_TAINT_EFFECTS);
    }
    Ok(())
}

/// A node selector (required node affinity, a slice's node selector).
fn node_selector(path: &str, selector: &NodeSelector) -> Check {
    if selector.node_selector_terms.is_empty() {
        return Err(format!(
            "{path}.nodeSelectorTerms: must have at least one node selector term"
        ));
    }
    for (i, term) in selector.node_selector_terms.iter().enumerate() {
        node_selector_term(&format!("{path}.nodeSelectorTerms[{i}]"), term)?;
    }
    Ok(())
}

fn node_selector_term(path: &str, term: &NodeSelectorTerm) -> Check {
    for (j, r) in term.match_expressions.iter().flatten().enumerate() {
        node_selector_requirement(&format!("{path}.matchExpressions[{j}]"), r)?;
    }
    for (j, r) in term.match_fields.iter().flatten().enumerate() {
        let at = format!("{path}.matchFields[{j}]");
        if r.key != "metadata.name" {
            return unsupported(format!("{at}.key"), &r.key, &["metadata.name"]);
        }
        if !matches!(r.operator.as_str(), "In" | "NotIn") {
            return unsupported(format!("{at}.operator"), &r.operator, &["In", "NotIn"]);
        }
        if r.values.as_ref().map_or(0, Vec::len) != 1 {
            return Err(format!(
                "{at}.values: must have exactly one value for a node field selector"
            ));
        }
    }
    Ok(())
}

fn node_selector_requirement(path: &str, r: &NodeSelectorRequirement) -> Check {
    qualified_name(format!("{path}.key"), &r.key)?;
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => Err(format!(
            "{path}.values: must be set when operator is In or NotIn"
        )),
        "Exists" | "DoesNotExist" if !values.is_empty() => Err(format!(
            "{path}.values: must be empty when operator is Exists or DoesNotExist"
        )),
        "Gt" | "Lt" if values.len() != 1 || values[0].parse::<i64>().is_err() => Err(format!(
            "{path}.values: must be a single integer when operator is Gt or Lt"
        )),
        "In" | "NotIn" | "Exists" | "DoesNotExist" | "Gt" | "Lt" => Ok(()),
        other => unsupported(
            format!("{path}.operator"),
            other,
            &["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"],
        ),
    }
}

/// The parts of a pod spec the engine reads.
fn pod_spec(path: &str, spec: &PodSpec) -> Check {
    let mut claim_names = HashSet::new();
    for (i, claim) in spec.resource_claims.iter().flatten().enumerate() {
        let at = format!("{path}.resourceClaims[{i}]");
        dns_label(format!("{at}.name"), &claim.name)?;
        if !claim_names.insert(claim.name.as_str()) {
            return Err(format!("{at}.name: duplicate value {:?}", claim.name));
        }
        let by_name = claim
            .resource_claim_name
            .as_deref()
            .filter(|n| !n.is_empty());
        let by_template = claim
            .resource_claim_template_name
            .as_deref()
            .filter(|n| !n.is_empty());
        match (by_name, by_template) {
            (Some(n), None) => dns_subdomain(format!("{at}.resourceClaimName"), n)?,
            (None, Some(t)) => dns_subdomain(format!("{at}.resourceClaimTemplateName"), t)?,
            _ => {
                return Err(format!(
                    "{at}: exactly one of resourceClaimName and resourceClaimTemplateName is \
                     required"
                ));
            }
        }
    }
    for (i, c) in spec.containers.iter().enumerate() {
        container(&format!("{path}.containers[{i}]"), c, &claim_names)?;
    }
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        container(&format!("{path}.initContainers[{i}]"), c, &claim_names)?;
    }
    resource_list(
        &format!("{path}.overhead"),
        spec.overhead.as_ref(),
        qualified_name,
    )?;
    pod_resources(&format!("{path}.resources"), spec.resources.as_ref())?;
    for (i, t) in spec.tolerations.iter().flatten().enumerate() {
        toleration(&format!("{path}.tolerations[{i}]"), t)?;
    }
    labels(&format!("{path}.nodeSelector"), spec.node_selector.as_ref())?;
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    if let Some(required) = required {
        node_selector(
            &format!("{path}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"),
            required,
        )?;
    }
    if let Some(node) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        dns_subdomain(format!("{path}.nodeName"), node)?;
    }
    if let Some(name) = spec.scheduler_name.as_deref().filter(|n| !n.is_empty()) {
        dns_subdomain(format!("{path}.schedulerName"), name)?;
    }
    if let Some(name) = spec
        .priority_class_name
        .as_deref()
        .filter(|n| !n.is_empty())
    {
        dns_subdomain(format!("{path}.priorityClassName"), name)?;
    }
    Ok(())
}

/// What the API server checks of a PodGroup that scheduling reads: one policy, a
/// positive `minCount`, label keys for topology.
fn pod_group(group: &k8s_openapi::api::scheduling::v1beta1::PodGroup) -> Check {
    metadata(&group.metadata, NameRule::Subdomain, true)?;
    let policy = &group.spec.scheduling_policy;
    match (&policy.basic, &policy.gang) {
        (Some(_), None) => {}
        (None, Some(gang)) if gang.min_count >= 1 => {}
        (None, Some(gang)) => {
            return Err(format!(
                "spec.schedulingPolicy.gang.minCount: must be at least 1, not {}",
                gang.min_count
            ));
        }
        _ => return Err("spec.schedulingPolicy: exactly one of basic and gang is required".into()),
    }
    let topology = group
        .spec
        .scheduling_constraints
        .as_ref()
        .and_then(|c| c.topology.as_ref());
    for (i, t) in topology.into_iter().flatten().enumerate() {
        qualified_name(
            format!("spec.schedulingConstraints.topology[{i}].key"),
            &t.key,
        )?;
    }
    Ok(())
}

fn pod(pod: &Pod) -> Check {
    metadata(&pod.metadata, NameRule::Subdomain, true)?;
    match pod.spec.as_ref() {
        Some(spec) => pod_spec("spec", spec),
        None => Ok(()),
    }
}

fn template(path: &str, template: &PodTemplateSpec) -> Check {
    if let Some(meta) = template.metadata.as_ref() {
        labels(&format!("{path}.metadata.labels"), meta.labels.as_ref())?;
    }
    match template.spec.as_ref() {
        Some(spec) => pod_spec(&format!("{path}.spec"), spec),
        None => Ok(()),
    }
}

// ---- apps/v1, batch/v1 -------------------------------------------------------------------

fn deployment(d: &Deployment) -> Check {
    metadata(&d.metadata, NameRule::Subdomain, true)?;
    let spec = &d.spec;
    non_negative("spec.replicas", spec.replicas.unwrap_or(1).into())?;
    template("spec.template", &spec.template)
}

fn replica_set(rs: &ReplicaSet) -> Check {
    metadata(&rs.metadata, NameRule::Subdomain, true)?;
    let spec = &rs.spec;
    non_negative("spec.replicas", spec.replicas.unwrap_or(1).into())?;
    match spec.template.as_ref() {
        Some(t) => template("spec.template", t),
        None => required("spec.template"),
    }
}

fn stateful_set(ss: &StatefulSet) -> Check {
    metadata(&ss.metadata, NameRule::Subdomain, true)?;
    let spec = &ss.spec;
    non_negative("spec.replicas", spec.replicas.unwrap_or(1).into())?;
    template("spec.template", &spec.template)
}

fn replication_controller(rc: &ReplicationController) -> Check {
    metadata(&rc.metadata, NameRule::Subdomain, true)?;
    let Some(spec) = rc.spec.as_ref() else {
        return Ok(());
    };
    non_negative("spec.replicas", spec.replicas.unwrap_or(1).into())?;
    labels("spec.selector", spec.selector.as_ref())?;
    match spec.template.as_ref() {
        Some(t) => template("spec.template", t),
        None => Ok(()),
    }
}

/// Only what the scheduler reads: the name and the selector.
fn service(service: &Service) -> Check {
    metadata(&service.metadata, NameRule::Label, true)?;
    let selector = service.spec.as_ref().and_then(|s| s.selector.as_ref());
    labels("spec.selector", selector)
}

fn job(job: &Job) -> Check {
    metadata(&job.metadata, NameRule::Subdomain, true)?;
    let Some(spec) = job.spec.as_ref() else {
        return Ok(());
    };
    non_negative("spec.parallelism", spec.parallelism.unwrap_or(1).into())?;
    if let Some(completions) = spec.completions {
        non_negative("spec.completions", completions.into())?;
    }
    template("spec.template", &spec.template)
}

fn priority_class(pc: &PriorityClass) -> Check {
    metadata(&pc.metadata, NameRule::Subdomain, false)?;
    let name = pc.metadata.name.as_deref().unwrap_or_default();
    if !name.starts_with("system-") && pc.value.unwrap_or(0) > MAX_USER_PRIORITY {
        return invalid(
            "value",
            pc.value.unwrap_or(0),
            format!("a PriorityClass not named system-... may be at most {MAX_USER_PRIORITY}"),
        );
    }
    Ok(())
}

// ---- resource.k8s.io/v1 ------------------------------------------------------------------

fn selectors(path: &str, selectors: Option<&Vec<DeviceSelector>>) -> Check {
    let selectors = selectors.map(Vec::as_slice).unwrap_or_default();
    too_many(path, selectors.len(), MAX_SELECTORS)?;
    for (i, s) in selectors.iter().enumerate() {
        let Some(cel) = s.cel.as_ref() else {
            return required(format!("{path}[{i}].cel"));
        };
        if cel.expression.len() > MAX_CEL_LENGTH {
            return Err(format!(
                "{path}[{i}].cel.expression: {} bytes, at most {MAX_CEL_LENGTH} are allowed",
                cel.expression.len()
            ));
        }
    }
    Ok(())
}

fn device_toleration(path: &str, t: &DeviceToleration) -> Check {
    let key = t.key.as_deref().unwrap_or_default();
    let value = t.value.as_deref().unwrap_or_default();
    if !key.is_empty() {
        qualified_name(format!("{path}.key"), key)?;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" if !value.is_empty() => {
            return invalid(
                format!("{path}.value"),
                value,
                "must be empty when operator is Exists",
            );
        }
        "Exists" => {}
        "Equal" => label_value(format!("{path}.value"), value)?,
        other => return unsupported(format!("{path}.operator"), other, &["Equal", "Exists"]),
    }
    match t.effect.as_deref().unwrap_or_default() {
        "" => Ok(()),
        e if DEVICE_TAINT_EFFECTS.contains(&e) => Ok(()),
        e => unsupported(format!("{path}.effect"), e, DEVICE_TAINT_EFFECTS),
    }
}

fn device_tolerations(path: &str, tolerations: Option<&Vec<DeviceToleration>>) -> Check {
    let tolerations = tolerations.map(Vec::as_slice).unwrap_or_default();
    too_many(path, tolerations.len(), MAX_DEVICE_TAINTS)?;
    for (i, t) in tolerations.iter().enumerate() {
        device_toleration(&format!("{path}[{i}]"), t)?;
    }
    Ok(())
}

/// `allocationMode` and `count` of a request or subrequest (after API defaulting: no mode
/// means ExactCount, no count means one).
fn allocation_mode(path: &str, mode: Option<&str>, count: Option<i64>) -> Check {
    match mode.unwrap_or("ExactCount") {
        "ExactCount" => match count {
            Some(c) if c <= 0 => invalid(format!("{path}.count"), c, "must be greater than zero"),
            _ => Ok(()),
        },
        "All" => match count {
            Some(c) if c != 0 => invalid(
                format!("{path}.count"),
                c,
                "must not be set when allocationMode is All",
            ),
            _ => Ok(()),
        },
        other => unsupported(
            format!("{path}.allocationMode"),
            other,
            &["ExactCount", "All"],
        ),
    }
}

fn device_class_name(path: String, name: &str) -> Check {
    if name.is_empty() {
        required(path)
    } else {
        dns_subdomain(path, name)
    }
}

fn opaque(path: &str, opaque: Option<&OpaqueDeviceConfiguration>) -> Check {
    let Some(o) = opaque else {
        return required(format!("{path}.opaque"));
    };
    driver_name(format!("{path}.opaque.driver"), &o.driver)?;
    if !o.parameters.0.is_object() {
        return invalid(
            format!("{path}.opaque.parameters"),
            "<value omitted>",
            "must be a JSON object",
        );
    }
    Ok(())
}

/// The capacity a request consumes from a shareable device: named like capacities, in
/// amounts that parse.
fn capacity_requests(
    path: &str,
    capacity: Option<&k8s_openapi::api::resource::v1::CapacityRequirements>,
) -> Check {
    let requests = capacity.and_then(|c| c.requests.as_ref());
    for (name, q) in requests.into_iter().flatten() {
        attribute_name(format!("{path}[{name}]"), name)?;
        quantity(format!("{path}[{name}]"), q)?;
    }
    Ok(())
}

/// A reference to a request (`name`) or a subrequest (`name/sub`) of the claim.
fn request_ref(path: String, name: &str, requests: &BTreeMap<&str, HashSet<&str>>) -> Check {
    let found = match name.split_once('/') {
        None => requests.contains_key(name),
        Some((request, sub)) => requests.get(request).is_some_and(|subs| subs.contains(sub)),
    };
    if found {
        Ok(())
    } else {
        invalid(
            path,
            name,
            "must name a request of the claim, or a request and a subrequest separated by '/'",
        )
    }
}

fn device_claim(path: &str, claim: &DeviceClaim) -> Check {
    let requests = claim.requests.as_deref().unwrap_or_default();
    too_many(format!("{path}.requests"), requests.len(), MAX_REQUESTS)?;
    let mut names: BTreeMap<&str, HashSet<&str>> = BTreeMap::new();
    for (i, r) in requests.iter().enumerate() {
        let at = format!("{path}.requests[{i}]");
        dns_label(format!("{at}.name"), &r.name)?;
        if names.contains_key(r.name.as_str()) {
            return Err(format!("{at}.name: duplicate value {:?}", r.name));
        }
        let subs = r.first_available.as_deref().unwrap_or_default();
        match (&r.exactly, subs.is_empty()) {
            (Some(_), false) => {
                return Err(format!(
                    "{at}: exactly one of exactly and firstAvailable is required, but both are set"
                ));
            }
            (None, true) => {
                return Err(format!(
                    "{at}: exactly one of exactly and firstAvailable is required"
                ));
            }
            (Some(e), true) => {
                let at = format!("{at}.exactly");
                device_class_name(format!("{at}.deviceClassName"), &e.device_class_name)?;
                selectors(&format!("{at}.selectors"), e.selectors.as_ref())?;
                allocation_mode(&at, e.allocation_mode.as_deref(), e.count)?;
                device_tolerations(&format!("{at}.tolerations"), e.tolerations.as_ref())?;
                capacity_requests(&format!("{at}.capacity.requests"), e.capacity.as_ref())?;
            }
            (None, false) => {
                too_many(format!("{at}.firstAvailable"), subs.len(), MAX_SUBREQUESTS)?;
                let mut sub_names = HashSet::new();
                for (j, s) in subs.iter().enumerate() {
                    let at = format!("{at}.firstAvailable[{j}]");
                    dns_label(format!("{at}.name"), &s.name)?;
                    if !sub_names.insert(s.name.as_str()) {
                        return Err(format!("{at}.name: duplicate value {:?}", s.name));
                    }
                    device_class_name(format!("{at}.deviceClassName"), &s.device_class_name)?;
                    selectors(&format!("{at}.selectors"), s.selectors.as_ref())?;
                    allocation_mode(&at, s.allocation_mode.as_deref(), s.count)?;
                    device_tolerations(&format!("{at}.tolerations"), s.tolerations.as_ref())?;
                    capacity_requests(&format!("{at}.capacity.requests"), s.capacity.as_ref())?;
                }
            }
        }
        let subs = subs.iter().map(|s| s.name.as_str()).collect();
        names.insert(r.name.as_str(), subs);
    }
    let constraints = claim.constraints.as_deref().unwrap_or_default();
    too_many(
        format!("{path}.constraints"),
        constraints.len(),
        MAX_SELECTORS,
    )?;
    for (i, c) in constraints.iter().enumerate() {
        let at = format!("{path}.constraints[{i}]");
        for (j, name) in c.requests.iter().flatten().enumerate() {
            request_ref(format!("{at}.requests[{j}]"), name, &names)?;
        }
        match (
            c.match_attribute.as_deref(),
            c.distinct_attribute.as_deref(),
        ) {
            (Some(a), None) => fully_qualified_name(&format!("{at}.matchAttribute"), a)?,
            (None, Some(a)) => fully_qualified_name(&format!("{at}.distinctAttribute"), a)?,
            _ => {
                return Err(format!(
                    "{at}: exactly one of matchAttribute and distinctAttribute is required"
                ));
            }
        }
    }
    let config = claim.config.as_deref().unwrap_or_default();
    too_many(format!("{path}.config"), config.len(), MAX_SELECTORS)?;
    for (i, c) in config.iter().enumerate() {
        let at = format!("{path}.config[{i}]");
        for (j, name) in c.requests.iter().flatten().enumerate() {
            request_ref(format!("{at}.requests[{j}]"), name, &names)?;
        }
        opaque(&at, c.opaque.as_ref())?;
    }
    Ok(())
}

/// What an existing allocation says (the engine takes these devices as in use).
fn claim_status(claim: &DeviceClaim, status: &ResourceClaimStatus) -> Check {
    let mut names: BTreeMap<&str, HashSet<&str>> = BTreeMap::new();
    for r in claim.requests.iter().flatten() {
        let subs = r.first_available.iter().flatten().map(|s| s.name.as_str());
        names.insert(r.name.as_str(), subs.collect());
    }
    if let Some(allocation) = status.allocation.as_ref() {
        let results = allocation
            .devices
            .as_ref()
            .and_then(|d| d.results.as_deref())
            .unwrap_or_default();
        too_many(
            "status.allocation.devices.results",
            results.len(),
            MAX_REQUESTS,
        )?;
        for (i, r) in results.iter().enumerate() {
            let at = format!("status.allocation.devices.results[{i}]");
            request_ref(format!("{at}.request"), &r.request, &names)?;
            driver_name(format!("{at}.driver"), &r.driver)?;
            pool_name(format!("{at}.pool"), &r.pool)?;
            dns_label(format!("{at}.device"), &r.device)?;
        }
        if let Some(selector) = allocation.node_selector.as_ref() {
            node_selector("status.allocation.nodeSelector", selector)?;
        }
    }
    let reserved = status.reserved_for.as_deref().unwrap_or_default();
    too_many("status.reservedFor", reserved.len(), MAX_RESERVED_FOR)?;
    if !reserved.is_empty() && status.allocation.is_none() {
        return Err("status.reservedFor: may not be set when status.allocation is not".into());
    }
    let mut uids = HashSet::new();
    for (i, r) in reserved.iter().enumerate() {
        let at = format!("status.reservedFor[{i}]");
        for (field, value) in [
            ("resource", &r.resource),
            ("name", &r.name),
            ("uid", &r.uid),
        ] {
            if value.is_empty() {
                return required(format!("{at}.{field}"));
            }
        }
        if !uids.insert(r.uid.as_str()) {
            return Err(format!("{at}.uid: duplicate value {:?}", r.uid));
        }
    }
    Ok(())
}

fn resource_claim(claim: &ResourceClaim) -> Check {
    metadata(&claim.metadata, NameRule::Subdomain, true)?;
    let devices = claim.spec.as_ref().and_then(|s| s.devices.as_ref());
    let empty = DeviceClaim::default();
    let devices = devices.unwrap_or(&empty);
    device_claim("spec.devices", devices)?;
    match claim.status.as_ref() {
        Some(status) => claim_status(devices, status),
        None => Ok(()),
    }
}

fn resource_claim_template(t: &ResourceClaimTemplate) -> Check {
    metadata(&t.metadata, NameRule::Subdomain, true)?;
    let spec = t.spec.as_ref();
    if let Some(meta) = spec.and_then(|s| s.metadata.as_ref()) {
        labels("spec.metadata.labels", meta.labels.as_ref())?;
    }
    match spec
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.devices.as_ref())
    {
        Some(devices) => device_claim("spec.spec.devices", devices),
        None => Ok(()),
    }
}

fn device_class(class: &DeviceClass) -> Check {
    metadata(&class.metadata, NameRule::Subdomain, false)?;
    let Some(spec) = class.spec.as_ref() else {
        return Ok(());
    };
    selectors("spec.selectors", spec.selectors.as_ref())?;
    let config = spec.config.as_deref().unwrap_or_default();
    too_many("spec.config", config.len(), MAX_SELECTORS)?;
    for (i, c) in config.iter().enumerate() {
        opaque(&format!("spec.config[{i}]"), c.opaque.as_ref())?;
    }
    if let Some(name) = spec.extended_resource_name.as_deref()
        && !(is_extended_resource(name) && is_qualified_name(name))
    {
        return invalid(
            "spec.extendedResourceName",
            name,
            "must be an extended resource name (a domain other than kubernetes.io, '/', and \
             a name)",
        );
    }
    Ok(())
}

fn device_taint(path: &str, taint: &DeviceTaint) -> Check {
    taint_fields(
        path,
        (&taint.key, taint.value.as_deref(), &taint.effect),
        DEVICE_TAINT_EFFECTS,
    )
}

fn quantity(path: String, q: &Quantity) -> Check {
    ResourceList::parse(Some(&BTreeMap::from([(String::new(), q.clone())])))
        .map(|_| ())
        .map_err(|e| {
            // The engine's message starts with the (here empty) resource name.
            let e = e.trim_start_matches("resource : ");
            format!("{path}: {e}")
        })
}

fn counters(
    path: &str,
    counters: &BTreeMap<String, k8s_openapi::api::resource::v1::Counter>,
) -> Check {
    if counters.is_empty() {
        return required(path);
    }
    too_many(path, counters.len(), MAX_COUNTERS)?;
    for (name, c) in counters {
        dns_label(format!("{path}[{name}]"), name)?;
        quantity(format!("{path}[{name}].value"), &c.value)?;
    }
    Ok(())
}

fn counter_set(path: &str, set: &CounterSet) -> Check {
    dns_label(format!("{path}.name"), &set.name)?;
    counters(&format!("{path}.counters"), &set.counters)
}

fn device_attribute(path: &str, a: &DeviceAttribute) -> Check {
    let set = [
        a.bool.is_some(),
        a.int.is_some(),
        a.string.is_some(),
        a.version.is_some(),
        a.bools.is_some(),
        a.ints.is_some(),
        a.strings.is_some(),
        a.versions.is_some(),
    ]
    .iter()
    .filter(|s| **s)
    .count();
    if set != 1 {
        return Err(format!("{path}: exactly one value must be set"));
    }
    let short = |at: String, s: &str| {
        if s.len() > 64 {
            Err(format!(
                "{at}: {} characters, at most 64 are allowed",
                s.len()
            ))
        } else {
            Ok(())
        }
    };
    let version = |at: String, s: &str| {
        short(at.clone(), s)?;
        if is_semver(s) {
            Ok(())
        } else {
            invalid(at, s, "must be a semantic version (semver.org 2.0.0)")
        }
    };
    if let Some(s) = a.string.as_deref() {
        short(format!("{path}.string"), s)?;
    }
    if let Some(v) = a.version.as_deref() {
        version(format!("{path}.version"), v)?;
    }
    for (field, len) in [
        ("bools", a.bools.as_ref().map(Vec::len)),
        ("ints", a.ints.as_ref().map(Vec::len)),
        ("strings", a.strings.as_ref().map(Vec::len)),
        ("versions", a.versions.as_ref().map(Vec::len)),
    ] {
        if len == Some(0) {
            return Err(format!("{path}.{field}: must not be empty if set"));
        }
    }
    for (i, s) in a.strings.iter().flatten().enumerate() {
        short(format!("{path}.strings[{i}]"), s)?;
    }
    for (i, v) in a.versions.iter().flatten().enumerate() {
        version(format!("{path}.versions[{i}]"), v)?;
    }
    Ok(())
}

/// `MAJOR.MINOR.PATCH[-pre][+build]` with semver.org 2.0.0's rules.
fn is_semver(s: &str) -> bool {
    let numeric = |p: &str| {
        !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && (p == "0" || !p.starts_with('0'))
    };
    let ident =
        |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    let (rest, build) = match s.split_once('+') {
        Some((r, b)) => (r, Some(b)),
        None => (s, None),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (rest, None),
    };
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| numeric(p))
        && pre.is_none_or(|p| {
            p.split('.')
                .all(|id| ident(id) && (id.bytes().any(|b| !b.is_ascii_digit()) || numeric(id)))
        })
        && build.is_none_or(|b| b.split('.').all(ident))
}

fn device(path: &str, d: &Device, per_device_nodes: bool) -> Check {
    dns_label(format!("{path}.name"), &d.name)?;
    let attributes = d.attributes.as_ref();
    let capacity = d.capacity.as_ref();
    let entries = attributes.map_or(0, BTreeMap::len) + capacity.map_or(0, BTreeMap::len);
    if entries > MAX_ATTRIBUTES {
        return Err(format!(
            "{path}: {entries} attributes and capacities, at most {MAX_ATTRIBUTES} are allowed"
        ));
    }
    for (name, a) in attributes.into_iter().flatten() {
        attribute_name(format!("{path}.attributes[{name}]"), name)?;
        device_attribute(&format!("{path}.attributes[{name}]"), a)?;
    }
    for (name, c) in capacity.into_iter().flatten() {
        let at = format!("{path}.capacity[{name}]");
        attribute_name(&at, name)?;
        quantity(format!("{at}.value"), &c.value)?;
        if c.request_policy.is_some() && d.allow_multiple_allocations != Some(true) {
            return Err(format!(
                "{at}.requestPolicy: may only be set when allowMultipleAllocations is true"
            ));
        }
    }
    let taints = d.taints.as_deref().unwrap_or_default();
    too_many(format!("{path}.taints"), taints.len(), MAX_DEVICE_TAINTS)?;
    for (i, t) in taints.iter().enumerate() {
        device_taint(&format!("{path}.taints[{i}]"), t)?;
    }
    let consumes = d.consumes_counters.as_deref().unwrap_or_default();
    too_many(
        format!("{path}.consumesCounters"),
        consumes.len(),
        MAX_CONSUMPTIONS,
    )?;
    let mut sets = HashSet::new();
    for (i, c) in consumes.iter().enumerate() {
        let at = format!("{path}.consumesCounters[{i}]");
        dns_label(format!("{at}.counterSet"), &c.counter_set)?;
        if !sets.insert(c.counter_set.as_str()) {
            return Err(format!(
                "{at}.counterSet: duplicate value {:?}",
                c.counter_set
            ));
        }
        counters(&format!("{at}.counters"), &c.counters)?;
    }
    let mut placement = Vec::new();
    if let Some(node) = d.node_name.as_deref() {
        if node.is_empty() {
            return invalid(format!("{path}.nodeName"), node, "must not be empty");
        }
        dns_subdomain(format!("{path}.nodeName"), node)?;
        placement.push("nodeName");
    }
    if let Some(selector) = d.node_selector.as_ref() {
        node_selector(&format!("{path}.nodeSelector"), selector)?;
        placement.push("nodeSelector");
    }
    match d.all_nodes {
        Some(true) => placement.push("allNodes"),
        Some(false) => {
            return invalid(format!("{path}.allNodes"), false, "must be unset or true");
        }
        None => {}
    }
    match (per_device_nodes, placement.len()) {
        (true, 1) | (false, 0) => Ok(()),
        (true, _) => Err(format!(
            "{path}: exactly one of nodeName, nodeSelector and allNodes is required when the \
             slice sets perDeviceNodeSelection{}",
            set_fields(&placement)
        )),
        (false, _) => Err(format!(
            "{path}: nodeName, nodeSelector and allNodes may only be set when the slice sets \
             perDeviceNodeSelection{}",
            set_fields(&placement)
        )),
    }
}

fn set_fields(fields: &[&str]) -> String {
    if fields.is_empty() {
        String::new()
    } else {
        format!(" (set: {})", fields.join(", "))
    }
}

fn resource_slice(slice: &ResourceSlice) -> Check {
    metadata(&slice.metadata, NameRule::Subdomain, false)?;
    let spec = &slice.spec;
    driver_name("spec.driver", &spec.driver)?;
    pool_name("spec.pool.name", &spec.pool.name)?;
    non_negative("spec.pool.generation", spec.pool.generation)?;
    if spec.pool.resource_slice_count <= 0 {
        return invalid(
            "spec.pool.resourceSliceCount",
            spec.pool.resource_slice_count,
            "must be greater than zero",
        );
    }
    let mut placement = Vec::new();
    if let Some(node) = spec.node_name.as_deref() {
        if node.is_empty() {
            return invalid("spec.nodeName", node, "must be unset or a node name");
        }
        dns_subdomain("spec.nodeName", node)?;
        placement.push("nodeName");
    }
    if let Some(selector) = spec.node_selector.as_ref() {
        node_selector("spec.nodeSelector", selector)?;
        if selector.node_selector_terms.len() != 1 {
            return Err(
                "spec.nodeSelector.nodeSelectorTerms: must have exactly one node selector term"
                    .into(),
            );
        }
        placement.push("nodeSelector");
    }
    for (field, value) in [
        ("allNodes", spec.all_nodes),
        ("perDeviceNodeSelection", spec.per_device_node_selection),
    ] {
        match value {
            Some(true) => placement.push(field),
            Some(false) => return invalid(format!("spec.{field}"), false, "must be unset or true"),
            None => {}
        }
    }
    if placement.len() != 1 {
        return Err(format!(
            "spec: exactly one of nodeName, nodeSelector, allNodes and perDeviceNodeSelection \
             is required{}",
            set_fields(&placement)
        ));
    }
    if spec.shared_counters.is_some() && spec.devices.is_some() {
        return Err("spec: only one of sharedCounters and devices may be set".into());
    }
    let devices = spec.devices.as_deref().unwrap_or_default();
    let advanced = devices.iter().any(|d| {
        d.taints.as_ref().is_some_and(|t| !t.is_empty())
            || d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
    });
    let max = if advanced {
        MAX_DEVICES_ADVANCED
    } else {
        MAX_DEVICES
    };
    too_many("spec.devices", devices.len(), max)?;
    let per_device = spec.per_device_node_selection == Some(true);
    let mut names = HashSet::new();
    for (i, d) in devices.iter().enumerate() {
        let at = format!("spec.devices[{i}]");
        device(&at, d, per_device)?;
        if !names.insert(d.name.as_str()) {
            return Err(format!("{at}.name: duplicate value {:?}", d.name));
        }
    }
    let sets = spec.shared_counters.as_deref().unwrap_or_default();
    too_many("spec.sharedCounters", sets.len(), MAX_COUNTER_SETS)?;
    let mut set_names = HashSet::new();
    for (i, set) in sets.iter().enumerate() {
        let at = format!("spec.sharedCounters[{i}]");
        counter_set(&at, set)?;
        if !set_names.insert(set.name.as_str()) {
            return Err(format!("{at}.name: duplicate value {:?}", set.name));
        }
    }
    Ok(())
}

fn device_taint_rule(rule: &DeviceTaintRule) -> Check {
    metadata(&rule.metadata, NameRule::Subdomain, false)?;
    if let Some(selector) = rule.spec.device_selector.as_ref() {
        if let Some(driver) = selector.driver.as_deref() {
            driver_name("spec.deviceSelector.driver", driver)?;
        }
        if let Some(pool) = selector.pool.as_deref() {
            pool_name("spec.deviceSelector.pool", pool)?;
        }
        if let Some(device) = selector.device.as_deref() {
            dns_label("spec.deviceSelector.device", device)?;
        }
    }
    device_taint("spec.taint", &rule.spec.taint)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(kind: &str, value: serde_json::Value) -> Check {
        let object = match kind {
            "Node" => Object::Node(serde_json::from_value(value).unwrap()),
            "Pod" => Object::Pod(serde_json::from_value(value).unwrap()),
            "Deployment" => Object::Deployment(serde_json::from_value(value).unwrap()),
            "ResourceSlice" => Object::ResourceSlice(serde_json::from_value(value).unwrap()),
            "ResourceClaim" => Object::ResourceClaim(serde_json::from_value(value).unwrap()),
            "DeviceClass" => Object::DeviceClass(serde_json::from_value(value).unwrap()),
            "DeviceTaintRule" => Object::DeviceTaintRule(serde_json::from_value(value).unwrap()),
            "PriorityClass" => Object::PriorityClass(serde_json::from_value(value).unwrap()),
            other => panic!("{other}"),
        };
        validate(&object)
    }

    fn pod(spec: serde_json::Value) -> Check {
        check("Pod", json!({"metadata": {"name": "p"}, "spec": spec}))
    }

    fn container(resources: serde_json::Value) -> Check {
        pod(json!({"containers": [{"name": "c", "resources": resources}]}))
    }

    fn slice(spec: serde_json::Value) -> Check {
        let mut full = json!({"driver": "gpu.example.com",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1}});
        full.as_object_mut()
            .unwrap()
            .extend(spec.as_object().unwrap().clone());
        check(
            "ResourceSlice",
            json!({"metadata": {"name": "s"}, "spec": full}),
        )
    }

    fn claim(requests: serde_json::Value) -> Check {
        check(
            "ResourceClaim",
            json!({"metadata": {"name": "c"}, "spec": {"devices": {"requests": requests}}}),
        )
    }

    #[test]
    fn negative_quantities_and_requests_above_limits() {
        assert_eq!(
            container(json!({"requests": {"cpu": "-1"}})).unwrap_err(),
            "spec.containers[0].resources.requests[cpu]: invalid value \"-1\": must be greater \
             than or equal to 0"
        );
        assert!(
            container(json!({"limits": {"memory": "-1Gi"}}))
                .unwrap_err()
                .starts_with("spec.containers[0].resources.limits[memory]: invalid value")
        );
        assert_eq!(
            container(json!({"requests": {"cpu": "2"}, "limits": {"cpu": "1"}})).unwrap_err(),
            "spec.containers[0].resources.requests[cpu]: invalid value \"2\": must be less than \
             or equal to the cpu limit of 1"
        );
        let err = container(json!({"requests": {"nvidia.com/gpu": "1"}})).unwrap_err();
        assert!(err.starts_with("spec.containers[0].resources.limits[nvidia.com/gpu]: required"));
        let err = container(json!({"limits": {"nvidia.com/gpu": "500m"}})).unwrap_err();
        assert!(err.contains("must be an integer"), "{err}");
        let err = container(json!({"requests": {"memory": "12 GB"}})).unwrap_err();
        assert!(
            err.starts_with("spec.containers[0].resources.requests: resource memory"),
            "{err}"
        );
        let err = container(json!({"requests": {"gpus": "1"}})).unwrap_err();
        assert!(err.contains("must be a standard resource"), "{err}");
        assert!(
            container(json!({"requests": {"cpu": "1"}, "limits": {"cpu": "2",
            "nvidia.com/gpu": 1}}))
            .is_ok()
        );
        let err = pod(json!({"containers": [], "overhead": {"cpu": "-100m"}})).unwrap_err();
        assert!(
            err.starts_with("spec.overhead[cpu]: invalid value"),
            "{err}"
        );
        let err = check(
            "Node",
            json!({"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "-4"}}}),
        )
        .unwrap_err();
        assert!(
            err.starts_with("status.allocatable[cpu]: invalid value"),
            "{err}"
        );
    }

    #[test]
    fn taint_effects_and_tolerations() {
        let node = |taints| {
            check(
                "Node",
                json!({"metadata": {"name": "n"}, "spec": {"taints": taints}}),
            )
        };
        assert_eq!(
            node(json!([{"key": "gpu", "effect": "Bogus"}])).unwrap_err(),
            "spec.taints[0].effect: unsupported value \"Bogus\": must be one of NoSchedule, \
             PreferNoSchedule, NoExecute"
        );
        assert!(node(json!([{"key": "gpu", "effect": "NoSchedule"}])).is_ok());
        assert!(
            node(json!([{"key": "gpu", "effect": ""}]))
                .unwrap_err()
                .contains("required")
        );
        assert!(
            node(
                json!([{"key": "a", "effect": "NoSchedule"}, {"key": "a", "effect": "NoSchedule"}])
            )
            .unwrap_err()
            .contains("duplicate taint")
        );
        let tolerate = |t| pod(json!({"containers": [], "tolerations": [t]}));
        assert!(tolerate(json!({"operator": "Exists"})).is_ok());
        assert!(
            tolerate(json!({"key": "k", "operator": "Equal", "value": "v",
            "effect": "NoExecute", "tolerationSeconds": 5}))
            .is_ok()
        );
        for (t, want) in [
            (
                json!({"operator": "Equal", "value": "v"}),
                "spec.tolerations[0].operator: invalid",
            ),
            (
                json!({"key": "k", "operator": "Matches"}),
                "spec.tolerations[0].operator: unsupported",
            ),
            (
                json!({"key": "k", "operator": "Exists", "value": "v"}),
                "spec.tolerations[0].value",
            ),
            (
                json!({"key": "k", "effect": "Bogus"}),
                "spec.tolerations[0].effect: unsupported",
            ),
            (
                json!({"key": "k", "effect": "NoSchedule", "tolerationSeconds": 1}),
                "spec.tolerations[0].effect: invalid",
            ),
        ] {
            let err = tolerate(t).unwrap_err();
            assert!(err.starts_with(want), "{err}");
        }
        let device_taint = |effect: &str| {
            slice(json!({"nodeName": "n1", "devices": [{"name": "gpu-0",
                "taints": [{"key": "xid", "effect": effect}]}]}))
        };
        assert!(device_taint("None").is_ok());
        assert!(device_taint("NoExecute").is_ok());
        assert_eq!(
            device_taint("PreferNoSchedule").unwrap_err(),
            "spec.devices[0].taints[0].effect: unsupported value \"PreferNoSchedule\": must be \
             one of NoSchedule, NoExecute, None"
        );
        let rule = check(
            "DeviceTaintRule",
            json!({"metadata": {"name": "r"}, "spec": {
            "taint": {"key": "maintenance", "effect": "Bogus"}}}),
        );
        assert!(
            rule.unwrap_err()
                .starts_with("spec.taint.effect: unsupported")
        );
    }

    #[test]
    fn a_slice_is_for_exactly_one_kind_of_node() {
        assert_eq!(
            slice(json!({"nodeName": "n1", "allNodes": true})).unwrap_err(),
            "spec: exactly one of nodeName, nodeSelector, allNodes and perDeviceNodeSelection is \
             required (set: nodeName, allNodes)"
        );
        assert!(
            slice(json!({}))
                .unwrap_err()
                .starts_with("spec: exactly one of")
        );
        assert!(slice(json!({"allNodes": true})).is_ok());
        assert!(
            slice(json!({"allNodes": false}))
                .unwrap_err()
                .starts_with("spec.allNodes")
        );
        assert!(
            slice(json!({"nodeName": ""}))
                .unwrap_err()
                .starts_with("spec.nodeName")
        );
        let two_terms = json!({"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
            {"matchExpressions": [{"key": "b", "operator": "Exists"}]}]});
        assert!(
            slice(json!({"nodeSelector": two_terms}))
                .unwrap_err()
                .contains("exactly one node selector term")
        );
        let per_device = slice(json!({"perDeviceNodeSelection": true,
            "devices": [{"name": "d", "nodeName": "n1", "allNodes": true}]}));
        assert!(
            per_device
                .unwrap_err()
                .starts_with("spec.devices[0]: exactly one of")
        );
        let stray = slice(json!({"nodeName": "n1", "devices": [{"name": "d", "nodeName": "n1"}]}));
        assert!(
            stray
                .unwrap_err()
                .contains("only be set when the slice sets perDeviceNodeSelection")
        );
    }

    #[test]
    fn pools_devices_and_counters() {
        let pool = |pool| {
            check(
                "ResourceSlice",
                json!({"metadata": {"name": "s"}, "spec": {
                "driver": "gpu.example.com", "nodeName": "n1", "pool": pool}}),
            )
        };
        assert!(pool(json!({"name": "n1", "generation": 0, "resourceSliceCount": 1})).is_ok());
        for (p, want) in [
            (
                json!({"name": "n1", "generation": -1, "resourceSliceCount": 1}),
                "spec.pool.generation",
            ),
            (
                json!({"name": "n1", "generation": 1, "resourceSliceCount": 0}),
                "spec.pool.resourceSliceCount",
            ),
            (
                json!({"name": "", "generation": 1, "resourceSliceCount": 1}),
                "spec.pool.name: required",
            ),
            (
                json!({"name": "N_1", "generation": 1, "resourceSliceCount": 1}),
                "spec.pool.name: invalid",
            ),
        ] {
            let err = pool(p).unwrap_err();
            assert!(err.starts_with(want), "{err}");
        }
        let devices: Vec<_> = (0..129).map(|i| json!({"name": format!("d{i}")})).collect();
        assert_eq!(
            slice(json!({"nodeName": "n1", "devices": devices})).unwrap_err(),
            "spec.devices: 129 entries, at most 128 are allowed"
        );
        let dup = slice(json!({"nodeName": "n1", "devices": [{"name": "d"}, {"name": "d"}]}));
        assert!(
            dup.unwrap_err()
                .starts_with("spec.devices[1].name: duplicate")
        );
        let attr = |a| {
            slice(json!({"nodeName": "n1", "devices": [{"name": "d", "attributes": {"x": a}}]}))
        };
        assert!(attr(json!({"int": 1})).is_ok());
        assert!(attr(json!({"version": "1.2.3-rc.1+b5"})).is_ok());
        assert!(
            attr(json!({"int": 1, "bool": true}))
                .unwrap_err()
                .contains("exactly one value")
        );
        assert!(
            attr(json!({"version": "1.2"}))
                .unwrap_err()
                .contains("semantic version")
        );
        let capacity = slice(json!({"nodeName": "n1", "devices": [{"name": "d",
            "capacity": {"memory": {"value": "lots"}}}]}));
        assert!(
            capacity
                .unwrap_err()
                .starts_with("spec.devices[0].capacity[memory].value:")
        );
        let both = slice(json!({"nodeName": "n1", "devices": [],
            "sharedCounters": [{"name": "s", "counters": {"c": {"value": "1"}}}]}));
        assert!(
            both.unwrap_err()
                .contains("only one of sharedCounters and devices")
        );
    }

    #[test]
    fn claim_requests() {
        let exactly = |e: serde_json::Value| claim(json!([{"name": "gpu", "exactly": e}]));
        assert!(exactly(json!({"deviceClassName": "gpu.example.com"})).is_ok());
        assert!(
            exactly(json!({"deviceClassName": "gpu.example.com", "allocationMode": "All"})).is_ok()
        );
        for (e, want) in [
            (
                json!({"deviceClassName": "gpu.example.com", "count": 0}),
                "spec.devices.requests[0].exactly.count: invalid value 0: must be greater than zero",
            ),
            (
                json!({"deviceClassName": "gpu.example.com", "count": -3}),
                "spec.devices.requests[0].exactly.count",
            ),
            (
                json!({"deviceClassName": "gpu.example.com", "allocationMode": "All", "count": 2}),
                "spec.devices.requests[0].exactly.count",
            ),
            (
                json!({"deviceClassName": "gpu.example.com", "allocationMode": "Some"}),
                "spec.devices.requests[0].exactly.allocationMode: unsupported",
            ),
            (
                json!({"deviceClassName": ""}),
                "spec.devices.requests[0].exactly.deviceClassName: required",
            ),
            (
                json!({"deviceClassName": "Gpu"}),
                "spec.devices.requests[0].exactly.deviceClassName: invalid",
            ),
            (
                json!({"deviceClassName": "gpu", "selectors": [{}]}),
                "spec.devices.requests[0].exactly.selectors[0].cel: required",
            ),
            (
                json!({"deviceClassName": "gpu", "tolerations": [{"key": "k", "effect": "PreferNoSchedule"}]}),
                "spec.devices.requests[0].exactly.tolerations[0].effect",
            ),
        ] {
            let err = exactly(e).unwrap_err();
            assert!(err.starts_with(want), "{err}");
        }
        let requests: Vec<_> = (0..33)
            .map(|i| json!({"name": format!("r{i}"), "exactly": {"deviceClassName": "gpu"}}))
            .collect();
        assert_eq!(
            claim(json!(requests)).unwrap_err(),
            "spec.devices.requests: 33 entries, at most 32 are allowed"
        );
        let subs: Vec<_> = (0..9)
            .map(|i| json!({"name": format!("s{i}"), "deviceClassName": "gpu"}))
            .collect();
        assert_eq!(
            claim(json!([{"name": "gpu", "firstAvailable": subs}])).unwrap_err(),
            "spec.devices.requests[0].firstAvailable: 9 entries, at most 8 are allowed"
        );
        assert!(
            claim(json!([{"name": "gpu"}]))
                .unwrap_err()
                .contains("exactly one of exactly and firstAvailable")
        );
        let constraint = check(
            "ResourceClaim",
            json!({"metadata": {"name": "c"}, "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}],
            "constraints": [{"requests": ["nic"], "matchAttribute": "example.com/numa"}]}}}),
        );
        assert!(
            constraint
                .unwrap_err()
                .starts_with("spec.devices.constraints[0].requests[0]: invalid value \"nic\"")
        );
    }

    #[test]
    fn workloads_classes_and_priorities() {
        let deployment = |replicas: i64| {
            check(
                "Deployment",
                json!({"metadata": {"name": "d"}, "spec": {"replicas": replicas,
                "selector": {}, "template": {"spec": {"containers": [
                    {"name": "c", "resources": {"requests": {"cpu": "-1"}}}]}}}}),
            )
        };
        assert!(
            deployment(-1)
                .unwrap_err()
                .starts_with("spec.replicas: invalid value -1")
        );
        assert!(deployment(1).unwrap_err().starts_with(
            "spec.template.spec.containers[0].resources.requests[cpu]: invalid value"
        ));
        let class = |name: &str| {
            check(
                "DeviceClass",
                json!({"metadata": {"name": "gpu"},
            "spec": {"extendedResourceName": name}}),
            )
        };
        assert!(class("example.com/gpu").is_ok());
        assert!(
            class("kubernetes.io/gpu")
                .unwrap_err()
                .starts_with("spec.extendedResourceName")
        );
        let priority = |name: &str, value: i64| {
            check(
                "PriorityClass",
                json!({"metadata": {"name": name}, "value": value}),
            )
        };
        assert!(priority("high", 1_000_000_000).is_ok());
        assert!(priority("system-critical", 2_000_000_000).is_ok());
        assert!(
            priority("high", 1_000_000_001)
                .unwrap_err()
                .starts_with("value: invalid")
        );
        assert!(
            check("Node", json!({"metadata": {"name": "Node_1"}}))
                .unwrap_err()
                .starts_with("metadata.name")
        );
        let claims = pod(
            json!({"resourceClaims": [{"name": "gpu", "resourceClaimName": "a",
            "resourceClaimTemplateName": "b"}], "containers": []}),
        );
        assert!(
            claims
                .unwrap_err()
                .contains("exactly one of resourceClaimName")
        );
        let unknown = pod(json!({"resourceClaims": [], "containers": [{"name": "c",
            "resources": {"claims": [{"name": "gpu"}]}}]}));
        assert!(
            unknown
                .unwrap_err()
                .starts_with("spec.containers[0].resources.claims[0].name")
        );
        let affinity = pod(json!({"containers": [], "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["x"]}]}]}}}}));
        assert!(affinity.unwrap_err().contains("must be a single integer"));
        let port = pod(
            json!({"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 70000}]}]}),
        );
        assert!(
            port.unwrap_err()
                .starts_with("spec.containers[0].ports[0].hostPort")
        );
    }
}
