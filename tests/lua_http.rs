//! Lua's `ctx.http` against real servers: `https://` origins verified against a configured
//! CA (a wrong CA or name is a clear error value), connections pooled per worker and
//! reused across calls and requests, the per-call timeout against stalled servers (the
//! request takes the filter's error path while other requests keep flowing), servers that
//! close idle or reused connections, the client's metrics, and `http_ca_file` errors.
mod lua_support;
mod support;
mod tls_support;
mod upstream_support;

use bytes::Bytes;
use http_body_util::Full;
use lua_support::*;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;
use tls_support::Pki;
use tokio::io::AsyncWriteExt;
use upstream_support::{spawn_origin, Origin, OriginOpts};

/// Calls `x-method` (default GET) `x-url` with `x-timeout` seconds (default: the config's)
/// and answers with the response's status and body, or the error in `x-err`. With `x-fail`
/// a failed call raises an error instead: the error stage answers.
const CALL: &str = r#"
return {
  stage = "pre",
  match = { path_prefix = "/call" },
  run = function(ctx)
    local method = ctx:header("x-method") or "GET"
    local opts = { timeout = tonumber(ctx:header("x-timeout")), body = ctx:header("x-body") }
    local r, err = ctx.http.request(method, ctx:header("x-url"), opts)
    if not r and ctx:header("x-fail") then error("lookup failed: " .. err) end
    ctx:respond(200, { ["x-status"] = r and tostring(r.status) or "-", ["x-err"] = err or "-" },
      r and r.body or "")
  end,
}
"#;

/// The error stage: which filter failed and why.
const SHOW_FAILURE: &str = r#"
return {
  stage = "error",
  run = function(ctx)
    local f = ctx:failure()
    ctx:respond(503, { ["x-failure"] = f.message }, "failed\n")
  end,
}
"#;

/// A gateway (one worker) with the call filter and `lua_keys`.
fn gateway(lua_keys: &str) -> (TestGateway, tempfile::TempDir) {
    let dir = filters_dir(false, &[("call.lua", CALL), ("show.lua", SHOW_FAILURE)]);
    let origin: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let text = config_text(
        origin,
        "",
        &format!("[lua]\ndir = \"{}\"\n{lua_keys}\n", dir.path().display()),
    );
    (start(&text), dir)
}

async fn call(c: &mut Client, url: &str, extra: &[(&str, &str)]) -> Reply {
    let mut req = http::Request::get("/call").header("x-url", url);
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    c.send(req.body(Full::new(Bytes::new())).unwrap()).await
}

fn said<'a>(r: &'a Reply, name: &str) -> &'a str {
    header(r, name).unwrap_or("-")
}

/// An HTTPS origin (HTTP/1.1) with a certificate for `localhost` from `pki`'s CA, or from
/// an unknown CA when `trusted` is false.
async fn https_origin(pki: &Pki, trusted: bool) -> Origin {
    let issued = if trusted {
        pki.issue("origin", &["localhost"], "origin", false)
    } else {
        pki.issue_untrusted("stranger", &["localhost"], "stranger", false)
    };
    spawn_origin(OriginOpts {
        tls: Some((issued.der, issued.key_der)),
        alpn: vec!["http/1.1"],
        ..OriginOpts::default()
    })
    .await
}

fn ca_key(pki: &Pki) -> String {
    format!("http_ca_file = \"{}\"", pki.ca_path().display())
}

fn lua_metric(g: &TestGateway, series: &str) -> f64 {
    metric(
        &g.gateway().metrics_text(),
        &format!("keymaster_lua_http_{series}"),
    )
}

