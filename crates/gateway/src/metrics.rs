//! Prometheus metrics. Label lookups happen when a config version is built; the request
//! path only touches pre-resolved counter and histogram handles (atomics, no locks).

mod jwks;
mod server;

pub(crate) use jwks::{JwksFamilies, JwksMetrics};
pub(crate) use server::{sample_attempt_timing, ServerFamilies, ServerMetrics};

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Every metric family keymaster exports.
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
    errors: IntCounterVec,
    upstream_connects: IntCounterVec,
    upstream_connect_failures: IntCounterVec,
    upstream_requests: IntCounterVec,
    upstream_reused: IntCounterVec,
    upstream_retries: IntCounterVec,
    upstream_unsent_retries: IntCounterVec,
    upstream_open: IntGaugeVec,
    upstream_idle: IntGaugeVec,
    upstream_streams: IntGaugeVec,
    upstream_tls_failures: IntCounterVec,
    downstream_open: IntGaugeVec,
    downstream_accepted: IntCounterVec,
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
    filter_invocations: IntCounterVec,
    filter_skips: IntCounterVec,
    filter_errors: IntCounterVec,
    filter_duration: HistogramVec,
    tunnels_active: IntGaugeVec,
    tunnels: IntCounterVec,
    tunnel_bytes: IntCounterVec,
    tunnel_idle_timeouts: IntCounterVec,
    compressed_responses: IntCounterVec,
    compression_bytes: IntCounterVec,
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

/// Handles for one filter of the filter chain.
#[derive(Clone)]
pub(crate) struct FilterMetrics {
    pub(crate) invocations: IntCounter,
    pub(crate) skips: IntCounter,
    pub(crate) errors: IntCounter,
    pub(crate) duration: Histogram,
    pub(crate) rejections: Rejections,
}

/// One filter's answers with an error status (`keymaster_filter_rejections_total`).
#[derive(Clone)]
pub(crate) struct Rejections {
    vec: IntCounterVec,
    filter: std::sync::Arc<str>,
}

impl Rejections {
    /// The series for `status`, at zero until counted.
    pub(crate) fn expect(&self, status: u16) {
        self.vec
            .with_label_values(&[&*self.filter, &status.to_string()]);
    }

    /// The filter answered with `status` (counted when it is an error status).
    pub(crate) fn count(&self, status: u16) {
        if status >= 400 {
            let status = status.to_string();
            self.vec.with_label_values(&[&*self.filter, &status]).inc();
        }
    }
}

/// Status classes as labels, indexed 0 = other, 1..=5 = 1xx..5xx.
const CLASSES: [&str; 6] = ["other", "1xx", "2xx", "3xx", "4xx", "5xx"];

/// Handles for one route.
#[derive(Clone)]
pub(crate) struct RouteMetrics {
    /// Indexed by status class: 0 = other, 1..=5 = 1xx..5xx.
    by_class: [IntCounter; 6],
    /// Indexed like `by_class`.
    latency: [Histogram; 6],
    pub(crate) tunnel: TunnelMetrics,
}

/// Handles for one route's upgrade tunnels (WebSocket and others).
#[derive(Clone)]
pub(crate) struct TunnelMetrics {
    pub(crate) active: IntGauge,
    pub(crate) total: IntCounter,
    /// Bytes from the client to the origin.
    pub(crate) bytes_upstream: IntCounter,
    /// Bytes from the origin to the client.
    pub(crate) bytes_downstream: IntCounter,
    pub(crate) idle_timeouts: IntCounter,
}

impl RouteMetrics {
    /// A request ended with `status` after `elapsed`.
    pub(crate) fn count(&self, status: u16, elapsed: std::time::Duration) {
        let class = (status / 100) as usize;
        let i = if (1..=5).contains(&class) { class } else { 0 };
        self.by_class[i].inc();
        self.latency[i].observe(elapsed.as_secs_f64());
    }
}

/// Handles for one compressing route, per algorithm (`compress::Algorithm::index` order).
#[derive(Clone)]
pub(crate) struct CompressionMetrics {
    /// Responses compressed.
    pub(crate) responses: [IntCounter; 3],
    /// Body bytes from the origin into the encoder.
    pub(crate) bytes_in: [IntCounter; 3],
    /// Compressed bytes to the client.
    pub(crate) bytes_out: [IntCounter; 3],
}

