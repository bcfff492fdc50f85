//! Validation of `[[filters]]`: names, stages and keys per type, matches and type-specific
//! values, each problem located by its key path.

use crate::locate::KeyPath;
use crate::model::{
    Config, FilterConfig, FilterStage, FilterType, RateLimitBackend, RateLimitKey, RedisConfig,
};
use crate::validate::{
    check_edit_lists, check_header_map, check_header_name, check_header_value, check_path,
    check_unique, is_standard_method, Problems,
};
use std::net::IpAddr;

/// The stages a built-in type may run in.
fn stages_of(kind: FilterType) -> &'static [FilterStage] {
    use FilterStage::*;
    match kind {
        FilterType::Headers => &[Pre, Route, Post],
        FilterType::Redirect => &[Pre, Route],
        FilterType::Static => &[Pre, Route, Error],
        FilterType::Cors => &[Pre],
        FilterType::IpFilter | FilterType::ApiKey | FilterType::RateLimit => &[Pre, Route],
        FilterType::Reroute => &[Route],
        FilterType::Jwt => &[Pre, Route],
        FilterType::Native => &[Pre, Route, Post, Error],
    }
}

/// The type-specific keys a built-in type uses.
fn keys_of(kind: FilterType) -> &'static [&'static str] {
    match kind {
        FilterType::Headers => &["add", "set", "remove"],
        FilterType::Redirect => &["status", "location"],
        FilterType::Static => &["status", "headers", "body"],
        FilterType::Cors => &[
            "allowed_origins",
            "allowed_methods",
            "allowed_headers",
            "allow_credentials",
            "max_age",
        ],
        FilterType::IpFilter => &["allow", "deny"],
        FilterType::ApiKey => &["header", "keys"],
        FilterType::RateLimit => &[
            "requests", "period", "burst", "key", "header", "backend", "scope",
        ],
        FilterType::Reroute => &["cluster", "path", "host"],
        FilterType::Native => &["native", "params"],
        FilterType::Jwt => &[
            "header",
            "jwt_keys",
            "jwks",
            "leeway",
            "issuer",
            "audience",
            "claims_to_headers",
        ],
    }
}

