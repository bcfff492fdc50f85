//! One request's hold on an origin: an HTTP/1.1 connection checked out of the pool
//! (keymaster's own client, [`super::h1`]) or a stream on a shared HTTP/2 connection
//! (hyper's), and the response body either one produces.

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::time::{Instant, Sleep};

use super::h1;
use super::h2::Lease;
use super::OriginServer;
use crate::body::{RequestBody, RequestBodyState};
use keymaster_http::error::{BoxError, Error, Kind};
use std::time::Duration;

pub(crate) use h1::Failure as SendFailure;

/// How requests are sent on a connection.
pub(crate) enum Sender {
    /// HTTP/1.1: the connection, checked out for one exchange. `None` while a response body
    /// owns it (it comes back at the body's clean end, see [`Conn::give_back`]).
    H1(Option<h1::Connection>),
    /// HTTP/2: a handle to a shared connection; the [`Lease`] counts the stream.
    H2(http2::SendRequest<RequestBody>),
}

/// One upstream connection (HTTP/1.1) or one stream on a shared one (HTTP/2).
pub(crate) struct Conn {
    pub(crate) sender: Sender,
    pub(crate) server: Arc<OriginServer>,
    /// Requests sent on this connection so far.
    pub(crate) requests: u64,
    /// HTTP/2: this request's stream on the shared connection, given back on drop.
    pub(crate) _stream: Option<Lease>,
    /// The response-head timer, kept with the connection across its requests: a new timer
    /// per request costs an insertion into tokio's timer wheel and a removal, and this one
    /// is only moved when it would fire too late (see [`SendWithin`]).
    pub(crate) head_timer: Option<Pin<Box<Sleep>>>,
}

impl Conn {
    pub(crate) fn new(c: h1::Connection, server: Arc<OriginServer>) -> Self {
        Conn {
            sender: Sender::H1(Some(c)),
            server,
            requests: 0,
            _stream: None,
            head_timer: None,
        }
    }

    /// An HTTP/1.1 connection, which goes back to the idle pool after a clean exchange.
    pub(crate) fn is_h1(&self) -> bool {
        matches!(self.sender, Sender::H1(_))
    }

    /// The connection cannot carry a request (closed by the origin, or not given back).
    pub(crate) fn is_closed(&mut self) -> bool {
        match &mut self.sender {
            Sender::H1(c) => c.as_mut().is_none_or(h1::Connection::is_closed),
            Sender::H2(s) => s.is_closed(),
        }
    }

    /// hyper's HTTP/2 handle may be briefly busy; an HTTP/1.1 connection in hand is ready.
    pub(crate) fn is_ready(&self) -> bool {
        match &self.sender {
            Sender::H1(c) => c.is_some(),
            Sender::H2(s) => s.is_ready(),
        }
    }

    /// The idle-connections gauge of an HTTP/1.1 connection in hand.
    pub(crate) fn idle_gauge(&self) -> Option<&crate::metrics::sharded::Gauge> {
        match &self.sender {
            Sender::H1(Some(c)) => c.idle_gauge(),
            _ => None,
        }
    }

    /// The HTTP/1.1 connection back from a response body that ended cleanly.
    pub(crate) fn give_back(&mut self, c: h1::Connection) {
        self.sender = Sender::H1(Some(c));
    }

