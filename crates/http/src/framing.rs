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
pub enum FramingError {
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
    pub fn by_origin(self) -> Error {
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
    pub fn by_client(self) -> Error {
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
pub enum Declared {
    /// Neither field: no body for a request, a body until close for a response.
    Nothing,
    Length(u64),
    Chunked,
}

/// The declared length (RFC 9112 §6.3) from the last `Transfer-Encoding` value and every
/// `Content-Length` value. Ambiguity is an error: both fields, differing lengths, a
/// `Transfer-Encoding` not ending in `chunked` or on HTTP/1.0. A list of identical lengths
/// is one length (RFC 9110 §8.6).
pub fn declared<'a>(
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

/// What the body decoder produced from the buffer (`D`: a piece of the body, or only its
/// length when the bytes are checked in place, see [`Input`]).
#[derive(Debug)]
pub enum Step<D = Bytes> {
    Data(D),
    Trailers(HeaderMap),
    /// The body is complete.
    End,
    /// More bytes are needed.
    More,
}

/// Where a chunked body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk {
    Size,
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    Trailers,
}

/// Where the decoder takes its bytes from: a read buffer, whose body bytes come out as
/// [`Bytes`] without a copy, or a slice that is only checked ([`Decoder::check`]), whose
/// body bytes come out as their length.
pub trait Input {
    type Data;
    fn bytes(&self) -> &[u8];
    /// Drop `n` bytes off the front.
    fn skip(&mut self, n: usize);
    /// Take `n` bytes of body off the front.
    fn take(&mut self, n: usize) -> Self::Data;
}

impl Input for BytesMut {
    type Data = Bytes;
    fn bytes(&self) -> &[u8] {
        self
    }
    fn skip(&mut self, n: usize) {
        self.advance(n);
    }
    fn take(&mut self, n: usize) -> Bytes {
        self.split_to(n).freeze()
    }
}

impl Input for &[u8] {
    type Data = usize;
    fn bytes(&self) -> &[u8] {
        self
    }
    fn skip(&mut self, n: usize) {
        *self = &self[n..];
    }
    fn take(&mut self, n: usize) -> usize {
        self.skip(n);
        n
    }
}

/// What [`Decoder::check`] found in the bytes at hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// The body ends in them: `len` bytes of body, framing included `used` bytes.
    Complete { len: u64, used: usize },
    /// Well formed so far; more is to come.
    Incomplete,
}

/// A body's decoder: takes body bytes off the front of the read buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoder {
    Length(u64),
    Chunked(Chunk),
    /// Until the peer closes (responses only).
    Close,
    Done,
}

impl Decoder {
    /// A decoder for a body of `n` bytes (done at once for 0).
    pub fn length(n: u64) -> Decoder {
        if n == 0 {
            Decoder::Done
        } else {
            Decoder::Length(n)
        }
    }

    pub fn chunked() -> Decoder {
        Decoder::Chunked(Chunk::Size)
    }

    pub fn is_done(&self) -> bool {
        *self == Decoder::Done
    }

    /// Bytes still expected, when the length is known.
    pub fn remaining(&self) -> Option<u64> {
        match self {
            Decoder::Length(n) => Some(*n),
            Decoder::Done => Some(0),
            _ => None,
        }
    }

