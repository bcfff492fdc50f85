//! The load generator against the stub origin and against misbehaving servers, on 127.0.0.1.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use keymaster_bench::load::{check_report, run_load, LoadConfig, LoadReport};
use keymaster_bench::stub::{spawn_stub, stub_body_gzip, StubHandle};

fn stub() -> StubHandle {
    spawn_stub("127.0.0.1:0".parse().unwrap(), 2).expect("stub")
}

fn config(addr: SocketAddr, query: &str) -> LoadConfig {
    LoadConfig {
        url: format!("http://{addr}/bench?{query}"),
        connections: 4,
        threads: 2,
        duration: Duration::from_secs(10),
        warmup: Duration::ZERO,
        timeout: Duration::from_secs(5),
        max_requests: Some(200),
        ..LoadConfig::default()
    }
}

fn run(cfg: &LoadConfig) -> LoadReport {
    let report = run_load(cfg).expect("load run");
    eprintln!("{report}");
    report
}

#[test]
fn closed_loop_counts_exactly() {
    let stub = stub();
    let r = run(&config(stub.local_addr(), "length=1000"));
    assert_eq!(r.mode, "closed");
    assert_eq!(r.requests, 200);
    assert_eq!(r.ok, 200);
    assert_eq!(r.status.s2xx, 200);
    assert_eq!(r.errors.total(), 0);
    assert!(r.all_ok());
    assert_eq!(r.body_bytes, 200 * 1000);
    assert!(r.bytes > r.body_bytes, "heads are counted too");
    assert_eq!(r.connections_opened, 4, "keep-alive");
    assert_eq!(r.latency_ms.count, 200);
    assert!(r.latency_ms.p50 > 0.0 && r.latency_ms.p50 <= r.latency_ms.max);
    assert!(r.requests_per_sec > 0.0 && r.duration_secs < 10.0);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["requests"], 200);
    assert_eq!(json["errors"]["read"], 0);
}

#[test]
fn chunked_gzip_and_head_bodies() {
    let stub = stub();
    let r = run(&config(stub.local_addr(), "length=10000&gzip=1&chunked=1"));
    assert!(r.all_ok());
    assert_eq!(r.body_bytes, 200 * stub_body_gzip(10_000).len() as u64);

    let mut cfg = config(stub.local_addr(), "length=10000");
    cfg.method = "HEAD".into();
    let r = run(&cfg);
    assert!(r.all_ok());
    assert_eq!((r.requests, r.body_bytes), (200, 0));
}

#[test]
fn churn_opens_a_connection_per_request() {
    let stub = stub();
    let mut cfg = config(stub.local_addr(), "length=100");
    cfg.churn = true;
    cfg.max_requests = Some(60);
    let r = run(&cfg);
    assert!(r.all_ok());
    assert_eq!(r.requests, 60);
    assert_eq!(r.connections_opened, 60);
    assert_eq!(r.body_bytes, 6000);
}

#[test]
fn open_loop_holds_the_rate() {
    let stub = stub();
    let mut cfg = config(stub.local_addr(), "length=100");
    cfg.rate = Some(200);
    cfg.max_requests = None;
    cfg.duration = Duration::from_millis(500);
    let r = run(&cfg);
    assert_eq!(r.mode, "open");
    assert_eq!(r.errors.total(), 0);
    // Exactly 100 requests are due in the window; those in flight at its end are drained.
    // One due in its last moments whose connection is still behind (a stall of the busy
    // machine) is counted unsent instead of sent late: every one is counted, once.
    assert_eq!(
        r.requests + r.unsent,
        100,
        "{} sent, {} unsent",
        r.requests,
        r.unsent
    );
    assert!(r.unsent <= 2, "{} unsent", r.unsent);
    assert_eq!(r.requests_per_sec, r.requests as f64 * 2.0);
}

