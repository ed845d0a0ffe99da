//! Least privilege, shown on a real Kubernetes 1.37 control plane: the scheduler's
//! ClusterRole and Lease Role, as the chart renders them, grant nothing it can do without.
//!
//! The scheduler runs as a ServiceAccount (a real token, bound by copies of the chart's
//! roles) and, with the full roles, places a pod for every capability it has: a pod with a
//! claim (allocation, reservation, binding, a Scheduled event), a pod asking for a
//! DeviceClass's extended resource (a claim it creates, the pod's status), the second pod
//! of a shared claim, pods whose volumes wait for a local PersistentVolume or for
//! provisioning, and a pod no node fits (its condition, an event told twice); it holds its
//! Lease. Then every (resource, verb) of the roles is taken away in turn, from the roles of
//! a ServiceAccount of its own, and the scheduler shows the failure that verb prevents:
//! without an informer's list it never becomes ready, without its watch every watch is
//! refused, without a write or a read of the binding path the pod's FailedScheduling event
//! quotes the refusal (and the pod stays unplaced), without events the pod is placed
//! silently, without the Lease it never leads or stops leading.
//!
//! The chart may grant only what a case here shows needed: a grant with no case fails the
//! test. The control plane runs the OwnerReferencesPermissionEnforcement admission plugin,
//! as some distributions do: under it, the claim the scheduler creates for a pod's extended
//! resources (owned by the pod, with blockOwnerDeletion) needs update on pods/finalizers.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount,
};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use test_cluster::{TestCluster, TestNamespace, eventually, free_port};

mod common;
use common::{get, helm, node_of, repo, run, token_kubeconfig};

/// The node every pod of the test goes to, with the slice of driver [`DRIVER`].
const NODE: &str = "lp-gpu-node";
const DRIVER: &str = "lp.example.com";
const CLASS: &str = "lp-gpu";
const EXTENDED: &str = "example.com/lp-gpu";
/// Trials at once: each runs a scheduler process of its own.
const PARALLEL: usize = 6;
/// How long a trial waits for what it expects, in seconds: a bound on a hang, not a speed
/// (six schedulers and their trials share two cores).
const HANG: u64 = 120;

/// One (API group, resource, verb) a role grants.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Grant {
    group: String,
    resource: String,
    verb: String,
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {}/{}", self.verb, group, self.resource)
    }
}

/// The chart's roles: the ClusterRole's rules and the Lease Role's.
struct ChartRoles {
    cluster: Vec<Value>,
    lease: Vec<Value>,
}

impl ChartRoles {
    fn render() -> ChartRoles {
        let out = run(helm()
            .args(["template", "dra-scheduler"])
            .arg(repo().join("charts/dra-scheduler"))
            .args(["--namespace", "kube-system", "--kube-version", "1.37.2"])
            .args(["--show-only", "templates/rbac.yaml"]));
        let text = String::from_utf8(out.stdout).unwrap();
        let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect();
        let rules = |kind: &str| {
            let doc = docs.iter().find(|d| d["kind"] == kind).unwrap();
            doc["rules"].as_array().unwrap().clone()
        };
        ChartRoles {
            cluster: rules("ClusterRole"),
            lease: rules("Role"),
        }
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// Every grant of `rules`.
fn grants(rules: &[Value]) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for rule in rules {
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    out.insert(Grant {
                        group: group.clone(),
                        resource: resource.clone(),
                        verb,
                    });
                }
            }
        }
    }
    out
}

/// `rules` without `grant`, everything else (resource names included) as it was: each
/// rule becomes one rule per group and resource.
fn without(rules: &[Value], grant: Option<&Grant>) -> Vec<Value> {
    let mut out = Vec::new();
    for rule in rules {
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                let verbs: Vec<String> = strings(&rule["verbs"])
                    .into_iter()
                    .filter(|v| {
                        grant.is_none_or(|g| {
                            (&g.group, &g.resource, &g.verb) != (&group, &resource, v)
                        })
                    })
                    .collect();
                if verbs.is_empty() {
                    continue;
                }
                let mut one =
                    json!({"apiGroups": [group], "resources": [resource], "verbs": verbs});
                if let Some(names) = rule.get("resourceNames") {
                    one["resourceNames"] = names.clone();
                }
                out.push(one);
            }
        }
    }
    out
}

