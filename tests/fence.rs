//! A deposed leader writes nothing once a standby could lead, on a real Kubernetes 1.37
//! control plane.
//!
//! Replica A reaches the API server only through a fault-injecting proxy in this test (plain
//! HTTP to the proxy, which forwards with A's client certificate and records every write
//! it forwards, with wall-clock times). Replica B talks to the API server directly. With
//! pods to place, the proxy answers 503 to A's `pods/binding` POSTs, so A's bindings keep
//! being retried; then it answers 503 to A's Lease calls too, so A cannot renew. B takes
//! the Lease; from that moment the proxy forwards A's bindings again, so any retry A still
//! sends would land. None may: every write A got through must have been sent and answered
//! before B's `acquireTime`.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::State;
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use test_cluster::{TestCluster, eventually, free_port};

/// One request the proxy forwarded to the API server.
#[derive(Clone, Debug)]
struct Forwarded {
    sent: SystemTime,
    answered: SystemTime,
    method: String,
    path: String,
    status: u16,
}

/// What the proxy refuses, and what it forwarded.
#[derive(Default)]
struct Proxy {
    fail_leases: AtomicBool,
    fail_bindings: AtomicBool,
    refused: Mutex<Vec<(SystemTime, String)>>,
    forwarded: Mutex<Vec<Forwarded>>,
}

struct ProxyState {
    proxy: Arc<Proxy>,
    upstream: kube::Client,
}

fn unavailable() -> axum::response::Response {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": "injected by the test's proxy", "reason": "ServiceUnavailable", "code": 503,
    });
    axum::response::Response::builder()
        .status(503)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(status.to_string()))
        .unwrap()
}

async fn forward(
    State(state): State<Arc<ProxyState>>,
    request: axum::extract::Request,
) -> axum::response::Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let writes = method != http::Method::GET;
    let lease = path.starts_with("/apis/coordination.k8s.io/");
    let binding = method == http::Method::POST && path.ends_with("/binding");
    let proxy = &state.proxy;
    if (lease && proxy.fail_leases.load(Ordering::SeqCst))
        || (binding && proxy.fail_bindings.load(Ordering::SeqCst))
    {
        proxy
            .refused
            .lock()
            .unwrap()
            .push((SystemTime::now(), format!("{method} {path}")));
        return unavailable();
    }
    let (mut parts, body) = request.into_parts();
    parts.headers.remove(http::header::HOST);
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let upstream = http::Request::from_parts(parts, kube::client::Body::from(bytes.to_vec()));
    let sent = SystemTime::now();
    let response = match state.upstream.send(upstream).await {
        Ok(response) => response,
        Err(_) => return unavailable(),
    };
    if writes {
        proxy.forwarded.lock().unwrap().push(Forwarded {
            sent,
            answered: SystemTime::now(),
            method: method.to_string(),
            path,
            status: response.status().as_u16(),
        });
    }
    response.map(axum::body::Body::new)
}

