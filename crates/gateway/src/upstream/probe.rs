//! One active health check of one server, over the cluster's own transport
//! ([`super::checker`] runs them on the `keymaster-health` thread).
//!
//! A probe opens a new connection the way a request's connection opens
//! ([`connect::open_transport`]): TCP; for clusters with `proxy_protocol`, a PROXY header
//! first that names no client ([`crate::proxy_protocol::local_header`]: v1 `UNKNOWN`, v2
//! `LOCAL`); then, for clusters with `tls`, the TLS handshake with the cluster's SNI, CA,
//! client certificate and ALPN. It speaks what the cluster speaks (HTTP/2 by prior knowledge
//! for `protocol = "h2"` in cleartext, what ALPN chose over TLS):
//!
//! - `kind = "http"`: `GET path`. Over HTTP/1.1 with `Connection: close`, the status line
//!   is read; over HTTP/2, the response head. A 2xx or 3xx status is a pass.
//! - `kind = "grpc"` (HTTP/2 only): the unary call `grpc.health.v1.Health/Check` for the
//!   configured service. `grpc-status: 0` with a `HealthCheckResponse` of `SERVING` is a
//!   pass.
//!
//! All of it within `timeout`: a connection not open by then is `origin_connect_timeout`,
//! an answer not in by then `origin_read_timeout`. A failure is an [`Error`] whose category
//! names it (the `result` label of `keymaster_health_checks_total`); an answer that says
//! unhealthy is `origin_unhealthy`. The connection is dropped after each check.

use bytes::{Buf, Bytes};
use http::header::{HeaderValue, CONTENT_TYPE, TE, USER_AGENT};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::{timeout_at, Instant};

use super::connect::{self, Transport};
use super::OriginServer;
use keymaster_config::{ClusterConfig, HealthCheckConfig, HealthCheckKind};
use keymaster_http::error::{BoxError, Error, Kind};

/// The gRPC health protocol's method (grpc.health.v1, `doc/health-checking.md`).
const GRPC_CHECK: &str = "/grpc.health.v1.Health/Check";
/// `HealthCheckResponse.ServingStatus.SERVING`.
const SERVING: i32 = 1;
/// Most bytes of a gRPC check's response body read (a `HealthCheckResponse` is 2 bytes).
const MAX_GRPC_BODY: usize = 16 * 1024;
const AGENT: &str = "keymaster-health-check";

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    service: String,
}

/// `grpc.health.v1.HealthCheckResponse` (`status` is the `ServingStatus` enum).
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}

/// One server's check, built once per config version.
pub(crate) struct Probe {
    pub(crate) server: Arc<OriginServer>,
    /// Sent first on every probe connection (clusters with `proxy_protocol`).
    proxy_header: Option<Vec<u8>>,
    ask: Ask,
    timeout: Duration,
}

/// What a probe asks, ready to send.
enum Ask {
    /// `GET path`: the HTTP/1.1 request's bytes, and the target for HTTP/2.
    Http { h1: Bytes, uri: http::Uri },
    /// `Health/Check`: the target and the request message in its gRPC frame.
    Grpc { uri: http::Uri, frame: Bytes },
}

impl Probe {
    /// The check `hc` of `server`, a server of `cluster`.
    pub(crate) fn new(
        cluster: &ClusterConfig,
        server: Arc<OriginServer>,
        hc: &HealthCheckConfig,
    ) -> Result<Probe, String> {
        let path = match hc.kind {
            HealthCheckKind::Http => hc.path.as_str(),
            HealthCheckKind::Grpc => GRPC_CHECK,
        };
        let uri = http::Uri::builder()
            .scheme(if server.tls.is_some() {
                "https"
            } else {
                "http"
            })
            .authority(server.authority.as_bytes())
            .path_and_query(path)
            .build()
            .map_err(|e| format!("health check target {path:?}: {e}"))?;
        let ask = match hc.kind {
            HealthCheckKind::Http => {
                let mut h1 = Vec::with_capacity(128);
                h1.extend_from_slice(b"GET ");
                h1.extend_from_slice(path.as_bytes());
                h1.extend_from_slice(b" HTTP/1.1\r\nHost: ");
                h1.extend_from_slice(server.authority.as_bytes());
                h1.extend_from_slice(b"\r\nUser-Agent: ");
                h1.extend_from_slice(AGENT.as_bytes());
                h1.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
                Ask::Http { h1: h1.into(), uri }
            }
            HealthCheckKind::Grpc => {
                let msg = HealthCheckRequest {
                    service: hc.grpc_service.clone().unwrap_or_default(),
                }
                .encode_to_vec();
                let mut frame = Vec::with_capacity(5 + msg.len());
                frame.push(0); // not compressed
                frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
                frame.extend_from_slice(&msg);
                Ask::Grpc {
                    uri,
                    frame: frame.into(),
                }
            }
        };
        Ok(Probe {
            proxy_header: crate::proxy_protocol::local_header(cluster.proxy_protocol),
            server,
            ask,
            timeout: hc.timeout.get(),
        })
    }

