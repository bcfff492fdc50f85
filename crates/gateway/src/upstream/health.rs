//! Origin server health: the per-server state (atomics on the process-wide
//! [`OriginState`](super::OriginState), so it survives reloads and every worker sees it),
//! passive outlier ejection fed by real traffic, the verdicts of active checks
//! ([`super::checker`] runs them), and health-aware server choice ([`Cluster::choose`]).
//!
//! A server is *available* when the active checks call it healthy (or there are none) and it
//! is not ejected. Passive ejection follows `consecutive_failures` failed requests, or one
//! refused connection (fast ejection: nothing listens there, so the server is down; other
//! connect failures may be the network's or keymaster's own). Ejection lasts
//! `base_ejection × 2^(ejections so far)`, capped at `max_ejection`; the multiplier is
//! forgotten once the server has served successfully for `max_ejection` after its last
//! ejection ended. At most `max_ejected_percent` of a cluster is ejected at once (one server
//! always may be). Passing active checks (`healthy_threshold` in a row) also end an ejection
//! early.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::{Cluster, OriginServer};
use keymaster_config::{AllUnhealthy, HealthCheckConfig, OutlierConfig};
use keymaster_http::error::{Error, Kind};

/// Milliseconds since the process's health clock started (never 0 after the first call).
pub(crate) fn now_ms() -> u64 {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(std::time::Instant::now);
    epoch.elapsed().as_millis() as u64 + 1
}

/// Health of one origin identity.
#[derive(Debug)]
pub struct HealthState {
    /// The active checks' verdict (true when there are no checks).
    active_healthy: AtomicBool,
    check_passes: AtomicU32,
    check_failures: AtomicU32,
    /// Passive: failures of real requests in a row.
    consecutive_failures: AtomicU32,
    /// Ejected until this `now_ms` (0 = never ejected).
    ejected_until: AtomicU64,
    /// Ejections so far (the back-off exponent).
    ejections: AtomicU32,
}

impl Default for HealthState {
    fn default() -> Self {
        HealthState {
            active_healthy: AtomicBool::new(true),
            check_passes: AtomicU32::new(0),
            check_failures: AtomicU32::new(0),
            consecutive_failures: AtomicU32::new(0),
            ejected_until: AtomicU64::new(0),
            ejections: AtomicU32::new(0),
        }
    }
}

/// A snapshot of one server's health, for the admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HealthView {
    pub(crate) active_healthy: bool,
    pub(crate) ejected_for_ms: u64,
    pub(crate) ejections: u32,
    pub(crate) consecutive_failures: u32,
}

impl HealthState {
    /// Healthy by the active checks and not ejected.
    pub(crate) fn available(&self) -> bool {
        self.active_healthy.load(Ordering::Relaxed) && !self.is_ejected_at_lazy()
    }

    fn is_ejected_at_lazy(&self) -> bool {
        let until = self.ejected_until.load(Ordering::Relaxed);
        until != 0 && until > now_ms()
    }

    pub(crate) fn is_ejected(&self, now: u64) -> bool {
        self.ejected_until.load(Ordering::Relaxed) > now
    }

    pub(crate) fn view(&self, now: u64) -> HealthView {
        HealthView {
            active_healthy: self.active_healthy.load(Ordering::Relaxed),
            ejected_for_ms: self
                .ejected_until
                .load(Ordering::Relaxed)
                .saturating_sub(now),
            ejections: self.ejections.load(Ordering::Relaxed),
            consecutive_failures: self.consecutive_failures.load(Ordering::Relaxed),
        }
    }

    /// A request to this server succeeded (`now` is only read after an ejection).
    pub(crate) fn record_success(&self, cfg: &OutlierConfig, now: impl FnOnce() -> u64) {
        if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
        if self.ejections.load(Ordering::Relaxed) != 0 {
            let until = self.ejected_until.load(Ordering::Relaxed);
            if now() >= until.saturating_add(cfg.max_ejection.get().as_millis() as u64) {
                self.ejections.store(0, Ordering::Relaxed);
            }
        }
    }

