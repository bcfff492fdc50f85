//! The upstream (origin) side: clusters of origin servers, balancing, and the per-worker
//! connection pools built on hyper's client connection API.
//!
//! - [`Cluster`], [`OriginServer`]: what a config version says about origins.
//! - [`balance`]: picks a server (random, round robin, least outstanding).
//! - [`pool`]: idle keep-alive connections per origin server, per worker thread; no locks.
//! - [`connect`]: opening a connection within the connect timeout.
//! - [`discovery`]: service discovery (DNS re-resolution, server list files).

pub(crate) mod balance;
pub(crate) mod connect;
pub(crate) mod discovery;
pub(crate) mod pool;

use http::HeaderValue;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::metrics::ClusterMetrics;
use keymaster_config::ClusterConfig;

/// Process-wide state of one origin identity, shared by every config version and worker.
/// Pools are keyed by `id`, so a reload that keeps a server keeps its pooled connections.
#[derive(Debug)]
pub struct OriginState {
    /// Dense index used by the per-worker pools.
    pub id: usize,
    pub addr: SocketAddr,
    /// Requests in flight to this server (least-outstanding balancing).
    pub outstanding: AtomicUsize,
    /// Open connections to this server across all workers (the pool cap).
    pub open_connections: AtomicUsize,
}

/// The origin identity registry: the same address always gets the same [`OriginState`].
fn registry() -> &'static Mutex<HashMap<SocketAddr, Arc<OriginState>>> {
    static REG: OnceLock<Mutex<HashMap<SocketAddr, Arc<OriginState>>>> = OnceLock::new();
    REG.get_or_init(Default::default)
}

pub(crate) fn intern_origin(addr: SocketAddr) -> Arc<OriginState> {
    // Only called while building a config version, never on the request path.
    let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    let next = reg.len();
    reg.entry(addr)
        .or_insert_with(|| {
            Arc::new(OriginState {
                id: next,
                addr,
                outstanding: AtomicUsize::new(0),
                open_connections: AtomicUsize::new(0),
            })
        })
        .clone()
}

/// One origin server in one config version.
#[derive(Debug)]
pub struct OriginServer {
    pub state: Arc<OriginState>,
    /// "ip:port", for logs and the `origin` Host policy.
    pub label: Arc<str>,
    pub authority: HeaderValue,
    pub weight: u32,
}

impl OriginServer {
    pub(crate) fn outstanding(&self) -> usize {
        self.state.outstanding.load(Ordering::Relaxed)
    }
}

/// A named group of origin servers with its balancing and pool policy.
pub struct Cluster {
    pub config: ClusterConfig,
    pub servers: Vec<Arc<OriginServer>>,
    pub(crate) balancer: balance::Balancer,
    pub(crate) metrics: ClusterMetrics,
}

impl Cluster {
    /// Build from config, resolving server names (DNS) now, off the request path.
    pub(crate) fn build(cfg: &ClusterConfig, metrics: ClusterMetrics) -> Result<Cluster, String> {
        use std::net::ToSocketAddrs;
        let mut endpoints = Vec::with_capacity(cfg.servers.len());
        for s in &cfg.servers {
            let addr = s
                .address
                .to_socket_addrs()
                .map_err(|e| format!("cluster {}: server {}: {e}", cfg.name, s.address))?
                .next()
                .ok_or_else(|| {
                    format!(
                        "cluster {}: server {} resolved to nothing",
                        cfg.name, s.address
                    )
                })?;
            endpoints.push(discovery::Endpoint {
                addr,
                authority: s.address.clone(),
                weight: s.weight,
            });
        }
        Self::with_endpoints(cfg, &endpoints, metrics)
    }

    /// Build from already resolved servers (service discovery's, or [`Cluster::build`]'s).
    pub(crate) fn with_endpoints(
        cfg: &ClusterConfig,
        endpoints: &[discovery::Endpoint],
        metrics: ClusterMetrics,
    ) -> Result<Cluster, String> {
        let mut servers = Vec::with_capacity(endpoints.len());
        for e in endpoints {
            let label: Arc<str> = e.addr.to_string().into();
            servers.push(Arc::new(OriginServer {
                state: intern_origin(e.addr),
                authority: HeaderValue::from_str(&e.authority).map_err(|err| {
                    format!("cluster {}: server {}: {err}", cfg.name, e.authority)
                })?,
                label,
                weight: e.weight.max(1),
            }));
        }
        if servers.is_empty() {
            return Err(format!("cluster {} has no servers", cfg.name));
        }
        Ok(Cluster {
            balancer: balance::Balancer::new(cfg.balance, &servers),
            config: cfg.clone(),
            servers,
            metrics,
        })
    }

    /// Choose a server for the next request.
    pub(crate) fn pick(&self) -> &Arc<OriginServer> {
        self.balancer.pick(&self.servers)
    }
}
