//! Prometheus metrics. Label lookups happen when a config version is built; the request
//! path only touches pre-resolved counter and histogram handles (atomics, no locks). The
//! series it writes per request or connection keep one cell per worker (`sharded`), summed
//! when metrics are rendered; the rest are plain Prometheus metrics.

mod handles;
mod jwks;
mod server;
pub(crate) mod sharded;

pub(crate) use handles::{
    ClusterMetrics, CompressionMetrics, FilterMetrics, HashMetrics, ListenerMetrics, PickMetrics,
    RouteMetrics, TunnelMetrics,
};
pub(crate) use jwks::{JwksFamilies, JwksMetrics};
pub(crate) use server::{sample_attempt_timing, ServerFamilies, ServerMetrics};

use prometheus::{
    Encoder, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Every metric family keymaster exports.
pub struct Metrics {
    registry: Registry,
    requests: sharded::CounterVec,
    latency: sharded::HistogramVec,
    errors: IntCounterVec,
    upstream_connects: IntCounterVec,
    upstream_connect_failures: IntCounterVec,
    upstream_requests: sharded::CounterVec,
    upstream_reused: sharded::CounterVec,
    upstream_retries: IntCounterVec,
    upstream_unsent_retries: IntCounterVec,
    upstream_open: sharded::GaugeVec,
    upstream_idle: sharded::GaugeVec,
    upstream_streams: sharded::GaugeVec,
    upstream_tls_failures: IntCounterVec,
    downstream_open: sharded::GaugeVec,
    downstream_accepted: sharded::CounterVec,
    downstream_rejected: IntCounterVec,
    downstream_send_timeouts: IntCounterVec,
    downstream_body_timeouts: IntCounterVec,
    downstream_retired: IntCounterVec,
    tls_handshake_failures: IntCounterVec,
    proxy_protocol_rejected: IntCounterVec,
    descriptors_exhausted: IntCounterVec,
    descriptor_waits: IntCounterVec,
    /// Access-log lines lost: the writer thread was behind (its queue full) or a write failed.
    pub(crate) access_log_dropped: IntCounter,
    /// Per origin server: attempts, their latency, reuse, connections.
    pub(crate) servers: ServerFamilies,
    /// The jwt filters' key set fetches.
    pub(crate) jwks: JwksFamilies,
    filter_rejections: IntCounterVec,
    mirror: IntCounterVec,
    /// Trace spans by outcome: exported, dropped (queue full), failed (export failed).
    pub(crate) trace_spans: keymaster_trace::Counters,
    pub(crate) config_version: IntGauge,
    /// 1 while `/ready` is failed on purpose (`POST /healthcheck/fail`).
    pub(crate) ready_failing: IntGauge,
    pub(crate) reloads: IntCounterVec,
    /// When the running config was last applied (start or reload), Unix seconds.
    pub(crate) reload_time: IntGauge,
    /// Admin connections closed at once because the admin listener was at max_connections.
    pub(crate) admin_rejected: IntCounter,
    /// Admin requests refused by the admin guard, by reason.
    pub(crate) admin_refused: IntCounterVec,
    filter_invocations: sharded::CounterVec,
    filter_skips: sharded::CounterVec,
    filter_errors: sharded::CounterVec,
    filter_duration: sharded::HistogramVec,
    tunnels_active: IntGaugeVec,
    tunnels: IntCounterVec,
    tunnel_bytes: sharded::CounterVec,
    tunnel_idle_timeouts: IntCounterVec,
    compressed_responses: sharded::CounterVec,
    compression_bytes: sharded::CounterVec,
    upstream_ejections: IntCounterVec,
    upstream_fast_ejections: IntCounterVec,
    upstream_budget_exhausted: IntCounterVec,
    upstream_overflow: IntCounterVec,
    /// 1 when a server is available (healthy and not ejected), by cluster and server;
    /// refreshed from the health state whenever metrics are rendered.
    pub(crate) upstream_server_healthy: IntGaugeVec,
    /// Active health checks by cluster and result (`pass` or the failure's category).
    health_checks: IntCounterVec,
    shed: IntCounterVec,
    rate_limit_redis: IntCounterVec,
    pub(crate) discovery_updates: IntCounterVec,
    pub(crate) discovery_errors: IntCounterVec,
    pub(crate) discovered_servers: IntGaugeVec,
    pub(crate) discovery_registry_up: IntGaugeVec,
    pub(crate) discovery_registry_last_success: IntGaugeVec,
    pub(crate) discovery_registry_servers: IntGaugeVec,
    route_cluster_picks: IntCounterVec,
    upstream_hash_picks: IntCounterVec,
    upstream_affinity_cookies: IntCounterVec,
}

impl Metrics {
    /// A config version was applied now (start, reload, discovery update).
    pub(crate) fn applied_now(&self) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        self.reload_time
            .set(now.map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)));
    }
}

fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let v = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric definition");
    r.register(Box::new(v.clone()))
        .expect("metric registered once");
    v
}

fn gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let v = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric definition");
    r.register(Box::new(v.clone()))
        .expect("metric registered once");
    v
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new_custom(Some("keymaster".into()), None).expect("valid prefix");
        // CPU seconds, resident memory, open descriptors and their limit, start time
        // (`keymaster_process_*`), read from /proc when metrics are rendered.
        #[cfg(target_os = "linux")]
        r.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .expect("process collector registered once");
        let build_info = gauge_vec(
            &r,
            "build_info",
            "Always 1; the running build",
            &["version"],
        );
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        let reload_time = IntGauge::new(
            "config_last_applied_timestamp_seconds",
            "When the running config version was applied (start or reload), Unix seconds",
        )
        .expect("valid metric definition");
        r.register(Box::new(reload_time.clone()))
            .expect("metric registered once");
        let latency = sharded::HistogramVec::register(
            &r,
            "request_duration_seconds",
            "Time from request head received to the response's last byte sent (or the request's failure), by route and status class",
            &["route", "status_class"],
            &[
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0,
            ],
        );
        let filter_duration = sharded::HistogramVec::register(
            &r,
            "filter_duration_seconds",
            "Time spent in each filter's run (awaits included), by filter",
            &["filter"],
            &[
                0.000_001, 0.000_005, 0.000_025, 0.0001, 0.0005, 0.001, 0.005, 0.025, 0.1, 0.5, 2.5,
            ],
        );
        let config_version = IntGauge::new("config_version", "Active config version").expect("ok");
        r.register(Box::new(config_version.clone()))
            .expect("registered once");
        let ready_failing = IntGauge::new(
            "ready_failing",
            "1 while /ready is failed on purpose (POST /healthcheck/fail)",
        )
        .expect("ok");
        r.register(Box::new(ready_failing.clone()))
            .expect("ready_failing");
        let admin_rejected = IntCounter::new(
            "admin_connections_rejected_total",
            "Admin connections closed at once because the admin listener was at max_connections",
        )
        .expect("valid metric definition");
        r.register(Box::new(admin_rejected.clone()))
            .expect("registered once");
        Metrics {
            requests: sharded::CounterVec::register(
                &r,
                "requests_total",
                "Requests by route and status class",
                &["route", "status_class"],
            ),
            errors: counter_vec(
                &r,
                "errors_total",
                "Failed requests by status category and side",
                &["category", "side"],
            ),
            upstream_connects: counter_vec(
                &r,
                "upstream_connects_total",
                "Connection attempts to origins",
                &["cluster"],
            ),
            upstream_connect_failures: counter_vec(
                &r,
                "upstream_connect_failures_total",
                "Failed connection attempts to origins",
                &["cluster"],
            ),
            upstream_requests: sharded::CounterVec::register(
                &r,
                "upstream_requests_total",
                "Requests sent to origins",
                &["cluster"],
            ),
            upstream_reused: sharded::CounterVec::register(
                &r,
                "upstream_reused_total",
                "Requests sent on a reused pooled connection",
                &["cluster"],
            ),
            upstream_retries: counter_vec(
                &r,
                "upstream_retries_total",
                "Retries: the route's retry policy, and requests resent on a fresh connection after a stale pooled one failed",
                &["cluster"],
            ),
            upstream_unsent_retries: counter_vec(
                &r,
                "upstream_unsent_retries_total",
                "Requests tried on another server because the last try never sent them (connection refused or failed, pooled connection closed before the write); outside the retry budget and the route's attempts",
                &["cluster"],
            ),
            upstream_open: sharded::GaugeVec::register(
                &r,
                "upstream_connections",
                "Open connections to origins",
                &["cluster"],
            ),
            upstream_idle: sharded::GaugeVec::register(
                &r,
                "upstream_idle_connections",
                "Idle pooled connections to origins",
                &["cluster"],
            ),
            upstream_streams: sharded::GaugeVec::register(
                &r,
                "upstream_h2_streams",
                "HTTP/2 streams in flight to origins",
                &["cluster"],
            ),
            upstream_tls_failures: counter_vec(
                &r,
                "upstream_tls_failures_total",
                "Failed TLS handshakes with origins (verification, protocol)",
                &["cluster"],
            ),
            downstream_open: sharded::GaugeVec::register(
                &r,
                "downstream_connections",
                "Open client connections",
                &["listener"],
            ),
            downstream_accepted: sharded::CounterVec::register(
                &r,
                "downstream_accepted_total",
                "Accepted client connections",
                &["listener"],
            ),
            downstream_rejected: counter_vec(
                &r,
                "downstream_rejected_total",
                "Client connections closed at once because the listener was at max_connections",
                &["listener"],
            ),
            downstream_send_timeouts: counter_vec(
                &r,
                "downstream_send_timeouts_total",
                "Client connections reset because a response write made no progress for send_timeout",
                &["listener"],
            ),
            downstream_body_timeouts: counter_vec(
                &r,
                "downstream_body_timeouts_total",
                "Requests failed because the client sent nothing of its body for the route's client_body_timeout",
                &["listener"],
            ),
            downstream_retired: counter_vec(
                &r,
                "downstream_connections_retired_total",
                "Client connections closed gracefully at a listener's connection limit, by limit (requests, age)",
                &["listener", "limit"],
            ),
            tls_handshake_failures: counter_vec(
                &r,
                "tls_handshake_failures_total",
                "Client TLS handshakes that failed or timed out",
                &["listener"],
            ),
            proxy_protocol_rejected: counter_vec(
                &r,
                "proxy_protocol_rejected_total",
                "Client connections closed at the PROXY protocol header, by reason (malformed, timeout, untrusted)",
                &["listener", "reason"],
            ),
            descriptors_exhausted: counter_vec(
                &r,
                "descriptors_exhausted_total",
                "Socket operations that failed because the process or system was out of file descriptors, by operation (accept, connect, health_check)",
                &["op"],
            ),
            descriptor_waits: counter_vec(
                &r,
                "descriptor_waits_total",
                "Waits for the descriptor budget (RLIMIT_NOFILE less a reserve): accepting paused at the clients' share (accept), a request waited for a new origin connection (connect)",
                &["op"],
            ),
            access_log_dropped: {
                let c = IntCounter::new(
                    "access_log_dropped_total",
                    "Access-log lines lost: the writer was behind (its queue full) or a write failed",
                )
                .expect("valid metric definition");
                r.register(Box::new(c.clone())).expect("metric registered once");
                c
            },
            servers: ServerFamilies::register(&r),
            mirror: counter_vec(
                &r,
                "mirror_requests_total",
                "Route mirrors' shadow requests by route, shadow cluster and result: sent (a response came), failed, dropped (the cap), skipped_body (a body too long or of unknown length)",
                &["route", "cluster", "result"],
            ),
            jwks: JwksFamilies::register(&r),
            filter_rejections: counter_vec(
                &r,
                "filter_rejections_total",
                "Requests a filter answered itself with a 4xx or 5xx (auth 401, IP 403, rate limit 429...), by filter and status",
                &["filter", "status"],
            ),
            trace_spans: {
                let v = counter_vec(
                    &r,
                    "trace_spans_total",
                    "Trace spans by outcome: exported, dropped (the export queue was full), failed (the collector refused or timed out)",
                    &["outcome"],
                );
                keymaster_trace::Counters {
                    exported: v.with_label_values(&["exported"]),
                    dropped: v.with_label_values(&["dropped"]),
                    failed: v.with_label_values(&["failed"]),
                }
            },
            reloads: {
                let v = counter_vec(&r, "config_reloads_total", "Config reloads by result", &["result"]);
                // Both results exist from the start, so that rate() and absent() alerts work.
                for result in ["ok", "rejected"] {
                    v.with_label_values(&[result]);
                }
                v
            },
            reload_time,
            admin_rejected,
            admin_refused: counter_vec(
                &r,
                "admin_requests_refused_total",
                "Admin requests refused by the admin guard, by reason (cross_origin, simple_request, unauthorized)",
                &["reason"],
            ),
            filter_invocations: sharded::CounterVec::register(
                &r,
                "filter_invocations_total",
                "Filter runs (should_filter/match said yes)",
                &["filter"],
            ),
            filter_skips: sharded::CounterVec::register(
                &r,
                "filter_skips_total",
                "Filter skips (match or should_filter said no)",
                &["filter"],
            ),
            filter_errors: sharded::CounterVec::register(
                &r,
                "filter_errors_total",
                "Filter failures (error or panic)",
                &["filter"],
            ),
            upstream_ejections: counter_vec(
                &r,
                "upstream_ejections_total",
                "Origin servers ejected by passive outlier detection",
                &["cluster"],
            ),
            upstream_fast_ejections: counter_vec(
                &r,
                "upstream_fast_ejections_total",
                "Origin servers ejected at once because they refused a connection (also counted in upstream_ejections_total)",
                &["cluster"],
            ),
            upstream_budget_exhausted: counter_vec(
                &r,
                "upstream_retry_budget_exhausted_total",
                "Retries not made because the cluster's retry budget was used up",
                &["cluster"],
            ),
            upstream_overflow: counter_vec(
                &r,
                "upstream_overflow_total",
                "Requests answered 503 because the cluster was at its request cap and queue",
                &["cluster"],
            ),
            upstream_server_healthy: gauge_vec(
                &r,
                "upstream_server_healthy",
                "1 when an origin server is available (healthy and not ejected), else 0",
                &["cluster", "server"],
            ),
            health_checks: counter_vec(
                &r,
                "health_checks_total",
                "Active health checks by cluster and result: pass, or the failure's category (origin_connectivity, origin_connect_timeout, origin_tls, origin_reset, origin_bad_response, origin_read_timeout, origin_unhealthy)",
                &["cluster", "result"],
            ),
            shed: {
                let v = counter_vec(
                    &r,
                    "shed_total",
                    "Requests shed with 503 because the gateway was overloaded, by route priority",
                    &["priority"],
                );
                // Present at zero from the start (alerts on rate() and absent()).
                for priority in ["low", "normal", "high"] {
                    v.with_label_values(&[priority]);
                }
                v
            },
            rate_limit_redis: counter_vec(
                &r,
                "rate_limit_redis_total",
                "Decisions of rate_limit filters with backend = \"redis\": by Redis (ok) or by the local bucket because Redis failed or is backed off (fallback)",
                &["filter", "result"],
            ),
            discovery_updates: counter_vec(
                &r,
                "discovery_updates_total",
                "Config versions built because service discovery changed a cluster's servers",
                &["cluster"],
            ),
            discovery_errors: counter_vec(
                &r,
                "discovery_errors_total",
                "Failed discovery rounds and registry requests (the previous servers are kept), by source: dns, file, consul or eureka",
                &["cluster", "source"],
            ),
            discovered_servers: gauge_vec(
                &r,
                "discovered_servers",
                "Servers of a cluster with discovery, as last resolved",
                &["cluster"],
            ),
            discovery_registry_up: gauge_vec(
                &r,
                "discovery_registry_up",
                "1 when a cluster's last request to its registry (consul or eureka) succeeded, 0 when it failed and the last known servers are kept",
                &["cluster", "source"],
            ),
            discovery_registry_last_success: gauge_vec(
                &r,
                "discovery_registry_last_success_timestamp_seconds",
                "When a cluster's registry last answered with servers, Unix seconds",
                &["cluster", "source"],
            ),
            discovery_registry_servers: gauge_vec(
                &r,
                "discovery_registry_servers",
                "Servers a cluster's registry listed (healthy or UP) in its last answer",
                &["cluster", "source"],
            ),
            route_cluster_picks: counter_vec(
                &r,
                "route_cluster_picks_total",
                "Requests of a route with weighted clusters, by the cluster picked and how: weight (the weighted draw) or override (the route's cluster_override header or cookie named it)",
                &["route", "cluster", "source"],
            ),
            upstream_hash_picks: counter_vec(
                &r,
                "upstream_hash_picks_total",
                "Server picks of hash clusters: primary (the key's own server on the ring), moved (it was unavailable or already tried: the next server on the ring), unkeyed (the request had no key: weighted random)",
                &["cluster", "result"],
            ),
            upstream_affinity_cookies: counter_vec(
                &r,
                "upstream_affinity_cookies_total",
                "Affinity cookies generated and set on responses by hash clusters with generate = true",
                &["cluster"],
            ),
            filter_duration,
            tunnels_active: gauge_vec(
                &r,
                "tunnels_active",
                "Open upgrade tunnels (WebSocket and other upgrades), by route",
                &["route"],
            ),
            tunnels: counter_vec(
                &r,
                "tunnels_total",
                "Upgrade tunnels opened (origin answered 101), by route",
                &["route"],
            ),
            compressed_responses: sharded::CounterVec::register(
                &r,
                "compressed_responses_total",
                "Responses compressed, by route and algorithm (zstd, br, gzip)",
                &["route", "algorithm"],
            ),
            compression_bytes: sharded::CounterVec::register(
                &r,
                "compression_bytes_total",
                "Body bytes of compressed responses, by route, algorithm and direction (in: from the origin, out: compressed, to the client)",
                &["route", "algorithm", "direction"],
            ),
            tunnel_bytes: sharded::CounterVec::register(
                &r,
                "tunnel_bytes_total",
                "Bytes carried by upgrade tunnels, by route and direction (upstream = client to origin)",
                &["route", "direction"],
            ),
            tunnel_idle_timeouts: counter_vec(
                &r,
                "tunnel_idle_timeouts_total",
                "Upgrade tunnels closed by the route's upgrade.idle_timeout",
                &["route"],
            ),
            config_version,
            ready_failing,
            latency,
            registry: r,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}
