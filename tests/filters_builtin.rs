//! The built-in filters configured by `[[filters]]`: headers, redirect, static, cors,
//! ip_filter, api_key, rate_limit and reroute, against the real gateway and an echo origin.
mod support;
use bytes::Bytes;
use http_body_util::Full;
use keymaster_config::FilterStage;
use keymaster_gateway::filter::{done, Filter, FilterCtx, FilterFuture, FilterSpec, Needs};
use std::net::SocketAddr;
use support::*;

/// Echoes each request head, with `X-Origin: {tag}` (as the origin wrote it: a head in
/// wire form keeps the capitals) and a field the filters remove.
async fn echo_origin(tag: &str) -> RawOrigin {
    head_echo_origin_with(format!("X-Origin: {tag}\r\nx-internal: secret\r\n")).await
}

fn cfg(origin: SocketAddr, alt: SocketAddr, filters: &str) -> String {
    format!(
        r#"{PREAMBLE}
{filters}

[[routes]]
name = "api"
cluster = "o"
match = {{ path_prefix = "/api" }}

[[routes]]
name = "default"
cluster = "o"
priority = -1

[[clusters]]
name = "o"
servers = [{{ address = "{origin}" }}]
connect_timeout = "1s"

[[clusters]]
name = "alt"
servers = [{{ address = "{alt}" }}]
connect_timeout = "1s"
"#
    )
}

struct Fixture {
    g: TestGateway,
    o: RawOrigin,
    _alt: RawOrigin,
}

async fn fixture(filters: &str) -> Fixture {
    fixture_with(filters, vec![]).await
}

async fn fixture_with(filters: &str, natives: Vec<FilterSpec>) -> Fixture {
    let o = echo_origin("o").await;
    let alt = echo_origin("alt").await;
    let g = start_gateway_with_filters(&cfg(o.addr, alt.addr, filters), natives);
    Fixture { g, o, _alt: alt }
}

async fn req(c: &mut Client, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut b = http::Request::builder().method(method).uri(path);
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    c.send(b.body(Full::new(Bytes::new())).unwrap()).await
}

fn body(r: &Reply) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

#[tokio::test]
async fn headers_filter_edits_request_and_response() {
    let f = fixture(
        r#"
[[filters]]
name = "req"
type = "headers"
stage = "pre"
set = { x-set = "s" }
add = { x-add = "a" }
remove = ["x-drop"]

[[filters]]
name = "resp"
type = "headers"
stage = "post"
set = { x-resp = "r" }
remove = ["x-internal"]
match = { routes = ["api"] }
"#,
    )
    .await;
    let mut c = Client::connect(f.g.addr).await;
    let r = req(
        &mut c,
        "GET",
        "/api/x",
        &[("x-drop", "1"), ("x-add", "0"), ("x-set", "old")],
    )
    .await;
    let b = body(&r);
    assert!(
        b.contains("x-set: s\r\n") && !b.contains("x-set: old"),
        "{b}"
    );
    assert!(
        b.contains("x-add: 0\r\n") && b.contains("x-add: a\r\n"),
        "{b}"
    );
    assert!(!b.contains("x-drop"), "{b}");
    assert_eq!(r.headers["x-resp"], "r");
    assert!(!r.headers.contains_key("x-internal"));
    // Route match: the response filter only applies to route "api".
    let r = req(&mut c, "GET", "/other", &[]).await;
    assert!(r.headers.contains_key("x-internal"));
    assert!(!r.headers.contains_key("x-resp"));
}

/// A filter that adds a header the proxy stage acts on (here `Connection`, naming a field as
/// hop-by-hop) must be seen by the header duties after the chain, whichever way it edits.
struct ConnectionNames(&'static str);

impl Filter for ConnectionNames {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        ctx.append_request_header(
            http::header::CONNECTION,
            http::HeaderValue::from_static(self.0),
        );
        done(Ok(()))
    }
}

