//! Active health checks speak the cluster's transport, each tested against real origins of
//! that kind: HTTP/1.1 over TLS with the cluster's SNI, CA and client certificate; HTTP/2 in
//! cleartext (prior knowledge) and over TLS (ALPN h2 only); gRPC's `grpc.health.v1.Health`
//! (tonic-health) for a named service, in cleartext and over TLS with `protocol = "auto"`;
//! and PROXY protocol v1 and v2 (+ TLS) origins that refuse a connection without a header
//! first.
//!
//! Each runs the same story on a two-server cluster: the checks pass (each origin saw them
//! arrive over its transport, both stay available), one origin turns unhealthy (a 503 health
//! status, stopped, or gRPC NOT_SERVING) → it is marked down and traffic avoids it, it
//! recovers → marked up and served again. Passive ejection is off, so only the checks decide.

mod support;
mod tls_support;

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::*;
use tls_support::{Issued, Pki};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};
use tonic_health::ServingStatus;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, BoxError>;

/// The gRPC service the checks ask about (the server as a whole, "", is NOT_SERVING, so a
/// check that asked for the wrong name would fail).
const SERVICE: &str = "test.Svc";
const GRPC_PREFIX: &str = "/grpc.health.v1.Health/";

/// How a test origin speaks.
#[derive(Default)]
struct Speaks {
    /// TLS with this acceptor (its ALPN list and client certificate policy).
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// Cleartext HTTP/2 by prior knowledge, nothing else.
    h2c: bool,
    /// A PROXY header (v1 or v2) must come first; a connection without one is closed.
    proxy: bool,
    /// Serve `grpc.health.v1.Health` from this reporter's statuses.
    grpc: Option<HealthReporter>,
}

/// What a connection that carried a health check presented.
#[derive(Debug, Clone, Default)]
struct Seen {
    proxy: Option<Vec<u8>>,
    sni: Option<String>,
    client_cert: bool,
    version: Option<http::Version>,
    path: String,
}

struct State {
    name: &'static str,
    /// Requests other than health checks.
    hits: AtomicUsize,
    /// `/health` answers 200 when true, else 503.
    healthy: AtomicBool,
    checks: Mutex<Vec<Seen>>,
}

/// An origin that can be stopped (listener and every connection closed) and started again
/// on the same port. `/health` and the gRPC health service are checks; anything else is
/// traffic, answered 200 with the origin's name.
struct Origin {
    addr: SocketAddr,
    state: Arc<State>,
    speaks: Arc<Speaks>,
    task: Option<JoinHandle<()>>,
}

