//! Every starter config in `examples/` runs as it is: each is started with the real gateway
//! (its listener and admin addresses moved to free ports, its origins replaced by local
//! ones at the addresses it names) and answers a request through its route.
mod lua_support;
mod support;

use lua_support::*;
use std::path::{Path, PathBuf};
use support::*;

/// The example configs, by file name.
fn examples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("examples/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    out.sort();
    out
}

/// `text` with its fixed ports moved: the listener and admin to free ones, the origins on
/// 8081 and 8082 to `origins`, and a relative Lua directory made absolute.
fn localise(text: &str, origins: [std::net::SocketAddr; 2], dir: &Path) -> String {
    text.replace("127.0.0.1:8080", "127.0.0.1:0")
        .replace("127.0.0.1:9901", "127.0.0.1:0")
        .replace("127.0.0.1:8081", &origins[0].to_string())
        .replace("127.0.0.1:8082", &origins[1].to_string())
        .replace(
            "dir = \"filters\"",
            &format!("dir = \"{}\"", dir.join("filters").display()),
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_config_starts_and_proxies() {
    let (a, b) = (echo_origin("a").await, echo_origin("b").await);
    let files = examples();
    assert!(files.len() >= 4, "examples found: {files:?}");
    for file in files {
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .expect("name")
            .to_string();
        let text = std::fs::read_to_string(&file).expect("read example");
        let dir = file.parent().expect("examples/");
        let g = try_start(&localise(&text, [a.addr, b.addr], dir))
            .unwrap_or_else(|e| panic!("{name} does not start: {e}"));
        let r = get(g.addr, "/hello").await;
        assert_eq!(r.status, 200, "{name}: {}", body(&r));
        assert!(
            body(&r).starts_with("GET /hello"),
            "{name}: the origin answered: {}",
            body(&r)
        );
        match name.as_str() {
            "edge-filters.toml" => {
                assert_eq!(header(&r, "x-served-by"), Some("keymaster"), "{name}");
            }
            "lua.toml" => {
                assert_eq!(header(&r, "x-lua-post"), Some("default"), "{name}");
                let r = get(g.addr, "/private/x").await;
                assert_eq!(r.status, 401, "{name}: the api_key filter");
            }
            _ => {}
        }
        tokio::task::spawn_blocking(move || g.shutdown())
            .await
            .expect("shutdown");
    }
}
