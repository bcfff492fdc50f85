//! The downstream (client) side: listeners, the accept loop, and serving one client
//! connection: HTTP/1.1 with keymaster's own server ([`h1`]), HTTP/2 (h2c prior knowledge,
//! the h2 preface detected on `auto` listeners, or ALPN on TLS) with hyper's.
//!
//! Each worker thread binds its own `SO_REUSEPORT` socket per listener, so the kernel
//! spreads connections across workers with no shared accept lock (or, with `reuse_port =
//! false`, every worker accepts from the listener's one socket). Before the first request
//! and whenever no request is in flight, the client must finish a request head within
//! `header_read_timeout` of its first byte (slowloris) and must not sit idle past
//! `idle_timeout`: [`ConnState`] keeps the deadline, which the HTTP/1.1 server reads
//! directly and [`TimedIo`] enforces under hyper's HTTP/2 server (and under the admin
//! listener's hyper HTTP/1.1 server). A response write that
//! makes no progress for `send_timeout` (a client that stopped reading) resets the
//! connection: `h1`'s writer and [`SendClock`] under HTTP/2.

mod accept;
pub(crate) mod h1;
mod retire;
mod timed;

pub(crate) use accept::{accept_loop, OpenGuard};

pub(crate) use retire::RetirePolicy;
use retire::{Retire, Retired, StreamCount};
use timed::TaskSleep;
pub(crate) use timed::{SendClock, TimedIo};

use crossbeam_utils::CachePadded;
use http::header::HeaderName;
use hyper::rt::{Read, Write};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use crate::metrics::ListenerMetrics;
use crate::tls::ListenerTls;
use crate::worker::Worker;
use keymaster_config::{ListenerConfig, ListenerProtocol};
use keymaster_http::headers::{ClientFacts, HeadLimits};
use keymaster_http::io::{Io, Upgraded};

/// `name` as a header name with a `'static` spelling: the request path clones the
/// request-id name into each request sent, and a clone of a name parsed at run time counts
/// a reference that every worker shares, where a `'static` one copies a pointer. Each
/// distinct name is leaked once (a process has a handful).
fn static_header_name(name: &str) -> Result<HeaderName, http::header::InvalidHeaderName> {
    static NAMES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let parsed = HeaderName::from_bytes(name.as_bytes())?;
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let spelled = match names.iter().find(|n| **n == parsed.as_str()) {
        Some(n) => *n,
        None => {
            let leaked: &'static str = Box::leak(parsed.as_str().into());
            names.push(leaked);
            leaked
        }
    };
    // `from_bytes` gave the lowercase spelling `from_static` requires.
    Ok(HeaderName::from_static(spelled))
}

/// A worker's handle on a listener's settings: each connection and request holds one (a
/// count in the worker's own memory), where holding the shared `Arc` would write its one
/// reference count from every worker.
pub(crate) type WorkerListener = Rc<Arc<ListenerCtx>>;

/// A listener's settings, shared by its sockets on every worker.
pub(crate) struct ListenerCtx {
    pub(crate) name: String,
    pub(crate) protocol: ListenerProtocol,
    pub(crate) limits: HeadLimits,
    pub(crate) header_read_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    /// How long a response write may make no progress before the connection is reset.
    pub(crate) send_timeout: Duration,
    pub(crate) max_connections: usize,
    /// Connections open on every worker (for `max_connections`): on a line of its own,
    /// since each connection writes it and each request reads the fields around it.
    pub(crate) open: CachePadded<AtomicUsize>,
    pub(crate) trusted: Vec<ipnet::IpNet>,
    pub(crate) forwarded_header: bool,
    pub(crate) request_id_header: HeaderName,
    /// Every client's request id is kept (`request_id_from = "any"`), not only trusted
    /// proxies'.
    pub(crate) request_id_from_any: bool,
    /// The share of requests traced unless their route says otherwise (`[traces]` on).
    pub(crate) trace_sample: f64,
    pub(crate) metrics: ListenerMetrics,
    /// TLS termination (swapped on reload); `None` for a cleartext listener.
    pub(crate) tls: Option<Arc<ListenerTls>>,
    /// PROXY protocol header before TLS/HTTP (`proxy_protocol.rs`).
    pub(crate) proxy: crate::proxy_protocol::Settings,
    /// How the request path is made canonical before routing.
    pub(crate) path: keymaster_http::path::PathPolicy,
    /// When a client connection is closed gracefully (`max_requests_per_connection`,
    /// `max_connection_age`).
    pub(crate) retire: RetirePolicy,
    /// The address clients connect to, when the listener is bound to one (not a wildcard):
    /// every connection's local address, known without a `getsockname` per connection.
    pub(crate) bound: Option<SocketAddr>,
}