impl Origin {
    async fn start(name: &'static str, speaks: Speaks) -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut o = Origin {
            addr: listener.local_addr().unwrap(),
            state: Arc::new(State {
                name,
                hits: AtomicUsize::new(0),
                healthy: AtomicBool::new(true),
                checks: Mutex::default(),
            }),
            speaks: Arc::new(speaks),
            task: None,
        };
        o.serve(listener);
        o
    }

    fn serve(&mut self, listener: TcpListener) {
        let (speaks, state) = (self.speaks.clone(), self.state.clone());
        self.task = Some(tokio::spawn(async move {
            // Dropping the set (when this task is aborted) closes every connection.
            let mut conns = JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                conns.spawn(connection(tcp, speaks.clone(), state.clone()));
            }
        }));
    }

    async fn stop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }

    async fn restart(&mut self) {
        let listener = TcpListener::bind(self.addr).await.expect("rebind");
        self.serve(listener);
    }

    fn hits(&self) -> usize {
        self.state.hits.load(Ordering::SeqCst)
    }

    fn checks(&self) -> Vec<Seen> {
        self.state.checks.lock().unwrap().clone()
    }

    async fn set_grpc(&self, status: ServingStatus) {
        let reporter = self.speaks.grpc.as_ref().expect("a gRPC origin");
        reporter.set_service_status(SERVICE, status).await;
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

async fn connection(mut tcp: TcpStream, speaks: Arc<Speaks>, state: Arc<State>) {
    let mut seen = Seen::default();
    if speaks.proxy {
        match read_proxy_header(&mut tcp).await {
            Some(h) => seen.proxy = Some(h),
            None => return, // no PROXY header: hang up
        }
    }
    match &speaks.tls {
        None => serve_http(TokioIo::new(tcp), speaks.h2c, seen, speaks.clone(), state).await,
        Some(acceptor) => {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let c = tls.get_ref().1;
            seen.sni = c.server_name().map(str::to_string);
            seen.client_cert = c.peer_certificates().is_some_and(|p| !p.is_empty());
            let h2 = c.alpn_protocol() == Some(b"h2");
            serve_http(TokioIo::new(tls), h2, seen, speaks.clone(), state).await
        }
    }
}

/// Exactly one v1 or v2 PROXY header, or `None` for anything else.
async fn read_proxy_header(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut h = vec![0u8; 6];
    s.read_exact(&mut h).await.ok()?;
    if h == b"PROXY " {
        while !h.ends_with(b"\r\n") {
            if h.len() >= 107 {
                return None;
            }
            h.push(s.read_u8().await.ok()?);
        }
        return Some(h);
    }
    h.resize(16, 0);
    s.read_exact(&mut h[6..]).await.ok()?;
    if h[..12] != b"\r\n\r\n\0\r\nQUIT\n"[..] {
        return None;
    }
    let len = u16::from_be_bytes([h[14], h[15]]) as usize;
    h.resize(16 + len, 0);
    s.read_exact(&mut h[16..]).await.ok()?;
    Some(h)
}

async fn serve_http<T>(io: T, h2: bool, seen: Seen, speaks: Arc<Speaks>, state: Arc<State>)
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        answer(req, seen.clone(), speaks.clone(), state.clone())
    });
    if h2 {
        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(io, svc)
            .await;
    } else {
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(io, svc)
            .await;
    }
}

async fn answer(
    req: http::Request<Incoming>,
    mut seen: Seen,
    speaks: Arc<Speaks>,
    state: Arc<State>,
) -> Result<http::Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let full = |status: u16, body: &'static str| {
        let mut r = http::Response::new(
            Full::new(Bytes::from(body))
                .map_err(|e| match e {})
                .boxed_unsync(),
        );
        *r.status_mut() = http::StatusCode::from_u16(status).unwrap();
        Ok(r)
    };
    let grpc = path.starts_with(GRPC_PREFIX);
    if path != "/health" && !grpc {
        state.hits.fetch_add(1, Ordering::SeqCst);
        return full(200, state.name);
    }
    seen.version = Some(req.version());
    seen.path = path;
    state.checks.lock().unwrap().push(seen);
    match (&speaks.grpc, grpc) {
        (Some(reporter), true) => {
            let mut svc = HealthServer::new(HealthService::from_health_reporter(reporter.clone()));
            let resp = match tonic::codegen::Service::call(&mut svc, req).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            Ok(resp.map(|b| b.map_err(BoxError::from).boxed_unsync()))
        }
        (None, true) => full(404, "no gRPC here"),
        (_, false) if state.healthy.load(Ordering::SeqCst) => full(200, "ok"),
        (_, false) => full(503, "sick"),
    }
}

/// A TLS acceptor with a certificate for `origin.test`, offering `alpn`; with `mtls`,
/// client certificates chaining to the test CA are required.
fn acceptor(pki: &Pki, alpn: &[&str], mtls: bool) -> tokio_rustls::TlsAcceptor {
    let cert = pki.issue("origin", &["origin.test"], "origin", false);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = if mtls {
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(pki.roots()),
            provider,
        )
        .build()
        .unwrap();
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut cfg = builder
        .with_single_cert(vec![cert.der], cert.key_der)
        .unwrap();
    cfg.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
}

