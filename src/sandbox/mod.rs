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
use user::{RunUser, UserSource};

/// Where a run's setup, maintenance and COMMAND run (`--sandbox`, docs/sandboxes.md), and
/// the one method set the run asks of it without naming the variant: its preflight
/// ([`Sandbox::host_user`], [`Sandbox::unprivileged_refusal`], [`Sandbox::preflight`],
/// [`Sandbox::check_bind_paths`]), what its views need ([`Sandbox::host_view_dirs`],
/// [`Sandbox::binds_in_place`], [`Sandbox::default_workdir_view`]), what the keys
/// fingerprint ([`Sandbox::tools_in_image`]) and how a step becomes a command
/// ([`Sandbox::command`], finished by [`StepEnd::finish`]).
///
/// Adding a sandbox (a container engine such as podman) is a variant here, its arms in these
/// methods and its module beside `docker.rs`.
#[derive(Debug, Clone)]
pub enum Sandbox {
    /// Directly, in a mount namespace of the step's own holding the views.
    None,
    /// Inside bubblewrap ([`bwrap::bwrap_command`]).
    Bwrap,
    /// Each step in a container of the run's image ([`docker`]).
    Docker(docker::Docker),
}

/// The flags a container sandbox is configured from: `--image`, `--docker-arg`s, and the
/// user (`--user`, else the spec's `user`, as `user_source` says).
#[derive(Debug, Clone, Default)]
pub struct ContainerFlags {
    /// `--image`: the image the containers run (a name or id the engine holds).
    pub image: Option<String>,
    /// `--docker-arg`s: extra words for the engine's `run`, each one word.
    pub engine_args: Vec<String>,
    /// `--user`, else the spec's `user` (`UID[:GID]` or a name of the image).
    pub user: Option<String>,
    /// Where `user` came from, named by its errors.
    pub user_source: UserSource,
}

/// What [`Sandbox::preflight`] found: the image that enters the keys and the ids the steps
/// run as (the overlay maps the mounts' ownership to them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checked {
    /// The image that enters the keys: a container's image id (`sha256:…`), else `--image`
    /// as given.
    pub image: Option<String>,
    /// `(uid, gid)` the steps run as, when a user was given (a container: as the image
    /// resolves it).
    pub ids: Option<(u32, u32)>,
}

impl Sandbox {
    /// Parses `none`, `bwrap` (or `bubblewrap`) or `docker`; `docker` comes with an empty
    /// [`docker::Docker`] that [`Sandbox::with_flags`] fills in.
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

    /// This sandbox configured from `flags`: a container takes the image, the engine
    /// arguments and the user; none and bwrap take none of them (their user is resolved on the
    /// host, [`Sandbox::host_user`]).
    ///
    /// Errors: [`Error::Invalid`] for `--docker-arg` without `--sandbox docker`.
    pub fn with_flags(self, flags: ContainerFlags) -> Result<Sandbox> {
        match self {
            Sandbox::Docker(_) => Ok(Sandbox::Docker(docker::Docker {
                image: flags.image.unwrap_or_default(),
                args: flags.engine_args,
                user: flags.user,
                user_source: flags.user_source,
            })),
            _ if !flags.engine_args.is_empty() => {
                Err(Error::invalid("--docker-arg needs --sandbox docker"))
            }
            other => Ok(other),
        }
    }