impl ListenerCtx {
    pub(crate) fn new(
        cfg: &ListenerConfig,
        metrics: ListenerMetrics,
        tls: Option<Arc<ListenerTls>>,
    ) -> Result<Self, String> {
        let trusted = cfg
            .trusted_proxies
            .iter()
            .map(|t| {
                t.parse::<ipnet::IpNet>()
                    .or_else(|_| t.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                    .map_err(|e| format!("listener {}: trusted_proxies {t}: {e}", cfg.name))
            })
            .collect::<Result<_, _>>()?;
        Ok(ListenerCtx {
            name: cfg.name.clone(),
            protocol: cfg.protocol,
            limits: HeadLimits {
                max_request_line: cfg.max_request_line.get() as usize,
                max_header_bytes: cfg.max_header_bytes.get() as usize,
                max_headers: cfg.max_headers,
            },
            header_read_timeout: cfg.header_read_timeout.get(),
            idle_timeout: cfg.idle_timeout.get(),
            send_timeout: cfg.send_timeout.get(),
            max_connections: cfg.max_connections,
            open: CachePadded::new(AtomicUsize::new(0)),
            trusted,
            forwarded_header: cfg.forwarded_header,
            request_id_from_any: cfg.request_id_from == keymaster_config::RequestIdFrom::Any,
            trace_sample: cfg.trace_sample,
            request_id_header: static_header_name(&cfg.request_id_header)
                .map_err(|e| format!("listener {}: request_id_header: {e}", cfg.name))?,
            metrics,
            tls,
            proxy: crate::proxy_protocol::Settings::new(
                cfg.proxy_protocol,
                &cfg.proxy_protocol_from,
            )
            .map_err(|e| format!("listener {}: {e}", cfg.name))?,
            path: keymaster_http::path::PathPolicy::new(&cfg.path),
            retire: RetirePolicy {
                max_requests: cfg.max_requests_per_connection,
                max_age: Some(cfg.max_connection_age.get()).filter(|a| !a.is_zero()),
            },
            bound: None,
        })
    }
}

/// Bind a listening socket, with `SO_REUSEPORT` when `reuse_port` (then several may share
/// an address, one per worker). Its `TCP_NODELAY` is
/// inherited by every connection it accepts (Linux copies the option to accepted sockets),
/// which saves a system call per connection.
pub(crate) fn bind_listener(
    addr: SocketAddr,
    reuse_port: bool,
) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(reuse_port)?;
    socket.set_nonblocking(true)?;
    socket.set_tcp_nodelay(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// Per-connection state shared by the IO wrapper and the requests on the connection.
///
/// Atomics (all on one worker thread, so uncontended) rather than `Cell`s: hyper hands an
/// upgraded connection (WebSocket) out as a `Send` object, so the IO wrapper that holds this
/// state must be `Send`. Instants are stored as nanoseconds since `base`.
///
/// Laid out in order (`repr(C)`): what every request reads or writes comes first, so that
/// with the `Arc`'s counts it fills one cache line, the one line of this state a request
/// on an idle connection finds cold (asserted below).
#[repr(C)]
pub(crate) struct ConnState {
    inflight: AtomicU32,
    /// True between requests: the next byte read starts a request head.
    idle: AtomicBool,
    /// HTTP/1: bytes after an idle period start a request head (the slowloris clock). Not
    /// for HTTP/2, whose control frames (PING, WINDOW_UPDATE, SETTINGS) arrive between
    /// streams and must not turn an idle connection's timeout into the header timeout.
    head_clock: bool,
    /// The idle timeout is shorter than the header-read timeout: a parked read may have to
    /// be woken for the idle deadline ([`Self::reader`]).
    short_idle: bool,
    /// When the connection was accepted (its age counts from here).
    base: Instant,
    /// When the latest request started.
    last_request: AtomicU64,
    /// When a connection with no request in flight times out.
    deadline: AtomicU64,
    /// The idle timeout, in nanoseconds.
    idle_nanos: u64,
    header_timeout: Duration,
    /// When the connection's timer is armed to fire. The timer is lazy: it is moved only when
    /// the deadline comes earlier; a later deadline is picked up when the timer fires.
    armed: AtomicU64,
    /// The connection task, parked in a read: woken when the last request in flight
    /// finishes and the idle deadline is earlier than the armed timer (only with
    /// `short_idle`, the only case it is kept in).
    reader: Mutex<Option<std::task::Waker>>,
}

// The fields every request touches end within the first 48 bytes: with the `Arc`'s two
// counts before them, one cache line.
const _: () = assert!(std::mem::offset_of!(ConnState, idle_nanos) + 8 <= 48);

impl ConnState {
    pub(crate) fn new(
        now: Instant,
        head_clock: bool,
        header_timeout: Duration,
        idle: Duration,
    ) -> Self {
        let first = header_timeout.as_nanos() as u64;
        ConnState {
            inflight: AtomicU32::new(0),
            idle: AtomicBool::new(false),
            head_clock,
            short_idle: idle < header_timeout,
            base: now,
            last_request: AtomicU64::new(0),
            deadline: AtomicU64::new(first),
            idle_nanos: idle.as_nanos() as u64,
            header_timeout,
            armed: AtomicU64::new(first),
            reader: Mutex::new(None),
        }
    }
    fn to_nanos(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos() as u64
    }
    fn at(&self, nanos: u64) -> Instant {
        self.base + Duration::from_nanos(nanos)
    }
    fn deadline(&self) -> u64 {
        self.deadline.load(Ordering::Relaxed)
    }
    /// When a connection with no request in flight times out: the header-read deadline
    /// before the first request, the idle deadline after each response.
    pub(crate) fn deadline_at(&self) -> Instant {
        self.at(self.deadline())
    }
    fn set_deadline(&self, t: Instant) {
        self.deadline.store(self.to_nanos(t), Ordering::Relaxed);
    }
    fn set_reader(&self, w: Option<std::task::Waker>) -> Option<std::task::Waker> {
        match self.reader.lock() {
            Ok(mut r) => std::mem::replace(&mut *r, w),
            Err(p) => std::mem::replace(&mut *p.into_inner(), w),
        }
    }
    /// A request started at `at`.
    pub(crate) fn request_started(&self, at: Instant) {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        self.last_request
            .store(self.to_nanos(at), Ordering::Relaxed);
    }
    /// The connection's age when its latest request started.
    pub(crate) fn age_at_last_request(&self) -> Duration {
        Duration::from_nanos(self.last_request.load(Ordering::Relaxed))
    }
    /// When the connection was accepted.
    pub(crate) fn opened(&self) -> Instant {
        self.base
    }
    /// A request's response is done (`now` is when it finished).
    pub(crate) fn request_finished(&self, now: Instant) {
        let prev = self
            .inflight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            })
            .unwrap_or(0);
        if prev <= 1 {
            self.idle.store(true, Ordering::Relaxed);
            let deadline = self.to_nanos(now).saturating_add(self.idle_nanos);
            self.deadline.store(deadline, Ordering::Relaxed);
            if self.short_idle && deadline < self.armed.load(Ordering::Relaxed) {
                if let Some(w) = self.set_reader(None) {
                    w.wake();
                }
            }
        }
    }
}

