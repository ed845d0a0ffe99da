//! The scheduling queue: pods wait in one of three places, as in kube-scheduler.
//! - active: ready to be tried, higher priority first, then the order they arrived;
//! - backoff: tried and failed with an error, retried after an exponential, capped delay;
//! - unschedulable: no node fits; retried when a cluster event may change that for one of
//!   the plugins that rejected it ([`SchedulingQueue::cluster_event`], by
//!   [`dra_engine::queueing_hints`], as kube-scheduler's queueing hints), through backoff
//!   if its backoff has not passed yet, and in any case after [`UNSCHEDULABLE_RETRY`]
//!   (kube-scheduler's podMaxInUnschedulablePodsDuration), in case an event that mattered
//!   was not recognised as such;
//! - gated: a claim the pod names does not exist yet (kube-controller-manager creates claims
//!   from templates just after the pod): no attempt, no event, until the pod itself or
//!   that claim changes (kube-scheduler's PreEnqueue, and DynamicResources' queueing hint
//!   that only a pod's own claims wake it; see [`Wake`]). One still gated after a while
//!   is reported.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use dra_engine::ObjectKey;
use dra_engine::queueing_hints::{ClusterEvent, may_help};

const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// The longest an unschedulable pod waits for an event before it is tried again.
pub const UNSCHEDULABLE_RETRY: Duration = Duration::from_secs(300);

#[derive(Debug, Default)]
pub struct SchedulingQueue {
    active: BTreeSet<(Reverse<i32>, u64, ObjectKey)>,
    /// Where each known pod is: its priority, arrival number and attempts so far.
    pods: HashMap<ObjectKey, Entry>,
    /// Gated pods by the claim they wait for ([`Wake::Claim`]).
    awaiting: HashMap<ObjectKey, HashSet<ObjectKey>>,
    /// The pods that cluster events may move: every unschedulable pod and every pod gated
    /// until any change ([`Wake::AnyChange`]), and some that have moved on since (dropped
    /// when next visited). Events come by the thousand in a burst, when few pods or none
    /// wait: an event visits these, not every pod.
    waiting: HashSet<ObjectKey>,
    next: u64,
}

/// What wakes a gated pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    /// Any change that may help an unschedulable pod (a PodGroup waiting for its members
    /// or their claims).
    AnyChange,
    /// Only its own update: its claim from a template is not named in its status yet.
    OwnUpdate,
    /// An event about this claim, which does not exist yet, or its own update. A burst of
    /// pods made from templates gates each pod until its claim appears: waking every
    /// gated pod on every new claim made the burst's queue work grow with its square.
    Claim(ObjectKey),
}

#[derive(Debug, Clone)]
struct Entry {
    /// When the pod entered the queue, for the end-to-end scheduling latency.
    added: Instant,
    priority: i32,
    arrival: u64,
    attempts: u32,
    place: Place,
    /// When it was first gated (kept across wake-ups) and whether that was reported.
    gated_since: Option<Instant>,
    gate_told: bool,
    /// The plugins that found it unschedulable last time.
    rejected_by: BTreeSet<&'static str>,
    /// When its last attempt failed: an event moves it back no sooner than its backoff
    /// after that.
    failed_at: Option<Instant>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Place {
    Active,
    Backoff(Instant),
    /// Since when.
    Unschedulable(Instant),
    InFlight,
    /// Waiting for its claims or its PodGroup (since [`Entry::gated_since`]).
    Gated(Wake),
}

impl SchedulingQueue {
    /// A pending pod was seen; new pods go to the active queue, known ones stay put.
    pub fn add(&mut self, key: ObjectKey, priority: i32) {
        if self.pods.contains_key(&key) {
            return;
        }
        let arrival = self.next;
        self.next += 1;
        self.active
            .insert((Reverse(priority), arrival, key.clone()));
        self.pods.insert(
            key,
            Entry {
                added: Instant::now(),
                priority,
                arrival,
                attempts: 0,
                place: Place::Active,
                gated_since: None,
                gate_told: false,
                rejected_by: BTreeSet::new(),
                failed_at: None,
            },
        );
    }

