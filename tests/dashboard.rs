//! The Grafana dashboard in `deploy/` queries only metrics a real gateway exports: every
//! `keymaster_*` name in its queries is in `/metrics` after some traffic (one proxied
//! request, one failed one) and with every kind of cluster in use (discovery from a file
//! and from a real Consul, weighted routes, hashing, mirrors, health checks).
mod registry_support;
mod support;
mod tls_support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_queries_exists() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana-dashboard.json");
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("dashboard")).expect("JSON");
    let mut queried = Vec::new();
    for panel in dash["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            let mut rest = expr;
            while let Some(i) = rest.find("keymaster_") {
                let name: String = rest[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                rest = &rest[i + name.len()..];
                if !queried.contains(&name) {
                    queried.push(name);
                }
            }
        }
    }
    assert!(
        queried.len() >= 20,
        "the dashboard queries the metrics: {queried:?}"
    );

    let (g, stub) = gateway_with_stub();
    assert_eq!(get(g.addr, "/?length=10").await.status, 200);
    // A cluster with no server listening: an error, an upstream connect failure.
    let (closed, _closed_held) = closed_addr();
    // And a filter: its series exist at zero (rejections by the status it answers with).
    let key = "[[filters]]\nname = \"keys\"\ntype = \"api_key\"\nkeys = [\"k\"]\nmatch = { path_prefix = \"/keyed\" }\n";
    let g2 = start_gateway(&config_text(closed, "", key));
    assert_eq!(get(g2.addr, "/").await.status, 502);
    // Discovery, traffic management and health checks: their series exist once used.
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("servers.txt");
    std::fs::write(&list, format!("{}\n", stub.local_addr())).unwrap();
    let consul = registry_support::Consul::start().await;
    consul.register("api", "a", stub.local_addr(), 1).await;
    let g3 = start_gateway(&config_text(
        stub.local_addr(),
        "",
        &traffic_config(&list, stub.local_addr(), consul.http),
    ));
    assert_eq!(get(g3.addr, "/split").await.status, 200);
    // A change to the discovered list is an update (the new file replaces the old whole).
    let next = dir.path().join("next.txt");
    std::fs::write(&next, format!("{}\n{closed}\n", stub.local_addr())).unwrap();
    std::fs::rename(&next, &list).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || {
            let m = g3.gateway().metrics_text();
            m.contains("keymaster_discovery_updates_total{cluster=\"listed\"} 1")
                && m.contains("keymaster_health_checks_total{cluster=\"checked\",result=\"pass\"}")
                && m.contains("keymaster_mirror_requests_total")
        })
        .await,
        "{}",
        g3.gateway().metrics_text()
    );
    let m = metrics_text(&g).await + &metrics_text(&g2).await + &metrics_text(&g3).await;
    let exported: Vec<&str> = m
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let missing: Vec<&String> = queried
        .iter()
        .filter(|q| !exported.contains(&q.as_str()))
        .collect();
    assert!(missing.is_empty(), "queried but not exported: {missing:?}");
}

/// A route split by weight between a hash cluster and a health-checked one, mirrored to a
/// cluster with file discovery; and a cluster discovered in Consul.
fn traffic_config(list: &Path, origin: SocketAddr, consul: SocketAddr) -> String {
    format!(
        r#"[[routes]]
name = "split"
match = {{ path_prefix = "/split" }}
clusters = [{{ name = "hashed", weight = 1 }}, {{ name = "checked", weight = 1 }}]
mirror = {{ cluster = "listed" }}

[[clusters]]
name = "hashed"
balance = "hash"
hash = {{ key = "header", name = "x-user" }}
servers = [{{ address = "{origin}" }}]

[[clusters]]
name = "checked"
servers = [{{ address = "{origin}" }}]
health_check = {{ path = "/", interval = "50ms", timeout = "1s" }}

[[clusters]]
name = "listed"
servers = []
discovery = {{ interval = "50ms", file = "{list}" }}

[[clusters]]
name = "registered"
servers = []
discovery = {{ interval = "60s", consul = {{ url = "http://{consul}", service = "api" }} }}
"#,
        list = list.display()
    )
}
