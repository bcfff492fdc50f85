//! A cluster's service registries (`discovery.consul`, `discovery.eureka`,
//! `discovery.kubernetes`): where the
//! registry is, which service it is asked for, and the bounds on each answer. The gateway's
//! discovery thread asks them; this module only describes and validates.

use serde::{Deserialize, Serialize};

use crate::locate::KeyPath;
use crate::units::{ByteSize, Duration};
use crate::validate::Problems;

/// `discovery.consul`: the healthy instances of a service in Consul's catalog, watched with
/// blocking queries (`/v1/health/service/<service>?passing`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ConsulConfig {
    /// The Consul agent's HTTP API, `http://` or `https://`, like `"http://127.0.0.1:8500"`.
    pub url: String,
    /// The service's name in the catalog.
    pub service: String,
    /// Only instances carrying every one of these tags.
    pub tags: Vec<String>,
    /// The datacenter asked (`dc`); absent: the agent's own.
    pub datacenter: Option<String>,
    /// An ACL token (`X-Consul-Token`): a string or `{ env = "NAME" }`.
    pub token: Option<toml::Value>,
    /// How long one blocking query may wait for a change (Consul caps it at 10 minutes).
    pub wait: Duration,
    /// Bound on connecting and answering, beyond `wait`.
    pub timeout: Duration,
    /// Largest answer read.
    pub max_size: ByteSize,
    /// `https`: PEM file of the CA certificates the agent's certificate must chain to.
    /// Absent: the Mozilla root set compiled into the gateway.
    pub ca: Option<String>,
}

impl Default for ConsulConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            service: String::new(),
            tags: Vec::new(),
            datacenter: None,
            token: None,
            wait: Duration::from_secs(30),
            timeout: Duration::from_secs(5),
            max_size: ByteSize(4 * 1024 * 1024),
            ca: None,
        }
    }
}

/// `discovery.eureka`: the `UP` instances of an application in a Eureka registry, asked
/// every `discovery.interval`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EurekaConfig {
    /// The registry's service URLs (Eureka's `serviceUrl`, like
    /// `"http://eureka-1:8761/eureka"`), asked in order: the next one when one fails.
    pub urls: Vec<String>,
    /// The application's name (Eureka upper-cases it).
    pub app: String,
    /// Bound on one request: connect, TLS, request and the whole answer.
    pub timeout: Duration,
    /// Largest answer read.
    pub max_size: ByteSize,
    /// `https`: PEM file of the CA certificates the registry's certificate must chain to.
    pub ca: Option<String>,
}

impl Default for EurekaConfig {
    fn default() -> Self {
        Self {
            urls: Vec::new(),
            app: String::new(),
            timeout: Duration::from_secs(5),
            max_size: ByteSize(4 * 1024 * 1024),
            ca: None,
        }
    }
}

/// `discovery.kubernetes`: the ready endpoints of a Service's EndpointSlices
/// (`discovery.k8s.io/v1`, label `kubernetes.io/service-name`), watched.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// The API server, like `"https://kubernetes.default.svc"` from inside a cluster.
    pub url: String,
    pub namespace: String,
    /// The Service's name.
    pub service: String,
    /// The name of the Service port to use; absent: each slice's first port.
    pub port: Option<String>,
    /// A bearer token: a string or `{ env = "NAME" }`.
    pub token: Option<toml::Value>,
    /// A file holding the bearer token, read for every request (service-account tokens
    /// rotate), like `"/var/run/secrets/kubernetes.io/serviceaccount/token"`.
    pub token_file: Option<String>,
    /// How long one watch waits for a change before it is started again.
    pub wait: Duration,
    /// Bound on connecting and answering, beyond `wait`.
    pub timeout: Duration,
    /// Largest answer read.
    pub max_size: ByteSize,
    /// PEM file of the CA certificates the API server's certificate must chain to, like
    /// `"/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"`.
    pub ca: Option<String>,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            namespace: "default".into(),
            service: String::new(),
            port: None,
            token: None,
            token_file: None,
            wait: Duration::from_secs(60),
            timeout: Duration::from_secs(5),
            max_size: ByteSize(4 * 1024 * 1024),
            ca: None,
        }
    }
}

const MAX_ANSWER: u64 = 64 * 1024 * 1024;

