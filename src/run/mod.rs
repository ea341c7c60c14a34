//! The main job, `layercache run`: compute keys → mount every cache → on a hit run the
//! maintenance script (or nothing), on a restore or miss run the setup script and promote the
//! result if it exits 0 → run COMMAND with the caches' environment → unmount everything (also on
//! Ctrl-C/SIGTERM) → one telemetry event per cache and a short summary.
//!
//! Outside references: GitHub `actions/cache` (exact key, then restore-key prefixes; a key is
//! immutable once published) and Codex cloud environments (setup script for a fresh environment,
//! maintenance script for a resumed cached one).
//!
//! Output: setup and maintenance write to stderr (their stdout too) and the summary goes to
//! stderr, so standard output belongs to COMMAND alone — except with `--json`, where the summary
//! is one JSON object on the first line of stdout, before COMMAND's output. With no
//! caches declared, `run` only runs COMMAND: same stdio, same exit status, and one stderr line
//! of its own saying the spec declares no caches.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey, ProjectId};
use crate::key::{self, CacheKeys, Environment};
use crate::sandbox::{self, Binds, Sandbox};
use crate::spec::{Cache, Paths, Spec};
use crate::telemetry::{self, CacheResult, Event};

/// What mounting a key found.
#[derive(Debug, Clone)]
pub struct Mounted {
    /// hit, restore or miss.
    pub result: CacheResult,
    /// The key of the layer that was mounted (the key itself on a hit, the restore match on a
    /// restore, `None` on a miss).
    pub matched_key: Option<String>,
    /// The mount's private upper directory, if known (progress shows its size).
    pub upper: Option<PathBuf>,
    /// Bytes in the mounted layer, when known.
    pub bytes: u64,
    /// Files in the mounted layer, when known.
    pub files: u64,
    /// Where the mount is on the host (the run's private `runs/<run>/mnt`); the run binds it at
    /// the view path in its own mount namespace. Equal to the view path when the mount is
    /// already there.
    pub source: PathBuf,
    /// The store's run id of the mount (`runs/<run>`).
    pub run: String,
    /// Remote tier: what was pulled for this mount, if it came from the remote.
    pub pulled: Option<crate::store::PullReport>,
}

/// What a promotion published.
#[derive(Debug, Clone, Default)]
pub struct Committed {
    /// Whether this run's layer was published (false when another run published the key
    /// first; its layer is mounted instead).
    pub published: bool,
    /// Bytes in the new layer.
    pub bytes: u64,
    /// Files in the new layer.
    pub files: u64,
    /// Where the published layer is now mounted (see [`Mounted::source`]), its run id and
    /// its private upper (see [`Mounted::upper`]).
    pub remount: Option<(PathBuf, String, Option<PathBuf>)>,
    /// Files stored as new objects (the rest reused stored objects).
    pub new_files: u64,
    /// Bytes stored as new objects.
    pub new_bytes: u64,
}

/// The store operations the run needs (implemented over [`crate::store`]; a plain-directory
/// fake in the unit tests).
///
/// A mount is named by its cache's view path (where the tools see it) within this run only.
pub trait Mounter {
    /// Mounts the layer for `key` (or the newest matching a restore-key prefix, or nothing)
    /// with a private upper layer, for the cache seen at `view`.
    fn mount(
        &self,
        project: &ProjectId,
        cache: &CacheId,
        key: &CacheKey,
        restore_keys: &[CacheKey],
        view: &Path,
    ) -> Result<Mounted>;
    /// Promotes the mount's lower ⊕ upper under its key and remounts the new layer as a hit;
    /// when this publishes the key, `inputs` are recorded as its inputs ([`crate::why`]) before
    /// the remote push of the layer starts, so they travel with the key.
    fn commit(&self, view: &Path, inputs: &crate::why::Inputs) -> Result<Committed>;
    /// Unmounts and discards the private upper.
    fn umount(&self, view: &Path) -> Result<()>;
    /// `save = "success"`, after COMMAND exited 0: promotes the mount's view as a newer layer
    /// of its key when it changed, then unmounts it (either way). `Ok(None)`: nothing changed
    /// (or another save of the key held it too long), nothing published. The default: none.
    ///
    /// Errors: as [`Mounter::commit`]; the key then keeps its layer.
    fn save(&self, _view: &Path) -> Result<Option<Committed>> {
        Ok(None)
    }
    /// `Err` naming the dead daemon when the mount's overlay daemon is gone (killed): the
    /// mount then only answers ENOTCONN.
    fn check(&self, _view: &Path) -> Result<()> {
        Ok(())
    }
    /// The project's key salt ([`crate::key::KeySalt`]; the store's, agreed with its remote
    /// tier); `None` keys with plain digests (the unit tests' fake).
    fn key_salt(&self, _project: &ProjectId) -> Result<Option<key::KeySalt>> {
        Ok(None)
    }
}