    /// One check: connect, ask, read the answer, all within the check's timeout.
    pub(crate) async fn run(&self) -> Result<(), Error> {
        let deadline = Instant::now() + self.timeout;
        let opened = timeout_at(
            deadline,
            connect::open_transport(&self.server, self.proxy_header.as_deref()),
        )
        .await
        .map_err(|_| Error::new(Kind::ConnectTimeout, "health check: connect timed out"))?;
        let transport = opened?;
        let h2 = transport.speaks_h2(self.server.protocol)?;
        let answer = async move {
            match transport {
                Transport::Plain(tcp) => self.exchange(tcp, h2).await,
                Transport::Tls(tls, _) => self.exchange(*tls, h2).await,
            }
        };
        timeout_at(deadline, answer).await.map_err(|_| {
            Error::new(
                Kind::ResponseHeaderTimeout,
                "health check: no answer within the timeout",
            )
        })?
    }

    async fn exchange<T>(&self, io: T, h2: bool) -> Result<(), Error>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        match (&self.ask, h2) {
            (Ask::Http { h1, .. }, false) => http1_get(io, h1).await,
            (Ask::Http { uri, .. }, true) => {
                let mut req = http::Request::new(Full::new(Bytes::new()));
                *req.uri_mut() = uri.clone();
                req.headers_mut()
                    .insert(USER_AGENT, HeaderValue::from_static(AGENT));
                over_h2(io, req, false).await
            }
            (Ask::Grpc { uri, frame }, true) => {
                let mut req = http::Request::new(Full::new(frame.clone()));
                *req.method_mut() = http::Method::POST;
                *req.uri_mut() = uri.clone();
                let h = req.headers_mut();
                h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
                h.insert(TE, HeaderValue::from_static("trailers"));
                h.insert(USER_AGENT, HeaderValue::from_static(AGENT));
                over_h2(io, req, true).await
            }
            (Ask::Grpc { .. }, false) => Err(Error::new(
                Kind::OriginProtocol,
                "health check: gRPC needs HTTP/2, but the origin chose HTTP/1.1 by ALPN",
            )),
        }
    }
}

/// `GET` over HTTP/1.1: write the request, read the status line.
async fn http1_get<T: AsyncRead + AsyncWrite + Unpin>(
    mut io: T,
    request: &[u8],
) -> Result<(), Error> {
    let sent = async {
        io.write_all(request).await?;
        io.flush().await
    };
    sent.await.map_err(|e| {
        Error::new(
            Kind::OriginReset,
            "health check: sending the request failed",
        )
        .with_source(e)
    })?;
    let mut buf = [0u8; 64];
    let mut have = 0;
    while have < 12 {
        let n = io.read(&mut buf[have..]).await.map_err(|e| {
            Error::new(Kind::OriginReset, "health check: reading the answer failed").with_source(e)
        })?;
        if n == 0 {
            return Err(Error::new(
                Kind::OriginReset,
                "health check: the origin closed before a status line",
            ));
        }
        have += n;
    }
    let status = status_of(&buf[..have]).ok_or_else(|| {
        Error::new(
            Kind::OriginProtocol,
            "health check: not an HTTP/1.x status line",
        )
    })?;
    http_verdict(status)
}

