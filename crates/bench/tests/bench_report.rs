//! Report and chart generation from a recorded run (a fixture built here, no network).

use keymaster_bench::bench::model::{
    BenchRun, Machine, Sample, ScenarioResult, Settings, StepResult, SystemInfo,
};
use keymaster_bench::bench::report::{report_markdown, scenario_table, write_results};
use keymaster_bench::bench::svg::scenario_charts;

fn sample(rps: f64, p99: f64, cpu: Option<f64>, non_2xx: u64, socket: u64) -> Sample {
    Sample {
        requests: (rps * 2.0) as u64,
        rps,
        avg_ms: 52.0,
        p50_ms: 51.0,
        p75_ms: 53.0,
        p90_ms: 55.0,
        p99_ms: p99,
        max_ms: p99 * 2.0,
        cpu_pct: cpu.map(|c| c * rps / 1000.0 / 10.0),
        cpu_ms_per_1k: cpu,
        load_avg: cpu.map(|_| 1.25),
        ctx_per_req: cpu.map(|_| 0.5),
        rss_mib: cpu.map(|_| 12.0),
        mbps: rps * 8.0 * 1100.0 / 1e6,
        non_2xx,
        socket_errors: socket,
        unsent: 0,
        generator_cpu_pct: 40.0,
        rig_cpu_pct: Some(60.0),
    }
}

fn step(system: &str, conns: usize, samples: Vec<Sample>) -> StepResult {
    StepResult::from_samples(system, conns, samples)
}

fn fixture(repeats: usize) -> BenchRun {
    let systems = ["direct", "keymaster", "nginx"];
    let mut steps = Vec::new();
    for (k, conns) in [100usize, 200, 400].into_iter().enumerate() {
        for (j, name) in systems.iter().enumerate() {
            let cpu = (*name != "direct").then_some(40.0 + j as f64 * 5.0);
            let rps = 1900.0 * (1 << k) as f64 - j as f64 * 100.0;
            // nginx at 400 connections had a bad repeat: 3 non-2xx and 2 socket errors.
            let (bad_2xx, bad_sock) = if *name == "nginx" && conns == 400 {
                (3, 2)
            } else {
                (0, 0)
            };
            let mut v = vec![sample(rps, 60.0 + k as f64, cpu, bad_2xx, bad_sock)];
            // keymaster at 400 connections drove the stub and generator's CPU to 97%.
            if *name == "keymaster" && conns == 400 {
                v[0].rig_cpu_pct = Some(97.0);
            }
            for r in 1..repeats {
                v.push(sample(rps + r as f64 * 10.0, 61.0, cpu, 0, 0));
            }
            steps.push(step(name, conns, v));
        }
    }
    BenchRun {
        version: "0.1.0".into(),
        started_utc: "2024-01-02T03:04:05Z".into(),
        machine: Machine {
            cpus: 2,
            cpu_model: "Test CPU".into(),
            kernel: "6.1".into(),
        },
        note: Some("shared 2-core VM".into()),
        settings: Settings {
            repeats,
            step_secs: 2.0,
            settle_secs: 0.5,
            warmup_secs: 1.0,
            workers: 1,
            sut_cpus: Some("0".into()),
            load_cpus: Some("1".into()),
            generator_threads: 1,
            nofile: 20000,
            ..Settings::default()
        },
        systems: vec![
            SystemInfo {
                name: "keymaster".into(),
                version: Some("keymaster 0.1.0".into()),
                status: "ran".into(),
                config: Some(
                    "keymaster proxy --listen 127.0.0.1:1 --to 127.0.0.1:2 --workers 1".into(),
                ),
            },
            SystemInfo {
                name: "haproxy".into(),
                version: None,
                status: "skipped: not installed".into(),
                config: None,
            },
        ],
        scenarios: vec![ScenarioResult {
            name: "ramp".into(),
            title: "the seed ramp".into(),
            path: "/?length=1024&delay=50".into(),
            churn: false,
            steps,
        }],
    }
}

fn rows<'a>(md: &'a str, system: &str) -> Vec<&'a str> {
    // Table rows only (a step's connection count follows the name), not the systems table.
    let prefix = format!("| {system} | ");
    md.lines()
        .filter(|l| {
            l.strip_prefix(&prefix)
                .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        })
        .collect()
}

#[test]
fn table_has_one_row_per_system_and_step_like_the_seed() {
    let run = fixture(1);
    let table = scenario_table(&run.scenarios[0], 1);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("| Run | Con. | Rq./s | Av./ms | TP50/ms | TP75/ms | TP90/ms | TP99/ms | Max/ms | CPU/% | CPU ms/1k req | LdAvg | Ctx Sw./req"));
    assert_eq!(lines.len(), 2 + 9);
    // Grouped by step, systems in run order (Tomcat 700, Netty 700, Tomcat 900, ...).
    assert!(lines[2].starts_with("| direct | 100 | 1900 |"));
    assert!(lines[3].starts_with("| keymaster | 100 | 1800 |"));
    assert!(lines[4].starts_with("| nginx | 100 | 1700 |"));
    assert!(lines[5].starts_with("| direct | 200 |"));
    // keymaster at 100: CPU 45 ms/1k, load 1.25, 0.50 switches per request, 12.0 MiB.
    assert!(
        lines[3].contains("| 45.0 | 1.25 | 0.50 | 12.0 |"),
        "{}",
        lines[3]
    );
    // direct has no system under test: dashes, not zeros.
    assert!(lines[2].contains("| – | – | – | – | – |"), "{}", lines[2]);
    let n = lines[0].matches('|').count();
    assert!(lines.iter().all(|l| l.matches('|').count() == n));
}

