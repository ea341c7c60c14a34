//! Mounting and unmounting of the overlay: the FUSE mount itself (mount(2) or fusermount3),
//! what is checked before it, remount, the mount's readahead window, and finding, unmounting
//! and waiting for the daemon of a mountpoint. Nothing here starts or serves a daemon (that is
//! `daemon.rs`, which calls in here).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use super::{OverlayConfig, READ_AHEAD_KB, fusermount, stack};
use crate::error::{Error, IoContext, Result};

/// Raises the readahead window of the FUSE mount at `mountpoint` to [`READ_AHEAD_KB`]. The
/// window belongs to the mount's own backing device info (`/sys/class/bdi/MAJOR:MINOR`, named
/// after the mount's anonymous device), so no other filesystem is affected. The kernel starts
/// every FUSE mount at the default 128 KiB and INIT's `max_readahead` can only lower that
/// (fs/fuse/inode.c `process_init_reply`), hence sysfs. Best effort: without root, or with
/// sysfs read-only, the mount keeps 128 KiB.
///
/// Sends no request to the mount (`AT_STATX_DONT_SYNC`), so it is safe before requests are
/// served.
pub(super) fn raise_read_ahead(mountpoint: &Path) {
    let Ok(path) = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes()) else {
        return;
    };
    let Ok(stx) = crate::sys::statx(
        libc::AT_FDCWD,
        &path,
        libc::AT_STATX_DONT_SYNC | libc::AT_NO_AUTOMOUNT,
        0,
    ) else {
        return;
    };
    let knob = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        stx.stx_dev_major, stx.stx_dev_minor
    );
    let now: Option<u64> = std::fs::read_to_string(&knob)
        .ok()
        .and_then(|v| v.trim().parse().ok());
    if now.is_some_and(|kb| kb < READ_AHEAD_KB)
        && let Err(e) = std::fs::write(&knob, READ_AHEAD_KB.to_string())
    {
        tracing::debug!("{knob}: {e}; readahead stays at {now:?} KiB");
    }
}

/// Mounts a FUSE filesystem of type `fuse.layercache` at `mountpoint` and returns the
/// /dev/fuse descriptor: with mount(2) when this process has CAP_SYS_ADMIN (root, or root of a
/// user namespace owning the mount namespace), else — or when mount(2) is refused with `EPERM`
/// and the helper is there — through fusermount3 ([`fusermount::mount`]). Its source is
/// `layercache:<upperdir>` (see [`upperdir_of`]), `layercache:<top lowerdir>` for a
/// lowerdir-only mount. A mount(2) mount is `nosuid,nodev,allow_other,default_permissions`
/// (without `nodev` for [`OverlayConfig::dev`], without `nosuid` for [`OverlayConfig::suid`],
/// and `ro` for [`OverlayConfig::read_only`]); a fusermount3 mount is
/// `nosuid,nodev,default_permissions` (fusermount3 forces both for a user), with `allow_other`
/// only when `cfg.allow_other` and `ro` for a read-only one.
///
/// The mount is made here rather than by fuser so that nothing unmounts "whatever is at
/// MOUNTPOINT" when the session ends: after `umount MNT` and a new mount at the same place, a
/// late-exiting old daemon must leave the new mount alone.
///
/// Errors: [`Error::Invalid`] naming the mountpoint and the mount(2) errno, or fusermount3's
/// reason.
pub(super) fn mount_fuse(mountpoint: &Path, cfg: &OverlayConfig) -> Result<OwnedFd> {
    let mut source = std::ffi::OsString::from(SOURCE_PREFIX);
    source.push(mount_named(cfg));
    let user = fusermount::UserMount {
        allow_other: cfg.allow_other,
        read_only: cfg.read_only,
    };
    if crate::sys::has_cap_sys_admin() {
        match mount_direct(mountpoint, cfg) {
            Err(e) if e.1 == libc::EPERM && fusermount::find_helper().is_some() => {
                tracing::debug!("{}; mounting through fusermount3", e.0);
            }
            r => return r.map_err(|e| e.0),
        }
    }
    let helper = fusermount::check_user_mount(mountpoint, user)?;
    fusermount::mount(&helper, mountpoint, &source, user)
}

