//! The located error type: every problem found while loading a config, each with its
//! origin (file path or `<default>`), line, column and dotted key path.

use std::fmt;

/// One problem in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// File path, `<default>` for the embedded config, or `<memory>` for [`crate::validate`].
    pub origin: String,
    /// 1-based line, when the problem could be located in the text.
    pub line: Option<usize>,
    /// 1-based column (in characters), when the problem could be located in the text.
    pub column: Option<usize>,
    /// Dotted key path, e.g. `routes[2].cluster`; empty when unknown (some syntax errors).
    pub key: String,
    /// What was wrong and what was expected.
    pub message: String,
}

impl fmt::Display for ConfigError {
    /// `FILE:LINE:COL: KEY: MESSAGE`; line/column and key are left out when unknown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.origin)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(col) = self.column {
                write!(f, ":{col}")?;
            }
        }
        f.write_str(": ")?;
        if !self.key.is_empty() {
            write!(f, "{}: ", self.key)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Every problem found in one config, in file order (line, then column).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    /// The individual problems.
    pub fn errors(&self) -> &[ConfigError] {
        &self.0
    }

    /// Number of problems.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are no problems (never the case for a returned `Err`).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for ConfigErrors {
    /// One line per problem, separated by newlines (no trailing newline).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl IntoIterator for ConfigErrors {
    type Item = ConfigError;
    type IntoIter = std::vec::IntoIter<ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        Self(vec![e])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(line: Option<usize>, column: Option<usize>, key: &str) -> ConfigError {
        ConfigError {
            origin: "gw.toml".into(),
            line,
            column,
            key: key.into(),
            message: "expected something".into(),
        }
    }

    #[test]
    fn display_formats() {
        assert_eq!(
            err(Some(3), Some(7), "routes[0].cluster").to_string(),
            "gw.toml:3:7: routes[0].cluster: expected something"
        );
        assert_eq!(
            err(Some(3), None, "a").to_string(),
            "gw.toml:3: a: expected something"
        );
        assert_eq!(
            err(None, None, "").to_string(),
            "gw.toml: expected something"
        );
        let all = ConfigErrors(vec![err(Some(1), Some(1), "a"), err(Some(2), Some(5), "b")]);
        assert_eq!(
            all.to_string(),
            "gw.toml:1:1: a: expected something\ngw.toml:2:5: b: expected something"
        );
        assert_eq!(all.errors().len(), 2);
    }
}
