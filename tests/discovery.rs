//! Service discovery: a cluster's DNS names re-resolved on an interval through a configured
//! name server (an in-process UDP DNS responder whose A records change mid-test), and a
//! watched server list file; removed servers get no traffic and their pools drain, and the
//! health checks move to the servers an update lists.
mod support;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::dns::dns_server;
use support::*;
use tokio::net::TcpListener;

/// A counting origin: answers its `name`; `/slow` waits for `release` first.
struct Origin {
    addr: SocketAddr,
    /// Requests that arrived / were answered.
    started: Arc<AtomicUsize>,
    served: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
    release: Arc<tokio::sync::Notify>,
}

impl Origin {
    fn served(&self) -> usize {
        self.served.load(Ordering::SeqCst)
    }
}

async fn origin(listener: TcpListener, name: &'static str) -> Origin {
    let addr = listener.local_addr().unwrap();
    let started = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(AtomicUsize::new(0));
    let open = Arc::new(AtomicUsize::new(0));
    let release = Arc::new(tokio::sync::Notify::new());
    let (st, s, o, r) = (
        started.clone(),
        served.clone(),
        open.clone(),
        release.clone(),
    );
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (st, s, o, r) = (st.clone(), s.clone(), o.clone(), r.clone());
            o.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<_>| {
                    let (st, s, r) = (st.clone(), s.clone(), r.clone());
                    async move {
                        st.fetch_add(1, Ordering::SeqCst);
                        if req.uri().path() == "/slow" {
                            r.notified().await;
                        }
                        s.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from_static(name.as_bytes()),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
                o.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    Origin {
        addr,
        started,
        served,
        open,
        release,
    }
}

fn config(cluster: &str, extra: &str) -> String {
    format!(
        r#"{PREAMBLE}
{extra}

[[routes]]
name = "default"
cluster = "origin"

[[clusters]]
name = "origin"
balance = "round_robin"
{cluster}
"#
    )
}

fn discovery_metric(g: &TestGateway, name: &str) -> f64 {
    metric(&g.gateway().metrics_text(), name)
}

/// `n` GETs of `/` on one keep-alive connection; every one must succeed.
async fn send(g: &TestGateway, n: usize) {
    let mut c = Client::connect(g.addr).await;
    for _ in 0..n {
        assert_eq!(c.get("/").await.status, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_change_moves_traffic_and_drains_the_removed_server() {
    // Two origins on one port, at 127.0.0.1 and 127.0.0.2: the A records choose.
    let mut pair = None;
    for _ in 0..20 {
        let a = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = a.local_addr().unwrap().port();
        if let Ok(b) = TcpListener::bind(("127.0.0.2", port)).await {
            pair = Some((a, b, port));
            break;
        }
    }
    let (a, b, port) = pair.expect("a port free on 127.0.0.1 and 127.0.0.2");
    let (a, b) = (origin(a, "a").await, origin(b, "b").await);
    let ips = Arc::new(Mutex::new(vec![Ipv4Addr::new(127, 0, 0, 1)]));
    let dns = dns_server(ips.clone()).await;
    let g = start_gateway(&config(
        &format!(
            "servers = [{{ address = \"svc.keymaster.test:{port}\" }}]\ndiscovery = {{ interval = \"50ms\" }}"
        ),
        &format!("[dns]\nnameservers = [\"{dns}\"]\ntimeout = \"2s\"\n"),
    ));
    let updates = "keymaster_discovery_updates_total{cluster=\"origin\"}";

    send(&g, 5).await;
    assert_eq!((a.served(), b.served()), (5, 0));
    assert_eq!(
        discovery_metric(&g, updates),
        0.0,
        "unchanged answers change nothing"
    );
    // An exchange in flight to a when the records change.
    let slow = tokio::spawn(try_get(g.addr, "/slow"));
    assert!(
        eventually(Duration::from_secs(10), || a.started.load(Ordering::SeqCst)
            == 6)
        .await
    );

    *ips.lock().unwrap() = vec![Ipv4Addr::new(127, 0, 0, 2)];
    assert!(
        eventually(Duration::from_secs(10), || discovery_metric(&g, updates)
            >= 1.0)
        .await,
        "the DNS change was never picked up"
    );
    send(&g, 10).await;
    assert_eq!(
        (a.served(), b.served()),
        (5, 10),
        "a gets nothing after the change"
    );
    // The in-flight exchange to the removed server finishes...
    a.release.notify_one();
    let r = slow
        .await
        .unwrap()
        .expect("the in-flight request completes");
    assert_eq!((r.status, &r.body[..]), (200, &b"a"[..]));
    // ...and its pooled connections are closed.
    assert!(
        eventually(Duration::from_secs(10), || a.open.load(Ordering::SeqCst)
            == 0)
        .await,
        "the removed server's pool never drained"
    );

    // Both records: both serve (round robin).
    *ips.lock().unwrap() = vec![Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2)];
    assert!(
        eventually(Duration::from_secs(10), || discovery_metric(&g, updates)
            >= 2.0)
        .await
    );
    send(&g, 20).await;
    assert_eq!((a.served(), b.served()), (16, 20));
    assert_eq!(
        discovery_metric(&g, "keymaster_discovered_servers{cluster=\"origin\"}"),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_list_change_is_picked_up_and_a_malformed_file_keeps_the_list() {
    let a = origin(TcpListener::bind("127.0.0.1:0").await.unwrap(), "a").await;
    let b = origin(TcpListener::bind("127.0.0.1:0").await.unwrap(), "b").await;
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("servers.txt");
    let write = |text: String| replace_file(&list, text);
    write(format!("# origin servers\n{}\n", a.addr));
    let g = start_gateway(&config(
        &format!(
            "discovery = {{ interval = \"50ms\", file = \"{}\" }}",
            list.display()
        ),
        "",
    ));
    let updates = "keymaster_discovery_updates_total{cluster=\"origin\"}";
    let errors = "keymaster_discovery_errors_total{cluster=\"origin\",source=\"file\"}";

    send(&g, 4).await;
    assert_eq!((a.served(), b.served()), (4, 0));

    write(format!("{} 1\n", b.addr));
    assert!(
        eventually(Duration::from_secs(10), || discovery_metric(&g, updates)
            >= 1.0)
        .await,
        "the file change was never picked up"
    );
    send(&g, 6).await;
    assert_eq!((a.served(), b.served()), (4, 6));

    // A malformed file: counted and logged, the previous list (b) stays.
    let version = g.gateway().version();
    write(format!("{}\nnot-an-address\n", a.addr));
    assert!(
        eventually(Duration::from_secs(10), || discovery_metric(&g, errors)
            >= 1.0)
        .await,
        "the malformed file was never reported"
    );
    send(&g, 6).await;
    assert_eq!((a.served(), b.served()), (4, 12));
    assert_eq!(g.gateway().version(), version);
    assert_eq!(discovery_metric(&g, updates), 1.0);
    // A reload that leaves the cluster unchanged keeps the running list (b) too.
    let g2 = g.gateway();
    tokio::task::block_in_place(|| g2.reload_from_source()).expect("reload keeps the list");
    send(&g, 2).await;
    assert_eq!((a.served(), b.served()), (4, 14));

    // Fixed again: both.
    write(format!("{}\n{}\n", a.addr, b.addr));
    assert!(
        eventually(Duration::from_secs(10), || discovery_metric(&g, updates)
            >= 2.0)
        .await
    );
    send(&g, 4).await;
    assert_eq!((a.served(), b.served()), (6, 16));
}

/// A `FilterSource` (the Lua host's way in) whose one post filter stamps `x-from-source`.
struct Stamping;
impl keymaster_gateway::filter::FilterSource for Stamping {
    fn build(
        &self,
        _: &keymaster_config::Config,
    ) -> Result<Vec<keymaster_gateway::filter::FilterSpec>, String> {
        Ok(vec![keymaster_gateway::filter::FilterSpec::new(
            "stamp",
            keymaster_config::FilterStage::Post,
            0,
            Stamp,
        )])
    }
}

struct Stamp;
impl keymaster_gateway::filter::Filter for Stamp {
    fn run<'a>(
        &'a self,
        ctx: &'a mut keymaster_gateway::filter::FilterCtx,
    ) -> keymaster_gateway::filter::FilterFuture<'a> {
        let (name, value) = ("x-from-source", http::HeaderValue::from_static("1"));
        ctx.append_response_header(http::HeaderName::from_static(name), value);
        keymaster_gateway::filter::done(Ok(()))
    }
}

/// A discovery update rebuilds the running version with the new server list and every
/// filter it had, those of filter sources (the Lua host's) included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovery_update_keeps_the_filter_sources_filters() {
    let a = origin(TcpListener::bind("127.0.0.1:0").await.unwrap(), "a").await;
    let b = origin(TcpListener::bind("127.0.0.1:0").await.unwrap(), "b").await;
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("servers.txt");
    let write = |text: String| replace_file(&list, text);
    write(format!("{}\n", a.addr));
    let toml = config(
        &format!(
            "discovery = {{ interval = \"50ms\", file = \"{}\" }}",
            list.display()
        ),
        "",
    );
    let config = keymaster_config::load_str(&toml, "<test>").expect("config");
    let sources: Vec<Arc<dyn keymaster_gateway::filter::FilterSource>> = vec![Arc::new(Stamping)];
    let gw = Gateway::start_with_sources(config, ConfigSource::Memory, Vec::new(), sources)
        .expect("gateway starts");
    let g = TestGateway {
        addr: gw.listener_addr("main").unwrap(),
        admin: gw.admin_addr().unwrap(),
        gw: Some(gw),
    };
    let mut c = Client::connect(g.addr).await;
    let r = c.get("/").await;
    assert_eq!(r.headers["x-from-source"], "1");

    write(format!("{}\n", b.addr));
    let updates = "keymaster_discovery_updates_total{cluster=\"origin\"}";
    assert!(
        eventually(Duration::from_secs(10), || discovery_metric(&g, updates)
            >= 1.0)
        .await,
        "the file change was never picked up"
    );
    let mut c = Client::connect(g.addr).await;
    let r = c.get("/").await;
    assert_eq!(b.served(), 1, "the new list is used");
    assert_eq!(
        r.headers.get("x-from-source").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
}

#[test]
fn an_unreadable_server_list_at_start_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.txt");
    let toml = config(
        &format!("discovery = {{ file = \"{}\" }}", missing.display()),
        "",
    );
    let config = keymaster_config::load_str(&toml, "<test>").unwrap();
    let err = match Gateway::start(config, ConfigSource::Memory) {
        Ok(_) => panic!("started without its servers"),
        Err(e) => e,
    };
    assert!(err.contains("cluster origin: discovery (file)"), "{err}");
    assert!(err.contains("missing.txt"), "{err}");
}

/// A discovery update is a new config version: the health checks move to the servers it
/// lists (the check thread is woken by the swap, as by a reload).
#[tokio::test]
async fn the_health_checks_follow_a_discovery_update() {
    let a = origin(TcpListener::bind("127.0.0.1:0").await.unwrap(), "a").await;
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("servers.txt");
    replace_file(&list, format!("{}\n", a.addr));
    let g = start_gateway(&config(
        &format!(
            "discovery = {{ interval = \"50ms\", file = \"{}\" }}\n\
             health_check = {{ path = \"/health\", interval = \"20ms\", timeout = \"500ms\" }}",
            list.display()
        ),
        "",
    ));
    assert!(
        eventually(Duration::from_secs(10), || health_checks(&g, "origin").0
            >= 1.0)
        .await,
        "the listed server was never checked"
    );
    // Refused connections: only the dead server refuses (a slow check of `a` would time out).
    let refused =
        "keymaster_health_checks_total{cluster=\"origin\",result=\"origin_connectivity\"}";
    assert_eq!(discovery_metric(&g, refused), 0.0);
    replace_file(&list, format!("{dead}\n"));
    assert!(
        eventually(Duration::from_secs(10), || discovery_metric(&g, refused)
            >= 1.0)
        .await,
        "the server the update listed was never checked"
    );
}

/// Write `text` beside `path`, then rename it into place: the watcher never reads a
/// half-written file.
fn replace_file(path: &std::path::Path, text: String) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}
