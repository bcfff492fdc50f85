//! Per-worker pools of idle keep-alive connections, one per origin server (keyed by the
//! process-wide [`OriginState::id`](super::OriginState)). A worker thread owns its pools
//! outright: checkout and return are a `RefCell` borrow and a `Vec` push/pop, no locks and no
//! cross-thread wakeups. Idle connections are used LIFO (warmest first) and expire after the
//! cluster's idle timeout; a sweeper closes expired ones even when no request comes, a few
//! at a time (closing a connection costs the worker tens of microseconds, and the
//! connections a burst opened expire together).
//! HTTP/2 connections are shared rather than checked out: see [`super::h2`], whose pools
//! live here too so the worker sweeps and clears both.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use super::conn::Conn;
use super::connect::{connect, Connected};
use super::h2::H2Pools;
use super::waiters::Waiters;
use super::{Cluster, OriginServer};
use crate::descriptors::{self, Descriptor};
use keymaster_http::error::{Error, Kind};

/// How many idle connections a checkout looks at before opening a new one.
const CHECKOUT_SCAN: usize = 8;

/// How many swept connections are closed before the sweeper lets the worker's other tasks
/// run: each close is a system call and the origin's FIN through the loopback or the NIC's
/// queue, about 17 µs here, and 821 closed at once held every request behind them for 14 ms.
const CLOSE_BATCH: usize = 16;

/// A connection for one request to `server`: for HTTP/2 a stream on a shared connection;
/// for HTTP/1.1 a pooled idle connection (when `reuse`) or a new one. Returns whether the
/// connection was used before (a failure on it may be the keep-alive race). With a PROXY
/// protocol header the connection is new and HTTP/1.1, never from the shared pools (it
/// belongs to one client connection; validation keeps such clusters on `http1`).
///
/// Connecting and HTTP/2 checkout are boxed: their states (TCP, TLS and HTTP handshakes) are
/// large, and inline they would size every client connection's request future (kept for the
/// connection's life by hyper), while a pooled HTTP/1.1 connection, the common case, needs
/// none of it.
pub(crate) async fn checkout(
    pools: &Pools,
    cluster: &Cluster,
    server: &Arc<OriginServer>,
    timeout: Duration,
    reuse: bool,
    proxy_header: Option<&[u8]>,
) -> Result<(Conn, bool), Error> {
    let streams = cluster.config.pool.max_streams;
    if let Some(h) = proxy_header {
        let (descriptor, timeout) = match descriptor(pools, cluster, server, false, timeout).await?
        {
            Got::Descriptor(d, left) => (d, left),
            Got::Pooled(c) => return Ok((c, true)), // only with `reuse`
        };
        let connected = connect(cluster, server, timeout, streams, Some(h), Some(descriptor));
        return match Box::pin(connected).await? {
            Connected::H1(c) => Ok((c, false)),
            Connected::H2(_) => Err(Error::new(
                Kind::OriginProtocol,
                "HTTP/2 connections are shared and cannot carry one client's PROXY header",
            )),
        };
    }
    if pools.h2.wants_h2(server) {
        return Box::pin(pools.h2.checkout(cluster, server, timeout)).await;
    }
    if reuse {
        if let Some(c) = pools.checkout(server.state.id, Instant::now()) {
            return Ok((c, true));
        }
    }
    let (descriptor, timeout) = match descriptor(pools, cluster, server, reuse, timeout).await? {
        Got::Descriptor(d, left) => (d, left),
        Got::Pooled(c) => return Ok((c, true)),
    };
    match Box::pin(connect(
        cluster,
        server,
        timeout,
        streams,
        None,
        Some(descriptor),
    ))
    .await?
    {
        Connected::H1(c) => Ok((c, false)),
        Connected::H2(c) => {
            // An `auto` origin negotiated h2 on its first connection: share it from now on.
            pools.h2.adopt(cluster, server, c)
        }
    }
}

/// What a request that needs a new connection got from the descriptor budget.
enum Got {
    /// A place for the connection, and what is left of the connect timeout.
    Descriptor(Descriptor, Duration),
    /// While it waited, an idle connection to its server that another request of this
    /// worker gave back (only with `reuse`).
    Pooled(Conn),
}

/// A place in the descriptor budget for a new connection to `server`, waiting for one
/// within `timeout` when the budget is spent or requests of this worker already wait
/// (behind them). The wait is boxed: its state is needed only when descriptors run short.
async fn descriptor(
    pools: &Pools,
    cluster: &Cluster,
    server: &OriginServer,
    reuse: bool,
    timeout: Duration,
) -> Result<Got, Error> {
    if pools.waiters.is_empty() {
        if let Some(d) = descriptors::budget().origin() {
            return Ok(Got::Descriptor(d, timeout));
        }
    }
    cluster.metrics.descriptor_waits.inc();
    Box::pin(pools.wait_for_descriptor(server, reuse, Instant::now() + timeout)).await
}

