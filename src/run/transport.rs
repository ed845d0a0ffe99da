//! The daemon's API clients, speaking HTTP/2 to the API server over TLS (it always offers
//! it there), as client-go does: one connection carries all of a client's requests. The
//! daemon has three (`run::Clients`): writes, watches, evictions; client-go would put the
//! first two on one connection.
//!
//! kube's own client speaks HTTP/1.1 only, so each request in flight needs a connection
//! of its own. At the start of a burst the binder's writes (32 pods at a time, each with
//! its event) opened some 50 connections at once, each with a full TLS handshake: an RSA
//! signature on both sides for the client certificate and the server's, on a machine the
//! API server already saturates. In a profile of the daemon during benches/e2e's
//! Partitionable burst, those handshakes were a tenth of its CPU time.
//!
//! The stack is kube's (`kube::client::ClientBuilder::try_from`), built from the same
//! parts of [`kube::Config`] ([`ConfigExt`]): TLS and credentials, server name, timeouts,
//! the base URI, retries of 429/503/504, extra headers. HTTP/2 keepalive pings find a
//! dead connection as client-go's do (a ping after 30 s without a frame, 15 s to answer).
//!
//! Measured with benches/e2e's Partitionable burst (250 pods): the daemon holds 5 sockets
//! instead of 31 growing to 82, its CPU time fell from 0.6–0.8 s to 0.4–0.5 s, a binding's
//! writes from 336 to 227 ms. Under that burst the API server ends some watch streams
//! early (17 to 26 WATCH requests end in the window; none did over HTTP/1.1): each
//! resumes from its last resourceVersion, without a new list.
//!
//! Over TLS the client speaks HTTP/2 only, not "h2 or http/1.1 by ALPN": with both offered,
//! hyper's pool cannot know a new connection will be shared until its handshake has ended,
//! so each request of a first burst dialled its own. 40 namespace lists at once opened up
//! to 15 connections that stayed established (tests/transport.rs failed once in eight runs
//! on an idle machine, and in CI). HTTP/2 alone lets the pool dial once and queue the rest
//! behind that handshake. A TLS endpoint without HTTP/2 (no API server; a proxy in front of
//! one might be) fails each connection, at the TLS handshake's ALPN or at the HTTP/2
//! preface, instead of falling back; plain `http://` URLs (a local `kubectl proxy`) use
//! HTTP/1.1.
//!
//! Nagle's algorithm is off (TCP_NODELAY, as Go's net package sets on every connection).
//! With it on, the first write of a binding (the claim's finalizer) waited at the client,
//! by all signs for the server's delayed ACK of the frames sent before it (not traced).
//! benches/e2e's SteadyState in scheduler_perf's batches of 10, three rounds with it on and
//! two with it off: that write took 41–42 ms at the client against 11–12 ms in the API
//! server, then 18–19 ms against 9–10; a binding's three writes 70–75 ms, then 48–49; our
//! pods/s 77–82% of the write ceiling's in the same runs, then 86–92%.
//!
//! Watches on a connection apart from the writes (benches/e2e's template burst, 2,500 pods,
//! one connection then two, alternating, two pairs): 117 and 126 pods/s against 130 and
//! 131; a binding's three writes 270 and 249 ms against 241 and 239. The gain is within
//! what runs of one build vary by (121 to 141 pods/s); kept because a burst's watch events,
//! or a relist, then share no connection with the binder's requests.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

use super::leader::Fence;

/// Idle time after which the client pings the server (client-go's ReadIdleTimeout).
const PING_AFTER: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is dropped (PingTimeout).
const PING_TIMEOUT: Duration = Duration::from_secs(15);
/// Flow-control windows, those of Go's HTTP/2 transport (client-go's): what the server may
/// send on one stream, and on the whole connection, before the client has read it. With
/// hyper's (2 and 5 MiB) a burst's pod events that the event loop had not read yet could
/// fill the connection's window and hold back the binder's responses behind them.
const STREAM_WINDOW: u32 = 4 << 20;
const CONNECTION_WINDOW: u32 = 1 << 30;

