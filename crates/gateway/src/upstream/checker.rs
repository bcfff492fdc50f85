//! Active health checks. One thread, `keymaster-health`, runs a current-thread tokio runtime
//! for the whole process: it is started with the gateway and stopped with it (the workers'
//! shutdown signal), so checks never compete with request handling on a worker's event loop.
//!
//! The thread follows the config version: every 200 ms it looks at the snapshot and, when the
//! version changed, stops its probe tasks and starts one per (cluster with `health_check`,
//! server) of the new version. Verdicts live on the process-wide
//! [`OriginState`](super::OriginState), so a reload loses nothing. A probe is a plain
//! `GET <path> HTTP/1.1` with `Connection: close` on a new connection; a 2xx or 3xx status
//! line within `timeout` is a pass.

use http::HeaderValue;
use prometheus::IntCounter;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::OriginServer;
use crate::gateway::Shared;
use keymaster_config::HealthCheckConfig;

/// How often the thread looks for a new config version.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);

/// Start the health-check thread; it ends when `shutdown` turns true or its sender goes.
pub(crate) fn start(
    shared: Arc<Shared>,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    crate::runtime_thread::spawn("keymaster-health", move || run(shared, shutdown))
}

async fn run(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let mut version = 0;
    let mut probes: Vec<JoinHandle<()>> = Vec::new();
    loop {
        let snap = shared.snapshot.load_full();
        if snap.version != version {
            version = snap.version;
            for p in probes.drain(..) {
                p.abort();
            }
            for cluster in snap.clusters.values() {
                if cluster.config.health_check.is_none() {
                    for s in &cluster.servers {
                        s.state.health.clear_checks();
                    }
                }
            }
            for cluster in snap.clusters.values() {
                let Some(hc) = &cluster.config.health_check else {
                    continue;
                };
                for s in &cluster.servers {
                    let task = probe_loop(
                        cluster.config.name.clone(),
                        s.clone(),
                        hc.clone(),
                        cluster.metrics.check_descriptors_exhausted.clone(),
                    );
                    probes.push(tokio::spawn(task));
                }
            }
        }
        drop(snap);
        if *shutdown.borrow_and_update() {
            break;
        }
        tokio::select! {
            r = shutdown.changed() => if r.is_err() { break },
            _ = tokio::time::sleep(FOLLOW_EVERY) => {}
        }
    }
    for p in probes {
        p.abort();
    }
}

async fn probe_loop(
    cluster: String,
    server: Arc<OriginServer>,
    hc: HealthCheckConfig,
    no_descriptors: IntCounter,
) {
    let mut tick = tokio::time::interval(hc.interval.get());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let pass = probe(
            server.state.addr,
            &server.authority,
            &hc.path,
            hc.timeout.get(),
        )
        .await;
        let Some(pass) = pass else {
            // Out of descriptors here says nothing about the server: no verdict.
            no_descriptors.inc();
            tracing::warn!(%cluster, server = %server.label, "health check skipped: out of file descriptors");
            continue;
        };
        if let Some(healthy) = server.state.health.record_check(pass, &hc) {
            if healthy {
                tracing::info!(%cluster, server = %server.label, "health check: server healthy");
            } else {
                tracing::warn!(%cluster, server = %server.label, "health check: server unhealthy");
            }
        }
    }
}

/// One check: connect, send the request, read the status line, all within `timeout`.
/// `None` when the check could not be made because this process (or the system) is out of
/// file descriptors.
pub(crate) async fn probe(
    addr: SocketAddr,
    host: &HeaderValue,
    path: &str,
    timeout: Duration,
) -> Option<bool> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut s = match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) if crate::descriptors::exhausted(&e) => return None,
        Ok(Err(_)) | Err(_) => return Some(false),
    };
    let check = async {
        let mut req = Vec::with_capacity(128);
        req.extend_from_slice(b"GET ");
        req.extend_from_slice(path.as_bytes());
        req.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        req.extend_from_slice(host.as_bytes());
        req.extend_from_slice(
            b"\r\nUser-Agent: keymaster-health-check\r\nConnection: close\r\n\r\n",
        );
        s.write_all(&req).await.ok()?;
        let mut buf = [0u8; 64];
        let mut have = 0;
        while have < 12 {
            let n = s.read(&mut buf[have..]).await.ok()?;
            if n == 0 {
                return None;
            }
            have += n;
        }
        status_of(&buf[..have])
    };
    Some(matches!(
        tokio::time::timeout_at(deadline, check).await,
        Ok(Some(200..=399))
    ))
}

/// The status of an `HTTP/1.x NNN` status line.
fn status_of(line: &[u8]) -> Option<u16> {
    let rest = line
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| line.strip_prefix(b"HTTP/1.0 "))?;
    std::str::from_utf8(rest.get(..3)?).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(status_of(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(status_of(b"HTTP/1.0 503 x"), Some(503));
        assert_eq!(status_of(b"HTTP/2 200"), None);
        assert_eq!(status_of(b"HTTP/1.1 2x0"), None);
    }

    #[tokio::test]
    async fn probe_reads_the_status_and_gives_up_in_time() {
        let ok = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = ok.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = ok.accept().await {
                let mut b = [0u8; 512];
                let _ = s.read(&mut b).await;
                let code = if b.starts_with(b"GET /good ") {
                    204
                } else {
                    500
                };
                let _ = s
                    .write_all(format!("HTTP/1.1 {code} X\r\ncontent-length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        let host = HeaderValue::from_static("h");
        let t = Duration::from_secs(5);
        assert_eq!(probe(addr, &host, "/good", t).await, Some(true));
        assert_eq!(probe(addr, &host, "/bad", t).await, Some(false));
        // A server that accepts and never answers fails by the timeout.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let saddr = silent.local_addr().unwrap();
        let _keep = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = silent.accept().await {
                held.push(s);
            }
        });
        assert_eq!(
            probe(saddr, &host, "/good", Duration::from_millis(50)).await,
            Some(false)
        );
    }
}
