//! Traffic splitting settings: a route's weighted clusters (canary splits) and the tester's
//! override of the pick, and a cluster's consistent hashing (`balance = "hash"`) with its
//! optional generated affinity cookie. Every key is documented in `docs/configuration.md`.

use serde::{Deserialize, Serialize};

use crate::units::Duration;

/// One cluster of a route's weighted split (`clusters = [{ name, weight }]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WeightedCluster {
    /// The `[[clusters]]` entry (must exist; each at most once per route).
    pub name: String,
    /// Relative share of the route's requests, 1 to 10000.
    pub weight: u32,
}

/// Where a client (a tester) may name the cluster of a weighted route; a value that names
/// none of the route's clusters is ignored (the weights decide).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterOverride {
    /// A request header whose value is a cluster name (checked first).
    pub header: Option<String>,
    /// A cookie whose value is a cluster name.
    pub cookie: Option<String>,
}

/// What a `hash` balancer hashes.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum HashOn {
    /// The value of the request header `name` (the first field of that name).
    Header,
    /// The value of the cookie `name`.
    Cookie,
    /// The client's IP address (the PROXY protocol's, on a PROXY listener).
    ClientIp,
    /// The canonical request path, without the query.
    Path,
}

impl HashOn {
    pub fn as_str(self) -> &'static str {
        match self {
            HashOn::Header => "header",
            HashOn::Cookie => "cookie",
            HashOn::ClientIp => "client_ip",
            HashOn::Path => "path",
        }
    }
}

/// Consistent hashing of a cluster with `balance = "hash"` (`[clusters.hash]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HashConfig {
    /// `"header"`, `"cookie"`, `"client_ip"` or `"path"`.
    pub key: HashOn,
    /// The header or cookie name (`key = "header"` or `"cookie"` only).
    #[serde(default)]
    pub name: Option<String>,
    /// `key = "cookie"` only: when the request has no such cookie, the gateway makes a
    /// value, hashes it to pick the server and sets the cookie on the response.
    #[serde(default)]
    pub generate: bool,
    /// `Path` of a generated cookie.
    #[serde(default = "root_path")]
    pub cookie_path: String,
    /// `Max-Age` of a generated cookie; absent: a session cookie.
    #[serde(default)]
    pub cookie_max_age: Option<Duration>,
    /// A generated cookie is marked `Secure` (sent by browsers over HTTPS only).
    #[serde(default)]
    pub cookie_secure: bool,
}

fn root_path() -> String {
    "/".into()
}
