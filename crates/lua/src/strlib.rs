//! keymaster's replacements for the string functions whose work the count hook cannot see:
//! they charge the running call's meter ([`crate::meter`]) for the work they do.
//!
//! - `string.find`, `match`, `gmatch` ([`crate::cfind`], C functions) and `gsub`
//!   ([`crate::gsub`]): Rust ([`crate::pattern`]), one instruction per match step. A plain
//!   `find` (the `plain` flag, or a pattern without special characters) is a
//!   `memchr::memmem` search charged per [`BYTES_PER_INSTRUCTION`] bytes scanned. `gsub`'s
//!   result is charged by its size and may not exceed the VM's memory cap.
//! - `string.rep`: its result's size is known before it is built: charged first, and refused
//!   past the VM's memory cap.
//! - `string.upper`, `lower`, `reverse`: charged for their input's size first.
//! - `string.format`: charged first for an estimate of its result's size (its string
//!   arguments' lengths, 32 bytes for any other argument).
//! - `table.concat`: charged for its result's size and one instruction per element once it
//!   is built (a single call is bounded by the memory cap).
//! - `table.sort`: charged `n * ceil(log2 n)` (its comparisons) first.
//!
//! Charges under [`SMALL`] bytes are skipped: the wrapper's own instructions cover them.
//!
//! Calls from these functions back into Lua (a `gsub` replacement function or table,
//! `__tostring` under `format`, a `sort` comparator) nest at most [`MAX_NESTED`] deep, else
//! "C stack overflow": LuaJIT does not bound that nesting, and each level holds C and Rust
//! frames on the worker thread's stack.
//!
//! They replace the functions in the real `string` and `table` tables, before the sandbox
//! copies them, so `s:find(...)` (through the string metatable's `__index`) runs them too.
//! Errors (a malformed pattern, a bad argument, a spent budget) are raised as LuaJIT raises
//! them, a string `file:line: message` at the caller's line: by the C functions themselves,
//! or by a thin Lua wrapper around the others.

use mlua::{Function, LightUserData, Lua, LuaString, MultiValue, Table, Value};

use crate::meter::{self, BYTES_PER_INSTRUCTION};
use crate::pattern::{self, Capture};

/// Results under this many bytes are not charged (see the module doc).
pub const SMALL: usize = 256;
/// How deep calls from these functions into Lua (a `gsub` replacement function or table,
/// `__tostring` under `format`, a `sort` comparator) may nest: each level holds C and Rust
/// frames on the worker's stack, which LuaJIT does not limit (a recursive `gsub` callback
/// overflowed a 2 MiB thread stack and aborted the process).
pub const MAX_NESTED: u32 = 32;
/// The error past [`MAX_NESTED`] (Lua 5.1's message for the same limit).
pub const NESTED_MSG: &str = "C stack overflow";