    /// Decode the next piece of the body from `buf`.
    pub fn decode<I: Input>(&mut self, buf: &mut I) -> Result<Step<I::Data>, FramingError> {
        loop {
            let len = buf.bytes().len();
            match self {
                Decoder::Done => return Ok(Step::End),
                Decoder::Length(n) => {
                    if len == 0 {
                        return Ok(Step::More);
                    }
                    let take = (*n).min(len as u64) as usize;
                    *n -= take as u64;
                    if *n == 0 {
                        *self = Decoder::Done;
                    }
                    return Ok(Step::Data(buf.take(take)));
                }
                Decoder::Close => {
                    if len == 0 {
                        return Ok(Step::More);
                    }
                    return Ok(Step::Data(buf.take(len)));
                }
                Decoder::Chunked(Chunk::Size) => {
                    let Some(lf) = memchr::memchr(b'\n', buf.bytes()) else {
                        if len > MAX_CHUNK_LINE {
                            return Err(FramingError::ChunkLineTooLong);
                        }
                        return Ok(Step::More);
                    };
                    if lf > MAX_CHUNK_LINE {
                        return Err(FramingError::ChunkLineTooLong);
                    }
                    let size = chunk_size(&buf.bytes()[..lf])?;
                    buf.skip(lf + 1);
                    *self = Decoder::Chunked(if size == 0 {
                        Chunk::Trailers
                    } else {
                        Chunk::Data(size)
                    });
                }
                Decoder::Chunked(Chunk::Data(n)) => {
                    if len == 0 {
                        return Ok(Step::More);
                    }
                    let take = (*n).min(len as u64) as usize;
                    *n -= take as u64;
                    let data = buf.take(take);
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
                    if len < 2 {
                        return Ok(Step::More);
                    }
                    if buf.bytes().starts_with(b"\r\n") {
                        buf.skip(2);
                        *self = Decoder::Done;
                        return Ok(Step::End);
                    }
                    let Some((used, trailers)) = trailers(buf.bytes())? else {
                        return Ok(Step::More);
                    };
                    buf.skip(used);
                    *self = Decoder::Done;
                    return Ok(Step::Trailers(trailers));
                }
            }
        }
    }

    /// Decode what `buf` holds without taking it: whether its framing is broken, or the body
    /// ends in it. A request body that came with its head is checked so before the head
    /// goes anywhere: a framing error then never reaches an origin.
    pub fn check(mut self, buf: &[u8]) -> Result<Checked, FramingError> {
        let mut rest = buf;
        let mut len = 0u64;
        loop {
            match self.decode(&mut rest)? {
                Step::Data(n) => len += n as u64,
                Step::Trailers(_) | Step::End => {
                    let used = buf.len() - rest.len();
                    return Ok(Checked::Complete { len, used });
                }
                Step::More => return Ok(Checked::Incomplete),
            }
        }
    }

    /// In `DataEnd`: consume the CRLF if it is there. `Ok(false)`: not yet.
    fn skip_data_end<I: Input>(&mut self, buf: &mut I) -> Result<bool, FramingError> {
        let bytes = buf.bytes();
        if bytes.len() < 2 {
            // A lone byte that cannot start a CRLF is already an overrun.
            if bytes.first().is_some_and(|&b| b != b'\r') {
                return Err(FramingError::ChunkOverrun);
            }
            return Ok(false);
        }
        if !bytes.starts_with(b"\r\n") {
            return Err(FramingError::ChunkOverrun);
        }
        buf.skip(2);
        *self = Decoder::Chunked(Chunk::Size);
        Ok(true)
    }

    /// The peer closed the connection: the end of a close-delimited body, otherwise a
    /// truncated one.
    pub fn on_eof(&mut self) -> Result<Step, FramingError> {
        match self {
            Decoder::Close | Decoder::Done => {
                *self = Decoder::Done;
                Ok(Step::End)
            }
            _ => Err(FramingError::Truncated),
        }
    }
}

/// A trailer section at the front of `buf` (it does not start with the empty line): its
/// length and fields, or `None` while it is incomplete.
fn trailers(buf: &[u8]) -> Result<Option<(usize, HeaderMap)>, FramingError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_TRAILER_FIELDS];
    match httparse::parse_headers(buf, &mut slots) {
        // Too large however it arrived (in pieces it would be refused before its end).
        Ok(httparse::Status::Complete((len, _))) if len > MAX_TRAILERS => {
            Err(FramingError::TrailersTooLarge)
        }
        Ok(httparse::Status::Complete((len, fields))) => {
            let mut trailers = HeaderMap::with_capacity(fields.len());
            for f in fields {
                let name = HeaderName::from_bytes(f.name.as_bytes())
                    .map_err(|_| FramingError::InvalidTrailers)?;
                let value =
                    HeaderValue::from_bytes(f.value).map_err(|_| FramingError::InvalidTrailers)?;
                trailers.append(name, value);
            }
            Ok(Some((len, trailers)))
        }
        Ok(httparse::Status::Partial) if buf.len() > MAX_TRAILERS => {
            Err(FramingError::TrailersTooLarge)
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(_) => Err(FramingError::InvalidTrailers),
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
pub fn put_chunk_size(dst: &mut BytesMut, len: usize) {
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
mod fuzz;

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