/// The validated configuration of one run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The spec.
    pub spec: Spec,
    /// Workdir and mount root.
    pub paths: Paths,
    /// The sandbox image id (environment fingerprint): `--image`, or with `--sandbox docker`
    /// the image's id from the engine (`sha256:…`), which then stands for the tools' versions.
    pub image: Option<String>,
    /// Sandbox for setup, maintenance and COMMAND (with `--sandbox docker`, the image,
    /// `--docker-arg`s and `--user` of the containers).
    pub sandbox: Sandbox,
    /// COMMAND and its arguments (may be empty).
    pub command: Vec<OsString>,
    /// The store root (events go to `<store>/events.jsonl`).
    pub store: PathBuf,
    /// Summary as JSON (on stdout).
    pub json: bool,
    /// This run's id (in the summary and every event).
    pub run_id: String,
    /// `--sandbox none|bwrap`: the user setup, maintenance and COMMAND run as (`--user` or the
    /// spec's `user`, resolved on the host). `None`: layercache's own user.
    pub user: Option<sandbox::user::RunUser>,
    /// An unprivileged run: the user's ids and who the steps run as; the run is
    /// then in its own user and mount namespace ([`rootless::enter`]). `None` for root.
    pub rootless: Option<rootless::Rootless>,
    /// `run --project P`: which stored spec version this is and when it was saved (the
    /// `--json` summary's `stored_spec`). `None` for `--spec`.
    pub stored_spec: Option<crate::spec::StoredOrigin>,
}

mod child;
pub mod hostpath;
mod mounter;
mod pidns;
mod progress;
pub mod rootless;
mod summary;
mod tail;

pub use crate::units::fmt_bytes;
pub use child::Views;
use child::{SignalGuard, run_child, stopped};
pub use mounter::{NoMounts, StoreMounter};
use progress::Progress;
use summary::print_summary;

// ---- mounts ----------------------------------------------------------------------------------

/// Every mount of this run (by view path); Drop unmounts what is left, in reverse order, then
/// removes the view directories the run made on the host ([`Mounts::remove_made`]).
struct Mounts<'a> {
    mounter: &'a dyn Mounter,
    /// The store root and run id the made view directories are recorded under
    /// ([`crate::store::record_made_views`]), so `gc` removes them after a `kill -9`.
    store: &'a Path,
    run_id: &'a str,
    points: Vec<PathBuf>,
    /// The host view directories of [`Mounts::prepare_views`], each open with a shared flock
    /// for the whole run, and whether this run created it.
    view_dirs: Vec<(PathBuf, Option<std::fs::File>, bool)>,
    /// Every cache's (id, private upper, view path) as mounted now, for a failed setup's
    /// logs: a tool may log into another cache's view (npm's `_logs` in the npm cache).
    uppers: Vec<(String, PathBuf, PathBuf)>,
}

