//! The handoff wait, the daemon's side: which pods' placements are checked, how long a pod
//! waits for the better device a terminating pod holds, and how each wait ends. The engine
//! decides whether there is a better device to wait for ([`dra_engine::handoff`]).
//!
//! A waiting pod is parked as unschedulable: the release of the holder's claim (a claim
//! update or deletion) or the holder's deletion retries it at once, as any cluster event
//! that frees devices does. When the bound passes, the pod is retried and takes the best
//! device free then (its placement is no longer checked).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use dra_engine::handoff::choices;
use dra_engine::{Handoff, ObjectKey, Owners, Placement};
use k8s_openapi::api::core::v1::Pod;

use super::config;

/// One pod's wait.
#[derive(Debug)]
struct Wait {
    deadline: Instant,
    /// What it waits for ([`Handoff::describe`]); a new event when this changes.
    what: String,
    /// The subrequests it waits for, per claim and request.
    wanted: Vec<(ObjectKey, String, String)>,
    /// Retried once the deadline passed.
    retried: bool,
    /// The holders' claims (claim, holder): still awaited after their holder is gone,
    /// until they are released.
    releasing: Vec<(ObjectKey, ObjectKey)>,
}

/// What a pod's placement is checked against: whose terminating pods, and the claims of
/// holders it already waits for.
pub type Check = (Owners, Vec<(ObjectKey, ObjectKey)>);

/// The pods waiting for a handoff.
#[derive(Debug, Default)]
pub struct Waits {
    config: config::Handoff,
    waits: HashMap<ObjectKey, Wait>,
}

/// A wait that starts (or now waits for something else): the event to write.
pub struct Started {
    pub message: String,
}

impl Waits {
    pub fn new(config: config::Handoff) -> Waits {
        Waits {
            config,
            waits: HashMap::new(),
        }
    }

    /// Whose terminating pods this pod's placement is checked against (and the claims its
    /// wait already awaits); `None` when the wait is off, the pod opts out, or its wait has
    /// run out.
    pub fn check_for(&self, key: &ObjectKey, pod: Option<&Pod>, now: Instant) -> Option<Check> {
        if !self.config.enabled {
            return None;
        }
        let opted_out = pod.is_some_and(dra_engine::handoff::opts_out);
        let wait = self.waits.get(key);
        let expired = wait.is_some_and(|w| now >= w.deadline);
        let releasing = wait.map(|w| w.releasing.clone()).unwrap_or_default();
        (!opted_out && !expired).then_some((self.config.owners, releasing))
    }

    /// How long to wait from now: the longest remaining grace period of the holders plus
    /// the margin (the margin alone for a holder that has finished), at most
    /// `maxWaitSeconds`.
    fn bound(&self, handoff: &Handoff, wall_now: k8s_openapi::jiff::Timestamp) -> Duration {
        let left = |h: &dra_engine::handoff::Holder| match &h.deletion {
            Some(t) => {
                let secs = t.0.duration_since(wall_now).as_secs_f64().max(0.0);
                Duration::from_secs_f64(secs) + self.config.margin
            }
            // A holder that finished without being deleted (a terminal phase): its claim
            // is released as soon as kube-controller-manager gets to it.
            None => self.config.margin,
        };
        handoff
            .holders
            .iter()
            .map(left)
            .max()
            .unwrap_or_default()
            .min(self.config.max_wait)
    }

    /// The pod waits: its deadline is set when the wait starts. The event to write when the
    /// wait starts or what it waits for changes.
    pub fn wait(
        &mut self,
        handoff: &Handoff,
        now: Instant,
        wall_now: k8s_openapi::jiff::Timestamp,
    ) -> Option<Started> {
        let what = handoff.describe();
        let bound = self.bound(handoff, wall_now);
        let wanted = handoff
            .upgrades
            .iter()
            .map(|u| (u.claim.clone(), u.request.clone(), u.to.clone()))
            .collect();
        let wait = self.waits.entry(handoff.pod.clone()).or_insert(Wait {
            deadline: now + bound,
            what: String::new(),
            wanted,
            retried: false,
            releasing: Vec::new(),
        });
        for claim in &handoff.claims {
            if !wait.releasing.contains(claim) {
                wait.releasing.push(claim.clone());
            }
        }
        if wait.what == what {
            return None;
        }
        wait.what = what;
        let left = wait.deadline.saturating_duration_since(now).as_secs();
        Some(Started {
            message: format!(
                "waiting up to {left}s for {} (its grace period left plus {}s, at most {}s); the pod takes the best device free then",
                wait.what,
                self.config.margin.as_secs(),
                self.config.max_wait.as_secs()
            ),
        })
    }

