//! Leader election with a fence, as kube-scheduler's (client-go's) leader election behaves:
//! the replica holding the `coordination.k8s.io/v1` Lease renews it every retry period; a
//! standby takes it once the holder has not renewed it for a lease duration, measured on
//! the standby's own clock from when it last saw the Lease change.
//!
//! [`Fence`] is what the rest of the daemon asks, and it trusts only successful renewals,
//! not what the election task believes:
//! - a replica may **schedule** until `renew deadline` after the last renewal that
//!   landed (renewals are tried every retry period, so a few may fail first);
//! - it may **write** (bindings in flight finish or unwind) until one second before a
//!   standby could take the Lease (`lease duration` after that renewal), and never after.
//!
//! So a leader whose renewals fail (API server unreachable, permission revoked) stops
//! scheduling, lets its bindings settle and exits, all before anyone else can lead: two
//! schedulers never write at the same time.
//!
//! The fence is asked by every attempt of every write, not once per write: the daemon's
//! writing clients carry [`FenceLayer`] beneath their retry layer, so a request that kube's
//! retries send again after a 429 or 503 asks again, and one still in flight when the
//! window ends is cancelled then (its HTTP/2 stream reset) instead of landing later. On
//! the way out, the Lease is released only after the fence is closed and every write in
//! flight has ended ([`Fence::close_and_drain`]).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;

use super::config::LeaderElection;

/// A write that the fence refused: this replica is not (or no longer surely) the leader.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "not the leader: the Lease was not renewed in time; writes stop before a standby can take over"
)]
pub struct NotLeader;

/// When this replica may schedule and write. Without leader election it always may.
#[derive(Debug)]
pub struct Fence {
    /// `None` without leader election.
    timing: Option<Timing>,
    /// When the last renewal that landed was sent (the start of its request).
    renewed: Mutex<Option<Instant>>,
    /// Closed for good: the replica is releasing the Lease or stopping.
    closed: AtomicBool,
    /// Woken whenever the window moves or shuts, so that writes in flight look again.
    moved: watch::Sender<()>,
    /// Writes sent through [`Fence::bounded`] that have not ended.
    in_flight: watch::Sender<usize>,
}

/// Until when a write may be in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// No leader election: always.
    Open,
    /// Until this instant (one [`WRITE_MARGIN`] before a standby could take the Lease).
    Until(Instant),
    /// Never: not (or no longer) the leader.
    Shut,
}

#[derive(Debug, Clone, Copy)]
struct Timing {
    lease_duration: Duration,
    renew_deadline: Duration,
}

/// Writes stop this long before a standby could take the Lease.
const WRITE_MARGIN: Duration = Duration::from_secs(1);

/// How long releasing the Lease waits for the writes in flight to end once the fence is
/// shut (they are cancelled at once; this bounds only the tasks' wake-up).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

impl Fence {
    fn with_timing(timing: Option<Timing>) -> Fence {
        Fence {
            timing,
            renewed: Mutex::new(None),
            closed: AtomicBool::new(false),
            moved: watch::Sender::new(()),
            in_flight: watch::Sender::new(0),
        }
    }

    /// A fence that never closes: the replica schedules alone.
    pub fn open() -> Fence {
        Fence::with_timing(None)
    }

    /// The fence of a replica that campaigns for the Lease: shut until a renewal lands.
    pub fn elected(le: &LeaderElection) -> Fence {
        Fence::with_timing(Some(Timing {
            lease_duration: Duration::from_secs(le.lease_duration_seconds),
            renew_deadline: Duration::from_secs(le.renew_deadline_seconds),
        }))
    }

