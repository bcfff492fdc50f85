//! Semantic validation of a parsed [`Config`]: every rule runs and every problem is
//! collected with the key path it concerns (the caller turns paths into lines).

use crate::locate::KeyPath;
use crate::model::{
    AdminConfig, Config, HeaderEdits, HostPolicy, ListenerConfig, ListenerProtocol, RouteConfig,
    TlsConfig,
};
use crate::units::Duration;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Largest accepted origin server weight.
pub const MAX_WEIGHT: u32 = 10_000;

/// One semantic problem: where, and what was expected.
#[derive(Debug, Clone)]
pub(crate) struct Problem {
    pub path: KeyPath,
    pub message: String,
}

#[derive(Default)]
pub(crate) struct Problems(pub(crate) Vec<Problem>);

impl Problems {
    pub(crate) fn push(&mut self, path: KeyPath, message: impl Into<String>) {
        self.0.push(Problem {
            path,
            message: message.into(),
        });
    }

    pub(crate) fn positive(&mut self, path: KeyPath, d: Duration) {
        if d.get().is_zero() {
            self.push(
                path,
                "must be greater than zero; expected a duration like \"2s\"",
            );
        }
    }

    pub(crate) fn positive_opt(&mut self, path: KeyPath, d: Option<Duration>) {
        if let Some(d) = d {
            self.positive(path, d);
        }
    }
}

/// Run every rule over `config`.
pub(crate) fn check(config: &Config) -> Vec<Problem> {
    let mut p = Problems::default();
    let root = KeyPath::root();

    let server = root.key("server");
    p.positive(server.key("drain_timeout"), config.server.drain_timeout);
    if config.server.via.is_empty() || http::HeaderValue::from_str(&config.server.via).is_err() {
        p.push(
            server.key("via"),
            format!(
                "{:?} cannot be used in a Via header; expected a non-empty token like \"keymaster\"",
                config.server.via
            ),
        );
    }
    if config.access_log.path.trim().is_empty() {
        p.push(
            root.key("access_log").key("path"),
            "must not be empty; expected a file path or \"-\" for standard output",
        );
    }

    check_admin(&config.admin, &mut p);
    crate::traces::check(config, &mut p);
    crate::mirror::check(config, &mut p);
    check_listeners(config, &mut p);
    crate::validate_cluster::check(config, &mut p);
    for (i, route) in config.routes.iter().enumerate() {
        check_route(route, root.key("routes").index(i), &mut p);
    }
    check_unique(
        config.routes.iter().map(|r| r.name.as_str()),
        &root.key("routes"),
        "route",
        &mut p,
    );
    crate::validate_filters::check_filters(config, &mut p);
    crate::validate_resilience::check(config, &mut p);
    crate::validate_compression::check(config, &mut p);
    crate::validate_traffic::check(config, &mut p);
    check_dns(config, &mut p);
    p.0
}

/// `[dns]`: name servers as "ip" or "ip:port", a positive timeout.
fn check_dns(config: &Config, p: &mut Problems) {
    let at = KeyPath::root().key("dns");
    for (i, ns) in config.dns.nameservers.iter().enumerate() {
        if ns.parse::<IpAddr>().is_err() && ns.parse::<std::net::SocketAddr>().is_err() {
            p.push(
                at.key("nameservers").index(i),
                format!("{ns:?} is not an IP address or ip:port; expected e.g. \"10.0.0.2\" or \"127.0.0.1:5353\""),
            );
        }
    }
    p.positive(at.key("timeout"), config.dns.timeout);
}

/// `[admin]`: positive timeouts and cap; a token of at least 16 visible characters, given
/// either in the file or through an environment variable that is set.
fn check_admin(admin: &AdminConfig, p: &mut Problems) {
    let at = KeyPath::root().key("admin");
    p.positive(at.key("header_read_timeout"), admin.header_read_timeout);
    p.positive(at.key("idle_timeout"), admin.idle_timeout);
    if admin.max_connections == 0 {
        p.push(at.key("max_connections"), "must be greater than zero");
    }
    match (&admin.token, &admin.token_env) {
        (Some(_), Some(_)) => p.push(
            at.key("token_env"),
            "token is set too; expected one of token and token_env",
        ),
        (Some(token), None) => check_token(token, "", at.key("token"), p),
        (None, Some(name)) => {
            let at = at.key("token_env");
            if name.is_empty() || name.contains(['=', '\0']) {
                p.push(at, format!("{name:?} is not an environment variable name; expected e.g. \"KEYMASTER_ADMIN_TOKEN\""));
                return;
            }
            match std::env::var(name) {
                Ok(token) if !token.is_empty() => {
                    check_token(&token, &format!("the value of {name} "), at, p)
                }
                Ok(_) => p.push(at, format!("the environment variable {name} is empty; expected it to hold the admin token")),
                Err(_) => p.push(at, format!("the environment variable {name} is not set; expected it to hold the admin token")),
            }
        }
        (None, None) => {}
    }
}

