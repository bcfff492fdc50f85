//! Validation of routes' response compression (`crate::compression`).

use crate::compression::{CompressionConfig, MAX_BROTLI_LEVEL, MAX_GZIP_LEVEL, MAX_ZSTD_LEVEL};
use crate::locate::KeyPath;
use crate::model::Config;
use crate::validate::Problems;

pub(crate) fn check(config: &Config, p: &mut Problems) {
    for (i, r) in config.routes.iter().enumerate() {
        if let Some(c) = &r.compression {
            let at = KeyPath::root().key("routes").index(i).key("compression");
            check_one(c, &at, p);
        }
    }
}

fn check_one(c: &CompressionConfig, at: &KeyPath, p: &mut Problems) {
    if c.algorithms.is_empty() {
        p.push(
            at.key("algorithms"),
            "no algorithm to compress with; expected some of \"zstd\", \"br\", \"gzip\" (or no [routes.compression])",
        );
    }
    for (j, a) in c.algorithms.iter().enumerate() {
        if c.algorithms[..j].contains(a) {
            p.push(
                at.key("algorithms").index(j),
                format!(
                    "{:?} is listed twice; expected each algorithm once",
                    a.token()
                ),
            );
        }
    }
    if c.content_types.is_empty() {
        p.push(
            at.key("content_types"),
            "no media type to compress; expected e.g. [\"text/*\", \"application/json\"]",
        );
    }
    for (j, t) in c.content_types.iter().enumerate() {
        if let Err(why) = check_media_pattern(t) {
            p.push(
                at.key("content_types").index(j),
                format!("{t:?}: {why}; expected \"type/subtype\", \"type/*\", \"type/*+suffix\" or \"*/*\""),
            );
        }
    }
    level(
        c.gzip_level as i64,
        MAX_GZIP_LEVEL as i64,
        1,
        at.key("gzip_level"),
        p,
    );
    level(
        c.brotli_level as i64,
        MAX_BROTLI_LEVEL as i64,
        0,
        at.key("brotli_level"),
        p,
    );
    level(
        c.zstd_level as i64,
        MAX_ZSTD_LEVEL as i64,
        1,
        at.key("zstd_level"),
        p,
    );
}

fn level(value: i64, max: i64, min: i64, at: KeyPath, p: &mut Problems) {
    if !(min..=max).contains(&value) {
        p.push(
            at,
            format!("level {value} is out of range; expected {min} (fastest) to {max} (smallest)"),
        );
    }
}

/// A media type pattern: `type/subtype`, `type/*`, `type/*+suffix` (tokens, no parameters).
fn check_media_pattern(t: &str) -> Result<(), &'static str> {
    if t == "*/*" {
        return Ok(());
    }
    let Some((top, sub)) = t.split_once('/') else {
        return Err("no '/'");
    };
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    if !token(top) {
        return Err("the type is not a token");
    }
    let sub_ok = match sub.strip_prefix('*') {
        Some("") => true,
        Some(suffix) => suffix.starts_with('+') && token(suffix),
        None => token(sub),
    };
    if !sub_ok {
        return Err("the subtype is not a token, \"*\" or \"*+suffix\"");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_media_pattern;

    #[test]
    fn media_patterns() {
        for ok in [
            "*/*",
            "text/*",
            "application/json",
            "application/*+json",
            "image/svg+xml",
        ] {
            assert!(check_media_pattern(ok).is_ok(), "{ok}");
        }
        for bad in [
            "text",
            "*/html",
            "text/",
            "text/*json",
            "text/html; charset=utf-8",
            "",
        ] {
            assert!(check_media_pattern(bad).is_err(), "{bad}");
        }
    }
}
