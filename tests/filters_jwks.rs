//! The `jwt` filter with a key set fetched from a real JWKS server (`jwks`): rotation picked
//! up through an unknown `kid` and through the schedule, removed keys refused, a flood of
//! unknown ids costing one fetch per interval, an endpoint that fails or stalls (the last
//! keys stay; requests never wait), HTTPS with a private CA, and the metrics.
mod jwks_support;
mod support;
mod tls_support;
use bytes::Bytes;
use http_body_util::Full;
use jwks_support::*;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::*;

fn claims() -> serde_json::Value {
    serde_json::json!({"sub": "user-7", "iss": "https://issuer.example", "aud": "api",
        "exp": now() + 300})
}

/// A gateway whose `auth` filter takes its keys from `url`; `extra`: more `jwks` keys.
fn start(origin: SocketAddr, url: &str, extra: &str) -> TestGateway {
    start_gateway(&text(origin, url, extra))
}

fn text(origin: SocketAddr, url: &str, extra: &str) -> String {
    config_text(
        origin,
        "",
        &format!(
            r#"
[[filters]]
name = "auth"
type = "jwt"
issuer = "https://issuer.example"
audience = "api"
claims_to_headers = {{ sub = "x-user" }}
jwks = {{ url = "{url}", {extra} }}
"#
        ),
    )
}

