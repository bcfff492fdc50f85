//! `string.find`, `string.match` and `string.gmatch` over [`crate::pattern`], as plain C
//! functions: they are called as LuaJIT's own are (no mlua callback machinery, no Lua
//! wrapper), and check their arguments and raise their errors with LuaJIT's own auxiliary
//! functions (`luaL_checklstring`, `luaL_checknumber`, `luaL_where` and `lua_error`), so
//! names and `file:line` in messages are LuaJIT's.
//!
//! **Soundness.** Each function has three steps. (1) It reads its arguments with the Lua
//! API, which may raise a Lua error (a bad argument, or no memory to convert a number to a
//! string); nothing of Rust's is alive yet. (2) Plain Rust ([`search`], [`next`]) works on
//! the argument strings' bytes and returns plain data ([`Found`]: no destructor), under
//! `catch_unwind` so no panic can unwind into LuaJIT. (3) It pushes the results or raises
//! the error; a push may raise too (no memory), again with nothing of Rust's alive. A Lua
//! error therefore only ever leaves these functions from frames that own nothing, whether
//! LuaJIT unwinds them or jumps over them.

use mlua::ffi;
use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::meter;
use crate::pattern::{self, Capture, Matcher, MAX_CAPTURES};

/// What a search found, as plain data (its captures are written to a caller's array).
#[derive(Clone, Copy)]
enum Found {
    Nothing,
    /// A match `s..e` with `n` captures (for `gmatch`, `next` is where the next search
    /// starts).
    At {
        s: usize,
        e: usize,
        next: usize,
        n: usize,
    },
    /// Raise this message at the caller's line.
    Fail(&'static str),
}

type Caps = [Capture; MAX_CAPTURES];

const NO_CAPS: Caps = [Capture::Position(0); MAX_CAPTURES];

/// `f`, with a panic (a bug) turned into an error instead of unwinding into LuaJIT.
fn guarded(f: impl FnOnce() -> Found) -> Found {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(Found::Fail("internal error in string matching"))
}

fn fail(e: pattern::Error) -> Found {
    match e {
        pattern::Error::Pattern(m) | pattern::Error::Spent(m) => Found::Fail(m),
    }
}

/// Where a search starts, from `init` (1-based, negative from the end), as LuaJIT's
/// `str_find_aux`: clamped into `0..=len`.
fn start(init: i32, len: usize) -> usize {
    let len = len as i64;
    let i = i64::from(init);
    let s = if i < 0 { i + len } else { i - 1 };
    s.clamp(0, len) as usize
}

/// The search of `string.find` (`find`) or `string.match`; the captures go to `caps`.
fn search(src: &[u8], pat: &[u8], init: i32, plain: bool, find: bool, caps: &mut Caps) -> Found {
    let from = start(init, src.len());
    if find && (plain || !pattern::has_specials(pat)) {
        let hay = &src[from..];
        let at = memchr::memmem::find(hay, pat);
        if let Err(m) = meter::charge_bytes(at.map_or(hay.len(), |i| i + pat.len())) {
            return Found::Fail(m);
        }
        return match at {
            Some(i) => Found::At {
                s: from + i,
                e: from + i + pat.len(),
                next: 0,
                n: 0,
            },
            None => Found::Nothing,
        };
    }
    let (pat, anchor) = match pat.strip_prefix(b"^") {
        Some(rest) => (rest, true),
        None => (pat, false),
    };
    let mut m = Matcher::new(src, pat);
    let r = m.find(from, anchor).and_then(|at| {
        let Some((s, e)) = at else {
            return Ok(Found::Nothing);
        };
        let n = m.capture_count(!find);
        for (i, c) in caps.iter_mut().enumerate().take(n) {
            *c = m.capture(i, s, e)?;
        }
        Ok(Found::At { s, e, next: 0, n })
    });
    match r.and_then(|f| m.finish().map(|()| f)) {
        Ok(f) => f,
        Err(e) => fail(e),
    }
}

/// The gmatch iterator's next match from `pos`; the captures go to `caps`.
fn next(src: &[u8], pat: &[u8], pos: usize, caps: &mut Caps) -> Found {
    let mut m = Matcher::new(src, pat);
    let r = pattern::next_match(&mut m, pos).and_then(|at| {
        let Some((s, e, next)) = at else {
            return Ok(Found::Nothing);
        };
        let n = m.capture_count(true);
        for (i, c) in caps.iter_mut().enumerate().take(n) {
            *c = m.capture(i, s, e)?;
        }
        Ok(Found::At { s, e, next, n })
    });
    match r.and_then(|f| m.finish().map(|()| f)) {
        Ok(f) => f,
        Err(e) => fail(e),
    }
}

/// The bytes of the string at stack index `idx`.
///
/// # Safety
/// `l` is a running Lua state, and the value at `idx` is a string (checked or converted by
/// the caller). The slice is valid while that value stays at `idx`: LuaJIT never moves a
/// string, and the stack slot keeps it from being collected.
unsafe fn bytes<'a>(l: *mut ffi::lua_State, idx: c_int) -> &'a [u8] {
    let mut len = 0;
    // SAFETY: the caller's contract; `lua_tolstring` of a string neither allocates nor raises.
    unsafe {
        let p = ffi::lua_tolstring(l, idx, &mut len);
        if p.is_null() {
            return &[];
        }
        std::slice::from_raw_parts(p.cast(), len)
    }
}

/// Argument `n`, which must be a string (a number is converted in place, as LuaJIT's).
///
/// # Safety
/// `l` is the state of a running C function; this may raise a Lua error, so nothing of the
/// caller's may need dropping.
unsafe fn check_string<'a>(l: *mut ffi::lua_State, n: c_int) -> &'a [u8] {
    // SAFETY: `luaL_checklstring` raises unless argument `n` is (now) a string.
    unsafe {
        ffi::luaL_checklstring(l, n, std::ptr::null_mut());
        bytes(l, n)
    }
}

/// Optional argument `n` as LuaJIT's `lj_lib_optint` reads it: `default` if absent or nil,
/// else a number (a numeric string converted), truncated; out of range is `i32::MIN`.
///
/// # Safety
/// As [`check_string`].
unsafe fn opt_int(l: *mut ffi::lua_State, n: c_int, default: i32) -> i32 {
    // SAFETY: `lua_type` only reads; `luaL_checknumber` raises unless argument `n` is a
    // number or a numeric string.
    let x = unsafe {
        if ffi::lua_type(l, n) <= ffi::LUA_TNIL {
            return default;
        }
        ffi::luaL_checknumber(l, n)
    };
    if x.is_nan() || x <= -2_147_483_649.0 || x >= 2_147_483_648.0 {
        i32::MIN
    } else {
        x as i32
    }
}

/// Raise `msg` at the caller's line, as LuaJIT's `lj_err_caller`.
///
/// # Safety
/// `l` is the state of a running C function, and nothing of the caller's needs dropping.
unsafe fn raise(l: *mut ffi::lua_State, msg: &'static str) -> ! {
    // SAFETY: the caller's contract; each call pushes onto the stack of a running function
    // (`luaL_where` and the message: two slots, within the LUA_MINSTACK a C function has).
    unsafe {
        ffi::luaL_where(l, 1);
        ffi::lua_pushlstring(l, msg.as_ptr().cast(), msg.len());
        ffi::lua_concat(l, 2);
        ffi::lua_error(l)
    }
}

/// Push the captures of `found` (or raise its error): how many values were pushed.
///
/// # Safety
/// As [`raise`]; `src` is the subject, still on the stack.
unsafe fn push(l: *mut ffi::lua_State, src: &[u8], found: Found, caps: &Caps, find: bool) -> c_int {
    // SAFETY: the caller's contract. `luaL_checkstack` makes room for every value pushed
    // (or raises); a string pushed is copied from `src`, which is alive on the stack.
    unsafe {
        let (s, e, n) = match found {
            Found::Nothing => {
                ffi::lua_pushnil(l);
                return 1;
            }
            Found::Fail(m) => raise(l, m),
            Found::At { s, e, n, .. } => (s, e, n),
        };
        ffi::luaL_checkstack(l, (n + 2) as c_int, c"too many captures".as_ptr());
        if find {
            ffi::lua_pushinteger(l, (s + 1) as ffi::lua_Integer);
            ffi::lua_pushinteger(l, e as ffi::lua_Integer);
        }
        for c in &caps[..n] {
            match *c {
                Capture::Text(a, b) => {
                    ffi::lua_pushlstring(l, src[a..b].as_ptr().cast(), b - a);
                }
                Capture::Position(p) => ffi::lua_pushinteger(l, p as ffi::lua_Integer),
            }
        }
        (n + if find { 2 } else { 0 }) as c_int
    }
}

/// `string.find(s, pattern, init, plain)` and `string.match(s, pattern, init)`.
///
/// # Safety
/// Called by Lua as a C function.
unsafe fn find_aux(l: *mut ffi::lua_State, find: bool) -> c_int {
    // SAFETY: called by Lua; see the module doc for why raising is sound at each step.
    unsafe {
        let src = check_string(l, 1);
        let pat = check_string(l, 2);
        let init = opt_int(l, 3, 1);
        let plain = find && ffi::lua_toboolean(l, 4) != 0;
        let mut caps = NO_CAPS;
        let found = guarded(|| search(src, pat, init, plain, find, &mut caps));
        push(l, src, found, &caps, find)
    }
}

/// `string.find`.
pub(crate) unsafe extern "C-unwind" fn find(l: *mut ffi::lua_State) -> c_int {
    // SAFETY: called by Lua as a C function.
    unsafe { find_aux(l, true) }
}

/// `string.match`.
pub(crate) unsafe extern "C-unwind" fn match_(l: *mut ffi::lua_State) -> c_int {
    // SAFETY: called by Lua as a C function.
    unsafe { find_aux(l, false) }
}

/// `string.gmatch(s, pattern)`: an iterator holding the subject, the pattern and the
/// position of the next search as its upvalues.
pub(crate) unsafe extern "C-unwind" fn gmatch(l: *mut ffi::lua_State) -> c_int {
    // SAFETY: called by Lua as a C function: the arguments are checked (converted to
    // strings, or an error raised) before anything else; three values are pushed into the
    // closure, within the LUA_MINSTACK slots a C function has.
    unsafe {
        check_string(l, 1);
        check_string(l, 2);
        ffi::lua_settop(l, 2);
        ffi::lua_pushinteger(l, 0);
        ffi::lua_pushcclosure(l, gmatch_next, 3);
        1
    }
}

/// The iterator `string.gmatch` returns.
unsafe extern "C-unwind" fn gmatch_next(l: *mut ffi::lua_State) -> c_int {
    // SAFETY: called by Lua as the C closure `gmatch` made: its upvalues are the subject
    // and the pattern (strings) and the position (a number). See the module doc for why
    // raising is sound.
    unsafe {
        let src = bytes(l, ffi::lua_upvalueindex(1));
        let pat = bytes(l, ffi::lua_upvalueindex(2));
        let pos = ffi::lua_tonumber(l, ffi::lua_upvalueindex(3)).max(0.0) as usize;
        let mut caps = NO_CAPS;
        let found = guarded(|| next(src, pat, pos, &mut caps));
        match found {
            Found::Nothing => {
                ffi::lua_pushinteger(l, (src.len() + 1) as ffi::lua_Integer);
                ffi::lua_replace(l, ffi::lua_upvalueindex(3));
                0
            }
            Found::At { next, .. } => {
                ffi::lua_pushinteger(l, next as ffi::lua_Integer);
                ffi::lua_replace(l, ffi::lua_upvalueindex(3));
                push(l, src, found, &caps, false)
            }
            Found::Fail(m) => raise(l, m),
        }
    }
}
