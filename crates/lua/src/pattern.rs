//! Lua 5.1 patterns with LuaJIT's semantics, matched under the running call's meter.
//!
//! LuaJIT's own `string.find`/`match`/`gmatch`/`gsub` are C functions: the VM's count hook
//! does not fire inside them, and Lua patterns backtrack polynomially (`a.-b.-c.-d` on
//! `abc` repeated 300 times takes seconds), so a client-chosen header could stall a worker.
//! This module is the matcher `crate::strlib` puts in their place. Every step (a match
//! attempt at a position, one character tried by a repetition, one character of `%b`, 16
//! bytes compared by a back-reference) is charged to the call's instruction budget
//! ([`crate::meter`]), in batches of [`BATCH`] steps; a spent budget ends the match with
//! [`Error::Spent`].
//!
//! Hand-written because the known Rust ports (`lua-patterns`, which wraps Lua 5.2's C code,
//! and the matchers inside Rust Lua runtimes) have no step limit or hook to add one.
//!
//! The semantics follow LuaJIT 2.1's `lib_string.c`: classes `%a %c %d %g %l %p %s %u %w %x
//! %z` (ASCII only) and their upper-case complements, sets `[...]` with ranges and `^`, `.`,
//! the quantifiers `* + - ?`, `^` and `$` anchors, captures with position captures `()`,
//! back-references `%1`-`%9`, `%b` and `%f`; a pattern ends at its first NUL byte, as in C.
//! Malformed patterns are errors only once the match reaches the bad part, with LuaJIT's
//! messages; recursion deeper than 200 is "pattern too complex".

use crate::meter;

/// At most this many captures (LuaJIT's `LUA_MAXCAPTURES`).
pub const MAX_CAPTURES: usize = 32;
/// Recursion depth past which a match fails with [`TOO_COMPLEX`] (LuaJIT's `LJ_MAX_XLEVEL`).
const MAX_DEPTH: usize = 200;
/// Steps are charged to the meter this many at a time.
pub const BATCH: u32 = 1024;

pub const TOO_COMPLEX: &str = "pattern too complex";
pub const ENDS_WITH_ESCAPE: &str = "malformed pattern (ends with '%')";
pub const MISSING_BRACKET: &str = "malformed pattern (missing ']')";
pub const MISSING_FRONTIER_SET: &str = "missing '[' after '%f' in pattern";
pub const UNBALANCED: &str = "unbalanced pattern";
pub const INVALID_PATTERN_CAPTURE: &str = "invalid pattern capture";
pub const INVALID_CAPTURE_INDEX: &str = "invalid capture index";
pub const TOO_MANY_CAPTURES: &str = "too many captures";
pub const UNFINISHED_CAPTURE: &str = "unfinished capture";

/// Why a match stopped without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// A malformed pattern (LuaJIT's message).
    Pattern(&'static str),
    /// The call's budget or clock is spent (the meter's message).
    Spent(&'static str),
}

/// One capture of a match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    /// Bytes `start..end` of the subject.
    Text(usize, usize),
    /// A position capture `()`: the 1-based position.
    Position(usize),
}

const UNFINISHED: isize = -1;
const POSITION: isize = -2;

/// Whether `pat` has a character that makes it a pattern (else `find` searches for it as
/// plain text): LuaJIT's `lj_str_haspattern`.
pub fn has_specials(pat: &[u8]) -> bool {
    pat.iter().any(|c| b"^$*+?.([%-".contains(c))
}

/// A match of one pattern against one subject: its captures, recursion depth and unpaid
/// steps. `pat` excludes an anchoring `^` (the caller handles it) and is cut at its first
/// NUL byte.
pub struct Matcher<'a> {
    src: &'a [u8],
    pat: &'a [u8],
    level: usize,
    depth: usize,
    caps: [(usize, isize); MAX_CAPTURES],
    unpaid: u32,
}