#[test]
fn rig_bound_steps_are_named_under_their_table() {
    let md = report_markdown(&fixture(2));
    let notes: Vec<&str> = md.lines().filter(|l| l.starts_with("Rig-bound:")).collect();
    assert_eq!(notes.len(), 1, "{md}");
    assert!(
        notes[0].contains("keymaster c=400 (1 of 2 repeats, up to 97%)"),
        "{}",
        notes[0]
    );
    assert!(!notes[0].contains("nginx") && !notes[0].contains("c=200"));
}

#[test]
fn steps_with_errors_are_flagged_not_averaged() {
    let run = fixture(3);
    let md = report_markdown(&run);
    let nginx = rows(&md, "nginx");
    assert_eq!(nginx.len(), 3);
    assert!(nginx[2].starts_with("| nginx | 400 |"));
    assert!(
        nginx[2].contains("⚠ **ERRORS** non-2xx 3, socket 2"),
        "{}",
        nginx[2]
    );
    assert!(nginx[..2].iter().all(|l| l.ends_with("| 0 |")));
    assert!(rows(&md, "keymaster").iter().all(|l| l.ends_with("| 0 |")));
    assert!(md.contains("## ⚠ Steps with errors"));
    assert!(md.contains("- ramp / nginx / 400 connections: ⚠ **ERRORS**"));
    // With repeats: the median and the min–max spread.
    assert!(md.contains("| Rq./s min–max | CPU ms/1k min–max |"));
    assert!(rows(&md, "keymaster")[0].contains("| 1800–1820 | 45.0–45.0 |"));
    // Header: note, machine, skipped systems, configs, chart links.
    assert!(md.contains("> **shared 2-core VM**"));
    assert!(md.contains("2 CPUs (Test CPU)"));
    assert!(md.contains("| haproxy | – | skipped: not installed |"));
    assert!(md.contains("### keymaster\n\n```\nkeymaster proxy"));
    assert!(md.contains("![ramp-throughput.svg](ramp-throughput.svg)"));
    let clean = fixture(1);
    let mut clean = clean.clone();
    clean.scenarios[0].steps.retain(|s| s.system != "nginx");
    assert!(report_markdown(&clean).contains("No step had errors"));
}

/// Checks tags are balanced and attributes quoted: a cheap well-formedness test.
fn assert_xmlish(svg: &str) {
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(svg.trim_end().ends_with("</svg>"));
    let mut stack: Vec<String> = Vec::new();
    let mut rest = svg;
    while let Some(i) = rest.find('<') {
        let j = rest[i..].find('>').expect("unclosed tag") + i;
        let tag = &rest[i + 1..j];
        assert!(!tag.contains('<'), "{tag}");
        assert_eq!(tag.matches('"').count() % 2, 0, "{tag}");
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name), "mismatched </{name}>");
        } else if !tag.ends_with('/') {
            stack.push(tag.split_whitespace().next().unwrap().to_owned());
        }
        let text = &rest[j + 1..rest[j + 1..].find('<').map_or(rest.len(), |k| k + j + 1)];
        assert!(!text.contains('&') || text.contains("&amp;") || text.contains("&lt;"));
        rest = &rest[j + 1..];
    }
    assert!(stack.is_empty(), "unclosed: {stack:?}");
}

#[test]
fn charts_have_one_polyline_per_system() {
    let run = fixture(1);
    let charts = scenario_charts(&run.scenarios[0]);
    let names: Vec<&str> = charts.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        names,
        [
            "ramp-throughput.svg",
            "ramp-p90.svg",
            "ramp-p99.svg",
            "ramp-cpu.svg"
        ]
    );
    for (file, svg) in &charts {
        assert_xmlish(svg);
        let lines = svg.matches("<polyline").count();
        // The CPU chart has no line for `direct` (no system under test).
        let expect = if file.ends_with("cpu.svg") { 2 } else { 3 };
        assert_eq!(lines, expect, "{file}");
        for system in ["keymaster", "nginx"] {
            assert!(
                svg.contains(&format!("<polyline data-system=\"{system}\"")),
                "{file}"
            );
            // Legend entry.
            assert!(svg.contains(&format!(">{system}</text>")), "{file}");
        }
        // Three points per line, x labels for each step.
        let kp = svg
            .lines()
            .find(|l| l.contains("data-system=\"keymaster\""))
            .unwrap();
        let points = kp.split("points=\"").nth(1).unwrap();
        assert_eq!(points.trim_end_matches("\"/>").split(' ').count(), 3);
        for label in [">100<", ">200<", ">400<"] {
            assert!(svg.contains(label), "{file} {label}");
        }
        // nginx at 400 had errors: one red ring.
        assert_eq!(svg.matches("class=\"error\"").count(), 1, "{file}");
    }
}

#[test]
fn writes_the_results_directory() {
    let dir = tempdir();
    write_results(&fixture(2), &dir).unwrap();
    for f in [
        "report.md",
        "results.json",
        "ramp-throughput.svg",
        "ramp-p90.svg",
        "ramp-p99.svg",
        "ramp-cpu.svg",
    ] {
        assert!(dir.join(f).is_file(), "{f}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let steps = json["scenarios"][0]["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 9);
    assert_eq!(steps[1]["system"], "keymaster");
    assert_eq!(steps[1]["samples"].as_array().unwrap().len(), 2);
    assert_eq!(steps[8]["errors"], true);
    assert!(steps[0]["median"]["cpu_ms_per_1k"].is_null());
    let _ = std::fs::remove_dir_all(dir);
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("km-bench-report-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
