//! keymaster's configuration: the model ([`model`]), TOML loading that reports every problem
//! with file, line and key ([`load_file`], [`load_str`]), and semantic validation
//! ([`validate`]).
//!
//! The gateway crate compiles a validated [`Config`] into its runtime snapshot; nothing here
//! touches the network (origin addresses are checked for form, never resolved).

pub mod error;
mod filters;
mod locate;
pub mod model;
mod redact;
mod resilience;
mod servers_file;
pub mod units;
mod validate;
mod validate_filters;
mod validate_resilience;

pub use error::{ConfigError, ConfigErrors};
pub use model::*;
pub use redact::{url_without_credentials, REDACTED};
pub use servers_file::parse_servers_file;
pub use validate::MAX_WEIGHT;

use locate::Locator;
use std::path::Path;

/// The embedded default config: gateway on 127.0.0.1:8080, admin on 127.0.0.1:9901,
/// everything routed to the built-in stub origin on 127.0.0.1:8081.
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

/// The parsed [`DEFAULT_CONFIG`].
pub fn default_config() -> Config {
    // The embedded text is covered by tests; failing here is a build defect, not user input.
    load_str(DEFAULT_CONFIG, "<default>").expect("the embedded default config is valid")
}

/// Parse and validate TOML text. `origin` names the source in error messages (a path or
/// `"<default>"`).
///
/// A syntax or type error stops parsing and is reported alone; otherwise every semantic
/// problem is reported, sorted by position in the text.
pub fn load_str(text: &str, origin: &str) -> Result<Config, ConfigErrors> {
    let config: Config = match toml::from_str(text) {
        Ok(config) => config,
        Err(e) => return Err(parse_error(text, origin, &e).into()),
    };
    let problems = validate::check(&config);
    if problems.is_empty() {
        return Ok(config);
    }
    let locator = Locator::new(text);
    let mut errors: Vec<ConfigError> = problems
        .into_iter()
        .map(|p| {
            let (line, column) = match locator.offset_of(&p.path) {
                Some(offset) => {
                    let (l, c) = locator.line_col(offset);
                    (Some(l), Some(c))
                }
                None => (None, None),
            };
            ConfigError {
                origin: origin.to_owned(),
                line,
                column,
                key: p.path.to_string(),
                message: p.message,
            }
        })
        .collect();
    // Stable: problems at the same place keep rule order; unlocated ones go last.
    errors.sort_by_key(|e| (e.line.is_none(), e.line, e.column));
    Err(ConfigErrors(errors))
}

/// Read, parse and validate a config file. An unreadable file is one error naming the path.
/// Relative file paths (TLS files, server lists, the Lua directory, the access log) are
/// taken relative to the config file's directory.
pub fn load_file(path: impl AsRef<Path>) -> Result<Config, ConfigErrors> {
    let path = path.as_ref();
    let origin = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => load_str(&text, &origin).map(|mut config| {
            let dir = path.parent().unwrap_or(Path::new("."));
            let from_dir = |p: &mut String| {
                if !p.is_empty() && Path::new(p.as_str()).is_relative() {
                    *p = dir.join(p.as_str()).display().to_string();
                }
            };
            if let Some(d) = &mut config.lua.dir {
                from_dir(d);
            }
            if config.access_log.path != "-" {
                from_dir(&mut config.access_log.path);
            }
            for l in &mut config.listeners {
                if let Some(tls) = &mut l.tls {
                    tls.resolve_paths(dir);
                }
            }
            for c in &mut config.clusters {
                if let Some(tls) = &mut c.tls {
                    tls.resolve_paths(dir);
                }
                if let Some(f) = c.discovery.as_mut().and_then(|d| d.file.as_mut()) {
                    from_dir(f);
                }
            }
            config
        }),
        Err(e) => Err(ConfigError {
            origin,
            line: None,
            column: None,
            key: String::new(),
            message: format!("cannot read the config file: {e}"),
        }
        .into()),
    }
}

/// Run the semantic checks on a config built in code (no text, so no lines: the origin is
/// `"<memory>"`). [`load_str`] and [`load_file`] already do this.
pub fn validate(config: &Config) -> Result<(), ConfigErrors> {
    let errors: Vec<ConfigError> = validate::check(config)
        .into_iter()
        .map(|p| ConfigError {
            origin: "<memory>".to_owned(),
            line: None,
            column: None,
            key: p.path.to_string(),
            message: p.message,
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ConfigErrors(errors))
    }
}

/// A TOML syntax or type error, located by the parser's byte span.
/// serde's names of Rust types (`expected u32`) in the words of a config file's reader.
fn in_user_terms(message: String) -> String {
    const TERMS: &[(&str, &str)] = &[
        ("expected usize", "expected a whole number (0 or more)"),
        ("expected u64", "expected a whole number (0 or more)"),
        ("expected u32", "expected a whole number (0 or more)"),
        ("expected u16", "expected a whole number (0 to 65535)"),
        ("expected u8", "expected a whole number (0 to 255)"),
        ("expected i64", "expected a whole number"),
        ("expected i32", "expected a whole number"),
        ("expected f64", "expected a number"),
        ("expected a boolean", "expected true or false"),
    ];
    TERMS
        .iter()
        .fold(message, |m, (rust, user)| m.replace(rust, user))
}

fn parse_error(text: &str, origin: &str, e: &toml::de::Error) -> ConfigError {
    let mut message = in_user_terms(e.message().trim().replace('\n', " "));
    if message == "invalid socket address syntax" {
        message.push_str("; expected \"ip:port\" like \"127.0.0.1:8080\" (names are not resolved)");
    }
    let (line, column, key) = match e.span() {
        Some(span) => {
            let locator = Locator::new(text);
            let (l, c) = locator.line_col(span.start);
            (Some(l), Some(c), locator.path_at(span.start).to_string())
        }
        None => (None, None, String::new()),
    };
    ConfigError {
        origin: origin.to_owned(),
        line,
        column,
        key,
        message,
    }
}
