//! One sandboxed LuaJIT VM per worker thread (a thread-local: no lock on the request path),
//! the instruction budget, the memory cap, and the per-version instances of a filter set.
//!
//! **Sandbox.** Each filter file runs in its own environment whose globals are an allow
//! list: `assert error ipairs next pairs pcall xpcall select tonumber tostring type unpack
//! rawequal rawget rawset setmetatable getmetatable`, copies of `string table math bit`, and
//! keymaster's `log`, `shared` and `http`. There is no `os`, `io`, `debug`, `ffi`, `jit`,
//! `package`/`require`, `dofile`, `loadfile`, `load`, `loadstring`, `getfenv`/`setfenv`,
//! `collectgarbage`, `coroutine` or `string.dump`.
//!
//! **Budget.** LuaJIT's count hook does not fire inside JIT-compiled traces, so a hot loop
//! could escape it. The VM therefore runs with the JIT compiler off (`jit.off()`; LuaJIT's
//! interpreter is still fast), where the count hook fires every [`HOOK_EVERY`] instructions
//! without exception. The hook charges the running call's meter ([`crate::meter`]: the
//! instruction budget and the call's wall-clock limit, per call, across `ctx.http`
//! suspensions) and raises an error once it is spent. `pcall`/`xpcall` are wrapped so a
//! script cannot swallow that error and keep running. The string functions whose work the
//! hook cannot see (pattern matching, `rep`, `format`, `concat`, ...) are replaced before
//! the sandbox copies the libraries ([`crate::strlib`]) and charge the meter for their work;
//! other work inside one instruction (the `..` operator on huge strings) is bounded by the
//! memory cap per operation and by the clock, checked at the next hook.
//!
//! **Memory.** mlua's allocator limit ([`mlua::Lua::set_memory_limit`]) works with the
//! vendored LuaJIT (64-bit GC): an allocation past the cap fails and the call errors. After
//! a memory error, and after every [`CHECK_EVERY`]th call, the VM's used memory is also
//! checked; past 3/4 of the cap after a full GC (or after the memory error) the worker's VM
//! is dropped and rebuilt on its next use (calls still suspended on the old VM finish on it).

use mlua::chunk::ChunkMode;
use mlua::{ffi, Function, HookTriggers, Lua, LuaOptions, StdLib, Table, Thread, Value, VmState};
use std::cell::{Cell, RefCell};
use std::ffi::c_int;
use std::sync::{Arc, Weak};

use crate::ctx::Lent;
use crate::meter::{self, with_limits, Limits};
use crate::set::{LuaSet, Settings};

/// The count hook fires every this many VM instructions.
pub const HOOK_EVERY: u32 = 1000;

thread_local! {
    static WORKER: RefCell<Option<WorkerVm>> = const { RefCell::new(None) };
    static GENERATION: Cell<u64> = const { Cell::new(0) };
    /// Calls on this thread until the next memory check (`over_cap`).
    static UNCHECKED: Cell<u32> = const { Cell::new(CHECK_EVERY) };
}

/// Filter calls between two checks of a VM's memory use.
const CHECK_EVERY: u32 = 16;

/// A new sandboxed VM for `settings` (JIT off, budget hook, memory cap, keymaster's API).
pub(crate) fn new_vm(settings: &Settings) -> mlua::Result<Lua> {
    let libs = StdLib::TABLE | StdLib::STRING | StdLib::MATH | StdLib::BIT | StdLib::JIT;
    let lua = Lua::new_with(libs, LuaOptions::default())?;
    lua.load("jit.off() jit.flush()")
        .set_name("=keymaster")
        .exec()?;
    if lua.set_memory_limit(settings.memory_limit).is_err() {
        tracing::warn!("lua: allocator limit unavailable; relying on the after-call memory check");
    }
    lua.set_global_hook(
        HookTriggers::new().every_nth_instruction(HOOK_EVERY),
        |_, _| match meter::charge(u64::from(HOOK_EVERY)) {
            Ok(()) => Ok(VmState::Continue),
            Err(why) => Err(mlua::Error::runtime(why)),
        },
    )?;
    crate::ctx::register(&lua)?;
    crate::strlib::install(&lua, settings.memory_limit)?;
    let spent = lua.create_function(|_, ()| Ok(meter::spent()))?;
    let log = lua.create_function(|_, msg: mlua::LuaString| {
        tracing::info!(target: "keymaster_lua", "{}", msg.to_string_lossy());
        Ok(())
    })?;
    let shared = crate::api::shared_table(&lua, settings.dict.clone())?;
    let http = crate::http_client::table(&lua, settings.http.clone())?;
    lua.set_named_registry_value("keymaster.http", http.clone())?;
    let base: Table = lua.load(SANDBOX).set_name("=keymaster-sandbox").call((
        lua.globals(),
        spent,
        log,
        shared,
        http,
    ))?;
    lua.set_named_registry_value("keymaster.base", base)?;
    Ok(lua)
}

