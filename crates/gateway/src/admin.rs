//! The admin listener, on its own thread so it answers even when workers are saturated:
//! `/metrics` (Prometheus text), `/healthz`, `/ready`, `/config` (effective config and its
//! version), `POST /reload` (re-read the config source and swap it in) and
//! `/health/clusters` (origin server health as JSON).

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::gateway::Shared;

pub(crate) async fn serve(
    shared: Arc<Shared>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.changed() => return,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(route(&shared, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
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
            let body = crate::upstream::health::clusters_json(&snap);
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
            } else {
                text(StatusCode::OK, PLAIN, "ready\n".into())
            }
        }
        (&Method::GET, "/config") => {
            let snap = shared.snapshot.load();
            let body = serde_json::json!({
                "version": snap.version,
                "source": shared.source.describe(),
                "config": snap.config.redacted(),
            });
            text(
                StatusCode::OK,
                "application/json",
                serde_json::to_string_pretty(&body).unwrap_or_default() + "\n",
            )
        }
        (&Method::POST, "/reload") => {
            let shared = shared.clone();
            // Reading the file and resolving DNS may block: keep it off this event loop.
            let res = tokio::task::spawn_blocking(move || shared.reload_from_source()).await;
            match res {
                Ok(Ok(version)) => text(
                    StatusCode::OK,
                    "application/json",
                    format!("{{\"status\":\"ok\",\"version\":{version}}}\n"),
                ),
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
        (_, "/metrics" | "/healthz" | "/ready" | "/config" | "/reload" | "/health/clusters") => {
            text(
                StatusCode::METHOD_NOT_ALLOWED,
                PLAIN,
                "method not allowed\n".into(),
            )
        }
        _ => text(StatusCode::NOT_FOUND, PLAIN, "not found\n".into()),
    }
}
