//! The crate-wide error type and its mapping to documented exit codes.
//!
//! Exit codes (the CLI contract): 0 success; 1 an operation failed (I/O, a child command failed
//! without its own status, the store refused); 2 bad input (arguments, options, spec, ids,
//! directories) — nothing was changed; with `run`, a failing setup or COMMAND passes its own
//! exit status through.

use std::io;
use std::path::{Path, PathBuf};

/// Result alias used across the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors returned by the library. Each names the input or path it is about.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input: the message names the input and what would be valid. Exit status 2.
    #[error("{0}")]
    Invalid(String),
    /// An I/O error on `path`. Exit status 1.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory the operation was about.
        path: PathBuf,
        /// The underlying OS error.
        #[source]
        source: io::Error,
    },
    /// An I/O error of a full filesystem (`ENOSPC`, `EDQUOT`) on `path`, with the room its
    /// filesystem had when the error was met, before any cleanup freed some (see
    /// [`Error::noting_room`]): what a message about the full store reports. Exit status 1.
    #[error("{}: {source}", path.display())]
    NoSpace {
        /// The file or directory the operation was about.
        path: PathBuf,
        /// The underlying OS error (`ENOSPC` or `EDQUOT`).
        #[source]
        source: io::Error,
        /// The filesystem's size and free bytes and inodes then.
        room: crate::sys::FsRoom,
    },
    /// An operation failed for a reason stated in the message. Exit status 1.
    #[error("{0}")]
    Failed(String),
    /// `mountpoint` is not a mount of this store (nothing changed). Exit status 2.
    #[error("{}: not a layercache store mount{detail}", mountpoint.display())]
    NotAStoreMount {
        /// The path given.
        mountpoint: PathBuf,
        /// More context, starting with a space (or empty).
        detail: String,
    },
    /// Something is already mounted at `mountpoint` (nothing changed). Exit status 2.
    #[error("mountpoint {} is busy: something is already mounted there", mountpoint.display())]
    MountpointBusy {
        /// The canonical mountpoint.
        mountpoint: PathBuf,
    },
    /// umount(2) failed, e.g. `EBUSY` while a process still uses the mount (nothing changed).
    /// Exit status 1.
    #[error("unmount {}: {source} (is a process still using it?)", mountpoint.display())]
    Unmount {
        /// The mountpoint.
        mountpoint: PathBuf,
        /// The umount(2) error.
        #[source]
        source: io::Error,
    },
    /// The remote tier failed (unreachable, denied, corrupt, bad configuration…): its kind and
    /// its one-line message naming the remote (the remote tier builds it). Exit status 2 for
    /// bad configuration, else 1.
    #[error("{message}")]
    Remote {
        /// What went wrong, for callers that work around some kinds.
        kind: RemoteKind,
        /// The message, naming the remote.
        message: String,
    },
    /// The store's filesystem is full (`ENOSPC`/`EDQUOT`): the message says it in plain
    /// words (how big the filesystem is, what is free, that nothing was published, what to
    /// do). Exit status `status`: a setup's own status, 1 for a failed promote.
    #[error("{message}")]
    StoreFull {
        /// The one-line explanation.
        message: String,
        /// The exit status of the run.
        status: i32,
    },
    /// A child process (setup, maintenance, COMMAND) exited with this status; passed through.
    #[error("{what} exited with status {status}")]
    Child {
        /// Which script or command failed.
        what: String,
        /// Its exit status (128 + signal number when killed by a signal).
        status: i32,
    },
}

impl Error {
    /// Whether this is an I/O error of a full filesystem or quota (`ENOSPC`, `EDQUOT`),
    /// directly or as the source of [`Error::Io`]/[`Error::Unmount`]; [`Error::StoreFull`]
    /// too.
    pub fn is_no_space(&self) -> bool {
        match self {
            Error::Io { source, .. } | Error::Unmount { source, .. } => full_errno(source),
            Error::StoreFull { .. } | Error::NoSpace { .. } => true,
            _ => false,
        }
    }

    /// This error with the room of the filesystem holding `at` as it is now, when it is an
    /// [`Error::Io`] of a full filesystem ([`Error::is_no_space`]): an [`Error::NoSpace`].
    /// Called where the error is met, before a cleanup frees space or inodes; any other error
    /// (an [`Error::NoSpace`] already, too) is returned as it is, as is this one when the
    /// filesystem cannot be asked.
    pub fn noting_room(self, at: &Path) -> Self {
        match self {
            Error::Io { path, source } if full_errno(&source) => match crate::sys::FsRoom::of(at) {
                Some(room) => Error::NoSpace { path, source, room },
                None => Error::Io { path, source },
            },
            e => e,
        }
    }

