//! The chart's ValidatingAdmissionPolicy against a real kube-apiserver 1.37: the agent's
//! ServiceAccount, with the token of a pod on node A, creates, updates and deletes node A's
//! ResourceSlices and is refused every write to node B's (with the policy's message), also
//! when the agent's own publisher is pointed at node B; a token bound to no node writes
//! nothing; other users are not affected. Of its own node's slices, it writes only those of
//! its own pool (named after the node) and its own driver: a slice of node A that names
//! node B's pool, which the scheduler would count against node B's devices, is refused when
//! created, when an own slice is changed to it, and when deleted. The chart's agent RBAC and
//! policy are rendered with helm (`tests/chart/build-helm.sh` builds it from Go modules).

mod common;

use common::*;
use dra_node_agent::backend::fake::FakeBackend;
use dra_node_agent::health::HealthState;
use dra_node_agent::publisher::{Publisher, PublisherConfig, SyncOutcome};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use test_cluster::{TestCluster, TestNamespace, eventually, repo_root, server_message};

/// Run to success; its standard output.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The chart's node agent RBAC and admission policy for release `release` in `namespace`.
fn render_agent_policy(release: &str, namespace: &str) -> String {
    let helm = run(Command::new("bash").arg(repo_root().join("tests/chart/build-helm.sh")));
    let home = std::env::temp_dir().join(format!("dra-admission-test-helm-{}", std::process::id()));
    run(Command::new(helm.trim())
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .args(["template", release])
        .arg(repo_root().join("charts/dra-scheduler"))
        .args(["--namespace", namespace, "--kube-version", "1.37.2"])
        .args(["--show-only", "templates/node-agent-rbac.yaml"])
        .args(["--show-only", "templates/node-agent-admission-policy.yaml"]))
}

/// A kubeconfig file for the cluster whose user is `token`.
fn token_kubeconfig(cluster: &TestCluster, token: &str, path: &Path) {
    let text = std::fs::read_to_string(cluster.kubeconfig_path()).unwrap();
    let mut kc: Value = serde_yaml::from_str(&text).unwrap();
    kc["users"] = json!([{"name": "token", "user": {"token": token}}]);
    for ctx in kc["contexts"].as_array_mut().unwrap() {
        ctx["context"]["user"] = json!("token");
    }
    std::fs::write(path, serde_json::to_vec(&kc).unwrap()).unwrap();
}

async fn client_from(path: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// A slice of `node`'s pool with one device, at `generation`.
fn slice(name: &str, node: &str, generation: i64) -> ResourceSlice {
    slice_of(name, node, node, DRIVER, generation)
}

/// A slice of node `node` in pool `pool` of `driver`, with one device, at `generation`.
fn slice_of(name: &str, node: &str, pool: &str, driver: &str, generation: i64) -> ResourceSlice {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }))
    .unwrap()
}

/// The message of a refused request; panics (at the caller) when it was not refused as
/// Forbidden.
#[track_caller]
fn forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 => s.message,
        other => panic!("expected 403 Forbidden, got {other:?}"),
    }
}

/// The pod's ServiceAccount token, bound to the pod (and so to its node).
fn pod_token(cluster: &TestCluster, ns: &str, sa: &str, pod: &str) -> String {
    run(cluster.kubectl().args([
        "create",
        "token",
        sa,
        "-n",
        ns,
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        pod,
    ]))
    .trim()
    .to_string()
}

/// The agent's publisher of the fake profile `1x-a5000-2x-t10`, told it runs on `node`.
fn publisher(agent: &kube::Client, node: &str) -> Publisher {
    Publisher::new(
        agent.clone(),
        PublisherConfig {
            driver: DRIVER.into(),
            node_name: node.into(),
            rediscover_every: Duration::from_secs(60),
        },
        Arc::new(FakeBackend::from_file(profile("1x-a5000-2x-t10.yaml")).unwrap()),
        Arc::new(RwLock::new(Vec::new())),
        HealthState::default(),
    )
}

/// Two Nodes, A and B, and the chart's agent objects of a new release, as helm installs
/// them; the agent's pod on node A and a client with its pod-bound token, once the API
/// server enforces the release's policy.
struct AgentOnA {
    cluster: &'static TestCluster,
    admin: kube::Client,
    ns: TestNamespace,
    release: String,
    node_a: String,
    node_b: String,
    /// The agent's ServiceAccount.
    sa: String,
    dir: tempfile::TempDir,
    /// The agent's client, with the token of its pod on node A.
    agent: kube::Client,
}

