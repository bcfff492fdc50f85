//! Service discovery config: `[[clusters]] discovery`, `[dns]`, and the server list file
//! format, as documented in docs/configuration.md.

use keymaster_config::*;

const DOCS: &str = include_str!("../../../docs/configuration.md");

/// The first fenced block of `lang` after `marker`.
fn docs_block(marker: &str, lang: &str) -> String {
    let rest = &DOCS[DOCS.find(marker).expect("section")..];
    let fence = format!("```{lang}\n");
    let open = rest.find(&fence).expect("fence") + fence.len();
    let close = rest[open..].find("```").expect("closing fence");
    rest[open..open + close].to_string()
}

const BASE: &str = r#"
[[listeners]]
name = "main"
address = "127.0.0.1:0"

[[routes]]
name = "api"
cluster = "api"
"#;

fn problems(text: &str) -> Vec<(String, Option<usize>)> {
    match load_str(text, "t.toml") {
        Ok(_) => Vec::new(),
        Err(e) => e.errors().iter().map(|e| (e.key.clone(), e.line)).collect(),
    }
}

#[test]
fn documented_examples_load_with_defaults() {
    let cluster = docs_block("### `discovery` — service discovery", "toml");
    let dns = docs_block("### `[dns]`", "toml");
    let c =
        load_str(&format!("{BASE}{cluster}\n{dns}"), "t.toml").unwrap_or_else(|e| panic!("{e}"));
    let d = c.clusters[0].discovery.as_ref().expect("discovery");
    assert_eq!(d.interval, Duration::from_secs(10));
    assert_eq!(d.file.as_deref(), Some("api-servers.txt"));
    assert_eq!(c.dns.nameservers, ["10.0.0.2", "10.0.0.3:5353"]);
    assert_eq!(c.dns.timeout, Duration::from_secs(1));

    // The documented file parses.
    let file = docs_block("### `discovery` — service discovery", "text");
    let servers = parse_servers_file(&file).unwrap();
    assert_eq!(servers.len(), 2);
    assert_eq!(
        (servers[1].address.as_str(), servers[1].weight),
        ("10.0.3.8:8080", 2)
    );

    // Defaults.
    let d = DiscoveryConfig::default();
    assert_eq!((d.interval, d.file), (Duration::from_secs(5), None));
    let dns = DnsConfig::default();
    assert!(dns.nameservers.is_empty());
    assert_eq!(dns.timeout, Duration::from_secs(2));
    assert_eq!(ClusterConfig::default().discovery, None);
}

#[test]
fn discovery_problems_are_located() {
    let text = format!(
        r#"{BASE}
[[clusters]]
name = "api"
discovery = {{ interval = "0s", file = " " }}

[dns]
nameservers = ["10.0.0.2", "resolver.internal"]
timeout = "0s"
"#
    );
    assert_eq!(
        problems(&text),
        [
            ("clusters[0].discovery.interval".to_string(), Some(12)),
            ("clusters[0].discovery.file".to_string(), Some(12)),
            ("dns.nameservers[1]".to_string(), Some(15)),
            ("dns.timeout".to_string(), Some(16)),
        ]
    );
    // A file stands in for servers.
    let text =
        format!("{BASE}\n[[clusters]]\nname = \"api\"\ndiscovery = {{ file = \"s.txt\" }}\n");
    assert_eq!(problems(&text), []);
}

#[test]
fn a_relative_file_is_relative_to_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.toml");
    std::fs::write(
        &path,
        format!("{BASE}\n[[clusters]]\nname = \"api\"\ndiscovery = {{ file = \"servers.txt\" }}\n"),
    )
    .unwrap();
    let c = load_file(&path).unwrap();
    assert_eq!(
        c.clusters[0].discovery.as_ref().unwrap().file.as_deref(),
        Some(dir.path().join("servers.txt").to_str().unwrap())
    );
}

