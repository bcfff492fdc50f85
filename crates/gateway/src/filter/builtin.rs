//! The built-in filters configured by `[[filters]]` tables (validated in keymaster-config).

use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode};
use ipnet::IpNet;
use keymaster_filter::host::ClusterHandle;
use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use super::rate_limit_redis::RedisBackend;
use super::{done, Filter, FilterCtx, FilterFuture, FilterSpec, Needs};
use crate::metrics::Metrics;
use keymaster_config::{
    FilterConfig, FilterStage, FilterType, RateLimitBackend, RateLimitKey, RateLimitScope,
    RedisConfig,
};
use keymaster_http::headers::HeaderEdits;

/// One `[[filters]]` table → chain entries (cors yields a pre and a post entry).
pub(super) fn compile(
    f: &FilterConfig,
    redis: &RedisConfig,
    metrics: &Metrics,
    clusters: &super::Clusters,
) -> Result<Vec<FilterSpec>, String> {
    let spec = |stage: FilterStage, filter: Arc<dyn Filter>| FilterSpec {
        name: f.name.clone(),
        stage,
        order: f.order,
        matches: f.matches.clone(),
        filter,
    };
    let one = |filter: Arc<dyn Filter>| Ok(vec![spec(f.stage, filter)]);
    match f.kind {
        FilterType::Headers => {
            let edits = HeaderEdits::compile(&keymaster_config::HeaderEdits {
                add: f.add.clone(),
                set: f.set.clone(),
                remove: f.remove.clone(),
            })?;
            one(match f.stage {
                FilterStage::Post if appends_lines(&edits) => Arc::new(ResponseLines(edits)),
                FilterStage::Post => Arc::new(ResponseHeaders(edits)),
                _ => Arc::new(RequestHeaders(edits)),
            })
        }
        FilterType::Redirect => {
            let status = status(f.status.unwrap_or(302))?;
            let location = value(f.location.as_deref().unwrap_or("/"))?;
            one(Arc::new(Fixed {
                status,
                headers: HeaderMap::from_iter([(header::LOCATION, location)]),
                body: bytes::Bytes::new(),
            }))
        }
        FilterType::Static => {
            let mut headers = HeaderMap::new();
            for (k, v) in &f.headers {
                headers.append(name(k)?, value(v)?);
            }
            one(Arc::new(Fixed {
                status: status(f.status.unwrap_or(200))?,
                headers,
                body: f.body.clone().unwrap_or_default().into(),
            }))
        }
        FilterType::Cors => {
            let cors = Arc::new(Cors {
                any_origin: f.allowed_origins.iter().any(|o| o == "*"),
                origins: f.allowed_origins.clone(),
                methods: value(&if f.allowed_methods.is_empty() {
                    "GET, HEAD, POST".to_string()
                } else {
                    f.allowed_methods.join(", ")
                })?,
                headers: if f.allowed_headers.is_empty() {
                    None
                } else {
                    Some(value(&f.allowed_headers.join(", "))?)
                },
                credentials: f.allow_credentials,
                max_age: f
                    .max_age
                    .map(|d| value(&d.get().as_secs().to_string()))
                    .transpose()?,
            });
            Ok(vec![
                spec(FilterStage::Pre, Arc::new(CorsPre(cors.clone()))),
                spec(FilterStage::Post, Arc::new(CorsPost(cors))),
            ])
        }
        FilterType::IpFilter => one(Arc::new(IpFilter {
            allow: nets(&f.allow)?,
            deny: nets(&f.deny)?,
        })),
        FilterType::ApiKey => one(Arc::new(ApiKey {
            header: name(f.header.as_deref().unwrap_or("x-api-key"))?,
            keys: f.keys.clone(),
        })),
        FilterType::RateLimit => {
            let requests = f.requests.unwrap_or(1).max(1) as f64;
            let period = f.period.map(|d| d.get()).unwrap_or(Duration::from_secs(1));
            one(Arc::new(RateLimit {
                name: f.name.as_str().into(),
                rate: requests / period.as_secs_f64().max(1e-9),
                burst: f.burst.map(f64::from).unwrap_or(requests),
                key: f.key.unwrap_or_default(),
                scope: f.scope.unwrap_or_default(),
                header: f.header.as_deref().map(name).transpose()?,
                redis: match f.backend.unwrap_or_default() {
                    RateLimitBackend::Local => None,
                    RateLimitBackend::Redis => Some(RedisBackend::new(&f.name, redis, metrics)?),
                },
            }))
        }
        FilterType::Jwt => one(Arc::new(super::jwt::Jwt::compile(f, metrics)?)),
        // Built by the binary's native filter types (a `FilterSource`), under this name.
        FilterType::Native => Ok(Vec::new()),
        FilterType::Reroute => one(Arc::new(Reroute {
            cluster: f
                .cluster
                .as_deref()
                .map(|name| {
                    clusters
                        .get(name)
                        .map(|c| c.clone() as Arc<dyn ClusterHandle>)
                        .ok_or_else(|| format!("unknown cluster {name:?}"))
                })
                .transpose()?,
            path: f.path.clone(),
            host: f.host.as_deref().map(value).transpose()?,
        })),
    }
}