/// Builds the allow-listed globals every filter file's environment reads through.
const SANDBOX: &str = r#"
local G, spent, log, shared, http = ...
local base = {}
for _, k in ipairs({"assert", "error", "ipairs", "next", "pairs", "select", "tonumber",
    "tostring", "type", "unpack", "rawequal", "rawget", "rawset", "setmetatable",
    "getmetatable"}) do
  base[k] = G[k]
end
-- Bytecode out of a function is of no use to a filter (nothing loads it) and not for it.
G.string.dump = nil
for _, lib in ipairs({"string", "table", "math", "bit"}) do
  local copy = {}
  for k, v in pairs(G[lib]) do copy[k] = v end
  base[lib] = copy
end
-- Filters make a little garbage per call; collect less often (the memory cap still holds).
G.collectgarbage("setpause", 400)
-- Scripts must not reach the real string library through a string's metatable.
getmetatable("").__metatable = false
local raw_pcall, raw_xpcall, raise = G.pcall, G.xpcall, G.error
local function pass(ok, ...)
  if not ok and spent() then raise((...), 0) end
  return ok, ...
end
base.pcall = function(f, ...) return pass(raw_pcall(f, ...)) end
base.xpcall = function(f, h, ...) return pass(raw_xpcall(f, h, ...)) end
base.log, base.shared, base.http = log, shared, http
return base
"#;

/// A fresh environment for one filter file: its own globals over the sandbox's.
pub(crate) fn new_env(lua: &Lua) -> mlua::Result<Table> {
    let base: Table = lua.named_registry_value("keymaster.base")?;
    let env = lua.create_table()?;
    let mt = lua.create_table()?;
    mt.set("__index", base)?;
    env.set_metatable(Some(mt))?;
    Ok(env)
}

/// A filter file's functions, instantiated in one VM.
#[derive(Clone)]
pub(crate) struct Fns {
    pub run: Function,
    /// The file's `ctx` table (`crate::ctx::table_for_file`).
    pub ctx: Table,
    /// A Lua thread of the file's own for synchronous calls ([`pcall`]): its stack holds
    /// `run`, `ctx` and `should_filter` (at [`RUN`], [`CTX`], [`SHOULD`]) for as long as the
    /// file is instantiated, so a call pushes them from the stack instead of looking them
    /// up in the registry. No script can reach it (there is no `coroutine` library).
    caller: Thread,
    has_should: bool,
}

/// Where [`Fns::caller`]'s stack holds the file's values.
const RUN: c_int = 1;
const CTX: c_int = 2;
const SHOULD: c_int = 3;

/// A failed synchronous call: the error as one line of text (see [`crate::error_text`]) and
/// whether it was an allocation past the memory cap. Boxed where it is returned, so the
/// common, successful result stays two words wide through the call path.
pub(crate) struct CallError {
    pub text: String,
    pub memory: bool,
}

impl CallError {
    fn new(e: &mlua::Error) -> Box<CallError> {
        Box::new(CallError {
            text: crate::error_text(e),
            memory: is_memory_error(e),
        })
    }
}

