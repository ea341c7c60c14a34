//! Thin, safe wrappers over the Linux syscalls layercache needs that `std` does not offer, and
//! the one home of `unsafe` for them: the descriptor-relative `*at` calls of the overlay's
//! layer stack and whiteouts, `renameat2(RENAME_NOREPLACE)`, `utimensat(AT_SYMLINK_NOFOLLOW)`,
//! `l*xattr`/`f*xattr`, `mount(2)` and `unshare(2)` (alloc-free, for `pre_exec` hooks),
//! signal masks and handlers, `poll`, `kill`, the `SCM_RIGHTS` receive of fusermount3's
//! descriptor, passwd/group lookups, `syncfs`, `mknod` of fifos, `getrandom`, and
//! `pidfd_open(2)`/`pidfd_getfd(2)` (through rustix) to watch a daemon and adopt a lock it
//! holds. Where rustix has a safe call (unmount, `Dir`, ids, affinity…) callers use it
//! directly; libc is underneath this file otherwise.
//! Every function returns the raw `io::Error` (callers add the path with `IoContext`).

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

fn cpath(p: &Path) -> io::Result<CString> {
    cstr(p.as_os_str())
}

/// Converts a path or name to a C string. Errors: `EINVAL` for an interior NUL.
pub fn cstr(p: &OsStr) -> io::Result<CString> {
    CString::new(p.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `parent/name` as a C string (what `Path::join` gives), built in one allocation.
/// Errors: `EINVAL` for a NUL byte in `name`.
pub fn child(parent: &CStr, name: &OsStr) -> io::Result<CString> {
    let (p, n) = (parent.to_bytes(), name.as_bytes());
    let mut v = Vec::with_capacity(p.len() + n.len() + 2);
    v.extend_from_slice(p);
    v.push(b'/');
    v.extend_from_slice(n);
    CString::new(v).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The path a C string holds, borrowed.
pub fn as_path(c: &CStr) -> &Path {
    Path::new(OsStr::from_bytes(c.to_bytes()))
}

/// A libc return value as a result: negative means failure with `errno` (taken at once, before
/// anything else can overwrite it); otherwise the value itself.
pub fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn check_ok(rc: libc::c_int) -> io::Result<()> {
    check(rc).map(drop)
}

/// A `pidfd_open(2)` descriptor for `pid` (through rustix): becomes readable when the process
/// exits (even while it is an unreaped zombie), and is immune to pid reuse.
///
/// Errors: `ESRCH` if there is no such process (or `pid` is 0 or above `i32::MAX`); `ENOSYS`
/// before Linux 5.3.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    Ok(rustix::process::pidfd_open(
        pid,
        rustix::process::PidfdFlags::empty(),
    )?)
}

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
        let mut buf = vec![0u8; 256];
        loop {
            match self.get_into(name, &mut buf) {
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

/// Restores the default action of SIGPIPE (terminate) for this process; the Rust runtime
/// starts with it ignored, which turns a write to a closed pipe into an `EPIPE` error.
pub fn default_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
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

/// Fills `buf` from the kernel's CSPRNG (`getrandom(2)`, blocking until it is seeded), for
/// secrets: unlike [`random_hex`] there is no fallback, a failure is returned.
///
/// Errors: the `getrandom(2)` errno (`ENOSYS` on kernels before 3.17); `EINTR` is retried.
pub fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: `rest` is valid for writes of its length.
        let r = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        filled += r as usize;
    }
    Ok(())
}

/// `n` random bytes from the kernel (`getrandom(2)`), as lowercase hex.
pub fn random_hex(n: usize) -> String {
    let mut buf = vec![0u8; n];
    let mut filled = 0;
    while filled < n {
        // SAFETY: the slice is valid for writes of its length.
        let r = unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), n - filled, 0) };
        if r > 0 {
            filled += r as usize;
        } else {
            // Extremely unlikely: fall back to time and pid so ids stay unique enough.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let h = blake3::hash(format!("{t}-{}-{filled}", std::process::id()).as_bytes());
            let take = (n - filled).min(32);
            buf[filled..filled + take].copy_from_slice(&h.as_bytes()[..take]);
            filled += take;
        }
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
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

