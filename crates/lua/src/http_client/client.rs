//! One `ctx.http` exchange: the URL parsed, a pooled connection taken or a new one opened
//! (resolve, admin guard, TCP, TLS, HTTP/1.1 handshake), the request sent and the whole
//! response read, and the connection given back to the worker's pool. All of it runs
//! within the call's timeout.
//!
//! **Reuse and retries.** A pooled connection the server has closed is noticed before it
//! is used (hyper sees the close) and dropped. When the close races with the request, the
//! request is sent again once, on a new connection: always if hyper says it was never
//! written, and otherwise only for idempotent methods (GET, HEAD, PUT, DELETE, OPTIONS,
//! TRACE), which a server may see twice. A request on a new connection is never retried.

use bytes::Bytes;
use http::{header, HeaderMap, Method, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::guard::AdminGuard;
use super::metrics::{HttpMetrics, Outcome};
use super::pool::{self, Conn, Origin};
use super::tls::Trust;

/// What every `ctx.http` call of a config version shares.
pub(crate) struct Client {
    /// A call's timeout when it gives none (`http_timeout`).
    pub timeout: Duration,
    /// The longest timeout a call may ask for (`http_max_timeout`).
    pub max_timeout: Duration,
    pub max_body: usize,
    pub idle_timeout: Duration,
    pub max_idle: usize,
    pub admin: AdminGuard,
    pub trust: Trust,
    pub metrics: Arc<HttpMetrics>,
}

impl Client {
    /// Whether `self` and `other` make the same calls (a worker's VM is kept if so).
    pub(crate) fn same(&self, other: &Client) -> bool {
        self.timeout == other.timeout
            && self.max_timeout == other.max_timeout
            && self.max_body == other.max_body
            && self.idle_timeout == other.idle_timeout
            && self.max_idle == other.max_idle
            && self.admin.allow == other.admin.allow
            && self.admin.configured == other.admin.configured
            && self.trust.id == other.trust.id
            && Arc::ptr_eq(&self.metrics, &other.metrics)
    }
}

/// One call as the script made it.
pub(crate) struct Call {
    pub method: Method,
    pub url: String,
    pub body: Bytes,
    pub headers: HeaderMap,
    pub timeout: Duration,
}

/// A complete response.
pub(crate) struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Why a call failed: its metrics label and the text the script gets.
pub(crate) struct Failure {
    pub outcome: Outcome,
    pub text: String,
}

fn fail(outcome: Outcome, text: impl Into<String>) -> Failure {
    Failure {
        outcome,
        text: text.into(),
    }
}

/// The parsed URL.
struct Target {
    origin: Origin,
    /// `host[:port]` as written: the Host header and error texts.
    authority: String,
    path: Uri,
}

fn target(url: &str, trust: &Trust) -> Result<Target, Failure> {
    let invalid = |e: String| fail(Outcome::Invalid, format!("invalid URL: {e}"));
    let uri: Uri = url.parse().map_err(|e| invalid(format!("{e}")))?;
    let tls = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err(invalid("expected an http:// or https:// URL".into())),
    };
    let authority = uri.authority().ok_or_else(|| invalid("no host".into()))?;
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let pq = uri.path_and_query().map_or("/", |p| p.as_str());
    Ok(Target {
        origin: Origin {
            tls,
            host: host.to_string(),
            port: authority.port_u16().unwrap_or(if tls { 443 } else { 80 }),
            trust: if tls { trust.id } else { 0 },
        },
        authority: authority.as_str().to_string(),
        path: pq.parse().map_err(|e| invalid(format!("{e}")))?,
    })
}

impl Client {
    /// Make the call within its timeout and count how it ended.
    pub(crate) async fn send(&self, call: Call) -> Result<Reply, Failure> {
        let timeout = call.timeout;
        let r = match tokio::time::timeout(timeout, self.exchange(call)).await {
            Ok(r) => r,
            Err(_) => Err(fail(
                Outcome::Timeout,
                format!("timed out after {timeout:?}"),
            )),
        };
        self.metrics.call(match &r {
            Ok(_) => Outcome::Ok,
            Err(f) => f.outcome,
        });
        r
    }

