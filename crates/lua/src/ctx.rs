//! The `ctx` a Lua filter receives: a table of methods mirroring the native API
//! (`ctx:method()`, `ctx:set_header(n, v)`, ...) plus `ctx.http`, the non-blocking HTTP
//! client (see `api`). Each filter file gets its own table once, when its VM instantiates
//! it; nothing is created per call.
//!
//! The methods reach the request's [`FilterCtx`] through [`Lent`]: the host lends the
//! context to the running call (read-only in `should_filter`, writable in `run`) and takes
//! it back when the call returns or suspends. A method outside a call, or a `ctx` a script
//! kept in a global, can therefore only ever reach the context of the call running now.
//! (A userdata carrying the context cost about 600 instructions per method call in type
//! checks and borrows; the lent pointer costs a thread-local read.)

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};
use keymaster_filter::FilterCtx;
use mlua::{FromLua, FromLuaMulti, IntoLuaMulti, Lua, Table, Value};
use std::cell::{Cell, RefCell};
use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

/// A status a filter sets for a response: a final one, 200 to 599 (a 1xx status would tell
/// the client that another response follows, or that the connection switched protocols).
pub(crate) fn status(n: f64) -> mlua::Result<StatusCode> {
    let fin = n.fract() == 0.0 && (200.0..=599.0).contains(&n);
    fin.then(|| StatusCode::from_u16(n as u16).ok())
        .flatten()
        .ok_or_else(|| {
            mlua::Error::runtime(format!(
                "invalid status {n}: a response needs a final status, 200 to 599"
            ))
        })
}

/// Every value of `n` in `h`, joined with ", " (nil when absent).
pub(crate) fn get(h: &HeaderMap, n: &str) -> Option<String> {
    join(h.get_all(n).iter().map(HeaderValue::as_bytes))
}

/// `values` joined with ", ", each one that is text (visible ASCII, as
/// [`HeaderValue::to_str`] takes it); nil when there is none.
pub(crate) fn join<'a>(values: impl Iterator<Item = &'a [u8]>) -> Option<String> {
    let text = |v: &'a [u8]| {
        v.iter()
            .all(|&b| b == b'\t' || (32..127).contains(&b))
            .then(|| std::str::from_utf8(v).ok())
            .flatten()
    };
    let mut it = values.filter_map(text);
    let first = it.next()?.to_string();
    Some(it.fold(first, |acc, v| acc + ", " + v))
}

fn to_table(lua: &Lua, h: &HeaderMap) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    for k in h.keys() {
        if let Some(v) = get(h, k.as_str()) {
            t.set(k.as_str(), v)?;
        }
    }
    Ok(t)
}

/// A Lua `{name = value}` table as a header map.
pub(crate) fn from_table(t: Option<Table>) -> mlua::Result<HeaderMap> {
    let mut h = HeaderMap::new();
    if let Some(t) = t {
        for pair in t.pairs::<String, String>() {
            let (k, v) = pair?;
            h.append(
                HeaderName::parse(k.as_bytes()).map_err(|e| *e)?,
                HeaderValue::parse(v.as_bytes()).map_err(|e| *e)?,
            );
        }
    }
    Ok(h)
}

/// The request context lent to the Lua call running on this thread.
#[derive(Clone, Copy)]
pub(crate) struct Lent {
    /// The lent context; its lifetime is erased here and held by the host instead (see
    /// the SAFETY notes of [`with_ref`] and [`with_mut`]).
    ptr: NonNull<FilterCtx<'static>>,
    writable: bool,
}

thread_local! {
    /// The context of the running call. A method takes it out while it works on it, so at
    /// most one reference made from the pointer exists at any time.
    static LENT: Cell<Option<Lent>> = const { Cell::new(None) };
}

impl Lent {
    /// `run`: the call may change the context. The caller must not touch `ctx` while the
    /// lent value is installed (see [`Lent::install`]).
    pub(crate) fn writable(ctx: &mut FilterCtx<'_>) -> Lent {
        Lent {
            ptr: NonNull::from(ctx).cast(),
            writable: true,
        }
    }

    /// `should_filter`: the call reads the context only.
    pub(crate) fn read_only(ctx: &FilterCtx<'_>) -> Lent {
        Lent {
            ptr: NonNull::from(ctx).cast(),
            writable: false,
        }
    }

    /// Make this the running call's context until the returned guard is dropped, which
    /// puts back the one it replaced (also when the call unwinds, so a context is never
    /// left installed past the borrow it came from).
    pub(crate) fn install(self) -> Installed {
        Installed(LENT.with(|l| l.replace(Some(self))))
    }

