//! Header duties of a proxy (RFC 9110 §7.6, RFC 9112 §6.3/§11): request head validation
//! beyond what the parsers check, hop-by-hop removal in both directions, `Via`, `X-Forwarded-*`,
//! RFC 7239 `Forwarded`, request ids and header edits.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Version};

use crate::error::{Error, Kind};

mod edits;
mod forwarding;
mod wire;
pub use edits::HeaderEdits;
pub use forwarding::{
    add_forwarding, client_address, new_request_id, AddedFields, ClientFacts, Stamps, TlsFacts,
};
pub use wire::{ClientLength, CompiledField, NameSummary, RawHead, RawRequestFields, WireHead};

/// A listener's limits on request heads.
pub struct HeadLimits {
    /// The longest request line (method, target, version; without its line end): 414.
    pub max_request_line: usize,
    /// The most bytes of header fields (name, value, ": " and CRLF each): 431.
    pub max_header_bytes: usize,
    /// The most header fields: 431.
    pub max_headers: usize,
}

impl HeadLimits {
    /// The most bytes a request head can take on the wire: a buffer holding more without
    /// the head's end is refused (431).
    pub fn max_head(&self) -> usize {
        self.max_request_line + self.max_header_bytes + 8
    }
}

/// What one pass over a header map found: size, framing fields and hop-by-hop fields.
/// Scanning once lets the common request (no hop-by-hop fields, one Host, no body framing)
/// skip every further lookup.
#[derive(Debug, Default, Clone, Copy)]
pub struct HeadScan {
    /// Bytes of the header section as sent (name + value + ": " + CRLF per field).
    pub bytes: usize,
    pub hosts: usize,
    pub content_length: bool,
    pub transfer_encoding: bool,
    pub connection: bool,
    /// `Expect` is present (requests: answered by the listener, not forwarded).
    pub expect: bool,
    /// Which hop-by-hop fields (Connection, TE, Transfer-Encoding, Upgrade, Keep-Alive,
    /// Proxy-Connection) are present: bit `i` for `HOP_BY_HOP[i]`.
    hop_fields: u8,
    /// Any forwarding field (X-Forwarded-For, -Proto, -Host, Forwarded) is present.
    pub forwarding: bool,
}

impl HeadScan {
    pub fn of(headers: &HeaderMap) -> HeadScan {
        let mut s = HeadScan::default();
        for (name, value) in headers {
            s.bytes += name.as_str().len() + value.len() + 4;
            s.note(name);
        }
        s
    }

    /// Record what the field `name` means for the scan; `false` if nothing.
    fn note(&mut self, name: &HeaderName) -> bool {
        self.note_name(name.as_str().as_bytes())
    }

    /// [`HeadScan::note`] for a name as sent (any case).
    pub fn note_name(&mut self, name: &[u8]) -> bool {
        let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
        match name.len() {
            4 if is(b"host") => self.hosts += 1,
            14 if is(b"content-length") => self.content_length = true,
            17 if is(b"transfer-encoding") => {
                self.transfer_encoding = true;
                self.hop(2);
            }
            10 if is(b"connection") => {
                self.connection = true;
                self.hop(0);
            }
            2 if is(b"te") => self.hop(1),
            7 if is(b"upgrade") => self.hop(3),
            10 if is(b"keep-alive") => self.hop(4),
            16 if is(b"proxy-connection") => self.hop(5),
            6 if is(b"expect") => self.expect = true,
            15 if is(b"x-forwarded-for") => self.forwarding = true,
            17 if is(b"x-forwarded-proto") => self.forwarding = true,
            16 if is(b"x-forwarded-host") => self.forwarding = true,
            9 if is(b"forwarded") => self.forwarding = true,
            _ => return false,
        }
        true
    }

    /// The Connection field does not go on (it carried only options for the client's
    /// hop, see [`RawRequestFields::leave_out_connection`]): nothing of it is left to strip,
    /// nor to look at for an upgrade.
    pub fn connection_left_out(&mut self) {
        self.connection = false;
        self.hop_fields &= !1;
    }

