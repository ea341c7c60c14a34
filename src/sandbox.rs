//! Sandboxes for setup, maintenance and COMMAND: the arguments a platform adds to its own
//! bubblewrap or `docker run` (`layercache sandbox-args`), and the bubblewrap runner used by
//! `layercache run --sandbox bwrap`.
//!
//! Docker: the cache mounts must exist before the container starts and be mounted with
//! `allow_other` (layercache's overlay always is), so the daemon can bind them:
//! `docker run $(eval echo $(layercache sandbox-args --driver docker --spec S)) IMAGE …` gives
//! `-v /cache/<id>:/cache/<id>` per cache, `-v <workdir>:<workdir> -w <workdir>` and `-e K=V`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};

pub mod docker;
pub mod user;

/// A sandbox driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// bubblewrap (`bwrap`).
    Bwrap,
    /// `docker run`.
    Docker,
}

impl Driver {
    /// Parses `bwrap` or `docker`. Errors: [`Error::Invalid`] naming `--driver`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "bwrap" | "bubblewrap" => Ok(Driver::Bwrap),
            "docker" => Ok(Driver::Docker),
            _ => Err(Error::invalid(format!(
                "--driver: unknown driver {s:?} (use bwrap or docker)"
            ))),
        }
    }
}

/// What a sandbox must see: the project directory (at its view path), every cache mount
/// (read-write, at its view path) and the presets' environment.
#[derive(Debug, Clone, Default)]
pub struct Binds {
    /// The project directory on the host (bound read-write; the working directory inside).
    pub workdir: PathBuf,
    /// Where the workdir is seen inside (`--workdir-view`); `None`: at the same path.
    pub workdir_view: Option<PathBuf>,
    /// A directory covered with a private tmpfs before the mounts are bound (the mount root),
    /// so the host's directory shows nothing of the run.
    pub tmpfs: Option<PathBuf>,
    /// Cache mounts: `(where the mount is, where it is seen)`.
    pub mounts: Vec<(PathBuf, PathBuf)>,
    /// Environment variables set inside.
    pub env: BTreeMap<String, String>,
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// The bind and env arguments for `driver` (without the base sandbox a platform already has).
pub fn args(driver: Driver, binds: &Binds) -> Vec<String> {
    let mut out = Vec::new();
    let wd_view = binds.workdir_view.as_deref().unwrap_or(&binds.workdir);
    match driver {
        Driver::Bwrap => {
            out.extend(["--bind".into(), s(&binds.workdir), s(wd_view)]);
            if let Some(t) = &binds.tmpfs {
                out.extend(["--tmpfs".into(), s(t)]);
            }
            for (src, dst) in sorted(&binds.mounts) {
                out.extend(["--bind".into(), s(&src), s(&dst)]);
            }
            for (k, v) in &binds.env {
                out.extend(["--setenv".into(), k.clone(), v.clone()]);
            }
            out.extend(["--chdir".into(), s(wd_view)]);
        }
        Driver::Docker => {
            out.extend(["-v".into(), format!("{}:{}", s(&binds.workdir), s(wd_view))]);
            for (src, dst) in sorted(&binds.mounts) {
                out.extend(["-v".into(), format!("{}:{}", s(&src), s(&dst))]);
            }
            for (k, v) in &binds.env {
                out.extend(["-e".into(), format!("{k}={v}")]);
            }
            out.extend(["-w".into(), s(wd_view)]);
        }
    }
    out
}

/// Parents before children, so a mount inside the workdir (node_modules) is bound on top.
fn sorted(mounts: &[(PathBuf, PathBuf)]) -> Vec<(PathBuf, PathBuf)> {
    let mut m = mounts.to_vec();
    m.sort_by_key(|(_, p)| (p.components().count(), p.clone()));
    m
}

/// Quotes `words` for a POSIX shell, space-separated (shlex).
///
/// Errors: [`Error::Invalid`] when a word holds a NUL byte, which no shell word can.
pub fn shell_quote(words: &[String]) -> Result<String> {
    shlex::try_join(words.iter().map(String::as_str))
        .map_err(|e| Error::invalid(format!("cannot quote for a shell: {e}")))
}

/// A `bwrap` command running `argv` in a sandbox: the host root read-only, fresh `/dev`,
/// `/proc` and `/tmp`, `$HOME` writable (package managers keep logs and config there), the
/// workdir and each mount bound read-write, the env set, and the child killed with its parent.
///
/// With `user` (`--user`, issue 12), bwrap runs in a user namespace of its own
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

#[cfg(test)]
mod tests {
    use super::*;

    fn binds() -> Binds {
        Binds {
            workdir: "/w".into(),
            workdir_view: None,
            tmpfs: None,
            mounts: vec![
                ("/w/node_modules".into(), "/w/node_modules".into()),
                ("/cache/npm".into(), "/cache/npm".into()),
            ],
            env: [("npm_config_cache".to_string(), "/cache/npm".to_string())].into(),
        }
    }

    #[test]
    fn bwrap_args_bind_parents_first() {
        let a = args(Driver::Bwrap, &binds());
        let j = a.join(" ");
        assert!(
            j.starts_with("--bind /w /w --bind /cache/npm /cache/npm --bind /w/node_modules"),
            "{j}"
        );
        assert!(j.contains("--setenv npm_config_cache /cache/npm"), "{j}");
    }

    #[test]
    fn docker_args() {
        let a = args(Driver::Docker, &binds());
        let j = a.join(" ");
        assert!(j.contains("-v /cache/npm:/cache/npm"), "{j}");
        assert!(j.contains("-e npm_config_cache=/cache/npm"), "{j}");
        assert!(j.ends_with("-w /w"), "{j}");
        assert!(
            Driver::parse("podman")
                .unwrap_err()
                .to_string()
                .contains("--driver")
        );
    }

    #[test]
    fn quoting() {
        let words: Vec<String> = vec!["a".into(), "b c".into(), "it's".into(), "$(x)".into()];
        let q = shell_quote(&words).unwrap();
        assert_eq!(q, "a 'b c' \"it's\" '$(x)'");
        assert_eq!(shlex::split(&q).unwrap(), words);
    }
}