impl AgentOnA {
    async fn install(prefix: &str) -> AgentOnA {
        let cluster = TestCluster::shared();
        let admin = cluster.client().await;
        let ns = cluster.namespace("agent-admission").await;
        let release = unique(prefix);
        let (node_a, node_b) = (format!("{release}-a"), format!("{release}-b"));
        create_node(&admin, &node_a).await;
        create_node(&admin, &node_b).await;

        // The chart's agent ServiceAccount, ClusterRole and policy, as helm installs them.
        let dir = tempfile::tempdir().unwrap();
        let rendered = dir.path().join("agent.yaml");
        std::fs::write(&rendered, render_agent_policy(&release, &ns.name)).unwrap();
        run(cluster.kubectl().arg("apply").arg("-f").arg(&rendered));
        let sa = format!("{release}-dra-scheduler-node-agent");
        let sas: Api<ServiceAccount> = ns.api();
        sas.get(&sa)
            .await
            .expect("the chart's agent ServiceAccount");

        // The agent's pod on node A (nothing runs it: the token only needs it to exist).
        let pods: Api<Pod> = ns.api();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "agent-on-a"},
            "spec": {
                "nodeName": node_a,
                "serviceAccountName": sa,
                "containers": [{"name": "agent", "image": "dra-node-agent"}],
            },
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        let kubeconfig = dir.path().join("agent-on-a.kubeconfig");
        token_kubeconfig(
            cluster,
            &pod_token(cluster, &ns.name, &sa, "agent-on-a"),
            &kubeconfig,
        );
        let agent = client_from(&kubeconfig).await;

        // The API server knows the token's node.
        let whoami = run(Command::new(cluster.binary("kubectl"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["auth", "whoami", "-o", "json"]));
        let whoami: Value = serde_json::from_str(&whoami).unwrap();
        assert_eq!(
            whoami["status"]["userInfo"]["extra"]["authentication.kubernetes.io/node-name"],
            json!([node_a]),
            "{whoami}"
        );

        // The API server loads new policies in the background: wait until it refuses node
        // B's slice (a dry run, so nothing is written while it does not yet).
        let dry_run = PostParams {
            dry_run: true,
            ..Default::default()
        };
        let as_agent: Api<ResourceSlice> = Api::all(agent.clone());
        eventually("the policy in force", 60, || async {
            match as_agent
                .create(&dry_run, &slice(&format!("{node_b}-probe"), &node_b, 1))
                .await
            {
                Err(kube::Error::Api(s))
                    if s.code == 403 && s.message.contains("ValidatingAdmissionPolicy") =>
                {
                    Some(())
                }
                _ => None,
            }
        })
        .await;
        AgentOnA {
            cluster,
            admin,
            ns,
            release,
            node_a,
            node_b,
            sa,
            dir,
            agent,
        }
    }

    /// ResourceSlices as the agent on node A writes them.
    fn as_agent(&self) -> Api<ResourceSlice> {
        Api::all(self.agent.clone())
    }

    /// ResourceSlices as the cluster's admin writes them.
    fn as_admin(&self) -> Api<ResourceSlice> {
        Api::all(self.admin.clone())
    }

    /// `next`, replacing the slice of its name as the agent (at the slice's current
    /// resourceVersion).
    async fn replace_as_agent(
        &self,
        mut next: ResourceSlice,
    ) -> Result<ResourceSlice, kube::Error> {
        let name = next.metadata.name.clone().unwrap();
        next.metadata.resource_version = self
            .as_admin()
            .get(&name)
            .await
            .unwrap()
            .metadata
            .resource_version;
        self.as_agent()
            .replace(&name, &PostParams::default(), &next)
            .await
    }
}