/// A protected call of `run(ctx)` or `should_filter(ctx)` on the file's own thread, for
/// synchronous calls: whether its first result is truthy (`truth`; else `Ok(true)`: the
/// result is not read). mlua's `Function::call` does the same work through its generic
/// machinery (values moved between its reference thread and the main stack, a traceback
/// handler, result conversion), which cost several hundred instructions per call more.
fn pcall(lua: &Lua, fns: &Fns, f: c_int, truth: bool) -> Result<bool, Box<CallError>> {
    lua.exec_raw_lua(|raw| {
        let t = fns.caller.state();
        let base = if fns.has_should { SHOULD } else { CTX };
        // SAFETY: `t` is the file's caller thread, alive while `fns` is (it holds the
        // thread), never running when a synchronous call starts (these start from Rust,
        // never from inside Lua: ctx methods call no filter) and never suspended (it is
        // only used here, and nothing on it can yield: no script reaches it). `raw` holds
        // mlua's lock on the VM for this closure. Its stack holds exactly `base` values
        // (`instantiate`) between calls; a call pushes two more, within the LUA_MINSTACK
        // slots a new thread has. `lua_pcall` pops them and pushes `nresults` results or
        // one error value, so the stack is back to `base` once the result is read and
        // popped, or the error value moved to the main state's stack (for `error_on_top`,
        // which reads it there before it is popped).
        unsafe {
            ffi::lua_pushvalue(t, f);
            ffi::lua_pushvalue(t, CTX);
            let rc = ffi::lua_pcall(t, 1, c_int::from(truth), 0);
            if rc != ffi::LUA_OK {
                let l = raw.state();
                let top = ffi::lua_gettop(l);
                ffi::lua_xmove(t, l, 1);
                let e = CallError::new(&error_on_top(raw, rc));
                ffi::lua_settop(l, top);
                return Err(e);
            }
            if !truth {
                return Ok(true); // no result asked for: nothing to pop
            }
            let b = ffi::lua_toboolean(t, -1) != 0;
            ffi::lua_settop(t, base);
            Ok(b)
        }
    })
}

/// The error value a failed `lua_pcall` left on top of the stack, as mlua's error.
///
/// # Safety
/// The top of `raw`'s stack must be that value.
#[cold]
unsafe fn error_on_top(raw: &mlua::state::RawLua, rc: std::ffi::c_int) -> mlua::Error {
    let l = raw.state();
    // SAFETY: index -1 is the error value (the caller's contract). A string's bytes are
    // read in place (no allocation: the VM may be out of memory), copied before the
    // caller pops it.
    unsafe {
        if ffi::lua_type(l, -1) == ffi::LUA_TSTRING {
            let mut len = 0;
            let data = ffi::lua_tolstring(l, -1, &mut len);
            let text = String::from_utf8_lossy(std::slice::from_raw_parts(data.cast(), len));
            return match rc {
                ffi::LUA_ERRMEM => mlua::Error::MemoryError(text.into_owned()),
                _ => mlua::Error::RuntimeError(text.into_owned()),
            };
        }
        // An error raised by one of mlua's callbacks (the budget hook, `ctx.http`, the
        // table methods) is its error object: mlua reads it back as the error.
        match <Value as mlua::FromLua>::from_stack(-1, raw) {
            Ok(Value::Error(e)) => *e,
            Ok(other) => mlua::Error::RuntimeError(format!(
                "(error object is a {} value)",
                other.type_name()
            )),
            Err(e) => e,
        }
    }
}

/// What a request's filter call needs: the VM, its functions, and which VM it was.
pub(crate) struct Handle {
    pub lua: Lua,
    pub fns: Fns,
    generation: u64,
}

struct WorkerVm {
    lua: Lua,
    settings: Settings,
    generation: u64,
    /// Filter set versions instantiated in this VM; dropped once no snapshot holds them.
    loaded: Vec<(u64, Weak<LuaSet>, Vec<Fns>)>,
}

/// Run a filter file's chunk (source or bytecode already loaded as `f`) and read its
/// declaration table's functions.
pub(crate) fn declare(f: &Function, limits: Limits) -> mlua::Result<Table> {
    match with_limits(limits, || f.call::<Value>(()))? {
        Value::Table(t) => Ok(t),
        other => Err(mlua::Error::runtime(format!(
            "the file must return a table (stage, order, run, ...), not {}",
            other.type_name()
        ))),
    }
}