/// Duplicates descriptor `fd` of process `pid` into this process (`pidfd_getfd(2)`), sharing
/// its open file description — and therefore any `flock` held through it.
///
/// Errors: `ESRCH` if the process is gone, `EPERM` without ptrace rights, `EBADF` if it has no
/// such descriptor, `ENOSYS` on kernels older than 5.6.
pub fn pidfd_getfd(pid: u32, fd: i32) -> io::Result<OwnedFd> {
    let pidfd = pidfd_open(pid)?;
    Ok(rustix::process::pidfd_getfd(
        &pidfd,
        fd,
        rustix::process::PidfdGetfdFlags::empty(),
    )?)
}

/// True when process `pid` exists and has not exited (signal 0 probe, `EPERM` counts as
/// alive; a zombie — exited, not yet reaped by its parent — counts as gone).
pub fn pid_alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    // SAFETY: signal 0 performs only the existence/permission check.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    let exists = rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    exists && !is_zombie(pid)
}

/// Whether `/proc/<pid>/stat` says the process is a zombie (state `Z`) or dead (`X`).
fn is_zombie(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and may hold any byte.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|st| st == "Z" || st == "X")
}

/// One line of `/proc/self/mountinfo` (proc(5)), the fields layercache reads, with the octal
/// escapes (`\040` for a space…) of the paths decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// Where it is mounted (field 5).
    pub mount_point: std::path::PathBuf,
    /// The filesystem type (`fuse.layercache`, `ext4`…).
    pub fs_type: String,
    /// The mount source (the first argument of mount(2)); empty for `none`.
    pub source: String,
}

/// The mounts visible to this process, from `/proc/self/mountinfo`.
///
/// (Hand-parsed: the procfs crate does not decode the octal escapes of mount points, and a
/// workdir with a space in its name must still be found.)
///
/// Errors: the `io::Error` reading the file.
pub fn mounts() -> io::Result<Vec<MountEntry>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(info.lines().filter_map(parse_mountinfo_line).collect())
}

fn parse_mountinfo_line(line: &str) -> Option<MountEntry> {
    let (pre, post) = line.split_once(" - ")?;
    let mut post = post.split(' ');
    let fs_type = post.next()?.to_string();
    let source = unescape_mountinfo(post.next().unwrap_or(""));
    let mount_point = pre.split(' ').nth(4).map(unescape_mountinfo)?;
    Some(MountEntry {
        mount_point: std::path::PathBuf::from(std::ffi::OsString::from_vec(mount_point)),
        fs_type,
        source: String::from_utf8_lossy(&source).into_owned(),
    })
}

/// Decodes mountinfo's `\ooo` octal escapes.
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// `CAP_SYS_ADMIN`'s bit in the capability sets (linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;

/// True when `CAP_SYS_ADMIN` is in this process's effective set (`CapEff` of
/// /proc/self/status, proc(5)) — in whatever user namespace the process is in: root of a
/// user namespace has it there, and may then mount FUSE in a mount namespace that namespace
/// owns (Linux ≥ 4.18). False when the file cannot be read.
pub fn has_cap_sys_admin() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| cap_eff_has(&s, CAP_SYS_ADMIN))
}

/// Whether the `CapEff:` line of a /proc/PID/status text has capability bit `cap`.
fn cap_eff_has(status: &str, cap: u32) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << cap) != 0)
}

/// True when this process is in the initial user namespace: its uid map is the identity over
/// every uid (`0 0 4294967295` in /proc/self/uid_map, user_namespaces(7)).
pub fn in_initial_user_ns() -> bool {
    std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|m| is_identity_map(&m))
}

/// Whether a /proc/PID/uid_map text is the initial namespace's identity map.
fn is_identity_map(map: &str) -> bool {
    map.split_whitespace().eq(["0", "0", "4294967295"])
}

/// True when this process has what the kernel reserves for `CAP_SYS_ADMIN` in the initial user
/// namespace — FUSE passthrough's backing files (fs/fuse/backing.c), writes to module
/// parameters and bdi knobs in sysfs, `trusted.*` xattrs: the capability, outside any user
/// namespace. Root of a user namespace (euid 0 there) does not.
pub fn init_ns_admin() -> bool {
    in_initial_user_ns() && has_cap_sys_admin()
}

