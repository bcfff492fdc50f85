//! A real OpenTelemetry Collector for trace tests: `tools/otelcol` (the Collector's own Go
//! modules: the OTLP receiver for gRPC and HTTP, the OTLP/HTTP exporter), started on
//! 127.0.0.1 with its spans forwarded as OTLP JSON to a sink this harness serves, so a test
//! reads what the Collector accepted and passed on.
//!
//! The binary is found through `$KEYMASTER_OTELCOL`, or `tools/otelcol/keymaster-otelcol`
//! (built there with `go build` when missing: `.ci/run` builds it first). A collector that
//! can be neither found nor built FAILS the test.
#![allow(dead_code)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The collector binary, built once per test process if it is not there yet.
fn binary() -> PathBuf {
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.as_ref() {
        return p.clone();
    }
    let path = match std::env::var_os("KEYMASTER_OTELCOL") {
        Some(p) => PathBuf::from(p),
        None => {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/otelcol");
            let bin = dir.join("keymaster-otelcol");
            if !bin.exists() {
                build(&dir, &bin);
            }
            bin
        }
    };
    assert!(path.exists(), "no OpenTelemetry Collector at {path:?}");
    *built = Some(path.clone());
    path
}

fn build(dir: &std::path::Path, bin: &std::path::Path) {
    eprintln!(
        "building the OpenTelemetry Collector in {dir:?} (go build; a few minutes the first time)"
    );
    let go = ["go", "/usr/local/go/bin/go"]
        .into_iter()
        .find(|g| {
            std::process::Command::new(g)
                .arg("version")
                .output()
                .is_ok()
        })
        .expect("Go is needed to build tools/otelcol (or set KEYMASTER_OTELCOL)");
    let status = std::process::Command::new(go)
        .args(["build", "-o"])
        .arg(bin)
        .arg(".")
        .current_dir(dir)
        .status()
        .expect("go build runs");
    assert!(status.success(), "go build of tools/otelcol failed");
}

/// A running collector and the sink its spans arrive at.
pub struct Collector {
    child: std::process::Child,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    sink: Sink,
    _dir: tempfile::TempDir,
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One span as the collector passed it on: its resource's attributes beside it.
#[derive(Debug, Clone)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    pub parent: String,
    pub name: String,
    /// 1 internal, 2 server, 3 client.
    pub kind: i64,
    pub attrs: serde_json::Map<String, Value>,
    pub resource: serde_json::Map<String, Value>,
    pub events: Vec<String>,
    pub status_code: i64,
}

impl Span {
    pub fn attr(&self, key: &str) -> Option<String> {
        self.attrs.get(key).map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }
}

impl Collector {
    /// Start the collector on fresh ports and wait until it accepts on both.
    pub async fn start() -> Collector {
        let sink = Sink::start().await;
        let (grpc, http) = (super::support::free_addr(), super::support::free_addr());
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("otelcol.yaml");
        std::fs::write(&config, config_yaml(grpc, http, sink.addr)).unwrap();
        let child = std::process::Command::new(binary())
            .arg("--config")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("collector starts");
        let c = Collector {
            child,
            grpc,
            http,
            sink,
            _dir: dir,
        };
        for addr in [grpc, http] {
            let up = super::support::eventually(Duration::from_secs(20), || {
                std::net::TcpStream::connect(addr).is_ok()
            })
            .await;
            assert!(up, "the collector listens on {addr}");
        }
        c
    }

    /// Every span the collector has passed on so far.
    pub fn spans(&self) -> Vec<Span> {
        let bodies = self.sink.bodies.lock().unwrap().clone();
        bodies.iter().flat_map(spans_of).collect()
    }

    /// Wait (up to 20 s) until `done` holds for the spans passed on; returns them.
    pub async fn wait_for(&self, mut done: impl FnMut(&[Span]) -> bool) -> Vec<Span> {
        let mut spans = Vec::new();
        for _ in 0..200 {
            spans = self.spans();
            if done(&spans) {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        spans
    }
}

fn config_yaml(grpc: SocketAddr, http: SocketAddr, sink: SocketAddr) -> String {
    format!(
        r#"receivers:
  otlp:
    protocols:
      grpc:
        endpoint: {grpc}
      http:
        endpoint: {http}
exporters:
  otlp_http:
    endpoint: http://{sink}
    encoding: json
    compression: none
    retry_on_failure:
      enabled: false
service:
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [otlp_http]
"#
    )
}

fn spans_of(body: &Value) -> Vec<Span> {
    let mut out = Vec::new();
    let empty = Vec::new();
    let list = |v: &Value, k: &str| v.get(k).and_then(Value::as_array).unwrap_or(&empty).clone();
    for rs in list(body, "resourceSpans") {
        let resource = attrs(rs.get("resource").unwrap_or(&Value::Null));
        for ss in list(&rs, "scopeSpans") {
            for s in list(&ss, "spans") {
                let text = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                out.push(Span {
                    trace_id: text("traceId"),
                    span_id: text("spanId"),
                    parent: text("parentSpanId"),
                    name: text("name"),
                    kind: s.get("kind").and_then(Value::as_i64).unwrap_or(0),
                    attrs: attrs(&s),
                    resource: resource.clone(),
                    events: list(&s, "events")
                        .iter()
                        .filter_map(|e| e.get("name").and_then(Value::as_str).map(str::to_string))
                        .collect(),
                    status_code: s
                        .pointer("/status/code")
                        .and_then(Value::as_i64)
                        .unwrap_or(0),
                });
            }
        }
    }
    out
}

/// OTLP JSON attributes as a flat map (`{"key", "value": {"stringValue" | "intValue"}}`).
fn attrs(v: &Value) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    for a in v
        .get("attributes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = a
            .get("key")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let value = a
            .get("value")
            .and_then(Value::as_object)
            .and_then(|o| o.values().next().cloned())
            .unwrap_or(Value::Null);
        m.insert(key, value);
    }
    m
}

/// The HTTP server the collector exports OTLP JSON to.
struct Sink {
    addr: SocketAddr,
    bodies: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Sink {
    async fn start() -> Sink {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let store = bodies.clone();
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let store = store.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let store = store.clone();
                        async move {
                            let body = req.into_body().collect().await?.to_bytes();
                            if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                                store.lock().unwrap().push(v);
                            }
                            let mut resp =
                                hyper::Response::new(Full::new(Bytes::from_static(b"{}")));
                            resp.headers_mut().insert(
                                http::header::CONTENT_TYPE,
                                http::HeaderValue::from_static("application/json"),
                            );
                            Ok::<_, hyper::Error>(resp)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        Sink { addr, bodies, task }
    }
}
