//! keymaster's own HTTP/1.1 server for client connections (cleartext and TLS; HTTP/2 stays
//! hyper's).
//!
//! hyper's server drove each connection through a dispatcher state machine, a service
//! future and its generic read and write buffers: measured at ~8k of ~24k instructions per
//! proxied request, the largest cost left that keymaster did not own. Here the connection
//! is one loop on the worker's task: read a head, run the proxy stage, write the response,
//! repeat. The request body is decoded from the connection's read buffer as the proxy
//! stage pulls it ([`RequestBody`] shares the connection through an `Rc`: the request, its
//! body and the response all run on this one task), and the response goes out through an
//! [`Outbox`](response::Outbox) that writes the head with the first body frame in one
//! vectored write.
//!
//! ```text
//! serve ─► read_head (slowloris / idle deadline, drain) ─► request::head_end: a whole head
//!       ─► exchange, in an allocation of the request's own (state.rs):
//!          request::take_head ─► Head ─► the Request,
//!          run: proxy::handle, while watching for the client to go away,
//!          write::write_response: response::encode_head, body frames (length / chunked /
//!          close)
//!       ─► keep-alive: next head (pipelined bytes are already buffered) │ close │ abort (RST)
//!       └► 101 with a tunnel: the connection becomes the client side of the tunnel
//!       └► a head refused (400, 414, 431): refuse writes the error, then close
//! ```

mod request;
mod response;
mod state;
mod write;

use bytes::BytesMut;
use http::Request;
use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::AsyncWrite;
use tokio::time::Instant;

use super::timed::TaskSleep;
use super::{ConnCtx, RetirePolicy};
use crate::body::ClientBody;
use crate::proxy::ClientResponse;
use keymaster_config::ListenerProtocol;
use keymaster_http::error::Error;
use keymaster_http::framing::Decoder;
use keymaster_http::headers::WireHead;
use keymaster_http::io::{spare, Io, Upgraded};
use request::{Head, HeadScan};
use response::RequestFacts;
use state::State;
use write::{write_response, Writer};

/// How long a closing connection keeps reading (and discarding) what the client still
/// sends, so that the kernel does not answer unread bytes with a reset that could destroy
/// the response before the client reads it.
const LINGER: Duration = Duration::from_secs(2);

/// The client connection's transport and read state, shared by the loop and the current
/// request's body.
pub(crate) struct ConnIo {
    io: Io,
    /// Bytes read and not yet parsed (the next request head, the current request's body).
    rbuf: BytesMut,
    /// The current request's body (done when it has none or it was read whole).
    body: Decoder,
    /// The body failed (bad framing, the client went away): nothing more is read.
    body_failed: bool,
    /// The chunked body that came with the request's head has broken framing: the request
    /// is refused before any origin hears of it ([`RequestBody::refused`]).
    body_refused: Option<keymaster_http::framing::FramingError>,
    /// Bytes of a `100 Continue` still to be written before the body is read.
    continue_left: usize,
    /// The client closed its side (or the read failed).
    read_closed: bool,
}

impl ConnIo {
    /// Read more into the buffer, making room for up to `want` bytes.
    fn poll_fill(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<usize>> {
        self.io.poll_fill(cx, &mut self.rbuf, want, 1024)
    }

    /// Write the `100 Continue` the client waits for, if it is owed.
    fn poll_continue(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.continue_left > 0 {
            let from = response::CONTINUE.len() - self.continue_left;
            match ready!(Pin::new(&mut self.io).poll_write(cx, &response::CONTINUE[from..])) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => self.continue_left -= n,
                Err(e) => return Poll::Ready(Err(e)),
            }
            if self.continue_left == 0 {
                // Out of a TLS session's buffer too, before the client's body is awaited.
                ready!(Pin::new(&mut self.io).poll_flush(cx))?;
            }
        }
        Poll::Ready(Ok(()))
    }

    /// While a request runs and its body is read: take in what the client sends next (a
    /// pipelined request, up to `cap` bytes) and notice when it goes away. `true`: it went
    /// away (EOF or a failed read).
    fn poll_watch(&mut self, cx: &mut Context<'_>, cap: usize) -> bool {
        while !self.read_closed && self.body.is_done() && self.rbuf.len() < cap {
            match self.poll_fill(cx, 1024) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => self.read_closed = true,
                Poll::Ready(Ok(_)) => {}
                Poll::Pending => break,
            }
        }
        self.read_closed
    }
}

