//! Graceful shutdown: in-flight requests finish, new connections are refused, idle
//! keep-alive connections close, /ready reports draining, and the drain deadline holds.
//! Also the binary: SIGTERM drains and exits 0, SIGHUP reloads the config file.
mod support;
use std::time::{Duration, Instant};
use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

async fn wait_for_upstream_requests(g: &TestGateway, n: f64) {
    assert!(
        eventually(Duration::from_secs(3), || upstream_requests(g) >= n).await,
        "origin never saw request {n}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_in_flight_and_refuses_new_connections() {
    let (g, _s) = gateway_with_stub();
    let addr = g.addr;
    let admin = g.admin;
    // An idle keep-alive connection that has served one request.
    let mut idle = Client::connect(addr).await;
    assert_eq!(idle.get("/?length=1").await.status, 200);
    let mut idle_raw = TcpStream::connect(addr).await.unwrap();
    idle_raw
        .write_all(b"GET /?length=1 HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    // A slow request in flight.
    let inflight = tokio::spawn(async move { get(addr, "/?length=777&delay=500").await });
    wait_for_upstream_requests(&g, 3.0).await;
    let _ = read_for(&mut idle_raw, Duration::from_millis(100)).await;

    let t0 = Instant::now();
    let stopper = tokio::task::spawn_blocking(move || g.shutdown());

    // Draining: /ready says so while the slow request is still running.
    let mut ready = None;
    for _ in 0..50 {
        if let Ok(Some(r)) =
            tokio::time::timeout(Duration::from_millis(200), try_get(admin, "/ready")).await
        {
            if r.status == 503 {
                ready = Some((r.status, t0.elapsed()));
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, at) = ready.expect("/ready never answered 503 while draining");
    assert_eq!(status, 503);
    assert!(
        at < Duration::from_millis(450),
        "/ready turned 503 only after {at:?}"
    );

    // New connections are refused.
    assert!(
        eventually(Duration::from_secs(1), || std::net::TcpStream::connect(
            addr
        )
        .is_err())
        .await,
        "listener still accepts during drain"
    );
    // Idle keep-alive connections are closed.
    let (_, closed) = read_until_close(&mut idle_raw, Duration::from_secs(2)).await;
    assert!(closed, "idle keep-alive connection was not closed");

    // The in-flight request completes.
    let r = inflight.await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, stub_body(777));
    tokio::time::timeout(Duration::from_secs(3), stopper)
        .await
        .expect("shutdown returns after the drain")
        .unwrap();
    drop(idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_deadline_bounds_shutdown() {
    let s = stub();
    let toml = config_text(s.local_addr(), "", "")
        .replace("drain_timeout = \"5s\"", "drain_timeout = \"300ms\"")
        .replace(
            "response_header_timeout = \"5s\"",
            "response_header_timeout = \"30s\"",
        );
    let g = start_gateway(&toml);
    let addr = g.addr;
    let slow = tokio::spawn(async move {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /?delay=5000 HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        read_until_close(&mut c, Duration::from_secs(10)).await
    });
    wait_for_upstream_requests(&g, 1.0).await;
    let t0 = Instant::now();
    tokio::task::spawn_blocking(move || g.shutdown())
        .await
        .unwrap();
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(1200),
        "shutdown took {took:?}"
    );
    // The abandoned client is disconnected, not left hanging.
    let (got, closed) = tokio::time::timeout(Duration::from_secs(2), slow)
        .await
        .expect("client released")
        .unwrap();
    assert!(closed);
    assert!(status_of(&got) != Some(200));
}

// --- The binary ---

/// A config file with the "tagged" route; the listener and admin bind ephemeral ports (the
/// test reads them from the binary's banner).
fn file_config(origin: std::net::SocketAddr, header: &str) -> String {
    config_text(
        origin,
        "",
        &format!(
            r#"[[routes]]
name = "tagged"
cluster = "origin"
match = {{ path_prefix = "/" }}
response_headers = {{ set = {{ "x-config" = "{header}" }} }}
"#
        ),
    )
}

fn spawn_binary(path: &std::path::Path) -> Spawned {
    spawn_keymaster([
        std::ffi::OsStr::new("run"),
        "--config".as_ref(),
        path.as_os_str(),
    ])
}

async fn wait_exit(p: &mut Spawned, limit: Duration) -> Option<std::process::ExitStatus> {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if let Some(st) = p.child.try_wait().unwrap() {
            return Some(st);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

fn signal(p: &Spawned, sig: i32) {
    let pid = i32::try_from(p.child.id()).expect("pid fits");
    // SAFETY: kill(2) on our own child's pid with a valid signal number; no memory involved.
    unsafe { libc::kill(pid, sig) };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_sigterm_drains_in_flight_and_exits_zero() {
    let s = stub();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keymaster.toml");
    std::fs::write(&path, file_config(s.local_addr(), "one")).unwrap();
    let mut p = spawn_binary(&path);
    let (addr, admin) = (p.addr(), p.admin.expect("admin listener"));
    let inflight = tokio::spawn(async move { get(addr, "/?length=99&delay=500").await });
    // Wait until the slow request has reached the origin.
    let mut forwarded = false;
    for _ in 0..100 {
        if let Some(m) = try_get(admin, "/metrics").await {
            let text = String::from_utf8_lossy(&m.body).to_string();
            if metric(
                &text,
                "keymaster_upstream_requests_total{cluster=\"origin\"}",
            ) >= 1.0
            {
                forwarded = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(forwarded, "slow request never reached the origin");
    signal(&p, libc::SIGTERM);
    let r = tokio::time::timeout(Duration::from_secs(3), inflight)
        .await
        .expect("in-flight request finished")
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, stub_body(99));
    assert_eq!(r.headers["x-config"], "one");
    let st = wait_exit(&mut p, Duration::from_secs(5))
        .await
        .expect("process exits after SIGTERM");
    assert!(st.success(), "exit status {st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_sighup_reloads_the_config_file() {
    let s = stub();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keymaster.toml");
    std::fs::write(&path, file_config(s.local_addr(), "one")).unwrap();
    let mut p = spawn_binary(&path);
    let addr = p.addr();
    assert_eq!(get(addr, "/").await.headers["x-config"], "one");
    // Listener addresses are fixed at start: the reloaded file may say ":0" again.
    std::fs::write(&path, file_config(s.local_addr(), "two")).unwrap();
    signal(&p, libc::SIGHUP);
    let mut seen = String::new();
    for _ in 0..100 {
        seen = get(addr, "/").await.headers["x-config"]
            .to_str()
            .unwrap()
            .to_string();
        if seen == "two" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen, "two");
    // A broken file on SIGHUP keeps the running config and the process.
    std::fs::write(&path, "[[routes]]\nname = 1\n").unwrap();
    signal(&p, libc::SIGHUP);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        p.child.try_wait().unwrap().is_none(),
        "process died on a bad reload"
    );
    assert_eq!(get(addr, "/").await.headers["x-config"], "two");
    signal(&p, libc::SIGTERM);
    let st = wait_exit(&mut p, Duration::from_secs(5))
        .await
        .expect("exits");
    assert!(st.success());
}

/// The lines in `path` once it has at least `n` (bounded wait: 10 s).
async fn lines_of(path: &std::path::Path, n: usize) -> Vec<String> {
    let mut lines = Vec::new();
    eventually(Duration::from_secs(10), || {
        let t = std::fs::read_to_string(path).unwrap_or_default();
        lines = t.lines().map(str::to_string).collect();
        lines.len() >= n
    })
    .await;
    lines
}

/// logrotate's way: the access log is renamed, SIGUSR1 makes the gateway open a new file at
/// the configured path; the renamed file keeps what was written before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_sigusr1_reopens_the_access_log() {
    let s = stub();
    let dir = tempfile::tempdir().unwrap();
    let (path, log, rotated) = (
        dir.path().join("keymaster.toml"),
        dir.path().join("access.log"),
        dir.path().join("access.log.1"),
    );
    let text = file_config(s.local_addr(), "one")
        + &format!(
            "\n[access_log]\nenabled = true\npath = \"{}\"\n",
            log.display()
        );
    std::fs::write(&path, text).unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_keymaster"));
    cmd.arg("run")
        .arg("--config")
        .arg(&path)
        .stderr(std::process::Stdio::piped());
    let mut p = spawn_keymaster_command(cmd);
    let mut stderr = PipeLines::new(p.child.stderr.take().expect("piped stderr"));
    let addr = p.addr();
    assert_eq!(get(addr, "/before").await.status, 200);
    assert_eq!(lines_of(&log, 1).await.len(), 1, "the first line");
    std::fs::rename(&log, &rotated).unwrap();
    signal(&p, libc::SIGUSR1);
    // The signal is taken on the main thread, which asks the writer to reopen before its next
    // line and then says so: from that line on, the next request's line goes to a new file.
    let said = stderr.wait_for(Duration::from_secs(10), |l| {
        l.contains("SIGUSR1: reopening the access log")
    });
    assert!(said.is_some(), "no reopen logged: {:?}", stderr.lines);
    assert_eq!(get(addr, "/after").await.status, 200);
    let new = lines_of(&log, 1).await;
    assert_eq!(new.len(), 1, "a new file at the configured path: {new:?}");
    assert!(new[0].contains("/after"), "{new:?}");
    let old = lines_of(&rotated, 1).await;
    assert_eq!(old.len(), 1, "{old:?}");
    assert!(old[0].contains("/before"), "{old:?}");
    assert!(p.child.try_wait().unwrap().is_none(), "still running");
    signal(&p, libc::SIGTERM);
    let st = wait_exit(&mut p, Duration::from_secs(5))
        .await
        .expect("exits");
    assert!(st.success());
}
