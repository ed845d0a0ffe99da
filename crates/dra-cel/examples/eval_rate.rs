//! Evaluations per second per core, measured in CPU time rather than wall time, for the
//! benchmark selectors. On a machine shared with other work, wall-clock benchmarks (the
//! criterion bench in benches/selector.rs) count the time other processes hold the core; the
//! thread's own CPU time (Linux /proc/thread-self/schedstat) does not.
//!
//! `cargo run --release -p dra-cel --example eval_rate`

use std::collections::BTreeMap;
use std::hint::black_box;

use dra_cel::{DeviceRef, Environment, Options};
use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// CPU time this thread has run, in nanoseconds.
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .expect("/proc/thread-self/schedstat (Linux only)")
}

fn main() {
    let int = |v| DeviceAttribute {
        int: Some(v),
        ..Default::default()
    };
    let string = |v: &str| DeviceAttribute {
        string: Some(v.into()),
        ..Default::default()
    };
    let version = |v: &str| DeviceAttribute {
        version: Some(v.into()),
        ..Default::default()
    };
    let attributes = BTreeMap::from([
        ("memoryGiB".to_string(), int(80)),
        ("index".to_string(), int(3)),
        ("type".to_string(), string("gpu")),
        (
            "uuid".to_string(),
            string("GPU-5a1b2c3d-0000-1111-2222-333344445555"),
        ),
        ("productName".to_string(), string("NVIDIA A100-SXM4-80GB")),
        ("driverVersion".to_string(), version("560.35.3")),
        (
            "resource.kubernetes.io/pciBusID".to_string(),
            string("0000:3b:00.0"),
        ),
    ]);
    let capacity = BTreeMap::from([(
        "memory".to_string(),
        DeviceCapacity {
            value: Quantity("80Gi".into()),
            ..Default::default()
        },
    )]);
    let (attributes, capacity) = (
        dra_cel::sorted(Some(attributes)),
        dra_cel::sorted(Some(capacity)),
    );
    let device = DeviceRef {
        driver: "gpu.example.com",
        attributes: &attributes,
        capacity: &capacity,
        allow_multiple_allocations: false,
    };
    let env = Environment::new(Options::default());
    for expr in [
        r#"device.attributes["gpu.example.com"].memoryGiB >= 80 && device.driver == "gpu.example.com""#,
        r#"device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0"#,
        r#"device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("550.0.0"))"#,
        r#"device.attributes.exists(d, d == "resource.kubernetes.io")"#,
    ] {
        let selector = env.compile(expr).unwrap();
        assert!(selector.matches(device).unwrap());
        let n = 200_000;
        let mut best = f64::MAX;
        for _ in 0..5 {
            let start = cpu_ns();
            for _ in 0..n {
                black_box(selector.matches(black_box(device)).unwrap());
            }
            best = best.min((cpu_ns() - start) as f64 / n as f64);
        }
        println!(
            "{:>7.0} ns  {:>5.2} M evaluations/s per core  {expr}",
            best,
            1000.0 / best
        );
    }
}