async fn call(addr: SocketAddr, token: &str) -> Reply {
    let req = http::Request::get("/x")
        .header("authorization", format!("Bearer {token}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    Client::connect(addr).await.send(req).await
}

fn challenge(r: &Reply) -> String {
    r.headers
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

/// Call with `token` until the status is `want` (or `limit` passes).
async fn until_status(addr: SocketAddr, token: &str, want: u16, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if call(addr, token).await.status == want {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn fetches(g: &TestGateway, result: &str) -> f64 {
    let text = metrics_text(g).await;
    metric(
        &text,
        &format!("keymaster_jwks_fetches_total{{filter=\"auth\",result=\"{result}\"}}"),
    )
}

/// Poll the metric until it reaches `at_least`.
async fn until_fetches(g: &TestGateway, result: &str, at_least: f64) -> bool {
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        if fetches(g, result).await >= at_least {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn an_unknown_kid_fetches_the_rotated_set_and_removed_keys_fail() {
    let (k1, k2) = (TestKey::es256(), TestKey::ed25519());
    let server = JwksServer::start(jwks_doc(&[("k1", &k1)]), None);
    let o = head_echo_origin().await;
    let g = start(
        o.addr,
        &server.url(),
        r#"refresh = "1h", min_refresh = "1s""#,
    );
    let (t1, t2) = (
        k1.sign(Some("k1"), &claims()),
        k2.sign(Some("k2"), &claims()),
    );

    // The first fetch happened before the gateway took requests; every series exists.
    let r = call(g.addr, &t1).await;
    assert_eq!(r.status, 200, "{}", challenge(&r));
    assert_eq!(server.hits(), 1);
    let text = metrics_text(&g).await;
    for result in ["ok", "error", "timeout", "status", "too_large", "invalid"] {
        let series = format!("keymaster_jwks_fetches_total{{filter=\"auth\",result=\"{result}\"}}");
        assert!(text.contains(&series), "{series}");
    }
    assert_eq!(metric(&text, "keymaster_jwks_keys{filter=\"auth\"}"), 1.0);
    let last = "keymaster_jwks_last_success_timestamp_seconds{filter=\"auth\"}";
    assert!(metric(&text, last) >= (now() - 60) as f64);

    // Rotation: the new key's first token is refused at once and asks for a fetch.
    server.set_doc(jwks_doc(&[("k2", &k2)]));
    let r = call(g.addr, &t2).await;
    assert_eq!(r.status, 401);
    assert!(challenge(&r).contains("unknown kid"), "{}", challenge(&r));
    assert!(until_status(g.addr, &t2, 200, Duration::from_secs(5)).await);
    let r = call(g.addr, &t1).await;
    assert_eq!(r.status, 401, "the removed key fails");

    // A flood of unknown ids costs at most one fetch per min_refresh.
    let before = server.hits();
    let started = Instant::now();
    for i in 0..30 {
        let t = k2.sign(Some(&format!("nope-{i}")), &claims());
        assert_eq!(call(g.addr, &t).await.status, 401);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    if started.elapsed() < Duration::from_millis(900) {
        assert!(
            server.hits() <= before + 1,
            "{} fetches",
            server.hits() - before
        );
    }
    assert_eq!(fetches(&g, "error").await, 0.0);
    g.shutdown();
}

#[tokio::test]
async fn the_schedule_picks_up_a_rotation_without_any_request() {
    let (k1, k3) = (TestKey::ed25519(), TestKey::es256());
    let server = JwksServer::start(jwks_doc(&[("k1", &k1)]), None);
    let o = head_echo_origin().await;
    let g = start(
        o.addr,
        &server.url(),
        r#"refresh = "1s", min_refresh = "1s""#,
    );
    let t3 = k3.sign(Some("k3"), &claims());
    server.set_doc(jwks_doc(&[("k3", &k3)]));
    // A fetch counted after this read gets the new document (the server counts a hit before
    // it reads its document). No request is made while waiting: a k3 token would ask for a
    // fetch itself, and the schedule would not be what picked up the rotation.
    let hits = server.hits();
    assert!(eventually(Duration::from_secs(10), || server.hits() > hits).await);
    // Fetches run one after another, and `ok` counts one once its keys are in use: with as
    // many `ok` as hits now, a fetch with the new document has been published.
    let hits = server.hits() as f64;
    assert!(
        until_fetches(&g, "ok", hits).await,
        "{} ok fetches of {hits}",
        fetches(&g, "ok").await
    );
    // Known already: accepted on the first try, no unknown-kid round trip.
    let r = call(g.addr, &t3).await;
    assert_eq!(r.status, 200, "{}", challenge(&r));
    let r = call(g.addr, &k1.sign(Some("k1"), &claims())).await;
    assert_eq!(r.status, 401);
    g.shutdown();
}

#[tokio::test]
async fn a_failing_or_stalled_endpoint_keeps_the_last_keys_and_requests_never_wait() {
    let (k1, k2) = (TestKey::es256(), TestKey::es256());
    let server = JwksServer::start(jwks_doc(&[("k1", &k1)]), None);
    let o = head_echo_origin().await;
    let extra = r#"refresh = "1s", min_refresh = "200ms", timeout = "1s""#;
    let g = start(o.addr, &server.url(), extra);
    let t1 = k1.sign(Some("k1"), &claims());
    assert_eq!(call(g.addr, &t1).await.status, 200);

    server.set_mode(Mode::Fail(503));
    assert!(until_fetches(&g, "status", 2.0).await);
    assert_eq!(
        call(g.addr, &t1).await.status,
        200,
        "the last good keys stay"
    );
    let text = metrics_text(&g).await;
    assert_eq!(metric(&text, "keymaster_jwks_keys{filter=\"auth\"}"), 1.0);

    // The endpoint stalls: fetches hang until their timeout, requests answer at once.
    server.set_mode(Mode::Stall);
    let unknown = k2.sign(Some("k2"), &claims());
    let mut slowest = Duration::ZERO;
    for _ in 0..12 {
        for (token, want) in [(&t1, 200), (&unknown, 401)] {
            let started = Instant::now();
            assert_eq!(call(g.addr, token).await.status, want);
            slowest = slowest.max(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        slowest < Duration::from_millis(250),
        "a request took {slowest:?}"
    );
    assert!(until_fetches(&g, "timeout", 1.0).await);
    assert_eq!(call(g.addr, &t1).await.status, 200);

    // Back with a rotated set.
    server.set_doc(jwks_doc(&[("k2", &k2)]));
    server.set_mode(Mode::Serve);
    assert!(until_status(g.addr, &unknown, 200, Duration::from_secs(5)).await);
    assert_eq!(call(g.addr, &t1).await.status, 401);
    g.shutdown();
}

#[tokio::test]
async fn jwks_over_https_with_a_private_ca() {
    let pki = tls_support::Pki::new();
    let leaf = pki.issue("jwks", &["localhost"], "localhost", false);
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der.clone()], leaf.key_der.clone_key())
        .unwrap();
    let k = TestKey::ed25519();
    let server = JwksServer::start(jwks_doc(&[("ed", &k)]), Some(std::sync::Arc::new(tls)));
    let url = format!("https://localhost:{}/jwks", server.addr.port());
    let ca = pki.ca_path().display().to_string();
    let o = head_echo_origin().await;
    let g = start(o.addr, &url, &format!("ca = {ca:?}"));
    let r = call(g.addr, &k.sign(Some("ed"), &claims())).await;
    assert_eq!(r.status, 200, "{}", challenge(&r));
    assert_eq!(fetches(&g, "ok").await, 1.0);
    g.shutdown();
}

#[tokio::test]
async fn a_reload_keeps_the_running_key_set_without_a_fetch() {
    let k = TestKey::es256();
    let server = JwksServer::start(jwks_doc(&[("k", &k)]), None);
    let o = head_echo_origin().await;
    let g = start(o.addr, &server.url(), r#"refresh = "1h""#);
    let token = k.sign(Some("k"), &claims());
    assert_eq!(call(g.addr, &token).await.status, 200);
    let same =
        keymaster_config::load_str(&text(o.addr, &server.url(), r#"refresh = "1h""#), "t").unwrap();
    g.gateway().reload(same).unwrap();
    assert_eq!(call(g.addr, &token).await.status, 200);
    assert_eq!(server.hits(), 1, "the reload fetched again");
    g.shutdown();
}
