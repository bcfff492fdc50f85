//! The access log: one line per request, JSON or combined format, written by a dedicated
//! thread. Workers hand lines over a bounded channel with `try_send`, so a slow disk drops
//! log lines instead of stalling the event loop. Lines dropped there, or lost to a failed
//! write, are counted in `keymaster_access_log_dropped_total`.

use prometheus::IntCounter;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use keymaster_config::{AccessLogConfig, AccessLogFormat};

/// One finished request, as the log sees it.
#[derive(Debug, Default)]
pub struct LogRecord {
    pub request_id: String,
    /// The request's trace id (`[traces]` on), empty otherwise.
    pub trace_id: String,
    pub client: String,
    pub method: String,
    pub uri: String,
    pub version: &'static str,
    pub route: String,
    pub origin: String,
    pub status: u16,
    pub category: &'static str,
    pub duration_us: u64,
    pub upstream_head_us: u64,
    pub bytes_out: u64,
    /// Upstream attempts: one per entry of `tries` (a server tried, a retry included).
    pub attempts: u32,
    /// Requests written to origins: attempts plus keep-alive race resends (an idle pooled
    /// connection the origin closed as the request went out, sent again on a fresh one).
    pub sends: u32,
    pub user_agent: String,
    pub referer: String,
    /// Every upstream attempt, in order (retries included).
    pub tries: Vec<TryRecord>,
}

/// One upstream attempt: which server, how it ended (a status or an error category), and
/// how long it took.
#[derive(Debug, Clone)]
pub struct TryRecord {
    pub origin: std::sync::Arc<str>,
    pub outcome: String,
    pub duration_us: u64,
}

/// Lines the channel to the writer thread holds.
const QUEUED_LINES: usize = 64 * 1024;

pub struct AccessLog {
    tx: SyncSender<String>,
    format: AccessLogFormat,
    dropped: IntCounter,
    /// Set by [`AccessLog::reopen`]: the writer opens its file again before the next line.
    reopen: Arc<AtomicBool>,
}

impl AccessLog {
    /// Open `cfg.path` and start the writer thread; `dropped` counts the lines lost.
    pub fn open(cfg: &AccessLogConfig, dropped: IntCounter) -> std::io::Result<AccessLog> {
        let (out, path): (Box<dyn Write + Send>, _) = if cfg.path == "-" {
            (Box::new(std::io::stdout()), None)
        } else {
            (Box::new(open_file(&cfg.path)?), Some(cfg.path.clone()))
        };
        Self::start(out, path, cfg.format, QUEUED_LINES, dropped)
    }

    /// Open the file again (SIGUSR1, after logrotate renamed it): lines from the next one on
    /// go to a file at the configured path. Lines already handed over may still go to the
    /// renamed file. A file that cannot be opened keeps the old one (and is logged).
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::Release);
    }

    /// The writer thread over `out`, fed by a channel of `queued` lines.
    fn start(
        mut out: Box<dyn Write + Send>,
        path: Option<String>,
        format: AccessLogFormat,
        queued: usize,
        dropped: IntCounter,
    ) -> std::io::Result<AccessLog> {
        let (tx, rx) = sync_channel::<String>(queued);
        let lost = dropped.clone();
        let reopen = Arc::new(AtomicBool::new(false));
        let asked = reopen.clone();
        std::thread::Builder::new()
            .name("keymaster-access-log".into())
            .spawn(move || {
                let mut buf = Vec::with_capacity(64 * 1024);
                while let Ok(line) = rx.recv() {
                    if asked.swap(false, Ordering::AcqRel) {
                        if let Some(p) = &path {
                            match open_file(p) {
                                Ok(f) => out = Box::new(f),
                                Err(e) => tracing::error!(path = %p, error = %e, "access log: cannot reopen; writing to the old file"),
                            }
                        }
                    }
                    buf.extend_from_slice(line.as_bytes());
                    let mut lines = 1;
                    while let Ok(more) = rx.try_recv() {
                        buf.extend_from_slice(more.as_bytes());
                        lines += 1;
                        if buf.len() > 60 * 1024 {
                            break;
                        }
                    }
                    if out.write_all(&buf).and_then(|()| out.flush()).is_err() {
                        lost.inc_by(lines);
                    }
                    buf.clear();
                }
            })?;
        Ok(AccessLog {
            tx,
            format,
            dropped,
            reopen,
        })
    }

    pub fn write(&self, r: &LogRecord) {
        let line = match self.format {
            AccessLogFormat::Json => json_line(r),
            AccessLogFormat::Combined => combined_line(r),
        };
        if let Err(TrySendError::Full(_)) = self.tx.try_send(line) {
            self.dropped.inc();
        }
    }

    /// Lines lost so far (the channel was full, or a write failed).
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }
}

fn open_file(path: &str) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

