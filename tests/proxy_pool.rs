//! Rule 3, outbound connections: pooling and reuse, `Connection: close` from the origin,
//! `max_requests_per_connection`, and the keep-alive race (a bodyless request retried once
//! on a fresh connection; a request with a body never replayed).
mod support;
use bytes::Bytes;
use http_body_util::Full;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use support::*;
use tokio::io::AsyncWriteExt;

/// One route to one cluster at `origin` with the given `pool = {...}` inline table.
fn pool_config(origin: SocketAddr, pool: &str) -> String {
    format!(
        r#"{PREAMBLE}
[[routes]]
name = "default"
cluster = "origin"

[[clusters]]
name = "origin"
servers = [{{ address = "{origin}" }}]
connect_timeout = "1s"
response_header_timeout = "2s"
pool = {pool}
"#
    )
}

fn m(text: &str, name: &str) -> f64 {
    metric(text, &format!("keymaster_{name}{{cluster=\"origin\"}}"))
}

/// An origin answering every request on a connection with "n" (the request's 1-based number
/// on that connection) and recording the per-connection counts. `extra` is added to the
/// response head (e.g. `Connection: close`; the socket is kept open regardless, so only the
/// gateway's decision prevents reuse).
async fn counting_origin(extra: &'static str) -> (RawOrigin, Arc<Mutex<Vec<usize>>>) {
    let per_conn = Arc::new(Mutex::new(Vec::new()));
    let pc = per_conn.clone();
    let o = raw_origin(move |mut s, i| {
        let pc = pc.clone();
        async move {
            pc.lock().unwrap().push(0);
            let mut carry = Vec::new();
            let mut n = 0;
            while let Some(head) = read_head(&mut s, &mut carry).await {
                n += 1;
                pc.lock().unwrap()[i] = n;
                let cl: usize = head_header(&head, "content-length")
                    .map(|v| v.parse().unwrap())
                    .unwrap_or(0);
                let _ = read_exact_body(&mut s, &mut carry, cl).await;
                let resp = format!("HTTP/1.1 200 OK\r\n{extra}Content-Length: 1\r\n\r\n{n}");
                if s.write_all(resp.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (o, per_conn)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_pooled_across_client_connections() {
    let (origin, per_conn) = counting_origin("").await;
    let g = start_gateway(&pool_config(origin.addr, "{}"));
    for i in 1..=5 {
        // A new client connection each time: the pool is per origin, not per client.
        let r = get(g.addr, "/").await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body, i.to_string());
    }
    assert_eq!(origin.connections(), 1);
    assert_eq!(*per_conn.lock().unwrap(), vec![5]);
    let t = metrics_text(&g).await;
    assert_eq!(m(&t, "upstream_connects_total"), 1.0);
    assert_eq!(m(&t, "upstream_reused_total"), 4.0);
    assert_eq!(m(&t, "upstream_requests_total"), 5.0);
    assert_eq!(m(&t, "upstream_retries_total"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_connection_close_is_not_reused() {
    let (origin, per_conn) = counting_origin("Connection: close\r\n").await;
    let g = start_gateway(&pool_config(origin.addr, "{}"));
    let mut c = Client::connect(g.addr).await;
    for _ in 0..3 {
        let r = c.get("/").await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "1");
        // The origin's Connection: close is hop-by-hop: the client connection stays usable.
        assert!(r.headers.get("connection").is_none(), "{:?}", r.headers);
    }
    assert_eq!(origin.connections(), 3);
    assert_eq!(*per_conn.lock().unwrap(), vec![1, 1, 1]);
    let t = metrics_text(&g).await;
    assert_eq!(m(&t, "upstream_reused_total"), 0.0);
    assert_eq!(m(&t, "upstream_retries_total"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_requests_per_connection_retires_connections() {
    let (origin, per_conn) = counting_origin("").await;
    let g = start_gateway(&pool_config(
        origin.addr,
        "{ max_requests_per_connection = 2 }",
    ));
    let mut c = Client::connect(g.addr).await;
    let mut bodies = Vec::new();
    for _ in 0..5 {
        let r = c.get("/").await;
        assert_eq!(r.status, 200);
        bodies.push(String::from_utf8(r.body.to_vec()).unwrap());
    }
    assert_eq!(bodies, ["1", "2", "1", "2", "1"]);
    assert_eq!(origin.connections(), 3);
    assert_eq!(*per_conn.lock().unwrap(), vec![2, 2, 1]);
    let t = metrics_text(&g).await;
    assert_eq!(m(&t, "upstream_connects_total"), 3.0);
    assert_eq!(m(&t, "upstream_reused_total"), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_idle_zero_disables_pooling() {
    let (origin, _) = counting_origin("").await;
    let g = start_gateway(&pool_config(origin.addr, "{ max_idle = 0 }"));
    for _ in 0..3 {
        assert_eq!(get(g.addr, "/").await.status, 200);
    }
    assert_eq!(origin.connections(), 3);
}

/// The keep-alive race, made deterministic: connection 0 answers its first request with a
/// keep-alive response, reads the second request's head, then closes without answering.
/// Later connections answer normally. Records each request line received on later connections.
async fn stale_origin() -> (RawOrigin, Arc<Mutex<Vec<String>>>) {
    let fresh = Arc::new(Mutex::new(Vec::new()));
    let f = fresh.clone();
    let o = raw_origin(move |mut s, i| {
        let f = f.clone();
        async move {
            let mut carry = Vec::new();
            if i == 0 {
                if read_head(&mut s, &mut carry).await.is_none() {
                    return;
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
                    .await;
                let _ = read_head(&mut s, &mut carry).await;
                return; // close, unanswered
            }
            while let Some(head) = read_head(&mut s, &mut carry).await {
                let line = head.split("\r\n").next().unwrap().to_string();
                f.lock().unwrap().push(line);
                let cl: usize = head_header(&head, "content-length")
                    .map(|v| v.parse().unwrap())
                    .unwrap_or(0);
                let _ = read_exact_body(&mut s, &mut carry, cl).await;
                if s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    })
    .await;
    (o, fresh)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodyless_request_on_a_stale_connection_is_retried_once_fresh() {
    let (origin, fresh) = stale_origin().await;
    let g = start_gateway(&pool_config(origin.addr, "{}"));
    let mut c = Client::connect(g.addr).await;
    let r = c.get("/one").await;
    assert_eq!((r.status, &r.body[..]), (200, &b"first"[..]));
    let r = c.get("/two?x=1").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body, "fresh");
    assert_eq!(origin.connections(), 2);
    assert_eq!(*fresh.lock().unwrap(), ["GET /two?x=1 HTTP/1.1"]);
    let t = metrics_text(&g).await;
    assert_eq!(m(&t, "upstream_retries_total"), 1.0);
    assert_eq!(m(&t, "upstream_reused_total"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_with_a_body_on_a_stale_connection_is_not_replayed() {
    let (origin, fresh) = stale_origin().await;
    let g = start_gateway(&pool_config(origin.addr, "{}"));
    let mut c = Client::connect(g.addr).await;
    let r = c.get("/one").await;
    assert_eq!(r.status, 200);
    let req = http::Request::post("/submit")
        .body(Full::new(Bytes::from_static(b"payload=1")))
        .unwrap();
    let r = c.send(req).await;
    assert_eq!(r.status, 502, "{:?}", r.body);
    assert_eq!(origin.connections(), 1, "no fresh connection for a replay");
    assert!(fresh.lock().unwrap().is_empty());
    let t = metrics_text(&g).await;
    assert_eq!(m(&t, "upstream_retries_total"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_closing_right_after_a_response_never_fails_the_next_get() {
    // The origin answers one request per connection with a keep-alive response and then
    // closes at once: whether the gateway notices before reusing is a race; either way the
    // next GET must succeed.
    let origin = raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        if read_head(&mut s, &mut carry).await.is_some() {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .await;
        }
    })
    .await;
    let g = start_gateway(&pool_config(origin.addr, "{}"));
    let mut c = Client::connect(g.addr).await;
    for _ in 0..10 {
        let r = c.get("/").await;
        assert_eq!((r.status, &r.body[..]), (200, &b"ok"[..]));
    }
    let t = metrics_text(&g).await;
    assert!(m(&t, "upstream_retries_total") <= 10.0);
    assert_eq!(origin.connections(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_reused_after_requests_with_bodies() {
    let (origin, per_conn) = counting_origin("").await;
    let g = start_gateway(&pool_config(origin.addr, "{}"));
    let mut c = Client::connect(g.addr).await;
    for i in 1..=3 {
        let req = http::Request::post("/submit")
            .body(Full::new(Bytes::from(vec![b'x'; 1000])))
            .unwrap();
        let r = c.send(req).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body, i.to_string());
    }
    assert_eq!(origin.connections(), 1);
    assert_eq!(*per_conn.lock().unwrap(), vec![3]);
    let t = metrics_text(&g).await;
    assert_eq!(m(&t, "upstream_reused_total"), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_in_a_repeated_connection_header_is_not_reused() {
    let (origin, per_conn) =
        counting_origin("Connection: keep-alive\r\nConnection: close\r\n").await;
    let g = start_gateway(&pool_config(origin.addr, "{}"));
    let mut c = Client::connect(g.addr).await;
    for _ in 0..3 {
        let r = c.get("/").await;
        assert_eq!((r.status, &r.body[..]), (200, &b"1"[..]));
    }
    assert_eq!(*per_conn.lock().unwrap(), vec![1, 1, 1]);
}

/// The idle-connections gauge counts what the pools hold: connections a full pool turns
/// away, and idle ones the origin closed, leave the count too.
/// An origin that holds every response until `n` requests have arrived, so all `n` are in
/// flight at once however slowly they come (a gateway that queued one behind another on one
/// connection gets its answers after 10 s instead of never). Setting the returned flag closes
/// its connections, idle ones too.
async fn gathering_origin(n: usize) -> (RawOrigin, tokio::sync::watch::Sender<bool>) {
    let arrived = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (all_in, _) = tokio::sync::watch::channel(false);
    let all_in = Arc::new(all_in);
    let (gone, _) = tokio::sync::watch::channel(false);
    let gone_rx = gone.subscribe();
    let o = raw_origin(move |mut s, _| {
        let (arrived, all_in) = (arrived.clone(), all_in.clone());
        let (mut everyone, mut gone) = (all_in.subscribe(), gone_rx.clone());
        async move {
            let mut carry = Vec::new();
            loop {
                let head = tokio::select! {
                    h = read_head(&mut s, &mut carry) => h,
                    _ = gone.wait_for(|g| *g) => None,
                };
                if head.is_none() {
                    return;
                }
                if arrived.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 >= n {
                    all_in.send_replace(true);
                }
                let wait = std::time::Duration::from_secs(10);
                let _ = tokio::time::timeout(wait, everyone.wait_for(|a| *a)).await;
                let resp = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                if s.write_all(resp).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (o, gone)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_gauge_counts_what_the_pool_holds() {
    let (origin, gone) = gathering_origin(6).await;
    // The origin answers once all six are in: the response head timeout is not what is tested.
    let toml = pool_config(origin.addr, "{ max_idle = 2 }").replace(
        "response_header_timeout = \"2s\"",
        "response_header_timeout = \"30s\"",
    );
    assert!(toml.contains("\"30s\""), "{toml}");
    let g = start_gateway(&toml);
    let gets = (0..6).map(|_| async {
        let mut c = Client::connect(g.addr).await;
        c.get("/").await.status
    });
    let statuses = futures_util::future::join_all(gets).await;
    assert_eq!(statuses, vec![200; 6]);
    let text = metrics_text(&g).await;
    assert_eq!(
        m(&text, "upstream_connects_total"),
        6.0,
        "six at once: six connections"
    );
    assert_eq!(
        m(&text, "upstream_idle_connections"),
        2.0,
        "max_idle keeps two"
    );

    // The origin goes away: the idle connections it closed leave the gauge once swept.
    gone.send_replace(true);
    drop(origin);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let idle = m(&metrics_text(&g).await, "upstream_idle_connections");
        if idle == 0.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{idle} closed connections still counted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The connections a burst opened expire together: the sweeper closes them all, a few at a
/// time between other work, while requests go on (a checkout that finds them expired
/// leaves them to it), and none of those requests fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bursts_idle_connections_expire_together_while_requests_go_on() {
    const BURST: usize = 200;
    let (origin, _gone) = gathering_origin(BURST).await;
    let toml = pool_config(origin.addr, "{ max_idle = 1000, idle_timeout = \"300ms\" }").replace(
        "response_header_timeout = \"2s\"",
        "response_header_timeout = \"30s\"",
    );
    assert!(toml.contains("\"30s\""), "{toml}");
    let g = start_gateway(&toml);
    let gets = (0..BURST).map(|_| async {
        let mut c = Client::connect(g.addr).await;
        c.get("/").await.status
    });
    let statuses = futures_util::future::join_all(gets).await;
    assert_eq!(statuses, vec![200; BURST]);
    let text = metrics_text(&g).await;
    assert_eq!(m(&text, "upstream_connects_total"), BURST as f64);
    assert_eq!(m(&text, "upstream_idle_connections"), BURST as f64);

    // One request at a time keeps one connection warm; the other 199 expire and close.
    let mut c = Client::connect(g.addr).await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        assert_eq!(c.get("/").await.status, 200);
        let idle = m(&metrics_text(&g).await, "upstream_idle_connections");
        if idle <= 1.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{idle} idle connections left"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
