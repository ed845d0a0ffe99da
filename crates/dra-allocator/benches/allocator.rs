//! Issue 4's benchmarks, each timing one pod as a scheduling cycle needs it:
//! `Allocator::new`, `allocate` on every candidate node of the scenario (the engine's
//! Filter step), then the `AllocationResult`s of the one node picked.
//!
//! a) 500 nodes × 8 GPUs, one 1-GPU claim; b) 5,000 nodes × 8 GPUs + 2 NICs, 4 GPUs + 1 NIC
//! on one NUMA node; c) 32 GPUs asked where 31 exist; d) 20 one-GPU requests sharing a
//! NUMA node, none has 20; e) one A100 with its MIG placements.
//!
//! Issue 12's, infeasible only because of shared counters or consumable capacity (each
//! exhaustive without bounds that read them): f) 29 MIG devices on the node agent's
//! published 4×A100 profile (28 fit), and 29 + 28 in two claims on two such profiles;
//! g) 12 of 32 devices that share a counter set of 11 slots, and 23 of 64 with 22 slots;
//! h) 33 one-share requests over 8 shared GPUs with room for 4 shares each, and 65 over 16.
//!
//! "warm" reuses the snapshot across pods (its selector-result cache filled, as in steady
//! state); "cold" builds a fresh snapshot for every pod (outside the timing) so every
//! selector is evaluated.

#[path = "../tests/common/mod.rs"]
mod common;

/// The allocator the scheduler runs with (`src/lib.rs` of the workspace root).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::hint::black_box;

use common::one_pod;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

fn benches(c: &mut Criterion) {
    for (name, make) in common::cases::all()
        .into_iter()
        .chain(common::cases::bounds())
    {
        let case = make();
        let snap = case.snapshot();
        let mut group = c.benchmark_group(name);
        group.sample_size(10);
        // Runs only for the benchmarks the filter selects (a scenario left out may be one
        // that is slow on an allocator without its bounds).
        let mut told = false;
        group.bench_function("warm", |b| {
            if !told {
                let fits = one_pod(&snap, &case);
                eprintln!("{name}: {} nodes, {fits} fit", case.nodes.len());
                told = true;
            }
            b.iter(|| black_box(one_pod(&snap, &case)))
        });
        if case.nodes.len() <= 500 {
            group.bench_function("cold", |b| {
                // The snapshot is returned so that criterion drops it after the timing: the
                // cycle does not pay for freeing a snapshot (about 2 ms for case a).
                b.iter_batched(
                    || case.snapshot(),
                    |s| {
                        black_box(one_pod(&s, &case));
                        s
                    },
                    BatchSize::LargeInput,
                )
            });
        }
        group.finish();
    }
}

criterion_group!(allocator, benches);
criterion_main!(allocator);
