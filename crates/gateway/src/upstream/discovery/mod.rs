//! Service discovery: the servers of a cluster with `discovery` are DNS names re-resolved on
//! an interval (every address becomes a server), a watched server list file and a service
//! registry's list ([`registry`]: Consul, Eureka, Kubernetes EndpointSlices).
//!
//! This module owns resolution (the `[dns]` resolver: hickory with configured name servers,
//! or the system's), the server list file, the registries' clients and the
//! `keymaster-discovery` thread (its loop here, a watcher task per registry cluster). It does not
//! own the swap: a changed server set is handed to [`Host::apply_discovered`] (the gateway),
//! which rebuilds the snapshot from the running config the way a reload does, so every
//! request still sees one consistent version. Origin identities are interned process-wide,
//! so servers that stay keep their pools; a server that leaves gets no new requests, its
//! in-flight exchanges finish, and each worker's pool sweeper closes its idle connections
//! (`Snapshot::serves` says it is gone).
//!
//! A failed round (DNS error, no addresses, unreadable or malformed file) keeps the previous
//! server list, logs a warning and counts `keymaster_discovery_errors_total{cluster, source}`;
//! a failed registry keeps its last list (see [`registry`]).

mod consul;
mod eureka;
mod kubernetes;
pub(crate) mod registry;

use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::{Resolver, TokioResolver};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Host;
use keymaster_config::{ClusterConfig, Config, DiscoveryConfig, DnsConfig, OriginServerConfig};
use registry::Listed;

/// One resolved origin server.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Endpoint {
    pub(crate) addr: SocketAddr,
    /// `host:port` as configured (the Host header of the `origin` policy).
    pub(crate) authority: String,
    pub(crate) weight: u32,
}

/// What a discovered list was resolved from: a reload that changes it resolves anew.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Source {
    servers: Vec<OriginServerConfig>,
    discovery: DiscoveryConfig,
    dns: DnsConfig,
}

impl Source {
    /// `None` for a cluster without discovery.
    pub(crate) fn of(c: &ClusterConfig, dns: &DnsConfig) -> Option<Source> {
        Some(Source {
            servers: c.servers.clone(),
            discovery: c.discovery.clone()?,
            dns: dns.clone(),
        })
    }
}

/// One cluster's current discovered server list.
pub(crate) struct Discovered {
    pub(crate) source: Source,
    pub(crate) endpoints: Arc<Vec<Endpoint>>,
    /// The registry's part before resolution (its last good list), for clusters with one.
    pub(crate) listed: Option<Listed>,
}

/// Discovered lists by cluster name (the clusters with `discovery` of the running config).
pub(crate) type Lists = HashMap<String, Discovered>;

/// A resolver for `[dns]`: the configured name servers, or the system's configuration.
/// No cache: each round asks again (the interval is the refresh policy).
fn resolver(dns: &DnsConfig) -> Result<TokioResolver, String> {
    let mut builder = if dns.nameservers.is_empty() {
        Resolver::builder_tokio().map_err(|e| format!("system DNS configuration: {e}"))?
    } else {
        let servers = dns
            .nameservers
            .iter()
            .filter_map(|ns| {
                ns.parse::<SocketAddr>()
                    .ok()
                    .or_else(|| ns.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53)))
            })
            .map(|sa| {
                let mut c = NameServerConfig::udp_and_tcp(sa.ip());
                for conn in &mut c.connections {
                    conn.port = sa.port();
                }
                c
            })
            .collect();
        Resolver::builder_with_config(
            ResolverConfig::from_name_servers(servers),
            TokioRuntimeProvider::default(),
        )
    };
    let o = builder.options_mut();
    o.timeout = dns.timeout.get();
    o.attempts = 1;
    o.cache_size = 0;
    builder.build().map_err(|e| format!("DNS resolver: {e}"))
}

/// Split `host:port` (bracketed IPv6 allowed; validation checked the form).
fn host_port(address: &str) -> Option<(&str, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some((host, port.parse().ok()?))
}

