//! Black-box tests of the stub origin over raw TCP on 127.0.0.1.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use keymaster_bench::stub::{spawn_stub, stub_body, stub_body_gzip, StubHandle};

fn start() -> StubHandle {
    spawn_stub("127.0.0.1:0".parse().unwrap(), 2).expect("stub starts")
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Sends `raw` and reads until the server closes (requests carry `Connection: close`).
fn exchange(addr: SocketAddr, raw: &[u8]) -> Vec<u8> {
    let mut s = connect(addr);
    s.write_all(raw).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("read to close");
    out
}

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Splits a raw response into head and the raw bytes after it (not de-chunked).
fn split(raw: &[u8]) -> Resp {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let n = match resp.parse(raw).expect("valid response head") {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => panic!("partial head: {:?}", String::from_utf8_lossy(raw)),
    };
    Resp {
        status: resp.code.unwrap(),
        headers: resp
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_owned(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect(),
        body: raw[n..].to_vec(),
    }
}

/// Decodes a complete chunked body, returning the data and the number of chunks.
fn dechunk(mut raw: &[u8]) -> (Vec<u8>, usize) {
    let mut out = Vec::new();
    let mut chunks = 0;
    loop {
        let line_end = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size line");
        let size_str = std::str::from_utf8(&raw[..line_end]).unwrap();
        let size = usize::from_str_radix(size_str.split(';').next().unwrap().trim(), 16).unwrap();
        raw = &raw[line_end + 2..];
        if size == 0 {
            assert_eq!(raw, b"\r\n", "no trailers, nothing after the last chunk");
            return (out, chunks);
        }
        chunks += 1;
        out.extend_from_slice(&raw[..size]);
        assert_eq!(&raw[size..size + 2], b"\r\n");
        raw = &raw[size + 2..];
    }
}

fn get(addr: SocketAddr, target: &str, extra: &str) -> Resp {
    let req = format!("GET {target} HTTP/1.1\r\nHost: stub\r\n{extra}Connection: close\r\n\r\n");
    split(&exchange(addr, req.as_bytes()))
}

fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .read_to_end(&mut out)
        .expect("gzip");
    out
}

#[test]
fn default_and_length_are_exact() {
    let stub = start();
    let addr = stub.local_addr();
    assert_ne!(addr.port(), 0);
    let r = get(addr, "/", "");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, stub_body(keymaster_bench::stub::DEFAULT_LENGTH));
    for n in [0usize, 1, 1000, 10_000, 300_000] {
        let r = get(addr, &format!("/any/path?length={n}"), "");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-length"), Some(n.to_string().as_str()));
        assert_eq!(r.header("content-encoding"), None);
        assert!(r.body == stub_body(n), "length {n}: body differs");
    }
    stub.shutdown();
}

#[test]
fn gzip_by_parameter_or_accept_encoding_is_byte_stable() {
    let stub = start();
    let addr = stub.local_addr();
    for n in [1000usize, 10_000, 200_000] {
        let expect = stub_body_gzip(n);
        for (target, extra) in [
            (format!("/?length={n}&gzip=1"), ""),
            (
                format!("/?length={n}"),
                "Accept-Encoding: deflate, gzip\r\n",
            ),
        ] {
            let r = get(addr, &target, extra);
            assert_eq!(r.header("content-encoding"), Some("gzip"));
            assert_eq!(
                r.header("content-length"),
                Some(expect.len().to_string().as_str())
            );
            assert!(r.body == expect, "{target}: gzip bytes differ");
            assert!(gunzip(&r.body) == stub_body(n));
        }
    }
    let r = get(addr, "/?length=1000&gzip=0", "Accept-Encoding: gzip\r\n");
    assert_eq!(r.header("content-encoding"), None);
    assert_eq!(r.body, stub_body(1000));
}

#[test]
fn chunked_framing_on_the_wire() {
    let stub = start();
    let addr = stub.local_addr();
    let r = get(addr, "/?length=10000&chunked=1", "");
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert_eq!(r.header("content-length"), None);
    let (body, chunks) = dechunk(&r.body);
    assert_eq!(body, stub_body(10_000));
    assert!(chunks >= 3, "4 KiB chunks, got {chunks}");

    let r = get(addr, "/?length=5000&chunked=1&gzip=1", "");
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert_eq!(dechunk(&r.body).0, stub_body_gzip(5000));

    let r = get(addr, "/?length=0&chunked=1", "");
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert_eq!(r.body, b"0\r\n\r\n");
}

#[test]
fn status_parameter_and_bad_values() {
    let stub = start();
    let addr = stub.local_addr();
    for code in [201u16, 404, 500, 503] {
        let r = get(addr, &format!("/?status={code}&length=100"), "");
        assert_eq!(r.status, code);
        assert_eq!(r.body, stub_body(100));
    }
    let r = get(addr, "/?length=abc", "");
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("length=abc"));
}

