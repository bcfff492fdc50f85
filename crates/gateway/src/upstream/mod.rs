//! The upstream (origin) side: clusters of origin servers, balancing, the per-worker
//! connection pools, keymaster's own HTTP/1.1 client and hyper's HTTP/2 client.
//!
//! - [`Cluster`], [`OriginServer`]: what a config version says about origins.
//! - [`balance`]: picks a server (random, round robin, least outstanding).
//! - [`ring`]: consistent hashing (`balance = "hash"`): the ring and what it hashes.
//! - [`pool`]: idle keep-alive connections per origin server, per worker thread; no locks.
//! - [`conn`]: a request's hold on an origin (HTTP/1.1 connection or HTTP/2 stream), sending
//!   on it, and the response body of either.
//! - [`h1`]: keymaster's HTTP/1.1 client: the connection is a value, not a task.
//! - [`connect`]: opening a connection (TCP, TLS, HTTP/1 or HTTP/2) within the connect timeout.
//! - [`tls`]: outbound TLS per cluster (SNI, CA, client certificate, versions, ALPN).
//! - [`h2`]: multiplexed HTTP/2 connections per origin server, per worker.
//! - [`health`]: per-server health (active verdicts, passive outlier ejection) and
//!   health-aware server choice; [`checker`]: the active health-check thread, whose checks
//!   ([`probe`]) speak the cluster's transport.
//! - [`limits`]: per-cluster state shared by every config version and worker (request
//!   caps with a queue, the retry budget).
//! - [`discovery`]: service discovery (DNS re-resolution, server list files, Consul, Eureka).

pub(crate) mod balance;
pub(crate) mod checker;
pub(crate) mod conn;
pub(crate) mod connect;
pub(crate) mod discovery;
pub(crate) mod h1;
pub(crate) mod h2;
pub(crate) mod health;
pub(crate) mod limits;
pub(crate) mod pool;
pub(crate) mod probe;
pub(crate) mod ring;
pub(crate) mod tls;
pub(crate) mod waiters;

use http::HeaderValue;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::metrics::{ClusterMetrics, Metrics, ServerMetrics};
use keymaster_config::{ClusterConfig, DnsConfig, UpstreamProtocol};
use rustls::pki_types::ServerName;

/// A config version's clusters by name. Fx-hashed: a route filter's choice is looked up on
/// every request it makes (SipHash cost ~150 instructions a lookup), and the keys are the
/// config's own names.
pub(crate) type Clusters = rustc_hash::FxHashMap<String, Arc<Cluster>>;

/// The running gateway as this layer's background tasks (health checks, discovery) see it:
/// the current config version's clusters and settings, the metrics, and where discovered
/// servers go. Narrow on purpose: the upstream layer names nothing above it.
pub(crate) trait Host: Send + Sync + 'static {
    /// The running version's number, changed after every swap (a reload or discovery).
    fn versions(&self) -> tokio::sync::watch::Receiver<u64>;
    /// The running version's clusters.
    fn clusters(&self) -> Vec<Arc<Cluster>>;
    /// The running version's clusters (their settings) and `[dns]`, for discovery.
    fn discovery_settings(&self) -> (Vec<ClusterConfig>, DnsConfig);
    fn metrics(&self) -> &Metrics;
    /// A discovery round found `endpoints` for `cluster` (resolved with `dns`; `listed` the
    /// registry's part): swap in a version with them.
    fn apply_discovered(
        &self,
        cluster: &ClusterConfig,
        dns: &DnsConfig,
        endpoints: Vec<discovery::Endpoint>,
        listed: Option<discovery::registry::Listed>,
    );
    /// The registry list the running version of `cluster` was built from.
    fn discovered_listed(&self, cluster: &str) -> Option<discovery::registry::Listed>;
    /// Woken after a reload (new clusters, new intervals).
    fn discovery_wake(&self) -> &tokio::sync::Notify;
}

/// Everything that makes an origin a distinct peer: pooled connections are shared only
/// between requests with the same key. Plain origins are their address and protocol; TLS
/// origins add the server name and the digest of the cluster's TLS settings (trust
/// anchors, client certificate, versions, ALPN; see [`tls::UpstreamTls`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OriginKey {
    pub addr: SocketAddr,
    pub protocol: UpstreamProtocol,
    /// `(server name, settings digest)` for TLS origins.
    pub tls: Option<(String, [u8; 32])>,
}

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
    /// Idle pooled connections to this server across all workers (HTTP/1.1): counted in
    /// each worker's own memory, since a request takes a connection out and puts it back.
    pub(crate) idle_connections: crate::metrics::sharded::Gauge,
    /// Active check verdicts and passive ejection (shared by every cluster naming it).
    pub health: health::HealthState,
}

