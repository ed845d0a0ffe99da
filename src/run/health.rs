//! What `/healthz` reports: whether the event loop still turns and whether a scheduling
//! attempt has run far past its budget. The loop beats on every turn (at least every
//! 200 ms, from its timer); the scheduling worker marks when an attempt starts and ends.
//! A loop silent for [`LOOP_STALL`], or an attempt running for its budget plus
//! [`ATTEMPT_GRACE`], fails the check, so that the kubelet restarts a stuck replica and a
//! standby takes over.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The event loop is stuck when it has not turned for this long.
pub const LOOP_STALL: Duration = Duration::from_secs(10);
/// An attempt is stuck when it runs this long past its budget (the budget stops searches;
/// what is left of an attempt after that is short).
pub const ATTEMPT_GRACE: Duration = Duration::from_secs(20);

/// How many searches with the whole budget run at once: a pod whose first try ran out
/// just past its budget (a busy machine) does not wait for one that needs all of it.
pub const LONG_LANES: usize = 2;

/// Where an attempt runs: the worker that takes pods in queue order, or one of the lanes
/// that give a pod needing more than a first try its whole budget.
#[derive(Clone, Copy, Debug)]
pub enum Lane {
    Main,
    Long(usize),
}

impl Lane {
    fn slot(self) -> usize {
        match self {
            Lane::Main => 0,
            Lane::Long(i) => 1 + i.min(LONG_LANES - 1),
        }
    }
}

/// Progress marks, shared by the loop, the worker and the HTTP handler.
#[derive(Debug)]
pub struct Health {
    start: Instant,
    /// Milliseconds since `start` of the loop's last turn.
    beat: AtomicU64,
    /// Per lane ([`Lane`]): milliseconds since `start` when its running attempt began,
    /// plus one; 0: none runs.
    attempt: [AtomicU64; 1 + LONG_LANES],
    /// Milliseconds since `start` of the last attempt that finished, plus one; 0: none yet.
    finished: AtomicU64,
    budget: Duration,
}

impl Health {
    pub fn new(budget: Duration) -> Health {
        Health {
            start: Instant::now(),
            beat: AtomicU64::new(0),
            attempt: std::array::from_fn(|_| AtomicU64::new(0)),
            finished: AtomicU64::new(0),
            budget,
        }
    }

    fn millis(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.start).as_millis() as u64
    }

    fn since(&self, mark: u64, now: Instant) -> Duration {
        Duration::from_millis(self.millis(now).saturating_sub(mark))
    }

    pub fn beat(&self, now: Instant) {
        self.beat.store(self.millis(now), Ordering::Relaxed);
    }

    pub fn attempt_started(&self, lane: Lane, now: Instant) {
        self.attempt[lane.slot()].store(self.millis(now) + 1, Ordering::Relaxed);
    }

    pub fn attempt_finished(&self, lane: Lane, now: Instant) {
        self.attempt[lane.slot()].store(0, Ordering::Relaxed);
        self.finished.store(self.millis(now) + 1, Ordering::Relaxed);
    }

    /// `Ok` with a summary while healthy, `Err` with what is stuck.
    pub fn check(&self, now: Instant) -> Result<String, String> {
        let loop_idle = self.since(self.beat.load(Ordering::Relaxed), now);
        let mut summary = format!("event loop turned {:.1}s ago", loop_idle.as_secs_f64());
        let mut stuck = false;
        for (i, slot) in self.attempt.iter().enumerate() {
            let lane = if i == 0 {
                "scheduling attempt"
            } else {
                "long search"
            };
            match slot.load(Ordering::Relaxed) {
                0 if i == 0 => summary.push_str("; no scheduling attempt running"),
                0 => {}
                mark => {
                    let running = self.since(mark - 1, now);
                    summary.push_str(&format!(
                        "; a {lane} has run for {:.1}s (budget {:?})",
                        running.as_secs_f64(),
                        self.budget
                    ));
                    stuck |= running > self.budget + ATTEMPT_GRACE;
                }
            }
        }
        if self.attempt[1..]
            .iter()
            .all(|s| s.load(Ordering::Relaxed) == 0)
        {
            summary.push_str("; no long search running");
        }
        if stuck {
            return Err(format!("stuck: {summary}"));
        }
        if let Some(mark) = self.finished.load(Ordering::Relaxed).checked_sub(1) {
            summary.push_str(&format!(
                "; last attempt finished {:.1}s ago",
                self.since(mark, now).as_secs_f64()
            ));
        }
        if loop_idle > LOOP_STALL {
            return Err(format!("stuck: {summary}"));
        }
        Ok(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_loop_or_an_attempt_far_past_its_budget_is_unhealthy() {
        let h = Health::new(Duration::from_secs(10));
        let t0 = h.start;
        let at = |s: u64| t0 + Duration::from_secs(s);
        h.beat(at(1));
        assert!(
            h.check(at(2))
                .unwrap()
                .contains("no scheduling attempt running")
        );
        h.attempt_started(Lane::Long(0), at(2));
        h.beat(at(30));
        let busy = h.check(at(30)).unwrap();
        assert!(
            busy.contains("a long search has run for 28.0s (budget 10s)"),
            "{busy}"
        );
        h.beat(at(33));
        let stuck = h.check(at(33)).unwrap_err();
        assert!(
            stuck.starts_with("stuck: ") && stuck.contains("31.0s"),
            "{stuck}"
        );
        h.attempt_started(Lane::Main, at(33));
        h.attempt_finished(Lane::Long(0), at(34));
        h.attempt_finished(Lane::Main, at(34));
        assert!(
            h.check(at(40)).is_ok(),
            "loop turned 7 s ago, nothing running"
        );
        let silent = h.check(at(44)).unwrap_err();
        assert!(silent.contains("event loop turned 11.0s ago"), "{silent}");
    }
}
