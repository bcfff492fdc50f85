//! Fuzz properties of the request head parser (proptest, bounded so they run with the unit
//! tests): any bytes, arriving whole or in pieces, parse to the same head or the same
//! refusal, without a panic; valid heads round-trip (method, target, version, fields in wire
//! form, the body's framing); a repeated Content-Length is one length; a chunked body that
//! came with its head is refused exactly when its framing is broken. `NASTY` is the
//! committed corpus.

use super::*;
use proptest::prelude::*;

fn limits() -> HeadLimits {
    HeadLimits {
        max_request_line: 8 * 1024,
        max_header_bytes: 64 * 1024,
        max_headers: 100,
    }
}

/// What a parse gave, comparable: the refusal's status (a head whose chunked body came
/// broken with it counts as refused: the proxy stage refuses it at once), nothing yet, or
/// the head's parts and the bytes left after it.
#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    Refused(u16),
    Incomplete,
    Head {
        method: String,
        uri: String,
        version: Version,
        fields: Vec<(String, Vec<u8>)>,
        body: Decoder,
        keep_alive: bool,
        rest: Vec<u8>,
    },
}

fn summary(result: Result<Option<Head>, Error>, rest: &[u8]) -> Parsed {
    match result {
        Err(e) => Parsed::Refused(e.status().as_u16()),
        Ok(None) => Parsed::Incomplete,
        // The proxy stage refuses it before any origin hears of it.
        Ok(Some(h)) if h.body_refused.is_some() => Parsed::Refused(
            h.body_refused
                .map_or(0, |e| e.by_client().status().as_u16()),
        ),
        Ok(Some(h)) => {
            let map = match &h.wire {
                Some(w) => w.fields.to_map(),
                None => h.headers.clone(),
            };
            let fields = map
                .iter()
                .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
                .collect();
            Parsed::Head {
                method: h.method.to_string(),
                uri: h.uri.to_string(),
                version: h.version,
                fields,
                body: h.body,
                keep_alive: h.keep_alive,
                rest: rest.to_vec(),
            }
        }
    }
}

fn parse_whole(input: &[u8]) -> Parsed {
    let mut buf = BytesMut::from(input);
    let r = parse_head(&mut buf, &mut HeadScan::default(), &limits(), &rid());
    summary(r, &buf)
}

/// The head's bytes arrive in pieces (their sizes cycled); whatever follows the head
/// arrives with its last byte, as a body sent with its head does.
fn parse_in_pieces(input: &[u8], pieces: &[usize]) -> Parsed {
    let head_end = HeadScan::default().end(input).unwrap_or(input.len());
    let mut buf = BytesMut::new();
    let mut scan = HeadScan::default();
    let mut fed = 0;
    let mut sizes = pieces.iter().copied().cycle();
    loop {
        let mut n = sizes.next().unwrap_or(1).max(1).min(input.len() - fed);
        if fed + n >= head_end {
            n = input.len() - fed;
        }
        buf.extend_from_slice(&input[fed..fed + n]);
        fed += n;
        match parse_head(&mut buf, &mut scan, &limits(), &rid()) {
            Ok(None) if fed < input.len() => {}
            r => return summary(r, &buf),
        }
    }
}

fn rid() -> HeaderName {
    HeaderName::from_static("x-request-id")
}

/// Bytes that look like a request head more often than random ones do.
fn near_head() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"GET / HTTP/1.1\r\n".to_vec()),
        Just(b"POST /a?b HTTP/1.0\r\n".to_vec()),
        Just(b"Host: a\r\n".to_vec()),
        Just(b"Content-Length: 5\r\n".to_vec()),
        Just(b"Content-Length: 5, 5\r\n".to_vec()),
        Just(b"Transfer-Encoding: chunked\r\n".to_vec()),
        Just(b"Connection: close\r\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\n".to_vec()),
        Just(b" ".to_vec()),
        Just(b":".to_vec()),
        "[ -~]{0,12}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..6),
    ];
    proptest::collection::vec(piece, 0..14).prop_map(|p| p.concat())
}

fn config() -> ProptestConfig {
    crate::fuzz_config(384)
}

const METHODS: &[&str] = &[
    "GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "X-CUSTOM",
];

