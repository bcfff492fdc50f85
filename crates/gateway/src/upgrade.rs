//! Protocol upgrades: WebSocket and other HTTP/1.1 `Upgrade` protocols a route allows.
//!
//! ```text
//! client GET + Connection: upgrade, Upgrade: websocket
//!   ─► proxy::handle: route, pre/route filters (they may refuse the handshake like any request)
//!   ─► take_request        the route allows every offered protocol? (HTTP/2: keep the
//!                          stream's OnUpgrade; HTTP/1.1: the connection itself is handed over)
//!   ─► restore_request     Upgrade + Connection: upgrade put back after hop-by-hop removal
//!   ─► send                on a pooled or fresh origin connection
//!   ─► accept_response     origin said 101: take its connection (keymaster's HTTP/1.1 client) and Upgrade value
//!                          (any other status is an ordinary response, streamed as usual)
//!   ─► Switch::start       101 to the client, then the tunnel joins both upgraded sockets:
//!                          tokio copy_bidirectional (fixed buffers: backpressure both ways),
//!                          closed after `upgrade.idle_timeout` with no bytes either way.
//!                          HTTP/1.1: the response body is the `Tunnel`, which the client
//!                          connection runs once the 101 is written; HTTP/2: a local task
//!                          that waits for hyper to hand over the stream
//! ```
//!
//! The upstream connection of a tunnel never returns to the pool: after the 101 it belongs to
//! the tunnel and closes with it. The tunnel keeps its client connection counted (in flight on
//! the connection, open on the listener) until it ends, and has its own metrics
//! (`keymaster_tunnels_active`, `_tunnels_total`, `_tunnel_bytes_total`,
//! `_tunnel_idle_timeouts_total`).
//!
//! HTTP/2 clients use extended CONNECT (RFC 8441: `CONNECT` with `:protocol = websocket`, the
//! listener advertises SETTINGS_ENABLE_CONNECT_PROTOCOL): the gateway sends the origin an
//! HTTP/1.1 `GET` upgrade (with a fresh `Sec-WebSocket-Key`), answers the client's stream with
//! `200` on the origin's `101`, and tunnels the h2 stream to the origin socket.

use http::header::{self, HeaderMap, HeaderValue};
use http::{request, response, Method, StatusCode, Version};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use std::cell::Cell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::downstream::ConnCtx;
use crate::metrics::TunnelMetrics;
use crate::proxy::InFlight;
use crate::upstream::conn::UpstreamBody;
use crate::upstream::h1::Upgraded;
use keymaster_http::error::{Error, Kind};
use keymaster_http::headers::{has_token, HeadScan};

/// A route's upgrade settings, compiled.
#[derive(Debug, Clone)]
pub(crate) struct UpgradePolicy {
    websocket: bool,
    /// Other allowed protocol names, lowercase.
    protocols: Vec<String>,
    idle_timeout: Duration,
}

impl UpgradePolicy {
    pub(crate) fn compile(cfg: &keymaster_config::UpgradeConfig) -> Self {
        UpgradePolicy {
            websocket: cfg.websocket,
            protocols: cfg
                .protocols
                .iter()
                .map(|p| protocol_name(p).to_ascii_lowercase())
                .collect(),
            idle_timeout: cfg.idle_timeout.get(),
        }
    }

    /// Is this protocol (`name` or `name/version`) allowed to upgrade?
    fn allows(&self, offered: &str) -> bool {
        let name = protocol_name(offered);
        (self.websocket && name.eq_ignore_ascii_case("websocket"))
            || self.protocols.iter().any(|p| p.eq_ignore_ascii_case(name))
    }
}

fn protocol_name(p: &str) -> &str {
    p.split('/').next().unwrap_or("").trim()
}

/// Where the client side of a tunnel comes from.
enum ClientSide {
    /// keymaster's HTTP/1.1 server hands over the connection once it has written the 101
    /// (`ResponseBody::Tunnel`).
    Connection,
    /// hyper's HTTP/2 server hands over the stream once it has sent the 200.
    Stream(OnUpgrade),
}

