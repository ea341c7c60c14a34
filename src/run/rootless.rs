//! `layercache run` without root: the run enters a user namespace plus mount
//! namespace of its own before it opens the store, and everything a root run does happens there.
//!
//! * **The run's namespaces** ([`enter`]): `unshare(CLONE_NEWUSER | CLONE_NEWNS)` with the one
//!   mapping an unprivileged process may write for itself — uid 0 and gid 0 of the namespace
//!   are the user's own ids (user_namespaces(7), "Defining user and group ID mappings"), and
//!   `setgroups` denied — then `/` made recursively private. As root of that namespace the run
//!   and its overlay daemons (exec'd as uid 0, so with their capabilities) mount FUSE with plain
//!   mount(2): FUSE is mountable in a user namespace since Linux 4.18 (`FS_USERNS_MOUNT`),
//!   provided `/dev/fuse` opens. No `fusermount3`, no setuid helper: the mounts live in the
//!   run's mount namespace only and die with it, so no host path ever shows them and no kill can
//!   leave one on the host. Files the namespace's root writes land on disk as the user's.
//! * **The steps' identity** (`as_user`): setup, maintenance and COMMAND do not run as the
//!   namespace's root. Each enters a nested user namespace mapping the user's uid/gid to the
//!   run namespace's 0, so the step sees `id -u` = its real uid, owns what it creates as
//!   itself, and loses every capability at exec (a non-zero uid). `--user 0:0` keeps the step
//!   as the namespace's root instead (as `unshare -r` does); another uid is refused, since an
//!   unprivileged namespace can map only one.
//! * **Refusals** ([`preflight`], before anything is mounted, one line, exit 2): user
//!   namespaces off (`kernel.unprivileged_userns_clone`, `user.max_user_namespaces`), no
//!   read-write `/dev/fuse`, `--user` of another uid, `--sandbox docker` (no engine can see a
//!   mount that lives in the run's namespace, and rootless Docker has namespaces of its own).
//!
//! The other design, `fusermount3` mounting in the host's namespace plus a bind into each
//! step's namespace, was measured and not chosen (docs/ARCHITECTURE.md, "Without root").

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::Command;

use crate::error::{Error, Result};
use crate::sandbox::Sandbox;
use crate::sandbox::user::{RunUser, UserSource};

/// An unprivileged run: the user's ids outside the run's namespace, and who the steps are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rootless {
    /// The user's real uid (on disk, outside every namespace of the run).
    pub uid: u32,
    /// The user's real gid.
    pub gid: u32,
    /// `--user 0:0`: the steps run as root of the run's user namespace, not as the user.
    pub as_root: bool,
}

/// True when this process is not root: `layercache run` then takes the unprivileged path.
pub fn needed() -> bool {
    !rustix::process::geteuid().is_root()
}

/// The sysctls that turn unprivileged user namespaces off, and what they say here.
const USERNS_SYSCTLS: [(&str, &str); 2] = [
    (
        "kernel.unprivileged_userns_clone",
        "/proc/sys/kernel/unprivileged_userns_clone",
    ),
    (
        "user.max_user_namespaces",
        "/proc/sys/user/max_user_namespaces",
    ),
];

/// The message for "user namespaces are off", naming the sysctls and their values here.
fn userns_off(detail: &str) -> Error {
    let values: Vec<String> = USERNS_SYSCTLS
        .iter()
        .filter_map(|(name, path)| {
            let v = std::fs::read_to_string(path).ok()?;
            Some(format!("{name} = {}", v.trim()))
        })
        .collect();
    Error::invalid(format!(
        "layercache run without root needs unprivileged user namespaces, and {detail} ({}): \
         enable them (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0) \
         or run as root",
        if values.is_empty() {
            "neither sysctl is readable".to_string()
        } else {
            values.join(", ")
        }
    ))
}