/// One request over a new HTTP/2 connection, driven in this task until the verdict is in;
/// the connection is dropped with the future.
async fn over_h2<T>(io: T, req: http::Request<Full<Bytes>>, grpc: bool) -> Result<(), Error>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(io))
        .await
        .map_err(|e| {
            Error::new(Kind::Connect, "health check: h2 handshake failed").with_source(e)
        })?;
    let exchange = async {
        let resp = sender.send_request(req).await.map_err(|e| {
            Error::new(
                Kind::OriginReset,
                "health check: the origin refused or reset the stream",
            )
            .with_source(e)
        })?;
        if grpc {
            grpc_verdict(resp).await
        } else {
            http_verdict(resp.status().as_u16())
        }
    };
    tokio::pin!(exchange);
    tokio::select! {
        biased;
        verdict = &mut exchange => verdict,
        // The connection ended: what it received is still read, and its streams end with it.
        _ = conn => exchange.await,
    }
}

/// A 2xx or 3xx status passes.
fn http_verdict(status: u16) -> Result<(), Error> {
    if (200..=399).contains(&status) {
        return Ok(());
    }
    Err(unhealthy(
        "health check: status not 2xx or 3xx",
        format!("status {status}"),
    ))
}

/// The answer to `Health/Check`: HTTP 200, `grpc-status: 0` (in the trailers, or in the head
/// of a trailers-only answer), one uncompressed `HealthCheckResponse` saying `SERVING`.
async fn grpc_verdict(resp: http::Response<Incoming>) -> Result<(), Error> {
    if resp.status() != http::StatusCode::OK {
        let why = format!("HTTP status {}", resp.status().as_u16());
        return Err(unhealthy("health check: gRPC call failed", why));
    }
    if let Some(status) = resp.headers().get("grpc-status") {
        grpc_status_ok(status, resp.headers())?;
        return Err(Error::new(
            Kind::OriginProtocol,
            "health check: gRPC answer without a message",
        ));
    }
    let body = Limited::new(resp.into_body(), MAX_GRPC_BODY)
        .collect()
        .await
        .map_err(|e: BoxError| {
            if e.is::<http_body_util::LengthLimitError>() {
                Error::new(Kind::OriginProtocol, "health check: gRPC answer too large")
            } else {
                Error::new(Kind::OriginReset, "health check: gRPC answer cut off").with_source(e)
            }
        })?;
    match body.trailers() {
        Some(t) => match t.get("grpc-status") {
            Some(status) => grpc_status_ok(status, t)?,
            None => return Err(no_status()),
        },
        None => return Err(no_status()),
    }
    let status = decode_response(body.to_bytes())?;
    if status == SERVING {
        return Ok(());
    }
    Err(unhealthy(
        "health check: gRPC serving status not SERVING",
        format!("serving status {status}"),
    ))
}

fn no_status() -> Error {
    Error::new(
        Kind::OriginProtocol,
        "health check: gRPC answer without grpc-status",
    )
}

/// `grpc-status: 0`, else the code and `grpc-message` as the failure.
fn grpc_status_ok(status: &HeaderValue, fields: &http::HeaderMap) -> Result<(), Error> {
    if status.as_bytes() == b"0" {
        return Ok(());
    }
    let message = fields
        .get("grpc-message")
        .map(|m| {
            String::from_utf8_lossy(m.as_bytes())
                .chars()
                .take(200)
                .collect::<String>()
        })
        .unwrap_or_default();
    let why = format!(
        "grpc-status {} {message}",
        String::from_utf8_lossy(status.as_bytes())
    );
    Err(unhealthy("health check: gRPC call failed", why))
}

/// The serving status in one length-prefixed `HealthCheckResponse`.
fn decode_response(mut data: Bytes) -> Result<i32, Error> {
    let bad = |detail| Error::new(Kind::OriginProtocol, detail);
    if data.len() < 5 {
        return Err(bad("health check: gRPC answer without a message"));
    }
    if data.get_u8() != 0 {
        // No grpc-accept-encoding was sent, so nothing may be compressed.
        return Err(bad("health check: gRPC message compressed unasked"));
    }
    let len = data.get_u32() as usize;
    if data.len() < len {
        return Err(bad("health check: gRPC message cut short"));
    }
    HealthCheckResponse::decode(data.split_to(len))
        .map(|r| r.status)
        .map_err(|e| bad("health check: not a HealthCheckResponse").with_source(e))
}

