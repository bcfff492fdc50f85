//! Sending a request upstream: one loop of attempts that covers both the route's retry
//! policy and the keep-alive race.
//!
//! ```text
//! choose server (healthy, untried first) ─► pool checkout | connect ─► send ─► response head
//!    ▲                                      └ stale pooled connection failed before a
//!    │                                        response: resend once on a fresh connection
//!    │                                        (not a policy retry: no budget, no back-off)
//!    └── retry? attempts left, retryable outcome, budget token, back-off fits the deadline
//! ```
//!
//! Retryable outcomes: a connect failure or a request that was never sent (any method); a
//! reset before the response head, a response-head timeout (the per-try timeout), or a
//! status in the route's `retry.statuses` (idempotent methods only). A request is resent
//! only if it can be rebuilt: no body, or a body read whole into the replay buffer. Every
//! attempt feeds passive outlier detection and, when the access log is on, its `tries`.

use http::header::{self, HeaderValue};
use http::{Method, Request};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::time::Instant;

use crate::access_log::{LogRecord, TryRecord};
use crate::body::{RequestBody, RequestBodyState};
use crate::downstream::ConnCtx;
use crate::error::{Error, Kind};
use crate::route::Route;
use crate::upstream::conn::{Conn, HeadTimedOut, HeadWait, OriginResponse, SendWithin};
use crate::upstream::limits::RetryToken;
use crate::upstream::pool::checkout;
use crate::upstream::{Cluster, OriginServer};

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
    pub(super) cluster: &'a Arc<Cluster>,
    pub(super) deadline: Option<Instant>,
    pub(super) host: UpstreamHost,
    /// The response head may pass through as bytes: nothing but the proxy stage's own
    /// fields changes in it (see `finish_response`).
    pub(super) raw_head: bool,
    /// Forwarding fields and Via, when not in the request's map.
    pub(super) added: Option<crate::headers::AddedFields<'a>>,
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
) -> Result<RequestBody, Error> {
    if !matches!(body, RequestBody::Stream { .. }) {
        return Ok(body);
    }
    let retry = &up.route.retry;
    // The length the client's framing declared (the body's decoder holds it to it), not a
    // Content-Length field, which a filter or an edit may have changed.
    let declared = http_body::Body::size_hint(&body).exact();
    let replays = retry.attempts > 1 && declared.is_some_and(|n| n <= retry.replay_buffer.get());
    if !(up.route.request_buffering || replays) {
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
    mut log: Option<&mut LogRecord>,
) -> Result<Sent, Error> {
    let policy = &up.route.retry;
    let cluster = up.cluster;
    let Some(req) = slot.as_ref() else {
        return Err(no_request());
    };
    let may_repeat = idempotent(req.method());
    // Only a bodyless or buffered request can be rebuilt after it was sent.
    let mut template = match req.body() {
        RequestBody::Empty if policy.attempts > 1 => Some(Box::new(template_of(req, None))),
        RequestBody::Buffered(b) => Some(Box::new(template_of(req, b.clone()))),
        _ => None,
    };
    let rebuildable = matches!(req.body(), RequestBody::Empty | RequestBody::Buffered(_));
    // Origin ids already tried (no allocation: attempts are at most 10 by validation).
    let mut tried = [0usize; 10];
    let mut n_tried = 0;
    let mut sends = 0;
    let mut attempt = 0;
    let mut token: Option<RetryToken> = None;
    loop {
        attempt += 1;
        let server = cluster.choose(&tried[..n_tried])?;
        if let Some(s) = tried.get_mut(n_tried) {
            *s = server.state.id;
            n_tried += 1;
        }
        if slot.is_none() {
            match &template {
                Some(t) => *slot = Some(Box::new(t.build())),
                // Cannot happen: a retry is only chosen with the request or a template.
                None => return Err(no_request()),
            }
        }
        if let Some(req) = slot.as_mut() {
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
        }
        if let Some(l) = log.as_deref_mut() {
            l.origin = server.label.to_string();
        }
        let outstanding = Outstanding::new(server.clone());
        // Timed only for the access log's `tries`.
        let started = log.is_some().then(Instant::now);
        let result = one(up, &server, slot, &mut template, rebuildable, body_state).await;
        // A retry's budget token covers its attempt only.
        drop(token.take());
        let left = policy.attempts.saturating_sub(attempt);
        // Decide in a block, so nothing of this attempt is held through the back-off.
        let pause = match result {
            Ok((resp, conn, n)) => {
                sends += n;
                let status = resp.status().as_u16();
                cluster.record_outcome(&server, status < 500);
                note(&mut log, &server, || status.to_string(), started);
                let wants = left > 0
                    && may_repeat
                    && template.is_some()
                    && policy.statuses.contains(&status);
                match wants.then(|| plan_retry(up, attempt)).flatten() {
                    Some(plan) => plan,
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
                if f.err.is_origin() {
                    cluster.record_outcome(&server, false);
                }
                note(&mut log, &server, || f.err.category().to_string(), started);
                let wants = left > 0
                    && if slot.is_some() {
                        true // never sent: safe to send anywhere
                    } else if f.err.is_retry_safe() {
                        template.is_some()
                    } else {
                        may_repeat
                            && template.is_some()
                            && (f.err.is_reset()
                                || (f.err.is_timeout() && !f.err.is_request_deadline()))
                    };
                match wants.then(|| plan_retry(up, attempt)).flatten() {
                    Some(plan) => plan,
                    None => return Err(f.err),
                }
            }
        };
        let (t, pause) = pause;
        drop(outstanding);
        tokio::time::sleep(pause).await;
        token = Some(t);
    }
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
        crate::proxy_protocol::header_for(cluster.config.proxy_protocol, up.cx.peer, up.cx.local);
    let proxy_header = proxy_header.as_deref();
    // A cluster that sends PROXY headers keeps connections per client connection.
    let private = match proxy_header {
        Some(_) => crate::proxy_protocol::take_private(up.cx, server),
        None => None,
    };
    let checked_out = match private {
        Some(c) => Ok((c, true)),
        // HTTP/1.1: an idle pooled connection or a new one; HTTP/2: a stream on a shared one.
        None => checkout_within(up, server, true, proxy_header).await,
    };
    let (mut conn, reused) = match checked_out {
        Ok(c) => c,
        Err(err) => return Err(Failed { err, sends: 0 }),
    };
    if reused {
        cluster.metrics.reused.inc();
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
    match first {
        Ok(Ok(resp)) => return Ok((resp, conn, 1)),
        Err(late) => {
            return Err(Failed {
                err: head_timeout_error(late),
                sends: 1,
            })
        }
        Ok(Err(f)) => {
            if let Some(client) = body_error(body_state) {
                return Err(Failed {
                    err: client,
                    sends: 1,
                });
            }
            match (f.unsent, f.resend) {
                (Some(r), _) if is_reused => *slot = Some(r),
                (None, Some(r)) if is_reused && f.stale => *slot = Some(r),
                (None, None) if is_reused && f.stale && template.is_some() => {
                    *slot = template.as_ref().map(|t| Box::new(t.build()))
                }
                (unsent, _) => {
                    *slot = unsent;
                    return Err(Failed {
                        err: f.err,
                        sends: 1,
                    });
                }
            }
        }
    }
    // The keep-alive race: once more on a fresh connection, within the same deadline.
    cluster.metrics.retries.inc();
    drop(conn);
    let mut conn = match checkout_within(up, server, false, proxy_header).await {
        Ok((c, _)) => c,
        Err(err) => return Err(Failed { err, sends: 1 }),
    };
    let second = start_send(up, &mut conn, slot, body_state, 1)?.await;
    match second {
        Ok(Ok(resp)) => Ok((resp, conn, 2)),
        Ok(Err(f)) => {
            *slot = f.unsent;
            Err(Failed {
                err: body_error(body_state).unwrap_or(f.err),
                sends: 2,
            })
        }
        Err(late) => Err(Failed {
            err: head_timeout_error(late),
            sends: 2,
        }),
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
        return Err(Failed {
            err: no_request(),
            sends,
        });
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

/// Counts a request as outstanding on its server until dropped (least-outstanding balancing).
pub(crate) struct Outstanding(Arc<OriginServer>);

impl Outstanding {
    fn new(server: Arc<OriginServer>) -> Self {
        server.state.outstanding.fetch_add(1, Ordering::Relaxed);
        Outstanding(server)
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.0.state.outstanding.fetch_sub(1, Ordering::Relaxed);
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
