//! The one place that knows how whiteouts and opaque directories are encoded in a layer.
//!
//! Two encodings are read in every layer (upper and lowers), and [`whited_out`] is the one test
//! of "does this layer's directory record a whiteout of this name" that the merge rules
//! (`stack.rs`) — and through them promotion (`store/promote.rs`) — use:
//! * kernel overlayfs's (Documentation/filesystems/overlayfs.rst, "whiteouts and opaque
//!   directories"): a **whiteout** is a character device with device number 0/0; an **opaque
//!   directory** carries the xattr `trusted.overlay.opaque` = `y` (written when the daemon is
//!   privileged) or `user.overlay.opaque` = `y` (overlayfs `userxattr` mode, written otherwise);
//! * fuse-overlayfs's fallback for when mknod(2) is refused (src/whiteout.rs there): a regular
//!   file **`.wh.NAME`** hides `NAME` in the layers below its directory, and a file
//!   **`.wh..wh..opq`** (or the xattr `user.fuseoverlayfs.opaque` = `y`) makes its directory
//!   opaque. Names starting with `.wh.` are therefore markers in every layer: they never show in
//!   the merged view and cannot be created through it.
//!
//! What a mount writes is its [`Form`]: 0/0 devices wherever mknod(2) allows them (Linux ≥ 5.8
//! lets an unprivileged user make a 0/0 device in a directory it can write), `.wh.` files
//! otherwise or when `LAYERCACHE_WHITEOUT=file` asks for them (fuse-overlayfs's
//! `FUSE_OVERLAYFS_DISABLE_OVL_WHITEOUT`). Upper dirs written either way are valid upper/lower
//! dirs for fuse-overlayfs; the device form also for kernel overlayfs.
//!
//! Overlay-private xattrs (`trusted.overlay.*`, `user.overlay.*`, `user.fuseoverlayfs.*`) are
//! hidden from the merged view and never copied up.

use crate::sys::{self, Xattrs, cstr};
use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

/// xattr marking an opaque directory when the daemon is privileged (kernel overlayfs default).
pub const OPAQUE_XATTR_TRUSTED: &CStr = c"trusted.overlay.opaque";
/// xattr marking an opaque directory in overlayfs `userxattr` mode (unprivileged).
pub const OPAQUE_XATTR_USER: &CStr = c"user.overlay.opaque";
/// xattr fuse-overlayfs marks opaque directories with (read only).
pub const OPAQUE_XATTR_FUSE_OVERLAYFS: &CStr = c"user.fuseoverlayfs.opaque";
/// Prefix of fuse-overlayfs's whiteout files: `.wh.NAME` whites out `NAME`.
pub const WH_PREFIX: &[u8] = b".wh.";
/// fuse-overlayfs's opaque-directory marker file, inside the opaque directory.
pub const OPAQUE_MARKER: &CStr = c".wh..wh..opq";

/// How a mount records whiteouts in its upper dir (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Form {
    /// A 0/0 character device at the name (kernel overlayfs's encoding).
    #[default]
    Device,
    /// A regular file `.wh.NAME` beside the name (fuse-overlayfs's fallback).
    File,
}

impl Form {
    /// The form for an upper dir whose workdir is open at `work`: [`Form::File`] when
    /// `LAYERCACHE_WHITEOUT=file` asks for it or when a 0/0 device cannot be made there (the
    /// probe's device is removed again), else [`Form::Device`].
    pub fn choose(work: BorrowedFd<'_>) -> Form {
        if std::env::var("LAYERCACHE_WHITEOUT").as_deref() == Ok("file") {
            return Form::File;
        }
        let name = c".layercache-whiteout-probe";
        let _ = sys::unlinkat(work.as_raw_fd(), name, 0);
        match create_whiteout_at(work.as_raw_fd(), name) {
            Ok(()) => {
                let _ = sys::unlinkat(work.as_raw_fd(), name, 0);
                Form::Device
            }
            Err(e) => {
                tracing::debug!("mknod of a 0/0 whiteout refused ({e}): writing .wh. files");
                Form::File
            }
        }
    }
}

/// True when `name` is an overlay-private xattr that must not show through the merged view nor
/// be copied up (`trusted.overlay.*`, `user.overlay.*`, `user.fuseoverlayfs.*`).
pub fn is_private_xattr(name: &[u8]) -> bool {
    name.starts_with(b"trusted.overlay.")
        || name.starts_with(b"user.overlay.")
        || name.starts_with(b"user.fuseoverlayfs.")
}

/// True when `name` (one path component) is a whiteout marker of the file form (`.wh.NAME`,
/// `.wh..wh..opq`): never shown in the merged view, never created through it.
pub fn is_marker_name(name: &[u8]) -> bool {
    name.starts_with(WH_PREFIX)
}

