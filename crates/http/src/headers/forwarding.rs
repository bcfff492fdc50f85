//! What the gateway says about a request's way to the origin: `Via`, `X-Forwarded-For`,
//! `-Proto` and `-Host`, RFC 7239 `Forwarded`, and request ids; the per-connection facts
//! they are made from ([`ClientFacts`]), and the fields added in one write when a request
//! carries none of them ([`AddedFields`]).

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::Version;

use super::{put_field, HeadScan, RawRequestFields};

/// Per-connection facts computed once, used by every request on the connection.
///
/// Kept small and in order (`repr(C)`, 56 bytes): every request reads all of it, from the
/// connection's context, where it shares two cache lines with the rest of what a request
/// reads there; the TLS facts, which only TLS connections have, are boxed.
#[repr(C)]
pub struct ClientFacts {
    /// The client's IP as a header value (for X-Forwarded-For).
    pub ip_value: HeaderValue,
    /// What the TLS handshake established (TLS listeners only).
    pub tls: Option<Box<TlsFacts>>,
    /// Whether the peer is a trusted proxy whose forwarding headers we keep.
    pub trusted: bool,
}

impl ClientFacts {
    /// "http", or "https" for a TLS connection.
    pub fn proto(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// The `for=` parameter of an RFC 7239 Forwarded element: the address, IPv6 bracketed
    /// and quoted. Made when a Forwarded field is written, not for every connection.
    pub fn forwarded_for(&self) -> std::borrow::Cow<'_, str> {
        let ip = self.ip_value.to_str().unwrap_or("unknown");
        if ip.contains(':') {
            std::borrow::Cow::Owned(format!("\"[{ip}]\""))
        } else {
            std::borrow::Cow::Borrowed(ip)
        }
    }
}

/// Values computed once per config version for the headers keymaster adds.
pub struct Stamps {
    pub via_10: HeaderValue,
    pub via_11: HeaderValue,
    pub via_2: HeaderValue,
}

impl Stamps {
    pub fn new(pseudonym: &str) -> Self {
        let v = |p: &str| {
            HeaderValue::from_str(&format!("{p} {pseudonym}"))
                .unwrap_or_else(|_| HeaderValue::from_static("1.1 keymaster"))
        };
        Stamps {
            via_10: v("1.0"),
            via_11: v("1.1"),
            via_2: v("2"),
        }
    }
    pub fn via(&self, version: Version) -> &HeaderValue {
        match version {
            Version::HTTP_10 | Version::HTTP_09 => &self.via_10,
            Version::HTTP_2 | Version::HTTP_3 => &self.via_2,
            _ => &self.via_11,
        }
    }
}

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// The forwarding fields and Via the proxy stage adds to a request that has none of them to
/// replace or extend: the HTTP/1.1 origin client writes them straight after the request's own
/// fields (four map inserts would cost more than the writes); an HTTP/2 send puts them in the
/// map ([`AddedFields::insert_into`]). The same fields [`add_forwarding`] and a Via append
/// give such a request. It borrows what it writes: it lives only while the request is sent.
///
/// When the request's own fields were kept in wire form ([`RawRequestFields`]; the request's
/// map is then empty), they are written first, as the client sent them.
pub struct AddedFields<'a> {
    /// The request's own fields in wire form.
    client: Option<&'a RawRequestFields>,
    forwarded_for: &'a HeaderValue,
    forwarded_proto: &'static str,
    forwarded_host: Option<&'a HeaderValue>,
    via: &'a HeaderValue,
    /// A request id the gateway made (one the client sent is in the map).
    request_id: Option<(&'a HeaderName, &'a HeaderValue)>,
}