/// A client's request to switch protocols that its route allows.
pub(crate) struct UpgradeRequest {
    upgrade: HeaderValue,
    client: ClientSide,
    /// HTTP/2 extended CONNECT (RFC 8441): sent upstream as an HTTP/1.1 upgrade, answered
    /// to the client with 200 instead of 101.
    h2: bool,
}

/// If this request asks to upgrade (HTTP/1.1, `Connection: upgrade`, `Upgrade`, no body) and
/// the route allows every offered protocol, take the client's upgrade handle. Otherwise the
/// request goes on as a plain one and hop-by-hop removal drops its `Upgrade`. An HTTP/2
/// `CONNECT` is accepted only as an extended CONNECT the route allows (the gateway is no
/// forward proxy): anything else is a 400.
pub(crate) fn take_request(
    policy: &UpgradePolicy,
    parts: &mut request::Parts,
    scan: &HeadScan,
    bodyless: bool,
) -> Result<Option<UpgradeRequest>, Error> {
    if parts.version == Version::HTTP_2 && parts.method == Method::CONNECT {
        return take_extended_connect(policy, parts)
            .map(Some)
            .ok_or_else(|| {
                Error::new(
                    Kind::BadRequest,
                    "CONNECT is accepted only as an extended CONNECT the route allows",
                )
            });
    }
    Ok(take_http1(policy, parts, scan, bodyless))
}

fn take_http1(
    policy: &UpgradePolicy,
    parts: &mut request::Parts,
    scan: &HeadScan,
    bodyless: bool,
) -> Option<UpgradeRequest> {
    if !scan.connection || parts.version != Version::HTTP_11 || !bodyless {
        return None;
    }
    if !has_token(&parts.headers, header::CONNECTION, "upgrade") {
        return None;
    }
    let mut values = parts.headers.get_all(header::UPGRADE).iter();
    let upgrade = values.next()?.clone();
    if values.next().is_some() {
        return None; // one Upgrade field line, or it is not ours to pass on
    }
    let offered = upgrade.to_str().ok()?;
    let mut any = false;
    for p in offered.split(',').filter(|p| !p.trim().is_empty()) {
        if !policy.allows(p) {
            return None;
        }
        any = true;
    }
    if !any {
        return None;
    }
    Some(UpgradeRequest {
        upgrade,
        client: ClientSide::Connection,
        h2: false,
    })
}

/// RFC 8441: an HTTP/2 `CONNECT` with `:protocol` (e.g. `websocket`) the route allows becomes
/// an HTTP/1.1 `GET` with `Upgrade` to the origin.
fn take_extended_connect(
    policy: &UpgradePolicy,
    parts: &mut request::Parts,
) -> Option<UpgradeRequest> {
    let protocol = parts.extensions.get::<hyper::ext::Protocol>()?.as_str();
    if !policy.allows(protocol) {
        return None;
    }
    let upgrade = HeaderValue::from_str(protocol).ok()?;
    let client = ClientSide::Stream(parts.extensions.remove::<OnUpgrade>()?);
    parts.method = Method::GET;
    Some(UpgradeRequest {
        upgrade,
        client,
        h2: true,
    })
}

/// Put back what hop-by-hop removal took from an allowed upgrade request (for an RFC 8441
/// WebSocket, the HTTP/1.1 handshake's key that HTTP/2 does without).
pub(crate) fn restore_request(headers: &mut HeaderMap, up: &UpgradeRequest) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, up.upgrade.clone());
    if up.h2 && up.upgrade.as_bytes().eq_ignore_ascii_case(b"websocket") {
        use base64::Engine;
        let key =
            base64::engine::general_purpose::STANDARD.encode(fastrand::u128(..).to_le_bytes());
        if let Ok(v) = HeaderValue::from_str(&key) {
            headers.insert(header::SEC_WEBSOCKET_KEY, v);
        }
    }
}

