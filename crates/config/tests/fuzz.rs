//! Config loading under fuzzing (proptest, bounded: it runs with the normal test suite).
//! Whatever the text, `load_str` returns a config or located errors: no panic, every line
//! number inside the text, every message non-empty. Inputs are arbitrary text, the embedded
//! default config with random line edits, and the committed corpus of nasty files
//! (`tests/corpus/*.toml`, each once).

use keymaster_config::{load_str, DEFAULT_CONFIG};
use proptest::prelude::*;

/// Cases per property: `default`, or `KEYMASTER_FUZZ_CASES` for a longer run (`.ci/run`).
fn cases(default: u32) -> u32 {
    std::env::var("KEYMASTER_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `load_str` on `text` must not panic, and what it reports must point into the text.
fn check(text: &str) {
    let lines = text.lines().count().max(1);
    if let Err(errs) = load_str(text, "fuzz.toml") {
        assert!(!errs.is_empty());
        for e in errs.errors() {
            assert!(!e.message.is_empty(), "{e}");
            if let Some(line) = e.line {
                assert!(
                    (1..=lines + 1).contains(&line),
                    "line {line} of {lines}: {e}"
                );
            }
        }
    }
}

/// One edit of a config's lines.
#[derive(Debug, Clone)]
enum Edit {
    Delete(usize),
    Duplicate(usize),
    /// Replace the value after `=` on a line.
    Value(usize, String),
    /// Insert a line.
    Insert(usize, String),
}

fn edit() -> impl Strategy<Value = Edit> {
    let value = prop_oneof![
        Just("\"\"".to_string()),
        Just("-1".to_string()),
        Just("1e309".to_string()),
        Just("99999999999999999999".to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
        Just("\"0s\"".to_string()),
        Just("\"1ZiB\"".to_string()),
        Just("\"999:999:999\"".to_string()),
        Just("true".to_string()),
        "\"[ -~]{0,12}\"",
        "[0-9]{1,25}",
    ];
    let line = prop_oneof![
        Just("[[routes]]".to_string()),
        Just("[[clusters]]".to_string()),
        Just("[[listeners]]".to_string()),
        Just("[lua]".to_string()),
        Just("name = \"x\"".to_string()),
        Just("unknown_key = 1".to_string()),
        "[a-z_]{1,12} = [0-9a-z\"]{0,8}",
        "[ -~]{0,30}",
    ];
    prop_oneof![
        (0..64usize).prop_map(Edit::Delete),
        (0..64usize).prop_map(Edit::Duplicate),
        (0..64usize, value).prop_map(|(i, v)| Edit::Value(i, v)),
        (0..64usize, line).prop_map(|(i, l)| Edit::Insert(i, l)),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for e in edits {
        if lines.is_empty() {
            break;
        }
        let at = |i: &usize| i % lines.len();
        match e {
            Edit::Delete(i) => {
                let i = at(i);
                lines.remove(i);
            }
            Edit::Duplicate(i) => {
                let i = at(i);
                lines.insert(i, lines[i].clone());
            }
            Edit::Value(i, v) => {
                let i = at(i);
                if let Some((k, _)) = lines[i].split_once('=') {
                    lines[i] = format!("{k}= {v}");
                }
            }
            Edit::Insert(i, l) => {
                let i = at(i);
                lines.insert(i, l.clone());
            }
        }
    }
    lines.join("\n")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(512), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        check(&text);
    }

    #[test]
    fn edited_default_configs_never_panic(edits in proptest::collection::vec(edit(), 1..6)) {
        check(&apply(DEFAULT_CONFIG, &edits));
    }
}

#[test]
fn corpus_files_load_or_fail_cleanly() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("tests/corpus") {
        let path = entry.expect("entry").path();
        let bytes = std::fs::read(&path).expect("read corpus file");
        check(&String::from_utf8_lossy(&bytes));
        n += 1;
    }
    assert!(n >= 5, "the corpus has {n} files");
}