#[tokio::test]
async fn header_duties_see_what_filters_added() {
    let f = fixture_with(
        r#"
[[filters]]
name = "hop"
type = "headers"
stage = "pre"
set = { connection = "x-hop-a" }
"#,
        vec![FilterSpec::new(
            "hop-native",
            FilterStage::Route,
            0,
            ConnectionNames("x-hop-b"),
        )],
    )
    .await;
    let mut c = Client::connect(f.g.addr).await;
    let r = req(
        &mut c,
        "GET",
        "/x",
        &[("x-hop-a", "1"), ("x-hop-b", "2"), ("x-kept", "3")],
    )
    .await;
    let b = body(&r);
    // Both Connection lines (the config filter's, the native one's) name dropped fields.
    assert!(!b.contains("x-hop-a") && !b.contains("x-hop-b"), "{b}");
    assert!(b.contains("x-kept: 3\r\n"), "{b}");
    assert!(!b.to_ascii_lowercase().contains("connection:"), "{b}");
}

/// The head of a 200 response to `GET /x`, as the client gets it.
async fn response_head(f: &Fixture) -> String {
    let raw = raw(
        f.g.addr,
        b"GET /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
        std::time::Duration::from_secs(5),
    )
    .await;
    let (head, _) = split_head(&raw);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    head
}

/// A post filter that reads the response (through `response_headers`) and appends a field.
struct ReadAndAppend;

impl Filter for ReadAndAppend {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        let seen = ctx.response_headers().map(|h| {
            let v = |n: &str| {
                h.get(n)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_string()
            };
            format!("{}/{}", v("content-length"), v("x-origin"))
        });
        if let Some(seen) = seen.and_then(|s| http::HeaderValue::from_str(&s).ok()) {
            ctx.append_response_header(http::HeaderName::from_static("x-seen"), seen);
        }
        done(Ok(()))
    }
}

/// Post filters that read the origin's head and only append to it leave it in wire form
/// (field names as the origin wrote them); one that sets a field gets the map (names
/// lower-case). Either way they see the origin's fields, Content-Length included.
#[tokio::test]
async fn appending_post_filters_keep_the_origin_head_in_wire_form() {
    for (edit, wire_form) in [("add", true), ("set", false)] {
        let filters = format!(
            "[[filters]]\nname = \"out\"\ntype = \"headers\"\nstage = \"post\"\n{edit} = {{ x-out = \"1\" }}\n"
        );
        let natives = vec![FilterSpec::new(
            "read",
            FilterStage::Post,
            -1,
            ReadAndAppend,
        )];
        let f = fixture_with(&filters, natives).await;
        let head = response_head(&f).await;
        assert_eq!(head.contains("\r\nX-Origin: o\r\n"), wire_form, "{head}");
        assert_eq!(head_header(&head, "x-out"), Some("1"), "{head}");
        let len = head_header(&head, "content-length").unwrap().to_string();
        assert_eq!(
            head_header(&head, "x-seen"),
            Some(&*format!("{len}/o")),
            "{head}"
        );
        assert_eq!(head_header(&head, "via"), Some("1.1 keymaster"), "{head}");
        assert!(head_header(&head, "x-request-id").is_some(), "{head}");
    }
}

/// A post filter that appends a Date field.
struct AppendDate;

impl Filter for AppendDate {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        let date = http::HeaderValue::from_static("Thu, 01 Jan 2026 00:00:00 GMT");
        ctx.append_response_header(http::header::DATE, date);
        done(Ok(()))
    }
}

