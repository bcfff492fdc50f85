//! Per-worker pools of idle keep-alive connections, one per origin server (keyed by the
//! process-wide [`OriginState::id`](super::OriginState)). A worker thread owns its pools
//! outright: checkout and return are a `RefCell` borrow and a `Vec` push/pop, no locks and no
//! cross-thread wakeups. Idle connections are used LIFO (warmest first) and expire after the
//! cluster's idle timeout; a sweeper closes expired ones even when no request comes.

use hyper::client::conn::http1::SendRequest;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use super::OriginServer;
use crate::body::RequestBody;

/// How many idle connections a checkout looks at before opening a new one.
const CHECKOUT_SCAN: usize = 8;

/// One upstream HTTP/1 connection.
pub(crate) struct Conn {
    pub(crate) sender: SendRequest<RequestBody>,
    pub(crate) server: Arc<OriginServer>,
    /// Requests sent on this connection so far.
    pub(crate) requests: u64,
}

impl Conn {
    pub(crate) fn new(sender: SendRequest<RequestBody>, server: Arc<OriginServer>) -> Self {
        Conn {
            sender,
            server,
            requests: 0,
        }
    }
}

struct Idle {
    conn: Conn,
    since: Instant,
    idle_timeout: Duration,
}

#[derive(Default)]
struct ServerPool {
    idle: VecDeque<Idle>,
}

/// All pools of one worker thread.
#[derive(Default)]
pub(crate) struct Pools {
    by_origin: RefCell<Vec<ServerPool>>,
}

impl Pools {
    /// Take the most recently used live idle connection to `origin_id`, if any.
    pub(crate) fn checkout(&self, origin_id: usize, now: Instant) -> Option<Conn> {
        let mut pools = self.by_origin.borrow_mut();
        let pool = pools.get_mut(origin_id)?;
        // Newest first; a connection hyper has not yet marked idle after its last exchange
        // is skipped (left in place) rather than waited for: waiting would park this request
        // behind every other task on the worker.
        let mut i = pool.idle.len();
        let mut scanned = 0;
        while i > 0 && scanned < CHECKOUT_SCAN {
            i -= 1;
            scanned += 1;
            let idle = &pool.idle[i];
            if now.saturating_duration_since(idle.since) >= idle.idle_timeout {
                // This one and all older ones are expired.
                pool.idle.drain(..=i);
                return None;
            }
            if idle.conn.sender.is_closed() {
                pool.idle.remove(i);
            } else if idle.conn.sender.is_ready() {
                return pool.idle.remove(i).map(|idle| idle.conn);
            }
        }
        None
    }

    /// Return a connection after a clean exchange; dropped if the pool is full.
    pub(crate) fn put(&self, conn: Conn, max_idle: usize, idle_timeout: Duration, now: Instant) {
        if conn.sender.is_closed() || max_idle == 0 {
            return;
        }
        let id = conn.server.state.id;
        let mut pools = self.by_origin.borrow_mut();
        if pools.len() <= id {
            pools.resize_with(id + 1, ServerPool::default);
        }
        let pool = &mut pools[id];
        if pool.idle.len() >= max_idle {
            // Keep the warm ones; close the oldest.
            pool.idle.pop_front();
        }
        pool.idle.push_back(Idle {
            conn,
            since: now,
            idle_timeout,
        });
    }

    /// Close idle connections past their idle timeout, already closed by the origin, or to
    /// a server the running config no longer has (`live(origin id)` is false: removed by
    /// service discovery or a reload).
    pub(crate) fn sweep(&self, now: Instant, live: impl Fn(usize) -> bool) {
        let mut pools = self.by_origin.borrow_mut();
        for (id, pool) in pools.iter_mut().enumerate() {
            if !live(id) {
                pool.idle.clear();
                continue;
            }
            pool.idle.retain(|i| {
                now.saturating_duration_since(i.since) < i.idle_timeout
                    && !i.conn.sender.is_closed()
            });
        }
    }

    /// Close every idle connection (graceful shutdown).
    pub(crate) fn clear(&self) {
        self.by_origin.borrow_mut().clear();
    }
}
