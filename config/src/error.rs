//! Configuration errors: each names the file, the key and what is wrong.

use std::path::PathBuf;
use thiserror::Error;

/// Why a configuration was refused.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Not valid TOML for the schema (syntax, unknown key, wrong type, missing key).
    #[error("{}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (it names the key and the line).
        message: String,
    },
    /// A value outside its allowed range or form.
    #[error("{}: {key}: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Dotted key.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

/// A validation failure before the file name is attached.
#[derive(Debug)]
pub(crate) struct Invalid {
    pub key: String,
    pub reason: String,
}

impl Invalid {
    pub(crate) fn new(key: impl Into<String>, reason: impl Into<String>) -> Invalid {
        Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn at(self, path: &std::path::Path) -> ConfigError {
        ConfigError::Invalid {
            path: path.to_path_buf(),
            key: self.key,
            reason: self.reason,
        }
    }
}
