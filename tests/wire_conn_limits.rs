//! A listener's connection limits (`max_requests_per_connection`, `max_connection_age`):
//! a client connection that reaches one is closed gracefully, so load balancers and
//! clients rebalance long-lived connections. HTTP/1.1: the last response carries
//! `Connection: close` and the connection ends with a FIN after it; HTTP/2: GOAWAY, and the
//! streams already open finish.
mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::net::SocketAddr;
use std::time::Duration;
use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

fn gateway(listener_extra: &str) -> (TestGateway, StubHandle) {
    let s = stub();
    let g = start_gateway(&config_text(s.local_addr(), listener_extra, ""));
    (g, s)
}

fn retired(g: &TestGateway, limit: &str) -> f64 {
    metric(
        &g.gateway().metrics_text(),
        &format!(
            "keymaster_downstream_connections_retired_total{{limit=\"{limit}\",listener=\"main\"}}"
        ),
    )
}

/// The raw responses in `raw`, each as its head (Content-Length framed bodies skipped).
fn heads(mut raw: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&raw[..end + 4]).into_owned();
        let len: usize = head_header(&head, "content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        raw = &raw[(end + 4 + len).min(raw.len())..];
        out.push(head);
    }
    out
}

fn closes(head: &str) -> bool {
    head_header(head, "connection").is_some_and(|v| v.eq_ignore_ascii_case("close"))
}

/// Four pipelined requests on a connection allowed three: three answers, the third with
/// `Connection: close`, then the connection ends (the fourth is never answered: the client
/// sends it again on a new connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_connection_closes_gracefully_after_max_requests() {
    let (g, _s) = gateway("max_requests_per_connection = 3");
    let one = "GET /?length=5 HTTP/1.1\r\nHost: a\r\n\r\n";
    let (raw, closed) =
        raw_exchange(g.addr, one.repeat(4).as_bytes(), Duration::from_secs(5)).await;
    let got = heads(&raw);
    assert_eq!(got.len(), 3, "{got:#?}");
    assert!(
        got.iter().all(|h| h.starts_with("HTTP/1.1 200")),
        "{got:#?}"
    );
    assert!(!closes(&got[0]) && !closes(&got[1]), "{got:#?}");
    assert!(closes(&got[2]), "the last response says so: {got:#?}");
    assert!(closed, "the connection ends after the last response");
    assert_eq!(retired(&g, "requests"), 1.0);
    // Unlimited by default: the same four on a gateway without the key.
    let (g, _s) = gateway("");
    let (raw, _) = raw_exchange(g.addr, one.repeat(4).as_bytes(), Duration::from_millis(500)).await;
    assert_eq!(heads(&raw).len(), 4);
}

/// A connection older than `max_connection_age` is closed after its next response, which
/// says `Connection: close`; before that it is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_connection_past_its_age_closes_after_its_next_response() {
    let (g, _s) = gateway("max_connection_age = \"1s\"");
    let mut s = TcpStream::connect(g.addr).await.unwrap();
    let one = b"GET /?length=5 HTTP/1.1\r\nHost: a\r\n\r\n";
    s.write_all(one).await.unwrap();
    let mut carry = Vec::new();
    let head = read_head(&mut s, &mut carry).await.expect("first response");
    assert!(head.starts_with("HTTP/1.1 200") && !closes(&head), "{head}");
    read_exact_body(&mut s, &mut carry, 5).await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    s.write_all(one).await.unwrap();
    let (raw, closed) = read_until_close(&mut s, Duration::from_secs(5)).await;
    let got = heads(&[carry, raw].concat());
    assert_eq!(got.len(), 1, "{got:#?}");
    assert!(closes(&got[0]), "{got:#?}");
    assert!(closed, "the connection ends after that response");
    assert_eq!(retired(&g, "age"), 1.0);
}

/// An HTTP/2 client connection to the gateway: the sender, and the task driving the
/// connection (it ends when the gateway closes the connection).
async fn h2_client(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    tokio::task::JoinHandle<()>,
) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("h2 handshake");
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (sender, task)
}

async fn h2_get(
    sender: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    path: &str,
) -> (u16, Bytes) {
    let req = http::Request::get(format!("http://gw.test{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    sender.ready().await.unwrap();
    let resp = sender.send_request(req).await.expect("h2 response");
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

/// After its third stream, an HTTP/2 connection allowed three gets GOAWAY and ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_gets_goaway_after_max_requests() {
    let (g, _s) = gateway("max_requests_per_connection = 3");
    let (mut h2, conn) = h2_client(g.addr).await;
    for _ in 0..3 {
        assert_eq!(h2_get(&mut h2, "/?length=5").await, (200, stub_body(5)));
    }
    tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("the gateway ends the connection")
        .unwrap();
    assert_eq!(retired(&g, "requests"), 1.0);
}

/// An HTTP/2 connection reaching its age gets GOAWAY while a stream is open: that stream
/// still finishes with its whole response, then the connection ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_past_its_age_gets_goaway_and_its_open_stream_finishes() {
    let (g, _s) = gateway("max_connection_age = \"1s\"");
    let (mut h2, conn) = h2_client(g.addr).await;
    assert_eq!(h2_get(&mut h2, "/?length=5").await, (200, stub_body(5)));
    // Open before the age is reached, answered after it.
    let slow = h2_get(&mut h2, "/?length=7&delay=1800").await;
    assert_eq!(slow, (200, stub_body(7)));
    tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("the gateway ends the connection")
        .unwrap();
    assert_eq!(retired(&g, "age"), 1.0);
}
