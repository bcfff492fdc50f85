//! What the rule tests share: a valid config to append to, and the one-error check.
#![allow(dead_code)]

use keymaster_config::{load_str, ConfigError};

/// A valid config; whatever `with` appends starts at line 12, inside the `[[routes]]` table.
pub const BASE: &str = r#"[[listeners]]
name = "main"
address = "127.0.0.1:8080"

[[clusters]]
name = "c"
servers = [{ address = "127.0.0.1:8081" }]

[[routes]]
name = "r"
cluster = "c"
"#;

pub fn errors(text: &str) -> Vec<ConfigError> {
    match load_str(text, "t.toml") {
        Ok(_) => Vec::new(),
        Err(e) => e.errors().to_vec(),
    }
}

/// `BASE + extra` must fail with exactly one error, at `key` on `line`, mentioning `says`.
#[track_caller]
pub fn one(extra: &str, key: &str, line: usize, says: &str) {
    let errs = errors(&format!("{BASE}{extra}"));
    let got: Vec<String> = errs.iter().map(ToString::to_string).collect();
    assert_eq!(errs.len(), 1, "expected one error for {key}, got {got:#?}");
    let e = &errs[0];
    assert_eq!(e.key, key, "{got:#?}");
    assert_eq!(e.line, Some(line), "{got:#?}");
    assert_eq!(e.origin, "t.toml");
    assert!(e.message.contains(says), "{:?} lacks {says:?}", e.message);
}
