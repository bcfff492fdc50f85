//! Reading an origin's HTTP/1.1 response from the connection's read buffer: the head
//! (httparse; 1xx heads other than 101 are skipped) and the body's framing (RFC 9112 §6.3):
//! none, Content-Length, chunked (with trailers), or until the origin closes. Everything here
//! works on bytes already read, so it is tested without sockets.
//!
//! Rules kept strict because an edge gateway must never pass on an ambiguous message: both
//! Transfer-Encoding and Content-Length, differing Content-Length values, a Transfer-Encoding
//! not ending in `chunked`, obs-fold, bad chunk lines: all are errors (502 before the head
//! reaches the client, an aborted response after).

use bytes::BytesMut;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};

use keymaster_http::error::{Error, Kind};
use keymaster_http::framing::{self, Declared, Decoder};
use keymaster_http::headers::has_token;
use keymaster_http::headers::RawHead;

/// The largest response head read (status line and fields).
pub(super) const MAX_HEAD: usize = 64 * 1024;
/// The most header fields in a response head.
const MAX_HEADERS: usize = 128;
/// Field positions kept on the stack; a head with more keeps them on the heap.
const STACK_FIELDS: usize = 32;

/// How a response's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// No body: HEAD, 204, 304.
    Empty,
    Length(u64),
    Chunked,
    /// Until the origin closes (no Content-Length or Transfer-Encoding).
    Close,
    /// 101: the connection now carries another protocol.
    Upgrade,
}

/// A final (non-1xx, or 101) response head.
#[derive(Debug)]
pub(super) struct Head {
    pub(super) status: StatusCode,
    pub(super) version: Version,
    /// Empty when the head is passed on as bytes (`raw`).
    pub(super) headers: HeaderMap,
    pub(super) raw: Option<RawHead>,
    /// The origin allows another request on this connection after this response.
    pub(super) keep_alive: bool,
    pub(super) framing: Framing,
    /// A reason phrase other than the status code's canonical one, passed on as it is.
    pub(super) reason: Option<hyper::ext::ReasonPhrase>,
}

fn malformed(detail: &'static str) -> Error {
    Error::new(Kind::OriginProtocol, detail)
}