/// Every type-specific key and whether this filter sets it.
fn keys_set(f: &FilterConfig) -> [(&'static str, bool); 22] {
    [
        ("add", !f.add.is_empty()),
        ("set", !f.set.is_empty()),
        ("remove", !f.remove.is_empty()),
        ("status", f.status.is_some()),
        ("location", f.location.is_some()),
        ("headers", !f.headers.is_empty()),
        ("body", f.body.is_some()),
        ("allowed_origins", !f.allowed_origins.is_empty()),
        ("allowed_methods", !f.allowed_methods.is_empty()),
        ("allowed_headers", !f.allowed_headers.is_empty()),
        ("allow_credentials", f.allow_credentials),
        ("max_age", f.max_age.is_some()),
        ("allow", !f.allow.is_empty()),
        ("deny", !f.deny.is_empty()),
        ("header", f.header.is_some()),
        ("keys", !f.keys.is_empty()),
        ("requests", f.requests.is_some()),
        ("period", f.period.is_some()),
        ("burst", f.burst.is_some()),
        ("key", f.key.is_some()),
        ("cluster", f.cluster.is_some()),
        ("path", f.path.is_some()),
    ]
    // `host` is checked separately (the array above is fixed-size for clarity).
}

pub(crate) fn check_filters(config: &Config, p: &mut Problems) {
    let base = KeyPath::root().key("filters");
    check_unique(
        config.filters.iter().map(|f| f.name.as_str()),
        &base,
        "filter",
        p,
    );
    let routes: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
    let clusters: Vec<&str> = config.clusters.iter().map(|c| c.name.as_str()).collect();
    for (i, f) in config.filters.iter().enumerate() {
        check_filter(f, &base.index(i), &routes, &clusters, &config.redis, p);
    }
    check_redis(&config.redis, p);
    check_lua(config, p);
    let b = &config.filter_body;
    let at = KeyPath::root().key("filter_body");
    for (key, v) in [
        ("max_request", b.max_request),
        ("max_response", b.max_response),
    ] {
        if v.0 == 0 || v.0 > 1 << 30 {
            p.push(
                at.key(key),
                "must be between 1 byte and \"1GiB\"; expected a size like \"1MiB\"",
            );
        }
    }
    let d = &config.filter_debug;
    let at = KeyPath::root().key("filter_debug");
    check_header_name(&d.header, at.key("header"), p);
    if let Some(s) = &d.secret {
        if s.len() < 16 {
            p.push(
                at.key("secret"),
                "too short; expected at least 16 characters (it guards internal details)",
            );
        } else {
            check_header_value(s, at.key("secret"), p);
        }
    }
}

/// `[redis]`: a URL of a scheme the client speaks, positive timeouts, a usable prefix.
fn check_redis(r: &RedisConfig, p: &mut Problems) {
    let at = KeyPath::root().key("redis");
    if let Some(url) = &r.url {
        let rest = ["redis://", "redis+unix://", "unix://"]
            .iter()
            .find_map(|scheme| url.strip_prefix(scheme));
        match rest {
            None => p.push(
                at.key("url"),
                format!("{url:?} is not a Redis URL; expected \"redis://host:port[/db]\" or \"redis+unix:///path/to/socket\""),
            ),
            Some(r) if r.is_empty() || r.chars().any(|c| c.is_whitespace()) => p.push(
                at.key("url"),
                format!("{url:?} has no host or socket path; expected e.g. \"redis://127.0.0.1:6379\""),
            ),
            Some(_) => {}
        }
    }
    for (key, d) in [("timeout", r.timeout), ("backoff", r.backoff)] {
        if d.get().is_zero() {
            p.push(
                at.key(key),
                "must be greater than zero; expected a duration like \"50ms\"",
            );
        }
    }
    if r.key_prefix
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        p.push(
            at.key("key_prefix"),
            "must not contain whitespace or control characters; expected e.g. \"keymaster:rl:\"",
        );
    }
}

/// `[lua]`: the directory is checked for form here; whether it exists and its files
/// compile is checked when the filter set is built (start, reload).
/// Every `{ env = "NAME" }` in a parameter table names a variable that is set.
fn check_env_refs(t: &toml::Table, at: &KeyPath, p: &mut Problems) {
    for (k, v) in t {
        if let Err(e) = crate::filters::env_value(v) {
            p.push(at.key(k), format!("{e}; set it, or give the value itself"));
        }
    }
}

fn check_lua(config: &Config, p: &mut Problems) {
    let l = &config.lua;
    let at = KeyPath::root().key("lua");
    for (name, t) in &l.settings {
        check_env_refs(t, &at.key("settings").key(name), p);
    }
    for (i, r) in config.routes.iter().enumerate() {
        let rat = KeyPath::root().key("routes").index(i).key("lua_settings");
        for (name, t) in &r.lua_settings {
            check_env_refs(t, &rat.key(name), p);
        }
    }
    if l.dir.as_deref().is_some_and(|d| d.trim().is_empty()) {
        p.push(
            at.key("dir"),
            "must not be empty; expected a directory path like \"filters\" (or leave it out)",
        );
    }
    if l.poll_interval.get() < std::time::Duration::from_millis(10) {
        p.push(
            at.key("poll_interval"),
            "too short; expected at least \"10ms\", like \"1s\"",
        );
    }
    if l.instruction_budget < 1000 {
        p.push(
            at.key("instruction_budget"),
            "too small; expected at least 1000 instructions, like 1000000",
        );
    }
    if l.memory_limit.0 < 1024 * 1024 {
        p.push(
            at.key("memory_limit"),
            "too small; expected at least \"1MiB\", like \"64MiB\"",
        );
    }
    check_lua_http(l, &at, p);
    if l.http_max_body.0 == 0 {
        p.push(
            at.key("http_max_body"),
            "must be greater than zero; expected a size like \"1MiB\"",
        );
    }
    if l.max_call_time.get() < std::time::Duration::from_millis(1) {
        p.push(
            at.key("max_call_time"),
            "too short; expected at least \"1ms\", like \"100ms\"",
        );
    }
    check_shared_dict(l, &at, p);
}

