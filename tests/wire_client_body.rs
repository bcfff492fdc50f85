//! Slow and stalled request bodies: a client that leaves its body with nothing to read for
//! the route's `client_body_timeout` gets 408 wherever the body is read (streamed to an
//! HTTP/1.1 or HTTP/2 origin, from an HTTP/1.1 or HTTP/2 client, buffered for a filter, for
//! the replay buffer or for `request_buffering`); the exchange with the origin is aborted and
//! never held against the origin's health. A body that is slow but keeps coming is not cut
//! off by the origin's `response_header_timeout`; an origin that does not answer a whole
//! request still is. `request_buffering` sends whole bodies with a Content-Length.
mod support;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use keymaster_config::FilterStage;
use keymaster_gateway::filter::{done, Filter, FilterCtx, FilterFuture, FilterSpec, Needs};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// The origin's response-header wait: shorter than the body timeouts below, so a stalled
/// body blamed on the origin would end in 504 first.
const HEAD_WAIT: &str = "1s";
/// The route's `client_body_timeout` in these tests.
const BODY_WAIT: &str = "2s";

/// An HTTP/1.1 origin reading each request by its Content-Length and answering
/// `<head>|<body>`; a request whose body never came whole (the gateway closed the
/// connection) counts in `aborted`, and `answered` counts the requests it answered.
struct EchoOrigin {
    raw: RawOrigin,
    aborted: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
}

