//! A worker's drain signal for its client connections.
//!
//! Every client connection waits for the drain next to its HTTP connection, so the wait is
//! polled each time the connection's task wakes. A `watch` channel's `changed()` future costs
//! a version check and a waiter-list update on every such poll; this signal costs one flag
//! read, because a connection registers its task's waker once and the worker wakes them all
//! when draining starts.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Set once, when the worker starts draining; wakes every connection waiting on it.
#[derive(Default)]
pub(crate) struct DrainSignal {
    draining: Cell<bool>,
    waiters: RefCell<slab::Slab<Waker>>,
}

impl DrainSignal {
    /// Start draining: every current and future [`Drain`] completes.
    pub(crate) fn start(&self) {
        self.draining.set(true);
        // Taken out first: waking only schedules a task, but no borrow is held across it.
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        for (_, w) in waiters {
            w.wake();
        }
    }

    /// Whether draining has started.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.get()
    }

    /// A future that completes when draining starts.
    pub(crate) fn wait(&self) -> Drain<'_> {
        Drain {
            signal: self,
            key: None,
        }
    }
}

/// Completes when the worker drains. See [`DrainSignal::wait`].
pub(crate) struct Drain<'a> {
    signal: &'a DrainSignal,
    /// This wait's waker slot, once registered.
    key: Option<usize>,
}

impl Future for Drain<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.signal.draining.get() {
            return Poll::Ready(());
        }
        let mut waiters = this.signal.waiters.borrow_mut();
        match this.key.and_then(|k| waiters.get_mut(k)) {
            // The same task polls again (the common case): nothing to do.
            Some(w) if w.will_wake(cx.waker()) => {}
            Some(w) => w.clone_from(cx.waker()),
            None => this.key = Some(waiters.insert(cx.waker().clone())),
        }
        Poll::Pending
    }
}

impl Drop for Drain<'_> {
    fn drop(&mut self) {
        if let Some(k) = self.key {
            if !self.signal.draining.get() {
                self.signal.waiters.borrow_mut().try_remove(k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn waits_until_started_and_wakes_each_waiter_once() {
        let signal = DrainSignal::default();
        let counts: Vec<_> = (0..3)
            .map(|_| Arc::new(Count(AtomicUsize::new(0))))
            .collect();
        let mut waits: Vec<_> = (0..3).map(|_| Box::pin(signal.wait())).collect();
        for (w, c) in waits.iter_mut().zip(&counts) {
            let waker = Waker::from(c.clone());
            let mut cx = Context::from_waker(&waker);
            assert!(w.as_mut().poll(&mut cx).is_pending());
            assert!(w.as_mut().poll(&mut cx).is_pending()); // re-poll: still one slot
        }
        assert_eq!(signal.waiters.borrow().len(), 3);
        drop(waits.pop()); // a connection that closed before the drain
        assert_eq!(signal.waiters.borrow().len(), 2);
        signal.start();
        let woken: Vec<_> = counts.iter().map(|c| c.0.load(Ordering::Relaxed)).collect();
        assert_eq!(woken, [1, 1, 0]);
        let waker = Waker::from(counts[0].clone());
        let mut cx = Context::from_waker(&waker);
        for w in waits.iter_mut() {
            assert!(w.as_mut().poll(&mut cx).is_ready());
        }
        // A wait begun after the drain completes at once.
        assert!(Box::pin(signal.wait()).as_mut().poll(&mut cx).is_ready());
    }
}
