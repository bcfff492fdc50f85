//! Hot reload: through `Gateway::reload` and the admin `POST /reload` (file source). Route
//! changes apply to new requests, invalid configs are rejected with the old one kept, and a
//! reload under continuous keep-alive load fails nothing and never mixes versions.
mod support;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::*;

/// A config whose catch-all route "tagged" sets `x-config: {tag}`; `extra` adds more.
fn tagged(origin: std::net::SocketAddr, tag: &str, extra: &str) -> String {
    config_text(
        origin,
        "",
        &format!(
            r#"[[routes]]
name = "tagged"
cluster = "origin"
match = {{ path_prefix = "/" }}
response_headers = {{ set = {{ "x-config" = "{tag}" }} }}

{extra}
"#
        ),
    )
}

const NEW_ROUTE: &str = r#"[[routes]]
name = "new"
cluster = "origin"
priority = 10
match = { path_prefix = "/new" }
rewrite = { replace_path = "/__inspect" }
"#;

fn load(text: &str) -> keymaster_config::Config {
    keymaster_config::load_str(text, "<test>").unwrap_or_else(|e| panic!("{e}"))
}

fn rejected(g: &TestGateway) -> f64 {
    metric(
        &g.gateway().metrics_text(),
        "keymaster_config_reloads_total{result=\"rejected\"}",
    )
}

async fn config_version(g: &TestGateway) -> u64 {
    let r = admin_get(g, "/config").await;
    assert_eq!(r.status, 200);
    let j: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    j["version"].as_u64().unwrap()
}

