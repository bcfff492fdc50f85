//! HTTP/1.1 message framing, shared by both sides of the proxy (RFC 9112 §6, §7): the body
//! length a message's framing fields declare, and the body decoder (Content-Length, chunked
//! with trailers, or until close) that takes a body off the front of a read buffer. The
//! downstream server reads request bodies with it, the upstream client response bodies.
//!
//! Everything here works on bytes already read, so it is tested without sockets. Errors say
//! what was wrong, not who sent it: each side turns a [`FramingError`] into its own
//! [`Error`] ([`FramingError::by_client`]: 400; [`FramingError::by_origin`]: 502).

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::Version;

use crate::error::{Error, Kind};
use crate::headers::{ends_in_chunked, parse_content_length};

/// The longest chunk-size line (size and extensions).
const MAX_CHUNK_LINE: usize = 4 * 1024;
/// The largest trailer section.
const MAX_TRAILERS: usize = 16 * 1024;
/// The most fields in a trailer section.
const MAX_TRAILER_FIELDS: usize = 32;

/// What was wrong with a message's framing or body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FramingError {
    TransferEncodingOnHttp10,
    BothTransferEncodingAndContentLength,
    TransferEncodingNotChunked,
    InvalidContentLength,
    ConflictingContentLength,
    ChunkLineTooLong,
    InvalidChunkSize,
    ChunkOverrun,
    TrailersTooLarge,
    InvalidTrailers,
    /// The connection ended before the body did.
    Truncated,
}

impl FramingError {
    /// The error when an origin's response is at fault (502, or an aborted response).
    pub(crate) fn by_origin(self) -> Error {
        use FramingError::*;
        let detail = match self {
            TransferEncodingOnHttp10 => "HTTP/1.0 origin sent Transfer-Encoding",
            BothTransferEncodingAndContentLength => {
                "origin sent both Transfer-Encoding and Content-Length"
            }
            TransferEncodingNotChunked => {
                "origin sent a Transfer-Encoding that does not end in chunked"
            }
            InvalidContentLength => "origin sent an invalid Content-Length",
            ConflictingContentLength => "origin sent conflicting Content-Length values",
            ChunkLineTooLong => "origin sent a chunk-size line too long",
            InvalidChunkSize => "origin sent an invalid chunk size",
            ChunkOverrun => "origin sent chunk data longer than its size",
            TrailersTooLarge => "origin sent a trailer section too large",
            InvalidTrailers => "origin sent invalid trailers",
            Truncated => {
                return Error::new(
                    Kind::OriginReset,
                    "origin closed the connection before the body ended",
                )
            }
        };
        Error::new(Kind::OriginProtocol, detail)
    }

    /// The error when a client's request is at fault (400, or a cancelled request).
    pub(crate) fn by_client(self) -> Error {
        use FramingError::*;
        let detail = match self {
            TransferEncodingOnHttp10 | TransferEncodingNotChunked => "invalid Transfer-Encoding",
            BothTransferEncodingAndContentLength => "both Transfer-Encoding and Content-Length",
            InvalidContentLength => "invalid Content-Length",
            ConflictingContentLength => "conflicting Content-Length",
            ChunkLineTooLong => "chunk-size line too long",
            InvalidChunkSize => "invalid chunk size",
            ChunkOverrun => "chunk data longer than its size",
            TrailersTooLarge => "trailer section too large",
            InvalidTrailers => "invalid trailers",
            Truncated => {
                return Error::new(
                    Kind::ClientGone,
                    "client closed the connection before its body ended",
                )
            }
        };
        Error::new(Kind::BadRequest, detail)
    }
}

/// The body length a message's framing fields declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Declared {
    /// Neither field: no body for a request, a body until close for a response.
    Nothing,
    Length(u64),
    Chunked,
}

