//! Extended attributes: the `l*xattr(2)`/`f*xattr(2)` calls (rustix underneath).

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;

use super::cpath;

/// Where an xattr call goes: an open file, or a path whose final symlink is not followed
/// (the `l*xattr(2)` calls). The one home of xattr syscalls (rustix underneath); callers keep
/// their own policy (which names are private, which failures are fatal).
#[derive(Clone, Copy, Debug)]
pub enum Xattrs<'a> {
    /// `f*xattr(2)` on this descriptor.
    Fd(BorrowedFd<'a>),
    /// `l*xattr(2)` on this path.
    Path(&'a CStr),
}

/// The largest xattr value or name list the VFS hands out (`XATTR_SIZE_MAX`, `XATTR_LIST_MAX`),
/// bytes.
const XATTR_MAX: usize = 64 * 1024;

impl Xattrs<'_> {
    /// Reads the value of `name` into `buf` and returns its length; an empty `buf` only asks
    /// the length.
    ///
    /// Errors: the `fgetxattr`/`lgetxattr` errno (`ENODATA` when absent, `ERANGE` when `buf`
    /// is too small, `ENOTSUP` without xattr support).
    pub fn get_into(self, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
        // rustix answers an empty buffer with 0, not the size: the size query is its own call.
        Ok(match (self, buf.is_empty()) {
            (Xattrs::Fd(fd), true) => rustix::fs::fgetxattr_query(fd, name)?,
            (Xattrs::Path(p), true) => rustix::fs::lgetxattr_query(p, name)?,
            (Xattrs::Fd(fd), false) => rustix::fs::fgetxattr(fd, name, buf)?,
            (Xattrs::Path(p), false) => rustix::fs::lgetxattr(p, name, buf)?,
        })
    }

    /// Reads the NUL-separated name list into `buf` and returns its length; an empty `buf` only
    /// asks the length.
    ///
    /// Errors: the `flistxattr`/`llistxattr` errno (`ERANGE` when `buf` is too small).
    pub fn list_into(self, buf: &mut [u8]) -> io::Result<usize> {
        // As in get_into: rustix's size query is its own call.
        Ok(match (self, buf.is_empty()) {
            (Xattrs::Fd(fd), true) => rustix::fs::flistxattr_query(fd)?,
            (Xattrs::Path(p), true) => rustix::fs::llistxattr_query(p)?,
            (Xattrs::Fd(fd), false) => rustix::fs::flistxattr(fd, buf)?,
            (Xattrs::Path(p), false) => rustix::fs::llistxattr(p, buf)?,
        })
    }

    /// Sets `name` = `value`; `flags` are setxattr(2)'s (`XATTR_CREATE`, `XATTR_REPLACE`, or 0).
    ///
    /// Errors: the `fsetxattr`/`lsetxattr` errno.
    pub fn set(self, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
        let flags = rustix::fs::XattrFlags::from_bits_retain(flags as u32);
        match self {
            Xattrs::Fd(fd) => rustix::fs::fsetxattr(fd, name, value, flags)?,
            Xattrs::Path(p) => rustix::fs::lsetxattr(p, name, value, flags)?,
        }
        Ok(())
    }

    /// Removes `name`.
    ///
    /// Errors: the `fremovexattr`/`lremovexattr` errno (`ENODATA` when absent).
    pub fn remove(self, name: &CStr) -> io::Result<()> {
        match self {
            Xattrs::Fd(fd) => rustix::fs::fremovexattr(fd, name)?,
            Xattrs::Path(p) => rustix::fs::lremovexattr(p, name)?,
        }
        Ok(())
    }

    /// Every name, in the order the filesystem lists them; a filesystem without xattr support
    /// (`ENOTSUP`) has none.
    ///
    /// Errors: as [`Xattrs::list_into`] (never `ERANGE`: the buffer grows).
    pub fn names(self) -> io::Result<Vec<Vec<u8>>> {
        let mut buf = vec![0u8; 1024];
        loop {
            match self.list_into(&mut buf) {
                Ok(n) => {
                    buf.truncate(n);
                    return Ok(buf
                        .split(|b| *b == 0)
                        .filter(|s| !s.is_empty())
                        .map(<[u8]>::to_vec)
                        .collect());
                }
                Err(e) if e.raw_os_error() == Some(libc::ERANGE) && buf.len() < XATTR_MAX => {
                    buf.resize(XATTR_MAX, 0)
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(Vec::new()),
                Err(e) => return Err(e),
            }
        }
    }

    /// The whole value of `name`.
    ///
    /// Errors: as [`Xattrs::get_into`] (never `ERANGE`: the buffer grows).
    pub fn value(self, name: &CStr) -> io::Result<Vec<u8>> {
        whole_value(|buf| self.get_into(name, buf))
    }
}

/// Lists the extended attribute names of `path` (not following a final symlink).
///
/// Errors: the `llistxattr(2)` errno; `ENOTSUP` is reported as an empty list.
pub fn list_xattrs(path: &Path) -> io::Result<Vec<Vec<u8>>> {
    Xattrs::Path(&cpath(path)?).names()
}

/// Reads the value of xattr `name` of `path` (not following a final symlink).
///
/// Errors: the `lgetxattr(2)` errno (`ENODATA` when absent).
pub fn get_xattr(path: &Path, name: &[u8]) -> io::Result<Vec<u8>> {
    Xattrs::Path(&cpath(path)?).value(&cbytes(name)?)
}

/// Sets xattr `name` = `value` on `path` (not following a final symlink).
///
/// Errors: the `lsetxattr(2)` errno.
pub fn set_xattr(path: &Path, name: &[u8], value: &[u8]) -> io::Result<()> {
    Xattrs::Path(&cpath(path)?).set(&cbytes(name)?, value, 0)
}

/// Removes xattr `name` from `path` (not following a final symlink).
///
/// Errors: the `lremovexattr(2)` errno.
pub fn remove_xattr(path: &Path, name: &[u8]) -> io::Result<()> {
    Xattrs::Path(&cpath(path)?).remove(&cbytes(name)?)
}

fn cbytes(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// A whole xattr value read by `get` (a getxattr-like call filling its buffer and returning
/// the length): into a small buffer first, then, after `ERANGE`, one of the largest size the
/// VFS hands out (64 KiB, XATTR_SIZE_MAX).
///
/// Errors: `get`'s errno (`ENODATA` when absent…).
pub fn whole_value(mut get: impl FnMut(&mut [u8]) -> io::Result<usize>) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    loop {
        match get(&mut buf) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) && buf.len() < XATTR_MAX => {
                buf.resize(XATTR_MAX, 0)
            }
            Err(e) => return Err(e),
        }
    }
}
