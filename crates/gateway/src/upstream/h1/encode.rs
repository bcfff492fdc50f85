//! Writing a request to an origin over HTTP/1.1: the head in one buffer, then the body as
//! it arrives from the client (Content-Length bodies as they are, others chunked), with
//! backpressure: the next frame is pulled only once the last one is written.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{self, HeaderName};
use http::{Method, Request};
use http_body::Body;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::AsyncWrite;

use crate::body::RequestBody;
use keymaster_http::error::BoxError;
use keymaster_http::headers::{put_field, AddedFields};
use keymaster_http::io::Io;

/// Small buffered bodies go out in the same write as the head.
const COALESCE: usize = 16 * 1024;

/// How the request body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyFraming {
    /// Nothing follows the head (or the body is already in the head's buffer).
    None,
    /// Exactly the data frames, as the Content-Length field says.
    Raw,
    Chunked,
}

/// Serialise the request head into `dst` and decide the body's framing. The target is the
/// request's origin-form as it is (no normalisation); header names from the map go out
/// lower-case, fields kept in wire form (`added`) as the client sent them.
///
/// The framing is the gateway's, taken from the body it sends: a length it knows (a
/// buffered body's, or the one the client's framing declared, which the body's decoder
/// holds it to), else chunked. A Content-Length or Transfer-Encoding in the map is never
/// sent as it is, whoever put it there (the client, a filter, a configured edit), so the
/// origin always reads exactly the body that is written: a field that disagreed with it
/// would end the body early, leaving the rest to be read as another request, or make the
/// origin wait for bytes that never come. Fields kept in wire form keep the client's own
/// Content-Length (`added`): the server framed the body by it, and no edit changes it there.
fn encode_head<B>(
    req: &Request<B>,
    body: &RequestBody,
    added: Option<&AddedFields>,
    dst: &mut Vec<u8>,
) -> BodyFraming {
    let (framing, length) = match body {
        RequestBody::Empty | RequestBody::Buffered(None) => (BodyFraming::None, None),
        RequestBody::Buffered(Some(b)) => (BodyFraming::Raw, Some(b.len() as u64)),
        RequestBody::Stream { .. } => match body.size_hint().exact() {
            Some(n) => (BodyFraming::Raw, Some(n)),
            None => (BodyFraming::Chunked, None),
        },
    };
    dst.extend_from_slice(req.method().as_str().as_bytes());
    dst.push(b' ');
    match req.uri().path_and_query() {
        Some(pq) => dst.extend_from_slice(pq.as_str().as_bytes()),
        None => match req.uri().authority() {
            Some(a) if req.method() == Method::CONNECT => {
                dst.extend_from_slice(a.as_str().as_bytes())
            }
            _ => dst.push(b'/'),
        },
    }
    dst.extend_from_slice(b" HTTP/1.1\r\n");
    // Whether the request had a Content-Length field (kept when there is no body: as 0).
    let mut had_length = false;
    for (name, value) in req.headers() {
        if *name == header::CONTENT_LENGTH || *name == header::TRANSFER_ENCODING {
            had_length |= *name == header::CONTENT_LENGTH;
            continue;
        }
        put_field(dst, name.as_str().as_bytes(), value.as_bytes());
    }
    let client_length = added.is_some_and(AddedFields::declares_length);
    if let Some(a) = added {
        a.write(dst);
    }
    match (framing, length) {
        (BodyFraming::Chunked, _) => {
            debug_assert!(!client_length, "a body framed by a length has its size");
            dst.extend_from_slice(b"transfer-encoding: chunked\r\n");
        }
        _ if client_length => {} // the client's own, in the block
        (BodyFraming::Raw, Some(n)) => {
            dst.extend_from_slice(format!("content-length: {n}\r\n").as_bytes())
        }
        (BodyFraming::None, _) if had_length => dst.extend_from_slice(b"content-length: 0\r\n"),
        _ => {}
    }
    dst.extend_from_slice(b"\r\n");
    framing
}

/// A failure while writing the request.
pub(super) enum PumpError {
    /// Writing to the origin failed.
    Write(io::Error),
    /// The client's body failed (went away, broke framing, or passed the route's cap).
    Body(BoxError),
}

/// The request on its way out: the head, then the body's frames.
pub(super) struct Pump {
    /// The head (and a small buffered body), written from `head_at` on.
    head: Vec<u8>,
    head_at: usize,
    /// A body frame being written.
    out: Bytes,
    body: RequestBody,
    framing: BodyFraming,
    /// Trailer fields the request announced (`Trailer`), the only ones sent (like hyper).
    trailers_allowed: Vec<HeaderName>,
    /// Bytes of the request written so far.
    pub(super) written: u64,
    done: bool,
}

