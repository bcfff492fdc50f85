//! Fuzz properties of the body framing (proptest, bounded so they run with the unit tests):
//! the decoder never panics and reads the same body however the bytes are split; valid
//! chunked bodies round-trip; [`Decoder::check`] agrees with decoding; a length-framed body
//! is never read past its length; and the declared length follows a plain model of the
//! rules. `NASTY` is the committed corpus of regression inputs.

use super::*;
use proptest::prelude::*;

/// The outcome of decoding `input` fed in pieces of the given sizes (cycled), then EOF.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Body { data: Vec<u8>, trailers: usize },
    Failed(FramingError),
}

fn decode_split(mut d: Decoder, input: &[u8], pieces: &[usize], eof: bool) -> Outcome {
    let mut buf = BytesMut::new();
    let (mut data, mut trailers) = (Vec::new(), 0);
    let mut fed = 0;
    let mut sizes = pieces.iter().copied().cycle();
    loop {
        match d.decode(&mut buf) {
            Err(e) => return Outcome::Failed(e),
            Ok(Step::Data(b)) => data.extend_from_slice(&b),
            Ok(Step::Trailers(t)) => trailers += t.len(),
            Ok(Step::End) => return Outcome::Body { data, trailers },
            Ok(Step::More) if fed == input.len() => {
                if !eof {
                    return Outcome::Body { data, trailers };
                }
                return match d.on_eof() {
                    Ok(_) => Outcome::Body { data, trailers },
                    Err(e) => Outcome::Failed(e),
                };
            }
            Ok(Step::More) => {
                let n = sizes.next().unwrap_or(1).max(1).min(input.len() - fed);
                buf.extend_from_slice(&input[fed..fed + n]);
                fed += n;
            }
        }
    }
}

fn whole(d: Decoder, input: &[u8]) -> Outcome {
    decode_split(d, input, &[input.len().max(1)], true)
}

/// A chunked encoding of `chunks` (empty ones skipped), each size line with an optional
/// extension, then `trailers` and the final CRLF.
fn encode_chunked(chunks: &[Vec<u8>], ext: bool, trailers: &[(String, String)]) -> Vec<u8> {
    let mut out = BytesMut::new();
    for c in chunks.iter().filter(|c| !c.is_empty()) {
        if ext {
            out.extend_from_slice(format!("{:X} ; name=\"v\"\r\n", c.len()).as_bytes());
        } else {
            put_chunk_size(&mut out, c.len());
        }
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n");
    for (n, v) in trailers {
        out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.to_vec()
}

/// Bytes that look like chunked framing more often than random ones do.
fn near_chunked() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"\r\n".to_vec()),
        Just(b"0\r\n\r\n".to_vec()),
        Just(b";e=1".to_vec()),
        Just(b"x-t: 1\r\n".to_vec()),
        "[0-9a-fA-F]{1,18}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..8),
        Just(b"-".to_vec()),
        Just(b"0x".to_vec()),
        Just(b" \t".to_vec()),
        Just(b"\n".to_vec()),
    ];
    proptest::collection::vec(piece, 0..24).prop_map(|p| p.concat())
}

/// Chunks whose data may be longer than their size line says (`+1..`) or shorter by one or
/// two bytes, data of letters only (so a wrong size can never realign onto later framing),
/// then the last chunk. Returns the encoding and whether every chunk was exact.
fn sized_chunks() -> impl Strategy<Value = (Vec<u8>, bool)> {
    let chunk = (
        1usize..12,
        prop_oneof![3 => Just(0i64), 1 => -2i64..0, 1 => 1i64..4],
    );
    proptest::collection::vec(chunk, 0..5).prop_map(|chunks| {
        let mut out = Vec::new();
        let mut exact = true;
        for (size, diff) in chunks {
            let len = (size as i64 + diff).max(0) as usize;
            exact &= len == size;
            out.extend_from_slice(format!("{size:x}\r\n").as_bytes());
            out.extend(std::iter::repeat_n(b'q', len));
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
        (out, exact)
    })
}

fn pieces() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(1usize..9, 1..6)
}

fn config() -> ProptestConfig {
    crate::fuzz_config(512)
}

