//! Loopback self-check: the load generator against an in-process stub origin, both on
//! 127.0.0.1, to see that neither tool is the bottleneck before pointing them at a gateway.
//!
//! `cargo run --release -p keymaster-bench --example loopback -- [QUERY] [SECONDS] [CONNS] [RATE]`
//! (RATE = open loop at that many requests per second; closed loop without it). `--churn` anywhere
//! opens a new connection per request.

use std::time::Duration;

use keymaster_bench::load::{run_load, LoadConfig};
use keymaster_bench::stub::spawn_stub;

fn main() -> Result<(), String> {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let churn = all.iter().any(|a| a == "--churn");
    let mut args = all.into_iter().filter(|a| a != "--churn");
    let query = args.next().unwrap_or_else(|| "length=1000".into());
    let secs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(3);
    let connections: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(50);
    let rate: Option<u64> = args.next().and_then(|s| s.parse().ok());
    let stub = spawn_stub("127.0.0.1:0".parse().map_err(|_| "addr")?, 1)
        .map_err(|e| format!("stub: {e}"))?;
    let cfg = LoadConfig {
        url: format!("http://{}/?{query}", stub.local_addr()),
        connections,
        rate,
        churn,
        threads: 1,
        duration: Duration::from_secs(secs),
        warmup: Duration::from_millis(500),
        ..LoadConfig::default()
    };
    let report = run_load(&cfg)?;
    println!("{report}");
    println!("  Stub CPU {:.2}s (1 worker)", stub_cpu_secs());
    stub.shutdown();
    Ok(())
}

/// CPU seconds used so far by this process's `stub-worker` threads (Linux; 0 elsewhere).
fn stub_cpu_secs() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let mut ticks = 0u64;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // "tid (comm) state ... utime stime": fields 14 and 15, counted after the ")".
        let Some((head, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        if !head.ends_with("stub-worker") {
            continue;
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        for i in [11, 12] {
            ticks += fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    ticks as f64 / 100.0 // USER_HZ
}
