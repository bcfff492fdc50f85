//! The edge against an attacker (docs/security.md): one canonical path before routing and
//! filters, on HTTP/1.1 and HTTP/2; `*` only for OPTIONS; no userinfo in the target;
//! `max_headers` over HTTP/2; a malformed HTTP/2 request resets its stream, not the
//! connection.
mod lua_support;
mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use lua_support::*;
use std::net::SocketAddr;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What the gateway must do with a tricky path.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// 400: no safe canonical form.
    Refused,
    /// The guard saw `/private/secret.txt`: 401 without the key; with it, the private route's
    /// origin gets exactly that path.
    Guarded,
    /// Not the private resource: the default route's origin gets this path.
    Passes(&'static str),
}
use Expect::*;

/// Paths that walked past a guarded `/private` prefix before, and more of their kind.
const TRICKS: &[(&str, Expect)] = &[
    ("/private/secret.txt", Guarded),
    ("/%70rivate/secret.txt", Guarded),
    ("/%70%72%69%76%61%74%65/secret.txt", Guarded),
    ("//private/secret.txt", Guarded),
    ("/./private/secret.txt", Guarded),
    ("/x/../private/secret.txt", Guarded),
    ("/%2e/private/secret.txt", Guarded),
    ("/public/../private/secret.txt", Guarded),
    ("/public/%2e%2e/private/secret.txt", Guarded),
    ("/public/.%2E/private/secret.txt", Guarded),
    ("/public//..//private/secret.txt", Guarded),
    ("/private/./secret.txt", Guarded),
    ("/private//secret.txt", Guarded),
    ("/%2fprivate/secret.txt", Refused),
    ("/%2Fprivate/secret.txt", Refused),
    ("/public%2f..%2fprivate/secret.txt", Refused),
    ("/%5cprivate/secret.txt", Refused),
    ("/;/private/secret.txt", Refused),
    ("/..;/private/secret.txt", Refused),
    ("/public/..;/private/secret.txt", Refused),
    ("/.;/private/secret.txt", Refused),
    ("/../private/secret.txt", Refused),
    ("/%2e%2e/private/secret.txt", Refused),
    ("/private/%00", Refused),
    ("/private%", Refused),
    ("/private/%zz", Refused),
    ("/%2570rivate/secret.txt", Passes("/%2570rivate/secret.txt")),
    ("/public/a%3bb", Passes("/public/a%3Bb")),
    ("/privatefoo/../public", Passes("/public")),
];

/// Tricks only a raw HTTP/1.1 request line can carry.
const RAW_ONLY: &[(&str, Expect)] = &[
    ("/\\private/secret.txt", Refused),
    ("/public\\..\\private/secret.txt", Refused),
];

/// A gateway whose `/private` prefix is guarded twice: route `private` (to the origin tagged
/// `private`) and the shipped `api_key.lua` filter.
async fn guarded_gateway(
    listener_extra: &str,
) -> (TestGateway, RawOrigin, RawOrigin, tempfile::TempDir) {
    let (public, private) = (echo_origin("public").await, echo_origin("private").await);
    let dir = filters_dir(
        false,
        &[(
            "api_key.lua",
            include_str!("../examples/filters/api_key.lua"),
        )],
    );
    let toml = config_text(
        public.addr,
        listener_extra,
        &format!(
            r#"
[lua]
dir = "{}"

[[routes]]
name = "private"
cluster = "private"
match = {{ path_prefix = "/private" }}

[[clusters]]
name = "private"
servers = [{{ address = "{}" }}]
"#,
            dir.path().display(),
            private.addr
        ),
    );
    let g = try_start(&toml).expect("gateway starts");
    (g, public, private, dir)
}

/// The origin's echoed request line.
fn request_line(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    text.lines().next().unwrap_or("").to_string()
}

fn check(path: &str, expect: Expect, key: bool, status: u16, origin: Option<&str>, line: &str) {
    let ctx = format!("{path} (key: {key}): {status} from {origin:?}, origin got {line:?}");
    match expect {
        Refused => assert_eq!(status, 400, "{ctx}"),
        Guarded if !key => assert_eq!(status, 401, "{ctx}"),
        Guarded => {
            assert_eq!((status, origin), (200, Some("private")), "{ctx}");
            assert_eq!(line, "GET /private/secret.txt HTTP/1.1", "{ctx}");
        }
        Passes(want) => {
            assert_eq!((status, origin), (200, Some("public")), "{ctx}");
            assert_eq!(line, format!("GET {want} HTTP/1.1"), "{ctx}");
        }
    }
}

