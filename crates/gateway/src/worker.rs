//! Worker threads: each runs a single-threaded local tokio runtime (`spawn_local` tasks), its own
//! `SO_REUSEPORT` sockets (or handles on a listener's one socket), and its own upstream
//! pools. Nothing on a worker's request path
//! takes a lock or wakes another thread; per-worker state lives in `Rc`/`Cell`.

use arc_swap::cache::Cache;
use arc_swap::ArcSwap;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};

use crate::downstream::{accept_loop, ListenerCtx};
use crate::gateway::Shared;
use crate::snapshot::{Snapshot, SnapshotRef};
use crate::upstream::pool::Pools;

/// One worker thread's state.
pub(crate) struct Worker {
    pub(crate) shared: Arc<Shared>,
    pub(crate) pools: Pools,
    pub(crate) active_connections: Cell<usize>,
    pub(crate) drained: Notify,
    /// Tells this worker's client connections to finish up (set when draining starts).
    pub(crate) drain: crate::drain::DrainSignal,
    /// This worker's event-loop lag (load shedding).
    pub(crate) lag: std::rc::Rc<crate::overload::LoopLag>,
    /// The config version this worker last saw.
    seen: SeenSnapshot,
}

impl Worker {
    /// The running config version, for a request to hold from its first byte to its last.
    ///
    /// Every request holding the process-wide `Arc` would make each worker write its one
    /// reference count twice a request; the worker holds it once instead, and requests
    /// share the worker's `Rc`. Looking for a new version is one read of the shared pointer.
    pub(crate) fn snapshot(&self) -> SnapshotRef {
        let mut seen = self.seen.0.borrow_mut();
        let (cache, rc) = &mut *seen;
        let current = cache.load();
        if Arc::ptr_eq(current, rc) {
            return rc.clone();
        }
        let replaced = std::mem::replace(rc, Rc::new(current.clone()));
        let now = rc.clone();
        // A replaced version may be dropped here, outside the borrow.
        drop(seen);
        drop(replaced);
        now
    }
}

/// A worker's copy of the running config version: `arc-swap`'s cache of the shared pointer,
/// and the `Rc` requests clone.
struct SeenSnapshot(RefCell<(Cache<Versions, Arc<Snapshot>>, SnapshotRef)>);

impl SeenSnapshot {
    fn new(shared: &Arc<Shared>) -> SeenSnapshot {
        let mut cache = Cache::new(Versions(shared.clone()));
        let rc = Rc::new(cache.load().clone());
        SeenSnapshot(RefCell::new((cache, rc)))
    }
}

/// Where config versions are swapped in.
struct Versions(Arc<Shared>);

impl std::ops::Deref for Versions {
    type Target = ArcSwap<Snapshot>;

    fn deref(&self) -> &ArcSwap<Snapshot> {
        &self.0.snapshot
    }
}

/// Sockets handed to a worker: one per listener.
pub(crate) struct WorkerSockets {
    pub(crate) sockets: Vec<(Arc<ListenerCtx>, std::net::TcpListener)>,
}

/// Run a worker until shutdown, then drain: stop accepting, let in-flight requests finish
/// (idle keep-alive connections close at once: the HTTP/1.1 server's and hyper's HTTP/2
/// connections watch the drain signal), and give up at the drain deadline.
pub(crate) fn run(
    index: usize,
    shared: Arc<Shared>,
    sockets: WorkerSockets,
    mut shutdown: watch::Receiver<bool>,
    drain_timeout: Duration,
) {
    // A local runtime: `spawn_local` tasks go on the runtime's own run queue (a `LocalSet`
    // is a second queue behind the runtime's, with a wake-up of its own for each task woken).
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build_local(tokio::runtime::LocalOptions::default())
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(worker = index, error = %e, "cannot start worker runtime");
            return;
        }
    };
    crate::metrics::sharded::enter_worker(index);
    rt.block_on(async move {
        let worker = Rc::new(Worker {
            seen: SeenSnapshot::new(&shared),
            shared,
            pools: Pools::default(),
            active_connections: Cell::new(0),
            drained: Notify::new(),
            drain: Default::default(),
            lag: Default::default(),
        });
        for (ctx, std_socket) in sockets.sockets {
            match tokio::net::TcpListener::from_std(std_socket) {
                Ok(socket) => {
                    tokio::task::spawn_local(accept_loop(worker.clone(), Rc::new(ctx), socket));
                }
                Err(e) => tracing::error!(worker = index, error = %e, "cannot register listener"),
            }
        }
        let sweeper = {
            let worker = worker.clone();
            tokio::task::spawn_local(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(500));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    // Also lets go of a version a reload replaced while no request came.
                    let swept = {
                        let snapshot = worker.snapshot();
                        let now = tokio::time::Instant::now();
                        worker.pools.sweep(now, |id| snapshot.serves(id))
                    };
                    swept.close().await;
                }
            })
        };
        // Wait for the shutdown signal (or for the handle to be dropped) in a task of its
        // own; the future `block_on` runs waits on the drain flag.
        tokio::task::spawn_local({
            let worker = worker.clone();
            async move {
                while !*shutdown.borrow_and_update() {
                    if shutdown.changed().await.is_err() {
                        break;
                    }
                }
                worker.drain.start();
            }
        });
        worker.drain.wait().await;
        let deadline = tokio::time::Instant::now() + drain_timeout;
        while worker.active_connections.get() > 0 {
            let notified = worker.drained.notified();
            if worker.active_connections.get() == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                tracing::warn!(
                    worker = index,
                    open = worker.active_connections.get(),
                    "drain deadline passed; closing remaining connections"
                );
                break;
            }
        }
        sweeper.abort();
        worker.pools.clear();
    });
}
