//! Times the benchmark scenarios (issue 4, a–e) in this crate and in the reference
//! (`allocref`), per pod, and prints both with their ratio. A pod's time is what a
//! scheduling cycle needs of the allocator: `Allocator::new`, `allocate` on every node, then
//! the `AllocationResult`s of one node ([`common::one_pod`]); the reference allocates on
//! every node, building results for each. Slow (the reference needs
//! seconds on c and d), so it is ignored by default:
//! `cargo test --release -p dra-allocator --test reference_times -- --ignored --nocapture`
//! (`CASE=a` runs only case a).

mod common;

/// The allocator the scheduler runs with (`src/lib.rs` of the workspace root), so the
/// times are the daemon's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dra_allocator::{Slice, Snapshot, SnapshotInput};

/// How a pod's time is taken.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// One snapshot for all runs (its selector-result cache filled): the steady state.
    Warm,
    /// A fresh snapshot per run, built outside the timing, so every selector is evaluated.
    /// Built as in `ColdWithSnapshot`, from the slices as received once, so that the two
    /// differ in the timing of `Snapshot::new` alone.
    Cold,
    /// A fresh snapshot per run, built inside the timing (`Snapshot::new` counted, as the
    /// reference counts its `NewAllocator`; the slices are shared, not copied, as in the
    /// engine, and received before: their facts are worked out then, see `receive_time`).
    ColdWithSnapshot,
}

/// `Snapshot::new` for the case, given its slices as the engine holds them (shared): what
/// the daemon pays, without the test's copy of every slice.
fn build(case: &common::Case, slices: &[Arc<Slice>]) -> Snapshot {
    Snapshot::new(SnapshotInput {
        classes: case.classes.clone(),
        slices: slices.to_vec(),
        taint_rules: case.taint_rules.clone(),
        allocations: case.allocations.clone(),
        features: case.features(),
        selector_cache: None,
    })
}

/// The case's slices as the engine holds them: received once, shared by every snapshot.
fn shared_slices(case: &common::Case) -> Vec<Arc<Slice>> {
    case.slices
        .iter()
        .map(|s| Arc::new(s.clone().into()))
        .collect()
}

/// Best of `runs`: receiving the case's slices (`Slice::from`, which works out each slice's
/// facts), the work the engine does once per slice update, before any snapshot. The API
/// objects' copies are made outside the timing.
fn receive_time(case: &common::Case, runs: u32) -> Duration {
    let mut best = Duration::MAX;
    for _ in 0..runs {
        let objects = case.slices.clone();
        let start = Instant::now();
        let slices: Vec<Slice> = objects.into_iter().map(Slice::from).collect();
        best = best.min(start.elapsed());
        drop(std::hint::black_box(slices));
    }
    best
}

/// Best of `runs` pods.
fn our_time(case: &common::Case, runs: u32, mode: Mode) -> (Duration, usize) {
    let slices = shared_slices(case);
    let mut snap = case.snapshot();
    let mut fits = 0;
    let mut best = Duration::MAX;
    for _ in 0..runs {
        if mode == Mode::Cold {
            // The last one first, as `ColdWithSnapshot` (and the engine) drops it.
            drop(snap);
            snap = build(case, &slices);
        }
        let start = Instant::now();
        let fresh;
        let used = if mode == Mode::ColdWithSnapshot {
            fresh = build(case, &slices);
            &fresh
        } else {
            &snap
        };
        fits = common::one_pod(used, case);
        best = best.min(start.elapsed());
        // `fresh` is dropped here, after the timing, as the other modes drop theirs.
    }
    (best, fits)
}

