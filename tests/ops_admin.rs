//! The admin listener (/metrics, /healthz, /ready, /config, 404/405) and the access log.
mod support;
use bytes::Bytes;
use http_body_util::Full;
use std::time::Duration;
use support::*;

/// A gateway with the stub as "origin" and a route "/dead" to a port nobody listens on.
fn gateway_with_dead_route(extra_top: &str) -> (TestGateway, StubHandle, std::net::SocketAddr) {
    let s = stub();
    let (dead, _dead_held) = closed_addr();
    let toml = format!(
        "{extra_top}\n{}",
        config_text(
            s.local_addr(),
            "",
            &format!(
                r#"[[routes]]
name = "dead"
cluster = "dead"
match = {{ path_prefix = "/dead" }}

[[clusters]]
name = "dead"
servers = [{{ address = "{dead}" }}]
connect_timeout = "1s"
"#
            ),
        )
    );
    (start_gateway(&toml), s, dead)
}

fn text(r: &Reply) -> String {
    String::from_utf8(r.body.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_after_traffic() {
    let (g, _s, _) = gateway_with_dead_route("");
    let mut c = Client::connect(g.addr).await;
    for _ in 0..3 {
        assert_eq!(c.get("/?length=10").await.status, 200);
    }
    assert_eq!(c.get("/?status=404").await.status, 404);
    assert_eq!(c.get("/?status=503").await.status, 503);
    assert_eq!(c.get("/dead/x").await.status, 502);

    let r = admin_get(&g, "/metrics").await;
    assert_eq!(r.status, 200);
    assert!(r.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let m = text(&r);
    let req = |route: &str, class: &str| {
        metric(
            &m,
            &format!("keymaster_requests_total{{route=\"{route}\",status_class=\"{class}\"}}"),
        )
    };
    assert_eq!(req("default", "2xx"), 3.0);
    assert_eq!(req("default", "4xx"), 1.0);
    assert_eq!(req("default", "5xx"), 1.0);
    assert_eq!(req("dead", "5xx"), 1.0);
    assert_eq!(req("dead", "2xx"), 0.0);
    // Latency histogram by route and status class: every bucket line present, +Inf and
    // _count match the requests of each class.
    let buckets: Vec<_> = m
        .lines()
        .filter(|l| {
            l.starts_with(
                "keymaster_request_duration_seconds_bucket{route=\"default\",status_class=\"2xx\"",
            )
        })
        .collect();
    assert_eq!(buckets.len(), 16, "{buckets:#?}");
    let hist = |suffix: &str, route: &str, class: &str, le: &str| {
        metric(
            &m,
            &format!("keymaster_request_duration_seconds_{suffix}{{route=\"{route}\",status_class=\"{class}\"{le}}}"),
        )
    };
    assert_eq!(hist("bucket", "default", "2xx", ",le=\"+Inf\""), 3.0);
    assert_eq!(hist("count", "default", "2xx", ""), 3.0);
    assert_eq!(hist("count", "default", "4xx", ""), 1.0);
    assert_eq!(hist("count", "default", "5xx", ""), 1.0);
    assert_eq!(hist("count", "dead", "5xx", ""), 1.0);
    // Upstream connections: one connect, the rest reused.
    assert_eq!(
        metric(&m, "keymaster_upstream_connects_total{cluster=\"origin\"}"),
        1.0
    );
    assert_eq!(
        metric(&m, "keymaster_upstream_reused_total{cluster=\"origin\"}"),
        4.0
    );
    assert_eq!(
        metric(&m, "keymaster_upstream_requests_total{cluster=\"origin\"}"),
        5.0
    );
    assert_eq!(
        metric(
            &m,
            "keymaster_upstream_connect_failures_total{cluster=\"dead\"}"
        ),
        1.0
    );
    // The client connection is open.
    assert_eq!(
        metric(&m, "keymaster_downstream_connections{listener=\"main\"}"),
        1.0
    );
    // The 502 is counted with its category; origin 4xx/5xx answers are not gateway errors.
    assert_eq!(
        metric(
            &m,
            "keymaster_errors_total{category=\"origin_connectivity\",side=\"origin\"}"
        ),
        1.0
    );
    let error_lines: Vec<_> = m
        .lines()
        .filter(|l| l.starts_with("keymaster_errors_total{"))
        .collect();
    assert_eq!(error_lines.len(), 1, "{error_lines:#?}");
    assert_eq!(metric(&m, "keymaster_config_version "), 1.0);
    drop(c);
    assert!(
        eventually(Duration::from_secs(2), || metric(
            &g.gateway().metrics_text(),
            "keymaster_downstream_connections{listener=\"main\"}"
        ) == 0.0)
        .await,
        "open connections gauge goes back to 0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_ready_config_and_unknown_paths() {
    let (g, _s) = gateway_with_stub();
    let r = admin_get(&g, "/healthz").await;
    assert_eq!((r.status, text(&r).as_str()), (200, "ok\n"));
    let r = admin_get(&g, "/ready").await;
    assert_eq!((r.status, text(&r).as_str()), (200, "ready\n"));
    let r = admin_get(&g, "/config").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "application/json");
    let j: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(j["version"], 1);
    assert_eq!(j["source"], "<memory>");
    assert_eq!(j["config"]["listeners"][0]["name"], "main");
    assert_eq!(j["config"]["routes"][0]["name"], "default");
    assert_eq!(j["config"]["clusters"][0]["name"], "origin");
    assert_eq!(j["config"]["server"]["workers"], 1);

    for path in ["/", "/nope", "/metrics/x", "/config.json"] {
        assert_eq!(admin_get(&g, path).await.status, 404, "{path}");
    }
    let mut c = Client::connect(g.admin).await;
    for (method, path) in [
        ("POST", "/metrics"),
        ("DELETE", "/healthz"),
        ("PUT", "/ready"),
        ("POST", "/config"),
        ("GET", "/reload"),
    ] {
        let r = c
            .send(
                http::Request::builder()
                    .method(method)
                    .uri(path)
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
            .await;
        assert_eq!(r.status, 405, "{method} {path}");
    }
}

/// Poll a file until it has `n` lines (bounded), return them.
async fn log_lines(path: &std::path::Path, n: usize) -> Vec<String> {
    let mut lines = Vec::new();
    for _ in 0..300 {
        let t = std::fs::read_to_string(path).unwrap_or_default();
        lines = t.lines().map(str::to_string).collect();
        if lines.len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(lines.len(), n, "{lines:#?}");
    lines
}

fn access_log_toml(path: &std::path::Path, format: &str) -> String {
    format!(
        "[access_log]\nenabled = true\nformat = \"{format}\"\npath = \"{}\"\n",
        path.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_access_log_has_one_line_per_request() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let canned = "[[filters]]\nname = \"canned\"\ntype = \"static\"\nbody = \"canned!\\n\"\nmatch = { path_prefix = \"/canned\" }\n";
    let (g, s, dead) =
        gateway_with_dead_route(&format!("{}{canned}", access_log_toml(&path, "json")));
    let mut c = Client::connect(g.addr).await;
    let ok = c.get("/hello?length=10").await;
    assert_eq!(ok.status, 200);
    let bad = c.get("/dead/x").await;
    assert_eq!(bad.status, 502);
    let made = c.get("/canned").await;
    assert_eq!(made.status, 200);
    let lines = log_lines(&path, 3).await;
    let a: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    let b: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
    let m: serde_json::Value = serde_json::from_str(&lines[2]).unwrap();
    // Attempts are the tries listed; the bytes are the body the client got, whoever made it.
    for line in [&a, &b, &m] {
        assert_eq!(
            line["attempts"],
            line["tries"].as_array().unwrap().len(),
            "{line}"
        );
    }
    assert_eq!(a["attempts"], 1);
    assert_eq!(b["attempts"], 1, "the refused connect is an attempt: {b}");
    assert_eq!(
        (a["sends"].as_u64(), b["sends"].as_u64()),
        (Some(1), Some(0)),
        "{b}"
    );
    assert_eq!(b["bytes_out"], bad.body.len(), "{b}");
    assert_eq!(m["attempts"], 0);
    assert_eq!(m["category"], "filter_response");
    assert_eq!(m["bytes_out"], 8, "{m}");
    assert_eq!(
        a["request_id"],
        ok.headers["x-request-id"].to_str().unwrap()
    );
    assert_eq!(a["request_id"].as_str().unwrap().len(), 32);
    assert_eq!(a["route"], "default");
    assert_eq!(a["origin"], s.local_addr().to_string());
    assert_eq!(a["status"], 200);
    assert_eq!(a["category"], "success");
    assert_eq!(a["method"], "GET");
    assert_eq!(a["uri"], "/hello?length=10");
    assert_eq!(a["version"], "HTTP/1.1");
    assert_eq!(a["bytes_out"], 10);
    assert_eq!(a["client"], "127.0.0.1");
    assert!(a["duration_ms"].as_f64().unwrap() > 0.0, "{a}");
    assert!(a["time"].as_str().unwrap().ends_with('Z'));

    assert_eq!(
        b["request_id"],
        bad.headers["x-request-id"].to_str().unwrap()
    );
    assert_eq!(b["route"], "dead");
    assert_eq!(b["origin"], dead.to_string());
    assert_eq!(b["status"], 502);
    assert_eq!(b["category"], "origin_connectivity");
    assert!(b["duration_ms"].as_f64().unwrap() > 0.0, "{b}");
    // Nothing more is written for three requests.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn combined_access_log_line_shape() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let (g, s, _) = gateway_with_dead_route(&access_log_toml(&path, "combined"));
    let mut c = Client::connect(g.addr).await;
    let r = c
        .send(
            http::Request::get("/x?length=3")
                .header("user-agent", "probe/1.0")
                .header("referer", "http://ref.example/")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, 200);
    let rid = r.headers["x-request-id"].to_str().unwrap().to_string();
    let line = log_lines(&path, 1).await.remove(0);
    assert!(line.starts_with("127.0.0.1 - - ["), "{line}");
    let (_, rest) = line.split_once("] ").unwrap();
    let expected = format!(
        "\"GET /x?length=3 HTTP/1.1\" 200 3 \"http://ref.example/\" \"probe/1.0\" rid={rid} trace=- route=default origin={} category=success duration_ms=",
        s.local_addr()
    );
    assert!(rest.starts_with(&expected), "{line}\nexpected: {expected}");
    assert!(line.ends_with("attempts=1"), "{line}");
    // [dd/Mon/yyyy:hh:mm:ss +0000]
    let ts = &line[line.find('[').unwrap() + 1..line.find(']').unwrap()];
    assert_eq!(ts.len(), 26, "{ts}");
    assert!(ts.ends_with(" +0000"), "{ts}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn combined_access_log_quotes_cannot_be_forged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let (g, _s, _) = gateway_with_dead_route(&access_log_toml(&path, "combined"));
    let (resp, _) = raw_exchange(
        g.addr,
        b"GET /a\"b?length=1 HTTP/1.1\r\nHost: a\r\nUser-Agent: x\" 500 \"y\r\nConnection: close\r\n\r\n",
        Duration::from_secs(2),
    )
    .await;
    let status = status_of(&resp).unwrap();
    if status == 400 {
        return; // the target was refused: nothing to log
    }
    let line = log_lines(&path, 1).await.remove(0);
    // Exactly the three quoted fields plus escaped quotes: the request line must not contain
    // an unescaped quote.
    let unescaped = line
        .char_indices()
        .filter(|&(i, c)| c == '"' && (i == 0 || line.as_bytes()[i - 1] != b'\\'))
        .count();
    assert_eq!(unescaped, 6, "{line}");
}

/// Leaving a load balancer before a restart: `POST /healthcheck/fail` makes `/ready` answer
/// 503 while requests are still proxied, `POST /healthcheck/ok` undoes it; both are
/// mutating requests (the cross-site guard applies), and the gauge says which state holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_ready_check_keeps_serving_requests() {
    let (g, _s) = gateway_with_stub();
    assert_eq!(admin_get(&g, "/ready").await.status, 200);
    let r = admin_post(&g, "/healthcheck/fail").await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let r = admin_get(&g, "/ready").await;
    assert_eq!((r.status, text(&r).as_str()), (503, "failing\n"));
    assert_eq!(
        admin_get(&g, "/healthz").await.status,
        200,
        "alive all the same"
    );
    for _ in 0..20 {
        assert_eq!(
            get(g.addr, "/?length=10").await.status,
            200,
            "still serving"
        );
    }
    let m = metrics_text(&g).await;
    assert_eq!(metric(&m, "keymaster_ready_failing "), 1.0, "{m}");
    // A simple (cross-site) POST may not flip it.
    let mut c = Client::connect(g.admin).await;
    let simple = http::Request::post("/healthcheck/ok")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(c.send(simple).await.status, 403);
    assert_eq!(admin_get(&g, "/ready").await.status, 503);
    assert_eq!(admin_post(&g, "/healthcheck/ok").await.status, 200);
    let r = admin_get(&g, "/ready").await;
    assert_eq!((r.status, text(&r).as_str()), (200, "ready\n"));
    assert_eq!(
        metric(&metrics_text(&g).await, "keymaster_ready_failing "),
        0.0
    );
    let r = admin_get(&g, "/healthcheck/fail").await;
    assert_eq!(r.status, 405, "GET does not change it");
}

/// What an SRE's alerts need from the start: the build, the process (CPU, memory,
/// descriptors), and the reload series at zero with the time the config was applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_build_and_reload_series_exist_from_the_start() {
    let (g, _s) = gateway_with_stub();
    let m = metrics_text(&g).await;
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        metric(
            &m,
            &format!("keymaster_build_info{{version=\"{version}\"}}")
        ),
        1.0,
        "{m}"
    );
    assert!(
        metric(&m, "keymaster_process_resident_memory_bytes ") > 1e6,
        "{m}"
    );
    assert!(metric(&m, "keymaster_process_open_fds ") >= 3.0, "{m}");
    assert!(m.contains("keymaster_process_cpu_seconds_total "), "{m}");
    for result in ["ok", "rejected"] {
        let series = format!("keymaster_config_reloads_total{{result=\"{result}\"}} 0");
        assert!(m.contains(&series), "{series} present at zero: {m}");
    }
    let applied = metric(&m, "keymaster_config_last_applied_timestamp_seconds ");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (now - applied).abs() < 60.0,
        "applied at start: {applied} vs {now}"
    );
}