    /// A request to this server failed (5xx, connect failure, reset, timeout). Returns the
    /// ejection time when this failure ejected the server. `ejected_peers` is how many other
    /// servers of the cluster (of `cluster_size`) are ejected now.
    pub(crate) fn record_failure(
        &self,
        cfg: &OutlierConfig,
        now: u64,
        ejected_peers: impl FnOnce() -> usize,
        cluster_size: usize,
    ) -> Option<u64> {
        let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if cfg.consecutive_failures == 0 || n < cfg.consecutive_failures || self.is_ejected(now) {
            return None;
        }
        if !share_allows(cfg, ejected_peers(), cluster_size) {
            return None;
        }
        // Another worker may have taken the same decision: only the one that resets wins.
        if self.consecutive_failures.swap(0, Ordering::AcqRel) < cfg.consecutive_failures {
            return None;
        }
        let k = self.ejections.fetch_add(1, Ordering::Relaxed);
        let ms = ejection_ms(cfg, k);
        self.check_passes.store(0, Ordering::Relaxed);
        self.ejected_until.store(now + ms, Ordering::Relaxed);
        Some(ms)
    }

    /// A connection to this server was refused: nothing listens on its port, so it is down
    /// (fast ejection). Ejected at once, for the same time a `consecutive_failures` ejection
    /// would last, unless passive ejection is off, it is ejected already, or the cluster's
    /// ejected share is at its cap. Returns the ejection time when this call ejected it (of
    /// several workers refused at the same moment, one ejects).
    pub(crate) fn eject_refused(
        &self,
        cfg: &OutlierConfig,
        now: u64,
        ejected_peers: impl FnOnce() -> usize,
        cluster_size: usize,
    ) -> Option<u64> {
        let until = self.ejected_until.load(Ordering::Relaxed);
        if cfg.consecutive_failures == 0
            || until > now
            || !share_allows(cfg, ejected_peers(), cluster_size)
        {
            return None;
        }
        let ms = ejection_ms(cfg, self.ejections.load(Ordering::Relaxed));
        if self
            .ejected_until
            .compare_exchange(until, now + ms, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return None;
        }
        self.ejections.fetch_add(1, Ordering::Relaxed);
        self.consecutive_failures.store(0, Ordering::Relaxed);
        self.check_passes.store(0, Ordering::Relaxed);
        Some(ms)
    }

    /// One active check's result; returns the new verdict when it changed.
    pub(crate) fn record_check(&self, pass: bool, hc: &HealthCheckConfig) -> Option<bool> {
        if pass {
            self.check_failures.store(0, Ordering::Relaxed);
            let p = self.check_passes.fetch_add(1, Ordering::Relaxed) + 1;
            if p >= hc.healthy_threshold {
                if self.ejected_until.load(Ordering::Relaxed) != 0 {
                    // Recovered by the checks' standard: end any ejection early.
                    self.ejected_until.store(0, Ordering::Relaxed);
                    self.consecutive_failures.store(0, Ordering::Relaxed);
                }
                if !self.active_healthy.swap(true, Ordering::Relaxed) {
                    return Some(true);
                }
            }
        } else {
            self.check_passes.store(0, Ordering::Relaxed);
            let f = self.check_failures.fetch_add(1, Ordering::Relaxed) + 1;
            if f >= hc.unhealthy_threshold && self.active_healthy.swap(false, Ordering::Relaxed) {
                return Some(false);
            }
        }
        None
    }

    /// No active checks configured any more: forget their verdict.
    pub(crate) fn clear_checks(&self) {
        self.active_healthy.store(true, Ordering::Relaxed);
        self.check_passes.store(0, Ordering::Relaxed);
        self.check_failures.store(0, Ordering::Relaxed);
    }
}