#[tokio::test]
async fn the_agent_writes_only_its_own_nodes_slices() {
    let AgentOnA {
        cluster,
        admin,
        ns,
        release,
        node_a,
        node_b,
        sa,
        dir,
        agent,
    } = AgentOnA::install("adm").await;
    let as_agent: Api<ResourceSlice> = Api::all(agent.clone());
    let as_admin: Api<ResourceSlice> = Api::all(admin.clone());
    let refused_b = format!(
        "the node agent on node {node_a} may write only ResourceSlices with spec.nodeName {node_a}, not one of node {node_b}"
    );

    // Node A's slices: created, updated, deleted.
    let a = format!("{node_a}-gpus");
    as_agent
        .create(&PostParams::default(), &slice(&a, &node_a, 1))
        .await
        .unwrap_or_else(|e| panic!("create {a} as the agent on A: {}", server_message(&e)));
    let mut next = slice(&a, &node_a, 2);
    next.metadata.resource_version = as_admin.get(&a).await.unwrap().metadata.resource_version;
    let updated = as_agent
        .replace(&a, &PostParams::default(), &next)
        .await
        .unwrap_or_else(|e| panic!("update {a} as the agent on A: {}", server_message(&e)));
    assert_eq!(updated.spec.pool.generation, 2);
    as_agent
        .delete(&a, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete {a} as the agent on A: {}", server_message(&e)));
    assert!(as_admin.get_opt(&a).await.unwrap().is_none());

    // Node B's: refused, whether new or someone else's already there.
    let b = format!("{node_b}-gpus");
    let m = forbidden(
        as_agent
            .create(&PostParams::default(), &slice(&b, &node_b, 1))
            .await,
    );
    assert!(m.contains(&refused_b), "{m}");
    assert!(as_admin.get_opt(&b).await.unwrap().is_none());
    as_admin
        .create(&PostParams::default(), &slice(&b, &node_b, 1))
        .await
        .expect("other users are not limited by the policy");
    let mut next = slice(&b, &node_b, 2);
    next.metadata.resource_version = as_admin.get(&b).await.unwrap().metadata.resource_version;
    let m = forbidden(as_agent.replace(&b, &PostParams::default(), &next).await);
    assert!(m.contains(&refused_b), "{m}");
    let m = forbidden(as_agent.delete(&b, &DeleteParams::default()).await);
    assert!(m.contains(&refused_b), "{m}");
    let kept = as_admin.get(&b).await.unwrap();
    assert_eq!(kept.spec.pool.generation, 1, "node B's slice is unchanged");
    // A slice of no single node is not the agent's either.
    let mut everywhere = slice(&format!("{release}-all"), &node_a, 1);
    everywhere.spec.node_name = None;
    everywhere.spec.all_nodes = Some(true);
    let m = forbidden(as_agent.create(&PostParams::default(), &everywhere).await);
    assert!(m.contains("not one without spec.nodeName"), "{m}");

    // The agent's own publisher: on node A it publishes the profile's GPUs; told it is on
    // node B, with A's token, every write is refused and nothing of B's is published.
    let publisher = |node: &str| publisher(&agent, node);
    let outcome = publisher(&node_a)
        .sync_once()
        .await
        .expect("publish node A");
    assert!(
        matches!(outcome, SyncOutcome::Written { created: 1, .. }),
        "{outcome:?}"
    );
    assert_eq!(slices(&admin, &node_a).await.len(), 1);
    as_admin.delete(&b, &DeleteParams::default()).await.unwrap();
    let error = publisher(&node_b)
        .sync_once()
        .await
        .expect_err("publishing node B with node A's token")
        .to_string();
    assert!(error.contains(&refused_b), "{error}");
    assert!(slices(&admin, &node_b).await.is_empty());

    // A token of the ServiceAccount bound to no pod names no node: refused too.
    let unbound = dir.path().join("unbound.kubeconfig");
    token_kubeconfig(
        cluster,
        run(cluster
            .kubectl()
            .args(["create", "token", &sa, "-n", &ns.name]))
        .trim(),
        &unbound,
    );
    let unbound: Api<ResourceSlice> = Api::all(client_from(&unbound).await);
    let m = forbidden(
        unbound
            .create(
                &PostParams::default(),
                &slice(&format!("{node_a}-x"), &node_a, 1),
            )
            .await,
    );
    assert!(
        m.contains("the node agent's credential names no node"),
        "{m}"
    );
}

/// The spoof of issue 47: an agent's token of node A was admitted to publish a slice with
/// `nodeName` A but the pool of node B, holding a device named like one of B's, and the
/// scheduler counted B's real device as in use.
#[tokio::test]
async fn the_agent_writes_only_its_own_pool_of_its_own_driver() {
    let a = AgentOnA::install("pool").await;
    let (node_a, node_b) = (&a.node_a, &a.node_b);
    let (as_agent, as_admin) = (a.as_agent(), a.as_admin());
    let refused_pool = format!(
        "the node agent on node {node_a} may write only ResourceSlices of pool {node_a} (the pool is named after the node), not one of pool {node_b}"
    );

    // Node A's slice in node B's pool: refused, and nothing is written.
    let spoof = format!("{node_a}-spoof");
    let m = forbidden(
        as_agent
            .create(
                &PostParams::default(),
                &slice_of(&spoof, node_a, node_b, DRIVER, 1),
            )
            .await,
    );
    assert!(m.contains(&refused_pool), "{m}");
    assert!(as_admin.get_opt(&spoof).await.unwrap().is_none());

    // Node A's slice of another driver: refused.
    let other = format!("{node_a}-other-driver");
    let m = forbidden(
        as_agent
            .create(
                &PostParams::default(),
                &slice_of(&other, node_a, node_a, "other.example.com", 1),
            )
            .await,
    );
    assert!(
        m.contains(&format!(
            "the node agent on node {node_a} may write only ResourceSlices of driver {DRIVER}, not one of driver other.example.com"
        )),
        "{m}"
    );
    assert!(as_admin.get_opt(&other).await.unwrap().is_none());

    // Its own pool: still created and updated. Moving that slice to node B's pool is refused
    // (by the API server already: a slice's pool, like its node and driver, is immutable),
    // and the slice keeps its pool.
    let own = format!("{node_a}-gpus");
    as_agent
        .create(&PostParams::default(), &slice(&own, node_a, 1))
        .await
        .unwrap_or_else(|e| panic!("create {own} as the agent on A: {}", server_message(&e)));
    let updated = a
        .replace_as_agent(slice(&own, node_a, 2))
        .await
        .unwrap_or_else(|e| panic!("update {own} as the agent on A: {}", server_message(&e)));
    assert_eq!(updated.spec.pool.generation, 2);
    match a
        .replace_as_agent(slice_of(&own, node_a, node_b, DRIVER, 3))
        .await
    {
        Err(kube::Error::Api(s)) if [403, 422].contains(&s.code) => {
            assert!(s.message.contains("spec.pool.name"), "{}", s.message)
        }
        other => panic!("moving {own} to pool {node_b} was not refused: {other:?}"),
    }
    let kept = as_admin.get(&own).await.unwrap();
    assert_eq!(
        (kept.spec.pool.name.as_str(), kept.spec.pool.generation),
        (node_a.as_str(), 2),
        "the own slice is unchanged"
    );
    as_agent
        .delete(&own, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete {own} as the agent on A: {}", server_message(&e)));

    // A slice of node A in node B's pool that someone else wrote (or one from before the
    // policy): the agent may neither change it nor delete it; the slice as it was counts.
    as_admin
        .create(
            &PostParams::default(),
            &slice_of(&spoof, node_a, node_b, DRIVER, 1),
        )
        .await
        .expect("other users are not limited by the policy");
    let m = forbidden(
        a.replace_as_agent(slice_of(&spoof, node_a, node_b, DRIVER, 2))
            .await,
    );
    assert!(m.contains(&refused_pool), "{m}");
    let m = forbidden(as_agent.delete(&spoof, &DeleteParams::default()).await);
    assert!(m.contains(&refused_pool), "{m}");
    let kept = as_admin.get(&spoof).await.unwrap();
    assert_eq!(
        (kept.spec.pool.name.as_str(), kept.spec.pool.generation),
        (node_b.as_str(), 1),
        "the slice in node B's pool is unchanged"
    );
    as_admin
        .delete(&spoof, &DeleteParams::default())
        .await
        .unwrap();

    // The agent's own publisher on node A is not affected: its pool is named after the node.
    let outcome = publisher(&a.agent, node_a)
        .sync_once()
        .await
        .expect("publish node A");
    assert!(
        matches!(outcome, SyncOutcome::Written { created: 1, .. }),
        "{outcome:?}"
    );
    let published = slices(&a.admin, node_a).await;
    assert_eq!(published[0].spec.pool.name, *node_a);
}