/// How reads through a mount update atimes: the kernel's per-mount atime rule (mount(8)
/// `relatime`, `strictatime`, `noatime`, `nodiratime`; `touch_atime` and
/// `relatime_need_update` in fs/inode.c apply it), as `mount_setattr(2)` `MOUNT_ATTR_*` bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtimeRule {
    /// Which atime mode.
    pub mode: AtimeMode,
    /// `nodiratime`: directories never get an atime update.
    pub nodiratime: bool,
}

/// The atime mode of a mount (exactly one holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtimeMode {
    /// `relatime` (the kernel's default): update when the atime is not newer than the mtime
    /// or ctime, or is more than 24 h old.
    Relatime,
    /// `strictatime`: update on every access.
    Strict,
    /// `noatime`: never update.
    Never,
}

impl AtimeRule {
    /// No atime update at all (`noatime`).
    pub const NEVER: AtimeRule = AtimeRule {
        mode: AtimeMode::Never,
        nodiratime: false,
    };

    /// The rule mount(2) gives a mount made with `MS_*` flags `flags`, as `do_mount`
    /// (fs/namespace.c) decides it: relatime unless `MS_NOATIME`; `MS_STRICTATIME` clears
    /// both; `MS_NODIRATIME` adds nodiratime.
    pub fn from_ms_flags(flags: u64) -> AtimeRule {
        let has = |f: libc::c_ulong| flags & f != 0;
        let mode = if has(libc::MS_STRICTATIME) {
            AtimeMode::Strict
        } else if has(libc::MS_NOATIME) {
            AtimeMode::Never
        } else {
            AtimeMode::Relatime
        };
        AtimeRule {
            mode,
            nodiratime: has(libc::MS_NODIRATIME),
        }
    }

    /// The `mount_setattr(2)` bits to set (include/uapi/linux/mount.h).
    fn mount_attr(self) -> u64 {
        const MOUNT_ATTR_RELATIME: u64 = 0x00;
        const MOUNT_ATTR_NOATIME: u64 = 0x10;
        const MOUNT_ATTR_STRICTATIME: u64 = 0x20;
        const MOUNT_ATTR_NODIRATIME: u64 = 0x80;
        let mode = match self.mode {
            AtimeMode::Relatime => MOUNT_ATTR_RELATIME,
            AtimeMode::Strict => MOUNT_ATTR_STRICTATIME,
            AtimeMode::Never => MOUNT_ATTR_NOATIME,
        };
        mode | if self.nodiratime {
            MOUNT_ATTR_NODIRATIME
        } else {
            0
        }
    }
}

/// A private `noatime` view of directory `dir` ([`atime_view`] with [`AtimeRule::NEVER`]):
/// reads of files opened below it never write their atime, whatever flags open them — what
/// FUSE passthrough needs, whose backing files are opened with the reader's own flags (no
/// `O_NOATIME`).
///
/// Errors: as [`atime_view`].
pub fn noatime_view(dir: BorrowedFd<'_>) -> io::Result<(OwnedFd, OwnedFd)> {
    atime_view(dir, AtimeRule::NEVER)
}

