//! The kubelet plugin: the registration service on `<registry-dir>/<driver>-reg.sock`, and
//! `v1.DRAPlugin`, `v1beta1.DRAPlugin` and `v1.DRAResourceHealth` on
//! `<plugin-dir>/dra.sock`. Thin: requests are handed to the [`Preparer`].

use crate::claim::{ClaimRef, PreparedDevice};
use crate::prepare::Preparer;
use crate::proto::dra_health_v1 as health_pb;
use crate::proto::dra_v1 as v1;
use crate::proto::dra_v1beta1 as v1beta1;
use crate::proto::pluginregistration as reg;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

/// Service names kubelet may use, as announced in `GetInfo`.
pub const SUPPORTED_VERSIONS: &[&str] = &["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// Where the plugin listens.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    pub driver: String,
    pub plugin_dir: PathBuf,
    pub registry_dir: PathBuf,
}

impl PluginConfig {
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir.join("dra.sock")
    }
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(format!("{}-reg.sock", self.driver))
    }
}

/// The health of one published device, for kubelet's health stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealthStatus {
    pub pool: String,
    pub device: String,
    pub healthy: bool,
    pub message: String,
}

/// What kubelet told us in `NotifyRegistrationStatus`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistrationState {
    pub registered: Option<bool>,
    pub error: String,
}

struct Registration {
    driver: String,
    endpoint: String,
    state: Arc<Mutex<RegistrationState>>,
}

