//! Running out of file descriptors: `keymaster` runs as a child process with a low
//! `RLIMIT_NOFILE` (set in `pre_exec`, so only the child is starved), and the test holds more
//! client connections open than it allows.

mod support;

use std::os::unix::process::CommandExt;
use std::time::Duration;
use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// The child's descriptor limit, soft and hard (so raising the soft one at start cannot
/// lift it).
const NOFILE: libc::rlim_t = 96;
/// Client connections held open: well past the limit.
const CLIENTS: usize = 160;

fn config(origin: std::net::SocketAddr) -> String {
    config_text(origin, "", "")
        + r#"health_check = { path = "/", interval = "50ms", timeout = "1s", healthy_threshold = 1000, unhealthy_threshold = 1 }
outlier_detection = { consecutive_failures = 1, base_ejection = "60s" }
"#
}

fn spawn_limited(path: &std::path::Path) -> Spawned {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_keymaster"));
    cmd.arg("run").arg("--config").arg(path);
    limit(&mut cmd, NOFILE, NOFILE);
    spawn_keymaster_command(cmd)
}

/// Start `cmd` with `RLIMIT_NOFILE` = (`soft`, `hard`).
fn limit(cmd: &mut std::process::Command, soft: libc::rlim_t, hard: libc::rlim_t) {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: the closure runs in the forked child before exec and only calls setrlimit(2),
    // which is async-signal-safe, on a stack value it owns; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

/// The soft limit of `pid` as `/proc/<pid>/limits` shows it.
fn soft_nofile(pid: u32) -> u64 {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

/// At start the soft limit is raised to the hard one and both are logged; a config whose
/// listeners alone may hold more connections than that gets a warning.
#[test]
fn the_soft_limit_is_raised_to_the_hard_one_and_a_short_budget_is_warned_about() {
    let origin = stub();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keymaster.toml");
    // max_connections (65 536 by default) is far above the hard limit of 4 096.
    std::fs::write(&path, config_text(origin.local_addr(), "", "")).unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_keymaster"));
    cmd.arg("run").arg("--config").arg(&path);
    cmd.env("RUST_LOG", "keymaster_gateway=info");
    cmd.stderr(std::process::Stdio::piped());
    limit(&mut cmd, NOFILE, 4096);
    let mut p = spawn_keymaster_command(cmd);
    assert_eq!(soft_nofile(p.child.id()), 4096, "soft limit raised");
    let _ = p.child.kill();
    let _ = p.child.wait();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut p.child.stderr.take().unwrap(), &mut err).unwrap();
    let err = strip_ansi(&err);
    assert!(
        err.contains("descriptor limit") && err.contains("soft=4096") && err.contains("hard=4096"),
        "{err}"
    );
    assert!(err.contains("can exceed the descriptor limit"), "{err}");
}

/// With a descriptor limit of `NOFILE`: the budget is that less the reserve (64, and 3 for
/// the one worker with one listener), of which clients may fill seven eighths.
fn budget_of(nofile: usize) -> (usize, usize) {
    let limit = nofile - 67;
    (limit, limit / 8 * 7)
}

/// Twice as many clients as the budget lets in, each asking for a slow response and
/// closing: past the clients' share they wait in the backlog, past the budget their
/// requests wait for origin connections; none is failed, every one is answered, and the
/// process never runs out of descriptors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_budget_clients_and_requests_wait_and_every_one_is_served() {
    const LIMIT: libc::rlim_t = 160;
    let (_, clients_max) = budget_of(LIMIT as usize);
    let clients = 2 * clients_max;
    let origin = stub();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keymaster.toml");
    std::fs::write(&path, config(origin.local_addr())).unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_keymaster"));
    cmd.arg("run").arg("--config").arg(&path);
    limit(&mut cmd, LIMIT, LIMIT);
    let p = spawn_keymaster_command(cmd);
    let (addr, admin) = (p.addr(), p.admin.expect("admin listener"));
    // All connect at once (the kernel completes the handshakes: backlog), then all ask.
    let mut conns = Vec::new();
    for _ in 0..clients {
        conns.push(TcpStream::connect(addr).await.expect("handshake"));
    }
    let asks = conns.into_iter().map(|mut s| {
        tokio::spawn(async move {
            s.write_all(b"GET /?delay=100 HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
                .await
                .unwrap();
            let (got, closed) = read_until_close(&mut s, Duration::from_secs(20)).await;
            (String::from_utf8_lossy(&got).into_owned(), closed)
        })
    });
    let mut statuses = std::collections::BTreeMap::new();
    for a in asks.collect::<Vec<_>>() {
        let (got, closed) = a.await.unwrap();
        assert!(closed, "answered and closed: {got}");
        let status = got.lines().next().unwrap_or("(nothing)").to_string();
        *statuses.entry(status).or_insert(0) += 1;
    }
    assert_eq!(
        statuses.get("HTTP/1.1 200 OK"),
        Some(&clients),
        "every client answered 200: {statuses:?}"
    );
    waited_and_never_ran_out(admin, LIMIT).await;
}

/// Accepts and requests both waited for descriptors (counted), none ran out, and the
/// process stayed under its `limit`.
async fn waited_and_never_ran_out(admin: std::net::SocketAddr, limit: libc::rlim_t) {
    let m = String::from_utf8_lossy(&get(admin, "/metrics").await.body).into_owned();
    for op in ["accept", "connect"] {
        let waits = format!(r#"keymaster_descriptor_waits_total{{op="{op}"}}"#);
        let exhausted = format!(r#"keymaster_descriptors_exhausted_total{{op="{op}"}}"#);
        assert!(metric(&m, &waits) >= 1.0, "{waits}: {m}");
        assert_eq!(metric(&m, &exhausted), 0.0, "{exhausted}: {m}");
    }
    assert!(metric(&m, "process_open_fds") < limit as f64, "{m}");
}

/// Keep-alive clients, which never leave to make room: the first ones ask without pause,
/// so that their origin connections take what the clients leave free and are never idle;
/// clients that come later, still under the clients' share, are let in all the same (the
/// origin connections past their share are closed between requests). Then every client
/// asks at once and all are served through the origin connections' share, queued first
/// come, first served, within the connect timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_keep_alive_clients_get_in_while_origin_connections_are_busy() {
    const LIMIT: libc::rlim_t = 160;
    let (budget, clients_max) = budget_of(LIMIT as usize);
    let first = clients_max * 3 / 4;
    let origin = stub();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keymaster.toml");
    std::fs::write(&path, config_text(origin.local_addr(), "", "")).unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_keymaster"));
    cmd.arg("run").arg("--config").arg(&path);
    limit(&mut cmd, LIMIT, LIMIT);
    let p = spawn_keymaster_command(cmd);
    let (addr, admin) = (p.addr(), p.admin.expect("admin listener"));
    let origins = || async move {
        let m = String::from_utf8_lossy(&get(admin, "/metrics").await.body).into_owned();
        metric(&m, r#"keymaster_upstream_connections{cluster="origin"}"#) as usize
    };
    // The first clients ask in a loop until told to stop.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut busy = Vec::new();
    for _ in 0..first {
        let mut c = Client::connect(addr).await;
        let stop = stop.clone();
        busy.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                statuses.push(c.get("/?delay=20").await.status);
            }
            (c, statuses)
        }));
    }
    let mut seen = 0;
    for _ in 0..100 {
        seen = origins().await;
        if seen > budget - clients_max {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        seen > budget - clients_max,
        "origin connections took more than their share ({seen}): what the test is about"
    );
    // Later clients up to the clients' share, while the first keep asking.
    let late = (first..clients_max).map(|_| {
        tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let status = tokio::time::timeout(Duration::from_secs(5), c.get("/?delay=20"))
                .await
                .map_or(0, |r| r.status);
            (c, status)
        })
    });
    let mut clients = Vec::new();
    let mut late_statuses = Vec::new();
    for l in late.collect::<Vec<_>>() {
        let (c, status) = l.await.unwrap();
        clients.push(c);
        late_statuses.push(status);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for b in busy {
        let (c, statuses) = b.await.unwrap();
        assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
        clients.push(c);
    }
    assert!(
        late_statuses.iter().all(|s| *s == 200),
        "late clients let in and served while the others kept asking: {late_statuses:?}"
    );
    // Every client asks at once: the origin connections' share serves them all in turn.
    let asks = clients.into_iter().map(|mut c| {
        tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(10), c.get("/?delay=50"))
                .await
                .map_or(0, |r| r.status)
        })
    });
    let mut statuses = Vec::new();
    for a in asks.collect::<Vec<_>>() {
        statuses.push(a.await.unwrap());
    }
    assert_eq!(statuses.len(), clients_max);
    assert!(
        statuses.iter().all(|s| *s == 200),
        "all served: {statuses:?}"
    );
    waited_and_never_ran_out(admin, LIMIT).await;
}

