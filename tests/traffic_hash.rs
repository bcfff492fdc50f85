//! Consistent hashing (`balance = "hash"`) end to end: about 1/N of the keys move when a
//! server is added or removed (and only those of that server), an ejected or unhealthy
//! server's keys move and come back when it returns (no request failing meanwhile), a
//! generated cookie keeps a client on one server, and the client IP and the path are keys.

mod support;
mod traffic_support;

use bytes::Bytes;
use http_body_util::Full;
use std::net::SocketAddr;
use std::time::Duration;
use support::*;
use traffic_support::{servers, Named};

const KEYS: usize = 1000;
const CLIENTS: usize = 8;

/// One route to the hash cluster `h` over `origins`; `cluster_keys` follow its servers.
fn config(origins: &[&Named], cluster_keys: &str) -> String {
    format!(
        r#"{PREAMBLE}
[[routes]]
name = "hashed"
cluster = "h"

[[clusters]]
name = "h"
{}
balance = "hash"
connect_timeout = "1s"
{cluster_keys}
"#,
        servers(origins)
    )
}

const BY_HEADER: &str = r#"hash = { key = "header", name = "x-user" }"#;

fn load(text: &str) -> keymaster_config::Config {
    keymaster_config::load_str(text, "<test>").unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn user(i: usize) -> String {
    format!("user-{i}")
}

/// The origin that answers each of the keys `0..KEYS` (by `x-user`), over CLIENTS
/// keep-alive connections; every request must succeed.
async fn owners(addr: SocketAddr) -> Vec<String> {
    let mut tasks = Vec::new();
    for t in 0..CLIENTS {
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let mut out = Vec::new();
            for i in (t..KEYS).step_by(CLIENTS) {
                let req = http::Request::get("/").header("x-user", user(i));
                let r = c.send(req.body(Full::new(Bytes::new())).unwrap()).await;
                assert_eq!(r.status, 200, "{}: {r:?}", user(i));
                out.push((i, String::from_utf8_lossy(&r.body).into_owned()));
            }
            out
        }));
    }
    let mut all = vec![String::new(); KEYS];
    for t in tasks {
        for (i, origin) in t.await.expect("client task") {
            all[i] = origin;
        }
    }
    all
}

/// The keys whose owner differs.
fn moved(before: &[String], after: &[String]) -> Vec<usize> {
    (0..KEYS).filter(|&i| before[i] != after[i]).collect()
}

