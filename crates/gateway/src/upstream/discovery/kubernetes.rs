//! Kubernetes: the ready endpoints of a Service's EndpointSlices (`discovery.k8s.io/v1`,
//! selected by the label `kubernetes.io/service-name`), watched. Each turn lists the slices
//! (which gives a `resourceVersion`), then watches from that version; the first change event
//! (a slice added, changed or deleted) ends the watch and the slices are listed again. A
//! watch that ends quietly after `wait` is started again; one the server refuses (its
//! version too old, `410 Gone`) falls back to a list.

use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderValue};
use serde::Deserialize;
use std::time::Duration;

use crate::fetch::{Failure, Fetcher};
use keymaster_config::{KubernetesConfig, OriginServerConfig};

/// Where the bearer token comes from.
enum Token {
    None,
    Fixed(String),
    /// Read for every request: service-account tokens rotate.
    File(String),
}

pub(super) struct Kubernetes {
    fetcher: Fetcher,
    /// Path and query of the list (the watch adds to it).
    list: String,
    port: Option<String>,
    token: Token,
    wait: Duration,
    /// The version of the last list: where the next watch starts.
    version: Option<String>,
}

impl Kubernetes {
    /// `key` is the table's config key path (for messages).
    pub(super) fn new(k: &KubernetesConfig, key: &str) -> Result<Kubernetes, String> {
        let fetcher = Fetcher::new(&k.url, k.ca.as_deref(), k.timeout.get(), k.max_size.0, key)?;
        let token = match (&k.token, &k.token_file) {
            (Some(t), _) => {
                let t = keymaster_config::env_value(t).map_err(|e| format!("{key}.token: {e}"))?;
                Token::Fixed(t.as_str().unwrap_or_default().trim().to_string())
            }
            (None, Some(f)) => Token::File(f.clone()),
            (None, None) => Token::None,
        };
        // Names were validated to characters that need no escaping but `/` and `=`.
        let list = format!(
            "{}/apis/discovery.k8s.io/v1/namespaces/{}/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3D{}",
            fetcher.base_path(),
            k.namespace,
            k.service.replace('=', "%3D"),
        );
        Ok(Kubernetes {
            fetcher,
            list,
            port: k.port.clone(),
            token,
            wait: k.wait.get(),
            version: None,
        })
    }

    fn headers(&self) -> Result<HeaderMap, Failure> {
        let token = match &self.token {
            Token::None => return Ok(HeaderMap::new()),
            Token::Fixed(t) => t.clone(),
            Token::File(path) => std::fs::read_to_string(path)
                .map_err(|e| ("error", format!("token_file {path}: {e}")))?
                .trim()
                .to_string(),
        };
        let value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| ("error", "the token is not a header value".to_string()))?;
        Ok(HeaderMap::from_iter([(AUTHORIZATION, value)]))
    }

    /// The next list: at once the first time (and after a failure), then when a slice
    /// changed.
    pub(super) async fn next(&mut self) -> Result<Vec<OriginServerConfig>, Failure> {
        let headers = self.headers()?;
        while let Some(version) = self.version.clone() {
            let watch = format!(
                "{}&watch=1&allowWatchBookmarks=true&resourceVersion={version}&timeoutSeconds={}",
                self.list,
                self.wait.as_secs().max(1)
            );
            let line = match self.fetcher.first_line(&watch, self.wait, &headers).await {
                Ok(line) => line,
                Err(e) => {
                    self.version = None;
                    return Err(e);
                }
            };
            let Some(line) = line else { continue };
            match serde_json::from_slice::<Event>(&line) {
                // A bookmark moves the version on without a change.
                Ok(e) if e.kind == "BOOKMARK" => {
                    self.version = e.object.metadata.resource_version.or(Some(version));
                }
                // A change, or an error (a version too old): list again.
                _ => self.version = None,
            }
        }
        let answer = self
            .fetcher
            .get_any(&self.list, Duration::ZERO, &headers)
            .await?;
        if answer.status != http::StatusCode::OK {
            return Err(("status", format!("HTTP {}", answer.status)));
        }
        let (servers, version) =
            parse(&answer.body, self.port.as_deref()).map_err(|e| ("invalid", e))?;
        self.version = Some(version);
        Ok(servers)
    }
}

