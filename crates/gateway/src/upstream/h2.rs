//! Outbound HTTP/2: a few multiplexed connections per origin server, per worker.
//!
//! hyper's HTTP/2 `SendRequest` is cheap to clone, so a request *leases* a stream on a
//! shared connection instead of taking the connection out of a pool. A worker keeps, per
//! origin server, the connections it opened and how many streams each carries; a request
//! goes to the least loaded connection below its stream limit (the cluster's
//! `pool.max_streams`, lowered by the origin's SETTINGS_MAX_CONCURRENT_STREAMS), and a new
//! connection is opened only when all are saturated. Requests that arrive while a
//! connection is being opened wait for it rather than each opening their own. At the
//! cluster's connection cap, requests share the least loaded connection (hyper then queues
//! streams the origin has no room for: backpressure, not failure).
//!
//! A connection that received GOAWAY is closed for new requests (hyper's `is_closed`), so the
//! next request opens a new one, while the streams already on it finish. A request hyper
//! hands back unsent is retried by the proxy stage on a fresh connection.

use http::{Request, Response, Uri, Version};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper::client::conn::TrySendError;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::conn::{Conn, Sender};
use super::connect::{connect, Connected};
use super::{Cluster, OriginServer};
use crate::body::RequestBody;
use keymaster_config::UpstreamProtocol;
use keymaster_http::error::{Error, Kind};

/// Reads a connection's current SETTINGS_MAX_CONCURRENT_STREAMS from the origin; `None`
/// once the connection is gone (or while its task is being polled).
pub(crate) type StreamLimit = Box<dyn Fn() -> Option<usize>>;

/// One HTTP/2 connection to an origin server, shared by the requests on this worker.
pub(crate) struct H2Conn {
    pub(crate) sender: http2::SendRequest<RequestBody>,
    /// Streams in flight.
    active: Cell<usize>,
    /// Requests sent so far (for `max_requests_per_connection`).
    requests: Cell<u64>,
    /// The origin's SETTINGS_MAX_CONCURRENT_STREAMS, asked afresh at each lease.
    limit: StreamLimit,
    /// The last value `limit` gave.
    last_limit: Cell<usize>,
    /// When the last stream ended (for the idle timeout).
    idle_since: Cell<Instant>,
    /// No new streams: the request limit was reached.
    retired: Cell<bool>,
}

impl H2Conn {
    pub(crate) fn new(
        sender: http2::SendRequest<RequestBody>,
        limit: StreamLimit,
        initial: usize,
    ) -> Self {
        H2Conn {
            sender,
            active: Cell::new(0),
            requests: Cell::new(0),
            limit,
            last_limit: Cell::new(initial),
            idle_since: Cell::new(Instant::now()),
            retired: Cell::new(false),
        }
    }

    fn max_send(&self) -> usize {
        if let Some(n) = (self.limit)() {
            self.last_limit.set(n);
        }
        self.last_limit.get()
    }

    fn usable(&self) -> bool {
        !self.retired.get() && !self.sender.is_closed()
    }
}

/// One stream's claim on an [`H2Conn`]; gives the stream back when the exchange ends.
pub(crate) struct Lease {
    conn: Rc<H2Conn>,
    gauge: crate::metrics::sharded::Gauge,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let n = self.conn.active.get().saturating_sub(1);
        self.conn.active.set(n);
        if n == 0 {
            self.conn.idle_since.set(Instant::now());
        }
        self.gauge.dec();
    }
}

#[derive(Default)]
struct OriginConns {
    conns: Vec<Rc<H2Conn>>,
    /// Connects in progress.
    connecting: usize,
    /// An `auto` origin negotiated h2 (then requests wait for a connect in progress).
    speaks_h2: bool,
    idle_timeout: Duration,
    /// The stream limit the origin last advertised: a new connection assumes it until its
    /// own SETTINGS arrive, so a burst does not overrun a small origin limit.
    learned_streams: Option<usize>,
}

/// A worker's HTTP/2 connections, by origin id.
#[derive(Default)]
pub(crate) struct H2Pools {
    by_origin: RefCell<Vec<OriginConns>>,
    /// Woken when a connect finishes (successfully or not).
    connected: Notify,
}

impl H2Pools {
    /// Whether requests to `server` take the HTTP/2 path.
    pub(crate) fn wants_h2(&self, server: &OriginServer) -> bool {
        match server.protocol {
            UpstreamProtocol::H2 => true,
            UpstreamProtocol::Http1 => false,
            UpstreamProtocol::Auto => self
                .by_origin
                .borrow()
                .get(server.state.id)
                .is_some_and(|o| o.speaks_h2),
        }
    }

    fn with<R>(&self, id: usize, f: impl FnOnce(&mut OriginConns) -> R) -> R {
        let mut all = self.by_origin.borrow_mut();
        if all.len() <= id {
            all.resize_with(id + 1, OriginConns::default);
        }
        f(&mut all[id])
    }

    /// A stream on the least loaded usable connection; with `saturated_ok`, even one at its
    /// stream limit.
    fn lease(
        &self,
        cluster: &Cluster,
        server: &Arc<OriginServer>,
        saturated_ok: bool,
    ) -> Option<Conn> {
        let pool = &cluster.config.pool;
        let cap = pool.max_streams.max(1);
        let c = self.with(server.state.id, |o| {
            o.conns.retain(|c| c.usable());
            if let Some(m) = o.conns.iter().map(|c| c.max_send()).min() {
                o.learned_streams = Some(m);
            }
            o.conns
                .iter()
                .filter(|c| saturated_ok || c.active.get() < cap.min(c.max_send().max(1)))
                .min_by_key(|c| c.active.get())
                .cloned()
        })?;
        c.active.set(c.active.get() + 1);
        let requests = c.requests.get() + 1;
        c.requests.set(requests);
        if pool.max_requests_per_connection != 0 && requests >= pool.max_requests_per_connection {
            c.retired.set(true);
        }
        cluster.metrics.h2_streams.inc();
        Some(Conn {
            sender: Sender::H2(c.sender.clone()),
            server: server.clone(),
            // Streams before this one: the proxy stage counts this one when it sends.
            requests: requests - 1,
            _stream: Some(Lease {
                conn: c,
                gauge: cluster.metrics.h2_streams.clone(),
            }),
            head_timer: None,
        })
    }