/// Parse a response head from the front of `buf`, consuming it (and any 1xx heads before
/// it). `Ok(None)`: more bytes are needed.
///
/// `raw`: the head may be kept as bytes ([`RawHead`]; the name is the request-id field's).
/// It is, unless the response has no body by its status (101, 204, 304) or the origin sent
/// a hop-by-hop field other than `Transfer-Encoding` (those take the `HeaderMap`, whose
/// hop-by-hop removal handles `Connection`'s list) or `Trailer` (hyper reads it to decide
/// which trailer fields to pass on).
pub(super) fn parse_head(
    buf: &mut BytesMut,
    method: &Method,
    raw: Option<&HeaderName>,
) -> Result<Option<Head>, Error> {
    loop {
        if buf.is_empty() {
            return Ok(None);
        }
        // Field positions as offsets, so the values can share the head's memory: on the
        // stack for a usual head (zeroing room for every allowed field costs more than
        // parsing), on the heap past that.
        let mut stack_ranges = [(0u32, 0u32, 0u32, 0u32); STACK_FIELDS];
        let mut heap_ranges = Vec::new();
        let (len, code, minor, count, reason) = {
            // Uninitialised slots: httparse fills what it uses (initialising 128 empty
            // headers would cost more than parsing a typical head).
            let mut slots = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
            let mut res = httparse::Response::new(&mut []);
            let parsed = httparse::ParserConfig::default()
                .parse_response_with_uninit_headers(&mut res, buf, &mut slots);
            let len = match parsed {
                Ok(httparse::Status::Complete(len)) => len,
                Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                    return Err(malformed("origin response head too large"))
                }
                Ok(httparse::Status::Partial) => return Ok(None),
                Err(httparse::Error::TooManyHeaders) => {
                    return Err(malformed("origin response has too many header fields"))
                }
                Err(e) => return Err(malformed("origin sent a malformed response").with_source(e)),
            };
            if len > MAX_HEAD {
                return Err(malformed("origin response head too large"));
            }
            let base = buf.as_ptr() as usize;
            let ranges = if res.headers.len() <= STACK_FIELDS {
                &mut stack_ranges[..]
            } else {
                heap_ranges.resize(res.headers.len(), (0, 0, 0, 0));
                &mut heap_ranges[..]
            };
            for (slot, h) in ranges.iter_mut().zip(res.headers.iter()) {
                let n = h.name.as_ptr() as usize - base;
                let v = h.value.as_ptr() as usize - base;
                *slot = (
                    n as u32,
                    (n + h.name.len()) as u32,
                    v as u32,
                    (v + h.value.len()) as u32,
                );
            }
            let code = res.code.unwrap_or(0);
            let reason = res.reason.filter(|r| {
                StatusCode::from_u16(code).is_ok_and(|s| s.canonical_reason() != Some(*r))
            });
            let reason = reason.and_then(|r| hyper::ext::ReasonPhrase::try_from(r.as_bytes()).ok());
            (
                len,
                code,
                res.version.unwrap_or(1),
                res.headers.len(),
                reason,
            )
        };
        let ranges = if count <= STACK_FIELDS {
            &stack_ranges[..count]
        } else {
            &heap_ranges[..]
        };
        let head = buf.split_to(len).freeze();
        let status = StatusCode::from_u16(code)
            .map_err(|_| malformed("origin sent an invalid status code"))?;
        if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
            continue; // 100 Continue, 103 Early Hints...: not passed on
        }
        let version = if minor == 1 {
            Version::HTTP_11
        } else {
            Version::HTTP_10
        };
        let bodyless = matches!(status.as_u16(), 101 | 204 | 304);
        if let Some(rid) = raw.filter(|_| !bodyless && method != Method::HEAD) {
            if let Some((mut raw, found)) = raw_head(&head, ranges, rid) {
                let value = |(v0, v1): (u32, u32)| &head[v0 as usize..v1 as usize];
                let framing = framing(
                    status,
                    version,
                    method,
                    found.transfer_encoding.map(value),
                    found.content_lengths[..found.n_content_lengths]
                        .iter()
                        .map(|&r| value(r)),
                )?;
                let keep_alive = version == Version::HTTP_11 && framing != Framing::Close;
                if let Framing::Length(n) = framing {
                    raw.content_length = Some(n);
                }
                return Ok(Some(Head {
                    status,
                    version,
                    headers: HeaderMap::new(),
                    raw: Some(raw),
                    keep_alive,
                    framing,
                    reason,
                }));
            }
        }
        // Room for what the gateway adds (Via, request id) without growing the map.
        let mut headers = HeaderMap::with_capacity(count + 4);
        for &(n0, n1, v0, v1) in ranges {
            let name = HeaderName::from_bytes(&head[n0 as usize..n1 as usize])
                .map_err(|_| malformed("origin sent an invalid header name"))?;
            let value = HeaderValue::from_maybe_shared(head.slice(v0 as usize..v1 as usize))
                .map_err(|_| malformed("origin sent an invalid header value"))?;
            headers.append(name, value);
        }
        let framing = framing(
            status,
            version,
            method,
            headers
                .get_all(header::TRANSFER_ENCODING)
                .iter()
                .next_back()
                .map(HeaderValue::as_bytes),
            headers
                .get_all(header::CONTENT_LENGTH)
                .iter()
                .map(HeaderValue::as_bytes),
        )?;
        let keep_alive = framing != Framing::Close
            && framing != Framing::Upgrade
            && !has_token(&headers, header::CONNECTION, "close")
            && (version == Version::HTTP_11
                || has_token(&headers, header::CONNECTION, "keep-alive"));
        return Ok(Some(Head {
            status,
            version,
            headers,
            raw: None,
            keep_alive,
            framing,
            reason,
        }));
    }
}

/// The framing fields [`raw_head`] met on its way, as value ranges in the head: the last
/// `Transfer-Encoding` and the first few `Content-Length`s (a head with more takes the
/// `HeaderMap` path).
#[derive(Default)]
struct FramingFields {
    transfer_encoding: Option<(u32, u32)>,
    content_lengths: [(u32, u32); 4],
    n_content_lengths: usize,
}

