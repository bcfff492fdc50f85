//! Hot reload of Lua filter sets: under keep-alive load with the set swapped repeatedly,
//! every response shows one version from its first filter to its last (pre and post stamps
//! match, and a file present only in even versions shows up exactly with those); the
//! directory watcher picks up added, changed and removed files; admin `POST /reload`
//! rebuilds the Lua set too.
mod lua_support;
mod support;

use lua_support::*;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::*;

/// Write version `v` of the set: `v_in` (pre) and `v_out` (post) stamp `v`; even versions
/// have `v_even` (post) too, odd ones do not.
fn write_version(dir: &Path, v: u32) {
    write(
        dir,
        "v_in.lua",
        &format!(
            "return {{ stage = 'pre', run = function(ctx) ctx:set_header('x-v', '{v}') ctx:set_meta('v', '{v}') end }}\n"
        ),
    );
    write(
        dir,
        "v_out.lua",
        &format!(
            "return {{ stage = 'post', run = function(ctx) ctx:set_response_header('x-v-out', '{v}') ctx:set_response_header('x-v-meta', ctx:meta('v') or '-') end }}\n"
        ),
    );
    let even = dir.join("v_even.lua");
    if v % 2 == 0 {
        write(
            dir,
            "v_even.lua",
            &format!("return {{ stage = 'post', order = 5, run = function(ctx) ctx:set_response_header('x-even', '{v}') end }}\n"),
        );
    } else if even.exists() {
        std::fs::remove_file(even).expect("remove v_even.lua");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_runs_one_version_while_sets_swap_under_load() {
    let (origin, canary) = (echo_origin("main").await, echo_origin("canary").await);
    let dir = filters_dir(false, &[]);
    write_version(dir.path(), 1);
    let toml = lua_config(origin.addr, canary.addr, dir.path(), "watch = false");
    let g = Arc::new(start(&toml));

    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicUsize::new(0));
    const MAX_REQUESTS: usize = 4000;
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (addr, stop, total) = (g.addr, stop.clone(), total.clone());
        clients.push(tokio::spawn(async move {
            let mut c = Client::connect(addr).await;
            let mut seen = std::collections::BTreeSet::new();
            while !stop.load(Ordering::Acquire)
                && total.fetch_add(1, Ordering::AcqRel) < MAX_REQUESTS
            {
                let r = c.get("/load").await;
                assert_eq!(r.status, 200);
                let out: u32 = header(&r, "x-v-out").expect("post stamp").parse().unwrap();
                let b = body(&r).to_ascii_lowercase();
                assert!(
                    b.contains(&format!("\r\nx-v: {out}\r\n")),
                    "pre stamp != post stamp {out}: {b}"
                );
                assert_eq!(header(&r, "x-v-meta"), Some(out.to_string().as_str()));
                match header(&r, "x-even") {
                    Some(e) => assert!(
                        out % 2 == 0 && e == out.to_string(),
                        "x-even {e} in version {out}"
                    ),
                    None => assert!(out % 2 == 1, "even version {out} lacks its third filter"),
                }
                seen.insert(out);
            }
            seen
        }));
    }
    // Swap sets repeatedly while the clients run (the files, then an explicit reload).
    // Keep swapping until the clients have sent thousands of requests (bounded).
    let (g2, d, t2) = (g.clone(), dir.path().to_path_buf(), total.clone());
    let reloads = tokio::task::spawn_blocking(move || {
        let (mut v, end) = (1, std::time::Instant::now() + Duration::from_secs(120));
        while t2.load(Ordering::Acquire) < 2000 && std::time::Instant::now() < end {
            v += 1;
            write_version(&d, v);
            g2.gateway()
                .reload_from_source()
                .expect("valid set reloads");
            std::thread::sleep(Duration::from_millis(2));
        }
        v
    });
    let last = reloads.await.expect("reloads");
    stop.store(true, Ordering::Release);
    let mut versions = std::collections::BTreeSet::new();
    for c in clients {
        versions.extend(c.await.expect("client task"));
    }
    assert!(
        total.load(Ordering::Acquire) >= 2000,
        "thousands of requests ran"
    );
    assert!(
        versions.len() >= 2,
        "responses spanned several versions: {versions:?}"
    );
    let r = get(g.addr, "/final").await;
    assert_eq!(header(&r, "x-v-out"), Some(last.to_string().as_str()));
    assert_eq!(header(&r, "x-even").is_some(), last % 2 == 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_reloads_added_changed_and_removed_files() {
    let (origin, canary) = (echo_origin("main").await, echo_origin("canary").await);
    let dir = filters_dir(false, &[]);
    let toml = lua_config(
        origin.addr,
        canary.addr,
        dir.path(),
        "poll_interval = \"20ms\"",
    );
    let g = start(&toml);
    let v0 = g.gateway().version();
    assert_eq!(header(&get(g.addr, "/").await, "x-w"), None);

    let stamp = |v: &str| {
        format!("return {{ stage = 'post', run = function(ctx) ctx:set_response_header('x-w', '{v}') end }}\n")
    };
    let probe = |want: Option<&'static str>| {
        let addr = g.addr;
        async move {
            for _ in 0..500 {
                if header(&get(addr, "/").await, "x-w") == want {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            false
        }
    };
    write(dir.path(), "w.lua", &stamp("a"));
    assert!(probe(Some("a")).await, "added file picked up");
    write(dir.path(), "w.lua", &stamp("bb"));
    assert!(probe(Some("bb")).await, "changed file picked up");
    // A broken edit is rejected and the running set stays; fixing it is picked up.
    write(dir.path(), "w.lua", "return {");
    let v_before = g.gateway().version();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        g.gateway().version(),
        v_before,
        "a broken file is not swapped in"
    );
    assert_eq!(header(&get(g.addr, "/").await, "x-w"), Some("bb"));
    std::fs::remove_file(dir.path().join("w.lua")).unwrap();
    assert!(probe(None).await, "removed file's filter is gone");
    assert!(g.gateway().version() > v0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_reload_rebuilds_the_lua_set() {
    let (origin, canary) = (echo_origin("main").await, echo_origin("canary").await);
    let dir = filters_dir(false, &[]);
    let stamp = |v: &str| {
        format!("return {{ stage = 'post', run = function(ctx) ctx:set_response_header('x-w', '{v}') end }}\n")
    };
    write(dir.path(), "w.lua", &stamp("one"));
    let g = start(&lua_config(
        origin.addr,
        canary.addr,
        dir.path(),
        "watch = false",
    ));
    assert_eq!(header(&get(g.addr, "/").await, "x-w"), Some("one"));
    write(dir.path(), "w.lua", &stamp("two"));
    let mut c = Client::connect(g.admin).await;
    let req = http::Request::post("/reload")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let r = c.send(req).await;
    assert_eq!(r.status, 200, "{}", body(&r));
    assert_eq!(header(&get(g.addr, "/").await, "x-w"), Some("two"));

    write(
        dir.path(),
        "w.lua",
        "return { stage = 'post', run = function(ctx)\n  ctx:x(\nend }\n",
    );
    let req = http::Request::post("/reload")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let r = c.send(req).await;
    assert_eq!(r.status, 422);
    assert!(
        body(&r).contains("w.lua:3:"),
        "file:line in the admin answer: {}",
        body(&r)
    );
    assert_eq!(header(&get(g.addr, "/").await, "x-w"), Some("two"));
}

/// The binary wires the Lua host: `keymaster run` loads `[lua] dir`, and SIGHUP rebuilds
/// the set (the watcher is off here, so only the signal can have done it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_loads_lua_filters_and_sighup_reloads_them() {
    let (origin, canary) = (echo_origin("main").await, echo_origin("canary").await);
    let dir = filters_dir(false, &[]);
    let stamp = |v: &str| {
        format!("return {{ stage = 'post', run = function(ctx) ctx:set_response_header('x-w', '{v}') end }}\n")
    };
    write(dir.path(), "w.lua", &stamp("one"));
    let toml = lua_config(origin.addr, canary.addr, dir.path(), "watch = false");
    let cfg_dir = tempfile::tempdir().unwrap();
    let path = cfg_dir.path().join("keymaster.toml");
    std::fs::write(&path, toml).unwrap();
    let p = spawn_keymaster([
        std::ffi::OsStr::new("run"),
        "--config".as_ref(),
        path.as_os_str(),
    ]);
    let addr = p.addr();
    assert_eq!(header(&get(addr, "/").await, "x-w"), Some("one"));
    write(dir.path(), "w.lua", &stamp("two"));
    let pid = i32::try_from(p.child.id()).expect("pid fits");
    // SAFETY: kill(2) on our own child's pid with a valid signal number; no memory involved.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    let mut seen = None;
    for _ in 0..250 {
        seen = header(&get(addr, "/").await, "x-w").map(str::to_string);
        if seen.as_deref() == Some("two") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen.as_deref(), Some("two"), "SIGHUP rebuilt the Lua set");
}