/// An idle connection, counted in its cluster's idle-connections gauge from the moment it
/// enters the pool until it leaves it, whichever way (checked out, expired, found closed,
/// pushed out by a full pool, swept): dropping an `Idle` uncounts it.
struct Idle {
    /// `None` once checked out.
    conn: Option<Conn>,
    since: Instant,
    idle_timeout: Duration,
}

impl Idle {
    fn new(conn: Conn, since: Instant, idle_timeout: Duration) -> Idle {
        if let Some(g) = conn.idle_gauge() {
            g.inc();
            conn.server.state.idle_connections.inc();
        }
        Idle {
            conn: Some(conn),
            since,
            idle_timeout,
        }
    }

    /// The connection, out of the pool and its count.
    fn take(mut self) -> Option<Conn> {
        self.conn.take().inspect(uncount)
    }

    fn is_closed(&mut self) -> bool {
        self.conn.as_mut().is_none_or(Conn::is_closed)
    }
}

impl Drop for Idle {
    fn drop(&mut self) {
        if let Some(c) = self.conn.as_ref() {
            uncount(c);
        }
    }
}

/// A connection leaves the idle counts.
fn uncount(c: &Conn) {
    if let Some(g) = c.idle_gauge() {
        g.dec();
        c.server.state.idle_connections.dec();
    }
}

#[derive(Default)]
struct ServerPool {
    idle: VecDeque<Idle>,
}

/// All pools of one worker thread.
#[derive(Default)]
pub(crate) struct Pools {
    by_origin: RefCell<Vec<ServerPool>>,
    /// HTTP/2 connections, shared by concurrent requests.
    pub(crate) h2: H2Pools,
    /// Requests of this worker waiting for the descriptor budget, in arrival order.
    waiters: Waiters<Conn>,
}

impl Pools {
    /// Take the most recently used live idle connection to `origin_id`, if any.
    pub(crate) fn checkout(&self, origin_id: usize, now: Instant) -> Option<Conn> {
        let mut pools = self.by_origin.borrow_mut();
        let pool = pools.get_mut(origin_id)?;
        // Newest first; closed ones are dropped on the way.
        let mut i = pool.idle.len();
        let mut scanned = 0;
        while i > 0 && scanned < CHECKOUT_SCAN {
            i -= 1;
            scanned += 1;
            let idle = &mut pool.idle[i];
            if now.saturating_duration_since(idle.since) >= idle.idle_timeout {
                // This one and all older ones are expired: the sweeper closes them, a few
                // at a time, rather than this request all at once.
                return None;
            }
            if idle.is_closed() {
                pool.idle.remove(i);
            } else if idle.conn.as_ref().is_some_and(Conn::is_ready) {
                return pool.idle.remove(i).and_then(Idle::take);
            }
        }
        None
    }

    /// Return a connection after a clean exchange: to the oldest request of this worker
    /// waiting for its server, or to the pool (a full one closes its oldest). Closed
    /// instead, which frees a descriptor, while other requests wait for descriptors (on
    /// this worker or another), or while clients wait to be accepted for want of the
    /// descriptors origin connections hold past their share.
    pub(crate) fn put(&self, conn: Conn, max_idle: usize, idle_timeout: Duration, now: Instant) {
        // An HTTP/1.1 connection in hand (given back by its response body).
        if !conn.is_h1() || !conn.is_ready() || max_idle == 0 {
            return;
        }
        let budget = descriptors::budget();
        if budget.clients_crowded() {
            return;
        }
        let Err(conn) = self.waiters.hand(conn.server.state.id, conn) else {
            return;
        };
        if !self.waiters.is_empty() || budget.pressed() {
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
        pool.idle.push_back(Idle::new(conn, now, idle_timeout));
    }

    /// Take out of the pools the idle connections past their idle timeout, already closed
    /// by the origin, to a server the running config no longer has (`live(origin id)` is
    /// false: removed by service discovery or a reload), or all of them while other
    /// workers' requests wait for descriptors or clients wait to be accepted for want of
    /// them. HTTP/2 connections are closed here (their streams in flight finish); the
    /// HTTP/1.1 ones are returned, for [`Swept::close`] to close a few at a time.
    pub(crate) fn sweep(&self, now: Instant, live: impl Fn(usize) -> bool) -> Swept {
        self.h2.sweep(now, &live);
        // Idle connections here free descriptors for those who wait for them elsewhere.
        let budget = descriptors::budget();
        let pressed = budget.clients_crowded() || (self.waiters.is_empty() && budget.pressed());
        let mut swept = Vec::new();
        let mut pools = self.by_origin.borrow_mut();
        for (id, pool) in pools.iter_mut().enumerate() {
            if !live(id) || pressed {
                swept.extend(pool.idle.drain(..));
                continue;
            }
            for mut i in std::mem::take(&mut pool.idle) {
                if now.saturating_duration_since(i.since) < i.idle_timeout && !i.is_closed() {
                    pool.idle.push_back(i);
                } else {
                    swept.push(i);
                }
            }
        }
        Swept(swept)
    }

    /// Wait in this worker's queue, until `deadline`, for a connection to `server`: with
    /// `reuse`, one given back by another request; or, at the head of the queue, a
    /// descriptor to open one with (one the budget gets back, or one of this worker's idle
    /// connections closed for it).
    async fn wait_for_descriptor(
        &self,
        server: &OriginServer,
        reuse: bool,
        deadline: Instant,
    ) -> Result<Got, Error> {
        let budget = descriptors::budget();
        let _counted = budget.origin_waiter();
        let ticket = self.waiters.join(server.state.id, reuse);
        loop {
            if let Some(c) = ticket.take() {
                return Ok(Got::Pooled(c));
            }
            let head = ticket.is_head();
            // Registered before looking, so that nothing freed in between is missed.
            let freed = budget.freed();
            tokio::pin!(freed);
            if head {
                freed.as_mut().enable();
                if let Some(d) = budget.origin() {
                    let left = deadline.saturating_duration_since(Instant::now());
                    return Ok(Got::Descriptor(d, left));
                }
                if self.close_oldest_idle() {
                    continue;
                }
            }
            tokio::select! {
                _ = freed, if head => {}
                _ = ticket.woken() => {}
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(Error::new(
                        Kind::NoDescriptors,
                        "out of file descriptors: no origin connection was freed within the connect timeout",
                    ));
                }
            }
        }
    }