/// The head's fields as a [`RawHead`] block, or `None` if a hop-by-hop field other than
/// `Transfer-Encoding`, or `Trailer`, needs the `HeaderMap` path. `ranges` are the fields'
/// (name, value) offsets in `head`; names and values were checked by httparse (tokens; no
/// CR, LF or NUL in values). Runs of lines already written `name: value\r\n` are copied
/// whole; others are rewritten in that form.
fn raw_head(
    head: &[u8],
    ranges: &[(u32, u32, u32, u32)],
    request_id: &HeaderName,
) -> Option<(RawHead, FramingFields)> {
    let mut found = FramingFields::default();
    // Room for the fields plus Via and the request id.
    let mut raw = RawHead {
        block: BytesMut::with_capacity(head.len() + 128),
        has_date: false,
        has_request_id: false,
        content_length: None,
    };
    // Kept lines not yet copied: a contiguous stretch of `head`.
    let mut run: Option<(usize, usize)> = None;
    let flush = |run: &mut Option<(usize, usize)>, block: &mut BytesMut| {
        if let Some((from, to)) = run.take() {
            block.extend_from_slice(&head[from..to]);
        }
    };
    for &(n0, n1, v0, v1) in ranges {
        let (n0, n1, v0, v1) = (n0 as usize, n1 as usize, v0 as usize, v1 as usize);
        let name = &head[n0..n1];
        let lower = |n: &[u8]| name.eq_ignore_ascii_case(n);
        match name.len() {
            2 if lower(b"te") => return None,
            4 if lower(b"date") => raw.has_date = true,
            // hyper passes on only the trailer fields a `Trailer` field of the map announces.
            7 if lower(b"upgrade") || lower(b"trailer") => return None,
            10 if lower(b"connection") || lower(b"keep-alive") => return None,
            14 if lower(b"content-length") => {
                let slot = found.content_lengths.get_mut(found.n_content_lengths)?;
                *slot = (v0 as u32, v1 as u32);
                found.n_content_lengths += 1;
                continue;
            }
            16 if lower(b"proxy-connection") => return None,
            17 if lower(b"transfer-encoding") => {
                found.transfer_encoding = Some((v0 as u32, v1 as u32));
                continue;
            }
            _ => {}
        }
        if name.eq_ignore_ascii_case(request_id.as_str().as_bytes()) {
            raw.has_request_id = true;
        }
        let line_end = v1 + 2;
        if &head[n1..v0] == b": " && head.get(v1..line_end) == Some(&b"\r\n"[..]) {
            match &mut run {
                Some((_, to)) if *to == n0 => *to = line_end,
                _ => {
                    flush(&mut run, &mut raw.block);
                    run = Some((n0, line_end));
                }
            }
        } else {
            flush(&mut run, &mut raw.block);
            raw.push(name, &head[v0..v1]);
        }
    }
    flush(&mut run, &mut raw.block);
    Some((raw, found))
}

/// The body's framing (RFC 9112 §6.3) from the status, the last `Transfer-Encoding` value
/// and every `Content-Length` value.
fn framing<'a>(
    status: StatusCode,
    version: Version,
    method: &Method,
    transfer_encoding: Option<&[u8]>,
    content_lengths: impl Iterator<Item = &'a [u8]>,
) -> Result<Framing, Error> {
    match status.as_u16() {
        101 => return Ok(Framing::Upgrade),
        // No body whatever the fields say (RFC 9112 §6.3), but the Content-Length the client
        // is given must still be one: an invalid or conflicting value is the origin's error,
        // as it is where it frames a body.
        204 | 304 => {}
        _ if method == Method::HEAD => {}
        // A tunnel we never asked for: no body, and the connection is not reused.
        200..=299 if method == Method::CONNECT => return Ok(Framing::Close),
        _ => {
            let declared = framing::declared(version, transfer_encoding, content_lengths)
                .map_err(framing::FramingError::by_origin)?;
            return Ok(match declared {
                Declared::Nothing => Framing::Close,
                Declared::Length(n) => Framing::Length(n),
                Declared::Chunked => Framing::Chunked,
            });
        }
    }
    framing::declared(version, None, content_lengths).map_err(framing::FramingError::by_origin)?;
    Ok(Framing::Empty)
}

