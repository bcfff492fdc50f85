//! Validation of the traffic settings (`crate::traffic`): a route's cluster or weighted
//! clusters and its override, and a cluster's `hash` balancer.

use crate::locate::KeyPath;
use crate::model::{Balance, ClusterConfig, Config, RouteConfig};
use crate::traffic::{ClusterOverride, HashConfig, HashOn};
use crate::validate::{check_header_name, Problems, MAX_WEIGHT};

/// Every route's clusters and every cluster's `hash`.
pub(crate) fn check(config: &Config, p: &mut Problems) {
    let root = KeyPath::root();
    let names: Vec<&str> = config.clusters.iter().map(|c| c.name.as_str()).collect();
    for (i, r) in config.routes.iter().enumerate() {
        check_route(r, &root.key("routes").index(i), &names, p);
    }
    for (i, c) in config.clusters.iter().enumerate() {
        check_hash(c, &root.key("clusters").index(i), p);
    }
}

/// A route forwards to `cluster` or splits over `clusters`: one of them, naming clusters
/// that exist.
fn check_route(r: &RouteConfig, at: &KeyPath, clusters: &[&str], p: &mut Problems) {
    if r.clusters.is_empty() {
        if let Some(why) = unknown(&r.cluster, clusters, "missing cluster") {
            p.push(at.key("cluster"), why);
        }
        if r.cluster_override.is_some() {
            p.push(
                at.key("cluster_override"),
                "an override picks one of a route's weighted clusters; expected clusters = [{ name = \"...\", weight = N }, ...] with it",
            );
        }
        return;
    }
    if !r.cluster.is_empty() {
        p.push(
            at.key("cluster"),
            "cluster and clusters are both set; expected one of them (clusters for a weighted split)",
        );
    }
    let base = at.key("clusters");
    for (j, w) in r.clusters.iter().enumerate() {
        let wat = base.index(j);
        if let Some(why) = unknown(&w.name, clusters, "missing cluster name") {
            p.push(wat.key("name"), why);
        } else if let Some(first) = r.clusters[..j].iter().position(|o| o.name == w.name) {
            p.push(
                wat.key("name"),
                format!("cluster {:?} is already listed at {base}[{first}]; expected each cluster once (add the weights)", w.name),
            );
        }
        if !(1..=MAX_WEIGHT).contains(&w.weight) {
            p.push(
                wat.key("weight"),
                format!(
                    "weight {} is out of range; expected 1 to {MAX_WEIGHT}",
                    w.weight
                ),
            );
        }
    }
    if let Some(o) = &r.cluster_override {
        check_override(o, &at.key("cluster_override"), p);
    }
}

/// Why `name` names no cluster (`missing`: what to say when it is empty), if it does not.
fn unknown(name: &str, clusters: &[&str], missing: &str) -> Option<String> {
    if clusters.contains(&name) {
        return None;
    }
    let known = if clusters.is_empty() {
        "no [[clusters]] are defined".to_string()
    } else {
        format!("expected one of: {}", clusters.join(", "))
    };
    let what = if name.is_empty() {
        missing.to_string()
    } else {
        format!("unknown cluster {name:?}")
    };
    Some(format!("{what}; {known}"))
}

fn check_override(o: &ClusterOverride, at: &KeyPath, p: &mut Problems) {
    if o.header.is_none() && o.cookie.is_none() {
        p.push(
            at.clone(),
            "names no header and no cookie; expected e.g. cluster_override = { header = \"x-cluster\" }",
        );
    }
    if let Some(h) = &o.header {
        check_header_name(h, at.key("header"), p);
    }
    if let Some(c) = &o.cookie {
        check_cookie_name(c, at.key("cookie"), p);
    }
}

/// `balance = "hash"` needs a `hash` table, and a `hash` table needs `balance = "hash"`.
fn check_hash(c: &ClusterConfig, at: &KeyPath, p: &mut Problems) {
    let Some(h) = &c.hash else {
        if c.balance == Balance::Hash {
            p.push(
                at.key("hash"),
                "balance = \"hash\" needs a hash table saying what to hash; expected e.g. hash = { key = \"header\", name = \"x-user-id\" }",
            );
        }
        return;
    };
    let hat = at.key("hash");
    if c.balance != Balance::Hash {
        p.push(
            hat.clone(),
            "hash is only used with balance = \"hash\"; expected balance = \"hash\" or no hash table",
        );
    }
    check_hash_key(h, &hat, p);
    if h.generate && h.key != HashOn::Cookie {
        p.push(
            hat.key("generate"),
            format!("a generated cookie needs key = \"cookie\", not {:?}; expected key = \"cookie\" with generate", h.key.as_str()),
        );
    }
    let path = &h.cookie_path;
    if !path.starts_with('/') || path.bytes().any(|b| b == b';' || !b.is_ascii_graphic()) {
        p.push(
            hat.key("cookie_path"),
            format!("{path:?} is not a cookie path; expected a path like \"/\" or \"/app\" (no spaces or ';')"),
        );
    }
    p.positive_opt(hat.key("cookie_max_age"), h.cookie_max_age);
}

/// A header or cookie key names its field; the client IP and the path name nothing.
fn check_hash_key(h: &HashConfig, hat: &KeyPath, p: &mut Problems) {
    let key = h.key.as_str();
    match (h.key, &h.name) {
        (HashOn::Header, Some(n)) => check_header_name(n, hat.key("name"), p),
        (HashOn::Cookie, Some(n)) => check_cookie_name(n, hat.key("name"), p),
        (HashOn::Header | HashOn::Cookie, None) => p.push(
            hat.key("key"),
            format!("key = {key:?} needs the {key}'s name; expected e.g. name = \"x-user-id\""),
        ),
        (HashOn::ClientIp | HashOn::Path, Some(_)) => p.push(
            hat.key("name"),
            format!("key = {key:?} hashes no named field; expected no name, or key = \"header\" or \"cookie\""),
        ),
        (HashOn::ClientIp | HashOn::Path, None) => {}
    }
}

/// A cookie name is an RFC 6265 token: visible ASCII without separators.
fn check_cookie_name(name: &str, at: KeyPath, p: &mut Problems) {
    let separator = |b: u8| b"()<>@,;:\\\"/[]?={}".contains(&b);
    if name.is_empty() || name.bytes().any(|b| !b.is_ascii_graphic() || separator(b)) {
        p.push(
            at,
            format!("{name:?} is not a cookie name; expected a token like \"session\" (no spaces, '=' or ';')"),
        );
    }
}