impl<'a> AddedFields<'a> {
    /// `None` when a field must replace, extend or remove one of the request's (it carries
    /// forwarding fields, or the listener vouches for TLS client identities or sends RFC 7239
    /// Forwarded): then [`add_forwarding`] edits the map.
    pub fn for_request(
        scan: &HeadScan,
        client: &'a ClientFacts,
        host: Option<&'a HeaderValue>,
        forwarded_header: bool,
        via: &'a HeaderValue,
        request_id: Option<(&'a HeaderName, &'a HeaderValue)>,
    ) -> Option<Self> {
        let vouches = client
            .tls
            .as_ref()
            .is_some_and(|t| t.identity_header.is_some());
        if scan.forwarding || forwarded_header || vouches {
            return None;
        }
        Some(AddedFields {
            client: None,
            forwarded_for: &client.ip_value,
            forwarded_proto: client.proto(),
            forwarded_host: host,
            via,
            request_id,
        })
    }

    /// The request's own fields are `fields`, in wire form (its map is empty).
    pub fn with_client_fields(mut self, fields: Option<&'a RawRequestFields>) -> Self {
        self.client = fields;
        self
    }

    /// The request's fields in wire form include a Content-Length.
    pub fn declares_length(&self) -> bool {
        self.client.is_some_and(RawRequestFields::declares_length)
    }

    /// About how many bytes [`write`](Self::write) appends (at least as many): a head's
    /// buffer made with room for them is written without growing.
    pub fn len_hint(&self) -> usize {
        let host = self.forwarded_host.as_ref().map_or(0, |h| h.len() + 20);
        let id = self
            .request_id
            .as_ref()
            .map_or(0, |(n, v)| n.as_str().len() + v.len() + 4);
        let client = self.client.map_or(0, RawRequestFields::len_hint);
        client + self.forwarded_for.len() + self.via.len() + host + id + 64
    }

    /// Append the fields to a request head being written, into room the caller made
    /// ([`len_hint`](Self::len_hint)); without it the buffer grows as it goes. (Each name
    /// and its `: ` is one constant, which the compiler copies inline; only the values take
    /// a `memcpy`.)
    pub fn write(&self, dst: &mut Vec<u8>) {
        if let Some(c) = self.client {
            c.write(dst);
        }
        dst.extend_from_slice(b"x-forwarded-for: ");
        dst.extend_from_slice(self.forwarded_for.as_bytes());
        dst.extend_from_slice(b"\r\nx-forwarded-proto: ");
        dst.extend_from_slice(self.forwarded_proto.as_bytes());
        if let Some(h) = &self.forwarded_host {
            dst.extend_from_slice(b"\r\nx-forwarded-host: ");
            dst.extend_from_slice(h.as_bytes());
        }
        dst.extend_from_slice(b"\r\nvia: ");
        dst.extend_from_slice(self.via.as_bytes());
        dst.extend_from_slice(b"\r\n");
        if let Some((n, v)) = &self.request_id {
            put_field(dst, n.as_str().as_bytes(), v.as_bytes());
        }
    }

    /// Put the fields in a request's map.
    pub fn insert_into(&self, headers: &mut HeaderMap) {
        if let Some(c) = self.client {
            for (name, value) in &c.to_map() {
                headers.append(name.clone(), value.clone());
            }
        }
        headers.insert(X_FORWARDED_FOR.clone(), self.forwarded_for.clone());
        let proto = HeaderValue::from_static(self.forwarded_proto);
        headers.insert(X_FORWARDED_PROTO.clone(), proto);
        if let Some(h) = self.forwarded_host {
            headers.insert(X_FORWARDED_HOST.clone(), h.clone());
        }
        headers.append(header::VIA, self.via.clone());
        if let Some((n, v)) = self.request_id {
            headers.insert(n.clone(), v.clone());
        }
    }
}