impl<'a> Matcher<'a> {
    pub fn new(src: &'a [u8], pat: &'a [u8]) -> Matcher<'a> {
        let end = memchr::memchr(0, pat).unwrap_or(pat.len());
        Matcher {
            src,
            pat: &pat[..end],
            level: 0,
            depth: 0,
            caps: [(0, 0); MAX_CAPTURES],
            unpaid: 0,
        }
    }

    /// Try to match at subject position `s`: the end of the match.
    pub fn at(&mut self, s: usize) -> Result<Option<usize>, Error> {
        self.level = 0;
        self.depth = 0;
        self.do_match(s, 0)
    }

    /// The first match at or after `init` (only at `init` if `anchor`): its start and end.
    pub fn find(&mut self, init: usize, anchor: bool) -> Result<Option<(usize, usize)>, Error> {
        let mut s = init;
        let first = self.literal_start(anchor);
        loop {
            if let Some(c) = first {
                // A match must start with this byte: skip to the next one.
                let rest = self.src.get(s..).unwrap_or_default();
                let skip = memchr::memchr(c, rest).unwrap_or(rest.len());
                self.charge_bytes(skip)?;
                s += skip;
                if s >= self.src.len() {
                    return Ok(None);
                }
            }
            if let Some(e) = self.at(s)? {
                return Ok(Some((s, e)));
            }
            s += 1;
            if anchor || s > self.src.len() {
                return Ok(None);
            }
        }
    }

    /// The byte every match starts with, when the pattern begins with a plain character
    /// that cannot repeat zero times.
    fn literal_start(&self, anchor: bool) -> Option<u8> {
        let c = *self.pat.first()?;
        let plain = !anchor && !b"^$*+?.([%-)".contains(&c);
        (plain && !b"*?-".contains(&self.pc(1))).then_some(c)
    }

    /// How many captures a match has: its captures, or the whole match when it has none
    /// and `whole` (`match`, `gmatch`, `gsub`; `find` reports none then).
    pub fn capture_count(&self, whole: bool) -> usize {
        if self.level == 0 && whole {
            1
        } else {
            self.level
        }
    }

    /// Capture `i` of the match `s..e` (capture 0 is the whole match when there are none).
    pub fn capture(&self, i: usize, s: usize, e: usize) -> Result<Capture, Error> {
        if i >= self.level {
            return if i == 0 {
                Ok(Capture::Text(s, e))
            } else {
                Err(Error::Pattern(INVALID_CAPTURE_INDEX))
            };
        }
        match self.caps[i] {
            (_, UNFINISHED) => Err(Error::Pattern(UNFINISHED_CAPTURE)),
            (init, POSITION) => Ok(Capture::Position(init + 1)),
            (init, len) => Ok(Capture::Text(init, init + len.unsigned_abs())),
        }
    }

    /// Charge the steps not yet charged (call when the match is done).
    pub fn finish(&mut self) -> Result<(), Error> {
        let n = std::mem::take(&mut self.unpaid);
        meter::charge(u64::from(n)).map_err(Error::Spent)
    }

    #[inline]
    fn step(&mut self) -> Result<(), Error> {
        self.unpaid += 1;
        if self.unpaid >= BATCH {
            self.finish()?;
        }
        Ok(())
    }

    fn charge_bytes(&mut self, bytes: usize) -> Result<(), Error> {
        meter::charge_bytes(bytes).map_err(Error::Spent)
    }

    /// The pattern byte at `p`; 0 past the end (C's terminating NUL).
    #[inline]
    fn pc(&self, p: usize) -> u8 {
        self.pat.get(p).copied().unwrap_or(0)
    }

    fn do_match(&mut self, mut s: usize, mut p: usize) -> Result<Option<usize>, Error> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Error::Pattern(TOO_COMPLEX));
        }
        let r = loop {
            self.step()?;
            if p >= self.pat.len() {
                break Some(s);
            }
            let next = match (self.pat[p], self.pc(p + 1)) {
                (b'(', b')') => break self.start_capture(s, p + 2, POSITION)?,
                (b'(', _) => break self.start_capture(s, p + 1, UNFINISHED)?,
                (b')', _) => break self.end_capture(s, p + 1)?,
                (b'$', 0) => break (s == self.src.len()).then_some(s),
                (b'%', b'b') => self.balance(s, p + 2)?.map(|e| (e, p + 4)),
                (b'%', b'f') => self.frontier(s, p + 2)?.map(|ep| (s, ep)),
                (b'%', d) if d.is_ascii_digit() => self.back_reference(s, d)?.map(|e| (e, p + 2)),
                _ => match self.item(s, p)? {
                    Item::Done(r) => break r,
                    Item::Next(s, p) => Some((s, p)),
                },
            };
            match next {
                Some((s2, p2)) => (s, p) = (s2, p2),
                None => break None,
            }
        };
        self.depth -= 1;
        Ok(r)
    }

    /// A single-character class at `p`, possibly with a quantifier.
    fn item(&mut self, s: usize, p: usize) -> Result<Item, Error> {
        let ep = self.class_end(p)?;
        let m = s < self.src.len() && self.single(self.src[s], p, ep);
        Ok(match self.pc(ep) {
            b'?' => {
                if m {
                    if let Some(r) = self.do_match(s + 1, ep + 1)? {
                        return Ok(Item::Done(Some(r)));
                    }
                }
                Item::Next(s, ep + 1)
            }
            b'*' => Item::Done(self.max_expand(s, p, ep)?),
            b'+' if m => Item::Done(self.max_expand(s + 1, p, ep)?),
            b'+' => Item::Done(None),
            b'-' => Item::Done(self.min_expand(s, p, ep)?),
            _ if m => Item::Next(s + 1, ep),
            _ => Item::Done(None),
        })
    }

    /// Where the single-character class at `p` ends.
    fn class_end(&self, p: usize) -> Result<usize, Error> {
        let len = self.pat.len();
        match self.pc(p) {
            b'%' if p + 1 >= len => Err(Error::Pattern(ENDS_WITH_ESCAPE)),
            b'%' => Ok(p + 2),
            b'[' => {
                let mut q = p + 1;
                if self.pc(q) == b'^' {
                    q += 1;
                }
                // The first character is part of the set even if it is `]`.
                loop {
                    if q >= len {
                        return Err(Error::Pattern(MISSING_BRACKET));
                    }
                    let c = self.pat[q];
                    q += 1;
                    if c == b'%' && q < len {
                        q += 1;
                    }
                    if self.pc(q) == b']' {
                        return Ok(q + 1);
                    }
                }
            }
            _ => Ok(p + 1),
        }
    }

    /// Whether byte `c` matches the single-character class `p..ep`.
    fn single(&self, c: u8, p: usize, ep: usize) -> bool {
        match self.pc(p) {
            b'.' => true,
            b'%' => class(c, self.pc(p + 1)),
            b'[' => self.set(c, p, ep - 1),
            x => x == c,
        }
    }

    /// Whether byte `c` is in the set `[...]` from `p` (its `[`) to `ec` (its `]`).
    fn set(&self, c: u8, mut p: usize, ec: usize) -> bool {
        let mut sig = true;
        if self.pc(p + 1) == b'^' {
            sig = false;
            p += 1;
        }
        loop {
            p += 1;
            if p >= ec {
                return !sig;
            }
            if self.pat[p] == b'%' {
                p += 1;
                if class(c, self.pc(p)) {
                    return sig;
                }
            } else if self.pc(p + 1) == b'-' && p + 2 < ec {
                p += 2;
                if self.pat[p - 2] <= c && c <= self.pat[p] {
                    return sig;
                }
            } else if self.pat[p] == c {
                return sig;
            }
        }
    }

    fn max_expand(&mut self, s: usize, p: usize, ep: usize) -> Result<Option<usize>, Error> {
        let mut i = 0;
        while s + i < self.src.len() && self.single(self.src[s + i], p, ep) {
            self.step()?;
            i += 1;
        }
        loop {
            if let Some(r) = self.do_match(s + i, ep + 1)? {
                return Ok(Some(r));
            }
            if i == 0 {
                return Ok(None);
            }
            i -= 1;
        }
    }

    fn min_expand(&mut self, mut s: usize, p: usize, ep: usize) -> Result<Option<usize>, Error> {
        loop {
            if let Some(r) = self.do_match(s, ep + 1)? {
                return Ok(Some(r));
            }
            if s < self.src.len() && self.single(self.src[s], p, ep) {
                s += 1;
            } else {
                return Ok(None);
            }
        }
    }

    fn start_capture(&mut self, s: usize, p: usize, what: isize) -> Result<Option<usize>, Error> {
        if self.level >= MAX_CAPTURES {
            return Err(Error::Pattern(TOO_MANY_CAPTURES));
        }
        self.caps[self.level] = (s, what);
        self.level += 1;
        let r = self.do_match(s, p)?;
        if r.is_none() {
            self.level -= 1;
        }
        Ok(r)
    }

    fn end_capture(&mut self, s: usize, p: usize) -> Result<Option<usize>, Error> {
        let l = (0..self.level)
            .rev()
            .find(|&l| self.caps[l].1 == UNFINISHED)
            .ok_or(Error::Pattern(INVALID_PATTERN_CAPTURE))?;
        let start = self.caps[l].0;
        self.caps[l].1 = isize::try_from(s - start).unwrap_or(isize::MAX);
        let r = self.do_match(s, p)?;
        if r.is_none() {
            self.caps[l].1 = UNFINISHED;
        }
        Ok(r)
    }

    /// `%1`-`%9`: the text of an earlier, closed capture again (a position capture never
    /// matches, as in C).
    fn back_reference(&mut self, s: usize, digit: u8) -> Result<Option<usize>, Error> {
        let l = usize::from(digit).wrapping_sub(usize::from(b'1'));
        if l >= self.level || self.caps[l].1 == UNFINISHED {
            return Err(Error::Pattern(INVALID_CAPTURE_INDEX));
        }
        let (init, len) = self.caps[l];
        let Ok(len) = usize::try_from(len) else {
            return Ok(None);
        };
        self.charge_bytes(len)?;
        let same = self.src.len() - s >= len && self.src[init..init + len] == self.src[s..s + len];
        Ok(same.then_some(s + len))
    }

    /// `%bxy` with `x` at pattern position `p`: a balanced run from `x` to its `y`.
    fn balance(&mut self, s: usize, p: usize) -> Result<Option<usize>, Error> {
        if p + 1 >= self.pat.len() {
            return Err(Error::Pattern(UNBALANCED));
        }
        let (open, close) = (self.pat[p], self.pat[p + 1]);
        if self.src.get(s) != Some(&open) {
            return Ok(None);
        }
        let mut depth = 1;
        for i in s + 1..self.src.len() {
            self.step()?;
            let c = self.src[i];
            if c == close {
                depth -= 1;
                if depth == 0 {
                    return Ok(Some(i + 1));
                }
            } else if c == open {
                depth += 1;
            }
        }
        Ok(None)
    }

    /// `%f[set]` with the set at pattern position `p`: where the pattern goes on, if the
    /// previous byte is outside the set and the next one in it (0 before the start and
    /// past the end).
    fn frontier(&self, s: usize, p: usize) -> Result<Option<usize>, Error> {
        if self.pc(p) != b'[' {
            return Err(Error::Pattern(MISSING_FRONTIER_SET));
        }
        let ep = self.class_end(p)?;
        let previous = if s == 0 { 0 } else { self.src[s - 1] };
        let next = self.src.get(s).copied().unwrap_or(0);
        let at = !self.set(previous, p, ep - 1) && self.set(next, p, ep - 1);
        Ok(at.then_some(ep))
    }
}