/// [`mount_fuse`] with mount(2). Errors: [`Error::Invalid`] with the errno (`EPERM` without
/// CAP_SYS_ADMIN over this mount namespace).
fn mount_direct(
    mountpoint: &Path,
    cfg: &OverlayConfig,
) -> std::result::Result<OwnedFd, (Error, i32)> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| {
            let errno = e.raw_os_error().unwrap_or(libc::EIO);
            (Error::invalid(format!("/dev/fuse: {e}")), errno)
        })?;
    let fd: OwnedFd = dev.into();
    let (uid, gid) = (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    let data = format!(
        "fd={},rootmode=40000,user_id={uid},group_id={gid},allow_other,default_permissions",
        fd.as_raw_fd()
    );
    let source = format!("{SOURCE_PREFIX}{}", mount_named(cfg).display());
    // The per-mount options given (noatime, noexec, …): the kernel applies them to the mount.
    let mut flags = cfg.mount_flags as libc::c_ulong;
    if !cfg.suid {
        flags |= libc::MS_NOSUID;
    }
    if !cfg.dev {
        flags |= libc::MS_NODEV;
    }
    if cfg.read_only {
        flags |= libc::MS_RDONLY;
    }
    let c = |s: &str| crate::sys::cstr(s.as_ref());
    let mounted = c(&source).and_then(|src| {
        let target = crate::sys::cstr(mountpoint.as_os_str())?;
        let data = c(&data)?;
        crate::sys::mount(
            Some(&src),
            &target,
            Some(c"fuse.layercache"),
            flags,
            Some(&data),
        )
    });
    mounted.map_err(|e| {
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        let hint = if errno == libc::EPERM {
            " (mounting needs root, or fusermount3 from Debian's fuse3 for a user)"
        } else {
            ""
        };
        (
            Error::invalid(format!("mount {}: {e}{hint}", mountpoint.display())),
            errno,
        )
    })?;
    Ok(fd)
}

/// The directory a mount's source names: the upperdir, or the top lowerdir of a lowerdir-only
/// (read-only) mount.
fn mount_named(cfg: &OverlayConfig) -> &Path {
    if cfg.has_upper() {
        &cfg.upperdir
    } else {
        &cfg.lowerdirs[0]
    }
}

/// What is checked before a mount is attempted: /dev/fuse, what a user's mount needs
/// ([`fusermount::check_user_mount`]; /dev/fuse access for root of a user namespace), the
/// mountpoint free, the upper filesystem fit ([`stack::probe_upper`]).
///
/// Errors: [`Error::Invalid`] naming the first thing that is missing.
pub(super) fn preflight(cfg: &OverlayConfig, mountpoint: &Path) -> Result<()> {
    if !Path::new("/dev/fuse").exists() {
        return Err(Error::invalid(
            "/dev/fuse is missing: load the fuse module or pass the device into the container",
        ));
    }
    if !crate::sys::has_cap_sys_admin() {
        if let Some(opt) = [(cfg.dev, "dev"), (cfg.suid, "suid")]
            .iter()
            .find_map(|(asked, name)| asked.then_some(*name))
        {
            // fusermount3 (and the kernel, for a mount in a user namespace) make a user's
            // FUSE mount nodev,nosuid whatever it asks: say so instead of ignoring it.
            return Err(Error::invalid(format!(
                "option {opt}: a user's FUSE mount is always nodev,nosuid (fusermount3's rule, \
                 fuse(8)); mount as root for device nodes or set-id programs, or leave it out"
            )));
        }
        let user = fusermount::UserMount {
            allow_other: cfg.allow_other,
            read_only: cfg.read_only,
        };
        fusermount::check_user_mount(mountpoint, user)?;
    } else if !crate::sys::in_initial_user_ns() {
        fusermount::check_dev_fuse(rustix::process::getuid().as_raw())?;
    }
    if is_mountpoint_busy(mountpoint)? {
        return Err(Error::invalid(format!(
            "mountpoint {} is busy: a layercache/FUSE filesystem is already mounted there",
            mountpoint.display()
        )));
    }
    if cfg.read_only {
        // Nothing is written: no workdir to probe.
        return Ok(());
    }
    stack::probe_upper(&cfg.upperdir, &cfg.workdir)
}

/// How long [`unmount`] lets a daemon end by itself before it sends
/// [`EXIT_NOW`](super::daemon::EXIT_NOW).
const EXIT_GRACE: Duration = Duration::from_millis(200);

/// True when a FUSE filesystem is mounted exactly at `mountpoint` (per /proc/self/mountinfo).
///
/// Errors: [`Error::Io`] if mountinfo cannot be read.
pub fn is_mountpoint_busy(mountpoint: &Path) -> Result<bool> {
    Ok(fuse_mount_at(mountpoint)?.is_some())
}

/// The FUSE mount exactly at `mountpoint` (canonicalised), if any.
///
/// Errors: [`Error::Io`] if /proc/self/mountinfo cannot be read.
fn fuse_mount_at(mountpoint: &Path) -> Result<Option<crate::sys::MountEntry>> {
    let canon = std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let mounts = crate::sys::mounts().at("/proc/self/mountinfo")?;
    Ok(mounts.into_iter().find(|m| {
        (m.fs_type == "fuse" || m.fs_type.starts_with("fuse.")) && m.mount_point == canon
    }))
}

/// `mount -o remount,…` of a layercache mount, which mount(8) hands to mount.fuse3 and so to
/// `layercache overlay -o …,remount,… MNT`: remounts the FUSE filesystem at `mountpoint` with
/// mount(2) `MS_REMOUNT | flags` (read-only or writable, and its per-mount flags), as the kernel
/// does for any filesystem; the daemon is not involved (a read-only configuration still answers
/// EROFS after a remount,rw).
///
/// Errors: [`Error::Invalid`] when no FUSE filesystem is mounted there, or naming the mount(2)
/// errno.
pub(super) fn remount(mountpoint: &Path, flags: rustix::mount::MountFlags) -> Result<()> {
    if fuse_mount_at(mountpoint)?.is_none() {
        return Err(Error::invalid(format!(
            "remount {}: no layercache mount there",
            mountpoint.display()
        )));
    }
    crate::sys::cstr(mountpoint.as_os_str())
        .and_then(|target| {
            let flags = libc::MS_REMOUNT | libc::c_ulong::from(flags.bits());
            crate::sys::mount(None, &target, None, flags, None)
        })
        .map_err(|e| Error::invalid(format!("remount {}: {e}", mountpoint.display())))
}

