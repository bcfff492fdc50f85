//! The gateway crate's layers, checked from its `use` lines: a module may name modules of
//! its own layer and of the layers below, never one above. So no import circle spans more
//! than one layer. The layers are described in `src/lib.rs` and `docs/architecture.md`.

use std::collections::BTreeMap;
use std::path::Path;

/// Bottom first. A module not listed here fails the test: say where a new one belongs.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "support",
        &[
            "body",
            "metrics",
            "descriptors",
            "proxy_protocol",
            "runtime_thread",
            "tls",
            "drain",
            "restart_only",
            "access_log",
            "compress",
            "fetch",
        ],
    ),
    ("upstream", &["upstream"]),
    (
        "gateway",
        &[
            "gateway",
            "worker",
            "admin",
            "downstream",
            "proxy",
            "upgrade",
            "respond",
            "filter",
            "route",
            "snapshot",
            "overload",
        ],
    ),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, ms)| ms.contains(&module))
}

/// Each top-level module's source files, test modules and comments left out.
fn sources(src: &Path) -> BTreeMap<String, Vec<(String, String)>> {
    let mut out: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read src") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let rel = p
                .strip_prefix(src)
                .expect("under src")
                .to_string_lossy()
                .to_string();
            let is_test = rel.ends_with("fuzz.rs") || rel.ends_with("_tests.rs");
            if !rel.ends_with(".rs") || rel == "lib.rs" || is_test {
                continue;
            }
            let module = rel
                .split('/')
                .next()
                .expect("a name")
                .trim_end_matches(".rs");
            let text = std::fs::read_to_string(&p).expect("read");
            let code = text
                .split("#[cfg(test)]\nmod tests")
                .next()
                .unwrap_or_default();
            let code: String = code
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            out.entry(module.to_string()).or_default().push((rel, code));
        }
    }
    out
}

/// The modules `code` names through `crate::`.
fn named(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit())
            .collect();
        if !name.is_empty() && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

#[test]
fn no_module_names_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut problems = Vec::new();
    for (module, files) in sources(&src) {
        let Some(own) = layer_of(&module) else {
            problems.push(format!("{module}: not in any layer of tests/layers.rs"));
            continue;
        };
        for (file, code) in files {
            for target in named(&code) {
                if target == module || target == "fuzz_config" {
                    continue;
                }
                match layer_of(&target) {
                    Some(l) if l > own => problems.push(format!(
                        "{file}: the {} layer names `crate::{target}` of the {} layer above it",
                        LAYERS[own].0, LAYERS[l].0
                    )),
                    _ => {}
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The check itself finds an upward name.
#[test]
fn an_upward_name_is_found() {
    let names = named("use crate::proxy::Exchange;\nlet x = crate::body::read_whole;");
    assert_eq!(names, ["proxy", "body"]);
    assert!(layer_of("body") < layer_of("proxy"));
}
