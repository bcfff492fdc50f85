//! The configuration model: plain serde types, one per TOML table.
//!
//! Every field has a default (see `docs/configuration.md`); `deny_unknown_fields`
//! everywhere so a misspelt key is an error with its location, never silently ignored.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;

pub use crate::cluster::*;
pub use crate::compression::*;
pub use crate::filters::*;
pub use crate::jwt::*;
pub use crate::mirror::MirrorConfig;
pub use crate::registry::{ConsulConfig, EurekaConfig, KubernetesConfig};
pub use crate::resilience::*;
pub use crate::traces::*;
pub use crate::traffic::*;
pub use crate::units::{ByteSize, Duration};

/// The whole file.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[server]`: process-wide settings.
    pub server: ServerConfig,
    /// `[admin]`: the admin listener.
    pub admin: AdminConfig,
    /// `[access_log]`: per-request log lines.
    pub access_log: AccessLogConfig,
    /// `[[listeners]]`: client-facing sockets; at least one.
    pub listeners: Vec<ListenerConfig>,
    /// `[[routes]]`: request matching, in priority order (ties keep file order).
    pub routes: Vec<RouteConfig>,
    /// `[[clusters]]`: named groups of origin servers that routes forward to.
    pub clusters: Vec<ClusterConfig>,
    /// `[[filters]]`: built-in filters of the filter chain (see `docs/filters.md`).
    pub filters: Vec<FilterConfig>,
    /// `[filter_debug]`: per-request filter traces for requests carrying a secret.
    pub filter_debug: FilterDebugConfig,
    /// `[load_shedding]`: shed low-priority routes first when the gateway is overloaded.
    pub load_shedding: LoadSheddingConfig,
    /// `[redis]`: the shared store of `rate_limit` filters with `backend = "redis"`.
    pub redis: RedisConfig,
    /// `[dns]`: the resolver of clusters with `discovery`.
    pub dns: DnsConfig,
    /// `[lua]`: Lua filters loaded from a directory (see `docs/filters.md`).
    pub lua: LuaConfig,
    /// `[filter_body]`: caps for bodies buffered for filters that declare they need them.
    pub filter_body: FilterBodyConfig,
    /// `[traces]`: OpenTelemetry traces exported over OTLP (off without an endpoint).
    pub traces: TracesConfig,
}

/// The DNS resolver used by service discovery (`[[clusters]] discovery`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DnsConfig {
    /// Name servers, "ip" or "ip:port" (port 53 by default); empty means the system's
    /// (`/etc/resolv.conf`, plus `/etc/hosts`).
    pub nameservers: Vec<String>,
    /// Longest wait for one query.
    pub timeout: Duration,
}

impl Default for DnsConfig {
    fn default() -> Self {
        Self {
            nameservers: Vec::new(),
            timeout: Duration::from_secs(2),
        }
    }
}

/// Service discovery of one cluster: its servers are `servers` (DNS names re-resolved on an
/// interval) plus those of a watched file and of service registries.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DiscoveryConfig {
    /// How often DNS names are re-resolved, `file` re-read and Eureka asked; also the wait
    /// before a failed registry is asked again.
    pub interval: Duration,
    /// A file listing more servers, one `host:port [weight]` per line (`#` comments); a
    /// relative path is relative to the config file's directory.
    pub file: Option<String>,
    /// The healthy instances of a service in Consul's catalog (blocking queries).
    pub consul: Option<ConsulConfig>,
    /// The `UP` instances of an application in Eureka.
    pub eureka: Option<EurekaConfig>,
    /// The ready endpoints of a Kubernetes Service's EndpointSlices.
    pub kubernetes: Option<KubernetesConfig>,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(5),
            file: None,
            consul: None,
            eureka: None,
            kubernetes: None,
        }
    }
}

/// The Redis server shared by every keymaster instance for cluster-wide rate limits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]` or `redis+unix:///path/to/socket`; absent
    /// means no Redis (a `backend = "redis"` filter then fails validation).
    pub url: Option<String>,
    /// Longest wait for one Redis call (connecting included) before the local bucket decides.
    pub timeout: Duration,
    /// After a failed or slow call, Redis is left alone this long (local buckets decide).
    pub backoff: Duration,
    /// Prefix of every Redis key (`<prefix><filter name>:<key>`).
    pub key_prefix: String,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: None,
            timeout: Duration::from_millis(50),
            backoff: Duration::from_secs(2),
            key_prefix: "keymaster:rl:".into(),
        }
    }
}

