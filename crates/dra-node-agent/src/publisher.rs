//! Publishes the node's pool and keeps it true: discovery and health feed
//! [`crate::slices`], and the result is compared with what the API server holds. Any
//! difference (a GPU appeared or vanished, a taint changed, someone edited or deleted a
//! slice, the Node was recreated) rewrites the whole pool at the next generation.

use crate::backend::GpuBackend;
use crate::device::Gpu;
use crate::health::{HealthEvent, HealthState};
use crate::metrics::{Health, Metrics};
use crate::plugin::DeviceHealthStatus;
use crate::slices::SliceContent;
use crate::slices::{NodeRef, build_slices, pool_contents};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

/// Settings of a publisher.
#[derive(Debug, Clone)]
pub struct PublisherConfig {
    pub driver: String,
    pub node_name: String,
    /// How often discovery runs again (GPUs appearing or vanishing).
    pub rediscover_every: Duration,
}

/// What one reconcile pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncOutcome {
    /// The API server already had the desired pool.
    InSync { generation: i64 },
    /// The pool was rewritten at `generation`.
    Written {
        generation: i64,
        created: usize,
        updated: usize,
        deleted: usize,
    },
}

/// Reconciles the node's ResourceSlices. Owns the health state; shares the inventory with
/// the preparer.
pub struct Publisher {
    client: Client,
    cfg: PublisherConfig,
    backend: Arc<dyn GpuBackend>,
    inventory: Arc<RwLock<Vec<Gpu>>>,
    health: HealthState,
    metrics: Option<Arc<Metrics>>,
    health_flag: Option<Arc<Health>>,
    device_health: Option<tokio::sync::watch::Sender<Vec<DeviceHealthStatus>>>,
    /// Per slice name: (spec we wanted, spec the server returned after our write). When the
    /// server still holds exactly what it returned, the slice is in sync even if the server
    /// normalised something we sent; this keeps a normalisation from causing a write loop.
    written: HashMap<String, (serde_json::Value, serde_json::Value)>,
    /// The newest generation this publisher wrote: if every slice was deleted, the pool
    /// comes back newer than it was, never at a reused generation.
    last_generation: i64,
}