proptest! {
    #![proptest_config(config())]

    /// Any bytes, whole or in pieces: no panic, and the same head (or refusal) either way.
    #[test]
    fn heads_parse_the_same_however_they_arrive(
        input in prop_oneof![near_head(), proptest::collection::vec(any::<u8>(), 0..96)],
        pieces in proptest::collection::vec(1usize..12, 1..5),
    ) {
        prop_assert_eq!(parse_in_pieces(&input, &pieces), parse_whole(&input));
    }

    /// A valid head round-trips: method, target, version, every field (values as sent,
    /// without surrounding whitespace), the body's framing, and what follows it.
    #[test]
    fn valid_heads_round_trip(
        method in proptest::sample::select(METHODS),
        path in "/[a-zA-Z0-9._~%!$&'()*+,;=:@/-]{0,20}(\\?[a-z0-9=&]{0,10})?",
        http10 in any::<bool>(),
        fields in proptest::collection::vec(("x-[a-z0-9-]{1,10}", "[!-~]([ -~]{0,14}[!-~])?"), 0..6),
        framing in 0u8..3,
        length in 0u64..100,
        next in "[A-Z]{0,8}",
    ) {
        let version = if http10 { "HTTP/1.0" } else { "HTTP/1.1" };
        let mut head = format!("{method} {path} {version}\r\nHost: h\r\n");
        for (n, v) in &fields {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        let body = match framing {
            1 => {
                head.push_str(&format!("Content-Length: {length}\r\n"));
                Decoder::length(length)
            }
            2 if !http10 => {
                head.push_str("Transfer-Encoding: chunked\r\n");
                Decoder::chunked()
            }
            _ => Decoder::Done,
        };
        head.push_str("\r\n");
        let input = [head.as_bytes(), next.as_bytes()].concat();
        let Parsed::Head { method: m, uri, version: v, fields: got, body: b, rest, .. } =
            parse_whole(&input)
        else {
            return Err(TestCaseError::fail(format!("refused: {head:?}")));
        };
        prop_assert_eq!(m, method);
        prop_assert_eq!(uri, path);
        prop_assert_eq!(v, if http10 { Version::HTTP_10 } else { Version::HTTP_11 });
        prop_assert_eq!(b, body);
        prop_assert_eq!(rest, next.as_bytes().to_vec());
        for (n, value) in &fields {
            let sent: Vec<&Vec<u8>> =
                got.iter().filter(|(g, _)| g == n).map(|(_, v)| v).collect();
            prop_assert!(sent.contains(&&value.as_bytes().to_vec()), "{} in {:?}", n, got);
        }
        // Kept in wire form: every line ends in CRLF.
        let mut buf = BytesMut::from(&input[..]);
        let h = parse_head(&mut buf, &mut HeadScan::default(), &limits(), &rid()).unwrap().unwrap();
        prop_assert!(h.wire.is_some() && h.headers.is_empty());
    }

    /// A length given once, repeated on several lines or as a list of one value is that
    /// length, and only a single plain line goes upstream as sent; any other value among
    /// them is a 400.
    #[test]
    fn repeated_content_lengths_are_one_length(
        n in 0u64..1000,
        lines in proptest::collection::vec(1usize..3, 1..4),
        other in proptest::option::of(0u64..1000),
    ) {
        let mut head = String::from("POST / HTTP/1.1\r\nHost: h\r\n");
        for (i, copies) in lines.iter().enumerate() {
            let mut values = vec![n.to_string(); *copies];
            if i == 0 {
                if let Some(o) = other {
                    values.push(o.to_string());
                }
            }
            head.push_str(&format!("Content-Length: {}\r\n", values.join(", ")));
        }
        head.push_str("\r\n");
        let mut buf = BytesMut::from(head.as_bytes());
        let parsed = parse_head(&mut buf, &mut HeadScan::default(), &limits(), &rid());
        match other.filter(|&o| o != n) {
            Some(_) => prop_assert_eq!(parsed.err().map(|e| e.status().as_u16()), Some(400)),
            None => {
                let h = parsed.unwrap().unwrap();
                prop_assert_eq!(h.body, Decoder::length(n));
                let single = lines == [1] && other.is_none();
                prop_assert_eq!(h.wire.unwrap().fields.declares_length(), single);
            }
        }
    }

    /// A chunked body that came with its head: refused (400) exactly when checking the bytes
    /// that came finds its framing broken; otherwise the head parses and the body's bytes
    /// are left for its decoder.
    #[test]
    fn a_chunked_body_with_its_head_is_checked(
        body in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..40),
            "([0-9a-fA-Fx+ -]{1,4}(;[a-z=]{0,4})?\r\n[a-z]{0,8}\r\n){0,3}(0\r\n\r\n)?"
                .prop_map(String::into_bytes),
        ],
    ) {
        let head = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
        let input = [&head[..], &body].concat();
        let got = parse_whole(&input);
        match Decoder::chunked().check(&body) {
            Err(_) => prop_assert_eq!(got, Parsed::Refused(400)),
            Ok(_) => {
                let rest_ok = matches!(&got, Parsed::Head { rest, .. } if *rest == body);
                prop_assert!(rest_ok, "{:?}", got);
            }
        }
    }
}

/// The committed corpus: request heads (with what came after them) and the status the
/// parse gives (200: a head).
const NASTY: &[(&[u8], u16)] = &[
    (
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        200,
    ),
    (
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\nhello",
        200,
    ),
    (
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 6\r\n\r\nhello",
        400,
    ),
    (
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5,\r\n\r\nhello",
        400,
    ),
    (
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551616\r\n\r\n",
        400,
    ),
    (
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\nx\r\n",
        400,
    ),
    (
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n",
        400,
    ),
    (
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
        400,
    ),
    (
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloEXTRA\r\n0\r\n\r\n",
        400,
    ),
    (
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
        200,
    ),
    (
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET",
        200,
    ),
    (
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc",
        400,
    ),
    (
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
        400,
    ),
    (
        b"POST / HTTP/1.1\r\nTransfer-Encoding:\x0bchunked\r\n\r\n",
        400,
    ),
    (b"GET / HTTP/1.1\r\nHost: a\r\n\tX: folded\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400),
    (b"GET  / HTTP/1.1\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX-A: \xff\xfe\r\n\r\n", 200),
    (b"\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 200),
    (b"GET / HTTP/1.1\nHost: a\n\n", 200),
];

#[test]
fn nasty_request_heads() {
    for (input, want) in NASTY {
        let got = match parse_whole(input) {
            Parsed::Refused(s) => s,
            Parsed::Head { .. } => 200,
            Parsed::Incomplete => 0,
        };
        assert_eq!(got, *want, "{:?}", String::from_utf8_lossy(input));
        assert_eq!(
            parse_in_pieces(input, &[1]),
            parse_whole(input),
            "{:?} a byte at a time",
            String::from_utf8_lossy(input)
        );
    }
}
