//! A seeded generator of small random clusters and pending pods, one feature family at a
//! time, in the JSON shape `schedref` reads (objects as the API server stores them: ports
//! with a protocol, bound claims with their bind-completed annotation, pod affinity
//! selectors with matchLabelKeys already merged in).
//!
//! The numbers are small on purpose (2 to 8 nodes, a few pods each, 1 to 3 zones, a handful
//! of labels) so that most constraints decide something: about half of the pods are
//! infeasible on some node.

use serde::Serialize;
use serde_json::{Value, json};

/// A group of scheduler features, so that the suite can be run for the plugins that exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// NodeName, NodeUnschedulable, TaintToleration, NodeAffinity, NodePorts,
    /// NodeResourcesFit, NodeResourcesBalancedAllocation.
    Core,
    /// InterPodAffinity: required and preferred affinity and anti-affinity.
    InterPod,
    /// PodTopologySpread.
    Spread,
    /// VolumeBinding, VolumeRestrictions, VolumeZone, NodeVolumeLimits.
    Volumes,
    /// ImageLocality.
    Images,
    /// Everything at once.
    Mixed,
    /// Core, inter-pod, spread and image features under a random KubeSchedulerConfiguration
    /// profile: NodeResourcesFit strategies, score weights, disabled scores, plugin args.
    Config,
    /// DynamicResources: pods with ResourceClaims on nodes with devices.
    Dra,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Core => "core",
            Family::InterPod => "interpod",
            Family::Spread => "spread",
            Family::Volumes => "volumes",
            Family::Images => "images",
            Family::Mixed => "mixed",
            Family::Config => "config",
            Family::Dra => "dra",
        }
    }

    fn core(self) -> bool {
        matches!(self, Family::Config | Family::Core | Family::Mixed)
    }
    fn interpod(self) -> bool {
        matches!(self, Family::Config | Family::InterPod | Family::Mixed)
    }
    fn spread(self) -> bool {
        matches!(self, Family::Config | Family::Spread | Family::Mixed)
    }
    fn volumes(self) -> bool {
        matches!(self, Family::Volumes | Family::Mixed)
    }
    fn dra(self) -> bool {
        matches!(self, Family::Dra | Family::Mixed)
    }
    fn images(self) -> bool {
        matches!(self, Family::Config | Family::Images | Family::Mixed)
    }
}

/// splitmix64: small, seeded, reproducible.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
    /// A few distinct items, in their original order.
    pub fn some<T: Clone>(&mut self, items: &[T], lo: usize, hi: usize) -> Vec<T> {
        let want = self.range(lo, hi.min(items.len()));
        let mut chosen: Vec<usize> = Vec::new();
        while chosen.len() < want {
            let i = self.below(items.len());
            if !chosen.contains(&i) {
                chosen.push(i);
            }
        }
        chosen.sort();
        chosen.into_iter().map(|i| items[i].clone()).collect()
    }
}

/// One cluster and the pods to evaluate on it, in the JSON shape `schedref` reads.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Case {
    pub nodes: Vec<Value>,
    pub pods: Vec<Value>,
    pub pending: Vec<String>,
    pub namespaces: Vec<Value>,
    pub persistent_volumes: Vec<Value>,
    pub persistent_volume_claims: Vec<Value>,
    pub storage_classes: Vec<Value>,
    pub csi_nodes: Vec<Value>,
    pub csi_drivers: Vec<Value>,
    /// Volumes attached to nodes, which NodeVolumeLimits counts toward the CSINode limits.
    pub volume_attachments: Vec<Value>,
    pub resource_claims: Vec<Value>,
    pub device_classes: Vec<Value>,
    pub resource_slices: Vec<Value>,
    /// What selects pods, for PodTopologySpread's default constraints.
    pub services: Vec<Value>,
    pub replication_controllers: Vec<Value>,
    pub replica_sets: Vec<Value>,
    pub stateful_sets: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
}

pub const ZONE: &str = "topology.kubernetes.io/zone";
pub const HOSTNAME: &str = "kubernetes.io/hostname";
const CSI: &str = "csi.example.com";
const GPU: &str = "gpu.example.com";
const NAMESPACES: [&str; 3] = ["default", "team-a", "team-b"];
const APPS: [&str; 3] = ["web", "db", "cache"];
const TIERS: [&str; 2] = ["front", "back"];
/// Images with their sizes; "busybox" has no tag, so it is "busybox:latest" on nodes.
const IMAGES: [(&str, &[&str], u64); 5] = [
    (
        "nginx:1.25",
        &["docker.io/library/nginx:1.25", "nginx:1.25"],
        150 << 20,
    ),
    ("redis:7", &["docker.io/library/redis:7"], 110 << 20),
    ("busybox", &["docker.io/library/busybox:latest"], 4 << 20),
    (
        "registry.example.com/ml/trainer:v2",
        &["registry.example.com/ml/trainer:v2"],
        900 << 20,
    ),
    (
        "postgres:16",
        &["docker.io/library/postgres:16", "postgres:16"],
        400 << 20,
    ),
];

struct Gen<'a> {
    rng: &'a mut Rng,
    family: Family,
    zones: Vec<String>,
    node_names: Vec<String>,
    case: Case,
}

/// A case of `family` from `seed`.
pub fn generate(family: Family, seed: u64) -> Case {
    let mut rng = Rng::new(seed ^ (family as u64) << 56);
    let zone_count = rng.range(1, 3);
    let mut g = Gen {
        zones: (0..zone_count)
            .map(|i| format!("zone-{}", ["a", "b", "c"][i]))
            .collect(),
        rng: &mut rng,
        family,
        node_names: Vec::new(),
        case: Case::default(),
    };
    g.namespaces();
    g.nodes();
    if family.volumes() {
        g.storage();
    }
    if family.dra() {
        g.devices();
    }
    g.existing_pods();
    if family == Family::Config {
        g.case.config = Some(config(g.rng));
    }
    let pending = g.rng.range(1, 3);
    for i in 0..pending {
        g.pending_pod(i);
    }
    // Last, so that the cases drawn before are unchanged by it.
    if family.spread() {
        g.workloads();
    }
    if family.volumes() {
        g.volume_attachments();
    }
    g.case
}