proptest! {
    #![proptest_config(config())]

    /// Any bytes, any split: no panic, and the same body or the same error as when they
    /// come at once.
    #[test]
    fn chunked_decoding_does_not_depend_on_how_bytes_arrive(
        input in prop_oneof![
            near_chunked(),
            sized_chunks().prop_map(|(bytes, _)| bytes),
            proptest::collection::vec(any::<u8>(), 0..64),
        ],
        split in pieces(),
    ) {
        prop_assert_eq!(
            decode_split(Decoder::chunked(), &input, &split, true),
            whole(Decoder::chunked(), &input)
        );
    }

    /// A valid chunked body (any chunks, extensions, trailers) decodes to exactly its data
    /// and trailers in any split, and `check` finds it complete at its exact end, with the
    /// next message's bytes left alone.
    #[test]
    fn valid_chunked_bodies_round_trip(
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..6),
        ext in any::<bool>(),
        trailers in proptest::collection::vec(("x-[a-z]{1,6}", "[ -~]{0,10}"), 0..3),
        split in pieces(),
    ) {
        let trailers: Vec<(String, String)> =
            trailers.into_iter().map(|(n, v)| (n, v.trim().to_string())).collect();
        let encoded = encode_chunked(&chunks, ext, &trailers);
        let data = chunks.concat();
        let expect = Outcome::Body { data: data.clone(), trailers: trailers.len() };
        prop_assert_eq!(decode_split(Decoder::chunked(), &encoded, &split, true), expect);
        let mut next = encoded.clone();
        next.extend_from_slice(b"GET / HTTP/1.1\r\n");
        prop_assert_eq!(
            Decoder::chunked().check(&next),
            Ok(Checked::Complete { len: data.len() as u64, used: encoded.len() })
        );
    }

    /// `check` says what decoding the same bytes says: the same error, or complete with
    /// the decoded length, or incomplete where decoding wants more.
    #[test]
    fn check_agrees_with_decoding(
        input in prop_oneof![
            near_chunked(),
            sized_chunks().prop_map(|(bytes, _)| bytes),
            proptest::collection::vec(any::<u8>(), 0..64),
        ],
    ) {
        let checked = Decoder::chunked().check(&input);
        let mut d = Decoder::chunked();
        let mut buf = BytesMut::from(&input[..]);
        let mut len = 0u64;
        let decoded = loop {
            match d.decode(&mut buf) {
                Err(e) => break Err(e),
                Ok(Step::Data(b)) => len += b.len() as u64,
                Ok(Step::Trailers(_)) | Ok(Step::End) => {
                    break Ok(Checked::Complete { len, used: input.len() - buf.len() })
                }
                Ok(Step::More) => break Ok(Checked::Incomplete),
            }
        };
        prop_assert_eq!(checked, decoded);
    }

    /// A chunk whose data is longer than its size line says, or a byte or two shorter, is a
    /// framing error (checked and decoded, in any split): never read as a body of another
    /// length. Exact chunks read as exactly their data.
    #[test]
    fn a_chunk_that_disagrees_with_its_size_is_an_error(
        (input, exact) in sized_chunks(),
        split in pieces(),
    ) {
        let got = decode_split(Decoder::chunked(), &input, &split, true);
        if exact {
            let n = input.iter().filter(|&&b| b == b'q').count();
            prop_assert_eq!(got, Outcome::Body { data: vec![b'q'; n], trailers: 0 });
            let complete = matches!(Decoder::chunked().check(&input), Ok(Checked::Complete { .. }));
            prop_assert!(complete, "{:?}", input);
        } else {
            let failed = matches!(got, Outcome::Failed(_));
            prop_assert!(failed, "{:?}", got);
            prop_assert!(Decoder::chunked().check(&input).is_err());
        }
    }

    /// A length-framed body is exactly its length: never a byte more (the rest stays for
    /// the next message), and short input is truncation at EOF, never a shorter body.
    #[test]
    fn length_framing_is_exact(
        n in 0u64..80,
        input in proptest::collection::vec(any::<u8>(), 0..120),
        split in pieces(),
    ) {
        let got = decode_split(Decoder::length(n), &input, &split, true);
        if (input.len() as u64) < n {
            prop_assert_eq!(got, Outcome::Failed(FramingError::Truncated));
        } else {
            let data = input[..n as usize].to_vec();
            prop_assert_eq!(got, Outcome::Body { data, trailers: 0 });
            let mut d = Decoder::length(n);
            let mut buf = BytesMut::from(&input[..]);
            let mut taken = 0;
            while let Ok(Step::Data(b)) = d.decode(&mut buf) {
                taken += b.len();
            }
            prop_assert_eq!((taken, buf.len()), (n as usize, input.len() - n as usize));
        }
    }

    /// The declared length follows a plain model: Transfer-Encoding wins and must end in
    /// `chunked` with no Content-Length beside it; every Content-Length value (lists split
    /// at commas) must be 1 to 19 digits and all the same.
    #[test]
    fn declared_length_follows_the_model(
        te in proptest::option::of(prop_oneof![
            Just("chunked".to_string()),
            Just("gzip, chunked".to_string()),
            Just("chunked, gzip".to_string()),
            "[a-z ,]{0,12}",
        ]),
        cls in proptest::collection::vec(
            prop_oneof![
                "[0-9]{1,3}",
                Just("5, 5".to_string()),
                Just("5,6".to_string()),
                "[ 0-9+,x-]{0,6}",
                Just("99999999999999999999".to_string()),
            ],
            0..3,
        ),
        http10 in any::<bool>(),
    ) {
        let version = if http10 { Version::HTTP_10 } else { Version::HTTP_11 };
        let got = declared(version, te.as_deref().map(str::as_bytes), cls.iter().map(|c| c.as_bytes()));
        let model = match &te {
            Some(_) if http10 => Err(FramingError::TransferEncodingOnHttp10),
            Some(_) if !cls.is_empty() => Err(FramingError::BothTransferEncodingAndContentLength),
            Some(t) if t.rsplit(',').next().is_some_and(|last| last.trim() == "chunked") => {
                Ok(Declared::Chunked)
            }
            Some(_) => Err(FramingError::TransferEncodingNotChunked),
            None => {
                let mut length: Option<u64> = None;
                let mut result = Ok(());
                for part in cls.iter().flat_map(|c| c.split(',')) {
                    let p = part.trim();
                    if p.is_empty() || p.len() > 19 || !p.bytes().all(|b| b.is_ascii_digit()) {
                        result = Err(FramingError::InvalidContentLength);
                        break;
                    }
                    let n: u64 = p.parse().unwrap();
                    if length.is_some_and(|l| l != n) {
                        result = Err(FramingError::ConflictingContentLength);
                        break;
                    }
                    length = Some(n);
                }
                result.map(|()| length.map_or(Declared::Nothing, Declared::Length))
            }
        };
        prop_assert_eq!(got, model);
    }
}

