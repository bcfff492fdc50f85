//! `[traces]`: OpenTelemetry traces, exported over OTLP. Off unless `endpoint` is set.

use serde::{Deserialize, Serialize};

use crate::units::Duration;

/// `[traces]`: where spans go and how they are batched. The sampling ratio is a listener's
/// `trace_sample`, overridden by a route's.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TracesConfig {
    /// The collector's OTLP endpoint, like `"http://127.0.0.1:4317"` (gRPC) or
    /// `"http://127.0.0.1:4318"` (HTTP; `/v1/traces` is added). `None`: tracing is off and
    /// `traceparent` passes through untouched.
    pub endpoint: Option<String>,
    /// `"grpc"` or `"http/protobuf"`.
    pub protocol: OtlpProtocol,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// The `service.instance.id` resource attribute; `None`: the host name and process id.
    pub service_instance: Option<String>,
    /// Fields sent with every export (collector credentials): a string or
    /// `{ env = "NAME" }` each.
    pub headers: toml::Table,
    /// Honour an incoming `traceparent`'s sampled flag (parent-based sampling); `false`
    /// decides by the ratio alone.
    pub parent_based: bool,
    /// Finished requests' spans waiting for export, at most; past it spans are dropped and
    /// counted (`keymaster_trace_spans_total{outcome="dropped"}`), never waited for.
    pub queue_size: usize,
    /// Spans per export request, at most.
    pub batch_size: usize,
    /// The longest a span waits for a batch to fill.
    pub export_interval: Duration,
    /// The longest one export may take before its spans count as failed.
    pub export_timeout: Duration,
    /// Each filter step as a child span of the server span (else a span event): for
    /// debugging, as it makes a span per filter.
    pub filter_spans: bool,
}

impl Default for TracesConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            protocol: OtlpProtocol::Grpc,
            service_name: "keymaster".into(),
            service_instance: None,
            headers: toml::Table::new(),
            parent_based: true,
            queue_size: 4096,
            batch_size: 512,
            export_interval: Duration::from_millis(1000),
            export_timeout: Duration::from_millis(5000),
            filter_spans: false,
        }
    }
}

impl TracesConfig {
    /// Tracing is on: an endpoint is set.
    pub fn enabled(&self) -> bool {
        self.endpoint.is_some()
    }
}

/// How spans reach the collector.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
pub enum OtlpProtocol {
    /// OTLP over gRPC (port 4317 by convention).
    #[default]
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP over HTTP with protobuf bodies (port 4318 by convention).
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

/// The `[traces]` rules, and every listener's and route's `trace_sample`.
pub(crate) fn check(config: &crate::Config, p: &mut crate::validate::Problems) {
    use crate::locate::KeyPath;
    let root = KeyPath::root();
    let t = &config.traces;
    let at = root.key("traces");
    if let Some(e) = &t.endpoint {
        let ok = e
            .parse::<http::Uri>()
            .ok()
            .filter(|u| matches!(u.scheme_str(), Some("http" | "https")))
            .is_some_and(|u| u.host().is_some());
        if !ok {
            p.push(
                at.key("endpoint"),
                format!("{e:?} is not an endpoint; expected a URL like \"http://127.0.0.1:4317\""),
            );
        }
    }
    if t.service_name.trim().is_empty() {
        p.push(at.key("service_name"), "must not be empty");
    }
    for (name, v) in &t.headers {
        let ok = v.is_str() || crate::env_reference(v).is_some();
        if !ok || http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            p.push(
                at.key("headers").key(name),
                "expected a field name with a string value or { env = \"NAME\" }",
            );
        }
    }
    for (key, n) in [("queue_size", t.queue_size), ("batch_size", t.batch_size)] {
        if n == 0 || n > 1_000_000 {
            p.push(at.key(key), "expected a count from 1 to 1000000");
        }
    }
    p.positive(at.key("export_interval"), t.export_interval);
    p.positive(at.key("export_timeout"), t.export_timeout);
    for (i, l) in config.listeners.iter().enumerate() {
        let key = root.key("listeners").index(i).key("trace_sample");
        check_ratio(key, l.trace_sample, p);
    }
    for (i, r) in config.routes.iter().enumerate() {
        if let Some(s) = r.trace_sample {
            check_ratio(root.key("routes").index(i).key("trace_sample"), s, p);
        }
    }
}

fn check_ratio(at: crate::locate::KeyPath, ratio: f64, p: &mut crate::validate::Problems) {
    if !(0.0..=1.0).contains(&ratio) {
        p.push(
            at,
            format!("{ratio} is not a ratio; expected a number from 0.0 to 1.0, like 0.01"),
        );
    }
}