/// An origin's `101 Switching Protocols`, ready to become a tunnel.
pub(crate) struct Switch {
    upgrade: HeaderValue,
    client: ClientSide,
    origin: Upgraded,
    h2: bool,
}

/// Look at the origin's response head (before hop-by-hop removal). A `101` to an upgrade
/// request becomes a [`Switch`]; a `101` nobody asked for is a protocol error; anything
/// else is an ordinary response (the client's upgrade handle is dropped: no tunnel).
pub(crate) fn accept_response(
    up: Option<UpgradeRequest>,
    rparts: &mut response::Parts,
    rbody: &mut UpstreamBody,
) -> Result<Option<Switch>, Error> {
    if rparts.status != StatusCode::SWITCHING_PROTOCOLS {
        return Ok(None);
    }
    let refuse = || Error::new(Kind::OriginProtocol, "origin switched protocols unasked");
    let up = up.ok_or_else(refuse)?;
    let upgrade = rparts
        .headers
        .get(header::UPGRADE)
        .cloned()
        .ok_or_else(|| {
            Error::new(
                Kind::OriginProtocol,
                "origin sent 101 without an Upgrade header",
            )
        })?;
    let origin = rbody.take_upgraded().ok_or_else(refuse)?;
    Ok(Some(Switch {
        upgrade,
        client: up.client,
        origin,
        h2: up.h2,
    }))
}

impl Switch {
    /// Finish the 101 head for the client and set up the tunnel: returned for an HTTP/1.1
    /// client (its connection runs it once the head is written), started as a local task
    /// for an HTTP/2 stream. `inflight` keeps the client connection's request in flight (no
    /// header/idle timeout on the raw socket) until the tunnel ends; `cx` keeps the
    /// connection counted on its listener.
    pub(crate) fn start(
        self,
        head: &mut response::Parts,
        cx: Rc<ConnCtx>,
        idle: &UpgradePolicy,
        metrics: TunnelMetrics,
        inflight: InFlight,
    ) -> Option<Box<Tunnel>> {
        if self.h2 {
            // RFC 8441 §5: a 2xx opens the stream as the tunnel; the HTTP/1.1 key check
            // was the gateway's business with the origin.
            head.status = StatusCode::OK;
            head.headers.remove(header::SEC_WEBSOCKET_ACCEPT);
        } else {
            let headers = &mut head.headers;
            headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            headers.insert(header::UPGRADE, self.upgrade);
        }
        // Counted from the 101 on, so a client that has its 101 sees the tunnel counted.
        metrics.total.inc();
        metrics.active.inc();
        let tunnel = Box::new(Tunnel {
            origin: self.origin,
            idle_timeout: idle.idle_timeout,
            _held: (cx, inflight, Active(metrics.active.clone())),
            metrics,
        });
        match self.client {
            ClientSide::Connection => Some(tunnel),
            ClientSide::Stream(client) => {
                tokio::task::spawn_local(async move {
                    match client.await {
                        Ok(c) => tunnel.run(TokioIo::new(c)).await,
                        Err(e) => {
                            tracing::debug!(error = %e, "the client's upgrade did not complete")
                        }
                    }
                });
                None
            }
        }
    }
}

/// An accepted upgrade, waiting for its client side: the origin's upgraded connection and
/// what the tunnel keeps alive while it runs.
pub(crate) struct Tunnel {
    origin: Upgraded,
    idle_timeout: Duration,
    metrics: TunnelMetrics,
    /// The client connection's context, its in-flight request and the active gauge.
    _held: (Rc<ConnCtx>, InFlight, Active),
}

impl Tunnel {
    /// Copy between `client` and the origin until the tunnel ends.
    pub(crate) async fn run<C: AsyncRead + AsyncWrite + Unpin>(self, client: C) {
        let Tunnel {
            origin,
            idle_timeout,
            metrics,
            _held,
        } = self;
        tunnel(client, origin, idle_timeout, &metrics, _held).await;
    }
}