    /// Send a request; the future ends with the response head, or with [`HeadTimedOut`] if
    /// none arrived within `wait`. `raw_head`: an HTTP/1.1 response head may be kept as bytes
    /// (see [`h1::send`]). `added`: fields to send that are not in the request's map.
    pub(crate) fn send_within<'a>(
        &'a mut self,
        mut req: Box<Request<RequestBody>>,
        wait: HeadWait<'a>,
        raw_head: Option<http::HeaderName>,
        added: Option<&keymaster_http::headers::AddedFields>,
    ) -> SendWithin<'a> {
        let Conn {
            sender,
            server,
            head_timer,
            ..
        } = self;
        let sending = match sender {
            Sender::H1(c) => match c.take() {
                Some(c) => Sending::H1(h1::send(c, req, raw_head, added)),
                None => Sending::Unavailable(Some(req)),
            },
            Sender::H2(s) => {
                if let Some(a) = added {
                    a.insert_into(req.headers_mut());
                }
                Sending::H2(Box::pin(async move {
                    match super::h2::send(s, server, *req).await {
                        Ok(r) => Ok(Box::new(r.map(UpstreamBody::H2))),
                        Err(mut e) => {
                            let unsent = e.take_message().map(Box::new);
                            let e = e.into_error();
                            Err(SendFailure {
                                stale: stale_connection_error(&e),
                                err: map_send_error(e),
                                unsent,
                                resend: None,
                            })
                        }
                    }
                }))
            }
        };
        SendWithin {
            sending,
            timer: head_timer,
            deadline: wait.due(None).0,
            wait,
            armed: false,
        }
    }
}

/// How long a request may wait for its response head: until `at`, plus the time its body
/// spent waiting on the client meanwhile (the origin cannot answer a request it does not
/// have yet; `client_body_timeout` bounds the client's part), never past the request's
/// `deadline`.
#[derive(Clone, Copy)]
pub(crate) struct HeadWait<'a> {
    pub(crate) at: Instant,
    pub(crate) deadline: Option<Instant>,
    /// The request body's state, when it streams from the client.
    pub(crate) body: Option<&'a RequestBodyState>,
}

impl HeadWait<'_> {
    /// When the head is due, with the body's waits on the client up to `now` (none: the
    /// waits that ended); whether the request's deadline is what bounds it.
    fn due(&self, now: Option<Instant>) -> (Instant, bool) {
        let waited = self.body.map_or(Duration::ZERO, |b| b.client_wait(now));
        let at = self.at + waited;
        match self.deadline {
            Some(d) if d <= at => (d, true),
            _ => (at, false),
        }
    }
}

/// [`Conn::send_within`]'s future.
pub(crate) struct SendWithin<'a> {
    sending: Sending<'a>,
    timer: &'a mut Option<Pin<Box<Sleep>>>,
    /// When the head is due as far as known: the timer fires for it, and the wait is
    /// worked out again then (the client's body may have held the request up meanwhile).
    deadline: Instant,
    wait: HeadWait<'a>,
    /// The timer is set to this request's deadline (done at the first wait, so an answer
    /// that is ready at once never touches the timer).
    armed: bool,
}

/// No response head came in time; `deadline`: the request's deadline passed (not only the
/// response-header wait).
#[derive(Debug)]
pub(crate) struct HeadTimedOut {
    pub(crate) deadline: bool,
}

impl Future for SendWithin<'_> {
    type Output = Result<Sent, HeadTimedOut>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Poll::Ready(sent) = Pin::new(&mut this.sending).poll(cx) {
            return Poll::Ready(Ok(sent));
        }
        let timer = match this.timer {
            // Set lazily: a timer due before this deadline is left alone (if it fires first,
            // the loop below moves it on), so the common case, a timer armed by the previous
            // request a little earlier, costs nothing. One due later must come forward.
            Some(t) => {
                if !this.armed && t.deadline() > this.deadline {
                    t.as_mut().reset(this.deadline);
                }
                t
            }
            None => this
                .timer
                .insert(Box::pin(tokio::time::sleep_until(this.deadline))),
        };
        this.armed = true;
        while timer.as_mut().poll(cx).is_ready() {
            if timer.deadline() >= this.deadline {
                let (due, deadline) = this.wait.due(Some(Instant::now()));
                if due <= timer.deadline() {
                    return Poll::Ready(Err(HeadTimedOut { deadline }));
                }
                this.deadline = due; // the client's body held the request up
            }
            timer.as_mut().reset(this.deadline);
        }
        Poll::Pending
    }
}

/// An origin's response, boxed where it is made: it moves up through the send future, the
/// head timeout, the attempt loop and into the proxy stage's response side, a pointer at a
/// time.
pub(crate) type OriginResponse = Box<Response<UpstreamBody>>;

