//! Descriptor-relative file syscalls (`*at`), for the overlay's layer stack and whiteouts.
//! `dir` is a directory descriptor (or `libc::AT_FDCWD`) the caller keeps open for the call; a
//! closed or bad one is only `EBADF`. `rel` is a path relative to it.

use std::ffi::CStr;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use super::{check, check_ok};

/// `openat(dir, rel, flags, mode)` (flags as given: add `O_CLOEXEC` yourself).
///
/// Errors: the `openat(2)` errno (`ENOENT`, `ELOOP` for a symlink with `O_NOFOLLOW`, `EEXIST`
/// with `O_CREAT | O_EXCL`…).
pub fn openat(
    dir: RawFd,
    rel: &CStr,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    // SAFETY: `rel` is NUL-terminated and outlives the call; openat retains no pointer.
    let fd = check(unsafe { libc::openat(dir, rel.as_ptr(), flags, mode as libc::c_uint) })?;
    // SAFETY: openat just returned this descriptor; nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstatat(dir, rel, flags)` (`AT_SYMLINK_NOFOLLOW`, `AT_EMPTY_PATH`…).
///
/// Errors: the `fstatat(2)` errno (`ENOENT`, `ENOTDIR`, `ENAMETOOLONG`…).
pub fn fstatat(dir: RawFd, rel: &CStr, flags: libc::c_int) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: valid C string and out pointer to a stat buffer.
    check(unsafe { libc::fstatat(dir, rel.as_ptr(), st.as_mut_ptr(), flags) })?;
    // SAFETY: fstatat succeeded, so it filled the buffer.
    Ok(unsafe { st.assume_init() })
}

/// `statx(dir, rel, flags, mask)`.
///
/// Errors: the `statx(2)` errno (`ENOENT`, `ENOSYS` before Linux 4.11…).
pub fn statx(dir: RawFd, rel: &CStr, flags: libc::c_int, mask: u32) -> io::Result<libc::statx> {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::uninit();
    // SAFETY: `rel` is NUL-terminated and `stx` is a statx buffer the call fills on success.
    check(unsafe { libc::statx(dir, rel.as_ptr(), flags, mask, stx.as_mut_ptr()) })?;
    // SAFETY: statx succeeded, so it filled the buffer.
    Ok(unsafe { stx.assume_init() })
}

/// An all-zero `struct stat` (what a negative FUSE entry is built from).
pub fn empty_stat() -> libc::stat {
    // SAFETY: struct stat is plain integers; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// An all-zero `struct statx` (what a layer without a file to `statx` fills in).
pub fn empty_statx() -> libc::statx {
    // SAFETY: struct statx is plain integers; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// `mkdirat(dir, rel, mode)`. Errors: its errno (`EEXIST`, `ENOENT`…).
pub fn mkdirat(dir: RawFd, rel: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: valid C string.
    check_ok(unsafe { libc::mkdirat(dir, rel.as_ptr(), mode as libc::mode_t) })
}

/// `mknodat(dir, rel, mode, rdev)`; `mode` holds the file type (`S_IFCHR`, `S_IFIFO`…).
///
/// Errors: its errno (`EEXIST`, `EPERM` where the device is not allowed…).
pub fn mknodat(dir: RawFd, rel: &CStr, mode: u32, rdev: u64) -> io::Result<()> {
    // SAFETY: valid C string; mknodat retains no pointer.
    check_ok(unsafe { libc::mknodat(dir, rel.as_ptr(), mode as libc::mode_t, rdev as libc::dev_t) })
}

/// `symlinkat(target, dir, rel)`. Errors: its errno (`EEXIST`…).
pub fn symlinkat(target: &CStr, dir: RawFd, rel: &CStr) -> io::Result<()> {
    // SAFETY: valid C strings.
    check_ok(unsafe { libc::symlinkat(target.as_ptr(), dir, rel.as_ptr()) })
}

/// `readlinkat(dir, rel)`: the link's target, at most `PATH_MAX` bytes.
///
/// Errors: its errno (`EINVAL` for anything but a symlink).
pub fn readlinkat(dir: RawFd, rel: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: the buffer is valid for writes of its length.
    let n = unsafe { libc::readlinkat(dir, rel.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// `unlinkat(dir, rel, flags)` (`AT_REMOVEDIR` for a directory, else 0).
///
/// Errors: its errno (`ENOENT`, `ENOTEMPTY`, `EISDIR`…).
pub fn unlinkat(dir: RawFd, rel: &CStr, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: valid C string.
    check_ok(unsafe { libc::unlinkat(dir, rel.as_ptr(), flags) })
}

/// `renameat2(from_dir, from, to_dir, to, flags)` (`RENAME_NOREPLACE`, `RENAME_EXCHANGE`,
/// `RENAME_WHITEOUT`, or 0).
///
/// Errors: its errno (`EEXIST` with `RENAME_NOREPLACE`, `EXDEV`, `EINVAL`…).
pub fn renameat2(
    from_dir: RawFd,
    from: &CStr,
    to_dir: RawFd,
    to: &CStr,
    flags: u32,
) -> io::Result<()> {
    // SAFETY: valid C strings.
    check_ok(unsafe { libc::renameat2(from_dir, from.as_ptr(), to_dir, to.as_ptr(), flags) })
}

/// `linkat(from_dir, from, to_dir, to, flags)`. Errors: its errno (`EEXIST`, `EMLINK`…).
pub fn linkat(
    from_dir: RawFd,
    from: &CStr,
    to_dir: RawFd,
    to: &CStr,
    flags: libc::c_int,
) -> io::Result<()> {
    // SAFETY: valid C strings.
    check_ok(unsafe { libc::linkat(from_dir, from.as_ptr(), to_dir, to.as_ptr(), flags) })
}

/// `fchownat(dir, rel, uid, gid, flags)`; `u32::MAX` leaves an id unchanged.
///
/// Errors: its errno (`EPERM`…).
pub fn fchownat(dir: RawFd, rel: &CStr, uid: u32, gid: u32, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: valid C string.
    check_ok(unsafe { libc::fchownat(dir, rel.as_ptr(), uid, gid, flags) })
}

/// `fchmodat(dir, rel, mode, flags)`. Errors: its errno (`EPERM`, `EOPNOTSUPP`…).
pub fn fchmodat(dir: RawFd, rel: &CStr, mode: u32, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: valid C string.
    check_ok(unsafe { libc::fchmodat(dir, rel.as_ptr(), mode as libc::mode_t, flags) })
}

/// `utimensat(dir, rel, [atime, mtime], flags)` (`UTIME_NOW`/`UTIME_OMIT` in `tv_nsec`).
///
/// Errors: its errno (`EPERM`, `EACCES`…).
pub fn utimensat(
    dir: RawFd,
    rel: &CStr,
    times: &[libc::timespec; 2],
    flags: libc::c_int,
) -> io::Result<()> {
    // SAFETY: valid C string and a two-element timespec array.
    check_ok(unsafe { libc::utimensat(dir, rel.as_ptr(), times.as_ptr(), flags) })
}

/// `getdents64(fd, buf)`: fills `buf` with `struct linux_dirent64` records from the directory
/// open at `fd` and returns the bytes written (0 at the end).
///
/// Errors: its errno (`EINVAL` when `buf` cannot hold one record, `ENOTDIR`).
pub fn getdents64(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the buffer is valid for its length; the kernel writes at most that much.
    let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}