/// Add `X-Forwarded-For/-Proto/-Host` (and optionally `Forwarded`) from what the gateway saw.
/// An existing chain is kept only when the peer is a trusted proxy.
pub fn add_forwarding(
    headers: &mut HeaderMap,
    client: &ClientFacts,
    host: Option<&HeaderValue>,
    forwarded_header: bool,
) {
    // X-Forwarded-For
    let xff = if client.trusted {
        let prior: Vec<&str> = headers
            .get_all(&X_FORWARDED_FOR)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        if prior.is_empty() {
            client.ip_value.clone()
        } else {
            let joined = format!(
                "{}, {}",
                prior.join(", "),
                client.ip_value.to_str().unwrap_or("")
            );
            HeaderValue::from_str(&joined).unwrap_or_else(|_| client.ip_value.clone())
        }
    } else {
        client.ip_value.clone()
    };
    headers.insert(X_FORWARDED_FOR.clone(), xff);
    if !(client.trusted && headers.contains_key(&X_FORWARDED_PROTO)) {
        headers.insert(
            X_FORWARDED_PROTO.clone(),
            HeaderValue::from_static(client.proto()),
        );
    }
    if !(client.trusted && headers.contains_key(&X_FORWARDED_HOST)) {
        match host {
            Some(h) => {
                headers.insert(X_FORWARDED_HOST.clone(), h.clone());
            }
            None => {
                headers.remove(&X_FORWARDED_HOST);
            }
        }
    }
    if let Some(tls) = &client.tls {
        if let Some(name) = &tls.identity_header {
            // Only the gateway vouches for a client certificate: drop any claimed value.
            headers.remove(name);
            if let Some(v) = tls
                .client_identity
                .as_deref()
                .and_then(|id| HeaderValue::from_str(id).ok())
            {
                headers.insert(name.clone(), v);
            }
        }
    }
    if !forwarded_header {
        // Never pass on what an untrusted client claims about earlier hops.
        if !client.trusted && headers.contains_key(header::FORWARDED) {
            headers.remove(header::FORWARDED);
        }
    } else {
        let mut element = format!("for={};proto={}", client.forwarded_for(), client.proto());
        if let Some(h) = host.and_then(|h| h.to_str().ok()) {
            element.push_str(";host=\"");
            element.push_str(h);
            element.push('"');
        }
        let value = match headers.get(header::FORWARDED).and_then(|v| v.to_str().ok()) {
            Some(prior) if client.trusted => format!("{prior}, {element}"),
            _ => element,
        };
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(header::FORWARDED, v);
        }
    }
}

/// A client's address as a header value (for `X-Forwarded-For`). Made once per connection,
/// in one allocation; IPv4, the common case, is written by hand: `Display` through
/// `core::fmt` cost about 1,200 instructions an address, a tenth of what keymaster spends on
/// a new connection in user space.
pub fn client_address(ip: std::net::IpAddr) -> HeaderValue {
    let value = match ip {
        std::net::IpAddr::V4(v4) => {
            let mut text = [0u8; 15];
            let len = ipv4_text(v4, &mut text);
            HeaderValue::from_bytes(&text[..len])
        }
        std::net::IpAddr::V6(v6) => HeaderValue::from_str(&v6.to_string()),
    };
    value.unwrap_or(HeaderValue::from_static("unknown"))
}

/// Dotted decimal into `out`, as `Ipv4Addr`'s `Display` writes it; returns its length.
fn ipv4_text(ip: std::net::Ipv4Addr, out: &mut [u8; 15]) -> usize {
    let mut len = 0;
    let mut push = |b: u8| {
        out[len] = b;
        len += 1;
    };
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            push(b'.');
        }
        if octet >= 100 {
            push(b'0' + octet / 100);
        }
        if octet >= 10 {
            push(b'0' + octet / 10 % 10);
        }
        push(b'0' + octet % 10);
    }
    len
}

