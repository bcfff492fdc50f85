//! The `ctx` methods that take and return plain values (strings, numbers, booleans), as Lua
//! C functions. A filter calls one or two of them per run, and mlua's generic callback path
//! (a boxed closure behind a trampoline, a stack guard, per-argument conversion through
//! mlua's value machinery) cost several hundred instructions per call; these read their
//! arguments straight off the Lua stack. The methods that build or read tables and bodies
//! stay mlua callbacks (`ctx.rs`).
//!
//! The shape of every method: [`method!`] makes the C function. It coerces number
//! arguments to strings in place (Lua's own rule), runs the body under `catch_unwind`
//! with nothing but the stack pointer, then pushes the body's result or raises its error
//! — both after the body has returned, when no Rust value with a destructor is alive, so
//! a Lua error (which unwinds past this frame) never skips one.

use http::header::{HeaderName, HeaderValue};
use http::StatusCode;
use keymaster_filter::FilterCtx;
use mlua::ffi::{self, lua_State};
use std::ffi::c_int;
use std::sync::Arc;

use crate::ctx::{get, join, with_mut, with_ref, ParseArg, Unreachable};

/// What a method returns to Lua.
enum Out {
    Nothing,
    Nil,
    Str(String),
    Static(&'static str),
    Int(i64),
    Bool(bool),
}

impl From<Option<String>> for Out {
    fn from(s: Option<String>) -> Out {
        s.map_or(Out::Nil, Out::Str)
    }
}

/// A method body: reads its arguments from the stack of `l` (already checked: a `ctx`
/// receiver at 1) and works on the lent context. Each method's body is compiled into its
/// own C function ([`run`] is generic over it): no call through a pointer per method call.
trait Body: Fn(Stack) -> Result<Out, Failed> {}
impl<F: Fn(Stack) -> Result<Out, Failed>> Body for F {}

/// The running method call's stack, for reading arguments.
#[derive(Clone, Copy)]
struct Stack(*mut lua_State);

impl Stack {
    /// Argument `i` (2 is the first after the receiver) as bytes: `Ok(None)` if it is not
    /// a string, [`Failed::Number`] if it is a number (`run` converts and runs again).
    #[inline]
    fn bytes(&self, i: c_int) -> Result<Option<&[u8]>, Failed> {
        // SAFETY: `self.0` is the state of the C function call running now (made by
        // `method!` from the pointer Lua passed in), and `i` is a positive index, valid
        // for any stack (an index past the top reads as none). For a string `lua_tolstring`
        // only returns a pointer to its bytes and their length (no conversion, no
        // allocation, nothing that can raise); the string is on the stack, so it lives
        // until the call returns, past every use of the slice, which borrows `self`.
        unsafe {
            match ffi::lua_type(self.0, i) {
                ffi::LUA_TSTRING => {}
                ffi::LUA_TNUMBER => return Err(Failed::Number),
                _ => return Ok(None),
            }
            let mut len = 0;
            let data = ffi::lua_tolstring(self.0, i, &mut len);
            Ok(Some(std::slice::from_raw_parts(data.cast::<u8>(), len)))
        }
    }

    fn is_nil(&self, i: c_int) -> bool {
        // SAFETY: as in `bytes`; `lua_type` only reads the slot's tag.
        unsafe { ffi::lua_type(self.0, i) <= ffi::LUA_TNIL }
    }

    fn number(&self, i: c_int) -> Option<f64> {
        // SAFETY: as in `bytes`; `lua_tonumber` of a string that is not a number returns
        // 0 without raising (strings holding numbers convert like Lua does).
        unsafe {
            match ffi::lua_type(self.0, i) {
                ffi::LUA_TNUMBER | ffi::LUA_TSTRING if ffi::lua_isnumber(self.0, i) != 0 => {
                    Some(ffi::lua_tonumber(self.0, i))
                }
                _ => None,
            }
        }
    }

    /// Argument `i` parsed as `T` (header name or value, cluster name).
    #[inline]
    fn arg<T: ParseArg>(&self, i: c_int) -> Result<T, Failed> {
        Ok(T::parse(
            self.bytes(i)?.ok_or_else(|| expected(i, "a string"))?,
        )?)
    }

    fn string(&self, i: c_int) -> Result<String, Failed> {
        let b = self.bytes(i)?.ok_or_else(|| expected(i, "a string"))?;
        String::from_utf8(b.to_vec()).map_err(|_| expected(i, "a UTF-8 string").into())
    }

