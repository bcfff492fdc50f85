//! gRPC end to end through the gateway with a real tonic client and server (no codegen: a
//! hand-written prost message and service on tonic's generic server/client APIs): unary,
//! server-streaming and bidirectional calls over the h2c and the TLS listener to an h2
//! origin, grpc-status/grpc-message trailers preserved, `grpc-timeout` as the request
//! deadline, and gRPC-shaped errors when the gateway itself fails the call.

mod support;
mod tls_support;
mod upstream_support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::StreamExt;
use support::*;
use tls_support::Pki;
use tonic::codegen::{http, BoxFuture, Service};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};
use tonic_prost::ProstCodec;
use upstream_support::{config_with_cluster, spawn_origin, stop, OriginOpts};

#[derive(Clone, PartialEq, prost::Message)]
pub struct Msg {
    #[prost(string, tag = "1")]
    pub text: String,
    #[prost(uint32, tag = "2")]
    pub count: u32,
}

type MsgStream = Pin<Box<dyn futures_util::Stream<Item = Result<Msg, Status>> + Send>>;

/// The test service `test.Echo`: `Unary` echoes (text "fail" → NOT_FOUND with a message),
/// `Split` streams `count` replies, `Chat` answers each message as it comes.
#[derive(Clone, Default)]
struct Echo;

impl tonic::server::NamedService for Echo {
    const NAME: &'static str = "test.Echo";
}

struct Unary;
impl tonic::server::UnaryService<Msg> for Unary {
    type Response = Msg;
    type Future = BoxFuture<Response<Msg>, Status>;
    fn call(&mut self, req: Request<Msg>) -> Self::Future {
        Box::pin(async move {
            let m = req.into_inner();
            if m.text == "fail" {
                return Err(Status::not_found("no such thing: fail"));
            }
            Ok(Response::new(Msg {
                text: format!("echo:{}", m.text),
                count: m.count,
            }))
        })
    }
}

struct Split;
impl tonic::server::ServerStreamingService<Msg> for Split {
    type Response = Msg;
    type ResponseStream = MsgStream;
    type Future = BoxFuture<Response<MsgStream>, Status>;
    fn call(&mut self, req: Request<Msg>) -> Self::Future {
        Box::pin(async move {
            let m = req.into_inner();
            let s = futures_util::stream::iter((0..m.count).map(move |i| {
                Ok(Msg {
                    text: format!("{}#{i}", m.text),
                    count: i,
                })
            }));
            Ok(Response::new(Box::pin(s) as MsgStream))
        })
    }
}

/// Sends one message, then nothing more (never ends).
struct Stall;
impl tonic::server::ServerStreamingService<Msg> for Stall {
    type Response = Msg;
    type ResponseStream = MsgStream;
    type Future = BoxFuture<Response<MsgStream>, Status>;
    fn call(&mut self, _: Request<Msg>) -> Self::Future {
        Box::pin(async move {
            let s = futures_util::stream::iter([Ok(msg("first", 0))])
                .chain(futures_util::stream::pending());
            Ok(Response::new(Box::pin(s) as MsgStream))
        })
    }
}

struct Chat;
impl tonic::server::StreamingService<Msg> for Chat {
    type Response = Msg;
    type ResponseStream = MsgStream;
    type Future = BoxFuture<Response<MsgStream>, Status>;
    fn call(&mut self, req: Request<tonic::Streaming<Msg>>) -> Self::Future {
        Box::pin(async move {
            let s = req.into_inner().map(|m| {
                m.map(|m| Msg {
                    text: format!("re:{}", m.text),
                    count: m.count,
                })
            });
            Ok(Response::new(Box::pin(s) as MsgStream))
        })
    }
}

impl<B> Service<http::Request<B>> for Echo
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<Msg, Msg>::default());
            Ok(match req.uri().path() {
                "/test.Echo/Unary" => grpc.unary(Unary, req).await,
                "/test.Echo/Split" => grpc.server_streaming(Split, req).await,
                "/test.Echo/Chat" => grpc.streaming(Chat, req).await,
                "/test.Echo/Stall" => grpc.server_streaming(Stall, req).await,
                _ => Status::unimplemented("no such method").into_http(),
            })
        })
    }
}

/// The tonic service on 127.0.0.1:0, served by hyper's HTTP/2 server (prior knowledge).
async fn tonic_origin() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req| Echo.call(req));
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                        .await;
            });
        }
    });
    (addr, task)
}

fn h2_cluster(origin: SocketAddr) -> String {
    format!("protocol = \"h2\"\nservers = [{{ address = \"{origin}\" }}]")
}

async fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("tonic connects to the gateway")
}

fn client(ch: Channel) -> tonic::client::Grpc<Channel> {
    tonic::client::Grpc::new(ch)
}

fn codec() -> ProstCodec<Msg, Msg> {
    ProstCodec::default()
}

fn path(m: &'static str) -> http::uri::PathAndQuery {
    http::uri::PathAndQuery::from_static(m)
}

fn msg(text: &str, count: u32) -> Msg {
    Msg {
        text: text.into(),
        count,
    }
}

/// Unary, a failing unary (status and message from the server's trailers), server
/// streaming and bidirectional streaming over one channel.
async fn exercise(ch: Channel) {
    let mut c = client(ch);
    c.ready().await.unwrap();
    let r = c
        .unary(
            Request::new(msg("hi", 7)),
            path("/test.Echo/Unary"),
            codec(),
        )
        .await
        .expect("unary call");
    assert_eq!(r.into_inner(), msg("echo:hi", 7));

    c.ready().await.unwrap();
    let e = c
        .unary(
            Request::new(msg("fail", 0)),
            path("/test.Echo/Unary"),
            codec(),
        )
        .await
        .expect_err("the server's error status");
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(e.message(), "no such thing: fail");

    c.ready().await.unwrap();
    let mut s = c
        .server_streaming(Request::new(msg("s", 5)), path("/test.Echo/Split"), codec())
        .await
        .expect("server streaming call")
        .into_inner();
    let mut got = Vec::new();
    while let Some(m) = s.message().await.expect("stream message") {
        got.push(m.text);
    }
    assert_eq!(got, vec!["s#0", "s#1", "s#2", "s#3", "s#4"]);

    // Bidirectional: each reply arrives before the next message is sent.
    let (tx, rx) = tokio::sync::mpsc::channel::<Msg>(1);
    let outbound =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    tx.send(msg("one", 1)).await.unwrap();
    c.ready().await.unwrap();
    let mut replies = c
        .streaming(Request::new(outbound), path("/test.Echo/Chat"), codec())
        .await
        .expect("bidi call")
        .into_inner();
    for (i, word) in ["one", "two", "three"].iter().enumerate() {
        if i > 0 {
            tx.send(msg(word, i as u32 + 1)).await.unwrap();
        }
        let r = tokio::time::timeout(Duration::from_secs(5), replies.message())
            .await
            .expect("reply while the call is open")
            .unwrap()
            .unwrap();
        assert_eq!(r.text, format!("re:{word}"));
    }
    drop(tx);
    assert!(replies.message().await.unwrap().is_none());
}

#[tokio::test]
async fn calls_through_the_h2c_listener() {
    let (origin, _t) = tonic_origin().await;
    let g = start_gateway(&config_with_cluster(PREAMBLE, &h2_cluster(origin), ""));
    exercise(channel(g.addr).await).await;
    // All of it multiplexed over one origin connection.
    let m = g.gateway().metrics_text();
    assert_eq!(
        metric(&m, "keymaster_upstream_connects_total{cluster=\"up\"}"),
        1.0,
        "{m}"
    );
    stop(g).await;
}

/// A tonic connector: TLS to the gateway with ALPN h2.
#[derive(Clone)]
struct TlsConnect {
    addr: SocketAddr,
    cfg: std::sync::Arc<rustls::ClientConfig>,
}

impl Service<http::Uri> for TlsConnect {
    type Response = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;
    type Error = std::io::Error;
    type Future = BoxFuture<Self::Response, std::io::Error>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: http::Uri) -> Self::Future {
        let (addr, cfg) = (self.addr, self.cfg.clone());
        Box::pin(async move {
            let s = tls_support::connect(addr, "gw.test", cfg).await?;
            Ok(hyper_util::rt::TokioIo::new(s))
        })
    }
}

#[tokio::test]
async fn calls_through_the_tls_listener() {
    let (origin, _t) = tonic_origin().await;
    let pki = Pki::new();
    let cert = pki.issue("gw", &["gw.test"], "gw", false);
    let listener = tls_support::tls_keys(&[&cert], "");
    let g = start_gateway(&config_with_cluster(
        &format!("{PREAMBLE}{listener}"),
        &h2_cluster(origin),
        "",
    ));
    let cfg = tls_support::client_config(
        &pki,
        &tls_support::ClientOpts {
            alpn: vec!["h2"],
            ..Default::default()
        },
    );
    let ch = Endpoint::from_static("https://gw.test")
        .connect_with_connector(TlsConnect { addr: g.addr, cfg })
        .await
        .expect("tonic connects over TLS");
    exercise(ch).await;
    stop(g).await;
}

