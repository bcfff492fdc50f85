//! Weighted clusters per route, end to end: the realised split of real requests lies within
//! binomial bounds, a header or cookie overrides the pick, and changing the weights by hot
//! reload under concurrent load fails no request.

mod support;
mod traffic_support;

use bytes::Bytes;
use http_body_util::Full;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::*;
use traffic_support::{servers, within_sigmas, Named};

/// A config with clusters `a`, `b`, `c` (one origin each) and the route `split`, whose
/// cluster keys are `route_keys`.
fn config(o: &[Named], route_keys: &str) -> String {
    format!(
        r#"{PREAMBLE}
[[routes]]
name = "split"
{route_keys}

[[clusters]]
name = "a"
{}

[[clusters]]
name = "b"
{}

[[clusters]]
name = "c"
{}
"#,
        servers(&[&o[0]]),
        servers(&[&o[1]]),
        servers(&[&o[2]]),
    )
}

fn load(text: &str) -> keymaster_config::Config {
    keymaster_config::load_str(text, "<test>").unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// `total` GETs of `/` over `clients` keep-alive connections, each request with the
/// `headers`; returns how many each origin (by name) answered. Every request must succeed.
async fn spread(
    addr: std::net::SocketAddr,
    total: usize,
    clients: usize,
    headers: &[(&'static str, &'static str)],
) -> HashMap<String, usize> {
    let mut tasks = Vec::new();
    for t in 0..clients {
        let headers = headers.to_vec();
        let n = total / clients + usize::from(t < total % clients);
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let mut counts: HashMap<String, usize> = HashMap::new();
            for _ in 0..n {
                let mut req = http::Request::get("/");
                for (k, v) in &headers {
                    req = req.header(*k, *v);
                }
                let r = c.send(req.body(Full::new(Bytes::new())).unwrap()).await;
                assert_eq!(r.status, 200, "{r:?}");
                *counts
                    .entry(String::from_utf8_lossy(&r.body).into())
                    .or_default() += 1;
            }
            counts
        }));
    }
    let mut all = HashMap::new();
    for t in tasks {
        for (k, v) in t.await.expect("client task") {
            *all.entry(k).or_default() += v;
        }
    }
    all
}

