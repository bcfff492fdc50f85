//! `keymaster bench`: the whole bake-off as one command.
//!
//! Starts the stub origin, keymaster and every peer it finds (nginx, HAProxy, `--peer`), warms
//! each up, runs the scenarios' connection steps against each with the in-process load
//! generator ([`crate::load`]), reads the system under test's CPU, context switches and RSS from
//! `/proc` ([`procfs`]) around every measured window, and writes `report.md`, SVG charts and
//! `results.json` ([`report`]). See `docs/benchmarking.md` for the method.
//!
//! A run, in order ([`run_bench`]): `plan` (check the arguments, make the results
//! directory, pin the generator, raise the open-files limit) → `start_stub` → `measure`
//! (for each repeat and system: its `parity` settings, `start_system`, `warm_up`,
//! `run_steps`, each step a `step::run_step`) → `assemble` → [`report::write_results`] →
//! `finish`. The command line is [`BenchArgs`].

mod args;
mod compare;
mod machine;
pub mod model;
pub mod procfs;
pub mod report;
mod scenarios;
mod step;
pub mod svg;
pub mod systems;
pub mod wrk;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, SystemTime};

use crate::load::LoadConfig;
use model::{BenchRun, Sample, ScenarioResult, Settings, StepResult, SystemInfo};
use step::{drive, run_step, Step};
use systems::{CpuSet, Parity, Proc, SystemKind, SystemSpec};

pub use args::{BenchArgs, Driver, PeerHeaders};
pub use compare::{comparison_markdown, DriverComparison, AGREEMENT};
use machine::machine;
pub use machine::timestamp;
pub use scenarios::{scenarios, Scenario, PRESET_2013, SCENARIOS};

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

impl Timings {
    fn of(args: &BenchArgs) -> Timings {
        let pick = |set: Option<Duration>, quick: Duration, full: Duration| {
            set.unwrap_or(if args.quick { quick } else { full })
        };
        Timings {
            step: pick(
                args.duration,
                Duration::from_secs(2),
                Duration::from_secs(10),
            ),
            settle: pick(
                args.settle,
                Duration::from_millis(500),
                Duration::from_secs(2),
            ),
            warmup: pick(args.warmup, Duration::from_secs(1), Duration::from_secs(10)),
        }
    }
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

/// Everything a run settles before it starts anything.
struct Plan {
    scenarios: Vec<Scenario>,
    timings: Timings,
    driver_note: String,
    started: SystemTime,
    /// The results directory, absolute (peers run with their work directory as cwd and get
    /// these paths in their generated configs).
    out: PathBuf,
    logs: PathBuf,
    cpus: usize,
    /// With `--pin`: the system under test's CPUs, and the stub's and generator's.
    sut_cpus: Option<CpuSet>,
    load_cpus: Option<CpuSet>,
    gen_threads: usize,
    /// The open-files limit in force (raised to the hard limit).
    nofile: u64,
}

/// What the systems' steps measured.
#[derive(Default)]
struct Measured {
    /// Per (scenario index, system, connections): one sample per repeat.
    samples: BTreeMap<(usize, String, usize), Vec<Sample>>,
    /// Per system: whether it ran, and its config.
    status: BTreeMap<String, SystemInfo>,
    comparisons: Vec<DriverComparison>,
}

/// Runs the bench and writes the results directory; returns the run.
pub fn run_bench(args: &BenchArgs) -> Result<BenchRun, String> {
    let plan = plan(args)?;
    let (specs, infos) = discover_systems(args)?;
    for info in &infos {
        progress(&format!("{}: {}", info.name, info.status));
    }
    let (stub, stub_addr) = start_stub(&plan)?;
    let mut measured = measure(args, &plan, &specs, stub_addr)?;
    drop(stub);
    let comparisons = std::mem::take(&mut measured.comparisons);
    let run = assemble(args, &plan, &specs, infos, measured);
    report::write_results(&run, &plan.out)?;
    finish(args, &run, &plan.out, &comparisons)?;
    Ok(run)
}

/// Checks the arguments, makes the results directory, pins this process (the generator) and
/// raises its open-files limit.
fn plan(args: &BenchArgs) -> Result<Plan, String> {
    let scenarios = scenarios(args)?;
    if args.repeats == 0 {
        return Err("--repeats must be at least 1".into());
    }
    if args.workers == 0 {
        return Err("--workers must be at least 1".into());
    }
    let driver_note = driver_note(args)?;
    let started = SystemTime::now();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("bench-results").join(timestamp(started, true)));
    std::fs::create_dir_all(out.join("logs")).map_err(|e| format!("{}: {e}", out.display()))?;
    let out = std::fs::canonicalize(&out).map_err(|e| format!("{}: {e}", out.display()))?;
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
    let gen_threads = match args.threads {
        0 => load_cpus.as_ref().map_or(cpus, |c| c.0.len()),
        n => n,
    };
    let nofile = systems::raise_nofile_limit();
    if let Some(set) = &load_cpus {
        // Before any thread exists: every generator thread inherits this affinity.
        systems::pin_current_thread(set).map_err(|e| format!("pinning the generator: {e}"))?;
    }
    Ok(Plan {
        scenarios,
        timings: Timings::of(args),
        driver_note,
        started,
        logs: out.join("logs"),
        out,
        cpus,
        sut_cpus,
        load_cpus,
        gen_threads,
        nofile,
    })
}