    /// Pods known to the queue.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether the queue knows no pod.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// Whether the pod is known to the queue (waiting or in flight).
    pub fn contains(&self, key: &ObjectKey) -> bool {
        self.pods.contains_key(key)
    }

    /// When the pod entered the queue.
    pub fn added_at(&self, key: &ObjectKey) -> Option<Instant> {
        self.pods.get(key).map(|e| e.added)
    }

    /// The pod is gone or bound: forget it.
    pub fn remove(&mut self, key: &ObjectKey) {
        self.waiting.remove(key);
        if let Some(e) = self.pods.remove(key) {
            self.active
                .remove(&(Reverse(e.priority), e.arrival, key.clone()));
            self.stop_awaiting(key, &e.place);
        }
    }

    /// Back to the active queue.
    fn activate(
        active: &mut BTreeSet<(Reverse<i32>, u64, ObjectKey)>,
        key: &ObjectKey,
        e: &mut Entry,
    ) {
        e.place = Place::Active;
        active.insert((Reverse(e.priority), e.arrival, key.clone()));
    }

    /// A pod that waited for a claim (`place`) does not any more.
    fn stop_awaiting(&mut self, key: &ObjectKey, place: &Place) {
        if let Place::Gated(Wake::Claim(claim)) = place
            && let Some(pods) = self.awaiting.get_mut(claim)
        {
            pods.remove(key);
            if pods.is_empty() {
                self.awaiting.remove(claim);
            }
        }
    }

    /// The next pod to try; it stays known (in flight) until it is removed or requeued.
    pub fn pop(&mut self) -> Option<ObjectKey> {
        let (_, _, key) = self.active.pop_first()?;
        if let Some(e) = self.pods.get_mut(&key) {
            e.place = Place::InFlight;
            e.attempts += 1;
        }
        Some(key)
    }

    /// Take a waiting pod out of turn, with the pod popped before it (the members of one
    /// PodGroup are tried together); it is in flight as if popped.
    pub fn take(&mut self, key: &ObjectKey) {
        if let Some(e) = self.pods.get_mut(key) {
            self.active
                .remove(&(Reverse(e.priority), e.arrival, key.clone()));
            e.place = Place::InFlight;
            e.attempts += 1;
        }
    }

    /// No node fits, by the word of `rejected_by`: wait for a cluster event, or
    /// [`UNSCHEDULABLE_RETRY`].
    pub fn unschedulable(
        &mut self,
        key: &ObjectKey,
        now: Instant,
        rejected_by: BTreeSet<&'static str>,
    ) {
        if let Some(e) = self.pods.get_mut(key) {
            e.place = Place::Unschedulable(now);
            e.rejected_by = rejected_by;
            e.failed_at = Some(now);
            self.waiting.insert(key.clone());
        }
    }

    /// How long a pod waits after a failed attempt before it is tried again: from 1 s,
    /// doubling with each attempt, at most 10 s (kube-scheduler's pod backoff).
    fn backoff_after(attempts: u32) -> Duration {
        let shift = attempts.saturating_sub(1).min(8);
        (INITIAL_BACKOFF * 2u32.pow(shift)).min(MAX_BACKOFF)
    }

    /// An event may help the pod: to the active queue, or to backoff while its backoff
    /// after the last failed attempt has not passed (kube-scheduler's `isPodBackingoff`).
    fn requeue(
        active: &mut BTreeSet<(Reverse<i32>, u64, ObjectKey)>,
        key: &ObjectKey,
        e: &mut Entry,
        now: Instant,
    ) {
        let until = e
            .failed_at
            .map(|failed| failed + Self::backoff_after(e.attempts));
        match until {
            Some(until) if now < until => e.place = Place::Backoff(until),
            _ => Self::activate(active, key, e),
        }
    }

    /// Something changed in the cluster: the unschedulable pods it may help go back (see
    /// [`SchedulingQueue::requeue_if`]), and the gated pods any change wakes
    /// ([`Wake::AnyChange`]).
    pub fn cluster_event(&mut self, event: ClusterEvent, now: Instant) {
        self.requeue_if(now, |_, rejected_by| {
            rejected_by.is_empty() || rejected_by.iter().any(|p| may_help(p, event))
        });
    }

