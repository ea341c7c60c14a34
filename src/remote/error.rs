//! The remote tier's errors, by kind, so callers can branch on what went wrong: a remote that
//! is unreachable or slow is worked around (a local miss with one warning), refused credentials
//! are one clear line, a bad `[remote]` entry or URL is bad input (exit 2). Each keeps the
//! object_store error it came from as its `source`; the message is one line naming the remote.

use std::error::Error as StdError;

use std::time::Duration;

use crate::error::{Error, RemoteKind};

/// What the remote tier can fail with. Reaches callers as [`crate::Error::Remote`], which
/// keeps its [`RemoteError::kind`] and its message.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The server could not be connected to, or the connection broke (a transport error).
    #[error("remote {url}: cannot reach the server {what} (is {endpoint} up?)")]
    Unreachable {
        /// The remote's URL.
        url: String,
        /// What was being done ("reading key K").
        what: String,
        /// The endpoint tried (or "the AWS endpoint").
        endpoint: String,
        /// The object_store error.
        #[source]
        source: object_store::Error,
    },
    /// No answer within a bound (a request's `timeout` or the mount's `lookup_timeout`).
    #[error("remote {url}: no answer within {} s {what}", crate::units::fmt_secs(*secs))]
    Timeout {
        /// The remote's URL.
        url: String,
        /// What was being done.
        what: String,
        /// The bound, seconds.
        secs: f64,
        /// The object_store error, when a request timed out (none for the overall bound).
        #[source]
        source: Option<object_store::Error>,
    },
    /// The server refused the credentials (HTTP 401/403: wrong key or secret, or no
    /// permission).
    #[error(
        "remote {url}: access denied {what}: the credentials are wrong or lack permission \
         (check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
    )]
    Denied {
        /// The remote's URL.
        url: String,
        /// What was being done.
        what: String,
        /// The object_store error.
        #[source]
        source: object_store::Error,
    },
    /// What was asked for is not on the remote (HTTP 404).
    #[error("remote {url}: {what}: not found")]
    NotFound {
        /// The remote's URL.
        url: String,
        /// What was being read.
        what: String,
        /// The object_store error.
        #[source]
        source: object_store::Error,
    },
    /// A create-only write found the object there already (HTTP 409/412: another runner
    /// published the key first).
    #[error("remote {url}: {what}: it exists already")]
    Conflict {
        /// The remote's URL.
        url: String,
        /// What was being written.
        what: String,
        /// The object_store error.
        #[source]
        source: object_store::Error,
    },
    /// Bytes from the remote do not match what names them (blake3 or length mismatch, or a
    /// record/manifest/index that does not parse).
    #[error("remote {url}: {what}: corrupt ({detail})")]
    Corrupt {
        /// The remote's URL.
        url: String,
        /// Which object, pack, key or manifest.
        what: String,
        /// How it is wrong.
        detail: String,
    },
    /// Not asked: a request of this process timed out, could not connect or had its
    /// credentials refused earlier, so the remote is down for the rest of the process
    /// (`Remote::is_down`; nothing was sent).
    #[error(
        "remote {url}: not asked again in this run (it did not answer or refused the \
         credentials earlier); the next run tries again"
    )]
    Down {
        /// The remote's URL.
        url: String,
    },
    /// Not asked by a lazy layer's fetch: an earlier fetch of the run got no answer within its
    /// bound, and until one probe every `probe_secs` gets one, fetches fail at once (nothing
    /// was sent).
    #[error(
        "remote {url}: not asked: no answer within {} s at {} s into the run (one fetch \
         every {probe_secs} s asks again)",
        crate::units::fmt_secs(*bound_secs),
        crate::units::fmt_secs(*at_secs)
    )]
    Unanswered {
        /// The remote's URL.
        url: String,
        /// The bound the fetch that gave up waited, seconds.
        bound_secs: f64,
        /// When it gave up, seconds after the fetcher started.
        at_secs: f64,
        /// How often one fetch asks again, seconds.
        probe_secs: u64,
    },
    /// A bad `[remote]` entry, URL or credential setting (nothing was sent). Exit status 2.
    #[error("{0}")]
    BadConfig(String),
    /// Any other remote failure: the first line of the server's or client's message.
    #[error("remote {url}: {what}: {line}")]
    Other {
        /// The remote's URL.
        url: String,
        /// What was being done.
        what: String,
        /// The first line of the error (at most 300 characters).
        line: String,
        /// The object_store error.
        #[source]
        source: object_store::Error,
    },
}

