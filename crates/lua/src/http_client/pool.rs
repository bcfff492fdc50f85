//! Each worker's idle `ctx.http` connections, by origin (scheme, host, port and, for TLS,
//! the trust anchors): a thread-local, so the pool needs no lock and its connections never
//! leave the worker that opened them. The newest idle connection is reused first. An idle
//! connection is dropped once its idle timeout passes (checked when the origin is next
//! used, and by a sweeper task while the pool holds any), once the server closed it, or
//! when the origin already has `max_idle` idle ones.

use bytes::Bytes;
use http_body_util::Full;
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;

/// hyper's handle on one HTTP/1.1 client connection.
pub(crate) type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// Where a connection goes: connections are shared only within one origin.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Origin {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// Identifies the trust anchors a TLS connection was verified against (0 in cleartext).
    pub trust: u64,
}

/// An open connection and the address it is connected to.
pub(crate) struct Conn {
    pub sender: Sender,
    pub peer: SocketAddr,
}

struct Idle {
    conn: Conn,
    /// When the connection stops being reusable.
    until: Instant,
}

#[derive(Default)]
struct Pool {
    idle: HashMap<Origin, Vec<Idle>>,
    /// A sweeper task is running for this worker's pool.
    sweeping: bool,
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool::default());
}

/// The newest idle connection to `origin` that is still open and within its idle timeout
/// (the others on the way are dropped).
pub(crate) fn take(origin: &Origin) -> Option<Conn> {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let list = p.idle.get_mut(origin)?;
        let now = Instant::now();
        let mut found = None;
        while let Some(i) = list.pop() {
            if i.until > now && !i.conn.sender.is_closed() {
                found = Some(i.conn);
                break;
            }
        }
        if list.is_empty() {
            p.idle.remove(origin);
        }
        found
    })
}

/// Keep `conn` for reuse for `idle_timeout`; past `max_idle` idle connections to `origin`,
/// the oldest is dropped.
pub(crate) fn put(origin: Origin, conn: Conn, idle_timeout: Duration, max_idle: usize) {
    if max_idle == 0 || conn.sender.is_closed() {
        return;
    }
    let start = POOL.with(|p| {
        let mut p = p.borrow_mut();
        let list = p.idle.entry(origin).or_default();
        list.push(Idle {
            conn,
            until: Instant::now() + idle_timeout,
        });
        if list.len() > max_idle {
            list.remove(0);
        }
        !p.sweeping && on_this_thread()
    });
    if start {
        POOL.with(|p| p.borrow_mut().sweeping = true);
        tokio::spawn(sweeper());
    }
}

/// Whether a task spawned now runs on this thread: a worker's runtime is current-thread.
/// Elsewhere (a multi-thread runtime) idle connections expire when their origin is next
/// used.
fn on_this_thread() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
}

/// Drops expired and closed idle connections; the earliest deadline of those left.
fn sweep() -> Option<Instant> {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let now = Instant::now();
        p.idle.retain(|_, list| {
            list.retain(|i| i.until > now && !i.conn.sender.is_closed());
            !list.is_empty()
        });
        let next = p.idle.values().flatten().map(|i| i.until).min();
        if next.is_none() {
            p.sweeping = false;
        }
        next
    })
}

/// Runs on the worker (a current-thread runtime) while its pool holds idle connections, so
/// they close at their idle timeout even when their origin is not called again.
async fn sweeper() {
    while let Some(next) = sweep() {
        // At most a second late, so closed connections go soon too.
        tokio::time::sleep_until(next.min(Instant::now() + Duration::from_secs(1))).await;
    }
}
