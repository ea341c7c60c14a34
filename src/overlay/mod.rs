//! The FUSE copy-on-write overlay: a merged view of read-only lower directories and one
//! writable upper directory with kernel-overlayfs semantics (Documentation/filesystems/
//! overlayfs.rst), plus directory renames of lower directories (no EXDEV).
//!
//! This module knows nothing about keys or the store. Entry points:
//! * [`cli_overlay`] — `layercache overlay -o … MOUNTPOINT [-f]`;
//! * [`mount_daemon`] — mount and fork a serving daemon, return once the mount is ready;
//! * [`unmount`] — unmount a mountpoint and wait for its daemon to finish.
//!
//! Without root, mounts go through `fusermount3` (see [`fusermount`]); root of a user
//! namespace mounts with mount(2) like root. Only what needs `CAP_SYS_ADMIN` in the initial
//! user namespace (passthrough, the `enable_uring` and readahead knobs in sysfs, `trusted.*`
//! xattrs) checks for it ([`crate::sys::init_ns_admin`]) and falls back silently, except an
//! explicit `-o passthrough`, which is refused.

mod copy_up;
mod dir;
pub mod errno;
mod fs;
pub mod fusermount;
mod handlers;
mod inode;
pub mod links;
mod ops;
pub mod options;
mod passthrough;
mod privs;
mod ring;
pub mod stack;
pub mod whiteout;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

pub use options::OverlayConfig;

use crate::error::{Error, IoContext, Result};

/// Worker threads reading FUSE requests from /dev/fuse (each with its own cloned fd); the
/// environment variable `LAYERCACHE_THREADS` (1..=64) overrides it for tuning. With FUSE over
/// io_uring they only see FORGET and INTERRUPT (and requests sent before the rings are up).
const THREADS: usize = 4;

/// Threads (= ring entries) per CPU request queue when the kernel serves FUSE over io_uring
/// (see vendor/fuser/src/uring.rs). A request waits while every entry of its CPU's queue is
/// busy, so this is how many slow requests (copy-ups of big files) one CPU can have in flight
/// before its quick ones queue behind them. Idle threads sleep; each has a 1 MiB payload buffer
/// that is touched only by large requests.
const URING_THREADS_PER_CPU: usize = 4;

/// Path of the `fuse` module parameter that lets FUSE servers use io_uring (Linux 6.14+).
const FUSE_ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// `Some(threads per CPU queue)` unless `LAYERCACHE_URING=0` asks for the /dev/fuse read loop.
fn uring_threads() -> Option<usize> {
    match std::env::var("LAYERCACHE_URING").as_deref() {
        Ok("0") | Ok("off") | Ok("no") => None,
        _ => Some(URING_THREADS_PER_CPU),
    }
}

/// Sets the fuse module's `enable_uring` parameter to Y when it is N and we are root (of the
/// initial user namespace: sysfs refuses root of any other). The
/// parameter only permits FUSE servers to opt in to io_uring during INIT; servers that do not
/// ask keep using /dev/fuse. Best effort: if it cannot be set, the kernel simply does not offer
/// io_uring and the session serves requests through /dev/fuse.
fn allow_fuse_uring() {
    let Ok(v) = std::fs::read_to_string(FUSE_ENABLE_URING) else {
        return; // kernel without CONFIG_FUSE_IO_URING
    };
    if v.trim() == "Y" || !crate::sys::init_ns_admin() {
        return;
    }
    match std::fs::write(FUSE_ENABLE_URING, "Y") {
        Ok(()) => tracing::debug!("{FUSE_ENABLE_URING} set to Y"),
        Err(e) => tracing::debug!("{FUSE_ENABLE_URING}: {e}; serving through /dev/fuse"),
    }
}

/// Readahead window of a layercache mount, in KiB (2 MiB): a sequential reader then gets 1 MiB
/// FUSE READs (the mount's max_pages is 256) instead of 128 KiB ones, an eighth of the round
/// trips, two of them in flight per window so the daemon's threads overlap the reader (spread
/// threads, see `ring.rs`). Larger windows gained little for a first pass and looked slower for
/// a cold read, where more concurrent READs interleave on the lower file; the measurements are
/// in benches/results/2026-11-29-bench-quick-seqread-bc09e50.md.
const READ_AHEAD_KB: u64 = 2048;