/// The declared length (RFC 9112 §6.3) from the last `Transfer-Encoding` value and every
/// `Content-Length` value. Ambiguity is an error: both fields, differing lengths, a
/// `Transfer-Encoding` not ending in `chunked` or on HTTP/1.0. A list of identical lengths
/// is one length (RFC 9110 §8.6).
pub(crate) fn declared<'a>(
    version: Version,
    transfer_encoding: Option<&[u8]>,
    content_lengths: impl Iterator<Item = &'a [u8]>,
) -> Result<Declared, FramingError> {
    let mut content_lengths = content_lengths.peekable();
    if let Some(te) = transfer_encoding {
        if version == Version::HTTP_10 {
            return Err(FramingError::TransferEncodingOnHttp10);
        }
        if content_lengths.peek().is_some() {
            return Err(FramingError::BothTransferEncodingAndContentLength);
        }
        if !ends_in_chunked(te) {
            return Err(FramingError::TransferEncodingNotChunked);
        }
        return Ok(Declared::Chunked);
    }
    let mut length = None;
    for v in content_lengths {
        for part in v.split(|&b| b == b',') {
            let n = parse_content_length(part.trim_ascii())
                .ok_or(FramingError::InvalidContentLength)?;
            if length.is_some_and(|l| l != n) {
                return Err(FramingError::ConflictingContentLength);
            }
            length = Some(n);
        }
    }
    Ok(length.map_or(Declared::Nothing, Declared::Length))
}

/// What the body decoder produced from the buffer.
#[derive(Debug)]
pub(crate) enum Step {
    Data(Bytes),
    Trailers(HeaderMap),
    /// The body is complete.
    End,
    /// More bytes are needed.
    More,
}

/// Where a chunked body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chunk {
    Size,
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    Trailers,
}

/// A body's decoder: takes body bytes off the front of the read buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decoder {
    Length(u64),
    Chunked(Chunk),
    /// Until the peer closes (responses only).
    Close,
    Done,
}

impl Decoder {
    /// A decoder for a body of `n` bytes (done at once for 0).
    pub(crate) fn length(n: u64) -> Decoder {
        if n == 0 {
            Decoder::Done
        } else {
            Decoder::Length(n)
        }
    }

    pub(crate) fn chunked() -> Decoder {
        Decoder::Chunked(Chunk::Size)
    }

    pub(crate) fn is_done(&self) -> bool {
        *self == Decoder::Done
    }

    /// Bytes still expected, when the length is known.
    pub(crate) fn remaining(&self) -> Option<u64> {
        match self {
            Decoder::Length(n) => Some(*n),
            Decoder::Done => Some(0),
            _ => None,
        }
    }

    /// Decode the next piece of the body from `buf`.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Step, FramingError> {
        loop {
            match self {
                Decoder::Done => return Ok(Step::End),
                Decoder::Length(n) => {
                    if buf.is_empty() {
                        return Ok(Step::More);
                    }
                    let take = (*n).min(buf.len() as u64) as usize;
                    *n -= take as u64;
                    if *n == 0 {
                        *self = Decoder::Done;
                    }
                    return Ok(Step::Data(buf.split_to(take).freeze()));
                }
                Decoder::Close => {
                    if buf.is_empty() {
                        return Ok(Step::More);
                    }
                    return Ok(Step::Data(buf.split().freeze()));
                }
                Decoder::Chunked(Chunk::Size) => {
                    let Some(lf) = buf.iter().position(|&b| b == b'\n') else {
                        if buf.len() > MAX_CHUNK_LINE {
                            return Err(FramingError::ChunkLineTooLong);
                        }
                        return Ok(Step::More);
                    };
                    let size = chunk_size(&buf[..lf])?;
                    buf.advance(lf + 1);
                    *self = Decoder::Chunked(if size == 0 {
                        Chunk::Trailers
                    } else {
                        Chunk::Data(size)
                    });
                }
                Decoder::Chunked(Chunk::Data(n)) => {
                    if buf.is_empty() {
                        return Ok(Step::More);
                    }
                    let take = (*n).min(buf.len() as u64) as usize;
                    *n -= take as u64;
                    let data = buf.split_to(take).freeze();
                    if *n == 0 {
                        *self = Decoder::Chunked(Chunk::DataEnd);
                        // Finish the chunk now if its CRLF is here, so a body whose last
                        // chunk arrived whole reads as ended without another poll.
                        self.skip_data_end(buf)?;
                    }
                    return Ok(Step::Data(data));
                }
                Decoder::Chunked(Chunk::DataEnd) => {
                    if !self.skip_data_end(buf)? {
                        return Ok(Step::More);
                    }
                }
                Decoder::Chunked(Chunk::Trailers) => {
                    if buf.len() < 2 {
                        return Ok(Step::More);
                    }
                    if buf.starts_with(b"\r\n") {
                        buf.advance(2);
                        *self = Decoder::Done;
                        return Ok(Step::End);
                    }
                    let mut slots = [httparse::EMPTY_HEADER; MAX_TRAILER_FIELDS];
                    match httparse::parse_headers(buf, &mut slots) {
                        Ok(httparse::Status::Complete((len, fields))) => {
                            let mut trailers = HeaderMap::with_capacity(fields.len());
                            for f in fields {
                                let name = HeaderName::from_bytes(f.name.as_bytes())
                                    .map_err(|_| FramingError::InvalidTrailers)?;
                                let value = HeaderValue::from_bytes(f.value)
                                    .map_err(|_| FramingError::InvalidTrailers)?;
                                trailers.append(name, value);
                            }
                            buf.advance(len);
                            *self = Decoder::Done;
                            return Ok(Step::Trailers(trailers));
                        }
                        Ok(httparse::Status::Partial) if buf.len() > MAX_TRAILERS => {
                            return Err(FramingError::TrailersTooLarge)
                        }
                        Ok(httparse::Status::Partial) => return Ok(Step::More),
                        Err(_) => return Err(FramingError::InvalidTrailers),
                    }
                }
            }
        }
    }

    /// In `DataEnd`: consume the CRLF if it is there. `Ok(false)`: not yet.
    fn skip_data_end(&mut self, buf: &mut BytesMut) -> Result<bool, FramingError> {
        if buf.len() < 2 {
            return Ok(false);
        }
        if !buf.starts_with(b"\r\n") {
            return Err(FramingError::ChunkOverrun);
        }
        buf.advance(2);
        *self = Decoder::Chunked(Chunk::Size);
        Ok(true)
    }

    /// The peer closed the connection: the end of a close-delimited body, otherwise a
    /// truncated one.
    pub(crate) fn on_eof(&mut self) -> Result<Step, FramingError> {
        match self {
            Decoder::Close | Decoder::Done => {
                *self = Decoder::Done;
                Ok(Step::End)
            }
            _ => Err(FramingError::Truncated),
        }
    }
}