#[derive(Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    object: Object,
}

#[derive(Deserialize, Default)]
struct Object {
    #[serde(default)]
    metadata: Metadata,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Metadata {
    resource_version: Option<String>,
}

#[derive(Deserialize)]
struct List {
    metadata: Metadata,
    #[serde(default)]
    items: Vec<Slice>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Slice {
    address_type: String,
    #[serde(default)]
    endpoints: Vec<SliceEndpoint>,
    #[serde(default)]
    ports: Option<Vec<Port>>,
}

#[derive(Deserialize)]
struct SliceEndpoint {
    addresses: Vec<String>,
    #[serde(default)]
    conditions: Conditions,
}

#[derive(Deserialize, Default)]
struct Conditions {
    /// Absent means ready (the API's rule).
    ready: Option<bool>,
}

#[derive(Deserialize)]
struct Port {
    name: Option<String>,
    port: Option<u16>,
}

/// The servers of an EndpointSliceList (ready endpoints, each address at the slice's port
/// named `port`, or its first) and the list's version.
fn parse(body: &[u8], port: Option<&str>) -> Result<(Vec<OriginServerConfig>, String), String> {
    let list: List =
        serde_json::from_slice(body).map_err(|e| format!("not an EndpointSliceList: {e}"))?;
    let version = list
        .metadata
        .resource_version
        .ok_or("not an EndpointSliceList: no metadata.resourceVersion")?;
    let mut out = Vec::new();
    for slice in list.items {
        if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6" | "FQDN") {
            continue;
        }
        let ports = slice.ports.unwrap_or_default();
        let chosen = match port {
            Some(name) => ports.iter().find(|p| p.name.as_deref() == Some(name)),
            None => ports.first(),
        };
        let Some(number) = chosen.and_then(|p| p.port).filter(|p| *p != 0) else {
            continue;
        };
        for e in slice.endpoints {
            if e.conditions.ready == Some(false) {
                continue;
            }
            for a in e.addresses {
                out.push(OriginServerConfig {
                    address: super::registry::authority(&a, number),
                    weight: 1,
                });
            }
        }
    }
    Ok((out, version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_endpoints_at_the_named_port() {
        let body = br#"{"kind": "EndpointSliceList", "metadata": {"resourceVersion": "205"},
          "items": [
            {"addressType": "IPv4",
             "endpoints": [
               {"addresses": ["10.1.0.5"], "conditions": {"ready": true}},
               {"addresses": ["10.1.0.6"], "conditions": {"ready": false, "terminating": true}},
               {"addresses": ["10.1.0.7"]}],
             "ports": [{"name": "metrics", "port": 9090}, {"name": "http", "port": 8080}]},
            {"addressType": "IPv6",
             "endpoints": [{"addresses": ["fd00::9"], "conditions": {"ready": true}}],
             "ports": [{"name": "http", "port": 8081}]},
            {"addressType": "FQDN",
             "endpoints": [{"addresses": ["a.api.test"]}],
             "ports": [{"name": "grpc", "port": 7000}]},
            {"addressType": "IPv4", "endpoints": [{"addresses": ["10.1.0.8"]}], "ports": null}
          ]}"#;
        let (got, version) = parse(body, Some("http")).unwrap();
        let got: Vec<&str> = got.iter().map(|s| s.address.as_str()).collect();
        assert_eq!(got, ["10.1.0.5:8080", "10.1.0.7:8080", "[fd00::9]:8081"]);
        assert_eq!(version, "205");
        // No port named: each slice's first.
        let (got, _) = parse(body, None).unwrap();
        let got: Vec<&str> = got.iter().map(|s| s.address.as_str()).collect();
        assert_eq!(
            got,
            [
                "10.1.0.5:9090",
                "10.1.0.7:9090",
                "[fd00::9]:8081",
                "a.api.test:7000"
            ]
        );
        assert!(parse(br#"{"items": []}"#, None).is_err());
    }
}
