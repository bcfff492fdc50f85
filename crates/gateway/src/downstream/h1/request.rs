//! A client's HTTP/1.1 request: the head, parsed from the connection's read buffer with
//! exact limits and strict framing, and the body, decoded from the same buffer as the proxy
//! stage pulls it.
//!
//! Rules kept strict because an edge gateway must never forward an ambiguous message (RFC
//! 9112 §6.3, §11.2): both Transfer-Encoding and Content-Length, differing or invalid
//! Content-Length, a Transfer-Encoding not ending in `chunked` or on HTTP/1.0, obs-fold, bare
//! CR, NUL and other control characters, invalid methods and versions are all refused
//! (400, and the connection closes); a malformed request line as soon as it is in, before the
//! rest of the head. A request line longer than the listener allows is a 414; a head over
//! its size or field count a 431. Host rules and the exact header-size limit are the proxy
//! stage's (`headers::validate_request_head`, shared with HTTP/2).

use bytes::{Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, Uri, Version};
use http_body::Frame;
use std::mem::MaybeUninit;
use std::task::{ready, Context, Poll};

use super::ConnIo;
use keymaster_http::error::{Error, Kind};
use keymaster_http::framing::{self, Declared, Decoder, FramingError, Step};
use keymaster_http::headers::{
    ClientLength, HeadFacts, HeadLimits, NameSummary, RawRequestFields, WireHead,
};

/// Header fields parsed on the stack; a listener allowing more parses into a heap slice.
const STACK_FIELDS: usize = 128;

/// A request head, and what it says about the connection.
pub(super) struct Head {
    pub(super) method: Method,
    pub(super) uri: Uri,
    pub(super) version: Version,
    /// The fields as a map: empty when they are kept in wire form (`wire`).
    pub(super) headers: HeaderMap,
    /// The fields in wire form (every line ended in CRLF), and what the parse noted.
    /// Boxed: the head moves from the parse to the proxy stage, a pointer at a time.
    pub(super) wire: Option<Box<WireHead>>,
    /// The body's decoder (done at once for a request without a body).
    pub(super) body: Decoder,
    /// The client allows another request on the connection after this one.
    pub(super) keep_alive: bool,
    /// `Expect: 100-continue`: the client waits for a `100 Continue` before its body.
    pub(super) expect_continue: bool,
    /// `TE: trailers`: the client accepts trailer fields in a chunked response.
    pub(super) accepts_trailers: bool,
    /// The chunked body that came with the head is malformed: the proxy stage refuses the
    /// request before any origin hears of it (see [`super::ConnIo`]).
    pub(super) body_refused: Option<FramingError>,
}

/// Where the search for the end of a head stopped, so bytes trickling in are scanned once.
#[derive(Default)]
pub(super) struct HeadScan {
    scanned: usize,
    /// The request line of the incomplete head at the front was found well formed.
    line_checked: bool,
}

impl HeadScan {
    /// The length of the head at the front of `buf` (through its empty line), if it is all
    /// there. Lines may end in CRLF or LF, and empty lines before the request line are
    /// skipped (RFC 9112 §2.2).
    fn end(&mut self, buf: &[u8]) -> Option<usize> {
        let start = buf.iter().position(|&b| b != b'\r' && b != b'\n')?;
        let mut from = self.scanned.max(start);
        while let Some(i) = memchr::memchr(b'\n', &buf[from..]) {
            let lf = from + i;
            match &buf[lf + 1..] {
                [b'\n', ..] => return Some(self.found(lf + 2)),
                [b'\r', b'\n', ..] => return Some(self.found(lf + 3)),
                // The next bytes decide: look at this line end again then.
                [] | [b'\r'] => {
                    self.scanned = lf;
                    return None;
                }
                _ => from = lf + 1,
            }
        }
        self.scanned = buf.len();
        None
    }

    /// A head of `len` bytes was found (and will be taken off the buffer's front).
    fn found(&mut self, len: usize) -> usize {
        self.scanned = 0;
        self.line_checked = false;
        len
    }

