//! The cost bound: expressions whose worst case exceeds Kubernetes' 1,000,000 units are
//! rejected with a cost error before they run; ordinary selectors are far below it.

use dra_cel::{CelErrorKind, Environment, MAX_COST};

fn cost_error(expr: &str) {
    let env = Environment::default();
    // Refused by compile, which runs nothing: the bound holds before any evaluation.
    let err = env.compile(expr).expect_err(expr);
    assert_eq!(err.kind, CelErrorKind::Cost, "{expr}: {err:?}");
    assert_eq!(err.expression, expr);
    assert!(err.message.contains("exceeds"), "{}", err.message);
}

#[test]
fn deliberately_expensive_expressions_are_stopped() {
    // A million iterations, each doing work: Kubernetes stops this at run time.
    cost_error("lists.range(1000).all(i, lists.range(1000).all(j, i + j >= 0))");
    // 32^4 ≈ 1M walks over the device's attribute domains.
    cost_error(
        "device.attributes.all(a, device.attributes.all(b, device.attributes.all(c, \
         device.attributes.all(d, a + b + c + d != ''))))",
    );
    // Strings that square in size at each step.
    cost_error(
        "cel.bind(a, 'xxxxxxxxxxxxxxxxxxxx'.replace('', 'xxxxxxxxxxxxxxxxxxxx'), \
         cel.bind(b, a.replace('', a), cel.bind(c, b.replace('', b), c.size() > 0)))",
    );
    // A range whose size depends on data cannot be bounded.
    cost_error("lists.range(device.attributes['d'].n).exists(i, i == 7)");
    // Lists that double each time they are concatenated with themselves.
    cost_error(
        "cel.bind(a, lists.range(64), cel.bind(b, a + a + a + a, cel.bind(c, b + b + b + b, \
         c.all(x, c.all(y, c.exists(z, x + y + z == 0))))))",
    );
}

#[test]
fn ordinary_selectors_are_cheap() {
    let env = Environment::default();
    for expr in [
        "device.attributes['gpu.example.com'].memoryGiB >= 80 && device.driver == 'gpu.example.com'",
        "device.capacity['gpu.example.com'].memory.compareTo(quantity('40Gi')) >= 0",
        "device.attributes.exists(d, device.attributes[d].size() > 3)",
        "cel.bind(g, device.attributes['gpu.example.com'], g.model.lowerAscii().matches('^a100') && g.driverVersion.isGreaterThan(semver('1.2.0')))",
        "lists.range(100).all(i, i >= 0)",
    ] {
        let s = env
            .compile(expr)
            .unwrap_or_else(|e| panic!("{expr}: {e:?}"));
        assert!(
            s.estimated_cost() < MAX_COST / 10,
            "{expr}: {}",
            s.estimated_cost()
        );
    }
}