/// The health of every published device: a device is unhealthy while its GPU has taints.
pub fn device_health(
    pool: &str,
    contents: &[SliceContent],
    health: &HealthState,
    gpus: &[Gpu],
) -> Vec<DeviceHealthStatus> {
    let mut out = Vec::new();
    for c in contents {
        let SliceContent::Devices(devices) = c else {
            continue;
        };
        for d in devices {
            let minor = gpus
                .iter()
                .find(|g| {
                    d.name == g.device_name()
                        || d.name.starts_with(&format!("{}-mig-", g.device_name()))
                })
                .map(|g| g.minor);
            let taints = minor.map(|m| health.taints_for(m)).unwrap_or_default();
            out.push(DeviceHealthStatus {
                pool: pool.to_string(),
                device: d.name.clone(),
                healthy: taints.is_empty(),
                message: taints
                    .iter()
                    .map(|t| match &t.value {
                        Some(v) => format!("{}={v}:{}", t.key, t.effect),
                        None => format!("{}:{}", t.key, t.effect),
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    out
}

fn spec_json(s: &ResourceSlice) -> serde_json::Value {
    serde_json::to_value(&s.spec).expect("spec serialises")
}

impl Publisher {
    pub fn new(
        client: Client,
        cfg: PublisherConfig,
        backend: Arc<dyn GpuBackend>,
        inventory: Arc<RwLock<Vec<Gpu>>>,
        health: HealthState,
    ) -> Publisher {
        Publisher {
            client,
            cfg,
            backend,
            inventory,
            health,
            metrics: None,
            health_flag: None,
            device_health: None,
            written: HashMap::new(),
            last_generation: 0,
        }
    }

    pub fn with_metrics(mut self, metrics: Arc<Metrics>, health: Arc<Health>) -> Publisher {
        self.metrics = Some(metrics);
        self.health_flag = Some(health);
        self
    }

    /// Feeds kubelet's health stream (`v1.DRAResourceHealth`) after every pass.
    pub fn with_device_health(
        mut self,
        tx: tokio::sync::watch::Sender<Vec<DeviceHealthStatus>>,
    ) -> Publisher {
        self.device_health = Some(tx);
        self
    }

    /// Applies a health event; returns whether the slices need rewriting.
    pub fn apply_health(&mut self, event: &HealthEvent) -> bool {
        let now = k8s_openapi::jiff::Timestamp::now()
            .round(k8s_openapi::jiff::Unit::Second)
            .expect("rounding to seconds")
            .to_string();
        let changed = self.health.apply(event, &now);
        if let Some(m) = &self.metrics {
            m.unhealthy_gpus.set(self.health.unhealthy().count() as i64);
        }
        changed
    }

    fn slices_api(&self) -> Api<ResourceSlice> {
        Api::all(self.client.clone())
    }

    /// The slices of this node's pool on the API server, sorted by name.
    pub async fn current_slices(&self) -> kube::Result<Vec<ResourceSlice>> {
        let lp = ListParams::default().fields(&format!(
            "spec.nodeName={},spec.driver={}",
            self.cfg.node_name, self.cfg.driver
        ));
        let mut items: Vec<ResourceSlice> = self
            .slices_api()
            .list(&lp)
            .await?
            .items
            .into_iter()
            .filter(|s| s.spec.pool.name == self.cfg.node_name)
            .collect();
        items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(items)
    }

    /// Discovers GPUs and updates the shared inventory.
    pub async fn discover(&self) -> anyhow::Result<Vec<Gpu>> {
        let backend = self.backend.clone();
        let gpus = tokio::task::spawn_blocking(move || backend.discover()).await??;
        *self.inventory.write().unwrap() = gpus.clone();
        Ok(gpus)
    }

    /// One reconcile pass: discover, compare, write what differs.
    pub async fn sync_once(&mut self) -> anyhow::Result<SyncOutcome> {
        let node = Api::<Node>::all(self.client.clone())
            .get(&self.cfg.node_name)
            .await
            .map_err(|e| anyhow::anyhow!("reading Node {}: {e}", self.cfg.node_name))?;
        let node = NodeRef {
            name: self.cfg.node_name.clone(),
            uid: node.metadata.uid.unwrap_or_default(),
        };
        let gpus = self.discover().await?;
        let contents = pool_contents(&gpus, &self.health);
        let existing = self.current_slices().await?;
        let generation = existing
            .iter()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(0)
            .max(self.last_generation);

        let device_count: usize = contents
            .iter()
            .map(|c| match c {
                crate::slices::SliceContent::Devices(d) => d.len(),
                crate::slices::SliceContent::Counters(_) => 0,
            })
            .sum();
        if let Some(m) = &self.metrics {
            m.published_devices.set(device_count as i64);
        }

        if let Some(tx) = &self.device_health {
            let status = device_health(&self.cfg.node_name, &contents, &self.health, &gpus);
            tx.send_if_modified(|old| {
                let changed = *old != status;
                *old = status;
                changed
            });
        }

        let desired = build_slices(&node, &self.cfg.driver, &contents, generation);
        let by_name: HashMap<&str, &ResourceSlice> = existing
            .iter()
            .filter_map(|s| s.metadata.name.as_deref().map(|n| (n, s)))
            .collect();
        let in_sync = existing.len() == desired.len()
            && existing
                .iter()
                .all(|s| s.spec.pool.generation == generation)
            && desired.iter().all(|d| {
                let name = d.metadata.name.as_deref().unwrap_or_default();
                let Some(have) = by_name.get(name) else {
                    return false;
                };
                let (want, got) = (spec_json(d), spec_json(have));
                let same = want == got
                    || self
                        .written
                        .get(name)
                        .is_some_and(|(w, g)| *w == want && *g == got);
                same && have.metadata.owner_references == d.metadata.owner_references
            });
        if in_sync {
            self.mark_published(generation);
            return Ok(SyncOutcome::InSync { generation });
        }

        let generation = generation + 1;
        let desired = build_slices(&node, &self.cfg.driver, &contents, generation);
        let api = self.slices_api();
        let (mut created, mut updated, mut deleted) = (0, 0, 0);
        for d in &desired {
            let name = d.metadata.name.clone().expect("named");
            let written = match by_name.get(name.as_str()) {
                Some(have) => {
                    let mut d = d.clone();
                    d.metadata.resource_version = have.metadata.resource_version.clone();
                    updated += 1;
                    self.count_write("update");
                    api.replace(&name, &PostParams::default(), &d).await
                }
                None => {
                    created += 1;
                    self.count_write("create");
                    api.create(&PostParams::default(), d).await
                }
            }
            .map_err(|e| anyhow::anyhow!("writing ResourceSlice {name}: {e}"))?;
            self.written
                .insert(name, (spec_json(d), spec_json(&written)));
        }
        for s in &existing {
            let name = s.metadata.name.clone().unwrap_or_default();
            if !desired
                .iter()
                .any(|d| d.metadata.name.as_deref() == Some(&name))
            {
                deleted += 1;
                self.count_write("delete");
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(anyhow::anyhow!("deleting ResourceSlice {name}: {e}")),
                }
                self.written.remove(&name);
            }
        }
        self.mark_published(generation);
        tracing::info!(
            node = %self.cfg.node_name, generation, created, updated, deleted,
            devices = device_count, "published ResourceSlices"
        );
        Ok(SyncOutcome::Written {
            generation,
            created,
            updated,
            deleted,
        })
    }

    fn count_write(&self, op: &str) {
        if let Some(m) = &self.metrics {
            m.slice_writes.with_label_values(&[op]).inc();
        }
    }

    fn mark_published(&mut self, generation: i64) {
        self.last_generation = generation;
        if let Some(m) = &self.metrics {
            m.pool_generation.set(generation);
        }
        if let Some(h) = &self.health_flag {
            h.slices_published.store(true, Ordering::Relaxed);
        }
    }

    /// Runs until `shutdown` resolves: reconciles on slice changes (watch), health events,
    /// and every `rediscover_every`; failed passes are retried with backoff.
    pub async fn run(
        mut self,
        mut health_events: UnboundedReceiver<HealthEvent>,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let fields = format!(
            "spec.nodeName={},spec.driver={}",
            self.cfg.node_name, self.cfg.driver
        );
        let mut slice_events = watcher(
            self.slices_api(),
            watcher::Config::default().fields(&fields),
        )
        .boxed();
        let mut tick = tokio::time::interval(self.cfg.rediscover_every);
        let mut backoff = Duration::from_millis(200);
        let mut dirty = true;
        loop {
            if dirty {
                match self.sync_once().await {
                    Ok(outcome) => {
                        tracing::debug!(?outcome, "ResourceSlices reconciled");
                        dirty = false;
                        backoff = Duration::from_millis(200);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in = ?backoff, "publishing ResourceSlices failed");
                        tokio::select! {
                            _ = &mut shutdown => return,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(30));
                        continue;
                    }
                }
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tick.tick() => dirty = true,
                ev = health_events.recv() => {
                    if let Some(ev) = ev {
                        tracing::warn!(event = ?ev, "GPU health event");
                        dirty |= self.apply_health(&ev);
                    }
                }
                ev = slice_events.next() => {
                    // Our own writes come back here too; the pass that follows finds the
                    // pool in sync and writes nothing.
                    match ev {
                        Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone)) => dirty = true,
                        Some(Err(e)) => tracing::debug!(error = %e, "watching ResourceSlices failed; re-watching"),
                        _ => {}
                    }
                }
            }
        }
    }
}
