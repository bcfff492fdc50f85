//! Per-cluster protection state, one per cluster name and gateway (kept next to the
//! cluster's metric handles, see `Metrics::cluster`), so that every config version and every
//! worker share it (a reload never resets a cap's count):
//!
//! - requests in flight ([`Slot`], held from admission until the response body ends), capped
//!   by `limits.max_requests`, with a bounded queue of waiters (`max_pending`) that gives up
//!   after `queue_timeout` → 503 with `Retry-After`;
//! - retries in flight ([`RetryToken`]), capped by the retry budget: at most `percent` of the
//!   active requests, but always `min_retries` (Envoy's retry budget). Only the route
//!   policy's retries take a token: a request that was never sent moves to another server
//!   without one (see `proxy::attempt`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;
use tokio::time::Instant;

use keymaster_config::{ClusterLimits, RetryBudgetConfig};
use keymaster_http::error::{Error, Kind};

/// Every cluster's live counts by cluster name: one per gateway, shared by every config
/// version (a reload keeps the counts of a cluster it keeps).
#[derive(Default)]
pub(crate) struct ClusterStates(
    std::sync::Mutex<std::collections::HashMap<String, Arc<ClusterState>>>,
);

impl ClusterStates {
    /// The counts of cluster `name` (made on first use).
    pub(crate) fn get(&self, name: &str) -> Arc<ClusterState> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(name.to_owned()).or_default().clone()
    }
}

/// Live counts of one cluster (by name).
#[derive(Debug, Default)]
pub(crate) struct ClusterState {
    /// Requests in flight under a cap: one count all workers share, as the cap needs.
    active: AtomicUsize,
    /// Requests in flight while the cluster has no cap, counted in each worker's own
    /// memory (every request writes it twice). A reload that sets a cap counts those still
    /// in flight against it (see `try_acquire`).
    uncapped: crate::metrics::sharded::Gauge,
    /// Where round robin is in the cluster's servers, per worker: kept across the config
    /// versions that rebuild the cluster.
    pub(crate) cursor: crate::metrics::sharded::Cursor,
    pending: AtomicUsize,
    retries: AtomicUsize,
    released: Notify,
    /// Shadow requests (route mirrors) in flight to the cluster.
    mirrored: AtomicUsize,
}

/// One shadow request's place under a mirror's cap; released on drop.
#[derive(Debug)]
pub(crate) struct MirrorSlot(Arc<ClusterState>);

