//! The processes of a run: setup, maintenance and COMMAND are spawned here, and SIGINT,
//! SIGTERM and SIGHUP received meanwhile are recorded and forwarded to the running child.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::error::{IoContext, Result};

/// The signal that asked the run to stop (0 = none).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// The running child, which receives forwarded signals (0 = none).
static CHILD_PID: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    STOP_SIGNAL.store(sig, Ordering::SeqCst);
    let child = CHILD_PID.load(Ordering::SeqCst);
    if child > 0 {
        // SAFETY: kill(2) is async-signal-safe; the pid is our own child's.
        unsafe { libc::kill(child, sig) };
    }
}

/// Catches SIGINT/SIGTERM/SIGHUP while alive (they are recorded and forwarded to the running
/// child, and the run unwinds: unmount, exit 128 + signal); restores the previous handlers on
/// drop.
pub(super) struct SignalGuard {
    old: Vec<(nix::sys::signal::Signal, nix::sys::signal::SigAction)>,
}

impl SignalGuard {
    pub(super) fn install() -> Self {
        use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
        STOP_SIGNAL.store(0, Ordering::SeqCst);
        let action = SigAction::new(
            SigHandler::Handler(on_signal),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        let mut old = Vec::new();
        for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            // SAFETY: the handler only touches atomics and calls kill(2).
            if let Ok(prev) = unsafe { sigaction(sig, &action) } {
                old.push((sig, prev));
            }
        }
        SignalGuard { old }
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for (sig, prev) in self.old.drain(..) {
            // SAFETY: restoring the handler that was installed before.
            let _ = unsafe { nix::sys::signal::sigaction(sig, &prev) };
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

/// Spawns `cmd` as the current child and waits; signals received meanwhile are forwarded.
pub(super) fn run_child(mut cmd: Command, what: &str) -> Result<i32> {
    // glibc's posix_spawn (used by std, and by whatever started us) sets glibc's internal
    // signals 32 and 33 (SIGCANCEL, SIGSETXID) to SIG_IGN in the child, and SIG_IGN survives
    // exec: COMMAND would start with two real-time signals ignored (a Go or musl program sees
    // that). With a pre_exec hook std forks instead, and the hook resets both to SIG_DFL —
    // through the raw system call, since glibc's sigaction refuses its internal signals.
    // SAFETY: rt_sigaction(2) is async-signal-safe; the struct is the kernel's sigaction
    // layout (handler, flags, restorer, 64-bit mask) on x86_64 and aarch64.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            #[repr(C)]
            struct KernelSigaction {
                handler: usize,
                flags: libc::c_ulong,
                restorer: usize,
                mask: u64,
            }
            let dfl = KernelSigaction {
                handler: libc::SIG_DFL,
                flags: 0,
                restorer: 0,
                mask: 0,
            };
            for sig in [32, 33] {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    &dfl as *const KernelSigaction,
                    std::ptr::null_mut::<KernelSigaction>(),
                    8usize,
                );
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
    CHILD_PID.store(child.id() as i32, Ordering::SeqCst);
    if let Some(sig) = stopped() {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, sig) };
    }
    let status = child.wait();
    CHILD_PID.store(0, Ordering::SeqCst);
    Ok(status_code(status.at(what)?))
}