/// What a request handler knows about its connection.
#[repr(C)]
pub(crate) struct ConnCtx {
    // In order (`repr(C)`): what every request reads comes first, so that with the `Rc`'s
    // counts it fills two cache lines (asserted below); a request on an idle connection
    // finds them cold.
    pub(crate) worker: Rc<Worker>,
    pub(crate) listener: WorkerListener,
    pub(crate) state: Arc<ConnState>,
    pub(crate) client: ClientFacts,
    pub(crate) peer: SocketAddr,
    /// The address the client connected to (the destination in PROXY headers to origins).
    pub(crate) local: SocketAddr,
    /// The upstream connection kept for this client alone: clusters that send a PROXY
    /// header name this client on the connection, so it is never shared through the pool.
    pub(crate) private_upstream: std::cell::RefCell<Option<crate::upstream::conn::Conn>>,
    /// The connection's slot on its listener: released when the last holder (the hyper
    /// connection, a streaming response, an upgrade tunnel) lets go of the context.
    pub(crate) _open: OpenGuard,
}

// The fields every request reads end within the first 112 bytes: with the `Rc`'s two
// counts before them, two cache lines.
const _: () =
    assert!(std::mem::offset_of!(ConnCtx, peer) + std::mem::size_of::<SocketAddr>() <= 112);

