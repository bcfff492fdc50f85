//! Wire safety: ambiguous or malformed request heads are refused with the exact status, the
//! connection is closed, and nothing reaches the origin. Controls show valid bodies pass.
mod support;
use http::HeaderValue;
use keymaster_config::{FilterMatch, FilterStage};
use keymaster_gateway::filter::{done, Filter, FilterCtx, FilterFuture, FilterSpec};
use std::time::Duration;
use support::*;

/// A gateway with small, exact limits, and a route "/small" with a 100-byte body cap.
fn limited_gateway() -> (TestGateway, StubHandle) {
    let s = stub();
    let g = start_gateway(&config_text(
        s.local_addr(),
        r#"max_request_line = "1KiB"
max_header_bytes = "4KiB"
max_headers = 20
header_read_timeout = "2s""#,
        r#"[[routes]]
name = "small"
cluster = "origin"
match = { path_prefix = "/small" }
max_body_size = 100
"#,
    ));
    (g, s)
}

/// Send `req` on a raw socket: exactly one response with `expect`, connection closed, and the
/// origin saw no request.
async fn probe(req: &[u8], expect: u16) {
    let (g, _s) = limited_gateway();
    let (resp, closed) = raw_exchange(g.addr, req, Duration::from_secs(2)).await;
    let text = String::from_utf8_lossy(&resp);
    assert_eq!(
        status_of(&resp),
        Some(expect),
        "request {req:?} got:\n{text}"
    );
    assert_eq!(count_responses(&resp), 1, "one response only:\n{text}");
    assert!(closed, "connection must be closed after {expect}:\n{text}");
    assert_eq!(
        upstream_requests(&g),
        0.0,
        "nothing may reach the origin for {req:?}"
    );
}

macro_rules! probe {
    ($name:ident, $req:expr, $status:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            probe($req, $status).await;
        }
    };
}

// --- Content-Length / Transfer-Encoding ambiguity (a smuggled GET rides in each body) ---
probe!(
    content_length_then_transfer_encoding,
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 44\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
    400
);
probe!(
    transfer_encoding_then_content_length,
    b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 44\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
    400
);
probe!(
    two_different_content_lengths,
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nhello",
    400
);
probe!(
    content_length_list_with_different_values,
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 5\r\n\r\nhello",
    400
);
probe!(
    content_length_plus_sign,
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\nhello",
    400
);
probe!(
    content_length_negative,
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\nhello",
    400
);
probe!(
    content_length_with_inner_space,
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5 5\r\n\r\nhello",
    400
);
probe!(
    content_length_hex,
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x10\r\n\r\nhello",
    400
);
probe!(
    content_length_empty,
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: \r\n\r\nhello",
    400
);
probe!(
    transfer_encoding_gzip_only,
    b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n0\r\n\r\n",
    400
);
probe!(
    transfer_encoding_chunked_then_gzip,
    b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n",
    400
);
probe!(
    transfer_encoding_split_over_two_lines_ending_in_gzip,
    b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n0\r\n\r\n",
    400
);
probe!(
    transfer_encoding_on_http_1_0,
    b"POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    400
);

// --- Malformed header lines ---
probe!(
    obs_fold_with_space,
    b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n",
    400
);
probe!(
    obs_fold_with_tab,
    b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n\tc\r\n\r\n",
    400
);
probe!(
    bare_cr_in_header_value,
    b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\rX-B: c\r\n\r\n",
    400
);
probe!(
    nul_in_header_value,
    b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\x00c\r\n\r\n",
    400
);
probe!(
    control_char_in_header_value,
    b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\x01c\r\n\r\n",
    400
);
probe!(
    del_in_header_value,
    b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\x7fc\r\n\r\n",
    400
);
probe!(
    space_before_colon,
    b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length : 5\r\n\r\nhello",
    400
);

