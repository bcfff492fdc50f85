//! Counters, gauges and histograms that every worker writes in memory of its own.
//!
//! A Prometheus counter is one atomic: when every worker counts every request in it, its
//! cache line moves from core to core on each request (decision record 0024 measured the
//! request path's shared writes at about 4% of a request's CPU on 8 workers). The series
//! here are kept in per-worker arenas instead: a series is a slot number, every worker
//! thread writes the slot in its own arena (a worker's arena is allocated by that worker,
//! in blocks no other thread writes), and a scrape sums the slot over the arenas.
//!
//! - A thread says which worker it is with [`enter_worker`]; every other thread (admin,
//!   health checks, tests) writes a shared arena. Writes are atomic read-modify-writes
//!   either way, so a count is never lost, whichever thread makes it; the arenas only keep
//!   the writes of different workers off each other's cache lines.
//! - Slots are allocated when a config version resolves its handles, never on the request
//!   path, and never freed (like a Prometheus vector's series). Past their share of
//!   [`CAPACITY`], new series share a junk slot and an error is logged once: metrics go
//!   wrong, nothing else; the counts the gateway acts on keep a reserve of their own.
//! - A family ([`CounterVec`], [`GaugeVec`], [`HistogramVec`]) is a Prometheus
//!   [`Collector`]: registered like any metric, rendered by the same encoder.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};
use prometheus::Registry;

/// Slots in one block of an arena (16 KiB).
const BLOCK: usize = 2048;
/// Blocks an arena can have: [`CAPACITY`] slots in all.
const BLOCKS: usize = 8192;
/// Slots in all, per arena.
pub(crate) const CAPACITY: usize = BLOCK * BLOCKS;
/// Arenas of workers 0..SHARED; the last one is every other thread's.
const SHARED: usize = 64;
/// The first slots, where series go once [`CAPACITY`] is spent.
const JUNK: usize = 64;

/// One block of slots, aligned so that no other allocation shares its first or last line.
#[repr(align(128))]
struct Block([AtomicU64; BLOCK]);

struct Arena {
    blocks: Box<[OnceLock<Box<Block>>; BLOCKS]>,
}

impl Arena {
    fn new() -> Arena {
        let blocks: Box<[_]> = (0..BLOCKS).map(|_| OnceLock::new()).collect();
        Arena {
            blocks: blocks
                .try_into()
                .unwrap_or_else(|_| unreachable!("BLOCKS blocks")),
        }
    }

    /// The block of `slot`, if this arena ever wrote it.
    fn block(&self, slot: usize) -> Option<&Block> {
        self.blocks[(slot / BLOCK) % BLOCKS].get().map(|b| &**b)
    }
}

static ARENAS: [OnceLock<Arena>; SHARED + 1] = [const { OnceLock::new() }; SHARED + 1];
/// The next free slot.
static NEXT: Mutex<usize> = Mutex::new(JUNK);

thread_local! {
    /// Which arena this thread writes.
    static INDEX: Cell<usize> = const { Cell::new(SHARED) };
    /// That arena, once this thread wrote it.
    static ARENA: Cell<Option<&'static Arena>> = const { Cell::new(None) };
}

/// This thread is worker `index`: its writes go to that worker's arena (workers past the
/// 64th share the common one).
pub(crate) fn enter_worker(index: usize) {
    INDEX.with(|i| i.set(index.min(SHARED)));
    ARENA.with(|a| a.set(None));
}

/// The arena this thread writes.
#[inline]
fn arena() -> &'static Arena {
    ARENA.with(|a| a.get().unwrap_or_else(|| first_arena(a)))
}

/// A thread's first write: find its arena and remember it. Out of line and cold, so that
/// the metric writes inlined along the request path do not each carry a copy.
#[cold]
#[inline(never)]
fn first_arena(slot: &Cell<Option<&'static Arena>>) -> &'static Arena {
    let arena = ARENAS[INDEX.with(Cell::get)].get_or_init(Arena::new);
    slot.set(Some(arena));
    arena
}

/// What slots are for.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Use {
    /// A metric series: past its share of the capacity, the junk slots.
    Metric,
    /// A count the gateway acts on (a cluster's requests in flight, a server's idle
    /// connections, a round-robin cursor): the last [`RESERVE`] slots are kept for these.
    Count,
}