/// Process-wide settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Worker threads; 0 means one per core.
    pub workers: usize,
    /// How long graceful shutdown waits for in-flight requests.
    pub drain_timeout: Duration,
    /// Value of the `Via` pseudonym added to forwarded messages ("1.1 <via>").
    pub via: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            workers: 0,
            drain_timeout: Duration::from_secs(30),
            via: "keymaster".into(),
        }
    }
}

/// The admin listener (`/metrics`, `/healthz`, `/ready`, `/config`, `/reload`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Address to listen on ("ip:port"); `"off"` (or `""`) means no admin listener.
    /// Absent means the default, 127.0.0.1:9901.
    #[serde(with = "admin_listen")]
    pub listen: Option<SocketAddr>,
    /// Time a client has to send a complete request head, from its connection and from the
    /// first byte of each later head (slowloris guard).
    pub header_read_timeout: Duration,
    /// How long an idle keep-alive connection is kept, and how long a response write may
    /// make no progress (a client that stops reading).
    pub idle_timeout: Duration,
    /// Cap on open admin connections; past it new connections are closed at once.
    pub max_connections: usize,
    /// Bearer token that `GET /config` and `POST /reload` require (redacted in `/config`).
    pub token: Option<String>,
    /// Name of an environment variable that holds the token (instead of `token`).
    pub token_env: Option<String>,
}

impl AdminConfig {
    /// The bearer token the admin listener requires: `token`, or the value of the
    /// environment variable `token_env` names; `None` when neither is set (validation
    /// refuses a named variable that is unset or empty).
    pub fn resolved_token(&self) -> Option<String> {
        if let Some(t) = &self.token {
            return Some(t.clone());
        }
        let name = self.token_env.as_deref()?;
        if name.is_empty() || name.contains(['=', '\0']) {
            return None;
        }
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

/// `admin.listen` as TOML: "ip:port", or "off" for none (TOML has no null).
mod admin_listen {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};
    use std::net::SocketAddr;

    pub fn serialize<S: Serializer>(v: &Option<SocketAddr>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(addr) => s.collect_str(addr),
            None => s.serialize_str("off"),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
        let text = String::deserialize(d)?;
        match text.trim() {
            "" | "off" => Ok(None),
            t => t.parse().map(Some).map_err(|_| {
                D::Error::custom(format!(
                    "{text:?} is not a socket address; expected \"ip:port\" like \"127.0.0.1:9901\", or \"off\""
                ))
            }),
        }
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 9901))),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 64,
            token: None,
            token_env: None,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum AccessLogFormat {
    /// One JSON object per line.
    #[default]
    Json,
    /// Apache/NCSA combined log format.
    Combined,
}

/// Access log: off by default (benchmarks run without it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AccessLogConfig {
    /// Write access log lines at all.
    pub enabled: bool,
    /// `"json"` or `"combined"`.
    pub format: AccessLogFormat,
    /// File path, or "-" for standard output.
    pub path: String,
}

impl Default for AccessLogConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            format: AccessLogFormat::Json,
            path: "-".into(),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ListenerProtocol {
    /// HTTP/1.1 only.
    Http1,
    /// HTTP/2 with prior knowledge, cleartext.
    H2c,
    /// Detect the h2 preface, else HTTP/1.1.
    #[default]
    Auto,
}