    fn renewed_at(&self) -> Option<Instant> {
        *self.renewed.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_renewed(&self, at: Option<Instant>) {
        *self.renewed.lock().unwrap_or_else(|e| e.into_inner()) = at;
        self.moved.send_replace(());
    }

    pub(super) fn renewal_landed(&self, sent: Instant) {
        self.set_renewed(Some(sent));
    }

    pub(super) fn lost(&self) {
        self.set_renewed(None);
    }

    /// Until when a write may be in flight, as things stand.
    pub fn window(&self) -> Window {
        if self.closed.load(Ordering::Acquire) {
            return Window::Shut;
        }
        match self.timing {
            None => Window::Open,
            Some(t) => match self.renewed_at() {
                Some(r) => Window::Until(r + t.lease_duration - WRITE_MARGIN),
                None => Window::Shut,
            },
        }
    }

    /// Shut the fence for good, cancelling every write in flight, and wait (at most
    /// `timeout`) until each has ended. Then nothing this replica sent can still land.
    pub async fn close_and_drain(&self, timeout: Duration) -> bool {
        self.closed.store(true, Ordering::Release);
        self.moved.send_replace(());
        let mut in_flight = self.in_flight.subscribe();
        tokio::time::timeout(timeout, in_flight.wait_for(|n| *n == 0))
            .await
            .is_ok()
    }

    /// Run one attempt of a write inside the window: refused when the fence is shut,
    /// cancelled (the future dropped) when the window ends before it does.
    pub async fn bounded<T, E>(
        &self,
        attempt: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E>
    where
        E: From<NotLeader>,
    {
        let mut moved = self.moved.subscribe();
        if !self.may_write(Instant::now()) {
            return Err(NotLeader.into());
        }
        let _in_flight = InFlight::enter(&self.in_flight);
        tokio::pin!(attempt);
        loop {
            let until = match self.window() {
                Window::Open => return attempt.await,
                Window::Shut => return Err(NotLeader.into()),
                Window::Until(until) if Instant::now() >= until => return Err(NotLeader.into()),
                Window::Until(until) => until,
            };
            tokio::select! {
                result = &mut attempt => return result,
                () = tokio::time::sleep_until(until.into()) => {}
                _ = moved.changed() => {}
            }
        }
    }

    /// Whether this replica may start scheduling a pod now.
    pub fn may_schedule(&self, now: Instant) -> bool {
        if self.closed.load(Ordering::Acquire) {
            return false;
        }
        match self.timing {
            None => true,
            Some(t) => self
                .renewed_at()
                .is_some_and(|r| now < r + t.renew_deadline),
        }
    }

    /// Whether a write sent now is safe: no other replica can lead before it lands.
    pub fn may_write(&self, now: Instant) -> bool {
        match self.window() {
            Window::Open => true,
            Window::Until(until) => now < until,
            Window::Shut => false,
        }
    }

    /// [`Fence::may_write`] as an error, for the writers.
    pub fn check_write(&self) -> Result<(), NotLeader> {
        if self.may_write(Instant::now()) {
            Ok(())
        } else {
            Err(NotLeader)
        }
    }
}

/// One write in flight, counted while it lives.
struct InFlight<'a>(&'a watch::Sender<usize>);

impl<'a> InFlight<'a> {
    fn enter(count: &'a watch::Sender<usize>) -> InFlight<'a> {
        count.send_modify(|n| *n += 1);
        InFlight(count)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

/// What the candidate last saw of the Lease, to tell whether its holder still renews it.
struct Observed {
    spec: Option<LeaseSpec>,
    at: Instant,
}

/// One replica's candidacy.
pub struct Candidate {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_duration: Duration,
    retry_period: Duration,
    fence: std::sync::Arc<Fence>,
    observed: Option<Observed>,
    leading: bool,
}

/// The result of one acquire-or-renew round.
#[derive(Debug, PartialEq, Eq)]
enum Round {
    Leading,
    Standby,
}

impl Candidate {
    /// A candidate for the Lease `le` names, renewing it through `client` (a client of
    /// its own: no fence, no retries beyond its own rounds) and moving `fence` (made with
    /// [`Fence::elected`]) with each renewal.
    pub fn new(
        client: Client,
        le: &LeaderElection,
        identity: String,
        fence: std::sync::Arc<Fence>,
    ) -> Candidate {
        Candidate {
            api: Api::namespaced(client, &le.lease_namespace),
            name: le.lease_name.clone(),
            identity,
            lease_duration: Duration::from_secs(le.lease_duration_seconds),
            retry_period: Duration::from_secs(le.retry_period_seconds),
            fence,
            observed: None,
            leading: false,
        }
    }

    /// Try to take or renew the Lease every retry period, until `stop` fires; then release
    /// it if held (a standby takes over at once). `leading` follows the fence: it turns
    /// false as soon as renewals have failed for the renew deadline.
    pub async fn run(mut self, leading: watch::Sender<bool>, mut stop: watch::Receiver<bool>) {
        loop {
            let sent = Instant::now();
            match self.round(sent).await {
                Ok(Round::Leading) => {
                    self.fence.renewal_landed(sent);
                    if !self.leading {
                        tracing::info!(identity = %self.identity, lease = %self.name, "acquired the Lease");
                    }
                    self.leading = true;
                }
                Ok(Round::Standby) => {
                    if self.leading {
                        tracing::warn!(lease = %self.name, "another replica holds the Lease now");
                        self.fence.lost();
                    }
                    self.leading = false;
                }
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %e, "could not renew or acquire the Lease");
                }
            }
            let now = Instant::now();
            let _ = leading.send_if_modified(|l| {
                let may = self.fence.may_schedule(now);
                std::mem::replace(l, may) != may
            });
            tokio::select! {
                _ = tokio::time::sleep(self.retry_period) => {}
                _ = stop.changed() => break,
            }
        }
        // Nothing this replica sent may land once a standby leads: shut the fence and let
        // every write in flight end before the Lease is given up.
        let held = self.leading && self.fence.may_write(Instant::now());
        if !self.fence.close_and_drain(DRAIN_TIMEOUT).await {
            tracing::warn!(
                "writes still in flight after the fence closed; keeping the Lease until it expires"
            );
            return;
        }
        if held {
            match self.release().await {
                Ok(()) => tracing::info!("released the leader Lease"),
                Err(e) => tracing::warn!(error = %e, "could not release the leader Lease"),
            }
        }
    }

    async fn round(&mut self, now: Instant) -> Result<Round, kube::Error> {
        let current = match self.api.get_opt(&self.name).await? {
            Some(lease) => lease,
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(self.spec_taking(None)),
                };
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(Round::Leading),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(Round::Standby),
                    Err(e) => Err(e),
                };
            }
        };
        let spec = current.spec.clone().unwrap_or_default();
        if self
            .observed
            .as_ref()
            .is_none_or(|o| o.spec.as_ref() != Some(&spec))
        {
            self.observed = Some(Observed {
                spec: Some(spec.clone()),
                at: now,
            });
        }
        let holder = spec.holder_identity.as_deref().unwrap_or_default();
        let held_by_other = !holder.is_empty() && holder != self.identity;
        if held_by_other {
            let seen = self.observed.as_ref().map_or(now, |o| o.at);
            let duration = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(self.lease_duration, Duration::from_secs);
            if now < seen + duration {
                return Ok(Round::Standby);
            }
        }
        let mut lease = current;
        lease.spec = Some(self.spec_taking(Some(&spec)));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(Round::Leading),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Round::Standby),
            Err(e) => Err(e),
        }
    }

    /// The Lease held by this replica from now, given what it was.
    fn spec_taking(&self, old: Option<&LeaseSpec>) -> LeaseSpec {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let ours = old.is_some_and(|o| o.holder_identity.as_deref() == Some(&self.identity));
        let transitions = old.and_then(|o| o.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.lease_duration.as_secs() as i32),
            acquire_time: if ours {
                old.and_then(|o| o.acquire_time.clone())
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(if ours || old.is_none() {
                transitions
            } else {
                transitions + 1
            }),
            ..old.cloned().unwrap_or_default()
        }
    }

    /// Give the Lease up: no holder, so a standby takes it on its next round.
    async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(&self.identity) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence() -> Fence {
        Fence::elected(&LeaderElection {
            lease_name: "l".into(),
            lease_namespace: "ns".into(),
            lease_duration_seconds: 10,
            renew_deadline_seconds: 7,
            retry_period_seconds: 2,
        })
    }

    #[test]
    fn a_leader_stops_scheduling_at_the_renew_deadline_and_writing_before_the_lease_expires() {
        let f = fence();
        let t0 = Instant::now();
        assert!(!f.may_schedule(t0), "never renewed: not a leader");
        assert!(!f.may_write(t0));
        f.renewal_landed(t0);
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(f.may_schedule(at(6)) && f.may_write(at(6)));
        assert!(!f.may_schedule(at(7)), "renew deadline passed");
        assert!(f.may_write(at(8)), "bindings in flight may still settle");
        assert!(
            !f.may_write(at(9)),
            "no write within a second of when a standby may take the Lease"
        );
        f.renewal_landed(at(8));
        assert!(f.may_schedule(at(9)) && f.may_write(at(9)), "renewed again");
        f.lost();
        assert!(!f.may_schedule(at(9)) && !f.may_write(at(9)));
    }

    #[test]
    fn without_leader_election_the_fence_is_open() {
        let f = Fence::open();
        assert!(f.may_schedule(Instant::now()) && f.check_write().is_ok());
    }

    /// A write that never answers, as one held up behind a slow or failing API server.
    async fn never_answers() -> Result<(), NotLeader> {
        std::future::pending().await
    }

    #[tokio::test]
    async fn a_write_still_in_flight_when_the_window_ends_is_cancelled_then() {
        let f = std::sync::Arc::new(Fence::elected(&LeaderElection {
            lease_name: "l".into(),
            lease_namespace: "ns".into(),
            lease_duration_seconds: 2,
            renew_deadline_seconds: 1,
            retry_period_seconds: 1,
        }));
        assert!(
            f.bounded(async { Ok::<_, NotLeader>(()) }).await.is_err(),
            "never renewed: refused before it is sent"
        );
        let renewed = Instant::now();
        f.renewal_landed(renewed);
        let Window::Until(until) = f.window() else {
            panic!("renewed: a window with an end")
        };
        assert_eq!(
            until,
            renewed + Duration::from_secs(1),
            "a second before the Lease may be taken"
        );
        let write = tokio::spawn({
            let f = f.clone();
            async move { f.bounded(never_answers()).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(*f.in_flight.borrow(), 1);
        assert!(
            write.await.unwrap().is_err(),
            "cancelled at the window's end"
        );
        assert!(Instant::now() >= until);
        assert_eq!(*f.in_flight.borrow(), 0);
    }

    #[tokio::test]
    async fn closing_the_fence_cancels_writes_in_flight_before_the_lease_is_released() {
        let f = std::sync::Arc::new(fence());
        f.renewal_landed(Instant::now());
        let write = tokio::spawn({
            let f = f.clone();
            async move { f.bounded(never_answers()).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(f.close_and_drain(Duration::from_secs(5)).await, "drained");
        assert!(write.await.unwrap().is_err());
        assert!(!f.may_write(Instant::now()) && !f.may_schedule(Instant::now()));
        f.renewal_landed(Instant::now());
        assert_eq!(f.window(), Window::Shut, "closed for good");
    }
}
