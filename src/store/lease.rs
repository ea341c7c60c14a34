//! `flock(2)`-based leases.
//!
//! * a **layer lease** (`layers/<id>/lease`): every mount of a layer holds a *shared* lock for the
//!   mount's whole life (the overlay daemon keeps the descriptor); gc and clear take an
//!   *exclusive non-blocking* lock before removing a layer, so a mounted layer is never evicted;
//! * a **fill lock** (`caches/<cache>/fills/<key>.lock`): the run that fills a missing key holds it
//!   exclusively from mount to publish; a concurrent mount of the same key waits for it (bounded),
//!   then looks the key up again;
//! * a **run lease** (`runs/<run>/lease`): held exclusively by the mount (daemon) so gc can tell a
//!   live run directory from a stale one;
//! * a **project lock** (`projects/<p>/lock`): shared while promoting/publishing, exclusive while
//!   gc or clear delete layers and objects of that project.
//!
//! Locks live on open file descriptions: they end when the last descriptor sharing one is
//! closed, including when a process dies (kill -9), so a crash never leaves a lease behind.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{IoContext, Result};
use crate::sys;

/// A held `flock` on a lock file. Dropping it closes the descriptor (releasing the lock unless
/// a duplicate, e.g. in a mount daemon, still shares the open file description).
#[derive(Debug)]
pub struct Lease {
    file: File,
    path: PathBuf,
}

/// Lock strength.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `LOCK_SH`: many holders (mounted layers).
    Shared,
    /// `LOCK_EX`: one holder (fills, gc, runs).
    Exclusive,
}

impl Mode {
    fn op(self) -> libc::c_int {
        match self {
            Mode::Shared => libc::LOCK_SH,
            Mode::Exclusive => libc::LOCK_EX,
        }
    }
}

fn open_lock_file(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .at(path)
}

