//! The admin listener is not a door: a head timeout, an idle timeout and a connection cap
//! like the main listeners', a cross-site guard on `POST /reload` and on browsers of other
//! origins, and an optional bearer token on `/config` and `/reload` (probes stay open).
mod support;
use bytes::Bytes;
use http_body_util::Full;
use std::time::{Duration, Instant};
use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A gateway in front of the stub with `admin_keys` added to its `[admin]` table.
fn gateway_with_admin(admin_keys: &str) -> (TestGateway, StubHandle) {
    let s = stub();
    let listen = "listen = \"127.0.0.1:0\"";
    let toml =
        config_text(s.local_addr(), "", "").replace(listen, &format!("{listen}\n{admin_keys}"));
    (start_gateway(&toml), s)
}

/// A request to the admin listener with `headers` (Host is the admin's address).
fn request(method: &str, path: &str, headers: &[(&str, &str)]) -> http::Request<Full<Bytes>> {
    let mut b = http::Request::builder().method(method).uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::new())).unwrap()
}

async fn send(g: &TestGateway, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    Client::connect(g.admin)
        .await
        .send(request(method, path, headers))
        .await
}

fn text(r: &Reply) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// Connect, write `bytes`, and report whether the admin closed the connection within
/// `limit` (and how long it took).
async fn closed_within(g: &TestGateway, bytes: &[u8], limit: Duration) -> (bool, Duration) {
    let mut s = TcpStream::connect(g.admin).await.expect("connect");
    s.write_all(bytes).await.expect("write");
    let start = Instant::now();
    let (_, closed) = read_until_close(&mut s, limit).await;
    (closed, start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_head_is_closed_at_the_header_timeout() {
    let (g, _s) = gateway_with_admin("header_read_timeout = \"300ms\"");
    let (closed, took) = closed_within(
        &g,
        b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",
        Duration::from_secs(5),
    )
    .await;
    assert!(closed, "a partial head is still open after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_at_the_header_timeout() {
    let (g, _s) = gateway_with_admin("header_read_timeout = \"300ms\"");
    let (closed, took) = closed_within(&g, b"", Duration::from_secs(5)).await;
    assert!(closed, "a silent connection is still open after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_at_the_idle_timeout() {
    // The idle timeout is its own: far shorter than the head timeout here.
    let (g, _s) = gateway_with_admin("header_read_timeout = \"30s\"\nidle_timeout = \"300ms\"");
    let mut s = TcpStream::connect(g.admin).await.expect("connect");
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("write");
    let (answer, closed) = read_until_close(&mut s, Duration::from_secs(10)).await;
    assert_eq!(status_of(&answer), Some(200));
    assert!(closed, "an idle keep-alive connection is still open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_are_closed_while_the_first_stay() {
    let (g, _s) = gateway_with_admin("max_connections = 2");
    let mut first = TcpStream::connect(g.admin).await.expect("connect");
    let mut second = TcpStream::connect(g.admin).await.expect("connect");
    // The third is closed at once, with nothing said.
    let (answer, closed) = raw_exchange(
        g.admin,
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert!(closed && answer.is_empty(), "{:?}", text_of(&answer));
    // The first two are served.
    second
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (answer, _) = read_until_close(&mut second, Duration::from_secs(3)).await;
    assert_eq!(status_of(&answer), Some(200), "{}", text_of(&answer));
    first
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (answer, _) = read_until_close(&mut first, Duration::from_secs(3)).await;
    assert_eq!(status_of(&answer), Some(200), "{}", text_of(&answer));
    assert_eq!(
        metric(
            &text_of(&answer),
            "keymaster_admin_connections_rejected_total"
        ),
        1.0
    );
    // Their slots are given back when they close.
    drop((first, second));
    let end = Instant::now() + Duration::from_secs(3);
    let mut status = None;
    while status != Some(200) && Instant::now() < end {
        status = try_get(g.admin, "/healthz").await.map(|r| r.status);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, Some(200), "a freed slot takes a new connection");
}

fn text_of(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_refuses_requests_a_browser_sends_cross_site() {
    let (g, _s) = gateway_with_admin("");
    for headers in [
        &[("content-type", "text/plain")][..],
        &[("content-type", "application/x-www-form-urlencoded")][..],
        &[][..],
    ] {
        let r = send(&g, "POST", "/reload", headers).await;
        assert_eq!(r.status, 403, "{headers:?}: {}", text(&r));
        assert_eq!(r.headers["content-type"], "application/json");
        let j: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(j["status"], "refused");
        assert!(
            j["error"].as_str().unwrap().contains("application/json")
                && j["error"].as_str().unwrap().contains("X-Keymaster-Admin"),
            "says what was missing: {j}"
        );
    }
    assert_eq!(g.gateway().version(), 1, "nothing was reloaded");
    let r = send(
        &g,
        "POST",
        "/reload",
        &[("content-type", "application/json")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let r = send(&g, "POST", "/reload", &[("x-keymaster-admin", "1")]).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(g.gateway().version(), 3);
    let m = metrics_text(&g).await;
    assert_eq!(
        metric(
            &m,
            "keymaster_admin_requests_refused_total{reason=\"simple_request\"}"
        ),
        3.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_origin_is_refused() {
    let (g, _s) = gateway_with_admin("");
    let json = ("content-type", "application/json");
    for (method, path, origin) in [
        ("POST", "/reload", "http://evil.example"),
        ("POST", "/reload", "null"),
        ("GET", "/config", "http://evil.example"),
    ] {
        let r = send(&g, method, path, &[json, ("origin", origin)]).await;
        assert_eq!(r.status, 403, "{method} {path} from {origin}: {}", text(&r));
        assert!(text(&r).contains("cross-origin"), "{}", text(&r));
    }
    // A CORS preflight is never answered positively.
    let r = send(
        &g,
        "OPTIONS",
        "/reload",
        &[
            ("origin", "http://evil.example"),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "content-type"),
        ],
    )
    .await;
    assert_eq!(r.status, 403);
    assert!(r
        .headers
        .keys()
        .all(|k| !k.as_str().starts_with("access-control-")));
    // DNS rebinding: the page's own name, pointed at the admin.
    let r = send(
        &g,
        "POST",
        "/reload",
        &[
            json,
            ("host", "evil.example:9901"),
            ("origin", "http://evil.example:9901"),
        ],
    )
    .await;
    assert_eq!(r.status, 403, "{}", text(&r));
    assert_eq!(g.gateway().version(), 1, "nothing was reloaded");
    // The admin's own origin is fine.
    let own = format!("http://{}", g.admin);
    let r = send(&g, "POST", "/reload", &[json, ("origin", own.as_str())]).await;
    assert_eq!(r.status, 200, "{}", text(&r));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_guards_config_and_reload_only() {
    let token = "test-admin-token-0123456789";
    let (g, _s) = gateway_with_admin(&format!("token = \"{token}\""));
    let json = ("content-type", "application/json");
    let right = format!("Bearer {token}");
    // None, a wrong token, the right one without its scheme.
    for auth in [None, Some("Bearer wrong-token-0123456789"), Some(token)] {
        let mut headers = vec![json];
        headers.extend(auth.map(|a| ("authorization", a)));
        for (method, path) in [("GET", "/config"), ("POST", "/reload")] {
            let r = send(&g, method, path, &headers).await;
            assert_eq!(r.status, 401, "{method} {path} with {auth:?}");
            assert!(r.headers["www-authenticate"]
                .to_str()
                .unwrap()
                .starts_with("Bearer"));
            assert!(text(&r).contains("Authorization: Bearer"), "{}", text(&r));
        }
    }
    let auth = ("authorization", right.as_str());
    let r = send(&g, "GET", "/config", &[auth]).await;
    assert_eq!(r.status, 200);
    assert!(
        !text(&r).contains(token),
        "the token is redacted: {}",
        text(&r)
    );
    let r = send(&g, "POST", "/reload", &[json, auth]).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    // The token does not replace the cross-site guard.
    let r = send(
        &g,
        "POST",
        "/reload",
        &[auth, ("content-type", "text/plain")],
    )
    .await;
    assert_eq!(r.status, 403);
    // Probes and scrapers need no token.
    for path in ["/metrics", "/healthz", "/ready", "/health/clusters"] {
        assert_eq!(admin_get(&g, path).await.status, 200, "{path}");
    }
    let m = metrics_text(&g).await;
    assert_eq!(
        metric(
            &m,
            "keymaster_admin_requests_refused_total{reason=\"unauthorized\"}"
        ),
        6.0
    );
}