/// Slots only counts may take, so that series past the capacity never share a slot with
/// one (about a million clusters and servers).
const RESERVE: usize = 1 << 20;

/// `n` consecutive slots, within one block.
fn alloc(n: usize, what: Use) -> usize {
    assert!(n <= JUNK, "a series takes at most {JUNK} slots");
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    match grant(*next, n, what) {
        Some(slot) => {
            *next = slot + n;
            slot
        }
        None => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::error!(
                    slots = CAPACITY,
                    "metric series exceed the per-worker capacity: new series are not counted"
                );
            });
            0
        }
    }
}

/// Where `n` slots for `what` go when `next` is the first free one, if they fit.
fn grant(next: usize, n: usize, what: Use) -> Option<usize> {
    let end = match what {
        Use::Metric => CAPACITY - RESERVE,
        Use::Count => CAPACITY,
    };
    let slot = place(next, n);
    (slot + n <= end).then_some(slot)
}

/// Where `n` slots go when `next` is the first free one: there, unless they would run past
/// the end of its block; then at the start of the next block.
fn place(next: usize, n: usize) -> usize {
    if next % BLOCK + n > BLOCK {
        next.next_multiple_of(BLOCK)
    } else {
        next
    }
}

/// This thread's cell of `slot`.
#[inline]
fn cell(slot: usize) -> &'static AtomicU64 {
    // Slots are under `CAPACITY`: the modulo is a mask, and spares a bounds check.
    let block = arena().blocks[(slot / BLOCK) % BLOCKS]
        .get_or_init(|| Box::new(Block(std::array::from_fn(|_| AtomicU64::new(0)))));
    &block.0[slot % BLOCK]
}

/// Every arena's value of `slot` (arenas that never wrote its block have none).
fn values(slot: usize) -> impl Iterator<Item = u64> {
    ARENAS
        .iter()
        .filter_map(OnceLock::get)
        .filter_map(move |a| a.block(slot))
        .map(move |b| b.0[slot % BLOCK].load(Relaxed))
}

/// `slot` summed over the arenas (wrapping: a gauge's decrements are added as negatives).
fn sum(slot: usize) -> u64 {
    values(slot).fold(0, u64::wrapping_add)
}

/// A monotonically increasing count.
#[derive(Clone, Debug)]
pub(crate) struct Counter {
    slot: usize,
}

impl Counter {
    #[inline]
    pub(crate) fn inc(&self) {
        self.inc_by(1);
    }

    #[inline]
    pub(crate) fn inc_by(&self, n: u64) {
        cell(self.slot).fetch_add(n, Relaxed);
    }

    /// The count, over every worker.
    #[cfg(test)]
    pub(crate) fn get(&self) -> u64 {
        sum(self.slot)
    }
}

/// A value that goes up and down (connections open, streams in flight).
#[derive(Clone, Debug)]
pub(crate) struct Gauge {
    slot: usize,
}

impl Gauge {
    #[inline]
    pub(crate) fn inc(&self) {
        self.add(1);
    }

    #[inline]
    pub(crate) fn dec(&self) {
        self.add(-1);
    }

    #[inline]
    pub(crate) fn add(&self, n: i64) {
        cell(self.slot).fetch_add(n as u64, Relaxed);
    }

    /// The value, over every worker.
    pub(crate) fn get(&self) -> i64 {
        sum(self.slot) as i64
    }
}

/// A gauge in no family, for a count the gateway acts on: read with [`Gauge::get`] only.
impl Default for Gauge {
    fn default() -> Gauge {
        Gauge {
            slot: alloc(1, Use::Count),
        }
    }
}

/// A sequence number per worker (a round-robin cursor): each worker steps its own,
/// worker `w` starting `w` steps in, so that workers do not all begin on the same server.
#[derive(Clone, Debug)]
pub(crate) struct Cursor {
    slot: usize,
}