/// Copy both ways until both sides close, an error, or `idle_timeout` with no bytes.
/// `held` (the counts the tunnel keeps: active tunnels, the client connection) is released
/// before the sockets close, so a peer that sees the close sees the counts already updated.
async fn tunnel<C, O, H>(client: C, origin: O, idle_timeout: Duration, m: &TunnelMetrics, held: H)
where
    C: AsyncRead + AsyncWrite + Unpin,
    O: AsyncRead + AsyncWrite + Unpin,
{
    let last = Rc::new(Cell::new(Instant::now()));
    let mut client = Counted {
        io: client,
        bytes: m.bytes_upstream.clone(),
        last: last.clone(),
    };
    let mut origin = Counted {
        io: origin,
        bytes: m.bytes_downstream.clone(),
        last: last.clone(),
    };
    let idle = async {
        loop {
            let due = last.get() + idle_timeout;
            if Instant::now() >= due {
                return;
            }
            tokio::time::sleep_until(due).await;
        }
    };
    tokio::select! {
        r = tokio::io::copy_bidirectional(&mut client, &mut origin) => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "tunnel ended with an error");
            }
        }
        _ = idle => m.idle_timeouts.inc(),
    }
    drop(held);
}

/// Counts a tunnel as active until dropped.
struct Active(prometheus::IntGauge);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// One side of a tunnel: counts the bytes read from it and notes activity either way.
struct Counted<S> {
    io: S,
    bytes: crate::metrics::sharded::Counter,
    last: Rc<Cell<Instant>>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.bytes.inc_by(n as u64);
            self.last.set(Instant::now());
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.last.set(Instant::now());
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes pass both ways and are counted; activity pushes the idle deadline back; with
    /// nothing sent for `idle_timeout` both sides are closed (paused time: exact).
    #[tokio::test(start_paused = true)]
    async fn tunnel_copies_counts_and_closes_when_idle() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let m = crate::metrics::Metrics::new().route("r").tunnel;
        let (mut client, client_end) = tokio::io::duplex(64);
        let (mut origin, origin_end) = tokio::io::duplex(64);
        let idle = Duration::from_secs(30);
        let started = Instant::now();
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let metrics = m.clone();
                let t = tokio::task::spawn_local(async move {
                    tunnel(client_end, origin_end, idle, &metrics, ()).await;
                });
                let mut buf = [0u8; 5];
                client.write_all(b"hello").await.unwrap();
                origin.read_exact(&mut buf).await.unwrap();
                assert_eq!(&buf, b"hello");
                tokio::time::sleep(Duration::from_secs(20)).await;
                origin.write_all(b"world").await.unwrap();
                client.read_exact(&mut buf).await.unwrap();
                assert_eq!(&buf, b"world");
                // Idle from here on: closed 30 s after the last bytes (t = 20 s), not before.
                t.await.unwrap();
                assert_eq!(started.elapsed(), Duration::from_secs(50));
                assert_eq!(client.read(&mut buf).await.unwrap(), 0);
                assert_eq!(origin.read(&mut buf).await.unwrap(), 0);
            })
            .await;
        assert_eq!(m.bytes_upstream.get(), 5);
        assert_eq!(m.bytes_downstream.get(), 5);
        assert_eq!(m.idle_timeouts.get(), 1);
    }

    #[test]
    fn policy_allows_websocket_by_default_and_configured_protocols() {
        let mut cfg = keymaster_config::UpgradeConfig::default();
        let p = UpgradePolicy::compile(&cfg);
        assert!(p.allows("websocket"));
        assert!(p.allows(" WebSocket "));
        assert!(!p.allows("h2c"));
        cfg.websocket = false;
        cfg.protocols = vec!["My-Proto".into()];
        let p = UpgradePolicy::compile(&cfg);
        assert!(!p.allows("websocket"));
        assert!(p.allows("my-proto/2"));
    }
}