/// An admin bearer token: long enough to guess at, and sendable as `Bearer <token>`.
/// `what` names where it came from; the token itself never goes into the message.
fn check_token(token: &str, what: &str, at: KeyPath, p: &mut Problems) {
    if token.len() < 16 {
        p.push(
            at,
            format!("{what}is too short; expected at least 16 characters (it guards /reload and /config)"),
        );
    } else if !token.bytes().all(|b| b.is_ascii_graphic()) {
        p.push(
            at,
            format!("{what}has spaces, control or non-ASCII characters; expected visible ASCII characters only"),
        );
    }
}

/// Names must be non-empty and unique; the later duplicate is reported.
pub(crate) fn check_unique<'a>(
    names: impl Iterator<Item = &'a str>,
    base: &KeyPath,
    what: &str,
    p: &mut Problems,
) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, name) in names.enumerate() {
        let path = base.index(i).key("name");
        if name.trim().is_empty() {
            p.push(
                path,
                format!("every {what} needs a name; expected a non-empty string"),
            );
        } else if let Some(first) = seen.get(name) {
            p.push(
                path,
                format!("{what} name {name:?} is already used by {base}[{first}]; expected unique names"),
            );
        } else {
            seen.insert(name, i);
        }
    }
}

fn check_listeners(config: &Config, p: &mut Problems) {
    let base = KeyPath::root().key("listeners");
    if config.listeners.is_empty() {
        p.push(
            base.clone(),
            "no listeners; expected at least one [[listeners]] table",
        );
    }
    check_unique(
        config.listeners.iter().map(|l| l.name.as_str()),
        &base,
        "listener",
        p,
    );
    let mut addresses = HashMap::new();
    for (i, l) in config.listeners.iter().enumerate() {
        let at = base.index(i);
        // Port 0 asks the OS for a fresh port, so it never clashes.
        if l.address.port() == 0 {
            check_listener(l, &at, p);
            continue;
        }
        if let Some(first) = addresses.insert(l.address, i) {
            p.push(
                at.key("address"),
                format!(
                    "address {} is already used by {base}[{first}]; expected a distinct address",
                    l.address
                ),
            );
        }
        if config.admin.listen == Some(l.address) {
            p.push(
                at.key("address"),
                format!(
                    "address {} is also admin.listen; expected a distinct address",
                    l.address
                ),
            );
        }
        check_listener(l, &at, p);
    }
}

fn check_listener(l: &ListenerConfig, at: &KeyPath, p: &mut Problems) {
    p.positive(at.key("header_read_timeout"), l.header_read_timeout);
    p.positive(at.key("idle_timeout"), l.idle_timeout);
    p.positive(at.key("send_timeout"), l.send_timeout);
    // `max_connection_age = "0s"` is off, and `max_requests_per_connection = 0` unlimited:
    // any value is valid.
    for (key, value) in [
        ("max_connections", l.max_connections as u64),
        ("max_request_line", l.max_request_line.get()),
        ("max_header_bytes", l.max_header_bytes.get()),
        ("max_headers", l.max_headers as u64),
    ] {
        if value == 0 {
            p.push(at.key(key), "must be greater than zero");
        }
    }
    for (j, entry) in l.trusted_proxies.iter().enumerate() {
        let t = entry.trim();
        if t.parse::<ipnet::IpNet>().is_err() && t.parse::<IpAddr>().is_err() {
            p.push(
                at.key("trusted_proxies").index(j),
                format!("{entry:?} is not an IP address or CIDR block; expected e.g. \"10.0.0.0/8\" or \"192.0.2.7\""),
            );
        }
    }
    for (j, entry) in l.proxy_protocol_from.iter().enumerate() {
        let t = entry.trim();
        if t.parse::<ipnet::IpNet>().is_err() && t.parse::<IpAddr>().is_err() {
            p.push(
                at.key("proxy_protocol_from").index(j),
                format!("{entry:?} is not an IP address or CIDR block; expected e.g. \"10.0.0.0/8\" or \"192.0.2.7\""),
            );
        }
    }
    if l.proxy_protocol != crate::model::ProxyProtocol::Off && l.proxy_protocol_from.is_empty() {
        p.push(
            at.key("proxy_protocol"),
            "a PROXY protocol listener needs proxy_protocol_from (who may send the header); expected e.g. proxy_protocol_from = [\"10.0.0.0/8\"]",
        );
    }
    check_header_name(&l.request_id_header, at.key("request_id_header"), p);
    if let Some(tls) = &l.tls {
        check_tls(l, tls, &at.key("tls"), p);
    }
}

