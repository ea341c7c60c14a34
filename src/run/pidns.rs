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

use crate::sys::{self, forked};

/// Makes `cmd` run under an init of a new PID namespace (see the module docs). Register it
/// after the hooks that need the caller's privileges in C (views, user namespace) and before
/// those that only S needs (the `--user` drop, signal resets): hooks run in order, and the
/// ones after this one run in S only.
///
/// The spawn fails with unshare(2)'s errno when PID namespaces cannot be made (EPERM without
/// CAP_SYS_ADMIN in the current user namespace; ENOSPC over `user.max_pid_namespaces`).
pub(super) fn isolate(cmd: &mut Command, group: bool) {
    // SAFETY: between fork and exec only the async-signal-safe calls of `sys::forked` run
    // (unshare, fork, prctl, sigaction, close_range, waitpid, kill, setpgid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            sys::unshare(libc::CLONE_NEWPID)?;
            let _ = forked::set_parent_death_signal(libc::SIGKILL);
            // fork: this hook's child has one thread and makes only async-signal-safe calls.
            let init = forked::fork()?;
            if init > 0 {
                forked::supervise(init, init, false); // C: never returns
            }
            // I, PID 1 of the namespace (its parent C is outside it: getppid() says 0).
            let _ = forked::set_parent_death_signal(libc::SIGKILL);
            let step = forked::fork()?;
            if step > 0 {
                if group {
                    let _ = forked::setpgid(step, step);
                }
                forked::supervise(step, if group { -step } else { step }, true);
            }
            // S: the step itself; the remaining hooks run, then exec.
            if group {
                let _ = forked::setpgid(0, 0);
            }
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                let _ = forked::default_signal(sig);
            }
            Ok(())
        });
    }
}
