//! Sending a request upstream: one loop of tries that covers the route's retry policy, the
//! move of a request that was never sent to another server, and the keep-alive race.
//!
//! ```text
//! choose server (healthy, untried first) ─► pool checkout | connect ─► send ─► response head
//!    ▲                                      └ stale pooled connection failed before a
//!    │                                        response: resend once on a fresh connection
//!    │                                        (not a policy retry: no budget, no back-off)
//!    ├── never sent? another server at once: no budget token, no back-off, not an attempt;
//!    │   at most one try per server of the cluster, within the deadline
//!    └── retry? attempts left, retryable outcome, budget token, back-off fits the deadline
//! ```
//!
//! Never sent: the connect failed (refused, timed out, TLS) or hit the server's connection
//! cap, or a connection failed before any byte of the request was written (any method). A
//! keep-alive race resend the server refused counts as never sent for idempotent methods
//! only: the server died, maybe after acting on the first copy. The budget is for retries of
//! requests an origin may have received; a never-sent try cost its server nothing.
//!
//! Retryable by the policy: a request never sent once every server was tried (any method); a
//! reset before the response head, a response-head timeout (the per-try timeout), or a
//! status in the route's `retry.statuses` (idempotent methods only). A request is resent
//! only if it can be rebuilt: no body, or a body read whole into the replay buffer (a request
//! never sent still holds its body). Every try feeds passive outlier detection (a refused
//! connection ejects its server at once) and, when the access log is on, its `tries`.

use http::header::{self, HeaderValue};
use http::{Method, Request};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::time::Instant;

use crate::access_log::{LogRecord, TryRecord};
use crate::body::{RequestBody, RequestBodyState};
use crate::downstream::ConnCtx;
use crate::route::Route;
use crate::upstream::conn::{Conn, HeadTimedOut, HeadWait, OriginResponse, SendWithin};
use crate::upstream::limits::RetryToken;
use crate::upstream::pool::checkout;
use crate::upstream::{Cluster, OriginServer};
use keymaster_config::Balance;
use keymaster_http::error::{Error, Kind};

/// The Host header each attempt sends.
pub(super) enum UpstreamHost {
    /// Leave the request's own Host field.
    Keep,
    /// The chosen server's address.
    Origin,
    /// This value.
    Set(HeaderValue),
}

/// What one request's attempts share.
pub(super) struct Upstream<'a> {
    pub(super) cx: &'a Rc<ConnCtx>,
    pub(super) route: &'a Route,
    pub(super) cluster: &'a Cluster,
    pub(super) deadline: Option<Instant>,
    pub(super) host: UpstreamHost,
    /// The response head may pass through as bytes: nothing but the proxy stage's own
    /// fields changes in it (see `finish_response`).
    pub(super) raw_head: bool,
    /// Forwarding fields and Via, when not in the request's map.
    pub(super) added: Option<keymaster_http::headers::AddedFields<'a>>,
    /// A hash cluster's key for the request (`None`: the cluster does not hash, or the
    /// request has no key).
    pub(super) key: Option<u64>,
}

impl<'a> Upstream<'a> {
    #[inline(always)]
    pub(super) fn new(
        cx: &'a Rc<ConnCtx>,
        route: &'a Route,
        cluster: &'a Cluster,
        deadline: Option<Instant>,
        host: UpstreamHost,
        raw_head: bool,
        added: Option<keymaster_http::headers::AddedFields<'a>>,
    ) -> Self {
        Upstream {
            cx,
            route,
            cluster,
            deadline,
            host,
            raw_head,
            added,
            key: None,
        }
    }
}

/// The attempt that got a response head to pass on.
pub(super) struct Sent {
    pub(super) resp: OriginResponse,
    pub(super) conn: Conn,
    pub(super) outstanding: Outstanding,
    /// Requests sent upstream for this client request (retries and resends included).
    pub(super) sends: u32,
}

/// A request rebuilt for each send: head, plus the buffered body if there is one. Boxed
/// where kept: only retries and the HTTP/2 keep-alive race need one.
struct Template {
    method: Method,
    uri: http::Uri,
    headers: http::HeaderMap,
    body: Option<bytes::Bytes>,
}

