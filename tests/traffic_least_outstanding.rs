//! `balance = "least_outstanding"` end to end: while one server holds a request, every new
//! request goes to the other, idle one (with two servers, the two random choices are always
//! both of them, so the one with fewer requests outstanding always wins).

mod support;
mod traffic_support;

use std::time::Duration;
use support::*;
use traffic_support::Named;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_requests_go_to_the_server_with_fewer_outstanding() {
    // Reads a request and never answers it: whatever reaches it stays outstanding.
    let holding = raw_origin(|mut s, _| async move {
        let _ = read_for(&mut s, Duration::from_secs(30)).await;
    })
    .await;
    let idle = Named::start("idle").await;
    let g = start_gateway(&format!(
        r#"{PREAMBLE}
[[routes]]
name = "r"
cluster = "c"

[[clusters]]
name = "c"
servers = [{{ address = "{}" }}, {{ address = "{}" }}]
balance = "least_outstanding"
connect_timeout = "1s"
response_header_timeout = "20s"
"#,
        holding.addr, idle.addr
    ));
    let addr = g.addr;
    // Requests in the background until one is held (a tie picks either server).
    let mut held = Vec::new();
    for _ in 0..50 {
        held.push(tokio::spawn(async move { try_get(addr, "/").await }));
        if eventually(Duration::from_millis(200), || holding.connections() == 1).await {
            break;
        }
    }
    assert_eq!(holding.connections(), 1, "one request held");
    let before = idle.hits();
    for i in 0..30 {
        let r = tokio::time::timeout(Duration::from_secs(2), get(addr, "/"))
            .await
            .unwrap_or_else(|_| panic!("request {i} went to the holding server"));
        assert_eq!((r.status, &r.body[..]), (200, &b"idle"[..]));
    }
    assert_eq!(idle.hits() - before, 30);
    assert_eq!(
        holding.connections(),
        1,
        "nothing more reached the holding server"
    );
    for h in held {
        h.abort();
    }
}
