//! The kubelet plugin: the registration service on `<registry-dir>/<driver>-reg.sock`, and
//! `v1.DRAPlugin`, `v1beta1.DRAPlugin` and `v1.DRAResourceHealth` on
//! `<plugin-dir>/dra.sock`. Thin: requests are handed to the [`Preparer`].
//!
//! The DRA socket is served by tonic. The registration socket is not: kubelet dials it by
//! bare path and so sends the path as `:authority`, which tonic's h2 rejects; it is served
//! by the small HTTP/2 server of [`registration_server`].

use crate::claim::{ClaimRef, PreparedDevice};
use crate::prepare::Preparer;
use crate::proto::dra_health_v1 as health_pb;
use crate::proto::dra_v1 as v1;
use crate::proto::dra_v1beta1 as v1beta1;
use crate::proto::pluginregistration as reg;
use crate::registration_server::{self, GrpcError, Handler, code as grpc_code};
use prost::Message;
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

/// gRPC method paths of `pluginregistration.Registration`.
pub const GET_INFO_PATH: &str = "/pluginregistration.Registration/GetInfo";
pub const NOTIFY_REGISTRATION_STATUS_PATH: &str =
    "/pluginregistration.Registration/NotifyRegistrationStatus";

impl Registration {
    fn get_info(&self) -> reg::PluginInfo {
        reg::PluginInfo {
            r#type: "DRAPlugin".into(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn notify_registration_status(&self, r: reg::RegistrationStatus) {
        if r.plugin_registered {
            tracing::info!(driver = %self.driver, "registered with kubelet");
        } else {
            tracing::error!(driver = %self.driver, error = %r.error, "kubelet rejected the registration");
        }
        *self.state.lock().unwrap() = RegistrationState {
            registered: Some(r.plugin_registered),
            error: r.error,
        };
    }

    /// One unary call, for the [`registration_server`].
    fn call(&self, path: &str, request: &[u8]) -> Result<Vec<u8>, GrpcError> {
        fn decode<M: prost::Message + Default>(request: &[u8]) -> Result<M, GrpcError> {
            M::decode(request)
                .map_err(|e| GrpcError::new(grpc_code::INTERNAL, format!("decoding request: {e}")))
        }
        match path {
            GET_INFO_PATH => {
                let _: reg::InfoRequest = decode(request)?;
                Ok(self.get_info().encode_to_vec())
            }
            NOTIFY_REGISTRATION_STATUS_PATH => {
                self.notify_registration_status(decode(request)?);
                Ok(reg::RegistrationStatusResponse {}.encode_to_vec())
            }
            _ => Err(GrpcError::new(
                grpc_code::UNIMPLEMENTED,
                format!("unknown method {path}"),
            )),
        }
    }

    fn into_handler(self) -> Handler {
        Arc::new(move |path: &str, request: &[u8]| self.call(path, request))
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
    tasks: Vec<tokio::task::JoinHandle<()>>,
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
    let dra_server = Server::builder()
        .add_service(v1::dra_plugin_server::DraPluginServer::new(dra.clone()))
        .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(dra))
        .add_service(
            health_pb::dra_resource_health_server::DraResourceHealthServer::new(HealthService {
                rx: health,
            }),
        )
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(dra_listener),
            until_stopped(stop_rx.clone()),
        );
    let dra_task = tokio::spawn(async move {
        if let Err(e) = dra_server.await {
            tracing::error!(error = %e, "DRA plugin service failed");
        }
    });
    let registration = Arc::new(Mutex::new(RegistrationState::default()));
    let reg_path = cfg.registration_socket();
    let reg_listener = bind(&reg_path)?;
    // Not tonic: kubelet sends the socket path as :authority, which h2 refuses.
    let handler = Registration {
        driver: cfg.driver.clone(),
        endpoint: dra_path.display().to_string(),
        state: registration.clone(),
    }
    .into_handler();
    let reg_task = tokio::spawn(registration_server::serve(
        reg_listener,
        handler,
        until_stopped(stop_rx),
    ));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registration_server::testing::*;

