//! The binding tasks: each makes one decision real (one pod, or a PodGroup's members at
//! once, [`super::binder`]) on a task of its own and reports every pod's result.
//!
//! At most `maxConcurrentBinds` tasks write at once, each holding a [`Turn`]. A task gives
//! its turn up while it waits for the claim informer to show its own allocation (the
//! first-writer check, [`super::owners`]): that wait writes nothing, and in a burst it is a
//! few percent of a binding (benches/e2e's template burst: 16 ms of 250), which would
//! otherwise be taken from the throughput. So that a task coming back from its wait does
//! not queue behind a burst's thousands of new tasks, at most twice as many tasks as there
//! are turns are admitted at once; the others wait to be admitted. Shutdown waits for every
//! task to end ([`Bindings::settled`]), whether it holds a turn or not.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dra_engine::Placement;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Client;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

use super::binder::{self, BindFailure};
use super::metrics::Metrics;
use super::owners::DeviceOwners;

/// What a binding task reports for each pod: its placement, what the caller gave with it,
/// and the result (the claims as the API server stored them, or why it failed).
pub type Report<T> = (Placement, T, Result<Vec<ResourceClaim>, BindFailure>);

/// The daemon's binding tasks.
#[derive(Clone)]
pub struct Bindings {
    client: Client,
    metrics: Arc<Metrics>,
    owners: Arc<DeviceOwners>,
    turns: Arc<Semaphore>,
    /// Tasks admitted to take turns: twice the turns.
    admitted: Arc<Semaphore>,
    /// Tasks that have not ended.
    alive: Arc<watch::Sender<usize>>,
}

/// A task's right to write, given up and taken back around a wait.
pub struct Turn {
    turns: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Turn {
    async fn take(turns: Arc<Semaphore>) -> Turn {
        let permit = turns.clone().acquire_owned().await.ok();
        Turn { turns, permit }
    }

    /// Await `wait` without holding the turn; the turn is taken back before it returns.
    pub async fn away<F: std::future::Future>(&mut self, wait: F) -> F::Output {
        self.permit = None;
        let out = wait.await;
        self.permit = self.turns.clone().acquire_owned().await.ok();
        out
    }
}

/// One task alive, counted until it is dropped.
struct Alive(Arc<watch::Sender<usize>>);

impl Alive {
    fn new(count: &Arc<watch::Sender<usize>>) -> Alive {
        count.send_modify(|n| *n += 1);
        Alive(count.clone())
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl Bindings {
    pub fn new(
        client: Client,
        metrics: Arc<Metrics>,
        owners: Arc<DeviceOwners>,
        max_concurrent: usize,
    ) -> Bindings {
        Bindings {
            client,
            metrics,
            owners,
            turns: Arc::new(Semaphore::new(max_concurrent.max(1))),
            admitted: Arc::new(Semaphore::new(2 * max_concurrent.max(1))),
            alive: Arc::new(watch::Sender::new(0)),
        }
    }

    /// Write `work` on a task of its own: one pod, or (`group`) a PodGroup's members all or
    /// nothing; each pod's result goes to `done` with what came with its placement.
    pub fn spawn<T: Send + 'static>(
        &self,
        work: Vec<(Placement, T)>,
        group: bool,
        done: mpsc::UnboundedSender<Report<T>>,
    ) {
        let this = self.clone();
        let alive = Alive::new(&self.alive);
        tokio::spawn(async move {
            let _alive = alive;
            let _admitted = this.admitted.clone().acquire_owned().await;
            let mut turn = Turn::take(this.turns.clone()).await;
            let started = Instant::now();
            let (placements, with): (Vec<Placement>, Vec<T>) = work.into_iter().unzip();
            // Boxed, so that a binding waiting for its turn holds only its placements: in a
            // burst thousands wait, and the binding's own state is about 6.7 KB.
            let results = if group {
                Box::pin(binder::bind_group(
                    &this.client,
                    &this.metrics,
                    &this.owners,
                    &mut turn,
                    &placements,
                ))
                .await
            } else {
                let placement = placements.first().expect("one placement");
                vec![
                    Box::pin(binder::bind(
                        &this.client,
                        &this.metrics,
                        &this.owners,
                        &mut turn,
                        placement,
                    ))
                    .await,
                ]
            };
            for ((placement, with), result) in placements.into_iter().zip(with).zip(results) {
                this.metrics
                    .bind_latency
                    .with_label_values(&[if result.is_ok() { "ok" } else { "error" }])
                    .observe(started.elapsed().as_secs_f64());
                let _ = done.send((placement, with, result));
            }
        });
    }

    /// Wait (at most `timeout`) until every binding task has ended; whether they all did.
    pub async fn settled(&self, timeout: Duration) -> bool {
        let mut alive = self.alive.subscribe();
        tokio::time::timeout(timeout, alive.wait_for(|n| *n == 0))
            .await
            .is_ok()
    }
}
