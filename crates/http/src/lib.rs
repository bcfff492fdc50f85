//! keymaster's HTTP layer: what both sides of the proxy share about HTTP messages, below
//! everything that knows of routes, filters or upstream servers.
//!
//! It owns the one error type ([`error::Error`]: what went wrong, which side caused it,
//! whether a retry is safe), HTTP/1.1 body framing ([`framing`]: the declared length, the
//! body decoder, chunk sizes), the rules for heads and fields ([`headers`]: validation,
//! hop-by-hop fields, `Via` and `X-Forwarded-*`, request ids, configured edits, and the
//! wire form that keeps a head's fields as the bytes they arrived as), the canonical
//! request path ([`path`]), gRPC recognition ([`grpc`]), the stream under a connection and
//! the worker's spare buffers ([`io`]), and the PEM files of TLS: certificates, keys and
//! trust anchors ([`pem`]).
//! Nothing here turns an error into a response: the gateway's `respond` module does that,
//! in one place.

pub mod error;
pub mod framing;
pub mod grpc;
pub mod headers;
pub mod io;
pub mod path;
pub mod pem;

/// A fuzz property's settings: `cases` cases (or `KEYMASTER_FUZZ_CASES`, for the longer run
/// in `.ci/run`), no failure files written (regressions live in each module's tables).
#[cfg(test)]
pub(crate) fn fuzz_config(cases: u32) -> proptest::prelude::ProptestConfig {
    let cases = std::env::var("KEYMASTER_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    proptest::prelude::ProptestConfig {
        cases,
        failure_persistence: None,
        ..Default::default()
    }
}