    async fn exchange(&self, call: Call) -> Result<Reply, Failure> {
        let t = target(&call.url, &self.trust)?;
        let mut retried = false;
        loop {
            let pooled = if retried {
                None
            } else {
                self.pooled(&t.origin).await
            };
            let (mut conn, reused) = match pooled {
                Some(c) => (c, true),
                None => (self.open(&t).await?, false),
            };
            let sent = conn.sender.try_send_request(request(&call, &t)).await;
            let resp = match sent {
                Ok(resp) => resp,
                Err(mut e) => {
                    let unsent = e.take_message().is_some();
                    if reused && !retried && (unsent || idempotent(&call.method)) {
                        retried = true;
                        self.metrics.retried();
                        continue;
                    }
                    let why = e.into_error();
                    return Err(fail(
                        Outcome::Error,
                        format!("request to {}: {why}", t.authority),
                    ));
                }
            };
            return self.read(resp, conn, t).await;
        }
    }

    /// The newest idle connection to `origin` that is ready for a request (and still
    /// allowed: the admin guard is checked again).
    async fn pooled(&self, origin: &Origin) -> Option<Conn> {
        while let Some(mut c) = pool::take(origin) {
            if self.admin.refuses(c.peer) || c.sender.ready().await.is_err() {
                continue;
            }
            self.metrics.reused(origin.tls);
            return Some(c);
        }
        None
    }

    /// A new connection: resolve, check, connect, TLS, HTTP/1.1 handshake.
    async fn open(&self, t: &Target) -> Result<Conn, Failure> {
        let o = &t.origin;
        let (tcp, peer) = connect(&o.host, o.port, &t.authority, &self.admin).await?;
        let _ = tcp.set_nodelay(true);
        let sender = if o.tls {
            let tls = self.trust.handshake(&o.host, tcp).await.map_err(|e| {
                fail(
                    Outcome::Tls,
                    format!("TLS handshake with {}: {e}", t.authority),
                )
            })?;
            handshake(TokioIo::new(tls), &t.authority).await?
        } else {
            handshake(TokioIo::new(tcp), &t.authority).await?
        };
        self.metrics.opened(o.tls);
        Ok(Conn { sender, peer })
    }

    /// Read the whole body (up to `max_body`), then give the connection back for reuse
    /// unless the server said it closes it.
    async fn read(
        &self,
        resp: http::Response<hyper::body::Incoming>,
        conn: Conn,
        t: Target,
    ) -> Result<Reply, Failure> {
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, self.max_body)
            .collect()
            .await
            .map_err(|e| {
                fail(
                    Outcome::Error,
                    format!("response body from {}: {e}", t.authority),
                )
            })?
            .to_bytes();
        let closes = parts
            .headers
            .get(header::CONNECTION)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        if !closes {
            pool::put(t.origin, conn, self.idle_timeout, self.max_idle);
        }
        Ok(Reply {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    }
}

fn idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS | Method::TRACE
    )
}

/// The request for one attempt (a call may be sent twice).
fn request(call: &Call, t: &Target) -> Request<Full<Bytes>> {
    let mut req = Request::new(Full::new(call.body.clone()));
    *req.method_mut() = call.method.clone();
    *req.uri_mut() = t.path.clone();
    *req.headers_mut() = call.headers.clone();
    if let Ok(h) = header::HeaderValue::from_str(&t.authority) {
        req.headers_mut().insert(header::HOST, h);
    }
    req
}

async fn handshake<T>(io: TokioIo<T>, authority: &str) -> Result<pool::Sender, Failure>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| fail(Outcome::Error, format!("handshake {authority}: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// Connect to the first address of `host:port` the guard allows (each address is checked
/// after it is resolved, and that very address is connected to: no second resolution a
/// rebinding DNS answer could change).
async fn connect(
    host: &str,
    port: u16,
    authority: &str,
    guard: &AdminGuard,
) -> Result<(tokio::net::TcpStream, SocketAddr), Failure> {
    let addrs = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| fail(Outcome::Connect, format!("resolve {authority}: {e}")))?;
    let (mut refused, mut failed) = (false, None);
    for addr in addrs {
        if guard.refuses(addr) {
            refused = true;
            continue;
        }
        match tokio::net::TcpStream::connect(addr).await {
            Ok(stream) => return Ok((stream, addr)),
            Err(e) => failed = Some(e),
        }
    }
    Err(match failed {
        Some(e) => fail(Outcome::Connect, format!("connect {authority}: {e}")),
        None if refused => fail(
            Outcome::Refused,
            format!("refused: {authority} is the admin listener (see [lua] http_allow_admin)"),
        ),
        None => fail(
            Outcome::Connect,
            format!("resolve {authority}: no addresses"),
        ),
    })
}