/// A connection's single timer, for the header-read (slowloris) and idle deadlines. Moved
/// only when a deadline comes earlier than where it is set; a timer that fires for an older
/// deadline is set again.
struct Timer {
    sleep: TaskSleep,
    armed: Instant,
}

impl Timer {
    fn new(at: Instant) -> Timer {
        Timer {
            sleep: TaskSleep::new(at),
            armed: at,
        }
    }

    fn poll_deadline(&mut self, deadline: Instant, cx: &mut Context<'_>) -> Poll<()> {
        if deadline < self.armed {
            self.rearm(deadline);
        }
        while self.sleep.poll_elapsed(cx).is_ready() {
            if self.armed >= deadline {
                return Poll::Ready(());
            }
            self.rearm(deadline);
        }
        Poll::Pending
    }

    fn rearm(&mut self, at: Instant) {
        self.sleep.reset(at);
        self.armed = at;
    }
}

/// How a response ended, and what becomes of the connection.
enum Ended {
    /// Ready for the next request.
    KeepAlive,
    /// Close after what was written: FIN, then a lingering read.
    Close,
    /// The response could not be completed: reset the connection so the client cannot take
    /// a truncated response for a complete one.
    Abort,
    /// The client connection becomes one side of a tunnel.
    Tunnel(Box<crate::upgrade::Tunnel>),
    /// The connection opened with the HTTP/2 preface (an `auto` listener): HTTP/2 takes it
    /// over, with the bytes read so far.
    Http2,
}

/// What the next read brought.
enum Next {
    /// A complete head of this many bytes at the front of the read buffer. It is parsed
    /// in the request's own allocation ([`exchange`]): the parsed head (224 bytes) is
    /// made where it is used, not copied through each layer between the read and there.
    Head(usize),
    /// The HTTP/2 preface, where the first head would be (an `auto` listener).
    Http2,
}

/// Serve HTTP/1.1 requests on a client connection until it closes, times out, fails, is
/// upgraded, or the worker drains.
///
/// (An `async` block, not an `async fn`: the socket moves into the connection's shared
/// state before the future is made, so the task keeps no room for it.)
#[allow(clippy::manual_async_fn)]
pub(crate) fn serve(cx: Rc<ConnCtx>, io: Io) -> impl Future<Output = ()> {
    let conn = Rc::new(RefCell::new(ConnIo {
        io,
        rbuf: BytesMut::new(),
        body: Decoder::Done,
        body_failed: false,
        body_refused: None,
        continue_left: 0,
        read_closed: false,
    }));
    async move {
        let mut timer = Timer::new(cx.state.deadline_at());
        let worker = cx.worker.clone();
        let mut drain = pin!(worker.drain.wait());
        let mut scan = HeadScan::default();
        let age_limit = cx.listener.retire.age_limit();
        let mut served = 0u64;
        // The last request said it was the client's last (`Connection: close`, or HTTP/1.0
        // without keep-alive).
        let mut client_closes = false;
        // An `auto` listener's connection may open with the HTTP/2 preface instead.
        let mut preface = cx.listener.protocol == ListenerProtocol::Auto;
        // `Err`: a head that gets an error response, the connection's last.
        let ended = loop {
            let read = read_head(
                &cx,
                &conn,
                &mut scan,
                &mut timer,
                drain.as_mut(),
                &mut preface,
            );
            // Nothing is awaited while the read's result is in hand: it would be kept in the
            // connection's task across the await (the refusal is written after the loop).
            let end = match read.await {
                Ok(Some(Next::Head(end))) => end,
                Ok(Some(Next::Http2)) => break Ok(Ended::Http2),
                Ok(None) => break Ok(Ended::Close),
                Err(err) => break Err(err),
            };
            // The request's state, from its head to its response's last byte (the proxy
            // stage's future most of it, about 4.3 KiB), lives in an allocation of its own that
            // goes back to the worker once the response is out: the next request gets memory
            // a recent request used, still in the core's caches, where room in the
            // connection's task would have gone cold while the connection was idle. The
            // connection keeps only what it needs between requests (decision records 0027,
            // 0029 and 0033).
            let mut state = State::new(|| {
                let between = Between {
                    served: &mut served,
                    client_closes: &mut client_closes,
                    age_limit,
                };
                exchange(&cx, &conn, &mut timer, between, end)
            });
            let ended = state.future().await;
            state.recycle();
            match ended {
                Ok(Ended::KeepAlive) => {}
                ended => break ended,
            }
        };
        let ended = match ended {
            Ok(ended) => ended,
            Err(err) => Box::pin(refuse(&cx, &conn, &mut timer, err)).await,
        };
        if let Ended::Http2 = ended {
            return Box::pin(into_h2(cx, conn)).await;
        }
        // The connection's slot on its listener is given back before a lingering close; its
        // descriptor stays counted until the socket closes.
        let _descriptor = cx._open.take_descriptor();
        drop(cx);
        finish(conn, ended, client_closes).await;
    }
}

