//! Request bodies on their way from the client to the origin (below the upstream layer,
//! which sends them; the response side is `proxy::response`).
//!
//! [`ClientBody`] is the client's request body as its connection delivers it (keymaster's
//! HTTP/1.1 server, through [`ConnBody`], or hyper's HTTP/2 server). [`RequestBody`] carries
//! it to the origin, enforcing the route's size cap and `client_body_timeout` as it
//! streams. Nothing here buffers a whole body unless asked ([`read_whole`]): frames pass
//! through one by one, so backpressure flows from the slower side to the faster one.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use std::cell::Cell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

use keymaster_http::error::{BoxError, Error, Kind};

/// Shared between a [`RequestBody`] and the proxy stage: did the body end, did it overflow,
/// did the client leave it waiting?
#[derive(Debug, Default)]
pub(crate) struct RequestBodyState {
    pub(crate) finished: Cell<bool>,
    pub(crate) too_large: Cell<bool>,
    /// The client's body framing was invalid (e.g. a bad chunk size): a 400, not a 499.
    pub(crate) malformed: Cell<bool>,
    /// The client left the body with nothing to read past `client_body_timeout`: a 408.
    pub(crate) timed_out: Cell<bool>,
    /// How long the body waited on the client in waits that ended (see
    /// [`RequestBodyState::client_wait`]).
    waited: Cell<Duration>,
    /// When the wait on the client now going on began.
    waiting_since: Cell<Option<Instant>>,
}

impl RequestBodyState {
    /// The state of a body sent whole: finished from the start.
    pub(crate) fn whole() -> Self {
        let state = RequestBodyState::default();
        state.finished.set(true);
        state
    }

    /// How long reading the body has waited on the client so far, a wait still going on
    /// counted up to `now` (none: only the waits that ended). The response-header wait does
    /// not count this time: the origin cannot answer a request it does not have yet.
    pub(crate) fn client_wait(&self, now: Option<Instant>) -> Duration {
        let ended = self.waited.get();
        match (self.waiting_since.get(), now) {
            (Some(since), Some(now)) => ended + now.saturating_duration_since(since),
            _ => ended,
        }
    }

    /// Set how long the body waited on the client (tests of what reads it).
    #[cfg(test)]
    pub(crate) fn set_client_wait(&self, ended: Duration, since: Option<Instant>) {
        self.waited.set(ended);
        self.waiting_since.set(since);
    }

    /// The client's body broke the rules or stalled while being read (`None`: it went away,
    /// or nothing went wrong on the client's side).
    pub(crate) fn error(&self) -> Option<Error> {
        if self.timed_out.get() {
            Some(Error::new(
                Kind::ClientBodyTimeout,
                "the client sent nothing of its request body within client_body_timeout",
            ))
        } else if self.too_large.get() {
            Some(Error::new(
                Kind::BodyTooLarge,
                "request body exceeds the route's limit",
            ))
        } else if self.malformed.get() {
            Some(Error::new(Kind::BadRequest, "invalid request body framing"))
        } else {
            None
        }
    }
}

/// The wait for more of a body, bounded by the longest gap between reads: its timer is made
/// the first time the body has nothing to read (a body that came whole with its head never
/// needs one) and set again only when a read came since.
pub(crate) struct ReadGap {
    timeout: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    /// When the wait now going on began (`None`: the last poll read something).
    since: Option<Instant>,
}

impl ReadGap {
    pub(crate) fn new(timeout: Duration) -> Self {
        ReadGap {
            timeout,
            timer: None,
            since: None,
        }
    }

    /// A read came (data, the end or an error): the wait, if there was one, ended. Returns
    /// when it began.
    pub(crate) fn read(&mut self) -> Option<Instant> {
        self.since.take()
    }

    /// Nothing to read: `Ready` once the wait has lasted the timeout.
    pub(crate) fn poll_wait(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.since.is_none() {
            let now = Instant::now();
            self.since = Some(now);
            match &mut self.timer {
                Some(t) => t.as_mut().reset(now + self.timeout),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(now + self.timeout))),
            }
        }
        match &mut self.timer {
            Some(t) => t.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }
}

