//! Response bodies of the stub origin: deterministic, gzip-realistic text and its cached gzip
//! variants.
//!
//! The identity body of length `n` is the first `n` bytes of an endless repetition of one
//! precomputed block ([`BLOCK_LEN`] bytes of HTML-like markup and JSON records generated from a
//! fixed seed). The block is longer than gzip's 32 KiB window, so repetition never makes the
//! content compress better than real pages do (about 4x at the default level). Serving slices
//! the block (`Bytes::slice`, no copy); gzip variants are compressed once per length and cached.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

use bytes::Bytes;
use flate2::write::GzEncoder;
use flate2::Compression;

/// Length of the precomputed block that identity bodies repeat.
pub const BLOCK_LEN: usize = 256 * 1024;

/// Largest `length=` the stub accepts.
pub const MAX_LENGTH: usize = 1 << 30;

/// Compressed bytes kept in the gzip cache before it is cleared.
const GZIP_CACHE_BUDGET: usize = 64 * 1024 * 1024;

const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "for",
    "on",
    "with",
    "that",
    "by",
    "this",
    "from",
    "at",
    "new",
    "season",
    "episode",
    "series",
    "film",
    "drama",
    "comedy",
    "thriller",
    "action",
    "documentary",
    "family",
    "stream",
    "watch",
    "now",
    "trailer",
    "cast",
    "director",
    "original",
    "award",
    "winning",
    "story",
    "life",
    "world",
    "love",
    "night",
    "city",
    "house",
    "secret",
    "dark",
    "light",
    "last",
    "first",
    "young",
    "detective",
    "journey",
    "mystery",
    "crime",
    "history",
    "nature",
    "space",
    "music",
    "kids",
    "anime",
    "classic",
    "popular",
    "trending",
    "recommended",
    "because",
    "you",
    "watched",
    "continue",
    "watching",
    "list",
    "my",
    "top",
    "picks",
    "critically",
    "acclaimed",
    "british",
    "american",
    "korean",
    "spanish",
    "french",
    "their",
    "when",
    "after",
    "before",
    "must",
    "find",
    "way",
    "home",
    "against",
    "time",
    "two",
    "brothers",
    "sisters",
    "friends",
    "small",
    "town",
    "big",
    "dreams",
    "road",
    "trip",
];

const GENRES: &[&str] = &[
    "Drama",
    "Comedy",
    "Thriller",
    "Action & Adventure",
    "Documentaries",
    "Kids & Family",
    "Sci-Fi & Fantasy",
    "Romance",
    "Horror",
    "Anime",
];

fn words(rng: &mut fastrand::Rng, out: &mut String, n: usize, capitalise: bool) {
    for i in 0..n {
        if i > 0 {
            out.push(' ');
        }
        // Squaring the uniform index skews towards the first words, roughly like real text.
        let r = rng.f64();
        let word = WORDS[((r * r) * WORDS.len() as f64) as usize % WORDS.len()];
        if capitalise && i == 0 {
            let mut chars = word.chars();
            if let Some(c) = chars.next() {
                out.extend(c.to_uppercase());
                out.push_str(chars.as_str());
            }
        } else {
            out.push_str(word);
        }
    }
}

fn html_row(rng: &mut fastrand::Rng, out: &mut String) {
    let id = 70_000_000 + rng.u32(0..10_000_000);
    let genre = GENRES[rng.usize(0..GENRES.len())];
    out.push_str("<div class=\"title-card\" data-id=\"");
    out.push_str(&id.to_string());
    out.push_str("\"><a class=\"title-link\" href=\"/title/");
    out.push_str(&id.to_string());
    out.push_str("\"><img src=\"https://img.example.net/boxart/");
    out.push_str(&format!("{:08x}", rng.u32(..)));
    out.push_str(".jpg\" alt=\"");
    let title_len = rng.usize(1..5);
    words(rng, out, title_len, true);
    out.push_str("\"></a><span class=\"genre\">");
    out.push_str(genre);
    out.push_str("</span><p class=\"synopsis\">");
    let synopsis_len = rng.usize(8..24);
    words(rng, out, synopsis_len, true);
    out.push_str(".</p></div>\n");
}

fn json_row(rng: &mut fastrand::Rng, out: &mut String) {
    out.push_str("{\"id\":");
    out.push_str(&(80_000_000 + rng.u32(0..1_000_000)).to_string());
    out.push_str(",\"title\":\"");
    let title_len = rng.usize(1..5);
    words(rng, out, title_len, true);
    out.push_str("\",\"year\":");
    out.push_str(&rng.u32(1970..2014).to_string());
    out.push_str(",\"rating\":");
    out.push_str(&format!("{}.{}", rng.u32(1..5), rng.u32(0..10)));
    out.push_str(",\"genres\":[\"");
    out.push_str(GENRES[rng.usize(0..GENRES.len())]);
    out.push_str("\",\"");
    out.push_str(GENRES[rng.usize(0..GENRES.len())]);
    out.push_str("\"],\"maturity\":\"");
    out.push_str(["G", "PG", "PG-13", "TV-MA", "R"][rng.usize(0..5)]);
    out.push_str("\",\"synopsis\":\"");
    let synopsis_len = rng.usize(6..20);
    words(rng, out, synopsis_len, true);
    out.push_str(".\"}\n");
}

