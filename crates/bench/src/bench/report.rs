//! `report.md`: the run laid out like the 2013 bake-off table (one table per scenario, rows =
//! step × system), a list of every step with errors, links to the charts, and the generated
//! peer configs. Also writes the charts and `results.json` into the results directory.

use std::fmt::Write;
use std::path::Path;

use super::model::{BenchRun, ScenarioResult, StepResult};
use super::svg;

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.digits$}"))
}

/// The errors cell: `0`, or a flag with the counts.
pub fn errors_cell(st: &StepResult) -> String {
    let m = &st.median;
    if !st.errors {
        return "0".to_owned();
    }
    let mut parts = Vec::new();
    if m.non_2xx > 0 {
        parts.push(format!("non-2xx {}", m.non_2xx));
    }
    if m.socket_errors > 0 {
        parts.push(format!("socket {}", m.socket_errors));
    }
    if m.unsent > 0 {
        parts.push(format!("unsent {}", m.unsent));
    }
    format!("⚠ **ERRORS** {}", parts.join(", "))
}

/// One table row.
pub fn row(st: &StepResult, repeats: usize) -> String {
    let m = &st.median;
    let mut r = format!(
        "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {:.1} | {:.0} |",
        st.system,
        st.connections,
        m.rps,
        m.avg_ms,
        m.p50_ms,
        m.p75_ms,
        m.p90_ms,
        m.p99_ms,
        m.max_ms,
        opt(m.cpu_pct, 1),
        opt(m.cpu_ms_per_1k, 1),
        opt(m.load_avg, 2),
        opt(m.ctx_per_req, 2),
        opt(m.rss_mib, 1),
        m.mbps,
        m.generator_cpu_pct,
    );
    if repeats > 1 {
        let (lo, hi) = st.rps_range;
        let cpu = st
            .cpu_ms_per_1k_range
            .map_or_else(|| "–".to_owned(), |(a, b)| format!("{a:.1}–{b:.1}"));
        let _ = write!(r, " {lo:.0}–{hi:.0} | {cpu} |");
    }
    let _ = write!(r, " {} |", errors_cell(st));
    r
}

/// The table of one scenario.
pub fn scenario_table(sc: &ScenarioResult, repeats: usize) -> String {
    let mut t = String::from(
        "| Run | Con. | Rq./s | Av./ms | TP50/ms | TP75/ms | TP90/ms | TP99/ms | Max/ms \
         | CPU/% | CPU ms/1k req | LdAvg | Ctx Sw./req | RSS/MiB | Mbps | Gen. CPU/% |",
    );
    let mut rule =
        String::from("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    if repeats > 1 {
        t.push_str(" Rq./s min–max | CPU ms/1k min–max |");
        rule.push_str("--:|--:|");
    }
    t.push_str(" Errors |\n");
    rule.push_str("---|\n");
    t.push_str(&rule);
    // Rows grouped by step, like the seed table (Tomcat 700, Netty 700, Tomcat 900, ...).
    let mut steps: Vec<&StepResult> = sc.steps.iter().collect();
    steps.sort_by_key(|s| s.connections);
    for st in steps {
        t.push_str(&row(st, repeats));
        t.push('\n');
    }
    t
}

/// Busy share of the stub and generator's CPUs from which a repeat counts as rig-bound. A
/// window's average: at 90% the rig's CPU spends long stretches saturated, and the latency
/// tails of those stretches are the rig's (docs/benchmarks.md, seventh session).
pub const RIG_BOUND_PCT: f64 = 90.0;

/// A note naming the steps in which the stub and generator's CPUs were at least
/// [`RIG_BOUND_PCT`] busy in some repeat (pinned runs): there the rig, not the system under
/// test, may have set the latency. Empty when there are none.
pub fn rig_bound_note(sc: &ScenarioResult) -> String {
    let hits: Vec<String> = sc
        .steps
        .iter()
        .filter_map(|st| {
            let busy: Vec<f64> = st
                .samples
                .iter()
                .filter_map(|s| s.rig_cpu_pct)
                .filter(|p| *p >= RIG_BOUND_PCT)
                .collect();
            (!busy.is_empty()).then(|| {
                format!(
                    "{} c={} ({} of {} repeats, up to {:.0}%)",
                    st.system,
                    st.connections,
                    busy.len(),
                    st.samples.len(),
                    busy.iter().copied().fold(0.0, f64::max)
                )
            })
        })
        .collect();
    if hits.is_empty() {
        return String::new();
    }
    format!(
        "Rig-bound: the stub and load generator's CPUs were at least {RIG_BOUND_PCT:.0}% busy \
         in {}. Latency there is partly the rig's.\n\n",
        hits.join(", ")
    )
}

