//! The `keymaster` binary's command line: validate, --help/--version, and `proxy`.
mod support;
mod tls_support;
use std::process::{Command, Output};
use std::time::Duration;
use support::*;

fn keymaster(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keymaster"))
        .args(args)
        .output()
        .unwrap()
}

const BAD: &str = r#"[[listeners]]
name = "main"
address = "0.0.0.0:8080"
trusted_proxies = ["10.0.0.0/33"]

[[routes]]
name = "api"
cluster = "api-servers"
match = { path_prefix = "api", methods = ["get"] }
host_policy = "fixed"

[[clusters]]
name = "api"
servers = [{ address = "10.0.1.5", weight = 0 }]
"#;

#[test]
fn validate_accepts_a_good_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("good.toml");
    std::fs::write(&path, config_text("127.0.0.1:9".parse().unwrap(), "", "")).unwrap();
    let out = keymaster(&["validate", "--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}: ok\n", path.display())
    );
}

#[test]
fn validate_reports_every_problem_with_position_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, BAD).unwrap();
    let p = path.to_str().unwrap();
    let out = keymaster(&["validate", "--config", p]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    for expected in [
        format!("{p}:4:20: listeners[0].trusted_proxies[0]: "),
        format!("{p}:8:1: routes[0].cluster: unknown cluster \"api-servers\""),
        format!("{p}:9:11: routes[0].match.path_prefix: "),
        format!("{p}:9:43: routes[0].match.methods[0]: "),
        format!("{p}:10:1: routes[0].host_policy: "),
        format!("{p}:14:14: clusters[0].servers[0].address: "),
        format!("{p}:14:36: clusters[0].servers[0].weight: "),
    ] {
        assert!(
            err.lines().any(|l| l.starts_with(&expected)),
            "missing {expected:?} in:\n{err}"
        );
    }
    assert!(err.contains("7 problem(s) found"), "{err}");
}

