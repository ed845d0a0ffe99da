//! Properties on random scenarios: every allocation satisfies every rule (checked by an
//! independent checker), and on small scenarios the allocator says "no" only when an
//! exhaustive enumeration finds nothing either.

mod common;

use common::{SMALL, check, exists, generate};
use dra_allocator::{AllocError, Allocator, Outcome};
use proptest::prelude::*;

#[derive(Default, Debug)]
struct Tally {
    allocated: usize,
    unfit_enumerated: usize,
    unfit_too_big: usize,
    errors: usize,
}

fn run(seed: u64) -> Result<(), TestCaseError> {
    run_tally(seed, &mut Tally::default())
}

fn run_tally(seed: u64, tally: &mut Tally) -> Result<(), TestCaseError> {
    let case = generate(seed, SMALL);
    let snap = case.snapshot();
    let claims: Vec<_> = case.claims.iter().collect();
    // Odd seeds use best-fit packing: a different search order must give the same yes/no.
    let outcome = Allocator::new(&snap, &claims)
        .and_then(|a| a.packing(seed % 2 == 1).allocate_resolved(&case.node));
    match outcome {
        Ok(Outcome::Allocated(a)) => {
            tally.allocated += 1;
            // The checker must notice a missing device.
            let mut broken = a.results.clone();
            if let Some(r) = broken[0].devices.as_mut().and_then(|d| d.results.as_mut()) {
                r.pop();
            }
            prop_assert!(
                check(&case, &broken).is_err(),
                "seed {}: checker accepted a dropped device",
                seed
            );
            if let Err(e) = check(&case, &a.results) {
                return Err(TestCaseError::fail(format!(
                    "seed {seed}: invalid allocation: {e}\n{}",
                    serde_json::to_string(&case).unwrap()
                )));
            }
        }
        Ok(Outcome::Unfit(why)) => {
            let found = exists(&case);
            match found {
                Some(_) => tally.unfit_enumerated += 1,
                None => tally.unfit_too_big += 1,
            }
            if found == Some(true) {
                return Err(TestCaseError::fail(format!(
                    "seed {seed}: said no ({why}) but an answer exists\n{}",
                    serde_json::to_string(&case).unwrap()
                )));
            }
        }
        // Upstream errors for the whole attempt in these cases too.
        Err(AllocError::PoolNotReady { .. } | AllocError::AllConstraint { .. }) => {
            tally.errors += 1
        }
        // A selector that reads an attribute a device lacks (the generator's device of an
        // older slice generation has no `model`; on a node that sees only that generation it
        // is the pool's) fails the attempt upstream too, as a CEL runtime error.
        Err(AllocError::Cel { ref source, .. }) if source.to_string().contains("no such key") => {
            tally.errors += 1
        }
        Err(e) => {
            return Err(TestCaseError::fail(format!(
                "seed {seed}: unexpected error {e}"
            )));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]
    #[test]
    fn answers_are_valid_and_no_means_none_exists(seed in any::<u64>()) {
        run(seed)?;
    }
}

#[test]
fn fixed_seeds() {
    let mut tally = Tally::default();
    // 0..400, and seeds random runs once failed on (9758252694006444459: a selector on a
    // device that lacks the attribute).
    for seed in (0..400).chain([9758252694006444459, 11610393015384637289]) {
        run_tally(seed, &mut tally).unwrap();
    }
    eprintln!("{tally:?}");
    assert!(
        tally.allocated > 80 && tally.unfit_enumerated > 80,
        "{tally:?}"
    );
}
