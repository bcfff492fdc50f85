//! The load generator's minimal HTTP/1.1 client: URL parsing, the pre-serialised request, and a
//! connection that sends it and reads one response (head parsed by `httparse`; Content-Length,
//! chunked and close-delimited bodies counted, never stored).

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::tls::{Stream, TlsClient};

/// Initial read buffer per connection (bodies are counted, not stored, so this stays small).
const BUF: usize = 16 * 1024;
/// Largest response head accepted (the buffer grows up to this for a big head).
const MAX_HEAD: usize = 64 * 1024;
/// Most response header fields accepted.
const MAX_HEADERS: usize = 64;

/// Where the load goes: a resolved `http://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `host[:port]` as written in the URL (sent as `Host`).
    pub authority: String,
    /// Host name or address without port or brackets.
    pub host: String,
    /// Port (80 when absent).
    pub port: u16,
    /// Request target: path and query, `/` when empty.
    pub path: String,
    /// `https://`.
    pub tls: bool,
}

impl Target {
    /// Parses an `http[s]://host[:port][/path][?query]` URL (no userinfo).
    pub fn parse(url: &str) -> Result<Target, String> {
        let (rest, tls) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(r), _) => (r, false),
            (None, Some(r)) => (r, true),
            _ => {
                return Err(format!(
                    "{url}: only http:// and https:// URLs are supported"
                ))
            }
        };
        let split = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(split);
        let path = path.split('#').next().unwrap_or("");
        let path = match path {
            "" => "/".to_owned(),
            p if p.starts_with('?') => format!("/{p}"),
            p => p.to_owned(),
        };
        if authority.is_empty() || authority.contains('@') {
            return Err(format!("{url}: bad authority"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("{url}: unclosed ["))?;
            (host, after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        let port = match port {
            None if tls => 443,
            None => 80,
            Some(p) => p.parse().map_err(|_| format!("{url}: bad port {p:?}"))?,
        };
        Ok(Target {
            authority: authority.to_owned(),
            host: host.to_owned(),
            port,
            path,
            tls,
        })
    }

    /// Resolves the host (once, before the run) to its first address.
    pub fn resolve(&self) -> Result<SocketAddr, String> {
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| format!("resolving {}: {e}", self.host))?
            .next()
            .ok_or_else(|| format!("{}: no addresses", self.host))
    }

    /// The request bytes sent for every request of a run.
    pub fn request_bytes(
        &self,
        method: &str,
        headers: &[(String, String)],
        close: bool,
    ) -> Vec<u8> {
        let mut req = format!(
            "{method} {} HTTP/1.1\r\nHost: {}\r\n",
            self.path, self.authority
        );
        for (name, value) in headers {
            req.push_str(&format!("{name}: {value}\r\n"));
        }
        if close {
            req.push_str("Connection: close\r\n");
        }
        req.push_str("\r\n");
        req.into_bytes()
    }
}

/// Why a request failed.
#[derive(Debug)]
pub enum ClientError {
    /// Writing the request failed.
    Write(io::Error),
    /// Reading the response failed, or the peer closed before it was complete.
    Read(io::Error),
    /// The response was not valid HTTP/1.x.
    Parse(String),
}

/// One response as the load generator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseInfo {
    /// Status code.
    pub status: u16,
    /// Body bytes after transfer decoding.
    pub body_bytes: u64,
    /// Whether the connection can carry the next request.
    pub keep_alive: bool,
}

/// Body framing of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

/// Incremental decoder of a chunked body that only counts data bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChunkedDecoder {
    state: ChunkState,
    size: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Size,
    SizeDone,
    Data,
    DataEnd,
    TrailerStart,
    TrailerLine,
    TrailerEnd,
    Done,
}