/// Resolve a cluster's servers: `servers` plus the file's plus the registry's `listed`,
/// names through `resolver`, sorted. `Err((source, message))`, source being `"file"` or
/// `"dns"`.
pub(crate) async fn resolve(
    c: &ClusterConfig,
    resolver: &TokioResolver,
    listed: &[OriginServerConfig],
) -> Result<Vec<Endpoint>, (&'static str, String)> {
    let mut list = c.servers.clone();
    list.extend_from_slice(listed);
    if let Some(path) = c.discovery.as_ref().and_then(|d| d.file.as_deref()) {
        let text = std::fs::read_to_string(path).map_err(|e| ("file", format!("{path}: {e}")))?;
        list.extend(
            keymaster_config::parse_servers_file(&text)
                .map_err(|e| ("file", format!("{path}: {e}")))?,
        );
    }
    let mut out = Vec::new();
    for s in &list {
        let Some((host, port)) = host_port(&s.address) else {
            return Err(("file", format!("{:?} is not host:port", s.address)));
        };
        let endpoint = |ip: IpAddr| Endpoint {
            addr: SocketAddr::new(ip, port),
            authority: s.address.clone(),
            weight: s.weight,
        };
        match host.parse::<IpAddr>() {
            Ok(ip) => out.push(endpoint(ip)),
            Err(_) => {
                let ips = resolver
                    .lookup_ip(host)
                    .await
                    .map_err(|e| ("dns", format!("{host}: {e}")))?;
                out.extend(ips.iter().map(endpoint));
            }
        }
    }
    out.sort();
    out.dedup_by(|a, b| a.addr == b.addr);
    if out.is_empty() {
        return Err(("dns", "no servers resolved".into()));
    }
    Ok(out)
}

/// The lists for the discovery clusters of `config`: `previous` ones whose source is
/// unchanged are kept, the others resolved now (blocking: on a thread of its own with its own
/// runtime, so it works from any caller, async or not). Used at start and on reload.
pub(crate) fn initial(config: &Config, previous: &Lists) -> Result<Lists, String> {
    let mut lists = Lists::new();
    let mut todo = Vec::new();
    for c in &config.clusters {
        let Some(source) = Source::of(c, &config.dns) else {
            continue;
        };
        match previous.get(&c.name) {
            Some(d) if d.source == source => {
                lists.insert(
                    c.name.clone(),
                    Discovered {
                        source,
                        endpoints: d.endpoints.clone(),
                        listed: d.listed.clone(),
                    },
                );
            }
            _ => todo.push((c, source)),
        }
    }
    if todo.is_empty() {
        return Ok(lists);
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("discovery runtime: {e}"))?;
            rt.block_on(async {
                let r = resolver(&config.dns)?;
                for (c, source) in todo {
                    let listed = registry::first(c).await?;
                    let endpoints = resolve(c, &r, listed.as_deref().map_or(&[], |l| l))
                        .await
                        .map_err(|(src, e)| {
                            format!("cluster {}: discovery ({src}): {e}", c.name)
                        })?;
                    lists.insert(
                        c.name.clone(),
                        Discovered {
                            source,
                            endpoints: Arc::new(endpoints),
                            listed,
                        },
                    );
                }
                Ok::<_, String>(())
            })
        })
        .join()
        .unwrap_or_else(|_| Err("discovery resolution panicked".into()))
    })?;
    Ok(lists)
}

/// Start the `keymaster-discovery` thread: every cluster with `discovery` is resolved again
/// each `interval`, and at once when its registry's list changed; a changed server set goes
/// to [`Host::apply_discovered`]. It stops when `shutdown` says so (its registry watchers
/// with it).
pub(crate) fn spawn<H: Host>(
    shared: Arc<H>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    crate::runtime_thread::spawn("keymaster-discovery", move || async move {
        let mut due: HashMap<String, Instant> = HashMap::new();
        let mut current: Option<(DnsConfig, TokioResolver)> = None;
        let mut watchers = HashMap::new();
        let registry_changed = Arc::new(tokio::sync::Notify::new());
        loop {
            let (clusters, dns) = shared.discovery_settings();
            registry::sync(&mut watchers, &clusters, &shared, &registry_changed);
            let mut next = Instant::now() + Duration::from_secs(3600);
            for c in &clusters {
                let Some(d) = &c.discovery else { continue };
                let at = *due
                    .entry(c.name.clone())
                    .or_insert_with(|| Instant::now() + d.interval.get());
                let watcher = watchers.get_mut(&c.name);
                let listed_changed = watcher
                    .as_ref()
                    .is_some_and(|w| w.latest.has_changed().unwrap_or(false));
                if at <= Instant::now() || listed_changed {
                    let listed = watcher.map(|w| w.latest.borrow_and_update().clone());
                    round(&*shared, &dns, c, &mut current, listed).await;
                    due.insert(c.name.clone(), Instant::now() + d.interval.get());
                }
                next = next.min(due[&c.name]);
            }
            due.retain(|name, _| {
                clusters
                    .iter()
                    .any(|c| &c.name == name && c.discovery.is_some())
            });
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = shared.discovery_wake().notified() => {}
                _ = registry_changed.notified() => {}
                r = shutdown.changed() => {
                    if r.is_err() || *shutdown.borrow() {
                        break;
                    }
                }
            }
        }
    })
}