/// The stub origin, on the generator's CPUs with a worker for each.
fn start_stub(plan: &Plan) -> Result<(Proc, SocketAddr), String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this binary: {e}"))?;
    let addr = systems::free_addr().map_err(|e| format!("stub port: {e}"))?;
    let workers = plan.load_cpus.as_ref().map_or(plan.cpus, |c| c.0.len());
    let mut cmd = Command::new(&exe);
    cmd.arg("stub")
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--workers")
        .arg(workers.to_string());
    let log = plan.logs.join("stub.log");
    let mut stub = Proc::spawn("stub", cmd, &log, plan.load_cpus.as_ref())?;
    stub.wait_ready(addr, Duration::from_secs(10))?;
    progress(&format!("stub origin on {addr} (pid {})", stub.pid()));
    Ok((stub, addr))
}

/// Every repeat: each system started in turn, warmed up, and run through every step.
fn measure(
    args: &BenchArgs,
    plan: &Plan,
    specs: &[SystemSpec],
    stub_addr: SocketAddr,
) -> Result<Measured, String> {
    // One certificate for every system (TLS scenarios only).
    let cert = if plan.scenarios.iter().any(|s| s.tls) {
        let dir = plan.out.join("work").join("tls");
        Some(crate::load::tls::make_bench_cert(&dir)?)
    } else {
        None
    };
    let mut m = Measured::default();
    for spec in specs {
        let info = SystemInfo {
            name: spec.name.clone(),
            version: systems::version_of(&spec.kind),
            status: "ran".into(),
            config: None,
        };
        m.status.insert(spec.name.clone(), info);
    }
    for repeat in 0..args.repeats {
        for spec in specs {
            if m.status[&spec.name].status != "ran" {
                continue;
            }
            let parity = parity(args, plan, spec, stub_addr, cert.as_ref())?;
            let (target, proc) =
                match start_system(spec, &parity, &plan.logs, plan.sut_cpus.as_ref()) {
                    Ok(x) => x,
                    Err(e) => {
                        progress(&format!("{}: failed: {e}", spec.name));
                        if let Some(i) = m.status.get_mut(&spec.name) {
                            i.status = format!("failed: {e}");
                        }
                        continue;
                    }
                };
            if repeat == 0 {
                if let Some(i) = m.status.get_mut(&spec.name) {
                    i.config = config_text(&spec.kind, &parity);
                }
            }
            let system = System {
                spec,
                target: target.unwrap_or(stub_addr),
                tls_target: parity.tls_listen(&spec.kind),
                h2_target: parity.h2_listen(&spec.kind),
                pid: proc.as_ref().map(Proc::pid),
                tls_ca: cert.as_ref().map(|c| c.ca.clone()),
            };
            warm_up(args, plan, &system, repeat)?;
            run_steps(args, plan, &system, &mut m)?;
            drop(proc);
        }
    }
    Ok(m)
}

/// The settings every system under test gets alike, with fresh ports.
fn parity(
    args: &BenchArgs,
    plan: &Plan,
    spec: &SystemSpec,
    stub_addr: SocketAddr,
    cert: Option<&crate::load::tls::BenchCert>,
) -> Result<Parity, String> {
    let port = || systems::free_addr().map_err(|e| format!("port: {e}"));
    Ok(Parity {
        header_duties: args.peer_headers == PeerHeaders::Duties,
        listen: port()?,
        origin: stub_addr,
        workers: args.workers,
        work_dir: plan.out.join("work").join(&spec.name),
        max_conns: ((plan.nofile.saturating_sub(200)) / 2).clamp(256, 40_000) as usize,
        h2: if plan.scenarios.iter().any(|s| s.h2) {
            Some(port()?)
        } else {
            None
        },
        tls: match cert {
            Some(c) => Some((port()?, c.clone())),
            None => None,
        },
    })
}

/// A started system under test: where each scenario's load goes.
struct System<'a> {
    spec: &'a SystemSpec,
    /// Its cleartext listener (the stub's address for `direct`).
    target: SocketAddr,
    tls_target: Option<SocketAddr>,
    h2_target: Option<SocketAddr>,
    /// Its process, whose `/proc` figures are read (none for `direct`).
    pid: Option<u32>,
    tls_ca: Option<PathBuf>,
}