    /// While the head is incomplete: once its request line is, check it, so that a
    /// malformed one (not HTTP, a bad method or target, an unknown version) is refused at
    /// once rather than after the rest of the head or the header-read timeout.
    fn check_request_line(&mut self, buf: &[u8]) -> Result<(), Error> {
        if self.line_checked {
            return Ok(());
        }
        let Some(start) = buf.iter().position(|&b| b != b'\r' && b != b'\n') else {
            return Ok(());
        };
        let Some(lf) = memchr::memchr(b'\n', &buf[start..]) else {
            return Ok(());
        };
        // The request line alone: fields would follow, so a good line parses as partial.
        match httparse::Request::new(&mut []).parse(&buf[start..=start + lf]) {
            Ok(_) => {
                self.line_checked = true;
                Ok(())
            }
            Err(e) => Err(head_error(e)),
        }
    }
}

/// What a request head httparse refused gets: 431 for too many fields, else 400.
fn head_error(e: httparse::Error) -> Error {
    let bad = |detail| Error::new(Kind::BadRequest, detail);
    match e {
        httparse::Error::TooManyHeaders => {
            Error::new(Kind::HeadersTooLarge, "too many request header fields")
        }
        httparse::Error::Version => bad("unsupported HTTP version"),
        httparse::Error::Token => bad("invalid method or request target"),
        _ => bad("malformed request head"),
    }
}

/// The length of the complete head at the front of `buf` (through its empty line), if it
/// is all there; an error where what is there already cannot become a head within the
/// listener's limits (a request line too long or malformed, a head too large).
pub(super) fn head_end(
    buf: &[u8],
    scan: &mut HeadScan,
    limits: &HeadLimits,
) -> Result<Option<usize>, Error> {
    if let Some(end) = scan.end(buf) {
        return Ok(Some(end));
    }
    let line_end = memchr::memchr(b'\n', buf).unwrap_or(buf.len());
    if line_end > limits.max_request_line + 1 {
        return Err(Error::new(Kind::UriTooLong, "request line too long"));
    }
    if buf.len() > limits.max_head() {
        return Err(Error::new(
            Kind::HeadersTooLarge,
            "request header fields too large",
        ));
    }
    scan.check_request_line(buf)?;
    Ok(None)
}

/// Take the complete head of `end` bytes (as [`head_end`] found it) off the front of `buf`
/// and parse it.
pub(super) fn take_head(
    buf: &mut BytesMut,
    end: usize,
    limits: &HeadLimits,
    request_id: &HeaderName,
) -> Result<Head, Error> {
    let head = buf.split_to(end).freeze();
    let mut stack = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; STACK_FIELDS];
    let mut heap = Vec::new();
    let fields = if limits.max_headers <= STACK_FIELDS {
        &mut stack[..limits.max_headers]
    } else {
        heap.resize_with(limits.max_headers, MaybeUninit::uninit);
        &mut heap[..]
    };
    let mut parsed = parse_complete(&head, fields, limits, request_id)?;
    // A chunked body that came with its head is decoded (in place) before the head goes
    // anywhere: broken framing is noted here, and the proxy stage refuses the request (a
    // 400, counted and logged like any) before any origin hears of it. A body still to come
    // streams, and is checked as it does.
    if matches!(parsed.body, Decoder::Chunked(_)) && !buf.is_empty() {
        parsed.body_refused = parsed.body.check(buf).err();
    }
    Ok(parsed)
}

/// Parse a request head from the front of `buf`, consuming it. `Ok(None)`: more bytes are
/// needed. ([`head_end`] and [`take_head`] in one, as the tests drive them.)
#[cfg(test)]
pub(super) fn parse_head(
    buf: &mut BytesMut,
    scan: &mut HeadScan,
    limits: &HeadLimits,
    request_id: &HeaderName,
) -> Result<Option<Head>, Error> {
    match head_end(buf, scan, limits)? {
        Some(end) => take_head(buf, end, limits, request_id).map(Some),
        None => Ok(None),
    }
}