type Sent = Result<OriginResponse, SendFailure>;

/// A request on its way to an origin, until the response head: HTTP/1.1 inline (the common
/// case, and small), HTTP/2 boxed (hyper's future is large).
// `H1` is the common case: boxing it would cost an allocation per request to save bytes
// only on the rare `Unavailable`.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Sending<'a> {
    H1(h1::Sending),
    H2(Pin<Box<dyn Future<Output = Sent> + 'a>>),
    /// The HTTP/1.1 connection was not in hand: nothing was sent.
    Unavailable(Option<Box<Request<RequestBody>>>),
}

impl Future for Sending<'_> {
    type Output = Sent;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Sent> {
        match self.get_mut() {
            Sending::H1(s) => Pin::new(s).poll(cx),
            Sending::H2(f) => f.as_mut().poll(cx),
            Sending::Unavailable(req) => Poll::Ready(Err(SendFailure {
                err: Error::new(Kind::OriginReset, "origin connection not available"),
                unsent: req.take(),
                resend: None,
                stale: true,
            })),
        }
    }
}

/// The failure looks like the origin closed the connection under us.
fn stale_connection_error(e: &hyper::Error) -> bool {
    if e.is_incomplete_message() || e.is_canceled() || e.is_closed() {
        return true;
    }
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::ConnectionAborted
            );
        }
        src = s.source();
    }
    false
}

fn map_send_error(e: hyper::Error) -> Error {
    if e.is_parse() || e.is_parse_status() || e.is_parse_too_large() {
        Error::new(Kind::OriginProtocol, "origin sent a malformed response").with_source(e)
    } else if e.is_user() || e.is_body_write_aborted() {
        // Our request body failed: the client stopped sending it.
        Error::new(Kind::ClientGone, "client request body failed").with_source(e)
    } else {
        Error::new(Kind::OriginReset, "origin closed the connection").with_source(e)
    }
}

/// A response body from an origin, over HTTP/1.1 or HTTP/2.
pub(crate) enum UpstreamBody {
    H1(h1::Body),
    H2(Incoming),
}

impl UpstreamBody {
    /// The response head as bytes, if the HTTP/1.1 client kept it so.
    pub(crate) fn take_raw_head(&mut self) -> Option<keymaster_http::headers::RawHead> {
        match self {
            UpstreamBody::H1(b) => b.take_raw_head(),
            UpstreamBody::H2(_) => None,
        }
    }

    /// The HTTP/1.1 connection, if the body ended cleanly and it may be reused.
    pub(crate) fn take_reusable(&mut self) -> Option<h1::Connection> {
        match self {
            UpstreamBody::H1(b) => b.take_reusable(),
            UpstreamBody::H2(_) => None,
        }
    }

