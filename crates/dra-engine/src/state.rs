//! The cluster as the engine sees it: nodes with what their bound pods use, pods, claims and
//! the DRA objects. One writer (the informer loop or the simulator) applies updates; the
//! scheduling cycle reads it and records what it assumes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};

use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{
    Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, ReplicationController, Service,
};
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass, VolumeAttachment};

use dra_allocator::Slice;

use crate::node_tree::{NodeTree, zone_key};
use crate::plugins::label_selector::Selector;
use crate::plugins::node_ports::{HostPort, host_ports};
use crate::plugins::node_resources_fit::{Requested, Units, allocatable_units};
use crate::plugins::priority_sort::priority;
use crate::resources::{ResourceList, pod_requests};

/// Everything the engine is built from, as read from the API server or from manifests.
#[derive(Clone, Debug, Default)]
pub struct ClusterInput {
    pub namespaces: Vec<Namespace>,
    pub nodes: Vec<Node>,
    /// Bound pods (spec.nodeName set) are existing load; the rest are candidates to schedule.
    pub pods: Vec<Pod>,
    pub claims: Vec<ResourceClaim>,
    pub classes: Vec<DeviceClass>,
    pub slices: Vec<ResourceSlice>,
    pub taint_rules: Vec<DeviceTaintRule>,
    /// Storage, for the volume plugins.
    pub persistent_volumes: Vec<PersistentVolume>,
    pub persistent_volume_claims: Vec<PersistentVolumeClaim>,
    pub storage_classes: Vec<StorageClass>,
    pub csi_nodes: Vec<CSINode>,
    pub csi_drivers: Vec<CSIDriver>,
    pub volume_attachments: Vec<VolumeAttachment>,
    /// What selects pods, for PodTopologySpread's default constraints (only their
    /// selectors are kept).
    pub services: Vec<Service>,
    pub replication_controllers: Vec<ReplicationController>,
    pub replica_sets: Vec<ReplicaSet>,
    pub stateful_sets: Vec<StatefulSet>,
}

/// `namespace/name` of a namespaced object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    pub fn of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Self {
        ObjectKey::new(
            meta.namespace.clone().unwrap_or_else(|| "default".into()),
            meta.name.clone().unwrap_or_default(),
        )
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A node and what is already placed on it.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    /// Shared by forks of the state.
    pub node: Arc<Node>,
    pub allocatable: ResourceList,
    /// What NodeResourcesFit counts of `allocatable`, in its units (the filter and the
    /// scores read it for every pod).
    pub allocatable_units: Units,
    /// `allocatable.pods`: how many pods may run here.
    pub allowed_pods: i64,
    pub used: ResourceList,
    /// What the bound pods request as kube-scheduler adds it up for NodeResourcesFit and
    /// the scores: in units, each pod rounded on its own, and cpu and memory with the
    /// non-zero defaults.
    pub requested: Requested,
    pub pods: usize,
    /// The pods bound here (not terminal), to look up in [`ClusterState::pods`].
    pub pod_keys: BTreeSet<ObjectKey>,
    /// Those of them with pod affinity or anti-affinity (as kube-scheduler's NodeInfo
    /// keeps them apart): InterPodAffinity looks at these on every attempt.
    pub pods_with_affinity: BTreeSet<ObjectKey>,
    /// How many of them have each priority (`spec.priority`, 0 when unset): whether a
    /// pod of lower priority is here is read without looking the pods up.
    pub priorities: BTreeMap<i32, usize>,
    pub ports: Vec<HostPort>,
    /// Why the node's own object is unusable (e.g. a malformed allocatable quantity).
    pub broken: Option<String>,
    /// Unique in the process for each Node object taken: a new one means the object
    /// changed (what was found for the old one may not hold).
    pub object_version: u64,
    /// The node's place in dense per-node tables ([`crate::device_memo`]): small, unique
    /// among the nodes of its [`ClusterState`], given in the order nodes are scanned.
    /// [`NodeSlots::NONE`] until the state gives one. A hint only: what is kept by slot
    /// is checked against `object_version`.
    pub slot: u32,
}