impl Template {
    fn build(&self) -> Request<RequestBody> {
        let body = match &self.body {
            Some(b) => RequestBody::Buffered(Some(b.clone())),
            None => RequestBody::Empty,
        };
        let mut r = Request::new(body);
        *r.method_mut() = self.method.clone();
        *r.uri_mut() = self.uri.clone();
        *r.headers_mut() = self.headers.clone();
        r
    }
}

/// Methods a retry may repeat after the origin may have seen the request (RFC 9110 §9.2.2).
fn idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// Read the request body whole before the first attempt when the route buffers requests
/// (`request_buffering`: the origin gets it with a Content-Length) or when its declared length
/// fits the replay buffer and retries are on (so a retry can resend it). Other bodies are
/// streamed, and never retried once sent. The read is bounded by the route's cap (413),
/// `client_body_timeout` and the request's deadline (408).
pub(super) async fn read_ahead(
    up: &Upstream<'_>,
    mut body: RequestBody,
    mirror: Option<&super::Mirror>,
) -> Result<RequestBody, Error> {
    if !matches!(body, RequestBody::Stream { .. }) {
        return Ok(body);
    }
    let retry = &up.route.retry;
    // The length the client's framing declared (the body's decoder holds it to it), not a
    // Content-Length field, which a filter or an edit may have changed.
    let declared = http_body::Body::size_hint(&body).exact();
    let replays = retry.attempts > 1 && declared.is_some_and(|n| n <= retry.replay_buffer.get());
    // A mirrored body is copied whole (within the mirror's cap).
    let mirrored = mirror.is_some_and(|m| declared.is_some_and(|n| n <= m.max_body));
    if !(up.route.request_buffering || replays || mirrored) {
        return Ok(body);
    }
    let whole = crate::body::read_whole(&mut body, up.deadline).await?;
    Ok(RequestBody::Buffered(Some(whole)))
}

/// The client's body broke the rules or stalled while being sent.
fn body_error(state: Option<&RequestBodyState>) -> Option<Error> {
    state?.error()
}

/// One attempt's failure. A request never sent is back in the caller's slot.
struct Failed {
    err: Error,
    sends: u32,
    /// A copy of the request may have reached the server: it went out on a pooled
    /// connection that failed, and only the keep-alive race's resend of it did not.
    reached: bool,
}

impl Failed {
    /// The request went out (it is not back in the slot).
    fn sent(err: Error, sends: u32) -> Failed {
        Failed {
            err,
            sends,
            reached: true,
        }
    }

    /// The request may be back in the slot, unsent; `reached`: an earlier copy went out.
    fn unsent(err: Error, sends: u32, reached: bool) -> Failed {
        Failed {
            err,
            sends,
            reached,
        }
    }
}

/// What follows a failed try.
enum Next {
    /// Another server at once: the request never left keymaster, so the try cost its server
    /// nothing (no budget token, no back-off, not one of the route's attempts).
    Unsent,
    /// A retry of the route's policy, after its back-off, holding its budget token.
    Retry(RetryToken, std::time::Duration),
}

/// Where one request's tries stand.
struct Tally {
    /// The route's attempts so far, the first included (tries that never sent the request
    /// are not counted).
    attempt: u32,
    /// Tries that never sent the request.
    unsent: usize,
    /// The method may be repeated after the origin may have seen it.
    may_repeat: bool,
}

/// What a request's tries are written into: the access log's `tries` and the trace's
/// client spans (either may be off).
pub(super) struct Notes<'a> {
    pub(super) log: Option<&'a mut LogRecord>,
    pub(super) trace: Option<&'a mut keymaster_trace::RequestTrace>,
}

