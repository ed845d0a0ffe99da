//! Prometheus' own metric linter on a `/metrics` text: the checks `promtool check metrics`
//! makes (counters end in `_total` and nothing else does, base units, no abbreviated units,
//! snake_case, help text, no reserved labels), from `tests/cluster/cmd/promlint`.
//!
//! That program calls client_golang's `promlint`, the package promtool itself calls.
//! promtool is not built: it took 7.5 minutes here, for every service discovery
//! Prometheus ships, while client_golang is already in the control plane's Go module.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::repo_root;

fn modified(p: &std::path::Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// `tests/cluster/bin/promlint`, built when missing or older than its source or go.mod.
/// Built under another name and renamed, so tests running at once never run a half-written
/// binary.
fn binary() -> PathBuf {
    let dir = repo_root().join("tests/cluster");
    let bin = dir.join("bin/promlint");
    let sources = [dir.join("cmd/promlint/main.go"), dir.join("go.mod")];
    if modified(&bin).is_some() && sources.iter().all(|s| modified(&bin) >= modified(s)) {
        return bin;
    }
    let tmp = format!("bin/.promlint-{}", std::process::id());
    let out = Command::new("go")
        .args(["build", "-o", &tmp, "./cmd/promlint"])
        .current_dir(&dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("building tests/cluster/cmd/promlint needs Go (see tests/cluster/go.mod): {e}")
        });
    assert!(
        out.status.success(),
        "go build ./cmd/promlint in {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(dir.join(&tmp), &bin).expect("move promlint into place");
    bin
}

/// The problems the linter finds in a text exposition, each as "metric problem"; empty
/// when there are none. Panics when the text cannot be parsed.
pub fn promlint(exposition: &str) -> Vec<String> {
    use std::io::Write;
    let mut child = Command::new(binary())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promlint");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .expect("write to promlint");
    let out = child.wait_with_output().expect("wait for promlint");
    let problems: Vec<String> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(str::to_string)
        .collect();
    match out.status.code() {
        Some(0) => assert!(problems.is_empty(), "{problems:?}"),
        Some(3) => assert!(!problems.is_empty(), "exit 3 without a problem"),
        _ => panic!("promlint failed ({}): {problems:?}", out.status),
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_linter_finds_what_breaks_prometheus_conventions() {
        let bad = "# HELP jobs_done Jobs.\n# TYPE jobs_done counter\njobs_done 1\n\
                   # HELP queue_total Queued.\n# TYPE queue_total gauge\nqueue_total 1\n\
                   # HELP wait_ms Wait.\n# TYPE wait_ms gauge\nwait_ms 1\n";
        let mut problems = promlint(bad);
        problems.sort();
        assert_eq!(
            problems,
            [
                "jobs_done counter metrics should have \"_total\" suffix",
                "queue_total non-counter metrics should not have \"_total\" suffix",
                "wait_ms metric names should not contain abbreviated units",
            ]
        );
        let good =
            "# HELP jobs_done_total Jobs.\n# TYPE jobs_done_total counter\njobs_done_total 1\n";
        assert_eq!(promlint(good), Vec::<String>::new());
    }
}
