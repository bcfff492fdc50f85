//! The basic path: a request through the gateway to the stub and back, with pooling.
mod support;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_to_the_stub_and_reuses_the_upstream_connection() {
    let (g, _stub) = gateway_with_stub();
    let mut c = Client::connect(g.addr).await;
    for _ in 0..5 {
        let r = c.get("/hello?length=1000").await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body, stub_body(1000));
        assert_eq!(r.headers["via"], "1.1 keymaster");
        assert_eq!(r.headers["x-request-id"].len(), 32);
    }
    let m = admin_get(&g, "/metrics").await;
    let text = std::str::from_utf8(&m.body).unwrap();
    assert_eq!(
        metric(
            text,
            "keymaster_upstream_connects_total{cluster=\"origin\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(text, "keymaster_upstream_reused_total{cluster=\"origin\"}"),
        4.0
    );
    assert_eq!(
        metric(
            text,
            "keymaster_requests_total{route=\"default\",status_class=\"2xx\"}"
        ),
        5.0
    );
}
