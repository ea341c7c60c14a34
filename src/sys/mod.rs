//! Thin, safe wrappers over the Linux syscalls layercache needs that `std` does not offer, and
//! the one home of `unsafe` for them. Where rustix has a safe call (unmount, `Dir`, ids,
//! affinity…) callers use it directly; libc is underneath this module otherwise. Every function
//! returns the raw `io::Error` (callers add the path with `IoContext`).
//!
//! This file is the front door: every wrapper is re-exported here, so callers write
//! `crate::sys::X` whatever file it lives in. The sections, one file each:
//! * `at.rs`: the descriptor-relative `*at` calls of the overlay's layer stack and whiteouts;
//! * `files.rs`: paths and open files (`renameat2(RENAME_NOREPLACE)`, `utimensat`, `fstat`,
//!   `fstatvfs` ([`FsRoom`]), `syncfs`, fifos, `flock`, inode-flag ioctls, file handles,
//!   `copy_file_range`, `poll`, the `SCM_RIGHTS` receive of fusermount3's descriptor);
//! * `xattr.rs`: `l*xattr`/`f*xattr`;
//! * `mounts.rs`: mountinfo, privilege, per-mount atime views, `mount(2)`, `unshare(2)`;
//! * `process.rs`: pidfds, `kill`, signal handlers and masks, `getrandom`, glibc's malloc knobs;
//! * `users.rs`: passwd/group lookups;
//! * `forked.rs`: the async-signal-safe calls a `pre_exec` hook (between fork and exec) makes.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

mod at;
mod files;
pub(crate) mod forked;
mod mounts;
mod process;
mod users;
mod xattr;

pub(crate) use at::*;
pub(crate) use files::*;
pub(crate) use mounts::*;
pub(crate) use process::*;
pub(crate) use users::*;
pub(crate) use xattr::*;
// The two the integration tests call (fifo handshakes, signalling a run).
pub use files::mkfifo;
// Carried by `Error::NoSpace`.
pub use files::FsRoom;
pub use process::kill;

fn cpath(p: &Path) -> io::Result<CString> {
    cstr(p.as_os_str())
}

/// Converts a path or name to a C string. Errors: `EINVAL` for an interior NUL.
pub(crate) fn cstr(p: &OsStr) -> io::Result<CString> {
    CString::new(p.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `parent/name` as a C string (what `Path::join` gives), built in one allocation.
/// Errors: `EINVAL` for a NUL byte in `name`.
pub(crate) fn child(parent: &CStr, name: &OsStr) -> io::Result<CString> {
    let (p, n) = (parent.to_bytes(), name.as_bytes());
    let mut v = Vec::with_capacity(p.len() + n.len() + 2);
    v.extend_from_slice(p);
    v.push(b'/');
    v.extend_from_slice(n);
    CString::new(v).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// A libc return value as a result: negative means failure with `errno` (taken at once, before
/// anything else can overwrite it); otherwise the value itself.
pub(crate) fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn check_ok(rc: libc::c_int) -> io::Result<()> {
    check(rc).map(drop)
}

#[cfg(test)]
mod tests;