impl Default for Cursor {
    fn default() -> Cursor {
        Cursor {
            slot: alloc(1, Use::Count),
        }
    }
}

impl Cursor {
    /// This worker's next number: `w`, `w + 1`, `w + 2`... for worker `w`.
    #[inline]
    pub(crate) fn next(&self) -> usize {
        let n = cell(self.slot).fetch_add(1, Relaxed) as usize;
        n.wrapping_add(INDEX.with(Cell::get))
    }
}

/// A distribution of durations in seconds: a count per bucket, the overflow past the last
/// bound, and the sum (as `f64` bits).
#[derive(Clone, Debug)]
pub(crate) struct Histogram {
    slot: usize,
    bounds: Arc<[f64]>,
}

impl Histogram {
    #[inline]
    pub(crate) fn observe(&self, seconds: f64) {
        let i = self.bounds.partition_point(|b| *b < seconds);
        cell(self.slot + i).fetch_add(1, Relaxed);
        let sum = cell(self.sum_slot());
        // Only this worker writes its cell, so the update succeeds at its first try but
        // where another thread shares the arena.
        let _ = sum.fetch_update(Relaxed, Relaxed, |s| {
            Some((f64::from_bits(s) + seconds).to_bits())
        });
    }

    /// The slot of the sum, after the buckets and the overflow.
    fn sum_slot(&self) -> usize {
        self.slot + self.bounds.len() + 1
    }

    /// Observations, over every worker.
    #[cfg(test)]
    pub(crate) fn get_sample_count(&self) -> u64 {
        (0..=self.bounds.len()).map(|i| sum(self.slot + i)).sum()
    }

    /// The buckets' cumulative counts, the total count and the sum.
    fn snapshot(&self) -> proto::Histogram {
        let mut cumulative = 0;
        let mut buckets = Vec::with_capacity(self.bounds.len());
        for (i, bound) in self.bounds.iter().enumerate() {
            cumulative += sum(self.slot + i);
            let mut b = proto::Bucket::default();
            b.set_cumulative_count(cumulative);
            b.set_upper_bound(*bound);
            buckets.push(b);
        }
        let count = cumulative + sum(self.slot + self.bounds.len());
        let total = values(self.sum_slot()).map(f64::from_bits).sum();
        let mut h = proto::Histogram::default();
        h.set_bucket(buckets);
        h.set_sample_count(count);
        h.set_sample_sum(total);
        h
    }
}

/// What a family's series are.
enum Kind {
    Counter,
    Gauge,
    Histogram(Arc<[f64]>),
}

/// One metric family: its description and its series, by label values.
struct Family {
    desc: Desc,
    kind: Kind,
    series: Mutex<HashMap<Box<[String]>, usize>>,
}

impl Family {
    fn register(r: &Registry, name: &str, help: &str, labels: &[&str], kind: Kind) -> Arc<Self> {
        let labels = labels.iter().map(|l| l.to_string()).collect();
        let desc = Desc::new(name.into(), help.into(), labels, HashMap::new())
            .expect("valid metric definition");
        let family = Arc::new(Family {
            desc,
            kind,
            series: Mutex::default(),
        });
        r.register(Box::new(Registered(family.clone())))
            .expect("metric registered once");
        family
    }

    /// The slot of the series with these label values (created, at zero, on first use).
    fn slot(&self, values: &[&str]) -> usize {
        assert_eq!(values.len(), self.desc.variable_labels.len(), "label count");
        let mut series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        let key: Box<[String]> = values.iter().map(|v| v.to_string()).collect();
        let width = match &self.kind {
            Kind::Counter | Kind::Gauge => 1,
            Kind::Histogram(b) => b.len() + 2,
        };
        *series
            .entry(key)
            .or_insert_with(|| alloc(width, Use::Metric))
    }

