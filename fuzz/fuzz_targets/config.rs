//! The configuration parser on arbitrary text.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|text: &str| {
    let _ = splitnet_config::parse_host(text, Path::new("fuzz.toml"));
    let _ = splitnet_config::parse_ioc(text, Path::new("fuzz.toml"));
});
