//! The on-disk layer store: keys, layers, objects, runs, and the mounts of runs.
//!
//! The store knows nothing of FUSE requests; it mounts and unmounts through the overlay's
//! daemon API only ([`crate::overlay::mount_daemon`], [`crate::overlay::unmount`],
//! [`crate::overlay::is_mountpoint_busy`]), and it knows nothing of the CLI (the command glue is
//! in `crate::app`). docs/ARCHITECTURE.md has the module map and the on-disk format.
//!
//! Its front door is this module: the submodules are private and what callers use is
//! re-exported here. Inside, by job: `paths` (where things live: [`ProjectDirs`]), `mount`
//! (lookup, fill wait, mount; the RAII [`Mount`] handle), `runs` (run records, umount),
//! `publish` (commit, promote, publish), `housekeeping` (ls, gc, clear), `salt` (a project's key salt), `views` (host view directories a killed run left), `verify`, `inputs` (a key's
//! recorded inputs), `specs` (stored specs), `config` (config.toml), `tier` (the port the
//! remote tier implements, [`RemoteTier`]); below them `layer`, `object`, `lease`, `promote`
//! and `gc` (the pure eviction plan). The on-disk layout is drawn once, in docs/ARCHITECTURE.md
//! ("On-disk store format").
//!
//! Keys follow GitHub actions/cache: a key is immutable once published (a second publish of
//! the same key reports `exists` and discards its copy); restore keys are prefixes tried in
//! order, the most recently created matching layer first.

#![forbid(unsafe_code)]

mod config;
mod eviction;
mod failed;
mod housekeeping;
mod inputs;
mod layer;
mod lease;
mod mount;
mod object;
mod paths;
mod promote;
mod publish;
mod runs;
mod salt;
mod specs;
mod tier;
mod trust;
mod verify;
mod views;
mod warm;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey, ProjectId};
use crate::sys;
pub(crate) use config::{Limits, RemoteFile};
pub(crate) use failed::{
    FailedSetup, KeptLogs, keep_failed_logs, store_full_message, store_looks_full,
};
pub(crate) use housekeeping::{ClearReport, GcReport, LayerInfo};
pub use inputs::Inputs;
use layer::write_synced;
#[cfg(test)]
pub(crate) use layer::{MANIFEST_FORMAT, new_layer_id};
pub(crate) use layer::{Manifest, TreeCounts};
pub(crate) use mount::{Mount, MountOutcome, MountRequest};
// What the integration tests name (with Store): gc options and a lookup's answer.
pub use housekeeping::GcOptions;
pub use mount::Lookup;
// The object format and promotion's undo, which a pull shares with a local publish.
pub(crate) use object::{ObjectStore, SharedMeta, content_xattrs, hash_file, meta_tag};
use paths::read_names;
pub(crate) use paths::{ProjectDirs, exists_at, store_of_run_upper};
pub(crate) use promote::{TreeStats, undo_created_objects};
pub(crate) use publish::{CommitResult, PublishSpec};
pub(crate) use runs::MountResult;
pub(crate) use salt::{salt_from_hex, salt_to_hex};
pub(crate) use specs::StoredSpec;
pub(crate) use tier::{Fetched, LazyEnd, LazyLower, PullReport, RemoteTier};
pub(crate) use views::{reap_made_views, record_made_views};

/// On-disk format version of the store (the `v1/` directory and `format.json`).
pub(crate) const FORMAT: u32 = 1;
/// Feature flags recorded in `format.json`.
pub(crate) const FEATURES: &[&str] = &["blake3-objects", "meta-tagged-objects", "flock-leases"];
/// How long `commit`/`umount` wait for an overlay daemon to exit after unmounting.
pub(crate) const UNMOUNT_WAIT: Duration = Duration::from_secs(60);
/// A run directory whose lease is free is only treated as stale after this long (seconds since
/// its last change), so a `commit` in another process between unmount and promotion is safe.
pub(crate) const RUN_GRACE: Duration = Duration::from_secs(120);

/// The default store root: `/var/lib/layercache` as root, `$XDG_CACHE_HOME/layercache`
/// (falling back to `$HOME/.cache/layercache` when it is unset, empty or relative, as the XDG
/// Base Directory specification says) otherwise.
///
/// Errors: [`Error::Invalid`] when neither `XDG_CACHE_HOME` nor `HOME` is set for a non-root
/// user.
pub(crate) fn default_root() -> Result<PathBuf> {
    let root = rustix::process::geteuid().is_root();
    default_root_for(
        root,
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    )
}