/// A private view of directory `dir` with atime rule `rule`: a detached clone of its mount
/// (`open_tree(OPEN_TREE_CLONE)`, attached nowhere, seen by no other process) whose atime
/// flags are set by `mount_setattr(2)`, and a directory fd of `dir` through it. The kernel then
/// applies `rule` to every read of a file opened below that fd (fs/inode.c `touch_atime` checks
/// the mount of the file read), as kernel overlayfs applies its own mount's rule to its upper
/// files. The clone lives while either fd (or a file opened through them) is open.
///
/// Errors: the `open_tree`/`mount_setattr`/`openat` errno (`EPERM` without CAP_SYS_ADMIN or
/// for a mount whose atime flags are locked, `ENOSYS` before Linux 5.12).
pub fn atime_view(dir: BorrowedFd<'_>, rule: AtimeRule) -> io::Result<(OwnedFd, OwnedFd)> {
    /// `struct mount_attr` (include/uapi/linux/mount.h).
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const MOUNT_ATTR_ATIME_MASK: u64 = 0x70;
    const MOUNT_ATTR_NODIRATIME: u64 = 0x80;
    // SAFETY: open_tree with a valid dirfd and an empty NUL-terminated path.
    let t = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dir.as_raw_fd(),
            c"".as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint,
        )
    };
    if t < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a new fd that we own.
    let tree = unsafe { OwnedFd::from_raw_fd(t as i32) };
    let attr = MountAttr {
        attr_set: rule.mount_attr(),
        attr_clr: MOUNT_ATTR_ATIME_MASK | MOUNT_ATTR_NODIRATIME,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: valid fd, empty path, and a mount_attr of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat of "." relative to the (O_PATH) tree fd.
    let d = unsafe {
        libc::openat(
            tree.as_raw_fd(),
            c".".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if d < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat returned a new fd that we own.
    Ok((tree, unsafe { OwnedFd::from_raw_fd(d) }))
}

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

// ---- Descriptor-relative file syscalls (`*at`), for the overlay's layer stack and whiteouts.
// `dir` is a directory descriptor (or `libc::AT_FDCWD`) the caller keeps open for the call; a
// closed or bad one is only `EBADF`. `rel` is a path relative to it.

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

// ---- Open files.

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

// ---- Mounts and namespaces.

/// `mount(2)` with C strings only (no allocation: usable in a `pre_exec` hook). `None` passes
/// NULL; `flags` are `MS_*` (`MS_REMOUNT`, `MS_BIND`, `MS_REC | MS_PRIVATE`…).
///
/// Errors: its errno (`EPERM` without CAP_SYS_ADMIN over the mount namespace, `ENOENT`,
/// `EINVAL`, `EBUSY`…).
pub fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    let ptr = |c: Option<&CStr>| c.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: every pointer is NULL or a NUL-terminated string that outlives the call.
    check_ok(unsafe {
        libc::mount(
            ptr(source),
            target.as_ptr(),
            ptr(fstype),
            flags,
            ptr(data).cast(),
        )
    })
}

/// `unshare(flags)` for new namespaces (`CLONE_NEWNS`, `CLONE_NEWUSER`, `CLONE_NEWPID`…).
/// `CLONE_FILES` (which would split the descriptor table under other threads) is refused.
/// Async-signal-safe.
///
/// Errors: `EINVAL` for `CLONE_FILES`, or the `unshare(2)` errno (`EPERM`, `ENOSPC`, `EUSERS`,
/// `EINVAL` for a user namespace in a multithreaded process).
pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    if flags & libc::CLONE_FILES != 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: only namespace flags: no descriptor or memory changes under other threads.
    check_ok(unsafe { libc::unshare(flags) })
}

// ---- Processes and signals.

/// `kill(pid, sig)`: a process (`pid > 0`) or the process group `-pid` (`pid < 0`); signal 0
/// only probes. Async-signal-safe (for a signal handler).
///
/// Errors: its errno (`ESRCH`, `EPERM`).
pub fn kill(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: kill takes plain integers.
    check_ok(unsafe { libc::kill(pid, sig) })
}

/// Reaps `pid` if it is an exited child of this process (`waitpid(pid, WNOHANG)`); returns
/// whether it did. Not our child (`ECHILD`) or still running: false.
pub fn reap_nohang(pid: u32) -> bool {
    // SAFETY: a NULL status pointer is allowed; plain integers otherwise.
    unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG) > 0 }
}

/// A signal disposition saved by [`catch_signal`], for [`restore_signal`].
pub struct SavedAction(libc::sigaction);

/// Installs `handler` for `sig` with `SA_RESTART` and an empty mask, returning the disposition
/// it replaces.
///
/// # Safety
/// `handler` runs in signal context, interrupting any code of this process: it may only make
/// async-signal-safe calls (atomics, `kill(2)`, [`kill`]) — no allocation, no locks.
///
/// Errors: the `sigaction(2)` errno (`EINVAL` for SIGKILL/SIGSTOP or a bad number).
pub unsafe fn catch_signal(
    sig: libc::c_int,
    handler: extern "C" fn(libc::c_int),
) -> io::Result<SavedAction> {
    // SAFETY: sigaction is plain data; all-zero is a valid (empty) value.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler as usize;
    act.sa_flags = libc::SA_RESTART;
    let mut old = std::mem::MaybeUninit::<libc::sigaction>::uninit();
    // SAFETY: valid pointers; sigemptyset initialises the mask; the caller vouches for the
    // handler.
    unsafe {
        libc::sigemptyset(&mut act.sa_mask);
        check(libc::sigaction(sig, &act, old.as_mut_ptr()))?;
        Ok(SavedAction(old.assume_init()))
    }
}

