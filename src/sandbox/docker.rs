//! `layercache run --sandbox docker`: setup, maintenance and COMMAND each run in a container of
//! the run's image (`docker run --rm --init`), with each cache's per-run mount (on the host,
//! `allow_other`, so dockerd can bind it) bound at its view path with `-v`, the workdir at its
//! view path (default `/workspace`) and the presets' environment passed with `-e`.
//!
//! Every container is named `layercache-<run id>-<n>` and labelled `layercache.run=<run id>`;
//! a [`Container`] guard removes it by that name (`docker rm -f`) on every exit path, so an
//! interrupted run leaves no container behind. `--init` makes signals the docker client
//! proxies (SIGINT/SIGTERM, `docker run`'s `--sig-proxy`) reach the script, which PID 1 of a
//! container would otherwise ignore.
//!
//! An engine that cannot see the mounts (dockerd in another mount namespace without shared
//! bind propagation, a rootless or remote engine) would bind an empty directory and let the
//! step fill it for nothing: every container's command runs behind a POSIX `sh` prologue
//! ([`MOUNT_CHECK`]) that finds each cache's view path as a `fuse.layercache` mount in
//! `/proc/self/mountinfo` and otherwise exits [`UNSEEN_STATUS`] before the command starts;
//! a step ending with that status is confirmed by one probe container ([`Docker::unseen`])
//! and reported as one line naming the cache's view path (nothing is published).
//!
//! Outside reference: docker-run(1) (`--rm`, `--init`, `--name`, `--label`, `-v`, `-e`, `-w`,
//! `--user`), docker-rm(1).

use std::ffi::OsString;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use super::{Binds, Driver, Step, StepCommand, StepEnd, args};
use crate::error::{Error, Result};

/// What `--sandbox docker` runs in.
#[derive(Debug, Clone, Default)]
pub struct Docker {
    /// The image (`--image`), a name or id the engine holds.
    pub image: String,
    /// Extra `docker run` arguments (`--docker-arg`, each one word, e.g. `--network=host`).
    pub args: Vec<String>,
    /// `--user` for the containers (`UID[:GID]` or a user name of the image).
    pub user: Option<String>,
    /// Where `user` came from (the flag or the spec's `user`), named by its errors.
    pub user_source: super::user::UserSource,
}

/// The first non-empty line of a command's stderr (docker's error), or its status.
fn first_line(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| out.status.to_string())
}

impl Docker {
    /// Checks, before anything is mounted, that a Docker engine answers, that it holds the
    /// image, and that `--user` names a user of the image (a numeric `UID[:GID]` always does).
    /// Returns the image's id (`sha256:…`, what the keys fingerprint: a rebuilt tag is another
    /// environment) and the `(uid, gid)` `--user` runs as in the image (`id -u`, `id -g` there).
    ///
    /// Errors: [`Error::Invalid`] (exit 2) naming `--sandbox docker` (no client or no engine,
    /// with `DOCKER_HOST`), `--image`, or the user as its source gave it (`--user USER` or
    /// `the spec's user USER`).
    pub fn preflight(&self) -> Result<(String, Option<(u32, u32)>)> {
        if self.image.is_empty() {
            return Err(Error::invalid(
                "--sandbox docker needs --image IMAGE (an image the Docker engine holds)",
            ));
        }
        let host = std::env::var("DOCKER_HOST").unwrap_or_else(|_| "the default socket".into());
        let out = Command::new("docker")
            .args(["version", "--format", "{{.Server.Version}}"])
            .output()
            .map_err(|e| {
                Error::invalid(format!(
                    "--sandbox docker: cannot run the docker client: {e} (install docker's CLI)"
                ))
            })?;
        if !out.status.success() {
            return Err(Error::invalid(format!(
                "--sandbox docker: no Docker engine answers at {host}: {}",
                first_line(&out)
            )));
        }
        let out = docker_output(&["image", "inspect", "--format", "{{.Id}}", &self.image])?;
        if !out.status.success() {
            return Err(Error::invalid(format!(
                "--image {}: the Docker engine at {host} has no such image (docker load or \
                 docker pull it first)",
                self.image
            )));
        }
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if let Some(user) = &self.user {
            let source = self.user_source;
            super::user::check_syntax(user, source)?;
            let out = docker_output(&[
                "run",
                "--rm",
                "--network=none",
                "--user",
                user,
                "--entrypoint",
                "sh",
                &self.image,
                "-c",
                "id -u && id -g",
            ])?;
            if !out.status.success() {
                return Err(Error::invalid(format!(
                    "{source} {user}: no such user or group in image {}: {}",
                    self.image,
                    first_line(&out)
                )));
            }
            let text = String::from_utf8_lossy(&out.stdout);
            let ids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
            if let [uid, gid] = ids[..] {
                return Ok((id, Some((uid, gid))));
            }
            return Err(Error::Failed(format!(
                "{source} {user}: `id -u; id -g` in image {} printed {text:?}",
                self.image
            )));
        }
        Ok((id, None))
    }