impl NodeInfo {
    pub fn new(node: Node) -> Self {
        let (allocatable, broken) = match ResourceList::parse(
            node.status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref())),
        ) {
            Ok(list) => (list, None),
            Err(e) => (
                ResourceList::default(),
                Some(format!("node status.allocatable: {e}")),
            ),
        };
        let allowed_pods = allocatable.0.get("pods").and_then(|q| q.value());
        NodeInfo {
            node: Arc::new(node),
            allocatable_units: allocatable_units(&allocatable),
            allowed_pods: allowed_pods.unwrap_or(0),
            allocatable,
            used: ResourceList::default(),
            requested: Requested::default(),
            pods: 0,
            pod_keys: BTreeSet::new(),
            pods_with_affinity: BTreeSet::new(),
            priorities: BTreeMap::new(),
            ports: Vec::new(),
            broken,
            object_version: {
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            },
            slot: NodeSlots::NONE,
        }
    }

    pub fn name(&self) -> &str {
        self.node.metadata.name.as_deref().unwrap_or_default()
    }

    /// Count a pod bound to this node.
    pub fn add_pod(&mut self, pod: &Pod) {
        if let Ok(requests) = pod_requests(pod) {
            if let Ok(requested) = Requested::of_pod(pod, &requests) {
                self.requested.add(&requested);
            }
            self.used.add(&requests);
        }
        self.pods += 1;
        let key = ObjectKey::of(&pod.metadata);
        if has_pod_affinity(pod) {
            self.pods_with_affinity.insert(key.clone());
        }
        if self.pod_keys.insert(key) {
            *self.priorities.entry(priority(pod)).or_default() += 1;
        }
        self.ports.extend(host_ports(pod));
    }

    /// The lowest priority of the pods bound here, if any.
    pub fn lowest_priority(&self) -> Option<i32> {
        self.priorities.keys().next().copied()
    }

    pub fn remove_pod(&mut self, pod: &Pod) {
        if let Ok(requests) = pod_requests(pod) {
            if let Ok(requested) = Requested::of_pod(pod, &requests) {
                self.requested.sub(&requested);
            }
            self.used.sub(&requests);
        }
        self.pods = self.pods.saturating_sub(1);
        let key = ObjectKey::of(&pod.metadata);
        self.pods_with_affinity.remove(&key);
        if self.pod_keys.remove(&key)
            && let Some(n) = self.priorities.get_mut(&priority(pod))
        {
            *n -= 1;
            if *n == 0 {
                self.priorities.remove(&priority(pod));
            }
        }
        for port in host_ports(pod) {
            if let Some(i) = self.ports.iter().position(|p| *p == port) {
                self.ports.swap_remove(i);
            }
        }
    }
}

/// Whether the pod has pod affinity or anti-affinity terms.
pub fn has_pod_affinity(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .is_some_and(|a| a.pod_affinity.is_some() || a.pod_anti_affinity.is_some())
}

/// Pods that are terminal use nothing.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