    /// The room of the full filesystem when the error was met ([`Error::NoSpace`]); `None`
    /// for another error.
    pub fn room_when_full(&self) -> Option<crate::sys::FsRoom> {
        match self {
            Error::NoSpace { room, .. } => Some(*room),
            _ => None,
        }
    }

    /// Builds an [`Error::Io`] for `path`.
    pub fn io(path: impl AsRef<Path>, source: io::Error) -> Self {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            source,
        }
    }

    /// Builds an [`Error::Invalid`] from a message.
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::Invalid(msg.into())
    }

    /// The process exit status for this error (see the module docs).
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Invalid(_) | Error::NotAStoreMount { .. } | Error::MountpointBusy { .. } => 2,
            Error::Io { .. } | Error::NoSpace { .. } | Error::Failed(_) | Error::Unmount { .. } => {
                1
            }
            Error::Remote { kind, .. } => kind.exit_code(),
            Error::Child { status, .. } | Error::StoreFull { status, .. } => *status,
        }
    }
}

/// Whether `e` is `ENOSPC` or `EDQUOT`.
fn full_errno(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// The kind of a remote-tier failure ([`Error::Remote`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteKind {
    /// The server could not be reached, or the connection broke.
    Unreachable,
    /// No answer within a bound.
    Timeout,
    /// The credentials were refused (HTTP 401/403).
    Denied,
    /// What was asked for is not there (HTTP 404).
    NotFound,
    /// A create-only write found the object there already (HTTP 409/412).
    Conflict,
    /// Bytes that do not match what names them.
    Corrupt,
    /// A bad `[remote]` entry, URL or credential setting (exit status 2).
    BadConfig,
    /// Anything else.
    Other,
}

impl RemoteKind {
    /// True for failures a run works around as a local miss with one warning (unreachable,
    /// slow).
    pub fn is_transient(self) -> bool {
        matches!(self, RemoteKind::Unreachable | RemoteKind::Timeout)
    }

    /// The process exit status: 2 for bad configuration, else 1.
    pub fn exit_code(self) -> i32 {
        match self {
            RemoteKind::BadConfig => 2,
            _ => 1,
        }
    }
}

/// Adds a path to an `io::Result`.
pub trait IoContext<T> {
    /// Wraps the error as [`Error::Io`] naming `path`.
    fn at(self, path: impl AsRef<Path>) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn at(self, path: impl AsRef<Path>) -> Result<T> {
        self.map_err(|e| Error::io(path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_contract() {
        assert_eq!(Error::invalid("x").exit_code(), 2);
        assert_eq!(Error::Failed("x".into()).exit_code(), 1);
        assert_eq!(
            Error::Child {
                what: "setup".into(),
                status: 7
            }
            .exit_code(),
            7
        );
        let full: Result<()> = Err(io::Error::from_raw_os_error(libc::ENOSPC)).at("/s");
        assert!(full.unwrap_err().is_no_space());
        assert!(!Error::Failed("No space left on device".into()).is_no_space());
        let e = Error::StoreFull {
            message: "full".into(),
            status: 3,
        };
        assert_eq!((e.exit_code(), e.to_string().as_str()), (3, "full"));
        // Noting the room keeps the message and the exit status; another error stays as is.
        let dir = std::env::temp_dir();
        let full: Result<()> = Err(io::Error::from_raw_os_error(libc::ENOSPC)).at("/s/f");
        let noted = full.unwrap_err().noting_room(&dir);
        assert!(
            noted.is_no_space() && noted.room_when_full().is_some(),
            "{noted:?}"
        );
        assert_eq!(noted.exit_code(), 1);
        assert!(
            noted.to_string().starts_with("/s/f: No space left"),
            "{noted}"
        );
        let again = noted.noting_room(Path::new("/nonexistent"));
        assert!(again.room_when_full().is_some());
        let other = Error::io("/s/f", io::Error::from_raw_os_error(libc::EIO)).noting_room(&dir);
        assert!(matches!(other, Error::Io { .. }) && other.room_when_full().is_none());
        let e: Result<()> = Err(io::Error::from_raw_os_error(libc::ENOENT)).at("/nope");
        let msg = e.unwrap_err().to_string();
        assert!(msg.starts_with("/nope: "), "{msg}");
    }
}
