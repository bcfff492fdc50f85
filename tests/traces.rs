//! OpenTelemetry traces against a real OpenTelemetry Collector (tests/otel_support): trace
//! context continued and propagated across two gateways, a span per upstream attempt, head
//! sampling per listener and route with the parent's flag honoured, filter steps as span
//! events, and a collector that is down or stalled never failing or slowing a request.

mod otel_support;
mod support;

use otel_support::{Collector, Span};
use std::time::{Duration, Instant};
use support::*;
use tokio::io::AsyncWriteExt;

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// `[traces]` to `endpoint` over `protocol`, exporting every 50 ms.
fn traces_toml(endpoint: &str, protocol: &str, service: &str) -> String {
    format!(
        "[traces]\nendpoint = \"{endpoint}\"\nprotocol = \"{protocol}\"\nservice_name = \"{service}\"\nexport_interval = \"50ms\"\n"
    )
}

/// A GET with `fields`; the response's status and body.
async fn get_with(addr: std::net::SocketAddr, path: &str, fields: &[(&str, &str)]) -> Reply {
    let mut b = http::Request::get(format!("http://{addr}{path}"));
    for (k, v) in fields {
        b = b.header(*k, *v);
    }
    let req = b
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    Client::connect(addr).await.send(req).await
}

/// The `traceparent` the origin received (the echo origin answers with the request head).
fn origin_traceparent(r: &Reply) -> String {
    let head = String::from_utf8_lossy(&r.body).to_string();
    head_header(&head, "traceparent")
        .unwrap_or_else(|| panic!("no traceparent reached the origin:\n{head}"))
        .to_string()
}

fn of_trace<'a>(spans: &'a [Span], trace: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.trace_id == trace).collect()
}

fn service(s: &Span) -> String {
    s.resource
        .get("service.name")
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_string()
}