/// Raises the readahead window of the FUSE mount at `mountpoint` to [`READ_AHEAD_KB`]. The
/// window belongs to the mount's own backing device info (`/sys/class/bdi/MAJOR:MINOR`, named
/// after the mount's anonymous device), so no other filesystem is affected. The kernel starts
/// every FUSE mount at the default 128 KiB and INIT's `max_readahead` can only lower that
/// (fs/fuse/inode.c `process_init_reply`), hence sysfs. Best effort: without root, or with
/// sysfs read-only, the mount keeps 128 KiB.
///
/// Sends no request to the mount (`AT_STATX_DONT_SYNC`), so it is safe before requests are
/// served.
fn raise_read_ahead(mountpoint: &Path) {
    let Ok(path) = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: statx is plain data; the call writes at most its size.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `stx` is a valid statx buffer.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_STATX_DONT_SYNC | libc::AT_NO_AUTOMOUNT,
            0,
            &mut stx,
        )
    };
    if r != 0 {
        return;
    }
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

fn threads() -> usize {
    std::env::var("LAYERCACHE_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| (1..=64).contains(n))
        .unwrap_or(THREADS)
}

/// `layercache overlay -o OPTIONS MOUNTPOINT [-f]`: parse and validate the options, mount, and
/// either serve in the foreground (`-f`) or return once the mount is ready.
///
/// Errors: [`Error::Invalid`] (exit 2) for bad options, directories or mountpoint, a missing
/// `/dev/fuse`, `-o passthrough` without privilege, or what a user's mount lacks
/// ([`fusermount::check_user_mount`]); nothing is mounted then.
pub fn cli_overlay(options: &[String], mountpoint: &Path, foreground: bool) -> Result<i32> {
    if let Some(flags) = options::remount_flags(options) {
        remount(mountpoint, flags)?;
        return Ok(0);
    }
    let asked = |want: &str| options.iter().flat_map(|o| o.split(',')).any(|o| o == want);
    if asked("passthrough") && !crate::sys::init_ns_admin() {
        return Err(Error::invalid(
            "option passthrough: FUSE passthrough needs root (CAP_SYS_ADMIN in the initial user \
             namespace, the kernel's rule for backing files); mount without it",
        ));
    }
    let raw = options::parse(options)?;
    let mut cfg = options::validate(&raw, mountpoint)?;
    cfg.allow_other = options::asks_allow_other(options);
    if foreground {
        mount_foreground(&cfg, mountpoint, None)?;
    } else {
        mount_daemon(&cfg, mountpoint, Vec::new(), None)?;
    }
    Ok(0)
}

/// The hidden `overlay-daemon` subcommand run by [`mount_daemon`]: read the [`OverlayConfig`]
/// (JSON) from descriptor `config_fd` (a memfd), mount it, report readiness on `ready_fd`, then
/// serve until unmounted. When the mount cannot be made, a [`DaemonFailure`] goes to
/// `ready_fd` instead of the ready byte, so the caller learns the error's class (bad input or
/// failure) and message without parsing the daemon's stderr.
///
/// Errors: as [`mount_foreground`]; a malformed config is [`Error::Invalid`].
pub fn cli_daemon(
    config_fd: i32,
    ready_fd: i32,
    owner: Option<u32>,
    mountpoint: &Path,
) -> Result<i32> {
    // Shown by ps/pgrep/pidof as "layercache" rather than "exe" (it runs /proc/self/exe).
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"layercache".as_ptr()) };
    // SAFETY: the parent passed these descriptors (a memfd and the write end of a pipe) for us
    // to own.
    let (config, ready) = unsafe {
        (
            OwnedFd::from_raw_fd(config_fd),
            OwnedFd::from_raw_fd(ready_fd),
        )
    };
    let report = ready.try_clone().ok();
    if let Some(owner) = owner {
        end_with_owner(owner, mountpoint)?;
    }
    let res =
        read_daemon_config(config).and_then(|cfg| mount_foreground(&cfg, mountpoint, Some(ready)));
    if let (Err(e), Some(report)) = (&res, report) {
        let failure = DaemonFailure {
            exit: e.exit_code(),
            message: e.to_string(),
        };
        let mut f = std::fs::File::from(report);
        let body = serde_json::to_vec(&failure).unwrap_or_default();
        let _ = f.write_all(&[b"E".as_slice(), &body].concat());
    }
    res.map(|()| 0)
}

