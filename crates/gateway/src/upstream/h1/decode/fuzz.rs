//! Fuzz properties of the response head parser (proptest, bounded so they run with the unit
//! tests): any bytes, whole or in pieces, give the same head or the same refusal, without a
//! panic; the head kept as bytes and the head as a map agree (status, framing, fields);
//! valid responses round-trip, 1xx heads before them skipped. `NASTY` is the committed
//! corpus.

use super::*;
use proptest::prelude::*;

const RID: HeaderName = HeaderName::from_static("x-request-id");

/// A parse, comparable: refused, incomplete, or the head's parts (fields as a map, the
/// framing fields of a head kept as bytes put back) and what is left in the buffer.
#[derive(Debug, PartialEq)]
enum Parsed {
    Refused,
    Incomplete,
    Head {
        status: u16,
        version: Version,
        framing: Framing,
        keep_alive: bool,
        fields: Vec<(String, Vec<u8>)>,
        rest: Vec<u8>,
    },
}

fn fields_of(map: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    let mut f: Vec<(String, Vec<u8>)> = map
        .iter()
        .filter(|(n, _)| **n != header::TRANSFER_ENCODING && **n != header::CONTENT_LENGTH)
        .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
        .collect();
    f.sort();
    f
}

fn summary(r: Result<Option<Head>, Error>, rest: &[u8]) -> Parsed {
    match r {
        Err(e) => {
            assert!(e.is_origin(), "{e}");
            Parsed::Refused
        }
        Ok(None) => Parsed::Incomplete,
        Ok(Some(h)) => Parsed::Head {
            status: h.status.as_u16(),
            version: h.version,
            framing: h.framing,
            keep_alive: h.keep_alive,
            fields: match &h.raw {
                Some(raw) => fields_of(&raw.to_map()),
                None => fields_of(&h.headers),
            },
            rest: rest.to_vec(),
        },
    }
}

fn parse(input: &[u8], method: &Method, raw: bool, pieces: &[usize]) -> Parsed {
    let name = RID;
    let rid = raw.then_some(&name);
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let mut sizes = pieces.iter().copied().cycle();
    loop {
        let n = sizes.next().unwrap_or(1).max(1).min(input.len() - fed);
        buf.extend_from_slice(&input[fed..fed + n]);
        fed += n;
        match parse_head(&mut buf, method, rid) {
            Ok(None) if fed < input.len() => {}
            // What the origin sent after the head is the body's (read later).
            r => return summary(r, &[&buf[..], &input[fed..]].concat()),
        }
    }
}

fn whole(input: &[u8], method: &Method, raw: bool) -> Parsed {
    parse(input, method, raw, &[input.len().max(1)])
}

fn near_response() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"HTTP/1.1 200 OK\r\n".to_vec()),
        Just(b"HTTP/1.1 100 Continue\r\n\r\n".to_vec()),
        Just(b"HTTP/1.0 204 No Content\r\n".to_vec()),
        Just(b"Content-Length: 3\r\n".to_vec()),
        Just(b"Content-Length: 3, 3\r\n".to_vec()),
        Just(b"Transfer-Encoding: chunked\r\n".to_vec()),
        Just(b"Connection: close\r\n".to_vec()),
        Just(b"Date: d\r\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\n".to_vec()),
        "[ -~]{0,12}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..6),
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|p| p.concat())
}

fn methods() -> impl Strategy<Value = Method> {
    proptest::sample::select(vec![
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::CONNECT,
    ])
}

fn config() -> ProptestConfig {
    crate::fuzz_config(384)
}