fn status(s: u16) -> Result<StatusCode, String> {
    StatusCode::from_u16(s).map_err(|e| format!("status {s}: {e}"))
}
fn value(v: &str) -> Result<HeaderValue, String> {
    HeaderValue::from_str(v).map_err(|e| format!("{v:?}: {e}"))
}
fn name(n: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(n.as_bytes()).map_err(|e| format!("{n:?}: {e}"))
}
fn nets(list: &[String]) -> Result<Vec<IpNet>, String> {
    list.iter()
        .map(|s| {
            let t = s.trim();
            t.parse::<IpNet>()
                .or_else(|_| t.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| format!("{s:?} is not an IP address or CIDR block"))
        })
        .collect()
}

/// A plain-text answer from a filter.
pub(super) fn deny(ctx: &mut FilterCtx<'_>, status: StatusCode, mut headers: HeaderMap) {
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    let text = format!(
        "{} {}\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    );
    ctx.respond(status, headers, text);
}

/// headers, on the request (every stage but `post`).
struct RequestHeaders(HeaderEdits);

/// headers, `post`: edits of the response head.
struct ResponseHeaders(HeaderEdits);

/// headers, `post`, appending only fields a wire-form head may take: their compiled
/// `name: value\r\n` lines go in as they are ([`HeaderEdits::compiled_adds`]).
struct ResponseLines(HeaderEdits);

/// Whether a `post` headers filter only appends fields [`keymaster_http::headers::RawHead::may_append`]
/// allows.
fn appends_lines(edits: &HeaderEdits) -> bool {
    edits.remove.is_empty()
        && edits.set.is_empty()
        && edits
            .add
            .iter()
            .all(|(n, _)| keymaster_http::headers::RawHead::may_append(n))
}

impl Filter for RequestHeaders {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx<'_>) -> FilterFuture<'a> {
        ctx.edit_request_headers(&self.0);
        done(Ok(()))
    }

    fn needs(&self) -> Needs {
        (Needs::SYNCHRONOUS | Needs::REQUEST_LINE)
            .with_if(Needs::REQUEST_HEADERS, !self.0.remove.is_empty())
    }
}

impl Filter for ResponseHeaders {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx<'_>) -> FilterFuture<'a> {
        let e = &self.0;
        if e.remove.is_empty() && e.set.is_empty() {
            // Only appends: the origin's head may stay in wire form.
            for (n, v) in &e.add {
                ctx.append_response_field(n, v);
            }
        } else if let Some(h) = ctx.response_headers_mut() {
            e.apply(h);
        }
        done(Ok(()))
    }

    fn needs(&self) -> Needs {
        Needs::SYNCHRONOUS
    }
}

impl Filter for ResponseLines {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx<'_>) -> FilterFuture<'a> {
        for f in self.0.compiled_adds() {
            ctx.append_response_line(f);
        }
        done(Ok(()))
    }

    fn needs(&self) -> Needs {
        Needs::SYNCHRONOUS
    }
}

/// redirect and static: answer with a fixed response.
struct Fixed {
    status: StatusCode,
    headers: HeaderMap,
    body: bytes::Bytes,
}

impl Filter for Fixed {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx<'_>) -> FilterFuture<'a> {
        ctx.respond(self.status, self.headers.clone(), self.body.clone());
        done(Ok(()))
    }

    fn needs(&self) -> Needs {
        Needs::SYNCHRONOUS
    }
}

struct Cors {
    any_origin: bool,
    origins: Vec<String>,
    methods: HeaderValue,
    headers: Option<HeaderValue>,
    credentials: bool,
    max_age: Option<HeaderValue>,
}

impl Cors {
    /// The request's Origin if it is allowed.
    fn allowed_origin<'a>(&self, req: &'a HeaderMap) -> Option<&'a HeaderValue> {
        let o = req.get(header::ORIGIN)?;
        let s = o.to_str().ok()?;
        (self.any_origin || self.origins.iter().any(|a| a.eq_ignore_ascii_case(s))).then_some(o)
    }

    fn stamp(&self, origin: &HeaderValue, h: &mut HeaderMap) {
        let allow = if self.any_origin && !self.credentials {
            HeaderValue::from_static("*")
        } else {
            origin.clone()
        };
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        if self.credentials {
            h.insert(
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
        if !self.any_origin || self.credentials {
            h.append(header::VARY, HeaderValue::from_static("Origin"));
        }
    }
}

/// Where the pre half leaves an allowed Origin for the post half.
const CORS_ORIGIN: &str = "keymaster.cors.origin";

/// Answers preflights; notes an allowed Origin of other requests for the post half.
struct CorsPre(Arc<Cors>);

impl Filter for CorsPre {
    fn should_filter(&self, ctx: &FilterCtx<'_>) -> bool {
        ctx.request_headers().contains_key(header::ORIGIN)
    }
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx<'_>) -> FilterFuture<'a> {
        let c = &self.0;
        let allowed = c.allowed_origin(ctx.request_headers()).cloned();
        let preflight = ctx.method() == Method::OPTIONS
            && ctx
                .request_headers()
                .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
        if !preflight {
            if let Some(o) = allowed.as_ref().and_then(|o| o.to_str().ok()) {
                let o = o.to_string();
                ctx.meta_mut().insert(CORS_ORIGIN.into(), o);
            }
            return done(Ok(()));
        }
        let Some(origin) = allowed else {
            deny(ctx, StatusCode::FORBIDDEN, HeaderMap::new());
            return done(Ok(()));
        };
        let mut h = HeaderMap::new();
        c.stamp(&origin, &mut h);
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, c.methods.clone());
        let allow_headers = c.headers.clone().or_else(|| {
            ctx.request_headers()
                .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
                .cloned()
        });
        if let Some(v) = allow_headers {
            h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, v);
        }
        if let Some(v) = &c.max_age {
            h.insert(header::ACCESS_CONTROL_MAX_AGE, v.clone());
        }
        ctx.respond(StatusCode::NO_CONTENT, h, bytes::Bytes::new());
        done(Ok(()))
    }

    fn needs(&self) -> Needs {
        Needs::DEFAULT | Needs::SYNCHRONOUS
    }
}