async fn h1_request(addr: SocketAddr, target: &str, key: bool) -> (u16, Option<String>, String) {
    let key = if key { "x-api-key: let-me-in\r\n" } else { "" };
    let req = format!("GET {target} HTTP/1.1\r\nHost: gw.test\r\n{key}Connection: close\r\n\r\n");
    let (raw, _) = raw_exchange(addr, req.as_bytes(), Duration::from_secs(5)).await;
    let (head, body) = split_head(&raw);
    let status = status_of(&raw).unwrap_or(0);
    let origin = head_header(&head, "x-origin").map(str::to_string);
    (status, origin, request_line(body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_tricks_over_http1_meet_the_guard_or_a_400() {
    let (g, _public, _private, _dir) = guarded_gateway("").await;
    for &(path, expect) in TRICKS.iter().chain(RAW_ONLY) {
        for key in [false, true] {
            let (status, origin, line) = h1_request(g.addr, path, key).await;
            check(path, expect, key, status, origin.as_deref(), &line);
        }
    }
    // The absolute form carries the same path.
    for key in [false, true] {
        let target = "http://gw.test//private/./secret.txt".to_string();
        let (status, origin, line) = h1_request(g.addr, &target, key).await;
        check(&target, Guarded, key, status, origin.as_deref(), &line);
    }
}

async fn h2_send(
    sender: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    req: http::Request<Full<Bytes>>,
) -> (u16, Option<String>, Bytes) {
    sender.ready().await.expect("h2 connection usable");
    let resp = sender.send_request(req).await.expect("h2 response");
    let status = resp.status().as_u16();
    let origin = resp
        .headers()
        .get("x-origin")
        .map(|v| v.to_str().unwrap().to_string());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, origin, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_tricks_over_http2_meet_the_guard_or_a_400() {
    let (g, _public, _private, _dir) = guarded_gateway("").await;
    let mut sender = h2_client(g.addr).await;
    for &(path, expect) in TRICKS {
        for key in [false, true] {
            let mut req = http::Request::get(format!("http://gw.test{path}"));
            if key {
                req = req.header("x-api-key", "let-me-in");
            }
            let req = req.body(Full::new(Bytes::new())).unwrap();
            let (status, origin, body) = h2_send(&mut sender, req).await;
            check(
                path,
                expect,
                key,
                status,
                origin.as_deref(),
                &request_line(&body),
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_policy_keeps_runs_escapes_or_the_raw_path_when_asked() {
    // merge_slashes off: `//x` stays two segments (and so is no `/private` prefix).
    let (g, _public, _private, _dir) = guarded_gateway("path = { merge_slashes = false }").await;
    let (status, origin, line) = h1_request(g.addr, "//private/./secret.txt", false).await;
    check(
        "//private",
        Passes("//private/secret.txt"),
        false,
        status,
        origin.as_deref(),
        &line,
    );
    drop(g);

    // escaped_slashes = "keep": the escape is no separator, and the origin decides.
    let (g, _public, _private, _dir) =
        guarded_gateway("path = { escaped_slashes = \"keep\" }").await;
    let (status, origin, line) = h1_request(g.addr, "/a%2fb/%5c", false).await;
    check(
        "/a%2fb",
        Passes("/a%2Fb/%5C"),
        false,
        status,
        origin.as_deref(),
        &line,
    );
    let (status, ..) = h1_request(g.addr, "/../x", false).await;
    assert_eq!(
        status, 400,
        "a '..' above the root is refused in every mode"
    );
    drop(g);

    // forward = "raw": the guard and the route see the canonical path, the origin the
    // client's own.
    let (g, _public, _private, _dir) = guarded_gateway("path = { forward = \"raw\" }").await;
    let (status, ..) = h1_request(g.addr, "/x/../private/secret.txt", false).await;
    assert_eq!(status, 401, "the guard saw the canonical path");
    let (status, origin, line) = h1_request(g.addr, "/x/../private/secret.txt?q=1", true).await;
    assert_eq!((status, origin.as_deref()), (200, Some("private")));
    assert_eq!(line, "GET /x/../private/secret.txt?q=1 HTTP/1.1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asterisk_only_for_options_and_no_userinfo() {
    let origin = head_echo_origin().await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    let ask = |req: &'static str| async move {
        let (raw, _) = raw_exchange(g.addr, req.as_bytes(), Duration::from_secs(5)).await;
        (status_of(&raw).unwrap_or(0), raw)
    };
    let (status, _) = ask("GET * HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
    assert_eq!(status, 400, "GET * is refused");
    let (status, raw) = ask("OPTIONS * HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
    assert_eq!(status, 200, "OPTIONS * is forwarded");
    assert!(String::from_utf8_lossy(&raw).contains("OPTIONS * HTTP/1.1"));
    let (status, _) =
        ask("GET http://user:pw@a/ HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").await;
    assert_eq!(status, 400, "userinfo in an absolute-form target");
    let (status, _) = ask("GET / HTTP/1.1\r\nHost: user@a\r\nConnection: close\r\n\r\n").await;
    assert_eq!(status, 400, "userinfo in Host");
    let before = origin.connections();

    let mut sender = h2_client(g.addr).await;
    let req = http::Request::get("http://user@gw.test/")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, ..) = h2_send(&mut sender, req).await;
    assert_eq!(status, 400, "userinfo in :authority");
    assert_eq!(
        origin.connections(),
        before,
        "nothing refused reached the origin"
    );

    // `:path *` with GET, in raw frames (clients will not send it).
    let mut h2 = RawH2::connect(g.addr).await;
    h2.headers(
        1,
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":authority", "a"),
            (":path", "*"),
        ],
    )
    .await;
    assert_eq!(h2.response_status_byte(1).await, Some(STATUS_400));
    assert_eq!(
        origin.connections(),
        before,
        "GET * never reached the origin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_headers_applies_to_http2() {
    let origin = head_echo_origin().await;
    let g = start_gateway(&config_text(origin.addr, "max_headers = 20", ""));
    let mut sender = h2_client(g.addr).await;
    let request = |n: usize| {
        let mut req = http::Request::get(format!("http://{}/", g.addr));
        for i in 0..n {
            req = req.header(format!("x-field-{i}"), "v");
        }
        req.body(Full::new(Bytes::new())).unwrap()
    };
    let (status, ..) = h2_send(&mut sender, request(15)).await;
    assert_eq!(status, 200);
    let (status, ..) = h2_send(&mut sender, request(500)).await;
    assert_eq!(status, 431, "500 fields over HTTP/2");
    let (status, ..) = h2_send(&mut sender, request(15)).await;
    assert_eq!(status, 200, "the connection goes on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_http2_request_resets_its_stream_only() {
    let origin = head_echo_origin().await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    let base = [
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", "a"),
        (":path", "/"),
    ];
    let malformed: &[&[(&str, &str)]] = &[
        &[("connection", "keep-alive")],
        &[("te", "gzip")],
        &[("transfer-encoding", "chunked")],
        &[("x-a", "1"), (":path", "/again")],
        // Fields HPACK carries but HTTP forbids: the codec decodes them as malformed.
        &[("X-Upper", "1")],
        &[("x-ctl", "a\u{1}b")],
        &[("x-nul", "a\0b")],
        &[(":unknown", "x")],
        &[("x-space name", "1")],
    ];
    for extra in malformed {
        let mut h2 = RawH2::connect(g.addr).await;
        let fields: Vec<_> = base.iter().chain(extra.iter()).copied().collect();
        h2.headers(1, &fields).await;
        assert_eq!(h2.outcome(1).await, Outcome::Reset, "{extra:?}");
        h2.headers(3, &base).await;
        assert_eq!(
            h2.outcome(3).await,
            Outcome::Response,
            "{extra:?}: the connection lives on"
        );
    }
}

/// An invalid field stored in the dynamic table (literal with incremental indexing) resets
/// the stream that sent it and every stream that refers to it later, while the table stays
/// in step: a valid field indexed after it still decodes to itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_field_in_the_dynamic_table_resets_only_its_users() {
    let origin = head_echo_origin().await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    let base = [
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", "a"),
        (":path", "/"),
    ];
    let mut h2 = RawH2::connect(g.addr).await;
    let mut block = literals(&base);
    indexed_literal(&mut block, "X-Bad", "1"); // dynamic index 62
    h2.headers_block(1, &block).await;
    assert_eq!(h2.outcome(1).await, Outcome::Reset);
    let mut block = literals(&base);
    indexed_literal(&mut block, "x-good", "2"); // now 62; X-Bad moves to 63
    h2.headers_block(3, &block).await;
    assert_eq!(
        h2.outcome(3).await,
        Outcome::Response,
        "a valid field indexed after it"
    );
    let mut block = literals(&base);
    block.push(0x80 | 63); // X-Bad again, by index
    h2.headers_block(5, &block).await;
    assert_eq!(
        h2.outcome(5).await,
        Outcome::Reset,
        "the stored field is still malformed"
    );
    let mut block = literals(&base);
    block.push(0x80 | 62); // x-good by index
    h2.headers_block(7, &block).await;
    assert_eq!(
        h2.outcome(7).await,
        Outcome::Response,
        "the table is in step"
    );
}

// ---- a minimal raw HTTP/2 client: frames and HPACK literals, no decoding beyond what the
// tests read (frame types, and a response's first header byte).

/// HPACK static index 12 (`:status 400`) as an indexed field: h2 encodes that status so.
const STATUS_400: u8 = 0x80 | 12;

#[derive(Debug, PartialEq)]
enum Outcome {
    Response,
    Reset,
    GoAway,
}

struct RawH2 {
    s: TcpStream,
    carry: Vec<u8>,
}

impl RawH2 {
    async fn connect(addr: SocketAddr) -> RawH2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        s.write_all(&frame(4, 0, 0, &[])).await.unwrap();
        RawH2 {
            s,
            carry: Vec::new(),
        }
    }

    async fn headers(&mut self, stream: u32, fields: &[(&str, &str)]) {
        self.headers_block(stream, &literals(fields)).await;
    }

    async fn headers_block(&mut self, stream: u32, block: &[u8]) {
        // END_STREAM | END_HEADERS
        self.s
            .write_all(&frame(1, 0x5, stream, block))
            .await
            .unwrap();
    }

    /// The next frame: (type, flags, stream, payload); `None` on close or after 5 s.
    async fn frame(&mut self) -> Option<(u8, u8, u32, Vec<u8>)> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            if self.carry.len() >= 9 {
                let len = u32::from_be_bytes([0, self.carry[0], self.carry[1], self.carry[2]]);
                let len = len as usize;
                if self.carry.len() >= 9 + len {
                    let (ty, flags) = (self.carry[3], self.carry[4]);
                    let id = u32::from_be_bytes(self.carry[5..9].try_into().unwrap()) & !(1 << 31);
                    let payload = self.carry[9..9 + len].to_vec();
                    self.carry.drain(..9 + len);
                    return Some((ty, flags, id, payload));
                }
            }
            let mut buf = [0u8; 16384];
            match tokio::time::timeout_at(deadline, self.s.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => self.carry.extend_from_slice(&buf[..n]),
                _ => return None,
            }
        }
    }

    /// What became of `stream`: a response head, a reset, or the connection's end.
    async fn outcome(&mut self, stream: u32) -> Outcome {
        loop {
            match self.frame().await {
                None => return Outcome::GoAway,
                Some((7, ..)) => return Outcome::GoAway,
                Some((1, _, id, _)) if id == stream => return Outcome::Response,
                Some((3, _, id, _)) if id == stream => return Outcome::Reset,
                Some((4, flags, 0, _)) if flags & 1 == 0 => {
                    // Acknowledge the server's SETTINGS.
                    self.s.write_all(&frame(4, 1, 0, &[])).await.unwrap();
                }
                Some(_) => {}
            }
        }
    }

    /// The first byte of `stream`'s response header block.
    async fn response_status_byte(&mut self, stream: u32) -> Option<u8> {
        loop {
            match self.frame().await? {
                (1, _, id, payload) if id == stream => return payload.first().copied(),
                (3 | 7, ..) => return None,
                _ => {}
            }
        }
    }
}

fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], ty, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Literal fields without indexing, new names (RFC 7541 §6.2.2).
fn literals(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in fields {
        block.push(0x00);
        hpack_string(&mut block, name.as_bytes());
        hpack_string(&mut block, value.as_bytes());
    }
    block
}

/// A literal field with incremental indexing, new name (RFC 7541 §6.2.1).
fn indexed_literal(block: &mut Vec<u8>, name: &str, value: &str) {
    block.push(0x40);
    hpack_string(block, name.as_bytes());
    hpack_string(block, value.as_bytes());
}

/// An HPACK string literal without Huffman coding (RFC 7541 §5.2), its length with a 7-bit
/// prefix (§5.1).
fn hpack_string(out: &mut Vec<u8>, s: &[u8]) {
    let mut n = s.len();
    if n < 127 {
        out.push(n as u8);
    } else {
        out.push(127);
        n -= 127;
        while n >= 128 {
            out.push((n % 128) as u8 | 0x80);
            n /= 128;
        }
        out.push(n as u8);
    }
    out.extend_from_slice(s);
}
