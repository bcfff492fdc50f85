//! A route's traffic mirror: a sampled share of its requests also goes to a shadow cluster,
//! whose answers are discarded.

use serde::{Deserialize, Serialize};

use crate::units::{ByteSize, Duration};

/// `mirror = { cluster = "shadow", ... }` on a route.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MirrorConfig {
    /// The shadow cluster (must exist).
    pub cluster: String,
    /// Share of the route's requests mirrored (0.0 to 1.0).
    pub sample: f64,
    /// Largest request body mirrored: a request with a longer body, or one whose length is
    /// not declared, is not mirrored. A mirrored body is read whole before the primary's
    /// request goes out.
    pub max_body: ByteSize,
    /// Shadow requests in flight to the cluster, at most, across workers; past it a request
    /// is not mirrored (counted as `dropped`).
    pub max_in_flight: usize,
    /// The longest a shadow request may take, its response body included.
    pub timeout: Duration,
}

impl Default for MirrorConfig {
    fn default() -> Self {
        Self {
            cluster: String::new(),
            sample: 1.0,
            max_body: ByteSize(64 * 1024),
            max_in_flight: 64,
            timeout: Duration::from_secs(5),
        }
    }
}

/// Every route's `mirror` rules; `clusters`: the names defined.
pub(crate) fn check(config: &crate::Config, p: &mut crate::validate::Problems) {
    let routes = crate::locate::KeyPath::root().key("routes");
    for (i, r) in config.routes.iter().enumerate() {
        let Some(m) = &r.mirror else { continue };
        let at = routes.index(i).key("mirror");
        if !config.clusters.iter().any(|c| c.name == m.cluster) {
            let names: Vec<&str> = config.clusters.iter().map(|c| c.name.as_str()).collect();
            p.push(
                at.key("cluster"),
                format!(
                    "unknown cluster {:?}; expected one of: {}",
                    m.cluster,
                    names.join(", ")
                ),
            );
        }
        if !(0.0..=1.0).contains(&m.sample) {
            p.push(
                at.key("sample"),
                format!(
                    "{} is not a ratio; expected a number from 0.0 to 1.0",
                    m.sample
                ),
            );
        }
        if m.max_in_flight == 0 {
            p.push(at.key("max_in_flight"), "must be at least 1");
        }
        p.positive(at.key("timeout"), m.timeout);
    }
}
