//! Body opt-in (issue 4, Model §3): a filter that declares it needs the request or response
//! body gets it buffered up to `[filter_body]` caps (413 past the request cap, 502 past the
//! response cap), readable and replaceable, with Content-Length following; requests no such
//! filter matches stream untouched past the caps. Covered for Lua (the shipped
//! `redact_body.lua`, `wrap_response.lua`) and for a native filter.
mod lua_support;
mod support;

use bytes::Bytes;
use http_body_util::Full;
use keymaster_config::FilterStage;
use keymaster_gateway::filter::{done, Filter, FilterCtx, FilterFuture, FilterSpec, Needs};
use lua_support::*;
use support::*;
use tokio::io::AsyncWriteExt;

/// Echoes the request body as `got:<body>` (Content-Length bodies), or answers `?size=N`
/// with N bytes; `x-got-length` is the Content-Length it received.
async fn body_origin() -> RawOrigin {
    raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        while let Some(head) = read_head(&mut s, &mut carry).await {
            let cl: usize = head_header(&head, "content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let body = read_exact_body(&mut s, &mut carry, cl).await;
            let target = head.split(' ').nth(1).unwrap_or("/").to_string();
            let out = match target.split_once("size=") {
                Some((_, n)) => vec![b'a'; n.parse().unwrap_or(0)],
                None => [b"got:".as_slice(), &body].concat(),
            };
            let resp = format!(
                "HTTP/1.1 200 OK\r\nx-got-length: {cl}\r\nContent-Length: {}\r\n\r\n",
                out.len()
            );
            if s.write_all(resp.as_bytes()).await.is_err() || s.write_all(&out).await.is_err() {
                return;
            }
        }
    })
    .await
}

fn post(path: &str, body: impl Into<Bytes>) -> http::Request<Full<Bytes>> {
    http::Request::post(path)
        .body(Full::new(body.into()))
        .unwrap()
}

const CAPS: &str = "[filter_body]\nmax_request = \"1KiB\"\nmax_response = \"1KiB\"\n";

fn body_config(origin: std::net::SocketAddr, dir: &std::path::Path) -> String {
    // `[filter_body]` follows the `[lua]` keys as a table of its own.
    lua_config(origin, origin, dir, CAPS)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_filters_read_and_replace_bodies_within_the_caps() {
    let origin = body_origin().await;
    let dir = filters_dir(true, &[]);
    let g = start(&body_config(origin.addr, dir.path()));
    let mut c = Client::connect(g.addr).await;

    // Request body: buffered, rewritten, Content-Length follows.
    let r = c
        .send(post("/upload", "user=ann&password=hunter2&x=1"))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(body(&r), "got:user=ann&password=***&x=1");
    assert_eq!(header(&r, "x-got-length"), Some("25"));

    // Past the request cap: 413, for a declared length and for a chunked body.
    let r = c.send(post("/upload", vec![b'x'; 4096])).await;
    assert_eq!(r.status, 413);
    let chunked =
        b"POST /upload HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n".to_vec();
    let mut raw_req = chunked;
    raw_req.extend_from_slice(&[b'y'; 0x800]);
    raw_req.extend_from_slice(b"\r\n0\r\n\r\n");
    let (raw, _) = raw_exchange(g.addr, &raw_req, std::time::Duration::from_secs(5)).await;
    assert_eq!(
        status_of(&raw),
        Some(413),
        "{}",
        String::from_utf8_lossy(&raw)
    );

    // Not matched by a body filter: streams untouched past the cap.
    let mut c = Client::connect(g.addr).await;
    let r = c.send(post("/other", vec![b'z'; 4096])).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 4 + 4096);

    // Response body: buffered and replaced.
    let r = c.get("/wrap?size=100").await;
    assert_eq!(r.status, 200);
    assert_eq!(body(&r), "{\"status\":200,\"length\":100}\n");
    assert_eq!(header(&r, "content-length"), Some("28"));
    assert_eq!(header(&r, "content-type"), Some("application/json"));
    // Past the response cap: 502 (and the error filters' post pass still stamps it).
    let r = c.get("/wrap?size=4096").await;
    assert_eq!(r.status, 502);
    // Not matched: a large response streams untouched.
    let r = c.get("/plain?size=4096").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 4096);
}

