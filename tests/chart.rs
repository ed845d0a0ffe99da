//! The Helm chart `charts/dra-scheduler`: `helm lint` passes, `helm template` renders what
//! the chart promises (and what the daemon accepts), `helm install` is accepted by a real
//! Kubernetes 1.37 API server, and the chart's RBAC is enough for the scheduler: a
//! `dra-scheduler run` authenticated with the chart's ServiceAccount token schedules the
//! first-available example without a single "forbidden".
//!
//! helm is built from Go modules by `tests/chart/build-helm.sh` (once per machine).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};
use test_cluster::{TestCluster, eventually, free_port};

mod common;
use common::{helm, repo, run, token_kubeconfig};

const RELEASE: &str = "dra-scheduler";
const NAMESPACE: &str = "kube-system";

fn chart() -> PathBuf {
    repo().join("charts/dra-scheduler")
}

/// `helm template` of the chart into kube-system with `--set` values, as JSON documents.
fn template(sets: &[&str]) -> Vec<Value> {
    let mut cmd = helm();
    cmd.args(["template", RELEASE]).arg(chart()).args([
        "--namespace",
        NAMESPACE,
        "--kube-version",
        "1.37.2",
    ]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    documents(&String::from_utf8(run(&mut cmd).stdout).unwrap())
}

/// `helm template` that must fail; its error text.
fn template_error(sets: &[&str]) -> String {
    let mut cmd = helm();
    cmd.args(["template", RELEASE]).arg(chart());
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "helm template {sets:?} rendered");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn documents(text: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("rendered YAML parses"))
        .filter(|v| !v.is_null())
        .collect()
}

fn kinds(docs: &[Value]) -> BTreeSet<String> {
    docs.iter()
        .map(|d| d["kind"].as_str().unwrap().to_string())
        .collect()
}

/// The one rendered object of `kind` (named `name` when given).
fn object<'a>(docs: &'a [Value], kind: &str, name: Option<&str>) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && name.is_none_or(|n| d["metadata"]["name"] == n))
        .collect();
    assert_eq!(found.len(), 1, "one {kind} {name:?} in {:?}", kinds(docs));
    found[0]
}

/// The scheduler's config file as the chart's ConfigMap carries it.
fn config_text(docs: &[Value]) -> String {
    object(docs, "ConfigMap", None)["data"]["config.yaml"]
        .as_str()
        .expect("ConfigMap data config.yaml")
        .to_string()
}

fn config(docs: &[Value]) -> Value {
    serde_yaml::from_str(&config_text(docs)).expect("config.yaml parses")
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect()
}

/// The rules of a (Cluster)Role as (apiGroup, resource, verb) triples.
fn grants(role: &Value) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        for g in strings(&rule["apiGroups"]) {
            for r in strings(&rule["resources"]) {
                for v in strings(&rule["verbs"]) {
                    out.insert((g.to_string(), r.to_string(), v.to_string()));
                }
            }
        }
    }
    out
}

fn grant(group: &str, resources: &[&str], verbs: &[&str]) -> Vec<(String, String, String)> {
    resources
        .iter()
        .flat_map(|r| {
            verbs
                .iter()
                .map(move |v| (group.into(), r.to_string(), v.to_string()))
        })
        .collect()
}

