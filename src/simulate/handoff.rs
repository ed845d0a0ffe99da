//! The handoff wait in `simulate`: a pod placed on a lower-ranked `firstAvailable`
//! subrequest while a terminating pod (by default one of its owner's) holds a better device
//! waits for that device, as it does in the daemon; [`Engine::handoff`] decides whether
//! there is one to wait for.
//!
//! simulate ends the wait as it ends when the holders finish within the bound: they are
//! gone, their claims are released as kube-controller-manager releases them (as for a
//! preemption's victims, [`Engine::evict`]), and the pod's next cycle takes the better
//! device. The bound is the daemon's: the longest grace period left among the holders plus
//! the margin, at most `maxWaitSeconds` (all of it for a holder without a deletion time).
//! There is no clock here, so a holder's grace period left is its whole
//! `deletionGracePeriodSeconds`: in a rollout the replacement is created as its
//! predecessor's deletion starts.

use std::time::Duration;

use dra_engine::handoff::Handoff;
use dra_engine::state::{ClusterState, bound_node};
use dra_engine::{Decision, Engine, ObjectKey, Placement, Preemption, Victim, claims};
use k8s_openapi::api::core::v1::Pod;

/// The daemon's `handoff:` config; simulate waits where it is enabled.
pub type Config = crate::run::config::Handoff;

/// A pod that waited for devices terminating pods held, and then took them.
#[derive(Clone, Debug)]
pub struct Waited {
    pub handoff: Handoff,
    /// The most the daemon would have waited.
    pub bound: Duration,
    /// How the bound was reached.
    pub bound_reason: String,
}

impl Waited {
    /// "waited for device ... held by terminating pod ..., up to 40s (...)".
    pub fn message(&self) -> String {
        format!(
            "waited for {}, up to {} ({})",
            self.handoff.describe(),
            seconds(self.bound),
            self.bound_reason
        )
    }
}

/// For a pod's placement: when it would get a better device from terminating pods, the wait
/// and the pod's decision once they are gone (they are removed and their claims released).
/// `None`: the pod takes its placement.
pub fn wait_for_holders(
    engine: &mut Engine,
    config: &Config,
    placement: &Placement,
) -> Option<(Waited, Decision)> {
    if dra_engine::handoff::opts_out(engine.state().pods.get(&placement.pod)?) {
        return None;
    }
    let budget = engine.config().filter_timeout;
    let handoff = engine.handoff(placement, config.owners, budget)?;
    let grace: Vec<(ObjectKey, Option<Duration>)> = handoff
        .holders
        .iter()
        .map(|h| (h.pod.clone(), grace_left(engine.state(), &h.pod)))
        .collect();
    let (bound, bound_reason) = bound(&grace, config);
    release(engine, &handoff, placement);
    let decision = engine.schedule(&placement.pod);
    let waited = Waited {
        handoff,
        bound,
        bound_reason,
    };
    Some((waited, decision))
}

/// A terminating pod's grace period left, taken to be all of it; `None` when it has no
/// deletion time or grace period.
fn grace_left(state: &ClusterState, key: &ObjectKey) -> Option<Duration> {
    let meta = &state.pods.get(key)?.metadata;
    meta.deletion_timestamp.as_ref()?;
    let seconds = meta.deletion_grace_period_seconds?;
    Some(Duration::from_secs(seconds.max(0).unsigned_abs()))
}

/// The daemon's bound on the wait for these holders (each with its grace period left), and
/// how it was reached.
fn bound(holders: &[(ObjectKey, Option<Duration>)], config: &Config) -> (Duration, String) {
    let max_wait = seconds(config.max_wait);
    if let Some((pod, _)) = holders.iter().find(|(_, grace)| grace.is_none()) {
        let reason = format!("maxWaitSeconds: {pod} has no deletion grace period");
        return (config.max_wait, reason);
    }
    let longest = holders
        .iter()
        .filter_map(|(_, grace)| *grace)
        .max()
        .unwrap_or_default();
    let reason = format!(
        "{} of grace period left plus the {} margin, at most maxWaitSeconds {max_wait}",
        seconds(longest),
        seconds(config.margin)
    );
    ((longest + config.margin).min(config.max_wait), reason)
}

/// The holders finish terminating: they go, and their claims are released as when a
/// preemption's victims go.
fn release(engine: &mut Engine, handoff: &Handoff, placement: &Placement) {
    let state = engine.state();
    let holders: Vec<(&ObjectKey, &Pod)> = handoff
        .holders
        .iter()
        .filter_map(|h| Some((&h.pod, state.pod(&h.pod)?)))
        .collect();
    let victims = holders
        .iter()
        .map(|(key, pod)| Victim {
            pod: (*key).clone(),
            uid: pod.metadata.uid.clone(),
            priority: pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0),
            node: bound_node(pod).unwrap_or_default().to_string(),
            freed_claims: freed_claims(state, pod, &holders),
        })
        .collect();
    let gone = Preemption {
        pod: handoff.pod.clone(),
        node: handoff.node.clone(),
        victims,
        placement: placement.clone(),
        pdb_violations: 0,
        message: String::new(),
    };
    engine.evict(&gone);
}

