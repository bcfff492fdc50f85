//! `[routes.compression]`: one failing case per rule, each asserting the exact key and line
//! reported; the defaults and the documented example load.

mod rule_support;

use keymaster_config::{load_str, CompressionAlgorithm};
use rule_support::{one, BASE};

#[test]
fn absent_means_off_and_empty_means_defaults() {
    let c = load_str(BASE, "t.toml").unwrap();
    assert!(c.routes[0].compression.is_none());
    let c = load_str(&format!("{BASE}compression = {{}}\n"), "t.toml").unwrap();
    let z = c.routes[0].compression.as_ref().unwrap();
    assert_eq!(
        z.algorithms,
        [
            CompressionAlgorithm::Zstd,
            CompressionAlgorithm::Brotli,
            CompressionAlgorithm::Gzip
        ]
    );
    assert_eq!(z.min_size.get(), 1024);
    assert!(z.content_types.iter().any(|t| t == "text/*"));
    assert_eq!((z.gzip_level, z.brotli_level, z.zstd_level), (6, 4, 3));
    let c = load_str(
        &format!("{BASE}compression = {{ algorithms = [\"brotli\", \"gzip\"] }}\n"),
        "t.toml",
    )
    .unwrap();
    let z = c.routes[0].compression.as_ref().unwrap();
    assert_eq!(z.algorithms[0], CompressionAlgorithm::Brotli);
}

#[test]
fn algorithms() {
    one(
        "[routes.compression]\nalgorithms = []\n",
        "routes[0].compression.algorithms",
        13,
        "no algorithm",
    );
    one(
        "[routes.compression]\nalgorithms = [\"gzip\",\n \"gzip\"]\n",
        "routes[0].compression.algorithms[1]",
        14,
        "listed twice",
    );
    one(
        "[routes.compression]\nmin_size = \"1KiB\"\nalgorithms = [\"deflate\"]\n",
        "routes[0].compression.algorithms[0]",
        14,
        "deflate",
    );
}

#[test]
fn levels() {
    one(
        "[routes.compression]\ngzip_level = 0\n",
        "routes[0].compression.gzip_level",
        13,
        "expected 1 (fastest) to 9 (smallest)",
    );
    one(
        "[routes.compression]\nbrotli_level = 12\n",
        "routes[0].compression.brotli_level",
        13,
        "expected 0 (fastest) to 11 (smallest)",
    );
    one(
        "[routes.compression]\nzstd_level = 20\n",
        "routes[0].compression.zstd_level",
        13,
        "expected 1 (fastest) to 19 (smallest)",
    );
}

#[test]
fn content_types() {
    one(
        "[routes.compression]\ncontent_types = []\n",
        "routes[0].compression.content_types",
        13,
        "no media type",
    );
    one(
        "[routes.compression]\ncontent_types = [\"text/*\",\n \"text/html; charset=utf-8\"]\n",
        "routes[0].compression.content_types[1]",
        14,
        "the subtype is not a token",
    );
    one(
        "[routes.compression]\ncontent_types = [\"json\"]\n",
        "routes[0].compression.content_types[0]",
        13,
        "no '/'",
    );
}

#[test]
fn unknown_keys_are_located() {
    one(
        "[routes.compression]\nlevel = 5\n",
        "routes[0].compression.level",
        13,
        "unknown field",
    );
}
