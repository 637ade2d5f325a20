//! What is wrong with a configuration: each problem with its key and where the key came from.

use std::fmt;

/// One thing wrong with the configuration, with the key it is about and where that key came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted key path, e.g. `triggers[0].lease`.
    pub key: String,
    /// What is wrong.
    pub message: String,
    /// The file or environment variable the key came from.
    pub source: String,
    /// Line and column (1-based) of the key in the file, when it is in the file.
    pub at: Option<(usize, usize)>,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Some((line, column)) => write!(
                f,
                "{}: {} (in {}:{line}:{column})",
                self.key, self.message, self.source
            ),
            None => write!(f, "{}: {} (in {})", self.key, self.message, self.source),
        }
    }
}

/// Every problem found in a configuration.
#[derive(Debug)]
pub struct ConfigError {
    /// The problems, in the order they were found.
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid configuration ({} problem", self.problems.len())?;
        if self.problems.len() != 1 {
            write!(f, "s")?;
        }
        write!(f, "):")?;
        for p in &self.problems {
            write!(f, "\n  - {p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// What one section's `validate` found wrong, each problem as (key, message) with the key from
/// the top of the file (`redis.url`, `sinks.NAME.tls.ca_file`): the loader adds where each
/// key came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub Vec<(String, String)>);

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (key, message)) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, "; ")?;
            }
            write!(f, "{key}: {message}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Invalid {}