/// Adds Access-Control-Allow-Origin (and friends) to responses of allowed origins.
struct CorsPost(Arc<Cors>);

impl Filter for CorsPost {
    fn should_filter(&self, ctx: &FilterCtx<'_>) -> bool {
        ctx.meta().contains_key(CORS_ORIGIN)
    }
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx<'_>) -> FilterFuture<'a> {
        let Some(origin) = ctx
            .meta()
            .get(CORS_ORIGIN)
            .and_then(|o| HeaderValue::from_str(o).ok())
        else {
            return done(Ok(()));
        };
        if let Some(h) = ctx.response_headers_mut() {
            if !h.contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN) {
                self.0.stamp(&origin, h);
            }
        }
        done(Ok(()))
    }

    fn needs(&self) -> Needs {
        Needs::SYNCHRONOUS | Needs::REQUEST_HEADERS
    }
}

struct IpFilter {
    allow: Vec<IpNet>,
    deny: Vec<IpNet>,
}

impl Filter for IpFilter {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx<'_>) -> FilterFuture<'a> {
        let ip = match ctx.client_ip() {
            IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .map(IpAddr::V4)
                .unwrap_or(IpAddr::V6(v6)),
            v4 => v4,
        };
        let denied = self.deny.iter().any(|n| n.contains(&ip))
            || (!self.allow.is_empty() && !self.allow.iter().any(|n| n.contains(&ip)));
        if denied {
            deny(ctx, StatusCode::FORBIDDEN, HeaderMap::new());
        }
        done(Ok(()))
    }

    fn needs(&self) -> Needs {
        Needs::SYNCHRONOUS | Needs::REQUEST_LINE
    }
}

struct ApiKey {
    header: HeaderName,
    keys: Vec<String>,
}

