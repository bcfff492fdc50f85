//! Helpers for the Lua filter tests: filter directories (the shipped examples plus
//! test-specific files), echo origins, and a gateway started with the Lua host wired in
//! exactly as the binary does it (`keymaster::start_gateway`).
#![allow(dead_code)]

use crate::support::*;
use std::net::SocketAddr;
use std::path::Path;
use tokio::io::AsyncWriteExt;

/// An origin answering every request with its request head as the body and `x-origin: tag`.
pub async fn echo_origin(tag: &'static str) -> RawOrigin {
    raw_origin(move |mut s, _| async move {
        let mut carry = Vec::new();
        while let Some(head) = read_head(&mut s, &mut carry).await {
            let resp = format!(
                "HTTP/1.1 200 OK\r\nx-origin: {tag}\r\nContent-Length: {}\r\n\r\n{head}",
                head.len()
            );
            if s.write_all(resp.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await
}

/// A temporary filters directory with the shipped examples (if `examples`) and `files`.
pub fn filters_dir(examples: bool, files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    if examples {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/filters");
        for e in std::fs::read_dir(src).expect("examples/filters") {
            let p = e.expect("entry").path();
            std::fs::copy(&p, dir.path().join(p.file_name().expect("name"))).expect("copy");
        }
    }
    for (name, text) in files {
        write(dir.path(), name, text);
    }
    dir
}

pub fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).expect("write filter file");
}

/// A test config: `origin` as cluster "origin" (default route), `canary` as cluster
/// "canary", and `[lua]` on `dir` with `lua_keys` appended.
pub fn lua_config(origin: SocketAddr, canary: SocketAddr, dir: &Path, lua_keys: &str) -> String {
    config_text(
        origin,
        "",
        &format!(
            r#"
[lua]
dir = "{}"
{lua_keys}

[[clusters]]
name = "canary"
servers = [{{ address = "{canary}" }}]
"#,
            dir.display()
        ),
    )
}

/// Start a gateway with the Lua host, as `keymaster run` does.
pub fn try_start(toml: &str) -> Result<TestGateway, String> {
    let config = keymaster_config::load_str(toml, "<test>").map_err(|e| e.to_string())?;
    let (gw, _lua) = keymaster::start_gateway(config, ConfigSource::Memory)?;
    let addr = gw.listener_addr("main").expect("listener main");
    let admin = gw.admin_addr().expect("admin listener");
    Ok(TestGateway {
        gw: Some(gw),
        addr,
        admin,
    })
}

/// [`start`], keeping the Lua host (its shared dictionary).
pub fn start_with_host(toml: &str) -> (TestGateway, keymaster_lua::LuaFilters) {
    let config = keymaster_config::load_str(toml, "<test>").unwrap_or_else(|e| panic!("{e}"));
    let (gw, lua) = keymaster::start_gateway(config, ConfigSource::Memory)
        .unwrap_or_else(|e| panic!("gateway starts: {e}"));
    let addr = gw.listener_addr("main").expect("listener main");
    let admin = gw.admin_addr().expect("admin listener");
    let g = TestGateway {
        gw: Some(gw),
        addr,
        admin,
    };
    (g, lua)
}

pub fn start(toml: &str) -> TestGateway {
    try_start(toml).unwrap_or_else(|e| panic!("gateway starts: {e}"))
}

pub fn header<'a>(r: &'a Reply, name: &str) -> Option<&'a str> {
    r.headers.get(name).and_then(|v| v.to_str().ok())
}

pub fn body(r: &Reply) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// A filter's counter from the metrics text (`keymaster_filter_<what>_total{filter="name"}`).
pub fn filter_metric(g: &TestGateway, what: &str, name: &str) -> f64 {
    metric(
        &g.gateway().metrics_text(),
        &format!("keymaster_filter_{what}_total{{filter=\"{name}\"}}"),
    )
}
