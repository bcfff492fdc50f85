//! File descriptors: the process's `RLIMIT_NOFILE`, the budget that shares it between
//! client and origin connections, the descriptors a config may need, and telling descriptor
//! exhaustion (`EMFILE`, `ENFILE`) from other socket errors.
//!
//! At start the soft limit is raised to the hard limit (both are logged), and a warning is
//! logged when the listeners' `max_connections` plus the origin connections the pools may
//! hold can exceed it.
//!
//! **The budget** ([`Budget`], one per process, as the descriptor table is) counts the
//! client and origin connections open against the limit less a reserve (listening sockets,
//! the runtimes' event queues, logs, health checks, control-plane fetches). Client
//! connections may take up to [`CLIENT_SHARE`] of it; the rest is kept for their origin
//! connections, which may also use what the clients leave free. So an accepted client is
//! not failed for want of a descriptor:
//! - past the clients' share, or with the budget spent, accepting pauses and new clients
//!   wait in the backlog until a connection closes (`downstream::accept_loop`). While they
//!   wait, origin connections get no more than their share: those given back past it are
//!   closed, so that clients under their share get in (keep-alive clients never leave to
//!   make room; origin connections do, between requests);
//! - past the whole budget, a request that needs a new origin connection queues in its
//!   worker (`upstream::waiters`, first come, first served) within its connect timeout: a
//!   connection another request gives back goes to the oldest request for its server, and
//!   the oldest of all waits for a descriptor another connection releases, or takes one
//!   from an idle connection of this worker's pools, closed for it (`upstream::pool`).
//!   While requests wait, connections given back are closed rather than kept idle, unless
//!   a request of the same worker takes them. A freed descriptor wakes the head of each
//!   worker's queue, not every waiting request.
//!
//! When descriptors run out all the same (another process, the system-wide limit),
//! accepting backs off, a connect to an origin is a 503 of its own category
//! (`local_descriptors_exhausted`) that blames no origin, and a health check that cannot
//! open its socket gives no verdict.

use crossbeam_utils::CachePadded;
use keymaster_config::Config;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::OnceLock;
use std::time::Duration;
use tokio::sync::Notify;

/// Descriptors kept aside for what is not a client or origin connection: the runtimes'
/// event queues, the access log, the admin API, health checks, stdio; each worker adds its
/// listening sockets and event queue ([`reserve`]).
const RESERVE: u64 = 64;

/// The share of the budget client connections may fill, in eighths: the last eighth is
/// kept for origin connections.
pub const CLIENT_SHARE: usize = 7;

/// The process's descriptor limits after [`raise_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NofileLimit {
    /// The soft limit found at start.
    pub was: u64,
    /// The soft limit now in force.
    pub soft: u64,
    /// The hard limit (the most the soft one may be raised to).
    pub hard: u64,
}

/// Raise the soft `RLIMIT_NOFILE` to the hard limit and log both; `None` when the limits
/// cannot be read.
pub fn raise_limit() -> Option<NofileLimit> {
    let Some(mut lim) = nofile() else {
        tracing::warn!(error = %std::io::Error::last_os_error(), "reading RLIMIT_NOFILE failed");
        return None;
    };
    let was = lim.rlim_cur;
    let hard = lim.rlim_max;
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit that outlives the call; only the soft limit
        // changes, and never above the hard one.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        } else {
            tracing::warn!(error = %std::io::Error::last_os_error(), "raising RLIMIT_NOFILE failed");
        }
    }
    let soft = lim.rlim_cur;
    tracing::info!(soft, hard, was, "descriptor limit (RLIMIT_NOFILE)");
    Some(NofileLimit { was, soft, hard })
}