/// Send with the route's retry policy. `slot` holds the request (taken when it goes out; put
/// back when it was never sent). `body_state` is `None` for bodyless requests.
///
/// The request travels in a slot rather than by value so that the futures of this loop,
/// which every in-flight request carries, hold it once instead of once per level.
pub(super) async fn send(
    up: &Upstream<'_>,
    slot: &mut Option<Box<Request<RequestBody>>>,
    body_state: Option<&RequestBodyState>,
    notes: Notes<'_>,
) -> Result<Sent, Error> {
    let Notes { mut log, mut trace } = notes;
    let policy = &up.route.retry;
    let cluster = up.cluster;
    let Some(req) = slot.as_ref() else {
        return Err(no_request());
    };
    let mut tally = Tally {
        attempt: 1,
        unsent: 0,
        may_repeat: idempotent(req.method()),
    };
    // Only a bodyless or buffered request can be rebuilt after it was sent.
    let mut template = match req.body() {
        RequestBody::Empty if policy.attempts > 1 => Some(Box::new(template_of(req, None))),
        RequestBody::Buffered(b) => Some(Box::new(template_of(req, b.clone()))),
        _ => None,
    };
    let rebuildable = matches!(req.body(), RequestBody::Empty | RequestBody::Buffered(_));
    let mut tried = Tried::default();
    let mut sends = 0;
    let mut token: Option<RetryToken> = None;
    loop {
        let server = cluster.choose(tried.ids(), up.key)?;
        tried.push(server.state.id);
        prepare(up, server, slot, &mut template)?;
        if let (Some(t), Some(req)) = (trace.as_deref_mut(), slot.as_mut()) {
            let n = tally.attempt + tally.unsent as u32;
            let parent = t.attempt(&cluster.config.name, &server.label, n);
            req.headers_mut()
                .insert(super::trace::TRACEPARENT.clone(), parent);
        }
        if let Some(l) = log.as_deref_mut() {
            l.origin = server.label.to_string();
        }
        let outstanding = Outstanding::new(cluster, server);
        // Timed for the access log's `tries`, else one attempt in 16 for the server's latency
        // histogram (two clock reads and a histogram update cost 1% of a request).
        let timed = log.is_some() || crate::metrics::sample_attempt_timing();
        let started = timed.then(Instant::now);
        let result = one(up, server, slot, &mut template, rebuildable, body_state).await;
        // A retry's budget token covers its attempt only.
        drop(token.take());
        // Decide in a block, so nothing of this attempt is held through the back-off.
        let next = match result {
            Ok((resp, conn, n)) => {
                sends += n;
                let status = resp.status().as_u16();
                cluster.record_outcome(server, status < 500);
                server.metrics.attempt(Some(status), started);
                if let Some(t) = trace.as_deref_mut() {
                    t.attempt_done(Some(status), None);
                }
                note(&mut log, server, || status.to_string(), started);
                let wants = policy.attempts > tally.attempt
                    && tally.may_repeat
                    && template.is_some()
                    && policy.statuses.contains(&status);
                match wants.then(|| plan_retry(up, tally.attempt)).flatten() {
                    Some((t, pause)) => Next::Retry(t, pause),
                    None => {
                        return Ok(Sent {
                            resp,
                            conn,
                            outstanding,
                            sends,
                        })
                    }
                }
            }
            Err(f) => {
                sends += f.sends;
                if let Some(l) = log.as_deref_mut() {
                    l.sends = sends; // the success path's count comes with the response
                }
                cluster.record_failure(server, &f.err);
                server.metrics.attempt(None, started);
                if let Some(t) = trace.as_deref_mut() {
                    t.attempt_done(None, Some(f.err.category()));
                }
                note(&mut log, server, || f.err.category().to_string(), started);
                let in_hand = slot.is_some();
                match after_failure(up, &f, in_hand, template.is_some(), &tally) {
                    Some(next) => next,
                    None => return Err(f.err),
                }
            }
        };
        drop(outstanding);
        match next {
            Next::Unsent => {
                tally.unsent += 1;
                cluster.metrics.unsent_retries.inc();
            }
            Next::Retry(t, pause) => {
                tally.attempt += 1;
                tokio::time::sleep(pause).await;
                token = Some(t);
            }
        }
    }
}

/// What follows a failed try (`None`: its failure is the answer). `in_hand`: the request is
/// back in the slot, not sent by the last try; `rebuildable`: a template can rebuild it.
///
/// Another server at once when the request never left keymaster (any method), or when only
/// the keep-alive race's resend of it did not (idempotent methods: a server that refuses the
/// resend has died, maybe after acting on the request), while the cluster has a server
/// the request may not have tried yet and the deadline has not passed. Else a retry by the
/// route's policy: a connect failure or a request never sent (any method), a reset before
/// the response head or a response-head timeout (idempotent methods).
fn after_failure(
    up: &Upstream<'_>,
    f: &Failed,
    in_hand: bool,
    rebuildable: bool,
    tally: &Tally,
) -> Option<Next> {
    let never_sent = in_hand && (!f.reached || tally.may_repeat);
    let before_deadline = || up.deadline.is_none_or(|d| Instant::now() < d);
    if never_sent && tally.unsent + 1 < up.cluster.servers.len() && before_deadline() {
        return Some(Next::Unsent);
    }
    let wants = up.route.retry.attempts > tally.attempt
        && if in_hand {
            never_sent
        } else if f.err.is_retry_safe() {
            rebuildable
        } else {
            tally.may_repeat
                && rebuildable
                && (f.err.is_reset() || (f.err.is_timeout() && !f.err.is_request_deadline()))
        };
    let (token, pause) = wants.then(|| plan_retry(up, tally.attempt)).flatten()?;
    Some(Next::Retry(token, pause))
}