/// The error for a store directory `root` that `trust::make_dirs` could not make: bad input
/// (exit 2, one line naming the directory, the reason and what would do) when the reason is
/// where it is — EACCES, EPERM, ENOENT, ENOTDIR, EEXIST (a file in the way), EROFS — with the
/// `HOME` (or `XDG_CACHE_HOME`) that does not exist named when the store is below it; else
/// [`Error::Io`].
fn root_not_creatable(root: &Path, e: std::io::Error) -> Error {
    let bad_place = matches!(
        e.raw_os_error(),
        Some(
            libc::EACCES | libc::EPERM | libc::ENOENT | libc::ENOTDIR | libc::EEXIST | libc::EROFS
        )
    );
    if !bad_place {
        return Error::io(root, e);
    }
    let missing = ["XDG_CACHE_HOME", "HOME"].iter().find_map(|var| {
        let dir = PathBuf::from(std::env::var_os(var)?);
        (dir.is_absolute() && root.starts_with(&dir) && !dir.is_dir())
            .then(|| format!(" ({var}={} does not exist)", dir.display()))
    });
    Error::invalid(format!(
        "store {}: cannot create it: {e}{}; pass --store DIR or set LAYERCACHE_STORE to a \
         directory you can write",
        root.display(),
        missing.unwrap_or_default()
    ))
}

/// Makes the new file `path` mode 0644 whatever the umask (under umask 000 `File::create` made
/// format.json and config.toml writable by everyone).
fn private_to_writers(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644)).at(path)
}

/// [`default_root`] for a process that is root or not, with these `XDG_CACHE_HOME` and `HOME`.
fn default_root_for(
    root: bool,
    xdg: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Result<PathBuf> {
    if root {
        return Ok(PathBuf::from("/var/lib/layercache"));
    }
    // The XDG Base Directory spec: a relative $XDG_CACHE_HOME is invalid and ignored.
    if let Some(x) = xdg.filter(|x| Path::new(x).is_absolute()) {
        return Ok(PathBuf::from(x).join("layercache"));
    }
    if let Some(h) = home.filter(|x| !x.is_empty()) {
        if !Path::new(&h).is_absolute() {
            return Err(Error::invalid(format!(
                "HOME={} is not an absolute path, so there is no default store: pass --store DIR \
                 or set LAYERCACHE_STORE (or XDG_CACHE_HOME) to an absolute path",
                Path::new(&h).display()
            )));
        }
        return Ok(PathBuf::from(h).join(".cache/layercache"));
    }
    Err(Error::invalid(
        "no store given: pass --store DIR or set LAYERCACHE_STORE (XDG_CACHE_HOME and HOME are unset)",
    ))
}

#[cfg(test)]
#[test]
fn default_root_ignores_a_relative_xdg_cache_home() {
    let os = |s: &str| Some(std::ffi::OsString::from(s));
    let r = |x, h| default_root_for(false, x, h).unwrap();
    assert_eq!(r(os("/x/c"), os("/h")), PathBuf::from("/x/c/layercache"));
    assert_eq!(
        r(os("rel/c"), os("/h")),
        PathBuf::from("/h/.cache/layercache")
    );
    assert_eq!(r(os(""), os("/h")), PathBuf::from("/h/.cache/layercache"));
    // A relative HOME is refused, not taken relative to wherever the command runs.
    assert!(default_root_for(false, None, os("rel/h")).is_err());
    assert!(default_root_for(false, os("rel"), None).is_err());
    assert_eq!(
        default_root_for(true, os("/x"), os("/h")).unwrap(),
        PathBuf::from("/var/lib/layercache")
    );
}

#[derive(Serialize, Deserialize)]
struct FormatFile {
    format: u32,
    features: Vec<String>,
}

/// What the store tells its user while it works (a wait for another run's fill, say): the
/// CLI prints these on stderr, a server may log them. `Display` is the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// Another run holds the fill lock of the key; waiting up to `wait` for it.
    WaitingForFill {
        /// Project.
        project: ProjectId,
        /// Cache.
        cache: CacheId,
        /// The key being filled.
        key: CacheKey,
        /// How long the wait may last.
        wait: Duration,
    },
    /// The other fill did not finish in time: this run fills the key too.
    FillTimedOut {
        /// The key.
        key: CacheKey,
    },
    /// The other run holding the key's fill lock ended without publishing the key (its setup
    /// failed, its run was killed, or it mounted a remote layer lazily and this run could
    /// not): this run, which waited for it, fills the key now. Said only when this run fills.
    FillTakenOver {
        /// The key.
        key: CacheKey,
    },
    /// The remote tier's news: it is skipped for this run (unreachable, slow, refusing), a
    /// pull failed, or how a background push went. `message` is one line naming the remote.
    Remote {
        /// The line.
        message: String,
    },
    /// The mount of a lazily mounted layer ended: what it fetched while its run lasted
    /// (`end.message` is the line, naming the cache).
    LazyFetched {
        /// The cache.
        cache: CacheId,
        /// The key the layer was mounted for.
        key: CacheKey,
        /// What was fetched, and the line.
        end: LazyEnd,
    },
    /// A commit failed and the previous mount could not be put back.
    RemountFailed {
        /// The mountpoint.
        mountpoint: PathBuf,
        /// Why the mount failed.
        error: String,
    },
}

