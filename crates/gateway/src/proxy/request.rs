//! The request side of the proxy stage, a function per phase (the order is `proxy` in
//! `proxy.rs`):
//!
//! 1. [`receive`]: the head checked and made canonical, the request id, the route, and
//!    load shedding. Nothing has gone anywhere yet.
//! 2. [`inbound_filters`]: the `pre` and `route` filters, which may answer the request.
//! 3. [`upstream_body`], [`header_duties`], [`upstream_target`], [`upstream_host`] and
//!    [`deadline`]: what the origin gets.
//!
//! The head and the body stay where `proxy` keeps them; the phases borrow them ([`Head`]).
//!
//! The head stays in wire form (the HTTP/1.1 server's bytes, see `WireHead`) as long as no
//! phase needs the fields as a map; each phase says when it does.

use http::header::{self, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Uri, Version};
use std::rc::Rc;
use tokio::time::Instant;

use super::attempt::UpstreamHost;
use super::{filter_failed, filters, to_map, ClientResponse, RequestInfo};
use crate::body::{ClientBody, RequestBody, RequestBodyState};
use crate::downstream::{ConnCtx, ListenerCtx};
use crate::filter::{staged, FilterCtx, FilterState};
use crate::route::{host_without_port, HostRewrite, Route};
use crate::snapshot::{RouteRef, Snapshot, SnapshotRef};
use keymaster_http::error::{Error, Kind};
use keymaster_http::headers::{self as hdr, AddedFields, WireHead};

/// What the request phases found out about a request, beside its head and body (which stay
/// where `proxy` keeps them: moving them between phases would copy them).
pub(super) struct Inbound {
    pub(super) scan: hdr::HeadScan,
    /// The client's own target bytes, when the listener forwards them (`path.forward`).
    pub(super) raw_target: Option<PathAndQuery>,
    pub(super) rid: HeaderValue,
    /// The request id was made here and is not in the map: it goes with `AddedFields`.
    pub(super) rid_added: bool,
    /// Host as the client addressed it (an absolute-form authority wins over Host).
    pub(super) host_value: Option<HeaderValue>,
    pub(super) route: RouteRef,
    /// What the filters chose (nothing, without filters).
    pub(super) chosen: filters::Chosen,
}

/// The request's head and body where `proxy` keeps them, as the phases get them.
pub(super) struct Head<'h> {
    pub(super) parts: &'h mut http::request::Parts,
    pub(super) body: &'h mut ClientBody,
    /// The fields in wire form, while no phase needed the map (`parts.headers` is empty).
    pub(super) wire: &'h mut Option<Box<WireHead>>,
}

impl<'h> Head<'h> {
    #[inline(always)]
    pub(super) fn new(
        parts: &'h mut http::request::Parts,
        body: &'h mut ClientBody,
        wire: &'h mut Option<Box<WireHead>>,
    ) -> Self {
        Head { parts, body, wire }
    }
}

/// Phase 1: check the head, make the path canonical, give the request its id and route,
/// and shed it if the gateway is overloaded.
#[inline(always)]
pub(super) fn receive(
    cx: &Rc<ConnCtx>,
    snapshot: &SnapshotRef,
    head: Head<'_>,
    info: &mut RequestInfo,
    start: Instant,
) -> Result<Inbound, Error> {
    let listener = &cx.listener;
    let Head { parts, body, wire } = head;
    // The wire-form fields stay in the server's box (see `WireHead`); the facts come out.
    let facts = match wire.as_mut() {
        Some(w) => std::mem::take(&mut w.facts),
        None => hdr::HeadFacts::of(&parts.headers, &listener.request_id_header),
    };
    let scan = facts.scan;
    info.grpc = facts.grpc;
    if wire.is_some() && needs_map(cx, snapshot, &scan, facts.grpc) {
        to_map(&mut parts.headers, wire);
    }
    hdr::validate_request_head(
        &parts.method,
        &parts.uri,
        parts.version,
        &parts.headers,
        facts.host.as_ref(),
        &scan,
        &listener.limits,
    )?;
    if let Some(err) = body.refused() {
        return Err(err);
    }
    // One canonical path for routing, the filters and the origin (keymaster_http::path).
    let raw_target = keymaster_http::path::canonicalise(&mut parts.uri, &listener.path)?;
    let sent = kept_request_id(cx, facts.request_id, parts, wire);
    let in_map = snapshot.filters.wants_request_id_in_map();
    let (rid, rid_added) = request_id(listener, sent, in_map, parts, wire);
    info.request_id = Some(rid.clone());
    // Host as the client addressed it: absolute-form / :authority wins over Host (RFC 9112
    // §3.2.2).
    let host_value: Option<HeaderValue> = match parts.uri.authority() {
        Some(a) => HeaderValue::from_str(a.as_str()).ok(),
        None => facts.host,
    };
    let route = route_and_shed(cx, snapshot, parts, host_value.as_ref())?;
    info.route = Some(route.clone());
    if let Some(t) = &cx.worker.shared.traces {
        let trace = super::trace::begin(t, cx, &route, parts, &rid, start.into_std());
        info.trace = Some(trace);
    }
    if let Some(log) = info.log.as_mut() {
        log.route = route.name.to_string();
        log.request_id = rid.to_str().unwrap_or("").to_string();
        if let Some(t) = &info.trace {
            log.trace_id = t.trace_id.to_hex();
        }
    }
    Ok(Inbound {
        scan,
        raw_target,
        rid,
        rid_added,
        host_value,
        route,
        chosen: filters::Chosen::default(),
    })
}

