//! The proxy stage's side of response compression (`crate::compress`): what the request
//! offers ([`offer`]), whether its response is compressed ([`respond`]), and the body that
//! compresses the origin's as it streams ([`CompressedBody`]).
//!
//! The body never holds more than one frame of the origin's body and up to [`EMIT_AT`] of
//! compressed bytes. It sends what the encoder has whenever the origin pauses (its body has
//! nothing more to read right now), flushing the encoder first, so a stream (server-sent
//! events, long polls) reaches the client as it comes; a body that arrives faster than it
//! can be sent is compressed into frames of about [`EMIT_AT`] bytes.

use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::Method;
use http_body::{Body, Frame};
use std::task::{Context, Poll};

use super::response::{poll_origin, OriginBody, ResponseBody};
use crate::compress::{self, Encoder, Offer, Policy};
use crate::route::Route;
use keymaster_http::error::BoxError;
use keymaster_http::headers::WireHead;

/// Compressed bytes that make a frame without waiting for the origin to pause.
const EMIT_AT: usize = 16 * 1024;

/// What the client accepts, for a route that compresses; `None` when the route does not, or
/// the request's response is never compressed (HEAD, `skip`: an upgrade, gRPC). The
/// request's fields are in `wire` when it has them, else in `parts`.
pub(super) fn offer(
    route: &Route,
    parts: &http::request::Parts,
    wire: Option<&WireHead>,
    skip: bool,
) -> Option<Offer> {
    let policy = route.compression.as_ref()?;
    if skip || parts.method == Method::HEAD {
        return None;
    }
    let name = header::ACCEPT_ENCODING.as_str();
    Some(match wire {
        Some(w) => policy.offer(w.fields.get_all(name)),
        None => policy.offer(parts.headers.get_all(name).iter().map(|v| v.as_bytes())),
    })
}

/// The body the client gets: the origin's as it is, or compressed when the route offers it,
/// the response may be compressed and the client accepts an algorithm. An eligible response
/// gets `Vary: Accept-Encoding` either way: what a cache stores depends on it.
pub(super) fn respond(
    policy: &Policy,
    offer: Offer,
    parts: &mut http::response::Parts,
    body: Box<OriginBody>,
) -> ResponseBody {
    let empty = body.prefix.is_none() && body.inner.is_end_stream();
    if empty || body.raw_head.is_some() {
        return ResponseBody::Origin(body);
    }
    if !policy.eligible(parts.status, &parts.headers) {
        return ResponseBody::Origin(body);
    }
    compress::add_vary(&mut parts.headers);
    let Some(a) = offer.0 else {
        return ResponseBody::Origin(body);
    };
    let size = compress::content_length(&parts.headers);
    let Ok(encoder) = Encoder::new(a, &policy.levels, size) else {
        return ResponseBody::Origin(body);
    };
    compress::encoded_head(&mut parts.headers, a);
    let i = compress::index(a);
    policy.metrics.responses[i].inc();
    ResponseBody::Compressed(Box::new(CompressedBody {
        origin: body,
        encoder,
        bytes_in: policy.metrics.bytes_in[i].clone(),
        bytes_out: policy.metrics.bytes_out[i].clone(),
        unflushed: false,
        ended: false,
        trailers: None,
    }))
}

/// The origin's body, compressed as it streams.
pub struct CompressedBody {
    origin: Box<OriginBody>,
    encoder: Encoder,
    bytes_in: crate::metrics::sharded::Counter,
    bytes_out: crate::metrics::sharded::Counter,
    /// Written to the encoder since its last flush.
    unflushed: bool,
    /// The origin's body ended and the encoder finished.
    ended: bool,
    /// The origin's trailers, sent after the last compressed bytes.
    trailers: Option<HeaderMap>,
}

impl CompressedBody {
    /// The compressed bytes ready, as a frame (counted for metrics and the access log).
    fn emit(&mut self) -> Option<Result<Frame<Bytes>, BoxError>> {
        let out = self.encoder.take();
        if out.is_empty() {
            return None;
        }
        self.bytes_out.inc_by(out.len() as u64);
        self.origin.exchange.add_body_bytes(out.len());
        Some(Ok(Frame::data(out)))
    }

    fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.bytes_in.inc_by(data.len() as u64);
        self.unflushed = true;
        self.encoder.write(data)
    }

    #[inline]
    pub(super) fn is_end_stream(&self) -> bool {
        self.ended && self.trailers.is_none() && self.encoder.pending() == 0
    }

    /// The origin paused: what it sent since the last flush goes out now.
    fn paused(&mut self) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if std::mem::take(&mut self.unflushed) {
            if let Err(e) = self.encoder.flush() {
                return failed(e);
            }
        }
        self.emit().map_or(Poll::Pending, |f| Poll::Ready(Some(f)))
    }

    /// The next frame for the client: compressed bytes once about [`EMIT_AT`] of them are
    /// ready or the origin pauses, then the origin's trailers.
    pub(super) fn poll(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if self.ended {
                return Poll::Ready(
                    self.emit()
                        .or_else(|| self.trailers.take().map(|t| Ok(Frame::trailers(t)))),
                );
            }
            match poll_origin(&mut self.origin, cx, false) {
                Poll::Pending => return self.paused(),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        if let Err(e) = self.write(&data) {
                            return failed(e);
                        }
                        if self.encoder.pending() >= EMIT_AT {
                            return Poll::Ready(self.emit());
                        }
                    }
                    Err(frame) => self.trailers = frame.into_trailers().ok(),
                },
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => {
                    self.ended = true;
                    if let Err(e) = self.encoder.finish() {
                        return failed(e);
                    }
                }
            }
        }
    }
}

fn failed(e: std::io::Error) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    Poll::Ready(Some(Err(Box::new(e))))
}