/// Parse a complete head (`head` ends with its empty line) with room for `fields.len()`
/// fields. Header values and the target are slices of `head`.
fn parse_complete<'h>(
    head: &'h Bytes,
    fields: &mut [MaybeUninit<httparse::Header<'h>>],
    limits: &HeadLimits,
    request_id: &HeaderName,
) -> Result<Head, Error> {
    let bad = |detail| Error::new(Kind::BadRequest, detail);
    let mut req = httparse::Request::new(&mut []);
    match req.parse_with_uninit_headers(head, fields) {
        Ok(httparse::Status::Complete(_)) => {}
        // The head ends in an empty line, so nothing is missing: it is malformed.
        Ok(httparse::Status::Partial) => return Err(bad("malformed request head")),
        Err(e) => return Err(head_error(e)),
    }
    let (Some(method), Some(path), Some(minor)) = (req.method, req.path, req.version) else {
        return Err(bad("malformed request line"));
    };
    // The request line as sent (after any empty lines before it), without its line end.
    let line = &head[method.as_ptr() as usize - head.as_ptr() as usize..];
    let line = &line[..memchr::memchr(b'\n', line).unwrap_or(line.len())];
    if line.strip_suffix(b"\r").unwrap_or(line).len() > limits.max_request_line {
        return Err(Error::new(Kind::UriTooLong, "request line too long"));
    }
    let method = Method::from_bytes(method.as_bytes()).map_err(|_| bad("invalid method"))?;
    let version = if minor == 1 {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    let uri = Uri::from_maybe_shared(head.slice_ref(path.as_bytes()))
        .map_err(|_| bad("invalid request target"))?;
    // The fields stay in wire form when every line ends in CRLF (the usual head): the proxy
    // stage builds a map only if it needs one. A head with bare-LF line ends is normalised
    // through the map, so an origin never sees them.
    let wire = memchr::memchr_iter(b'\n', head).all(|i| i > 0 && head[i - 1] == b'\r');
    let mut headers = HeaderMap::new();
    if !wire {
        headers.reserve(req.headers.len());
    }
    let mut facts = HeadFacts::default();
    let mut names = NameSummary::default();
    let mut transfer_encoding = None;
    let mut content_lengths: [&[u8]; 4] = [b""; 4];
    let mut n_content_lengths = 0;
    let (mut close, mut keep_alive_token) = (false, false);
    // A Connection token other than `close` and `keep-alive`: a field name, or `upgrade`.
    let mut connection_names = false;
    let (mut expect_continue, mut accepts_trailers) = (false, false);
    for field in req.headers.iter() {
        let (name, v) = (field.name.as_bytes(), field.value);
        let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
        facts.scan.bytes += name.len() + v.len() + 4;
        let noted = facts.scan.note_name(name);
        names.add(name);
        // Fields the server itself acts on (framing, persistence, 100-continue, trailers),
        // and those the proxy stage looks up first.
        match name.len() {
            4 if is(b"host") && facts.host.is_none() => facts.host = Some(value_of(head, v)?),
            14 if is(b"content-length") => {
                let slot = content_lengths
                    .get_mut(n_content_lengths)
                    .ok_or_else(|| bad("too many Content-Length fields"))?;
                *slot = v;
                n_content_lengths += 1;
            }
            17 if is(b"transfer-encoding") => transfer_encoding = Some(v),
            10 if is(b"connection") => {
                for token in v.split(|&b| b == b',') {
                    let token = token.trim_ascii();
                    let (c, k) = (
                        token.eq_ignore_ascii_case(b"close"),
                        token.eq_ignore_ascii_case(b"keep-alive"),
                    );
                    (close, keep_alive_token) = (close | c, keep_alive_token | k);
                    connection_names |= !(c || k || token.is_empty());
                }
            }
            6 if is(b"expect") => {
                expect_continue |= v.trim_ascii().eq_ignore_ascii_case(b"100-continue")
            }
            2 if is(b"te") => {
                accepts_trailers |= v
                    .split(|&b| b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"trailers"))
            }
            12 if is(b"content-type") => facts.grpc = keymaster_http::grpc::is_grpc_content_type(v),
            _ if !noted && is(request_id.as_str().as_bytes()) && facts.request_id.is_none() => {
                facts.request_id = Some(value_of(head, v)?)
            }
            _ => {}
        }
        if !wire {
            let name = HeaderName::from_bytes(name).map_err(|_| bad("invalid header name"))?;
            headers.append(name, value_of(head, v)?);
        }
    }
    let fields = match (wire, req.headers.first(), req.headers.last()) {
        (false, _, _) => None,
        // From the first field's name through the last field's line end.
        (true, Some(first), Some(_)) => {
            let start = first.name.as_ptr() as usize - head.as_ptr() as usize;
            Some(head.slice(start..head.len() - 2))
        }
        (true, _, _) => Some(Bytes::new()),
    };
    let declared = framing::declared(
        version,
        transfer_encoding,
        content_lengths[..n_content_lengths].iter().copied(),
    )
    .map_err(framing::FramingError::by_client)?;
    let body = match declared {
        Declared::Nothing => Decoder::Done,
        Declared::Length(n) => Decoder::length(n),
        Declared::Chunked => Decoder::chunked(),
    };
    let keep_alive = match version {
        Version::HTTP_11 => !close,
        _ => keep_alive_token && !close,
    };
    // A length given more than once (identical, or `declared` refused it) leaves as one line.
    let length = match &content_lengths[..n_content_lengths] {
        [] => ClientLength::None,
        [one] if !one.contains(&b',') => ClientLength::AsSent,
        _ => ClientLength::Rewritten,
    };
    // A Connection field of options alone (`close`, the usual way to end a connection)
    // goes no further: no map is needed to strip it.
    let options_only = facts.scan.connection && !connection_names;
    if options_only && fields.is_some() {
        facts.scan.connection_left_out();
    }
    let wire = fields.map(|block| {
        let mut fields = RawRequestFields::new(block, length, names);
        if options_only {
            fields.leave_out_connection();
        }
        Box::new(WireHead { fields, facts })
    });
    Ok(Head {
        method,
        uri,
        version,
        headers,
        wire,
        expect_continue: expect_continue && !body.is_done(),
        body,
        keep_alive,
        accepts_trailers,
        body_refused: None,
    })
}

