//! Loading end to end: the default and documented configs, located syntax/type/unknown-key
//! errors, several problems at once, files, and the documented `keymaster validate` output.

use keymaster_config::*;

const DOCS: &str = include_str!("../../../docs/configuration.md");

/// The body of the first fenced block of `lang` after the line containing `marker`.
fn docs_block(marker: &str, lang: &str) -> String {
    let start = DOCS
        .find(marker)
        .unwrap_or_else(|| panic!("docs lack {marker:?}"));
    let fence = format!("```{lang}\n");
    let rest = &DOCS[start..];
    let open = rest.find(&fence).map(|i| i + fence.len()).expect("fence");
    let close = rest[open..].find("```").expect("closing fence");
    rest[open..open + close].to_string()
}

fn err_list(text: &str) -> Vec<(String, Option<usize>, Option<usize>)> {
    match load_str(text, "t.toml") {
        Ok(_) => Vec::new(),
        Err(e) => e
            .errors()
            .iter()
            .map(|e| (e.key.clone(), e.line, e.column))
            .collect(),
    }
}

#[test]
fn default_config_loads() {
    let c = default_config();
    assert_eq!(load_str(DEFAULT_CONFIG, "<default>"), Ok(c.clone()));
    assert_eq!(c.listeners.len(), 1);
    assert_eq!(c.listeners[0].address.to_string(), "127.0.0.1:8080");
    assert_eq!(
        c.admin.listen.map(|a| a.to_string()),
        Some("127.0.0.1:9901".into())
    );
    assert_eq!(c.routes[0].cluster, "stub");
    assert_eq!(c.clusters[0].servers[0].address, "127.0.0.1:8081");
    assert_eq!(c.clusters[0].servers[0].weight, 1);
    assert!(validate(&c).is_ok());
}

#[test]
fn documented_example_loads() {
    let text = docs_block("## Complete example", "toml");
    let c = match load_str(&text, "example.toml") {
        Ok(c) => c,
        Err(e) => panic!("documented example fails:\n{e}"),
    };
    assert_eq!(c.listeners.len(), 4);
    assert_eq!(c.listeners[1].proxy_protocol, ProxyProtocol::Any);
    assert_eq!(c.listeners[1].proxy_protocol_from, vec!["10.0.0.0/8"]);
    let live = &c.routes[1];
    assert_eq!(live.upgrade.idle_timeout, Duration::from_secs(90));
    assert!(live.upgrade.websocket);
    let tls = c.listeners[3].tls.as_ref().expect("tls listener");
    assert_eq!(tls.certificates.len(), 2);
    assert_eq!(tls.min_version, TlsVersion::Tls12);
    assert_eq!(tls.client_auth.as_ref().map(|a| a.required), Some(false));
    assert_eq!(c.server.drain_timeout, Duration::from_secs(20));
    assert_eq!(c.listeners[0].max_header_bytes, ByteSize(32 * 1024));
    assert_eq!(c.listeners[0].protocol, ListenerProtocol::Auto);
    assert_eq!(c.access_log.format, AccessLogFormat::Combined);
    let api = &c.routes[0];
    assert_eq!(api.matches.host.as_deref(), Some("api.example.com"));
    assert_eq!(api.rewrite.replace_prefix.as_deref(), Some("/v2/"));
    assert_eq!(api.request_timeout, Some(Duration::from_secs(10)));
    assert_eq!(api.max_body_size, ByteSize(10 * 1024 * 1024));
    assert_eq!(c.clusters[0].balance, Balance::LeastOutstanding);
    assert_eq!(c.clusters[0].servers[1].weight, 2);
    assert_eq!(c.clusters[0].pool.max_connections, 512);
    let checkout = c
        .routes
        .iter()
        .find(|r| r.name == "checkout")
        .expect("checkout");
    assert_eq!(checkout.clusters[1].weight, 5);
    let carts = c
        .clusters
        .iter()
        .find(|c| c.name == "carts")
        .expect("carts");
    assert_eq!(carts.hash.as_ref().map(|h| h.key), Some(HashOn::Header));
}