#[test]
fn open_loop_charges_a_stall_to_latency() {
    // One connection at 100 req/s against a 50 ms origin: each request is due every 10 ms but
    // can only start when the previous one is done, so latency from the intended send time grows
    // far past 50 ms (a closed loop would report ~50 ms).
    let stub = stub();
    let mut cfg = config(stub.local_addr(), "delay=50");
    cfg.connections = 1;
    cfg.threads = 1;
    cfg.rate = Some(100);
    cfg.max_requests = None;
    cfg.duration = Duration::from_millis(600);
    let r = run(&cfg);
    assert!(r.requests >= 5, "{} requests", r.requests);
    assert!(r.latency_ms.max > 150.0, "max {} ms", r.latency_ms.max);
    assert!(r.latency_ms.min >= 50.0);
    // 60 requests were due; those the busy connection never got to are reported, not lost.
    assert_eq!(r.errors.total(), 0);
    assert_eq!(r.requests + r.unsent, 60);
    assert!(r.unsent > 0);
}

#[test]
fn warmup_is_not_counted() {
    let stub = stub();
    let mut cfg = config(stub.local_addr(), "length=10");
    cfg.max_requests = None;
    cfg.warmup = Duration::from_millis(200);
    cfg.duration = Duration::from_millis(300);
    let r = run(&cfg);
    assert!(r.all_ok());
    assert!((r.duration_secs - 0.3).abs() < 1e-6, "{}", r.duration_secs);
    assert!(r.requests > 0);
}

#[test]
fn requests_are_counted_after_the_warmup() {
    // Issue 26: `--requests N` with a warm-up used to spend the budget in the warm-up and
    // report 0 requests. Now the warm-up runs for its time and then exactly N are measured.
    let stub = stub();
    let mut cfg = config(stub.local_addr(), "length=10&delay=1");
    cfg.warmup = Duration::from_millis(200);
    cfg.max_requests = Some(100);
    let began = std::time::Instant::now();
    let r = run(&cfg);
    let wall = began.elapsed().as_secs_f64();
    assert_eq!((r.requests, r.ok), (100, 100));
    assert!(r.all_ok());
    assert!(check_report(&r, 0.0).is_ok());
    // The real elapsed time from the end of the warm-up to the last response: 100 requests of
    // at least 1 ms each on 4 connections take at least 25 ms, and far less than the 10 s cap.
    assert!(r.duration_secs >= 0.025, "{}", r.duration_secs);
    assert!(
        r.duration_secs < wall - 0.2 + 0.05,
        "{} vs wall {wall}",
        r.duration_secs
    );
    assert!((r.requests_per_sec - 100.0 / r.duration_secs).abs() < 1e-6);
}

#[test]
fn failures_fail_the_run() {
    let stub = stub();
    // All 5xx: fails at the default 1%, passes only when 100% failures are allowed.
    let r = run(&config(stub.local_addr(), "status=500&length=10"));
    let err = check_report(&r, 1.0).unwrap_err();
    assert!(err.contains("200 of 200 requests failed"), "{err}");
    assert!(check_report(&r, 100.0).is_ok());
    // Refused connections always fail, whatever the threshold.
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut cfg = config(addr, "");
    cfg.max_requests = Some(5);
    let r = run(&cfg);
    let err = check_report(&r, 100.0).unwrap_err();
    assert!(err.contains("5 connect error"), "{err}");
    // Nothing measured fails too (a warm-up longer than the run's window).
    let mut cfg = config(stub.local_addr(), "length=10");
    cfg.max_requests = None;
    cfg.warmup = Duration::from_millis(100);
    cfg.duration = Duration::ZERO;
    let r = run(&cfg);
    assert_eq!(r.requests, 0);
    assert!(check_report(&r, 100.0).is_err());
}

#[test]
fn server_errors_are_not_successes() {
    let stub = stub();
    let r = run(&config(stub.local_addr(), "status=500&length=10"));
    assert_eq!(r.requests, 200);
    assert_eq!(r.status.s5xx, 200);
    assert_eq!(r.ok, 0);
    assert_eq!(r.ok_per_sec, 0.0);
    assert!(!r.all_ok());
}

#[test]
fn timeouts_are_errors() {
    let stub = stub();
    let mut cfg = config(stub.local_addr(), "delay=2000");
    cfg.connections = 2;
    cfg.timeout = Duration::from_millis(100);
    cfg.max_requests = Some(4);
    let r = run(&cfg);
    assert_eq!(r.requests, 0);
    assert_eq!(r.errors.timeout, 4);
}

