//! A request that was never sent goes to another server at once, with no retry policy and
//! no budget token (nginx's `proxy_next_upstream error`); a refused connection ejects its
//! server at once; a reset before the response head is retried as the route's policy says;
//! and a GET in flight on a pooled connection to a server that dies goes to another server,
//! while a POST there is not sent again.

mod support;

use bytes::Bytes;
use http_body_util::Full;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

fn cluster_metric(g: &TestGateway, name: &str) -> f64 {
    metric(
        &g.gateway().metrics_text(),
        &format!("keymaster_{name}{{cluster=\"origin\"}}"),
    )
}

/// An origin answering every request with 200 and `name`, after reading its body. Records
/// each request line with its body.
async fn named_origin(name: &'static str) -> (RawOrigin, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let o = raw_origin(move |mut s, _| {
        let log = log.clone();
        async move {
            let mut carry = Vec::new();
            while let Some(head) = read_head(&mut s, &mut carry).await {
                let cl: usize = head_header(&head, "content-length")
                    .map(|v| v.parse().unwrap())
                    .unwrap_or(0);
                let body = read_exact_body(&mut s, &mut carry, cl).await;
                let line = head.split("\r\n").next().unwrap_or_default();
                log.lock()
                    .unwrap()
                    .push(format!("{line} {}", String::from_utf8_lossy(&body)));
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{name}",
                    name.len()
                );
                if s.write_all(resp.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (o, seen)
}

/// `dead` (nothing listens: connections are refused) and `good`, round robin from `dead`.
fn two_servers(dead: SocketAddr, good: SocketAddr, route: &str, cluster: &str) -> String {
    format!(
        r#"{PREAMBLE}
[[routes]]
name = "default"
cluster = "origin"
{route}

[[clusters]]
name = "origin"
servers = [{{ address = "{dead}" }}, {{ address = "{good}" }}]
balance = "round_robin"
connect_timeout = "1s"
{cluster}
"#
    )
}

/// Without any retry policy, a refused connection sends the request to the other server,
/// and the refusal ejects the dead server at once (fewer than `consecutive_failures`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_goes_to_another_server_and_ejects_the_dead_one() {
    let (dead, _dead_held) = closed_addr();
    let (good, _) = named_origin("good").await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let mut toml = two_servers(dead, good.addr, "", "");
    toml = toml.replacen(
        "[[routes]]",
        &format!(
            "[access_log]\nenabled = true\npath = \"{}\"\n\n[[routes]]",
            log.display()
        ),
        1,
    );
    let g = start_gateway(&toml);
    let mut c = Client::connect(g.addr).await;
    let r = c.get("/first").await;
    assert_eq!((r.status, &r.body[..]), (200, &b"good"[..]), "{:?}", r.body);
    assert_eq!(cluster_metric(&g, "upstream_unsent_retries_total"), 1.0);
    assert_eq!(cluster_metric(&g, "upstream_fast_ejections_total"), 1.0);
    assert_eq!(cluster_metric(&g, "upstream_ejections_total"), 1.0);
    assert_eq!(cluster_metric(&g, "upstream_retries_total"), 0.0);
    assert_eq!(
        cluster_metric(&g, "upstream_retry_budget_exhausted_total"),
        0.0
    );
    // Ejected after one refusal, not the default five failures: nothing goes there now.
    let v: serde_json::Value =
        serde_json::from_slice(&admin_get(&g, "/health/clusters").await.body).unwrap();
    let d = &v["clusters"][0]["servers"][0];
    assert_eq!(d["address"], dead.to_string());
    assert_eq!(
        (d["ejected"].as_bool(), d["ejections"].as_u64()),
        (Some(true), Some(1))
    );
    for _ in 0..4 {
        assert_eq!(c.get("/next").await.status, 200);
    }
    assert_eq!(cluster_metric(&g, "upstream_connect_failures_total"), 1.0);
    // The access log shows both tries of the first request.
    let mut text = String::new();
    assert!(
        eventually(Duration::from_secs(5), || {
            text = std::fs::read_to_string(&log).unwrap_or_default();
            text.lines().count() >= 5
        })
        .await
    );
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let tries = first["tries"].as_array().expect("tries");
    assert_eq!(tries.len(), 2, "{first}");
    assert_eq!(tries[0]["origin"], dead.to_string());
    assert_eq!(tries[0]["outcome"], "origin_connectivity");
    assert_eq!(tries[1]["origin"], good.addr.to_string());
    assert_eq!(tries[1]["outcome"], "200");
    // Two attempts, as the tries say; one request written (the refused connect sent none).
    assert_eq!(
        (
            first["status"].as_u64(),
            first["attempts"].as_u64(),
            first["sends"].as_u64()
        ),
        (Some(200), Some(2), Some(1))
    );
}

/// A never-sent try takes no budget token and no back-off: with a budget that allows no
/// retry at all, every request that meets the dead server still reaches the live one, with
/// its body: buffered for a route with retries, streamed on one without (nothing of it was
/// read before the connection was refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_sent_tries_need_no_budget_and_keep_their_body() {
    let (dead, _dead_held) = closed_addr();
    let (good, seen) = named_origin("good").await;
    let mut toml = two_servers(
        dead,
        good.addr,
        r#"retry = { attempts = 3, backoff_base = "1s", backoff_max = "1s" }"#,
        // No ejection: every request meets the dead server first (round robin moves on by
        // one for each try).
        "outlier_detection = { consecutive_failures = 0 }\nretry_budget = { percent = 0, min_retries = 0 }",
    );
    toml = toml.replacen(
        "[[routes]]",
        "[[routes]]\nname = \"streamed\"\ncluster = \"origin\"\nmatch = { path_prefix = \"/s\" }\n\n[[routes]]",
        1,
    );
    let g = start_gateway(&toml);
    let mut c = Client::connect(g.addr).await;
    let started = std::time::Instant::now();
    let mut want = Vec::new();
    for path in ["/b0", "/s1", "/b2", "/s3"] {
        let body = format!("body of {path}");
        let req = http::Request::post(path)
            .body(Full::new(Bytes::from(body.clone())))
            .unwrap();
        let r = c.send(req).await;
        assert_eq!((r.status, &r.body[..]), (200, &b"good"[..]), "{path}");
        want.push(format!("POST {path} HTTP/1.1 {body}"));
    }
    assert_eq!(c.get("/get").await.status, 200);
    want.push("GET /get HTTP/1.1 ".to_string());
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "no back-off: {:?}",
        started.elapsed()
    );
    assert_eq!(*seen.lock().unwrap(), want);
    assert_eq!(cluster_metric(&g, "upstream_unsent_retries_total"), 5.0);
    assert_eq!(cluster_metric(&g, "upstream_connect_failures_total"), 5.0);
    assert_eq!(cluster_metric(&g, "upstream_retries_total"), 0.0);
    assert_eq!(
        cluster_metric(&g, "upstream_retry_budget_exhausted_total"),
        0.0
    );
    assert_eq!(cluster_metric(&g, "upstream_fast_ejections_total"), 0.0);
}