impl Mounts<'_> {
    fn unmount_all(&mut self) -> Result<()> {
        let mut first_err = None;
        while let Some(mp) = self.points.pop() {
            if let Err(e) = self.mounter.umount(&mp) {
                tracing::warn!("unmounting {}: {e}", mp.display());
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// The first mount whose daemon died, as an error naming its cache.
    fn check_all(&self) -> Result<()> {
        self.points.iter().try_for_each(|v| self.mounter.check(v))
    }

    /// Creates on the host what the views need to exist: the mount root, the workdir view
    /// directory, and each view below the workdir (a tmpfs holds those below the mount root).
    /// Each is held open with a shared flock(2) while the run lasts; those this run created
    /// are removed when it ends if still empty and no other run holds them
    /// ([`Mounts::remove_made`]): removing a directory another run's namespace has a mount on
    /// would detach that mount (rmdir(2) of a mountpoint in another namespace, Linux 3.18+).
    fn prepare_views(&mut self, paths: &Paths, sandbox: &Sandbox, preps: &[Prep]) -> Result<()> {
        let mut need: Vec<PathBuf> = Vec::new();
        let view_wd = paths.view_workdir();
        for p in preps {
            let v = &p.keys.mountpoint;
            if p.mounted.source == *v {
                continue; // already there (no namespace needed)
            }
            if v.starts_with(&paths.mount_root) {
                if !sandbox.host_view_dirs() {
                    continue;
                }
                need.push(paths.mount_root.clone());
            } else if let Ok(rel) = v.strip_prefix(view_wd) {
                let host = paths.workdir.join(rel);
                check_host_view(&p.keys.id, &host)?;
                need.push(host);
            }
        }
        // Docker: the container has its own root; the host needs no view dirs there.
        if let Some(v) = (paths.workdir_view.as_ref()).filter(|_| sandbox.host_view_dirs()) {
            need.insert(0, v.clone());
        }
        for dir in need {
            // Made without following a symlink planted meanwhile (hostpath::make_dirs); the
            // levels made are recorded by their real paths, outermost first.
            let (real, made, held) = hostpath::make_dirs(&dir).at(&dir)?;
            for d in made.iter() {
                self.view_dirs.push((d.clone(), None, true));
            }
            if made.is_empty() {
                self.view_dirs.push((real, None, false));
            }
            let _ = crate::sys::flock(&held, libc::LOCK_SH);
            if let Some(last) = self.view_dirs.last_mut() {
                last.1 = Some(held);
            }
        }
        self.record_made();
        Ok(())
    }

    /// Records the view directories this run made that still exist (or forgets the record when
    /// none is left); best effort: a record that cannot be written is a warning.
    fn record_made(&self) {
        let made: Vec<PathBuf> = (self.view_dirs.iter())
            .filter(|(_, _, made)| *made)
            .map(|(d, _, _)| d.clone())
            .collect();
        if made.is_empty() {
            return;
        }
        if let Err(e) = crate::store::record_made_views(self.store, self.run_id, &made) {
            tracing::warn!("recording the run's view directories: {e}");
        }
    }

    /// After the unmounts: removes the view directories this run created (innermost first)
    /// when empty and held by no other run (an exclusive flock taken without waiting; a run
    /// that still uses one holds it shared). Best effort: anything else stays as it is.
    /// What is left (held by another run) stays recorded for `gc`.
    fn remove_made(&mut self) {
        let any = self.view_dirs.iter().any(|(_, _, made)| *made);
        let mut left = Vec::new();
        while let Some((dir, held, made)) = self.view_dirs.pop() {
            drop(held);
            if !made {
                continue;
            }
            let Ok(f) = std::fs::File::open(&dir) else {
                continue;
            };
            if crate::sys::flock(&f, libc::LOCK_EX | libc::LOCK_NB).is_ok() {
                let _ = std::fs::remove_dir(&dir);
            }
            if dir.exists() {
                left.push(dir);
            }
        }
        if any {
            left.reverse();
            let _ = crate::store::record_made_views(self.store, self.run_id, &left);
        }
    }
}

/// A cache viewed below the workdir (`<workdir>/node_modules`, `.venv`) needs a directory
/// there on the host: a file (or a symlink to none) of that name is refused, naming it (exit
/// 2); an existing directory with entries is said to be hidden for the run (its files stay as
/// they are).
///
/// Errors: [`Error::Invalid`] when `host` exists and is not a directory.
fn check_host_view(id: &CacheId, host: &Path) -> Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(host) else {
        return Ok(());
    };
    if !std::fs::metadata(host).is_ok_and(|m| m.is_dir()) {
        let what = if meta.file_type().is_symlink() {
            "a symlink to no directory"
        } else {
            "a file"
        };
        return Err(Error::invalid(format!(
            "cache {:?}: {} is {what} on the host, but the cache is mounted there and needs a \
             directory; remove or rename it (nothing was changed)",
            id.as_str(),
            host.display()
        )));
    }
    let entries = std::fs::read_dir(host).map(|rd| rd.count()).unwrap_or(0);
    if entries > 0 {
        eprintln!(
            "layercache: {}: the host's {} ({entries} {}) is hidden under the cache for this \
             run (left as it is)",
            id.as_str(),
            host.display(),
            if entries == 1 { "entry" } else { "entries" }
        );
    }
    Ok(())
}

impl Drop for Mounts<'_> {
    fn drop(&mut self) {
        let _ = self.unmount_all();
        self.remove_made();
    }
}

