//! Validated identifiers that cross module boundaries: projects, caches, keys, layers, objects.
//!
//! Each newtype validates in its constructor, so a value of the type is always safe to use as a
//! single path component: 1..=128 bytes (keys up to 512), ASCII letters, digits and `._-+=@,`
//! (`:` too for keys), not starting with `.` or `-`, no `/`, no `..`, no control characters.

use std::fmt;

use crate::error::{Error, Result};

fn validate(kind: &str, value: &str, max: usize, extra: &[u8]) -> Result<()> {
    let allowed =
        |b: u8| b.is_ascii_alphanumeric() || b"._-+=@,".contains(&b) || extra.contains(&b);
    if value.is_empty() || value.len() > max {
        return Err(Error::invalid(format!(
            "invalid {kind} {value:?}: must be 1 to {max} bytes long"
        )));
    }
    if value.starts_with('.') || value.starts_with('-') {
        return Err(Error::invalid(format!(
            "invalid {kind} {value:?}: must not start with '.' or '-'"
        )));
    }
    // By character, not byte: a non-ASCII letter is named as written ('ö', not 'Ã').
    if let Some(bad) = value.chars().find(|c| !c.is_ascii() || !allowed(*c as u8)) {
        return Err(Error::invalid(format!(
            "invalid {kind} {value:?}: character {bad:?} is not allowed (use ASCII letters, digits and ._-+=@,{})",
            String::from_utf8_lossy(extra)
        )));
    }
    Ok(())
}

macro_rules! name_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $max:expr, $extra:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates `value` (see the module docs). Errors: [`Error::Invalid`] naming the value.
            pub fn new(value: impl Into<String>) -> Result<Self> {
                let value = value.into();
                validate($kind, &value, $max, $extra)?;
                Ok(Self(value))
            }

            /// The id as a string (a valid single path component).
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl TryFrom<String> for $name {
            type Error = Error;
            fn try_from(value: String) -> Result<Self> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self> {
                Self::new(s)
            }
        }
    };
}

name_id!(
    /// A project: the unit of isolation in the store (`projects/<project>/`).
    ProjectId,
    "project id",
    128,
    b""
);
name_id!(
    /// A cache within a project, e.g. `npm` or `node_modules`; mounted at `<mount-root>/<id>`.
    CacheId,
    "cache id",
    128,
    b""
);
name_id!(
    /// A cache key, e.g. `npm-linux-x86_64-0a1b2c3d-<hash>`; restore keys are prefixes of keys.
    CacheKey,
    "cache key",
    512,
    b":"
);
name_id!(
    /// A layer directory name under `layers/`.
    LayerId,
    "layer id",
    128,
    b""
);

/// A content-addressed object: the blake3 hash of a regular file's bytes (32 bytes), shown as
/// 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub [u8; 32]);

impl ObjectId {
    /// Lowercase hex form, 64 characters.
    pub fn to_hex(&self) -> String {
        blake3::Hash::from_bytes(self.0).to_hex().to_string()
    }

    /// Parses 64 hex digits. Errors: [`Error::Invalid`] naming the input.
    pub fn from_hex(s: &str) -> Result<Self> {
        blake3::Hash::from_hex(s)
            .map(|h| ObjectId(*h.as_bytes()))
            .map_err(|_| Error::invalid(format!("invalid object id {s:?}: want 64 hex digits")))
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({})", self.to_hex())
    }
}

/// Whether `run` may name a run's files (`failed/<run>/`, `events-reserve/<run>`): not empty,
/// ASCII letters, digits and `-` only — one path component, never `.`/`..`. Wider than the
/// shape of a new run id (`telemetry::is_run_id`): a run's id is checked where it is used as a
/// path, whoever made it.
pub(crate) fn is_run_path_safe(run: &str) -> bool {
    !run.is_empty() && run.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_reject_path_tricks() {
        for bad in [
            "",
            "..",
            ".hidden",
            "-x",
            "a/b",
            "a\nb",
            "a b",
            &"x".repeat(129),
        ] {
            assert!(ProjectId::new(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(ProjectId::new("acme-web_2").unwrap().as_str(), "acme-web_2");
        assert!(CacheKey::new("npm-linux-x86_64:abc").is_ok());
        assert!(CacheId::new("npm:x").is_err());
    }

    #[test]
    fn error_names_the_input() {
        let msg = CacheId::new("a/b").unwrap_err().to_string();
        assert!(msg.contains("cache id") && msg.contains("a/b"), "{msg}");
        let msg = CacheId::new("caché").unwrap_err().to_string();
        assert!(msg.contains("character 'é' is not allowed"), "{msg}");
    }

    #[test]
    fn object_id_hex_roundtrip() {
        let id = ObjectId(*blake3::hash(b"hello").as_bytes());
        assert_eq!(ObjectId::from_hex(&id.to_hex()).unwrap(), id);
        assert!(ObjectId::from_hex("zz").is_err());
    }
}