impl std::fmt::Display for Notice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Notice::WaitingForFill {
                project,
                cache,
                key,
                wait,
            } => write!(
                f,
                "another run is filling {project}/{cache} key {key}; waiting up to {} s for it \
                 (--fill-wait)",
                wait.as_secs_f64().ceil()
            ),
            Notice::FillTimedOut { key } => write!(
                f,
                "the other fill of key {key} did not finish in time; filling it here too (only \
                 one of the two is published)"
            ),
            Notice::FillTakenOver { key } => write!(
                f,
                "the other fill of key {key} ended without publishing it (its setup failed, its \
                 run was killed, or it mounted a remote layer lazily); filling it here"
            ),
            Notice::Remote { message } => f.write_str(message),
            Notice::LazyFetched { end, .. } => f.write_str(&end.message),
            Notice::RemountFailed { mountpoint, error } => write!(
                f,
                "the commit failed and {} could not be mounted again ({error}); its files stay \
                 in the run directory until gc",
                mountpoint.display()
            ),
        }
    }
}

/// Where [`Notice`]s go.
pub type Notify = Arc<dyn Fn(&Notice) + Send + Sync>;

/// An open store.
#[derive(Clone)]
pub struct Store {
    root: PathBuf,
    base: PathBuf,
    limits: Limits,
    /// `[remote]` of config.toml, as written (the remote tier validates it).
    remote_file: Option<RemoteFile>,
    /// The remote tier attached with [`Store::set_remote`], if any.
    remote: Option<Arc<dyn RemoteTier>>,
    notify: Option<Notify>,
    /// Removals of finished runs' directories still going on in the background (shared by
    /// clones; [`Store::wait_background`] joins them).
    background: Arc<std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>>,
    /// The projects whose directories [`Store::project`] has made and checked through this
    /// handle (shared by clones): a run asks for its project several times, the trust walk is
    /// made once. [`Store::clear`] of a whole project forgets it.
    checked_projects: Arc<std::sync::Mutex<std::collections::HashSet<ProjectId>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("root", &self.root)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// Milliseconds since `t`.
fn ms_since(t: Instant) -> u64 {
    t.elapsed().as_millis() as u64
}

/// The exit-2 error for a `--project` the store at `root` does not have: names it, the store
/// and the projects there are (`known`).
pub(crate) fn no_such_project(root: &Path, project: &ProjectId, known: &[String]) -> Error {
    Error::invalid(format!(
        "project {project}: no such project in the store at {} ({})",
        root.display(),
        one_of("projects", known)
    ))
}

/// `"<what>: a, b"`, or `"it has no <what> yet"` when `names` is empty.
pub(crate) fn one_of(what: &str, names: &[String]) -> String {
    if names.is_empty() {
        format!("it has no {what} yet")
    } else {
        format!("{what}: {}", names.join(", "))
    }
}

impl Store {
    /// Opens the store at `root` only if one exists there (see [`exists_at`]): `Ok(None)`
    /// instead of creating it, for commands that read or trim a store (a mistyped `--store`
    /// would otherwise look like an empty store).
    ///
    /// Errors: as [`Store::open`].
    pub fn open_existing(root: &Path) -> Result<Option<Store>> {
        if !exists_at(root) {
            return Ok(None);
        }
        Store::open(Some(root)).map(Some)
    }

