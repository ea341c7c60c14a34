//! Mounting without root: libfuse's setuid helper `fusermount3` (util/fusermount.c) makes the
//! mount for a user whose mount(2) is refused, as libfuse and fuser do, and hands the
//! /dev/fuse descriptor back over the socket named by `_FUSE_COMMFD` (one `SCM_RIGHTS`
//! message). `fusermount3 -u` unmounts a user's own mount where umount(2) is refused.
//!
//! What a user mount needs is checked here before anything is mounted ([`check_user_mount`]),
//! each failure one line (exit 2): the helper present and setuid root (Debian's `fuse3`),
//! /dev/fuse readable and writable by the user (fusermount3 opens it with the user's
//! filesystem ids), a mountpoint the user owns (or may write and is not sticky: fusermount3's
//! rule), `allow_other` only with `user_allow_other` in /etc/fuse.conf, and no passthrough.
//!
//! Root of a user namespace that owns its mount namespace mounts FUSE with mount(2) itself
//! (Linux ≥ 4.18, `FS_USERNS_MOUNT`); nothing here is used then.

use std::ffi::OsStr;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Error, Result};

/// The helper's name (libfuse 3).
const HELPER: &str = "fusermount3";
/// Where fusermount3 reads `user_allow_other` and `mount_max`.
pub const FUSE_CONF: &str = "/etc/fuse.conf";
/// The environment variable naming the socket fusermount3 sends the descriptor on.
const COMMFD_ENV: &str = "_FUSE_COMMFD";

/// The `fusermount3` executable: the first in `PATH`, else in `/usr/bin` or `/bin` (mount(8)
/// runs helpers with a reduced `PATH`). `None` when there is none.
pub fn find_helper() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .map(|d| d.join(HELPER))
        .find(|p| p.metadata().is_ok_and(|m| m.is_file()))
}

/// Whether /etc/fuse.conf (`conf`) has a `user_allow_other` line (fuse.conf(5): the option
/// alone on a line; `#` starts a comment).
pub fn user_allow_other(conf: &Path) -> bool {
    std::fs::read_to_string(conf).is_ok_and(|t| t.lines().any(|l| l.trim() == "user_allow_other"))
}

/// What a user mount will ask fusermount3 for.
#[derive(Clone, Copy, Debug, Default)]
pub struct UserMount {
    /// `allow_other` was asked for.
    pub allow_other: bool,
    /// A read-only mount (`-o ro`, or a lowerdir-only overlay): fusermount3 is passed `ro`.
    pub read_only: bool,
}

/// Checks, before anything is mounted, that a user (not root) can mount at `mountpoint`
/// through fusermount3, and returns the helper.
///
/// Errors: [`Error::Invalid`] (exit 2), one line naming what is missing: no fusermount3 (Debian's
/// `fuse3`), a helper that is not setuid root, /dev/fuse missing or not readable and writable
/// by this user, a mountpoint this user neither owns nor may write (or a sticky one of another
/// user), `allow_other` without `user_allow_other` in [`FUSE_CONF`].
pub fn check_user_mount(mountpoint: &Path, want: UserMount) -> Result<PathBuf> {
    let uid = rustix::process::getuid().as_raw();
    let helper = find_helper().ok_or_else(|| {
        Error::invalid(format!(
            "{HELPER} is missing: mounting as a user (uid {uid}) needs it (Debian: apt-get install fuse3)"
        ))
    })?;
    let m = helper
        .metadata()
        .map_err(|e| Error::invalid(format!("{}: {e}", helper.display())))?;
    if m.uid() != 0 || m.mode() & libc::S_ISUID == 0 {
        return Err(Error::invalid(format!(
            "{} is not setuid root (mode {:o}, owner {}): a user mount needs it installed as the fuse3 package does",
            helper.display(),
            m.mode() & 0o7777,
            m.uid()
        )));
    }
    check_dev_fuse(uid)?;
    check_mountpoint(mountpoint, uid)?;
    if want.allow_other && !user_allow_other(Path::new(FUSE_CONF)) {
        return Err(Error::invalid(format!(
            "option allow_other: {FUSE_CONF} has no user_allow_other line, so a user's mount cannot admit other users (add the line as root, or mount without allow_other)"
        )));
    }
    Ok(helper)
}

