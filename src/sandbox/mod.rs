//! Sandboxes for setup, maintenance and COMMAND: [`Sandbox`] (none, bwrap, docker) and what
//! each answers the run, the arguments a platform adds to its own bubblewrap or `docker run`
//! (`layercache sandbox-args`), and shell quoting. bubblewrap's runner is `bwrap.rs`,
//! Docker's `docker.rs`, the `--user` drop `user.rs`.
//!
//! Docker: the cache mounts must exist before the container starts and be mounted with
//! `allow_other` (layercache's overlay always is), so the daemon can bind them:
//! `docker run $(eval echo $(layercache sandbox-args --driver docker --spec S)) IMAGE …` gives
//! `-v /cache/<id>:/cache/<id>` per cache, `-v <workdir>:<workdir> -w <workdir>` and `-e K=V`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

mod bwrap;
pub mod docker;
pub mod user;

pub use bwrap::bwrap_user_preflight;

/// Where a run's setup, maintenance and COMMAND run (`--sandbox`, README "Sandboxes"), and
/// the answers the run asks of it: which host directories its views need
/// ([`Sandbox::host_view_dirs`]), which mounts it binds ([`Sandbox::binds_in_place`]), how a
/// step's command is built ([`Sandbox::host_command`]; Docker: [`docker::Docker::command`]).
#[derive(Debug, Clone)]
pub enum Sandbox {
    /// Directly, in a mount namespace of the step's own holding the views.
    None,
    /// Inside bubblewrap ([`bwrap::bwrap_command`]).
    Bwrap,
    /// Each step in a container of the run's image ([`docker`]).
    Docker(docker::Docker),
}

impl Sandbox {
    /// Parses `none`, `bwrap` (or `bubblewrap`) or `docker`; `docker` comes with an empty
    /// [`docker::Docker`] the caller fills in from the flags.
    ///
    /// Errors: [`Error::Invalid`] naming `--sandbox` and the valid names.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(Sandbox::None),
            "bwrap" | "bubblewrap" => Ok(Sandbox::Bwrap),
            "docker" => Ok(Sandbox::Docker(docker::Docker::default())),
            _ => Err(Error::invalid(format!(
                "--sandbox: unknown sandbox {s:?} (use none, bwrap or docker)"
            ))),
        }
    }

    /// The Docker settings of `--sandbox docker`; `None` for none and bwrap.
    pub fn docker(&self) -> Option<&docker::Docker> {
        match self {
            Sandbox::Docker(d) => Some(d),
            _ => None,
        }
    }

    /// Whether the host needs the directories of the views below the mount root and of the
    /// `--workdir-view`: not for Docker, whose containers have a root of their own (views below
    /// the workdir are bound inside the host's workdir by every sandbox).
    pub fn host_view_dirs(&self) -> bool {
        !matches!(self, Sandbox::Docker(_))
    }

    /// Whether a mount already at its view path on the host is bound too: only in a container,
    /// which sees nothing of the host's mounts it is not given.
    pub fn binds_in_place(&self) -> bool {
        matches!(self, Sandbox::Docker(_))
    }

    /// The command of one step on the host (none and bwrap): `step.argv` with `step.binds`'
    /// environment, in the workdir when `step.cwd` (bwrap: always its view). The caller adds
    /// what belongs to the run: the views' mount namespace when [`HostCommand::views_here`],
    /// an unprivileged run's nested user namespace when [`HostCommand::native`], the PID
    /// namespace and the `--user` drop.
    ///
    /// Errors: [`Error::Invalid`] for an empty `argv`, or for Docker (its steps are containers:
    /// [`docker::Docker::command`]).
    pub fn host_command(&self, step: &Step<'_>) -> Result<HostCommand> {
        match self {
            Sandbox::None => {
                let Some((program, rest)) = step.argv.split_first() else {
                    return Err(Error::invalid("sandbox: nothing to run"));
                };
                let mut cmd = std::process::Command::new(program);
                cmd.args(rest).envs(&step.binds.env);
                if step.cwd {
                    cmd.current_dir(&step.binds.workdir);
                }
                Ok(HostCommand {
                    cmd,
                    views_here: true,
                    native: true,
                })
            }
            Sandbox::Bwrap => {
                let (cmd, views_here) = bwrap::step(step.binds, step.argv, step.user, step.inner)?;
                Ok(HostCommand {
                    cmd,
                    views_here,
                    native: false,
                })
            }
            Sandbox::Docker(_) => Err(Error::invalid(
                "--sandbox docker: a step runs in a container, not on the host",
            )),
        }
    }
}

