use super::*;
use std::io::Read;

fn policy(cfg: &CompressionConfig) -> Policy {
    Policy::compile(cfg, "r", &crate::metrics::Metrics::new())
}

fn head(fields: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in fields {
        h.append(
            header::HeaderName::from_bytes(n.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

fn decode(a: Algorithm, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match a {
        Algorithm::Gzip => {
            flate2::read::GzDecoder::new(data)
                .read_to_end(&mut out)
                .unwrap();
        }
        Algorithm::Brotli => {
            brotli::Decompressor::new(data, 4096)
                .read_to_end(&mut out)
                .unwrap();
        }
        Algorithm::Zstd => out = zstd::stream::decode_all(data).unwrap(),
    };
    out
}

#[test]
fn media_types() {
    let p = policy(&CompressionConfig::default());
    let ok = |ct: &str| p.eligible(StatusCode::OK, &head(&[("content-type", ct)]));
    assert!(ok("text/html; charset=utf-8"));
    assert!(ok("TEXT/Plain"));
    assert!(ok("application/json"));
    assert!(ok("application/problem+json"));
    assert!(ok("image/svg+xml"));
    assert!(ok("application/atom+xml"));
    assert!(!ok("image/png"));
    assert!(!ok("application/octet-stream"));
    assert!(!ok("text"));
    assert!(
        !p.eligible(StatusCode::OK, &HeaderMap::new()),
        "no Content-Type"
    );
    let any = policy(&CompressionConfig {
        content_types: vec!["*/*".into()],
        ..Default::default()
    });
    assert!(any.eligible(StatusCode::OK, &head(&[("content-type", "image/png")])));
}

#[test]
fn exclusions() {
    let p = policy(&CompressionConfig::default());
    let text = ("content-type", "text/plain");
    let no = |status: u16, more: &[(&str, &str)]| {
        let mut fields = vec![text];
        fields.extend_from_slice(more);
        !p.eligible(StatusCode::from_u16(status).unwrap(), &head(&fields))
    };
    assert!(!no(200, &[]));
    assert!(!no(404, &[]));
    for status in [101, 103, 204, 206, 304] {
        assert!(no(status, &[]), "{status}");
    }
    assert!(no(200, &[("content-encoding", "gzip")]));
    assert!(no(200, &[("content-range", "bytes 0-1/2")]));
    assert!(no(200, &[("cache-control", "public, No-Transform")]));
    assert!(!no(200, &[("cache-control", "max-age=60")]));
    assert!(no(200, &[("content-length", "1023")]));
    assert!(!no(200, &[("content-length", "1024")]));
}

#[test]
fn vary_is_merged() {
    let mut h = HeaderMap::new();
    add_vary(&mut h);
    assert_eq!(h["vary"], "Accept-Encoding");
    let mut h = head(&[("vary", "Origin"), ("vary", "Cookie")]);
    add_vary(&mut h);
    assert_eq!(h.get_all("vary").iter().count(), 1);
    assert_eq!(h["vary"], "Origin, Cookie, Accept-Encoding");
    for kept in ["accept-encoding", "Origin, Accept-Encoding", "*"] {
        let mut h = head(&[("vary", kept)]);
        add_vary(&mut h);
        assert_eq!(h["vary"], kept);
    }
}

#[test]
fn encoded_head_fields() {
    let mut h = head(&[
        ("content-length", "5000"),
        ("accept-ranges", "bytes"),
        ("etag", "\"abc\""),
    ]);
    encoded_head(&mut h, Algorithm::Brotli);
    assert!(!h.contains_key("content-length") && !h.contains_key("accept-ranges"));
    assert_eq!(h["content-encoding"], "br");
    assert_eq!(h["etag"], "W/\"abc\"");
    let mut weak = head(&[("etag", "W/\"abc\"")]);
    encoded_head(&mut weak, Algorithm::Gzip);
    assert_eq!(weak["etag"], "W/\"abc\"");
}

#[test]
fn encoders_round_trip_with_flushes() {
    let levels = Levels {
        gzip: 6,
        brotli: 4,
        zstd: 3,
    };
    let text: Vec<u8> = (0..200_000u32)
        .flat_map(|i| format!("line {i} of a compressible body\n").into_bytes())
        .collect();
    for a in ALL {
        let mut e = Encoder::new(a, &levels, None).unwrap();
        let mut out = Vec::new();
        for (i, chunk) in text.chunks(7_001).enumerate() {
            e.write(chunk).unwrap();
            if i % 50 == 0 {
                // A flushed prefix decodes on its own: what a streaming client sees.
                e.flush().unwrap();
                out.extend_from_slice(&e.take());
                assert!(e.pending() == 0);
            }
        }
        e.finish().unwrap();
        out.extend_from_slice(&e.take());
        assert!(out.len() < text.len() / 5, "{a:?}: {}", out.len());
        assert_eq!(decode(a, &out), text, "{a:?}");
    }
}

#[test]
fn a_flush_makes_what_was_written_decodable() {
    let levels = Levels {
        gzip: 1,
        brotli: 1,
        zstd: 1,
    };
    let event = b"data: {\"tick\": 1}\n\n";
    for a in [Algorithm::Brotli, Algorithm::Zstd] {
        let mut e = Encoder::new(a, &levels, None).unwrap();
        e.write(event).unwrap();
        e.flush().unwrap();
        let flushed = e.take();
        assert!(!flushed.is_empty(), "{a:?}");
        // A streaming decoder gets the event back from the flushed bytes alone.
        let mut got = vec![0u8; event.len()];
        match a {
            Algorithm::Brotli => brotli::Decompressor::new(&flushed[..], 4096)
                .read_exact(&mut got)
                .unwrap(),
            _ => zstd::stream::read::Decoder::new(&flushed[..])
                .unwrap()
                .read_exact(&mut got)
                .unwrap(),
        }
        assert_eq!(&got, event, "{a:?}");
    }
    let mut e = Encoder::new(Algorithm::Gzip, &levels, None).unwrap();
    e.write(event).unwrap();
    e.flush().unwrap();
    let flushed = e.take();
    let mut got = vec![0u8; event.len()];
    flate2::read::GzDecoder::new(&flushed[..])
        .read_exact(&mut got)
        .unwrap();
    assert_eq!(&got, event);
}

#[test]
fn a_declared_size_shrinks_the_window_and_still_round_trips() {
    assert_eq!(encoder::window_log(None, 15, 9), 15);
    assert_eq!(encoder::window_log(Some(1 << 20), 15, 9), 15);
    assert_eq!(encoder::window_log(Some(10_000), 15, 9), 14);
    assert_eq!(encoder::window_log(Some(100), 15, 9), 9);
    let levels = Levels {
        gzip: 6,
        brotli: 4,
        zstd: 3,
    };
    for n in [0usize, 100, 5_000, 10_000, 70_000] {
        let text: Vec<u8> = (0..n).map(|i| b"abcdefgh"[(i * 7 + i / 13) % 8]).collect();
        for a in ALL {
            let mut e = Encoder::new(a, &levels, Some(n as u64)).unwrap();
            for chunk in text.chunks(3000) {
                e.write(chunk).unwrap();
                e.flush().unwrap();
            }
            e.finish().unwrap();
            assert_eq!(decode(a, &e.take()), text, "{a:?} {n}");
        }
    }
}
