//! `--sandbox bwrap`: bubblewrap (bwrap(1)) as the step's process — the host root read-only,
//! the workdir and each cache mount bound at its view path — and the `--user` preflight.
//!
//! Outside reference: bwrap(1) (`--ro-bind`, `--bind`, `--tmpfs`, `--unshare-user`, `--uid`,
//! `--gid`, `--unshare-pid`, `--die-with-parent`).

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use super::{Binds, Driver, args, user};
use crate::error::{Error, Result};

/// A `bwrap` command running `argv` in a sandbox: the host root read-only, fresh `/dev`,
/// `/proc` and `/tmp`, `$HOME` writable (package managers keep logs and config there), the
/// workdir and each mount bound read-write, the env set, and the child killed with its parent.
///
/// With `user` (`--user`), bwrap runs in a user namespace of its own
/// (`--unshare-user --uid UID --gid GID`) with the same ids inside as outside: the caller makes
/// the bwrap process itself run as that user ([`user::RunUser::drop_privileges`]), so the
/// sandbox's processes really are that user (unprivileged user namespaces must be allowed).
///
/// Errors: [`Error::Invalid`] when `argv` is empty.
pub fn bwrap_command(
    binds: &Binds,
    argv: &[OsString],
    user: Option<user::RunUser>,
) -> Result<Command> {
    if argv.is_empty() {
        return Err(Error::invalid("sandbox: nothing to run"));
    }
    let mut cmd = Command::new("bwrap");
    cmd.args(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]);
    cmd.args(["--tmpfs", "/tmp"]);
    if let Some(u) = user {
        cmd.arg("--unshare-user");
        cmd.arg("--uid").arg(u.uid.to_string());
        cmd.arg("--gid").arg(u.gid.to_string());
    } else if rustix::process::geteuid().is_root() {
        // bwrap run by root keeps root's capabilities inside: without CAP_SYS_ADMIN a step
        // cannot unmount what covers the store (`Binds::hidden`) nor remount the host root
        // read-write.
        cmd.args(["--cap-drop", "CAP_SYS_ADMIN"]);
    }
    if let Some(home) = std::env::var_os("HOME").filter(|h| Path::new(h).is_dir()) {
        cmd.arg("--bind").arg(&home).arg(&home);
    }
    cmd.args(args(Driver::Bwrap, binds));
    // Its own PID namespace too: bwrap's `--proc /proc` must be of a PID namespace its user
    // namespace owns (with --unshare-user), and its reaper is the sandbox's PID 1.
    cmd.args(["--unshare-pid", "--die-with-parent", "--"]);
    cmd.args(argv);
    Ok(cmd)
}

/// Checks, before anything is mounted, that bubblewrap can run as `user` here: one
/// `bwrap --unshare-user --uid U --gid G --ro-bind / / true` as that user (an unprivileged user
/// namespace; see [`bwrap_command`]).
///
/// Errors: [`Error::Invalid`] (exit 2) naming the user as `source` gave it (`--user U:G` or
/// `the spec's user U:G`) and bubblewrap's first line (e.g. user namespaces disabled by
/// `kernel.unprivileged_userns_clone` or AppArmor), or a missing `bwrap`.
pub fn bwrap_user_preflight(user: user::RunUser, source: user::UserSource) -> Result<()> {
    let mut cmd = Command::new("bwrap");
    cmd.args(["--unshare-user", "--uid", &user.uid.to_string()]);
    cmd.args([
        "--gid",
        &user.gid.to_string(),
        "--ro-bind",
        "/",
        "/",
        "true",
    ]);
    user.drop_privileges(&mut cmd);
    let what = format!("{source} {}:{} with --sandbox bwrap", user.uid, user.gid);
    let out = cmd
        .output()
        .map_err(|e| Error::invalid(format!("{what}: cannot run bwrap: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    Err(Error::invalid(format!(
        "{what}: bubblewrap cannot run as that user here ({}): it needs unprivileged user \
         namespaces (or use --sandbox none)",
        if line.is_empty() {
            out.status.to_string()
        } else {
            line.trim().to_string()
        }
    )))
}

/// A step's bubblewrap command ([`super::Sandbox::command`]): with `user` (`--user`, uid
/// not 0) bubblewrap runs unprivileged and binds each view from its view path — the caller
/// sets the views up first, as root, in the bwrap process's own mount namespace (the views'
/// sources, below the store's 0700 project directory, are out of that user's reach); the
/// bool says so. Otherwise bwrap binds the sources itself, as `inner` when an unprivileged
/// run's steps are the user (`--unshare-user --uid U --gid G`).
///
/// Errors: [`Error::Invalid`] when `argv` is empty.
pub(super) fn step(
    binds: &Binds,
    argv: &[OsString],
    user: Option<user::RunUser>,
    inner: Option<user::RunUser>,
) -> Result<(Command, bool)> {
    match user {
        // uid 0 stays root: bwrap as root, without a user namespace of its own.
        Some(user) if user.uid != 0 => {
            let view_wd = binds.workdir_view.as_ref().unwrap_or(&binds.workdir);
            let seen = Binds {
                workdir: view_wd.clone(),
                workdir_view: None,
                tmpfs: binds.tmpfs.clone(),
                mounts: (binds.mounts.iter())
                    .map(|(_, v)| (v.clone(), v.clone()))
                    .collect(),
                env: binds.env.clone(),
                // Bound by the caller as root: bwrap runs as the user, who may not even reach
                // the store's path to cover it, and cannot read its 0700 directories anyway.
                hidden: Vec::new(),
            };
            Ok((bwrap_command(&seen, argv, Some(user))?, true))
        }
        _ => Ok((bwrap_command(binds, argv, inner)?, false)),
    }
}
