//! Upstream TLS per cluster against real rustls origins: verification against the
//! configured CA, SNI (configured or the server's address), client certificates, ALPN for
//! `protocol = "auto"`, TLS failures as 502, and pools that never share a connection across
//! TLS identities.

mod support;
mod tls_support;
mod upstream_support;

use support::*;
use tls_support::Pki;
use upstream_support::*;

fn origin_opts(pki: &Pki, names: &[&str]) -> OriginOpts {
    let cert = pki.issue("origin", names, "origin", false);
    OriginOpts {
        tls: Some((cert.der, cert.key_der)),
        alpn: vec!["http/1.1"],
        ..OriginOpts::default()
    }
}

#[tokio::test]
async fn verifies_the_origin_sends_sni_and_presents_the_client_certificate() {
    let pki = Pki::new();
    let mut opts = origin_opts(&pki, &["origin.test"]);
    opts.client_roots = Some(pki.roots());
    let origin = spawn_origin(opts).await;
    let client = pki.issue("gwclient", &[], "keymaster-gw", true);
    let keys = format!(
        r#"servers = [{{ address = "{}" }}]
tls = {{ ca = "{}", sni = "origin.test", client_cert = {{ cert = "{}", key = "{}" }} }}"#,
        origin.addr,
        pki.ca_path().display(),
        client.cert_path.display(),
        client.key_path.display()
    );
    let g = start_gateway(&config_with_cluster(PREAMBLE, &keys, ""));
    let r = get(g.addr, "/info").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let j = info(&r.body);
    assert_eq!(j["sni"], "origin.test");
    assert_eq!(j["client_cert"], true);
    assert_eq!(j["version"], "HTTP/1.1");
    // The origin saw exactly the one handshake, with our SNI and certificate.
    let seen = origin.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].sni.as_deref(), Some("origin.test"));
    assert!(seen[0].client_cert);
}

#[tokio::test]
async fn an_ip_address_server_is_verified_against_ip_sans_without_sni() {
    let pki = Pki::new();
    let origin = spawn_origin(origin_opts(&pki, &["127.0.0.1"])).await;
    let keys = format!(
        "servers = [{{ address = \"{}\" }}]\ntls = {{ ca = \"{}\" }}",
        origin.addr,
        pki.ca_path().display()
    );
    let g = start_gateway(&config_with_cluster(PREAMBLE, &keys, ""));
    let r = get(g.addr, "/info").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(info(&r.body)["sni"], serde_json::Value::Null);
}

#[tokio::test]
async fn an_untrusted_origin_is_a_502_counted_as_a_tls_failure() {
    let pki = Pki::new();
    let other = Pki::new(); // a CA the origin's certificate does not chain to
    let origin = spawn_origin(origin_opts(&pki, &["origin.test"])).await;
    let keys = format!(
        "servers = [{{ address = \"{}\" }}]\ntls = {{ ca = \"{}\", sni = \"origin.test\" }}",
        origin.addr,
        other.ca_path().display()
    );
    let g = start_gateway(&config_with_cluster(PREAMBLE, &keys, ""));
    let r = get(g.addr, "/info").await;
    assert_eq!(r.status, 502);
    let m = g.gateway().metrics_text();
    assert_eq!(
        metric(&m, "keymaster_upstream_tls_failures_total{cluster=\"up\"}"),
        1.0
    );
    assert_eq!(
        metric(
            &m,
            "keymaster_errors_total{category=\"origin_tls\",side=\"origin\"}"
        ),
        1.0,
        "{m}"
    );

    // The right CA but a name the certificate does not have: also refused.
    let keys = format!(
        "servers = [{{ address = \"{}\" }}]\ntls = {{ ca = \"{}\", sni = \"wrong.test\" }}",
        origin.addr,
        pki.ca_path().display()
    );
    let g = start_gateway(&config_with_cluster(PREAMBLE, &keys, ""));
    assert_eq!(get(g.addr, "/info").await.status, 502);
}

#[tokio::test]
async fn an_origin_requiring_a_client_certificate_refuses_a_gateway_without_one() {
    let pki = Pki::new();
    let mut opts = origin_opts(&pki, &["origin.test"]);
    opts.client_roots = Some(pki.roots());
    let origin = spawn_origin(opts).await;
    let keys = format!(
        "servers = [{{ address = \"{}\" }}]\ntls = {{ ca = \"{}\", sni = \"origin.test\" }}",
        origin.addr,
        pki.ca_path().display()
    );
    let g = start_gateway(&config_with_cluster(PREAMBLE, &keys, ""));
    let r = get(g.addr, "/info").await;
    assert_eq!(r.status, 502);
}

