//! The `jwt` filter's key set fetches (`jwks`): fetches by result, keys loaded and the time
//! of the last good fetch, by filter. Every series exists at zero from the filter's start.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use std::sync::atomic::{AtomicU64, Ordering};

/// What a fetch is counted as.
pub(crate) const FETCH_RESULTS: [&str; 6] =
    ["ok", "error", "timeout", "status", "too_large", "invalid"];

/// The families, by filter.
#[derive(Clone)]
pub(crate) struct JwksFamilies {
    /// Tells the gateways of one process apart (each keeps its own key sets).
    owner: u64,
    fetches: IntCounterVec,
    keys: IntGaugeVec,
    last_success: IntGaugeVec,
}

/// One filter's handles.
#[derive(Clone)]
pub(crate) struct JwksMetrics {
    /// Indexed like [`FETCH_RESULTS`].
    fetches: [IntCounter; 6],
    pub(crate) keys: IntGauge,
    /// Unix seconds of the last fetch that loaded a key set; 0 before the first.
    pub(crate) last_success: IntGauge,
}

impl JwksMetrics {
    /// A fetch ended with `result`, one of [`FETCH_RESULTS`].
    pub(crate) fn fetched(&self, result: &str) {
        if let Some(i) = FETCH_RESULTS.iter().position(|r| *r == result) {
            self.fetches[i].inc();
        }
    }
}

impl JwksFamilies {
    pub(crate) fn register(r: &Registry) -> JwksFamilies {
        static OWNERS: AtomicU64 = AtomicU64::new(0);
        let fetches = IntCounterVec::new(
            Opts::new(
                "jwks_fetches_total",
                "JWKS fetches of a jwt filter by result: ok, error (connect, TLS, I/O), timeout, status (not 200), too_large, invalid (no usable key); a failed fetch keeps the last good key set",
            ),
            &["filter", "result"],
        )
        .expect("valid metric definition");
        let keys = IntGaugeVec::new(
            Opts::new("jwks_keys", "Keys of a jwt filter's JWKS in use"),
            &["filter"],
        )
        .expect("valid metric definition");
        let last_success = IntGaugeVec::new(
            Opts::new(
                "jwks_last_success_timestamp_seconds",
                "When a jwt filter's JWKS was last fetched and loaded, Unix seconds (0: never)",
            ),
            &["filter"],
        )
        .expect("valid metric definition");
        for c in [
            Box::new(fetches.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(keys.clone()),
            Box::new(last_success.clone()),
        ] {
            r.register(c).expect("metric registered once");
        }
        JwksFamilies {
            owner: OWNERS.fetch_add(1, Ordering::Relaxed),
            fetches,
            keys,
            last_success,
        }
    }

    /// Which gateway these families belong to.
    pub(crate) fn owner(&self) -> u64 {
        self.owner
    }

    /// Filter `filter`'s handles; its series exist from here on, at zero.
    pub(crate) fn filter(&self, filter: &str) -> JwksMetrics {
        JwksMetrics {
            fetches: FETCH_RESULTS.map(|r| self.fetches.with_label_values(&[filter, r])),
            keys: self.keys.with_label_values(&[filter]),
            last_success: self.last_success.with_label_values(&[filter]),
        }
    }
}
