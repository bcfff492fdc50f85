//! Where a request's state lives: the proxy stage's future, in an allocation of its own
//! that the worker keeps for its next request once the request is done.
//!
//! The future (a few KiB) is allocated per request rather than kept in the idle connection
//! (decision record 0027): memory a recent request used is still in the core's caches. The
//! worker keeps the allocations of finished requests and hands back the most recent first,
//! which keeps that property and spares the allocator: mimalloc's path for blocks over 1 KiB
//! took about 360 instructions a request to allocate and 70 to free (decision record 0029).

use std::any::Any;
use std::cell::RefCell;
use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;

/// The most a worker keeps in spare allocations: about 140 requests' futures (3.7 KiB
/// each), enough for the requests that finish in one turn of a busy event loop, and small
/// beside what the worker's connections hold (1,600 idle ones: about 7 MiB).
const KEPT_BYTES: usize = 512 * 1024;

thread_local! {
    /// This worker's allocations of finished requests, the most recent last: each a
    /// `MaybeUninit<F>` for the one future type `F` that uses it.
    static SPARE: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// A request's future, pinned in its allocation.
pub(super) struct State<F: 'static>(Pin<Box<F>>);

impl<F: Future + 'static> State<F> {
    /// The future `make` returns, in one of the worker's spare allocations (or a new one).
    /// The allocation is there before `make` runs, so the release build writes the future
    /// in place (`Box::write`) instead of making it on the stack and copying it.
    pub(super) fn new(make: impl FnOnce() -> F) -> State<F> {
        let spare = SPARE.with_borrow_mut(Vec::pop);
        let slot = spare
            .and_then(|b| b.downcast::<MaybeUninit<F>>().ok())
            .unwrap_or_else(Box::new_uninit);
        State(Box::into_pin(Box::write(slot, make())))
    }

    pub(super) fn future(&mut self) -> Pin<&mut F> {
        self.0.as_mut()
    }

    /// Drop the future and give its allocation back to the worker. (A state dropped
    /// instead, by a connection cancelled mid-request, frees its allocation.)
    pub(super) fn recycle(self) {
        // SAFETY: the future is not moved: it is dropped where it is pinned, which is what
        // the pinning contract asks before its memory is reused, and is not touched as an
        // `F` again. `raw` comes from `Box::into_raw`, so it is valid, aligned and owned
        // here alone; `MaybeUninit<F>` has `F`'s layout, so the allocation goes back into a
        // box of the layout it was made with.
        let slot = unsafe {
            let raw = Box::into_raw(Pin::into_inner_unchecked(self.0));
            std::ptr::drop_in_place(raw);
            Box::from_raw(raw.cast::<MaybeUninit<F>>())
        };
        SPARE.with_borrow_mut(|spare| {
            if (spare.len() + 1) * size_of::<F>().max(1) <= KEPT_BYTES {
                spare.push(slot);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;
    use std::task::{Context, Poll};

    #[test]
    fn a_recycled_allocation_serves_the_next_request() {
        SPARE.with_borrow_mut(Vec::clear);
        let mut first = State::new(|| std::future::ready(1u64));
        let at = &*first.future() as *const _ as usize;
        first.recycle();
        let mut second = State::new(|| std::future::ready(2u64));
        assert_eq!(
            &*second.future() as *const _ as usize,
            at,
            "the same allocation"
        );
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert_eq!(second.future().poll(&mut cx), Poll::Ready(2));
        second.recycle();
    }

    #[test]
    fn the_future_is_dropped_when_recycled_and_spares_are_capped() {
        struct Drops(Rc<Cell<u32>>);
        impl Drop for Drops {
            fn drop(&mut self) {
                self.0.set(self.0.get() + 1);
            }
        }
        /// About a request's size.
        struct Big(#[allow(dead_code)] [u8; 4096], #[allow(dead_code)] Drops);
        impl Future for Big {
            type Output = ();
            fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
                Poll::Ready(())
            }
        }
        SPARE.with_borrow_mut(Vec::clear);
        let dropped = Rc::new(Cell::new(0));
        let kept = KEPT_BYTES / size_of::<Big>();
        let states: Vec<_> = (0..kept + 8)
            .map(|_| State::new(|| Big([0; 4096], Drops(dropped.clone()))))
            .collect();
        for s in states {
            s.recycle();
        }
        assert_eq!(dropped.get(), kept as u32 + 8, "every future dropped");
        assert_eq!(
            SPARE.with_borrow(Vec::len),
            kept,
            "no more kept than the cap"
        );
    }
}
