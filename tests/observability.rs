//! What an operator watches, checked against what the daemon does: the chart's Grafana
//! dashboard (`charts/dra-scheduler/dashboards/dra-scheduler.json`) and alerting rules
//! (`charts/dra-scheduler/rules/dra-scheduler.rules.yaml`) ask only for series a running
//! daemon exports; Prometheus' own promtool finds the rules valid, their unit tests
//! (`tests/data/observability/`) pass, every dashboard query parses and the live `/metrics`
//! is clean; the README lists the panels and alerts exactly as `scripts/dashboard-doc.py`
//! prints them.
//!
//! promtool is built from the Go module github.com/prometheus/prometheus by
//! `tests/cluster/promtool/build-promtool.sh` (once per machine).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::Value;
use test_cluster::{TestCluster, eventually};

mod common;
use common::{apply, kubectl_apply_text, kubectl_ok, node_of, repo, run, scrape};

fn dashboard_path() -> PathBuf {
    repo().join("charts/dra-scheduler/dashboards/dra-scheduler.json")
}

fn rules_path() -> PathBuf {
    repo().join("charts/dra-scheduler/rules/dra-scheduler.rules.yaml")
}

fn dashboard() -> Value {
    serde_json::from_str(&std::fs::read_to_string(dashboard_path()).unwrap())
        .expect("the dashboard is JSON")
}

fn rules() -> Value {
    serde_yaml::from_str(&std::fs::read_to_string(rules_path()).unwrap())
        .expect("the rules file is YAML")
}

/// `promtool`, built on first use by `build-promtool.sh` (which keeps a built one).
fn promtool() -> Command {
    static PROMTOOL: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let binary = PROMTOOL.get_or_init(|| {
        let script = repo().join("tests/cluster/promtool/build-promtool.sh");
        let out = run(Command::new("bash").arg(script));
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    });
    let mut cmd = Command::new(binary);
    cmd.stdin(Stdio::null());
    cmd
}

/// Every PromQL query of the dashboard and the rules, each with where it comes from
/// ("panel <title>", "variable <name>", "alert <name>").
fn queries() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let dashboard = dashboard();
    let mut panels: Vec<&Value> = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        panels.push(panel);
        panels.extend(panel["panels"].as_array().into_iter().flatten());
    }
    for panel in panels {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("every target has an expr");
            out.push((
                format!("panel {}", panel["title"].as_str().unwrap()),
                expr.into(),
            ));
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["query"]["query"].as_str() {
            // Grafana's label_values(SELECTOR, LABEL): the selector is the query.
            let selector = query
                .strip_prefix("label_values(")
                .and_then(|q| q.rsplit_once(','))
                .map(|(selector, _)| selector)
                .unwrap_or_else(|| panic!("variable query {query:?} is label_values()"));
            out.push((
                format!("variable {}", variable["name"].as_str().unwrap()),
                selector.into(),
            ));
        }
    }
    for group in rules()["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["alert"].as_str().or(rule["record"].as_str()).unwrap();
            out.push((
                format!("alert {name}"),
                rule["expr"].as_str().unwrap().into(),
            ));
        }
    }
    out
}

/// A query as Prometheus reads it: Grafana's interval variables replaced by durations
/// (the others only stand in label values, which are strings).
fn as_promql(query: &str) -> String {
    query
        .replace("$__rate_interval", "5m")
        .replace("$__interval", "1m")
        .replace("$__range", "1h")
}

