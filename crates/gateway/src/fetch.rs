//! Control-plane GETs: a JWKS document, a registry's service list. One request over
//! HTTP/1.1 on a fresh connection, cleartext or TLS (rustls with the ring provider; roots
//! from `ca` or the compiled-in Mozilla set). The whole exchange (name lookup, connect,
//! handshake, request and body) is bounded by a timeout and the body by `max_size`.
//! Credentials in the URL become basic authentication. Redirects are not followed.
//!
//! Never on a request's path: the threads that keep key sets and server lists call it.

use base64::Engine as _;
use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, HOST, USER_AGENT};
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use keymaster_http::pem::client_roots;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Why a fetch failed: a result label (`error`, `timeout`, `status`, `too_large`) and a
/// message.
pub(crate) type Failure = (&'static str, String);

/// An answer: its status, header fields and whole body.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

/// One configured URL's HTTP side.
pub(crate) struct Fetcher {
    uri: Uri,
    /// `host:port` to connect to (IPv6 in brackets).
    authority: String,
    tls: Option<(TlsConnector, ServerName<'static>)>,
    timeout: Duration,
    max_size: usize,
    /// Sent with every request: `Accept`, basic authentication from the URL, tokens.
    headers: HeaderMap,
}

impl Fetcher {
    /// A fetcher of `url` (validated already). Errors (an unreadable `ca` file) start with
    /// `key`, the config key path of the table.
    pub(crate) fn new(
        url: &str,
        ca: Option<&str>,
        timeout: Duration,
        max_size: u64,
        key: &str,
    ) -> Result<Fetcher, String> {
        let uri: Uri = url.parse().map_err(|e| format!("{key}.url: {e}"))?;
        let https = uri.scheme_str() == Some("https");
        let host = uri.host().ok_or(format!("{key}.url: no host"))?.to_string();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = if https {
            let bare = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let name = ServerName::try_from(bare).map_err(|e| format!("{key}.url: {e}"))?;
            Some((connector(ca, key)?, name))
        } else {
            None
        };
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        headers.insert(
            USER_AGENT,
            HeaderValue::from_static(concat!("keymaster/", env!("CARGO_PKG_VERSION"))),
        );
        if let Some(auth) = basic_auth(&uri) {
            headers.insert(AUTHORIZATION, auth);
        }
        Ok(Fetcher {
            authority: format!("{host}:{port}"),
            uri,
            tls,
            timeout,
            max_size: usize::try_from(max_size).unwrap_or(usize::MAX),
            headers,
        })
    }

    /// Send `name: value` with every request (a malformed value is left out: validation
    /// refuses them).
    pub(crate) fn header(mut self, name: HeaderName, value: &str) -> Fetcher {
        if let Ok(v) = HeaderValue::from_str(value) {
            self.headers.insert(name, v);
        }
        self
    }

    /// The path of the configured URL, without a trailing `/` (a base that paths extend).
    pub(crate) fn base_path(&self) -> &str {
        self.uri.path().trim_end_matches('/')
    }

    /// The configured URL's body, within the timeout.
    pub(crate) async fn fetch(&self) -> Result<Bytes, Failure> {
        let path = self
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        self.get(&path, Duration::ZERO).await.map(|a| a.body)
    }

    /// GET `path_and_query` on the URL's server; the timeout is the configured one plus
    /// `longer` (a blocking query's wait). Any status but 200 is a failure.
    pub(crate) async fn get(
        &self,
        path_and_query: &str,
        longer: Duration,
    ) -> Result<Answer, Failure> {
        let answer = self
            .get_any(path_and_query, longer, &HeaderMap::new())
            .await?;
        if answer.status != StatusCode::OK {
            return Err(("status", format!("HTTP {}", answer.status)));
        }
        Ok(answer)
    }

    /// [`Fetcher::get`] with `extra` header fields, any status accepted.
    pub(crate) async fn get_any(
        &self,
        path_and_query: &str,
        longer: Duration,
        extra: &HeaderMap,
    ) -> Result<Answer, Failure> {
        self.bounded(
            longer,
            self.connect_and_send(path_and_query, extra, Read::Whole),
        )
        .await
        .map(|(answer, _)| answer)
    }

    /// GET a stream of lines (a watch) and return its first line once it is in, or `None`
    /// when the stream ends without one. A status other than 200 is a failure.
    pub(crate) async fn first_line(
        &self,
        path_and_query: &str,
        longer: Duration,
        extra: &HeaderMap,
    ) -> Result<Option<Bytes>, Failure> {
        let (answer, complete) = self
            .bounded(
                longer,
                self.connect_and_send(path_and_query, extra, Read::FirstLine),
            )
            .await?;
        if answer.status != StatusCode::OK {
            return Err(("status", format!("HTTP {}", answer.status)));
        }
        Ok((!complete || !answer.body.is_empty()).then_some(answer.body))
    }

    async fn bounded<T>(
        &self,
        longer: Duration,
        work: impl std::future::Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        let limit = self.timeout + longer;
        match tokio::time::timeout(limit, work).await {
            Ok(r) => r,
            Err(_) => Err(("timeout", format!("no answer within {limit:?}"))),
        }
    }

    async fn connect_and_send(
        &self,
        path: &str,
        extra: &HeaderMap,
        read: Read,
    ) -> Result<(Answer, bool), Failure> {
        let tcp = TcpStream::connect(&self.authority)
            .await
            .map_err(|e| ("error", format!("connect {}: {e}", self.authority)))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => self.exchange(tcp, path, extra, read).await,
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|e| ("error", format!("TLS with {}: {e}", self.authority)))?;
                self.exchange(tls, path, extra, read).await
            }
        }
    }

    /// One request on a fresh connection, driven here (no task outlives the fetch). The
    /// answer, and whether its body was read to its end.
    async fn exchange<S>(
        &self,
        io: S,
        path: &str,
        extra: &HeaderMap,
        read: Read,
    ) -> Result<(Answer, bool), Failure>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let failed = |e: hyper::Error| ("error", e.to_string());
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(failed)?;
        let host = self.uri.host().unwrap_or_default();
        let host = match self.uri.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        };
        let mut request = Request::get(path)
            .header(HOST, host)
            .body(Empty::<Bytes>::new())
            .map_err(|e| ("error", e.to_string()))?;
        request.headers_mut().extend(self.headers.clone());
        request.headers_mut().extend(extra.clone());
        let work = async {
            let response = send.send_request(request).await.map_err(failed)?;
            let (parts, body) = response.into_parts();
            let (body, complete) = match read {
                Read::Whole => (self.whole(body).await?, true),
                Read::FirstLine => self.line(body).await?,
            };
            let answer = Answer {
                status: parts.status,
                headers: parts.headers,
                body,
            };
            Ok((answer, complete))
        };
        tokio::pin!(work, conn);
        tokio::select! {
            r = &mut work => r,
            // The connection ended first: what it delivered is in the body already.
            _ = &mut conn => work.await,
        }
    }

    async fn whole(&self, body: hyper::body::Incoming) -> Result<Bytes, Failure> {
        match Limited::new(body, self.max_size).collect().await {
            Ok(b) => Ok(b.to_bytes()),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(self.too_large()),
            Err(e) => Err(("error", e.to_string())),
        }
    }

    /// The body up to its first line feed (excluded), and whether the body ended there.
    async fn line(&self, mut body: hyper::body::Incoming) -> Result<(Bytes, bool), Failure> {
        let mut buf = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ("error", e.to_string()))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buf.extend_from_slice(&data);
            if let Some(end) = buf.iter().position(|b| *b == b'\n') {
                buf.truncate(end);
                return Ok((buf.into(), false));
            }
            if buf.len() > self.max_size {
                return Err(self.too_large());
            }
        }
        Ok((buf.into(), true))
    }

    fn too_large(&self) -> Failure {
        (
            "too_large",
            format!("the answer is over {} bytes", self.max_size),
        )
    }
}

/// How much of an answer's body is read.
#[derive(Clone, Copy)]
enum Read {
    Whole,
    FirstLine,
}

/// `Authorization: Basic` from the URL's `user:password@` (percent-decoded), if any.
fn basic_auth(uri: &Uri) -> Option<HeaderValue> {
    let authority = uri.authority()?.as_str();
    let (userinfo, _) = authority.rsplit_once('@')?;
    let decoded = percent_encoding::percent_decode_str(userinfo).collect::<Vec<u8>>();
    let encoded = base64::engine::general_purpose::STANDARD.encode(decoded);
    HeaderValue::from_str(&format!("Basic {encoded}")).ok()
}

/// A TLS client for HTTP/1.1 trusting `ca` (a PEM file) or the Mozilla roots.
fn connector(ca: Option<&str>, key: &str) -> Result<TlsConnector, String> {
    let roots = client_roots(ca, |_| {}).map_err(|e| format!("{key}.ca: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("{key}: TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}