/// Keep-alive, no delay, enough connections to open pools and touch pages.
fn warm_up(
    args: &BenchArgs,
    plan: &Plan,
    system: &System<'_>,
    repeat: usize,
) -> Result<(), String> {
    let warm = drive(
        args.driver,
        plan.load_cpus.as_ref(),
        &LoadConfig {
            url: format!("http://{}/?length=1024", system.target),
            connections: 64,
            duration: plan.timings.warmup,
            threads: plan.gen_threads,
            timeout: args.timeout,
            ..LoadConfig::default()
        },
    )?;
    progress(&format!(
        "[repeat {}/{}] {} on {}: warm-up {:.0} req/s{}",
        repeat + 1,
        args.repeats,
        system.spec.name,
        system.target,
        warm.requests_per_sec,
        if warm.all_ok() { "" } else { " (with errors!)" }
    ));
    Ok(())
}

/// Every scenario's steps against one started system (with `--compare-drivers`, each again
/// with the other driver).
fn run_steps(
    args: &BenchArgs,
    plan: &Plan,
    system: &System<'_>,
    m: &mut Measured,
) -> Result<(), String> {
    let total: usize = plan.scenarios.iter().map(|s| s.connections.len()).sum();
    let name = &system.spec.name;
    let mut done = 0;
    for (si, sc) in plan.scenarios.iter().enumerate() {
        for &conns in &sc.connections {
            done += 1;
            let target = match (sc.tls, system.tls_target, sc.h2, system.h2_target) {
                (true, Some(t), ..) => t,
                (true, None, ..) => continue, // direct and --peer systems have no TLS
                (false, _, true, Some(t)) => t,
                (false, _, true, None) => continue, // --peer: no known h2c listener
                (false, _, false, _) => system.target,
            };
            let step = Step {
                tls_ca: system.tls_ca.clone(),
                target,
                pid: system.pid,
                timings: plan.timings,
                threads: plan.gen_threads,
                load_cpus: plan.load_cpus.as_ref(),
            };
            let (load, figures) = run_step(sc, conns, args, args.driver, &step)?;
            let sample = Sample::new(&load, figures);
            let n = format!("{done}/{total}");
            progress(&progress_line(&n, sc.name, name, conns, &sample));
            if args.compare_drivers && !sc.tls && !sc.h2 {
                let (second, _) = run_step(sc, conns, args, args.driver.other(), &step)?;
                let (builtin, wrk) = match args.driver {
                    Driver::Builtin => (&load, &second),
                    Driver::Wrk => (&second, &load),
                };
                let row = DriverComparison::new(sc.name, name, conns, builtin, wrk);
                progress(&row.line());
                m.comparisons.push(row);
            }
            let key = (si, name.clone(), conns);
            m.samples.entry(key).or_default().push(sample);
        }
    }
    Ok(())
}

/// The run as `results.json` has it: systems in run order, then the skipped ones; each
/// scenario's steps by connections, then systems in run order.
fn assemble(
    args: &BenchArgs,
    plan: &Plan,
    specs: &[SystemSpec],
    mut skipped: Vec<SystemInfo>,
    mut m: Measured,
) -> BenchRun {
    let mut systems: Vec<SystemInfo> = specs
        .iter()
        .filter_map(|s| m.status.remove(&s.name))
        .collect();
    systems.append(&mut skipped);
    let order: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    let scenarios = plan
        .scenarios
        .iter()
        .enumerate()
        .map(|(si, sc)| {
            let mut steps = Vec::new();
            for &conns in &sc.connections {
                for name in &order {
                    if let Some(v) = m.samples.remove(&(si, (*name).to_owned(), conns)) {
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
    let t = plan.timings;
    BenchRun {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        started_utc: timestamp(plan.started, false),
        machine: machine(plan.cpus),
        note: args.note.clone(),
        settings: Settings {
            quick: args.quick,
            repeats: args.repeats,
            step_secs: t.step.as_secs_f64(),
            settle_secs: t.settle.as_secs_f64(),
            warmup_secs: t.warmup.as_secs_f64(),
            workers: args.workers,
            sut_cpus: plan.sut_cpus.as_ref().map(CpuSet::describe),
            load_cpus: plan.load_cpus.as_ref().map(CpuSet::describe),
            generator_threads: plan.gen_threads,
            rate: args.rate,
            nofile: plan.nofile,
            driver: plan.driver_note.clone(),
            peer_headers: match args.peer_headers {
                PeerHeaders::Duties => "duties: as keymaster's defaults (Host kept, X-Forwarded-For/-Proto/-Host, Via both ways, a request id to the origin and back)",
                PeerHeaders::Minimal => "minimal: plain proxying (keymaster still does its header duties)",
            }
            .to_owned(),
        },
        systems,
        scenarios,
    }
}

/// After the results are written: the driver comparison (`drivers.md`), and where it all is.
fn finish(
    args: &BenchArgs,
    run: &BenchRun,
    out: &std::path::Path,
    comparisons: &[DriverComparison],
) -> Result<(), String> {
    if args.compare_drivers {
        let md = comparison_markdown(comparisons);
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
    Ok(())
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
