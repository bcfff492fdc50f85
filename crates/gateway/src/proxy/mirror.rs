//! Traffic mirroring (a route's `mirror`): a sampled share of the route's requests is copied
//! to a shadow cluster, fire and forget. The copy goes out on a task of its own on the same
//! worker, through the worker's pools; its response is read and discarded. The primary never
//! waits for it: a shadow request that cannot start at once (the cluster's cap reached, a
//! body not already whole) is not sent, and counted.

use http::header::{self, HeaderValue};
use http::Request;
use prometheus::IntCounter;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::body::RequestBody;
use crate::upstream::conn::HeadWait;
use crate::upstream::pool::checkout;
use crate::upstream::Cluster;
use crate::worker::Worker;
use keymaster_config::MirrorConfig;
use keymaster_http::headers::AddedFields;

/// A route's mirror, compiled.
pub(crate) struct Mirror {
    pub(crate) cluster: Arc<Cluster>,
    sample: f64,
    pub(crate) max_body: u64,
    max_in_flight: usize,
    timeout: Duration,
    /// sent, failed, dropped, skipped_body.
    counts: [IntCounter; 4],
}

const SENT: usize = 0;
const FAILED: usize = 1;
const DROPPED: usize = 2;
const SKIPPED_BODY: usize = 3;

impl Mirror {
    pub(crate) fn new(cfg: &MirrorConfig, cluster: Arc<Cluster>, counts: [IntCounter; 4]) -> Self {
        Mirror {
            cluster,
            sample: cfg.sample,
            max_body: cfg.max_body.0,
            max_in_flight: cfg.max_in_flight,
            timeout: cfg.timeout.get(),
            counts,
        }
    }

    /// This request is one of the share mirrored.
    pub(crate) fn sampled(&self) -> bool {
        self.sample >= 1.0 || fastrand::f64() < self.sample
    }
}

/// What the primary's request looks like once its head duties are done.
pub(super) struct Copy<'a> {
    pub(super) parts: &'a http::request::Parts,
    pub(super) body: &'a RequestBody,
    pub(super) added: Option<&'a AddedFields<'a>>,
    /// The Host the primary's request goes with, when it is not in `parts` (the origin's
    /// authority, or a fixed value).
    pub(super) host: Option<&'a HeaderValue>,
}

impl<'a> Copy<'a> {
    /// The primary's request as the attempts will send it (`up`).
    pub(super) fn of(
        parts: &'a http::request::Parts,
        body: &'a RequestBody,
        up: &'a super::attempt::Upstream<'a>,
    ) -> Copy<'a> {
        let host = match &up.host {
            super::attempt::UpstreamHost::Set(h) => Some(h),
            _ => None,
        };
        Copy {
            parts,
            body,
            added: up.added.as_ref(),
            host,
        }
    }
}

/// Start the shadow copy of a request (sampled already), unless its body is not whole or
/// the cluster's shadow cap is reached.
pub(super) fn launch(worker: &Rc<Worker>, m: &Mirror, copy: Copy<'_>) {
    let body = match copy.body {
        RequestBody::Empty => None,
        RequestBody::Buffered(Some(b)) if (b.len() as u64) <= m.max_body => Some(b.clone()),
        _ => return m.counts[SKIPPED_BODY].inc(),
    };
    let Some(slot) = m.cluster.limits.try_mirror(m.max_in_flight) else {
        return m.counts[DROPPED].inc();
    };
    let req = shadow_request(&copy, body);
    let (worker, cluster) = (worker.clone(), m.cluster.clone());
    let counts = m.counts.clone();
    let within = m.timeout;
    tokio::task::spawn_local(async move {
        let _slot = slot;
        let done = tokio::time::timeout(within, send(&worker, &cluster, req, within)).await;
        let i = if matches!(done, Ok(true)) {
            SENT
        } else {
            FAILED
        };
        counts[i].inc();
    });
}

/// The copy: the primary's head with its added fields, Host suffixed `-shadow` (as Envoy
/// does), and the body when there is one.
fn shadow_request(copy: &Copy<'_>, body: Option<bytes::Bytes>) -> Request<RequestBody> {
    let mut req = Request::new(match body {
        Some(b) => RequestBody::Buffered(Some(b)),
        None => RequestBody::Empty,
    });
    *req.method_mut() = copy.parts.method.clone();
    *req.uri_mut() = copy.parts.uri.clone();
    let headers = req.headers_mut();
    *headers = copy.parts.headers.clone();
    if let Some(a) = copy.added {
        a.insert_into(headers);
    }
    let host = copy.host.or(copy.parts.headers.get(header::HOST));
    if let Some(h) = host.and_then(|h| shadow_host(h.as_bytes())) {
        headers.insert(header::HOST, h);
    }
    req
}

/// `api.example.com:8443` → `api.example.com-shadow:8443`.
fn shadow_host(host: &[u8]) -> Option<HeaderValue> {
    let s = std::str::from_utf8(host).ok()?;
    // The port follows the last colon, unless that colon is inside an IPv6 literal.
    let (name, port) = match s.rsplit_once(':') {
        Some((n, p)) if !p.contains(']') && p.bytes().all(|b| b.is_ascii_digit()) => (n, Some(p)),
        _ => (s, None),
    };
    let v = match port {
        Some(p) => format!("{name}-shadow:{p}"),
        None => format!("{name}-shadow"),
    };
    HeaderValue::from_str(&v).ok()
}

/// One shadow request on a pooled (or new) connection; its response read to the end and
/// dropped, the connection pooled again after a clean end. `true` when a response came.
async fn send(
    worker: &Worker,
    cluster: &Arc<Cluster>,
    req: Request<RequestBody>,
    within: Duration,
) -> bool {
    let Ok(server) = cluster.choose(&[], None) else {
        return false;
    };
    let connect = cluster.config.connect_timeout.get().min(within);
    let Ok((mut conn, _)) = checkout(&worker.pools, cluster, server, connect, true, None).await
    else {
        return false;
    };
    conn.requests += 1;
    let wait = HeadWait {
        at: Instant::now() + within,
        deadline: None,
        body: None,
    };
    let resp = match conn.send_within(Box::new(req), wait, None, None).await {
        Ok(Ok(resp)) => resp,
        _ => return false,
    };
    let mut body = resp.into_body();
    while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
        if frame.is_err() {
            return true; // the response came; its body broke off: the connection closes
        }
    }
    if let Some(c) = body.take_reusable() {
        conn.give_back(c);
        let pool = &cluster.config.pool;
        let now = Instant::now();
        worker
            .pools
            .put(conn, pool.max_idle, pool.idle_timeout.get(), now);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::shadow_host;

    #[test]
    fn host_gets_the_shadow_suffix_before_the_port() {
        let h = |s: &str| {
            shadow_host(s.as_bytes())
                .unwrap()
                .to_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(h("api.example.com"), "api.example.com-shadow");
        assert_eq!(h("api.example.com:8443"), "api.example.com-shadow:8443");
        assert_eq!(h("127.0.0.1:80"), "127.0.0.1-shadow:80");
    }
}
