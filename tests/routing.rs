//! Routing: priority and file order, host (exact, wildcard, port ignored), path (prefix,
//! exact, regex), methods, headers, no match → 404, path rewrites, Host policies, header
//! edits both ways, and the per-route body cap.
mod support;
use bytes::Bytes;
use http_body_util::Full;
use std::net::SocketAddr;
use std::time::Duration;
use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A config with only the given routes (no catch-all) to cluster "o" at `origin`.
fn cfg(origin: SocketAddr, routes: &str) -> String {
    format!(
        r#"{PREAMBLE}
{routes}

[[clusters]]
name = "o"
servers = [{{ address = "{origin}" }}]
connect_timeout = "1s"
response_header_timeout = "5s"
"#
    )
}

/// A route named `name` that tags responses with `x-route: name`, plus `keys` (TOML lines).
fn route(name: &str, keys: &str) -> String {
    format!(
        "[[routes]]\nname = \"{name}\"\ncluster = \"o\"\nresponse_headers = {{ set = {{ \"x-route\" = \"{name}\" }} }}\n{keys}\n\n"
    )
}

/// What the head-echoing origin adds to each response: fields for the routes' header edits.
const ORIGIN_FIELDS: &str = "x-internal: secret\r\ncache-control: public\r\nx-multi: o\r\n";

/// Which route answered (the `x-route` response header), or the status when none did.
async fn which(g: &TestGateway, method: &str, path: &str, headers: &[(&str, &str)]) -> String {
    let mut c = Client::connect(g.addr).await;
    let mut b = http::Request::builder().method(method).uri(path);
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    let r = c.send(b.body(Full::new(Bytes::new())).unwrap()).await;
    match r.headers.get("x-route") {
        Some(v) => v.to_str().unwrap().to_string(),
        None => r.status.to_string(),
    }
}

async fn which_host(g: &TestGateway, host: &str, path: &str) -> String {
    which(g, "GET", path, &[("host", host)]).await
}

/// The request line and headers the origin received (from `head_echo_origin`).
struct Seen {
    line: String,
    head: String,
}

async fn seen(g: &TestGateway, raw_request: &str) -> (u16, Seen) {
    let raw = raw(g.addr, raw_request.as_bytes(), Duration::from_secs(5)).await;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = status_of(&raw).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    (
        status,
        Seen {
            line: body.split("\r\n").next().unwrap_or("").to_string(),
            head: body.to_string(),
        },
    )
}

