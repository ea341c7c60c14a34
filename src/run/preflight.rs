//! The run's preflight: what `layercache run` checks and settles before anything is mounted —
//! the run's paths ([`paths`]), the user and the sandbox's own checks (an unprivileged run's
//! refusals, bwrap as a user, a container engine's image and user), the host directories the
//! views are built on, the store's trust, and the paths the sandbox binds — into the
//! [`RunConfig`] the run takes ([`preflight`]). The CLI only parses the flags into a
//! [`Request`]; the sandbox answers for itself ([`Sandbox`]'s preflight methods), so nothing
//! here names one.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::{RunConfig, hostpath, rootless};
use crate::error::{Error, IoContext, Result};
use crate::overlay::options::Squash;
use crate::sandbox::user::UserSource;
use crate::sandbox::{ContainerFlags, Sandbox};
use crate::spec::{Paths, Spec, StoredOrigin};

/// The path flags of a command, as given: `--workdir` (else the current directory),
/// `--mount-root` and `--workdir-view`.
#[derive(Debug, Clone, Copy)]
pub struct PathFlags<'a> {
    /// `--workdir`: the project directory; `None`: the current directory.
    pub workdir: Option<&'a Path>,
    /// `--mount-root`: where the caches viewed below it are seen.
    pub mount_root: &'a Path,
    /// `--workdir-view`: where the steps see the workdir; `None`: the sandbox's default.
    pub workdir_view: Option<&'a Path>,
}

/// What `layercache run` was asked, parsed from its flags but not checked.
#[derive(Debug)]
pub struct Request<'a> {
    /// The spec (loaded from `--spec`, the workdir's `layercache.toml` or the store).
    pub spec: Spec,
    /// `run --project P`: which stored spec version this is.
    pub stored_spec: Option<StoredOrigin>,
    /// `--sandbox`, as parsed ([`Sandbox::parse`]; configured here from the flags below).
    pub sandbox: Sandbox,
    /// `--docker-arg`s: extra words for a container engine's `run`.
    pub engine_args: Vec<String>,
    /// `--user`: overrides the spec's `user`.
    pub user: Option<String>,
    /// `--image` (a container's image; else an id that only enters the keys).
    pub image: Option<String>,
    /// The path flags.
    pub paths: PathFlags<'a>,
    /// The store root (absolute).
    pub store: PathBuf,
    /// COMMAND and its arguments.
    pub command: Vec<OsString>,
    /// `--json`.
    pub json: bool,
}

/// A run that passed its preflight: its configuration, and the overlay's ownership mapping
/// for the run's user (a container: the image's user).
#[derive(Debug)]
pub struct Prepared {
    /// The run's validated configuration (with a new run id).
    pub cfg: RunConfig,
    /// Every mount's ownership mapping (`--user` as resolved).
    pub squash: Squash,
}

/// The checks of `layercache run` before anything is mounted, in order: the sandbox
/// configured from the flags ([`Sandbox::with_flags`]); the user (`--user`, else the spec's)
/// resolved on the host by a host sandbox; without root and with caches, the unprivileged
/// run's refusals ([`rootless::preflight`]: the steps then run as the user in the run's own
/// user namespace, so no `--user` drop); the sandbox's own preflight ([`Sandbox::preflight`]:
/// bwrap as a user, a container engine's image and user — the image's id, not its name,
/// enters the keys); the run's paths ([`paths`], the sandbox's default workdir view); the
/// host directories the views are built on ([`hostpath::check_host_views`],
/// [`rootless::check_view_dirs`]); the store ([`hostpath::check_trusted`]); the paths the
/// sandbox binds ([`Sandbox::check_bind_paths`]).
///
/// Errors: [`Error::Invalid`] (exit 2) naming the flag, the user, the image or what the
/// machine refuses.
pub fn preflight(req: Request<'_>) -> Result<Prepared> {
    let spec = req.spec;
    // --user, else the spec's `user`; errors name the one given.
    let (user, user_source) = match (&req.user, &spec.user) {
        (Some(u), _) => (Some(u.clone()), UserSource::Flag),
        (None, u) => (u.clone(), UserSource::Spec),
    };
    let sandbox = req.sandbox.with_flags(ContainerFlags {
        image: req.image.clone(),
        engine_args: req.engine_args,
        user: user.clone(),
        user_source,
    })?;
    let mut run_user = sandbox.host_user(user.as_deref(), user_source)?;
    let rootless = match rootless::needed() && !spec.caches.is_empty() {
        true => Some(rootless::preflight(&sandbox, run_user.take(), user_source)?),
        false => None,
    };
    let checked = sandbox.preflight(run_user, user_source, req.image)?;
    let squash = (checked.ids)
        .map(|(uid, gid)| Squash {
            uid: Some(uid),
            gid: Some(gid),
        })
        .unwrap_or_default();
    let paths = paths(req.paths, sandbox.default_workdir_view())?;
    hostpath::check_host_views(&spec, &paths, sandbox.host_view_dirs())?;
    if rootless.is_some() {
        rootless::check_view_dirs(&spec, &paths)?;
    }
    // The store holds what runs mount and run: nobody else may be able to replace it.
    let euid = rustix::process::geteuid().as_raw();
    hostpath::check_trusted("--store", &req.store, euid)?;
    sandbox.check_bind_paths(&[
        ("--workdir", paths.workdir.as_path()),
        ("--mount-root", paths.mount_root.as_path()),
        ("--workdir-view", paths.view_workdir()),
        ("--store", req.store.as_path()),
    ])?;
    let cfg = RunConfig {
        spec,
        paths,
        image: checked.image,
        sandbox,
        command: req.command,
        store: req.store,
        json: req.json,
        run_id: crate::telemetry::new_run_id(),
        user: run_user,
        rootless,
        stored_spec: req.stored_spec,
    };
    Ok(Prepared { cfg, squash })
}

