//! The result of a load run: counters gathered per thread, merged into a [`LoadReport`] that
//! serialises to JSON and prints as a wrk-like table.

use std::fmt;

use serde::Serialize;

use super::hist::{LatencyHist, LatencySummary};

/// Responses by status class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StatusCounts {
    /// 1xx other than 100 Continue (101 and friends), seen as final responses.
    pub s1xx: u64,
    /// 2xx.
    pub s2xx: u64,
    /// 3xx.
    pub s3xx: u64,
    /// 4xx.
    pub s4xx: u64,
    /// 5xx.
    pub s5xx: u64,
    /// Anything else (600 and up).
    pub other: u64,
}

impl StatusCounts {
    /// Counts one status.
    pub fn add(&mut self, status: u16) {
        match status {
            100..=199 => self.s1xx += 1,
            200..=299 => self.s2xx += 1,
            300..=399 => self.s3xx += 1,
            400..=499 => self.s4xx += 1,
            500..=599 => self.s5xx += 1,
            _ => self.other += 1,
        }
    }

    fn merge(&mut self, o: &StatusCounts) {
        self.s1xx += o.s1xx;
        self.s2xx += o.s2xx;
        self.s3xx += o.s3xx;
        self.s4xx += o.s4xx;
        self.s5xx += o.s5xx;
        self.other += o.other;
    }

    /// Responses that are not 2xx or 3xx.
    pub fn unsuccessful(&self) -> u64 {
        self.s1xx + self.s4xx + self.s5xx + self.other
    }
}

/// Requests that got no (valid) response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ErrorCounts {
    /// The TCP connect or the TLS handshake failed.
    pub connect: u64,
    /// Writing the request failed.
    pub write: u64,
    /// Reading failed or the server closed before the response was complete.
    pub read: u64,
    /// No complete response within the timeout.
    pub timeout: u64,
    /// The response was not valid HTTP/1.x.
    pub parse: u64,
}

impl ErrorCounts {
    /// All socket-level errors.
    pub fn total(&self) -> u64 {
        self.connect + self.write + self.read + self.timeout + self.parse
    }

    fn merge(&mut self, o: &ErrorCounts) {
        self.connect += o.connect;
        self.write += o.write;
        self.read += o.read;
        self.timeout += o.timeout;
        self.parse += o.parse;
    }
}

/// What one thread measured.
#[derive(Debug, Clone, Default)]
pub struct ThreadStats {
    /// Latencies of complete responses.
    pub latency: LatencyHist,
    /// Complete responses by status class.
    pub status: StatusCounts,
    /// Failed requests.
    pub errors: ErrorCounts,
    /// Bytes read from sockets (heads, bodies, framing).
    pub bytes: u64,
    /// Body bytes after transfer decoding.
    pub body_bytes: u64,
    /// TCP connections opened.
    pub connections_opened: u64,
    /// CPU time the generator thread used (whole run, warm-up included), seconds.
    pub cpu_secs: f64,
    /// Open loop: requests due in the window but never sent (their connection was still busy).
    pub unsent: u64,
    /// When the last counted request finished (for `--requests`: the real end of the window).
    pub last_counted: Option<std::time::Instant>,
    /// Why the first failed connection failed (refused, a TLS certificate not trusted, ...).
    pub first_connect_error: Option<String>,
}

impl ThreadStats {
    /// Adds another thread's counters.
    pub fn merge(&mut self, o: &ThreadStats) {
        self.latency.merge(&o.latency);
        self.status.merge(&o.status);
        self.errors.merge(&o.errors);
        self.bytes += o.bytes;
        self.body_bytes += o.body_bytes;
        self.connections_opened += o.connections_opened;
        self.cpu_secs += o.cpu_secs;
        self.unsent += o.unsent;
        self.last_counted = self.last_counted.max(o.last_counted);
        if self.first_connect_error.is_none() {
            self.first_connect_error.clone_from(&o.first_connect_error);
        }
    }
}

/// The result of a load run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadReport {
    /// Target URL.
    pub url: String,
    /// `"closed"` (wrk-like) or `"open"` (constant rate, wrk2-like).
    pub mode: &'static str,
    /// Whether every request used a new connection.
    pub churn: bool,
    /// Concurrent connections.
    pub connections: usize,
    /// Generator threads.
    pub threads: usize,
    /// Target total rate (open loop), requests per second.
    pub rate: Option<u64>,
    /// Warm-up excluded from the figures, seconds.
    pub warmup_secs: f64,
    /// Measured time, seconds.
    pub duration_secs: f64,
    /// Complete responses (any status).
    pub requests: u64,
    /// Complete 2xx/3xx responses.
    pub ok: u64,
    /// `requests / duration_secs`.
    pub requests_per_sec: f64,
    /// `ok / duration_secs`.
    pub ok_per_sec: f64,
    /// Latency of complete responses, milliseconds (from the intended send time in open loop).
    pub latency_ms: LatencySummary,
    /// Bytes read (heads, bodies, framing).
    pub bytes: u64,
    /// Body bytes after transfer decoding.
    pub body_bytes: u64,
    /// Read throughput, megabits per second.
    pub mbps: f64,
    /// Responses by status class.
    pub status: StatusCounts,
    /// Requests without a valid response.
    pub errors: ErrorCounts,
    /// Open loop: requests due in the window that were never sent because their connection was
    /// still waiting for an earlier response when the window closed (overload; 0 in closed loop).
    pub unsent: u64,
    /// TCP connections opened.
    pub connections_opened: u64,
    /// Why the first failed connection failed, when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_connect_error: Option<String>,
    /// CPU seconds the generator's threads used over the whole run (warm-up included; 0 where
    /// unsupported). Compare with the wall time to check the generator is not the bottleneck.
    pub generator_cpu_secs: f64,
}