    /// A `docker run` command for `argv` in a new container `name` (see [`Container`]) of this
    /// image: `--rm --init --name NAME --label layercache.run=RUN_ID`, `-i` when `stdin`, the
    /// `--user`, the `--docker-arg`s, then the `-v`/`-e`/`-w` of `binds` ([`args`]); `argv`
    /// runs behind [`MOUNT_CHECK`] (the image needs a POSIX `sh`).
    pub fn command(
        &self,
        binds: &Binds,
        argv: &[OsString],
        name: &Container,
        run_id: &str,
        stdin: bool,
    ) -> Command {
        self.with_mode(binds, argv, name, run_id, stdin, "run")
    }

    /// [`Docker::command`] with [`MOUNT_CHECK`]'s MODE.
    fn with_mode(
        &self,
        binds: &Binds,
        argv: &[OsString],
        name: &Container,
        run_id: &str,
        stdin: bool,
        mode: &str,
    ) -> Command {
        let mut cmd = Command::new("docker");
        cmd.args(["run", "--rm", "--init", "--name", &name.0]);
        cmd.arg("--label").arg(format!("layercache.run={run_id}"));
        if stdin {
            cmd.arg("-i");
        }
        if let Some(u) = &self.user {
            cmd.args(["--user", u]);
        }
        cmd.args(&self.args);
        // dockerd takes a relative `-v` source for a volume name: binds are absolute paths.
        let abs = |p: &std::path::PathBuf| std::path::absolute(p).unwrap_or_else(|_| p.clone());
        let binds = Binds {
            workdir: abs(&binds.workdir),
            mounts: binds
                .mounts
                .iter()
                .map(|(s, d)| (abs(s), d.clone()))
                .collect(),
            ..binds.clone()
        };
        cmd.args(args(Driver::Docker, &binds));
        cmd.arg(&self.image);
        cmd.args(checked(&binds, mode, argv));
        cmd
    }

    /// After a step ended with [`UNSEEN_STATUS`]: runs one probe container (`true`) with the
    /// same arguments and returns the view path it does not see as a layercache mount,
    /// or `None` when it sees them all (the step's own command exited with that status).
    ///
    /// Errors: [`Error::Failed`] when the docker client cannot be run.
    pub fn unseen(&self, binds: &Binds, name: &Container, run_id: &str) -> Result<Option<String>> {
        let out = (self.with_mode(binds, &["true".into()], name, run_id, false, "probe"))
            .output()
            .map_err(|e| Error::Failed(format!("docker run (mount probe): {e}")))?;
        Ok((out.status.code() == Some(UNSEEN_STATUS))
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()))
    }
}

impl Docker {
    /// One step as a new container of the run ([`Docker::command`], named
    /// [`Container::new`]`(step.run_id)`): no views, user namespace or PID namespace of the
    /// run's (the container has its own root and `--init`), no output capture; its
    /// [`StepEnd`] holds the container's guard and the unseen-mount diagnosis.
    pub(super) fn step(&self, step: &Step<'_>) -> StepCommand {
        let container = Container::new(step.run_id);
        let cmd = self.command(step.binds, step.argv, &container, step.run_id, step.stdin);
        StepCommand {
            cmd,
            views_here: false,
            native: false,
            pid_namespace: false,
            tee: false,
            end: StepEnd(Some(Ran {
                docker: self.clone(),
                binds: step.binds.clone(),
                run_id: step.run_id.to_string(),
                _container: container,
            })),
        }
    }
}

/// A step's container, kept until the step's [`StepEnd`] is finished (then removed by name).
#[derive(Debug)]
pub(super) struct Ran {
    docker: Docker,
    binds: Binds,
    run_id: String,
    _container: Container,
}

impl Ran {
    /// The step's `status`, unless it is [`UNSEEN_STATUS`] (and the run was not
    /// `interrupted`) and a probe container ([`Docker::unseen`]) confirms that the engine does
    /// not see a cache mount.
    ///
    /// Errors: [`Error::Invalid`] naming `DOCKER_HOST` and the view path not seen;
    /// [`Error::Failed`] when the probe cannot be run.
    pub(super) fn finish(self, status: i32, interrupted: bool) -> Result<i32> {
        if status == UNSEEN_STATUS
            && !interrupted
            && let Some(view) =
                (self.docker).unseen(&self.binds, &Container::new(&self.run_id), &self.run_id)?
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

/// `--sandbox docker` in an unprivileged run of uid `uid`: refused, since no engine can see
/// mounts that live in the run's own namespaces.
pub(super) fn unprivileged_refusal(uid: u32) -> Error {
    Error::invalid(format!(
        "--sandbox docker as uid {uid}: no Docker engine can see an unprivileged run's cache \
         mounts (they live in the run's own user and mount namespaces, and rootless Docker \
         has namespaces of its own); use --sandbox none or bwrap, or run as root"
    ))
}

/// Refuses a run path of `named` (`(flag, path)`: the workdir, mount root, workdir view and
/// store) with a ':' in it, which `docker run -v SRC:DST` would split at (it would fail only
/// at the first step).
///
/// Errors: [`Error::Invalid`] naming the flag and the path.
pub(super) fn check_bind_paths(named: &[(&str, &std::path::Path)]) -> Result<()> {
    if let Some((flag, p)) = named
        .iter()
        .find(|(_, p)| std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()).contains(&b':'))
    {
        return Err(Error::invalid(format!(
            "{flag} {}: --sandbox docker cannot bind a path with ':' (docker run -v splits \
             at it); use a path without one",
            p.display()
        )));
    }
    Ok(())
}

/// The exit status of [`MOUNT_CHECK`] when a view path is not a layercache mount inside the
/// container.
pub const UNSEEN_STATUS: i32 = 213;

/// `sh -c MOUNT_CHECK MODE VIEW… -- COMMAND…`: each VIEW (escaped as mountinfo(5) escapes
/// mount points) must be the mount point of a `fuse.layercache` mount, else it exits
/// [`UNSEEN_STATUS`] (MODE `probe`: printing the first VIEW that is not); then it execs COMMAND.
pub const MOUNT_CHECK: &str = r#"while [ "$1" != -- ]; do
  s=
  while read -r _ _ _ _ p r; do
    if [ "$p" = "$1" ]; then case "$r" in *" - fuse.layercache "*) s=1 ;; esac; fi
  done < /proc/self/mountinfo
  if [ -z "$s" ]; then [ "$0" = probe ] && printf '%s
