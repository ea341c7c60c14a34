//! The calls a `pre_exec` hook makes, between fork(2) and exec(2) of a step
//! (`std::os::unix::process::CommandExt::pre_exec`).
//!
//! The contract of every function here, which is what makes it fit for that place: it is
//! **async-signal-safe** (signal-safety(7)) — it only makes raw system calls on memory the
//! caller prepared before the fork (no allocation, no lock, no stdio, no glibc wrapper that
//! takes an internal lock or broadcasts to other threads), and reports failure as an
//! `io::Error` built from `errno` (an integer: building it allocates nothing). The forked child
//! of a multithreaded parent has one thread and a copy of every lock as it was at the fork:
//! anything else may deadlock there.
//!
//! [`crate::sys::unshare`], [`crate::sys::mount`], [`crate::sys::kill`],
//! [`crate::sys::close_range_from`] and [`crate::sys::set_inheritable`] keep the same contract
//! and are used from hooks too.

use std::io;
use std::sync::atomic::{AtomicI32, Ordering};

use super::check_ok;

/// `prctl(PR_SET_PDEATHSIG, sig)`: this process gets signal `sig` when its parent thread dies.
/// A credential change (setuid…) clears it: set it after those. Async-signal-safe.
///
/// Errors: `EINVAL` for a bad signal number.
pub fn set_parent_death_signal(sig: libc::c_int) -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    check_ok(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong) })
}

/// `fork(2)`: 0 in the new child, the child's pid in the caller. In a hook's child (one
/// thread, no `pthread_atfork` handlers registered by layercache) it only makes the system
/// call and updates the thread's own id.
///
/// # Safety
/// Both processes may afterwards only make async-signal-safe calls (this module's) until they
/// exec or `_exit`: the caller must itself be a forked child of a multithreaded process (a
/// `pre_exec` hook) or a single-threaded process.
///
/// Errors: the `fork` errno (`EAGAIN` over `RLIMIT_NPROC` or `pid_max`, `ENOMEM`).
pub unsafe fn fork() -> io::Result<libc::pid_t> {
    // SAFETY: the caller keeps the contract above.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        pid => Ok(pid),
    }
}

/// `setpgid(pid, pgid)` (0 for either: the caller). Async-signal-safe.
///
/// Errors: its errno (`EACCES` after the child's exec, `EPERM`, `ESRCH`).
pub fn setpgid(pid: libc::pid_t, pgid: libc::pid_t) -> io::Result<()> {
    // SAFETY: integers only.
    check_ok(unsafe { libc::setpgid(pid, pgid) })
}

/// The kernel's `struct sigaction` for `rt_sigaction(2)` (handler, flags, restorer, 64-bit
/// mask) on x86_64 and aarch64 — not glibc's.
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// Sets the disposition of `sig` to `SIG_DFL` with the raw `rt_sigaction(2)` system call —
/// which, unlike glibc's `sigaction`, also reaches glibc's internal signals 32 and 33
/// (SIGCANCEL, SIGSETXID). Async-signal-safe.
///
/// Errors: `EINVAL` for SIGKILL, SIGSTOP or a bad number.
pub fn default_signal(sig: libc::c_int) -> io::Result<()> {
    let dfl = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    // SAFETY: a valid kernel sigaction for SIG_DFL (no handler runs), no old action asked for,
    // and the kernel's sigset size.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            sig,
            &dfl as *const KernelSigaction,
            std::ptr::null_mut::<KernelSigaction>(),
            8usize,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes `text` to the existing file `path` in one `write(2)` (open `O_WRONLY | O_CLOEXEC`,
/// write, close): how `/proc/self/uid_map`, `gid_map` and `setgroups` are set
/// (user_namespaces(7): each map is written once, in one call). Async-signal-safe.
///
/// Errors: the `open`/`write` errno (`EPERM` for a map the kernel refuses); a short write is
/// reported with whatever `errno` holds.
pub fn write_file(path: &std::ffi::CStr, text: &[u8]) -> io::Result<()> {
    // SAFETY: `path` is NUL-terminated; `text` is valid for reads of its length; the
    // descriptor is ours and closed before returning.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = libc::write(fd, text.as_ptr().cast(), text.len());
        libc::close(fd);
        if n != text.len() as isize {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Drops this process to user `uid` and group `gid`: `setgroups(0, NULL)`, then
/// `setresgid(gid, gid, gid)`, then `setresuid(uid, uid, uid)`, as raw system calls (glibc's
/// wrappers broadcast a credential change to all threads, which a forked child does not
/// need). Async-signal-safe. Clears `PR_SET_PDEATHSIG` (credentials(7)).
///
/// Errors: the errno of the first call that fails (`EPERM` without CAP_SETUID/CAP_SETGID).
pub fn drop_to(uid: u32, gid: u32) -> io::Result<()> {
    let check = |rc: libc::c_long| {
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SAFETY: integer arguments, and a NULL list of length 0.
    unsafe {
        check(libc::syscall(
            libc::SYS_setgroups,
            0,
            std::ptr::null::<libc::gid_t>(),
        ))?;
        check(libc::syscall(libc::SYS_setresgid, gid, gid, gid))?;
        check(libc::syscall(libc::SYS_setresuid, uid, uid, uid))?;
    }
    Ok(())
}

/// Where [`supervise`]'s handler forwards a signal (a pid, or minus a process group; 0: none).
static FORWARD_TO: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // A signal the terminal sent (SI_KERNEL) reached every process of its foreground group,
    // the step included: only what kill(2) sent (the run forwarding, `kill PID`) is passed on.
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let sent = info.is_null() || unsafe { (*info).si_code } <= 0;
    let to = FORWARD_TO.load(Ordering::SeqCst);
    if to != 0 && sent {
        // Async-signal-safe; the target is our own child (or its group).
        let _ = super::kill(to, sig);
    }
}

/// Supervises `child` from a hook's forked process and never returns: SIGINT, SIGTERM and
/// SIGHUP sent with kill(2) (`si_code <= 0`; not the terminal's) are forwarded to `target` (a
/// pid, or minus a process group); every descriptor from 3 up is closed; the process waits
/// (reaping every child when `reap`, as PID 1 of a PID namespace must) until `child` exits,
/// then `_exit`s with its status — 128 + N for death by signal N, as a shell reports it; 1
/// when waiting fails. Async-signal-safe.
pub fn supervise(child: libc::pid_t, target: libc::pid_t, reap: bool) -> ! {
    FORWARD_TO.store(target, Ordering::SeqCst);
    // SAFETY: sigaction(2), close_range(2), waitpid(2) and _exit(2) are async-signal-safe;
    // the sigaction struct is plain memory on the stack.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = forward as *const () as usize;
        act.sa_flags = libc::SA_RESTART | libc::SA_SIGINFO;
        libc::sigemptyset(&mut act.sa_mask);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
        // Nothing but stdio: the spawning parent's error pipe must close when the step execs.
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
        let mut status = 0;
        let code = loop {
            let pid = libc::waitpid(if reap { -1 } else { child }, &mut status, 0);
            if pid == child {
                break if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else if libc::WIFSIGNALED(status) {
                    128 + libc::WTERMSIG(status)
                } else {
                    1
                };
            }
            if pid < 0 && *libc::__errno_location() != libc::EINTR {
                break 1;
            }
        };
        libc::_exit(code)
    }
}
