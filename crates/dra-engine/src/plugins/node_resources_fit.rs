//! NodeResourcesFit: the pod's requests must fit in what the node has left (Filter); nodes
//! are ranked by a scoring strategy over their requested resources (Score).
//!
//! Amounts are compared as kube-scheduler compares them: in [`Units`] (millicores for cpu,
//! whole units rounded up for everything else), each pod rounded on its own. Only cpu,
//! memory, ephemeral-storage and scalar resources (extended, `hugepages-*`,
//! `*kubernetes.io/*`, `attachable-volumes-*`) are checked; `ignoredResources` and
//! `ignoredResourceGroups` apply to extended resources only. A request for an extended
//! resource the node has no capacity for, but that a DeviceClass serves, is left to
//! DynamicResources. A request larger than the node's whole allocatable is unresolvable.
//!
//! The scores, as upstream:
//! - LeastAllocated and MostAllocated count the node's pods and the pod with the non-zero
//!   defaults (a container without a cpu or memory request counts 100m and 200Mi), and
//!   the pod without its pod-level `spec.resources` (upstream's scorer for this plugin is
//!   built without that feature; BalancedAllocation has it);
//! - RequestedToCapacityRatio maps each resource's utilisation through the shape.
//!
//! Difference from upstream: a resource in `scoringStrategy.resources` that the node has
//! no allocatable for but a DeviceClass serves (DRA extended resources) is left out of the
//! node's score here; upstream counts the class's devices on the node and how many are
//! allocated. With the default resources (cpu, memory) the two agree.

use k8s_openapi::api::core::v1::{Container, Pod};
use smallvec::{SmallVec, smallvec};

use crate::framework::{Code, Cycle, MAX_NODE_SCORE, Plugin, PluginCycle, Point, Status};
use crate::resources::{ResourceList, pod_requests};
use crate::state::NodeInfo;

/// How nodes are scored (`scoringStrategy.type`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Strategy {
    LeastAllocated,
    MostAllocated,
    /// Points (utilisation 0..=100, score 0..=10) of the shape, in order.
    RequestedToCapacityRatio(Vec<(i64, i64)>),
}

/// `NodeResourcesFitArgs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Args {
    pub strategy: Strategy,
    /// Resources the score looks at, with weights (`scoringStrategy.resources`).
    pub resources: Vec<(String, i64)>,
    /// Resources the filter does not check (`ignoredResources`).
    pub ignored_resources: Vec<String>,
    /// Resource groups (the part before `/`) the filter does not check.
    pub ignored_resource_groups: Vec<String>,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            strategy: Strategy::LeastAllocated,
            resources: default_resources(),
            ignored_resources: Vec::new(),
            ignored_resource_groups: Vec::new(),
        }
    }
}

/// cpu and memory, weight 1 each: what both resource plugins score by default.
pub fn default_resources() -> Vec<(String, i64)> {
    vec![("cpu".into(), 1), ("memory".into(), 1)]
}

/// What a container that does not ask for cpu counts for in the scores (kube-scheduler's
/// DefaultMilliCPURequest).
pub const DEFAULT_MILLI_CPU_REQUEST: i64 = 100;
/// The same for memory (DefaultMemoryRequest, 200Mi).
pub const DEFAULT_MEMORY_REQUEST: i64 = 200 * 1024 * 1024;

/// Resource amounts in kube-scheduler's units: millicores for cpu, whole units (rounded
/// up) for everything else. Looked up on every node for every pod: cpu, memory and
/// ephemeral-storage have their own places ([`Basic`]), the few others are a list sorted by
/// name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Units {
    basic: [i64; 3],
    named: Vec<(String, i64)>,
}

/// The resources every node and pod counts, by their place in [`Units`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Basic {
    Cpu,
    Memory,
    EphemeralStorage,
}

impl Basic {
    const ALL: [Basic; 3] = [Basic::Cpu, Basic::Memory, Basic::EphemeralStorage];

    pub fn of(name: &str) -> Option<Basic> {
        match name {
            "cpu" => Some(Basic::Cpu),
            "memory" => Some(Basic::Memory),
            "ephemeral-storage" => Some(Basic::EphemeralStorage),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Basic::Cpu => "cpu",
            Basic::Memory => "memory",
            Basic::EphemeralStorage => "ephemeral-storage",
        }
    }
}

impl Units {
    /// A resource list in units, each amount rounded up on its own.
    pub fn of(list: &ResourceList) -> Units {
        Units::from_pairs(
            list.0
                .iter()
                .map(|(name, q)| (name.as_str(), units(name, q))),
        )
    }

