//! `Accept-Encoding` negotiation (RFC 9110 §12.5.3): each listed coding with its `q` value
//! (default 1; `q=0` excludes it), `*` for the codings not listed, and `identity`.
//!
//! The algorithm picked has the highest `q` above 0; ties go to the route's order of
//! preference. The response is sent as it is when the client prefers `identity` (listed,
//! or given by `*`, with a `q` higher than the best algorithm's), and when the request has
//! no `Accept-Encoding` at all.

use super::Algorithm;

/// `q` in thousandths (0 to 1000), so values compare exactly.
type Q = u16;

/// What one `Accept-Encoding` says about the codings keymaster knows.
#[derive(Default)]
struct Accepted {
    /// By `super::index`; `None`: not listed.
    algorithms: [Option<Q>; 3],
    identity: Option<Q>,
    star: Option<Q>,
}

/// The algorithm to compress with, from `offered` (the server's order of preference) and
/// the request's `Accept-Encoding` field values.
pub(super) fn pick<'a>(
    offered: &[Algorithm],
    values: impl Iterator<Item = &'a [u8]>,
) -> Option<Algorithm> {
    let mut accepted = Accepted::default();
    for value in values {
        for element in value.split(|&b| b == b',') {
            accepted.note(element);
        }
    }
    let mut best: Option<(Algorithm, Q)> = None;
    for &a in offered {
        let q = accepted.algorithms[super::index(a)]
            .or(accepted.star)
            .unwrap_or(0);
        // Strictly higher: an equal q keeps the earlier (preferred) algorithm.
        if q > 0 && best.is_none_or(|(_, b)| q > b) {
            best = Some((a, q));
        }
    }
    // Unlisted, identity is acceptable but states no preference.
    let identity = accepted.identity.or(accepted.star).unwrap_or(0);
    best.filter(|&(_, q)| q >= identity).map(|(a, _)| a)
}

impl Accepted {
    /// One element, `coding[;q=value][;other]`; malformed ones are ignored.
    fn note(&mut self, element: &[u8]) {
        let mut parts = element.split(|&b| b == b';');
        let coding = parts.next().unwrap_or(b"").trim_ascii();
        if coding.is_empty() {
            return;
        }
        let mut q = 1000;
        for param in parts {
            let param = param.trim_ascii();
            if param.len() > 2 && param[..2].eq_ignore_ascii_case(b"q=") {
                match parse_q(&param[2..]) {
                    Some(v) => q = v,
                    None => return,
                }
            }
        }
        let is = |name: &[u8]| coding.eq_ignore_ascii_case(name);
        let slot = if is(b"gzip") || is(b"x-gzip") {
            &mut self.algorithms[super::index(Algorithm::Gzip)]
        } else if is(b"br") {
            &mut self.algorithms[super::index(Algorithm::Brotli)]
        } else if is(b"zstd") {
            &mut self.algorithms[super::index(Algorithm::Zstd)]
        } else if is(b"identity") {
            &mut self.identity
        } else if is(b"*") {
            &mut self.star
        } else {
            return;
        };
        // Listed twice: the higher q counts.
        *slot = Some(slot.map_or(q, |old| old.max(q)));
    }
}

/// `qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )`, in thousandths.
fn parse_q(v: &[u8]) -> Option<Q> {
    let (int, frac) = match v.iter().position(|&b| b == b'.') {
        Some(dot) => (&v[..dot], &v[dot + 1..]),
        None => (v, &b""[..]),
    };
    if frac.len() > 3 || !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut thousandths: Q = 0;
    for i in 0..3 {
        thousandths = thousandths * 10 + frac.get(i).map_or(0, |d| Q::from(d - b'0'));
    }
    match int {
        b"0" => Some(thousandths),
        b"1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_q, pick, Algorithm};

    const ALL: [Algorithm; 3] = [Algorithm::Zstd, Algorithm::Brotli, Algorithm::Gzip];

    fn choose(offered: &[Algorithm], header: &str) -> Option<&'static str> {
        pick(offered, std::iter::once(header.as_bytes())).map(Algorithm::token)
    }

    #[test]
    fn q_values() {
        assert_eq!(parse_q(b"1"), Some(1000));
        assert_eq!(parse_q(b"1.000"), Some(1000));
        assert_eq!(parse_q(b"0.5"), Some(500));
        assert_eq!(parse_q(b"0.123"), Some(123));
        assert_eq!(parse_q(b"0"), Some(0));
        assert_eq!(parse_q(b"0."), Some(0));
        assert_eq!(parse_q(b"1.5"), None);
        assert_eq!(parse_q(b"0.1234"), None);
        assert_eq!(parse_q(b"2"), None);
        assert_eq!(parse_q(b"x"), None);
    }

    #[test]
    fn ties_go_to_the_server_order() {
        assert_eq!(choose(&ALL, "gzip, deflate, br, zstd"), Some("zstd"));
        let gzip_first = [Algorithm::Gzip, Algorithm::Brotli];
        assert_eq!(choose(&gzip_first, "br, gzip"), Some("gzip"));
        assert_eq!(choose(&ALL, "*"), Some("zstd"));
    }

    #[test]
    fn q_decides_before_order() {
        assert_eq!(choose(&ALL, "zstd;q=0.5, gzip"), Some("gzip"));
        assert_eq!(choose(&ALL, "br;q=0.9, gzip;q=0.8"), Some("br"));
        assert_eq!(choose(&ALL, "gzip;q=0.2, *;q=0.1"), Some("gzip"));
        assert_eq!(choose(&ALL, "gzip;q=0.2, *;q=0.3"), Some("zstd"));
    }

    #[test]
    fn zero_excludes() {
        assert_eq!(choose(&ALL, "zstd;q=0, br;q=0, gzip"), Some("gzip"));
        assert_eq!(choose(&ALL, "gzip;q=0"), None);
        assert_eq!(choose(&ALL, "*;q=0"), None);
        assert_eq!(choose(&ALL, "*, zstd;q=0"), Some("br"));
        assert_eq!(choose(&[Algorithm::Gzip], "br, zstd"), None);
    }

    #[test]
    fn identity_preferred_means_none() {
        assert_eq!(choose(&ALL, "gzip;q=0.5"), Some("gzip"));
        assert_eq!(choose(&ALL, "gzip;q=0.5, identity"), None);
        assert_eq!(choose(&ALL, "gzip;q=0.5, identity;q=0.4"), Some("gzip"));
        assert_eq!(choose(&ALL, "gzip, identity;q=0"), Some("gzip"));
        assert_eq!(choose(&ALL, "identity"), None);
        assert_eq!(choose(&ALL, ""), None);
    }

    #[test]
    fn spelling() {
        assert_eq!(choose(&ALL, " GZIP ; Q=1 "), Some("gzip"));
        assert_eq!(choose(&[Algorithm::Gzip], "x-gzip"), Some("gzip"));
        assert_eq!(choose(&ALL, "gzip;q=abc, br"), Some("br"));
        assert_eq!(choose(&ALL, "deflate, compress"), None);
    }
}