#[tonic::async_trait]
impl reg::registration_server::Registration for Registration {
    async fn get_info(
        &self,
        _: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(reg::PluginInfo {
            r#type: "DRAPlugin".into(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let r = req.into_inner();
        if r.plugin_registered {
            tracing::info!(driver = %self.driver, "registered with kubelet");
        } else {
            tracing::error!(driver = %self.driver, error = %r.error, "kubelet rejected the registration");
        }
        *self.state.lock().unwrap() = RegistrationState {
            registered: Some(r.plugin_registered),
            error: r.error,
        };
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

#[derive(Clone)]
struct Dra {
    preparer: Arc<Preparer>,
}

fn claim_refs<'a>(claims: impl Iterator<Item = (&'a str, &'a str, &'a str)>) -> Vec<ClaimRef> {
    claims
        .map(|(namespace, uid, name)| ClaimRef {
            namespace: namespace.into(),
            uid: uid.into(),
            name: name.into(),
        })
        .collect()
}

fn v1_device(d: PreparedDevice) -> v1::Device {
    v1::Device {
        request_names: d.request_names,
        pool_name: d.pool_name,
        device_name: d.device_name,
        cdi_device_ids: d.cdi_device_ids,
        share_id: d.share_id,
    }
}

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for Dra {
    async fn node_prepare_resources(
        &self,
        req: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let req = req.into_inner();
        let refs = claim_refs(
            req.claims
                .iter()
                .map(|c| (c.namespace.as_str(), c.uid.as_str(), c.name.as_str())),
        );
        let out = self.preparer.prepare(&refs).await;
        Ok(Response::new(v1::NodePrepareResourcesResponse {
            claims: out
                .into_iter()
                .map(|(uid, r)| {
                    let resp = match r {
                        Ok(devices) => v1::NodePrepareResourceResponse {
                            devices: devices.into_iter().map(v1_device).collect(),
                            error: String::new(),
                        },
                        Err(error) => v1::NodePrepareResourceResponse {
                            devices: vec![],
                            error,
                        },
                    };
                    (uid, resp)
                })
                .collect(),
        }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let req = req.into_inner();
        let refs = claim_refs(
            req.claims
                .iter()
                .map(|c| (c.namespace.as_str(), c.uid.as_str(), c.name.as_str())),
        );
        let out = self.preparer.unprepare(&refs).await;
        Ok(Response::new(v1::NodeUnprepareResourcesResponse {
            claims: out
                .into_iter()
                .map(|(uid, r)| {
                    (
                        uid,
                        v1::NodeUnprepareResourceResponse {
                            error: r.err().unwrap_or_default(),
                        },
                    )
                })
                .collect(),
        }))
    }
}

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for Dra {
    async fn node_prepare_resources(
        &self,
        req: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let req = req.into_inner();
        let refs = claim_refs(
            req.claims
                .iter()
                .map(|c| (c.namespace.as_str(), c.uid.as_str(), c.name.as_str())),
        );
        let out = self.preparer.prepare(&refs).await;
        Ok(Response::new(v1beta1::NodePrepareResourcesResponse {
            claims: out
                .into_iter()
                .map(|(uid, r)| {
                    let resp = match r {
                        Ok(devices) => v1beta1::NodePrepareResourceResponse {
                            devices: devices
                                .into_iter()
                                .map(|d| v1beta1::Device {
                                    request_names: d.request_names,
                                    pool_name: d.pool_name,
                                    device_name: d.device_name,
                                    cdi_device_ids: d.cdi_device_ids,
                                })
                                .collect(),
                            error: String::new(),
                        },
                        Err(error) => v1beta1::NodePrepareResourceResponse {
                            devices: vec![],
                            error,
                        },
                    };
                    (uid, resp)
                })
                .collect(),
        }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let req = req.into_inner();
        let refs = claim_refs(
            req.claims
                .iter()
                .map(|c| (c.namespace.as_str(), c.uid.as_str(), c.name.as_str())),
        );
        let out = self.preparer.unprepare(&refs).await;
        Ok(Response::new(v1beta1::NodeUnprepareResourcesResponse {
            claims: out
                .into_iter()
                .map(|(uid, r)| {
                    (
                        uid,
                        v1beta1::NodeUnprepareResourceResponse {
                            error: r.err().unwrap_or_default(),
                        },
                    )
                })
                .collect(),
        }))
    }
}

struct HealthService {
    rx: watch::Receiver<Vec<DeviceHealthStatus>>,
}

type HealthStream = Pin<
    Box<dyn futures::Stream<Item = Result<health_pb::NodeWatchResourcesResponse, Status>> + Send>,
>;

fn health_response(devices: &[DeviceHealthStatus]) -> health_pb::NodeWatchResourcesResponse {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    health_pb::NodeWatchResourcesResponse {
        devices: devices
            .iter()
            .map(|d| health_pb::DeviceHealth {
                device: Some(health_pb::DeviceIdentifier {
                    pool_name: d.pool.clone(),
                    device_name: d.device.clone(),
                }),
                health: if d.healthy {
                    health_pb::HealthStatus::Healthy as i32
                } else {
                    health_pb::HealthStatus::Unhealthy as i32
                },
                last_updated_time: now,
                health_check_timeout_seconds: 0,
                message: d.message.clone(),
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl health_pb::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _: Request<health_pb::NodeWatchResourcesRequest>,
    ) -> Result<Response<HealthStream>, Status> {
        let rx = self.rx.clone();
        let stream = futures::stream::unfold((rx, true), |(mut rx, first)| async move {
            if !first && rx.changed().await.is_err() {
                return None;
            }
            let resp = health_response(&rx.borrow_and_update());
            Some((Ok(resp), (rx, false)))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(anyhow::anyhow!(
                "removing stale socket {}: {e}",
                path.display()
            ));
        }
        _ => {}
    }
    UnixListener::bind(path).map_err(|e| anyhow::anyhow!("listening on {}: {e}", path.display()))
}

/// A running plugin; [`PluginHandle::stop`] ends it and removes its sockets.
pub struct PluginHandle {
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>>,
    sockets: Vec<PathBuf>,
    pub registration: Arc<Mutex<RegistrationState>>,
}

impl PluginHandle {
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        // Graceful shutdown waits for open connections, and kubelet keeps its connection
        // open: give in-flight calls a moment, then close.
        for mut t in self.tasks {
            if tokio::time::timeout(std::time::Duration::from_secs(2), &mut t)
                .await
                .is_err()
            {
                t.abort();
            }
        }
        for s in &self.sockets {
            let _ = std::fs::remove_file(s);
        }
    }
}

/// Starts serving: the DRA socket first, then the registration socket (kubelet's plugin
/// watcher connects to the DRA service as soon as it sees the registration socket).
pub async fn start(
    cfg: &PluginConfig,
    preparer: Arc<Preparer>,
    health: watch::Receiver<Vec<DeviceHealthStatus>>,
) -> anyhow::Result<PluginHandle> {
    let (stop, stop_rx) = watch::channel(false);
    let until_stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let dra = Dra { preparer };
    let dra_path = cfg.dra_socket();
    let dra_listener = bind(&dra_path)?;
    let dra_task = tokio::spawn(
        Server::builder()
            .add_service(v1::dra_plugin_server::DraPluginServer::new(dra.clone()))
            .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(dra))
            .add_service(
                health_pb::dra_resource_health_server::DraResourceHealthServer::new(
                    HealthService { rx: health },
                ),
            )
            .serve_with_incoming_shutdown(
                UnixListenerStream::new(dra_listener),
                until_stopped(stop_rx.clone()),
            ),
    );
    let registration = Arc::new(Mutex::new(RegistrationState::default()));
    let reg_path = cfg.registration_socket();
    let reg_listener = bind(&reg_path)?;
    let reg_task = tokio::spawn(
        Server::builder()
            .add_service(reg::registration_server::RegistrationServer::new(
                Registration {
                    driver: cfg.driver.clone(),
                    endpoint: dra_path.display().to_string(),
                    state: registration.clone(),
                },
            ))
            .serve_with_incoming_shutdown(
                UnixListenerStream::new(reg_listener),
                until_stopped(stop_rx),
            ),
    );
    tracing::info!(dra = %dra_path.display(), registration = %reg_path.display(), "kubelet plugin serving");
    Ok(PluginHandle {
        stop,
        tasks: vec![dra_task, reg_task],
        sockets: vec![dra_path, reg_path],
        registration,
    })
}

/// A gRPC channel over a Unix socket (what kubelet does; used by tests and dry runs).
pub async fn connect_unix(path: impl Into<PathBuf>) -> anyhow::Result<Channel> {
    let path: PathBuf = path.into();
    let channel = Endpoint::try_from("http://[::]:50051")?
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await?;
    Ok(channel)
}
