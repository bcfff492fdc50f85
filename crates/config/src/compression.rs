//! Response compression of a route (`[routes.compression]`). Absent: the route's bodies pass
//! byte-identical (design law 3). Every key has a default (documented in
//! `docs/configuration.md`).

use serde::{Deserialize, Serialize};

use crate::units::ByteSize;

/// A compression algorithm, by its `Content-Encoding` token.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub enum CompressionAlgorithm {
    #[serde(rename = "zstd")]
    Zstd,
    #[serde(rename = "br", alias = "brotli")]
    Brotli,
    #[serde(rename = "gzip")]
    Gzip,
}

impl CompressionAlgorithm {
    /// The `Content-Encoding` token.
    pub fn token(self) -> &'static str {
        match self {
            CompressionAlgorithm::Zstd => "zstd",
            CompressionAlgorithm::Brotli => "br",
            CompressionAlgorithm::Gzip => "gzip",
        }
    }
}

/// `[routes.compression]`: compress this route's responses for clients that accept it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CompressionConfig {
    /// The algorithms offered, in the server's order of preference (which breaks ties
    /// between equal `q` values of the client's `Accept-Encoding`).
    pub algorithms: Vec<CompressionAlgorithm>,
    /// A response whose `Content-Length` is below this is sent as it is. A response without
    /// one (chunked, or until close) is compressed: its length is not known in advance.
    pub min_size: ByteSize,
    /// Media types compressed: `"text/html"`, `"text/*"` (any subtype) or
    /// `"application/*+json"` (any subtype with that suffix); parameters are ignored.
    pub content_types: Vec<String>,
    /// gzip level, 1 (fastest) to 9 (smallest).
    pub gzip_level: u32,
    /// Brotli quality, 0 (fastest) to 11 (smallest).
    pub brotli_level: u32,
    /// zstd level, 1 (fastest) to 19 (smallest).
    pub zstd_level: i32,
}

/// The media types compressed by default: text and the structured text formats.
pub const DEFAULT_COMPRESSED_TYPES: &[&str] = &[
    "text/*",
    "application/json",
    "application/*+json",
    "application/javascript",
    "application/x-javascript",
    "application/ecmascript",
    "application/xml",
    "application/*+xml",
    "application/x-ndjson",
    "application/wasm",
    "image/svg+xml",
];

/// Highest level of each algorithm.
pub const MAX_GZIP_LEVEL: u32 = 9;
pub const MAX_BROTLI_LEVEL: u32 = 11;
pub const MAX_ZSTD_LEVEL: i32 = 19;

impl Default for CompressionConfig {
    fn default() -> Self {
        Self {
            algorithms: vec![
                CompressionAlgorithm::Zstd,
                CompressionAlgorithm::Brotli,
                CompressionAlgorithm::Gzip,
            ],
            min_size: ByteSize(1024),
            content_types: DEFAULT_COMPRESSED_TYPES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            gzip_level: 6,
            brotli_level: 4,
            zstd_level: 3,
        }
    }
}