    /// From amounts by name, in order of name.
    fn from_pairs<'a>(pairs: impl Iterator<Item = (&'a str, i64)>) -> Units {
        let mut out = Units::default();
        for (name, amount) in pairs {
            match Basic::of(name) {
                Some(basic) => out.basic[basic as usize] = amount,
                None => out.named.push((name.to_string(), amount)),
            }
        }
        out
    }

    pub fn get(&self, name: &str) -> i64 {
        match Basic::of(name) {
            Some(basic) => self.basic(basic),
            None => self
                .named
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0, |(_, amount)| *amount),
        }
    }

    pub fn basic(&self, basic: Basic) -> i64 {
        self.basic[basic as usize]
    }

    /// The amounts by name, in order of name (cpu, memory and ephemeral-storage where not
    /// zero).
    pub fn iter(&self) -> impl Iterator<Item = (&str, i64)> {
        let mut all: Vec<(&str, i64)> = Basic::ALL
            .into_iter()
            .map(|b| (b.name(), self.basic(b)))
            .filter(|(_, amount)| *amount != 0)
            .chain(self.named.iter().map(|(n, a)| (n.as_str(), *a)))
            .collect();
        all.sort_by(|a, b| a.0.cmp(b.0));
        all.into_iter()
    }

    fn add(&mut self, other: &Units, sign: i64) {
        let add = |entry: &mut i64, amount: i64| {
            *entry = entry.saturating_add(sign.saturating_mul(amount));
        };
        for (mine, theirs) in self.basic.iter_mut().zip(other.basic) {
            add(mine, theirs);
        }
        for (name, amount) in &other.named {
            let at = match self.named.binary_search_by(|(n, _)| n.cmp(name)) {
                Ok(at) => at,
                Err(at) => {
                    self.named.insert(at, (name.clone(), 0));
                    at
                }
            };
            add(&mut self.named[at].1, *amount);
        }
    }
}

fn units(name: &str, q: &dra_cel::Quantity) -> i64 {
    let amount = if name == "cpu" {
        q.milli_value()
    } else {
        q.value()
    };
    amount.unwrap_or(if q.sign() < 0 { i64::MIN } else { i64::MAX })
}

/// What a node's pods request, as kube-scheduler's NodeInfo adds them up: their requests
/// in units (`Requested`), and cpu and memory with the non-zero defaults
/// (`NonZeroRequested`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Requested {
    pub units: Units,
    pub non_zero_milli_cpu: i64,
    pub non_zero_memory: i64,
}

impl Requested {
    /// One pod's part, given its requests ([`pod_requests`]).
    pub fn of_pod(pod: &Pod, requests: &ResourceList) -> Result<Requested, String> {
        let non_zero = non_zero_requests(pod, requests, true)?;
        Ok(Requested {
            units: Units::of(requests),
            non_zero_milli_cpu: units("cpu", &non_zero.get("cpu")),
            non_zero_memory: units("memory", &non_zero.get("memory")),
        })
    }

    pub fn add(&mut self, pod: &Requested) {
        self.apply(pod, 1);
    }

    pub fn sub(&mut self, pod: &Requested) {
        self.apply(pod, -1);
    }

    fn apply(&mut self, pod: &Requested, sign: i64) {
        self.units.add(&pod.units, sign);
        self.non_zero_milli_cpu = self
            .non_zero_milli_cpu
            .saturating_add(sign * pod.non_zero_milli_cpu);
        self.non_zero_memory = self
            .non_zero_memory
            .saturating_add(sign * pod.non_zero_memory);
    }
}

/// Whether pod-level `spec.resources` asks for cpu, memory or huge pages (limits count:
/// API defaulting turns them into requests).
fn pod_level_requests_set(pod: &Pod) -> bool {
    let Some(resources) = pod.spec.as_ref().and_then(|s| s.resources.as_ref()) else {
        return false;
    };
    [resources.requests.as_ref(), resources.limits.as_ref()]
        .into_iter()
        .flatten()
        .flat_map(|list| list.keys())
        .any(|name| name == "cpu" || name == "memory" || name.starts_with("hugepages-"))
}

