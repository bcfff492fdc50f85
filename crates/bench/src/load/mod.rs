//! The load generator (`keymaster load`): run configuration, the per-thread runners and the
//! open-loop schedule.
//!
//! Three ways to load a target, all over the minimal HTTP/1.1 client in [`client`]:
//!
//! - **closed loop** (like wrk): N keep-alive connections, each sending its next request when the
//!   previous response completes; latency runs from the actual send.
//! - **open loop** (`rate`, like wrk2): requests are due at a constant total rate, spread evenly
//!   over the connections ([`Schedule`]). A request that had to wait for its connection's
//!   previous response is charged from its *intended* send time, so a stalled server shows up in
//!   the percentiles instead of silently slowing the generator (no coordinated omission); one
//!   that only waited for the (millisecond-granular) timer is charged from its actual send. A
//!   connection still waits for its previous response (no pipelining), so give the run enough
//!   connections for rate × latency.
//! - **churn**: either loop, with a new TCP connection and `Connection: close` per request.
//!
//! `https://` targets go over TLS ([`tls`]: one fixed cipher suite and group, no session
//! resumption, so churn over TLS is a full handshake per request). With `h2` the connections
//! are HTTP/2 ([`h2`]: prior knowledge, or ALPN over TLS), one request at a time each.
//!
//! Connections are spread over `threads` OS threads, each with a current-thread tokio runtime and
//! its own counters ([`report::ThreadStats`]), merged at the end into a [`LoadReport`]. A request
//! is counted when it is due (open loop) or sent (closed loop) inside the measured window. No
//! request starts after the window; those in flight at its end are drained (each is bounded by
//! the timeout), so every counted request ends as a response or an error. Open-loop requests
//! still queued behind a busy connection at the end are reported as `unsent` (a sign of
//! overload: their latency would have exceeded what was recorded). Rates are over the window.
//! Call [`run_load`] from sync code (it blocks until the run is over; from async code use
//! `spawn_blocking`).

pub mod client;
pub mod h2;
pub mod hist;
pub mod report;
pub mod tls;

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use client::{ClientError, Conn, Target};
pub use hist::{LatencyHist, LatencySummary};
pub use report::{ErrorCounts, LoadReport, StatusCounts};
use report::{ReportSetup, ThreadStats};

/// A load run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// `http://host[:port]/path?query`.
    pub url: String,
    /// Concurrent connections (at least 1).
    pub connections: usize,
    /// Measured time after the warm-up.
    pub duration: Duration,
    /// Open loop at this total rate (requests per second); `None` = closed loop.
    pub rate: Option<u64>,
    /// New connection (and `Connection: close`) per request.
    pub churn: bool,
    /// Generator threads (0 = number of cores; never more than `connections`).
    pub threads: usize,
    /// Time before the measurement starts; its requests are not counted.
    pub warmup: Duration,
    /// Limit on one request (connect included in churn mode).
    pub timeout: Duration,
    /// Request method (`GET`, `HEAD`, ...). Requests carry no body.
    pub method: String,
    /// Extra request headers.
    pub headers: Vec<(String, String)>,
    /// Measure this many requests after the warm-up, then stop (`duration` is then a cap); the
    /// warm-up's requests are not counted against it.
    pub max_requests: Option<u64>,
    /// `https://` targets: PEM file of the CA to trust (see [`tls`] for the parity crypto).
    pub tls_ca: Option<std::path::PathBuf>,
    /// HTTP/2: prior knowledge on `http://`, ALPN h2 on `https://` ([`h2`]).
    pub h2: bool,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            url: "http://127.0.0.1:8080/".into(),
            connections: 10,
            duration: Duration::from_secs(10),
            rate: None,
            churn: false,
            threads: 0,
            warmup: Duration::ZERO,
            timeout: Duration::from_secs(5),
            method: "GET".into(),
            headers: Vec::new(),
            max_requests: None,
            tls_ca: None,
            h2: false,
        }
    }
}

