//! The Redis backend of the `rate_limit` filter (`backend = "redis"`): one token bucket per
//! (filter name, key) shared by every keymaster instance that uses the same `[redis]` server.
//!
//! This module owns the bucket script, the per-worker Redis connection and the circuit
//! breaker around it:
//!
//! - The bucket is refilled and taken from atomically inside Redis by a Lua script
//!   (`EVALSHA`, loaded on first use), timed by Redis' own clock so instances with skewed
//!   clocks agree.
//! - Each worker thread keeps one multiplexed connection per Redis URL (a thread-local: no
//!   lock and no cross-thread wakeup on the request path); it is opened on first use.
//! - Every call, connecting included, is bounded by `[redis] timeout`. A failed or slow call
//!   opens the breaker for `[redis] backoff`: meanwhile the filter's local per-worker bucket
//!   decides (the caller falls back when [`RedisBackend::take`] says `None`). When the
//!   backoff has passed one request probes Redis while the others keep deciding locally.
//!   No request fails because Redis failed.
//!
//! `keymaster_rate_limit_redis_total{filter, result}` counts decisions made by Redis
//! (`ok`) and by the local fallback (`fallback`).

use prometheus::IntCounter;
use redis::aio::MultiplexedConnection;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use crate::metrics::Metrics;
use keymaster_config::RedisConfig;

/// KEYS[1] = bucket; ARGV = rate (tokens/s), burst. Returns {allowed 0/1, seconds to wait}.
/// The bucket is a hash (tokens, last refill in µs of Redis' clock) that expires once it
/// would be full again, so idle keys do not accumulate.
const BUCKET_LUA: &str = r#"
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'last')
local tokens = tonumber(b[1])
local last = tonumber(b[2])
if tokens == nil or last == nil then
  tokens = burst
  last = now
end
local elapsed = math.max(0, now - last) / 1000000
tokens = math.min(burst, tokens + elapsed * rate)
local allowed = 0
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
else
  wait = math.max(1, math.ceil((1 - tokens) / rate))
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens), 'last', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return {allowed, wait}
"#;

static BUCKET_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(BUCKET_LUA));

/// A rate_limit filter's view of the shared Redis (one per compiled filter; `Send + Sync`).
pub(super) struct RedisBackend {
    url: Arc<str>,
    /// The URL without credentials, for logs.
    shown: String,
    client: redis::Client,
    timeout: Duration,
    backoff: Duration,
    prefix: String,
    ok: IntCounter,
    fallback: IntCounter,
}

impl RedisBackend {
    /// For the filter `name`; `Err` when the `[redis]` table has no usable URL.
    pub(super) fn new(
        name: &str,
        config: &RedisConfig,
        metrics: &Metrics,
    ) -> Result<RedisBackend, String> {
        let url = config
            .url
            .as_deref()
            .ok_or("backend = \"redis\" needs [redis] url")?;
        let client = redis::Client::open(url).map_err(|e| {
            format!(
                "[redis] url {:?}: {e}",
                keymaster_config::url_without_credentials(url)
            )
        })?;
        let (ok, fallback) = metrics.rate_limit_redis(name);
        Ok(RedisBackend {
            shown: keymaster_config::url_without_credentials(url),
            url: url.into(),
            client,
            timeout: config.timeout.get(),
            backoff: config.backoff.get(),
            prefix: config.key_prefix.clone(),
            ok,
            fallback,
        })
    }

    /// Take one token from the shared bucket of (`filter`, `key`): `Some(Ok(()))` allowed,
    /// `Some(Err(seconds))` limited, `None` when Redis could not answer in time (or is
    /// backed off): the caller's local bucket decides.
    pub(super) async fn take(
        &self,
        filter: &str,
        key: &str,
        rate: f64,
        burst: f64,
    ) -> Option<Result<(), u64>> {
        let link = self.link();
        let now = Instant::now();
        if let Some(until) = link.open_until.get() {
            if now < until {
                self.fallback.inc();
                return None;
            }
            // Half-open: this request probes; the others decide locally meanwhile.
            link.open_until.set(Some(now + self.timeout));
        }
        let bucket = format!("{}{filter}:{key}", self.prefix);
        let failure = match tokio::time::timeout(self.timeout, link.call(&bucket, rate, burst))
            .await
        {
            Ok(Ok((allowed, wait))) => {
                if link.tripped.replace(false) {
                    tracing::info!(redis = %self.shown, "Redis answers again: shared rate limits are back");
                }
                link.open_until.set(None);
                self.ok.inc();
                return Some(if allowed == 1 {
                    Ok(())
                } else {
                    Err(wait.max(1) as u64)
                });
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {:?}", self.timeout),
        };
        // Drop the connection (a fresh one is opened after the backoff) and back off.
        link.conn.borrow_mut().take();
        link.open_until.set(Some(Instant::now() + self.backoff));
        if !link.tripped.replace(true) {
            tracing::warn!(
                redis = %self.shown,
                error = %failure,
                backoff = ?self.backoff,
                "Redis rate limit call failed: local buckets decide until Redis answers again"
            );
        }
        self.fallback.inc();
        None
    }

    /// This worker's link to the URL (created on first use; a new URL, after a reload that
    /// changed `[redis] url`, closes the links to the others).
    fn link(&self) -> Rc<Link> {
        LINKS.with(|links| {
            let mut links = links.borrow_mut();
            if !links.contains_key(&self.url) {
                links.clear();
            }
            links
                .entry(self.url.clone())
                .or_insert_with(|| {
                    Rc::new(Link {
                        client: self.client.clone(),
                        conn: RefCell::new(None),
                        connecting: tokio::sync::Mutex::new(()),
                        open_until: Cell::new(None),
                        tripped: Cell::new(false),
                    })
                })
                .clone()
        })
    }
}

/// One worker's connection to one Redis URL, and its breaker.
struct Link {
    client: redis::Client,
    conn: RefCell<Option<MultiplexedConnection>>,
    /// Requests of this worker wait for one connect instead of each opening their own.
    connecting: tokio::sync::Mutex<()>,
    /// Breaker open (Redis left alone) until then.
    open_until: Cell<Option<Instant>>,
    /// The last call failed (a warning was logged; an info line is logged on recovery).
    tripped: Cell<bool>,
}

thread_local! {
    /// Per-worker links keyed by URL: a reload that keeps the URL keeps the connection.
    static LINKS: RefCell<HashMap<Arc<str>, Rc<Link>>> = RefCell::new(HashMap::new());
}

impl Link {
    async fn call(&self, bucket: &str, rate: f64, burst: f64) -> redis::RedisResult<(i64, i64)> {
        let mut conn = self.connection().await?;
        BUCKET_SCRIPT
            .key(bucket)
            .arg(rate)
            .arg(burst)
            .invoke_async(&mut conn)
            .await
    }

    async fn connection(&self) -> redis::RedisResult<MultiplexedConnection> {
        let cached = self.conn.borrow().clone();
        if let Some(c) = cached {
            return Ok(c);
        }
        let _one_at_a_time = self.connecting.lock().await;
        let cached = self.conn.borrow().clone();
        if let Some(c) = cached {
            return Ok(c);
        }
        let c = self.client.get_multiplexed_async_connection().await?;
        *self.conn.borrow_mut() = Some(c.clone());
        Ok(c)
    }
}
