//! How a run starts its steps ([`Steps`]): what each child sees ([`views`]), the command the
//! run's [`Sandbox`] makes of a step, and what the run adds to it — the views' mount
//! namespace, an unprivileged run's nested user namespace, the PID namespace, the `--user`
//! drop — then the step's end as its sandbox tells it ([`crate::sandbox::StepEnd`]).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use super::child::{Views, run_child, stopped};
use super::{Prep, RunConfig, pidns, rootless, tail};
use crate::error::{IoContext, Result};
use crate::sandbox::{self, Binds, Sandbox};
use crate::spec::Paths;

/// What the children of the run see: the workdir at its view path, each cache's private mount
/// at its view path (parents first; one already there only when the sandbox binds it anyway,
/// [`Sandbox::binds_in_place`]), and a private tmpfs over the mount root when a view lies
/// below it.
pub(super) fn views(sandbox: &Sandbox, paths: &Paths, preps: &[Prep]) -> Views {
    let mut binds: Vec<(PathBuf, PathBuf)> = preps
        .iter()
        .filter(|p| sandbox.binds_in_place() || p.mounted.source != p.keys.mountpoint)
        .map(|p| (p.mounted.source.clone(), p.keys.mountpoint.clone()))
        .collect();
    binds.sort_by_key(|(_, v)| (v.components().count(), v.clone()));
    let root = &paths.mount_root;
    Views {
        workdir: (paths.workdir_view.clone()).map(|v| (paths.workdir.clone(), v)),
        mount_root: binds
            .iter()
            .any(|(_, v)| v.starts_with(root))
            .then(|| root.clone()),
        binds,
    }
}

/// What every step of a run is started with — the parts of [`RunConfig`] a step uses.
pub(super) struct Steps<'a> {
    sandbox: &'a Sandbox,
    /// The run's workdir, its view and the mount root.
    pub(super) paths: &'a Paths,
    /// `--user` of none and bwrap, resolved on the host.
    user: Option<sandbox::user::RunUser>,
    rootless: Option<rootless::Rootless>,
    run_id: &'a str,
    /// The store root: hidden from a bubblewrap step ([`Binds::hidden`]).
    store: &'a Path,
}

impl<'a> Steps<'a> {
    /// The step settings of `cfg`.
    pub(super) fn of(cfg: &'a RunConfig) -> Self {
        Steps {
            sandbox: &cfg.sandbox,
            paths: &cfg.paths,
            user: cfg.user,
            rootless: cfg.rootless,
            run_id: &cfg.run_id,
            store: &cfg.store,
        }
    }

    /// The sandbox's view of [`views`] plus the environment.
    fn binds(&self, env: &BTreeMap<String, String>, views: &Views) -> Binds {
        Binds {
            workdir: self.paths.workdir.clone(),
            workdir_view: self.paths.workdir_view.clone(),
            tmpfs: views.mount_root.clone(),
            mounts: views.binds.clone(),
            env: env.clone(),
            hidden: vec![self.store.to_path_buf()],
        }
    }

    /// Runs a setup or maintenance script (`sh -c`, cwd = workdir, stdin closed, stdout →
    /// stderr) in its own process group and, natively, its own mount namespace. Returns its
    /// status and, when stderr is not a terminal and the sandbox lets its output be captured
    /// ([`sandbox::StepCommand::tee`]), the last 64 KiB of its output ([`tail::Tee`]: passed
    /// through to stderr as it comes).
    pub(super) fn script(
        &self,
        env: &BTreeMap<String, String>,
        views: &Views,
        script: &str,
        label: &str,
    ) -> Result<(i32, Option<Vec<u8>>)> {
        let argv: Vec<OsString> = vec!["sh".into(), "-c".into(), script.into()];
        let step = self.step(env, views, &argv, true, true, false)?;
        let mut cmd = step.cmd;
        cmd.stdin(Stdio::null());
        let tee = (step.tee && !std::io::stderr().is_terminal())
            .then(tail::Tee::start)
            .and_then(|t| t.ok());
        match &tee {
            Some(t) => {
                cmd.stdout(t.stdio().at("pipe")?);
                cmd.stderr(t.stdio().at("pipe")?);
            }
            None => {
                if let Some(fd) = std::io::stderr().as_fd_owned() {
                    cmd.stdout(Stdio::from(fd));
                }
            }
        }
        let status = run_child(cmd, label, true, step.pid_namespace)?;
        let tail = tee.map(|t| t.finish(std::time::Duration::from_secs(2)));
        Ok((step.end.finish(status, stopped().is_some())?, tail))
    }

