//! Filter settings: the `[[filters]]` tables (stages, types, matches, built-in filter keys),
//! Lua filters (`[lua]`), body opt-in caps (`[filter_body]`) and the filter debug mode
//! (`[filter_debug]`). Every key has a default (documented in `docs/configuration.md`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::jwt::{JwksConfig, JwtKey};
use crate::units::{ByteSize, Duration};

/// Body opt-in: a filter that declares it needs the request or response body gets it
/// buffered up to these caps (everyone else streams). Past the request cap the client gets
/// 413; past the response cap, 502.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FilterBodyConfig {
    /// Largest request body buffered for a filter (the route's `max_body_size` still applies).
    pub max_request: ByteSize,
    /// Largest origin response body buffered for a filter.
    pub max_response: ByteSize,
}

impl Default for FilterBodyConfig {
    fn default() -> Self {
        Self {
            max_request: ByteSize(1024 * 1024),
            max_response: ByteSize(1024 * 1024),
        }
    }
}

/// The Lua `shared` dictionary is split into this many independently locked shards, each
/// with an equal share of `shared_dict_size`: a value must fit one shard's share.
pub const SHARED_DICT_SHARDS: u64 = 32;

/// Lua filters: one `.lua` file per filter in `dir`, compiled into a filter set on start and
/// on every reload (and when a file in `dir` changes, if `watch` is on).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LuaConfig {
    /// The filters directory (a relative path is taken from the config file's directory);
    /// absent means no Lua filters.
    pub dir: Option<String>,
    /// Reload when a `.lua` file in `dir` is added, changed or removed.
    pub watch: bool,
    /// How often the watcher looks at the directory's files (mtime and size).
    pub poll_interval: Duration,
    /// Lua VM instructions one `should_filter` or `run` call may execute before it is
    /// stopped (it then fails: the error stage runs).
    pub instruction_budget: u64,
    /// Memory cap of each worker's Lua VM; past it an allocation fails (the call fails)
    /// and the VM is rebuilt.
    pub memory_limit: ByteSize,
    /// Default timeout of a `ctx.http` call when the call gives none (connect, TLS and the
    /// whole response).
    pub http_timeout: Duration,
    /// Largest timeout a `ctx.http` call may ask for; a longer one is cut to it.
    pub http_max_timeout: Duration,
    /// PEM file of the CA certificates `https://` servers must chain to. Absent: the Mozilla
    /// root set compiled into the gateway (webpki-roots).
    pub http_ca_file: Option<String>,
    /// How long a worker keeps an idle `ctx.http` connection for reuse.
    pub http_pool_idle_timeout: Duration,
    /// Idle `ctx.http` connections a worker keeps per origin (scheme, host, port); 0 turns
    /// reuse off.
    pub http_pool_max_idle: usize,
    /// Largest response body `ctx.http` reads; a longer one fails the call.
    pub http_max_body: ByteSize,
    /// Let `ctx.http` reach the admin listener (off: such a call returns `nil, err`).
    pub http_allow_admin: bool,
    /// Wall-clock time one `should_filter` or `run` call may take while it runs (time
    /// suspended in `ctx.http` does not count); checked with the instruction budget.
    pub max_call_time: Duration,
    /// Bytes the process-wide `shared` dictionary may hold (keys, values and a fixed
    /// overhead per entry); past it `shared.set` evicts the least recently used entries.
    pub shared_dict_size: ByteSize,
    /// Largest value (string) `shared.set` stores; a longer one gets `nil, "no memory"`.
    pub shared_max_value: ByteSize,
    /// Per filter (the file's name): the table its `ctx.settings` reads. A route may override
    /// keys in its `lua_settings`. `{ env = "NAME" }` reads an environment variable.
    pub settings: BTreeMap<String, toml::Table>,
}

impl Default for LuaConfig {
    fn default() -> Self {
        Self {
            dir: None,
            watch: true,
            poll_interval: Duration::from_secs(1),
            instruction_budget: 1_000_000,
            memory_limit: ByteSize(64 * 1024 * 1024),
            http_timeout: Duration::from_secs(1),
            http_max_timeout: Duration::from_secs(30),
            http_ca_file: None,
            http_pool_idle_timeout: Duration::from_secs(30),
            http_pool_max_idle: 16,
            http_max_body: ByteSize(1024 * 1024),
            http_allow_admin: false,
            max_call_time: Duration::from_millis(100),
            shared_dict_size: ByteSize(64 * 1024 * 1024),
            shared_max_value: ByteSize(1024 * 1024),
            settings: BTreeMap::new(),
        }
    }
}