/// `[lua]` keys of the `ctx.http` client: timeouts, CA file, pool.
fn check_lua_http(l: &crate::LuaConfig, at: &KeyPath, p: &mut Problems) {
    if l.http_max_timeout.get().is_zero() {
        p.push(
            at.key("http_max_timeout"),
            "must be greater than zero; expected a duration like \"30s\"",
        );
    } else if l.http_timeout.get().is_zero() {
        p.push(
            at.key("http_timeout"),
            "must be greater than zero; expected a duration like \"1s\"",
        );
    } else if l.http_timeout.get() > l.http_max_timeout.get() {
        p.push(
            at.key("http_timeout"),
            format!(
                "longer than http_max_timeout (\"{}\"); expected at most that, or a longer \
                 http_max_timeout",
                l.http_max_timeout
            ),
        );
    }
    if l.http_ca_file.as_ref().is_some_and(|f| f.trim().is_empty()) {
        p.push(
            at.key("http_ca_file"),
            "must not be empty; expected a PEM file path (or leave it out for the built-in roots)",
        );
    }
    if l.http_pool_idle_timeout.get() < std::time::Duration::from_millis(10) {
        p.push(
            at.key("http_pool_idle_timeout"),
            "too short; expected at least \"10ms\", like \"30s\"",
        );
    }
    if l.http_pool_max_idle > 1024 {
        p.push(
            at.key("http_pool_max_idle"),
            "too large; expected at most 1024 idle connections per origin (0 turns reuse off)",
        );
    }
}

/// `[lua] shared_dict_size` and `shared_max_value`: a value must fit one shard's share.
fn check_shared_dict(l: &crate::LuaConfig, at: &KeyPath, p: &mut Problems) {
    if l.shared_dict_size.0 < 1024 * 1024 {
        p.push(
            at.key("shared_dict_size"),
            "too small; expected at least \"1MiB\", like \"64MiB\"",
        );
    } else if l.shared_max_value.0 == 0
        || l.shared_max_value.0 > l.shared_dict_size.0 / crate::SHARED_DICT_SHARDS
    {
        p.push(
            at.key("shared_max_value"),
            format!(
                "must be between 1 byte and shared_dict_size / {} ({} bytes, one shard's \
                 share); expected a size like \"1MiB\"",
                crate::SHARED_DICT_SHARDS,
                l.shared_dict_size.0 / crate::SHARED_DICT_SHARDS
            ),
        );
    }
}

pub(crate) fn check_methods(methods: &[String], at: &KeyPath, p: &mut Problems) {
    for (j, method) in methods.iter().enumerate() {
        let path = at.index(j);
        if http::Method::from_bytes(method.as_bytes()).is_err() {
            p.push(
                path,
                format!("{method:?} is not an HTTP method token; expected e.g. \"GET\""),
            );
        } else if method.bytes().any(|b| b.is_ascii_lowercase())
            && is_standard_method(&method.to_ascii_uppercase())
        {
            p.push(
                path,
                format!(
                    "methods are case-sensitive; expected {:?}",
                    method.to_ascii_uppercase()
                ),
            );
        }
    }
}

fn check_ip_list(list: &[String], at: &KeyPath, p: &mut Problems) {
    for (j, entry) in list.iter().enumerate() {
        let t = entry.trim();
        if t.parse::<ipnet::IpNet>().is_err() && t.parse::<IpAddr>().is_err() {
            p.push(
                at.index(j),
                format!("{entry:?} is not an IP address or CIDR block; expected e.g. \"10.0.0.0/8\" or \"192.0.2.7\""),
            );
        }
    }
}

