//! Paths and open files: `renameat2(RENAME_NOREPLACE)`, `utimensat(AT_SYMLINK_NOFOLLOW)`,
//! `fstat`, `syncfs`, fifos, `flock`, the inode-flag ioctls, file handles, `lseek`,
//! `fallocate`, `copy_file_range`, `poll`, close-on-exec, and the `SCM_RIGHTS` receive of
//! fusermount3's descriptor.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use super::{check, check_ok, cpath};

/// `renameat2(src, dst, RENAME_NOREPLACE)`: atomically moves `src` to `dst` unless `dst` exists.
///
/// Errors: `EEXIST` when `dst` exists (nothing is changed), or any other `renameat2(2)` errno.
pub fn rename_noreplace(src: &Path, dst: &Path) -> io::Result<()> {
    let (s, d) = (cpath(src)?, cpath(dst)?);
    // SAFETY: both strings are NUL-terminated and outlive the call.
    check_ok(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            s.as_ptr(),
            libc::AT_FDCWD,
            d.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    })
}

/// Sets atime and mtime (seconds, nanoseconds) of `path` without following a final symlink.
///
/// Errors: the `utimensat(2)` errno.
pub fn set_times_nofollow(path: &Path, atime: (i64, i64), mtime: (i64, i64)) -> io::Result<()> {
    let c = cpath(path)?;
    let ts = [
        libc::timespec {
            tv_sec: atime.0 as libc::time_t,
            tv_nsec: atime.1 as _,
        },
        libc::timespec {
            tv_sec: mtime.0 as libc::time_t,
            tv_nsec: mtime.1 as _,
        },
    ];
    // SAFETY: valid path and a two-element timespec array.
    check_ok(unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}
/// `fstat(2)` of an open file. Errors: its errno (`EBADF`, `EIO`…).
pub fn fstat(f: &impl AsRawFd) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat of an open fd into a stat buffer it fills on success.
    check(unsafe { libc::fstat(f.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so it filled the buffer.
    Ok(unsafe { st.assume_init() })
}

/// `syncfs(2)` on the filesystem holding `path` (a directory or file).
///
/// Errors: opening `path` or the `syncfs` errno.
pub fn syncfs(path: &Path) -> io::Result<()> {
    let f = std::fs::File::open(path)?;
    // SAFETY: valid open fd.
    check_ok(unsafe { libc::syncfs(f.as_raw_fd()) })
}

/// `fsync(2)` of a directory (makes renames/links inside it durable).
///
/// Errors: opening or the `fsync` errno.
pub fn fsync_dir(path: &Path) -> io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

/// Creates a fifo at `path` with permission bits `mode`.
///
/// Errors: the `mknod(2)` errno.
pub fn mkfifo(path: &Path, mode: u32) -> io::Result<()> {
    let c = cpath(path)?;
    // SAFETY: valid path.
    check_ok(unsafe { libc::mknod(c.as_ptr(), libc::S_IFIFO | (mode & 0o7777), 0) })
}
/// `flock(2)` on `fd` with `op` (`LOCK_SH`, `LOCK_EX`, optionally `| LOCK_NB`).
///
/// Errors: `EWOULDBLOCK` when non-blocking and held elsewhere, or the `flock` errno.
pub fn flock(fd: &impl AsRawFd, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: valid fd.
        let rc = unsafe { libc::flock(fd.as_raw_fd(), op) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}
/// Takes (`lock`) or drops a write lock on the one byte at offset `at` of the file open as
/// `fd`, owned by its open file description (`F_OFD_SETLK`, fcntl(2)); never waits. Another
/// open file description's lock on that byte conflicts (another process's, or another `open`
/// of the file in this one); the kernel drops the lock when the description's last descriptor
/// closes, also when its process is killed. `fd` must be open for writing. Returns whether the
/// lock is held now (`false`: another description holds it). `at` is at most `i64::MAX`.
///
/// Errors: the `fcntl` errno other than the conflict's `EAGAIN`/`EACCES` (`EINVAL` where the
/// filesystem has no such locks, `EBADF` for a descriptor not open for writing).
pub fn ofd_lock_byte(fd: &impl AsRawFd, at: u64, lock: bool) -> io::Result<bool> {
    let start =
        libc::off_t::try_from(at).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `flock` is plain data; all zeroes (l_pid 0, as F_OFD_SETLK requires) is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = if lock { libc::F_WRLCK } else { libc::F_UNLCK } as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start;
    fl.l_len = 1;
    loop {
        // SAFETY: valid fd; `fl` is a valid flock the kernel reads during the call only.
        let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
        if rc == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN | libc::EACCES) => return Ok(false),
            _ => return Err(err),
        }
    }
}

/// `FS_IOC_GETFLAGS` (`_IOR('f', 1, long)`, include/uapi/linux/fs.h): reads the inode flags
/// (`FS_IMMUTABLE_FL`, `FS_NOCOW_FL`…) through [`ioctl_fileattr`].
pub const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
/// `FS_IOC_SETFLAGS` (`_IOW('f', 2, long)`, include/uapi/linux/fs.h): sets the inode flags
/// through [`ioctl_fileattr`].
pub const FS_IOC_SETFLAGS: u32 = 0x4008_6602;

/// `ioctl(fd, cmd, buf)` for the inode-flag commands, whose argument is a buffer the command
/// reads or writes in place: `FS_IOC_GETFLAGS`/`FS_IOC_SETFLAGS` (an int, 4 bytes, as the
/// kernel passes it) and `FS_IOC_FSGETXATTR`/`FS_IOC_FSSETXATTR` (`struct fsxattr`, 28 bytes;
/// include/uapi/linux/fs.h). `buf` must hold at least 28 bytes, so any of the four fits.
///
/// Errors: `EINVAL` for a `buf` shorter than 28 bytes; otherwise the `ioctl(2)` errno
/// (`ENOTTY`/`EOPNOTSUPP` where the filesystem has no inode flags, `EPERM`…).
pub fn ioctl_fileattr(fd: BorrowedFd<'_>, cmd: u32, buf: &mut [u8]) -> io::Result<()> {
    if buf.len() < 28 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: valid fd; `buf` is at least the 28 bytes the largest of these commands reads or
    // writes, and the kernel keeps no pointer to it after the call.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), cmd as _, buf.as_mut_ptr()) })?;
    Ok(())
}

/// `fsync(2)` of descriptor `fd` (a directory too: its entries reach the disk).
///
/// Errors: the `fsync` errno (`EBADF`, `EIO`, `EINVAL` where the file cannot be synced).
pub fn fsync_fd(fd: RawFd) -> io::Result<()> {
    // SAFETY: fsync takes any descriptor and retains nothing; a bad one is only EBADF.
    check_ok(unsafe { libc::fsync(fd) })
}

/// The filesystem's own handle of the inode at `rel` below directory `dir`, not following a
/// last symlink: `name_to_handle_at(2)`'s `(handle_type, f_handle bytes)`, at most 128 bytes
/// (MAX_HANDLE_SZ).
///
/// Errors: the `name_to_handle_at` errno (`EOPNOTSUPP` for a filesystem without handles,
/// `EOVERFLOW` for a handle longer than 128 bytes, `ENOENT`).
pub fn name_to_handle(dir: RawFd, rel: &CStr) -> io::Result<(i32, Vec<u8>)> {
    /// `struct file_handle` with MAX_HANDLE_SZ bytes of room (include/linux/exportfs.h).
    #[repr(C)]
    struct Fh {
        bytes: u32,
        kind: i32,
        data: [u8; 128],
    }
    let mut h = Fh {
        bytes: 128,
        kind: 0,
        data: [0; 128],
    };
    let mut mnt: libc::c_int = 0;
    // SAFETY: `h` is a file_handle whose `bytes` says how much room follows its header; `rel`
    // is NUL-terminated; the kernel keeps no pointer after the call.
    check(unsafe {
        libc::name_to_handle_at(dir, rel.as_ptr(), (&mut h as *mut Fh).cast(), &mut mnt, 0)
    })?;
    let n = (h.bytes as usize).min(h.data.len());
    Ok((h.kind, h.data[..n].to_vec()))
}
/// `lseek(fd, offset, whence)` (`SEEK_SET`, `SEEK_DATA`, `SEEK_HOLE`…): the new offset.
///
/// Errors: its errno (`ENXIO` past the last data with `SEEK_DATA`, `EINVAL`).
pub fn lseek(fd: &impl AsRawFd, offset: i64, whence: libc::c_int) -> io::Result<i64> {
    // SAFETY: plain integers; a bad fd is EBADF.
    let r = unsafe { libc::lseek(fd.as_raw_fd(), offset, whence) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// `fallocate(fd, mode, offset, len)` (bytes).
///
/// Errors: its errno (`EOPNOTSUPP` for a mode the filesystem lacks, `ENOSPC`).
pub fn fallocate(fd: &impl AsRawFd, mode: libc::c_int, offset: i64, len: i64) -> io::Result<()> {
    // SAFETY: plain integers.
    check_ok(unsafe { libc::fallocate(fd.as_raw_fd(), mode, offset, len) })
}

/// `copy_file_range(fd_in, off_in, fd_out, off_out, len, 0)`: bytes copied (0 at the end of
/// the source); both offsets advance by that much, the files' own offsets do not move.
///
/// Errors: its errno (`EXDEV` across filesystems on older kernels, `EINVAL`, `EOPNOTSUPP`).
pub fn copy_file_range(
    fd_in: &impl AsRawFd,
    off_in: &mut i64,
    fd_out: &impl AsRawFd,
    off_out: &mut i64,
    len: usize,
) -> io::Result<usize> {
    // SAFETY: the offsets are valid i64s the call may update.
    let n = unsafe {
        libc::copy_file_range(
            fd_in.as_raw_fd(),
            off_in,
            fd_out.as_raw_fd(),
            off_out,
            len,
            0,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// `fstatvfs(fd)`. Errors: its errno (`EBADF`, `ENOSYS`).
pub fn fstatvfs(fd: &impl AsRawFd) -> io::Result<libc::statvfs> {
    let mut sv = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: valid out pointer.
    check(unsafe { libc::fstatvfs(fd.as_raw_fd(), sv.as_mut_ptr()) })?;
    // SAFETY: fstatvfs succeeded, so it filled the buffer.
    Ok(unsafe { sv.assume_init() })
}

/// The size of a filesystem and what is free on it at one moment (`fstatvfs(3)`): bytes, and
/// inodes where the filesystem counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsRoom {
    /// Its size, bytes (`f_blocks`).
    pub bytes: u64,
    /// Its free bytes for an unprivileged user (`f_bavail`).
    pub bytes_free: u64,
    /// Its inodes and how many of them are free for an unprivileged user (`f_files`,
    /// `f_favail`); `None` for a filesystem that keeps no count (`f_files` 0: btrfs, for one,
    /// makes inodes as it goes).
    pub inodes: Option<(u64, u64)>,
}

impl FsRoom {
    /// The room of the filesystem holding `path` now; `None` when `path` cannot be opened or
    /// the filesystem cannot be asked.
    pub fn of(path: &Path) -> Option<FsRoom> {
        let f = std::fs::File::open(path).ok()?;
        let sv = fstatvfs(&f).ok()?;
        Some(FsRoom {
            bytes: sv.f_blocks * sv.f_frsize,
            bytes_free: sv.f_bavail * sv.f_frsize,
            inodes: (sv.f_files > 0).then_some((sv.f_files, sv.f_favail)),
        })
    }
}

/// `poll(2)` of one descriptor for `events` (`POLLIN`, `POLLOUT`) for up to `timeout_ms`
/// (negative: no limit): the `revents` it reports, 0 when the time ran out.
///
/// Errors: its errno (`EINTR` when a signal handler ran meanwhile).
pub fn poll_one(fd: BorrowedFd<'_>, events: i16, timeout_ms: libc::c_int) -> io::Result<i16> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = check(unsafe { libc::poll(&mut pfd, 1, timeout_ms) })?;
    Ok(if n == 1 { pfd.revents } else { 0 })
}

/// Clears (`inheritable`) or sets `FD_CLOEXEC` on `fd`. Async-signal-safe (for a `pre_exec`
/// hook).
///
/// Errors: the `fcntl(2)` errno (`EBADF`).
pub fn set_inheritable(fd: RawFd, inheritable: bool) -> io::Result<()> {
    // SAFETY: F_GETFD/F_SETFD take and return plain integers.
    let flags = check(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    let flags = if inheritable {
        flags & !libc::FD_CLOEXEC
    } else {
        flags | libc::FD_CLOEXEC
    };
    // SAFETY: as above.
    check_ok(unsafe { libc::fcntl(fd, libc::F_SETFD, flags) })
}

/// `close_range(first, u32::MAX, flags)`: closes every descriptor from `first` up (flags 0),
/// or marks them close-on-exec (`CLOSE_RANGE_CLOEXEC`, Linux 5.11). Async-signal-safe (for a
/// `pre_exec` hook or a forked child); the caller must own every descriptor in the range and
/// use none of them afterwards when closing.
///
/// Errors: its errno (`ENOSYS` before Linux 5.9, `EINVAL` for unknown flags).
pub fn close_range_from(first: u32, flags: u32) -> io::Result<()> {
    // SAFETY: plain integers; the caller's contract covers the descriptors.
    let r = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, flags) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives one descriptor sent with `SCM_RIGHTS` on the socket `sock` (unix(7)), retrying
/// after `EINTR`; the descriptor is close-on-exec (`MSG_CMSG_CLOEXEC`).
///
/// Errors: the `recvmsg` errno; `ENODATA` when the peer closed without sending one.
pub fn recv_fd(sock: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one cmsghdr carrying one int, u64-aligned.
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain data; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    let n = loop {
        // SAFETY: `msg` points at valid buffers of the sizes it states.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        break n;
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel filled `msg`; the CMSG macros walk the buffer it describes.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let fd: RawFd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                if fd >= 0 {
                    return Ok(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Err(io::Error::from_raw_os_error(libc::ENODATA))
}

/// Opens the file `name` — relative to the directory `dir`, or to the working directory for
/// `None` — to read it as a private file (a token, a stored spec) is read: without following a
/// final symlink, without taking a controlling terminal or blocking on a fifo (`O_RDONLY |
/// O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK`), and `fstat`s what was opened, so the
/// caller's owner, mode and file-type checks are made on the descriptor it reads.
///
/// Errors: `ELOOP` when `name` is a symlink, `ENOENT` when it does not exist, or another
/// `openat(2)`/`fstat(2)` errno.
pub fn open_nofollow(
    dir: Option<BorrowedFd<'_>>,
    name: &Path,
) -> io::Result<(std::fs::File, std::fs::Metadata)> {
    use rustix::fs::{Mode, OFlags};
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
    let fd = match dir {
        Some(d) => rustix::fs::openat(d, name, flags, Mode::empty()),
        None => rustix::fs::openat(rustix::fs::CWD, name, flags, Mode::empty()),
    }?;
    let f = std::fs::File::from(fd);
    let meta = f.metadata()?;
    Ok((f, meta))
}