fn json_line(r: &LogRecord) -> String {
    let v = serde_json::json!({
        "time": rfc3339_now(),
        "request_id": r.request_id,
        "trace_id": r.trace_id,
        "client": r.client,
        "method": r.method,
        "uri": r.uri,
        "version": r.version,
        "route": r.route,
        "origin": r.origin,
        "status": r.status,
        "category": r.category,
        "duration_ms": r.duration_us as f64 / 1000.0,
        "upstream_head_ms": r.upstream_head_us as f64 / 1000.0,
        "bytes_out": r.bytes_out,
        "attempts": r.attempts,
        "sends": r.sends,
        "tries": r.tries.iter().map(|t| serde_json::json!({
            "origin": &*t.origin,
            "outcome": t.outcome,
            "ms": t.duration_us as f64 / 1000.0,
        })).collect::<Vec<_>>(),
        "user_agent": r.user_agent,
    });
    let mut s = v.to_string();
    s.push('\n');
    s
}

fn combined_line(r: &LogRecord) -> String {
    // Quoted fields escape `\` and `"` so a client cannot forge fields of the line.
    let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            esc(s)
        }
    };
    format!(
        "{} - - [{}] \"{} {} {}\" {} {} \"{}\" \"{}\" rid={} trace={} route={} origin={} category={} duration_ms={:.3} attempts={}\n",
        r.client,
        clf_now(),
        esc(&r.method),
        esc(&r.uri),
        r.version,
        r.status,
        r.bytes_out,
        dash(&r.referer),
        dash(&r.user_agent),
        dash(&r.request_id),
        dash(&r.trace_id),
        dash(&r.route),
        dash(&r.origin),
        r.category,
        r.duration_us as f64 / 1000.0,
        r.attempts,
    )
}

/// (year, month, day, hour, minute, second, millis) of now, UTC.
fn now_parts() -> (i64, u32, u32, u64, u64, u64, u32) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs();
    let (y, m, day) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    (
        y,
        m,
        day,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis(),
    )
}

fn rfc3339_now() -> String {
    let (y, mo, d, h, mi, s, ms) = now_parts();
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z")
}

fn clf_now() -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (y, mo, d, h, mi, s, _) = now_parts();
    format!(
        "{d:02}/{}/{y:04}:{h:02}:{mi:02}:{s:02} +0000",
        MONTHS[(mo as usize).saturating_sub(1) % 12]
    )
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink whose writes wait until the test lets them go (a disk that stalls), then fail
    /// or succeed.
    struct Stalled {
        entered: std::sync::mpsc::Sender<()>,
        go: std::sync::mpsc::Receiver<bool>,
    }

    impl Write for Stalled {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let _ = self.entered.send(());
            match self.go.recv() {
                Ok(true) => Ok(b.len()),
                _ => Err(std::io::Error::other("disk failed")),
            }
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_dropped_behind_a_stalled_writer_are_exported() {
        let metrics = crate::metrics::Metrics::new();
        let (go, rx) = std::sync::mpsc::channel();
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let log = AccessLog::start(
            Box::new(Stalled {
                entered: entered_tx,
                go: rx,
            }),
            None,
            AccessLogFormat::Json,
            4,
            metrics.access_log_dropped.clone(),
        )
        .unwrap();
        let r = LogRecord::default();
        // The writer takes the first line and stalls writing it; 4 more fill the channel.
        log.write(&r);
        entered
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the writer took the first line");
        for _ in 0..4 {
            log.tx.try_send(String::new()).expect("room in the channel");
        }
        for _ in 0..10 {
            log.write(&r);
        }
        assert_eq!(log.dropped(), 10);
        assert!(
            metrics
                .render()
                .contains("keymaster_access_log_dropped_total 10\n"),
            "{}",
            metrics.render()
        );
        // A write that fails loses its lines; they are counted too.
        go.send(false).unwrap();
        drop(go);
        drop(log);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while metrics.access_log_dropped.get() < 11 && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(metrics.access_log_dropped.get() >= 11);
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(20_514), (2026, 3, 2));
    }

    #[test]
    fn line_formats() {
        let r = LogRecord {
            request_id: "abc".into(),
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            client: "127.0.0.1".into(),
            method: "GET".into(),
            uri: "/x?y=1".into(),
            version: "HTTP/1.1",
            route: "r".into(),
            origin: "127.0.0.1:9".into(),
            status: 502,
            category: "origin_connectivity",
            duration_us: 1500,
            ..Default::default()
        };
        let j: serde_json::Value = serde_json::from_str(json_line(&r).trim()).unwrap();
        assert_eq!(j["status"], 502);
        assert_eq!(j["category"], "origin_connectivity");
        assert_eq!(j["duration_ms"], 1.5);
        assert_eq!(j["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
        let c = combined_line(&r);
        assert!(c.starts_with("127.0.0.1 - - ["), "{c}");
        assert!(
            c.contains("\"GET /x?y=1 HTTP/1.1\" 502 0 \"-\" \"-\" rid=abc trace=4bf92f3577b34da6a3ce929d0e0e4736 route=r"),
            "{c}"
        );
    }
}