    /// A stream to `server`: on a connection with room, else on a new connection (waiting
    /// for one being opened). Returns the connection and whether it existed before.
    pub(crate) async fn checkout(
        &self,
        cluster: &Cluster,
        server: &Arc<OriginServer>,
        timeout: Duration,
    ) -> Result<(Conn, bool), Error> {
        let id = server.state.id;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(c) = self.lease(cluster, server, false) {
                return Ok((c, true));
            }
            if self.with(id, |o| o.connecting) > 0 {
                // A connect is under way: its connection will have room for us.
                let wait = self.connected.notified();
                if tokio::time::timeout_at(deadline, wait).await.is_err() {
                    return Err(Error::new(
                        Kind::ConnectTimeout,
                        "connect to origin timed out",
                    ));
                }
                continue;
            }
            self.with(id, |o| o.connecting += 1);
            let _done = ConnectDone { pools: self, id };
            let left = deadline.saturating_duration_since(Instant::now());
            let cap = cluster.config.pool.max_streams.max(1);
            let streams = self.with(id, |o| o.learned_streams.map_or(cap, |l| l.clamp(1, cap)));
            return match connect(cluster, server, left, streams, None, None).await {
                Ok(Connected::H2(conn)) => self.adopt(cluster, server, conn),
                // An `auto` origin chose HTTP/1.1.
                Ok(Connected::H1(conn)) => Ok((conn, false)),
                Err(e) if e.is_internal() => {
                    // At the connection cap: share the least loaded connection.
                    self.lease(cluster, server, true)
                        .map(|c| (c, true))
                        .ok_or(e)
                }
                Err(e) => Err(e),
            };
        }
    }

    /// Add a new connection to `server` and lease its first stream.
    pub(crate) fn adopt(
        &self,
        cluster: &Cluster,
        server: &Arc<OriginServer>,
        conn: H2Conn,
    ) -> Result<(Conn, bool), Error> {
        let idle = cluster.config.pool.idle_timeout.get();
        self.with(server.state.id, |o| {
            o.speaks_h2 = true;
            o.idle_timeout = idle;
            o.conns.push(Rc::new(conn));
        });
        self.lease(cluster, server, true)
            .map(|c| (c, false))
            .ok_or_else(|| Error::new(Kind::OriginReset, "origin closed the connection"))
    }

    /// Close connections idle past their origin's idle timeout, and every connection to an
    /// origin the running config no longer has (in-flight streams keep theirs).
    pub(crate) fn sweep(&self, now: Instant, live: &impl Fn(usize) -> bool) {
        for (id, o) in self.by_origin.borrow_mut().iter_mut().enumerate() {
            if !live(id) {
                o.conns.clear();
                continue;
            }
            let idle = o.idle_timeout;
            o.conns.retain(|c| {
                c.usable()
                    && (c.active.get() > 0
                        || now.saturating_duration_since(c.idle_since.get()) < idle)
            });
        }
    }

    /// Drop every connection (graceful shutdown; streams in flight hold their own handle).
    pub(crate) fn clear(&self) {
        self.by_origin.borrow_mut().clear();
    }
}

/// Ends a connect attempt: lowers the in-progress count and wakes the requests waiting.
struct ConnectDone<'a> {
    pools: &'a H2Pools,
    id: usize,
}

impl Drop for ConnectDone<'_> {
    fn drop(&mut self) {
        self.pools
            .with(self.id, |o| o.connecting = o.connecting.saturating_sub(1));
        self.pools.connected.notify_waiters();
    }
}

/// Send `req` as an HTTP/2 request: the target becomes `:scheme`, `:authority` (from Host)
/// and `:path`, and Host itself is dropped (RFC 9113 §8.3.1). hyper strips the
/// connection-specific fields and any `TE` but `trailers`, and declares the body's length
/// from the body.
pub(crate) async fn send(
    sender: &mut http2::SendRequest<RequestBody>,
    server: &OriginServer,
    mut req: Request<RequestBody>,
) -> Result<Response<Incoming>, TrySendError<Request<RequestBody>>> {
    let scheme = if server.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let authority = req
        .headers_mut()
        .remove(http::header::HOST)
        .unwrap_or_else(|| server.authority.clone());
    let pq = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let uri = authority.to_str().ok().and_then(|a| {
        Uri::builder()
            .scheme(scheme)
            .authority(a)
            .path_and_query(pq)
            .build()
            .ok()
    });
    if let Some(uri) = uri {
        *req.uri_mut() = uri;
    } else if let Ok(uri) = Uri::builder()
        .scheme(scheme)
        .authority(server.label.as_ref())
        .path_and_query(pq)
        .build()
    {
        *req.uri_mut() = uri;
    }
    *req.version_mut() = Version::HTTP_2;
    // As over HTTP/1.1 (`h1::encode`), never a length a filter or an edit may have changed.
    req.headers_mut().remove(http::header::CONTENT_LENGTH);
    sender.try_send_request(req).await
}