/// The metric names a PromQL expression selects: every identifier that is not a function
/// or aggregation (followed by `(`), a keyword, a label in a grouping or matching list,
/// a label matcher (`{...}`), a duration or subquery (`[...]`), a number or a string.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const KEYWORDS: &[&str] = &[
        "and", "or", "unless", "atan2", "bool", "offset", "inf", "nan",
    ];
    const LABEL_LISTS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let next_non_space = |mut i: usize| {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        i
    };
    // The index just past the bracket that closes the one at `open`, skipping strings.
    let skip_group = |open: usize| {
        let (left, right) = match chars[open] {
            '(' => ('(', ')'),
            '{' => ('{', '}'),
            _ => ('[', ']'),
        };
        let mut depth = 0;
        let mut i = open;
        while i < chars.len() {
            match chars[i] {
                '"' | '\'' | '`' => {
                    i = skip_string(&chars, i);
                    continue;
                }
                c if c == left => depth += 1,
                c if c == right => {
                    depth -= 1;
                    if depth == 0 {
                        return i + 1;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        panic!("unclosed {left} in {expr}")
    };
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&chars, i);
        } else if c == '{' || c == '[' {
            i = skip_group(i);
        } else if c.is_ascii_digit() || c == '.' || c == '$' {
            // Numbers, durations (5m, 1h30m) and Grafana variables.
            i += 1;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_.{}".contains(chars[i]))
            {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_:".contains(chars[i])) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let after = next_non_space(i);
            let rest: String = chars[after..].iter().collect();
            // A call, or an aggregation whose grouping comes first (`sum by (le) (...)`).
            let called = rest.starts_with('(')
                || ["by", "without"].iter().any(|k| {
                    rest.strip_prefix(k)
                        .is_some_and(|r| r.trim_start().starts_with('('))
                });
            if LABEL_LISTS.contains(&word.as_str()) {
                if called {
                    i = skip_group(after);
                }
            } else if !called && !KEYWORDS.contains(&word.to_lowercase().as_str()) {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// The index just past the string that starts at `open` (its quote), escapes honoured
/// except in backquoted raw strings.
fn skip_string(chars: &[char], open: usize) -> usize {
    let quote = chars[open];
    let mut i = open + 1;
    while i < chars.len() && chars[i] != quote {
        if chars[i] == '\\' && quote != '`' {
            i += 1;
        }
        i += 1;
    }
    i + 1
}

/// The sample names of a text exposition (histograms as their `_bucket`, `_sum` and
/// `_count` series).
fn exposed(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            l.split(|c: char| c == '{' || c.is_whitespace())
                .next()
                .unwrap()
                .to_string()
        })
        .collect()
}

/// Series Prometheus makes itself for every target, which the rules may ask for.
const MADE_BY_PROMETHEUS: &[&str] = &["up"];

/// Each metric some query names that `exported` lacks, with the queries naming it.
fn missing(exported: &BTreeSet<String>) -> BTreeMap<String, Vec<String>> {
    let mut missing: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (place, query) in queries() {
        for name in metric_names(&query) {
            if !exported.contains(&name) && !MADE_BY_PROMETHEUS.contains(&name.as_str()) {
                missing.entry(name).or_default().push(place.clone());
            }
        }
    }
    missing
}

#[test]
fn metric_names_are_the_selected_series_and_nothing_else() {
    let names = |expr: &str| metric_names(expr).into_iter().collect::<Vec<_>>();
    assert_eq!(
        names(
            r#"histogram_quantile(0.99, sum by (le, resource) (rate(a_seconds_bucket{job=~"x|y", resource!="on(b)"}[$__rate_interval])))"#
        ),
        ["a_seconds_bucket"]
    );
    assert_eq!(
        names(
            "sum(b{queue!='gated'} offset 5m) without (instance) / on (instance) group_left (pod) c > bool 1e3 and d unless e[1h:5m] or absent(up == 1)"
        ),
        ["b", "c", "d", "e", "up"]
    );
    assert_eq!(
        names(r#"count(x) by(le) > Inf or label_replace(y, "dst", "$1", "src", `a\`)"#),
        ["x", "y"]
    );
}

/// The dashboard is one Grafana can load from the sidecar: a Prometheus data-source
/// variable that every panel and query uses, distinct panel ids, and panels that do not
/// overlap.
#[test]
fn the_dashboard_uses_its_datasource_variable_everywhere_and_its_panels_do_not_overlap() {
    let d = dashboard();
    assert_eq!(d["uid"], "dra-scheduler");
    assert!(d["schemaVersion"].as_u64().unwrap() >= 39);
    let variables = d["templating"]["list"].as_array().unwrap();
    let datasource = variables
        .iter()
        .find(|v| v["name"] == "datasource")
        .expect("a datasource variable");
    assert_eq!(datasource["type"], "datasource");
    assert_eq!(datasource["query"], "prometheus");
    let uses = serde_json::json!({"type": "prometheus", "uid": "${datasource}"});
    let mut ids = BTreeSet::new();
    let mut cells = BTreeSet::new();
    for panel in d["panels"].as_array().unwrap() {
        let title = &panel["title"];
        assert!(ids.insert(panel["id"].as_u64().unwrap()), "id of {title}");
        let g = &panel["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| g[k].as_u64().unwrap());
        assert!(x + w <= 24, "{title} is wider than the dashboard");
        for cell in (x..x + w).flat_map(|x| (y..y + h).map(move |y| (x, y))) {
            assert!(
                cells.insert(cell),
                "{title} overlaps another panel at {cell:?}"
            );
        }
        if panel["type"] == "row" {
            continue;
        }
        assert!(
            !panel["description"].as_str().unwrap_or("").is_empty(),
            "{title} says what it shows"
        );
        assert_eq!(panel["datasource"], uses, "{title}");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title} has a query");
        for t in targets {
            assert_eq!(t["datasource"], uses, "{title}");
        }
    }
}

/// Every dashboard query is PromQL that Prometheus parses, Grafana's interval variables
/// standing for durations.
#[test]
fn every_dashboard_query_parses_as_promql() {
    for (place, query) in queries() {
        let out = promtool()
            .args(["--experimental", "promql", "format"])
            .arg(as_promql(&query))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{place}: {query}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `promtool check rules` accepts the chart's rules file and `promtool test rules` passes
/// its scenarios; the same scenarios fail against rules whose alert waits longer, so they
/// do test the rules.
#[test]
fn promtool_checks_the_rules_and_their_unit_tests_pass_and_can_fail() {
    let out = run(promtool().args(["check", "rules"]).arg(rules_path()));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("SUCCESS"), "{text}");

    let tests = repo().join("tests/data/observability/dra-scheduler.rules.test.yaml");
    let out = run(promtool().args(["test", "rules"]).arg(&tests));
    assert!(String::from_utf8_lossy(&out.stdout).contains("SUCCESS"));

    // The mutation: DraSchedulerNoLeader waits 50 minutes instead of 5.
    let dir = std::env::temp_dir().join(format!("dra-observability-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(rules_path()).unwrap();
    let (before, after) = text.split_once("alert: DraSchedulerNoLeader").unwrap();
    let mutated = format!(
        "{before}alert: DraSchedulerNoLeader{}",
        after.replacen("for: 5m", "for: 50m", 1)
    );
    std::fs::write(dir.join("rules.yaml"), mutated).unwrap();
    let mut scenarios: Value =
        serde_yaml::from_str(&std::fs::read_to_string(&tests).unwrap()).unwrap();
    scenarios["rule_files"] = serde_json::json!([dir.join("rules.yaml")]);
    std::fs::write(
        dir.join("test.yaml"),
        serde_json::to_string(&scenarios).unwrap(),
    )
    .unwrap();
    let out = promtool()
        .args(["test", "rules"])
        .arg(dir.join("test.yaml"))
        .output()
        .unwrap();
    let report =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(!out.status.success(), "{report}");
    assert!(
        report.contains("alertname: DraSchedulerNoLeader, time: 16m"),
        "{report}"
    );
}

/// The README's "Dashboard and alerts" lists exactly what `scripts/dashboard-doc.py`
/// prints from the dashboard and the rules.
#[test]
fn the_readme_lists_the_dashboards_panels_and_the_alerts() {
    let out = run(Command::new("python3").arg(repo().join("scripts/dashboard-doc.py")));
    let list = String::from_utf8(out.stdout).unwrap();
    for (place, _) in queries().iter().filter(|(p, _)| !p.starts_with("variable")) {
        let name = place.split_once(' ').unwrap().1;
        assert!(list.contains(name), "{place} is listed:\n{list}");
    }
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    assert!(
        readme.contains(&list),
        "README.md's list of panels and alerts is out of date: run \
         scripts/dashboard-doc.py --update README.md\n{list}"
    );
}

fn write_config(dir: &Path, text: &str) -> String {
    let path = dir.join("observability-config.yaml");
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

/// A pod `name` for dra-scheduler with the claim of `template` (none when empty).
fn pod(name: &str, template: &str) -> String {
    let claims = if template.is_empty() {
        String::new()
    } else {
        format!("\n  resourceClaims: [{{name: gpu, resourceClaimTemplateName: {template}}}]")
    };
    let uses = if template.is_empty() {
        ""
    } else {
        ", claims: [{name: gpu}]"
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  schedulerName: dra-scheduler{claims}\n  \
         containers: [{{name: c, image: busybox, resources: {{requests: {{cpu: 100m}}{uses}}}}}]\n"
    )
}

/// Every series the dashboard and the alerts ask for is one a running daemon exports,
/// once it has done what each counts: placed pods (one on a T10 that then becomes
/// degraded when the A5000 frees), refused one that fits nowhere, and had a binding
/// refused by the API server. promtool's `check metrics` finds that `/metrics` clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_the_dashboard_and_the_alerts_ask_for_is_one_the_daemon_exports() {
    let cluster = TestCluster::dedicated();
    let config = write_config(cluster.dir(), "degraded: {intervalSeconds: 1}\n");
    let daemon = common::start_scheduler_with(&cluster, &["--config", &config]);
    apply(
        &cluster,
        &[
            "examples/first-available/fleet.yaml",
            "tests/data/observability/scenario.yaml",
        ],
    );
    let pods: Api<Pod> = Api::namespaced(cluster.client().await, "default");
    let bound = |name: &'static str| {
        let pods = pods.clone();
        async move {
            eventually(&format!("pod {name} bound"), 60, || async {
                node_of(&pods.get(name).await.ok()?).map(str::to_string)
            })
            .await
        }
    };

    // The A5000 goes to `holder`, so `fallback` gets a T10; when `holder` is gone the
    // A5000 is free and `fallback` is degraded.
    kubectl_apply_text(&cluster, "holder", pod("holder", "a5000").as_bytes());
    bound("holder").await;
    kubectl_apply_text(
        &cluster,
        "fallback",
        pod("fallback", "a5000-else-t10").as_bytes(),
    );
    bound("fallback").await;
    kubectl_ok(
        &cluster,
        &["delete", "pod", "holder", "--grace-period=0", "--force"],
    );
    kubectl_apply_text(&cluster, "greedy", pod("greedy", "four-gpus").as_bytes());
    // The binding of `refused` must meet the policy: wait until it refuses its probe.
    eventually("the binding policy in force", 60, || async {
        let out = cluster
            .kubectl()
            .args(["create", "configmap", "policy-probe", "--dry-run=server"])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stderr)
            .contains("refused by the observability test")
            .then_some(())
    })
    .await;
    kubectl_apply_text(&cluster, "refused", pod("refused", "").as_bytes());

    let started = std::time::Instant::now();
    let (text, missing) = loop {
        let text = scrape(&daemon.metrics).await.unwrap_or_default();
        let missing = missing(&exposed(&text));
        if missing.is_empty() || started.elapsed().as_secs() > 60 {
            break (text, missing);
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    assert!(
        missing.is_empty(),
        "metrics the dashboard or the alerts name that the daemon does not export \
         (metric: where): {missing:#?}\n/metrics:\n{text}"
    );
    assert!(
        text.contains("dra_scheduler_degraded_pods{namespace=\"default\""),
        "{text}"
    );

    // promtool reads the exposition on stdin.
    let exposition = cluster.dir().join("metrics.txt");
    std::fs::write(&exposition, &text).unwrap();
    let out = promtool()
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&exposition).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