#[tokio::test]
async fn pools_never_share_a_connection_across_tls_identities() {
    let pki = Pki::new();
    let origin = spawn_origin(origin_opts(&pki, &["a.test", "b.test"])).await;
    let ca = pki.ca_path().display().to_string();
    // Two clusters, same address, different SNI; a third with the same SNI as the first
    // but TLS 1.3 only: three identities.
    let extra = format!(
        r#"
[[routes]]
name = "a"
cluster = "a"
match = {{ path_prefix = "/a/" }}
rewrite = {{ strip_prefix = "/a" }}

[[routes]]
name = "b"
cluster = "b"
match = {{ path_prefix = "/b/" }}
rewrite = {{ strip_prefix = "/b" }}

[[routes]]
name = "c"
cluster = "c"
match = {{ path_prefix = "/c/" }}
rewrite = {{ strip_prefix = "/c" }}

[[clusters]]
name = "a"
servers = [{{ address = "{addr}" }}]
tls = {{ ca = "{ca}", sni = "a.test" }}

[[clusters]]
name = "b"
servers = [{{ address = "{addr}" }}]
tls = {{ ca = "{ca}", sni = "b.test" }}

[[clusters]]
name = "c"
servers = [{{ address = "{addr}" }}]
tls = {{ ca = "{ca}", sni = "a.test", min_version = "1.3" }}
"#,
        addr = origin.addr
    );
    let keys = format!("servers = [{{ address = \"{}\" }}]", origin.addr);
    let g = start_gateway(&config_with_cluster(PREAMBLE, &keys, &extra));
    let mut c = Client::connect(g.addr).await;
    for round in 0..3 {
        for (prefix, sni) in [("/a", "a.test"), ("/b", "b.test"), ("/c", "a.test")] {
            let r = c.get(&format!("{prefix}/info")).await;
            assert_eq!(r.status, 200, "round {round} {prefix}");
            assert_eq!(info(&r.body)["sni"], sni, "round {round} {prefix}");
        }
    }
    // One connection per identity, each reused across rounds.
    assert_eq!(origin.connections(), 3);
    let m = g.gateway().metrics_text();
    for cl in ["a", "b", "c"] {
        assert_eq!(
            metric(
                &m,
                &format!("keymaster_upstream_reused_total{{cluster=\"{cl}\"}}")
            ),
            2.0,
            "{cl}"
        );
    }
}

#[tokio::test]
async fn auto_picks_h2_or_http1_by_alpn() {
    let pki = Pki::new();
    let cert = pki.issue("origin", &["origin.test"], "origin", false);
    for (alpn, version) in [
        (vec!["h2", "http/1.1"], "HTTP/2.0"),
        (vec!["http/1.1"], "HTTP/1.1"),
    ] {
        let origin = spawn_origin(OriginOpts {
            tls: Some((cert.der.clone(), cert.key_der.clone_key())),
            alpn,
            ..OriginOpts::default()
        })
        .await;
        let keys = format!(
            "protocol = \"auto\"\nservers = [{{ address = \"{}\" }}]\ntls = {{ ca = \"{}\", sni = \"origin.test\" }}",
            origin.addr,
            pki.ca_path().display()
        );
        let g = start_gateway(&config_with_cluster(PREAMBLE, &keys, ""));
        let mut c = Client::connect(g.addr).await;
        for _ in 0..3 {
            let r = c.get("/info").await;
            assert_eq!(r.status, 200);
            assert_eq!(info(&r.body)["version"], version);
        }
        assert_eq!(origin.connections(), 1, "{version}");
    }
}