    /// After a 101: the origin connection for a tunnel.
    pub(crate) fn take_upgraded(&mut self) -> Option<h1::Upgraded> {
        match self {
            UpstreamBody::H1(b) => b.take_upgraded(),
            UpstreamBody::H2(_) => None,
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            UpstreamBody::H1(b) => Pin::new(b).poll_frame(cx),
            UpstreamBody::H2(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|f| f.map_err(|e| Box::new(e) as BoxError))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::H1(b) => b.is_end_stream(),
            UpstreamBody::H2(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::H1(b) => b.size_hint(),
            UpstreamBody::H2(b) => b.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A send whose response head never comes, timed by `timer`.
    fn never<'a>(timer: &'a mut Option<Pin<Box<Sleep>>>, after: Duration) -> SendWithin<'a> {
        let wait = HeadWait {
            at: Instant::now() + after,
            deadline: None,
            body: None,
        };
        SendWithin {
            sending: Sending::H2(Box::pin(std::future::pending())),
            timer,
            deadline: wait.at,
            wait,
            armed: false,
        }
    }

    fn poll(s: &mut SendWithin<'_>) -> Poll<Result<Sent, HeadTimedOut>> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        Pin::new(s).poll(&mut cx)
    }

    async fn advance(ms: u64) {
        tokio::time::advance(Duration::from_millis(ms)).await;
    }

    /// The head timer outlives each request on the connection and is moved lazily: a timer
    /// left due before a later request's deadline fires early, is moved on, and the request
    /// times out at its own deadline, never before; a shorter deadline brings it forward.
    #[tokio::test(start_paused = true)]
    async fn the_reused_head_timer_fires_at_each_request_deadline() {
        let mut timer = None;
        let mut first = never(&mut timer, Duration::from_millis(1000));
        assert!(poll(&mut first).is_pending());
        advance(500).await;
        assert!(poll(&mut first).is_pending());
        drop(first); // answered at 500 ms

        // Due at 1500 ms; the timer is still set for 1000 ms.
        let mut second = never(&mut timer, Duration::from_millis(1000));
        assert!(poll(&mut second).is_pending());
        advance(600).await; // 1100 ms: the old deadline has passed
        assert!(
            poll(&mut second).is_pending(),
            "timed out at the old deadline"
        );
        advance(300).await; // 1400 ms
        assert!(poll(&mut second).is_pending());
        advance(100).await; // 1500 ms
        assert!(matches!(
            poll(&mut second),
            Poll::Ready(Err(HeadTimedOut { .. }))
        ));
        drop(second);

        // A long deadline, then a shorter one: the timer comes forward.
        let mut third = never(&mut timer, Duration::from_secs(30));
        assert!(poll(&mut third).is_pending());
        drop(third);
        let mut fourth = never(&mut timer, Duration::from_millis(100));
        assert!(poll(&mut fourth).is_pending());
        advance(99).await;
        assert!(poll(&mut fourth).is_pending());
        advance(1).await;
        assert!(matches!(
            poll(&mut fourth),
            Poll::Ready(Err(HeadTimedOut { .. }))
        ));
    }

    /// The response-header wait leaves out the time the request body waited on the client:
    /// it is moved on while the client holds the body back, and runs out only once the
    /// origin has had its whole wait; the request deadline still bounds it.
    #[tokio::test(start_paused = true)]
    async fn the_head_wait_leaves_out_the_client_body_wait() {
        for bounded in [false, true] {
            let start = Instant::now();
            let deadline = bounded.then(|| start + Duration::from_millis(2200));
            let state = RequestBodyState::default();
            state.set_client_wait(Duration::ZERO, Some(start)); // waiting from the start
            let mut timer = None;
            let wait = HeadWait {
                at: Instant::now() + Duration::from_millis(1000),
                deadline,
                body: Some(&state),
            };
            let mut send = SendWithin {
                sending: Sending::H2(Box::pin(std::future::pending())),
                timer: &mut timer,
                deadline: wait.due(None).0,
                wait,
                armed: false,
            };
            assert!(poll(&mut send).is_pending());
            advance(1000).await; // the client still holds its body back
            assert!(
                poll(&mut send).is_pending(),
                "timed out while the client waited"
            );
            advance(500).await; // 1500 ms: the rest of the body comes
            state.set_client_wait(Duration::from_millis(1500), None);
            assert!(poll(&mut send).is_pending());
            advance(690).await; // 2190 ms
            assert!(poll(&mut send).is_pending());
            advance(10).await; // 2200 ms: the request's deadline, if it has one
            if deadline.is_some() {
                let late = poll(&mut send);
                assert!(matches!(
                    late,
                    Poll::Ready(Err(HeadTimedOut { deadline: true }))
                ));
                continue;
            }
            assert!(poll(&mut send).is_pending());
            advance(299).await;
            assert!(poll(&mut send).is_pending());
            advance(1).await; // 2500 ms: 1000 ms of the origin's own
            let late = poll(&mut send);
            assert!(matches!(
                late,
                Poll::Ready(Err(HeadTimedOut { deadline: false }))
            ));
        }
    }
}
