//! A key set fetched from a URL (`jwks`), refreshed by a background thread and published
//! with an `ArcSwap`: requests read the current set without a lock and never wait for a
//! fetch.
//!
//! - One `keymaster-jwks` thread per (gateway, filter, `jwks` table) fetches at once, then
//!   every `refresh`. A request with an unknown `kid` asks for an early fetch
//!   ([`Jwks::request_refresh`]: a flag and a wakeup); fetches are at least `min_refresh`
//!   apart, so a flood of unknown ids costs one fetch per interval. A failed fetch is
//!   retried after `min_refresh`.
//! - A failed fetch (or a document with no usable key) keeps the last good set, logs a
//!   warning and counts `keymaster_jwks_fetches_total{result}` by why.
//! - A reload (or a discovery update) that keeps the filter's `jwks` table keeps its
//!   [`Jwks`]: the set and the thread carry over. When no filter holds it any more, the
//!   thread ends.
//! - A new source waits up to `timeout` for its first fetch when it is compiled (start or
//!   reload, never a request), so a healthy endpoint's keys are there from the first request.

use arc_swap::ArcSwap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::keys::{parse_jwks, Key};
use crate::fetch::Fetcher;
use crate::metrics::{JwksMetrics, Metrics};
use keymaster_config::JwksConfig;

/// State shared by the filter and its thread.
struct Shared {
    keys: ArcSwap<Vec<Key>>,
    /// A request saw an unknown `kid`: fetch as soon as `min_refresh` allows.
    wanted: AtomicBool,
    stop: AtomicBool,
    wake: Notify,
    /// Set once the first fetch ended (either way).
    first: (Mutex<bool>, Condvar),
}

/// A filter's handle on its key set; the thread ends when the last handle is dropped.
pub(super) struct Jwks {
    shared: Arc<Shared>,
}

impl Drop for Jwks {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.notify_one();
    }
}

/// What identifies a source: the gateway, the filter and its table.
type SourceKey = (u64, String, JwksConfig);

/// Live sources, so a new config version finds the one it already has.
static LIVE: Mutex<Vec<(SourceKey, Weak<Jwks>)>> = Mutex::new(Vec::new());

impl Jwks {
    /// Filter `name`'s source for `config`: the running one, or a new one (which starts its
    /// thread and waits up to `timeout` for the first fetch).
    pub(super) fn get(
        name: &str,
        config: &JwksConfig,
        metrics: &Metrics,
    ) -> Result<Arc<Jwks>, String> {
        let key = (metrics.jwks.owner(), name.to_string(), config.clone());
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|(_, w)| w.strong_count() > 0);
        if let Some(j) = live
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(j);
        }
        let fetcher = Fetcher::new(
            &config.url,
            config.ca.as_deref(),
            config.timeout.get(),
            config.max_size.0,
            "jwks",
        )?
        .header(
            http::header::ACCEPT,
            "application/json, application/jwk-set+json",
        );
        let shared = Arc::new(Shared {
            keys: ArcSwap::from_pointee(Vec::new()),
            wanted: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            wake: Notify::new(),
            first: (Mutex::new(false), Condvar::new()),
        });
        let task = Task {
            shared: shared.clone(),
            fetcher,
            filter: name.to_string(),
            url: keymaster_config::url_without_credentials(&config.url),
            refresh: config.refresh.get(),
            min_refresh: config.min_refresh.get(),
            metrics: metrics.jwks.filter(name),
        };
        crate::runtime_thread::spawn("keymaster-jwks", move || task.run())
            .map_err(|e| format!("cannot start the jwks thread: {e}"))?;
        let jwks = Arc::new(Jwks { shared });
        live.push((key, Arc::downgrade(&jwks)));
        drop(live);
        jwks.wait_first(config.timeout.get() + Duration::from_millis(100));
        Ok(jwks)
    }

    fn wait_first(&self, limit: Duration) {
        let (lock, ready) = &self.shared.first;
        let done = lock.lock().unwrap_or_else(|e| e.into_inner());
        let _ = ready.wait_timeout_while(done, limit, |done| !*done);
    }

    /// The current key set (lock-free).
    pub(super) fn keys(&self) -> arc_swap::Guard<Arc<Vec<Key>>> {
        self.shared.keys.load()
    }

    /// Ask the thread for an early fetch (a token named an unknown `kid`). Never waits;
    /// wakes the thread only when no request is pending already.
    pub(super) fn request_refresh(&self) {
        if !self.shared.wanted.swap(true, Ordering::AcqRel) {
            self.shared.wake.notify_one();
        }
    }
}

/// The thread's side.
struct Task {
    shared: Arc<Shared>,
    fetcher: Fetcher,
    filter: String,
    url: String,
    refresh: Duration,
    min_refresh: Duration,
    metrics: JwksMetrics,
}

impl Task {
    async fn run(self) {
        let mut next = Instant::now();
        let mut last: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = self.shared.wake.notified() => {}
            }
            if self.shared.stop.load(Ordering::Acquire) {
                return;
            }
            let now = Instant::now();
            if now < next && !self.shared.wanted.load(Ordering::Acquire) {
                continue;
            }
            if let Some(earliest) = last.map(|l| l + self.min_refresh).filter(|e| now < *e) {
                next = next.min(earliest);
                continue;
            }
            self.shared.wanted.store(false, Ordering::Release);
            last = Some(now);
            let ok = self.refresh().await;
            next = Instant::now() + if ok { self.refresh } else { self.min_refresh };
            let (lock, ready) = &self.shared.first;
            *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
            ready.notify_all();
        }
    }

    /// One fetch: publish the new set, or keep the last good one. Whether it loaded.
    async fn refresh(&self) -> bool {
        let loaded = match self.fetcher.fetch().await {
            Ok(body) => parse_jwks(&body).map_err(|e| ("invalid", e)),
            Err(e) => Err(e),
        };
        match loaded {
            Ok((keys, skipped)) => {
                self.publish(keys, skipped);
                true
            }
            Err((result, error)) => {
                self.metrics.fetched(result);
                tracing::warn!(
                    filter = %self.filter, url = %self.url, %result, %error,
                    keys_kept = self.shared.keys.load().len(),
                    "JWKS fetch failed; keeping the last good key set"
                );
                false
            }
        }
    }

    fn publish(&self, keys: Vec<Key>, skipped: usize) {
        let kids = |k: &[Key]| -> Vec<String> {
            let mut v: Vec<String> = k.iter().filter_map(|k| k.kid.clone()).collect();
            v.sort();
            v
        };
        let (old, new) = (kids(&self.shared.keys.load()), kids(&keys));
        let count = keys.len();
        self.shared.keys.store(Arc::new(keys));
        self.metrics.fetched("ok");
        self.metrics
            .keys
            .set(i64::try_from(count).unwrap_or(i64::MAX));
        let now = SystemTime::now().duration_since(UNIX_EPOCH);
        self.metrics
            .last_success
            .set(now.map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)));
        if old != new {
            tracing::info!(
                filter = %self.filter, url = %self.url, keys = count, skipped,
                kids = %new.join(","), "JWKS key set loaded"
            );
        }
    }
}
