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
    /// pod's claims are searched together; devices remembered from an earlier pod's search
    /// count that search's time), in seconds.
    pub allocation_latency: prometheus::Histogram,
    /// Every scheduling attempt, by result (scheduled, unschedulable, error), in seconds:
    /// the whole cycle (filters, device search on every node, scoring); for a pod whose first
    /// try ran out of time, both tries.
    pub attempts: HistogramVec,
    /// Claim writes plus pod binding, by result.
    pub bind_latency: HistogramVec,
    /// Pending pods by queue (active, backoff, unschedulable).
    pub pending: IntGaugeVec,
    /// Unschedulable pods by the plugin that rejected them (kube-scheduler's
    /// `scheduler_unschedulable_pods{plugin}`).
    pub unschedulable: IntGaugeVec,
    /// Devices per node, DeviceClass and state (free, allocated, tainted); a device counts
    /// in every class it matches.
    pub devices: IntGaugeVec,
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
    /// Pods preempted (deletions started) to make room for pods of higher priority.
    pub preemptions: prometheus::IntCounter,
    /// Handoff waits by outcome: `handed_off` (placed on the better device), `expired`
    /// (the bound passed; placed on the best device then), `lost` (placed on a worse one
    /// before the bound: the device went elsewhere), `abandoned` (the pod went away).
    pub handoff_waits: IntCounterVec,
    /// Pods waiting for a device a terminating pod holds.
    pub handoff_waiting: IntGauge,
    /// Bound pods on a lower-ranked subrequest while a better device is free, by
    /// namespace and owner (`Deployment/name`, ...).
    pub degraded_pods: IntGaugeVec,
    /// Evictions of degraded pods for an upgrade, by result (`evicted`, `blocked` by a
    /// PodDisruptionBudget, `error`).
    pub upgrade_evictions: IntCounterVec,
    /// Devices allocated to more than one claim now, as the claim informer shows them
    /// (beside another scheduler without the chart's ownership mode; see `owners.rs`).
    pub doubled_devices: IntGauge,
    /// Allocations this scheduler wrote and undid because another scheduler had written
    /// one of their devices first.
    pub first_writer_conflicts: prometheus::IntCounter,
    /// How long a binding waited for the claim informer to show its own allocation
    /// before the first-writer check, in seconds.
    pub first_writer_wait: prometheus::Histogram,
    /// `clientQPS`/`clientBurst`: every write waits for a token first.
    throttle: Option<super::throttle::Throttle>,
    /// Every write asks it first: a replica that may no longer lead writes nothing.
    fence: Arc<super::leader::Fence>,
}

/// Bucket bounds, each fitted to what its histograms measure; a value past the last bound
/// counts only in `+Inf`, where no quantile can be read from it.
mod buckets {
    fn exponential(start: f64, factor: f64, count: usize) -> Vec<f64> {
        prometheus::exponential_buckets(start, factor, count).expect("valid buckets")
    }

    /// In-memory work bounded by the filter timeout (default 10 s): a scheduling attempt, a
    /// device search. 100 µs (a warm one-GPU search) to 52 s.
    pub fn cycle() -> Vec<f64> {
        exponential(0.0001, 2.0, 20)
    }

    /// One API write: 1 ms to 65 s, past the API server's 60 s request timeout.
    pub fn api_write() -> Vec<f64> {
        exponential(0.001, 2.0, 17)
    }

    /// All writes of one decision, retried with backoff until they land or are undone:
    /// 1 ms to 8.7 minutes.
    pub fn binding() -> Vec<f64> {
        exponential(0.001, 2.0, 20)
    }

    /// A pod's wait from entering the queue to being bound, which for GPUs can be hours:
    /// kube-scheduler's `scheduler_pod_scheduling_sli_duration_seconds` bounds
    /// (`ExponentialBuckets(0.01, 2, 20)`, 10 ms to 87 minutes, so quantiles compare with
    /// it) and four more, up to 23 hours.
    pub fn pod_scheduling() -> Vec<f64> {
        exponential(0.01, 2.0, 24)
    }

    /// Allocator search steps per attempt: 1 to 67 million.
    pub fn search_steps() -> Vec<f64> {
        exponential(1.0, 4.0, 14)
    }
}

