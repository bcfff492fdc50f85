//! Cluster-wide rate limits: `rate_limit` filters with `backend = "redis"` share one token
//! bucket through a real redis-server, across gateway processes; when Redis is slow or down
//! the local buckets decide within `[redis] timeout` and no request fails.
mod redis_support;
mod support;

use redis_support::{GatewayProcess, RedisServer};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::*;

/// A gateway config with one rate_limit filter (`requests` per hour, keyed by route) on the
/// Redis at `url`, in front of `origin`.
fn limited_config(
    workers: usize,
    origin: SocketAddr,
    url: &str,
    requests: u32,
    timeout: &str,
) -> String {
    format!(
        r#"
[server]
workers = {workers}
drain_timeout = "5s"

[admin]
listen = "127.0.0.1:0"

[[listeners]]
name = "main"
address = "127.0.0.1:0"

[redis]
url = "{url}"
timeout = "{timeout}"
backoff = "300ms"

[[filters]]
name = "shared"
type = "rate_limit"
requests = {requests}
period = "1h"
key = "route"
backend = "redis"

[[routes]]
name = "default"
cluster = "origin"

[[clusters]]
name = "origin"
servers = [{{ address = "{origin}" }}]
"#
    )
}

/// Status of a GET on a fresh connection (0 if the exchange failed).
async fn status(addr: SocketAddr) -> u16 {
    match try_get(addr, "/?length=8").await {
        Some(r) => {
            if r.status == 429 {
                let wait: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
                assert!(wait >= 1, "Retry-After {wait}");
            }
            r.status
        }
        None => 0,
    }
}

async fn admin_metrics(admin: SocketAddr) -> String {
    let r = try_get(admin, "/metrics").await.expect("admin answers");
    String::from_utf8(r.body.to_vec()).unwrap()
}

fn redis_decisions(text: &str, result: &str) -> f64 {
    metric(
        text,
        &format!("keymaster_rate_limit_redis_total{{filter=\"shared\",result=\"{result}\"}}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateway_processes_share_one_redis_limit() {
    let redis = RedisServer::start();
    let origin = stub();
    // A generous call timeout: on a loaded CI box Redis must still decide every request.
    let config = limited_config(2, origin.local_addr(), &redis.url(), 10, "5s");
    let a = GatewayProcess::start(&config);
    let b = GatewayProcess::start(&config);

    let (mut allowed, mut limited) = ([0; 2], [0; 2]);
    for i in 0..15 {
        for (n, g) in [&a, &b].iter().enumerate() {
            match status(g.addr).await {
                200 => allowed[n] += 1,
                429 => limited[n] += 1,
                s => panic!("request {i} to gateway {n}: status {s}"),
            }
        }
    }
    // Alone, each process (each worker even) would allow 10: together they allow 10.
    assert_eq!(allowed[0] + allowed[1], 10, "allowed {allowed:?}");
    assert_eq!(limited[0] + limited[1], 20, "limited {limited:?}");
    assert!(
        allowed[0] > 0 && allowed[1] > 0,
        "both shared it: {allowed:?}"
    );

    for g in [&a, &b] {
        let m = admin_metrics(g.admin).await;
        assert_eq!(redis_decisions(&m, "ok"), 15.0, "{m}");
        assert_eq!(redis_decisions(&m, "fallback"), 0.0, "{m}");
    }
}

/// Requests answered within a bound with 200 or 429 only (never 5xx, never hanging).
async fn burst(addr: SocketAddr, n: usize) -> Vec<u16> {
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(status(addr).await);
        }
        out
    })
    .await
    .expect("every request is answered without waiting on Redis past its timeout")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_slow_or_down_falls_back_to_local_buckets_and_recovers() {
    let mut redis = RedisServer::start();
    let origin = stub();
    let g = start_gateway(&limited_config(
        1,
        origin.local_addr(),
        &redis.url(),
        3,
        "1s",
    ));
    let decisions = |result: &str| redis_decisions(&g.gateway().metrics_text(), result);

    // Redis decides: 3 of 5 pass.
    assert_eq!(burst(g.addr, 5).await, [200, 200, 200, 429, 429]);
    assert_eq!((decisions("ok"), decisions("fallback")), (5.0, 0.0));

    // Slow Redis (stopped process, socket open): a decision waits at most the call timeout
    // (one request per backoff window does), then the worker's own bucket (full: 3 tokens)
    // decides.
    redis.pause();
    assert_eq!(burst(g.addr, 4).await, [200, 200, 200, 429]);
    assert_eq!((decisions("ok"), decisions("fallback")), (5.0, 4.0));

    // Redis answers again: after the backoff a probe goes through and Redis decides again
    // (its bucket is still empty from the first burst).
    redis.resume();
    let mut back = false;
    for _ in 0..200 {
        let before = decisions("ok");
        let s = status(g.addr).await;
        assert!(s == 200 || s == 429, "status {s}");
        if decisions("ok") > before {
            assert_eq!(s, 429, "Redis' bucket is empty");
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(back, "Redis never decided again after it resumed");

    // Redis down (killed): the connection resets, the local bucket (now empty) decides.
    redis.stop();
    let fallback = decisions("fallback");
    let ok = decisions("ok");
    assert_eq!(burst(g.addr, 3).await, [429, 429, 429]);
    assert_eq!(decisions("fallback"), fallback + 3.0);
    assert_eq!(decisions("ok"), ok);

    // A fresh Redis (no state): after the backoff its new, full bucket decides again.
    redis.restart();
    let mut allowed = false;
    for _ in 0..200 {
        if status(g.addr).await == 200 {
            allowed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        allowed,
        "the restarted Redis' bucket never allowed a request"
    );
    assert!(decisions("ok") > ok);

    // Redis killed under concurrent load: calls in flight at that moment fall back too.
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..4)
        .map(|_| {
            let (stop, addr) = (stop.clone(), g.addr);
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while !stop.load(Ordering::SeqCst) && seen.len() < 5000 {
                    seen.push(status(addr).await);
                }
                seen
            })
        })
        .collect();
    let ok = decisions("ok");
    assert!(eventually(Duration::from_secs(20), || decisions("ok") >= ok + 20.0).await);
    redis.stop();
    let fallback = decisions("fallback");
    assert!(
        eventually(Duration::from_secs(20), || decisions("fallback")
            >= fallback + 20.0)
        .await,
        "no fallback decisions after Redis was killed"
    );
    stop.store(true, Ordering::SeqCst);
    for task in load {
        let seen = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("the load finishes")
            .unwrap();
        assert!(seen.iter().all(|s| *s == 200 || *s == 429), "{seen:?}");
    }

    // No request failed at any point.
    let m = g.gateway().metrics_text();
    assert_eq!(
        metric(
            &m,
            "keymaster_requests_total{route=\"default\",status_class=\"5xx\"}"
        ),
        0.0,
        "{m}"
    );
}
