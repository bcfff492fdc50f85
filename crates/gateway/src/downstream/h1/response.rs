//! Writing a response to an HTTP/1.1 client: the head (status line, then the origin's fields
//! in wire form or the response's map, then the framing, `Date` and `Connection` fields the
//! server owns), the body with the framing the head announced (Content-Length, chunked with
//! the trailers the client accepts, or until close for an HTTP/1.0 client), and the queue
//! that writes head, chunk lines and body frames with one vectored write where it can,
//! without copying body bytes.

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName};
use http::{StatusCode, Version};
use std::cell::RefCell;
use std::io::{self, IoSlice};
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::SystemTime;
use tokio::io::AsyncWrite;

use keymaster_http::framing::put_chunk_size;
use keymaster_http::headers::{put_field, RawHead};
use keymaster_http::io::{spare, Io};

/// How a response's body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BodyFraming {
    /// No body: HEAD, 1xx, 204, 304.
    None,
    Length(u64),
    Chunked,
    /// Until the connection closes (an HTTP/1.0 client, a length not known up front).
    Close,
}

/// What the request said that shapes its response.
pub(super) struct RequestFacts {
    pub(super) method_head: bool,
    pub(super) method_connect: bool,
    pub(super) version: Version,
    /// The client allows another request after this one.
    pub(super) keep_alive: bool,
    /// The client accepts trailer fields (`TE: trailers`).
    pub(super) accepts_trailers: bool,
}

/// The parts of a response head the server writes.
pub(super) struct Head<'a> {
    pub(super) status: StatusCode,
    /// A reason phrase other than the status's canonical one, passed on from the origin.
    pub(super) reason: Option<&'a [u8]>,
    pub(super) headers: &'a HeaderMap,
    /// The origin's fields in wire form (the map is then empty).
    pub(super) raw: Option<&'a RawHead>,
    /// The body's exact length, when known.
    pub(super) body_len: Option<u64>,
}

/// What the head promised about the rest of the response.
#[derive(Debug)]
pub(super) struct Written {
    pub(super) framing: BodyFraming,
    /// The connection may carry another request after this response.
    pub(super) keep_alive: bool,
    /// The trailer fields that may follow a chunked body (announced by `Trailer`, and the
    /// client accepts them).
    pub(super) trailers: Option<Vec<HeaderName>>,
}

/// Encode a response head into `dst`. `keep_alive`: the server would keep the connection
/// (the client allows it, no drain, the request body is read).
pub(super) fn encode_head(
    dst: &mut BytesMut,
    head: &Head<'_>,
    req: &RequestFacts,
    keep_alive: bool,
) -> Written {
    let code = head.status.as_u16();
    let no_body = head.status.is_informational() || code == 204;
    // HEAD and 304: no body, but the framing fields describe the one a GET would get.
    let described = req.method_head || code == 304;
    let framing = if no_body || described {
        BodyFraming::None
    } else if let Some(n) = head.body_len {
        BodyFraming::Length(n)
    } else if req.version == Version::HTTP_11 {
        BodyFraming::Chunked
    } else {
        BodyFraming::Close
    };
    // The response's own Content-Length is kept only where it describes a body not sent:
    // elsewhere the server writes the framing from the body.
    let keep_length_field = described && !no_body;
    let switching = code == 101;
    let closes = head.raw.is_none()
        && !switching
        && head
            .headers
            .get_all(header::CONNECTION)
            .iter()
            .any(|v| has_close(v.as_bytes()));
    let keep_alive = keep_alive
        && req.keep_alive
        && !closes
        && framing != BodyFraming::Close
        && !(req.method_connect && head.status.is_success());

    dst.reserve(64 + head.raw.map_or(head.headers.len() * 32, |r| r.block.len()));
    dst.extend_from_slice(b"HTTP/1.1 ");
    dst.extend_from_slice(head.status.as_str().as_bytes());
    dst.extend_from_slice(b" ");
    match head.reason {
        Some(r) => dst.extend_from_slice(r),
        None => dst.extend_from_slice(head.status.canonical_reason().unwrap_or("").as_bytes()),
    }
    dst.extend_from_slice(b"\r\n");
    let has_date = match head.raw {
        Some(raw) => {
            dst.extend_from_slice(&raw.block);
            raw.has_date
        }
        None => {
            let mut has_date = false;
            for (name, value) in head.headers {
                match *name {
                    header::CONTENT_LENGTH if !keep_length_field => continue,
                    header::TRANSFER_ENCODING => continue,
                    header::CONNECTION if !switching => continue,
                    header::DATE => has_date = true,
                    _ => {}
                }
                put_field(dst, name.as_str().as_bytes(), value.as_bytes());
            }
            has_date
        }
    };
    match framing {
        BodyFraming::Length(n) => {
            dst.extend_from_slice(b"content-length: ");
            dst.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            dst.extend_from_slice(b"\r\n");
        }
        BodyFraming::Chunked => dst.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        BodyFraming::None | BodyFraming::Close => {}
    }
    if !has_date {
        put_date(dst);
    }
    if !switching {
        if !keep_alive {
            dst.extend_from_slice(b"connection: close\r\n");
        } else if req.version == Version::HTTP_10 {
            dst.extend_from_slice(b"connection: keep-alive\r\n");
        }
    }
    dst.extend_from_slice(b"\r\n");
    let trailers = (framing == BodyFraming::Chunked && req.accepts_trailers && head.raw.is_none())
        .then(|| announced_trailers(head.headers))
        .flatten();
    Written {
        framing,
        keep_alive,
        trailers,
    }
}

