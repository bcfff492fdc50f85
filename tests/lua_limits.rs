//! Lua that cannot be turned against its worker (issue 21): a client-chosen header cannot
//! stall the worker through pattern backtracking; loops building huge strings are stopped
//! by the instruction budget or the call's clock; the shared dictionary keeps to its byte
//! budget; `ctx.http` cannot reach the admin listener unless allowed.
//!
//! Time bounds are generous (seconds where the fixed gateway takes milliseconds): what they
//! tell apart is a stall of seconds to hours on a gateway without these limits.
mod lua_support;
mod support;

use bytes::Bytes;
use http_body_util::Full;
use lua_support::*;
use std::time::{Duration, Instant};
use support::*;

/// An error filter that shows which filter failed and why.
const SHOW_FAILURE: &str = r#"
return {
  stage = "error",
  run = function(ctx)
    local f = ctx:failure()
    ctx:respond(503, { ["x-failed"] = f.filter, ["x-failure"] = f.message }, "failed\n")
  end,
}
"#;

/// The attacker's finding: a filter matching a request header with a backtracking pattern.
const PROBE: &str = r#"
return {
  stage = "pre",
  match = { path_prefix = "/probe" },
  run = function(ctx)
    local v = ctx:header("x-probe")
    if v and v:find("a.-b.-c.-d") then ctx:set_header("x-matched", "1") end
  end,
}
"#;

/// A config with one worker, `files` (plus the failure page) as the filters and `lua_keys`.
fn config(origin: std::net::SocketAddr, dir: &std::path::Path, lua_keys: &str) -> String {
    config_text(
        origin,
        "max_header_bytes = \"128KiB\"",
        &format!("[lua]\ndir = \"{}\"\n{lua_keys}\n", dir.display()),
    )
}

fn get_with(path: &str, name: &str, value: String) -> http::Request<Full<Bytes>> {
    http::Request::get(path)
        .header(name, value)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn failure(r: &Reply) -> &str {
    header(r, "x-failure").unwrap_or("-")
}

/// A header of `abc` repeated (900 bytes, then 64 KiB) against `a.-b.-c.-d`: LuaJIT's C
/// matcher backtracks for seconds (hours for 64 KiB) while every request on the worker
/// waits. Here the match is charged to the budget: the probe fails (the error filter
/// answers), and requests sent meanwhile on the same, only, worker are answered promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_chosen_header_cannot_stall_the_worker() {
    let origin = echo_origin("main").await;
    let dir = filters_dir(false, &[("probe.lua", PROBE), ("show.lua", SHOW_FAILURE)]);
    let g = start(&config(origin.addr, dir.path(), ""));
    assert_eq!(get(g.addr, "/warm").await.status, 200);
    for n in [300, 21_846] {
        let addr = g.addr;
        let probe = tokio::spawn(async move {
            let start = Instant::now();
            let req = get_with("/probe/x", "x-probe", "abc".repeat(n));
            let r = Client::connect(addr).await.send(req).await;
            (r, start.elapsed())
        });
        let mut c = Client::connect(g.addr).await;
        let mut i = 0;
        while i < 20 || !probe.is_finished() {
            let start = Instant::now();
            let r = tokio::time::timeout(Duration::from_secs(60), c.get(&format!("/other/{i}")))
                .await
                .expect("an ordinary request is answered");
            let took = start.elapsed();
            assert_eq!(r.status, 200);
            assert!(
                took < Duration::from_millis(1500),
                "request {i} waited {took:?} behind the probe of {n} x abc"
            );
            i += 1;
        }
        let (r, took) = probe.await.expect("probe task");
        assert_eq!(r.status, 503, "{}", body(&r));
        assert_eq!(header(&r, "x-failed"), Some("probe"));
        // The budget stops it (the clock too, when the machine is busy enough).
        let why = failure(&r);
        assert!(
            why.contains("instruction budget exceeded") || why.contains("call time limit"),
            "{why}"
        );
        assert!(took < Duration::from_secs(5), "the probe took {took:?}");
    }
    assert_eq!(filter_metric(&g, "errors", "probe"), 2.0);
    // An ordinary value matches as before.
    let r = Client::connect(g.addr)
        .await
        .send(get_with("/probe/y", "x-probe", "xxabcd".into()))
        .await;
    assert_eq!(r.status, 200);
    assert!(
        body(&r).to_ascii_lowercase().contains("x-matched: 1"),
        "{}",
        body(&r)
    );
}