impl ChunkedDecoder {
    /// Feeds bytes; returns `(consumed, data_bytes)`. Stops consuming at the end of the body.
    pub fn feed(&mut self, input: &[u8]) -> Result<(usize, u64), String> {
        let mut i = 0;
        let mut data = 0u64;
        while i < input.len() && self.state != ChunkState::Done {
            let b = input[i];
            match self.state {
                ChunkState::Size => match (b as char).to_digit(16) {
                    Some(d) => {
                        if self.size > (u64::MAX >> 4) {
                            return Err("chunk size overflows".into());
                        }
                        self.size = self.size << 4 | u64::from(d);
                    }
                    None if b == b'\n' => self.state = self.after_size(),
                    None if b == b';' || b == b'\r' || b == b' ' || b == b'\t' => {
                        self.state = ChunkState::SizeDone
                    }
                    None => return Err(format!("bad chunk size byte {b:#04x}")),
                },
                ChunkState::SizeDone => {
                    if b == b'\n' {
                        self.state = self.after_size();
                    }
                }
                ChunkState::Data => {
                    let n = self.size.min((input.len() - i) as u64);
                    self.size -= n;
                    data += n;
                    i += n as usize;
                    if self.size == 0 {
                        self.state = ChunkState::DataEnd;
                    }
                    continue;
                }
                ChunkState::DataEnd => match b {
                    b'\r' => {}
                    b'\n' => self.state = ChunkState::Size,
                    _ => return Err("missing CRLF after chunk data".into()),
                },
                ChunkState::TrailerStart => match b {
                    b'\r' => self.state = ChunkState::TrailerEnd,
                    b'\n' => self.state = ChunkState::Done,
                    _ => self.state = ChunkState::TrailerLine,
                },
                ChunkState::TrailerLine => {
                    if b == b'\n' {
                        self.state = ChunkState::TrailerStart;
                    }
                }
                ChunkState::TrailerEnd => match b {
                    b'\n' => self.state = ChunkState::Done,
                    _ => return Err("bad trailer end".into()),
                },
                ChunkState::Done => {}
            }
            i += 1;
        }
        Ok((i, data))
    }

    fn after_size(&mut self) -> ChunkState {
        if self.size == 0 {
            ChunkState::TrailerStart
        } else {
            ChunkState::Data
        }
    }

    /// Whether the terminating chunk and trailers were read.
    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }
}

/// One keep-alive HTTP/1.1 connection of the load generator.
#[derive(Debug)]
pub struct Conn {
    stream: Stream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Bytes read from the socket so far (heads, bodies and framing).
    pub bytes_read: u64,
}

