//! Stamps the build for `build_info`: the git commit and the compiler's version.
//!
//! The commit comes from `DRA_GIT_COMMIT` when set (the Dockerfile's build context has no
//! `.git`, so it passes the commit in), else, in profiles that inherit `release`, from
//! `git rev-parse HEAD`. Other profiles are not stamped from git: the script would have to
//! rerun at every commit, and then everything that links this crate would be rebuilt,
//! which a debug build's metrics are not worth.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=DRA_GIT_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    let commit = match std::env::var("DRA_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ if std::env::var("PROFILE").as_deref() == Ok("release") => {
            git_head().unwrap_or_else(|| "unknown".into())
        }
        _ => "unknown".into(),
    };
    println!("cargo:rustc-env=DRA_GIT_COMMIT={commit}");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=DRA_RUSTC_VERSION={version}");
}

/// HEAD's commit, watching the files that change when it moves (HEAD, the branch it names,
/// packed-refs), so a new commit restamps the next release build.
fn git_head() -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--verify", "HEAD"])?;
    let mut watch = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(branch);
    }
    for path in watch {
        if let Some(p) = git(&["rev-parse", "--path-format=absolute", "--git-path", &path])
            && PathBuf::from(&p).exists()
        {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    Some(commit)
}