// ---- the job ---------------------------------------------------------------------------------

/// One cache's preparation as it happens.
struct Prep {
    keys: CacheKeys,
    mounted: Mounted,
    event: Event,
}

/// Runs the job. Returns COMMAND's exit status (0 without a COMMAND).
///
/// Each cache is mounted at a private place of the run (see [`Mounted::source`]); setup,
/// maintenance and COMMAND see it at its view path in a mount namespace of their own (native:
/// [`child::Views`]; bwrap: `--bind`), so concurrent runs never see each other's mounts.
///
/// The phases (docs/ARCHITECTURE.md, "Data flow of a run"): `keys` → `mount_all` (and the
/// host's view directories) → per cache `setup_or_maintenance`, then `promote` → the summary
/// → `command`.
///
/// Errors: [`Error::Invalid`] for a bad spec/key file (nothing mounted); [`Error::Child`] with
/// the script's status when setup or maintenance fails (nothing published, everything
/// unmounted); [`Error::StoreFull`] when setup or promotion ran out of space on the store's
/// filesystem (nothing published, the run's files removed; a setup's status is kept);
/// [`Error::Child`] with 128 + signal when interrupted; [`Error::Failed`] naming the cache
/// when a mount's daemon died; store and I/O errors.
pub fn run(cfg: &RunConfig, mounter: &dyn Mounter) -> Result<i32> {
    let _signals = SignalGuard::install();
    let steps = Steps::of(cfg);
    if cfg.spec.caches.is_empty() {
        eprintln!(
            "layercache: the spec of project {} declares no caches (add a [[cache]]): running \
             COMMAND only, nothing is cached",
            cfg.spec.project
        );
        return steps.command(&cfg.command, false, &BTreeMap::new(), &Views::default());
    }
    let salt = mounter.key_salt(&cfg.spec.project)?;
    let all_keys = keys(
        &cfg.spec,
        &cfg.paths,
        &cfg.sandbox,
        cfg.image.as_ref(),
        salt,
    )?;
    for cache in &cfg.spec.caches {
        for name in cache.unset_variables() {
            eprintln!(
                "layercache: warning: cache {:?}: {{env:{name}}} is unset here, so it is \
                 substituted as an empty string",
                cache.id.as_str()
            );
        }
    }
    let mut mounts = Mounts {
        mounter,
        store: &cfg.store,
        run_id: &cfg.run_id,
        points: Vec::new(),
        view_dirs: Vec::new(),
        uppers: Vec::new(),
    };
    let mut preps = mount_all(
        &mut mounts,
        all_keys,
        &cfg.spec.project,
        &cfg.run_id,
        &cfg.store,
    )?;
    mounts.prepare_views(&cfg.paths, &cfg.sandbox, &preps)?;

    // Every script and COMMAND sees every cache's environment.
    let mut run_env = BTreeMap::new();
    for (cache, p) in cfg.spec.caches.iter().zip(&preps) {
        run_env.extend(cache.env_for(&cfg.paths, &p.keys.mountpoint));
    }

    // Room for the events even when a setup fills the store's filesystem.
    let mut reserve = telemetry::EventReserve::make(&cfg.store, &cfg.run_id);
    for (ci, cache) in cfg.spec.caches.iter().enumerate() {
        let views = views(&cfg.sandbox, &cfg.paths, &preps);
        mounts.uppers = preps
            .iter()
            .filter_map(|p| {
                let up = p.mounted.upper.clone()?;
                Some((
                    p.keys.id.as_str().to_string(),
                    up,
                    p.keys.mountpoint.clone(),
                ))
            })
            .collect();
        let p = &mut preps[ci];
        if let Some(e) =
            setup_or_maintenance(&steps, &mounts, cache, p, &run_env, &views, cfg.json)?
        {
            // Unmounting discards the private uppers first: their space is free for the event.
            let unmounted = mounts.unmount_all();
            log_event(&cfg.store, &p.event, &mut reserve);
            unmounted?;
            return Err(e);
        }
        if p.mounted.result != CacheResult::Hit
            && let Err(e) = promote(mounter, cache, p)
        {
            let unmounted = mounts.unmount_all();
            log_event(&cfg.store, &p.event, &mut reserve);
            unmounted?;
            return Err(if e.is_no_space() {
                let what = format!("promoting cache {:?}", cache.id.as_str());
                Error::StoreFull {
                    message: crate::store::store_full_message(&cfg.store, &what),
                    status: 1,
                }
            } else {
                e
            });
        }
        log_event(&cfg.store, &p.event, &mut reserve);
    }
    print_summary(cfg, &preps);

    let views = views(&cfg.sandbox, &cfg.paths, &preps);
    let saves: Vec<&Prep> = (cfg.spec.caches.iter().zip(&preps))
        .filter(|(c, _)| c.save == crate::spec::SaveWhen::Success)
        .map(|(_, p)| p)
        .collect();
    let (saved, status) = command(&steps, &mut mounts, &cfg.command, &run_env, &views, &saves);
    // Published layers are logged whatever came after them (an unmount error, a signal).
    for e in &saved {
        log_event(&cfg.store, e, &mut reserve);
    }
    status
}