fn find<'a>(spans: &[&'a Span], service_name: &str, kind: i64) -> &'a Span {
    spans
        .iter()
        .find(|s| service(s) == service_name && s.kind == kind)
        .unwrap_or_else(|| panic!("no kind-{kind} span of {service_name} in {spans:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_link_parent_and_child_across_two_gateways_and_the_origin() {
    let collector = Collector::start().await;
    let origin = head_echo_origin().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    // The second hop exports over OTLP/HTTP, the edge over gRPC.
    let second = traces_toml(
        &format!("http://{}", collector.http),
        "http/protobuf",
        "hop-b",
    );
    let b = start_gateway(&config_text(origin.addr, "", &second));
    let edge = format!(
        "{}[access_log]\nenabled = true\npath = \"{}\"\n",
        traces_toml(&format!("http://{}", collector.grpc), "grpc", "edge-a"),
        log.display()
    );
    let a = start_gateway(&config_text(b.addr, "", &edge));

    let parent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let fields = [
        ("traceparent", parent.as_str()),
        ("x-request-id", "rid-hop"),
    ];
    let r = get_with(a.addr, "/hop?q=1", &fields).await;
    assert_eq!(r.status, 200);
    let seen = origin_traceparent(&r);

    let spans = collector
        .wait_for(|s| of_trace(s, CLIENT_TRACE).len() >= 4)
        .await;
    let spans = of_trace(&spans, CLIENT_TRACE);
    assert_eq!(spans.len(), 4, "{spans:#?}");
    let (a_server, a_client) = (find(&spans, "edge-a", 2), find(&spans, "edge-a", 3));
    let (b_server, b_client) = (find(&spans, "hop-b", 2), find(&spans, "hop-b", 3));
    assert_eq!(
        a_server.parent, CLIENT_SPAN,
        "the edge continues the client's trace"
    );
    assert_eq!(a_client.parent, a_server.span_id);
    assert_eq!(
        b_server.parent, a_client.span_id,
        "the attempt's traceparent went upstream"
    );
    assert_eq!(b_client.parent, b_server.span_id);
    assert_eq!(seen, format!("00-{CLIENT_TRACE}-{}-01", b_client.span_id));

    assert_eq!(a_server.name, "GET default");
    for (k, v) in [
        ("http.request.method", "GET"),
        ("url.path", "/hop"),
        ("http.route", "default"),
        ("http.response.status_code", "200"),
        ("network.protocol.version", "1.1"),
        ("client.address", "127.0.0.1"),
        ("keymaster.request_id", "rid-hop"),
        ("keymaster.listener", "main"),
    ] {
        assert_eq!(a_server.attr(k).as_deref(), Some(v), "{k} in {a_server:#?}");
    }
    assert_eq!(a_server.attr("error.type"), None);
    assert_eq!(a_client.attr("keymaster.try").as_deref(), Some("1"));
    assert_eq!(
        a_client.attr("keymaster.cluster").as_deref(),
        Some("origin")
    );
    assert_eq!(
        a_client.attr("http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(a_client.attr("server.address"), Some(b.addr.to_string()));
    let res = &a_server.resource;
    assert!(res.contains_key("service.instance.id") && res.contains_key("service.version"));

    // The access log names the trace.
    let found = eventually(Duration::from_secs(5), || {
        std::fs::read_to_string(&log)
            .is_ok_and(|t| t.contains(&format!("\"trace_id\":\"{CLIENT_TRACE}\"")))
    })
    .await;
    assert!(found, "{:?}", std::fs::read_to_string(&log));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_follows_the_route_then_the_listener_and_honours_the_parent_flag() {
    let collector = Collector::start().await;
    let origin = head_echo_origin().await;
    let traces = traces_toml(&format!("http://{}", collector.grpc), "grpc", "edge");
    let routes = format!(
        "{traces}\n[[routes]]\nname = \"traced\"\ncluster = \"origin\"\nmatch = {{ path_prefix = \"/traced\" }}\ntrace_sample = 1.0\n"
    );
    let g = start_gateway(&config_text(origin.addr, "trace_sample = 0.0", &routes));
    let flag = |tp: &str| tp[53..].to_string();
    let trace_of = |tp: &str| tp[3..35].to_string();

    // No parent: the ratio decides (listener 0, route 1); a trace id goes upstream anyway.
    let plain = origin_traceparent(&get(g.addr, "/plain").await);
    assert_eq!(flag(&plain), "00", "{plain}");
    let traced = origin_traceparent(&get(g.addr, "/traced").await);
    assert_eq!(flag(&traced), "01", "{traced}");
    // A parent's flag wins both ways.
    let sampled_parent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let r = get_with(g.addr, "/plain", &[("traceparent", &sampled_parent)]).await;
    assert_eq!(flag(&origin_traceparent(&r)), "01");
    let other = "0af7651916cd43dd8448eb211c80319c";
    let unsampled_parent = format!("00-{other}-{CLIENT_SPAN}-00");
    let r = get_with(g.addr, "/traced", &[("traceparent", &unsampled_parent)]).await;
    let kept = origin_traceparent(&r);
    assert_eq!(
        (trace_of(&kept), flag(&kept)),
        (other.to_string(), "00".into())
    );
    // An invalid traceparent starts a new trace.
    let r = get_with(g.addr, "/traced", &[("traceparent", "00-zz-zz-01")]).await;
    let fresh = origin_traceparent(&r);
    assert_eq!(flag(&fresh), "01");

    let want = [
        trace_of(&traced),
        CLIENT_TRACE.to_string(),
        trace_of(&fresh),
    ];
    let spans = collector
        .wait_for(|s| want.iter().all(|t| of_trace(s, t).len() == 2))
        .await;
    for t in &want {
        assert_eq!(
            of_trace(&spans, t).len(),
            2,
            "server and client span of {t}"
        );
    }
    for unsampled in [trace_of(&plain), other.to_string()] {
        assert!(
            of_trace(&spans, &unsampled).is_empty(),
            "{unsampled} was not sampled"
        );
    }
    let continued = of_trace(&spans, CLIENT_TRACE);
    assert_eq!(
        find(&continued, "edge", 2).attr("http.route").as_deref(),
        Some("default")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_attempt_is_a_client_span_and_filter_steps_are_events() {
    let collector = Collector::start().await;
    // The first request gets a 503, the rest the echo.
    let origin = raw_origin(|mut s, i| async move {
        let mut carry = Vec::new();
        while let Some(head) = read_head(&mut s, &mut carry).await {
            let resp = if i == 0 {
                "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_string()
            } else {
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{head}",
                    head.len()
                )
            };
            if s.write_all(resp.as_bytes()).await.is_err() || i == 0 {
                return;
            }
        }
    })
    .await;
    let extra = format!(
        "{}\n[[filters]]\nname = \"stamp\"\ntype = \"headers\"\nstage = \"post\"\nset = {{ x-stamp = \"1\" }}\n\n[[routes]]\nname = \"retried\"\ncluster = \"origin\"\nmatch = {{ path_prefix = \"/\" }}\nretry = {{ attempts = 2, statuses = [503], backoff_base = \"1ms\", backoff_max = \"1ms\" }}\n",
        traces_toml(&format!("http://{}", collector.grpc), "grpc", "edge")
    );
    let g = start_gateway(&config_text(origin.addr, "", &extra));
    let parent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let r = get_with(g.addr, "/again", &[("traceparent", &parent)]).await;
    assert_eq!(r.status, 200);
    let seen = origin_traceparent(&r);

    let spans = collector
        .wait_for(|s| of_trace(s, CLIENT_TRACE).len() >= 3)
        .await;
    let spans = of_trace(&spans, CLIENT_TRACE);
    let server = find(&spans, "edge", 2);
    let mut clients: Vec<_> = spans.iter().filter(|s| s.kind == 3).collect();
    clients.sort_by_key(|s| s.attr("keymaster.try"));
    assert_eq!(clients.len(), 2, "{spans:#?}");
    assert!(clients.iter().all(|c| c.parent == server.span_id));
    assert_eq!(
        clients[0].attr("http.response.status_code").as_deref(),
        Some("503")
    );
    assert_eq!(clients[0].attr("error.type").as_deref(), Some("503"));
    assert_eq!(clients[0].status_code, 2, "an error status");
    assert_eq!(clients[1].attr("keymaster.try").as_deref(), Some("2"));
    assert_eq!(
        clients[1].attr("http.request.resend_count").as_deref(),
        Some("1")
    );
    assert_eq!(seen, format!("00-{CLIENT_TRACE}-{}-01", clients[1].span_id));
    assert!(
        server.events.iter().any(|e| e.contains("stamp")),
        "the filter step is an event: {server:#?}"
    );
}

/// Requests through a gateway whose collector is `endpoint`: all must succeed, none may wait
/// for the exporter. Returns the slowest request and the p99.
async fn load_through(
    endpoint: &str,
    origin: std::net::SocketAddr,
) -> (TestGateway, Duration, Duration) {
    let traces = format!(
        "[traces]\nendpoint = \"{endpoint}\"\nqueue_size = 16\nbatch_size = 8\nexport_interval = \"10ms\"\nexport_timeout = \"3s\"\n"
    );
    let g = start_gateway(&config_text(origin, "", &traces));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let addr = g.addr;
        tasks.push(tokio::spawn(async move {
            let mut times = Vec::new();
            let mut c = Client::connect(addr).await;
            for _ in 0..50 {
                let t = Instant::now();
                let r = c.get("/x").await;
                assert_eq!(r.status, 200);
                times.push(t.elapsed());
            }
            times
        }));
    }
    let mut times = Vec::new();
    for t in tasks {
        times.extend(t.await.unwrap());
    }
    times.sort();
    let p99 = times[times.len() * 99 / 100];
    (g, *times.last().unwrap(), p99)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_or_absent_collector_never_fails_or_holds_a_request() {
    let stub = stub();
    // A collector that accepts and never answers: every export waits out its timeout.
    let stalled = raw_origin(|s, _| async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(s);
    })
    .await;
    let (g, slowest, p99) =
        load_through(&format!("http://{}", stalled.addr), stub.local_addr()).await;
    eprintln!("stalled collector: 800 requests, p99 {p99:?}, slowest {slowest:?}");
    // An export blocking a worker would hold requests for the 3 s export timeout.
    assert!(
        slowest < Duration::from_secs(2),
        "slowest request {slowest:?}"
    );
    let m = metrics_text(&g).await;
    assert!(
        metric(&m, "keymaster_trace_spans_total{outcome=\"dropped\"}") > 0.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "keymaster_trace_spans_total{outcome=\"exported\"}"),
        0.0
    );

    // Nobody listening: exports fail at once, and are counted.
    let (dead, _dead_held) = closed_addr();
    let (g, slowest, p99) = load_through(&format!("http://{dead}"), stub.local_addr()).await;
    eprintln!("absent collector: 800 requests, p99 {p99:?}, slowest {slowest:?}");
    assert!(
        slowest < Duration::from_secs(2),
        "slowest request {slowest:?}"
    );
    let mut counted = false;
    for _ in 0..100 {
        let m = metrics_text(&g).await;
        if metric(&m, "keymaster_trace_spans_total{outcome=\"failed\"}") > 0.0 {
            counted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(counted, "failed exports are counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_still_queued_are_exported_when_the_gateway_stops() {
    let collector = Collector::start().await;
    let stub = stub();
    // A batch would wait a minute: only the shutdown's flush can send it in time.
    let traces = format!(
        "[traces]\nendpoint = \"http://{}\"\nservice_name = \"stopping\"\nexport_interval = \"60s\"\n",
        collector.grpc
    );
    let g = start_gateway(&config_text(stub.local_addr(), "", &traces));
    let parent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    assert_eq!(
        get_with(g.addr, "/", &[("traceparent", &parent)])
            .await
            .status,
        200
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        of_trace(&collector.spans(), CLIENT_TRACE).is_empty(),
        "not exported before the stop"
    );
    tokio::task::spawn_blocking(move || g.shutdown())
        .await
        .unwrap();
    let spans = collector
        .wait_for(|s| of_trace(s, CLIENT_TRACE).len() == 2)
        .await;
    assert_eq!(of_trace(&spans, CLIENT_TRACE).len(), 2, "{spans:#?}");
}
