//! The proxy stage's part in request traces (`[traces]`): a trace continued or started
//! once the route is known ([`begin`]), each upstream attempt's `traceparent` (in
//! `attempt`), and the spans queued for export when the request ends ([`end`]). What the
//! spans are and how they leave is `keymaster_trace`'s.

use http::header::HeaderName;
use http::Version;
use std::time::Instant;

use crate::downstream::ConnCtx;
use crate::metrics::Metrics;
use crate::route::Route;
use keymaster_config::TracesConfig;
use keymaster_filter::host::FilterStep;
use keymaster_trace::{Exporter, RequestTrace, ServerAttrs, Step};

pub(crate) static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The running exporter and the sampling rule (`[traces]`).
pub(crate) struct Tracing {
    exporter: Exporter,
    parent_based: bool,
}

impl Tracing {
    /// `None` when `[traces]` has no endpoint: tracing is off.
    pub(crate) fn start(
        config: &TracesConfig,
        metrics: &Metrics,
    ) -> Result<Option<Tracing>, String> {
        if !config.enabled() {
            return Ok(None);
        }
        let version = env!("CARGO_PKG_VERSION");
        let exporter = Exporter::start(config, version, metrics.trace_spans.clone())?;
        Ok(Some(Tracing {
            exporter,
            parent_based: config.parent_based,
        }))
    }
}

/// The request's trace, continued from its `traceparent` or new; sampled by the route's
/// `trace_sample`, else the listener's (the parent's flag first when `parent_based`).
/// `parts.headers` is the request's map (tracing makes the proxy stage build it).
pub(super) fn begin(
    t: &Tracing,
    cx: &ConnCtx,
    route: &Route,
    parts: &http::request::Parts,
    request_id: &http::HeaderValue,
    started: Instant,
) -> Box<RequestTrace> {
    let ratio = route.trace_sample.unwrap_or(cx.listener.trace_sample);
    let incoming = parts.headers.get(&TRACEPARENT).map(|v| v.as_bytes());
    let state = parts.headers.get(&TRACESTATE);
    let mut trace = RequestTrace::start(incoming, state, ratio, t.parent_based, started);
    if let Some(r) = trace.recording.as_mut() {
        r.attrs = ServerAttrs {
            method: parts.method.as_str().to_string(),
            path: parts.uri.path().to_string(),
            scheme: cx.client.proto(),
            version: match parts.version {
                Version::HTTP_10 => "1.0",
                Version::HTTP_2 => "2",
                _ => "1.1",
            },
            client: Some(cx.peer),
            host: (parts.headers.get(http::header::HOST))
                .and_then(|h| h.to_str().ok())
                .map(str::to_string)
                .or_else(|| parts.uri.authority().map(|a| a.to_string())),
            listener: cx.listener.name.clone(),
            request_id: request_id.to_str().unwrap_or_default().to_string(),
            route: route.name.to_string(),
        };
    }
    Box::new(trace)
}

/// The filter steps of a traced request, for its span's events. Cold: only a sampled
/// request has a recording, and this stays out of the request path's hot code.
#[cold]
pub(super) fn add_steps(trace: &mut RequestTrace, steps: Vec<FilterStep>) {
    if let Some(r) = trace.recording.as_mut() {
        r.steps.extend(steps.into_iter().map(|s| Step {
            stage: s.stage,
            filter: s.filter,
            start: s.start,
            took: s.took,
            outcome: s.outcome,
        }));
    }
}

/// The request ended with `status` (`category` unless it succeeded): a sampled request's
/// spans go to the export queue.
pub(super) fn end(cx: &ConnCtx, trace: RequestTrace, status: u16, category: &'static str) {
    let Some(t) = &cx.worker.shared.traces else {
        return;
    };
    let error = (!matches!(category, "success" | "filter_response")).then_some(category);
    if let Some(finished) = trace.finish(status, error) {
        t.exporter.submit(finished);
    }
}
