//! Resilience settings: active health checks, passive outlier ejection, the retry budget and
//! request caps of a cluster; the retry policy and shed priority of a route; and process-wide
//! load shedding. Every key has a default (documented in `docs/configuration.md`).

use serde::{Deserialize, Serialize};

use crate::units::{ByteSize, Duration};

/// Active health checks of every server of a cluster (`[clusters.health_check]`), over the
/// cluster's own transport (its `protocol`, `tls` and `proxy_protocol`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HealthCheckConfig {
    /// `"http"`: `GET path`, a 2xx or 3xx answer is a pass; `"grpc"`: the gRPC health
    /// protocol's `grpc.health.v1.Health/Check`, `SERVING` is a pass (HTTP/2 clusters only).
    pub kind: HealthCheckKind,
    /// Path requested with `GET` (`kind = "http"`); a 2xx or 3xx answer is a pass.
    pub path: String,
    /// The service a gRPC check asks about (`kind = "grpc"`). Absent: `""`, the server as
    /// a whole.
    pub grpc_service: Option<String>,
    /// Time between two checks of one server.
    pub interval: Duration,
    /// Time one check may take (connect, send, response status line).
    pub timeout: Duration,
    /// Consecutive passes that make an unhealthy server healthy again.
    pub healthy_threshold: u32,
    /// Consecutive failures that make a healthy server unhealthy.
    pub unhealthy_threshold: u32,
}

impl Default for HealthCheckConfig {
    fn default() -> Self {
        Self {
            kind: HealthCheckKind::Http,
            path: "/".into(),
            grpc_service: None,
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(1),
            healthy_threshold: 2,
            unhealthy_threshold: 3,
        }
    }
}

/// What an active health check asks a server.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum HealthCheckKind {
    /// `GET path`; a 2xx or 3xx status is a pass.
    #[default]
    Http,
    /// `grpc.health.v1.Health/Check` for `grpc_service`; `SERVING` is a pass.
    Grpc,
}

impl HealthCheckKind {
    pub fn as_str(self) -> &'static str {
        match self {
            HealthCheckKind::Http => "http",
            HealthCheckKind::Grpc => "grpc",
        }
    }
}

/// Passive outlier ejection from real traffic (`[clusters.outlier_detection]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OutlierConfig {
    /// Consecutive failures (5xx responses, connect failures, resets, timeouts) that eject a
    /// server; 0 turns passive ejection off.
    pub consecutive_failures: u32,
    /// First ejection time; each further ejection doubles it.
    pub base_ejection: Duration,
    /// Longest ejection time.
    pub max_ejection: Duration,
    /// Most servers of the cluster ejected at once, in percent (one may always be ejected).
    pub max_ejected_percent: u32,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            base_ejection: Duration::from_secs(10),
            max_ejection: Duration::from_secs(300),
            max_ejected_percent: 50,
        }
    }
}

/// What a cluster does when no server is healthy.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum AllUnhealthy {
    /// Balance over every server as if all were healthy (Envoy's panic mode).
    #[default]
    FailOpen,
    /// Answer 503 without contacting any server.
    FailClosed,
}

/// Envoy-style retry budget of a cluster (`[clusters.retry_budget]`): retries in flight are
/// at most `percent` of the cluster's active requests, but `min_retries` are always allowed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RetryBudgetConfig {
    /// Share of active requests that may be retries, 0 to 100.
    pub percent: u32,
    /// Retries in flight allowed whatever the share says.
    pub min_retries: u32,
}

impl Default for RetryBudgetConfig {
    fn default() -> Self {
        Self {
            percent: 20,
            min_retries: 3,
        }
    }
}

/// Request caps of a cluster (`[clusters.limits]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterLimits {
    /// Requests in flight to the cluster (0 = unlimited); past it requests wait in the queue.
    pub max_requests: usize,
    /// Requests waiting for a slot (0 = no queue: 503 at once past `max_requests`).
    pub max_pending: usize,
    /// Longest wait in the queue before a 503.
    pub queue_timeout: Duration,
    /// `Retry-After` of the 503 (rounded up to whole seconds).
    pub retry_after: Duration,
}

impl Default for ClusterLimits {
    fn default() -> Self {
        Self {
            max_requests: 0,
            max_pending: 0,
            queue_timeout: Duration::from_secs(1),
            retry_after: Duration::from_secs(1),
        }
    }
}

/// Retry policy of a route (`[routes.retry]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Attempts in all, the first included (1 = no retries).
    pub attempts: u32,
    /// Time each attempt may wait for the response head (absent = the response header
    /// timeout); always inside the request deadline.
    pub per_try_timeout: Option<Duration>,
    /// Back-off before the first retry; doubled for each further one, with full jitter.
    pub backoff_base: Duration,
    /// Longest back-off.
    pub backoff_max: Duration,
    /// A request body is retried only if it is at most this large (declared Content-Length).
    pub replay_buffer: ByteSize,
    /// Response statuses retried for idempotent methods.
    pub statuses: Vec<u16>,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            attempts: 1,
            per_try_timeout: None,
            backoff_base: Duration::from_millis(25),
            backoff_max: Duration::from_millis(250),
            replay_buffer: ByteSize(64 * 1024),
            statuses: vec![502, 503, 504],
        }
    }
}

/// How important a route's requests are when the gateway sheds load.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum ShedPriority {
    /// Shed first: from 80% of a load limit.
    Low,
    /// Shed at 100% of a load limit.
    #[default]
    Normal,
    /// Never shed (cluster caps still apply).
    High,
}

impl ShedPriority {
    pub fn as_str(self) -> &'static str {
        match self {
            ShedPriority::Low => "low",
            ShedPriority::Normal => "normal",
            ShedPriority::High => "high",
        }
    }
}

/// Process-wide load shedding (`[load_shedding]`); off unless a limit is set.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LoadSheddingConfig {
    /// Requests in flight in the whole gateway that count as fully loaded (0 = no limit).
    pub max_in_flight: usize,
    /// Event-loop lag of a worker that counts as fully loaded (absent = not measured).
    pub max_event_loop_lag: Option<Duration>,
    /// `Retry-After` of a shed request's 503 (rounded up to whole seconds).
    pub retry_after: Duration,
}

impl Default for LoadSheddingConfig {
    fn default() -> Self {
        Self {
            max_in_flight: 0,
            max_event_loop_lag: None,
            retry_after: Duration::from_secs(1),
        }
    }
}