/// Serve the proxy on a free loopback port, forwarding with `kubeconfig`'s credentials;
/// returns a kubeconfig that points at it (plain HTTP, no credentials of its own).
async fn serve_proxy(
    cluster: &TestCluster,
    kubeconfig: &std::path::Path,
    proxy: Arc<Proxy>,
) -> std::path::PathBuf {
    let config = dra_scheduler::run::kube_config(Some(kubeconfig))
        .await
        .unwrap();
    let upstream = kube::Client::try_from(config).unwrap();
    let port = free_port();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let app = axum::Router::new()
        .fallback(forward)
        .with_state(Arc::new(ProxyState { proxy, upstream }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let path = cluster.dir().join("through-proxy.kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: proxy, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n\
         users: [{{name: anonymous, user: {{}}}}]\n\
         contexts: [{{name: proxy, context: {{cluster: proxy, user: anonymous}}}}]\ncurrent-context: proxy\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn since(t: SystemTime, zero: SystemTime) -> String {
    match t.duration_since(zero) {
        Ok(d) => format!("+{:.3}s", d.as_secs_f64()),
        Err(e) => format!("-{:.3}s", e.duration().as_secs_f64()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leaders_retried_bindings_never_land_after_the_standby_takes_over() {
    let cluster = TestCluster::dedicated();
    apply(&cluster, &["tests/data/resilience/scheduler-rbac.yaml"]);
    let proxy = Arc::new(Proxy::default());
    let a_config = cluster.user_kubeconfig("sched-a").unwrap();
    let through_proxy = serve_proxy(&cluster, &a_config, proxy.clone()).await;
    let a = start_scheduler_as(&through_proxy, &[]);
    eventually("replica A leads", 60, || async {
        (leader_of(&a).await == Some(1.0)).then_some(())
    })
    .await;
    let b = start_scheduler_as(&cluster.user_kubeconfig("sched-b").unwrap(), &[]);
    eventually("replica B ready, standing by", 60, || async {
        let ready = get(&b.metrics, "/readyz").is_some_and(|(code, _)| code == 200);
        (ready && leader_of(&b).await == Some(0.0)).then_some(())
    })
    .await;

    // A places pods, but none of its bindings gets through; then it cannot renew.
    apply_fleet(&cluster, 4, 8);
    proxy.fail_bindings.store(true, Ordering::SeqCst);
    apply_burst(&cluster, 24, "dra-scheduler");
    eventually("A's bindings being refused", 60, || async {
        (proxy.refused.lock().unwrap().len() >= 3).then_some(())
    })
    .await;
    let faulted = SystemTime::now();
    proxy.fail_leases.store(true, Ordering::SeqCst);

    // B takes over; from then on A's bindings would land.
    let client = cluster.client().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let acquired = eventually("B holds the Lease", 60, || async {
        let spec = leases.get("dra-scheduler").await.ok()?.spec?;
        let holder = spec.holder_identity?;
        let acquired = SystemTime::from(spec.acquire_time?.0);
        (!holder.is_empty() && leader_of(&b).await == Some(1.0)).then_some(acquired)
    })
    .await;
    proxy.fail_bindings.store(false, Ordering::SeqCst);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    wait_bound(&pods, 24).await;
    // Long enough for every retry kube's client would still send (it backs off to
    // seconds) while A lets its bindings settle before exiting.
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(assert_no_device_twice(&client).await, 24);

    let forwarded = proxy.forwarded.lock().unwrap().clone();
    let refused = proxy.refused.lock().unwrap().clone();
    let bindings_refused: Vec<SystemTime> = refused
        .iter()
        .filter(|(_, what)| what.ends_with("/binding"))
        .map(|(t, _)| *t)
        .collect();
    eprintln!(
        "timeline (from the Lease fault): B acquired the Lease at {}; A's binding attempts refused: {} (the last at {}); A's writes forwarded:",
        since(acquired, faulted),
        bindings_refused.len(),
        bindings_refused
            .last()
            .map_or("-".into(), |t| since(*t, faulted))
    );
    for f in &forwarded {
        eprintln!(
            "  sent {} answered {} {} {} -> {}",
            since(f.sent, faulted),
            since(f.answered, faulted),
            f.method,
            f.path,
            f.status
        );
    }
    let late: Vec<&Forwarded> = forwarded
        .iter()
        .filter(|f| f.sent >= acquired || f.answered >= acquired)
        .collect();
    assert!(
        late.is_empty(),
        "A's writes reached the API server after B took the Lease: {late:#?}"
    );
    assert!(!bindings_refused.is_empty(), "A tried to bind");
    let mut a = a;
    let a_exit = loop {
        if let Some(status) = a.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            SystemTime::now() < acquired + Duration::from_secs(90),
            "A exits after losing the Lease"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(!a_exit.success(), "losing the Lease is an error exit");
}