/// Ends the mount when process `owner` exits (even by `kill -9`): a thread waits on its pidfd,
/// then lazily unmounts `mountpoint` and exits the daemon, which closes /dev/fuse and so aborts
/// the connection for every bind of the mount in other mount namespaces too. An owner that is
/// already gone ends the daemon at once.
///
/// Errors: [`Error::Io`] if the thread cannot be started.
fn end_with_owner(owner: u32, mountpoint: &Path) -> Result<()> {
    let mnt = mountpoint.to_path_buf();
    let pidfd = crate::sys::pidfd_open(owner).ok();
    std::thread::Builder::new()
        .name("owner".into())
        .spawn(move || {
            if let Some(fd) = &pidfd {
                while !wait_pidfd(fd, owner, Duration::from_secs(3600)) {}
            }
            tracing::info!(owner, mountpoint = %mnt.display(), "owner gone: unmounting");
            let _ = fusermount::detach(&mnt);
            std::process::exit(0);
        })
        .map(drop)
        .at(mountpoint)
}

/// What a daemon that could not mount reports to [`mount_daemon`] on its ready pipe (after
/// the byte `E`; `1` alone means ready).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct DaemonFailure {
    /// The error's exit status: 2 bad input, 1 failure.
    pub exit: i32,
    /// The error message.
    pub message: String,
}

/// Reads the daemon's configuration from the memfd [`mount_daemon`] wrote it to.
///
/// Errors: [`Error::Invalid`] when it cannot be read or is not an [`OverlayConfig`].
fn read_daemon_config(fd: OwnedFd) -> Result<OverlayConfig> {
    let mut f = std::fs::File::from(fd);
    let mut text = Vec::new();
    f.read_to_end(&mut text)
        .map_err(|e| Error::invalid(format!("overlay-daemon --config-fd: {e}")))?;
    serde_json::from_slice(&text)
        .map_err(|e| Error::invalid(format!("overlay-daemon --config-fd: {e}")))
}