/// The registries of one cluster's `discovery` table (`at` is its key path).
pub(crate) fn check(d: &crate::DiscoveryConfig, at: &KeyPath, p: &mut Problems) {
    let registries = [
        d.consul.is_some(),
        d.eureka.is_some(),
        d.kubernetes.is_some(),
    ];
    if registries.iter().filter(|r| **r).count() > 1 {
        p.push(
            at.clone(),
            "a cluster is discovered from one registry; expected one of consul, eureka or kubernetes",
        );
    }
    if let Some(c) = &d.consul {
        let at = at.key("consul");
        check_url(&c.url, "http://127.0.0.1:8500", &at.key("url"), p);
        check_name(&c.service, &at.key("service"), p);
        for (i, t) in c.tags.iter().enumerate() {
            check_name(t, &at.key("tags").index(i), p);
        }
        if let Some(dc) = &c.datacenter {
            check_name(dc, &at.key("datacenter"), p);
        }
        check_token(c.token.as_ref(), &at, p);
        check_wait(c.wait, &at, p);
        check_bounds(c.timeout, c.max_size, &at, p);
        check_ca(c.ca.as_deref(), [c.url.as_str()].into_iter(), &at, p);
    }
    if let Some(e) = &d.eureka {
        let at = at.key("eureka");
        if e.urls.is_empty() {
            p.push(
                at.key("urls"),
                "no registry; expected e.g. urls = [\"http://127.0.0.1:8761/eureka\"]",
            );
        }
        for (i, u) in e.urls.iter().enumerate() {
            check_url(
                u,
                "http://127.0.0.1:8761/eureka",
                &at.key("urls").index(i),
                p,
            );
        }
        check_name(&e.app, &at.key("app"), p);
        check_bounds(e.timeout, e.max_size, &at, p);
        check_ca(e.ca.as_deref(), e.urls.iter().map(String::as_str), &at, p);
    }
    if let Some(k) = &d.kubernetes {
        let at = at.key("kubernetes");
        check_url(&k.url, "https://kubernetes.default.svc", &at.key("url"), p);
        check_name(&k.namespace, &at.key("namespace"), p);
        check_name(&k.service, &at.key("service"), p);
        if let Some(port) = &k.port {
            check_name(port, &at.key("port"), p);
        }
        check_token(k.token.as_ref(), &at, p);
        if k.token.is_some() && k.token_file.is_some() {
            p.push(
                at.key("token_file"),
                "expected token or token_file, not both",
            );
        }
        if k.token_file.as_ref().is_some_and(|f| f.trim().is_empty()) {
            p.push(
                at.key("token_file"),
                "must not be empty; expected a file path",
            );
        }
        check_wait(k.wait, &at, p);
        check_bounds(k.timeout, k.max_size, &at, p);
        check_ca(k.ca.as_deref(), [k.url.as_str()].into_iter(), &at, p);
    }
}

fn check_token(token: Option<&toml::Value>, at: &KeyPath, p: &mut Problems) {
    if let Some(t) = token {
        if !(t.is_str() || crate::env_reference(t).is_some()) {
            p.push(at.key("token"), "expected a string or { env = \"NAME\" }");
        }
    }
}

fn check_wait(wait: Duration, at: &KeyPath, p: &mut Problems) {
    let wait = wait.get();
    if wait < std::time::Duration::from_secs(1) || wait > std::time::Duration::from_secs(600) {
        p.push(
            at.key("wait"),
            "must be between \"1s\" and \"10m\"; expected a duration like \"30s\"",
        );
    }
}

fn check_url(url: &str, example: &str, at: &KeyPath, p: &mut Problems) {
    let uri = url.parse::<http::Uri>().ok();
    let ok = uri.as_ref().is_some_and(|u| {
        matches!(u.scheme_str(), Some("http" | "https"))
            && u.host().is_some_and(|h| !h.is_empty())
            && u.query().is_none()
    });
    if !ok {
        p.push(
            at.clone(),
            format!(
                "{url:?} is not an http or https URL without a query; expected e.g. {example:?}"
            ),
        );
    }
}

/// A service, application, tag or datacenter name: it goes into a URL path or query.
fn check_name(name: &str, at: &KeyPath, p: &mut Problems) {
    let ok = !name.is_empty()
        && name.len() <= 256
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'='));
    if !ok {
        p.push(
            at.clone(),
            format!("{name:?} is not a name; expected 1 to 256 of A-Z a-z 0-9 - _ . : ="),
        );
    }
}

fn check_bounds(timeout: Duration, max_size: ByteSize, at: &KeyPath, p: &mut Problems) {
    let t = timeout.get();
    if t.is_zero() || t > std::time::Duration::from_secs(60) {
        p.push(
            at.key("timeout"),
            "must be between \"1ms\" and \"60s\"; expected a duration like \"5s\"",
        );
    }
    if max_size.0 == 0 || max_size.0 > MAX_ANSWER {
        p.push(
            at.key("max_size"),
            "must be between 1 byte and \"64MiB\"; expected a size like \"4MiB\"",
        );
    }
}

fn check_ca<'a>(
    ca: Option<&str>,
    mut urls: impl Iterator<Item = &'a str>,
    at: &KeyPath,
    p: &mut Problems,
) {
    match ca {
        Some(ca) if ca.trim().is_empty() => {
            p.push(at.key("ca"), "must not be empty; expected a PEM file path")
        }
        Some(_) if !urls.any(|u| u.starts_with("https://")) => p.push(
            at.key("ca"),
            "ca is only used with https URLs; expected an https:// URL or no ca",
        ),
        _ => {}
    }
}