fn instantiate(lua: &Lua, set: &LuaSet) -> mlua::Result<Vec<Fns>> {
    let mut out = Vec::with_capacity(set.files.len());
    for file in &set.files {
        let f = lua
            .load(&file.bytecode[..])
            .set_name(file.chunk_name.as_str())
            .set_mode(ChunkMode::Binary)
            .set_environment(new_env(lua)?)
            .into_function()?;
        let t = declare(&f, set.settings.limits)?;
        let should: Option<Function> = t.get("should_filter")?;
        let run: Function = t.get("run")?;
        let ctx = crate::ctx::table_for_file(lua)?;
        crate::ctx::add_settings(lua, &ctx, &file.settings)?;
        // The caller thread's stack: `run` (put there by `create_thread`), `ctx`, then
        // `should_filter` if the file has one.
        let caller = lua.create_thread(run.clone())?;
        lua.exec_raw_lua(|raw| -> mlua::Result<()> {
            let (l, t) = (raw.state(), caller.state());
            // SAFETY: `l` is the VM's main state and `t` a thread of it that never ran;
            // each value is pushed on `l` (checked for room) and moved to `t`, whose fresh
            // stack has room for the three values it will hold. `l` ends as it began.
            unsafe {
                if ffi::lua_checkstack(l, 2) == 0 {
                    return Err(mlua::Error::StackError);
                }
                raw.push(ctx.clone())?;
                ffi::lua_xmove(l, t, 1);
                if let Some(should) = &should {
                    raw.push(should.clone())?;
                    ffi::lua_xmove(l, t, 1);
                }
            }
            Ok(())
        })?;
        out.push(Fns {
            run,
            ctx,
            caller,
            has_should: should.is_some(),
        });
    }
    Ok(out)
}

/// Make sure this worker's VM exists for `set`'s settings and has instantiated `set` (its
/// validated bytecode, the first time this worker sees that version).
fn ensure(set: &Arc<LuaSet>) -> Result<(), String> {
    WORKER.with(|w| {
        let mut w = w.borrow_mut();
        if w.as_ref()
            .is_none_or(|vm| !vm.settings.same_vm(&set.settings))
        {
            let lua = new_vm(&set.settings).map_err(|e| format!("lua VM: {e}"))?;
            let generation = GENERATION.with(|g| {
                g.set(g.get() + 1);
                g.get()
            });
            *w = Some(WorkerVm {
                lua,
                settings: set.settings.clone(),
                generation,
                loaded: Vec::new(),
            });
        }
        let Some(vm) = w.as_mut() else {
            return Err("lua VM missing".to_string());
        };
        if vm.loaded.iter().any(|(id, _, _)| *id == set.id) {
            return Ok(());
        }
        vm.loaded.retain(|(_, s, _)| s.strong_count() > 0);
        let fns = instantiate(&vm.lua, set).map_err(|e| crate::error_text(&e))?;
        vm.loaded.push((set.id, Arc::downgrade(set), fns));
        Ok(())
    })
}

/// Which function of a filter file a synchronous call runs.
#[derive(Clone, Copy)]
pub(crate) enum Entry {
    ShouldFilter,
    Run,
}

/// A synchronous call of filter `index` of `set` on this worker's VM (its functions
/// borrowed, no handles cloned): `entry` with the request context `lent` and the set's
/// instruction budget. Whether its first result is truthy (`Ok(true)` for a file without
/// `should_filter`); the error as one line of text. Then the memory cap is enforced.
pub(crate) fn call(
    set: &Arc<LuaSet>,
    index: usize,
    entry: Entry,
    lent: Lent,
) -> Result<bool, String> {
    if let Some(r) = try_call(set, index, entry, lent) {
        return r;
    }
    ensure(set)?;
    try_call(set, index, entry, lent).unwrap_or_else(|| Err("lua VM missing".to_string()))
}