#[test]
fn lint_and_render() {
    let out = run(helm().args(["lint", "--strict"]).arg(chart()));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("1 chart(s) linted, 0 chart(s) failed"),
        "{text}"
    );

    let docs = template(&[]);
    let kinds = kinds(&docs);
    for kind in [
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "DaemonSet",
        "DeviceClass",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(kinds.contains(kind), "{kind} not rendered: {kinds:?}");
    }
    assert!(
        !kinds.contains("ServiceMonitor"),
        "ServiceMonitor is opt-in"
    );
    for d in &docs {
        let cluster_scoped = [
            "ClusterRole",
            "ClusterRoleBinding",
            "DeviceClass",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
        .contains(&d["kind"].as_str().unwrap());
        assert_eq!(
            d["metadata"]["namespace"].as_str(),
            (!cluster_scoped).then_some(NAMESPACE),
            "namespace of {} {}",
            d["kind"],
            d["metadata"]["name"]
        );
    }

    // The config file: exactly the keys `dra-scheduler run --config` knows (unknown keys
    // stop the daemon), leader election on, the Lease beside the scheduler.
    let cfg = config(&docs);
    assert_eq!(
        cfg,
        json!({
            "schedulerName": "dra-scheduler",
            "logFormat": "text",
            "v": 0,
            "metricsBindAddress": "0.0.0.0:10261",
            "percentageOfNodesToScore": 0,
            "maxConcurrentBinds": 32,
            "clientQPS": 100,
            "clientBurst": 200,
            "filterTimeoutSeconds": 10,
            "preemption": {"enabled": true},
            "handoff": {"enabled": true, "owners": "same", "marginSeconds": 30, "maxWaitSeconds": 60},
            "degraded": {"intervalSeconds": 10, "upgrade": {"enabled": false, "afterSeconds": 300}},
            "leaderElection": {
                "leaderElect": true,
                "leaseName": "dra-scheduler",
                "leaseNamespace": "kube-system",
                "leaseDurationSeconds": 10,
                "renewDeadlineSeconds": 7,
                "retryPeriodSeconds": 2,
            },
        })
    );

    // The scheduler Deployment.
    let deploy = object(&docs, "Deployment", None);
    assert_eq!(deploy["spec"]["replicas"], 2);
    let pod = &deploy["spec"]["template"]["spec"];
    let sa = pod["serviceAccountName"].as_str().unwrap();
    assert_eq!(sa, "dra-scheduler");
    object(&docs, "ServiceAccount", Some(sa));
    let c = &pod["containers"][0];
    assert_eq!(c["image"], "ghcr.io/dra-scheduler/dra-scheduler:0.1.0");
    assert_eq!(
        strings(&c["args"]),
        ["run", "--config", "/etc/dra-scheduler/config.yaml"]
    );
    assert_eq!(
        c["env"],
        json!([{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}])
    );
    assert_eq!(
        c["ports"],
        json!([{"name": "metrics", "containerPort": 10261, "protocol": "TCP"}])
    );
    assert_eq!(
        c["livenessProbe"]["httpGet"],
        json!({"path": "/healthz", "port": "metrics"})
    );
    assert_eq!(
        c["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": "metrics"})
    );
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert!(c["resources"]["requests"]["cpu"].is_string());
    assert!(c["resources"]["limits"]["memory"].is_string());
    assert_eq!(c["volumeMounts"][0]["mountPath"], "/etc/dra-scheduler");
    let cm_name = &pod["volumes"][0]["configMap"]["name"];
    assert_eq!(
        &object(&docs, "ConfigMap", None)["metadata"]["name"],
        cm_name
    );
    // The Service and the PDB select exactly the scheduler pods.
    let pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .unwrap();
    for selector in [
        &object(&docs, "Service", None)["spec"]["selector"],
        &deploy["spec"]["selector"]["matchLabels"],
        &object(&docs, "PodDisruptionBudget", None)["spec"]["selector"]["matchLabels"],
    ] {
        for (k, v) in selector.as_object().unwrap() {
            assert_eq!(pod_labels.get(k), Some(v), "selector {selector}");
        }
    }
    assert_eq!(
        object(&docs, "PodDisruptionBudget", None)["spec"]["minAvailable"],
        1
    );
    assert_eq!(
        object(&docs, "Service", None)["spec"]["ports"][0]["targetPort"],
        "metrics"
    );

    // RBAC: exactly what the scheduler uses (tests/least_privilege.rs shows each grant is
    // needed), bound to its ServiceAccount.
    let role = object(&docs, "ClusterRole", Some("dra-scheduler"));
    let have = grants(role);
    let rg = "resource.k8s.io";
    let want: BTreeSet<_> = [
        grant("", &["pods", "nodes"], &["get", "list", "watch"]),
        grant(
            "",
            &[
                "namespaces",
                "services",
                "replicationcontrollers",
                "persistentvolumes",
                "persistentvolumeclaims",
            ],
            &["list", "watch"],
        ),
        grant(
            "",
            &["persistentvolumes", "persistentvolumeclaims"],
            &["get", "patch"],
        ),
        grant("apps", &["replicasets", "statefulsets"], &["list", "watch"]),
        grant(
            "storage.k8s.io",
            &[
                "storageclasses",
                "csinodes",
                "csidrivers",
                "volumeattachments",
            ],
            &["list", "watch"],
        ),
        grant("", &["pods"], &["delete"]),
        grant("policy", &["poddisruptionbudgets"], &["list", "watch"]),
        grant("scheduling.k8s.io", &["podgroups"], &["list", "watch"]),
        grant("scheduling.k8s.io", &["podgroups/status"], &["patch"]),
        grant("", &["pods/binding"], &["create"]),
        grant("", &["pods/status"], &["patch"]),
        grant("", &["pods/finalizers"], &["update"]),
        grant("events.k8s.io", &["events"], &["create", "patch"]),
        grant(
            rg,
            &["resourceclaims"],
            &["get", "list", "watch", "create", "patch"],
        ),
        grant(
            rg,
            &["resourceclaims/status", "resourceclaims/binding"],
            &["patch"],
        ),
        grant(
            rg,
            &["resourceslices", "deviceclasses", "devicetaintrules"],
            &["list", "watch"],
        ),
    ]
    .concat()
    .into_iter()
    .collect();
    assert_eq!(have, want, "the scheduler's ClusterRole");
    assert!(!have.iter().any(|(_, r, _)| r == "secrets"), "{have:?}");
    let binding = object(&docs, "ClusterRoleBinding", Some("dra-scheduler"));
    assert_eq!(binding["roleRef"]["name"], "dra-scheduler");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}])
    );
    // The Lease: its own by name, and create, which RBAC cannot limit by name.
    let lease_role = object(&docs, "Role", None);
    assert_eq!(
        lease_role["rules"],
        json!([
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": ["dra-scheduler"], "verbs": ["get", "update"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        ])
    );
    assert_eq!(
        object(&docs, "RoleBinding", None)["roleRef"]["name"],
        lease_role["metadata"]["name"]
    );

    // The node agent: the flags dra-node-agent has, the host paths the kubelet uses.
    let ds = object(&docs, "DaemonSet", None);
    let agent = &ds["spec"]["template"]["spec"];
    let c = &agent["containers"][0];
    assert_eq!(c["image"], "ghcr.io/dra-scheduler/dra-node-agent:0.1.0");
    assert_eq!(
        strings(&c["args"]),
        [
            "run",
            "--driver-name=gpu.nvidia.com",
            "--backend=nvml",
            "--plugin-dir=/var/lib/kubelet/plugins/gpu.nvidia.com",
            "--registry-dir=/var/lib/kubelet/plugins_registry",
            "--cdi-dir=/var/run/cdi",
            "--http-address=0.0.0.0:8080",
            "--rediscover-seconds=10",
            "--log-format=text",
            "--v=0",
            "--driver-root=/driver-root",
        ]
    );
    assert_eq!(
        c["env"],
        json!([{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}])
    );
    // NVML opens the GPUs' device files: privileged, with a read-only root filesystem.
    assert_eq!(
        c["securityContext"],
        json!({"privileged": true, "readOnlyRootFilesystem": true})
    );
    let host_paths: BTreeSet<&str> = agent["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["hostPath"]["path"].as_str().unwrap())
        .collect();
    let mounts: BTreeSet<&str> = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    let expected: BTreeSet<&str> = [
        "/var/lib/kubelet/plugins/gpu.nvidia.com",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
    ]
    .into();
    // The host's driver root (/), read-only at /driver-root, where --driver-root looks.
    let with = |extra: &'static str| {
        let mut set = expected.clone();
        set.insert(extra);
        set
    };
    assert_eq!(host_paths, with("/"));
    assert_eq!(mounts, with("/driver-root"));
    let driver_root = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/driver-root")
        .unwrap();
    assert_eq!(driver_root["readOnly"], true);
    // Critical pods, as the release namespace kube-system allows.
    assert_eq!(agent["priorityClassName"], "system-node-critical");
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(
        agent["nodeSelector"],
        json!({"nvidia.com/gpu.present": "true"})
    );
    let agent_sa = agent["serviceAccountName"].as_str().unwrap();
    assert_eq!(agent_sa, "dra-scheduler-node-agent");
    let agent_role = grants(object(&docs, "ClusterRole", Some(agent_sa)));
    let want_agent: BTreeSet<_> = [
        grant(
            rg,
            &["resourceslices"],
            &["list", "watch", "create", "update", "delete"],
        ),
        grant(rg, &["resourceclaims"], &["get"]),
        grant("", &["nodes"], &["get"]),
    ]
    .concat()
    .into_iter()
    .collect();
    assert_eq!(agent_role, want_agent);
    // Its slice writes are limited to its own node (tests/least_privilege.rs shows it).
    let policy = object(
        &docs,
        "ValidatingAdmissionPolicy",
        Some("dra-scheduler-node-agent-own-node-slices"),
    );
    assert_eq!(
        policy["spec"]["matchConditions"][0]["expression"],
        format!("request.userInfo.username == \"system:serviceaccount:{NAMESPACE}:{agent_sa}\"")
    );
    assert_eq!(
        object(
            &docs,
            "ValidatingAdmissionPolicyBinding",
            Some("dra-scheduler-node-agent-own-node-slices")
        )["spec"],
        json!({"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]})
    );
    // NVIDIA's DeviceClasses: whole GPUs, also behind the device plugin's extended
    // resource, and MIG devices, told apart by the attribute `type` both drivers publish.
    assert_eq!(
        object(&docs, "DeviceClass", Some("gpu.nvidia.com"))["spec"],
        json!({
            "selectors": [{"cel": {"expression": GPU_CLASS_SELECTOR}}],
            "extendedResourceName": "nvidia.com/gpu",
        })
    );
    assert_eq!(
        object(&docs, "DeviceClass", Some("mig.nvidia.com"))["spec"],
        json!({"selectors": [{"cel": {"expression": MIG_CLASS_SELECTOR}}]})
    );
}

/// The ownership policy's expressions, by name (its variables and match conditions).
fn ownership_expressions(docs: &[Value]) -> BTreeMap<String, String> {
    let policy = object(
        docs,
        "ValidatingAdmissionPolicy",
        Some("dra-scheduler-device-ownership"),
    );
    let spec = &policy["spec"];
    spec["matchConditions"]
        .as_array()
        .unwrap()
        .iter()
        .chain(spec["variables"].as_array().unwrap())
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["expression"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn ownership_mode_is_on_by_default_for_the_agents_driver_and_only_the_scheduler_may_allocate() {
    let docs = template(&[]);
    let policy = object(
        &docs,
        "ValidatingAdmissionPolicy",
        Some("dra-scheduler-device-ownership"),
    );
    let rules = &policy["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(rules["resources"], json!(["resourceclaims/status"]));
    assert_eq!(rules["operations"], json!(["UPDATE"]));
    let exprs = ownership_expressions(&docs);
    assert_eq!(
        exprs["not-from-dra-scheduler"],
        format!("request.userInfo.username != \"system:serviceaccount:{NAMESPACE}:dra-scheduler\"")
    );
    assert!(
        exprs["owned"].contains(r#"r.driver in ["gpu.nvidia.com"]"#),
        "{}",
        exprs["owned"]
    );
    assert_eq!(
        object(
            &docs,
            "ValidatingAdmissionPolicyBinding",
            Some("dra-scheduler-device-ownership")
        )["spec"]["validationActions"],
        json!(["Deny"])
    );
    // What is owned is the operator's to say; the account follows serviceAccount.name.
    let docs = template(&[
        "ownership.drivers={gpu.nvidia.com,nic.example.com}",
        "ownership.pools={gpu-node-7}",
        "ownership.deviceClasses={mig.nvidia.com}",
        "serviceAccount.name=placer",
    ]);
    let exprs = ownership_expressions(&docs);
    assert!(exprs["owned"].contains(r#"r.driver in ["gpu.nvidia.com","nic.example.com"]"#));
    assert!(exprs["owned"].contains(r#"r.pool in ["gpu-node-7"]"#));
    assert!(exprs["ownedClass"].contains(r#"in ["mig.nvidia.com"]"#));
    assert!(exprs["not-from-dra-scheduler"].contains(":placer\""));
    let docs = template(&["ownership.enabled=false"]);
    assert!(
        docs.iter()
            .all(|d| d["metadata"]["name"] != "dra-scheduler-device-ownership"),
        "shared mode renders no ownership policy"
    );
}

/// The selectors of NVIDIA's DRA driver's classes gpu.nvidia.com and mig.nvidia.com.
const GPU_CLASS_SELECTOR: &str =
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'";
const MIG_CLASS_SELECTOR: &str =
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'";

#[test]
fn values_change_what_is_rendered() {
    // Opt-ins and opt-outs.
    let docs = template(&[
        "serviceMonitor.enabled=true",
        "nodeAgent.enabled=false",
        "deviceClasses.gpu.create=false",
        "deviceClasses.mig.create=false",
    ]);
    let k = kinds(&docs);
    assert!(k.contains("ServiceMonitor"), "{k:?}");
    assert!(
        !k.contains("DaemonSet") && !k.contains("DeviceClass"),
        "{k:?}"
    );
    let sm = object(&docs, "ServiceMonitor", None);
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
    assert_eq!(
        docs.iter().filter(|d| d["kind"] == "ClusterRole").count(),
        1,
        "no node agent role without the node agent"
    );

    // The upgrade of degraded pods: its settings reach the config file, and only with it on
    // may the scheduler evict pods.
    let scheduler_grants = |docs: &[Value]| {
        let role = docs
            .iter()
            .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "dra-scheduler")
            .expect("the scheduler's ClusterRole");
        grants(role)
    };
    let eviction = (
        "".to_string(),
        "pods/eviction".to_string(),
        "create".to_string(),
    );
    assert!(!scheduler_grants(&template(&[])).contains(&eviction));
    let docs = template(&[
        "config.degraded.upgrade.enabled=true",
        "config.degraded.upgrade.afterSeconds=30",
        "config.handoff.owners=any",
        "config.handoff.maxWaitSeconds=20",
        "config.featureGates.DRADerivedAttributes=true",
    ]);
    assert!(scheduler_grants(&docs).contains(&eviction));
    let cfg = config(&docs);
    assert_eq!(
        cfg["degraded"],
        json!({"intervalSeconds": 10, "upgrade": {"enabled": true, "afterSeconds": 30}})
    );
    assert_eq!(cfg["featureGates"], json!({"DRADerivedAttributes": true}));
    assert_eq!(
        cfg["handoff"],
        json!({"enabled": true, "owners": "any", "marginSeconds": 30, "maxWaitSeconds": 20})
    );
    assert!(
        template_error(&["config.handoff.owners=mine"])
            .contains("config.handoff.owners must be same or any, not \"mine\""),
        "{}",
        template_error(&["config.handoff.owners=mine"])
    );

    // Settings reach the config file; the Lease's Role follows the Lease.
    let docs = template(&[
        "schedulerName=gpu-scheduler",
        "config.logFormat=json",
        "config.v=4",
        "config.maxConcurrentBinds=4",
        "config.clientQPS=20",
        "config.scoring.leastAllocated=1",
        "leaderElection.leaseNamespace=dra-system",
        "leaderElection.leaseDurationSeconds=15",
        "metrics.port=9100",
        "image.tag=v9",
    ]);
    let cfg = config(&docs);
    assert_eq!(cfg["schedulerName"], "gpu-scheduler");
    assert_eq!(cfg["logFormat"], "json");
    assert_eq!(cfg["v"], 4);
    assert_eq!(cfg["maxConcurrentBinds"], 4);
    assert_eq!(cfg["clientQPS"], 20);
    assert_eq!(cfg["scoring"], serde_json::json!({"leastAllocated": 1}));
    let profiled = config(&template(&[
        "config.profile.plugins.score.disabled[0].name=ImageLocality",
    ]));
    let profile = json!({"plugins": {"score": {"disabled": [{"name": "ImageLocality"}]}}});
    assert_eq!(profiled["profile"], profile);
    let read = dra_engine::framework::config::profile_config(&profiled["profile"], "profile")
        .expect("the chart's profile is one the scheduler reads");
    assert!(
        !read
            .profile
            .at(dra_engine::framework::Point::Score)
            .any(|p| p.name == "ImageLocality")
    );
    assert_eq!(cfg["metricsBindAddress"], "0.0.0.0:9100");
    assert_eq!(
        cfg["leaderElection"],
        json!({"leaderElect": true, "leaseName": "gpu-scheduler", "leaseNamespace": "dra-system",
            "leaseDurationSeconds": 15, "renewDeadlineSeconds": 7, "retryPeriodSeconds": 2})
    );
    assert_eq!(
        object(&docs, "Role", None)["metadata"]["namespace"],
        "dra-system"
    );
    assert_eq!(
        object(&docs, "Role", None)["rules"][0]["resourceNames"],
        json!(["gpu-scheduler"])
    );
    assert_eq!(
        object(&docs, "RoleBinding", None)["metadata"]["namespace"],
        "dra-system"
    );
    let c = &object(&docs, "Deployment", None)["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "ghcr.io/dra-scheduler/dra-scheduler:v9");
    assert_eq!(c["ports"][0]["containerPort"], 9100);

    // Each class on its own; no extended resource when its name is empty.
    let docs = template(&[
        "deviceClasses.mig.create=false",
        "deviceClasses.gpu.extendedResourceName=",
    ]);
    let class = object(&docs, "DeviceClass", None);
    assert_eq!(class["metadata"]["name"], "gpu.nvidia.com");
    assert!(
        class["spec"].get("extendedResourceName").is_none(),
        "{class}"
    );
    let docs = template(&["deviceClasses.gpu.create=false"]);
    let class = object(&docs, "DeviceClass", None);
    assert_eq!(class["metadata"]["name"], "mig.nvidia.com");

    // One replica: no PDB (it would block every drain), leader election may be off.
    let docs = template(&["replicaCount=1", "leaderElection.enabled=false"]);
    assert!(!kinds(&docs).contains("PodDisruptionBudget"));
    assert_eq!(config(&docs)["leaderElection"]["leaderElect"], false);
    assert!(
        !kinds(&docs).contains("Role") && !kinds(&docs).contains("RoleBinding"),
        "no Lease access without leader election"
    );

    // The agent's privileges follow its backend: the fake one needs no GPU devices and no
    // driver files, so it runs unprivileged, as root with no capabilities.
    let agent = |sets: &[&str]| {
        let docs = template(sets);
        object(&docs, "DaemonSet", None)["spec"]["template"]["spec"].clone()
    };
    let fake = ["nodeAgent.backend=fake", "nodeAgent.fakeProfile=/p.yaml"];
    let unprivileged = json!({
        "privileged": false,
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": true,
        "seccompProfile": {"type": "RuntimeDefault"},
    });
    let pod = agent(&fake);
    let c = &pod["containers"][0];
    assert_eq!(c["securityContext"], unprivileged);
    assert!(
        !strings(&c["args"])
            .iter()
            .any(|a| a.starts_with("--driver-root"))
    );
    assert!(
        !pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "driver-root"),
        "{pod}"
    );
    // `privileged` overrides the backend's default either way; securityContext adds to it.
    let pod = agent(&[
        "nodeAgent.privileged=false",
        "nodeAgent.securityContext.runAsUser=0",
    ]);
    let mut with_user = unprivileged.clone();
    with_user["runAsUser"] = json!(0);
    assert_eq!(pod["containers"][0]["securityContext"], with_user);
    let pod = agent(&[&fake[..], &["nodeAgent.privileged=true"]].concat());
    assert_eq!(pod["containers"][0]["securityContext"]["privileged"], true);
    // The GPU Operator's driver root; none at all when the runtime brings NVML.
    let pod = agent(&["nodeAgent.driverRoot=/run/nvidia/driver"]);
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "driver-root")
        .unwrap()
        .clone();
    assert_eq!(volume["hostPath"]["path"], "/run/nvidia/driver");
    let pod = agent(&["nodeAgent.driverRoot=", "nodeAgent.runtimeClassName=nvidia"]);
    assert_eq!(pod["runtimeClassName"], "nvidia");
    assert!(
        !strings(&pod["containers"][0]["args"])
            .iter()
            .any(|a| a.starts_with("--driver-root"))
    );
    // Priority classes for a release outside kube-system; the admission policy optional.
    let docs = template(&[
        "priorityClassName=",
        "nodeAgent.priorityClassName=gpu-critical",
        "nodeAgent.sliceAdmissionPolicy.enabled=false",
    ]);
    let spec = |kind| object(&docs, kind, None)["spec"]["template"]["spec"].clone();
    assert!(spec("Deployment").get("priorityClassName").is_none());
    assert_eq!(spec("DaemonSet")["priorityClassName"], "gpu-critical");
    let policies: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .collect();
    assert_eq!(policies.len(), 1, "the ownership policy alone");
    assert_eq!(
        policies[0]["metadata"]["name"],
        "dra-scheduler-device-ownership"
    );

    // Settings that would break the scheduler are refused at render time.
    let e = template_error(&["leaderElection.enabled=false"]);
    assert!(
        e.contains("replicaCount > 1 needs leaderElection.enabled"),
        "{e}"
    );
    let e = template_error(&["config.logFormat=xml"]);
    assert!(e.contains("config.logFormat must be text or json"), "{e}");
    let e = template_error(&[
        "config.scoring.leastAllocated=1",
        "config.profile.plugins.score.disabled[0].name=ImageLocality",
    ]);
    assert!(
        e.contains("config.scoring and config.profile: set the weights in one of them"),
        "{e}"
    );
    // The old single class's values are refused with the keys that replaced them.
    for old in ["deviceClass.create=false", "deviceClass.selector=true"] {
        let e = template_error(&[old]);
        assert!(
            e.contains("the value deviceClass was replaced by deviceClasses.gpu.create")
                && e.contains(
                    "set deviceClasses.gpu.create=false and deviceClasses.mig.create=false"
                ),
            "{e}"
        );
    }
}

/// The Grafana dashboard and the PrometheusRule are opt-ins: neither is rendered by
/// default. On, the dashboard's ConfigMap carries `dashboards/dra-scheduler.json` byte for
/// byte under the label Grafana's sidecar selects, and the PrometheusRule carries the groups
/// of `rules/dra-scheduler.rules.yaml` (the file promtool checks) for the release's job.
#[test]
fn the_dashboard_and_the_alerts_are_rendered_only_when_asked_and_carry_their_files() {
    let docs = template(&[]);
    assert!(
        !kinds(&docs).contains("PrometheusRule"),
        "{:?}",
        kinds(&docs)
    );
    assert_eq!(
        docs.iter().filter(|d| d["kind"] == "ConfigMap").count(),
        1,
        "only the scheduler's config"
    );

    let out = run(helm().args(["lint", "--strict"]).arg(chart()).args([
        "--set",
        "grafanaDashboard.enabled=true",
        "--set",
        "prometheusRule.enabled=true",
    ]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("0 chart(s) failed"), "{text}");

    let dashboard_file =
        std::fs::read_to_string(chart().join("dashboards/dra-scheduler.json")).unwrap();
    let rules_file =
        std::fs::read_to_string(chart().join("rules/dra-scheduler.rules.yaml")).unwrap();
    let docs = template(&[
        "grafanaDashboard.enabled=true",
        "prometheusRule.enabled=true",
    ]);
    let dashboard = object(&docs, "ConfigMap", Some("dra-scheduler-dashboard"));
    assert_eq!(dashboard["metadata"]["namespace"], NAMESPACE);
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        dashboard["data"]["dra-scheduler.json"].as_str(),
        Some(dashboard_file.as_str()),
        "the JSON unchanged"
    );
    let rule = object(&docs, "PrometheusRule", None);
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["metadata"]["namespace"], NAMESPACE);
    let groups: Value = serde_yaml::from_str(&rules_file).unwrap();
    assert_eq!(
        rule["spec"], groups,
        "the release's full name is dra-scheduler, the job the rules file names"
    );

    // Another label for the sidecar, another namespace, another job: every selector of the
    // rules names the job, and nothing else changes.
    let docs = template(&[
        "grafanaDashboard.enabled=true",
        "grafanaDashboard.label=dashboards",
        "grafanaDashboard.labelValue=dra",
        "grafanaDashboard.namespace=monitoring",
        "grafanaDashboard.annotations.grafana_folder=GPUs",
        "prometheusRule.enabled=true",
        "prometheusRule.job=gpu-scheduler",
        "prometheusRule.labels.release=prometheus",
    ]);
    let dashboard = object(&docs, "ConfigMap", Some("dra-scheduler-dashboard"));
    assert_eq!(dashboard["metadata"]["namespace"], "monitoring");
    assert_eq!(dashboard["metadata"]["labels"]["dashboards"], "dra");
    assert!(
        dashboard["metadata"]["labels"]
            .get("grafana_dashboard")
            .is_none()
    );
    assert_eq!(
        dashboard["metadata"]["annotations"]["grafana_folder"],
        "GPUs"
    );
    let rule = object(&docs, "PrometheusRule", None);
    assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");
    let expected = rules_file.replace(r#"job="dra-scheduler""#, r#"job="gpu-scheduler""#);
    assert_ne!(expected, rules_file);
    assert_eq!(
        rule["spec"],
        serde_yaml::from_str::<Value>(&expected).unwrap()
    );

    // Unset, the job follows the full name.
    let docs = template(&["prometheusRule.enabled=true", "fullnameOverride=gpus"]);
    let rule = object(&docs, "PrometheusRule", Some("gpus"));
    let expected = rules_file.replace(r#"job="dra-scheduler""#, r#"job="gpus""#);
    assert_eq!(
        rule["spec"],
        serde_yaml::from_str::<Value>(&expected).unwrap()
    );
}

/// A folder of this test process under the system's temporary folder, empty.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dra-chart-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `docs` as one YAML file of `---` separated documents.
fn write_documents(path: &Path, docs: &[&Value]) {
    let text: String = docs
        .iter()
        .map(|d| format!("---\n{}", serde_yaml::to_string(d).unwrap()))
        .collect();
    std::fs::write(path, text).unwrap();
}

/// `dra-scheduler simulate --output json` on `paths`: the report.
fn simulate(paths: &[PathBuf]) -> Value {
    let out = run(Command::new(env!("CARGO_BIN_EXE_dra-scheduler"))
        .args(["simulate", "--output", "json"])
        .args(paths));
    serde_json::from_slice(&out.stdout).expect("the report is JSON")
}

/// The devices allocated to claim `default/<name>` in a simulate report.
fn allocated<'a>(report: &'a Value, claim: &str) -> Vec<&'a str> {
    let found = report["claims"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["namespace"] == "default" && c["name"] == claim)
        .unwrap_or_else(|| panic!("claim {claim} is not in the report"));
    found["allocation"]["devices"]["results"]
        .as_array()
        .unwrap_or_else(|| panic!("claim {claim} is not allocated: {found}"))
        .iter()
        .map(|r| r["device"].as_str().unwrap())
        .collect()
}

fn placed<'a>(report: &'a Value, pod: &str) -> Option<&'a str> {
    report["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["namespace"] == "default" && p["name"] == pod)
        .unwrap_or_else(|| panic!("pod {pod} is not in the report"))["node"]
        .as_str()
}

/// The rendered DeviceClasses and the node agent's own ResourceSlices of a 4x A100 node
/// (each GPU whole and as every MIG placement), with a MIG instance of gpu-0 in use: a
/// request for gpu.nvidia.com gets an idle whole GPU, never a MIG device, though with a
/// class of every device of the driver it would get the next free MIG placement of gpu-0.
#[test]
fn simulate_with_the_charts_classes_gives_gpu_requests_whole_gpus() {
    let dir = scratch("classes");
    let docs = template(&[]);
    let classes: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "DeviceClass").collect();
    assert_eq!(classes.len(), 2);
    let classes_file = dir.join("classes.yaml");
    write_documents(&classes_file, &classes);

    // The attribute `type` of each device the agent publishes.
    let agent_slices = repo().join("crates/dra-node-agent/profiles/slices/4x-a100-40gb-mig.yaml");
    let slices = documents(&std::fs::read_to_string(&agent_slices).unwrap());
    let device_type = |name: &str| -> String {
        slices
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
            .find(|d| d["name"] == name)
            .unwrap_or_else(|| panic!("the agent publishes no device {name}"))["attributes"]["type"]
            ["string"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} has no string attribute type"))
            .to_string()
    };
    assert_eq!(device_type("gpu-0"), "gpu");
    assert_eq!(device_type("gpu-0-mig-1g5gb-19-1"), "mig");

    let report = simulate(&[
        classes_file,
        agent_slices,
        repo().join("tests/data/chart-classes"),
        repo().join("examples/extended-resource/workload.yaml"),
    ]);
    for pod in ["trainer", "inference", "legacy-cuda"] {
        assert_eq!(placed(&report, pod), Some("a100-node"), "{pod}");
    }
    // One gpu.nvidia.com device: a whole GPU, and not gpu-0, part of which is in use.
    let gpu = allocated(&report, "trainer-gpu");
    assert_eq!(gpu.len(), 1);
    assert_eq!(device_type(gpu[0]), "gpu", "trainer got {gpu:?}");
    assert_ne!(gpu[0], "gpu-0");
    // One mig.nvidia.com device: a MIG placement.
    let mig = allocated(&report, "inference-mig");
    assert_eq!(mig.len(), 1);
    assert_eq!(device_type(mig[0]), "mig", "inference got {mig:?}");
    // The device plugin's `nvidia.com/gpu: 1`, through the class's extendedResourceName: a
    // whole GPU too.
    let legacy = allocated(&report, "legacy-cuda-extended-resources");
    assert_eq!(legacy.len(), 1);
    assert_eq!(device_type(legacy[0]), "gpu", "legacy-cuda got {legacy:?}");
    assert!(!legacy.contains(&"gpu-0") && !legacy.contains(&gpu[0]));

    // The extended-resource example with the chart's classes in place of its own.
    let example = repo().join("examples/extended-resource");
    let fleet = documents(&std::fs::read_to_string(example.join("fleet.yaml")).unwrap());
    let fleet: Vec<&Value> = fleet
        .iter()
        .filter(|d| d["kind"] != "DeviceClass")
        .collect();
    let fleet_file = dir.join("fleet.yaml");
    write_documents(&fleet_file, &fleet);
    let report = simulate(&[
        dir.join("classes.yaml"),
        fleet_file,
        example.join("workload.yaml"),
    ]);
    assert_eq!(placed(&report, "legacy-cuda"), Some("gpu-node-1"));
    assert_eq!(
        allocated(&report, "legacy-cuda-extended-resources"),
        ["gpu-0"]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The examples' classes gpu.nvidia.com and mig.nvidia.com select what the chart's do,
/// so what `simulate` says of an example holds for a cluster with the chart installed.
#[test]
fn the_examples_classes_are_the_charts() {
    let docs = template(&[]);
    let chart_class = |name: &str| &object(&docs, "DeviceClass", Some(name))["spec"];
    let mut seen = BTreeSet::new();
    for example in std::fs::read_dir(repo().join("examples")).unwrap() {
        let example = example.unwrap().path();
        if !example.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(&example).unwrap() {
            let file = file.unwrap().path();
            if file.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            for d in documents(&std::fs::read_to_string(&file).unwrap()) {
                let name = d["metadata"]["name"].as_str().unwrap_or_default();
                if d["kind"] != "DeviceClass" || !name.ends_with(".nvidia.com") {
                    continue;
                }
                let chart = chart_class(name);
                assert_eq!(
                    d["spec"]["selectors"],
                    chart["selectors"],
                    "{}: DeviceClass {name}",
                    file.display()
                );
                if let Some(extended) = d["spec"].get("extendedResourceName") {
                    assert_eq!(
                        extended,
                        &chart["extendedResourceName"],
                        "{}",
                        file.display()
                    );
                }
                seen.insert(name.to_string());
            }
        }
    }
    assert_eq!(
        seen,
        BTreeSet::from(["gpu.nvidia.com".into(), "mig.nvidia.com".into()])
    );
}

/// A scheduler process, stopped when dropped; its log is shown when the test fails.
struct Daemon {
    child: std::process::Child,
    log: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("--- dra-scheduler log ({}) ---\n{log}", self.log.display());
        }
    }
}

fn http_status(url: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", url])
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installs_and_its_rbac_is_enough_to_schedule() {
    let cluster = TestCluster::dedicated();
    let work = cluster.dir().join("chart-test");
    std::fs::create_dir_all(&work).unwrap();

    // `helm install` as the chart README says: the real API server accepts every object.
    let out = run(helm()
        .args(["install", RELEASE])
        .arg(chart())
        .args(["--namespace", NAMESPACE, "--kubeconfig"])
        .arg(cluster.kubeconfig_path()));
    let notes = String::from_utf8_lossy(&out.stdout);
    assert!(notes.contains("STATUS: deployed"), "{notes}");
    assert!(notes.contains("schedulerName: dra-scheduler"), "{notes}");
    let client = cluster.client().await;
    let deploy = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .get("dra-scheduler")
        .await
        .expect("the chart's Deployment");
    assert_eq!(deploy.spec.replicas, Some(2));
    Api::<DaemonSet>::namespaced(client.clone(), NAMESPACE)
        .get("dra-scheduler-node-agent")
        .await
        .expect("the chart's DaemonSet");
    let classes = Api::<DeviceClass>::all(client.clone());
    let gpu_class = classes
        .get("gpu.nvidia.com")
        .await
        .expect("the chart's DeviceClass gpu.nvidia.com");
    assert_eq!(
        gpu_class
            .spec
            .and_then(|s| s.extended_resource_name)
            .as_deref(),
        Some("nvidia.com/gpu"),
        "the API server kept extendedResourceName (DRAExtendedResource is on)"
    );
    classes
        .get("mig.nvidia.com")
        .await
        .expect("the chart's DeviceClass mig.nvidia.com");

    // The scheduler's identity is the chart's ServiceAccount, through a real token.
    let out = run(cluster.kubectl().args([
        "create",
        "token",
        "dra-scheduler",
        "-n",
        NAMESPACE,
        "--duration",
        "1h",
    ]));
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let sa_kubeconfig = work.join("sa.kubeconfig");
    token_kubeconfig(cluster.kubeconfig_path(), &token, &sa_kubeconfig);
    let kubectl_as_sa = || {
        let mut cmd = Command::new(cluster.binary("kubectl"));
        cmd.arg("--kubeconfig").arg(&sa_kubeconfig);
        cmd
    };
    let whoami = run(kubectl_as_sa().args([
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
    ]));
    assert_eq!(
        String::from_utf8_lossy(&whoami.stdout),
        "system:serviceaccount:kube-system:dra-scheduler"
    );
    // The identity is really limited: the test below would prove nothing with admin rights.
    let secrets = kubectl_as_sa()
        .args(["get", "secrets", "-n", NAMESPACE])
        .output()
        .unwrap();
    assert!(!secrets.status.success());
    assert!(
        String::from_utf8_lossy(&secrets.stderr).contains("forbidden"),
        "{}",
        String::from_utf8_lossy(&secrets.stderr)
    );

    // Run the scheduler as that ServiceAccount with the chart's own config file (the flag
    // moves the metrics port to a free loopback one; a flag wins over the file).
    let docs = template(&[]);
    let config_path = work.join("config.yaml");
    std::fs::write(&config_path, config_text(&docs)).unwrap();
    let log_path = work.join("scheduler.log");
    let port = free_port();
    let _daemon = Daemon {
        child: Command::new(env!("CARGO_BIN_EXE_dra-scheduler"))
            .args(["run", "--kubeconfig"])
            .arg(&sa_kubeconfig)
            .arg("--config")
            .arg(&config_path)
            .args(["--metrics-bind-address", &format!("127.0.0.1:{port}")])
            .env("POD_NAME", "dra-scheduler-chart-test")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .expect("start dra-scheduler run"),
        log: log_path.clone(),
    };

    run(cluster
        .kubectl()
        .args(["apply", "-f"])
        .arg(repo().join("examples/first-available")));

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let bound = eventually("both inference pods bound", 120, || async {
        let list = pods.list(&ListParams::default()).await.ok()?.items;
        let bound: Vec<Pod> = list
            .into_iter()
            .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
            .collect();
        (bound.len() == 2).then_some(bound)
    })
    .await;
    for p in &bound {
        assert_eq!(
            p.spec.as_ref().unwrap().node_name.as_deref(),
            Some("gpu-node-1")
        );
    }

    // The claims were written through the ServiceAccount: allocated and reserved for the pods.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let mut devices = BTreeSet::new();
    for claim in claims.list(&ListParams::default()).await.unwrap() {
        let status = claim.status.expect("claim status");
        let allocation = status.allocation.expect("claim allocated");
        for r in allocation.devices.unwrap().results.unwrap_or_default() {
            devices.insert(r.device);
        }
        assert_eq!(status.reserved_for.map(|r| r.len()), Some(1));
    }
    assert!(devices.contains("gpu-0"), "the A5000 is taken: {devices:?}");
    assert_eq!(devices.len(), 2, "{devices:?}");

    // Events, the leader's Lease and the probe endpoints the chart points the kubelet at.
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    eventually("Scheduled events", 30, || async {
        let list = events.list(&ListParams::default()).await.ok()?.items;
        (list
            .iter()
            .filter(|e| e.reason.as_deref() == Some("Scheduled"))
            .count()
            >= 2)
            .then_some(())
    })
    .await;
    let lease = Api::<Lease>::namespaced(client.clone(), NAMESPACE)
        .get("dra-scheduler")
        .await
        .unwrap_or_else(|e| panic!("the leader's Lease kube-system/dra-scheduler: {e}"));
    assert!(
        lease.spec.and_then(|s| s.holder_identity).is_some(),
        "the Lease has a holder"
    );
    for path in ["/healthz", "/readyz", "/metrics"] {
        let url = format!("http://127.0.0.1:{port}{path}");
        assert_eq!(http_status(&url).as_deref(), Some("200"), "{url}");
    }

    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "the scheduler was refused something with the chart's RBAC:\n{log}"
    );
}

/// The `docker build` / `docker buildx build` commands in `text` (comment markers and
/// line continuations removed) as (target, image reference) pairs.
fn docker_builds(text: &str) -> Vec<(String, String)> {
    let joined = text
        .lines()
        .map(|l| l.trim_start_matches('#').trim())
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\\n", " ");
    let mut builds = Vec::new();
    for line in joined.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if !(words.starts_with(&["docker", "build"])
            || words.starts_with(&["docker", "buildx", "build"]))
        {
            continue;
        }
        let after = |flag: &str| {
            let i = words.iter().position(|w| *w == flag);
            let value = i.and_then(|i| words.get(i + 1));
            value
                .unwrap_or_else(|| panic!("no {flag} in `{line}`"))
                .to_string()
        };
        builds.push((after("--target"), after("-t")));
    }
    builds
}

/// The `USER` of each `FROM ... AS <stage>` of the Dockerfile that sets one.
fn dockerfile_users(text: &str) -> Vec<(String, String)> {
    let mut stage = String::new();
    let mut users = Vec::new();
    for line in text.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["FROM", _, "AS", name] => stage = name.to_string(),
            ["USER", user] => users.push((stage.clone(), user.to_string())),
            _ => {}
        }
    }
    users
}

#[test]
fn the_chart_names_the_images_the_dockerfile_builds() {
    let read = |p: &str| std::fs::read_to_string(repo().join(p)).unwrap();
    // The local build's references: ghcr.io/dra-scheduler/<target>:<crate version>.
    let out = run(Command::new("bash")
        .arg(repo().join("images/build-local.sh"))
        .arg("--list"));
    let local: BTreeSet<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        local,
        BTreeSet::from([
            format!("ghcr.io/dra-scheduler/dra-scheduler:{version}"),
            format!("ghcr.io/dra-scheduler/dra-node-agent:{version}"),
        ])
    );

    // The README's and the Dockerfile's docker commands tag the same references, each built
    // from the Dockerfile stage named like its repository.
    let dockerfile = read("Dockerfile");
    for (source, text) in [
        ("README.md", read("README.md")),
        ("Dockerfile", dockerfile.clone()),
    ] {
        let builds = docker_builds(&text);
        let refs: BTreeSet<String> = builds.iter().map(|(_, r)| r.clone()).collect();
        assert_eq!(refs, local, "the docker build commands in {source}");
        for (target, r) in &builds {
            assert!(
                r.contains(&format!("/{target}:")),
                "{source}: --target {target} tagged {r}"
            );
            assert!(
                dockerfile.contains(&format!(" AS {target}\n")),
                "{source}: no stage {target} in the Dockerfile"
            );
        }
    }

    // The chart's defaults: appVersion is the crate version, and helm template names the
    // references the builds make.
    let chart_yaml: Value = serde_yaml::from_str(&read("charts/dra-scheduler/Chart.yaml")).unwrap();
    assert_eq!(chart_yaml["appVersion"], version);
    let docs = template(&[]);
    let images: BTreeSet<String> = ["Deployment", "DaemonSet"]
        .iter()
        .map(|kind| {
            let pod = &object(&docs, kind, None)["spec"]["template"]["spec"];
            pod["containers"][0]["image"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(images, local);

    // The scheduler image's user is the one the chart's runAsNonRoot pod runs as; the
    // agent's is root.
    let pod_security =
        &object(&docs, "Deployment", None)["spec"]["template"]["spec"]["securityContext"];
    let chart_user = format!(
        "{}:{}",
        pod_security["runAsUser"], pod_security["runAsGroup"]
    );
    assert_eq!(
        dockerfile_users(&dockerfile),
        [
            ("dra-scheduler".to_string(), chart_user),
            ("dra-node-agent".to_string(), "0:0".to_string()),
        ],
        "the Dockerfile's USER of each image stage"
    );
}