/// A file whose rules hold but that `run` would refuse: `validate` finds what `run` would,
/// all of it: a Lua file with a syntax error, a declaration typo, a missing certificate and
/// an access log in a directory that does not exist.
#[test]
fn validate_checks_files_and_filters_as_run_would() {
    let dir = tempfile::tempdir().unwrap();
    let filters = dir.path().join("filters");
    std::fs::create_dir(&filters).unwrap();
    std::fs::write(
        filters.join("broken.lua"),
        "return { stage = 'pre', run = function() if then end }\n",
    )
    .unwrap();
    let path = dir.path().join("keymaster.toml");
    let text = config_text(
        "127.0.0.1:9".parse().unwrap(),
        "",
        "[lua]\ndir = \"filters\"\n\n[access_log]\nenabled = true\npath = \"no-such-dir/access.log\"\n",
    );
    let text = format!(
        "{text}\n[[listeners]]\nname = \"tls\"\naddress = \"127.0.0.1:0\"\ntls = {{ certificates = [{{ cert = \"missing.pem\", key = \"missing.key\" }}] }}\n"
    );
    std::fs::write(&path, &text).unwrap();
    let p = path.to_str().unwrap();
    let out = keymaster(&["validate", "--config", p]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    for expected in ["access_log.path", "missing.pem", "broken.lua:1:"] {
        assert!(
            err.lines()
                .any(|l| l.starts_with(p) && l.contains(expected)),
            "missing {expected:?} in:\n{err}"
        );
    }
    assert!(err.contains("3 problem(s) found"), "{err}");

    // The same Lua directory with a declaration typo instead.
    std::fs::write(
        filters.join("broken.lua"),
        "return { stage = 'pre', oder = 3, run = function() end }\n",
    )
    .unwrap();
    std::fs::write(
        &path,
        config_text(
            "127.0.0.1:9".parse().unwrap(),
            "",
            "[lua]\ndir = \"filters\"\n",
        ),
    )
    .unwrap();
    let out = keymaster(&["validate", "--config", p]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("`oder`"),
        "{out:?}"
    );
}

#[test]
fn validate_reports_a_syntax_error_and_a_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("syntax.toml");
    std::fs::write(&path, "[server]\nworkers = \n").unwrap();
    let p = path.to_str().unwrap();
    let out = keymaster(&["validate", "--config", p]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with(&format!("{p}:2:")), "{err}");

    let missing = dir.path().join("missing.toml");
    let out = keymaster(&["validate", "--config", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("missing.toml"),
        "{out:?}"
    );
}

#[test]
fn help_and_version() {
    let out = keymaster(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("keymaster {}\n", env!("CARGO_PKG_VERSION"))
    );
    let out = keymaster(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for sub in ["run", "validate", "proxy", "stub"] {
        assert!(help.contains(sub), "{help}");
    }
    for (sub, flag) in [
        ("run", "--config"),
        ("validate", "--config"),
        ("proxy", "--listen"),
        ("stub", "--listen"),
    ] {
        let out = keymaster(&[sub, "--help"]);
        assert_eq!(out.status.code(), Some(0), "{sub} --help");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Usage: keymaster"), "{sub}: {text}");
        assert!(text.contains(flag), "{sub}: {text}");
    }
    // Usage errors exit 2 (clap), not 0 or 1.
    assert_eq!(keymaster(&["validate"]).status.code(), Some(2));
    assert_eq!(keymaster(&["no-such-command"]).status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_subcommand_serves_requests() {
    let s = stub();
    let to = s.local_addr().to_string();
    let pki = tls_support::Pki::new();
    let cert = pki.issue("gw", &["gw.test"], "gw", false);
    let (cert_path, key_path) = (
        cert.cert_path.to_str().unwrap(),
        cert.key_path.to_str().unwrap(),
    );
    let mut p = spawn_keymaster([
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--to",
        &to,
        "--workers",
        "1",
        "--tls-listen",
        "127.0.0.1:0",
        "--tls-cert",
        cert_path,
        "--tls-key",
        key_path,
    ]);
    let r = get(p.addr(), "/?length=321").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, stub_body(321));
    assert_eq!(r.headers["via"], "1.1 keymaster");
    // The banner names each listener with its scheme, and the TLS one answers over TLS.
    let line = |name: &str| {
        p.banner
            .iter()
            .find(|l| l.contains(&format!("listener {name} ")))
    };
    assert!(
        line("main").is_some_and(|l| l.contains(" http://")),
        "{:?}",
        p.banner
    );
    assert!(
        line("tls").is_some_and(|l| l.contains(" https://")),
        "{:?}",
        p.banner
    );
    let tls_addr = p.listeners.iter().find(|(n, _)| n == "tls").unwrap().1;
    let cfg = tls_support::client_config(&pki, &tls_support::ClientOpts::default());
    let s = tls_support::connect(tls_addr, "gw.test", cfg)
        .await
        .expect("TLS handshake");
    let mut h1 = tls_support::H1::handshake(s)
        .await
        .expect("HTTP/1.1 over TLS");
    assert_eq!(h1.get("/?length=12", &[]).await.unwrap().status, 200);
    let pid = i32::try_from(p.child.id()).expect("pid fits");
    // SAFETY: kill(2) on our own child's pid with a valid signal number; no memory involved.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let mut exited = None;
    for _ in 0..250 {
        if let Some(st) = p.child.try_wait().unwrap() {
            exited = Some(st);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(exited.expect("exits on SIGTERM").success());
}

/// `proxy --no-reuse-port`: the listener is one socket (no `SO_REUSEPORT`, so no other
/// socket can join its address) that both workers serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_without_reuse_port_listens_on_one_socket() {
    let s = stub();
    let to = s.local_addr().to_string();
    let p = spawn_keymaster([
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--to",
        &to,
        "--workers",
        "2",
        "--no-reuse-port",
    ]);
    for _ in 0..8 {
        assert_eq!(get(p.addr(), "/?length=5").await.status, 200);
    }
    let joiner = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    joiner.set_reuse_port(true).unwrap();
    let err = joiner
        .bind(&p.addr().into())
        .expect_err("the one socket has no SO_REUSEPORT");
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
}

/// Logs to a pipe (journald, `docker logs`, a file) are plain text: no colour codes, with
/// or without `NO_COLOR`.
#[test]
fn logs_to_a_pipe_are_plain_text() {
    for no_color in [false, true] {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_keymaster"));
        cmd.args(["proxy", "--listen", "127.0.0.1:0", "--to", "127.0.0.1:9"])
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        if no_color {
            cmd.env("NO_COLOR", "1");
        }
        let mut child = cmd.spawn().expect("spawn keymaster");
        let mut stderr = PipeLines::new(child.stderr.take().expect("piped stderr"));
        // Start-up logs at INFO; wait for that line (not for a time) before stopping it.
        let info = stderr.wait_for(Duration::from_secs(10), |l| l.contains("INFO"));
        let _ = child.kill();
        let _ = child.wait();
        stderr.until_closed(Duration::from_secs(5));
        let err = stderr.lines.join("\n");
        assert!(info.is_some(), "something was logged: {err}");
        assert!(!err.contains('\u{1b}'), "no escape codes: {err:?}");
    }
}
