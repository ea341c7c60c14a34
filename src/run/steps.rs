//! How a run starts its steps ([`Steps`]): what each child sees ([`views`]), the command the
//! run's [`Sandbox`] makes of a step, and what the run adds to it — the views' mount
//! namespace, an unprivileged run's nested user namespace, the PID namespace, the `--user`
//! drop — then the step's end as its sandbox tells it ([`crate::sandbox::StepEnd`]).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::child::{Views, run_child, stopped};
use super::{Prep, RunConfig, pidns, rootless, tail};
use crate::error::{Error, IoContext, Result};
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
        }
    }

    /// Runs a setup or maintenance script (`sh -c`, cwd = workdir, stdin closed, stdout →
    /// stderr) in its own process group and, natively, its own mount namespace. Returns its
    /// status and, when stderr is not a terminal (and not with Docker), the last 64 KiB of
    /// its output ([`tail::Tee`]: passed through to stderr as it comes).
    pub(super) fn script(
        &self,
        env: &BTreeMap<String, String>,
        views: &Views,
        script: &str,
        label: &str,
    ) -> Result<(i32, Option<Vec<u8>>)> {
        let argv: Vec<OsString> = vec!["sh".into(), "-c".into(), script.into()];
        if let Sandbox::Docker(d) = self.sandbox {
            return Ok((self.docker(d, env, views, &argv, label, true)?, None));
        }
        let mut cmd = self.host_command(env, views, &argv, true, true)?;
        cmd.stdin(Stdio::null());
        let tee = (!std::io::stderr().is_terminal())
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
        let status = run_child(cmd, label, true, self.pid_namespace())?;
        let tail = tee.map(|t| t.finish(std::time::Duration::from_secs(2)));
        Ok((status, tail))
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
        if let Sandbox::Docker(d) = self.sandbox {
            let what = program.to_string_lossy().into_owned();
            return self.docker(d, env, views, command, &what, false);
        }
        let group = !std::io::stdin().is_terminal();
        let cmd = self.host_command(env, views, command, cwd, group)?;
        run_child(cmd, &program.to_string_lossy(), group, self.pid_namespace())
    }

    /// `argv` (not empty) as the sandbox builds it ([`Sandbox::host_command`]: directly, in
    /// its own mount namespace holding `views` and in the workdir when `cwd`, or inside
    /// bubblewrap), as the run's `--user` when it has one, under the init of a PID
    /// namespace of its own ([`pidns`]; `group`: the step leads a process group there, which
    /// forwarded signals reach).
    ///
    /// Unprivileged (`rootless`): natively, the step leaves the run namespace's root
    /// for a nested user namespace where it is the user ([`rootless::as_user`]); bwrap is
    /// started as that root and makes the same mapping itself (`--unshare-user --uid U --gid G`).
    ///
    /// Errors: [`Error::Invalid`] for a path with a NUL byte or an empty `argv`.
    fn host_command(
        &self,
        env: &BTreeMap<String, String>,
        views: &Views,
        argv: &[OsString],
        cwd: bool,
        group: bool,
    ) -> Result<Command> {
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
        };
        let built = self.sandbox.host_command(&step)?;
        let mut cmd = built.cmd;
        if built.views_here && !views.is_empty() {
            views.apply(&mut cmd)?;
        }
        if built.native
            && let Some(r) = &self.rootless
        {
            rootless::as_user(&mut cmd, r);
        }
        if cwd {
            // The shell keeps an inherited PWD naming the same directory as its cwd: with
            // `--workdir-view` that would be the host path. Tools see the view.
            cmd.env("PWD", self.paths.view_workdir());
        }
        if self.pid_namespace() {
            pidns::isolate(&mut cmd, group);
        }
        if let Some(user) = self.user {
            user.drop_privileges(&mut cmd);
        }
        Ok(cmd)
    }

    /// Whether the steps get a PID namespace of their own ([`pidns`]): always as root and in
    /// an unprivileged run's namespace; not for an unprivileged run without caches (no
    /// namespace of the run, so no privilege to make one).
    fn pid_namespace(&self) -> bool {
        self.rootless.is_some() || !rootless::needed()
    }

    /// Runs `argv` in a new container of the run ([`sandbox::docker`]); `script`:
    /// stdin closed and stdout → stderr, as for [`Steps::script`]. The container is removed by
    /// name when this returns, whatever happened.
    fn docker(
        &self,
        d: &sandbox::docker::Docker,
        env: &BTreeMap<String, String>,
        views: &Views,
        argv: &[OsString],
        what: &str,
        script: bool,
    ) -> Result<i32> {
        let container = sandbox::docker::Container::new(self.run_id);
        let binds = self.binds(env, views);
        let mut cmd = d.command(&binds, argv, &container, self.run_id, !script);
        if script {
            cmd.stdin(Stdio::null());
            if let Some(fd) = std::io::stderr().as_fd_owned() {
                cmd.stdout(Stdio::from(fd));
            }
        }
        let group = script || !std::io::stdin().is_terminal();
        let status = run_child(cmd, what, group, false)?;
        if status == sandbox::docker::UNSEEN_STATUS
            && stopped().is_none()
            && let Some(view) = d.unseen(
                &binds,
                &sandbox::docker::Container::new(self.run_id),
                self.run_id,
            )?
        {
            let host = std::env::var("DOCKER_HOST").unwrap_or_else(|_| "the default socket".into());
            return Err(Error::invalid(format!(
                "--sandbox docker: the Docker engine at {host} cannot see the cache mount bound \
                 at {view} (the container got an empty directory): dockerd must run in \
                 layercache's mount namespace or one its mounts propagate to (shared bind \
                 propagation), not rootless or remote; nothing was published"
            )));
        }
        Ok(status)
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