/// The descriptors `config` may hold at once with `workers` workers: every listener's
/// `max_connections`, plus the origin connections (at most each server's
/// `pool.max_connections`, and at most one in flight per client connection plus the idle
/// ones the pools keep), plus a reserve.
pub fn needed(config: &Config, workers: usize) -> u64 {
    let clients: u64 = config
        .listeners
        .iter()
        .map(|l| l.max_connections as u64)
        .sum();
    let (mut capped, mut idle) = (0u64, 0u64);
    for c in &config.clusters {
        let cap = match c.pool.max_connections {
            0 => u64::MAX,
            n => n as u64,
        };
        let kept = cap.min((workers as u64).saturating_mul(c.pool.max_idle as u64));
        let servers = c.servers.len() as u64;
        capped = capped.saturating_add(cap.saturating_mul(servers));
        idle = idle.saturating_add(kept.saturating_mul(servers));
    }
    let origins = capped.min(clients.saturating_add(idle));
    clients.saturating_add(origins).saturating_add(RESERVE)
}

/// Descriptors kept aside with `workers` workers and `listeners` listeners: [`RESERVE`],
/// plus each worker's listening sockets and event queue.
pub fn reserve(config: &Config, workers: usize) -> u64 {
    let per_worker = config.listeners.len() as u64 + 2;
    RESERVE + (workers as u64) * per_worker
}

/// Raise the limit, size the process's [`Budget`] by it, and warn when `config` can need
/// more descriptors than it allows.
pub(crate) fn prepare(config: &Config, workers: usize) {
    let Some(limit) = raise_limit() else {
        return;
    };
    let b = BUDGET.get_or_init(|| Budget::new(limit.soft.saturating_sub(reserve(config, workers))));
    tracing::info!(
        connections = b.limit,
        clients = b.clients_max,
        "descriptor budget (client and origin connections)"
    );
    let need = needed(config, workers);
    if need > limit.soft {
        tracing::warn!(
            limit = limit.soft,
            need,
            "the listeners' max_connections plus the origin connections the pools may hold \
             can exceed the descriptor limit (RLIMIT_NOFILE); past it new clients wait in \
             the backlog and requests wait for origin connections to be freed"
        );
    }
}

static BUDGET: OnceLock<Budget> = OnceLock::new();

/// The process's budget: sized at the first gateway start ([`prepare`]); before that (unit
/// tests), by the current soft limit less [`RESERVE`].
pub(crate) fn budget() -> &'static Budget {
    BUDGET.get_or_init(|| {
        let soft = nofile().map_or(u64::MAX, |l| l.rlim_cur);
        Budget::new(soft.saturating_sub(RESERVE))
    })
}

/// The process's `RLIMIT_NOFILE`, soft and hard; `None` when it cannot be read.
fn nofile() -> Option<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the duration of the call.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0).then_some(lim)
}

/// Client and origin connections open against the descriptor limit (module docs).
pub(crate) struct Budget {
    /// Connections the budget allows (the soft limit less the reserve).
    limit: usize,
    /// Client connections are accepted while fewer than this are open.
    clients_max: usize,
    /// The connections open (client and origin) in the low 32 bits, the client
    /// connections among them in the high 32: one atomic operation per connection opened
    /// or closed. On a cache line of its own, apart from the waiter counts that every
    /// connection given back to a pool reads.
    counts: CachePadded<AtomicU64>,
    /// Requests waiting for an origin connection.
    origin_waiting: AtomicUsize,
    /// Accept loops waiting for room.
    accept_waiting: AtomicUsize,
    /// Wakes the waiting when a connection closes.
    freed: Notify,
}

/// One client connection in [`Budget::counts`] (it counts among the open ones too).
const CLIENT: u64 = (1 << 32) | 1;
/// One origin connection in [`Budget::counts`].
const ORIGIN: u64 = 1;

/// `(open, clients)` from [`Budget::counts`].
fn split(counts: u64) -> (usize, usize) {
    ((counts & 0xffff_ffff) as usize, (counts >> 32) as usize)
}

/// One connection's place in a [`Budget`], given back on drop.
pub(crate) struct Descriptor {
    budget: &'static Budget,
    client: bool,
}

impl Drop for Descriptor {
    fn drop(&mut self) {
        self.budget.release(self.client);
    }
}