/// What a request's exchange updates of the connection's state between requests.
struct Between<'a> {
    /// The requests the connection served.
    served: &'a mut u64,
    /// The last request said it was the client's last.
    client_closes: &'a mut bool,
    /// The connection's own age limit ([`RetirePolicy::age_limit`]).
    age_limit: Option<Duration>,
}

/// A request whose head of `end` bytes is at the front of the read buffer: its parse, the
/// proxy stage, then its response. How the connection goes on is what writing the
/// response says (keep-alive, close, abort, a tunnel); `Err`: the head could not be taken,
/// and gets an error response.
///
/// (An `async` block, not an `async fn`: an `async fn` moves each argument into a local of
/// its own when first polled.)
#[allow(clippy::manual_async_fn)]
fn exchange<'a>(
    cx: &'a Rc<ConnCtx>,
    conn: &'a Rc<RefCell<ConnIo>>,
    timer: &'a mut Timer,
    between: Between<'a>,
    end: usize,
) -> impl Future<Output = Result<Ended, Error>> + 'a {
    async move {
        let limits = &cx.listener.limits;
        let head = {
            let mut c = conn.borrow_mut();
            request::take_head(&mut c.rbuf, end, limits, &cx.listener.request_id_header)?
        };
        let facts = RequestFacts {
            method_head: head.method == http::Method::HEAD,
            method_connect: head.method == http::Method::CONNECT,
            version: head.version,
            keep_alive: head.keep_alive,
            accepts_trailers: head.accepts_trailers,
        };
        let (req, wire) = request(conn, head);
        let handler = pin!(crate::proxy::handle(cx.clone(), req, wire));
        let Some(resp) = run(conn, handler, limits.max_head()).await else {
            // The client went away: the exchange was dropped (and its origin connection).
            return Ok(Ended::Abort);
        };
        // The connection's last response closes it: the worker drains, or the connection
        // reached a limit of its listener (Connection: close, so the client reconnects).
        *between.served += 1;
        let draining = cx.worker.drain.is_draining();
        let retire = cx.listener.retire;
        let age = cx.state.age_at_last_request();
        let retired = retire.reached(*between.served, age, between.age_limit);
        if let Some(why) = retired.filter(|_| facts.keep_alive && !draining) {
            RetirePolicy::count(why, &cx.listener.metrics);
        }
        let keep_alive = !draining && retired.is_none();
        *between.client_closes = !facts.keep_alive;
        let mut w = Writer::new(&cx.listener, timer, limits.max_head());
        let ended = write_response(conn, resp, &facts, keep_alive, &mut w).await;
        if let Ended::KeepAlive = ended {
            // Idle until the next request: its read buffer goes back to the worker (nothing
            // unread; the response head's went back with the outbox).
            let mut c = conn.borrow_mut();
            if c.rbuf.is_empty() {
                spare::give(std::mem::take(&mut c.rbuf));
            }
        }
        Ok(ended)
    }
}