    /// Runs COMMAND with stdio inherited (in the workdir when `cwd`: a run with caches); no
    /// COMMAND = status 0. It leads a process group of its own unless it reads from a
    /// terminal (a job-control shell needs the terminal's group).
    pub(super) fn command(
        &self,
        command: &[OsString],
        cwd: bool,
        env: &BTreeMap<String, String>,
        views: &Views,
    ) -> Result<i32> {
        let Some(program) = command.first() else {
            return Ok(0);
        };
        let group = !std::io::stdin().is_terminal();
        let step = self.step(env, views, command, cwd, group, true)?;
        let what = program.to_string_lossy();
        let status = run_child(step.cmd, &what, group, step.pid_namespace)?;
        step.end.finish(status, stopped().is_some())
    }

    /// `argv` (not empty) as the run's sandbox makes it ([`Sandbox::command`]: directly, in
    /// the workdir when `cwd`; inside bubblewrap; or in a container of the run), with what the
    /// run adds as the [`sandbox::StepCommand`] says: its own mount namespace holding `views`
    /// (`views_here`), as the run's `--user` when it has one, under the init of a PID
    /// namespace of its own ([`pidns`], `pid_namespace`; `group`: the step leads a process
    /// group there, which forwarded signals reach). `stdin`: the step reads the run's stdin
    /// (COMMAND).
    ///
    /// Unprivileged (`rootless`): natively, the step leaves the run namespace's root
    /// for a nested user namespace where it is the user ([`rootless::as_user`]); bwrap is
    /// started as that root and makes the same mapping itself (`--unshare-user --uid U --gid G`).
    ///
    /// Errors: [`Error::Invalid`] for a path with a NUL byte or an empty `argv`.
    fn step(
        &self,
        env: &BTreeMap<String, String>,
        views: &Views,
        argv: &[OsString],
        cwd: bool,
        group: bool,
        stdin: bool,
    ) -> Result<sandbox::StepCommand> {
        // Unprivileged: the ids the steps have inside (themselves, unless `--user 0:0`).
        let inner = (self.rootless.filter(|r| !r.as_root)).map(|r| sandbox::user::RunUser {
            uid: r.uid,
            gid: r.gid,
        });
        let binds = self.binds(env, views);
        let step = sandbox::Step {
            argv,
            binds: &binds,
            cwd,
            user: self.user,
            inner,
            stdin,
            run_id: self.run_id,
        };
        let mut built = self.sandbox.command(&step)?;
        if built.views_here && !views.is_empty() {
            views.apply(&mut built.cmd)?;
        }
        if built.native
            && let Some(r) = &self.rootless
        {
            rootless::as_user(&mut built.cmd, r);
        }
        built.pid_namespace &= self.pid_namespace();
        if built.pid_namespace {
            pidns::isolate(&mut built.cmd, group);
        }
        if let Some(user) = self.user {
            user.drop_privileges(&mut built.cmd);
        }
        Ok(built)
    }

    /// Whether the steps get a PID namespace of their own ([`pidns`]): always as root and in
    /// an unprivileged run's namespace; not for an unprivileged run without caches (no
    /// namespace of the run, so no privilege to make one).
    fn pid_namespace(&self) -> bool {
        self.rootless.is_some() || !rootless::needed()
    }
}

trait StderrFd {
    fn as_fd_owned(&self) -> Option<std::os::fd::OwnedFd>;
}

impl StderrFd for std::io::Stderr {
    fn as_fd_owned(&self) -> Option<std::os::fd::OwnedFd> {
        use std::os::fd::AsFd;
        self.as_fd().try_clone_to_owned().ok()
    }
}
