//! The PROXY protocol on listeners, over raw sockets against the real gateway and the stub
//! origin: v1 TCP4/TCP6/UNKNOWN, v2 PROXY/LOCAL with TLVs, the header split across writes,
//! before TLS, the carried address in X-Forwarded-For, the IP filter, rate-limit keys and the
//! access log, PROXY headers sent to origins per cluster, and refusals
//! (malformed, truncated, wrong version, slow, untrusted peer) closing the connection with no
//! HTTP response, counted by reason.
mod support;
mod tls_support;

use std::net::SocketAddr;
use std::time::Duration;
use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const INSPECT: &[u8] = b"GET /__inspect HTTP/1.1\r\nhost: gw.test\r\nconnection: close\r\n\r\n";

fn pp_gateway(
    mode: &str,
    from: &str,
    listener_extra: &str,
    extra: &str,
) -> (TestGateway, StubHandle) {
    let s = stub();
    let keys =
        format!("proxy_protocol = \"{mode}\"\nproxy_protocol_from = [{from}]\n{listener_extra}");
    let g = start_gateway(&config_text(s.local_addr(), &keys, extra));
    (g, s)
}

fn v2(cmd: u8, fam: u8, addrs: &[u8], tlvs: &[u8]) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.push(0x20 | cmd);
    h.push(fam);
    h.extend_from_slice(&((addrs.len() + tlvs.len()) as u16).to_be_bytes());
    h.extend_from_slice(addrs);
    h.extend_from_slice(tlvs);
    h
}

/// 192.0.2.1:5555 → 10.0.0.1:443 over TCP/IPv4.
const V4_ADDRS: [u8; 12] = [192, 0, 2, 1, 10, 0, 0, 1, 0x15, 0xb3, 1, 187];

/// Send `header` then an inspect request; the X-Forwarded-For the origin saw.
async fn xff_via(addr: SocketAddr, header: &[u8]) -> Vec<String> {
    let (out, _) = raw_exchange(addr, &[header, INSPECT].concat(), Duration::from_secs(5)).await;
    assert_eq!(
        status_of(&out),
        Some(200),
        "{}",
        String::from_utf8_lossy(&out)
    );
    let body_at = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    tls_support::inspected(&out[body_at..], "x-forwarded-for")
}