/// The field names a `Trailer` field announces.
fn announced_trailers(headers: &HeaderMap) -> Option<Vec<HeaderName>> {
    let mut names = Vec::new();
    for v in headers.get_all(header::TRAILER) {
        for n in v.as_bytes().split(|&b| b == b',') {
            if let Ok(n) = HeaderName::from_bytes(n.trim_ascii()) {
                names.push(n);
            }
        }
    }
    (!names.is_empty()).then_some(names)
}

fn has_close(v: &[u8]) -> bool {
    v.split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
}

/// Encode the end of a chunked body: the last chunk, the trailer fields the client may get,
/// and the empty line.
pub(super) fn encode_last_chunk(
    dst: &mut BytesMut,
    trailers: Option<&HeaderMap>,
    allowed: Option<&[HeaderName]>,
) {
    dst.extend_from_slice(b"0\r\n");
    if let (Some(fields), Some(allowed)) = (trailers, allowed) {
        for (name, value) in fields {
            if allowed.contains(name) {
                put_field(dst, name.as_str().as_bytes(), value.as_bytes());
            }
        }
    }
    dst.extend_from_slice(b"\r\n");
}

/// A `100 Continue` interim response.
pub(super) const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

thread_local! {
    /// This worker's `Date` value and the second it is for (formatted once a second).
    static DATE: RefCell<(u64, [u8; 29])> = const { RefCell::new((u64::MAX, [0; 29])) };
}

/// Append `date: <now>` (RFC 9110 §6.6.1: an origin server with a clock sends one; so does
/// nginx as a proxy when the origin did not).
fn put_date(dst: &mut BytesMut) {
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with_borrow_mut(|(at, value)| {
        if *at != secs {
            let text = httpdate::fmt_http_date(now);
            if text.len() == value.len() {
                value.copy_from_slice(text.as_bytes());
                *at = secs;
            }
        }
        put_field(dst, b"date", &value[..]);
    });
}

/// The most body frames queued for one write.
const GATHER_FRAMES: usize = 4;
/// A body frame is added to those queued only while fewer bytes than this wait.
const GATHER_BYTES: usize = 32 * 1024;

/// Bytes waiting to be written, in order: `head` (a status line and fields, chunk-size
/// lines, a last chunk) from `head_at` on, then the body frames in `data` (never copied),
/// then `tail` (the CRLF that ends a chunk, and possibly the last chunk).
///
/// Frames of a body that needs no framing between them (a length, or until close) gather:
/// while the client's socket takes everything, up to [`GATHER_FRAMES`] frames and about
/// [`GATHER_BYTES`] go out in one vectored write, as an origin's response read in two or
/// three pieces usually is. On loopback and fast links each write to a socket costs about
/// as much as reading one, so the writes per response set much of the CPU it costs. A
/// chunked body writes one frame at a time (each needs its size line).
#[derive(Default)]
pub(super) struct Outbox {
    pub(super) head: BytesMut,
    head_at: usize,
    /// The frames in `data[first..frames]` are queued; those before `first` are written,
    /// and the slots from `frames` on hold `Bytes::new()`, which owns nothing (so a
    /// request's outbox releases only the frames it used when it is dropped).
    data: ManuallyDrop<[Bytes; GATHER_FRAMES]>,
    first: usize,
    frames: usize,
    tail: &'static [u8],
    /// A write could not take everything queued: no frame joins until it is all out, so a
    /// slow client holds at most one frame more than it can take.
    blocked: bool,
    /// Bytes were written and the transport's flush has not completed since: a TLS
    /// session may still hold them as ciphertext (its socket was full).
    unflushed: bool,
}

