//! Load shedding: when the gateway itself is overloaded, requests of lower-priority routes
//! get a 503 (with `Retry-After`) before any work is done for them.
//!
//! Two signals, each compared with its `[load_shedding]` limit as a percentage:
//! - requests in flight in the whole gateway ([`Load`], one atomic per gateway; while
//!   `max_in_flight` is set, each request holds an [`InFlightLoad`] until its response ends);
//! - the event-loop lag of the worker serving the request ([`LoopLag`]: how late a 50 ms
//!   timer fires, measured by a task each worker starts with its first request after
//!   `max_event_loop_lag` is configured; without it no worker wakes up for this).
//!
//! The load is the larger percentage. `low` routes are shed from 80%, `normal` from 100%,
//! `high` never (cluster caps still apply). The admin listener has its own thread and is
//! never shed.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keymaster_config::{LoadSheddingConfig, ShedPriority};
use keymaster_http::error::{Error, Kind};

/// How often each worker samples its event-loop lag.
const LAG_TICK: Duration = Duration::from_millis(50);

/// Requests in flight in one gateway.
#[derive(Debug, Default)]
pub(crate) struct Load {
    in_flight: AtomicUsize,
}

impl Load {
    /// Count a request until the returned guard drops.
    pub(crate) fn enter(self: &Arc<Self>) -> InFlightLoad {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlightLoad(self.clone())
    }
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }
}

/// One request counted in flight.
pub(crate) struct InFlightLoad(Arc<Load>);

impl Drop for InFlightLoad {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A worker's last measured event-loop lag.
#[derive(Debug, Default)]
pub(crate) struct LoopLag(Cell<Duration>, Cell<bool>);

impl LoopLag {
    pub(crate) fn get(&self) -> Duration {
        self.0.get()
    }
}

/// Start measuring the worker's event-loop lag (once) if the config asks for it; the task
/// lives as long as the worker's runtime.
pub(crate) fn ensure_lag_probe(lag: &Rc<LoopLag>, cfg: &LoadSheddingConfig) {
    if cfg.max_event_loop_lag.is_some() && !lag.1.replace(true) {
        let lag = lag.clone();
        tokio::task::spawn_local(async move { sample_lag(&lag).await });
    }
}

async fn sample_lag(lag: &LoopLag) {
    let mut tick = tokio::time::interval(LAG_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let due = tick.tick().await;
        lag.0
            .set(tokio::time::Instant::now().saturating_duration_since(due));
    }
}

/// The load in percent of the configured limits (0 when none is set).
pub(crate) fn load_percent(cfg: &LoadSheddingConfig, in_flight: usize, lag: Duration) -> u64 {
    let by_requests = match cfg.max_in_flight {
        0 => 0,
        max => in_flight as u64 * 100 / max as u64,
    };
    let by_lag = match cfg.max_event_loop_lag {
        Some(max) if !max.get().is_zero() => {
            (lag.as_micros() * 100 / max.get().as_micros().max(1)) as u64
        }
        _ => 0,
    };
    by_requests.max(by_lag)
}

/// The load (percent) from which a priority is shed; `None`: never.
pub(crate) fn shed_from(p: ShedPriority) -> Option<u64> {
    match p {
        ShedPriority::Low => Some(80),
        ShedPriority::Normal => Some(100),
        ShedPriority::High => None,
    }
}

/// Shed the request (a 503) if the gateway is overloaded for its route's priority.
pub(crate) fn check(
    cfg: &LoadSheddingConfig,
    load: &Load,
    lag: &LoopLag,
    priority: ShedPriority,
) -> Result<(), Error> {
    if cfg.max_in_flight == 0 && cfg.max_event_loop_lag.is_none() {
        return Ok(());
    }
    let Some(threshold) = shed_from(priority) else {
        return Ok(());
    };
    if load_percent(cfg, load.in_flight(), lag.get()) >= threshold {
        return Err(Error::new(Kind::Shed, "the gateway is overloaded")
            .with_retry_after(cfg.retry_after.get()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(max: usize, lag_ms: Option<u64>) -> LoadSheddingConfig {
        LoadSheddingConfig {
            max_in_flight: max,
            max_event_loop_lag: lag_ms.map(keymaster_config::Duration::from_millis),
            ..Default::default()
        }
    }

    #[test]
    fn lower_priorities_shed_first() {
        let c = cfg(10, None);
        let load = Arc::new(Load::default());
        let lag = LoopLag::default();
        let mut held: Vec<_> = (0..7).map(|_| load.enter()).collect();
        for p in [ShedPriority::Low, ShedPriority::Normal, ShedPriority::High] {
            assert!(check(&c, &load, &lag, p).is_ok(), "70%: {p:?}");
        }
        held.push(load.enter());
        let e = check(&c, &load, &lag, ShedPriority::Low).expect_err("80%: low shed");
        assert_eq!(e.retry_after(), Some(1));
        assert!(check(&c, &load, &lag, ShedPriority::Normal).is_ok());
        held.extend((0..2).map(|_| load.enter()));
        assert!(
            check(&c, &load, &lag, ShedPriority::Normal).is_err(),
            "100%"
        );
        assert!(check(&c, &load, &lag, ShedPriority::High).is_ok());
        drop(held);
        assert_eq!(load.in_flight(), 0);
    }

    #[test]
    fn lag_counts_like_requests_and_off_means_off() {
        let c = cfg(0, Some(100));
        let load = Load::default();
        let lag = LoopLag::default();
        lag.0.set(Duration::from_millis(85));
        assert!(check(&c, &load, &lag, ShedPriority::Low).is_err());
        assert!(check(&c, &load, &lag, ShedPriority::Normal).is_ok());
        lag.0.set(Duration::from_millis(150));
        assert!(check(&c, &load, &lag, ShedPriority::Normal).is_err());
        assert!(check(&cfg(0, None), &load, &lag, ShedPriority::Low).is_ok());
        assert_eq!(
            load_percent(&cfg(4, Some(100)), 3, Duration::from_millis(10)),
            75
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_timer_shows_as_lag() {
        let lag = Rc::new(LoopLag::default());
        let l = lag.clone();
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async move {
                let probe = tokio::task::spawn_local(async move { sample_lag(&l).await });
                tokio::time::sleep(Duration::from_millis(10)).await;
                assert_eq!(lag.get(), Duration::ZERO);
                // The clock jumps past the next tick before the loop runs again: it is late.
                tokio::time::advance(Duration::from_millis(120)).await;
                tokio::task::yield_now().await;
                assert!(lag.get() >= Duration::from_millis(70), "{:?}", lag.get());
                probe.abort();
            })
            .await;
    }
}
