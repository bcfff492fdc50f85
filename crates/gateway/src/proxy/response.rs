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

use http::header::{self, HeaderValue};
use http::{Response, Version};
use std::rc::Rc;
use tokio::time::Instant;

use super::attempt::Sent;
use super::{record, ClientResponse, Exchange, Finished, InFlight, RequestInfo};
use crate::body::{BodyStopped, ReadGap, RequestBodyState};
use crate::downstream::ConnCtx;
use crate::filter::{staged, FilterCtx, FilterState};
use crate::route::Route;
use crate::snapshot::{ClusterRef, RouteRef, Snapshot};
use crate::upgrade;
use crate::upstream::conn::{Conn, UpstreamBody};
use crate::upstream::limits::Slot;
use crate::upstream::Cluster;
use keymaster_http::error::{BoxError, Error, Side};
use keymaster_http::headers::{self as hdr, RawHead};

/// The origin's response body as the upstream client delivers it.
type OriginResponseBody = UpstreamBody;

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
    /// The origin's body, compressed as it streams (a route with `compression`).
    Compressed(Box<super::compressed::CompressedBody>),
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
            ResponseBody::Origin(o) => poll_origin(o, cx, true),
            ResponseBody::Compressed(c) => c.poll(cx),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Local(b) => b.is_none(),
            ResponseBody::Tunnel(_) => true,
            ResponseBody::Origin(o) => o.ended || (o.prefix.is_none() && o.inner.is_end_stream()),
            ResponseBody::Compressed(c) => c.is_end_stream(),
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
            // Not known until the encoder finished: chunked, or HTTP/2 DATA frames.
            ResponseBody::Compressed(_) => SizeHint::default(),
        }
    }
}

