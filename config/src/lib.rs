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
#[cfg(test)]
mod tests;

pub use common::{Log, MacAddr, PoolConfig, Pools};
pub use error::ConfigError;
pub use host::{HostConfig, HostFabric, Interface};
pub use ioc::{IocConfig, IocFabric, Lan, Promiscuous};

use std::path::Path;

fn parse<T: serde::de::DeserializeOwned>(text: &str, origin: &Path) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: origin.to_path_buf(),
        message: e.to_string().trim_end().replace('\n', " "),
    })
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses and validates host.toml text; `origin` names it in errors.
pub fn parse_host(text: &str, origin: &Path) -> Result<HostConfig, ConfigError> {
    let c: HostConfig = parse(text, origin)?;
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
