//! The admin listener, on its own thread so it answers even when workers are saturated:
//! `/metrics` (Prometheus text), `/healthz`, `/ready`, `/config` (effective config and its
//! version), `POST /reload` (re-read the config source and swap it in) and
//! `/health/clusters` (origin server health as JSON).
//!
//! It is guarded like a client listener so that it cannot be used to starve the process:
//! at most `[admin] max_connections` open connections (past it a new one is closed at once
//! and counted in `keymaster_admin_connections_rejected_total`); a request head must be
//! complete within `header_read_timeout` of the connection (and of a later head's first
//! byte); an idle keep-alive connection, or one whose response write makes no progress, is
//! closed after `idle_timeout`. The clock is the main listeners' ([`TimedIo`]): hyper's own
//! `header_read_timeout` also bounds every keep-alive wait, so it cannot keep an idle
//! timeout of its own. Requests then pass the [`guard`] (cross-site and token checks).

mod guard;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use keymaster_config::AdminConfig;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::downstream::{ConnState, SendClock, TimedIo};
use crate::gateway::Shared;
use guard::{Access, Guard, Refused};

/// The admin listener's settings, read from `[admin]` at start (a reload does not change
/// them).
pub(crate) struct Settings {
    header_read_timeout: Duration,
    idle_timeout: Duration,
    max_connections: usize,
    guard: Guard,
}

impl Settings {
    pub(crate) fn new(config: &AdminConfig) -> Settings {
        Settings {
            header_read_timeout: config.header_read_timeout.get(),
            idle_timeout: config.idle_timeout.get(),
            max_connections: config.max_connections,
            guard: Guard::new(config.resolved_token().as_deref()),
        }
    }
}

/// One open admin connection's place under `max_connections`, given back on drop.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(open: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        let taken = open.fetch_add(1, Ordering::AcqRel);
        if taken >= max {
            open.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Slot(open.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

pub(crate) async fn serve(
    shared: Arc<Shared>,
    settings: Settings,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let settings = Arc::new(settings);
    let open = Arc::new(AtomicUsize::new(0));
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.changed() => return,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let Some(slot) = Slot::take(&open, settings.max_connections) else {
            shared.metrics.admin_rejected.inc();
            drop(stream);
            continue;
        };
        tokio::spawn(serve_connection(
            shared.clone(),
            settings.clone(),
            stream,
            slot,
        ));
    }
}

/// Serve one admin connection under the header-read, idle and send deadlines.
async fn serve_connection(
    shared: Arc<Shared>,
    settings: Arc<Settings>,
    stream: TcpStream,
    _slot: Slot,
) {
    let state = Arc::new(ConnState::new(
        Instant::now(),
        true,
        settings.header_read_timeout,
        settings.idle_timeout,
    ));
    let send = SendClock::new(settings.idle_timeout, None);
    let io = TimedIo::new(TokioIo::new(stream), state.clone(), send);
    let svc = service_fn(move |req| {
        let (shared, settings, state) = (shared.clone(), settings.clone(), state.clone());
        async move {
            state.request_started(Instant::now());
            let response = respond(&shared, &settings.guard, req).await;
            state.request_finished(Instant::now());
            Ok::<_, Infallible>(response)
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, svc)
        .await;
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

/// A request the guard let through is routed; a refused one is answered with what it lacked.
async fn respond(
    shared: &Arc<Shared>,
    guard: &Guard,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let access = Access::of(req.method(), req.uri().path());
    match guard.check(req.headers(), access) {
        Ok(()) => route(shared, req).await,
        Err(refused) => {
            shared
                .metrics
                .admin_refused
                .with_label_values(&[refused.reason])
                .inc();
            refusal(refused)
        }
    }
}

/// `{"status":"refused","error":...}` with the refusal's status; a 401 names its scheme.
fn refusal(refused: Refused) -> Response<Full<Bytes>> {
    let body = serde_json::json!({"status": "refused", "error": refused.message});
    let mut r = text(refused.status, "application/json", body.to_string() + "\n");
    if refused.status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer realm=\"keymaster-admin\""),
        );
    }
    r
}

async fn route(shared: &Arc<Shared>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => text(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            shared.render_metrics(),
        ),
        (&Method::GET, "/health/clusters") => {
            let snap = shared.snapshot.load();
            let order = snap.config.clusters.iter().map(|c| c.name.as_str());
            let body = crate::upstream::health::clusters_json(snap.version, order, &snap.clusters);
            text(
                StatusCode::OK,
                "application/json",
                serde_json::to_string_pretty(&body).unwrap_or_default() + "\n",
            )
        }
        (&Method::GET, "/healthz") => text(StatusCode::OK, PLAIN, "ok\n".into()),
        (&Method::GET, "/ready") => {
            if shared.draining.load(Ordering::Acquire) {
                text(StatusCode::SERVICE_UNAVAILABLE, PLAIN, "draining\n".into())
            } else if shared.failing_ready.load(Ordering::Acquire) {
                // Taken out of the load balancer on purpose; requests are still served.
                text(StatusCode::SERVICE_UNAVAILABLE, PLAIN, "failing\n".into())
            } else {
                text(StatusCode::OK, PLAIN, "ready\n".into())
            }
        }
        (&Method::POST, path @ ("/healthcheck/fail" | "/healthcheck/ok")) => {
            let fail = path == "/healthcheck/fail";
            shared.failing_ready.store(fail, Ordering::Release);
            shared.metrics.ready_failing.set(i64::from(fail));
            tracing::warn!(
                failing = fail,
                "admin: /ready set to {}",
                if fail { "fail" } else { "pass" }
            );
            let body = serde_json::json!({"status": "ok", "ready": !fail});
            text(StatusCode::OK, "application/json", body.to_string() + "\n")
        }
        (&Method::GET, "/config") => {
            let snap = shared.snapshot.load();
            let restart_required = shared.restart_required();
            let body = serde_json::json!({
                "version": snap.version,
                "source": shared.source.describe(),
                "restart_required": restart_required,
                "config": snap.config.redacted(),
            });
            text(
                StatusCode::OK,
                "application/json",
                serde_json::to_string_pretty(&body).unwrap_or_default() + "\n",
            )
        }
        (&Method::POST, "/reload") => {
            let reloading = shared.clone();
            // Reading the file and resolving DNS may block: keep it off this event loop.
            let res = tokio::task::spawn_blocking(move || reloading.reload_from_source()).await;
            match res {
                Ok(Ok(version)) => {
                    let body = serde_json::json!({
                        "status": "ok",
                        "version": version,
                        "restart_required": shared.restart_required(),
                    });
                    text(StatusCode::OK, "application/json", body.to_string() + "\n")
                }
                Ok(Err(e)) => text(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "application/json",
                    serde_json::json!({"status": "rejected", "error": e}).to_string() + "\n",
                ),
                Err(_) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    PLAIN,
                    "reload task failed\n".into(),
                ),
            }
        }
        (
            _,
            "/metrics" | "/healthz" | "/ready" | "/config" | "/reload" | "/health/clusters"
            | "/healthcheck/fail" | "/healthcheck/ok",
        ) => text(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            "method not allowed\n".into(),
        ),
        _ => text(StatusCode::NOT_FOUND, PLAIN, "not found\n".into()),
    }
}
