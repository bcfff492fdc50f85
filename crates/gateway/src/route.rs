//! Routing: compiled routes matched by priority (host, path, method, headers), and the path
//! rewrite each route applies before forwarding.

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method};
use regex::Regex;
use std::sync::Arc;

mod split;

use crate::metrics::RouteMetrics;
use crate::upstream::Cluster;
use keymaster_config::{HostPolicy, RouteConfig};
use keymaster_http::headers::HeaderEdits;
pub(crate) use split::Split;

/// How a route matches the host.
#[derive(Debug)]
enum HostMatch {
    Any,
    /// Lowercase exact host.
    Exact(String),
    /// Lowercase suffix including the dot: "*.example.com" → ".example.com".
    Wildcard(String),
}

#[derive(Debug)]
enum PathMatch {
    Any,
    Prefix(String),
    Exact(String),
    Regex(Regex),
}

/// What the route does to the path before forwarding.
#[derive(Debug)]
enum Rewrite {
    None,
    StripPrefix(String),
    ReplacePrefix { from: String, to: String },
    ReplacePath(String),
}

/// The Host header sent upstream.
#[derive(Debug)]
pub(crate) enum HostRewrite {
    Preserve,
    Origin,
    Fixed(HeaderValue),
}

/// A route ready for matching.
pub struct Route {
    pub name: Arc<str>,
    host: HostMatch,
    path: PathMatch,
    methods: Vec<Method>,
    headers: Vec<(HeaderName, HeaderValue)>,
    rewrite: Rewrite,
    pub(crate) host_rewrite: HostRewrite,
    pub(crate) request_edits: HeaderEdits,
    pub(crate) response_edits: HeaderEdits,
    /// The route's cluster: its `cluster`, or the first of its weighted `clusters` (whose
    /// timeouts the route's default to).
    pub(crate) cluster: Arc<Cluster>,
    /// Weighted clusters (`clusters`): the split picks the cluster of each request.
    pub(crate) split: Option<Box<Split>>,
    pub(crate) connect_timeout: std::time::Duration,
    pub(crate) response_header_timeout: std::time::Duration,
    /// Longest gap between two reads of the origin's response body.
    pub(crate) read_timeout: std::time::Duration,
    pub(crate) request_timeout: Option<std::time::Duration>,
    pub(crate) max_body_size: u64,
    /// Longest the client may leave its request body with nothing to read (408 past it).
    pub(crate) client_body_timeout: std::time::Duration,
    /// Read the whole request body before contacting the origin (a Content-Length upstream).
    pub(crate) request_buffering: bool,
    /// Which `Upgrade` protocols become tunnels (`upgrade.rs`).
    pub(crate) upgrade: crate::upgrade::UpgradePolicy,
    pub(crate) metrics: RouteMetrics,
    /// Retry policy (`attempts = 1`: none beyond the keep-alive race resend).
    pub(crate) retry: keymaster_config::RetryConfig,
    /// Under overload, lower priorities are shed first.
    pub(crate) shed_priority: keymaster_config::ShedPriority,
    /// The share of requests traced, over the listener's (`[traces]` on).
    pub(crate) trace_sample: Option<f64>,
    /// A sampled share of the route's requests also goes to a shadow cluster.
    pub(crate) mirror: Option<crate::proxy::Mirror>,
    /// Response compression; `None` (the default): bodies pass byte-identical.
    pub(crate) compression: Option<crate::compress::Policy>,
}