/// The pod's requests with kube-scheduler's non-zero defaults: each container (regular or
/// init) that asks for no cpu or memory counts [`DEFAULT_MILLI_CPU_REQUEST`] and
/// [`DEFAULT_MEMORY_REQUEST`]. With `pod_level`, pod-level requests count and the defaults
/// apply only to what the pod as a whole does not ask for; without, pod-level
/// `spec.resources` is left out.
pub fn non_zero_requests(
    pod: &Pod,
    requests: &ResourceList,
    pod_level: bool,
) -> Result<ResourceList, String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(requests.clone());
    };
    let level = pod_level && pod_level_requests_set(pod);
    let defaults: Vec<(&str, dra_cel::Quantity)> = [
        (
            "cpu",
            dra_cel::Quantity::from_milli(DEFAULT_MILLI_CPU_REQUEST),
        ),
        (
            "memory",
            dra_cel::Quantity::from_integer(
                DEFAULT_MEMORY_REQUEST,
                dra_cel::QuantityFormat::DecimalSI,
            ),
        ),
    ]
    .into_iter()
    .filter(|(name, _)| !level || !requests.0.contains_key(*name))
    .collect();
    let missing = |c: &Container| defaults.iter().any(|(name, _)| !asks_for(c, name));
    let any_missing = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(missing);
    let drop_pod_level = !pod_level && spec.resources.is_some();
    if !any_missing && !drop_pod_level {
        return Ok(requests.clone());
    }
    let mut pod = pod.clone();
    let spec = pod.spec.as_mut().expect("checked above");
    if !pod_level {
        spec.resources = None;
    }
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        for (name, amount) in &defaults {
            if !asks_for(c, name) {
                c.resources
                    .get_or_insert_with(Default::default)
                    .requests
                    .get_or_insert_with(Default::default)
                    .insert(name.to_string(), amount.to_openapi());
            }
        }
    }
    pod_requests(&pod)
}

/// Whether the container requests `resource` (a limit alone counts: API defaulting makes
/// it the request).
fn asks_for(c: &Container, resource: &str) -> bool {
    let resources = c.resources.as_ref();
    [
        resources.and_then(|r| r.requests.as_ref()),
        resources.and_then(|r| r.limits.as_ref()),
    ]
    .into_iter()
    .flatten()
    .any(|list| list.contains_key(resource))
}

/// A resource name in no `kubernetes.io` namespace that would make a valid quota name
/// (v1helper's IsExtendedResourceName).
pub fn is_extended(name: &str) -> bool {
    if !name.contains('/') || name.contains("kubernetes.io/") || name.starts_with("requests.") {
        return false;
    }
    is_qualified_name(&format!("requests.{name}"))
}

/// What kube-scheduler counts per name beside cpu, memory and ephemeral-storage
/// (IsScalarResourceName).
pub fn is_scalar(name: &str) -> bool {
    is_extended(name)
        || name.starts_with("hugepages-")
        || name.contains("kubernetes.io/")
        || name.starts_with("attachable-volumes-")
}

/// apimachinery's IsQualifiedName: an optional DNS subdomain prefix and `/`, then a name of
/// at most 63 alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
fn is_qualified_name(value: &str) -> bool {
    let (prefix, name) = match value.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, value),
    };
    if name.contains('/') {
        return false;
    }
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|label| {
                !label.is_empty()
                    && label.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && label.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && label
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    name_ok && prefix_ok
}

/// The node's allocatable `resource` in units, as kube-scheduler's NodeInfo keeps it (only
/// cpu, memory, ephemeral-storage and scalar resources).
pub fn allocatable(node: &NodeInfo, resource: &str) -> i64 {
    node.allocatable_units.get(resource)
}

/// [`allocatable`] for every resource of a node's allocatable, worked out once per Node
/// object.
pub fn allocatable_units(list: &ResourceList) -> Units {
    Units::from_pairs(
        list.0
            .iter()
            .filter(|(name, _)| Basic::of(name).is_some() || is_scalar(name))
            .map(|(name, q)| (name.as_str(), units(name, q))),
    )
}

/// Which of the node's requested amounts a score counts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Counting {
    /// cpu and memory with the non-zero defaults (LeastAllocated, MostAllocated,
    /// RequestedToCapacityRatio).
    NonZero,
    /// What the pods request (BalancedAllocation).
    Requested,
}

/// Per scored resource, what the node would have requested with the pod, what it has
/// requested without, and its allocatable; resources the node has none of (or that the
/// pod does not ask for, for scalar resources) are all zero (upstream's
/// calculateNodeAllocatableRequest).
pub struct Allocation {
    pub requested: PerResource,
    pub allocated: PerResource,
    pub allocatable: PerResource,
}

/// One amount per scored resource (two by default), inline.
pub type PerResource = SmallVec<[i64; 4]>;

pub fn allocation(
    resources: &[(String, i64)],
    pod: &[i64],
    node: &NodeInfo,
    counting: Counting,
) -> Allocation {
    let n = resources.len();
    let mut out = Allocation {
        requested: smallvec![0; n],
        allocated: smallvec![0; n],
        allocatable: smallvec![0; n],
    };
    for (i, (resource, _)) in resources.iter().enumerate() {
        if pod[i] == 0 && is_scalar(resource) {
            continue;
        }
        let have = allocatable(node, resource);
        if have == 0 {
            continue;
        }
        let used = match (resource.as_str(), counting) {
            ("cpu", Counting::NonZero) => node.requested.non_zero_milli_cpu,
            ("memory", Counting::NonZero) => node.requested.non_zero_memory,
            _ => node.requested.units.get(resource),
        };
        out.allocatable[i] = have;
        out.allocated[i] = used;
        out.requested[i] = used.saturating_add(pod[i]);
    }
    out
}

