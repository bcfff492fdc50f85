//! Traffic mirroring (a route's `mirror`): a sampled share of the route's requests is
//! copied to a shadow cluster, fire and forget. Real gateway, real origins, real clients:
//! the copy's head and body, `-shadow` Host, discarded answers, the share sampled, the cap
//! on shadow requests in flight, bodies only within the cap, and a shadow that is stalled
//! or down never delaying or failing the primary.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;
use tokio::io::AsyncWriteExt;

/// A shadow origin that records each request head (and body) it gets and answers 500.
async fn recording_shadow() -> (RawOrigin, Arc<Mutex<Vec<(String, Vec<u8>)>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let origin = raw_origin(move |mut s, _| {
        let log = log.clone();
        async move {
            let mut carry = Vec::new();
            while let Some(head) = read_head(&mut s, &mut carry).await {
                let n = head_header(&head, "content-length").map_or(0, |v| v.parse().unwrap());
                let body = read_exact_body(&mut s, &mut carry, n).await;
                log.lock().unwrap().push((head, body));
                let r = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nnope";
                if s.write_all(r).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (origin, seen)
}

fn mirrored_config(
    primary: std::net::SocketAddr,
    shadow: std::net::SocketAddr,
    mirror: &str,
) -> String {
    let extra = format!(
        "[[routes]]\nname = \"api\"\ncluster = \"origin\"\nmatch = {{ path_prefix = \"/api\" }}\nmirror = {{ cluster = \"shadow\", {mirror} }}\n\n[[clusters]]\nname = \"shadow\"\nservers = [{{ address = \"{shadow}\" }}]\n"
    );
    config_text(primary, "", &extra)
}

async fn post(addr: std::net::SocketAddr, path: &str, body: &'static [u8], host: &str) -> Reply {
    let req = http::Request::post(path)
        .header("host", host)
        .body(http_body_util::Full::new(bytes::Bytes::from_static(body)))
        .unwrap();
    Client::connect(addr).await.send(req).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shadow_gets_a_copy_and_its_answer_is_discarded() {
    let stub = stub();
    let (shadow, seen) = recording_shadow().await;
    let g = start_gateway(&mirrored_config(
        stub.local_addr(),
        shadow.addr,
        "sample = 1.0",
    ));
    let r = post(
        g.addr,
        "/api/orders?x=1",
        b"{\"id\":7}",
        "shop.example:8080",
    )
    .await;
    assert_eq!(r.status, 200, "the primary's answer, not the shadow's 500");
    assert!(eventually(Duration::from_secs(5), || seen.lock().unwrap().len() == 1).await);
    let (head, body) = seen.lock().unwrap()[0].clone();
    assert!(
        head.starts_with("POST /api/orders?x=1 HTTP/1.1\r\n"),
        "{head}"
    );
    assert_eq!(
        head_header(&head, "host"),
        Some("shop.example-shadow:8080"),
        "{head}"
    );
    assert!(head_header(&head, "x-forwarded-for").is_some(), "{head}");
    assert_eq!(body, b"{\"id\":7}");
    // Counted once the shadow's answer has been read (after the shadow saw the copy).
    let sent = || {
        metric(
            &g.gateway().metrics_text(),
            "keymaster_mirror_requests_total{cluster=\"shadow\",result=\"sent\",route=\"api\"}",
        )
    };
    assert!(eventually(Duration::from_secs(10), || sent() >= 1.0).await);
    assert_eq!(sent(), 1.0);
    // Requests of other routes are not mirrored. A copy of `/other` would be launched (on the
    // one worker) before the next `/api` request is even read, so it would be at the shadow
    // by the time that request's copy has been answered.
    assert_eq!(get(g.addr, "/other").await.status, 200);
    assert_eq!(post(g.addr, "/api/next", b"", "h").await.status, 200);
    assert!(eventually(Duration::from_secs(10), || sent() >= 2.0).await);
    let lines: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(h, _)| h.lines().next().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        lines,
        ["POST /api/orders?x=1 HTTP/1.1", "POST /api/next HTTP/1.1"],
        "only the /api requests are mirrored"
    );
    let m = metrics_text(&g).await;
    let count = |result: &str| {
        metric(
            &m,
            &format!("keymaster_mirror_requests_total{{cluster=\"shadow\",result=\"{result}\",route=\"api\"}}"),
        )
    };
    assert_eq!(count("sent"), 2.0, "{m}");
    assert_eq!(count("dropped"), 0.0);
    assert!(m.contains("result=\"skipped_body\""), "series at zero: {m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_share_mirrored_follows_the_sample() {
    let stub = stub();
    let (shadow, seen) = recording_shadow().await;
    let g = start_gateway(&mirrored_config(
        stub.local_addr(),
        shadow.addr,
        "sample = 0.25",
    ));
    let n = 800;
    let mut c = Client::connect(g.addr).await;
    for _ in 0..n {
        assert_eq!(c.get("/api/x").await.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = seen.lock().unwrap().len() as f64;
    // Binomial(800, 0.25): mean 200, sigma ~12.2; six sigma either way cannot flake.
    assert!((got - 200.0).abs() < 6.0 * 12.25, "{got} of {n} mirrored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_shadow_is_capped_and_never_delays_the_primary() {
    let stub = stub();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    // Reads requests and never answers.
    let shadow = raw_origin(move |mut s, _| {
        let count = count.clone();
        async move {
            let mut carry = Vec::new();
            while read_head(&mut s, &mut carry).await.is_some() {
                count.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
    })
    .await;
    let mirror = "max_in_flight = 4, timeout = \"3s\"";
    let g = start_gateway(&mirrored_config(stub.local_addr(), shadow.addr, mirror));
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let addr = g.addr;
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let mut slowest = Duration::ZERO;
            for _ in 0..20 {
                let t = Instant::now();
                assert_eq!(c.get("/api/x").await.status, 200);
                slowest = slowest.max(t.elapsed());
            }
            slowest
        }));
    }
    let mut slowest = Duration::ZERO;
    for t in tasks {
        slowest = slowest.max(t.await.unwrap());
    }
    assert!(
        slowest < Duration::from_secs(1),
        "a primary waited {slowest:?}"
    );
    let m = metrics_text(&g).await;
    let count = |result: &str| {
        metric(
            &m,
            &format!("keymaster_mirror_requests_total{{cluster=\"shadow\",result=\"{result}\",route=\"api\"}}"),
        )
    };
    // 200 requests, 4 shadow places: the first four copies take them, and a later copy
    // finds one only after a stalled copy timed out (3 s), which counts it failed before it
    // frees its place. So the copies sent are four plus at most the failures so far: exactly
    // four, 196 dropped, unless this machine took over 3 s for the 200 requests.
    let (dropped, failed) = (count("dropped"), count("failed"));
    let copies = 200.0 - dropped;
    assert!(
        (4.0..=4.0 + failed).contains(&copies),
        "200 requests, 4 shadow places, {failed} timed out so far: {dropped} dropped\n{m}"
    );
    assert!(
        eventually(Duration::from_secs(10), || accepted.load(Ordering::SeqCst)
            == copies as usize)
        .await,
        "{} of {copies} copies at the shadow",
        accepted.load(Ordering::SeqCst)
    );
    // The stalled copies time out and are counted as failed.
    assert_eq!(failed_count(&g, copies).await, copies);
}

/// The shadow's failed count once it reaches `want` (or after 10 s).
async fn failed_count(g: &TestGateway, want: f64) -> f64 {
    let mut failed = 0.0;
    for _ in 0..100 {
        let m = metrics_text(g).await;
        failed = metric(
            &m,
            "keymaster_mirror_requests_total{cluster=\"shadow\",result=\"failed\",route=\"api\"}",
        );
        if failed == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    failed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_mirrored_only_within_the_cap_and_a_dead_shadow_fails_nothing() {
    let stub = stub();
    let (shadow, seen) = recording_shadow().await;
    let g = start_gateway(&mirrored_config(
        stub.local_addr(),
        shadow.addr,
        "max_body = \"16B\"",
    ));
    assert_eq!(
        post(g.addr, "/api/small", b"0123456789", "h").await.status,
        200
    );
    let long: &'static [u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    assert_eq!(post(g.addr, "/api/long", long, "h").await.status, 200);
    assert!(eventually(Duration::from_secs(5), || seen.lock().unwrap().len() == 1).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let heads: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(h, _)| h.clone())
        .collect();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(heads[0].starts_with("POST /api/small "));
    let m = metrics_text(&g).await;
    let skipped = metric(
        &m,
        "keymaster_mirror_requests_total{cluster=\"shadow\",result=\"skipped_body\",route=\"api\"}",
    );
    assert_eq!(skipped, 1.0, "{m}");

    // Nobody listening at the shadow: every primary succeeds, every copy fails.
    let (dead, _dead_held) = closed_addr();
    let g = start_gateway(&mirrored_config(stub.local_addr(), dead, "sample = 1.0"));
    let mut c = Client::connect(g.addr).await;
    for _ in 0..20 {
        assert_eq!(c.get("/api/x").await.status, 200);
    }
    let failed = failed_count(&g, 20.0).await;
    assert_eq!(failed, 20.0);
}
