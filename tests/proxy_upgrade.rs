//! WebSocket and other upgrades through the real gateway: a real tokio-tungstenite client and
//! server (echo), text, binary and large messages, the close handshake, a pre filter refusing
//! the handshake, an origin refusing the upgrade, the tunnel idle timeout, configured
//! non-WebSocket upgrades, WebSocket over HTTP/2 (RFC 8441), and the tunnel metrics.
mod support;

use futures_util::{SinkExt, StreamExt};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::{self, Message};

/// A WebSocket echo origin; records each handshake's request headers.
struct WsOrigin {
    addr: SocketAddr,
    handshakes: Arc<Mutex<Vec<http::HeaderMap>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WsOrigin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn ws_origin() -> WsOrigin {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handshakes = Arc::new(Mutex::new(Vec::new()));
    let seen = handshakes.clone();
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                // tungstenite's callback signature fixes the (large) error type.
                #[allow(clippy::result_large_err)]
                let cb = |req: &Request, resp: Response| {
                    seen.lock().unwrap().push(req.headers().clone());
                    Ok(resp)
                };
                let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(s, cb).await else {
                    return;
                };
                // Echo data messages; tungstenite answers Close and Ping itself.
                while let Some(Ok(msg)) = ws.next().await {
                    if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    WsOrigin {
        addr,
        handshakes,
        task,
    }
}

type Ws = tokio_tungstenite::WebSocketStream<TcpStream>;

/// Open a WebSocket through the gateway at `path`.
async fn ws_connect(
    gw: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> tungstenite::Result<Ws> {
    use tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://{gw}{path}").into_client_request()?;
    for (n, v) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    let tcp = TcpStream::connect(gw).await.expect("connect");
    let (ws, resp) = tokio_tungstenite::client_async(req, tcp).await?;
    assert_eq!(resp.status(), 101);
    Ok(ws)
}

fn m(g: &TestGateway, name: &str) -> f64 {
    metric(&g.gateway().metrics_text(), name)
}

const TOTAL: &str = "keymaster_tunnels_total{route=\"default\"}";
const ACTIVE: &str = "keymaster_tunnels_active{route=\"default\"}";
const UP: &str = "keymaster_tunnel_bytes_total{direction=\"upstream\",route=\"default\"}";
const DOWN: &str = "keymaster_tunnel_bytes_total{direction=\"downstream\",route=\"default\"}";
const IDLE: &str = "keymaster_tunnel_idle_timeouts_total{route=\"default\"}";

async fn next_msg(ws: &mut Ws) -> Message {
    tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("a message within 10 s")
        .expect("stream open")
        .expect("valid message")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_echo_text_binary_large_and_close() {
    let o = ws_origin().await;
    let g = start_gateway(&config_text(o.addr, "", ""));
    let mut ws = ws_connect(g.addr, "/chat?room=1", &[])
        .await
        .expect("upgrade");
    assert_eq!(m(&g, TOTAL), 1.0);
    assert_eq!(m(&g, ACTIVE), 1.0);

    ws.send(Message::text("hello")).await.unwrap();
    assert_eq!(next_msg(&mut ws).await, Message::text("hello"));
    ws.send(Message::binary(vec![0u8, 1, 2, 255]))
        .await
        .unwrap();
    assert_eq!(
        next_msg(&mut ws).await,
        Message::binary(vec![0u8, 1, 2, 255])
    );

    // Large messages both ways, several in flight: far more than any socket buffer, so the
    // tunnel must apply backpressure rather than lose or buffer everything.
    let big: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let (mut tx, mut rx) = ws.split();
    let sent = big.clone();
    let writer = tokio::spawn(async move {
        for _ in 0..3 {
            tx.send(Message::binary(sent.clone())).await.unwrap();
        }
        tx
    });
    for _ in 0..3 {
        let got = tokio::time::timeout(Duration::from_secs(30), rx.next())
            .await
            .expect("echo within 30 s")
            .unwrap()
            .unwrap();
        assert_eq!(got.into_data().as_ref(), &big[..]);
    }
    let mut ws = writer.await.unwrap().reunite(rx).unwrap();

    // The close handshake passes through: the origin's Close frame, then its TCP close (the
    // client sees the end of the stream), then the client closes and the tunnel ends.
    ws.close(None).await.unwrap();
    let mut closed = false;
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
            Ok(Some(Ok(Message::Close(_)))) => closed = true,
            Ok(Some(Ok(_))) => continue,
            Ok(None) | Ok(Some(Err(tungstenite::Error::ConnectionClosed))) => break,
            Ok(Some(Err(e))) => panic!("close handshake failed: {e}"),
            Err(_) => panic!("the tunnel did not end within 10 s"),
        }
    }
    assert!(closed, "the origin's Close frame came through");
    drop(ws);
    assert!(eventually(Duration::from_secs(10), || m(&g, ACTIVE) == 0.0).await);
    assert!(m(&g, UP) >= 3.0 * big.len() as f64);
    assert!(m(&g, DOWN) >= 3.0 * big.len() as f64);
    assert_eq!(m(&g, TOTAL), 1.0);
    assert_eq!(
        m(
            &g,
            "keymaster_requests_total{route=\"default\",status_class=\"1xx\"}"
        ),
        1.0
    );

    // The origin saw the handshake with the forwarding headers the gateway adds.
    let hs = o.handshakes.lock().unwrap().clone();
    assert_eq!(hs.len(), 1);
    assert_eq!(hs[0]["upgrade"], "websocket");
    assert_eq!(hs[0]["x-forwarded-for"], "127.0.0.1");
    assert!(hs[0].contains_key("sec-websocket-key"));
    assert!(hs[0].contains_key("via"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_filter_refuses_the_handshake_and_no_tunnel_opens() {
    let o = ws_origin().await;
    let filters = r#"
[[filters]]
name = "keys"
type = "api_key"
keys = ["k1"]
"#;
    let g = start_gateway(&config_text(o.addr, "", filters));
    match ws_connect(g.addr, "/", &[]).await {
        Err(tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), 401),
        other => panic!("expected a 401, got {:?}", other.map(|_| "a WebSocket")),
    }
    assert!(
        o.handshakes.lock().unwrap().is_empty(),
        "origin never asked"
    );
    assert_eq!(m(&g, TOTAL), 0.0);
    // With the key the same handshake opens a tunnel.
    let mut ws = ws_connect(g.addr, "/", &[("x-api-key", "k1")])
        .await
        .unwrap();
    ws.send(Message::text("in")).await.unwrap();
    assert_eq!(next_msg(&mut ws).await, Message::text("in"));
    assert_eq!(m(&g, TOTAL), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_refusing_the_upgrade_is_passed_back() {
    let o = raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        while read_head(&mut s, &mut carry).await.is_some() {
            let _ = s
                .write_all(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 6\r\n\r\nno ws!")
                .await;
        }
    })
    .await;
    let g = start_gateway(&config_text(o.addr, "", ""));
    match ws_connect(g.addr, "/", &[]).await {
        Err(tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 403);
            assert_eq!(resp.body().as_deref(), Some(&b"no ws!"[..]));
        }
        other => panic!(
            "expected the origin's 403, got {:?}",
            other.map(|_| "a WebSocket")
        ),
    }
    assert_eq!(m(&g, TOTAL), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tunnel_is_closed_after_the_routes_idle_timeout() {
    let o = ws_origin().await;
    let routes = r#"
[[routes]]
name = "ws"
cluster = "origin"
match = { path_prefix = "/ws" }
upgrade = { idle_timeout = "300ms" }
"#;
    let g = start_gateway(&config_text(o.addr, "", routes));
    let mut ws = ws_connect(g.addr, "/ws", &[]).await.unwrap();
    ws.send(Message::text("ping")).await.unwrap();
    assert_eq!(next_msg(&mut ws).await, Message::text("ping"));
    // Say nothing: the gateway closes both sides once the tunnel has been idle 300 ms.
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "idle tunnel still open after 20 s");
    let idle = "keymaster_tunnel_idle_timeouts_total{route=\"ws\"}";
    assert!(eventually(Duration::from_secs(5), || m(&g, idle) == 1.0).await);
    assert_eq!(m(&g, "keymaster_tunnels_active{route=\"ws\"}"), 0.0);
    assert_eq!(m(&g, IDLE), 0.0);
}

/// An origin that answers `Upgrade: <proto>` requests with 101 and then echoes raw bytes,
/// and anything else with 200 and the request head it saw as the body.
async fn raw_upgrade_origin() -> RawOrigin {
    raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        let Some(head) = read_head(&mut s, &mut carry).await else {
            return;
        };
        if let Some(proto) = head_header(&head, "upgrade") {
            let resp = format!(
                "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: {proto}\r\n\r\n"
            );
            let _ = s.write_all(resp.as_bytes()).await;
            let _ = s.write_all(&carry).await;
            let mut buf = [0u8; 4096];
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        } else {
            let resp = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{head}",
                head.len()
            );
            let _ = s.write_all(resp.as_bytes()).await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_upgrades_only_where_configured() {
    let o = raw_upgrade_origin().await;
    let routes = r#"
[[routes]]
name = "custom"
cluster = "origin"
match = { path_prefix = "/custom" }
upgrade = { websocket = false, protocols = ["my-proto"] }
"#;
    let g = start_gateway(&config_text(o.addr, "", routes));
    // `close` too: a refused upgrade's plain response then ends the connection.
    let handshake = |path: &str, proto: &str| {
        format!(
            "GET {path} HTTP/1.1\r\nhost: gw\r\nconnection: Upgrade, close\r\nupgrade: {proto}\r\n\r\n"
        )
    };

    // Configured: 101, then raw bytes both ways.
    let mut s = TcpStream::connect(g.addr).await.unwrap();
    s.write_all(handshake("/custom", "my-proto").as_bytes())
        .await
        .unwrap();
    let mut carry = Vec::new();
    let head = read_head(&mut s, &mut carry).await.expect("101 head");
    assert_eq!(status_of(head.as_bytes()), Some(101), "{head}");
    assert_eq!(head_header(&head, "upgrade"), Some("my-proto"));
    s.write_all(b"raw bytes, not HTTP").await.unwrap();
    let echoed = read_exact_body(&mut s, &mut carry, 19).await;
    assert_eq!(&echoed[..], b"raw bytes, not HTTP");
    drop(s);
    let custom = "keymaster_tunnels_total{route=\"custom\"}";
    assert_eq!(m(&g, custom), 1.0);
    // The tunnel's origin connection was never offered back to the pool.
    let idle = "keymaster_upstream_idle_connections{cluster=\"origin\"}";
    assert!(
        eventually(Duration::from_secs(5), || m(
            &g,
            "keymaster_tunnels_active{route=\"custom\"}"
        ) == 0.0)
        .await
    );
    assert_eq!(m(&g, idle), 0.0);

    // Not configured on this route: WebSocket is forwarded as a plain request, Upgrade removed.
    let (out, _) = raw_exchange(
        g.addr,
        handshake("/custom", "websocket").as_bytes(),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(status_of(&out), Some(200));
    let text = String::from_utf8_lossy(&out).to_ascii_lowercase();
    assert!(!text.contains("upgrade:"), "{text}");
    // Nor is my-proto on the default route (only WebSocket is allowed by default).
    let (out, _) = raw_exchange(
        g.addr,
        handshake("/other", "my-proto").as_bytes(),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(status_of(&out), Some(200));
    assert!(!String::from_utf8_lossy(&out)
        .to_ascii_lowercase()
        .contains("upgrade:"));
    assert_eq!(m(&g, custom), 1.0);
    assert_eq!(m(&g, TOTAL), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_over_h2_extended_connect() {
    use http_body_util::Empty;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tokio_tungstenite::tungstenite::protocol::Role;
    let o = ws_origin().await;
    let extra = "protocol = \"h2c\"";
    let routes = r#"
[[routes]]
name = "no-ws"
cluster = "origin"
match = { path_prefix = "/no-ws" }
upgrade = { websocket = false }
"#;
    let g = start_gateway(&config_text(o.addr, extra, routes));
    let tcp = TcpStream::connect(g.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake::<_, Empty<bytes::Bytes>>(TokioIo::new(tcp))
        .await
        .expect("h2 handshake");
    tokio::spawn(conn);
    // A plain request first, so the gateway's SETTINGS (ENABLE_CONNECT_PROTOCOL) are in.
    let warm = http::Request::get(format!("http://{}/", g.addr))
        .body(Empty::new())
        .unwrap();
    let _ = sender.send_request(warm).await;

    let req = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(format!("http://{}/chat", g.addr))
        .header("sec-websocket-version", "13")
        .extension(hyper::ext::Protocol::from_static("websocket"))
        .body(Empty::new())
        .unwrap();
    sender.ready().await.unwrap();
    let resp = sender.send_request(req).await.expect("CONNECT answered");
    assert_eq!(resp.status(), 200, "RFC 8441: 2xx opens the tunnel");
    assert!(!resp.headers().contains_key("sec-websocket-accept"));
    assert!(!resp.headers().contains_key("upgrade"));
    let upgraded = hyper::upgrade::on(resp).await.expect("h2 stream upgraded");
    let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
        TokioIo::new(upgraded),
        Role::Client,
        None,
    )
    .await;
    ws.send(Message::text("over h2")).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("echo within 10 s")
        .unwrap()
        .unwrap();
    assert_eq!(got, Message::text("over h2"));
    let big = vec![7u8; 1024 * 1024];
    ws.send(Message::binary(big.clone())).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(30), ws.next())
        .await
        .expect("echo within 30 s")
        .unwrap()
        .unwrap();
    assert_eq!(got.into_data().as_ref(), &big[..]);
    assert_eq!(m(&g, TOTAL), 1.0);

    // The origin saw an HTTP/1.1 WebSocket handshake the gateway made up.
    let hs = o.handshakes.lock().unwrap().clone();
    assert_eq!(hs.len(), 1);
    assert_eq!(hs[0]["upgrade"], "websocket");
    assert_eq!(hs[0]["sec-websocket-version"], "13");
    assert!(hs[0].contains_key("sec-websocket-key"));
    ws.close(None).await.unwrap();

    // A route that does not allow WebSocket refuses the extended CONNECT (400, the origin
    // is not asked); no tunnel.
    let req = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(format!("http://{}/no-ws", g.addr))
        .header("sec-websocket-version", "13")
        .extension(hyper::ext::Protocol::from_static("websocket"))
        .body(Empty::new())
        .unwrap();
    sender.ready().await.unwrap();
    let resp = sender.send_request(req).await.expect("CONNECT answered");
    assert_eq!(resp.status(), 400);
    assert_eq!(m(&g, TOTAL), 1.0);
    assert_eq!(o.handshakes.lock().unwrap().len(), 1);
}