/// The error response to a head that could not be taken (400, 414, 431): the connection
/// closes after it.
async fn refuse(cx: &ConnCtx, conn: &RefCell<ConnIo>, timer: &mut Timer, err: Error) -> Ended {
    let via = cx.worker.shared.snapshot.load().stamps.via_11.clone();
    let resp = Box::new(crate::respond::error_response(&err, None, &via));
    let facts = RequestFacts {
        method_head: false,
        method_connect: false,
        version: http::Version::HTTP_11,
        keep_alive: false,
        accepts_trailers: false,
    };
    let mut w = Writer::new(&cx.listener, timer, 0);
    write_response(conn, resp, &facts, false, &mut w).await
}

/// HTTP/2 takes over a connection that opened with its preface: the bytes read so far go
/// to it first. Nothing else holds the connection or its context yet (no request was
/// made).
async fn into_h2(cx: Rc<ConnCtx>, conn: Rc<RefCell<ConnIo>>) {
    let (Ok(cx), Ok(conn)) = (Rc::try_unwrap(cx), Rc::try_unwrap(conn)) else {
        return;
    };
    let conn = conn.into_inner();
    let stream = Upgraded {
        read_ahead: conn.rbuf.freeze(),
        io: conn.io,
        _held: (),
    };
    super::serve_h2_conn(Rc::new(cx.into_h2()), stream).await;
}

/// Read the next request head. `Ok(None)`: the connection ends without a response (the
/// client closed, timed out, or the worker drains while it is idle). `Err`: a head that
/// gets an error response (400, 414, 431) before the connection closes. `preface`: look
/// for the HTTP/2 preface first (cleared once the bytes say otherwise).
///
/// (A `poll_fn`, not an `async fn`: an `async fn` would keep its arguments in the
/// connection's task beside the closure's own copies of them.)
fn read_head<'a, 'd>(
    cx: &'a ConnCtx,
    conn: &'a RefCell<ConnIo>,
    scan: &'a mut HeadScan,
    timer: &'a mut Timer,
    mut drain: Pin<&'a mut crate::drain::Drain<'d>>,
    preface: &'a mut bool,
) -> impl Future<Output = Result<Option<Next>, Error>> + use<'a, 'd> {
    let limits = &cx.listener.limits;
    // When the head that started arriving must be complete (set once its first bytes wait).
    let mut head_deadline = None;
    poll_fn(move |task| {
        let mut c = conn.borrow_mut();
        loop {
            if *preface && !c.rbuf.is_empty() {
                match super::h2_preface(&c.rbuf) {
                    Some(true) => return Poll::Ready(Ok(Some(Next::Http2))),
                    Some(false) => *preface = false,
                    None => {} // "PRI * HTTP/2.0\r\n\r\n" would parse as a whole head
                }
            }
            if !*preface && !c.rbuf.is_empty() {
                if let Some(end) = request::head_end(&c.rbuf, scan, limits)? {
                    return Poll::Ready(Ok(Some(Next::Head(end))));
                }
            }
            if c.read_closed {
                return Poll::Ready(Ok(None));
            }
            let want = (c.rbuf.len() * 2).clamp(1024, limits.max_head());
            match c.poll_fill(task, want) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                    c.read_closed = true;
                    return Poll::Ready(Ok(None));
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Pending => break,
            }
        }
        let idle = c.rbuf.is_empty();
        if idle && drain.as_mut().poll(task).is_ready() {
            return Poll::Ready(Ok(None));
        }
        let deadline = if idle {
            cx.state.deadline_at()
        } else {
            // The slowloris clock: bytes trickling in do not move it.
            *head_deadline.get_or_insert_with(|| Instant::now() + cx.listener.header_read_timeout)
        };
        if timer.poll_deadline(deadline, task).is_ready() {
            return Poll::Ready(Ok(None));
        }
        Poll::Pending
    })
}

/// The request the proxy stage gets for `head` (its body reads from the connection), and
/// its fields in wire form if they were kept so (the request's map is then empty).
fn request(conn: &Rc<RefCell<ConnIo>>, head: Head) -> (Request<ClientBody>, Option<Box<WireHead>>) {
    let body = if head.body.is_done() {
        ClientBody::Empty
    } else {
        let mut c = conn.borrow_mut();
        c.body = head.body;
        c.body_failed = false;
        c.body_refused = head.body_refused;
        c.continue_left = if head.expect_continue {
            response::CONTINUE.len()
        } else {
            0
        };
        ClientBody::H1(crate::body::H1Body(conn.clone()))
    };
    let mut req = Request::new(body);
    *req.method_mut() = head.method;
    *req.uri_mut() = head.uri;
    *req.version_mut() = head.version;
    keymaster_http::headers::replace_map(req.headers_mut(), head.headers);
    (req, head.wire)
}

