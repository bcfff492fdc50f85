//! Shared test harness: start the real gateway on 127.0.0.1:0 against real origins (the
//! stub or purpose-made ones) and talk to it with real clients and raw sockets.
#![allow(dead_code, unused_imports)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub mod dns;

pub use keymaster_bench::stub::{spawn_stub, stub_body, stub_body_gzip, StubHandle};
pub use keymaster_gateway::{ConfigSource, Gateway};

/// A running gateway plus the addresses tests need.
pub struct TestGateway {
    pub gw: Option<Gateway>,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
}

impl TestGateway {
    pub fn gateway(&self) -> &Gateway {
        self.gw.as_ref().expect("gateway running")
    }
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
    /// Drain and stop (blocking; call from spawn_blocking in async tests if needed).
    pub fn shutdown(mut self) {
        if let Some(gw) = self.gw.take() {
            gw.shutdown();
        }
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        if let Some(gw) = self.gw.take() {
            gw.shutdown();
        }
    }
}

/// The common head of every test config: one worker, a short drain, admin and the "main"
/// listener on ephemeral ports, keeping the test client's request ids (the tests' client is
/// no trusted proxy). Listener keys may follow directly, then routes and clusters.
pub const PREAMBLE: &str = r#"
[server]
workers = 1
drain_timeout = "5s"

[admin]
listen = "127.0.0.1:0"

[[listeners]]
name = "main"
address = "127.0.0.1:0"
request_id_from = "any"
"#;

/// A config with one listener on 127.0.0.1:0, admin on 127.0.0.1:0, one worker, one route
/// "default" for everything to cluster "origin" at `origin`. `extra` is appended verbatim
/// (more `[[routes]]`, `[[clusters]]`, or keys for the listener via `listener_extra`).
pub fn config_text(origin: SocketAddr, listener_extra: &str, extra: &str) -> String {
    format!(
        r#"{PREAMBLE}{listener_extra}

{extra}

[[routes]]
name = "default"
cluster = "origin"
priority = -100

[[clusters]]
name = "origin"
servers = [{{ address = "{origin}" }}]
connect_timeout = "1s"
response_header_timeout = "5s"
"#
    )
}

/// Start a gateway from TOML text (panics with the config errors if invalid).
pub fn start_gateway(toml: &str) -> TestGateway {
    start_gateway_with_filters(toml, Vec::new())
}

/// [`start_gateway`] with native filters registered in code.
pub fn start_gateway_with_filters(
    toml: &str,
    natives: Vec<keymaster_gateway::filter::FilterSpec>,
) -> TestGateway {
    let config = keymaster_config::load_str(toml, "<test>")
        .unwrap_or_else(|e| panic!("test config invalid:\n{e}\n---\n{toml}"));
    let gw =
        Gateway::start_with_filters(config, ConfigSource::Memory, natives).expect("gateway starts");
    let addr = gw.listener_addr("main").expect("listener main");
    let admin = gw.admin_addr().expect("admin listener");
    TestGateway {
        gw: Some(gw),
        addr,
        admin,
    }
}

/// The stub origin on an ephemeral port, one worker.
pub fn stub() -> StubHandle {
    spawn_stub("127.0.0.1:0".parse().unwrap(), 1).expect("stub starts")
}

/// A gateway in front of a fresh stub, with default settings.
pub fn gateway_with_stub() -> (TestGateway, StubHandle) {
    let s = stub();
    let g = start_gateway(&config_text(s.local_addr(), "", ""));
    (g, s)
}

/// A response as a test sees it.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// One keep-alive HTTP/1.1 client connection (hyper's low-level client).
pub struct Client {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    pub host: String,
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        let tcp = TcpStream::connect(addr).await.expect("connect to gateway");
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        Client {
            sender,
            host: addr.to_string(),
        }
    }

    /// Send a request built by the caller (Host is added if missing).
    pub async fn send(&mut self, mut req: http::Request<Full<Bytes>>) -> Reply {
        if !req.headers().contains_key(http::header::HOST) {
            req.headers_mut()
                .insert(http::header::HOST, self.host.parse().unwrap());
        }
        self.sender.ready().await.expect("connection ready");
        let resp = self.sender.send_request(req).await.expect("response");
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("full body").to_bytes();
        Reply {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        }
    }

    /// Send a request; the response's body is left to stream.
    pub async fn stream(
        &mut self,
        mut req: http::Request<Full<Bytes>>,
    ) -> http::Response<hyper::body::Incoming> {
        if !req.headers().contains_key(http::header::HOST) {
            req.headers_mut()
                .insert(http::header::HOST, self.host.parse().unwrap());
        }
        self.sender.ready().await.expect("connection ready");
        self.sender.send_request(req).await.expect("response")
    }

    pub async fn get(&mut self, path: &str) -> Reply {
        let req = http::Request::get(path)
            .body(Full::new(Bytes::new()))
            .unwrap();
        self.send(req).await
    }
}