/// The origin identity registry: the same [`OriginKey`] always gets the same [`OriginState`].
fn registry() -> &'static Mutex<HashMap<OriginKey, Arc<OriginState>>> {
    static REG: OnceLock<Mutex<HashMap<OriginKey, Arc<OriginState>>>> = OnceLock::new();
    REG.get_or_init(Default::default)
}

/// The state of a plain HTTP/1.1 origin at `addr`.
#[cfg(test)]
pub(crate) fn intern_origin(addr: SocketAddr) -> Arc<OriginState> {
    intern_origin_key(OriginKey {
        addr,
        protocol: UpstreamProtocol::Http1,
        tls: None,
    })
}

pub(crate) fn intern_origin_key(key: OriginKey) -> Arc<OriginState> {
    // Only called while building a config version, never on the request path.
    let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    let next = reg.len();
    reg.entry(key.clone())
        .or_insert_with(|| {
            Arc::new(OriginState {
                id: next,
                addr: key.addr,
                outstanding: AtomicUsize::new(0),
                open_connections: AtomicUsize::new(0),
                idle_connections: crate::metrics::sharded::Gauge::default(),
                health: health::HealthState::default(),
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
    /// The cluster's TLS settings and this server's name, for TLS origins.
    pub(crate) tls: Option<(Arc<tls::UpstreamTls>, ServerName<'static>)>,
    pub(crate) protocol: UpstreamProtocol,
    /// This server's series in this cluster.
    pub(crate) metrics: ServerMetrics,
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
    /// `balance = "hash"`: the ring, what it hashes and its counts.
    pub(crate) hashing: Option<Box<ring::Hashing>>,
    pub(crate) metrics: ClusterMetrics,
    /// Caps, queue and retry budget, shared by every version of the cluster (by name).
    pub(crate) limits: Arc<limits::ClusterState>,
}

impl Cluster {
    /// Build from config, resolving server names (DNS) now, off the request path.
    pub(crate) fn build(
        cfg: &ClusterConfig,
        metrics: ClusterMetrics,
        limits: Arc<limits::ClusterState>,
    ) -> Result<Cluster, String> {
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
        Self::with_endpoints(cfg, &endpoints, metrics, limits)
    }

    /// Build from already resolved servers (service discovery's, or [`Cluster::build`]'s).
    /// TLS files are read here, so every config version re-reads them.
    pub(crate) fn with_endpoints(
        cfg: &ClusterConfig,
        endpoints: &[discovery::Endpoint],
        metrics: ClusterMetrics,
        limits: Arc<limits::ClusterState>,
    ) -> Result<Cluster, String> {
        let tls = match &cfg.tls {
            Some(t) => Some(Arc::new(tls::build(&cfg.name, t, cfg.protocol)?)),
            None => None,
        };
        let mut servers = Vec::with_capacity(endpoints.len());
        for e in endpoints {
            let label: Arc<str> = e.addr.to_string().into();
            let server_tls = match &tls {
                Some(t) => {
                    let name = t.server_name(&e.authority).map_err(|err| {
                        format!("cluster {}: server {}: tls: {err}", cfg.name, e.authority)
                    })?;
                    Some((t.clone(), name))
                }
                None => None,
            };
            let key = OriginKey {
                addr: e.addr,
                protocol: cfg.protocol,
                tls: server_tls
                    .as_ref()
                    .map(|(t, n)| (n.to_str().into_owned(), t.digest)),
            };
            servers.push(Arc::new(OriginServer {
                metrics: metrics.server(&label),
                state: intern_origin_key(key),
                tls: server_tls,
                protocol: cfg.protocol,
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
        let hashing = match (&cfg.hash, &metrics.hash) {
            (Some(h), Some(m)) => Some(Box::new(
                ring::Hashing::new(h, &servers, m.clone())
                    .map_err(|e| format!("cluster {}: hash: {e}", cfg.name))?,
            )),
            _ => None,
        };
        Ok(Cluster {
            balancer: balance::Balancer::new(cfg.balance, &servers, &limits.cursor),
            hashing,
            config: cfg.clone(),
            servers,
            limits,
            metrics,
        })
    }

    /// Choose a server for the next request.
    pub(crate) fn pick(&self) -> &Arc<OriginServer> {
        self.balancer.pick(&self.servers)
    }
}