/// The origin's body, a frame at a time: the buffered prefix first, the request deadline and
/// `read_timeout` enforced, the `Exchange` told how it ends. `count`: the frames' bytes are
/// what the client gets (the access log's `bytes_out`); a compressed body counts its own.
#[inline(always)]
pub(super) fn poll_origin(
    o: &mut OriginBody,
    cx: &mut Context<'_>,
    count: bool,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    if o.ended {
        return Poll::Ready(None);
    }
    if let Some(b) = o.prefix.take() {
        if count {
            o.exchange.add_body_bytes(b.len());
        }
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
                if count {
                    o.exchange.add_body_bytes(data.len());
                }
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

/// Whether the response head can pass through in wire form: only the header duties and
/// appending post filters touch it (no configured edits, no compression, no upgrade, not
/// gRPC, an HTTP/1 client), and it has a body (not HEAD or CONNECT).
#[inline(always)]
pub(super) fn passes_raw(
    route: &Route,
    upgrade: bool,
    grpc: bool,
    client_version: Version,
    method: &http::Method,
) -> bool {
    route.response_edits.is_empty()
        && route.compression.is_none()
        && !upgrade
        && !grpc
        && client_version != Version::HTTP_2
        && method != http::Method::HEAD
        && method != http::Method::CONNECT
}

/// The origin's response head where `finish_response` keeps it, as the phases get it.
type Head<'h> = (
    &'h mut http::response::Parts,
    &'h mut OriginResponseBody,
    &'h mut Option<RawHead>,
);

/// What the response side of an exchange needs from its request side.
pub(super) struct Forwarded {
    pub(super) route: RouteRef,
    pub(super) cluster: ClusterRef,
    pub(super) rid: HeaderValue,
    pub(super) client_version: Version,
    pub(super) deadline: Option<Instant>,
    pub(super) body_state: Option<Rc<RequestBodyState>>,
    /// The request's place under the cluster's cap.
    pub(super) slot: Slot,
    pub(super) start: Instant,
    /// What the client accepts, when the route compresses (`compressed::offer`).
    pub(super) compress: Option<crate::compress::Offer>,
}

/// The response side of a proxied exchange, a phase each (`affinity`: the token of an
/// affinity cookie generated for the request, set on the response): the header duties
/// ([`response_duties`]), the post filters ([`outbound_filters`]), then a tunnel for a
/// `101` ([`tunnel`]) or the body that streams the origin's and finishes the exchange. A
/// function of its own so that none of its locals take room in the request's future while
/// the request waits on the origin.
pub(super) async fn finish_response(
    cx: &Rc<ConnCtx>,
    snapshot: &Snapshot,
    info: &mut RequestInfo,
    forwarded: Forwarded,
    upgrade: Option<upgrade::UpgradeRequest>,
    sent: Sent,
    affinity: Option<u64>,
) -> Result<ClientResponse, Error> {
    // When the head arrived (for the access log only).
    let upstream_head = info.log.is_some().then(|| forwarded.start.elapsed());
    let (mut rparts, mut rbody) = (*sent.resp).into_parts();
    // The origin's head in wire form (see `raw_head` in `proxy`), else as a map.
    let mut raw = rbody.take_raw_head();
    if let Some(token) = affinity {
        set_affinity_cookie(&forwarded.cluster, token, &mut rparts, &mut raw);
    }
    let head = (&mut rparts, &mut rbody, &mut raw);
    let (switch, origin_close) = response_duties(cx, snapshot, &forwarded, upgrade, head)?;
    // A response body buffered for post filters (filter::body).
    let mut prefix = None;
    if let Some(state) = info.filters.as_mut() {
        let head = (&mut rparts, &mut rbody, &mut raw);
        match outbound_filters(cx, snapshot, state, &forwarded, head).await? {
            Ok(p) => prefix = p,
            Err(resp) => {
                // The origin's body is dropped unread, and its connection with it.
                info.local = Some("local_filter_error");
                return Ok(resp);
            }
        }
    }
    let raw_head = raw;
    rparts.version = forwarded.client_version;
    if let Some(switch) = switch {
        return Ok(tunnel(cx, info, &forwarded, switch, sent.conn, rparts));
    }
    if let Some(log) = info.log.as_mut() {
        log.upstream_head_us = upstream_head.map_or(0, |d| d.as_micros() as u64);
        log.sends = sent.sends;
    }
    // The body streams the origin's and owns the `Exchange`: the connection goes back to
    // the pool when the body ended cleanly (and the cluster's limits allow).
    let (conn, max_requests) = (
        sent.conn,
        forwarded.cluster.config.pool.max_requests_per_connection,
    );
    let reusable =
        conn.is_h1() && !origin_close && (max_requests == 0 || conn.requests < max_requests);
    let mut exchange = Exchange {
        conn: Some(conn),
        cluster: forwarded.cluster,
        cx: cx.clone(),
        route: forwarded.route.clone(),
        reusable,
        body_state: forwarded.body_state,
        complete: false,
        failure: None,
        bytes: 0,
        status: rparts.status.as_u16(),
        start: forwarded.start,
        _outstanding: sent.outstanding,
        _slot: forwarded.slot,
        _load: info.load.take(),
        records: info.done(),
    };
    if http_body::Body::is_end_stream(&rbody) {
        exchange.body_complete();
    }
    // Boxed where it is made: the common path moves a pointer, not the body.
    let body = Box::new(OriginBody {
        prefix,
        inner: rbody,
        exchange,
        deadline: forwarded
            .deadline
            .map(|d| Box::pin(tokio::time::sleep_until(d))),
        read_gap: ReadGap::new(forwarded.route.read_timeout),
        grpc: info.grpc,
        ended: false,
        raw_head,
    });
    let body = match (&forwarded.route.compression, forwarded.compress) {
        (Some(policy), Some(offer)) => super::compressed::respond(policy, offer, &mut rparts, body),
        _ => ResponseBody::Origin(body),
    };
    Ok(Box::new(Response::from_parts(rparts, body)))
}

/// The response header duties. A head in wire form (the HTTP/1.1 client checked its
/// framing and found no hop-by-hop field to remove) gets Via and the request id; a map is
/// validated, may switch protocols (`101`), loses its hop-by-hop fields and gets Via, the
/// route's edits and the request id. Returns the switch, and whether the origin said
/// `Connection: close`.
#[inline(always)]
fn response_duties(
    cx: &ConnCtx,
    snapshot: &Snapshot,
    f: &Forwarded,
    upgrade: Option<upgrade::UpgradeRequest>,
    head: Head<'_>,
) -> Result<(Option<upgrade::Switch>, bool), Error> {
    let (rparts, rbody, raw) = head;
    let rid_name = &cx.listener.request_id_header;
    if let Some(r) = raw.as_mut() {
        r.add_proxy_fields(snapshot.stamps.via(rparts.version), (rid_name, &f.rid));
        return Ok((None, false));
    }
    let rscan = hdr::HeadScan::of(&rparts.headers);
    hdr::validate_response_head(&rparts.headers, &rscan)?;
    let switch = upgrade::accept_response(upgrade, rparts, rbody)?;
    let origin_close = rscan.connection
        && (rparts.headers.get_all(header::CONNECTION).iter()).any(connection_has_close);
    hdr::strip_hop_by_hop(&mut rparts.headers, &rscan);
    let via = snapshot.stamps.via(rparts.version).clone();
    rparts.headers.append(header::VIA, via);
    if !f.route.response_edits.is_empty() {
        f.route.response_edits.apply(&mut rparts.headers);
    }
    if !rparts.headers.contains_key(rid_name) {
        rparts.headers.insert(rid_name.clone(), f.rid.clone());
    }
    Ok((switch, origin_close))
}

/// The affinity cookie generated for the request (`token`), on the response (its head as
/// a map).
fn set_affinity_cookie(
    cluster: &Cluster,
    token: u64,
    rparts: &mut http::response::Parts,
    raw: &mut Option<RawHead>,
) {
    let Some(h) = cluster.hashing.as_deref() else {
        return;
    };
    if let Some(r) = raw.take() {
        rparts.headers = r.to_map();
    }
    if let Some(v) = h.policy.set_cookie(token) {
        rparts.headers.append(header::SET_COOKIE, v);
        h.metrics.cookies.inc();
    }
}

/// The `post` filters over the origin's response head, its body read first for filters
/// that asked for it (body opt-in). `Ok(Ok(prefix))`: the body a filter kept or set, sent
/// before the rest; `Ok(Err(response))`: a filter failed and this is the answer instead.
async fn outbound_filters(
    cx: &ConnCtx,
    snapshot: &Snapshot,
    state: &mut FilterState,
    f: &Forwarded,
    head: Head<'_>,
) -> Result<Result<Option<Bytes>, ClientResponse>, Error> {
    let (rparts, rbody, raw) = head;
    if snapshot.filters.wants_response_body(state, rparts.status) {
        if let Some(r) = raw.take() {
            rparts.headers = r.to_map(); // a body-reading filter gets the map
        }
        let cap = snapshot.config.filter_body.max_response.0;
        let read = crate::filter::read_response_body(rbody, cap, f.deadline, f.route.read_timeout);
        state.put_response_body(read.await?);
    }
    let id = (&cx.listener.request_id_header, &f.rid);
    let failed = || super::filter_failed(snapshot, id);
    let (status, headers) = (&mut rparts.status, &mut rparts.headers);
    let ctx = FilterCtx::kept(state);
    if let Err(resp) = staged!(snapshot.filters.outbound(ctx, status, headers, raw, failed)) {
        return Ok(Err(resp));
    }
    // Post filters that only appended fields leave the head in wire form.
    Ok(Ok(state.take_response_body().inspect(|b| {
        crate::filter::set_body_length(&mut rparts.headers, b.len());
    })))
}

/// A `101`: the origin connection now belongs to the tunnel, never to the pool; the
/// request is counted as done, and the tunnel ends its in-flight count.
fn tunnel(
    cx: &Rc<ConnCtx>,
    info: &mut RequestInfo,
    f: &Forwarded,
    switch: upgrade::Switch,
    conn: Conn,
    mut rparts: http::response::Parts,
) -> ClientResponse {
    drop(conn);
    let finished = Finished {
        status: 101,
        category: "success",
        side: Side::Origin,
        elapsed: f.start.elapsed(),
        bytes_out: 0,
    };
    record(cx, Some(&f.route), info.done(), finished);
    // `handle` hands the request's in-flight count to us; the tunnel ends it.
    let inflight = InFlight(Some(cx.state.clone()));
    let metrics = f.route.metrics.tunnel.clone();
    let body = match switch.start(&mut rparts, cx.clone(), &f.route.upgrade, metrics, inflight) {
        Some(tunnel) => ResponseBody::Tunnel(tunnel),
        None => ResponseBody::Local(None),
    };
    Box::new(Response::from_parts(rparts, body))
}

fn connection_has_close(v: &HeaderValue) -> bool {
    v.to_str()
        .map(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
        .unwrap_or(false)
}
