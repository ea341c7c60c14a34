//! A PID namespace per step: setup, maintenance and COMMAND each run as PID 2
//! of a PID namespace of their own under a tiny init, so that when the step ends — or
//! `layercache run` is killed, even by `kill -9` — every process it started dies with it,
//! including a daemon that left the process group and session (`setsid`, double fork). This
//! is the `unshare --pid --fork` + init shape of `docker run --init` (tini) and of bubblewrap's
//! `--unshare-pid` reaper; the kernel's rule it rests on is pid_namespaces(7): when the
//! namespace's init (PID 1) ends, the kernel SIGKILLs every other process in it.
//!
//! The chain, made between fork and exec of the step's [`Command`] (no other binary, no
//! allocation):
//! ```text
//!   layercache run ── C (the spawned child: unshare(CLONE_NEWPID), fork; waits for I)
//!                        └── I (PID 1 of the new namespace: forwards signals, reaps, exits
//!                               with the step's status)
//!                               └── S (PID 2: the rest of the pre-exec hooks, then exec)
//! ```
//! C and I have `PR_SET_PDEATHSIG` = SIGKILL, so a killed run takes C, C takes I, and I's end
//! takes the namespace. C and I close every descriptor but stdio at once, so `spawn` returns
//! (its error pipe reaches EOF) exactly when S has exec'd, or with S's exec error, as for a
//! plain child. SIGINT, SIGTERM and SIGHUP sent to C go to I; I sends them to S's process
//! group (`group`, the scripts' case: S leads a group of its own inside the namespace) or to S
//! alone (a COMMAND on a terminal stays in the terminal's group, which gets the terminal's
//! signals itself: those are not passed on again). PID 1 of a namespace gets no
//! signal it has no handler for; I has handlers for these three. An exit by signal N comes
//! back as status 128 + N, as a shell reports it.
//!
//! `/proc` stays the run's (a fresh one needs a mount namespace the step may not have):
//! `/proc/self` is still right; `ps` shows the host's processes.

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

/// Where C and I forward a signal (I's pid in C; S's pid, or minus its group, in I).
static FORWARD_TO: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // A signal the terminal sent (SI_KERNEL) reached every process of its foreground group,
    // the step included: only what kill(2) sent (the run forwarding, `kill PID`) is passed on.
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let sent = info.is_null() || unsafe { (*info).si_code } <= 0;
    let to = FORWARD_TO.load(Ordering::SeqCst);
    if to != 0 && sent {
        // Async-signal-safe; the target is our own child (or its group).
        let _ = crate::sys::kill(to, sig);
    }
}

/// Makes `cmd` run under an init of a new PID namespace (see the module docs). Register it
/// after the hooks that need the caller's privileges in C (views, user namespace) and before
/// those that only S needs (the `--user` drop, signal resets): hooks run in order, and the
/// ones after this one run in S only.
///
/// The spawn fails with unshare(2)'s errno when PID namespaces cannot be made (EPERM without
/// CAP_SYS_ADMIN in the current user namespace; ENOSPC over `user.max_pid_namespaces`).
pub(super) fn isolate(cmd: &mut Command, group: bool) {
    // SAFETY: only async-signal-safe system calls (unshare, fork, prctl, sigaction,
    // close_range, waitpid, kill, setpgid, _exit) run between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWPID) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            let init = fork_or_err()?;
            if init > 0 {
                supervise(init, init, false); // C: never returns
            }
            // I, PID 1 of the namespace (its parent C is outside it: getppid() says 0).
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            let step = fork_or_err()?;
            if step > 0 {
                if group {
                    libc::setpgid(step, step);
                }
                supervise(step, if group { -step } else { step }, true);
            }
            // S: the step itself; the remaining hooks run, then exec.
            if group {
                libc::setpgid(0, 0);
            }
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
}

fn fork_or_err() -> std::io::Result<libc::pid_t> {
    // SAFETY: fork(2) in a child that only makes async-signal-safe calls afterwards.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        pid => Ok(pid),
    }
}

/// C and I: forward SIGINT/SIGTERM/SIGHUP to `target`, wait (reaping every child when `reap`,
/// as PID 1 must) until `child` exits, then exit with its status. Never returns.
fn supervise(child: libc::pid_t, target: libc::pid_t, reap: bool) -> ! {
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
        // Nothing but stdio: the spawning parent's error pipe must close when S execs.
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
