//! Filter chain lifecycle with native filters registered in code: order and tie-break by
//! name, match and should_filter skips, pre short-circuit (origin untouched, post still
//! runs), route filters choosing cluster/path/Host, post edits, failures (error and panic)
//! → error stage → 500 or the error stage's response, connections stay usable, counters.
mod support;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use http_body_util::Full;
use keymaster_config::{FilterMatch, FilterStage};
use keymaster_gateway::filter::{done, Filter, FilterCtx, FilterFuture, FilterSpec, Needs};
use std::net::SocketAddr;
use support::*;

/// Echoes each request head, with `x-origin: {tag}` and a field the filters remove.
async fn echo_origin(tag: &str) -> RawOrigin {
    head_echo_origin_with(format!("x-origin: {tag}\r\nx-internal: secret\r\n")).await
}

fn cfg(origin: SocketAddr, alt: SocketAddr, extra: &str) -> String {
    format!(
        r#"{PREAMBLE}
{extra}

[[routes]]
name = "default"
cluster = "o"

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

fn m(g: &TestGateway, family: &str, filter: &str) -> f64 {
    metric(
        &g.gateway().metrics_text(),
        &format!("keymaster_filter_{family}{{filter=\"{filter}\"}}"),
    )
}

/// Appends its label to the request header `x-trail` and to the `trail` metadata.
struct Tag(&'static str);
impl Filter for Tag {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        let trail = ctx.meta().get("trail").cloned().unwrap_or_default();
        let trail = if trail.is_empty() {
            self.0.to_string()
        } else {
            format!("{trail},{}", self.0)
        };
        ctx.request_headers_mut()
            .insert("x-trail", HeaderValue::from_str(&trail).unwrap());
        ctx.meta_mut().insert("trail".into(), trail);
        done(Ok(()))
    }
}

/// Post: copies the `trail` metadata into the response header `x-trail-post`.
struct TrailOut;
impl Filter for TrailOut {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        let t = ctx
            .meta()
            .get("trail")
            .cloned()
            .unwrap_or_else(|| "-".into());
        let status = ctx.response_status().map(|s| s.as_u16()).unwrap_or(0);
        if let Some(h) = ctx.response_headers_mut() {
            h.insert("x-trail-post", HeaderValue::from_str(&t).unwrap());
            h.insert("x-post-saw", HeaderValue::from(status));
        }
        done(Ok(()))
    }
}

/// Answers with `status` (pre/route/error); the error stage version names the failure.
struct Answer(u16);
impl Filter for Answer {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        let mut h = HeaderMap::new();
        if let Some(f) = ctx.failure() {
            h.insert("x-failed-filter", HeaderValue::from_str(&f.filter).unwrap());
        }
        ctx.respond(
            StatusCode::from_u16(self.0).unwrap(),
            h,
            "answered by a filter\n",
        );
        done(Ok(()))
    }
}

struct Fail;
impl Filter for Fail {
    fn run<'a>(&'a self, _ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        done(Err("deliberate failure".into()))
    }
}

struct Panic;
impl Filter for Panic {
    fn run<'a>(&'a self, _ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        FilterFuture::new(async {
            tokio::task::yield_now().await;
            panic!("deliberate panic in a native filter");
        })
    }
}

/// Panics in `run` itself, before returning a future (a synchronous filter's panic).
struct PanicNow;
impl Filter for PanicNow {
    fn run<'a>(&'a self, _ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        panic!("deliberate panic in a synchronous native filter");
    }
}

/// `F`, declared [`Filter::synchronous`]: the chain runs it in its plain loop.
struct Sync<F>(F);
impl<F: Filter> Filter for Sync<F> {
    fn should_filter(&self, ctx: &FilterCtx) -> bool {
        self.0.should_filter(ctx)
    }
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        self.0.run(ctx)
    }

    fn needs(&self) -> Needs {
        Needs::DEFAULT | Needs::SYNCHRONOUS
    }
}

