//! Eureka: the `UP` instances of an application (`GET <serviceUrl>/apps/<APP>`), asked every
//! `discovery.interval`. The service URLs are tried in order, starting from the last one that
//! answered.

use http::StatusCode;
use serde_json::Value;

use crate::fetch::{Failure, Fetcher};
use keymaster_config::{EurekaConfig, OriginServerConfig};

pub(super) struct Eureka {
    /// One per service URL, with the path of the application under it.
    registries: Vec<(Fetcher, String)>,
    /// The registry asked first: the last one that answered.
    current: usize,
    /// The cluster speaks TLS to its servers: use their `securePort`.
    secure: bool,
}

impl Eureka {
    /// `key` is the table's config key path (for messages).
    pub(super) fn new(e: &EurekaConfig, secure: bool, key: &str) -> Result<Eureka, String> {
        let app = e.app.to_ascii_uppercase();
        let registries = e
            .urls
            .iter()
            .map(|u| {
                let f = Fetcher::new(u, e.ca.as_deref(), e.timeout.get(), e.max_size.0, key)?;
                let path = format!("{}/apps/{app}", f.base_path());
                Ok((f, path))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Eureka {
            registries,
            current: 0,
            secure,
        })
    }

    /// The application's servers, from the first registry that answers. An application the
    /// registry does not know (404) has none.
    pub(super) async fn next(&mut self) -> Result<Vec<OriginServerConfig>, Failure> {
        let n = self.registries.len();
        let mut last = ("error", "no registry".to_string());
        for i in 0..n {
            let at = (self.current + i) % n;
            let (fetcher, path) = &self.registries[at];
            match fetcher
                .get_any(path, std::time::Duration::ZERO, &http::HeaderMap::new())
                .await
            {
                Ok(a) if a.status == StatusCode::OK => {
                    self.current = at;
                    return parse(&a.body, self.secure).map_err(|e| ("invalid", e));
                }
                Ok(a) if a.status == StatusCode::NOT_FOUND => {
                    self.current = at;
                    return Ok(Vec::new());
                }
                Ok(a) => last = ("status", format!("HTTP {}", a.status)),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// The servers of an `/apps/<APP>` answer: `UP` instances, by `ipAddr` and `port` (or
/// `securePort`), weighted by a numeric `metadata.weight` where one is set.
fn parse(body: &[u8], secure: bool) -> Result<Vec<OriginServerConfig>, String> {
    let doc: Value =
        serde_json::from_slice(body).map_err(|e| format!("not an application answer: {e}"))?;
    let instances = match doc.pointer("/application/instance") {
        Some(Value::Array(a)) => a.iter().collect(),
        Some(one @ Value::Object(_)) => vec![one],
        None if doc.get("application").is_some() => Vec::new(),
        _ => return Err("not an application answer: no application.instance".into()),
    };
    let port_key = if secure { "securePort" } else { "port" };
    let mut out = Vec::new();
    for i in instances {
        if i.get("status").and_then(Value::as_str) != Some("UP") {
            continue;
        }
        let Some(host) = i
            .get("ipAddr")
            .and_then(Value::as_str)
            .filter(|h| !h.is_empty())
        else {
            continue;
        };
        let Some(port) = i.get(port_key).and_then(enabled_port) else {
            continue;
        };
        let weight = i
            .pointer("/metadata/weight")
            .and_then(|w| w.as_str()?.parse::<u32>().ok())
            .unwrap_or(1);
        if weight == 0 {
            continue;
        }
        out.push(OriginServerConfig {
            address: super::registry::authority(host, port),
            weight: weight.min(keymaster_config::MAX_WEIGHT),
        });
    }
    Ok(out)
}

/// `{"$": 8080, "@enabled": "true"}` → 8080; a disabled port → `None`.
fn enabled_port(p: &Value) -> Option<u16> {
    let enabled = match p.get("@enabled") {
        Some(Value::String(s)) => s == "true",
        Some(Value::Bool(b)) => *b,
        _ => true,
    };
    let port = match p.get("$")? {
        Value::Number(n) => n.as_u64()?,
        Value::String(s) => s.parse().ok()?,
        _ => return None,
    };
    u16::try_from(port).ok().filter(|p| enabled && *p != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(v: &[OriginServerConfig]) -> Vec<(&str, u32)> {
        v.iter().map(|s| (s.address.as_str(), s.weight)).collect()
    }

    #[test]
    fn up_instances_with_enabled_ports() {
        let body = br#"{"application": {"name": "API", "instance": [
          {"instanceId": "a", "ipAddr": "10.0.0.1", "status": "UP",
           "port": {"$": 8080, "@enabled": "true"}, "securePort": {"$": 8443, "@enabled": "true"},
           "metadata": {"weight": "4"}},
          {"instanceId": "b", "ipAddr": "10.0.0.2", "status": "OUT_OF_SERVICE",
           "port": {"$": 8080, "@enabled": "true"}},
          {"instanceId": "c", "ipAddr": "10.0.0.3", "status": "UP",
           "port": {"$": 8080, "@enabled": "false"}, "securePort": {"$": 443, "@enabled": "false"}}
        ]}}"#;
        assert_eq!(addrs(&parse(body, false).unwrap()), [("10.0.0.1:8080", 4)]);
        assert_eq!(addrs(&parse(body, true).unwrap()), [("10.0.0.1:8443", 4)]);
    }

    #[test]
    fn one_instance_is_an_object() {
        let body = br#"{"application": {"name": "API", "instance":
          {"ipAddr": "::1", "status": "UP", "port": {"$": "81", "@enabled": true}}}}"#;
        assert_eq!(addrs(&parse(body, false).unwrap()), [("[::1]:81", 1)]);
        assert!(parse(br#"{"application": {"name": "API"}}"#, false)
            .unwrap()
            .is_empty());
        assert!(parse(b"[]", false).is_err());
    }
}
