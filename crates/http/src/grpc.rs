//! gRPC awareness on the proxy path: recognising a gRPC call and reading its
//! `grpc-timeout` (the client's deadline, which becomes the request deadline). gRPC-shaped
//! error responses are built in the gateway's `respond` module, like every error response.

use http::header::{HeaderMap, CONTENT_TYPE};
use std::time::Duration;

/// A gRPC call: `content-type: application/grpc` or `application/grpc+<codec>`.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    crate::headers::find(headers, &CONTENT_TYPE).is_some_and(|v| is_grpc_content_type(v.as_bytes()))
}

/// Whether a `content-type` value names gRPC.
pub fn is_grpc_content_type(value: &[u8]) -> bool {
    let ct = value.trim_ascii();
    ct.len() >= 16
        && ct[..16].eq_ignore_ascii_case(b"application/grpc")
        && matches!(ct.get(16), None | Some(b'+') | Some(b';'))
}

/// The `grpc-timeout` header: 1 to 8 ASCII digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`).
/// An invalid value is ignored (gRPC servers treat it the same way).
pub fn timeout(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get("grpc-timeout")?.as_bytes();
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b"H" => Duration::from_secs(n * 3600),
        b"M" => Duration::from_secs(n * 60),
        b"S" => Duration::from_secs(n),
        b"m" => Duration::from_millis(n),
        b"u" => Duration::from_micros(n),
        b"n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn h(name: &'static str, v: &'static str) -> HeaderMap {
        let mut m = HeaderMap::new();
        m.insert(name, HeaderValue::from_static(v));
        m
    }

    #[test]
    fn recognises_grpc_content_types() {
        assert!(is_grpc(&h("content-type", "application/grpc")));
        assert!(is_grpc(&h("content-type", "application/grpc+proto")));
        assert!(is_grpc(&h("content-type", "Application/GRPC; charset=x")));
        assert!(!is_grpc(&h("content-type", "application/grpc-web")));
        assert!(!is_grpc(&h("content-type", "application/json")));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn parses_grpc_timeout() {
        let t = |v| timeout(&h("grpc-timeout", v));
        assert_eq!(t("5S"), Some(Duration::from_secs(5)));
        assert_eq!(t("250m"), Some(Duration::from_millis(250)));
        assert_eq!(t("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(t("1M"), Some(Duration::from_secs(60)));
        assert_eq!(t("100u"), Some(Duration::from_micros(100)));
        assert_eq!(t("7n"), Some(Duration::from_nanos(7)));
        assert_eq!(t("123456789S"), None);
        assert_eq!(t("S"), None);
        assert_eq!(t("5s"), None);
        assert_eq!(t("-5S"), None);
        assert_eq!(t(""), None);
    }
}