/// Filter debug mode: a request whose `header` equals `secret` gets a response header
/// `x-keymaster-filters` listing which filters ran or were skipped, in order, with times.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FilterDebugConfig {
    /// The request header carrying the secret (removed before forwarding).
    pub header: String,
    /// The secret; absent means debug mode is off.
    pub secret: Option<String>,
}

impl Default for FilterDebugConfig {
    fn default() -> Self {
        Self {
            header: "x-keymaster-debug".into(),
            secret: None,
        }
    }
}

/// The stage a filter runs in (Zuul's names).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default, Hash)]
#[serde(rename_all = "snake_case")]
pub enum FilterStage {
    /// Inbound, after the route is matched; may answer the request itself.
    #[default]
    Pre,
    /// Chooses where the request goes: cluster, path, Host.
    Route,
    /// Outbound: sees and edits the response status and headers.
    Post,
    /// Runs when a filter failed; may set the error response.
    Error,
}

impl FilterStage {
    pub fn as_str(self) -> &'static str {
        match self {
            FilterStage::Pre => "pre",
            FilterStage::Route => "route",
            FilterStage::Post => "post",
            FilterStage::Error => "error",
        }
    }
}

/// The built-in filter types configurable from TOML.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum FilterType {
    /// Add/set/remove headers: request side in `pre`/`route`, response side in `post`.
    #[default]
    Headers,
    /// Answer with a redirect (`status`, `location`).
    Redirect,
    /// Answer with a fixed response (`status`, `headers`, `body`).
    Static,
    /// CORS: preflight answered in `pre`, response headers added in `post`.
    Cors,
    /// IP allow and deny lists (CIDR); 403.
    IpFilter,
    /// A key in a header must be one of `keys`; 401.
    ApiKey,
    /// Token bucket (per worker, or shared through Redis); 429 with Retry-After.
    RateLimit,
    /// Route stage: override the cluster, path and Host.
    Reroute,
    /// Verify a JWT (HS256, RS256, ES256, EdDSA; static keys or a JWKS URL) from a header; 401.
    Jwt,
    /// A native (Rust) filter type built into the binary, named by `native`, with its
    /// `params` table.
    Native,
}

impl FilterType {
    pub fn as_str(self) -> &'static str {
        match self {
            FilterType::Headers => "headers",
            FilterType::Redirect => "redirect",
            FilterType::Static => "static",
            FilterType::Cors => "cors",
            FilterType::Native => "native",
            FilterType::IpFilter => "ip_filter",
            FilterType::ApiKey => "api_key",
            FilterType::RateLimit => "rate_limit",
            FilterType::Reroute => "reroute",
            FilterType::Jwt => "jwt",
        }
    }
}

/// What a rate limit counts by.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum RateLimitKey {
    /// The client's IP address (the TCP peer).
    #[default]
    ClientIp,
    /// The value of the request header named by `header` (requests without it share one bucket).
    Header,
    /// The matched route's name.
    Route,
}

/// Where a rate limit keeps its buckets.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum RateLimitBackend {
    /// In each worker's memory: a limit per worker thread of this process.
    #[default]
    Local,
    /// In the `[redis]` server: one limit shared by every keymaster instance using it;
    /// the local buckets decide while Redis is slow or down.
    Redis,
}

/// Whose requests a local rate limit counts.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum RateLimitScope {
    /// One bucket per key for the whole process: the configured rate is the process's,
    /// whatever the number of workers.
    #[default]
    Process,
    /// One bucket per key in each worker thread: the process allows `workers` times the rate.
    Worker,
}

/// Declarative filter match: all given criteria must hold; empty matches every request.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FilterMatch {
    /// Names of routes (must exist); empty means any.
    pub routes: Vec<String>,
    /// The request path starts with this.
    pub path_prefix: Option<String>,
    /// Allowed methods; empty means any.
    pub methods: Vec<String>,
    /// Header names that must be present in the request (any value).
    pub headers: Vec<String>,
}