proptest! {
    #![proptest_config(config())]

    /// Any bytes, whole or in pieces, kept as bytes or as a map: no panic, the same
    /// result however they arrive, and the same head both ways (or the same refusal).
    #[test]
    fn response_heads_parse_the_same_every_way(
        input in prop_oneof![near_response(), proptest::collection::vec(any::<u8>(), 0..96)],
        pieces in proptest::collection::vec(1usize..12, 1..5),
        method in methods(),
    ) {
        let map = whole(&input, &method, false);
        prop_assert_eq!(&parse(&input, &method, false, &pieces), &map);
        prop_assert_eq!(&parse(&input, &method, true, &pieces), &map);
    }

    /// A valid response round-trips: 1xx heads before it skipped, its status, version,
    /// fields and framing (RFC 9112 §6.3), and what follows its head.
    #[test]
    fn valid_responses_round_trip(
        interim in proptest::collection::vec(prop_oneof![Just(100u16), Just(102), Just(103)], 0..2),
        status in 200u16..600,
        http10 in any::<bool>(),
        fields in proptest::collection::vec(("x-[a-z0-9-]{1,10}", "[!-~]([ -~]{0,14}[!-~])?"), 0..6),
        framing in 0u8..3,
        length in 0u64..100,
        method in methods(),
        next in "[a-z]{0,8}",
    ) {
        let mut input = String::new();
        for s in &interim {
            input.push_str(&format!("HTTP/1.1 {s} Interim\r\n\r\n"));
        }
        let version = if http10 { "HTTP/1.0" } else { "HTTP/1.1" };
        input.push_str(&format!("{version} {status} Whatever\r\n"));
        for (n, v) in &fields {
            input.push_str(&format!("{n}: {v}\r\n"));
        }
        let declared = match framing {
            1 => {
                input.push_str(&format!("Content-Length: {length}\r\n"));
                Framing::Length(length)
            }
            2 if !http10 => {
                input.push_str("Transfer-Encoding: chunked\r\n");
                Framing::Chunked
            }
            _ => Framing::Close,
        };
        input.push_str("\r\n");
        input.push_str(&next);
        let expect = if method == Method::HEAD || status == 204 || status == 304 {
            Framing::Empty
        } else if method == Method::CONNECT && (200..300).contains(&status) {
            Framing::Close
        } else {
            declared
        };
        let mut sent: Vec<(String, Vec<u8>)> =
            fields.iter().map(|(n, v)| (n.clone(), v.clone().into_bytes())).collect();
        sent.sort();
        for raw in [false, true] {
            let Parsed::Head { status: s, version: v, framing: f, fields: got, rest, .. } =
                whole(input.as_bytes(), &method, raw)
            else {
                return Err(TestCaseError::fail(format!("refused: {input:?}")));
            };
            prop_assert_eq!(s, status);
            prop_assert_eq!(v, if http10 { Version::HTTP_10 } else { Version::HTTP_11 });
            prop_assert_eq!(f, expect);
            prop_assert_eq!(&got, &sent);
            prop_assert_eq!(rest, next.as_bytes().to_vec());
        }
    }
}

/// The committed corpus: responses and whether their head is refused.
const NASTY: &[(&[u8], bool)] = &[
    (
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
        true,
    ),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\nabc", false),
    (
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        true,
    ),
    (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
        true,
    ),
    (
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        true,
    ),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", true),
    (
        b"HTTP/1.1 204 No Content\r\nContent-Length: x\r\n\r\n",
        true,
    ),
    (b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n", true),
    (b"HTTP/1.1 999 Odd\r\n\r\n", false),
    (b"HTTP/1.1 1000 Odd\r\n\r\n", true),
    (b"HTTP/1.1 099 Odd\r\n\r\n", true),
    (b"HTTP/2.0 200 OK\r\n\r\n", true),
    (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        false,
    ),
    (b"HTTP/1.1 200 OK\nContent-Length: 0\n\n", false),
    (b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", false),
];

#[test]
fn nasty_response_heads() {
    for (input, refused) in NASTY {
        let shown = String::from_utf8_lossy(input);
        for raw in [false, true] {
            let got = whole(input, &Method::GET, raw);
            assert_eq!(got == Parsed::Refused, *refused, "{shown:?}: {got:?}");
            assert_eq!(
                parse(input, &Method::GET, raw, &[1]),
                got,
                "{shown:?} byte by byte"
            );
        }
    }
}
