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
//! **Clock.** The clock is read once [`CLOCK_EVERY`] instructions have been charged since it
//! was last read (every count hook; small string operations read no clock). The first read
//! of a poll starts it (a call that charges little, the common short call, reads none); each
//! later one compares the call's measured time with the limit; the poll's end stops it. The
//! time one call can take beyond the limit is therefore bounded by the work of two hook
//! intervals (the one before the clock starts and the one before it is read again).
//!
//! **Spent.** A spent meter stays spent for the rest of the call: every later charge fails
//! again, and the sandbox's `pcall`/`xpcall` re-raise the error (`spent`), so a script cannot
//! catch it and go on.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::ctx::Lent;

/// The error a spent instruction budget raises.
pub const BUDGET_MSG: &str = "instruction budget exceeded";
/// The error a call past `max_call_time` raises.
pub const TIME_MSG: &str = "call time limit exceeded";
/// Bytes a string function scans or produces per instruction charged.
pub const BYTES_PER_INSTRUCTION: usize = 16;
/// The clock is read once this many instructions have been charged since it was last read
/// (each count hook's charge reads it).
pub const CLOCK_EVERY: u64 = crate::vm::HOOK_EVERY as u64;

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

/// Why a meter is spent.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Spent {
    No,
    Budget,
    Time,
}

impl Spent {
    fn message(self) -> Result<(), &'static str> {
        match self {
            Spent::No => Ok(()),
            Spent::Budget => Err(BUDGET_MSG),
            Spent::Time => Err(TIME_MSG),
        }
    }
}

/// The running call's meter: small and plain, as it is installed around every call.
#[derive(Clone, Copy)]
struct Meter {
    /// Instructions left.
    left: i64,
    /// When this poll's clock started, as [`now`] (0: not started).
    since: u64,
    /// Nanoseconds measured in the call's earlier polls.
    used: u64,
    /// The call's time limit in nanoseconds.
    limit: u64,
    /// Instructions charged since the clock was last read.
    unclocked: u32,
    spent: Spent,
}

/// Nanoseconds since the first reading in this process, plus one (never 0).
fn now() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_nanos())
        .unwrap_or(u64::MAX - 1)
        .saturating_add(1)
}

impl Meter {
    fn new(limits: Limits) -> Meter {
        Meter {
            left: i64::try_from(limits.instructions).unwrap_or(i64::MAX),
            since: 0,
            used: 0,
            limit: u64::try_from(limits.time.as_nanos()).unwrap_or(u64::MAX),
            unclocked: 0,
            spent: Spent::No,
        }
    }

    fn charge(&mut self, n: u64) -> Result<(), &'static str> {
        if self.spent != Spent::No {
            return self.spent.message();
        }
        self.left = self
            .left
            .saturating_sub(i64::try_from(n).unwrap_or(i64::MAX));
        self.unclocked = self
            .unclocked
            .saturating_add(u32::try_from(n).unwrap_or(u32::MAX));
        if self.left < 0 {
            self.spent = Spent::Budget;
        } else if u64::from(self.unclocked) >= CLOCK_EVERY {
            self.unclocked = 0;
            let t = now();
            if self.since == 0 {
                self.since = t;
            } else if self.used.saturating_add(t - self.since) > self.limit {
                self.spent = Spent::Time;
            }
        }
        self.spent.message()
    }

    /// End of a poll: the time it measured joins the call's.
    fn stop_clock(&mut self) {
        if self.since != 0 {
            self.used = self.used.saturating_add(now() - self.since);
            self.since = 0;
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
    METER.with(|m| m.get().is_some_and(|meter| meter.spent != Spent::No))
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
    fn the_clock_counts_from_its_first_reading() {
        let limits = Limits {
            instructions: u64::MAX,
            time: Duration::from_millis(200),
        };
        with_limits(limits, || {
            std::thread::sleep(Duration::from_millis(300));
            assert_eq!(charge(CLOCK_EVERY), Ok(()), "the clock starts here");
            assert_eq!(charge(CLOCK_EVERY), Ok(()));
            std::thread::sleep(Duration::from_millis(250));
            assert_eq!(charge(1), Ok(()), "too little charged to read the clock");
            assert_eq!(charge(CLOCK_EVERY), Err(TIME_MSG));
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