/// Origin ids a request has tried (no allocation: the first ten are enough to prefer others).
#[derive(Default)]
struct Tried {
    ids: [usize; 10],
    n: usize,
}

impl Tried {
    fn ids(&self) -> &[usize] {
        &self.ids[..self.n]
    }

    fn push(&mut self, id: usize) {
        if let Some(s) = self.ids.get_mut(self.n) {
            *s = id;
            self.n += 1;
        }
    }
}

/// The request for a try on `server`: the one in the slot (never sent yet) or one rebuilt
/// from the template, with the Host field that server gets (in the template too).
fn prepare(
    up: &Upstream<'_>,
    server: &OriginServer,
    slot: &mut Option<Box<Request<RequestBody>>>,
    template: &mut Option<Box<Template>>,
) -> Result<(), Error> {
    let req = match slot {
        Some(r) => r,
        // Cannot fail: a retry is only chosen with the request or a template.
        None => slot.insert(Box::new(template.as_ref().ok_or_else(no_request)?.build())),
    };
    match &up.host {
        UpstreamHost::Keep => {}
        UpstreamHost::Origin => {
            req.headers_mut()
                .insert(header::HOST, server.authority.clone());
        }
        UpstreamHost::Set(h) => {
            req.headers_mut().insert(header::HOST, h.clone());
        }
    }
    if let Some(t) = template.as_mut() {
        if let Some(h) = req.headers().get(header::HOST) {
            t.headers.insert(header::HOST, h.clone());
        }
    }
    Ok(())
}

fn no_request() -> Error {
    Error::new(Kind::OriginReset, "the request cannot be sent again")
}

fn template_of(req: &Request<RequestBody>, body: Option<bytes::Bytes>) -> Template {
    Template {
        method: req.method().clone(),
        uri: req.uri().clone(),
        headers: req.headers().clone(),
        body,
    }
}

/// Add an attempt to the access log record (when the log is on).
fn note(
    log: &mut Option<&mut LogRecord>,
    server: &OriginServer,
    outcome: impl FnOnce() -> String,
    started: Option<Instant>,
) {
    if let (Some(l), Some(t)) = (log.as_deref_mut(), started) {
        l.tries.push(TryRecord {
            origin: server.label.clone(),
            outcome: outcome(),
            duration_us: t.elapsed().as_micros() as u64,
        });
    }
}

/// A retry may follow: its back-off ends before the deadline and the cluster's budget has
/// room. Returns the budget token (held through the retry's attempt) and the back-off.
fn plan_retry(up: &Upstream<'_>, attempt: u32) -> Option<(RetryToken, std::time::Duration)> {
    let cluster = up.cluster;
    let pause = backoff(&up.route.retry, attempt);
    if up.deadline.is_some_and(|d| Instant::now() + pause >= d) {
        return None;
    }
    let Some(token) = cluster.limits.try_retry(&cluster.config.retry_budget) else {
        cluster.metrics.budget_exhausted.inc();
        return None;
    };
    cluster.metrics.retries.inc();
    Some((token, pause))
}

/// The pause before retry number `retry` (1 for the first): the base doubled per retry,
/// capped, with equal jitter (half fixed, half random) so retries spread out but still grow.
pub(super) fn backoff(policy: &keymaster_config::RetryConfig, retry: u32) -> std::time::Duration {
    let base = policy.backoff_base.get();
    let cap = policy.backoff_max.get();
    let full = base
        .checked_mul(1u32 << (retry.saturating_sub(1)).min(20))
        .unwrap_or(cap)
        .min(cap);
    let half = full / 2;
    half + half.mul_f64(fastrand::f64())
}