    /// Opens (creating if needed) the store at `root`, or at [`default_root`] when `None`.
    /// Creates the root (and its missing parents) and `v1/` with mode 0755 and `v1/projects/`
    /// with 0711 whatever the umask, `format.json` and a default `config.toml`, and reads the
    /// limits. Before anything is read, the root, `v1/` and `projects/` are checked (`trust`):
    /// none may be writable by group or others or a symlink, `v1/` and `projects/` must be the
    /// store owner's (the owner of the root) or root's, and no parent of the root may be
    /// writable by every user without the sticky bit — so no other local user can swap what
    /// the store holds.
    ///
    /// Errors: [`Error::Invalid`] for a store of another format or a bad config.toml (naming
    /// the file), for a store that fails those checks (naming the directory, its owner and
    /// mode, and the fix), and for a store directory that cannot be made because of where it is
    /// ([`root_not_creatable`]: a missing or unwritable parent, a file in the way, a read-only
    /// filesystem — a default user store under a `HOME` that does not exist among them);
    /// [`Error::Io`] when the directories cannot be created otherwise.
    pub fn open(root: Option<&Path>) -> Result<Store> {
        let root = match root {
            // Absolute, so the paths the store hands to daemons and runs (which work in other
            // directories) name this store.
            Some(r) => std::path::absolute(r).map_err(|e| Error::io(r, e))?,
            None => default_root()?,
        };
        // Mode 0755 whatever the umask, then every directory checked (see `trust`): a store
        // others can write is refused, so nobody can swap its v1/ for their own.
        trust::make_dirs(&root).map_err(|e| root_not_creatable(&root, e))?;
        let owner = trust::walk_create(&root, &[("v1", 0o755), ("projects", 0o711)])?.owner;
        let base = root.join("v1");
        let fmt = base.join("format.json");
        if !fmt.exists() {
            let tmp = base.join(format!(".format-{}", sys::random_hex(6)));
            let body = serde_json::to_vec(&FormatFile {
                format: FORMAT,
                features: FEATURES.iter().map(|s| s.to_string()).collect(),
            })
            .map_err(|e| Error::Failed(e.to_string()))?;
            write_synced(&tmp, &body)?;
            private_to_writers(&tmp)?;
            match sys::rename_noreplace(&tmp, &fmt) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    let _ = fs::remove_file(&tmp);
                }
                Err(e) => return Err(Error::io(&fmt, e)),
            }
        }
        trust::check_file(&fmt, owner, &root)?;
        let text = fs::read(&fmt).at(&fmt)?;
        let f: FormatFile = serde_json::from_slice(&text).map_err(|e| {
            Error::invalid(format!("{}: not a layercache store: {e}", fmt.display()))
        })?;
        if f.format != FORMAT {
            return Err(Error::invalid(format!(
                "{}: store format {} is not supported by this version (want {FORMAT})",
                fmt.display(),
                f.format
            )));
        }
        let cfg = base.join("config.toml");
        if !cfg.exists() {
            let tmp = base.join(format!(".config-{}", sys::random_hex(6)));
            write_synced(&tmp, config::DEFAULT_CONFIG_TOML.as_bytes())?;
            private_to_writers(&tmp)?;
            if sys::rename_noreplace(&tmp, &cfg).is_err() {
                let _ = fs::remove_file(&tmp);
            }
        }
        // config.toml names the remote tier a run pulls layers from: nobody else may change it.
        trust::check_file(&cfg, owner, &root)?;
        let text = fs::read_to_string(&cfg).at(&cfg)?;
        let parsed: config::ConfigFile =
            toml::from_str(&text).map_err(|e| Error::invalid(format!("{}: {e}", cfg.display())))?;
        let limits = parsed
            .limits
            .resolve()
            .map_err(|e| Error::invalid(format!("{}: {e}", cfg.display())))?;
        Ok(Store {
            root,
            base,
            limits,
            remote_file: parsed.remote,
            remote: None,
            notify: None,
            background: Arc::default(),
            checked_projects: Arc::default(),
        })
    }

    /// Waits for the removals of finished runs' directories that commits left to background
    /// threads (see [`Store::commit`]); a process calls it before it exits, so it leaves no
    /// garbage in `staging/`.
    pub fn wait_background(&self) {
        let handles =
            std::mem::take(&mut *self.background.lock().unwrap_or_else(|e| e.into_inner()));
        for h in handles {
            let _ = h.join();
        }
    }

    /// `[remote]` of config.toml, if present (the remote tier's entries, as written).
    pub fn remote_file(&self) -> Option<&RemoteFile> {
        self.remote_file.as_ref()
    }

    /// Attaches the remote tier: `mount` then looks keys up there on a local miss and
    /// `commit` pushes what it publishes (see [`RemoteTier`]; `crate::remote` implements it).
    pub fn set_remote(&mut self, remote: Arc<dyn RemoteTier>) {
        self.remote = Some(remote);
    }

    /// The attached remote tier, if any.
    pub fn remote(&self) -> Option<&Arc<dyn RemoteTier>> {
        self.remote.as_ref()
    }

    /// Sends [`Notice`]s to `notify` (without one they go to the log at info level).
    pub fn with_notify(mut self, notify: Notify) -> Store {
        self.notify = Some(notify);
        self
    }

    /// The notice callback given to [`Store::with_notify`], if any.
    pub fn notifier(&self) -> Option<Notify> {
        self.notify.clone()
    }

    /// Sends `n` to the notice callback (or the log).
    pub(crate) fn notify(&self, n: Notice) {
        match &self.notify {
            Some(f) => f(&n),
            None => tracing::info!("{n}"),
        }
    }

    /// The store root as given (`<store>`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The limits from config.toml.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// `<store>/events.jsonl`, for telemetry.
    pub fn events_path(&self) -> PathBuf {
        self.root.join("events.jsonl")
    }

    fn projects_dir(&self) -> PathBuf {
        self.base.join("projects")
    }

    /// The directories of `project`, created (mode 0700, its parts 0755, whatever the umask;
    /// the store owner's when root makes them in a user's store) if missing, reached without
    /// following a symlink and checked like the store's own (see `trust`) — once per handle
    /// (and its clones): later calls for the same project return its directories at once.
    ///
    /// Errors: [`Error::Invalid`] (exit 2) for a project directory that is a symlink, that
    /// group or others may write, or that belongs to a user other than the store's owner and
    /// root; [`Error::Io`] when they cannot be created.
    pub fn project(&self, project: &ProjectId) -> Result<ProjectDirs> {
        let pd = self.project_dirs(project);
        if self.checked().contains(project) {
            return Ok(pd);
        }
        let dir = trust::walk_create(
            &self.root,
            &[
                ("v1", 0o755),
                ("projects", 0o711),
                (project.as_str(), 0o700),
            ],
        )?;
        for s in ["objects", "layers", "caches", "runs", "staging", "empty"] {
            trust::make_in(&dir, s, 0o755)?;
        }
        self.checked().insert(project.clone());
        Ok(pd)
    }

    /// The set of [`Store::project`]'s checked projects (a poisoned lock is taken over: the
    /// set is only ever inserted into or removed from whole).
    fn checked(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<ProjectId>> {
        (self.checked_projects.lock()).unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets that `project`'s directories were checked (they were removed): the next
    /// [`Store::project`] makes and checks them again.
    pub(super) fn forget_checked(&self, project: &ProjectId) {
        self.checked().remove(project);
    }

    pub(crate) fn project_dirs(&self, project: &ProjectId) -> ProjectDirs {
        ProjectDirs::at(&self.root, project)
    }

    /// Existing projects (or just `only`, if it exists).
    ///
    /// Errors: [`Error::Io`] reading `projects/`.
    pub fn projects(&self, only: Option<&ProjectId>) -> Result<Vec<ProjectDirs>> {
        Ok(read_names(&self.projects_dir())?
            .into_iter()
            .filter_map(|n| ProjectId::new(n).ok())
            .filter(|p| only.is_none_or(|o| o == p))
            .map(|p| self.project_dirs(&p))
            .collect())
    }

    /// The projects a `--project` option selects: every project when `only` is `None`, else
    /// just `only`, which must exist.
    ///
    /// Errors: [`Error::Invalid`] naming `only` and listing the store's projects when it has
    /// no such project; [`Error::Io`] reading `projects/`.
    pub(super) fn selected_projects(&self, only: Option<&ProjectId>) -> Result<Vec<ProjectDirs>> {
        let pds = self.projects(only)?;
        match only {
            Some(p) if pds.is_empty() => {
                let known: Vec<String> = self
                    .projects(None)?
                    .iter()
                    .map(|pd| pd.project.to_string())
                    .collect();
                Err(no_such_project(&self.root, p, &known))
            }
            _ => Ok(pds),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_and_config_are_checked() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("s");
        Store::open(Some(&root)).unwrap();
        fs::write(
            root.join("v1/config.toml"),
            "[limits]\nmax_size = \"huge\"\n",
        )
        .unwrap();
        let e = Store::open(Some(&root)).unwrap_err().to_string();
        assert!(e.contains("config.toml") && e.contains("huge"), "{e}");
        fs::write(root.join("v1/config.toml"), config::DEFAULT_CONFIG_TOML).unwrap();
        fs::write(root.join("v1/format.json"), r#"{"format":2,"features":[]}"#).unwrap();
        let e = Store::open(Some(&root)).unwrap_err().to_string();
        assert!(e.contains("format 2"), "{e}");
    }
}