impl Conn {
    /// Opens a connection (with TCP_NODELAY), and with `tls` completes the TLS handshake.
    pub async fn connect(addr: SocketAddr, tls: Option<&TlsClient>) -> io::Result<Conn> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let stream = match tls {
            None => Stream::Plain(tcp),
            Some(t) => Stream::Tls(Box::new(t.connect(tcp).await?)),
        };
        Ok(Conn {
            stream,
            buf: vec![0; BUF],
            start: 0,
            end: 0,
            bytes_read: 0,
        })
    }

    async fn fill(&mut self) -> Result<usize, ClientError> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let n = self
            .stream
            .read(&mut self.buf[self.end..])
            .await
            .map_err(ClientError::Read)?;
        self.end += n;
        self.bytes_read += n as u64;
        Ok(n)
    }

    /// Sends `request` and reads the whole response. `head` says the request was HEAD (no body).
    pub async fn request(
        &mut self,
        request: &[u8],
        head: bool,
    ) -> Result<ResponseInfo, ClientError> {
        self.stream
            .write_all(request)
            .await
            .map_err(ClientError::Write)?;
        loop {
            let (status, framing, keep_alive) = self.read_head(head).await?;
            if (100..200).contains(&status) && status != 101 {
                continue; // interim response; the real one follows
            }
            let body_bytes = self.read_body(framing).await?;
            let keep_alive = keep_alive && framing != Framing::UntilClose;
            return Ok(ResponseInfo {
                status,
                body_bytes,
                keep_alive,
            });
        }
    }

    async fn read_head(&mut self, head: bool) -> Result<(u16, Framing, bool), ClientError> {
        loop {
            if self.end > self.start {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut resp = httparse::Response::new(&mut headers);
                match resp.parse(&self.buf[self.start..self.end]) {
                    Ok(httparse::Status::Complete(n)) => {
                        let parsed = interpret(&resp, head)?;
                        self.start += n;
                        return Ok(parsed);
                    }
                    Ok(httparse::Status::Partial) => {
                        if self.end - self.start == self.buf.len() {
                            if self.buf.len() >= MAX_HEAD {
                                return Err(ClientError::Parse("response head too large".into()));
                            }
                            self.buf.resize(MAX_HEAD, 0);
                        }
                    }
                    Err(e) => return Err(ClientError::Parse(format!("response head: {e}"))),
                }
            }
            if self.fill().await? == 0 {
                return Err(closed(self.end > self.start));
            }
        }
    }

    async fn read_body(&mut self, framing: Framing) -> Result<u64, ClientError> {
        match framing {
            Framing::None => Ok(0),
            Framing::Length(len) => {
                let mut left = len;
                loop {
                    let take = left.min((self.end - self.start) as u64);
                    self.start += take as usize;
                    left -= take;
                    if left == 0 {
                        return Ok(len);
                    }
                    if self.fill().await? == 0 {
                        return Err(closed(true));
                    }
                }
            }
            Framing::Chunked => {
                let mut decoder = ChunkedDecoder::default();
                let mut total = 0;
                loop {
                    let (used, data) = decoder
                        .feed(&self.buf[self.start..self.end])
                        .map_err(ClientError::Parse)?;
                    self.start += used;
                    total += data;
                    if decoder.is_done() {
                        return Ok(total);
                    }
                    if self.fill().await? == 0 {
                        return Err(closed(true));
                    }
                }
            }
            Framing::UntilClose => {
                let mut total = 0;
                loop {
                    total += (self.end - self.start) as u64;
                    self.start = self.end;
                    if self.fill().await? == 0 {
                        return Ok(total);
                    }
                }
            }
        }
    }

    /// Waits (briefly) for the server to close after a `Connection: close` exchange, so the
    /// server side holds the TIME_WAIT state and churn runs don't exhaust the client's ports.
    pub async fn await_close(mut self) {
        let mut scratch = [0u8; 512];
        while let Ok(n) = self.stream.read(&mut scratch).await {
            if n == 0 {
                break;
            }
            self.bytes_read += n as u64;
        }
    }
}

fn closed(mid_response: bool) -> ClientError {
    let what = if mid_response {
        "connection closed mid-response"
    } else {
        "connection closed before a response"
    };
    ClientError::Read(io::Error::new(io::ErrorKind::UnexpectedEof, what))
}