/// True when `st` (from `fstatat`/`lstat`) describes a whiteout of the device form: a
/// character device 0/0.
pub fn is_whiteout_stat(st: &libc::stat) -> bool {
    (st.st_mode & libc::S_IFMT) == libc::S_IFCHR && st.st_rdev == 0
}

/// The path of the `.wh.` file that whites out `rel` (a path relative to some directory; its
/// last component gets the prefix).
///
/// Errors: `EINVAL` for an empty `rel`.
pub fn marker_path(rel: &CStr) -> io::Result<CString> {
    let b = rel.to_bytes();
    if b.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let cut = b.iter().rposition(|&c| c == b'/').map_or(0, |i| i + 1);
    let mut p = Vec::with_capacity(b.len() + WH_PREFIX.len());
    p.extend_from_slice(&b[..cut]);
    p.extend_from_slice(WH_PREFIX);
    p.extend_from_slice(&b[cut..]);
    CString::new(p).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Whether `rel` below the directory fd `dir` exists (`fstatat`, not following a symlink).
fn exists_at(dir: RawFd, rel: &CStr) -> io::Result<bool> {
    match sys::fstatat(dir, rel, libc::AT_SYMLINK_NOFOLLOW) {
        Ok(_) => Ok(true),
        Err(e) => match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ENAMETOOLONG) => Ok(false),
            _ => Err(e),
        },
    }
}

/// **The whiteout test** of one layer: true when the layer's directory tree at `dir` records a
/// whiteout of `rel` (a path below `dir`) in either form — `st`, the `fstatat` of `rel` itself
/// (`None`: absent), is a 0/0 device, or, when `rel` is absent, a `.wh.` file is beside it.
/// Callers ask only where a layer below could show `rel` (a whiteout in the bottom layer hides
/// nothing), so the extra `fstatat` is spent only there.
///
/// Errors: the `fstatat` errno of the `.wh.` file other than `ENOENT`/`ENOTDIR`.
pub fn whited_out(dir: RawFd, rel: &CStr, st: Option<&libc::stat>) -> io::Result<bool> {
    match st {
        Some(st) => Ok(is_whiteout_stat(st)),
        None => exists_at(dir, &marker_path(rel)?),
    }
}

/// Creates a whiteout named `name` in the directory `dir` (device form).
///
/// Errors: the `mknodat(2)` errno — `EEXIST` if `name` exists, `EPERM` where a 0/0 device is
/// not allowed.
pub fn create_whiteout(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    create_whiteout_at(dir.as_raw_fd(), &cstr(name)?)
}

/// Creates a whiteout at `rel` below the directory fd `dir` (device form).
///
/// Errors: as [`create_whiteout`]; `ENOENT`/`ENOTDIR` for a missing parent.
pub fn create_whiteout_at(dir: RawFd, rel: &CStr) -> io::Result<()> {
    sys::mknodat(dir, rel, libc::S_IFCHR, 0)
}

/// Creates a whiteout of `rel` below the directory fd `dir` in `form`: a 0/0 device at `rel`,
/// or an empty file `.wh.<name>` beside it (an existing one is the same whiteout: success).
///
/// Errors: the `mknodat`/`openat` errno (`EEXIST` for a device over an existing `rel`,
/// `ENAMETOOLONG` for a `.wh.` name over 255 bytes).
pub fn create_whiteout_in(dir: RawFd, rel: &CStr, form: Form) -> io::Result<()> {
    match form {
        Form::Device => create_whiteout_at(dir, rel),
        Form::File => create_marker(dir, &marker_path(rel)?),
    }
}

