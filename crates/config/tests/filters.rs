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
            ..Default::default()
        }],
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
    assert_eq!(c.filters[3].jwt_keys[1].alg, JwtAlg::RS256);
}