fn check_tls(l: &ListenerConfig, tls: &TlsConfig, at: &KeyPath, p: &mut Problems) {
    if l.protocol == ListenerProtocol::H2c {
        p.push(
            at.clone(),
            "protocol = \"h2c\" is cleartext HTTP/2; with tls expected protocol = \"auto\" (ALPN picks h2 or http/1.1) or \"http1\"",
        );
    }
    if tls.certificates.is_empty() {
        p.push(
            at.key("certificates"),
            "no certificates; expected at least one, e.g. certificates = [{ cert = \"cert.pem\", key = \"key.pem\" }]",
        );
    }
    for (j, c) in tls.certificates.iter().enumerate() {
        let cat = at.key("certificates").index(j);
        for (key, value) in [("cert", &c.cert), ("key", &c.key)] {
            if value.trim().is_empty() {
                p.push(cat.key(key), "must not be empty; expected a PEM file path");
            }
        }
    }
    let mut seen = Vec::new();
    for (j, proto) in tls.alpn.iter().flatten().enumerate() {
        let path = at.key("alpn").index(j);
        if proto != "h2" && proto != "http/1.1" {
            p.push(
                path,
                format!(
                    "{proto:?} is not a supported ALPN protocol; expected \"h2\" or \"http/1.1\""
                ),
            );
        } else if seen.contains(&proto) {
            p.push(
                path,
                format!("{proto:?} is listed twice; expected each protocol once"),
            );
        } else if proto == "h2" && l.protocol == ListenerProtocol::Http1 {
            p.push(
                path,
                "\"h2\" is offered but the listener's protocol is \"http1\"; expected alpn = [\"http/1.1\"] or protocol = \"auto\"",
            );
        }
        seen.push(proto);
    }
    if let Some(ca) = &tls.client_auth {
        let cat = at.key("client_auth");
        if ca.ca.trim().is_empty() {
            p.push(cat.key("ca"), "must not be empty; expected a PEM file path");
        }
        if let Some(h) = &ca.forward_header {
            check_header_name(h, cat.key("forward_header"), p);
        }
    }
}

pub(crate) fn check_header_name(name: &str, path: KeyPath, p: &mut Problems) {
    if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
        p.push(
            path,
            format!(
                "{name:?} is not a valid HTTP header name; expected a token like \"x-request-id\""
            ),
        );
    }
}

pub(crate) fn check_header_value(value: &str, path: KeyPath, p: &mut Problems) {
    if http::HeaderValue::from_str(value).is_err() {
        p.push(
            path,
            format!("{value:?} is not a valid HTTP header value; expected visible characters without control characters or line breaks"),
        );
    }
}

/// Header maps report the name problem and the value problem on the map key.
pub(crate) fn check_header_map(map: &BTreeMap<String, String>, base: &KeyPath, p: &mut Problems) {
    for (name, value) in map {
        check_header_name(name, base.key(name), p);
        check_header_value(value, base.key(name), p);
    }
}

fn check_edits(edits: &HeaderEdits, base: &KeyPath, p: &mut Problems) {
    check_edit_lists(&edits.add, &edits.set, &edits.remove, base, p);
}

/// Configured header edits (a route's, or a `headers` filter's): valid names and values, and
/// none of the framing fields, which the gateway writes from the body it sends (an edit of
/// them would do nothing, so it is refused rather than silently ignored).
pub(crate) fn check_edit_lists(
    add: &BTreeMap<String, String>,
    set: &BTreeMap<String, String>,
    remove: &[String],
    base: &KeyPath,
    p: &mut Problems,
) {
    check_header_map(add, &base.key("add"), p);
    check_header_map(set, &base.key("set"), p);
    for (j, name) in remove.iter().enumerate() {
        check_header_name(name, base.key("remove").index(j), p);
    }
    let named = (add.keys().map(|n| (n, base.key("add").key(n))))
        .chain(set.keys().map(|n| (n, base.key("set").key(n))))
        .chain((remove.iter().enumerate()).map(|(j, n)| (n, base.key("remove").index(j))));
    for (name, at) in named {
        if ["content-length", "transfer-encoding"]
            .iter()
            .any(|f| name.eq_ignore_ascii_case(f))
        {
            p.push(
                at,
                format!(
                    "{name:?} is written by the gateway from the body it sends and cannot be \
                     edited; expected another field (a filter with a body opt-in replaces the \
                     body, and its length with it)"
                ),
            );
        }
    }
}