impl Pump {
    /// Start a request: the head (with a small buffered body) is the first write.
    /// `req`: the request's head (its body is `body`).
    pub(super) fn new<B>(req: &Request<B>, body: RequestBody, added: Option<&AddedFields>) -> Pump {
        // A small buffered body goes out with the head: its length, if it does.
        let coalesced = match &body {
            RequestBody::Buffered(Some(b)) if b.len() <= COALESCE => Some(b.len()),
            _ => None,
        };
        // Room for the whole first write, so that it is usually made without growing: the
        // request line, the map's fields, the fields in wire form with those keymaster adds
        // (the map is then empty), and a small buffered body.
        let added_len = added.map_or(0, AddedFields::len_hint);
        let room = 192 + req.headers().len() * 40 + added_len + coalesced.unwrap_or(0);
        let mut head = Vec::with_capacity(room);
        let framing = encode_head(req, &body, added, &mut head);
        let mut body = body;
        if let (Some(_), RequestBody::Buffered(b)) = (coalesced, &mut body) {
            head.extend_from_slice(b.take().as_deref().unwrap_or_default());
        }
        let trailers_allowed = if framing == BodyFraming::Chunked {
            req.headers()
                .get_all(header::TRAILER)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|s| s.split(','))
                .filter_map(|s| HeaderName::from_bytes(s.trim().as_bytes()).ok())
                .collect()
        } else {
            Vec::new()
        };
        Pump {
            head,
            head_at: 0,
            out: Bytes::new(),
            done: body.is_end_stream() && framing != BodyFraming::Chunked,
            body,
            framing,
            trailers_allowed,
            written: 0,
        }
    }

    /// The body back, if none of it was taken yet (for a request never written).
    pub(super) fn into_body(self) -> RequestBody {
        self.body
    }

    /// Write what is pending and pull the body's frames until it is all written.
    pub(super) fn poll(
        &mut self,
        io: &mut Io,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), PumpError>> {
        while self.head_at < self.head.len() {
            let n = ready!(Pin::new(&mut *io).poll_write(cx, &self.head[self.head_at..]))
                .map_err(PumpError::Write)?;
            if n == 0 {
                return Poll::Ready(Err(PumpError::Write(io::ErrorKind::WriteZero.into())));
            }
            self.head_at += n;
            self.written += n as u64;
            if self.head_at == self.head.len() {
                self.head = Vec::new(); // nothing of it is needed while the body streams
                self.head_at = 0;
            }
        }
        loop {
            while !self.out.is_empty() {
                let n = ready!(Pin::new(&mut *io).poll_write(cx, &self.out))
                    .map_err(PumpError::Write)?;
                if n == 0 {
                    return Poll::Ready(Err(PumpError::Write(io::ErrorKind::WriteZero.into())));
                }
                self.out.advance(n);
                self.written += n as u64;
            }
            if self.done {
                ready!(Pin::new(&mut *io).poll_flush(cx)).map_err(PumpError::Write)?;
                return Poll::Ready(Ok(()));
            }
            let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) else {
                // The body waits on the client: what a TLS session took in while the socket
                // was full goes out now, not with the body's next frame.
                ready!(Pin::new(&mut *io).poll_flush(cx)).map_err(PumpError::Write)?;
                return Poll::Pending;
            };
            match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if data.is_empty() => {}
                    Ok(data) => {
                        self.out = match self.framing {
                            BodyFraming::Chunked => chunk(&data),
                            _ => data,
                        };
                        if self.framing == BodyFraming::Raw && self.body.is_end_stream() {
                            self.done = true;
                        }
                    }
                    Err(frame) => {
                        if let (Ok(t), BodyFraming::Chunked) = (frame.into_trailers(), self.framing)
                        {
                            self.out = self.last_chunk(Some(&t));
                            self.done = true;
                        }
                    }
                },
                Some(Err(e)) => return Poll::Ready(Err(PumpError::Body(e))),
                None => {
                    if self.framing == BodyFraming::Chunked {
                        self.out = self.last_chunk(None);
                    }
                    self.done = true;
                }
            }
        }
    }

    /// `0\r\n`, the allowed trailer fields, `\r\n`.
    fn last_chunk(&self, trailers: Option<&http::HeaderMap>) -> Bytes {
        let mut b = BytesMut::with_capacity(64);
        b.put_slice(b"0\r\n");
        for (name, value) in trailers.into_iter().flatten() {
            if self.trailers_allowed.contains(name) {
                put_field(&mut b, name.as_str().as_bytes(), value.as_bytes());
            }
        }
        b.put_slice(b"\r\n");
        b.freeze()
    }
}