' "$1"; exit 213; fi
  shift
done
shift
exec "$@""#;

/// `path` as /proc/self/mountinfo writes a mount point (space, tab, newline and backslash as
/// `\ooo`).
fn mountinfo_escaped(path: &std::path::Path) -> String {
    let mut out = String::new();
    for c in path.to_string_lossy().chars() {
        match c {
            ' ' | '\t' | '\n' | '\\' => out.push_str(&format!("\\{:03o}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// `argv` behind [`MOUNT_CHECK`] for the view paths of `binds`' mounts.
fn checked(binds: &Binds, mode: &str, argv: &[OsString]) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec!["sh".into(), "-c".into(), MOUNT_CHECK.into(), mode.into()];
    out.extend(
        binds
            .mounts
            .iter()
            .map(|(_, v)| mountinfo_escaped(v).into()),
    );
    out.push("--".into());
    out.extend(argv.iter().cloned());
    out
}

fn docker_output(a: &[&str]) -> Result<std::process::Output> {
    Command::new("docker")
        .args(a)
        .output()
        .map_err(|e| Error::Failed(format!("docker {}: {e}", a.join(" "))))
}

/// The name of one container this run creates; Drop removes it (`docker rm -f NAME`, by this
/// exact name, never by pattern) in case `--rm` did not (interrupted, client killed). While it
/// lives, a watchdog — a `sh` of its own process group that checks once a second that this
/// process is alive — removes the container if this process dies without dropping the guard
/// (`kill -9`): the docker client would keep the container running otherwise.
#[derive(Debug)]
pub struct Container(String, Option<std::process::Child>);

static SEQ: AtomicU32 = AtomicU32::new(0);

/// The watchdog's script: `$1` is the pid to watch, `$2` the container.
const WATCHDOG: &str = "while kill -0 \"$1\" 2>/dev/null; do sleep 1; done; \
exec docker rm -f \"$2\" >/dev/null 2>&1";

impl Container {
    /// `layercache-<run_id>-<n>`, n counting this process's containers, with its watchdog
    /// (none if `sh` cannot be started; then only Drop removes the container).
    pub fn new(run_id: &str) -> Container {
        use std::os::unix::process::CommandExt;
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let name = format!("layercache-{run_id}-{n}");
        let watchdog = Command::new("sh")
            .args(["-c", WATCHDOG, "layercache-watchdog"])
            .arg(std::process::id().to_string())
            .arg(&name)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .ok();
        Container(name, watchdog)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        // This process removes it itself: the watchdog (ours, by its pid) is not needed.
        if let Some(mut w) = self.1.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        // "No such container" once --rm has removed it; nothing to report then.
        let _ = Command::new("docker")
            .args(["rm", "-f", &self.0])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_words() {
        let d = Docker {
            image: "img".into(),
            args: vec!["--network=host".into()],
            user: Some("1000:1000".into()),
            ..Default::default()
        };
        let binds = Binds {
            workdir: "/w".into(),
            workdir_view: Some("/workspace".into()),
            mounts: vec![("/s/runs/r/mnt".into(), "/cache/npm".into())],
            ..Default::default()
        };
        let c = Container("layercache-r1-0".into(), None);
        let cmd = d.command(&binds, &["true".into()], &c, "r1", false);
        let w: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let j = w.join(" ");
        assert!(
            j.starts_with("run --rm --init --name layercache-r1-"),
            "{j}"
        );
        assert!(j.contains("--label layercache.run=r1 --user 1000:1000 --network=host"));
        assert!(j.contains("-v /w:/workspace -v /s/runs/r/mnt:/cache/npm -w /workspace img sh -c"));
        assert!(j.ends_with(" run /cache/npm -- true"), "{j}");
        assert_eq!(
            mountinfo_escaped(std::path::Path::new("/a b\\c")),
            "/a\\040b\\134c"
        );
        std::mem::forget(c); // no engine in unit tests: nothing to remove
    }
}
