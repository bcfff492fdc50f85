//! The replaced string functions against LuaJIT's own: every case is run through both in
//! one VM (the originals are kept before they are replaced), and the results, or the error
//! messages, must be the same.

use super::*;
use crate::meter::{with_limits, Limits, BUDGET_MSG};
use std::time::{Duration, Instant};

/// A plain VM with the originals kept as `O` and the replacements installed.
fn vm() -> Lua {
    let lua = Lua::new();
    lua.load(
        "O = { find = string.find, match = string.match, gmatch = string.gmatch, \
         gsub = string.gsub, rep = string.rep, format = string.format, \
         concat = table.concat, upper = string.upper }",
    )
    .exec()
    .unwrap();
    install(&lua, 64 << 20).unwrap();
    lua
}

/// Subject, pattern, init, plain: Lua 5.1's `pm.lua` cases and more (classes, sets, anchors,
/// captures, back-references, `%b`, `%f`, `init`, `plain`, NUL bytes, every error).
const CASES: &str = r#"
local big = string.rep("a", 300)
return {
  {"", ""}, {"alo", ""}, {"a\0o a\0o a\0o", "a", 1}, {"a\0o a\0o a\0o", "a\0o", 2},
  {"a\0o a\0o a\0o", "a\0o", 9}, {"a\0a\0a\0a\0\0ab", "\0ab", 2}, {"a\0a\0a\0a\0\0ab", "b"},
  {"a\0a\0a\0a\0\0ab", "b\0"}, {"", "\0"}, {"alo123alo", "12"}, {"alo123alo", "^12"},
  {"aloALO", "%l*"}, {"aLo_ALO", "%a*"}, {"aaab", "a*"}, {"aaa", "^.*$"}, {"aaa", "b*"},
  {"aaa", "ab*a"}, {"aba", "ab*a"}, {"aaab", "a+"}, {"aaa", "^.+$"}, {"aaa", "b+"},
  {"aaa", "ab+a"}, {"aba", "ab+a"}, {"a$a", ".$"}, {"a$a", ".%$"}, {"a$a", ".$."},
  {"a$a", "$$"}, {"a$b", "a$"}, {"a$a", "$"}, {"", "b*"}, {"aaa", "bb*"}, {"aaab", "a-"},
  {"aaa", "^.-$"}, {"aabaaabaaabaaaba", "b.*b"}, {"aabaaabaaabaaaba", "b.-b"},
  {"alo xo", ".o$"}, {" \n isto é assim", "%S%S*"}, {" \n isto é assim", "%S*$"},
  {" \n isto é assim", "[a-z]*$"}, {"um caracter ? extra", "[^%sa-z]"}, {"", "a?"},
  {"á", "á?"}, {"ábl", "á?b?l?"}, {"  ábl", "á?b?l?"}, {"aa", "^aa?a?a"}, {"]]]áb", "[^]]"},
  {"0alo alo", "%x*"}, {"alo alo", "%C+"}, {"(álo)", "%(á"}, {"==========", "^([=]*)=%1$"},
  {"alo", "(%a+)"}, {"  alo alo  ", "^%s*(.-)%s*$"}, {"hello world", "(o)(.)"},
  {"hello", "()ll()"}, {"hello", "()"}, {"THE (quick) fox", "%((%a+)%)"},
  {"x = [[a]] ..", "%b[]"}, {"f(a(b)c)d", "%b()"}, {"f(a(b c)d", "%b()"}, {"a''b", "%b''"},
  {"THE (quick) fox", "%f[%a]%a+"}, {"THE (quick) fox", "%f[%l]%a+"}, {"hello", "%f[%z]"},
  {"aaa", "%f[a]"}, {"aaa", "%f[^a]"}, {"key=val", "(%w+)=(%w+)"}, {"abc", "[a-c]+"},
  {"abc", "[%a-]+"}, {"a-c", "[a%-c]+"}, {"a]c", "[]]"}, {"a]c", "[^]]+"}, {"ab-", "[b-]+"},
  {"x^y", "[%^]"}, {"x^y", "^^"}, {"^y", "^^"}, {"abc", ".-$"}, {"a.b", "[.]"},
  {"abcabc", "b", 3}, {"abcabc", "b", -2}, {"abcabc", "b", -100}, {"abcabc", "b", 100},
  {"abc", "", 10}, {"abc", "", 4}, {"abc", "", -10}, {"abc", "c", 0}, {"abc", "^b", 2},
  {"abc", "b$", 2}, {"abcabc", "b", "3"}, {"abcabc", "b", 2.9}, {"abc", "b", 1e300},
  {"\t\v\f\r\n x", "%s+"}, {"a1_B!", "%w+"}, {"a1_B!", "%W"}, {"\1\127A", "%c+"},
  {"x\0y", "%z"}, {"x\0y", "%Z+"}, {"!@# a", "%p+"}, {"FFz9", "%x+"}, {"ab cd", "%g+"},
  {"AbC", "%u"}, {"AbC", "%U"}, {"é", "%a"}, {"\200", "[\128-\255]"}, {"x", "%X"},
  {"abcabc", "(abc)%1"}, {"xaax", "(a)%1"}, {"say 'hi' ok", "(['\"])(.-)%1"},
  {"abab", "()ab%1"}, {"a.b", ".", 1, true}, {"a.b", "%.", 1}, {"a+b", "+", 1, true},
  {"a+b", "a+b", 1, true}, {"[x]", "[", 1, true}, {"a]b", "]"}, {12345, 34}, {1.5, "%."},
  {"x", "["}, {"x", "[a"}, {"x", "[^"}, {"x", "%"}, {"x", "(x"}, {"x", "x)"}, {"x", "%1"},
  {"x", "(x)%2"}, {"x", "%f"}, {"x", "%fa"}, {"x", "%b"}, {"x", "%bx"}, {"abc", "(()"},
  {"y", "x["}, {"x", "x["}, {"x", "(x)%0"}, {"x", ")"}, {"x", "((x)%1)"}, {"x", "[%"},
  {"xx", string.rep("(x?)", 33)}, {"x", string.rep("(", 33)}, {big, string.rep("a?", 300)},
  {big, string.rep("a?", 150) .. string.rep("a", 150)}, {"a\0b", "a.\0b"}, {"a\0b", "a%z"},
  {"a\0b", "[\0]"}, {nil, "x"}, {"x", nil}, {"x", "x", "a"}, {"x", "x", {}}, {{}, "x"},
  {"x", true},
}
"#;

