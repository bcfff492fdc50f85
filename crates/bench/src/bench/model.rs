//! The recorded result of a bench run: what `results.json` holds and what the report and the
//! charts are drawn from.

use serde::Serialize;

use crate::load::LoadReport;

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRun {
    /// keymaster version that ran the bench.
    pub version: String,
    /// Start time, UTC, `YYYY-MM-DDTHH:MM:SSZ`.
    pub started_utc: String,
    /// The machine.
    pub machine: Machine,
    /// Free text for the report header (`--note`).
    pub note: Option<String>,
    /// How the run was set up.
    pub settings: Settings,
    /// Systems run or skipped, in run order.
    pub systems: Vec<SystemInfo>,
    /// One entry per scenario, in run order.
    pub scenarios: Vec<ScenarioResult>,
}

/// The machine the run was on.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Machine {
    /// CPUs available to the bench.
    pub cpus: usize,
    /// `model name` from `/proc/cpuinfo`.
    pub cpu_model: String,
    /// Kernel release.
    pub kernel: String,
}

/// The run's settings.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Settings {
    /// `--quick`.
    pub quick: bool,
    /// Repeats of every step (each a full pass over all systems).
    pub repeats: usize,
    /// Measured seconds per step.
    pub step_secs: f64,
    /// Unmeasured seconds at the start of each step (connections open, caches settle).
    pub settle_secs: f64,
    /// Warm-up seconds per system start.
    pub warmup_secs: f64,
    /// Worker processes/threads of every system under test.
    pub workers: usize,
    /// CPUs of the system under test when pinned.
    pub sut_cpus: Option<String>,
    /// CPUs of the stub and the load generator when pinned.
    pub load_cpus: Option<String>,
    /// Load generator threads.
    pub generator_threads: usize,
    /// Open-loop rate (requests per second) if set; closed loop otherwise.
    pub rate: Option<u64>,
    /// Open-files limit in force.
    pub nofile: u64,
    /// Load driver: `builtin` or `wrk` (with wrk's version), plus a note under
    /// `--compare-drivers`. Empty in runs recorded before the flag existed.
    pub driver: String,
    /// What nginx and HAProxy did to headers (`--peer-headers`); empty in runs recorded
    /// before the flag existed (plain proxying).
    pub peer_headers: String,
}

/// A system and whether it ran.
#[derive(Debug, Clone, Serialize)]
pub struct SystemInfo {
    /// Name in tables and charts.
    pub name: String,
    /// Version line, if known.
    pub version: Option<String>,
    /// `"ran"` or `"skipped: why"` / `"failed: why"`.
    pub status: String,
    /// Generated config (nginx, HAProxy) or command line.
    pub config: Option<String>,
}

/// One scenario's results.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    /// Short name (`ramp`, `saturation`, `gzip`, `churn`).
    pub name: String,
    /// One-line description for the report.
    pub title: String,
    /// Request path and query sent to every system.
    pub path: String,
    /// New connection per request.
    pub churn: bool,
    /// Rows: every system at every step.
    pub steps: Vec<StepResult>,
}

/// One system at one step: every repeat, their per-column median and the spread.
#[derive(Debug, Clone, Serialize)]
pub struct StepResult {
    /// System name.
    pub system: String,
    /// Concurrent connections.
    pub connections: usize,
    /// Per-column median over the repeats; errors are summed, never averaged.
    pub median: Sample,
    /// Smallest and largest requests/s over the repeats.
    pub rps_range: (f64, f64),
    /// Smallest and largest CPU ms per 1000 requests over the repeats.
    pub cpu_ms_per_1k_range: Option<(f64, f64)>,
    /// Whether any repeat saw a non-2xx response, a socket error or an unsent request.
    pub errors: bool,
    /// Every repeat.
    pub samples: Vec<Sample>,
}

/// One measurement of one system at one step.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Sample {
    /// Complete responses in the measured window.
    pub requests: u64,
    /// Requests per second.
    pub rps: f64,
    /// Mean latency, ms.
    pub avg_ms: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 75th percentile, ms.
    pub p75_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Largest latency, ms.
    pub max_ms: f64,
    /// CPU of the system under test (all processes and threads), percent of one CPU.
    pub cpu_pct: Option<f64>,
    /// CPU milliseconds of the system under test per 1000 requests.
    pub cpu_ms_per_1k: Option<f64>,
    /// The machine's 1-minute load average at the end of the step (the 2013 table's LdAvg:
    /// everything on the machine, the load generator and stub included).
    pub load_avg: Option<f64>,
    /// Context switches (voluntary + involuntary, all threads) per request.
    pub ctx_per_req: Option<f64>,
    /// RSS of the system under test at the end of the step, MiB.
    pub rss_mib: Option<f64>,
    /// Read throughput at the client, megabits per second.
    pub mbps: f64,
    /// Responses that were not 2xx.
    pub non_2xx: u64,
    /// Requests without a valid response (connect, read, write, timeout, parse).
    pub socket_errors: u64,
    /// Open loop: requests due but never sent.
    pub unsent: u64,
    /// Load generator CPU, percent of one CPU (warm-up included).
    pub generator_cpu_pct: f64,
    /// Pinned runs: how busy the stub and generator's CPUs were over the measured window
    /// (everything on them, kernel work included), percent. Near 100 the rig, not the
    /// system under test, may have set the latency.
    pub rig_cpu_pct: Option<f64>,
}

/// What `/proc` said about the system under test over one step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcFigures {
    /// CPU seconds.
    pub cpu_secs: f64,
    /// Context switches.
    pub switches: u64,
    /// Wall seconds between the two readings.
    pub wall_secs: f64,
    /// RSS at the end, KiB.
    pub rss_kib: u64,
    /// Busy percent of the stub and generator's CPUs over the same window (pinned runs).
    pub rig_busy_pct: Option<f64>,
    /// The machine's 1-minute load average at the end.
    pub load_avg: Option<f64>,
}

