//! `keymaster bench`: the whole bake-off as one command.
//!
//! Starts the stub origin, keymaster and every peer it finds (nginx, HAProxy, `--peer`), warms
//! each up, runs the scenarios' connection steps against each with the in-process load
//! generator ([`crate::load`]), reads the system under test's CPU, context switches and RSS from
//! `/proc` ([`procfs`]) around every measured window, and writes `report.md`, SVG charts and
//! `results.json` ([`report`]). See `docs/benchmarking.md` for the method.

mod compare;
mod machine;
pub mod model;
pub mod procfs;
pub mod report;
mod scenarios;
pub mod svg;
pub mod systems;
pub mod wrk;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use crate::load::{parse_duration, run_load, LoadConfig, LoadReport};
use model::{BenchRun, ProcFigures, Sample, ScenarioResult, Settings, StepResult, SystemInfo};
use systems::{CpuSet, Parity, Proc, SystemKind, SystemSpec};

pub use compare::{comparison_markdown, DriverComparison, AGREEMENT};
use machine::machine;
pub use machine::timestamp;
pub use scenarios::{scenarios, Scenario, PRESET_2013, SCENARIOS};

/// What the peers (nginx, HAProxy) do to headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PeerHeaders {
    /// keymaster's default header duties.
    #[default]
    Duties,
    /// Plain proxying.
    Minimal,
}

/// Which program drives the load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Driver {
    /// The in-process generator ([`crate::load`]).
    #[default]
    Builtin,
    /// wrk as a child process ([`wrk`]); closed loop only.
    Wrk,
}

impl Driver {
    /// Name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Driver::Builtin => "builtin",
            Driver::Wrk => "wrk",
        }
    }

    /// The other driver.
    pub fn other(self) -> Driver {
        match self {
            Driver::Builtin => Driver::Wrk,
            Driver::Wrk => Driver::Builtin,
        }
    }
}

/// Arguments of `keymaster bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Scenarios to run (repeatable or comma-separated): ramp, saturation, gzip, churn.
    #[arg(long = "scenario", value_name = "NAME", value_delimiter = ',')]
    pub scenarios: Vec<String>,
    /// Ramp steps: `2013` = the seed's 700, 900, ... 1900, 2000 connections (1 KB, 50 ms).
    #[arg(long, value_name = "NAME")]
    pub preset: Option<String>,
    /// Ramp connection steps (comma-separated), overriding the default 100,200,400,800,1600.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub connections: Vec<usize>,
    /// Connections of the saturation step(s).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub saturation_connections: Vec<usize>,
    /// Connections of the churn step(s), overriding the default 16,64.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub churn_connections: Vec<usize>,
    /// Response body of every scenario but gzip (10 KB): bytes, or with a `KB` or `MB` suffix
    /// (powers of 1024), up to 64 MB.
    #[arg(long, value_name = "SIZE", default_value = "1KB", value_parser = scenarios::parse_body)]
    pub body: usize,
    /// Run only these systems (comma-separated): keymaster, nginx, haproxy, direct, peer names.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub only: Vec<String>,
    /// Peers to look for: `auto` (nginx and HAProxy if installed) or `none`.
    #[arg(long, value_name = "auto|none", default_value = "auto")]
    pub peers: String,
    /// What nginx and HAProxy do to headers: `duties` = keymaster's default header duties
    /// (Host kept, X-Forwarded-For/-Proto/-Host, Via both ways, a request id to the origin
    /// and back), so that every system does the same work and sends the stub and the
    /// generator the same bytes; `minimal` = plain proxying (the runs before 2026-11-25).
    #[arg(long, value_enum, value_name = "duties|minimal", default_value_t = PeerHeaders::Duties)]
    pub peer_headers: PeerHeaders,
    /// Another system: `NAME='command with {listen} {port} {origin} {workers}'` (repeatable).
    #[arg(long = "peer", value_name = "NAME=CMD")]
    pub extra_peers: Vec<String>,
    /// keymaster binary to test (default: this one).
    #[arg(long, value_name = "PATH")]
    pub keymaster: Option<PathBuf>,
    /// Workers of every system under test (threads for keymaster and HAProxy, processes for nginx).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub workers: usize,
    /// Pin the system under test to the first `workers` CPUs, the stub and generator to the rest.
    #[arg(long)]
    pub pin: bool,
    /// Measured time per step (default 10s; 2s with --quick).
    #[arg(short = 'd', long, value_name = "TIME", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Unmeasured time at the start of each step, at least 1 ms per connection (default 2s;
    /// 500ms with --quick).
    #[arg(long, value_name = "TIME", value_parser = parse_duration)]
    pub settle: Option<Duration>,
    /// Warm-up per system start (default 10s; 1s with --quick).
    #[arg(long, value_name = "TIME", value_parser = parse_duration)]
    pub warmup: Option<Duration>,
    /// Repeat every step N times (each repeat a full pass over the systems); report min/median/max.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub repeats: usize,
    /// Short steps and fewer of them: everything in under 3 minutes.
    #[arg(long)]
    pub quick: bool,
    /// Open loop at this rate (requests/s) instead of closed loop.
    #[arg(short = 'R', long, value_name = "REQ_PER_SEC")]
    pub rate: Option<u64>,
    /// Load generator threads (0 = the CPUs it may use).
    #[arg(short = 't', long, value_name = "T", default_value_t = 0)]
    pub threads: usize,
    /// Per-request timeout.
    #[arg(long, value_name = "TIME", default_value = "5s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Results directory (default bench-results/<UTC timestamp>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Note for the report header (e.g. "shared 2-core VM").
    #[arg(long, value_name = "TEXT")]
    pub note: Option<String>,
    /// Print results.json to stdout (progress still goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Load driver for every step: the built-in generator or wrk (must be on PATH).
    #[arg(long, value_enum, value_name = "builtin|wrk", default_value_t = Driver::Builtin)]
    pub driver: Driver,
    /// Also run every step with the other driver, right after, and compare requests/s and p50
    /// (flagged when they differ by more than 10%); writes drivers.md. Needs wrk.
    #[arg(long)]
    pub compare_drivers: bool,
}