/// `host:port` where host is an IPv4 address, a bracketed IPv6 address or a DNS name.
pub(crate) fn check_host_port(address: &str) -> Result<(), String> {
    let (host, port) = if let Some(rest) = address.strip_prefix('[') {
        let (v6, port) = rest
            .split_once("]:")
            .ok_or_else(|| "missing \"]:port\" after the IPv6 address".to_string())?;
        v6.parse::<Ipv6Addr>()
            .map_err(|_| format!("{v6:?} is not an IPv6 address"))?;
        (None, port)
    } else {
        let (host, port) = address
            .rsplit_once(':')
            .ok_or_else(|| "missing the \":port\"".to_string())?;
        if host.contains(':') {
            return Err("an IPv6 address must be in brackets".into());
        }
        (Some(host), port)
    };
    match port.parse::<u16>() {
        Ok(0) | Err(_) => return Err(format!("{port:?} is not a port (1-65535)")),
        Ok(_) => {}
    }
    if let Some(host) = host {
        if !is_hostname(host) {
            return Err(format!("{host:?} is not an IP address or DNS name"));
        }
    }
    Ok(())
}

/// An IPv4 address or a DNS name (letters, digits, hyphens; labels of 1-63 characters).
/// A name whose last label is numeric must be a valid IPv4 address.
pub(crate) fn is_hostname(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() || host.len() > 253 {
        return false;
    }
    let labels_ok = host.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    });
    let last_numeric = host
        .rsplit('.')
        .next()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()));
    labels_ok && (!last_numeric || host.parse::<Ipv4Addr>().is_ok())
}

/// Exact host or `*.` wildcard; IPv4 and IPv6 literals are exact hosts; no port.
/// IPv6 is written without brackets: the gateway strips them (and the port) before matching.
fn check_host_pattern(pattern: &str) -> Result<(), String> {
    if pattern.parse::<Ipv6Addr>().is_ok() {
        return Ok(());
    }
    if let Some(v6) = pattern.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        return Err(format!("write IPv6 hosts without brackets ({v6:?})"));
    }
    if pattern.contains(':') {
        return Err(
            "host patterns do not include a port (the port is ignored when matching)".into(),
        );
    }
    match pattern.strip_prefix("*.") {
        Some(rest) if is_hostname(rest) && rest.parse::<Ipv4Addr>().is_err() => Ok(()),
        Some(_) => Err("the part after \"*.\" is not a DNS name".into()),
        None if pattern.contains('*') => {
            Err("a wildcard is only allowed as a leading \"*.\"".into())
        }
        None if is_hostname(pattern) => Ok(()),
        None => Err("not a host name".into()),
    }
}

pub(crate) fn check_path(path: &Option<String>, at: KeyPath, p: &mut Problems) {
    if let Some(path) = path {
        if !path.starts_with('/') {
            p.push(
                at,
                format!("{path:?} must start with \"/\"; expected e.g. \"/api\""),
            );
        } else if path
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '#')
        {
            p.push(
                at,
                format!(
                    "{path:?} is not a valid request path (no spaces, control characters or \
                     '#'); expected e.g. \"/api\""
                ),
            );
        }
    }
}