#[tokio::test]
async fn h2_over_tls_needs_the_origin_to_agree_by_alpn() {
    let pki = Pki::new();
    let cert = pki.issue("origin", &["origin.test"], "origin", false);
    // An origin offering only http/1.1 refuses the handshake (no common ALPN protocol); one
    // without ALPN at all completes it, and the gateway refuses to guess: 502 both times,
    // never a garbled exchange.
    for (alpn, category) in [
        (vec!["http/1.1"], "origin_tls"),
        (vec![], "origin_bad_response"),
    ] {
        let origin = spawn_origin(OriginOpts {
            tls: Some((cert.der.clone(), cert.key_der.clone_key())),
            alpn,
            ..OriginOpts::default()
        })
        .await;
        let keys = format!(
            "protocol = \"h2\"\nservers = [{{ address = \"{}\" }}]\ntls = {{ ca = \"{}\", sni = \"origin.test\" }}",
            origin.addr,
            pki.ca_path().display()
        );
        let g = start_gateway(&config_with_cluster(PREAMBLE, &keys, ""));
        assert_eq!(get(g.addr, "/info").await.status, 502, "{category}");
        let m = g.gateway().metrics_text();
        assert_eq!(
            metric(
                &m,
                &format!("keymaster_errors_total{{category=\"{category}\",side=\"origin\"}}")
            ),
            1.0,
            "{m}"
        );
    }
}

#[test]
fn config_errors_name_the_key() {
    let text = config_with_cluster(
        PREAMBLE,
        "protocol = \"auto\"\nservers = [{ address = \"127.0.0.1:9\" }]",
        "",
    );
    let e = keymaster_config::load_str(&text, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("clusters[0].protocol") && e.contains("needs TLS"),
        "{e}"
    );

    let text = config_with_cluster(
        PREAMBLE,
        "protocol = \"h2\"\nproxy_protocol = \"v2\"\nservers = [{ address = \"127.0.0.1:9\" }]",
        "",
    );
    let e = keymaster_config::load_str(&text, "t.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("clusters[0].proxy_protocol"), "{e}");

    let text = config_with_cluster(
        PREAMBLE,
        "servers = [{ address = \"127.0.0.1:9\" }]\ntls = { sni = \"bad name!\", min_version = \"1.3\", max_version = \"1.2\" }\npool = { max_streams = 0 }",
        "",
    );
    let e = keymaster_config::load_str(&text, "t.toml")
        .unwrap_err()
        .to_string();
    for key in [
        "clusters[0].tls.sni",
        "clusters[0].tls.max_version",
        "clusters[0].pool.max_streams",
    ] {
        assert!(e.contains(key), "{key} in {e}");
    }

    // A CA file that cannot be read fails the start and names the key and the file.
    let text = config_with_cluster(
        PREAMBLE,
        "servers = [{ address = \"127.0.0.1:9\" }]\ntls = { ca = \"/nonexistent/ca.pem\" }",
        "",
    );
    let config = keymaster_config::load_str(&text, "t.toml").expect("valid text");
    let err = match Gateway::start(config, ConfigSource::Memory) {
        Ok(_) => panic!("a missing CA file must fail the start"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("tls.ca") && err.contains("/nonexistent/ca.pem"),
        "{err}"
    );
}

#[tokio::test]
async fn a_reload_rereads_the_ca_and_never_reuses_connections_verified_under_the_old_one() {
    let pki = Pki::new();
    let other = Pki::new();
    let origin = spawn_origin(origin_opts(&pki, &["origin.test"])).await;
    let ca_file = pki.path("upstream-ca.pem");
    std::fs::copy(pki.ca_path(), &ca_file).unwrap();
    let keys = format!(
        "servers = [{{ address = \"{}\" }}]\ntls = {{ ca = \"{}\", sni = \"origin.test\" }}",
        origin.addr,
        ca_file.display()
    );
    let text = config_with_cluster(PREAMBLE, &keys, "");
    let g = start_gateway(&text);
    let mut c = Client::connect(g.addr).await;
    assert_eq!(c.get("/info").await.status, 200);
    assert_eq!(c.get("/info").await.status, 200);
    assert_eq!(
        origin.connections(),
        1,
        "the second request reused the connection"
    );

    // Same config text, but the CA file now holds a CA the origin does not chain to: the
    // pooled connection (verified under the old CA) must not serve the next request.
    std::fs::copy(other.ca_path(), &ca_file).unwrap();
    let config = keymaster_config::load_str(&text, "t.toml").unwrap();
    g.gateway().reload(config).expect("reload accepted");
    assert_eq!(c.get("/info").await.status, 502);

    // And back: a fresh, verified connection.
    std::fs::copy(pki.ca_path(), &ca_file).unwrap();
    let config = keymaster_config::load_str(&text, "t.toml").unwrap();
    g.gateway().reload(config).expect("reload accepted");
    assert_eq!(c.get("/info").await.status, 200);
}