    fn collect(&self) -> MetricFamily {
        let series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        let metrics = series.iter().map(|(values, &slot)| {
            let mut labels: Vec<_> = (self.desc.variable_labels.iter().zip(values.iter()))
                .map(|(name, value)| {
                    let mut l = proto::LabelPair::default();
                    l.set_name(name.clone());
                    l.set_value(value.clone());
                    l
                })
                .collect();
            // By name, as Prometheus' own vectors render them.
            labels.sort_by(|a, b| a.name().cmp(b.name()));
            let mut m = proto::Metric::from_label(labels);
            match &self.kind {
                Kind::Counter => {
                    let mut c = proto::Counter::default();
                    c.set_value(sum(slot) as f64);
                    m.set_counter(c);
                }
                Kind::Gauge => {
                    let mut g = proto::Gauge::default();
                    g.set_value(sum(slot) as i64 as f64);
                    m.set_gauge(g);
                }
                Kind::Histogram(bounds) => {
                    let h = Histogram {
                        slot,
                        bounds: bounds.clone(),
                    };
                    m.set_histogram(h.snapshot());
                }
            }
            m
        });
        let mut mf = MetricFamily::default();
        mf.set_name(self.desc.fq_name.clone());
        mf.set_help(self.desc.help.clone());
        mf.set_field_type(match self.kind {
            Kind::Counter => MetricType::COUNTER,
            Kind::Gauge => MetricType::GAUGE,
            Kind::Histogram(_) => MetricType::HISTOGRAM,
        });
        mf.set_metric(metrics.collect());
        mf
    }
}

/// A family as the registry holds it.
struct Registered(Arc<Family>);

impl Collector for Registered {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        vec![self.0.collect()]
    }
}

/// Counters by label values.
#[derive(Clone)]
pub(crate) struct CounterVec(Arc<Family>);

impl CounterVec {
    pub(crate) fn register(r: &Registry, name: &str, help: &str, labels: &[&str]) -> CounterVec {
        CounterVec(Family::register(r, name, help, labels, Kind::Counter))
    }

    pub(crate) fn with_label_values(&self, values: &[&str]) -> Counter {
        Counter {
            slot: self.0.slot(values),
        }
    }
}

/// Gauges by label values.
#[derive(Clone)]
pub(crate) struct GaugeVec(Arc<Family>);

impl GaugeVec {
    pub(crate) fn register(r: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
        GaugeVec(Family::register(r, name, help, labels, Kind::Gauge))
    }

    pub(crate) fn with_label_values(&self, values: &[&str]) -> Gauge {
        Gauge {
            slot: self.0.slot(values),
        }
    }
}

/// Histograms by label values, all with the same bucket bounds.
#[derive(Clone)]
pub(crate) struct HistogramVec(Arc<Family>);

impl HistogramVec {
    pub(crate) fn register(
        r: &Registry,
        name: &str,
        help: &str,
        labels: &[&str],
        bounds: &[f64],
    ) -> HistogramVec {
        assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds ascend");
        let kind = Kind::Histogram(bounds.into());
        HistogramVec(Family::register(r, name, help, labels, kind))
    }

