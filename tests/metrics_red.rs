//! The RED series an operator builds dashboards and alerts on, read from a real gateway's
//! `/metrics`: per origin server attempts by outcome, attempt latency, connection reuse and
//! open/idle connections; filter rejections (auth, IP, rate limit) present at zero and
//! counted; the request duration by route and status class, covering the whole response.

mod support;

use std::time::Duration;
use support::*;
use tokio::io::AsyncWriteExt;

fn series(m: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    m.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .find(|l| {
            let rest = &l[name.len()..];
            rest.starts_with('{')
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_servers_have_attempts_latency_reuse_and_connections() {
    // One server answers 503 to everything, the other 200 (keep-alive).
    let bad = raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        while read_head(&mut s, &mut carry).await.is_some() {
            let r = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n";
            if s.write_all(r).await.is_err() {
                return;
            }
        }
    })
    .await;
    let good = head_echo_origin().await;
    let extra = format!(
        "[[routes]]\nname = \"pair\"\ncluster = \"pair\"\nmatch = {{ path_prefix = \"/pair\" }}\n\n[[clusters]]\nname = \"pair\"\nbalance = \"round_robin\"\nservers = [{{ address = \"{}\" }}, {{ address = \"{}\" }}]\n",
        bad.addr, good.addr
    );
    // The access log on: every attempt is timed (else one in 16).
    let dir = tempfile::tempdir().unwrap();
    let log = format!(
        "[access_log]\nenabled = true\npath = \"{}\"\n",
        dir.path().join("a.log").display()
    );
    let g = start_gateway(&config_text(good.addr, "", &format!("{log}{extra}")));
    let before = metrics_text(&g).await;
    for (server, outcome) in [(bad.addr, "5xx"), (good.addr, "2xx"), (good.addr, "error")] {
        let labels = [
            ("cluster", "pair"),
            ("server", &server.to_string()),
            ("outcome", outcome),
        ];
        let at_zero = series(&before, "keymaster_upstream_server_attempts_total", &labels);
        assert_eq!(at_zero, Some(0.0), "{labels:?} exists at zero:\n{before}");
    }
    let mut c = Client::connect(g.addr).await;
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(c.get("/pair").await.status);
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 503).count(),
        5,
        "{statuses:?}"
    );
    let m = metrics_text(&g).await;
    let (bad_l, good_l) = (bad.addr.to_string(), good.addr.to_string());
    let at = |server: &str, outcome: &str| {
        series(
            &m,
            "keymaster_upstream_server_attempts_total",
            &[
                ("cluster", "pair"),
                ("server", server),
                ("outcome", outcome),
            ],
        )
    };
    assert_eq!(at(&bad_l, "5xx"), Some(5.0));
    assert_eq!(at(&good_l, "2xx"), Some(5.0));
    let count = series(
        &m,
        "keymaster_upstream_attempt_duration_seconds_count",
        &[("cluster", "pair"), ("server", &good_l)],
    );
    assert_eq!(count, Some(5.0));
    // Keep-alive: after the first request each server's connection is reused, and stays
    // open and idle between requests.
    let reused = |s: &str| {
        series(
            &m,
            "keymaster_upstream_server_reused_total",
            &[("cluster", "pair"), ("server", s)],
        )
    };
    assert_eq!(
        (reused(&bad_l), reused(&good_l)),
        (Some(4.0), Some(4.0)),
        "{m}"
    );
    for state in ["open", "idle"] {
        let labels = [
            ("cluster", "pair"),
            ("server", good_l.as_str()),
            ("state", state),
        ];
        let n = series(&m, "keymaster_upstream_server_connections", &labels);
        assert_eq!(n, Some(1.0), "{labels:?}\n{m}");
    }
    // The request duration by route and status class.
    let labels = [("route", "pair"), ("status_class", "5xx")];
    let n = series(&m, "keymaster_request_duration_seconds_count", &labels);
    assert_eq!(n, Some(5.0), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_rejections_exist_at_zero_and_are_counted() {
    let stub = stub();
    let filters = r#"
[[filters]]
name = "keys"
type = "api_key"
keys = ["k1"]
match = { path_prefix = "/keyed" }

[[filters]]
name = "limit"
type = "rate_limit"
requests = 1
burst = 1
period = "1h"
match = { path_prefix = "/limited" }
"#;
    let g = start_gateway(&config_text(stub.local_addr(), "", filters));
    let m = metrics_text(&g).await;
    let rejected = |m: &str, f: &str, s: &str| {
        series(
            m,
            "keymaster_filter_rejections_total",
            &[("filter", f), ("status", s)],
        )
    };
    assert_eq!(rejected(&m, "keys", "401"), Some(0.0), "{m}");
    assert_eq!(rejected(&m, "limit", "429"), Some(0.0), "{m}");
    let mut c = Client::connect(g.addr).await;
    for _ in 0..3 {
        assert_eq!(c.get("/keyed").await.status, 401);
    }
    let statuses: Vec<u16> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(c.get("/limited").await.status);
        }
        v
    };
    assert_eq!(statuses, [200, 429, 429, 429]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let m = metrics_text(&g).await;
    assert_eq!(rejected(&m, "keys", "401"), Some(3.0), "{m}");
    assert_eq!(rejected(&m, "limit", "429"), Some(3.0), "{m}");
}

