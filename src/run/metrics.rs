//! Prometheus metrics and the health endpoints, on one HTTP port.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    /// Per claim allocated: the scheduling cycle that found its devices, in seconds.
    pub allocation_latency: prometheus::Histogram,
    /// Scheduling attempts by result (scheduled, unschedulable, error), in seconds.
    pub attempts: HistogramVec,
    /// Claim writes plus pod binding, by result.
    pub bind_latency: HistogramVec,
    /// Pending pods by queue (active, backoff, unschedulable).
    pub pending: IntGaugeVec,
    /// Decisions assumed whose writes have not finished.
    pub in_flight: IntGauge,
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
                "Time to find devices for one claim",
            )
            .buckets(buckets()),
        )?;
        let attempts = HistogramVec::new(
            HistogramOpts::new(
                "scheduling_attempt_duration_seconds",
                "Scheduling attempt duration by result",
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
        })
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
}

pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
) {
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(s): State<AppState>| async move { s.metrics.render() }),
        )
        .route("/healthz", get(|| async { "ok" }))
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
        .with_state(AppState { metrics, ready });
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "metrics server stopped");
    }
}