/// Descriptors run out all the same (here: admin connections, which the budget does not
/// count, take the last ones): a request on an accepted connection that cannot get an
/// origin connection is a 503 `local_descriptors_exhausted`, not a 502; the healthy origin
/// is neither ejected nor marked down; once the descriptors are free, service resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_is_a_503_that_blames_no_origin() {
    let origin = stub();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keymaster.toml");
    let text = config(origin.local_addr()).replace(
        "[admin]\n",
        "[admin]\nmax_connections = 1000\nheader_read_timeout = \"60s\"\n",
    );
    std::fs::write(&path, text).unwrap();
    let p = spawn_limited(&path);
    let (addr, admin) = (p.addr(), p.admin.expect("admin listener"));
    // No request before: an idle pooled origin connection would serve one client.
    // Clients up to their share of the budget are accepted; the others wait.
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(TcpStream::connect(addr).await.expect("handshake"));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Admin connections take every descriptor left.
    let mut hogs = Vec::new();
    for _ in 0..CLIENTS {
        hogs.push(TcpStream::connect(admin).await.expect("handshake"));
    }
    // Long enough for the accepts and several health-check rounds (50 ms apart).
    tokio::time::sleep(Duration::from_millis(600)).await;
    let asks = clients.into_iter().map(|mut s| {
        tokio::spawn(async move {
            s.write_all(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
                .await
                .unwrap();
            let got = read_for(&mut s, Duration::from_millis(1500)).await;
            (got, s)
        })
    });
    let mut answered = Vec::new();
    let mut held = Vec::new();
    for a in asks.collect::<Vec<_>>() {
        let (got, s) = a.await.unwrap();
        held.push(s);
        if !got.is_empty() {
            answered.push(String::from_utf8_lossy(&got).into_owned());
        }
    }
    let (_, clients_max) = budget_of(NOFILE as usize);
    assert!(!answered.is_empty(), "some clients were accepted");
    assert!(answered.len() <= clients_max, "at most the clients' share");
    for a in &answered {
        assert!(
            a.starts_with("HTTP/1.1 503") && a.contains("out of file descriptors"),
            "an accepted client gets the descriptors 503: {a}"
        );
    }
    drop(held);
    drop(hogs);

    // Descriptors are free again: the admin API and the listener serve.
    // (Within 30 s: a loaded 2-core machine is slow to hand the freed descriptors back.)
    let mut m = None;
    for _ in 0..400 {
        m = try_get(admin, "/metrics").await;
        if m.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(75)).await;
    }
    let m = String::from_utf8_lossy(&m.expect("metrics after the flood").body).into_owned();
    let waits = metric(&m, r#"keymaster_descriptor_waits_total{op="accept"}"#);
    let connect = metric(&m, r#"keymaster_descriptors_exhausted_total{op="connect"}"#);
    assert!(waits >= 1.0, "accepting paused at the clients' share: {m}");
    assert!(
        connect >= answered.len() as f64,
        "connect EMFILE counted: {m}"
    );
    assert!(
        metric(
            &m,
            r#"keymaster_errors_total{category="local_descriptors_exhausted",side="internal"}"#
        ) >= answered.len() as f64,
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            r#"keymaster_errors_total{category="origin_connectivity""#
        ),
        0.0
    );
    assert_eq!(
        metric(
            &m,
            r#"keymaster_upstream_ejections_total{cluster="origin"}"#
        ),
        0.0,
        "no ejection: {m}"
    );
    assert!(
        m.lines()
            .any(|l| l.starts_with("keymaster_upstream_server_healthy{") && l.ends_with(" 1")),
        "the origin is still up: {m}"
    );
    let mut ok = false;
    for _ in 0..50 {
        if try_get(addr, "/").await.map(|r| r.status) == Some(200) {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok, "service resumes once descriptors are free");
}

/// `text` without ANSI colour sequences (`ESC [ ... m`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