pub fn bound_node(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// The cluster state, indexed for the scheduling cycle.
#[derive(Clone, Debug, Default)]
pub struct ClusterState {
    pub nodes: BTreeMap<String, NodeInfo>,
    /// Behind an `Arc`, as are the claims: a hash table holds its values inline and has
    /// room for up to twice as many as it holds, and a k8s-openapi Pod is 2,464 bytes (a
    /// claim 576) before anything it points to; and a fork of the state
    /// ([`crate::Engine::fork`]) shares them instead of copying every one.
    pub pods: HashMap<ObjectKey, Arc<Pod>>,
    pub claims: HashMap<ObjectKey, Arc<ResourceClaim>>,
    pub classes: Vec<DeviceClass>,
    /// Shared with every snapshot built from this state (not copied per rebuild).
    /// Each device's attributes and capacity are held beside the API object, not in it (see
    /// [`Slice`]).
    pub slices: Vec<Arc<Slice>>,
    pub taint_rules: Vec<DeviceTaintRule>,
    pub namespaces: BTreeMap<String, Namespace>,
    pub volumes: Volumes,
    pub workloads: Workloads,
    /// Which [`NodeInfo::slot`]s are taken.
    pub node_slots: NodeSlots,
    /// The nodes with a bound pod that has pod affinity or anti-affinity (non-empty
    /// [`NodeInfo::pods_with_affinity`]), by name: InterPodAffinity reads these on every
    /// attempt instead of every node.
    pub nodes_with_affinity_pods: BTreeSet<String>,
    /// On how many nodes each image is (ImageLocality's spread), kept as nodes come and go.
    pub image_spread: ImageSpread,
    /// The nodes by zone, in the order they came: the order a cycle examines them in.
    pub node_tree: NodeTree,
    /// The order a cycle examines nodes in, made when a cycle first asks after a node came
    /// or went ([`ClusterState::nodes_in_order`]).
    node_order: OnceLock<Arc<NodeOrder>>,
    /// The order before the last node came or went.
    last_node_order: Option<Arc<NodeOrder>>,
}

/// The nodes' order as a cycle last saw it: their names, and their positions in
/// [`ClusterState::nodes`].
#[derive(Debug)]
struct NodeOrder {
    names: Vec<String>,
    positions: Vec<u32>,
}

/// On how many nodes each image name is (`status.images[].names`), as kube-scheduler's
/// snapshot keeps it: ImageLocality reads it per pod instead of every node's images.
#[derive(Clone, Debug, Default)]
pub struct ImageSpread(HashMap<String, usize>);

impl ImageSpread {
    /// How many nodes have an image named `name`.
    pub fn nodes_with(&self, name: &str) -> usize {
        self.0.get(name).copied().unwrap_or(0)
    }

    fn add(&mut self, node: &Node) {
        for name in image_names(node) {
            *self.0.entry(name.to_string()).or_default() += 1;
        }
    }

    fn remove(&mut self, node: &Node) {
        for name in image_names(node) {
            if let Some(n) = self.0.get_mut(name) {
                *n -= 1;
                if *n == 0 {
                    self.0.remove(name);
                }
            }
        }
    }
}

/// Each name of the node's images, once.
fn image_names(node: &Node) -> BTreeSet<&str> {
    node.status
        .as_ref()
        .and_then(|s| s.images.as_ref())
        .into_iter()
        .flatten()
        .flat_map(|image| image.names.iter().flatten())
        .map(String::as_str)
        .collect()
}

/// Gives each node of a [`ClusterState`] a small number of its own, and takes back those
/// of removed nodes for the next ones, so per-node tables stay as long as the cluster.
#[derive(Clone, Debug, Default)]
pub struct NodeSlots {
    /// One more than the highest slot ever given.
    end: u32,
    free: Vec<u32>,
}

impl NodeSlots {
    /// No slot.
    pub const NONE: u32 = u32::MAX;

    /// How long a table indexed by slot must be.
    pub fn end(&self) -> usize {
        self.end as usize
    }

    fn take(&mut self) -> u32 {
        self.free.pop().unwrap_or_else(|| {
            self.end += 1;
            self.end - 1
        })
    }

    fn give_back(&mut self, slot: u32) {
        if slot != Self::NONE {
            self.free.push(slot);
        }
    }
}

/// The storage objects the volume plugins read, by name (claims by namespace/name).
#[derive(Clone, Debug, Default)]
pub struct Volumes {
    pub persistent_volumes: BTreeMap<String, PersistentVolume>,
    pub claims: HashMap<ObjectKey, PersistentVolumeClaim>,
    pub storage_classes: BTreeMap<String, StorageClass>,
    pub csi_nodes: BTreeMap<String, CSINode>,
    pub csi_drivers: BTreeMap<String, CSIDriver>,
    pub volume_attachments: VolumeAttachments,
}

/// VolumeAttachments by name, and which are on each node: NodeVolumeLimits reads those of
/// one node at a time (as kube-scheduler indexes them by `spec.nodeName`), and a cluster
/// has many of them.
#[derive(Clone, Debug, Default)]
pub struct VolumeAttachments {
    by_name: BTreeMap<String, VolumeAttachment>,
    /// Node name → names of the attachments there.
    by_node: HashMap<String, BTreeSet<String>>,
}

impl VolumeAttachments {
    /// Add or replace an attachment (by name).
    pub fn upsert(&mut self, attachment: VolumeAttachment) {
        let name = name_of(&attachment.metadata).to_string();
        self.remove(&name);
        self.by_node
            .entry(attachment.spec.node_name.clone())
            .or_default()
            .insert(name.clone());
        self.by_name.insert(name, attachment);
    }

    pub fn remove(&mut self, name: &str) -> Option<VolumeAttachment> {
        let old = self.by_name.remove(name)?;
        if let Some(names) = self.by_node.get_mut(&old.spec.node_name) {
            names.remove(name);
            if names.is_empty() {
                self.by_node.remove(&old.spec.node_name);
            }
        }
        Some(old)
    }

    /// The attachments whose `spec.nodeName` is `node`.
    pub fn on_node<'a>(&'a self, node: &str) -> impl Iterator<Item = &'a VolumeAttachment> + 'a {
        self.by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|name| self.by_name.get(name))
    }

    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.by_name.keys()
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