impl Sample {
    /// Builds a sample from the load report and, for a proxied system, its `/proc` figures.
    pub fn new(load: &LoadReport, procs: Option<ProcFigures>) -> Sample {
        let l = &load.latency_ms;
        let per_req = |x: f64| {
            if load.requests > 0 {
                Some(x / load.requests as f64)
            } else {
                None
            }
        };
        let gen_wall = load.duration_secs + load.warmup_secs;
        Sample {
            requests: load.requests,
            rps: load.requests_per_sec,
            avg_ms: l.mean,
            p50_ms: l.p50,
            p75_ms: l.p75,
            p90_ms: l.p90,
            p99_ms: l.p99,
            max_ms: l.max,
            cpu_pct: procs
                .filter(|p| p.wall_secs > 0.0)
                .map(|p| 100.0 * p.cpu_secs / p.wall_secs),
            cpu_ms_per_1k: procs.and_then(|p| per_req(p.cpu_secs * 1e6)),
            load_avg: procs.and_then(|p| p.load_avg),
            ctx_per_req: procs.and_then(|p| per_req(p.switches as f64)),
            rss_mib: procs.map(|p| p.rss_kib as f64 / 1024.0),
            mbps: load.mbps,
            non_2xx: load.requests - load.status.s2xx,
            socket_errors: load.errors.total(),
            unsent: load.unsent,
            generator_cpu_pct: if gen_wall > 0.0 {
                100.0 * load.generator_cpu_secs / gen_wall
            } else {
                0.0
            },
            rig_cpu_pct: procs.and_then(|p| p.rig_busy_pct),
        }
    }

    /// Whether anything went wrong in this sample.
    pub fn has_errors(&self) -> bool {
        self.non_2xx + self.socket_errors + self.unsent > 0
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn median_opt(v: Vec<Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = v.into_iter().flatten().collect();
    (!v.is_empty()).then(|| median(v))
}

fn range(v: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    v.fold(None, |acc, x| match acc {
        None => Some((x, x)),
        Some((lo, hi)) => Some((lo.min(x), hi.max(x))),
    })
}

impl StepResult {
    /// Combines the repeats of one system at one step.
    pub fn from_samples(system: &str, connections: usize, samples: Vec<Sample>) -> StepResult {
        let col = |f: fn(&Sample) -> f64| median(samples.iter().map(f).collect());
        let col_opt = |f: fn(&Sample) -> Option<f64>| median_opt(samples.iter().map(f).collect());
        let median = Sample {
            requests: col(|s| s.requests as f64) as u64,
            rps: col(|s| s.rps),
            avg_ms: col(|s| s.avg_ms),
            p50_ms: col(|s| s.p50_ms),
            p75_ms: col(|s| s.p75_ms),
            p90_ms: col(|s| s.p90_ms),
            p99_ms: col(|s| s.p99_ms),
            max_ms: col(|s| s.max_ms),
            cpu_pct: col_opt(|s| s.cpu_pct),
            cpu_ms_per_1k: col_opt(|s| s.cpu_ms_per_1k),
            load_avg: col_opt(|s| s.load_avg),
            ctx_per_req: col_opt(|s| s.ctx_per_req),
            rss_mib: col_opt(|s| s.rss_mib),
            mbps: col(|s| s.mbps),
            // Errors are totals over the repeats: a bad repeat must show, not be averaged away.
            non_2xx: samples.iter().map(|s| s.non_2xx).sum(),
            socket_errors: samples.iter().map(|s| s.socket_errors).sum(),
            unsent: samples.iter().map(|s| s.unsent).sum(),
            generator_cpu_pct: col(|s| s.generator_cpu_pct),
            rig_cpu_pct: col_opt(|s| s.rig_cpu_pct),
        };
        StepResult {
            system: system.to_owned(),
            connections,
            rps_range: range(samples.iter().map(|s| s.rps)).unwrap_or((0.0, 0.0)),
            cpu_ms_per_1k_range: range(samples.iter().filter_map(|s| s.cpu_ms_per_1k)),
            errors: samples.iter().any(Sample::has_errors),
            median,
            samples,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(rps: f64, cpu: Option<f64>, non_2xx: u64) -> Sample {
        Sample {
            requests: (rps * 10.0) as u64,
            rps,
            cpu_ms_per_1k: cpu,
            non_2xx,
            ..Sample::default()
        }
    }

    #[test]
    fn medians_ranges_and_error_totals() {
        let s = StepResult::from_samples(
            "keymaster",
            100,
            vec![
                sample(1000.0, Some(50.0), 0),
                sample(3000.0, Some(40.0), 2),
                sample(2000.0, Some(45.0), 0),
            ],
        );
        assert_eq!(s.median.rps, 2000.0);
        assert_eq!(s.median.cpu_ms_per_1k, Some(45.0));
        assert_eq!(s.rps_range, (1000.0, 3000.0));
        assert_eq!(s.cpu_ms_per_1k_range, Some((40.0, 50.0)));
        assert_eq!(s.median.non_2xx, 2);
        assert!(s.errors);
        let d = StepResult::from_samples("direct", 100, vec![sample(1.0, None, 0)]);
        assert_eq!(d.median.cpu_ms_per_1k, None);
        assert_eq!(d.cpu_ms_per_1k_range, None);
        assert!(!d.errors);
        assert_eq!(median(vec![1.0, 2.0, 3.0, 4.0]), 2.5);
    }
}