/// The size from a chunk-size line (without its LF): hex digits, then optional extensions
/// (`;name=value`, ignored), then CR.
fn chunk_size(line: &[u8]) -> Result<u64, FramingError> {
    let bad = FramingError::InvalidChunkSize;
    let line = line.strip_suffix(b"\r").ok_or(bad)?;
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 16 {
        return Err(bad);
    }
    let rest = &line[digits..];
    let ext_ok = rest.is_empty()
        || rest
            .iter()
            .position(|&b| b != b' ' && b != b'\t')
            .is_some_and(|i| rest[i] == b';')
            && rest
                .iter()
                .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b));
    if !ext_ok {
        return Err(bad);
    }
    let hex = std::str::from_utf8(&line[..digits]).map_err(|_| bad)?;
    u64::from_str_radix(hex, 16).map_err(|_| bad)
}

/// Write the size line of a chunk of `len` bytes (`{hex}\r\n`).
pub(crate) fn put_chunk_size(dst: &mut BytesMut, len: usize) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    let mut n = len;
    loop {
        i -= 1;
        digits[i] = HEX[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    dst.extend_from_slice(&digits[i..]);
    dst.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `input` to a decoder `step` bytes at a time; return the data and trailers.
    fn decode_all(
        mut d: Decoder,
        input: &[u8],
        step: usize,
    ) -> Result<(Vec<u8>, usize), FramingError> {
        let mut buf = BytesMut::new();
        let (mut data, mut trailers) = (Vec::new(), 0);
        let mut fed = 0;
        loop {
            match d.decode(&mut buf)? {
                Step::Data(b) => data.extend_from_slice(&b),
                Step::Trailers(t) => trailers += t.len(),
                Step::End => return Ok((data, trailers)),
                Step::More if fed == input.len() => {
                    d.on_eof()?;
                    return Ok((data, trailers));
                }
                Step::More => {
                    let n = step.min(input.len() - fed);
                    buf.extend_from_slice(&input[fed..fed + n]);
                    fed += n;
                }
            }
        }
    }

    #[test]
    fn chunked_bodies_decode_in_any_split() {
        let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nx-sum: 1\r\nx-b: 2\r\n\r\n";
        for step in [1, 2, 3, 7, body.len()] {
            let (data, trailers) = decode_all(Decoder::chunked(), body, step).unwrap();
            assert_eq!(data, b"hello world", "step {step}");
            assert_eq!(trailers, 2, "step {step}");
        }
        let (data, t) = decode_all(Decoder::chunked(), b"3\r\nabc\r\n0\r\n\r\n", 1).unwrap();
        assert_eq!((data.as_slice(), t), (&b"abc"[..], 0));
    }

    #[test]
    fn bad_or_truncated_chunked_bodies_fail() {
        for (bad, why) in [
            (&b"5\r\nhelloX\r\n0\r\n\r\n"[..], FramingError::ChunkOverrun),
            (b"zz\r\nhello\r\n", FramingError::InvalidChunkSize),
            (b"5 x\r\nhello\r\n0\r\n\r\n", FramingError::InvalidChunkSize),
            (b"5\nhello\r\n0\r\n\r\n", FramingError::InvalidChunkSize),
            (b"11111111111111111\r\n", FramingError::InvalidChunkSize),
            (b"5\r\nhel", FramingError::Truncated),
            (b"0\r\nbad trailer\r\n\r\n", FramingError::InvalidTrailers),
        ] {
            assert_eq!(
                decode_all(Decoder::chunked(), bad, 1).unwrap_err(),
                why,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = vec![b'1'; MAX_CHUNK_LINE + 1];
        assert_eq!(
            decode_all(Decoder::chunked(), &long, long.len()).unwrap_err(),
            FramingError::ChunkLineTooLong
        );
    }

    #[test]
    fn length_and_close_bodies() {
        let (data, _) = decode_all(Decoder::length(5), b"hello", 2).unwrap();
        assert_eq!(data, b"hello");
        assert_eq!(
            decode_all(Decoder::length(5), b"hel", 2).unwrap_err(),
            FramingError::Truncated
        );
        let (data, _) = decode_all(Decoder::Close, b"until close", 4).unwrap();
        assert_eq!(data, b"until close");
        assert!(Decoder::length(0).is_done());
        // Bytes past the declared length stay in the buffer (the next message's).
        let mut d = Decoder::length(2);
        let mut buf = BytesMut::from(&b"okEXTRA"[..]);
        assert!(matches!(d.decode(&mut buf).unwrap(), Step::Data(b) if &b[..] == b"ok"));
        assert!(d.is_done());
        assert_eq!(&buf[..], b"EXTRA");
    }

    #[test]
    fn declared_length_follows_rfc_9112() {
        let d = |v, te: Option<&[u8]>, cls: &[&[u8]]| declared(v, te, cls.iter().copied());
        let v11 = Version::HTTP_11;
        assert_eq!(d(v11, None, &[]), Ok(Declared::Nothing));
        assert_eq!(d(v11, None, &[b"5"]), Ok(Declared::Length(5)));
        assert_eq!(d(v11, None, &[b"5, 5", b"5"]), Ok(Declared::Length(5)));
        assert_eq!(d(v11, Some(b"gzip, chunked"), &[]), Ok(Declared::Chunked));
        for (te, cls, why) in [
            (
                None,
                &[&b"5, 6"[..]][..],
                FramingError::ConflictingContentLength,
            ),
            (None, &[b"5", b"6"], FramingError::ConflictingContentLength),
            (None, &[b"+5"], FramingError::InvalidContentLength),
            (None, &[b""], FramingError::InvalidContentLength),
            (
                Some(&b"chunked"[..]),
                &[b"5"],
                FramingError::BothTransferEncodingAndContentLength,
            ),
            (
                Some(b"chunked, gzip"),
                &[],
                FramingError::TransferEncodingNotChunked,
            ),
        ] {
            assert_eq!(d(v11, te, cls), Err(why), "{te:?} {cls:?}");
        }
        assert_eq!(
            d(Version::HTTP_10, Some(b"chunked"), &[]),
            Err(FramingError::TransferEncodingOnHttp10)
        );
    }

    #[test]
    fn chunk_size_lines_are_lowercase_hex() {
        for (n, line) in [
            (0, "0\r\n"),
            (10, "a\r\n"),
            (1000, "3e8\r\n"),
            (65536, "10000\r\n"),
        ] {
            let mut b = BytesMut::new();
            put_chunk_size(&mut b, n);
            assert_eq!(&b[..], line.as_bytes());
        }
    }

    #[test]
    fn errors_blame_the_right_side() {
        let e = FramingError::InvalidChunkSize;
        assert!(e.by_client().is_client());
        assert_eq!(e.by_client().status(), http::StatusCode::BAD_REQUEST);
        assert!(e.by_origin().is_origin());
        assert_eq!(e.by_origin().status(), http::StatusCode::BAD_GATEWAY);
        assert!(FramingError::Truncated.by_origin().is_origin());
        assert!(FramingError::Truncated.by_client().is_client());
    }
}