/// Returns a future that finishes at its first poll, or (`yields`) only at its second.
struct Later {
    yields: bool,
}
impl Filter for Later {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        FilterFuture::new(async move {
            if self.yields {
                tokio::task::yield_now().await;
            }
            ctx.request_headers_mut()
                .insert("x-later", HeaderValue::from_static("ran"));
            Ok(())
        })
    }
}

/// Returns a future that panics when first polled.
struct PanicWhenPolled;
impl Filter for PanicWhenPolled {
    fn run<'a>(&'a self, _ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        FilterFuture::new(async { panic!("deliberate panic in a filter's future") })
    }
}

/// Skips requests carrying `x-skip`.
struct Picky;
impl Filter for Picky {
    fn should_filter(&self, ctx: &FilterCtx) -> bool {
        !ctx.request_headers().contains_key("x-skip")
    }
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        ctx.request_headers_mut()
            .insert("x-picky", HeaderValue::from_static("ran"));
        done(Ok(()))
    }
}

/// Route stage: `/alt...` goes to cluster "alt" as `/rewritten` with Host `alt.internal`;
/// `/nowhere` to a cluster that does not exist.
struct Chooser;
impl Filter for Chooser {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        if ctx.path().starts_with("/alt") {
            ctx.set_cluster("alt");
            let q = ctx.query().map(|q| format!("?{q}")).unwrap_or_default();
            ctx.set_upstream_path(format!("/rewritten{q}"));
            ctx.set_upstream_host(HeaderValue::from_static("alt.internal"));
        } else if ctx.path() == "/nowhere" {
            ctx.set_cluster("missing");
        }
        done(Ok(()))
    }
}

/// Post: 200 → 203, removes x-internal, adds x-post.
struct PostEdit;
impl Filter for PostEdit {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        if ctx.response_status() == Some(StatusCode::OK) {
            ctx.set_response_status(StatusCode::NON_AUTHORITATIVE_INFORMATION);
        }
        let h = ctx.response_headers_mut().expect("post sees the response");
        h.remove("x-internal");
        h.insert("x-post", HeaderValue::from_static("1"));
        done(Ok(()))
    }
}

fn spec(name: &str, stage: FilterStage, order: i32, f: impl Filter) -> FilterSpec {
    FilterSpec::new(name, stage, order, f)
}

fn only_path(prefix: &str) -> FilterMatch {
    FilterMatch {
        path_prefix: Some(prefix.into()),
        ..Default::default()
    }
}

async fn send(c: &mut Client, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut b = http::Request::get(path);
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    c.send(b.body(Full::new(Bytes::new())).unwrap()).await
}

fn body(r: &Reply) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

#[tokio::test]
async fn order_then_name_and_metadata_shared_across_stages() {
    let o = echo_origin("o").await;
    let alt = echo_origin("alt").await;
    // Registered scrambled: c(order 0), then a and b tie at order 1 → name decides.
    let g = start_gateway_with_filters(
        &cfg(o.addr, alt.addr, ""),
        vec![
            spec("b", FilterStage::Pre, 1, Tag("b")),
            spec("z-route", FilterStage::Route, -5, Tag("r")),
            spec("a", FilterStage::Pre, 1, Tag("a")),
            spec("c", FilterStage::Pre, 0, Tag("c")),
            spec("out", FilterStage::Post, 0, TrailOut),
        ],
    );
    let mut c = Client::connect(g.addr).await;
    let r = send(&mut c, "/x", &[]).await;
    assert_eq!(r.status, 200);
    assert!(body(&r).contains("x-trail: c,a,b,r\r\n"), "{}", body(&r));
    assert_eq!(r.headers["x-trail-post"], "c,a,b,r");
    assert_eq!(r.headers["x-post-saw"], "200");
    for f in ["a", "b", "c", "z-route", "out"] {
        assert_eq!(m(&g, "invocations_total", f), 1.0, "{f}");
    }
    // Durations are sampled: the runs of one request in 16 on each worker (one worker here).
    // 16 more requests make 85 runs of the five filters: the 5 runs of one request timed.
    for _ in 0..16 {
        assert_eq!(send(&mut c, "/x", &[]).await.status, 200);
    }
    let mut timed = 0.0;
    for f in ["a", "b", "c", "z-route", "out"] {
        assert_eq!(m(&g, "invocations_total", f), 17.0, "{f}");
        let n = m(&g, "duration_seconds_count", f);
        assert_eq!(n, 1.0, "{f}");
        timed += n;
    }
    assert_eq!(timed, 5.0);
}

