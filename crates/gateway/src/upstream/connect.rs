//! Opening an upstream connection: TCP connect and, for TLS clusters, the TLS handshake,
//! together within the connect timeout; then hyper's HTTP/1 or HTTP/2 client handshake
//! (HTTP/2 when the cluster says `h2`, or ALPN chose it for `auto`), and a local task that
//! drives the connection and keeps the open count.

use hyper::client::conn::{http1, http2};
use hyper_util::rt::TokioIo;
use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::h2::{H2Conn, LocalExec, StreamLimit};
use super::pool::Conn;
use super::{Cluster, OriginServer};
use crate::body::RequestBody;
use crate::error::{Error, Kind};
use keymaster_config::UpstreamProtocol;

/// A new connection: HTTP/1.1 (one request at a time) or HTTP/2 (multiplexed).
pub(crate) enum Connected {
    H1(Conn),
    H2(H2Conn),
}

/// Connect to `server`, honouring the cluster's per-server connection cap. `timeout`
/// covers TCP and TLS. `h2_streams`: the stream limit assumed for a new HTTP/2 connection
/// until the origin's SETTINGS arrive. `proxy_header`: a PROXY protocol header to send
/// first, before any TLS (the cluster's `proxy_protocol`).
pub(crate) async fn connect(
    cluster: &Cluster,
    server: &Arc<OriginServer>,
    timeout: Duration,
    h2_streams: usize,
    proxy_header: Option<&[u8]>,
) -> Result<Connected, Error> {
    let state = &server.state;
    let cap = cluster.config.pool.max_connections;
    // Reserve a slot first so concurrent connects cannot overshoot the cap.
    let open = state.open_connections.fetch_add(1, Ordering::AcqRel);
    if cap != 0 && open >= cap {
        state.open_connections.fetch_sub(1, Ordering::AcqRel);
        return Err(Error::new(Kind::PoolFull, "origin connection cap reached"));
    }
    let slot = OpenSlot(Some(state.clone()));
    cluster.metrics.connect_attempts.inc();
    let opened =
        match tokio::time::timeout(timeout, open_transport(cluster, server, proxy_header)).await {
            Ok(r) => r,
            Err(_) => Err(Error::new(
                Kind::ConnectTimeout,
                "connect to origin timed out",
            )),
        };
    let transport = opened.inspect_err(|_| cluster.metrics.connect_failures.inc())?;
    match transport {
        Transport::Plain(tcp) => {
            let h2 = server.protocol == UpstreamProtocol::H2;
            handshake(cluster, server, tcp, h2, h2_streams, slot).await
        }
        Transport::Tls(tls, alpn_h2) => {
            let h2 = match server.protocol {
                UpstreamProtocol::H2 if !alpn_h2 => {
                    cluster.metrics.connect_failures.inc();
                    return Err(Error::new(
                        Kind::OriginProtocol,
                        "origin did not agree to h2 by ALPN",
                    ));
                }
                UpstreamProtocol::H2 => true,
                UpstreamProtocol::Http1 => false,
                UpstreamProtocol::Auto => alpn_h2,
            };
            handshake(cluster, server, *tls, h2, h2_streams, slot).await
        }
    }
}

enum Transport {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>, bool),
}

/// TCP, the PROXY header if any, then TLS when the cluster has it.
async fn open_transport(
    cluster: &Cluster,
    server: &OriginServer,
    proxy_header: Option<&[u8]>,
) -> Result<Transport, Error> {
    let mut tcp = TcpStream::connect(server.state.addr)
        .await
        .map_err(|e| Error::new(Kind::Connect, "connect to origin failed").with_source(e))?;
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
            cluster.metrics.tls_failures.inc();
            Err(Error::new(Kind::OriginTls, "TLS handshake with origin failed").with_source(e))
        }
    }
}

async fn handshake<T>(
    cluster: &Cluster,
    server: &Arc<OriginServer>,
    io: T,
    h2: bool,
    h2_streams: usize,
    slot: OpenSlot,
) -> Result<Connected, Error>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let open_gauge = cluster.metrics.open_connections.clone();
    if h2 {
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
        open_gauge.inc();
        tokio::task::spawn_local(async move {
            let _slot = slot; // released when the connection ends
            let _ = std::future::poll_fn(|cx| conn.borrow_mut().as_mut().poll(cx)).await;
            open_gauge.dec();
        });
        return Ok(Connected::H2(H2Conn::new(sender, limit, h2_streams)));
    }
    let (sender, driver) = http1::Builder::new()
        .max_buf_size(1024 * 1024)
        .handshake::<_, RequestBody>(TokioIo::new(io))
        .await
        .map_err(|e| Error::new(Kind::Connect, "origin handshake failed").with_source(e))?;
    open_gauge.inc();
    tokio::task::spawn_local(async move {
        let _slot = slot; // released when the connection ends
        let _ = driver.with_upgrades().await; // a 101 hands the socket to a tunnel
        open_gauge.dec();
    });
    Ok(Connected::H1(Conn::new(sender, server.clone())))
}

/// Releases one unit of a server's open-connection count on drop.
struct OpenSlot(Option<Arc<super::OriginState>>);

impl Drop for OpenSlot {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            s.open_connections.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
