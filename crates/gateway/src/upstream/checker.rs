//! Active health checks. One thread, `keymaster-health`, runs a current-thread tokio runtime
//! for the whole process: it is started with the gateway and stopped with it (the workers'
//! shutdown signal), so checks never compete with request handling on a worker's event loop.
//!
//! The thread follows the config version: it sleeps until a new version is swapped in (a
//! reload or a discovery change, [`Host::versions`]), then stops its probe tasks and starts
//! one per (cluster with `health_check`, server) of the new version. Between versions it
//! wakes only for its probes. Verdicts live on the process-wide
//! [`OriginState`](super::OriginState), so a reload loses nothing. Each check is a
//! [`Probe`]: a new connection over the cluster's transport (PROXY header, TLS, HTTP/1.1 or
//! HTTP/2) asking `GET path` or the gRPC health service, within `timeout`. Every check is
//! counted in `keymaster_health_checks_total{cluster, result}`.

use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::probe::Probe;
use super::Host;
use keymaster_config::HealthCheckConfig;

/// Start the health-check thread; it ends when `shutdown` turns true or its sender goes.
pub(crate) fn start<H: Host>(
    shared: Arc<H>,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    crate::runtime_thread::spawn("keymaster-health", move || run(shared, shutdown))
}

async fn run<H: Host>(shared: Arc<H>, mut shutdown: watch::Receiver<bool>) {
    let mut versions = shared.versions();
    let mut version = 0;
    let mut probes: Vec<JoinHandle<()>> = Vec::new();
    loop {
        // Marked seen before the clusters are read: a swap after this wakes the loop again,
        // so the probes never stay on an older version than the running one.
        let current = *versions.borrow_and_update();
        if current != version {
            version = current;
            let clusters = shared.clusters();
            for p in probes.drain(..) {
                p.abort();
            }
            for cluster in &clusters {
                if cluster.config.health_check.is_none() {
                    for s in &cluster.servers {
                        s.state.health.clear_checks();
                    }
                }
            }
            for cluster in &clusters {
                let Some(hc) = &cluster.config.health_check else {
                    continue;
                };
                for s in &cluster.servers {
                    let name = cluster.config.name.clone();
                    match Probe::new(&cluster.config, s.clone(), hc) {
                        Ok(probe) => {
                            let skipped = cluster.metrics.check_descriptors_exhausted.clone();
                            let task = probe_loop(shared.clone(), name, probe, hc.clone(), skipped);
                            probes.push(tokio::spawn(task));
                        }
                        Err(error) => tracing::error!(
                            cluster = %name, server = %s.label, %error,
                            "health check cannot be built; the server is not checked"
                        ),
                    }
                }
            }
        }
        if *shutdown.borrow_and_update() {
            break;
        }
        tokio::select! {
            r = shutdown.changed() => if r.is_err() { break },
            r = versions.changed() => if r.is_err() { break },
        }
    }
    for p in probes {
        p.abort();
    }
}

async fn probe_loop<H: Host>(
    shared: Arc<H>,
    cluster: String,
    probe: Probe,
    hc: HealthCheckConfig,
    no_descriptors: prometheus::IntCounter,
) {
    let mut tick = tokio::time::interval(hc.interval.get());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let server = probe.server.clone();
    loop {
        tick.tick().await;
        let result = probe.run().await;
        if result.as_ref().is_err_and(|e| e.is_out_of_descriptors()) {
            // Out of descriptors here says nothing about the server: no verdict.
            no_descriptors.inc();
            tracing::warn!(%cluster, server = %server.label, "health check skipped: out of file descriptors");
            continue;
        }
        let label = result.as_ref().map_or_else(|e| e.category(), |()| "pass");
        shared.metrics().health_check(&cluster, label);
        // A changed verdict is logged, with the failure that turned it.
        if server
            .state
            .health
            .record_check(result.is_ok(), &hc)
            .is_none()
        {
            continue;
        }
        match result {
            Ok(()) => {
                tracing::info!(%cluster, server = %server.label, "health check: server healthy")
            }
            Err(error) => tracing::warn!(
                %cluster, server = %server.label, %error,
                "health check: server unhealthy"
            ),
        }
    }
}
