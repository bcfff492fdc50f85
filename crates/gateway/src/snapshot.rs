//! A config version compiled for the request path: the router, clusters with resolved
//! servers, pre-resolved metric handles and precomputed header values. Built off the request
//! path (at start and on reload) and swapped in atomically with `arc-swap`, so each request
//! sees exactly one version from its first byte to its last.

use std::rc::Rc;
use std::sync::Arc;

use crate::filter::{FilterChain, FilterSpec};
use crate::metrics::Metrics;
use crate::route::{Route, Router, Split};
use crate::upstream::discovery::Lists;
use crate::upstream::limits::ClusterStates;
use crate::upstream::{Cluster, Clusters};
use keymaster_config::Config;
use keymaster_http::headers::Stamps;

pub struct Snapshot {
    pub version: u64,
    /// The effective config this version was built from (served by `/config`).
    pub config: Config,
    pub router: Router,
    pub(crate) stamps: Stamps,
    /// The filter chain of this version (`filters.is_empty()` skips it).
    pub(crate) filters: FilterChain,
    /// The filters the chain was built from (those registered in code and every
    /// `FilterSource`'s): a version rebuilt for a discovery update keeps them as they are.
    pub(crate) filter_specs: Vec<FilterSpec>,
    /// Clusters by name, for route filters that choose one.
    pub(crate) clusters: Clusters,
    /// Indexed by origin id: whether a cluster of this version has that server (pools of
    /// the others are drained by the sweeper).
    live_origins: Vec<bool>,
}

impl Snapshot {
    /// Compile `config`; `filters` are the ones registered in code and every
    /// `FilterSource`'s; clusters with `discovery` take their servers from `discovered`.
    pub(crate) fn build(
        config: Config,
        version: u64,
        metrics: &Metrics,
        states: &ClusterStates,
        filters: &[FilterSpec],
        discovered: &Lists,
    ) -> Result<Snapshot, String> {
        let mut clusters = Clusters::default();
        for c in &config.clusters {
            let (m, limits) = (metrics.cluster(c), states.get(&c.name));
            let cluster = match discovered.get(&c.name) {
                Some(d) => Cluster::with_endpoints(c, &d.endpoints, m, limits)?,
                None => Cluster::build(c, m, limits)?,
            };
            clusters.insert(c.name.clone(), Arc::new(cluster));
        }
        let mut routes = Vec::with_capacity(config.routes.len());
        for r in &config.routes {
            // A weighted route's own cluster is its first (its timeouts' defaults).
            let name = r.clusters.first().map_or(&r.cluster, |w| &w.name);
            let cluster = clusters
                .get(name)
                .ok_or_else(|| format!("route {}: unknown cluster {name}", r.name))?
                .clone();
            let compression = (r.compression.as_ref())
                .map(|c| crate::compress::Policy::compile(c, &r.name, metrics));
            let split = Split::build(r, &clusters, metrics)
                .map_err(|e| format!("route {}: clusters: {e}", r.name))?;
            let mut route = Route::compile(r, cluster, split, metrics.route(&r.name), compression)
                .map_err(|e| format!("route {}: {e}", r.name))?;
            if let Some(m) = &r.mirror {
                let shadow = (clusters.get(&m.cluster)).ok_or_else(|| {
                    format!("route {}: unknown mirror cluster {}", r.name, m.cluster)
                })?;
                let counts = metrics.mirror(&r.name, &m.cluster);
                route.mirror = Some(crate::proxy::Mirror::new(m, shadow.clone(), counts));
            }
            routes.push((r.priority, Arc::new(route)));
        }
        let filter_specs = filters.to_vec();
        let filters = FilterChain::build(&config, filters, metrics, &clusters)?;
        let mut live_origins = Vec::new();
        for s in clusters.values().flat_map(|c| c.servers.iter()) {
            let id = s.state.id;
            if live_origins.len() <= id {
                live_origins.resize(id + 1, false);
            }
            live_origins[id] = true;
        }
        Ok(Snapshot {
            live_origins,
            version,
            filters,
            filter_specs,
            clusters,
            stamps: Stamps::new(&config.server.via),
            router: Router::new(routes),
            config,
        })
    }

    /// The first route of `this` version that matches the request (see [`Router::find`]).
    pub(crate) fn find_route(
        this: &SnapshotRef,
        host: &str,
        path: &str,
        method: &http::Method,
        headers: &http::HeaderMap,
    ) -> Option<RouteRef> {
        let index = this.router.find(host, path, method, headers)?;
        Some(RouteRef {
            snapshot: this.clone(),
            index,
        })
    }

    /// Whether a cluster of this version has the origin server `id`.
    pub(crate) fn serves(&self, origin_id: usize) -> bool {
        self.live_origins.get(origin_id).copied().unwrap_or(false)
    }
}

/// A worker's handle on a config version: what a request holds from its first byte to its
/// last. Cloning it counts in the worker's own memory (see `Worker::snapshot`): the `Rc`
/// around the shared `Arc` is the point, not a redundant allocation.
#[allow(clippy::redundant_allocation)]
pub(crate) type SnapshotRef = Rc<Arc<Snapshot>>;

/// A request's route: the version it was found in and its place there. Where each request
/// holding the route's `Arc` would write one reference count from every worker, this one
/// clones the worker's handle on the version.
#[derive(Clone)]
pub(crate) struct RouteRef {
    snapshot: SnapshotRef,
    index: usize,
}

impl std::ops::Deref for RouteRef {
    type Target = Route;

    fn deref(&self) -> &Route {
        self.snapshot.router.get(self.index)
    }
}

/// A request's cluster: its route's own, reached through the route (no count of its own),
/// or another one a split or a filter chose.
#[derive(Clone)]
pub(crate) enum ClusterRef {
    OfRoute(RouteRef),
    Other(Arc<Cluster>),
}

impl std::ops::Deref for ClusterRef {
    type Target = Cluster;

    fn deref(&self) -> &Cluster {
        match self {
            ClusterRef::OfRoute(r) => &r.cluster,
            ClusterRef::Other(c) => c,
        }
    }
}
