//! Per origin server series: attempts by outcome, attempt latency and connections reused
//! (handles resolved when a config version is built), and open and idle connections (set
//! from the servers' shared counts when metrics are rendered).

use prometheus::{IntGaugeVec, Opts, Registry};

use super::sharded::{Counter, CounterVec, Histogram, HistogramVec};

/// The families, by cluster and server.
#[derive(Clone)]
pub(crate) struct ServerFamilies {
    attempts: CounterVec,
    seconds: HistogramVec,
    reused: CounterVec,
    /// Open and idle connections by cluster, server and `state`.
    pub(crate) connections: IntGaugeVec,
}

/// What an attempt's outcome is counted as: its status class, or `error` (no response).
const OUTCOMES: [&str; 7] = ["other", "1xx", "2xx", "3xx", "4xx", "5xx", "error"];

impl ServerFamilies {
    pub(crate) fn register(r: &Registry) -> ServerFamilies {
        let labels = &["cluster", "server"];
        let attempts = CounterVec::register(
            r,
            "upstream_server_attempts_total",
            "Upstream attempts by server and outcome (the response's status class, or error when none came)",
            &["cluster", "server", "outcome"],
        );
        let seconds = HistogramVec::register(
            r,
            "upstream_attempt_duration_seconds",
            "Time from an attempt's start (pool checkout or connect) to the response head or failure, by server; one attempt in 16 is timed (every one with the access log on)",
            labels,
            &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0],
        );
        let reused = CounterVec::register(
            r,
            "upstream_server_reused_total",
            "Attempts on a pooled (reused) connection, by server",
            labels,
        );
        let connections = IntGaugeVec::new(
            Opts::new(
                "upstream_server_connections",
                "Connections to a server across workers, by state: open (idle included) and idle (HTTP/1.1 pool)",
            ),
            &["cluster", "server", "state"],
        )
        .expect("valid metric definition");
        r.register(Box::new(connections.clone()))
            .expect("metric registered once");
        ServerFamilies {
            attempts,
            seconds,
            reused,
            connections,
        }
    }

    /// One server's handles; every outcome's series exists from here on, at zero.
    pub(crate) fn server(&self, cluster: &str, server: &str) -> ServerMetrics {
        let outcome = |o: &str| self.attempts.with_label_values(&[cluster, server, o]);
        ServerMetrics {
            by_outcome: OUTCOMES.map(outcome),
            attempt_seconds: self.seconds.with_label_values(&[cluster, server]),
            reused: self.reused.with_label_values(&[cluster, server]),
        }
    }
}

/// One server's handles in one cluster.
#[derive(Clone, Debug)]
pub(crate) struct ServerMetrics {
    by_outcome: [Counter; 7],
    attempt_seconds: Histogram,
    pub(crate) reused: Counter,
}

impl ServerMetrics {
    /// An attempt ended with a response head of `status`, or with none (`None`); it took
    /// the time since `started` when it was timed.
    pub(crate) fn attempt(&self, status: Option<u16>, started: Option<tokio::time::Instant>) {
        let i = match status {
            None => 6,
            Some(s) => match (s / 100) as usize {
                c @ 1..=5 => c,
                _ => 0,
            },
        };
        self.by_outcome[i].inc();
        if let Some(t) = started {
            self.attempt_seconds.observe(t.elapsed().as_secs_f64());
        }
    }
}

/// Attempts of one in this many are timed for `upstream_attempt_duration_seconds`.
pub(crate) const ATTEMPT_TIMING_SAMPLE: u32 = 16;

thread_local! {
    static ATTEMPT_TICK: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether to time this attempt: one in [`ATTEMPT_TIMING_SAMPLE`], counted per worker.
pub(crate) fn sample_attempt_timing() -> bool {
    ATTEMPT_TICK.with(|t| {
        let n = t.get().wrapping_add(1);
        t.set(n);
        n % ATTEMPT_TIMING_SAMPLE == 0
    })
}

#[cfg(test)]
impl ServerMetrics {
    /// Handles in a registry of their own, for unit tests' servers.
    pub(crate) fn for_tests() -> ServerMetrics {
        ServerFamilies::register(&Registry::new()).server("c", "s")
    }
}
