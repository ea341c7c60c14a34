//! A mount that outlives its run: the daemon side of warm mounts. A daemon started with an
//! owner ends its mount when the owner exits (even by `kill -9`). With a control socket
//! ([`OverlayConfig::control`](super::OverlayConfig::control)) its owner may instead hand the
//! mount back: the mount goes **idle** for a bounded time, and a later run may **adopt** it —
//! its dentries, inodes and page cache are still warm in the kernel, so that run pays no first
//! pass (see /work/shared/notes/warmstart.md for what the kernel keeps).
//!
//! The daemon keeps no judgement of its own on whether a mount may be reused: the store hands
//! a mount back only when the run changed nothing in it (`store/warm.rs` checks the upper and
//! work dirs), and checks that again before it adopts one. Here only the ownership changes:
//!
//! ```text
//!            idle <ms>                   (ms pass, or `end`)
//!   Owned ─────────────▶ Idle ──────────────────────────────▶ Ending: detach, exit
//!     ▲ │                 │
//!     │ │ owner exits     │ adopt <pid>
//!     │ ▼                 ▼
//!   Ending             Owned(pid)
//! ```
//!
//! The control socket is a unix stream socket at `control` (the store puts it in the run
//! directory, mode 0700, so only the store's owner reaches it); a peer whose uid is neither
//! the daemon's nor root is refused. One command per connection, one line each way:
//! `reset` (drop what the run changed, `fs/reset.rs`; the owner asks before `idle`),
//! `idle <ms>`, `adopt <pid>`, `end` → `ok` or `no <why>`. The socket path is reached through
//! `/proc/self/fd/<dir>/<name>`, which keeps it under `sun_path`'s 108 bytes however deep the
//! store is.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::fusermount;
use crate::error::{Error, IoContext, Result};

/// Who holds the mount now.
enum State {
    /// A run: the mount ends when process `pid` exits.
    Owned {
        pid: u32,
        pidfd: Option<Arc<OwnedFd>>,
    },
    /// Nobody: the mount ends `max` after `since` unless adopted.
    Idle { since: Instant, max: Duration },
    /// The mount is being ended.
    Ending,
}

/// The owner state and what wakes its watcher.
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

/// Starts watching `owner` for the mount at `mountpoint`: when the owner exits while it owns
/// the mount (or an idle mount's time is up, or `end` is asked), the mount is detached and the
/// daemon exits, which aborts the connection for every bind of the mount elsewhere. With
/// `control`, also listens there for `idle`/`adopt`/`end` (see the module docs); the socket
/// exists when this returns.
///
/// Errors: [`Error::Io`] if a thread cannot be started or the socket cannot be made at
/// `control` (its directory missing, say).
pub fn watch_owner(owner: u32, mountpoint: &Path, control: Option<&Path>) -> Result<()> {
    let shared = Arc::new(Shared {
        state: Mutex::new(State::Owned {
            pid: owner,
            pidfd: crate::sys::pidfd_open(owner).ok().map(Arc::new),
        }),
        changed: Condvar::new(),
    });
    if let Some(path) = control {
        let listener = bind(path)?;
        let s = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || serve(listener, &s))
            .at(path)?;
    }
    let mnt = mountpoint.to_path_buf();
    std::thread::Builder::new()
        .name("owner".into())
        .spawn(move || {
            watch(&shared);
            tracing::info!(mountpoint = %mnt.display(), "owner gone or idle time up: unmounting");
            let _ = fusermount::detach(&mnt);
            super::layer::run_exit_hooks();
            std::process::exit(0);
        })
        .map(drop)
        .at(mountpoint)
}

/// Returns once the mount must end: its owner exited while owning it, its idle time is up, or
/// `end` set [`State::Ending`].
fn watch(shared: &Shared) {
    loop {
        let mut st = shared.state.lock();
        match &*st {
            State::Ending => return,
            State::Idle { since, max } => {
                let left = max.saturating_sub(since.elapsed());
                if left.is_zero() {
                    *st = State::Ending;
                    return;
                }
                shared.changed.wait_for(&mut st, left);
            }
            State::Owned { pid, pidfd } => {
                let (pid, pidfd) = (*pid, pidfd.clone());
                drop(st);
                let Some(fd) = pidfd else {
                    // No pidfd (the owner was gone before we looked): it is gone.
                    *shared.state.lock() = State::Ending;
                    return;
                };
                // Wakes within a second of a state change (idle): the pidfd is polled in
                // slices, not for ever.
                if super::wait_pidfd(&fd, pid, Duration::from_secs(1)) {
                    let mut st = shared.state.lock();
                    if matches!(&*st, State::Owned { pid: p, .. } if *p == pid) {
                        *st = State::Ending;
                        return;
                    }
                }
            }
        }
    }
}

