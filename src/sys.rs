//! Thin, safe wrappers over the Linux syscalls layercache needs that `std` does not offer:
//! `renameat2(RENAME_NOREPLACE)`, `utimensat(AT_SYMLINK_NOFOLLOW)`, `l*xattr`, `syncfs`,
//! `mknod` of fifos, `getrandom`, and `pidfd_open(2)`/`pidfd_getfd(2)` (through rustix) to
//! watch a daemon and adopt a lock it holds.
//! Every function returns the raw `io::Error` (callers add the path with `IoContext`).

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
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
    use std::os::fd::FromRawFd;
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