    /// Serves the registration service on `<dir>/gpu.nvidia.com-reg.sock`.
    fn serve_registration(
        dir: &Path,
    ) -> (PathBuf, Arc<Mutex<RegistrationState>>, watch::Sender<bool>) {
        let path = dir.join("gpu.nvidia.com-reg.sock");
        let state = Arc::new(Mutex::new(RegistrationState::default()));
        let handler = Registration {
            driver: "gpu.nvidia.com".into(),
            endpoint: "/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock".into(),
            state: state.clone(),
        }
        .into_handler();
        let (stop, mut stop_rx) = watch::channel(false);
        let listener = bind(&path).unwrap();
        tokio::spawn(registration_server::serve(listener, handler, async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        }));
        (path, state, stop)
    }

    #[tokio::test]
    async fn tonic_client_gets_info_and_notifies() {
        let dir = tempfile::tempdir().unwrap();
        let (path, state, stop) = serve_registration(dir.path());
        let mut client =
            reg::registration_client::RegistrationClient::new(connect_unix(&path).await.unwrap());
        let info = client
            .get_info(reg::InfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(info.name, "gpu.nvidia.com");
        assert_eq!(
            info.endpoint,
            "/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock"
        );
        assert_eq!(info.supported_versions, SUPPORTED_VERSIONS);
        client
            .notify_registration_status(reg::RegistrationStatus {
                plugin_registered: false,
                error: "no such version".into(),
            })
            .await
            .unwrap();
        assert_eq!(
            *state.lock().unwrap(),
            RegistrationState {
                registered: Some(false),
                error: "no such version".into()
            }
        );
        client
            .notify_registration_status(reg::RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            })
            .await
            .unwrap();
        assert_eq!(state.lock().unwrap().registered, Some(true));
        // The generated client for a method the server lacks gets UNIMPLEMENTED.
        let mut other =
            v1::dra_plugin_client::DraPluginClient::new(connect_unix(&path).await.unwrap());
        let err = other
            .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![] })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unimplemented);
        let _ = stop.send(true);
    }

    /// What kubelet 1.37's plugin watcher sends: grpc-go dialing the bare socket path puts
    /// that path in `:authority` (h2, and so tonic, resets such streams).
    #[tokio::test]
    async fn kubelet_dial_with_the_socket_path_as_authority() {
        let dir = tempfile::tempdir().unwrap();
        let (path, state, stop) = serve_registration(dir.path());
        let authority = path.display().to_string();
        let io = tokio::net::UnixStream::connect(&path).await.unwrap();
        let mut c = Client::start(io).await;

        // Plain literals, as in the bug report.
        let block = literal_block(
            &[
                (":method", "POST"),
                (":scheme", "http"),
                (":path", GET_INFO_PATH),
                (":authority", &authority),
                ("content-type", "application/grpc"),
                ("user-agent", "grpc-go/1.72.0"),
                ("te", "trailers"),
                ("grpc-timeout", "1S"),
            ],
            false,
        );
        let reply = c.call(1, &block, &grpc_frame(&[])).await;
        assert_eq!(reply.header(":status"), Some("200"));
        assert_eq!(reply.header("grpc-status"), Some("0"));
        let info = reg::PluginInfo::decode(reply.message()).unwrap();
        assert_eq!(info.name, "gpu.nvidia.com");
        assert_eq!(info.supported_versions, SUPPORTED_VERSIONS);

        // As grpc-go's HPACK encoder does: indexed static fields, Huffman strings, and
        // literals added to the dynamic table, reused by index on the next call.
        let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
        block.push(0x44); // :path, literal with indexing, name index 4
        string(&mut block, NOTIFY_REGISTRATION_STATUS_PATH.as_bytes(), true);
        block.push(0x41); // :authority, name index 1
        string(&mut block, authority.as_bytes(), true);
        block.push(0x40 | 31); // content-type, name index 31
        string(&mut block, b"application/grpc", true);
        indexed_literal(&mut block, "te", "trailers", true);
        let msg = reg::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        }
        .encode_to_vec();
        let reply = c.call(3, &block, &grpc_frame(&msg)).await;
        assert_eq!(reply.header("grpc-status"), Some("0"));
        assert!(
            reg::RegistrationStatusResponse::decode(reply.message()).is_ok(),
            "{reply:?}"
        );
        assert_eq!(state.lock().unwrap().registered, Some(true));

        // Dynamic table now (newest first): te, content-type, :authority, :path.
        // :authority and content-type by index; a new :path, Huffman-coded, not indexed.
        let mut block = vec![0x83, 0x86, 0x80 | 64, 0x80 | 63, 0x80 | 62];
        block.push(0x04);
        string(&mut block, b"/pluginregistration.Registration/Nope", true);
        let reply = c.call(5, &block, &grpc_frame(&[])).await;
        assert_eq!(reply.headers.len(), 1, "trailers only: {reply:?}");
        assert_eq!(reply.header("grpc-status"), Some("12"));
        // And the :path from the table again: NotifyRegistrationStatus.
        let block = vec![0x83, 0x86, 0x80 | 65, 0x80 | 64, 0x80 | 63, 0x80 | 62];
        let msg = reg::RegistrationStatus {
            plugin_registered: false,
            error: "bad".into(),
        }
        .encode_to_vec();
        let reply = c.call(7, &block, &grpc_frame(&msg)).await;
        assert_eq!(reply.header("grpc-status"), Some("0"));
        assert_eq!(state.lock().unwrap().error, "bad");
        let _ = stop.send(true);
    }
}
