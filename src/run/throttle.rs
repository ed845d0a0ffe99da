//! Client-side rate limit for API writes (`clientQPS`, `clientBurst`), like client-go's
//! token bucket: up to `burst` writes at once, then `qps` a second. A write that finds no
//! token reserves the next one and waits for it, so writers are served in order.

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Throttle {
    qps: f64,
    burst: f64,
    /// Tokens left (negative: reserved by writers still waiting) as of the instant.
    bucket: Mutex<(f64, Instant)>,
}

impl Throttle {
    /// `None` when `qps` is 0: no limit.
    pub fn new(qps: f64, burst: u32) -> Option<Throttle> {
        (qps > 0.0).then(|| {
            let burst = f64::from(burst.max(1));
            Throttle {
                qps,
                burst,
                bucket: Mutex::new((burst, Instant::now())),
            }
        })
    }

    /// Take a token at `now`; returns how long to wait before using it.
    pub fn reserve(&self, now: Instant) -> Duration {
        let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, since) = *bucket;
        let refilled = now.saturating_duration_since(since).as_secs_f64() * self.qps;
        let tokens = (tokens + refilled).min(self.burst) - 1.0;
        *bucket = (tokens, now.max(since));
        if tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-tokens / self.qps)
        }
    }

    /// Wait for a token.
    pub async fn acquire(&self) {
        let wait = self.reserve(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_steady_rate() {
        let throttle = Throttle::new(10.0, 3).unwrap();
        let t0 = Instant::now();
        let waits: Vec<Duration> = (0..5).map(|_| throttle.reserve(t0)).collect();
        assert_eq!(waits[..3], [Duration::ZERO; 3], "the burst goes at once");
        assert_eq!(waits[3], Duration::from_millis(100));
        assert_eq!(waits[4], Duration::from_millis(200), "waiters queue up");
        // A second later the bucket has refilled (to the burst, no more).
        let later = t0 + Duration::from_secs(1);
        let waits: Vec<Duration> = (0..4).map(|_| throttle.reserve(later)).collect();
        assert_eq!(waits[..3], [Duration::ZERO; 3]);
        assert!(waits[3] > Duration::ZERO);
        assert!(Throttle::new(0.0, 10).is_none(), "0 QPS: unlimited");
    }
}
