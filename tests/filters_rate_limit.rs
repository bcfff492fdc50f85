//! A local `rate_limit` is the process's rate, across workers; `scope = "worker"` asks for
//! one bucket per worker by name.

mod support;

use std::net::SocketAddr;
use support::*;

/// Connections, one request each, all sent at once. The kernel spreads connections over the
/// two workers' `SO_REUSEPORT` sockets by their source ports, so with 40 of them both
/// workers get far more than 5.
const CLIENTS: usize = 40;

fn config(origin: SocketAddr, scope: &str) -> String {
    config_text(
        origin,
        "",
        &format!(
            r#"[[filters]]
name = "limit"
type = "rate_limit"
requests = 5
burst = 5
period = "1h"
{scope}
"#
        ),
    )
    .replace("workers = 1", "workers = 2")
}

/// Statuses of `CLIENTS` requests sent at once, each on its own connection.
async fn burst_of_requests(addr: SocketAddr) -> Vec<u16> {
    let asks: Vec<_> = (0..CLIENTS)
        .map(|_| tokio::spawn(async move { get(addr, "/").await.status }))
        .collect();
    let mut statuses = Vec::new();
    for a in asks {
        statuses.push(a.await.unwrap());
    }
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_rate_limit_is_the_process_rate_across_workers() {
    let origin = stub();
    let g = start_gateway(&config(origin.local_addr(), ""));
    let statuses = burst_of_requests(g.addr).await;
    let ok = statuses.iter().filter(|&&s| s == 200).count();
    let limited = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!((ok, limited), (5, CLIENTS - 5), "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_worker_gives_each_worker_its_own_buckets() {
    let origin = stub();
    let g = start_gateway(&config(origin.local_addr(), r#"scope = "worker""#));
    let statuses = burst_of_requests(g.addr).await;
    let ok = statuses.iter().filter(|&&s| s == 200).count();
    // Both workers served requests: each let its own 5 through.
    assert_eq!(ok, 10, "{statuses:?}");
}