    fn status(&self, i: c_int) -> Result<StatusCode, Failed> {
        let n = self.number(i).ok_or_else(|| expected(i, "a status code"))?;
        Ok(crate::ctx::status(n)?)
    }
}

fn expected(i: c_int, what: &str) -> mlua::Error {
    mlua::Error::runtime(format!("argument #{} must be {what}", i - 1))
}

/// Make `$body` a Lua C function named `$name`.
macro_rules! method {
    ($name:ident, $body:expr) => {
        unsafe extern "C-unwind" fn $name(l: *mut lua_State) -> c_int {
            // SAFETY: Lua calls this with its state for this call (the contract of
            // `lua_CFunction`); `run` documents the rest.
            unsafe { run(l, $body) }
        }
    };
}

/// The body of every method's C function: see the module doc.
///
/// # Safety
/// `l` must be the state Lua passed to the running C function.
#[inline(always)]
unsafe fn run(l: *mut lua_State, body: impl Body) -> c_int {
    // SAFETY (this block and the ones below): `l` is the running call's state. Every API
    // function used takes valid (positive, present) indices, and pushes at most two values
    // (within the LUA_MINSTACK slots a C function is guaranteed). Those that can raise a
    // Lua error (`lua_tolstring` converting a number, the pushes, `luaL_where`,
    // `lua_concat`, `lua_error` itself) unwind past this frame, which is sound: they run
    // outside `catch_unwind`, and at most a result string is then alive (pushing it can
    // fail only for want of memory), which that unwinding may leak, never use.
    let mut result = if unsafe { ffi::lua_type(l, 1) } == ffi::LUA_TTABLE {
        attempt(l, &body)
    } else {
        Err(Failed::from(mlua::Error::runtime(
            "call ctx methods with a colon: ctx:method(...)",
        )))
    };
    if let Err(Failed::Number) = result {
        // A number where a string is read: convert the numbers in place (Lua's own
        // coercion, which may allocate, so not inside the body) and run the body again.
        // Bodies read all their arguments before they touch the context, so the first run
        // changed nothing.
        unsafe { numbers_to_strings(l) };
        result = attempt(l, &body);
    }
    if let Ok(Out::Nothing) = result {
        return 0; // the common case of a changing method: no result, nothing to push
    }
    unsafe { finish(l, result) }
}

/// Lua's coercion of the number arguments of the running call to strings, in place.
///
/// # Safety
/// As [`run`]'s.
#[cold]
unsafe fn numbers_to_strings(l: *mut lua_State) {
    // SAFETY: as in `run`.
    for i in 2..=unsafe { ffi::lua_gettop(l) } {
        if unsafe { ffi::lua_type(l, i) } == ffi::LUA_TNUMBER {
            unsafe { ffi::lua_tolstring(l, i, std::ptr::null_mut()) };
        }
    }
}

/// Push a body's result, or raise its error, and return the count of results.
///
/// # Safety
/// As [`run`]'s.
unsafe fn finish(l: *mut lua_State, result: Result<Out, Failed>) -> c_int {
    // SAFETY: as in `run`.
    let out = match result {
        Ok(out) => out,
        Err(f) => {
            let msg = match f {
                Failed::Error(e) => e.to_string(),
                Failed::Number => "argument conversion failed".to_string(),
            };
            unsafe {
                ffi::luaL_where(l, 1);
                ffi::lua_pushlstring(l, msg.as_ptr().cast(), msg.len());
            }
            drop(msg);
            unsafe {
                ffi::lua_concat(l, 2);
                ffi::lua_error(l)
            }
        }
    };
    match out {
        Out::Nothing => 0,
        Out::Nil => {
            unsafe { ffi::lua_pushnil(l) };
            1
        }
        Out::Str(s) => {
            unsafe { ffi::lua_pushlstring(l, s.as_ptr().cast(), s.len()) };
            1
        }
        Out::Static(s) => {
            unsafe { ffi::lua_pushlstring(l, s.as_ptr().cast(), s.len()) };
            1
        }
        Out::Int(n) => {
            unsafe { ffi::lua_pushinteger(l, n as ffi::lua_Integer) };
            1
        }
        Out::Bool(b) => {
            unsafe { ffi::lua_pushboolean(l, c_int::from(b)) };
            1
        }
    }
}

/// Why a body did not finish (small: the successful result is what is moved around).
enum Failed {
    Error(Box<mlua::Error>),
    /// An argument read as a string is a number (see `run`).
    Number,
}

impl From<mlua::Error> for Failed {
    #[cold]
    fn from(e: mlua::Error) -> Failed {
        Failed::Error(Box::new(e))
    }
}

impl From<Box<mlua::Error>> for Failed {
    fn from(e: Box<mlua::Error>) -> Failed {
        Failed::Error(e)
    }
}

impl From<Unreachable> for Failed {
    #[cold]
    fn from(u: Unreachable) -> Failed {
        Failed::Error(Box::new(u.into()))
    }
}

/// One run of `body`, a panic caught as an error.
#[inline(always)]
fn attempt(l: *mut lua_State, body: &impl Body) -> Result<Out, Failed> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(Stack(l))))
        .unwrap_or_else(|_| Err(mlua::Error::runtime("ctx method panicked").into()))
}