/// The systems to run and the ones skipped (with why).
pub fn discover_systems(args: &BenchArgs) -> Result<(Vec<SystemSpec>, Vec<SystemInfo>), String> {
    let exe = match &args.keymaster {
        Some(p) => p.clone(),
        None => std::env::current_exe().map_err(|e| format!("finding this binary: {e}"))?,
    };
    let mut candidates: Vec<(String, Result<SystemKind, String>)> = vec![
        ("direct".into(), Ok(SystemKind::Direct)),
        ("keymaster".into(), Ok(SystemKind::Keymaster(exe))),
    ];
    match args.peers.as_str() {
        "auto" => {
            for (name, make) in [
                ("nginx", SystemKind::Nginx as fn(PathBuf) -> SystemKind),
                ("haproxy", SystemKind::Haproxy),
            ] {
                let kind = systems::find_program(name)
                    .map(make)
                    .ok_or_else(|| "not installed (not on PATH or in /usr/sbin)".to_owned());
                candidates.push((name.into(), kind));
            }
        }
        "none" => {}
        other => return Err(format!("--peers {other:?}: expected auto or none")),
    }
    for p in &args.extra_peers {
        let (name, cmd) = p
            .split_once('=')
            .ok_or_else(|| format!("--peer {p:?}: expected NAME='command'"))?;
        if !cmd.contains("{listen}") && !cmd.contains("{port}") {
            return Err(format!(
                "--peer {name}: the command needs {{listen}} or {{port}}"
            ));
        }
        candidates.push((
            name.trim().to_owned(),
            Ok(SystemKind::Custom(cmd.to_owned())),
        ));
    }
    for o in &args.only {
        if !candidates.iter().any(|(n, _)| n == o) {
            return Err(format!(
                "--only {o}: no such system (have {})",
                names(&candidates)
            ));
        }
    }
    let mut run = Vec::new();
    let mut skipped = Vec::new();
    for (name, kind) in candidates {
        if !args.only.is_empty() && !args.only.contains(&name) {
            continue;
        }
        match kind {
            Ok(kind) => run.push(SystemSpec { name, kind }),
            Err(why) => skipped.push(SystemInfo {
                name,
                version: None,
                status: format!("skipped: {why}"),
                config: None,
            }),
        }
    }
    Ok((run, skipped))
}

