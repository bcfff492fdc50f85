//! A listener's connection limits (`max_requests_per_connection`, `max_connection_age`):
//! a client connection that reaches one is closed gracefully after the request that reached
//! it, so that load balancers and clients rebalance long-lived connections. The HTTP/1.1
//! server asks [`RetirePolicy::reached`] after each request (the last response then carries
//! `Connection: close`); the HTTP/2 connection counts its streams ([`StreamCount`]) and
//! watches its age ([`Retire`]), then sends GOAWAY.

use std::rc::Rc;
use std::time::Duration;
use tokio::time::Instant;

use crate::metrics::ListenerMetrics;

/// A listener's connection limits: past either, a connection is closed gracefully after the
/// request that reached it (HTTP/1.1: `Connection: close` on its response; HTTP/2: GOAWAY).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetirePolicy {
    /// Requests (streams) per connection; 0 = unlimited.
    pub(crate) max_requests: u64,
    /// The age limit, before each connection's jitter; `None` = off.
    pub(crate) max_age: Option<Duration>,
}

/// Why a connection is being closed gracefully.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retired {
    Requests,
    Age,
}

impl RetirePolicy {
    /// One connection's age limit: between 90% and 100% of the configured one, so that
    /// connections opened together (a client fleet after a deploy) do not all close together.
    pub(crate) fn age_limit(&self) -> Option<Duration> {
        let nanos = |a: Duration| u64::try_from(a.as_nanos()).unwrap_or(u64::MAX);
        self.max_age
            .map(|a| a - Duration::from_nanos(fastrand::u64(..=nanos(a) / 10)))
    }

    /// Whether a connection that served `served` requests, the last of them `age` after it
    /// opened, is done (`age_limit`: its own limit).
    pub(crate) fn reached(
        &self,
        served: u64,
        age: Duration,
        age_limit: Option<Duration>,
    ) -> Option<Retired> {
        if self.max_requests != 0 && served >= self.max_requests {
            Some(Retired::Requests)
        } else if age_limit.is_some_and(|limit| age >= limit) {
            Some(Retired::Age)
        } else {
            None
        }
    }

    /// Count a connection closed for `why`.
    pub(crate) fn count(why: Retired, metrics: &ListenerMetrics) {
        match why {
            Retired::Requests => metrics.retired_requests.inc(),
            Retired::Age => metrics.retired_age.inc(),
        }
    }
}

/// The streams an HTTP/2 connection served, against its listener's
/// `max_requests_per_connection`.
pub(super) struct StreamCount {
    pub(super) served: std::cell::Cell<u64>,
    /// 0: unlimited.
    pub(super) max: u64,
    /// Notified when `served` reaches `max`.
    pub(super) reached: tokio::sync::Notify,
}

impl StreamCount {
    pub(super) fn add(&self) {
        let n = self.served.get() + 1;
        self.served.set(n);
        if n == self.max {
            self.reached.notify_one();
        }
    }
}

/// When an HTTP/2 connection is closed gracefully (besides the worker's drain).
pub(super) struct Retire {
    pub(super) streams: Rc<StreamCount>,
    /// When it reaches its age limit.
    pub(super) aged: Option<Instant>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each connection's age limit lies between 90% and 100% of the configured one; the
    /// request limit counts requests served, the age the latest request's start.
    #[test]
    fn limits_are_reached_by_count_or_jittered_age() {
        let policy = RetirePolicy {
            max_requests: 3,
            max_age: Some(Duration::from_secs(100)),
        };
        for _ in 0..1000 {
            let limit = policy.age_limit().unwrap();
            assert!(limit >= Duration::from_secs(90) && limit <= Duration::from_secs(100));
        }
        let limit = Some(Duration::from_secs(95));
        let at = |s| Duration::from_secs(s);
        assert_eq!(policy.reached(2, at(94), limit), None);
        assert_eq!(policy.reached(3, at(0), limit), Some(Retired::Requests));
        assert_eq!(policy.reached(1, at(95), limit), Some(Retired::Age));
        let off = RetirePolicy {
            max_requests: 0,
            max_age: None,
        };
        assert_eq!(off.age_limit(), None);
        assert_eq!(off.reached(u64::MAX, at(1 << 40), None), None);
    }
}
