//! The processes of a run: setup, maintenance and COMMAND are spawned here, each in a process
//! group of its own (so SIGINT, SIGTERM and SIGHUP received meanwhile reach its whole tree, and
//! whatever it leaves behind is killed when it exits) and, with `--sandbox none`, in a mount
//! namespace of its own where the run's private mounts are bound at their view paths
//! ([`Views`]).

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::error::{Error, IoContext, Result};
use crate::sys;

/// The signal that asked the run to stop (0 = none).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Where forwarded signals go (0 = nowhere): the running child's pid, or minus its process
/// group id.
static CHILD_TARGET: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    STOP_SIGNAL.store(sig, Ordering::SeqCst);
    let target = CHILD_TARGET.load(Ordering::SeqCst);
    if target != 0 {
        // Async-signal-safe; the target is our own child or its group.
        let _ = sys::kill(target, sig);
    }
}

/// Catches SIGINT/SIGTERM/SIGHUP while alive (they are recorded and forwarded to the running
/// child, and the run unwinds: unmount, exit 128 + signal); restores the previous handlers on
/// drop.
pub(super) struct SignalGuard {
    old: Vec<(libc::c_int, sys::SavedAction)>,
}

impl SignalGuard {
    pub(super) fn install() -> Self {
        STOP_SIGNAL.store(0, Ordering::SeqCst);
        let mut old = Vec::new();
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: the handler only touches atomics and calls kill(2).
            if let Ok(prev) = unsafe { sys::catch_signal(sig, on_signal) } {
                old.push((sig, prev));
            }
        }
        SignalGuard { old }
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for (sig, prev) in self.old.drain(..) {
            let _ = sys::restore_signal(sig, &prev);
        }
    }
}