/// A waiter counted in a [`Budget`] (among the requests or the accept loops) while it waits.
pub(crate) struct Waiting(&'static AtomicUsize);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl Budget {
    fn new(limit: u64) -> Budget {
        // At most 2^31, so that the open count never reaches the clients' half of `counts`
        // (no descriptor table is that large; an unlimited limit means this one).
        let limit = usize::try_from(limit.min(1 << 31))
            .unwrap_or(1 << 31)
            .max(8);
        Budget {
            limit,
            clients_max: limit / 8 * CLIENT_SHARE,
            counts: CachePadded::new(AtomicU64::new(0)),
            origin_waiting: AtomicUsize::new(0),
            accept_waiting: AtomicUsize::new(0),
            freed: Notify::new(),
        }
    }

    /// A client connection was accepted: its place (taken even past the clients' share,
    /// which a few concurrent accepts may overshoot; the origin share absorbs them).
    pub(crate) fn client(&'static self) -> Descriptor {
        self.counts.fetch_add(CLIENT, SeqCst);
        Descriptor {
            budget: self,
            client: true,
        }
    }

    /// Whether a client may be accepted now: the clients are under their share and the
    /// budget is not spent.
    pub(crate) fn client_room(&self) -> bool {
        let (open, clients) = split(self.counts.load(SeqCst));
        clients < self.clients_max && open < self.limit
    }

    /// A place for a new origin connection, if the budget has one. While clients wait to
    /// be accepted, origin connections get no more than their share.
    pub(crate) fn origin(&'static self) -> Option<Descriptor> {
        let share = self.limit - self.clients_max;
        let crowded = self.accept_waiting.load(SeqCst) > 0;
        // A compare-and-swap, not an add undone on failure: undoing would count as a
        // release and wake every waiter, each of whom would fail and wake the others.
        self.counts
            .fetch_update(SeqCst, SeqCst, |n| {
                let (open, clients) = split(n);
                let origins = open - clients;
                (open < self.limit && !(crowded && origins >= share)).then_some(n + ORIGIN)
            })
            .ok()
            .map(|_| Descriptor {
                budget: self,
                client: false,
            })
    }

    /// Requests are waiting for origin connections: connections given back are closed
    /// rather than kept idle (unless a request on the same worker waits for them).
    pub(crate) fn pressed(&self) -> bool {
        self.origin_waiting.load(SeqCst) > 0
    }

    /// Clients wait to be accepted while origin connections hold more than their share:
    /// origin connections given back are closed, not kept or handed on, until the clients
    /// have their room.
    pub(crate) fn clients_crowded(&self) -> bool {
        if self.accept_waiting.load(SeqCst) == 0 {
            return false;
        }
        let (open, clients) = split(self.counts.load(SeqCst));
        open - clients > self.limit - self.clients_max
    }

    /// Wait until a client may be accepted (checked at least once a second).
    pub(crate) async fn wait_client_room(&'static self) {
        let _w = self.waiting(false);
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.client_room() {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), freed).await;
        }
    }

    /// Count a request that waits for an origin connection until the guard drops.
    pub(crate) fn origin_waiter(&'static self) -> Waiting {
        self.waiting(true)
    }

    /// Resolves when a connection closes after this call.
    pub(crate) fn freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.freed.notified()
    }

    fn waiting(&'static self, origin: bool) -> Waiting {
        let count = if origin {
            &self.origin_waiting
        } else {
            &self.accept_waiting
        };
        count.fetch_add(1, SeqCst);
        Waiting(count)
    }

    fn release(&self, client: bool) {
        self.counts
            .fetch_sub(if client { CLIENT } else { ORIGIN }, SeqCst);
        if self.origin_waiting.load(SeqCst) > 0 || self.accept_waiting.load(SeqCst) > 0 {
            self.freed.notify_waiters();
        }
    }
}

