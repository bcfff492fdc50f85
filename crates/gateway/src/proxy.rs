//! The proxy stage: one downstream request in, one response out.
//!
//! ```text
//! handle ─► validate head ─► route ─► shed? ─► [pre, route filters] ─► body cap ─► request headers
//!        ─► cluster cap (queue) ─► attempt::send (choose server, pool | connect, send;
//!             retries and the keep-alive race resend: see `attempt`)
//!        ─► validate response ─► response headers ─► [post filters] ─► stream body (Exchange)
//!  any Err ─► respond::error_response (the one place errors become responses)
//! ```
//!
//! The [`Exchange`] rides inside the response body. When the body ends cleanly it returns the
//! upstream connection to this worker's pool; if the body fails or the client goes away it
//! drops the connection instead, so a half-read response is never reused.

use http::header::{self, HeaderValue};
use http::{Request, Response, Uri, Version};
use std::convert::Infallible;
use std::rc::Rc;
use std::sync::Arc;
use tokio::time::Instant;

use crate::access_log::LogRecord;
use crate::body::{ClientBody, RequestBody, RequestBodyState};
use crate::downstream::ConnCtx;
use crate::filter::{staged, FilterCtx, FilterState};
use crate::respond::{error_response, grpc_error_response};
use crate::route::{host_without_port, HostRewrite, Route};
use crate::snapshot::Snapshot;
use crate::upgrade;
use crate::upstream::{conn::Conn, limits::Slot, Cluster};
use keymaster_config::ProxyProtocol;
use keymaster_http::error::{Error, Kind, Side};
use keymaster_http::headers::{self as hdr, WireHead};

mod attempt;
mod filters;
mod response;

pub use response::{OriginBody, ResponseBody};

/// The response to the client, boxed where it is made: it moves up through the proxy
/// stage's layers to the client connection a pointer at a time.
pub(crate) type ClientResponse = Box<Response<ResponseBody>>;

use crate::overload::InFlightLoad;
use attempt::{Outstanding, Upstream, UpstreamHost};

/// Serve one request. Never fails: errors become responses here.
///
/// A plain function returning an `async` block rather than an `async fn`: the client
/// connection keeps this future while the request runs (hyper's HTTP/2 server boxes it), and
/// an `async fn` would store its request argument twice (the argument and the local it is
/// moved into).
///
/// `wire`: the request's fields in wire form, from keymaster's HTTP/1.1 server (the
/// request's map is then empty); the proxy stage builds the map only if something needs it.
pub(crate) fn handle(
    cx: Rc<ConnCtx>,
    req: Request<ClientBody>,
    wire: Option<Box<WireHead>>,
) -> impl std::future::Future<Output = Result<ClientResponse, Infallible>> {
    let mut req = Some(req);
    async move { handle_in(&cx, &mut req, wire).await }
}