impl Gen<'_> {
    /// A constraint's chance: halved when every family's constraints come together, so that
    /// not every pod is unschedulable.
    fn bites(&mut self, percent: u64) -> bool {
        let percent = if matches!(self.family, Family::Mixed | Family::Config) {
            percent / 2
        } else {
            percent
        };
        self.rng.chance(percent)
    }

    fn namespaces(&mut self) {
        for (name, labels) in [
            ("default", json!({})),
            ("team-a", json!({"team": "a", "env": "prod"})),
            ("team-b", json!({"team": "b", "env": "dev"})),
        ] {
            let mut labels = labels;
            labels["kubernetes.io/metadata.name"] = json!(name);
            self.case
                .namespaces
                .push(json!({"metadata": {"name": name, "labels": labels}}));
        }
    }

    fn nodes(&mut self) {
        let count = self.rng.range(2, 8);
        for i in 0..count {
            let name = format!("n{}", i + 1);
            let mut labels = json!({HOSTNAME: name, "kubernetes.io/os": "linux"});
            // A node without a zone label: spreading and zonal volumes leave it out.
            let zoneless = (self.family.spread() || self.family.volumes()) && self.rng.chance(8);
            if !zoneless {
                labels[ZONE] = json!(self.rng.pick(&self.zones).clone());
            }
            if self.rng.chance(70) {
                labels["disk"] = json!(self.rng.pick(&["ssd", "hdd"]));
            }
            if self.rng.chance(50) {
                labels["tier"] = json!(self.rng.range(1, 5).to_string());
            }
            if self.rng.chance(25) {
                labels["gpu"] = json!("true");
            }
            let cpu = *self.rng.pick(&["1", "2", "4", "3500m"]);
            let memory = *self.rng.pick(&["1Gi", "2Gi", "4Gi", "3000Mi"]);
            let pods = self.rng.range(2, 6).to_string();
            let mut allocatable = json!({"cpu": cpu, "memory": memory, "pods": pods});
            if self.family.core() && self.rng.chance(50) {
                allocatable["ephemeral-storage"] = json!("10Gi");
            }
            if self.family.core() && self.rng.chance(20) {
                allocatable["example.com/widget"] = json!("2");
            }
            let mut spec = json!({});
            let mut taints = Vec::new();
            if self.family.core() || self.family.spread() {
                if self.rng.chance(25) {
                    taints.push(json!({"key": "dedicated", "value": self.rng.pick(&["gpu", "db"]), "effect": "NoSchedule"}));
                }
                if self.family.core() && self.rng.chance(20) {
                    taints.push(
                        json!({"key": "spot", "value": "true", "effect": "PreferNoSchedule"}),
                    );
                }
                if self.family.core() && self.rng.chance(10) {
                    taints.push(json!({"key": "maint", "effect": "NoExecute"}));
                }
                if self.family.core() && self.rng.chance(12) {
                    spec["unschedulable"] = json!(true);
                    if self.rng.chance(50) {
                        taints.push(json!({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}));
                    }
                }
            }
            if !taints.is_empty() {
                spec["taints"] = json!(taints);
            }
            let mut status = json!({"allocatable": allocatable, "capacity": allocatable});
            if self.family.images() {
                let images: Vec<Value> = self
                    .rng
                    .some(&IMAGES, 0, 4)
                    .into_iter()
                    .map(|(_, names, size)| json!({"names": names, "sizeBytes": size}))
                    .collect();
                status["images"] = json!(images);
            }
            self.case.nodes.push(json!({
                "metadata": {"name": name, "uid": format!("uid-node-{name}"), "labels": labels},
                "spec": spec,
                "status": status,
            }));
            self.node_names.push(name);
        }
    }

    /// StorageClasses, the CSI driver, CSINodes, PersistentVolumes and claims.
    fn storage(&mut self) {
        let zone = self.rng.pick(&self.zones).clone();
        let mut zonal = json!({
            "metadata": {"name": "zonal"}, "provisioner": CSI,
            "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Delete",
        });
        if self.rng.chance(60) {
            zonal["allowedTopologies"] =
                json!([{"matchLabelExpressions": [{"key": ZONE, "values": [zone]}]}]);
        }
        self.case.storage_classes.extend([
            json!({"metadata": {"name": "local"}, "provisioner": "kubernetes.io/no-provisioner",
                   "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Delete"}),
            zonal,
            json!({"metadata": {"name": "standard"}, "provisioner": CSI,
                   "volumeBindingMode": "Immediate", "reclaimPolicy": "Delete"}),
        ]);
        self.case.csi_drivers.push(json!({
            "metadata": {"name": CSI},
            "spec": {"attachRequired": true, "podInfoOnMount": false, "storageCapacity": false,
                     "requiresRepublish": false, "volumeLifecycleModes": ["Persistent"],
                     "fsGroupPolicy": "ReadWriteOnceWithFSType", "seLinuxMount": false},
        }));
        for name in self.node_names.clone() {
            if self.rng.chance(85) {
                let mut driver = json!({"name": CSI, "nodeID": format!("id-{name}")});
                if self.rng.chance(60) {
                    driver["topologyKeys"] = json!([ZONE]);
                }
                if self.rng.chance(60) {
                    driver["allocatable"] = json!({"count": self.rng.range(0, 2)});
                }
                self.case.csi_nodes.push(json!({
                    "metadata": {"name": name},
                    "spec": {"drivers": [driver]},
                }));
            }
        }
        // Local PVs on single nodes, zonal CSI PVs; some bound to claims below.
        let pv_count = self.rng.range(1, 5);
        for i in 0..pv_count {
            let name = format!("pv{i}");
            let size = format!("{}Gi", self.rng.pick(&[1, 2, 5, 10]));
            let mode = if self.rng.chance(15) {
                "ReadWriteOncePod"
            } else {
                "ReadWriteOnce"
            };
            let mut pv = json!({
                "metadata": {"name": name, "uid": format!("uid-pv-{name}")},
                "spec": {"capacity": {"storage": size}, "accessModes": [mode],
                         "persistentVolumeReclaimPolicy": "Delete", "volumeMode": "Filesystem"},
                "status": {"phase": "Available"},
            });
            if self.rng.chance(55) {
                let node = self.rng.pick(&self.node_names).clone();
                pv["spec"]["storageClassName"] = json!("local");
                pv["spec"]["local"] = json!({"path": format!("/mnt/disk{i}")});
                pv["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": [node]}]}]}});
            } else {
                let zone = self.rng.pick(&self.zones).clone();
                pv["spec"]["storageClassName"] = json!(*self.rng.pick(&["zonal", "standard"]));
                pv["spec"]["csi"] = json!({"driver": CSI, "volumeHandle": format!("vol-{i}")});
                if self.rng.chance(70) {
                    pv["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": ZONE, "operator": "In", "values": [zone]}]}]}});
                }
                if self.rng.chance(70) {
                    // VolumeZone reads the zone from the PV's labels.
                    pv["metadata"]["labels"] = json!({ZONE: zone});
                }
            }
            self.case.persistent_volumes.push(pv);
        }
        // Claims: some bound to those PVs, some waiting for a first consumer, some
        // Immediate and not bound yet.
        let mut free_pvs: Vec<usize> = (0..self.case.persistent_volumes.len()).collect();
        let claim_count = self.rng.range(1, 5);
        for i in 0..claim_count {
            let namespace = *self.rng.pick(&NAMESPACES);
            let name = format!("data{i}");
            let mode = if self.rng.chance(20) {
                "ReadWriteOncePod"
            } else {
                "ReadWriteOnce"
            };
            let mut pvc = json!({
                "metadata": {"name": name, "namespace": namespace,
                             "uid": format!("uid-pvc-{namespace}-{name}")},
                "spec": {"accessModes": [mode], "volumeMode": "Filesystem",
                         "resources": {"requests": {"storage": format!("{}Gi", self.rng.pick(&[1, 2, 5]))}}},
                "status": {"phase": "Pending"},
            });
            if !free_pvs.is_empty() && self.rng.chance(40) {
                let pv_index = free_pvs.remove(self.rng.below(free_pvs.len()));
                let pv = &mut self.case.persistent_volumes[pv_index];
                let pv_name = pv["metadata"]["name"].clone();
                pvc["spec"]["volumeName"] = pv_name;
                pvc["spec"]["storageClassName"] = pv["spec"]["storageClassName"].clone();
                pvc["spec"]["accessModes"] = pv["spec"]["accessModes"].clone();
                pvc["metadata"]["annotations"] = json!({"pv.kubernetes.io/bind-completed": "yes"});
                pvc["status"] = json!({"phase": "Bound", "accessModes": pv["spec"]["accessModes"],
                                       "capacity": pv["spec"]["capacity"]});
                pv["spec"]["claimRef"] = json!({"kind": "PersistentVolumeClaim", "namespace": namespace,
                    "name": name, "uid": format!("uid-pvc-{namespace}-{name}"), "apiVersion": "v1"});
                pv["status"]["phase"] = json!("Bound");
            } else {
                // An Immediate claim not bound yet makes the pod wait everywhere: rarer.
                let class = *self
                    .rng
                    .pick(&["local", "zonal", "local", "zonal", "local", "standard"]);
                pvc["spec"]["storageClassName"] = json!(class);
            }
            self.case.persistent_volume_claims.push(pvc);
        }
    }

    fn claims_in(&self, namespace: &str) -> Vec<String> {
        self.case
            .persistent_volume_claims
            .iter()
            .filter(|c| c["metadata"]["namespace"] == namespace)
            .map(|c| c["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    }

    fn labels(&mut self) -> Value {
        let mut labels = json!({});
        if self.rng.chance(90) {
            labels["app"] = json!(*self.rng.pick(&APPS));
        }
        if self.rng.chance(50) {
            labels["tier"] = json!(*self.rng.pick(&TIERS));
        }
        if self.rng.chance(30) {
            labels["version"] = json!(*self.rng.pick(&["v1", "v2"]));
        }
        labels
    }

    fn requests(&mut self, big: bool) -> Value {
        let mut requests = json!({});
        if self.rng.chance(85) {
            let max = if big { 12 } else { 8 };
            requests["cpu"] = json!(format!("{}m", 100 * self.rng.range(1, max)));
        }
        if self.rng.chance(75) {
            let max = if big { 10 } else { 8 };
            requests["memory"] = json!(format!("{}Mi", 128 * self.rng.range(1, max)));
        }
        if self.family.core() && self.rng.chance(6) {
            requests["ephemeral-storage"] = json!("2Gi");
        }
        if self.family.core() && self.rng.chance(6) {
            requests["example.com/widget"] = json!("1");
        }
        requests
    }

    fn container(&mut self, name: &str, big: bool) -> Value {
        let image = if self.family.images() {
            self.rng.pick(&IMAGES).0
        } else {
            "registry.example.com/app:v1"
        };
        let requests = self.requests(big);
        json!({"name": name, "image": image, "resources": {"requests": requests}})
    }

    fn existing_pods(&mut self) {
        for (n, node) in self.node_names.clone().into_iter().enumerate() {
            for j in 0..self.rng.range(0, 2) {
                let namespace = *self.rng.pick(&NAMESPACES);
                let name = format!("e{n}-{j}");
                let labels = self.labels();
                let mut container = self.container("c", false);
                if self.family.core() && self.rng.chance(20) {
                    container["ports"] = json!([self.host_port()]);
                }
                let mut spec = json!({"nodeName": node, "containers": [container],
                                      "schedulerName": "default-scheduler"});
                if self.family.interpod() {
                    let mut affinity = json!({});
                    if self.rng.chance(30) {
                        affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] =
                            json!([self.pod_term(&labels, false)]);
                    }
                    if self.rng.chance(20) {
                        let kind = *self.rng.pick(&["podAffinity", "podAntiAffinity"]);
                        let term = self.pod_term(&labels, false);
                        affinity[kind]["preferredDuringSchedulingIgnoredDuringExecution"] =
                            json!([{"weight": self.rng.range(1, 100), "podAffinityTerm": term}]);
                    }
                    if self.rng.chance(10) {
                        affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] =
                            json!([self.pod_term(&labels, false)]);
                    }
                    if affinity != json!({}) {
                        spec["affinity"] = affinity;
                    }
                }
                if self.family.volumes() && self.rng.chance(40) {
                    let claims = self.claims_in(namespace);
                    if !claims.is_empty() {
                        let claim = self.rng.pick(&claims).clone();
                        spec["volumes"] =
                            json!([{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]);
                    }
                }
                if self.family.volumes() && self.rng.chance(15) {
                    let disk = *self.rng.pick(&["disk-1", "disk-2"]);
                    let volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
                    let mut volumes = volumes;
                    volumes.push(json!({"name": "pd", "gcePersistentDisk": {"pdName": disk, "readOnly": self.rng.chance(50)}}));
                    spec["volumes"] = json!(volumes);
                }
                if self.family.dra() && self.rng.chance(50) {
                    self.allocated_claim(namespace, &name, &node, &mut spec);
                }
                self.case.pods.push(json!({
                    "metadata": {"name": name, "namespace": namespace, "labels": labels,
                                 "uid": format!("uid-pod-{namespace}-{name}")},
                    "spec": spec,
                    "status": {"phase": "Running"},
                }));
            }
        }
    }

    fn host_port(&mut self) -> Value {
        let port = *self.rng.pick(&[80, 443, 8080]);
        let mut p = json!({"containerPort": 8080, "hostPort": port,
                           "protocol": *self.rng.pick(&["TCP", "TCP", "UDP"])});
        if self.rng.chance(30) {
            p["hostIP"] = json!(*self.rng.pick(&["127.0.0.1", "0.0.0.0", "10.0.0.1"]));
        }
        p
    }

    /// A pod (anti-)affinity term. `own` is the pod's labels, for matchLabelKeys and
    /// mismatchLabelKeys, which the API server merges into the selector when it stores the
    /// pod; the term is written as it is stored.
    fn pod_term(&mut self, own: &Value, keys: bool) -> Value {
        let mut selector = json!({});
        match self.rng.below(4) {
            0 | 1 => selector["matchLabels"] = json!({"app": *self.rng.pick(&APPS)}),
            2 => {
                selector["matchExpressions"] = json!([{"key": "app", "operator": "In",
                    "values": self.rng.some(&APPS, 1, 2)}])
            }
            _ => {
                selector["matchExpressions"] = json!([{"key": "tier",
                    "operator": *self.rng.pick(&["Exists", "DoesNotExist", "NotIn"]),
                }]);
                if selector["matchExpressions"][0]["operator"] == "NotIn" {
                    selector["matchExpressions"][0]["values"] = json!(["front"]);
                }
            }
        }
        let topology = if self.rng.chance(55) { HOSTNAME } else { ZONE };
        let mut term = json!({"labelSelector": selector, "topologyKey": topology});
        match self.rng.below(5) {
            0 => term["namespaces"] = json!(self.rng.some(&NAMESPACES, 1, 2)),
            1 => term["namespaceSelector"] = json!({}),
            2 => {
                term["namespaceSelector"] =
                    json!({"matchLabels": {"team": *self.rng.pick(&["a", "b"])}})
            }
            _ => {}
        }
        if keys && self.rng.chance(25) {
            let (field, operator) = if self.rng.chance(50) {
                ("matchLabelKeys", "In")
            } else {
                ("mismatchLabelKeys", "NotIn")
            };
            let key = *self.rng.pick(&["tier", "version"]);
            term[field] = json!([key]);
            if let Some(value) = own[key].as_str() {
                let mut exprs = term["labelSelector"]["matchExpressions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                exprs.push(json!({"key": key, "operator": operator, "values": [value]}));
                term["labelSelector"]["matchExpressions"] = json!(exprs);
            }
        }
        term
    }

    fn node_selector_requirement(&mut self) -> Value {
        match self.rng.below(8) {
            0 => {
                json!({"key": ZONE, "operator": "In", "values": self.rng.some(&self.zones.clone(), 1, 2)})
            }
            1 => json!({"key": "disk", "operator": "NotIn", "values": ["hdd"]}),
            2 => json!({"key": "gpu", "operator": "Exists"}),
            3 => json!({"key": "gpu", "operator": "DoesNotExist"}),
            4 => json!({"key": "tier", "operator": "Gt", "values": ["2"]}),
            5 => json!({"key": "tier", "operator": "Lt", "values": ["4"]}),
            6 => json!({"key": "disk", "operator": "In", "values": ["ssd"]}),
            _ => {
                json!({"key": ZONE, "operator": "NotIn", "values": [self.rng.pick(&self.zones).clone()]})
            }
        }
    }

    fn node_selector_term(&mut self) -> Value {
        if self.rng.chance(12) {
            let names = self.rng.some(&self.node_names.clone(), 1, 1); // the API allows one value
            return json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": names}]});
        }
        let exprs: Vec<Value> = (0..self.rng.range(1, 2))
            .map(|_| self.node_selector_requirement())
            .collect();
        json!({"matchExpressions": exprs})
    }

    fn pending_pod(&mut self, i: usize) {
        let family = self.family;
        let namespace = *self.rng.pick(&NAMESPACES);
        let name = format!("p{i}");
        let labels = self.labels();
        let mut containers = vec![self.container("main", true)];
        if self.rng.chance(25) {
            containers.push(self.container("side", false));
        }
        let mut spec = json!({"schedulerName": "dra-scheduler"});
        if family.core() {
            if self.bites(20) {
                containers[0]["ports"] = json!([self.host_port()]);
            }
            if self.rng.chance(12) {
                let mut init = self.container("init", true);
                if self.rng.chance(40) {
                    init["restartPolicy"] = json!("Always"); // a sidecar
                }
                spec["initContainers"] = json!([init]);
            }
            if self.bites(25) {
                spec["nodeSelector"] = match self.rng.below(3) {
                    0 => json!({"disk": "ssd"}),
                    1 => json!({ZONE: self.rng.pick(&self.zones).clone()}),
                    _ => json!({"tier": self.rng.range(1, 5).to_string()}),
                };
            }
            if self.bites(30) {
                let terms: Vec<Value> = (0..self.rng.range(1, 2))
                    .map(|_| self.node_selector_term())
                    .collect();
                spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] =
                    json!({"nodeSelectorTerms": terms});
            }
            if self.rng.chance(35) {
                let preferred: Vec<Value> = (0..self.rng.range(1, 3))
                    .map(|_| {
                        let weight = self.rng.range(1, 100);
                        let term = self.node_selector_term();
                        json!({"weight": weight, "preference": term})
                    })
                    .collect();
                spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] =
                    json!(preferred);
            }
            if self.rng.chance(45) {
                let all = [
                    json!({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}),
                    json!({"key": "dedicated", "operator": "Exists"}),
                    json!({"key": "spot", "operator": "Exists", "effect": "PreferNoSchedule"}),
                    json!({"key": "maint", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}),
                    json!({"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}),
                    json!({"operator": "Exists"}),
                    json!({"key": "dedicated", "operator": "Equal", "value": "db"}),
                ];
                spec["tolerations"] = json!(self.rng.some(&all, 1, 3));
            }
        }
        if family.spread() && !family.core() && self.rng.chance(25) {
            // Node inclusion policies only matter with a node selector and taints.
            spec["nodeSelector"] = json!({ZONE: self.rng.pick(&self.zones).clone()});
        }
        if family.spread() && !family.core() && self.rng.chance(25) {
            spec["tolerations"] = json!([{"key": "dedicated", "operator": "Exists"}]);
        }
        if family.interpod() {
            for (kind, chance) in [("podAffinity", 30), ("podAntiAffinity", 30)] {
                if self.bites(chance) {
                    let terms: Vec<Value> = (0..self.rng.range(1, 2))
                        .map(|_| self.pod_term(&labels, true))
                        .collect();
                    spec["affinity"][kind]["requiredDuringSchedulingIgnoredDuringExecution"] =
                        json!(terms);
                }
                if self.rng.chance(chance) {
                    let terms: Vec<Value> = (0..self.rng.range(1, 2))
                        .map(|_| {
                            let weight = self.rng.range(1, 100);
                            let term = self.pod_term(&labels, true);
                            json!({"weight": weight, "podAffinityTerm": term})
                        })
                        .collect();
                    spec["affinity"][kind]["preferredDuringSchedulingIgnoredDuringExecution"] =
                        json!(terms);
                }
            }
        }
        if family.spread()
            && self
                .rng
                .chance(if family == Family::Mixed { 40 } else { 90 })
        {
            let constraints: Vec<Value> = (0..self.rng.range(1, 2))
                .map(|_| self.spread_constraint(&labels))
                .collect();
            spec["topologySpreadConstraints"] = json!(constraints);
        }
        if family.volumes() {
            let mut volumes = Vec::new();
            let claims = self.claims_in(namespace);
            if !claims.is_empty() && self.bites(70) {
                for (k, claim) in self.rng.some(&claims, 1, 2).into_iter().enumerate() {
                    volumes.push(json!({"name": format!("v{k}"), "persistentVolumeClaim": {"claimName": claim}}));
                }
            }
            if self.bites(8) {
                volumes.push(json!({"name": "missing", "persistentVolumeClaim": {"claimName": "no-such-claim"}}));
            }
            if self.bites(25) {
                self.ephemeral_volume(namespace, &name, &mut volumes);
            }
            if self.bites(15) {
                let disk = *self.rng.pick(&["disk-1", "disk-2"]);
                volumes.push(json!({"name": "pd", "gcePersistentDisk": {"pdName": disk, "readOnly": self.rng.chance(50)}}));
            }
            if self.rng.chance(20) {
                volumes.push(json!({"name": "scratch", "emptyDir": {}}));
            }
            if !volumes.is_empty() {
                spec["volumes"] = json!(volumes);
            }
        }
        if family.dra() && self.bites(70) {
            self.pending_claim(namespace, &name, &mut spec);
        }
        spec["containers"] = json!(containers);
        self.case.pods.push(json!({
            "metadata": {"name": name, "namespace": namespace, "labels": labels,
                         "uid": format!("uid-pod-{namespace}-{name}")},
            "spec": spec,
            "status": {"phase": "Pending"},
        }));
        self.case.pending.push(format!("{namespace}/{name}"));
    }

    /// A device class and, on most nodes, a slice of 1 to 4 GPUs of two models.
    fn devices(&mut self) {
        self.case.device_classes.push(json!({
            "metadata": {"name": GPU},
            "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{GPU}\"")}}]},
        }));
        for node in self.node_names.clone() {
            if !self.rng.chance(65) {
                continue;
            }
            let devices: Vec<Value> = (0..self.rng.range(1, 4))
                .map(|i| {
                    json!({"name": format!("gpu-{i}"), "attributes": {
                        "model": {"string": *self.rng.pick(&["a100", "t4"])}, "index": {"int": i}},
                        "capacity": {"memory": {"value": *self.rng.pick(&["16Gi", "40Gi"])}}})
                })
                .collect();
            self.case.resource_slices.push(json!({
                "metadata": {"name": format!("{node}-gpu")},
                "spec": {"driver": GPU, "nodeName": node, "devices": devices,
                         "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
            }));
        }
    }

    fn slice_devices(&self, node: &str) -> Vec<String> {
        self.case
            .resource_slices
            .iter()
            .filter(|s| s["spec"]["nodeName"] == node)
            .flat_map(|s| s["spec"]["devices"].as_array().unwrap().iter())
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect()
    }

    fn claim_request(&mut self, count: usize) -> Value {
        let mut exactly =
            json!({"deviceClassName": GPU, "allocationMode": "ExactCount", "count": count});
        if self.rng.chance(40) {
            exactly["selectors"] = json!([{"cel": {"expression":
                format!("device.attributes[\"{GPU}\"].model == \"a100\"")}}]);
        }
        json!({"name": "gpu", "exactly": exactly})
    }

    /// The existing pod holds a claim allocated on its node, to a device no other claim has.
    fn allocated_claim(&mut self, namespace: &str, pod: &str, node: &str, spec: &mut Value) {
        let taken: Vec<String> = self
            .case
            .resource_claims
            .iter()
            .filter(|c| c["status"]["allocation"]["devices"]["results"][0]["pool"] == node)
            .map(|c| {
                c["status"]["allocation"]["devices"]["results"][0]["device"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        let free: Vec<String> = self
            .slice_devices(node)
            .into_iter()
            .filter(|d| !taken.contains(d))
            .collect();
        if free.is_empty() {
            return;
        }
        let device = self.rng.pick(&free).clone();
        let name = format!("{pod}-gpu");
        let request = self.claim_request(1);
        self.case.resource_claims.push(json!({
            "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-claim-{namespace}-{name}")},
            "spec": {"devices": {"requests": [request]}},
            "status": {
                "allocation": {
                    "devices": {"results": [{"request": "gpu", "driver": GPU, "pool": node, "device": device}]},
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
                },
                "reservedFor": [{"resource": "pods", "name": pod, "uid": format!("uid-pod-{namespace}-{pod}")}],
            },
        }));
        spec["resourceClaims"] = json!([{"name": "gpu", "resourceClaimName": name}]);
    }

    /// The pending pod's claim: its own, not allocated yet (most often), one that an
    /// existing pod in its namespace shares, or one that does not exist.
    fn pending_claim(&mut self, namespace: &str, pod: &str, spec: &mut Value) {
        let shared: Vec<String> = self
            .case
            .resource_claims
            .iter()
            .filter(|c| c["metadata"]["namespace"] == namespace)
            .map(|c| c["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        let claim = if !shared.is_empty() && self.rng.chance(20) {
            self.rng.pick(&shared).clone()
        } else if self.rng.chance(5) {
            "no-such-claim".to_string()
        } else {
            let name = format!("{pod}-gpu");
            let count = self.rng.range(1, 2);
            let request = self.claim_request(count);
            self.case.resource_claims.push(json!({
                "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-claim-{namespace}-{name}")},
                "spec": {"devices": {"requests": [request]}},
            }));
            name
        };
        spec["resourceClaims"] = json!([{"name": "gpu", "resourceClaimName": claim}]);
    }

    /// A generic ephemeral volume; its claim exists (made by the ephemeral volume
    /// controller, owned by the pod) most of the time.
    fn ephemeral_volume(&mut self, namespace: &str, pod: &str, volumes: &mut Vec<Value>) {
        let class = *self.rng.pick(&["local", "zonal", "standard"]);
        volumes.push(
            json!({"name": "scratch-pvc", "ephemeral": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": class, "volumeMode": "Filesystem",
            "resources": {"requests": {"storage": "1Gi"}}}}}}),
        );
        if self.rng.chance(80) {
            let name = format!("{pod}-scratch-pvc");
            let owner = if self.rng.chance(90) {
                format!("uid-pod-{namespace}-{pod}")
            } else {
                "uid-someone-else".to_string()
            };
            self.case.persistent_volume_claims.push(json!({
                "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-pvc-{namespace}-{name}"),
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": owner,
                                         "controller": true, "blockOwnerDeletion": true}]},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class, "volumeMode": "Filesystem",
                         "resources": {"requests": {"storage": "1Gi"}}},
                "status": {"phase": "Pending"},
            }));
        }
    }

    /// Services and controllers (ReplicaSets, StatefulSets, ReplicationControllers) that
    /// select some of the pods, which then get PodTopologySpread's default constraints when
    /// they have none of their own; and, in the config family, `List` defaults.
    /// VolumeAttachments: of CSI volumes, some on the node of a bound pod that uses the
    /// same volume (counted once), some elsewhere (the volume of a pod gone), and some that
    /// do not count: no attacher, an inline volume, a missing or non-CSI PersistentVolume.
    fn volume_attachments(&mut self) {
        // Where bound pods use each PersistentVolume, through their claims.
        let mut used_on: Vec<(String, String)> = Vec::new();
        for pod in &self.case.pods {
            let (Some(node), Some(volumes)) = (
                pod["spec"]["nodeName"].as_str(),
                pod["spec"]["volumes"].as_array(),
            ) else {
                continue;
            };
            let namespace = &pod["metadata"]["namespace"];
            for claim in volumes
                .iter()
                .filter_map(|v| v["persistentVolumeClaim"]["claimName"].as_str())
            {
                let pv = self.case.persistent_volume_claims.iter().find(|c| {
                    c["metadata"]["namespace"] == *namespace && c["metadata"]["name"] == claim
                });
                if let Some(pv) = pv.and_then(|c| c["spec"]["volumeName"].as_str()) {
                    used_on.push((pv.to_string(), node.to_string()));
                }
            }
        }
        let mut sources: Vec<(Value, Option<String>)> = Vec::new();
        for pv in &self.case.persistent_volumes {
            let name = pv["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let csi = !pv["spec"]["csi"].is_null();
            if (csi && self.rng.chance(70)) || (!csi && self.rng.chance(10)) {
                let used = used_on
                    .iter()
                    .find(|(v, _)| *v == name)
                    .map(|(_, n)| n.clone());
                sources.push((json!({"persistentVolumeName": name}), used));
            }
        }
        if self.rng.chance(10) {
            sources.push((json!({"persistentVolumeName": "pv-gone"}), None));
        }
        if self.rng.chance(10) {
            sources.push((
                json!({"inlineVolumeSpec": {"accessModes": ["ReadWriteOnce"],
                        "csi": {"driver": CSI, "volumeHandle": "inline-1"}}}),
                None,
            ));
        }
        for (i, (source, used_on)) in sources.into_iter().enumerate() {
            let node = match used_on {
                Some(node) if self.rng.chance(80) => node,
                _ if self.rng.chance(5) => "node-gone".to_string(),
                _ => self.rng.pick(&self.node_names).clone(),
            };
            let attacher = match self.rng.below(20) {
                0 => "",
                1 | 2 => "other.csi.example.com",
                _ => CSI,
            };
            let name = format!("va-{i}");
            self.case.volume_attachments.push(json!({
                "metadata": {"name": name, "uid": format!("uid-va-{name}")},
                "spec": {"attacher": attacher, "nodeName": node, "source": source},
                "status": {"attached": true},
            }));
        }
    }

    fn workloads(&mut self) {
        for namespace in NAMESPACES {
            for app in APPS {
                let members: Vec<usize> = (0..self.case.pods.len())
                    .filter(|&i| {
                        let meta = &self.case.pods[i]["metadata"];
                        meta["namespace"] == namespace && meta["labels"]["app"] == app
                    })
                    .collect();
                if members.is_empty() || !self.rng.chance(60) {
                    continue;
                }
                if self.rng.chance(50) {
                    let mut selector = json!({"app": app});
                    if self.rng.chance(25) {
                        selector["tier"] = json!(*self.rng.pick(&TIERS));
                    }
                    self.case.services.push(json!({
                        "metadata": {"name": format!("{app}-svc"), "namespace": namespace},
                        "spec": {"selector": selector}}));
                }
                let kind = *self.rng.pick(&[
                    "ReplicaSet",
                    "ReplicaSet",
                    "StatefulSet",
                    "ReplicationController",
                    "",
                ]);
                if kind.is_empty() {
                    continue;
                }
                let name = format!("{app}-{}", kind.to_lowercase());
                let meta = json!({"name": name, "namespace": namespace});
                let template = json!({"metadata": {"labels": {"app": app}}});
                let api_version = if kind == "ReplicationController" {
                    let mut selector = json!({"app": app});
                    if self.rng.chance(25) {
                        selector["tier"] = json!(*self.rng.pick(&TIERS));
                    }
                    self.case.replication_controllers.push(
                        json!({"metadata": meta, "spec": {"selector": selector, "template": template}}),
                    );
                    "v1"
                } else {
                    let mut selector = json!({"matchLabels": {"app": app}});
                    match self.rng.below(5) {
                        0 => {
                            let op = *self.rng.pick(&["In", "NotIn"]);
                            selector["matchExpressions"] = json!([{"key": "tier",
                                "operator": op, "values": [*self.rng.pick(&TIERS)]}]);
                        }
                        1 => {
                            let op = *self.rng.pick(&["Exists", "DoesNotExist"]);
                            selector["matchExpressions"] =
                                json!([{"key": "version", "operator": op}]);
                        }
                        _ => {}
                    }
                    let object = json!({"metadata": meta,
                        "spec": {"selector": selector, "template": template}});
                    if kind == "ReplicaSet" {
                        self.case.replica_sets.push(object);
                    } else {
                        self.case.stateful_sets.push(object);
                    }
                    "apps/v1"
                };
                for i in members {
                    if !self.rng.chance(75) {
                        continue;
                    }
                    // Now and then an owner kube-scheduler does not follow: not the
                    // controller, an old API version, or one that does not exist.
                    let (api_version, controller, owner) = match self.rng.below(12) {
                        0 => (api_version, false, name.clone()),
                        1 => ("extensions/v1beta1", true, name.clone()),
                        2 => (api_version, true, format!("{name}-gone")),
                        _ => (api_version, true, name.clone()),
                    };
                    let pod = &mut self.case.pods[i];
                    pod["metadata"]["ownerReferences"] = json!([{"apiVersion": api_version,
                        "kind": kind, "name": owner, "uid": format!("uid-{kind}-{owner}"),
                        "controller": controller}]);
                }
            }
        }
        if self.rng.chance(10) {
            let spec = self.rng.pick(&[json!({}), json!({"selector": {}})]).clone();
            let namespace = *self.rng.pick(&NAMESPACES);
            self.case.services.push(
                json!({"metadata": {"name": "no-selector", "namespace": namespace}, "spec": spec}),
            );
        }
        // Pending pods that something selects lose their own constraints now and then, so
        // that the defaults apply to them.
        let pending: Vec<String> = self.case.pending.clone();
        for pod in self.case.pods.iter_mut() {
            let meta = &pod["metadata"];
            let key = format!(
                "{}/{}",
                meta["namespace"].as_str().unwrap_or_default(),
                meta["name"].as_str().unwrap_or_default()
            );
            if pending.contains(&key)
                && self.rng.chance(50)
                && let Some(spec) = pod["spec"].as_object_mut()
            {
                spec.remove("topologySpreadConstraints");
            }
        }
        if self.family == Family::Config && self.rng.chance(40) {
            let constraints: Vec<Value> = self
                .rng
                .some(
                    &[
                        (ZONE, "DoNotSchedule"),
                        (ZONE, "ScheduleAnyway"),
                        (HOSTNAME, "DoNotSchedule"),
                        (HOSTNAME, "ScheduleAnyway"),
                    ],
                    0,
                    2,
                )
                .into_iter()
                .map(|(key, when)| {
                    json!({"topologyKey": key, "whenUnsatisfiable": when,
                           "maxSkew": self.rng.range(1, 2)})
                })
                .collect();
            let args = json!({"name": "PodTopologySpread", "args": {
                "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "PodTopologySpreadArgs",
                "defaultingType": "List", "defaultConstraints": constraints}});
            if let Some(profile) = self
                .case
                .config
                .as_mut()
                .and_then(|c| c["profiles"].get_mut(0))
            {
                let list = &mut profile["pluginConfig"];
                if list.is_null() {
                    *list = json!([]);
                }
                list.as_array_mut().unwrap().push(args);
            }
        }
    }

    fn spread_constraint(&mut self, own: &Value) -> Value {
        let topology = if self.rng.chance(50) { ZONE } else { HOSTNAME };
        let hard = self.rng.chance(65);
        let app = match own["app"].as_str() {
            Some(app) if self.rng.chance(80) => app.to_string(),
            _ => self.rng.pick(&APPS).to_string(),
        };
        let mut c = json!({
            "maxSkew": self.rng.range(1, 2),
            "topologyKey": topology,
            "whenUnsatisfiable": if hard { "DoNotSchedule" } else { "ScheduleAnyway" },
            "labelSelector": {"matchLabels": {"app": app}},
        });
        if hard && self.rng.chance(25) {
            c["minDomains"] = json!(self.rng.range(2, 4));
        }
        if self.rng.chance(30) {
            c["nodeAffinityPolicy"] = json!(*self.rng.pick(&["Honor", "Ignore"]));
        }
        if self.rng.chance(30) {
            c["nodeTaintsPolicy"] = json!(*self.rng.pick(&["Honor", "Ignore"]));
        }
        if self.rng.chance(20) {
            c["matchLabelKeys"] = json!([*self.rng.pick(&["tier", "version"])]);
        }
        c
    }
}

