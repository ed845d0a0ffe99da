//! Compiled-selector evaluation speed: evaluations per second on one core for the selectors
//! the scheduler runs against every candidate device.
//!
//! `cargo bench -p dra-cel --bench selector -- --measurement-time 3`

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dra_cel::{DeviceRef, Environment, Options};
use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

fn gpu() -> (
    BTreeMap<String, DeviceAttribute>,
    BTreeMap<String, DeviceCapacity>,
) {
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
        ("architecture".to_string(), string("Ampere")),
        ("driverVersion".to_string(), version("560.35.3")),
        ("cudaComputeCapability".to_string(), version("8.0.0")),
        (
            "resource.kubernetes.io/pciBusID".to_string(),
            string("0000:3b:00.0"),
        ),
        (
            "resource.kubernetes.io/pcieRoot".to_string(),
            string("pci0000:3a"),
        ),
    ]);
    let capacity = BTreeMap::from([(
        "memory".to_string(),
        DeviceCapacity {
            value: Quantity("80Gi".into()),
            ..Default::default()
        },
    )]);
    (attributes, capacity)
}

fn bench(c: &mut Criterion) {
    let (attributes, capacity) = gpu();
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
    let mut group = c.benchmark_group("selector");
    group.throughput(Throughput::Elements(1));
    for (name, expr) in [
        (
            "attribute_and_driver",
            r#"device.attributes["gpu.example.com"].memoryGiB >= 80 && device.driver == "gpu.example.com""#,
        ),
        (
            "quantity_comparison",
            r#"device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0"#,
        ),
        (
            "version_and_string",
            r#"device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("550.0.0")) && device.attributes["gpu.example.com"].type == "gpu""#,
        ),
        (
            "exists_over_domains",
            r#"device.attributes.exists(d, d == "resource.kubernetes.io")"#,
        ),
    ] {
        let selector = env.compile(expr).unwrap();
        assert!(selector.matches(device).unwrap(), "{name}");
        group.bench_function(name, |b| b.iter(|| selector.matches(black_box(device))));
    }
    group.bench_function("compile_cached", |b| {
        b.iter(|| env.compile(black_box(r#"device.driver == "gpu.example.com""#)))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