#[test]
fn head_204_and_304_have_no_body() {
    let stub = start();
    let addr = stub.local_addr();
    let raw = exchange(
        addr,
        b"HEAD /?length=1000 HTTP/1.1\r\nHost: stub\r\nConnection: close\r\n\r\n",
    );
    let r = split(&raw);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("1000"));
    assert!(r.body.is_empty(), "HEAD sent {} body bytes", r.body.len());

    let raw = exchange(
        addr,
        b"HEAD /?length=1000&gzip=1 HTTP/1.1\r\nHost: stub\r\nConnection: close\r\n\r\n",
    );
    let r = split(&raw);
    let gz_len = stub_body_gzip(1000).len().to_string();
    assert_eq!(r.header("content-length"), Some(gz_len.as_str()));
    assert!(r.body.is_empty());

    for code in [204u16, 304] {
        let r = get(addr, &format!("/?status={code}&length=1000"), "");
        assert_eq!(r.status, code);
        assert_eq!(r.header("content-length"), None, "{code}");
        assert_eq!(r.header("transfer-encoding"), None, "{code}");
        assert!(r.body.is_empty(), "{code}");
    }

    // Framing must also hold on a kept-alive connection: HEAD, 204, 304, then a normal GET.
    let mut s = connect(addr);
    s.write_all(
        b"HEAD /?length=500 HTTP/1.1\r\nHost: s\r\n\r\n\
          GET /?status=204 HTTP/1.1\r\nHost: s\r\n\r\n\
          GET /?status=304 HTTP/1.1\r\nHost: s\r\n\r\n\
          GET /?length=7 HTTP/1.1\r\nHost: s\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let mut rest = &raw[..];
    for expect in [200u16, 204, 304] {
        let r = split(rest);
        assert_eq!(r.status, expect);
        let head_len = rest.len() - r.body.len();
        rest = &rest[head_len..];
    }
    let last = split(rest);
    assert_eq!(last.status, 200);
    assert_eq!(last.body, stub_body(7));
}

#[test]
fn keep_alive_serves_many_requests_on_one_connection() {
    let stub = start();
    let mut s = connect(stub.local_addr());
    for i in 0..50usize {
        let n = 100 + i;
        // One write per request (`write!` would issue several and meet Nagle + delayed ACK).
        let req = format!("GET /?length={n} HTTP/1.1\r\nHost: s\r\n\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let read = s.read(&mut chunk).unwrap();
            assert!(read > 0, "closed early");
            buf.extend_from_slice(&chunk[..read]);
            let r = split_if_complete(&buf);
            if let Some(body_at) = r {
                if buf.len() - body_at >= n {
                    assert_eq!(&buf[body_at..], &stub_body(n)[..]);
                    break;
                }
            }
        }
    }
}

fn split_if_complete(raw: &[u8]) -> Option<usize> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    match httparse::Response::new(&mut headers).parse(raw) {
        Ok(httparse::Status::Complete(n)) => Some(n),
        _ => None,
    }
}

#[test]
fn delay_holds_the_response() {
    let stub = start();
    let start = Instant::now();
    let r = get(stub.local_addr(), "/?delay=100&length=10", "");
    assert_eq!(r.status, 200);
    assert!(start.elapsed() >= Duration::from_millis(100));
}

#[test]
fn echo_streams_the_request_body_back() {
    let stub = start();
    let payload: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let mut req = format!(
        "POST /up?echo=1 HTTP/1.1\r\nHost: s\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        payload.len()
    )
    .into_bytes();
    req.extend_from_slice(&payload);
    let r = split(&exchange(stub.local_addr(), &req));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert!(dechunk(&r.body).0 == payload);
}

#[test]
fn inspect_reports_the_request() {
    let stub = start();
    let raw = exchange(
        stub.local_addr(),
        b"POST /__inspect?a=1&b=%20x HTTP/1.1\r\nHost: stub\r\nX-One: 1\r\nX-Two: 2\r\n\
          X-One: 3\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    );
    let r = split(&raw);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
    assert_eq!(v["method"], "POST");
    assert_eq!(v["uri"], "/__inspect?a=1&b=%20x");
    assert_eq!(v["version"], "HTTP/1.1");
    assert_eq!(v["body_len"], 5);
    let headers: Vec<(String, String)> = v["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h[0].as_str().unwrap().into(), h[1].as_str().unwrap().into()))
        .collect();
    let pairs: Vec<(&str, &str)> = headers
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("host", "stub"),
            ("x-one", "1"),
            ("x-one", "3"),
            ("x-two", "2"),
            ("content-length", "5"),
            ("connection", "close"),
        ]
    );
}

#[test]
fn shutdown_closes_the_listener_and_drop_stops_too() {
    let stub = start();
    let addr = stub.local_addr();
    let mut idle = connect(addr);
    stub.shutdown();
    assert!(TcpStream::connect(addr).is_err(), "listener closed");
    // The kept-alive connection was closed too.
    let mut buf = [0u8; 16];
    assert_eq!(idle.read(&mut buf).unwrap_or(0), 0);

    let addr = {
        let stub = start();
        stub.local_addr()
    };
    assert!(TcpStream::connect(addr).is_err(), "dropped stub stopped");
}

#[tokio::test]
async fn runs_beside_a_current_thread_runtime_and_speaks_h2c() {
    use http_body_util::{BodyExt, Empty};
    let stub = start();
    let tcp = tokio::net::TcpStream::connect(stub.local_addr())
        .await
        .unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .expect("h2c handshake");
    tokio::spawn(conn);
    let req = http::Request::get(format!("http://{}/?length=3000&gzip=1", stub.local_addr()))
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.expect("h2 response");
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.headers()["content-encoding"], "gzip");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, stub_body_gzip(3000));
    drop(send);
    // Dropping the handle from async code must not deadlock.
    drop(stub);
}
