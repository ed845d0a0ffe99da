//! Degraded pods: bound pods of ours on a lower-ranked `firstAvailable` subrequest while a
//! device for a higher-ranked one is free ([`dra_engine::Engine::degraded`] finds them, on a
//! fork, every `degraded.intervalSeconds`). Each is reported when it becomes degraded (an
//! event and the pod condition `dra-scheduler.io/PreferredDevice=False`) and when it no
//! longer is (the condition back to True); the gauge `degraded_pods{namespace,owner}`
//! counts them.
//!
//! The optional upgrade (`degraded.upgrade.enabled`, off by default) evicts a pod that
//! has been degraded for `afterSeconds`, through the Eviction API (so PodDisruptionBudgets
//! hold), so that its controller's replacement is placed on the free, preferred device.
//! Only pods with a controller are evicted (a bare pod would not come back), and one per
//! owner at a time: none while an earlier one of that owner still exists or a pod of that
//! owner is pending.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use dra_engine::{Degradation, ObjectKey};

use super::config;

/// The pod condition this scheduler keeps on degraded pods.
pub const CONDITION: &str = "dra-scheduler.io/PreferredDevice";

#[derive(Debug)]
struct Reported {
    since: Instant,
    owner: String,
    uid: Option<String>,
    what: String,
}

/// What to tell about a pod.
#[derive(Debug, PartialEq)]
pub enum Note {
    /// It became degraded (or what it could have changed): event and condition False.
    Degraded {
        pod: ObjectKey,
        uid: Option<String>,
        message: String,
    },
    /// It no longer is: condition True.
    Restored { pod: ObjectKey, uid: Option<String> },
}

/// A pod to evict for an upgrade.
#[derive(Debug, PartialEq)]
pub struct Upgrade {
    pub pod: ObjectKey,
    pub uid: Option<String>,
    pub owner: String,
    pub message: String,
}

/// The degraded pods known, and the upgrades under way.
#[derive(Debug)]
pub struct DegradedPods {
    config: config::Degraded,
    next_round: Option<Instant>,
    reported: HashMap<ObjectKey, Reported>,
    /// Per namespace and owner, the pod evicted last for an upgrade, and when.
    evicting: HashMap<(String, String), (ObjectKey, Instant)>,
}

impl DegradedPods {
    pub fn new(config: config::Degraded) -> DegradedPods {
        DegradedPods {
            config,
            next_round: None,
            reported: HashMap::new(),
            evicting: HashMap::new(),
        }
    }

    /// Whether a round is due now (the next is then due an interval later).
    pub fn round_due(&mut self, now: Instant) -> bool {
        if self.next_round.is_some_and(|t| now < t) {
            return false;
        }
        self.next_round = Some(now + self.config.interval);
        true
    }

    /// Whether any pod is reported degraded (a round must then run to see it restored).
    pub fn any(&self) -> bool {
        !self.reported.is_empty()
    }

    /// A round's findings: what to tell. `exists`: whether a pod is still there (a pod
    /// that went away is dropped without a word).
    pub fn found(
        &mut self,
        found: Vec<Degradation>,
        exists: impl Fn(&ObjectKey) -> bool,
        now: Instant,
    ) -> Vec<Note> {
        let mut notes = Vec::new();
        let mut now_degraded: HashMap<ObjectKey, Reported> = HashMap::new();
        for d in found {
            let what = d.describe();
            let before = self.reported.remove(&d.pod);
            let since = before.as_ref().map_or(now, |r| r.since);
            if before.as_ref().is_none_or(|r| r.what != what) {
                notes.push(Note::Degraded {
                    pod: d.pod.clone(),
                    uid: d.uid.clone(),
                    message: format!("pod {} {what}", d.pod),
                });
            }
            now_degraded.insert(
                d.pod,
                Reported {
                    since,
                    owner: d.owner,
                    uid: d.uid,
                    what,
                },
            );
        }
        for (pod, r) in std::mem::replace(&mut self.reported, now_degraded) {
            if exists(&pod) {
                notes.push(Note::Restored { pod, uid: r.uid });
            }
        }
        notes
    }

