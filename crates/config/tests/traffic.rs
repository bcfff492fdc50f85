//! The traffic settings: weighted clusters on a route, their override, and the `hash`
//! balancer; every rule's failure names the file, the line and the key.

mod rule_support;

use keymaster_config::{load_str, Balance, HashOn};
use rule_support::errors;

const HEAD: &str = r#"[[listeners]]
name = "main"
address = "127.0.0.1:8080"

[[clusters]]
name = "stable"
servers = [{ address = "127.0.0.1:8081" }]

[[clusters]]
name = "canary"
servers = [{ address = "127.0.0.1:8082" }]
"#;

/// `HEAD` plus a route (from line 13) whose keys are `route` (from line 15), then `tail`
/// (from the line after them).
fn text(route: &str, tail: &str) -> String {
    format!("{HEAD}\n[[routes]]\nname = \"r\"\n{route}\n{tail}")
}

/// Exactly one error, at `key` on `line`, saying `says`.
#[track_caller]
fn one(text: &str, key: &str, line: usize, says: &str) {
    let errs = errors(text);
    let got: Vec<String> = errs.iter().map(ToString::to_string).collect();
    assert_eq!(errs.len(), 1, "expected one error at {key}, got {got:#?}");
    let e = &errs[0];
    assert_eq!(
        (e.key.as_str(), e.line, e.origin.as_str()),
        (key, Some(line), "t.toml"),
        "{got:#?}"
    );
    assert!(e.message.contains(says), "{:?} lacks {says:?}", e.message);
}

const SPLIT: &str =
    r#"clusters = [{ name = "stable", weight = 95 }, { name = "canary", weight = 5 }]"#;

#[test]
fn weighted_clusters_load() {
    let c = load_str(
        &text(
            &format!("{SPLIT}\ncluster_override = {{ header = \"x-cluster\", cookie = \"km\" }}"),
            "",
        ),
        "t.toml",
    )
    .unwrap();
    let r = &c.routes[0];
    assert_eq!(
        (r.clusters[1].name.as_str(), r.clusters[1].weight),
        ("canary", 5)
    );
    let o = r.cluster_override.as_ref().unwrap();
    assert_eq!(
        (o.header.as_deref(), o.cookie.as_deref()),
        (Some("x-cluster"), Some("km"))
    );
    assert!(r.cluster.is_empty());
}

#[test]
fn a_route_has_a_cluster_or_clusters() {
    one(
        &text("", ""),
        "routes[0].cluster",
        13,
        "missing cluster; expected one of: stable, canary",
    );
    one(
        &text(&format!("cluster = \"stable\"\n{SPLIT}"), ""),
        "routes[0].cluster",
        15,
        "cluster and clusters are both set",
    );
}