/// A native post filter that upper-cases the response body it asked for.
struct Upper;
impl Filter for Upper {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        let b = ctx.response_body().map(|b| b.to_ascii_uppercase());
        if let Some(b) = b {
            ctx.set_response_body(b);
        }
        done(Ok(()))
    }

    fn needs(&self) -> Needs {
        Needs::DEFAULT | Needs::RESPONSE_BODY
    }
}

/// A native pre filter that reads the request body into a header.
struct Peek;
impl Filter for Peek {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        let n = ctx.request_body().map(|b| b.len()).unwrap_or(usize::MAX);
        ctx.request_headers_mut()
            .insert("x-peeked", http::HeaderValue::from(n));
        done(Ok(()))
    }

    fn needs(&self) -> Needs {
        Needs::DEFAULT | Needs::REQUEST_BODY
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_filters_opt_in_to_bodies_too() {
    let origin = body_origin().await;
    let natives = vec![
        FilterSpec::new("upper", FilterStage::Post, 0, Upper),
        FilterSpec::new("peek", FilterStage::Pre, 0, Peek),
    ];
    let g = start_gateway_with_filters(&config_text(origin.addr, "", CAPS), natives);
    let mut c = Client::connect(g.addr).await;
    let r = c.send(post("/echo", "hello")).await;
    assert_eq!(r.status, 200);
    assert_eq!(body(&r), "GOT:HELLO");
    let r = c.send(post("/big", vec![b'x'; 2048])).await;
    assert_eq!(
        r.status, 413,
        "the pre filter's cap applies to every request it matches"
    );
    let mut c = Client::connect(g.addr).await;
    let r = c.get("/x?size=2048").await;
    assert_eq!(r.status, 502);
}

/// Buffering a response body for a filter keeps a streamed body's bounds: an origin that
/// goes silent mid-body is given up on after `read_timeout` (504, counted as
/// `origin_read_timeout`), while a slow but steady body (10 chunks 100 ms apart) is buffered
/// whole although it takes longer than the response-header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffering_a_response_body_keeps_the_read_timeout() {
    let origin = raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        while let Some(head) = read_head(&mut s, &mut carry).await {
            let stall = head.contains("/stall");
            let resp = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n";
            if s.write_all(resp).await.is_err() {
                return;
            }
            for _ in 0..10 {
                if s.write_all(b"abcdefghij").await.is_err() {
                    return;
                }
                let pause = if stall { 10_000 } else { 100 };
                tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
            }
        }
    })
    .await;
    let route = "[[routes]]\nname = \"r\"\ncluster = \"origin\"\n\
                 read_timeout = \"1s\"\nresponse_header_timeout = \"300ms\"\n";
    let toml = config_text(origin.addr, "", &format!("{CAPS}\n{route}"));
    let natives = vec![FilterSpec::new("upper", FilterStage::Post, 0, Upper)];
    let g = start_gateway_with_filters(&toml, natives);
    let mut c = Client::connect(g.addr).await;
    let r = c.get("/steady").await;
    assert_eq!(r.status, 200);
    assert_eq!(body(&r), "ABCDEFGHIJ".repeat(10));
    let mut c = Client::connect(g.addr).await;
    let r = c.get("/stall").await;
    assert_eq!(r.status, 504);
    let m = g.gateway().metrics_text();
    let read_timeouts = "keymaster_errors_total{category=\"origin_read_timeout\",side=\"origin\"}";
    assert_eq!(metric(&m, read_timeouts), 1.0);
}
