//! `[[filters]]` validation: every problem reported with file, line and key.
use keymaster_config::load_str;

const BASE: &str = r#"[[listeners]]
name = "main"
address = "127.0.0.1:0"

[[routes]]
name = "r"
cluster = "c"

[[clusters]]
name = "c"
servers = [{ address = "127.0.0.1:1" }]
"#;

/// Every error line of `filters` appended to BASE (the first filter line is line 13).
fn errors(filters: &str) -> Vec<String> {
    let text = format!("{BASE}\n{filters}");
    match load_str(&text, "gw.toml") {
        Ok(_) => vec![],
        Err(e) => e.errors().iter().map(|e| e.to_string()).collect(),
    }
}

#[track_caller]
fn expect(filters: &str, want: &[&str]) {
    let got = errors(filters);
    assert_eq!(got.len(), want.len(), "{got:#?}");
    for (g, w) in got.iter().zip(want) {
        assert!(g.starts_with(w), "got {g:?}, want prefix {w:?}");
    }
}

#[test]
fn valid_filters_load() {
    let text = format!(
        "{BASE}\n{}",
        r#"
[[filters]]
name = "h"
type = "headers"
stage = "post"
order = -3
set = { x-a = "1" }
match = { routes = ["r"], path_prefix = "/a", methods = ["GET"], headers = ["x-b"] }

[[filters]]
name = "rl"
type = "rate_limit"
requests = 10
period = "1m"
burst = 20
key = "header"
header = "x-key"
"#
    );
    let c = load_str(&text, "gw.toml").unwrap();
    assert_eq!(c.filters.len(), 2);
    assert_eq!(c.filters[0].order, -3);
    // The effective config serialises (served by /config as JSON).
    let json = serde_json::to_value(&c).unwrap();
    assert_eq!(json["filters"][1]["type"], "rate_limit");
    assert_eq!(json["filters"][1]["key"], "header");
}

#[test]
fn unknown_type_and_key_are_parse_errors_with_lines() {
    expect(
        "[[filters]]\nname = \"x\"\ntype = \"lua\"\n",
        &["gw.toml:15:8: filters[0].type: unknown variant `lua`"],
    );
    expect(
        "[[filters]]\nname = \"x\"\ntype = \"static\"\nbogus = 1\n",
        &["gw.toml:16:1: filters[0].bogus: unknown field `bogus`"],
    );
}

#[test]
fn stage_and_keys_must_fit_the_type() {
    expect(
        r#"[[filters]]
name = "x"
type = "cors"
stage = "post"
allowed_origins = ["*"]
location = "/y"
"#,
        &[
            "gw.toml:16:1: filters[0].stage: a cors filter cannot run in stage \"post\"; expected one of: pre",
            "gw.toml:18:1: filters[0].location: location is not used by a cors filter",
        ],
    );
}

#[test]
fn names_unique_and_present() {
    expect(
        "[[filters]]\nname = \"a\"\nset = { x = \"1\" }\n\n[[filters]]\nname = \"a\"\nset = { x = \"1\" }\n\n[[filters]]\nset = { x = \"1\" }\n",
        &[
            "gw.toml:18:1: filters[1].name: filter name \"a\" is already used by filters[0]",
            "gw.toml:21:1: filters[2].name: every filter needs a name",
        ],
    );
}

#[test]
fn match_is_checked() {
    expect(
        r#"[[filters]]
name = "x"
type = "api_key"
keys = ["k"]
match = { routes = ["r", "nope"], path_prefix = "api", methods = ["get"], headers = ["bad header"] }
"#,
        &[
            "gw.toml:17:26: filters[0].match.routes[1]: unknown route \"nope\"; expected one of: r",
            "gw.toml:17:35: filters[0].match.path_prefix: \"api\" must start with \"/\"",
            "gw.toml:17:67: filters[0].match.methods[0]: methods are case-sensitive",
            "gw.toml:17:86: filters[0].match.headers[0]: \"bad header\" is not a valid HTTP header name",
        ],
    );
}

