//! The gang examples (PodGroups named in `pod.spec.schedulingGroup`) applied to a real
//! Kubernetes 1.37 control plane whose kube-scheduler has the workload-aware plugins on
//! (GangScheduling, TopologyPlacementGenerator: the gates `tests/cluster/cluster.sh` sets),
//! against `simulate` and the live `dra-scheduler run` (on a control plane of its own) on
//! the same manifests: every group kube-scheduler places, both place too; where
//! kube-scheduler refuses a group that fits (kubernetes/kubernetes#138765, its first-fit
//! device choice is never revisited) both place it; the live scheduler places what
//! simulate places; and the real API server accepts simulate's allocations as claim status
//! (and the live scheduler's, which it wrote itself).
//!
//! `cargo test --test gang_reference -- --nocapture --test-threads 1` prints the table,
//! one example at a time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use dra_engine::group::pod_group_name;
use dra_scheduler::simulate::manifests::{self, Object};
use dra_scheduler::simulate::{self, Simulation};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use kube::api::ListParams;
use kube::{Api, Client};
use test_cluster::TestCluster;

mod common;

/// An example, and the groups kube-scheduler 1.37 is known to refuse although they fit,
/// with what its messages say.
struct Case {
    example: &'static str,
    refused_by_kube_scheduler: &'static [Refusal],
}

struct Refusal {
    group: &'static str,
    /// In the PodGroup's `PodGroupInitiallyScheduled` condition.
    group_message: &'static str,
    /// In some member's `PodScheduled` condition.
    pod_message: &'static str,
}

const CASES: &[Case] = &[
    Case {
        example: "gang-backtracking",
        refused_by_kube_scheduler: &[Refusal {
            group: "pair",
            group_message: "minCount (2) cannot be satisfied",
            pod_message: "cannot allocate all claims",
        }],
    },
    Case {
        example: "gang-8x8",
        refused_by_kube_scheduler: &[],
    },
    Case {
        example: "gang-rack",
        refused_by_kube_scheduler: &[],
    },
    Case {
        example: "gang-shared-claim",
        refused_by_kube_scheduler: &[],
    },
];

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
}

/// What one scheduler did with one PodGroup.
#[derive(Debug, Default)]
struct Outcome {
    members: usize,
    placed: usize,
    /// Why not all members were placed (the group's message, then the members' ones).
    messages: Vec<String>,
}

impl Outcome {
    fn cell(&self) -> String {
        if self.placed == self.members {
            format!("placed {}/{}", self.placed, self.members)
        } else {
            format!("refused {}/{}", self.placed, self.members)
        }
    }
}