#[test]
fn documented_registries_load_with_defaults() {
    let text = docs_block("### `discovery.consul`, `discovery.eureka`", "toml");
    let text = text.replace(
        "[[clusters]]\nname = \"users\"",
        "[[clusters]]\nname = \"api\"",
    );
    let c = load_str(&format!("{BASE}{text}"), "t.toml").unwrap_or_else(|e| panic!("{e}"));
    let consul = c.clusters[0]
        .discovery
        .as_ref()
        .unwrap()
        .consul
        .as_ref()
        .unwrap();
    assert_eq!(consul.service, "orders");
    assert_eq!(consul.tags, ["v2"]);
    assert_eq!(consul.wait, Duration::from_secs(30));
    assert_eq!(consul.timeout, Duration::from_secs(5));
    assert!(env_reference(consul.token.as_ref().unwrap()).is_some());
    let d = c.clusters[1].discovery.as_ref().unwrap();
    let eureka = d.eureka.as_ref().unwrap();
    assert_eq!(eureka.urls.len(), 2);
    assert_eq!(
        (eureka.app.as_str(), d.interval),
        ("users", Duration::from_secs(10))
    );
    let k = c.clusters[2].discovery.as_ref().unwrap();
    let k = k.kubernetes.as_ref().unwrap();
    assert_eq!(
        (k.namespace.as_str(), k.service.as_str()),
        ("shop", "carts")
    );
    assert_eq!(k.port.as_deref(), Some("http"));
    assert_eq!(k.wait, Duration::from_secs(60));
    assert!(k.token_file.as_deref().unwrap().ends_with("/token"));
}

#[test]
fn registry_problems_are_located() {
    let text = format!(
        r#"{BASE}
[[clusters]]
name = "api"
discovery = {{ consul = {{ url = "consul:8500", service = "a b", tags = [""], token = 5, wait = "11m", timeout = "0s", ca = "ca.pem" }} }}

[[clusters]]
name = "b"
discovery = {{ eureka = {{ urls = [], app = "" }} }}

[[clusters]]
name = "c"
discovery = {{ consul = {{ url = "https://c:8501", service = "s" }}, eureka = {{ urls = ["http://e/eureka?x=1"], app = "c", max_size = "1GiB" }} }}

[[clusters]]
name = "d"
discovery = {{ kubernetes = {{ url = "kubernetes.default.svc", namespace = "", service = "api/x", port = "", token = "t", token_file = "f", wait = "0s" }} }}
"#
    );
    let got = problems(&text);
    let keys: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "clusters[0].discovery.consul.url",
            "clusters[0].discovery.consul.service",
            "clusters[0].discovery.consul.tags[0]",
            "clusters[0].discovery.consul.token",
            "clusters[0].discovery.consul.wait",
            "clusters[0].discovery.consul.timeout",
            "clusters[0].discovery.consul.ca",
            "clusters[1].discovery.eureka.urls",
            "clusters[1].discovery.eureka.app",
            "clusters[2].discovery",
            "clusters[2].discovery.eureka.urls[0]",
            "clusters[2].discovery.eureka.max_size",
            "clusters[3].discovery.kubernetes.url",
            "clusters[3].discovery.kubernetes.namespace",
            "clusters[3].discovery.kubernetes.service",
            "clusters[3].discovery.kubernetes.port",
            "clusters[3].discovery.kubernetes.token_file",
            "clusters[3].discovery.kubernetes.wait",
        ],
        "{got:?}"
    );
    assert!(got.iter().all(|(_, line)| line.is_some()), "{got:?}");
    // A registry stands in for servers.
    let ok = format!(
        "{BASE}\n[[clusters]]\nname = \"api\"\ndiscovery = {{ eureka = {{ urls = [\"http://127.0.0.1:8761/eureka\"], app = \"api\" }} }}\n"
    );
    assert_eq!(problems(&ok), []);
}

#[test]
fn registry_credentials_are_redacted() {
    let text = format!(
        r#"{BASE}
[[clusters]]
name = "api"
discovery = {{ consul = {{ url = "https://u:secret@consul:8501", service = "api", token = "t0ken" }} }}

[[clusters]]
name = "b"
discovery = {{ eureka = {{ urls = ["http://eu:pw@eureka:8761/eureka"], app = "b" }} }}

[[clusters]]
name = "k"
discovery = {{ kubernetes = {{ url = "https://kubernetes.default.svc", service = "k", token = "kube-bearer" }} }}
"#
    );
    let c = load_str(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    let shown = toml::to_string(&c.redacted()).unwrap();
    for secret in ["secret", "t0ken", "pw@", "kube-bearer"] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
}