pub struct NodeResourcesFit {
    args: Args,
}

impl NodeResourcesFit {
    pub fn new(args: &Args) -> Self {
        NodeResourcesFit { args: args.clone() }
    }

    fn ignored(&self, resource: &str) -> bool {
        self.args.ignored_resources.iter().any(|r| r == resource)
            || resource.split_once('/').is_some_and(|(group, _)| {
                self.args.ignored_resource_groups.iter().any(|g| g == group)
            })
    }

    /// The strategy's score of one node.
    fn score(&self, a: &Allocation) -> i64 {
        let weights = self.args.resources.iter().map(|(_, w)| *w);
        let scored = a
            .requested
            .iter()
            .zip(&a.allocatable)
            .zip(weights)
            .filter(|((_, capacity), _)| **capacity != 0)
            .map(|((requested, capacity), weight)| (*requested, *capacity, weight));
        match &self.args.strategy {
            Strategy::LeastAllocated => weighted_mean(scored.map(|(r, c, w)| {
                let score = if r > c {
                    0
                } else {
                    (c - r) * MAX_NODE_SCORE / c
                };
                (score, w)
            })),
            Strategy::MostAllocated => {
                weighted_mean(scored.map(|(r, c, w)| (r.min(c) * MAX_NODE_SCORE / c, w)))
            }
            Strategy::RequestedToCapacityRatio(shape) => {
                let (mut total, mut weights) = (0i64, 0i64);
                for (r, c, w) in scored {
                    let utilisation = if r > c { 100 } else { r * 100 / c };
                    let score = shape_score(shape, utilisation);
                    // Resources that score 0 do not count towards the mean (as upstream).
                    if score > 0 {
                        total += score * w;
                        weights += w;
                    }
                }
                if weights == 0 {
                    0
                } else {
                    (total as f64 / weights as f64).round() as i64
                }
            }
        }
    }
}

/// Σ score·weight / Σ weight, truncated; 0 without weights.
fn weighted_mean(scores: impl Iterator<Item = (i64, i64)>) -> i64 {
    let (mut total, mut weights) = (0i64, 0i64);
    for (score, weight) in scores {
        total += score * weight;
        weights += weight;
    }
    if weights == 0 { 0 } else { total / weights }
}

/// The shape's broken line at `utilisation` (points' scores 0..=10, scaled to 0..=100).
fn shape_score(shape: &[(i64, i64)], utilisation: i64) -> i64 {
    let scale = MAX_NODE_SCORE / 10;
    for (i, &(u, s)) in shape.iter().enumerate() {
        if utilisation <= u {
            if i == 0 {
                return s * scale;
            }
            let (u0, s0) = shape[i - 1];
            return s0 * scale + (s - s0) * scale * (utilisation - u0) / (u - u0);
        }
    }
    shape.last().map_or(0, |(_, s)| s * scale)
}

struct FitCycle<'a> {
    plugin: &'a NodeResourcesFit,
    cycle: &'a Cycle<'a>,
    /// What the filter checks on each node, in the order of its reasons.
    checks: Vec<Check>,
    /// The pod's requests of the scored resources, non-zero, for the score.
    scored: Vec<i64>,
}

impl Plugin for NodeResourcesFit {
    fn name(&self) -> &'static str {
        "NodeResourcesFit"
    }

    fn points(&self) -> &'static [Point] {
        &[
            Point::PreFilter,
            Point::Filter,
            Point::PreScore,
            Point::Score,
        ]
    }

    fn cycle<'a>(&'a self, cycle: &'a Cycle<'a>) -> Box<dyn PluginCycle + 'a> {
        Box::new(FitCycle {
            plugin: self,
            cycle,
            checks: self.checks(&Units::of(cycle.requests), cycle),
            scored: Vec::new(),
        })
    }
}

impl PluginCycle for FitCycle<'_> {
    fn pre_filter(&mut self) -> Status {
        Status::success()
    }

    fn filter(&self, node: &NodeInfo) -> Status {
        let (reasons, unresolvable) = self.insufficient(node);
        if reasons.is_empty() {
            Status::success()
        } else if unresolvable {
            Status::new(Code::UnschedulableAndUnresolvable, reasons)
        } else {
            Status::new(Code::Unschedulable, reasons)
        }
    }

    fn pre_score(&mut self, _feasible: &[&NodeInfo]) -> Status {
        let requests = match non_zero_requests(self.cycle.pod, self.cycle.requests, false) {
            Ok(r) => r,
            Err(e) => return Status::error(e),
        };
        let requests = Units::of(&requests);
        self.scored = self
            .plugin
            .args
            .resources
            .iter()
            .map(|(name, _)| requests.get(name))
            .collect();
        Status::success()
    }

    fn score(&self, node: &NodeInfo) -> Result<i64, Status> {
        if self.plugin.args.resources.is_empty() {
            return Err(Status::error("resources not found"));
        }
        let a = allocation(
            &self.plugin.args.resources,
            &self.scored,
            node,
            Counting::NonZero,
        );
        Ok(self.plugin.score(&a))
    }
}