impl LoadReport {
    /// Builds the report from merged counters.
    pub fn new(setup: ReportSetup, stats: &ThreadStats, duration_secs: f64) -> LoadReport {
        let requests = stats.latency.count();
        let ok = stats.status.s2xx + stats.status.s3xx;
        let per_sec = |n: u64| {
            if duration_secs > 0.0 {
                n as f64 / duration_secs
            } else {
                0.0
            }
        };
        LoadReport {
            url: setup.url,
            mode: setup.mode,
            churn: setup.churn,
            connections: setup.connections,
            threads: setup.threads,
            rate: setup.rate,
            warmup_secs: setup.warmup_secs,
            duration_secs,
            requests,
            ok,
            requests_per_sec: per_sec(requests),
            ok_per_sec: per_sec(ok),
            latency_ms: stats.latency.summary(),
            bytes: stats.bytes,
            body_bytes: stats.body_bytes,
            mbps: per_sec(stats.bytes) * 8.0 / 1e6,
            status: stats.status,
            errors: stats.errors,
            unsent: stats.unsent,
            connections_opened: stats.connections_opened,
            first_connect_error: stats.first_connect_error.clone(),
            generator_cpu_secs: stats.cpu_secs,
        }
    }

    /// Whether every request got a 2xx/3xx response.
    pub fn all_ok(&self) -> bool {
        self.errors.total() == 0 && self.ok == self.requests
    }
}

/// The run's settings echoed into the report.
#[derive(Debug, Clone)]
pub struct ReportSetup {
    /// Target URL.
    pub url: String,
    /// `"closed"` or `"open"`.
    pub mode: &'static str,
    /// New connection per request.
    pub churn: bool,
    /// Concurrent connections.
    pub connections: usize,
    /// Generator threads.
    pub threads: usize,
    /// Target rate.
    pub rate: Option<u64>,
    /// Warm-up seconds.
    pub warmup_secs: f64,
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match (self.mode, self.rate) {
            ("open", Some(r)) => format!("open loop at {r} req/s"),
            _ => "closed loop".to_owned(),
        };
        let churn = if self.churn {
            ", new connection per request"
        } else {
            ""
        };
        writeln!(f, "keymaster load @ {}", self.url)?;
        writeln!(
            f,
            "  {mode}{churn}: {} connections, {} threads, {:.2}s measured after {:.2}s warm-up",
            self.connections, self.threads, self.duration_secs, self.warmup_secs
        )?;
        let l = &self.latency_ms;
        writeln!(
            f,
            "  Latency ms   avg {:.3}  stdev {:.3}  min {:.3}  max {:.3}",
            l.mean, l.stdev, l.min, l.max
        )?;
        writeln!(
            f,
            "    p50 {:.3}  p75 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  p99.99 {:.3}",
            l.p50, l.p75, l.p90, l.p99, l.p999, l.p9999
        )?;
        writeln!(
            f,
            "  {} requests ({} ok) in {:.2}s: {:.1} req/s, {:.1} ok/s",
            self.requests, self.ok, self.duration_secs, self.requests_per_sec, self.ok_per_sec
        )?;
        writeln!(
            f,
            "  {} bytes read ({} body): {:.2} Mbps; {} connections opened",
            self.bytes, self.body_bytes, self.mbps, self.connections_opened
        )?;
        let s = &self.status;
        writeln!(
            f,
            "  Status 2xx {}  3xx {}  4xx {}  5xx {}  other {}",
            s.s2xx,
            s.s3xx,
            s.s4xx,
            s.s5xx,
            s.s1xx + s.other
        )?;
        let e = &self.errors;
        writeln!(
            f,
            "  Socket errors: connect {}, write {}, read {}, timeout {}, parse {}",
            e.connect, e.write, e.read, e.timeout, e.parse
        )?;
        if let Some(why) = &self.first_connect_error {
            writeln!(f, "  First failed connection: {why}")?;
        }
        if self.unsent > 0 {
            writeln!(
                f,
                "  Unsent: {} requests were due but their connections were still busy at the end",
                self.unsent
            )?;
        }
        write!(
            f,
            "  Generator CPU {:.2}s over {:.2}s (warm-up included)",
            self.generator_cpu_secs,
            self.duration_secs + self.warmup_secs
        )
    }
}