/// Each worker counts in memory of its own, and a scrape adds the workers up: with four
/// workers serving 32 connections at once, every request is in each count exactly once,
/// and the gauges that go up and down per request or connection come back level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counts_of_every_worker_add_up() {
    const CONNS: usize = 32;
    const EACH: usize = 60;
    let o = head_echo_origin().await;
    let g = start_gateway(&config_text(o.addr, "", "").replace("workers = 1", "workers = 4"));
    many_clients(g.addr, CONNS, EACH, "/n").await;
    let n = Some((CONNS * EACH) as f64);
    let ok = [("route", "default"), ("status_class", "2xx")];
    let m = metrics_text(&g).await;
    assert_eq!(series(&m, "keymaster_requests_total", &ok), n, "{m}");
    let count = series(&m, "keymaster_request_duration_seconds_count", &ok);
    assert_eq!(count, n, "{m}");
    let inf = [ok[0], ok[1], ("le", "+Inf")];
    let all = series(&m, "keymaster_request_duration_seconds_bucket", &inf);
    assert_eq!(all, n, "{m}");
    let cluster = [("cluster", "origin")];
    assert_eq!(series(&m, "keymaster_upstream_requests_total", &cluster), n);
    let attempts = [("cluster", "origin"), ("outcome", "2xx")];
    let by_server = series(&m, "keymaster_upstream_server_attempts_total", &attempts);
    assert_eq!(by_server, n);
    let accepted = series(
        &m,
        "keymaster_downstream_accepted_total",
        &[("listener", "main")],
    );
    assert_eq!(accepted, Some(CONNS as f64));
    // Level again once the clients are gone: no client connection open, and every origin
    // connection idle in a pool, in the cluster's gauges and the server's alike.
    let until = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let m = metrics_text(&g).await;
        let open = series(
            &m,
            "keymaster_downstream_connections",
            &[("listener", "main")],
        );
        let origin_open = series(&m, "keymaster_upstream_connections", &cluster);
        let idle = series(&m, "keymaster_upstream_idle_connections", &cluster);
        let server_idle = [("cluster", "origin"), ("state", "idle")];
        let server_idle = series(&m, "keymaster_upstream_server_connections", &server_idle);
        if open == Some(0.0) && idle == origin_open && server_idle == idle {
            assert!(idle.unwrap() >= 1.0, "{m}");
            break;
        }
        assert!(std::time::Instant::now() < until, "gauges not level:\n{m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