    /// Close the idle HTTP/1.1 connection that waited longest, to any server; `false` when
    /// none is idle.
    fn close_oldest_idle(&self) -> bool {
        let mut pools = self.by_origin.borrow_mut();
        let oldest = pools
            .iter_mut()
            .filter_map(|p| p.idle.front().map(|i| i.since).zip(Some(p)))
            .min_by_key(|(since, _)| *since);
        let Some((_, pool)) = oldest else {
            return false;
        };
        drop(pool.idle.pop_front());
        true
    }

    /// Close every idle connection (graceful shutdown).
    pub(crate) fn clear(&self) {
        self.h2.clear();
        self.by_origin.borrow_mut().clear();
    }
}

/// Idle connections a sweep took out of the pools, still open.
pub(crate) struct Swept(Vec<Idle>);

impl Swept {
    /// Close them [`CLOSE_BATCH`] at a time, letting the worker's other tasks run between
    /// batches. Dropped unfinished (the sweeper aborted at shutdown), the rest close at once.
    pub(crate) async fn close(self) {
        drop_gradually(self.0, CLOSE_BATCH).await;
    }
}

/// Drop `items` from the back, `batch` at a time, yielding to the runtime between batches.
async fn drop_gradually<T>(mut items: Vec<T>, batch: usize) {
    while !items.is_empty() {
        items.truncate(items.len().saturating_sub(batch));
        if !items.is_empty() {
            tokio::task::yield_now().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::drop_gradually;
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;

    /// Records, when dropped, how many times the other task had run by then.
    struct Noted {
        ticks: Rc<Cell<usize>>,
        log: Rc<RefCell<Vec<usize>>>,
    }

    impl Drop for Noted {
        fn drop(&mut self) {
            self.log.borrow_mut().push(self.ticks.get());
        }
    }

    /// A hundred swept connections close in batches of 16, and a task woken meanwhile (a
    /// request) runs between every two batches instead of waiting for all hundred.
    #[tokio::test(flavor = "current_thread")]
    async fn swept_connections_close_in_batches_between_other_tasks() {
        let ticks = Rc::new(Cell::new(0));
        let log = Rc::new(RefCell::new(Vec::new()));
        let items: Vec<Noted> = (0..100)
            .map(|_| Noted {
                ticks: ticks.clone(),
                log: log.clone(),
            })
            .collect();
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let other = tokio::task::spawn_local({
                    let ticks = ticks.clone();
                    async move {
                        for _ in 0..1000 {
                            ticks.set(ticks.get() + 1);
                            tokio::task::yield_now().await;
                        }
                    }
                });
                drop_gradually(items, 16).await;
                other.abort();
            })
            .await;
        let log = log.borrow();
        assert_eq!(log.len(), 100, "every item dropped");
        let mut batches: Vec<(usize, usize)> = Vec::new(); // (ticks seen, drops)
        for &t in log.iter() {
            match batches.last_mut() {
                Some((seen, n)) if *seen == t => *n += 1,
                _ => batches.push((t, 1)),
            }
        }
        assert_eq!(batches.len(), 7, "100 in batches of 16: {batches:?}");
        assert!(batches.iter().all(|&(_, n)| n <= 16), "{batches:?}");
        assert!(
            batches.windows(2).all(|w| w[1].0 > w[0].0),
            "the other task ran between every two batches: {batches:?}"
        );
    }
}