/// One downstream (client-facing) listener.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ListenerConfig {
    /// Unique name (used in metrics and logs).
    pub name: String,
    /// "ip:port" to bind; unique across listeners and distinct from `admin.listen`.
    pub address: SocketAddr,
    /// `"http1"`, `"h2c"` or `"auto"`.
    pub protocol: ListenerProtocol,
    /// Cap on open client connections; past it new connections are closed at once.
    pub max_connections: usize,
    /// Time a client has to send a complete request head (slowloris guard).
    pub header_read_timeout: Duration,
    /// How long an idle keep-alive client connection is kept.
    pub idle_timeout: Duration,
    /// How long a response write may make no progress (a client that stops reading) before
    /// the connection is reset (nginx's `send_timeout`).
    pub send_timeout: Duration,
    /// Longest request line (method, target, version) → 414 past it.
    pub max_request_line: ByteSize,
    /// Largest request head in bytes → 431 past it.
    pub max_header_bytes: ByteSize,
    /// Most header fields in a request → 431 past it.
    pub max_headers: usize,
    /// Peers whose X-Forwarded-For / X-Forwarded-Proto / X-Forwarded-Host are believed (CIDR).
    pub trusted_proxies: Vec<String>,
    /// Also add an RFC 7239 `Forwarded` header.
    pub forwarded_header: bool,
    /// Header carrying the request id (generated when absent).
    pub request_id_header: String,
    /// Whose request id is kept: `"trusted"` (peers in `trusted_proxies`; anyone else's is
    /// replaced with a generated one) or `"any"` client's.
    pub request_id_from: RequestIdFrom,
    /// Share of requests traced when `[traces]` is on and the request has no sampled parent
    /// (0.0 to 1.0); a route's `trace_sample` overrides it.
    pub trace_sample: f64,
    /// `tls`: terminate TLS on this listener (absent = cleartext).
    pub tls: Option<TlsConfig>,
    /// PROXY protocol header expected before TLS/HTTP: `"off"`, `"v1"`, `"v2"` or `"any"`.
    pub proxy_protocol: ProxyProtocol,
    /// Peers (CIDR blocks or addresses) allowed to send a PROXY header; required when
    /// `proxy_protocol` is on. Connections from anyone else are closed.
    pub proxy_protocol_from: Vec<String>,
    /// `path`: how the request path is made canonical before routing (docs/security.md).
    pub path: PathConfig,
    /// Requests (HTTP/2: streams) served on one client connection before it is closed
    /// gracefully (`Connection: close` on the last response, GOAWAY); 0 = unlimited.
    pub max_requests_per_connection: u64,
    /// Age past which a client connection is closed gracefully after its current request
    /// (HTTP/2: GOAWAY); each connection's limit is drawn between 90% and 100% of it. `0s`
    /// turns it off.
    pub max_connection_age: Duration,
    /// One `SO_REUSEPORT` socket per worker, the kernel spreading new connections over them
    /// by a hash of their addresses (`true`); or one socket every worker accepts from
    /// (`false`), where a worker takes a connection when it gets to it.
    pub reuse_port: bool,
}

/// A listener's `path` table: the canonical path routing, filters and the origin see.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PathConfig {
    /// Merge runs of `/` into one (nginx's `merge_slashes`).
    pub merge_slashes: bool,
    /// An encoded `/` or `\` (`%2F`, `%5C`): `"reject"` (400) or `"keep"` (left encoded).
    pub escaped_slashes: EscapedSlashes,
    /// What the origin gets: `"canonical"`, or `"raw"`, the client's path as sent unless a
    /// rewrite or a filter changed it.
    pub forward: ForwardPath,
}

impl Default for PathConfig {
    fn default() -> Self {
        Self {
            merge_slashes: true,
            escaped_slashes: EscapedSlashes::Reject,
            forward: ForwardPath::Canonical,
        }
    }
}

/// `path.escaped_slashes`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum EscapedSlashes {
    /// Refuse the request (400).
    #[default]
    Reject,
    /// Keep the escape: it is no separator for routing, and the origin decides.
    Keep,
}

/// `path.forward`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ForwardPath {
    /// The canonical path the route and the filters saw.
    #[default]
    Canonical,
    /// The client's path as sent, when no rewrite or filter changed it.
    Raw,
}

/// Whose request id a listener keeps (`request_id_from`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum RequestIdFrom {
    /// Peers in `trusted_proxies` (an edge's own load balancers); other clients' ids are
    /// replaced, so that a client cannot choose the id logs and traces are joined by.
    #[default]
    Trusted,
    /// Every client.
    Any,
}

/// Which PROXY protocol versions (HAProxy's, v1 text or v2 binary) a listener accepts.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ProxyProtocol {
    /// No PROXY header: the socket's peer is the client.
    #[default]
    Off,
    /// The text header (`PROXY TCP4 ...\r\n`) is required.
    V1,
    /// The binary header is required.
    V2,
    /// Either version is required.
    Any,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        Self {
            name: "main".into(),
            address: SocketAddr::from(([127, 0, 0, 1], 8080)),
            protocol: ListenerProtocol::Auto,
            max_connections: 65_536,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(60),
            max_request_line: ByteSize(8 * 1024),
            max_header_bytes: ByteSize(64 * 1024),
            max_headers: 100,
            trusted_proxies: Vec::new(),
            forwarded_header: false,
            request_id_header: "x-request-id".into(),
            request_id_from: RequestIdFrom::Trusted,
            trace_sample: 1.0,
            tls: None,
            proxy_protocol: ProxyProtocol::Off,
            proxy_protocol_from: Vec::new(),
            path: PathConfig::default(),
            max_requests_per_connection: 0,
            max_connection_age: Duration::from_secs(3600),
            reuse_port: true,
        }
    }
}

