//! An origin's death under real concurrency loses no GET: 64 keep-alive clients through a
//! two-worker gateway to three slow origins (so about twenty requests are in flight on each
//! when one dies), and one of them killed and restarted on the same port several times.
//! Once with the default retry policy and budget, once with a route retry policy.
//!
//! A kill closes the origin's listener and every connection it has, as the kernel does for a
//! killed process: requests it was working on see their connection close before any answer,
//! pooled connections to it close, and new connections are refused.

mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

const CLIENTS: usize = 64;
const KILLS: usize = 4;
/// How long each origin works on a request.
const DELAY: Duration = Duration::from_millis(30);

/// The two tests load the machine alone, one after the other.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Counts of one origin, shared with its connection tasks.
#[derive(Default)]
struct Counts {
    /// Requests answered (health checks not counted).
    served: AtomicUsize,
    /// Requests being worked on.
    in_flight: AtomicUsize,
    /// Connections accepted.
    accepted: AtomicUsize,
    /// Connections that have not finished writing their first response.
    fresh: Mutex<usize>,
}

/// Takes a count down when dropped (a connection task may be dropped mid-request by a kill).
struct Held<'a>(&'a AtomicUsize);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A keep-alive HTTP/1.1 origin that answers after `DELAY` (`/health` at once) and can be
/// killed and restarted on the same port.
struct Origin {
    addr: SocketAddr,
    counts: Arc<Counts>,
    task: Option<JoinHandle<()>>,
    kill: Option<oneshot::Sender<()>>,
}