async fn echo_origin(answer: bool) -> EchoOrigin {
    let aborted = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let (a, d) = (aborted.clone(), answered.clone());
    let raw = raw_origin(move |mut s, _| {
        let (aborted, answered) = (a.clone(), d.clone());
        async move {
            let mut carry = Vec::new();
            while let Some(head) = read_head(&mut s, &mut carry).await {
                let n: usize = head_header(&head, "content-length")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let body = read_until_body_or_close(&mut s, &mut carry, n).await;
                if body.len() < n {
                    aborted.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                if !answer {
                    let _ = read_until_body_or_close(&mut s, &mut carry, usize::MAX).await;
                    return;
                }
                let echo = format!("{head}|{}", String::from_utf8_lossy(&body));
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{echo}",
                    echo.len()
                );
                answered.fetch_add(1, Ordering::SeqCst);
                if s.write_all(resp.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    EchoOrigin {
        raw,
        aborted,
        answered,
    }
}

/// Read `n` body bytes after what `carry` holds, or until the peer closes (within 20 s).
async fn read_until_body_or_close(s: &mut TcpStream, carry: &mut Vec<u8>, n: usize) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut buf = [0u8; 16 * 1024];
    while carry.len() < n {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(m)) if m > 0 => carry.extend_from_slice(&buf[..m]),
            _ => break,
        }
    }
    let take = n.min(carry.len());
    carry.drain(..take).collect()
}

/// One route "upload" (keys `route_keys`) to cluster "origin" at `origin` (keys
/// `cluster_keys`), whose servers are ejected after a single failure: any charge against
/// the origin shows in `keymaster_upstream_ejections_total`.
fn config(origin: SocketAddr, route_keys: &str, cluster_keys: &str) -> String {
    format!(
        r#"{PREAMBLE}
[[routes]]
name = "upload"
cluster = "origin"
{route_keys}

[[clusters]]
name = "origin"
servers = [{{ address = "{origin}" }}]
connect_timeout = "1s"
response_header_timeout = "{HEAD_WAIT}"
outlier_detection = {{ consecutive_failures = 1, base_ejection = "60s" }}
{cluster_keys}
"#
    )
}

fn body_wait() -> String {
    format!("client_body_timeout = \"{BODY_WAIT}\"")
}

/// Send `first` on a new connection, keep it open without sending more, and read what the
/// gateway answers until it closes (within 15 s). Returns the answer, whether the gateway
/// closed, and how long it took.
async fn stall(addr: SocketAddr, first: &[u8]) -> (Vec<u8>, bool, Duration) {
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(first).await.unwrap();
    let (resp, closed) = read_until_close(&mut s, Duration::from_secs(15)).await;
    (resp, closed, started.elapsed())
}

/// The metric lines that would show the origin blamed: errors on its side, ejections.
fn origin_blamed(g: &TestGateway) -> Vec<String> {
    g.gateway()
        .metrics_text()
        .lines()
        .filter(|l| {
            (l.starts_with("keymaster_errors_total") && l.contains("side=\"origin\""))
                || (l.starts_with("keymaster_upstream_ejections_total") && !l.ends_with(" 0"))
        })
        .map(str::to_string)
        .collect()
}

/// The client's part of the failure: 408s counted by category and by listener.
fn assert_counted_as_body_timeouts(g: &TestGateway, n: f64) {
    let m = g.gateway().metrics_text();
    let by_category = metric(
        &m,
        "keymaster_errors_total{category=\"client_body_timeout\",side=\"client\"}",
    );
    let by_listener = metric(
        &m,
        "keymaster_downstream_body_timeouts_total{listener=\"main\"}",
    );
    assert_eq!((by_category, by_listener), (n, n), "{m}");
}

/// The first line of a JSON access log, once written (within 5 s).
async fn first_log_line(path: &std::path::Path) -> serde_json::Value {
    for _ in 0..500 {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(line) = text.lines().next() {
            return serde_json::from_str(line).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no access log line in {}", path.display());
}

/// A body streaming to an HTTP/1.1 origin stalls: the client gets 408 at the body timeout
/// (not 504 at the shorter response-header wait), its connection closes, the origin's
/// connection is closed mid-request, and nothing is held against the origin: it still
/// serves the next request, unejected. The access log says `client_body_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_gets_408_and_the_origin_is_not_blamed() {
    let origin = echo_origin(true).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let g = start_gateway(&format!(
        "{}\n[access_log]\nenabled = true\nformat = \"json\"\npath = \"{}\"\n",
        config(origin.raw.addr, &body_wait(), ""),
        log.display()
    ));
    let (resp, closed, took) = stall(
        g.addr,
        b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc",
    )
    .await;
    let text = String::from_utf8_lossy(&resp);
    assert_eq!(status_of(&resp), Some(408), "after {took:?}: {text}");
    assert!(closed, "the connection closes after a 408: {text}");
    assert!(took >= Duration::from_millis(1900), "408 after {took:?}");
    assert!(
        wait_until(Duration::from_secs(5), || origin
            .aborted
            .load(Ordering::SeqCst)
            == 1)
        .await,
        "the origin's half-sent request is aborted"
    );
    assert_counted_as_body_timeouts(&g, 1.0);
    assert!(origin_blamed(&g).is_empty(), "{:?}", origin_blamed(&g));
    let line = first_log_line(&log).await;
    assert_eq!(
        (&line["status"], &line["category"]),
        (
            &serde_json::json!(408),
            &serde_json::json!("client_body_timeout")
        ),
        "{line}"
    );
    let r = get(g.addr, "/after").await;
    assert_eq!(r.status, 200, "the origin still serves");
    assert!(origin_blamed(&g).is_empty(), "{:?}", origin_blamed(&g));
}

/// The origin answers before the body is in (its response streams while the request body
/// still goes out), then the client's body stalls: the response is cut off (the client's
/// connection is aborted, never a complete-looking response), and the exchange is the
/// client's failure, not the origin's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_after_an_early_answer_cuts_the_response_off() {
    let origin = raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        if read_head(&mut s, &mut carry).await.is_some() {
            let early = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nearly\r\n";
            let _ = s.write_all(early).await;
            let _ = read_until_body_or_close(&mut s, &mut carry, usize::MAX).await;
        }
    })
    .await;
    let g = start_gateway(&config(origin.addr, &body_wait(), ""));
    let (resp, closed, took) = stall(
        g.addr,
        b"POST /early HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc",
    )
    .await;
    let text = String::from_utf8_lossy(&resp);
    assert_eq!(status_of(&resp), Some(200), "after {took:?}: {text}");
    assert!(text.contains("early"), "{text}");
    assert!(
        !text.ends_with("0\r\n\r\n"),
        "never complete-looking: {text}"
    );
    assert!(closed, "{text}");
    assert!(
        took >= Duration::from_millis(1900),
        "cut off after {took:?}"
    );
    let cut_off = eventually(Duration::from_secs(5), || {
        let m = g.gateway().metrics_text();
        metric(
            &m,
            "keymaster_errors_total{category=\"client_body_timeout\",side=\"client\"}",
        ) == 1.0
    })
    .await;
    assert!(cut_off, "{}", g.gateway().metrics_text());
    assert_counted_as_body_timeouts(&g, 1.0);
    assert!(origin_blamed(&g).is_empty(), "{:?}", origin_blamed(&g));
}

/// A body that pauses longer than the response-header wait but less than the body timeout
/// goes through whole: the time the request waited on its client is not the origin's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_within_the_timeout_is_not_cut_by_the_response_header_wait() {
    let origin = echo_origin(true).await;
    let g = start_gateway(&config(origin.raw.addr, &body_wait(), ""));
    let mut s = TcpStream::connect(g.addr).await.unwrap();
    s.write_all(b"POST /slow HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nhello")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    s.write_all(b" world").await.unwrap();
    let (resp, _) = read_until_close(&mut s, Duration::from_secs(5)).await;
    let text = String::from_utf8_lossy(&resp);
    assert_eq!(status_of(&resp), Some(200), "{text}");
    assert!(text.ends_with("|hello world"), "{text}");
    assert!(origin_blamed(&g).is_empty(), "{:?}", origin_blamed(&g));
}

