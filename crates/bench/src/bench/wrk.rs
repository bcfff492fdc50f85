//! wrk as the bench's load driver (`keymaster bench --driver wrk`).
//!
//! Runs `wrk -t T -c C -d Ns --latency --timeout Ns URL` as a child process (pinned to the load
//! CPUs with `--pin`, like the built-in generator), parses what it prints and fills the same
//! [`LoadReport`] the built-in generator returns, so the report, charts and JSON need not know
//! which driver ran.
//!
//! What wrk does not say is marked, not invented: the smallest latency, p99.9 and p99.99 are NaN
//! (`null` in JSON), body bytes are 0, and wrk's `Non-2xx or 3xx responses` cannot be split by
//! class, so they are counted under [`StatusCounts::other`] (and 3xx under 2xx).
//!
//! wrk takes whole seconds for `-d` and `--timeout`: both are rounded up (at least 1 s).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::systems::{self, CpuSet};
use crate::load::hist::LatencySummary;
use crate::load::report::{ErrorCounts, LoadReport, StatusCounts};
use crate::load::LoadConfig;

/// wrk on `PATH` (or in the sbin directories), if installed.
pub fn find_wrk() -> Option<PathBuf> {
    systems::find_program("wrk")
}

/// The wrk binary, or why `--driver wrk` cannot run.
pub fn require_wrk() -> Result<PathBuf, String> {
    find_wrk().ok_or_else(|| {
        "--driver wrk: wrk is not installed (not on PATH); install it (apt-get install wrk) \
         or use --driver builtin"
            .to_owned()
    })
}

/// `wrk -v`'s first line (`wrk 4.1.0 [epoll] ...`), without the copyright.
pub fn wrk_version(wrk: &std::path::Path) -> Option<String> {
    let out = Command::new(wrk).arg("-v").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next()?.trim();
    let line = line.split(" Copyright").next().unwrap_or(line).trim();
    line.starts_with("wrk").then(|| line.to_owned())
}

/// Whole seconds for wrk's `-d` and `--timeout`: rounded up, at least 1.
pub fn whole_secs(d: Duration) -> u64 {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    s.max(1)
}

/// The wrk command line for a measured run of `secs` seconds (without the program name).
pub fn wrk_args(cfg: &LoadConfig, secs: u64) -> Result<Vec<String>, String> {
    if cfg.rate.is_some() {
        return Err(
            "--driver wrk: wrk runs closed loop only; drop --rate or use --driver builtin".into(),
        );
    }
    if cfg.method != "GET" {
        return Err(format!(
            "--driver wrk: only GET is supported, not {}",
            cfg.method
        ));
    }
    if cfg.max_requests.is_some() {
        return Err("--driver wrk: a request limit is not supported".into());
    }
    let connections = cfg.connections.max(1);
    // wrk wants at least one connection per thread.
    let threads = if cfg.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        cfg.threads
    }
    .clamp(1, connections);
    let mut args = vec![
        format!("-t{threads}"),
        format!("-c{connections}"),
        format!("-d{secs}s"),
        "--latency".to_owned(),
        "--timeout".to_owned(),
        format!("{}s", whole_secs(cfg.timeout)),
    ];
    if cfg.churn {
        // wrk reconnects after every response that says `Connection: close`.
        args.push("-H".into());
        args.push("Connection: close".into());
    }
    for (k, v) in &cfg.headers {
        args.push("-H".into());
        args.push(format!("{k}: {v}"));
    }
    args.push(cfg.url.clone());
    Ok(args)
}

/// Runs the unmeasured warm-up (`cfg.warmup`, rounded up to whole seconds) if any, then the
/// measured run (`cfg.duration`); returns the measured run's report.
pub fn run_wrk(cfg: &LoadConfig, cpus: Option<&CpuSet>) -> Result<LoadReport, String> {
    let before = children_cpu_secs();
    let warm = warm_up(cfg, cpus)?;
    let mut report = measure(cfg, cpus)?;
    report.warmup_secs = warm;
    report.generator_cpu_secs = children_cpu_secs() - before;
    Ok(report)
}