pub(crate) const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether `buf` opens with the HTTP/2 preface: `Some(true)` whole, `Some(false)` not,
/// `None` while what arrived is the start of it.
pub(crate) fn h2_preface(buf: &[u8]) -> Option<bool> {
    let n = buf.len().min(H2_PREFACE.len());
    if buf[..n] != H2_PREFACE[..n] {
        Some(false)
    } else {
        (n == H2_PREFACE.len()).then_some(true)
    }
}

/// Read and discard what a closing client still sends, at most 64 KiB, until it closes or
/// fails. The buffer is not zeroed: writing 4 KiB of zeros was a tenth of a new connection's
/// user-space instructions, for bytes that are only ever discarded.
pub(crate) async fn discard_unread<R: tokio::io::AsyncRead + Unpin>(io: &mut R) {
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    let mut left = 64 * 1024usize;
    while left > 0 {
        let mut rb = tokio::io::ReadBuf::uninit(&mut buf);
        let read = std::future::poll_fn(|task| {
            tokio::io::AsyncRead::poll_read(std::pin::Pin::new(&mut *io), task, &mut rb)
        });
        match read.await {
            Ok(()) if !rb.filled().is_empty() => left = left.saturating_sub(rb.filled().len()),
            _ => break,
        }
    }
}

/// Serve HTTP on an established client stream (cleartext or after the TLS handshake).
/// `guard` is the connection's slot on its listener and carries the worker and listener.
///
/// The context is made when this is called, not in the future: an `async fn` would keep
/// its arguments (the guard and the client's facts, 257 bytes) in every connection's task
/// for the connection's life, after they moved into the context. HTTP/1.1's future is
/// returned as it is, not awaited in a block of this function's: that block would keep
/// the socket's room (moved out) and a state of its own in every connection's task.
fn serve_io(
    guard: OpenGuard,
    stream: Io,
    h2: bool,
    client: ClientFacts,
    (peer, local): (SocketAddr, SocketAddr),
) -> impl std::future::Future<Output = ()> {
    use futures_util::future::Either;
    let cx = Rc::new(conn_ctx(guard, client, (peer, local), h2));
    if !h2 {
        return Either::Left(h1::serve(cx, stream));
    }
    // Boxed so that HTTP/1 connections, the common case, do not carry HTTP/2's state size.
    let stream = Upgraded {
        read_ahead: bytes::Bytes::new(),
        io: stream,
        _held: (),
    };
    Either::Right(Box::pin(serve_h2_conn(cx, stream)))
}

/// A connection's context; its clocks for HTTP/1.1 (`h2` false: a head's first bytes start
/// the header-read clock) or HTTP/2.
pub(crate) fn conn_ctx(
    guard: OpenGuard,
    client: ClientFacts,
    (peer, local): (SocketAddr, SocketAddr),
    h2: bool,
) -> ConnCtx {
    let listener = &guard.listener;
    let state = Arc::new(ConnState::new(
        Instant::now(),
        !h2,
        listener.header_read_timeout,
        listener.idle_timeout,
    ));
    ConnCtx {
        worker: guard.worker.clone(),
        listener: listener.clone(),
        client,
        peer,
        state,
        local,
        private_upstream: std::cell::RefCell::new(None),
        _open: guard,
    }
}