/// Run the proxy stage for a request. While it runs, once the request body is read, take in
/// what the client sends next and notice when it goes away: `None` then (the proxy stage is
/// dropped, which cancels the origin exchange).
async fn run<F>(
    conn: &RefCell<ConnIo>,
    mut handler: Pin<&mut F>,
    cap: usize,
) -> Option<ClientResponse>
where
    F: Future<Output = Result<ClientResponse, std::convert::Infallible>>,
{
    poll_fn(|task| {
        if let Poll::Ready(Ok(resp)) = handler.as_mut().poll(task) {
            return Poll::Ready(Some(resp));
        }
        if conn.borrow_mut().poll_watch(task, cap) {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}

/// End the connection as `ended` says.
async fn finish(conn: Rc<RefCell<ConnIo>>, ended: Ended, client_closes: bool) {
    let Ok(conn) = Rc::try_unwrap(conn).map(RefCell::into_inner) else {
        return; // a request body still holds it: dropped with it
    };
    // The rare endings are boxed: a task's size is its largest state, and every connection's
    // task would otherwise carry the lingering read's buffer and the tunnel's copy state.
    match ended {
        Ended::KeepAlive | Ended::Close => {
            // The client said its request was its last and all of it was read: it sends
            // nothing more (RFC 9112 §9.6), so a plain close does (nginx's choice too),
            // without the shutdown, the wait for the client's FIN and their timers.
            let nothing_more =
                client_closes && conn.rbuf.is_empty() && conn.body.is_done() && !conn.body_failed;
            if nothing_more && matches!(conn.io, Io::Tcp(_)) {
                spare::give(conn.rbuf); // for the worker's next connection
                return; // dropped: FIN after the response
            }
            Box::pin(lingering_close(conn, nothing_more)).await
        }
        Ended::Http2 => {} // taken over before (`into_h2`)
        Ended::Abort => {
            // SO_LINGER 0: close with a reset.
            let _ = socket2::SockRef::from(conn.io.tcp()).set_linger(Some(Duration::ZERO));
        }
        Ended::Tunnel(t) => {
            let client = Upgraded {
                read_ahead: conn.rbuf.freeze(),
                io: conn.io,
                _held: (),
            };
            Box::pin(t.run(client)).await;
        }
    }
}

/// Close after a complete response: send FIN (TLS: close_notify first), then read and
/// discard what the client still sends, for a bounded time, so that bytes it sent after
/// the request (pipelined ones) do not make the kernel reset the connection under the
/// response; not when the client sends `nothing_more`.
async fn lingering_close(mut conn: ConnIo, nothing_more: bool) {
    use tokio::io::AsyncWriteExt;
    let _ = tokio::time::timeout(LINGER, conn.io.shutdown()).await;
    if conn.read_closed || nothing_more {
        return;
    }
    let _ = tokio::time::timeout(LINGER, super::discard_unread(&mut conn.io)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spend the task's coop budget, as a long write loop does.
    fn spend_budget(cx: &mut Context<'_>) {
        while let Poll::Ready(r) = tokio::task::coop::poll_proceed(cx) {
            r.made_progress();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_first_polled_with_the_budget_spent_still_fires() {
        let start = Instant::now();
        let mut timer = Timer::new(start + Duration::from_secs(10));
        let first = start + Duration::from_millis(300);
        // Polled with no budget left: tokio's sleep registers nothing (it has the task
        // polled again instead).
        poll_fn(|cx| {
            spend_budget(cx);
            assert!(timer.poll_deadline(first, cx).is_pending());
            Poll::Ready(())
        })
        .await;
        // Polled again for a slightly later deadline: it must still wake the task.
        let later = first + Duration::from_millis(1);
        let fired = tokio::time::timeout(
            Duration::from_secs(5),
            poll_fn(|cx| timer.poll_deadline(later, cx)),
        )
        .await;
        assert!(fired.is_ok(), "the timer never woke its task");
        assert_eq!(Instant::now(), later);
    }
}