    /// Where the workdir is seen when `--workdir-view` is not given: `/workspace` in a
    /// container (a stable path, so path-bound trees hit from any checkout); `None` (its own
    /// path) for none and bwrap.
    pub fn default_workdir_view(&self) -> Option<&'static Path> {
        match self {
            Sandbox::Docker(_) => Some(Path::new("/workspace")),
            Sandbox::None | Sandbox::Bwrap => None,
        }
    }

    /// Whether the tools run inside an image whose id stands for their versions in the keys
    /// (a container), rather than the host's tools.
    pub fn tools_in_image(&self) -> bool {
        matches!(self, Sandbox::Docker(_))
    }

    /// The user the steps run as, resolved on the host from `user` (given as `source`):
    /// none and bwrap; `None` for a container (the image resolves it, [`Sandbox::preflight`])
    /// and without a user.
    ///
    /// Errors: as [`RunUser::resolve`].
    pub fn host_user(&self, user: Option<&str>, source: UserSource) -> Result<Option<RunUser>> {
        match (self, user) {
            (Sandbox::Docker(_), _) | (_, None) => Ok(None),
            (Sandbox::None | Sandbox::Bwrap, Some(u)) => RunUser::resolve(u, source).map(Some),
        }
    }

    /// Why this sandbox cannot serve an unprivileged run of uid `uid` (whose mounts live in
    /// the run's own user and mount namespaces), or `None` when it can (none, bwrap).
    pub fn unprivileged_refusal(&self, uid: u32) -> Option<Error> {
        match self {
            Sandbox::Docker(_) => Some(docker::unprivileged_refusal(uid)),
            Sandbox::None | Sandbox::Bwrap => None,
        }
    }

    /// The sandbox's checks before anything is mounted: bwrap, that it can run as `user`
    /// (a host user other than root, [`bwrap_user_preflight`]); a container, that the engine
    /// answers, holds the image and knows the user ([`docker::Docker::preflight`]). `user`:
    /// the host user of [`Sandbox::host_user`] (given as `source`); `image`: `--image`.
    ///
    /// Errors: [`Error::Invalid`] (exit 2) naming the user, the image or what the machine
    /// refuses.
    pub fn preflight(
        &self,
        user: Option<RunUser>,
        source: UserSource,
        image: Option<String>,
    ) -> Result<Checked> {
        let ids = user.map(|u| (u.uid, u.gid));
        match self {
            Sandbox::None => Ok(Checked { image, ids }),
            Sandbox::Bwrap => {
                if let Some(u) = user.filter(|u| u.uid != 0) {
                    bwrap_user_preflight(u, source)?;
                }
                Ok(Checked { image, ids })
            }
            Sandbox::Docker(d) => {
                let (id, ids) = d.preflight()?;
                Ok(Checked {
                    image: Some(id),
                    ids,
                })
            }
        }
    }

    /// Checks the host paths the run binds, each `(flag, path)`: a container refuses a path
    /// with a ':' (`docker run -v` splits at it); none and bwrap take any.
    ///
    /// Errors: [`Error::Invalid`] naming the flag and the path.
    pub fn check_bind_paths(&self, named: &[(&str, &Path)]) -> Result<()> {
        match self {
            Sandbox::Docker(_) => docker::check_bind_paths(named),
            Sandbox::None | Sandbox::Bwrap => Ok(()),
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

    /// The command of one step: `step.argv` with `step.binds`' environment — none: directly,
    /// in the workdir when `step.cwd` (with `PWD` its view); bwrap: inside bubblewrap (always
    /// in the workdir's view); Docker: `docker run` of a new container of the run
    /// ([`docker::Docker::command`]). The caller adds what belongs to the run, as the
    /// [`StepCommand`]'s flags say: the views' mount namespace ([`StepCommand::views_here`]),
    /// an unprivileged run's nested user namespace ([`StepCommand::native`]), the PID
    /// namespace ([`StepCommand::pid_namespace`]) and the `--user` drop; after the step,
    /// [`StepEnd::finish`].
    ///
    /// Errors: [`Error::Invalid`] for an empty `argv`.
    pub fn command(&self, step: &Step<'_>) -> Result<StepCommand> {
        if step.argv.is_empty() {
            return Err(Error::invalid("sandbox: nothing to run"));
        }
        // The shell keeps an inherited PWD naming the same directory as its cwd: with
        // `--workdir-view` that would be the host path. Tools see the view.
        let view_wd = (step.binds.workdir_view.as_ref()).unwrap_or(&step.binds.workdir);
        let host = |cmd: std::process::Command, views_here, native| StepCommand {
            cmd,
            views_here,
            native,
            pid_namespace: true,
            tee: true,
            end: StepEnd::default(),
        };
        let mut built = match self {
            Sandbox::None => {
                let mut cmd = std::process::Command::new(&step.argv[0]);
                cmd.args(&step.argv[1..]).envs(&step.binds.env);
                if step.cwd {
                    cmd.current_dir(&step.binds.workdir);
                }
                host(cmd, true, true)
            }
            Sandbox::Bwrap => {
                let (cmd, views_here) = bwrap::step(step.binds, step.argv, step.user, step.inner)?;
                host(cmd, views_here, false)
            }
            Sandbox::Docker(d) => return Ok(d.step(step)),
        };
        if step.cwd {
            built.cmd.env("PWD", view_wd);
        }
        Ok(built)
    }
}

/// One step (setup, maintenance or COMMAND) as [`Sandbox::command`] builds it.
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    /// The program and its arguments.
    pub argv: &'a [OsString],
    /// Workdir, its view, the mount root's tmpfs, each mount `(source, view path)`, the env.
    pub binds: &'a Binds,
    /// Run in the workdir (none; bwrap always runs in the workdir's view, a container in its
    /// `-w`).
    pub cwd: bool,
    /// `--user` (resolved on the host): bwrap with a uid other than 0 runs unprivileged.
    pub user: Option<user::RunUser>,
    /// An unprivileged run's steps' ids inside (the user, unless `--user 0:0`): bwrap maps
    /// them itself.
    pub inner: Option<user::RunUser>,
    /// The step reads the run's stdin (COMMAND; a container gets `-i`), not `/dev/null`
    /// (setup and maintenance).
    pub stdin: bool,
    /// The run's id: a container is named and labelled with it.
    pub run_id: &'a str,
}