/// The control: an origin that has the whole request and does not answer still gets its
/// 504 at the response-header wait, long before the body timeout would have mattered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_that_does_not_answer_a_whole_request_still_times_out() {
    let origin = echo_origin(false).await;
    let g = start_gateway(&config(
        origin.raw.addr,
        "client_body_timeout = \"30s\"",
        "",
    ));
    let (resp, _, took) = stall(
        g.addr,
        b"POST /silent HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc",
    )
    .await;
    assert_eq!(
        status_of(&resp),
        Some(504),
        "{}",
        String::from_utf8_lossy(&resp)
    );
    assert!(took < Duration::from_secs(10), "504 after {took:?}");
}

/// An HTTP/2 client whose request body stalls gets 408 on its stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_whose_body_stalls_gets_408() {
    let origin = echo_origin(true).await;
    let g = start_gateway(&config(origin.raw.addr, &body_wait(), ""));
    let tcp = TcpStream::connect(g.addr).await.unwrap();
    let (mut client, conn) = hyper::client::conn::http2::handshake::<
        _,
        _,
        BoxBody<Bytes, Infallible>,
    >(TokioExecutor::new(), TokioIo::new(tcp))
    .await
    .unwrap();
    tokio::spawn(conn);
    let (tx, rx) = tokio::sync::mpsc::channel::<Frame<Bytes>>(1);
    let body = StreamBody::new(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|f| (Ok::<_, Infallible>(f), rx))
    }));
    let req = http::Request::post("http://gw.test/h2")
        .header("content-length", "10")
        .body(body.boxed())
        .unwrap();
    client.ready().await.unwrap();
    let pending = client.send_request(req);
    tx.send(Frame::data(Bytes::from_static(b"abc")))
        .await
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(15), pending)
        .await
        .expect("an answer")
        .expect("a response");
    assert_eq!(resp.status(), 408);
    drop(tx);
    assert!(
        wait_until(Duration::from_secs(5), || origin
            .aborted
            .load(Ordering::SeqCst)
            == 1)
        .await,
        "the origin's half-sent request is aborted"
    );
    assert_counted_as_body_timeouts(&g, 1.0);
    assert!(origin_blamed(&g).is_empty(), "{:?}", origin_blamed(&g));
}

/// An HTTP/2 (h2c) origin that reads each request body whole before answering; requests
/// whose body failed (the gateway reset the stream) count in the returned counter.
async fn h2_collecting_origin() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let reset = Arc::new(AtomicUsize::new(0));
    let count = reset.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let reset = count.clone();
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let reset = reset.clone();
                    async move {
                        let answer = match req.into_body().collect().await {
                            Ok(b) => b.to_bytes(),
                            Err(_) => {
                                reset.fetch_add(1, Ordering::SeqCst);
                                Bytes::from_static(b"failed")
                            }
                        };
                        Ok::<_, Infallible>(http::Response::new(http_body_util::Full::new(answer)))
                    }
                });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc),
            );
        }
    });
    (addr, reset)
}

/// A body streaming to an HTTP/2 origin stalls: 408, the origin's stream is reset (its body
/// read fails), and the origin is not blamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_to_an_http2_origin_gets_408_and_resets_the_stream() {
    let (addr, reset) = h2_collecting_origin().await;
    let g = start_gateway(&config(addr, &body_wait(), "protocol = \"h2\""));
    let (resp, closed, took) = stall(
        g.addr,
        b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc",
    )
    .await;
    let text = String::from_utf8_lossy(&resp);
    assert_eq!(status_of(&resp), Some(408), "after {took:?}: {text}");
    assert!(closed, "{text}");
    assert!(
        wait_until(Duration::from_secs(5), || reset.load(Ordering::SeqCst) == 1).await,
        "the origin's stream is reset"
    );
    assert_counted_as_body_timeouts(&g, 1.0);
    assert!(origin_blamed(&g).is_empty(), "{:?}", origin_blamed(&g));
    // A whole body still goes through the same origin.
    let (resp, _) = raw_exchange(
        g.addr,
        b"POST /up HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello",
        Duration::from_secs(5),
    )
    .await;
    let text = String::from_utf8_lossy(&resp);
    assert_eq!(status_of(&resp), Some(200), "{text}");
    assert!(text.ends_with("\r\n\r\nhello"), "{text}");
}