/// Phase 1, keys: every cache's key, restore keys and view path ([`key::compute`]; with
/// Docker the image's id stands for the tools; digests keyed with the project's `salt`). Errors: [`Error::Invalid`] for a bad key file
/// or two caches at one view path.
fn keys(
    spec: &Spec,
    paths: &Paths,
    sandbox: &Sandbox,
    image: Option<&String>,
    salt: Option<key::KeySalt>,
) -> Result<Vec<CacheKeys>> {
    let mut env = match (sandbox.docker(), image) {
        (Some(_), Some(id)) => Environment::in_image(id.clone()),
        _ => Environment::host(image.cloned()),
    };
    if let Some(s) = salt {
        env = env.with_salt(s);
    }
    let mut all_keys = Vec::new();
    for cache in &spec.caches {
        all_keys.push(key::compute(cache, paths, &env)?);
    }
    let mut seen = BTreeMap::new();
    for k in &all_keys {
        if let Some(other) = seen.insert(k.mountpoint.clone(), k.id.clone()) {
            return Err(Error::invalid(format!(
                "cache {:?}: mountpoint {} is also cache {:?}'s",
                k.id.as_str(),
                k.mountpoint.display(),
                other.as_str()
            )));
        }
    }
    Ok(all_keys)
}

/// Phase 2, mounts: each key's layer mounted through `mounts`' mounter (in order; a signal
/// stops it, everything unmounted), with the cache's event as far as the mount tells it.
fn mount_all(
    mounts: &mut Mounts<'_>,
    all_keys: Vec<CacheKeys>,
    project: &ProjectId,
    run_id: &str,
    store: &Path,
) -> Result<Vec<Prep>> {
    let mut preps: Vec<Prep> = Vec::new();
    for k in all_keys {
        if let Some(sig) = stopped() {
            return interrupted(mounts, sig);
        }
        let t = Instant::now();
        let mounted =
            (mounts.mounter).mount(project, &k.id, &k.key, &k.restore_keys, &k.mountpoint)?;
        mounts.points.push(k.mountpoint.clone());
        let event = Event {
            time_ms: telemetry::now_ms(),
            run: run_id.to_string(),
            project: project.to_string(),
            cache: k.id.to_string(),
            key: k.key.to_string(),
            result: mounted.result,
            matched_key: mounted.matched_key.clone(),
            mount_ms: t.elapsed().as_millis() as u64,
            setup_ms: 0,
            maintenance_ms: 0,
            promote_ms: 0,
            bytes: mounted.bytes,
            files: mounted.files,
            exit_status: 0,
            published: false,
            remote_hit: mounted.pulled.is_some(),
            pulled_bytes: mounted.pulled.as_ref().map_or(0, |p| p.pulled_bytes),
            pulled_objects: mounted.pulled.as_ref().map_or(0, |p| p.pulled_objects),
            pulled_ms: mounted.pulled.as_ref().map_or(0, |p| p.ms),
            new_files: 0,
            new_bytes: 0,
            // Why a miss or restore, against the nearest layer's recorded inputs.
            why: match mounted.result {
                CacheResult::Hit => Vec::new(),
                _ => crate::why::explain(
                    store,
                    project,
                    &k.id,
                    mounted.matched_key.as_deref(),
                    &k.inputs,
                ),
            },
            saved: false,
        };
        preps.push(Prep {
            keys: k,
            mounted,
            event,
        });
    }
    Ok(preps)
}

