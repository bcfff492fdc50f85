//! The Grafana dashboard in `deploy/` queries only metrics a real gateway exports: every
//! `keymaster_*` name in its queries is in `/metrics` after some traffic (one proxied
//! request, one failed one).
mod support;

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

    let (g, _s) = gateway_with_stub();
    assert_eq!(get(g.addr, "/?length=10").await.status, 200);
    // A cluster with no server listening: an error, an upstream connect failure.
    let (closed, _closed_held) = closed_addr();
    // And a filter: its series exist at zero (rejections by the status it answers with).
    let key = "[[filters]]\nname = \"keys\"\ntype = \"api_key\"\nkeys = [\"k\"]\nmatch = { path_prefix = \"/keyed\" }\n";
    let g2 = start_gateway(&config_text(closed, "", key));
    assert_eq!(get(g2.addr, "/").await.status, 502);
    let m = metrics_text(&g).await + &metrics_text(&g2).await;
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
