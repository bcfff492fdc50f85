//! The one place where an [`Error`] becomes an HTTP response to the client.

use http::header::{self, HeaderName, HeaderValue};
use http::{Response, Version};

use crate::proxy::ResponseBody;
use keymaster_http::error::Error;

/// Build the client's response for `err`. Client-side framing errors and oversized bodies
/// close the connection: the rest of the byte stream cannot be trusted or is not worth reading.
pub(crate) fn error_response(
    err: &Error,
    request_id: Option<(&HeaderName, &HeaderValue)>,
    via: &HeaderValue,
) -> Response<ResponseBody> {
    let status = err.status();
    let text = format!(
        "{} {}: {}\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        err.detail()
    );
    let mut resp = Response::new(ResponseBody::full(text));
    *resp.status_mut() = status;
    *resp.version_mut() = Version::HTTP_11;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if err.is_origin() {
        h.insert(header::VIA, via.clone());
    }
    if let Some((name, value)) = request_id {
        h.insert(name.clone(), value.clone());
    }
    if let Some(secs) = err.retry_after() {
        h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if err.is_client() {
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// The response for a gRPC call the gateway itself failed: HTTP 200, `application/grpc`, and
/// the status in `grpc-status` / `grpc-message` ("trailers-only": headers and an empty body,
/// which a gRPC client reads as the call's final status). See [`Error::grpc_status`].
pub(crate) fn grpc_error_response(
    err: &Error,
    request_id: Option<(&HeaderName, &HeaderValue)>,
    via: &HeaderValue,
) -> Response<ResponseBody> {
    let mut resp = Response::new(ResponseBody::full(bytes::Bytes::new()));
    *resp.version_mut() = Version::HTTP_11;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    grpc_status_fields(err, h);
    if err.is_origin() {
        h.insert(header::VIA, via.clone());
    }
    if let Some((name, value)) = request_id {
        h.insert(name.clone(), value.clone());
    }
    resp
}

/// The trailers that end a gRPC response the gateway cuts short (the request deadline passed
/// while the origin's response was streaming): `grpc-status` and `grpc-message`.
pub(crate) fn grpc_trailers(err: &Error) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    grpc_status_fields(err, &mut h);
    h
}

fn grpc_status_fields(err: &Error, h: &mut http::HeaderMap) {
    h.insert(
        HeaderName::from_static("grpc-status"),
        HeaderValue::from(u16::from(err.grpc_status())),
    );
    let message = format!("keymaster: {} ({})", err.detail(), err.category());
    if let Ok(v) = HeaderValue::from_str(&percent_encode(&message)) {
        h.insert(HeaderName::from_static("grpc-message"), v);
    }
}

/// gRPC's grpc-message encoding: bytes outside printable ASCII, and `%`, as `%XX`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
