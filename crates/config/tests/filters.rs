//! `[[filters]]` in docs/configuration.md: every key documented, the example loads.

use keymaster_config::*;

const DOCS: &str = include_str!("../../../docs/configuration.md");

fn filters_example() -> String {
    let start = DOCS.find("## `[[filters]]`").expect("filters section");
    let rest = &DOCS[start..];
    let open = rest.find("```toml\n").expect("example") + "```toml\n".len();
    let close = rest[open..].find("```").expect("closing fence");
    rest[open..open + close].to_string()
}

#[test]
fn every_filter_key_is_documented() {
    let f = FilterConfig {
        name: "x".into(),
        matches: FilterMatch {
            routes: vec!["r".into()],
            path_prefix: Some("/".into()),
            methods: vec!["GET".into()],
            headers: vec!["x".into()],
        },
        status: Some(200),
        location: Some("/".into()),
        body: Some(String::new()),
        max_age: Some(Duration::from_secs(1)),
        header: Some("x".into()),
        requests: Some(1),
        period: Some(Duration::from_secs(1)),
        burst: Some(1),
        key: Some(RateLimitKey::Route),
        backend: Some(RateLimitBackend::Redis),
        scope: Some(RateLimitScope::Worker),
        cluster: Some("c".into()),
        path: Some("/".into()),
        host: Some("h".into()),
        issuer: Some("i".into()),
        audience: Some("a".into()),
        jwt_keys: vec![JwtKey {
            kid: Some("k".into()),
            secret: Some("s".into()),
            n: Some("n".into()),
            e: Some("e".into()),
            pem: Some("p".into()),
            ..Default::default()
        }],
        jwks: Some(JwksConfig {
            ca: Some("ca.pem".into()),
            ..Default::default()
        }),
        leeway: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    let v = serde_json::to_value(&f).unwrap();
    let mut missing = Vec::new();
    for (k, v) in v.as_object().unwrap() {
        if !DOCS.contains(&format!("`{k}`")) {
            missing.push(k.clone());
        }
        let nested = match v {
            serde_json::Value::Object(m) => Some(m),
            serde_json::Value::Array(a) => a.first().and_then(|v| v.as_object()),
            _ => None,
        };
        if let Some(m) = nested {
            missing.extend(
                m.keys()
                    .filter(|k| !DOCS.contains(&format!("`{k}`")))
                    .cloned(),
            );
        }
    }
    assert!(missing.is_empty(), "undocumented filter keys: {missing:?}");
}

#[test]
fn documented_filter_example_loads() {
    let base = r#"
[[listeners]]
name = "main"
address = "127.0.0.1:0"

[[routes]]
name = "api"
cluster = "api"

[[clusters]]
name = "api"
servers = [{ address = "127.0.0.1:1" }]
"#;
    let text = format!("{base}\n{}", filters_example());
    let c = load_str(&text, "example.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.filters.len(), 7);
    assert_eq!(c.filters[0].kind, FilterType::Cors);
    assert_eq!(c.filters[6].stage, FilterStage::Post);
    assert_eq!(c.filters[3].jwt_keys[1].alg, JwtAlg::ES256);
    assert_eq!(c.filters[3].jwt_keys[2].alg, JwtAlg::RS256);
    let jwks = c.filters[3].jwks.as_ref().expect("jwks");
    assert_eq!(jwks.refresh, Duration::from_secs(600));
    assert_eq!(jwks.timeout, Duration::from_secs(5));
}

const BASE: &str = r#"
[[listeners]]
name = "main"
address = "127.0.0.1:0"

[[routes]]
name = "api"
cluster = "api"

[[clusters]]
name = "api"
servers = [{ address = "127.0.0.1:1" }]
"#;

fn problems(extra: &str) -> Vec<(String, Option<usize>, String)> {
    match load_str(&format!("{BASE}{extra}"), "t.toml") {
        Ok(_) => Vec::new(),
        Err(e) => e
            .errors()
            .iter()
            .map(|e| (e.key.clone(), e.line, e.message.clone()))
            .collect(),
    }
}

#[test]
fn documented_redis_example_loads() {
    let start = DOCS.find("### `[redis]`").expect("redis section");
    let rest = &DOCS[start..];
    let open = rest.find("```toml\n").expect("example") + "```toml\n".len();
    let close = rest[open..].find("```").expect("closing fence");
    let c = load_str(&format!("{BASE}{}", &rest[open..open + close]), "t.toml")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.redis.url.as_deref(), Some("redis://10.0.0.20:6379/0"));
    assert_eq!(c.redis.timeout, Duration::from_millis(50));
    assert_eq!(c.filters[0].backend, Some(RateLimitBackend::Redis));
    // Defaults.
    let d = RedisConfig::default();
    assert_eq!(
        (d.url, d.timeout, d.backoff),
        (None, Duration::from_millis(50), Duration::from_secs(2))
    );
    assert_eq!(d.key_prefix, "keymaster:rl:");
}

#[test]
fn redis_backend_problems_are_located() {
    // backend = "redis" without [redis] url; backend on a filter type that has none.
    let p = problems(
        r#"
[[filters]]
name = "rl"
type = "rate_limit"
requests = 5
backend = "redis"

[[filters]]
name = "k"
type = "api_key"
keys = ["a"]
backend = "local"
"#,
    );
    assert_eq!(p.len(), 2, "{p:?}");
    assert_eq!(p[0].0, "filters[0].backend");
    assert_eq!(p[0].1, Some(18));
    assert!(p[0].2.contains("[redis]"), "{p:?}");
    assert_eq!(p[1].0, "filters[1].backend");
    assert_eq!(p[1].1, Some(24));

    // A bad URL, zero durations, a prefix with spaces, an unknown backend.
    let p = problems(
        r#"
[redis]
url = "http://127.0.0.1:6379"
timeout = "0s"
backoff = "0ms"
key_prefix = "a b"
"#,
    );
    let keys: Vec<&str> = p.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(
        keys,
        [
            "redis.url",
            "redis.timeout",
            "redis.backoff",
            "redis.key_prefix"
        ],
        "{p:?}"
    );
    assert_eq!(p[0].1, Some(15));
    let p = problems("[[filters]]\nname = \"rl\"\ntype = \"rate_limit\"\nrequests = 1\nbackend = \"memcached\"\n");
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].0, "filters[0].backend");
}

#[test]
fn rate_limit_scope_loads_and_its_problems_are_located() {
    let base = "[[filters]]\nname = \"rl\"\ntype = \"rate_limit\"\nrequests = 1\n";
    let c = load_str(&format!("{BASE}{base}scope = \"worker\"\n"), "t.toml").unwrap();
    assert_eq!(c.filters[0].scope, Some(RateLimitScope::Worker));
    let c = load_str(&format!("{BASE}{base}"), "t.toml").unwrap();
    assert_eq!(
        c.filters[0].scope.unwrap_or_default(),
        RateLimitScope::Process
    );
    // An unknown scope; scope on a filter type that has none.
    let p = problems(&format!("{base}scope = \"thread\"\n"));
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].0, "filters[0].scope");
    assert!(p[0].1.is_some(), "{p:?}");
    let p = problems(
        "[[filters]]\nname = \"k\"\ntype = \"api_key\"\nkeys = [\"a\"]\nscope = \"worker\"\n",
    );
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].0, "filters[0].scope");
    assert!(p[0].1.is_some(), "{p:?}");
}