/// One chunk: size line, data, CRLF.
fn chunk(data: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(data.len() + 20);
    b.put_slice(format!("{:x}\r\n", data.len()).as_bytes());
    b.put_slice(data);
    b.put_slice(b"\r\n");
    b.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn head_of(req: Request<()>, body: &RequestBody) -> (String, BodyFraming) {
        let mut dst = Vec::new();
        let f = encode_head(&req, body, None, &mut dst);
        (String::from_utf8(dst).unwrap(), f)
    }

    #[test]
    fn head_is_verbatim_target_and_lower_case_fields() {
        let req = Request::get("/a%2Fb?x=1&y")
            .header("Host", "example")
            .header("X-Thing", "v")
            .body(())
            .unwrap();
        let (head, f) = head_of(req, &RequestBody::Empty);
        assert_eq!(
            head,
            "GET /a%2Fb?x=1&y HTTP/1.1\r\nhost: example\r\nx-thing: v\r\n\r\n"
        );
        assert_eq!(f, BodyFraming::None);
    }

    #[test]
    fn buffered_bodies_carry_their_own_length() {
        let req = Request::post("/")
            .header("content-length", "99")
            .header("transfer-encoding", "chunked")
            .body(())
            .unwrap();
        let body = RequestBody::Buffered(Some(Bytes::from_static(b"hello")));
        let (head, f) = head_of(req, &body);
        assert_eq!(head, "POST / HTTP/1.1\r\ncontent-length: 5\r\n\r\n");
        assert_eq!(f, BodyFraming::Raw);
    }

    /// No body: a Content-Length the map holds (the client's 0, or any value a filter set)
    /// goes out as 0, and a Transfer-Encoding not at all.
    #[test]
    fn a_bodyless_request_declares_no_length_but_zero() {
        for (cl, te) in [
            (Some("0"), None),
            (Some("5"), None),
            (None, Some("chunked")),
        ] {
            let mut req = Request::post("/");
            if let Some(v) = cl {
                req = req.header("content-length", v);
            }
            if let Some(v) = te {
                req = req.header("transfer-encoding", v);
            }
            let (head, f) = head_of(req.body(()).unwrap(), &RequestBody::Empty);
            let expect = match cl {
                Some(_) => "POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n",
                None => "POST / HTTP/1.1\r\n\r\n",
            };
            assert_eq!(head, expect, "{cl:?} {te:?}");
            assert_eq!(f, BodyFraming::None);
        }
    }

    #[test]
    fn chunks_are_framed() {
        assert_eq!(
            &chunk(b"hello world, this!")[..],
            b"12\r\nhello world, this!\r\n"
        );
    }
}

/// The pump over a real TLS session whose socket fills: a slow origin behind small socket
/// buffers, and a client body that sends one frame and then waits.
#[cfg(test)]
mod tls_tests {
    use super::*;
    use crate::body::{ClientBody, ConnBody, H1Body};
    use http_body::Frame;
    use keymaster_http::error::Error;
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::time::Duration;
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpSocket};

    /// One frame, then nothing more for as long as the test runs.
    struct OneFrameThenWait(Option<Bytes>);

    impl ConnBody for OneFrameThenWait {
        fn poll_body(&mut self, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
            match self.0.take() {
                Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                None => Poll::Pending,
            }
        }
        fn body_done(&self) -> bool {
            false
        }
        fn body_remaining(&self) -> Option<u64> {
            None
        }
        fn body_refused(&self) -> Option<Error> {
            None
        }
    }

    /// The last bytes of the frame are taken in by the TLS session while the socket is full;
    /// then the body waits. They must reach the origin as the socket drains, without the
    /// body's next frame to push them.
    #[tokio::test]
    async fn bytes_a_tls_session_holds_go_out_while_the_body_waits() {
        let (server, client) = super::super::tests::tls_configs();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let n = 256 * 1024;
        let origin = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            socket2::SockRef::from(&tcp)
                .set_recv_buffer_size(4096)
                .unwrap();
            let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(server));
            let mut tls = acceptor.accept(tcp).await.unwrap();
            // A slow reader: the gateway's socket stays full while it writes.
            let (mut got, mut buf) = (0, [0u8; 2048]);
            while got < n {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let k = tls.read(&mut buf).await.unwrap();
                assert!(k > 0, "closed early");
                got += buf[..k].iter().filter(|&&b| b == b'z').count();
            }
        });
        let tcp = TcpSocket::new_v4().unwrap();
        tcp.set_send_buffer_size(4096).unwrap(); // no autotuning: a small, fixed buffer
        let mut io =
            super::super::tests::tls_connect(tcp.connect(addr).await.unwrap(), client).await;
        let data = Bytes::from(vec![b'z'; n]);
        let conn: Rc<RefCell<dyn ConnBody>> = Rc::new(RefCell::new(OneFrameThenWait(Some(data))));
        let (body, _) = RequestBody::stream(
            ClientBody::H1(H1Body(conn)),
            u64::MAX,
            Duration::from_secs(60),
        );
        let req = http::Request::post("/").body(()).unwrap();
        let mut pump = Pump::new(&req, body, None);
        let pumping = std::future::poll_fn(|cx| pump.poll(&mut io, cx));
        tokio::select! {
            r = pumping => panic!("the pump ended with its body still open: {:?}", r.is_ok()),
            r = tokio::time::timeout(Duration::from_secs(5), origin) => {
                r.expect("the origin got the whole frame").unwrap();
            }
        }
    }
}
