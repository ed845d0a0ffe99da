//! The A5000/T10 rollout on a real Kubernetes 1.37 control plane, with the real
//! kube-controller-manager (Deployment, ReplicaSet and ResourceClaim controllers): a
//! Deployment "an A5000, else a T10", one replica, RollingUpdate with `maxSurge: 0` (the old
//! pod is deleted first, so its replacement is created while it terminates).
//! - `kubectl rollout restart`: dra-scheduler's replacement waits (WaitingForDevice) and
//!   gets the A5000 once the old pod is gone; kube-scheduler 1.37's gets the T10;
//! - an old pod that does not finish: the replacement takes the T10 when the bound passes;
//! - the opt-out annotation: the T10 at once; the pod is then degraded (gauge 1, condition
//!   `dra-scheduler.io/PreferredDevice=False`); a PodDisruptionBudget refuses the upgrade's
//!   eviction; without it the upgrade evicts the pod and its replacement gets the A5000
//!   (gauge 0).
//!
//! These control planes have no kubelet: a deleted pod bound to a node stays Terminating
//! until its kubelet confirms it stopped. The tests confirm it (a delete with grace period
//! 0, what the kubelet's final delete does) where the scenario says the old pod finished.
//! `tests/node_e2e.rs` runs the rollout on a real node, where kubelet does it.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use test_cluster::{TestCluster, eventually};

mod common;
use common::{
    Daemon, apply, devices, events_about, kubectl_apply_text, kubectl_ok, node_of, scrape,
    start_scheduler_with,
};

const A5000: &str = "gpu-0";

/// The Deployment `name` for `scheduler`: one replica, the old pod deleted before its
/// replacement is created, a grace period the test's "kubelet" never honours by itself.
fn deployment(name: &str, scheduler: &str, opt_out: bool) -> String {
    let annotations = if opt_out {
        "\n      annotations: {dra-scheduler.io/handoff-wait: \"false\"}"
    } else {
        ""
    };
    format!(
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: a5000-else-t10}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        firstAvailable:
        - name: a5000
          deviceClassName: gpu.nvidia.com
          selectors:
          - cel: {{expression: 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA RTX A5000"'}}
        - name: t10
          deviceClassName: gpu.nvidia.com
          selectors:
          - cel: {{expression: 'device.attributes["gpu.nvidia.com"].productName == "Tesla T10"'}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}}}
spec:
  replicas: 1
  strategy:
    type: RollingUpdate
    rollingUpdate: {{maxSurge: 0, maxUnavailable: 1}}
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}{annotations}
    spec:
      schedulerName: {scheduler}
      terminationGracePeriodSeconds: 600
      resourceClaims: [{{name: gpu, resourceClaimTemplateName: a5000-else-t10}}]
      containers:
      - name: server
        image: busybox
        resources: {{claims: [{{name: gpu}}]}}
"#
    )
}

