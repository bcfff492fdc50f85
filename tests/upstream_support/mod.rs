//! Purpose-made origins for the upstream protocol tests: a hyper origin on 127.0.0.1:0 that
//! speaks HTTP/1.1 or HTTP/2 (cleartext prior knowledge, or TLS with ALPN), optionally
//! requires a client certificate, records what each connection negotiated (SNI, client
//! certificate, ALPN), counts accepted connections, and can hold requests until released or
//! send GOAWAY to its connections.
//!
//! Paths: `/info` (JSON: connection index, SNI, client certificate, HTTP version, URI, the
//! request's header names), `/echo` (streams the request body, trailers included, back),
//! `/trailers` (a body then trailers), `/hold` (answers once `hold_until` requests arrived or
//! the test releases them), anything else 404.
#![allow(dead_code)]

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `/big`: 1024 chunks of 64 KiB (64 MiB).
pub const BIG_CHUNK: usize = 64 * 1024;
pub const BIG_CHUNKS: usize = 1024;
pub type OriginBody = BoxBody<Bytes, BoxError>;

/// What one accepted connection negotiated.
#[derive(Debug, Clone, Default)]
pub struct ConnSeen {
    pub sni: Option<String>,
    pub client_cert: bool,
    pub alpn: Option<String>,
}

pub struct OriginOpts {
    /// TLS with this server certificate and key (DER).
    pub tls: Option<(
        rustls::pki_types::CertificateDer<'static>,
        rustls::pki_types::PrivateKeyDer<'static>,
    )>,
    /// Require client certificates chaining to these roots.
    pub client_roots: Option<rustls::RootCertStore>,
    /// ALPN offered over TLS.
    pub alpn: Vec<&'static str>,
    /// Cleartext: HTTP/2 with prior knowledge instead of HTTP/1.1.
    pub h2c: bool,
    /// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS.
    pub max_streams: Option<u32>,
}

impl Default for OriginOpts {
    fn default() -> Self {
        OriginOpts {
            tls: None,
            client_roots: None,
            alpn: vec!["h2", "http/1.1"],
            h2c: false,
            max_streams: None,
        }
    }
}

struct Shared {
    accepted: AtomicUsize,
    seen: Mutex<Vec<ConnSeen>>,
    arrived: AtomicUsize,
    hold_until: AtomicUsize,
    release: watch::Sender<bool>,
    goaway: Notify,
    /// Bytes of `/big` bodies handed to hyper so far.
    produced: AtomicUsize,
}

pub struct Origin {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Origin {
    pub fn connections(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }
    pub fn seen(&self) -> Vec<ConnSeen> {
        self.shared.seen.lock().unwrap().clone()
    }
    /// Requests that reached `/hold` so far.
    pub fn arrived(&self) -> usize {
        self.shared.arrived.load(Ordering::SeqCst)
    }
    /// `/hold` answers once `n` requests have arrived (or on [`Origin::release`]).
    pub fn hold_until(&self, n: usize) {
        self.shared.hold_until.store(n, Ordering::SeqCst);
    }
    pub fn release(&self) {
        self.shared.release.send_replace(true);
    }
    /// Graceful shutdown (HTTP/2 GOAWAY) of every open connection.
    pub fn goaway(&self) {
        self.shared.goaway.notify_waiters();
    }
    /// Bytes of `/big` bodies hyper has taken from the origin's body so far: with flow
    /// control, only what the windows and buffers downstream have room for.
    pub fn produced(&self) -> usize {
        self.shared.produced.load(Ordering::SeqCst)
    }
}

pub async fn spawn_origin(opts: OriginOpts) -> Origin {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shared = Arc::new(Shared {
        accepted: AtomicUsize::new(0),
        seen: Mutex::new(Vec::new()),
        arrived: AtomicUsize::new(0),
        hold_until: AtomicUsize::new(usize::MAX),
        release: watch::channel(false).0,
        goaway: Notify::new(),
        produced: AtomicUsize::new(0),
    });
    let acceptor = opts.tls.as_ref().map(|(cert, key)| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match &opts.client_roots {
            Some(roots) => builder.with_client_cert_verifier(
                rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots.clone()),
                    provider,
                )
                .build()
                .unwrap(),
            ),
            None => builder.with_no_client_auth(),
        };
        let mut cfg = builder
            .with_single_cert(vec![cert.clone()], key.clone_key())
            .unwrap();
        cfg.alpn_protocols = opts.alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
    });
    let (h2c, max_streams) = (opts.h2c, opts.max_streams);
    let sh = shared.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let index = sh.accepted.fetch_add(1, Ordering::SeqCst);
            let sh = sh.clone();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                match acceptor {
                    None => {
                        sh.seen.lock().unwrap().push(ConnSeen::default());
                        serve(TokioIo::new(tcp), h2c, max_streams, index, sh).await
                    }
                    Some(acc) => {
                        let Ok(tls) = acc.accept(tcp).await else {
                            sh.seen.lock().unwrap().push(ConnSeen::default());
                            return;
                        };
                        let c = tls.get_ref().1;
                        let seen = ConnSeen {
                            sni: c.server_name().map(str::to_string),
                            client_cert: c.peer_certificates().is_some_and(|p| !p.is_empty()),
                            alpn: c
                                .alpn_protocol()
                                .map(|p| String::from_utf8_lossy(p).into_owned()),
                        };
                        let h2 = seen.alpn.as_deref() == Some("h2");
                        sh.seen.lock().unwrap().push(seen);
                        serve(TokioIo::new(tls), h2, max_streams, index, sh).await
                    }
                }
            });
        }
    });
    Origin { addr, shared, task }
}

