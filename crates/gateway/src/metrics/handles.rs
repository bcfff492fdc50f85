//! The handles the request path uses, resolved when a config version is built: one set per
//! route, cluster, listener and filter (each a few pre-labelled counters, gauges and
//! histograms: atomics, no locks; those written per request are per-worker cells), and the
//! [`Metrics`] methods that make them.

use prometheus::{IntCounter, IntCounterVec, IntGauge};

use super::sharded::{Counter, Gauge, Histogram};

use super::{Metrics, ServerFamilies, ServerMetrics};

/// Handles for one filter of the filter chain.
#[derive(Clone)]
pub(crate) struct FilterMetrics {
    pub(crate) invocations: Counter,
    pub(crate) skips: Counter,
    pub(crate) errors: Counter,
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
    by_class: [Counter; 6],
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
    pub(crate) bytes_upstream: Counter,
    /// Bytes from the origin to the client.
    pub(crate) bytes_downstream: Counter,
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
    pub(crate) responses: [Counter; 3],
    /// Body bytes from the origin into the encoder.
    pub(crate) bytes_in: [Counter; 3],
    /// Compressed bytes to the client.
    pub(crate) bytes_out: [Counter; 3],
}

/// Handles for one cluster.
#[derive(Clone)]
pub(crate) struct ClusterMetrics {
    /// The cluster's name, for its servers' series.
    name: std::sync::Arc<str>,
    servers: ServerFamilies,
    pub(crate) connect_attempts: IntCounter,
    pub(crate) connect_failures: IntCounter,
    pub(crate) requests: Counter,
    pub(crate) reused: Counter,
    pub(crate) retries: IntCounter,
    /// Requests tried on another server because the last try never sent them.
    pub(crate) unsent_retries: IntCounter,
    pub(crate) open_connections: Gauge,
    pub(crate) idle_connections: Gauge,
    /// HTTP/2 streams in flight to the cluster's servers.
    pub(crate) h2_streams: Gauge,
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
    pub(crate) open: Gauge,
    pub(crate) accepted: Counter,
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
}