/// fuser settings: `threads()` /dev/fuse readers with cloned fds, and FUSE over io_uring with
/// `uring` threads per CPU queue when `Some`. (The session ACL is passed to
/// `Session::from_fd`, which ignores `Config::acl`.)
fn fuse_config(uring: Option<usize>) -> fuser::Config {
    let mut cfg = fuser::Config::default();
    cfg.n_threads = Some(threads());
    cfg.clone_fd = true;
    cfg.io_uring = uring;
    cfg.ring_hooks = Some(fuser::RingHooksRef(
        std::sync::Arc::new(ring::Policy::new()),
    ));
    cfg
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
fn mount_fuse(mountpoint: &Path, cfg: &OverlayConfig) -> Result<OwnedFd> {
    let mut source = std::ffi::OsString::from(SOURCE_PREFIX);
    source.push(mount_named(cfg));
    let user = fusermount::UserMount {
        allow_other: cfg.allow_other,
        read_only: cfg.read_only,
    };
    if crate::sys::has_cap_sys_admin() {
        match mount_direct(mountpoint, cfg) {
            Err(e) if e.1 == nix::errno::Errno::EPERM && fusermount::find_helper().is_some() => {
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
) -> std::result::Result<OwnedFd, (Error, nix::errno::Errno)> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| {
            let errno = nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO));
            (Error::invalid(format!("/dev/fuse: {e}")), errno)
        })?;
    let fd: OwnedFd = dev.into();
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let data = format!(
        "fd={},rootmode=40000,user_id={uid},group_id={gid},allow_other,default_permissions",
        fd.as_raw_fd()
    );
    let source = format!("{SOURCE_PREFIX}{}", mount_named(cfg).display());
    let mut flags = nix::mount::MsFlags::empty();
    if !cfg.suid {
        flags |= nix::mount::MsFlags::MS_NOSUID;
    }
    if !cfg.dev {
        flags |= nix::mount::MsFlags::MS_NODEV;
    }
    if cfg.read_only {
        flags |= nix::mount::MsFlags::MS_RDONLY;
    }
    nix::mount::mount(
        Some(source.as_str()),
        mountpoint,
        Some("fuse.layercache"),
        flags,
        Some(data.as_str()),
    )
    .map_err(|e| {
        let hint = if e == nix::errno::Errno::EPERM {
            " (mounting needs root, or fusermount3 from Debian's fuse3 for a user)"
        } else {
            ""
        };
        (
            Error::invalid(format!("mount {}: {e}{hint}", mountpoint.display())),
            e,
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
fn preflight(cfg: &OverlayConfig, mountpoint: &Path) -> Result<()> {
    if !Path::new("/dev/fuse").exists() {
        return Err(Error::invalid(
            "/dev/fuse is missing: load the fuse module or pass the device into the container",
        ));
    }
    if !crate::sys::has_cap_sys_admin() {
        let user = fusermount::UserMount {
            allow_other: cfg.allow_other,
            read_only: cfg.read_only,
        };
        fusermount::check_user_mount(mountpoint, user)?;
    } else if !crate::sys::in_initial_user_ns() {
        // SAFETY: getuid has no preconditions.
        fusermount::check_dev_fuse(unsafe { libc::getuid() })?;
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

/// Makes every thread allocate from one glibc heap arena. Nodes are allocated by whichever
/// request thread looks a name up; with an arena per thread the kernel's forgets leave each
/// arena's pages pinned by the few allocations still live in them, and RSS after a 1M-entry
/// walk was forgotten stayed at 33-45 MB of heap instead of 7 MB (scripts/node-rss.sh). The
/// daemon's allocations are small and short, so one arena costs no measurable walk time.
fn one_heap_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator parameters (before the request threads start).
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Mounts `cfg` at `mountpoint` and serves requests on this thread until unmounted. When
/// `ready` is given, one byte is written to it once the mount answers requests (after the FUSE
/// INIT handshake and, with FUSE over io_uring, once every ring entry is registered) and
/// standard I/O is then redirected to `LAYERCACHE_DAEMON_LOG` or /dev/null.
///
/// Errors: [`Error::Invalid`] when the mount cannot be made (see [`cli_overlay`]).
pub fn mount_foreground(
    cfg: &OverlayConfig,
    mountpoint: &Path,
    ready: Option<OwnedFd>,
) -> Result<()> {
    preflight(cfg, mountpoint)?;
    // SAFETY: umask has no preconditions; the daemon applies the kernel-provided modes as given.
    unsafe { libc::umask(0) };
    raise_nofile_limit();
    one_heap_arena();
    let fs = fs::OverlayFs::new(cfg)?;
    let uring = uring_threads();
    if uring.is_some() {
        allow_fuse_uring();
    }
    // A daemon whose starter died meanwhile (a `commit` killed while remounting) mounts
    // nothing: nobody would record or unmount that mount, and it would stack over the next one.
    if ready.as_ref().is_some_and(reader_gone) {
        return Err(Error::Failed(format!(
            "mount {}: the process that started this daemon is gone",
            mountpoint.display()
        )));
    }
    let fd = mount_fuse(mountpoint, cfg)?;
    // from_fd completes the INIT handshake before returning.
    let session = match fuser::Session::from_fd(fs, fd, fuser::SessionACL::All, fuse_config(uring))
    {
        Ok(s) => s,
        Err(e) => {
            let _ = fusermount::detach(mountpoint);
            return Err(Error::invalid(format!(
                "mount {}: {e}",
                mountpoint.display()
            )));
        }
    };
    unmount_on_signal(mountpoint)?;
    raise_read_ahead(mountpoint);
    // Ready once requests are served (with FUSE over io_uring: once every CPU queue has its
    // entries registered; the kernel holds requests until then).
    let served = std::cell::Cell::new(false);
    let res = session.run_notify(|| {
        served.set(true);
        if let Some(ready) = ready {
            let mut f = std::fs::File::from(ready);
            if f.write_all(b"1").is_err() {
                // EPIPE: the starter died between our check above and now, so this mount is
                // nobody's. It is the top one at `mountpoint` (mounted last); the session then
                // ends with ENODEV.
                let _ = nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH);
            }
            drop(f);
            redirect_stdio();
        }
    });
    if res.is_err() && !served.get() {
        // Setting up the session failed after mount(2) (out of fds for the request threads,
        // say): leave no dead mount behind for the caller, who is told the mount failed.
        let _ = fusermount::detach(mountpoint);
    }
    res.at(mountpoint)
}

/// True when nobody reads the pipe `w` writes to any more (`poll(2)` reports `POLLERR` on a
/// pipe's write end once its read end is closed): the process that started the daemon is gone.
fn reader_gone(w: &OwnedFd) -> bool {
    let mut pfd = libc::pollfd {
        fd: w.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n == 1 && pfd.revents & libc::POLLERR != 0
}

/// Makes SIGINT, SIGTERM and SIGHUP end the mount the way libfuse daemons do: a dedicated
/// thread waits for them (they are blocked in every other thread, which inherit the mask) and
/// lazily unmounts `mountpoint`; the session then sees ENODEV and `run` returns. Without this a
/// killed daemon leaves a dead mount ("Transport endpoint is not connected").
///
/// [`EXIT_NOW`] (SIGUSR1) is what [`unmount`] sends once the mount is unmounted here but the
/// daemon keeps serving: copies of the mount in other mount namespaces (a run's children copy
/// the host's mounts) keep the connection alive. The daemon then exits at once, which ends
/// those copies (ENOTCONN) too.
///
/// Errors: [`Error::Io`] if the signal mask cannot be set.
fn unmount_on_signal(mountpoint: &Path) -> Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, EXIT_NOW] {
        set.add(sig);
    }
    set.thread_block()
        .map_err(|e| Error::io(mountpoint, std::io::Error::from(e)))?;
    let mnt = mountpoint.to_path_buf();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Ok(sig) = set.wait() {
                tracing::info!(?sig, mountpoint = %mnt.display(), "signal: unmounting");
                let _ = fusermount::detach(&mnt);
                if sig == EXIT_NOW {
                    std::process::exit(0);
                }
            }
        })
        .map(drop)
        .at(mountpoint)
}

/// The signal that tells a daemon whose mount is gone here to exit now (see
/// [`unmount_on_signal`]).
const EXIT_NOW: nix::sys::signal::Signal = nix::sys::signal::Signal::SIGUSR1;

/// How long [`unmount`] lets a daemon end by itself before it sends [`EXIT_NOW`].
const EXIT_GRACE: Duration = Duration::from_millis(200);

/// Mounts `cfg` at `mountpoint` by starting this binary again as a daemon
/// (`layercache overlay-daemon --config-fd N --ready-fd N MOUNTPOINT`, in its own session), and
/// returns the daemon's pid once the mount answers requests. The configuration travels in a
/// memfd (not on the command line); the daemon reports readiness, or a [`DaemonFailure`], on a
/// pipe.
///
/// `hold` are descriptors (for example flock'ed lease files) the daemon keeps open for its whole
/// life, so locks on them last exactly as long as the mount. No other descriptor of the caller
/// reaches the daemon. With an `owner` pid, the mount ends when that process exits.
///
/// Errors: [`Error::Invalid`] or [`Error::Failed`] (the daemon's own class and message) when
/// the mount cannot be made (nothing is mounted then); [`Error::Io`] if the daemon cannot be
/// started.
pub fn mount_daemon(
    cfg: &OverlayConfig,
    mountpoint: &Path,
    hold: Vec<OwnedFd>,
    owner: Option<u32>,
) -> Result<u32> {
    use std::os::unix::process::CommandExt;
    // The daemon runs `preflight` itself (in mount_foreground) and reports its error here.
    let (mut ready_rd, ready_wr) = std::io::pipe().at("pipe")?;
    let (mut err_rd, err_wr) = std::io::pipe().at("pipe")?;
    // The running binary itself, even when its file was replaced or deleted since (a rebuild or
    // package upgrade while a run is in flight); current_exe() would name the deleted path.
    let exe = std::path::PathBuf::from("/proc/self/exe");
    let config = config_memfd(cfg)?;
    let ready_fd = ready_wr.as_raw_fd();
    let config_fd = config.as_raw_fd();
    let mut keep: Vec<i32> = hold.iter().map(|f| f.as_raw_fd()).collect();
    keep.extend([ready_fd, config_fd]);
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("overlay-daemon")
        .arg("--config-fd")
        .arg(config_fd.to_string())
        .arg("--ready-fd")
        .arg(ready_fd.to_string());
    if let Some(owner) = owner {
        cmd.arg("--owner-pid").arg(owner.to_string());
    }
    cmd.arg(mountpoint)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(err_wr);
    // SAFETY: only async-signal-safe calls (setsid, close_range, fcntl) run between fork and
    // exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            // Descriptors the caller left inheritable (a shell's `9>lock` held with flock, say)
            // must not live on in the daemon until unmount: mark everything above stderr
            // close-on-exec (CLOSE_RANGE_CLOEXEC, Linux 5.11), then let through what it needs.
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            for &fd in &keep {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags >= 0 {
                    libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().at("layercache overlay-daemon")?;
    drop(cmd);
    drop(ready_wr);
    drop(config);
    drop(hold);
    let mut byte = [0u8; 1];
    if let Ok(1) = ready_rd.read(&mut byte)
        && byte[0] == b'1'
    {
        return Ok(child.id());
    }
    let mut report = Vec::new();
    if byte[0] == b'E' {
        let _ = ready_rd.read_to_end(&mut report);
    }
    let status = child.wait().ok().and_then(|s| s.code()).unwrap_or(1);
    match serde_json::from_slice::<DaemonFailure>(&report) {
        Ok(f) if f.exit == 2 => Err(Error::invalid(f.message)),
        Ok(f) => Err(Error::Failed(f.message)),
        Err(_) => {
            // Died without a report (a panic, a signal): its stderr is all there is.
            let mut msg = String::new();
            let _ = err_rd.read_to_string(&mut msg);
            let msg = msg.trim();
            Err(Error::Failed(format!(
                "overlay daemon for {} exited with status {status}{}{msg}",
                mountpoint.display(),
                if msg.is_empty() { "" } else { ": " }
            )))
        }
    }
}

/// A memfd holding `cfg` as JSON, positioned at its start, for the daemon to read.
///
/// Errors: [`Error::Io`] if the memfd cannot be made or written.
fn config_memfd(cfg: &OverlayConfig) -> Result<OwnedFd> {
    use std::io::Seek;
    let body = serde_json::to_vec(cfg).map_err(|e| Error::Failed(e.to_string()))?;
    let fd = rustix::fs::memfd_create("layercache-overlay-config", rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| Error::io("memfd", e.into()))?;
    let mut f = std::fs::File::from(fd);
    f.write_all(&body).at("memfd")?;
    f.rewind().at("memfd")?;
    Ok(f.into())
}

fn redirect_stdio() {
    let log = std::env::var_os("LAYERCACHE_DAEMON_LOG");
    let target = log
        .as_deref()
        .map(Path::new)
        .unwrap_or(Path::new("/dev/null"));
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(target);
    let null = std::fs::File::open("/dev/null");
    if let (Ok(out), Ok(null)) = (out, null) {
        // SAFETY: dup2 onto the standard descriptors of this process.
        unsafe {
            libc::dup2(null.as_raw_fd(), 0);
            libc::dup2(out.as_raw_fd(), 1);
            libc::dup2(out.as_raw_fd(), 2);
        }
    }
}

fn raise_nofile_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointer to an rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

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
fn remount(mountpoint: &Path, flags: nix::mount::MsFlags) -> Result<()> {
    if fuse_mount_at(mountpoint)?.is_none() {
        return Err(Error::invalid(format!(
            "remount {}: no layercache mount there",
            mountpoint.display()
        )));
    }
    nix::mount::mount(
        None::<&str>,
        mountpoint,
        None::<&str>,
        nix::mount::MsFlags::MS_REMOUNT | flags,
        None::<&str>,
    )
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
    let umount = || match nix::mount::umount2(mountpoint, nix::mount::MntFlags::empty()) {
        Err(nix::errno::Errno::EPERM) => fusermount::unmount(mountpoint, false),
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
    let mut pfd = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // poll is never restarted after a signal handler ran (a second Ctrl-C during `run`'s
    // teardown), so wait again for the time that is left.
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let ms = left.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n == 1 {
            // SAFETY: non-blocking reap of a child we may own; ECHILD otherwise, ignored.
            unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG) };
            return true;
        }
        let interrupted =
            n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted;
        if !interrupted || left.is_zero() {
            return false;
        }
    }
}