/// A field value sharing the head's memory.
fn value_of(head: &Bytes, v: &[u8]) -> Result<HeaderValue, Error> {
    HeaderValue::from_maybe_shared(head.slice_ref(v))
        .map_err(|_| Error::new(Kind::BadRequest, "invalid header value"))
}

/// The connection as its request's body ([`crate::body::H1Body`]): bytes already read
/// come first, then the socket. A `100 Continue` the client waits for goes out before the
/// first read.
impl crate::body::ConnBody for ConnIo {
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let conn = self;
        if conn.body.is_done() {
            return Poll::Ready(None);
        }
        if let Some(e) = conn.body_refused {
            conn.body_failed = true;
            return Poll::Ready(Some(Err(e.by_client())));
        }
        if let Err(e) = ready!(conn.poll_continue(cx)) {
            return Poll::Ready(Some(Err(gone(e))));
        }
        loop {
            match conn.body.decode(&mut conn.rbuf) {
                Ok(Step::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(Step::Trailers(t)) => return Poll::Ready(Some(Ok(Frame::trailers(t)))),
                Ok(Step::End) => return Poll::Ready(None),
                Ok(Step::More) => {}
                Err(e) => {
                    conn.body_failed = true;
                    return Poll::Ready(Some(Err(e.by_client())));
                }
            }
            let want = conn
                .body
                .remaining()
                .map_or(16 * 1024, |r| r.min(64 * 1024) as usize);
            match ready!(conn.poll_fill(cx, want)) {
                Ok(0) => {
                    conn.body_failed = true;
                    let e = conn
                        .body
                        .on_eof()
                        .err()
                        .unwrap_or(framing::FramingError::Truncated);
                    return Poll::Ready(Some(Err(e.by_client())));
                }
                Ok(_) => {}
                Err(e) => {
                    conn.body_failed = true;
                    return Poll::Ready(Some(Err(gone(e))));
                }
            }
        }
    }

    fn body_done(&self) -> bool {
        self.body.is_done()
    }

    fn body_remaining(&self) -> Option<u64> {
        self.body.remaining()
    }

    fn body_refused(&self) -> Option<Error> {
        self.body_refused.map(FramingError::by_client)
    }
}