/// Phase 3, setup (miss, restore) or maintenance (hit) of one cache, in `views` with
/// `run_env` plus `$LAYERCACHE_MOUNT`; its time and status go into `p.event`.
///
/// Returns `Some(error)` when the run must stop — interrupted, a mount's daemon died, the
/// script exited non-zero — for the caller to log the event and unmount everything;
/// `Err` when the script could not be started.
fn setup_or_maintenance(
    steps: &Steps<'_>,
    mounts: &Mounts<'_>,
    cache: &Cache,
    p: &mut Prep,
    run_env: &BTreeMap<String, String>,
    views: &Views,
    json: bool,
) -> Result<Option<Error>> {
    let (what, script) = match p.mounted.result {
        CacheResult::Hit => ("maintenance", cache.maintenance.as_deref()),
        // A restore brings the old tree up to date in place.
        CacheResult::Restore => (
            "setup",
            cache.restore_setup.as_deref().or(Some(&cache.setup)),
        ),
        CacheResult::Miss => ("setup", Some(cache.setup.as_str())),
    };
    let Some(script) = script else {
        return Ok(None);
    };
    let label = format!("{what} of cache {:?}", cache.id.as_str());
    // Say what is about to run before it does: a setup can be silent for minutes.
    eprintln!(
        "{}",
        progress::start_line(
            cache.id.as_str(),
            p.mounted.result,
            p.mounted.matched_key.as_deref(),
            what,
            script,
            &steps.paths.workdir,
        )
    );
    let progress = Progress::start(
        json,
        &format!("{}: {what}", cache.id.as_str()),
        p.mounted.upper.clone().filter(|_| what == "setup"),
    );
    // The script may name its own mount as `{mount}` (and `{workdir}`, `{mount_root}`,
    // `{env:NAME}`, as in `env`), shell-quoted; it also gets it as $LAYERCACHE_MOUNT.
    let view = p.keys.mountpoint.clone();
    let script = crate::spec::expand_script(script, steps.paths, Some(&view));
    let mut env = run_env.clone();
    env.insert("LAYERCACHE_MOUNT".into(), view.display().to_string());
    let t = Instant::now();
    let (status, output) = steps.script(&env, views, &script, &label)?;
    drop(progress);
    let ms = t.elapsed().as_millis() as u64;
    if what == "setup" {
        p.event.setup_ms = ms;
    } else {
        p.event.maintenance_ms = ms;
    }
    p.event.exit_status = status;
    if let Some(sig) = stopped() {
        return Ok(Some(interrupted_error(sig)));
    }
    if let Err(e) = mounts.check_all() {
        return Ok(Some(e));
    }
    if status != 0 && what == "setup" && setup_filled_store(mounts.store, output.as_deref()) {
        // No room to keep its logs either; the line says what happened.
        return Ok(Some(Error::StoreFull {
            message: crate::store::store_full_message(mounts.store, &label),
            status,
        }));
    }
    if status != 0 {
        let kept = (what == "setup")
            .then(|| keep_failed_logs(mounts, p, &script, status, output.as_deref()))
            .flatten();
        let where_logs = match kept {
            Some(k) => {
                // npm and others point at their log inside the view, which goes with the run.
                for (seen, now) in k.files.iter().take(5) {
                    eprintln!(
                        "layercache: {}: setup's log {} is kept as {}",
                        cache.id.as_str(),
                        seen.display(),
                        now.display()
                    );
                }
                format!(
                    "; {} kept for 7 days in {} (`layercache gc` lists them)",
                    match (k.output, k.files.is_empty()) {
                        (true, true) => "the end of its output is",
                        (true, false) => "the end of its output and the logs it wrote are",
                        (false, _) => "the logs it wrote are",
                    },
                    k.dir.display()
                )
            }
            None => String::new(),
        };
        return Ok(Some(Error::Child {
            what: format!("{label} (nothing published{where_logs})"),
            status,
        }));
    }
    Ok(None)
}

/// Whether a setup failed for space: the store's filesystem is (nearly) full now
/// ([`crate::store::looks_full`]) and the end of its output, when captured, says so
/// ([`says_no_space`]; a setup that failed for another reason on a nearly full disk keeps its
/// own error and logs).
fn setup_filled_store(store: &Path, output: Option<&[u8]>) -> bool {
    crate::store::filesystem_space(store)
        .is_some_and(|(total, free)| crate::store::looks_full(total, free))
        && output.is_none_or(says_no_space)
}

