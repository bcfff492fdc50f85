//! Opening an upstream connection: TCP connect within the connect timeout, hyper's HTTP/1
//! client handshake, and a local task that drives the connection and keeps the open count.

use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

use super::pool::Conn;
use super::{Cluster, OriginServer};
use crate::body::RequestBody;
use crate::error::{Error, Kind};

/// Connect to `server`, honouring the cluster's per-server connection cap.
/// `proxy_header`: a PROXY protocol header to send first (the cluster's `proxy_protocol`).
pub(crate) async fn connect(
    cluster: &Cluster,
    server: &Arc<OriginServer>,
    timeout: Duration,
    proxy_header: Option<&[u8]>,
) -> Result<Conn, Error> {
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
    let mut tcp = match tokio::time::timeout(timeout, TcpStream::connect(state.addr)).await {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(e)) => {
            cluster.metrics.connect_failures.inc();
            return Err(Error::new(Kind::Connect, "connect to origin failed").with_source(e));
        }
        Err(_) => {
            cluster.metrics.connect_failures.inc();
            return Err(Error::new(
                Kind::ConnectTimeout,
                "connect to origin timed out",
            ));
        }
    };
    let _ = tcp.set_nodelay(true);
    if let Some(h) = proxy_header {
        use tokio::io::AsyncWriteExt;
        tcp.write_all(h).await.map_err(|e| {
            Error::new(Kind::Connect, "sending the PROXY header failed").with_source(e)
        })?;
    }
    let (sender, driver) = http1::Builder::new()
        .max_buf_size(1024 * 1024)
        .handshake::<_, RequestBody>(TokioIo::new(tcp))
        .await
        .map_err(|e| Error::new(Kind::Connect, "origin handshake failed").with_source(e))?;
    let open_gauge = cluster.metrics.open_connections.clone();
    open_gauge.inc();
    tokio::task::spawn_local(async move {
        let _slot = slot; // released when the connection ends
        let _ = driver.with_upgrades().await; // a 101 hands the socket to a tunnel
        open_gauge.dec();
    });
    Ok(Conn::new(sender, server.clone()))
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
