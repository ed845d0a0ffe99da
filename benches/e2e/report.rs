//! The report: a markdown table of every run, the issue 21 targets met or missed per
//! workload, and a PNG of bound pods over time (one panel per workload).

use std::fmt::Write;
use std::path::Path;

use plotters::prelude::*;

pub use crate::plot_font::load_font;

use crate::measure::{Outcome, Runner, quantile};
use crate::workload::Workload;

fn of(outcomes: &[Outcome], workload: Workload, runner: Runner) -> Option<&Outcome> {
    outcomes
        .iter()
        .rev()
        .find(|o| o.workload == workload && o.runner == runner)
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("—".into(), |v| format!("{v:.digits$}"))
}

/// The whole report: `header` (how it was made), the runs, the targets.
pub fn markdown(outcomes: &[Outcome], header: &str) -> String {
    let mut out = String::from(header);
    out.push_str(
        "\n| workload | scheduler | pods bound | s | pods/s | p50 ms | p99 ms | p50 to claim ms | p50 / p99 claim to bound ms | CPU s | CPU ms/pod | peak RSS MiB | API reads/pod | API writes/pod |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for o in outcomes {
        let per_pod = |v: f64| v / o.pods.max(1) as f64;
        let pods = if o.expected > 0 && !o.complete() {
            format!("{} of {} (timed out)", o.pods, o.expected)
        } else {
            o.pods.to_string()
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.1} | {:.0} | {} | {} | {} | {} / {} | {} | {} | {} | {:.1} | {:.1} |",
            o.workload.title(),
            o.runner.name(),
            pods,
            o.seconds,
            o.pods_per_s(),
            opt(o.quantile(0.5).map(|s| s * 1000.0), 0),
            opt(o.quantile(0.99).map(|s| s * 1000.0), 0),
            opt(quantile(&o.to_claim, 0.5).map(|s| s * 1000.0), 0),
            opt(quantile(&o.claim_to_bound, 0.5).map(|s| s * 1000.0), 0),
            opt(quantile(&o.claim_to_bound, 0.99).map(|s| s * 1000.0), 0),
            opt(o.cpu_s, 1),
            opt(o.cpu_s.map(|c| per_pod(c) * 1000.0), 2),
            opt(o.rss_mib, 0),
            per_pod(o.requests.reads),
            per_pod(o.requests.writes),
        );
    }
    out.push_str(
        "\nTargets of issue 21 (dra-scheduler against kube-scheduler and the write ceiling, same run):\n\n\
         | workload | pods/s ≥ 2x | p99 no worse | ≥ 80% of ceiling | CPU s/pod ≤ 1/3 | peak RSS ≤ 1/2 |\n\
         |---|---|---|---|---|---|\n",
    );
    for workload in Workload::ALL {
        let (Some(ours), kube, ceiling) = (
            of(outcomes, workload, Runner::DraScheduler),
            of(outcomes, workload, Runner::KubeScheduler),
            of(outcomes, workload, Runner::Ceiling),
        ) else {
            continue;
        };
        let verdict = |met: bool| if met { "met" } else { "**missed**" };
        let cell = |value: Option<(String, bool)>| {
            value.map_or("—".to_string(), |(v, met)| {
                format!("{v} ({})", verdict(met))
            })
        };
        let per_pod_cpu = |o: &Outcome| o.cpu_s.map(|c| c / o.pods.max(1) as f64);
        let rate = kube.map(|k| {
            let r = ours.pods_per_s() / k.pods_per_s();
            (format!("{r:.2}x"), r >= 2.0 && ours.complete())
        });
        let p99 = kube.and_then(|k| {
            let (a, b) = (ours.quantile(0.99)?, k.quantile(0.99)?);
            Some((format!("{:.0} vs {:.0} ms", a * 1000.0, b * 1000.0), a <= b))
        });
        let share = ceiling.map(|c| {
            let r = ours.pods_per_s() / c.pods_per_s();
            (format!("{:.0}%", r * 100.0), r >= 0.8)
        });
        let cpu = kube.and_then(|k| {
            let r = per_pod_cpu(ours)? / per_pod_cpu(k)?;
            Some((format!("{r:.2}"), r <= 1.0 / 3.0))
        });
        let rss = kube.and_then(|k| {
            let r = ours.rss_mib? / k.rss_mib?;
            Some((format!("{r:.2}"), r <= 0.5))
        });
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            workload.title(),
            cell(rate),
            cell(p99),
            cell(share),
            cell(cpu),
            cell(rss)
        );
    }
    let notes: Vec<&Outcome> = outcomes.iter().filter(|o| !o.notes.is_empty()).collect();
    if !notes.is_empty() {
        out.push_str("\nWhere dra-scheduler's time went (its own metrics, per workload):\n");
        for o in notes {
            let _ = writeln!(out, "\n{}:\n", o.workload.title());
            for line in &o.notes {
                let _ = writeln!(out, "- `{line}`");
            }
        }
    }
    out
}

fn color(runner: Runner) -> RGBColor {
    match runner {
        Runner::KubeScheduler => RGBColor(31, 119, 180),
        Runner::DraScheduler => RGBColor(214, 39, 40),
        Runner::Ceiling => RGBColor(127, 127, 127),
    }
}

/// Bound pods over time, one panel per workload, every runner a line.
pub fn plot(outcomes: &[Outcome], path: &Path) -> Result<(), String> {
    let workloads: Vec<Workload> = Workload::ALL
        .into_iter()
        .filter(|w| outcomes.iter().any(|o| o.workload == *w))
        .collect();
    if workloads.is_empty() {
        return Ok(());
    }
    let e = |e: &dyn std::fmt::Debug| format!("plot {}: {e:?}", path.display());
    let root = BitMapBackend::new(path, (1000, 340 * workloads.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let panels = root.split_evenly((workloads.len(), 1));
    for (panel, workload) in panels.iter().zip(workloads) {
        let runs: Vec<&Outcome> = Runner::ALL
            .iter()
            .filter_map(|r| of(outcomes, workload, *r))
            .collect();
        let x_max = runs
            .iter()
            .filter_map(|o| o.curve.last())
            .fold(1.0f64, |a, b| a.max(*b))
            * 1.05;
        let y_max = runs.iter().map(|o| o.pods).max().unwrap_or(1).max(1) as f64 * 1.05;
        let mut chart = ChartBuilder::on(panel)
            .caption(workload.title(), ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(38)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc("seconds since the first measured pod was created")
            .y_desc("pods bound")
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(|x| e(&x))?;
        for o in runs {
            let c = color(o.runner);
            chart
                .draw_series(LineSeries::new(
                    std::iter::once((0.0, 0.0)).chain(
                        o.curve
                            .iter()
                            .enumerate()
                            .map(|(i, t)| (*t, (i + 1) as f64)),
                    ),
                    c.stroke_width(2),
                ))
                .map_err(|x| e(&x))?
                .label(format!(
                    "{} ({:.0} pods/s)",
                    o.runner.name(),
                    o.pods_per_s()
                ))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))
}