/// Asks the fence before each attempt of a request that changes something (every method
/// but GET, HEAD and OPTIONS: watches and reads pass), and ends the attempt when the
/// fence's window does (see [`Fence::bounded`]). It sits beneath the retry layer, so every
/// retry asks again.
#[derive(Clone)]
pub struct FenceLayer(pub Arc<Fence>);

impl<S> tower::Layer<S> for FenceLayer {
    type Service = Fenced<S>;

    fn layer(&self, inner: S) -> Fenced<S> {
        Fenced {
            inner,
            fence: self.0.clone(),
        }
    }
}

/// The service [`FenceLayer`] makes.
#[derive(Clone)]
pub struct Fenced<S> {
    inner: S,
    fence: Arc<Fence>,
}

impl<S, B> tower::Service<http::Request<B>> for Fenced<S>
where
    S: tower::Service<http::Request<B>, Error = BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let reads = matches!(
            *request.method(),
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
        );
        let attempt = self.inner.call(request);
        if reads {
            return Box::pin(attempt);
        }
        let fence = self.fence.clone();
        Box::pin(async move { fence.bounded(attempt).await })
    }
}

/// A client for `config`: HTTP/2 over TLS (offered alone in ALPN), HTTP/1.1 in the clear.
/// With a `fence`, every attempt of every write asks it ([`FenceLayer`]).
pub fn client(config: kube::Config, fence: Option<Arc<Fence>>) -> anyhow::Result<kube::Client> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    let tls = match &config.tls_server_name {
        Some(name) => tls.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(
            name.clone().try_into()?,
        )),
        None => tls,
    };
    let over_tls = config.cluster_url.scheme_str() == Some("https");
    let tls = if over_tls {
        tls.enable_http2().wrap_connector(http)
    } else {
        tls.enable_http1().wrap_connector(http)
    };
    let mut connector = hyper_timeout::TimeoutConnector::new(tls);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_initial_stream_window_size(STREAM_WINDOW)
        .http2_initial_connection_window_size(CONNECTION_WINDOW)
        .http2_keep_alive_interval(PING_AFTER)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .http2_only(over_tls)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(fence.map(FenceLayer))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::config::LeaderElection;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::{Service, ServiceExt};

    /// The retry layer over the fence layer over a server that answers every write 503
    /// and, on the second attempt, makes the replica lose its Lease.
    #[tokio::test]
    async fn every_retry_of_a_write_asks_the_fence_again() {
        let fence = Arc::new(Fence::elected(&LeaderElection {
            lease_name: "l".into(),
            lease_namespace: "ns".into(),
            lease_duration_seconds: 10,
            renew_deadline_seconds: 7,
            retry_period_seconds: 2,
        }));
        fence.renewal_landed(std::time::Instant::now());
        let sent = Arc::new(AtomicUsize::new(0));
        let server = tower::service_fn({
            let (sent, fence) = (sent.clone(), fence.clone());
            move |request: http::Request<kube::client::Body>| {
                let status = if request.method() == http::Method::GET {
                    200
                } else {
                    if sent.fetch_add(1, Ordering::SeqCst) == 1 {
                        fence.lost();
                    }
                    503
                };
                async move {
                    Ok::<_, BoxError>(
                        http::Response::builder()
                            .status(status)
                            .body(kube::client::Body::empty())
                            .unwrap(),
                    )
                }
            }
        });
        let mut client = ServiceBuilder::new()
            .layer(RetryLayer::new(RetryPolicy::server_retry()))
            .layer(FenceLayer(fence.clone()))
            .service(server);
        let binding = || {
            http::Request::post("/api/v1/namespaces/default/pods/p/binding")
                .body(kube::client::Body::from(b"{}".to_vec()))
                .unwrap()
        };
        let refused = client.ready().await.unwrap().call(binding()).await;
        let error = refused.expect_err("refused once the Lease is lost");
        assert!(error.is::<super::super::leader::NotLeader>(), "{error}");
        assert_eq!(
            sent.load(Ordering::SeqCst),
            2,
            "the first try and one retry were sent; the retries after the loss were not"
        );
        let watch = http::Request::get("/api/v1/pods?watch=true")
            .body(kube::client::Body::empty())
            .unwrap();
        let read = client.ready().await.unwrap().call(watch).await;
        assert!(read.is_ok(), "reads pass a shut fence");
    }
}