/// An origin that reads each request head and closes the connection without answering.
async fn closing_origin() -> RawOrigin {
    raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        let _ = read_head(&mut s, &mut carry).await;
    })
    .await
}

/// A reset before the response head, on a fresh connection, is the route's policy to retry:
/// idempotent methods with attempts left go to another server, a POST does not, and
/// without a policy nothing is retried (the request reached the origin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_before_the_head_is_retried_as_the_route_policy_says() {
    let closer = closing_origin().await;
    let (good, seen) = named_origin("good").await;
    let mut toml = two_servers(
        closer.addr,
        good.addr,
        "",
        "outlier_detection = { consecutive_failures = 0 }",
    );
    toml = toml.replacen(
        "[[routes]]",
        "[[routes]]\nname = \"retry\"\ncluster = \"origin\"\nmatch = { path_prefix = \"/retry\" }\nretry = { attempts = 2, backoff_base = \"1ms\", backoff_max = \"1ms\" }\n\n[[routes]]",
        1,
    );
    let g = start_gateway(&toml);
    let mut c = Client::connect(g.addr).await;
    // Round robin: closer, good, closer, good, ...
    let r = c.get("/retry/get").await;
    assert_eq!((r.status, &r.body[..]), (200, &b"good"[..]));
    assert_eq!(cluster_metric(&g, "upstream_retries_total"), 1.0);
    let post = http::Request::post("/retry/post")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(
        c.send(post).await.status,
        502,
        "a POST that reached the origin"
    );
    assert_eq!(c.get("/filler").await.status, 200);
    assert_eq!(
        c.get("/plain").await.status,
        502,
        "no policy: a GET that reached the origin is not retried"
    );
    assert_eq!(closer.connections(), 3);
    assert_eq!(seen.lock().unwrap().len(), 2);
    assert_eq!(cluster_metric(&g, "upstream_unsent_retries_total"), 0.0);
}

