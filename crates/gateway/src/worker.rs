//! Worker threads: each runs a single-threaded tokio runtime with a `LocalSet`, its own
//! `SO_REUSEPORT` sockets, and its own upstream pools. Nothing on a worker's request path
//! takes a lock or wakes another thread; per-worker state lives in `Rc`/`Cell`.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};

use crate::downstream::{accept_loop, ListenerCtx};
use crate::gateway::Shared;
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
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(worker = index, error = %e, "cannot start worker runtime");
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let worker = Rc::new(Worker {
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
                    tokio::task::spawn_local(accept_loop(worker.clone(), ctx, socket));
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
                    let snapshot = worker.shared.snapshot.load();
                    worker
                        .pools
                        .sweep(tokio::time::Instant::now(), |id| snapshot.serves(id));
                }
            })
        };
        // Wait for the shutdown signal (or for the handle to be dropped) in a task of its
        // own: the future `block_on` runs is polled on every wake-up of the worker (tokio's
        // `LocalSet::run_until`), so it waits on the drain flag, one read per poll.
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
