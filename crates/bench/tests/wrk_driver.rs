//! The wrk driver against a real stub, when wrk is installed: both drivers run the same short
//! step and must each produce a sane, error-free report. Their within-10% agreement is a
//! measured run recorded in docs/benchmarking.md, not asserted here: on a shared 2-core machine
//! two back-to-back runs are too noisy for a hard 10% bound in CI.

use std::time::Duration;

use keymaster_bench::bench::wrk;
use keymaster_bench::load::{run_load, LoadConfig, LoadReport};
use keymaster_bench::stub::spawn_stub;

fn sane(name: &str, r: &LoadReport) {
    assert!(r.all_ok(), "{name}: errors: {r:?}");
    assert!(r.requests > 100, "{name}: only {} requests", r.requests);
    assert!(
        r.requests_per_sec > 50.0,
        "{name}: {} req/s",
        r.requests_per_sec
    );
    let l = &r.latency_ms;
    assert!(
        l.p50 > 0.0 && l.p50 <= l.p75 && l.p75 <= l.p90 && l.p90 <= l.p99 && l.p99 <= l.max + 1e-9,
        "{name}: {l:?}"
    );
    assert!(l.p50 < 1000.0, "{name}: p50 {} ms", l.p50);
    assert!(r.mbps > 0.0, "{name}: {} Mbps", r.mbps);
}

#[test]
fn both_drivers_produce_sane_reports() {
    if wrk::find_wrk().is_none() {
        eprintln!("skipping both_drivers_produce_sane_reports: wrk is not on PATH");
        return;
    }
    let stub = spawn_stub("127.0.0.1:0".parse().unwrap(), 1).expect("stub starts");
    let cfg = LoadConfig {
        url: format!("http://{}/?length=1024", stub.local_addr()),
        connections: 20,
        threads: 1,
        duration: Duration::from_secs(1),
        warmup: Duration::from_millis(300),
        timeout: Duration::from_secs(5),
        ..LoadConfig::default()
    };
    let builtin = run_load(&cfg).expect("built-in run");
    let w = wrk::run_wrk(&cfg, None).expect("wrk run");
    sane("builtin", &builtin);
    sane("wrk", &w);
    assert_eq!((w.connections, w.threads, w.mode), (20, 1, "closed"));
    assert!((w.duration_secs - 1.0).abs() < 0.5, "{}", w.duration_secs);
    assert_eq!(w.warmup_secs, 1.0);
    eprintln!(
        "builtin {:.0} req/s p50 {:.3} ms; wrk {:.0} req/s p50 {:.3} ms",
        builtin.requests_per_sec, builtin.latency_ms.p50, w.requests_per_sec, w.latency_ms.p50
    );
}

#[test]
fn wrk_failure_is_an_error() {
    if wrk::find_wrk().is_none() {
        eprintln!("skipping wrk_failure_is_an_error: wrk is not on PATH");
        return;
    }
    // Nothing listens on port 1: wrk exits non-zero and the driver says so.
    let cfg = LoadConfig {
        url: "http://127.0.0.1:1/".into(),
        connections: 1,
        threads: 1,
        duration: Duration::from_secs(1),
        ..LoadConfig::default()
    };
    let e = wrk::run_wrk(&cfg, None).unwrap_err();
    assert!(e.contains("failed"), "{e}");
}