/// A scheduler config file in the cluster's folder.
fn config(cluster: &TestCluster, text: &str) -> String {
    let path = cluster.dir().join("handoff-config.yaml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

struct Rollout {
    client: kube::Client,
    pods: Api<Pod>,
    claims: Api<ResourceClaim>,
}

impl Rollout {
    async fn new(cluster: &TestCluster) -> Rollout {
        let client = cluster.client().await;
        Rollout {
            pods: Api::namespaced(client.clone(), "default"),
            claims: Api::namespaced(client.clone(), "default"),
            client,
        }
    }

    async fn of(&self, app: &str) -> Vec<Pod> {
        let selector = ListParams::default().labels(&format!("app={app}"));
        self.pods.list(&selector).await.unwrap().items
    }

    /// The device (`gpu-N`) of the pod's claim, once the pod is bound.
    async fn device(&self, pod: &Pod) -> Option<String> {
        node_of(pod)?;
        let claim = pod
            .status
            .as_ref()?
            .resource_claim_statuses
            .as_ref()?
            .first()?
            .resource_claim_name
            .clone()?;
        let claim = self.claims.get(&claim).await.ok()?;
        devices(&claim)
            .first()
            .map(|(_, d)| d.rsplit('/').next().unwrap().to_string())
    }

    /// The one running (not terminating) pod of `app`, bound, and its device.
    async fn running(&self, app: &str, seconds: u64) -> (String, String) {
        eventually(&format!("a bound pod of {app}"), seconds, || async {
            for pod in self.of(app).await {
                if pod.metadata.deletion_timestamp.is_none()
                    && let Some(device) = self.device(&pod).await
                {
                    return Some((pod.metadata.name.unwrap(), device));
                }
            }
            None
        })
        .await
    }

    /// `kubectl rollout restart`; returns the replacement's name once it exists, with the
    /// old pod terminating.
    async fn restart(&self, cluster: &TestCluster, app: &str, old: &str) -> String {
        kubectl_ok(
            cluster,
            &["rollout", "restart", &format!("deployment/{app}")],
        );
        eventually(&format!("the replacement of {old}"), 60, || async {
            let pods = self.of(app).await;
            let old_terminating = pods.iter().any(|p| {
                p.metadata.name.as_deref() == Some(old) && p.metadata.deletion_timestamp.is_some()
            });
            let new = pods
                .iter()
                .find(|p| p.metadata.name.as_deref() != Some(old))?;
            old_terminating.then(|| new.metadata.name.clone().unwrap())
        })
        .await
    }

    /// What the old pod's kubelet does once its containers stopped.
    async fn confirm_stopped(&self, pod: &str) {
        let _ = self
            .pods
            .delete(pod, &DeleteParams::default().grace_period(0))
            .await;
    }

    async fn events(&self, pod: &str) -> Vec<String> {
        events_about(&self.client, pod).await
    }
}

fn metric_line(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// A cluster with the A5000/T10 node, dra-scheduler with the config `yaml`, and the
/// Deployment `web` (opted out of the wait when `opt_out`) whose first pod got the A5000.
async fn first_on_the_a5000(yaml: &str, opt_out: bool) -> (TestCluster, Daemon, Rollout, String) {
    let cluster = TestCluster::dedicated();
    let file = config(&cluster, yaml);
    let daemon = start_scheduler_with(&cluster, &["--config", &file]);
    apply(&cluster, &["examples/first-available/fleet.yaml"]);
    let r = Rollout::new(&cluster).await;
    kubectl_apply_text(
        &cluster,
        "web",
        deployment("web", "dra-scheduler", opt_out).as_bytes(),
    );
    let (first, device) = r.running("web", 90).await;
    assert_eq!(device, A5000, "the first pod gets the A5000");
    (cluster, daemon, r, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollouts_replacement_waits_for_the_a5000_where_kube_scheduler_gives_it_the_t10() {
    let (cluster, daemon, r, first) =
        first_on_the_a5000("handoff: {maxWaitSeconds: 15}\n", false).await;

    // The rollout: the replacement waits for the A5000 while the old pod terminates...
    let second = r.restart(&cluster, "web", &first).await;
    let told = eventually("the replacement to say what it waits for", 30, || async {
        r.events(&second)
            .await
            .into_iter()
            .find(|e| e.starts_with("WaitingForDevice"))
    })
    .await;
    println!("{second}: {told}");
    assert!(
        told.contains("gpu.nvidia.com/gpu-node-1/gpu-0")
            && told.contains("a5000 instead of t10")
            && told.contains(&format!("held by terminating pod default/{first}"))
            && told.contains("waiting up to 1"),
        "{told}"
    );
    let waiting = r.pods.get(&second).await.unwrap();
    assert_eq!(node_of(&waiting), None, "placed while it should wait");
    // ... and gets it once the old pod is gone and its claim released.
    tokio::time::sleep(Duration::from_secs(2)).await;
    r.confirm_stopped(&first).await;
    let (placed, device) = r.running("web", 30).await;
    assert_eq!((placed.as_str(), device.as_str()), (second.as_str(), A5000));

    // An old pod that does not finish: the replacement waits for the bound (15 s), then
    // takes the T10.
    let started = Instant::now();
    let third = r.restart(&cluster, "web", &second).await;
    let (placed, device) = r.running("web", 60).await;
    let waited = started.elapsed();
    assert_eq!(
        (placed.as_str(), device.as_str()),
        (third.as_str(), "gpu-1")
    );
    assert!(waited >= Duration::from_secs(14), "placed after {waited:?}");
    println!("{third}: T10 after {waited:?}, the old pod {second} still terminating");
    let text = scrape(&daemon.metrics).await.unwrap();
    let outcome = |o: &str| {
        metric_line(
            &text,
            &format!("dra_scheduler_handoff_waits_total{{outcome=\"{o}\"}}"),
        )
    };
    assert_eq!(
        (outcome("handed_off"), outcome("expired")),
        (1.0, 1.0),
        "{text}"
    );

    // The same rollout under kube-scheduler 1.37: the replacement gets the T10.
    kubectl_ok(&cluster, &["delete", "deployment", "web"]);
    for pod in r.of("web").await {
        r.confirm_stopped(pod.metadata.name.as_deref().unwrap())
            .await;
    }
    eventually("web's claims to go", 60, || async {
        r.claims
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    cluster
        .start_reference_scheduler("default-scheduler")
        .expect("kube-scheduler as default-scheduler");
    kubectl_apply_text(
        &cluster,
        "ref",
        deployment("ref", "default-scheduler", false).as_bytes(),
    );
    let (first_ref, device) = r.running("ref", 90).await;
    assert_eq!(device, A5000);
    let second_ref = r.restart(&cluster, "ref", &first_ref).await;
    let (placed, device_ref) = r.running("ref", 60).await;
    assert_eq!(placed, second_ref);
    assert_eq!(
        device_ref, "gpu-1",
        "kube-scheduler gives the replacement the T10"
    );
    println!("| scheduler | the rollout's replacement gets |");
    println!("|---|---|");
    println!("| dra-scheduler | {A5000} (NVIDIA RTX A5000), after the old pod is gone |");
    println!("| kube-scheduler v1.37.2 | {device_ref} (Tesla T10), at once |");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opted_out_pod_takes_the_t10_is_degraded_and_the_upgrade_moves_it_to_the_a5000() {
    let config = "degraded: {intervalSeconds: 1, upgrade: {enabled: true, afterSeconds: 3}}\n";
    let (cluster, daemon, r, first) = first_on_the_a5000(config, true).await;

    // Opted out: the replacement takes the T10 while the old pod still holds the A5000.
    let second = r.restart(&cluster, "web", &first).await;
    let (placed, device) = r.running("web", 30).await;
    assert_eq!(
        (placed.as_str(), device.as_str()),
        (second.as_str(), "gpu-1")
    );
    let old = r.pods.get(&first).await.unwrap();
    assert!(
        old.metadata.deletion_timestamp.is_some(),
        "the old pod still terminates"
    );
    assert!(
        !r.events(&second)
            .await
            .iter()
            .any(|e| e.starts_with("WaitingForDevice"))
    );

    // A PodDisruptionBudget that allows no disruption (the test cluster runs no disruption
    // controller, so it never allows one) holds the upgrade back until it is deleted. The
    // Eviction API ignores budgets for Pending pods: the pod is reported Running, as its
    // kubelet would.
    kubectl_ok(
        &cluster,
        &[
            "patch",
            "pod",
            &second,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status": {"phase": "Running"}}"#,
        ],
    );
    kubectl_apply_text(
        &cluster,
        "pdb",
        b"apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: web}\nspec:\n  minAvailable: 1\n  selector: {matchLabels: {app: web}}\n",
    );

    // The old pod goes: the A5000 is free, the pod on the T10 is degraded.
    r.confirm_stopped(&first).await;
    let gauge = "dra_scheduler_degraded_pods{namespace=\"default\",owner=\"Deployment/web\"}";
    eventually("the degraded gauge at 1", 30, || async {
        let text = scrape(&daemon.metrics).await?;
        (metric_line(&text, gauge) == 1.0).then_some(())
    })
    .await;
    let condition = eventually("the PreferredDevice condition", 30, || async {
        let pod = r.pods.get(&second).await.ok()?;
        pod.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "dra-scheduler.io/PreferredDevice")
    })
    .await;
    assert_eq!(condition.status, "False");
    assert_eq!(condition.reason.as_deref(), Some("LowerRankedDevice"));
    let message = condition.message.unwrap_or_default();
    assert!(
        message.contains("a5000 instead of t10")
            && message.contains("gpu.nvidia.com/gpu-node-1/gpu-0"),
        "{message}"
    );

    // The budget refuses the upgrade's eviction; the pod stays.
    eventually("the budget to refuse an eviction", 30, || async {
        let text = scrape(&daemon.metrics).await?;
        let blocked = "dra_scheduler_upgrade_evictions_total{result=\"blocked\"}";
        (metric_line(&text, blocked) >= 1.0).then_some(())
    })
    .await;
    let kept = r.pods.get(&second).await.unwrap();
    assert!(
        kept.metadata.deletion_timestamp.is_none(),
        "evicted despite the budget"
    );
    kubectl_ok(&cluster, &["delete", "poddisruptionbudget", "web"]);

    // Without it, the upgrade evicts the pod; its replacement gets the A5000, the gauge
    // reads 0.
    eventually("the upgrade to evict the degraded pod", 30, || async {
        let pod = r.pods.get(&second).await.ok()?;
        pod.metadata.deletion_timestamp.is_some().then_some(())
    })
    .await;
    let evicted = r.events(&second).await;
    assert!(
        evicted
            .iter()
            .any(|e| e.starts_with("UpgradeEviction: evicting pod default/")),
        "{evicted:?}"
    );
    let (third, device) = r.running("web", 30).await;
    assert_eq!(device, A5000, "the upgrade's replacement {third}");
    r.confirm_stopped(&second).await;
    eventually("the degraded gauge at 0", 30, || async {
        let text = scrape(&daemon.metrics).await?;
        (text.contains(gauge) && metric_line(&text, gauge) == 0.0).then_some(())
    })
    .await;
    let text = scrape(&daemon.metrics).await.unwrap();
    assert_eq!(
        metric_line(
            &text,
            "dra_scheduler_upgrade_evictions_total{result=\"evicted\"}"
        ),
        1.0
    );
}