impl Drop for Outbox {
    /// Releases the frames it still holds, and gives the head's buffer back to the worker
    /// when nothing queued is left in it (a response written whole; one cut short drops
    /// its buffer).
    fn drop(&mut self) {
        if self.is_idle() {
            spare::SMALL.give(std::mem::take(&mut self.head));
        }
        // The slots from `frames` on own nothing: dropping all of them took an indirect
        // call each, on every request.
        for frame in &mut self.data[..self.frames] {
            *frame = Bytes::new();
        }
    }
}

impl Outbox {
    pub(super) fn is_empty(&self) -> bool {
        self.head_at == self.head.len() && self.first == self.frames && self.tail.is_empty()
    }

    /// Nothing queued and nothing written is waiting in the transport.
    pub(super) fn is_idle(&self) -> bool {
        self.is_empty() && !self.unflushed
    }

    fn data_len(&self) -> usize {
        self.data[self.first..self.frames]
            .iter()
            .map(Bytes::len)
            .sum()
    }

    /// Bytes queued and not yet written.
    pub(super) fn len(&self) -> usize {
        self.head.len() - self.head_at + self.data_len() + self.tail.len()
    }

    /// Whether a body frame may be queued: none is, or the ones queued may gather more.
    pub(super) fn has_room(&self) -> bool {
        if self.first == self.frames {
            return self.tail.is_empty();
        }
        self.tail.is_empty()
            && !self.blocked
            && self.frames < GATHER_FRAMES
            && self.data_len() < GATHER_BYTES
    }

    /// Queue a body frame with its framing (`data` must not be empty; see [`Self::has_room`]).
    pub(super) fn push_data(&mut self, framing: BodyFraming, data: Bytes, last: bool) {
        if framing == BodyFraming::Chunked {
            put_chunk_size(&mut self.head, data.len());
            self.tail = if last { b"\r\n0\r\n\r\n" } else { b"\r\n" };
        }
        self.data[self.frames] = data;
        self.frames += 1;
    }