impl ConnCtx {
    /// The same connection's context with HTTP/2's clocks (an `auto` listener's connection
    /// that opened with the HTTP/2 preface).
    pub(crate) fn into_h2(self) -> ConnCtx {
        let ConnCtx {
            client,
            peer,
            local,
            _open,
            ..
        } = self;
        conn_ctx(_open, client, (peer, local), true)
    }
}

/// Serve HTTP/2 on a connection: `stream` is the socket (plain or TLS) with any bytes of
/// it already read (the preface, when HTTP/1.1's first read found it).
pub(crate) async fn serve_h2_conn(cx: Rc<ConnCtx>, stream: Upgraded) {
    let (worker, listener, state) = (cx.worker.clone(), cx.listener.clone(), cx.state.clone());
    let opened = state.opened();
    let send = SendClock::new(
        listener.send_timeout,
        Some(listener.metrics.send_timeouts.clone()),
    );
    let io = TimedIo::new(TokioIo::new(stream), state, send);
    let streams = Rc::new(StreamCount {
        served: std::cell::Cell::new(0),
        max: listener.retire.max_requests,
        reached: tokio::sync::Notify::new(),
    });
    let counted = streams.clone();
    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        counted.add();
        let req = req.map(crate::body::ClientBody::H2);
        // hyper wants the response, not its box. A map, not an `async` block: the block
        // would copy the proxy stage's (large) future into its own state.
        futures_util::FutureExt::map(crate::proxy::handle(cx.clone(), req, None), |r| {
            r.map(|resp| *resp)
        })
    });
    let retire = Retire {
        streams,
        aged: listener.retire.age_limit().map(|a| opened + a),
    };
    serve_h2(&listener, &worker, io, svc, retire).await;
}

/// Drive hyper's HTTP/2 server connection. When the worker drains or the connection reaches
/// a limit of its listener, ask it to finish gracefully (GOAWAY: no new streams, the open
/// ones finish) and keep driving it until they end.
async fn serve_h2<I, S>(listener: &ListenerCtx, worker: &Worker, io: I, svc: S, retire: Retire)
where
    I: Read + Write + Unpin + 'static,
    S: hyper::service::HttpService<hyper::body::Incoming> + 'static,
    S::ResBody: 'static,
    <S::ResBody as http_body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let conn = hyper::server::conn::http2::Builder::new(crate::runtime_thread::LocalExec)
        .max_header_list_size((listener.limits.max_header_bytes as u32).max(1024))
        // RFC 8441: WebSocket over HTTP/2 (`upgrade.rs`).
        .enable_connect_protocol()
        .serve_connection(io, svc);
    tokio::pin!(conn);
    // Polled with the connection at each of its wake-ups: a `TaskSleep` skips the polls
    // that would change nothing.
    let mut aged = retire.aged.map(TaskSleep::new);
    let aged = std::future::poll_fn(|cx| match aged.as_mut() {
        Some(sleep) => sleep.poll_elapsed(cx),
        None => std::task::Poll::Pending,
    });
    let why = tokio::select! {
        biased;
        _ = conn.as_mut() => return,
        _ = worker.drain.wait() => None,
        _ = retire.streams.reached.notified() => Some(Retired::Requests),
        _ = aged => Some(Retired::Age),
    };
    if let Some(why) = why {
        RetirePolicy::count(why, &listener.metrics);
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

#[cfg(test)]
mod tests {
    /// Connections accepted on a listening socket get its `TCP_NODELAY` without a system
    /// call of their own (`connection` relies on it).
    #[test]
    fn accepted_connections_inherit_nodelay() {
        let listener = super::bind_listener("127.0.0.1:0".parse().unwrap(), true).unwrap();
        listener.set_nonblocking(false).unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert!(accepted.nodelay().unwrap());
    }

    /// The request-id name is spelled `'static` and lowercase, once per distinct name; a
    /// name no field may have is refused.
    #[test]
    fn request_id_names_are_static_and_shared() {
        let a = super::static_header_name("X-Trace-Of-Test").unwrap();
        let b = super::static_header_name("x-trace-of-test").unwrap();
        assert_eq!(a.as_str(), "x-trace-of-test");
        assert!(
            std::ptr::eq(a.as_str(), b.as_str()),
            "one spelling per name"
        );
        assert!(super::static_header_name("bad name").is_err());
    }
}