fn check_filter(
    f: &FilterConfig,
    at: &KeyPath,
    routes: &[&str],
    clusters: &[&str],
    redis: &RedisConfig,
    p: &mut Problems,
) {
    let kind = f.kind;
    let stages = stages_of(kind);
    if !stages.contains(&f.stage) {
        let names: Vec<&str> = stages.iter().map(|s| s.as_str()).collect();
        p.push(
            at.key("stage"),
            format!(
                "a {} filter cannot run in stage {:?}; expected one of: {}",
                kind.as_str(),
                f.stage.as_str(),
                names.join(", ")
            ),
        );
    }
    let allowed = keys_of(kind);
    let mut set = keys_set(f).to_vec();
    set.push(("host", f.host.is_some()));
    set.push(("backend", f.backend.is_some()));
    set.push(("scope", f.scope.is_some()));
    set.push(("jwt_keys", !f.jwt_keys.is_empty()));
    set.push(("jwks", f.jwks.is_some()));
    set.push(("leeway", f.leeway.is_some()));
    set.push(("issuer", f.issuer.is_some()));
    set.push(("audience", f.audience.is_some()));
    set.push(("claims_to_headers", !f.claims_to_headers.is_empty()));
    set.push(("native", f.native.is_some()));
    set.push(("params", !f.params.is_empty()));
    for (key, is_set) in set {
        if is_set && !allowed.contains(&key) {
            p.push(
                at.key(key),
                format!(
                    "{key} is not used by a {} filter; expected only: name, type, stage, order, match, {}",
                    kind.as_str(),
                    allowed.join(", ")
                ),
            );
        }
    }

    // match
    let m = &f.matches;
    let mat = at.key("match");
    for (j, r) in m.routes.iter().enumerate() {
        if !routes.contains(&r.as_str()) {
            p.push(
                mat.key("routes").index(j),
                format!(
                    "unknown route {r:?}; expected one of: {}",
                    if routes.is_empty() {
                        "(no routes defined)".to_string()
                    } else {
                        routes.join(", ")
                    }
                ),
            );
        }
    }
    check_path(&m.path_prefix, mat.key("path_prefix"), p);
    check_methods(&m.methods, &mat.key("methods"), p);
    for (j, h) in m.headers.iter().enumerate() {
        check_header_name(h, mat.key("headers").index(j), p);
    }

    match kind {
        FilterType::Headers => {
            if f.add.is_empty() && f.set.is_empty() && f.remove.is_empty() {
                p.push(
                    at.key("type"),
                    "a headers filter edits nothing; expected at least one of add, set, remove",
                );
            }
            check_edit_lists(&f.add, &f.set, &f.remove, at, p);
        }
        FilterType::Redirect => {
            if let Some(s) = f.status {
                if ![301, 302, 303, 307, 308].contains(&s) {
                    p.push(
                        at.key("status"),
                        format!("{s} is not a redirect status; expected 301, 302, 303, 307 or 308"),
                    );
                }
            }
            match &f.location {
                None => p.push(
                    at.key("type"),
                    "a redirect filter needs location; expected location = \"https://example.com/\"",
                ),
                Some(l) if l.is_empty() => p.push(
                    at.key("location"),
                    "must not be empty; expected a URL or path",
                ),
                Some(l) => check_header_value(l, at.key("location"), p),
            }
        }
        FilterType::Static => {
            if let Some(s) = f.status {
                if !(200..=599).contains(&s) {
                    p.push(
                        at.key("status"),
                        format!("{s} is not a final status; expected 200 to 599"),
                    );
                }
            }
            check_header_map(&f.headers, &at.key("headers"), p);
        }
        FilterType::Cors => {
            if f.allowed_origins.is_empty() {
                p.push(
                    at.key("type"),
                    "a cors filter needs allowed_origins; expected e.g. allowed_origins = [\"https://app.example.com\"] or [\"*\"]",
                );
            }
            for (j, o) in f.allowed_origins.iter().enumerate() {
                let ok = o == "*"
                    || ((o.starts_with("http://") || o.starts_with("https://"))
                        && !o.ends_with('/')
                        && http::HeaderValue::from_str(o).is_ok());
                if !ok {
                    p.push(
                        at.key("allowed_origins").index(j),
                        format!("{o:?} is not an origin; expected \"*\" or scheme://host[:port] without a path, e.g. \"https://app.example.com\""),
                    );
                }
            }
            check_methods(&f.allowed_methods, &at.key("allowed_methods"), p);
            for (j, h) in f.allowed_headers.iter().enumerate() {
                check_header_name(h, at.key("allowed_headers").index(j), p);
            }
            if let Some(d) = f.max_age {
                if d.get().as_secs() == 0 {
                    p.push(
                        at.key("max_age"),
                        "must be at least one second; expected e.g. \"10m\"",
                    );
                }
            }
        }
        FilterType::IpFilter => {
            if f.allow.is_empty() && f.deny.is_empty() {
                p.push(
                    at.key("type"),
                    "an ip_filter needs allow or deny; expected e.g. deny = [\"10.0.0.0/8\"]",
                );
            }
            check_ip_list(&f.allow, &at.key("allow"), p);
            check_ip_list(&f.deny, &at.key("deny"), p);
        }
        FilterType::ApiKey => {
            if let Some(h) = &f.header {
                check_header_name(h, at.key("header"), p);
            }
            if f.keys.is_empty() {
                p.push(
                    at.key("type"),
                    "an api_key filter needs keys; expected keys = [\"...\"]",
                );
            }
            for (j, k) in f.keys.iter().enumerate() {
                if k.is_empty() {
                    p.push(at.key("keys").index(j), "must not be empty");
                } else {
                    check_header_value(k, at.key("keys").index(j), p);
                }
            }
        }
        FilterType::RateLimit => {
            match f.requests {
                None => p.push(
                    at.key("type"),
                    "a rate_limit filter needs requests; expected e.g. requests = 100 (per period, default 1s)",
                ),
                Some(0) => p.push(at.key("requests"), "must be greater than zero"),
                Some(_) => {}
            }
            if let Some(d) = f.period {
                if d.get().is_zero() {
                    p.push(
                        at.key("period"),
                        "must be greater than zero; expected a duration like \"1s\"",
                    );
                }
            }
            if f.burst == Some(0) {
                p.push(at.key("burst"), "must be greater than zero");
            }
            match (f.key.unwrap_or_default(), &f.header) {
                (RateLimitKey::Header, None) => p.push(
                    at.key("key"),
                    "key = \"header\" needs header; expected header = \"x-api-key\" or similar",
                ),
                (RateLimitKey::Header, Some(h)) => check_header_name(h, at.key("header"), p),
                (_, Some(_)) => p.push(
                    at.key("header"),
                    "header is only used with key = \"header\"; expected key = \"header\" or no header",
                ),
                (_, None) => {}
            }
            if f.backend == Some(RateLimitBackend::Redis) && redis.url.is_none() {
                p.push(
                    at.key("backend"),
                    "backend = \"redis\" needs the [redis] table's url; expected [redis] url = \"redis://127.0.0.1:6379\"",
                );
            }
        }
        FilterType::Jwt => crate::validate_jwt::check_jwt(f, at, p),
        FilterType::Native => {
            if f.native.as_deref().is_none_or(|n| n.trim().is_empty()) {
                p.push(
                    at.key("native"),
                    "missing; expected the name of a native filter type built into this binary",
                );
            }
            check_env_refs(&f.params, &at.key("params"), p);
        }
        FilterType::Reroute => {
            if f.cluster.is_none() && f.path.is_none() && f.host.is_none() {
                p.push(
                    at.key("type"),
                    "a reroute filter changes nothing; expected at least one of cluster, path, host",
                );
            }
            if let Some(c) = &f.cluster {
                if !clusters.contains(&c.as_str()) {
                    p.push(
                        at.key("cluster"),
                        format!(
                            "unknown cluster {c:?}; expected one of: {}",
                            clusters.join(", ")
                        ),
                    );
                }
            }
            check_path(&f.path, at.key("path"), p);
            if let Some(h) = &f.host {
                if h.is_empty() {
                    p.push(
                        at.key("host"),
                        "must not be empty; expected e.g. \"api.internal\"",
                    );
                } else {
                    check_header_value(h, at.key("host"), p);
                }
            }
        }
    }
}