#[tokio::test]
async fn match_and_should_filter_skip() {
    let o = echo_origin("o").await;
    let alt = echo_origin("alt").await;
    let g = start_gateway_with_filters(
        &cfg(o.addr, alt.addr, ""),
        vec![
            spec("only-api", FilterStage::Pre, 0, Tag("api")).with_match(only_path("/api")),
            spec("picky", FilterStage::Pre, 1, Picky),
            spec("gets", FilterStage::Pre, 2, Tag("get")).with_match(FilterMatch {
                methods: vec!["POST".into()],
                headers: vec!["x-need".into()],
                routes: vec!["default".into()],
                ..Default::default()
            }),
        ],
    );
    let mut c = Client::connect(g.addr).await;
    let r = send(&mut c, "/api/1", &[]).await;
    assert!(body(&r).contains("x-trail: api\r\n"));
    assert!(body(&r).contains("x-picky: ran"));
    let r = send(&mut c, "/other", &[("x-skip", "1"), ("x-need", "1")]).await;
    assert!(!body(&r).contains("x-trail"), "{}", body(&r));
    assert!(!body(&r).contains("x-picky"));
    let r = c
        .send(
            http::Request::post("/other")
                .header("x-need", "1")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
    assert!(body(&r).contains("x-trail: get\r\n"), "{}", body(&r));
    assert_eq!(m(&g, "invocations_total", "only-api"), 1.0);
    assert_eq!(m(&g, "skips_total", "only-api"), 2.0);
    assert_eq!(m(&g, "skips_total", "picky"), 1.0);
    assert_eq!(m(&g, "invocations_total", "picky"), 2.0);
    assert_eq!(m(&g, "skips_total", "gets"), 2.0);
    assert_eq!(m(&g, "invocations_total", "gets"), 1.0);
}

#[tokio::test]
async fn pre_short_circuit_skips_origin_but_post_runs() {
    let o = echo_origin("o").await;
    let alt = echo_origin("alt").await;
    let g = start_gateway_with_filters(
        &cfg(o.addr, alt.addr, ""),
        vec![
            spec("first", FilterStage::Pre, 0, Tag("first")),
            spec("deny", FilterStage::Pre, 1, Answer(418)).with_match(only_path("/deny")),
            spec("later", FilterStage::Pre, 2, Tag("later")),
            spec("route", FilterStage::Route, 0, Tag("route")),
            spec("out", FilterStage::Post, 0, TrailOut),
        ],
    );
    let mut c = Client::connect(g.addr).await;
    let r = send(&mut c, "/deny", &[]).await;
    assert_eq!(r.status, 418);
    assert_eq!(body(&r), "answered by a filter\n");
    assert_eq!(r.headers["x-trail-post"], "first");
    assert_eq!(r.headers["x-post-saw"], "418");
    assert!(r.headers.contains_key("x-request-id"));
    assert_eq!(o.connections(), 0, "the origin got nothing");
    assert_eq!(m(&g, "invocations_total", "later"), 0.0);
    assert_eq!(m(&g, "invocations_total", "route"), 0.0);
    // Same connection, next request proxies normally.
    let r = send(&mut c, "/fine", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-trail-post"], "first,later,route");
    assert_eq!(o.connections(), 1);
    let text = g.gateway().metrics_text();
    assert_eq!(
        metric(
            &text,
            "keymaster_requests_total{route=\"default\",status_class=\"4xx\"}"
        ),
        1.0
    );
}

#[tokio::test]
async fn route_filter_overrides_cluster_path_and_host() {
    let o = echo_origin("o").await;
    let alt = echo_origin("alt").await;
    let g = start_gateway_with_filters(
        &cfg(o.addr, alt.addr, ""),
        vec![spec("chooser", FilterStage::Route, 0, Chooser)],
    );
    let mut c = Client::connect(g.addr).await;
    let r = send(&mut c, "/alt/thing?q=1", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-origin"], "alt");
    let b = body(&r);
    assert!(b.starts_with("GET /rewritten?q=1 HTTP/1.1\r\n"), "{b}");
    assert_eq!(head_header(&b, "host"), Some("alt.internal"));
    let r = send(&mut c, "/plain", &[]).await;
    assert_eq!(r.headers["x-origin"], "o");
    assert!(body(&r).starts_with("GET /plain HTTP/1.1"));
    // Several requests to alt reuse its pool (the Exchange returns to the right cluster).
    for _ in 0..3 {
        assert_eq!(send(&mut c, "/alt", &[]).await.headers["x-origin"], "alt");
    }
    assert_eq!(alt.connections(), 1);
    let r = send(&mut c, "/nowhere", &[]).await;
    assert_eq!(r.status, 500);
    assert_eq!(send(&mut c, "/plain", &[]).await.status, 200);
}

/// Post: stamps the request line it sees (`x-saw-line`: method, path, query).
/// `reads_line: false` declares it never reads it.
struct LineOut {
    reads_line: bool,
}
impl Filter for LineOut {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        let line = format!(
            "{} {}?{}",
            ctx.method(),
            ctx.path(),
            ctx.query().unwrap_or("")
        );
        if let Some(h) = ctx.response_headers_mut() {
            h.insert("x-saw-line", HeaderValue::from_str(&line).unwrap());
        }
        done(Ok(()))
    }

    fn needs(&self) -> Needs {
        Needs::REQUEST_HEADERS.with_if(Needs::REQUEST_LINE, self.reads_line)
    }
}

/// Post filters see the request line as the client sent it, on proxied and filter-made
/// responses alike, unless every post and error filter declares it never reads it (and
/// none matches on a path): then only the method is kept past the proxy stage.
#[tokio::test]
async fn post_filters_see_the_request_line_unless_none_reads_it() {
    let o = echo_origin("o").await;
    let alt = echo_origin("alt").await;
    let reads = LineOut { reads_line: true };
    let g = start_gateway_with_filters(
        &cfg(o.addr, alt.addr, ""),
        vec![
            spec("answer", FilterStage::Pre, 0, Answer(403)).with_match(only_path("/deny")),
            spec("line", FilterStage::Post, 0, reads),
        ],
    );
    let mut c = Client::connect(g.addr).await;
    let r = send(&mut c, "/a/b?q=1", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-saw-line"], "GET /a/b?q=1");
    let r = send(&mut c, "/deny/x?y", &[]).await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.headers["x-saw-line"], "GET /deny/x?y",
        "a filter's answer too"
    );

    let blind = LineOut { reads_line: false };
    let g2 = start_gateway_with_filters(
        &cfg(o.addr, alt.addr, ""),
        vec![spec("blind", FilterStage::Post, 0, blind)],
    );
    let mut c = Client::connect(g2.addr).await;
    let r = send(&mut c, "/a/b?q=1", &[]).await;
    assert_eq!(r.headers["x-saw-line"], "GET ?", "no copy kept");

    // A match on a path keeps the target all the same: the match needs it.
    let blind = LineOut { reads_line: false };
    let g3 = start_gateway_with_filters(
        &cfg(o.addr, alt.addr, ""),
        vec![spec("blind", FilterStage::Post, 0, blind).with_match(only_path("/a"))],
    );
    let mut c = Client::connect(g3.addr).await;
    let r = send(&mut c, "/a/b?q=1", &[]).await;
    assert_eq!(r.headers["x-saw-line"], "GET /a/b?q=1");
    let r = send(&mut c, "/x", &[]).await;
    assert!(!r.headers.contains_key("x-saw-line"), "skipped");
    drop((g, g2));
}

#[tokio::test]
async fn post_filter_edits_status_and_headers() {
    let o = echo_origin("o").await;
    let alt = echo_origin("alt").await;
    let g = start_gateway_with_filters(
        &cfg(o.addr, alt.addr, ""),
        vec![spec("edit", FilterStage::Post, 0, PostEdit)],
    );
    let mut c = Client::connect(g.addr).await;
    let r = send(&mut c, "/x", &[]).await;
    assert_eq!(r.status, 203);
    assert!(!r.headers.contains_key("x-internal"));
    assert_eq!(r.headers["x-post"], "1");
    assert!(body(&r).starts_with("GET /x HTTP/1.1"), "body untouched");
}

async fn failure_case(bad: FilterSpec, name: &str) {
    let o = echo_origin("o").await;
    let alt = echo_origin("alt").await;
    let g = start_gateway_with_filters(
        &cfg(o.addr, alt.addr, ""),
        vec![
            bad.with_match(only_path("/bad")),
            spec("out", FilterStage::Post, 0, TrailOut),
        ],
    );
    let mut c = Client::connect(g.addr).await;
    for i in 1..=3 {
        let r = send(&mut c, "/bad", &[]).await;
        assert_eq!(r.status, 500, "{name}");
        assert!(
            body(&r).starts_with("500 Internal Server Error"),
            "{}",
            body(&r)
        );
        assert!(!body(&r).contains("deliberate"), "no internals leak");
        assert!(
            r.headers.contains_key("x-trail-post"),
            "post runs after a failure"
        );
        assert_eq!(r.headers.get("connection"), None);
        // The connection stays usable.
        assert_eq!(send(&mut c, "/good", &[]).await.status, 200);
        assert_eq!(m(&g, "errors_total", name), i as f64);
    }
    let text = g.gateway().metrics_text();
    assert_eq!(
        metric(
            &text,
            "keymaster_errors_total{category=\"local_filter_error\",side=\"internal\"}"
        ),
        3.0
    );
}

#[tokio::test]
async fn failing_filter_gives_500_and_counts() {
    failure_case(spec("fail", FilterStage::Pre, 0, Fail), "fail").await;
    failure_case(
        spec("fail-route", FilterStage::Route, 0, Fail),
        "fail-route",
    )
    .await;
}

#[tokio::test]
async fn panicking_filter_gives_500_and_counts() {
    failure_case(spec("boom", FilterStage::Pre, 0, Panic), "boom").await;
}

#[tokio::test]
async fn synchronous_panic_gives_500_and_counts() {
    failure_case(spec("boom-now", FilterStage::Pre, 0, PanicNow), "boom-now").await;
}

#[tokio::test]
async fn synchronous_filters_that_do_not_finish_at_once_fail() {
    failure_case(
        spec("sync-boom-now", FilterStage::Pre, 0, Sync(PanicNow)),
        "sync-boom-now",
    )
    .await;
    failure_case(
        spec(
            "sync-boom-polled",
            FilterStage::Pre,
            0,
            Sync(PanicWhenPolled),
        ),
        "sync-boom-polled",
    )
    .await;
    failure_case(
        spec(
            "sync-yields",
            FilterStage::Route,
            0,
            Sync(Later { yields: true }),
        ),
        "sync-yields",
    )
    .await;
}

#[tokio::test]
async fn synchronous_and_suspending_filters_interleave_in_order() {
    let o = echo_origin("o").await;
    let alt = echo_origin("alt").await;
    let g = start_gateway_with_filters(
        &cfg(o.addr, alt.addr, ""),
        vec![
            spec("1-sync", FilterStage::Pre, 0, Sync(Tag("s1"))),
            spec("2-async", FilterStage::Pre, 0, Tag("a2")),
            spec("3-sync", FilterStage::Pre, 0, Sync(Tag("s3"))),
            spec(
                "4-ready",
                FilterStage::Pre,
                0,
                Sync(Later { yields: false }),
            ),
            spec("5-yields", FilterStage::Pre, 0, Later { yields: true }),
            spec("6-sync", FilterStage::Route, 0, Sync(Tag("s6"))),
            spec("answer", FilterStage::Route, 1, Sync(Answer(202)))
                .with_match(only_path("/answer")),
            spec("after-answer", FilterStage::Route, 2, Tag("never"))
                .with_match(only_path("/answer")),
            spec("out", FilterStage::Post, 0, Sync(TrailOut)),
        ],
    );
    let mut c = Client::connect(g.addr).await;
    let r = send(&mut c, "/x", &[]).await;
    assert_eq!(r.status, 200);
    assert!(
        body(&r).contains("x-trail: s1,a2,s3,s6\r\n"),
        "{}",
        body(&r)
    );
    assert!(body(&r).contains("x-later: ran\r\n"), "{}", body(&r));
    assert_eq!(r.headers["x-trail-post"], "s1,a2,s3,s6");
    let r = send(&mut c, "/answer", &[]).await;
    assert_eq!(r.status, 202);
    assert_eq!(r.headers["x-trail-post"], "s1,a2,s3,s6");
    // The answer ends the route stage: the next filter neither runs nor counts a skip (its
    // one skip is `/x`'s, which its match refused).
    assert_eq!(m(&g, "invocations_total", "after-answer"), 0.0);
    assert_eq!(m(&g, "skips_total", "after-answer"), 1.0);
    assert_eq!(m(&g, "invocations_total", "5-yields"), 2.0);
    assert_eq!(body(&r), "answered by a filter\n", "the origin saw nothing");
}

#[tokio::test]
async fn error_stage_sets_the_response() {
    let o = echo_origin("o").await;
    let alt = echo_origin("alt").await;
    let g = start_gateway_with_filters(
        &cfg(o.addr, alt.addr, ""),
        vec![
            spec("boom", FilterStage::Pre, 0, Panic).with_match(only_path("/panic")),
            spec("fail", FilterStage::Pre, 0, Fail).with_match(only_path("/fail")),
            spec("sorry", FilterStage::Error, 0, Answer(503)),
            spec("err-fails-too", FilterStage::Error, 1, Fail),
            spec("out", FilterStage::Post, 0, TrailOut),
        ],
    );
    let mut c = Client::connect(g.addr).await;
    for (path, filter) in [("/panic", "boom"), ("/fail", "fail")] {
        let r = send(&mut c, path, &[]).await;
        assert_eq!(r.status, 503);
        assert_eq!(r.headers["x-failed-filter"], filter);
        assert_eq!(r.headers["x-post-saw"], "503");
        assert_eq!(send(&mut c, "/ok", &[]).await.status, 200);
    }
    assert_eq!(o.connections(), 1);
    assert_eq!(m(&g, "errors_total", "err-fails-too"), 2.0);
    assert_eq!(m(&g, "invocations_total", "sorry"), 2.0);
}

#[tokio::test]
async fn failing_post_filter_replaces_the_origin_response() {
    let o = echo_origin("o").await;
    let alt = echo_origin("alt").await;
    let g = start_gateway_with_filters(
        &cfg(o.addr, alt.addr, ""),
        vec![
            spec("post-boom", FilterStage::Post, 0, Panic).with_match(only_path("/bad")),
            spec("post-ok", FilterStage::Post, 1, PostEdit),
        ],
    );
    let mut c = Client::connect(g.addr).await;
    let r = send(&mut c, "/bad", &[]).await;
    assert_eq!(r.status, 500);
    assert!(!r.headers.contains_key("x-origin"));
    let r = send(&mut c, "/good", &[]).await;
    assert_eq!(r.status, 203);
    assert_eq!(m(&g, "errors_total", "post-boom"), 1.0);
}

#[tokio::test]
async fn native_name_clash_with_config_is_refused() {
    let o = echo_origin("o").await;
    let alt = echo_origin("alt").await;
    let toml = cfg(
        o.addr,
        alt.addr,
        "[[filters]]\nname = \"dup\"\ntype = \"headers\"\nset = { x-a = \"1\" }\n",
    );
    let config = keymaster_config::load_str(&toml, "<test>").unwrap();
    let err = Gateway::start_with_filters(
        config,
        ConfigSource::Memory,
        vec![spec("dup", FilterStage::Pre, 0, Fail)],
    )
    .err()
    .expect("refused");
    assert!(err.contains("filter dup"), "{err}");
}

/// Error stage: names the failure in `x-failed-filter` / `x-failure` and answers 503 only
/// for origin errors.
struct OriginDown;
impl Filter for OriginDown {
    fn should_filter(&self, ctx: &FilterCtx) -> bool {
        ctx.failure().is_some_and(|f| &*f.filter == "proxy")
    }
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        let f = ctx.failure().unwrap().message.clone();
        let mut h = HeaderMap::new();
        h.insert("x-failure", HeaderValue::from_str(&f).unwrap());
        ctx.respond(StatusCode::SERVICE_UNAVAILABLE, h, "origin down, sorry\n");
        done(Ok(()))
    }
}

#[tokio::test]
async fn proxy_errors_run_error_and_post_filters() {
    let o = echo_origin("o").await;
    let (dead, _dead_held) = closed_addr(); // nothing listens: connect is refused
    let g = start_gateway_with_filters(
        &cfg(o.addr, dead, ""),
        vec![
            spec("chooser", FilterStage::Route, 0, Chooser),
            spec("out", FilterStage::Post, 0, TrailOut),
        ],
    );
    let mut c = Client::connect(g.addr).await;
    let r = send(&mut c, "/alt", &[]).await;
    assert_eq!(r.status, 502);
    assert_eq!(
        r.headers["x-post-saw"], "502",
        "post filters see proxy errors"
    );
    assert!(r.headers.contains_key("x-request-id"));
    assert_eq!(send(&mut c, "/x", &[]).await.status, 200);

    let g2 = start_gateway_with_filters(
        &cfg(o.addr, dead, ""),
        vec![
            spec("chooser", FilterStage::Route, 0, Chooser),
            spec("down", FilterStage::Error, 0, OriginDown),
            spec("out", FilterStage::Post, 0, TrailOut),
        ],
    );
    let mut c = Client::connect(g2.addr).await;
    let r = send(&mut c, "/alt", &[]).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.headers["x-failure"], "origin_connectivity");
    assert_eq!(r.headers["x-post-saw"], "503");
    assert_eq!(body(&r), "origin down, sorry\n");
    // A cluster a route filter chose that this config version lacks fails in the proxy
    // stage: the error and post filters run for it too.
    let r = send(&mut c, "/nowhere", &[]).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.headers["x-failure"], "local_filter_error");
    assert_eq!(r.headers["x-post-saw"], "503");
    // The error filter's should_filter leaves filter failures alone; other paths proxy.
    assert_eq!(send(&mut c, "/x", &[]).await.status, 200);
    drop(g);
}