/// Runs every case through the originals (`O`) and the replacements: the differences.
const COMPARE: &str = r#"
local O, cases = ...
local N = { find = string.find, match = string.match, gmatch = string.gmatch,
  gsub = string.gsub }
local concat = O.concat
local function ser(...)
  local t = {}
  for i = 1, select('#', ...) do
    local v = select(i, ...)
    t[i] = type(v) .. ":" .. tostring(v)
  end
  return select('#', ...) .. "[" .. concat(t, "|") .. "]"
end
local function norm(ok, ...)
  if ok then return "ok " .. ser(...) end
  local e = tostring((...))
  return "err " .. O.gsub(e, "bad argument (#%d+) to '[^']*'", "bad argument %1 to 'F'")
end
-- Both called from the same line, so errors name the same place.
local function via(f, ...) return ser(f(...)) end
local function gm(g, s, p)
  local out, n = {}, 0
  for a, b, c in g(s, p) do n = n + 1; out[n] = ser(a, b, c); if n > 50 then break end end
  return concat(out, ";")
end
local repls = { "<%0>", "%1-%0", "%%", "x%", 7,
  function(...) return "[" .. ser(...) .. "]" end,
  function(a) if a == "a" then return false end return nil end,
  { a = "A", l = 1, o = false, x = {} },
  setmetatable({}, { __index = function(t, k) return "<" .. tostring(k) .. ">" end }) }