fn picks(g: &TestGateway, cluster: &str, source: &str) -> f64 {
    metric(
        &g.gateway().metrics_text(),
        &format!(
            "keymaster_route_cluster_picks_total{{cluster=\"{cluster}\",route=\"split\",source=\"{source}\"}}"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_realised_split_lies_within_binomial_bounds() {
    const N: usize = 4000;
    let o = Named::many("", 3).await;
    let route = r#"clusters = [{ name = "a", weight = 70 }, { name = "b", weight = 25 }, { name = "c", weight = 5 }]"#;
    let g = start_gateway(&config(&o, route));
    // Every series exists before the first request.
    let m = g.gateway().metrics_text();
    for c in ["a", "b", "c"] {
        for source in ["weight", "override"] {
            let line = format!("keymaster_route_cluster_picks_total{{cluster=\"{c}\",route=\"split\",source=\"{source}\"}} 0");
            assert!(m.contains(&line), "{line} in\n{m}");
        }
    }
    let counts = spread(g.addr, N, 8, &[]).await;
    // Five standard deviations: a false failure about once in 1.7 million runs, while a
    // split off by 2 points (72/23/5) already fails for `a` and `b`.
    for (name, p) in [("0", 0.70), ("1", 0.25), ("2", 0.05)] {
        let got = counts.get(name).copied().unwrap_or(0);
        assert!(
            within_sigmas(got, N, p, 5.0),
            "origin {name}: {got} of {N}, expected {:.0} ± 5σ; all: {counts:?}",
            p * N as f64
        );
    }
    assert_eq!(counts.values().sum::<usize>(), N);
    eprintln!("split of {N} requests at 70/25/5: {counts:?}");
    for (c, origin) in [("a", "0"), ("b", "1"), ("c", "2")] {
        assert_eq!(picks(&g, c, "weight"), counts[origin] as f64, "{c}");
        assert_eq!(picks(&g, c, "override"), 0.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_or_a_cookie_names_the_cluster() {
    let o = Named::many("", 3).await;
    let route = r#"clusters = [{ name = "a", weight = 9999 }, { name = "c", weight = 1 }]
cluster_override = { header = "x-cluster", cookie = "km-cluster" }"#;
    let g = start_gateway(&config(&o, route));
    let by_header = spread(g.addr, 100, 2, &[("x-cluster", "c")]).await;
    assert_eq!(by_header.get("2"), Some(&100), "{by_header:?}");
    let by_cookie = spread(g.addr, 100, 2, &[("cookie", "x=1; km-cluster=c; y=2")]).await;
    assert_eq!(by_cookie.get("2"), Some(&100), "{by_cookie:?}");
    // The header comes first; a name that is none of the route's clusters (b exists, but
    // not in this route) is ignored, and the weights decide.
    let both = spread(
        g.addr,
        50,
        1,
        &[("x-cluster", "a"), ("cookie", "km-cluster=c")],
    )
    .await;
    assert_eq!(both.get("0"), Some(&50), "{both:?}");
    let stranger = spread(g.addr, 100, 2, &[("x-cluster", "b")]).await;
    assert!(!stranger.contains_key("1"), "{stranger:?}");
    assert!(
        stranger.get("0").copied().unwrap_or(0) >= 95,
        "{stranger:?}"
    );
    assert_eq!(picks(&g, "c", "override"), 200.0);
    assert_eq!(picks(&g, "a", "override"), 50.0);
    assert_eq!(picks(&g, "a", "weight") + picks(&g, "c", "weight"), 100.0);
    assert_eq!(o[1].hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn changing_the_weights_by_reload_under_load_fails_no_request() {
    const CLIENTS: usize = 8;
    let o = Named::many("", 3).await;
    // Weighted splits of every shape, and a single cluster, in turn.
    let versions: Vec<_> = [
        r#"clusters = [{ name = "a", weight = 95 }, { name = "b", weight = 5 }]"#,
        r#"clusters = [{ name = "a", weight = 5 }, { name = "b", weight = 95 }]"#,
        r#"clusters = [{ name = "a", weight = 1 }, { name = "b", weight = 1 }, { name = "c", weight = 1 }]"#,
        r#"cluster = "c""#,
        r#"clusters = [{ name = "c", weight = 10 }, { name = "a", weight = 1 }]"#,
    ]
    .iter()
    .map(|r| load(&config(&o, r)))
    .collect();
    let g = start_gateway(&config(&o, r#"cluster = "a""#));
    let stop = Arc::new(AtomicBool::new(false));
    let mut load_tasks = Vec::new();
    for _ in 0..CLIENTS {
        let (stop, addr) = (stop.clone(), g.addr);
        load_tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let mut done = 0usize;
            while !stop.load(Ordering::SeqCst) && done < 1_000_000 {
                let r = c.get("/").await;
                assert_eq!(r.status, 200, "request {done}: {r:?}");
                done += 1;
            }
            done
        }));
    }
    let gw = g.gateway();
    for i in 0..200 {
        gw.reload(versions[i % versions.len()].clone())
            .expect("reload");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The last weights take effect: 1 in 10,000 to `a`.
    let last = r#"clusters = [{ name = "a", weight = 1 }, { name = "b", weight = 9999 }]"#;
    gw.reload(load(&config(&o, last))).expect("reload");
    stop.store(true, Ordering::SeqCst);
    let mut served = 0;
    for t in load_tasks {
        served += tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("load finished")
            .expect("no failed request");
    }
    assert!(
        served >= 200,
        "only {served} requests ran under the reloads"
    );
    eprintln!("{served} requests under 201 reloads, none failed");
    let after = spread(g.addr, 500, 4, &[]).await;
    assert!(after.get("0").copied().unwrap_or(0) <= 5, "{after:?}");
    let m = g.gateway().metrics_text();
    assert_eq!(metric(&m, "keymaster_errors_total"), 0.0, "no errors:\n{m}");
    assert!(o.iter().all(|x| x.hits() > 0), "every cluster served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_clients_split_cookie_fields_override_too() {
    use http_body_util::BodyExt;
    let o = Named::many("", 3).await;
    let route = r#"clusters = [{ name = "a", weight = 9999 }, { name = "c", weight = 1 }]
cluster_override = { cookie = "km-cluster" }"#;
    let g = start_gateway(&config(&o, route));
    let mut h2 = h2_client(g.addr).await;
    for _ in 0..20 {
        // RFC 9113 §8.2.3: an HTTP/2 client may send each cookie in a field of its own.
        let req = http::Request::get(format!("http://{}/", g.addr))
            .header("cookie", "a=1")
            .header("cookie", "km-cluster=c")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = h2.send_request(req).await.expect("h2 response");
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "2");
    }
    assert_eq!(picks(&g, "c", "override"), 20.0);
}
