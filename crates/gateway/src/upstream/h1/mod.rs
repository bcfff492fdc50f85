//! keymaster's own HTTP/1.1 client for origin connections.
//!
//! hyper's client runs every connection as a task of its own and hands requests to it
//! through a channel: two task switches and a wake-up per request, and a task with its
//! buffers per pooled connection. Here the connection is a plain value instead: a request
//! takes it out of the pool, writes on it and reads the response head inline, and the
//! response body ([`Body`]) owns it while it streams and offers it back for the pool at a
//! clean end. Nothing runs on an idle connection; the pool checks it without a syscall
//! (tokio's cached readiness) when it is taken, and the worker's sweeper closes stale ones.
//!
//! ```text
//! send(conn, request) ── Pump: head (+ small body) in one write, then body frames ──┐
//!        │                                    (keeps going inside Body: full duplex) │
//!        └─ read until a final head (decode::parse_head; 1xx skipped; kept in wire form
//!           when nothing but Via and the request id is added to it) ─► Response<Body>, boxed
//! Body::poll_frame ── framing::Decoder (length / chunked / until close) ─► frames
//!        └─ clean end, keep-alive, request fully written, no stray bytes ─► take_reusable
//! ```
//!
//! - [`decode`]: response head and body framing, on bytes already read.
//! - [`encode`]: request head and body writing.
//! - [`keymaster_http::io`]: the transport (TCP or TLS) and what a 101 leaves of it.

mod decode;
mod encode;

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body::{Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};
use tokio::io::{AsyncRead, ReadBuf};

use super::conn::{OriginResponse, UpstreamBody};
use super::connect::OpenSlot;
use crate::body::RequestBody;
use decode::{Framing, Head};
use encode::{Pump, PumpError};
use keymaster_http::error::{BoxError, Error, Kind};
use keymaster_http::framing::{Decoder, Step};
use keymaster_http::headers::RawHead;
use keymaster_http::io::spare;
pub(crate) use keymaster_http::io::{Io, MAX_READ};
/// An origin connection after a 101, holding its slot under the cluster's cap.
pub(crate) type Upgraded = keymaster_http::io::Upgraded<OpenSlot>;