/// The unmeasured wrk run of a step (`cfg.warmup` rounded up); returns its length in seconds
/// (0 when there is no warm-up).
pub fn warm_up(cfg: &LoadConfig, cpus: Option<&CpuSet>) -> Result<f64, String> {
    if cfg.warmup.is_zero() {
        return Ok(0.0);
    }
    let secs = whole_secs(cfg.warmup);
    exec(&wrk_args(cfg, secs)?, cpus)?;
    Ok(secs as f64)
}

/// The measured wrk run: `cfg.duration` rounded up to whole seconds.
pub fn measure(cfg: &LoadConfig, cpus: Option<&CpuSet>) -> Result<LoadReport, String> {
    let before = children_cpu_secs();
    let text = exec(&wrk_args(cfg, whole_secs(cfg.duration))?, cpus)?;
    let out = parse_wrk_output(&text)?;
    let mut report = out.to_report(cfg);
    report.generator_cpu_secs = children_cpu_secs() - before;
    Ok(report)
}

/// Runs wrk with `args` and returns its stdout; a failed start or exit is an error with wrk's
/// own words.
fn exec(args: &[String], cpus: Option<&CpuSet>) -> Result<String, String> {
    let wrk = require_wrk()?;
    let mut cmd = Command::new(&wrk);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    super::systems::pin_child(&mut cmd, cpus);
    let out = cmd
        .output()
        .map_err(|e| format!("starting {}: {e}", wrk.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let said = format!("{} {}", stdout.trim(), stderr.trim());
        return Err(format!(
            "wrk {} failed ({}): {}",
            args.join(" "),
            out.status,
            said.trim()
        ));
    }
    Ok(stdout)
}

/// CPU seconds (user + system) of this process's reaped children so far.
pub fn children_cpu_secs() -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given; RUSAGE_CHILDREN is valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// What one wrk run printed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WrkOutput {
    /// Threads (`N threads and M connections`).
    pub threads: usize,
    /// Connections.
    pub connections: usize,
    /// Completed requests.
    pub requests: u64,
    /// The run's actual length (`in 2.04s`), seconds.
    pub duration_secs: f64,
    /// Bytes read (`36.01MB read`).
    pub bytes: u64,
    /// `Requests/sec:`.
    pub requests_per_sec: f64,
    /// `Transfer/sec:`, bytes per second.
    pub transfer_bytes_per_sec: f64,
    /// Latency: average, standard deviation and max (thread stats), milliseconds.
    pub avg_ms: f64,
    /// Standard deviation, ms.
    pub stdev_ms: f64,
    /// Largest, ms.
    pub max_ms: f64,
    /// `--latency` distribution, ms.
    pub p50_ms: f64,
    /// 75th percentile, ms.
    pub p75_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// `Non-2xx or 3xx responses:`.
    pub non_2xx_3xx: u64,
    /// `Socket errors: connect a, read b, write c, timeout d`.
    pub errors: ErrorCounts,
}

impl WrkOutput {
    /// The same report the built-in generator gives, for `cfg`'s step.
    pub fn to_report(&self, cfg: &LoadConfig) -> LoadReport {
        let ok = self.requests.saturating_sub(self.non_2xx_3xx);
        let ok_per_sec = if self.duration_secs > 0.0 {
            ok as f64 / self.duration_secs
        } else {
            0.0
        };
        LoadReport {
            url: cfg.url.clone(),
            mode: "closed",
            churn: cfg.churn,
            connections: self.connections,
            threads: self.threads,
            rate: None,
            warmup_secs: 0.0,
            duration_secs: self.duration_secs,
            requests: self.requests,
            ok,
            requests_per_sec: self.requests_per_sec,
            ok_per_sec,
            latency_ms: LatencySummary {
                count: self.requests,
                min: f64::NAN,
                mean: self.avg_ms,
                stdev: self.stdev_ms,
                p50: self.p50_ms,
                p75: self.p75_ms,
                p90: self.p90_ms,
                p99: self.p99_ms,
                p999: f64::NAN,
                p9999: f64::NAN,
                max: self.max_ms,
            },
            bytes: self.bytes,
            body_bytes: 0,
            mbps: self.transfer_bytes_per_sec * 8.0 / 1e6,
            status: StatusCounts {
                s2xx: ok,
                other: self.non_2xx_3xx,
                ..StatusCounts::default()
            },
            errors: self.errors,
            unsent: 0,
            connections_opened: if cfg.churn {
                self.requests
            } else {
                self.connections as u64
            },
            first_connect_error: None,
            generator_cpu_secs: 0.0,
        }
    }
}

