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
//! Outside reference: docker-run(1) (`--rm`, `--init`, `--name`, `--label`, `-v`, `-e`, `-w`,
//! `--user`), docker-rm(1).

use std::ffi::OsString;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use super::{Binds, Driver, args};
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
    /// Returns the `(uid, gid)` `--user` runs as in the image (`id -u`, `id -g` there).
    ///
    /// Errors: [`Error::Invalid`] (exit 2) naming `--sandbox docker` (no client or no engine,
    /// with `DOCKER_HOST`), `--image` or `--user`.
    pub fn preflight(&self) -> Result<Option<(u32, u32)>> {
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
        if let Some(user) = &self.user {
            check_user_syntax(user)?;
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
                    "--user {user}: no such user in image {}: {}",
                    self.image,
                    first_line(&out)
                )));
            }
            let text = String::from_utf8_lossy(&out.stdout);
            let ids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
            if let [uid, gid] = ids[..] {
                return Ok(Some((uid, gid)));
            }
            return Err(Error::Failed(format!(
                "--user {user}: `id -u; id -g` in image {} printed {text:?}",
                self.image
            )));
        }
        Ok(None)
    }

    /// A `docker run` command for `argv` in a new container `name` (see [`Container`]) of this
    /// image: `--rm --init --name NAME --label layercache.run=RUN_ID`, `-i` when `stdin`, the
    /// `--user`, the `--docker-arg`s, then the `-v`/`-e`/`-w` of `binds` ([`args`]).
    pub fn command(
        &self,
        binds: &Binds,
        argv: &[OsString],
        name: &Container,
        run_id: &str,
        stdin: bool,
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
        cmd.args(argv);
        cmd
    }
}

fn docker_output(a: &[&str]) -> Result<std::process::Output> {
    Command::new("docker")
        .args(a)
        .output()
        .map_err(|e| Error::Failed(format!("docker {}: {e}", a.join(" "))))
}

/// `--user`: `UID`, `UID:GID`, `NAME` or `NAME:GROUP` (docker-run(1)'s forms).
///
/// Errors: [`Error::Invalid`] naming `--user` for an empty part or characters no user name has.
pub fn check_user_syntax(user: &str) -> Result<()> {
    let ok_part = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    };
    let mut parts = user.splitn(2, ':');
    let u = parts.next().unwrap_or_default();
    let g = parts.next();
    if ok_part(u) && g.is_none_or(ok_part) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "--user {user:?}: use UID, UID:GID, NAME or NAME:GROUP"
        )))
    }
}

/// The name of one container this run creates; Drop removes it (`docker rm -f NAME`, by this
/// exact name, never by pattern) in case `--rm` did not (interrupted, client killed).
#[derive(Debug)]
pub struct Container(String);

static SEQ: AtomicU32 = AtomicU32::new(0);

impl Container {
    /// `layercache-<run_id>-<n>`, n counting this process's containers.
    pub fn new(run_id: &str) -> Container {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        Container(format!("layercache-{run_id}-{n}"))
    }

    /// The container's name.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl Drop for Container {
    fn drop(&mut self) {
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
    fn user_syntax() {
        for ok in ["1000", "1000:1000", "user1000", "user1000:user1000"] {
            check_user_syntax(ok).unwrap();
        }
        for bad in ["", ":", "1000:", "a b", "x;y"] {
            assert!(
                check_user_syntax(bad)
                    .unwrap_err()
                    .to_string()
                    .contains("--user")
            );
        }
    }

    #[test]
    fn command_words() {
        let d = Docker {
            image: "img".into(),
            args: vec!["--network=host".into()],
            user: Some("1000:1000".into()),
        };
        let binds = Binds {
            workdir: "/w".into(),
            workdir_view: Some("/workspace".into()),
            mounts: vec![("/s/runs/r/mnt".into(), "/cache/npm".into())],
            ..Default::default()
        };
        let c = Container::new("r1");
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
        assert!(j.contains("-v /w:/workspace -v /s/runs/r/mnt:/cache/npm -w /workspace img true"));
        std::mem::forget(c); // no engine in unit tests
    }
}
