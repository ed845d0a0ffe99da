//! dra-scheduler side by side with kube-scheduler 1.37 on scheduler_perf's DRA workloads
//! (issue 21), on the real control plane of `tests/cluster`.
//!
//! For each workload, kube-scheduler, `dra-scheduler run` and the write ceiling (a client
//! that makes only the writes one pod needs, with allocations chosen in advance) run one
//! after the other, each in a fresh control plane with the same objects, and with the same
//! client budget (QPS and burst, raised to `E2E_QPS` so that the API server is the limit;
//! kube-controller-manager, which makes each pod's claim from its template, gets the same).
//! Every run reports pods/s, creation-to-binding latency (and its two parts: until
//! kube-controller-manager has made the pod's claim, the same work for every runner, and
//! from there to binding), the scheduler's CPU time and peak RSS, and the API server's
//! requests per pod (with its own mean time for each kind of write).
//!
//! ```text
//! cargo bench --bench e2e
//! ```
//!
//! writes `target/e2e-report/`: `report.md` (the table and the issue's targets, met or
//! missed), `bound-pods.png` (bound pods over time), `results.json`, and per run the API
//! server's requests by verb and resource and dra-scheduler's metrics. Environment:
//!
//! - `E2E_WORKLOADS`: a comma-separated subset of `template,steady,first-available,
//!   partitionable,match-attribute` (default: all);
//! - `E2E_RUNNERS`: a subset of `kube-scheduler,dra-scheduler,ceiling` (default: all);
//! - `E2E_NODES` (500): nodes of every workload; `E2E_PODS`: the template burst's size
//!   (default: half the devices, 2,500 at 500 nodes, after 2,500 allocated first, as
//!   scheduler_perf's 5000pods_500nodes);
//! - `E2E_STEADY_SECONDS` (30), `E2E_STEADY_PENDING` (10): the steady state's window and
//!   its batch of pods; `E2E_STEADY_REFILL`: `batch` (scheduler_perf's: the next batch
//!   once all of one are bound, the default) or `each` (each bound pod replaced at once);
//! - `E2E_ROUNDS` (1): how many times each workload's runners run, in turn (kube, ours,
//!   ceiling, kube, ours, ...); the targets are then judged on the median of the rounds'
//!   ratios, each round's runs compared with each other;
//! - `E2E_CEILING_CONCURRENCY` (32): pods the write ceiling writes for at once;
//! - `E2E_QPS` (5000), `E2E_TIMEOUT` (600 s a run), `E2E_REPORT` (target/e2e-report),
//!   `E2E_PLOT=0` to skip the PNG.
//!
//! Slow (a few minutes at full size) and long for `make test`: not part of it.

#[path = "../../tests/common/mod.rs"]
mod common;
mod measure;
#[path = "../plot_font.rs"]
mod plot_font;
mod report;
mod workload;

use std::path::PathBuf;
use std::time::Duration;

use measure::{Outcome, Runner, Settings};
use workload::{Refill, Workload};

fn env_num<T: std::str::FromStr>(name: &str) -> Option<T> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value}: not a number")),
    )
}

fn env_list<T>(name: &str, all: &[T], parse: impl Fn(&str) -> Option<T>) -> Vec<T>
where
    T: Copy,
{
    match std::env::var(name) {
        Ok(list) if !list.trim().is_empty() => list
            .split(',')
            .map(|s| parse(s.trim()).unwrap_or_else(|| panic!("{name}: unknown entry {s:?}")))
            .collect(),
        _ => all.to_vec(),
    }
}

