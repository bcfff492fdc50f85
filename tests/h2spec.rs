//! HTTP/2 conformance: h2spec (github.com/summerwind/h2spec) against the real gateway's inbound
//! h2 listeners — cleartext prior knowledge (`protocol = "h2c"` and `"auto"`) and TLS with
//! ALPN h2 — and every case must pass, in h2spec's strict mode.
//!
//! h2spec is found through `$H2SPEC`, `PATH`, `$GOBIN`, `$GOPATH/bin` or `~/go/bin` (`.ci/run`
//! installs it); when none is there the test installs it with `go install` into the target
//! directory. An h2spec that can be neither found nor installed FAILS the test; set
//! `KEYMASTER_SKIP_H2SPEC=1` to skip it (a message says so).
mod support;
mod tls_support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use support::*;
use tls_support::*;

fn h2spec_binary() -> Option<PathBuf> {
    let exists = |p: PathBuf| p.is_file().then_some(p);
    if let Some(p) = std::env::var_os("H2SPEC").map(PathBuf::from) {
        return exists(p);
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(p) = std::env::var_os("GOBIN") {
        dirs.push(p.into());
    }
    if let Some(p) = std::env::var_os("GOPATH") {
        dirs.push(PathBuf::from(p).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join("go/bin"));
    }
    dirs.into_iter().find_map(|d| exists(d.join("h2spec")))
}

/// A fresh machine (the README's `cargo test --workspace`) may not have h2spec yet: install it
/// once with Go (present on the build machines; the Go module proxy is reachable) into this
/// target directory, as `.ci/run` does into `~/go/bin`.
fn install_h2spec() -> Option<PathBuf> {
    static INSTALLED: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let gobin = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tools");
            let bin = gobin.join("h2spec");
            if bin.is_file() {
                return Some(bin);
            }
            let go = ["go", "/usr/local/go/bin/go"]
                .into_iter()
                .find(|g| Command::new(g).arg("version").output().is_ok())?;
            eprintln!("h2spec not found: installing it with `go install` into {gobin:?}");
            for version in ["v2.2.1+incompatible", "latest"] {
                let ok = Command::new(go)
                    .arg("install")
                    .arg(format!("github.com/summerwind/h2spec/cmd/h2spec@{version}"))
                    .env("GOBIN", &gobin)
                    .status()
                    .is_ok_and(|s| s.success());
                if ok && bin.is_file() {
                    return Some(bin);
                }
            }
            None
        })
        .clone()
}

/// The h2spec binary, or `None` when the run is told to skip (missing h2spec panics).
fn h2spec_or_skip() -> Option<PathBuf> {
    if std::env::var("KEYMASTER_SKIP_H2SPEC").as_deref() == Ok("1") {
        eprintln!("SKIPPED: KEYMASTER_SKIP_H2SPEC=1 is set; h2spec conformance not checked");
        return None;
    }
    match h2spec_binary().or_else(install_h2spec) {
        Some(p) => Some(p),
        None => panic!(
            "h2spec not found (PATH, $H2SPEC, $GOBIN, $GOPATH/bin, ~/go/bin). Install it with \
             `go install github.com/summerwind/h2spec/cmd/h2spec@latest` (.ci/run does), or set \
             KEYMASTER_SKIP_H2SPEC=1 to skip this test knowingly"
        ),
    }
}

/// Run h2spec against `addr`; panic with its report unless every case passed except those
/// whose description is in `allowed` (each must then be the one that failed).
async fn run_h2spec(bin: PathBuf, addr: SocketAddr, tls: bool, what: &str, allowed: &[&str]) {
    let what = what.to_string();
    let out = tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(bin);
        // -S: strict mode, the cases h2spec skips by default included.
        let port = addr.port().to_string();
        cmd.args(["-S", "-h", "127.0.0.1", "-p", &port, "-o", "5"]);
        if tls {
            cmd.args(["-t", "-k"]);
        }
        cmd.output().expect("run h2spec")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout
        .lines()
        .rev()
        .find(|l| l.contains(" tests, "))
        .unwrap_or_else(|| panic!("{what}: no h2spec summary\n{stdout}"))
        .to_string();
    // "146 tests, 146 passed, 0 skipped, 0 failed"
    let count = |label: &str| -> u32 {
        summary
            .split(", ")
            .find_map(|p| p.trim().strip_suffix(label))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{what}: unreadable summary {summary:?}"))
    };
    let (total, passed, failed) = (count(" tests"), count(" passed"), count(" failed"));
    eprintln!("{what}: {summary}");
    assert!(total > 100, "{what}: h2spec ran too few cases\n{stdout}");
    let failures: Vec<&str> = stdout
        .split_once("Failures:")
        .map(|(_, f)| {
            f.lines()
                .filter_map(|l| l.trim().strip_prefix("× "))
                .collect()
        })
        .unwrap_or_default();
    let unexpected: Vec<&&str> = failures
        .iter()
        .filter(|f| !allowed.iter().any(|a| f.ends_with(a)))
        .collect();
    assert!(
        unexpected.is_empty() && failures.len() as u32 == failed && passed + failed == total,
        "{what}: h2spec failures {unexpected:?}\n{stdout}"
    );
    if allowed.is_empty() {
        assert!(out.status.success(), "{what}: h2spec exit status\n{stdout}");
    }
}

/// An origin that reads each request body to its end, then waits 50 ms before answering.
/// h2spec's stream-level cases (bad trailers, WINDOW_UPDATE overflow) then always meet the
/// stream's error before the response closes it: an origin that answers at once lets a
/// loaded machine finish the stream first. The 1000-byte body is long enough for the
/// flow-control cases (a short one makes h2spec skip).
async fn body_reading_origin() -> SocketAddr {
    use http_body_util::{BodyExt, Full};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        let body = req.into_body().collect().await;
                        // A short pause keeps the stream open for h2spec's stream-level cases
                        // (WINDOW_UPDATE overflow, bad trailers) that follow a complete request.
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        let status = if body.is_ok() { 200 } else { 400 };
                        let resp = http::Response::builder()
                            .status(status)
                            .body(Full::new(bytes::Bytes::from(vec![b'x'; 1000])))
                            .unwrap();
                        Ok::<_, std::convert::Infallible>(resp)
                    },
                );
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2spec_passes_on_cleartext_h2_listeners() {
    let Some(bin) = h2spec_or_skip() else { return };
    let origin = body_reading_origin().await;
    let extra = r#"protocol = "h2c"

[[listeners]]
name = "auto"
address = "127.0.0.1:0"
protocol = "auto"
"#;
    let g = start_gateway(&config_text(origin, extra, ""));
    run_h2spec(bin.clone(), g.addr, false, "h2c listener", &[]).await;
    let auto = g.gateway().listener_addr("auto").expect("auto listener");
    // An "auto" listener serves HTTP/1.1 to anything that is not the h2 preface, so h2spec's
    // "invalid connection preface" bytes are an HTTP/1.1 request that gets a 400 (h2spec
    // wants a silent close). Every HTTP/2 case proper must pass.
    let preface = "Sends invalid connection preface";
    run_h2spec(bin, auto, false, "auto listener", &[preface]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2spec_passes_on_tls_alpn_h2_listener() {
    let Some(bin) = h2spec_or_skip() else { return };
    let pki = Pki::new();
    let cert = pki.issue("gw", &["localhost"], "localhost", false);
    let origin = body_reading_origin().await;
    let g = start_gateway(&config_text(origin, &tls_keys(&[&cert], ""), ""));
    run_h2spec(bin, g.addr, true, "TLS listener (ALPN h2)", &[]).await;
}