/// Whether a tool's output tells of a full disk: `ENOSPC`, `No space left on device`
/// (strerror), `EDQUOT` or `Disk quota exceeded`.
fn says_no_space(output: &[u8]) -> bool {
    let text = String::from_utf8_lossy(output);
    [
        "ENOSPC",
        "No space left on device",
        "EDQUOT",
        "Disk quota exceeded",
    ]
    .iter()
    .any(|m| text.contains(m))
}

/// After a failed setup: copies the log files it wrote into its view (the run's private
/// upper, discarded when the run ends) to the store's `failed/<run>/<cache>`
/// ([`crate::store::keep_failed_logs`]); `None` when it wrote none or they could not be kept
/// (a warning says why).
fn keep_failed_logs(
    mounts: &Mounts<'_>,
    p: &Prep,
    script: &str,
    status: i32,
    output: Option<&[u8]>,
) -> Option<crate::store::KeptLogs> {
    let upper = p.mounted.upper.as_ref()?;
    let project = ProjectId::new(&p.event.project).ok()?;
    let pd = crate::store::ProjectDirs::at(mounts.store, &project);
    let view = &p.keys.mountpoint;
    let others: Vec<(&str, &Path, &Path)> = (mounts.uppers.iter())
        .map(|(id, up, v)| (id.as_str(), up.as_path(), v.as_path()))
        .collect();
    let failed = crate::store::FailedSetup {
        others: &others,
        run: mounts.run_id,
        cache: p.keys.id.as_str(),
        upper,
        view,
        script,
        status,
        output,
    };
    match crate::store::keep_failed_logs(&pd, &failed) {
        Ok(kept) => kept,
        Err(e) => {
            eprintln!("layercache: warning: the failed setup's logs could not be kept: {e}");
            None
        }
    }
}

/// Phase 4, promote (after setup exits 0 on a miss or restore): `exclude` matches removed,
/// then [`Mounter::commit`]; the new layer's figures go into `p.event` and its remount
/// replaces `p.mounted`'s source. An empty published layer is warned about.
fn promote(mounter: &dyn Mounter, cache: &Cache, p: &mut Prep) -> Result<()> {
    remove_excluded(&p.mounted.source, &cache.exclude)?;
    let t = Instant::now();
    let committed = mounter.commit(&p.keys.mountpoint, &p.keys.inputs)?;
    p.event.promote_ms = t.elapsed().as_millis() as u64;
    p.event.published = committed.published;
    p.event.bytes = committed.bytes;
    p.event.files = committed.files;
    if let Some((source, run, upper)) = committed.remount {
        p.mounted.source = source;
        p.mounted.run = run;
        p.mounted.upper = upper;
    }
    p.event.new_files = committed.new_files;
    p.event.new_bytes = committed.new_bytes;
    if committed.published && p.event.empty_layer() {
        // A hit of it would save nothing; say so where it happens.
        eprintln!(
            "layercache: warning: cache {:?} published an empty layer (0 files, 0 B): its \
             setup wrote nothing to {} — the tool likely wrote its cache elsewhere (is \
             the variable it reads, e.g. the preset's env, set to {{mount}}?); a hit of \
             this layer saves nothing",
            cache.id.as_str(),
            p.keys.mountpoint.display(),
        );
    }
    Ok(())
}

/// Phase 6, COMMAND in `views` with `run_env`; when it exits 0, the views of `saves` (cache
/// id, view path: the `save = "success"` caches) promoted as newer layers of their keys
/// ([`save_views`]); then every cache unmounted. The events of the layers saved, and
/// COMMAND's exit status, unless a signal stopped the run or a mount's daemon died meanwhile
/// (then that error).
fn command(
    steps: &Steps<'_>,
    mounts: &mut Mounts<'_>,
    command: &[OsString],
    run_env: &BTreeMap<String, String>,
    views: &Views,
    saves: &[&Prep],
) -> (Vec<Event>, Result<i32>) {
    let status = match steps.command(command, true, run_env, views) {
        Ok(s) => s,
        Err(e) => return (Vec::new(), Err(e)),
    };
    let died = mounts.check_all();
    let mut saved = Vec::new();
    if status == 0 && died.is_ok() && stopped().is_none() {
        saved = save_views(mounts, saves);
    }
    let end = (|| {
        mounts.unmount_all()?;
        if let Some(sig) = stopped() {
            return Err(interrupted_error(sig));
        }
        died?;
        Ok(status)
    })();
    (saved, end)
}

