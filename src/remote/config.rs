//! The remote tier's configuration: `[remote]` in `<store>/v1/config.toml` (or `--remote URL`),
//! validated into [`RemoteConfig`], and the one place an [`ObjectStore`] is built from it.
//!
//! ```toml
//! [remote]
//! url = "s3://bucket/prefix"          # or file:///dir (a shared directory, tests)
//! endpoint = "http://127.0.0.1:8333"  # S3-compatible server (MinIO, SeaweedFS, Ceph RGW…)
//! region = "us-east-1"
//! allow_http = true                   # plain http: loopback or a trusted network only
//! credentials = "env"                 # env (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY) | instance
//! timeout = "30s"                     # one request
//! lookup_timeout = "10s"              # a mount's whole remote lookup
//! push_wait = "5m"                    # how long a run's exit waits for its background push
//! concurrency = 32                    # object transfers in flight
//! pack_size = "16M"                   # small objects travel in packs of about this size
//! ```
//! Unset entries fall back to the usual `AWS_*` environment variables (`AWS_ENDPOINT`,
//! `AWS_REGION`, `AWS_ALLOW_HTTP`, …, read by object_store's `AmazonS3Builder::from_env`), then to
//! the defaults above.

use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use serde::{Deserialize, Serialize};

use super::error::RemoteError;
use crate::error::{Error, Result};
use crate::store::RemoteFile;
use crate::units::{parse_duration, parse_size};

/// Default per-request timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default bound of a mount's remote lookup (key, restore listing, manifest).
pub const DEFAULT_LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Default bound on how long a run's exit waits for its background push.
pub const DEFAULT_PUSH_WAIT: Duration = Duration::from_secs(300);
/// Default target size of a pack of small objects (bytes).
pub const DEFAULT_PACK_SIZE: u64 = 16 << 20;
/// Default number of object transfers in flight.
pub const DEFAULT_CONCURRENCY: usize = 32;

/// Where credentials come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Credentials {
    /// `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`), or a web identity
    /// token (`AWS_WEB_IDENTITY_TOKEN_FILE`) or container credentials
    /// (`AWS_CONTAINER_CREDENTIALS_*`).
    Env,
    /// object_store's default chain, which may ask the instance metadata service.
    Instance,
}

/// What kind of object store the URL names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum Target {
    /// `s3://bucket/prefix`.
    S3 {
        /// Bucket.
        bucket: String,
    },
    /// `file:///dir`: a directory (shared filesystem; tests).
    File {
        /// The directory.
        dir: std::path::PathBuf,
    },
}

/// The validated remote configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteConfig {
    /// The URL as given (for messages).
    pub url: String,
    /// Store kind.
    pub target: Target,
    /// Prefix inside the bucket/dir (may be empty).
    pub prefix: String,
    /// Endpoint.
    pub endpoint: Option<String>,
    /// Region.
    pub region: Option<String>,
    /// Plain http allowed.
    pub allow_http: bool,
    /// Credential source.
    pub credentials: Credentials,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Lookup bound.
    pub lookup_timeout: Duration,
    /// Push wait bound.
    pub push_wait: Duration,
    /// Transfers in flight.
    pub concurrency: usize,
    /// Target pack size, bytes.
    pub pack_size: u64,
    /// Mount an exact remote hit lazily (`[remote] lazy`, `LAYERCACHE_LAZY`; see
    /// `super::lazy`).
    #[serde(default)]
    pub lazy: bool,
}

/// A bad `[remote]` entry, URL or credential setting.
fn bad_config(msg: String) -> Error {
    RemoteError::BadConfig(msg).into()
}

fn duration(what: &str, v: &Option<String>, default: Duration) -> Result<Duration> {
    match v {
        None => Ok(default),
        Some(s) => Ok(parse_duration(s)
            .map_err(|e| bad_config(format!("[remote] {what}: {e}")))?
            .unwrap_or(Duration::ZERO)),
    }
}

