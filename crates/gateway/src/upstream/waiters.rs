//! The requests of one worker that wait for an origin connection while descriptors run
//! short ([`crate::descriptors`]), in the order they came. A connection given back goes
//! straight to the oldest request waiting for its server, and only the oldest request of
//! all (the head) waits for a descriptor the budget frees: so a freed descriptor wakes one
//! request per worker, not every waiting one, and the requests are served first come,
//! first served (a request that arrives while others wait queues behind them).
//!
//! One worker's requests share it on one thread: `Rc` and `Cell`, no locks.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};

/// The waiting requests of one worker; `T` is what they wait for (a connection).
pub(crate) struct Waiters<T> {
    /// In arrival order; its front is always a request still waiting (the head).
    queue: RefCell<VecDeque<Rc<Slot<T>>>>,
    /// Requests still waiting.
    live: Cell<usize>,
}

impl<T> Default for Waiters<T> {
    fn default() -> Self {
        Waiters {
            queue: RefCell::new(VecDeque::new()),
            live: Cell::new(0),
        }
    }
}

/// One waiting request.
struct Slot<T> {
    /// The origin server it waits for.
    key: usize,
    /// Whether it takes a connection given back (a request that must not reuse one waits
    /// for a descriptor only).
    takes: bool,
    /// What was handed to it, until it takes it.
    handed: Cell<Option<T>>,
    /// Left the queue: handed something, or gave up. Slots that left are dropped from the
    /// queue when they reach its front.
    left: Cell<bool>,
    /// Woken and not yet polled.
    woken: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl<T> Slot<T> {
    fn wake(&self) {
        self.woken.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

impl<T> Waiters<T> {
    /// Whether any request waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.live.get() == 0
    }

    /// Queue a request for `key` (`takes`: whether it takes a connection given back).
    pub(crate) fn join(&self, key: usize, takes: bool) -> Ticket<'_, T> {
        let slot = Rc::new(Slot {
            key,
            takes,
            handed: Cell::new(None),
            left: Cell::new(false),
            woken: Cell::new(false),
            waker: Cell::new(None),
        });
        self.queue.borrow_mut().push_back(slot.clone());
        self.live.set(self.live.get() + 1);
        Ticket {
            waiters: self,
            slot,
        }
    }

    /// Hand `item` to the oldest request waiting for `key` that takes one; `Err(item)`
    /// when none does.
    pub(crate) fn hand(&self, key: usize, item: T) -> Result<(), T> {
        let slot = {
            let queue = self.queue.borrow();
            let found = queue
                .iter()
                .find(|s| !s.left.get() && s.takes && s.key == key);
            match found {
                Some(s) => s.clone(),
                None => return Err(item),
            }
        };
        slot.handed.set(Some(item));
        slot.wake();
        self.leave(&slot);
        Ok(())
    }

    /// `slot` leaves the queue (once): the slots that left are dropped from the front, and
    /// the new head is woken when the head changed, so that it starts waiting for
    /// descriptors.
    fn leave(&self, slot: &Slot<T>) {
        if slot.left.replace(true) {
            return;
        }
        self.live.set(self.live.get() - 1);
        let mut queue = self.queue.borrow_mut();
        let mut popped = false;
        while queue.front().is_some_and(|s| s.left.get()) {
            queue.pop_front();
            popped = true;
        }
        if popped {
            if let Some(head) = queue.front() {
                head.wake();
            }
        }
    }
}

/// A request's place in [`Waiters`]; dropping it leaves the queue (and closes anything
/// handed to it and not taken).
pub(crate) struct Ticket<'a, T> {
    waiters: &'a Waiters<T>,
    slot: Rc<Slot<T>>,
}

impl<T> Ticket<'_, T> {
    /// What was handed to this request, if anything.
    pub(crate) fn take(&self) -> Option<T> {
        self.slot.handed.take()
    }

    /// Whether this request is the oldest still waiting (the one that waits for
    /// descriptors).
    pub(crate) fn is_head(&self) -> bool {
        self.waiters
            .queue
            .borrow()
            .front()
            .is_some_and(|s| Rc::ptr_eq(s, &self.slot))
    }

    /// Resolves when something is handed to this request or it becomes the head.
    pub(crate) async fn woken(&self) {
        poll_fn(|cx| {
            if self.slot.woken.replace(false) {
                Poll::Ready(())
            } else {
                self.slot.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
        .await
    }
}

impl<T> Drop for Ticket<'_, T> {
    fn drop(&mut self) {
        drop(self.slot.handed.take());
        self.waiters.leave(&self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::Context;

    fn polled(f: impl Future<Output = ()>) -> bool {
        let mut f = pin!(f);
        f.as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_ready()
    }

    /// Handed connections go to the oldest request for their server that takes one; the
    /// others keep their places.
    #[test]
    fn a_connection_goes_to_the_oldest_request_for_its_server() {
        let w = Waiters::<&str>::default();
        let (a, b, c, d) = (
            w.join(1, true),
            w.join(2, true),
            w.join(1, false),
            w.join(1, true),
        );
        assert!(
            a.is_head() && !polled(a.woken()),
            "the head needs no wake to know"
        );
        assert_eq!(w.hand(1, "x"), Ok(()));
        assert_eq!(
            (a.take(), b.take(), c.take(), d.take()),
            (Some("x"), None, None, None)
        );
        assert_eq!(
            w.hand(1, "y"),
            Ok(()),
            "the next for 1 that takes one is d, not c"
        );
        assert_eq!((c.take(), d.take()), (None, Some("y")));
        assert_eq!(w.hand(1, "z"), Err("z"), "c waits for a descriptor only");
        assert_eq!(w.hand(3, "q"), Err("q"));
        assert!(!w.is_empty());
        drop((a, b, c, d));
        assert!(w.is_empty());
    }

    /// Only the head waits for descriptors; when it leaves (served or given up), the next
    /// still waiting is woken and becomes the head, so nothing freed is left unclaimed.
    #[test]
    fn the_turn_passes_to_the_next_still_waiting() {
        let w = Waiters::<u32>::default();
        let (a, b, c) = (w.join(1, true), w.join(1, true), w.join(1, true));
        assert!(a.is_head() && !b.is_head() && !c.is_head());
        assert!(!polled(b.woken()) && !polled(c.woken()));
        drop(a);
        assert!(
            b.is_head() && polled(b.woken()),
            "b is woken to take the turn"
        );
        assert_eq!(w.hand(1, 7), Ok(()), "handed to b, the oldest");
        assert_eq!(b.take(), Some(7));
        assert!(c.is_head() && polled(c.woken()));
        assert!(!polled(c.woken()), "one wake, one poll");
        drop((b, c));
        assert!(w.is_empty());
    }

    /// A request that gives up after something was handed to it closes it (dropped with the
    /// ticket); one that gives up in the middle of the queue is skipped.
    #[test]
    fn giving_up_drops_what_was_handed_and_keeps_the_order() {
        let dropped = Rc::new(Cell::new(0));
        struct Counted(Rc<Cell<u32>>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.set(self.0.get() + 1);
            }
        }
        let w = Waiters::<Counted>::default();
        let (a, b, c) = (w.join(1, true), w.join(1, true), w.join(1, true));
        assert!(w.hand(1, Counted(dropped.clone())).is_ok());
        drop(a);
        assert_eq!(dropped.get(), 1, "a's connection closed with it");
        drop(b);
        assert!(c.is_head());
        assert!(w.hand(1, Counted(dropped.clone())).is_ok());
        assert!(c.take().is_some());
        assert_eq!(dropped.get(), 2);
    }
}
