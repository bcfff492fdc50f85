//! Writing a response to the client: its head into the connection's
//! [`Outbox`](super::response::Outbox), the body pumped in after it as the head framed it,
//! the writes, and the listener's `send_timeout` for a client that reads nothing. While a
//! response waits for its body, the client's next bytes are taken in (up to a cap) and a
//! client that goes away ends the response.

use http::StatusCode;
use std::cell::RefCell;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::time::Instant;

use super::response::{self, BodyFraming, Outbox, RequestFacts};
use super::{ConnIo, Ended, Timer};
use crate::proxy::{ClientResponse, ResponseBody};
use keymaster_http::io::spare;

/// What writing a response needs of its connection besides the socket: the send timeout
/// (on the connection's timer) and how much a waiting response lets the client send ahead.
pub(super) struct Writer<'a> {
    listener: &'a super::super::ListenerCtx,
    timer: &'a mut Timer,
    /// Bytes the client may send ahead while the response waits for its body.
    watch_cap: usize,
    /// A write that could not go on: how much was left to write, and since when.
    stalled: Option<(usize, Instant)>,
}

impl<'a> Writer<'a> {
    pub(super) fn new(
        listener: &'a super::super::ListenerCtx,
        timer: &'a mut Timer,
        watch_cap: usize,
    ) -> Self {
        Writer {
            listener,
            timer,
            watch_cap,
            stalled: None,
        }
    }

    /// A write is pending with `left` bytes still queued: whether the client has let it
    /// make no progress for the listener's `send_timeout` (the clock starts at the first
    /// stall and again whenever bytes went out since). Costs nothing while writes complete.
    fn timed_out(&mut self, left: usize, task: &mut Context<'_>) -> bool {
        let since = match self.stalled {
            Some((l, since)) if l == left => since,
            _ => {
                let now = Instant::now();
                self.stalled = Some((left, now));
                now
            }
        };
        self.timer
            .poll_deadline(since + self.listener.send_timeout, task)
            .is_ready()
    }
}

