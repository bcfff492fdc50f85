//! Validation of the `[[clusters]]` table (`crate::cluster`): unique names, origin
//! servers (addresses, weights, TLS server names), pools and upstream TLS. Route references
//! to clusters and the `hash` balancer are `validate_traffic`'s; health checks, outlier
//! ejection and caps are `validate_resilience`'s.

use crate::locate::KeyPath;
use crate::model::{ClusterConfig, Config, OriginServerConfig, TlsVersion, UpstreamProtocol};
use crate::validate::{check_host_port, check_unique, Problems, MAX_WEIGHT};
use std::net::IpAddr;

/// Cluster checks (route references to clusters are `validate_traffic`'s).
pub(crate) fn check(config: &Config, p: &mut Problems) {
    let base = KeyPath::root().key("clusters");
    check_unique(
        config.clusters.iter().map(|c| c.name.as_str()),
        &base,
        "cluster",
        p,
    );
    for (i, c) in config.clusters.iter().enumerate() {
        check_cluster(c, &base.index(i), p);
    }
}

fn check_cluster(c: &ClusterConfig, at: &KeyPath, p: &mut Problems) {
    let has_dynamic = c.discovery.as_ref().is_some_and(|d| {
        d.file.is_some() || d.consul.is_some() || d.eureka.is_some() || d.kubernetes.is_some()
    });
    if let Some(d) = &c.discovery {
        let at = at.key("discovery");
        p.positive(at.key("interval"), d.interval);
        crate::registry::check(d, &at, p);
        if d.file.as_ref().is_some_and(|f| f.trim().is_empty()) {
            p.push(
                at.key("file"),
                "must not be empty; expected the path of a server list file",
            );
        }
    }
    if c.servers.is_empty() && !has_dynamic {
        p.push(
            at.key("servers"),
            "no servers; expected at least one, e.g. servers = [{ address = \"10.0.0.5:8080\" }], or a discovery file or registry",
        );
    }
    for (j, s) in c.servers.iter().enumerate() {
        check_server(s, &at.key("servers").index(j), p);
    }
    p.positive(at.key("connect_timeout"), c.connect_timeout);
    p.positive(at.key("response_header_timeout"), c.response_header_timeout);
    p.positive(at.key("read_timeout"), c.read_timeout);
    p.positive_opt(at.key("request_timeout"), c.request_timeout);
    if c.proxy_protocol == crate::model::ProxyProtocol::Any {
        p.push(
            at.key("proxy_protocol"),
            "a cluster sends one PROXY protocol version; expected \"off\", \"v1\" or \"v2\"",
        );
    }
    p.positive(at.key("pool").key("idle_timeout"), c.pool.idle_timeout);
    if c.pool.max_streams == 0 || c.pool.max_streams > 10_000 {
        p.push(
            at.key("pool").key("max_streams"),
            format!(
                "{} is out of range; expected 1 to 10000 concurrent streams per connection",
                c.pool.max_streams
            ),
        );
    }
    check_upstream_tls(c, at, p);
    if c.proxy_protocol != crate::ProxyProtocol::Off && c.protocol != UpstreamProtocol::Http1 {
        p.push(
            at.key("proxy_protocol"),
            format!(
                "a PROXY header names one client per connection, but {:?} connections may be HTTP/2, shared by many clients; expected protocol = \"http1\" with proxy_protocol",
                c.protocol.as_str()
            ),
        );
    }
    if c.pool.max_connections != 0 && c.pool.max_idle > c.pool.max_connections {
        p.push(
            at.key("pool").key("max_idle"),
            format!(
                "max_idle ({}) exceeds pool.max_connections ({}); expected at most max_connections",
                c.pool.max_idle, c.pool.max_connections
            ),
        );
    }
}

fn check_upstream_tls(c: &ClusterConfig, at: &KeyPath, p: &mut Problems) {
    let Some(tls) = &c.tls else {
        if c.protocol == UpstreamProtocol::Auto {
            p.push(
                at.key("protocol"),
                "\"auto\" picks the protocol by ALPN, which needs TLS; expected a tls table, or protocol = \"h2\" (prior knowledge) or \"http1\"",
            );
        }
        return;
    };
    let tat = at.key("tls");
    if let Some(sni) = &tls.sni {
        if !server_name_ok(sni) {
            p.push(
                tat.key("sni"),
                format!("{sni:?} is not a DNS name or IP address; expected e.g. \"api.internal\""),
            );
        }
    }
    if tls.ca.as_ref().is_some_and(|ca| ca.trim().is_empty()) {
        p.push(tat.key("ca"), "must not be empty; expected a PEM file path");
    }
    if let Some(cc) = &tls.client_cert {
        for (key, value) in [("cert", &cc.cert), ("key", &cc.key)] {
            if value.trim().is_empty() {
                p.push(
                    tat.key("client_cert").key(key),
                    "must not be empty; expected a PEM file path",
                );
            }
        }
    }
    if tls.min_version == TlsVersion::Tls13 && tls.max_version == TlsVersion::Tls12 {
        p.push(
            tat.key("max_version"),
            "\"1.2\" is below min_version \"1.3\"; expected max_version at least min_version",
        );
    }
}

/// A server name is a DNS name (letters, digits, hyphens, dots) or an IP address.
fn server_name_ok(name: &str) -> bool {
    if name.parse::<IpAddr>().is_ok() {
        return true;
    }
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

fn check_server(s: &OriginServerConfig, at: &KeyPath, p: &mut Problems) {
    if let Err(why) = check_host_port(&s.address) {
        p.push(
            at.key("address"),
            format!("{:?}: {why}; expected \"host:port\" with an IP address or DNS name, e.g. \"10.0.0.5:8080\" or \"[::1]:8080\"", s.address),
        );
    }
    if !(1..=MAX_WEIGHT).contains(&s.weight) {
        p.push(
            at.key("weight"),
            format!(
                "weight {} is out of range; expected 1 to {MAX_WEIGHT}",
                s.weight
            ),
        );
    }
}