/// The decoder for a response body with this framing.
pub(super) fn decoder(framing: Framing) -> Decoder {
    match framing {
        Framing::Empty | Framing::Upgrade => Decoder::Done,
        Framing::Length(n) => Decoder::length(n),
        Framing::Chunked => Decoder::chunked(),
        Framing::Close => Decoder::Close,
    }
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;

    fn head(bytes: &[u8], method: Method) -> Result<Option<Head>, Error> {
        parse_head(&mut BytesMut::from(bytes), &method, None)
    }

    const RID: HeaderName = HeaderName::from_static("x-request-id");

    fn raw_head_of(bytes: &[u8], method: Method) -> Result<Option<Head>, Error> {
        parse_head(&mut BytesMut::from(bytes), &method, Some(&RID))
    }

    /// The framing, the same whether the head is kept as bytes or as a map.
    fn framing_of(bytes: &[u8]) -> Framing {
        let map = head(bytes, Method::GET).unwrap().unwrap();
        let raw = raw_head_of(bytes, Method::GET).unwrap().unwrap();
        assert_eq!(map.framing, raw.framing);
        assert_eq!(map.keep_alive, raw.keep_alive);
        map.framing
    }

    /// Refused, the same whether the head would be kept as bytes or as a map.
    fn is_malformed(bytes: &[u8]) -> bool {
        let map = head(bytes, Method::GET).is_err();
        assert_eq!(map, raw_head_of(bytes, Method::GET).is_err());
        map
    }

    fn block(h: &Head) -> &str {
        std::str::from_utf8(&h.raw.as_ref().expect("kept as bytes").block).unwrap()
    }

    #[test]
    fn a_head_kept_as_bytes_drops_only_the_framing_fields() {
        let h = raw_head_of(
            b"HTTP/1.1 200 OK\r\nX-Mixed: A  b\r\nContent-Length: 2\r\nDate: d\r\nvia: 1.0 o\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(block(&h), "X-Mixed: A  b\r\nDate: d\r\nvia: 1.0 o\r\n");
        assert!(h.headers.is_empty());
        let raw = h.raw.as_ref().unwrap();
        assert!(raw.has_date && !raw.has_request_id);
        assert_eq!((h.framing, h.keep_alive), (Framing::Length(2), true));

        let h = raw_head_of(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Request-ID: o\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(block(&h), "X-Request-ID: o\r\n");
        let raw = h.raw.as_ref().unwrap();
        assert!(!raw.has_date && raw.has_request_id);
        assert_eq!(h.framing, Framing::Chunked);

        // Lines not written `name: value` come out in that form; the rest as they were.
        let h = raw_head_of(
            b"HTTP/1.1 200 OK\r\na:1\r\nb:  2 \r\nContent-Length: 0\r\nc: 3\r\nd: 4\nE: 5\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(block(&h), "a: 1\r\nb: 2\r\nc: 3\r\nd: 4\r\nE: 5\r\n");
    }

    #[test]
    fn heads_that_need_the_map_are_not_kept_as_bytes() {
        for fields in [
            "Connection: close",
            "connection: x-secret",
            "Keep-Alive: timeout=5",
            "Proxy-Connection: keep-alive",
            "TE: trailers",
            "Upgrade: h2c",
            "Trailer: x-sum",
        ] {
            let bytes = format!("HTTP/1.1 200 OK\r\n{fields}\r\nContent-Length: 0\r\n\r\n");
            let h = raw_head_of(bytes.as_bytes(), Method::GET).unwrap().unwrap();
            assert!(h.raw.is_none() && !h.headers.is_empty(), "{fields}");
        }
        for (bytes, method) in [
            (&b"HTTP/1.1 204 No Content\r\n\r\n"[..], Method::GET),
            (b"HTTP/1.1 304 Not Modified\r\n\r\n", Method::GET),
            (
                b"HTTP/1.1 101 Switching Protocols\r\nx: y\r\n\r\n",
                Method::GET,
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
                Method::HEAD,
            ),
        ] {
            let h = raw_head_of(bytes, method).unwrap().unwrap();
            assert!(h.raw.is_none(), "{:?}", String::from_utf8_lossy(bytes));
        }
    }

    #[test]
    fn framing_follows_rfc_9112() {
        assert_eq!(
            framing_of(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"),
            Framing::Length(5)
        );
        assert_eq!(
            framing_of(b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n"),
            Framing::Length(5)
        );
        assert_eq!(
            framing_of(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            Framing::Chunked
        );
        assert_eq!(framing_of(b"HTTP/1.1 200 OK\r\n\r\n"), Framing::Close);
        assert_eq!(
            framing_of(b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"),
            Framing::Empty
        );
        assert_eq!(
            framing_of(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n"),
            Framing::Upgrade
        );
        let h = head(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
            Method::HEAD,
        );
        assert_eq!(h.unwrap().unwrap().framing, Framing::Empty);
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        assert!(is_malformed(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        ));
        assert!(is_malformed(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"
        ));
        assert!(is_malformed(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n"
        ));
        assert!(is_malformed(
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"
        ));
        assert!(is_malformed(
            b"HTTP/1.1 200 OK\r\nContent-Length: 0x5\r\n\r\n"
        ));
        assert!(is_malformed(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"
        ));
        assert!(is_malformed(
            b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        ));
        assert!(is_malformed(b"HTTP/1.1 2OO OK\r\n\r\n"));
        assert!(is_malformed(b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n"));
    }

    #[test]
    fn a_bodyless_response_still_needs_a_valid_content_length() {
        // 204, 304 and HEAD have no body whatever Content-Length says, but the client gets the
        // field: an invalid or conflicting value is refused as it is for a framed body.
        for bad in [
            &b"HTTP/1.1 304 Not Modified\r\nContent-Length: A10\r\n\r\n"[..],
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5, 6\r\n\r\n",
            b"HTTP/1.1 204 No Content\r\nContent-Length: -1\r\n\r\n",
            b"HTTP/1.1 204 No Content\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        ] {
            assert!(is_malformed(bad), "{}", String::from_utf8_lossy(bad));
        }
        let h = head(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5x\r\n\r\n",
            Method::HEAD,
        );
        assert!(h.is_err(), "HEAD");
        // Valid values pass (a 304 may carry the 200's length).
        assert_eq!(
            framing_of(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n"),
            Framing::Empty
        );
    }

    #[test]
    fn informational_heads_are_skipped_and_partial_heads_wait() {
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"[..],
        );
        let h = parse_head(&mut buf, &Method::POST, None).unwrap().unwrap();
        assert_eq!(h.status, 200);
        assert_eq!(&buf[..], b"ok");
        let mut partial = BytesMut::from(&b"HTTP/1.1 200 OK\r\nContent-Le"[..]);
        assert!(parse_head(&mut partial, &Method::GET, None)
            .unwrap()
            .is_none());
        let mut huge = BytesMut::from(&b"HTTP/1.1 200 OK\r\nX: "[..]);
        huge.extend(std::iter::repeat_n(b'a', MAX_HEAD));
        assert!(parse_head(&mut huge, &Method::GET, None).is_err());
    }

    #[test]
    fn keep_alive_by_version_and_connection() {
        let ka = |b: &[u8]| head(b, Method::GET).unwrap().unwrap().keep_alive;
        assert!(ka(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"));
        assert!(!ka(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        ));
        assert!(!ka(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"));
        assert!(ka(
            b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n"
        ));
        assert!(!ka(b"HTTP/1.1 200 OK\r\n\r\n"));
    }

    #[test]
    fn heads_with_more_fields_than_the_stack_holds_parse_whole() {
        let mut text = String::from("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n");
        for i in 0..STACK_FIELDS + 8 {
            text.push_str(&format!("X-F{i}: v{i}\r\n"));
        }
        text.push_str("\r\n");
        let map = head(text.as_bytes(), Method::GET).unwrap().unwrap();
        assert_eq!(map.headers.len(), STACK_FIELDS + 9);
        assert_eq!(map.headers["x-f39"], "v39");
        assert_eq!(map.framing, Framing::Length(2));
        let raw = raw_head_of(text.as_bytes(), Method::GET).unwrap().unwrap();
        let block = block(&raw);
        assert!(block.starts_with("X-F0: v0\r\n") && block.ends_with("X-F39: v39\r\n"));
        assert_eq!(raw.framing, Framing::Length(2));
    }
}