/// True when `path` still names the open `file` (a lock file may be removed by its last
/// holder, [`Lease::remove`]: a lock then taken on the unlinked inode guards nothing).
fn still_named(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

impl Lease {
    /// Takes the lock on `path` (created if missing), blocking until it is granted.
    ///
    /// Errors: [`crate::Error::Io`] naming `path`.
    pub fn acquire(path: &Path, mode: Mode) -> Result<Lease> {
        loop {
            let file = open_lock_file(path)?;
            sys::flock(&file, mode.op()).at(path)?;
            if still_named(&file, path) {
                return Ok(Lease {
                    file,
                    path: path.to_path_buf(),
                });
            }
        }
    }

    /// Removes the lock file while still holding the lock, then releases it (so a
    /// finished fill leaves no `fills/<key>.lock` behind). A process blocked on the old file
    /// gets the lock on an unlinked inode, sees that ([`still_named`]) and takes a fresh file.
    /// Best effort: a file already gone or replaced is left alone.
    pub fn remove(self) {
        if still_named(&self.file, &self.path) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// Takes the lock on `path` if it is free right now; `Ok(None)` when someone holds a
    /// conflicting lock.
    ///
    /// Errors: [`crate::Error::Io`] naming `path` for anything but `EWOULDBLOCK`.
    pub fn try_acquire(path: &Path, mode: Mode) -> Result<Option<Lease>> {
        loop {
            let file = open_lock_file(path)?;
            match sys::flock(&file, mode.op() | libc::LOCK_NB) {
                Ok(()) if still_named(&file, path) => {
                    return Ok(Some(Lease {
                        file,
                        path: path.to_path_buf(),
                    }));
                }
                Ok(()) => continue, // removed under us: lock the file now at `path`
                Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => return Ok(None),
                Err(e) => return Err(crate::Error::io(path, e)),
            }
        }
    }

    /// Like [`Lease::try_acquire`], retrying (2 ms growing to 50 ms between attempts) until
    /// `timeout` has passed; `Ok(None)` on timeout.
    ///
    /// Errors: as [`Lease::try_acquire`].
    pub fn acquire_timeout(path: &Path, mode: Mode, timeout: Duration) -> Result<Option<Lease>> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(2);
        loop {
            if let Some(l) = Lease::try_acquire(path, mode)? {
                return Ok(Some(l));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// Adopts the lock that process `pid` holds through its descriptor `fd` (same open file
    /// description, via `pidfd_getfd(2)`), after checking that the descriptor refers to `path`.
    /// Returns `None` when that is impossible (process gone, no permission, other file).
    pub fn adopt(pid: u32, fd: i32, path: &Path) -> Option<Lease> {
        let owned = sys::pidfd_getfd(pid, fd).ok()?;
        let file = File::from(owned);
        let got = file.metadata().ok()?;
        let want = std::fs::metadata(path).ok()?;
        if got.dev() != want.dev() || got.ino() != want.ino() {
            return None;
        }
        Some(Lease {
            file,
            path: path.to_path_buf(),
        })
    }

    /// A duplicate descriptor sharing this lock (hand it to a mount daemon to hold).
    ///
    /// Errors: [`crate::Error::Io`] if `dup` fails.
    pub fn dup_fd(&self) -> Result<OwnedFd> {
        self.file.as_fd().try_clone_to_owned().at(&self.path)
    }
}

impl AsFd for Lease {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// True when someone holds a lock on `path` that conflicts with `mode` (a missing file is
/// free). Probing with `Mode::Exclusive` answers "is anyone holding it at all?".
///
/// Errors: [`crate::Error::Io`] naming `path`.
pub fn is_held(path: &Path, mode: Mode) -> Result<bool> {
    if !path.exists() {
        return Ok(false);
    }
    Ok(Lease::try_acquire(path, mode)?.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_removed_lock_file_is_never_locked_by_a_waiter() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("fill.lock");
        let a = Lease::acquire(&p, Mode::Exclusive).unwrap();
        // A waiter that opened the file before it was removed (the race acquire handles).
        let old = open_lock_file(&p).unwrap();
        a.remove();
        assert!(!p.exists());
        sys::flock(&old, libc::LOCK_EX | libc::LOCK_NB).unwrap();
        assert!(
            !still_named(&old, &p),
            "the old inode is no longer the lock"
        );
        let b = Lease::acquire(&p, Mode::Exclusive).unwrap();
        assert!(still_named(&b.file, &p));
        assert!(Lease::try_acquire(&p, Mode::Exclusive).unwrap().is_none());
        b.remove();
        assert!(!p.exists());
    }

    #[test]
    fn shared_excludes_exclusive_and_release_on_drop() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("lease");
        let a = Lease::acquire(&p, Mode::Shared).unwrap();
        let b = Lease::try_acquire(&p, Mode::Shared).unwrap();
        assert!(b.is_some());
        assert!(Lease::try_acquire(&p, Mode::Exclusive).unwrap().is_none());
        assert!(is_held(&p, Mode::Exclusive).unwrap());
        drop(a);
        drop(b);
        assert!(Lease::try_acquire(&p, Mode::Exclusive).unwrap().is_some());
    }

    #[test]
    fn dup_keeps_the_lock_and_timeout_gives_up() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("fill.lock");
        let a = Lease::acquire(&p, Mode::Exclusive).unwrap();
        let dup = a.dup_fd().unwrap();
        drop(a);
        let start = Instant::now();
        let r = Lease::acquire_timeout(&p, Mode::Exclusive, Duration::from_millis(60)).unwrap();
        assert!(r.is_none());
        assert!(start.elapsed() >= Duration::from_millis(60));
        drop(dup);
        assert!(
            Lease::acquire_timeout(&p, Mode::Exclusive, Duration::from_secs(5))
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn adopt_shares_the_open_file_description() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("fill.lock");
        let a = Lease::acquire(&p, Mode::Exclusive).unwrap();
        if let Some(b) = Lease::adopt(std::process::id(), a.as_fd().as_raw_fd(), &p) {
            drop(a);
            assert!(is_held(&p, Mode::Exclusive).unwrap(), "adopted lease lost");
            drop(b);
            assert!(!is_held(&p, Mode::Exclusive).unwrap());
        }
    }
}