/// A server on its own thread that runs `serve` on every connection until dropped.
struct BadServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl BadServer {
    fn start(serve: fn(TcpStream)) -> BadServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        s.set_nonblocking(false).unwrap();
                        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                        serve(s);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        BadServer {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for BadServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read_request(s: &mut TcpStream) {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => buf.push(byte[0]),
            _ => return,
        }
    }
}

#[test]
fn closed_connections_are_read_errors() {
    // Reads the request, then closes without answering.
    let server = BadServer::start(|mut s| read_request(&mut s));
    let mut cfg = config(server.addr, "");
    cfg.max_requests = Some(20);
    let r = run(&cfg);
    assert_eq!(r.requests, 0);
    assert_eq!(r.errors.read, 20);
    assert_eq!(r.connections_opened, 20);

    // Sends half a body, then closes.
    let server = BadServer::start(|mut s| {
        read_request(&mut s);
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort");
    });
    let r = run(&LoadConfig {
        url: format!("http://{}/", server.addr),
        ..cfg.clone()
    });
    assert_eq!((r.requests, r.errors.read), (0, 20));
}

#[test]
fn garbage_is_a_parse_error() {
    let server = BadServer::start(|mut s| {
        read_request(&mut s);
        let _ = s.write_all(b"SSH-2.0-OpenSSH_9.6\r\n\r\n");
    });
    let mut cfg = config(server.addr, "");
    cfg.max_requests = Some(10);
    let r = run(&cfg);
    assert_eq!((r.requests, r.errors.parse), (0, 10));
}

#[test]
fn refused_connections_are_connect_errors() {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut cfg = config(addr, "");
    cfg.max_requests = Some(10);
    let r = run(&cfg);
    assert_eq!((r.requests, r.errors.connect), (0, 10));
    assert_eq!(r.connections_opened, 0);
    let why = r
        .first_connect_error
        .as_deref()
        .expect("the first failure's reason");
    assert!(why.contains("refused"), "{why}");
    let verdict = check_report(&r, 1.0).unwrap_err();
    assert!(verdict.contains(why), "{verdict}");
}

/// A TLS handshake that fails (here: the server does not speak TLS) is a connect error, and
/// the report says why.
#[test]
fn failed_tls_handshakes_are_connect_errors_with_the_reason() {
    let server = BadServer::start(|mut s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    });
    let dir = tempfile::tempdir().unwrap();
    let cert = keymaster_bench::load::tls::make_bench_cert(dir.path()).unwrap();
    let mut cfg = config(server.addr, "");
    cfg.url = format!("https://{}/", server.addr);
    cfg.tls_ca = Some(cert.ca);
    cfg.max_requests = Some(5);
    let r = run(&cfg);
    assert_eq!((r.requests, r.errors.connect), (0, 5));
    let why = r
        .first_connect_error
        .as_deref()
        .expect("the handshake's failure");
    assert!(!why.is_empty() && !why.contains("refused"), "{why}");
    assert!(format!("{r}").contains(why), "the text report shows it");
}

#[test]
fn http10_close_delimited_bodies() {
    let server = BadServer::start(|mut s| {
        read_request(&mut s);
        let _ = s.write_all(b"HTTP/1.0 200 OK\r\n\r\n0123456789");
    });
    let mut cfg = config(server.addr, "");
    cfg.max_requests = Some(10);
    let r = run(&cfg);
    assert!(r.all_ok(), "{r:?}");
    assert_eq!(
        (r.requests, r.body_bytes, r.connections_opened),
        (10, 100, 10)
    );
}

#[test]
fn report_prints_as_a_table() {
    let stub = stub();
    let mut cfg = config(stub.local_addr(), "length=10");
    cfg.max_requests = Some(20);
    let r = run(&cfg);
    let text = r.to_string();
    for needle in [
        "20 requests (20 ok)",
        "p99.9",
        "Socket errors: connect 0",
        "Generator CPU",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    #[cfg(target_os = "linux")]
    assert!(r.generator_cpu_secs > 0.0);
}