/// One of the pod's requests the filter checks on every node.
struct Check {
    resource: String,
    /// Where cpu, memory and ephemeral-storage are kept, for them.
    basic: Option<Basic>,
    want: i64,
    /// A scalar resource that DeviceClasses serve (DRA extended resources): not checked on
    /// nodes that have none of it by device plugin.
    served_by_devices: bool,
}

impl NodeResourcesFit {
    /// The pod's non-zero requests the filter checks, once per attempt: cpu, memory and
    /// ephemeral-storage, then scalar resources by name, less the ignored extended ones.
    fn checks(&self, request: &Units, cycle: &Cycle<'_>) -> Vec<Check> {
        let check = |name: &str, want: i64| Check {
            resource: name.to_string(),
            basic: Basic::of(name),
            want,
            served_by_devices: is_scalar(name) && cycle.served_by_devices(name),
        };
        let basic = Basic::ALL
            .into_iter()
            .map(|b| (b.name(), request.basic(b)))
            .filter(|&(_, want)| want > 0);
        let scalar = request
            .iter()
            .filter(|&(name, want)| want > 0 && is_scalar(name))
            .filter(|&(name, _)| !(is_extended(name) && self.ignored(name)));
        basic.chain(scalar).map(|(n, w)| check(n, w)).collect()
    }
}

impl FitCycle<'_> {
    /// What does not fit, one reason per resource ("Too many pods", "Insufficient cpu"),
    /// and whether any request exceeds the node's whole allocatable.
    fn insufficient(&self, node: &NodeInfo) -> (Vec<String>, bool) {
        let mut reasons = Vec::new();
        let mut unresolvable = false;
        if node.pods as i64 + 1 > node.allowed_pods {
            reasons.push("Too many pods".to_string());
        }
        let used = &node.requested.units;
        for Check {
            resource,
            basic,
            want,
            served_by_devices,
        } in &self.checks
        {
            let (have, used) = match basic {
                Some(b) => (node.allocatable_units.basic(*b), used.basic(*b)),
                None => (allocatable(node, resource), used.get(resource)),
            };
            if have <= 0 && *served_by_devices {
                continue;
            }
            if *want > have.saturating_sub(used) {
                reasons.push(format!("Insufficient {resource}"));
                unresolvable |= *want > have;
            }
        }
        (reasons, unresolvable)
    }
}

/// Small builders for the resource and image plugins' tests: clusters of a few nodes and
/// pods, evaluated by a profile of the plugins under test.
#[cfg(test)]
pub(crate) mod scenario {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use serde_json::{Value, json};

    use crate::engine::{Engine, EngineConfig};
    use crate::framework::{PluginArgs, PluginEntry, Profile};
    use crate::{ClusterInput, Evaluation, ObjectKey};

    pub struct NodeBuilder(Value);

    pub fn node(name: &str) -> NodeBuilder {
        NodeBuilder(json!({"metadata": {"name": name},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}))
    }

    impl NodeBuilder {
        pub fn allocatable(mut self, resource: &str, amount: &str) -> Self {
            self.0["status"]["allocatable"][resource] = json!(amount);
            self
        }

        /// An image the node has pulled, under these names, of `mib` MiB.
        pub fn image(mut self, names: &[&str], mib: i64) -> Self {
            let images = self.0["status"]
                .as_object_mut()
                .unwrap()
                .entry("images")
                .or_insert(json!([]));
            images
                .as_array_mut()
                .unwrap()
                .push(json!({"names": names, "sizeBytes": mib * 1024 * 1024}));
            self
        }

        pub fn declares(mut self, features: &[&str]) -> Self {
            self.0["status"]["declaredFeatures"] = json!(features);
            self
        }

        pub fn build(self) -> Node {
            serde_json::from_value(self.0).unwrap()
        }
    }

    pub struct PodBuilder(Value);

