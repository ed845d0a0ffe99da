//! Conformance against Kubernetes' own allocator: 2,000 random snapshots (fixed seeds) are
//! run through `allocref` (k8s.io/dynamic-resource-allocation/structured v0.37.2, 1.37
//! default features; tests/cluster/cmd/allocref) and through this crate. The test fails when
//! one side allocates and the other does not, or when either answer breaks a rule (checked
//! by the independent checker in `common`). It reports cases where the reference timed out
//! but we answered. Needs Go; builds allocref when it is missing.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Case, MEDIUM, SMALL, allocref, check, generate, generate_gated};
use dra_allocator::{AllocError, Allocator, Limits, Outcome};
use k8s_openapi::api::resource::v1::AllocationResult;
use serde::Deserialize;

const CASES: u64 = 2000;

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct RefAnswer {
    allocated: bool,
    #[serde(default)]
    error: String,
    #[serde(default)]
    timed_out: bool,
    #[serde(default)]
    results: Vec<AllocationResult>,
    micros: f64,
}

/// Runs every case through the reference in one process; one answer per case.
pub fn reference(cases: &[Case]) -> Vec<RefAnswer> {
    let mut child = Command::new(allocref())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start allocref");
    let mut stdin = child.stdin.take().unwrap();
    let input: Vec<String> = cases
        .iter()
        .map(|c| serde_json::to_string(c).unwrap())
        .collect();
    let writer = std::thread::spawn(move || {
        for line in input {
            writeln!(stdin, "{line}").unwrap();
        }
    });
    let out = BufReader::new(child.stdout.take().unwrap());
    let answers: Vec<RefAnswer> = out
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).expect("allocref output"))
        .collect();
    writer.join().unwrap();
    assert!(child.wait().unwrap().success(), "allocref failed");
    assert_eq!(
        answers.len(),
        cases.len(),
        "allocref answered {} of {} cases",
        answers.len(),
        cases.len()
    );
    answers
}

#[derive(Debug)]
#[allow(dead_code)] // the payloads are for the failure report
enum Ours {
    Allocated(Vec<AllocationResult>),
    Unfit(String),
    Error(AllocError),
}

fn ours(case: &Case) -> (Ours, Duration) {
    let snap = case.snapshot();
    let claims: Vec<_> = case.claims.iter().collect();
    let start = Instant::now();
    let limits = Limits {
        deadline: Some(Instant::now() + Duration::from_secs(10)),
        cancel: None,
    };
    // The engine's path: a compact answer, results built from it afterwards.
    let r = Allocator::new(&snap, &claims).and_then(|a| {
        Ok(match a.allocate_with(&case.node, limits)?.0 {
            Outcome::Allocated(found) => Ok(a.results(&case.node, &found)?),
            Outcome::Unfit(e) => Err(e),
        })
    });
    let took = start.elapsed();
    let o = match r {
        Ok(Ok(results)) => Ours::Allocated(results),
        Ok(Err(e)) => Ours::Unfit(e.to_string()),
        Err(e) => Ours::Error(e),
    };
    (o, took)
}

#[test]
fn agrees_with_the_reference_on_2000_random_snapshots() {
    let cases: Vec<Case> = (0..CASES)
        .map(|seed| generate(seed ^ 0xC0FFEE, if seed % 2 == 0 { SMALL } else { MEDIUM }))
        .collect();
    agrees(&cases, 0xC0FFEE);
}

/// With 1.37's alpha gates the allocator reads on (DRAListTypeAttributes,
/// DRADerivedAttributes, DRADeviceCompatibilityGroups, DRAOptionalNodeOperations): the same
/// cases plus compatibility groups, list attributes with constraints on them, derived
/// attributes (shadowing, of their own, failing on some devices), and slices that skip node
/// operations.
#[test]
fn agrees_with_the_reference_with_the_alpha_gates_on_2000_random_snapshots() {
    let cases: Vec<Case> = (0..CASES)
        .map(|seed| generate_gated(seed ^ 0xA1FA, if seed % 2 == 0 { SMALL } else { MEDIUM }))
        .collect();
    agrees(&cases, 0xA1FA);
}

/// Runs `cases` (made from seeds `i ^ salt`) through the reference and this crate.
fn agrees(cases: &[Case], salt: u64) {
    let answers = reference(cases);
    let mut disagreements = Vec::new();
    let mut invalid = Vec::new();
    let (mut both_yes, mut both_no, mut error_kind_differs, mut ref_timeouts) = (0, 0, 0, 0);
    let (mut our_time, mut ref_time) = (Duration::ZERO, 0f64);
    for (i, (case, r)) in cases.iter().zip(&answers).enumerate() {
        let (o, took) = ours(case);
        our_time += took;
        ref_time += r.micros;
        if r.timed_out {
            ref_timeouts += 1;
            eprintln!("case {i}: the reference timed out; we answered {o:?} in {took:?}");
            continue;
        }
        if r.allocated
            && let Err(e) = check(case, &r.results)
        {
            invalid.push(format!(
                "case {i}: the reference's answer breaks a rule: {e}"
            ));
        }
        if let Ours::Allocated(res) = &o
            && let Err(e) = check(case, res)
        {
            invalid.push(format!("case {i}: our answer breaks a rule: {e}"));
        }
        match (&o, r.allocated) {
            (Ours::Allocated(_), true) => both_yes += 1,
            (Ours::Unfit(_), false) | (Ours::Error(_), false) => {
                both_no += 1;
                let we_error = matches!(o, Ours::Error(_));
                if we_error == r.error.is_empty() && !r.error.contains("invalid resource pools") {
                    error_kind_differs += 1;
                    eprintln!(
                        "case {i}: both say no; ours: {o:?}; reference: {:?}",
                        r.error
                    );
                }
            }
            _ => disagreements.push(format!(
                "case {i} (seed {}): ours {o:?}; reference allocated={} error={:?}\n{}",
                (i as u64) ^ salt,
                r.allocated,
                r.error,
                serde_json::to_string(case).unwrap()
            )),
        }
    }
    eprintln!(
        "{} cases: {both_yes} both allocate, {both_no} both refuse ({error_kind_differs} differ in error vs no-fit), \
         {} disagree, {ref_timeouts} reference timeouts; our total {our_time:?}, reference total {:.1} ms",
        cases.len(),
        disagreements.len(),
        ref_time / 1000.0
    );
    assert!(
        invalid.is_empty(),
        "{} invalid answers:\n{}",
        invalid.len(),
        invalid.join("\n")
    );
    assert!(
        disagreements.is_empty(),
        "{} disagreements:\n{}",
        disagreements.len(),
        disagreements[..disagreements.len().min(3)].join("\n\n")
    );
    assert!(
        both_yes > 200 && both_no > 200,
        "the generator must produce both outcomes"
    );
}