thread_local! {
    /// Calls into Lua from these functions now open on this thread.
    static NESTED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// One more call into Lua from a string function, until the guard is dropped.
pub(crate) struct Nested(());

impl Nested {
    pub(crate) fn enter() -> Result<Nested, Fail> {
        NESTED.with(|n| {
            if n.get() >= MAX_NESTED {
                return Err(Fail::Raise(NESTED_MSG.into()));
            }
            n.set(n.get() + 1);
            Ok(Nested(()))
        })
    }
}

impl Drop for Nested {
    fn drop(&mut self) {
        NESTED.with(|n| n.set(n.get().saturating_sub(1)));
    }
}

/// The marker a Rust function returns first when the wrapper must raise its second result.
static FAIL_MARK: u8 = 0;

fn fail_mark() -> Value {
    Value::LightUserData(LightUserData(
        std::ptr::addr_of!(FAIL_MARK).cast_mut().cast(),
    ))
}

/// Why a string function did not return.
pub(crate) enum Fail {
    /// Raise this message at the caller's line (through the Lua wrapper).
    Raise(String),
    /// An error of Lua code the function called (a `gsub` replacement function): passed on.
    Lua(mlua::Error),
}

impl From<mlua::Error> for Fail {
    fn from(e: mlua::Error) -> Fail {
        Fail::Lua(e)
    }
}

impl From<pattern::Error> for Fail {
    fn from(e: pattern::Error) -> Fail {
        match e {
            pattern::Error::Pattern(m) | pattern::Error::Spent(m) => Fail::Raise(m.to_string()),
        }
    }
}

type Res<T> = Result<T, Fail>;

/// A Rust function's result as the wrapper expects it: the values, or the marker and the
/// message to raise.
fn answer(lua: &Lua, r: Res<MultiValue>) -> mlua::Result<MultiValue> {
    match r {
        Ok(v) => Ok(v),
        Err(Fail::Raise(m)) => Ok(MultiValue::from_vec(vec![
            fail_mark(),
            Value::String(lua.create_string(m)?),
        ])),
        Err(Fail::Lua(e)) => Err(e),
    }
}

/// Replace the functions in `lua`'s `string` and `table` libraries. `memory_limit` caps the
/// results built outside the VM's allocator (`gsub`) and announced up front (`rep`).
pub(crate) fn install(lua: &Lua, memory_limit: usize) -> mlua::Result<()> {
    let rs = lua.create_table()?;
    rs.set(
        "gsub",
        lua.create_function(move |lua, a: MultiValue| {
            answer(lua, crate::gsub::gsub(lua, &a, memory_limit))
        })?,
    )?;
    rs.set(
        "charge",
        lua.create_function(|lua, n: f64| {
            let n = if n.is_finite() && n > 0.0 {
                n as u64
            } else {
                0
            };
            answer(
                lua,
                meter::charge(n).map(|()| MultiValue::new()).map_err(raise),
            )
        })?,
    )?;
    // `enter` and `leave` bracket a call of `format` or `sort` that may run Lua code.
    rs.set(
        "enter",
        lua.create_function(|lua, ()| {
            answer(
                lua,
                Nested::enter().map(|g| {
                    std::mem::forget(g);
                    MultiValue::new()
                }),
            )
        })?,
    )?;
    rs.set(
        "leave",
        lua.create_function(|_, ()| {
            drop(Nested(()));
            Ok(())
        })?,
    )?;
    rs.set(
        "rep_check",
        lua.create_function(move |lua, a: MultiValue| {
            answer(lua, rep_check(lua, &a, memory_limit))
        })?,
    )?;
    let g = lua.globals();
    let string: Table = g.get("string")?;
    // SAFETY: each is a C function written for LuaJIT's API (see `crate::cfind`).
    unsafe {
        string.set("find", lua.create_c_function(crate::cfind::find)?)?;
        string.set("match", lua.create_c_function(crate::cfind::match_)?)?;
        string.set("gmatch", lua.create_c_function(crate::cfind::gmatch)?)?;
    }
    lua.load(SHIM).set_name("=keymaster-strlib").call::<()>((
        g.get::<Table>("string")?,
        g.get::<Table>("table")?,
        rs,
        fail_mark(),
        g.get::<Function>("pcall")?,
        BYTES_PER_INSTRUCTION,
        SMALL,
    ))
}

/// The Lua side: each replaced function raises a returned failure at its caller's line.
const SHIM: &str = r#"
local S, T, rs, FAIL, pcall, PER, SMALL = ...
local error, type, tonumber, select = error, type, tonumber, select
local ceil, log = math.ceil, math.log
local gsub, charge = rs.gsub, rs.charge
local rep_check, enter, leave = rs.rep_check, rs.enter, rs.leave
local rep, upper, lower, reverse, format = S.rep, S.upper, S.lower, S.reverse, S.format
local concat, sort, c_gsub = T.concat, T.sort, S.gsub
-- Tail-called by the wrappers: level 2 is the wrapper's caller.
local function check(x, ...)
  if x == FAIL then error((...), 2) end
  return x, ...
end
-- Called (not tail-called) by a wrapper: level 3 is the wrapper's caller.
local function pre(x, m)
  if x == FAIL then error(m, 3) end
end
-- A C function run by pcall cannot say where it was called, nor name itself in an argument
-- error: its own errors (all start so) get both back; errors of Lua code it ran keep theirs.
local function own(e, name)
  if type(e) == "string" and (e:sub(1, 13) == "bad argument " or e:sub(1, 8) == "invalid ") then
    return (c_gsub(e, "^(bad argument #%d+ to )'%?'", "%1'" .. name .. "'")), 2
  end
  return e, 0
end
S.gsub = function(...) return check(gsub(...)) end
S.rep = function(...)
  pre(rep_check(...))
  return rep(...)
end
local function sized(f)
  return function(...)
    local s = ...
    if type(s) == "string" and #s >= SMALL then pre(charge(#s / PER)) end
    return f(...)
  end
end
S.upper, S.lower, S.reverse = sized(upper), sized(lower), sized(reverse)
-- The result's size is estimated first (a string argument's length, 32 bytes for any other
-- value: widths and precisions are at most 99), so `format` itself is tail-called and raises
-- its own errors at the caller's line.
S.format = function(...)
  local size, plain = 0, true
  for i = 1, select('#', ...) do
    local v = select(i, ...)
    local t = type(v)
    size = size + (t == "string" and #v or 32)
    plain = plain and (t == "string" or t == "number")
  end
  if size >= SMALL then pre(charge(size / PER)) end
  if plain then return format(...) end
  -- Another value may have a `__tostring` that calls `format` again: one more nested call.
  pre(enter())
  local ok, s = pcall(format, ...)
  leave()
  if not ok then error(own(s, "format")) end
  return s
end
T.concat = function(...)
  local ok, s = pcall(concat, ...)
  if not ok then error(own(s, "concat")) end
  local t, _, i, j = ...
  local n = (tonumber(j) or #t) - (tonumber(i) or 1) + 1
  if #s >= SMALL or n * PER >= SMALL then pre(charge(#s / PER + n)) end
  return s
end
T.sort = function(...)
  local t, less = ...
  if type(t) == "table" then
    local n = #t
    if n > 16 then pre(charge(n * ceil(log(n) / log(2)))) end
  end
  if less == nil then return sort(...) end
  -- The comparator may sort again: one more nested call.
  pre(enter())
  local ok, e = pcall(sort, ...)
  leave()
  if not ok then error(own(e, "sort")) end
end
"#;

fn raise(m: &str) -> Fail {
    Fail::Raise(m.to_string())
}

/// Lua's type name of `v` (`None`: the argument is missing).
fn type_name(v: Option<&Value>) -> &'static str {
    match v {
        None => "no value",
        Some(Value::Integer(_) | Value::Number(_)) => "number",
        Some(Value::LightUserData(_) | Value::UserData(_) | Value::Error(_)) => "userdata",
        Some(Value::Other(_)) => "cdata",
        Some(v) => v.type_name(),
    }
}

fn bad_argument(i: usize, f: &str, expected: &str, got: Option<&Value>) -> Fail {
    Fail::Raise(format!(
        "bad argument #{} to '{f}' ({expected} expected, got {})",
        i + 1,
        type_name(got)
    ))
}

/// Argument `i` as a string (a number is converted, as LuaJIT's `lj_lib_checkstr`).
pub(crate) fn string_arg(lua: &Lua, a: &MultiValue, i: usize, f: &str) -> Res<LuaString> {
    match a.get(i) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v @ (Value::Integer(_) | Value::Number(_))) => lua
            .coerce_string(v.clone())?
            .ok_or_else(|| bad_argument(i, f, "string", Some(v))),
        other => Err(bad_argument(i, f, "string", other)),
    }
}