    /// The unschedulable pods for which `helps(pod, plugins that rejected it)` go back to
    /// the active queue, or to backoff while their backoff has not passed; so do the gated
    /// pods any change wakes.
    pub fn requeue_if(
        &mut self,
        now: Instant,
        helps: impl Fn(&ObjectKey, &BTreeSet<&'static str>) -> bool,
    ) {
        let Self {
            pods,
            active,
            waiting,
            ..
        } = self;
        waiting.retain(|key| {
            let Some(e) = pods.get_mut(key) else {
                return false;
            };
            match e.place {
                Place::Unschedulable(_) if helps(key, &e.rejected_by) => {
                    Self::requeue(active, key, e, now);
                    false
                }
                Place::Unschedulable(_) => true,
                Place::Gated(Wake::AnyChange) => {
                    Self::activate(active, key, e);
                    false
                }
                _ => false,
            }
        });
    }

    /// Move pods unschedulable for [`UNSCHEDULABLE_RETRY`] to the active queue.
    pub fn flush_unschedulable(&mut self, now: Instant) {
        let Self {
            pods,
            active,
            waiting,
            ..
        } = self;
        waiting.retain(|key| {
            let Some(e) = pods.get_mut(key) else {
                return false;
            };
            match e.place {
                Place::Unschedulable(since)
                    if now.saturating_duration_since(since) >= UNSCHEDULABLE_RETRY =>
                {
                    Self::activate(active, key, e);
                    false
                }
                Place::Unschedulable(_) | Place::Gated(Wake::AnyChange) => true,
                _ => false,
            }
        });
    }

    /// A claim the pod names does not exist yet, or its PodGroup is not ready: wait
    /// without an attempt until `wake`.
    pub fn gate(&mut self, key: &ObjectKey, now: Instant, wake: Wake) {
        let Some(e) = self.pods.get_mut(key) else {
            return;
        };
        // Popped again after a wake-up: keep when it started waiting.
        e.gated_since.get_or_insert(now);
        let old = std::mem::replace(&mut e.place, Place::Gated(wake.clone()));
        self.stop_awaiting(key, &old);
        match wake {
            Wake::Claim(claim) => {
                self.awaiting.entry(claim).or_default().insert(key.clone());
            }
            Wake::AnyChange => {
                self.waiting.insert(key.clone());
            }
            Wake::OwnUpdate => {}
        }
    }

    /// The claim was created, changed or deleted: the pods gated until it exists try again.
    pub fn claim_changed(&mut self, claim: &ObjectKey) {
        for key in self.awaiting.remove(claim).into_iter().flatten() {
            if let Some(e) = self.pods.get_mut(&key)
                && e.place == Place::Gated(Wake::Claim(claim.clone()))
            {
                Self::activate(&mut self.active, &key, e);
            }
        }
    }

    /// Pods gated for at least `after` and not yet reported; they are marked reported.
    pub fn overdue_gated(
        &mut self,
        now: Instant,
        after: impl Fn(&ObjectKey) -> Duration,
    ) -> Vec<ObjectKey> {
        let mut due = Vec::new();
        for (key, e) in self.pods.iter_mut() {
            if matches!(e.place, Place::Gated(_))
                && !e.gate_told
                && e.gated_since
                    .is_some_and(|since| now.saturating_duration_since(since) >= after(key))
            {
                e.gate_told = true;
                due.push(key.clone());
            }
        }
        due
    }

    /// The attempt failed (an error, or a write that did not land): retry after a delay.
    pub fn backoff(&mut self, key: &ObjectKey, now: Instant) {
        if let Some(e) = self.pods.get_mut(key) {
            e.failed_at = Some(now);
            e.place = Place::Backoff(now + Self::backoff_after(e.attempts));
        }
    }

    /// The pod itself changed (e.g. its generated claims were recorded in its status): if it
    /// waits as unschedulable, try it again.
    pub fn pod_updated(&mut self, key: &ObjectKey) {
        let Some(e) = self.pods.get_mut(key) else {
            return;
        };
        if matches!(e.place, Place::Unschedulable(_) | Place::Gated(_)) {
            let old = e.place.clone();
            Self::activate(&mut self.active, key, e);
            self.stop_awaiting(key, &old);
        }
    }

    /// Move pods whose backoff has expired to the active queue.
    pub fn flush_backoff(&mut self, now: Instant) {
        for (key, e) in self.pods.iter_mut() {
            if let Place::Backoff(until) = e.place
                && until <= now
            {
                Self::activate(&mut self.active, key, e);
            }
        }
    }

    /// Unschedulable pods by the plugin that rejected them (a pod rejected by two counts
    /// under each; one with none named, e.g. out of search time, under `none`), for metrics.
    pub fn unschedulable_by_plugin(&self) -> std::collections::BTreeMap<&'static str, i64> {
        let mut out = std::collections::BTreeMap::new();
        for e in self.pods.values() {
            if !matches!(e.place, Place::Unschedulable(_)) {
                continue;
            }
            if e.rejected_by.is_empty() {
                *out.entry("none").or_default() += 1;
            }
            for plugin in &e.rejected_by {
                *out.entry(*plugin).or_default() += 1;
            }
        }
        out
    }

