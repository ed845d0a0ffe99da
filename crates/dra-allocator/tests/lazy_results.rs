//! `AllocationResult`s are built only when asked ([`Allocator::results`]). These tests pin
//! that the results built later from a compact answer are exactly those built at once
//! ([`Allocator::allocate_resolved`]), even after other nodes were tried in between, and
//! that they are byte for byte what the allocator produced when it built results eagerly
//! for every node (`golden/results.txt`, one hash of the JSON per scenario, recorded before
//! the change; `shareID`s, fresh on every call, are masked).
//!
//! After an intended change of results, rewrite the file with
//! `UPDATE_GOLDEN=1 cargo test --release -p dra-allocator --test lazy_results`.

mod common;

use std::fmt::Debug;

use common::{Case, MEDIUM, SMALL, generate};
use dra_allocator::{Allocation, Allocator, Outcome, Resolved, Snapshot};
use k8s_openapi::api::resource::v1::AllocationResult;

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/results.txt");

/// The results as JSON, with every `shareID` replaced by a fixed string.
fn masked(results: &[AllocationResult]) -> String {
    let mut results = results.to_vec();
    for r in &mut results {
        for d in r
            .devices
            .iter_mut()
            .flat_map(|d| d.results.iter_mut().flatten())
        {
            if d.share_id.is_some() {
                d.share_id = Some("share".into());
            }
        }
    }
    serde_json::to_string(&results).unwrap()
}

/// FNV-1a of the masked results and the quality: a stable fingerprint.
fn fingerprint(results: &[AllocationResult], quality: &dyn Debug) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in masked(results)
        .bytes()
        .chain(format!("{quality:?}").bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn random_case(seed: u64) -> Case {
    generate(
        seed ^ 0x5EED,
        if seed.is_multiple_of(2) {
            SMALL
        } else {
            MEDIUM
        },
    )
}

/// Lazy: compact answer first, the same node tried again (reusing the per-thread buffers),
/// then its results; compared with the eager convenience path.
fn lazy_matches_eager(snap: &Snapshot, case: &Case, node: &k8s_openapi::api::core::v1::Node) {
    let claims: Vec<_> = case.claims.iter().collect();
    let Ok(allocator) = Allocator::new(snap, &claims) else {
        return;
    };
    let lazy = allocator.allocate(node);
    let eager = allocator.allocate_resolved(node);
    match (lazy, eager) {
        (Ok(Outcome::Allocated(a)), Ok(Outcome::Allocated(Resolved { results, quality }))) => {
            // More attempts in between must not disturb the compact answer.
            for _ in 0..2 {
                let _ = allocator.allocate(node);
            }
            let later = allocator.results(node, &a).unwrap();
            assert_eq!(masked(&later), masked(&results));
            assert_eq!(a.quality, quality);
            // Fresh share ids on every call, as before.
            let again = allocator.results(node, &a).unwrap();
            let ids = |r: &[AllocationResult]| -> Vec<String> {
                r.iter()
                    .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
                    .filter_map(|d| d.share_id.clone())
                    .collect()
            };
            let (x, y) = (ids(&later), ids(&again));
            assert!(x.iter().all(|id| !y.contains(id)), "{x:?} {y:?}");
        }
        (Ok(Outcome::Unfit(x)), Ok(Outcome::Unfit(y))) => assert_eq!(x, y),
        (Err(x), Err(y)) => assert_eq!(x.to_string(), y.to_string()),
        (x, y) => panic!("lazy {x:?} but eager {y:?}"),
    }
}

#[test]
fn results_built_later_equal_results_built_at_once() {
    for seed in 0..600 {
        let case = random_case(seed);
        lazy_matches_eager(&case.snapshot(), &case, &case.node);
    }
    for (_, make) in common::cases::all() {
        let case = make();
        let snap = case.snapshot();
        lazy_matches_eager(&snap, &case, case.nodes.first().unwrap());
        lazy_matches_eager(&snap, &case, case.nodes.last().unwrap());
    }
}

#[test]
fn a_cycle_builds_the_results_of_the_node_it_picks() {
    // As the engine does: compact answers for many nodes, results for one picked later.
    let case = common::cases::all()[0].1();
    let snap = case.snapshot();
    let claims: Vec<_> = case.claims.iter().collect();
    let allocator = Allocator::new(&snap, &claims).unwrap();
    let found: Vec<(usize, Allocation)> = case
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| {
            allocator
                .allocate(n)
                .unwrap()
                .allocation()
                .cloned()
                .map(|a| (i, a))
        })
        .collect();
    assert_eq!(found.len(), case.nodes.len());
    for &(i, ref a) in [&found[0], &found[found.len() / 2], &found[found.len() - 1]] {
        let node = &case.nodes[i];
        let Outcome::Allocated(eager) = allocator.allocate_resolved(node).unwrap() else {
            panic!("node {i} fits")
        };
        assert_eq!(
            masked(&allocator.results(node, a).unwrap()),
            masked(&eager.results)
        );
    }
}

#[test]
fn results_are_those_built_eagerly_before() {
    let mut out = String::new();
    for seed in 0..3000u64 {
        let case = random_case(seed);
        let snap = case.snapshot();
        let claims: Vec<_> = case.claims.iter().collect();
        let line = match Allocator::new(&snap, &claims).and_then(|a| {
            Ok(match a.allocate(&case.node)? {
                Outcome::Allocated(found) => {
                    fingerprint(&a.results(&case.node, &found)?, &found.quality)
                }
                Outcome::Unfit(_) => "unfit".into(),
            })
        }) {
            Ok(line) => format!("{seed} {line}"),
            Err(e) => format!("{seed} error {e}"),
        };
        out.push_str(&line);
        out.push('\n');
    }
    for (name, make) in common::cases::all() {
        let case = make();
        let snap = case.snapshot();
        let claims: Vec<_> = case.claims.iter().collect();
        let allocator = Allocator::new(&snap, &claims).unwrap();
        for node in [case.nodes.first().unwrap(), case.nodes.last().unwrap()] {
            let line = match allocator.allocate(node) {
                Ok(Outcome::Allocated(a)) => {
                    format!(
                        "0 {}",
                        fingerprint(&allocator.results(node, &a).unwrap(), &a.quality)
                    )
                }
                Ok(Outcome::Unfit(_)) => "unfit".into(),
                Err(e) => format!("error {e}"),
            };
            out.push_str(&format!("{name} {line}\n"));
        }
    }
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(GOLDEN, &out).unwrap();
        return;
    }
    let golden = std::fs::read_to_string(GOLDEN).unwrap();
    let differ: Vec<(&str, &str)> = golden
        .lines()
        .zip(out.lines())
        .filter(|(a, b)| a != b)
        .collect();
    assert!(
        differ.is_empty() && golden.lines().count() == out.lines().count(),
        "{} scenarios differ from golden/results.txt, e.g. {:?}",
        differ.len(),
        differ.first()
    );
}
