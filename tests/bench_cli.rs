//! `keymaster bench` end to end: the real binary with keymaster and the stub only (no peers),
//! one short scenario, on 127.0.0.1.

use std::process::Command;

#[test]
fn quick_bench_with_keymaster_and_the_stub() {
    let out = std::env::temp_dir().join(format!("km-bench-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new(env!("CARGO_BIN_EXE_keymaster"))
        .args([
            "bench",
            "--quick",
            "--peers",
            "none",
            "--only",
            "keymaster,direct",
            "--scenario",
            "saturation",
            "--saturation-connections",
            "4,8",
            "--body",
            "3KB",
            "--duration",
            "1s",
            "--settle",
            "200ms",
            "--warmup",
            "300ms",
            "--note",
            "test run",
            "--json",
            "--out",
        ])
        .arg(&out)
        .output()
        .expect("running keymaster bench");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "exit {:?}\n{stderr}", run.status);
    // Live progress lines on stderr, one per system and step.
    assert_eq!(
        stderr.matches("saturation keymaster").count(),
        2,
        "{stderr}"
    );
    assert_eq!(stderr.matches("saturation direct").count(), 2, "{stderr}");

    let md = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    let rows: Vec<&str> = md
        .lines()
        .filter(|l| l.starts_with("| keymaster | 4 |") || l.starts_with("| keymaster | 8 |"))
        .collect();
    assert_eq!(rows.len(), 2, "{md}");
    assert!(rows[0].starts_with("| keymaster | 4 | "), "{md}");
    assert!(rows.iter().all(|r| r.ends_with("| 0 |")), "{md}");
    assert!(!md.contains("ERRORS"), "{md}");
    assert!(md.contains("> **test run**"));
    for chart in ["throughput", "p90", "p99", "cpu"] {
        let svg = std::fs::read_to_string(out.join(format!("saturation-{chart}.svg"))).unwrap();
        assert!(svg.contains("data-system=\"keymaster\""), "{chart}");
    }

    // --json: the run on stdout, with CPU figures for keymaster and none for direct.
    let json: serde_json::Value = serde_json::from_slice(&run.stdout).expect("JSON on stdout");
    let scenario = &json["scenarios"][0];
    assert_eq!(scenario["path"], "/?length=3072", "--body 3KB");
    assert!(scenario["title"].as_str().unwrap().contains("3 KB body"));
    let steps = scenario["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 4);
    for s in steps {
        let m = &s["median"];
        assert!(m["requests"].as_u64().unwrap() > 0, "{s}");
        // Bytes read per response: the 3 KB body and a head of a few hundred bytes.
        let per_response = m["mbps"].as_f64().unwrap() * 1e6 / 8.0 / m["rps"].as_f64().unwrap();
        assert!(
            (3072.0..3700.0).contains(&per_response),
            "{per_response} bytes: {s}"
        );
        assert_eq!(s["errors"], false);
        if s["system"] == "keymaster" {
            assert!(m["cpu_ms_per_1k"].as_f64().unwrap() > 0.0, "{s}");
            assert!(m["rss_mib"].as_f64().unwrap() > 0.0, "{s}");
            assert!(m["ctx_per_req"].as_f64().is_some(), "{s}");
            assert!(m["load_avg"].as_f64().is_some_and(|l| l >= 0.0), "{s}");
        } else {
            assert!(m["cpu_ms_per_1k"].is_null(), "{s}");
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bench_rejects_unknown_scenarios_and_systems() {
    for args in [
        &["bench", "--scenario", "nope"][..],
        &["bench", "--only", "tomcat"][..],
        &["bench", "--peers", "some"][..],
    ] {
        let run = Command::new(env!("CARGO_BIN_EXE_keymaster"))
            .args(args)
            .output()
            .unwrap();
        assert!(!run.status.success(), "{args:?}");
    }
}

/// The TLS and h2 scenarios: keymaster's TLS listener with the bench certificate, the
/// built-in generator's parity TLS client (full handshake per request, then keep-alive),
/// `direct` skipped (the stub has no TLS); HTTP/2 with prior knowledge to keymaster and to the
/// stub (`direct`).
#[test]
fn tls_and_h2_scenarios_with_keymaster() {
    let out = std::env::temp_dir().join(format!("km-bench-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new(env!("CARGO_BIN_EXE_keymaster"))
        .args([
            "bench",
            "--quick",
            "--peers",
            "none",
            "--only",
            "keymaster,direct",
            "--scenario",
            "tls-handshake,tls,h2",
            "--duration",
            "500ms",
            "--settle",
            "200ms",
            "--warmup",
            "200ms",
            "--json",
            "--out",
        ])
        .arg(&out)
        .output()
        .expect("running keymaster bench");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "exit {:?}\n{stderr}", run.status);
    let json: serde_json::Value = serde_json::from_slice(&run.stdout).expect("JSON on stdout");
    let scenarios = json["scenarios"].as_array().unwrap();
    assert_eq!(scenarios.len(), 3);
    let h2 = &scenarios[2]["steps"];
    assert_eq!(h2.as_array().unwrap().len(), 2, "{h2}");
    for s in h2.as_array().unwrap() {
        assert_eq!(s["errors"], false, "{s}\n{stderr}");
        assert!(s["median"]["requests"].as_u64().unwrap() > 0, "{s}");
    }
    for sc in &scenarios[..2] {
        let steps = sc["steps"].as_array().unwrap();
        // keymaster only: direct has no TLS listener.
        assert_eq!(steps.len(), 1, "{sc}");
        assert_eq!(steps[0]["system"], "keymaster");
        assert_eq!(steps[0]["errors"], false, "{sc}\n{stderr}");
        assert!(steps[0]["median"]["requests"].as_u64().unwrap() > 0, "{sc}");
        assert!(steps[0]["median"]["cpu_ms_per_1k"].as_f64().unwrap() > 0.0);
    }
    assert!(out.join("work/tls/combined.pem").exists());
    let _ = std::fs::remove_dir_all(&out);
}
