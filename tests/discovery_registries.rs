//! Discovery from real service registries: a Consul dev agent, a Eureka server and a
//! Kubernetes API server, started here (see `registry_support`). The gateway follows health
//! and membership changes, and a registry that goes down keeps the last known servers, with
//! the metrics saying so.
mod registry_support;
mod support;
mod tls_support;
mod traffic_support;

use registry_support::{Consul, Eureka};
use std::collections::BTreeSet;
use std::time::Duration;
use support::*;
use traffic_support::Named;

/// Three origins answering `a`, `b` and `c`.
async fn abc() -> (Named, Named, Named) {
    let a = Named::start("a").await;
    (a, Named::start("b").await, Named::start("c").await)
}

fn config(discovery: &str) -> String {
    format!(
        r#"{PREAMBLE}
[[routes]]
name = "default"
cluster = "api"

[[clusters]]
name = "api"
balance = "round_robin"
servers = []
connect_timeout = "1s"
discovery = {discovery}
"#
    )
}

/// Who served `n` requests (fresh connections); every one must succeed.
async fn served_by(g: &TestGateway, n: usize) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for _ in 0..n {
        let r = get(g.addr, "/").await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        names.insert(String::from_utf8_lossy(&r.body).into_owned());
    }
    names
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// Wait until `n` requests are served by exactly `names`.
async fn until_served_by(g: &TestGateway, names: &[&str], limit: Duration) -> Duration {
    let start = tokio::time::Instant::now();
    let want = set(names);
    loop {
        let got = served_by(g, 12).await;
        if got == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "still served by {got:?}, want {want:?} after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn metric_of(g: &TestGateway, name: &str, source: &str) -> f64 {
    metric(
        &g.gateway().metrics_text(),
        &format!("keymaster_{name}{{cluster=\"api\",source=\"{source}\"}}"),
    )
}

/// `clients` concurrent clients send `each` requests; every one must be a 200 from one of
/// `names`.
async fn load(g: &TestGateway, clients: usize, each: usize, names: &[&str]) {
    let want = set(names);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let addr = g.addr;
        tasks.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let mut seen = Vec::new();
            for _ in 0..each {
                let r = c.get("/").await;
                assert_eq!(r.status, 200, "{:?}", r.body);
                seen.push(String::from_utf8_lossy(&r.body).into_owned());
            }
            seen
        }));
    }
    for t in tasks {
        for name in t.await.unwrap() {
            assert!(want.contains(&name), "served by {name}, want {want:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_blocking_queries_follow_health_and_membership() {
    let consul = Consul::start().await;
    let (a, b, c) = abc().await;
    consul.register("api", "a", a.addr, 1).await;
    consul.register("api", "b", b.addr, 1).await;
    // Interval and wait of a minute: a change can only arrive in time as the answer to a
    // blocking query that Consul held until the list changed.
    let g = start_gateway(&config(&format!(
        r#"{{ interval = "60s", consul = {{ url = "http://{}", service = "api", wait = "60s" }} }}"#,
        consul.http
    )));
    assert_eq!(served_by(&g, 12).await, set(&["a", "b"]));

    let limit = Duration::from_secs(10);
    consul.fail("b").await;
    let took = until_served_by(&g, &["a"], limit).await;
    eprintln!("a failing check reached the gateway within {took:?}");
    consul.register("api", "c", c.addr, 1).await;
    until_served_by(&g, &["a", "c"], limit).await;
    consul.pass("b").await;
    until_served_by(&g, &["a", "b", "c"], limit).await;
    consul.deregister("a").await;
    until_served_by(&g, &["b", "c"], limit).await;

    assert_eq!(metric_of(&g, "discovery_registry_up", "consul"), 1.0);
    assert_eq!(metric_of(&g, "discovery_registry_servers", "consul"), 2.0);
    assert!(
        metric_of(
            &g,
            "discovery_registry_last_success_timestamp_seconds",
            "consul"
        ) > 1e9
    );
    assert_eq!(metric_of(&g, "discovery_errors_total", "consul"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_down_keeps_the_last_servers() {
    let mut consul = Consul::start().await;
    let (a, b, c) = abc().await;
    consul.register("api", "a", a.addr, 1).await;
    consul.register("api", "b", b.addr, 1).await;
    let g = start_gateway(&config(&format!(
        r#"{{ interval = "200ms", consul = {{ url = "http://{}", service = "api", wait = "30s", timeout = "1s" }} }}"#,
        consul.http
    )));
    assert_eq!(served_by(&g, 12).await, set(&["a", "b"]));

    // Down: requests under concurrency keep going to the last servers.
    consul.kill();
    assert!(
        eventually(Duration::from_secs(10), || {
            metric_of(&g, "discovery_registry_up", "consul") == 0.0
                && metric_of(&g, "discovery_errors_total", "consul") >= 2.0
        })
        .await,
        "the metrics do not say the registry is down"
    );
    load(&g, 8, 50, &["a", "b"]).await;
    assert_eq!(served_by(&g, 12).await, set(&["a", "b"]));

    // Back, but empty (a dev agent forgets its catalog): the empty list is not applied.
    let errors = metric_of(&g, "discovery_errors_total", "consul");
    consul.restart().await;
    assert!(
        eventually(Duration::from_secs(15), || {
            metric_of(&g, "discovery_registry_up", "consul") == 1.0
                && metric_of(&g, "discovery_errors_total", "consul") > errors
        })
        .await,
        "the registry is not seen back"
    );
    assert_eq!(served_by(&g, 12).await, set(&["a", "b"]));
    // Then it lists a server again: that list is applied.
    consul.register("api", "c", c.addr, 1).await;
    until_served_by(&g, &["c"], Duration::from_secs(15)).await;
    assert_eq!(metric_of(&g, "discovery_registry_servers", "consul"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_with_acls_needs_the_token() {
    let consul = Consul::start_acl(Some("s3cret-token")).await;
    let a = Named::start("a").await;
    consul.register("api", "a", a.addr, 1).await;
    // Without the token, a deny-by-default agent lists nothing: the config is refused.
    let text = |token: &str| {
        config(&format!(
            r#"{{ consul = {{ url = "http://{}", service = "api"{token} }} }}"#,
            consul.http
        ))
    };
    let config = keymaster_config::load_str(&text(""), "<test>").unwrap();
    let e = Gateway::start(config, ConfigSource::Memory)
        .err()
        .expect("no servers");
    assert!(e.contains("no servers"), "{e}");
    // With it, the service's instances.
    let g = start_gateway(&text(r#", token = "s3cret-token""#));
    assert_eq!(served_by(&g, 4).await, set(&["a"]));
    let shown = admin_get(&g, "/config").await;
    assert!(!String::from_utf8_lossy(&shown.body).contains("s3cret"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_unreachable_at_start_rejects_the_config() {
    let (closed, _closed_held) = closed_addr();
    let text = config(&format!(
        r#"{{ consul = {{ url = "http://{closed}", service = "api", timeout = "500ms" }} }}"#
    ));
    let config = keymaster_config::load_str(&text, "<test>").unwrap();
    let e = Gateway::start(config, ConfigSource::Memory)
        .err()
        .expect("a registry that cannot be asked fails the start");
    assert!(
        e.contains("cluster api: discovery (consul)") && e.contains(&closed.to_string()),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eureka_follows_status_and_keeps_the_last_servers_when_down() {
    let mut eureka = Eureka::start().await;
    let (a, b, c) = abc().await;
    eureka.register("api", "a", a.addr).await;
    eureka.register("api", "b", b.addr).await;
    // The first service URL is dead: the second one answers.
    let (dead, _dead_held) = closed_addr();
    let g = start_gateway(&config(&format!(
        r#"{{ interval = "300ms", eureka = {{ urls = ["http://{dead}/eureka", "http://{}/eureka"], app = "api", timeout = "2s" }} }}"#,
        eureka.http
    )));
    assert_eq!(served_by(&g, 12).await, set(&["a", "b"]));

    let limit = Duration::from_secs(15);
    eureka.status("api", "b", "OUT_OF_SERVICE").await;
    until_served_by(&g, &["a"], limit).await;
    eureka.register("api", "c", c.addr).await;
    until_served_by(&g, &["a", "c"], limit).await;
    eureka.status("api", "b", "UP").await;
    until_served_by(&g, &["a", "b", "c"], limit).await;
    eureka.deregister("api", "a").await;
    until_served_by(&g, &["b", "c"], limit).await;
    assert_eq!(metric_of(&g, "discovery_registry_up", "eureka"), 1.0);
    assert_eq!(metric_of(&g, "discovery_registry_servers", "eureka"), 2.0);

    eureka.kill();
    assert!(
        eventually(Duration::from_secs(10), || {
            metric_of(&g, "discovery_registry_up", "eureka") == 0.0
                && metric_of(&g, "discovery_errors_total", "eureka") >= 1.0
        })
        .await,
        "the metrics do not say the registry is down"
    );
    load(&g, 8, 50, &["b", "c"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_endpointslices_follow_readiness_and_membership() {
    let mut kube = registry_support::kube::Kube::start().await;
    let (a, b, c) = abc().await;
    // FQDN endpoints (the API server refuses loopback addresses), which the gateway's
    // resolver turns into 127.0.0.1 through this DNS responder.
    let ips = std::sync::Arc::new(std::sync::Mutex::new(vec![std::net::Ipv4Addr::LOCALHOST]));
    let dns = support::dns::dns_server(ips).await;
    kube.create_slice("api", "api-a", "a.api.test", a.addr.port());
    kube.create_slice("api", "api-b", "b.api.test", b.addr.port());
    kube.create_slice("other", "other-c", "c.api.test", c.addr.port());
    // Interval and wait of a minute: a change arrives in time only through the watch.
    let text = config(&format!(
        r#"{{ interval = "60s", kubernetes = {{ url = "{}", service = "api", port = "http", token = "{}", ca = "{}", wait = "60s" }} }}

[dns]
nameservers = ["{dns}"]"#,
        kube.url,
        registry_support::kube::TOKEN,
        kube.ca.display()
    ));
    let g = start_gateway(&text);
    assert_eq!(served_by(&g, 12).await, set(&["a", "b"]));

    let limit = Duration::from_secs(10);
    kube.set_ready("api-b", "b.api.test", false);
    let took = until_served_by(&g, &["a"], limit).await;
    eprintln!("an endpoint turning unready reached the gateway within {took:?}");
    kube.create_slice("api", "api-c", "c.api.test", c.addr.port());
    until_served_by(&g, &["a", "c"], limit).await;
    kube.set_ready("api-b", "b.api.test", true);
    until_served_by(&g, &["a", "b", "c"], limit).await;
    kube.delete_slice("api-a");
    until_served_by(&g, &["b", "c"], limit).await;
    assert_eq!(metric_of(&g, "discovery_registry_up", "kubernetes"), 1.0);
    assert_eq!(
        metric_of(&g, "discovery_registry_servers", "kubernetes"),
        2.0
    );

    // The API server goes away: the last servers stay, under concurrent load.
    kube.kill_apiserver();
    assert!(
        eventually(Duration::from_secs(90), || {
            metric_of(&g, "discovery_registry_up", "kubernetes") == 0.0
        })
        .await,
        "the metrics do not say the registry is down"
    );
    load(&g, 8, 50, &["b", "c"]).await;
}