/// Write a response and its body. `keep_alive`: the server would keep the connection (it
/// is not draining).
pub(super) async fn write_response(
    conn: &RefCell<ConnIo>,
    resp: ClientResponse,
    req: &RequestFacts,
    keep_alive: bool,
    w: &mut Writer<'_>,
) -> Ended {
    // The request's own outbox: its head buffer goes back to the worker when it is dropped.
    let mut out = Outbox::default();
    let out = &mut out;
    let (written, tunnel, mut pump) = write_head(conn, out, resp, req, keep_alive);
    let flushed = poll_fn(|task| loop {
        pump.pull(out, task);
        match flush(conn, out, w, task) {
            Poll::Ready(Ok(true)) => continue, // written: room for more of the body
            Poll::Ready(Ok(false)) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
        if pump.body.is_none() {
            return Poll::Ready(Ok(()));
        }
        // Waiting for the body: notice a client that goes away meanwhile.
        if conn.borrow_mut().poll_watch(task, w.watch_cap) {
            return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
        }
        return Poll::Pending;
    })
    .await;
    if let Err(e) = flushed {
        tracing::debug!(error = %e, "writing the response failed");
        return Ended::Abort;
    }
    if !pump.whole() {
        return Ended::Abort;
    }
    if let Some(t) = tunnel {
        return Ended::Tunnel(t);
    }
    let c = conn.borrow();
    if !written.keep_alive || written.framing == BodyFraming::Close {
        Ended::Close
    } else if !c.body.is_done() || c.body_failed || c.read_closed {
        // The request body was not read whole: the next bytes are not a request head.
        Ended::Close
    } else {
        Ended::KeepAlive
    }
}

/// The response head into `out` (its wire-form fields as they are), and what follows it:
/// a tunnel for a `101`, or the body to pump (none for HEAD, 204, 304 or an empty body,
/// which is dropped unpolled). The response comes boxed from the proxy stage and is opened
/// here, once.
#[allow(clippy::boxed_local)]
fn write_head(
    conn: &RefCell<ConnIo>,
    out: &mut Outbox,
    resp: ClientResponse,
    req: &RequestFacts,
    keep_alive: bool,
) -> (
    response::Written,
    Option<Box<crate::upgrade::Tunnel>>,
    BodyPump,
) {
    let (parts, mut body) = (*resp).into_parts();
    let raw = match &mut body {
        ResponseBody::Origin(o) => o.raw_head.take(),
        _ => None,
    };
    let reason = parts.extensions.get::<hyper::ext::ReasonPhrase>();
    let empty = http_body::Body::is_end_stream(&body);
    let head = response::Head {
        status: parts.status,
        reason: reason.map(|r| r.as_bytes()),
        headers: &parts.headers,
        raw: raw.as_ref(),
        body_len: http_body::Body::size_hint(&body).exact(),
    };
    {
        let mut c = conn.borrow_mut();
        // A `100 Continue` partly written must be finished first; one not started is no
        // longer owed (the client gets the final response instead).
        if c.continue_left == response::CONTINUE.len() {
            c.continue_left = 0;
        }
    }
    if out.head.capacity() == 0 {
        out.head = spare::SMALL.take();
    }
    let mut written = response::encode_head(&mut out.head, &head, req, keep_alive);
    drop(raw);
    let status = parts.status;
    keymaster_http::headers::discard_map(parts.headers);
    let (tunnel, body) = match body {
        ResponseBody::Tunnel(t) if status == StatusCode::SWITCHING_PROTOCOLS => (Some(t), None),
        body => (None, Some(body)),
    };
    let framing = written.framing;
    let body = body.filter(|_| framing != BodyFraming::None && !empty);
    if body.is_none() && framing == BodyFraming::Chunked {
        response::encode_last_chunk(&mut out.head, None, None);
    }
    let pump = BodyPump {
        body,
        framing,
        trailers: written.trailers.take(),
        sent: 0,
        failed: false,
        last_chunk_queued: false,
    };
    (written, tunnel, pump)
}

/// The response body on its way into the outbox, framed as the head declared.
struct BodyPump {
    /// `None` once it ended, failed, or was never to be sent.
    body: Option<ResponseBody>,
    framing: BodyFraming,
    /// The trailer fields a chunked body may end with.
    trailers: Option<Vec<http::HeaderName>>,
    sent: u64,
    failed: bool,
    last_chunk_queued: bool,
}

impl BodyPump {
    /// What the body has ready, into `out` while it has room (frames of a length- or
    /// close-delimited body gather for one write); the last chunk once the body ended
    /// (with its trailers, if allowed).
    #[inline]
    fn pull(&mut self, out: &mut Outbox, task: &mut Context<'_>) {
        while out.has_room() && self.pull_one(out, task) {}
        if self.body.is_none()
            && !self.failed
            && self.framing == BodyFraming::Chunked
            && !self.last_chunk_queued
        {
            response::encode_last_chunk(&mut out.head, None, None);
            self.last_chunk_queued = true;
        }
    }

    /// One frame of the body into `out`: whether the body may have another ready.
    fn pull_one(&mut self, out: &mut Outbox, task: &mut Context<'_>) -> bool {
        let Some(b) = self.body.as_mut() else {
            return false;
        };
        match http_body::Body::poll_frame(Pin::new(&mut *b), task) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => {
                    let end = http_body::Body::is_end_stream(&*b);
                    self.sent += data.len() as u64;
                    if matches!(self.framing, BodyFraming::Length(n) if self.sent > n) {
                        self.failed = true; // more than the head announced
                        self.body = None;
                        return false;
                    }
                    if !data.is_empty() {
                        out.push_data(self.framing, data, end);
                        self.last_chunk_queued = end;
                    }
                    if end {
                        self.body = None;
                    }
                    !end
                }
                Err(frame) => {
                    if self.framing == BodyFraming::Chunked {
                        let allowed = self.trailers.as_deref();
                        response::encode_last_chunk(&mut out.head, frame.trailers_ref(), allowed);
                        self.last_chunk_queued = true;
                    }
                    self.body = None;
                    false
                }
            },
            Poll::Ready(Some(Err(e))) => {
                tracing::debug!(error = %e, "response body failed");
                self.failed = true;
                self.body = None;
                false
            }
            Poll::Ready(None) => {
                self.body = None;
                false
            }
            Poll::Pending => false,
        }
    }

    /// The body went out whole: no failure, and as many bytes as the head announced.
    fn whole(&self) -> bool {
        !self.failed && !matches!(self.framing, BodyFraming::Length(n) if self.sent < n)
    }
}

/// Write what the outbox holds (after a `100 Continue` still owed). `Ready(Ok(true))`: some
/// was written, or a flush left pending finished; `Ready(Ok(false))`: nothing was queued. A
/// client that reads nothing for `send_timeout` is an error.
#[inline]
fn flush(
    conn: &RefCell<ConnIo>,
    out: &mut Outbox,
    w: &mut Writer<'_>,
    task: &mut Context<'_>,
) -> Poll<io::Result<bool>> {
    let mut c = conn.borrow_mut();
    let queued = !out.is_idle();
    let written = match c.poll_continue(task) {
        Poll::Ready(Ok(())) if queued => out.poll_flush(&mut c.io, task),
        other => other,
    };
    match written {
        Poll::Ready(Ok(())) if queued => {
            w.stalled = None;
            Poll::Ready(Ok(true))
        }
        Poll::Ready(Ok(())) => Poll::Ready(Ok(false)),
        Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        Poll::Pending => {
            if w.timed_out(out.len() + c.continue_left, task) {
                w.listener.metrics.send_timeouts.inc();
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client read nothing for send_timeout",
                )));
            }
            Poll::Pending
        }
    }
}