/// The selectors of what selects pods, by namespace/name: all that PodTopologySpread's
/// default constraints need of Services, ReplicationControllers, ReplicaSets and
/// StatefulSets (kube-scheduler's `helper.DefaultSelector` reads them from its listers).
#[derive(Clone, Debug, Default)]
pub struct Workloads {
    /// `spec.selector` of the Services that have one (one without selects no pods).
    pub services: BTreeMap<ObjectKey, BTreeMap<String, String>>,
    /// `spec.selector` of each ReplicationController (empty when unset).
    pub replication_controllers: BTreeMap<ObjectKey, BTreeMap<String, String>>,
    /// `spec.selector` of each ReplicaSet, parsed; [`Selector::Nothing`] when it is
    /// missing or invalid (kube-scheduler then adds none of it).
    pub replica_sets: BTreeMap<ObjectKey, Selector>,
    /// The controller of each ReplicaSet that has one, `Kind/name` (its Deployment): a
    /// Deployment's pods of every revision share an owner (`crate::handoff`).
    pub replica_set_owners: BTreeMap<ObjectKey, String>,
    pub stateful_sets: BTreeMap<ObjectKey, Selector>,
}

impl Workloads {
    pub fn upsert_service(&mut self, service: &Service) {
        let key = ObjectKey::of(&service.metadata);
        match service.spec.as_ref().and_then(|s| s.selector.clone()) {
            Some(selector) => {
                self.services.insert(key, selector);
            }
            None => {
                self.services.remove(&key);
            }
        }
    }

    pub fn remove_service(&mut self, key: &ObjectKey) {
        self.services.remove(key);
    }

    pub fn upsert_replication_controller(&mut self, rc: &ReplicationController) {
        let selector = rc.spec.as_ref().and_then(|s| s.selector.clone());
        self.replication_controllers
            .insert(ObjectKey::of(&rc.metadata), selector.unwrap_or_default());
    }

    pub fn remove_replication_controller(&mut self, key: &ObjectKey) {
        self.replication_controllers.remove(key);
    }

    pub fn upsert_replica_set(&mut self, rs: &ReplicaSet) {
        let key = ObjectKey::of(&rs.metadata);
        self.replica_sets
            .insert(key.clone(), parsed(&rs.spec.selector));
        let controller = rs.metadata.owner_references.iter().flatten();
        match controller.into_iter().find(|o| o.controller == Some(true)) {
            Some(o) => {
                self.replica_set_owners
                    .insert(key, format!("{}/{}", o.kind, o.name));
            }
            None => {
                self.replica_set_owners.remove(&key);
            }
        }
    }

    pub fn remove_replica_set(&mut self, key: &ObjectKey) {
        self.replica_sets.remove(key);
        self.replica_set_owners.remove(key);
    }

    pub fn upsert_stateful_set(&mut self, ss: &StatefulSet) {
        self.stateful_sets
            .insert(ObjectKey::of(&ss.metadata), parsed(&ss.spec.selector));
    }

    pub fn remove_stateful_set(&mut self, key: &ObjectKey) {
        self.stateful_sets.remove(key);
    }

    /// The selectors of the Services in `namespace`.
    pub fn services_in<'a>(
        &'a self,
        namespace: &'a str,
    ) -> impl Iterator<Item = &'a BTreeMap<String, String>> + 'a {
        self.services
            .range(ObjectKey::new(namespace, "")..)
            .take_while(move |(k, _)| k.namespace == namespace)
            .map(|(_, s)| s)
    }
}

/// A selector an API object holds (a missing one is read as `{}`, which adds nothing as
/// upstream's nil adds nothing).
fn parsed(selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector) -> Selector {
    Selector::parse(Some(selector)).unwrap_or(Selector::Nothing)
}

