//! What one filter call (`should_filter` or `run`) may spend, and the meter that counts it:
//! VM instructions (`[lua] instruction_budget`) and wall-clock time while the call runs
//! (`[lua] max_call_time`).
//!
//! The meter is a thread-local installed around a synchronous call ([`with_limits`]) and
//! around every poll of a call that may suspend ([`Metered`]), so calls suspended in
//! `ctx.http` each keep their own count, and time spent suspended is not counted. Three kinds
//! of work charge it:
//!
//! - the VM's count hook: [`crate::vm::HOOK_EVERY`] instructions each time it fires;
//! - keymaster's string functions (`crate::strlib`): one instruction per pattern match step,
//!   and one per [`BYTES_PER_INSTRUCTION`] bytes a function scans or produces;
//! - nothing else: work the hook cannot see instruction by instruction (the `..` operator on
//!   huge strings, other C functions of the standard library) is bounded by the clock.
//!
//! **Clock.** Each charge past the first of a poll compares the call's measured time with the
//! limit. The clock starts at the first charge of each poll (no clock is read by a call that
//! charges nothing, the common short call) and stops when the poll ends, so the time one
//! call can take beyond the limit is bounded by one hook interval of work.
//!
//! **Spent.** A spent meter stays spent for the rest of the call: every later charge fails
//! again, and the sandbox's `pcall`/`xpcall` re-raise the error (`spent`), so a script cannot
//! catch it and go on.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::ctx::Lent;

/// The error a spent instruction budget raises.
pub const BUDGET_MSG: &str = "instruction budget exceeded";
/// The error a call past `max_call_time` raises.
pub const TIME_MSG: &str = "call time limit exceeded";
/// Bytes a string function scans or produces per instruction charged.
pub const BYTES_PER_INSTRUCTION: usize = 16;

/// What one call may spend.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Limits {
    pub instructions: u64,
    pub time: Duration,
}

impl Limits {
    /// Instructions only (tests, and callers with no clock limit).
    #[cfg(test)]
    pub(crate) fn instructions(instructions: u64) -> Limits {
        Limits {
            instructions,
            time: Duration::MAX,
        }
    }
}

/// The running call's meter.
#[derive(Clone, Copy)]
struct Meter {
    /// Instructions left.
    left: i64,
    /// When this poll's clock started (at its first charge).
    since: Option<Instant>,
    /// Time measured in the call's earlier polls.
    used: Duration,
    limit: Duration,
    /// Why the meter is spent, once it is.
    spent: Option<&'static str>,
}

impl Meter {
    fn new(limits: Limits) -> Meter {
        Meter {
            left: i64::try_from(limits.instructions).unwrap_or(i64::MAX),
            since: None,
            used: Duration::ZERO,
            limit: limits.time,
            spent: None,
        }
    }

    fn charge(&mut self, n: u64) -> Result<(), &'static str> {
        if let Some(why) = self.spent {
            return Err(why);
        }
        self.left = self
            .left
            .saturating_sub(i64::try_from(n).unwrap_or(i64::MAX));
        if self.left < 0 {
            self.spent = Some(BUDGET_MSG);
        } else {
            let now = Instant::now();
            match self.since {
                None => self.since = Some(now),
                Some(s) if self.used.saturating_add(now - s) > self.limit => {
                    self.spent = Some(TIME_MSG);
                }
                Some(_) => {}
            }
        }
        self.spent.map_or(Ok(()), Err)
    }

    /// End of a poll: the time it measured joins the call's.
    fn stop_clock(&mut self) {
        if let Some(s) = self.since.take() {
            self.used = self.used.saturating_add(s.elapsed());
        }
    }
}

thread_local! {
    /// The meter of the Lua call running on this thread, if any.
    static METER: Cell<Option<Meter>> = const { Cell::new(None) };
}

/// Charge `n` instructions to the running call (none running: nothing to charge). The
/// error is the message to raise: the budget or the clock is spent.
pub(crate) fn charge(n: u64) -> Result<(), &'static str> {
    METER.with(|m| match m.get() {
        None => Ok(()),
        Some(mut meter) => {
            let r = meter.charge(n);
            m.set(Some(meter));
            r
        }
    })
}

/// Charge the work of scanning or producing `bytes` bytes.
pub(crate) fn charge_bytes(bytes: usize) -> Result<(), &'static str> {
    charge((bytes / BYTES_PER_INSTRUCTION) as u64)
}

/// Whether the running call's meter is spent (the sandbox's `pcall` then re-raises).
pub(crate) fn spent() -> bool {
    METER.with(|m| m.get().is_some_and(|meter| meter.spent.is_some()))
}

/// Run `f` (synchronous Lua code) as one call with `limits`.
pub(crate) fn with_limits<R>(limits: Limits, f: impl FnOnce() -> R) -> R {
    let prev = METER.with(|m| m.replace(Some(Meter::new(limits))));
    let r = f();
    METER.with(|m| m.set(prev));
    r
}

/// A Lua call's future that carries its own meter across suspensions: the meter is
/// installed for each poll (its clock stopped when the poll ends) and kept for the next one.
pub(crate) struct Metered<F> {
    inner: Pin<Box<F>>,
    meter: Meter,
    /// The request context lent to this call (installed for each poll like the meter).
    ctx: Lent,
}

impl<F> Metered<F> {
    pub(crate) fn new(inner: F, limits: Limits, ctx: Lent) -> Self {
        Metered {
            inner: Box::pin(inner),
            meter: Meter::new(limits),
            ctx,
        }
    }
}

impl<F: Future> Future for Metered<F> {
    type Output = F::Output;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let prev = METER.with(|m| m.replace(Some(this.meter)));
        let installed = this.ctx.install();
        let r = this.inner.as_mut().poll(cx);
        if let Some(mut meter) = METER.with(|m| m.replace(prev)) {
            meter.stop_clock();
            this.meter = meter;
        }
        drop(installed);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_spent_once_and_stays_spent() {
        with_limits(Limits::instructions(100), || {
            assert_eq!(charge(60), Ok(()));
            assert!(!spent());
            assert_eq!(charge(60), Err(BUDGET_MSG));
            assert!(spent());
            assert_eq!(charge(0), Err(BUDGET_MSG), "stays spent");
        });
        assert!(!spent(), "no call running: nothing is spent");
        assert_eq!(
            charge(u64::MAX),
            Ok(()),
            "no call running: nothing to charge"
        );
    }

    #[test]
    fn the_clock_counts_from_the_first_charge() {
        let limits = Limits {
            instructions: u64::MAX,
            time: Duration::from_millis(200),
        };
        with_limits(limits, || {
            std::thread::sleep(Duration::from_millis(300));
            assert_eq!(charge(1), Ok(()), "the clock starts at the first charge");
            assert_eq!(charge(1), Ok(()));
            std::thread::sleep(Duration::from_millis(250));
            assert_eq!(charge(1), Err(TIME_MSG));
            assert_eq!(charge(1), Err(TIME_MSG), "stays spent");
        });
    }

    #[test]
    fn bytes_are_charged_at_the_documented_rate() {
        with_limits(Limits::instructions(10), || {
            assert_eq!(charge_bytes(10 * BYTES_PER_INSTRUCTION), Ok(()));
            assert_eq!(charge_bytes(BYTES_PER_INSTRUCTION), Err(BUDGET_MSG));
        });
    }
}