// --- Request line ---
probe!(
    nul_in_request_target,
    b"GET /a\x00b HTTP/1.1\r\nHost: a\r\n\r\n",
    400
);
probe!(
    control_char_in_request_target,
    b"GET /a\x01b HTTP/1.1\r\nHost: a\r\n\r\n",
    400
);
probe!(
    del_in_request_target,
    b"GET /a\x7fb HTTP/1.1\r\nHost: a\r\n\r\n",
    400
);
probe!(
    invalid_method_token,
    b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n",
    400
);
probe!(version_1_2, b"GET / HTTP/1.2\r\nHost: a\r\n\r\n", 400);
probe!(
    version_2_0_in_h1_line,
    b"GET / HTTP/2.0\r\nHost: a\r\n\r\n",
    400
);
probe!(
    version_trailing_garbage,
    b"GET / HTTP/1.1x\r\nHost: a\r\n\r\n",
    400
);

// --- Host ---
probe!(
    missing_host_on_http_1_1,
    b"GET / HTTP/1.1\r\nX-A: b\r\n\r\n",
    400
);
probe!(
    two_host_headers,
    b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    400
);
probe!(
    host_with_a_path,
    b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n",
    400
);

// --- Limits (1KiB request line, 4KiB head, 20 fields, 100-byte body on /small) ---
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_line_over_limit_is_414() {
    let req = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(1100));
    probe(req.as_bytes(), 414).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_line_just_under_limit_passes() {
    let (g, _s) = limited_gateway();
    // "GET " + target + " HTTP/1.1" = 1000 bytes.
    let target = format!("/?{}", "a".repeat(1000 - 4 - 9 - 2));
    let req = format!("GET {target} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    let (resp, _) = raw_exchange(g.addr, req.as_bytes(), Duration::from_secs(2)).await;
    assert_eq!(
        status_of(&resp),
        Some(200),
        "{}",
        String::from_utf8_lossy(&resp)
    );
    assert_eq!(upstream_requests(&g), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_over_max_header_bytes_is_431() {
    let req = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "b".repeat(5000)
    );
    probe(req.as_bytes(), 431).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_over_max_header_bytes_in_many_fields_is_431() {
    let mut req = String::from("GET / HTTP/1.1\r\nHost: a\r\n");
    for i in 0..10 {
        req.push_str(&format!("X-F{i}: {}\r\n", "v".repeat(500)));
    }
    req.push_str("\r\n");
    probe(req.as_bytes(), 431).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_header_fields_is_431() {
    let mut req = String::from("GET / HTTP/1.1\r\nHost: a\r\n");
    for i in 0..25 {
        req.push_str(&format!("X-F{i}: v\r\n"));
    }
    req.push_str("\r\n");
    probe(req.as_bytes(), 431).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_body_over_route_limit_is_413() {
    // Head only: the gateway must answer from the declared length without reading the body.
    probe(
        b"POST /small HTTP/1.1\r\nHost: a\r\nContent-Length: 101\r\n\r\n",
        413,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_body_over_route_limit_is_413() {
    let (g, _s) = limited_gateway();
    let chunk = "x".repeat(150);
    let req = format!(
        "POST /small HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len()
    );
    let (resp, closed) = raw_exchange(g.addr, req.as_bytes(), Duration::from_secs(2)).await;
    let text = String::from_utf8_lossy(&resp);
    assert_eq!(status_of(&resp), Some(413), "{text}");
    assert!(closed, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_chunk_size_is_400() {
    let (g, _s) = limited_gateway();
    let req = b"POST /__inspect HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n";
    let (resp, closed) = raw_exchange(g.addr, req, Duration::from_secs(2)).await;
    let text = String::from_utf8_lossy(&resp);
    assert_eq!(status_of(&resp), Some(400), "{text}");
    assert!(closed, "{text}");
}

// --- Controls: valid bodies go through, keep-alive stays open ---
async fn inspect(g: &TestGateway, req: &[u8]) -> serde_json::Value {
    let (resp, _) = raw_exchange(g.addr, req, Duration::from_secs(2)).await;
    let text = String::from_utf8_lossy(&resp).to_string();
    assert_eq!(status_of(&resp), Some(200), "{text}");
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valid_chunked_post_goes_through() {
    let (g, _s) = limited_gateway();
    let j = inspect(
        &g,
        b"POST /__inspect HTTP/1.1\r\nHost: a\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(j["method"], "POST");
    assert_eq!(j["body_len"], 11);
    assert_eq!(upstream_requests(&g), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valid_content_length_post_goes_through() {
    let (g, _s) = limited_gateway();
    let j = inspect(
        &g,
        b"POST /__inspect HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello",
    )
    .await;
    assert_eq!(j["body_len"], 5);
    let cl: Vec<_> = j["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h[0] == "content-length")
        .collect();
    assert_eq!(cl.len(), 1, "{j}");
    assert_eq!(upstream_requests(&g), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_at_route_limit_goes_through() {
    let (g, _s) = limited_gateway();
    let req = format!(
        "POST /small/__inspect HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 100\r\n\r\n{}",
        "x".repeat(100)
    );
    let (resp, _) = raw_exchange(g.addr, req.as_bytes(), Duration::from_secs(2)).await;
    assert_eq!(
        status_of(&resp),
        Some(200),
        "{}",
        String::from_utf8_lossy(&resp)
    );
    assert_eq!(upstream_requests(&g), 1.0);
}

// --- Framing fields a filter or an edit sets never reach the origin as they are ---

/// An origin that reads each request by the framing its head declares (Content-Length,
/// chunked, or none) and answers with `<head>|<body>`, keep-alive, so that a head whose
/// framing disagrees with the body sent shows up as a wrong body or a garbled next request.
async fn framing_echo_origin() -> RawOrigin {
    use tokio::io::AsyncWriteExt;
    raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        while let Some(head) = read_head(&mut s, &mut carry).await {
            let body = if let Some(n) = head_header(&head, "content-length") {
                let n = n.parse().unwrap_or(0);
                read_exact_body(&mut s, &mut carry, n).await
            } else if head_header(&head, "transfer-encoding").is_some() {
                let mut body = Vec::new();
                loop {
                    let Some(line) = read_line(&mut s, &mut carry).await else {
                        return;
                    };
                    let size = usize::from_str_radix(line.trim(), 16).unwrap_or(0);
                    if size == 0 {
                        read_line(&mut s, &mut carry).await; // the empty trailer section
                        break;
                    }
                    body.extend(read_exact_body(&mut s, &mut carry, size).await);
                    read_exact_body(&mut s, &mut carry, 2).await; // CRLF
                }
                body
            } else {
                Vec::new()
            };
            let echo = format!("{head}|{}", String::from_utf8_lossy(&body));
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{echo}",
                echo.len()
            );
            if s.write_all(resp.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await
}

/// One line (through CRLF) from `s` after what `carry` holds, within 5 s.
async fn read_line(s: &mut tokio::net::TcpStream, carry: &mut Vec<u8>) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut buf = [0u8; 4096];
    loop {
        if let Some(i) = carry.windows(2).position(|w| w == b"\r\n") {
            let line = String::from_utf8_lossy(&carry[..i]).into_owned();
            carry.drain(..i + 2);
            return Some(line);
        }
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => carry.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
}

/// A native `pre` filter that sets (`/set`) or adds (`/added`) a Content-Length field.
/// (Configured edits cannot name it: the config is refused, see tests/filters_config.rs.)
struct Length(bool);
impl Filter for Length {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        let (name, value) = (http::header::CONTENT_LENGTH, HeaderValue::from_static("2"));
        match self.0 {
            true => ctx.set_request_header(name, value),
            false => ctx.append_request_header(name, value),
        }
        done(Ok(()))
    }
}

/// Requests whose Content-Length a filter sets or adds to something else than their body:
/// a shorter length (the rest of the body would be read as another request on the pooled
/// connection), a longer one (the origin would wait for bytes that never come), one on a
/// chunked body, one on a bodyless GET. The origin must get the body exactly as the client
/// sent it, framed by what the gateway writes; and the next request on the same connections
/// must arrive whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_length_set_by_a_filter_never_misframes_the_body() {
    let origin = framing_echo_origin().await;
    let only = |prefix: &str| FilterMatch {
        path_prefix: Some(prefix.into()),
        ..Default::default()
    };
    let g = start_gateway_with_filters(
        &config_text(origin.addr, "", ""),
        vec![
            FilterSpec::new("set", FilterStage::Pre, 0, Length(true)).with_match(only("/set")),
            FilterSpec::new("add", FilterStage::Pre, 0, Length(false)).with_match(only("/added")),
        ],
    );
    let mut s = tokio::net::TcpStream::connect(g.addr).await.unwrap();
    for path in ["/set", "/added"] {
        for (req, body) in [
            (format!("POST {path} HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nhello world"), "hello world"),
            (format!("POST {path} HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nh"), "h"),
            (
                format!("POST {path} HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
                "hello world",
            ),
            (format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n"), ""),
        ] {
            use tokio::io::AsyncWriteExt;
            s.write_all(req.as_bytes()).await.unwrap();
            let mut carry = Vec::new();
            let head = read_head(&mut s, &mut carry).await.expect("a response");
            assert!(head.starts_with("HTTP/1.1 200"), "{req:?} got {head}");
            let n: usize = head_header(&head, "content-length").unwrap().parse().unwrap();
            let echo = read_exact_body(&mut s, &mut carry, n).await;
            let echo = String::from_utf8_lossy(&echo);
            let (sent_head, sent_body) = echo.split_once('|').unwrap();
            assert_eq!(sent_body, body, "{req:?}: the origin read\n{echo}");
            assert!(
                sent_head.starts_with(&format!("{} {path} ", &req[..req.find(' ').unwrap()])),
                "{echo}"
            );
            let lengths = sent_head.to_ascii_lowercase().matches("content-length:").count();
            assert!(lengths <= 1, "{req:?}: {sent_head}");
        }
    }
    assert_eq!(
        origin.connections(),
        1,
        "one pooled connection served them all"
    );
}

// --- Strict framing on every path: nothing ambiguous or malformed leaves as it came ---

/// A length sent more than once (identical lines, or a list of one value) is one length,
/// and the origin gets it as one `content-length` line, on the default path where the head
/// stays in wire form and on the map path alike (`X-Forwarded-For` takes the map); the body
/// and the next request on the pooled connection arrive whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_content_lengths_reach_the_origin_as_one() {
    use tokio::io::AsyncWriteExt;
    let origin = framing_echo_origin().await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    let mut s = tokio::net::TcpStream::connect(g.addr).await.unwrap();
    for extra in ["", "X-Forwarded-For: 192.0.2.1\r\n"] {
        for lengths in [
            "Content-Length: 5\r\nContent-Length: 5\r\n",
            "Content-Length: 5, 5\r\n",
            "content-length: 5\r\nX-A: 1\r\nCONTENT-LENGTH: 5,5\r\n",
            "Content-Length: 5\r\n",
        ] {
            let req = format!("POST /dup HTTP/1.1\r\nHost: a\r\n{extra}{lengths}\r\nhello");
            s.write_all(req.as_bytes()).await.unwrap();
            let mut carry = Vec::new();
            let head = read_head(&mut s, &mut carry).await.expect("a response");
            assert!(head.starts_with("HTTP/1.1 200"), "{req:?} got {head}");
            let n: usize = head_header(&head, "content-length")
                .unwrap()
                .parse()
                .unwrap();
            let echo = read_exact_body(&mut s, &mut carry, n).await;
            let echo = String::from_utf8_lossy(&echo);
            let (sent_head, sent_body) = echo.split_once('|').unwrap();
            assert_eq!(sent_body, "hello", "{req:?}: the origin read\n{echo}");
            let sent: Vec<&str> = sent_head
                .split("\r\n")
                .filter(|l| l.to_ascii_lowercase().starts_with("content-length:"))
                .collect();
            assert_eq!(sent.len(), 1, "{req:?}: {sent_head}");
            assert_eq!(
                sent[0].split_once(':').unwrap().1.trim(),
                "5",
                "{sent_head}"
            );
        }
    }
    assert_eq!(
        origin.connections(),
        1,
        "one pooled connection served them all"
    );
}

/// Chunked bodies whose framing is broken in the bytes that came with the head: a size
/// that overflows, a negative size, a `0x` prefix, data longer than its size. Each gets
/// 400 and the connection closes, and the origin (which counts its connections) never hears
/// of the request: the body that came with the head is checked before the head goes
/// anywhere, and the refusal is counted like any bad request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_chunks_that_came_with_the_head_never_reach_the_origin() {
    let origin = framing_echo_origin().await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    for body in [
        &b"10000000000000000\r\nhello\r\n0\r\n\r\n"[..],
        b"-5\r\nhello\r\n0\r\n\r\n",
        b"0x5\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhelloEXTRA\r\n0\r\n\r\n",
        b"5\r\nhelloX",
        b"3\r\nabc\r\nzz\r\n",
    ] {
        let mut req =
            b"POST /chunks HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        req.extend_from_slice(body);
        let (resp, closed) = raw_exchange(g.addr, &req, Duration::from_secs(2)).await;
        let text = String::from_utf8_lossy(&resp);
        let shown = String::from_utf8_lossy(body);
        assert_eq!(status_of(&resp), Some(400), "{shown:?} got:\n{text}");
        assert_eq!(count_responses(&resp), 1, "{shown:?}:\n{text}");
        assert!(closed, "{shown:?}: the connection closes");
    }
    assert_eq!(
        origin.connections(),
        0,
        "no malformed body reached the origin"
    );
    assert_eq!(upstream_requests(&g), 0.0);
    // Refused by the proxy stage like any bad request: counted (and logged) as one.
    let m = g.gateway().metrics_text();
    let counted = metric(
        &m,
        "keymaster_errors_total{category=\"client_bad_request\",side=\"client\"}",
    );
    assert_eq!(counted, 6.0, "{m}");
}

/// A chunked body that comes after its head still streams (never buffered unless a route
/// or filter opts in): the origin has the head and the first chunk while the client still
/// holds back the rest, which then follows through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_body_that_comes_later_still_streams() {
    use tokio::io::AsyncWriteExt;
    let (first_in, got_first) = tokio::sync::oneshot::channel::<()>();
    let first_in = std::sync::Mutex::new(Some(first_in));
    let origin = raw_origin(move |mut s, _| {
        let signal = first_in.lock().unwrap().take();
        async move {
            let mut carry = Vec::new();
            let Some(_head) = read_head(&mut s, &mut carry).await else {
                return;
            };
            let first = read_exact_body(&mut s, &mut carry, b"5\r\nhello\r\n".len()).await;
            assert_eq!(first, b"5\r\nhello\r\n");
            if let Some(tx) = signal {
                let _ = tx.send(());
            }
            let rest = read_exact_body(&mut s, &mut carry, b"6\r\n world\r\n0\r\n\r\n".len()).await;
            let resp = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", rest.len());
            let _ = s.write_all(resp.as_bytes()).await;
            let _ = s.write_all(&rest).await;
        }
    })
    .await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    let mut s = tokio::net::TcpStream::connect(g.addr).await.unwrap();
    s.write_all(
        b"POST /stream HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    )
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(5), got_first)
        .await
        .expect("the origin has the first chunk before the rest is sent")
        .unwrap();
    s.write_all(b"6\r\n world\r\n0\r\n\r\n").await.unwrap();
    let mut carry = Vec::new();
    let head = read_head(&mut s, &mut carry).await.expect("a response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}