/// Parses wrk 4.x output (`--latency` on). Never panics: odd output is an error that quotes the
/// offending line.
pub fn parse_wrk_output(text: &str) -> Result<WrkOutput, String> {
    let mut o = WrkOutput::default();
    let (mut seen_requests, mut seen_rps, mut seen_latency) = (false, false, false);
    let mut seen_pct = [false; 4];
    let bad = |what: &str, line: &str| format!("wrk output: {what} in line {:?}", line.trim());
    for line in text.lines() {
        let l = line.trim();
        if let Some((t, c)) = l.split_once(" threads and ") {
            o.threads = parse_count(t).ok_or_else(|| bad("bad thread count", line))? as usize;
            let c = c.strip_suffix(" connections").unwrap_or(c);
            o.connections = parse_count(c).ok_or_else(|| bad("bad connections", line))? as usize;
        } else if let Some(rest) = l.strip_prefix("Latency Distribution") {
            let _ = rest;
        } else if let Some(rest) = l.strip_prefix("Latency ") {
            // `Latency   2.68ms    8.27ms  90.92ms   97.15%`: avg, stdev, max, +/- stdev.
            let f: Vec<&str> = rest.split_whitespace().collect();
            if f.len() < 3 {
                return Err(bad("expected avg, stdev and max latency", line));
            }
            o.avg_ms = parse_time_ms(f[0]).ok_or_else(|| bad("bad average latency", line))?;
            o.stdev_ms = parse_time_ms(f[1]).ok_or_else(|| bad("bad latency stdev", line))?;
            o.max_ms = parse_time_ms(f[2]).ok_or_else(|| bad("bad max latency", line))?;
            seen_latency = true;
        } else if let Some((pct, value)) = percentile_line(l) {
            let ms = parse_time_ms(value).ok_or_else(|| bad("bad percentile latency", line))?;
            let slot = match pct {
                "50" => 0,
                "75" => 1,
                "90" => 2,
                "99" => 3,
                _ => continue,
            };
            *[&mut o.p50_ms, &mut o.p75_ms, &mut o.p90_ms, &mut o.p99_ms][slot] = ms;
            seen_pct[slot] = true;
        } else if let Some((n, rest)) = l.split_once(" requests in ") {
            // `32409 requests in 2.04s, 36.01MB read`.
            o.requests = parse_count(n).ok_or_else(|| bad("bad request count", line))?;
            let (time, read) = rest
                .split_once(", ")
                .ok_or_else(|| bad("expected `TIME, BYTES read`", line))?;
            o.duration_secs =
                parse_time_ms(time).ok_or_else(|| bad("bad run time", line))? / 1000.0;
            let read = read.strip_suffix(" read").unwrap_or(read);
            o.bytes = parse_bytes(read)
                .ok_or_else(|| bad("bad bytes read", line))?
                .round() as u64;
            seen_requests = true;
        } else if let Some(rest) = l.strip_prefix("Socket errors:") {
            for part in rest.split(',') {
                let mut kv = part.split_whitespace();
                let (Some(k), Some(v), None) = (kv.next(), kv.next(), kv.next()) else {
                    return Err(bad("expected `KIND N` socket errors", line));
                };
                let n = parse_count(v).ok_or_else(|| bad("bad socket error count", line))?;
                match k {
                    "connect" => o.errors.connect = n,
                    "read" => o.errors.read = n,
                    "write" => o.errors.write = n,
                    "timeout" => o.errors.timeout = n,
                    _ => return Err(bad("unknown socket error kind", line)),
                }
            }
        } else if let Some(rest) = l.strip_prefix("Non-2xx or 3xx responses:") {
            o.non_2xx_3xx = parse_count(rest).ok_or_else(|| bad("bad Non-2xx count", line))?;
        } else if let Some(rest) = l.strip_prefix("Requests/sec:") {
            o.requests_per_sec = parse_number(rest).ok_or_else(|| bad("bad Requests/sec", line))?;
            seen_rps = true;
        } else if let Some(rest) = l.strip_prefix("Transfer/sec:") {
            o.transfer_bytes_per_sec =
                parse_bytes(rest).ok_or_else(|| bad("bad Transfer/sec", line))?;
        }
    }
    if !seen_requests {
        return Err(format!(
            "wrk output: no `N requests in T, B read` line (is this wrk 4 output?): {:?}",
            first_lines(text)
        ));
    }
    if !seen_rps {
        return Err("wrk output: no `Requests/sec:` line".into());
    }
    if o.requests > 0 {
        if !seen_latency {
            return Err("wrk output: no `Latency` thread-stats line".into());
        }
        if seen_pct.contains(&false) {
            return Err(
                "wrk output: no complete `Latency Distribution` (50/75/90/99%); was --latency on?"
                    .into(),
            );
        }
    }
    Ok(o)
}