fn header_values(r: &Reply, name: &str) -> Vec<String> {
    r.headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_route_changes_to_new_requests() {
    let s = stub();
    let g = start_gateway(&tagged(s.local_addr(), "A", ""));
    let mut before = Client::connect(g.addr).await;
    let r = before.get("/new?length=5").await;
    assert_eq!((r.status, r.body.clone()), (200, stub_body(5)));
    assert_eq!(header_values(&r, "x-config"), vec!["A"]);
    assert_eq!(config_version(&g).await, 1);

    let v = g
        .gateway()
        .reload(load(&tagged(s.local_addr(), "B", NEW_ROUTE)))
        .unwrap();
    assert_eq!(v, 2);
    assert_eq!(g.gateway().version(), 2);
    assert_eq!(config_version(&g).await, 2);
    // The connection opened before the reload sees the new routes.
    let r = before.get("/new?length=5").await;
    assert_eq!(r.status, 200);
    let j: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(j["uri"], "/__inspect?length=5");
    let r = before.get("/other").await;
    assert_eq!(header_values(&r, "x-config"), vec!["B"]);
    // /config shows the effective config of the new version.
    let c = admin_get(&g, "/config").await;
    let j: serde_json::Value = serde_json::from_slice(&c.body).unwrap();
    let names: Vec<_> = j["config"]["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect();
    assert!(names.contains(&"new".to_string()), "{names:?}");
    let m = g.gateway().metrics_text();
    assert_eq!(metric(&m, "keymaster_config_version "), 2.0);
    assert_eq!(
        metric(&m, "keymaster_config_reloads_total{result=\"ok\"}"),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_with_unknown_cluster_is_rejected_and_old_config_serves() {
    let s = stub();
    let g = start_gateway(&tagged(s.local_addr(), "A", ""));
    let mut bad = load(&tagged(s.local_addr(), "B", ""));
    bad.routes
        .iter_mut()
        .for_each(|r| r.cluster = "nope".into());
    let err = g.gateway().reload(bad).unwrap_err();
    assert!(err.contains("nope"), "{err}");
    assert_eq!(g.gateway().version(), 1);
    assert_eq!(rejected(&g), 1.0);
    let r = get(g.addr, "/").await;
    assert_eq!(r.status, 200);
    assert_eq!(header_values(&r, "x-config"), vec!["A"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_runs_the_same_validation_as_startup() {
    let s = stub();
    let g = start_gateway(&tagged(s.local_addr(), "A", ""));
    // A Config built in code that `keymaster validate` would refuse.
    let mut bad = load(&tagged(s.local_addr(), "B", ""));
    let tagged_route = bad.routes.iter_mut().find(|r| r.name == "tagged").unwrap();
    tagged_route.matches.path_prefix = Some("no-slash".into());
    assert!(keymaster_config::validate(&bad).is_err());
    let err = g.gateway().reload(bad).unwrap_err();
    assert!(err.contains("path_prefix"), "{err}");
    assert_eq!(g.gateway().version(), 1);
    assert_eq!(rejected(&g), 1.0);
    assert_eq!(
        header_values(&get(g.addr, "/").await, "x-config"),
        vec!["A"]
    );
}

/// A gateway started from a file, with its TestGateway.
fn file_gateway(path: &std::path::Path, text: &str) -> TestGateway {
    std::fs::write(path, text).unwrap();
    let config = keymaster_config::load_file(path).unwrap();
    let gw = Gateway::start(config, ConfigSource::File(path.to_path_buf())).unwrap();
    TestGateway {
        addr: gw.listener_addr("main").unwrap(),
        admin: gw.admin_addr().unwrap(),
        gw: Some(gw),
    }
}

async fn admin_reload(g: &TestGateway) -> Reply {
    admin_post(g, "/reload").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_reload_rereads_the_file() {
    let s = stub();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keymaster.toml");
    let g = file_gateway(&path, &tagged(s.local_addr(), "A", ""));
    let mut c = Client::connect(g.addr).await;
    assert_eq!(header_values(&c.get("/").await, "x-config"), vec!["A"]);

    std::fs::write(&path, tagged(s.local_addr(), "B", NEW_ROUTE)).unwrap();
    let r = admin_reload(&g).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let j: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(j["status"], "ok");
    assert_eq!(j["version"], 2);
    assert_eq!(header_values(&c.get("/").await, "x-config"), vec!["B"]);
    assert_eq!(c.get("/new").await.status, 200);
    assert_eq!(config_version(&g).await, 2);
    let cfg = admin_get(&g, "/config").await;
    let j: serde_json::Value = serde_json::from_slice(&cfg.body).unwrap();
    assert_eq!(j["source"], path.display().to_string());

    // Unknown cluster: 422 with the located error, old config keeps serving.
    std::fs::write(
        &path,
        tagged(s.local_addr(), "C", "").replace("cluster = \"origin\"", "cluster = \"nope\""),
    )
    .unwrap();
    let r = admin_reload(&g).await;
    assert_eq!(r.status, 422);
    let j: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(j["status"], "rejected");
    let e = j["error"].as_str().unwrap();
    assert!(
        e.contains("unknown cluster") && e.contains("keymaster.toml:"),
        "{e}"
    );
    assert_eq!(rejected(&g), 1.0);
    assert_eq!(header_values(&c.get("/").await, "x-config"), vec!["B"]);

    // A server address that does not resolve: 422, counted, old config serves.
    std::fs::write(
        &path,
        tagged(s.local_addr(), "D", "")
            .replace(&s.local_addr().to_string(), "no-such-host.invalid:80"),
    )
    .unwrap();
    let r = admin_reload(&g).await;
    assert_eq!(r.status, 422);
    let j: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert!(
        j["error"]
            .as_str()
            .unwrap()
            .contains("no-such-host.invalid"),
        "{j}"
    );
    assert_eq!(rejected(&g), 2.0);
    assert_eq!(header_values(&c.get("/").await, "x-config"), vec!["B"]);
    assert_eq!(config_version(&g).await, 2);

    // A syntax error: 422 too.
    std::fs::write(&path, "[[routes]\n").unwrap();
    assert_eq!(admin_reload(&g).await.status, 422);
    assert_eq!(rejected(&g), 3.0);
    // And a fixed file is taken again; the version only moves on success.
    std::fs::write(&path, tagged(s.local_addr(), "E", "")).unwrap();
    let r = admin_reload(&g).await;
    assert_eq!(r.status, 200);
    assert_eq!(header_values(&c.get("/").await, "x-config"), vec!["E"]);
    assert_eq!(
        config_version(&g).await,
        3,
        "rejected reloads must not use up versions"
    );
}

/// A reload that changes settings only a restart can change (the listener's address, the
/// worker count) applies the rest and says what it kept; `/config` shows what runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_only_changes_are_kept_running_and_reported() {
    let s = stub();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keymaster.toml");
    let g = file_gateway(&path, &tagged(s.local_addr(), "A", ""));
    let moved = tagged(s.local_addr(), "B", "")
        .replace("address = \"127.0.0.1:0\"", "address = \"127.0.0.1:1\"")
        .replace("workers = 1", "workers = 3");
    std::fs::write(&path, moved).unwrap();
    let r = admin_reload(&g).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let j: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(j["status"], "ok");
    assert_eq!(
        j["restart_required"],
        serde_json::json!(["server.workers", "listeners[0].address"])
    );
    // The route change is live, on the listener that still serves.
    assert_eq!(
        header_values(&get(g.addr, "/").await, "x-config"),
        vec!["B"]
    );
    let cfg = admin_get(&g, "/config").await;
    let j: serde_json::Value = serde_json::from_slice(&cfg.body).unwrap();
    assert_eq!(j["config"]["server"]["workers"], 1, "what runs");
    assert_eq!(j["config"]["listeners"][0]["address"], "127.0.0.1:0");
    assert_eq!(j["restart_required"].as_array().map(Vec::len), Some(2));

    // A file back to the running settings needs no restart any more.
    std::fs::write(&path, tagged(s.local_addr(), "C", "")).unwrap();
    let r = admin_reload(&g).await;
    let j: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(j["restart_required"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_load_fails_nothing_and_never_mixes_versions() {
    const TASKS: usize = 4;
    const PER_TASK: usize = 600;
    let s = stub();
    let a = tagged(s.local_addr(), "A", "");
    let b = tagged(s.local_addr(), "B", "");
    let g = start_gateway(&a);
    let (ca, cb) = (load(&a), load(&b));
    let done = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        // Connected before the first reload; kept alive through all of them.
        let mut c = Client::connect(g.addr).await;
        tasks.push(tokio::spawn(async move {
            let (mut na, mut nb) = (0usize, 0usize);
            for i in 0..PER_TASK {
                let r = c.get(&format!("/?length={}", i % 50)).await;
                assert_eq!(r.status, 200, "request {i}");
                assert_eq!(r.body.len(), i % 50);
                let v = header_values(&r, "x-config");
                match v.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
                    ["A"] => na += 1,
                    ["B"] => nb += 1,
                    other => panic!("request {i}: x-config {other:?}"),
                }
            }
            (na, nb)
        }));
    }
    let gw = g.gateway();
    let mut reloads = 0;
    while !done.load(Ordering::Relaxed) && reloads < 400 {
        let next = if reloads % 2 == 0 {
            cb.clone()
        } else {
            ca.clone()
        };
        gw.reload(next).unwrap();
        reloads += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
        if tasks.iter().all(|t| t.is_finished()) {
            done.store(true, Ordering::Relaxed);
        }
    }
    let (mut na, mut nb) = (0, 0);
    for t in tasks {
        let (a, b) = tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("load finished")
            .expect("no failed request");
        na += a;
        nb += b;
    }
    assert_eq!(na + nb, TASKS * PER_TASK);
    assert!(reloads >= 4, "only {reloads} reloads happened under load");
    assert!(na > 0 && nb > 0, "both versions served: A={na} B={nb}");
    let m = g.gateway().metrics_text();
    assert_eq!(
        metric(
            &m,
            "keymaster_requests_total{route=\"tagged\",status_class=\"2xx\"}"
        ),
        (TASKS * PER_TASK) as f64
    );
    assert_eq!(
        metric(&m, "keymaster_errors_total"),
        0.0,
        "no errors of any category"
    );
}