/// Whether an idle transport has something to read (a close, a reset, stray bytes): what
/// tokio last saw of the socket, read outside the task's cooperative budget. With the
/// budget spent, a plain `poll_read` answers Pending whatever the socket holds, and a
/// connection the origin closed would pass as open (the request then fails on it).
fn has_input(io: &mut Io) -> bool {
    match io {
        // Reads only when tokio saw the socket readable; no budget involved.
        Io::Tcp(tcp) => !matches!(
            tcp.try_read(&mut [0u8; 1]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
        ),
        // TLS may hold decrypted bytes or a close_notify: ask the session.
        Io::Tls(_) => poll_read_unbudgeted(io),
    }
}

/// One `poll_read` of a byte outside the task's budget: whether it finished (data, end or
/// error).
fn poll_read_unbudgeted(io: &mut Io) -> bool {
    let mut byte = [0u8; 1];
    let mut rb = ReadBuf::new(&mut byte);
    let poll = std::future::poll_fn(|cx| {
        Poll::Ready(Pin::new(&mut *io).poll_read(cx, &mut rb).is_ready())
    });
    let mut check = std::pin::pin!(tokio::task::coop::unconstrained(poll));
    let mut cx = Context::from_waker(Waker::noop());
    matches!(Future::poll(check.as_mut(), &mut cx), Poll::Ready(true))
}

/// The room for the first read of a response: the head and, for a response of up to about
/// this size, the whole body, so that it goes to the client in one write.
const HEAD_READ: usize = 16 * 1024;

/// An open HTTP/1.1 connection to an origin, idle or carrying one request. One pointer
/// wide: it moves between the pool, the request in flight and the response body several
/// times per request, and lives for many requests (one allocation per connection).
pub(crate) struct Connection(Box<ConnState>);

/// What a [`Connection`] holds.
pub(crate) struct ConnState {
    io: Io,
    /// Bytes read and not yet parsed.
    buf: BytesMut,
    /// Keeps the connection counted as open (the cluster's cap and gauge) until dropped.
    open: OpenSlot,
}

impl std::ops::Deref for Connection {
    type Target = ConnState;
    fn deref(&self) -> &ConnState {
        &self.0
    }
}

impl std::ops::DerefMut for Connection {
    fn deref_mut(&mut self) -> &mut ConnState {
        &mut self.0
    }
}

/// Why a request failed before its response head, and what can be done about it.
pub(crate) struct Failure {
    pub(crate) err: Error,
    /// The request, when no byte of it was written: safe to send anywhere, any method.
    /// (Boxed, like `resend`: failures are rare, and this is the output of every send.)
    pub(crate) unsent: Option<Box<Request<RequestBody>>>,
    /// The request again, when it was written but can be rebuilt (no body, or a buffered
    /// one): for the keep-alive race.
    pub(crate) resend: Option<Box<Request<RequestBody>>>,
    /// The connection was dead before any response byte came: the keep-alive race if it
    /// was a reused one.
    pub(crate) stale: bool,
}

impl Failure {
    fn new(err: Error) -> Failure {
        Failure {
            err,
            unsent: None,
            resend: None,
            stale: false,
        }
    }
}

impl Connection {
    /// The gauge of idle connections of the cluster that opened this one.
    pub(crate) fn idle_gauge(&self) -> Option<&crate::metrics::sharded::Gauge> {
        self.open.idle_gauge()
    }

    pub(crate) fn new(io: Io, open: OpenSlot) -> Connection {
        Connection(Box::new(ConnState {
            io,
            buf: BytesMut::new(),
            open,
        }))
    }

    /// An idle connection is unusable: the origin closed or reset it, or sent bytes nobody
    /// asked for. Costs no syscall while tokio knows the socket has nothing to read.
    pub(crate) fn is_closed(&mut self) -> bool {
        !self.buf.is_empty() || has_input(&mut self.io)
    }

    /// Read more into the buffer, making room for up to `want` bytes.
    fn poll_fill(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<std::io::Result<usize>> {
        let c = &mut *self.0;
        c.io.poll_fill(cx, &mut c.buf, want, 2048)
    }

    /// Read until a final response head is parsed. `received`: any byte came.
    fn poll_head(
        &mut self,
        method: &http::Method,
        raw: Option<&http::HeaderName>,
        cx: &mut Context<'_>,
        received: &mut bool,
    ) -> Poll<Result<Head, Failure>> {
        loop {
            match decode::parse_head(&mut self.buf, method, raw) {
                Ok(Some(head)) => return Poll::Ready(Ok(head)),
                Ok(None) => {}
                Err(e) => return Poll::Ready(Err(Failure::new(e))),
            }
            match ready!(self.poll_fill(cx, HEAD_READ)) {
                Ok(0) if !*received => {
                    let mut f = Failure::new(Error::new(
                        Kind::OriginReset,
                        "origin closed the connection before responding",
                    ));
                    f.stale = true;
                    return Poll::Ready(Err(f));
                }
                Ok(0) => {
                    return Poll::Ready(Err(Failure::new(Error::new(
                        Kind::OriginReset,
                        "origin closed the connection in the middle of the response head",
                    ))))
                }
                Ok(_) => *received = true,
                Err(e) => {
                    let stale = !*received && is_reset(&e);
                    let mut f = Failure::new(
                        Error::new(Kind::OriginReset, "reading from the origin failed")
                            .with_source(e),
                    );
                    f.stale = stale;
                    return Poll::Ready(Err(f));
                }
            }
        }
    }
}

fn is_reset(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionReset | BrokenPipe | ConnectionAborted)
}

/// Send `req` on `conn` and read the response head. The response body owns the connection.
/// `raw_head`: the response head may be kept as bytes ([`RawHead`]); the name is the
/// request-id field's.
/// `added`: fields written after the request's own (see [`keymaster_http::headers::AddedFields`]).
pub(crate) fn send(
    conn: Connection,
    mut req: Box<Request<RequestBody>>,
    raw_head: Option<http::HeaderName>,
    added: Option<&keymaster_http::headers::AddedFields>,
) -> Sending {
    // The body goes to the pump; the boxed head stays for a resend (moved: 8 bytes).
    let body = std::mem::replace(req.body_mut(), RequestBody::Empty);
    // What a resend needs if the request goes out and the connection turns out dead.
    let replay = match &body {
        RequestBody::Empty => Some(RequestBody::Empty),
        RequestBody::Buffered(b) => Some(RequestBody::Buffered(b.clone())),
        RequestBody::Stream { .. } => None,
    };
    Sending {
        pump: Some(Pump::new(&req, body, added)),
        conn: Some(conn),
        req: Some(req),
        replay,
        raw_head,
        write_failed: false,
        received: false,
    }
}

/// A request going out on a connection until its response head is in. A plain struct rather
/// than an `async fn`: it sits inside every in-flight request's future (which hyper keeps per
/// client connection), and the compiler's layout for an `async fn` keeps copies of its
/// arguments next to the locals moved out of them.
pub(crate) struct Sending {
    conn: Option<Connection>,
    /// The request head (its body is with `pump`): for a resend if the connection turns
    /// out dead.
    req: Option<Box<Request<RequestBody>>>,
    replay: Option<RequestBody>,
    /// See [`send`].
    raw_head: Option<http::HeaderName>,
    pump: Option<Pump>,
    /// Writing the request failed: only the response can still come (see `poll`).
    write_failed: bool,
    received: bool,
}

impl std::future::Future for Sending {
    type Output = Result<OriginResponse, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (Some(conn), Some(req)) = (this.conn.as_mut(), this.req.as_ref()) else {
            return Poll::Pending; // polled after completion
        };
        if let Some(p) = this.pump.as_mut().filter(|_| !this.write_failed) {
            match p.poll(&mut conn.io, cx) {
                Poll::Ready(Ok(())) => this.pump = None,
                Poll::Ready(Err(PumpError::Body(e))) => {
                    let err = Error::new(Kind::ClientGone, "client request body failed");
                    this.conn = None;
                    return Poll::Ready(Err(Failure::new(err.with_source(e))));
                }
                // The origin may have answered (and closed) before reading the whole
                // request: its response is still read.
                Poll::Ready(Err(PumpError::Write(e))) => {
                    tracing::debug!(error = %e, "writing the request to the origin failed");
                    this.write_failed = true;
                }
                Poll::Pending => {}
            }
        }
        let raw = this.raw_head.as_ref();
        let mut f = match conn.poll_head(req.method(), raw, cx, &mut this.received) {
            // Also after a failed write: an origin that answers early and closes (a 401 or
            // 413 without reading the body) fails the write first, and its response may be
            // readable only a moment later (the socket's readiness comes through the event
            // loop). The read side ends soon on a closed connection; the response-header
            // timeout bounds the wait either way.
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(head)) => {
                let Some(conn) = this.conn.take() else {
                    return Poll::Pending;
                };
                // Answered before the whole request went out and writing failed: the
                // response may still be read, but the connection is never reused.
                let broken = this.pump.is_some() && this.write_failed;
                let pump = this.pump.take().filter(|_| !broken).map(Box::new);
                if let Some(req) = this.req.take() {
                    keymaster_http::headers::discard_map((*req).into_parts().0.headers);
                }
                return Poll::Ready(Ok(respond(head, conn, pump, broken)));
            }
            // No response: the read side's failure says how the exchange ended (a write that
            // failed first was the origin closing or resetting the same connection).
            Poll::Ready(Err(f)) => f,
        };
        this.conn = None; // a failed exchange closes its connection
        let written = this.pump.as_ref().map_or(1, |p| p.written);
        let req = this.req.take();
        if written == 0 {
            if let (Some(p), Some(mut req)) = (this.pump.take(), req) {
                *req.body_mut() = p.into_body();
                f.unsent = Some(req);
                f.stale = true;
            }
        } else if f.stale {
            if let (Some(b), Some(mut req)) = (this.replay.take(), req) {
                *req.body_mut() = b;
                f.resend = Some(req);
            }
        }
        Poll::Ready(Err(f))
    }
}

