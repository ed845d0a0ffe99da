//! Prometheus metrics and the `/metrics` + `/healthz` HTTP endpoints.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// All metrics of the agent, registered in their own registry.
pub struct Metrics {
    pub registry: Registry,
    pub prepare_seconds: Histogram,
    pub unprepare_seconds: Histogram,
    pub prepare_errors: IntCounter,
    pub unprepare_errors: IntCounter,
    pub published_devices: IntGauge,
    pub pool_generation: IntGauge,
    pub unhealthy_gpus: IntGauge,
    pub slice_writes: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let buckets = vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 45.0];
        let prepare_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "dra_node_agent_prepare_duration_seconds",
                "Time to prepare one claim (NodePrepareResources, per claim)",
            )
            .buckets(buckets.clone()),
        )
        .expect("valid metric");
        let unprepare_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "dra_node_agent_unprepare_duration_seconds",
                "Time to unprepare one claim (NodeUnprepareResources, per claim)",
            )
            .buckets(buckets),
        )
        .expect("valid metric");
        let prepare_errors = IntCounter::new(
            "dra_node_agent_prepare_errors_total",
            "Claims whose preparation failed",
        )
        .expect("valid metric");
        let unprepare_errors = IntCounter::new(
            "dra_node_agent_unprepare_errors_total",
            "Claims whose unpreparation failed",
        )
        .expect("valid metric");
        let published_devices = IntGauge::new(
            "dra_node_agent_published_devices",
            "Devices in this node's ResourceSlices",
        )
        .expect("valid metric");
        let pool_generation = IntGauge::new(
            "dra_node_agent_pool_generation",
            "Generation of this node's pool",
        )
        .expect("valid metric");
        let unhealthy_gpus = IntGauge::new(
            "dra_node_agent_unhealthy_gpus",
            "GPUs with at least one health taint",
        )
        .expect("valid metric");
        let slice_writes = IntCounterVec::new(
            Opts::new(
                "dra_node_agent_slice_writes_total",
                "ResourceSlice writes by operation",
            ),
            &["op"],
        )
        .expect("valid metric");
        let build_info =
            dra_telemetry::build_info("dra_node_agent_build_info", env!("CARGO_PKG_VERSION"))
                .expect("valid metric");
        for c in [
            Box::new(build_info) as Box<dyn prometheus::core::Collector>,
            Box::new(prepare_seconds.clone()),
            Box::new(unprepare_seconds.clone()),
            Box::new(prepare_errors.clone()),
            Box::new(unprepare_errors.clone()),
            Box::new(published_devices.clone()),
            Box::new(pool_generation.clone()),
            Box::new(unhealthy_gpus.clone()),
            Box::new(slice_writes.clone()),
        ] {
            registry.register(c).expect("unique metric");
        }
        #[cfg(target_os = "linux")]
        registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("unique metric");
        Metrics {
            registry,
            prepare_seconds,
            unprepare_seconds,
            prepare_errors,
            unprepare_errors,
            published_devices,
            pool_generation,
            unhealthy_gpus,
            slice_writes,
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding");
        String::from_utf8(buf).expect("utf-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// What `/healthz` reports: healthy once the plugin serves and slices were published.
#[derive(Default)]
pub struct Health {
    pub plugin_serving: AtomicBool,
    pub slices_published: AtomicBool,
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// The HTTP router for `/metrics` and `/healthz`.
pub fn router(metrics: Arc<Metrics>, health: Arc<Health>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz_handler))
        .with_state(AppState { metrics, health })
}

async fn metrics_handler(State(s): State<AppState>) -> (StatusCode, String) {
    (StatusCode::OK, s.metrics.render())
}

async fn healthz_handler(State(s): State<AppState>) -> (StatusCode, String) {
    let serving = s.health.plugin_serving.load(Ordering::Relaxed);
    let published = s.health.slices_published.load(Ordering::Relaxed);
    if serving && published {
        (StatusCode::OK, "ok\n".into())
    } else {
        let mut why = Vec::new();
        if !serving {
            why.push("kubelet plugin not serving yet");
        }
        if !published {
            why.push("ResourceSlices not published yet");
        }
        (StatusCode::SERVICE_UNAVAILABLE, why.join("; ") + "\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_named_metrics() {
        let m = Metrics::new();
        m.prepare_seconds.observe(0.02);
        m.published_devices.set(60);
        let text = m.render();
        assert!(
            text.contains("dra_node_agent_prepare_duration_seconds_count 1"),
            "{text}"
        );
        assert!(
            text.contains("dra_node_agent_published_devices 60"),
            "{text}"
        );
        let build_info = format!(
            "dra_node_agent_build_info{{git_commit=\"{}\",rustc_version=\"{}\",version=\"{}\"}} 1",
            dra_telemetry::GIT_COMMIT,
            dra_telemetry::RUSTC_VERSION,
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&build_info), "{text}");
    }

    #[tokio::test]
    async fn healthz_says_what_is_missing() {
        let health = Arc::new(Health::default());
        let state = AppState {
            metrics: Arc::new(Metrics::new()),
            health: health.clone(),
        };
        let (code, body) = healthz_handler(State(state.clone())).await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            body,
            "kubelet plugin not serving yet; ResourceSlices not published yet\n"
        );
        health.plugin_serving.store(true, Ordering::Relaxed);
        health.slices_published.store(true, Ordering::Relaxed);
        assert_eq!(
            healthz_handler(State(state)).await,
            (StatusCode::OK, "ok\n".to_string())
        );
    }
}
