//! Processes, signals and the allocator: `pidfd_open(2)`/`pidfd_getfd(2)` (through rustix) to
//! watch a daemon and adopt a lock it holds, `kill(2)`, reaping, signal handlers and masks,
//! scheduling policy, `getrandom(2)`, and glibc's malloc knobs.

use std::io;
use std::os::fd::OwnedFd;

use super::{check, check_ok};

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
/// Restores the default action of SIGPIPE (terminate) for this process; the Rust runtime
/// starts with it ignored, which turns a write to a closed pipe into an `EPIPE` error.
pub fn default_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
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
    // (Formatted here: `sys` stays below `units`, which `error` is below.)
    buf.iter().map(|b| format!("{b:02x}")).collect()
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

/// Sets the calling thread's umask to `mask` and returns the one it had, after giving the
/// thread a file-system context of its own (`unshare(CLONE_FS)`): the umask is shared by every
/// thread of a process otherwise, and a unit test that changed it would make the files and
/// directories other tests create meanwhile (on other threads) writable by everyone. The
/// thread's cwd and root stay as they were. For tests only.
///
/// Panics when `unshare` fails (it does not on Linux for `CLONE_FS`).
#[cfg(test)]
pub fn thread_umask(mask: u32) -> u32 {
    // SAFETY: CLONE_FS unshares cwd, root and umask only; no file descriptor table changes.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::FS) }
        .expect("unshare(CLONE_FS)");
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(mask)).bits()
}
