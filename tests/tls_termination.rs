//! Inbound TLS: HTTP/1.1 and h2 (ALPN) through to the stub origin, SNI certificate choice,
//! TLS 1.2 and 1.3, mTLS with the client identity forwarded, and bad handshakes.
mod support;
mod tls_support;

use std::time::Duration;
use support::*;
use tls_support::*;
use tokio::io::AsyncWriteExt;

fn tls_gateway(tls: &str, listener_extra: &str) -> (TestGateway, StubHandle) {
    let s = stub();
    let g = start_gateway(&config_text(
        s.local_addr(),
        &format!("{tls}\n{listener_extra}"),
        "",
    ));
    (g, s)
}

fn failures(g: &TestGateway) -> f64 {
    metric(
        &g.gateway().metrics_text(),
        "keymaster_tls_handshake_failures_total{listener=\"main\"}",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_over_tls_reaches_the_origin_as_https() {
    let pki = Pki::new();
    let a = pki.issue("a", &["a.example"], "a.example", false);
    let (g, _s) = tls_gateway(&tls_keys(&[&a], ""), "");
    let s = connect(
        g.addr,
        "a.example",
        client_config(&pki, &ClientOpts::default()),
    )
    .await
    .expect("TLS handshake");
    assert_eq!(negotiated_alpn(&s).as_deref(), Some(&b"http/1.1"[..]));
    let mut c = H1::handshake(s).await.unwrap();
    for n in [0, 10, 70_000] {
        let r = c.get(&format!("/?length={n}"), &[]).await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, stub_body(n));
    }
    // A client's claim is not believed from an untrusted peer.
    let r = c
        .get("/__inspect", &[("x-forwarded-proto", "http")])
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(inspected(&r.body, "x-forwarded-proto"), vec!["https"]);
    assert_eq!(failures(&g), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_over_tls_is_chosen_by_alpn() {
    let pki = Pki::new();
    let a = pki.issue("a", &["a.example"], "a.example", false);
    let (g, _s) = tls_gateway(&tls_keys(&[&a], ""), "");
    let opts = ClientOpts {
        alpn: vec!["h2", "http/1.1"],
        ..Default::default()
    };
    let s = connect(g.addr, "a.example", client_config(&pki, &opts))
        .await
        .unwrap();
    assert_eq!(negotiated_alpn(&s).as_deref(), Some(&b"h2"[..]));
    let mut h2 = h2(s).await.expect("h2 handshake");
    let mut tasks = Vec::new();
    for n in [1usize, 500, 20_000, 3] {
        let mut h = h2.clone();
        tasks.push(tokio::spawn(async move {
            let r = h2_get(&mut h, &format!("/?length={n}&delay=20"))
                .await
                .unwrap();
            (r.status, r.version, r.body.len(), n)
        }));
    }
    for t in tasks {
        let (status, version, len, n) = t.await.unwrap();
        assert_eq!((status, version, len), (200, http::Version::HTTP_2, n));
    }
    let r = h2_get(&mut h2, "/__inspect").await.unwrap();
    assert_eq!(inspected(&r.body, "x-forwarded-proto"), vec!["https"]);
    assert_eq!(inspected(&r.body, "via"), vec!["2 keymaster"]);

    // A listener limited to HTTP/1.1 negotiates http/1.1 with the same client.
    let (g1, _s1) = tls_gateway(&tls_keys(&[&a], ""), "protocol = \"http1\"");
    let s = connect(g1.addr, "a.example", client_config(&pki, &opts))
        .await
        .unwrap();
    assert_eq!(negotiated_alpn(&s).as_deref(), Some(&b"http/1.1"[..]));
    let r = H1::handshake(s)
        .await
        .unwrap()
        .get("/?length=5", &[])
        .await
        .unwrap();
    assert_eq!((r.status, r.version), (200, http::Version::HTTP_11));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_chooses_the_certificate_and_the_first_is_the_default() {
    let pki = Pki::new();
    let a = pki.issue("a", &["a.example"], "a", false);
    let b = pki.issue("b", &["b.example", "*.b.example"], "b", false);
    let (g, _s) = tls_gateway(&tls_keys(&[&a, &b], ""), "");
    let cfg = client_config(&pki, &ClientOpts::default());
    for (name, want) in [
        ("a.example", &a),
        ("b.example", &b),
        ("api.b.example", &b),
        ("A.EXAMPLE", &a),
    ] {
        let s = connect(g.addr, name, cfg.clone()).await.unwrap();
        assert!(
            peer_leaf(&s) == want.der,
            "{name} got the wrong certificate"
        );
        let r = H1::handshake(s)
            .await
            .unwrap()
            .get("/?length=3", &[])
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    }
    // No SNI at all: the first certificate.
    let no_sni = client_config(
        &pki,
        &ClientOpts {
            sni: false,
            ..Default::default()
        },
    );
    let s = connect(g.addr, "a.example", no_sni).await.unwrap();
    assert!(peer_leaf(&s) == a.der);
    // An unknown name: the default (a), which the client then rightly refuses for b's name.
    let err = connect(g.addr, "x.y.b.example", cfg.clone()).await;
    assert!(
        err.is_err(),
        "a.example's certificate is not valid for x.y.b.example"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls12_only_and_tls13_only_clients_both_work() {
    let pki = Pki::new();
    let a = pki.issue("a", &["a.example"], "a", false);
    let (g, _s) = tls_gateway(&tls_keys(&[&a], ""), "");
    for (version, want) in [
        (&rustls::version::TLS12, rustls::ProtocolVersion::TLSv1_2),
        (&rustls::version::TLS13, rustls::ProtocolVersion::TLSv1_3),
    ] {
        for alpn in [vec!["http/1.1"], vec!["h2"]] {
            let opts = ClientOpts {
                versions: vec![version],
                alpn: alpn.clone(),
                ..Default::default()
            };
            let s = connect(g.addr, "a.example", client_config(&pki, &opts))
                .await
                .unwrap();
            assert_eq!(s.get_ref().1.protocol_version(), Some(want));
            let r = if alpn == ["h2"] {
                h2_get(&mut h2(s).await.unwrap(), "/?length=9")
                    .await
                    .unwrap()
            } else {
                H1::handshake(s)
                    .await
                    .unwrap()
                    .get("/?length=9", &[])
                    .await
                    .unwrap()
            };
            assert_eq!((r.status, r.body.len()), (200, 9), "{want:?} {alpn:?}");
        }
    }
    // min_version = "1.3" refuses a TLS 1.2-only client and counts the failure.
    let (g13, _s13) = tls_gateway(&tls_keys(&[&a], "min_version = \"1.3\""), "");
    let tls12 = ClientOpts {
        versions: vec![&rustls::version::TLS12],
        ..Default::default()
    };
    assert!(connect(g13.addr, "a.example", client_config(&pki, &tls12))
        .await
        .is_err());
    assert!(eventually(Duration::from_secs(2), || failures(&g13) == 1.0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_required_verifies_clients_and_forwards_their_identity() {
    let pki = Pki::new();
    let a = pki.issue("a", &["a.example"], "a", false);
    let alice = pki.issue("alice", &[], "alice", true);
    let mallory = pki.issue_untrusted("mallory", &[], "mallory", true);
    let ca = pki.ca_path();
    let (g, _s) = tls_gateway(
        &tls_keys(
            &[&a],
            &format!(
                "client_auth = {{ ca = \"{}\", required = true, forward_header = \"x-client-cert-subject\" }}",
                ca.display()
            ),
        ),
        "",
    );

    // No certificate: the handshake (or, in TLS 1.3, the first exchange) fails.
    for versions in [vec![&rustls::version::TLS13], vec![&rustls::version::TLS12]] {
        let opts = ClientOpts {
            versions,
            ..Default::default()
        };
        let failed = match connect(g.addr, "a.example", client_config(&pki, &opts)).await {
            Err(_) => true,
            Ok(s) => match H1::handshake(s).await {
                Err(_) => true,
                Ok(mut c) => c.get("/", &[]).await.is_err(),
            },
        };
        assert!(
            failed,
            "a client without a certificate must not get through"
        );
    }
    // A certificate from an unknown CA fails too.
    let opts = ClientOpts {
        client_cert: Some((mallory.der.clone(), mallory.key_der.clone_key())),
        ..Default::default()
    };
    let failed = match connect(g.addr, "a.example", client_config(&pki, &opts)).await {
        Err(_) => true,
        Ok(s) => match H1::handshake(s).await {
            Err(_) => true,
            Ok(mut c) => c.get("/", &[]).await.is_err(),
        },
    };
    assert!(
        failed,
        "an untrusted client certificate must not get through"
    );
    assert!(eventually(Duration::from_secs(2), || failures(&g) == 3.0).await);

    // Alice's certificate is signed by the CA: her CN reaches the origin, and a value she
    // sends herself is replaced.
    for alpn in ["http/1.1", "h2"] {
        let opts = ClientOpts {
            alpn: vec![alpn],
            client_cert: Some((alice.der.clone(), alice.key_der.clone_key())),
            ..Default::default()
        };
        let s = connect(g.addr, "a.example", client_config(&pki, &opts))
            .await
            .unwrap();
        let r = if alpn == "h2" {
            h2_get(&mut h2(s).await.unwrap(), "/__inspect")
                .await
                .unwrap()
        } else {
            H1::handshake(s)
                .await
                .unwrap()
                .get("/__inspect", &[("x-client-cert-subject", "admin")])
                .await
                .unwrap()
        };
        assert_eq!(r.status, 200);
        assert_eq!(inspected(&r.body, "x-client-cert-subject"), vec!["alice"]);
    }
    assert_eq!(failures(&g), 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_optional_lets_anonymous_clients_in_without_an_identity() {
    let pki = Pki::new();
    let a = pki.issue("a", &["a.example"], "a", false);
    let bob = pki.issue("bob", &["bob.clients.example"], "bob", true);
    let (g, _s) = tls_gateway(
        &tls_keys(
            &[&a],
            &format!(
                "client_auth = {{ ca = \"{}\", required = false, forward_header = \"x-client-cert-subject\" }}",
                pki.ca_path().display()
            ),
        ),
        "",
    );
    let s = connect(
        g.addr,
        "a.example",
        client_config(&pki, &ClientOpts::default()),
    )
    .await
    .unwrap();
    let r = H1::handshake(s)
        .await
        .unwrap()
        .get("/__inspect", &[("x-client-cert-subject", "bob")])
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(
        inspected(&r.body, "x-client-cert-subject").is_empty(),
        "an anonymous client's claimed identity is dropped"
    );
    let opts = ClientOpts {
        client_cert: Some((bob.der.clone(), bob.key_der.clone_key())),
        ..Default::default()
    };
    let s = connect(g.addr, "a.example", client_config(&pki, &opts))
        .await
        .unwrap();
    let r = H1::handshake(s)
        .await
        .unwrap()
        .get("/__inspect", &[])
        .await
        .unwrap();
    assert_eq!(inspected(&r.body, "x-client-cert-subject"), vec!["bob"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_silence_fail_the_handshake_and_are_counted() {
    let pki = Pki::new();
    let a = pki.issue("a", &["a.example"], "a", false);
    let (g, _s) = tls_gateway(&tls_keys(&[&a], ""), "header_read_timeout = \"300ms\"");
    // Plain HTTP to the TLS port: closed.
    let (_, closed) = raw_exchange(
        g.addr,
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert!(closed, "plain HTTP on a TLS port is closed");
    // Random bytes that look like a TLS record header with nonsense in it.
    let (_, closed) = raw_exchange(
        g.addr,
        b"\x16\x03\x01\x00\x05hello\x00\x00\x00",
        Duration::from_secs(3),
    )
    .await;
    assert!(closed);
    // Silence: closed after header_read_timeout.
    let started = std::time::Instant::now();
    let mut s = tokio::net::TcpStream::connect(g.addr).await.unwrap();
    let (_, closed) = read_until_close(&mut s, Duration::from_secs(3)).await;
    assert!(closed && started.elapsed() < Duration::from_secs(2));
    // Half a ClientHello, then nothing: also closed by the timeout.
    let mut s = tokio::net::TcpStream::connect(g.addr).await.unwrap();
    s.write_all(b"\x16\x03\x01\x02\x00\x01").await.unwrap();
    let (_, closed) = read_until_close(&mut s, Duration::from_secs(3)).await;
    assert!(closed);
    assert!(eventually(Duration::from_secs(2), || failures(&g) == 4.0).await);
    // The gateway keeps serving.
    let s = connect(
        g.addr,
        "a.example",
        client_config(&pki, &ClientOpts::default()),
    )
    .await
    .unwrap();
    let r = H1::handshake(s)
        .await
        .unwrap()
        .get("/?length=4", &[])
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(failures(&g), 4.0);
}

/// Read one response to a `GET /?length=n` within 10 s: the bytes read (head and body),
/// and whether the head and `n` body bytes all arrived. `pace`: a pause before each read
/// (a reader slower than the gateway). The head's end is looked for until found, not in the
/// whole buffer after every read (that scan, unoptimised, made a slow test run take longer
/// than the timeout).
async fn read_response<S>(
    s: &mut S,
    n: usize,
    chunk: usize,
    pace: Option<Duration>,
) -> (Vec<u8>, bool)
where
    S: tokio::io::AsyncRead + Unpin,
{
    use tokio::io::AsyncReadExt;
    let mut got = Vec::with_capacity(n + 1024);
    let mut buf = vec![0u8; chunk];
    let mut head_end = None;
    let whole = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(p) = pace {
                tokio::time::sleep(p).await;
            }
            let k = s.read(&mut buf).await.expect("read");
            assert!(k > 0, "closed early");
            got.extend_from_slice(&buf[..k]);
            if head_end.is_none() {
                head_end = got.windows(4).position(|w| w == b"\r\n\r\n");
            }
            if head_end.is_some_and(|end| got.len() >= end + 4 + n) {
                return;
            }
        }
    })
    .await;
    (got, whole.is_ok())
}

/// The body of a response [`read_response`] read whole: exactly `n` bytes, the stub's.
fn assert_stub_body(got: &[u8], n: usize, what: &str) {
    let end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    assert_eq!(got.len(), end + 4 + n, "{what}: more than the body");
    assert!(got[end + 4..] == stub_body(n)[..], "{what}: body differs");
}

/// A client that reads slower than the gateway writes: the socket is full whenever the
/// gateway writes, so the body's last bytes are taken into the TLS session's buffer with
/// the socket full. They must still go out when the socket drains, with no later write to
/// push them: the whole body arrives, each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_gets_the_last_bytes_of_every_response() {
    let pki = Pki::new();
    let a = pki.issue("a", &["a.example"], "a.example", false);
    let (g, _s) = tls_gateway(&tls_keys(&[&a], ""), "");
    let tcp = tokio::net::TcpSocket::new_v4().unwrap();
    tcp.set_recv_buffer_size(16 * 1024).unwrap();
    let tcp = tcp.connect(g.addr).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(client_config(&pki, &ClientOpts::default()));
    let name = rustls::pki_types::ServerName::try_from("a.example").unwrap();
    let mut s = connector.connect(name, tcp).await.expect("TLS handshake");
    for round in 0..8 {
        // More than the gateway's socket buffers hold, so that its writes fill them; the
        // sizes vary so that the last write meets the socket's buffers at different fills.
        let n = 2 * 1024 * 1024 + round * 13_007;
        let req = format!("GET /?length={n} HTTP/1.1\r\nHost: a.example\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        // About 16 MB/s: slower than the gateway, which is always ahead of the reader with
        // its socket full.
        let pace = Some(Duration::from_millis(1));
        let (got, whole) = read_response(&mut s, n, 16 * 1024, pace).await;
        assert!(
            whole,
            "round {round}: only {} of {n} bytes arrived",
            got.len()
        );
        assert_stub_body(&got, n, &format!("round {round}"));
    }
}

/// A large response to a client that starts reading late: the socket fills, so the last
/// writes leave ciphertext in the TLS session's buffer. The server must flush it: the whole
/// body arrives without another request to push it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_response_arrives_whole_to_a_late_reader() {
    let pki = Pki::new();
    let a = pki.issue("a", &["a.example"], "a.example", false);
    let (g, _s) = tls_gateway(&tls_keys(&[&a], ""), "");
    let mut s = connect(
        g.addr,
        "a.example",
        client_config(&pki, &ClientOpts::default()),
    )
    .await
    .expect("TLS handshake");
    let n = 8 * 1024 * 1024;
    let req = format!("GET /?length={n} HTTP/1.1\r\nHost: a.example\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    // Let the gateway fill the socket and the TLS session's buffer.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (got, whole) = read_response(&mut s, n, 64 * 1024, None).await;
    assert!(whole, "only {} of {n} bytes arrived", got.len());
    assert_stub_body(&got, n, "the response");
}