fn kubectl_apply(cluster: &TestCluster, object: &serde_json::Value) {
    use std::io::Write;
    let mut child = cluster
        .kubectl()
        .args(["apply", "-n", "default", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kubectl");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(object.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The kinds the gang examples use.
fn as_json(object: &Object) -> serde_json::Value {
    match object {
        Object::Node(o) => serde_json::to_value(o),
        Object::Pod(o) => serde_json::to_value(o),
        Object::Job(o) => serde_json::to_value(o),
        Object::ResourceClaimTemplate(o) => serde_json::to_value(o),
        Object::ResourceClaim(o) => serde_json::to_value(o),
        Object::DeviceClass(o) => serde_json::to_value(o),
        Object::ResourceSlice(o) => serde_json::to_value(o),
        Object::Workload(o) => serde_json::to_value(o),
        Object::PodGroup(o) => serde_json::to_value(o),
        other => panic!("{} is not used by the gang examples", other.kind()),
    }
    .unwrap()
}

/// The PodGroup a pod-making document's pods name, and how many pods it makes.
fn group_and_pods(object: &Object) -> Option<(String, usize)> {
    match object {
        Object::Pod(p) => Some((pod_group_name(p)?.to_string(), 1)),
        Object::Job(j) => {
            let spec = j.spec.as_ref()?;
            let group = spec
                .template
                .spec
                .as_ref()?
                .scheduling_group
                .as_ref()?
                .pod_group_name
                .clone()?;
            let parallelism = spec.parallelism.unwrap_or(1).max(0) as usize;
            let pods = spec
                .completions
                .map_or(parallelism, |c| parallelism.min(c.max(0) as usize));
            Some((group, pods))
        }
        _ => None,
    }
}

/// Apply the example the way simulate schedules it: everything but the pods first, then
/// the pods of one PodGroup at a time (in input order), waiting until kube-scheduler has
/// decided that group before the next one comes. Gangs that arrive together would otherwise
/// be tried in whatever order kube-controller-manager creates their pods.
async fn apply_group_by_group(
    cluster: &TestCluster,
    client: &Client,
    dir: &Path,
) -> Vec<(String, Outcome)> {
    let documents = manifests::load(&[dir.to_path_buf()])
        .expect("example loads")
        .objects;
    let mut groups: Vec<(String, Vec<&Object>, usize)> = Vec::new();
    for doc in &documents {
        match group_and_pods(&doc.object) {
            None => kubectl_apply(cluster, &as_json(&doc.object)),
            Some((group, pods)) => match groups.iter_mut().find(|(g, ..)| *g == group) {
                Some((_, docs, n)) => {
                    docs.push(&doc.object);
                    *n += pods;
                }
                None => groups.push((group, vec![&doc.object], pods)),
            },
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod_groups: Api<PodGroup> = Api::namespaced(client.clone(), "default");
    let mut outcomes = Vec::new();
    for (group, docs, expected) in groups {
        for doc in docs {
            kubectl_apply(cluster, &as_json(doc));
        }
        let members = settle(&pods, &group, expected).await;
        let mut outcome = Outcome {
            members: members.len(),
            placed: members.iter().filter(|p| node_of(p).is_some()).count(),
            messages: Vec::new(),
        };
        let condition = pod_groups
            .get(&group)
            .await
            .unwrap()
            .status
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "PodGroupInitiallyScheduled" && c.status == "False");
        outcome.messages.extend(condition.map(|c| c.message));
        for pod in &members {
            if let Some(message) = unschedulable(pod)
                && !outcome.messages.contains(&message)
            {
                outcome.messages.push(message);
            }
        }
        outcomes.push((group, outcome));
    }
    outcomes
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// The message of a `PodScheduled=False` condition.
fn unschedulable(pod: &Pod) -> Option<String> {
    pod.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .map(|c| c.message.clone().unwrap_or_default())
}

/// Wait until all `expected` pods of `group` exist and kube-scheduler has decided each
/// (bound, or PodScheduled=False), then a little longer for a retry to land.
async fn settle(pods: &Api<Pod>, group: &str, expected: usize) -> Vec<Pod> {
    let members = |list: Vec<Pod>| -> Vec<Pod> {
        list.into_iter()
            .filter(|p| pod_group_name(p) == Some(group))
            .collect()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let list = members(pods.list(&ListParams::default()).await.unwrap().items);
        let decided = list
            .iter()
            .filter(|p| node_of(p).is_some() || unschedulable(p).is_some())
            .count();
        if list.len() >= expected && decided == list.len() {
            tokio::time::sleep(Duration::from_secs(3)).await;
            return members(pods.list(&ListParams::default()).await.unwrap().items);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "kube-scheduler did not decide all {expected} pods of PodGroup {group} in 180s \
             ({decided} of {} decided)",
            list.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn simulate_example(dir: &Path) -> Simulation {
    let (input, groups) = simulate::load_all(&[dir.to_path_buf()]).expect("example loads");
    simulate::simulate_groups(
        &simulate::Options {
            scheduler_name: "dra-scheduler".into(),
            all_schedulers: false,
            ..Default::default()
        },
        input,
        groups,
    )
}

fn simulated_outcomes(sim: &Simulation) -> BTreeMap<String, Outcome> {
    sim.groups
        .iter()
        .map(|g| {
            let outcome = Outcome {
                members: g.members.len(),
                placed: g.placed,
                messages: g.message.iter().cloned().collect(),
            };
            (g.group.name.clone(), outcome)
        })
        .collect()
}

/// One example through the three schedulers (the examples run as tests of their own, so
/// that two run at once).
async fn compare(name: &str) {
    let mut rows = vec![[
        "case".to_string(),
        "kube-scheduler 1.37.2".to_string(),
        "dra-scheduler simulate".to_string(),
        "dra-scheduler run".to_string(),
    ]];
    let mut notes = Vec::new();
    for case in CASES.iter().filter(|c| c.example == name) {
        eprintln!("example {}", case.example);
        // Each example has its own cluster: examples reuse node and class names.
        let cluster = TestCluster::dedicated();
        cluster
            .start_reference_scheduler("dra-scheduler")
            .expect("kube-scheduler starts");
        let client = cluster.client().await;
        let dir = example(case.example);
        let reference = apply_group_by_group(&cluster, &client, &dir).await;
        let sim = simulate_example(&dir);
        let ours = simulated_outcomes(&sim);
        let written = common::api_server_accepts_allocations(&cluster, &sim, case.example).await;
        assert!(written > 0, "{}: simulate allocated no claim", case.example);
        drop(cluster);
        // The live scheduler, on a control plane of its own, gets the same manifests in the
        // same order.
        let live_cluster = TestCluster::dedicated();
        let _daemon = common::start_scheduler_with(&live_cluster, &["--leader-elect=false"]);
        let live_client = live_cluster.client().await;
        let live: BTreeMap<String, Outcome> =
            apply_group_by_group(&live_cluster, &live_client, &dir)
                .await
                .into_iter()
                .collect();
        drop(live_cluster);

        let mut groups: Vec<&String> = reference.iter().map(|(g, _)| g).collect();
        groups.sort();
        assert_eq!(
            groups,
            ours.keys().collect::<Vec<_>>(),
            "{}: the groups",
            case.example
        );
        for (group, theirs) in &reference {
            let ours = &ours[group];
            assert_eq!(
                theirs.members, ours.members,
                "{}: members of {group}",
                case.example
            );
            assert!(
                ours.placed >= theirs.placed,
                "{}: kube-scheduler placed {} of {group}'s pods, simulate {}\n\
                 kube-scheduler: {theirs:?}\nsimulate: {ours:?}",
                case.example,
                theirs.placed,
                ours.placed
            );
            let live = &live[group];
            assert_eq!(
                live.placed, ours.placed,
                "{}: simulate placed {} of {group}'s pods, the live scheduler {}\n\
                 simulate: {ours:?}\nlive: {live:?}",
                case.example, ours.placed, live.placed
            );
            let label = format!("{}/{group}", case.example);
            rows.push([label.clone(), theirs.cell(), ours.cell(), live.cell()]);
            for m in &live.messages {
                notes.push(format!("{label}: dra-scheduler run: {m}"));
            }
            for m in &theirs.messages {
                notes.push(format!("{label}: kube-scheduler: {m}"));
            }
            for m in &ours.messages {
                notes.push(format!("{label}: simulate: {m}"));
            }
        }
        for refusal in case.refused_by_kube_scheduler {
            let (_, theirs) = reference
                .iter()
                .find(|(g, _)| g == refusal.group)
                .expect("the refused group is in the example");
            let label = format!("{}/{}", case.example, refusal.group);
            assert_eq!(theirs.placed, 0, "{label}: kube-scheduler bound none");
            for expected in [refusal.group_message, refusal.pod_message] {
                assert!(
                    theirs.messages.iter().any(|m| m.contains(expected)),
                    "{label}: kube-scheduler says {expected:?}; it said {:?}",
                    theirs.messages
                );
            }
            let ours = &ours[refusal.group];
            assert_eq!(
                ours.placed, ours.members,
                "{label}: simulate places the whole group: {ours:?}"
            );
        }
    }
    let width = |i: usize| rows.iter().map(|r| r[i].len()).max().unwrap_or(0);
    let (a, b, c) = (width(0), width(1), width(2));
    for row in &rows {
        println!("{:a$}  {:b$}  {:c$}  {}", row[0], row[1], row[2], row[3]);
    }
    for note in &notes {
        println!("{note}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gang_backtracking_is_refused_by_kube_scheduler_and_placed_by_us() {
    compare("gang-backtracking").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gang_8x8_is_placed_by_all_three_and_the_late_gang_by_none() {
    compare("gang-8x8").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gang_rack_places_the_same_groups_as_kube_scheduler() {
    compare("gang-rack").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gang_shared_claim_is_refused_by_kube_scheduler_and_placed_by_us() {
    compare("gang-shared-claim").await;
}
