//! Response compression, opt-in per route (`[routes.compression]`): which algorithm a
//! request accepts (`negotiate`), whether a response may be compressed and the head that a
//! compressed response gets (here), and the streaming encoder (`encoder`). The body that
//! runs the encoder over the origin's body is the proxy stage's (`proxy/compressed.rs`).
//!
//! A route without compression never reaches this module: its cost there is one `Option`
//! check per request.

use http::header::{self, HeaderMap, HeaderValue};
use http::StatusCode;
use keymaster_config::{CompressionAlgorithm, CompressionConfig};

use crate::metrics::CompressionMetrics;

mod encoder;
mod negotiate;

pub(crate) use encoder::Encoder;

/// The algorithms keymaster compresses with.
pub(crate) type Algorithm = CompressionAlgorithm;

/// Every algorithm, in the order of [`index`]: metric handles are kept in arrays.
const ALL: [Algorithm; 3] = [Algorithm::Zstd, Algorithm::Brotli, Algorithm::Gzip];

/// The algorithm's place in per-algorithm arrays.
pub(crate) fn index(a: Algorithm) -> usize {
    match a {
        Algorithm::Zstd => 0,
        Algorithm::Brotli => 1,
        Algorithm::Gzip => 2,
    }
}

/// The levels an encoder starts with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Levels {
    pub(crate) gzip: u32,
    pub(crate) brotli: u32,
    pub(crate) zstd: i32,
}

/// A media type pattern, lowercase.
#[derive(Debug)]
enum TypePattern {
    /// `*/*`.
    Any,
    /// `text/html`.
    Exact(String),
    /// `text/*`: the type with its slash, `"text/"`.
    AnySubtype(String),
    /// `application/*+json`: the type with its slash and the suffix.
    Suffix(String, String),
}

impl TypePattern {
    fn compile(p: &str) -> TypePattern {
        let p = p.to_ascii_lowercase();
        match p.split_once("/*") {
            Some(("*", "")) => TypePattern::Any,
            Some((top, "")) => TypePattern::AnySubtype(format!("{top}/")),
            Some((top, suffix)) => TypePattern::Suffix(format!("{top}/"), suffix.to_string()),
            None => TypePattern::Exact(p),
        }
    }

    /// `media`: the type and subtype, without parameters.
    fn matches(&self, media: &str) -> bool {
        let starts = |p: &str| media.len() > p.len() && media[..p.len()].eq_ignore_ascii_case(p);
        match self {
            TypePattern::Any => true,
            TypePattern::Exact(t) => media.eq_ignore_ascii_case(t),
            TypePattern::AnySubtype(top) => starts(top),
            TypePattern::Suffix(top, suffix) => {
                starts(top)
                    && media.len() >= top.len() + suffix.len()
                    && media[media.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
            }
        }
    }
}

/// A route's compression settings, compiled.
pub(crate) struct Policy {
    /// The algorithms offered, in the server's order of preference.
    algorithms: Vec<Algorithm>,
    min_size: u64,
    types: Vec<TypePattern>,
    pub(crate) levels: Levels,
    pub(crate) metrics: CompressionMetrics,
}

/// What the client of one request accepts, for a route that compresses: the algorithm its
/// `Accept-Encoding` picks, if any. (No offer at all: HEAD, an upgrade, gRPC.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offer(pub(crate) Option<Algorithm>);

impl Policy {
    pub(crate) fn compile(
        cfg: &CompressionConfig,
        route: &str,
        m: &crate::metrics::Metrics,
    ) -> Policy {
        Policy {
            algorithms: cfg.algorithms.clone(),
            min_size: cfg.min_size.get(),
            types: cfg
                .content_types
                .iter()
                .map(|t| TypePattern::compile(t))
                .collect(),
            levels: Levels {
                gzip: cfg.gzip_level,
                brotli: cfg.brotli_level,
                zstd: cfg.zstd_level,
            },
            metrics: m.compression(route, ALL.map(Algorithm::token)),
        }
    }

    /// The algorithm the request's `Accept-Encoding` values pick (see `negotiate`).
    pub(crate) fn offer<'a>(&self, accept_encoding: impl Iterator<Item = &'a [u8]>) -> Offer {
        Offer(negotiate::pick(&self.algorithms, accept_encoding))
    }

    /// Whether a response with this status and head may be compressed: not bodiless (1xx,
    /// 204, 304), not a range (206, `Content-Range`), not already encoded, not
    /// `Cache-Control: no-transform`, at least `min_size` when its length is known, and of
    /// a listed media type.
    pub(crate) fn eligible(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        let code = status.as_u16();
        if status.is_informational() || matches!(code, 204 | 206 | 304) {
            return false;
        }
        if headers.contains_key(header::CONTENT_ENCODING)
            || headers.contains_key(header::CONTENT_RANGE)
            || has_token(headers, header::CACHE_CONTROL, "no-transform")
        {
            return false;
        }
        let length = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok());
        if length
            .and_then(|l| l.trim().parse::<u64>().ok())
            .is_some_and(|n| n < self.min_size)
        {
            return false;
        }
        let Some(ct) = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
        else {
            return false;
        };
        let media = ct.split(';').next().unwrap_or("").trim();
        self.types.iter().any(|t| t.matches(media))
    }
}

/// The response's `Content-Length`, if it has one (checked by the HTTP/1.1 client).
pub(crate) fn content_length(headers: &HeaderMap) -> Option<u64> {
    let v = headers.get(header::CONTENT_LENGTH)?;
    v.to_str().ok()?.trim().parse().ok()
}

/// Whether any value of the field `name` lists `token` (comma-separated, any case, a
/// `token=value` counts as the token).
fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.as_bytes().split(|&b| b == b',').any(|t| {
            let t = t.split(|&b| b == b'=').next().unwrap_or(t);
            t.trim_ascii().eq_ignore_ascii_case(token.as_bytes())
        })
    })
}

/// `Vary: Accept-Encoding`, merged into an existing `Vary` (one field; nothing to do when it
/// already names it, or is `*`).
pub(crate) fn add_vary(headers: &mut HeaderMap) {
    if has_token(headers, header::VARY, "accept-encoding") || has_token(headers, header::VARY, "*")
    {
        return;
    }
    let mut merged = Vec::new();
    for v in headers.get_all(header::VARY) {
        let v = v.as_bytes().trim_ascii();
        if !v.is_empty() {
            merged.extend_from_slice(v);
            merged.extend_from_slice(b", ");
        }
    }
    merged.extend_from_slice(b"Accept-Encoding");
    if let Ok(v) = HeaderValue::from_bytes(&merged) {
        headers.insert(header::VARY, v);
    }
}

/// The head of a response compressed with `a`: `Content-Encoding`, no `Content-Length` (the
/// body goes out chunked, or as HTTP/2 DATA frames) or `Accept-Ranges`, and a strong
/// `ETag` made weak (`W/"…"`, as nginx does): the bytes are no longer the origin's.
pub(crate) fn encoded_head(headers: &mut HeaderMap, a: Algorithm) {
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::ACCEPT_RANGES);
    headers.insert(
        header::CONTENT_ENCODING,
        HeaderValue::from_static(a.token()),
    );
    if let Some(etag) = headers.get_mut(header::ETAG) {
        if etag.as_bytes().first() == Some(&b'"') {
            let mut weak = b"W/".to_vec();
            weak.extend_from_slice(etag.as_bytes());
            if let Ok(v) = HeaderValue::from_bytes(&weak) {
                *etag = v;
            }
        }
    }
}

#[cfg(test)]
mod tests;