impl Origin {
    async fn start() -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut o = Origin {
            addr: listener.local_addr().unwrap(),
            counts: Arc::default(),
            task: None,
            kill: None,
        };
        o.serve(listener);
        o
    }

    fn serve(&mut self, listener: TcpListener) {
        let counts = self.counts.clone();
        let (kill, mut killed) = oneshot::channel();
        self.kill = Some(kill);
        self.task = Some(tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    _ = &mut killed => break,
                    accepted = listener.accept() => {
                        let Ok((s, _)) = accepted else { break };
                        counts.accepted.fetch_add(1, Ordering::SeqCst);
                        *counts.fresh.lock().unwrap() += 1;
                        conns.spawn(connection(s, counts.clone()));
                        while conns.try_join_next().is_some() {}
                    }
                }
            }
            // The port refuses connections first, then every connection closes (a FIN, or
            // a reset where a request lies unread), as the connection tasks are dropped.
            drop(listener);
            conns.shutdown().await;
        }));
    }

    /// Kill: close the listener and every connection. With `warm_only`, wait (bounded) for a
    /// moment when every connection has answered a request before: a request that is the
    /// first on its connection reached the origin on a connection the gateway never used
    /// before, and retrying it is the route policy's decision. Returns the requests that were
    /// in flight.
    async fn kill(&mut self, warm_only: bool) -> usize {
        let end = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            // The kill is sent under the lock, so no connection turns fresh in between; the
            // lock is released before anything is awaited.
            let killed = {
                let fresh = self.counts.fresh.lock().unwrap();
                let now = tokio::time::Instant::now();
                (!warm_only || *fresh == 0 || now >= end).then(|| {
                    let n = self.counts.in_flight.load(Ordering::SeqCst);
                    let _ = self.kill.take().expect("running").send(());
                    n
                })
            };
            if let Some(n) = killed {
                let _ = self.task.take().expect("running").await;
                // Every connection is gone, those dropped before their first answer too.
                *self.counts.fresh.lock().unwrap() = 0;
                return n;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn restart(&mut self) {
        let listener = TcpListener::bind(self.addr).await.expect("rebind");
        self.serve(listener);
    }

    fn served(&self) -> usize {
        self.counts.served.load(Ordering::SeqCst)
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

async fn connection(mut s: TcpStream, counts: Arc<Counts>) {
    let mut fresh = true;
    let mut carry = Vec::new();
    while let Some(head) = read_head(&mut s, &mut carry).await {
        let health = head.starts_with("GET /health ");
        let held = (!health).then(|| {
            counts.in_flight.fetch_add(1, Ordering::SeqCst);
            Held(&counts.in_flight)
        });
        if !health {
            tokio::time::sleep(DELAY).await;
        }
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        let written = s.write_all(ok).await.is_ok();
        if fresh {
            fresh = false;
            *counts.fresh.lock().unwrap() -= 1;
        }
        if held.is_some() && written {
            counts.served.fetch_add(1, Ordering::SeqCst);
        }
        drop(held);
        if !written {
            return;
        }
    }
    if fresh {
        *counts.fresh.lock().unwrap() -= 1;
    }
}

/// What the clients saw.
#[derive(Default)]
struct Outcome {
    done: AtomicUsize,
    failures: Mutex<Vec<String>>,
}

/// One keep-alive client: GETs in a loop until `stop`; any answer but 200, and any failed
/// exchange, is a failure (then it reconnects).
async fn client(addr: SocketAddr, stop: Arc<AtomicBool>, out: Arc<Outcome>) {
    let mut sender = None;
    while !stop.load(Ordering::SeqCst) {
        if sender.is_none() {
            let tcp = TcpStream::connect(addr).await.expect("connect to gateway");
            let (s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                .await
                .expect("handshake");
            tokio::spawn(conn);
            sender = Some(s);
        }
        let Some(s) = sender.as_mut() else { continue };
        let req = http::Request::get("/")
            .header(http::header::HOST, "test")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let answer = match s.send_request(req).await {
            Ok(r) => {
                let status = r.status();
                let body = r.into_body().collect().await.map(|b| b.to_bytes());
                match body {
                    Ok(b) if status == 200 && b == "ok" => None,
                    Ok(b) => Some(format!("{status} {}", String::from_utf8_lossy(&b))),
                    Err(e) => Some(format!("{status} body: {e}")),
                }
            }
            Err(e) => Some(format!("exchange: {e}")),
        };
        out.done.fetch_add(1, Ordering::SeqCst);
        if let Some(f) = answer {
            out.failures.lock().unwrap().push(f);
            sender = None;
        }
    }
}

fn cluster_metric(g: &TestGateway, name: &str) -> f64 {
    metric(
        &g.gateway().metrics_text(),
        &format!("keymaster_{name}{{cluster=\"origin\"}}"),
    )
}

async fn available(g: &TestGateway, server: SocketAddr) -> bool {
    let r = admin_get(g, "/health/clusters").await;
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("health JSON");
    v["clusters"][0]["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .any(|s| s["address"] == server.to_string() && s["available"] == true)
}

/// Wait (bounded) until `o` has served `n` more requests.
async fn serves(o: &Origin, n: usize) -> bool {
    let target = o.served() + n;
    let counts = o.counts.clone();
    eventually(Duration::from_secs(15), || {
        counts.served.load(Ordering::SeqCst) >= target
    })
    .await
}

/// The scenario: load, `KILLS` kills of one origin (each restarted once it was out of the
/// balancing set for a moment), then every GET must have been answered 200.
async fn kill_under_load(route_retry: &str, warm_only: bool) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let a = Origin::start().await;
    let b = Origin::start().await;
    let mut victim = Origin::start().await;
    let g = start_gateway(&format!(
        r#"
[server]
workers = 2
drain_timeout = "5s"

[admin]
listen = "127.0.0.1:0"

[[listeners]]
name = "main"
address = "127.0.0.1:0"

[[routes]]
name = "default"
cluster = "origin"
{route_retry}

[[clusters]]
name = "origin"
servers = [{{ address = "{}" }}, {{ address = "{}" }}, {{ address = "{}" }}]
balance = "round_robin"
connect_timeout = "1s"
health_check = {{ path = "/health", interval = "50ms", timeout = "1s", healthy_threshold = 2, unhealthy_threshold = 2 }}
outlier_detection = {{ consecutive_failures = 3, base_ejection = "60s" }}
"#,
        a.addr, b.addr, victim.addr
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let out = Arc::new(Outcome::default());
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| tokio::spawn(client(g.addr, stop.clone(), out.clone())))
        .collect();
    assert!(serves(&victim, 300).await, "the load reaches the victim");
    let mut in_flight = Vec::new();
    for _ in 0..KILLS {
        in_flight.push(victim.kill(warm_only).await);
        // Dead for a while under load, then back once the checks readmit it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        victim.restart().await;
        let mut back = false;
        for _ in 0..500 {
            back = available(&g, victim.addr).await;
            if back {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(back, "the checks readmit the victim");
        assert!(serves(&victim, 300).await, "the victim serves again");
    }
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.expect("client task");
    }
    let failures = out.failures.lock().unwrap();
    let done = out.done.load(Ordering::SeqCst);
    let unsent = cluster_metric(&g, "upstream_unsent_retries_total");
    let report = format!(
        "{} of {done} GETs failed; in flight on the victim at each kill: {in_flight:?}; \
         victim connections: {}; unsent retries {unsent}; retries {}; budget exhausted {}; \
         fast ejections {}; first failures: {:?}",
        failures.len(),
        victim.counts.accepted.load(Ordering::SeqCst),
        cluster_metric(&g, "upstream_retries_total"),
        cluster_metric(&g, "upstream_retry_budget_exhausted_total"),
        cluster_metric(&g, "upstream_fast_ejections_total"),
        &failures[..failures.len().min(5)],
    );
    eprintln!("{report}");
    // The race is hit: many requests were at the victim when it died.
    assert!(
        in_flight.iter().sum::<usize>() >= KILLS * 5,
        "too light: {report}"
    );
    assert!(failures.is_empty(), "{report}");
    assert!(unsent >= 1.0, "{report}");
    assert!(a.served() > 0 && b.served() > 0);
}

/// The default retry policy (one attempt) and budget: never-sent requests, and GETs the
/// keep-alive race resends, go to another server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_killed_under_load_fails_no_get_with_the_default_policy() {
    kill_under_load("", true).await;
}

/// The operator's route policy, killed at any moment: a GET the dying origin had on a new
/// connection is retried by the policy, within the default budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_killed_under_load_fails_no_get_with_a_retry_policy() {
    kill_under_load("retry = { attempts = 3 }", false).await;
}
