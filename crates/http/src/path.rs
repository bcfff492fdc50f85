//! The canonical request path: one form of the path that routing, every filter and the
//! origin see, made before anything matches (docs/security.md).
//!
//! A path is made canonical in one pass over its segments (RFC 3986 §6.2.2):
//! - percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded, and the
//!   remaining escapes are written with upper-case hex digits;
//! - `.` and `..` segments are resolved (§5.2.4), the encoded ones (`%2e`) too;
//! - runs of `/` are merged into one (the listener's `path.merge_slashes`).
//!
//! What has no safe canonical form is refused (400), because origins disagree on what it
//! means: an encoded `/` or `\` (unless `path.escaped_slashes = "keep"`), a raw `\`, an
//! encoded NUL, a malformed escape, a `..` above the root, and a path parameter on an empty
//! or dot segment (`/;/x`, `/..;/x`: servlet containers strip the parameter and see `//x`
//! or `/../x`). Parameters on a named segment (`/a;v=1/b`) pass as they are.
//!
//! The common path needs none of this: [`canonical`] first checks, with one scan, whether
//! the path holds anything to change, and then returns `None` without allocating.

use http::uri::{PathAndQuery, Uri};
use keymaster_config::{EscapedSlashes, PathConfig};

use crate::error::{Error, Kind};

/// A listener's path policy, compiled from its `path` table.
#[derive(Debug, Clone, Copy)]
pub struct PathPolicy {
    merge_slashes: bool,
    keep_escaped_slashes: bool,
    /// The origin gets the client's path as sent when nothing rewrote it.
    pub forward_raw: bool,
}

impl PathPolicy {
    pub fn new(cfg: &PathConfig) -> PathPolicy {
        PathPolicy {
            merge_slashes: cfg.merge_slashes,
            keep_escaped_slashes: cfg.escaped_slashes == EscapedSlashes::Keep,
            forward_raw: cfg.forward == keymaster_config::ForwardPath::Raw,
        }
    }
}

impl Default for PathPolicy {
    fn default() -> Self {
        PathPolicy::new(&PathConfig::default())
    }
}

/// Make `uri`'s path canonical in place (the query stays as sent). Returns the client's own
/// path and query when the policy forwards the raw path and the canonical one differs.
pub fn canonicalise(uri: &mut Uri, policy: &PathPolicy) -> Result<Option<PathAndQuery>, Error> {
    // Authority-form (CONNECT) and `*` (OPTIONS only, checked with the head) have no path.
    let Some(pq) = uri.path_and_query().filter(|pq| pq.path() != "*") else {
        return Ok(None);
    };
    let path = canonical(pq.path(), policy).map_err(|why| Error::new(Kind::BadRequest, why))?;
    let Some(mut path) = path else {
        return Ok(None);
    };
    let raw = pq.clone();
    if let Some(q) = raw.query() {
        path.push('?');
        path.push_str(q);
    }
    let mut parts = std::mem::take(uri).into_parts();
    parts.path_and_query = Some(
        PathAndQuery::try_from(path)
            .map_err(|_| Error::new(Kind::BadRequest, "invalid request path"))?,
    );
    *uri = Uri::from_parts(parts)
        .map_err(|_| Error::new(Kind::BadRequest, "invalid request target"))?;
    Ok(policy.forward_raw.then_some(raw))
}

/// The canonical form of `path` (a request target's path, without the query), or `None`
/// when it already is canonical. The error says why the path was refused.
pub fn canonical(path: &str, policy: &PathPolicy) -> Result<Option<String>, &'static str> {
    let p = path.as_bytes();
    if p.first() != Some(&b'/') {
        return Err("the request path does not start with '/'");
    }
    if !needs_work(p, policy.merge_slashes) {
        return Ok(None);
    }
    normalise(&p[1..], policy).map(Some)
}

/// Whether `p` holds an escape, a backslash, a path parameter, an empty segment (when
/// merging) or a dot segment: anything [`normalise`] could change or refuse.
fn needs_work(p: &[u8], merge_slashes: bool) -> bool {
    if memchr::memchr3(b'%', b'\\', b';', p).is_some() {
        return true;
    }
    memchr::memchr_iter(b'/', p).any(|i| {
        let at = |k: usize| p.get(i + k).copied();
        let ends = |k: usize| matches!(at(k), None | Some(b'/'));
        match at(1) {
            Some(b'/') => merge_slashes,
            Some(b'.') => ends(2) || (at(2) == Some(b'.') && ends(3)),
            _ => false,
        }
    })
}

/// `rest` is the path after its leading `/`.
fn normalise(rest: &[u8], policy: &PathPolicy) -> Result<String, &'static str> {
    let mut out: Vec<u8> = Vec::with_capacity(rest.len() + 1);
    // Where each kept segment starts in `out` (at its '/'), for `..`.
    let mut starts: Vec<usize> = Vec::new();
    let mut seg = Vec::new();
    let count = rest.split(|&b| b == b'/').count();
    for (i, raw) in rest.split(|&b| b == b'/').enumerate() {
        let last = i + 1 == count;
        seg.clear();
        decode_segment(raw, policy, &mut seg)?;
        check_parameters(&seg)?;
        match seg.as_slice() {
            b"." => {}
            b".." => {
                let start = starts
                    .pop()
                    .ok_or("the path climbs above the root ('..')")?;
                out.truncate(start);
            }
            b"" if policy.merge_slashes || last => {}
            _ => {
                starts.push(out.len());
                out.push(b'/');
                out.extend_from_slice(&seg);
                continue;
            }
        }
        // A dot segment or an empty one at the end leaves the path ending in '/'.
        if last {
            out.push(b'/');
        }
    }
    if out.is_empty() {
        out.push(b'/');
    }
    // The input was UTF-8 and only ASCII was written in place of escapes.
    String::from_utf8(out).map_err(|_| "the request path is not valid UTF-8")
}