/// What a grant is for, and so how its absence shows.
#[derive(Clone, Copy, Debug)]
enum Need {
    /// An informer's initial list: the scheduler never becomes ready.
    List,
    /// An informer's watch: every watch is refused (changes arrive only with re-lists).
    Watch,
    /// A request made while the scenario's pod is placed: its FailedScheduling event
    /// quotes the refusal.
    Placing(Scenario),
    /// Publishing the scenario's events: the refusal is logged, the events are missing.
    Events(Scenario),
    /// The Lease: without it the scheduler never leads, or stops leading.
    Lease,
    /// The PodGroup's `PodGroupInitiallyScheduled` condition: the refusal is logged, the
    /// group's pod is placed, its PodGroup says nothing.
    GroupCondition,
    /// Evicting a preemption's victim: the refusal is logged, the victim keeps running.
    Preempting,
}

/// Each grant the roles may have, and what it is needed for. A grant of the chart missing
/// here fails the test; so does an entry the chart does not grant.
fn need(g: &Grant) -> Option<Need> {
    use Need::*;
    use Scenario::*;
    let informer = |verb: &str| match verb {
        "list" => Some(List),
        "watch" => Some(Watch),
        _ => None,
    };
    match (g.group.as_str(), g.resource.as_str(), g.verb.as_str()) {
        ("", "pods", "get") => Some(Placing(VolumeToBind)),
        ("", "nodes", "get") => Some(Placing(VolumeToBind)),
        ("", "persistentvolumes", "get") => Some(Placing(VolumeToBind)),
        ("", "persistentvolumes", "patch") => Some(Placing(VolumeToBind)),
        ("", "persistentvolumeclaims", "get") => Some(Placing(VolumeToBind)),
        ("", "persistentvolumeclaims", "patch") => Some(Placing(VolumeToProvision)),
        ("", "pods/binding", "create") => Some(Placing(Claim)),
        ("", "pods/status", "patch") => Some(Placing(ExtendedResource)),
        // The claim made for extended resources is owned by its pod with
        // blockOwnerDeletion, which OwnerReferencesPermissionEnforcement checks.
        ("", "pods/finalizers", "update") => Some(Placing(ExtendedResource)),
        ("events.k8s.io", "events", "create") => Some(Events(Claim)),
        ("events.k8s.io", "events", "patch") => Some(Events(Unschedulable)),
        ("resource.k8s.io", "resourceclaims", "get") => Some(Placing(SharedClaim)),
        ("resource.k8s.io", "resourceclaims", "create") => Some(Placing(ExtendedResource)),
        ("resource.k8s.io", "resourceclaims", "patch") => Some(Placing(Claim)),
        ("resource.k8s.io", "resourceclaims/status", "patch") => Some(Placing(Claim)),
        ("resource.k8s.io", "resourceclaims/binding", "patch") => Some(Placing(Claim)),
        ("coordination.k8s.io", "leases", "get" | "update" | "create") => Some(Lease),
        ("scheduling.k8s.io", "podgroups/status", "patch") => Some(GroupCondition),
        ("", "pods", "delete") => Some(Preempting),
        (
            "",
            "pods"
            | "nodes"
            | "namespaces"
            | "services"
            | "replicationcontrollers"
            | "persistentvolumes"
            | "persistentvolumeclaims",
            verb,
        )
        | ("apps", "replicasets" | "statefulsets", verb)
        | (
            "storage.k8s.io",
            "storageclasses" | "csinodes" | "csidrivers" | "volumeattachments",
            verb,
        )
        | ("scheduling.k8s.io", "podgroups", verb)
        | ("policy", "poddisruptionbudgets", verb)
        | (
            "resource.k8s.io",
            "resourceclaims" | "resourceslices" | "deviceclasses" | "devicetaintrules",
            verb,
        ) => informer(verb),
        _ => None,
    }
}

/// How the API server words the refusal of `g`.
fn refusal(g: &Grant) -> String {
    if g.resource == "pods/finalizers" {
        // OwnerReferencesPermissionEnforcement's words; it names neither verb nor resource.
        return "cannot set blockOwnerDeletion if an ownerReference refers to a resource you \
                can't set finalizers on"
            .into();
    }
    if g.resource == "resourceclaims/binding" {
        // Checked by the claim's status strategy (DRAResourceClaimGranularStatusAuthorization).
        return format!("requires resource=\"{}\", verb=\"{}\"", g.resource, g.verb);
    }
    format!(
        "cannot {} resource \"{}\" in API group \"{}\"",
        g.verb, g.resource, g.group
    )
}