fn has_token(value: &[u8], token: &str) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// Status, body framing and keep-alive of a parsed response head (RFC 9112 section 6.3).
fn interpret(
    resp: &httparse::Response<'_, '_>,
    head: bool,
) -> Result<(u16, Framing, bool), ClientError> {
    let status = resp.code.unwrap_or(0);
    let http10 = resp.version == Some(0);
    let mut keep_alive = !http10;
    let mut length: Option<u64> = None;
    let mut chunked = false;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let text = std::str::from_utf8(h.value).unwrap_or("").trim();
            let n = text
                .parse::<u64>()
                .map_err(|_| ClientError::Parse(format!("bad content-length {text:?}")))?;
            if length.is_some_and(|l| l != n) {
                return Err(ClientError::Parse("conflicting content-length".into()));
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = has_token(h.value, "chunked");
        } else if h.name.eq_ignore_ascii_case("connection") {
            if has_token(h.value, "close") {
                keep_alive = false;
            } else if has_token(h.value, "keep-alive") {
                keep_alive = true;
            }
        }
    }
    let framing = if head || (100..200).contains(&status) || status == 204 || status == 304 {
        Framing::None
    } else if chunked {
        Framing::Chunked
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        Framing::UntilClose
    };
    Ok((status, framing, keep_alive))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let t = Target::parse("http://127.0.0.1:8080/path?length=1000").unwrap();
        assert_eq!(t.authority, "127.0.0.1:8080");
        assert_eq!((t.host.as_str(), t.port), ("127.0.0.1", 8080));
        assert_eq!(t.path, "/path?length=1000");
        let t = Target::parse("http://example.com").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("example.com", 80, "/")
        );
        let t = Target::parse("http://[::1]:81?x=1#frag").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("::1", 81, "/?x=1")
        );
        assert_eq!(t.authority, "[::1]:81");
        let t = Target::parse("https://localhost/x").unwrap();
        assert_eq!((t.port, t.tls), (443, true));
        for bad in [
            "ftp://x/",
            "x:80",
            "http://",
            "http://h:port/",
            "http://u@h/",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn serialises_the_request_once() {
        let t = Target::parse("http://h:1/a?b").unwrap();
        let hdrs = vec![("X-A".to_owned(), "1".to_owned())];
        assert_eq!(
            t.request_bytes("GET", &hdrs, true),
            b"GET /a?b HTTP/1.1\r\nHost: h:1\r\nX-A: 1\r\nConnection: close\r\n\r\n"
        );
    }

    const BODY: &[u8] =
        b"5;ext=1\r\nhello\r\n10\r\n0123456789abcdef\r\n0\r\nTrailer: x\r\n\r\nNEXT";

    #[test]
    fn chunked_decoder_at_every_split() {
        let end = BODY.len() - 4;
        for split in 0..BODY.len() {
            let mut d = ChunkedDecoder::default();
            let (a, da) = d.feed(&BODY[..split]).unwrap();
            assert_eq!(
                a,
                split.min(end),
                "consumes everything up to the end of the body"
            );
            let (b, db) = d.feed(&BODY[split..]).unwrap();
            assert!(d.is_done());
            assert_eq!(a + b, end, "stops before the next message");
            assert_eq!(da + db, 21);
        }
        let mut d = ChunkedDecoder::default();
        assert_eq!(d.feed(b"0\r\n\r\n").unwrap(), (5, 0));
        assert!(d.is_done());
    }

    #[test]
    fn chunked_decoder_rejects_garbage() {
        assert!(ChunkedDecoder::default().feed(b"zz\r\n").is_err());
        assert!(ChunkedDecoder::default().feed(b"2\r\nabX").is_err());
        assert!(ChunkedDecoder::default()
            .feed(b"fffffffffffffffff\r\n")
            .is_err());
    }

    fn head_of(raw: &[u8], head: bool) -> Result<(u16, Framing, bool), ClientError> {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut resp = httparse::Response::new(&mut headers);
        assert!(resp.parse(raw).unwrap().is_complete());
        interpret(&resp, head)
    }

    #[test]
    fn framing_rules() {
        let f = |raw: &[u8]| head_of(raw, false).unwrap();
        assert_eq!(
            f(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"),
            (200, Framing::Length(5), true)
        );
        assert_eq!(
            f(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 5\r\n\r\n"),
            (200, Framing::Chunked, true)
        );
        assert_eq!(
            f(b"HTTP/1.1 200 OK\r\n\r\n"),
            (200, Framing::UntilClose, true)
        );
        assert_eq!(
            f(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"),
            (204, Framing::None, false)
        );
        assert_eq!(
            f(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n"),
            (200, Framing::Length(1), false)
        );
        assert_eq!(
            head_of(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", true).unwrap(),
            (200, Framing::None, true)
        );
        assert!(head_of(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", false).is_err());
    }
}