/// The kind of an object_store error, from its variant and, for transport errors, the HTTP
/// error in its source chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Connect/request/interrupted transport errors.
    Unreachable,
    /// A request timed out.
    Timeout,
    /// 401/403.
    Denied,
    /// 404, or 416 (a range past the object's end).
    NotFound,
    /// 409/412.
    Conflict,
    /// Anything else.
    Other,
}

/// Classifies `e` (see [`Kind`]). S3 error bodies that only say so in text
/// (`InvalidAccessKeyId`, `SignatureDoesNotMatch`, `AccessDenied`) count as denied.
pub fn classify(e: &object_store::Error) -> Kind {
    use object_store::Error as E;
    use object_store::client::{HttpError, HttpErrorKind};
    match e {
        E::NotFound { .. } => return Kind::NotFound,
        E::AlreadyExists { .. } | E::Precondition { .. } => return Kind::Conflict,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => return Kind::Denied,
        _ => {}
    }
    let mut cur: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(h) = c.downcast_ref::<HttpError>() {
            match h.kind() {
                HttpErrorKind::Timeout => return Kind::Timeout,
                HttpErrorKind::Connect | HttpErrorKind::Request | HttpErrorKind::Interrupted => {
                    return Kind::Unreachable;
                }
                _ => {}
            }
        }
        cur = c.source();
    }
    let text = e.to_string();
    if [
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "403 Forbidden",
    ]
    .iter()
    .any(|s| text.contains(s))
    {
        return Kind::Denied;
    }
    // 416: a ranged GET past the object's end — the bytes asked for are not there (an object
    // shorter than its manifest says; a lazy layer is broken by it as by a missing object).
    if text.contains("404 Not Found") || text.contains("416 Range Not Satisfiable") {
        return Kind::NotFound;
    }
    if text.contains("error sending request") || text.contains("Connection refused") {
        return Kind::Unreachable;
    }
    Kind::Other
}

impl RemoteError {
    /// Wraps object_store error `e` of the remote at `url` (S3 `endpoint`, per-request
    /// `timeout`), met while doing `what`, by its `classify` kind.
    pub fn from_store(
        url: &str,
        endpoint: Option<&str>,
        timeout: Duration,
        what: &str,
        e: object_store::Error,
    ) -> Self {
        let (url, what) = (url.to_string(), what.to_string());
        match classify(&e) {
            Kind::Unreachable => RemoteError::Unreachable {
                url,
                what,
                endpoint: endpoint.unwrap_or("the AWS endpoint").to_string(),
                source: e,
            },
            Kind::Timeout => RemoteError::Timeout {
                url,
                what,
                secs: timeout.as_secs_f64(),
                source: Some(e),
            },
            Kind::Denied => RemoteError::Denied {
                url,
                what,
                source: e,
            },
            Kind::NotFound => RemoteError::NotFound {
                url,
                what,
                source: e,
            },
            Kind::Conflict => RemoteError::Conflict {
                url,
                what,
                source: e,
            },
            Kind::Other => {
                let text = e.to_string();
                let mut line = text.lines().next().unwrap_or("").to_string();
                if line.len() > 300 {
                    let mut cut = 300;
                    while !line.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    line.truncate(cut);
                    line.push('…');
                }
                RemoteError::Other {
                    url,
                    what,
                    line,
                    source: e,
                }
            }
        }
    }

    /// Its kind, as [`crate::Error::Remote`] carries it.
    pub fn kind(&self) -> RemoteKind {
        match self {
            RemoteError::Unreachable { .. } => RemoteKind::Unreachable,
            RemoteError::Down { .. } | RemoteError::Unanswered { .. } => RemoteKind::Unreachable,
            RemoteError::Timeout { .. } => RemoteKind::Timeout,
            RemoteError::Denied { .. } => RemoteKind::Denied,
            RemoteError::NotFound { .. } => RemoteKind::NotFound,
            RemoteError::Conflict { .. } => RemoteKind::Conflict,
            RemoteError::Corrupt { .. } => RemoteKind::Corrupt,
            RemoteError::BadConfig(_) => RemoteKind::BadConfig,
            RemoteError::Other { .. } => RemoteKind::Other,
        }
    }
}

