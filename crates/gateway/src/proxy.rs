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
use http::{Request, Response, Version};
use std::convert::Infallible;
use std::rc::Rc;
use std::sync::Arc;
use tokio::time::Instant;

use crate::access_log::LogRecord;
use crate::body::{ClientBody, RequestBodyState};
use crate::downstream::ConnCtx;
use crate::filter::FilterState;
use crate::respond::{error_response, grpc_error_response};
use crate::route::Route;
use crate::snapshot::{ClusterRef, RouteRef, Snapshot, SnapshotRef};
use crate::upgrade;
use crate::upstream::{conn::Conn, limits::Slot, Cluster};
use keymaster_config::ProxyProtocol;
use keymaster_http::error::{Error, Kind, Side};
use keymaster_http::headers::{self as hdr, WireHead};

mod attempt;
mod compressed;
mod filters;
mod mirror;
mod pick;
mod request;
mod response;
mod trace;

pub(crate) use mirror::Mirror;
pub(crate) use response::ResponseBody;
pub(crate) use trace::Tracing;

/// The response to the client, boxed where it is made: it moves up through the proxy
/// stage's layers to the client connection a pointer at a time.
pub(crate) type ClientResponse = Box<Response<ResponseBody>>;

use crate::overload::InFlightLoad;
use attempt::{Outstanding, Upstream};
use response::Forwarded;

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
    let snapshot = cx.worker.snapshot();
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
            let records = info.done();
            record(cx, info.route.as_deref(), records, finished);
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
    let records = info.done();
    record(cx, info.route.as_deref(), records, finished);
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
    route: Option<RouteRef>,
    log: Option<Box<LogRecord>>,
    /// The filter chain answered: `"filter_response"`, or `"local_filter_error"`.
    local: Option<&'static str>,
    /// What the filters of the request share, once pre and route filters have run.
    filters: Option<FilterState>,
    /// A gRPC call: errors get gRPC-shaped responses.
    grpc: bool,
    /// Counted in the gateway's in-flight requests until the request ends.
    load: Option<InFlightLoad>,
    /// The request's trace (`[traces]` on).
    trace: Option<Box<keymaster_trace::RequestTrace>>,
}

impl RequestInfo {
    /// The request's records, for `record` when it ends.
    fn done(&mut self) -> Records {
        if let Some(t) = self.trace.as_mut() {
            let steps = self
                .filters
                .as_mut()
                .and_then(|f| f.extras_mut()?.steps.take());
            trace::add_steps(t, steps.unwrap_or_default());
        }
        Records {
            log: self.log.take(),
            trace: self.trace.take(),
        }
    }
}