/// Checks, before anything is mounted, that this unprivileged run can be made, and decides who
/// its steps run as (`user`: `--user` or the spec's, as `source` gave it).
///
/// Errors: [`Error::Invalid`] (exit 2), one line each: a sandbox that cannot serve an
/// unprivileged run ([`Sandbox::unprivileged_refusal`]: `--sandbox docker`); a `user` other
/// than the caller's own uid/gid or 0:0; user namespaces off (either sysctl 0); `/dev/fuse`
/// not readable and writable by the user ([`crate::overlay::fusermount::check_dev_fuse`]).
pub fn preflight(sandbox: &Sandbox, user: Option<RunUser>, source: UserSource) -> Result<Rootless> {
    let (uid, gid) = (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    if let Some(refused) = sandbox.unprivileged_refusal(uid) {
        return Err(refused);
    }
    let as_root = match user {
        None => false,
        Some(u) if u.uid == uid && u.gid == gid => false,
        Some(u) if u.uid == 0 && u.gid == 0 => true,
        Some(u) => {
            return Err(Error::invalid(format!(
                "{source} {}:{}: an unprivileged run (uid {uid}) can run its steps only as \
                 itself ({uid}:{gid}) or as root of its user namespace (0:0); run as root to \
                 use another user",
                u.uid, u.gid
            )));
        }
    };
    for (name, path) in USERNS_SYSCTLS {
        if std::fs::read_to_string(path).is_ok_and(|v| v.trim() == "0") {
            return Err(userns_off(&format!("{name} is 0")));
        }
    }
    // The overlay's own check (one place for it): the daemons open /dev/fuse as the user.
    crate::overlay::fusermount::check_dev_fuse(uid)?;
    Ok(Rootless { uid, gid, as_root })
}

/// Checks, before anything is mounted, that this unprivileged run can create the host
/// directories its views need (the mount root of views below it, the `--workdir-view`
/// directory, a view below the workdir): each must exist or have a nearest existing ancestor
/// the user may write (access(2) `W_OK`). A root run creates `/cache` itself; a user cannot.
///
/// Errors: [`Error::Invalid`] (exit 2), one line naming the flag (`--mount-root`,
/// `--workdir-view`) or the cache's view path, the directory that is not writable, and what
/// would do instead.
pub fn check_view_dirs(spec: &crate::spec::Spec, paths: &crate::spec::Paths) -> Result<()> {
    let mut need: Vec<(String, std::path::PathBuf)> = Vec::new();
    if let Some(v) = &paths.workdir_view {
        need.push(("--workdir-view".into(), v.clone()));
    }
    for c in &spec.caches {
        let Ok(v) = c.mountpoint(paths) else {
            continue; // the run reports a bad mountpoint itself
        };
        if v.starts_with(&paths.mount_root) {
            need.push(("--mount-root".into(), paths.mount_root.clone()));
        } else if let Ok(rel) = v.strip_prefix(paths.view_workdir()) {
            need.push((
                format!("cache {:?}'s view", c.id.as_str()),
                paths.workdir.join(rel),
            ));
        }
    }
    for (what, dir) in need {
        let Some(existing) = dir.ancestors().find(|a| a.exists()) else {
            continue;
        };
        if existing == dir || rustix::fs::access(existing, rustix::fs::Access::WRITE_OK).is_ok() {
            continue;
        }
        let uid = rustix::process::getuid().as_raw();
        let hint = if what == "--mount-root" {
            format!(
                "create it once as root (mkdir -m 1777 {}), or pass --mount-root with a \
                 directory you may create (e.g. --mount-root $HOME/.cache/layercache-views)",
                dir.display()
            )
        } else {
            "create it first, or choose a path in a directory you own".to_string()
        };
        return Err(Error::invalid(format!(
            "{what} {}: does not exist, and uid {uid} cannot create it ({} is not writable): \
             {hint}",
            dir.display(),
            existing.display()
        )));
    }
    Ok(())
}

/// Makes this process enter a new user namespace and mount namespace (see the module docs):
/// afterwards it is uid 0 / gid 0 there, which are `r.uid` / `r.gid` outside, and its mounts
/// are private. Call it before any thread is started (unshare(2) refuses a multithreaded
/// process a user namespace).
///
/// Errors: [`Error::Invalid`] (exit 2) naming the sysctls when the kernel refuses the user
/// namespace (EPERM, ENOSPC, EUSERS: user namespaces off, over the limit, or an LSM policy);
/// [`Error::Failed`] for any other failure (a thread already running: EINVAL).
pub fn enter(r: &Rootless) -> Result<()> {
    // Before any thread is started.
    if let Err(e) = crate::sys::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) {
        return Err(match e.raw_os_error() {
            Some(libc::EPERM | libc::ENOSPC | libc::EUSERS) => {
                userns_off(&format!("unshare(CLONE_NEWUSER) was refused: {e}"))
            }
            _ => Error::Failed(format!("unshare(CLONE_NEWUSER | CLONE_NEWNS): {e}")),
        });
    }
    let write = |path: &str, text: String| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| Error::Failed(format!("{path}: writing {text:?}: {e}")))
    };
    write("/proc/self/setgroups", "deny".into())?;
    write("/proc/self/uid_map", format!("0 {} 1", r.uid))?;
    write("/proc/self/gid_map", format!("0 {} 1", r.gid))?;
    crate::sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(|e| Error::Failed(format!("making / private in the run's namespace: {e}")))
}

/// Makes `cmd` (a step of an unprivileged run, spawned from the run's namespace, where it is
/// root) enter a nested user namespace in which it is the user again: `r.uid`/`r.gid` inside
/// map to the run namespace's 0/0, i.e. to themselves on disk. Register it after the views'
/// hook (which needs the run namespace's root) and before [`super::pidns::isolate`]. Nothing
/// for `--user 0:0` (`r.as_root`).
///
/// The spawn fails with the errno of the first failing call (unshare(2), or a write of the
/// maps).
pub(super) fn as_user(cmd: &mut Command, r: &Rootless) {
    if r.as_root {
        return;
    }
    // Prepared before fork: the hook only makes system calls.
    let uid_map = format!("{} 0 1", r.uid).into_bytes();
    let gid_map = format!("{} 0 1", r.gid).into_bytes();
    // SAFETY: between fork and exec only the async-signal-safe calls of `sys::forked` run
    // (unshare, open, write, close) on buffers made before fork.
    unsafe {
        cmd.pre_exec(move || {
            crate::sys::unshare(libc::CLONE_NEWUSER)?;
            for (path, text) in [
                (c"/proc/self/setgroups", b"deny".as_slice()),
                (c"/proc/self/gid_map", &gid_map),
                (c"/proc/self/uid_map", &uid_map),
            ] {
                crate::sys::forked::write_file(path, text)?;
            }
            Ok(())
        });
    }
}
