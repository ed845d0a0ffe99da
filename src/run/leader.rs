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

use std::sync::Mutex;
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
}

#[derive(Debug, Clone, Copy)]
struct Timing {
    lease_duration: Duration,
    renew_deadline: Duration,
}

/// Writes stop this long before a standby could take the Lease.
const WRITE_MARGIN: Duration = Duration::from_secs(1);

impl Fence {
    /// A fence that never closes: the replica schedules alone.
    pub fn open() -> Fence {
        Fence {
            timing: None,
            renewed: Mutex::new(None),
        }
    }

    fn elected(le: &LeaderElection) -> Fence {
        Fence {
            timing: Some(Timing {
                lease_duration: Duration::from_secs(le.lease_duration_seconds),
                renew_deadline: Duration::from_secs(le.renew_deadline_seconds),
            }),
            renewed: Mutex::new(None),
        }
    }

    fn renewed_at(&self) -> Option<Instant> {
        *self.renewed.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn renewal_landed(&self, sent: Instant) {
        *self.renewed.lock().unwrap_or_else(|e| e.into_inner()) = Some(sent);
    }

    fn lost(&self) {
        *self.renewed.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Whether this replica may start scheduling a pod now.
    pub fn may_schedule(&self, now: Instant) -> bool {
        match self.timing {
            None => true,
            Some(t) => self
                .renewed_at()
                .is_some_and(|r| now < r + t.renew_deadline),
        }
    }

    /// Whether a write sent now is safe: no other replica can lead before it lands.
    pub fn may_write(&self, now: Instant) -> bool {
        match self.timing {
            None => true,
            Some(t) => self
                .renewed_at()
                .is_some_and(|r| now + WRITE_MARGIN < r + t.lease_duration),
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
    pub fn new(client: Client, le: &LeaderElection, identity: String) -> Candidate {
        Candidate {
            api: Api::namespaced(client, &le.lease_namespace),
            name: le.lease_name.clone(),
            identity,
            lease_duration: Duration::from_secs(le.lease_duration_seconds),
            retry_period: Duration::from_secs(le.retry_period_seconds),
            fence: std::sync::Arc::new(Fence::elected(le)),
            observed: None,
            leading: false,
        }
    }

    pub fn fence(&self) -> std::sync::Arc<Fence> {
        self.fence.clone()
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
        if self.leading && self.fence.may_write(Instant::now()) {
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
}
