//! Lua filters (issue 4): the shipped examples as a pre/route/post chain with a
//! short-circuit; the error stage for failing `run` and `should_filter`; the sandbox (no
//! `os`, `io`, `require`, `load`, `debug`); the instruction budget stopping runaway scripts
//! (also ones that swallow the error with `pcall`); the memory cap; the shared dictionary;
//! `ctx.http` suspending only its own request; compile errors naming file and line.
mod lua_support;
mod support;
mod tls_support;

use lua_support::*;
use std::time::Duration;
use support::*;
use tokio::io::AsyncWriteExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_chain_runs_pre_route_post_and_short_circuits() {
    let (origin, canary) = (echo_origin("main").await, echo_origin("canary").await);
    let dir = filters_dir(true, &[]);
    let g = start(&lua_config(origin.addr, canary.addr, dir.path(), ""));

    let r = get(g.addr, "/hello").await;
    assert_eq!(r.status, 200);
    assert_eq!(header(&r, "x-origin"), Some("main"));
    assert!(
        body(&r).to_ascii_lowercase().contains("x-lua: 1"),
        "pre filter header reached the origin: {}",
        body(&r)
    );
    assert!(
        body(&r).to_ascii_lowercase().contains("x-hits: "),
        "counter header: {}",
        body(&r)
    );
    assert_eq!(
        header(&r, "x-lua-post"),
        Some("default"),
        "post filter saw meta from pre"
    );

    // Route filter: a canary request goes to the other cluster.
    let mut c = Client::connect(g.addr).await;
    let req = http::Request::get("/hello")
        .header("x-canary", "1")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let r = c.send(req).await;
    assert_eq!(header(&r, "x-origin"), Some("canary"));

    // Short-circuit: the pre filter answers 401; the proxy stage is skipped, post still runs.
    let r = get(g.addr, "/private/x").await;
    assert_eq!(r.status, 401);
    assert_eq!(header(&r, "www-authenticate"), Some("ApiKey"));
    // api_key (order 5) answered before add_header (order 10) ran: no meta, but post ran.
    assert_eq!(header(&r, "x-lua-post"), Some("-"));
    assert_eq!(body(&r), "missing or wrong api key\n");
    let req = http::Request::get("/private/x")
        .header("x-api-key", "let-me-in")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let r = Client::connect(g.addr).await.send(req).await;
    assert_eq!(r.status, 200);
    assert!(body(&r).starts_with("GET /private/x"), "reached the origin");
    assert!(filter_metric(&g, "invocations", "api_key") >= 2.0);
    assert!(
        filter_metric(&g, "skips", "choose_cluster") >= 1.0,
        "declarative match skips"
    );
}

const FAILING: &str = r#"
return {
  stage = "pre",
  order = 1,
  match = { path_prefix = "/fail" },
  run = function(ctx)
    if ctx:path() == "/fail/run" then error("boom") end
  end,
}
"#;

