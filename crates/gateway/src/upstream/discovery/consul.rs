//! Consul's catalog: the instances of a service whose checks all pass
//! (`GET /v1/health/service/<service>?passing=true`), watched with blocking queries: each
//! query names the `X-Consul-Index` of the last answer and Consul holds it until the list
//! changes or `wait` passes.

use serde::Deserialize;
use std::time::Duration;
use tokio::time::Instant;

use crate::fetch::{Failure, Fetcher};
use keymaster_config::{ConsulConfig, OriginServerConfig};

/// One cluster's query and where it stands.
pub(super) struct Consul {
    fetcher: Fetcher,
    /// Path and query without the blocking part.
    path: String,
    wait: Duration,
    /// The index of the last answer; 0 before the first (a query that does not block).
    index: u64,
}

impl Consul {
    /// `key` is the table's config key path (for messages).
    pub(super) fn new(c: &ConsulConfig, key: &str) -> Result<Consul, String> {
        let mut fetcher =
            Fetcher::new(&c.url, c.ca.as_deref(), c.timeout.get(), c.max_size.0, key)?;
        if let Some(token) = &c.token {
            let token =
                keymaster_config::env_value(token).map_err(|e| format!("{key}.token: {e}"))?;
            let token = token.as_str().unwrap_or_default().to_string();
            fetcher = fetcher.header(http::HeaderName::from_static("x-consul-token"), &token);
        }
        // Names were validated to characters that need no escaping in a URL.
        let mut path = format!(
            "{}/v1/health/service/{}?passing=true",
            fetcher.base_path(),
            c.service
        );
        for t in &c.tags {
            path.push_str("&tag=");
            path.push_str(t);
        }
        if let Some(dc) = &c.datacenter {
            path.push_str("&dc=");
            path.push_str(dc);
        }
        Ok(Consul {
            fetcher,
            path,
            wait: c.wait.get(),
            index: 0,
        })
    }

    /// The next list: at once the first time, then when it changed or `wait` passed.
    pub(super) async fn next(&mut self) -> Result<Vec<OriginServerConfig>, Failure> {
        let started = Instant::now();
        let (path, longer) = if self.index == 0 {
            (self.path.clone(), Duration::ZERO)
        } else {
            let path = format!(
                "{}&index={}&wait={}ms",
                self.path,
                self.index,
                self.wait.as_millis()
            );
            // Consul adds up to wait/16 of jitter.
            (path, self.wait + self.wait / 16)
        };
        let answer = match self.fetcher.get(&path, longer).await {
            Ok(a) => a,
            Err(e) => {
                self.index = 0;
                return Err(e);
            }
        };
        let index = answer
            .headers
            .get("x-consul-index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        // Consul's rules: an index that went backwards (a restarted cluster) starts over; one
        // below 1 is taken as 1. An unchanged index that came back early (no change, Consul
        // restarted or a proxy in between) waits a second so the loop cannot spin.
        if index == self.index && started.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        self.index = if index < self.index { 0 } else { index.max(1) };
        parse(&answer.body).map_err(|e| ("invalid", e))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Entry {
    node: Node,
    service: Service,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Node {
    #[serde(default)]
    address: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Service {
    #[serde(default)]
    address: String,
    port: u16,
    #[serde(default)]
    weights: Option<Weights>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Weights {
    passing: u32,
}

/// The servers of an answer: each instance's service address (its node's when empty), its
/// port and its passing weight.
fn parse(body: &[u8]) -> Result<Vec<OriginServerConfig>, String> {
    let entries: Vec<Entry> =
        serde_json::from_slice(body).map_err(|e| format!("not a health/service answer: {e}"))?;
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        let host = if e.service.address.is_empty() {
            e.node.address
        } else {
            e.service.address
        };
        if host.is_empty() || e.service.port == 0 {
            continue;
        }
        let weight = e.service.weights.map_or(1, |w| w.passing);
        if weight == 0 {
            continue;
        }
        out.push(OriginServerConfig {
            address: super::registry::authority(&host, e.service.port),
            weight: weight.min(keymaster_config::MAX_WEIGHT),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_address_wins_and_node_address_fills_in() {
        let body = br#"[
          {"Node": {"Node": "n1", "Address": "10.0.0.1"},
           "Service": {"ID": "a", "Service": "api", "Address": "", "Port": 8080,
                       "Weights": {"Passing": 3, "Warning": 1}},
           "Checks": []},
          {"Node": {"Node": "n2", "Address": "10.0.0.2"},
           "Service": {"ID": "b", "Service": "api", "Address": "fd00::5", "Port": 9090},
           "Checks": []},
          {"Node": {"Node": "n3", "Address": "10.0.0.3"},
           "Service": {"ID": "c", "Service": "api", "Address": "api.internal", "Port": 0}}
        ]"#;
        let got = parse(body).unwrap();
        let got: Vec<(&str, u32)> = got.iter().map(|s| (s.address.as_str(), s.weight)).collect();
        assert_eq!(got, [("10.0.0.1:8080", 3), ("[fd00::5]:9090", 1)]);
        assert!(parse(b"{}")
            .unwrap_err()
            .contains("not a health/service answer"));
    }
}
