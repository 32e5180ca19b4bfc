//! Configuration tests: defaults, each validation rule, unknown and missing keys, the shipped
//! examples, and properties (no panics on arbitrary input).

mod examples;
mod host;
mod ioc;
mod props;
mod shared;

use crate::{parse_host, parse_ioc, ConfigError, HostConfig, IocConfig};
use std::path::Path;

/// The origin every test text is named by.
const P: &str = "/etc/splitnet/test.toml";

/// Parses host.toml text.
fn host_text(text: &str) -> Result<HostConfig, ConfigError> {
    parse_host(text, Path::new(P))
}

/// Parses ioc.toml text.
fn ioc_text(text: &str) -> Result<IocConfig, ConfigError> {
    parse_ioc(text, Path::new(P))
}

/// A host.toml with the required key, followed by `extra` (in `[fabric]` unless it opens a table).
fn host(extra: &str) -> Result<HostConfig, ConfigError> {
    host_text(&format!("[fabric]\nioc = \"10.0.0.1:7400\"\n{extra}"))
}

/// An ioc.toml with the required keys, `fabric` lines and `lan` lines added to their tables,
/// then `rest` (further tables).
fn ioc(fabric: &str, lan: &str, rest: &str) -> Result<IocConfig, ConfigError> {
    ioc_text(&format!(
        "[fabric]\nlisten = \"10.0.0.1:7400\"\n{fabric}\n[lan]\ninterface = \"lan0\"\n{lan}\n{rest}"
    ))
}

/// The error of a refused configuration, as displayed.
fn err<T: std::fmt::Debug>(r: Result<T, ConfigError>) -> String {
    r.unwrap_err().to_string()
}

/// Asserts a validation error for `key` in file `P`, and returns its reason.
fn invalid<T: std::fmt::Debug>(r: Result<T, ConfigError>, key: &str) -> String {
    match r.unwrap_err() {
        ConfigError::Invalid {
            path,
            key: k,
            reason,
        } => {
            assert_eq!(path, Path::new(P));
            assert_eq!(k, key, "reason: {reason}");
            let shown = ConfigError::Invalid {
                path,
                key: k,
                reason: reason.clone(),
            }
            .to_string();
            assert_eq!(shown, format!("{P}: {key}: {reason}"));
            reason
        }
        other => panic!("expected Invalid for {key}, got {other}"),
    }
}

/// Asserts a parse error in file `P` whose message mentions every one of `words`.
fn parse_error<T: std::fmt::Debug>(r: Result<T, ConfigError>, words: &[&str]) -> String {
    match r.unwrap_err() {
        ConfigError::Parse { path, message } => {
            assert_eq!(path, Path::new(P));
            for w in words {
                assert!(message.contains(w), "{w:?} not in {message}");
            }
            message
        }
        other => panic!("expected Parse, got {other}"),
    }
}