const BUILDERS: &str = r#"
return {
  stage = "pre",
  match = { path_prefix = "/build" },
  run = function(ctx)
    local s = string.rep("x", 2^20)
    if ctx:path() == "/build/rep" then
      while true do local t = s:rep(2) end
    elseif ctx:path() == "/build/concat" then
      while true do local t = s .. s end
    end
  end,
}
"#;

/// Loops building megabytes per instruction: `string.rep` is charged for the bytes it
/// builds (the default budget stops it within a few calls); the `..` operator's copying is
/// not seen by the count hook, but the call's clock (1 s here) stops it. Without either,
/// each loop holds its worker for many minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loops_building_huge_strings_are_stopped() {
    let origin = echo_origin("main").await;
    let dir = filters_dir(
        false,
        &[("build.lua", BUILDERS), ("show.lua", SHOW_FAILURE)],
    );
    let keys = "max_call_time = \"1s\"";
    let g = start(&config(origin.addr, dir.path(), keys));
    for (path, why) in [
        ("/build/rep", "instruction budget exceeded"),
        ("/build/concat", "call time limit exceeded"),
    ] {
        let start = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(20), get(g.addr, path))
            .await
            .expect("the loop is stopped");
        assert_eq!(r.status, 503, "{path}: {}", body(&r));
        assert!(failure(&r).contains(why), "{path}: {}", failure(&r));
        assert!(start.elapsed() < Duration::from_secs(10), "{path}");
    }
    assert_eq!(
        get(g.addr, "/after").await.status,
        200,
        "the worker serves again"
    );
}

const STORE: &str = r#"
return {
  stage = "pre",
  match = { path_prefix = "/store" },
  run = function(ctx)
    local p, v = ctx:path(), nil
    local ok, err, forcible
    if p == "/store/fill" then
      -- safe_set a 30000-byte value under 1000 keys: each shard has room for one.
      v = string.rep("x", 30000)
      local stored = 0
      for i = 1, 1000 do
        ok, err = shared.safe_set("k" .. i, v)
        if ok then stored = stored + 1 end
      end
      ok = stored
    elseif p == "/store/set" then
      ok, err, forcible = shared.set("fresh", string.rep("y", 30000))
    elseif p == "/store/big" then
      ok, err, forcible = shared.set("big", string.rep("z", 32 * 1024 + 1))
    else
      ok, err, forcible = shared.set(p, string.rep("m", 1000000))
    end
    ctx:respond(200, { ["x-ok"] = tostring(ok), ["x-err"] = tostring(err),
      ["x-forcible"] = tostring(forcible) }, "")
  end,
}
"#;

fn said<'a>(r: &'a Reply, what: &str) -> &'a str {
    header(r, what).unwrap_or("?")
}