/// The cluster's `tls` table: the test CA, SNI `origin.test`, and a client certificate.
fn tls_keys(pki: &Pki, client: Option<&Issued>) -> String {
    let cert = client
        .map(|c| {
            format!(
                ", client_cert = {{ cert = \"{}\", key = \"{}\" }}",
                c.cert_path.display(),
                c.key_path.display()
            )
        })
        .unwrap_or_default();
    format!(
        "tls = {{ ca = \"{}\", sni = \"origin.test\"{cert} }}\n",
        pki.ca_path().display()
    )
}

/// A gateway whose only cluster, "up", is `a` and `b` (round robin) with `check` in its
/// `health_check` table (50 ms apart, 2 to flip either way) and `keys` after it.
fn gateway(a: &Origin, b: &Origin, check: &str, keys: &str) -> TestGateway {
    start_gateway(&format!(
        r#"{PREAMBLE}
[[routes]]
name = "default"
cluster = "up"

[[clusters]]
name = "up"
servers = [{{ address = "{}" }}, {{ address = "{}" }}]
balance = "round_robin"
connect_timeout = "2s"
response_header_timeout = "5s"
outlier_detection = {{ consecutive_failures = 0 }}
health_check = {{ {check}interval = "50ms", timeout = "2s", healthy_threshold = 2, unhealthy_threshold = 2 }}
{keys}"#,
        a.addr, b.addr
    ))
}

fn checks_total(g: &TestGateway, result: &str) -> f64 {
    metric(
        &g.gateway().metrics_text(),
        &format!("keymaster_health_checks_total{{cluster=\"up\",result=\"{result}\"}}"),
    )
}