fn names(c: &[(String, Result<SystemKind, String>)]) -> String {
    c.iter()
        .map(|(n, _)| n.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Resolved timings.
#[derive(Debug, Clone, Copy)]
struct Timings {
    step: Duration,
    settle: Duration,
    warmup: Duration,
}

/// `keymaster bench`.
pub fn bench_main(args: BenchArgs) -> Result<(), String> {
    let run = run_bench(&args)?;
    if args.json {
        let json = serde_json::to_string_pretty(&run).map_err(|e| e.to_string())?;
        println!("{json}");
    }
    Ok(())
}

/// Runs the bench and writes the results directory; returns the run.
pub fn run_bench(args: &BenchArgs) -> Result<BenchRun, String> {
    let scenarios = scenarios(args)?;
    if args.repeats == 0 {
        return Err("--repeats must be at least 1".into());
    }
    if args.workers == 0 {
        return Err("--workers must be at least 1".into());
    }
    let t = Timings {
        step: args.duration.unwrap_or(if args.quick {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(10)
        }),
        settle: args.settle.unwrap_or(if args.quick {
            Duration::from_millis(500)
        } else {
            Duration::from_secs(2)
        }),
        warmup: args.warmup.unwrap_or(if args.quick {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(10)
        }),
    };
    let driver_note = driver_note(args)?;
    let started = SystemTime::now();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("bench-results").join(timestamp(started, true)));
    std::fs::create_dir_all(out.join("logs")).map_err(|e| format!("{}: {e}", out.display()))?;
    // Absolute from here on: peers run with their work directory as cwd and get these paths
    // in their generated configs.
    let out = std::fs::canonicalize(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let logs = out.join("logs");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (sut_cpus, load_cpus) = if args.pin {
        if args.workers >= cpus {
            return Err(format!(
                "--pin: {cpus} CPU(s) leave none for the stub and generator with --workers {}",
                args.workers
            ));
        }
        (
            Some(CpuSet((0..args.workers).collect())),
            Some(CpuSet((args.workers..cpus).collect())),
        )
    } else {
        (None, None)
    };
    let load_cpu_count = load_cpus.as_ref().map_or(cpus, |c| c.0.len());
    let gen_threads = if args.threads > 0 {
        args.threads
    } else {
        load_cpu_count
    };
    let nofile = systems::raise_nofile_limit();
    if let Some(set) = &load_cpus {
        // Before any thread exists: every generator thread inherits this affinity.
        systems::pin_current_thread(set).map_err(|e| format!("pinning the generator: {e}"))?;
    }
    let (specs, mut infos) = discover_systems(args)?;
    for info in &infos {
        progress(&format!("{}: {}", info.name, info.status));
    }

    // The stub origin.
    let exe = std::env::current_exe().map_err(|e| format!("finding this binary: {e}"))?;
    let stub_addr = systems::free_addr().map_err(|e| format!("stub port: {e}"))?;
    let mut stub_cmd = Command::new(&exe);
    stub_cmd
        .arg("stub")
        .arg("--listen")
        .arg(stub_addr.to_string())
        .arg("--workers")
        .arg(load_cpu_count.to_string());
    let mut stub = Proc::spawn("stub", stub_cmd, &logs.join("stub.log"), load_cpus.as_ref())?;
    stub.wait_ready(stub_addr, Duration::from_secs(10))?;
    progress(&format!("stub origin on {stub_addr} (pid {})", stub.pid()));

    let max_conns = ((nofile.saturating_sub(200)) / 2).clamp(256, 40_000) as usize;
    // One certificate for every system (TLS scenarios only).
    let cert = if scenarios.iter().any(|s| s.tls) {
        Some(crate::load::tls::make_bench_cert(
            &out.join("work").join("tls"),
        )?)
    } else {
        None
    };
    let mut samples: BTreeMap<(usize, String, usize), Vec<Sample>> = BTreeMap::new();
    let mut status: BTreeMap<String, SystemInfo> = BTreeMap::new();
    for spec in &specs {
        status.insert(
            spec.name.clone(),
            SystemInfo {
                name: spec.name.clone(),
                version: systems::version_of(&spec.kind),
                status: "ran".into(),
                config: None,
            },
        );
    }
    let total_steps: usize = scenarios.iter().map(|s| s.connections.len()).sum();
    let mut comparisons: Vec<DriverComparison> = Vec::new();
    for repeat in 0..args.repeats {
        for spec in &specs {
            if status[&spec.name].status != "ran" {
                continue;
            }
            let work_dir = out.join("work").join(&spec.name);
            let listen = systems::free_addr().map_err(|e| format!("port: {e}"))?;
            let parity = Parity {
                header_duties: args.peer_headers == PeerHeaders::Duties,
                listen,
                origin: stub_addr,
                workers: args.workers,
                work_dir: work_dir.clone(),
                max_conns,
                h2: if scenarios.iter().any(|s| s.h2) {
                    Some(systems::free_addr().map_err(|e| format!("port: {e}"))?)
                } else {
                    None
                },
                tls: match &cert {
                    Some(c) => Some((
                        systems::free_addr().map_err(|e| format!("port: {e}"))?,
                        c.clone(),
                    )),
                    None => None,
                },
            };
            let tls_target = parity.tls_listen(&spec.kind);
            let h2_target = parity.h2_listen(&spec.kind);
            let started_system = start_system(spec, &parity, &logs, sut_cpus.as_ref());
            let (target, proc) = match started_system {
                Ok(x) => x,
                Err(e) => {
                    progress(&format!("{}: failed: {e}", spec.name));
                    if let Some(i) = status.get_mut(&spec.name) {
                        i.status = format!("failed: {e}");
                    }
                    continue;
                }
            };
            if repeat == 0 {
                if let Some(i) = status.get_mut(&spec.name) {
                    i.config = config_text(&spec.kind, &parity);
                }
            }
            let target = target.unwrap_or(stub_addr);
            // Warm-up: keep-alive, no delay, enough connections to open pools and touch pages.
            let warm = drive(
                args.driver,
                load_cpus.as_ref(),
                &LoadConfig {
                    url: format!("http://{target}/?length=1024"),
                    connections: 64,
                    duration: t.warmup,
                    threads: gen_threads,
                    timeout: args.timeout,
                    ..LoadConfig::default()
                },
            )?;
            progress(&format!(
                "[repeat {}/{}] {} on {target}: warm-up {:.0} req/s{}",
                repeat + 1,
                args.repeats,
                spec.name,
                warm.requests_per_sec,
                if warm.all_ok() { "" } else { " (with errors!)" }
            ));
            let mut done = 0;
            for (si, sc) in scenarios.iter().enumerate() {
                for &conns in &sc.connections {
                    done += 1;
                    let target = match (sc.tls, tls_target, sc.h2, h2_target) {
                        (true, Some(t), ..) => t,
                        (true, None, ..) => continue, // direct and --peer systems have no TLS
                        (false, _, true, Some(t)) => t,
                        (false, _, true, None) => continue, // --peer: no known h2c listener
                        (false, _, false, _) => target,
                    };
                    let step = Step {
                        tls_ca: cert.as_ref().map(|c| c.ca.clone()),
                        target,
                        pid: proc.as_ref().map(Proc::pid),
                        timings: t,
                        threads: gen_threads,
                        load_cpus: load_cpus.as_ref(),
                    };
                    let (load, figures) = run_step(sc, conns, args, args.driver, &step)?;
                    let sample = Sample::new(&load, figures);
                    progress(&progress_line(
                        &format!("{}/{}", done, total_steps),
                        sc.name,
                        &spec.name,
                        conns,
                        &sample,
                    ));
                    if args.compare_drivers && !sc.tls && !sc.h2 {
                        let other = args.driver.other();
                        let (second, _) = run_step(sc, conns, args, other, &step)?;
                        let (builtin, wrk) = match args.driver {
                            Driver::Builtin => (&load, &second),
                            Driver::Wrk => (&second, &load),
                        };
                        let row = DriverComparison::new(sc.name, &spec.name, conns, builtin, wrk);
                        progress(&row.line());
                        comparisons.push(row);
                    }
                    samples
                        .entry((si, spec.name.clone(), conns))
                        .or_default()
                        .push(sample);
                }
            }
            drop(proc);
        }
    }
    drop(stub);

    // Systems in run order, then the skipped ones.
    let mut system_infos: Vec<SystemInfo> = specs
        .iter()
        .filter_map(|s| status.remove(&s.name))
        .collect();
    system_infos.append(&mut infos);
    let order: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    let scenario_results = scenarios
        .iter()
        .enumerate()
        .map(|(si, sc)| {
            let mut steps = Vec::new();
            for &conns in &sc.connections {
                for name in &order {
                    if let Some(v) = samples.remove(&(si, (*name).to_owned(), conns)) {
                        steps.push(StepResult::from_samples(name, conns, v));
                    }
                }
            }
            ScenarioResult {
                name: sc.name.to_owned(),
                title: sc.title.clone(),
                path: sc.path.clone(),
                churn: sc.churn,
                steps,
            }
        })
        .collect();
    let run = BenchRun {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        started_utc: timestamp(started, false),
        machine: machine(cpus),
        note: args.note.clone(),
        settings: Settings {
            quick: args.quick,
            repeats: args.repeats,
            step_secs: t.step.as_secs_f64(),
            settle_secs: t.settle.as_secs_f64(),
            warmup_secs: t.warmup.as_secs_f64(),
            workers: args.workers,
            sut_cpus: sut_cpus.map(|c| c.describe()),
            load_cpus: load_cpus.map(|c| c.describe()),
            generator_threads: gen_threads,
            rate: args.rate,
            nofile,
            driver: driver_note,
            peer_headers: match args.peer_headers {
                PeerHeaders::Duties => "duties: as keymaster's defaults (Host kept, X-Forwarded-For/-Proto/-Host, Via both ways, a request id to the origin and back)",
                PeerHeaders::Minimal => "minimal: plain proxying (keymaster still does its header duties)",
            }
            .to_owned(),
        },
        systems: system_infos,
        scenarios: scenario_results,
    };
    report::write_results(&run, &out)?;
    if args.compare_drivers {
        let md = comparison_markdown(&comparisons);
        let path = out.join("drivers.md");
        std::fs::write(&path, &md).map_err(|e| format!("{}: {e}", path.display()))?;
        eprint!("{md}");
        let off = comparisons.iter().filter(|c| c.disagree()).count();
        progress(&format!(
            "driver comparison in {}: {} of {} step(s) differ by more than {:.0}%",
            path.display(),
            off,
            comparisons.len(),
            AGREEMENT * 100.0
        ));
    }
    let flagged = run
        .scenarios
        .iter()
        .flat_map(|s| &s.steps)
        .filter(|s| s.errors)
        .count();
    progress(&format!(
        "results in {} (report.md, *.svg, results.json){}",
        out.display(),
        if flagged > 0 {
            format!("; {flagged} step(s) had errors, flagged in the report")
        } else {
            String::new()
        }
    ));
    if !args.json {
        println!("{}", out.join("report.md").display());
    }
    Ok(run)
}

/// Starts a system; returns its listen address (None for direct) and its process.
fn start_system(
    spec: &SystemSpec,
    parity: &Parity,
    logs: &std::path::Path,
    cpus: Option<&CpuSet>,
) -> Result<(Option<SocketAddr>, Option<Proc>), String> {
    let cmd = systems::command_for(&spec.kind, parity)
        .map_err(|e| format!("writing config into {}: {e}", parity.work_dir.display()))?;
    let Some(cmd) = cmd else {
        return Ok((None, None));
    };
    let log = logs.join(format!("{}.log", spec.name));
    let mut proc = Proc::spawn(&spec.name, cmd, &log, cpus)?;
    proc.wait_ready(parity.listen, Duration::from_secs(15))
        .map_err(|e| format!("{e} (see {})", log.display()))?;
    Ok((Some(parity.listen), Some(proc)))
}

fn config_text(kind: &SystemKind, p: &Parity) -> Option<String> {
    match kind {
        SystemKind::Nginx(_) => Some(systems::nginx_config(p)),
        SystemKind::Haproxy(_) => Some(systems::haproxy_config(p)),
        SystemKind::Keymaster(exe) => Some(format!(
            "{} proxy --listen {} --to {} --workers {}{}",
            exe.file_name()
                .map_or_else(|| "keymaster".into(), |n| n.to_string_lossy()),
            p.listen,
            p.origin,
            p.workers,
            match &p.tls {
                Some((addr, c)) => format!(
                    " --tls-listen {addr} --tls-cert {} --tls-key {}",
                    c.cert.display(),
                    c.key.display()
                ),
                None => String::new(),
            }
        )),
        SystemKind::Custom(t) => Some(systems::fill_template(t, p)),
        SystemKind::Direct => None,
    }
}

/// Where and how one step runs.
struct Step<'a> {
    target: SocketAddr,
    /// The CA to trust for TLS scenarios.
    tls_ca: Option<PathBuf>,
    pid: Option<u32>,
    timings: Timings,
    threads: usize,
    load_cpus: Option<&'a CpuSet>,
}

/// One load run with `driver` (`cpus`: where wrk is pinned; the built-in generator's threads
/// inherit the bench's own pinning).
fn drive(driver: Driver, cpus: Option<&CpuSet>, cfg: &LoadConfig) -> Result<LoadReport, String> {
    match driver {
        Driver::Builtin => run_load(cfg),
        Driver::Wrk => wrk::run_wrk(cfg, cpus),
    }
}

/// The report header's driver line; checks that wrk is there when it is needed.
fn driver_note(args: &BenchArgs) -> Result<String, String> {
    let needs_wrk = args.driver == Driver::Wrk || args.compare_drivers;
    if !needs_wrk {
        return Ok(Driver::Builtin.name().to_owned());
    }
    let path = wrk::require_wrk().map_err(|e| {
        if args.compare_drivers {
            e.replace("--driver wrk", "--compare-drivers")
        } else {
            e
        }
    })?;
    if args.rate.is_some() {
        return Err("wrk runs closed loop only: --rate cannot be used with --driver wrk or --compare-drivers".into());
    }
    let version = wrk::wrk_version(&path).unwrap_or_else(|| path.display().to_string());
    let mut note = match args.driver {
        Driver::Builtin => "builtin".to_owned(),
        Driver::Wrk => format!("wrk ({version}; durations rounded up to whole seconds)"),
    };
    if args.compare_drivers {
        note.push_str(&format!(
            "; every step also run with {} right after (--compare-drivers, {version}), see drivers.md",
            args.driver.other().name()
        ));
    }
    Ok(note)
}

/// Runs one step: the load, with `/proc` read at the start and the end of the measured window.
fn run_step(
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

/// One live progress line.
pub fn progress_line(n: &str, scenario: &str, system: &str, conns: usize, s: &Sample) -> String {
    let cpu = match (s.cpu_pct, s.cpu_ms_per_1k, s.ctx_per_req) {
        (Some(p), Some(c), Some(x)) => {
            format!("  cpu {p:5.1}%  {c:6.1} ms/1k req  ctx {x:5.2}/req")
        }
        _ => String::new(),
    };
    let errors = if s.has_errors() {
        format!(
            "  ERRORS: non-2xx {} socket {} unsent {}",
            s.non_2xx, s.socket_errors, s.unsent
        )
    } else {
        String::new()
    };
    let rig = s
        .rig_cpu_pct
        .map_or(String::new(), |r| format!("  rig {r:3.0}%"));
    format!(
        "[{n}] {scenario:<10} {system:<10} c={conns:<5} {:>8.0} req/s  p50 {:7.2}  p99 {:7.2} ms{cpu}  gen {:3.0}%{rig}{errors}",
        s.rps, s.p50_ms, s.p99_ms, s.generator_cpu_pct
    )
}

fn progress(line: &str) {
    eprintln!("bench: {line}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn parse(argv: &[&str]) -> BenchArgs {
        Cli::parse_from(std::iter::once("bench").chain(argv.iter().copied())).args
    }

    #[test]
    fn scenario_selection_and_presets() {
        let all = scenarios(&parse(&[])).unwrap();
        assert_eq!(all.iter().map(|s| s.name).collect::<Vec<_>>(), SCENARIOS);
        assert_eq!(all[0].connections, [100, 200, 400, 800, 1600]);
        assert_eq!(all[0].path, "/?length=1024&delay=50");
        let seed = scenarios(&parse(&["--preset", "2013", "--scenario", "ramp"])).unwrap();
        assert_eq!(seed.len(), 1);
        assert_eq!(seed[0].connections, PRESET_2013);
        let two = scenarios(&parse(&["--scenario", "saturation,churn", "--quick"])).unwrap();
        assert_eq!(
            two.iter().map(|s| s.name).collect::<Vec<_>>(),
            ["saturation", "churn"]
        );
        assert!(two[1].churn);
        assert!(scenarios(&parse(&["--scenario", "nope"])).is_err());
        assert!(scenarios(&parse(&["--preset", "1999"])).is_err());
        let custom = scenarios(&parse(&["--connections", "10,20"])).unwrap();
        assert_eq!(custom[0].connections, [10, 20]);
    }

    #[test]
    fn body_size_and_churn_steps() {
        let big = scenarios(&parse(&[
            "--body",
            "1MB",
            "--churn-connections",
            "256",
            "--scenario",
            "saturation,gzip,churn",
        ]))
        .unwrap();
        assert_eq!(big[0].path, "/?length=1048576");
        assert!(big[0].title.contains("1 MB body"), "{}", big[0].title);
        assert_eq!(big[1].path, "/?length=10240&gzip=1&dither=50");
        assert_eq!(
            (big[2].path.as_str(), &big[2].connections[..]),
            ("/?length=1048576", &[256][..])
        );
        for (text, bytes) in [
            ("1500", 1500),
            ("10KB", 10240),
            ("100k", 102_400),
            ("64 MB", 64 << 20),
        ] {
            assert_eq!(parse(&["--body", text]).body, bytes, "{text}");
        }
        for bad in ["0", "65MB", "1GB", "ten", "", "99999999999999999999"] {
            assert!(
                Cli::try_parse_from(["bench", "--body", bad]).is_err(),
                "{bad:?}"
            );
        }
        assert_eq!(scenarios::size_label(1500), "1500 B");
        assert_eq!(scenarios::size_label(100 << 10), "100 KB");
    }

    #[test]
    fn driver_flags() {
        let a = parse(&[]);
        assert_eq!((a.driver, a.compare_drivers), (Driver::Builtin, false));
        let a = parse(&["--driver", "wrk", "--compare-drivers"]);
        assert_eq!((a.driver, a.compare_drivers), (Driver::Wrk, true));
        assert_eq!(a.driver.other(), Driver::Builtin);
        assert!(Cli::try_parse_from(["bench", "--driver", "ab"]).is_err());
        assert_eq!(driver_note(&parse(&[])).unwrap(), "builtin");
        if wrk::find_wrk().is_some() {
            let e = driver_note(&parse(&["--driver", "wrk", "-R", "100"])).unwrap_err();
            assert!(e.contains("closed loop"), "{e}");
            assert!(driver_note(&parse(&["--driver", "wrk"]))
                .unwrap()
                .starts_with("wrk ("));
        } else {
            let e = driver_note(&parse(&["--driver", "wrk"])).unwrap_err();
            assert!(e.contains("wrk is not installed"), "{e}");
        }
    }

    #[test]
    fn system_selection() {
        let (run, skipped) = discover_systems(&parse(&["--peers", "none"])).unwrap();
        let names: Vec<_> = run.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["direct", "keymaster"]);
        assert!(skipped.is_empty());
        let (run, _) = discover_systems(&parse(&[
            "--peer",
            "envoy=envoy --listen {listen} --to {origin}",
            "--only",
            "keymaster,envoy",
        ]))
        .unwrap();
        let names: Vec<_> = run.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["keymaster", "envoy"]);
        assert!(discover_systems(&parse(&["--only", "tomcat"])).is_err());
        assert!(discover_systems(&parse(&["--peer", "x=no placeholders"])).is_err());
    }
}
