//! The `dra-scheduler` binary's library: `run` (the live scheduler), `simulate`
//! (manifests in, report out), `kubectl` (the `kubectl-dra` plugin) and the
//! fleet generator used by the 500-node example and the benchmarks. The decisions
//! themselves live in `dra-engine`.

/// The memory allocator of every binary built on this library (the scheduler, `kubectl-dra`,
/// the benchmarks and tests): mimalloc. A scheduling cycle makes and drops many small
/// objects (snapshots, search buffers, results), where glibc's malloc spent a fifth of the
/// allocator's time in benchmark case e (`malloc`, `free`, `malloc_consolidate`). The
/// allocator crate's comparison with the reference (`crates/dra-allocator/tests/
/// reference_times.rs`) uses this allocator too, so it times what the daemon runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod fleet;
pub mod kubectl;
pub mod run;
pub mod simulate;