/// A `pre` filter that declares it needs the request body.
struct WantsBody;
impl Filter for WantsBody {
    fn run<'a>(&'a self, _ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        done(Ok(()))
    }

    fn needs(&self) -> Needs {
        Needs::DEFAULT | Needs::REQUEST_BODY
    }
}

/// A body buffered for a filter stalls: 408 (it used to wait for as long as the client
/// liked, with no `request_timeout`), and the origin is never contacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_buffered_for_a_filter_gets_408() {
    let origin = echo_origin(true).await;
    let g = start_gateway_with_filters(
        &config(origin.raw.addr, &body_wait(), ""),
        vec![FilterSpec::new(
            "wants-body",
            FilterStage::Pre,
            0,
            WantsBody,
        )],
    );
    let (resp, closed, took) = stall(
        g.addr,
        b"POST /filtered HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc",
    )
    .await;
    let text = String::from_utf8_lossy(&resp);
    assert_eq!(status_of(&resp), Some(408), "after {took:?}: {text}");
    assert!(closed, "{text}");
    assert_eq!(origin.raw.connections(), 0, "the origin is never contacted");
    assert_counted_as_body_timeouts(&g, 1.0);
}

/// A body read into the replay buffer stalls: 408, the origin is never contacted, and
/// while it stalls the request holds no place under the cluster's cap (another request
/// still gets the only one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_for_the_replay_buffer_gets_408_and_holds_no_cluster_slot() {
    let origin = echo_origin(true).await;
    let g = start_gateway(&config(
        origin.raw.addr,
        &format!("{}\nretry = {{ attempts = 2 }}", body_wait()),
        "limits = { max_requests = 1, max_pending = 0 }",
    ));
    let stalled = tokio::spawn(stall(
        g.addr,
        b"POST /replay HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc",
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = get(g.addr, "/meanwhile").await;
    assert_eq!(
        r.status, 200,
        "the stalled body holds the cluster's only slot"
    );
    let (resp, closed, took) = stalled.await.unwrap();
    let text = String::from_utf8_lossy(&resp);
    assert_eq!(status_of(&resp), Some(408), "after {took:?}: {text}");
    assert!(closed, "{text}");
    assert_eq!(origin.answered.load(Ordering::SeqCst), 1, "only the GET");
    assert_eq!(origin.aborted.load(Ordering::SeqCst), 0);
    assert_counted_as_body_timeouts(&g, 1.0);
}

/// `request_buffering`: a chunked body arriving in pieces reaches the origin whole, with a
/// Content-Length and no Transfer-Encoding, and only once it is all in; past
/// `max_body_size` it is 413 and past the body timeout 408, the origin never contacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_buffering_sends_whole_bodies_with_a_length() {
    let origin = echo_origin(true).await;
    let g = start_gateway(&config(
        origin.raw.addr,
        &format!(
            "{}\nrequest_buffering = true\nmax_body_size = 16",
            body_wait()
        ),
        "",
    ));
    let mut s = TcpStream::connect(g.addr).await.unwrap();
    s.write_all(
        b"POST /buffered HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        origin.raw.connections(),
        0,
        "nothing goes out before the whole body"
    );
    s.write_all(b"6\r\n world\r\n0\r\n\r\n").await.unwrap();
    let mut carry = Vec::new();
    let head = read_head(&mut s, &mut carry).await.expect("a response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let n: usize = head_header(&head, "content-length")
        .unwrap()
        .parse()
        .unwrap();
    let echo = read_exact_body(&mut s, &mut carry, n).await;
    let echo = String::from_utf8_lossy(&echo);
    let (sent_head, sent_body) = echo.split_once('|').unwrap();
    assert_eq!(sent_body, "hello world", "{echo}");
    assert_eq!(
        head_header(sent_head, "content-length"),
        Some("11"),
        "{echo}"
    );
    assert_eq!(head_header(sent_head, "transfer-encoding"), None, "{echo}");

    // Past the cap: 413 before the origin hears of it.
    let (resp, _) = raw_exchange(
        g.addr,
        b"POST /big HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n123456789\r\n9\r\n123456789\r\n0\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(
        status_of(&resp),
        Some(413),
        "{}",
        String::from_utf8_lossy(&resp)
    );
    // Stalled: 408.
    let (resp, _, took) = stall(
        g.addr,
        b"POST /stall HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
    )
    .await;
    assert_eq!(
        status_of(&resp),
        Some(408),
        "after {took:?}: {}",
        String::from_utf8_lossy(&resp)
    );
    assert_eq!(origin.raw.connections(), 1, "only the whole body went out");
    assert_eq!(origin.aborted.load(Ordering::SeqCst), 0);
    assert_counted_as_body_timeouts(&g, 1.0);
}