/// A step's command ([`Sandbox::command`]) and what the caller adds to it.
#[derive(Debug)]
pub struct StepCommand {
    /// The command (not spawned).
    pub cmd: std::process::Command,
    /// The views are set up in this process's own mount namespace before exec (none, and
    /// bwrap with `--user`).
    pub views_here: bool,
    /// The process is the step itself (none), not a sandbox starting it.
    pub native: bool,
    /// The run may start it under the init of a PID namespace of its own (none, bwrap); a
    /// container has its own init (`--init`).
    pub pid_namespace: bool,
    /// The run may capture its output through a pipe (the tail a failed setup keeps): none
    /// and bwrap; a container's goes straight to stderr.
    pub tee: bool,
    /// What is left to do once the step has exited ([`StepEnd::finish`]).
    pub end: StepEnd,
}

/// What a step leaves to do after it exits: for a container, its guard (which removes it by
/// name when dropped) and the unseen-mount diagnosis ([`docker::UNSEEN_STATUS`]); nothing for
/// none and bwrap.
#[derive(Debug, Default)]
pub struct StepEnd(Option<docker::Ran>);

impl StepEnd {
    /// The step's exit `status`, once its sandbox has looked at it (`interrupted`: a signal
    /// stopped the run, so a status is no diagnosis). A container that exited
    /// [`docker::UNSEEN_STATUS`] is confirmed by one probe container; then the engine could
    /// not see a cache mount.
    ///
    /// Errors: [`Error::Invalid`] naming the view path the engine could not see (nothing may
    /// be published); [`Error::Failed`] when the probe cannot be run.
    pub fn finish(self, status: i32, interrupted: bool) -> Result<i32> {
        match self.0 {
            Some(ran) => ran.finish(status, interrupted),
            None => Ok(status),
        }
    }
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
    /// Host directories bubblewrap covers with an empty read-only tmpfs once the mounts are
    /// bound: the store, whose serve token, key salts and other projects' layers a step must
    /// not read through the read-only host root (`--sandbox bwrap`). One that holds the
    /// workdir's or a mount's view is left visible (covering it would hide the view).
    pub hidden: Vec<PathBuf>,
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
            let seen =
                || std::iter::once(wd_view).chain(binds.mounts.iter().map(|(_, d)| d.as_path()));
            for h in &binds.hidden {
                if seen().any(|v| v.starts_with(h)) {
                    tracing::warn!(
                        "{} holds a view of the run: it stays visible inside the sandbox",
                        h.display()
                    );
                    continue;
                }
                out.extend(["--tmpfs".into(), s(h), "--remount-ro".into(), s(h)]);
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
            hidden: Vec::new(),
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

    /// The store is covered after the mounts whose sources are in it are bound; a store that
    /// holds a view stays (covering it would hide the view).
    #[test]
    fn bwrap_args_hide_the_store_after_binding_from_it() {
        let mut b = binds();
        b.mounts = vec![("/s/runs/r/mnt".into(), "/cache/npm".into())];
        b.hidden = vec!["/s".into()];
        let j = args(Driver::Bwrap, &b).join(" ");
        assert!(
            j.contains("--bind /s/runs/r/mnt /cache/npm --tmpfs /s --remount-ro /s --setenv"),
            "{j}"
        );
        b.hidden = vec!["/cache".into()];
        let j = args(Driver::Bwrap, &b).join(" ");
        assert!(!j.contains("--tmpfs"), "{j}");
        b.hidden = vec!["/".into()];
        let j = args(Driver::Bwrap, &b).join(" ");
        assert!(!j.contains("--tmpfs"), "{j}");
        assert!(!args(Driver::Docker, &b).join(" ").contains("/s "));
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
            stdin: false,
            run_id: "r",
        };
        let words = |c: &std::process::Command| {
            let a: Vec<String> = c.get_args().map(|a| a.to_string_lossy().into()).collect();
            a.join(" ")
        };
        let pwd = |c: &std::process::Command| {
            c.get_envs()
                .find(|(k, _)| *k == "PWD")
                .and_then(|(_, v)| v.map(|v| v.to_os_string()))
        };
        let none = Sandbox::None.command(&step).unwrap();
        assert!(none.views_here && none.native && none.pid_namespace && none.tee);
        assert_eq!(none.cmd.get_program(), "true");
        assert_eq!(none.cmd.get_current_dir(), Some(Path::new("/w")));
        assert_eq!(pwd(&none.cmd), Some("/w".into()));
        // bwrap binds the mount's source itself.
        let bw = Sandbox::Bwrap.command(&step).unwrap();
        assert!(!bw.views_here && !bw.native && bw.pid_namespace);
        assert_eq!(bw.cmd.get_program(), "bwrap");
        assert!(words(&bw.cmd).contains("--bind /store/runs/r/mnt /cache/npm"));
        assert_eq!(pwd(&bw.cmd), Some("/w".into()));
        // bwrap as a --user: unprivileged, it binds each view from its view path, which the
        // caller has set up in the bwrap process's own namespace.
        let user = Some(user::RunUser {
            uid: 1000,
            gid: 1000,
        });
        let bw = Sandbox::Bwrap.command(&Step { user, ..step }).unwrap();
        assert!(bw.views_here && !bw.native);
        let w = words(&bw.cmd);
        assert!(w.contains("--unshare-user --uid 1000 --gid 1000"), "{w}");
        assert!(w.contains("--bind /cache/npm /cache/npm"), "{w}");
        assert!(!w.contains("/store/runs"), "{w}");
        assert_eq!(
            bw.end.finish(213, false).unwrap(),
            213,
            "no diagnosis on the host"
        );
        // Docker: a container of the run per step (its own root, init and output), no host
        // view dirs, every mount bound.
        let docker = Sandbox::parse("docker").unwrap();
        let c = docker.command(&step).unwrap();
        assert!(!c.views_here && !c.native && !c.pid_namespace && !c.tee);
        assert_eq!(c.cmd.get_program(), "docker");
        assert!(words(&c.cmd).starts_with("run --rm --init --name layercache-r-"));
        assert_eq!(pwd(&c.cmd), None);
        assert!(!docker.host_view_dirs() && docker.binds_in_place());
        assert!(Sandbox::None.host_view_dirs() && !Sandbox::Bwrap.binds_in_place());
        let empty = Step { argv: &[], ..step };
        for s in [Sandbox::None, Sandbox::Bwrap, docker] {
            assert!(s.command(&empty).is_err());
        }
    }