impl Metrics {
    pub fn new() -> prometheus::Result<Metrics> {
        let registry = Registry::new_custom(Some("dra_scheduler".into()), None)?;
        let allocation_latency = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "claim_allocation_duration_seconds",
                "Time the device search for a pod's claims took on the chosen node, once per placement that allocates at least one claim (all of a pod's claims are searched together)",
            )
            .buckets(buckets::cycle()),
        )?;
        let attempts = HistogramVec::new(
            HistogramOpts::new(
                "scheduling_attempt_duration_seconds",
                "Scheduling attempt duration by result (scheduled, unschedulable, error, waiting: placed but waiting for a better device a terminating pod holds): the whole cycle, every node",
            )
            .buckets(buckets::cycle()),
            &["result"],
        )?;
        let bind_latency = HistogramVec::new(
            HistogramOpts::new(
                "binding_duration_seconds",
                "API writes of one decision (claims and binding), retries included",
            )
            .buckets(buckets::binding()),
            &["result"],
        )?;
        let pending = IntGaugeVec::new(
            Opts::new("pending_pods", "Pending pods by queue"),
            &["queue"],
        )?;
        let unschedulable = IntGaugeVec::new(
            Opts::new(
                "unschedulable_pods",
                "Unschedulable pods by the plugin that rejected them (none: no plugin named, e.g. out of search time)",
            ),
            &["plugin"],
        )?;
        let devices = IntGaugeVec::new(
            Opts::new(
                "devices",
                "Devices per node, DeviceClass and state (free, allocated, tainted); a device counts in every class it matches",
            ),
            &["node", "class", "state"],
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
            .buckets(buckets::pod_scheduling()),
        )?;
        let search_steps = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "allocator_search_steps",
                "Allocator search effort per scheduling attempt: requests and devices tried, all nodes",
            )
            .buckets(buckets::search_steps()),
        )?;
        let api_writes = HistogramVec::new(
            HistogramOpts::new(
                "api_write_duration_seconds",
                "API writes by verb and resource",
            )
            .buckets(buckets::api_write()),
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
        let preemptions = prometheus::IntCounter::new(
            "preemption_victims_total",
            "Pods preempted to make room for pods of higher priority",
        )?;
        registry.register(Box::new(preemptions.clone()))?;
        let handoff_waits = IntCounterVec::new(
            Opts::new(
                "handoff_waits_total",
                "Waits for a better device held by a terminating pod, by outcome (handed_off, expired, lost, abandoned)",
            ),
            &["outcome"],
        )?;
        let handoff_waiting = IntGauge::new(
            "handoff_waiting_pods",
            "Pods waiting for a better device held by a terminating pod",
        )?;
        let degraded_pods = IntGaugeVec::new(
            Opts::new(
                "degraded_pods",
                "Bound pods on a lower-ranked firstAvailable subrequest while a device for a higher-ranked one is free, by namespace and owner",
            ),
            &["namespace", "owner"],
        )?;
        let upgrade_evictions = IntCounterVec::new(
            Opts::new(
                "upgrade_evictions_total",
                "Evictions of degraded pods so that they are placed on the preferred device, by result (evicted, blocked, error)",
            ),
            &["result"],
        )?;
        for outcome in ["handed_off", "expired", "lost", "abandoned"] {
            handoff_waits.with_label_values(&[outcome]);
        }
        let doubled_devices = IntGauge::new(
            "doubled_devices",
            "Devices allocated to more than one ResourceClaim now (admin access and shared capacity aside): another scheduler wrote its allocation after this one's",
        )?;
        let first_writer_conflicts = prometheus::IntCounter::new(
            "first_writer_conflicts_total",
            "Claim allocations written by this scheduler and undone because another scheduler had allocated one of their devices first",
        )?;
        registry.register(Box::new(doubled_devices.clone()))?;
        let first_writer_wait = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "first_writer_wait_duration_seconds",
                "Time a binding waited, after its claim allocations were written, until the claim informer showed them (the first-writer check then runs)",
            )
            .buckets(buckets::api_write()),
        )?;
        registry.register(Box::new(first_writer_conflicts.clone()))?;
        registry.register(Box::new(first_writer_wait.clone()))?;
        registry.register(Box::new(handoff_waits.clone()))?;
        registry.register(Box::new(handoff_waiting.clone()))?;
        registry.register(Box::new(degraded_pods.clone()))?;
        registry.register(Box::new(upgrade_evictions.clone()))?;
        registry.register(Box::new(dra_telemetry::build_info(
            "build_info",
            env!("CARGO_PKG_VERSION"),
        )?))?;
        registry.register(Box::new(pod_scheduling.clone()))?;
        registry.register(Box::new(search_steps.clone()))?;
        registry.register(Box::new(api_writes.clone()))?;
        registry.register(Box::new(api_errors.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        registry.register(Box::new(allocation_latency.clone()))?;
        registry.register(Box::new(attempts.clone()))?;
        registry.register(Box::new(bind_latency.clone()))?;
        registry.register(Box::new(pending.clone()))?;
        unschedulable.with_label_values(&["none"]).set(0);
        registry.register(Box::new(unschedulable.clone()))?;
        registry.register(Box::new(devices.clone()))?;
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
            unschedulable,
            devices,
            in_flight,
            pod_scheduling,
            search_steps,
            api_writes,
            api_errors,
            leader,
            preemptions,
            handoff_waits,
            handoff_waiting,
            degraded_pods,
            upgrade_evictions,
            doubled_devices,
            first_writer_conflicts,
            first_writer_wait,
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

    /// The unschedulable pods by plugin; plugins that no longer reject any pod read 0.
    pub fn set_unschedulable(&self, by_plugin: &std::collections::BTreeMap<&'static str, i64>) {
        use prometheus::core::Collector;
        for metric in self.unschedulable.collect() {
            for m in metric.get_metric() {
                let plugin = m.get_label().first().map(|l| l.value()).unwrap_or("");
                if !by_plugin.contains_key(plugin) {
                    self.unschedulable.with_label_values(&[plugin]).set(0);
                }
            }
        }
        for (plugin, n) in by_plugin {
            self.unschedulable.with_label_values(&[plugin]).set(*n);
        }
    }

    /// Device counts per (node, class, state), replacing the last ones.
    pub fn set_devices(
        &self,
        counts: &std::collections::BTreeMap<(String, String, &'static str), usize>,
    ) {
        self.devices.reset();
        for ((node, class, state), n) in counts {
            self.devices
                .with_label_values(&[node.as_str(), class.as_str(), state])
                .set(*n as i64);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_scheduling_buckets_are_kube_schedulers_sli_buckets_and_reach_a_day() {
        let bounds = buckets::pod_scheduling();
        // kube-scheduler: metrics.ExponentialBuckets(0.01, 2, 20).
        let kube: Vec<f64> = (0..20).map(|i| 0.01 * f64::powi(2.0, i)).collect();
        assert_eq!(bounds[..20], kube[..]);
        assert!(
            *bounds.last().unwrap() > 20.0 * 3600.0,
            "a GPU queue wait of hours lands in a bucket: {bounds:?}"
        );
    }

    #[test]
    fn every_histogram_reaches_past_what_it_measures() {
        let top = |b: Vec<f64>| *b.last().unwrap();
        let filter_timeout = dra_engine::DEFAULT_FILTER_TIMEOUT.as_secs_f64();
        // An attempt whose first try ran out is both tries: up to twice the budget.
        assert!(top(buckets::cycle()) > 2.0 * filter_timeout);
        assert!(
            buckets::cycle()[0] <= 0.0001,
            "a warm one-GPU search is about 0.5 ms"
        );
        assert!(
            top(buckets::api_write()) > 60.0,
            "the API server's request timeout"
        );
        assert!(top(buckets::binding()) > top(buckets::api_write()));
        assert!(top(buckets::search_steps()) >= 1e7);
    }

    #[test]
    fn build_info_names_the_version_commit_and_compiler() {
        let text = Metrics::new().unwrap().render();
        let want = format!(
            "dra_scheduler_build_info{{git_commit=\"{}\",rustc_version=\"{}\",version=\"{}\"}} 1\n",
            dra_telemetry::GIT_COMMIT,
            dra_telemetry::RUSTC_VERSION,
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&want), "{text}");
        assert!(dra_telemetry::RUSTC_VERSION.starts_with("rustc 1."));
        let top = format!("le=\"{}\"", buckets::pod_scheduling().last().unwrap());
        assert!(
            text.lines().any(|l| l
                .starts_with("dra_scheduler_pod_scheduling_duration_seconds_bucket")
                && l.contains(&top)),
            "{text}"
        );
    }
}