/// A filter calls an HTTPS origin through a configured CA, with SNI; 50 calls over several
/// requests and client connections share one TLS connection; the metrics count them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_calls_verify_the_configured_ca_and_reuse_one_connection() {
    let pki = Pki::new();
    let origin = https_origin(&pki, true).await;
    let (g, _dir) = gateway(&ca_key(&pki));
    let url = format!("https://localhost:{}/info", origin.addr.port());
    let mut c = Client::connect(g.addr).await;
    for i in 0..50 {
        // A new client connection every 10 calls: the pool is the worker's, not the
        // request's or the client connection's.
        if i % 10 == 0 {
            c = Client::connect(g.addr).await;
        }
        let r = call(&mut c, &url, &[]).await;
        assert_eq!(
            said(&r, "x-status"),
            "200",
            "call {i}: {}",
            said(&r, "x-err")
        );
        let info = upstream_support::info(&r.body);
        assert_eq!(info["sni"], "localhost", "SNI is the URL's host");
        assert_eq!(info["conn"], 0, "call {i} on the first connection");
        assert_eq!(info["host"], format!("localhost:{}", origin.addr.port()));
    }
    assert_eq!(origin.connections(), 1, "50 calls, one connection");
    assert_eq!(lua_metric(&g, "calls_total{result=\"ok\"}"), 50.0);
    assert_eq!(
        lua_metric(&g, "connections_opened_total{scheme=\"https\"}"),
        1.0
    );
    assert_eq!(
        lua_metric(&g, "connections_reused_total{scheme=\"https\"}"),
        49.0
    );
    let text = g.gateway().metrics_text();
    for zero in [
        "keymaster_lua_http_calls_total{result=\"timeout\"} 0",
        "keymaster_lua_http_calls_total{result=\"tls_error\"} 0",
        "keymaster_lua_http_connections_opened_total{scheme=\"http\"} 0",
        "keymaster_lua_http_retries_total 0",
    ] {
        assert!(text.lines().any(|l| l == zero), "{zero} in /metrics");
    }
}

/// A certificate from another CA, for another name, or checked against the built-in roots
/// fails the call with an error value that says so; the gateway goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_or_name_fails_the_call_clearly() {
    let pki = Pki::new();
    let stranger = https_origin(&pki, false).await;
    let trusted = https_origin(&pki, true).await;
    let (g, _dir) = gateway(&ca_key(&pki));
    let mut c = Client::connect(g.addr).await;

    let r = call(
        &mut c,
        &format!("https://localhost:{}/info", stranger.addr.port()),
        &[],
    )
    .await;
    assert_eq!(said(&r, "x-status"), "-");
    let err = said(&r, "x-err");
    assert!(
        err.starts_with(&format!(
            "TLS handshake with localhost:{}:",
            stranger.addr.port()
        )) && err.contains("invalid peer certificate")
            && err.contains("UnknownIssuer"),
        "{err}"
    );
    // The certificate names localhost, not 127.0.0.1.
    let r = call(
        &mut c,
        &format!("https://127.0.0.1:{}/info", trusted.addr.port()),
        &[],
    )
    .await;
    assert!(said(&r, "x-err").contains("not valid for name"), "{r:?}");
    // With x-fail the script raises: the error stage shows the reason.
    let url = format!("https://localhost:{}/info", stranger.addr.port());
    let r = call(&mut c, &url, &[("x-fail", "1")]).await;
    assert_eq!(r.status, 503);
    assert!(said(&r, "x-failure").contains("UnknownIssuer"), "{r:?}");
    assert_eq!(lua_metric(&g, "calls_total{result=\"tls_error\"}"), 3.0);

    // Without http_ca_file, the built-in roots do not know the test CA.
    let (g2, _dir2) = gateway("");
    let url = format!("https://localhost:{}/info", trusted.addr.port());
    let r = call(&mut Client::connect(g2.addr).await, &url, &[]).await;
    assert!(said(&r, "x-err").contains("UnknownIssuer"), "{r:?}");
    // And a cleartext call still works on the first gateway.
    let plain = head_echo_origin().await;
    let r = call(&mut c, &format!("http://{}/x", plain.addr), &[]).await;
    assert_eq!(said(&r, "x-status"), "200", "{r:?}");
}

