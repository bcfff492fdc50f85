//! Rule 1, bodies: request and response bodies stream through byte-identical in both framings,
//! bodyless responses stay bodyless, `Expect: 100-continue`, trailers, gzip pass-through and a
//! verbatim request target.
mod support;
use bytes::Bytes;
use http_body_util::Full;
use std::time::Duration;
use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const MIB: usize = 1024 * 1024;

/// A deterministic, non-repeating-looking body of `n` bytes.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

/// Decode a complete chunked body; returns (data, trailer section text). Panics on bad framing.
fn dechunk(mut b: &[u8]) -> (Vec<u8>, String) {
    let mut out = Vec::new();
    loop {
        let i = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size line");
        let line = std::str::from_utf8(&b[..i]).unwrap();
        let size = usize::from_str_radix(line.split(';').next().unwrap().trim(), 16).unwrap();
        b = &b[i + 2..];
        if size == 0 {
            let end = b
                .windows(2)
                .position(|w| w == b"\r\n")
                .expect("trailer end");
            // The trailer section ends at the first empty line.
            let rest = std::str::from_utf8(b).unwrap();
            let t_end = if end == 0 {
                0
            } else {
                rest.find("\r\n\r\n").expect("trailers end") + 2
            };
            return (out, rest[..t_end].to_string());
        }
        out.extend_from_slice(&b[..size]);
        assert_eq!(&b[size..size + 2], b"\r\n", "chunk data ends with CRLF");
        b = &b[size + 2..];
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_request_body_streams_to_the_origin_byte_identical() {
    let (g, _stub) = gateway_with_stub();
    let body = pattern(MIB);
    let mut c = Client::connect(g.addr).await;
    let req = http::Request::post("/up?echo=1")
        .body(Full::new(Bytes::from(body.clone())))
        .unwrap();
    let r = c.send(req).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), MIB);
    assert!(r.body == body, "echoed body differs");

    // The origin saw the declared length, not a re-framed body.
    let req = http::Request::post("/__inspect")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let r = c.send(req).await;
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["body_len"], MIB as u64);
    let cl = v["headers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h[0] == "content-length")
        .map(|h| h[1].as_str().unwrap().to_string());
    assert_eq!(cl.as_deref(), Some("1048576"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_request_body_streams_to_the_origin_byte_identical() {
    let (g, _stub) = gateway_with_stub();
    let body = pattern(MIB);
    let mut s = TcpStream::connect(g.addr).await.unwrap();
    s.write_all(
        b"POST /up?echo=1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    for chunk in body.chunks(64 * 1024 - 3) {
        s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
            .await
            .unwrap();
        s.write_all(chunk).await.unwrap();
        s.write_all(b"\r\n").await.unwrap();
    }
    s.write_all(b"0\r\n\r\n").await.unwrap();
    let raw = read_for(&mut s, Duration::from_secs(5)).await;
    let (head, rest) = split_head(&raw);
    assert_eq!(status_of(&raw), Some(200), "{head}");
    assert_eq!(
        head_header(&head, "transfer-encoding"),
        Some("chunked"),
        "{head}"
    );
    let (data, _) = dechunk(rest);
    assert_eq!(data.len(), MIB);
    assert!(data == body, "echoed body differs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_request_body_reaches_the_origin_chunked() {
    let (g, _stub) = gateway_with_stub();
    let raw = raw(
        g.addr,
        b"POST /__inspect HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    let (head, rest) = split_head(&raw);
    assert_eq!(status_of(&raw), Some(200), "{head}");
    let json = if head_header(&head, "transfer-encoding") == Some("chunked") {
        dechunk(rest).0
    } else {
        rest.to_vec()
    };
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(v["body_len"], 11);
    let names: Vec<&str> = v["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h[0].as_str().unwrap())
        .collect();
    assert!(names.contains(&"transfer-encoding"), "{names:?}");
    assert!(!names.contains(&"content-length"), "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_response_passes_through() {
    let (g, _stub) = gateway_with_stub();
    let raw = raw(
        g.addr,
        b"GET /x?length=100000 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    let (head, rest) = split_head(&raw);
    assert_eq!(status_of(&raw), Some(200), "{head}");
    assert_eq!(head_header(&head, "content-length"), Some("100000"));
    assert_eq!(head_header(&head, "transfer-encoding"), None);
    assert!(rest == &stub_body(100000)[..], "body differs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_response_passes_through() {
    let (g, _stub) = gateway_with_stub();
    let raw = raw(
        g.addr,
        b"GET /x?length=100000&chunked=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    let (head, rest) = split_head(&raw);
    assert_eq!(status_of(&raw), Some(200), "{head}");
    assert_eq!(head_header(&head, "transfer-encoding"), Some("chunked"));
    assert_eq!(head_header(&head, "content-length"), None);
    let (data, _) = dechunk(rest);
    assert!(data[..] == stub_body(100000)[..], "body differs");
}

/// Send `first` then a pipelined `GET /next?length=5` with `Connection: close` and return the
/// two heads and whatever followed the second head. Bytes between the heads would mean the
/// first response carried a body.
async fn bodyless_then_next(g: &TestGateway, first: &str) -> (String, String, Vec<u8>) {
    let req = format!(
        "{first}\r\nHost: x\r\n\r\nGET /next?length=5 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let raw = raw(g.addr, req.as_bytes(), Duration::from_secs(5)).await;
    let (h1, rest) = split_head(&raw);
    assert!(
        rest.starts_with(b"HTTP/1.1 "),
        "bytes after the bodyless response: {:?}",
        String::from_utf8_lossy(rest)
    );
    let (h2, rest2) = split_head(rest);
    (h1, h2, rest2.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_response_has_no_body() {
    let (g, _stub) = gateway_with_stub();
    let (h1, h2, rest) = bodyless_then_next(&g, "HEAD /x?length=1000 HTTP/1.1").await;
    assert!(h1.starts_with("HTTP/1.1 200 "), "{h1}");
    assert_eq!(head_header(&h1, "content-length"), Some("1000"), "{h1}");
    assert!(h2.starts_with("HTTP/1.1 200 "), "{h2}");
    assert_eq!(rest, stub_body(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_content_204_has_no_body() {
    let (g, _stub) = gateway_with_stub();
    let (h1, h2, rest) = bodyless_then_next(&g, "GET /x?status=204 HTTP/1.1").await;
    assert!(h1.starts_with("HTTP/1.1 204 "), "{h1}");
    assert_eq!(head_header(&h1, "transfer-encoding"), None, "{h1}");
    assert!(h2.starts_with("HTTP/1.1 200 "), "{h2}");
    assert_eq!(rest, stub_body(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_modified_304_has_no_body() {
    let (g, _stub) = gateway_with_stub();
    let (h1, h2, rest) = bodyless_then_next(&g, "GET /x?status=304 HTTP/1.1").await;
    assert!(h1.starts_with("HTTP/1.1 304 "), "{h1}");
    assert_eq!(head_header(&h1, "transfer-encoding"), None, "{h1}");
    assert!(h2.starts_with("HTTP/1.1 200 "), "{h2}");
    assert_eq!(rest, stub_body(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_is_answered_before_the_body() {
    let (g, _stub) = gateway_with_stub();
    let mut s = TcpStream::connect(g.addr).await.unwrap();
    s.write_all(
        b"POST /x?echo=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut carry = Vec::new();
    let interim = read_head(&mut s, &mut carry)
        .await
        .expect("an interim response before the body is sent");
    assert!(
        interim.starts_with("HTTP/1.1 100 Continue\r\n"),
        "{interim}"
    );
    // Anything after the 100 can only be the start of the final response: the echo origin
    // may send its 200 head before the body arrives (a server may answer early).
    assert!(
        carry.is_empty() || carry.starts_with(b"HTTP/1.1 200 "),
        "{:?}",
        String::from_utf8_lossy(&carry)
    );
    s.write_all(b"hello").await.unwrap();
    let more = read_for(&mut s, Duration::from_secs(5)).await;
    carry.extend_from_slice(&more);
    let (head, rest) = split_head(&carry);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let body = if head_header(&head, "transfer-encoding") == Some("chunked") {
        dechunk(rest).0
    } else {
        rest.to_vec()
    };
    assert_eq!(body, b"hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_is_not_forwarded_upstream() {
    let (g, _stub) = gateway_with_stub();
    let mut s = TcpStream::connect(g.addr).await.unwrap();
    s.write_all(
        b"POST /__inspect HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut carry = Vec::new();
    let interim = read_head(&mut s, &mut carry).await.unwrap();
    assert!(interim.starts_with("HTTP/1.1 100 "), "{interim}");
    s.write_all(b"abc").await.unwrap();
    let raw = read_for(&mut s, Duration::from_secs(5)).await;
    carry.extend_from_slice(&raw);
    let (head, rest) = split_head(&carry);
    let json = if head_header(&head, "transfer-encoding") == Some("chunked") {
        dechunk(rest).0
    } else {
        rest.to_vec()
    };
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(v["body_len"], 3);
    assert!(
        !v["headers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h[0] == "expect"),
        "{v}"
    );
}

/// An origin that answers every request with a chunked body and a trailer, and reports the
/// request's TE header in `x-saw-te`.
async fn trailer_origin() -> RawOrigin {
    raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        while let Some(head) = read_head(&mut s, &mut carry).await {
            let te = head_header(&head, "te").unwrap_or("-").to_string();
            let resp = format!(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-checksum\r\nx-saw-te: {te}\r\n\r\n5\r\nhello\r\n0\r\nx-checksum: abc123\r\n\r\n"
            );
            if s.write_all(resp.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_pass_through_when_the_client_accepts_them() {
    let origin = trailer_origin().await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    let raw = raw(
        g.addr,
        b"GET /t HTTP/1.1\r\nHost: x\r\nTE: trailers\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    let (head, rest) = split_head(&raw);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert_eq!(head_header(&head, "x-saw-te"), Some("trailers"), "{head}");
    assert_eq!(head_header(&head, "transfer-encoding"), Some("chunked"));
    let (data, trailers) = dechunk(rest);
    assert_eq!(data, b"hello");
    assert_eq!(trailers, "x-checksum: abc123\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_content_encoding_passes_byte_identical() {
    let (g, _stub) = gateway_with_stub();
    let mut c = Client::connect(g.addr).await;
    let r = c.get("/g?length=20000&gzip=1").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-encoding"], "gzip");
    assert!(r.body == stub_body_gzip(20000), "gzip body differs");

    let req = http::Request::get("/g?length=20000&chunked=1")
        .header("accept-encoding", "gzip")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let r = c.send(req).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-encoding"], "gzip");
    assert!(r.body == stub_body_gzip(20000), "gzip body differs");
}

/// An origin that answers with the raw request line it received as the body.
async fn request_line_origin() -> RawOrigin {
    raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        while let Some(head) = read_head(&mut s, &mut carry).await {
            let line = head.split("\r\n").next().unwrap_or("").to_string();
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{line}",
                line.len()
            );
            if s.write_all(resp.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_target_is_forwarded_verbatim_with_the_raw_path_policy() {
    let origin = request_line_origin().await;
    let raw_path = "path = { forward = \"raw\", escaped_slashes = \"keep\" }";
    let g = start_gateway(&config_text(origin.addr, raw_path, ""));
    for target in [
        "/a%2Fb/../c?x=%20&y",
        "/./x//y/%2e%2e/z?q=a+b&q=%3D#",
        "/UPPER/%7e?",
        "/",
        "/p;param=1?a=1&a=2",
    ] {
        let target = target.trim_end_matches('#');
        let req = format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let raw = raw(g.addr, req.as_bytes(), Duration::from_secs(5)).await;
        let (head, rest) = split_head(&raw);
        assert!(head.starts_with("HTTP/1.1 200 "), "{target}: {head}");
        assert_eq!(
            String::from_utf8_lossy(rest),
            format!("GET {target} HTTP/1.1"),
            "target {target}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_target_is_sent_in_origin_form() {
    let origin = request_line_origin().await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    let raw = raw(
        g.addr,
        b"GET http://example.com/a%2Cb?x=1 HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    let (head, rest) = split_head(&raw);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert_eq!(String::from_utf8_lossy(rest), "GET /a%2Cb?x=1 HTTP/1.1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_are_not_requested_or_sent_without_te_trailers() {
    let origin = trailer_origin().await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    let raw = raw(
        g.addr,
        b"GET /t HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    let (head, rest) = split_head(&raw);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert_eq!(head_header(&head, "x-saw-te"), Some("-"), "{head}");
    let (data, trailers) = dechunk(rest);
    assert_eq!(data, b"hello");
    assert_eq!(trailers, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_delimited_response_is_relayed_completely() {
    let origin = raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        if read_head(&mut s, &mut carry).await.is_some() {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nhello until close")
                .await;
        }
    })
    .await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    let mut c = Client::connect(g.addr).await;
    let r = c.get("/").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, "hello until close");
    // The close-delimited connection is not reused: the next request opens a new one.
    let r = c.get("/").await;
    assert_eq!(r.body, "hello until close");
    assert_eq!(origin.connections(), 2);
}
