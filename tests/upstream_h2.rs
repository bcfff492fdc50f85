//! Outbound HTTP/2 against real hyper origins: prior knowledge (h2c), multiplexing many
//! requests over few connections (the cluster's `max_streams` and the origin's
//! SETTINGS_MAX_CONCURRENT_STREAMS), h1↔h2 translation, bodies streaming both ways with
//! trailers, and GOAWAY (in-flight requests finish, new ones go to a new connection).

mod support;
mod upstream_support;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use support::*;
use upstream_support::*;

type ClientBody = BoxBody<Bytes, Infallible>;

async fn h2c_gateway(origin: &Origin, extra_keys: &str) -> TestGateway {
    let keys = format!(
        "protocol = \"h2\"\nservers = [{{ address = \"{}\" }}]\n{extra_keys}",
        origin.addr
    );
    start_gateway(&config_with_cluster(PREAMBLE, &keys, ""))
}

/// An HTTP/2 (prior knowledge) client connection to the gateway's auto listener.
async fn h2_client(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<ClientBody> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

/// `n` concurrent `/hold` requests, each on its own HTTP/1.1 client connection; returns
/// their statuses.
async fn concurrent_holds(addr: SocketAddr, n: usize) -> Vec<u16> {
    let tasks: Vec<_> = (0..n)
        .map(|_| tokio::spawn(async move { get(addr, "/hold").await.status }))
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test]
async fn h1_client_to_h2c_origin_translates_the_request() {
    let origin = spawn_origin(OriginOpts {
        h2c: true,
        ..OriginOpts::default()
    })
    .await;
    let g = h2c_gateway(&origin, "").await;
    let mut c = Client::connect(g.addr).await;
    let req = http::Request::get("/info?x=1")
        .header("host", "api.example")
        .header("connection", "x-hop, keep-alive")
        .header("x-hop", "1")
        .header("keep-alive", "timeout=5")
        .header("te", "trailers")
        .header("x-end-to-end", "kept")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let r = c.send(req).await;
    assert_eq!(r.status, 200);
    let j = info(&r.body);
    assert_eq!(j["version"], "HTTP/2.0");
    // Host became :authority; the target is absolute with the right scheme and query.
    assert_eq!(j["uri"], "http://api.example/info?x=1");
    assert_eq!(j["host"], serde_json::Value::Null);
    assert_eq!(j["te"], "trailers");
    let names: Vec<&str> = j["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(names.contains(&"x-end-to-end"), "{names:?}");
    for hop in ["connection", "x-hop", "keep-alive"] {
        assert!(!names.contains(&hop), "{hop} forwarded: {names:?}");
    }
}

#[tokio::test]
async fn concurrent_requests_multiplex_over_few_connections() {
    let origin = spawn_origin(OriginOpts {
        h2c: true,
        ..OriginOpts::default()
    })
    .await;
    let g = h2c_gateway(&origin, "pool = { max_streams = 10 }").await;
    // 40 requests in flight at once (the origin answers only when all 40 arrived) over
    // streams of at most 10 per connection: exactly 4 origin connections.
    origin.hold_until(40);
    let statuses = concurrent_holds(g.addr, 40).await;
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert_eq!(origin.connections(), 4);
    // Sequential requests afterwards reuse those connections.
    for _ in 0..5 {
        assert_eq!(get(g.addr, "/info").await.status, 200);
    }
    assert_eq!(origin.connections(), 4);
    let m = g.gateway().metrics_text();
    assert_eq!(
        metric(&m, "keymaster_upstream_h2_streams{cluster=\"up\"}"),
        0.0
    );
    assert_eq!(
        metric(&m, "keymaster_upstream_connections{cluster=\"up\"}"),
        4.0
    );
    assert_eq!(
        metric(&m, "keymaster_upstream_requests_total{cluster=\"up\"}"),
        45.0
    );
}

#[tokio::test]
async fn the_origin_stream_limit_opens_more_connections() {
    let origin = spawn_origin(OriginOpts {
        h2c: true,
        max_streams: Some(5),
        ..OriginOpts::default()
    })
    .await;
    let g = h2c_gateway(&origin, "").await;
    // The first exchange teaches the gateway the origin's limit of 5 streams.
    assert_eq!(get(g.addr, "/info").await.status, 200);
    origin.hold_until(20);
    let statuses = concurrent_holds(g.addr, 20).await;
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert_eq!(origin.connections(), 4, "{statuses:?}");
}

#[tokio::test]
async fn bodies_stream_both_ways_with_trailers() {
    let origin = spawn_origin(OriginOpts {
        h2c: true,
        ..OriginOpts::default()
    })
    .await;
    let g = h2c_gateway(&origin, "").await;
    let mut client = h2_client(g.addr).await;

    // Request body: a chunk, then (only after its echo came back) another chunk and trailers.
    let (tx, rx) = tokio::sync::mpsc::channel::<Frame<Bytes>>(1);
    let body = StreamBody::new(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|f| (Ok::<_, Infallible>(f), rx))
    }));
    let req = http::Request::post("http://gw.test/echo")
        .header("te", "trailers")
        .body(body.boxed())
        .unwrap();
    client.ready().await.unwrap();
    let resp_fut = client.send_request(req);
    tx.send(Frame::data(Bytes::from_static(b"first;")))
        .await
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), resp_fut)
        .await
        .expect("response head while the request body is still open")
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("first echoed chunk before the request body ended")
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), Bytes::from_static(b"first;"));
    tx.send(Frame::data(Bytes::from_static(b"second")))
        .await
        .unwrap();
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-request-trailer", "t1".parse().unwrap());
    tx.send(Frame::trailers(trailers)).await.unwrap();
    drop(tx);
    let rest = tokio::time::timeout(Duration::from_secs(5), body.collect())
        .await
        .unwrap()
        .unwrap();
    let t = rest
        .trailers()
        .cloned()
        .expect("request trailers echoed back");
    assert_eq!(t["x-request-trailer"], "t1");
    assert_eq!(rest.to_bytes(), Bytes::from_static(b"second"));

    // Response trailers from the origin reach an HTTP/1.1 client that accepts them.
    let tcp = tokio::net::TcpStream::connect(g.addr).await.unwrap();
    let (mut h1, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get("/trailers")
        .header("host", "gw.test")
        .header("te", "trailers")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = h1.send_request(req).await.unwrap();
    let collected = resp.into_body().collect().await.unwrap();
    let t = collected
        .trailers()
        .cloned()
        .expect("origin trailers forwarded");
    assert_eq!(t["x-checksum"], "abc123");
    assert_eq!(collected.to_bytes(), Bytes::from_static(b"part1-part2"));
    drop((client, h1));
    stop(g).await;
}