    /// Any hop-by-hop field is present.
    pub fn hop_by_hop(&self) -> bool {
        self.hop_fields != 0
    }

    /// The hop-by-hop field `HOP_BY_HOP[i]` is present.
    fn hop(&mut self, i: usize) {
        self.hop_fields |= 1 << i;
    }
}

/// What keymaster's HTTP/1.1 server noted while parsing a request head that it kept in wire
/// form ([`RawRequestFields`]): the scan, and the fields the proxy stage looks up first.
#[derive(Debug, Default)]
pub struct HeadFacts {
    pub scan: HeadScan,
    /// The first Host field.
    pub host: Option<HeaderValue>,
    /// The listener's request-id field, as the client sent it.
    pub request_id: Option<HeaderValue>,
    /// The content type names gRPC.
    pub grpc: bool,
}

impl HeadFacts {
    /// The facts of a head given as a map.
    pub fn of(headers: &HeaderMap, request_id: &HeaderName) -> HeadFacts {
        HeadFacts {
            scan: HeadScan::of(headers),
            host: find(headers, &header::HOST).cloned(),
            request_id: find(headers, request_id).cloned(),
            grpc: crate::grpc::is_grpc(headers),
        }
    }
}

/// Drop a header map. One that never held a field is forgotten instead: it owns no memory
/// (`HeaderMap::new` allocates nothing, and a map that held a field keeps a capacity), and
/// its drop glue, which walks and frees three vectors, costs ~60 instructions. The request
/// path makes and drops several empty maps (heads kept in wire form).
#[inline]
pub fn discard_map(map: HeaderMap) {
    if map.capacity() == 0 {
        std::mem::forget(map);
    }
}

/// Put `new` in `slot`, discarding the map it replaces ([`discard_map`]).
#[inline]
pub fn replace_map(slot: &mut HeaderMap, new: HeaderMap) {
    discard_map(std::mem::replace(slot, new));
}

/// The first value of `name` in `h`, like [`HeaderMap::get`]. A head of a few fields (the
/// usual request) is searched in order, which costs a few comparisons; hashing the name for
/// the map's index costs more than that.
#[inline]
pub fn find<'a>(h: &'a HeaderMap, name: &HeaderName) -> Option<&'a HeaderValue> {
    if h.len() <= 8 {
        h.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    } else {
        h.get(name)
    }
}

/// Does adding, changing or removing the field `name` change what [`HeadScan`] finds
/// (beyond its byte count)?
pub fn affects_head_scan(name: &HeaderName) -> bool {
    // Only these lengths name a scanned field (see `HeadScan::note_name`).
    matches!(name.as_str().len(), 2 | 4 | 6 | 7 | 9 | 10 | 14..=17)
        && HeadScan::default().note(name)
}

