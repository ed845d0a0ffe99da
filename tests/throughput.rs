//! The comparison harness for the live scheduler: the same burst of GPU pods, scheduled
//! once by the real kube-scheduler (1.37, DynamicResources plugin) and once by
//! `dra-scheduler run`, each in a fresh control plane on this machine, alternating, with
//! the same client write budget (100 QPS, burst 200). Reports pods/s from the Deployment's
//! creation to the last pod bound, and the ratio. Slow and noisy (absolute numbers on a
//! shared 2-core machine mean little; compare the ratio), so it is ignored by default:
//! `cargo test --release --test throughput -- --ignored --nocapture`
//! (THROUGHPUT_NODES, THROUGHPUT_PODS, THROUGHPUT_ROUNDS override 50, 400, 2).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use test_cluster::TestCluster;

mod common;
use common::{apply_burst, apply_fleet, start_scheduler_with};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Seconds from creating the Deployment until `pods` pods are bound.
async fn time_burst(reference: bool, nodes: usize, pods: usize) -> f64 {
    let cluster = TestCluster::dedicated();
    let daemon = if reference {
        cluster
            .start_reference_scheduler("dra-scheduler")
            .expect("kube-scheduler starts");
        None
    } else {
        Some(start_scheduler_with(&cluster, &["--leader-elect=false"]))
    };
    apply_fleet(&cluster, nodes, 8);
    let client = cluster.client().await;
    let api: Api<Pod> = Api::namespaced(client, "default");
    // Let the scheduler see the fleet first.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let start = Instant::now();
    apply_burst(&cluster, pods, "dra-scheduler");
    loop {
        let list = api.list(&ListParams::default()).await.unwrap().items;
        let bound = list
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
            .count();
        if bound >= pods {
            let elapsed = start.elapsed().as_secs_f64();
            if let Some(daemon) = &daemon {
                // What the time went into: writes by resource, attempts by result.
                let out = std::process::Command::new("curl")
                    .args(["-sf", &format!("{}/metrics", daemon.metrics)])
                    .output()
                    .unwrap();
                for line in String::from_utf8_lossy(&out.stdout).lines().filter(|l| {
                    l.starts_with("dra_scheduler_api_write_duration_seconds_count")
                        || l.starts_with("dra_scheduler_scheduling_attempt_duration_seconds_count")
                        || l.starts_with("dra_scheduler_api_write_duration_seconds_sum")
                }) {
                    println!("  {line}");
                }
            }
            return elapsed;
        }
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "{} bound {bound} of {pods} in 600 s",
            if reference {
                "kube-scheduler"
            } else {
                "dra-scheduler"
            }
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn dra_scheduler_against_kube_scheduler() {
    let nodes = env_or("THROUGHPUT_NODES", 50);
    let pods = env_or("THROUGHPUT_PODS", 400);
    let rounds = env_or("THROUGHPUT_ROUNDS", 2);
    assert!(pods <= nodes * 8, "every pod must fit");
    println!("{pods} one-GPU pods (claims from a template) on {nodes} nodes x 8 GPUs");
    for round in 1..=rounds {
        let reference = time_burst(true, nodes, pods).await;
        let ours = time_burst(false, nodes, pods).await;
        println!(
            "round {round}: kube-scheduler {reference:.1} s ({:.1} pods/s), dra-scheduler {ours:.1} s ({:.1} pods/s), ratio {:.2}x",
            pods as f64 / reference,
            pods as f64 / ours,
            reference / ours
        );
    }
}