/// The response, with a body that owns the connection (and the rest of the request).
fn respond(head: Head, conn: Connection, pump: Option<Box<Pump>>, broken: bool) -> OriginResponse {
    let body = Body {
        raw_head: head.raw,
        decoder: decode::decoder(head.framing),
        upgrade: head.framing == Framing::Upgrade,
        keep_alive: head.keep_alive && !broken,
        conn: Some(conn),
        pump,
        reusable: false,
        failure: None,
    };
    let mut resp = Box::new(Response::new(UpstreamBody::H1(body)));
    *resp.status_mut() = head.status;
    *resp.version_mut() = head.version;
    keymaster_http::headers::replace_map(resp.headers_mut(), head.headers);
    if let Some(r) = head.reason {
        resp.extensions_mut().insert(r);
    }
    resp
}

/// An origin's response body, read from the connection it owns.
pub(crate) struct Body {
    conn: Option<Connection>,
    /// The response head as bytes, until the proxy stage takes it.
    raw_head: Option<RawHead>,
    decoder: Decoder,
    /// The rest of the request, still being written (an origin may answer early; boxed, as
    /// that is rare).
    pump: Option<Box<Pump>>,
    keep_alive: bool,
    upgrade: bool,
    /// The body ended cleanly and the connection can carry another request.
    reusable: bool,
    /// The body failed: `Some(error)` until reported, then `Some(None)`.
    failure: Option<Option<Error>>,
}