async fn handle_in(
    cx: &Rc<ConnCtx>,
    slot: &mut Option<Request<ClientBody>>,
    wire: Option<Box<WireHead>>,
) -> Result<ClientResponse, Infallible> {
    let start = Instant::now();
    cx.state.request_started(start);
    let mut inflight = InFlight(Some(cx.state.clone()));
    let snapshot = cx.worker.shared.snapshot.load_full();
    // Counted only while load shedding is on (a reload turning it on mid-flight misses the
    // requests already running, briefly).
    let shedding = &snapshot.config.load_shedding;
    let mut info = RequestInfo {
        load: (shedding.max_in_flight != 0).then(|| cx.worker.shared.load.enter()),
        ..Default::default()
    };
    if let (Some(_), Some(req)) = (&cx.worker.shared.access_log, slot.as_ref()) {
        let fields = wire.as_ref().map(|w| &w.fields);
        info.log = Some(Box::new(LogRecord::from_request(req, fields, cx)));
    }
    // The match ends before the error path awaits, so the proxy's result takes no room
    // in this future next to the error path's.
    let err = match proxy(cx, &snapshot, slot, wire, start, &mut info).await {
        Ok(resp) if info.local.is_some() => {
            // Answered by the filter chain: no `Exchange`, finish here.
            let finished = Finished {
                status: resp.status().as_u16(),
                category: info.local.unwrap_or("filter_response"),
                side: Side::Internal,
                elapsed: start.elapsed(),
                bytes_out: resp.body().local_len(),
            };
            record(cx, info.route.as_deref(), info.log.take(), finished);
            drop(inflight);
            return Ok(resp);
        }
        Ok(resp) => {
            // The response body's `Exchange` now finishes the request.
            inflight.0 = None;
            return Ok(resp);
        }
        Err(err) => err,
    };
    if err.is_client_body_timeout() {
        cx.listener.metrics.body_timeouts.inc();
    }
    let via = snapshot.stamps.via(Version::HTTP_11);
    let rid = info
        .request_id
        .as_ref()
        .map(|v| (&cx.listener.request_id_header, v));
    let mut resp = if info.grpc {
        grpc_error_response(&err, rid, via)
    } else {
        error_response(&err, rid, via)
    };
    if let (Some(state), Some(rid)) = (info.filters.as_mut(), rid) {
        // Past the pre/route filters: error and post filters see proxy errors too.
        let failed = || error_response(&err, Some(rid), via);
        resp = snapshot
            .filters
            .proxy_error(state, err.category(), resp, &failed)
            .await;
    }
    let finished = Finished {
        status: resp.status().as_u16(),
        category: err.category(),
        side: err.side(),
        elapsed: start.elapsed(),
        bytes_out: resp.body().local_len(),
    };
    record(cx, info.route.as_deref(), info.log.take(), finished);
    drop(inflight);
    Ok(Box::new(resp))
}

/// Finishes the request on its connection if the handler is dropped before a response (an
/// HTTP/2 stream reset by the client); otherwise the connection would count it in flight
/// forever and never idle out.
pub(crate) struct InFlight(pub(crate) Option<Arc<crate::downstream::ConnState>>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(state) = self.0.take() {
            state.request_finished(Instant::now());
        }
    }
}

/// What the error path needs to know about a request that failed part-way.
#[derive(Default)]
struct RequestInfo {
    request_id: Option<HeaderValue>,
    route: Option<Arc<Route>>,
    log: Option<Box<LogRecord>>,
    /// The filter chain answered: `"filter_response"`, or `"local_filter_error"`.
    local: Option<&'static str>,
    /// What the filters of the request share, once pre and route filters have run.
    filters: Option<FilterState>,
    /// A gRPC call: errors get gRPC-shaped responses.
    grpc: bool,
    /// Counted in the gateway's in-flight requests until the request ends.
    load: Option<InFlightLoad>,
}

/// How a request ended, for metrics and the access log.
struct Finished {
    status: u16,
    /// Zuul-style status category: "success", "filter_response", or an error category.
    category: &'static str,
    side: Side,
    elapsed: std::time::Duration,
    bytes_out: u64,
}

/// The one place a finished request is counted and logged, whoever answered it: the origin
/// (`Exchange`), the filter chain, or an error response.
fn record(cx: &ConnCtx, route: Option<&Route>, log: Option<Box<LogRecord>>, f: Finished) {
    if !matches!(f.category, "success" | "filter_response") {
        cx.worker.shared.metrics.error(f.category, f.side.as_str());
    }
    if let Some(route) = route {
        route.metrics.count(f.status);
        route.metrics.latency.observe(f.elapsed.as_secs_f64());
    }
    if let (Some(mut log), Some(l)) = (log, &cx.worker.shared.access_log) {
        log.status = f.status;
        log.category = f.category;
        log.duration_us = f.elapsed.as_micros() as u64;
        log.bytes_out = f.bytes_out;
        // Every attempt made, as the `tries` list shows (a connect that failed is one).
        log.attempts = log.tries.len() as u32;
        l.write(&log);
    }
}

/// The 500 for a failed filter (through `respond`, like every error).
fn filter_failed(
    snapshot: &Snapshot,
    rid: (&http::HeaderName, &HeaderValue),
) -> Response<ResponseBody> {
    let err = Error::new(Kind::FilterFailed, "a filter failed");
    error_response(&err, Some(rid), snapshot.stamps.via(Version::HTTP_11))
}