/// The error is the process (`EMFILE`) or the system (`ENFILE`) out of descriptors.
pub(crate) fn exhausted(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keymaster_config::{ClusterConfig, ListenerConfig, OriginServerConfig};

    fn config(max_connections: usize, pool_cap: usize, servers: usize) -> Config {
        let mut c = Config {
            listeners: vec![ListenerConfig {
                max_connections,
                ..ListenerConfig::default()
            }],
            ..Config::default()
        };
        let mut cluster = ClusterConfig::default();
        cluster.pool.max_connections = pool_cap;
        cluster.pool.max_idle = 10;
        cluster.servers = (0..servers)
            .map(|i| OriginServerConfig {
                address: format!("127.0.0.1:{}", 9000 + i),
                weight: 1,
            })
            .collect();
        c.clusters = vec![cluster];
        c
    }

    #[test]
    fn budget_counts_clients_pool_caps_and_idle_connections() {
        // Capped pools: the caps bound the origin connections.
        assert_eq!(needed(&config(1000, 100, 3), 4), 1000 + 300 + RESERVE);
        // Unlimited pools: one in flight per client plus the idle ones kept (4 × 10 × 3).
        assert_eq!(needed(&config(1000, 0, 3), 4), 1000 + 1000 + 120 + RESERVE);
    }

    fn leaked(limit: u64) -> &'static Budget {
        Box::leak(Box::new(Budget::new(limit)))
    }

    /// Clients fill seven eighths; origin connections may take the rest and no more; a
    /// place given back is taken again.
    #[test]
    fn clients_leave_an_eighth_to_origin_connections() {
        let b = leaked(16);
        let clients: Vec<_> = std::iter::from_fn(|| b.client_room().then(|| b.client())).collect();
        assert_eq!(clients.len(), 14);
        let origins: Vec<_> = std::iter::from_fn(|| b.origin()).collect();
        assert_eq!(origins.len(), 2);
        assert!(b.origin().is_none() && !b.client_room());
        drop(origins);
        assert!(b.origin().is_some());
        drop(clients);
        assert!(b.client_room());
    }

    /// Origin connections may use what clients leave free; while clients wait to be
    /// accepted, they get no more than their share, and those past it are to be closed.
    #[test]
    fn waiting_clients_push_origin_connections_back_to_their_share() {
        let b = leaked(16); // 14 for clients, 2 kept for origin connections
        let clients: Vec<_> = (0..4).map(|_| b.client()).collect();
        let mut origins: Vec<_> = std::iter::from_fn(|| b.origin()).collect();
        assert_eq!(origins.len(), 12, "what the clients leave free");
        assert!(!b.client_room() && !b.clients_crowded());
        let accept = b.waiting(false);
        assert!(b.clients_crowded());
        origins.truncate(3);
        assert!(b.client_room(), "closed origin connections made room");
        assert!(b.clients_crowded(), "3 is past the share of 2");
        origins.pop();
        assert!(!b.clients_crowded());
        assert!(b.origin().is_none(), "at their share while clients wait");
        drop(accept);
        assert!(b.origin().is_some());
        drop(clients);
    }

    /// A waiting accept loop is woken by the connection that closes; a request waiting for
    /// an origin connection makes the budget pressed while it waits.
    #[tokio::test]
    async fn closing_a_connection_wakes_the_waiting() {
        let b = leaked(8);
        let mut held: Vec<_> = (0..7).map(|_| b.client()).collect();
        assert!(!b.client_room());
        let waiter = tokio::spawn(b.wait_client_room());
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        held.pop();
        tokio::time::timeout(Duration::from_millis(500), waiter)
            .await
            .expect("woken by the close, not by the once-a-second check")
            .unwrap();
        assert!(!b.pressed());
        let w = b.origin_waiter();
        assert!(b.pressed());
        drop(w);
        assert!(!b.pressed());
    }

    #[test]
    fn only_emfile_and_enfile_are_exhaustion() {
        assert!(exhausted(&std::io::Error::from_raw_os_error(libc::EMFILE)));
        assert!(exhausted(&std::io::Error::from_raw_os_error(libc::ENFILE)));
        assert!(!exhausted(&std::io::Error::from_raw_os_error(
            libc::ECONNREFUSED
        )));
    }
}
