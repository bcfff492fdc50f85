//! `string.gsub(s, pattern, repl, n)` over [`crate::pattern`], as LuaJIT's: `repl` a string
//! (with `%0`-`%9` and `%%`) or number, a table (indexed by the first capture) or a
//! function (called with the captures); a nil or false replacement keeps the match. The
//! result is built here, outside the VM's allocator, so it is charged by its size as it
//! grows and may not exceed the VM's memory cap.

use mlua::{Function, Lua, LuaString, MultiValue, Table, Value};

use crate::meter;
use crate::pattern::{Capture, Matcher};
use crate::strlib::{capture_value, int_arg, string_arg, Fail, Nested};

/// The result is charged each time it has grown by this many bytes.
const CHARGE_EVERY: usize = 16 * 1024;

enum Repl {
    Text(LuaString),
    Table(Table),
    Call(Function),
}

/// The result being built: its bytes, and how many of them are charged.
struct Out {
    buf: Vec<u8>,
    charged: usize,
    limit: usize,
}

impl Out {
    fn push(&mut self, bytes: &[u8]) -> Result<(), Fail> {
        if self.buf.len() + bytes.len() > self.limit {
            return Err(Fail::Raise("not enough memory".into()));
        }
        self.buf.extend_from_slice(bytes);
        if self.buf.len() - self.charged >= CHARGE_EVERY {
            self.charge()?;
        }
        Ok(())
    }

    fn charge(&mut self) -> Result<(), Fail> {
        let n = self.buf.len() - self.charged;
        self.charged = self.buf.len();
        meter::charge_bytes(n).map_err(|m| Fail::Raise(m.into()))
    }
}

fn replacement(lua: &Lua, a: &MultiValue) -> Result<Repl, Fail> {
    match a.get(2) {
        Some(Value::String(s)) => Ok(Repl::Text(s.clone())),
        Some(v @ (Value::Integer(_) | Value::Number(_))) => lua
            .coerce_string(v.clone())?
            .map(Repl::Text)
            .ok_or_else(|| Fail::Raise("bad argument #3 to 'gsub'".into())),
        Some(Value::Table(t)) => Ok(Repl::Table(t.clone())),
        Some(Value::Function(f)) => Ok(Repl::Call(f.clone())),
        _ => Err(Fail::Raise(
            "bad argument #3 to 'gsub' (string/function/table expected)".into(),
        )),
    }
}

/// `string.gsub`: the new string and the number of matches replaced.
pub(crate) fn gsub(lua: &Lua, a: &MultiValue, memory_limit: usize) -> Result<MultiValue, Fail> {
    let s = string_arg(lua, a, 0, "gsub")?;
    let p = string_arg(lua, a, 1, "gsub")?;
    let src = s.as_bytes();
    let default_max = i32::try_from(src.len() + 1).unwrap_or(i32::MAX);
    let max = int_arg(lua, a, 3, "gsub", default_max)?;
    let repl = replacement(lua, a)?;
    let pat = p.as_bytes();
    let (pat, anchor) = match pat.strip_prefix(b"^") {
        Some(rest) => (rest, true),
        None => (&pat[..], false),
    };
    let mut m = Matcher::new(&src, pat);
    let mut out = Out {
        buf: Vec::new(),
        charged: 0,
        limit: memory_limit,
    };
    let (mut at, mut n) = (0usize, 0i32);
    while n < max {
        let e = m.at(at)?;
        if let Some(e) = e {
            n += 1;
            add_value(lua, &mut m, &mut out, &src, (at, e), &repl)?;
        }
        match e {
            Some(e) if e > at => at = e,
            _ if at < src.len() => {
                out.push(&src[at..at + 1])?;
                at += 1;
            }
            _ => break,
        }
        if anchor {
            break;
        }
    }
    out.push(&src[at..])?;
    out.charge()?;
    m.finish()?;
    let mut r = MultiValue::new();
    r.push_back(Value::String(lua.create_string(&out.buf)?));
    r.push_back(Value::Integer(i64::from(n)));
    Ok(r)
}

/// Append the replacement of the match `whole` (start, end) to `out`.
fn add_value(
    lua: &Lua,
    m: &mut Matcher<'_>,
    out: &mut Out,
    src: &[u8],
    whole: (usize, usize),
    repl: &Repl,
) -> Result<(), Fail> {
    let (s, e) = whole;
    let v = match repl {
        Repl::Text(t) => return add_text(m, out, src, whole, &t.as_bytes()),
        Repl::Table(t) => {
            let key = capture_value(lua, src, m.capture(0, s, e)?)?;
            let _nested = Nested::enter()?;
            t.get::<Value>(key)?
        }
        Repl::Call(f) => {
            let mut args = MultiValue::new();
            for i in 0..m.capture_count(true) {
                args.push_back(capture_value(lua, src, m.capture(i, s, e)?)?);
            }
            let _nested = Nested::enter()?;
            f.call::<Value>(args)?
        }
    };
    match v {
        Value::Nil | Value::Boolean(false) => out.push(&src[s..e]),
        Value::String(v) => out.push(&v.as_bytes()),
        v @ (Value::Integer(_) | Value::Number(_)) => match lua.coerce_string(v)? {
            Some(v) => out.push(&v.as_bytes()),
            None => Ok(()),
        },
        other => Err(Fail::Raise(format!(
            "invalid replacement value (a {})",
            match other {
                Value::LightUserData(_) | Value::UserData(_) | Value::Error(_) => "userdata",
                Value::Other(_) => "cdata",
                v => v.type_name(),
            }
        ))),
    }
}

/// A string replacement: `%0` the match, `%1`-`%9` a capture, `%` before anything else
/// that character (a trailing `%` adds a NUL byte, as in C).
fn add_text(
    m: &Matcher<'_>,
    out: &mut Out,
    src: &[u8],
    (s, e): (usize, usize),
    t: &[u8],
) -> Result<(), Fail> {
    let mut i = 0;
    while i < t.len() {
        let start = i;
        while i < t.len() && t[i] != b'%' {
            i += 1;
        }
        out.push(&t[start..i])?;
        if i >= t.len() {
            break;
        }
        let c = t.get(i + 1).copied().unwrap_or(0);
        i += 2;
        match c {
            b'0' => out.push(&src[s..e])?,
            b'1'..=b'9' => match m.capture(usize::from(c - b'1'), s, e)? {
                Capture::Text(a, b) => out.push(&src[a..b])?,
                Capture::Position(p) => out.push(p.to_string().as_bytes())?,
            },
            c => out.push(&[c])?,
        }
    }
    Ok(())
}
