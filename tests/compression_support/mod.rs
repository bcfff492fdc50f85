//! What the compression tests share: an origin whose path picks the response
//! (`/<kind>/<length>`), the body it serves, a gateway with compressing routes, and
//! decoders for each algorithm.
#![allow(dead_code)]

use std::io::Read;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::support::{config_text, raw_origin, read_head, start_gateway, RawOrigin, TestGateway};

/// The largest body the origin serves.
pub const BIG: usize = 8 * 1024 * 1024;

/// The first `n` bytes of a deterministic text: numbered lines of words picked by a
/// linear congruential generator, compressible about 3 to 5 times.
pub fn body(n: usize) -> &'static [u8] {
    static TEXT: OnceLock<Vec<u8>> = OnceLock::new();
    let text = TEXT.get_or_init(|| {
        const WORDS: [&str; 16] = [
            "gateway", "origin", "route", "cluster", "stream", "frame", "window", "chunk",
            "header", "body", "encode", "decode", "zstd", "brotli", "gzip", "vary",
        ];
        let mut out = Vec::with_capacity(BIG + 128);
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut line = 0u64;
        while out.len() < BIG {
            out.extend_from_slice(format!("{line:08}").as_bytes());
            for _ in 0..8 {
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                out.push(b' ');
                out.extend_from_slice(WORDS[(x >> 60) as usize].as_bytes());
                out.extend_from_slice(format!("{}", (x >> 40) % 1000).as_bytes());
            }
            out.push(b'\n');
            line += 1;
        }
        out.truncate(BIG);
        out
    });
    &text[..n]
}

/// The test origin, and the signal that lets `/sse` send its second event.
pub struct Origin {
    pub raw: RawOrigin,
    pub release: Arc<Notify>,
}