impl ClusterState {
    pub fn new(input: ClusterInput) -> Self {
        let mut state = ClusterState {
            nodes: input
                .nodes
                .into_iter()
                .map(|n| {
                    (
                        n.metadata.name.clone().unwrap_or_default(),
                        NodeInfo::new(n),
                    )
                })
                .collect(),
            classes: input.classes,
            slices: input
                .slices
                .into_iter()
                .map(|s| Arc::new(s.into()))
                .collect(),
            taint_rules: input.taint_rules,
            namespaces: input
                .namespaces
                .into_iter()
                .map(|n| (name_of(&n.metadata).to_string(), n))
                .collect(),
            volumes: Volumes {
                persistent_volumes: by_name(input.persistent_volumes, |v| &v.metadata),
                claims: input
                    .persistent_volume_claims
                    .into_iter()
                    .map(|c| (ObjectKey::of(&c.metadata), c))
                    .collect(),
                storage_classes: by_name(input.storage_classes, |c| &c.metadata),
                csi_nodes: by_name(input.csi_nodes, |c| &c.metadata),
                csi_drivers: by_name(input.csi_drivers, |c| &c.metadata),
                volume_attachments: VolumeAttachments::default(),
            },
            ..Default::default()
        };
        // An informer's first list comes in name order: the tree takes the nodes so.
        for (name, info) in state.nodes.iter_mut() {
            info.slot = state.node_slots.take();
            state.image_spread.add(&info.node);
            state.node_tree.add(name, zone_key(&info.node));
        }
        for attachment in input.volume_attachments {
            state.volumes.volume_attachments.upsert(attachment);
        }
        for service in &input.services {
            state.workloads.upsert_service(service);
        }
        for rc in &input.replication_controllers {
            state.workloads.upsert_replication_controller(rc);
        }
        for rs in &input.replica_sets {
            state.workloads.upsert_replica_set(rs);
        }
        for ss in &input.stateful_sets {
            state.workloads.upsert_stateful_set(ss);
        }
        for claim in input.claims {
            state
                .claims
                .insert(ObjectKey::of(&claim.metadata), Arc::new(claim));
        }
        for pod in input.pods {
            state.upsert_pod(pod);
        }
        state
    }

    /// Add or replace a pod, keeping node usage right.
    /// The pod called `key`, if known.
    pub fn pod(&self, key: &ObjectKey) -> Option<&Pod> {
        self.pods.get(key).map(Arc::as_ref)
    }

    /// The ResourceClaim called `key`, if known.
    pub fn claim(&self, key: &ObjectKey) -> Option<&ResourceClaim> {
        self.claims.get(key).map(Arc::as_ref)
    }

    pub fn upsert_pod(&mut self, pod: Pod) {
        let key = ObjectKey::of(&pod.metadata);
        if let Some(old) = self.pods.remove(&key) {
            self.unaccount(&old);
        }
        if let Some(node) = bound_node(&pod).map(str::to_string)
            && !is_terminal(&pod)
            && let Some(info) = self.nodes.get_mut(&node)
        {
            info.add_pod(&pod);
            note_affinity_pods(&mut self.nodes_with_affinity_pods, info);
        }
        self.pods.insert(key, Arc::new(pod));
    }

    pub fn remove_pod(&mut self, key: &ObjectKey) -> Option<Arc<Pod>> {
        let old = self.pods.remove(key)?;
        self.unaccount(&old);
        Some(old)
    }

    fn unaccount(&mut self, pod: &Pod) {
        if let Some(node) = bound_node(pod)
            && !is_terminal(pod)
            && let Some(info) = self.nodes.get_mut(node)
        {
            info.remove_pod(pod);
            note_affinity_pods(&mut self.nodes_with_affinity_pods, info);
        }
    }
}

/// Keep `nodes` (the names of nodes with pods with affinity) right for `info`.
fn note_affinity_pods(nodes: &mut BTreeSet<String>, info: &NodeInfo) {
    if info.pods_with_affinity.is_empty() {
        nodes.remove(info.name());
    } else if !nodes.contains(info.name()) {
        nodes.insert(info.name().to_string());
    }
}