/// Appending a field hyper writes itself (here Date) turns a wire-form head into the map, so
/// the client never gets it twice.
#[tokio::test]
async fn appending_a_field_hyper_writes_uses_the_map() {
    let natives = vec![FilterSpec::new("date", FilterStage::Post, 0, AppendDate)];
    let f = fixture_with("", natives).await;
    let head = response_head(&f).await;
    let dates = head
        .split("\r\n")
        .filter(|l| l.to_ascii_lowercase().starts_with("date:"))
        .count();
    assert_eq!(dates, 1, "{head}");
    assert_eq!(
        head_header(&head, "date"),
        Some("Thu, 01 Jan 2026 00:00:00 GMT"),
        "{head}"
    );
    assert!(!head.contains("X-Origin: o"), "left in wire form: {head}");
}

#[tokio::test]
async fn redirect_and_static_answer_without_the_origin() {
    let f = fixture(
        r#"
[[filters]]
name = "moved"
type = "redirect"
status = 301
location = "https://example.com/new"
match = { path_prefix = "/old" }

[[filters]]
name = "tmp"
type = "redirect"
location = "/elsewhere"
match = { path_prefix = "/tmp" }

[[filters]]
name = "health"
type = "static"
status = 200
headers = { content-type = "application/json" }
body = '{"ok":true}'
match = { path_prefix = "/health", methods = ["GET"] }

[[filters]]
name = "post-tag"
type = "headers"
stage = "post"
set = { x-post = "1" }
"#,
    )
    .await;
    let mut c = Client::connect(f.g.addr).await;
    let r = req(&mut c, "GET", "/old/page", &[]).await;
    assert_eq!(r.status, 301);
    assert_eq!(r.headers["location"], "https://example.com/new");
    assert_eq!(
        r.headers["x-post"], "1",
        "post filters run on filter responses"
    );
    let r = req(&mut c, "GET", "/tmp", &[]).await;
    assert_eq!(r.status, 302);
    assert_eq!(r.headers["location"], "/elsewhere");
    let r = req(&mut c, "GET", "/health", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "application/json");
    assert_eq!(body(&r), r#"{"ok":true}"#);
    assert_eq!(f.o.connections(), 0);
    let r = req(&mut c, "POST", "/health", &[]).await;
    assert_eq!(r.headers["x-origin"], "o");
}

struct Fail;
impl Filter for Fail {
    fn run<'a>(&'a self, _ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        done(Err("nope".into()))
    }
}

#[tokio::test]
async fn static_in_the_error_stage_is_the_error_response() {
    let f = fixture_with(
        r#"
[[filters]]
name = "maintenance"
type = "static"
stage = "error"
status = 503
headers = { retry-after = "30" }
body = "try later\n"
"#,
        vec![FilterSpec::new("broken", FilterStage::Pre, 0, Fail)],
    )
    .await;
    let r = get(f.g.addr, "/x").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.headers["retry-after"], "30");
    assert_eq!(body(&r), "try later\n");
}