fn read(f: impl FnOnce(&FilterCtx<'_>) -> Out) -> Result<Out, Failed> {
    Ok(with_ref(f)?)
}

fn write(f: impl FnOnce(&mut FilterCtx<'_>)) -> Result<Out, Failed> {
    with_mut(f)?;
    Ok(Out::Nothing)
}

// Request facts.
method!(stage, |_| read(|c| Out::Static(c.stage().as_str())));
method!(method_, |_| read(|c| Out::Str(
    c.method().as_str().to_string()
)));
method!(path, |_| read(|c| Out::Str(c.path().to_string())));
method!(query, |_| read(|c| c.query().map(str::to_string).into()));
method!(route, |_| read(|c| Out::Str(c.route().to_string())));
method!(client_ip, |_| read(|c| Out::Str(c.client_ip().to_string())));
method!(client_port, |_| read(|c| Out::Int(
    c.client_addr().port().into()
)));
// Request headers.
method!(header, |s| {
    let n = s.string(2)?;
    read(|c| join(c.request_header_values(&n)).into())
});
method!(set_header, |s| {
    let (n, v): (HeaderName, HeaderValue) = (s.arg(2)?, s.arg(3)?);
    write(|c| c.set_request_header(n, v))
});
method!(add_header, |s| {
    let (n, v): (HeaderName, HeaderValue) = (s.arg(2)?, s.arg(3)?);
    write(|c| c.append_request_header(n, v))
});
method!(remove_header, |s| {
    let n: HeaderName = s.arg(2)?;
    write(|c| c.remove_request_header(&n))
});
// Per-request values shared by the filters of one request.
method!(meta, |s| {
    let k = s.string(2)?;
    read(|c| c.meta().get(&k).cloned().into())
});
method!(set_meta, |s| {
    let k = s.string(2)?;
    let v = if s.is_nil(3) {
        None
    } else {
        Some(s.string(3)?)
    };
    write(|c| {
        match v {
            Some(v) => c.meta_mut().insert(k, v),
            None => c.meta_mut().remove(&k),
        };
    })
});
// Routing.
method!(cluster, |_| read(|c| c
    .upstream_cluster()
    .map(str::to_string)
    .into()));
method!(set_cluster, |s| {
    let n: Arc<str> = s.arg(2)?;
    write(|c| c.set_cluster(n))
});
method!(set_upstream_path, |s| {
    let p = s.string(2)?;
    if !p.starts_with('/') || http::uri::PathAndQuery::try_from(p.as_str()).is_err() {
        let e = format!("invalid upstream path {p:?}: an origin-form path and query, from '/'");
        return Err(mlua::Error::runtime(e).into());
    }
    write(|c| c.set_upstream_path(p))
});
method!(set_upstream_host, |s| {
    let h: HeaderValue = s.arg(2)?;
    write(|c| c.set_upstream_host(h))
});
method!(responded, |_| read(|c| Out::Bool(c.responded())));
// The response (post, and error after a proxy failure).
method!(response_status, |_| read(|c| match c.response_status() {
    Some(s) => Out::Int(s.as_u16().into()),
    None => Out::Nil,
}));
method!(set_response_status, |s| {
    let st = s.status(2)?;
    write(|c| c.set_response_status(st))
});
method!(response_header, |s| {
    let n = s.string(2)?;
    read(|c| c.response_headers().and_then(|h| get(h, &n)).into())
});
method!(set_response_header, |s| {
    let (n, v): (HeaderName, HeaderValue) = (s.arg(2)?, s.arg(3)?);
    write(|c| {
        if let Some(h) = c.response_headers_mut() {
            h.insert(n, v);
        }
    })
});
method!(add_response_header, |s| {
    let (n, v): (HeaderName, HeaderValue) = (s.arg(2)?, s.arg(3)?);
    write(|c| c.append_response_header(n, v))
});
method!(remove_response_header, |s| {
    let n: HeaderName = s.arg(2)?;
    write(|c| {
        if let Some(h) = c.response_headers_mut() {
            h.remove(n);
        }
    })
});

/// Add these methods to the methods table `t`.
pub(crate) fn register(lua: &mlua::Lua, t: &mlua::Table) -> mlua::Result<()> {
    let all: [(&str, ffi::lua_CFunction); 24] = [
        ("stage", stage),
        ("method", method_),
        ("path", path),
        ("query", query),
        ("route", route),
        ("client_ip", client_ip),
        ("client_port", client_port),
        ("header", header),
        ("set_header", set_header),
        ("add_header", add_header),
        ("remove_header", remove_header),
        ("meta", meta),
        ("set_meta", set_meta),
        ("cluster", cluster),
        ("set_cluster", set_cluster),
        ("set_upstream_path", set_upstream_path),
        ("set_upstream_host", set_upstream_host),
        ("responded", responded),
        ("response_status", response_status),
        ("set_response_status", set_response_status),
        ("response_header", response_header),
        ("set_response_header", set_response_header),
        ("add_response_header", add_response_header),
        ("remove_response_header", remove_response_header),
    ];
    for (name, f) in all {
        // SAFETY: each `f` follows the `lua_CFunction` contract: it uses only the state
        // it is given, keeps its stack use within Lua's guaranteed minimum (LUA_MINSTACK
        // slots: it pushes at most two values), and returns the number of results it
        // pushed.
        t.raw_set(name, unsafe { lua.create_c_function(f) }?)?;
    }
    Ok(())
}