/// The pods the scheduler places, one capability each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    /// A pod with a claim from a template: allocation, reservation, binding.
    Claim,
    /// A pod asking for the class's extended resource: the scheduler creates its claim and
    /// records it in the pod's status.
    ExtendedResource,
    /// The second pod of a claim the first already has allocated: the claim is read anew.
    SharedClaim,
    /// A pod whose claim waits for a local PersistentVolume (WaitForFirstConsumer).
    VolumeToBind,
    /// A pod whose claim waits for provisioning: the claim is told the node.
    VolumeToProvision,
    /// A pod no node fits, told twice with different messages (a node appears meanwhile).
    Unschedulable,
    /// A pod of a PodGroup (gang of one): its PodGroup gets the scheduled condition.
    Gang,
    /// A pod of priority 1000 on a node of one device that a pod of priority 0 holds: the
    /// latter is preempted.
    Preempt,
}

impl Scenario {
    const ALL: [Scenario; 8] = [
        Scenario::Preempt,
        Scenario::Gang,
        Scenario::Claim,
        Scenario::ExtendedResource,
        Scenario::SharedClaim,
        Scenario::VolumeToBind,
        Scenario::VolumeToProvision,
        Scenario::Unschedulable,
    ];

    /// The pod whose placement the scenario is about.
    fn pod(self) -> &'static str {
        match self {
            Scenario::Claim => "with-claim",
            Scenario::ExtendedResource => "with-extended-resource",
            Scenario::SharedClaim => "second-of-shared-claim",
            Scenario::VolumeToBind => "with-local-volume",
            Scenario::VolumeToProvision => "with-provisioned-volume",
            Scenario::Unschedulable => "fits-nowhere",
            Scenario::Gang => "in-a-gang",
            Scenario::Preempt => "preempting",
        }
    }

    /// The PersistentVolumeClaim of the volume scenarios.
    fn claim(self) -> &'static str {
        match self {
            Scenario::VolumeToProvision => "data-to-provision",
            _ => "data-local",
        }
    }

    /// Whether a retry may place the pod after a refused request (the PV controller may
    /// finish a volume binding the refusal interrupted).
    fn may_recover(self) -> bool {
        matches!(self, Scenario::VolumeToBind | Scenario::VolumeToProvision)
    }

    /// Create the scenario's objects in the trial's namespace; returns once its pod exists.
    async fn create(self, t: &Trial) {
        let pod = |name: &str, extra: Value| {
            let mut spec = json!({
                "schedulerName": t.scheduler,
                "containers": [{"name": "c", "image": "busybox"}],
            });
            for (k, v) in extra.as_object().unwrap() {
                spec[k] = v.clone();
            }
            json!({"metadata": {"name": name}, "spec": spec})
        };
        let claims = json!({"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}});
        match self {
            Scenario::Claim => {
                t.create::<ResourceClaimTemplate>(
                    json!({"metadata": {"name": "one-gpu"}, "spec": {"spec": claims}}),
                )
                .await;
                t.create::<Pod>(pod(
                    self.pod(),
                    json!({
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                        "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
                    }),
                ))
                .await;
            }
            Scenario::ExtendedResource => {
                t.create::<Pod>(pod(
                    self.pod(),
                    json!({"containers": [{"name": "c", "image": "busybox",
                        "resources": {"limits": {EXTENDED: "1"}}}]}),
                ))
                .await;
            }
            Scenario::SharedClaim => {
                t.create::<ResourceClaim>(json!({"metadata": {"name": "shared"}, "spec": claims}))
                    .await;
                let user = |name: &str| {
                    pod(
                        name,
                        json!({
                            "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared"}],
                            "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
                        }),
                    )
                };
                t.create::<Pod>(user("first-of-shared-claim")).await;
                t.bound("first-of-shared-claim").await;
                t.create::<Pod>(user(self.pod())).await;
            }
            Scenario::VolumeToBind | Scenario::VolumeToProvision => {
                let class = format!(
                    "{}-{}",
                    t.name,
                    if self == Scenario::VolumeToBind {
                        "local"
                    } else {
                        "provisioned"
                    }
                );
                let provisioner = if self == Scenario::VolumeToBind {
                    "kubernetes.io/no-provisioner"
                } else {
                    "example.com/no-such-provisioner"
                };
                t.create_cluster::<StorageClass>(json!({
                    "metadata": {"name": class},
                    "provisioner": provisioner,
                    "volumeBindingMode": "WaitForFirstConsumer",
                }))
                .await;
                if self == Scenario::VolumeToBind {
                    t.create_cluster::<PersistentVolume>(json!({
                        "metadata": {"name": format!("{}-disk", t.name)},
                        "spec": {
                            "capacity": {"storage": "1Gi"},
                            "accessModes": ["ReadWriteOnce"],
                            "storageClassName": class,
                            "local": {"path": "/mnt/disk"},
                            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}]}},
                        },
                    }))
                    .await;
                }
                t.create::<PersistentVolumeClaim>(json!({
                    "metadata": {"name": self.claim()},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": class,
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                }))
                .await;
                t.create::<Pod>(pod(
                    self.pod(),
                    json!({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": self.claim()}}]}),
                ))
                .await;
            }
            Scenario::Preempt => {
                // A node of its own, with one device, tainted so that only these two pods
                // go there.
                let node = format!("{}-small", t.name);
                t.create_cluster::<Node>(json!({
                    "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
                    "spec": {"taints": [{"key": "lp-preempt", "effect": "NoSchedule"}]},
                    "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                               "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"}},
                }))
                .await;
                t.create_cluster::<ResourceSlice>(json!({
                    "metadata": {"name": format!("{node}-gpus")},
                    "spec": {"driver": DRIVER, "nodeName": node,
                        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                        "devices": [{"name": "gpu-0"}]},
                }))
                .await;
                t.create_cluster::<PriorityClass>(
                    json!({"metadata": {"name": format!("{}-urgent", t.name)}, "value": 1000}),
                )
                .await;
                t.create::<ResourceClaimTemplate>(
                    json!({"metadata": {"name": "preempt-gpu"}, "spec": {"spec": claims}}),
                )
                .await;
                let on_node = |name: &str, class: Option<String>| {
                    let mut extra = json!({
                        "nodeSelector": {"kubernetes.io/hostname": node},
                        "tolerations": [{"key": "lp-preempt", "operator": "Exists"}],
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "preempt-gpu"}],
                        "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
                    });
                    if let Some(class) = class {
                        extra["priorityClassName"] = json!(class);
                    }
                    pod(name, extra)
                };
                t.create::<Pod>(on_node("preempt-victim", None)).await;
                t.bound_to("preempt-victim", &node).await;
                t.create::<Pod>(on_node(self.pod(), Some(format!("{}-urgent", t.name))))
                    .await;
            }
            Scenario::Gang => {
                t.create::<PodGroup>(json!({"metadata": {"name": "lp-gang"},
                    "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}}}))
                    .await;
                t.create::<Pod>(pod(
                    self.pod(),
                    json!({"schedulingGroup": {"podGroupName": "lp-gang"}}),
                ))
                .await;
            }
            Scenario::Unschedulable => {
                t.create::<Pod>(pod(
                    self.pod(),
                    json!({"nodeSelector": {"lp-fits": "nowhere"}}),
                ))
                .await;
                // A second, different failure: once told, the cluster grows by a node.
                t.event(self.pod(), "FailedScheduling", "").await;
                t.create_cluster::<Node>(
                    json!({"metadata": {"name": format!("{}-extra", t.name)}}),
                )
                .await;
            }
        }
    }

    /// With every grant: what the scenario's pod got.
    async fn placed(self, t: &Trial) {
        let pods: Api<Pod> = t.ns.api();
        match self {
            Scenario::Claim | Scenario::SharedClaim => {
                t.bound(self.pod()).await;
                let claims: Api<ResourceClaim> = t.ns.api();
                for claim in claims.list(&ListParams::default()).await.unwrap() {
                    let status = claim.status.unwrap_or_default();
                    assert!(
                        status.allocation.is_some(),
                        "{:?} allocated",
                        claim.metadata.name
                    );
                }
                t.event(self.pod(), "Scheduled", "").await;
            }
            Scenario::ExtendedResource => {
                t.bound(self.pod()).await;
                let pod = pods.get(self.pod()).await.unwrap();
                let status = serde_json::to_value(pod.status).unwrap();
                let claim = status["extendedResourceClaimStatus"]["resourceClaimName"]
                    .as_str()
                    .unwrap_or_else(|| panic!("the pod's extended-resource claim: {status}"))
                    .to_string();
                let claims: Api<ResourceClaim> = t.ns.api();
                let claim = claims.get(&claim).await.unwrap();
                assert!(claim.status.unwrap_or_default().allocation.is_some());
            }
            Scenario::VolumeToBind => {
                t.bound(self.pod()).await;
                let pvcs: Api<PersistentVolumeClaim> = t.ns.api();
                let pvc = pvcs.get(self.claim()).await.unwrap();
                assert_eq!(
                    pvc.spec.unwrap().volume_name,
                    Some(format!("{}-disk", t.name))
                );
            }
            Scenario::VolumeToProvision => {
                let pvcs: Api<PersistentVolumeClaim> = t.ns.api();
                eventually("the claim to provision names the node", HANG, || async {
                    let pvc = pvcs.get(self.claim()).await.ok()?;
                    let node = pvc
                        .metadata
                        .annotations?
                        .get("volume.kubernetes.io/selected-node")?
                        .clone();
                    (node == NODE).then_some(())
                })
                .await;
            }
            Scenario::Preempt => {
                // No kubelet here: once the scheduler has deleted the victim, the test
                // confirms it stopped, as its kubelet would.
                let victim = eventually("the victim deleted", HANG, || async {
                    let p = pods.get("preempt-victim").await.ok()?;
                    p.metadata.deletion_timestamp.is_some().then_some(p)
                })
                .await;
                assert!(
                    victim
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "DisruptionTarget")
                );
                pods.delete(
                    "preempt-victim",
                    &kube::api::DeleteParams::default().grace_period(0),
                )
                .await
                .unwrap();
                t.bound_to(self.pod(), &format!("{}-small", t.name)).await;
            }
            Scenario::Gang => {
                t.bound(self.pod()).await;
                let groups: Api<PodGroup> = t.ns.api();
                eventually("the PodGroup's scheduled condition", HANG, || async {
                    let group = groups.get("lp-gang").await.ok()?;
                    group
                        .status?
                        .conditions?
                        .into_iter()
                        .find(|c| c.type_ == "PodGroupInitiallyScheduled" && c.status == "True")
                })
                .await;
            }
            Scenario::Unschedulable => {
                let condition =
                    eventually("the pod's PodScheduled=False condition", HANG, || async {
                        let pod = pods.get(self.pod()).await.ok()?;
                        pod.status?.conditions?.into_iter().find(|c| {
                            c.type_ == "PodScheduled"
                                && c.status == "False"
                                && c.reason.as_deref() == Some("Unschedulable")
                        })
                    })
                    .await;
                assert!(condition.message.unwrap_or_default().contains("node"));
                let events: Api<Event> = t.ns.api();
                eventually("the second failure as the event's series", HANG, || async {
                    let list = events.list(&ListParams::default()).await.ok()?;
                    list.items.into_iter().find(|e| {
                        e.reason.as_deref() == Some("FailedScheduling")
                            && e.series.as_ref().is_some_and(|s| s.count >= 2)
                    })
                })
                .await;
            }
        }
    }
}