/// A server that reads requests and never answers: each call ends at its own timeout
/// (connect, TLS and the response all count), the request takes the filter's error path,
/// and the worker, the only one, keeps serving others meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_call_timeout_ends_stalled_calls_while_other_requests_flow() {
    let stalled = raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        while read_head(&mut s, &mut carry).await.is_some() {}
        tokio::time::sleep(Duration::from_secs(30)).await;
    })
    .await;
    // Accepts TCP but never speaks TLS: the handshake stalls.
    let mute = raw_origin(|s, _| async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(s);
    })
    .await;
    let fast = head_echo_origin().await;
    let (g, _dir) = gateway("http_max_timeout = \"2s\"");
    let stall_url = format!("http://{}/slow", stalled.addr);
    let mute_url = format!("https://localhost:{}/", mute.addr.port());

    let mut stalls = Vec::new();
    for i in 0..16 {
        let (addr, url) = (
            g.addr,
            if i % 2 == 0 { &stall_url } else { &mute_url }.clone(),
        );
        stalls.push(tokio::spawn(async move {
            let started = Instant::now();
            let mut c = Client::connect(addr).await;
            let r = call(&mut c, &url, &[("x-timeout", "1"), ("x-fail", "1")]).await;
            (r, started.elapsed())
        }));
    }
    // While the 16 calls wait, the worker (the only one) serves other requests.
    let fast_url = format!("http://{}/quick", fast.addr);
    let mut c = Client::connect(g.addr).await;
    for i in 0..30 {
        let r = call(&mut c, &fast_url, &[]).await;
        assert_eq!(said(&r, "x-status"), "200", "fast call {i}: {r:?}");
    }
    assert!(
        stalls.iter().all(|s| !s.is_finished()),
        "30 requests were served while the stalled calls waited"
    );
    for s in stalls {
        let (r, took) = s.await.unwrap();
        assert_eq!(r.status, 503, "{r:?}");
        assert!(
            said(&r, "x-failure").contains("lookup failed: timed out after 1s"),
            "{r:?}"
        );
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_secs(4),
            "{took:?}"
        );
    }
    assert_eq!(lua_metric(&g, "calls_total{result=\"timeout\"}"), 16.0);

    // A call may not wait past http_max_timeout, whatever it asks for.
    let started = Instant::now();
    let r = call(&mut c, &stall_url, &[("x-timeout", "60")]).await;
    assert_eq!(said(&r, "x-err"), "timed out after 2s");
    assert!(started.elapsed() < Duration::from_secs(4));
}

/// Time suspended in `ctx.http` is not the call's: a 300 ms answer with `max_call_time =
/// "50ms"` completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_the_answer_does_not_count_against_max_call_time() {
    let slow = raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        while read_head(&mut s, &mut carry).await.is_some() {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nslow")
                .await;
        }
    })
    .await;
    let (g, _dir) = gateway("max_call_time = \"50ms\"");
    let mut c = Client::connect(g.addr).await;
    let r = call(&mut c, &format!("http://{}/", slow.addr), &[]).await;
    assert_eq!(said(&r, "x-status"), "200", "{r:?}");
    assert_eq!(&r.body[..], b"slow");
}

/// An origin that answers the first request of each connection and then closes the
/// connection at once (without saying so), or, with `race`, reads the next request and
/// closes without answering (the close racing with reuse).
async fn one_answer_origin(race: bool) -> RawOrigin {
    raw_origin(move |mut s, i| async move {
        let mut carry = Vec::new();
        if read_head(&mut s, &mut carry).await.is_none() {
            return;
        }
        let body = format!("conn {i}");
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let _ = s.write_all(resp.as_bytes()).await;
        if race {
            let _ = read_head(&mut s, &mut carry).await;
        }
    })
    .await
}

/// A server that closes its idle connections does not break the next call: the closed
/// connection is not reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_server_closed_is_not_reused() {
    let origin = one_answer_origin(false).await;
    let (g, _dir) = gateway("");
    let mut c = Client::connect(g.addr).await;
    let url = format!("http://{}/", origin.addr);
    for i in 0..5 {
        let r = call(&mut c, &url, &[]).await;
        assert_eq!(said(&r, "x-status"), "200", "call {i}: {r:?}");
        assert_eq!(r.body, format!("conn {i}"));
        // The close reaches the gateway before the next call.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(origin.connections(), 5);
    assert_eq!(lua_metric(&g, "calls_total{result=\"ok\"}"), 5.0);
    assert_eq!(lua_metric(&g, "retries_total"), 0.0);
}