impl Body {
    /// The response head as bytes, if it was kept so (the response's `HeaderMap` is empty).
    pub(crate) fn take_raw_head(&mut self) -> Option<RawHead> {
        self.raw_head.take()
    }

    /// The connection, if the body ended cleanly and it may carry another request.
    pub(crate) fn take_reusable(&mut self) -> Option<Connection> {
        if self.decoder.is_done() {
            self.finish();
        }
        if self.reusable {
            self.reusable = false;
            self.conn.take()
        } else {
            None
        }
    }

    /// After a 101: the connection for a tunnel, with what the origin already sent.
    pub(crate) fn take_upgraded(&mut self) -> Option<Upgraded> {
        if !self.upgrade {
            return None;
        }
        let mut c = self.conn.take()?.0;
        Some(Upgraded {
            read_ahead: c.buf.split().freeze(),
            io: c.io,
            _held: c.open,
        })
    }

    /// The body is complete: keep the connection only if the origin allows it, the whole
    /// request went out and nothing follows the response; otherwise close it now.
    fn finish(&mut self) {
        if self.reusable || self.upgrade {
            return;
        }
        let clean = self.keep_alive
            && self.pump.is_none()
            && self.conn.as_ref().is_some_and(|c| c.buf.is_empty());
        if clean {
            if let Some(c) = self.conn.as_mut() {
                // An idle connection holds no buffer: the worker keeps it for the next read
                // (the body's last bytes may still share it until the client has them).
                spare::LARGE.give(std::mem::take(&mut c.buf));
            }
            self.reusable = true;
        } else {
            self.pump = None;
            self.conn = None;
        }
    }