/// One step as [`Sandbox::host_command`] builds it.
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    /// The program and its arguments.
    pub argv: &'a [OsString],
    /// Workdir, its view, the mount root's tmpfs, each mount `(source, view path)`, the env.
    pub binds: &'a Binds,
    /// Run in the workdir (none; bwrap always runs in the workdir's view).
    pub cwd: bool,
    /// `--user` (resolved on the host): bwrap with a uid other than 0 runs unprivileged.
    pub user: Option<user::RunUser>,
    /// An unprivileged run's steps' ids inside (the user, unless `--user 0:0`): bwrap maps
    /// them itself.
    pub inner: Option<user::RunUser>,
}

/// A step's command on the host ([`Sandbox::host_command`]) and what the caller adds to it.
#[derive(Debug)]
pub struct HostCommand {
    /// The command (not spawned).
    pub cmd: std::process::Command,
    /// The views are set up in this process's own mount namespace before exec (none, and
    /// bwrap with `--user`).
    pub views_here: bool,
    /// The process is the step itself (none), not a sandbox starting it.
    pub native: bool,
}

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
    fn each_sandbox_answers_the_run() {
        let mut b = binds();
        b.mounts = vec![("/store/runs/r/mnt".into(), "/cache/npm".into())];
        let argv = vec![OsString::from("true")];
        let step = Step {
            argv: &argv,
            binds: &b,
            cwd: true,
            user: None,
            inner: None,
        };
        let words = |c: &std::process::Command| {
            let a: Vec<String> = c.get_args().map(|a| a.to_string_lossy().into()).collect();
            a.join(" ")
        };
        let none = Sandbox::None.host_command(&step).unwrap();
        assert!(none.views_here && none.native);
        assert_eq!(none.cmd.get_program(), "true");
        assert_eq!(none.cmd.get_current_dir(), Some(Path::new("/w")));
        // bwrap binds the mount's source itself.
        let bw = Sandbox::Bwrap.host_command(&step).unwrap();
        assert!(!bw.views_here && !bw.native);
        assert_eq!(bw.cmd.get_program(), "bwrap");
        assert!(words(&bw.cmd).contains("--bind /store/runs/r/mnt /cache/npm"));
        // bwrap as a --user: unprivileged, it binds each view from its view path, which the
        // caller has set up in the bwrap process's own namespace.
        let user = Some(user::RunUser {
            uid: 1000,
            gid: 1000,
        });
        let bw = Sandbox::Bwrap.host_command(&Step { user, ..step }).unwrap();
        assert!(bw.views_here && !bw.native);
        let w = words(&bw.cmd);
        assert!(w.contains("--unshare-user --uid 1000 --gid 1000"), "{w}");
        assert!(w.contains("--bind /cache/npm /cache/npm"), "{w}");
        assert!(!w.contains("/store/runs"), "{w}");
        // Docker: containers, no host view dirs, every mount bound.
        let docker = Sandbox::parse("docker").unwrap();
        assert!(docker.host_command(&step).is_err());
        assert!(!docker.host_view_dirs() && docker.binds_in_place());
        assert!(Sandbox::None.host_view_dirs() && !Sandbox::Bwrap.binds_in_place());
    }

    #[test]
    fn quoting() {
        let words: Vec<String> = vec!["a".into(), "b c".into(), "it's".into(), "$(x)".into()];
        let q = shell_quote(&words).unwrap();
        assert_eq!(q, "a 'b c' \"it's\" '$(x)'");
        assert_eq!(shlex::split(&q).unwrap(), words);
    }
}
