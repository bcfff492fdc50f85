//! The matcher on its own (its agreement with LuaJIT is tested through `strlib`).

use super::*;
use crate::meter::{with_limits, Limits, BUDGET_MSG};

fn find(src: &str, pat: &str) -> Result<Option<(usize, usize)>, Error> {
    let (pat, anchor) = match pat.strip_prefix('^') {
        Some(p) => (p, true),
        None => (pat, false),
    };
    let mut m = Matcher::new(src.as_bytes(), pat.as_bytes());
    let r = m.find(0, anchor);
    m.finish()?;
    r
}

#[test]
fn matches_and_captures() {
    assert_eq!(find("hello world", "o w"), Ok(Some((4, 7))));
    assert_eq!(find("hello", "^l"), Ok(None));
    assert_eq!(find("key = value", "(%w+)%s*=%s*(%w+)"), Ok(Some((0, 11))));
    let src = b"key=value";
    let mut m = Matcher::new(src, b"(%w+)=()(%w+)");
    assert_eq!(m.find(0, false), Ok(Some((0, 9))));
    assert_eq!(m.capture_count(false), 3);
    assert_eq!(m.capture(0, 0, 9), Ok(Capture::Text(0, 3)));
    assert_eq!(m.capture(1, 0, 9), Ok(Capture::Position(5)));
    assert_eq!(m.capture(2, 0, 9), Ok(Capture::Text(4, 9)));
    assert_eq!(
        m.capture(3, 0, 9),
        Err(Error::Pattern(INVALID_CAPTURE_INDEX))
    );
}

#[test]
fn malformed_patterns_fail_only_when_reached() {
    assert_eq!(find("x", "["), Err(Error::Pattern(MISSING_BRACKET)));
    assert_eq!(find("y", "x["), Ok(None), "never reached, as in LuaJIT");
    assert_eq!(find("x", "%"), Err(Error::Pattern(ENDS_WITH_ESCAPE)));
    assert_eq!(find("x", ")"), Err(Error::Pattern(INVALID_PATTERN_CAPTURE)));
    let deep = "a?".repeat(300);
    assert_eq!(
        find(&"a".repeat(300), &deep),
        Err(Error::Pattern(TOO_COMPLEX))
    );
}

#[test]
fn every_step_is_charged() {
    let subject = "abc".repeat(300);
    with_limits(Limits::instructions(1_000_000), || {
        assert_eq!(
            find(&subject, "a.-b.-c.-d"),
            Err(Error::Spent(BUDGET_MSG)),
            "cubic backtracking runs out of budget"
        );
        assert!(meter::spent(), "and the budget stays spent");
    });
    with_limits(Limits::instructions(10_000), || {
        assert_eq!(find("xxabcd", "a.-b.-c.-d"), Ok(Some((2, 6))));
        assert!(!meter::spent());
    });
}

#[test]
fn specials_decide_the_plain_search() {
    assert!(!has_specials(b"plain text]"));
    for p in ["^a", "a$", "a*", "a+", "a?", ".", "(", "%a", "a-b", "["] {
        assert!(has_specials(p.as_bytes()), "{p}");
    }
}