    /// The body cannot end cleanly. The error is reported on the next poll, after a wake-up:
    /// the client side first gets to flush what it already has (the head and the bytes that
    /// came), then the error aborts its connection, so the client sees a truncated response,
    /// never a complete-looking one, and never nothing.
    fn fail(
        &mut self,
        e: Error,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.conn = None;
        self.pump = None;
        self.keep_alive = false;
        self.failure = Some(Some(e));
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(failure) = this.failure.as_mut() {
            let e = failure
                .take()
                .unwrap_or_else(|| Error::new(Kind::OriginReset, "origin body already failed"));
            return Poll::Ready(Some(Err(Box::new(e))));
        }
        if this.decoder.is_done() || this.upgrade {
            this.finish();
            return Poll::Ready(None);
        }
        let Some(conn) = this.conn.as_mut() else {
            return Poll::Ready(None);
        };
        if let Some(p) = this.pump.as_mut() {
            match p.poll(&mut conn.io, cx) {
                Poll::Ready(Ok(())) => this.pump = None,
                Poll::Ready(Err(PumpError::Body(e))) => {
                    let err = Error::new(Kind::ClientGone, "client request body failed");
                    return this.fail(err.with_source(e), cx);
                }
                Poll::Ready(Err(PumpError::Write(e))) => {
                    // The origin stopped reading the request; its response may still end.
                    tracing::debug!(error = %e, "origin stopped reading the request body");
                    this.pump = None;
                    this.keep_alive = false;
                }
                Poll::Pending => {}
            }
        }
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match this.decoder.decode(&mut conn.buf) {
                Ok(Step::Data(data)) => {
                    if this.decoder.is_done() {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Step::Trailers(t)) => {
                    this.finish();
                    return Poll::Ready(Some(Ok(Frame::trailers(t))));
                }
                Ok(Step::End) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(Step::More) => {}
                Err(e) => return this.fail(e.by_origin(), cx),
            }
            let want = this
                .decoder
                .remaining()
                .map_or(16 * 1024, |r| r.min(MAX_READ as u64) as usize);
            match ready!(conn.poll_fill(cx, want)) {
                Ok(0) => match this.decoder.on_eof() {
                    Ok(_) => {
                        this.keep_alive = false;
                        this.finish();
                        return Poll::Ready(None);
                    }
                    Err(e) => return this.fail(e.by_origin(), cx),
                },
                Ok(_) => {}
                Err(e) => {
                    let err = Error::new(Kind::OriginReset, "reading the origin's body failed");
                    return this.fail(err.with_source(e), cx);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failure.is_none() && (self.decoder.is_done() || self.upgrade)
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use tokio::net::{TcpListener, TcpStream};

    /// Spend the task's coop budget, as a busy request does before it takes a connection.
    fn spend_budget(cx: &mut Context<'_>) {
        while let Poll::Ready(r) = tokio::task::coop::poll_proceed(cx) {
            r.made_progress();
        }
    }

    /// `check` with the task's budget spent.
    async fn without_budget(io: &mut Io, check: fn(&mut Io) -> bool) -> bool {
        poll_fn(|cx| {
            spend_budget(cx);
            Poll::Ready(check(io))
        })
        .await
    }

    /// An idle connection the origin closed is seen closed even when the task that takes it
    /// from the pool has spent its budget; an open one is seen open, and stray bytes make
    /// one unusable. Both checks: the TCP one, and the one TLS sessions get (run on TCP).
    #[tokio::test]
    async fn an_idle_connection_is_checked_whatever_the_budget() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        for check in [has_input as fn(&mut Io) -> bool, poll_read_unbudgeted] {
            let mut io = Io::Tcp(TcpStream::connect(addr).await.unwrap());
            let (peer, _) = listener.accept().await.unwrap();
            assert!(!without_budget(&mut io, check).await, "open and quiet");
            drop(peer);
            io.tcp().readable().await.unwrap(); // tokio sees the FIN
            assert!(without_budget(&mut io, check).await, "closed by the origin");

            let mut io = Io::Tcp(TcpStream::connect(addr).await.unwrap());
            let (mut peer, _) = listener.accept().await.unwrap();
            tokio::io::AsyncWriteExt::write_all(&mut peer, b"x")
                .await
                .unwrap();
            io.tcp().readable().await.unwrap();
            assert!(without_budget(&mut io, check).await, "stray bytes");
        }
    }

    /// A rustls server and a client that trusts it (for `origin.test`), over ring.
    pub(super) fn tls_configs() -> (rustls::ServerConfig, rustls::ClientConfig) {
        use rustls::pki_types::PrivateKeyDer;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["origin.test".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        (server, client)
    }

    /// A TLS connection to `origin.test` over `tcp`, as the pool holds one.
    pub(super) async fn tls_connect(tcp: TcpStream, client: rustls::ClientConfig) -> Io {
        let name = rustls::pki_types::ServerName::try_from("origin.test").unwrap();
        let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(client))
            .connect(name, tcp)
            .await
            .unwrap();
        Io::Tls(Box::new(tls.into()))
    }

    /// The same over a real TLS session: quiet after the handshake (the server's session
    /// tickets read), closed once the origin sends close_notify and its FIN.
    #[tokio::test]
    async fn an_idle_tls_connection_is_checked_whatever_the_budget() {
        let (server, client) = tls_configs();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(server));
        let (close, closing) = tokio::sync::oneshot::channel::<()>();
        let origin = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(tcp).await.unwrap();
            let _ = closing.await;
            tokio::io::AsyncWriteExt::shutdown(&mut tls).await.unwrap(); // close_notify
            drop(tls);
        });
        let mut io = tls_connect(TcpStream::connect(addr).await.unwrap(), client).await;
        // Session tickets the origin sends after the handshake (TLS 1.3) are taken in and
        // are not input, whether they arrived yet or not.
        for _ in 0..3 {
            assert!(!without_budget(&mut io, has_input).await, "open and quiet");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        close.send(()).unwrap();
        origin.await.unwrap();
        io.tcp().readable().await.unwrap();
        assert!(
            without_budget(&mut io, has_input).await,
            "closed by the origin"
        );
    }
}
