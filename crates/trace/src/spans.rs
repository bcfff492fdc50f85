//! A finished request's record as OpenTelemetry spans (HTTP semantic conventions): done on
//! the export thread, never on a worker.

use opentelemetry::trace::{
    Event, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use std::borrow::Cow;
use std::str::FromStr;
use std::time::{Instant, SystemTime};

use crate::record::{Attempt, FinishedTrace, Recording, Step};

/// Turn one finished request into its spans, appended to `out`.
pub(crate) fn spans_of(
    t: FinishedTrace,
    scope: &InstrumentationScope,
    filter_spans: bool,
    out: &mut Vec<SpanData>,
) {
    let trace_id = TraceId::from_bytes(t.trace_id.0);
    let state = t
        .tracestate
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .and_then(|s| TraceState::from_str(s).ok())
        .unwrap_or_default();
    let context = |span: [u8; 8]| {
        SpanContext::new(
            trace_id,
            SpanId::from_bytes(span),
            TraceFlags::SAMPLED,
            false,
            state.clone(),
        )
    };
    let rec = &t.recording;
    let at = |i: Instant| wall(rec, i);
    let server_span = SpanId::from_bytes(t.span_id.0);
    let mut events = Vec::new();
    for step in &rec.steps {
        if filter_spans {
            out.push(step_span(
                step,
                context(crate::SpanId::random().0),
                server_span,
                rec,
                scope,
            ));
        } else {
            events.push(step_event(step, rec));
        }
    }
    for a in &rec.attempts {
        out.push(attempt_span(
            a,
            context(a.span_id.0),
            server_span,
            rec,
            scope,
            t.end,
        ));
    }
    let name = format!("{} {}", rec.attrs.method, rec.attrs.route);
    out.push(SpanData {
        span_context: context(t.span_id.0),
        parent_span_id: t
            .parent
            .map_or(SpanId::INVALID, |p| SpanId::from_bytes(p.0)),
        parent_span_is_remote: t.parent.is_some(),
        span_kind: SpanKind::Server,
        name: Cow::Owned(name),
        start_time: rec.start_wall,
        end_time: at(t.end),
        attributes: server_attributes(&t),
        dropped_attributes_count: 0,
        events: span_events(events),
        links: SpanLinks::default(),
        // Server spans: 5xx only is the server's error (the semantic conventions).
        status: if t.status >= 500 {
            Status::error(t.error_type.unwrap_or("server_error"))
        } else {
            Status::Unset
        },
        instrumentation_scope: scope.clone(),
    });
}

fn server_attributes(t: &FinishedTrace) -> Vec<KeyValue> {
    let a = &t.recording.attrs;
    let mut kv = vec![
        KeyValue::new("http.request.method", a.method.clone()),
        KeyValue::new("url.path", a.path.clone()),
        KeyValue::new("url.scheme", a.scheme),
        KeyValue::new("http.route", a.route.clone()),
        KeyValue::new("http.response.status_code", t.status as i64),
        KeyValue::new("network.protocol.name", "http"),
        KeyValue::new("network.protocol.version", a.version),
        KeyValue::new("keymaster.listener", a.listener.clone()),
        KeyValue::new("keymaster.request_id", a.request_id.clone()),
    ];
    if let Some(c) = a.client {
        kv.push(KeyValue::new("client.address", c.ip().to_string()));
        kv.push(KeyValue::new("client.port", c.port() as i64));
    }
    if let Some(h) = &a.host {
        kv.push(KeyValue::new("server.address", h.clone()));
    }
    if let Some(e) = t.error_type {
        kv.push(KeyValue::new("error.type", e));
    }
    kv
}

fn attempt_span(
    a: &Attempt,
    context: SpanContext,
    parent: SpanId,
    rec: &Recording,
    scope: &InstrumentationScope,
    request_end: Instant,
) -> SpanData {
    let mut kv = vec![
        KeyValue::new("http.request.method", rec.attrs.method.clone()),
        KeyValue::new("server.address", a.server.clone()),
        KeyValue::new("keymaster.cluster", a.cluster.clone()),
        KeyValue::new("keymaster.try", a.try_number as i64),
        KeyValue::new("http.request.resend_count", a.try_number as i64 - 1),
    ];
    if let Some(s) = a.status {
        kv.push(KeyValue::new("http.response.status_code", s as i64));
    }
    // Client spans: 4xx and 5xx are errors (the semantic conventions).
    let failure: Option<Cow<'static, str>> = match (a.error, a.status) {
        (Some(e), _) => Some(e.into()),
        (None, Some(s)) if s >= 400 => Some(s.to_string().into()),
        (None, Some(_)) => None,
        (None, None) => Some("unfinished".into()),
    };
    let status = match failure {
        Some(e) => {
            kv.push(KeyValue::new("error.type", e.clone()));
            Status::Error { description: e }
        }
        None => Status::Unset,
    };
    SpanData {
        span_context: context,
        parent_span_id: parent,
        parent_span_is_remote: false,
        span_kind: SpanKind::Client,
        name: Cow::Owned(rec.attrs.method.clone()),
        start_time: wall(rec, a.start),
        end_time: wall(rec, a.end.unwrap_or(request_end)),
        attributes: kv,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status,
        instrumentation_scope: scope.clone(),
    }
}

fn step_attributes(s: &Step) -> Vec<KeyValue> {
    vec![
        KeyValue::new("keymaster.filter", s.filter.to_string()),
        KeyValue::new("keymaster.filter.stage", s.stage),
        KeyValue::new("keymaster.filter.outcome", s.outcome),
        KeyValue::new("keymaster.filter.duration_us", s.took.as_micros() as i64),
    ]
}

fn step_event(s: &Step, rec: &Recording) -> Event {
    let name = format!("filter {}:{}", s.stage, s.filter);
    Event::new(name, wall(rec, s.start), step_attributes(s), 0)
}

fn step_span(
    s: &Step,
    context: SpanContext,
    parent: SpanId,
    rec: &Recording,
    scope: &InstrumentationScope,
) -> SpanData {
    SpanData {
        span_context: context,
        parent_span_id: parent,
        parent_span_is_remote: false,
        span_kind: SpanKind::Internal,
        name: Cow::Owned(format!("filter {}:{}", s.stage, s.filter)),
        start_time: wall(rec, s.start),
        end_time: wall(rec, s.start + s.took),
        attributes: step_attributes(s),
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: if s.outcome == "failed" {
            Status::error("filter_failed")
        } else {
            Status::Unset
        },
        instrumentation_scope: scope.clone(),
    }
}

fn span_events(events: Vec<Event>) -> SpanEvents {
    let mut e = SpanEvents::default();
    e.events = events;
    e
}

/// A monotonic instant of the request as wall-clock time (the request's start is read once
/// from both clocks).
fn wall(rec: &Recording, i: Instant) -> SystemTime {
    rec.start_wall + i.saturating_duration_since(rec.start)
}