fn command_output(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn main() {
    let workloads = env_list("E2E_WORKLOADS", &Workload::ALL, |s| {
        Workload::ALL.into_iter().find(|w| w.key() == s)
    });
    let runners = env_list("E2E_RUNNERS", &Runner::ALL, Runner::parse);
    let nodes: usize = env_num("E2E_NODES").unwrap_or(500);
    let pods: Option<usize> = env_num("E2E_PODS");
    let rounds: usize = env_num("E2E_ROUNDS").unwrap_or(1).max(1);
    let steady = (
        env_num("E2E_STEADY_PENDING").unwrap_or(10),
        env_num("E2E_STEADY_SECONDS").unwrap_or(30),
        std::env::var("E2E_STEADY_REFILL").map_or(Refill::Batch, |s| {
            Refill::parse(s.trim())
                .unwrap_or_else(|| panic!("E2E_STEADY_REFILL={s}: batch or each"))
        }),
    );
    let report_dir = std::env::var("E2E_REPORT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| test_cluster::repo_root().join("target/e2e-report"));
    let settings = Settings {
        qps: env_num("E2E_QPS").unwrap_or(5000),
        timeout: Duration::from_secs(env_num("E2E_TIMEOUT").unwrap_or(600)),
        ceiling_concurrency: env_num("E2E_CEILING_CONCURRENCY").unwrap_or(32),
        report_dir: report_dir.clone(),
    };
    let plot = std::env::var("E2E_PLOT").map_or(true, |v| v != "0");
    if plot && let Err(message) = report::load_font() {
        eprintln!("e2e: {message}, or set E2E_PLOT=0");
        std::process::exit(1);
    }
    std::fs::create_dir_all(&report_dir).expect("create the report directory");

    let header = format!(
        "# dra-scheduler and kube-scheduler 1.37, side by side\n\n\
         `cargo bench --bench e2e` on {} ({} CPUs), commit {}{}, {}. {nodes} nodes; {rounds} round(s); client QPS and burst {} \
         for both schedulers and kube-controller-manager; the write ceiling writes for {} pods at once; SteadyState {}. Latency: from the harness sending a \
         pod's create to its watch seeing the pod's nodeName, in two parts: to the watch seeing \
         the pod's claim named in its status (kube-controller-manager's part, the same for \
         every runner), and from there to the nodeName (the scheduler's, or the ceiling's). CPU: utime + stime of the \
         scheduler process in the measured window; peak RSS: its VmHWM. API requests: the \
         API server's apiserver_request_total over the window (everyone's: the harness's pod \
         creates and kube-controller-manager's claims are the same for every runner), per \
         bound pod; reads are GET, LIST and WATCH.\n",
        command_output("hostname", &[]),
        command_output("nproc", &[]),
        command_output("git", &["rev-parse", "--short", "HEAD"]),
        if command_output("git", &["status", "--porcelain", "--untracked-files=no"]).is_empty() {
            ""
        } else {
            "+"
        },
        command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        settings.qps,
        settings.ceiling_concurrency,
        match steady.2 {
            Refill::Batch => format!(
                "in batches of {} (the next once all are bound, as scheduler_perf)",
                steady.0
            ),
            Refill::EachPod => format!("with {} pods waiting, each replaced once bound", steady.0),
        },
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut outcomes: Vec<Outcome> = Vec::new();
    for workload in workloads {
        let plan = workload.plan(nodes, pods, steady);
        eprintln!("e2e: {} {plan:?}", workload.title());
        for (round, &runner) in (1..=rounds).flat_map(|r| runners.iter().map(move |x| (r, x))) {
            let outcome = runtime.block_on(measure::run(&plan, runner, round, &settings));
            eprintln!(
                "e2e:   {round} {:<15} {:>5} pods in {:>6.1} s: {:>6.1} pods/s, p50 {} ms, p99 {} ms (claim made: p50 {} ms; claim to bound: p50 {} ms), CPU {} s, peak RSS {} MiB, API {:.1} reads + {:.1} writes per pod",
                runner.name(),
                outcome.pods,
                outcome.seconds,
                outcome.pods_per_s(),
                outcome.quantile(0.5).map_or(0.0, |s| s * 1000.0) as u64,
                outcome.quantile(0.99).map_or(0.0, |s| s * 1000.0) as u64,
                measure::quantile(&outcome.to_claim, 0.5).map_or(0.0, |s| s * 1000.0) as u64,
                measure::quantile(&outcome.claim_to_bound, 0.5).map_or(0.0, |s| s * 1000.0) as u64,
                outcome.cpu_s.map_or("-".into(), |c| format!("{c:.1}")),
                outcome.rss_mib.map_or("-".into(), |r| format!("{r:.0}")),
                outcome.requests.reads / outcome.pods.max(1) as f64,
                outcome.requests.writes / outcome.pods.max(1) as f64,
            );
            outcomes.push(outcome);
            // Written after every run, so that an interrupted run leaves what it measured.
            let text = report::markdown(&outcomes, &header);
            std::fs::write(report_dir.join("report.md"), &text).expect("write report.md");
            std::fs::write(
                report_dir.join("results.json"),
                serde_json::to_vec_pretty(&outcomes).expect("results as JSON"),
            )
            .expect("write results.json");
            if plot
                && let Err(message) = report::plot(&outcomes, &report_dir.join("bound-pods.png"))
            {
                eprintln!("e2e: {message}");
            }
        }
    }
    println!("{}", report::markdown(&outcomes, &header));
    eprintln!("e2e: report in {}", report_dir.display());
}