/// A ServiceAccount with copies of the chart's roles (less one grant, for a trial).
struct Identity {
    kubeconfig: PathBuf,
    name: String,
}

/// Objects every trial shares: the node with its slice, the class; the namespace of the
/// ServiceAccounts and their Leases.
struct Fixture<'a> {
    cluster: &'a TestCluster,
    client: Client,
    identities: TestNamespace,
}

impl<'a> Fixture<'a> {
    async fn install(cluster: &'a TestCluster) -> Fixture<'a> {
        let client = cluster.client().await;
        let nodes: Api<Node> = Api::all(client.clone());
        nodes
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
                    "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
                               "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110"}},
                }))
                .unwrap(),
            )
            .await
            .unwrap();
        let classes: Api<DeviceClass> = Api::all(client.clone());
        classes
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": CLASS},
                    "spec": {
                        "selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}],
                        "extendedResourceName": EXTENDED,
                    },
                }))
                .unwrap(),
            )
            .await
            .unwrap();
        let devices: Vec<Value> = (0..16)
            .map(|i| json!({"name": format!("gpu-{i}")}))
            .collect();
        let slices: Api<ResourceSlice> = Api::all(client.clone());
        slices
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": format!("{NODE}-gpus")},
                    "spec": {
                        "driver": DRIVER,
                        "nodeName": NODE,
                        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                        "devices": devices,
                    },
                }))
                .unwrap(),
            )
            .await
            .unwrap();
        Fixture {
            cluster,
            client,
            identities: cluster.namespace("lp-identities").await,
        }
    }

    /// ServiceAccount `name` bound to ClusterRole rules `cluster` and, in the identities'
    /// namespace, Lease Role rules `lease` (their resource names made the Lease `name`).
    async fn identity(&self, name: &str, cluster: Vec<Value>, lease: Vec<Value>) -> Identity {
        let ns = &self.identities.name;
        let post = PostParams::default();
        let sas: Api<ServiceAccount> = self.identities.api();
        sas.create(
            &post,
            &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
        )
        .await
        .unwrap();
        let subject = json!([{"kind": "ServiceAccount", "name": name, "namespace": ns}]);
        let role_name = format!("lp-{name}");
        let cluster_roles: Api<ClusterRole> = Api::all(self.client.clone());
        cluster_roles
            .create(
                &post,
                &serde_json::from_value(json!({"metadata": {"name": role_name}, "rules": cluster}))
                    .unwrap(),
            )
            .await
            .unwrap();
        let bindings: Api<ClusterRoleBinding> = Api::all(self.client.clone());
        bindings
            .create(
                &post,
                &serde_json::from_value(json!({
                    "metadata": {"name": role_name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
                    "subjects": subject,
                }))
                .unwrap(),
            )
            .await
            .unwrap();
        let lease: Vec<Value> = lease
            .into_iter()
            .map(|mut rule| {
                if rule.get("resourceNames").is_some() {
                    rule["resourceNames"] = json!([name]);
                }
                rule
            })
            .collect();
        let roles: Api<Role> = self.identities.api();
        roles
            .create(
                &post,
                &serde_json::from_value(json!({"metadata": {"name": role_name}, "rules": lease}))
                    .unwrap(),
            )
            .await
            .unwrap();
        let role_bindings: Api<RoleBinding> = self.identities.api();
        role_bindings
            .create(
                &post,
                &serde_json::from_value(json!({
                    "metadata": {"name": role_name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
                    "subjects": subject,
                }))
                .unwrap(),
            )
            .await
            .unwrap();
        let out = run(self.cluster.kubectl().args([
            "create",
            "token",
            name,
            "-n",
            ns,
            "--duration",
            "1h",
        ]));
        let kubeconfig = self.cluster.dir().join(format!("lp-{name}.kubeconfig"));
        token_kubeconfig(
            self.cluster.kubeconfig_path(),
            String::from_utf8(out.stdout).unwrap().trim(),
            &kubeconfig,
        );
        Identity {
            kubeconfig,
            name: name.to_string(),
        }
    }
}

/// A scheduler process (SIGKILLed when dropped) and its log.
struct Daemon {
    child: Child,
    log: PathBuf,
    metrics: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    fn start(fixture: &Fixture<'_>, who: &Identity, scheduler: &str, leader: bool) -> Daemon {
        let port = free_port();
        let log = fixture.cluster.dir().join(format!("lp-{}.log", who.name));
        let child = Command::new(env!("CARGO_BIN_EXE_dra-scheduler"))
            .args(["run", "--kubeconfig"])
            .arg(&who.kubeconfig)
            .args(["--scheduler-name", scheduler])
            .args(["--metrics-bind-address", &format!("127.0.0.1:{port}")])
            .arg(format!("--leader-elect={leader}"))
            .args([
                "--lease-name",
                &who.name,
                "--lease-namespace",
                &fixture.identities.name,
            ])
            .args([
                "--lease-duration-seconds",
                "4",
                "--renew-deadline-seconds",
                "3",
            ])
            .args(["--retry-period-seconds", "1"])
            .env("POD_NAME", &who.name)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start dra-scheduler run");
        Daemon {
            child,
            log,
            metrics: format!("http://127.0.0.1:{port}"),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn logs(&self, text: &str) {
        self.logs_times(text, 1).await;
    }

    async fn logs_times(&self, text: &str, times: usize) {
        eventually(
            &format!("the scheduler to log {text:?} {times} times"),
            HANG,
            || async { (self.log().matches(text).count() >= times).then_some(()) },
        )
        .await;
    }

    async fn status(&self, path: &str) -> Option<u16> {
        let base = self.metrics.clone();
        let path = path.to_string();
        tokio::task::spawn_blocking(move || get(&base, &path).map(|(code, _)| code))
            .await
            .unwrap()
    }
}

/// One run of the scheduler as one identity, with a namespace of its own for its pods.
struct Trial {
    name: String,
    scheduler: String,
    ns: TestNamespace,
    daemon: Daemon,
}

impl Trial {
    async fn start(fixture: &Fixture<'_>, who: &Identity, leader: bool) -> Trial {
        let scheduler = format!("lp-{}", who.name);
        Trial {
            name: who.name.clone(),
            ns: fixture.cluster.namespace(&format!("lp-{}", who.name)).await,
            daemon: Daemon::start(fixture, who, &scheduler, leader),
            scheduler,
        }
    }

    async fn create<K>(&self, object: Value)
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let api: Api<K> = self.ns.api();
        let object: K = serde_json::from_value(object).unwrap();
        api.create(&PostParams::default(), &object).await.unwrap();
    }

    async fn create_cluster<K>(&self, object: Value)
    where
        K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let api: Api<K> = self.ns.cluster_api();
        let object: K = serde_json::from_value(object).unwrap();
        api.create(&PostParams::default(), &object).await.unwrap();
    }

    async fn bound(&self, pod: &str) {
        self.bound_to(pod, NODE).await;
    }

    async fn bound_to(&self, pod: &str, node: &str) {
        let pods: Api<Pod> = self.ns.api();
        eventually(&format!("pod {pod} bound to {node}"), HANG, || async {
            let p = pods.get(pod).await.ok()?;
            (node_of(&p) == Some(node)).then_some(())
        })
        .await;
    }

    async fn unbound(&self, pod: &str) -> bool {
        let pods: Api<Pod> = self.ns.api();
        node_of(&pods.get(pod).await.unwrap()).is_none()
    }

    /// The first event `reason` about `pod` whose note has `text`.
    async fn event(&self, pod: &str, reason: &str, text: &str) -> Event {
        let events: Api<Event> = self.ns.api();
        eventually(
            &format!("a {reason} event about {pod} saying {text:?}"),
            HANG,
            || async {
                let list = events.list(&ListParams::default()).await.ok()?;
                list.items.into_iter().find(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod)
                        && e.reason.as_deref() == Some(reason)
                        && e.note.as_deref().unwrap_or_default().contains(text)
                })
            },
        )
        .await
    }

    /// How the pod's failure saying `text` reached its user: a `FailedScheduling` event
    /// whose note says it, or, where the pod's first `FailedScheduling` said something
    /// else (the daemon saw the pod before its PersistentVolumeClaim), that event's series
    /// counting a repeat while the daemon logs the failure for this pod. client-go's
    /// recorder keys a series by object, type, reason and action, not by the note, and so
    /// does ours: a later failure with another note counts in the first event's series.
    async fn failure_told(&self, pod: &str, text: &str) -> String {
        let events: Api<Event> = self.ns.api();
        let logged = || {
            self.daemon
                .log()
                .lines()
                .any(|line| line.contains(pod) && line.contains(text))
        };
        eventually(
            &format!("a FailedScheduling event about {pod} saying {text:?}, or counting it"),
            HANG,
            || async {
                let list = events.list(&ListParams::default()).await.ok()?;
                let failed = list.items.into_iter().find(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod)
                        && e.reason.as_deref() == Some("FailedScheduling")
                })?;
                let note = failed.note.clone().unwrap_or_default();
                if note.contains(text) {
                    return Some(note);
                }
                let count = failed.series.as_ref().map_or(1, |s| s.count);
                (count >= 2 && logged()).then(|| format!("{note} (x{count}; logged: {text})"))
            },
        )
        .await
    }

    async fn events_about(&self, pod: &str) -> Vec<Event> {
        let events: Api<Event> = self.ns.api();
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod))
            .collect()
    }
}