/// The run's paths from the path flags (`--workdir-view`, else `default_view`), made
/// absolute and checked: none may be `/` or a system directory, nor lead to one through a
/// symlink ([`crate::spec::check_root`]); once their symlinks are resolved, the mount root may
/// not overlap (equal, hold or sit inside) the workdir nor the workdir's view. `key` and
/// `sandbox-args` take their paths the same way.
///
/// Errors: [`Error::Invalid`] naming the flag.
pub fn paths(flags: PathFlags<'_>, default_view: Option<&Path>) -> Result<Paths> {
    let paths = Paths {
        workdir: workdir(flags.workdir)?,
        mount_root: absolute("--mount-root", flags.mount_root)?,
        workdir_view: (flags.workdir_view.or(default_view))
            .map(|v| absolute("--workdir-view", v))
            .transpose()?,
    };
    crate::spec::check_root("--workdir", &paths.workdir)?;
    crate::spec::check_root("--mount-root", &paths.mount_root)?;
    if let Some(v) = &paths.workdir_view {
        crate::spec::check_root("--workdir-view", v)?;
    }
    // Where the mount root and the view lead on the host: neither may overlap the other nor
    // the workdir (a mount root over the workdir hides it; a view over the mount root hides
    // the caches).
    let resolve = |what: &str, p: &Path| {
        crate::spec::resolve_existing(p).map_err(|e| {
            Error::invalid(format!(
                "{what} {}: cannot resolve its symlinks: {e}",
                p.display()
            ))
        })
    };
    let root = resolve("--mount-root", &paths.mount_root)?;
    let overlap = |a: &Path, b: &Path| a.starts_with(b) || b.starts_with(a);
    if overlap(&root, &paths.workdir) {
        return Err(Error::invalid(format!(
            "--mount-root {} overlaps --workdir {}: the mount root must be a directory of its \
             own, neither the workdir nor inside it nor containing it (such as /cache)",
            paths.mount_root.display(),
            paths.workdir.display()
        )));
    }
    if let Some(v) = &paths.workdir_view
        && overlap(&resolve("--workdir-view", v)?, &root)
    {
        return Err(Error::invalid(format!(
            "--workdir-view {} overlaps --mount-root {}: the workdir's view must be neither the \
             mount root nor inside it nor containing it (such as /workspace)",
            v.display(),
            paths.mount_root.display()
        )));
    }
    Ok(paths)
}

/// The project directory: `--workdir` (`arg`) or the current directory, made absolute.
///
/// Errors: [`Error::Invalid`] when it cannot be resolved or is not a directory.
fn workdir(arg: Option<&Path>) -> Result<PathBuf> {
    let dir = match arg {
        Some(d) => d.to_path_buf(),
        None => std::env::current_dir().at(".")?,
    };
    let dir = std::fs::canonicalize(&dir)
        .map_err(|e| Error::invalid(format!("--workdir {}: {e}", dir.display())))?;
    if !dir.is_dir() {
        return Err(Error::invalid(format!(
            "--workdir {}: not a directory (want the project directory, where the key files are)",
            dir.display()
        )));
    }
    Ok(dir)
}

/// `path` made absolute against the current directory (not resolved).
///
/// Errors: [`Error::Invalid`] naming `what` (the flag).
fn absolute(what: &str, path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).map_err(|e| Error::invalid(format!("{what} {}: {e}", path.display())))
}
