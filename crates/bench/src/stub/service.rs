//! The stub origin's request handler and its response body type.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE, VARY};
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::content::{block, cached_gzip, stub_body_gzip};
use super::params::{bodyless, StubParams};

/// Frame size used for `chunked=1` responses (so a few kilobytes already span several chunks).
const CHUNK: usize = 4096;
/// Largest frame handed to hyper for Content-Length responses.
const MAX_FRAME: usize = 256 * 1024;
/// Uncached gzip bodies above this size are compressed on the blocking pool.
const INLINE_GZIP: usize = 64 * 1024;

/// A stub response body: cyclic slices of a shared buffer, an echoed request body, or nothing.
#[derive(Debug)]
pub enum StubBody {
    /// No body.
    Empty,
    /// `remaining` bytes taken cyclically from `data` starting at `pos`, in frames of at most
    /// `frame` bytes. `exact` makes hyper send Content-Length, otherwise chunked coding.
    Slices {
        /// Source buffer, repeated as needed.
        data: Bytes,
        /// Offset of the next frame in `data`.
        pos: usize,
        /// Bytes left to send.
        remaining: u64,
        /// Largest frame.
        frame: usize,
        /// Whether the size hint is exact.
        exact: bool,
    },
    /// The request body, streamed back (always chunked on HTTP/1.1).
    Echo(Incoming),
}

impl StubBody {
    fn slices(data: Bytes, len: u64, chunked: bool) -> StubBody {
        if len == 0 || data.is_empty() {
            return if chunked {
                // An empty chunked body: size unknown so hyper still uses chunked coding.
                StubBody::Slices {
                    data: Bytes::new(),
                    pos: 0,
                    remaining: 0,
                    frame: CHUNK,
                    exact: false,
                }
            } else {
                StubBody::Empty
            };
        }
        StubBody::Slices {
            data,
            pos: 0,
            remaining: len,
            frame: if chunked { CHUNK } else { MAX_FRAME },
            exact: !chunked,
        }
    }
}

impl Body for StubBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            StubBody::Empty => Poll::Ready(None),
            StubBody::Slices {
                data,
                pos,
                remaining,
                frame,
                ..
            } => {
                if *remaining == 0 || data.is_empty() {
                    return Poll::Ready(None);
                }
                let n = (*remaining).min((*frame).min(data.len() - *pos) as u64) as usize;
                let chunk = data.slice(*pos..*pos + n);
                *pos = (*pos + n) % data.len();
                *remaining -= n as u64;
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
            StubBody::Echo(incoming) => Pin::new(incoming).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            StubBody::Empty => true,
            StubBody::Slices {
                remaining, exact, ..
            } => *exact && *remaining == 0,
            StubBody::Echo(incoming) => incoming.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            StubBody::Empty => SizeHint::with_exact(0),
            StubBody::Slices {
                remaining, exact, ..
            } => {
                if *exact {
                    SizeHint::with_exact(*remaining)
                } else {
                    SizeHint::default()
                }
            }
            // Never exact, so HTTP/1.1 echoes use chunked coding.
            StubBody::Echo(_) => SizeHint::default(),
        }
    }
}

fn full(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<StubBody> {
    let len = body.len() as u64;
    let mut resp = Response::new(StubBody::slices(body, len, false));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// Handles one request. Never fails: bad parameters get a 400 with a one-line reason.
pub async fn handle(req: Request<Incoming>) -> Result<Response<StubBody>, Infallible> {
    let params = match StubParams::parse(req.uri().query()) {
        Ok(p) => p,
        Err(msg) => {
            let body = Bytes::from(msg + "\n");
            return Ok(full(
                StatusCode::BAD_REQUEST,
                "text/plain; charset=utf-8",
                body,
            ));
        }
    };
    let delay = params.pick_delay(&mut fastrand::Rng::new());
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if req.uri().path() == "/__inspect" {
        return Ok(inspect(req).await);
    }
    if params.echo {
        let mut resp = Response::new(StubBody::Echo(req.into_body()));
        resp.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        return Ok(resp);
    }
    Ok(content(&req, &params).await)
}

async fn content(req: &Request<Incoming>, params: &StubParams) -> Response<StubBody> {
    // `parse` guarantees 200..=999, which `from_u16` accepts.
    let status = StatusCode::from_u16(params.status).unwrap_or(StatusCode::OK);
    if bodyless(params.status, false) {
        let mut resp = Response::new(StubBody::Empty);
        *resp.status_mut() = status;
        return resp;
    }
    let accept = req.headers().get_all(ACCEPT_ENCODING);
    let gzip = params.wants_gzip(accept.iter().map(HeaderValue::as_bytes));
    let body = if gzip {
        let gz = match cached_gzip(params.length) {
            Some(gz) => gz,
            None if params.length <= INLINE_GZIP => stub_body_gzip(params.length),
            None => {
                let length = params.length;
                match tokio::task::spawn_blocking(move || stub_body_gzip(length)).await {
                    Ok(gz) => gz,
                    Err(_) => {
                        let msg = Bytes::from_static(b"gzip failed\n");
                        return full(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", msg);
                    }
                }
            }
        };
        let len = gz.len() as u64;
        StubBody::slices(gz, len, params.chunked)
    } else {
        StubBody::slices(block().clone(), params.length as u64, params.chunked)
    };
    // A HEAD response keeps the GET headers: hyper writes Content-Length from the size hint and
    // does not send the body.
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(VARY, HeaderValue::from_static("Accept-Encoding"));
    if gzip {
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    resp
}

/// `/__inspect`: the request as the stub saw it, as JSON.
async fn inspect(req: Request<Incoming>) -> Response<StubBody> {
    let (parts, body) = req.into_parts();
    let mut body_len: u64 = 0;
    let mut body = body;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    body_len += data.len() as u64;
                }
            }
            Err(e) => {
                let msg = Bytes::from(format!("reading request body: {e}\n"));
                return full(StatusCode::BAD_REQUEST, "text/plain", msg);
            }
        }
    }
    let headers: Vec<[String; 2]> = parts
        .headers
        .iter()
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            [name.as_str().to_owned(), value]
        })
        .collect();
    let json = serde_json::json!({
        "method": parts.method.as_str(),
        "uri": parts.uri.to_string(),
        "version": format!("{:?}", parts.version),
        "headers": headers,
        "body_len": body_len,
    });
    let mut out = json.to_string();
    out.push('\n');
    full(StatusCode::OK, "application/json", Bytes::from(out))
}
