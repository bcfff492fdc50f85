//! Opening an upstream connection: TCP connect and, for TLS clusters, the TLS handshake,
//! together within the connect timeout; then hyper's HTTP/2 client handshake (when the
//! cluster says `h2`, or ALPN chose it for `auto`; its connection runs as a local task), or
//! keymaster's own HTTP/1.1 client connection ([`super::h1`]), which needs no handshake and
//! no task.

use hyper::client::conn::http2;
use hyper_util::rt::TokioIo;
use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::conn::Conn;
use super::h1::{self, Io};
use super::h2::{H2Conn, StreamLimit};
use super::{Cluster, OriginServer};
use crate::body::RequestBody;
use crate::descriptors::Descriptor;
use crate::runtime_thread::LocalExec;
use keymaster_config::UpstreamProtocol;
use keymaster_http::error::{Error, Kind};

/// A new connection: HTTP/1.1 (one request at a time) or HTTP/2 (multiplexed).
pub(crate) enum Connected {
    H1(Conn),
    H2(H2Conn),
}

/// Connect to `server`, honouring the cluster's per-server connection cap. `timeout`
/// covers TCP and TLS. `h2_streams`: the stream limit assumed for a new HTTP/2 connection
/// until the origin's SETTINGS arrive. `proxy_header`: a PROXY protocol header to send
/// first, before any TLS (the cluster's `proxy_protocol`). `descriptor`: the connection's
/// place in the descriptor budget, when the caller waited for it; otherwise one is taken
/// now, or the connect fails at once (`local_descriptors_exhausted`).
pub(crate) async fn connect(
    cluster: &Cluster,
    server: &Arc<OriginServer>,
    timeout: Duration,
    h2_streams: usize,
    proxy_header: Option<&[u8]>,
    descriptor: Option<Descriptor>,
) -> Result<Connected, Error> {
    let state = &server.state;
    let cap = cluster.config.pool.max_connections;
    // Reserve a slot first so concurrent connects cannot overshoot the cap.
    let open = state.open_connections.fetch_add(1, Ordering::AcqRel);
    if cap != 0 && open >= cap {
        state.open_connections.fetch_sub(1, Ordering::AcqRel);
        return Err(Error::new(Kind::PoolFull, "origin connection cap reached"));
    }
    let slot = OpenSlot {
        state: state.clone(),
        gauge: None,
        idle_gauge: None,
        descriptor: descriptor.or_else(|| crate::descriptors::budget().origin()),
    };
    if slot.descriptor.is_none() {
        return Err(Error::new(
            Kind::NoDescriptors,
            "out of file descriptors: the descriptor budget is spent",
        ));
    }
    cluster.metrics.connect_attempts.inc();
    let opened = match tokio::time::timeout(timeout, open_transport(server, proxy_header)).await {
        Ok(r) => r,
        Err(_) => Err(Error::new(
            Kind::ConnectTimeout,
            "connect to origin timed out",
        )),
    };
    let transport = opened.inspect_err(|e| {
        // Out of local descriptors is not the origin's failure.
        if e.is_out_of_descriptors() {
            cluster.metrics.descriptors_exhausted.inc();
        } else if e.is_origin() {
            cluster.metrics.connect_failures.inc();
        }
        if e.is_tls() {
            cluster.metrics.tls_failures.inc();
        }
    })?;
    let h2 = transport
        .speaks_h2(server.protocol)
        .inspect_err(|_| cluster.metrics.connect_failures.inc())?;
    match (transport, h2) {
        (Transport::Plain(tcp), true) => handshake_h2(cluster, tcp, h2_streams, slot).await,
        (Transport::Plain(tcp), false) => Ok(h1_conn(cluster, server, Io::Tcp(tcp), slot)),
        (Transport::Tls(tls, _), true) => handshake_h2(cluster, *tls, h2_streams, slot).await,
        (Transport::Tls(tls, _), false) => Ok(h1_conn(
            cluster,
            server,
            Io::Tls(Box::new((*tls).into())),
            slot,
        )),
    }
}

/// An open transport to an origin server, before any HTTP: TCP, or TLS with whether ALPN
/// chose h2.
pub(crate) enum Transport {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>, bool),
}

impl Transport {
    /// Whether to speak HTTP/2 on this transport to a server of `protocol`: prior knowledge
    /// in cleartext for `h2`; over TLS, what ALPN chose (an `h2` server that did not agree
    /// to h2 is an error).
    pub(crate) fn speaks_h2(&self, protocol: UpstreamProtocol) -> Result<bool, Error> {
        match (self, protocol) {
            (Transport::Plain(_), p) => Ok(p == UpstreamProtocol::H2),
            (Transport::Tls(_, false), UpstreamProtocol::H2) => Err(Error::new(
                Kind::OriginProtocol,
                "origin did not agree to h2 by ALPN",
            )),
            (Transport::Tls(..), UpstreamProtocol::H2) => Ok(true),
            (Transport::Tls(..), UpstreamProtocol::Http1) => Ok(false),
            (Transport::Tls(_, alpn_h2), UpstreamProtocol::Auto) => Ok(*alpn_h2),
        }
    }
}