/// One more ejection keeps the cluster's ejected share within `max_ejected_percent` (one
/// server may always be ejected). `peers`: other servers ejected now.
fn share_allows(cfg: &OutlierConfig, peers: usize, cluster_size: usize) -> bool {
    peers == 0 || (peers + 1) * 100 <= cluster_size * cfg.max_ejected_percent as usize
}

/// The `k`-th ejection's length (k = 0 for the first): doubling from the base, capped.
pub(crate) fn ejection_ms(cfg: &OutlierConfig, k: u32) -> u64 {
    let base = cfg.base_ejection.get().as_millis() as u64;
    let max = cfg.max_ejection.get().as_millis() as u64;
    base.saturating_mul(1u64 << k.min(32)).min(max)
}

impl Cluster {
    /// Choose a server for an attempt: an available server the request has not tried
    /// (`tried` holds origin ids), else an available one already tried; when none is
    /// available the cluster fails open (any server) or closed (503). A hash cluster
    /// chooses by the request's `key` ([`Cluster::choose_hashed`]).
    pub(crate) fn choose(
        &self,
        tried: &[usize],
        key: Option<u64>,
    ) -> Result<&Arc<OriginServer>, Error> {
        if let Some(h) = self.hashing.as_deref() {
            match key {
                Some(key) => return self.choose_hashed(h, key, tried),
                None => h.metrics.unkeyed.inc(),
            }
        }
        let fresh = |s: &OriginServer| !tried.contains(&s.state.id);
        for _ in 0..3 {
            let s = self.pick();
            if fresh(s) && s.state.health.available() {
                return Ok(s);
            }
        }
        let n = self.servers.len();
        let start = fastrand::usize(..n);
        let ring = || (0..n).map(|i| &self.servers[(start + i) % n]);
        if let Some(s) = ring().find(|s| fresh(s) && s.state.health.available()) {
            return Ok(s);
        }
        if let Some(s) = ring().find(|s| s.state.health.available()) {
            return Ok(s);
        }
        match self.config.all_unhealthy {
            AllUnhealthy::FailOpen => Ok(ring().find(|s| fresh(s)).unwrap_or_else(|| self.pick())),
            AllUnhealthy::FailClosed => Err(Error::new(
                Kind::NoHealthyOrigin,
                "no healthy server in the cluster",
            )),
        }
    }

    /// Feed one attempt's outcome to passive outlier detection.
    pub(crate) fn record_outcome(&self, server: &OriginServer, success: bool) {
        let cfg = &self.config.outlier_detection;
        let h = &server.state.health;
        if success {
            h.record_success(cfg, now_ms);
            return;
        }
        let now = now_ms();
        let peers = || self.ejected_peers(server, now);
        if let Some(ms) = h.record_failure(cfg, now, peers, self.servers.len()) {
            self.metrics.ejections.inc();
            tracing::warn!(
                cluster = %self.config.name,
                server = %server.label,
                ejected_ms = ms,
                "origin server ejected after consecutive failures"
            );
        }
    }

    /// Feed a failed try to passive outlier detection: a refused connection ejects the
    /// server at once, another failure of the origin's counts toward `consecutive_failures`;
    /// keymaster's own failures and the client's do not count.
    pub(crate) fn record_failure(&self, server: &OriginServer, err: &Error) {
        if err.is_refused() {
            self.record_refused(server);
        } else if err.is_origin() {
            self.record_outcome(server, false);
        }
    }

    /// A connection to `server` was refused: eject it at once (fast ejection) so that the
    /// requests choosing it stop within one round trip. When it may not be ejected (see
    /// [`HealthState::eject_refused`]) the refusal counts as one failure.
    fn record_refused(&self, server: &OriginServer) {
        let cfg = &self.config.outlier_detection;
        let now = now_ms();
        let peers = || self.ejected_peers(server, now);
        let Some(ms) = server
            .state
            .health
            .eject_refused(cfg, now, peers, self.servers.len())
        else {
            return self.record_outcome(server, false);
        };
        self.metrics.ejections.inc();
        self.metrics.fast_ejections.inc();
        tracing::warn!(
            cluster = %self.config.name,
            server = %server.label,
            ejected_ms = ms,
            "origin server ejected: it refused a connection"
        );
    }