/// Validate what the parsers (keymaster's HTTP/1.1 server, the `h2` codec) accepted but a
/// gateway must not forward.
pub fn validate_request_head(
    method: &Method,
    uri: &http::Uri,
    version: Version,
    headers: &HeaderMap,
    host: Option<&HeaderValue>,
    scan: &HeadScan,
    limits: &HeadLimits,
) -> Result<(), Error> {
    // Request line: method SP target SP HTTP/x.y
    let target_len = uri.path_and_query().map(|p| p.as_str().len()).unwrap_or(1)
        + uri.authority().map(|a| a.as_str().len() + 8).unwrap_or(0);
    if method.as_str().len() + target_len + 10 > limits.max_request_line {
        return Err(Error::new(Kind::UriTooLong, "request line too long"));
    }
    // `*` names the server as a whole: only OPTIONS may ask it (RFC 9110 §7.1).
    if uri.path() == "*" && method != Method::OPTIONS {
        return Err(Error::new(
            Kind::BadRequest,
            "'*' is a target for OPTIONS only",
        ));
    }
    // A request target carries no userinfo (RFC 9110 §4.2.4, RFC 9113 §8.3.1).
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(Error::new(
            Kind::BadRequest,
            "userinfo in the request target",
        ));
    }
    // HTTP/1 counts fields as it parses the head; HTTP/2's come as a map.
    if version == Version::HTTP_2 && headers.len() > limits.max_headers {
        return Err(Error::new(Kind::HeadersTooLarge, "too many header fields"));
    }
    if scan.bytes > limits.max_header_bytes {
        return Err(Error::new(
            Kind::HeadersTooLarge,
            "request header fields too large",
        ));
    }
    if version == Version::HTTP_11 || version == Version::HTTP_10 {
        if scan.hosts > 1 {
            return Err(Error::new(Kind::BadRequest, "repeated Host header"));
        }
        if version == Version::HTTP_11 && scan.hosts == 0 {
            return Err(Error::new(Kind::BadRequest, "missing Host header"));
        }
        if let Some(h) = host {
            if !valid_host(h.as_bytes()) {
                return Err(Error::new(Kind::BadRequest, "invalid Host header"));
            }
        }
    }
    // The HTTP/1.1 server already refused CL+TE, conflicting CLs and a TE not ending in
    // chunked (`framing::declared`); these checks keep the invariant local and cover
    // HTTP/2, whose codec differs.
    if scan.transfer_encoding {
        if scan.content_length {
            return Err(Error::new(
                Kind::BadRequest,
                "both Transfer-Encoding and Content-Length",
            ));
        }
        if version != Version::HTTP_11 || !final_coding_is_chunked(headers) {
            return Err(Error::new(Kind::BadRequest, "invalid Transfer-Encoding"));
        }
    }
    if !scan.content_length {
        return Ok(());
    }
    // The one rule of the HTTP/1.1 server's parse (`framing::declared`): a list or repeat of
    // one length is that length (RFC 9110 §8.6), anything else is refused.
    let lengths = headers.get_all(header::CONTENT_LENGTH).iter();
    crate::framing::declared(Version::HTTP_11, None, lengths.map(HeaderValue::as_bytes))
        .map_err(crate::framing::FramingError::by_client)?;
    Ok(())
}

/// A Host header value: reg-name / IPv4 / [IPv6] with optional :port, no userinfo or path.
fn valid_host(h: &[u8]) -> bool {
    if h.is_empty() {
        // An empty Host is allowed when the target has no authority (RFC 9112 §3.2).
        return true;
    }
    h.iter().all(|&c| HOST_CHARS[c as usize])
}

/// The bytes a Host may hold: unreserved, sub-delims, `%` (pct-encoded), and `:`, `[`, `]`
/// (port, IP literal), RFC 3986 §3.2.2.
static HOST_CHARS: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'.' | b'_' | b'~' | b':' | b'[' | b']')
            || matches!(
                b,
                b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' | b'%'
            );
        c += 1;
    }
    t
};

/// Content-Length is 1*DIGIT (no sign, no spaces inside, no lists with differing values).
pub fn parse_content_length(v: &[u8]) -> Option<u64> {
    // At most 19 digits: 10^19 - 1 fits a u64, so the sum cannot overflow.
    if v.is_empty() || v.len() > 19 {
        return None;
    }
    v.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0'))
    })
}

/// Does any `name` field line list `token` (comma-separated, case-insensitive)?
pub fn has_token(headers: &HeaderMap, name: HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str()
            .map(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
            .unwrap_or(false)
    })
}

pub fn final_coding_is_chunked(headers: &HeaderMap) -> bool {
    let last = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .next_back();
    last.is_some_and(|v| ends_in_chunked(v.as_bytes()))
}