#[tokio::test]
async fn debug_mode_traces_filters_for_requests_with_the_secret() {
    let o = echo_origin("o").await;
    let alt = echo_origin("alt").await;
    let g = start_gateway_with_filters(
        &cfg(
            o.addr,
            alt.addr,
            "[filter_debug]\nsecret = \"0123456789abcdef\"\n",
        ),
        vec![
            spec("a", FilterStage::Pre, 0, Tag("a")),
            spec("only-api", FilterStage::Pre, 1, Tag("api")).with_match(only_path("/api")),
            spec("fail", FilterStage::Pre, 2, Fail).with_match(only_path("/fail")),
            spec("out", FilterStage::Post, 0, TrailOut),
        ],
    );
    let mut c = Client::connect(g.addr).await;
    let r = send(&mut c, "/x", &[("x-keymaster-debug", "0123456789abcdef")]).await;
    let trace = r.headers["x-keymaster-filters"]
        .to_str()
        .unwrap()
        .to_string();
    let names: Vec<&str> = trace
        .split(", ")
        .map(|e| e.split('/').next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "pre:a=ran",
            "pre:only-api=skip",
            "pre:fail=skip",
            "post:out=ran"
        ],
        "{trace}"
    );
    assert!(
        !body(&r).contains("0123456789abcdef"),
        "the secret is not forwarded"
    );
    let r = send(
        &mut c,
        "/fail",
        &[("x-keymaster-debug", "0123456789abcdef")],
    )
    .await;
    assert_eq!(r.status, 500);
    let trace = r.headers["x-keymaster-filters"].to_str().unwrap();
    assert!(trace.contains("pre:fail=failed/"), "{trace}");
    // Without the secret (or with a wrong one): no trace.
    let r = send(&mut c, "/x", &[("x-keymaster-debug", "wrong")]).await;
    assert!(!r.headers.contains_key("x-keymaster-filters"));
    assert!(body(&r).contains("x-keymaster-debug: wrong"));
    assert!(!send(&mut c, "/x", &[])
        .await
        .headers
        .contains_key("x-keymaster-filters"));
}