/// Puts back the disposition [`catch_signal`] replaced.
///
/// Errors: the `sigaction(2)` errno.
pub fn restore_signal(sig: libc::c_int, saved: &SavedAction) -> io::Result<()> {
    // SAFETY: `saved` is a disposition the kernel handed out for `sig`, so reinstating it runs
    // no handler this process did not already have.
    check_ok(unsafe { libc::sigaction(sig, &saved.0, std::ptr::null_mut()) })
}

/// A set of signals (`sigset_t`), for blocking them in a thread and waiting for them there.
#[derive(Clone, Copy)]
pub struct SignalSet(libc::sigset_t);

impl SignalSet {
    /// The set of `sigs` (signal numbers; an invalid one is left out).
    pub fn of(sigs: &[libc::c_int]) -> SignalSet {
        let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initialises the set; sigaddset sets one bit of it.
        unsafe {
            libc::sigemptyset(set.as_mut_ptr());
            for &s in sigs {
                libc::sigaddset(set.as_mut_ptr(), s);
            }
            SignalSet(set.assume_init())
        }
    }

    /// Blocks the set in the calling thread (`pthread_sigmask(SIG_BLOCK)`); threads started
    /// afterwards inherit the mask.
    ///
    /// Errors: its errno (`EINVAL`).
    pub fn block_in_thread(&self) -> io::Result<()> {
        // SAFETY: a valid set; the old mask is not asked for.
        let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &self.0, std::ptr::null_mut()) };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(())
    }

    /// Waits until one of the set (blocked in this thread) is pending, takes it and returns
    /// its number (`sigwait(3)`).
    ///
    /// Errors: its errno (`EINVAL`).
    pub fn wait(&self) -> io::Result<libc::c_int> {
        let mut sig = 0;
        // SAFETY: a valid set and out pointer.
        let r = unsafe { libc::sigwait(&self.0, &mut sig) };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(sig)
    }
}

/// Sets the calling thread's scheduling policy (`SCHED_OTHER`, `SCHED_IDLE`, `SCHED_BATCH`;
/// `priority` 0 for these) with `sched_setscheduler(0, …)`; rustix has no such call.
///
/// Errors: its errno (`EPERM` for a policy the thread may not take, `EINVAL`).
pub fn sched_setscheduler_self(policy: libc::c_int, priority: libc::c_int) -> io::Result<()> {
    let p = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: pid 0 is the calling thread; `p` is a valid sched_param.
    check_ok(unsafe { libc::sched_setscheduler(0, policy, &p) })
}

// ---- The allocator (glibc).

/// Limits glibc's malloc to `n` arenas (`mallopt(M_ARENA_MAX)`); nothing elsewhere. Call it
/// before other threads allocate.
pub fn malloc_arena_max(n: libc::c_int) {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator parameters.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, n);
    }
    let _ = n;
}

/// Returns freed heap memory to the system (`malloc_trim(0)`, glibc); nothing elsewhere.
pub fn malloc_trim() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory of the allocator.
    unsafe {
        libc::malloc_trim(0);
    }
}

// ---- The user and group databases (NSS: files, LDAP, systemd-userdb…).

/// The passwd entry's (uid, primary gid) of user `name` (`getpwnam_r(3)`); `None` when there is
/// none (or `name` holds a NUL).
///
/// Errors: the lookup's errno (`EIO`, `EMFILE`…: the database could not be read).
pub fn user_by_name(name: &str) -> io::Result<Option<(u32, u32)>> {
    let Ok(c) = CString::new(name) else {
        return Ok(None);
    };
    passwd_lookup(|pw, buf, len, out| {
        // SAFETY: valid pointers to a passwd struct, a buffer of `len` bytes and an out slot.
        unsafe { libc::getpwnam_r(c.as_ptr(), pw, buf, len, out) }
    })
}