/// Creates the empty marker file `rel` below `dir` (mode 0600); an existing one is success.
fn create_marker(dir: RawFd, rel: &CStr) -> io::Result<()> {
    match sys::openat(
        dir,
        rel,
        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        0o600,
    ) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes a `.wh.` file whiteout of `rel` below `dir`, if there is one (done wherever a name
/// gets an entry in the upper dir again, so a later removal starts clean; the device form
/// needs no such step, the entry replaces the device).
///
/// Errors: the `unlinkat` errno other than `ENOENT`.
pub fn remove_marker(dir: RawFd, rel: &CStr) -> io::Result<()> {
    let p = marker_path(rel)?;
    match sys::unlinkat(dir, &p, 0) {
        Err(e) if !matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => Err(e),
        _ => Ok(()),
    }
}

/// True when the directory open at `dir` is opaque: one of the opaque xattrs is `y`, or it
/// holds the `.wh..wh..opq` marker.
///
/// Errors: any `fgetxattr(2)` errno other than `ENODATA`/`ENOTSUP`/`ERANGE`, which mean "not
/// opaque", or the marker's `fstatat` errno.
pub fn is_opaque(dir: BorrowedFd<'_>) -> io::Result<bool> {
    for name in [
        OPAQUE_XATTR_TRUSTED,
        OPAQUE_XATTR_USER,
        OPAQUE_XATTR_FUSE_OVERLAYFS,
    ] {
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
    exists_at(dir.as_raw_fd(), OPAQUE_MARKER)
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
    let fd = sys::openat(
        dir,
        rel,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | flags,
        0,
    )?;
    is_opaque(fd.as_fd())
}

/// Set once writing `trusted.overlay.opaque` was refused (`EPERM`: euid 0 without
/// CAP_SYS_ADMIN in the initial user namespace, e.g. root of a user namespace): later marks go
/// straight to `user.overlay.opaque`.
static TRUSTED_REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Marks the directory open at `dir` opaque: its lower-layer namesakes no longer show through.
/// Writes `trusted.overlay.opaque` as root (`user.overlay.opaque` when that is refused, as in a
/// user namespace), `user.overlay.opaque` otherwise, and the `.wh..wh..opq` marker file on a
/// filesystem without xattrs (fuse-overlayfs's fallback).
///
/// Errors: the `fsetxattr(2)` errno, or the marker's `openat` errno.
pub fn set_opaque(dir: BorrowedFd<'_>) -> io::Result<()> {
    use std::sync::atomic::Ordering::Relaxed;
    if rustix::process::geteuid().is_root() && !TRUSTED_REFUSED.load(Relaxed) {
        match Xattrs::Fd(dir).set(OPAQUE_XATTR_TRUSTED, b"y", 0) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => TRUSTED_REFUSED.store(true, Relaxed),
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => {
                return create_marker(dir.as_raw_fd(), OPAQUE_MARKER);
            }
            r => return r,
        }
    }
    match Xattrs::Fd(dir).set(OPAQUE_XATTR_USER, b"y", 0) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => {
            create_marker(dir.as_raw_fd(), OPAQUE_MARKER)
        }
        r => r,
    }
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

    #[test]
    fn marker_paths_prefix_the_last_component() {
        assert_eq!(marker_path(c"a").unwrap().as_bytes(), b".wh.a");
        assert_eq!(marker_path(c"./d/e/f").unwrap().as_bytes(), b"./d/e/.wh.f");
        assert!(marker_path(c"").is_err());
        assert!(is_marker_name(b".wh.x") && is_marker_name(b".wh..wh..opq"));
        assert!(!is_marker_name(b"wh.x") && !is_marker_name(b".whx"));
        assert!(is_private_xattr(b"user.fuseoverlayfs.opaque"));
    }

    #[test]
    fn both_forms_are_whiteouts_and_file_markers_opaque() {
        let dir = tempfile::tempdir().unwrap();
        let d = std::fs::File::open(dir.path()).unwrap();
        let fd = d.as_raw_fd();
        let st = |n: &str| std::fs::symlink_metadata(dir.path().join(n)).ok();
        // File form: `.wh.gone` beside an absent `gone`; creating it twice is one whiteout.
        create_whiteout_in(fd, c"gone", Form::File).unwrap();
        create_whiteout_in(fd, c"gone", Form::File).unwrap();
        assert!(st(".wh.gone").is_some_and(|m| m.is_file()));
        assert!(whited_out(fd, c"gone", None).unwrap());
        assert!(!whited_out(fd, c"other", None).unwrap());
        // A present entry is itself, whatever marker lies beside it.
        std::fs::write(dir.path().join("gone"), b"back").unwrap();
        let m = crate::sys::fstat(&std::fs::File::open(dir.path().join("gone")).unwrap()).unwrap();
        assert!(!whited_out(fd, c"gone", Some(&m)).unwrap());
        remove_marker(fd, c"gone").unwrap();
        remove_marker(fd, c"gone").unwrap();
        assert!(st(".wh.gone").is_none());
        // Device form, where mknod allows it (an unprivileged user may make 0/0 since 5.8).
        if create_whiteout_in(fd, c"dev", Form::Device).is_ok() {
            let s = crate::sys::fstatat(fd, c"dev", libc::AT_SYMLINK_NOFOLLOW).unwrap();
            assert!(whited_out(fd, c"dev", Some(&s)).unwrap());
        }
        // The opaque forms fuse-overlayfs writes: its xattr, and the marker file.
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let s = std::fs::File::open(&sub).unwrap();
        assert!(!is_opaque(s.as_fd()).unwrap());
        std::fs::write(sub.join(".wh..wh..opq"), b"").unwrap();
        assert!(is_opaque(s.as_fd()).unwrap());
        let sub2 = dir.path().join("sub2");
        std::fs::create_dir(&sub2).unwrap();
        let s2 = std::fs::File::open(&sub2).unwrap();
        if Xattrs::Fd(s2.as_fd())
            .set(OPAQUE_XATTR_FUSE_OVERLAYFS, b"y", 0)
            .is_ok()
        {
            assert!(dir_is_opaque_at(fd, c"sub2").unwrap());
        }
    }
}