/// A 1 MiB dictionary with 32 KiB values: `safe_set` stores one value per shard and then
/// answers "no memory"; `set` evicts (forcible); an over-size value is refused; the
/// dictionary's bytes stay within its budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_dictionary_keeps_to_its_budget() {
    let origin = echo_origin("main").await;
    let dir = filters_dir(false, &[("store.lua", STORE)]);
    let keys = "instruction_budget = 100000000\nmax_call_time = \"10s\"\n\
                shared_dict_size = \"1MiB\"\nshared_max_value = \"32KiB\"";
    let (g, lua) = start_with_host(&config(origin.addr, dir.path(), keys));
    let r = get(g.addr, "/store/fill").await;
    let stored: usize = said(&r, "x-ok").parse().expect("a count");
    assert!((1..=32).contains(&stored), "{stored} stored");
    assert_eq!(said(&r, "x-err"), "no memory");
    assert_eq!(lua.dict().stats().evictions, 0, "safe_set evicts nothing");
    let r = get(g.addr, "/store/set").await;
    assert_eq!(
        (said(&r, "x-ok"), said(&r, "x-err"), said(&r, "x-forcible")),
        ("true", "nil", "true"),
        "set evicts to make room"
    );
    let r = get(g.addr, "/store/big").await;
    assert_eq!((said(&r, "x-ok"), said(&r, "x-err")), ("nil", "no memory"));
    let st = lua.dict().stats();
    assert_eq!(st.capacity, 1 << 20);
    assert!(st.bytes <= st.capacity && st.entries <= 32, "{st:?}");
    assert_eq!(st.evictions, 1);
}

/// The attacker's second finding: ten 1 MB values took the process from 23 MB to 557 MB.
/// With the default 64 MiB budget, a hundred of them keep the dictionary within it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_large_values_stay_within_the_default_budget() {
    let origin = echo_origin("main").await;
    let dir = filters_dir(false, &[("store.lua", STORE)]);
    let (g, lua) = start_with_host(&config(origin.addr, dir.path(), ""));
    let mut c = Client::connect(g.addr).await;
    let mut forced = 0;
    for i in 0..100 {
        let r = c.get(&format!("/store/m{i}")).await;
        assert_eq!(said(&r, "x-ok"), "true", "{i}");
        forced += usize::from(said(&r, "x-forcible") == "true");
    }
    let st = lua.dict().stats();
    assert_eq!(st.capacity, 64 << 20);
    assert!(st.bytes <= st.capacity, "{st:?}");
    assert!(st.entries < 100 && st.evictions >= 36, "{st:?}");
    assert!(forced >= 36, "{forced}");
}

const ADMIN_PROBE: &str = r#"
return {
  stage = "pre",
  match = { path_prefix = "/reach" },
  run = function(ctx)
    local r, err = ctx.http.get("http://" .. ctx:header("x-target") .. "/ready")
    ctx:respond(200, { ["x-status"] = r and tostring(r.status) or "-",
      ["x-err"] = err or "-" }, "")
  end,
}
"#;

async fn reach(g: &TestGateway, target: String) -> Reply {
    Client::connect(g.addr)
        .await
        .send(get_with("/reach", "x-target", target))
        .await
}

/// `ctx.http` gets an error value for the admin listener (by IP or by a name resolving to
/// it), while other services on the same host are reached; `http_allow_admin` lifts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctx_http_cannot_reach_the_admin_listener() {
    let origin = echo_origin("main").await;
    let other = head_echo_origin().await;
    let dir = filters_dir(false, &[("reach.lua", ADMIN_PROBE)]);
    let g = start(&config(origin.addr, dir.path(), ""));
    let port = g.admin.port();
    for target in [g.admin.to_string(), format!("localhost:{port}")] {
        let r = reach(&g, target.clone()).await;
        assert_eq!(said(&r, "x-status"), "-", "{target}");
        assert!(
            said(&r, "x-err").contains("admin listener"),
            "{target}: {}",
            said(&r, "x-err")
        );
    }
    let r = reach(&g, other.addr.to_string()).await;
    assert_eq!(said(&r, "x-status"), "200", "{}", said(&r, "x-err"));

    let allowed = start(&config(origin.addr, dir.path(), "http_allow_admin = true"));
    let r = reach(&allowed, allowed.admin.to_string()).await;
    assert_eq!(said(&r, "x-status"), "200", "{}", said(&r, "x-err"));
}
