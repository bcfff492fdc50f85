//! One request's trace as the gateway records it: ids always (they propagate and go in the
//! access log), and, when the request is sampled, what its spans will say. Plain data on
//! the request path; the export thread turns it into OpenTelemetry spans.

use http::HeaderValue;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use crate::context::{parse_traceparent, traceparent, SpanId, TraceId};
use crate::sample;

/// A request's place in a trace.
pub struct RequestTrace {
    pub trace_id: TraceId,
    /// The server span: the request at this gateway.
    pub span_id: SpanId,
    /// The incoming `traceparent`'s span, when the request continues a trace.
    pub parent: Option<SpanId>,
    pub sampled: bool,
    /// The incoming `tracestate` (it goes upstream with the request's other fields).
    pub tracestate: Option<HeaderValue>,
    /// What the spans will say; only for a sampled request.
    pub recording: Option<Box<Recording>>,
}

/// What a sampled request's spans say.
pub struct Recording {
    /// The request's start, on the wall clock and the monotonic one.
    pub start_wall: SystemTime,
    pub start: Instant,
    pub attrs: ServerAttrs,
    pub attempts: Vec<Attempt>,
    pub steps: Vec<Step>,
}

/// The server span's request attributes (OpenTelemetry HTTP semantic conventions).
#[derive(Default)]
pub struct ServerAttrs {
    pub method: String,
    pub path: String,
    pub scheme: &'static str,
    /// `network.protocol.version`: "1.0", "1.1" or "2".
    pub version: &'static str,
    pub client: Option<SocketAddr>,
    pub host: Option<String>,
    pub listener: String,
    pub request_id: String,
    /// `http.route`: the route's name.
    pub route: String,
}

/// One upstream attempt: a client span.
pub struct Attempt {
    pub span_id: SpanId,
    pub cluster: String,
    pub server: String,
    /// 1 for the first try.
    pub try_number: u32,
    pub start: Instant,
    pub end: Option<Instant>,
    pub status: Option<u16>,
    /// The failure's category (keymaster's `error.type`).
    pub error: Option<&'static str>,
}

/// One filter step: a span event (or a child span with `filter_spans`).
pub struct Step {
    pub stage: &'static str,
    pub filter: std::sync::Arc<str>,
    pub start: Instant,
    pub took: Duration,
    /// "ran", "skip" or "failed".
    pub outcome: &'static str,
}

/// A finished sampled request, on its way to export.
pub struct FinishedTrace {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub parent: Option<SpanId>,
    pub tracestate: Option<HeaderValue>,
    pub recording: Box<Recording>,
    pub end: Instant,
    pub status: u16,
    /// keymaster's error category when the request did not succeed.
    pub error_type: Option<&'static str>,
}

impl FinishedTrace {
    /// Spans this trace makes: the server span, one per attempt, one per filter step when
    /// they are spans.
    pub fn span_count(&self, filter_spans: bool) -> u64 {
        let steps = if filter_spans {
            self.recording.steps.len()
        } else {
            0
        };
        1 + self.recording.attempts.len() as u64 + steps as u64
    }
}

impl RequestTrace {
    /// The request's trace: continued from `incoming` (a valid `traceparent`) or new, and
    /// sampled by `ratio` unless the parent decides (`parent_based`).
    pub fn start(
        incoming: Option<&[u8]>,
        tracestate: Option<&HeaderValue>,
        ratio: f64,
        parent_based: bool,
        started: Instant,
    ) -> RequestTrace {
        let parent = incoming.and_then(parse_traceparent);
        let trace_id = parent.map_or_else(TraceId::random, |p| p.trace_id);
        let sampled = sample::decide(parent.as_ref(), &trace_id, ratio, parent_based);
        let recording = sampled.then(|| {
            let wall = SystemTime::now() - started.elapsed();
            Box::new(Recording {
                start_wall: wall,
                start: started,
                attrs: ServerAttrs::default(),
                attempts: Vec::new(),
                steps: Vec::new(),
            })
        });
        RequestTrace {
            trace_id,
            span_id: SpanId::random(),
            parent: parent.map(|p| p.span_id),
            sampled,
            // A tracestate without a valid traceparent is dropped, as the spec asks.
            tracestate: parent.and(tracestate.cloned()),
            recording,
        }
    }

    /// An upstream attempt begins: the `traceparent` it sends (its own span when sampled).
    pub fn attempt(&mut self, cluster: &str, server: &str, try_number: u32) -> HeaderValue {
        let span_id = SpanId::random();
        if let Some(r) = self.recording.as_mut() {
            r.attempts.push(Attempt {
                span_id,
                cluster: cluster.to_string(),
                server: server.to_string(),
                try_number,
                start: Instant::now(),
                end: None,
                status: None,
                error: None,
            });
        }
        traceparent(&self.trace_id, &span_id, self.sampled)
    }

    /// The last attempt got a response head with `status`, or failed with `error`.
    pub fn attempt_done(&mut self, status: Option<u16>, error: Option<&'static str>) {
        let last = self.recording.as_mut().and_then(|r| r.attempts.last_mut());
        if let Some(a) = last {
            a.end = Some(Instant::now());
            a.status = status;
            a.error = error;
        }
    }

    /// The request ended: its spans, when sampled. The attempt that answered ends with the
    /// response body.
    pub fn finish(
        self,
        status: u16,
        error_type: Option<&'static str>,
    ) -> Option<Box<FinishedTrace>> {
        let mut recording = self.recording?;
        let end = Instant::now();
        if let Some(a) = recording.attempts.last_mut() {
            if a.status.is_some() {
                a.end = Some(end);
            }
        }
        Some(Box::new(FinishedTrace {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent: self.parent,
            tracestate: self.tracestate,
            recording,
            end,
            status,
            error_type,
        }))
    }
}
