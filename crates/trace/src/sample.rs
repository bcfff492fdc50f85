//! Head sampling: a ratio applied to the trace id, so every hop that uses the same rule
//! and ratio keeps the same traces, and an incoming sampled flag honoured when configured.

use crate::context::{Parent, TraceId};

/// Whether a request is recorded: the parent's flag when `parent_based` and there is a
/// parent, else `ratio` of trace ids.
pub fn decide(parent: Option<&Parent>, trace_id: &TraceId, ratio: f64, parent_based: bool) -> bool {
    match parent {
        Some(p) if parent_based => p.sampled,
        _ => by_ratio(trace_id, ratio),
    }
}

/// OpenTelemetry's `TraceIdRatioBased` rule: the id's last 8 bytes, less one bit, against
/// the ratio's share of 2^63.
pub fn by_ratio(trace_id: &TraceId, ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 {
        return false;
    }
    let low = u64::from_be_bytes(trace_id.0[8..16].try_into().expect("8 bytes")) >> 1;
    let bound = (ratio * (1u64 << 63) as f64) as u64;
    low < bound
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::SpanId;

    #[test]
    fn ratio_keeps_its_share() {
        let n = 200_000;
        for ratio in [0.01, 0.25, 0.5] {
            let kept = (0..n)
                .filter(|_| by_ratio(&TraceId::random(), ratio))
                .count();
            let expect = n as f64 * ratio;
            let sigma = (n as f64 * ratio * (1.0 - ratio)).sqrt();
            assert!(
                (kept as f64 - expect).abs() < 6.0 * sigma,
                "{ratio}: {kept}"
            );
        }
        assert!(by_ratio(&TraceId::random(), 1.0));
        assert!(!by_ratio(&TraceId::random(), 0.0));
    }

    #[test]
    fn parent_flag_wins_when_parent_based() {
        let p = |sampled| Parent {
            trace_id: TraceId::random(),
            span_id: SpanId::random(),
            sampled,
        };
        let id = TraceId::random();
        assert!(decide(Some(&p(true)), &id, 0.0, true));
        assert!(!decide(Some(&p(false)), &id, 1.0, true));
        assert!(decide(Some(&p(false)), &id, 1.0, false));
        assert!(!decide(Some(&p(true)), &id, 0.0, false));
        assert!(decide(None, &id, 1.0, true));
    }
}