/// Handles for one cluster.
#[derive(Clone)]
pub(crate) struct ClusterMetrics {
    /// The cluster's name, for its servers' series.
    name: std::sync::Arc<str>,
    servers: ServerFamilies,
    pub(crate) connect_attempts: IntCounter,
    pub(crate) connect_failures: IntCounter,
    pub(crate) requests: IntCounter,
    pub(crate) reused: IntCounter,
    pub(crate) retries: IntCounter,
    /// Requests tried on another server because the last try never sent them.
    pub(crate) unsent_retries: IntCounter,
    pub(crate) open_connections: IntGauge,
    pub(crate) idle_connections: IntGauge,
    /// HTTP/2 streams in flight to the cluster's servers.
    pub(crate) h2_streams: IntGauge,
    /// Failed TLS handshakes with the cluster's servers.
    pub(crate) tls_failures: IntCounter,
    pub(crate) ejections: IntCounter,
    /// Ejections at once because a server refused a connection (also in `ejections`).
    pub(crate) fast_ejections: IntCounter,
    pub(crate) budget_exhausted: IntCounter,
    pub(crate) overflow: IntCounter,
    /// Origin connects that failed for lack of file descriptors (`EMFILE`, `ENFILE`).
    pub(crate) descriptors_exhausted: IntCounter,
    /// Requests that waited for the descriptor budget before a new origin connection.
    pub(crate) descriptor_waits: IntCounter,
    /// Health checks skipped for lack of file descriptors.
    pub(crate) check_descriptors_exhausted: IntCounter,
    /// `balance = "hash"` clusters only.
    pub(crate) hash: Option<HashMetrics>,
}

/// Handles for one hash cluster (`balance = "hash"`): its picks and generated cookies.
#[derive(Clone)]
pub(crate) struct HashMetrics {
    /// The key's own server on the ring served.
    pub(crate) primary: IntCounter,
    /// The key's own server was unavailable or tried: the next on the ring served.
    pub(crate) moved: IntCounter,
    /// The request had no key (and none was generated): weighted random.
    pub(crate) unkeyed: IntCounter,
    /// Affinity cookies set on responses (`generate`).
    pub(crate) cookies: IntCounter,
}

/// Handles for one cluster of a weighted route: requests it got by the weighted draw, and
/// by the route's `cluster_override`.
#[derive(Clone)]
pub(crate) struct PickMetrics {
    pub(crate) by_weight: IntCounter,
    pub(crate) by_override: IntCounter,
}

impl ClusterMetrics {
    /// Handles for one of the cluster's servers (`label`: "ip:port").
    pub(crate) fn server(&self, label: &str) -> ServerMetrics {
        self.servers.server(&self.name, label)
    }
}