    /// Write until everything queued is out, then flush the transport: a TLS session may
    /// accept bytes while its socket is full and keep them as ciphertext until flushed
    /// (a no-op on a plain socket). A flush left pending is finished by the next call, even
    /// with nothing more queued.
    pub(super) fn poll_flush(&mut self, io: &mut Io, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.is_empty() {
            let mut slices = [IoSlice::new(&[]); GATHER_FRAMES + 2];
            let mut n = 0;
            for part in std::iter::once(&self.head[self.head_at..])
                .chain(self.data[self.first..self.frames].iter().map(|d| &d[..]))
                .chain(std::iter::once(self.tail))
                .filter(|p| !p.is_empty())
            {
                slices[n] = IoSlice::new(part);
                n += 1;
            }
            let n = match Pin::new(&mut *io).poll_write_vectored(cx, &slices[..n]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    self.blocked = true;
                    return Poll::Pending;
                }
            };
            self.consume(n);
            self.unflushed = true;
        }
        self.blocked = false;
        ready!(Pin::new(io).poll_flush(cx))?;
        self.unflushed = false;
        Poll::Ready(Ok(()))
    }

    fn consume(&mut self, mut n: usize) {
        let head = (self.head.len() - self.head_at).min(n);
        self.head_at += head;
        n -= head;
        if self.head_at == self.head.len() {
            // Written whole: the buffer is reused for the next head or chunk line.
            self.head.clear();
            self.head_at = 0;
        }
        while n > 0 && self.first < self.frames {
            let frame = &mut self.data[self.first];
            let taken = frame.len().min(n);
            frame.advance(taken);
            n -= taken;
            if frame.is_empty() {
                self.first += 1;
            }
        }
        if self.first == self.frames {
            // Every frame written: their buffers are released now, not at the next frame.
            for frame in &mut self.data[..self.frames] {
                *frame = Bytes::new();
            }
            self.first = 0;
            self.frames = 0;
        }
        self.tail = &self.tail[n.min(self.tail.len())..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn facts(version: Version) -> RequestFacts {
        RequestFacts {
            method_head: false,
            method_connect: false,
            version,
            keep_alive: true,
            accepts_trailers: false,
        }
    }

    fn encode(head: &Head<'_>, req: &RequestFacts) -> (String, Written) {
        let mut b = BytesMut::new();
        let w = encode_head(&mut b, head, req, true);
        (String::from_utf8(b.to_vec()).unwrap(), w)
    }

    fn map(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (n, v) in fields {
            m.append(*n, HeaderValue::from_static(v));
        }
        m
    }

    #[test]
    fn framing_follows_the_body_and_the_client() {
        let h = map(&[
            ("x-a", "1"),
            ("content-length", "99"),
            ("transfer-encoding", "x"),
        ]);
        let head = |body_len| Head {
            status: StatusCode::OK,
            reason: None,
            headers: &h,
            raw: None,
            body_len,
        };
        let (text, w) = encode(&head(Some(5)), &facts(Version::HTTP_11));
        assert!(text.starts_with("HTTP/1.1 200 OK\r\nx-a: 1\r\ncontent-length: 5\r\ndate: "));
        assert!(text.ends_with(" GMT\r\n\r\n"), "{text}");
        assert_eq!((w.framing, w.keep_alive), (BodyFraming::Length(5), true));
        let (text, w) = encode(&head(None), &facts(Version::HTTP_11));
        assert!(text.contains("\r\ntransfer-encoding: chunked\r\n"));
        assert!(!text.contains("99") && !text.contains(": x\r\n"));
        assert_eq!(w.framing, BodyFraming::Chunked);
        // HTTP/1.0 without a length: until close.
        let (text, w) = encode(&head(None), &facts(Version::HTTP_10));
        assert!(text.contains("\r\nconnection: close\r\n"));
        assert_eq!((w.framing, w.keep_alive), (BodyFraming::Close, false));
        let (text, _) = encode(&head(Some(5)), &facts(Version::HTTP_10));
        assert!(text.contains("\r\nconnection: keep-alive\r\n"));
    }

    #[test]
    fn bodyless_responses_keep_or_drop_their_length_field() {
        let h = map(&[("content-length", "99"), ("date", "x")]);
        let mut req = facts(Version::HTTP_11);
        req.method_head = true;
        let head = Head {
            status: StatusCode::OK,
            reason: None,
            headers: &h,
            raw: None,
            body_len: Some(0),
        };
        let (text, w) = encode(&head, &req);
        assert_eq!(
            text,
            "HTTP/1.1 200 OK\r\ncontent-length: 99\r\ndate: x\r\n\r\n"
        );
        assert_eq!(w.framing, BodyFraming::None);
        let head = Head {
            status: StatusCode::NO_CONTENT,
            ..head
        };
        let (text, _) = encode(&head, &facts(Version::HTTP_11));
        assert_eq!(text, "HTTP/1.1 204 No Content\r\ndate: x\r\n\r\n");
    }

    #[test]
    fn connection_close_in_the_response_closes() {
        let h = map(&[("connection", "close"), ("date", "x")]);
        let head = Head {
            status: StatusCode::BAD_REQUEST,
            reason: Some(b"Nope"),
            headers: &h,
            raw: None,
            body_len: Some(0),
        };
        let (text, w) = encode(&head, &facts(Version::HTTP_11));
        assert_eq!(
            text,
            "HTTP/1.1 400 Nope\r\ndate: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        );
        assert!(!w.keep_alive);
    }

    #[test]
    fn a_wire_form_head_is_written_as_it_is() {
        let raw = RawHead {
            block: BytesMut::from(&b"Server: o\r\nDate: d\r\n"[..]),
            has_date: true,
            has_request_id: false,
            content_length: Some(3),
        };
        let h = HeaderMap::new();
        let head = Head {
            status: StatusCode::OK,
            reason: None,
            headers: &h,
            raw: Some(&raw),
            body_len: Some(3),
        };
        let (text, _) = encode(&head, &facts(Version::HTTP_11));
        assert_eq!(
            text,
            "HTTP/1.1 200 OK\r\nServer: o\r\nDate: d\r\ncontent-length: 3\r\n\r\n"
        );
    }

    #[test]
    fn trailers_only_when_announced_and_accepted() {
        let h = map(&[("trailer", "x-sum, x-other"), ("date", "x")]);
        let mut req = facts(Version::HTTP_11);
        req.accepts_trailers = true;
        let head = Head {
            status: StatusCode::OK,
            reason: None,
            headers: &h,
            raw: None,
            body_len: None,
        };
        let (_, w) = encode(&head, &req);
        let allowed = w.trailers.expect("announced");
        let t = map(&[("x-sum", "1"), ("x-secret", "2")]);
        let mut b = BytesMut::new();
        encode_last_chunk(&mut b, Some(&t), Some(&allowed));
        assert_eq!(&b[..], b"0\r\nx-sum: 1\r\n\r\n");
        let (_, w) = encode(&head, &facts(Version::HTTP_11));
        assert!(w.trailers.is_none(), "the client did not ask for trailers");
    }

    #[test]
    fn frames_of_a_length_delimited_body_gather_until_a_write_blocks() {
        let mut o = Outbox::default();
        o.head.extend_from_slice(b"HEAD\r\n");
        let frame = |n: usize| Bytes::from(vec![b'x'; n]);
        o.push_data(BodyFraming::Length(100_000), frame(10), false);
        assert!(o.has_room(), "a second frame may join the first");
        o.push_data(BodyFraming::Length(100_000), frame(GATHER_BYTES), false);
        assert!(!o.has_room(), "enough bytes wait for one write");
        assert_eq!(o.len(), 6 + 10 + GATHER_BYTES);
        // A write that stops inside the second frame: nothing joins until all is out.
        o.consume(6 + 10 + 5);
        o.blocked = true;
        assert!(!o.has_room());
        assert_eq!(o.data_len(), GATHER_BYTES - 5);
        o.consume(GATHER_BYTES - 5);
        assert!(o.is_empty() && o.has_room());
        assert!(
            o.data.iter().all(Bytes::is_empty),
            "written frames are released"
        );
        // At most GATHER_FRAMES small frames.
        o.blocked = false;
        for _ in 0..GATHER_FRAMES {
            assert!(o.has_room());
            o.push_data(BodyFraming::Close, frame(1), false);
        }
        assert!(!o.has_room());
        assert_eq!(o.len(), GATHER_FRAMES);
    }

    #[test]
    fn a_dropped_outbox_releases_the_frames_it_holds() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        struct Counted(Arc<AtomicUsize>, Vec<u8>);
        impl AsRef<[u8]> for Counted {
            fn as_ref(&self) -> &[u8] {
                &self.1
            }
        }
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let released = Arc::new(AtomicUsize::new(0));
        let frame = || Bytes::from_owner(Counted(released.clone(), vec![b'x'; 10]));
        let mut o = Outbox::default();
        for _ in 0..3 {
            o.push_data(BodyFraming::Length(100), frame(), false);
        }
        // The first frame written and a part of the second: all three are still held.
        o.consume(15);
        assert_eq!(released.load(Ordering::Relaxed), 0);
        drop(o);
        assert_eq!(released.load(Ordering::Relaxed), 3, "every frame released");
    }

    #[test]
    fn the_outbox_writes_chunks_around_frames() {
        let mut o = Outbox::default();
        o.head.extend_from_slice(b"HEAD\r\n");
        o.push_data(BodyFraming::Chunked, Bytes::from_static(b"hello"), false);
        assert!(!o.has_room());
        // A partial write stops inside the data ("HEAD\r\n" and "5\r\n" are 9 bytes); the
        // rest follows in order.
        o.consume(11);
        assert_eq!(&o.data[0][..], b"llo");
        o.consume(5);
        assert!(o.is_empty() && o.has_room());
        o.push_data(BodyFraming::Chunked, Bytes::from_static(b"ab"), true);
        assert_eq!(&o.head[..], b"2\r\n");
        assert_eq!(o.tail, b"\r\n0\r\n\r\n");
    }
}