/// Post: echoes the request's `x-in` header as `x-in-seen` (or "none").
struct SeesRequest(bool);
impl Filter for SeesRequest {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        let v = ctx
            .request_headers()
            .get("x-in")
            .cloned()
            .unwrap_or(HeaderValue::from_static("none"));
        ctx.response_headers_mut().unwrap().insert("x-in-seen", v);
        done(Ok(()))
    }

    fn needs(&self) -> Needs {
        Needs::DEFAULT.with_if(Needs::REQUEST_HEADERS_AFTER_PROXY, self.0)
    }
}

#[tokio::test]
async fn post_filters_see_request_headers_only_when_they_ask() {
    let o = echo_origin("o").await;
    let alt = echo_origin("alt").await;
    for (asks, want) in [(true, "1"), (false, "none")] {
        let g = start_gateway_with_filters(
            &cfg(o.addr, alt.addr, ""),
            vec![spec("sees", FilterStage::Post, 0, SeesRequest(asks))],
        );
        let mut c = Client::connect(g.addr).await;
        let r = send(&mut c, "/x", &[("x-in", "1")]).await;
        assert_eq!(r.headers["x-in-seen"], want);
    }
}

/// Route stage: an upstream path that is no valid request target.
struct BadPath;
impl Filter for BadPath {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        ctx.set_upstream_path("/a b");
        done(Ok(()))
    }
}