impl From<RemoteError> for Error {
    fn from(e: RemoteError) -> Self {
        Error::Remote {
            kind: e.kind(),
            message: e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::config::RemoteConfig;
    use object_store::client::{HttpError, HttpErrorKind};
    use std::io;

    fn boxed(msg: &str) -> Box<dyn StdError + Send + Sync> {
        Box::new(io::Error::other(msg.to_string()))
    }

    fn cfg(endpoint: &str) -> RemoteConfig {
        crate::store::RemoteFile {
            endpoint: Some(endpoint.into()),
            allow_http: Some(true),
            ..Default::default()
        }
        .resolve(Some("s3://b/p"))
        .unwrap()
        .unwrap()
    }

    fn from_cfg(cfg: &RemoteConfig, what: &str, e: object_store::Error) -> RemoteError {
        RemoteError::from_store(&cfg.url, cfg.endpoint.as_deref(), cfg.timeout, what, e)
    }

    fn http(kind: HttpErrorKind) -> object_store::Error {
        let inner = HttpError::new(kind, io::Error::other("tcp"));
        object_store::Error::Generic {
            store: "S3",
            source: Box::new(inner),
        }
    }

    #[test]
    fn object_store_errors_map_to_kinds() {
        use object_store::Error as E;
        let p = || "v1/projects/p/caches/c/keys/k".to_string();
        assert_eq!(
            classify(&E::NotFound {
                path: p(),
                source: boxed("404")
            }),
            Kind::NotFound
        );
        for e in [
            E::AlreadyExists {
                path: p(),
                source: boxed("409"),
            },
            E::Precondition {
                path: p(),
                source: boxed("412"),
            },
        ] {
            assert_eq!(classify(&e), Kind::Conflict);
        }
        for e in [
            E::PermissionDenied {
                path: p(),
                source: boxed("403"),
            },
            E::Unauthenticated {
                path: p(),
                source: boxed("401"),
            },
            E::Generic {
                store: "S3",
                source: boxed("<Code>SignatureDoesNotMatch</Code>"),
            },
        ] {
            assert_eq!(classify(&e), Kind::Denied);
        }
        assert_eq!(classify(&http(HttpErrorKind::Connect)), Kind::Unreachable);
        assert_eq!(
            classify(&http(HttpErrorKind::Interrupted)),
            Kind::Unreachable
        );
        assert_eq!(classify(&http(HttpErrorKind::Timeout)), Kind::Timeout);
        assert_eq!(classify(&http(HttpErrorKind::Decode)), Kind::Other);
        let other = E::Generic {
            store: "S3",
            source: boxed("500 Internal Server Error\nbody"),
        };
        assert_eq!(classify(&other), Kind::Other);
    }

    #[test]
    fn messages_are_one_line_and_keep_the_source() {
        let e = from_cfg(
            &cfg("http://127.0.0.1:9"),
            "reading key k",
            http(HttpErrorKind::Connect),
        );
        assert!(e.kind().is_transient());
        let msg = e.to_string();
        assert_eq!(
            msg,
            "remote s3://b/p: cannot reach the server reading key k (is http://127.0.0.1:9 up?)"
        );
        assert!(e.source().is_some());
        // The crate's error keeps the kind and the message.
        let crate_err = Error::from(e);
        assert!(matches!(
            crate_err,
            Error::Remote {
                kind: RemoteKind::Unreachable,
                ..
            }
        ));
        assert_eq!(crate_err.to_string(), msg);
        let slow = from_cfg(
            &cfg("http://127.0.0.1:9"),
            "listing",
            http(HttpErrorKind::Timeout),
        );
        assert!(slow.kind().is_transient());
        assert_eq!(
            slow.to_string(),
            "remote s3://b/p: no answer within 30 s listing"
        );
        let denied = from_cfg(
            &cfg("http://x"),
            "listing",
            object_store::Error::PermissionDenied {
                path: "p".into(),
                source: boxed("403"),
            },
        );
        assert!(!denied.kind().is_transient());
        assert!(!denied.to_string().contains('\n'));
        assert!(denied.to_string().contains("AWS_SECRET_ACCESS_KEY"));
        let other = from_cfg(
            &cfg("http://x"),
            "listing",
            object_store::Error::Generic {
                store: "S3",
                source: boxed(&format!("{}\nsecond line", "é".repeat(400))),
            },
        );
        let m = other.to_string();
        assert!(!m.contains('\n') && m.len() < 400, "{m}");
        assert_eq!(
            Error::from(RemoteError::BadConfig("x".into())).exit_code(),
            2
        );
        assert_eq!(Error::from(other).exit_code(), 1);
    }
}