    /// Servers of the cluster other than `server` ejected at `now`.
    fn ejected_peers(&self, server: &OriginServer, now: u64) -> usize {
        self.servers
            .iter()
            .filter(|s| s.state.id != server.state.id && s.state.health.is_ejected(now))
            .count()
    }

    /// The cluster's health as JSON (admin `GET /health/clusters`).
    pub(crate) fn health_json(&self) -> serde_json::Value {
        let now = now_ms();
        let servers: Vec<_> = self
            .servers
            .iter()
            .map(|s| {
                let v = s.state.health.view(now);
                serde_json::json!({
                    "address": &*s.label,
                    "available": v.active_healthy && v.ejected_for_ms == 0,
                    "active_healthy": v.active_healthy,
                    "ejected": v.ejected_for_ms > 0,
                    "ejected_for_ms": v.ejected_for_ms,
                    "ejections": v.ejections,
                    "consecutive_failures": v.consecutive_failures,
                })
            })
            .collect();
        serde_json::json!({
            "name": self.config.name,
            "health_checks": self.config.health_check.is_some(),
            "all_unhealthy": match self.config.all_unhealthy {
                AllUnhealthy::FailOpen => "fail_open",
                AllUnhealthy::FailClosed => "fail_closed",
            },
            "active_requests": self.limits.active(),
            "pending_requests": self.limits.pending(),
            "servers": servers,
        })
    }
}

/// Set the per-server availability gauges from the health state (before rendering metrics).
pub(crate) fn export_gauges(metrics: &crate::metrics::Metrics, clusters: &super::Clusters) {
    let gauge = &metrics.upstream_server_healthy;
    let conns = &metrics.servers.connections;
    // Servers a reload removed must not linger.
    gauge.reset();
    conns.reset();
    for c in clusters.values() {
        for s in &c.servers {
            let (cluster, server) = (c.config.name.as_str(), &*s.label);
            gauge
                .with_label_values(&[cluster, server])
                .set(i64::from(s.state.health.available()));
            let open = s.state.open_connections.load(Ordering::Relaxed);
            let idle = s.state.idle_connections.get();
            conns
                .with_label_values(&[cluster, server, "open"])
                .set(open as i64);
            conns
                .with_label_values(&[cluster, server, "idle"])
                .set(idle);
        }
    }
}

/// Every cluster's health (admin `GET /health/clusters`) of config `version`, in the
/// config's order (`order`: the cluster names).
pub(crate) fn clusters_json<'a>(
    version: u64,
    order: impl Iterator<Item = &'a str>,
    clusters: &super::Clusters,
) -> serde_json::Value {
    let clusters: Vec<_> = order
        .filter_map(|name| clusters.get(name))
        .map(|c| c.health_json())
        .collect();
    serde_json::json!({ "version": version, "clusters": clusters })
}

#[cfg(test)]
mod tests {
    use super::*;
    use keymaster_config::Duration;

    fn outlier(n: u32) -> OutlierConfig {
        OutlierConfig {
            consecutive_failures: n,
            base_ejection: Duration::from_millis(100),
            max_ejection: Duration::from_millis(350),
            max_ejected_percent: 50,
        }
    }

    #[test]
    fn ejection_backoff_doubles_to_the_cap() {
        let cfg = outlier(3);
        let got: Vec<u64> = (0..5).map(|k| ejection_ms(&cfg, k)).collect();
        assert_eq!(got, vec![100, 200, 350, 350, 350]);
        assert_eq!(ejection_ms(&cfg, 200), 350);
    }