impl Filter for ApiKey {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx<'_>) -> FilterFuture<'a> {
        let ok = ctx
            .request_headers()
            .get(&self.header)
            .map(|v| {
                self.keys
                    .iter()
                    .any(|k| constant_time_eq(k.as_bytes(), v.as_bytes()))
            })
            .unwrap_or(false);
        if !ok {
            deny(ctx, StatusCode::UNAUTHORIZED, HeaderMap::new());
        }
        done(Ok(()))
    }

    fn needs(&self) -> Needs {
        Needs::DEFAULT | Needs::SYNCHRONOUS
    }
}

pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

struct RateLimit {
    name: Arc<str>,
    /// Tokens per second.
    rate: f64,
    burst: f64,
    key: RateLimitKey,
    /// The local buckets: one per key for the process, or one per key in each worker.
    scope: RateLimitScope,
    header: Option<HeaderName>,
    /// `backend = "redis"`: the shared bucket; the local one decides when Redis cannot.
    redis: Option<RedisBackend>,
}

struct Bucket {
    tokens: f64,
    last: Instant,
}

/// Buckets keyed by (filter name, key); a reload keeps them for filters that keep their name.
type Buckets = HashMap<(Arc<str>, String), Bucket>;

/// Most buckets one worker (`scope = "worker"`), or the process, keeps before sweeping the
/// full (idle) ones.
const MAX_BUCKETS: usize = 100_000;

/// Shards of the process-wide buckets: a request locks the one its key hashes to, for the
/// bucket arithmetic only (or, rarely, a sweep of at most `MAX_BUCKETS / SHARDS` entries).
const SHARDS: usize = 64;

/// The process-wide buckets (`scope = "process"`, the default), shared by every worker.
static SHARED: LazyLock<(RandomState, [Mutex<Buckets>; SHARDS])> = LazyLock::new(|| {
    (
        RandomState::new(),
        std::array::from_fn(|_| Mutex::default()),
    )
});

thread_local! {
    /// Per-worker buckets (`scope = "worker"`): no locks.
    static BUCKETS: RefCell<Buckets> = RefCell::new(HashMap::new());
}

impl RateLimit {
    /// Take one token; `Err(seconds)` until the next one when the bucket is empty.
    fn take(&self, key: String, now: Instant) -> Result<(), u64> {
        match self.scope {
            RateLimitScope::Worker => {
                BUCKETS.with(|b| self.take_from(&mut b.borrow_mut(), key, now, MAX_BUCKETS))
            }
            RateLimitScope::Process => {
                let (hasher, shards) = &*SHARED;
                let i = hasher.hash_one((&*self.name, key.as_str())) as usize % SHARDS;
                let mut map = shards[i].lock().unwrap_or_else(|e| e.into_inner());
                self.take_from(&mut map, key, now, MAX_BUCKETS / SHARDS)
            }
        }
    }

    /// The token bucket of `key` in `map` (swept of full buckets when it holds `max`).
    fn take_from(
        &self,
        map: &mut Buckets,
        key: String,
        now: Instant,
        max: usize,
    ) -> Result<(), u64> {
        if map.len() >= max {
            let (rate, burst) = (self.rate, self.burst);
            map.retain(|_, v| {
                v.tokens + now.saturating_duration_since(v.last).as_secs_f64() * rate < burst
            });
        }
        let bucket = map.entry((self.name.clone(), key)).or_insert(Bucket {
            tokens: self.burst,
            last: now,
        });
        let elapsed = now.saturating_duration_since(bucket.last).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.rate).min(self.burst);
        bucket.last = bucket.last.max(now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - bucket.tokens) / self.rate).ceil().max(1.0) as u64)
        }
    }
}

impl Filter for RateLimit {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx<'_>) -> FilterFuture<'a> {
        let key = match self.key {
            RateLimitKey::ClientIp => ctx.client_ip().to_string(),
            RateLimitKey::Route => ctx.route().to_string(),
            RateLimitKey::Header => self
                .header
                .as_ref()
                .and_then(|h| ctx.request_headers().get(h))
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default(),
        };
        let Some(redis) = &self.redis else {
            limited(ctx, self.take(key, Instant::now()));
            return done(Ok(()));
        };
        FilterFuture::new(async move {
            let decision = match redis.take(&self.name, &key, self.rate, self.burst).await {
                Some(d) => d,
                None => self.take(key, Instant::now()),
            };
            limited(ctx, decision);
            Ok(())
        })
    }