fn generate_block() -> Bytes {
    let mut rng = fastrand::Rng::with_seed(0x6b65_796d_6173_7465); // "keymaste"
    let mut out = String::with_capacity(BLOCK_LEN + 1024);
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>keymaster stub</title></head><body>\n");
    while out.len() < BLOCK_LEN {
        if rng.u8(0..3) == 0 {
            json_row(&mut rng, &mut out);
        } else {
            html_row(&mut rng, &mut out);
        }
    }
    let mut bytes = out.into_bytes();
    bytes.truncate(BLOCK_LEN);
    Bytes::from(bytes)
}

/// The precomputed block identity bodies repeat.
pub(crate) fn block() -> &'static Bytes {
    static BLOCK: OnceLock<Bytes> = OnceLock::new();
    BLOCK.get_or_init(generate_block)
}

/// The identity body the stub serves for `length=N`, as one contiguous buffer.
///
/// Zero-copy up to [`BLOCK_LEN`]; longer bodies are assembled (a test helper; the server streams
/// slices of the block instead).
pub fn stub_body(length: usize) -> Bytes {
    let block = block();
    if length <= block.len() {
        return block.slice(..length);
    }
    let mut out = Vec::with_capacity(length);
    while out.len() < length {
        let take = (length - out.len()).min(block.len());
        out.extend_from_slice(&block[..take]);
    }
    Bytes::from(out)
}

fn compress(length: usize) -> Bytes {
    let mut encoder = GzEncoder::new(Vec::with_capacity(length / 3 + 64), Compression::default());
    let block = block();
    let mut left = length;
    while left > 0 {
        let take = left.min(block.len());
        // Writing into a Vec cannot fail.
        let _ = encoder.write_all(&block[..take]);
        left -= take;
    }
    Bytes::from(encoder.finish().unwrap_or_default())
}

struct GzipCache {
    map: HashMap<usize, Bytes>,
    bytes: usize,
}

fn gzip_cache() -> &'static Mutex<GzipCache> {
    static CACHE: OnceLock<Mutex<GzipCache>> = OnceLock::new();
    CACHE.get_or_init(|| {
        Mutex::new(GzipCache {
            map: HashMap::new(),
            bytes: 0,
        })
    })
}

/// The cached gzip body for `length`, if it was compressed before.
pub(crate) fn cached_gzip(length: usize) -> Option<Bytes> {
    let cache = gzip_cache().lock().unwrap_or_else(|e| e.into_inner());
    cache.map.get(&length).cloned()
}

/// The gzip-compressed body the stub serves for `length=N&gzip=1`: `stub_body(length)` compressed
/// at the default level with a fixed header (mtime 0, no name), so it is byte-identical on every
/// call. Compressed once per length and cached (the cache is cleared when it passes 64 MiB).
pub fn stub_body_gzip(length: usize) -> Bytes {
    if let Some(hit) = cached_gzip(length) {
        return hit;
    }
    let gz = compress(length);
    let mut cache = gzip_cache().lock().unwrap_or_else(|e| e.into_inner());
    if cache.bytes + gz.len() > GZIP_CACHE_BUDGET {
        cache.map.clear();
        cache.bytes = 0;
    }
    if gz.len() <= GZIP_CACHE_BUDGET && !cache.map.contains_key(&length) {
        cache.bytes += gz.len();
        cache.map.insert(length, gz.clone());
    }
    gz
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn gunzip(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(data)
            .read_to_end(&mut out)
            .expect("valid gzip");
        out
    }

    #[test]
    fn lengths_are_exact_and_prefixes_agree() {
        for n in [
            0,
            1,
            100,
            1000,
            BLOCK_LEN - 1,
            BLOCK_LEN,
            BLOCK_LEN + 1,
            3 * BLOCK_LEN + 7,
        ] {
            let body = stub_body(n);
            assert_eq!(body.len(), n);
            assert_eq!(&body[..n.min(1000)], &stub_body(1000)[..n.min(1000)]);
        }
        let long = stub_body(2 * BLOCK_LEN + 10);
        assert_eq!(&long[BLOCK_LEN..BLOCK_LEN + 10], &long[..10]);
    }

    #[test]
    fn content_is_text_and_deterministic() {
        assert_eq!(generate_block(), *block());
        assert!(block().iter().all(|b| b.is_ascii()));
        assert!(block().starts_with(b"<!DOCTYPE html>"));
    }

    #[test]
    fn compresses_like_real_pages() {
        for n in [10_000, 100_000, 1_000_000] {
            let ratio = n as f64 / stub_body_gzip(n).len() as f64;
            assert!((3.0..=6.0).contains(&ratio), "length {n}: ratio {ratio:.2}");
        }
    }

    #[test]
    fn gzip_round_trips_and_is_byte_stable() {
        for n in [0, 1, 1000, 10_000, BLOCK_LEN + 5] {
            let gz = stub_body_gzip(n);
            assert_eq!(gunzip(&gz), stub_body(n));
            assert_eq!(gz, compress(n), "cached and fresh compression agree");
            assert_eq!(gz, stub_body_gzip(n));
        }
    }
}