/// /dev/fuse must be readable and writable by `uid`: fusermount3 opens it with the user's
/// filesystem ids (and a user namespace's root is that user outside).
///
/// Errors: [`Error::Invalid`] naming the device, its mode and owner.
pub fn check_dev_fuse(uid: u32) -> Result<()> {
    let dev = Path::new("/dev/fuse");
    let m = dev.metadata().map_err(|e| {
        Error::invalid(format!(
            "/dev/fuse: {e}: load the fuse module or pass the device into the container"
        ))
    })?;
    // access(2) checks with the real ids, as fusermount3's open does.
    use rustix::fs::Access;
    if rustix::fs::access(dev, Access::READ_OK | Access::WRITE_OK).is_err() {
        return Err(Error::invalid(format!(
            "/dev/fuse is not readable and writable by uid {uid} (mode {:o}, owner {}): a mount without root needs mode 0666, as udev's default rule sets it",
            m.permissions().mode() & 0o777,
            m.uid()
        )));
    }
    Ok(())
}

/// fusermount3's mountpoint rule for a user: a directory the user owns, or one it may write
/// that is not sticky.
///
/// Errors: [`Error::Invalid`] naming the mountpoint and its owner.
fn check_mountpoint(mountpoint: &Path, uid: u32) -> Result<()> {
    let m = mountpoint
        .metadata()
        .map_err(|e| Error::invalid(format!("mountpoint {}: {e}", mountpoint.display())))?;
    if m.uid() == uid {
        return Ok(());
    }
    let writable = rustix::fs::access(mountpoint, rustix::fs::Access::WRITE_OK).is_ok();
    if writable && m.mode() & libc::S_ISVTX == 0 {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "mountpoint {} belongs to uid {}: as uid {uid} mount on a directory you own",
        mountpoint.display(),
        m.uid()
    )))
}

/// `s` with `,` and `\` escaped by a backslash, as fusermount3 (≥ 3.10) reads `fsname=`.
fn escape_opt(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    for &b in s {
        if b == b',' || b == b'\\' {
            out.push(b'\\');
        }
        out.push(b);
    }
    out
}

/// Mounts a FUSE filesystem of type `fuse.layercache` with source `fsname` at `mountpoint`
/// through `helper` (fusermount3), with `default_permissions` and, when `want.allow_other`,
/// `allow_other`; fusermount3 adds `nosuid,nodev` for a user. Returns the /dev/fuse
/// descriptor it passes back.
///
/// Errors: [`Error::Invalid`] with fusermount3's own one-line reason (a mountpoint it
/// refuses, `mount_max` reached…); [`Error::Io`] if the helper cannot be run.
pub fn mount(helper: &Path, mountpoint: &Path, fsname: &OsStr, want: UserMount) -> Result<OwnedFd> {
    let mut opts = b"fsname=".to_vec();
    opts.extend(escape_opt(fsname.as_bytes()));
    opts.extend_from_slice(b",subtype=layercache,default_permissions");
    if want.allow_other {
        opts.extend_from_slice(b",allow_other");
    }
    if want.read_only {
        opts.extend_from_slice(b",ro");
    }
    let (ours, theirs) =
        std::os::unix::net::UnixStream::pair().map_err(|e| Error::io(helper, e))?;
    let their_fd = theirs.as_raw_fd();
    let mut cmd = Command::new(helper);
    cmd.arg("-o")
        .arg(OsStr::from_bytes(&opts))
        .arg("--")
        .arg(mountpoint)
        .env(COMMFD_ENV, their_fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: only fcntl (async-signal-safe) runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let _ = crate::sys::set_inheritable(their_fd, true);
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| Error::io(helper, e))?;
    drop(cmd);
    drop(theirs);
    let fd = crate::sys::recv_fd(ours.as_fd());
    drop(ours);
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let status = child.wait().map_err(|e| Error::io(helper, e))?;
    match fd {
        Ok(fd) if status.success() => Ok(fd),
        Ok(_) | Err(_) => {
            let why = err.lines().next().unwrap_or("").trim();
            let why = why.strip_prefix("fusermount3: ").unwrap_or(why);
            Err(Error::invalid(format!(
                "mount {}: {HELPER} failed ({status}){}{why}",
                mountpoint.display(),
                if why.is_empty() { "" } else { ": " }
            )))
        }
    }
}