    fn needs(&self) -> Needs {
        Needs::DEFAULT.with_if(Needs::SYNCHRONOUS, self.redis.is_none())
    }
}

/// 429 with Retry-After when the bucket said to wait.
fn limited(ctx: &mut FilterCtx<'_>, decision: Result<(), u64>) {
    if let Err(wait) = decision {
        let mut h = HeaderMap::new();
        h.insert(header::RETRY_AFTER, HeaderValue::from(wait));
        deny(ctx, StatusCode::TOO_MANY_REQUESTS, h);
    }
}

struct Reroute {
    /// The cluster of this config version, found when the chain is built: no lookup per
    /// request.
    /// The cluster, as the filter context carries it.
    cluster: Option<Arc<dyn ClusterHandle>>,
    path: Option<String>,
    host: Option<HeaderValue>,
}

impl Reroute {
    /// The upstream path (the request's query kept) and Host, when configured: out of line,
    /// so that choosing a cluster alone stays a small function.
    #[inline(never)]
    fn set_target(&self, ctx: &mut FilterCtx<'_>) {
        if let Some(p) = &self.path {
            let target = match ctx.query() {
                Some(q) => format!("{p}?{q}"),
                None => p.clone(),
            };
            ctx.set_upstream_path(target);
        }
        if let Some(h) = &self.host {
            ctx.set_upstream_host(h.clone());
        }
    }
}

impl Filter for Reroute {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx<'_>) -> FilterFuture<'a> {
        if let Some(c) = &self.cluster {
            ctx.choose_cluster(c.clone());
        }
        if self.path.is_some() || self.host.is_some() {
            self.set_target(ctx);
        }
        done(Ok(()))
    }

    fn needs(&self) -> Needs {
        Needs::SYNCHRONOUS | Needs::REQUEST_LINE
    }
}

/// What a `reroute` filter hands the proxy stage (`proxy::filters::handoff` downcasts it).
impl ClusterHandle for crate::upstream::Cluster {
    fn name(&self) -> &str {
        &self.config.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(name: &str, rate: f64, burst: f64) -> RateLimit {
        RateLimit {
            name: name.into(),
            rate,
            burst,
            key: RateLimitKey::ClientIp,
            scope: RateLimitScope::Process,
            header: None,
            redis: None,
        }
    }

    #[test]
    fn token_bucket_refills_at_the_rate() {
        let rl = limiter("unit-a", 2.0, 3.0); // 2 tokens/s, bucket 3
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(rl.take("k".into(), t0), Ok(()));
        }
        assert_eq!(
            rl.take("k".into(), t0),
            Err(1),
            "empty: next token in 0.5 s → 1 s"
        );
        assert_eq!(
            rl.take("other".into(), t0),
            Ok(()),
            "keys have their own buckets"
        );
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(rl.take("k".into(), t1), Ok(()));
        assert!(rl.take("k".into(), t1).is_err());
        // Refill is capped at the burst.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(rl.take("k".into(), t2), Ok(()));
        }
        assert!(rl.take("k".into(), t2).is_err());
    }

    /// Tokens taken by 4 threads at once from a limiter of burst 5 (no refill to speak of).
    fn taken_by_threads(rl: RateLimit) -> usize {
        let rl = Arc::new(rl);
        let start = Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (rl, start) = (rl.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    let now = Instant::now();
                    (0..10).filter(|_| rl.take("k".into(), now).is_ok()).count()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum()
    }

    #[test]
    fn process_scope_is_one_limit_across_threads_worker_scope_one_each() {
        let rate = 1.0 / 3600.0; // one token an hour: none comes back during the test
        assert_eq!(taken_by_threads(limiter("unit-process", rate, 5.0)), 5);
        let per_worker = RateLimit {
            scope: RateLimitScope::Worker,
            ..limiter("unit-worker", rate, 5.0)
        };
        assert_eq!(taken_by_threads(per_worker), 20);
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        let rl = limiter("unit-b", 1.0 / 90.0, 1.0); // one per 90 s
        let t0 = Instant::now();
        assert_eq!(rl.take("k".into(), t0), Ok(()));
        assert_eq!(rl.take("k".into(), t0), Err(90));
        assert_eq!(rl.take("k".into(), t0 + Duration::from_secs(30)), Err(60));
    }

    #[test]
    fn constant_time_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
