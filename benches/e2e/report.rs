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

/// Every round's run of `runner` on `workload`, in order.
fn runs_of(outcomes: &[Outcome], workload: Workload, runner: Runner) -> Vec<&Outcome> {
    outcomes
        .iter()
        .filter(|o| o.workload == workload && o.runner == runner)
        .collect()
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// Ours over another runner's, round by round (the rounds where both have the metric).
struct Ratio {
    per_round: Vec<f64>,
    median: f64,
}

/// `metric` of `ours` over that of `other`, each round's runs compared with each other:
/// they ran minutes apart, where rounds can be far apart on a shared machine.
fn paired(
    ours: &[&Outcome],
    other: &[&Outcome],
    metric: impl Fn(&Outcome) -> Option<f64>,
) -> Option<Ratio> {
    let per_round: Vec<f64> = ours
        .iter()
        .filter_map(|o| {
            let b = other.iter().find(|b| b.round == o.round)?;
            Some(metric(o)? / metric(b)?)
        })
        .collect();
    let median = median(per_round.clone())?;
    Some(Ratio { per_round, median })
}

/// The median ratio, its verdict, and with more than one round each round's ratio.
fn ratio_cell(ratio: &Ratio, show: impl Fn(f64) -> String, met: bool) -> String {
    let verdict = if met { "met" } else { "**missed**" };
    if ratio.per_round.len() > 1 {
        let rounds: Vec<String> = ratio.per_round.iter().map(|v| show(*v)).collect();
        format!(
            "median {} ({verdict}; rounds {})",
            show(ratio.median),
            rounds.join(", ")
        )
    } else {
        format!("{} ({verdict})", show(ratio.median))
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("—".into(), |v| format!("{v:.digits$}"))
}

/// The whole report: `header` (how it was made), the runs, the targets.
pub fn markdown(outcomes: &[Outcome], header: &str) -> String {
    let mut out = String::from(header);
    out.push_str(
        "\n| workload | round | scheduler | pods bound | s | pods/s | p50 ms | p99 ms | p50 to claim ms | p50 / p99 claim to bound ms | CPU s | CPU ms/pod | peak RSS MiB | API reads/pod | API writes/pod |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
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
            "| {} | {} | {} | {} | {:.1} | {:.0} | {} | {} | {} | {} / {} | {} | {} | {} | {:.1} | {:.1} |",
            o.workload.title(),
            o.round,
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
        "\nTargets of issue 21 (dra-scheduler against kube-scheduler and the write ceiling, same run; \
         with more than one round, the median of the rounds' ratios, each round's runs against each \
         other, and every round's ratio; p99 as ours over kube-scheduler's):\n\n\
         | workload | pods/s ≥ 2x | p99 no worse | ≥ 80% of ceiling | CPU s/pod ≤ 1/3 | peak RSS ≤ 1/2 |\n\
         |---|---|---|---|---|---|\n",
    );
    for workload in Workload::ALL {
        let [kube, ours, ceiling] = [Runner::KubeScheduler, Runner::DraScheduler, Runner::Ceiling]
            .map(|runner| runs_of(outcomes, workload, runner));
        if ours.is_empty() {
            continue;
        }
        let per_pod_cpu = |o: &Outcome| o.cpu_s.map(|c| c / o.pods.max(1) as f64);
        let all_complete = ours.iter().all(|o| o.complete());
        let rate = paired(&ours, &kube, |o| Some(o.pods_per_s()))
            .map(|r| ratio_cell(&r, |v| format!("{v:.2}x"), r.median >= 2.0 && all_complete));
        let p99 = paired(&ours, &kube, |o| o.quantile(0.99)).map(|r| {
            let ms = |runs: &[&Outcome]| {
                median(runs.iter().filter_map(|o| o.quantile(0.99)).collect()).unwrap_or(0.0)
                    * 1000.0
            };
            let text = format!("{:.0} vs {:.0} ms", ms(&ours), ms(&kube));
            let several = r.per_round.len() > 1;
            let show = |v: f64| {
                if several {
                    format!("{v:.2}")
                } else {
                    text.clone()
                }
            };
            ratio_cell(&r, show, r.median <= 1.0)
        });
        let share = paired(&ours, &ceiling, |o| Some(o.pods_per_s()))
            .map(|r| ratio_cell(&r, |v| format!("{:.0}%", v * 100.0), r.median >= 0.8));
        let cpu = paired(&ours, &kube, per_pod_cpu)
            .map(|r| ratio_cell(&r, |v| format!("{v:.2}"), r.median <= 1.0 / 3.0));
        let rss = paired(&ours, &kube, |o| o.rss_mib)
            .map(|r| ratio_cell(&r, |v| format!("{v:.2}"), r.median <= 0.5));
        let cell = |c: Option<String>| c.unwrap_or_else(|| "—".into());
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
        out.push_str("\nWhere the time went (dra-scheduler's own metrics; the write ceiling's timing of its writes at the client):\n");
        for o in notes {
            let _ = writeln!(
                out,
                "\n{}, {}, round {}:\n",
                o.workload.title(),
                o.runner.name(),
                o.round
            );
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

/// Bound pods over time, one panel per workload, every runner a line (its last round).
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
        let round = runs.iter().map(|o| o.round).max().unwrap_or(1);
        let caption = if round > 1 {
            format!("{} (round {round})", workload.title())
        } else {
            workload.title().to_string()
        };
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 20))
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