/// An origin that answers, by path:
/// - `/text/N`: 200, `text/plain`, `Content-Length`, a strong ETag, `Vary: Origin`,
///   `Accept-Ranges: bytes` (HEAD: the same head, no body)
/// - `/chunked/N`: 200, `application/json`, chunked in 64 KiB chunks
/// - `/png/N`, `/encoded/N` (`Content-Encoding: gzip`), `/range/N` (206),
///   `/notransform/N` (`Cache-Control: no-transform`), `/nocontent` (204),
///   `/notmodified` (304)
/// - `/sse`: `text/event-stream`, one event, then a second once `release` is notified.
pub async fn origin() -> Origin {
    let release = Arc::new(Notify::new());
    let r = release.clone();
    let raw = raw_origin(move |mut s, _| {
        let r = r.clone();
        async move {
            let mut carry = Vec::new();
            while let Some(head) = read_head(&mut s, &mut carry).await {
                if answer(&mut s, &head, &r).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    Origin { raw, release }
}

async fn answer(s: &mut TcpStream, head: &str, release: &Notify) -> std::io::Result<()> {
    let line = head.lines().next().unwrap_or("");
    let mut words = line.split(' ');
    let method = words.next().unwrap_or("");
    let path = words.next().unwrap_or("");
    let mut parts = path.trim_start_matches('/').split('/');
    let kind = parts.next().unwrap_or("");
    let n: usize = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let b = body(n.min(BIG));
    let fixed = |status: &str, fields: &str| {
        format!("HTTP/1.1 {status}\r\n{fields}Content-Length: {n}\r\n\r\n")
    };
    let head = match kind {
        "text" => fixed(
            "200 OK",
            "Content-Type: text/plain; charset=utf-8\r\nETag: \"v1\"\r\nVary: Origin\r\nAccept-Ranges: bytes\r\n",
        ),
        "png" => fixed("200 OK", "Content-Type: image/png\r\n"),
        "encoded" => fixed("200 OK", "Content-Type: text/plain\r\nContent-Encoding: gzip\r\n"),
        "range" => fixed(
            "206 Partial Content",
            &format!("Content-Type: text/plain\r\nContent-Range: bytes 0-{}/{}\r\n", n.max(1) - 1, 2 * n),
        ),
        "notransform" => fixed(
            "200 OK",
            "Content-Type: text/plain\r\nCache-Control: public, no-transform\r\n",
        ),
        "nocontent" => return s.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await,
        "notmodified" => {
            return s
                .write_all(b"HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nContent-Type: text/plain\r\n\r\n")
                .await
        }
        "chunked" => return chunked(s, "application/json", b, method).await,
        "sse" => return events(s, release).await,
        _ => return s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n").await,
    };
    s.write_all(head.as_bytes()).await?;
    if method != "HEAD" {
        s.write_all(b).await?;
    }
    Ok(())
}

async fn chunked(s: &mut TcpStream, ct: &str, b: &[u8], method: &str) -> std::io::Result<()> {
    let head =
        format!("HTTP/1.1 200 OK\r\nContent-Type: {ct}\r\nTransfer-Encoding: chunked\r\n\r\n");
    s.write_all(head.as_bytes()).await?;
    if method == "HEAD" {
        return Ok(());
    }
    for c in b.chunks(64 * 1024) {
        s.write_all(format!("{:x}\r\n", c.len()).as_bytes()).await?;
        s.write_all(c).await?;
        s.write_all(b"\r\n").await?;
    }
    s.write_all(b"0\r\n\r\n").await
}

/// The first event of `/sse`; the second follows when the test releases it.
pub const EVENT_ONE: &[u8] = b"data: {\"n\": 1}\n\n";
pub const EVENT_TWO: &[u8] = b"data: {\"n\": 2}\n\n";

async fn events(s: &mut TcpStream, release: &Notify) -> std::io::Result<()> {
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";
    s.write_all(head.as_bytes()).await?;
    for (i, event) in [EVENT_ONE, EVENT_TWO].into_iter().enumerate() {
        if i == 1 {
            let _ = tokio::time::timeout(Duration::from_secs(10), release.notified()).await;
        }
        s.write_all(format!("{:x}\r\n", event.len()).as_bytes())
            .await?;
        s.write_all(event).await?;
        s.write_all(b"\r\n").await?;
    }
    s.write_all(b"0\r\n\r\n").await
}

/// Routes: `/z/…` compresses with the defaults; `/g/…` offers gzip then brotli from 100
/// bytes at gzip level 1; anything else goes to the `default` route, which does not
/// compress. The prefix is stripped before the origin sees the path.
pub fn gateway(origin: &Origin) -> TestGateway {
    let routes = r#"
[[routes]]
name = "zip"
cluster = "origin"
match = { path_prefix = "/z/" }
rewrite = { strip_prefix = "/z" }
compression = {}

[[routes]]
name = "gzbr"
cluster = "origin"
match = { path_prefix = "/g/" }
rewrite = { strip_prefix = "/g" }
compression = { algorithms = ["gzip", "br"], min_size = "100B", gzip_level = 1 }
"#;
    start_gateway(&config_text(origin.raw.addr, "", routes))
}

/// `data` decoded as `Content-Encoding: encoding` says.
pub fn decode(encoding: &str, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match encoding {
        "gzip" => {
            flate2::read::GzDecoder::new(data)
                .read_to_end(&mut out)
                .expect("gzip decodes");
        }
        "br" => {
            brotli::Decompressor::new(data, 4096)
                .read_to_end(&mut out)
                .expect("brotli decodes");
        }
        "zstd" => out = zstd::stream::decode_all(data).expect("zstd decodes"),
        other => panic!("unexpected encoding {other:?}"),
    }
    out
}

/// A decoder fed a frame at a time, whose output so far can be read (a streaming client).
pub enum StreamDecoder {
    Gzip(Box<flate2::write::GzDecoder<Vec<u8>>>),
    Brotli(Box<brotli::DecompressorWriter<Vec<u8>>>),
    Zstd(Box<zstd::stream::write::Decoder<'static, Vec<u8>>>),
}

impl StreamDecoder {
    pub fn new(encoding: &str) -> StreamDecoder {
        match encoding {
            "gzip" => StreamDecoder::Gzip(Box::new(flate2::write::GzDecoder::new(Vec::new()))),
            "br" => {
                StreamDecoder::Brotli(Box::new(brotli::DecompressorWriter::new(Vec::new(), 4096)))
            }
            "zstd" => StreamDecoder::Zstd(Box::new(
                zstd::stream::write::Decoder::new(Vec::new()).unwrap(),
            )),
            other => panic!("unexpected encoding {other:?}"),
        }
    }

    /// Feed `data`; returns everything decoded so far.
    pub fn feed(&mut self, data: &[u8]) -> &[u8] {
        use std::io::Write;
        match self {
            StreamDecoder::Gzip(d) => {
                d.write_all(data).unwrap();
                d.flush().unwrap();
                d.get_ref()
            }
            StreamDecoder::Brotli(d) => {
                d.write_all(data).unwrap();
                d.flush().unwrap();
                d.get_ref()
            }
            StreamDecoder::Zstd(d) => {
                d.write_all(data).unwrap();
                d.flush().unwrap();
                d.get_ref()
            }
        }
    }
}