    #[test]
    fn consecutive_failures_eject_and_success_resets_the_count() {
        let cfg = outlier(3);
        let h = HealthState::default();
        assert_eq!(h.record_failure(&cfg, 10, || 0, 3), None);
        assert_eq!(h.record_failure(&cfg, 10, || 0, 3), None);
        h.record_success(&cfg, || 10);
        assert_eq!(h.record_failure(&cfg, 10, || 0, 3), None);
        assert_eq!(h.record_failure(&cfg, 10, || 0, 3), None);
        assert_eq!(h.record_failure(&cfg, 10, || 0, 3), Some(100));
        assert!(h.is_ejected(109) && !h.is_ejected(110));
        // The second ejection is twice as long.
        for _ in 0..2 {
            assert_eq!(h.record_failure(&cfg, 200, || 0, 3), None);
        }
        assert_eq!(h.record_failure(&cfg, 200, || 0, 3), Some(200));
        // Serving well for max_ejection after the ejection forgets the multiplier.
        h.record_success(&cfg, || 400 + 349);
        assert_eq!(h.view(0).ejections, 2);
        h.record_success(&cfg, || 400 + 350);
        assert_eq!(h.view(0).ejections, 0);
    }

    #[test]
    fn the_ejected_share_is_capped() {
        let cfg = outlier(1);
        // 3 servers, 50%: one more may go while none is ejected, not while one is.
        assert!(HealthState::default()
            .record_failure(&cfg, 1, || 0, 3)
            .is_some());
        assert!(HealthState::default()
            .record_failure(&cfg, 1, || 1, 3)
            .is_none());
        // 4 servers, 50%: a second may go.
        assert!(HealthState::default()
            .record_failure(&cfg, 1, || 1, 4)
            .is_some());
        // Off when consecutive_failures = 0.
        assert!(HealthState::default()
            .record_failure(&outlier(0), 1, || 0, 3)
            .is_none());
    }

    #[test]
    fn a_refusal_ejects_at_once_within_the_same_limits() {
        let cfg = outlier(5);
        let h = HealthState::default();
        h.consecutive_failures.store(2, Ordering::Relaxed);
        assert_eq!(h.eject_refused(&cfg, 10, || 0, 3), Some(100));
        assert!(h.is_ejected(109) && !h.is_ejected(110));
        let v = h.view(0);
        assert_eq!((v.ejections, v.consecutive_failures), (1, 0));
        // Ejected already: nothing changes (another worker's refusal at the same moment).
        assert_eq!(h.eject_refused(&cfg, 50, || 0, 3), None);
        assert!(!h.is_ejected(110));
        // The next one doubles, like any ejection.
        assert_eq!(h.eject_refused(&cfg, 200, || 0, 3), Some(200));
        // The ejected share is capped; passive ejection off turns it off too.
        assert_eq!(HealthState::default().eject_refused(&cfg, 1, || 1, 3), None);
        assert_eq!(
            HealthState::default().eject_refused(&cfg, 1, || 1, 4),
            Some(100)
        );
        assert_eq!(
            HealthState::default().eject_refused(&outlier(0), 1, || 0, 3),
            None
        );
    }

    #[test]
    fn active_checks_flip_on_thresholds_and_end_ejections() {
        let hc = HealthCheckConfig {
            healthy_threshold: 2,
            unhealthy_threshold: 3,
            ..Default::default()
        };
        let h = HealthState::default();
        assert_eq!(h.record_check(false, &hc), None);
        assert_eq!(h.record_check(false, &hc), None);
        assert_eq!(h.record_check(false, &hc), Some(false));
        assert!(!h.available());
        assert_eq!(h.record_check(true, &hc), None);
        assert_eq!(h.record_check(true, &hc), Some(true));
        assert!(h.available());
        // As an ejection leaves it: passes counted afresh.
        h.ejected_until
            .store(now_ms() + 1_000_000, Ordering::Relaxed);
        h.check_passes.store(0, Ordering::Relaxed);
        assert!(!h.available());
        h.record_check(true, &hc);
        assert!(!h.available(), "one pass is below the healthy threshold");
        h.record_check(true, &hc);
        assert!(h.available(), "passing checks end the ejection");
    }
}