async fn serve<T>(io: T, h2: bool, max_streams: Option<u32>, index: usize, sh: Arc<Shared>)
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let svc_sh = sh.clone();
    let svc = hyper::service::service_fn(move |req| handle(req, index, svc_sh.clone()));
    if h2 {
        let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        if let Some(n) = max_streams {
            b.max_concurrent_streams(n);
        }
        let conn = b.serve_connection(io, svc);
        tokio::pin!(conn);
        tokio::select! {
            _ = conn.as_mut() => {}
            _ = sh.goaway.notified() => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        }
    } else {
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(io, svc)
            .await;
    }
}

fn full(b: impl Into<Bytes>) -> OriginBody {
    Full::new(b.into()).map_err(|e| match e {}).boxed()
}

async fn handle(
    req: http::Request<Incoming>,
    index: usize,
    sh: Arc<Shared>,
) -> Result<http::Response<OriginBody>, std::convert::Infallible> {
    let resp = match req.uri().path() {
        "/info" => {
            let seen = sh
                .seen
                .lock()
                .unwrap()
                .get(index)
                .cloned()
                .unwrap_or_default();
            let names: Vec<String> = req.headers().keys().map(|k| k.to_string()).collect();
            let j = serde_json::json!({
                "conn": index,
                "sni": seen.sni,
                "client_cert": seen.client_cert,
                "version": format!("{:?}", req.version()),
                "uri": req.uri().to_string(),
                "authority": req.uri().authority().map(|a| a.to_string()),
                "host": req.headers().get("host").map(|h| h.to_str().unwrap_or("").to_string()),
                "te": req.headers().get("te").map(|h| h.to_str().unwrap_or("").to_string()),
                "headers": names,
            });
            http::Response::new(full(j.to_string()))
        }
        "/echo" => {
            let mut resp = http::Response::new(req.into_body().map_err(BoxError::from).boxed());
            resp.headers_mut()
                .insert("content-type", "application/octet-stream".parse().unwrap());
            resp
        }
        "/trailers" => {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("x-checksum", "abc123".parse().unwrap());
            let frames: Vec<Result<Frame<Bytes>, BoxError>> = vec![
                Ok(Frame::data(Bytes::from_static(b"part1-"))),
                Ok(Frame::data(Bytes::from_static(b"part2"))),
                Ok(Frame::trailers(trailers)),
            ];
            let mut r =
                http::Response::new(StreamBody::new(futures_util::stream::iter(frames)).boxed());
            // HTTP/1.1 clients get trailers only when the response declares them.
            r.headers_mut()
                .insert("trailer", "x-checksum".parse().unwrap());
            r
        }
        "/big" => {
            // BIG_CHUNKS chunks of 64 KiB, produced only as hyper polls for them.
            let sh = sh.clone();
            let chunks = futures_util::StreamExt::map(
                futures_util::stream::iter(0..BIG_CHUNKS),
                move |_| {
                    sh.produced.fetch_add(BIG_CHUNK, Ordering::SeqCst);
                    Ok::<_, BoxError>(Frame::data(Bytes::from(vec![b'x'; BIG_CHUNK])))
                },
            );
            http::Response::new(StreamBody::new(chunks).boxed())
        }
        "/hold" => {
            let n = sh.arrived.fetch_add(1, Ordering::SeqCst) + 1;
            if n >= sh.hold_until.load(Ordering::SeqCst) {
                sh.release.send_replace(true);
            }
            let mut rx = sh.release.subscribe();
            // Bounded: a broken test fails on its assertions, not by hanging.
            let _ = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|&v| v)).await;
            http::Response::new(full(format!("{index}")))
        }
        _ => {
            let mut r = http::Response::new(full("not found"));
            *r.status_mut() = http::StatusCode::NOT_FOUND;
            r
        }
    };
    Ok(resp)
}

/// Route everything to cluster "up", whose keys follow `[[clusters]]` verbatim.
pub fn config_with_cluster(preamble: &str, cluster_keys: &str, extra: &str) -> String {
    format!(
        r#"{preamble}

{extra}

[[routes]]
name = "default"
cluster = "up"
priority = -100

[[clusters]]
name = "up"
connect_timeout = "2s"
response_header_timeout = "5s"
{cluster_keys}
"#
    )
}

/// The JSON of an `/info` answer.
pub fn info(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body).unwrap_or_else(|e| {
        panic!(
            "origin /info body is JSON ({e}): {}",
            String::from_utf8_lossy(body)
        )
    })
}

/// Drain and stop the gateway off the test's runtime thread, so client connection tasks on
/// that thread keep running and close when the gateway says GOAWAY (dropping a
/// `TestGateway` blocks the thread and waits out the drain timeout instead).
pub async fn stop(g: super::support::TestGateway) {
    tokio::task::spawn_blocking(move || g.shutdown())
        .await
        .unwrap();
}