fn by_name<T>(
    objects: Vec<T>,
    meta: impl Fn(&T) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> BTreeMap<String, T> {
    objects
        .into_iter()
        .map(|o| (name_of(meta(&o)).to_string(), o))
        .collect()
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

/// Replace the object with the same name in `list`, or add it.
fn upsert_named<T>(
    list: &mut Vec<T>,
    object: T,
    meta: impl Fn(&T) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) {
    let name = name_of(meta(&object)).to_string();
    match list.iter_mut().find(|o| name_of(meta(o)) == name) {
        Some(slot) => *slot = object,
        None => list.push(object),
    }
}

/// Incremental updates, as an informer delivers them. Callers that hold an allocator
/// snapshot must rebuild it afterwards ([`crate::Engine::state_mut`] does).
impl ClusterState {
    /// Add or replace a node, keeping what its bound pods use.
    /// Add or replace a node. An update keeps what its pods use (kubelets update their
    /// Node often; recounting every pod each time would not scale).
    pub fn upsert_node(&mut self, node: Node) {
        let name = name_of(&node.metadata).to_string();
        if let Some(info) = self.nodes.get_mut(&name) {
            let fresh = NodeInfo::new(node);
            self.image_spread.remove(&info.node);
            self.image_spread.add(&fresh.node);
            info.node = fresh.node;
            info.allocatable = fresh.allocatable;
            info.allocatable_units = fresh.allocatable_units;
            info.allowed_pods = fresh.allowed_pods;
            info.broken = fresh.broken;
            info.object_version = fresh.object_version;
            self.node_tree.update(&name, zone_key(&info.node));
            return;
        }
        let mut info = NodeInfo::new(node);
        info.slot = self.node_slots.take();
        self.image_spread.add(&info.node);
        for pod in self.pods.values() {
            if bound_node(pod) == Some(name.as_str()) && !is_terminal(pod) {
                info.add_pod(pod);
            }
        }
        note_affinity_pods(&mut self.nodes_with_affinity_pods, &info);
        self.node_tree.add(&name, zone_key(&info.node));
        self.forget_node_order();
        self.nodes.insert(name, info);
    }

    pub fn remove_node(&mut self, name: &str) {
        if let Some(info) = self.nodes.remove(name) {
            self.node_slots.give_back(info.slot);
            self.image_spread.remove(&info.node);
            self.nodes_with_affinity_pods.remove(name);
        }
        self.node_tree.remove(name);
        self.forget_node_order();
    }

    fn forget_node_order(&mut self) {
        if let Some(order) = self.node_order.take() {
            self.last_node_order = Some(order);
        }
    }

    /// Every node in the order a scheduling cycle examines them: kube-scheduler's node
    /// tree ([`NodeTree::list`]), then any node put in `nodes` by hand, by name.
    ///
    /// As kube-scheduler's snapshot, the order is made again only when the set of nodes
    /// is not the last cycle's: a node that only changed zone, or went and came back in
    /// between, keeps its place until some other node comes or goes.
    pub fn nodes_in_order(&self) -> Vec<&NodeInfo> {
        let order = self.node_order.get_or_init(|| match &self.last_node_order {
            Some(last)
                if last.names.len() == self.nodes.len()
                    && last.names.iter().all(|n| self.nodes.contains_key(n)) =>
            {
                last.clone()
            }
            _ => Arc::new(self.node_order_now()),
        });
        let by_name: Vec<&NodeInfo> = self.nodes.values().collect();
        let positions = if order.positions.len() == by_name.len() {
            order.positions.as_slice()
        } else {
            // `nodes` was changed by hand, not through upsert_node or remove_node.
            &self.node_order_now().positions
        };
        positions.iter().map(|&i| by_name[i as usize]).collect()
    }

    fn node_order_now(&self) -> NodeOrder {
        let position: HashMap<&str, u32> = self
            .nodes
            .keys()
            .enumerate()
            .map(|(i, name)| (name.as_str(), i as u32))
            .collect();
        let mut positions: Vec<u32> = self
            .node_tree
            .list()
            .iter()
            .filter_map(|name| position.get(name).copied())
            .collect();
        if positions.len() < self.nodes.len() {
            let mut taken = vec![false; self.nodes.len()];
            for &i in &positions {
                taken[i as usize] = true;
            }
            positions.extend((0..self.nodes.len() as u32).filter(|&i| !taken[i as usize]));
        }
        let names: Vec<&String> = self.nodes.keys().collect();
        NodeOrder {
            names: positions
                .iter()
                .map(|&i| names[i as usize].clone())
                .collect(),
            positions,
        }
    }

    /// Add or replace a claim, unless the state already holds a newer version of it: a
    /// watch event that was sent before our own write landed must not undo that write (as
    /// kube-scheduler's assume cache, resourceVersions compared as numbers). Returns whether
    /// the claim was taken.
    pub fn upsert_claim(&mut self, claim: ResourceClaim) -> bool {
        let key = ObjectKey::of(&claim.metadata);
        if let Some(old) = self.claims.get(&key)
            && is_older(&claim.metadata, &old.metadata)
        {
            return false;
        }
        self.claims.insert(key, Arc::new(claim));
        true
    }

    pub fn remove_claim(&mut self, key: &ObjectKey) {
        self.claims.remove(key);
    }

    pub fn upsert_class(&mut self, class: DeviceClass) {
        upsert_named(&mut self.classes, class, |c| &c.metadata);
    }

    pub fn remove_class(&mut self, name: &str) {
        self.classes.retain(|c| name_of(&c.metadata) != name);
    }

    pub fn upsert_slice(&mut self, slice: ResourceSlice) {
        upsert_named(&mut self.slices, Arc::new(slice.into()), |s| &s.metadata);
    }

    pub fn remove_slice(&mut self, name: &str) {
        self.slices.retain(|s| name_of(&s.metadata) != name);
    }

    pub fn upsert_taint_rule(&mut self, rule: DeviceTaintRule) {
        upsert_named(&mut self.taint_rules, rule, |r| &r.metadata);
    }

    pub fn remove_taint_rule(&mut self, name: &str) {
        self.taint_rules.retain(|r| name_of(&r.metadata) != name);
    }
}

/// Whether `new` is an older version of the object than `old` (same uid, a smaller
/// resourceVersion). Versions that are not numbers are never called older.
fn is_older(
    new: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    old: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> bool {
    let version = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        m.resource_version.as_deref()?.parse::<u64>().ok()
    };
    new.uid == old.uid && matches!((version(new), version(old)), (Some(n), Some(o)) if n < o)
}

#[cfg(test)]
mod claim_versions {
    use super::*;

    fn claim(version: &str, allocated: bool) -> ResourceClaim {
        let status = allocated.then(|| {
            serde_json::json!({"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "d", "pool": "p", "device": "gpu-0"}]}}})
        });
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "default", "uid": "u1", "resourceVersion": version},
            "spec": {}, "status": status}))
        .unwrap()
    }

    #[test]
    fn a_late_event_does_not_undo_a_newer_write() {
        let mut state = ClusterState::new(ClusterInput::default());
        assert!(
            state.upsert_claim(claim("120", true)),
            "our write, as returned"
        );
        assert!(
            !state.upsert_claim(claim("99", false)),
            "the event from before it"
        );
        let key = ObjectKey::new("default", "c");
        assert!(state.claims[&key].status.is_some(), "still allocated");
        assert!(
            state.upsert_claim(claim("121", false)),
            "a newer version wins"
        );
        assert!(state.claims[&key].status.is_none());
        assert!(state.upsert_claim(claim("", true)), "no version: taken");
    }
}