impl Drop for MirrorSlot {
    fn drop(&mut self) {
        self.0.mirrored.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ClusterState {
    /// A place for one more shadow request, unless `max` are in flight.
    pub(crate) fn try_mirror(self: &Arc<Self>, max: usize) -> Option<MirrorSlot> {
        let prev = self.mirrored.fetch_add(1, Ordering::AcqRel);
        if prev >= max {
            self.mirrored.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(MirrorSlot(self.clone()))
    }
}

/// One admitted request; releases its place (and wakes a waiter, under a cap) on drop.
#[derive(Debug)]
pub(crate) enum Slot {
    Uncapped(crate::metrics::sharded::Gauge),
    Capped(Arc<ClusterState>),
}

impl Drop for Slot {
    fn drop(&mut self) {
        match self {
            Slot::Uncapped(count) => count.dec(),
            Slot::Capped(state) => {
                state.active.fetch_sub(1, Ordering::AcqRel);
                state.released.notify_one();
            }
        }
    }
}

/// One retry in flight, counted against the budget until dropped.
#[derive(Debug)]
pub(crate) struct RetryToken(Arc<ClusterState>);

impl Drop for RetryToken {
    fn drop(&mut self) {
        self.0.retries.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Leaves the queue on drop.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Add one to `n` unless it is at `max` (0 = no cap).
fn bounded_inc(n: &AtomicUsize, max: usize) -> bool {
    if max == 0 {
        n.fetch_add(1, Ordering::AcqRel);
        return true;
    }
    n.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
        (c < max).then_some(c + 1)
    })
    .is_ok()
}

impl ClusterState {
    /// Requests in flight to the cluster.
    pub(crate) fn active(&self) -> usize {
        self.active.load(Ordering::Acquire) + self.uncapped_in_flight()
    }

    /// Requests admitted while the cluster had no cap, still in flight.
    fn uncapped_in_flight(&self) -> usize {
        usize::try_from(self.uncapped.get()).unwrap_or(0)
    }
    /// Requests waiting for a slot.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    fn try_acquire(self: &Arc<Self>, max: usize) -> Option<Slot> {
        if max == 0 {
            self.uncapped.inc();
            return Some(Slot::Uncapped(self.uncapped.clone()));
        }
        // Requests admitted before a reload set the cap take their places under it (a sum
        // over the workers' cells, only for capped clusters).
        let room = max.saturating_sub(self.uncapped_in_flight());
        (room > 0 && bounded_inc(&self.active, room)).then(|| Slot::Capped(self.clone()))
    }

    /// Admit a request: a slot at once, else a place in the queue until one frees up, the
    /// queue timeout, or the request deadline; else a 503 with `Retry-After`.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        limits: &ClusterLimits,
        deadline: Option<Instant>,
    ) -> Result<Slot, Error> {
        if let Some(slot) = self.try_acquire(limits.max_requests) {
            return Ok(slot);
        }
        let full = |detail| {
            Error::new(Kind::ClusterFull, detail).with_retry_after(limits.retry_after.get())
        };
        if limits.max_pending == 0 || !bounded_inc(&self.pending, limits.max_pending) {
            return Err(full("the cluster is at its request cap"));
        }
        let _waiting = Waiting(&self.pending);
        let mut until = Instant::now() + limits.queue_timeout.get();
        if let Some(d) = deadline {
            until = until.min(d);
        }
        loop {
            let notified = self.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(slot) = self.try_acquire(limits.max_requests) {
                return Ok(slot);
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                return Err(full("no request slot freed up within the queue timeout"));
            }
        }
    }

    /// A retry may start if the budget allows one more.
    pub(crate) fn try_retry(self: &Arc<Self>, budget: &RetryBudgetConfig) -> Option<RetryToken> {
        let share = self.active() * budget.percent as usize / 100;
        let allowed = share.max(budget.min_retries as usize);
        if allowed == 0 {
            return None;
        }
        bounded_inc(&self.retries, allowed).then(|| RetryToken(self.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keymaster_config::Duration;
    use std::time::Duration as StdDuration;

    fn limits(max: usize, pending: usize) -> ClusterLimits {
        ClusterLimits {
            max_requests: max,
            max_pending: pending,
            queue_timeout: Duration::from_secs(1),
            retry_after: Duration::from_millis(1500),
        }
    }

    /// A reload that sets a cap while requests admitted without one are in flight: they
    /// take their places under it.
    #[tokio::test(start_paused = true)]
    async fn a_cap_set_later_counts_the_requests_admitted_without_one() {
        let c = Arc::new(ClusterState::default());
        let free = limits(0, 0);
        let a = c.admit(&free, None).await.unwrap();
        let b = c.admit(&free, None).await.unwrap();
        assert_eq!(c.active(), 2);
        let capped = limits(3, 0);
        let third = c.admit(&capped, None).await.expect("room for one more");
        assert!(
            c.admit(&capped, None).await.is_err(),
            "the uncapped two count"
        );
        drop(a);
        let fourth = c.admit(&capped, None).await.expect("a place freed");
        assert_eq!(c.active(), 3);
        drop((b, third, fourth));
        assert_eq!(c.active(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn cap_queue_and_queue_timeout() {
        let c = Arc::new(ClusterState::default());
        let l = limits(1, 1);
        let first = c.admit(&l, None).await.expect("a free slot");
        // The queue holds one waiter; a second waiter is refused at once.
        let c2 = c.clone();
        let l2 = l.clone();
        let waiter = tokio::spawn(async move { c2.admit(&l2, None).await.map(drop) });
        tokio::task::yield_now().await;
        assert_eq!(c.pending(), 1);
        let refused = c.admit(&l, None).await.expect_err("queue full");
        assert_eq!(refused.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.retry_after(), Some(2));
        // Releasing the slot admits the waiter.
        drop(first);
        waiter.await.unwrap().expect("admitted after the release");
        assert_eq!((c.active(), c.pending()), (0, 0));
        // A waiter gives up at the queue timeout (paused clock: exact).
        let _held = c.admit(&l, None).await.unwrap();
        let start = Instant::now();
        let e = c.admit(&l, None).await.expect_err("times out");
        assert_eq!(start.elapsed(), StdDuration::from_secs(1));
        assert!(e.is_internal());
        assert_eq!(c.pending(), 0);
        // ... or at the request deadline when that comes first.
        let start = Instant::now();
        let d = start + StdDuration::from_millis(300);
        assert!(c.admit(&l, Some(d)).await.is_err());
        assert_eq!(start.elapsed(), StdDuration::from_millis(300));
    }

    #[tokio::test]
    async fn no_queue_refuses_at_once_and_no_cap_counts_only() {
        let c = Arc::new(ClusterState::default());
        let open = limits(0, 0);
        let _a = c.admit(&limits(1, 0), None).await.unwrap();
        assert!(c.admit(&limits(1, 0), None).await.is_err());
        assert_eq!(c.pending(), 0);
        let many: Vec<_> =
            futures_util::future::join_all((0..5).map(|_| c.admit(&open, None))).await;
        assert!(many.iter().all(|r| r.is_ok()));
        assert_eq!(c.active(), 6);
    }

    #[tokio::test]
    async fn retry_budget_is_a_share_of_active_requests_with_a_floor() {
        let c = Arc::new(ClusterState::default());
        let open = limits(0, 0);
        let budget = RetryBudgetConfig {
            percent: 20,
            min_retries: 1,
        };
        // No active requests: the floor allows one.
        let t = c.try_retry(&budget).expect("floor");
        assert!(c.try_retry(&budget).is_none());
        drop(t);
        let slots: Vec<_> =
            futures_util::future::join_all((0..10).map(|_| c.admit(&open, None))).await;
        let tokens: Vec<_> = (0..5).filter_map(|_| c.try_retry(&budget)).collect();
        assert_eq!(tokens.len(), 2, "20% of 10 active");
        drop(tokens);
        drop(slots);
        let none = RetryBudgetConfig {
            percent: 0,
            min_retries: 0,
        };
        assert!(c.try_retry(&none).is_none());
    }
}
