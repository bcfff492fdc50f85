//! keymaster's configuration: the model ([`model`]), TOML loading that reports every problem
//! with file, line and key ([`load_file`], [`load_str`]), and semantic validation
//! ([`validate`]).
//!
//! The gateway crate compiles a validated [`Config`] into its runtime snapshot; nothing here
//! touches the network (origin addresses are checked for form, never resolved).

mod cluster;
mod compression;
pub mod error;
mod filters;
mod jwt;
mod locate;
mod mirror;
pub mod model;
mod redact;
mod registry;
mod resilience;
mod servers_file;
mod traces;
mod traffic;
pub mod units;
mod validate;
mod validate_cluster;
mod validate_compression;
mod validate_filters;
mod validate_jwt;
mod validate_resilience;
mod validate_traffic;

pub use error::{ConfigError, ConfigErrors};
pub use filters::{env_reference, env_table, env_value};
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
/// A syntax error stops parsing and is reported alone. Otherwise every problem is reported,
/// sorted by position in the text: each type error or unknown key (the line holding it is
/// then left out and the rest parsed again), and every semantic problem of what remains,
/// except those about the keys left out.
pub fn load_str(text: &str, origin: &str) -> Result<Config, ConfigErrors> {
    if let Err(e) = text.parse::<toml::Table>() {
        return Err(parse_error(text, origin, &e).into());
    }
    let (config, mut errors) = deserialize_around_errors(text, origin);
    let Some(config) = config else {
        return Err(ConfigErrors(errors));
    };
    let left_out: Vec<String> = errors.iter().map(|e| e.key.clone()).collect();
    let mut problems = validate::check(&config);
    problems.retain(|p| {
        let key = p.path.to_string();
        !left_out
            .iter()
            .any(|k| key.starts_with(k.as_str()) || k.starts_with(key.as_str()))
    });
    if problems.is_empty() && errors.is_empty() {
        return Ok(config);
    }
    errors.extend(locate(text, origin, problems));
    // Stable: problems at the same place keep rule order; unlocated ones go last.
    errors.sort_by_key(|e| (e.line.is_none(), e.line, e.column));
    Err(ConfigErrors(errors))
}

/// Deserialize `text`; after each type error or unknown key, blank the line it is on and try
/// again, so one such error does not hide the others. `None` when a line cannot be left out
/// (a table header, or a value spread over lines) or after too many errors.
fn deserialize_around_errors(text: &str, origin: &str) -> (Option<Config>, Vec<ConfigError>) {
    let mut errors = Vec::new();
    let mut work = text.to_string();
    while errors.len() < 64 {
        let e = match toml::from_str::<Config>(&work) {
            Ok(config) => return (Some(config), errors),
            Err(e) => e,
        };
        // Located in the blanked text: its lines and columns are the original's.
        errors.push(parse_error(&work, origin, &e));
        match e.span().and_then(|span| blank_line(&work, span.start)) {
            Some(next) => work = next,
            None => return (None, errors),
        }
    }
    (None, errors)
}

/// `text` with the line holding byte `at` replaced by spaces, if that line is a key-value
/// line or an element of a list (not a table header).
fn blank_line(text: &str, at: usize) -> Option<String> {
    let start = text[..at.min(text.len())].rfind('\n').map_or(0, |i| i + 1);
    let end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let line = text[start..end].trim_start();
    if line.is_empty() || line.starts_with('[') {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    out.push_str(&text[..start]);
    out.extend(text[start..end].chars().map(|_| ' '));
    out.push_str(&text[end..]);
    // A line that held part of a value spread over lines leaves the rest unparseable.
    out.parse::<toml::Table>().ok().map(|_| out)
}

/// Semantic problems with the line and column of their key, where the text has it.
fn locate(text: &str, origin: &str, problems: Vec<validate::Problem>) -> Vec<ConfigError> {
    let locator = Locator::new(text);
    problems
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
        .collect()
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
            if let Some(ca) = &mut config.lua.http_ca_file {
                from_dir(ca);
            }
            if config.access_log.path != "-" {
                from_dir(&mut config.access_log.path);
            }
            for l in &mut config.listeners {
                if let Some(tls) = &mut l.tls {
                    tls.resolve_paths(dir);
                }
            }
            for ca in config
                .filters
                .iter_mut()
                .filter_map(|f| f.jwks.as_mut()?.ca.as_mut())
            {
                from_dir(ca);
            }
            for c in &mut config.clusters {
                if let Some(tls) = &mut c.tls {
                    tls.resolve_paths(dir);
                }
                if let Some(d) = c.discovery.as_mut() {
                    let cas = [
                        d.file.as_mut(),
                        d.consul.as_mut().and_then(|c| c.ca.as_mut()),
                        d.eureka.as_mut().and_then(|e| e.ca.as_mut()),
                    ];
                    if let Some(k) = d.kubernetes.as_mut() {
                        k.ca.iter_mut()
                            .chain(k.token_file.iter_mut())
                            .for_each(from_dir);
                    }
                    cas.into_iter().flatten().for_each(from_dir);
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