    #[test]
    fn sandbox_mode_parses() {
        assert!(matches!(Sandbox::parse("bwrap").unwrap(), Sandbox::Bwrap));
        assert!(matches!(
            Sandbox::parse("docker").unwrap(),
            Sandbox::Docker(_)
        ));
        assert!(
            Sandbox::parse("x")
                .unwrap_err()
                .to_string()
                .contains("--sandbox")
        );
    }

    /// The flags configure a container and nothing else; the preflight answers of each
    /// sandbox that the run asks without naming it.
    #[test]
    fn each_sandbox_answers_the_preflight() {
        let flags = ContainerFlags {
            image: Some("img".into()),
            engine_args: vec!["--network=host".into()],
            user: Some("1000".into()),
            user_source: UserSource::Spec,
        };
        let Sandbox::Docker(d) = Sandbox::parse("docker")
            .unwrap()
            .with_flags(flags.clone())
            .unwrap()
        else {
            panic!("docker configured as another sandbox");
        };
        assert_eq!((d.image.as_str(), d.args.len()), ("img", 1));
        assert_eq!(d.user_source, UserSource::Spec);
        let e = Sandbox::Bwrap.with_flags(flags).unwrap_err().to_string();
        assert!(e.contains("--docker-arg needs --sandbox docker"), "{e}");
        let docker = Sandbox::Docker(d);
        assert_eq!(docker.default_workdir_view(), Some(Path::new("/workspace")));
        assert_eq!(Sandbox::None.default_workdir_view(), None);
        assert!(docker.tools_in_image() && !Sandbox::Bwrap.tools_in_image());
        // A container resolves the user in its image, not on the host.
        assert_eq!(
            docker.host_user(Some("1000"), UserSource::Flag).unwrap(),
            None
        );
        assert!(docker.unprivileged_refusal(1000).is_some());
        assert!(Sandbox::None.unprivileged_refusal(1000).is_none());
        let colon = [("--workdir", Path::new("/w:x"))];
        let e = docker.check_bind_paths(&colon).unwrap_err().to_string();
        assert!(
            e.starts_with("--workdir /w:x: --sandbox docker cannot bind"),
            "{e}"
        );
        assert!(Sandbox::Bwrap.check_bind_paths(&colon).is_ok());
        let checked = Sandbox::None
            .preflight(
                Some(user::RunUser { uid: 7, gid: 8 }),
                UserSource::Flag,
                Some("id".into()),
            )
            .unwrap();
        assert_eq!(checked.image.as_deref(), Some("id"));
        assert_eq!(checked.ids, Some((7, 8)));
    }

    #[test]
    fn quoting() {
        let words: Vec<String> = vec!["a".into(), "b c".into(), "it's".into(), "$(x)".into()];
        let q = shell_quote(&words).unwrap();
        assert_eq!(q, "a 'b c' \"it's\" '$(x)'");
        assert_eq!(shlex::split(&q).unwrap(), words);
    }
}