#[tokio::test]
async fn goaway_finishes_in_flight_and_moves_new_requests() {
    let origin = spawn_origin(OriginOpts {
        h2c: true,
        ..OriginOpts::default()
    })
    .await;
    let g = h2c_gateway(&origin, "").await;
    // One request in flight on the first connection.
    let addr = g.addr;
    let held = tokio::spawn(async move { get(addr, "/hold").await });
    assert!(wait_until(Duration::from_secs(5), || origin.arrived() == 1).await);
    assert_eq!(origin.connections(), 1);
    origin.goaway();
    // New requests succeed and, once the gateway has read the GOAWAY, use a new connection.
    let mut moved = false;
    for _ in 0..200 {
        let r = get(g.addr, "/info").await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        if info(&r.body)["conn"] == 1 {
            moved = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(moved, "no request reached a second connection after GOAWAY");
    assert_eq!(origin.connections(), 2);
    // The in-flight request finishes on the old connection.
    origin.release();
    let r = tokio::time::timeout(Duration::from_secs(5), held)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(&r.body[..], b"0");
}

#[tokio::test]
async fn connections_retire_after_max_requests() {
    let origin = spawn_origin(OriginOpts {
        h2c: true,
        ..OriginOpts::default()
    })
    .await;
    let g = h2c_gateway(&origin, "pool = { max_requests_per_connection = 2 }").await;
    let mut conns = Vec::new();
    for _ in 0..5 {
        let r = get(g.addr, "/info").await;
        assert_eq!(r.status, 200);
        conns.push(info(&r.body)["conn"].as_u64().unwrap());
    }
    // Two streams per connection, then a new one.
    assert_eq!(conns, vec![0, 0, 1, 1, 2]);
    assert_eq!(origin.connections(), 3);
}

#[tokio::test]
async fn a_slow_client_holds_back_the_origin_through_flow_control() {
    let origin = spawn_origin(OriginOpts {
        h2c: true,
        ..OriginOpts::default()
    })
    .await;
    let g = h2c_gateway(&origin, "").await;
    let tcp = tokio::net::TcpStream::connect(g.addr).await.unwrap();
    let (mut h1, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get("/big")
        .header("host", "gw.test")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = h1.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    // The client stops reading: the origin's production must stall once the socket buffers
    // and the HTTP/2 windows are full, far below the 64 MiB body.
    let mut last = origin.produced();
    let mut stable_since = tokio::time::Instant::now();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline
        && stable_since.elapsed() < Duration::from_millis(300)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = origin.produced();
        if now != last {
            last = now;
            stable_since = tokio::time::Instant::now();
        }
    }
    let total = BIG_CHUNK * BIG_CHUNKS;
    eprintln!("origin produced {last} bytes while the client was not reading");
    assert!(
        last < total / 4,
        "the origin produced {last} of {total} bytes for a client that reads nothing"
    );
    // Reading again drains the whole body.
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(first.len() + rest.len(), total);
    assert_eq!(origin.produced(), total);
    drop(h1);
    stop(g).await;
}

/// A native `pre` filter that sets Content-Length to 2 (configured edits cannot name it).
struct SetLength;
impl keymaster_gateway::filter::Filter for SetLength {
    fn run<'a>(
        &'a self,
        ctx: &'a mut keymaster_gateway::filter::FilterCtx,
    ) -> keymaster_gateway::filter::FilterFuture<'a> {
        let two = http::HeaderValue::from_static("2");
        ctx.set_request_header(http::header::CONTENT_LENGTH, two);
        keymaster_gateway::filter::done(Ok(()))
    }
}

/// A filter that sets Content-Length to something else than the body: an HTTP/2 origin gets
/// the body with a length that matches it (the gateway's, from the body), not the filter's,
/// which the origin would refuse as a malformed request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_length_set_by_a_filter_reaches_an_h2_origin_matching_the_body() {
    let origin = spawn_origin(OriginOpts {
        h2c: true,
        ..OriginOpts::default()
    })
    .await;
    let keys = format!(
        "protocol = \"h2\"\nservers = [{{ address = \"{}\" }}]\n",
        origin.addr
    );
    let filter = keymaster_gateway::filter::FilterSpec::new(
        "cl",
        keymaster_config::FilterStage::Pre,
        0,
        SetLength,
    );
    let g = start_gateway_with_filters(&config_with_cluster(PREAMBLE, &keys, ""), vec![filter]);
    for body in ["hello world", "h", ""] {
        let req = http::Request::post(g.url("/echo"))
            .header("content-length", body.len().to_string())
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let reply = Client::connect(g.addr).await.send(req).await;
        assert_eq!(reply.status, 200, "{body:?}: {:?}", reply.body);
        assert_eq!(reply.body, body.as_bytes(), "{body:?}");
    }
    stop(g).await;
}