/// Lowest TLS version a listener accepts.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
pub enum TlsVersion {
    /// TLS 1.2 and 1.3.
    #[default]
    #[serde(rename = "1.2")]
    Tls12,
    /// TLS 1.3 only.
    #[serde(rename = "1.3")]
    Tls13,
}

/// One certificate chain and its private key (PEM files).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsCertificate {
    /// PEM file with the leaf certificate first, then intermediates.
    pub cert: String,
    /// PEM file with the private key (PKCS#8, PKCS#1 or SEC1).
    pub key: String,
}

/// Client-certificate verification (mTLS).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClientAuthConfig {
    /// PEM file with the CA certificates client certificates must chain to.
    pub ca: String,
    /// Reject clients without a certificate (false: verify one when presented).
    #[serde(default = "yes")]
    pub required: bool,
    /// Request header set to the verified client's identity (subject CN, else first DNS
    /// name) when forwarding; any value the client sent in it is removed. Absent = not sent.
    #[serde(default)]
    pub forward_header: Option<String>,
}

fn yes() -> bool {
    true
}

/// TLS termination on a listener.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// Certificates chosen by SNI; the first is the default (no SNI, or no match).
    pub certificates: Vec<TlsCertificate>,
    /// ALPN protocols offered, in preference order: "h2", "http/1.1". Absent: both for
    /// `protocol = "auto"`, only "http/1.1" for `protocol = "http1"`.
    pub alpn: Option<Vec<String>>,
    /// `"1.2"` or `"1.3"`.
    pub min_version: TlsVersion,
    /// Verify client certificates against a CA.
    pub client_auth: Option<ClientAuthConfig>,
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self {
            certificates: Vec::new(),
            alpn: None,
            min_version: TlsVersion::Tls12,
            client_auth: None,
        }
    }
}

impl TlsConfig {
    /// The ALPN protocols offered on a listener of `protocol` (see [`TlsConfig::alpn`]).
    pub fn effective_alpn(&self, protocol: ListenerProtocol) -> Vec<String> {
        match (&self.alpn, protocol) {
            (Some(list), _) => list.clone(),
            (None, ListenerProtocol::Http1) => vec!["http/1.1".into()],
            (None, _) => vec!["h2".into(), "http/1.1".into()],
        }
    }

    /// Make relative file paths relative to `dir` (the config file's directory).
    pub fn resolve_paths(&mut self, dir: &std::path::Path) {
        let fix = |p: &mut String| {
            if !p.is_empty() && std::path::Path::new(p.as_str()).is_relative() {
                *p = dir.join(p.as_str()).display().to_string();
            }
        };
        for c in &mut self.certificates {
            fix(&mut c.cert);
            fix(&mut c.key);
        }
        if let Some(ca) = &mut self.client_auth {
            fix(&mut ca.ca);
        }
    }
}

/// Match criteria of a route; all given criteria must hold.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RouteMatch {
    /// Exact host ("api.example.com") or leading wildcard ("*.example.com"); port ignored.
    pub host: Option<String>,
    /// Path starts with this ("/api" also matches "/api/x" and "/apix"; end it with "/" to
    /// match whole segments). At most one of the three path criteria.
    pub path_prefix: Option<String>,
    /// Path equals this exactly (query string not included).
    pub path_exact: Option<String>,
    /// Path matches this regex (regex crate syntax, unanchored unless you use ^ and $).
    pub path_regex: Option<String>,
    /// Allowed methods; empty means any.
    pub methods: Vec<String>,
    /// Header name → exact value that must be present.
    pub headers: BTreeMap<String, String>,
}

/// Path rewrite applied before forwarding. At most one of the three.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RewriteConfig {
    /// Remove this prefix ("/api/users" → "/users").
    pub strip_prefix: Option<String>,
    /// Replace the route's `path_prefix` with this.
    pub replace_prefix: Option<String>,
    /// Replace the whole path with this (query kept).
    pub replace_path: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum HostPolicy {
    /// Forward the client's Host.
    #[default]
    Preserve,
    /// Use the origin server's address.
    Origin,
    /// Use `fixed_host`.
    Fixed,
}

/// Header edits: remove, then set (replace), then add (append).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HeaderEdits {
    /// Header name → value appended (existing values kept).
    pub add: BTreeMap<String, String>,
    /// Header name → value replacing every existing value.
    pub set: BTreeMap<String, String>,
    /// Header names removed.
    pub remove: Vec<String>,
}