/// Unmounts the user's FUSE mount at `mountpoint` with `fusermount3 -u` (`-z`: lazily, for
/// a mount that may still be busy), for when umount2(2) is refused (`EPERM`).
///
/// Errors: `EBUSY` when fusermount3 says the mount is busy; `ENOENT` without fusermount3;
/// `EPERM` for any other refusal (another user's mount, not a mount).
pub fn unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    let helper = find_helper().ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
    let mut cmd = Command::new(helper);
    cmd.arg("-u").arg("-q");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd
        .arg("--")
        .arg(mountpoint)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    tracing::debug!("{HELPER} -u {}: {}", mountpoint.display(), err.trim());
    Err(io::Error::from_raw_os_error(
        if err.contains("Device or resource busy") {
            libc::EBUSY
        } else {
            libc::EPERM
        },
    ))
}

/// Lazily detaches the mount at `mountpoint`: umount2(`MNT_DETACH`), or `fusermount3 -u -z`
/// where that is refused (a user's mount). What the daemon does when it is told to stop or its
/// owner is gone, and the last resort of a failed mount.
///
/// Errors: the `umount2` errno, or as [`unmount`] when that was `EPERM`.
pub fn detach(mountpoint: &Path) -> io::Result<()> {
    match rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::DETACH) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::PERM) => unmount(mountpoint, true),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fsname_escapes_commas_and_backslashes() {
        assert_eq!(escape_opt(b"layercache:/a,b\\c"), b"layercache:/a\\,b\\\\c");
        assert_eq!(escape_opt(b"plain"), b"plain");
    }

    #[test]
    fn user_allow_other_wants_the_line_alone() {
        let d = tempfile::tempdir().unwrap();
        let conf = d.path().join("fuse.conf");
        assert!(!user_allow_other(&conf));
        std::fs::write(
            &conf,
            "# user_allow_other\n#user_allow_other\nmount_max = 9\n",
        )
        .unwrap();
        assert!(!user_allow_other(&conf));
        std::fs::write(&conf, "mount_max = 9\n  user_allow_other \n").unwrap();
        assert!(user_allow_other(&conf));
    }

    #[test]
    fn a_descriptor_passed_over_a_socket_is_received() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let f = tempfile::tempfile().unwrap();
        let fd = f.as_raw_fd();
        let mut byte = [0u8; 1];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut cbuf = [0u64; 8];
        // SAFETY: a test building one SCM_RIGHTS message with valid buffers.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(4) as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(4) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<std::os::fd::RawFd>(), fd);
            assert_eq!(libc::sendmsg(a.as_raw_fd(), &msg, 0), 1);
        }
        let got = crate::sys::recv_fd(b.as_fd()).unwrap();
        let same = |x: &dyn AsRawFd| crate::sys::fstat(&x.as_raw_fd()).unwrap().st_ino;
        assert_eq!(same(&got), same(&f));
        drop(a);
        assert_eq!(
            crate::sys::recv_fd(b.as_fd()).unwrap_err().raw_os_error(),
            Some(libc::ENODATA)
        );
    }
}