impl RemoteFile {
    /// Validates into a [`RemoteConfig`]; `url` (from `--remote`) overrides the file's url.
    /// `Ok(None)` when no url is configured anywhere (no remote tier).
    ///
    /// Errors: [`RemoteError::BadConfig`] (exit 2) naming the bad entry and what would be valid.
    pub fn resolve(&self, url: Option<&str>) -> Result<Option<RemoteConfig>> {
        let Some(url) = url.or(self.url.as_deref()).filter(|u| !u.is_empty()) else {
            return Ok(None);
        };
        let (target, prefix) = parse_url(url)?;
        let allow_http = self.allow_http.unwrap_or(false);
        if let Some(ep) = &self.endpoint {
            if !(ep.starts_with("http://") || ep.starts_with("https://")) {
                return Err(bad_config(format!(
                    "[remote] endpoint {ep:?}: want an http:// or https:// URL"
                )));
            }
            if ep.starts_with("http://") && !allow_http {
                return Err(bad_config(format!(
                    "[remote] endpoint {ep}: plain http needs allow_http = true (for a loopback \
                     or trusted-network server only)"
                )));
            }
        }
        let credentials = match self.credentials.as_deref() {
            None | Some("env") => Credentials::Env,
            Some("instance") => Credentials::Instance,
            Some(o) => {
                return Err(bad_config(format!(
                    "[remote] credentials = {o:?}: want \"env\" or \"instance\""
                )));
            }
        };
        let concurrency = self.concurrency.unwrap_or(DEFAULT_CONCURRENCY);
        if !(1..=256).contains(&concurrency) {
            return Err(bad_config(format!(
                "[remote] concurrency = {concurrency}: want 1 to 256"
            )));
        }
        Ok(Some(RemoteConfig {
            url: url.to_string(),
            target,
            prefix,
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            allow_http,
            credentials,
            timeout: duration("timeout", &self.timeout, DEFAULT_TIMEOUT)?,
            lookup_timeout: duration(
                "lookup_timeout",
                &self.lookup_timeout,
                DEFAULT_LOOKUP_TIMEOUT,
            )?,
            push_wait: duration("push_wait", &self.push_wait, DEFAULT_PUSH_WAIT)?,
            concurrency,
            pack_size: match &self.pack_size {
                None => DEFAULT_PACK_SIZE,
                Some(v) => parse_size(v)
                    .map_err(|e| bad_config(format!("[remote] pack_size: {e}")))?
                    .unwrap_or(DEFAULT_PACK_SIZE),
            },
            lazy: lazy_choice(self.lazy)?,
        }))
    }
}

/// Whether remote hits mount lazily: [`lazy_env`] over the file's `lazy`, default true.
///
/// Errors: as [`lazy_env`].
fn lazy_choice(file: Option<bool>) -> Result<bool> {
    Ok(lazy_env()?.or(file).unwrap_or(true))
}

/// `LAYERCACHE_LAZY`: whether remote hits mount lazily, `Some(true)` for `1`, `true` or `yes`,
/// `Some(false)` for `0`, `false` or `no`; `None` when unset or empty.
///
/// Errors: [`RemoteError::BadConfig`] (exit 2) for another value, naming the variable, the
/// value and the valid ones (a run checks it before anything, with a remote or without).
pub fn lazy_env() -> Result<Option<bool>> {
    match std::env::var("LAYERCACHE_LAZY") {
        Err(_) => Ok(None),
        Ok(v) => parse_lazy_env(&v),
    }
}

/// [`lazy_env`] of the value `v`.
fn parse_lazy_env(v: &str) -> Result<Option<bool>> {
    match v {
        "" => Ok(None),
        "1" | "true" | "yes" => Ok(Some(true)),
        "0" | "false" | "no" => Ok(Some(false)),
        _ => Err(bad_config(format!(
            "LAYERCACHE_LAZY={v:?}: want 1, true or yes (mount remote hits lazily) or 0, false \
             or no (pull them whole)"
        ))),
    }
}

/// Splits `s3://bucket/prefix` or `file:///dir` into its target and prefix.
///
/// Errors: [`RemoteError::BadConfig`] (exit 2) for another scheme, a missing bucket, or a relative file path.
pub fn parse_url(url: &str) -> Result<(Target, String)> {
    let bad = |why: &str| {
        bad_config(format!(
            "remote url {url:?}: {why} (want s3://bucket/prefix or file:///absolute/dir)"
        ))
    };
    if let Some(rest) = url.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket"));
        }
        let prefix = prefix.trim_matches('/').to_string();
        ObjectPath::parse(&prefix).map_err(|e| bad(&format!("bad prefix: {e}")))?;
        return Ok((
            Target::S3 {
                bucket: bucket.to_string(),
            },
            prefix,
        ));
    }
    if let Some(rest) = url.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(bad("the directory must be absolute"));
        }
        return Ok((Target::File { dir: rest.into() }, String::new()));
    }
    Err(bad("unknown scheme"))
}

