//! Body opt-in (issue 4, Model §3): filters that declare they need the request or the
//! response body get it buffered, up to `[filter_body]` caps; every other request streams
//! untouched. This module owns the decision (does a filter that wants the body match this
//! request?), the buffering with its caps, and the `FilterCtx` accessors; the proxy stage
//! only calls it at two points (before `pre`, before `post`).

use crate::body::{ClientBody, RequestBody};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;

use super::{FilterChain, FilterCtx, FilterStage, State};
use keymaster_http::error::{Error, Kind};

impl FilterChain {
    /// Whether a `pre`/`route` filter that needs the request body matches this request.
    #[inline(always)]
    pub(crate) fn wants_request_body(&self, ctx: &FilterCtx<'_>) -> bool {
        self.request_body && self.request_body_matches(ctx)
    }

    fn request_body_matches(&self, ctx: &FilterCtx<'_>) -> bool {
        self.pre_and_route()
            .iter()
            .any(|e| e.needs.contains(super::Needs::REQUEST_BODY) && e.matcher.matches(ctx))
    }

    /// Whether a `post` filter that needs the response body matches this request (and the
    /// response can have a body at all: not HEAD, 204 or 304).
    #[inline(always)]
    pub(crate) fn wants_response_body(&self, state: &mut State, status: http::StatusCode) -> bool {
        self.response_body && self.response_body_matches(&FilterCtx::kept(state), status)
    }

    fn response_body_matches(&self, ctx: &FilterCtx<'_>, status: http::StatusCode) -> bool {
        ctx.method() != http::Method::HEAD
            && status != http::StatusCode::NO_CONTENT
            && status != http::StatusCode::NOT_MODIFIED
            && self
                .stage(FilterStage::Post)
                .iter()
                .any(|e| e.needs.contains(super::Needs::RESPONSE_BODY) && e.matcher.matches(ctx))
    }
}

/// A buffered body replaces the streamed one: its length is exact, the framing follows.
pub(crate) fn set_length(headers: &mut http::HeaderMap, len: usize) {
    headers.remove(http::header::TRANSFER_ENCODING);
    headers.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
}

/// Read the client's body to its end for a filter: 413 past `cap` bytes (a declared length
/// past it before reading), 408 when the client leaves it with nothing to read for the
/// route's `client_body_timeout` or the request's `deadline` passes. `body` is at its end
/// afterwards.
pub(crate) async fn read_request(
    body: &mut ClientBody,
    cap: u64,
    route: &crate::route::Route,
    deadline: Option<tokio::time::Instant>,
) -> Result<Bytes, Error> {
    let inner = std::mem::replace(body, ClientBody::Empty);
    let (mut stream, state) = RequestBody::stream(inner, cap, route.client_body_timeout);
    crate::body::read_whole(&mut stream, deadline)
        .await
        .map_err(|e| match state.too_large.get() {
            true => too_large_request(),
            false => e,
        })
}

fn too_large_request() -> Error {
    Error::new(
        Kind::BodyTooLarge,
        "request body exceeds what a body-reading filter may buffer",
    )
}

/// Read the origin's body to its end, failing with 502 past `cap` bytes and with 504 when
/// nothing arrives for `read_timeout` or the request's `deadline` passes: the bounds of a
/// streamed body, which is cut off instead (here nothing has gone to the client yet).
/// `body` stays usable: it is at its end afterwards, so the exchange completes normally.
pub(crate) async fn read_response(
    body: &mut crate::upstream::conn::UpstreamBody,
    cap: u64,
    deadline: Option<tokio::time::Instant>,
    read_timeout: std::time::Duration,
) -> Result<Bytes, Error> {
    let too_large = || {
        Error::new(
            Kind::ResponseBodyTooLarge,
            "origin body exceeds what a body-reading filter may buffer",
        )
    };
    if http_body::Body::size_hint(body).lower() > cap {
        return Err(too_large());
    }
    let read = async {
        let mut buf = BytesMut::new();
        loop {
            let frame = match tokio::time::timeout(read_timeout, body.frame()).await {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(_) => {
                    return Err(Error::new(
                        Kind::ResponseHeaderTimeout,
                        "origin body stalled past read_timeout while buffering",
                    ))
                }
            };
            let frame = frame.map_err(|e| {
                Error::new(Kind::OriginReset, "origin body failed while buffering").with_source(e)
            })?;
            if let Ok(data) = frame.into_data() {
                if (buf.len() + data.len()) as u64 > cap {
                    return Err(too_large());
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok(buf.freeze())
    };
    let Some(deadline) = deadline else {
        return read.await;
    };
    match tokio::time::timeout_at(deadline, read).await {
        Ok(r) => r,
        Err(_) => Err(Error::new(
            Kind::RequestTimeout,
            "origin body not complete by the deadline while buffering",
        )),
    }
}