/// The pod's claims that only `holders` use: their devices come back when they go.
fn freed_claims(state: &ClusterState, pod: &Pod, holders: &[(&ObjectKey, &Pod)]) -> Vec<ObjectKey> {
    let only_holders = |key: &ObjectKey, claim| {
        claims::reserved_for(claim).iter().all(|entry| {
            holders.iter().any(|(holder, p)| {
                holder.namespace == key.namespace
                    && claims::is_pod(entry, &holder.name, p.metadata.uid.as_deref())
            })
        })
    };
    claims::of_pod(pod, state)
        .unwrap_or_default()
        .into_iter()
        .filter(|key| state.claims.get(key).is_some_and(|c| only_holders(key, c)))
        .collect()
}

/// `40s`, `2.5s`.
fn seconds(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    //! The rollout of `examples/rollout-handoff`: `web-new` ("an A5000, else a T10") is
    //! pending while `web-old`, of the same Deployment, terminates on the node's only A5000.

    use std::path::PathBuf;

    use super::*;
    use crate::simulate::{Options, Simulation, report, simulate};
    use dra_engine::ClusterInput;

    const A5000: &str = "gpu.nvidia.com/gpu-node-1/gpu-0 (gpu/a5000)";
    const T10: &str = "gpu.nvidia.com/gpu-node-1/gpu-1 (gpu/t10)";

    fn rollout() -> ClusterInput {
        let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/rollout-handoff");
        crate::simulate::load(&[example]).expect("the example loads")
    }

    fn pod<'a>(input: &'a mut ClusterInput, name: &str) -> &'a mut Pod {
        input
            .pods
            .iter_mut()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no pod {name}"))
    }

    fn run(input: ClusterInput, handoff: Option<Config>) -> Simulation {
        let options = Options {
            handoff,
            ..Default::default()
        };
        simulate(&options, input)
    }

    /// `driver/pool/device (request)` of each device the claim holds.
    fn devices(sim: &Simulation, claim: &str) -> Vec<String> {
        let claim = &sim.engine.state().claims[&ObjectKey::new("default", claim)];
        claims::allocation(claim)
            .into_iter()
            .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
            .map(|r| format!("{}/{}/{} ({})", r.driver, r.pool, r.device, r.request))
            .collect()
    }

    fn node_of<'a>(sim: &'a Simulation, name: &str) -> Option<&'a str> {
        let key = ObjectKey::new("default", name);
        sim.pods
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, d)| d.as_ref()?.node())
    }

    /// The table's line for the pod.
    fn line(table: &str, pod: &str) -> String {
        let name = format!("default/{pod} ");
        let found = table.lines().find(|l| l.starts_with(&name));
        found
            .unwrap_or_else(|| panic!("no line for {pod}:\n{table}"))
            .to_string()
    }

    #[test]
    fn the_replacement_waits_for_the_a5000_its_terminating_predecessor_holds_and_gets_it() {
        let sim = run(rollout(), Some(Config::default()));
        assert_eq!(node_of(&sim, "web-new"), Some("gpu-node-1"));
        assert_eq!(devices(&sim, "web-new-gpu"), [A5000]);
        let [waited] = sim.handoffs.as_slice() else {
            panic!("one handoff: {:?}", sim.handoffs);
        };
        assert_eq!(
            waited.handoff.holders[0].pod,
            ObjectKey::new("default", "web-old")
        );
        assert_eq!(waited.bound, Duration::from_secs(60));
        // The holder is gone and its claim, reserved for nobody now, deallocated.
        let state = sim.engine.state();
        assert!(
            !state
                .pods
                .contains_key(&ObjectKey::new("default", "web-old"))
        );
        assert!(devices(&sim, "web-old-gpu").is_empty());
        let old_claim = &state.claims[&ObjectKey::new("default", "web-old-gpu")];
        assert!(claims::reserved_for(old_claim).is_empty());

        let table = report::table(&sim);
        assert!(
            line(&table, "web-new").ends_with(
                "gpu-node-1   waited for device gpu.nvidia.com/gpu-node-1/gpu-0 (claim \
                 default/web-new-gpu request gpu: a5000 instead of t10) held by terminating pod \
                 default/web-old, up to 60s (30s of grace period left plus the 30s margin, at \
                 most maxWaitSeconds 60s)"
            ),
            "{table}"
        );
        assert!(
            line(&table, "web-old").ends_with(
                "TERMINATING  terminating: default/web-new waited for its devices and took \
                 them once it was gone"
            ),
            "{table}"
        );
        let json: serde_json::Value = serde_json::from_str(&report::json(&sim)).unwrap();
        let handoff = &json["handoffs"][0];
        assert_eq!(handoff["name"], "web-new");
        assert_eq!(handoff["devices"][0], "gpu.nvidia.com/gpu-node-1/gpu-0");
        assert_eq!(handoff["upgrades"][0]["to"], "a5000");
        assert_eq!(handoff["holders"][0]["name"], "web-old");
        assert_eq!(handoff["waitSeconds"], 60.0);
    }

    #[test]
    fn with_the_wait_off_the_replacement_takes_a_t10_at_once_and_nothing_is_said_of_waiting() {
        let sim = run(rollout(), None);
        assert_eq!(devices(&sim, "web-new-gpu"), [T10]);
        assert!(sim.handoffs.is_empty());
        assert_eq!(devices(&sim, "web-old-gpu"), [A5000]);
        let table = report::table(&sim);
        assert!(!table.contains("wait"), "{table}");
        assert!(
            line(&table, "web-old").ends_with("TERMINATING  terminating on gpu-node-1"),
            "{table}"
        );
        assert!(!report::json(&sim).contains("handoffs"));
    }

    #[test]
    fn a_pod_annotated_handoff_wait_false_takes_a_t10_at_once() {
        let mut input = rollout();
        pod(&mut input, "web-new").metadata.annotations = Some(
            [(
                dra_engine::handoff::HANDOFF_ANNOTATION.to_string(),
                "False".to_string(),
            )]
            .into(),
        );
        let sim = run(input, Some(Config::default()));
        assert_eq!(devices(&sim, "web-new-gpu"), [T10]);
        assert!(sim.handoffs.is_empty());
    }

    #[test]
    fn a_terminating_pod_of_another_deployment_is_waited_for_only_with_owners_any() {
        let other = |input: &mut ClusterInput| {
            let owner = &mut pod(input, "web-old")
                .metadata
                .owner_references
                .as_mut()
                .unwrap()[0];
            owner.name = "batch-rs".into();
        };
        let mut input = rollout();
        other(&mut input);
        let same = run(input, Some(Config::default()));
        assert_eq!(devices(&same, "web-new-gpu"), [T10]);
        assert!(same.handoffs.is_empty());

        let mut input = rollout();
        other(&mut input);
        let any = Config {
            owners: dra_engine::Owners::Any,
            ..Default::default()
        };
        let sim = run(input, Some(any));
        assert_eq!(devices(&sim, "web-new-gpu"), [A5000]);
        assert_eq!(sim.handoffs.len(), 1);
    }

    #[test]
    fn a_pending_pod_being_deleted_is_not_scheduled() {
        let mut input = rollout();
        let deleted = pod(&mut input, "web-old")
            .metadata
            .deletion_timestamp
            .clone();
        pod(&mut input, "web-new").metadata.deletion_timestamp = deleted;
        let sim = run(input, Some(Config::default()));
        assert_eq!(node_of(&sim, "web-new"), None);
        assert_eq!(sim.pending(), 0, "it is not pending: it is going away");
        assert!(devices(&sim, "web-new-gpu").is_empty());
        let table = report::table(&sim);
        assert!(
            line(&table, "web-new").ends_with(
                "TERMINATING  terminating (metadata.deletionTimestamp is set): not scheduled"
            ),
            "{table}"
        );
    }

    #[test]
    fn a_holder_without_a_grace_period_bounds_the_wait_at_max_wait() {
        let mut input = rollout();
        pod(&mut input, "web-old")
            .metadata
            .deletion_grace_period_seconds = None;
        let sim = run(input, Some(Config::default()));
        assert_eq!(devices(&sim, "web-new-gpu"), [A5000]);
        let waited = &sim.handoffs[0];
        assert_eq!(waited.bound, Duration::from_secs(60));
        assert_eq!(
            waited.bound_reason,
            "maxWaitSeconds: default/web-old has no deletion grace period"
        );
    }

    #[test]
    fn the_bound_is_the_longest_grace_period_left_plus_the_margin_at_most_max_wait() {
        let config = Config {
            margin: Duration::from_secs(10),
            ..Default::default()
        };
        let holder =
            |name: &str, grace: u64| (ObjectKey::new("ml", name), Some(Duration::from_secs(grace)));
        let (wait, reason) = bound(&[holder("a", 5), holder("b", 30)], &config);
        assert_eq!(wait, Duration::from_secs(40));
        assert_eq!(
            reason,
            "30s of grace period left plus the 10s margin, at most maxWaitSeconds 60s"
        );
        let (wait, _) = bound(&[holder("slow", 90)], &config);
        assert_eq!(wait, Duration::from_secs(60), "capped at maxWaitSeconds");
        let (wait, _) = bound(
            &[holder("a", 5), (ObjectKey::new("ml", "b"), None)],
            &config,
        );
        assert_eq!(wait, Duration::from_secs(60));
    }
}