/// The whole report.
pub fn report_markdown(run: &BenchRun) -> String {
    let mut md = String::new();
    let st = &run.settings;
    let _ = writeln!(md, "# keymaster bench — {}\n", run.started_utc);
    if let Some(note) = &run.note {
        let _ = writeln!(md, "> **{note}**\n");
    }
    let _ = writeln!(
        md,
        "- machine: {} CPUs ({}), kernel {}",
        run.machine.cpus, run.machine.cpu_model, run.machine.kernel
    );
    let _ = writeln!(md, "- keymaster {}", run.version);
    let pin = match (&st.sut_cpus, &st.load_cpus) {
        (Some(s), Some(l)) => {
            format!("system under test on CPU {s}, stub + load generator on CPU {l}")
        }
        _ => "not pinned (all processes share all CPUs)".to_owned(),
    };
    let _ = writeln!(md, "- pinning: {pin}");
    if !st.driver.is_empty() {
        let _ = writeln!(md, "- load driver: {}", st.driver);
    }
    if !st.peer_headers.is_empty() {
        let _ = writeln!(md, "- peers' header work: {}", st.peer_headers);
    }
    let mode = st.rate.map_or_else(
        || "closed loop (like wrk)".to_owned(),
        |r| format!("open loop at {r} req/s (like wrk2)"),
    );
    let _ = writeln!(
        md,
        "- load: {mode}, {} generator thread(s); each step {:.1}s measured after {:.1}s settling (at least 1 ms per connection); \
         {:.1}s warm-up per system start; {} repeat(s){}{}",
        st.generator_threads,
        st.step_secs,
        st.settle_secs,
        st.warmup_secs,
        st.repeats,
        if st.repeats > 1 {
            " (cells are medians; min–max columns show the spread)"
        } else {
            ""
        },
        if st.quick { "; `--quick`" } else { "" }
    );
    let _ = writeln!(
        md,
        "- parity: {} worker(s) everywhere, upstream keep-alive on, access logs off; open files limit {}\n",
        st.workers, st.nofile
    );
    md.push_str("| System | Version | Status |\n|---|---|---|\n");
    for s in &run.systems {
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            s.name,
            s.version.as_deref().unwrap_or("–"),
            s.status
        );
    }
    md.push('\n');

    let flagged: Vec<String> = run
        .scenarios
        .iter()
        .flat_map(|sc| {
            sc.steps.iter().filter(|s| s.errors).map(move |s| {
                format!(
                    "{} / {} / {} connections: {}",
                    sc.name,
                    s.system,
                    s.connections,
                    errors_cell(s)
                )
            })
        })
        .collect();
    if flagged.is_empty() {
        md.push_str("No step had errors (every response 2xx, no socket errors).\n\n");
    } else {
        md.push_str("## ⚠ Steps with errors\n\nThese rows are flagged in the tables and ringed in red in the charts; their figures are not comparable.\n\n");
        for f in flagged {
            let _ = writeln!(md, "- {f}");
        }
        md.push('\n');
    }

    md.push_str(
        "Columns as in the 2013 table: Rq./s and latencies (ms) at the client; CPU/% is the \
         system under test's CPU (all processes and threads, 100 = one CPU), CPU ms/1k req its \
         CPU time per 1000 requests (the primary figure on a shared machine), LdAvg the \
         machine's 1-minute load average at the end of the step (everything on it, the load \
         generator included), Ctx Sw./req its \
         voluntary + involuntary context switches per request, RSS at the end of the step; \
         Mbps is read at the client; Gen. CPU/% is the load generator's own CPU (near 100 × \
         threads means the client is the bottleneck). `direct` is the generator straight to the \
         stub: the limit of this setup.\n\n",
    );

    for sc in &run.scenarios {
        let _ = writeln!(md, "## {} — {}\n", sc.name, sc.title);
        let _ = writeln!(
            md,
            "`GET {}`{}\n",
            sc.path,
            if sc.churn {
                ", new connection per request"
            } else {
                ", keep-alive"
            }
        );
        md.push_str(&scenario_table(sc, run.settings.repeats));
        md.push('\n');
        md.push_str(&rig_bound_note(sc));
        for (file, _) in svg::scenario_charts(sc) {
            let _ = write!(md, "![{file}]({file}) ");
        }
        md.push_str("\n\n");
    }

    let configs: Vec<_> = run.systems.iter().filter(|s| s.config.is_some()).collect();
    if !configs.is_empty() {
        md.push_str("## Configurations\n\n");
        for s in configs {
            let _ = writeln!(
                md,
                "### {}\n\n```\n{}\n```\n",
                s.name,
                s.config.as_deref().unwrap_or("").trim_end()
            );
        }
    }
    md
}

/// Writes `report.md`, the charts and `results.json` into `dir`.
pub fn write_results(run: &BenchRun, dir: &Path) -> Result<(), String> {
    let io = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let path = dir.join("report.md");
    std::fs::write(&path, report_markdown(run)).map_err(|e| io(&path, e))?;
    for sc in &run.scenarios {
        for (file, svg) in svg::scenario_charts(sc) {
            let path = dir.join(file);
            std::fs::write(&path, svg).map_err(|e| io(&path, e))?;
        }
    }
    let path = dir.join("results.json");
    let json = serde_json::to_string_pretty(run).map_err(|e| e.to_string())?;
    std::fs::write(&path, json + "\n").map_err(|e| io(&path, e))?;
    Ok(())
}