#[tokio::test]
async fn cors_preflight_and_actual_requests() {
    let f = fixture(
        r#"
[[filters]]
name = "cors"
type = "cors"
allowed_origins = ["https://app.example.com"]
allowed_methods = ["GET", "PUT"]
allowed_headers = ["x-token"]
allow_credentials = true
max_age = "10m"
"#,
    )
    .await;
    let mut c = Client::connect(f.g.addr).await;
    let pre = [
        ("origin", "https://app.example.com"),
        ("access-control-request-method", "PUT"),
    ];
    let r = req(&mut c, "OPTIONS", "/api/x", &pre).await;
    assert_eq!(r.status, 204);
    assert_eq!(
        r.headers["access-control-allow-origin"],
        "https://app.example.com"
    );
    assert_eq!(r.headers["access-control-allow-methods"], "GET, PUT");
    assert_eq!(r.headers["access-control-allow-headers"], "x-token");
    assert_eq!(r.headers["access-control-allow-credentials"], "true");
    assert_eq!(r.headers["access-control-max-age"], "600");
    assert_eq!(r.headers["vary"], "Origin");
    assert_eq!(f.o.connections(), 0, "preflight answered in pre");
    let r = req(
        &mut c,
        "OPTIONS",
        "/api/x",
        &[
            ("origin", "https://evil.example"),
            ("access-control-request-method", "PUT"),
        ],
    )
    .await;
    assert_eq!(r.status, 403);
    assert!(!r.headers.contains_key("access-control-allow-origin"));
    // Actual requests are proxied; allowed origins get the headers on the way out.
    let r = req(
        &mut c,
        "GET",
        "/api/x",
        &[("origin", "https://app.example.com")],
    )
    .await;
    assert_eq!(r.headers["x-origin"], "o");
    assert_eq!(
        r.headers["access-control-allow-origin"],
        "https://app.example.com"
    );
    let r = req(
        &mut c,
        "GET",
        "/api/x",
        &[("origin", "https://evil.example")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(!r.headers.contains_key("access-control-allow-origin"));
    // A plain OPTIONS (no preflight headers) goes to the origin.
    let r = req(&mut c, "OPTIONS", "/api/x", &[]).await;
    assert_eq!(r.headers["x-origin"], "o");
}

#[tokio::test]
async fn cors_any_origin() {
    let f =
        fixture("[[filters]]\nname = \"cors\"\ntype = \"cors\"\nallowed_origins = [\"*\"]\n").await;
    let r = Client::connect(f.g.addr)
        .await
        .send(
            http::Request::get("/x")
                .header("origin", "https://any.example")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
    assert_eq!(r.headers["access-control-allow-origin"], "*");
}

#[tokio::test]
async fn ip_filter_allow_and_deny() {
    let f = fixture(
        r#"
[[filters]]
name = "deny-local"
type = "ip_filter"
deny = ["10.0.0.0/8", "127.0.0.0/8"]
match = { path_prefix = "/api" }

[[filters]]
name = "allow-only"
type = "ip_filter"
allow = ["192.0.2.0/24"]
match = { path_prefix = "/internal" }

[[filters]]
name = "allow-me"
type = "ip_filter"
allow = ["10.1.0.0/16", "127.0.0.1"]
match = { path_prefix = "/mine" }
"#,
    )
    .await;
    let mut c = Client::connect(f.g.addr).await;
    assert_eq!(req(&mut c, "GET", "/api/x", &[]).await.status, 403);
    assert_eq!(req(&mut c, "GET", "/internal", &[]).await.status, 403);
    assert_eq!(req(&mut c, "GET", "/mine", &[]).await.status, 200);
    assert_eq!(req(&mut c, "GET", "/other", &[]).await.status, 200);
    assert_eq!(f.o.connections(), 1);
}

#[tokio::test]
async fn api_key_checks_the_header() {
    let f = fixture(
        r#"
[[filters]]
name = "keys"
type = "api_key"
keys = ["k1", "k2"]
match = { routes = ["api"] }

[[filters]]
name = "custom"
type = "api_key"
header = "authorization"
keys = ["Bearer t0ken"]
match = { path_prefix = "/secure" }
"#,
    )
    .await;
    let mut c = Client::connect(f.g.addr).await;
    let r = req(&mut c, "GET", "/api/x", &[]).await;
    assert_eq!(r.status, 401);
    assert_eq!(body(&r), "401 Unauthorized\n");
    assert_eq!(
        req(&mut c, "GET", "/api/x", &[("x-api-key", "nope")])
            .await
            .status,
        401
    );
    assert_eq!(
        req(&mut c, "GET", "/api/x", &[("x-api-key", "k2")])
            .await
            .status,
        200
    );
    assert_eq!(req(&mut c, "GET", "/secure", &[]).await.status, 401);
    assert_eq!(
        req(
            &mut c,
            "GET",
            "/secure",
            &[("authorization", "Bearer t0ken")]
        )
        .await
        .status,
        200
    );
    assert_eq!(req(&mut c, "GET", "/open", &[]).await.status, 200);
}

#[tokio::test]
async fn rate_limit_by_ip_header_and_route() {
    let f = fixture(
        r#"
[[filters]]
name = "per-ip"
type = "rate_limit"
requests = 2
period = "1h"
match = { path_prefix = "/ip" }

[[filters]]
name = "per-tenant"
type = "rate_limit"
requests = 1
period = "1h"
key = "header"
header = "x-tenant"
match = { path_prefix = "/tenant" }

[[filters]]
name = "per-route"
type = "rate_limit"
requests = 4
burst = 1
key = "route"
match = { routes = ["api"] }
"#,
    )
    .await;
    let mut c = Client::connect(f.g.addr).await;
    assert_eq!(req(&mut c, "GET", "/ip", &[]).await.status, 200);
    assert_eq!(req(&mut c, "GET", "/ip", &[]).await.status, 200);
    let r = req(&mut c, "GET", "/ip", &[]).await;
    assert_eq!(r.status, 429);
    let wait: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(wait > 60 && wait <= 1800, "{wait}");
    // A new connection from the same IP shares the bucket.
    assert_eq!(get(f.g.addr, "/ip").await.status, 429);

    assert_eq!(
        req(&mut c, "GET", "/tenant", &[("x-tenant", "a")])
            .await
            .status,
        200
    );
    assert_eq!(
        req(&mut c, "GET", "/tenant", &[("x-tenant", "a")])
            .await
            .status,
        429
    );
    assert_eq!(
        req(&mut c, "GET", "/tenant", &[("x-tenant", "b")])
            .await
            .status,
        200
    );

    // burst 1 at 4/s: the second within 250 ms (a token's refill; wide enough for a busy
    // machine) is refused, its Retry-After rounded up to 1 s; the third after it passes.
    assert_eq!(req(&mut c, "GET", "/api/1", &[]).await.status, 200);
    let r = req(&mut c, "GET", "/api/2", &[]).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.headers["retry-after"], "1");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(req(&mut c, "GET", "/api/3", &[]).await.status, 200);
    let text = f.g.gateway().metrics_text();
    assert_eq!(
        metric(
            &text,
            "keymaster_filter_invocations_total{filter=\"per-ip\"}"
        ),
        4.0
    );
}

#[tokio::test]
async fn reroute_chooses_cluster_path_and_host() {
    let f = fixture(
        r#"
[[filters]]
name = "to-alt"
type = "reroute"
stage = "route"
cluster = "alt"
path = "/v2/items"
host = "alt.internal"
match = { path_prefix = "/items" }
"#,
    )
    .await;
    let mut c = Client::connect(f.g.addr).await;
    let r = req(&mut c, "GET", "/items?page=2", &[]).await;
    assert_eq!(r.headers["x-origin"], "alt");
    let b = body(&r);
    assert!(b.starts_with("GET /v2/items?page=2 HTTP/1.1\r\n"), "{b}");
    assert_eq!(head_header(&b, "host"), Some("alt.internal"));
    assert_eq!(req(&mut c, "GET", "/x", &[]).await.headers["x-origin"], "o");
}

#[tokio::test]
async fn cors_headers_also_on_answers_of_later_filters() {
    let f = fixture(
        r#"
[[filters]]
name = "cors"
type = "cors"
order = -10
allowed_origins = ["https://app.example.com"]

[[filters]]
name = "keys"
type = "api_key"
keys = ["k1"]
"#,
    )
    .await;
    let mut c = Client::connect(f.g.addr).await;
    let r = req(
        &mut c,
        "GET",
        "/x",
        &[("origin", "https://app.example.com")],
    )
    .await;
    assert_eq!(r.status, 401);
    assert_eq!(
        r.headers["access-control-allow-origin"],
        "https://app.example.com"
    );
}

/// Reads the request id from the request headers and forwards it as `x-seen-id`.
struct SeesRequestId;
impl Filter for SeesRequestId {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        if let Some(id) = ctx.request_headers().get("x-request-id").cloned() {
            ctx.set_request_header(http::HeaderName::from_static("x-seen-id"), id);
        }
        done(Ok(()))
    }
}

/// Sets a request header through one of the context's ways of doing it.
struct SetsHeader {
    name: &'static str,
    how: &'static str,
}
impl Filter for SetsHeader {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        let (name, value) = (
            http::HeaderName::from_static(self.name),
            http::HeaderValue::from_static("mine"),
        );
        match self.how {
            "set" => ctx.set_request_header(name, value),
            "append" => ctx.append_request_header(name, value),
            _ => {
                ctx.request_headers_mut().insert(name, value);
            }
        }
        done(Ok(()))
    }

    fn needs(&self) -> Needs {
        Needs::REQUEST_LINE
    }
}

