//! Service registries as a source of servers: Consul ([`consul`](super::consul)), Eureka
//! ([`eureka`](super::eureka)) and Kubernetes EndpointSlices
//! ([`kubernetes`](super::kubernetes)). Each cluster with one has a watcher task on the
//! discovery thread that asks the registry again and again (Consul's blocking queries and
//! Kubernetes' watches return when the list changes; Eureka is asked every `interval`),
//! keeps its last good list and wakes the discovery loop when the list changes.
//!
//! A registry that fails (down, slow, a bad answer) keeps its last good list: the cluster's
//! servers stay as they were, `keymaster_discovery_registry_up` says 0 and the errors are
//! counted. An empty list counts as an error too and is not applied (like Envoy's panic
//! threshold, a registry that suddenly lists nothing is more likely wrong than right); the
//! passive and active health checks still see to the servers kept.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{watch, Notify};

use super::consul::Consul;
use super::eureka::Eureka;
use super::kubernetes::Kubernetes;
use super::Host;
use crate::fetch::Failure;
use keymaster_config::{ClusterConfig, DiscoveryConfig, OriginServerConfig};

/// A registry's last good list: `host:port` and weight, resolved like configured servers.
pub(crate) type Listed = Arc<Vec<OriginServerConfig>>;

/// A cluster's registry client.
pub(super) enum Registry {
    Consul(Box<Consul>),
    Eureka(Eureka),
    Kubernetes(Box<Kubernetes>),
}

impl Registry {
    /// The registry of cluster `c` (`None` without one). Errors name the config key.
    pub(super) fn of(c: &ClusterConfig) -> Result<Option<Registry>, String> {
        let Some(d) = &c.discovery else {
            return Ok(None);
        };
        let key = |r: &str| format!("cluster {}: discovery.{r}", c.name);
        if let Some(consul) = &d.consul {
            return Consul::new(consul, &key("consul"))
                .map(|c| Some(Registry::Consul(Box::new(c))));
        }
        if let Some(eureka) = &d.eureka {
            return Eureka::new(eureka, c.tls.is_some(), &key("eureka"))
                .map(|e| Some(Registry::Eureka(e)));
        }
        if let Some(k) = &d.kubernetes {
            return Kubernetes::new(k, &key("kubernetes"))
                .map(|k| Some(Registry::Kubernetes(Box::new(k))));
        }
        Ok(None)
    }

    /// The `source` label: `consul`, `eureka` or `kubernetes`.
    pub(super) fn source(&self) -> &'static str {
        match self {
            Registry::Consul(_) => "consul",
            Registry::Eureka(_) => "eureka",
            Registry::Kubernetes(_) => "kubernetes",
        }
    }

    /// The next list: Consul's and Kubernetes' first answer comes at once and later ones
    /// when the list changed (Consul's also when its wait passed); Eureka answers at once
    /// each time.
    pub(super) async fn next(&mut self) -> Result<Vec<OriginServerConfig>, Failure> {
        let mut list = match self {
            Registry::Consul(c) => c.next().await?,
            Registry::Eureka(e) => e.next().await?,
            Registry::Kubernetes(k) => k.next().await?,
        };
        list.sort_by(|a, b| a.address.cmp(&b.address));
        list.dedup_by(|a, b| a.address == b.address);
        Ok(list)
    }
}