fn rejected(g: &TestGateway, reason: &str) -> f64 {
    metric(
        &g.gateway().metrics_text(),
        &format!(
            "keymaster_proxy_protocol_rejected_total{{listener=\"main\",reason=\"{reason}\"}}"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_tcp4_tcp6_and_unknown() {
    let (g, _s) = pp_gateway("v1", "\"127.0.0.1\"", "", "");
    let tcp4 = b"PROXY TCP4 192.0.2.1 10.0.0.1 5555 443\r\n";
    assert_eq!(xff_via(g.addr, tcp4).await, vec!["192.0.2.1"]);
    let tcp6 = b"PROXY TCP6 2001:db8::7 2001:db8::1 5555 443\r\n";
    assert_eq!(xff_via(g.addr, tcp6).await, vec!["2001:db8::7"]);
    // UNKNOWN: the balancer's own connection (health checks); the socket peer stands.
    assert_eq!(
        xff_via(g.addr, b"PROXY UNKNOWN\r\n").await,
        vec!["127.0.0.1"]
    );
    assert_eq!(rejected(&g, "malformed"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_proxy_and_local_with_tlvs_ignored() {
    let (g, _s) = pp_gateway("v2", "\"127.0.0.0/8\"", "", "");
    // Two TLVs (ALPN and authority), skipped.
    let tlvs = [&[0x01, 0, 2][..], b"h2", &[0x02, 0, 6], b"gw.dev"].concat();
    assert_eq!(
        xff_via(g.addr, &v2(1, 0x11, &V4_ADDRS, &tlvs)).await,
        vec!["192.0.2.1"]
    );
    let mut v6 = vec![0x20, 0x01, 0x0d, 0xb8];
    v6.extend_from_slice(&[0; 11]);
    v6.push(9); // 2001:db8::9
    v6.extend_from_slice(&[0; 16]);
    v6.extend_from_slice(&[0x15, 0xb3, 1, 187]);
    assert_eq!(
        xff_via(g.addr, &v2(1, 0x21, &v6, &[])).await,
        vec!["2001:db8::9"]
    );
    // LOCAL: the peer itself.
    assert_eq!(
        xff_via(g.addr, &v2(0, 0x00, &[], &[])).await,
        vec!["127.0.0.1"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_accepts_both_and_a_header_split_across_writes() {
    let (g, _s) = pp_gateway("any", "\"127.0.0.1\"", "", "");
    assert_eq!(
        xff_via(g.addr, b"PROXY TCP4 192.0.2.3 10.0.0.1 1 2\r\n").await,
        vec!["192.0.2.3"]
    );
    assert_eq!(
        xff_via(g.addr, &v2(1, 0x11, &V4_ADDRS, &[])).await,
        vec!["192.0.2.1"]
    );
    // The header arrives in pieces (the gateway waits for the rest, then reads exactly it).
    for header in [
        b"PROXY TCP4 192.0.2.4 10.0.0.1 1 2\r\n".to_vec(),
        v2(1, 0x11, &V4_ADDRS, &[0x04, 0, 1, 0]),
    ] {
        let mut s = TcpStream::connect(g.addr).await.unwrap();
        let (a, b) = header.split_at(7);
        s.write_all(a).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        s.write_all(b).await.unwrap();
        s.write_all(INSPECT).await.unwrap();
        let (out, _) = read_until_close(&mut s, Duration::from_secs(5)).await;
        assert_eq!(
            status_of(&out),
            Some(200),
            "{}",
            String::from_utf8_lossy(&out)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn carried_address_feeds_ip_filter_and_forwarded() {
    let filters = r#"
[[filters]]
name = "deny-docnet"
type = "ip_filter"
deny = ["192.0.2.0/24"]
"#;
    let (g, _s) = pp_gateway("v1", "\"127.0.0.1\"", "forwarded_header = true", filters);
    let (out, _) = raw_exchange(
        g.addr,
        &[&b"PROXY TCP4 192.0.2.1 10.0.0.1 5555 443\r\n"[..], INSPECT].concat(),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(
        status_of(&out),
        Some(403),
        "the carried address is filtered"
    );
    let (out, _) = raw_exchange(
        g.addr,
        &[
            &b"PROXY TCP4 198.51.100.9 10.0.0.1 5555 443\r\n"[..],
            INSPECT,
        ]
        .concat(),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(status_of(&out), Some(200));
    let body_at = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let fwd = tls_support::inspected(&out[body_at..], "forwarded");
    assert_eq!(fwd.len(), 1);
    assert!(fwd[0].starts_with("for=198.51.100.9;"), "{fwd:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn carried_address_keys_rate_limits_and_the_access_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let extra = format!(
        r#"
[access_log]
enabled = true
format = "json"
path = "{}"

[[filters]]
name = "per-ip"
type = "rate_limit"
requests = 1
period = "1h"
"#,
        log.display()
    );
    let (g, _s) = pp_gateway("v1", "\"127.0.0.1\"", "", &extra);
    let ask = |ip: &str| {
        let h = format!("PROXY TCP4 {ip} 10.0.0.1 5555 443\r\n");
        [h.as_bytes(), INSPECT].concat()
    };
    let wait = Duration::from_secs(5);
    // Every connection comes from 127.0.0.1; the bucket is per carried client address.
    assert_eq!(
        status_of(&raw_exchange(g.addr, &ask("192.0.2.1"), wait).await.0),
        Some(200)
    );
    assert_eq!(
        status_of(&raw_exchange(g.addr, &ask("192.0.2.1"), wait).await.0),
        Some(429)
    );
    assert_eq!(
        status_of(&raw_exchange(g.addr, &ask("192.0.2.2"), wait).await.0),
        Some(200)
    );
    let mut lines = Vec::new();
    for _ in 0..500 {
        let t = std::fs::read_to_string(&log).unwrap_or_default();
        lines = t.lines().map(str::to_string).collect();
        if lines.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let clients: Vec<String> = lines
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["client"].to_string())
        .collect();
    assert_eq!(
        clients,
        vec!["\"192.0.2.1\"", "\"192.0.2.1\"", "\"192.0.2.2\""],
        "{lines:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_is_read_before_tls() {
    use tls_support::*;
    let pki = Pki::new();
    let cert = pki.issue("gw", &["gw.test"], "gw.test", false);
    let (g, _s) = pp_gateway("v2", "\"127.0.0.1\"", &tls_keys(&[&cert], ""), "");
    let mut tcp = TcpStream::connect(g.addr).await.unwrap();
    tcp.write_all(&v2(1, 0x11, &V4_ADDRS, &[])).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(client_config(&pki, &ClientOpts::default()));
    let name = rustls::pki_types::ServerName::try_from("gw.test").unwrap();
    let tls = connector
        .connect(name, tcp)
        .await
        .expect("TLS after the header");
    let mut c = H1::handshake(tls).await.unwrap();
    let r = c.get("/__inspect", &[]).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(inspected(&r.body, "x-forwarded-for"), vec!["192.0.2.1"]);
    assert_eq!(inspected(&r.body, "x-forwarded-proto"), vec!["https"]);
}

/// The connection is closed with nothing written back (it is not HTTP yet).
async fn closed_silently(addr: SocketAddr, bytes: &[u8], what: &str) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(bytes).await;
    let (out, closed) = read_until_close(&mut s, Duration::from_secs(10)).await;
    assert!(closed, "{what}: connection left open");
    assert!(
        out.is_empty(),
        "{what}: got {:?}",
        String::from_utf8_lossy(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_truncated_and_wrong_version_headers_close_the_connection() {
    let (g, _s) = pp_gateway("v1", "\"127.0.0.1\"", "", "");
    closed_silently(g.addr, INSPECT, "plain HTTP, no header").await;
    closed_silently(
        g.addr,
        b"PROXY TCP4 192.0.2.999 10.0.0.1 1 2\r\n",
        "bad address",
    )
    .await;
    closed_silently(
        g.addr,
        b"PROXY TCP5 192.0.2.1 10.0.0.1 1 2\r\n",
        "bad protocol",
    )
    .await;
    closed_silently(
        g.addr,
        &[b"PROXY TCP4 ".repeat(12).as_slice(), b"\r\n"].concat(),
        "too long",
    )
    .await;
    closed_silently(g.addr, &v2(1, 0x11, &V4_ADDRS, &[]), "v2 on a v1 listener").await;
    // Truncated: the peer closes half-way through the header.
    {
        let mut s = TcpStream::connect(g.addr).await.unwrap();
        s.write_all(b"PROXY TCP4 192.0.2.1 10.0").await.unwrap();
        s.shutdown().await.unwrap();
        let (out, closed) = read_until_close(&mut s, Duration::from_secs(10)).await;
        assert!(closed && out.is_empty());
    }
    assert!(eventually(Duration::from_secs(5), || rejected(&g, "malformed") == 6.0).await);
    assert_eq!(rejected(&g, "malformed"), 6.0);

    let (g2, _s2) = pp_gateway("v2", "\"127.0.0.1\"", "", "");
    let mut bad = v2(1, 0x11, &V4_ADDRS, &[]);
    bad[12] = 0x31; // version 3
    closed_silently(g2.addr, &bad, "unknown v2 version").await;
    let mut huge = v2(1, 0x11, &V4_ADDRS, &[]);
    huge[14..16].copy_from_slice(&8000u16.to_be_bytes());
    closed_silently(g2.addr, &huge, "declared length over the 4 KiB cap").await;
    closed_silently(
        g2.addr,
        b"PROXY TCP4 192.0.2.1 10.0.0.1 1 2\r\n",
        "v1 on a v2 listener",
    )
    .await;
    assert!(eventually(Duration::from_secs(5), || rejected(&g2, "malformed") == 3.0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_header_times_out() {
    let (g, _s) = pp_gateway(
        "any",
        "\"127.0.0.1\"",
        "header_read_timeout = \"300ms\"",
        "",
    );
    // Half a header, then silence: closed once the listener's header_read_timeout passes.
    let mut s = TcpStream::connect(g.addr).await.unwrap();
    s.write_all(b"PROXY TCP4 192.0.2.1").await.unwrap();
    let (out, closed) = read_until_close(&mut s, Duration::from_secs(20)).await;
    assert!(closed && out.is_empty(), "slow header not cut off");
    // Nothing at all is cut off the same way.
    let mut s = TcpStream::connect(g.addr).await.unwrap();
    let (out, closed) = read_until_close(&mut s, Duration::from_secs(20)).await;
    assert!(closed && out.is_empty());
    assert!(eventually(Duration::from_secs(5), || rejected(&g, "timeout") == 2.0).await);
    assert_eq!(rejected(&g, "malformed"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_peers_are_refused() {
    let (g, _s) = pp_gateway("any", "\"10.0.0.0/8\", \"192.0.2.7\"", "", "");
    closed_silently(
        g.addr,
        &[&b"PROXY TCP4 192.0.2.1 10.0.0.1 5555 443\r\n"[..], INSPECT].concat(),
        "a header from a peer outside proxy_protocol_from",
    )
    .await;
    assert!(eventually(Duration::from_secs(5), || rejected(&g, "untrusted") == 1.0).await);
    assert_eq!(rejected(&g, "malformed"), 0.0);
}

/// An origin that expects a PROXY header first on every connection: it answers each request
/// with the client address the header named (`v1 <addr>` / `v2 <addr>`), and the destination
/// it named in `x-destination`.
async fn pp_origin() -> RawOrigin {
    raw_origin(|mut s, _| async move {
        use tokio::io::AsyncReadExt;
        let mut carry = Vec::new();
        let mut buf = [0u8; 4096];
        let (named, destination) = loop {
            if carry.starts_with(b"PROXY ") {
                if let Some(i) = carry.windows(2).position(|w| w == b"\r\n") {
                    let line = String::from_utf8_lossy(&carry[..i]).into_owned();
                    carry.drain(..i + 2);
                    let f: Vec<&str> = line.split(' ').collect();
                    break (format!("v1 {}:{}", f[2], f[4]), format!("{}:{}", f[3], f[5]));
                }
            } else if carry.len() >= 16 && carry[..12] == b"\r\n\r\n\0\r\nQUIT\n"[..] {
                let len = u16::from_be_bytes([carry[14], carry[15]]) as usize;
                if carry.len() >= 16 + len {
                    let a = &carry[16..];
                    let ip = std::net::Ipv4Addr::new(a[0], a[1], a[2], a[3]);
                    let port = u16::from_be_bytes([a[8], a[9]]);
                    let dst = std::net::Ipv4Addr::new(a[4], a[5], a[6], a[7]);
                    let dst_port = u16::from_be_bytes([a[10], a[11]]);
                    carry.drain(..16 + len);
                    break (format!("v2 {ip}:{port}"), format!("{dst}:{dst_port}"));
                }
            } else if carry.len() >= 6 {
                return; // no PROXY header: hang up
            }
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => carry.extend_from_slice(&buf[..n]),
            }
        };
        while read_head(&mut s, &mut carry).await.is_some() {
            let resp = format!(
                "HTTP/1.1 200 OK\r\nx-destination: {destination}\r\ncontent-length: {}\r\n\r\n{named}",
                named.len()
            );
            if s.write_all(resp.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await
}

fn pp_cluster_config(origin: SocketAddr, cluster_pp: &str, listener_extra: &str) -> String {
    format!(
        r#"{PREAMBLE}{listener_extra}

[[routes]]
name = "default"
cluster = "origin"

[[clusters]]
name = "origin"
servers = [{{ address = "{origin}" }}]
proxy_protocol = "{cluster_pp}"
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_send_the_client_address_and_reuse_per_client_connection() {
    let o = pp_origin().await;
    let listener = "proxy_protocol = \"v1\"\nproxy_protocol_from = [\"127.0.0.1\"]\n";
    let g = start_gateway(&pp_cluster_config(o.addr, "v2", listener));
    // Client A (carried 192.0.2.1) sends two requests on its connection: one origin connection.
    let mut a = TcpStream::connect(g.addr).await.unwrap();
    a.write_all(b"PROXY TCP4 192.0.2.1 10.0.0.1 5555 443\r\n")
        .await
        .unwrap();
    let mut carry = Vec::new();
    for _ in 0..2 {
        a.write_all(b"GET / HTTP/1.1\r\nhost: gw\r\n\r\n")
            .await
            .unwrap();
        let head = read_head(&mut a, &mut carry).await.expect("response");
        assert_eq!(status_of(head.as_bytes()), Some(200), "{head}");
        // The destination the client's header carried, not the gateway's own address.
        assert!(head.contains("x-destination: 10.0.0.1:443\r\n"), "{head}");
        let body = read_exact_body(&mut a, &mut carry, "v2 192.0.2.1:5555".len()).await;
        assert_eq!(String::from_utf8_lossy(&body), "v2 192.0.2.1:5555");
    }
    assert_eq!(o.connections(), 1);
    // Client B gets its own origin connection and header, never A's.
    let (out, _) = raw_exchange(
        g.addr,
        b"PROXY TCP4 198.51.100.7 10.0.0.1 6000 443\r\nGET / HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(String::from_utf8_lossy(&out).ends_with("v2 198.51.100.7:6000"));
    assert_eq!(o.connections(), 2);
    drop(a);

    // v1 to the origin from a plain listener: the socket peer.
    let o1 = pp_origin().await;
    let g1 = start_gateway(&pp_cluster_config(o1.addr, "v1", ""));
    let r = get(g1.addr, "/").await;
    assert_eq!(r.status, 200);
    assert!(String::from_utf8_lossy(&r.body).starts_with("v1 127.0.0.1:"));
    // The destination is the address the client connected to.
    assert_eq!(r.headers["x-destination"], g1.addr.to_string());
}

/// A listener on a wildcard address: each connection's destination is the address the client
/// reached, not the wildcard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_destination_behind_a_wildcard_listener_is_the_address_reached() {
    let o = pp_origin().await;
    let config = pp_cluster_config(o.addr, "v1", "");
    let (head, tail) = config.split_once("[[listeners]]").expect("a listener");
    let listener = tail.replacen("127.0.0.1:0", "0.0.0.0:0", 1);
    let g = start_gateway(&format!("{head}[[listeners]]{listener}"));
    let reached = SocketAddr::from(([127, 0, 0, 1], g.addr.port()));
    let r = get(reached, "/").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["x-destination"], reached.to_string());
}