/// One attempt on `server`: a pooled connection (resent once on a fresh one if it turns out
/// stale) or a new one. The request is taken from `slot` when it goes out, and put back if it
/// never did.
async fn one(
    up: &Upstream<'_>,
    server: &Arc<OriginServer>,
    slot: &mut Option<Box<Request<RequestBody>>>,
    template: &mut Option<Box<Template>>,
    rebuildable: bool,
    body_state: Option<&RequestBodyState>,
) -> Result<(OriginResponse, Conn, u32), Failed> {
    let cluster = up.cluster;
    let proxy_header =
        crate::proxy_protocol::header_for(cluster.config.proxy_protocol, &up.cx.peer, &up.cx.local);
    let proxy_header = proxy_header.as_deref();
    // A cluster that sends PROXY headers keeps connections per client connection.
    let private = match proxy_header {
        Some(_) => take_private(up.cx, server),
        None => None,
    };
    let checked_out = match private {
        Some(c) => Ok((c, true)),
        // HTTP/1.1: an idle pooled connection or a new one; HTTP/2: a stream on a shared one.
        None => checkout_within(up, server, true, proxy_header).await,
    };
    let (mut conn, reused) = match checked_out {
        Ok(c) => c,
        Err(err) => return Err(Failed::unsent(err, 0, false)),
    };
    if reused {
        cluster.metrics.reused.inc();
        server.metrics.reused.inc();
        // The keep-alive race needs the request again if it was sent on a dead connection
        // (keymaster's HTTP/1.1 client hands it back itself; hyper's HTTP/2 does not).
        if let (None, true, false, Some(req)) =
            (template.as_ref(), rebuildable, conn.is_h1(), slot.as_ref())
        {
            *template = Some(Box::new(template_of(req, None)));
        }
    }
    let is_reused = conn.requests > 0;
    let first = start_send(up, &mut conn, slot, body_state, 0)?.await;
    let f = match first {
        Ok(Ok(resp)) => return Ok((resp, conn, 1)),
        Err(late) => return Err(Failed::sent(head_timeout_error(late), 1)),
        Ok(Err(f)) => f,
    };
    if let Some(client) = body_error(body_state) {
        return Err(Failed::sent(client, 1));
    }
    // Whether any byte of the request went out on the failed connection.
    let reached = f.unsent.is_none();
    match (f.unsent, f.resend) {
        (Some(r), _) if is_reused => *slot = Some(r),
        (None, Some(r)) if is_reused && f.stale => *slot = Some(r),
        (None, None) if is_reused && f.stale && template.is_some() => {
            *slot = template.as_ref().map(|t| Box::new(t.build()))
        }
        (unsent, _) => {
            *slot = unsent;
            return Err(Failed::unsent(f.err, 1, reached));
        }
    }
    drop(conn);
    resend(up, server, slot, proxy_header, reached, body_state).await
}

/// The keep-alive race: the request once more on a fresh connection to the same server,
/// within the same deadline. `reached`: it went out on the stale connection.
async fn resend(
    up: &Upstream<'_>,
    server: &Arc<OriginServer>,
    slot: &mut Option<Box<Request<RequestBody>>>,
    proxy_header: Option<&[u8]>,
    reached: bool,
    body_state: Option<&RequestBodyState>,
) -> Result<(OriginResponse, Conn, u32), Failed> {
    up.cluster.metrics.retries.inc();
    let mut conn = match checkout_within(up, server, false, proxy_header).await {
        Ok((c, _)) => c,
        Err(err) => return Err(Failed::unsent(err, 1, reached)),
    };
    let second = start_send(up, &mut conn, slot, body_state, 1)?.await;
    match second {
        Ok(Ok(resp)) => Ok((resp, conn, 2)),
        Ok(Err(f)) => {
            *slot = f.unsent;
            Err(Failed::unsent(
                body_error(body_state).unwrap_or(f.err),
                2,
                reached,
            ))
        }
        Err(late) => Err(Failed::sent(head_timeout_error(late), 2)),
    }
}

