//! keymaster's gateway: listeners, the proxy stage, the filter chain, upstream pools,
//! admin and metrics, on the crates below it (`keymaster-http`: the HTTP vocabulary and
//! error type; `keymaster-filter`: the filter API; `keymaster-config`).
//!
//! Inside, three layers; a module names modules of its own layer and the ones below, never
//! one above (`tests/layers.rs` checks the `use` lines). The request's path through them is
//! charted in `docs/architecture.md`.
//!
//! **Gateway** (top): a request from the socket to the response.
//!
//! | module | owns |
//! |---|---|
//! | [`gateway`] | start, reload (atomic config swap), graceful shutdown, signals |
//! | `worker` | worker threads: one local current-thread runtime each |
//! | `downstream` | listeners, accept loop, client connections (keymaster's own HTTP/1.1 server, hyper for HTTP/2), slowloris/idle timeouts |
//! | `proxy` | the proxy stage, a function per phase: `request` (checks, routing, filters, what the origin gets), `attempt` (server choice, pool or connect, send, retries), `response` (header duties, post filters, the streamed body and its `Exchange`) |
//! | [`filter`] | the filter chain's runner (`stage`), the built-in filters, body opt-in; the API itself is `keymaster-filter` |
//! | `route`, `snapshot` | compiled routes and a compiled config version |
//! | `upgrade` | WebSocket and other `Upgrade`s: handshake hooks and the two-way tunnel |
//! | `respond` | the one place an error becomes the client's response |
//! | `overload` | load shedding by route priority (in-flight requests, event-loop lag) |
//! | `admin` | the admin listener: metrics, health, config, reload, its guard |
//!
//! **Upstream**: `upstream`, the origins: clusters, balancing, per-worker connection pools
//! (HTTP/1.1 and multiplexed HTTP/2), connect, outbound TLS, health checks and outlier
//! ejection, discovery, cluster caps and retry budgets. It sees the running gateway only
//! through the narrow `upstream::Host` handle.
//!
//! **Support** (bottom): `body` (request bodies on their way to the origin, with caps and
//! timeouts), [`metrics`], [`access_log`], `tls` (inbound TLS: certificates by SNI, ALPN,
//! mTLS), `proxy_protocol`, [`descriptors`], `runtime_thread`, `drain`, `restart_only`,
//! `compress` (response compression: `Accept-Encoding` negotiation, the rules, the
//! streaming encoders).

pub mod access_log;
mod admin;
mod body;
mod compress;
pub mod descriptors;
mod downstream;
mod drain;
mod fetch;
pub mod filter;
pub mod gateway;
pub mod metrics;
mod overload;
mod proxy;
mod proxy_protocol;
mod respond;
mod restart_only;
mod route;
mod runtime_thread;
mod snapshot;
mod tls;
mod upgrade;
mod upstream;
mod worker;

pub use gateway::{ConfigSource, Gateway, Signals};

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