/// Post: a 1xx status, which no final response can have.
struct PostInformational;
impl Filter for PostInformational {
    fn run<'a>(&'a self, ctx: &'a mut FilterCtx) -> FilterFuture<'a> {
        ctx.set_response_status(StatusCode::SWITCHING_PROTOCOLS);
        done(Ok(()))
    }
}

/// What a native filter gets wrong is the gateway's 500, never the client's 400 nor a 1xx on
/// the wire: an invalid upstream path, an answer with a 1xx status (the chain answers 500
/// instead). A 1xx status set in `post` is ignored.
#[tokio::test]
async fn a_native_filters_bad_path_or_informational_answer_is_a_500() {
    let o = echo_origin("o").await;
    let alt = echo_origin("alt").await;
    let g = start_gateway_with_filters(
        &cfg(o.addr, alt.addr, ""),
        vec![
            spec("badpath", FilterStage::Route, 0, BadPath).with_match(only_path("/badpath")),
            spec("early", FilterStage::Pre, 0, Answer(101)).with_match(only_path("/early")),
            spec("late", FilterStage::Post, 0, PostInformational).with_match(only_path("/late")),
        ],
    );
    let wait = std::time::Duration::from_secs(2);
    for (path, status) in [("/badpath", 500), ("/early", 500), ("/late", 200)] {
        let req = format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let resp = raw(g.addr, req.as_bytes(), wait).await;
        let text = String::from_utf8_lossy(&resp);
        assert_eq!(status_of(&resp), Some(status), "{path}: {text}");
        assert_eq!(count_responses(&resp), 1, "{path}: {text}");
    }
    assert_eq!(get(g.addr, "/fine").await.status, 200);
}
