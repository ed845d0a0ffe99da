//! `simulate` from 500 to 50,000 nodes (issue 21, item 3): for each fleet of
//! `generate-fleet` (8 GPUs on 2 NUMA nodes and 2 NICs a node) with the same pending pods,
//! the time to read the manifests, the time per pod of the scheduling itself, pods per
//! second, and the process's peak memory while it ran. Writes a markdown table and a
//! log-log plot (time per pod and peak memory against nodes):
//!
//! ```text
//! cargo bench --bench simulate_scale
//! ```
//!
//! - `SCALE_NODES` (500,1000,5000,50000), `SCALE_PODS` (5000);
//! - `SCALE_REPORT` (target/simulate-scale): where `report.md` and `scale.png` go;
//!   `SCALE_PLOT=0` to skip the PNG.
//!
//! Each size runs once, in this process: the peak memory is reset before each size
//! (`/proc/self/clear_refs`), so it is that size's own (manifest text, objects, engine).
//! Minutes at full size, and a benchmark: not part of `make test`.

#[path = "plot_font.rs"]
mod plot_font;

use std::fmt::Write;
use std::path::PathBuf;
use std::time::Instant;

use dra_scheduler::fleet::{FleetSpec, generate_yaml};
use dra_scheduler::simulate::{self, manifests};
use plotters::prelude::*;

/// One fleet's figures.
struct Run {
    nodes: usize,
    pods: usize,
    placed: usize,
    read_s: f64,
    schedule_s: f64,
    peak_mib: Option<f64>,
}

impl Run {
    fn ms_per_pod(&self) -> f64 {
        self.schedule_s * 1000.0 / self.pods as f64
    }

    fn pods_per_s(&self) -> f64 {
        self.pods as f64 / self.schedule_s
    }
}

fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|n| n.trim().parse().unwrap_or_else(|_| panic!("{name}: {n:?}")))
        .collect()
}

/// Peak resident memory of this process since the last [`reset_peak`], if Linux says.
fn peak_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn run(nodes: usize, pods: usize) -> Run {
    let reset = reset_peak();
    let yaml = generate_yaml(&FleetSpec {
        nodes,
        gpus: 8,
        pods,
    });
    let started = Instant::now();
    let mut parsed = manifests::Manifests::default();
    manifests::parse_file("fleet.yaml".as_ref(), &yaml, &mut parsed).expect("fleet parses");
    drop(yaml);
    let input = simulate::expand::expand(parsed).expect("fleet expands");
    let read_s = started.elapsed().as_secs_f64();
    let options = simulate::Options {
        scheduler_name: "dra-scheduler".into(),
        ..Default::default()
    };
    let started = Instant::now();
    let sim = simulate::simulate(&options, input);
    let schedule_s = started.elapsed().as_secs_f64();
    Run {
        nodes,
        pods,
        placed: pods - sim.pending(),
        read_s,
        schedule_s,
        peak_mib: peak_mib().filter(|_| reset),
    }
}

fn markdown(runs: &[Run]) -> String {
    let mut out = String::from(
        "| nodes × 8 GPUs | pods placed | reading the manifests | scheduling | per pod | pods/s | peak RSS |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for r in runs {
        let _ = writeln!(
            out,
            "| {} | {} of {} | {:.2} s | {:.2} s | {:.3} ms | {:.0} | {} |",
            r.nodes,
            r.placed,
            r.pods,
            r.read_s,
            r.schedule_s,
            r.ms_per_pod(),
            r.pods_per_s(),
            r.peak_mib.map_or("—".into(), |m| format!("{m:.0} MiB")),
        );
    }
    out
}

fn plot(runs: &[Run], path: &std::path::Path) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let root = BitMapBackend::new(path, (1000, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let (left, right) = root.split_horizontally(500);
    let nodes = |r: &Run| r.nodes as f64;
    let x_range = || {
        let lo = runs.iter().map(nodes).fold(f64::MAX, f64::min) / 1.5;
        let hi = runs.iter().map(nodes).fold(0.0, f64::max) * 1.5;
        (lo..hi).log_scale()
    };
    let panels = [
        (
            &left,
            "scheduling time per pod (ms)",
            runs.iter()
                .map(|r| (nodes(r), r.ms_per_pod()))
                .collect::<Vec<_>>(),
        ),
        (
            &right,
            "peak RSS (MiB)",
            runs.iter()
                .filter_map(|r| Some((nodes(r), r.peak_mib?)))
                .collect(),
        ),
    ];
    for (area, caption, points) in panels {
        if points.is_empty() {
            continue;
        }
        let lo = points.iter().map(|p| p.1).fold(f64::MAX, f64::min) / 2.0;
        let hi = points.iter().map(|p| p.1).fold(0.0, f64::max) * 2.0;
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(55)
            .build_cartesian_2d(x_range(), (lo..hi).log_scale())
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc("nodes")
            .x_labels(6)
            .y_labels(6)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| {
                if *y >= 10.0 {
                    format!("{y:.0}")
                } else {
                    format!("{y:.1}")
                }
            })
            .label_style(("sans-serif", 12))
            .draw()
            .map_err(|x| e(&x))?;
        chart
            .draw_series(LineSeries::new(points.clone(), BLUE.stroke_width(2)))
            .map_err(|x| e(&x))?;
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 4, BLUE.filled())))
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read from the command line.
    let sizes = env_list("SCALE_NODES", "500,1000,5000,50000");
    let pods = env_list("SCALE_PODS", "5000")[0];
    let dir = PathBuf::from(
        std::env::var("SCALE_REPORT").unwrap_or_else(|_| "target/simulate-scale".into()),
    );
    let draw = std::env::var("SCALE_PLOT").map_or(true, |v| v != "0");
    if draw && let Err(message) = plot_font::load_font() {
        eprintln!("simulate_scale: {message}, or set SCALE_PLOT=0");
        std::process::exit(1);
    }
    std::fs::create_dir_all(&dir).expect("create the report directory");
    let mut runs = Vec::new();
    for nodes in sizes {
        let r = run(nodes, pods);
        eprintln!(
            "simulate_scale: {nodes} nodes: read {:.2} s, scheduled {} pods in {:.2} s ({:.3} ms a pod), peak {:?} MiB",
            r.read_s,
            r.pods,
            r.schedule_s,
            r.ms_per_pod(),
            r.peak_mib.map(f64::round)
        );
        runs.push(r);
    }
    let table = markdown(&runs);
    print!("{table}");
    std::fs::write(dir.join("report.md"), &table).expect("write report.md");
    if draw {
        let png = dir.join("scale.png");
        match plot(&runs, &png) {
            Ok(()) => eprintln!("simulate_scale: wrote {}", png.display()),
            Err(message) => eprintln!("simulate_scale: no plot: {message}"),
        }
    }
}