/// The mount source layercache's own mounts carry: `layercache:<upperdir>`, so the upper dir
/// of a mount (and with it the store of a run) can be read from mountinfo.
const SOURCE_PREFIX: &str = "layercache:";

/// Unmounts the FUSE filesystem at `mountpoint` and waits (up to `wait`) for its daemon — the
/// given pid, or the `layercache overlay-daemon` serving that mountpoint — to exit, so the upper
/// dir is quiescent when this returns. The wait uses a pidfd: a daemon that has exited counts
/// as gone even before its parent reaps it. Returns whether the daemon is gone (true when no
/// daemon was found to wait for).
///
/// Errors: [`Error::Unmount`] (`EBUSY`) when files are still open on the mount (nothing is
/// changed then); [`Error::Invalid`] if no FUSE filesystem is mounted there.
pub fn unmount(mountpoint: &Path, daemon: Option<u32>, wait: Duration) -> Result<bool> {
    if !is_mountpoint_busy(mountpoint)? {
        return Err(Error::invalid(format!(
            "{}: no layercache mount there",
            mountpoint.display()
        )));
    }
    let canon = std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let daemon = daemon.or_else(|| daemon_of(&canon));
    let pidfd = daemon.and_then(|pid| Some((pid, crate::sys::pidfd_open(pid).ok()?)));
    // EBUSY can be transient (a file closed by another thread or a process exiting right now
    // is released a moment later), so retry briefly before reporting it.
    let busy_until = Instant::now() + Duration::from_secs(2);
    // A user's mount is unmounted by fusermount3 where umount2 is refused.
    let umount = || match rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::empty()) {
        Err(rustix::io::Errno::PERM) => fusermount::unmount(mountpoint, false),
        r => r.map_err(std::io::Error::from),
    };
    loop {
        match umount() {
            Ok(()) => break,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < busy_until => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                return Err(Error::Unmount {
                    mountpoint: mountpoint.to_path_buf(),
                    source: e,
                });
            }
        }
    }
    Ok(pidfd.is_none_or(|(pid, fd)| {
        // Usually gone within milliseconds; a copy of the mount in another namespace keeps it
        // serving, and nobody needs that copy any more.
        wait_pidfd(&fd, pid, EXIT_GRACE.min(wait)) || {
            let _ = rustix::process::pidfd_send_signal(&fd, rustix::process::Signal::USR1);
            wait_pidfd(&fd, pid, wait)
        }
    }))
}

/// The pid of the `layercache overlay-daemon` process serving `mountpoint` (canonical), if any:
/// the process whose command line is `… overlay-daemon … MOUNTPOINT`. Only the pid is read this
/// way (to wait for it after unmounting a mount nobody recorded); configuration never is.
fn daemon_of(mountpoint: &Path) -> Option<u32> {
    use std::os::unix::ffi::OsStrExt;
    let want = mountpoint.as_os_str().as_bytes();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).filter(|a| !a.is_empty()).collect();
        (args.get(1) == Some(&&b"overlay-daemon"[..]) && args.last() == Some(&want)).then_some(pid)
    })
}

/// The upper directory of the layercache mount at `mountpoint`, read from its mount source in
/// mountinfo (`layercache:<upperdir>`, see [`mount_fuse`]); `None` for any other mount (one made
/// by `mount -t fuse.layercache SOURCE …` through mount.fuse3 carries the user's source).
pub fn upperdir_of(mountpoint: &Path) -> Option<std::path::PathBuf> {
    let m = fuse_mount_at(mountpoint).ok()??;
    (m.fs_type == "fuse.layercache").then(|| {
        m.source
            .strip_prefix(SOURCE_PREFIX)
            .map(std::path::PathBuf::from)
    })?
}

/// Waits up to `timeout` for the process behind `pidfd` to exit; reaps it if it is our child.
/// Returns true once it has exited.
pub fn wait_pidfd(pidfd: &OwnedFd, pid: u32, timeout: std::time::Duration) -> bool {
    // poll is never restarted after a signal handler ran (a second Ctrl-C during `run`'s
    // teardown), so wait again for the time that is left.
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let ms = left.as_millis().min(i32::MAX as u128) as libc::c_int;
        let n = crate::sys::poll_one(pidfd.as_fd(), libc::POLLIN, ms);
        if n.as_ref().is_ok_and(|revents| *revents != 0) {
            // Reap it if it is our child (not ours: ECHILD, ignored).
            crate::sys::reap_nohang(pid);
            return true;
        }
        let interrupted = n.is_err_and(|e| e.kind() == std::io::ErrorKind::Interrupted);
        if !interrupted || left.is_zero() {
            return false;
        }
    }
}
