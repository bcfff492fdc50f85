//! The `[[clusters]]` table: a cluster's origin servers and how they are balanced, its
//! connection pool, and how it talks to its origins (HTTP version, TLS).

use serde::{Deserialize, Serialize};

use crate::model::{DiscoveryConfig, ProxyProtocol, TlsCertificate, TlsVersion};
use crate::resilience::{
    AllUnhealthy, ClusterLimits, HealthCheckConfig, OutlierConfig, RetryBudgetConfig,
};
use crate::traffic::HashConfig;
use crate::units::Duration;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// Weighted random (the 2013 port's choice).
    #[default]
    Random,
    /// Weighted round robin (smooth).
    RoundRobin,
    /// Power of two choices on outstanding requests.
    LeastOutstanding,
    /// Consistent hashing (a ring) of the cluster's `hash` key.
    Hash,
}

/// One origin server of a cluster.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OriginServerConfig {
    /// "host:port" (IPv4, bracketed IPv6 or DNS name). Validation checks the form only;
    /// resolving names is the gateway's job.
    pub address: String,
    /// Relative share of traffic, 1 to 10000.
    #[serde(default = "one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

/// Outbound connection pool limits, per origin server.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Open connections per server (0 = unlimited); past it requests get 503.
    pub max_connections: usize,
    /// Idle keep-alive connections kept per server.
    pub max_idle: usize,
    /// Idle connections are closed after this (keep it below the origin's keep-alive).
    pub idle_timeout: Duration,
    /// A connection is retired after this many requests (0 = unlimited).
    pub max_requests_per_connection: u64,
    /// HTTP/2: concurrent requests (streams) per connection before another connection is
    /// opened; the origin's SETTINGS_MAX_CONCURRENT_STREAMS lowers it.
    pub max_streams: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            max_connections: 0,
            max_idle: 1024,
            idle_timeout: Duration::from_secs(4),
            max_requests_per_connection: 10_000,
            max_streams: 100,
        }
    }
}

/// A named group of origin servers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Unique, non-empty name that routes refer to.
    pub name: String,
    /// Origin servers; at least one.
    pub servers: Vec<OriginServerConfig>,
    /// `"random"`, `"round_robin"`, `"least_outstanding"` or `"hash"`.
    pub balance: Balance,
    /// `hash`: what `balance = "hash"` hashes (required with it, refused without).
    pub hash: Option<HashConfig>,
    /// Connection pool limits, per server.
    pub pool: PoolConfig,
    /// Time to establish a TCP connection to a server.
    pub connect_timeout: Duration,
    /// Time from the request being sent to the response head arriving → 504.
    pub response_header_timeout: Duration,
    /// Longest gap between two reads of a response body from the origin (from the head to
    /// the first body bytes included) → the client connection is aborted.
    pub read_timeout: Duration,
    /// Total deadline for the whole exchange including the body (absent = none).
    pub request_timeout: Option<Duration>,
    /// `"http1"`, `"h2"` (ALPN h2 over TLS, prior knowledge in cleartext) or `"auto"`
    /// (TLS only: ALPN offers h2 and http/1.1, the origin picks).
    pub protocol: UpstreamProtocol,
    /// `tls`: speak TLS to the servers (absent = cleartext).
    pub tls: Option<UpstreamTlsConfig>,
    /// Send a PROXY protocol header (`"v1"` or `"v2"`) naming the client on each new
    /// connection; such connections are reused only by the same client connection.
    pub proxy_protocol: ProxyProtocol,
    /// `health_check`: active HTTP checks of every server (absent = none).
    pub health_check: Option<HealthCheckConfig>,
    /// `outlier_detection`: passive ejection of failing servers.
    pub outlier_detection: OutlierConfig,
    /// `"fail_open"` or `"fail_closed"`: what to do when no server is healthy.
    pub all_unhealthy: AllUnhealthy,
    /// `retry_budget`: cap on retries in flight, a share of active requests.
    pub retry_budget: RetryBudgetConfig,
    /// `limits`: caps on requests in flight and waiting.
    pub limits: ClusterLimits,
    /// Service discovery: re-resolve DNS names (every address becomes a server) and watch a
    /// server list file. Absent: names are resolved once per config version.
    pub discovery: Option<DiscoveryConfig>,
}

/// The HTTP version spoken to a cluster's servers.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default, Hash)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamProtocol {
    /// HTTP/1.1 (ALPN offers only http/1.1 over TLS).
    #[default]
    Http1,
    /// HTTP/2: ALPN h2 over TLS, prior knowledge (h2c) in cleartext.
    H2,
    /// TLS only: ALPN offers h2 and http/1.1 and the origin picks.
    Auto,
}

impl UpstreamProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamProtocol::Http1 => "http1",
            UpstreamProtocol::H2 => "h2",
            UpstreamProtocol::Auto => "auto",
        }
    }
}

/// TLS to a cluster's origin servers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamTlsConfig {
    /// Server name sent in SNI and verified against the certificate. Absent: the host of
    /// each server's `address` (an IP address is verified against IP SANs and no SNI is sent).
    pub sni: Option<String>,
    /// PEM file of the CA certificates origin certificates must chain to. Absent: the
    /// Mozilla root set compiled into the gateway (webpki-roots).
    pub ca: Option<String>,
    /// Client certificate presented to origins that ask for one (mTLS).
    pub client_cert: Option<TlsCertificate>,
    /// Lowest TLS version offered.
    pub min_version: TlsVersion,
    /// Highest TLS version offered.
    pub max_version: TlsVersion,
}

impl Default for UpstreamTlsConfig {
    fn default() -> Self {
        Self {
            sni: None,
            ca: None,
            client_cert: None,
            min_version: TlsVersion::Tls12,
            max_version: TlsVersion::Tls13,
        }
    }
}

impl UpstreamTlsConfig {
    /// Make relative file paths relative to `dir` (the config file's directory).
    pub fn resolve_paths(&mut self, dir: &std::path::Path) {
        let fix = |p: &mut String| {
            if !p.is_empty() && std::path::Path::new(p.as_str()).is_relative() {
                *p = dir.join(p.as_str()).display().to_string();
            }
        };
        if let Some(ca) = &mut self.ca {
            fix(ca);
        }
        if let Some(c) = &mut self.client_cert {
            fix(&mut c.cert);
            fix(&mut c.key);
        }
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            servers: Vec::new(),
            balance: Balance::Random,
            hash: None,
            pool: PoolConfig::default(),
            connect_timeout: Duration::from_secs(2),
            response_header_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(60),
            request_timeout: None,
            protocol: UpstreamProtocol::Http1,
            tls: None,
            proxy_protocol: ProxyProtocol::Off,
            health_check: None,
            outlier_detection: OutlierConfig::default(),
            all_unhealthy: AllUnhealthy::FailOpen,
            retry_budget: RetryBudgetConfig::default(),
            limits: ClusterLimits::default(),
            discovery: None,
        }
    }
}
