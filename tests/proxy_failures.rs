//! Rule 4, failures: refused connections, silent origins, origins dying mid-body, clients
//! going away mid-response, malformed origin responses, and the total request deadline.
mod support;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// A config whose default route uses the given extra route keys (timeouts) on cluster origin.
fn route_config(origin: SocketAddr, route_keys: &str) -> String {
    config_text(
        origin,
        "",
        &format!("[[routes]]\nname = \"r\"\ncluster = \"origin\"\n{route_keys}\n"),
    )
}

/// Read until EOF within `limit`; returns the bytes and whether EOF (or reset) was seen.
async fn read_to_eof(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let deadline = tokio::time::Instant::now() + limit;
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (out, true),
            Err(_) => return (out, false),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// An origin that sends `response` verbatim to every request and then closes.
async fn scripted_origin(response: &'static [u8]) -> RawOrigin {
    raw_origin(move |mut s, _| async move {
        let mut carry = Vec::new();
        if read_head(&mut s, &mut carry).await.is_some() {
            let _ = s.write_all(response).await;
            let _ = s.shutdown().await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_origin_port_gives_502_quickly() {
    let (closed, _closed_held) = closed_addr();
    let g = start_gateway(&config_text(closed, "", ""));
    let t = Instant::now();
    let r = get(g.addr, "/").await;
    assert_eq!(r.status, 502);
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(r.headers["via"], "1.1 keymaster");
    let text = metrics_text(&g).await;
    assert_eq!(
        metric(
            &text,
            "keymaster_upstream_connect_failures_total{cluster=\"origin\"}"
        ),
        1.0
    );
}

// connect_timeout is not tested: an address that reliably blackholes SYNs (so the connect
// hangs rather than failing fast) is not available in this sandbox.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_origin_gives_504_after_the_response_header_timeout() {
    let origin = raw_origin(|mut s, _| async move {
        // Read the request and whatever follows; never answer.
        let mut buf = [0u8; 1024];
        while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
    })
    .await;
    let g = start_gateway(&route_config(
        origin.addr,
        "response_header_timeout = \"200ms\"",
    ));
    let t = Instant::now();
    let r = get(g.addr, "/").await;
    let took = t.elapsed();
    assert_eq!(r.status, 504);
    assert!(took >= Duration::from_millis(200), "{took:?}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_head_past_the_request_timeout_gives_504() {
    let s = stub();
    let g = start_gateway(&route_config(s.local_addr(), "request_timeout = \"200ms\""));
    let t = Instant::now();
    let r = get(g.addr, "/?delay=3000").await;
    let took = t.elapsed();
    assert_eq!(r.status, 504, "{:?}", r.body);
    assert!(took >= Duration::from_millis(200), "{took:?}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    // A quick answer within the deadline is fine.
    let r = get(g.addr, "/?length=10").await;
    assert_eq!(r.status, 200);
}

/// Exchanges cut off because the origin's body went quiet for `read_timeout`.
const READ_TIMEOUTS: &str =
    "keymaster_errors_total{category=\"origin_read_timeout\",side=\"origin\"}";

/// An origin that answers with a 1000-byte Content-Length head and 10 bytes of body, then
/// sends nothing more, holding the connection open until the gateway closes it.
async fn stalling_origin() -> RawOrigin {
    raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        if read_head(&mut s, &mut carry).await.is_some() {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789")
                .await;
            let mut buf = [0u8; 64];
            let _ = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await;
        }
    })
    .await
}

/// A keep-alive request through `g` to a [`stalling_origin`]: the response must end after
/// its 10 body bytes with the connection aborted (a cut-off body never looks complete).
async fn expect_cut_off(g: &TestGateway, why: &str) {
    let mut s = TcpStream::connect(g.addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (raw, eof) = read_to_eof(&mut s, Duration::from_secs(5)).await;
    assert!(eof, "the gateway must abort the connection {why}");
    let (head, body) = split_head(&raw);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert_eq!(body, b"0123456789");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_timeout_during_the_body_aborts_the_response() {
    let origin = stalling_origin().await;
    let g = start_gateway(&route_config(origin.addr, "request_timeout = \"300ms\""));
    expect_cut_off(&g, "at the deadline").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_going_silent_mid_body_is_cut_off_at_the_read_timeout() {
    // No request deadline: only the read gap ends this exchange.
    let origin = stalling_origin().await;
    let g = start_gateway(&route_config(origin.addr, "read_timeout = \"300ms\""));
    expect_cut_off(&g, "after the read gap").await;
    let m = metrics_text(&g).await;
    assert_eq!(metric(&m, READ_TIMEOUTS), 1.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_but_steady_origin_body_outlasts_the_read_timeout() {
    // Ten chunks 100 ms apart against a 500 ms read timeout: each read restarts the clock,
    // so the whole second of body gets through.
    let origin = raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        if read_head(&mut s, &mut carry).await.is_some() {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                .await;
            for i in 0..10u8 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = s
                    .write_all(&[b'1', b'\r', b'\n', b'a' + i, b'\r', b'\n'])
                    .await;
            }
            let _ = s.write_all(b"0\r\n\r\n").await;
            let mut buf = [0u8; 64];
            let _ = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await;
        }
    })
    .await;
    let g = start_gateway(&route_config(origin.addr, "read_timeout = \"500ms\""));
    let started = Instant::now();
    let r = get(g.addr, "/").await;
    assert_eq!(r.status, 200);
    assert_eq!(&r.body[..], b"abcdefghij");
    assert!(started.elapsed() >= Duration::from_millis(1000));
    let m = metrics_text(&g).await;
    assert_eq!(metric(&m, READ_TIMEOUTS), 0.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_dying_mid_content_length_body_aborts_the_client_connection() {
    let origin =
        scripted_origin(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789").await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    let mut s = TcpStream::connect(g.addr).await.unwrap();
    // Keep-alive request: only an abort (not a complete response) ends the stream.
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (raw, eof) = read_to_eof(&mut s, Duration::from_secs(3)).await;
    assert!(eof, "client connection must be closed");
    let (head, body) = split_head(&raw);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert_eq!(head_header(&head, "content-length"), Some("1000"));
    assert_eq!(body, b"0123456789");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_dying_mid_chunked_body_never_looks_complete() {
    let origin = scripted_origin(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n",
    )
    .await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    let mut s = TcpStream::connect(g.addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (raw, eof) = read_to_eof(&mut s, Duration::from_secs(3)).await;
    assert!(eof, "client connection must be closed");
    let (head, body) = split_head(&raw);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert_eq!(head_header(&head, "transfer-encoding"), Some("chunked"));
    // One 10-byte chunk (hex size in either case) and no terminating 0-chunk.
    assert!(
        body.eq_ignore_ascii_case(b"a\r\n0123456789\r\n"),
        "no terminating chunk may be sent: {:?}",
        String::from_utf8_lossy(body)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_dying_mid_body_fails_a_hyper_client() {
    let origin =
        scripted_origin(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789").await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    let tcp = TcpStream::connect(g.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get("/")
        .header("host", "x")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = tokio::time::timeout(
        Duration::from_secs(3),
        http_body_util::BodyExt::collect(resp.into_body()),
    )
    .await
    .expect("body ends");
    assert!(
        body.is_err(),
        "a truncated body must be an error to the client"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_going_away_mid_response_discards_the_origin_connection() {
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, &'static str)>();
    let origin = raw_origin(move |mut s, i| {
        let tx = tx.clone();
        async move {
            let mut carry = Vec::new();
            if i > 0 {
                // Later connections answer normally.
                while read_head(&mut s, &mut carry).await.is_some() {
                    if s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                return;
            }
            if read_head(&mut s, &mut carry).await.is_none() {
                return;
            }
            let total = 4 * 1024 * 1024;
            let _ = s
                .write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {total}\r\n\r\n").as_bytes())
                .await;
            let chunk = vec![b'z'; 16 * 1024];
            let mut sent = 0;
            let mut buf = [0u8; 64];
            // Trickle the body; stop when the gateway closes our connection (bounded).
            for _ in 0..500 {
                tokio::select! {
                    r = s.read(&mut buf) => {
                        if matches!(r, Ok(0) | Err(_)) {
                            let _ = tx.send((i, "closed"));
                            return;
                        }
                    }
                    _ = tokio::time::sleep(Duration::from_millis(10)) => {
                        if sent < total - chunk.len() {
                            if s.write_all(&chunk).await.is_err() {
                                let _ = tx.send((i, "closed"));
                                return;
                            }
                            sent += chunk.len();
                        }
                    }
                }
            }
            let _ = tx.send((i, "still open"));
        }
    })
    .await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    {
        let mut c = TcpStream::connect(g.addr).await.unwrap();
        c.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut carry = Vec::new();
        let head = read_head(&mut c, &mut carry).await.unwrap();
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        // Drop the client connection mid-body.
    }
    let ev = tokio::time::timeout(Duration::from_secs(6), rx.recv())
        .await
        .expect("origin reports")
        .unwrap();
    assert_eq!(
        ev,
        (0, "closed"),
        "origin connection must be closed, not pooled"
    );
    // The next request uses a fresh connection.
    let r = get(g.addr, "/after").await;
    assert_eq!((r.status, &r.body[..]), (200, &b"ok"[..]));
    assert_eq!(origin.connections(), 2);
}

async fn expect_502(response: &'static [u8]) {
    let origin = scripted_origin(response).await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    let raw = raw(
        g.addr,
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    let (head, body) = split_head(&raw);
    assert!(
        head.starts_with("HTTP/1.1 502 "),
        "origin response {:?} gave:\n{}{}",
        String::from_utf8_lossy(response),
        head,
        String::from_utf8_lossy(body)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_content_length_and_transfer_encoding_gives_502() {
    expect_502(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n").await;
    expect_502(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n5\r\nhello\r\n0\r\n\r\n").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_content_lengths_give_502() {
    expect_502(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!").await;
    expect_502(b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello!").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_content_length_gives_502() {
    expect_502(b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nhello").await;
    expect_502(b"HTTP/1.1 200 OK\r\nContent-Length: 0x5\r\n\r\nhello").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_encoding_not_ending_in_chunked_gives_502() {
    expect_502(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxxxx").await;
    expect_502(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nxxxx").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_status_line_gives_502() {
    expect_502(b"HTTP/1.1 2OO OK\r\nContent-Length: 2\r\n\r\nok").await;
    expect_502(b"HTTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
    expect_502(b"garbage\r\n\r\n").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn obs_fold_header_gives_502() {
    expect_502(b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 2\r\n\r\nok").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_closing_without_a_response_gives_502() {
    expect_502(b"").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_response_connection_is_not_reused() {
    // After a 502 for a malformed response, a good origin response on a new connection works.
    let origin = raw_origin(|mut s, i| async move {
        let mut carry = Vec::new();
        while read_head(&mut s, &mut carry).await.is_some() {
            let resp: &[u8] = if i == 0 {
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"
            } else {
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
            };
            if s.write_all(resp).await.is_err() {
                return;
            }
        }
    })
    .await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    let mut c = Client::connect(g.addr).await;
    assert_eq!(c.get("/").await.status, 502);
    let r = c.get("/").await;
    assert_eq!((r.status, &r.body[..]), (200, &b"ok"[..]));
    assert_eq!(origin.connections(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_abandoning_its_request_body_closes_the_origin_connection() {
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, usize, bool)>();
    let origin = raw_origin(move |mut s, i| {
        let tx = tx.clone();
        async move {
            let mut carry = Vec::new();
            let Some(head) = read_head(&mut s, &mut carry).await else {
                return;
            };
            if i > 0 {
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
                let _ = read_head(&mut s, &mut carry).await;
                return;
            }
            let cl: usize = head_header(&head, "content-length")
                .unwrap()
                .parse()
                .unwrap();
            // Read what arrives of the body; report how much and whether the gateway closed.
            let (rest, eof) = read_to_eof(&mut s, Duration::from_secs(5)).await;
            let _ = tx.send((cl, carry.len() + rest.len(), eof));
        }
    })
    .await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    {
        let mut c = TcpStream::connect(g.addr).await.unwrap();
        c.write_all(b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
            .await
            .unwrap();
        // Wait until the origin has the request (its connection exists), then vanish.
        assert!(wait_until(Duration::from_secs(3), || origin.connections() == 1).await);
    }
    let (cl, got, eof) = tokio::time::timeout(Duration::from_secs(6), rx.recv())
        .await
        .expect("origin reports")
        .unwrap();
    assert_eq!(cl, 1000);
    assert!(got < 1000, "origin got {got} bytes");
    assert!(
        eof,
        "origin connection must be closed when the client body is abandoned"
    );
    let r = get(g.addr, "/after").await;
    assert_eq!((r.status, &r.body[..]), (200, &b"ok"[..]));
    assert_eq!(origin.connections(), 2);
}