/// Is `chunked` the last coding of this `Transfer-Encoding` field value? (A value with
/// anything but visible ASCII is not.)
pub fn ends_in_chunked(value: &[u8]) -> bool {
    value
        .iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
        && value
            .rsplit(|&b| b == b',')
            .next()
            .is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

/// A response head an origin must not send us: ambiguous or invalid framing.
pub fn validate_response_head(headers: &HeaderMap, scan: &HeadScan) -> Result<(), Error> {
    if scan.transfer_encoding {
        if scan.content_length {
            return Err(Error::new(
                Kind::OriginProtocol,
                "origin sent both Transfer-Encoding and Content-Length",
            ));
        }
        if !final_coding_is_chunked(headers) {
            return Err(Error::new(
                Kind::OriginProtocol,
                "origin sent a Transfer-Encoding that does not end in chunked",
            ));
        }
    }
    Ok(())
}

/// In the order of [`HeadScan`]'s bits.
static HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

/// HTTP/2 lets a client split `Cookie` into several fields (browsers send one per cookie);
/// an HTTP/1.1 message carries one, and origins often read only the first. Before a request
/// from HTTP/2 goes on, its cookie fields are joined, in order, with `"; "` (RFC 9113
/// §8.2.3). One field (the usual HTTP/1.1 case) stays as it is.
pub fn join_cookies(headers: &mut HeaderMap) {
    let mut fields = headers.get_all(header::COOKIE).iter();
    if fields.next().is_none() || fields.next().is_none() {
        return;
    }
    let values: Vec<&[u8]> = headers
        .get_all(header::COOKIE)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    let joined = values.join(&b"; "[..]);
    // Valid field values joined by "; " are a valid field value.
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        headers.insert(header::COOKIE, v);
    }
}

/// Remove hop-by-hop fields: `Connection` and every field it names, `Keep-Alive`, `TE`,
/// `Transfer-Encoding`, `Upgrade`, `Proxy-Connection`. Returns whether the client asked for
/// trailers (`TE: trailers`), which the caller may pass on.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, scan: &HeadScan) -> bool {
    if !scan.hop_by_hop() {
        return false;
    }
    if scan.hop_fields & 1 != 0 {
        // Every Connection field line counts, not just the first (RFC 9110 §7.6.1). The
        // lines are cloned (a reference count each) so that the fields they name can be
        // removed by name as they are read, with no `HeaderName` made for each.
        let lines: smallvec::SmallVec<[HeaderValue; 1]> = headers
            .get_all(header::CONNECTION)
            .iter()
            .cloned()
            .collect();
        for line in &lines {
            for token in line.to_str().unwrap_or("").split(',') {
                // Not a field name (empty, invalid): nothing to remove.
                headers.remove(token.trim());
            }
        }
    }
    let trailers = headers
        .get(header::TE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
        })
        .unwrap_or(false);
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if scan.hop_fields & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    trailers
}

/// Append the field line `name: value\r\n` (heads and trailers written as bytes).
///
/// Never inlined: a dozen places write fields, most of them in branches a request rarely
/// takes, and inlined copies took room among the request path's hot code (decision record
/// 0038).
#[inline(never)]
pub fn put_field(dst: &mut impl bytes::BufMut, name: &[u8], value: &[u8]) {
    dst.put_slice(name);
    dst.put_slice(b": ");
    dst.put_slice(value);
    dst.put_slice(b"\r\n");
}

#[cfg(test)]
mod tests {