/// Fields kept in wire form go to the origin as they are, unless something needs the map:
/// routes matching on fields, fields the header duties remove or extend, gRPC (its timeout;
/// HTTP/2 upstream). Route-dependent reasons follow once it is chosen; filters get the wire
/// form and turn it into a map only if they need one.
#[inline(always)]
fn needs_map(cx: &ConnCtx, snapshot: &Snapshot, scan: &hdr::HeadScan, grpc: bool) -> bool {
    let vouches = cx
        .client
        .tls
        .as_ref()
        .is_some_and(|t| t.identity_header.is_some());
    snapshot.router.reads_fields()
        || scan.hop_by_hop()
        || scan.expect
        || scan.forwarding
        || grpc
        || cx.listener.forwarded_header
        || cx.worker.shared.traces.is_some()
        || vouches
}

/// The request id the client sent, if the listener keeps it from this peer
/// (`request_id_from`); one it does not keep is taken out of the fields (a new one is made).
#[inline(always)]
fn kept_request_id(
    cx: &ConnCtx,
    sent: Option<HeaderValue>,
    parts: &mut http::request::Parts,
    wire: &mut Option<Box<WireHead>>,
) -> Option<HeaderValue> {
    let sent = sent?;
    if cx.client.trusted || cx.listener.request_id_from_any {
        return Some(sent);
    }
    let name = &cx.listener.request_id_header;
    match wire.as_mut() {
        Some(w) => w.fields.remove(name),
        None => {
            parts.headers.remove(name);
        }
    }
    None
}

/// The client's request id, or a new one. A new one goes into the fields when a filter may
/// read the request headers (`in_map`), else it is sent with the other added fields
/// (`AddedFields`): the second value says so.
#[inline(always)]
fn request_id(
    listener: &ListenerCtx,
    sent: Option<HeaderValue>,
    in_map: bool,
    parts: &mut http::request::Parts,
    wire: &mut Option<Box<WireHead>>,
) -> (HeaderValue, bool) {
    if let Some(v) = sent {
        return (v, false);
    }
    let v = hdr::new_request_id();
    if in_map {
        let name = listener.request_id_header.clone();
        match wire.as_mut() {
            // The client sent no such field: appending is setting.
            Some(w) => w.fields.append(name, v.clone()),
            None => {
                parts.headers.insert(name, v.clone());
            }
        }
    }
    (v, !in_map)
}

/// The route the request matches, then load shedding by the route's priority, before any
/// work is done for the request.
#[inline(always)]
fn route_and_shed(
    cx: &Rc<ConnCtx>,
    snapshot: &SnapshotRef,
    parts: &http::request::Parts,
    host_value: Option<&HeaderValue>,
) -> Result<RouteRef, Error> {
    let host = host_value
        .and_then(|h| h.to_str().ok())
        .map(host_without_port)
        .unwrap_or("");
    let route = Snapshot::find_route(
        snapshot,
        host,
        parts.uri.path(),
        &parts.method,
        &parts.headers,
    )
    .ok_or_else(|| Error::new(Kind::NoRoute, "no route matches the request"))?;
    let shedding = &snapshot.config.load_shedding;
    crate::overload::ensure_lag_probe(&cx.worker.lag, shedding);
    let shared = &cx.worker.shared;
    crate::overload::check(shedding, &shared.load, &cx.worker.lag, route.shed_priority)
        .inspect_err(|_| shared.metrics.shed(route.shed_priority.as_str()).inc())?;
    Ok(route)
}

