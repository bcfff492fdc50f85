//! The send timeout: a client that stops reading its response is reset after the
//! listener's `send_timeout` without progress (HTTP/1.1 and HTTP/2), while a slow client
//! that keeps reading gets its whole body however long that takes.
mod support;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use support::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpSocket, TcpStream};

const SEND_TIMEOUTS: &str = "keymaster_downstream_send_timeouts_total{listener=\"main\"}";
const OPEN: &str = "keymaster_downstream_connections{listener=\"main\"}";

/// A client socket with a small, fixed receive buffer: the gateway's writes stall as soon as
/// its own send buffer is full.
async fn small_window_client(addr: std::net::SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(8 * 1024).unwrap();
    socket.connect(addr).await.unwrap()
}

/// A gateway with these listener settings in front of the stub.
fn gateway(listener_extra: &str) -> (TestGateway, StubHandle) {
    let s = stub();
    let g = start_gateway(&config_text(s.local_addr(), listener_extra, ""));
    (g, s)
}

/// Wait (bounded) until the gateway's metric `name` reads `value`; panics if it never does.
/// Returns how long that took.
async fn expect_metric(g: &TestGateway, name: &str, value: f64) -> Duration {
    let t0 = Instant::now();
    let seen = eventually(Duration::from_secs(10), || {
        metric(&g.gateway().metrics_text(), name) == value
    })
    .await;
    assert!(seen, "{name} never became {value}");
    t0.elapsed()
}

/// The stalled write is given up on soon after the send timeout (300 ms), well before any
/// other timer of the test's config (the response-header timeout is 5 s) could wake it.
async fn expect_send_timeout(g: &TestGateway) {
    let took = expect_metric(g, SEND_TIMEOUTS, 1.0).await;
    assert!(took < Duration::from_secs(3), "reset after {took:?}");
}

/// Far more than the kernel buffers between the origin and the client can hold.
const LARGE: usize = 48 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_reset_after_the_send_timeout() {
    let (g, _s) = gateway("send_timeout = \"300ms\"\nidle_timeout = \"30s\"");
    let mut c = small_window_client(g.addr).await;
    let req = format!("GET /?length={LARGE} HTTP/1.1\r\nHost: t\r\n\r\n");
    c.write_all(req.as_bytes()).await.unwrap();
    // Read nothing: the gateway gives up on the response within the send timeout.
    expect_send_timeout(&g).await;
    // The connection ends (reset) without a response that looks complete.
    let (got, closed) = read_until_close(&mut c, Duration::from_secs(10)).await;
    assert!(closed, "the stalled connection stayed open");
    assert!(got.len() < LARGE, "the whole body arrived: {}", got.len());
    expect_metric(&g, OPEN, 0.0).await;
    // The worker goes on serving.
    let r = get(g.addr, "/?length=100").await;
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_that_keeps_reading_gets_the_whole_body() {
    // Each pause is a tenth of the timeout: room for a reader that a host busy with other
    // tests delays (500 ms once cut a transfer off there).
    let (g, _s) = gateway("send_timeout = \"1s\"\nidle_timeout = \"30s\"");
    let length = 8 << 20;
    let mut c = small_window_client(g.addr).await;
    let req = format!("GET /?length={length} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    c.write_all(req.as_bytes()).await.unwrap();
    // 256 KiB, then a pause: the gateway waits on every pause, well within the timeout,
    // and the whole transfer takes several times the timeout.
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    'read: for _ in 0..200 {
        let mut burst = 0;
        while burst < 256 * 1024 {
            match tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf)).await {
                Ok(Ok(0)) => break 'read,
                Ok(Ok(n)) => {
                    got.extend_from_slice(&buf[..n]);
                    burst += n;
                }
                other => panic!("read failed after {} bytes: {other:?}", got.len()),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (head, body) = split_head(&got);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body.len(), length, "the body arrived whole");
    assert!(started.elapsed() > Duration::from_secs(3));
    assert_eq!(metric(&g.gateway().metrics_text(), SEND_TIMEOUTS), 0.0);
}

/// A client transport that stops reading (forever pending) once told to.
struct StopReading {
    inner: TcpStream,
    stop: Arc<AtomicBool>,
}

impl AsyncRead for StopReading {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.stop.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for StopReading {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_client_that_stops_reading_is_dropped_after_the_send_timeout() {
    let (g, _s) = gateway("protocol = \"h2c\"\nsend_timeout = \"300ms\"\nidle_timeout = \"30s\"");
    let stop = Arc::new(AtomicBool::new(false));
    let io = StopReading {
        inner: small_window_client(g.addr).await,
        stop: stop.clone(),
    };
    // Windows large enough that HTTP/2 flow control never holds the gateway back: only
    // the socket does.
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(1 << 30)
        .initial_connection_window_size(1 << 30)
        .handshake::<_, Full<Bytes>>(TokioIo::new(io))
        .await
        .expect("h2 handshake");
    tokio::spawn(conn);
    let req = http::Request::get(format!("http://{}/?length={LARGE}", g.addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = sender.send_request(req).await.expect("h2 response head");
    assert_eq!(resp.status(), 200);
    stop.store(true, Ordering::Release);
    expect_send_timeout(&g).await;
    expect_metric(&g, OPEN, 0.0).await;
    drop(resp.into_body().collect());
}
