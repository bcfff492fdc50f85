//! One measured step: the load (the built-in generator or wrk) against one system, with
//! the system's `/proc` figures and the rig CPUs' busy time read at the start and the end of
//! the measured window.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::model::ProcFigures;
use super::systems::CpuSet;
use super::{procfs, wrk, BenchArgs, Driver, Scenario, Timings};
use crate::load::{run_load, LoadConfig, LoadReport};

/// Where and how one step runs.
pub(super) struct Step<'a> {
    pub(super) target: SocketAddr,
    /// The CA to trust for TLS scenarios.
    pub(super) tls_ca: Option<PathBuf>,
    pub(super) pid: Option<u32>,
    pub(super) timings: Timings,
    pub(super) threads: usize,
    pub(super) load_cpus: Option<&'a CpuSet>,
}

/// One load run with `driver` (`cpus`: where wrk is pinned; the built-in generator's threads
/// inherit the bench's own pinning).
pub(super) fn drive(
    driver: Driver,
    cpus: Option<&CpuSet>,
    cfg: &LoadConfig,
) -> Result<LoadReport, String> {
    match driver {
        Driver::Builtin => run_load(cfg),
        Driver::Wrk => wrk::run_wrk(cfg, cpus),
    }
}

/// Runs one step: the load, with `/proc` read at the start and the end of the measured window.
pub(super) fn run_step(
    sc: &Scenario,
    connections: usize,
    args: &BenchArgs,
    driver: Driver,
    step: &Step<'_>,
) -> Result<(LoadReport, Option<ProcFigures>), String> {
    let t = step.timings;
    // Opening N connections at once overflows listen queues (SYN cookies, retransmits after
    // 1 s and more) and would bill the set-up to the step: settle at least 1 ms per connection.
    let settle = t.settle.max(Duration::from_millis(connections as u64));
    // TLS and h2 steps always use the built-in generator: it fixes the cipher suite, the group and
    // no resumption for every system (wrk's OpenSSL would negotiate its own).
    let driver = if sc.tls || sc.h2 {
        Driver::Builtin
    } else {
        driver
    };
    let scheme = if sc.tls { "https" } else { "http" };
    let cfg = LoadConfig {
        url: format!("{scheme}://{}{}", step.target, sc.path),
        tls_ca: if sc.tls { step.tls_ca.clone() } else { None },
        h2: sc.h2,
        connections,
        duration: t.step,
        rate: args.rate,
        churn: sc.churn,
        threads: step.threads,
        warmup: settle,
        timeout: args.timeout,
        ..LoadConfig::default()
    };
    // The stub and generator's CPUs (pinned runs), read beside the system at both ends.
    let rig: Option<Vec<usize>> = step.load_cpus.map(|c| c.0.clone());
    if driver == Driver::Wrk {
        // A separate unmeasured wrk run settles the step (rounded up to whole seconds), then
        // /proc is read right before the measured wrk starts and right after it exits.
        let cpu_before = wrk::children_cpu_secs();
        let warm = wrk::warm_up(&cfg, step.load_cpus)?;
        let start = step
            .pid
            .map(|pid| (pid, Window::start(pid, rig.as_deref())));
        let mut load = wrk::measure(&cfg, step.load_cpus)?;
        let procs = start.map(|(pid, a)| a.end(pid, rig.as_deref()));
        load.warmup_secs = warm;
        load.generator_cpu_secs = wrk::children_cpu_secs() - cpu_before;
        return Ok((load, procs));
    }
    // run_load starts its schedule 20 ms after it is called, then settles for `warmup`; the
    // sampler reads /proc at the start and the end of the measured window from its own thread.
    let origin = Instant::now() + Duration::from_millis(20);
    let sampler = step.pid.map(|pid| {
        let (from, to) = (origin + settle, origin + settle + t.step);
        std::thread::spawn(move || {
            sleep_until(from);
            let a = Window::start(pid, rig.as_deref());
            sleep_until(to);
            a.end(pid, rig.as_deref())
        })
    });
    let load = run_load(&cfg)?;
    let figures = match sampler {
        Some(h) => Some(
            h.join()
                .map_err(|_| "the /proc sampler panicked".to_owned())?,
        ),
        None => None,
    };
    Ok((load, figures))
}

/// The start of a measured window: the system's `/proc` reading and, on pinned runs, the
/// rig CPUs' ticks.
struct Window {
    tree: procfs::TreeSample,
    at: Instant,
    rig: Option<(u64, u64)>,
}

impl Window {
    fn start(pid: u32, rig: Option<&[usize]>) -> Window {
        let (tree, at) = procfs::sample_tree(pid);
        Window {
            tree,
            at,
            rig: rig.and_then(procfs::cpu_ticks),
        }
    }

    /// The figures of the window from its start to now.
    fn end(self, pid: u32, rig: Option<&[usize]>) -> ProcFigures {
        let (b, at_b) = procfs::sample_tree(pid);
        let d = procfs::delta(&self.tree, &b, procfs::ticks_per_sec());
        let rig_b = rig.and_then(procfs::cpu_ticks);
        ProcFigures {
            cpu_secs: d.cpu_secs,
            switches: d.switches,
            wall_secs: (at_b - self.at).as_secs_f64(),
            rss_kib: b.rss_kib,
            rig_busy_pct: self
                .rig
                .zip(rig_b)
                .and_then(|(a, b)| procfs::busy_pct(a, b)),
            load_avg: procfs::load_avg(),
        }
    }
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}