/// Phase 2: the `pre` and `route` filters (docs/filters.md). `Some`: they answered the
/// request. Otherwise what they chose is in `req.chosen`, and the filter state is kept in
/// `info` for the `post` and `error` stages.
pub(super) async fn inbound_filters(
    cx: &Rc<ConnCtx>,
    snapshot: &Snapshot,
    head: Head<'_>,
    req: &mut Inbound,
    start: Instant,
    info: &mut RequestInfo,
) -> Result<Option<ClientResponse>, Error> {
    let listener = &cx.listener;
    let tls = cx.client.tls.as_deref();
    let rid_name = &listener.request_id_header;
    let Head { parts, body, wire } = head;
    let route = &req.route;
    let mut state = FilterState::new(&parts.method, cx.peer, tls, route.name.clone(), rid_name);
    if info.trace.as_ref().is_some_and(|t| t.sampled) {
        state.record_steps();
    }
    // The context borrows the request head where it is, until the route stage is done.
    let mut ctx = FilterCtx::lent(&mut state, &parts.uri, &mut parts.headers, wire);
    if snapshot.filters.wants_request_body(&ctx) {
        let cap = snapshot.config.filter_body.max_request.0;
        let cap = cap.min(route.max_body_size);
        let deadline = route.request_timeout.map(|d| start + d);
        let read = crate::filter::read_request_body(body, cap, route, deadline);
        ctx.put_request_body(read.await?);
    }
    if !staged!(snapshot.filters.inbound(&mut ctx)) {
        let id = (rid_name, &req.rid);
        let (resp, failed) = snapshot
            .filters
            .local_response(&mut ctx, id, || filter_failed(snapshot, id))
            .await;
        info.local = Some(match failed {
            true => "local_filter_error",
            false => "filter_response",
        });
        return Ok(Some(Box::new(resp)));
    }
    drop(ctx);
    // Kept from here on: a proxy-stage error (an unknown cluster a filter chose included)
    // runs the error and post filters.
    let state = info.filters.insert(state);
    let chosen = &mut req.chosen;
    filters::handoff(snapshot, state, parts, wire, rid_name, chosen)?;
    // A filter that set the request id header itself wins over a generated one.
    req.rid_added &= !chosen.request_id_set;
    // Filters may have edited the head: scan it again for the header duties.
    if chosen.head_touched {
        // A change to a scanned field needs the map (`FilterCtx::set_request_header`).
        debug_assert!(wire.is_none());
        req.scan = hdr::HeadScan::of(&parts.headers);
        if parts.uri.authority().is_none() {
            req.host_value = hdr::find(&parts.headers, &header::HOST).cloned();
        }
    }
    Ok(None)
}

/// What the added fields refer to (borrowed from what `proxy` keeps).
pub(super) struct Kept<'a> {
    /// Host as the client addressed it.
    pub(super) host: Option<&'a HeaderValue>,
    /// A request id made here that is not in the map.
    pub(super) rid: Option<(&'a HeaderName, &'a HeaderValue)>,
    /// The client's fields in wire form (the map is empty then).
    pub(super) wire: Option<&'a WireHead>,
}

/// The route's header edits, and a Host the origin gets instead of the client's, need the
/// fields as a map.
#[inline(always)]
pub(super) fn route_needs_map(
    route: &Route,
    filter_host: bool,
    uri: &Uri,
    scan: &hdr::HeadScan,
) -> bool {
    let keeps_host = !filter_host
        && matches!(route.host_rewrite, HostRewrite::Preserve)
        && uri.authority().is_none()
        && scan.hosts > 0;
    // A mirror copies the request's fields from the map.
    !keeps_host || !route.request_edits.is_empty() || route.mirror.is_some()
}

/// Phase 3a: the body the origin gets. A declared oversize body is refused before the
/// origin is touched: the length is the one the client's framing declared, which the
/// body's decoder holds it to (or a filter's body), never a Content-Length field a filter
/// or an edit may have changed. The state is shared with the proxy stage (`None`: no body).
#[inline(always)]
pub(super) fn upstream_body(
    route: &Route,
    chosen: Option<bytes::Bytes>,
    body: ClientBody,
) -> Result<(RequestBody, Option<Rc<RequestBodyState>>), Error> {
    let declared = match &chosen {
        Some(b) => Some(b.len() as u64),
        None => http_body::Body::size_hint(&body).exact(),
    };
    if declared.is_some_and(|n| n > route.max_body_size) {
        return Err(Error::new(
            Kind::BodyTooLarge,
            "request body exceeds the route's limit",
        ));
    }
    Ok(if let Some(b) = chosen {
        // Sent whole: finished from the start, and never replayed as bodyless.
        let state = Rc::new(RequestBodyState::whole());
        (RequestBody::Buffered(Some(b)), Some(state))
    } else if http_body::Body::is_end_stream(&body) {
        (RequestBody::Empty, None)
    } else {
        let (stream, state) =
            RequestBody::stream(body, route.max_body_size, route.client_body_timeout);
        (stream, Some(state))
    })
}