    /// Run `f` with `self` installed.
    pub(crate) fn during<R>(self, f: impl FnOnce() -> R) -> R {
        let _installed = self.install();
        f()
    }
}

/// See [`Lent::install`].
pub(crate) struct Installed(Option<Lent>);

impl Drop for Installed {
    fn drop(&mut self) {
        LENT.with(|l| l.set(self.0));
    }
}

/// Puts the lent context back when a method is done with it (also on error).
struct Return(Lent);

impl Drop for Return {
    fn drop(&mut self) {
        LENT.with(|l| l.set(Some(self.0)));
    }
}

/// Why a method could not reach the request context.
#[derive(Debug)]
pub(crate) enum Unreachable {
    /// No filter call is running on this thread.
    Outside,
    /// A changing method in `should_filter`.
    ReadOnly,
}

impl From<Unreachable> for mlua::Error {
    #[cold]
    fn from(u: Unreachable) -> mlua::Error {
        mlua::Error::runtime(match u {
            Unreachable::Outside => "ctx used outside a filter call",
            Unreachable::ReadOnly => "ctx is read-only in should_filter",
        })
    }
}

/// `f` with the running call's context, read-only.
pub(crate) fn with_ref<R>(f: impl FnOnce(&FilterCtx<'_>) -> R) -> Result<R, Unreachable> {
    let lent = LENT.with(Cell::take).ok_or(Unreachable::Outside)?;
    let _back = Return(lent);
    // SAFETY: `lent.ptr` was made from a reference (`&FilterCtx` or `&mut FilterCtx`) that
    // the host holds, unused, for as long as the lent value is installed: `Lent::during`
    // around a synchronous call, or `meter::Metered` around each poll of a suspended call's
    // future, which borrows the context for its whole life. The `Installed` guard removes
    // it when that call or poll returns or unwinds, and methods run on this thread inside
    // that window. The value was taken out of `LENT`, so no other reference made from it
    // exists until `_back` puts it back after `f`. The lifetime erased in `Lent` is not
    // relied on: `f` takes a context of any lifetime (`for<'r> FnOnce(&FilterCtx<'r>)`), so
    // nothing borrowed from it can outlive this call, which is within the host's borrow.
    let c = unsafe { lent.ptr.as_ref() };
    Ok(f(c))
}

/// `f` with the running call's context, writable (an error in `should_filter`).
pub(crate) fn with_mut<R>(f: impl FnOnce(&mut FilterCtx<'_>) -> R) -> Result<R, Unreachable> {
    let mut lent = LENT.with(Cell::take).ok_or(Unreachable::Outside)?;
    let _back = Return(lent);
    if !lent.writable {
        return Err(Unreachable::ReadOnly);
    }
    // SAFETY: as in `with_ref`; in addition a writable `Lent` is only made from a
    // `&mut FilterCtx` (`Lent::writable`), so a unique reference is what the host lent.
    let c = unsafe { lent.ptr.as_mut() };
    Ok(f(c))
}

/// The `ctx` receiver of a `ctx:method(...)` call: checked to be a table (a call written
/// `ctx.method(...)` fails clearly) and otherwise ignored, without taking a reference.
struct Receiver;

fn not_a_receiver() -> mlua::Error {
    mlua::Error::runtime("call ctx methods with a colon: ctx:method(...)")
}

impl FromLua for Receiver {
    fn from_lua(v: Value, _: &Lua) -> mlua::Result<Self> {
        match v {
            Value::Table(_) => Ok(Receiver),
            _ => Err(not_a_receiver()),
        }
    }

    // `from_stack` is mlua's hidden fast path for callback arguments (the default makes a
    // `Value`, which for a table means a registry reference taken and released per call).
    unsafe fn from_stack(idx: c_int, lua: &mlua::state::RawLua) -> mlua::Result<Self> {
        // SAFETY: mlua passes a valid index of the running callback's stack; `lua_type`
        // only reads that slot's tag.
        if unsafe { mlua::ffi::lua_type(lua.state(), idx) } == mlua::ffi::LUA_TTABLE {
            Ok(Receiver)
        } else {
            Err(not_a_receiver())
        }
    }
}

/// A header name or value, cluster name: parsed from a Lua string's bytes.
pub(crate) trait ParseArg: Sized {
    fn parse(b: &[u8]) -> ArgResult<Self>;
}

/// A parsed argument, or why it is invalid (boxed: the valid case is the one that is moved
/// around).
pub(crate) type ArgResult<T> = Result<T, Box<mlua::Error>>;

/// Slots in each per-worker cache of parsed arguments.
const SLOTS: usize = 64;

/// Parsed arguments, direct-mapped by the address of the bytes they were parsed from. Lua
/// strings are interned, so a script's constant (`"x-in"`) is the same string at the same
/// address on every call: the slot is found without hashing the bytes, and a hit is
/// checked against the value's own bytes (an address may be reused by other bytes).
type Slots<T> = RefCell<[Option<T>; SLOTS]>;

thread_local! {
    static NAMES: Slots<HeaderName> = const { RefCell::new([const { None }; SLOTS]) };
    static VALUES: Slots<HeaderValue> = const { RefCell::new([const { None }; SLOTS]) };
    static CLUSTERS: Slots<Arc<str>> = const { RefCell::new([const { None }; SLOTS]) };
}

/// `parse(b)`, remembered in `slots`: a clone of a parsed value is cheaper than validating
/// and copying the bytes again (an allocation, for a value) on every call. `same(v, b)`:
/// `v` is what `b` parses to.
#[inline(always)]
fn cached<T: Clone>(
    slots: &'static std::thread::LocalKey<Slots<T>>,
    b: &[u8],
    same: impl Fn(&T, &[u8]) -> bool,
    parse: impl Fn(&[u8]) -> ArgResult<T>,
) -> ArgResult<T> {
    let slot = (b.as_ptr() as usize >> 3) % SLOTS;
    slots.with(|s| {
        if let Some(v) = &s.borrow()[slot] {
            if same(v, b) {
                return Ok(v.clone());
            }
        }
        let v = parse(b)?;
        s.borrow_mut()[slot] = Some(v.clone());
        Ok(v)
    })
}

impl ParseArg for HeaderName {
    fn parse(b: &[u8]) -> ArgResult<Self> {
        // Names are case-insensitive: `b` in any case parses to the lowercase name.
        cached(
            &NAMES,
            b,
            |n, b| {
                let n = n.as_str().as_bytes();
                n == b || n.eq_ignore_ascii_case(b)
            },
            |b| {
                HeaderName::from_bytes(b).map_err(|_| {
                    Box::new(mlua::Error::runtime(format!(
                        "invalid header name {:?}",
                        String::from_utf8_lossy(b)
                    )))
                })
            },
        )
    }
}

impl ParseArg for Arc<str> {
    fn parse(b: &[u8]) -> ArgResult<Self> {
        cached(
            &CLUSTERS,
            b,
            |c, b| c.as_bytes() == b,
            |b| {
                std::str::from_utf8(b)
                    .map(Into::into)
                    .map_err(|_| Box::new(mlua::Error::runtime("expected a UTF-8 string")))
            },
        )
    }
}

impl ParseArg for HeaderValue {
    fn parse(b: &[u8]) -> ArgResult<Self> {
        cached(
            &VALUES,
            b,
            |v, b| v.as_bytes() == b,
            |b| {
                HeaderValue::from_bytes(b).map_err(|_| {
                    Box::new(mlua::Error::runtime(format!(
                        "invalid header value {:?}",
                        String::from_utf8_lossy(b)
                    )))
                })
            },
        )
    }
}

/// Add a method that reads the context to the methods table `t`.
fn reader<A, R, F>(lua: &Lua, t: &Table, name: &str, f: F) -> mlua::Result<()>
where
    A: FromLuaMulti,
    R: IntoLuaMulti,
    F: Fn(&Lua, &FilterCtx<'_>, A) -> mlua::Result<R> + 'static,
{
    let m = lua.create_function(move |lua, (_, a): (Receiver, A)| with_ref(|c| f(lua, c, a))?)?;
    t.raw_set(name, m)
}

/// Add a method that changes the context (an error in `should_filter`).
fn writer<A, R, F>(lua: &Lua, t: &Table, name: &str, f: F) -> mlua::Result<()>
where
    A: FromLuaMulti,
    R: IntoLuaMulti,
    F: Fn(&Lua, &mut FilterCtx<'_>, A) -> mlua::Result<R> + 'static,
{
    let m = lua.create_function(move |lua, (_, a): (Receiver, A)| with_mut(|c| f(lua, c, a))?)?;
    t.raw_set(name, m)
}

const METHODS: &str = "keymaster.ctx";

/// Build the methods once per VM (kept in the registry for [`table_for_file`]).
pub(crate) fn register(lua: &Lua) -> mlua::Result<()> {
    let t = lua.create_table()?;
    methods(lua, &t)?;
    lua.set_named_registry_value(METHODS, t)
}

/// A filter file's own `ctx` table: the methods and `http` (a script that changes its
/// table changes only its own).
pub(crate) fn table_for_file(lua: &Lua) -> mlua::Result<Table> {
    let methods: Table = lua.named_registry_value(METHODS)?;
    let t = lua.create_table()?;
    for pair in methods.pairs::<Value, Value>() {
        let (k, v) = pair?;
        t.raw_set(k, v)?;
    }
    t.raw_set("http", lua.named_registry_value::<Value>("keymaster.http")?)?;
    Ok(t)
}

/// `ctx:settings()` of a file: the table of the request's route if that route overrides
/// keys, else the file's table. Built once per VM; every call returns the same tables
/// (scripts treat them as read-only).
pub(crate) fn add_settings(
    lua: &Lua,
    ctx: &Table,
    settings: &crate::set::FileSettings,
) -> mlua::Result<()> {
    let default = toml_table(lua, &settings.default)?;
    let by_route = lua.create_table()?;
    for (route, t) in &settings.routes {
        by_route.raw_set(route.as_str(), toml_table(lua, t)?)?;
    }
    let f: mlua::Function = lua
        .load("local d, r = ... return function(ctx) return r[ctx:route()] or d end")
        .set_name("=settings")
        .call((default, by_route))?;
    ctx.raw_set("settings", f)
}

fn toml_table(lua: &Lua, t: &toml::Table) -> mlua::Result<Table> {
    let out = lua.create_table()?;
    for (k, v) in t {
        out.raw_set(k.as_str(), toml_value(lua, v)?)?;
    }
    Ok(out)
}

fn toml_value(lua: &Lua, v: &toml::Value) -> mlua::Result<Value> {
    Ok(match v {
        toml::Value::String(s) => Value::String(lua.create_string(s)?),
        toml::Value::Integer(i) => Value::Number(*i as f64),
        toml::Value::Float(f) => Value::Number(*f),
        toml::Value::Boolean(b) => Value::Boolean(*b),
        toml::Value::Datetime(d) => Value::String(lua.create_string(d.to_string())?),
        toml::Value::Array(a) => {
            let t = lua.create_table()?;
            for (i, x) in a.iter().enumerate() {
                t.raw_set(i + 1, toml_value(lua, x)?)?;
            }
            Value::Table(t)
        }
        toml::Value::Table(t) => Value::Table(toml_table(lua, t)?),
    })
}

fn methods(lua: &Lua, r: &Table) -> mlua::Result<()> {
    // Methods on plain values (most of them) are C functions (`methods.rs`); these build
    // or read tables and bodies.
    crate::methods::register(lua, r)?;
    reader(lua, r, "tls", |lua, c, ()| {
        if !c.is_tls() {
            return Ok(None);
        }
        let t = lua.create_table()?;
        t.set("client_identity", c.tls_client_identity())?;
        Ok(Some(t))
    })?;
    reader(lua, r, "headers", |lua, c, ()| {
        to_table(lua, c.request_headers())
    })?;
    // Answering.
    writer(
        lua,
        r,
        "respond",
        |_, c, (s, h, body): (f64, Option<Table>, Option<mlua::LuaString>)| {
            let body = body.map(|b| b.as_bytes().to_vec()).unwrap_or_default();
            c.respond(status(s)?, from_table(h)?, body);
            Ok(())
        },
    )?;
    reader(lua, r, "response_headers", |lua, c, ()| {
        match c.response_headers() {
            Some(h) => to_table(lua, h).map(Some),
            None => Ok(None),
        }
    })?;
    // Bodies (only when the file declares request_body / response_body = true).
    reader(lua, r, "request_body", |lua, c, ()| {
        match c.request_body() {
            Some(b) => lua.create_string(b).map(Some),
            None => Ok(None),
        }
    })?;
    writer(lua, r, "set_request_body", |_, c, b: mlua::LuaString| {
        c.set_request_body(b.as_bytes().to_vec());
        Ok(())
    })?;
    reader(lua, r, "response_body", |lua, c, ()| {
        match c.response_body() {
            Some(b) => lua.create_string(b).map(Some),
            None => Ok(None),
        }
    })?;
    writer(lua, r, "set_response_body", |_, c, b: mlua::LuaString| {
        c.set_response_body(b.as_bytes().to_vec());
        Ok(())
    })?;
    // The error stage: what failed.
    reader(lua, r, "failure", |lua, c, ()| match c.failure() {
        Some(f) => {
            let t = lua.create_table()?;
            t.set("filter", &*f.filter)?;
            t.set("stage", f.stage.as_str())?;
            t.set("message", f.message.as_str())?;
            Ok(Some(t))
        }
        None => Ok(None),
    })?;
    Ok(())
}