/// One discovery round of cluster `c`, with the running version's `dns` settings and its
/// registry's last good list.
async fn round(
    shared: &impl Host,
    dns: &DnsConfig,
    c: &ClusterConfig,
    current: &mut Option<(DnsConfig, TokioResolver)>,
    listed: Option<Listed>,
) {
    if current.as_ref().is_none_or(|(cfg, _)| cfg != dns) {
        match resolver(dns) {
            Ok(r) => *current = Some((dns.clone(), r)),
            Err(e) => {
                fail(shared, c, "dns", &e);
                return;
            }
        }
    }
    let Some((_, r)) = current.as_ref() else {
        return;
    };
    match resolve(c, r, listed.as_deref().map_or(&[], |l| l)).await {
        Ok(endpoints) => {
            let gauge = shared
                .metrics()
                .discovered_servers
                .with_label_values(&[&c.name]);
            gauge.set(endpoints.len() as i64);
            shared.apply_discovered(c, dns, endpoints, listed);
        }
        Err((source, e)) => fail(shared, c, source, &e),
    }
}

fn fail(shared: &impl Host, c: &ClusterConfig, source: &str, error: &str) {
    shared
        .metrics()
        .discovery_errors
        .with_label_values(&[&c.name, source])
        .inc();
    tracing::warn!(cluster = %c.name, source, error, "discovery failed; keeping the previous servers");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_forms() {
        assert_eq!(host_port("10.0.0.1:80"), Some(("10.0.0.1", 80)));
        assert_eq!(host_port("[::1]:8080"), Some(("::1", 8080)));
        assert_eq!(host_port("api.internal:443"), Some(("api.internal", 443)));
        assert_eq!(host_port("api.internal"), None);
        assert_eq!(host_port("api.internal:http"), None);
    }

    #[tokio::test]
    async fn literals_and_the_file_need_no_dns() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("s.txt");
        std::fs::write(&file, "10.0.0.2:80 3\n[::1]:81\n10.0.0.1:80\n").unwrap();
        let c = ClusterConfig {
            name: "c".into(),
            servers: vec![OriginServerConfig {
                address: "10.0.0.1:80".into(),
                weight: 1,
            }],
            discovery: Some(DiscoveryConfig {
                file: Some(file.display().to_string()),
                ..Default::default()
            }),
            ..Default::default()
        };
        // A name server nobody answers on: literals must not ask it.
        let r = resolver(&DnsConfig {
            nameservers: vec!["127.0.0.1:9".into()],
            timeout: keymaster_config::Duration::from_millis(100),
        })
        .unwrap();
        let got = resolve(&c, &r, &[]).await.unwrap();
        let addrs: Vec<String> = got.iter().map(|e| e.addr.to_string()).collect();
        // Sorted, the duplicate 10.0.0.1:80 once, weights kept.
        assert_eq!(addrs, ["10.0.0.1:80", "10.0.0.2:80", "[::1]:81"]);
        assert_eq!(got[1].weight, 3);

        std::fs::write(&file, "10.0.0.2:80 0\n").unwrap();
        let (source, e) = resolve(&c, &r, &[]).await.unwrap_err();
        assert_eq!(source, "file");
        assert!(e.contains("line 1"), "{e}");
        std::fs::remove_file(&file).unwrap();
        assert_eq!(resolve(&c, &r, &[]).await.unwrap_err().0, "file");
    }
}