/// One `[[filters]]` table. Common keys first; the rest belong to particular types and
/// validation rejects a key the filter's type does not use.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FilterConfig {
    /// Unique, non-empty name (the `filter` label of the filter metrics).
    pub name: String,
    /// The built-in type.
    #[serde(rename = "type")]
    pub kind: FilterType,
    /// `"pre"`, `"route"`, `"post"` or `"error"`.
    pub stage: FilterStage,
    /// Lower runs first within a stage; ties are broken by name.
    pub order: i32,
    /// Which requests the filter applies to.
    #[serde(rename = "match")]
    pub matches: FilterMatch,

    /// headers: values appended.
    pub add: BTreeMap<String, String>,
    /// headers: values replacing existing ones.
    pub set: BTreeMap<String, String>,
    /// headers: names removed.
    pub remove: Vec<String>,

    /// redirect, static, ip_filter, api_key, rate_limit: the status answered.
    pub status: Option<u16>,
    /// redirect: the Location.
    pub location: Option<String>,
    /// static: response headers.
    pub headers: BTreeMap<String, String>,
    /// static: response body.
    pub body: Option<String>,

    /// cors: allowed origins ("*" for any).
    pub allowed_origins: Vec<String>,
    /// cors: allowed methods.
    pub allowed_methods: Vec<String>,
    /// cors: allowed request headers.
    pub allowed_headers: Vec<String>,
    /// cors: send Access-Control-Allow-Credentials: true.
    pub allow_credentials: bool,
    /// cors: Access-Control-Max-Age of a preflight answer.
    pub max_age: Option<Duration>,

    /// ip_filter: CIDR blocks or addresses allowed (empty: all not denied).
    pub allow: Vec<String>,
    /// ip_filter: CIDR blocks or addresses denied (checked first).
    pub deny: Vec<String>,

    /// api_key: header carrying the key; rate_limit with key = "header": the header counted by.
    pub header: Option<String>,
    /// api_key: the accepted keys.
    pub keys: Vec<String>,

    /// rate_limit: requests allowed per `period` (the refill rate).
    pub requests: Option<u32>,
    /// rate_limit: the period of `requests` (default 1s).
    pub period: Option<Duration>,
    /// rate_limit: bucket size (default `requests`).
    pub burst: Option<u32>,
    /// rate_limit: `"client_ip"`, `"header"` or `"route"`.
    pub key: Option<RateLimitKey>,
    /// rate_limit: `"local"` (default) or `"redis"` (needs `[redis] url`).
    pub backend: Option<RateLimitBackend>,
    /// rate_limit: `"process"` (default) or `"worker"`: whose requests the local buckets count.
    pub scope: Option<RateLimitScope>,

    /// reroute: the cluster to send to instead of the route's.
    pub cluster: Option<String>,
    /// reroute: the path sent upstream (query kept).
    pub path: Option<String>,
    /// reroute: the Host header sent upstream.
    pub host: Option<String>,

    /// jwt: the static verification keys (rotate them by reloading).
    pub jwt_keys: Vec<JwtKey>,
    /// jwt: a key set fetched from a URL and refreshed in the background.
    pub jwks: Option<JwksConfig>,
    /// jwt: clock skew allowed on `exp` and `nbf` (default 30s).
    pub leeway: Option<Duration>,
    /// jwt: the required `iss` claim.
    pub issuer: Option<String>,
    /// jwt: the required `aud` claim (one of, when the token has a list).
    pub audience: Option<String>,
    /// jwt: claim name → request header set from it (any incoming value is removed first).
    pub claims_to_headers: BTreeMap<String, String>,

    /// native: the filter type, as the binary registered it.
    pub native: Option<String>,
    /// native: the filter's parameters, checked by the filter type when the config loads.
    /// A value `{ env = "NAME" }` reads the environment variable `NAME` (see [`env_value`]).
    pub params: toml::Table,
}

/// A parameter value that names an environment variable: `{ env = "NAME" }`. Filter
/// parameters and Lua settings may use it for secrets and per-host values; its variable
/// must be set when the config loads.
pub fn env_reference(v: &toml::Value) -> Option<&str> {
    let t = v.as_table()?;
    match (t.len(), t.get("env")) {
        (1, Some(toml::Value::String(name))) => Some(name),
        _ => None,
    }
}

/// `v` with every `{ env = "NAME" }` in it (at any depth) replaced by the variable's value,
/// or the first variable that is not set (or not Unicode), with the key path leading to it.
pub fn env_value(v: &toml::Value) -> Result<toml::Value, String> {
    if let Some(name) = env_reference(v) {
        return std::env::var(name)
            .map(toml::Value::String)
            .map_err(|_| format!("environment variable {name} is not set"));
    }
    Ok(match v {
        toml::Value::Table(t) => toml::Value::Table(env_table(t)?),
        toml::Value::Array(a) => toml::Value::Array(
            a.iter()
                .enumerate()
                .map(|(i, x)| env_value(x).map_err(|e| format!("[{i}]: {e}")))
                .collect::<Result<_, _>>()?,
        ),
        other => other.clone(),
    })
}

/// [`env_value`] for each value of a table.
pub fn env_table(t: &toml::Table) -> Result<toml::Table, String> {
    t.iter()
        .map(|(k, x)| Ok((k.clone(), env_value(x).map_err(|e| format!("{k}: {e}"))?)))
        .collect()
}
