//! `<store>/v1/config.toml`: its schema as users write it (`[limits]`, `[remote]`), the file a
//! new store gets, and the validated [`Limits`]. Sizes and durations are read by
//! [`crate::units`]; the `[remote]` entries are the remote tier's to validate.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::units::{means_no_limit, parse_duration, parse_size};

/// Default byte limit (20 GiB).
pub const DEFAULT_MAX_SIZE: u64 = 20 << 30;
/// Default inode limit.
pub const DEFAULT_MAX_INODES: u64 = 5_000_000;
/// Default age limit (30 days since last mount).
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(30 * 86_400);

/// The store limits. `None` = unlimited.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Limits {
    /// Total bytes of objects (each object once).
    pub max_size: Option<u64>,
    /// Total inodes (objects, directories, symlinks of all layer trees).
    pub max_inodes: Option<u64>,
    /// Evict layers not mounted for longer than this.
    pub max_age: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_size: Some(DEFAULT_MAX_SIZE),
            max_inodes: Some(DEFAULT_MAX_INODES),
            max_age: Some(DEFAULT_MAX_AGE),
        }
    }
}

/// `<store>/v1/config.toml` as written by users: sizes and durations as strings.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// `[limits]`.
    #[serde(default)]
    pub limits: LimitsFile,
    /// `[remote]`: the remote tier's entries as written (validated by the remote tier when it
    /// is opened; only their names and types are checked here).
    #[serde(default)]
    pub remote: Option<RemoteFile>,
}

/// `[limits]` of config.toml: `max_size = "20G"`, `max_inodes = 5000000`, `max_age = "30d"`;
/// `"none"` (or 0) disables a limit.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsFile {
    /// e.g. "20G".
    pub max_size: Option<String>,
    /// e.g. 5000000; `"none"` is read as 0 (no limit).
    #[serde(default, deserialize_with = "count_or_none")]
    pub max_inodes: Option<u64>,
    /// e.g. "30d".
    pub max_age: Option<String>,
}

/// Reads `max_inodes` as a whole number or the string `"none"` (→ 0, no limit), like the
/// other limits take `"none"`.
///
/// Errors: a serde error naming what was found, e.g. `"lots"`.
fn count_or_none<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum CountOrNone {
        Count(u64),
        Negative(i64),
        Word(String),
    }
    let bad = |shown: String| {
        serde::de::Error::custom(format!(
            "max_inodes = {shown}: want a whole number or \"none\""
        ))
    };
    match CountOrNone::deserialize(d)? {
        CountOrNone::Count(n) => Ok(Some(n)),
        CountOrNone::Word(w) if means_no_limit(&w) => Ok(Some(0)),
        CountOrNone::Word(w) => Err(bad(format!("{w:?}"))),
        CountOrNone::Negative(n) => Err(bad(n.to_string())),
    }
}

/// The config.toml written into a new store.
pub const DEFAULT_CONFIG_TOML: &str = "\
# layercache store configuration. Sizes: 512M, 20G (binary units); durations: 90m, 12h, 30d.
# \"none\" disables a limit. `layercache gc` flags override these for one run.
[limits]
max_size = \"20G\"
max_inodes = 5000000
max_age = \"30d\"
";

impl LimitsFile {
    /// Validates into [`Limits`]; missing entries take the defaults.
    ///
    /// Errors: [`crate::Error::Invalid`] naming the bad value.
    pub fn resolve(&self) -> Result<Limits> {
        let d = Limits::default();
        Ok(Limits {
            max_size: match &self.max_size {
                Some(s) => parse_size(s)?,
                None => d.max_size,
            },
            max_inodes: match self.max_inodes {
                Some(0) => None,
                Some(n) => Some(n),
                None => d.max_inodes,
            },
            max_age: match &self.max_age {
                Some(s) => parse_duration(s)?,
                None => d.max_age,
            },
        })
    }
}

/// `[remote]` of config.toml as written; every entry optional. The remote tier validates it
/// (`RemoteFile::resolve` in src/remote/config.rs, which documents each entry); the store only
/// reads it, so that a misspelt entry is refused when the store opens.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteFile {
    /// `s3://bucket[/prefix]` or `file:///dir`.
    pub url: Option<String>,
    /// S3 endpoint URL (default: AWS, or `AWS_ENDPOINT`).
    pub endpoint: Option<String>,
    /// S3 region (default `AWS_REGION`, else us-east-1).
    pub region: Option<String>,
    /// Allow a plain-http endpoint.
    pub allow_http: Option<bool>,
    /// `env` (default) or `instance` (the instance metadata service).
    pub credentials: Option<String>,
    /// Per-request timeout, e.g. "30s".
    pub timeout: Option<String>,
    /// Bound of a mount's remote lookup, e.g. "10s".
    pub lookup_timeout: Option<String>,
    /// Bound on waiting for a background push at a run's exit, e.g. "5m"; "0" = do not wait.
    pub push_wait: Option<String>,
    /// Object transfers in flight (1..=256).
    pub concurrency: Option<usize>,
    /// Target size of a pack of small objects, e.g. "16M"; objects above a quarter of it are
    /// stored alone.
    pub pack_size: Option<String>,
    /// Mount an exact remote hit at once and fetch file content on first open (default
    /// true); `false` pulls the whole layer before the run's scripts start. The environment
    /// variable `LAYERCACHE_LAZY=0|1` overrides it for one run.
    pub lazy: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_read_from_the_file() {
        let f: ConfigFile = toml::from_str(DEFAULT_CONFIG_TOML).unwrap();
        assert_eq!(f.limits.resolve().unwrap(), Limits::default());
        // "none" disables the inode limit as it does the others; other words are refused.
        let f: ConfigFile =
            toml::from_str("[limits]\nmax_inodes = \"none\"\nmax_size = \"none\"\n").unwrap();
        let l = f.limits.resolve().unwrap();
        assert_eq!((l.max_inodes, l.max_size), (None, None));
        let e = toml::from_str::<ConfigFile>("[limits]\nmax_inodes = \"lots\"\n").unwrap_err();
        assert!(e.to_string().contains("lots"), "{e}");
        let e = toml::from_str::<ConfigFile>("[limits]\nmax_inodes = -1\n").unwrap_err();
        assert!(
            e.to_string()
                .contains("max_inodes = -1: want a whole number"),
            "{e}"
        );
    }
}