/// GET on a fresh connection.
pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    Client::connect(addr).await.get(path).await
}

/// `conns` clients at once, each sending `each` GETs of `path` on its own keep-alive
/// connection; every answer must be 200.
pub async fn many_clients(addr: SocketAddr, conns: usize, each: usize, path: &'static str) {
    let clients: Vec<_> = (0..conns)
        .map(|_| {
            tokio::spawn(async move {
                let mut c = Client::connect(addr).await;
                for _ in 0..each {
                    assert_eq!(c.get(path).await.status, 200);
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
}

/// Write raw bytes, then read until the peer closes or `wait` passes with no new data.
pub async fn raw(addr: SocketAddr, request: &[u8], wait: Duration) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request).await.expect("write");
    read_for(&mut s, wait).await
}

/// Read until EOF or until `wait` passes without data.
pub async fn read_for(s: &mut TcpStream, wait: Duration) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match tokio::time::timeout(wait, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return out,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// The status code of the first response in raw bytes.
pub fn status_of(raw: &[u8]) -> Option<u16> {
    let s = std::str::from_utf8(raw.get(..12)?).ok()?;
    s.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// Fetch an admin path as text.
pub async fn admin_get(g: &TestGateway, path: &str) -> Reply {
    get(g.admin, path).await
}

/// POST to an admin path on a fresh connection, as the admin's cross-site guard requires
/// (`Content-Type: application/json`).
pub async fn admin_post(g: &TestGateway, path: &str) -> Reply {
    Client::connect(g.admin)
        .await
        .send(
            http::Request::post(path)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
}

/// The value of a Prometheus sample line that starts with `prefix` (e.g.
/// `keymaster_upstream_reused_total{cluster="origin"}`), or 0.
pub fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The active health checks `keymaster_health_checks_total` counted for `cluster`:
/// (passed, failed for any reason).
pub fn health_checks(g: &TestGateway, cluster: &str) -> (f64, f64) {
    let text = g.gateway().metrics_text();
    let prefix = format!("keymaster_health_checks_total{{cluster=\"{cluster}\"");
    let count = |pass: bool| {
        text.lines()
            .filter(|l| l.starts_with(&prefix) && l.contains("result=\"pass\"") == pass)
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    (count(true), count(false))
}

// ---- Added by tests-a (proxy/routing tests) ----

/// The admin `/metrics` text.
pub async fn metrics_text(g: &TestGateway) -> String {
    let m = admin_get(g, "/metrics").await;
    String::from_utf8(m.body.to_vec()).expect("metrics are utf-8")
}

/// A purpose-made origin on 127.0.0.1:0: each accepted connection is handed to `handler`
/// with its 0-based index, on its own task. `accepted` counts connections.
pub struct RawOrigin {
    pub addr: SocketAddr,
    pub accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawOrigin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawOrigin {
    pub fn connections(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

pub async fn raw_origin<F, Fut>(handler: F) -> RawOrigin
where
    F: Fn(TcpStream, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    let handler = std::sync::Arc::new(handler);
    let task = tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let i = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let h = handler.clone();
            tokio::spawn(async move { h(s, i).await });
        }
    });
    RawOrigin {
        addr,
        accepted,
        task,
    }
}

/// An origin that answers each request with the request head it received as the body.
pub async fn head_echo_origin() -> RawOrigin {
    head_echo_origin_with("").await
}

/// An origin that reads each request (and its `Content-Length` body) and answers it with
/// the request head it received as the body; `fields` (lines ending in CRLF) go into every
/// response head.
pub async fn head_echo_origin_with(fields: impl Into<String>) -> RawOrigin {
    let fields: std::sync::Arc<str> = fields.into().into();
    raw_origin(move |mut s, _| {
        let fields = fields.clone();
        async move {
            let mut carry = Vec::new();
            while let Some(head) = read_head(&mut s, &mut carry).await {
                let cl: usize = head_header(&head, "content-length")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let _ = read_exact_body(&mut s, &mut carry, cl).await;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{fields}\r\n{head}",
                    head.len()
                );
                if s.write_all(resp.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await
}

/// Read one request (or response) head up to and including the blank line, within 5 s.
/// Returns the head as text plus any bytes read past it; `None` on EOF before a full head.
pub async fn read_head(s: &mut TcpStream, carry: &mut Vec<u8>) -> Option<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut buf = [0u8; 8192];
    loop {
        if let Some(i) = carry.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&carry[..i + 4]).into_owned();
            carry.drain(..i + 4);
            return Some(head);
        }
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return None,
            Ok(Ok(n)) => carry.extend_from_slice(&buf[..n]),
        }
    }
}

/// Read exactly `n` body bytes (after what `carry` holds), within 5 s.
pub async fn read_exact_body(s: &mut TcpStream, carry: &mut Vec<u8>, n: usize) -> Vec<u8> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut buf = [0u8; 16 * 1024];
    while carry.len() < n {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(m)) => carry.extend_from_slice(&buf[..m]),
        }
    }
    let take = n.min(carry.len());
    carry.drain(..take).collect()
}

/// A raw response split into its head (through the blank line) and what follows.
pub fn split_head(raw: &[u8]) -> (String, &[u8]) {
    let i = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no complete head in {:?}", String::from_utf8_lossy(raw)));
    (
        String::from_utf8_lossy(&raw[..i + 4]).into_owned(),
        &raw[i + 4..],
    )
}

/// The value of header `name` (case-insensitive) in a raw head, first occurrence.
pub fn head_header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n").skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Wait (bounded by `limit`) until `cond` holds, polling every 5 ms; returns whether it did.
pub async fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cond()
}

/// The stub's exact body of `length` bytes, plain and gzipped (`?length=N` vs `&gzip=1`).
/// (Also keeps the `stub_body*` re-exports used in every test crate.)
pub fn stub_bodies(length: usize) -> (Vec<u8>, Vec<u8>) {
    (stub_body(length).to_vec(), stub_body_gzip(length).to_vec())
}

// ---- Added for the wire_*/ops_*/cli tests ----

/// `keymaster_upstream_requests_total{cluster="origin"}`: requests the gateway sent to the
/// origin cluster of [`config_text`] (counts retries as separate requests).
pub fn upstream_requests(g: &TestGateway) -> f64 {
    metric(
        &g.gateway().metrics_text(),
        "keymaster_upstream_requests_total{cluster=\"origin\"}",
    )
}

/// Read until the peer closes (`true`) or `wait` passes with no new data (`false`).
pub async fn read_until_close(s: &mut TcpStream, wait: Duration) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match tokio::time::timeout(wait, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (out, true),
            Err(_) => return (out, false),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// Write raw bytes on a fresh connection; return what came back and whether the gateway
/// closed the connection within `wait` of the last data.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8], wait: Duration) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request).await.expect("write");
    read_until_close(&mut s, wait).await
}

/// Number of HTTP/1.1 status lines in raw response bytes.
pub fn count_responses(raw: &[u8]) -> usize {
    raw.windows(9).filter(|w| w == b"HTTP/1.1 ").count()
}

/// A free 127.0.0.1 port (bind :0, read it, release it) for configs of child processes.
pub fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A 127.0.0.1 address where a connect is refused, and the guard that keeps it so: the port
/// stays bound (never listening) while the guard lives, so no other socket — a gateway's own
/// listener on port 0 included — can take it. (A port from [`free_addr`] can be handed out
/// again at once: a gateway given one as its "dead" origin once proxied to itself.)
pub fn closed_addr() -> (SocketAddr, tokio::net::TcpSocket) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.1:0".parse().unwrap())
        .expect("bind 127.0.0.1:0");
    (socket.local_addr().expect("bound address"), socket)
}

/// Poll `f` every 10ms until it returns true or `limit` passes; returns the last result.
pub async fn eventually<F: FnMut() -> bool>(limit: Duration, mut f: F) -> bool {
    let end = tokio::time::Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// GET on a fresh connection, or `None` if connecting or the exchange fails (for probing
/// listeners that may be closing).
pub async fn try_get(addr: SocketAddr, path: &str) -> Option<Reply> {
    let tcp = TcpStream::connect(addr).await.ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .ok()?;
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header(http::header::HOST, addr.to_string())
        .body(Full::new(Bytes::new()))
        .ok()?;
    let resp = sender.send_request(req).await.ok()?;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.ok()?.to_bytes();
    Some(Reply {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body,
    })
}

/// A `keymaster` child process. Its listeners bind ephemeral ports and the test learns the
/// addresses from the banner the binary prints on stdout, so no test picks a port and races
/// other tests for it. Killed (and reaped) on drop.
pub struct Spawned {
    pub child: std::process::Child,
    /// `(listener name, address)` in banner order.
    pub listeners: Vec<(String, SocketAddr)>,
    /// The banner's lines, as printed.
    pub banner: Vec<String>,
    pub admin: Option<SocketAddr>,
    /// Kept open: a closed pipe would fail the child's later prints.
    _stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Spawned {
    /// The first listener's address.
    pub fn addr(&self) -> SocketAddr {
        self.listeners.first().expect("a listener in the banner").1
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `keymaster` with `args` and wait (up to 20 s) for its banner.
pub fn spawn_keymaster<I, S>(args: I) -> Spawned
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_keymaster"));
    cmd.args(args);
    spawn_keymaster_command(cmd)
}

/// Start `cmd` (a `keymaster` command line the caller has shaped, e.g. with resource limits
/// set in `pre_exec`) and wait (up to 20 s) for its banner.
pub fn spawn_keymaster_command(mut cmd: std::process::Command) -> Spawned {
    use std::io::BufRead;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("keymaster starts");
    let stdout = child.stdout.take().expect("piped stdout");
    // Read the banner on a thread, so a child that never prints cannot hang the test.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = std::io::BufReader::new(stdout);
        let mut lines = Vec::new();
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 {
            let done = line.starts_with("stop with");
            lines.push(std::mem::take(&mut line));
            if done {
                break;
            }
        }
        let _ = tx.send((lines, reader));
    });
    let (lines, reader) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("keymaster printed its banner within 20 s");
    let addr_of = |word: &str| -> SocketAddr {
        word.trim_start_matches("http://")
            .trim_start_matches("https://")
            .parse()
            .unwrap_or_else(|e| panic!("banner address {word:?}: {e}"))
    };
    let mut listeners = Vec::new();
    let mut admin = None;
    for l in &lines {
        let words: Vec<&str> = l.split_whitespace().collect();
        match words.as_slice() {
            ["listener", name, url, ..] => listeners.push((name.to_string(), addr_of(url))),
            ["admin", url, ..] => admin = Some(addr_of(url)),
            _ => {}
        }
    }
    assert!(
        !listeners.is_empty(),
        "no listener in the banner: {lines:?} (exit: {:?})",
        child.try_wait()
    );
    Spawned {
        child,
        listeners,
        banner: lines,
        admin,
        _stdout: reader,
    }
}

/// A child process's pipe (its stderr, say) read line by line on a thread of its own, so the
/// child never blocks on a full pipe and a test can wait, with a deadline, for the line that
/// says something happened instead of sleeping and hoping it did.
pub struct PipeLines {
    rx: std::sync::mpsc::Receiver<String>,
    /// Every line read so far, in order (without the line ends).
    pub lines: Vec<String>,
}

impl PipeLines {
    pub fn new(pipe: impl std::io::Read + Send + 'static) -> PipeLines {
        use std::io::BufRead;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = std::io::BufReader::new(pipe);
            let mut line = Vec::new();
            while reader.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
                let text = String::from_utf8_lossy(&line);
                if tx
                    .send(text.trim_end_matches(['\r', '\n']).to_string())
                    .is_err()
                {
                    return;
                }
                line.clear();
            }
        });
        PipeLines {
            rx,
            lines: Vec::new(),
        }
    }

    /// Wait (blocking, up to `limit`) for a line `want` accepts and return it; `None` if the
    /// pipe closed or `limit` passed first. Each line read is kept in [`PipeLines::lines`]
    /// and echoed to the test's stderr (shown when the test fails).
    pub fn wait_for(&mut self, limit: Duration, want: impl Fn(&str) -> bool) -> Option<String> {
        let end = std::time::Instant::now() + limit;
        loop {
            let left = end.checked_duration_since(std::time::Instant::now())?;
            let line = self.rx.recv_timeout(left).ok()?;
            eprintln!("child: {line}");
            self.lines.push(line);
            let last = self.lines.last().expect("just pushed");
            if want(last) {
                return Some(last.clone());
            }
        }
    }

    /// Read on until the pipe closes (the child has exited) or `limit` passes.
    pub fn until_closed(&mut self, limit: Duration) {
        let _ = self.wait_for(limit, |_| false);
    }
}

/// One HTTP/2 client connection with prior knowledge (hyper's low-level client).
pub async fn h2_client(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let tcp = TcpStream::connect(addr).await.expect("connect to gateway");
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(tcp),
    )
    .await
    .expect("h2 handshake");
    tokio::spawn(conn);
    sender
}