async fn available(g: &TestGateway, server: SocketAddr) -> bool {
    let r = admin_get(g, "/health/clusters").await;
    assert_eq!(r.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("health JSON");
    let servers = v["clusters"][0]["servers"].as_array().expect("servers");
    let s = servers
        .iter()
        .find(|s| s["address"] == server.to_string())
        .unwrap_or_else(|| panic!("{server} not in {v}"));
    s["available"] == true
}

/// Poll the admin API (bounded) until `server`'s availability is `want`.
async fn wait_available(g: &TestGateway, server: SocketAddr, want: bool) -> bool {
    let end = tokio::time::Instant::now() + Duration::from_secs(15);
    while tokio::time::Instant::now() < end {
        if available(g, server).await == want {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The checks reach both origins over their transport and pass: many checks in (several
/// times what would have turned a server down had they failed), both servers available.
async fn checks_pass(g: &TestGateway, a: &Origin, b: &Origin) {
    let arrived = eventually(Duration::from_secs(20), || {
        a.checks().len() >= 6 && b.checks().len() >= 6
    })
    .await;
    assert!(
        arrived,
        "checks arrive over the transport: a {:?}, b {:?}",
        a.checks(),
        b.checks()
    );
    assert!(
        eventually(Duration::from_secs(20), || checks_total(g, "pass") >= 12.0).await,
        "{}",
        g.gateway().metrics_text()
    );
    assert!(available(g, a.addr).await && available(g, b.addr).await);
}

/// How `b` turns unhealthy.
#[derive(Clone, Copy, Debug)]
enum Sick {
    /// `/health` answers 503.
    Status,
    /// Stopped: connections refused.
    Stopped,
    /// gRPC NOT_SERVING for the checked service.
    NotServing,
}

/// `b` turns unhealthy: marked down (counted under `category`), traffic only to `a`; `b`
/// recovers: marked up, traffic reaches it again.
async fn down_and_back(g: &TestGateway, a: &Origin, b: &mut Origin, sick: Sick) {
    match sick {
        Sick::Status => b.state.healthy.store(false, Ordering::SeqCst),
        Sick::Stopped => b.stop().await,
        Sick::NotServing => b.set_grpc(ServingStatus::NotServing).await,
    }
    assert!(
        wait_available(g, b.addr, false).await,
        "{sick:?}: b is marked down"
    );
    let category = match sick {
        Sick::Status | Sick::NotServing => "origin_unhealthy",
        Sick::Stopped => "origin_connectivity",
    };
    // Marked down after two failures; a check in flight as the origin changed may have
    // ended another way, so one of them at least has the expected category.
    assert!(
        checks_total(g, category) >= 1.0,
        "{}",
        g.gateway().metrics_text()
    );
    assert!(available(g, a.addr).await, "a stays up");
    let b_hits = b.hits();
    for _ in 0..10 {
        let r = get(g.addr, "/").await;
        assert_eq!(
            (r.status, &r.body[..]),
            (200, a.state.name.as_bytes()),
            "{sick:?}"
        );
    }
    assert_eq!(b.hits(), b_hits, "traffic avoids b");

    match sick {
        Sick::Status => b.state.healthy.store(true, Ordering::SeqCst),
        Sick::Stopped => b.restart().await,
        Sick::NotServing => b.set_grpc(ServingStatus::Serving).await,
    }
    assert!(
        wait_available(g, b.addr, true).await,
        "{sick:?}: b is marked up again"
    );
    let mut served = Vec::new();
    for _ in 0..10 {
        let r = get(g.addr, "/").await;
        assert_eq!(r.status, 200);
        served.push(r.body);
    }
    assert!(
        served
            .iter()
            .any(|body| &body[..] == b.state.name.as_bytes()),
        "b serves again: {served:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_checks_use_the_clusters_sni_ca_and_client_certificate() {
    let pki = Pki::new();
    let client = pki.issue("gw-client", &[], "keymaster", true);
    let speaks = || Speaks {
        tls: Some(acceptor(&pki, &["http/1.1"], true)),
        ..Speaks::default()
    };
    let a = Origin::start("a", speaks()).await;
    let mut b = Origin::start("b", speaks()).await;
    let g = gateway(
        &a,
        &b,
        "path = \"/health\", ",
        &tls_keys(&pki, Some(&client)),
    );
    checks_pass(&g, &a, &b).await;
    for seen in a.checks().iter().chain(&b.checks()) {
        assert_eq!(seen.sni.as_deref(), Some("origin.test"), "{seen:?}");
        assert!(seen.client_cert, "{seen:?}");
        assert_eq!(seen.version, Some(http::Version::HTTP_11), "{seen:?}");
    }
    down_and_back(&g, &a, &mut b, Sick::Status).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_checks_in_cleartext_and_over_tls() {
    // Prior knowledge: the origins speak nothing but HTTP/2.
    let h2c = || Speaks {
        h2c: true,
        ..Speaks::default()
    };
    let a = Origin::start("a", h2c()).await;
    let mut b = Origin::start("b", h2c()).await;
    let g = gateway(&a, &b, "path = \"/health\", ", "protocol = \"h2\"\n");
    checks_pass(&g, &a, &b).await;
    for seen in a.checks().iter().chain(&b.checks()) {
        assert_eq!(seen.version, Some(http::Version::HTTP_2), "{seen:?}");
        assert_eq!(seen.path, "/health");
    }
    down_and_back(&g, &a, &mut b, Sick::Stopped).await;
    drop(g);

    // TLS whose ALPN offers h2 only.
    let pki = Pki::new();
    let tls = || Speaks {
        tls: Some(acceptor(&pki, &["h2"], false)),
        ..Speaks::default()
    };
    let a = Origin::start("a", tls()).await;
    let mut b = Origin::start("b", tls()).await;
    let keys = format!("protocol = \"h2\"\n{}", tls_keys(&pki, None));
    let g = gateway(&a, &b, "path = \"/health\", ", &keys);
    checks_pass(&g, &a, &b).await;
    for seen in a.checks().iter().chain(&b.checks()) {
        assert_eq!(seen.version, Some(http::Version::HTTP_2), "{seen:?}");
        assert_eq!(seen.sni.as_deref(), Some("origin.test"), "{seen:?}");
    }
    down_and_back(&g, &a, &mut b, Sick::Status).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_checks_ask_the_health_service_for_the_configured_service() {
    let grpc = || {
        let reporter = HealthReporter::new();
        Speaks {
            h2c: true,
            grpc: Some(reporter),
            ..Speaks::default()
        }
    };
    let a = Origin::start("a", grpc()).await;
    let mut b = Origin::start("b", grpc()).await;
    for o in [&a, &b] {
        let reporter = o.speaks.grpc.as_ref().unwrap();
        reporter
            .set_service_status("", ServingStatus::NotServing)
            .await;
        o.set_grpc(ServingStatus::Serving).await;
    }
    let check = format!("kind = \"grpc\", grpc_service = \"{SERVICE}\", ");
    let g = gateway(&a, &b, &check, "protocol = \"h2\"\n");
    checks_pass(&g, &a, &b).await;
    for seen in a.checks().iter().chain(&b.checks()) {
        assert_eq!(seen.path, "/grpc.health.v1.Health/Check", "{seen:?}");
        assert_eq!(seen.version, Some(http::Version::HTTP_2), "{seen:?}");
    }
    down_and_back(&g, &a, &mut b, Sick::NotServing).await;
    drop(g);

    // Over TLS with protocol = "auto": ALPN picks h2, the check follows.
    let pki = Pki::new();
    let grpc_tls = || Speaks {
        tls: Some(acceptor(&pki, &["h2", "http/1.1"], false)),
        ..grpc()
    };
    let a = Origin::start("a", grpc_tls()).await;
    let mut b = Origin::start("b", grpc_tls()).await;
    for o in [&a, &b] {
        o.set_grpc(ServingStatus::Serving).await;
    }
    let keys = format!("protocol = \"auto\"\n{}", tls_keys(&pki, None));
    let g = gateway(&a, &b, &check, &keys);
    checks_pass(&g, &a, &b).await;
    for seen in a.checks().iter().chain(&b.checks()) {
        assert_eq!(seen.version, Some(http::Version::HTTP_2), "{seen:?}");
        assert_eq!(seen.sni.as_deref(), Some("origin.test"), "{seen:?}");
    }
    down_and_back(&g, &a, &mut b, Sick::Stopped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_protocol_checks_send_a_header_naming_no_client_first() {
    let pp = || Speaks {
        proxy: true,
        ..Speaks::default()
    };
    let a = Origin::start("a", pp()).await;
    let mut b = Origin::start("b", pp()).await;
    let g = gateway(&a, &b, "path = \"/health\", ", "proxy_protocol = \"v1\"\n");
    checks_pass(&g, &a, &b).await;
    for seen in a.checks().iter().chain(&b.checks()) {
        assert_eq!(
            seen.proxy.as_deref(),
            Some(&b"PROXY UNKNOWN\r\n"[..]),
            "{seen:?}"
        );
    }
    down_and_back(&g, &a, &mut b, Sick::Status).await;
    drop(g);

    // v2, then TLS on the same connection: the header comes before the handshake.
    let pki = Pki::new();
    let pp_tls = || Speaks {
        proxy: true,
        tls: Some(acceptor(&pki, &["http/1.1"], false)),
        ..Speaks::default()
    };
    let a = Origin::start("a", pp_tls()).await;
    let mut b = Origin::start("b", pp_tls()).await;
    let keys = format!("proxy_protocol = \"v2\"\n{}", tls_keys(&pki, None));
    let g = gateway(&a, &b, "path = \"/health\", ", &keys);
    checks_pass(&g, &a, &b).await;
    // v2 LOCAL, no addresses: signature, version 2 | LOCAL, family unspecified, length 0.
    let local = [&b"\r\n\r\n\0\r\nQUIT\n"[..], &[0x20, 0x00, 0, 0]].concat();
    for seen in a.checks().iter().chain(&b.checks()) {
        assert_eq!(seen.proxy.as_deref(), Some(&local[..]), "{seen:?}");
        assert_eq!(seen.sni.as_deref(), Some("origin.test"), "{seen:?}");
    }
    down_and_back(&g, &a, &mut b, Sick::Stopped).await;
}