#[cfg(test)]
mod volume_attachments {
    use super::*;

    fn attachment(name: &str, node: &str) -> VolumeAttachment {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"attacher": "d", "nodeName": node, "source": {"persistentVolumeName": "pv"}}}))
        .unwrap()
    }

    fn on(attachments: &VolumeAttachments, node: &str) -> Vec<String> {
        attachments
            .on_node(node)
            .map(|a| name_of(&a.metadata).to_string())
            .collect()
    }

    #[test]
    fn an_attachment_updated_to_another_node_is_only_there() {
        let mut attachments = VolumeAttachments::default();
        attachments.upsert(attachment("a", "n1"));
        attachments.upsert(attachment("b", "n1"));
        attachments.upsert(attachment("a", "n2"));
        assert_eq!(on(&attachments, "n1"), ["b"]);
        assert_eq!(on(&attachments, "n2"), ["a"]);
        assert!(attachments.remove("b").is_some());
        assert!(on(&attachments, "n1").is_empty());
        assert_eq!(attachments.len(), 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, priority: Option<i32>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [], "priority": priority, "nodeName": "n1"},
        }))
        .expect("a pod")
    }

    fn node() -> NodeInfo {
        NodeInfo::new(
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n1"}}))
                .expect("a node"),
        )
    }

    /// A node with images, each a list of names.
    fn with_images(name: &str, images: &[&[&str]]) -> Node {
        let images: Vec<_> = images
            .iter()
            .map(|names| serde_json::json!({"names": names, "sizeBytes": 100}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name}, "status": {"images": images}}))
        .expect("a node")
    }

    #[test]
    fn a_node_put_in_the_map_by_hand_is_examined_last_not_lost() {
        let mut state = ClusterState::new(ClusterInput {
            nodes: vec![with_images("b", &[]), with_images("c", &[])],
            ..Default::default()
        });
        let names = |s: &ClusterState| -> Vec<String> {
            s.nodes_in_order()
                .iter()
                .map(|n| n.name().to_string())
                .collect()
        };
        assert_eq!(names(&state), ["b", "c"]);
        state
            .nodes
            .insert("a".into(), NodeInfo::new(with_images("a", &[])));
        assert_eq!(names(&state), ["b", "c", "a"]);
        state.upsert_node(with_images("d", &[]));
        assert_eq!(names(&state), ["b", "c", "d", "a"]);
    }

    #[test]
    fn image_spread_counts_each_node_once_as_nodes_change_and_go() {
        let mut state = ClusterState::new(ClusterInput {
            nodes: vec![
                with_images("a", &[&["x:1", "docker.io/x:1"], &["x:1"]]),
                with_images("b", &[&["x:1"], &["y:2"]]),
            ],
            ..Default::default()
        });
        let spread = |s: &ClusterState, image| s.image_spread.nodes_with(image);
        assert_eq!(spread(&state, "x:1"), 2, "listed twice on a, counted once");
        assert_eq!(spread(&state, "docker.io/x:1"), 1);
        assert_eq!(spread(&state, "y:2"), 1);
        // b's images change: y:2 goes, z:3 comes.
        state.upsert_node(with_images("b", &[&["x:1"], &["z:3"]]));
        assert_eq!(
            (
                spread(&state, "x:1"),
                spread(&state, "y:2"),
                spread(&state, "z:3")
            ),
            (2, 0, 1)
        );
        state.remove_node("a");
        state.upsert_node(with_images("c", &[&["z:3"]]));
        assert_eq!(
            (
                spread(&state, "x:1"),
                spread(&state, "docker.io/x:1"),
                spread(&state, "z:3")
            ),
            (1, 0, 2)
        );
    }

    #[test]
    fn the_nodes_with_affinity_pods_follow_the_pods_bound_and_the_nodes_removed() {
        let on = |name: &str, node: &str, affinity: bool| -> Pod {
            let affinity = affinity.then(|| {
                serde_json::json!({"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "kubernetes.io/hostname",
                     "labelSelector": {"matchLabels": {"app": "x"}}}]}})
            });
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"containers": [], "nodeName": node, "affinity": affinity}}))
            .expect("a pod")
        };
        let mut state = ClusterState::new(ClusterInput {
            nodes: vec![with_images("n1", &[]), with_images("n2", &[])],
            pods: vec![on("plain", "n1", false), on("anti-1", "n2", true)],
            ..Default::default()
        });
        let names = |s: &ClusterState| {
            s.nodes_with_affinity_pods
                .iter()
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&state), ["n2"]);
        state.upsert_pod(on("anti-2", "n1", true));
        assert_eq!(names(&state), ["n1", "n2"]);
        state.remove_pod(&ObjectKey::new("default", "anti-2"));
        assert_eq!(names(&state), ["n2"]);
        state.remove_node("n2");
        assert_eq!(names(&state), Vec::<String>::new());
        // Its pod is still known: the node coming back brings it back.
        state.upsert_node(with_images("n2", &[]));
        assert_eq!(names(&state), ["n2"]);
    }

    #[test]
    fn each_node_has_its_own_slot_and_a_new_node_takes_a_removed_ones() {
        let named = |name: &str| -> Node {
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("a node")
        };
        let mut state = ClusterState::new(ClusterInput {
            nodes: vec![named("b"), named("a"), named("c")],
            ..Default::default()
        });
        let slots = |s: &ClusterState| -> Vec<(String, u32)> {
            s.nodes.iter().map(|(n, i)| (n.clone(), i.slot)).collect()
        };
        // In the order nodes are scanned (by name).
        assert_eq!(
            slots(&state),
            [("a".into(), 0), ("b".into(), 1), ("c".into(), 2)]
        );
        assert_eq!(state.node_slots.end(), 3);
        state.remove_node("b");
        state.upsert_node(named("d"));
        state.upsert_node(named("a"));
        state.upsert_node(named("e"));
        assert_eq!(
            slots(&state),
            [
                ("a".into(), 0),
                ("c".into(), 2),
                ("d".into(), 1),
                ("e".into(), 3)
            ]
        );
        assert_eq!(state.node_slots.end(), 4);
    }

    #[test]
    fn lowest_priority_follows_the_pods_bound_and_removed() {
        let mut n = node();
        assert_eq!(n.lowest_priority(), None);
        let (high, low_a, low_b) = (
            pod("high", Some(5)),
            pod("low-a", Some(-1)),
            pod("low-b", Some(-1)),
        );
        n.add_pod(&high);
        n.add_pod(&low_a);
        n.add_pod(&low_b);
        n.add_pod(&low_b); // counted once, as in pod_keys
        assert_eq!(n.lowest_priority(), Some(-1));
        n.remove_pod(&low_a);
        assert_eq!(n.lowest_priority(), Some(-1));
        n.remove_pod(&low_b);
        assert_eq!(n.lowest_priority(), Some(5));
        n.remove_pod(&low_b); // not here any more: nothing changes
        n.remove_pod(&pod("never-bound", None));
        assert_eq!(n.lowest_priority(), Some(5));
        n.add_pod(&pod("unset", None));
        assert_eq!(n.lowest_priority(), Some(0));
    }
}