fn first_lines(text: &str) -> String {
    text.lines().take(3).collect::<Vec<_>>().join(" | ")
}

/// `50%  0.99ms` → (`50`, `0.99ms`).
fn percentile_line(l: &str) -> Option<(&str, &str)> {
    let (pct, rest) = l.split_once('%')?;
    let pct = pct.trim();
    if pct.is_empty() || !pct.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    let value = rest.trim();
    (!value.is_empty() && !value.contains(' ')).then_some((pct, value))
}

/// A plain finite number.
fn parse_number(s: &str) -> Option<f64> {
    let v: f64 = s.trim().parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some(v)
}

/// Splits `12.5ms` into (`12.5`, `ms`).
fn split_unit(s: &str) -> (&str, &str) {
    let s = s.trim();
    let at = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(s.len());
    s.split_at(at)
}

/// wrk's times (`us`, `ms`, `s`, `m`, `h`; bare = seconds) in milliseconds.
pub fn parse_time_ms(s: &str) -> Option<f64> {
    let (n, unit) = split_unit(s);
    let v = parse_number(n)?;
    let scale = match unit {
        "us" => 1e-3,
        "ms" => 1.0,
        "s" | "" => 1e3,
        "m" => 60e3,
        "h" => 3600e3,
        _ => return None,
    };
    Some(v * scale)
}

/// wrk's byte sizes (`B`, `KB`, `MB`, `GB`, `TB`, `PB`, powers of 1024) in bytes.
pub fn parse_bytes(s: &str) -> Option<f64> {
    let (n, unit) = split_unit(s);
    let v = parse_number(n)?;
    let exp = match unit {
        "B" | "" => 0,
        "KB" => 1,
        "MB" => 2,
        "GB" => 3,
        "TB" => 4,
        "PB" => 5,
        _ => return None,
    };
    Some(v * 1024f64.powi(exp))
}