/// The `x-request-id` lines of the request head the origin got (echoed in the body).
fn forwarded_ids(r: &Reply) -> Vec<String> {
    body(r)
        .lines()
        .filter_map(|l| l.strip_prefix("x-request-id: "))
        .map(str::to_string)
        .collect()
}

/// A generated request id reaches the origin exactly once whether or not the filters read
/// the request headers (when none does, it is not put in their map but added on the way
/// out); a filter reading the headers sees it; a filter setting the header wins, and one
/// removing it removes it.
#[tokio::test]
async fn request_id_goes_out_once_whatever_the_filters_read() {
    let f = fixture(
        r#"
[[filters]]
name = "in"
type = "headers"
stage = "pre"
set = { x-in = "1" }
"#,
    )
    .await;
    let mut c = Client::connect(f.g.addr).await;
    let r = req(&mut c, "GET", "/x", &[]).await;
    let id = r.headers["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(forwarded_ids(&r), vec![id], "{}", body(&r));
    assert!(body(&r).contains("x-in: 1\r\n"));

    let f = fixture_with(
        "",
        vec![FilterSpec::new("sees", FilterStage::Pre, 0, SeesRequestId)],
    )
    .await;
    let mut c = Client::connect(f.g.addr).await;
    let r = req(&mut c, "GET", "/x", &[]).await;
    let id = r.headers["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(forwarded_ids(&r), vec![id.clone()], "{}", body(&r));
    assert!(
        body(&r).contains(&format!("x-seen-id: {id}\r\n")),
        "{}",
        body(&r)
    );

    for (edit, want) in [
        (
            r#"set = { x-request-id = "mine" }"#,
            vec!["mine".to_string()],
        ),
        (r#"remove = ["x-request-id"]"#, vec![]),
    ] {
        let f = fixture(&format!(
            "[[filters]]\nname = \"id\"\ntype = \"headers\"\nstage = \"pre\"\n{edit}\n"
        ))
        .await;
        let mut c = Client::connect(f.g.addr).await;
        let r = req(&mut c, "GET", "/x", &[]).await;
        assert_eq!(forwarded_ids(&r), want, "{edit}: {}", body(&r));
    }

    // A native filter that does not read the headers (the generated id is added on the way
    // out) setting the field itself, each way; and one setting a field with a name as long
    // as the request id's, which must not stop the generated id.
    for how in ["set", "append", "map"] {
        for (name, mine) in [("x-request-id", true), ("x-request-ix", false)] {
            let sets = SetsHeader { name, how };
            let f =
                fixture_with("", vec![FilterSpec::new("sets", FilterStage::Pre, 0, sets)]).await;
            let mut c = Client::connect(f.g.addr).await;
            let r = req(&mut c, "GET", "/x", &[]).await;
            let ids = forwarded_ids(&r);
            if mine {
                assert_eq!(ids, vec!["mine".to_string()], "{how} {name}: {}", body(&r));
            } else {
                let id = r.headers["x-request-id"].to_str().unwrap().to_string();
                assert_eq!(ids, vec![id], "{how} {name}: {}", body(&r));
            }
        }
    }
}