/// The passwd entry's (uid, primary gid) of `uid` (`getpwuid_r(3)`); `None` when there is none.
///
/// Errors: as [`user_by_name`].
pub fn user_by_uid(uid: u32) -> io::Result<Option<(u32, u32)>> {
    passwd_lookup(|pw, buf, len, out| {
        // SAFETY: as in user_by_name.
        unsafe { libc::getpwuid_r(uid, pw, buf, len, out) }
    })
}

/// The largest buffer a user or group lookup grows to (bytes); the entry of a group with
/// thousands of members needs this much.
const NSS_BUF_MAX: usize = 1 << 20;

fn passwd_lookup(
    call: impl Fn(*mut libc::passwd, *mut libc::c_char, usize, *mut *mut libc::passwd) -> libc::c_int,
) -> io::Result<Option<(u32, u32)>> {
    let mut buf = vec![0 as libc::c_char; 1024];
    loop {
        let mut pw = std::mem::MaybeUninit::<libc::passwd>::uninit();
        let mut out = std::ptr::null_mut();
        let r = call(pw.as_mut_ptr(), buf.as_mut_ptr(), buf.len(), &mut out);
        if r == libc::ERANGE && buf.len() < NSS_BUF_MAX {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        if out.is_null() {
            return Ok(None);
        }
        // SAFETY: the lookup succeeded and filled `pw` (`out` points at it).
        let pw = unsafe { pw.assume_init() };
        return Ok(Some((pw.pw_uid, pw.pw_gid)));
    }
}

/// The gid of group `name` (`getgrnam_r(3)`); `None` when there is none (or `name` holds a
/// NUL).
///
/// Errors: as [`user_by_name`].
pub fn group_by_name(name: &str) -> io::Result<Option<u32>> {
    let Ok(c) = CString::new(name) else {
        return Ok(None);
    };
    let mut buf = vec![0 as libc::c_char; 1024];
    loop {
        let mut gr = std::mem::MaybeUninit::<libc::group>::uninit();
        let mut out = std::ptr::null_mut();
        // SAFETY: valid pointers to a group struct, a buffer of its length and an out slot.
        let r = unsafe {
            libc::getgrnam_r(
                c.as_ptr(),
                gr.as_mut_ptr(),
                buf.as_mut_ptr(),
                buf.len(),
                &mut out,
            )
        };
        if r == libc::ERANGE && buf.len() < NSS_BUF_MAX {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        if out.is_null() {
            return Ok(None);
        }
        // SAFETY: the lookup succeeded and filled `gr`.
        return Ok(Some(unsafe { gr.assume_init() }.gr_gid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// mount(2)'s defaults (fs/namespace.c `do_mount`): relatime unless noatime, strictatime
    /// over both, nodiratime on its own.
    #[test]
    fn atime_rule_follows_do_mount() {
        let rule = |f: libc::c_ulong| AtimeRule::from_ms_flags(f);
        assert_eq!(rule(0).mode, AtimeMode::Relatime);
        assert_eq!(rule(libc::MS_RELATIME).mode, AtimeMode::Relatime);
        assert_eq!(rule(libc::MS_NOATIME).mode, AtimeMode::Never);
        assert_eq!(rule(libc::MS_STRICTATIME).mode, AtimeMode::Strict);
        assert_eq!(
            rule(libc::MS_NOATIME | libc::MS_STRICTATIME).mode,
            AtimeMode::Strict
        );
        assert!(rule(libc::MS_NODIRATIME).nodiratime);
        assert!(!rule(libc::MS_NOATIME).nodiratime);
        assert_eq!(rule(libc::MS_NOATIME).mount_attr(), 0x10);
        assert_eq!(
            rule(libc::MS_STRICTATIME | libc::MS_NODIRATIME).mount_attr(),
            0xa0
        );
    }

    #[test]
    fn privilege_is_parsed_from_proc_texts() {
        assert!(is_identity_map("         0          0 4294967295\n"));
        // Root of a user namespace made by `unshare -Ur` as uid 1000.
        assert!(!is_identity_map("         0       1000          1\n"));
        assert!(!is_identity_map(""));
        let status = |eff: &str| format!("Name:\tx\nCapPrm:\t000001ffffffffff\nCapEff:\t{eff}\n");
        assert!(cap_eff_has(&status("000001ffffffffff"), CAP_SYS_ADMIN));
        assert!(cap_eff_has(&status("0000000000200000"), CAP_SYS_ADMIN));
        assert!(!cap_eff_has(&status("0000000000000000"), CAP_SYS_ADMIN));
        assert!(!cap_eff_has(&status("00000000001fffff"), CAP_SYS_ADMIN));
        assert!(!cap_eff_has("garbage", CAP_SYS_ADMIN));
    }

    #[test]
    fn mountinfo_lines_decode_escapes() {
        let line = "36 35 0:40 / /tmp/a\\040b rw,nosuid shared:1 - fuse.layercache \
                    layercache:/s/v1/projects/p/runs/r/upper rw,user_id=0";
        let e = parse_mountinfo_line(line).unwrap();
        assert_eq!(e.mount_point, std::path::Path::new("/tmp/a b"));
        assert_eq!(e.fs_type, "fuse.layercache");
        assert_eq!(e.source, "layercache:/s/v1/projects/p/runs/r/upper");
        assert!(parse_mountinfo_line("garbage").is_none());
    }

    #[test]
    fn users_and_groups_are_looked_up() {
        // Every passwd and group database has root, uid 0 / gid 0.
        assert_eq!(user_by_name("root").unwrap(), Some((0, 0)));
        assert_eq!(user_by_uid(0).unwrap(), Some((0, 0)));
        assert_eq!(group_by_name("root").unwrap(), Some(0));
        assert_eq!(user_by_name("no-such-user-layercache").unwrap(), None);
        assert_eq!(group_by_name("no-such-group-layercache").unwrap(), None);
        assert_eq!(user_by_name("ro\0ot").unwrap(), None);
    }

    #[test]
    fn at_wrappers_report_their_errno() {
        let t = tempfile::tempdir().unwrap();
        let d = std::fs::File::open(t.path()).unwrap();
        let fd = d.as_raw_fd();
        mkdirat(fd, c"sub", 0o755).unwrap();
        let e = mkdirat(fd, c"sub", 0o755).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
        symlinkat(c"sub", fd, c"lnk").unwrap();
        assert_eq!(readlinkat(fd, c"lnk").unwrap(), b"sub");
        let st = fstatat(fd, c"lnk", libc::AT_SYMLINK_NOFOLLOW).unwrap();
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFLNK);
        let e = openat(fd, c"lnk", libc::O_RDONLY | libc::O_NOFOLLOW, 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
        renameat2(fd, c"lnk", fd, c"sub", libc::RENAME_NOREPLACE)
            .map(drop)
            .unwrap_err();
        unlinkat(fd, c"sub", libc::AT_REMOVEDIR).unwrap();
        let e = fstatat(fd, c"sub", 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        // A missing layer's fd (-1) is only EBADF.
        let e = fstatat(-1, c"x", 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
    }

    #[test]
    fn poll_one_sees_a_closed_reader_and_unshare_refuses_clone_files() {
        let (r, w) = std::io::pipe().unwrap();
        use std::os::fd::AsFd;
        assert_eq!(
            poll_one(w.as_fd(), libc::POLLOUT, 0).unwrap() & libc::POLLERR,
            0
        );
        drop(r);
        assert_ne!(
            poll_one(w.as_fd(), libc::POLLOUT, 0).unwrap() & libc::POLLERR,
            0
        );
        let e = unshare(libc::CLONE_FILES).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn an_empty_buffer_asks_the_xattr_and_list_sizes() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("f");
        std::fs::write(&f, "x").unwrap();
        if set_xattr(&f, b"user.fish", b"fishval").is_err() {
            return; // no user xattrs on this filesystem
        }
        let p = cpath(&f).unwrap();
        let file = std::fs::File::open(&f).unwrap();
        use std::os::fd::AsFd;
        for x in [Xattrs::Path(&p), Xattrs::Fd(file.as_fd())] {
            assert_eq!(x.get_into(c"user.fish", &mut []).unwrap(), 7, "{x:?}");
            let n = x.list_into(&mut []).unwrap();
            let mut buf = vec![0u8; 4096];
            assert_eq!(n, x.list_into(&mut buf).unwrap(), "{x:?}");
            assert!(n >= b"user.fish\0".len(), "{x:?}");
        }
    }
}
