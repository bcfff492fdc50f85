//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the `traceparent` a request
//! arrives with, and the one each upstream attempt sends.

use http::HeaderValue;

/// A trace's 16-byte id; never all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TraceId(pub [u8; 16]);

/// A span's 8-byte id; never all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SpanId(pub [u8; 8]);

impl TraceId {
    /// A fresh random id.
    pub fn random() -> TraceId {
        loop {
            let id = fastrand::u128(..).to_be_bytes();
            if id != [0; 16] {
                return TraceId(id);
            }
        }
    }

    /// Lowercase hex, as in `traceparent` and the access log.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

impl SpanId {
    /// A fresh random id.
    pub fn random() -> SpanId {
        loop {
            let id = fastrand::u64(..).to_be_bytes();
            if id != [0; 8] {
                return SpanId(id);
            }
        }
    }

    /// Lowercase hex.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

/// What an incoming `traceparent` says.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Parent {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub sampled: bool,
}

/// Parse a `traceparent` value. Version `00` must be exactly 55 characters; a later version
/// may carry more after its first four parts (the spec's forward compatibility). Anything
/// invalid (uppercase hex, all-zero ids, version `ff`) is `None`: the request starts a new
/// trace, as the spec asks.
pub fn parse_traceparent(v: &[u8]) -> Option<Parent> {
    if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let version = unhex::<1>(&v[0..2])?[0];
    if version == 0xff || (version == 0 && v.len() != 55) || (v.len() > 55 && v[55] != b'-') {
        return None;
    }
    let trace_id = TraceId(unhex::<16>(&v[3..35])?);
    let span_id = SpanId(unhex::<8>(&v[36..52])?);
    let flags = unhex::<1>(&v[53..55])?[0];
    if trace_id.0 == [0; 16] || span_id.0 == [0; 8] {
        return None;
    }
    Some(Parent {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
    })
}

/// The `traceparent` naming `span` of `trace` as the parent of what follows.
pub fn traceparent(trace: &TraceId, span: &SpanId, sampled: bool) -> HeaderValue {
    let mut out = [0u8; 55];
    out[..3].copy_from_slice(b"00-");
    put_hex(&mut out[3..35], &trace.0);
    out[35] = b'-';
    put_hex(&mut out[36..52], &span.0);
    out[52] = b'-';
    out[53] = b'0';
    out[54] = if sampled { b'1' } else { b'0' };
    HeaderValue::from_bytes(&out).expect("hex digits and dashes are a valid field value")
}

const DIGITS: &[u8; 16] = b"0123456789abcdef";

fn put_hex(dst: &mut [u8], src: &[u8]) {
    for (pair, b) in dst.chunks_exact_mut(2).zip(src) {
        pair[0] = DIGITS[(b >> 4) as usize];
        pair[1] = DIGITS[(b & 15) as usize];
    }
}

fn hex(src: &[u8]) -> String {
    let mut out = vec![0u8; src.len() * 2];
    put_hex(&mut out, src);
    String::from_utf8(out).expect("hex digits are ASCII")
}

/// Lowercase hex only (the spec forbids uppercase).
fn unhex<const N: usize>(src: &[u8]) -> Option<[u8; N]> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    if src.len() != N * 2 {
        return None;
    }
    for (o, pair) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn round_trip() {
        let p = parse_traceparent(VALID.as_bytes()).unwrap();
        assert!(p.sampled);
        assert_eq!(p.trace_id.to_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(p.span_id.to_hex(), "00f067aa0ba902b7");
        let back = traceparent(&p.trace_id, &p.span_id, true);
        assert_eq!(back.to_str().unwrap(), VALID);
        let unsampled = VALID.replace("-01", "-00");
        assert!(!parse_traceparent(unsampled.as_bytes()).unwrap().sampled);
    }

    #[test]
    fn invalid_values_start_a_new_trace() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse_traceparent(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_may_carry_more() {
        let v = VALID.replacen("00", "01", 1) + "-what-comes-next";
        assert!(parse_traceparent(v.as_bytes()).is_some());
        let glued = VALID.replacen("00", "01", 1) + "x";
        assert_eq!(parse_traceparent(glued.as_bytes()), None);
    }

    #[test]
    fn random_ids_are_never_zero_and_differ() {
        let (a, b) = (TraceId::random(), TraceId::random());
        assert_ne!(a, b);
        assert_ne!(a.0, [0; 16]);
        assert_ne!(SpanId::random().0, [0; 8]);
    }
}