    /// The gauge's values: degraded pods per namespace and owner.
    pub fn counts(&self) -> BTreeMap<(String, String), i64> {
        let mut counts = BTreeMap::new();
        for (pod, r) in &self.reported {
            *counts
                .entry((pod.namespace.clone(), r.owner.clone()))
                .or_default() += 1;
        }
        counts
    }

    /// Pods to evict now for an upgrade: degraded for `afterSeconds`, with an owner, at
    /// most one per owner, and none for an owner that is `busy` (a pending pod) or whose
    /// last evicted pod is still `terminating`. An eviction that did not start the pod's
    /// termination within three intervals (a PodDisruptionBudget refused it) no longer
    /// holds the owner back: it is tried again.
    pub fn upgrades(
        &mut self,
        now: Instant,
        terminating: impl Fn(&ObjectKey) -> bool,
        busy: impl Fn(&str, &str) -> bool,
    ) -> Vec<Upgrade> {
        let Some(after) = self.config.upgrade_after else {
            return Vec::new();
        };
        let patience = self.config.interval * 3;
        self.evicting
            .retain(|_, (pod, at)| terminating(pod) || now.duration_since(*at) < patience);
        let mut due: Vec<(&ObjectKey, &Reported)> = self
            .reported
            .iter()
            .filter(|(_, r)| !r.owner.is_empty() && now.duration_since(r.since) >= after)
            .collect();
        due.sort_by_key(|(k, r)| (r.since, (*k).clone()));
        let mut out: Vec<Upgrade> = Vec::new();
        for (pod, r) in due {
            let owner = (pod.namespace.clone(), r.owner.clone());
            if self.evicting.contains_key(&owner)
                || busy(&owner.0, &owner.1)
                || out
                    .iter()
                    .any(|u| u.pod.namespace == owner.0 && u.owner == owner.1)
            {
                continue;
            }
            out.push(Upgrade {
                pod: pod.clone(),
                uid: r.uid.clone(),
                owner: r.owner.clone(),
                message: format!(
                    "evicting pod {pod} so that {} replaces it on the preferred device: it {} (degraded for {}s)",
                    r.owner,
                    r.what,
                    now.duration_since(r.since).as_secs()
                ),
            });
        }
        for u in &out {
            self.evicting.insert(
                (u.pod.namespace.clone(), u.owner.clone()),
                (u.pod.clone(), now),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn degradation(pod: &str, owner: &str) -> Degradation {
        Degradation {
            pod: ObjectKey::new("ml", pod),
            uid: Some(format!("uid-{pod}")),
            owner: owner.into(),
            node: "node-1".into(),
            upgrades: vec![dra_engine::handoff::Upgrade {
                claim: ObjectKey::new("ml", format!("{pod}-gpu")),
                request: "gpu".into(),
                from: "t10".into(),
                to: "a5000".into(),
            }],
            preferred_node: "node-1".into(),
            devices: vec!["gpu.nvidia.com/node-1/gpu-0".into()],
        }
    }

    fn with_upgrade(after: u64) -> DegradedPods {
        DegradedPods::new(config::Degraded {
            upgrade_after: Some(Duration::from_secs(after)),
            ..Default::default()
        })
    }

    #[test]
    fn a_pod_is_told_when_it_becomes_degraded_and_when_it_no_longer_is() {
        let mut pods = DegradedPods::new(config::Degraded::default());
        let now = Instant::now();
        let notes = pods.found(vec![degradation("web-0", "Deployment/web")], |_| true, now);
        assert_eq!(
            notes,
            [Note::Degraded {
                pod: ObjectKey::new("ml", "web-0"),
                uid: Some("uid-web-0".into()),
                message: "pod ml/web-0 runs on a lower-ranked device (claim ml/web-0-gpu \
                          request gpu: a5000 instead of t10) while gpu.nvidia.com/node-1/gpu-0 \
                          on node node-1 is free"
                    .into()
            }]
        );
        assert_eq!(
            pods.counts(),
            BTreeMap::from([(("ml".into(), "Deployment/web".into()), 1)])
        );
        // Still degraded: nothing new to say.
        assert!(
            pods.found(vec![degradation("web-0", "Deployment/web")], |_| true, now)
                .is_empty()
        );
        let notes = pods.found(vec![], |_| true, now);
        assert_eq!(
            notes,
            [Note::Restored {
                pod: ObjectKey::new("ml", "web-0"),
                uid: Some("uid-web-0".into())
            }]
        );
        assert!(pods.counts().is_empty());
        assert!(!pods.any());
    }

    #[test]
    fn a_pod_that_went_away_is_dropped_silently() {
        let mut pods = DegradedPods::new(config::Degraded::default());
        let now = Instant::now();
        pods.found(vec![degradation("web-0", "Deployment/web")], |_| true, now);
        assert!(pods.found(vec![], |_| false, now).is_empty());
    }

    #[test]
    fn upgrades_are_off_by_default() {
        let mut pods = DegradedPods::new(config::Degraded::default());
        let now = Instant::now();
        pods.found(vec![degradation("web-0", "Deployment/web")], |_| true, now);
        let later = now + Duration::from_secs(3600);
        assert!(pods.upgrades(later, |_| true, |_, _| false).is_empty());
    }

    #[test]
    fn one_pod_per_owner_is_evicted_once_degraded_long_enough() {
        let mut pods = with_upgrade(60);
        let now = Instant::now();
        let found = vec![
            degradation("web-0", "Deployment/web"),
            degradation("web-1", "Deployment/web"),
            degradation("db-0", "StatefulSet/db"),
            degradation("bare", ""),
        ];
        pods.found(found, |_| true, now);
        assert!(
            pods.upgrades(now + Duration::from_secs(59), |_| true, |_, _| false)
                .is_empty()
        );
        let later = now + Duration::from_secs(60);
        let upgrades = pods.upgrades(later, |_| true, |_, _| false);
        let evicted: Vec<&str> = upgrades.iter().map(|u| u.pod.name.as_str()).collect();
        assert_eq!(
            evicted,
            ["db-0", "web-0"],
            "one per owner, never a pod without one"
        );
        assert!(upgrades[1].message.starts_with(
            "evicting pod ml/web-0 so that Deployment/web replaces it on the preferred device"
        ));
        // While web-0 terminates, web-1 waits; once it is gone, web-1 goes, unless the
        // owner has a pending pod (web-0's replacement).
        let much_later = later + Duration::from_secs(600);
        assert!(pods.upgrades(much_later, |_| true, |_, _| false).is_empty());
        // The next round finds web-1 alone (the evicted pods terminate or are gone).
        pods.found(
            vec![degradation("web-1", "Deployment/web")],
            |_| true,
            much_later,
        );
        let gone = |k: &ObjectKey| k.name != "web-0" && k.name != "db-0";
        assert!(
            pods.upgrades(much_later, gone, |_, owner| owner == "Deployment/web")
                .is_empty()
        );
        let next = pods.upgrades(much_later, gone, |_, _| false);
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].pod, ObjectKey::new("ml", "web-1"));
    }

    #[test]
    fn an_eviction_refused_by_a_budget_is_tried_again_after_three_intervals() {
        let mut pods = with_upgrade(0);
        let now = Instant::now();
        pods.found(vec![degradation("web-0", "Deployment/web")], |_| true, now);
        let not_terminating = |_: &ObjectKey| false;
        assert_eq!(pods.upgrades(now, not_terminating, |_, _| false).len(), 1);
        let soon = now + Duration::from_secs(29);
        assert!(
            pods.upgrades(soon, not_terminating, |_, _| false)
                .is_empty()
        );
        let later = now + Duration::from_secs(30);
        assert_eq!(pods.upgrades(later, not_terminating, |_, _| false).len(), 1);
    }
}