    /// The pod was placed: how its wait ended, if it waited.
    pub fn placed(&mut self, placement: &Placement, now: Instant) -> Option<&'static str> {
        let wait = self.waits.remove(&placement.pod)?;
        let got: Vec<_> = placement
            .claims
            .iter()
            .filter_map(|d| Some((d, d.allocation.as_ref()?)))
            .flat_map(|(d, a)| choices(&d.key, &d.claim, a))
            .collect();
        let better = wait.wanted.iter().all(|(claim, request, to)| {
            got.iter().any(|c| {
                &c.claim == claim && &c.request == request && (&c.subrequest == to || c.rank == 0)
            })
        });
        Some(if better {
            "handed_off"
        } else if now >= wait.deadline {
            "expired"
        } else {
            "lost"
        })
    }

    /// Pods whose bound has just passed: to be retried now, once.
    pub fn due(&mut self, now: Instant) -> Vec<ObjectKey> {
        self.waits
            .iter_mut()
            .filter(|(_, w)| !w.retried && now >= w.deadline)
            .map(|(k, w)| {
                w.retried = true;
                k.clone()
            })
            .collect()
    }

    /// Waits of pods that are gone (deleted, or bound by someone else): ended, abandoned.
    pub fn forget(&mut self, mut waiting: impl FnMut(&ObjectKey) -> bool) -> usize {
        let before = self.waits.len();
        self.waits.retain(|k, _| waiting(k));
        before - self.waits.len()
    }

    pub fn len(&self) -> usize {
        self.waits.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dra_engine::handoff::{Holder, Upgrade};

    fn handoff(deletion: Option<&str>) -> Handoff {
        Handoff {
            pod: ObjectKey::new("ml", "web-new"),
            node: "node-1".into(),
            upgrades: vec![Upgrade {
                claim: ObjectKey::new("ml", "web-new-gpu"),
                request: "gpu".into(),
                from: "t10".into(),
                to: "a5000".into(),
            }],
            devices: vec!["gpu.nvidia.com/node-1/gpu-0".into()],
            holders: vec![Holder {
                pod: ObjectKey::new("ml", "web-old"),
                deletion: deletion.map(|t| {
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t.parse().unwrap())
                }),
            }],
            claims: vec![(
                ObjectKey::new("ml", "web-old-gpu"),
                ObjectKey::new("ml", "web-old"),
            )],
        }
    }

    /// The defaults, with a 10 s margin.
    fn ten_second_margin() -> Waits {
        Waits::new(config::Handoff {
            margin: Duration::from_secs(10),
            ..Default::default()
        })
    }

    fn wall(t: &str) -> k8s_openapi::jiff::Timestamp {
        t.parse().unwrap()
    }

    #[test]
    fn the_bound_is_the_holders_grace_left_plus_the_margin_at_most_the_cap() {
        let waits = ten_second_margin();
        let h = handoff(Some("2026-12-01T10:00:30Z"));
        assert_eq!(
            waits.bound(&h, wall("2026-12-01T10:00:00Z")),
            Duration::from_secs(40)
        );
        assert_eq!(
            waits.bound(&h, wall("2026-12-01T10:01:00Z")),
            Duration::from_secs(10)
        );
        assert_eq!(
            waits.bound(&h, wall("2026-12-01T09:50:00Z")),
            Duration::from_secs(60)
        );
        assert_eq!(
            waits.bound(&handoff(None), wall("2026-12-01T10:00:00Z")),
            Duration::from_secs(10),
            "a holder that finished: the margin alone"
        );
    }

    #[test]
    fn a_wait_is_told_once_and_retried_once_when_its_bound_passes() {
        let mut waits = ten_second_margin();
        let key = ObjectKey::new("ml", "web-new");
        let now = Instant::now();
        let h = handoff(Some("2026-12-01T10:00:05Z"));
        let started = waits.wait(&h, now, wall("2026-12-01T10:00:00Z")).unwrap();
        assert_eq!(
            started.message,
            "waiting up to 15s for device gpu.nvidia.com/node-1/gpu-0 (claim ml/web-new-gpu \
             request gpu: a5000 instead of t10) held by terminating pod ml/web-old (its grace \
             period left plus 10s, at most 60s); the pod takes the best device free then"
        );
        assert!(waits.wait(&h, now, wall("2026-12-01T10:00:01Z")).is_none());
        let old_claim = (
            ObjectKey::new("ml", "web-old-gpu"),
            ObjectKey::new("ml", "web-old"),
        );
        assert_eq!(
            waits.check_for(&key, None, now),
            Some((Owners::Same, vec![old_claim]))
        );
        assert!(waits.due(now + Duration::from_secs(14)).is_empty());
        let later = now + Duration::from_secs(15);
        assert_eq!(waits.due(later), std::slice::from_ref(&key));
        assert!(waits.due(later).is_empty(), "retried once");
        assert_eq!(waits.check_for(&key, None, later), None, "the bound passed");
    }

    #[test]
    fn the_annotation_or_the_config_turns_the_wait_off() {
        let key = ObjectKey::new("ml", "web-new");
        let pod: Pod = serde_json::from_value(serde_json::json!({"metadata": {
            "name": "web-new", "annotations": {dra_engine::handoff::HANDOFF_ANNOTATION: "false"}}}))
        .unwrap();
        let now = Instant::now();
        let on = Waits::new(config::Handoff::default());
        assert_eq!(on.check_for(&key, Some(&pod), now), None);
        assert_eq!(
            on.check_for(&key, Some(&Pod::default()), now),
            Some((Owners::Same, vec![]))
        );
        let off = Waits::new(config::Handoff {
            enabled: false,
            ..Default::default()
        });
        assert_eq!(off.check_for(&key, Some(&Pod::default()), now), None);
    }
}
