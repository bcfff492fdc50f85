//! Where a request's state lives: its future, from the head read to the response's last
//! byte, in an allocation of its own that the worker keeps for its next request once the
//! request is done.
//!
//! The future (a few KiB, the proxy stage's most of it) is allocated per request rather
//! than kept in the idle connection (decision records 0027 and 0033): memory a recent
//! request used is still in the core's caches. The worker keeps the allocations of finished
//! requests and hands back the most recent first, which keeps that property and spares the
//! allocator: mimalloc's path for blocks over 1 KiB took about 360 instructions a request to
//! allocate and 70 to free (decision record 0029).

use std::alloc::Layout;
use std::cell::RefCell;
use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::ptr::NonNull;

/// The most a worker keeps in spare allocations: about 120 requests' futures (4.3 KiB
/// each), enough for the requests that finish in one turn of a busy event loop, and small
/// beside what the worker's connections hold.
const KEPT_BYTES: usize = 512 * 1024;

/// An allocation a finished request gave back, and the layout it was made with. The
/// future that was in it borrowed its connection's state, so the allocation is kept by its
/// layout, not as a typed box.
struct Spare {
    at: NonNull<u8>,
    layout: Layout,
}

impl Drop for Spare {
    fn drop(&mut self) {
        // SAFETY: `at` is the allocation of a `Box<MaybeUninit<F>>` (a type of size
        // `layout.size()` > 0 and of this layout, made by the global allocator), given up
        // with `Box::into_raw` in `State::recycle` and owned by this spare alone.
        unsafe { std::alloc::dealloc(self.at.as_ptr(), self.layout) }
    }
}

thread_local! {
    /// This worker's allocations of finished requests, the most recent last.
    static SPARE: RefCell<Vec<Spare>> = const { RefCell::new(Vec::new()) };
}

/// A request's future, pinned in its allocation.
pub(super) struct State<F>(Pin<Box<F>>);

impl<F: Future> State<F> {
    /// The future `make` returns, in the worker's most recent spare allocation of its
    /// layout (or a new one). The allocation is there before `make` runs, so the release
    /// build writes the future in place (`Box::write`) instead of making it on the stack
    /// and copying it.
    pub(super) fn new(make: impl FnOnce() -> F) -> State<F> {
        const { assert!(size_of::<F>() > 0, "a future with state") };
        let layout = Layout::new::<F>();
        let spare = SPARE.with_borrow_mut(|spare| match spare.last() {
            Some(s) if s.layout == layout => spare.pop(),
            _ => None,
        });
        let slot = match spare {
            Some(spare) => {
                let at = std::mem::ManuallyDrop::new(spare).at;
                // SAFETY: the spare's allocation has `MaybeUninit<F>`'s layout (checked
                // above: `MaybeUninit<F>` has `F`'s) and was made by the global allocator
                // (see `Spare`); the spare is forgotten, so the box is its only owner.
                unsafe { Box::from_raw(at.cast::<MaybeUninit<F>>().as_ptr()) }
            }
            None => Box::new_uninit(),
        };
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
        // here alone.
        let at = unsafe {
            let raw = Box::into_raw(Pin::into_inner_unchecked(self.0));
            std::ptr::drop_in_place(raw);
            NonNull::new_unchecked(raw.cast::<u8>())
        };
        let spare = Spare {
            at,
            layout: Layout::new::<F>(),
        };
        SPARE.with_borrow_mut(|kept| {
            if (kept.len() + 1) * size_of::<F>() <= KEPT_BYTES {
                kept.push(spare);
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
    fn a_future_that_borrows_reuses_only_an_allocation_of_its_layout() {
        SPARE.with_borrow_mut(Vec::clear);
        let mut count = 0u32;
        let mut cx = Context::from_waker(std::task::Waker::noop());
        // A future that borrows its caller's state, as a request's borrows its connection's.
        let mut first = State::new(|| async {
            count += 1;
            count
        });
        assert_eq!(first.future().poll(&mut cx), Poll::Ready(1));
        let at = &*first.future() as *const _ as usize;
        first.recycle();
        // Another layout: a new allocation, and the spare stays for its own kind.
        let mut other = State::new(|| std::future::ready([7u64; 64]));
        assert_ne!(&*other.future() as *const _ as usize, at);
        assert!(matches!(other.future().poll(&mut cx), Poll::Ready(a) if a[63] == 7));
        drop(other); // dropped, not recycled: freed
        assert_eq!(SPARE.with_borrow(Vec::len), 1);
        let mut again = State::new(|| async {
            count += 1;
            count
        });
        assert_eq!(
            &*again.future() as *const _ as usize,
            at,
            "the same allocation"
        );
        assert_eq!(again.future().poll(&mut cx), Poll::Ready(2));
        again.recycle();
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