/// Take the request from `slot` and start it on `conn`, its wait for the response head
/// bounded by the route's response-header (or per-try) timeout and the request's deadline.
/// `sends`: how many sends this attempt made before, for the failure if there is no request.
/// (The request moves straight into the returned future: awaiting that as a temporary keeps
/// no second copy of it in the caller's future.)
fn start_send<'c>(
    up: &Upstream<'_>,
    conn: &'c mut Conn,
    slot: &mut Option<Box<Request<RequestBody>>>,
    body_state: Option<&'c RequestBodyState>,
    sends: u32,
) -> Result<SendWithin<'c>, Failed> {
    let Some(req) = slot.take() else {
        return Err(Failed::sent(no_request(), sends));
    };
    up.cluster.metrics.requests.inc();
    conn.requests += 1;
    let raw_head = up
        .raw_head
        .then(|| up.cx.listener.request_id_header.clone());
    let wait = HeadWait {
        at: Instant::now() + head_wait(up.route),
        deadline: up.deadline,
        body: body_state,
    };
    Ok(conn.send_within(req, wait, raw_head, up.added.as_ref()))
}

/// One attempt's wait for the response head: the per-try timeout when it is shorter.
fn head_wait(route: &Route) -> std::time::Duration {
    match route.retry.per_try_timeout {
        Some(t) => t.get().min(route.response_header_timeout),
        None => route.response_header_timeout,
    }
}

/// A connection (or HTTP/2 stream) within the connect timeout, cut short by the deadline;
/// `reuse`: a pooled HTTP/1.1 connection may serve. Returns whether it was used before.
async fn checkout_within(
    up: &Upstream<'_>,
    server: &Arc<OriginServer>,
    reuse: bool,
    proxy_header: Option<&[u8]>,
) -> Result<(Conn, bool), Error> {
    let connect_timeout = up.route.connect_timeout;
    let t = match up.deadline {
        Some(d) => connect_timeout.min(d.saturating_duration_since(Instant::now())),
        None => connect_timeout,
    };
    checkout(
        &up.cx.worker.pools,
        up.cluster,
        server,
        t,
        reuse,
        proxy_header,
    )
    .await
}

/// Counts a request as outstanding on its server until dropped, in a cluster that balances
/// by least outstanding requests, the count's only reader. Elsewhere it counts nothing: the
/// count is written by every worker, and two writes a request to a cache line that all
/// workers share are measurable on many cores (decision record 0024).
pub(crate) struct Outstanding(Option<Arc<OriginServer>>);

impl Outstanding {
    fn new(cluster: &Cluster, server: &Arc<OriginServer>) -> Self {
        if cluster.config.balance != Balance::LeastOutstanding {
            return Outstanding(None);
        }
        server.state.outstanding.fetch_add(1, Ordering::Relaxed);
        Outstanding(Some(server.clone()))
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        if let Some(server) = &self.0 {
            server.state.outstanding.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The error for a response head that did not come in time: a request timeout when the
/// request's deadline cut the wait short.
fn head_timeout_error(late: HeadTimedOut) -> Error {
    if late.deadline {
        Error::new(
            Kind::RequestTimeout,
            "request deadline passed before the response head",
        )
    } else {
        Error::new(
            Kind::ResponseHeaderTimeout,
            "origin sent no response head in time",
        )
    }
}

/// This client connection's own upstream connection to `server`, if it has a ready one.
fn take_private(
    cx: &crate::downstream::ConnCtx,
    server: &crate::upstream::OriginServer,
) -> Option<crate::upstream::conn::Conn> {
    let mut slot = cx.private_upstream.borrow_mut();
    let mut c = slot.take()?;
    if c.is_closed() {
        return None;
    }
    if c.server.state.id == server.state.id {
        return Some(c);
    }
    *slot = Some(c); // another server's: keep it, open a new one
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use keymaster_config::{Duration, RetryConfig};
    use std::time::Duration as D;

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap() {
        let p = RetryConfig {
            backoff_base: Duration::from_millis(20),
            backoff_max: Duration::from_millis(100),
            ..Default::default()
        };
        for (retry, full) in [(1, 20), (2, 40), (3, 80), (4, 100), (30, 100)] {
            let full = D::from_millis(full);
            for _ in 0..200 {
                let b = backoff(&p, retry);
                assert!(b >= full / 2 && b <= full, "retry {retry}: {b:?}");
            }
        }
    }

    #[test]
    fn idempotent_methods() {
        for m in [
            Method::GET,
            Method::HEAD,
            Method::PUT,
            Method::DELETE,
            Method::OPTIONS,
        ] {
            assert!(idempotent(&m), "{m}");
        }
        for m in [Method::POST, Method::PATCH, Method::CONNECT] {
            assert!(!idempotent(&m), "{m}");
        }
    }
}