local bad = {}
local function same(what, a, b)
  if a ~= b then bad[#bad + 1] = what .. "\n  luajit: " .. a .. "\n  ours:   " .. b end
end
for i, c in ipairs(cases) do
  local s, p, init, plain = c[1], c[2], c[3], c[4]
  local tag = "case " .. i .. " " .. O.format("%q %q", tostring(s), tostring(p))
  same(tag .. " find", norm(pcall(via, O.find, s, p, init, plain)),
    norm(pcall(via, N.find, s, p, init, plain)))
  same(tag .. " match", norm(pcall(via, O.match, s, p, init)),
    norm(pcall(via, N.match, s, p, init)))
  same(tag .. " gmatch", norm(pcall(gm, O.gmatch, s, p)), norm(pcall(gm, N.gmatch, s, p)))
  for j, r in ipairs(repls) do
    for _, n in ipairs({ false, 1, 2 }) do
      local m = n or nil
      same(tag .. " gsub repl " .. j .. " n " .. tostring(m),
        norm(pcall(via, O.gsub, s, p, r, m)), norm(pcall(via, N.gsub, s, p, r, m)))
    end
  end
end
return bad
"#;

#[test]
fn find_match_gmatch_gsub_agree_with_luajit() {
    let lua = vm();
    let cases: Table = lua.load(CASES).eval().unwrap();
    assert!(cases.raw_len() > 120, "{}", cases.raw_len());
    let bad: Vec<String> = lua
        .load(COMPARE)
        .set_name("=compare")
        .call::<Table>((lua.globals().get::<Table>("O").unwrap(), cases))
        .unwrap()
        .sequence_values::<String>()
        .collect::<mlua::Result<_>>()
        .unwrap();
    assert!(
        bad.is_empty(),
        "{} differences:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// Errors are raised at the caller's line, as LuaJIT's own (both calls on one line).
#[test]
fn errors_name_the_callers_line() {
    let lua = vm();
    let pairs: Table = lua
        .load(
            r#"
local r = {}
local function both(f, g, ...) local a, b = pcall(f, ...) local c, d = pcall(g, ...) r[#r + 1] = {b, d} end
both(function() local x = O.find("x", "[") end, function() local x = string.find("x", "[") end)
both(function() local x = O.gsub("x", ".", {x = {}}) end, function() local x = ("x"):gsub(".", {x = {}}) end)
both(function() for _ in O.gmatch("x", "(") do end end, function() for _ in ("x"):gmatch("(") do end end)
both(function() local x = O.rep() end, function() local x = string.rep("x", 2^30) end)
both(function() local x = O.format("%d", "x") end, function() local x = string.format("%d", "x") end)
both(function() local x = O.concat({{}}) end, function() local x = table.concat({{}}) end)
both(function() local x = O.concat(nil) end, function() local x = table.concat(nil) end)
both(function() local x = O.upper(nil) end, function() local x = string.upper(nil) end)
return r
"#,
        )
        .set_name("@t.lua")
        .eval()
        .unwrap();
    let got: Vec<(String, String)> = pairs
        .sequence_values::<Table>()
        .map(|t| {
            let t = t.unwrap();
            (t.get(1).unwrap(), t.get(2).unwrap())
        })
        .collect();
    for (i, (luajit, ours)) in got.iter().enumerate() {
        assert!(
            ours.starts_with(&format!("t.lua:{}: ", i + 4)),
            "case {i}: {ours}"
        );
        if i == 3 {
            // 1 GiB: refused up front (LuaJIT would try to build it).
            assert!(ours.contains("over the VM's memory limit"), "{ours}");
            continue;
        }
        assert_eq!(luajit, ours, "case {i}");
    }
}

fn timed(lua: &Lua, budget: u64, src: &str) -> (Result<(), String>, Duration) {
    let f = lua.load(src).into_function().unwrap();
    let start = Instant::now();
    let r = with_limits(Limits::instructions(budget), || f.call::<()>(()));
    (r.map_err(|e| crate::error_text(&e)), start.elapsed())
}

/// The attack of issue 21: seconds of backtracking in LuaJIT's C matcher, cut by the budget.
#[test]
fn backtracking_is_cut_by_the_budget() {
    let lua = vm();
    for n in [300, 21846] {
        let src = format!("local v = ('abc'):rep({n}) local r = v:find('a.-b.-c.-d')");
        let (r, took) = timed(&lua, 1_000_000, &src);
        let e = r.unwrap_err();
        assert!(e.contains(BUDGET_MSG), "{e}");
        assert!(took < Duration::from_secs(3), "{n}: {took:?}");
    }
    // Within budget, the same pattern matches as before.
    let (r, _) = timed(&lua, 1_000_000, "assert(('xabcd'):find('a.-b.-c.-d') == 2)");
    r.unwrap();
}

#[test]
fn size_proportional_functions_are_charged() {
    let lua = vm();
    for (what, src) in [
        ("rep", "local s = string.rep('x', 2^24)"),
        ("rep sep", "local s = string.rep('', 2^23, 'xx')"),
        (
            "upper",
            "local s = ('x'):rep(2^20) for i = 1, 100 do s:upper() end",
        ),
        (
            "reverse",
            "local s = ('x'):rep(2^20) for i = 1, 100 do s:reverse() end",
        ),
        (
            "format",
            "local s = ('x'):rep(2^20) for i = 1, 100 do ('%s'):format(s) end",
        ),
        (
            "concat",
            "local t = {} for i = 1, 64 do t[i] = ('x'):rep(2^14) end \
             for i = 1, 100 do table.concat(t) end",
        ),
        (
            "sort",
            "local t = {} for i = 1, 2^16 do t[i] = -i end table.sort(t)",
        ),
        (
            "plain find",
            "local s = ('x'):rep(2^20) for i = 1, 100 do s:find('y', 1, true) end",
        ),
        (
            "gsub",
            "local s = ('x'):rep(2^20) for i = 1, 100 do s:gsub('x', 'yy') end",
        ),
        (
            "gmatch",
            "local s = ('x'):rep(2^20) for w in s:gmatch('x') do end",
        ),
    ] {
        let (r, _) = timed(&lua, 1_000_000, src);
        let e = r.expect_err(what);
        assert!(e.contains(BUDGET_MSG), "{what}: {e}");
    }
    let (r, _) = timed(&lua, u64::MAX, "local s = string.rep('x', 2^27)");
    assert!(r.unwrap_err().contains("over the VM's memory limit"));
}

/// Calls from string functions into Lua nest at most `MAX_NESTED` deep: a recursive `gsub`
/// callback (or `__tostring` under `format`, or `sort` comparator) fails with an error
/// instead of overflowing the thread's stack: here 1 MiB, half a worker thread's, so the
/// limit leaves room for the gateway's own frames below the filter call.
#[test]
fn nested_calls_into_lua_are_bounded() {
    let t = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(|| {
            let lua = vm();
            let errors: Vec<String> = lua
                .load(
                    r#"
local function g(s) return (s:gsub(".", g)) end
local t = setmetatable({}, { __tostring = function(x) return string.format("%s", x) end })
local function s() table.sort({ 3, 2, 1 }, function(a, b) s() return a < b end) end
local h
h = setmetatable({}, { __index = function(_, k) return (("x"):gsub("x", h)) end })
local out = {}
for _, f in ipairs({ function() return g("x") end, function() return tostring(t) end, s,
    function() return ("x"):gsub("x", h) end }) do
  local ok, e = pcall(f)
  out[#out + 1] = tostring(e)
end
-- Unwound: the depth is back to zero, so nesting works again.
out[#out + 1] = tostring(select(2, pcall(function() return ("ab"):gsub("%w", { a = "1" }) end)))
return out
"#,
                )
                .eval::<Vec<String>>()
                .unwrap();
            errors
        })
        .unwrap();
    let errors = t.join().expect("no stack overflow");
    for e in &errors[..4] {
        assert!(e.contains(NESTED_MSG), "{errors:?}");
    }
    assert_eq!(errors[4], "1b");
}