fn hash_metric(g: &TestGateway, result: &str) -> f64 {
    metric(
        &g.gateway().metrics_text(),
        &format!("keymaster_upstream_hash_picks_total{{cluster=\"h\",result=\"{result}\"}}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_or_removing_one_server_moves_about_one_nth_of_the_keys() {
    let o = Named::many("", 5).await;
    let four = [&o[0], &o[1], &o[2], &o[3]];
    let g = start_gateway(&config(&four, BY_HEADER));
    let m = g.gateway().metrics_text();
    for result in ["primary", "moved", "unkeyed"] {
        let line =
            format!("keymaster_upstream_hash_picks_total{{cluster=\"h\",result=\"{result}\"}} 0");
        assert!(m.contains(&line), "{line} in\n{m}");
    }
    let first = owners(g.addr).await;
    assert_eq!(owners(g.addr).await, first, "a key keeps its server");
    assert!(
        o[..4].iter().all(|x| first.contains(&x.name)),
        "every server owns keys"
    );

    // A fifth server: about 1/5 of the keys move, every one of them to it.
    g.gateway()
        .reload(load(&config(&o.iter().collect::<Vec<_>>(), BY_HEADER)))
        .unwrap();
    let added = owners(g.addr).await;
    let to_new = moved(&first, &added);
    assert!(
        to_new.iter().all(|&i| added[i] == o[4].name),
        "keys moved only to the new server"
    );
    // The expectation is 1/5; a server's share of a 160-point-per-server ring varies by
    // about 8% of itself, the 1,000 keys sample it by about 1.3 points: ±10 points is
    // five standard deviations of both together.
    let share = to_new.len() as f64 / KEYS as f64;
    assert!((0.10..=0.30).contains(&share), "{share} of the keys moved");

    // The third server removed: its keys move (to the others), no other key does.
    let without = [&o[0], &o[1], &o[3], &o[4]];
    g.gateway()
        .reload(load(&config(&without, BY_HEADER)))
        .unwrap();
    let removed = owners(g.addr).await;
    let gone = moved(&added, &removed);
    assert!(
        gone.iter().all(|&i| added[i] == o[2].name),
        "only the removed server's keys moved"
    );
    let owned = added.iter().filter(|s| **s == o[2].name).count();
    assert_eq!(gone.len(), owned);
    let share = gone.len() as f64 / KEYS as f64;
    assert!((0.10..=0.30).contains(&share), "{share} of the keys moved");
    assert_eq!(hash_metric(&g, "primary"), (4 * KEYS) as f64);
    assert_eq!(hash_metric(&g, "moved") + hash_metric(&g, "unkeyed"), 0.0);
    eprintln!(
        "keys moved: {} of {KEYS} when a fifth server came, {} when one of five left",
        to_new.len(),
        gone.len()
    );
}

/// Kill the owner of some keys under a cluster whose `health` settings take it out: its keys
/// move (failing no request), the others stay; restarted, its keys come back. `checks`:
/// active checks take it out (then no request meets it once they have).
async fn keys_move_and_come_back(health: &str, checks: bool) {
    let mut o = Named::many("", 3).await;
    let g = start_gateway(&config(
        &[&o[0], &o[1], &o[2]],
        &format!("{BY_HEADER}\n{health}"),
    ));
    let first = owners(g.addr).await;
    let victim = o[1].name.clone();
    let owned: Vec<usize> = (0..KEYS).filter(|&i| first[i] == victim).collect();
    assert!(!owned.is_empty());

    o[1].kill().await;
    // Once the server is out, its keys are served by the others (the requests that met the
    // dead server before went to the next on the ring: never sent, so never failed).
    let out = eventually_owners(&g, |now| owned.iter().all(|&i| now[i] != victim)).await;
    assert_eq!(
        moved(&first, &out),
        owned,
        "only the dead server's keys moved"
    );
    assert!(hash_metric(&g, "moved") >= owned.len() as f64);
    if checks {
        // Once the checks call it unhealthy, the ring passes it over: no request meets it.
        assert!(
            available_is(&g, o[1].addr, false).await,
            "the checks see it down"
        );
        let unsent = unsent_retries(&g);
        assert_eq!(moved(&first, &owners(g.addr).await), owned);
        assert_eq!(
            unsent_retries(&g),
            unsent,
            "no request went to the dead server"
        );
    }

    o[1].restart().await;
    eprintln!("{} of {KEYS} keys moved off the dead server", owned.len());
    let back = eventually_owners(&g, |now| now == first.as_slice()).await;
    assert_eq!(back, first, "every key is back on its own server");
    let m = g.gateway().metrics_text();
    assert_eq!(
        metric(&m, "keymaster_errors_total"),
        0.0,
        "no request failed:\n{m}"
    );
}

fn unsent_retries(g: &TestGateway) -> f64 {
    metric(
        &g.gateway().metrics_text(),
        "keymaster_upstream_unsent_retries_total{cluster=\"h\"}",
    )
}

/// Poll the admin API (bounded) until `server`'s availability is `want`.
async fn available_is(g: &TestGateway, server: SocketAddr, want: bool) -> bool {
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < end {
        let r = admin_get(g, "/health/clusters").await;
        let v: serde_json::Value = serde_json::from_slice(&r.body).expect("health JSON");
        let servers = v["clusters"][0]["servers"]
            .as_array()
            .expect("servers")
            .clone();
        let s = servers.iter().find(|s| s["address"] == server.to_string());
        if s.is_some_and(|s| s["available"] == want) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The owners of every key, asked again (bounded) until `done` holds.
async fn eventually_owners(g: &TestGateway, done: impl Fn(&[String]) -> bool) -> Vec<String> {
    let end = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let now = owners(g.addr).await;
        if done(&now) || tokio::time::Instant::now() > end {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ejected_servers_keys_move_and_come_back() {
    // Passive ejection only: a refused connection ejects at once, for 200 to 400 ms.
    keys_move_and_come_back(
        r#"outlier_detection = { consecutive_failures = 3, base_ejection = "200ms", max_ejection = "400ms" }"#,
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_servers_keys_move_and_come_back() {
    // Active checks only (passive ejection off).
    keys_move_and_come_back(
        r#"outlier_detection = { consecutive_failures = 0 }
health_check = { path = "/health", interval = "50ms", timeout = "1s", healthy_threshold = 1, unhealthy_threshold = 1 }"#,
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_cookie_keeps_a_client_on_one_server() {
    let o = Named::many("", 3).await;
    let keys =
        r#"hash = { key = "cookie", name = "km_srv", generate = true, cookie_max_age = "1h" }"#;
    let g = start_gateway(&config(&[&o[0], &o[1], &o[2]], keys));
    let mut c = Client::connect(g.addr).await;
    let mut seen = std::collections::HashSet::new();
    for visit in 0..60 {
        // A first visit: a server is picked and the cookie set.
        let r = c.get("/").await;
        assert_eq!(r.status, 200);
        let set = r
            .headers
            .get("set-cookie")
            .expect("a cookie is set")
            .to_str()
            .unwrap();
        let (pair, attributes) = set.split_once(';').unwrap();
        assert_eq!(attributes, " Path=/; Max-Age=3600; HttpOnly", "{set}");
        let value = pair.strip_prefix("km_srv=").expect(set);
        assert!(
            value.len() == 16 && value.bytes().all(|b| b.is_ascii_hexdigit()),
            "{set}"
        );
        let server = r.body.clone();
        seen.insert(server.clone());
        // Coming back with it: the same server every time, and no new cookie.
        for _ in 0..if visit < 5 { 20 } else { 2 } {
            let req = http::Request::get("/").header("cookie", format!("a=b; {pair}"));
            let again = c.send(req.body(Full::new(Bytes::new())).unwrap()).await;
            assert_eq!(again.body, server, "visit {visit} with {pair}");
            assert!(again.headers.get("set-cookie").is_none());
        }
    }
    // 60 first visits spread over the three servers (one left out: p < 1e-10).
    assert_eq!(seen.len(), 3, "{seen:?}");
    let m = g.gateway().metrics_text();
    assert_eq!(
        metric(
            &m,
            "keymaster_upstream_affinity_cookies_total{cluster=\"h\"}"
        ),
        60.0
    );
    assert_eq!(
        metric(
            &m,
            "keymaster_upstream_hash_picks_total{cluster=\"h\",result=\"unkeyed\"}"
        ),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_path_and_the_client_ip_are_keys_and_a_missing_key_spreads() {
    let o = Named::many("", 3).await;
    let three = [&o[0], &o[1], &o[2]];
    let g = start_gateway(&config(&three, r#"hash = { key = "path" }"#));
    let mut c = Client::connect(g.addr).await;
    let mut by_path = Vec::new();
    for i in 0..60 {
        by_path.push(c.get(&format!("/p/{i}?q={i}")).await.body);
    }
    for (i, first) in by_path.iter().enumerate() {
        // The query is no part of the key.
        let again = c.get(&format!("/p/{i}?other")).await.body;
        assert_eq!(&again, first, "/p/{i}");
    }
    assert!(
        o.iter().all(|x| x.hits() > 0),
        "paths spread over every server"
    );

    g.gateway()
        .reload(load(&config(&three, r#"hash = { key = "client_ip" }"#)))
        .unwrap();
    let one = c.get("/a").await.body;
    for i in 0..30 {
        assert_eq!(
            Client::connect(g.addr)
                .await
                .get(&format!("/{i}"))
                .await
                .body,
            one
        );
    }

    // A header key that a request lacks: weighted random, counted as unkeyed.
    g.gateway()
        .reload(load(&config(&three, BY_HEADER)))
        .unwrap();
    let before: Vec<usize> = o.iter().map(Named::hits).collect();
    for _ in 0..60 {
        assert_eq!(c.get("/").await.status, 200);
    }
    assert!(
        o.iter().zip(&before).all(|(x, b)| x.hits() > *b),
        "unkeyed requests spread"
    );
    assert_eq!(hash_metric(&g, "unkeyed"), 60.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_gets_and_keeps_its_affinity_cookie() {
    use http_body_util::BodyExt;
    let o = Named::many("", 3).await;
    let keys = r#"hash = { key = "cookie", name = "km_srv", generate = true, cookie_path = "/app", cookie_secure = true }"#;
    let g = start_gateway(&config(&[&o[0], &o[1], &o[2]], keys));
    let mut h2 = h2_client(g.addr).await;
    let get = |cookies: &[&str]| {
        let mut req = http::Request::get(format!("http://{}/app/x", g.addr));
        for c in cookies {
            req = req.header("cookie", *c);
        }
        req.body(Full::new(Bytes::new())).unwrap()
    };
    let first = h2.send_request(get(&[])).await.expect("h2 response");
    let set = first.headers()["set-cookie"].to_str().unwrap().to_string();
    let server = first.into_body().collect().await.unwrap().to_bytes();
    let (pair, attributes) = set.split_once(';').unwrap();
    assert_eq!(attributes, " Path=/app; HttpOnly; Secure", "{set}");
    for _ in 0..20 {
        // The cookie in a field of its own, beside another (RFC 9113 §8.2.3).
        let resp = h2
            .send_request(get(&["a=1", pair]))
            .await
            .expect("h2 response");
        assert!(resp.headers().get("set-cookie").is_none());
        assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), server);
    }
}
