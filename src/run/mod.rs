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
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey, ProjectId};
use crate::key::{self, CacheKeys, Environment};
use crate::sandbox::{self, Sandbox};
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
    /// The mount is an idle warm mount an earlier run of the layer left, adopted by this run
    /// (`store/warm.rs`).
    pub warm: bool,
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

/// What a lazily mounted layer fetched from the remote tier while its run lasted
/// ([`Mounter::take_lazy_fetched`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LazyFetched {
    /// The cache.
    pub cache: CacheId,
    /// Object bytes fetched.
    pub bytes: u64,
    /// Objects fetched.
    pub objects: u64,
}

/// What a lazily mounted layer fetched before the run's first step: the files its trace names
/// that are likely to be mmapped ([`Mounter::await_prefetch`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefetched {
    /// Objects local when the prefetch ended.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Why nothing was fetched first, if so ("no trace", "… would take 170 ms …").
    pub skipped: Option<String>,
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
    /// What the mounts of lazily mounted layers fetched while the run lasted, taken (each
    /// said once), for the caches whose mount ended since the last call. The default: none.
    fn take_lazy_fetched(&self) -> Vec<LazyFetched> {
        Vec::new()
    }
    /// For a lazily mounted layer at `view`: waits until its daemon has fetched the files its
    /// trace names that are likely to be mmapped (`.node`, `.so`, `.jar`: an EIO on a page
    /// fault is a SIGBUS) or given up, at most until the prefetch's budget
    /// (`LAYERCACHE_LAZY_PREFETCH` after the run's start) is over; what it fetched, or `None`
    /// (not a lazy mount, or nothing said in time: the run goes on, the rest arrives
    /// meanwhile). The default: `None` at once.
    fn await_prefetch(&self, _view: &Path) -> Option<Prefetched> {
        None
    }
    /// The key salt a run keys with first ([`crate::key::KeySalt`]; the store's local one,
    /// without a round trip to its remote tier); `None` keys with plain digests (the unit
    /// tests' fake).
    fn key_salt(&self, _project: &ProjectId) -> Result<Option<key::KeySalt>> {
        Ok(None)
    }
    /// The project's key salt agreed with the store's remote tier, asked before a run
    /// publishes what may be pushed (a cache that is not a hit, or a `save = "success"`
    /// cache): a key published to the remote is keyed with it. The default:
    /// [`Mounter::key_salt`].
    fn agreed_key_salt(&self, project: &ProjectId) -> Result<Option<key::KeySalt>> {
        self.key_salt(project)
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
mod mounts;
mod pidns;
pub mod preflight;
mod progress;
pub mod rootless;
mod setup;
mod steps;
mod summary;
mod tail;

pub use crate::units::fmt_bytes;
pub use child::Views;
use child::{SignalGuard, stopped};
pub use mounter::{NoMounts, StoreMounter};
use mounts::Mounts;
use setup::setup_or_maintenance;
use steps::{Steps, views};
use summary::print_summary;

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
    let mut mounts = Mounts::new(mounter, &cfg.store, &cfg.run_id);
    let mut preps = keyed_mounts(cfg, &mut mounts)?;
    mounts.prepare_views(&cfg.paths, &cfg.sandbox, &preps)?;
    await_prefetches(mounter, &mut preps);

    // Every script and COMMAND sees every cache's environment.
    let mut run_env = BTreeMap::new();
    for (cache, p) in cfg.spec.caches.iter().zip(&preps) {
        run_env.extend(cache.env_for(&cfg.paths, &p.keys.mountpoint));
    }

    // Room for the events even when a setup fills the store's filesystem: only a cache that
    // is not a hit runs a setup, so a run of hits makes none.
    let mut reserve = (preps.iter().any(|p| p.mounted.result != CacheResult::Hit))
        .then(|| telemetry::EventReserve::make(&cfg.store, &cfg.run_id));
    for (ci, cache) in cfg.spec.caches.iter().enumerate() {
        let views = views(&cfg.sandbox, &cfg.paths, &preps);
        let step = (&mut preps[..], ci);
        let stop = setup_or_maintenance(&steps, &mounts, cache, step, &run_env, &views, cfg.json)?;
        let p = &mut preps[ci];
        if let Some(e) = stop {
            // Unmounting discards the private uppers first: their space is free for the event.
            let unmounted = mounts.unmount_all();
            log_event(&cfg.store, &p.event, &mut reserve);
            log_lazy_fetched(cfg, mounter, &preps, &mut reserve);
            unmounted?;
            return Err(e);
        }
        if p.mounted.result != CacheResult::Hit
            && let Err(e) = promote(mounter, cache, p)
        {
            let unmounted = mounts.unmount_all();
            log_event(&cfg.store, &p.event, &mut reserve);
            log_lazy_fetched(cfg, mounter, &preps, &mut reserve);
            unmounted?;
            return Err(if e.is_no_space() {
                let what = format!("promoting cache {:?}", cache.id.as_str());
                // The room when promote met ENOSPC: its cleanup (and the unmounts) freed
                // what ran out, the inodes above all.
                let at = e.room_when_full();
                Error::StoreFull {
                    message: crate::store::store_full_message(&cfg.store, &what, at),
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
    log_lazy_fetched(cfg, mounter, &preps, &mut reserve);
    status
}

/// Before the first step (maintenance or COMMAND): waits for each lazily mounted cache's
/// prefetch of the files likely to be mmapped ([`Mounter::await_prefetch`], one budget from
/// the run's start for all of them), logged; the wait counts in that cache's mount time (its
/// summary line and event tell the time to COMMAND start).
fn await_prefetches(mounter: &dyn Mounter, preps: &mut [Prep]) {
    for p in preps.iter_mut().filter(|p| p.event.remote_lazy) {
        let t = Instant::now();
        let got = mounter.await_prefetch(&p.keys.mountpoint);
        let waited_ms = t.elapsed().as_millis() as u64;
        p.event.mount_ms += waited_ms;
        let cache = &p.event.cache;
        match got {
            Some(f) => tracing::info!(
                %cache,
                objects = f.objects,
                bytes = f.bytes,
                waited_ms,
                skipped = f.skipped.as_deref().unwrap_or("no"),
                "lazy mount: {} of likely-mmapped files fetched before COMMAND",
                fmt_bytes(f.bytes)
            ),
            None => tracing::info!(
                %cache,
                waited_ms,
                "lazy mount: its prefetch did not end within its budget; COMMAND starts"
            ),
        }
    }
}

/// Logs what each lazily mounted layer fetched while the run lasted, once its mount ended
/// ([`Mounter::take_lazy_fetched`]), as an event of its cache's preparation with
/// [`Event::lazy_fetch`] set.
fn log_lazy_fetched(
    cfg: &RunConfig,
    mounter: &dyn Mounter,
    preps: &[Prep],
    reserve: &mut Option<telemetry::EventReserve>,
) {
    for f in mounter.take_lazy_fetched() {
        let Some(p) = preps.iter().find(|p| p.event.cache == f.cache.as_str()) else {
            continue;
        };
        let event = Event {
            time_ms: telemetry::now_ms(),
            mount_ms: 0,
            setup_ms: 0,
            maintenance_ms: 0,
            promote_ms: 0,
            published: false,
            pulled_bytes: f.bytes,
            pulled_objects: f.objects,
            pulled_ms: 0,
            why: Vec::new(),
            saved: false,
            lazy_fetch: true,
            ..p.event.clone()
        };
        log_event(&cfg.store, &event, reserve);
    }
}

/// Phases 1 and 2 keyed with the project's salt: the keys with the salt the run keys with
/// first ([`Mounter::key_salt`], no round trip to the remote tier), then the mounts. When the
/// run may publish what is pushed — a cache that is not a hit, or a `save = "success"` cache
/// — the salt agreed with the remote tier is asked ([`Mounter::agreed_key_salt`]); when it
/// differs (the remote's replaced the local one: the keys change once), everything is
/// unmounted and keyed and mounted again with it, so a key published to the remote is keyed
/// with the agreed salt. The time the salts took (a remote that does not answer is a wait of
/// up to `lookup_timeout` there) and that of mounts undone for another salt is the first
/// cache's mount time ([`charge_first`]): the summary tells the whole preparation.
///
/// Errors: as [`keys`] and [`mount_all`], and the salt's.
fn keyed_mounts(cfg: &RunConfig, mounts: &mut Mounts<'_>) -> Result<Vec<Prep>> {
    let project = &cfg.spec.project;
    let t = Instant::now();
    let salt = mounts.mounter.key_salt(project)?;
    let mut unshown = t.elapsed();
    let all_keys = keys(cfg, salt)?;
    for cache in &cfg.spec.caches {
        for name in cache.unset_variables() {
            eprintln!(
                "layercache: warning: cache {:?}: {{env:{name}}} is unset here, so it is \
                 substituted as an empty string",
                cache.id.as_str()
            );
        }
    }
    let preps = mount_all(mounts, all_keys, project, &cfg.run_id, &cfg.store)?;
    let publishes = preps.iter().any(|p| p.mounted.result != CacheResult::Hit)
        || (cfg.spec.caches.iter()).any(|c| c.save == crate::spec::SaveWhen::Success);
    if !publishes {
        return Ok(charge_first(preps, unshown));
    }
    let t = Instant::now();
    let agreed = mounts.mounter.agreed_key_salt(project)?;
    unshown += t.elapsed();
    if agreed == salt {
        return Ok(charge_first(preps, unshown));
    }
    let t = Instant::now();
    let undone: u64 = preps.iter().map(|p| p.event.mount_ms).sum();
    drop(preps);
    mounts.unmount_all()?;
    unshown += t.elapsed() + Duration::from_millis(undone);
    let all_keys = keys(cfg, agreed)?;
    let preps = mount_all(mounts, all_keys, project, &cfg.run_id, &cfg.store)?;
    Ok(charge_first(preps, unshown))
}

/// `preps` with `unshown` (time the preparation spent outside any cache's mount: the key
/// salt's round trips, mounts undone) added to the first cache's mount time (its `mount_ms`,
/// so its summary line and event), whole milliseconds.
fn charge_first(mut preps: Vec<Prep>, unshown: Duration) -> Vec<Prep> {
    if let Some(p) = preps.first_mut() {
        p.event.mount_ms += unshown.as_millis() as u64;
    }
    preps
}

/// Phase 1, keys: every cache's key, restore keys and view path ([`key::compute`]; in a
/// container the image's id stands for the tools; digests keyed with the project's `salt`).
///
/// Errors: [`Error::Invalid`] for a bad key file or two caches at one view path.
fn keys(cfg: &RunConfig, salt: Option<key::KeySalt>) -> Result<Vec<CacheKeys>> {
    let (spec, paths, sandbox, image) = (&cfg.spec, &cfg.paths, &cfg.sandbox, cfg.image.as_ref());
    let mut env = match (sandbox.tools_in_image(), image) {
        (true, Some(id)) => Environment::in_image(id.clone()),
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
            remote_lazy: mounted.pulled.as_ref().is_some_and(|p| p.lazy),
            lazy_bytes: mounted.pulled.as_ref().map_or(0, |p| p.lazy_bytes),
            warm: mounted.warm,
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
            lazy_fetch: false,
        };
        preps.push(Prep {
            keys: k,
            mounted,
            event,
        });
    }
    Ok(preps)
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
    if command.is_empty() {
        // What a newcomer's bare `layercache run` did, said: without it the caches' lines
        // are all there is, and nothing says no command ran.
        eprintln!(
            "layercache: no COMMAND given: only the caches were prepared; `layercache run -- \
             COMMAND…` runs one with them in place"
        );
    }
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
                     key ({}, {}; new {}, {})",
                    view.display(),
                    crate::units::fmt_files(c.files),
                    fmt_bytes(c.bytes),
                    crate::units::fmt_files(c.new_files),
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
                    remote_lazy: false,
                    lazy_bytes: 0,
                    warm: false,
                    why: Vec::new(),
                    saved: true,
                    ..p.event.clone()
                });
            }
            Ok(None) => {}
            Err(e) if e.is_no_space() => eprintln!(
                "layercache: warning: {}",
                crate::store::store_full_message(
                    mounts.store,
                    &format!("saving cache {id:?}"),
                    e.room_when_full()
                )
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

/// Appends `event` to the store's event log, through `reserve` when the run made one
/// ([`telemetry::EventReserve::append`]); a failure is a warning.
fn log_event(store: &Path, event: &Event, reserve: &mut Option<telemetry::EventReserve>) {
    let appended = match reserve {
        Some(r) => r.append(store, event),
        None => telemetry::append(store, event),
    };
    if let Err(e) = appended {
        tracing::warn!("telemetry: {e}");
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
