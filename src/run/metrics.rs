//! Prometheus metrics and the health endpoints, on one HTTP port.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Whether a write was refused because this replica may no longer lead.
pub fn is_not_leader(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Service(b) if b.is::<super::leader::NotLeader>())
}

pub struct Metrics {
    registry: Registry,
    /// Per placement that allocates at least one claim: how long the device search for the
    /// pod's claims took on the chosen node (the engine's `Placement::allocation_time`; a
    /// pod's claims are searched together), in seconds.
    pub allocation_latency: prometheus::Histogram,
    /// Every scheduling attempt, by result (scheduled, unschedulable, error), in seconds:
    /// the whole cycle (filters, device search on every node, scoring); for a pod whose first
    /// try ran out of time, both tries.
    pub attempts: HistogramVec,
    /// Claim writes plus pod binding, by result.
    pub bind_latency: HistogramVec,
    /// Pending pods by queue (active, backoff, unschedulable).
    pub pending: IntGaugeVec,
    /// Decisions assumed whose writes have not finished.
    pub in_flight: IntGauge,
    /// From the pod entering the queue to its binding, in seconds.
    pub pod_scheduling: prometheus::Histogram,
    /// Allocator search steps (requests and devices tried) per scheduling attempt.
    pub search_steps: prometheus::Histogram,
    /// API writes by verb and resource, in seconds.
    pub api_writes: HistogramVec,
    /// Failed API writes by verb, resource and HTTP code (0: no answer).
    pub api_errors: IntCounterVec,
    /// 1 while this replica is the leader (or runs without leader election).
    pub leader: IntGauge,
    /// `clientQPS`/`clientBurst`: every write waits for a token first.
    throttle: Option<super::throttle::Throttle>,
    /// Every write asks it first: a replica that may no longer lead writes nothing.
    fence: Arc<super::leader::Fence>,
}

fn buckets() -> Vec<f64> {
    prometheus::exponential_buckets(0.0001, 2.0, 18).expect("valid buckets")
}

