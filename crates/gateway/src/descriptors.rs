//! File descriptors: the process's `RLIMIT_NOFILE`, the descriptor budget a config needs,
//! and telling descriptor exhaustion (`EMFILE`, `ENFILE`) from other socket errors.
//!
//! At start the soft limit is raised to the hard limit (both are logged), and a warning is
//! logged when the listeners' `max_connections` plus the origin connections the pools may
//! hold can exceed it. When descriptors do run out, accepting backs off (see
//! `downstream::accept_loop`), a connect to an origin is a 503 of its own category
//! (`local_descriptors_exhausted`) that blames no origin, and a health check that cannot
//! open its socket gives no verdict.

use keymaster_config::Config;

/// Descriptors kept aside for what is not a client or origin connection: listening sockets,
/// the runtimes' event queues, the access log, the admin API, stdio.
const RESERVE: u64 = 64;

/// The process's descriptor limits after [`raise_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NofileLimit {
    /// The soft limit found at start.
    pub was: u64,
    /// The soft limit now in force.
    pub soft: u64,
    /// The hard limit (the most the soft one may be raised to).
    pub hard: u64,
}

/// Raise the soft `RLIMIT_NOFILE` to the hard limit and log both; `None` when the limits
/// cannot be read.
pub fn raise_limit() -> Option<NofileLimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the duration of the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "reading RLIMIT_NOFILE failed");
        return None;
    }
    let was = lim.rlim_cur;
    let hard = lim.rlim_max;
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit that outlives the call; only the soft limit
        // changes, and never above the hard one.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        } else {
            tracing::warn!(error = %std::io::Error::last_os_error(), "raising RLIMIT_NOFILE failed");
        }
    }
    let soft = lim.rlim_cur;
    tracing::info!(soft, hard, was, "descriptor limit (RLIMIT_NOFILE)");
    Some(NofileLimit { was, soft, hard })
}

/// The descriptors `config` may hold at once with `workers` workers: every listener's
/// `max_connections`, plus the origin connections (at most each server's
/// `pool.max_connections`, and at most one in flight per client connection plus the idle
/// ones the pools keep), plus a reserve.
pub fn needed(config: &Config, workers: usize) -> u64 {
    let clients: u64 = config
        .listeners
        .iter()
        .map(|l| l.max_connections as u64)
        .sum();
    let (mut capped, mut idle) = (0u64, 0u64);
    for c in &config.clusters {
        let cap = match c.pool.max_connections {
            0 => u64::MAX,
            n => n as u64,
        };
        let kept = cap.min((workers as u64).saturating_mul(c.pool.max_idle as u64));
        let servers = c.servers.len() as u64;
        capped = capped.saturating_add(cap.saturating_mul(servers));
        idle = idle.saturating_add(kept.saturating_mul(servers));
    }
    let origins = capped.min(clients.saturating_add(idle));
    clients.saturating_add(origins).saturating_add(RESERVE)
}

/// Raise the limit and warn when `config` can need more descriptors than it allows.
pub(crate) fn prepare(config: &Config, workers: usize) {
    let Some(limit) = raise_limit() else {
        return;
    };
    let need = needed(config, workers);
    if need > limit.soft {
        tracing::warn!(
            limit = limit.soft,
            need,
            "the listeners' max_connections plus the origin connections the pools may hold \
             can exceed the descriptor limit (RLIMIT_NOFILE); past it new clients wait in \
             the backlog and origin connects fail with 503 local_descriptors_exhausted"
        );
    }
}

/// The error is the process (`EMFILE`) or the system (`ENFILE`) out of descriptors.
pub(crate) fn exhausted(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keymaster_config::{ClusterConfig, ListenerConfig, OriginServerConfig};

    fn config(max_connections: usize, pool_cap: usize, servers: usize) -> Config {
        let mut c = Config {
            listeners: vec![ListenerConfig {
                max_connections,
                ..ListenerConfig::default()
            }],
            ..Config::default()
        };
        let mut cluster = ClusterConfig::default();
        cluster.pool.max_connections = pool_cap;
        cluster.pool.max_idle = 10;
        cluster.servers = (0..servers)
            .map(|i| OriginServerConfig {
                address: format!("127.0.0.1:{}", 9000 + i),
                weight: 1,
            })
            .collect();
        c.clusters = vec![cluster];
        c
    }

    #[test]
    fn budget_counts_clients_pool_caps_and_idle_connections() {
        // Capped pools: the caps bound the origin connections.
        assert_eq!(needed(&config(1000, 100, 3), 4), 1000 + 300 + RESERVE);
        // Unlimited pools: one in flight per client plus the idle ones kept (4 × 10 × 3).
        assert_eq!(needed(&config(1000, 0, 3), 4), 1000 + 1000 + 120 + RESERVE);
    }

    #[test]
    fn only_emfile_and_enfile_are_exhaustion() {
        assert!(exhausted(&std::io::Error::from_raw_os_error(libc::EMFILE)));
        assert!(exhausted(&std::io::Error::from_raw_os_error(libc::ENFILE)));
        assert!(!exhausted(&std::io::Error::from_raw_os_error(
            libc::ECONNREFUSED
        )));
    }
}