/// One route: match → cluster, with per-route edits and limits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RouteConfig {
    /// Unique, non-empty name (used in metrics and logs).
    pub name: String,
    /// Higher first; ties keep file order.
    pub priority: i32,
    /// `match`: what requests this route takes; empty matches everything.
    #[serde(rename = "match")]
    pub matches: RouteMatch,
    /// Name of the cluster to forward to (must exist). Exactly one of `cluster` and
    /// `clusters`.
    pub cluster: String,
    /// A weighted split over several clusters (canary releases), instead of `cluster`.
    pub clusters: Vec<WeightedCluster>,
    /// With `clusters`: a header or cookie through which a client names the cluster.
    pub cluster_override: Option<ClusterOverride>,
    /// Path rewrite before forwarding.
    pub rewrite: RewriteConfig,
    /// Host header sent upstream: `"preserve"`, `"origin"` or `"fixed"`.
    pub host_policy: HostPolicy,
    /// Host header value for `host_policy = "fixed"` (and only then).
    pub fixed_host: Option<String>,
    /// Edits to the request before it is forwarded.
    pub request_headers: HeaderEdits,
    /// Edits to the response before it is returned.
    pub response_headers: HeaderEdits,
    /// Override the cluster's timeouts for this route.
    pub connect_timeout: Option<Duration>,
    pub response_header_timeout: Option<Duration>,
    pub read_timeout: Option<Duration>,
    pub request_timeout: Option<Duration>,
    /// Largest request body → 413 past it.
    pub max_body_size: ByteSize,
    /// Longest the client may leave its request body with nothing to read (between reads,
    /// from the first wait) → 408 past it (nginx's `client_body_timeout`).
    pub client_body_timeout: Duration,
    /// Read the whole request body before contacting the origin and send it with a
    /// Content-Length (nginx's `proxy_request_buffering`).
    pub request_buffering: bool,
    /// `upgrade`: which HTTP/1.1 `Upgrade` protocols become two-way tunnels.
    pub upgrade: UpgradeConfig,
    /// `retry`: retry policy (default: one attempt, no retries).
    pub retry: RetryConfig,
    /// `"low"`, `"normal"` or `"high"`: lower priorities are shed first under overload.
    pub shed_priority: ShedPriority,
    /// Lua filter settings for this route, per filter: keys here replace the same keys of
    /// `[lua.settings.<filter>]` for requests of this route.
    pub lua_settings: BTreeMap<String, toml::Table>,
    /// The listener's `trace_sample` for requests of this route (0.0 to 1.0).
    pub trace_sample: Option<f64>,
    /// `mirror`: a sampled share of the route's requests also goes to a shadow cluster.
    pub mirror: Option<MirrorConfig>,
    /// `compression`: compress responses for clients that accept it. Absent: bodies pass
    /// byte-identical.
    pub compression: Option<CompressionConfig>,
}

/// Protocol upgrades (`Connection: upgrade` + `Upgrade: <protocol>`) on a route. An allowed
/// upgrade passes the pre filters like any request, then the origin's `101` turns the two
/// connections into a tunnel; other `Upgrade` requests are forwarded as plain requests with
/// `Upgrade` removed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UpgradeConfig {
    /// `Upgrade: websocket` passes through.
    pub websocket: bool,
    /// Other upgrade protocol names that pass through (case-insensitive, e.g. `"my-proto"`).
    pub protocols: Vec<String>,
    /// A tunnel with no bytes in either direction for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for UpgradeConfig {
    fn default() -> Self {
        Self {
            websocket: true,
            protocols: Vec::new(),
            idle_timeout: Duration::from_secs(300),
        }
    }
}

impl Default for RouteConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            priority: 0,
            matches: RouteMatch::default(),
            cluster: String::new(),
            clusters: Vec::new(),
            cluster_override: None,
            rewrite: RewriteConfig::default(),
            host_policy: HostPolicy::Preserve,
            fixed_host: None,
            request_headers: HeaderEdits::default(),
            response_headers: HeaderEdits::default(),
            connect_timeout: None,
            response_header_timeout: None,
            read_timeout: None,
            request_timeout: None,
            max_body_size: ByteSize(64 * 1024 * 1024),
            client_body_timeout: Duration::from_secs(60),
            request_buffering: false,
            upgrade: UpgradeConfig::default(),
            retry: RetryConfig::default(),
            shed_priority: ShedPriority::Normal,
            lua_settings: BTreeMap::new(),
            trace_sample: None,
            mirror: None,
            compression: None,
        }
    }
}