fn check_route(r: &RouteConfig, at: KeyPath, p: &mut Problems) {
    let m = &r.matches;
    let mat = at.key("match");
    at_most_one(
        &[
            ("path_prefix", m.path_prefix.is_some()),
            ("path_exact", m.path_exact.is_some()),
            ("path_regex", m.path_regex.is_some()),
        ],
        &mat,
        p,
    );
    check_path(&m.path_prefix, mat.key("path_prefix"), p);
    check_path(&m.path_exact, mat.key("path_exact"), p);
    if let Some(re) = &m.path_regex {
        if let Err(e) = regex::Regex::new(re) {
            let detail = e.to_string().replace('\n', " ");
            p.push(
                mat.key("path_regex"),
                format!("invalid regular expression: {detail}; expected regex crate syntax"),
            );
        }
    }
    crate::validate_filters::check_methods(&m.methods, &mat.key("methods"), p);
    if let Some(host) = &m.host {
        if let Err(why) = check_host_pattern(host) {
            p.push(
                mat.key("host"),
                format!("{host:?}: {why}; expected an exact host like \"api.example.com\" or a wildcard like \"*.example.com\""),
            );
        }
    }
    check_header_map(&m.headers, &mat.key("headers"), p);

    let rw = &r.rewrite;
    let rwp = at.key("rewrite");
    let rewrites = [
        ("strip_prefix", &rw.strip_prefix),
        ("replace_prefix", &rw.replace_prefix),
        ("replace_path", &rw.replace_path),
    ];
    let set: Vec<(&str, bool)> = rewrites.iter().map(|(k, v)| (*k, v.is_some())).collect();
    at_most_one(&set, &rwp, p);
    for (key, value) in rewrites {
        check_path(value, rwp.key(key), p);
    }
    if rw.replace_prefix.is_some() && m.path_prefix.is_none() {
        p.push(
            rwp.key("replace_prefix"),
            "replace_prefix replaces the route's match.path_prefix; expected match.path_prefix to be set",
        );
    }

    match (r.host_policy, &r.fixed_host) {
        (HostPolicy::Fixed, None) => p.push(
            at.key("host_policy"),
            "host_policy = \"fixed\" needs fixed_host; expected fixed_host = \"host[:port]\"",
        ),
        (HostPolicy::Fixed, Some(h)) => {
            if h.is_empty() || http::HeaderValue::from_str(h).is_err() {
                p.push(at.key("fixed_host"), format!("{h:?} is not usable as a Host header; expected e.g. \"api.internal:8080\""));
            }
        }
        (_, Some(_)) => p.push(
            at.key("fixed_host"),
            "fixed_host is only used with host_policy = \"fixed\"; expected host_policy = \"fixed\" or no fixed_host",
        ),
        (_, None) => {}
    }
    check_edits(&r.request_headers, &at.key("request_headers"), p);
    check_edits(&r.response_headers, &at.key("response_headers"), p);
    p.positive_opt(at.key("connect_timeout"), r.connect_timeout);
    p.positive_opt(at.key("response_header_timeout"), r.response_header_timeout);
    p.positive_opt(at.key("read_timeout"), r.read_timeout);
    p.positive_opt(at.key("request_timeout"), r.request_timeout);
    p.positive(at.key("client_body_timeout"), r.client_body_timeout);
    if r.max_body_size.get() == 0 {
        p.push(
            at.key("max_body_size"),
            "must be greater than zero; expected a size like \"10MiB\"",
        );
    }
    let up = at.key("upgrade");
    p.positive(up.key("idle_timeout"), r.upgrade.idle_timeout);
    for (i, proto) in r.upgrade.protocols.iter().enumerate() {
        let name = proto.split('/').next().unwrap_or("");
        if name.is_empty() || http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            p.push(
                up.key("protocols").index(i),
                format!(
                    "{proto:?} is not an upgrade protocol token; expected a name like \"my-proto\""
                ),
            );
        }
    }
}

/// Report when more than one of mutually exclusive keys is set (at the second one); returns
/// how many are set.
fn at_most_one(options: &[(&str, bool)], at: &KeyPath, p: &mut Problems) {
    let given: Vec<&str> = options
        .iter()
        .filter(|(_, set)| *set)
        .map(|(k, _)| *k)
        .collect();
    if given.len() > 1 {
        let all: Vec<&str> = options.iter().map(|(k, _)| *k).collect();
        p.push(
            at.key(given[1]),
            format!(
                "{} are {} set; expected at most one of {}",
                given.join(" and "),
                if given.len() == 2 { "both" } else { "all" },
                all.join(", ")
            ),
        );
    }
}

pub(crate) fn is_standard_method(m: &str) -> bool {
    matches!(
        m,
        "GET" | "HEAD" | "POST" | "PUT" | "DELETE" | "CONNECT" | "OPTIONS" | "TRACE" | "PATCH"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_forms() {
        for ok in [
            "10.0.0.5:80",
            "[::1]:8080",
            "api.internal:443",
            "localhost:1",
            "a-b.c:65535",
        ] {
            assert_eq!(check_host_port(ok), Ok(()), "{ok}");
        }
        for bad in [
            "10.0.0.5",
            "10.0.0.5:0",
            "10.0.0.5:65536",
            "::1:80",
            "[::1]80",
            "[zz]:80",
            ":80",
            "-a.com:80",
            "a..b:80",
            "300.1.1.1:80",
            "a_b:80",
            "host:http",
        ] {
            assert!(check_host_port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn host_patterns() {
        for ok in [
            "example.com",
            "*.example.com",
            "10.1.2.3",
            "::1",
            "API.Example.com",
        ] {
            assert_eq!(check_host_pattern(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "[::1]",
            "*",
            "*.",
            "a.*.com",
            "ex*.com",
            "example.com:80",
            "*.10.0.0.1",
            "a b",
        ] {
            assert!(check_host_pattern(bad).is_err(), "{bad}");
        }
    }
}