/// Every key the model serializes is documented as `key` in docs/configuration.md.
#[test]
fn every_key_is_documented() {
    let mut c = default_config();
    let r = &mut c.routes[0];
    r.matches.host = Some("a".into());
    r.matches.path_exact = Some("/".into());
    r.matches.path_regex = Some("/".into());
    r.rewrite.strip_prefix = Some("/".into());
    r.rewrite.replace_prefix = Some("/".into());
    r.rewrite.replace_path = Some("/".into());
    r.fixed_host = Some("a".into());
    r.connect_timeout = Some(Duration::from_secs(1));
    r.response_header_timeout = Some(Duration::from_secs(1));
    r.request_timeout = Some(Duration::from_secs(1));
    r.clusters = vec![WeightedCluster {
        name: "a".into(),
        weight: 1,
    }];
    r.cluster_override = Some(ClusterOverride {
        header: Some("x".into()),
        cookie: Some("y".into()),
    });
    c.clusters[0].request_timeout = Some(Duration::from_secs(1));
    c.clusters[0].health_check = Some(HealthCheckConfig::default());
    c.clusters[0].hash = Some(HashConfig {
        key: HashOn::Cookie,
        name: Some("s".into()),
        generate: true,
        cookie_path: "/".into(),
        cookie_max_age: Some(Duration::from_secs(1)),
        cookie_secure: true,
    });
    c.routes[0].retry.per_try_timeout = Some(Duration::from_secs(1));
    c.routes[0].compression = Some(CompressionConfig::default());
    c.load_shedding.max_event_loop_lag = Some(Duration::from_millis(100));
    c.listeners[0].tls = Some(TlsConfig {
        certificates: vec![TlsCertificate {
            cert: "c".into(),
            key: "k".into(),
        }],
        client_auth: Some(ClientAuthConfig {
            ca: "ca".into(),
            required: true,
            forward_header: Some("x".into()),
        }),
        ..TlsConfig::default()
    });
    let value = serde_json::to_value(&c).expect("serializable");
    fn keys(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    out.push(k.clone());
                    keys(v, out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| keys(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    keys(&value, &mut all);
    let missing: Vec<&String> = all
        .iter()
        .filter(|k| !DOCS.contains(&format!("`{k}`")))
        .collect();
    assert!(missing.is_empty(), "undocumented keys: {missing:?}");
}

#[test]
fn documented_validate_output_is_exact() {
    let bad = docs_block("### Example: a broken file", "toml");
    let want = docs_block("### Example: a broken file", "text");
    let got = load_str(&bad, "bad.toml").expect_err("the documented broken file is broken");
    let want: Vec<&str> = want.lines().filter(|l| l.starts_with("bad.toml")).collect();
    assert_eq!(got.to_string().lines().collect::<Vec<_>>(), want);
}

#[test]
fn several_errors_all_reported_in_file_order() {
    let text = r#"[server]
drain_timeout = "0s"

[[listeners]]
name = "a"
address = "127.0.0.1:8080"
trusted_proxies = ["nope"]

[[listeners]]
name = "a"
address = "127.0.0.1:8080"

[[routes]]
name = "r"
cluster = "missing"
match = { path_prefix = "api" }

[[clusters]]
name = "c"
servers = [{ address = "c.internal", weight = 0 }]
"#;
    let got = err_list(text);
    let want = vec![
        ("server.drain_timeout".to_string(), Some(2), Some(1)),
        ("listeners[0].trusted_proxies[0]".into(), Some(7), Some(20)),
        ("listeners[1].name".into(), Some(10), Some(1)),
        ("listeners[1].address".into(), Some(11), Some(1)),
        ("routes[0].cluster".into(), Some(15), Some(1)),
        ("routes[0].match.path_prefix".into(), Some(16), Some(11)),
        ("clusters[0].servers[0].address".into(), Some(20), Some(14)),
        ("clusters[0].servers[0].weight".into(), Some(20), Some(38)),
    ];
    assert_eq!(got, want);
}

#[test]
fn syntax_error_has_line_and_column() {
    let got = load_str("[server]\nworkers = 2\n[[routes]\n", "s.toml").expect_err("broken");
    assert_eq!(got.len(), 1);
    let e = &got.errors()[0];
    assert_eq!((e.line, e.column), (Some(3), Some(10)));
    assert_eq!(e.key, "");
    assert_eq!(e.message, "unclosed array table, expected `]`");
    assert!(got.to_string().starts_with("s.toml:3:10: "), "{got}");
}

#[test]
fn unknown_keys_are_named_and_located() {
    assert_eq!(
        err_list("[server]\nworkers = 2\nwokrers = 3\n"),
        vec![
            ("server.wokrers".to_string(), Some(3), Some(1)),
            // An unknown key hides nothing else: the file has no listener either.
            ("listeners".to_string(), None, None)
        ]
    );
    let e = load_str(
        "[[listeners]]\nname = \"a\"\n\n[[routes]]\nname = \"r\"\nmatch = { path = \"/\" }\n",
        "u.toml",
    )
    .expect_err("unknown key");
    // The route's missing cluster (line 4) is reported too, before it.
    let e = e
        .errors()
        .iter()
        .find(|e| e.key.starts_with("routes[0].match"))
        .expect("the unknown key is reported");
    assert_eq!(
        (e.key.as_str(), e.line, e.column),
        ("routes[0].match.path", Some(6), Some(11))
    );
    assert!(e
        .message
        .contains("unknown field `path`, expected one of `host`, `path_prefix`"));
    assert_eq!(
        err_list("colour = \"blue\"\n")[0],
        ("colour".to_string(), Some(1), Some(1))
    );
}

#[test]
fn type_errors_are_located() {
    let text =
        "[[clusters]]\nname = \"c\"\nservers = [{ address = \"a:1\", weight = \"heavy\" }]\n";
    assert_eq!(
        err_list(text),
        vec![
            (
                "clusters[0].servers[0].weight".to_string(),
                Some(3),
                Some(40)
            ),
            // A type error hides nothing else: the file has no listener either.
            ("listeners".to_string(), None, None)
        ]
    );
    let e = load_str("[[listeners]]\naddress = \"localhost:80\"\n", "t.toml").expect_err("bad");
    assert_eq!(
        e.errors()[0].to_string(),
        "t.toml:2:11: listeners[0].address: invalid socket address syntax; expected \"ip:port\" like \"127.0.0.1:8080\" (names are not resolved)"
    );
    let e = load_str("[server]\ndrain_timeout = \"5 fortnights\"\n", "t.toml").expect_err("bad");
    assert_eq!(
        e.errors()[0].to_string(),
        "t.toml:2:17: server.drain_timeout: unknown duration unit \"fortnights\" in \"5 fortnights\" (use ns, us, ms, s, m or h)"
    );
    assert_eq!(
        err_list("[[clusters]]\nname = \"c\"\nservers = [{ weight = 2 }]\n")[0],
        ("clusters[0].servers[0]".to_string(), Some(3), Some(12))
    );
}

#[test]
fn admin_can_be_turned_off() {
    let text = DEFAULT_CONFIG.replace("listen = \"127.0.0.1:9901\"", "listen = \"off\"");
    let c = load_str(&text, "t.toml").expect("valid");
    assert_eq!(c.admin.listen, None);
    assert_eq!(
        serde_json::to_value(&c.admin)
            .ok()
            .map(|a| a["listen"].clone()),
        Some(serde_json::json!("off"))
    );
    let e = load_str("[admin]\nlisten = \"9901\"\n", "t.toml").expect_err("bad");
    assert_eq!(e.errors()[0].key, "admin.listen");
    assert!(e.errors()[0].message.contains("expected \"ip:port\""));
}

/// The default config with `keys` added to its `[admin]` table.
fn with_admin_keys(keys: &str) -> String {
    let listen = "listen = \"127.0.0.1:9901\"";
    DEFAULT_CONFIG.replace(listen, &format!("{listen}\n{keys}"))
}

#[test]
fn admin_guard_defaults() {
    let a = default_config().admin;
    assert_eq!(a.header_read_timeout, Duration::from_secs(10));
    assert_eq!(a.idle_timeout, Duration::from_secs(60));
    assert_eq!(a.max_connections, 64);
    assert_eq!((a.token.as_deref(), a.token_env.as_deref()), (None, None));
    assert_eq!(a.resolved_token(), None);
    // The admin listener's head timeout is the main listeners'.
    assert_eq!(
        a.header_read_timeout,
        ListenerConfig::default().header_read_timeout
    );
    let c = load_str(
        &with_admin_keys(
            "header_read_timeout = \"300ms\"\nidle_timeout = \"2s\"\nmax_connections = 3\ntoken = \"0123456789abcdef\"",
        ),
        "t.toml",
    )
    .expect("valid");
    assert_eq!(c.admin.header_read_timeout, Duration::from_millis(300));
    assert_eq!(c.admin.idle_timeout, Duration::from_secs(2));
    assert_eq!(c.admin.max_connections, 3);
    assert_eq!(
        c.admin.resolved_token().as_deref(),
        Some("0123456789abcdef")
    );
}

#[test]
fn admin_token_from_the_environment() {
    // A name no other test uses: tests run on parallel threads of one process.
    std::env::set_var(
        "KEYMASTER_TEST_ADMIN_TOKEN_LOAD",
        "from-the-environment-0123",
    );
    let c = load_str(
        &with_admin_keys("token_env = \"KEYMASTER_TEST_ADMIN_TOKEN_LOAD\""),
        "t.toml",
    )
    .expect("valid");
    assert_eq!(
        c.admin.resolved_token().as_deref(),
        Some("from-the-environment-0123")
    );
    // The name is shown, the value never is.
    let shown = serde_json::to_string(&c.redacted()).expect("serializes");
    assert!(shown.contains("KEYMASTER_TEST_ADMIN_TOKEN_LOAD"), "{shown}");
    assert!(!shown.contains("from-the-environment-0123"), "{shown}");
}

#[test]
fn files() {
    let dir = std::env::temp_dir().join(format!("keymaster-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let good = dir.join("good.toml");
    std::fs::write(&good, DEFAULT_CONFIG).expect("write");
    assert_eq!(load_file(&good), Ok(default_config()));

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[server]\ndrain_timeout = 0\n").expect("write");
    let e = load_file(&bad).expect_err("invalid");
    let origin = bad.display().to_string();
    assert!(e.errors().iter().all(|e| e.origin == origin));
    assert!(e
        .to_string()
        .contains(&format!("{origin}:2:1: server.drain_timeout: ")));

    let missing = dir.join("missing.toml");
    let e = load_file(&missing).expect_err("unreadable");
    assert_eq!(e.len(), 1);
    let e = &e.errors()[0];
    assert_eq!(
        (e.origin.clone(), e.line, e.key.as_str()),
        (missing.display().to_string(), None, "")
    );
    assert!(e.to_string().starts_with(&format!(
        "{}: cannot read the config file: ",
        missing.display()
    )));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn validate_in_memory() {
    let mut c = default_config();
    c.routes[0].cluster = "gone".into();
    let e = validate(&c).expect_err("bad");
    assert_eq!(
        e.to_string(),
        "<memory>: routes[0].cluster: unknown cluster \"gone\"; expected one of: stub"
    );
}

#[test]
fn relative_paths_are_taken_from_the_config_files_directory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("keymaster.toml");
    let text = format!(
        "{DEFAULT_CONFIG}\n[lua]\ndir = \"filters\"\nhttp_ca_file = \"ca/internal.pem\"\n\n[access_log]\nenabled = true\npath = \"logs/access.log\"\n"
    );
    std::fs::write(&path, text).expect("write");
    let config = load_file(&path).expect("valid");
    let within = |p: &str| dir.path().join(p).display().to_string();
    assert_eq!(config.lua.dir, Some(within("filters")));
    assert_eq!(config.lua.http_ca_file, Some(within("ca/internal.pem")));
    assert_eq!(config.access_log.path, within("logs/access.log"));

    let absolute =
        format!("{DEFAULT_CONFIG}\n[lua]\ndir = \"/srv/filters\"\n\n[access_log]\npath = \"-\"\n");
    std::fs::write(&path, absolute).expect("write");
    let config = load_file(&path).expect("valid");
    assert_eq!(config.lua.dir.as_deref(), Some("/srv/filters"));
    assert_eq!(config.access_log.path, "-");
}

#[test]
fn type_errors_speak_the_readers_terms() {
    let text = format!("{DEFAULT_CONFIG}\n[lua]\ninstruction_budget = \"many\"\n");
    let e = keymaster_config::load_str(&text, "t.toml").expect_err("a type error");
    let message = &e.errors()[0].message;
    assert!(message.contains("expected a whole number"), "{message}");
    assert!(!message.contains("u64"), "{message}");
    let text = format!("{DEFAULT_CONFIG}\n[lua]\nwatch = 1\n");
    let e = keymaster_config::load_str(&text, "t.toml").expect_err("a type error");
    assert!(
        e.errors()[0].message.contains("expected true or false"),
        "{e}"
    );
}

#[test]
fn a_type_error_hides_no_other_problem() {
    let text = "[[listeners]]\nname = \"a\"\naddress = \"127.0.0.1:80\"\nmax_headers = \"many\"\nbogus = 1\n\n[[clusters]]\nname = \"c\"\nservers = [{ address = \"127.0.0.1:81\" }]\nconnect_timeout = \"soon\"\n\n[[routes]]\nname = \"r\"\ncluster = \"nope\"\n";
    let got = err_list(text);
    let keys: Vec<&str> = got.iter().map(|(k, _, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "listeners[0].max_headers",
            "listeners[0].bogus",
            "clusters[0].connect_timeout",
            "routes[0].cluster"
        ],
        "{got:?}"
    );
    assert_eq!(got[3].1, Some(14), "the semantic problem is located too");
}