/// The committed corpus: inputs that once broke, or that a conformance suite sends, with
/// what decoding them whole must give (`None`: a body of that many bytes).
const NASTY: &[(&[u8], Result<usize, FramingError>)] = &[
    (
        b"10000000000000000\r\nx\r\n0\r\n\r\n",
        Err(FramingError::InvalidChunkSize),
    ),
    (
        b"-5\r\nhello\r\n0\r\n\r\n",
        Err(FramingError::InvalidChunkSize),
    ),
    (
        b"0x5\r\nhello\r\n0\r\n\r\n",
        Err(FramingError::InvalidChunkSize),
    ),
    (
        b"5\r\nhelloEXTRA\r\n0\r\n\r\n",
        Err(FramingError::ChunkOverrun),
    ),
    (b"5\r\nhelloX", Err(FramingError::ChunkOverrun)),
    (b"5\r\nhello\n0\r\n\r\n", Err(FramingError::ChunkOverrun)),
    (
        b"5\nhello\r\n0\r\n\r\n",
        Err(FramingError::InvalidChunkSize),
    ),
    (
        b" 5\r\nhello\r\n0\r\n\r\n",
        Err(FramingError::InvalidChunkSize),
    ),
    (
        b"5 \r\nhello\r\n0\r\n\r\n",
        Err(FramingError::InvalidChunkSize),
    ),
    (b"5;\r\nhello\r\n0\r\n\r\n", Ok(5)),
    (b"5 ;a=b\r\nhello\r\n0\r\n\r\n", Ok(5)),
    (
        b"5;a\x00\r\nhello\r\n0\r\n\r\n",
        Err(FramingError::InvalidChunkSize),
    ),
    (
        b"+5\r\nhello\r\n0\r\n\r\n",
        Err(FramingError::InvalidChunkSize),
    ),
    (
        b"fffffffffffffffff\r\n",
        Err(FramingError::InvalidChunkSize),
    ),
    (b"0\r\n\r\n", Ok(0)),
    (b"000\r\n\r\n", Ok(0)),
    (b"0\r\nx: 1\r\n\r\n", Ok(0)),
    (b"0\r\nx : 1\r\n\r\n", Err(FramingError::InvalidTrailers)),
    (b"0\r\n\r", Err(FramingError::Truncated)),
    (b"5\r\nhel", Err(FramingError::Truncated)),
    (b"", Err(FramingError::Truncated)),
];

#[test]
fn nasty_chunked_inputs() {
    for (input, want) in NASTY {
        let want = match want {
            Ok(n) => Outcome::Body {
                data: input
                    .get(input.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1)..)
                    .map(|rest| rest[..*n].to_vec())
                    .unwrap_or_default(),
                trailers: usize::from(input.windows(3).any(|w| w == b"x: ")),
            },
            Err(e) => Outcome::Failed(*e),
        };
        let shown = String::from_utf8_lossy(input);
        assert_eq!(whole(Decoder::chunked(), input), want, "{shown:?}");
        assert_eq!(
            decode_split(Decoder::chunked(), input, &[1], true),
            want,
            "{shown:?} a byte at a time"
        );
    }
    // A chunk line or a trailer section past its limit, arriving whole or in pieces.
    let mut long = b"5;".to_vec();
    long.resize(MAX_CHUNK_LINE + 10, b'a');
    long.extend_from_slice(b"\r\nhello\r\n0\r\n\r\n");
    for split in [long.len(), 1000] {
        assert_eq!(
            decode_split(Decoder::chunked(), &long, &[split], true),
            Outcome::Failed(FramingError::ChunkLineTooLong)
        );
    }
    let mut big = b"0\r\n".to_vec();
    for i in 0..30 {
        big.extend_from_slice(format!("x-{i}: {}\r\n", "v".repeat(600)).as_bytes());
    }
    big.extend_from_slice(b"\r\n");
    for split in [big.len(), 1000] {
        assert_eq!(
            decode_split(Decoder::chunked(), &big, &[split], true),
            Outcome::Failed(FramingError::TrailersTooLarge)
        );
    }
}