/// [`call`] if this worker's VM has instantiated `set` (one borrow: the common case). A VM
/// that holds `set` was made for its settings (a VM is replaced, not changed).
fn try_call(set: &LuaSet, index: usize, entry: Entry, lent: Lent) -> Option<Result<bool, String>> {
    let (r, rebuild) = WORKER.with(|w| {
        let w = w.borrow();
        let vm = w.as_ref()?;
        let (_, _, all) = vm.loaded.iter().find(|(id, _, _)| *id == set.id)?;
        let Some(fns) = all.get(index) else {
            return Some((Err("lua filter index out of range".to_string()), None));
        };
        let f = match (entry, fns.has_should) {
            (Entry::Run, _) => RUN,
            (Entry::ShouldFilter, true) => SHOULD,
            (Entry::ShouldFilter, false) => return Some((Ok(true), None)),
        };
        let truth = matches!(entry, Entry::ShouldFilter);
        let r = with_limits(set.settings.limits, || {
            lent.during(|| pcall(&vm.lua, fns, f, truth))
        });
        let memory_error = matches!(&r, Err(e) if e.memory);
        let full = over_cap(&vm.lua, set.settings.memory_limit, memory_error);
        Some((r.map_err(|e| e.text), full.then_some(vm.generation)))
    })?;
    if let Some(generation) = rebuild {
        drop_vm(generation);
    }
    Some(r)
}

fn functions<'a>(vm: &'a WorkerVm, set: &LuaSet, index: usize) -> Result<&'a Fns, String> {
    vm.loaded
        .iter()
        .find(|(id, _, _)| *id == set.id)
        .and_then(|(_, _, fns)| fns.get(index))
        .ok_or_else(|| "lua filter index out of range".to_string())
}

/// This worker's VM and the functions of filter `index` of `set`, owned: for calls that
/// may suspend (they outlive any borrow of the worker's state).
pub(crate) fn handle(set: &Arc<LuaSet>, index: usize) -> Result<Handle, String> {
    ensure(set)?;
    WORKER.with(|w| {
        let w = w.borrow();
        let vm = w.as_ref().ok_or("lua VM missing")?;
        Ok(Handle {
            lua: vm.lua.clone(),
            fns: functions(vm, set, index)?.clone(),
            generation: vm.generation,
        })
    })
}

/// After a suspendable call: enforce the memory cap.
pub(crate) fn after_call<R>(h: &Handle, limit: usize, r: &mlua::Result<R>) {
    if over_cap(&h.lua, limit, is_memory(r)) {
        drop_vm(h.generation);
    }
}

/// Whether the VM is (nearly) full or an allocation failed: it is then rebuilt on the
/// worker's next call (calls still suspended on it finish on it).
#[inline(always)]
fn over_cap(lua: &Lua, limit: usize, memory_error: bool) -> bool {
    // The allocator's cap holds on every allocation; this check only retires a VM that is
    // filling up, so once every few calls is enough (reading the VM's use costs a lock and
    // a call into LuaJIT).
    let due = memory_error
        || UNCHECKED.with(|n| {
            let left = n.get().saturating_sub(1);
            n.set(if left == 0 { CHECK_EVERY } else { left });
            left == 0
        });
    due && check_memory(lua, limit, memory_error)
}

/// [`over_cap`] when a check is due.
#[cold]
fn check_memory(lua: &Lua, limit: usize, memory_error: bool) -> bool {
    let high = limit / 4 * 3;
    if !memory_error && lua.used_memory() <= high {
        return false;
    }
    if !memory_error {
        let _ = lua.gc_collect();
        if lua.used_memory() <= high {
            return false;
        }
    }
    tracing::warn!(
        used = lua.used_memory(),
        limit,
        "lua: VM over its memory cap; rebuilding this worker's VM"
    );
    true
}

fn drop_vm(generation: u64) {
    WORKER.with(|w| {
        let mut w = w.borrow_mut();
        if w.as_ref().is_some_and(|vm| vm.generation == generation) {
            *w = None;
        }
    });
}

fn is_memory<R>(r: &mlua::Result<R>) -> bool {
    matches!(r, Err(e) if is_memory_error(e))
}