/// What a request body needs of the HTTP/1.1 client connection it is read from
/// (`downstream::h1`'s connection implements it): the body is decoded from the connection's
/// read buffer as the proxy stage pulls it.
pub(crate) trait ConnBody {
    /// The next frame of the body (`None`: it ended).
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>>;
    /// The body has ended.
    fn body_done(&self) -> bool;
    /// The bytes still to come, when the framing says.
    fn body_remaining(&self) -> Option<u64>;
    /// The body's framing was found broken in the bytes that came with its head.
    fn body_refused(&self) -> Option<Error>;
}

/// A request body read from an HTTP/1.1 client connection (shared with the connection,
/// which reads the next request once this one is done).
pub struct H1Body(pub(crate) Rc<std::cell::RefCell<dyn ConnBody>>);

impl Body for H1Body {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        self.0.borrow_mut().poll_body(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.borrow().body_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.0.borrow().body_remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

/// The client's request body, as its connection delivers it.
pub enum ClientBody {
    /// No body.
    Empty,
    /// From keymaster's HTTP/1.1 server, decoded from the connection's read buffer.
    H1(H1Body),
    /// From hyper's HTTP/2 server.
    H2(Incoming),
}

impl ClientBody {
    /// The body is known to be malformed before any of it is read (keymaster's HTTP/1.1
    /// server checked the chunked body that came with the head): the request is refused
    /// before any origin hears of it.
    pub(crate) fn refused(&self) -> Option<Error> {
        match self {
            ClientBody::H1(b) => b.0.borrow().body_refused(),
            ClientBody::Empty | ClientBody::H2(_) => None,
        }
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        match self.get_mut() {
            ClientBody::Empty => Poll::Ready(None),
            ClientBody::H1(b) => Pin::new(b).poll_frame(cx),
            ClientBody::H2(b) => match ready!(Pin::new(b).poll_frame(cx)) {
                Some(Ok(frame)) => Poll::Ready(Some(Ok(frame))),
                Some(Err(e)) => {
                    let err = if is_malformed_body(&e) {
                        Error::new(Kind::BadRequest, "malformed request body")
                    } else {
                        Error::new(Kind::ClientGone, "client request body failed")
                    };
                    Poll::Ready(Some(Err(err.with_source(e))))
                }
                None => Poll::Ready(None),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Empty => true,
            ClientBody::H1(b) => b.is_end_stream(),
            ClientBody::H2(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Empty => SizeHint::with_exact(0),
            ClientBody::H1(b) => b.size_hint(),
            ClientBody::H2(b) => b.size_hint(),
        }
    }
}

/// The downstream request body on its way upstream.
pub enum RequestBody {
    /// No body (or a replayed bodyless request).
    Empty,
    /// A body read whole: for the replay buffer (retries) or for a filter (body opt-in),
    /// which may have replaced it; `None` once sent.
    Buffered(Option<Bytes>),
    /// The client's body, streamed with a size cap and a bound on the wait between reads
    /// (made by [`RequestBody::stream`]).
    Stream {
        inner: ClientBody,
        limit: u64,
        seen: u64,
        state: Rc<RequestBodyState>,
        gap: ReadGap,
    },
}

impl RequestBody {
    /// The client's body streamed with a size cap (`limit`) and the longest the client may
    /// leave it with nothing to read (`gap`, the route's `client_body_timeout`).
    pub(crate) fn stream(
        inner: ClientBody,
        limit: u64,
        gap: Duration,
    ) -> (RequestBody, Rc<RequestBodyState>) {
        let state = Rc::new(RequestBodyState::default());
        let body = RequestBody::Stream {
            inner,
            limit,
            seen: 0,
            state: state.clone(),
            gap: ReadGap::new(gap),
        };
        (body, state)
    }
}

/// A body stream keymaster itself ended: the route's size cap or the request deadline.
#[derive(Debug)]
pub(crate) struct BodyStopped(pub(crate) &'static str);

impl std::fmt::Display for BodyStopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}
impl std::error::Error for BodyStopped {}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RequestBody::Empty => Poll::Ready(None),
            RequestBody::Buffered(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            RequestBody::Stream {
                inner,
                limit,
                seen,
                state,
                gap,
            } => {
                let Poll::Ready(next) = Pin::new(&mut *inner).poll_frame(cx) else {
                    return poll_client_wait(gap, state, cx);
                };
                if let Some(since) = gap.read() {
                    let waited = Instant::now().saturating_duration_since(since);
                    state.waited.set(state.waited.get() + waited);
                    state.waiting_since.set(None);
                }
                match next {
                    Some(Ok(frame)) => {
                        if let Some(data) = frame.data_ref() {
                            *seen += data.len() as u64;
                            if *seen > *limit {
                                state.too_large.set(true);
                                return Poll::Ready(Some(Err(Box::new(BodyStopped(
                                    "request body exceeds the route's max_body_size",
                                )))));
                            }
                        }
                        // hyper stops polling a sized body once it is at its end, so the
                        // final `None` may never come: mark the body finished here too.
                        if inner.is_end_stream() {
                            state.finished.set(true);
                        }
                        Poll::Ready(Some(Ok(frame)))
                    }
                    Some(Err(e)) => {
                        if !e.is_client_gone() {
                            state.malformed.set(true);
                        }
                        Poll::Ready(Some(Err(Box::new(e))))
                    }
                    None => {
                        state.finished.set(true);
                        Poll::Ready(None)
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Empty => true,
            RequestBody::Buffered(b) => b.is_none(),
            RequestBody::Stream { inner, .. } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Empty | RequestBody::Buffered(None) => SizeHint::with_exact(0),
            RequestBody::Buffered(Some(b)) => SizeHint::with_exact(b.len() as u64),
            RequestBody::Stream { inner, .. } => inner.size_hint(),
        }
    }
}

/// The client's body has nothing to read: note the wait (the response-header wait does not
/// count it) and end the body once it lasted `client_body_timeout`.
fn poll_client_wait(
    gap: &mut ReadGap,
    state: &RequestBodyState,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    let expired = gap.poll_wait(cx);
    state.waiting_since.set(gap.since);
    ready!(expired);
    state.timed_out.set(true);
    Poll::Ready(Some(Err(Box::new(BodyStopped(
        "the client sent nothing of its request body within client_body_timeout",
    )))))
}

/// Read a streamed request body whole (for a filter, the replay buffer, or the route's
/// `request_buffering`), within the stream's cap and `client_body_timeout` and the request's
/// `deadline` (the client's time to deliver its body is up: 408 too). A body that came in
/// one frame is returned without a copy.
pub(crate) async fn read_whole(
    body: &mut RequestBody,
    deadline: Option<Instant>,
) -> Result<Bytes, Error> {
    let declared = Body::size_hint(&*body).lower();
    let state = match body {
        RequestBody::Stream { state, limit, .. } => {
            if declared > *limit {
                state.too_large.set(true);
            }
            state.clone()
        }
        RequestBody::Buffered(b) => return Ok(b.take().unwrap_or_default()),
        RequestBody::Empty => return Ok(Bytes::new()),
    };
    if let Some(e) = state.error() {
        return Err(e); // a declared length past the cap: refused before reading
    }
    let read = async {
        let (mut first, mut rest) = (None::<Bytes>, None::<bytes::BytesMut>);
        while let Some(frame) = http_body_util::BodyExt::frame(&mut *body).await {
            let frame = frame.map_err(|e| {
                state.error().unwrap_or_else(|| {
                    Error::new(Kind::ClientGone, "client request body failed").with_source(e)
                })
            })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            match (&first, &mut rest) {
                (None, _) => first = Some(data),
                (Some(f), None) => {
                    let mut all = bytes::BytesMut::with_capacity(f.len() + data.len());
                    all.extend_from_slice(f);
                    all.extend_from_slice(&data);
                    rest = Some(all);
                }
                (Some(_), Some(all)) => all.extend_from_slice(&data),
            }
        }
        Ok(rest.map_or_else(|| first.unwrap_or_default(), bytes::BytesMut::freeze))
    };
    let Some(deadline) = deadline else {
        return read.await;
    };
    tokio::time::timeout_at(deadline, read)
        .await
        .unwrap_or_else(|_| {
            Err(Error::new(
                Kind::ClientBodyTimeout,
                "the request deadline passed while reading the request body",
            ))
        })
}

/// hyper's body decoder reports invalid framing (bad chunk size or line ending) as
/// `InvalidData`/`InvalidInput`; a client that went away shows up as EOF or a reset.
fn is_malformed_body(e: &hyper::Error) -> bool {
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput
            );
        }
        src = s.source();
    }
    false
}

use std::future::Future;