/// A server that closes a kept-alive connection just as a request arrives on it: a GET
/// (idempotent) is sent again once on a new connection; a POST is not (the server may have
/// acted on it) and fails with an error value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_racing_with_reuse_retries_idempotent_calls_once() {
    let origin = one_answer_origin(true).await;
    let (g, _dir) = gateway("");
    let mut c = Client::connect(g.addr).await;
    let url = format!("http://{}/", origin.addr);
    let r = call(&mut c, &url, &[]).await;
    assert_eq!(r.body, "conn 0");
    let r = call(&mut c, &url, &[]).await;
    assert_eq!(said(&r, "x-status"), "200", "{r:?}");
    assert_eq!(r.body, "conn 1", "sent again on a new connection");
    assert_eq!(lua_metric(&g, "retries_total"), 1.0);

    let post = [("x-method", "POST"), ("x-body", "once")];
    let r = call(&mut c, &url, &post).await;
    assert_eq!(said(&r, "x-status"), "-", "{r:?}");
    assert!(said(&r, "x-err").starts_with("request to "), "{r:?}");
    assert_eq!(
        lua_metric(&g, "retries_total"),
        1.0,
        "a POST is not retried"
    );
    let r = call(&mut c, &url, &post).await;
    assert_eq!(r.body, "conn 2", "the next POST opens a new connection");
    assert_eq!(origin.connections(), 3);
}

/// Idle connections close at `http_pool_idle_timeout`, even when their origin is not
/// called again; `http_pool_max_idle = 0` turns reuse off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_close_at_the_idle_timeout() {
    let closed = Arc::new(AtomicUsize::new(0));
    let seen = closed.clone();
    let origin = raw_origin(move |mut s, _| {
        let seen = seen.clone();
        async move {
            let mut carry = Vec::new();
            while read_head(&mut s, &mut carry).await.is_some() {
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
            }
            seen.fetch_add(1, Ordering::SeqCst);
        }
    })
    .await;
    let (g, _dir) = gateway("http_pool_idle_timeout = \"200ms\"");
    let mut c = Client::connect(g.addr).await;
    let url = format!("http://{}/", origin.addr);
    assert_eq!(call(&mut c, &url, &[]).await.body, "ok");
    assert!(
        eventually(Duration::from_secs(3), || closed.load(Ordering::SeqCst)
            == 1)
        .await,
        "the idle connection was closed by the gateway"
    );

    let (g2, _dir2) = gateway("http_pool_max_idle = 0");
    let mut c2 = Client::connect(g2.addr).await;
    for _ in 0..3 {
        assert_eq!(call(&mut c2, &url, &[]).await.body, "ok");
    }
    assert_eq!(
        origin.connections(),
        4,
        "one, then one per call without reuse"
    );
    drop(g);
}

/// An unreadable or empty CA file stops the gateway from starting, naming the key; a
/// config with a bad key names file, line and key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_ca_file_errors_name_the_key() {
    let dir = filters_dir(false, &[("call.lua", CALL)]);
    let origin: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let text = |keys: &str| {
        config_text(
            origin,
            "",
            &format!("[lua]\ndir = \"{}\"\n{keys}\n", dir.path().display()),
        )
    };
    let err = match try_start(&text("http_ca_file = \"/nonexistent/ca.pem\"")) {
        Err(e) => e,
        Ok(_) => panic!("a missing CA file is refused"),
    };
    assert!(
        err.contains("lua.http_ca_file: cannot read /nonexistent/ca.pem"),
        "{err}"
    );
    let err = keymaster_config::load_str(
        &text("http_timeout = \"5s\"\nhttp_max_timeout = \"1s\""),
        "gw.toml",
    )
    .expect_err("a default timeout past the maximum");
    let e = &err.errors()[0];
    assert_eq!(e.key, "lua.http_timeout", "{err}");
    assert!(
        e.line.is_some() && e.message.contains("http_max_timeout"),
        "{err}"
    );
}