/// The scheduler with the full roles: every scenario placed, the Lease held, no refusal.
async fn with_every_grant(fixture: &Fixture<'_>, roles: &ChartRoles) {
    let full = fixture
        .identity(
            "full",
            without(&roles.cluster, None),
            without(&roles.lease, None),
        )
        .await;
    // The Lease Role is by name: this identity's own Lease only (create aside).
    let can = |args: &[&str]| {
        let out = fixture
            .cluster
            .kubectl()
            .args(["auth", "can-i"])
            .args(args)
            .args(["-n", &fixture.identities.name])
            .arg(format!(
                "--as=system:serviceaccount:{}:full",
                fixture.identities.name
            ))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    };
    assert!(can(&["update", "leases/full"]) && can(&["get", "leases/full"]));
    assert!(can(&["create", "leases"]));
    assert!(!can(&["update", "leases/someone-else"]) && !can(&["get", "leases/someone-else"]));
    assert!(!can(&["list", "leases"]) && !can(&["delete", "leases/full"]));

    let t = Trial::start(fixture, &full, true).await;
    for s in Scenario::ALL {
        s.create(&t).await;
    }
    for s in Scenario::ALL {
        s.placed(&t).await;
    }
    let leases: Api<Lease> = fixture.identities.api();
    let lease = leases.get("full").await.expect("the scheduler's Lease");
    let holder = lease.spec.unwrap().holder_identity.unwrap_or_default();
    assert!(holder.starts_with("full_"), "the Lease is held by {holder}");
    assert_eq!(t.daemon.status("/readyz").await, Some(200));
    let log = t.daemon.log();
    assert!(
        !log.contains("forbidden"),
        "refused with every grant:\n{log}"
    );
}