fn is_memory_error(e: &mlua::Error) -> bool {
    match e {
        mlua::Error::MemoryError(_) => true,
        mlua::Error::CallbackError { cause, .. } => is_memory_error(cause),
        mlua::Error::RuntimeError(m) => m.contains("not enough memory"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(memory_limit: usize) -> Settings {
        let mut s = Settings::from_config(
            &keymaster_config::LuaConfig::default(),
            None,
            Default::default(),
            Default::default(),
            Default::default(),
        )
        .expect("default settings");
        s.limits = Limits::instructions(100_000);
        s.memory_limit = memory_limit;
        s
    }

    fn sandboxed(lua: &Lua, src: &str) -> Function {
        lua.load(src)
            .set_environment(new_env(lua).unwrap())
            .into_function()
            .unwrap()
    }

    /// Synchronous calls leave each file's caller thread holding exactly its values again,
    /// whether the call succeeded, failed, read a result or not (a value left behind on
    /// every call would outgrow the thread's stack).
    #[test]
    fn synchronous_calls_leave_the_caller_thread_as_they_found_it() {
        use keymaster_filter::TestRequest;
        let dir = tempfile::tempdir().unwrap();
        for (name, src) in [
            (
                "a_both",
                "return { stage = 'pre', should_filter = function(ctx) return true end, \
                 run = function(ctx) ctx:set_header('x-a', '1') end }",
            ),
            (
                "b_run",
                "return { stage = 'pre', run = function(ctx) return 1, 2, 3 end }",
            ),
            (
                "c_fails",
                "return { stage = 'pre', should_filter = function(ctx) error('no') end, \
                 run = function(ctx) ctx:set_header('bad name', '1') end }",
            ),
        ] {
            std::fs::write(dir.path().join(format!("{name}.lua")), src).unwrap();
        }
        let mut set_settings = settings(64 << 20);
        set_settings.limits = Limits::instructions(1_000_000);
        let set = Arc::new(crate::set::compile(dir.path(), set_settings).unwrap());
        let client = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
        let mut req = TestRequest::new(http::Method::GET, "/", Default::default(), client);
        let mut ctx = req.ctx();
        for _ in 0..200 {
            for (index, ok) in [(0, true), (1, true), (2, false)] {
                let should = call(&set, index, Entry::ShouldFilter, Lent::read_only(&ctx));
                assert_eq!(should.is_ok(), ok, "{should:?}");
                let run = call(&set, index, Entry::Run, Lent::writable(&mut ctx));
                assert_eq!(run.is_ok(), ok, "{run:?}");
            }
        }
        WORKER.with(|w| {
            let w = w.borrow();
            let vm = w.as_ref().unwrap();
            for (index, base) in [(0, SHOULD), (1, CTX), (2, SHOULD)] {
                let fns = functions(vm, &set, index).unwrap();
                // SAFETY: the caller thread is alive (held by `fns`) and not running;
                // `lua_gettop` only reads its stack's size.
                let top = unsafe { ffi::lua_gettop(fns.caller.state()) };
                assert_eq!(top, base, "file {index}");
            }
        });
    }

    #[test]
    fn the_jit_is_off_and_the_budget_stops_loops() {
        let lua = new_vm(&settings(64 << 20)).unwrap();
        let status: bool = lua.load("return jit.status()").eval().unwrap();
        assert!(!status, "JIT compiler off, so count hooks always fire");
        let f = sandboxed(&lua, "local i = 0 while true do i = i + 1 end");
        let e = with_limits(Limits::instructions(100_000), || f.call::<()>(())).unwrap_err();
        assert!(crate::error_text(&e).contains(meter::BUDGET_MSG), "{e}");
        let f = sandboxed(
            &lua,
            "while true do pcall(function() while true do end end) end",
        );
        let e = with_limits(Limits::instructions(100_000), || f.call::<()>(())).unwrap_err();
        assert!(crate::error_text(&e).contains(meter::BUDGET_MSG), "{e}");
        // Within budget, the same VM runs normally afterwards.
        let f = sandboxed(&lua, "local s = 0 for i = 1, 100 do s = s + i end return s");
        assert_eq!(
            with_limits(Limits::instructions(100_000), || f.call::<i64>(())).unwrap(),
            5050
        );
    }

    #[test]
    fn the_allocator_cap_fails_an_allocation() {
        let lua = new_vm(&settings(4 << 20)).unwrap();
        let f = sandboxed(
            &lua,
            "keep = {} for i = 1, 1e7 do keep[i] = string.rep('x', 64) .. i end",
        );
        let e = with_limits(Limits::instructions(u64::MAX), || f.call::<()>(())).unwrap_err();
        assert!(
            matches!(e, mlua::Error::MemoryError(_)) || e.to_string().contains("memory"),
            "{e:?}"
        );
    }
}
