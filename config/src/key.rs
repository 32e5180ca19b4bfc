//! Static keys as an operator writes them: 32 bytes in standard base64 (44 characters, as
//! `wg genkey` prints them), in a config value or alone in a key file.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::{Deserialize, Deserializer};
use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// A 32-byte X25519 key (public in a config file, private in a key file).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key(pub [u8; 32]);

impl FromStr for Key {
    type Err = String;

    /// 32 bytes in standard base64, surrounding whitespace ignored.
    fn from_str(s: &str) -> Result<Key, String> {
        let bad =
            || "not a key (32 bytes in base64, 44 characters: splitnetctl genkey)".to_string();
        let bytes = STANDARD.decode(s.trim()).map_err(|_| bad())?;
        <[u8; 32]>::try_from(bytes).map(Key).map_err(|_| bad())
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&STANDARD.encode(self.0))
    }
}

/// Public keys are shown whole; this type also holds private keys, so `Debug` never does.
impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(..)")
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Where a daemon's private key is: `configured`, or else the credential `splitnet.key`
/// that systemd's `LoadCredential=` puts in `$CREDENTIALS_DIRECTORY`.
pub fn private_key_path(configured: Option<&Path>) -> Option<PathBuf> {
    configured.map(Path::to_path_buf).or_else(|| {
        std::env::var_os("CREDENTIALS_DIRECTORY").map(|d| Path::new(&d).join("splitnet.key"))
    })
}

/// Reads a private key file: one key in base64. A file that anyone but its owner may read
/// or write is refused, as ssh refuses such a key.
pub fn read_private_key(path: &Path) -> Result<Key, String> {
    let what = |e: &dyn fmt::Display| format!("private key {}: {e}", path.display());
    let meta = std::fs::metadata(path).map_err(|e| what(&e))?;
    if meta.mode() & 0o077 != 0 {
        return Err(what(&format_args!(
            "mode {:04o}: others may read it; chmod 600 it",
            meta.mode() & 0o7777
        )));
    }
    if meta.len() > 1024 {
        return Err(what(&"not a key file (longer than 1 KiB)"));
    }
    let text = std::fs::read_to_string(path).map_err(|e| what(&e))?;
    text.parse().map_err(|e: String| what(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn keys_round_trip_and_bad_ones_are_refused() {
        let k = Key([7; 32]);
        let text = k.to_string();
        assert_eq!(text.len(), 44);
        assert_eq!(format!(" {text}\n").parse::<Key>(), Ok(k));
        for bad in ["", "abc", &text[..40], &format!("{text}AAAA"), "!!!!"] {
            assert!(bad.parse::<Key>().is_err(), "{bad:?}");
        }
        assert_eq!(format!("{k:?}"), "Key(..)");
    }

    #[test]
    fn key_files_only_their_owner_can_read() {
        let dir = std::env::temp_dir().join(format!("splitnet-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("k");
        std::fs::write(&p, format!("{}\n", Key([9; 32]))).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_private_key(&p).unwrap_err();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_private_key(&p), Ok(Key([9; 32])));
        std::fs::write(&p, "not a key").unwrap();
        assert!(read_private_key(&p).unwrap_err().contains("not a key"));
        assert!(read_private_key(&dir.join("absent")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