impl Drop for Matcher<'_> {
    /// Steps not charged by [`Matcher::finish`] (an early return) are charged now: a spent
    /// meter then stops the call at its next charge.
    fn drop(&mut self) {
        if self.unpaid > 0 {
            let _ = meter::charge(u64::from(self.unpaid));
        }
    }
}

enum Item {
    Done(Option<usize>),
    /// Go on matching at subject `.0`, pattern `.1` (C's `goto init`).
    Next(usize, usize),
}

/// Whether byte `c` is in class `%cl` (ASCII, as LuaJIT's `lj_char` tables).
fn class(c: u8, cl: u8) -> bool {
    let is = match cl.to_ascii_lowercase() {
        b'a' => c.is_ascii_alphabetic(),
        b'c' => c.is_ascii_control(),
        b'd' => c.is_ascii_digit(),
        b'g' => c.is_ascii_graphic(),
        b'l' => c.is_ascii_lowercase(),
        b'p' => c.is_ascii_punctuation(),
        b's' => c == b' ' || (b'\t'..=b'\r').contains(&c),
        b'u' => c.is_ascii_uppercase(),
        b'w' => c.is_ascii_alphanumeric(),
        b'x' => c.is_ascii_hexdigit(),
        b'z' => c == 0,
        _ => return cl == c,
    };
    if cl.is_ascii_uppercase() {
        !is
    } else {
        is
    }
}

/// The gmatch iterator's next match from `pos`: its start and end, and where the next
/// search starts (one past an empty match, as LuaJIT).
pub fn next_match(m: &mut Matcher<'_>, pos: usize) -> Result<Option<(usize, usize, usize)>, Error> {
    for s in pos..=m.src.len() {
        if let Some(e) = m.at(s)? {
            return Ok(Some((s, e, if e == s { e + 1 } else { e })));
        }
    }
    Ok(None)
}

#[cfg(test)]
#[path = "pattern_tests.rs"]
mod tests;