/// Decode the escapes of unreserved characters in one segment into `out`; upper-case the
/// hex of the others.
fn decode_segment(raw: &[u8], policy: &PathPolicy, out: &mut Vec<u8>) -> Result<(), &'static str> {
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        i += 1;
        if b == b'\\' {
            return Err("a backslash in the request path");
        }
        if b != b'%' {
            out.push(b);
            continue;
        }
        let v = match (raw.get(i).and_then(hex), raw.get(i + 1).and_then(hex)) {
            (Some(h), Some(l)) => h << 4 | l,
            _ => return Err("a malformed percent-escape in the request path"),
        };
        i += 2;
        if v.is_ascii_alphanumeric() || matches!(v, b'-' | b'.' | b'_' | b'~') {
            out.push(v);
            continue;
        }
        if v == 0 {
            return Err("an encoded NUL in the request path");
        }
        if matches!(v, b'/' | b'\\') && !policy.keep_escaped_slashes {
            return Err("an encoded '/' or '\\' in the request path");
        }
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        out.extend_from_slice(&[b'%', HEX[usize::from(v >> 4)], HEX[usize::from(v & 15)]]);
    }
    Ok(())
}

/// A parameter (`;...`) on an empty or dot segment is refused: servlet containers drop it
/// and then see an empty or dot segment the canonical path no longer has.
fn check_parameters(seg: &[u8]) -> Result<(), &'static str> {
    match memchr::memchr(b';', seg) {
        Some(at) if matches!(&seg[..at], b"" | b"." | b"..") => {
            Err("a path parameter on an empty or dot segment")
        }
        _ => Ok(()),
    }
}

fn hex(b: &u8) -> Option<u8> {
    (*b as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(merge_slashes: bool, keep_escaped_slashes: bool) -> PathPolicy {
        PathPolicy {
            merge_slashes,
            keep_escaped_slashes,
            forward_raw: false,
        }
    }

    fn canon(p: &str) -> Result<String, &'static str> {
        canonical(p, &policy(true, false)).map(|c| c.unwrap_or_else(|| p.to_string()))
    }

    #[test]
    fn canonical_paths_stay_as_they_are_without_work() {
        for p in [
            "/",
            "/a",
            "/a/b/",
            "/private/secret.txt",
            "/a.b/c..d/.e/..f",
            "/x-y_z~",
            "/caf\u{e9}",
        ] {
            assert_eq!(canonical(p, &policy(true, false)), Ok(None), "{p}");
        }
    }

    #[test]
    fn the_path_tricks_become_one_path() {
        let cases = [
            ("/%70rivate/secret.txt", "/private/secret.txt"),
            ("//private/secret.txt", "/private/secret.txt"),
            ("/./private/secret.txt", "/private/secret.txt"),
            ("/x/../private/secret.txt", "/private/secret.txt"),
            ("/%2e/private", "/private"),
            ("/a/%2E%2E/", "/"),
            ("/public/../private", "/private"),
            ("/public/%2e%2e/private", "/private"),
            ("/public/.%2e/private", "/private"),
            ("/a//b///c", "/a/b/c"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/a/./", "/a/"),
            ("/a//", "/a/"),
            ("//", "/"),
            ("/a/..", "/"),
            ("/%7Euser/%41", "/~user/A"),
            ("/a%3ab/%c3%a9", "/a%3Ab/%C3%A9"),
            ("/a;v=1/b", "/a;v=1/b"),
            ("/a/b;x/../c", "/a/c"),
        ];
        for (raw, want) in cases {
            assert_eq!(canon(raw).as_deref(), Ok(want), "{raw}");
        }
    }

    #[test]
    fn what_has_no_safe_form_is_refused() {
        for p in [
            "/%2fprivate",
            "/%2Fprivate",
            "/a%5cb",
            "/\\private",
            "/a\\..\\private",
            "/%00",
            "/a%0",
            "/a%zz",
            "/..",
            "/../private",
            "/a/../../private",
            "/%2e%2e/private",
            "/;/private",
            "/..;/private",
            "/public/..;/private",
            "/.;/private",
            "private",
            "",
        ] {
            assert!(canon(p).is_err(), "{p} should be refused: {:?}", canon(p));
        }
    }

    #[test]
    fn policies_change_slashes_and_escapes() {
        let keep_runs = policy(false, false);
        assert_eq!(canonical("//a//b", &keep_runs), Ok(None));
        assert_eq!(
            canonical("//a/./b", &keep_runs).unwrap().as_deref(),
            Some("//a/b")
        );
        let keep_escapes = policy(true, true);
        assert_eq!(
            canonical("/a%2fb/%5c", &keep_escapes).unwrap().as_deref(),
            Some("/a%2Fb/%5C")
        );
        assert!(canonical("/%00", &keep_escapes).is_err());
    }
}
