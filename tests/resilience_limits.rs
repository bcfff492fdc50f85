//! Protection end to end, with requests held open at gated origins so counts are exact: the
//! retry budget caps origin attempts during a full outage, per-cluster caps answer 503 with
//! Retry-After past the cap and queue, load shedding sheds low priorities first while the
//! admin listener answers, and a request body is retried only when it fit the replay buffer.

mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::*;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Origins that hold requests whose path starts with `hold` until the gate opens, then
/// answer `status`; other requests are answered at once with 200. `arrived` counts every
/// request (held or not) across all of the origins' listeners.
struct Gated {
    addrs: Vec<SocketAddr>,
    arrived: Arc<AtomicUsize>,
    held: Arc<AtomicUsize>,
    gate: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Gated {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Gated {
    async fn start(listeners: usize, hold: &'static str, status: u16) -> Gated {
        let (gate, rx) = watch::channel(false);
        let arrived = Arc::new(AtomicUsize::new(0));
        let held = Arc::new(AtomicUsize::new(0));
        let mut addrs = Vec::new();
        let mut tasks = Vec::new();
        for _ in 0..listeners {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            addrs.push(l.local_addr().unwrap());
            let (rx, arrived, held) = (rx.clone(), arrived.clone(), held.clone());
            tasks.push(tokio::spawn(async move {
                while let Ok((s, _)) = l.accept().await {
                    let (rx, arrived, held) = (rx.clone(), arrived.clone(), held.clone());
                    tokio::spawn(async move {
                        let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                            let (mut rx, arrived, held) =
                                (rx.clone(), arrived.clone(), held.clone());
                            async move {
                                arrived.fetch_add(1, Ordering::SeqCst);
                                let path = req.uri().path().to_string();
                                let body = req.into_body().collect().await.map(|c| c.to_bytes());
                                let mut code = 200;
                                if path.starts_with(hold) {
                                    held.fetch_add(1, Ordering::SeqCst);
                                    let _ = rx.wait_for(|open| *open).await;
                                    code = status;
                                }
                                let mut r =
                                    http::Response::new(Full::new(body.unwrap_or_default()));
                                *r.status_mut() = http::StatusCode::from_u16(code).unwrap();
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
        Gated {
            addrs,
            arrived,
            held,
            gate,
            tasks,
        }
    }

    fn servers_toml(&self) -> String {
        let list: Vec<String> = self
            .addrs
            .iter()
            .map(|a| format!("{{ address = \"{a}\" }}"))
            .collect();
        format!("servers = [{}]", list.join(", "))
    }

    fn arrived(&self) -> usize {
        self.arrived.load(Ordering::SeqCst)
    }

    async fn wait_held(&self, n: usize) {
        let held = self.held.clone();
        assert!(
            eventually(Duration::from_secs(10), || held.load(Ordering::SeqCst) >= n).await,
            "{n} requests held at the origin"
        );
    }

    fn open(&self) {
        self.gate.send_replace(true);
    }
}

fn cluster_metric(g: &TestGateway, name: &str) -> f64 {
    metric(
        &g.gateway().metrics_text(),
        &format!("keymaster_{name}{{cluster=\"origin\"}}"),
    )
}

async fn send(addr: SocketAddr, method: &str, path: &str, body: &'static [u8]) -> Reply {
    let mut c = Client::connect(addr).await;
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .body(Full::new(Bytes::from_static(body)))
        .unwrap();
    c.send(req).await
}

/// A full outage (every server answers 503): retries are capped by the budget, so origin
/// attempts stay near one per request instead of one per allowed attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_budget_caps_origin_load_in_a_full_outage() {
    const REQUESTS: usize = 10;
    const ATTEMPTS: usize = 3;
    let origin = Gated::start(3, "/", 503).await;
    let g = start_gateway(&format!(
        r#"{PREAMBLE}
[[routes]]
name = "default"
cluster = "origin"
retry = {{ attempts = {ATTEMPTS}, backoff_base = "1s", backoff_max = "1s" }}

[[clusters]]
name = "origin"
{}
outlier_detection = {{ consecutive_failures = 0 }}
retry_budget = {{ percent = 20, min_retries = 1 }}
"#,
        origin.servers_toml()
    ));
    let clients: Vec<_> = (0..REQUESTS)
        .map(|_| tokio::spawn(get(g.addr, "/")))
        .collect();
    // Every request is at an origin before any fails: 10 active requests.
    origin.wait_held(REQUESTS).await;
    origin.open();
    for c in clients {
        assert_eq!(c.await.unwrap().status, 503);
    }
    // 20% of 10 active requests: two retries in flight at most when the 503s arrive (each
    // retry holds its budget token through its back-off); each of those may retry once
    // more. Without a budget this outage would cost REQUESTS * ATTEMPTS = 30 attempts.
    let attempts = origin.arrived();
    let budget = REQUESTS * 20 / 100;
    assert!(
        (REQUESTS + 1..=REQUESTS + budget * (ATTEMPTS - 1)).contains(&attempts),
        "{attempts} origin attempts for {REQUESTS} requests"
    );
    assert!(
        cluster_metric(&g, "upstream_retry_budget_exhausted_total") >= (REQUESTS - budget) as f64
    );
    assert_eq!(
        cluster_metric(&g, "upstream_retries_total") as usize,
        attempts - REQUESTS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_cap_queues_then_answers_503_with_retry_after() {
    let origin = Gated::start(1, "/", 200).await;
    let g = start_gateway(&format!(
        r#"{PREAMBLE}
[[routes]]
name = "default"
cluster = "origin"

[[clusters]]
name = "origin"
{}
limits = {{ max_requests = 2, max_pending = 1, queue_timeout = "30s", retry_after = "3s" }}
"#,
        origin.servers_toml()
    ));
    let held: Vec<_> = (0..2).map(|_| tokio::spawn(get(g.addr, "/a"))).collect();
    origin.wait_held(2).await;
    // The third waits in the queue (seen in the admin API), the fourth is refused at once.
    let queued = tokio::spawn(get(g.addr, "/b"));
    let mut pending = 0;
    for _ in 0..500 {
        let r = admin_get(&g, "/health/clusters").await;
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        pending = v["clusters"][0]["pending_requests"].as_u64().unwrap();
        if pending == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(pending, 1, "one request waits in the queue");
    let refused = get(g.addr, "/c").await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.headers.get(http::header::RETRY_AFTER).unwrap(), "3");
    assert_eq!(
        origin.arrived(),
        2,
        "neither the queued nor the refused reached the origin"
    );
    assert_eq!(cluster_metric(&g, "upstream_overflow_total"), 1.0);
    origin.open();
    for h in held {
        assert_eq!(h.await.unwrap().status, 200);
    }
    let q = queued.await.unwrap();
    assert_eq!(
        (q.status, origin.arrived()),
        (200, 3),
        "the queued request ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_sheds_low_priority_first_and_admin_stays_responsive() {
    let origin = Gated::start(1, "/hold", 200).await;
    let g = start_gateway(&format!(
        r#"{PREAMBLE}
[load_shedding]
max_in_flight = 5
retry_after = "2s"

[[routes]]
name = "low"
cluster = "origin"
shed_priority = "low"
match = {{ path_prefix = "/low" }}

[[routes]]
name = "high"
cluster = "origin"
shed_priority = "high"
match = {{ path_prefix = "/high" }}

[[routes]]
name = "normal"
cluster = "origin"
priority = -1

[[clusters]]
name = "origin"
{}
"#,
        origin.servers_toml()
    ));
    let mut held: Vec<_> = (0..3).map(|_| tokio::spawn(get(g.addr, "/hold"))).collect();
    origin.wait_held(3).await;
    // 3 held + this one = 4 of 5 in flight (80%): low is shed, normal and high pass.
    let low = get(g.addr, "/low").await;
    assert_eq!(low.status, 503);
    assert_eq!(low.headers.get(http::header::RETRY_AFTER).unwrap(), "2");
    assert_eq!(get(g.addr, "/normal").await.status, 200);
    assert_eq!(get(g.addr, "/high").await.status, 200);
    held.push(tokio::spawn(get(g.addr, "/hold")));
    origin.wait_held(4).await;
    // 5 of 5 (100%): normal is shed too, high still passes.
    assert_eq!(get(g.addr, "/normal").await.status, 503);
    assert_eq!(get(g.addr, "/high").await.status, 200);
    // The admin listener answers on its own thread.
    assert_eq!(admin_get(&g, "/healthz").await.status, 200);
    let text = metrics_text(&g).await;
    assert_eq!(metric(&text, "keymaster_shed_total{priority=\"low\"}"), 1.0);
    assert_eq!(
        metric(&text, "keymaster_shed_total{priority=\"normal\"}"),
        1.0
    );
    assert_eq!(
        metric(&text, "keymaster_shed_total{priority=\"high\"}"),
        0.0
    );
    origin.open();
    for h in held {
        assert_eq!(h.await.unwrap().status, 200);
    }
    // Load gone: nothing is shed.
    assert_eq!(get(g.addr, "/low").await.status, 200);
}

/// A body is resent on retry only when it fit the replay buffer.
#[tokio::test]
async fn a_body_is_retried_only_if_it_fit_the_replay_buffer() {
    let bad = Gated::start(1, "/", 503).await;
    bad.open();
    let good = Gated::start(1, "/never-held", 200).await;
    let g = start_gateway(&format!(
        r#"{PREAMBLE}
[[routes]]
name = "default"
cluster = "origin"
retry = {{ attempts = 2, backoff_base = "1ms", backoff_max = "1ms", replay_buffer = "16B" }}

[[clusters]]
name = "origin"
servers = [{{ address = "{}" }}, {{ address = "{}" }}]
balance = "round_robin"
outlier_detection = {{ consecutive_failures = 0 }}
"#,
        bad.addrs[0], good.addrs[0]
    ));
    // Round robin: the first attempt of each request goes to `bad` (503), the retry to `good`.
    let small = send(g.addr, "PUT", "/x", b"0123456789").await;
    assert_eq!((small.status, &small.body[..]), (200, &b"0123456789"[..]));
    assert_eq!((bad.arrived(), good.arrived()), (1, 1));
    // Larger than the buffer: streamed, so not retried; the origin's 503 is the answer.
    let big = send(g.addr, "PUT", "/x", b"0123456789abcdefXYZ").await;
    assert_eq!(big.status, 503);
    assert_eq!((bad.arrived(), good.arrived()), (2, 1));
    // The cursor is on `good` now: one request there puts it back on `bad`.
    assert_eq!(send(g.addr, "GET", "/y", b"").await.status, 200);
    // Not idempotent: a 503 is passed on even with a small body.
    let post = send(g.addr, "POST", "/x", b"abc").await;
    assert_eq!(post.status, 503);
    assert_eq!((bad.arrived(), good.arrived()), (3, 2));
}

/// A hanging attempt is cut by the per-try timeout and retried on another server, well
/// inside the response header timeout.
#[tokio::test]
async fn the_per_try_timeout_moves_a_hanging_request_to_another_server() {
    let hang = Gated::start(1, "/", 200).await; // never opened
    let good = Gated::start(1, "/never-held", 200).await;
    let g = start_gateway(&format!(
        r#"{PREAMBLE}
[[routes]]
name = "default"
cluster = "origin"
response_header_timeout = "60s"
retry = {{ attempts = 2, per_try_timeout = "200ms", backoff_base = "1ms", backoff_max = "1ms" }}

[[clusters]]
name = "origin"
servers = [{{ address = "{}" }}, {{ address = "{}" }}]
balance = "round_robin"
"#,
        hang.addrs[0], good.addrs[0]
    ));
    let start = std::time::Instant::now();
    let r = send(g.addr, "GET", "/x", b"").await;
    assert_eq!(r.status, 200);
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    assert_eq!((hang.arrived(), good.arrived()), (1, 1));
    // Without retries left the per-try timeout is the answer: 504.
    let r = send(g.addr, "POST", "/x", b"").await;
    assert_eq!(r.status, 504, "POST is not retried after a timeout");
    assert_eq!(hang.arrived(), 2);
}