/// `save = "success"`: each view of `saves` promoted as a newer layer of its key when it
/// changed ([`Mounter::save`]), said on stderr; a failure is a warning (COMMAND succeeded; the
/// key keeps its layer), a full store said in plain words. Returns the event of each layer
/// saved (the preparation's, [`Event::saved`], with the save's promotion), for the event log
/// as a miss's publish is logged.
fn save_views(mounts: &mut Mounts<'_>, saves: &[&Prep]) -> Vec<Event> {
    let mut events = Vec::new();
    for p in saves {
        let (id, view) = (p.event.cache.as_str(), &p.keys.mountpoint);
        let t = Instant::now();
        let saved = mounts.mounter.save(view);
        mounts.points.retain(|v| v != view);
        match saved {
            Ok(Some(c)) => {
                eprintln!(
                    "layercache: {id}: saved what the run wrote to {} as a newer layer of its \
                     key ({} files, {}; new {} files, {})",
                    view.display(),
                    c.files,
                    fmt_bytes(c.bytes),
                    c.new_files,
                    fmt_bytes(c.new_bytes)
                );
                events.push(Event {
                    time_ms: telemetry::now_ms(),
                    mount_ms: 0,
                    setup_ms: 0,
                    maintenance_ms: 0,
                    promote_ms: t.elapsed().as_millis() as u64,
                    bytes: c.bytes,
                    files: c.files,
                    published: c.published,
                    new_files: c.new_files,
                    new_bytes: c.new_bytes,
                    remote_hit: false,
                    pulled_bytes: 0,
                    pulled_objects: 0,
                    pulled_ms: 0,
                    why: Vec::new(),
                    saved: true,
                    ..p.event.clone()
                });
            }
            Ok(None) => {}
            Err(e) if e.is_no_space() => eprintln!(
                "layercache: warning: {}",
                crate::store::store_full_message(mounts.store, &format!("saving cache {id:?}"))
            ),
            Err(e) => eprintln!(
                "layercache: warning: {id}: saving the view failed ({e}); its key keeps its \
                 layer"
            ),
        }
    }
    events
}

fn interrupted<T>(mounts: &mut Mounts<'_>, sig: i32) -> Result<T> {
    mounts.unmount_all()?;
    Err(interrupted_error(sig))
}

fn interrupted_error(sig: i32) -> Error {
    Error::Child {
        what: format!("run (interrupted by signal {sig})"),
        status: 128 + sig,
    }
}

fn log_event(store: &Path, event: &Event, reserve: &mut telemetry::EventReserve) {
    if let Err(e) = reserve.append(store, event) {
        tracing::warn!("telemetry: {e}");
    }
}

/// What the children of the run see: the workdir at its view path, each cache's private mount
/// at its view path (parents first; one already there only when the sandbox binds it anyway,
/// [`Sandbox::binds_in_place`]), and a private tmpfs over the mount root when a view lies
/// below it.
fn views(sandbox: &Sandbox, paths: &Paths, preps: &[Prep]) -> Views {
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
struct Steps<'a> {
    sandbox: &'a Sandbox,
    paths: &'a Paths,
    /// `--user` of none and bwrap, resolved on the host.
    user: Option<sandbox::user::RunUser>,
    rootless: Option<rootless::Rootless>,
    run_id: &'a str,
}

impl<'a> Steps<'a> {
    fn of(cfg: &'a RunConfig) -> Self {
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
    fn script(
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
    fn command(
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

/// Deletes `exclude` matches from the mount before promotion (whiteouts in the upper, so the
/// new layer does not hold them).
fn remove_excluded(mount: &Path, exclude: &[String]) -> Result<()> {
    for pattern in exclude {
        for rel in key::find_matches(mount, pattern)? {
            let path = mount.join(&rel);
            let meta = std::fs::symlink_metadata(&path).at(&path)?;
            if meta.is_dir() {
                std::fs::remove_dir_all(&path).at(&path)?;
            } else {
                std::fs::remove_file(&path).at(&path)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