    /// Pods per queue, for metrics: (active, backoff, unschedulable, gated).
    pub fn lengths(&self) -> (usize, usize, usize, usize) {
        let mut backoff = 0;
        let mut unschedulable = 0;
        let mut gated = 0;
        for e in self.pods.values() {
            match e.place {
                Place::Backoff(_) => backoff += 1,
                Place::Unschedulable(_) => unschedulable += 1,
                Place::Gated(_) => gated += 1,
                _ => {}
            }
        }
        (self.active.len(), backoff, unschedulable, gated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: &str) -> ObjectKey {
        ObjectKey::new("default", n)
    }

    #[test]
    fn priority_then_arrival() {
        let mut q = SchedulingQueue::default();
        q.add(key("a"), 0);
        q.add(key("b"), 10);
        q.add(key("c"), 0);
        q.add(key("a"), 0); // seen again: no duplicate
        assert_eq!(
            [q.pop(), q.pop(), q.pop(), q.pop()],
            [Some(key("b")), Some(key("a")), Some(key("c")), None]
        );
    }

    #[test]
    fn a_pod_taken_with_its_group_leaves_its_turn_and_is_in_flight() {
        let mut q = SchedulingQueue::default();
        q.add(key("a"), 0);
        q.add(key("b"), 0);
        q.add(key("c"), 0);
        assert_eq!(q.pop(), Some(key("a")));
        q.take(&key("c"));
        assert_eq!(q.pop(), Some(key("b")));
        assert_eq!(q.pop(), None, "c went with a");
        q.backoff(&key("c"), Instant::now());
        q.flush_backoff(Instant::now() + MAX_BACKOFF);
        assert_eq!(q.pop(), Some(key("c")), "and comes back like any pod");
    }

    #[test]
    fn unschedulable_pods_wait_for_a_cluster_event() {
        let mut q = SchedulingQueue::default();
        q.add(key("a"), 0);
        assert_eq!(q.pop(), Some(key("a")));
        let t0 = Instant::now();
        q.unschedulable(&key("a"), t0, BTreeSet::new());
        q.flush_backoff(t0 + Duration::from_secs(3600));
        q.flush_unschedulable(t0 + Duration::from_secs(299));
        assert_eq!(q.pop(), None, "no polling");
        assert_eq!(q.lengths(), (0, 0, 1, 0));
        q.cluster_event(ClusterEvent::NodeAdded, t0 + Duration::from_secs(2));
        assert_eq!(q.pop(), Some(key("a")));
        q.unschedulable(&key("a"), t0, BTreeSet::new());
        q.pod_updated(&key("a"));
        assert_eq!(q.pop(), Some(key("a")), "its own update retries it");
    }

    #[test]
    fn a_placed_pod_retries_only_pods_that_affinity_or_spread_kept_out() {
        let mut q = SchedulingQueue::default();
        let t0 = Instant::now();
        for k in ["anti", "gpu"] {
            q.add(key(k), 0);
            q.pop();
        }
        q.unschedulable(&key("anti"), t0, BTreeSet::from(["InterPodAffinity"]));
        q.unschedulable(&key("gpu"), t0, BTreeSet::from(["DynamicResources"]));
        q.cluster_event(ClusterEvent::AssignedPodAdded, t0 + MAX_BACKOFF);
        assert_eq!(
            [q.pop(), q.pop()],
            [Some(key("anti")), None],
            "a placed pod takes devices, it never frees them"
        );
    }

    #[test]
    fn an_unschedulable_pod_is_retried_after_five_minutes_without_any_event() {
        let mut q = SchedulingQueue::default();
        let t0 = Instant::now();
        q.add(key("a"), 0);
        q.add(key("b"), 0);
        q.pop();
        q.pop();
        q.unschedulable(&key("a"), t0, BTreeSet::new());
        q.unschedulable(&key("b"), t0 + Duration::from_secs(60), BTreeSet::new());
        q.flush_unschedulable(t0 + Duration::from_secs(300));
        assert_eq!([q.pop(), q.pop()], [Some(key("a")), None]);
        q.flush_unschedulable(t0 + Duration::from_secs(360));
        assert_eq!(q.pop(), Some(key("b")));
    }

    #[test]
    fn a_pod_waiting_for_its_claim_is_not_tried_and_reported_once_late() {
        let mut q = SchedulingQueue::default();
        let t0 = Instant::now();
        q.add(key("a"), 0);
        assert_eq!(q.pop(), Some(key("a")));
        q.gate(&key("a"), t0, Wake::Claim(key("a-gpu")));
        assert_eq!(q.pop(), None);
        assert_eq!(q.lengths(), (0, 0, 0, 1));
        q.claim_changed(&key("a-gpu"));
        assert_eq!(q.pop(), Some(key("a")));
        // still missing
        q.gate(
            &key("a"),
            t0 + Duration::from_secs(5),
            Wake::Claim(key("a-gpu")),
        );
        assert!(
            q.overdue_gated(t0 + Duration::from_secs(9), |_| Duration::from_secs(10))
                .is_empty()
        );
        assert_eq!(
            q.overdue_gated(t0 + Duration::from_secs(10), |_| Duration::from_secs(10)),
            [key("a")],
            "counted from when it first waited"
        );
        assert!(
            q.overdue_gated(t0 + Duration::from_secs(60), |_| Duration::from_secs(10))
                .is_empty(),
            "reported once"
        );
        q.pod_updated(&key("a"));
        assert_eq!(q.pop(), Some(key("a")), "its own update wakes it");
    }

    #[test]
    fn a_gated_pod_wakes_for_its_own_claim_and_update_not_for_others() {
        let mut q = SchedulingQueue::default();
        let t0 = Instant::now();
        for k in ["a", "b", "c", "gang"] {
            q.add(key(k), 0);
            q.pop();
        }
        q.gate(&key("a"), t0, Wake::Claim(key("a-gpu")));
        q.gate(&key("b"), t0, Wake::Claim(key("b-gpu")));
        q.gate(&key("c"), t0, Wake::OwnUpdate);
        q.gate(&key("gang"), t0, Wake::AnyChange);
        q.claim_changed(&key("b-gpu"));
        assert_eq!(
            [q.pop(), q.pop()],
            [Some(key("b")), None],
            "only b's claim appeared"
        );
        q.cluster_event(ClusterEvent::NodeAdded, t0);
        assert_eq!(
            [q.pop(), q.pop()],
            [Some(key("gang")), None],
            "a cluster change wakes the PodGroup's wait, not the pods waiting for a claim"
        );
        q.pod_updated(&key("c"));
        q.pod_updated(&key("a"));
        assert_eq!(
            [q.pop(), q.pop(), q.pop()],
            [Some(key("a")), Some(key("c")), None]
        );
        assert!(q.awaiting.is_empty(), "a woken pod waits for no claim");
        q.claim_changed(&key("a-gpu"));
        assert_eq!(q.pop(), None, "a pod that is not gated stays where it is");
        q.gate(&key("a"), t0, Wake::Claim(key("a-gpu")));
        q.remove(&key("a"));
        assert!(q.awaiting.is_empty(), "a removed pod waits for nothing");
    }

    #[test]
    fn events_that_cannot_help_a_pod_short_of_devices_leave_it_waiting() {
        let mut q = SchedulingQueue::default();
        let t0 = Instant::now();
        q.add(key("gpu"), 0);
        q.pop();
        q.unschedulable(&key("gpu"), t0, BTreeSet::from(["DynamicResources"]));
        let later = t0 + Duration::from_secs(60);
        for _ in 0..20 {
            for unrelated in [
                ClusterEvent::NamespaceLabelsChanged,
                ClusterEvent::NodeTaintsChanged,
                ClusterEvent::AssignedPodAdded,
                ClusterEvent::PersistentVolumeClaimChanged,
            ] {
                q.cluster_event(unrelated, later);
            }
        }
        assert_eq!(q.pop(), None, "not one extra attempt");
        assert_eq!(q.lengths(), (0, 0, 1, 0));
        q.cluster_event(ClusterEvent::ClaimFreed, later);
        assert_eq!(q.pop(), Some(key("gpu")), "devices given back may fit it");
    }

    #[test]
    fn a_pod_moved_back_by_an_event_still_waits_out_its_backoff() {
        let mut q = SchedulingQueue::default();
        let t0 = Instant::now();
        q.add(key("a"), 0);
        for _ in 0..3 {
            q.pop();
            q.backoff(&key("a"), t0);
            q.flush_backoff(t0 + MAX_BACKOFF);
        }
        assert_eq!(q.pop(), Some(key("a")), "the fourth attempt");
        q.unschedulable(&key("a"), t0, BTreeSet::from(["NodeResourcesFit"]));
        q.cluster_event(ClusterEvent::NodeAdded, t0 + Duration::from_secs(1));
        assert_eq!(q.pop(), None, "four attempts: 8 s of backoff from the last");
        assert_eq!(q.lengths(), (0, 1, 0, 0));
        q.flush_backoff(t0 + Duration::from_secs(7));
        assert_eq!(q.pop(), None);
        q.flush_backoff(t0 + Duration::from_secs(8));
        assert_eq!(q.pop(), Some(key("a")));
        q.unschedulable(&key("a"), t0, BTreeSet::from(["NodeResourcesFit"]));
        q.cluster_event(ClusterEvent::NodeAdded, t0 + Duration::from_secs(60));
        assert_eq!(q.pop(), Some(key("a")), "past its backoff: straight back");
    }

    #[test]
    fn a_pod_rejected_by_no_named_plugin_is_moved_by_any_event() {
        let mut q = SchedulingQueue::default();
        let t0 = Instant::now();
        q.add(key("slow"), 0);
        q.pop();
        q.unschedulable(&key("slow"), t0, BTreeSet::new());
        q.cluster_event(ClusterEvent::NamespaceLabelsChanged, t0 + MAX_BACKOFF);
        assert_eq!(q.pop(), Some(key("slow")));
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let mut q = SchedulingQueue::default();
        let t0 = Instant::now();
        q.add(key("a"), 0);
        q.pop();
        q.backoff(&key("a"), t0);
        q.flush_backoff(t0 + Duration::from_millis(999));
        assert_eq!(q.pop(), None);
        q.flush_backoff(t0 + Duration::from_secs(1));
        assert_eq!(q.pop(), Some(key("a")));
        for _ in 0..10 {
            q.backoff(&key("a"), t0);
            q.flush_backoff(t0 + MAX_BACKOFF);
            assert_eq!(q.pop(), Some(key("a")), "never more than {MAX_BACKOFF:?}");
        }
        q.backoff(&key("a"), t0);
        q.flush_backoff(t0 + Duration::from_secs(9));
        assert_eq!(q.pop(), None, "after many attempts the delay is the cap");
        q.remove(&key("a"));
        q.flush_backoff(t0 + MAX_BACKOFF);
        assert_eq!(q.pop(), None);
    }
}