/// A KubeSchedulerConfiguration whose one profile changes how nodes are scored.
fn config(rng: &mut Rng) -> Value {
    let mut plugin_config = Vec::new();
    if rng.chance(70) {
        let kind = *rng.pick(&[
            "LeastAllocated",
            "MostAllocated",
            "RequestedToCapacityRatio",
        ]);
        let resources: Vec<Value> = rng
            .some(&["cpu", "memory"], 1, 2)
            .into_iter()
            .map(|r| json!({"name": r, "weight": rng.range(1, 5)}))
            .collect();
        let mut strategy = json!({"type": kind, "resources": resources});
        if kind == "RequestedToCapacityRatio" {
            let shape = if rng.chance(50) {
                json!([{"utilization": 0, "score": 0}, {"utilization": 100, "score": 10}])
            } else {
                json!([{"utilization": 0, "score": 10}, {"utilization": 60, "score": 3},
                       {"utilization": 100, "score": 0}])
            };
            strategy["requestedToCapacityRatio"] = json!({"shape": shape});
        }
        plugin_config.push(json!({"name": "NodeResourcesFit", "args": {
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "NodeResourcesFitArgs",
            "scoringStrategy": strategy}}));
    }
    if rng.chance(30) {
        plugin_config.push(json!({"name": "InterPodAffinity", "args": {
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "InterPodAffinityArgs",
            "hardPodAffinityWeight": rng.range(0, 100),
            "ignorePreferredTermsOfExistingPods": rng.chance(50)}}));
    }
    let scores = [
        "TaintToleration",
        "NodeAffinity",
        "NodeResourcesFit",
        "PodTopologySpread",
        "InterPodAffinity",
        "NodeResourcesBalancedAllocation",
        "ImageLocality",
    ];
    let weighted: Vec<Value> = rng
        .some(&scores, 0, 3)
        .into_iter()
        .map(|name| match rng.range(0, 4) {
            // A weight left out or 0 is 1 in kube-scheduler.
            0 => json!({"name": name}),
            _ => json!({"name": name, "weight": rng.range(0, 10)}),
        })
        .collect();
    let disabled: Vec<Value> = rng
        .some(&scores, 0, 2)
        .into_iter()
        .filter(|name| !weighted.iter().any(|w| w["name"] == *name))
        .map(|name| json!({"name": name}))
        .collect();
    let mut profile = json!({"schedulerName": "dra-scheduler"});
    if !weighted.is_empty() || !disabled.is_empty() {
        profile["plugins"] = json!({"score": {"enabled": weighted, "disabled": disabled}});
    }
    if !plugin_config.is_empty() {
        profile["pluginConfig"] = json!(plugin_config);
    }
    json!({"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
           "profiles": [profile]})
}