#[test]
fn type_specific_values() {
    expect(
        "[[filters]]\nname = \"x\"\ntype = \"ip_filter\"\ndeny = [\"10.0.0.0/8\", \"10.0.0/8\"]\n",
        &["gw.toml:16:23: filters[0].deny[1]: \"10.0.0/8\" is not an IP address or CIDR block"],
    );
    expect(
        "[[filters]]\nname = \"x\"\ntype = \"ip_filter\"\n",
        &["gw.toml:15:1: filters[0].type: an ip_filter needs allow or deny"],
    );
    expect(
        "[[filters]]\nname = \"x\"\ntype = \"redirect\"\nstatus = 200\n",
        &[
            "gw.toml:15:1: filters[0].type: a redirect filter needs location",
            "gw.toml:16:1: filters[0].status: 200 is not a redirect status",
        ],
    );
    expect(
        "[[filters]]\nname = \"x\"\ntype = \"api_key\"\nheader = \"a b\"\n",
        &[
            "gw.toml:15:1: filters[0].type: an api_key filter needs keys",
            "gw.toml:16:1: filters[0].header: \"a b\" is not a valid HTTP header name",
        ],
    );
    expect(
        "[[filters]]\nname = \"x\"\ntype = \"rate_limit\"\nrequests = 0\nkey = \"header\"\n",
        &[
            "gw.toml:16:1: filters[0].requests: must be greater than zero",
            "gw.toml:17:1: filters[0].key: key = \"header\" needs header",
        ],
    );
    expect(
        "[[filters]]\nname = \"x\"\ntype = \"rate_limit\"\nrequests = 5\nheader = \"x-k\"\nperiod = \"0s\"\n",
        &[
            "gw.toml:17:1: filters[0].header: header is only used with key = \"header\"",
            "gw.toml:18:1: filters[0].period: must be greater than zero",
        ],
    );
    expect(
        "[[filters]]\nname = \"x\"\ntype = \"reroute\"\nstage = \"route\"\ncluster = \"nope\"\n",
        &["gw.toml:17:1: filters[0].cluster: unknown cluster \"nope\"; expected one of: c"],
    );
    expect(
        "[[filters]]\nname = \"x\"\ntype = \"cors\"\nallowed_origins = [\"https://a.example/\"]\n",
        &["gw.toml:16:20: filters[0].allowed_origins[0]: \"https://a.example/\" is not an origin"],
    );
    expect(
        "[[filters]]\nname = \"x\"\ntype = \"headers\"\n",
        &["gw.toml:15:1: filters[0].type: a headers filter edits nothing"],
    );
    expect(
        "[[filters]]\nname = \"x\"\ntype = \"static\"\nstatus = 99\nheaders = { \"bad name\" = \"v\" }\n",
        &[
            "gw.toml:16:1: filters[0].status: 99 is not a final status",
            "gw.toml:17:13: filters[0].headers.\"bad name\": \"bad name\" is not a valid HTTP header name",
        ],
    );
    // The framing fields are the gateway's: an edit of them is refused, not ignored.
    expect(
        "[[filters]]\nname = \"x\"\nset = { Content-Length = \"2\" }\nadd = { transfer-encoding = \"chunked\" }\nremove = [\"x-a\", \"content-length\"]\n",
        &[
            "gw.toml:15:9: filters[0].set.Content-Length: \"Content-Length\" is written by the gateway",
            "gw.toml:16:9: filters[0].add.transfer-encoding: \"transfer-encoding\" is written by the gateway",
            "gw.toml:17:18: filters[0].remove[1]: \"content-length\" is written by the gateway",
        ],
    );
    // An upstream path that is no request path.
    expect(
        "[[filters]]\nname = \"x\"\ntype = \"reroute\"\nstage = \"route\"\npath = \"/a b\"\n",
        &["gw.toml:17:1: filters[0].path: \"/a b\" is not a valid request path"],
    );
}

/// A route's header edits are held to the same rule as a `headers` filter's.
#[test]
fn a_routes_edits_cannot_touch_the_framing_fields() {
    let text = BASE.replace(
        "cluster = \"c\"\n\n[[clusters]]",
        "cluster = \"c\"\nrequest_headers = { set = { content-length = \"0\" } }\nresponse_headers = { remove = [\"Transfer-Encoding\"] }\n\n[[clusters]]",
    );
    let e = load_str(&text, "gw.toml").expect_err("refused");
    let got: Vec<String> = e.errors().iter().map(|e| e.to_string()).collect();
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(got[0].contains("routes[0].request_headers.set.content-length: \"content-length\" is written by the gateway"), "{got:#?}");
    assert!(
        got[1].contains(
            "routes[0].response_headers.remove[0]: \"Transfer-Encoding\" is written by the gateway"
        ),
        "{got:#?}"
    );
}

#[test]
fn filter_debug_is_validated() {
    expect(
        "[filter_debug]\nheader = \"bad header\"\nsecret = \"short\"\n",
        &[
            "gw.toml:14:1: filter_debug.header: \"bad header\" is not a valid HTTP header name",
            "gw.toml:15:1: filter_debug.secret: too short",
        ],
    );
}