#[test]
#[ignore]
fn reference_times() {
    let bin = common::allocref();
    // `CASE=a`: only the cases whose names start so.
    let only = std::env::var("CASE").unwrap_or_default();
    for (name, make) in common::cases::all() {
        if !name.starts_with(&only) {
            continue;
        }
        let mut case = make();
        // Enough pods, on both sides, that one quiet moment of this shared machine is among
        // them: best of 20 here, best of 10 in the reference (the cases that run into its
        // timeout: 1).
        let (ours, fits) = our_time(&case, 20, Mode::Warm);
        let (cold, _) = our_time(&case, 20, Mode::Cold);
        let (cold_snapshot, _) = our_time(&case, 20, Mode::ColdWithSnapshot);
        let received = receive_time(&case, 3);
        // c and d run into the reference's timeout: one repeat tells as much as ten.
        let times_out = name.starts_with("c_") || name.starts_with("d_");
        case.repeat = Some(if times_out { 1 } else { 10 });
        // The scheduler gives a node 10 s (DRASchedulerFilterTimeout).
        case.timeout_ms = 10_000;
        let mut child = Command::new(&bin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        writeln!(
            child.stdin.take().unwrap(),
            "{}",
            serde_json::to_string(&case).unwrap()
        )
        .unwrap();
        let out = child.wait_with_output().unwrap();
        let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        // Best against best: the same statistic on both sides (the mean of the reference's
        // repeats is printed too; it includes Go's warm-up and garbage collection).
        let micros = answer["bestMicros"].as_f64().unwrap();
        let mean = answer["micros"].as_f64().unwrap();
        eprintln!(
            "{name}: ours {:.3} ms/pod warm, {:.3} cold, {:.3} cold with Snapshot::new ({fits} nodes fit), reference {:.3} ms/pod best, {:.3} mean of {} ({} fit, timedOut={}), ratio {:.1}x warm, {:.1}x cold, {:.1}x cold with Snapshot::new",
            ours.as_secs_f64() * 1e3,
            cold.as_secs_f64() * 1e3,
            cold_snapshot.as_secs_f64() * 1e3,
            micros / 1e3,
            mean / 1e3,
            case.repeat.unwrap_or(1),
            answer["fits"],
            answer["timedOut"].as_bool().unwrap_or(false),
            micros / 1e6 / ours.as_secs_f64(),
            micros / 1e6 / cold.as_secs_f64(),
            micros / 1e6 / cold_snapshot.as_secs_f64()
        );
        // Not per pod: once per slice update, outside every scheduling cycle (the
        // reference has no such step; its informer's decoding is not timed either).
        eprintln!(
            "{name}: receiving its slices (their facts, once per update): {:.3} ms",
            received.as_secs_f64() * 1e3
        );
    }
}

/// `Snapshot::new` of case a (or the case whose name starts with `$CASE`), 100 times (or
/// `$RUNS`), with one pod scheduled on each snapshot if `$POD` is 1, for a profiler:
/// `perf record -g target/release/deps/reference_times-* --ignored snapshot_new_loop`.
#[test]
#[ignore]
fn snapshot_new_loop_for_profiling() {
    let want = std::env::var("CASE").unwrap_or_else(|_| "a".into());
    let (name, make) = common::cases::all()
        .into_iter()
        .find(|(name, _)| name.starts_with(&want))
        .unwrap();
    let case = make();
    let slices = shared_slices(&case);
    let runs: u32 = std::env::var("RUNS").map_or(100, |r| r.parse().unwrap());
    // `POD=1`: each snapshot also schedules the case's pod, as "cold with Snapshot::new".
    let pod = std::env::var("POD").is_ok_and(|p| p == "1");
    // `WARM=1`: one snapshot for all runs, only the pods timed (the steady state).
    if std::env::var("WARM").is_ok_and(|w| w == "1") {
        let snapshot = build(&case, &slices);
        let start = Instant::now();
        for _ in 0..runs {
            std::hint::black_box(common::one_pod(&snapshot, &case));
        }
        eprintln!(
            "a warm pod, {name}: {:.3} ms each",
            start.elapsed().as_secs_f64() * 1e3 / f64::from(runs)
        );
        return;
    }
    let mut best = Duration::MAX;
    let start = Instant::now();
    for _ in 0..runs {
        let one = Instant::now();
        let snapshot = std::hint::black_box(build(&case, &slices));
        if pod {
            std::hint::black_box(common::one_pod(&snapshot, &case));
        }
        best = best.min(one.elapsed());
        drop(snapshot);
    }
    eprintln!(
        "Snapshot::new{}, {name}: {:.3} ms each with its drop, best {:.3} ms without",
        if pod { " and a pod" } else { "" },
        start.elapsed().as_secs_f64() * 1e3 / f64::from(runs),
        best.as_secs_f64() * 1e3
    );
}