fn unhealthy(detail: &'static str, why: String) -> Error {
    Error::new(Kind::OriginUnhealthy, detail).with_source(why)
}

/// The status of an `HTTP/1.x NNN` status line.
fn status_of(line: &[u8]) -> Option<u16> {
    let rest = line
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| line.strip_prefix(b"HTTP/1.0 "))?;
    std::str::from_utf8(rest.get(..3)?).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use keymaster_config::UpstreamProtocol;

    #[test]
    fn status_lines() {
        assert_eq!(status_of(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(status_of(b"HTTP/1.0 503 x"), Some(503));
        assert_eq!(status_of(b"HTTP/2 200"), None);
        assert_eq!(status_of(b"HTTP/1.1 2x0"), None);
    }

    #[test]
    fn grpc_messages_decode_and_bad_frames_are_refused() {
        let serving = HealthCheckResponse { status: SERVING }.encode_to_vec();
        assert_eq!(decode_response(frame(0, &serving)).unwrap(), SERVING);
        let not = HealthCheckResponse { status: 2 }.encode_to_vec();
        assert_eq!(decode_response(frame(0, &not)).unwrap(), 2);
        for bad in [
            frame(1, &serving),
            frame(0, &serving).slice(..5),
            Bytes::from_static(b"\0\0"),
            frame(0, &[0xff, 0xff]),
        ] {
            let e = decode_response(bad).unwrap_err();
            assert_eq!(e.category(), "origin_bad_response", "{e}");
        }
    }

    fn server(addr: std::net::SocketAddr, protocol: UpstreamProtocol) -> Arc<OriginServer> {
        Arc::new(OriginServer {
            state: super::super::intern_origin(addr),
            label: addr.to_string().into(),
            authority: HeaderValue::from_static("h"),
            weight: 1,
            tls: None,
            protocol,
            metrics: crate::metrics::ServerMetrics::for_tests(),
        })
    }

    fn check(
        addr: std::net::SocketAddr,
        protocol: UpstreamProtocol,
        hc: HealthCheckConfig,
    ) -> Probe {
        Probe::new(&ClusterConfig::default(), server(addr, protocol), &hc).unwrap()
    }

    fn probe(addr: std::net::SocketAddr, path: &str, timeout: Duration) -> Probe {
        let hc = HealthCheckConfig {
            path: path.into(),
            timeout: keymaster_config::Duration::from_millis(timeout.as_millis() as u64),
            ..Default::default()
        };
        check(addr, UpstreamProtocol::Http1, hc)
    }

    fn frame(flag: u8, msg: &[u8]) -> Bytes {
        let mut f = vec![flag];
        f.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        f.extend_from_slice(msg);
        Bytes::from(f)
    }

    type TestBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

    /// An h2c origin: `/good` 204, `/bad` 500, `/hold` never answers; the gRPC health
    /// service answers by the service asked about (see the match).
    async fn h2_origin() -> std::net::SocketAddr {
        use hyper::body::Frame;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let answer = |req: http::Request<Incoming>| async move {
            let path = req.uri().path().to_string();
            let asked = req.into_body().collect().await.unwrap().to_bytes();
            let service = if asked.len() >= 5 {
                HealthCheckRequest::decode(asked.slice(5..))
                    .unwrap()
                    .service
            } else {
                String::new()
            };
            let trailers = |code: &'static str| {
                let mut t = http::HeaderMap::new();
                t.insert("grpc-status", HeaderValue::from_static(code));
                Frame::trailers(t)
            };
            let msg = |status: i32| {
                Frame::data(frame(0, &HealthCheckResponse { status }.encode_to_vec()))
            };
            let (status, frames): (u16, Vec<Frame<Bytes>>) = match (path.as_str(), service.as_str())
            {
                ("/good", _) => (204, vec![]),
                ("/hold", _) => std::future::pending().await,
                (GRPC_CHECK, "serving") => (200, vec![msg(SERVING), trailers("0")]),
                (GRPC_CHECK, "not") => (200, vec![msg(2), trailers("0")]),
                (GRPC_CHECK, "no-status") => (200, vec![msg(SERVING)]),
                (GRPC_CHECK, "empty") => (200, vec![trailers("0")]),
                (GRPC_CHECK, "unavailable") => (503, vec![]),
                (GRPC_CHECK, _) => (200, vec![]), // trailers-only, set below
                _ => (500, vec![]),
            };
            let body = http_body_util::StreamBody::new(futures_util::stream::iter(
                frames.into_iter().map(Ok::<_, std::convert::Infallible>),
            ));
            let mut r = http::Response::new(BodyExt::boxed(body) as TestBody);
            *r.status_mut() = http::StatusCode::from_u16(status).unwrap();
            if path == GRPC_CHECK && service == "unknown" {
                r.headers_mut()
                    .insert("grpc-status", HeaderValue::from_static("5"));
            }
            Ok::<_, std::convert::Infallible>(r)
        };
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let svc = hyper::service::service_fn(answer);
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(s), svc),
                );
            }
        });
        addr
    }

    #[tokio::test]
    async fn h2_and_grpc_answers() {
        let addr = h2_origin().await;
        let t = keymaster_config::Duration::from_secs(5);
        let http = |path: &str| HealthCheckConfig {
            path: path.into(),
            timeout: t,
            ..Default::default()
        };
        let h2 = UpstreamProtocol::H2;
        assert!(check(addr, h2, http("/good")).run().await.is_ok());
        let e = check(addr, h2, http("/bad")).run().await.unwrap_err();
        assert_eq!(e.category(), "origin_unhealthy", "{e}");
        let mut hold = http("/hold");
        hold.timeout = keymaster_config::Duration::from_millis(100);
        let e = check(addr, h2, hold).run().await.unwrap_err();
        assert_eq!(e.category(), "origin_read_timeout", "{e}");

        let grpc = |service: &str| HealthCheckConfig {
            kind: HealthCheckKind::Grpc,
            grpc_service: Some(service.into()),
            timeout: t,
            ..Default::default()
        };
        assert!(check(addr, h2, grpc("serving")).run().await.is_ok());
        for (service, category, says) in [
            ("not", "origin_unhealthy", "serving status 2"),
            ("unknown", "origin_unhealthy", "grpc-status 5"),
            ("unavailable", "origin_unhealthy", "HTTP status 503"),
            ("no-status", "origin_bad_response", "without grpc-status"),
            ("empty", "origin_bad_response", "without a message"),
        ] {
            let e = check(addr, h2, grpc(service)).run().await.unwrap_err();
            assert_eq!(e.category(), category, "{service}: {e}");
            assert!(e.to_string().contains(says), "{service}: {e}");
        }
    }

    #[tokio::test]
    async fn http1_probe_reads_the_status_and_gives_up_in_time() {
        let ok = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = ok.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = ok.accept().await {
                let mut b = [0u8; 512];
                let _ = s.read(&mut b).await;
                let code = if b.starts_with(b"GET /good ") {
                    204
                } else {
                    500
                };
                let _ = s
                    .write_all(format!("HTTP/1.1 {code} X\r\ncontent-length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        let t = Duration::from_secs(5);
        assert!(probe(addr, "/good", t).run().await.is_ok());
        let e = probe(addr, "/bad", t).run().await.unwrap_err();
        assert_eq!(e.category(), "origin_unhealthy");
        assert!(e.to_string().contains("status 500"), "{e}");
        // A server that accepts and never answers fails by the timeout.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let saddr = silent.local_addr().unwrap();
        let _keep = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = silent.accept().await {
                held.push(s);
            }
        });
        let e = probe(saddr, "/good", Duration::from_millis(50))
            .run()
            .await
            .unwrap_err();
        assert_eq!(e.category(), "origin_read_timeout");
        // Nobody listening: a connect failure.
        drop(_keep);
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let caddr = closed.local_addr().unwrap();
        drop(closed);
        let e = probe(caddr, "/good", t).run().await.unwrap_err();
        assert_eq!(e.category(), "origin_connectivity");
    }
}
