//! `simulate` at fleet scale: the 500-node fleet (8 GPUs on 2 NUMA nodes and 2 NICs a node)
//! with 2,000 pending pods, from parsed manifests to the last decision. Reports time per
//! run; pods per second is 2,000 divided by it. Peak memory is measured on the binary:
//! `/usr/bin/time -v target/release/dra-scheduler simulate examples/fleet-500`.

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use dra_scheduler::fleet::{FleetSpec, generate_yaml};
use dra_scheduler::simulate::{self, manifests};

fn fleet_500_nodes_2000_pods(c: &mut Criterion) {
    let yaml = generate_yaml(&FleetSpec {
        nodes: 500,
        gpus: 8,
        pods: 2000,
    });
    let mut group = c.benchmark_group("simulate");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(60));
    group.bench_function("500 nodes x 8 GPUs, 2000 pending pods", |b| {
        b.iter(|| {
            let mut parsed = manifests::Manifests::default();
            manifests::parse_file("fleet.yaml".as_ref(), &yaml, &mut parsed).unwrap();
            let input = simulate::expand::expand(parsed).unwrap();
            let options = simulate::Options {
                scheduler_name: "dra-scheduler".into(),
                all_schedulers: false,
                ..Default::default()
            };
            let sim = simulate::simulate(&options, input);
            assert_eq!(sim.pending(), 0);
        })
    });
    group.finish();
}

criterion_group!(benches, fleet_500_nodes_2000_pods);
criterion_main!(benches);