/// `host:port`, an IPv6 address in brackets.
pub(super) fn authority(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A running watcher of one cluster.
pub(super) struct Watcher {
    /// What it was started for (a reload that changes it restarts it).
    discovery: DiscoveryConfig,
    pub(super) latest: watch::Receiver<Listed>,
    task: tokio::task::AbortHandle,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Make `watchers` match the registry clusters of `clusters`: start the missing ones (seeded
/// with the list the running version was built from), restart changed ones, stop the rest.
/// Runs on the discovery thread's runtime.
pub(super) fn sync<H: Host>(
    watchers: &mut HashMap<String, Watcher>,
    clusters: &[ClusterConfig],
    shared: &Arc<H>,
    changed: &Arc<Notify>,
) {
    watchers.retain(|name, w| {
        clusters
            .iter()
            .any(|c| &c.name == name && c.discovery.as_ref() == Some(&w.discovery))
    });
    for c in clusters {
        let Some(d) = &c.discovery else { continue };
        let has_registry = d.consul.is_some() || d.eureka.is_some() || d.kubernetes.is_some();
        if !has_registry || watchers.contains_key(&c.name) {
            continue;
        }
        let registry = match Registry::of(c) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => {
                // Checked when the version was built; a token variable unset since then.
                tracing::error!(cluster = %c.name, error = %e, "cannot watch the registry");
                continue;
            }
        };
        let seed = shared.discovered_listed(&c.name).unwrap_or_default();
        let (tx, rx) = watch::channel(seed);
        let task = Task {
            cluster: c.name.clone(),
            registry,
            retry: d.interval.get(),
            poll: d.eureka.is_some().then(|| d.interval.get()),
            tx,
            changed: changed.clone(),
            shared: shared.clone(),
        };
        let handle = tokio::spawn(task.run());
        watchers.insert(
            c.name.clone(),
            Watcher {
                discovery: d.clone(),
                latest: rx,
                task: handle.abort_handle(),
            },
        );
    }
}

/// A watcher's side.
struct Task<H> {
    cluster: String,
    registry: Registry,
    /// The wait after a failed request (doubling, up to 8 times).
    retry: Duration,
    /// Eureka's polling interval (`None`: the registry blocks until a change).
    poll: Option<Duration>,
    tx: watch::Sender<Listed>,
    changed: Arc<Notify>,
    shared: Arc<H>,
}

impl<H: Host> Task<H> {
    async fn run(mut self) {
        let source = self.registry.source();
        let m = self.shared.metrics();
        let up = m
            .discovery_registry_up
            .with_label_values(&[&self.cluster, source]);
        let last_success = m
            .discovery_registry_last_success
            .with_label_values(&[&self.cluster, source]);
        let servers = m
            .discovery_registry_servers
            .with_label_values(&[&self.cluster, source]);
        let errors = m
            .discovery_errors
            .with_label_values(&[&self.cluster, source]);
        let mut failures = 0u32;
        loop {
            let answer = self.registry.next().await;
            let wait = match answer {
                Ok(list) if !list.is_empty() => {
                    failures = 0;
                    up.set(1);
                    let now = SystemTime::now().duration_since(UNIX_EPOCH);
                    last_success.set(now.map_or(0, |d| d.as_secs() as i64));
                    servers.set(list.len() as i64);
                    if **self.tx.borrow() != list {
                        self.tx.send_replace(Arc::new(list));
                        self.changed.notify_one();
                    }
                    self.poll
                }
                Ok(_) => {
                    failures = 0;
                    up.set(1);
                    servers.set(0);
                    errors.inc();
                    tracing::warn!(
                        cluster = %self.cluster, source,
                        kept = self.tx.borrow().len(),
                        "the registry lists no servers; keeping the last ones"
                    );
                    Some(self.poll.unwrap_or(self.retry))
                }
                Err((result, error)) => {
                    failures += 1;
                    up.set(0);
                    errors.inc();
                    tracing::warn!(
                        cluster = %self.cluster, source, %result, %error,
                        kept = self.tx.borrow().len(),
                        "registry request failed; keeping the last servers"
                    );
                    Some(self.retry * (1 << failures.min(4)) / 2)
                }
            };
            if let Some(wait) = wait {
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// The first list of a registry cluster (start, reload): one request, no waiting for a
/// change. An empty answer is an empty list (the cluster's other servers may do).
pub(super) async fn first(c: &ClusterConfig) -> Result<Option<Listed>, String> {
    let Some(mut registry) = Registry::of(c)? else {
        return Ok(None);
    };
    let source = registry.source();
    registry
        .next()
        .await
        .map(|l| Some(Arc::new(l)))
        .map_err(|(_, e)| format!("cluster {}: discovery ({source}): {e}", c.name))
}
