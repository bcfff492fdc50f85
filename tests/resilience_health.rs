//! Origin health end to end: three real origins under continuous load, one killed and
//! restarted on the same port (retries keep every idempotent request succeeding; the dead one
//! is ejected within the configured failures and readmitted by the active checks), fail
//! closed when every server is unhealthy, the checks following reloads, and every attempt in
//! the access log.

mod support;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::*;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// An in-process HTTP/1 origin that can be killed (listener and every connection closed)
/// and restarted on the same port. `/health` answers 200; everything else answers
/// `status` with the origin's name as the body, counted in `hits`.
struct Origin {
    addr: SocketAddr,
    name: &'static str,
    status: u16,
    hits: Arc<AtomicUsize>,
    task: Option<JoinHandle<()>>,
}

impl Origin {
    async fn start(name: &'static str, status: u16) -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut o = Origin {
            addr: listener.local_addr().unwrap(),
            name,
            status,
            hits: Arc::default(),
            task: None,
        };
        o.serve(listener);
        o
    }

    fn serve(&mut self, listener: TcpListener) {
        let (name, status, hits) = (self.name, self.status, self.hits.clone());
        self.task = Some(tokio::spawn(async move {
            // Dropping the set (when this task is aborted) closes every connection.
            let mut conns = JoinSet::new();
            while let Ok((s, _)) = listener.accept().await {
                let hits = hits.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let health = req.uri().path() == "/health";
                        if !health {
                            hits.fetch_add(1, Ordering::SeqCst);
                        }
                        async move {
                            let mut r = http::Response::new(Full::new(Bytes::from(name)));
                            if !health {
                                *r.status_mut() = http::StatusCode::from_u16(status).unwrap();
                            }
                            Ok::<_, std::convert::Infallible>(r)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        }));
    }

    /// Close the listener and every open connection: the port refuses connections.
    async fn kill(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }

    /// Listen again on the same port.
    async fn restart(&mut self) {
        let listener = TcpListener::bind(self.addr)
            .await
            .expect("rebind same port");
        self.serve(listener);
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// The admin `/health/clusters` entry of `server` in the first cluster.
async fn server_health(g: &TestGateway, server: SocketAddr) -> serde_json::Value {
    let r = admin_get(g, "/health/clusters").await;
    assert_eq!(r.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("health JSON");
    v["clusters"][0]["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .find(|s| s["address"] == server.to_string())
        .cloned()
        .unwrap_or_else(|| panic!("{server} not in {v}"))
}

/// Poll the admin API (bounded) until `server`'s availability is `want`.
async fn wait_available(g: &TestGateway, server: SocketAddr, want: bool, limit: Duration) -> bool {
    wait_health(g, server, "available", want, limit).await
}

/// Poll the admin API (bounded) until the `field` of `server`'s health entry is `want`.
async fn wait_health(
    g: &TestGateway,
    server: SocketAddr,
    field: &str,
    want: bool,
    limit: Duration,
) -> bool {
    let end = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < end {
        if server_health(g, server).await[field] == want {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

fn cluster_metric(g: &TestGateway, name: &str) -> f64 {
    metric(
        &g.gateway().metrics_text(),
        &format!("keymaster_{name}{{cluster=\"origin\"}}"),
    )
}

const CONSECUTIVE_FAILURES: usize = 3;
const CLIENTS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_origin_is_ejected_and_readmitted_without_failed_requests() {
    let a = Origin::start("a", 200).await;
    let mut b = Origin::start("b", 200).await;
    let c = Origin::start("c", 200).await;
    let toml = format!(
        r#"{PREAMBLE}
[[routes]]
name = "default"
cluster = "origin"
retry = {{ attempts = 3, backoff_base = "2ms", backoff_max = "10ms" }}

[[clusters]]
name = "origin"
servers = [{{ address = "{}" }}, {{ address = "{}" }}, {{ address = "{}" }}]
balance = "round_robin"
connect_timeout = "1s"
health_check = {{ path = "/health", interval = "50ms", timeout = "1s", healthy_threshold = 2, unhealthy_threshold = 2 }}
outlier_detection = {{ consecutive_failures = {CONSECUTIVE_FAILURES}, base_ejection = "60s" }}
"#,
        a.addr, b.addr, c.addr
    );
    let g = start_gateway(&toml);
    assert!(wait_available(&g, b.addr, true, Duration::from_secs(5)).await);

    // Continuous, bounded load: CLIENTS keep-alive clients in a loop.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let mut load = Vec::new();
    for _ in 0..CLIENTS {
        let (stop, done, failures, addr) = (stop.clone(), done.clone(), failures.clone(), g.addr);
        load.push(tokio::spawn(async move {
            let mut client = Client::connect(addr).await;
            for _ in 0..100_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let r = client.get("/").await;
                if r.status != 200 {
                    failures.lock().unwrap().push((r.status, r.body));
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let progress = |n: usize| {
        let done = done.clone();
        async move {
            let target = done.load(Ordering::SeqCst) + n;
            eventually(Duration::from_secs(20), || {
                done.load(Ordering::SeqCst) >= target
            })
            .await
        }
    };
    assert!(progress(60).await, "load runs");
    assert!(b.hits() > 0, "b serves before it is killed");

    b.kill().await;
    let failed_before = cluster_metric(&g, "upstream_connect_failures_total");
    assert!(
        wait_available(&g, b.addr, false, Duration::from_secs(10)).await,
        "b is taken out of the balancing set"
    );
    // Ejected within the configured consecutive failures (plus one in flight per client).
    assert!(progress(60).await);
    let failed = cluster_metric(&g, "upstream_connect_failures_total") - failed_before;
    assert!(
        failed <= (CONSECUTIVE_FAILURES + CLIENTS) as f64,
        "{failed} connect failures before b left the set"
    );
    let h = server_health(&g, b.addr).await;
    assert_eq!(h["available"], false, "{h}");
    let metrics = g.gateway().metrics_text();
    let gauge = format!(
        "keymaster_upstream_server_healthy{{cluster=\"origin\",server=\"{}\"}} 0",
        b.addr
    );
    assert!(metrics.contains(&gauge), "{gauge} in\n{metrics}");

    // A reload keeps the verdict: health lives on the origin identity, not the version.
    // The active checks first mark b down too (two failed checks 50ms apart), so neither
    // verdict can change between the two readings; a reload that started the server afresh
    // would show it actively healthy (a new server's state) again.
    assert!(
        wait_health(&g, b.addr, "active_healthy", false, Duration::from_secs(10)).await,
        "the active checks mark b down"
    );
    let config = keymaster_config::load_str(&toml, "<test>").unwrap();
    let before = server_health(&g, b.addr).await;
    assert_eq!(before["active_healthy"], false, "{before}");
    g.gateway().reload(config).expect("reload");
    let after = server_health(&g, b.addr).await;
    assert_eq!(after["available"], false, "{after}");
    assert_eq!(after["ejections"], before["ejections"]);
    assert_eq!(after["active_healthy"], before["active_healthy"]);

    b.restart().await;
    assert!(
        wait_available(&g, b.addr, true, Duration::from_secs(10)).await,
        "the active checks readmit b (its 60s ejection ends early)"
    );
    let back = b.hits();
    assert!(progress(60).await);
    assert!(
        eventually(Duration::from_secs(10), || b.hits() > back).await,
        "b gets traffic again"
    );

    stop.store(true, Ordering::SeqCst);
    for t in load {
        t.await.expect("client task");
    }
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} failed requests of {}: {:?}",
        failures.len(),
        done.load(Ordering::SeqCst),
        &failures[..failures.len().min(5)]
    );
    assert!(a.hits() > 0 && c.hits() > 0);
    // Requests that met the dead server went to another one (never sent: outside the
    // retry budget, whose default here allows three retries in flight). Each meeting is a
    // refused connect (the active checks' probes are not counted there, and a and c never
    // refuse); how many there were depends on how soon the active checks took b out, so
    // each one is required to have become an unsent retry rather than a count assumed.
    let refused = cluster_metric(&g, "upstream_connect_failures_total");
    let unsent = cluster_metric(&g, "upstream_unsent_retries_total");
    assert!(
        unsent >= refused,
        "{refused} refused connects to b, {unsent} unsent retries"
    );
}

/// Checks every 20 ms; one failure turns a server unavailable.
const FAST_CHECK: &str = r#"health_check = { path = "/health", interval = "20ms", timeout = "500ms", unhealthy_threshold = 1 }"#;

/// A gateway whose one route goes to the cluster `origin` of the one server `addr`, with
/// `cluster` (TOML lines) added to the cluster's table.
fn one_server(addr: SocketAddr, cluster: &str) -> String {
    format!(
        r#"{PREAMBLE}
[[routes]]
name = "default"
cluster = "origin"

[[clusters]]
name = "origin"
servers = [{{ address = "{addr}" }}]
{cluster}
"#
    )
}

/// The health-check thread sleeps between config versions and is woken by each swap: a
/// reload that adds `health_check` starts the probes (the dead server turns unavailable),
/// one that removes it stops them and clears their verdict.
#[tokio::test]
async fn a_reload_starts_and_stops_the_health_checks() {
    let mut dead = Origin::start("dead", 200).await;
    let addr = dead.addr;
    dead.kill().await;
    let g = start_gateway(&one_server(addr, ""));
    let reload = |toml: &str| {
        let config = keymaster_config::load_str(toml, "<test>").unwrap();
        g.gateway().reload(config).expect("reload");
    };
    assert_eq!(server_health(&g, addr).await["available"], true);
    reload(&one_server(addr, FAST_CHECK));
    assert!(
        wait_available(&g, addr, false, Duration::from_secs(10)).await,
        "no check ran after the reload that added them"
    );
    let checks_counted = || {
        let (passed, failed) = health_checks(&g, "origin");
        passed + failed
    };
    let checks = checks_counted();
    reload(&one_server(addr, ""));
    assert!(
        wait_available(&g, addr, true, Duration::from_secs(10)).await,
        "the checks' verdict outlived the reload that removed them"
    );
    // Stopped: no more checks are counted.
    let stopped = checks_counted();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(checks_counted(), stopped);
    assert!(
        stopped >= checks && checks >= 1.0,
        "{checks} then {stopped}"
    );
}

#[tokio::test]
async fn all_unhealthy_fails_closed_or_open_as_configured() {
    let mut dead = Origin::start("dead", 200).await;
    let addr = dead.addr;
    dead.kill().await;
    let cfg = |mode: &str| one_server(addr, &format!("all_unhealthy = \"{mode}\"\n{FAST_CHECK}"));
    let g = start_gateway(&cfg("fail_closed"));
    assert!(wait_available(&g, addr, false, Duration::from_secs(10)).await);
    let connects = cluster_metric(&g, "upstream_connects_total");
    let r = get(g.addr, "/").await;
    assert_eq!(r.status, 503, "{:?}", r.body);
    assert!(String::from_utf8_lossy(&r.body).contains("no healthy server"));
    assert_eq!(
        cluster_metric(&g, "upstream_connects_total"),
        connects,
        "fail closed: the origin is not contacted"
    );
    // The same state after a reload to fail open: the gateway tries the server anyway.
    let config = keymaster_config::load_str(&cfg("fail_open"), "<test>").unwrap();
    g.gateway().reload(config).expect("reload");
    let r = get(g.addr, "/").await;
    assert_eq!(r.status, 502, "fail open tries the dead server");
    assert_eq!(server_health(&g, addr).await["available"], false);
}

#[tokio::test]
async fn every_attempt_is_in_the_access_log() {
    let bad = Origin::start("bad", 503).await;
    let good = Origin::start("good", 200).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let g = start_gateway(&format!(
        r#"{PREAMBLE}
[access_log]
enabled = true
path = "{}"

[[routes]]
name = "default"
cluster = "origin"
retry = {{ attempts = 2, backoff_base = "1ms", backoff_max = "1ms" }}

[[clusters]]
name = "origin"
servers = [{{ address = "{}" }}, {{ address = "{}" }}]
balance = "round_robin"
"#,
        log.display(),
        bad.addr,
        good.addr
    ));
    // Round robin starts at the first server: 503, then a retry on the other one.
    let r = get(g.addr, "/").await;
    assert_eq!((r.status, &r.body[..]), (200, &b"good"[..]));
    let mut line = String::new();
    assert!(
        eventually(Duration::from_secs(5), || {
            line = std::fs::read_to_string(&log).unwrap_or_default();
            line.ends_with('\n')
        })
        .await
    );
    let v: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    let tries = v["tries"].as_array().expect("tries");
    assert_eq!(tries.len(), 2, "{v}");
    assert_eq!(tries[0]["origin"], bad.addr.to_string());
    assert_eq!(tries[0]["outcome"], "503");
    assert_eq!(tries[1]["origin"], good.addr.to_string());
    assert_eq!(tries[1]["outcome"], "200");
    assert!(tries[0]["ms"].as_f64().is_some());
    assert_eq!(v["attempts"], 2);
    assert_eq!(v["origin"], good.addr.to_string());
    assert_eq!((bad.hits(), good.hits()), (1, 1));
}