pub(super) fn stopped() -> Option<i32> {
    match STOP_SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Exit status like a shell reports it: the code, or 128 + signal number.
fn status_code(st: ExitStatus) -> i32 {
    st.code()
        .or_else(|| st.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// What a child's private mount namespace holds (`--sandbox none`): the workdir bound at its
/// view path, a tmpfs over the mount root (so nothing appears in the host's mount root), and
/// each cache's private mount bound at its view path.
#[derive(Debug, Clone, Default)]
pub struct Views {
    /// `(host workdir, view path)` when the workdir is seen at another path (`--workdir-view`).
    pub workdir: Option<(PathBuf, PathBuf)>,
    /// The mount root to cover with a private tmpfs, when a view lies below it.
    pub mount_root: Option<PathBuf>,
    /// `(private mount, view path)`, parents before children.
    pub binds: Vec<(PathBuf, PathBuf)>,
}

impl Views {
    /// True when there is nothing to set up (the child can run in the run's own namespace).
    pub fn is_empty(&self) -> bool {
        self.workdir.is_none() && self.mount_root.is_none() && self.binds.is_empty()
    }

    /// Makes `cmd` enter a new mount namespace (private propagation, so nothing leaks back to
    /// the host) and set the views up before it execs; with a workdir view it starts there.
    ///
    /// Errors: [`Error::Invalid`] for a path with a NUL byte.
    pub fn apply(&self, cmd: &mut Command) -> Result<()> {
        let c = |p: &Path| {
            CString::new(p.as_os_str().as_bytes())
                .map_err(|_| Error::invalid(format!("{}: path has a NUL byte", p.display())))
        };
        let workdir = match &self.workdir {
            Some((host, view)) => Some((c(host)?, c(view)?)),
            None => None,
        };
        let root = self.mount_root.as_deref().map(c).transpose()?;
        let binds = self
            .binds
            .iter()
            .map(|(s, d)| Ok((c(s)?, c(d)?)))
            .collect::<Result<Vec<_>>>()?;
        // A view below the mount root may lie deeper than its first level (`{mount_root}/a/b`):
        // its parents are made on the fresh tmpfs, one at a time, in a buffer the child
        // edits in place (a NUL at each '/' past the mount root's own path in turn).
        let mut parents: Vec<(Vec<u8>, usize)> = (self.binds.iter())
            .map(|(_, d)| {
                let below = (self.mount_root.as_deref())
                    .filter(|r| d.starts_with(r))
                    .map_or(usize::MAX, |r| r.as_os_str().len());
                let mut buf = d.as_os_str().as_bytes().to_vec();
                buf.push(0);
                (buf, below)
            })
            .collect();
        // Read by the child after unshare (no allocation may happen between fork and exec).
        let mut mountinfo = vec![0u8; MOUNTINFO_MAX];
        // SAFETY: between fork and exec only async-signal-safe system calls run (unshare,
        // mount, mkdir, chdir, through sys and rustix: no allocation) on strings prepared above.
        unsafe {
            cmd.pre_exec(move || {
                sys::unshare(libc::CLONE_NEWNS)?;
                sys::mount(
                    Some(c"none"),
                    c"/",
                    None,
                    libc::MS_REC | libc::MS_PRIVATE,
                    None,
                )?;
                let own: Vec<&[u8]> = binds.iter().map(|(src, _)| src.to_bytes()).collect();
                detach_other_layercache_mounts(&mut mountinfo, &own);
                if let Some((host, view)) = &workdir {
                    sys::mount(Some(host), view, None, libc::MS_BIND | libc::MS_REC, None)?;
                }
                if let Some(root) = &root {
                    sys::mount(
                        Some(c"layercache"),
                        root,
                        Some(c"tmpfs"),
                        libc::MS_NOSUID | libc::MS_NODEV,
                        Some(c"mode=755"),
                    )?;
                }
                for ((src, dst), (buf, below)) in binds.iter().zip(parents.iter_mut()) {
                    make_parents(buf, *below)?;
                    match rustix::fs::mkdir(dst.as_c_str(), rustix::fs::Mode::from_raw_mode(0o755))
                    {
                        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                    // Resolved once, into a descriptor, and mounted through it: a view path
                    // swapped for a symlink after it was checked is refused (ENOTDIR), and the
                    // mount lands on exactly the directory opened.
                    let fd = open_view(dst)?;
                    let mut at = [0u8; FD_PATH_MAX];
                    let target = fd_path(fd.as_raw_fd(), &mut at);
                    sys::mount(Some(src), target, None, libc::MS_BIND, None)?;
                    drop(fd);
                }
                if let Some((_, view)) = &workdir {
                    rustix::process::chdir(view.as_c_str())?;
                }
                Ok(())
            });
        }
        Ok(())
    }
}

/// Makes the missing parent directories (mode 0755) of the NUL-terminated path in `buf` that
/// lie past its first `below` bytes (the mount root's path, covered by the step's tmpfs; none
/// when `below` is past the path). Runs between fork and exec: mkdir(2) only, on `buf`
/// edited in place and restored.
///
/// Errors: the mkdir(2) errno other than `EEXIST`.
fn make_parents(buf: &mut [u8], below: usize) -> std::io::Result<()> {
    let len = buf.len().saturating_sub(1);
    for i in (below.saturating_add(1))..len {
        if buf[i] != b'/' {
            continue;
        }
        buf[i] = 0;
        let r = match CStr::from_bytes_until_nul(buf) {
            Ok(p) => rustix::fs::mkdir(p, rustix::fs::Mode::from_raw_mode(0o755)),
            Err(_) => Ok(()),
        };
        buf[i] = b'/';
        match r {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Opens view path `dst` as an `O_PATH` directory descriptor, never through a symlink as its
/// last component (`O_NOFOLLOW | O_DIRECTORY`: a symlink there fails with `ENOTDIR`), for a
/// mount through [`fd_path`] (the way runc mounts onto a target it has resolved). Runs
/// between fork and exec: open(2) only; the descriptor closes when dropped.
///
/// Errors: the open(2) errno (`ENOTDIR` for a symlink or a file, `ENOENT`).
fn open_view(dst: &CStr) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(rustix::fs::open(dst, flags, Mode::empty())?)
}

/// Room for `/proc/self/fd/<i32>` and its NUL.
const FD_PATH_MAX: usize = 32;

/// `/proc/self/fd/<fd>` written into `buf`, NUL-terminated, without allocating (it runs
/// between fork and exec): mount(2) onto it mounts onto the directory `fd` refers to.
fn fd_path(fd: libc::c_int, buf: &mut [u8; FD_PATH_MAX]) -> &CStr {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    buf[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 10];
    let (mut n, mut len) = (fd.max(0) as u32, 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[PREFIX.len() + i] = digits[len - 1 - i];
    }
    buf[PREFIX.len() + len] = 0;
    CStr::from_bytes_until_nul(&buf[..]).unwrap_or(c"/proc/self/fd/")
}

/// Bytes of /proc/self/mountinfo a child reads (a machine with more mounts than fit keeps the
/// copies past this point; see [`detach_other_layercache_mounts`]).
const MOUNTINFO_MAX: usize = 1 << 20;

/// In a child's fresh mount namespace: lazily unmounts the copies of every `fuse.layercache`
/// mount except the run's own (`own`, their mount points). unshare(2) copies all mounts, other
/// runs' included, and with private propagation their later unmounts on the host never reach
/// the copies, which would keep those FUSE connections (and daemons) alive as long as this
/// child lives. The daemons end such stray copies too (overlay's `EXIT_NOW`); this avoids the
/// wait.
///
/// Runs between fork and exec: only read(2), umount2(2) and in-place parsing of `buf`.
fn detach_other_layercache_mounts(buf: &mut [u8], own: &[&[u8]]) {
    use rustix::fs::{Mode, OFlags};
    let Ok(fd) = rustix::fs::open(
        c"/proc/self/mountinfo",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return;
    };
    let mut n = 0;
    while n < buf.len() {
        match rustix::io::read(&fd, &mut buf[n..]) {
            Ok(r) if r > 0 => n += r,
            _ => break,
        }
    }
    drop(fd);
    let mut start = 0;
    while start < n {
        let end = buf[start..n]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(n, |i| start + i);
        if let Some(mp_len) = layercache_mount_point(&mut buf[start..end], own) {
            // `layercache_mount_point` NUL-terminated the mount point in place.
            if let Ok(mp) = std::ffi::CStr::from_bytes_until_nul(&buf[start..end]) {
                let _ = rustix::mount::unmount(mp, rustix::mount::UnmountFlags::DETACH);
            }
            let _ = mp_len;
        }
        start = end + 1;
    }
}

/// For a mountinfo line of a `fuse.layercache` mount that is not in `own`: moves its decoded,
/// NUL-terminated mount point to the start of `line` and returns its length.
fn layercache_mount_point(line: &mut [u8], own: &[&[u8]]) -> Option<usize> {
    let sep = line.windows(3).position(|w| w == b" - ")?;
    let fstype = line[sep + 3..].split(|b| *b == b' ').next()?;
    if fstype != b"fuse.layercache" {
        return None;
    }
    // Field 5 (index 4) is the mount point.
    let mut field = 0;
    let mut at = 0;
    while field < 4 {
        at += line[at..sep].iter().position(|b| *b == b' ')? + 1;
        field += 1;
    }
    let len = line[at..sep].iter().position(|b| *b == b' ')?;
    // Decode \ooo escapes, writing to the start of the line.
    let (mut r, mut w) = (at, 0);
    while r < at + len {
        let b = line[r];
        if b == b'\\'
            && r + 3 < at + len
            && line[r + 1..r + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            line[w] = (line[r + 1] - b'0') * 64 + (line[r + 2] - b'0') * 8 + (line[r + 3] - b'0');
            r += 4;
        } else {
            line[w] = b;
            r += 1;
        }
        w += 1;
    }
    if own.contains(&&line[..w]) || w >= line.len() {
        return None;
    }
    line[w] = 0;
    Some(w)
}

/// Spawns `cmd` as the current child and waits; signals received meanwhile are forwarded.
/// With `group`, the child leads a process group of its own: signals go to the whole group and
/// whatever of it is left when the child exits is killed (SIGKILL), so no process of a script
/// outlives it. The child is killed if layercache dies (`PR_SET_PDEATHSIG`). With `init`, `cmd`
/// runs under the init of a PID namespace ([`super::pidns::isolate`] was applied): signals go
/// to that child alone, whose init passes them on.
pub(super) fn run_child(mut cmd: Command, what: &str, group: bool, init: bool) -> Result<i32> {
    if group {
        cmd.process_group(0);
    }
    // SAFETY: between fork and exec only `sys::forked::set_parent_death_signal` (prctl(2)),
    // async-signal-safe, runs.
    unsafe {
        cmd.pre_exec(|| {
            let _ = sys::forked::set_parent_death_signal(libc::SIGKILL);
            Ok(())
        });
    }
    // glibc's posix_spawn (used by std, and by whatever started us) sets glibc's internal
    // signals 32 and 33 (SIGCANCEL, SIGSETXID) to SIG_IGN in the child, and SIG_IGN survives
    // exec: COMMAND would start with two real-time signals ignored (a Go or musl program sees
    // that). With a pre_exec hook std forks instead, and the hook resets both to SIG_DFL —
    // through the raw system call, since glibc's sigaction refuses its internal signals.
    // SAFETY: between fork and exec only `sys::forked::default_signal` (rt_sigaction(2)),
    // async-signal-safe, runs.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [32, 33] {
                let _ = sys::forked::default_signal(sig);
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => 127,
                std::io::ErrorKind::PermissionDenied => 126,
                _ => 1,
            };
            eprintln!("layercache: {what}: {e}");
            return Ok(code);
        }
    };
    let pid = child.id() as i32;
    let target = if group && !init { -pid } else { pid };
    CHILD_TARGET.store(target, Ordering::SeqCst);
    if let Some(sig) = stopped() {
        // Our own child (or its group).
        let _ = sys::kill(target, sig);
    }
    let status = child.wait();
    CHILD_TARGET.store(0, Ordering::SeqCst);
    if group {
        // What the script left running (a daemon it started, `sleep` in the background): the
        // process group our child led.
        let _ = sys::kill(-pid, libc::SIGKILL);
    }
    Ok(status_code(status.at(what)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_is_opened_once_never_through_a_symlink_and_named_by_its_fd() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, d.path().join("link")).unwrap();
        let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).unwrap();
        let fd = open_view(&c(&real)).unwrap();
        let mut buf = [0u8; FD_PATH_MAX];
        let p = fd_path(fd.as_raw_fd(), &mut buf);
        assert_eq!(
            p.to_str().unwrap(),
            format!("/proc/self/fd/{}", fd.as_raw_fd())
        );
        let target = std::fs::read_link(p.to_str().unwrap()).unwrap();
        assert_eq!(target, std::fs::canonicalize(&real).unwrap());
        drop(fd);
        let e = open_view(&c(&d.path().join("link"))).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR), "{e}");
        let mut big = [0u8; FD_PATH_MAX];
        assert_eq!(
            fd_path(i32::MAX, &mut big).to_str().unwrap(),
            "/proc/self/fd/2147483647"
        );
        assert_eq!(fd_path(0, &mut big).to_str().unwrap(), "/proc/self/fd/0");
    }

    /// As root: a view bound through its descriptor shows the mount at the view path, and a
    /// view path that is a symlink (swapped after its check) is refused, nothing mounted where
    /// it leads. The child's namespace is private: a wrong mount cannot reach the host.
    #[test]
    fn a_view_swapped_for_a_symlink_is_not_mounted_through() {
        if !rustix::process::geteuid().is_root() {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let (src, view, elsewhere) = (
            d.path().join("src"),
            d.path().join("view"),
            d.path().join("elsewhere"),
        );
        for p in [&src, &view, &elsewhere] {
            std::fs::create_dir(p).unwrap();
        }
        std::fs::write(src.join("marker"), b"x").unwrap();
        let ls = |dst: &Path, look: &Path| {
            let views = Views {
                binds: vec![(src.clone(), dst.to_path_buf())],
                ..Views::default()
            };
            let mut cmd = Command::new("ls");
            cmd.arg(look);
            views.apply(&mut cmd).unwrap();
            cmd.output()
        };
        let out = ls(&view, &view).unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "marker\n");
        std::fs::remove_dir(&view).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &view).unwrap();
        let e = ls(&view, &elsewhere).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR), "{e}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }

    #[test]
    fn finds_other_layercache_mounts_in_mountinfo_lines() {
        let mut line =
            b"36 35 0:40 / /s/runs/a\\040b/mnt rw - fuse.layercache layercache:/u rw".to_vec();
        let n = layercache_mount_point(&mut line, &[]).unwrap();
        assert_eq!(&line[..n], b"/s/runs/a b/mnt");
        assert_eq!(line[n], 0);
        let mut own = b"36 35 0:40 / /s/mine rw - fuse.layercache layercache:/u rw".to_vec();
        assert!(layercache_mount_point(&mut own, &[b"/s/mine"]).is_none());
        let mut other = b"36 35 0:40 / /x rw - ext4 /dev/sda rw".to_vec();
        assert!(layercache_mount_point(&mut other, &[]).is_none());
    }
}