const FAILING_SHOULD: &str = r#"
return {
  stage = "pre",
  order = 2,
  match = { path_prefix = "/fail/should" },
  should_filter = function(ctx) return ctx:nope() end,
  run = function(ctx) end,
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_filters_run_the_error_stage_and_are_counted() {
    let (origin, canary) = (echo_origin("main").await, echo_origin("canary").await);
    let dir = filters_dir(
        true,
        &[
            ("failing.lua", FAILING),
            ("failing_should.lua", FAILING_SHOULD),
        ],
    );
    let g = start(&lua_config(origin.addr, canary.addr, dir.path(), ""));

    let r = get(g.addr, "/fail/run").await;
    assert_eq!(r.status, 503, "error_page.lua answers: {}", body(&r));
    assert_eq!(
        body(&r),
        "{\"error\":\"filter_failed\",\"filter\":\"failing\"}\n"
    );
    assert!(
        !body(&r).contains("boom"),
        "the Lua message never reaches the client"
    );
    assert_eq!(
        header(&r, "x-lua-post"),
        Some("-"),
        "post filters still run"
    );
    assert_eq!(filter_metric(&g, "errors", "failing"), 1.0);

    let r = get(g.addr, "/fail/should").await;
    assert_eq!(r.status, 503);
    assert!(
        body(&r).contains("\"filter\":\"failing_should\""),
        "{}",
        body(&r)
    );
    assert_eq!(filter_metric(&g, "errors", "failing_should"), 1.0);

    // The gateway keeps serving.
    assert_eq!(get(g.addr, "/ok").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_error_filter_a_lua_failure_is_a_500() {
    let (origin, canary) = (echo_origin("main").await, echo_origin("canary").await);
    let dir = filters_dir(false, &[("failing.lua", FAILING)]);
    let g = start(&lua_config(origin.addr, canary.addr, dir.path(), ""));
    let r = get(g.addr, "/fail/run").await;
    assert_eq!(r.status, 500);
    assert_eq!(get(g.addr, "/fine").await.status, 200);
}

const SANDBOX: &str = r#"
return {
  stage = "pre",
  run = function(ctx)
    local seen = {}
    for _, k in ipairs({"os", "io", "debug", "require", "dofile", "loadfile", "load",
        "loadstring", "package", "ffi", "jit", "getfenv", "setfenv", "collectgarbage",
        "coroutine"}) do
      if _G ~= nil or getfenv ~= nil then seen[#seen + 1] = "_G/getfenv" end
      local v = rawget(getmetatable(_ENV or {}) or {}, k)
      if v ~= nil then seen[#seen + 1] = k end
    end
    if os ~= nil then seen[#seen + 1] = "os" end
    if io ~= nil then seen[#seen + 1] = "io" end
    if require ~= nil then seen[#seen + 1] = "require" end
    if load ~= nil or loadstring ~= nil or dofile ~= nil then seen[#seen + 1] = "load" end
    if debug ~= nil then seen[#seen + 1] = "debug" end
    if string.dump ~= nil or ("").dump ~= nil then seen[#seen + 1] = "string.dump" end
    ctx:set_meta("seen", #seen == 0 and "none" or table.concat(seen, ","))
    if ctx:path() == "/os" then os.execute("true") end
    if ctx:path() == "/io" then io.open("/etc/passwd") end
    if ctx:path() == "/computed-client" then
      -- This file never names the client, so it runs as a plain call that cannot suspend:
      -- reaching the client by a computed name fails the filter instead of blocking.
      ctx["ht" .. "tp"].get("ht" .. "tp://127.0.0.1:9/")
    end
    if ctx:path() == "/string-mt" then
      local mt = getmetatable("")
      mt.__index.upper = nil
    end
  end,
}
"#;

const SANDBOX_POST: &str = r#"
return {
  stage = "post",
  run = function(ctx) ctx:set_response_header("x-seen", ctx:meta("seen") or "?") end,
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_refuses_os_io_and_loaders() {
    let (origin, canary) = (echo_origin("main").await, echo_origin("canary").await);
    let dir = filters_dir(
        false,
        &[("sandbox.lua", SANDBOX), ("sandbox_post.lua", SANDBOX_POST)],
    );
    let g = start(&lua_config(origin.addr, canary.addr, dir.path(), ""));
    let r = get(g.addr, "/plain").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        header(&r, "x-seen"),
        Some("none"),
        "no unsafe global is reachable"
    );
    for path in ["/os", "/io", "/string-mt", "/computed-client"] {
        let r = get(g.addr, path).await;
        assert_eq!(r.status, 500, "{path} fails the filter");
    }
    assert_eq!(filter_metric(&g, "errors", "sandbox"), 4.0);
    assert_eq!(get(g.addr, "/plain").await.status, 200);
}

const CTX_USE: &str = r#"
return {
  stage = "pre",
  match = { path_prefix = "/ctx" },
  should_filter = function(ctx)
    if ctx:path() == "/ctx/write-in-should" then ctx:set_header("x-a", "1") end
    return true
  end,
  run = function(ctx)
    local p = ctx:path()
    if p == "/ctx/keep" then kept = ctx ctx:set_header("x-kept", "yes") return end
    if p == "/ctx/use-kept" then ctx:set_header("x-via-kept", kept:path()) return end
    if p == "/ctx/dot" then ctx.set_header("x-a", "1") end
    if p == "/ctx/bad-name" then ctx:set_header("bad name", 1) end
    if p == "/ctx/number" then ctx:set_header("x-number", 42) end
  end,
}
"#;

/// `ctx` reaches only the request of the call running now: a `ctx` kept in a global and
/// used by a later request reads that later request. It is read-only in `should_filter`,
/// its methods need the colon, and bad header names fail the filter (each a 500).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctx_reaches_only_the_running_calls_request() {
    let (origin, canary) = (echo_origin("main").await, echo_origin("canary").await);
    let dir = filters_dir(false, &[("ctxuse.lua", CTX_USE)]);
    let g = start(&lua_config(origin.addr, canary.addr, dir.path(), ""));
    let r = get(g.addr, "/ctx/keep").await;
    assert_eq!(r.status, 200);
    assert!(
        body(&r).to_ascii_lowercase().contains("x-kept: yes"),
        "{}",
        body(&r)
    );
    let r = get(g.addr, "/ctx/use-kept").await;
    assert_eq!(r.status, 200);
    assert!(
        body(&r)
            .to_ascii_lowercase()
            .contains("x-via-kept: /ctx/use-kept"),
        "a kept ctx reads the running request: {}",
        body(&r)
    );
    let r = get(g.addr, "/ctx/number").await;
    assert!(
        body(&r).to_ascii_lowercase().contains("x-number: 42"),
        "{}",
        body(&r)
    );
    for path in ["/ctx/write-in-should", "/ctx/dot", "/ctx/bad-name"] {
        let r = get(g.addr, path).await;
        assert_eq!(r.status, 500, "{path} fails the filter");
    }
    assert_eq!(filter_metric(&g, "errors", "ctxuse"), 3.0);
}

const VALUES: &str = r#"
return {
  stage = "pre",
  match = { path_prefix = "/values" },
  run = function(ctx)
    local p = ctx:path()
    if p == "/values/case" then
      ctx:set_header("X-Mixed-Case", "a")
      ctx:add_header("x-mixed-case", "b")
    elseif p == "/values/bad" then
      ctx:set_header("x-ok", "line\nbreak")
    else
      ctx:set_header("x-echo", p .. "!") -- a string made by this call
    end
  end,
}
"#;

const MESSAGE: &str = r#"
return {
  stage = "error",
  run = function(ctx) ctx:respond(500, { ["x-message"] = ctx:failure().message }, "") end,
}
"#;

/// The `ctx` methods on plain values: names in any case, values made per call (never a
/// value parsed for an earlier call), and errors naming the script's file and line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctx_methods_take_names_in_any_case_and_fresh_values() {
    let (origin, canary) = (echo_origin("main").await, echo_origin("canary").await);
    let dir = filters_dir(false, &[("values.lua", VALUES), ("message.lua", MESSAGE)]);
    let g = start(&lua_config(origin.addr, canary.addr, dir.path(), ""));
    let mut c = Client::connect(g.addr).await;
    let r = c.get("/values/case").await;
    let seen = body(&r).to_ascii_lowercase();
    assert!(seen.contains("x-mixed-case: a\r\n"), "{seen}");
    assert!(seen.contains("x-mixed-case: b\r\n"), "{seen}");
    for i in 0..50 {
        let path = format!("/values/echo/{i}");
        let r = c.get(&path).await;
        assert!(
            body(&r).contains(&format!("x-echo: {path}!\r\n")),
            "request {i}: {}",
            body(&r)
        );
    }
    let r = c.get("/values/bad").await;
    assert_eq!(r.status, 500);
    let message = header(&r, "x-message").unwrap_or("");
    assert!(
        message.contains("values.lua:") && message.contains("invalid header value"),
        "{message}"
    );
}

const RUNAWAY: &str = r#"
return {
  stage = "pre",
  match = { path_prefix = "/spin" },
  run = function(ctx)
    if ctx:path() == "/spin/pcall" then
      -- Swallowing the budget error must not let the script go on.
      while true do pcall(function() while true do end end) end
    end
    local i = 0
    while true do i = i + 1 end
  end,
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_script_is_stopped_by_the_instruction_budget() {
    let (origin, canary) = (echo_origin("main").await, echo_origin("canary").await);
    let dir = filters_dir(true, &[("runaway.lua", RUNAWAY)]);
    let g = start(&lua_config(
        origin.addr,
        canary.addr,
        dir.path(),
        "instruction_budget = 100000",
    ));
    for path in ["/spin", "/spin/pcall"] {
        let r = tokio::time::timeout(Duration::from_secs(20), get(g.addr, path))
            .await
            .expect("the runaway script is stopped");
        assert_eq!(r.status, 503, "{path}: error stage answers");
        assert!(body(&r).contains("\"filter\":\"runaway\""));
    }
    assert_eq!(filter_metric(&g, "errors", "runaway"), 2.0);
    let r = get(g.addr, "/after").await;
    assert_eq!(r.status, 200, "the worker is free again");
}

const HOG: &str = r#"
return {
  stage = "pre",
  match = { path_prefix = "/hog" },
  run = function(ctx)
    keep = {}
    for i = 1, 10000000 do keep[i] = string.rep("x", 64) .. i end
  end,
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_cap_fails_the_call_and_the_vm_recovers() {
    let (origin, canary) = (echo_origin("main").await, echo_origin("canary").await);
    let dir = filters_dir(true, &[("hog.lua", HOG)]);
    let keys = "instruction_budget = 1000000000\nmemory_limit = \"8MiB\"";
    let g = start(&lua_config(origin.addr, canary.addr, dir.path(), keys));
    let r = tokio::time::timeout(Duration::from_secs(60), get(g.addr, "/hog"))
        .await
        .expect("the hog is stopped");
    assert_eq!(r.status, 503);
    assert_eq!(filter_metric(&g, "errors", "hog"), 1.0);
    for _ in 0..3 {
        let r = get(g.addr, "/fine").await;
        assert_eq!(r.status, 200, "a rebuilt VM serves: {}", body(&r));
        assert_eq!(header(&r, "x-lua-post"), Some("default"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_dictionary_counts_across_requests() {
    let (origin, canary) = (echo_origin("main").await, echo_origin("canary").await);
    let dir = filters_dir(true, &[]);
    let g = start(&lua_config(origin.addr, canary.addr, dir.path(), ""));
    let mut c = Client::connect(g.addr).await;
    for n in 1..=3 {
        let r = c.get("/count").await;
        assert!(
            body(&r)
                .to_ascii_lowercase()
                .contains(&format!("x-hits: {n}\r\n")),
            "request {n}: {}",
            body(&r)
        );
    }
}

fn lookup_filter(service: std::net::SocketAddr) -> String {
    format!(
        r#"
return {{
  stage = "pre",
  match = {{ path_prefix = "/lookup" }},
  run = function(ctx)
    if ctx:path() == "/lookup/use-stash" then
      ctx:set_header("x-other-path", kept:path())
      return
    end
    if ctx:path() == "/lookup/stash" then kept = ctx end
    local timeout = ctx:path() == "/lookup/fast-timeout" and 0.2 or 30
    local r, err = ctx.http.get("http://{service}/user?id=7", {{ timeout = timeout }})
    if not r then
      ctx:respond(504, {{ ["x-lookup-error"] = err }}, "lookup failed\n")
      return
    end
    ctx:set_header("x-user", r.body)
    ctx:set_header("x-lookup-status", tostring(r.status))
  end,
}}
"#
    )
}

/// `ctx.http` suspends only the calling request: with one worker and the lookup service
/// holding its answer, other requests on that worker complete; then the lookup resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctx_http_suspends_only_its_own_request() {
    let (origin, canary) = (echo_origin("main").await, echo_origin("canary").await);
    let (arrived_tx, mut arrived) = tokio::sync::mpsc::unbounded_channel::<()>();
    let release = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let rel = release.clone();
    let service = raw_origin(move |mut s, _| {
        let (arrived_tx, rel) = (arrived_tx.clone(), rel.clone());
        async move {
            let mut carry = Vec::new();
            if read_head(&mut s, &mut carry).await.is_some() {
                let _ = arrived_tx.send(());
                // The slow service: answers only when the test says so (or after 200 ms
                // of wall time would be too racy to assert on; an explicit release is not).
                if let Ok(p) = rel.acquire().await {
                    p.forget();
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nalice")
                        .await;
                }
            }
        }
    })
    .await;
    let dir = filters_dir(true, &[("lookup.lua", &lookup_filter(service.addr))]);
    let g = start(&lua_config(origin.addr, canary.addr, dir.path(), ""));

    let addr = g.addr;
    let slow = tokio::spawn(async move { get(addr, "/lookup/user").await });
    tokio::time::timeout(Duration::from_secs(10), arrived.recv())
        .await
        .expect("the lookup reached the service");
    // While the lookup is pending, the same (only) worker serves other requests.
    for i in 0..20 {
        let r = tokio::time::timeout(Duration::from_secs(10), get(g.addr, &format!("/other/{i}")))
            .await
            .expect("other requests are not stalled by the pending lookup");
        assert_eq!(r.status, 200);
    }
    assert!(!slow.is_finished(), "the lookup request is still waiting");
    release.add_permits(1);
    let r = slow.await.expect("lookup task");
    assert_eq!(r.status, 200);
    let b = body(&r).to_ascii_lowercase();
    assert!(
        b.contains("x-user: alice") && b.contains("x-lookup-status: 200"),
        "{b}"
    );

    // A timeout is a value the script handles, not a stall.
    let r = get(g.addr, "/lookup/fast-timeout").await;
    assert_eq!(r.status, 504);
    assert!(header(&r, "x-lookup-error").is_some_and(|e| e.contains("timed out")));
    release.add_permits(8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compile_error_names_file_and_line_and_keeps_the_running_set() {
    let (origin, canary) = (echo_origin("main").await, echo_origin("canary").await);
    let dir = filters_dir(true, &[]);
    let g = start(&lua_config(
        origin.addr,
        canary.addr,
        dir.path(),
        "watch = false",
    ));
    let v = g.gateway().version();
    write(
        dir.path(),
        "broken.lua",
        "return {\n  stage = \"pre\",\n  run = function(ctx) if then end,\n}\n",
    );
    let err = g
        .gateway()
        .reload_from_source()
        .expect_err("a syntax error rejects the set");
    assert!(err.contains("broken.lua:3:"), "file and line: {err}");
    assert_eq!(g.gateway().version(), v, "the running version stays");
    let r = get(g.addr, "/still").await;
    assert_eq!(header(&r, "x-lua-post"), Some("default"), "old set active");

    // A declaration error is reported with the file too.
    write(
        dir.path(),
        "broken.lua",
        "return { stage = \"sideways\", run = function() end }\n",
    );
    let err = g.gateway().reload_from_source().expect_err("bad stage");
    assert!(err.contains("broken.lua") && err.contains("stage"), "{err}");

    // A typo in a declaration key is an error, as in TOML, in the match table too.
    write(
        dir.path(),
        "broken.lua",
        "return { stage = 'pre', oder = 3, run = function() end }\n",
    );
    let err = g.gateway().reload_from_source().expect_err("a typo");
    assert!(
        err.contains("broken.lua") && err.contains("`oder`"),
        "{err}"
    );
    write(
        dir.path(),
        "broken.lua",
        "return { stage = 'pre', match = { path_prefx = '/a' }, run = function() end }\n",
    );
    let err = g
        .gateway()
        .reload_from_source()
        .expect_err("a typo in match");
    assert!(err.contains("`path_prefx`"), "{err}");

    // A match on a route the config does not have is refused too.
    write(
        dir.path(),
        "broken.lua",
        "return { stage = 'pre', match = { routes = { 'nope' } }, run = function() end }\n",
    );
    let err = g.gateway().reload_from_source().expect_err("unknown route");
    assert!(
        err.contains("broken.lua") && err.contains("\"nope\""),
        "{err}"
    );

    // Starting on a broken directory fails with the same report.
    let err = match try_start(&lua_config(origin.addr, canary.addr, dir.path(), "")) {
        Ok(_) => panic!("a broken set must not start"),
        Err(e) => e,
    };
    assert!(err.contains("broken.lua"), "{err}");
}

const TLS_FACTS: &str = r#"
return {
  stage = "post",
  run = function(ctx)
    local t = ctx:tls()
    if t == nil then
      ctx:set_response_header("x-tls", "no")
    else
      ctx:set_response_header("x-tls", "yes:" .. (t.client_identity or "anonymous"))
    end
  end,
}
"#;

/// `ctx:tls()` carries the TLS facts: nil on a plain listener, the mTLS identity on a TLS one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctx_tls_reports_the_listener_and_client_identity() {
    use tls_support::*;
    let (origin, canary) = (echo_origin("main").await, echo_origin("canary").await);
    let pki = Pki::new();
    let server = pki.issue("gw", &["gw.test"], "gw", false);
    let alice = pki.issue("alice", &[], "alice", true);
    let dir = filters_dir(false, &[("tls_facts.lua", TLS_FACTS)]);
    let listener = tls_keys(
        &[&server],
        &format!(
            "client_auth = {{ ca = \"{}\", required = false }}",
            pki.ca_path().display()
        ),
    );
    let toml = lua_config(origin.addr, canary.addr, dir.path(), "").replacen(
        "address = \"127.0.0.1:0\"\n",
        &format!("address = \"127.0.0.1:0\"\n{listener}\n"),
        1,
    );
    let g = start(&toml);
    let opts = ClientOpts {
        client_cert: Some((alice.der.clone(), alice.key_der.clone_key())),
        ..Default::default()
    };
    let s = connect(g.addr, "gw.test", client_config(&pki, &opts))
        .await
        .expect("tls connect");
    let r = H1::handshake(s)
        .await
        .expect("h1")
        .get("/", &[])
        .await
        .expect("get");
    assert_eq!(r.status, 200);
    assert_eq!(r.headers.get("x-tls").unwrap(), "yes:alice");
    let s = connect(
        g.addr,
        "gw.test",
        client_config(&pki, &ClientOpts::default()),
    )
    .await
    .expect("tls connect");
    let r = H1::handshake(s)
        .await
        .expect("h1")
        .get("/", &[])
        .await
        .expect("get");
    assert_eq!(r.headers.get("x-tls").unwrap(), "yes:anonymous");

    let plain = filters_dir(false, &[("tls_facts.lua", TLS_FACTS)]);
    let g = start(&lua_config(origin.addr, canary.addr, plain.path(), ""));
    assert_eq!(header(&get(g.addr, "/").await, "x-tls"), Some("no"));
}

const EDITS: &str = r#"
return {
  stage = "pre",
  order = 1,
  match = { path_prefix = "/edits" },
  run = function(ctx)
    ctx:set_header("X-Set", "new")
    ctx:add_header("x-multi", "2")
    ctx:remove_header("x-gone")
  end,
}
"#;

const READS: &str = r#"
return {
  stage = "pre",
  order = 2,
  match = { path_prefix = "/edits" },
  run = function(ctx)
    local seen = ctx:header("x-set") .. "|" .. ctx:header("X-MULTI") .. "|" .. tostring(ctx:header("x-gone"))
    ctx:set_header("x-read", seen)
  end,
}
"#;

/// Filters change a request whose fields stay in wire form (no map is built for them): a
/// later filter reads the changes, the origin gets them, and the lines no filter touched
/// arrive as the client spelled them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_edits_to_a_wire_form_request_are_seen_by_later_filters_and_the_origin() {
    let (origin, canary) = (echo_origin("main").await, echo_origin("canary").await);
    let dir = filters_dir(false, &[("edits.lua", EDITS), ("reads.lua", READS)]);
    let g = start(&lua_config(origin.addr, canary.addr, dir.path(), ""));
    let mut s = tokio::net::TcpStream::connect(g.addr).await.unwrap();
    s.write_all(
        b"GET /edits HTTP/1.1\r\nHost: x\r\nX-Keep:  spaced \r\nx-gone: 1\r\nX-Set: old\r\nx-multi: 1\r\n\r\n",
    )
    .await
    .unwrap();
    let mut carry = Vec::new();
    let head = read_head(&mut s, &mut carry).await.expect("a response");
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let len = head_header(&head, "content-length").expect("a length");
    let seen = read_exact_body(&mut s, &mut carry, len.parse().unwrap()).await;
    let seen = String::from_utf8(seen).unwrap();
    assert!(seen.contains("\r\nX-Keep:  spaced \r\n"), "{seen}");
    let lines: Vec<String> = seen.split("\r\n").map(str::to_ascii_lowercase).collect();
    let count = |prefix: &str| lines.iter().filter(|l| l.starts_with(prefix)).count();
    assert_eq!(count("x-gone:"), 0, "{seen}");
    assert_eq!(count("x-set:"), 1, "{seen}");
    assert_eq!(count("x-set: new"), 1, "{seen}");
    assert_eq!(count("x-multi: 1"), 1, "{seen}");
    assert_eq!(count("x-multi: 2"), 1, "{seen}");
    assert_eq!(count("x-read: new|1, 2|nil"), 1, "{seen}");
    assert_eq!(count("x-request-id:"), 1, "{seen}");
}

const BAD_ANSWERS: &str = r#"
local cases = {
  ["/respond-101"] = function(ctx) ctx:respond(101, {upgrade = "websocket"}, "") end,
  ["/respond-100"] = function(ctx) ctx:respond(100) end,
  ["/respond-700"] = function(ctx) ctx:respond(700) end,
  ["/respond-fraction"] = function(ctx) ctx:respond(200.5) end,
  ["/path-space"] = function(ctx) ctx:set_upstream_path("/a b") end,
  ["/path-crlf"] = function(ctx) ctx:set_upstream_path("/a\r\nx-injected: 1") end,
}
return {
  stage = "pre",
  run = function(ctx)
    local case = cases[ctx:path()]
    if case then case(ctx) end
  end,
}
"#;

const BAD_POST_STATUS: &str = r#"
return {
  stage = "post",
  run = function(ctx)
    if ctx:path() == "/post-101" then ctx:set_response_status(101) end
    if ctx:path() == "/post-100" then ctx:set_response_status(100) end
  end,
}
"#;

/// A filter's answer needs a final status (a 1xx one would tell the client that another
/// response follows, or that the connection switched protocols), and an upstream path must
/// be a valid target: otherwise the call raises an error, the filter fails (counted) and the
/// client gets a 500, never the 1xx on the wire nor a 400 blaming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_answer_without_a_final_status_or_with_a_bad_path_fails_the_filter() {
    let (origin, canary) = (echo_origin("main").await, echo_origin("canary").await);
    let dir = filters_dir(
        false,
        &[("bad.lua", BAD_ANSWERS), ("badpost.lua", BAD_POST_STATUS)],
    );
    let g = start(&lua_config(origin.addr, canary.addr, dir.path(), ""));
    let wait = std::time::Duration::from_secs(2);
    let pre = [
        "/respond-101",
        "/respond-100",
        "/respond-700",
        "/respond-fraction",
        "/path-space",
        "/path-crlf",
    ];
    for path in pre.iter().chain(&["/post-101", "/post-100"]) {
        let req = format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let resp = raw(g.addr, req.as_bytes(), wait).await;
        let text = String::from_utf8_lossy(&resp);
        assert_eq!(status_of(&resp), Some(500), "{path}: {text}");
        assert_eq!(count_responses(&resp), 1, "{path}: {text}");
        assert!(!text.contains("x-injected"), "{path}: {text}");
    }
    assert_eq!(filter_metric(&g, "errors", "bad"), pre.len() as f64);
    assert_eq!(filter_metric(&g, "errors", "badpost"), 2.0);
    assert_eq!(get(g.addr, "/fine").await.status, 200);
}

const SETTINGS: &str = r#"
return {
  stage = "post",
  run = function(ctx)
    local s = ctx:settings()
    ctx:set_response_header("x-key", s.key or "-")
    ctx:set_response_header("x-limit", tostring(s.limit or "-"))
    ctx:set_response_header("x-first", (s.list and s.list[1]) or "-")
  end,
}
"#;

/// `ctx:settings()`: `[lua.settings.<file>]` for every route, a route's `lua_settings` keys
/// over it for that route, `{ env = "NAME" }` read from the environment; a table naming no
/// file, or an unset variable, refuses the config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_come_from_the_config_per_filter_and_route() {
    // SAFETY of set_var: read only by this test (its own variable name), before the start.
    std::env::set_var("KM_TEST_LUA_SETTINGS_KEY", "from-env");
    let origin = echo_origin("main").await;
    let dir = filters_dir(false, &[("cfg.lua", SETTINGS)]);
    let routes = r#"
[lua.settings.cfg]
key = { env = "KM_TEST_LUA_SETTINGS_KEY" }
limit = 5
list = ["a", "b"]

[[routes]]
name = "special"
cluster = "origin"
match = { path_prefix = "/special" }
lua_settings = { cfg = { limit = 9 } }
"#;
    let g = start(&lua_config(origin.addr, origin.addr, dir.path(), routes));
    let r = get(g.addr, "/plain").await;
    assert_eq!(r.status, 200);
    assert_eq!(header(&r, "x-key"), Some("from-env"));
    assert_eq!(header(&r, "x-limit"), Some("5"));
    assert_eq!(header(&r, "x-first"), Some("a"));
    let r = get(g.addr, "/special/x").await;
    assert_eq!(header(&r, "x-limit"), Some("9"), "the route's key wins");
    assert_eq!(
        header(&r, "x-key"),
        Some("from-env"),
        "the rest is the filter's"
    );

    for (extra, expect) in [
        ("[lua.settings.nope]\na = 1\n", "no filter \"nope\""),
        (
            "[lua.settings.cfg]\nkey = { env = \"KM_TEST_SURELY_UNSET\" }\n",
            "KM_TEST_SURELY_UNSET",
        ),
    ] {
        let text = lua_config(origin.addr, origin.addr, dir.path(), extra);
        match try_start(&text) {
            Ok(_) => panic!("started with {extra}"),
            Err(e) => assert!(e.contains(expect), "{extra}: {e}"),
        }
    }
}