#[test]
fn weighted_clusters_exist_once_with_positive_weights() {
    one(
        &text(r#"clusters = [{ name = "stable", weight = 0 }]"#, ""),
        "routes[0].clusters[0].weight",
        15,
        "weight 0 is out of range; expected 1 to 10000",
    );
    one(
        &text(r#"clusters = [{ name = "stable", weight = 10001 }]"#, ""),
        "routes[0].clusters[0].weight",
        15,
        "out of range",
    );
    one(
        &text(
            r#"clusters = [{ name = "stable", weight = 1 }, { name = "nope", weight = 1 }]"#,
            "",
        ),
        "routes[0].clusters[1].name",
        15,
        "unknown cluster \"nope\"; expected one of: stable, canary",
    );
    one(
        &text(
            r#"clusters = [{ name = "stable", weight = 1 }, { name = "stable", weight = 2 }]"#,
            "",
        ),
        "routes[0].clusters[1].name",
        15,
        "already listed at routes[0].clusters[0]",
    );
    // A weight is required: a type error, located too.
    let errs = errors(&text(r#"clusters = [{ name = "stable" }]"#, ""));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].line, Some(15), "{errs:?}");
    assert!(errs[0].to_string().contains("weight"), "{errs:?}");
}

#[test]
fn an_override_belongs_to_a_split_and_names_a_field() {
    one(
        &text(
            "cluster = \"stable\"\ncluster_override = { header = \"x-c\" }",
            "",
        ),
        "routes[0].cluster_override",
        16,
        "expected clusters = [",
    );
    let split = |o: &str| text(&format!("{SPLIT}\ncluster_override = {o}"), "");
    one(
        &split("{ header = \"bad name\" }"),
        "routes[0].cluster_override.header",
        16,
        "not a valid HTTP header name",
    );
    one(
        &split("{ cookie = \"a;b\" }"),
        "routes[0].cluster_override.cookie",
        16,
        "not a cookie name",
    );
    one(
        &split("{}"),
        "routes[0].cluster_override",
        16,
        "names no header and no cookie",
    );
}

/// A cluster `h` (from line 16) with `keys` (from line 19), and the route to it.
fn hashed(keys: &str) -> String {
    text(
        "cluster = \"h\"",
        &format!(
            "[[clusters]]\nname = \"h\"\nservers = [{{ address = \"127.0.0.1:8083\" }}]\n{keys}\n"
        ),
    )
}

#[test]
fn hash_clusters_load() {
    let c = load_str(
        &hashed("balance = \"hash\"\nhash = { key = \"cookie\", name = \"sid\", generate = true, cookie_max_age = \"1h\" }"),
        "t.toml",
    )
    .unwrap();
    let cl = &c.clusters[2];
    assert_eq!(cl.balance, Balance::Hash);
    let h = cl.hash.as_ref().unwrap();
    assert_eq!(
        (h.key, h.name.as_deref(), h.generate),
        (HashOn::Cookie, Some("sid"), true)
    );
    assert_eq!((h.cookie_path.as_str(), h.cookie_secure), ("/", false));
    for key in [
        "hash = { key = \"client_ip\" }",
        "hash = { key = \"path\" }",
        "hash = { key = \"header\", name = \"x-user\" }",
    ] {
        assert!(
            errors(&hashed(&format!("balance = \"hash\"\n{key}"))).is_empty(),
            "{key}"
        );
    }
}

#[test]
fn a_hash_balancer_has_a_valid_key() {
    one(
        &hashed("balance = \"hash\""),
        "clusters[2].hash",
        16,
        "balance = \"hash\" needs a hash table",
    );
    one(
        &hashed("hash = { key = \"path\" }"),
        "clusters[2].hash",
        19,
        "only used with balance = \"hash\"",
    );
    let h = |keys: &str| hashed(&format!("balance = \"hash\"\nhash = {keys}"));
    one(
        &h("{ key = \"header\" }"),
        "clusters[2].hash.key",
        20,
        "needs the header's name",
    );
    one(
        &h("{ key = \"cookie\" }"),
        "clusters[2].hash.key",
        20,
        "needs the cookie's name",
    );
    one(
        &h("{ key = \"header\", name = \"a b\" }"),
        "clusters[2].hash.name",
        20,
        "not a valid HTTP header name",
    );
    one(
        &h("{ key = \"cookie\", name = \"a=b\" }"),
        "clusters[2].hash.name",
        20,
        "not a cookie name",
    );
    one(
        &h("{ key = \"path\", name = \"x\" }"),
        "clusters[2].hash.name",
        20,
        "hashes no named field",
    );
    one(
        &h("{ key = \"client_ip\", generate = true }"),
        "clusters[2].hash.generate",
        20,
        "needs key = \"cookie\"",
    );
    one(
        &h("{ key = \"cookie\", name = \"s\", generate = true, cookie_path = \"x\" }"),
        "clusters[2].hash.cookie_path",
        20,
        "not a cookie path",
    );
    one(
        &h("{ key = \"cookie\", name = \"s\", generate = true, cookie_max_age = \"0s\" }"),
        "clusters[2].hash.cookie_max_age",
        20,
        "greater than zero",
    );
    let errs = errors(&h("{ key = \"body\" }"));
    assert_eq!((errs.len(), errs[0].line), (1, Some(20)), "{errs:?}");
}
