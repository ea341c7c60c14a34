//! The one place that knows how whiteouts and opaque directories are encoded in an upper dir.
//!
//! The encoding is kernel overlayfs's (Documentation/filesystems/overlayfs.rst, "whiteouts and
//! opaque directories"), so an upper dir written by layercache is a valid upperdir/lowerdir for
//! kernel overlayfs and fuse-overlayfs too:
//! * a **whiteout** is a character device with device number 0/0;
//! * an **opaque directory** carries the xattr `trusted.overlay.opaque` = `y` (written when the
//!   daemon runs as root) or `user.overlay.opaque` = `y` (overlayfs `userxattr` mode, used when not
//!   root). Both are recognised when reading.
//!
//! Overlay-private xattrs (`trusted.overlay.*`, `user.overlay.*`) are hidden from the merged view
//! and never copied up.

use crate::sys::{Xattrs, cstr};
use std::ffi::{CStr, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// xattr marking an opaque directory when the daemon is privileged (kernel overlayfs default).
pub const OPAQUE_XATTR_TRUSTED: &CStr = c"trusted.overlay.opaque";
/// xattr marking an opaque directory in overlayfs `userxattr` mode (unprivileged).
pub const OPAQUE_XATTR_USER: &CStr = c"user.overlay.opaque";

/// True when `name` is an overlay-private xattr that must not show through the merged view nor
/// be copied up (`trusted.overlay.*`, `user.overlay.*`).
pub fn is_private_xattr(name: &[u8]) -> bool {
    name.starts_with(b"trusted.overlay.") || name.starts_with(b"user.overlay.")
}

/// True when `st` (from `fstatat`/`lstat`) describes a whiteout: a character device 0/0.
pub fn is_whiteout_stat(st: &libc::stat) -> bool {
    (st.st_mode & libc::S_IFMT) == libc::S_IFCHR && st.st_rdev == 0
}

/// Creates a whiteout named `name` in the directory `dir`.
///
/// Errors: the `mknodat(2)` errno — `EEXIST` if `name` exists, `EPERM` without `CAP_MKNOD`.
pub fn create_whiteout(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    create_whiteout_at(dir.as_raw_fd(), &cstr(name)?)
}

/// Creates a whiteout at `rel` below the directory fd `dir`.
///
/// Errors: as [`create_whiteout`]; `ENOENT`/`ENOTDIR` for a missing parent.
pub fn create_whiteout_at(dir: RawFd, rel: &CStr) -> io::Result<()> {
    // SAFETY: `rel` is NUL-terminated; mknodat does not retain pointers; a bad fd is EBADF.
    let rc = unsafe { libc::mknodat(dir, rel.as_ptr(), libc::S_IFCHR, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// True when the directory open at `dir` is opaque (either xattr present with value `y`).
///
/// Errors: any `fgetxattr(2)` errno other than `ENODATA`/`ENOTSUP`, which mean "not opaque".
pub fn is_opaque(dir: BorrowedFd<'_>) -> io::Result<bool> {
    for name in [OPAQUE_XATTR_TRUSTED, OPAQUE_XATTR_USER] {
        let mut buf = [0u8; 4];
        match Xattrs::Fd(dir).get_into(name, &mut buf) {
            Ok(1) if buf[0] == b'y' => return Ok(true),
            Ok(_) => continue,
            Err(e) => match e.raw_os_error() {
                Some(libc::ENODATA) | Some(libc::ENOTSUP) | Some(libc::ERANGE) => continue,
                _ => return Err(e),
            },
        }
    }
    Ok(false)
}

/// True when the directory at `rel` below the directory fd `dir` is opaque: opens it
/// (`O_DIRECTORY | O_NOFOLLOW`) and reads it like [`is_opaque`]. The daemon's check, on a
/// name it has just found to be a directory in a layer.
///
/// Errors: the `openat(2)` errno (`ENOENT`; `ENOTDIR` for anything but a directory, a symlink
/// included), or as [`is_opaque`].
pub fn dir_is_opaque_at(dir: RawFd, rel: &CStr) -> io::Result<bool> {
    opaque_at(dir, rel, libc::O_NOFOLLOW)
}

fn opaque_at(dir: RawFd, rel: &CStr, flags: libc::c_int) -> io::Result<bool> {
    // SAFETY: `dir` is a directory fd or AT_FDCWD and `rel` is NUL-terminated; a bad fd is
    // only an error (EBADF).
    let fd = unsafe {
        libc::openat(
            dir,
            rel.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | flags,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by openat and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    is_opaque(fd.as_fd())
}

/// Marks the directory open at `dir` opaque: its lower-layer namesakes no longer show through.
/// Writes `trusted.overlay.opaque` as root, `user.overlay.opaque` otherwise (also as root of a
/// user namespace, where the trusted one is refused with EPERM).
///
/// Errors: the `fsetxattr(2)` errno (`ENOTSUP` on a filesystem without xattrs).
pub fn set_opaque(dir: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        match Xattrs::Fd(dir).set(OPAQUE_XATTR_TRUSTED, b"y", 0) {
            // Root of a user namespace (an unprivileged `layercache run`): trusted.* needs
            // CAP_SYS_ADMIN in the initial namespace.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
            r => return r,
        }
    }
    Xattrs::Fd(dir).set(OPAQUE_XATTR_USER, b"y", 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_xattrs_are_recognised() {
        assert!(is_private_xattr(b"trusted.overlay.opaque"));
        assert!(is_private_xattr(b"user.overlay.redirect"));
        assert!(!is_private_xattr(b"user.mime_type"));
        assert!(!is_private_xattr(b"trusted.overlayfoo"));
    }

    #[test]
    fn opaque_roundtrip_and_whiteout() {
        let dir = tempfile::tempdir().unwrap();
        let d = std::fs::File::open(dir.path()).unwrap();
        assert!(!is_opaque(d.as_fd()).unwrap());
        if set_opaque(d.as_fd()).is_ok() {
            assert!(is_opaque(d.as_fd()).unwrap());
        }
        match create_whiteout(d.as_fd(), OsStr::new("gone")) {
            Ok(()) => {
                let m = std::fs::symlink_metadata(dir.path().join("gone")).unwrap();
                use std::os::unix::fs::{FileTypeExt, MetadataExt};
                assert!(m.file_type().is_char_device() && m.rdev() == 0);
            }
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPERM)),
        }
    }

    #[test]
    fn opaque_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::File::open(dir.path()).unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::os::unix::fs::symlink("d", dir.path().join("l")).unwrap();
        let at = |name: &CStr| dir_is_opaque_at(root.as_raw_fd(), name);
        assert!(!at(c"d").unwrap());
        let d = std::fs::File::open(dir.path().join("d")).unwrap();
        if set_opaque(d.as_fd()).is_ok() {
            assert!(at(c"d").unwrap());
        }
        assert_eq!(at(c"l").unwrap_err().raw_os_error(), Some(libc::ENOTDIR));
        assert_eq!(
            at(c"missing").unwrap_err().raw_os_error(),
            Some(libc::ENOENT)
        );
    }
}