    pub(crate) fn with_label_values(&self, values: &[&str]) -> Histogram {
        let Kind::Histogram(bounds) = &self.0.kind else {
            unreachable!("a histogram family")
        };
        Histogram {
            slot: self.0.slot(values),
            bounds: bounds.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{Encoder, TextEncoder};

    fn render(r: &Registry) -> String {
        let mut out = Vec::new();
        TextEncoder::new().encode(&r.gather(), &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn counts_from_many_workers_add_up() {
        let r = Registry::new();
        let v = CounterVec::register(&r, "hits_total", "Hits", &["route", "code"]);
        let a = v.with_label_values(&["a", "200"]);
        let threads: Vec<_> = (0..6)
            .map(|w| {
                let a = a.clone();
                std::thread::spawn(move || {
                    // Two threads per arena, and one in the shared arena.
                    if w < 5 {
                        enter_worker(w / 2);
                    }
                    for _ in 0..100_000 {
                        a.inc();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(a.get(), 600_000);
        // The same labels are the same series.
        assert_eq!(v.with_label_values(&["a", "200"]).get(), 600_000);
        assert_eq!(v.with_label_values(&["b", "200"]).get(), 0);
        let text = render(&r);
        // Labels in name order, as Prometheus' own vectors have them.
        assert!(
            text.contains("hits_total{code=\"200\",route=\"a\"} 600000\n"),
            "{text}"
        );
        assert!(
            text.contains("hits_total{code=\"200\",route=\"b\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE hits_total counter"), "{text}");
    }

    #[test]
    fn a_gauge_goes_down_on_another_worker_than_the_one_it_went_up_on() {
        let r = Registry::new();
        let v = GaugeVec::register(&r, "open", "Open", &["l"]);
        let g = v.with_label_values(&["x"]);
        let up = g.clone();
        std::thread::spawn(move || {
            enter_worker(3);
            (0..10).for_each(|_| up.inc());
        })
        .join()
        .unwrap();
        let down = g.clone();
        std::thread::spawn(move || {
            enter_worker(4);
            (0..7).for_each(|_| down.dec());
        })
        .join()
        .unwrap();
        assert_eq!(g.get(), 3);
        g.add(-5);
        assert_eq!(g.get(), -2);
        assert!(render(&r).contains("open{l=\"x\"} -2\n"));
        assert_eq!(Gauge::default().get(), 0);
    }

    #[test]
    fn a_histogram_renders_cumulative_buckets_its_count_and_sum() {
        let r = Registry::new();
        let v = HistogramVec::register(&r, "t_seconds", "T", &["k"], &[0.1, 1.0]);
        let h = v.with_label_values(&["x"]);
        for s in [0.05, 0.1, 0.5, 2.0, 3.0] {
            h.observe(s);
        }
        let worker = h.clone();
        std::thread::spawn(move || {
            enter_worker(1);
            worker.observe(0.5);
        })
        .join()
        .unwrap();
        assert_eq!(h.get_sample_count(), 6);
        let text = render(&r);
        for line in [
            "t_seconds_bucket{k=\"x\",le=\"0.1\"} 2\n",
            "t_seconds_bucket{k=\"x\",le=\"1\"} 4\n",
            "t_seconds_bucket{k=\"x\",le=\"+Inf\"} 6\n",
            "t_seconds_sum{k=\"x\"} 6.15\n",
            "t_seconds_count{k=\"x\"} 6\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }

    #[test]
    fn a_series_never_straddles_two_blocks() {
        assert_eq!(place(BLOCK - 17, 17), BLOCK - 17, "fits exactly");
        assert_eq!(place(BLOCK - 16, 17), BLOCK, "moves to the next block");
        assert_eq!(place(3 * BLOCK, 17), 3 * BLOCK);
        assert!(
            alloc(1, Use::Metric) >= JUNK,
            "the junk slots are never handed out"
        );
    }

    /// Metric series past their share go to the junk slots; counts the gateway acts on
    /// still get slots of their own.
    #[test]
    fn counts_keep_slots_of_their_own_past_the_metrics_share() {
        let full = CAPACITY - RESERVE;
        assert_eq!(grant(full - 17, 17, Use::Metric), Some(full - 17));
        assert_eq!(grant(full - 16, 17, Use::Metric), None);
        assert_eq!(grant(full, 1, Use::Metric), None);
        assert_eq!(grant(full, 1, Use::Count), Some(full));
        assert_eq!(grant(CAPACITY - 1, 1, Use::Count), Some(CAPACITY - 1));
        assert_eq!(grant(CAPACITY, 1, Use::Count), None);
    }

    #[test]
    fn each_worker_steps_its_own_cursor_from_its_own_start() {
        let c = Cursor::default();
        let steps = |w: usize| {
            let c = c.clone();
            std::thread::spawn(move || {
                enter_worker(w);
                (0..3).map(|_| c.next()).collect::<Vec<_>>()
            })
            .join()
            .unwrap()
        };
        assert_eq!(steps(0), [0, 1, 2]);
        assert_eq!(steps(2), [2, 3, 4]);
        assert_eq!(steps(0), [3, 4, 5], "worker 0 goes on from where it was");
    }
}
