//! Daemon set-up of the overlay: `layercache overlay` and the hidden `overlay-daemon`
//! subcommand, the fuser session settings (threads, FUSE over io_uring), the process set-up of
//! a serving daemon (umask, fd limit, heap arena, standard I/O) and how it ends (signals, an
//! owner's exit). Mounting and unmounting themselves are in `mount.rs`.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::mount::{mount_fuse, preflight, raise_read_ahead, remount};
use super::{OverlayConfig, fs, fusermount, options, ring};
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
    let (mut cfg, made) = options::validate_made(&raw, mountpoint)?;
    cfg.allow_other = options::asks_allow_other(options);
    if foreground {
        mount_foreground(&cfg, mountpoint, None)?;
        return Ok(0);
    }
    let mounted = mount_daemon(&cfg, mountpoint, Vec::new(), None);
    // A mount refused after the checks (the upper's filesystem, the user's mount rights, no
    // /dev/fuse) takes the workdir it made with it: a refused overlay leaves nothing. (In the
    // foreground an error may come after serving, when the workdir's node index is in use.)
    if mounted.is_err()
        && let Some(dir) = made
        && let Err(e) = std::fs::remove_dir_all(&dir)
    {
        tracing::warn!(dir = %dir.display(), error = %e, "removing the workdir a refused mount made");
    }
    mounted?;
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
    let _ = rustix::thread::set_name(c"layercache");
    // SAFETY: the parent passed these descriptors (a memfd and the write end of a pipe) for us
    // to own.
    let (config, ready) = unsafe {
        (
            OwnedFd::from_raw_fd(config_fd),
            OwnedFd::from_raw_fd(ready_fd),
        )
    };
    let report = ready.try_clone().ok();
    let res = read_daemon_config(config).and_then(|cfg| {
        // Before the owner's watcher thread starts (see `mount_foreground`).
        block_exit_signals(mountpoint)?;
        if let Some(owner) = owner {
            super::warm::watch_owner(owner, mountpoint, cfg.control.as_deref())?;
        }
        mount_foreground(&cfg, mountpoint, Some(ready))
    });
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

/// Makes every thread allocate from one glibc heap arena. Nodes are allocated by whichever
/// request thread looks a name up; with an arena per thread the kernel's forgets leave each
/// arena's pages pinned by the few allocations still live in them, and RSS after a 1M-entry
/// walk was forgotten stayed at 33-45 MB of heap instead of 7 MB (scripts/node-rss.sh). The
/// daemon's allocations are small and short, so one arena costs no measurable walk time.
fn one_heap_arena() {
    // Before the request threads start.
    crate::sys::malloc_arena_max(1);
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
    // Before any thread starts (a lazy layer's runtime, its report writer): every thread
    // inherits the mask, so these signals reach only the thread that waits for them.
    block_exit_signals(mountpoint)?;
    // The daemon applies the kernel-provided modes as given.
    rustix::process::umask(rustix::fs::Mode::empty());
    raise_nofile_limit();
    one_heap_arena();
    let fs = fs::OverlayFs::new(cfg)?;
    fs.install_resetter(cfg);
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
    let notifier = fs.notifier_slot();
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
    let _ = notifier.set(session.notifier());
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
                let _ = rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::DETACH);
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
    super::layer::run_exit_hooks();
    res.at(mountpoint)
}

/// True when nobody reads the pipe `w` writes to any more (`poll(2)` reports `POLLERR` on a
/// pipe's write end once its read end is closed): the process that started the daemon is gone.
fn reader_gone(w: &OwnedFd) -> bool {
    crate::sys::poll_one(w.as_fd(), libc::POLLOUT, 0)
        .is_ok_and(|revents| revents & libc::POLLERR != 0)
}

/// Makes SIGINT, SIGTERM and SIGHUP end the mount the way libfuse daemons do: a dedicated
/// thread waits for them (they are blocked in every other thread, which inherit the mask) and
/// lazily unmounts `mountpoint`; the session then sees ENODEV and `run` returns. Without this a
/// killed daemon leaves a dead mount ("Transport endpoint is not connected").
///
/// [`EXIT_NOW`] (SIGUSR1) is what [`unmount`](super::unmount) sends once the mount is
/// unmounted here but the daemon keeps serving: copies of the mount in other mount namespaces
/// (a run's children copy the host's mounts) keep the connection alive. The daemon then exits
/// at once, which ends those copies (ENOTCONN) too.
///
/// Errors: [`Error::Io`] if the signal mask cannot be set.
fn unmount_on_signal(mountpoint: &Path) -> Result<()> {
    let set = block_exit_signals(mountpoint)?;
    let mnt = mountpoint.to_path_buf();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Ok(sig) = set.wait() {
                tracing::info!(?sig, mountpoint = %mnt.display(), "signal: unmounting");
                let _ = fusermount::detach(&mnt);
                if sig == EXIT_NOW {
                    super::layer::run_exit_hooks();
                    std::process::exit(0);
                }
            }
        })
        .map(drop)
        .at(mountpoint)
}

/// Blocks SIGINT, SIGTERM, SIGHUP and [`EXIT_NOW`] in the calling thread, and so in every
/// thread it starts after (they inherit the mask): called before the daemon starts any thread,
/// so that only [`unmount_on_signal`]'s thread takes them. (A thread that did not block
/// SIGUSR1 would take it with its default action: the process killed at once, its exit hooks
/// cut short.) Returns the set. Blocking it again is harmless.
///
/// Errors: [`Error::Io`] if the signal mask cannot be set.
fn block_exit_signals(mountpoint: &Path) -> Result<crate::sys::SignalSet> {
    let set = crate::sys::SignalSet::of(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP, EXIT_NOW]);
    set.block_in_thread()
        .map_err(|e| Error::io(mountpoint, e))?;
    Ok(set)
}

/// The signal that tells a daemon whose mount is gone here to exit now (see
/// [`unmount_on_signal`]).
const EXIT_NOW: libc::c_int = libc::SIGUSR1;

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
            let _ = rustix::process::setsid();
            // Descriptors the caller left inheritable (a shell's `9>lock` held with flock, say)
            // must not live on in the daemon until unmount: mark everything above stderr
            // close-on-exec (CLOSE_RANGE_CLOEXEC, Linux 5.11), then let through what it needs.
            let _ = crate::sys::close_range_from(3, libc::CLOSE_RANGE_CLOEXEC);
            for &fd in &keep {
                let _ = crate::sys::set_inheritable(fd, true);
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
    // The log is often named in /tmp, where another user could plant a symlink to a file a
    // root daemon would then append to: never followed (ELOOP: no log), and private (0600).
    // One that cannot be opened means no log (/dev/null), never the starter's stdio, which
    // closes when it exits (a write there would end the daemon with SIGPIPE).
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(target)
        .or_else(|_| std::fs::OpenOptions::new().append(true).open("/dev/null"));
    let null = std::fs::File::open("/dev/null");
    if let (Ok(out), Ok(null)) = (out, null) {
        let _ = rustix::stdio::dup2_stdin(&null);
        let _ = rustix::stdio::dup2_stdout(&out);
        let _ = rustix::stdio::dup2_stderr(&out);
    }
}

fn raise_nofile_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut lim = getrlimit(Resource::Nofile);
    let value = |v: Option<u64>| v.unwrap_or(libc::RLIM_INFINITY); // None: no limit
    if value(lim.current) < value(lim.maximum) {
        lim.current = lim.maximum;
        let _ = setrlimit(Resource::Nofile, lim);
    }
}