#[tokio::test]
async fn an_unreachable_origin_is_unavailable() {
    let (closed, _closed_held) = closed_addr(); // nothing listens here
    let g = start_gateway(&config_with_cluster(PREAMBLE, &h2_cluster(closed), ""));
    let mut c = client(channel(g.addr).await);
    c.ready().await.unwrap();
    let e = c
        .unary(Request::new(msg("x", 1)), path("/test.Echo/Unary"), codec())
        .await
        .expect_err("the gateway fails the call");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().starts_with("keymaster:"), "{e:?}");
    drop(c);
    stop(g).await;
    // No route: UNIMPLEMENTED, also shaped as gRPC.
    let text = format!(
        "{PREAMBLE}\n[[routes]]\nname = \"only\"\ncluster = \"up\"\nmatch = {{ path_prefix = \"/other\" }}\n\n[[clusters]]\nname = \"up\"\n{}",
        h2_cluster(closed)
    );
    let g = start_gateway(&text);
    let mut c = client(channel(g.addr).await);
    c.ready().await.unwrap();
    let e = c
        .unary(Request::new(msg("x", 1)), path("/test.Echo/Unary"), codec())
        .await
        .expect_err("no route");
    assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
    drop(c);
    stop(g).await;
}

/// A tonic client transport without tonic's own `grpc-timeout` enforcement (the Channel
/// cancels the call itself when the timeout passes): plain hyper HTTP/2, so the status the
/// test sees is the one the gateway sent.
#[derive(Clone)]
struct RawH2(hyper::client::conn::http2::SendRequest<tonic::body::Body>);

impl Service<http::Request<tonic::body::Body>> for RawH2 {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = BoxFuture<Self::Response, hyper::Error>;
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.0.poll_ready(cx)
    }
    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(req))
    }
}

async fn raw_client(addr: SocketAddr) -> tonic::client::Grpc<RawH2> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    tonic::client::Grpc::with_origin(RawH2(sender), "http://gw.test".parse().unwrap())
}

#[tokio::test]
async fn grpc_timeout_is_the_request_deadline() {
    // An h2 origin that never answers /hold (held far beyond the call's deadline); the
    // gateway's route has no timeout of its own but 5 s for the response head.
    let origin = spawn_origin(OriginOpts {
        h2c: true,
        ..OriginOpts::default()
    })
    .await;
    let g = start_gateway(&config_with_cluster(PREAMBLE, &h2_cluster(origin.addr), ""));
    let mut c = raw_client(g.addr).await;
    c.ready().await.unwrap();
    let mut req = Request::new(msg("x", 1));
    req.set_timeout(Duration::from_millis(300));
    let started = std::time::Instant::now();
    let e = c
        .unary(req, path("/hold"), codec())
        .await
        .expect_err("deadline exceeded");
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    assert!(e.message().starts_with("keymaster:"), "{e:?}");
    // Well before the 5 s response-header timeout (generous for a loaded machine).
    assert!(started.elapsed() < Duration::from_secs(4));
    origin.release();
    let m = g.gateway().metrics_text();
    assert_eq!(
        metric(
            &m,
            "keymaster_errors_total{category=\"origin_request_timeout\",side=\"origin\"}"
        ),
        1.0,
        "{m}"
    );
    drop(c);
    stop(g).await;
}

#[tokio::test]
async fn a_deadline_passing_mid_stream_ends_the_call_with_deadline_exceeded() {
    let (origin, _t) = tonic_origin().await;
    let g = start_gateway(&config_with_cluster(PREAMBLE, &h2_cluster(origin), ""));
    let mut c = raw_client(g.addr).await;
    c.ready().await.unwrap();
    let mut req = Request::new(msg("x", 1));
    req.set_timeout(Duration::from_millis(300));
    let mut s = c
        .server_streaming(req, path("/test.Echo/Stall"), codec())
        .await
        .expect("the call starts")
        .into_inner();
    let first = s.message().await.expect("first message").unwrap();
    assert_eq!(first.text, "first");
    let e = tokio::time::timeout(Duration::from_secs(5), s.message())
        .await
        .expect("the gateway ends the stream at the deadline")
        .expect_err("DEADLINE_EXCEEDED in the trailers");
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    assert!(e.message().starts_with("keymaster:"), "{e:?}");
    drop((s, c));
    stop(g).await;
}