/// Optional argument `i` as a 32-bit integer, `default` if nil or missing (as LuaJIT's
/// `lj_lib_optint`: a numeric string is converted, a fraction truncated, and an out of
/// range number is `i32::MIN`).
pub(crate) fn int_arg(lua: &Lua, a: &MultiValue, i: usize, f: &str, default: i32) -> Res<i32> {
    let n = match a.get(i) {
        None | Some(Value::Nil) => return Ok(default),
        Some(Value::Integer(n)) => *n as f64,
        Some(Value::Number(n)) => *n,
        Some(v @ Value::String(_)) => lua
            .coerce_number(v.clone())?
            .ok_or_else(|| bad_argument(i, f, "number", Some(v)))?,
        other => return Err(bad_argument(i, f, "number", other)),
    };
    Ok(
        if n.is_nan() || n <= -2_147_483_649.0 || n >= 2_147_483_648.0 {
            i32::MIN
        } else {
            n as i32
        },
    )
}

/// A capture as a Lua value.
pub(crate) fn capture_value(lua: &Lua, src: &[u8], c: Capture) -> mlua::Result<Value> {
    Ok(match c {
        Capture::Text(a, b) => Value::String(lua.create_string(&src[a..b])?),
        Capture::Position(p) => Value::Integer(p as i64),
    })
}

/// `string.rep(s, n, sep)` before it runs: charge its result's size, or refuse it past the
/// memory cap. Arguments of the wrong type are left to `string.rep` itself to report.
fn rep_check(lua: &Lua, a: &MultiValue, memory_limit: usize) -> Res<MultiValue> {
    let length = |i: usize| -> Res<Option<u128>> {
        Ok(match a.get(i) {
            None | Some(Value::Nil) => Some(0),
            Some(v @ (Value::String(_) | Value::Integer(_) | Value::Number(_))) => lua
                .coerce_string(v.clone())?
                .map(|s| s.as_bytes().len() as u128),
            Some(_) => None,
        })
    };
    let n = match int_arg(lua, a, 1, "rep", 0) {
        Ok(n) if n > 0 => n as u128,
        _ => return Ok(MultiValue::new()),
    };
    let (Some(s), Some(sep)) = (length(0)?, length(2)?) else {
        return Ok(MultiValue::new());
    };
    let total = s * n + sep * (n - 1);
    if total > memory_limit as u128 {
        return Err(Fail::Raise(format!(
            "string.rep: a result of {total} bytes is over the VM's memory limit \
             ({memory_limit} bytes)"
        )));
    }
    meter::charge_bytes(total as usize).map_err(raise)?;
    Ok(MultiValue::new())
}

#[cfg(test)]
#[path = "strlib_tests.rs"]
mod tests;
