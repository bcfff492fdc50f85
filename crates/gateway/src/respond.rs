//! The one place where an [`Error`] becomes an HTTP response to the client.

use http::header::{self, HeaderName, HeaderValue};
use http::{Response, Version};

use crate::body::ResponseBody;
use crate::error::Error;

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