    pub fn pod(name: &str) -> PodBuilder {
        PodBuilder(
            json!({"metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"schedulerName": "dra-scheduler", "containers": []}}),
        )
    }

    impl PodBuilder {
        /// A container with these requests (`[]`: none at all).
        pub fn container(mut self, requests: &[(&str, &str)]) -> Self {
            let requests: serde_json::Map<String, Value> = requests
                .iter()
                .map(|(k, v)| (k.to_string(), json!(v)))
                .collect();
            let containers = self.0["spec"]["containers"].as_array_mut().unwrap();
            let name = format!("c{}", containers.len());
            containers.push(json!({"name": name, "image": "app",
                "resources": {"requests": requests}}));
            self
        }

        pub fn image(mut self, image: &str) -> Self {
            let containers = self.0["spec"]["containers"].as_array_mut().unwrap();
            let name = format!("c{}", containers.len());
            containers.push(json!({"name": name, "image": image}));
            self
        }

        /// Set a field of the spec.
        pub fn spec(mut self, field: &str, value: Value) -> Self {
            self.0["spec"][field] = value;
            self
        }

        pub fn on(self, node: &str) -> Self {
            self.spec("nodeName", json!(node))
        }

        pub fn build(self) -> Pod {
            serde_json::from_value(self.0).unwrap()
        }
    }

    /// A profile of just these plugins, weight 1 each.
    pub fn profile(plugins: &[&str], args: PluginArgs) -> Profile {
        Profile {
            plugins: plugins
                .iter()
                .map(|name| PluginEntry {
                    name: name.to_string(),
                    points: crate::plugins::points_of(name)
                        .unwrap()
                        .iter()
                        .copied()
                        .collect(),
                    weight: 1,
                })
                .collect(),
            args,
        }
    }

    /// Every node's verdict and score for the pod `pending` (one of `pods`).
    pub fn evaluate(
        profile: Profile,
        nodes: Vec<Node>,
        pods: Vec<Pod>,
        pending: &str,
    ) -> Evaluation {
        let config = EngineConfig {
            profile,
            ..Default::default()
        };
        let mut engine = Engine::new(
            config,
            ClusterInput {
                nodes,
                pods,
                ..Default::default()
            },
        );
        engine.evaluate(&ObjectKey::new("default", pending))
    }

    /// Run one plugin's PreFilter and Filter for the pod `pending` on every node.
    pub fn filter(
        plugin: &dyn crate::framework::Plugin,
        nodes: Vec<Node>,
        pods: Vec<Pod>,
        pending: &str,
    ) -> Vec<(String, crate::framework::Status)> {
        let state = crate::ClusterState::new(ClusterInput {
            nodes,
            pods,
            ..Default::default()
        });
        let key = ObjectKey::new("default", pending);
        let pod = &state.pods[&key];
        let requests = crate::resources::pod_requests(pod).unwrap();
        let snapshot = dra_allocator::Snapshot::new(Default::default());
        let features = dra_allocator::Features::default();
        let shared = crate::framework::Shared::default();
        let cycle = crate::framework::Cycle {
            pod,
            key: &key,
            state: &state,
            requests: &requests,
            snapshot: &snapshot,
            features: &features,
            limits: dra_allocator::Limits {
                deadline: None,
                cancel: None,
            },
            cancel: None,
            served_by_devices: &[],
            shared: &shared,
            revise: Vec::new(),
            device_memo: None,
        };
        let mut run = plugin.cycle(&cycle);
        let pre = run.pre_filter();
        state
            .nodes
            .values()
            .map(|node| {
                let status = if pre.is_skip() {
                    crate::framework::Status::success()
                } else {
                    run.filter(node)
                };
                (node.name().to_string(), status)
            })
            .collect()
    }

    /// One plugin's score of each node, in node order.
    pub fn scores(evaluation: &Evaluation, plugin: &str) -> Vec<(String, i64)> {
        evaluation
            .plugin_scores
            .get(plugin)
            .unwrap_or_else(|| panic!("{plugin} did not score: {evaluation:?}"))
            .iter()
            .map(|(node, score)| (node.clone(), *score))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::scenario::*;
    use super::*;
    use crate::framework::PluginArgs;

    #[test]
    fn units_list_resources_by_name_wherever_they_are_kept() {
        let list: std::collections::BTreeMap<String, _> = [
            ("memory", "1Gi"),
            ("cpu", "500m"),
            ("hugepages-2Mi", "4Mi"),
            ("example.com/foo", "2"),
            ("ephemeral-storage", "0"),
        ]
        .into_iter()
        .map(|(name, amount)| {
            let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity(amount.into());
            (name.to_string(), q)
        })
        .collect();
        let pod = Units::of(&ResourceList::parse(Some(&list)).unwrap());
        // cpu and memory have fixed places, the others a list; read back in name order
        // (reasons are written in that order), zero basics left out.
        assert_eq!(
            pod.iter().collect::<Vec<_>>(),
            [
                ("cpu", 500),
                ("example.com/foo", 2),
                ("hugepages-2Mi", 4 << 20),
                ("memory", 1 << 30)
            ]
        );
        let mut node = Units::default();
        node.add(&pod, 1);
        node.add(&pod, 1);
        assert_eq!(node.get("cpu"), 1000);
        assert_eq!(node.basic(Basic::Memory), 2 << 30);
        assert_eq!(node.get("example.com/foo"), 4);
        assert_eq!(node.get("example.com/bar"), 0);
        node.add(&pod, -1);
        assert_eq!(node, pod);
    }

    fn with_strategy(strategy: Strategy) -> PluginArgs {
        PluginArgs {
            node_resources_fit: Args {
                strategy,
                ..Args::default()
            },
            ..PluginArgs::default()
        }
    }

    /// n1 already runs a pod of 2 cpu and 4Gi; n2 is empty; the pod asks for 1 cpu and 1Gi.
    fn half_full_and_empty(strategy: Strategy) -> Vec<(String, i64)> {
        let e = evaluate(
            profile(&["NodeResourcesFit"], with_strategy(strategy)),
            vec![node("n1").build(), node("n2").build()],
            vec![
                pod("running")
                    .container(&[("cpu", "2"), ("memory", "4Gi")])
                    .on("n1")
                    .build(),
                pod("new")
                    .container(&[("cpu", "1"), ("memory", "1Gi")])
                    .build(),
            ],
            "new",
        );
        scores(&e, "NodeResourcesFit")
    }

    #[test]
    fn least_allocated_prefers_the_emptier_node() {
        // n1: cpu 3/4 → 25, memory 5/8 → 37; n2: cpu 1/4 → 75, memory 1/8 → 87.
        assert_eq!(
            half_full_and_empty(Strategy::LeastAllocated),
            [("n1".into(), 31), ("n2".into(), 81)]
        );
    }

    #[test]
    fn most_allocated_prefers_the_fuller_node() {
        // n1: cpu 75, memory 62; n2: cpu 25, memory 12.
        assert_eq!(
            half_full_and_empty(Strategy::MostAllocated),
            [("n1".into(), 68), ("n2".into(), 18)]
        );
    }

    #[test]
    fn requested_to_capacity_ratio_follows_the_shape_and_rounds() {
        // Utilisation maps straight to 0..=100: n1 (75 + 62) / 2 = 68.5, n2 (25 + 12) / 2.
        let rising = Strategy::RequestedToCapacityRatio(vec![(0, 0), (100, 10)]);
        assert_eq!(
            half_full_and_empty(rising),
            [("n1".into(), 69), ("n2".into(), 19)]
        );
        // A falling shape spreads; between points it is interpolated: n1 cpu 75% → 25,
        // memory 62% → 38, mean 31.5; n2 25% → 75, 12% → 88, mean 81.5.
        let falling = Strategy::RequestedToCapacityRatio(vec![(0, 10), (50, 5), (100, 0)]);
        assert_eq!(
            half_full_and_empty(falling),
            [("n1".into(), 32), ("n2".into(), 82)]
        );
    }

    #[test]
    fn weights_tilt_the_score_towards_a_resource() {
        let args = PluginArgs {
            node_resources_fit: Args {
                resources: vec![("cpu".into(), 3), ("memory".into(), 1)],
                ..Args::default()
            },
            ..PluginArgs::default()
        };
        let e = evaluate(
            profile(&["NodeResourcesFit"], args),
            vec![node("n1").build()],
            vec![
                pod("new")
                    .container(&[("cpu", "1"), ("memory", "1Gi")])
                    .build(),
            ],
            "new",
        );
        // Only one node: nothing is scored.
        assert!(e.plugin_scores.is_empty());
        let a = Allocation {
            requested: smallvec![1000, 1 << 30],
            allocated: smallvec![0, 0],
            allocatable: smallvec![4000, 8 << 30],
        };
        let plugin = NodeResourcesFit::new(&Args {
            resources: vec![("cpu".into(), 3), ("memory".into(), 1)],
            ..Args::default()
        });
        // (75·3 + 87·1) / 4 = 78.
        assert_eq!(plugin.score(&a), 78);
    }

    #[test]
    fn pods_without_requests_count_as_100m_and_200mi_in_the_score() {
        let e = evaluate(
            profile(&["NodeResourcesFit"], PluginArgs::default()),
            vec![node("n1").build(), node("n2").build()],
            vec![
                pod("running").container(&[]).on("n1").build(),
                pod("new").container(&[]).build(),
            ],
            "new",
        );
        // n1: 200m of 4 cpu → 95, 400Mi of 8Gi → 95; n2: 100m → 97, 200Mi → 97.
        assert_eq!(
            scores(&e, "NodeResourcesFit"),
            [("n1".into(), 95), ("n2".into(), 97)]
        );
    }

    #[test]
    fn a_container_that_asks_for_cpu_only_counts_200mi_of_memory() {
        let p = pod("p")
            .container(&[("cpu", "1")])
            .container(&[("memory", "1Gi")])
            .build();
        let requests = pod_requests(&p).unwrap();
        let r = Requested::of_pod(&p, &requests).unwrap();
        assert_eq!(r.units.get("cpu"), 1000);
        assert_eq!(r.units.get("memory"), 1 << 30);
        assert_eq!(r.non_zero_milli_cpu, 1100);
        assert_eq!(r.non_zero_memory, (1 << 30) + DEFAULT_MEMORY_REQUEST);
    }

    #[test]
    fn pod_level_requests_replace_the_defaults_on_the_node_but_not_in_the_pods_score() {
        let p = pod("p")
            .container(&[])
            .spec("resources", serde_json::json!({"requests": {"cpu": "2"}}))
            .build();
        let requests = pod_requests(&p).unwrap();
        let on_node = Requested::of_pod(&p, &requests).unwrap();
        assert_eq!(on_node.non_zero_milli_cpu, 2000);
        assert_eq!(on_node.non_zero_memory, DEFAULT_MEMORY_REQUEST);
        // The scorer upstream is built without pod-level resources.
        let scored = non_zero_requests(&p, &requests, false).unwrap();
        assert_eq!(units("cpu", &scored.get("cpu")), DEFAULT_MILLI_CPU_REQUEST);
    }

    fn fit_filter(
        args: Args,
        nodes: Vec<k8s_openapi::api::core::v1::Node>,
        pods: Vec<Pod>,
    ) -> Vec<(String, Status)> {
        filter(&NodeResourcesFit::new(&args), nodes, pods, "new")
    }

    #[test]
    fn more_than_the_node_has_left_is_unschedulable_more_than_it_has_is_unresolvable() {
        let nodes = vec![node("n1").build()];
        let running = pod("running").container(&[("cpu", "2")]).on("n1").build();
        let three = pod("new").container(&[("cpu", "3")]).build();
        let [(_, status)] =
            &fit_filter(Args::default(), nodes.clone(), vec![running.clone(), three])[..]
        else {
            panic!()
        };
        assert_eq!(status.code, Code::Unschedulable);
        assert_eq!(*status.reasons, ["Insufficient cpu"]);
        let five = pod("new").container(&[("cpu", "5")]).build();
        let [(_, status)] = &fit_filter(Args::default(), nodes, vec![running, five])[..] else {
            panic!()
        };
        assert_eq!(status.code, Code::UnschedulableAndUnresolvable);
    }

    #[test]
    fn a_full_node_has_too_many_pods_even_for_a_pod_without_requests() {
        let nodes = vec![node("n1").allocatable("pods", "1").build()];
        let pods = vec![
            pod("running").container(&[]).on("n1").build(),
            pod("new").container(&[]).build(),
        ];
        let [(_, status)] = &fit_filter(Args::default(), nodes, pods)[..] else {
            panic!()
        };
        assert_eq!(*status.reasons, ["Too many pods"]);
        assert_eq!(status.code, Code::Unschedulable);
    }

    #[test]
    fn ignored_extended_resources_are_not_checked_and_unknown_names_never_are() {
        let nodes = vec![node("n1").build()];
        let pods = || {
            vec![
                pod("new")
                    .container(&[("example.com/foo", "1"), ("foo", "1")])
                    .build(),
            ]
        };
        let [(_, status)] = &fit_filter(Args::default(), nodes.clone(), pods())[..] else {
            panic!()
        };
        assert_eq!(*status.reasons, ["Insufficient example.com/foo"]);
        for args in [
            Args {
                ignored_resources: vec!["example.com/foo".into()],
                ..Args::default()
            },
            Args {
                ignored_resource_groups: vec!["example.com".into()],
                ..Args::default()
            },
        ] {
            let [(_, status)] = &fit_filter(args, nodes.clone(), pods())[..] else {
                panic!()
            };
            assert!(status.is_success(), "{status:?}");
        }
    }

    #[test]
    fn ignoring_applies_to_extended_resources_only() {
        let nodes = vec![node("n1").build()];
        let pods = vec![pod("new").container(&[("hugepages-2Mi", "2Mi")]).build()];
        let args = Args {
            ignored_resources: vec!["hugepages-2Mi".into()],
            ..Args::default()
        };
        let [(_, status)] = &fit_filter(args, nodes, pods)[..] else {
            panic!()
        };
        assert_eq!(*status.reasons, ["Insufficient hugepages-2Mi"]);
    }

    #[test]
    fn resource_names_are_classified_as_upstream() {
        assert!(is_extended("example.com/foo"));
        assert!(!is_extended("deviceclass.resource.kubernetes.io/gpu"));
        assert!(!is_extended("cpu"));
        assert!(!is_extended("kubernetes.io/foo"));
        assert!(
            !is_extended("Example.com/foo"),
            "the prefix must be a DNS subdomain"
        );
        assert!(is_scalar("hugepages-1Gi"));
        assert!(is_scalar("attachable-volumes-csi-x"));
        assert!(is_scalar("deviceclass.resource.kubernetes.io/gpu"));
        assert!(!is_scalar("foo"));
    }
}