/// Phase 3b: the request header duties: cookies joined (HTTP/2), hop-by-hop fields out,
/// `TE: trailers` kept, `Expect` answered here; then forwarding fields, Via, the request id
/// and the route's edits. Those are written by the origin client when they replace nothing
/// (the `AddedFields` returned, which also carries wire-form fields), else edited into the
/// map, where configured edits can see them.
#[inline(always)]
pub(super) fn header_duties<'a>(
    cx: &'a ConnCtx,
    via: &'a HeaderValue,
    route: &Route,
    parts: &mut http::request::Parts,
    scan: &hdr::HeadScan,
    kept: Kept<'a>,
    upgrade: Option<&crate::upgrade::UpgradeRequest>,
) -> Option<AddedFields<'a>> {
    if parts.version == Version::HTTP_2 {
        hdr::join_cookies(&mut parts.headers);
    }
    let trailers = hdr::strip_hop_by_hop(&mut parts.headers, scan);
    if let Some(up) = upgrade {
        crate::upgrade::restore_request(&mut parts.headers, up);
    }
    if trailers {
        let te = HeaderValue::from_static("trailers");
        parts.headers.insert(header::TE, te);
    }
    if scan.expect {
        parts.headers.remove(header::EXPECT); // answered by our own listener
    }
    let fwd = cx.listener.forwarded_header;
    if route.request_edits.is_empty() {
        let added = hdr::AddedFields::for_request(scan, &cx.client, kept.host, fwd, via, kept.rid);
        if let Some(a) = added {
            return Some(a.with_client_fields(kept.wire.map(|w| &w.fields)));
        }
    }
    // Wire-form fields always have `AddedFields` to carry them (every reason it has none
    // built the map before).
    debug_assert!(kept.wire.is_none());
    if let Some((name, value)) = kept.rid {
        parts.headers.insert(name.clone(), value.clone());
    }
    hdr::add_forwarding(&mut parts.headers, &cx.client, kept.host, fwd);
    parts.headers.append(header::VIA, via.clone());
    if !route.request_edits.is_empty() {
        route.request_edits.apply(&mut parts.headers);
    }
    None
}

/// Phase 3c: the request target the origin gets, in origin form: a path a filter set, else
/// the route's rewrite, else the canonical path (or the client's bytes, `path.forward =
/// "raw"`). A path a filter set that is no valid target is the filter's failure.
#[inline(always)]
pub(super) fn upstream_target(
    route: &Route,
    uri: &mut Uri,
    filter_path: Option<String>,
    raw_target: Option<PathAndQuery>,
) -> Result<(), Error> {
    let rewritten = match filter_path {
        Some(p) => Some((
            p,
            Kind::FilterFailed,
            "a filter set an invalid upstream path",
        )),
        None => (route.rewrite(uri.path(), uri.query()))
            .map(|t| (t, Kind::BadRequest, "rewritten target is invalid")),
    };
    if let Some((target, kind, detail)) = rewritten {
        *uri = Uri::try_from(target).map_err(|_| Error::new(kind, detail))?;
    } else if let Some(raw) = raw_target {
        *uri = Uri::from(raw);
    } else if uri.scheme().is_some() || uri.authority().is_some() {
        let pq = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        *uri = Uri::try_from(pq)
            .map_err(|_| Error::new(Kind::BadRequest, "invalid request target"))?;
    }
    Ok(())
}

/// Phase 3d: the Host the origin gets: one a filter set, else the route's policy. With
/// `preserve`, the host the request was routed by: an absolute-form authority replaces a
/// differing Host field (RFC 9112 §3.2.2), so the origin sees what was matched; a plain
/// origin-form request already carries it.
#[inline(always)]
pub(super) fn upstream_host(
    route: &Route,
    filter_host: Option<HeaderValue>,
    authority_form: bool,
    scan: &hdr::HeadScan,
    host_value: Option<&HeaderValue>,
) -> UpstreamHost {
    if let Some(h) = filter_host {
        return UpstreamHost::Set(h);
    }
    match &route.host_rewrite {
        HostRewrite::Preserve if authority_form || scan.hosts == 0 => match host_value {
            Some(h) => UpstreamHost::Set(h.clone()),
            None => UpstreamHost::Origin,
        },
        HostRewrite::Preserve => UpstreamHost::Keep,
        HostRewrite::Origin => UpstreamHost::Origin,
        HostRewrite::Fixed(v) => UpstreamHost::Set(v.clone()),
    }
}

/// Phase 3e: the deadline of the whole exchange, body included: the route's
/// `request_timeout`, shortened by a gRPC client's `grpc-timeout`.
#[inline(always)]
pub(super) fn deadline(
    route: &Route,
    start: Instant,
    grpc: bool,
    headers: &http::HeaderMap,
) -> Option<Instant> {
    let deadline = route.request_timeout.map(|d| start + d);
    let grpc_timeout = grpc
        .then(|| keymaster_http::grpc::timeout(headers))
        .flatten();
    match grpc_timeout {
        Some(g) => Some(deadline.map_or(start + g, |d| d.min(start + g))),
        None => deadline,
    }
}