fn gone(e: std::io::Error) -> Error {
    Error::new(Kind::ClientGone, "reading the client's body failed").with_source(e)
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> HeadLimits {
        HeadLimits {
            max_request_line: 64,
            max_header_bytes: 256,
            max_headers: 8,
        }
    }

    fn parse(bytes: &[u8]) -> Result<Option<Head>, Error> {
        parse_head(
            &mut BytesMut::from(bytes),
            &mut HeadScan::default(),
            &limits(),
            &rid(),
        )
    }

    fn rid() -> HeaderName {
        HeaderName::from_static("x-request-id")
    }

    fn status(bytes: &[u8]) -> u16 {
        match parse(bytes) {
            Err(e) => e.status().as_u16(),
            Ok(Some(_)) => 200,
            Ok(None) => 0,
        }
    }

    #[test]
    fn a_plain_get_parses_and_leaves_what_follows() {
        let mut buf =
            BytesMut::from(&b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\r\nGET /next"[..]);
        let h = parse_head(&mut buf, &mut HeadScan::default(), &limits(), &rid())
            .unwrap()
            .unwrap();
        assert_eq!(h.method, Method::GET);
        assert_eq!(h.uri, "/a?b=1");
        assert_eq!(h.version, Version::HTTP_11);
        // Kept in wire form: no map, the field lines as sent.
        assert!(h.headers.is_empty());
        let wire = h.wire.expect("CRLF lines stay in wire form");
        let map = wire.fields.to_map();
        assert_eq!(
            (map["host"].as_bytes(), map["x-a"].as_bytes()),
            (&b"x"[..], &b"1"[..])
        );
        assert_eq!(wire.fields.get("x-a"), Some(&b"1"[..]));
        assert!(h.body.is_done() && h.keep_alive && !h.expect_continue);
        assert_eq!(&buf[..], b"GET /next");
    }

    #[test]
    fn a_malformed_request_line_is_refused_before_the_head_is_complete() {
        // Incomplete heads with a good request line wait for more.
        for good in [
            &b"GET / HTTP/1.1\r\nHost: x\r\n"[..],
            b"\r\nPOST /a?b HTTP/1.0\nX-A: 1",
            b"GET / HTTP/1.1\r\n",
            b"GET / HTTP/1.1\r\nX",
            b"GET / HTT",
            b"",
        ] {
            assert_eq!(status(good), 0, "{:?}", String::from_utf8_lossy(good));
        }
        // A bad one is refused as soon as its line is in, as it would be with the whole head.
        for (bad, want) in [
            (&b"\x17\x94POST / HTTP/1.1\r\nHost: x\r\n"[..], 400),
            (b"GET / HTTP/3.0\r\nHost: x", 400),
            (b"GET /a b HTTP/1.1\r\n", 400),
            (b"\r\n\r\nG@T / HTTP/1.1\r\n", 400),
        ] {
            assert_eq!(status(bad), want, "{:?}", String::from_utf8_lossy(bad));
            let mut whole = bad.to_vec();
            whole.extend_from_slice(b"\r\n\r\n");
            assert_eq!(status(&whole), want, "the same head completed");
        }
        // Checked once per head: bytes trickling in do not parse the line again.
        let mut scan = HeadScan::default();
        let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\nHost"[..]);
        assert!(parse_head(&mut buf, &mut scan, &limits(), &rid())
            .unwrap()
            .is_none());
        assert!(scan.line_checked);
        buf.extend_from_slice(b": x\r\n\r\n");
        assert!(parse_head(&mut buf, &mut scan, &limits(), &rid())
            .unwrap()
            .is_some());
        assert!(!scan.line_checked, "the next head is checked afresh");
    }

    #[test]
    fn wire_form_keeps_the_lines_exactly_and_bare_lf_takes_the_map() {
        let h = parse(b"GET / HTTP/1.1\r\nHost:  x \r\nX-Request-Id:r1\r\n\r\n")
            .unwrap()
            .unwrap();
        let wire = h.wire.unwrap();
        let mut out = Vec::new();
        let via = HeaderValue::from_static("1.1 k");
        let ip = HeaderValue::from_static("1.2.3.4");
        let facts = keymaster_http::headers::ClientFacts {
            ip_value: ip,
            trusted: false,
            tls: None,
        };
        keymaster_http::headers::AddedFields::for_request(
            &wire.facts.scan,
            &facts,
            None,
            false,
            &via,
            None,
        )
        .unwrap()
        .with_client_fields(Some(&wire.fields))
        .write(&mut out);
        assert!(out.starts_with(b"Host:  x \r\nX-Request-Id:r1\r\nx-forwarded-for: 1.2.3.4\r\n"));
        assert_eq!(wire.facts.request_id.unwrap(), "r1");
        assert_eq!(wire.facts.host.unwrap(), "x");
        // A bare LF anywhere: the fields go through the map (an origin never sees bare LFs).
        let h = parse(b"GET / HTTP/1.1\r\nHost: x\nX-A: 1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.wire.is_none());
        assert_eq!(h.headers["x-a"], "1");
        // No fields at all (HTTP/1.0): an empty block.
        let h = parse(b"GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert!(h.wire.unwrap().fields.to_map().is_empty());
    }

    /// What the parser notes is what the proxy stage would find by looking at the map.
    #[test]
    fn noted_facts_match_a_scan_of_the_map() {
        for head in [
            &b"GET / HTTP/1.1\r\nHost: a:80\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nHOST: a\r\nx-request-ID: r1\r\nContent-Type: application/grpc\r\nTE: trailers\r\nContent-Length: 0\r\n\r\n",
            b"GET / HTTP/1.1\r\nX-Forwarded-For: 1.2.3.4\r\nConnection: upgrade\r\nUpgrade: websocket\r\nHost: b\r\n\r\n",
            b"GET / HTTP/1.0\r\nExpect: x\r\nContent-Type: text/plain\r\nForwarded: for=x\r\n\r\n",
        ] {
            let wire = parse(head).unwrap().unwrap().wire.unwrap();
            let looked_up = HeadFacts::of(&wire.fields.to_map(), &rid());
            assert_eq!(format!("{:?}", wire.facts), format!("{looked_up:?}"));
        }
    }

    #[test]
    fn heads_arriving_in_pieces_wait_and_scan_each_byte_once() {
        let full = b"\r\nPOST / HTTP/1.1\nHost: x\nContent-Length: 3\n\nabc";
        let mut buf = BytesMut::new();
        let mut scan = HeadScan::default();
        let mut parsed = None;
        for (i, b) in full.iter().enumerate() {
            buf.extend_from_slice(&[*b]);
            if let Some(h) = parse_head(&mut buf, &mut scan, &limits(), &rid()).unwrap() {
                parsed = Some((i, h));
                break;
            }
        }
        let (at, h) = parsed.expect("a head");
        assert_eq!(at, full.len() - 4, "complete at its empty line");
        assert_eq!(h.body.remaining(), Some(3));
        assert_eq!(&buf[..], b"");
    }

    #[test]
    fn persistence_follows_version_and_connection() {
        let ka = |b: &[u8]| parse(b).unwrap().unwrap().keep_alive;
        assert!(ka(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert!(!ka(
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        ));
        assert!(!ka(b"GET / HTTP/1.0\r\n\r\n"));
        assert!(ka(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"));
        let h = parse(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1\r\nTE: trailers\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.expect_continue && h.accepts_trailers);
        // Nothing to continue without a body.
        let h = parse(b"GET / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.expect_continue);
    }

    #[test]
    fn ambiguous_or_malformed_heads_are_refused() {
        for bad in [
            &b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n",
            b"GET / HTTP/1.1\r\nX : a\r\n\r\n",
            b"GET /a\x01 HTTP/1.1\r\n\r\n",
            b"G(T / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.2\r\n\r\n",
            b"GET / HTTP/2.0\r\n\r\n",
        ] {
            assert_eq!(status(bad), 400, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn limits_give_414_and_431() {
        let line = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(60));
        assert_eq!(status(line.as_bytes()), 414);
        // Exactly at the limit: 64 bytes of request line.
        let line = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(50));
        assert_eq!(line.find('\r'), Some(64));
        assert_eq!(status(line.as_bytes()), 200);
        // Without its end yet, a line already past the limit is refused at once.
        assert_eq!(status(format!("GET /{}", "a".repeat(80)).as_bytes()), 414);
        assert_eq!(
            status(b"GET / HTTP/1.1\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\nF: 1\r\nG: 1\r\nH: 1\r\nI: 1\r\n\r\n"),
            431
        );
        let big = format!("GET / HTTP/1.1\r\nA: {}", "a".repeat(400));
        assert_eq!(status(big.as_bytes()), 431);
    }
}