/// An origin that answers requests on keep-alive connections until one asks for `/die`:
/// then it stops listening (the port refuses connections) and closes that connection
/// without answering, like a process killed while it works on a request.
struct DyingOrigin {
    addr: SocketAddr,
    accept: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl Drop for DyingOrigin {
    fn drop(&mut self) {
        if let Some(t) = self.accept.lock().unwrap().take() {
            t.abort();
        }
    }
}

async fn dying_origin() -> DyingOrigin {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accept: Arc<Mutex<Option<JoinHandle<()>>>> = Arc::default();
    let handle = accept.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let handle = handle.clone();
            tokio::spawn(async move {
                let mut carry = Vec::new();
                while let Some(head) = read_head(&mut s, &mut carry).await {
                    if head.contains(" /die ") {
                        let t = handle.lock().unwrap().take();
                        if let Some(t) = t {
                            t.abort();
                            let _ = t.await;
                        }
                        return;
                    }
                    let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndier";
                    if s.write_all(ok).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    *accept.lock().unwrap() = Some(task);
    DyingOrigin { addr, accept }
}

/// A request in flight on a pooled connection when its server dies: the keep-alive race
/// resends it to that server, which refuses; a GET then goes to the live server without a
/// retry policy, a POST is not sent elsewhere (the dead server may have acted on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_in_flight_on_a_dying_server_is_answered_by_another() {
    for (method, want) in [("GET", 200), ("POST", 502)] {
        let dier = dying_origin().await;
        let (good, seen) = named_origin("good").await;
        let g = start_gateway(&two_servers(dier.addr, good.addr, "", ""));
        let mut c = Client::connect(g.addr).await;
        // Round robin: the dying origin serves the first request, keeping the connection.
        assert_eq!(c.get("/warm").await.body, "dier");
        assert_eq!(c.get("/x").await.body, "good");
        let req = http::Request::builder()
            .method(method)
            .uri("/die")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let r = c.send(req).await;
        assert_eq!(r.status, want, "{method}: {:?}", r.body);
        // Sent on the pooled connection to the dying server (and, for the GET, then on
        // the pooled one to the live server).
        let reused = cluster_metric(&g, "upstream_reused_total");
        assert_eq!(reused, if want == 200 { 2.0 } else { 1.0 }, "{method}");
        assert_eq!(cluster_metric(&g, "upstream_fast_ejections_total"), 1.0);
        let to_good = seen.lock().unwrap().len();
        assert_eq!(to_good, if want == 200 { 2 } else { 1 }, "{method}");
        let unsent = cluster_metric(&g, "upstream_unsent_retries_total");
        assert_eq!(unsent, if want == 200 { 1.0 } else { 0.0 }, "{method}");
        drop(c);
        drop(g);
        drop(dier);
    }
}
