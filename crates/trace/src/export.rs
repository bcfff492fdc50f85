//! The export thread: finished requests' spans leave the workers through a bounded queue
//! (full: dropped and counted, never waited for) and go to the collector over OTLP in
//! batches from one thread of its own, with its own small runtime. A collector that is
//! down, slow or refusing costs the workers nothing: exports time out on this thread.

use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use opentelemetry_sdk::Resource;
use prometheus::IntCounter;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use keymaster_config::{OtlpProtocol, TracesConfig};

use crate::record::FinishedTrace;
use crate::spans::spans_of;

/// Spans by how they ended: exported, dropped at a full queue, or failed to export.
#[derive(Clone)]
pub struct Counters {
    pub exported: IntCounter,
    pub dropped: IntCounter,
    pub failed: IntCounter,
}

/// The handle workers submit finished requests' spans to. Dropping it flushes what is
/// queued (within `export_timeout`) and ends the thread.
pub struct Exporter {
    tx: Option<SyncSender<Box<FinishedTrace>>>,
    counters: Counters,
    filter_spans: bool,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Exporter {
    /// Start the export thread for `config` (its endpoint set). `version`: the
    /// `service.version` resource attribute.
    pub fn start(
        config: &TracesConfig,
        version: &'static str,
        counters: Counters,
    ) -> Result<Exporter, String> {
        let endpoint = config
            .endpoint
            .clone()
            .ok_or("traces.endpoint is not set")?;
        let headers = headers_of(config)?;
        let resource = resource(config, version);
        let (tx, rx) = sync_channel(config.queue_size);
        let job = Job {
            rx,
            counters: counters.clone(),
            batch_size: config.batch_size,
            interval: config.export_interval.get(),
            timeout: config.export_timeout.get(),
            filter_spans: config.filter_spans,
            scope: InstrumentationScope::builder("keymaster")
                .with_version(version)
                .build(),
        };
        let protocol = config.protocol;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("keymaster-traces".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => return drop(ready_tx.send(Err(format!("traces runtime: {e}")))),
                };
                let built = rt.block_on(async { build(protocol, &endpoint, headers, job.timeout) });
                match built {
                    Ok(mut exporter) => {
                        exporter.set_resource(&resource);
                        let _ = ready_tx.send(Ok(()));
                        job.run(&rt, exporter);
                    }
                    Err(e) => drop(ready_tx.send(Err(e))),
                }
            })
            .map_err(|e| format!("traces thread: {e}"))?;
        ready_rx
            .recv()
            .map_err(|_| "traces thread ended at start".to_string())??;
        Ok(Exporter {
            tx: Some(tx),
            counters,
            filter_spans: config.filter_spans,
            thread: Some(thread),
        })
    }

    /// Queue a finished request's spans; a full queue drops them (counted).
    pub fn submit(&self, trace: Box<FinishedTrace>) {
        let Some(tx) = &self.tx else { return };
        let n = trace.span_count(self.filter_spans);
        match tx.try_send(trace) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counters.dropped.inc_by(n)
            }
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the export thread owns.
struct Job {
    rx: Receiver<Box<FinishedTrace>>,
    counters: Counters,
    batch_size: usize,
    interval: Duration,
    timeout: Duration,
    filter_spans: bool,
    scope: InstrumentationScope,
}

impl Job {
    /// Batch until `batch_size` spans or `interval` after a batch's first, export, repeat;
    /// when every sender is gone, export what is left and end.
    fn run(self, rt: &tokio::runtime::Runtime, exporter: opentelemetry_otlp::SpanExporter) {
        let mut batch: Vec<SpanData> = Vec::with_capacity(self.batch_size);
        let mut due: Option<Instant> = None;
        loop {
            let wait = due.map_or(Duration::from_secs(3600), |d| {
                d.saturating_duration_since(Instant::now())
            });
            let ended = match self.rx.recv_timeout(wait) {
                Ok(t) => {
                    due.get_or_insert_with(|| Instant::now() + self.interval);
                    spans_of(*t, &self.scope, self.filter_spans, &mut batch);
                    if batch.len() < self.batch_size {
                        continue;
                    }
                    false
                }
                Err(RecvTimeoutError::Timeout) => false,
                Err(RecvTimeoutError::Disconnected) => true,
            };
            due = None;
            if !batch.is_empty() {
                self.export(rt, &exporter, std::mem::take(&mut batch));
            }
            if ended {
                return;
            }
        }
    }

    fn export(
        &self,
        rt: &tokio::runtime::Runtime,
        exporter: &opentelemetry_otlp::SpanExporter,
        batch: Vec<SpanData>,
    ) {
        let n = batch.len() as u64;
        let done =
            rt.block_on(async { tokio::time::timeout(self.timeout, exporter.export(batch)).await });
        match done {
            Ok(Ok(())) => self.counters.exported.inc_by(n),
            Ok(Err(e)) => {
                self.counters.failed.inc_by(n);
                tracing::debug!(error = %e, spans = n, "trace export failed");
            }
            Err(_) => {
                self.counters.failed.inc_by(n);
                tracing::debug!(spans = n, "trace export timed out");
            }
        }
    }
}

fn build(
    protocol: OtlpProtocol,
    endpoint: &str,
    headers: Vec<(String, String)>,
    timeout: Duration,
) -> Result<opentelemetry_otlp::SpanExporter, String> {
    let built = match protocol {
        OtlpProtocol::Grpc => {
            let mut metadata = tonic::metadata::MetadataMap::new();
            for (k, v) in &headers {
                let key = tonic::metadata::MetadataKey::from_bytes(k.as_bytes())
                    .map_err(|e| format!("traces.headers.{k}: {e}"))?;
                let value = v.parse().map_err(|e| format!("traces.headers.{k}: {e}"))?;
                metadata.insert(key, value);
            }
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .with_timeout(timeout)
                .with_metadata(metadata)
                .build()
        }
        OtlpProtocol::HttpProtobuf => {
            let client =
                opentelemetry_http::hyper::HyperClient::with_default_connector(timeout, None);
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
                .with_timeout(timeout)
                .with_http_client(client)
                .with_headers(headers.into_iter().collect())
                .build()
        }
    };
    built.map_err(|e| format!("traces exporter: {e}"))
}

/// `[traces] headers`, each `{ env = "NAME" }` read now.
fn headers_of(config: &TracesConfig) -> Result<Vec<(String, String)>, String> {
    let table =
        keymaster_config::env_table(&config.headers).map_err(|e| format!("traces.headers.{e}"))?;
    Ok(table
        .into_iter()
        .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_string()))
        .collect())
}

fn resource(config: &TracesConfig, version: &'static str) -> Resource {
    let instance = config
        .service_instance
        .clone()
        .unwrap_or_else(default_instance);
    Resource::builder_empty()
        .with_attributes([
            KeyValue::new("service.name", config.service_name.clone()),
            KeyValue::new("service.instance.id", instance),
            KeyValue::new("service.version", version),
        ])
        .build()
}

/// The host name and process id: unique per running instance.
fn default_instance() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    format!("{host}:{}", std::process::id())
}