impl Metrics {
    pub fn new() -> prometheus::Result<Metrics> {
        let registry = Registry::new_custom(Some("dra_scheduler".into()), None)?;
        let allocation_latency = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "claim_allocation_duration_seconds",
                "Time the device search for a pod's claims took on the chosen node, once per placement that allocates at least one claim (all of a pod's claims are searched together)",
            )
            .buckets(buckets()),
        )?;
        let attempts = HistogramVec::new(
            HistogramOpts::new(
                "scheduling_attempt_duration_seconds",
                "Scheduling attempt duration by result (scheduled, unschedulable, error): the whole cycle, every node",
            )
            .buckets(buckets()),
            &["result"],
        )?;
        let bind_latency = HistogramVec::new(
            HistogramOpts::new(
                "binding_duration_seconds",
                "API writes of one decision (claims and binding)",
            )
            .buckets(buckets()),
            &["result"],
        )?;
        let pending = IntGaugeVec::new(
            Opts::new("pending_pods", "Pending pods by queue"),
            &["queue"],
        )?;
        let in_flight = IntGauge::new(
            "bindings_in_flight",
            "Decisions whose writes have not finished",
        )?;
        let pod_scheduling = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "pod_scheduling_duration_seconds",
                "From a pod entering the queue to its binding",
            )
            .buckets(prometheus::exponential_buckets(0.001, 2.0, 18)?),
        )?;
        let search_steps = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "allocator_search_steps",
                "Allocator search effort per scheduling attempt: requests and devices tried, all nodes",
            )
            .buckets(prometheus::exponential_buckets(1.0, 4.0, 14)?),
        )?;
        let api_writes = HistogramVec::new(
            HistogramOpts::new(
                "api_write_duration_seconds",
                "API writes by verb and resource",
            )
            .buckets(buckets()),
            &["verb", "resource"],
        )?;
        let api_errors = IntCounterVec::new(
            Opts::new(
                "api_write_errors_total",
                "Failed API writes by verb, resource and HTTP code",
            ),
            &["verb", "resource", "code"],
        )?;
        let leader = IntGauge::new(
            "leader",
            "1 while this replica is the leader (or runs without leader election)",
        )?;
        registry.register(Box::new(pod_scheduling.clone()))?;
        registry.register(Box::new(search_steps.clone()))?;
        registry.register(Box::new(api_writes.clone()))?;
        registry.register(Box::new(api_errors.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        registry.register(Box::new(allocation_latency.clone()))?;
        registry.register(Box::new(attempts.clone()))?;
        registry.register(Box::new(bind_latency.clone()))?;
        registry.register(Box::new(pending.clone()))?;
        registry.register(Box::new(in_flight.clone()))?;
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        Ok(Metrics {
            registry,
            allocation_latency,
            attempts,
            bind_latency,
            pending,
            in_flight,
            pod_scheduling,
            search_steps,
            api_writes,
            api_errors,
            leader,
            throttle: None,
            fence: Arc::new(super::leader::Fence::open()),
        })
    }

    /// Refuse every write while `fence` is closed (see [`super::leader::Fence`]).
    pub fn with_fence(mut self, fence: Arc<super::leader::Fence>) -> Metrics {
        self.fence = fence;
        self
    }

    /// Pods per queue: (active, backoff, unschedulable, gated).
    pub fn set_pending(
        &self,
        (active, backoff, unschedulable, gated): (usize, usize, usize, usize),
    ) {
        for (queue, n) in [
            ("active", active),
            ("backoff", backoff),
            ("unschedulable", unschedulable),
            ("gated", gated),
        ] {
            self.pending.with_label_values(&[queue]).set(n as i64);
        }
    }

    /// Whether this replica may write now.
    pub fn may_write(&self) -> bool {
        self.fence.may_write(std::time::Instant::now())
    }

    /// Rate-limit the writes made through [`Metrics::write`].
    pub fn with_throttle(mut self, throttle: Option<super::throttle::Throttle>) -> Metrics {
        self.throttle = throttle;
        self
    }

    /// Time one API write (after the client-side rate limit) and count it if it fails.
    pub async fn write<T>(
        &self,
        verb: &str,
        resource: &str,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        if let Some(throttle) = &self.throttle {
            throttle.acquire().await;
        }
        self.fenced(verb, resource, call).await
    }

    /// Time one API write outside the write budget: events, which kube-scheduler also sends
    /// on a client of their own (here they are few: one per distinct message per pod).
    pub async fn write_unthrottled<T>(
        &self,
        verb: &str,
        resource: &str,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        self.fenced(verb, resource, call).await
    }

    /// The write, if this replica may still write; a [`super::leader::NotLeader`] error
    /// (see [`is_not_leader`]) otherwise.
    async fn fenced<T>(
        &self,
        verb: &str,
        resource: &str,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        if let Err(e) = self.fence.check_write() {
            return Err(kube::Error::Service(Box::new(e)));
        }
        self.timed(verb, resource, call).await
    }

    async fn timed<T>(
        &self,
        verb: &str,
        resource: &str,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        let started = std::time::Instant::now();
        let result = call.await;
        self.api_writes
            .with_label_values(&[verb, resource])
            .observe(started.elapsed().as_secs_f64());
        if let Err(e) = &result {
            let code = match e {
                kube::Error::Api(s) => s.code.to_string(),
                _ => "0".into(),
            };
            self.api_errors
                .with_label_values(&[verb, resource, &code])
                .inc();
        }
        result
    }

    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    health: Arc<super::health::Health>,
}

pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    health: Arc<super::health::Health>,
) {
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(s): State<AppState>| async move { s.metrics.render() }),
        )
        .route(
            "/healthz",
            get(|State(s): State<AppState>| async move {
                match s.health.check(std::time::Instant::now()) {
                    Ok(summary) => (StatusCode::OK, format!("ok: {summary}")),
                    Err(stuck) => (StatusCode::SERVICE_UNAVAILABLE, stuck),
                }
            }),
        )
        .route(
            "/readyz",
            get(|State(s): State<AppState>| async move {
                if s.ready.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ok")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
                }
            }),
        )
        .with_state(AppState {
            metrics,
            ready,
            health,
        });
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "metrics server stopped");
    }
}