fn header_values<'a>(head: &'a str, name: &str) -> Vec<&'a str> {
    head.split("\r\n")
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn higher_priority_wins_and_ties_keep_file_order() {
    let s = stub();
    let routes = [
        route("low", "priority = 1\nmatch = { path_prefix = \"/a\" }"),
        route("high", "priority = 10\nmatch = { path_prefix = \"/a\" }"),
        route(
            "tie-first",
            "priority = 5\nmatch = { path_prefix = \"/b\" }",
        ),
        route(
            "tie-second",
            "priority = 5\nmatch = { path_prefix = \"/b\" }",
        ),
        route(
            "negative",
            "priority = -5\nmatch = { path_prefix = \"/c\" }",
        ),
        route("zero", "match = { path_prefix = \"/c\" }"),
    ]
    .concat();
    let g = start_gateway(&cfg(s.local_addr(), &routes));
    assert_eq!(which(&g, "GET", "/a", &[]).await, "high");
    assert_eq!(which(&g, "GET", "/b", &[]).await, "tie-first");
    assert_eq!(which(&g, "GET", "/c", &[]).await, "zero");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_matching_route_gives_404() {
    let s = stub();
    let g = start_gateway(&cfg(
        s.local_addr(),
        &route("only", "match = { path_prefix = \"/only\" }"),
    ));
    let r = get(g.addr, "/other").await;
    assert_eq!(r.status, 404);
    assert!(r.headers.get("x-route").is_none());
    assert_eq!(r.headers["x-request-id"].len(), 32);
    assert_eq!(which(&g, "GET", "/only/x", &[]).await, "only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_host_is_case_insensitive_and_ignores_the_port() {
    let s = stub();
    let routes = [
        route(
            "api",
            "priority = 1\nmatch = { host = \"api.example.com\" }",
        ),
        route("ip", "priority = 1\nmatch = { host = \"10.1.2.3\" }"),
        route("fallback", ""),
    ]
    .concat();
    let g = start_gateway(&cfg(s.local_addr(), &routes));
    assert_eq!(which_host(&g, "api.example.com", "/").await, "api");
    assert_eq!(which_host(&g, "API.Example.COM:8080", "/").await, "api");
    assert_eq!(which_host(&g, "api.example.com:1", "/").await, "api");
    assert_eq!(which_host(&g, "x.api.example.com", "/").await, "fallback");
    assert_eq!(which_host(&g, "api.example.co", "/").await, "fallback");
    assert_eq!(which_host(&g, "10.1.2.3:443", "/").await, "ip");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcard_host_matches_subdomains_at_any_depth_only() {
    let s = stub();
    let routes = [
        route("wild", "priority = 1\nmatch = { host = \"*.example.com\" }"),
        route("fallback", ""),
    ]
    .concat();
    let g = start_gateway(&cfg(s.local_addr(), &routes));
    assert_eq!(which_host(&g, "a.example.com", "/").await, "wild");
    assert_eq!(which_host(&g, "a.b.example.com:9000", "/").await, "wild");
    assert_eq!(which_host(&g, "A.EXAMPLE.com", "/").await, "wild");
    assert_eq!(which_host(&g, "example.com", "/").await, "fallback");
    assert_eq!(which_host(&g, "badexample.com", "/").await, "fallback");
    assert_eq!(which_host(&g, "a.example.com.evil", "/").await, "fallback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_authority_is_matched_instead_of_host() {
    let s = stub();
    let routes = [
        route(
            "api",
            "priority = 1\nmatch = { host = \"api.example.com\" }",
        ),
        route("fallback", ""),
    ]
    .concat();
    let g = start_gateway(&cfg(s.local_addr(), &routes));
    let raw = raw(
        g.addr,
        b"GET http://api.example.com:8080/x HTTP/1.1\r\nHost: other.example\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    let text = String::from_utf8_lossy(&raw);
    assert!(text.contains("\r\nx-route: api\r\n"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_prefix_exact_and_regex() {
    let s = stub();
    let routes = [
        route(
            "exact",
            "priority = 3\nmatch = { path_exact = \"/healthz\" }",
        ),
        route(
            "regex",
            "priority = 2\nmatch = { path_regex = \"^/v[0-9]+/items$\" }",
        ),
        route(
            "unanchored",
            "priority = 2\nmatch = { path_regex = \"\\\\.png\" }",
        ),
        route("prefix", "priority = 1\nmatch = { path_prefix = \"/api\" }"),
        route("fallback", ""),
    ]
    .concat();
    let g = start_gateway(&cfg(s.local_addr(), &routes));
    let cases = [
        ("/healthz", "exact"),
        ("/healthz?verbose=1", "exact"),
        ("/healthz/", "fallback"),
        ("/healthzz", "fallback"),
        ("/v1/items", "regex"),
        ("/v42/items?page=2", "regex"),
        ("/v1/items/3", "fallback"),
        ("/vx/items", "fallback"),
        ("/img/logo.png", "unanchored"),
        ("/api", "prefix"),
        ("/apix", "prefix"),
        ("/api/users", "prefix"),
        ("/ap", "fallback"),
        ("/API", "fallback"),
    ];
    for (path, want) in cases {
        assert_eq!(which(&g, "GET", path, &[]).await, want, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_restrict_a_route() {
    let s = stub();
    let routes = [
        route(
            "read",
            "priority = 1\nmatch = { methods = [\"GET\", \"HEAD\"] }",
        ),
        route("fallback", ""),
    ]
    .concat();
    let g = start_gateway(&cfg(s.local_addr(), &routes));
    assert_eq!(which(&g, "GET", "/", &[]).await, "read");
    assert_eq!(which(&g, "HEAD", "/", &[]).await, "read");
    assert_eq!(which(&g, "POST", "/", &[]).await, "fallback");
    assert_eq!(which(&g, "DELETE", "/", &[]).await, "fallback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_match_needs_an_exact_value() {
    let s = stub();
    let routes = [
        route(
            "canary",
            "priority = 1\nmatch = { headers = { \"x-canary\" = \"1\" } }",
        ),
        route("fallback", ""),
    ]
    .concat();
    let g = start_gateway(&cfg(s.local_addr(), &routes));
    assert_eq!(which(&g, "GET", "/", &[("x-canary", "1")]).await, "canary");
    assert_eq!(which(&g, "GET", "/", &[("X-Canary", "1")]).await, "canary");
    assert_eq!(
        which(&g, "GET", "/", &[("x-canary", "2")]).await,
        "fallback"
    );
    assert_eq!(
        which(&g, "GET", "/", &[("x-canary", "10")]).await,
        "fallback"
    );
    assert_eq!(which(&g, "GET", "/", &[]).await, "fallback");
    assert_eq!(
        which(&g, "GET", "/", &[("x-canary", "2"), ("x-canary", "1")]).await,
        "canary"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strip_prefix_rewrite() {
    let o = head_echo_origin_with(ORIGIN_FIELDS).await;
    let g = start_gateway(&cfg(
        o.addr,
        &route(
            "api",
            "match = { path_prefix = \"/api\" }\nrewrite = { strip_prefix = \"/api\" }",
        ),
    ));
    let cases = [
        ("/api/users?x=1&y=%20", "/users?x=1&y=%20"),
        ("/api", "/"),
        ("/api/", "/"),
        ("/api?q", "/?q"),
        ("/api/a%2Cb", "/a%2Cb"),
    ];
    for (from, to) in cases {
        let (status, s) = seen(
            &g,
            &format!("GET {from} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert_eq!(status, 200, "{from}");
        assert_eq!(s.line, format!("GET {to} HTTP/1.1"), "{from}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_prefix_rewrite() {
    let o = head_echo_origin_with(ORIGIN_FIELDS).await;
    let g = start_gateway(&cfg(
        o.addr,
        &route(
            "v1",
            "match = { path_prefix = \"/v1/\" }\nrewrite = { replace_prefix = \"/v2/\" }",
        ),
    ));
    for (from, to) in [
        ("/v1/users?id=7", "/v2/users?id=7"),
        ("/v1/", "/v2/"),
        ("/v1/a/b/c", "/v2/a/b/c"),
    ] {
        let (status, s) = seen(
            &g,
            &format!("GET {from} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert_eq!(status, 200, "{from}");
        assert_eq!(s.line, format!("GET {to} HTTP/1.1"), "{from}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_path_rewrite_keeps_the_query() {
    let o = head_echo_origin_with(ORIGIN_FIELDS).await;
    let g = start_gateway(&cfg(
        o.addr,
        &route(
            "health",
            "match = { path_exact = \"/healthz\" }\nrewrite = { replace_path = \"/status\" }",
        ),
    ));
    for (from, to) in [
        ("/healthz?deep=1&x=%2F", "/status?deep=1&x=%2F"),
        ("/healthz", "/status"),
    ] {
        let (status, s) = seen(
            &g,
            &format!("GET {from} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert_eq!(status, 200, "{from}");
        assert_eq!(s.line, format!("GET {to} HTTP/1.1"), "{from}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_policy_preserve_origin_and_fixed() {
    let o = head_echo_origin_with(ORIGIN_FIELDS).await;
    let routes = [
        route("keep", "match = { path_prefix = \"/keep\" }"),
        route(
            "orig",
            "match = { path_prefix = \"/orig\" }\nhost_policy = \"origin\"",
        ),
        route(
            "fixed",
            "match = { path_prefix = \"/fixed\" }\nhost_policy = \"fixed\"\nfixed_host = \"api.internal:8080\"",
        ),
    ]
    .concat();
    let g = start_gateway(&cfg(o.addr, &routes));
    let origin = o.addr.to_string();
    for (path, want) in [
        ("/keep", "client.example:1234"),
        ("/orig", origin.as_str()),
        ("/fixed", "api.internal:8080"),
    ] {
        let (status, s) = seen(
            &g,
            &format!(
                "GET {path} HTTP/1.1\r\nHost: client.example:1234\r\nConnection: close\r\n\r\n"
            ),
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(header_values(&s.head, "host"), [want], "{path}: {}", s.head);
        // X-Forwarded-Host always says what the client addressed.
        assert_eq!(
            header_values(&s.head, "x-forwarded-host"),
            ["client.example:1234"],
            "{path}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_policy_preserve_sends_the_absolute_form_authority() {
    // RFC 9112 §3.2.2: with an absolute-form target the Host field is replaced by the
    // target's authority; the route was chosen by that authority, so the origin must see it.
    let o = head_echo_origin_with(ORIGIN_FIELDS).await;
    let g = start_gateway(&cfg(
        o.addr,
        &route("api", "match = { host = \"api.example.com\" }"),
    ));
    let (status, s) = seen(
        &g,
        "GET http://api.example.com/x HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(s.line, "GET /x HTTP/1.1");
    assert_eq!(
        header_values(&s.head, "host"),
        ["api.example.com"],
        "{}",
        s.head
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_header_edits_remove_then_set_then_add() {
    let o = head_echo_origin_with(ORIGIN_FIELDS).await;
    let g = start_gateway(&cfg(
        o.addr,
        &route(
            "edit",
            "[routes.request_headers]\nremove = [\"x-debug\", \"x-replaced\"]\nset = { \"x-api-version\" = \"2\" }\nadd = { \"x-added\" = \"gw\", \"x-replaced\" = \"new\" }",
        ),
    ));
    let (status, s) = seen(
        &g,
        "GET / HTTP/1.1\r\nHost: x\r\nX-Debug: 1\r\nx-api-version: 1\r\nx-api-version: 0\r\nx-added: client\r\nx-replaced: old\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200);
    assert!(header_values(&s.head, "x-debug").is_empty(), "{}", s.head);
    assert_eq!(header_values(&s.head, "x-api-version"), ["2"]);
    assert_eq!(header_values(&s.head, "x-added"), ["client", "gw"]);
    assert_eq!(header_values(&s.head, "x-replaced"), ["new"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_header_edits_remove_then_set_then_add() {
    let o = head_echo_origin_with(ORIGIN_FIELDS).await;
    let g = start_gateway(&cfg(
        o.addr,
        "[[routes]]\nname = \"edit\"\ncluster = \"o\"\n[routes.response_headers]\nremove = [\"x-internal\"]\nset = { \"cache-control\" = \"no-store\" }\nadd = { \"x-multi\" = \"gw\", \"x-frame-options\" = \"DENY\" }\n",
    ));
    let r = get(g.addr, "/").await;
    assert_eq!(r.status, 200);
    assert!(r.headers.get("x-internal").is_none());
    let all = |n: &str| -> Vec<String> {
        r.headers
            .get_all(n)
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(all("cache-control"), ["no-store"]);
    assert_eq!(all("x-multi"), ["o", "gw"]);
    assert_eq!(all("x-frame-options"), ["DENY"]);
}

fn capped(origin: SocketAddr) -> String {
    cfg(origin, &route("capped", "max_body_size = 1000"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_body_over_the_cap_gives_413_without_touching_the_origin() {
    let o = head_echo_origin_with(ORIGIN_FIELDS).await;
    let g = start_gateway(&capped(o.addr));
    let mut c = Client::connect(g.addr).await;
    let r = c
        .send(
            http::Request::post("/")
                .body(Full::new(Bytes::from(vec![b'a'; 1001])))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, 413);
    assert_eq!(o.connections(), 0);

    // Exactly at the cap is fine.
    let mut c = Client::connect(g.addr).await;
    let r = c
        .send(
            http::Request::post("/")
                .body(Full::new(Bytes::from(vec![b'a'; 1000])))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(String::from_utf8_lossy(&r.body).contains("content-length: 1000"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_body_over_the_cap_is_refused_before_100_continue() {
    let o = head_echo_origin_with(ORIGIN_FIELDS).await;
    let g = start_gateway(&capped(o.addr));
    let mut s = TcpStream::connect(g.addr).await.unwrap();
    s.write_all(
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    let mut carry = Vec::new();
    let head = read_head(&mut s, &mut carry).await.expect("a response");
    assert!(head.starts_with("HTTP/1.1 413 "), "{head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_body_growing_past_the_cap_gives_413() {
    let s = stub();
    let g = start_gateway(&capped(s.local_addr()));
    let mut c = TcpStream::connect(g.addr).await.unwrap();
    // /__inspect reads the whole body before answering, so the cap trips first.
    c.write_all(b"POST /__inspect HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let chunk = vec![b'b'; 600];
    for _ in 0..2 {
        c.write_all(b"258\r\n").await.unwrap();
        c.write_all(&chunk).await.unwrap();
        c.write_all(b"\r\n").await.unwrap();
    }
    c.write_all(b"0\r\n\r\n").await.unwrap();
    let mut carry = Vec::new();
    let head = read_head(&mut c, &mut carry).await.expect("a response");
    assert!(head.starts_with("HTTP/1.1 413 "), "{head}");

    // Under the cap, chunked is fine.
    let mut c = TcpStream::connect(g.addr).await.unwrap();
    c.write_all(
        b"POST /__inspect HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    c.write_all(b"3e8\r\n").await.unwrap();
    c.write_all(&vec![b'c'; 1000]).await.unwrap();
    c.write_all(b"\r\n0\r\n\r\n").await.unwrap();
    let out = read_for(&mut c, Duration::from_secs(5)).await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
    assert!(text.contains("\"body_len\":1000"), "{text}");
}
