//! Response compression, opt-in per route: `Accept-Encoding` negotiation with q-values, each
//! exclusion rule, the head of a compressed response, byte-identical bodies on a route
//! without compression, streams that keep streaming (server-sent events), large bodies over
//! HTTP/1.1 and HTTP/2 decoded and compared, and the metrics. Real clients (curl, Python)
//! are in `compression_clients.rs`.
mod compression_support;
mod support;

use bytes::Bytes;
use compression_support::*;
use http_body_util::{BodyExt, Full};
use std::time::Duration;
use support::*;

fn request(method: &str, path: &str, accept: Option<&str>) -> http::Request<Full<Bytes>> {
    let mut b = http::Request::builder().method(method).uri(path);
    if let Some(a) = accept {
        b = b.header("accept-encoding", a);
    }
    b.body(Full::new(Bytes::new())).unwrap()
}

async fn fetch(g: &TestGateway, method: &str, path: &str, accept: Option<&str>) -> Reply {
    Client::connect(g.addr)
        .await
        .send(request(method, path, accept))
        .await
}

fn field<'a>(r: &'a Reply, name: &str) -> Option<&'a str> {
    r.headers.get(name).map(|v| v.to_str().unwrap())
}

/// The body as the client gets it once decoded.
fn decoded(r: &Reply) -> Vec<u8> {
    match field(r, "content-encoding") {
        Some(e) => decode(e, &r.body),
        None => r.body.to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_algorithm_follows_q_values_then_the_routes_order() {
    let o = origin().await;
    let g = gateway(&o);
    let cases: &[(&str, Option<&str>, Option<&str>)] = &[
        ("/z/", Some("gzip, deflate, br, zstd"), Some("zstd")),
        ("/z/", Some("gzip"), Some("gzip")),
        ("/z/", Some("br;q=1, gzip;q=0.5"), Some("br")),
        ("/z/", Some("zstd;q=0.1, gzip;q=0.9"), Some("gzip")),
        ("/z/", Some("*"), Some("zstd")),
        ("/z/", Some("*, zstd;q=0"), Some("br")),
        ("/z/", Some("x-gzip;q=0.3"), Some("gzip")),
        ("/z/", Some("gzip;q=0"), None),
        ("/z/", Some("*;q=0"), None),
        ("/z/", Some("identity"), None),
        ("/z/", Some("gzip;q=0.5, identity"), None),
        ("/z/", Some("deflate, compress"), None),
        ("/z/", Some(""), None),
        ("/z/", None, None),
        ("/g/", Some("zstd, br, gzip"), Some("gzip")),
        ("/g/", Some("br, gzip;q=0.9"), Some("br")),
        ("/g/", Some("zstd"), None),
    ];
    for &(prefix, accept, want) in cases {
        let r = fetch(&g, "GET", &format!("{prefix}text/20000"), accept).await;
        assert_eq!(r.status, 200);
        assert_eq!(field(&r, "content-encoding"), want, "{prefix} {accept:?}");
        assert_eq!(decoded(&r), body(20000), "{prefix} {accept:?}");
        // Eligible either way: a cache must keep the versions apart.
        assert_eq!(field(&r, "vary"), Some("Origin, Accept-Encoding"));
        if want.is_some() {
            assert!(
                r.body.len() < 20000 / 2,
                "{accept:?}: {} bytes",
                r.body.len()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_response_is_chunked_with_a_weak_etag() {
    let o = origin().await;
    let g = gateway(&o);
    let req = b"GET /z/text/20000 HTTP/1.1\r\nHost: t\r\nAccept-Encoding: br\r\nConnection: close\r\n\r\n";
    let raw = raw(g.addr, req, Duration::from_secs(2)).await;
    let (head, rest) = split_head(&raw);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert_eq!(head_header(&head, "content-encoding"), Some("br"));
    assert_eq!(head_header(&head, "transfer-encoding"), Some("chunked"));
    assert_eq!(head_header(&head, "content-length"), None, "{head}");
    assert_eq!(head_header(&head, "accept-ranges"), None, "{head}");
    assert_eq!(head_header(&head, "etag"), Some("W/\"v1\""));
    assert_eq!(head_header(&head, "vary"), Some("Origin, Accept-Encoding"));
    assert!(rest.ends_with(b"0\r\n\r\n"), "ends with the last chunk");

    // HTTP/1.0: no chunked framing; the body runs until close.
    let req = b"GET /z/text/20000 HTTP/1.0\r\nHost: t\r\nAccept-Encoding: gzip\r\n\r\n";
    let raw = support::raw(g.addr, req, Duration::from_secs(2)).await;
    let (head, rest) = split_head(&raw);
    assert_eq!(head_header(&head, "content-encoding"), Some("gzip"));
    assert_eq!(head_header(&head, "transfer-encoding"), None, "{head}");
    assert_eq!(decode("gzip", rest), body(20000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excluded_responses_pass_unchanged() {
    let o = origin().await;
    let g = gateway(&o);
    let all = Some("gzip, br, zstd");
    // Not compressible: the media type, already encoded, a range, no-transform, too small.
    for path in [
        "/z/png/20000",
        "/z/encoded/20000",
        "/z/range/20000",
        "/z/notransform/20000",
        "/z/text/1000",
    ] {
        let r = fetch(&g, "GET", path, all).await;
        let n = body(path.rsplit('/').next().unwrap().parse().unwrap());
        assert_eq!(&r.body[..], n, "{path}");
        let origin_encoding = path.contains("encoded").then_some("gzip");
        assert_eq!(field(&r, "content-encoding"), origin_encoding, "{path}");
        assert_eq!(
            field(&r, "content-length"),
            Some(&*n.len().to_string()),
            "{path}"
        );
        let vary = path.contains("/text/").then_some("Origin");
        assert_eq!(field(&r, "vary"), vary, "{path}");
    }
    // Bodiless: 204, 304, and HEAD (whose head still describes the uncompressed body).
    let r = fetch(&g, "GET", "/z/nocontent", all).await;
    assert_eq!((r.status, field(&r, "content-encoding")), (204, None));
    let r = fetch(&g, "GET", "/z/notmodified", all).await;
    assert_eq!((r.status, field(&r, "content-encoding")), (304, None));
    assert_eq!(field(&r, "etag"), Some("\"v1\""));
    let r = fetch(&g, "HEAD", "/z/text/20000", all).await;
    assert_eq!(field(&r, "content-encoding"), None);
    assert_eq!(field(&r, "content-length"), Some("20000"));
    assert_eq!(field(&r, "etag"), Some("\"v1\""));
    assert!(r.body.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_without_compression_is_byte_identical() {
    let o = origin().await;
    let g = gateway(&o);
    for path in ["/text/300000", "/chunked/300000"] {
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: t\r\nAccept-Encoding: gzip, br, zstd\r\nConnection: close\r\n\r\n"
        );
        let raw = raw(g.addr, req.as_bytes(), Duration::from_secs(2)).await;
        let (head, rest) = split_head(&raw);
        assert_eq!(head_header(&head, "content-encoding"), None, "{head}");
        if path.starts_with("/text") {
            assert_eq!(rest, body(300000), "byte-identical");
            assert_eq!(head_header(&head, "content-length"), Some("300000"));
            assert_eq!(head_header(&head, "etag"), Some("\"v1\""));
            assert_eq!(head_header(&head, "vary"), Some("Origin"));
            assert_eq!(head_header(&head, "accept-ranges"), Some("bytes"));
        } else {
            assert_eq!(head_header(&head, "transfer-encoding"), Some("chunked"));
            assert_eq!(head_header(&head, "vary"), None);
        }
    }
    let r = fetch(&g, "GET", "/chunked/300000", Some("gzip")).await;
    assert_eq!(&r.body[..], body(300000));
}

/// Server-sent events through every algorithm: the first event reaches the client, decoded,
/// while the origin still holds the second back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_stream_through_each_algorithm() {
    let o = origin().await;
    let g = gateway(&o);
    for encoding in ["gzip", "br", "zstd"] {
        let mut c = Client::connect(g.addr).await;
        let resp = c.stream(request("GET", "/z/sse", Some(encoding))).await;
        assert_eq!(resp.headers()["content-encoding"], encoding);
        let mut body = resp.into_body();
        let mut d = StreamDecoder::new(encoding);
        let wait = tokio::time::Instant::now() + Duration::from_secs(3);
        loop {
            let frame = tokio::time::timeout_at(wait, body.frame()).await;
            let frame = frame.unwrap_or_else(|_| panic!("{encoding}: the first event never came"));
            let data = frame.expect("a frame").unwrap().into_data().unwrap();
            if d.feed(&data) == EVENT_ONE {
                break;
            }
        }
        o.release.notify_one();
        let mut all = Vec::new();
        while let Some(f) = body.frame().await {
            all = d.feed(&f.unwrap().into_data().unwrap()).to_vec();
        }
        assert_eq!(all, [EVENT_ONE, EVENT_TWO].concat(), "{encoding}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_decode_over_http1_and_http2() {
    let o = origin().await;
    let g = gateway(&o);
    let n = 6 * 1024 * 1024;
    let mut h2 = h2_client(g.addr).await;
    for encoding in ["gzip", "br", "zstd"] {
        for kind in ["chunked", "text"] {
            let path = format!("/z/{kind}/{n}");
            let r = fetch(&g, "GET", &path, Some(encoding)).await;
            assert_eq!(field(&r, "content-encoding"), Some(encoding));
            assert!(decoded(&r) == body(n), "HTTP/1.1 {encoding} {kind}");

            let uri = format!("http://{}{path}", g.addr);
            h2.ready().await.unwrap();
            let resp = h2
                .send_request(request("GET", &uri, Some(encoding)))
                .await
                .unwrap();
            assert_eq!(resp.version(), http::Version::HTTP_2);
            assert_eq!(resp.headers()["content-encoding"], encoding);
            assert!(!resp.headers().contains_key("content-length"));
            let data = resp.into_body().collect().await.unwrap().to_bytes();
            assert!(
                decode(encoding, &data) == body(n),
                "HTTP/2 {encoding} {kind}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_responses_and_bytes_per_algorithm() {
    let o = origin().await;
    let g = gateway(&o);
    let m = metrics_text(&g).await;
    for a in ["zstd", "br", "gzip"] {
        let series =
            format!("keymaster_compressed_responses_total{{algorithm=\"{a}\",route=\"zip\"}} 0");
        assert!(m.contains(&series), "{series} missing");
        for d in ["in", "out"] {
            let s = format!("keymaster_compression_bytes_total{{algorithm=\"{a}\",direction=\"{d}\",route=\"zip\"}} 0");
            assert!(m.contains(&s), "{s} missing");
        }
    }
    // A route without compression has no series.
    assert!(!m.contains("compressed_responses_total{algorithm=\"gzip\",route=\"default\"}"));
    let r = fetch(&g, "GET", "/z/text/20000", Some("gzip")).await;
    let sent = r.body.len() as f64;
    let r2 = fetch(&g, "GET", "/z/text/50", Some("gzip")).await; // too small: not counted
    assert_eq!(field(&r2, "content-encoding"), None);
    let m = metrics_text(&g).await;
    let at = |s: &str| metric(&m, s);
    assert_eq!(
        at("keymaster_compressed_responses_total{algorithm=\"gzip\",route=\"zip\"}"),
        1.0
    );
    assert_eq!(
        at("keymaster_compressed_responses_total{algorithm=\"zstd\",route=\"zip\"}"),
        0.0
    );
    let bytes = |d: &str| {
        at(&format!("keymaster_compression_bytes_total{{algorithm=\"gzip\",direction=\"{d}\",route=\"zip\"}}"))
    };
    assert_eq!(bytes("in"), 20000.0);
    assert_eq!(bytes("out"), sent);
}