/// Handles for one listener.
#[derive(Clone)]
pub(crate) struct ListenerMetrics {
    pub(crate) open: IntGauge,
    pub(crate) accepted: IntCounter,
    pub(crate) rejected: IntCounter,
    /// Connections reset because a response write made no progress for `send_timeout`.
    pub(crate) send_timeouts: IntCounter,
    /// Requests ended with 408 (or cut off) because the client's body stalled past the
    /// route's `client_body_timeout`.
    pub(crate) body_timeouts: IntCounter,
    /// Connections closed gracefully at `max_requests_per_connection`.
    pub(crate) retired_requests: IntCounter,
    /// Connections closed gracefully at `max_connection_age`.
    pub(crate) retired_age: IntCounter,
    pub(crate) tls_handshake_failures: IntCounter,
    /// Connections closed at the PROXY protocol header, by reason.
    pub(crate) proxy_malformed: IntCounter,
    pub(crate) proxy_timeout: IntCounter,
    pub(crate) proxy_untrusted: IntCounter,
    /// Accepts that failed for lack of file descriptors (`EMFILE`, `ENFILE`).
    pub(crate) descriptors_exhausted: IntCounter,
    /// Times accepting paused because client connections filled their share of the
    /// descriptor budget.
    pub(crate) descriptor_waits: IntCounter,
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
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "request_duration_seconds",
                "Time from request head received to the response's last byte sent (or the request's failure), by route and status class",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0,
            ]),
            &["route", "status_class"],
        )
        .expect("valid histogram");
        r.register(Box::new(latency.clone()))
            .expect("registered once");
        let filter_duration = HistogramVec::new(
            HistogramOpts::new(
                "filter_duration_seconds",
                "Time spent in each filter's run (awaits included), by filter",
            )
            .buckets(vec![
                0.000_001, 0.000_005, 0.000_025, 0.0001, 0.0005, 0.001, 0.005, 0.025, 0.1, 0.5, 2.5,
            ]),
            &["filter"],
        )
        .expect("valid histogram");
        r.register(Box::new(filter_duration.clone()))
            .expect("registered once");
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
            requests: counter_vec(
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
            upstream_requests: counter_vec(
                &r,
                "upstream_requests_total",
                "Requests sent to origins",
                &["cluster"],
            ),
            upstream_reused: counter_vec(
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
            upstream_open: gauge_vec(
                &r,
                "upstream_connections",
                "Open connections to origins",
                &["cluster"],
            ),
            upstream_idle: gauge_vec(
                &r,
                "upstream_idle_connections",
                "Idle pooled connections to origins",
                &["cluster"],
            ),
            upstream_streams: gauge_vec(
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
            downstream_open: gauge_vec(
                &r,
                "downstream_connections",
                "Open client connections",
                &["listener"],
            ),
            downstream_accepted: counter_vec(
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
            filter_invocations: counter_vec(
                &r,
                "filter_invocations_total",
                "Filter runs (should_filter/match said yes)",
                &["filter"],
            ),
            filter_skips: counter_vec(
                &r,
                "filter_skips_total",
                "Filter skips (match or should_filter said no)",
                &["filter"],
            ),
            filter_errors: counter_vec(
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
            compressed_responses: counter_vec(
                &r,
                "compressed_responses_total",
                "Responses compressed, by route and algorithm (zstd, br, gzip)",
                &["route", "algorithm"],
            ),
            compression_bytes: counter_vec(
                &r,
                "compression_bytes_total",
                "Body bytes of compressed responses, by route, algorithm and direction (in: from the origin, out: compressed, to the client)",
                &["route", "algorithm", "direction"],
            ),
            tunnel_bytes: counter_vec(
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

    pub(crate) fn route(&self, name: &str) -> RouteMetrics {
        let c = |class: &str| self.requests.with_label_values(&[name, class]);
        RouteMetrics {
            by_class: [c("other"), c("1xx"), c("2xx"), c("3xx"), c("4xx"), c("5xx")],
            latency: CLASSES.map(|class| self.latency.with_label_values(&[name, class])),
            tunnel: TunnelMetrics {
                active: self.tunnels_active.with_label_values(&[name]),
                total: self.tunnels.with_label_values(&[name]),
                bytes_upstream: self.tunnel_bytes.with_label_values(&[name, "upstream"]),
                bytes_downstream: self.tunnel_bytes.with_label_values(&[name, "downstream"]),
                idle_timeouts: self.tunnel_idle_timeouts.with_label_values(&[name]),
            },
        }
    }

    /// A compressing route's handles, `algorithms` in `compress::Algorithm::index` order:
    /// every series exists (at zero) from the start.
    pub(crate) fn compression(&self, route: &str, algorithms: [&str; 3]) -> CompressionMetrics {
        let responses = |a| self.compressed_responses.with_label_values(&[route, a]);
        let bytes = |a, d| self.compression_bytes.with_label_values(&[route, a, d]);
        CompressionMetrics {
            responses: algorithms.map(responses),
            bytes_in: algorithms.map(|a| bytes(a, "in")),
            bytes_out: algorithms.map(|a| bytes(a, "out")),
        }
    }

    /// The handles of one cluster (its hash counts too, present at zero, when it hashes).
    pub(crate) fn cluster(&self, cfg: &keymaster_config::ClusterConfig) -> ClusterMetrics {
        let name = cfg.name.as_str();
        let hash = (cfg.balance == keymaster_config::Balance::Hash).then(|| {
            let picks = |result: &str| self.upstream_hash_picks.with_label_values(&[name, result]);
            HashMetrics {
                primary: picks("primary"),
                moved: picks("moved"),
                unkeyed: picks("unkeyed"),
                cookies: self.upstream_affinity_cookies.with_label_values(&[name]),
            }
        });
        ClusterMetrics {
            hash,
            connect_attempts: self.upstream_connects.with_label_values(&[name]),
            connect_failures: self.upstream_connect_failures.with_label_values(&[name]),
            requests: self.upstream_requests.with_label_values(&[name]),
            reused: self.upstream_reused.with_label_values(&[name]),
            retries: self.upstream_retries.with_label_values(&[name]),
            unsent_retries: self.upstream_unsent_retries.with_label_values(&[name]),
            open_connections: self.upstream_open.with_label_values(&[name]),
            idle_connections: self.upstream_idle.with_label_values(&[name]),
            h2_streams: self.upstream_streams.with_label_values(&[name]),
            tls_failures: self.upstream_tls_failures.with_label_values(&[name]),
            ejections: self.upstream_ejections.with_label_values(&[name]),
            fast_ejections: self.upstream_fast_ejections.with_label_values(&[name]),
            budget_exhausted: self.upstream_budget_exhausted.with_label_values(&[name]),
            overflow: self.upstream_overflow.with_label_values(&[name]),
            descriptors_exhausted: self.descriptors_exhausted.with_label_values(&["connect"]),
            descriptor_waits: self.descriptor_waits.with_label_values(&["connect"]),
            check_descriptors_exhausted: self
                .descriptors_exhausted
                .with_label_values(&["health_check"]),
            name: name.into(),
            servers: self.servers.clone(),
        }
    }

    /// The pick counts of `cluster` in the weighted route `route` (present at zero).
    pub(crate) fn picks(&self, route: &str, cluster: &str) -> PickMetrics {
        let by =
            |source: &str| (self.route_cluster_picks).with_label_values(&[route, cluster, source]);
        PickMetrics {
            by_weight: by("weight"),
            by_override: by("override"),
        }
    }

    pub(crate) fn listener(&self, name: &str) -> ListenerMetrics {
        ListenerMetrics {
            open: self.downstream_open.with_label_values(&[name]),
            accepted: self.downstream_accepted.with_label_values(&[name]),
            rejected: self.downstream_rejected.with_label_values(&[name]),
            send_timeouts: self.downstream_send_timeouts.with_label_values(&[name]),
            body_timeouts: self.downstream_body_timeouts.with_label_values(&[name]),
            retired_requests: self
                .downstream_retired
                .with_label_values(&[name, "requests"]),
            retired_age: self.downstream_retired.with_label_values(&[name, "age"]),
            tls_handshake_failures: self.tls_handshake_failures.with_label_values(&[name]),
            proxy_malformed: self
                .proxy_protocol_rejected
                .with_label_values(&[name, "malformed"]),
            proxy_timeout: self
                .proxy_protocol_rejected
                .with_label_values(&[name, "timeout"]),
            proxy_untrusted: self
                .proxy_protocol_rejected
                .with_label_values(&[name, "untrusted"]),
            descriptors_exhausted: self.descriptors_exhausted.with_label_values(&["accept"]),
            descriptor_waits: self.descriptor_waits.with_label_values(&["accept"]),
        }
    }

    pub(crate) fn filter(&self, name: &str) -> FilterMetrics {
        FilterMetrics {
            rejections: Rejections {
                vec: self.filter_rejections.clone(),
                filter: name.into(),
            },
            invocations: self.filter_invocations.with_label_values(&[name]),
            skips: self.filter_skips.with_label_values(&[name]),
            errors: self.filter_errors.with_label_values(&[name]),
            duration: self.filter_duration.with_label_values(&[name]),
        }
    }

    /// A route mirror's counters, by result: sent, failed, dropped, skipped_body.
    pub(crate) fn mirror(&self, route: &str, cluster: &str) -> [IntCounter; 4] {
        ["sent", "failed", "dropped", "skipped_body"]
            .map(|result| self.mirror.with_label_values(&[route, cluster, result]))
    }

    /// The shed counter of one route priority.
    pub(crate) fn shed(&self, priority: &str) -> IntCounter {
        self.shed.with_label_values(&[priority])
    }

    /// A Redis-backed rate limit's (ok, fallback) decision counters.
    pub(crate) fn rate_limit_redis(&self, filter: &str) -> (IntCounter, IntCounter) {
        (
            self.rate_limit_redis.with_label_values(&[filter, "ok"]),
            self.rate_limit_redis
                .with_label_values(&[filter, "fallback"]),
        )
    }

    /// Count one active health check of `cluster` (`result`: `pass` or a failure category).
    /// Called by the health-check thread, never on the request path.
    pub(crate) fn health_check(&self, cluster: &str, result: &str) {
        self.health_checks
            .with_label_values(&[cluster, result])
            .inc();
    }

    pub(crate) fn error(&self, category: &str, side: &str) {
        self.errors.with_label_values(&[category, side]).inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}
