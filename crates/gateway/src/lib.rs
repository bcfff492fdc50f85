//! keymaster's gateway library: a non-blocking HTTP reverse proxy.
//!
//! Module map (the request's path through the code is charted in `docs/architecture.md`):
//!
//! | module | owns |
//! |---|---|
//! | [`gateway`] | start, reload (atomic config swap), graceful shutdown, signals |
//! | `worker` | worker threads: one current-thread runtime + `LocalSet` each |
//! | `runtime_thread` | background threads (admin, health checks, discovery), a runtime each |
//! | `downstream` | listeners, accept loop, client connections (keymaster's own HTTP/1.1 server, hyper for HTTP/2), slowloris/idle timeouts |
//! | `proxy_protocol` | the PROXY protocol header (v1/v2) on listeners behind L4 balancers |
//! | [`filter`] | the Zuul filter chain: stages, native filter trait, built-in filters |
//! | `proxy` | the proxy stage: route → upstream → response, the `Exchange` |
//! | `framing` | HTTP/1.1 body framing shared by both sides: declared length, the body decoder |
//! | `io` | the TCP or TLS stream under an HTTP/1.1 connection (either side), and what a 101 leaves of it |
//! | `headers` | head validation, hop-by-hop, `Via`, `X-Forwarded-*`, request ids |
//! | `path` | the canonical request path, made before routing |
//! | `route` | compiled routes, matching and path rewrites |
//! | `upstream` | clusters, balancing, per-worker connection pools (HTTP/1.1 and multiplexed HTTP/2), connect, outbound TLS, health checks and outlier ejection, cluster caps and retry budgets |
//! | `body` | streaming request/response bodies with caps |
//! | [`error`] | the one error type; `respond` turns it into the client's response |
//! | `snapshot` | a compiled config version |
//! | `restart_only` | what a reload cannot change: kept as running, and reported |
//! | `tls` | inbound TLS: certificates by SNI, ALPN, mTLS, swapped on reload |
//! | `grpc` | recognising gRPC calls, `grpc-timeout` as the request deadline |
//! | `upgrade` | WebSocket and other `Upgrade`s: handshake hooks and the two-way tunnel |
//! | [`descriptors`] | `RLIMIT_NOFILE` raised at start, the descriptor budget of a config, telling `EMFILE`/`ENFILE` apart |
//! | `overload` | load shedding by route priority (in-flight requests, event-loop lag) |
//! | [`metrics`], `admin`, [`access_log`] | observability |

pub mod access_log;
mod admin;
mod body;
pub mod descriptors;
mod downstream;
mod drain;
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
