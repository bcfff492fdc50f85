//! Reloading swaps the whole filter set atomically: under keep-alive load with reloads
//! every few milliseconds, every request runs exactly one version from its first filter to
//! its last; native filters stay registered across reloads; a bad filter config is refused
//! and the running set kept.
mod support;
use keymaster_config::{FilterStage, FilterType};
use keymaster_gateway::filter::{Filter, FilterCtx, FilterFuture, FilterSpec};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::*;

/// Version `v`: a pre filter stamps the request with `x-v: v`, a post filter the response;
/// even versions have one more post filter (`x-even`).
fn versioned(origin: SocketAddr, v: u32) -> keymaster_config::Config {
    let even = if v % 2 == 0 {
        "[[filters]]\nname = \"even\"\ntype = \"headers\"\nstage = \"post\"\nset = { x-even = \"1\" }\n"
    } else {
        ""
    };
    let text = config_text(
        origin,
        "",
        &format!(
            r#"
[[filters]]
name = "in"
type = "headers"
stage = "pre"
set = {{ x-v = "{v}" }}

[[filters]]
name = "out"
type = "headers"
stage = "post"
order = 5
set = {{ x-v = "{v}" }}

{even}
"#
        ),
    );
    keymaster_config::load_str(&text, "<test>").unwrap_or_else(|e| panic!("{e}"))
}

/// A native pre filter that yields a few times: widens the window for a reload to land
/// mid-request.
struct Yielder;
impl Filter for Yielder {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        FilterFuture::new(async move {
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            ctx.request_headers_mut()
                .insert("x-native", http::HeaderValue::from_static("yes"));
            Ok(())
        })
    }
}

fn start(origin: SocketAddr) -> TestGateway {
    let gw = Gateway::start_with_filters(
        versioned(origin, 1),
        ConfigSource::Memory,
        vec![FilterSpec::new("yielder", FilterStage::Pre, 1, Yielder)],
    )
    .expect("starts");
    let addr = gw.listener_addr("main").unwrap();
    let admin = gw.admin_addr().unwrap();
    TestGateway {
        gw: Some(gw),
        addr,
        admin,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_load_never_mixes_filter_versions() {
    let o = head_echo_origin().await;
    let g = Arc::new(start(o.addr));
    let stop = Arc::new(AtomicBool::new(false));

    let reloader = {
        let g = g.clone();
        let stop = stop.clone();
        let addr = o.addr;
        tokio::task::spawn_blocking(move || {
            let mut v = 1;
            let mut reloads = 0;
            while !stop.load(Ordering::Relaxed) {
                v += 1;
                g.gateway().reload(versioned(addr, v)).expect("reload ok");
                reloads += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            reloads
        })
    };

    let mut clients = Vec::new();
    for _ in 0..4 {
        let addr = g.addr;
        clients.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..300 {
                let r = c.get("/x").await;
                assert_eq!(r.status, 200);
                let out: u32 = r.headers["x-v"].to_str().unwrap().parse().unwrap();
                let head = String::from_utf8_lossy(&r.body).into_owned();
                let inn: u32 = head_header(&head, "x-v").unwrap().parse().unwrap();
                assert_eq!(
                    inn, out,
                    "pre and post filters of one request from one version"
                );
                assert_eq!(
                    r.headers.contains_key("x-even"),
                    out % 2 == 0,
                    "the filter set matches the version"
                );
                assert_eq!(head_header(&head, "x-native"), Some("yes"));
                seen.insert(out);
            }
            seen.len()
        }));
    }
    let mut versions = 0;
    for c in clients {
        versions += c.await.expect("client ok");
    }
    stop.store(true, Ordering::Relaxed);
    let reloads = reloader.await.unwrap();
    assert!(reloads > 5, "reloads happened: {reloads}");
    assert!(versions > 4, "clients saw several versions: {versions}");
}

#[tokio::test]
async fn invalid_filter_config_is_refused_and_the_old_set_kept() {
    let o = head_echo_origin().await;
    let g = start(o.addr);
    let mut bad = versioned(o.addr, 2);
    bad.filters[0].kind = FilterType::Cors; // no allowed_origins, wrong keys
    let err = g.gateway().reload(bad).expect_err("refused");
    assert!(err.contains("filters[0]"), "{err}");
    let r = get(g.addr, "/x").await;
    assert_eq!(r.headers["x-v"], "1");
    assert!(!r.headers.contains_key("x-even"));
    // A good reload then applies, and the native filter is still there.
    g.gateway().reload(versioned(o.addr, 2)).unwrap();
    let r = get(g.addr, "/x").await;
    assert_eq!(r.headers["x-v"], "2");
    assert_eq!(r.headers["x-even"], "1");
    assert!(String::from_utf8_lossy(&r.body).contains("x-native: yes"));
}