    /// `replace_map` over a placeholder left by `mem::take`, and over a map with fields.
    #[test]
    fn replace_map_replaces_placeholders_and_maps() {
        let map = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("x-a", HeaderValue::from_static(v));
            h
        };
        // A placeholder left by `mem::take` (forgotten: it owns nothing).
        let mut dst = map("1");
        let taken = std::mem::take(&mut dst);
        assert_eq!(dst.capacity(), 0);
        replace_map(&mut dst, taken);
        assert_eq!(dst["x-a"], "1");
        // A map with contents in `dst` is replaced (and dropped) all the same.
        replace_map(&mut dst, map("2"));
        assert_eq!(dst["x-a"], "2");
        assert_eq!(dst.len(), 1);
    }

    /// `discard_map` forgets only maps that own no memory: those that never held a field.
    #[test]
    fn only_maps_that_never_held_a_field_have_no_capacity() {
        assert_eq!(HeaderMap::new().capacity(), 0);
        assert_eq!(HeaderMap::<HeaderValue>::default().capacity(), 0);
        assert_eq!(std::mem::take(&mut HeaderMap::new()).capacity(), 0);
        let mut m = HeaderMap::new();
        m.insert(header::HOST, HeaderValue::from_static("x"));
        m.clear();
        assert!(m.capacity() > 0, "a cleared map keeps its allocation");
        assert!(HeaderMap::<HeaderValue>::with_capacity(1).capacity() > 0);
        discard_map(m); // dropped, not forgotten
        discard_map(HeaderMap::new());
    }
    use super::*;

    #[test]
    fn cookie_fields_are_joined_in_order() {
        let mut h = HeaderMap::new();
        join_cookies(&mut h);
        assert!(h.is_empty());
        h.insert(header::COOKIE, HeaderValue::from_static("a=1"));
        join_cookies(&mut h);
        assert_eq!(h.get_all(header::COOKIE).iter().count(), 1);
        assert_eq!(h[header::COOKIE], "a=1");
        h.append(header::COOKIE, HeaderValue::from_static("b=2"));
        h.append(header::COOKIE, HeaderValue::from_static("c=3; d=4"));
        join_cookies(&mut h);
        let all: Vec<_> = h.get_all(header::COOKIE).iter().collect();
        assert_eq!(all, ["a=1; b=2; c=3; d=4"]);
    }

    /// A map of `pairs`, in order (repeated names appended).
    pub(super) fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    #[test]
    fn hop_by_hop_and_connection_named_fields_are_removed() {
        let mut h = map(&[
            ("connection", "keep-alive, x-secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers, deflate"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("proxy-connection", "keep-alive"),
            ("x-kept", "yes"),
        ]);
        let scan = HeadScan::of(&h);
        assert!(strip_hop_by_hop(&mut h, &scan));
        let names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, vec!["x-kept"]);
    }

    /// Every Connection line names fields, in any case; a token that is no field name
    /// (empty, invalid, an option like `close`) removes nothing else.
    #[test]
    fn every_connection_line_names_fields() {
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("connection", "close, X-One"),
            ("connection", " , bad name, x-two ,"),
            ("x-one", "1"),
            ("x-two", "2"),
            ("close", "named by the option"),
            ("x-kept", "yes"),
        ] {
            h.append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        let scan = HeadScan::of(&h);
        assert!(!strip_hop_by_hop(&mut h, &scan));
        let names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, vec!["x-kept"]);
    }

    #[test]
    fn head_scan_fields_are_recognised_for_filter_edits() {
        for n in [
            "host",
            "content-length",
            "transfer-encoding",
            "connection",
            "te",
        ] {
            assert!(affects_head_scan(&HeaderName::from_static(n)), "{n}");
        }
        for n in ["upgrade", "keep-alive", "proxy-connection", "expect"] {
            assert!(affects_head_scan(&HeaderName::from_static(n)), "{n}");
        }
        assert!(!affects_head_scan(&HeaderName::from_static("x-in")));
        let edits = |name: &str| {
            HeaderEdits::compile(&keymaster_config::HeaderEdits {
                set: [(name.to_string(), "v".to_string())].into_iter().collect(),
                ..Default::default()
            })
            .unwrap()
        };
        assert!(edits("connection").affects_head_scan());
        assert!(!edits("x-in").affects_head_scan());
    }

    #[test]
    fn content_length_parsing_is_strict() {
        assert_eq!(parse_content_length(b"0"), Some(0));
        assert_eq!(parse_content_length(b"1234"), Some(1234));
        assert_eq!(
            parse_content_length(b"9999999999999999999"),
            Some(9_999_999_999_999_999_999)
        );
        for bad in [
            &b""[..],
            b"+1",
            b"-1",
            b" 1",
            b"1 ",
            b"0x10",
            b"1,1",
            b"99999999999999999999",
        ] {
            assert_eq!(parse_content_length(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn response_framing_checks() {
        let check = |pairs: &[(&str, &str)]| {
            let h = map(pairs);
            validate_response_head(&h, &HeadScan::of(&h))
        };
        assert!(check(&[("transfer-encoding", "chunked")]).is_ok());
        assert!(check(&[("transfer-encoding", "chunked"), ("content-length", "3")]).is_err());
        assert!(check(&[("transfer-encoding", "gzip")]).is_err());
        assert!(check(&[("content-length", "3")]).is_ok());
    }
}