/// wrk's counts (`16.15k`, `2M`; SI, powers of 1000), rounded to a whole number.
pub fn parse_count(s: &str) -> Option<u64> {
    let (n, unit) = split_unit(s);
    let v = parse_number(n)?;
    let scale = match unit {
        "" => 1.0,
        "k" | "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        _ => return None,
    };
    let x = (v * scale).round();
    (x < u64::MAX as f64).then_some(x as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/wrk")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn units() {
        assert_eq!(parse_time_ms("170.90us"), Some(0.1709));
        assert_eq!(parse_time_ms("2.68ms"), Some(2.68));
        assert_eq!(parse_time_ms("1.03s"), Some(1030.0));
        assert_eq!(parse_time_ms("1.00m"), Some(60_000.0));
        assert_eq!(parse_time_ms("2"), Some(2000.0));
        assert_eq!(parse_time_ms("-nan"), None);
        assert_eq!(parse_time_ms("3.0xs"), None);
        assert_eq!(parse_time_ms(""), None);
        assert_eq!(parse_bytes("15.47KB"), Some(15.47 * 1024.0));
        assert_eq!(parse_bytes("1.93GB"), Some(1.93 * 1024.0 * 1024.0 * 1024.0));
        assert_eq!(parse_bytes("512.00B"), Some(512.0));
        assert_eq!(parse_bytes("1.0XB"), None);
        assert_eq!(parse_count("16.15k"), Some(16_150));
        assert_eq!(parse_count("2.5M"), Some(2_500_000));
        assert_eq!(parse_count("72"), Some(72));
        assert_eq!(parse_count("7q"), None);
        assert_eq!(parse_count("inf"), None);
        assert_eq!(whole_secs(Duration::from_millis(500)), 1);
        assert_eq!(whole_secs(Duration::from_millis(2001)), 3);
        assert_eq!(whole_secs(Duration::from_secs(2)), 2);
        assert_eq!(whole_secs(Duration::ZERO), 1);
    }

    #[test]
    fn normal_run() {
        let o = parse_wrk_output(&fixture("normal.txt")).unwrap();
        assert_eq!((o.threads, o.connections, o.requests), (1, 20, 32409));
        assert!(close(o.duration_secs, 2.04));
        assert_eq!(o.bytes, (36.01f64 * 1024.0 * 1024.0).round() as u64);
        assert!(close(o.requests_per_sec, 15884.28));
        assert!(close(o.avg_ms, 2.68) && close(o.stdev_ms, 8.27) && close(o.max_ms, 90.92));
        assert_eq!(
            (o.p50_ms, o.p75_ms, o.p90_ms, o.p99_ms),
            (0.99, 1.69, 4.00, 53.07)
        );
        assert_eq!(o.non_2xx_3xx, 0);
        assert_eq!(o.errors, ErrorCounts::default());
        let cfg = LoadConfig {
            url: "http://127.0.0.1:18931/?length=1024".into(),
            connections: 20,
            ..LoadConfig::default()
        };
        let r = o.to_report(&cfg);
        assert!(r.all_ok());
        assert_eq!(r.requests, 32409);
        assert_eq!(r.latency_ms.p50, 0.99);
        assert!(close(r.mbps, 17.65 * 1024.0 * 1024.0 * 8.0 / 1e6));
        let s = super::super::model::Sample::new(&r, None);
        assert!(!s.has_errors());
        assert_eq!(s.rps, 15884.28);
    }

    #[test]
    fn errors_run() {
        let o = parse_wrk_output(&fixture("errors.txt")).unwrap();
        assert_eq!(o.requests, 72);
        assert_eq!(o.non_2xx_3xx, 72);
        assert_eq!(
            o.errors,
            ErrorCounts {
                timeout: 21,
                ..ErrorCounts::default()
            }
        );
        assert!(close(o.avg_ms, 520.40) && close(o.p99_ms, 961.20));
        assert_eq!(o.bytes, (15.47f64 * 1024.0).round() as u64);
        let r = o.to_report(&LoadConfig::default());
        assert!(!r.all_ok());
        assert_eq!((r.ok, r.status.other, r.errors.total()), (0, 72, 21));
        let s = super::super::model::Sample::new(&r, None);
        assert!(s.has_errors());
        assert_eq!((s.non_2xx, s.socket_errors), (72, 21));
    }

    #[test]
    fn seconds_and_megabytes() {
        let o = parse_wrk_output(&fixture("units_s_mb.txt")).unwrap();
        assert_eq!((o.threads, o.connections, o.requests), (2, 8, 33));
        assert!(close(o.max_ms, 1180.0));
        assert!(close(o.p90_ms, 1030.0) && close(o.p99_ms, 1180.0));
        assert!(close(o.p50_ms, 632.70));
        assert!(close(o.transfer_bytes_per_sec, 41.83 * 1024.0 * 1024.0));
    }

    #[test]
    fn microseconds() {
        let o = parse_wrk_output(&fixture("units_us.txt")).unwrap();
        assert!(close(o.avg_ms, 0.1709) && close(o.stdev_ms, 0.54249));
        assert!(close(o.p50_ms, 0.067) && close(o.p90_ms, 0.099) && close(o.p99_ms, 3.16));
        assert_eq!(o.requests, 26814);
    }

    #[test]
    fn gigabytes() {
        let o = parse_wrk_output(&fixture("units_gb.txt")).unwrap();
        assert_eq!(o.bytes, (7.78f64 * 1024.0 * 1024.0 * 1024.0).round() as u64);
        assert!(close(
            o.transfer_bytes_per_sec,
            1.93 * 1024.0 * 1024.0 * 1024.0
        ));
        assert!(close(o.requests_per_sec, 259.48));
    }

    #[test]
    fn odd_output_is_an_error_not_a_panic() {
        let normal = fixture("normal.txt");
        for (text, expect) in [
            ("", "no `N requests in"),
            (
                "unable to connect to 127.0.0.1:1 Connection refused",
                "no `N requests in",
            ),
            (
                &normal.replace("Requests/sec:  15884.28", "Requests/sec: lots"),
                "bad Requests/sec",
            ),
            (&normal.replace("0.99ms", "-nan"), "bad percentile"),
            (
                &normal.replace("     99%   53.07ms\n", ""),
                "Latency Distribution",
            ),
            (
                &normal.replace("2.04s, 36.01MB", "2.04s 36.01MB"),
                "TIME, BYTES",
            ),
            (&normal.replace("36.01MB", "36.01XB"), "bad bytes"),
            (
                &normal.replace(
                    "Requests/sec:",
                    "  Socket errors: connect 0, read 1, write x, timeout 0\nRequests/sec:",
                ),
                "socket error count",
            ),
            (
                &normal.replace("Requests/sec:", "  Socket errors: boom\nRequests/sec:"),
                "socket errors",
            ),
            (
                &normal.replace("Latency     2.68ms    8.27ms  90.92ms", "Latency 1"),
                "avg",
            ),
        ] {
            let err = parse_wrk_output(text).unwrap_err();
            assert!(err.contains(expect), "{expect:?} not in {err:?}");
        }
        // Truncated at every byte: never a panic.
        for i in 0..normal.len() {
            if normal.is_char_boundary(i) {
                let _ = parse_wrk_output(&normal[..i]);
            }
        }
    }

    #[test]
    fn zero_requests_need_no_latency() {
        let text = "Running 1s test @ http://x/\n  1 threads and 1 connections\n  0 requests in 1.00s, 0.00B read\n  Socket errors: connect 1, read 0, write 0, timeout 0\nRequests/sec:      0.00\nTransfer/sec:       0.00B\n";
        let o = parse_wrk_output(text).unwrap();
        assert_eq!((o.requests, o.errors.connect), (0, 1));
    }

    #[test]
    fn command_line() {
        let cfg = LoadConfig {
            url: "http://127.0.0.1:1/?length=1024".into(),
            connections: 3,
            threads: 8,
            duration: Duration::from_millis(1500),
            timeout: Duration::from_millis(200),
            churn: true,
            ..LoadConfig::default()
        };
        assert_eq!(
            wrk_args(&cfg, 2).unwrap(),
            [
                "-t3",
                "-c3",
                "-d2s",
                "--latency",
                "--timeout",
                "1s",
                "-H",
                "Connection: close",
                "http://127.0.0.1:1/?length=1024"
            ]
        );
        let open = LoadConfig {
            rate: Some(100),
            ..cfg
        };
        assert!(wrk_args(&open, 1).unwrap_err().contains("closed loop"));
    }
}
