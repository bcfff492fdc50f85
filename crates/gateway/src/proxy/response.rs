//! The response body on its way to the client: a body keymaster made, the origin's body
//! streamed (owning the [`Exchange`] that returns the upstream connection to its pool only
//! once the body ended cleanly), or nothing for a tunnel. Frames pass through one by one, so
//! backpressure flows from the slower side to the faster one.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::time::Sleep;

use super::Exchange;
use crate::body::{BodyStopped, ReadGap};
use crate::upstream::conn::UpstreamBody;
use keymaster_http::error::BoxError;

/// The body sent to the client.
pub enum ResponseBody {
    /// A body keymaster produced (errors, admin pages); `None` once sent.
    Local(Option<Bytes>),
    /// The origin's body, streamed. Boxed: the response is moved several times on its way
    /// to the client connection, and ~450 bytes per move cost more than one allocation.
    Origin(Box<OriginBody>),
    /// A `101` to an HTTP/1.1 client: no body; the client connection becomes the client
    /// side of this tunnel once the head is written.
    Tunnel(Box<crate::upgrade::Tunnel>),
}

impl ResponseBody {
    /// The length of a body keymaster produced (0 for any other, or once sent): what an
    /// error or filter-made response writes, for the access log.
    pub(crate) fn local_len(&self) -> u64 {
        match self {
            ResponseBody::Local(Some(b)) => b.len() as u64,
            _ => 0,
        }
    }

    pub fn full(bytes: impl Into<Bytes>) -> Self {
        let b = bytes.into();
        ResponseBody::Local(if b.is_empty() { None } else { Some(b) })
    }
}

/// The origin's response body plus the exchange it finishes.
pub struct OriginBody {
    /// A body buffered for post filters (body opt-in), sent before `inner` (then at its end).
    pub(crate) prefix: Option<Bytes>,
    pub(crate) inner: UpstreamBody,
    pub(crate) exchange: Exchange,
    pub(crate) deadline: Option<Pin<Box<Sleep>>>,
    /// The wait for more of the body, bounded by the route's `read_timeout`: the longest the
    /// origin may leave the body with nothing to read (nginx's `proxy_read_timeout`,
    /// HAProxy's `timeout server`).
    pub(crate) read_gap: ReadGap,
    /// A gRPC call: a deadline that passes mid-body ends it with DEADLINE_EXCEEDED trailers
    /// instead of a reset.
    pub(crate) grpc: bool,
    /// Ended by the gateway (the gRPC trailers were sent).
    pub(crate) ended: bool,
    /// The response's header fields in wire form, for the HTTP/1.1 server to write as they
    /// are (the response's `HeaderMap` is then empty).
    pub(crate) raw_head: Option<keymaster_http::headers::RawHead>,
}

impl Drop for OriginBody {
    /// An HTTP/1.1 connection whose body ended cleanly goes back to the exchange (which
    /// pools it, as it is dropped right after this).
    fn drop(&mut self) {
        if let Some(c) = self.inner.take_reusable() {
            self.exchange.give_back(c);
        }
    }
}

impl OriginBody {
    /// The origin's body has nothing to read: it has `read_timeout` from the last read (from
    /// the first wait after the head) to send more, or the response is cut off (the client
    /// connection is aborted, the origin's closed).
    fn poll_read_gap(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        ready!(self.read_gap.poll_wait(cx));
        self.exchange.fail_body("origin_read_timeout");
        Poll::Ready(Some(Err(Box::new(BodyStopped(
            "the origin sent nothing of the response body within read_timeout",
        )))))
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ResponseBody::Local(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ResponseBody::Tunnel(_) => Poll::Ready(None),
            ResponseBody::Origin(o) => {
                if o.ended {
                    return Poll::Ready(None);
                }
                if let Some(b) = o.prefix.take() {
                    o.exchange.add_body_bytes(b.len());
                    if o.inner.is_end_stream() {
                        o.exchange.body_complete();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(b))));
                }
                if let Some(d) = o.deadline.as_mut() {
                    if d.as_mut().poll(cx).is_ready() {
                        o.exchange.fail_body("origin_request_timeout");
                        if o.grpc {
                            o.ended = true;
                            let err = keymaster_http::error::Error::new(
                                keymaster_http::error::Kind::RequestTimeout,
                                "request deadline passed while streaming the response",
                            );
                            let trailers = crate::respond::grpc_trailers(&err);
                            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                        }
                        return Poll::Ready(Some(Err(Box::new(BodyStopped(
                            "request deadline exceeded while streaming the response body",
                        )))));
                    }
                }
                let Poll::Ready(next) = Pin::new(&mut o.inner).poll_frame(cx) else {
                    return o.poll_read_gap(cx);
                };
                o.read_gap.read();
                match next {
                    Some(Ok(frame)) => {
                        if let Some(data) = frame.data_ref() {
                            o.exchange.add_body_bytes(data.len());
                        }
                        if o.inner.is_end_stream() {
                            o.exchange.body_complete();
                        }
                        Poll::Ready(Some(Ok(frame)))
                    }
                    Some(Err(e)) => {
                        // The request body still going out may be what failed (the origin
                        // answered early): a client that stalled it is not the origin's fault.
                        o.exchange.fail_body_after_request();
                        Poll::Ready(Some(Err(e)))
                    }
                    None => {
                        o.exchange.body_complete();
                        Poll::Ready(None)
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Local(b) => b.is_none(),
            ResponseBody::Tunnel(_) => true,
            ResponseBody::Origin(o) => o.ended || (o.prefix.is_none() && o.inner.is_end_stream()),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Local(None) | ResponseBody::Tunnel(_) => SizeHint::with_exact(0),
            ResponseBody::Local(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ResponseBody::Origin(o) => match &o.prefix {
                Some(b) if o.inner.is_end_stream() => SizeHint::with_exact(b.len() as u64),
                Some(_) => SizeHint::default(),
                None => o.inner.size_hint(),
            },
        }
    }
}
