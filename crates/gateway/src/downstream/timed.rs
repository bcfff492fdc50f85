//! The connection-level timeouts under hyper's servers (HTTP/2, and the admin listener's
//! HTTP/1.1): [`TimedIo`] wraps the client socket, enforcing [`ConnState`]'s header-read and
//! idle deadlines on reads, and [`SendClock`] fails a write that makes no progress for the
//! send timeout. keymaster's own HTTP/1.1 server keeps the same clocks on its connection
//! loop instead (`h1`). [`TaskSleep`] is the timer under both.

use hyper::rt::{Read, ReadBufCursor, Write};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

use super::ConnState;

/// A `Sleep` that one task polls (its connection's). Once it holds that task's waker,
/// polling it again before it fires changes nothing, and [`Self::poll_elapsed`] skips it: a
/// tokio `Sleep` poll costs about a hundred instructions (the coop budget, the waker's
/// registration), and a connection polls its timers on each of its wake-ups.
pub(crate) struct TaskSleep {
    sleep: Pin<Box<Sleep>>,
    /// The sleep has this task's waker and has not fired. Not set by a poll made with the
    /// task's coop budget spent: tokio's `Sleep` then registers nothing (it has the task
    /// polled again instead), and a deadline checked only through this flag would be missed
    /// until some other wake-up.
    registered: bool,
}

impl TaskSleep {
    pub(crate) fn new(at: Instant) -> Self {
        TaskSleep {
            sleep: Box::pin(tokio::time::sleep_until(at)),
            registered: false,
        }
    }

    /// Move the deadline.
    pub(crate) fn reset(&mut self, at: Instant) {
        self.sleep.as_mut().reset(at);
        self.registered = false;
    }

    /// Ready once the deadline has passed; otherwise the task is woken when it does.
    pub(crate) fn poll_elapsed(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.registered && !self.sleep.is_elapsed() {
            return Poll::Pending;
        }
        let budget = tokio::task::coop::has_budget_remaining();
        let polled = self.sleep.as_mut().poll(cx);
        self.registered = polled.is_pending() && budget;
        polled
    }
}

/// The client socket (plain or TLS) plus the connection-level timeouts.
pub(crate) struct TimedIo<S> {
    inner: S,
    state: Arc<ConnState>,
    sleep: TaskSleep,
    /// The send timeout's clock while a write is stalled (made when first needed).
    send: SendClock,
}

impl<S> TimedIo<S> {
    /// `inner` under `state`'s header-read and idle deadlines and `send`'s write clock.
    pub(crate) fn new(inner: S, state: Arc<ConnState>, send: SendClock) -> Self {
        TimedIo {
            inner,
            sleep: TaskSleep::new(state.at(state.deadline())),
            state,
            send,
        }
    }
}

/// The send timeout under hyper's HTTP/2 server: a write that stays pending (the client
/// reads nothing) for `timeout` fails the connection; any write that moves bytes stops
/// the clock.
pub(crate) struct SendClock {
    timeout: Duration,
    /// Counts the connections it failed, where a metric does.
    timeouts: Option<prometheus::IntCounter>,
    sleep: Option<Pin<Box<Sleep>>>,
    stalled: bool,
}

impl SendClock {
    pub(crate) fn new(timeout: Duration, timeouts: Option<prometheus::IntCounter>) -> Self {
        SendClock {
            timeout,
            timeouts,
            sleep: None,
            stalled: false,
        }
    }

    /// Pass a write's outcome through: progress stops the clock, a pending write starts it
    /// (or checks it), and a stall past the timeout becomes an error.
    fn check<T>(
        &mut self,
        polled: Poll<io::Result<T>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stalled = false;
            return polled;
        }
        if !self.stalled {
            self.stalled = true;
            let at = Instant::now() + self.timeout;
            match &mut self.sleep {
                Some(s) => s.as_mut().reset(at),
                None => self.sleep = Some(Box::pin(tokio::time::sleep_until(at))),
            }
        }
        let fired = self
            .sleep
            .as_mut()
            .is_some_and(|s| s.as_mut().poll(cx).is_ready());
        if !fired {
            return Poll::Pending;
        }
        if let Some(t) = &self.timeouts {
            t.inc();
        }
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client read nothing for send_timeout",
        )))
    }
}

impl<S: Read + Unpin> Read for TimedIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                let state = &this.state;
                if state.head_clock
                    && state.idle.load(Ordering::Relaxed)
                    && state.inflight.load(Ordering::Relaxed) == 0
                {
                    // First bytes of a new request head: the slowloris clock starts.
                    state.idle.store(false, Ordering::Relaxed);
                    state.set_deadline(Instant::now() + state.header_timeout);
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                let state = &this.state;
                if state.inflight.load(Ordering::Relaxed) == 0 {
                    let d = state.deadline();
                    if d < state.armed.load(Ordering::Relaxed) {
                        this.sleep.reset(state.at(d));
                        state.armed.store(d, Ordering::Relaxed);
                    }
                    while this.sleep.poll_elapsed(cx).is_ready() {
                        if state.armed.load(Ordering::Relaxed) >= d {
                            return Poll::Ready(Err(io::Error::new(
                                io::ErrorKind::TimedOut,
                                "client connection timed out (header read or idle)",
                            )));
                        }
                        // Fired for an older, earlier deadline: move on to the current one.
                        this.sleep.reset(state.at(d));
                        state.armed.store(d, Ordering::Relaxed);
                    }
                }
                if state.short_idle {
                    // A request may start and finish before the next read (hyper's HTTP/1.1
                    // server polls the socket before it calls the service): its idle
                    // deadline, earlier than the armed timer, must wake this read.
                    state.set_reader(Some(cx.waker().clone()));
                }
                Poll::Pending
            }
        }
    }
}

impl<S: Write + Unpin> Write for TimedIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.send.check(polled, cx)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.send.check(polled, cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.send.check(polled, cx)
    }
}