/// The open-loop schedule: request `j` of the run (counting across all connections) is due
/// `j / rate` seconds after the start, and connection `c` of `n` sends requests `c, c + n, ...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// Total requests per second (at least 1).
    pub rate: u64,
    /// Number of connections sharing the rate.
    pub connections: usize,
}

impl Schedule {
    /// When connection `conn` is due to send its `k`-th request, relative to the start
    /// (rounded down to the nanosecond).
    pub fn due(&self, conn: usize, k: u64) -> Duration {
        let j = u128::from(k) * self.connections as u128 + conn as u128;
        let nanos = j * 1_000_000_000 / u128::from(self.rate.max(1));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// Everything a connection task needs, shared by all threads.
#[derive(Debug)]
struct Plan {
    addr: SocketAddr,
    tls: Option<tls::TlsClient>,
    /// HTTP/2 runs: the request (instead of `request`'s HTTP/1.1 bytes).
    h2: Option<h2::H2Request>,
    request: Vec<u8>,
    head: bool,
    churn: bool,
    schedule: Option<Schedule>,
    timeout: Duration,
    start: std::time::Instant,
    measure_from: std::time::Instant,
    end: std::time::Instant,
    budget: AtomicU64,
}

impl Plan {
    /// A measured request may go out while the budget lasts; warm-up requests always may.
    fn take_ticket(&self, counted: bool) -> bool {
        if !counted {
            return true;
        }
        self.budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// Runs a load test and returns its report. Blocks the calling thread for the warm-up plus the
/// duration (less if `max_requests` runs out first).
pub fn run_load(cfg: &LoadConfig) -> Result<LoadReport, String> {
    let target = Target::parse(&cfg.url)?;
    let addr = target.resolve()?;
    if cfg.connections == 0 {
        return Err("connections must be at least 1".into());
    }
    if cfg.rate == Some(0) {
        return Err("rate must be at least 1 request per second".into());
    }
    let threads = match cfg.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        t => t,
    }
    .min(cfg.connections);
    let method = cfg.method.to_ascii_uppercase();
    // Give every thread time to build its runtime, so the schedules start together.
    let start = std::time::Instant::now() + Duration::from_millis(20);
    let measure_from = start + cfg.warmup;
    let tls = match (target.tls, &cfg.tls_ca) {
        (false, _) => None,
        (true, Some(ca)) => {
            let alpn = if cfg.h2 { "h2" } else { "http/1.1" };
            Some(tls::TlsClient::new(ca, &target.host, &[alpn])?)
        }
        (true, None) => return Err(format!("{}: https needs a CA file (--ca)", cfg.url)),
    };
    let h2 = if cfg.h2 {
        let scheme = if target.tls { "https" } else { "http" };
        let mut headers = http::HeaderMap::new();
        for (n, v) in &cfg.headers {
            let name =
                http::HeaderName::from_bytes(n.as_bytes()).map_err(|e| format!("{n}: {e}"))?;
            let value = http::HeaderValue::from_str(v).map_err(|e| format!("{n}: {e}"))?;
            headers.append(name, value);
        }
        Some(h2::H2Request {
            method: http::Method::from_bytes(method.as_bytes()).map_err(|e| e.to_string())?,
            uri: format!("{scheme}://{}{}", target.authority, target.path)
                .parse()
                .map_err(|e| format!("{}: {e}", cfg.url))?,
            headers,
        })
    } else {
        None
    };
    let plan = Arc::new(Plan {
        addr,
        tls,
        h2,
        request: target.request_bytes(&method, &cfg.headers, cfg.churn),
        head: method == "HEAD",
        churn: cfg.churn,
        schedule: cfg.rate.map(|rate| Schedule {
            rate,
            connections: cfg.connections,
        }),
        timeout: cfg.timeout,
        start,
        measure_from,
        end: measure_from + cfg.duration,
        budget: AtomicU64::new(cfg.max_requests.unwrap_or(u64::MAX)),
    });
    let mut handles = Vec::with_capacity(threads);
    for t in 0..threads {
        let conns: Vec<usize> = (t..cfg.connections).step_by(threads).collect();
        let plan = plan.clone();
        let handle = std::thread::Builder::new()
            .name(format!("load-{t}"))
            .spawn(move || run_thread(&plan, &conns))
            .map_err(|e| format!("spawning load thread: {e}"))?;
        handles.push(handle);
    }
    let mut total = ThreadStats::default();
    let mut finished = measure_from;
    for handle in handles {
        let (stats, done) = handle
            .join()
            .map_err(|_| "a load thread panicked".to_owned())??;
        total.merge(&stats);
        finished = finished.max(done);
    }
    // The window, unless the request budget ran out before it closed: then from the end of the
    // warm-up to the last measured response.
    let measured = if plan.budget.load(Ordering::Relaxed) == 0 {
        total
            .last_counted
            .unwrap_or(finished)
            .min(plan.end)
            .saturating_duration_since(measure_from)
    } else {
        cfg.duration
    };
    let setup = ReportSetup {
        url: cfg.url.clone(),
        mode: if cfg.rate.is_some() { "open" } else { "closed" },
        churn: cfg.churn,
        connections: cfg.connections,
        threads,
        rate: cfg.rate,
        warmup_secs: cfg.warmup.as_secs_f64(),
    };
    Ok(LoadReport::new(setup, &total, measured.as_secs_f64()))
}

/// One generator thread: its connections on a current-thread runtime. Returns its counters and
/// when its last connection stopped.
fn run_thread(
    plan: &Arc<Plan>,
    conns: &[usize],
) -> Result<(ThreadStats, std::time::Instant), String> {
    // A local runtime (as the gateway's workers): `spawn_local` tasks on its own run queue.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build_local(tokio::runtime::LocalOptions::default())
        .map_err(|e| format!("load runtime: {e}"))?;
    let stats = Rc::new(RefCell::new(ThreadStats::default()));
    // Every exchange is bounded by the timeout, so the drain is too; the margin is a backstop.
    let drained = Instant::from_std(plan.end) + plan.timeout + CLOSE_WAIT + Duration::from_secs(1);
    rt.block_on(async {
        let tasks: Vec<_> = conns
            .iter()
            .map(|&c| tokio::task::spawn_local(connection(plan.clone(), c, stats.clone())))
            .collect();
        let _ = tokio::time::timeout_at(drained, async {
            for task in tasks {
                let _ = task.await;
            }
        })
        .await;
    });
    let done = std::time::Instant::now().min(plan.end);
    // The generator's CPU, without the runtime's shutdown.
    let cpu_secs = thread_cpu_time().as_secs_f64();
    // Tasks still running after the backstop (none in practice) are dropped with the runtime.
    drop(rt);
    let mut stats = stats.take();
    stats.cpu_secs = cpu_secs;
    Ok((stats, done))
}

/// CPU time used by the calling thread so far (zero where unsupported).
fn thread_cpu_time() -> Duration {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID needs no setup.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        if rc == 0 {
            return Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
        }
    }
    Duration::ZERO
}

/// How long a churn connection waits for the server's FIN after the response.
const CLOSE_WAIT: Duration = Duration::from_millis(100);

/// One connection slot: sends requests until the run ends or the request budget runs out.
async fn connection(plan: Arc<Plan>, index: usize, stats: Rc<RefCell<ThreadStats>>) {
    let end = Instant::from_std(plan.end);
    let start = Instant::from_std(plan.start);
    let measure_from = Instant::from_std(plan.measure_from);
    let mut conn: Option<AnyConn> = None;
    let mut last_done = start;
    tokio::time::sleep_until(start).await;
    for k in 0u64.. {
        let due = plan.schedule.map(|s| start + s.due(index, k));
        if let Some(due) = due {
            if due >= end {
                break;
            }
            tokio::time::sleep_until(due).await;
        }
        let sent = Instant::now();
        let behind = due.is_some_and(|due| last_done > due);
        // No new request after the end, except one an idle connection's timer woke late for.
        if sent >= end && (due.is_none() || behind) {
            if let Some(schedule) = plan.schedule {
                let unsent = (k..)
                    .map(|k| start + schedule.due(index, k))
                    .take_while(|&due| due < end)
                    .filter(|&due| due >= measure_from)
                    .count();
                stats.borrow_mut().unsent += unsent as u64;
            }
            break;
        }
        // Open loop: a request that waited for the previous response (the connection was behind
        // schedule) is charged from its due time; one that only waited for the timer is charged
        // from the actual send, so the timer's millisecond granularity is not billed to the
        // server.
        let began = match due {
            Some(due) if behind => due,
            _ => sent,
        };
        let counted = began >= measure_from;
        if !plan.take_ticket(counted) {
            break;
        }
        let reused = conn.is_some();
        let result = tokio::time::timeout(plan.timeout, exchange(&plan, &mut conn)).await;
        let done = Instant::now();
        last_done = done;
        let outcome = match result {
            Ok(Ok(info)) => Ok(info),
            Ok(Err(f)) => Err(f),
            Err(_) => Err(Failure::Timeout),
        };
        // Update the counters without holding the borrow across an await.
        let closing = {
            let mut s = stats.borrow_mut();
            if counted {
                s.last_counted = s.last_counted.max(Some(done.into_std()));
            }
            if !reused && conn.is_some() {
                s.connections_opened += 1;
            }
            if let Some(c) = conn.as_mut() {
                let read = c.bytes_read();
                if counted {
                    s.bytes += *read;
                }
                *read = 0;
            }
            match &outcome {
                Ok(info) => {
                    if counted {
                        s.latency.record(done - began);
                        s.status.add(info.status);
                        s.body_bytes += info.body_bytes;
                    }
                    if plan.churn || !info.keep_alive {
                        conn.take()
                    } else {
                        None
                    }
                }
                Err(f) => {
                    conn = None;
                    if counted {
                        if let (Failure::Connect(why), None) = (f, &s.first_connect_error) {
                            s.first_connect_error = Some(why.clone());
                        }
                        let e = &mut s.errors;
                        match f {
                            Failure::Connect(_) => e.connect += 1,
                            Failure::Timeout => e.timeout += 1,
                            Failure::Client(ClientError::Write(_)) => e.write += 1,
                            Failure::Client(ClientError::Read(_)) => e.read += 1,
                            Failure::Client(ClientError::Parse(_)) => e.parse += 1,
                        }
                    }
                    None
                }
            }
        };
        if let Some(c) = closing {
            let _ = tokio::time::timeout(CLOSE_WAIT, c.await_close()).await;
        }
        if matches!(outcome, Err(Failure::Connect(_))) && plan.schedule.is_none() {
            // Don't spin on a refused port in closed loop.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Why an exchange failed.
#[derive(Debug)]
enum Failure {
    /// The TCP connect or the TLS handshake failed: why.
    Connect(String),
    Timeout,
    Client(ClientError),
}

/// A generator connection: HTTP/1.1 (raw bytes) or HTTP/2 (hyper).
enum AnyConn {
    H1(Conn),
    H2(h2::H2Conn),
}

impl AnyConn {
    fn bytes_read(&mut self) -> &mut u64 {
        match self {
            AnyConn::H1(c) => &mut c.bytes_read,
            AnyConn::H2(c) => &mut c.bytes_read,
        }
    }

    async fn await_close(self) {
        if let AnyConn::H1(c) = self {
            c.await_close().await;
        }
    }
}

/// Connects if needed, then sends the request and reads the response.
async fn exchange(
    plan: &Plan,
    conn: &mut Option<AnyConn>,
) -> Result<client::ResponseInfo, Failure> {
    if conn.is_none() {
        let tls = plan.tls.as_ref();
        *conn = Some(match plan.h2 {
            Some(_) => AnyConn::H2(
                h2::H2Conn::connect(plan.addr, tls)
                    .await
                    .map_err(|e| Failure::Connect(e.to_string()))?,
            ),
            None => AnyConn::H1(
                Conn::connect(plan.addr, tls)
                    .await
                    .map_err(|e| Failure::Connect(e.to_string()))?,
            ),
        });
    }
    match (conn.as_mut(), &plan.h2) {
        (Some(AnyConn::H1(c)), _) => c
            .request(&plan.request, plan.head)
            .await
            .map_err(Failure::Client),
        (Some(AnyConn::H2(c)), Some(r)) => c.request(r).await.map_err(Failure::Client),
        _ => Err(Failure::Connect("no connection".into())),
    }
}

/// Parses a duration such as `10s`, `500ms`, `2m`, `1h` or `1.5` (seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a duration like 10s, 500ms, 2m"))?;
    let scale = match unit.trim() {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => return Err(format!("{text:?}: unknown unit {other:?}")),
    };
    Duration::try_from_secs_f64(value * scale).map_err(|e| format!("{text:?}: {e}"))
}

/// Parses a `Name: value` request header.
fn parse_header(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?}: expected Name: value"))?;
    let name = name.trim();
    let valid = !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic() && b != b':');
    if !valid || value.contains(['\r', '\n']) {
        return Err(format!("{text:?}: bad header"));
    }
    Ok((name.to_owned(), value.trim().to_owned()))
}

/// Arguments of `keymaster load`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Target URL (http:// or https://).
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:8080/")]
    pub url: String,
    /// Concurrent connections.
    #[arg(short = 'c', long, value_name = "N", default_value_t = 100)]
    pub connections: usize,
    /// Measured time, after the warm-up (e.g. 10s, 500ms, 2m); default 10s, or with `--requests`
    /// a cap of 10 minutes.
    #[arg(short = 'd', long, value_name = "TIME", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Open loop at this total rate, requests per second (latency from the intended send time).
    #[arg(short = 'R', long, value_name = "REQ_PER_SEC")]
    pub rate: Option<u64>,
    /// A new connection per request (`Connection: close`).
    #[arg(long)]
    pub churn: bool,
    /// Generator threads (0 = number of cores).
    #[arg(short = 't', long, value_name = "T", default_value_t = 0)]
    pub threads: usize,
    /// Warm-up before measuring; its requests are not counted.
    #[arg(long, value_name = "TIME", default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Per-request timeout.
    #[arg(long, value_name = "TIME", default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Request method.
    #[arg(long, default_value = "GET")]
    pub method: String,
    /// Extra request header, `Name: value` (repeatable).
    #[arg(short = 'H', long = "header", value_name = "HEADER", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,
    /// Measure this many requests after the warm-up, then stop; the report's time is the real
    /// elapsed time from the end of the warm-up to the last of them.
    #[arg(long, value_name = "N")]
    pub requests: Option<u64>,
    /// Exit non-zero when more than this percentage of the measured requests failed (non-2xx,
    /// timeouts, read/write/parse errors). Any connect error, or no request at all, always fails.
    #[arg(long, value_name = "PCT", default_value_t = 1.0)]
    pub max_failed: f64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// CA certificate (PEM) to trust for an https:// URL.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<std::path::PathBuf>,
    /// HTTP/2 (prior knowledge over http://, ALPN h2 over https://).
    #[arg(long)]
    pub h2: bool,
}

impl From<&LoadArgs> for LoadConfig {
    fn from(a: &LoadArgs) -> LoadConfig {
        LoadConfig {
            url: a.url.clone(),
            connections: a.connections,
            duration: a.duration.unwrap_or(if a.requests.is_some() {
                Duration::from_secs(600)
            } else {
                Duration::from_secs(10)
            }),
            rate: a.rate,
            churn: a.churn,
            threads: a.threads,
            warmup: a.warmup,
            timeout: a.timeout,
            method: a.method.clone(),
            headers: a.headers.clone(),
            max_requests: a.requests,
            tls_ca: a.ca.clone(),
            h2: a.h2,
        }
    }
}

/// `keymaster load`: runs the load and prints the report (a table, or JSON with `--json`).
pub fn load_main(args: LoadArgs) -> Result<(), String> {
    let report = run_load(&LoadConfig::from(&args))?;
    if args.json {
        let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        println!("{json}");
    } else {
        println!("{report}");
    }
    check_report(&report, args.max_failed)
}

/// Whether a run counts as passed: no connect error, at least one measured request, and at most
/// `max_failed_pct` percent of the measured requests failed (non-2xx or socket errors).
pub fn check_report(report: &LoadReport, max_failed_pct: f64) -> Result<(), String> {
    if report.errors.connect > 0 {
        let why = report.first_connect_error.as_deref().unwrap_or("unknown");
        return Err(format!(
            "{} connect error(s): the target refused, could not be reached or failed the TLS \
             handshake (the first: {why})",
            report.errors.connect
        ));
    }
    let attempted = report.requests + report.errors.total();
    if attempted == 0 {
        return Err("no request was measured".into());
    }
    let failed = (report.requests - report.ok.min(report.requests)) + report.errors.total();
    let pct = failed as f64 * 100.0 / attempted as f64;
    if pct > max_failed_pct {
        return Err(format!(
            "{failed} of {attempted} requests failed ({pct:.2}%, more than --max-failed {max_failed_pct}%)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_is_exact() {
        let s = Schedule {
            rate: 1000,
            connections: 4,
        };
        // Request j is due at j ms; connection c sends j = c, c + 4, c + 8, ...
        assert_eq!(s.due(0, 0), Duration::ZERO);
        assert_eq!(s.due(1, 0), Duration::from_millis(1));
        assert_eq!(s.due(3, 0), Duration::from_millis(3));
        assert_eq!(s.due(0, 1), Duration::from_millis(4));
        assert_eq!(s.due(2, 10), Duration::from_millis(42));
        // The union over connections is exactly j / rate, each j once.
        let mut all: Vec<Duration> = (0..4)
            .flat_map(|c| (0..250).map(move |k| s.due(c, k)))
            .collect();
        all.sort();
        let expect: Vec<Duration> = (0..1000).map(Duration::from_millis).collect();
        assert_eq!(all, expect);
        // Non-integral intervals round down to the nanosecond.
        let s = Schedule {
            rate: 3,
            connections: 1,
        };
        assert_eq!(s.due(0, 1), Duration::from_nanos(333_333_333));
        assert_eq!(s.due(0, 2), Duration::from_nanos(666_666_666));
        assert_eq!(s.due(0, 3), Duration::from_secs(1));
    }

    #[test]
    fn durations_and_headers() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5 days").is_err());
        assert_eq!(
            parse_header("Accept-Encoding: gzip"),
            Ok(("Accept-Encoding".into(), "gzip".into()))
        );
        assert!(parse_header("no colon").is_err());
        assert!(parse_header("Bad Name: x").is_err());
    }

    #[test]
    fn request_budget() {
        let plan = Plan {
            addr: "127.0.0.1:1".parse().unwrap(),
            tls: None,
            h2: None,
            request: Vec::new(),
            head: false,
            churn: false,
            schedule: None,
            timeout: Duration::from_secs(1),
            start: std::time::Instant::now(),
            measure_from: std::time::Instant::now(),
            end: std::time::Instant::now(),
            budget: AtomicU64::new(2),
        };
        // Warm-up requests never spend the budget.
        assert!(plan.take_ticket(false));
        assert!(plan.take_ticket(true));
        assert!(plan.take_ticket(true));
        assert!(!plan.take_ticket(true));
        assert!(plan.take_ticket(false));
    }
}
