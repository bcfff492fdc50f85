//! A route's weighted split over several clusters (`clusters = [{ name, weight }]`, canary
//! releases), and the header or cookie through which a tester names the cluster instead
//! (`cluster_override`). Built with the config version; a pick is one random draw and a
//! binary search over the cumulative weights (no allocation), so a reload that changes the
//! weights takes effect from the next request on and fails none.

use http::HeaderName;
use std::sync::Arc;

use crate::metrics::{Metrics, PickMetrics};
use crate::upstream::{Cluster, Clusters};
use keymaster_config::RouteConfig;

/// One cluster of the split.
struct Share {
    cluster: Arc<Cluster>,
    metrics: PickMetrics,
}

/// The split of one route.
pub(crate) struct Split {
    shares: Vec<Share>,
    /// Running totals of the weights, in the order of `shares`.
    cumulative: Vec<u64>,
    /// The `cluster_override` header.
    header: Option<HeaderName>,
    /// The `cluster_override` cookie.
    cookie: Option<Box<str>>,
}

impl Split {
    /// The split of `cfg`, or `None` for a route with one `cluster`.
    pub(crate) fn build(
        cfg: &RouteConfig,
        clusters: &Clusters,
        metrics: &Metrics,
    ) -> Result<Option<Split>, String> {
        if cfg.clusters.is_empty() {
            return Ok(None);
        }
        let mut shares = Vec::with_capacity(cfg.clusters.len());
        let mut cumulative = Vec::with_capacity(cfg.clusters.len());
        let mut total = 0u64;
        for w in &cfg.clusters {
            let cluster = clusters
                .get(&w.name)
                .ok_or_else(|| format!("unknown cluster {}", w.name))?;
            total += u64::from(w.weight.max(1));
            cumulative.push(total);
            shares.push(Share {
                cluster: cluster.clone(),
                metrics: metrics.picks(&cfg.name, &w.name),
            });
        }
        let o = cfg.cluster_override.as_ref();
        let header = match o.and_then(|o| o.header.as_deref()) {
            Some(h) => Some(HeaderName::from_bytes(h.as_bytes()).map_err(|e| e.to_string())?),
            None => None,
        };
        Ok(Some(Split {
            shares,
            cumulative,
            header,
            cookie: o.and_then(|o| o.cookie.as_deref()).map(Into::into),
        }))
    }

    /// The `cluster_override` header, if the route has one.
    pub(crate) fn header(&self) -> Option<&HeaderName> {
        self.header.as_ref()
    }

    /// The `cluster_override` cookie's name, if the route has one.
    pub(crate) fn cookie(&self) -> Option<&str> {
        self.cookie.as_deref()
    }

    /// The cluster a request goes to: the first of `named` (the override header's value,
    /// then the cookie's) that names one of the split's clusters, else a weighted draw.
    pub(crate) fn pick<'a>(&self, named: impl IntoIterator<Item = &'a [u8]>) -> &Arc<Cluster> {
        for name in named {
            let hit = self
                .shares
                .iter()
                .find(|s| s.cluster.config.name.as_bytes() == name);
            if let Some(s) = hit {
                s.metrics.by_override.inc();
                return &s.cluster;
            }
        }
        let s = &self.shares[draw(&self.cumulative, fastrand::u64(..self.total()))];
        s.metrics.by_weight.inc();
        &s.cluster
    }

    fn total(&self) -> u64 {
        self.cumulative.last().copied().unwrap_or(1)
    }
}

/// The share that the draw `r` (below the total weight) falls in.
fn draw(cumulative: &[u64], r: u64) -> usize {
    (cumulative.partition_point(|&c| c <= r)).min(cumulative.len().saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::draw;

    #[test]
    fn each_draw_falls_in_its_share() {
        // Weights 95/4/1: every draw below the total, counted by the share it falls in.
        let cumulative = [95u64, 99, 100];
        let mut counts = [0; 3];
        for r in 0..100 {
            counts[draw(&cumulative, r)] += 1;
        }
        assert_eq!(counts, [95, 4, 1]);
        assert_eq!(draw(&[7], 6), 0);
    }
}