/// The scheduler without `g`: the failure that shows `g` is needed. Returns what was seen.
async fn without_grant(fixture: &Fixture<'_>, roles: &ChartRoles, n: usize, g: Grant) -> String {
    let need = need(&g).unwrap();
    let lease_grant = g.resource == "leases";
    let (cluster, lease) = if lease_grant {
        (
            without(&roles.cluster, None),
            without(&roles.lease, Some(&g)),
        )
    } else {
        (
            without(&roles.cluster, Some(&g)),
            without(&roles.lease, None),
        )
    };
    let who = fixture.identity(&format!("t{n:02}"), cluster, lease).await;
    let started = Instant::now();
    let t = Trial::start(fixture, &who, lease_grant).await;
    let refused = refusal(&g);
    let seen = match need {
        Need::List => {
            t.daemon.logs(&refused).await;
            assert_eq!(t.daemon.status("/readyz").await, Some(503), "{g}: ready");
            "never ready".to_string()
        }
        Need::Watch => {
            // Refused, re-listed, refused again: it never hears of a change as it happens.
            t.daemon.logs_times(&refused, 2).await;
            "every watch refused".to_string()
        }
        Need::Placing(s) => {
            s.create(&t).await;
            let told = t.failure_told(s.pod(), &refused).await;
            if !s.may_recover() {
                assert!(t.unbound(s.pod()).await, "{g}: {} placed", s.pod());
            }
            format!("{}: {told}", s.pod())
        }
        Need::Events(s) => {
            s.create(&t).await;
            t.daemon.logs(&refused).await;
            match s {
                Scenario::Claim => {
                    t.bound(s.pod()).await;
                    assert!(
                        t.events_about(s.pod()).await.is_empty(),
                        "{g}: events written"
                    );
                    format!("{} placed without a Scheduled event", s.pod())
                }
                _ => {
                    let events = t.events_about(s.pod()).await;
                    assert!(events.iter().all(|e| e.series.is_none()), "{g}: {events:?}");
                    format!("{}: its second failure not told", s.pod())
                }
            }
        }
        Need::Preempting => {
            let s = Scenario::Preempt;
            s.create(&t).await;
            t.daemon.logs(&refused).await;
            let pods: Api<Pod> = t.ns.api();
            let victim = pods.get("preempt-victim").await.unwrap();
            assert!(
                victim.metadata.deletion_timestamp.is_none(),
                "{g}: the victim was deleted"
            );
            assert!(t.unbound(s.pod()).await, "{g}: {} placed", s.pod());
            "preempt-victim not evicted; preempting waits".to_string()
        }
        Need::GroupCondition => {
            let s = Scenario::Gang;
            s.create(&t).await;
            t.daemon.logs(&refused).await;
            t.bound(s.pod()).await;
            let groups: Api<PodGroup> = t.ns.api();
            let group = groups.get("lp-gang").await.unwrap();
            let conditions = group.status.and_then(|s| s.conditions).unwrap_or_default();
            assert!(conditions.is_empty(), "{g}: {conditions:?}");
            format!("{} placed; its PodGroup has no condition", s.pod())
        }
        Need::Lease => {
            t.daemon.logs(&refused).await;
            if g.verb == "update" {
                // It created the Lease and led, then could not renew it: it stops and exits.
                let mut daemon = t.daemon;
                let exited = eventually("the scheduler to exit", 30, || {
                    let status = daemon.child.try_wait().unwrap();
                    async move { status }
                })
                .await;
                assert!(!exited.success());
                let log = daemon.log();
                assert!(log.contains("lost the leader Lease"), "{log}");
                return format!(
                    "{g}: stopped leading and exited ({:.0?})",
                    started.elapsed()
                );
            }
            let leases: Api<Lease> = fixture.identities.api();
            let lease = leases.get_opt(&who.name).await.unwrap();
            assert!(
                lease.and_then(|l| l.spec?.holder_identity).is_none(),
                "{g}: the Lease is held"
            );
            "never led".to_string()
        }
    };
    format!("{g}: {seen} ({:.0?})", started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_grant_of_the_schedulers_roles_is_needed() {
    let began = Instant::now();
    // OwnerReferencesPermissionEnforcement, off by default and on in some distributions,
    // is what needs pods/finalizers.
    let cluster =
        TestCluster::dedicated_with_admission_plugins("OwnerReferencesPermissionEnforcement");
    let roles = ChartRoles::render();
    let all: BTreeSet<Grant> = grants(&roles.cluster)
        .into_iter()
        .chain(grants(&roles.lease))
        .collect();
    let unexplained: Vec<String> = all
        .iter()
        .filter(|g| need(g).is_none())
        .map(Grant::to_string)
        .collect();
    assert!(
        unexplained.is_empty(),
        "the chart grants what no case here shows needed (remove it from the chart, or add its case): {unexplained:?}"
    );

    let fixture = Fixture::install(&cluster).await;
    with_every_grant(&fixture, &roles).await;
    println!(
        "with every grant: all scenarios placed ({:.0?})",
        began.elapsed()
    );

    let seen: Vec<String> = futures::stream::iter(all.iter().cloned().enumerate())
        .map(|(n, g)| without_grant(&fixture, &roles, n, g))
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    for line in &seen {
        println!("without {line}");
    }
    println!(
        "{} grants, each shown needed; {:.0?} in all",
        seen.len(),
        began.elapsed()
    );
}
