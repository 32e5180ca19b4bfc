//! splitnet configuration: the TOML files of both daemons, parsed and validated.
//!
//! Unknown keys are refused, every optional key has a default, and every error names the
//! file, the key and what is wrong. Only validated configurations leave this crate.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod common;
mod error;
mod host;
mod ioc;
pub mod key;
#[cfg(test)]
mod tests;

pub use common::{
    Control, FabricAddr, Log, MacAddr, Metrics, PoolConfig, Pools, SchedClass, Scheduling,
};
pub use error::ConfigError;
pub use host::{HostAuth, HostConfig, HostFabric, Interface, StandbyIoc};
pub use ioc::{
    Admission, AdmittedHost, IocAuth, IocConfig, IocFabric, Lan, LanMode, Promiscuous,
    SetMacPolicy, MAX_HOST_QUEUES, MAX_TRUNK_VLANS, PORT_PREFIX,
};

use std::path::Path;

/// Deserializes `text`; a failure becomes a one-line message starting with its position.
fn parse<T: serde::de::DeserializeOwned>(text: &str, origin: &Path) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| {
        let what = e.message().trim_end().replace('\n', " ");
        let message = match e.span() {
            Some(span) => {
                let (line, column) = position(text, span.start);
                match excerpt(text, line) {
                    Some(source) => format!("line {line}, column {column} ({source}): {what}"),
                    None => format!("line {line}, column {column}: {what}"),
                }
            }
            None => what,
        };
        ConfigError::Parse {
            path: origin.to_path_buf(),
            message,
        }
    })
}

/// Line `line` (1-based) of `text`, trimmed and shortened to 60 characters, in backquotes;
/// `None` when blank.
fn excerpt(text: &str, line: usize) -> Option<String> {
    let l = text.lines().nth(line.saturating_sub(1))?.trim();
    match l.char_indices().nth(60) {
        _ if l.is_empty() => None,
        Some((cut, _)) => Some(format!("`{}`...", &l[..cut])),
        None => Some(format!("`{l}`")),
    }
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
fn position(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[start..].chars().count() + 1)
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses and validates host.toml text; `origin` names it in errors.
pub fn parse_host(text: &str, origin: &Path) -> Result<HostConfig, ConfigError> {
    let mut c: HostConfig = parse(text, origin)?;
    c.normalize();
    c.validate().map_err(|e| e.at(origin))?;
    Ok(c)
}

/// Parses and validates ioc.toml text; `origin` names it in errors.
pub fn parse_ioc(text: &str, origin: &Path) -> Result<IocConfig, ConfigError> {
    let c: IocConfig = parse(text, origin)?;
    c.validate().map_err(|e| e.at(origin))?;
    Ok(c)
}

/// Reads, parses and validates a host.toml.
pub fn load_host(path: &Path) -> Result<HostConfig, ConfigError> {
    parse_host(&read(path)?, path)
}

/// Reads, parses and validates an ioc.toml.
pub fn load_ioc(path: &Path) -> Result<IocConfig, ConfigError> {
    parse_ioc(&read(path)?, path)
}
