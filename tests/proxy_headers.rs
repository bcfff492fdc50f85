//! Rule 2, header duties: hop-by-hop fields dropped both ways, `Via` both ways,
//! `X-Forwarded-*` and RFC 7239 `Forwarded` with trusted and untrusted peers, request ids
//! generated or propagated, `traceparent` untouched.
mod support;
use bytes::Bytes;
use http_body_util::Full;
use std::time::Duration;
use support::*;
use tokio::io::AsyncWriteExt;

/// The headers the origin received, as (name, value) pairs in order.
fn origin_headers(r: &Reply) -> Vec<(String, String)> {
    assert_eq!(r.status, 200, "{:?}", r.body);
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("inspect json");
    v["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h[0].as_str().unwrap().to_string(),
                h[1].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn values<'a>(h: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    h.iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

fn req(headers: &[(&str, &str)]) -> http::Request<Full<Bytes>> {
    let mut b = http::Request::get("/__inspect");
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    b.body(Full::new(Bytes::new())).unwrap()
}

async fn inspect(
    addr: std::net::SocketAddr,
    headers: &[(&str, &str)],
) -> (Reply, Vec<(String, String)>) {
    let mut c = Client::connect(addr).await;
    let r = c.send(req(headers)).await;
    let h = origin_headers(&r);
    (r, h)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_request_fields_are_dropped() {
    let (g, _stub) = gateway_with_stub();
    let (_, h) = inspect(
        g.addr,
        &[
            ("connection", "keep-alive, x-secret, X-Other"),
            ("x-secret", "1"),
            ("x-other", "2"),
            ("keep-alive", "timeout=5"),
            ("te", "deflate"),
            ("upgrade", "websocket"),
            ("proxy-connection", "keep-alive"),
            ("x-kept", "yes"),
        ],
    )
    .await;
    for gone in [
        "connection",
        "x-secret",
        "x-other",
        "keep-alive",
        "te",
        "upgrade",
        "proxy-connection",
        "transfer-encoding",
    ] {
        assert!(values(&h, gone).is_empty(), "{gone} forwarded: {h:?}");
    }
    assert_eq!(values(&h, "x-kept"), ["yes"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn te_trailers_survives_hop_by_hop_removal() {
    let (g, _stub) = gateway_with_stub();
    let (_, h) = inspect(g.addr, &[("te", "deflate, trailers")]).await;
    assert_eq!(values(&h, "te"), ["trailers"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_response_fields_are_dropped() {
    let origin = raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        while read_head(&mut s, &mut carry).await.is_some() {
            let resp = "HTTP/1.1 200 OK\r\nConnection: x-origin-secret\r\nx-origin-secret: 1\r\nKeep-Alive: timeout=5, max=100\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\nUpgrade: h2c\r\nx-kept: yes\r\nVia: 1.1 origin-proxy\r\nContent-Length: 2\r\n\r\nok";
            if s.write_all(resp.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    let mut c = Client::connect(g.addr).await;
    let r = c.get("/").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, "ok");
    for gone in [
        "connection",
        "x-origin-secret",
        "keep-alive",
        "proxy-connection",
        "te",
        "upgrade",
    ] {
        assert!(
            r.headers.get(gone).is_none(),
            "{gone} returned: {:?}",
            r.headers
        );
    }
    assert_eq!(r.headers["x-kept"], "yes");
    let via: Vec<_> = r.headers.get_all("via").iter().collect();
    assert_eq!(via, ["1.1 origin-proxy", "1.1 keymaster"]);
}

/// The head's field lines (after the status line), in order.
fn field_lines(head: &str) -> Vec<&str> {
    head.split("\r\n")
        .skip(1)
        .filter(|l| !l.is_empty())
        .collect()
}

fn count(lines: &[&str], name: &str) -> usize {
    lines
        .iter()
        .filter(|l| {
            l.split_once(':')
                .is_some_and(|(n, _)| n.eq_ignore_ascii_case(name))
        })
        .count()
}

/// A response head with no hop-by-hop field is passed on as the origin wrote it (names as
/// spelled, values as sent, in order); the gateway adds Via, the request id unless the origin
/// sent one, and the framing; Date is not doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_fields_pass_through_as_the_origin_wrote_them() {
    let origin = raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        while let Some(head) = read_head(&mut s, &mut carry).await {
            let id = if head.contains("/with-id") { "X-Request-ID: from-origin\r\n" } else { "" };
            let resp = format!(
                "HTTP/1.1 200 OK\r\nX-Mixed-Case: a  b,c\r\nDate: Mon, 01 Jan 2024 00:00:00 GMT\r\nVia: 1.0 origin-proxy\r\n{id}Content-Length: 2\r\nContent-Length: 2\r\nx-last: z\r\n\r\nok"
            );
            if s.write_all(resp.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    for (path, own_id) in [("/", true), ("/with-id", false)] {
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let raw = raw(g.addr, request.as_bytes(), Duration::from_secs(5)).await;
        let (head, body) = split_head(&raw);
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert_eq!(body, b"ok");
        let lines = field_lines(&head);
        let at = |l: &str| lines.iter().position(|x| *x == l);
        let (mixed, date, via_origin, last) = (
            at("X-Mixed-Case: a  b,c"),
            at("Date: Mon, 01 Jan 2024 00:00:00 GMT"),
            at("Via: 1.0 origin-proxy"),
            at("x-last: z"),
        );
        assert!(
            mixed < date && date < via_origin && via_origin < last,
            "{head}"
        );
        assert!(mixed.is_some(), "{head}");
        assert_eq!(count(&lines, "date"), 1, "{head}");
        assert_eq!(count(&lines, "content-length"), 1, "{head}");
        assert_eq!(head_header(&head, "content-length"), Some("2"));
        let vias: Vec<_> = lines
            .iter()
            .filter(|l| l.to_ascii_lowercase().starts_with("via:"))
            .collect();
        assert_eq!(
            vias,
            [&"Via: 1.0 origin-proxy", &"via: 1.1 keymaster"],
            "{head}"
        );
        assert_eq!(count(&lines, "x-request-id"), 1, "{head}");
        let id = head_header(&head, "x-request-id").unwrap();
        assert_eq!(id == "from-origin", !own_id, "{head}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn via_is_added_upstream_after_existing_values() {
    let (g, _stub) = gateway_with_stub();
    let (r, h) = inspect(g.addr, &[("via", "1.0 fred")]).await;
    assert_eq!(values(&h, "via"), ["1.0 fred", "1.1 keymaster"]);
    assert_eq!(r.headers["via"], "1.1 keymaster");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn via_names_the_received_protocol_version() {
    let (g, _stub) = gateway_with_stub();
    let raw = raw(
        g.addr,
        b"GET /__inspect HTTP/1.0\r\nHost: x\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    let text = String::from_utf8_lossy(&raw);
    assert!(
        text.starts_with("HTTP/1.0 200 ") || text.starts_with("HTTP/1.1 200 "),
        "{text}"
    );
    assert!(text.contains(r#"["via","1.0 keymaster"]"#), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_via_pseudonym_is_used() {
    let s = stub();
    let cfg = config_text(s.local_addr(), "", "").replace(
        "drain_timeout = \"5s\"",
        "drain_timeout = \"5s\"\nvia = \"edge-7\"",
    );
    let g = start_gateway(&cfg);
    let (r, h) = inspect(g.addr, &[]).await;
    assert_eq!(values(&h, "via"), ["1.1 edge-7"]);
    assert_eq!(r.headers["via"], "1.1 edge-7");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_client_forwarding_chain_is_replaced() {
    let (g, _stub) = gateway_with_stub();
    let (_, h) = inspect(
        g.addr,
        &[
            ("host", "shop.example:8443"),
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "7.7.7.7"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "evil.example"),
        ],
    )
    .await;
    assert_eq!(values(&h, "x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(values(&h, "x-forwarded-proto"), ["http"]);
    assert_eq!(values(&h, "x-forwarded-host"), ["shop.example:8443"]);
    assert_eq!(values(&h, "host"), ["shop.example:8443"]);
    assert!(values(&h, "forwarded").is_empty(), "{h:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers_are_set_when_absent() {
    let (g, _stub) = gateway_with_stub();
    let (_, h) = inspect(g.addr, &[]).await;
    assert_eq!(values(&h, "x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(values(&h, "x-forwarded-proto"), ["http"]);
    assert_eq!(
        values(&h, "x-forwarded-host"),
        [g.addr.to_string().as_str()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_proxy_chain_is_extended_and_its_proto_host_kept() {
    let s = stub();
    let g = start_gateway(&config_text(
        s.local_addr(),
        r#"trusted_proxies = ["127.0.0.1/32"]"#,
        "",
    ));
    let (_, h) = inspect(
        g.addr,
        &[
            ("host", "internal:80"),
            ("x-forwarded-for", "1.2.3.4"),
            ("x-forwarded-for", "5.6.7.8, 9.9.9.9"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "shop.example"),
        ],
    )
    .await;
    assert_eq!(
        values(&h, "x-forwarded-for"),
        ["1.2.3.4, 5.6.7.8, 9.9.9.9, 127.0.0.1"]
    );
    assert_eq!(values(&h, "x-forwarded-proto"), ["https"]);
    assert_eq!(values(&h, "x-forwarded-host"), ["shop.example"]);

    // A trusted peer that sent nothing gets what the gateway saw.
    let (_, h) = inspect(g.addr, &[("host", "internal:80")]).await;
    assert_eq!(values(&h, "x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(values(&h, "x-forwarded-proto"), ["http"]);
    assert_eq!(values(&h, "x-forwarded-host"), ["internal:80"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_header_is_added_when_configured() {
    let s = stub();
    let g = start_gateway(&config_text(s.local_addr(), "forwarded_header = true", ""));
    let (_, h) = inspect(
        g.addr,
        &[("host", "h.example:8080"), ("forwarded", "for=6.6.6.6")],
    )
    .await;
    assert_eq!(
        values(&h, "forwarded"),
        ["for=127.0.0.1;proto=http;host=\"h.example:8080\""]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_header_from_a_trusted_proxy_is_extended() {
    let s = stub();
    let g = start_gateway(&config_text(
        s.local_addr(),
        "forwarded_header = true\ntrusted_proxies = [\"127.0.0.1\"]",
        "",
    ));
    let (_, h) = inspect(
        g.addr,
        &[
            ("host", "h.example"),
            ("forwarded", "for=192.0.2.60;proto=https"),
        ],
    )
    .await;
    assert_eq!(
        values(&h, "forwarded"),
        ["for=192.0.2.60;proto=https, for=127.0.0.1;proto=http;host=\"h.example\""]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_id_is_generated_when_absent() {
    let (g, _stub) = gateway_with_stub();
    let (r, h) = inspect(g.addr, &[]).await;
    let up = values(&h, "x-request-id");
    assert_eq!(up.len(), 1, "{h:?}");
    assert_eq!(up[0].len(), 32);
    assert!(up[0].bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(r.headers["x-request-id"], up[0]);
    let (r2, _) = inspect(g.addr, &[]).await;
    assert_ne!(r2.headers["x-request-id"], r.headers["x-request-id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_id_is_propagated_when_present() {
    let (g, _stub) = gateway_with_stub();
    let (r, h) = inspect(g.addr, &[("x-request-id", "client-abc-123")]).await;
    assert_eq!(values(&h, "x-request-id"), ["client-abc-123"]);
    assert_eq!(r.headers["x-request-id"], "client-abc-123");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_request_id_header_is_used() {
    let s = stub();
    let g = start_gateway(&config_text(
        s.local_addr(),
        "request_id_header = \"x-correlation-id\"",
        "",
    ));
    let (r, h) = inspect(g.addr, &[("x-correlation-id", "corr-1")]).await;
    assert_eq!(values(&h, "x-correlation-id"), ["corr-1"]);
    assert!(values(&h, "x-request-id").is_empty());
    assert_eq!(r.headers["x-correlation-id"], "corr-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_id_is_on_gateway_error_responses() {
    // Nothing listens on the origin port: the gateway answers 502 itself.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let g = start_gateway(&config_text(closed, "", ""));
    let mut c = Client::connect(g.addr).await;
    let r = c.send(req(&[("x-request-id", "err-req-9")])).await;
    assert_eq!(r.status, 502);
    assert_eq!(r.headers["x-request-id"], "err-req-9");
    let r = c.get("/").await;
    assert_eq!(r.status, 502);
    assert_eq!(r.headers["x-request-id"].len(), 32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traceparent_passes_through_unchanged() {
    let (g, _stub) = gateway_with_stub();
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (_, h) = inspect(
        g.addr,
        &[("traceparent", tp), ("tracestate", "rojo=00f067aa0ba902b7")],
    )
    .await;
    assert_eq!(values(&h, "traceparent"), [tp]);
    assert_eq!(values(&h, "tracestate"), ["rojo=00f067aa0ba902b7"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_named_by_a_repeated_connection_header_are_dropped() {
    let (g, _stub) = gateway_with_stub();
    let (_, h) = inspect(
        g.addr,
        &[
            ("connection", "keep-alive"),
            ("connection", "x-second"),
            ("x-second", "secret"),
        ],
    )
    .await;
    assert!(
        values(&h, "x-second").is_empty(),
        "x-second forwarded: {h:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_named_by_a_repeated_connection_header_are_dropped_from_responses() {
    let origin = raw_origin(|mut s, _| async move {
        let mut carry = Vec::new();
        while read_head(&mut s, &mut carry).await.is_some() {
            let resp = "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nConnection: x-hop\r\nx-hop: 1\r\nContent-Length: 2\r\n\r\nok";
            if s.write_all(resp.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await;
    let g = start_gateway(&config_text(origin.addr, "", ""));
    let r = get(g.addr, "/").await;
    assert_eq!(r.status, 200);
    assert!(r.headers.get("x-hop").is_none(), "{:?}", r.headers);
}

/// The request head the origin saw, for one raw request through `g` (one response read).
async fn head_at_origin(g: &TestGateway, request: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(g.addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut carry = Vec::new();
    let head = read_head(&mut s, &mut carry)
        .await
        .expect("a response head");
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let len = head_header(&head, "content-length")
        .expect("a length")
        .parse()
        .unwrap();
    String::from_utf8(read_exact_body(&mut s, &mut carry, len).await).expect("utf-8 head")
}

/// A request that needs no field of its own changed goes to the origin with its field lines
/// exactly as the client wrote them (names' case, spacing), the gateway's fields after them;
/// a head with bare LF line ends, or one whose fields a route edits, goes through the map
/// (lowercase names, CRLF only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_fields_pass_through_as_the_client_wrote_them() {
    let origin = head_echo_origin().await;
    let routes = r#"
[[routes]]
name = "edited"
cluster = "origin"
match = { path_prefix = "/edited" }
request_headers = { set = { x-set = "1" } }
"#;
    let g = start_gateway(&config_text(origin.addr, "", routes));
    let seen = head_at_origin(
        &g,
        b"GET /w HTTP/1.1\r\nHost: x\r\nX-Mixed-Case:  v1 \r\nConnection: x-hop\r\nx-hop: 1\r\n\r\n",
    )
    .await;
    // A Connection field that names a field: that head takes the map, which strips both.
    assert!(seen.contains("\r\nx-mixed-case: v1\r\n"), "{seen}");
    assert!(!seen.to_ascii_lowercase().contains("x-hop"), "{seen}");
    // One of options alone (`close`) is left out; the other lines pass as sent.
    let seen = head_at_origin(
        &g,
        b"GET /w HTTP/1.1\r\nHost: x\r\nX-Mixed-Case:  v1 \r\nConnection: close\r\nuser-agent: t\r\n\r\n",
    )
    .await;
    assert!(
        seen.contains("\r\nHost: x\r\nX-Mixed-Case:  v1 \r\nuser-agent: t\r\n"),
        "{seen}"
    );
    assert!(!seen.to_ascii_lowercase().contains("connection"), "{seen}");
    let seen = head_at_origin(
        &g,
        b"GET /w HTTP/1.1\r\nHost: x\r\nX-Mixed-Case:  v1 \r\nuser-agent: t\r\n\r\n",
    )
    .await;
    assert!(
        seen.starts_with("GET /w HTTP/1.1\r\nHost: x\r\nX-Mixed-Case:  v1 \r\nuser-agent: t\r\nx-forwarded-for: 127.0.0.1\r\n"),
        "{seen}"
    );
    let lines: Vec<&str> = seen.trim_end().split("\r\n").collect();
    assert_eq!(lines.iter().filter(|l| l.starts_with("via: ")).count(), 1);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("x-request-id: "))
            .count(),
        1
    );
    // Bare LF line ends: normalised through the map, so the origin sees CRLF only.
    let seen = head_at_origin(&g, b"GET /w HTTP/1.1\nHost: x\nX-Mixed-Case: v2\n\n").await;
    assert!(!seen.replace("\r\n", "").contains('\n'), "{seen:?}");
    assert!(seen.contains("\r\nx-mixed-case: v2\r\n"), "{seen}");
    // A route that edits the request's fields works on the map.
    let seen = head_at_origin(
        &g,
        b"GET /edited HTTP/1.1\r\nHost: x\r\nX-Mixed-Case: v3\r\n\r\n",
    )
    .await;
    assert!(
        seen.contains("\r\nx-mixed-case: v3\r\n") && seen.contains("\r\nx-set: 1\r\n"),
        "{seen}"
    );
}

/// By default a client's request id is kept only from a trusted proxy: anyone else's is
/// replaced (the origin and the client see the new one, once), so that no client chooses
/// the id that logs and traces are joined by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_clients_request_id_is_replaced() {
    let s = stub();
    let default = config_text(s.local_addr(), "", "").replace("request_id_from = \"any\"\n", "");
    let g = start_gateway(&default);
    let (r, h) = inspect(g.addr, &[("x-request-id", "client-chosen")]).await;
    let up = values(&h, "x-request-id");
    assert_eq!(up.len(), 1, "one id upstream: {up:?}");
    assert_ne!(up[0], "client-chosen");
    assert_eq!(up[0].len(), 32, "a generated id: {up:?}");
    assert_eq!(r.headers["x-request-id"], up[0]);
    // From a trusted proxy it is kept.
    let trusted = default.replace(
        "address = \"127.0.0.1:0\"\n",
        "address = \"127.0.0.1:0\"\ntrusted_proxies = [\"127.0.0.1\"]\n",
    );
    let g = start_gateway(&trusted);
    let (r, h) = inspect(g.addr, &[("x-request-id", "from-the-lb")]).await;
    assert_eq!(values(&h, "x-request-id"), ["from-the-lb"]);
    assert_eq!(r.headers["x-request-id"], "from-the-lb");
}