/// TCP, the PROXY header if any, then TLS when the server has it (the cluster's `tls`).
/// Used by [`connect`] and by the active health checks ([`super::probe`]).
pub(crate) async fn open_transport(
    server: &OriginServer,
    proxy_header: Option<&[u8]>,
) -> Result<Transport, Error> {
    let mut tcp = TcpStream::connect(server.state.addr).await.map_err(|e| {
        if crate::descriptors::exhausted(&e) {
            Error::new(Kind::NoDescriptors, "out of file descriptors").with_source(e)
        } else if e.kind() == std::io::ErrorKind::ConnectionRefused {
            // Nothing listens there, the server is down (it is ejected at once, see
            // `Cluster::record_failure`). Other failures may be the network's or keymaster's.
            Error::new(Kind::ConnectRefused, "origin refused the connection").with_source(e)
        } else {
            Error::new(Kind::Connect, "connect to origin failed").with_source(e)
        }
    })?;
    let _ = tcp.set_nodelay(true);
    if let Some(h) = proxy_header {
        use tokio::io::AsyncWriteExt;
        tcp.write_all(h).await.map_err(|e| {
            Error::new(Kind::Connect, "sending the PROXY header failed").with_source(e)
        })?;
    }
    let Some((tls, name)) = &server.tls else {
        return Ok(Transport::Plain(tcp));
    };
    match tls.handshake(name.clone(), tcp).await {
        Ok((stream, h2)) => Ok(Transport::Tls(Box::new(stream), h2)),
        Err(e) => {
            Err(Error::new(Kind::OriginTls, "TLS handshake with origin failed").with_source(e))
        }
    }
}

/// An HTTP/1.1 connection: nothing to negotiate, nothing to spawn.
fn h1_conn(cluster: &Cluster, server: &Arc<OriginServer>, io: Io, mut slot: OpenSlot) -> Connected {
    let gauge = cluster.metrics.open_connections.clone();
    gauge.inc();
    slot.gauge = Some(gauge);
    slot.idle_gauge = Some(cluster.metrics.idle_connections.clone());
    Connected::H1(Conn::new(h1::Connection::new(io, slot), server.clone()))
}

/// hyper's HTTP/2 client handshake; a local task drives the connection.
async fn handshake_h2<T>(
    cluster: &Cluster,
    io: T,
    h2_streams: usize,
    mut slot: OpenSlot,
) -> Result<Connected, Error>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = http2::Builder::new(LocalExec)
        .initial_max_send_streams(h2_streams)
        .handshake::<_, RequestBody>(TokioIo::new(io))
        .await
        .map_err(|e| Error::new(Kind::Connect, "origin h2 handshake failed").with_source(e))?;
    // The connection task owns the connection; the pool reads the origin's current
    // stream limit through a weak handle between polls.
    let conn = Rc::new(RefCell::new(Box::pin(conn)));
    let weak = Rc::downgrade(&conn);
    let limit: StreamLimit = Box::new(move || {
        let c = weak.upgrade()?;
        let c = c.try_borrow().ok()?;
        Some(c.current_max_send_streams())
    });
    let gauge = cluster.metrics.open_connections.clone();
    gauge.inc();
    slot.gauge = Some(gauge);
    tokio::task::spawn_local(async move {
        let _slot = slot; // released when the connection ends
        let _ = std::future::poll_fn(|cx| conn.borrow_mut().as_mut().poll(cx)).await;
    });
    Ok(Connected::H2(H2Conn::new(sender, limit, h2_streams)))
}

/// One open connection in a server's open-connection count (the cluster's cap), in the
/// descriptor budget and, once established, in the cluster's open-connections gauge; all
/// are released on drop.
pub(crate) struct OpenSlot {
    state: Arc<super::OriginState>,
    gauge: Option<crate::metrics::sharded::Gauge>,
    /// The cluster's idle-connections gauge, which the idle pool moves (HTTP/1.1 only).
    idle_gauge: Option<crate::metrics::sharded::Gauge>,
    descriptor: Option<Descriptor>,
}

impl OpenSlot {
    pub(crate) fn idle_gauge(&self) -> Option<&crate::metrics::sharded::Gauge> {
        self.idle_gauge.as_ref()
    }
}

impl Drop for OpenSlot {
    fn drop(&mut self) {
        self.state.open_connections.fetch_sub(1, Ordering::AcqRel);
        if let Some(g) = &self.gauge {
            g.dec();
        }
    }
}
