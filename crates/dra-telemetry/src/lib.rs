//! What `dra-scheduler` and `dra-node-agent` tell an operator, told the same way by both.
//!
//! # Brief overview
//!
//! [`log::init`] installs the process's logger: a [`log::Format`] (`text` or `json`, one
//! object a line with exactly one `message` key and every field, `pod`, `node`, `claim`, as
//! a key of its own), a verbosity in kube's style (`--v`, see [`log::directives`]) or
//! `RUST_LOG`, and no colour codes unless stderr is a terminal. [`build_info`] is the
//! `*_build_info` gauge: value 1, labelled with the version, the git commit and the
//! compiler the binary was built from.
//!
//! ```
//! use dra_telemetry::log::{Format, directives};
//!
//! assert_eq!("json".parse::<Format>(), Ok(Format::Json));
//! // No --v and no RUST_LOG: info, kube's --v=0.
//! assert_eq!(directives(None, None), "info");
//! // RUST_LOG, when set, is taken as it is.
//! assert_eq!(directives(Some(4), Some("warn,kube=debug")), "warn,kube=debug");
//!
//! let registry = prometheus::Registry::new();
//! let gauge = dra_telemetry::build_info("demo_build_info", "0.1.0").unwrap();
//! registry.register(Box::new(gauge)).unwrap();
//! assert_eq!(registry.gather()[0].get_metric()[0].get_gauge().get_value(), 1.0);
//! ```
#![forbid(unsafe_code)]

pub mod log;

/// The git commit the binary was built from: `DRA_GIT_COMMIT` at build time, else `git
/// rev-parse HEAD` in release builds, else `unknown` (see `build.rs`).
pub const GIT_COMMIT: &str = env!("DRA_GIT_COMMIT");

/// `rustc --version` of the compiler that built this crate.
pub const RUSTC_VERSION: &str = env!("DRA_RUSTC_VERSION");

/// A gauge named `name`, always 1, whose labels say what was built: `version` (pass the
/// binary's `CARGO_PKG_VERSION`), `git_commit` and `rustc_version`, as Prometheus' own
/// `prometheus_build_info` and Kubernetes' `kubernetes_build_info` do, so a query can join
/// any series to the build that produced it.
pub fn build_info(name: &str, version: &str) -> prometheus::Result<prometheus::IntGauge> {
    let opts = prometheus::Opts::new(
        name,
        "A metric with a constant '1' value labelled by the version, git commit and rustc version it was built from",
    )
    .const_label("version", version)
    .const_label("git_commit", GIT_COMMIT)
    .const_label("rustc_version", RUSTC_VERSION);
    let gauge = prometheus::IntGauge::with_opts(opts)?;
    gauge.set(1);
    Ok(gauge)
}