async fn proxy(
    cx: &Rc<ConnCtx>,
    snapshot: &Snapshot,
    incoming: &mut Option<Request<ClientBody>>,
    mut wire: Option<Box<WireHead>>,
    start: Instant,
    info: &mut RequestInfo,
) -> Result<ClientResponse, Error> {
    let listener = &cx.listener;
    // What the filters chose (nothing, without filters).
    let mut chosen = filters::Chosen::default();
    let Some(req) = incoming.take() else {
        return Err(Error::new(Kind::BadRequest, "no request")); // polled twice: cannot happen
    };
    let (mut parts, mut body) = req.into_parts();
    // The wire-form fields stay in the server's box (see `WireHead`); the facts come out.
    let facts = match wire.as_mut() {
        Some(w) => std::mem::take(&mut w.facts),
        None => hdr::HeadFacts::of(&parts.headers, &listener.request_id_header),
    };
    let mut scan = facts.scan;
    info.grpc = facts.grpc;
    // Fields kept in wire form go to the origin as they are, unless something needs the map:
    // routes matching on fields, fields the header duties remove or extend, gRPC (its
    // timeout; HTTP/2 upstream). Route-dependent reasons follow once it is chosen. Filters
    // get the wire form and turn it into a map only if they need one.
    let vouches = cx
        .client
        .tls
        .as_ref()
        .is_some_and(|t| t.identity_header.is_some());
    if wire.is_some()
        && (snapshot.router.reads_fields()
            || scan.hop_by_hop
            || scan.expect
            || scan.forwarding
            || facts.grpc
            || listener.forwarded_header
            || vouches)
    {
        to_map(&mut parts.headers, &mut wire);
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
    // One canonical path for routing, the filters and the origin (path.rs).
    let raw_target = keymaster_http::path::canonicalise(&mut parts.uri, &listener.path)?;

    // Request id: propagate the client's or make one. A new one goes into the map when a
    // filter may read the request headers, else it is sent with the other added fields
    // (`AddedFields`).
    let (rid, mut rid_added) = match facts.request_id {
        Some(v) => (v, false),
        None => {
            let v = hdr::new_request_id();
            let in_map = snapshot.filters.wants_request_id_in_map();
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
    };
    info.request_id = Some(rid.clone());

    // Host as the client addressed it: absolute-form / :authority wins over Host (RFC 9112 §3.2.2).
    let mut host_value: Option<HeaderValue> = match parts.uri.authority() {
        Some(a) => HeaderValue::from_str(a.as_str()).ok(),
        None => facts.host,
    };
    let host = host_value
        .as_ref()
        .and_then(|h| h.to_str().ok())
        .map(host_without_port)
        .unwrap_or("");
    let route = snapshot
        .router
        .find(host, parts.uri.path(), &parts.method, &parts.headers)
        .ok_or_else(|| Error::new(Kind::NoRoute, "no route matches the request"))?
        .clone();
    info.route = Some(route.clone());
    // Shed by priority before doing any work for the request.
    crate::overload::ensure_lag_probe(&cx.worker.lag, &snapshot.config.load_shedding);
    crate::overload::check(
        &snapshot.config.load_shedding,
        &cx.worker.shared.load,
        &cx.worker.lag,
        route.shed_priority,
    )
    .inspect_err(|_| {
        cx.worker
            .shared
            .metrics
            .shed(route.shed_priority.as_str())
            .inc()
    })?;
    if let Some(log) = info.log.as_mut() {
        log.route = route.name.to_string();
        log.request_id = rid.to_str().unwrap_or("").to_string();
    }

    // The filter chain's pre and route stages (docs/filters.md).
    if !snapshot.filters.is_empty() {
        let tls = cx.client.tls.as_ref();
        let rid_name = &listener.request_id_header;
        let mut state = FilterState::new(&parts.method, cx.peer, tls, route.name.clone(), rid_name);
        // The context borrows the request head where it is, until the route stage is done.
        let mut ctx = FilterCtx::lent(&mut state, &parts.uri, &mut parts.headers, &mut wire);
        if snapshot.filters.wants_request_body(&ctx) {
            let cap = snapshot
                .config
                .filter_body
                .max_request
                .0
                .min(route.max_body_size);
            let deadline = route.request_timeout.map(|d| start + d);
            let read = crate::filter::read_request_body(&mut body, cap, &route, deadline);
            ctx.put_request_body(read.await?);
        }
        if !staged!(snapshot.filters.inbound(&mut ctx)) {
            let id = (&listener.request_id_header, &rid);
            let (resp, failed) = snapshot
                .filters
                .local_response(&mut ctx, id, || filter_failed(snapshot, id))
                .await;
            info.local = Some(if failed {
                "local_filter_error"
            } else {
                "filter_response"
            });
            return Ok(Box::new(resp));
        }
        drop(ctx);
        // Kept from here on: a proxy-stage error (an unknown cluster a filter chose
        // included) runs the error and post filters.
        let state = info.filters.insert(state);
        filters::handoff(
            snapshot,
            state,
            &mut parts,
            &mut wire,
            rid_name,
            &mut chosen,
        )?;
        // A filter that set the request id header itself wins over a generated one.
        rid_added &= !chosen.request_id_set;
        // Filters may have edited the head: scan it again for the header duties below.
        if chosen.head_touched {
            // A change to a scanned field needs the map (`FilterCtx::set_request_header`).
            debug_assert!(wire.is_none());
            scan = hdr::HeadScan::of(&parts.headers);
            if parts.uri.authority().is_none() {
                host_value = hdr::find(&parts.headers, &header::HOST).cloned();
            }
        }
    }

    // Body cap: refuse a declared oversize body before touching the origin. The length is
    // the one the client's framing declared, which the body's decoder holds it to (or a
    // filter's body), never a Content-Length field a filter or an edit may have changed.
    let declared = match &chosen.body {
        Some(b) => Some(b.len() as u64),
        None => http_body::Body::size_hint(&body).exact(),
    };
    if declared.is_some_and(|n| n > route.max_body_size) {
        return Err(Error::new(
            Kind::BodyTooLarge,
            "request body exceeds the route's limit",
        ));
    }
    // The route's header edits and a Host the origin gets instead of the client's need the
    // map too.
    let keeps_host = chosen.upstream_host.is_none()
        && matches!(route.host_rewrite, HostRewrite::Preserve)
        && parts.uri.authority().is_none()
        && scan.hosts > 0;
    if wire.is_some() && (!keeps_host || !route.request_edits.is_empty()) {
        to_map(&mut parts.headers, &mut wire);
    }
    // No body: no shared state to allocate (`None` reads as "finished, not too large").
    let (upstream_body, body_state) = if let Some(b) = chosen.body {
        // Sent whole: finished from the start, and never replayed as bodyless.
        let state = Rc::new(RequestBodyState::whole());
        (RequestBody::Buffered(Some(b)), Some(state))
    } else if http_body::Body::is_end_stream(&body) {
        (RequestBody::Empty, None)
    } else {
        let (stream, state) =
            RequestBody::stream(body, route.max_body_size, route.client_body_timeout);
        (stream, Some(state))
    };

    // An upgrade the route allows (WebSocket): keep the client's handle for the tunnel.
    let upgrade = upgrade::take_request(&route.upgrade, &mut parts, &scan, body_state.is_none())?;

    // Request header duties.
    if parts.version == Version::HTTP_2 {
        hdr::join_cookies(&mut parts.headers);
    }
    let trailers = hdr::strip_hop_by_hop(&mut parts.headers, &scan);
    if let Some(up) = &upgrade {
        upgrade::restore_request(&mut parts.headers, up);
    }
    if trailers {
        parts
            .headers
            .insert(header::TE, HeaderValue::from_static("trailers"));
    }
    if scan.expect {
        parts.headers.remove(header::EXPECT); // answered by our own listener
    }
    // Forwarding fields and Via: written by the origin client when they replace nothing
    // (`AddedFields`), else edited into the map (where configured edits can see them).
    let via = snapshot.stamps.via(parts.version);
    let rid_field = rid_added.then_some((&listener.request_id_header, &rid));
    let added = if route.request_edits.is_empty() {
        let (fwd, host) = (listener.forwarded_header, host_value.as_ref());
        hdr::AddedFields::for_request(&scan, &cx.client, host, fwd, via, rid_field)
            .map(|a| a.with_client_fields(wire.as_deref().map(|w| &w.fields)))
    } else {
        None
    };
    // Wire-form fields always have `AddedFields` to carry them (every reason it has none
    // built the map above).
    debug_assert!(wire.is_none() || added.is_some());
    if added.is_none() {
        if let Some((name, value)) = rid_field {
            parts.headers.insert(name.clone(), value.clone());
        }
        hdr::add_forwarding(
            &mut parts.headers,
            &cx.client,
            host_value.as_ref(),
            listener.forwarded_header,
        );
        parts.headers.append(header::VIA, via.clone());
        if !route.request_edits.is_empty() {
            route.request_edits.apply(&mut parts.headers);
        }
    }

    // Request target: the canonical path (or the client's, `path.forward = "raw"`) unless a
    // rewrite or a filter set one; origin-form upstream.
    let authority_form = parts.uri.authority().is_some();
    // A path a filter set that is no valid target is the filter's failure, not the client's.
    let rewritten = match chosen.upstream_path {
        Some(p) => Some((
            p,
            Kind::FilterFailed,
            "a filter set an invalid upstream path",
        )),
        None => (route.rewrite(parts.uri.path(), parts.uri.query()))
            .map(|t| (t, Kind::BadRequest, "rewritten target is invalid")),
    };
    if let Some((target, kind, detail)) = rewritten {
        parts.uri = Uri::try_from(target).map_err(|_| Error::new(kind, detail))?;
    } else if let Some(raw) = raw_target {
        parts.uri = Uri::from(raw);
    } else if parts.uri.scheme().is_some() || parts.uri.authority().is_some() {
        let pq = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        parts.uri = Uri::try_from(pq)
            .map_err(|_| Error::new(Kind::BadRequest, "invalid request target"))?;
    }
    let client_version = parts.version;
    parts.version = Version::HTTP_11;

    let cluster = chosen.cluster.unwrap_or_else(|| route.cluster.clone());
    let host = if let Some(h) = chosen.upstream_host {
        UpstreamHost::Set(h)
    } else {
        match &route.host_rewrite {
            // The host the request was routed by: an absolute-form authority replaces a
            // differing Host field (RFC 9112 §3.2.2), so the origin sees what was matched.
            // A plain origin-form request already carries it.
            HostRewrite::Preserve if authority_form || scan.hosts == 0 => match &host_value {
                Some(h) => UpstreamHost::Set(h.clone()),
                None => UpstreamHost::Origin,
            },
            HostRewrite::Preserve => UpstreamHost::Keep,
            HostRewrite::Origin => UpstreamHost::Origin,
            HostRewrite::Fixed(v) => UpstreamHost::Set(v.clone()),
        }
    };

    // The deadline covers the whole exchange, body included; a gRPC client's grpc-timeout
    // shortens it.
    let deadline = route.request_timeout.map(|d| start + d);
    let grpc_timeout = info
        .grpc
        .then(|| keymaster_http::grpc::timeout(&parts.headers))
        .flatten();
    let deadline = match grpc_timeout {
        Some(g) => Some(deadline.map_or(start + g, |d| d.min(start + g))),
        None => deadline,
    };
    // The response head can pass through in wire form when only the header duties and
    // appending post filters touch it: no configured edits, no upgrade, an HTTP/1 client,
    // a body.
    let raw_head = route.response_edits.is_empty()
        && upgrade.is_none()
        && !info.grpc
        && client_version != Version::HTTP_2
        && parts.method != http::Method::HEAD
        && parts.method != http::Method::CONNECT;
    let up = Upstream {
        cx,
        route: &route,
        cluster: &cluster,
        deadline,
        host,
        raw_head,
        added,
    };
    // A body the route buffers or the replay buffer takes is read whole first, before the
    // request takes a place under the cluster's cap: a slow client holds none.
    let upstream_body = attempt::read_ahead(&up, upstream_body).await?;
    // The cluster's request cap (and queue): held until the response body ends.
    let slot = cluster
        .limits
        .admit(&cluster.config.limits, deadline)
        .await
        .inspect_err(|_| cluster.metrics.overflow.inc())?;
    // Boxed: the request moves through the attempt loop and into the connection, 8 bytes
    // at a time.
    let mut request = Some(Box::new(Request::from_parts(parts, upstream_body)));
    let sent = attempt::send(
        &up,
        &mut request,
        body_state.as_deref(),
        info.log.as_deref_mut(),
    )
    .await?;
    let forwarded = Forwarded {
        route,
        cluster,
        rid,
        upgrade,
        client_version,
        deadline,
        body_state,
        slot,
        start,
    };
    finish_response(cx, snapshot, info, forwarded, sent).await
}

/// What the response side of an exchange needs from its request side.
struct Forwarded {
    route: Arc<Route>,
    cluster: Arc<Cluster>,
    rid: HeaderValue,
    upgrade: Option<upgrade::UpgradeRequest>,
    client_version: Version,
    deadline: Option<Instant>,
    body_state: Option<Rc<RequestBodyState>>,
    /// The request's place under the cluster's cap.
    slot: Slot,
    start: Instant,
}

/// The response side of a proxied exchange: header duties, post filters, and the body that
/// finishes the exchange. A function of its own so that none of its locals take room in the
/// request's future while the request waits on the origin.
async fn finish_response(
    cx: &Rc<ConnCtx>,
    snapshot: &Snapshot,
    info: &mut RequestInfo,
    forwarded: Forwarded,
    sent: attempt::Sent,
) -> Result<ClientResponse, Error> {
    let Forwarded {
        route,
        cluster,
        rid,
        upgrade,
        client_version,
        deadline,
        body_state,
        slot,
        start,
    } = forwarded;
    let listener = &cx.listener;
    let (resp, conn, attempts) = (sent.resp, sent.conn, sent.sends);
    // When the head arrived (for the access log only).
    let upstream_head = info.log.is_some().then(|| start.elapsed());

    // Response header duties.
    let (mut rparts, mut rbody) = (*resp).into_parts();
    // A response body buffered for post filters (filter::body).
    let mut prefix = None;
    // The origin's head in wire form (see `raw_head` in `proxy`), else as a map.
    let mut raw = rbody.take_raw_head();
    let (switch, origin_close) = if let Some(r) = raw.as_mut() {
        // The HTTP/1.1 client checked the framing and found no hop-by-hop field to remove:
        // Via and the request id are all the duties left.
        let via = snapshot.stamps.via(rparts.version);
        r.add_proxy_fields(via, (&listener.request_id_header, &rid));
        (None, false)
    } else {
        let rscan = hdr::HeadScan::of(&rparts.headers);
        hdr::validate_response_head(&rparts.headers, &rscan)?;
        let switch = upgrade::accept_response(upgrade, &mut rparts, &mut rbody)?;
        let origin_close = rscan.connection
            && rparts
                .headers
                .get_all(header::CONNECTION)
                .iter()
                .any(connection_has_close);
        hdr::strip_hop_by_hop(&mut rparts.headers, &rscan);
        rparts
            .headers
            .append(header::VIA, snapshot.stamps.via(rparts.version).clone());
        if !route.response_edits.is_empty() {
            route.response_edits.apply(&mut rparts.headers);
        }
        if !rparts.headers.contains_key(&listener.request_id_header) {
            rparts
                .headers
                .insert(listener.request_id_header.clone(), rid.clone());
        }
        (switch, origin_close)
    };
    if let Some(state) = info.filters.as_mut() {
        if snapshot.filters.wants_response_body(state, rparts.status) {
            if let Some(r) = raw.take() {
                rparts.headers = r.to_map(); // a body-reading filter gets the map
            }
            let cap = snapshot.config.filter_body.max_response.0;
            let read =
                crate::filter::read_response_body(&mut rbody, cap, deadline, route.read_timeout);
            state.put_response_body(read.await?);
        }
        // Post filters over the origin's response head.
        let id = (&listener.request_id_header, &rid);
        let failed = || filter_failed(snapshot, id);
        let (status, headers) = (&mut rparts.status, &mut rparts.headers);
        let ctx = FilterCtx::kept(state);
        if let Err(resp) = staged!(snapshot
            .filters
            .outbound(ctx, status, headers, &mut raw, failed))
        {
            // The origin's body is dropped unread, and its connection with it.
            info.local = Some("local_filter_error");
            return Ok(resp);
        }
        if let Some(b) = state.take_response_body() {
            crate::filter::set_body_length(&mut rparts.headers, b.len());
            prefix = Some(b);
        }
    }
    // Post filters that only appended fields leave the head in wire form.
    let raw_head = raw;
    rparts.version = client_version;
    if let Some(switch) = switch {
        // 101: the origin connection now belongs to the tunnel, never to the pool.
        drop(conn);
        let finished = Finished {
            status: 101,
            category: "success",
            side: Side::Origin,
            elapsed: start.elapsed(),
            bytes_out: 0,
        };
        record(cx, Some(&route), info.log.take(), finished);
        // `handle` hands the request's in-flight count to us; the tunnel ends it.
        let inflight = InFlight(Some(cx.state.clone()));
        let metrics = route.metrics.tunnel.clone();
        let body = match switch.start(&mut rparts, cx.clone(), &route.upgrade, metrics, inflight) {
            Some(tunnel) => ResponseBody::Tunnel(tunnel),
            None => ResponseBody::Local(None),
        };
        return Ok(Box::new(Response::from_parts(rparts, body)));
    }

    let max_requests = cluster.config.pool.max_requests_per_connection;
    let reusable =
        conn.is_h1() && !origin_close && (max_requests == 0 || conn.requests < max_requests);
    let status = rparts.status.as_u16();
    if let Some(log) = info.log.as_mut() {
        log.upstream_head_us = upstream_head.map_or(0, |d| d.as_micros() as u64);
        log.sends = attempts;
    }
    let mut exchange = Exchange {
        conn: Some(conn),
        cluster: cluster.clone(),
        cx: cx.clone(),
        route: route.clone(),
        reusable,
        body_state,
        complete: false,
        failure: None,
        bytes: 0,
        status,
        start,
        _outstanding: sent.outstanding,
        _slot: slot,
        _load: info.load.take(),
        log: info.log.take(),
    };
    if http_body::Body::is_end_stream(&rbody) {
        exchange.body_complete();
    }
    let body = OriginBody {
        prefix,
        inner: rbody,
        exchange,
        deadline: deadline.map(|d| Box::pin(tokio::time::sleep_until(d))),
        read_gap: crate::body::ReadGap::new(route.read_timeout),
        grpc: info.grpc,
        ended: false,
        raw_head,
    };
    Ok(Box::new(Response::from_parts(
        rparts,
        ResponseBody::Origin(Box::new(body)),
    )))
}

/// Build the request's map from its wire-form fields, once something needs it.
fn to_map(headers: &mut http::HeaderMap, wire: &mut Option<Box<WireHead>>) {
    if let Some(w) = wire.take() {
        *headers = w.fields.to_map();
    }
}

fn connection_has_close(v: &HeaderValue) -> bool {
    v.to_str()
        .map(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
        .unwrap_or(false)
}

/// The rest of a proxied exchange after the response head: finishes metrics and logs, and
/// returns the upstream connection to the pool only after a clean, complete body.
pub(crate) struct Exchange {
    conn: Option<Conn>,
    /// The cluster the request went to (the route's, or one a route filter chose).
    cluster: Arc<Cluster>,
    cx: Rc<ConnCtx>,
    route: Arc<Route>,
    reusable: bool,
    /// `None`: the request had no body.
    body_state: Option<Rc<RequestBodyState>>,
    complete: bool,
    /// How the body failed: its category, and which side failed it.
    failure: Option<(&'static str, Side)>,
    bytes: u64,
    status: u16,
    start: Instant,
    _outstanding: Outstanding,
    /// The request's place under the cluster's cap.
    _slot: Slot,
    /// The request's place in the gateway's in-flight count (load shedding).
    _load: Option<InFlightLoad>,
    log: Option<Box<LogRecord>>,
}

impl Exchange {
    /// The HTTP/1.1 connection back from a body that ended cleanly.
    pub(crate) fn give_back(&mut self, c: crate::upstream::h1::Connection) {
        if let Some(conn) = self.conn.as_mut() {
            conn.give_back(c);
        }
    }
    pub(crate) fn body_complete(&mut self) {
        self.complete = true;
    }
    /// The origin's side of the exchange failed while the response body streamed.
    pub(crate) fn fail_body(&mut self, category: &'static str) {
        self.failure = Some((category, Side::Origin));
        self.reusable = false;
    }
    /// The response body failed: the origin's fault, unless the request body it was still
    /// being sent failed on the client's side (a stall past `client_body_timeout`).
    pub(crate) fn fail_body_after_request(&mut self) {
        let client = self.body_state.as_deref().and_then(RequestBodyState::error);
        match client {
            Some(e) => {
                if e.is_client_body_timeout() {
                    self.cx.listener.metrics.body_timeouts.inc();
                }
                self.failure = Some((e.category(), Side::Client));
                self.reusable = false;
            }
            None => self.fail_body("origin_body_failure"),
        }
    }
    pub(crate) fn add_body_bytes(&mut self, n: usize) {
        self.bytes += n as u64;
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        let complete = self.complete && self.failure.is_none();
        let now = Instant::now();
        if let Some(conn) = self.conn.take() {
            let body_sent = self.body_state.as_ref().is_none_or(|s| s.finished.get());
            let private = self.cluster.config.proxy_protocol != ProxyProtocol::Off;
            if complete && self.reusable && body_sent && private {
                // Names this client in its PROXY header: reused by this client connection only.
                *self.cx.private_upstream.borrow_mut() = Some(conn);
            } else if complete && self.reusable && body_sent {
                let pool = &self.cluster.config.pool;
                self.cx
                    .worker
                    .pools
                    .put(conn, pool.max_idle, pool.idle_timeout.get(), now);
            }
            // Otherwise the connection drops here and closes: never reuse a half-read one.
        }
        let (category, side) = match (complete, self.failure) {
            (_, Some(failure)) => failure,
            (true, None) => ("success", Side::Origin),
            (false, None) => ("client_cancelled", Side::Origin),
        };
        let finished = Finished {
            status: self.status,
            category,
            side,
            elapsed: now.saturating_duration_since(self.start),
            bytes_out: self.bytes,
        };
        record(&self.cx, Some(&self.route), self.log.take(), finished);
        self.cx.state.request_finished(now);
    }
}

impl LogRecord {
    fn from_request(
        req: &Request<ClientBody>,
        wire: Option<&hdr::RawRequestFields>,
        cx: &ConnCtx,
    ) -> LogRecord {
        let h = |n: header::HeaderName| {
            let value = match wire {
                Some(w) => w.get(n.as_str()),
                None => req.headers().get(&n).map(HeaderValue::as_bytes),
            };
            value
                .and_then(|v| std::str::from_utf8(v).ok())
                .unwrap_or("")
                .to_string()
        };
        LogRecord {
            client: cx.peer.ip().to_string(),
            method: req.method().to_string(),
            uri: req.uri().to_string(),
            version: match req.version() {
                Version::HTTP_10 => "HTTP/1.0",
                Version::HTTP_2 => "HTTP/2.0",
                _ => "HTTP/1.1",
            },
            user_agent: h(header::USER_AGENT),
            referer: h(header::REFERER),
            attempts: 0,
            sends: 0,
            ..Default::default()
        }
    }
}