/// Makes the listening socket at `path` (an old one there is replaced).
fn bind(path: &Path) -> Result<UnixListener> {
    let (dir, name) = split(path)?;
    let short = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
    let _ = std::fs::remove_file(&short);
    UnixListener::bind(&short).at(path)
}

/// `path`'s directory (opened `O_PATH`) and file name.
fn split(path: &Path) -> Result<(OwnedFd, &std::ffi::OsStr)> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(Error::invalid(format!(
            "control socket {}: not a file path",
            path.display()
        )));
    };
    let dir = rustix::fs::open(
        parent,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| Error::io(parent, e.into()))?;
    Ok((dir, name))
}

/// Answers control connections until the process exits.
fn serve(listener: UnixListener, shared: &Shared) {
    let me = rustix::process::geteuid().as_raw();
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        let reply = match peer_uid(&conn) {
            Some(uid) if uid == me || uid == 0 => {
                let mut line = String::new();
                let _ = BufReader::new(&conn).take_line(&mut line);
                command(shared, line.trim())
            }
            _ => "no: not the store's owner".to_string(),
        };
        let _ = conn.write_all(format!("{reply}\n").as_bytes());
    }
}

/// Reads one line of at most 256 bytes.
trait TakeLine {
    fn take_line(self, line: &mut String) -> std::io::Result<usize>;
}

impl<R: std::io::Read> TakeLine for BufReader<R> {
    fn take_line(self, line: &mut String) -> std::io::Result<usize> {
        use std::io::Read;
        self.take(256).read_line(line)
    }
}

/// Carries out one control command; returns the reply line.
fn command(shared: &Shared, line: &str) -> String {
    let mut words = line.split_ascii_whitespace();
    let (verb, arg) = (words.next().unwrap_or(""), words.next());
    if verb == "reset" {
        // The owner asks, before it hands the mount back; the state lock is not held while
        // the kernel forgets (up to a few seconds).
        if !matches!(&*shared.state.lock(), State::Owned { .. }) {
            return "no: not owned by a run".to_string();
        }
        return match super::fs::reset::reset() {
            Ok(r) => {
                tracing::info!(?r, "reset");
                "ok".to_string()
            }
            Err(e) => {
                tracing::info!(error = %e, "reset failed");
                format!("no: {e}")
            }
        };
    }
    let mut st = shared.state.lock();
    let reply = match (verb, arg.and_then(|a| a.parse::<u64>().ok()), &*st) {
        ("idle", Some(ms), State::Owned { .. }) => {
            *st = State::Idle {
                since: Instant::now(),
                max: Duration::from_millis(ms),
            };
            "ok".to_string()
        }
        ("adopt", Some(pid), State::Idle { .. }) => {
            let pid = pid as u32;
            match crate::sys::pidfd_open(pid) {
                Ok(fd) => {
                    *st = State::Owned {
                        pid,
                        pidfd: Some(Arc::new(fd)),
                    };
                    "ok".to_string()
                }
                Err(e) => format!("no: process {pid}: {e}"),
            }
        }
        ("end", None, State::Idle { .. }) => {
            *st = State::Ending;
            "ok".to_string()
        }
        (_, _, State::Owned { .. }) => "no: owned by a run".to_string(),
        (_, _, State::Idle { .. }) => "no: idle".to_string(),
        (_, _, State::Ending) => "no: ending".to_string(),
    };
    shared.changed.notify_all();
    reply
}

/// The uid of the process at the other end of `conn` (`SO_PEERCRED`).
fn peer_uid(conn: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            conn.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(cred.uid)
}

/// Sends `command` (`idle <ms>`, `adopt <pid>` or `end`) to the daemon listening at `control`
/// and returns whether it answered `ok`.
///
/// Errors: [`Error::Io`] when nobody listens there (the daemon is gone) or the exchange fails;
/// [`Error::Failed`] with the daemon's reason when it answered `no`.
pub fn request(control: &Path, command: &str) -> Result<()> {
    let (dir, name) = split(control)?;
    let short = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
    let mut conn = UnixStream::connect(&short).at(control)?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))
        .at(control)?;
    conn.write_all(format!("{command}\n").as_bytes())
        .at(control)?;
    let mut line = String::new();
    BufReader::new(&conn).take_line(&mut line).at(control)?;
    match line.trim() {
        "ok" => Ok(()),
        other => Err(Error::Failed(format!(
            "overlay daemon at {}: {command}: {}",
            control.display(),
            other.strip_prefix("no: ").unwrap_or(other)
        ))),
    }
}