/// A fresh request id: 32 lowercase hex digits (128 random bits).
pub fn new_request_id() -> HeaderValue {
    let n = fastrand::u128(..);
    let mut buf = [0u8; 32];
    for (i, pair) in buf.chunks_exact_mut(2).enumerate() {
        let byte = (n >> (8 * i)) as u8 as usize;
        pair.copy_from_slice(&HEX_PAIRS[2 * byte..2 * byte + 2]);
    }
    // SAFETY: the value is 32 ASCII hex digits, valid UTF-8 as `from_maybe_shared_unchecked`
    // requires (and valid header value bytes).
    let mut id =
        unsafe { HeaderValue::from_maybe_shared_unchecked(bytes::Bytes::copy_from_slice(&buf)) };
    // Never indexed by HPACK (RFC 7541 §7.1.3): a value seen once would only take room in
    // the HTTP/2 dynamic table from fields that repeat, and cost an insertion per message.
    id.set_sensitive(true);
    id
}

/// Each byte's two lowercase hex digits, for [`new_request_id`].
static HEX_PAIRS: [u8; 512] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut t = [0u8; 512];
    let mut i = 0;
    while i < 256 {
        t[2 * i] = HEX[i >> 4];
        t[2 * i + 1] = HEX[i & 0xf];
        i += 1;
    }
    t
};

/// What the TLS handshake established, kept with the connection's facts.
#[derive(Debug, Clone, Default)]
pub struct TlsFacts {
    /// The verified client certificate's identity: subject CN, else its first DNS name.
    pub client_identity: Option<String>,
    /// Copied from the listener's `identity_header` at handshake time.
    pub identity_header: Option<HeaderName>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::tests::map;

    /// The hand-written IPv4 text is `Display`'s, at every digit count; IPv6 is bracketed
    /// and quoted for `Forwarded`.
    #[test]
    fn client_addresses_read_as_display_writes_them() {
        use std::net::{IpAddr, Ipv4Addr};
        let mut samples = vec![
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::BROADCAST,
            [10, 0, 100, 9].into(),
        ];
        samples.extend((0..10_000).map(|_| Ipv4Addr::from(fastrand::u32(..))));
        let facts = |ip_value| ClientFacts {
            ip_value,
            trusted: false,
            tls: None,
        };
        for v4 in samples {
            let value = super::client_address(IpAddr::V4(v4));
            assert_eq!(value, v4.to_string());
            assert_eq!(facts(value).forwarded_for(), v4.to_string());
        }
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let value = super::client_address(v6);
        assert_eq!(value, "2001:db8::1");
        assert_eq!(facts(value).forwarded_for(), "\"[2001:db8::1]\"");
    }

    #[test]
    fn forwarding_headers_replace_untrusted_chains() {
        let facts = ClientFacts {
            ip_value: HeaderValue::from_static("10.1.1.1"),
            trusted: false,
            tls: None,
        };
        let mut h = map(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "evil"),
        ]);
        let host = HeaderValue::from_static("example.com");
        add_forwarding(&mut h, &facts, Some(&host), true);
        assert_eq!(h["x-forwarded-for"], "10.1.1.1");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "example.com");
        assert_eq!(
            h["forwarded"],
            "for=10.1.1.1;proto=http;host=\"example.com\""
        );
    }

    #[test]
    fn forwarding_headers_extend_trusted_chains() {
        let facts = ClientFacts {
            ip_value: HeaderValue::from_static("10.1.1.1"),
            trusted: true,
            tls: None,
        };
        let mut h = map(&[
            ("x-forwarded-for", "1.2.3.4"),
            ("x-forwarded-for", "5.6.7.8"),
            ("x-forwarded-proto", "https"),
        ]);
        add_forwarding(&mut h, &facts, None, false);
        assert_eq!(h["x-forwarded-for"], "1.2.3.4, 5.6.7.8, 10.1.1.1");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert!(h.get("forwarded").is_none());
    }

    #[test]
    fn request_ids_are_32_hex_and_distinct() {
        let a = new_request_id();
        let b = new_request_id();
        assert_eq!(a.len(), 32);
        assert!(a.to_str().unwrap().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert!(
            a.is_sensitive(),
            "a value seen once is never indexed by HPACK"
        );
    }
}