impl Route {
    /// `compression`: the route's compiled `compression` settings, if it has them.
    pub(crate) fn compile(
        cfg: &RouteConfig,
        cluster: Arc<Cluster>,
        split: Option<Split>,
        metrics: RouteMetrics,
        compression: Option<crate::compress::Policy>,
    ) -> Result<Route, String> {
        let m = &cfg.matches;
        let host = match m.host.as_deref() {
            None => HostMatch::Any,
            Some(h) => match h.strip_prefix('*') {
                Some(suffix) => HostMatch::Wildcard(suffix.to_ascii_lowercase()),
                None => HostMatch::Exact(h.to_ascii_lowercase()),
            },
        };
        let path = if let Some(p) = &m.path_exact {
            PathMatch::Exact(p.clone())
        } else if let Some(r) = &m.path_regex {
            PathMatch::Regex(Regex::new(r).map_err(|e| e.to_string())?)
        } else if let Some(p) = &m.path_prefix {
            if p == "/" {
                PathMatch::Any
            } else {
                PathMatch::Prefix(p.clone())
            }
        } else {
            PathMatch::Any
        };
        let methods = m
            .methods
            .iter()
            .map(|s| Method::from_bytes(s.as_bytes()).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        let headers = m
            .headers
            .iter()
            .map(|(k, v)| {
                Ok((
                    HeaderName::from_bytes(k.as_bytes()).map_err(|e| e.to_string())?,
                    HeaderValue::from_str(v).map_err(|e| e.to_string())?,
                ))
            })
            .collect::<Result<_, String>>()?;
        let rw = &cfg.rewrite;
        let rewrite = if let Some(p) = &rw.strip_prefix {
            Rewrite::StripPrefix(p.clone())
        } else if let Some(to) = &rw.replace_prefix {
            let from = m
                .path_prefix
                .clone()
                .ok_or("replace_prefix needs match.path_prefix")?;
            Rewrite::ReplacePrefix {
                from,
                to: to.clone(),
            }
        } else if let Some(p) = &rw.replace_path {
            Rewrite::ReplacePath(p.clone())
        } else {
            Rewrite::None
        };
        let host_rewrite = match cfg.host_policy {
            HostPolicy::Preserve => HostRewrite::Preserve,
            HostPolicy::Origin => HostRewrite::Origin,
            HostPolicy::Fixed => HostRewrite::Fixed(
                HeaderValue::from_str(cfg.fixed_host.as_deref().unwrap_or(""))
                    .map_err(|e| e.to_string())?,
            ),
        };
        let c = &cluster.config;
        Ok(Route {
            name: cfg.name.as_str().into(),
            host,
            path,
            methods,
            headers,
            rewrite,
            host_rewrite,
            request_edits: HeaderEdits::compile(&cfg.request_headers)?,
            response_edits: HeaderEdits::compile(&cfg.response_headers)?,
            connect_timeout: cfg.connect_timeout.unwrap_or(c.connect_timeout).get(),
            response_header_timeout: cfg
                .response_header_timeout
                .unwrap_or(c.response_header_timeout)
                .get(),
            read_timeout: cfg.read_timeout.unwrap_or(c.read_timeout).get(),
            request_timeout: cfg.request_timeout.or(c.request_timeout).map(|d| d.get()),
            max_body_size: cfg.max_body_size.get(),
            client_body_timeout: cfg.client_body_timeout.get(),
            request_buffering: cfg.request_buffering,
            upgrade: crate::upgrade::UpgradePolicy::compile(&cfg.upgrade),
            cluster,
            split: split.map(Box::new),
            metrics,
            retry: cfg.retry.clone(),
            shed_priority: cfg.shed_priority,
            trace_sample: cfg.trace_sample,
            mirror: None,
            compression,
        })
    }

    fn matches(&self, host: &str, path: &str, method: &Method, headers: &HeaderMap) -> bool {
        let host_ok = match &self.host {
            HostMatch::Any => true,
            HostMatch::Exact(h) => host.eq_ignore_ascii_case(h),
            HostMatch::Wildcard(suffix) => {
                host.len() > suffix.len()
                    && host.as_bytes()[host.len() - suffix.len()..]
                        .eq_ignore_ascii_case(suffix.as_bytes())
            }
        };
        if !host_ok {
            return false;
        }
        let path_ok = match &self.path {
            PathMatch::Any => true,
            PathMatch::Prefix(p) => path.starts_with(p.as_str()),
            PathMatch::Exact(p) => path == p,
            PathMatch::Regex(r) => r.is_match(path),
        };
        path_ok
            && (self.methods.is_empty() || self.methods.contains(method))
            && self
                .headers
                .iter()
                .all(|(n, v)| headers.get_all(n).iter().any(|got| got == v))
    }

    /// The path (and query) to send upstream, or `None` to forward the target untouched.
    pub(crate) fn rewrite(&self, path: &str, query: Option<&str>) -> Option<String> {
        let new_path = match &self.rewrite {
            Rewrite::None => return None,
            Rewrite::StripPrefix(p) => {
                let rest = path.strip_prefix(p.as_str())?;
                if rest.starts_with('/') {
                    rest.to_string()
                } else {
                    format!("/{rest}")
                }
            }
            Rewrite::ReplacePrefix { from, to } => {
                let rest = path.strip_prefix(from.as_str())?;
                let mut s = String::with_capacity(to.len() + rest.len() + 1);
                s.push_str(to);
                s.push_str(rest);
                if !s.starts_with('/') {
                    s.insert(0, '/');
                }
                s
            }
            Rewrite::ReplacePath(p) => p.clone(),
        };
        Some(match query {
            Some(q) => format!("{new_path}?{q}"),
            None => new_path,
        })
    }
}

/// All routes of one config version, highest priority first (ties in file order).
pub struct Router {
    routes: Vec<Arc<Route>>,
    /// Some route matches on header fields (the request's map is needed to route).
    reads_fields: bool,
}

impl Router {
    pub(crate) fn new(mut routes: Vec<(i32, Arc<Route>)>) -> Router {
        routes.sort_by_key(|(prio, _)| std::cmp::Reverse(*prio)); // stable: file order on ties
        Router {
            reads_fields: routes.iter().any(|(_, r)| !r.headers.is_empty()),
            routes: routes.into_iter().map(|(_, r)| r).collect(),
        }
    }

    /// Whether some route matches on header fields.
    pub(crate) fn reads_fields(&self) -> bool {
        self.reads_fields
    }

    /// The place of the first matching route. `host` must already have its port removed.
    pub(crate) fn find(
        &self,
        host: &str,
        path: &str,
        method: &Method,
        headers: &HeaderMap,
    ) -> Option<usize> {
        self.routes
            .iter()
            .position(|r| r.matches(host, path, method, headers))
    }

    /// The route at `index` (from [`Router::find`]).
    pub(crate) fn get(&self, index: usize) -> &Route {
        &self.routes[index]
    }
}

/// The host of a Host header or authority, without port, for matching.
pub(crate) fn host_without_port(h: &str) -> &str {
    if let Some(rest) = h.strip_prefix('[') {
        // [v6]:port
        return rest.split(']').next().unwrap_or(rest);
    }
    // `name:digits` loses `:digits` (a byte scan from the end; ':' and digits are ASCII, so
    // the cut is on a character boundary).
    let b = h.as_bytes();
    let digits = b.iter().rev().take_while(|c| c.is_ascii_digit()).count();
    match b.len().checked_sub(digits + 1) {
        Some(i) if b[i] == b':' => &h[..i],
        _ => h,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_stripping() {
        assert_eq!(host_without_port("example.com:8080"), "example.com");
        assert_eq!(host_without_port("example.com"), "example.com");
        assert_eq!(host_without_port("[::1]:80"), "::1");
        assert_eq!(host_without_port("127.0.0.1:1"), "127.0.0.1");
        assert_eq!(host_without_port("example.com:"), "example.com");
        assert_eq!(host_without_port("a:b1"), "a:b1");
        assert_eq!(host_without_port("8080"), "8080");
    }
}