/// What a finished request is written into: its access-log line and its trace.
#[derive(Default)]
pub(crate) struct Records {
    log: Option<Box<LogRecord>>,
    trace: Option<Box<keymaster_trace::RequestTrace>>,
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
fn record(cx: &ConnCtx, route: Option<&Route>, records: Records, f: Finished) {
    if !matches!(f.category, "success" | "filter_response") {
        cx.worker.shared.metrics.error(f.category, f.side.as_str());
    }
    if let Some(route) = route {
        route.metrics.count(f.status, f.elapsed);
    }
    if let Some(t) = records.trace {
        trace::end(cx, *t, f.status, f.category);
    }
    if let (Some(mut log), Some(l)) = (records.log, &cx.worker.shared.access_log) {
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

/// The request's phases in order (each one in `request`, the response's in `response`).
async fn proxy(
    cx: &Rc<ConnCtx>,
    snapshot: &SnapshotRef,
    incoming: &mut Option<Request<ClientBody>>,
    mut wire: Option<Box<WireHead>>,
    start: Instant,
    info: &mut RequestInfo,
) -> Result<ClientResponse, Error> {
    let Some(req) = incoming.take() else {
        return Err(Error::new(Kind::BadRequest, "no request")); // polled twice: cannot happen
    };
    let (mut parts, mut body) = req.into_parts();
    let head = request::Head::new(&mut parts, &mut body, &mut wire);
    let mut req = request::receive(cx, snapshot, head, info, start)?;
    if !snapshot.filters.is_empty() {
        let h = request::Head::new(&mut parts, &mut body, &mut wire);
        if let Some(resp) = request::inbound_filters(cx, snapshot, h, &mut req, start, info).await?
        {
            return Ok(resp);
        }
    }
    // The parts of `req` move out one by one where they are used.
    let (held_route, scan, chosen) = (req.route, req.scan, req.chosen);
    // The cluster (weighted clusters may read a field) and a hash cluster's key, from the
    // head as the client sent it (the path before any rewrite).
    let fields = pick::Fields::new(&parts.headers, wire.as_deref());
    let held_cluster = pick::cluster(&held_route, chosen.cluster, fields);
    // Reached once, used below by reference.
    let (route, cluster): (&Route, &Cluster) = (&held_route, &held_cluster);
    let (key, affinity) = pick::hash_key(cluster, fields, &parts.uri, &cx.peer);
    let (upstream_body, body_state) = request::upstream_body(route, chosen.body, body)?;
    let filter_host = chosen.upstream_host.is_some();
    if wire.is_some() && request::route_needs_map(route, filter_host, &parts.uri, &scan) {
        to_map(&mut parts.headers, &mut wire);
    }
    // An upgrade the route allows (WebSocket): keep the client's handle for the tunnel.
    let bodyless = body_state.is_none();
    let upgrade = upgrade::take_request(&route.upgrade, &mut parts, &scan, bodyless)?;
    // Read before the route's request edits: what the client itself accepts.
    let skip = upgrade.is_some() || info.grpc;
    let compress = (route.compression.is_some())
        .then(|| compressed::offer(route, &parts, wire.as_deref(), skip))
        .flatten();
    let kept = request::Kept {
        host: req.host_value.as_ref(),
        rid: (req.rid_added).then_some((&cx.listener.request_id_header, &req.rid)),
        wire: wire.as_deref(),
    };
    let via = snapshot.stamps.via(parts.version);
    let up_ = upgrade.as_ref();
    let added = request::header_duties(cx, via, route, &mut parts, &scan, kept, up_);
    let authority_form = parts.uri.authority().is_some();
    request::upstream_target(route, &mut parts.uri, chosen.upstream_path, req.raw_target)?;
    let client_version = parts.version;
    parts.version = Version::HTTP_11;
    let routed_by = req.host_value.as_ref();
    let host = request::upstream_host(
        route,
        chosen.upstream_host,
        authority_form,
        &scan,
        routed_by,
    );
    let deadline = request::deadline(route, start, info.grpc, &parts.headers);
    // A generated affinity cookie is added to the response's map.
    let raw_head = affinity.is_none()
        && response::passes_raw(
            route,
            up_.is_some(),
            info.grpc,
            client_version,
            &parts.method,
        );
    let mut up = Upstream::new(cx, route, cluster, deadline, host, raw_head, added);
    up.key = key;
    // A body the route buffers or the replay buffer takes is read whole first, before the
    // request takes a place under the cluster's cap: a slow client holds none.
    let mirror = route.mirror.as_ref().filter(|m| m.sampled());
    let upstream_body = attempt::read_ahead(&up, upstream_body, mirror).await?;
    if let Some(m) = mirror {
        mirror::launch(&cx.worker, m, mirror::Copy::of(&parts, &upstream_body, &up));
    }
    // The cluster's request cap (and queue): held until the response body ends.
    let slot = (cluster.limits.admit(&cluster.config.limits, deadline).await)
        .inspect_err(|_| cluster.metrics.overflow.inc())?;
    // Boxed: the request moves through the attempt loop and into the connection, 8 bytes
    // at a time.
    let mut request = Some(Box::new(Request::from_parts(parts, upstream_body)));
    let notes = attempt::Notes {
        log: info.log.as_deref_mut(),
        trace: info.trace.as_deref_mut(),
    };
    let sent = attempt::send(&up, &mut request, body_state.as_deref(), notes).await?;
    let forwarded = Forwarded {
        route: held_route,
        cluster: held_cluster,
        rid: req.rid,
        client_version,
        deadline,
        body_state,
        slot,
        start,
        compress,
    };
    response::finish_response(cx, snapshot, info, forwarded, upgrade, sent, affinity).await
}

/// Build the request's map from its wire-form fields, once something needs it.
fn to_map(headers: &mut http::HeaderMap, wire: &mut Option<Box<WireHead>>) {
    if let Some(w) = wire.take() {
        *headers = w.fields.to_map();
    }
}

/// The rest of a proxied exchange after the response head: finishes metrics and logs, and
/// returns the upstream connection to the pool only after a clean, complete body.
pub(crate) struct Exchange {
    conn: Option<Conn>,
    /// The cluster the request went to (the route's, or one a route filter chose).
    cluster: ClusterRef,
    cx: Rc<ConnCtx>,
    route: RouteRef,
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
    records: Records,
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
        let records = std::mem::take(&mut self.records);
        record(&self.cx, Some(&self.route), records, finished);
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
