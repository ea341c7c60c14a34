//! Mounts, namespaces and privilege: `/proc/self/mountinfo`, `CAP_SYS_ADMIN` and the initial
//! user namespace, per-mount atime rules on a private view (`open_tree`/`mount_setattr`),
//! `mount(2)` and `unshare(2)` (alloc-free, for `pre_exec` hooks).

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;

use super::check_ok;

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
}