/// True when the environment names credentials object_store can use without asking the
/// instance metadata service.
fn env_has_credentials() -> bool {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    (set("AWS_ACCESS_KEY_ID") && set("AWS_SECRET_ACCESS_KEY"))
        || set("AWS_WEB_IDENTITY_TOKEN_FILE")
        || set("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
        || set("AWS_CONTAINER_CREDENTIALS_FULL_URI")
}

impl RemoteConfig {
    /// Builds the object store (once per process; everything else codes against
    /// `Arc<dyn ObjectStore>`). Requests get [`RemoteConfig::timeout`], a 3 s connect timeout
    /// and at most 2 retries, so an unreachable server costs seconds, not minutes.
    ///
    /// Errors: [`RemoteError::BadConfig`] (exit 2) when no credentials are configured (with `credentials =
    /// "env"`) or the builder rejects the settings; [`Error::Io`] creating a `file://` dir.
    pub fn build(&self) -> Result<Arc<dyn ObjectStore>> {
        match &self.target {
            Target::File { dir } => {
                std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
                let fs = LocalFileSystem::new_with_prefix(dir)
                    .map_err(|e| bad_config(format!("remote {}: {e}", self.url)))?;
                Ok(Arc::new(fs))
            }
            Target::S3 { bucket } => {
                if self.credentials == Credentials::Env && !env_has_credentials() {
                    return Err(bad_config(format!(
                        "remote {}: no credentials: set AWS_ACCESS_KEY_ID and \
                         AWS_SECRET_ACCESS_KEY (or credentials = \"instance\" in [remote])",
                        self.url
                    )));
                }
                let client = object_store::ClientOptions::new()
                    .with_timeout(self.timeout)
                    .with_connect_timeout(Duration::from_secs(3))
                    .with_allow_http(self.allow_http);
                let retry = object_store::RetryConfig {
                    max_retries: 2,
                    retry_timeout: self.timeout,
                    ..Default::default()
                };
                let mut b = AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .with_client_options(client)
                    .with_retry(retry)
                    .with_allow_http(self.allow_http);
                if let Some(ep) = &self.endpoint {
                    b = b.with_endpoint(ep);
                }
                if let Some(r) = &self.region {
                    b = b.with_region(r);
                } else if std::env::var_os("AWS_REGION").is_none()
                    && std::env::var_os("AWS_DEFAULT_REGION").is_none()
                {
                    b = b.with_region("us-east-1");
                }
                let s3 = b
                    .build()
                    .map_err(|e| bad_config(format!("remote {}: {e}", self.url)))?;
                Ok(Arc::new(s3))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lazy_variable_takes_six_words_and_names_a_bad_value_and_the_valid_ones() {
        for (v, want) in [
            ("", None),
            ("1", Some(true)),
            ("true", Some(true)),
            ("yes", Some(true)),
            ("0", Some(false)),
            ("false", Some(false)),
            ("no", Some(false)),
        ] {
            assert_eq!(parse_lazy_env(v).unwrap(), want, "{v:?}");
        }
        for bad in ["yes please", "maybe", "TRUE", " 1", "on", "2"] {
            let e = parse_lazy_env(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
            let e = e.to_string();
            assert!(
                e.contains(&format!("LAYERCACHE_LAZY={bad:?}"))
                    && e.contains("want 1, true or yes")
                    && e.contains("0, false or no"),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn urls_and_entries_are_validated() {
        let f = RemoteFile::default();
        assert_eq!(f.resolve(None).unwrap(), None);
        let c = f.resolve(Some("s3://b/some/prefix/")).unwrap().unwrap();
        assert_eq!(c.target, Target::S3 { bucket: "b".into() });
        assert_eq!(c.prefix, "some/prefix");
        assert_eq!(c.push_wait, DEFAULT_PUSH_WAIT);
        for bad in ["http://x", "s3://", "file://rel"] {
            let e = f.resolve(Some(bad)).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains("want s3://"), "{e}");
        }
        let http = RemoteFile {
            endpoint: Some("http://127.0.0.1:1".into()),
            ..Default::default()
        };
        let e = http.resolve(Some("s3://b")).unwrap_err().to_string();
        assert!(e.contains("allow_http = true"), "{e}");
        let c = RemoteFile {
            allow_http: Some(true),
            push_wait: Some("0".into()),
            ..http
        };
        assert_eq!(
            c.resolve(Some("s3://b")).unwrap().unwrap().push_wait,
            Duration::ZERO
        );
        let e = RemoteFile {
            concurrency: Some(0),
            ..Default::default()
        }
        .resolve(Some("s3://b"))
        .unwrap_err()
        .to_string();
        assert!(e.contains("concurrency = 0"), "{e}");
        let toml_text = "url = \"s3://b/p\"\nregion = \"eu\"\nbogus = 1\n";
        let e = toml::from_str::<RemoteFile>(toml_text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
    }
}
