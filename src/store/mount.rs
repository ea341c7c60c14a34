//! `layercache mount`: look a key up (waiting for a concurrent fill of the same key), create a
//! run directory and mount the overlay over the layer (or an empty lower) with the run's own
//! upper. A mount returns a [`Mount`]: an RAII handle owning the leases this process holds for
//! it (the daemon holds duplicates for the mount's whole life).

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::lease::{Lease, Mode};
use super::ms_since;
use super::paths::{ProjectDirs, canonical_mountpoint, mkdir_mode, remove_tree};
use super::runs::{MountResult, RunRecord, write_record};
use super::{Notice, PullReport, Store, TreeCounts, UNMOUNT_WAIT};
use crate::error::{Error, Result};
use crate::ids::{CacheId, CacheKey, LayerId, ProjectId};
use crate::units::now_ms;
use crate::{overlay, sys};

/// What a lookup found (actions/cache semantics).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The exact key is published.
    Hit {
        /// Its layer.
        layer: LayerId,
    },
    /// A restore-key prefix matched: the most recently created layer of the first prefix that
    /// matches anything.
    Restore {
        /// The published key that matched.
        matched_key: CacheKey,
        /// Its layer.
        layer: LayerId,
    },
    /// Nothing matched.
    Miss,
}

/// Inputs of [`super::Store::mount`].
#[derive(Clone, Debug)]
pub struct MountRequest {
    /// Project (isolation unit).
    pub project: ProjectId,
    /// Cache id within the project.
    pub cache: CacheId,
    /// The primary key (published by a later commit).
    pub key: CacheKey,
    /// Restore-key prefixes, tried in order.
    pub restore_keys: Vec<CacheKey>,
    /// How long to wait for another run filling the same key before filling ourselves.
    pub fill_wait: Duration,
    /// Existing directory to mount on (host-visible, `layercache mount`); `None` mounts at the
    /// run's own `runs/<run>/mnt`, a place no other run uses (`layercache run`: the run binds it
    /// at the cache's view path in a mount namespace of its own).
    pub mountpoint: Option<PathBuf>,
    /// The process the mount belongs to: when it exits (even by `kill -9`) the overlay daemon
    /// ends the mount; `None` for a mount that lives until `umount`/`commit`.
    pub owner: Option<u32>,
    /// The overlay's ownership mapping (`squash_to_uid`/`squash_to_gid`: a run as
    /// another user sees the layer as its own; new files stay 0:0 in the upper).
    pub squash: crate::overlay::options::Squash,
    /// Whether the overlay uses FUSE passthrough; `Auto` decides from the mounted layer's
    /// manifest ([`crate::overlay::options::PassthroughChoice::decide`]).
    pub passthrough: crate::overlay::options::PassthroughChoice,
    /// Whether an exact hit found only in the remote tier may be mounted lazily (its content
    /// fetched on first open, [`super::LazyLower`]); false pulls it whole first (a cache whose
    /// view is promoted again after the run, `save = "success"`, needs its layer local).
    pub lazy: bool,
}

impl MountRequest {
    /// The request of `rec`'s mount, to mount again at once (no fill wait) at the same
    /// mountpoint.
    pub(super) fn remount(rec: &RunRecord) -> MountRequest {
        MountRequest {
            project: rec.project.clone(),
            cache: rec.cache.clone(),
            key: rec.key.clone(),
            restore_keys: rec.restore_keys.clone(),
            fill_wait: Duration::ZERO,
            mountpoint: (!rec.private).then(|| rec.mountpoint.clone()),
            owner: rec.owner_pid,
            squash: rec.squash,
            passthrough: rec.passthrough,
            lazy: false,
        }
    }
}

/// The JSON line `layercache mount` prints; also returned to `layercache run`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MountOutcome {
    /// hit | restore | miss.
    pub result: MountResult,
    /// Project.
    pub project: ProjectId,
    /// Cache id.
    pub cache: CacheId,
    /// The primary key.
    pub key: CacheKey,
    /// The key whose layer is mounted (the key itself on a hit), if any.
    pub matched_key: Option<CacheKey>,
    /// The mounted layer, if any (none on a miss).
    pub layer: Option<LayerId>,
    /// Apparent bytes of the mounted layer (0 on a miss).
    pub bytes: u64,
    /// Regular files in the mounted layer.
    pub files: u64,
    /// Canonical mountpoint.
    pub mountpoint: PathBuf,
    /// Run id (`runs/<run>`).
    pub run: String,
    /// The overlay daemon's pid.
    #[serde(default)]
    pub daemon_pid: u32,
    /// True when this mount holds the key's fill lock (others wait for its commit).
    pub fill_lock: bool,
    /// What the remote tier pulled for this mount (a remote hit or restore), if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<super::PullReport>,
    /// Milliseconds spent waiting for another run's fill.
    pub waited_ms: u64,
    /// Milliseconds for the lookup (including any wait).
    pub lookup_ms: u64,
    /// Milliseconds to mount (overlay ready).
    pub mount_ms: u64,
    /// The mount is an idle warm mount of the layer that this run adopted (`warm.rs`): the
    /// kernel's caches of the layer are those an earlier run left.
    #[serde(default)]
    pub warm: bool,
    /// Total milliseconds.
    pub total_ms: u64,
}

/// Leases this process holds for a mount: the fill lock (a miss or restore, until publish) and
/// the others (the run lease, the shared lease on the lower layer). Dropping them releases
/// nothing the daemon still holds through its duplicates.
#[derive(Debug, Default)]
pub(super) struct Leases {
    pub(super) fill: Option<Lease>,
    pub(super) others: Vec<Lease>,
}

/// A store mount made by this process ([`Store::mount`]): what was mounted, plus the leases
/// this process holds for it, so an in-process [`Store::commit_mount`] keeps the fill lock from
/// mount through publish. Dropping it releases this process's leases only; the mount stays
/// (its daemon holds its own duplicates) until [`Store::umount`] or [`Store::commit`].
#[derive(Debug)]
pub struct Mount {
    /// What the mount found and where it is (the JSON `layercache mount` prints).
    pub outcome: MountOutcome,
    pub(super) leases: Leases,
}

impl Mount {
    /// Ends this process's part of a fill after the mount is gone (unmounted, daemon exited):
    /// removes the fill lock file while holding it, then releases it (so no
    /// `fills/<key>.lock` is left behind for gc to find). Without a fill lock, only drops the leases.
    pub fn end_fill(self) {
        if let Some(f) = self.leases.fill {
            f.remove();
        }
    }
}

/// One run's mount, as [`Store::mount_run`] makes it.
pub(super) struct RunMount<'a> {
    pub(super) pd: &'a ProjectDirs,
    pub(super) req: &'a MountRequest,
    /// Canonical mountpoint; `None`: the run's own `runs/<run>/mnt`.
    pub(super) mnt: Option<&'a Path>,
    pub(super) result: MountResult,
    pub(super) matched_key: Option<CacheKey>,
    /// The lower layer (none on a miss) and its shared lease.
    pub(super) layer: Option<(LayerId, Lease)>,
    pub(super) fill: Option<Lease>,
    /// An existing run directory to mount again (its upper kept), instead of a new run.
    pub(super) reuse: Option<&'a Path>,
    /// The lower layer when it is mounted lazily (then `layer` is `None`), and the shared
    /// lease on its partial directory.
    pub(super) lazy: Option<(super::LazyLower, Lease)>,
}

impl Store {
    /// Looks `key` up in (`project`, `cache`): exact key → [`Lookup::Hit`]; else each prefix
    /// of `restore_keys` in order, the most recently created matching layer first →
    /// [`Lookup::Restore`]; else [`Lookup::Miss`]. Scoped to the cache: a prefix never matches
    /// another cache's or project's keys. Keys whose layer is gone are ignored.
    ///
    /// Errors: [`Error::Io`] reading the keys directory.
    pub fn lookup(
        &self,
        pd: &ProjectDirs,
        cache: &CacheId,
        key: &CacheKey,
        restore_keys: &[CacheKey],
    ) -> Result<Lookup> {
        if let Some(id) = pd.read_key(cache, key)?
            && pd.layer(&id).tree().is_dir()
        {
            return Ok(Lookup::Hit { layer: id });
        }
        if restore_keys.is_empty() {
            return Ok(Lookup::Miss);
        }
        let keys = pd.keys(cache)?;
        for prefix in restore_keys {
            let best = keys
                .iter()
                .filter(|(k, _)| k.as_str().starts_with(prefix.as_str()))
                .filter_map(|(k, id)| {
                    let m = pd.layer(id).manifest().ok()?;
                    Some((m.created_ms, id.clone(), k.clone()))
                })
                .max();
            if let Some((_, layer, matched_key)) = best {
                return Ok(Lookup::Restore { matched_key, layer });
            }
        }
        Ok(Lookup::Miss)
    }

    /// Takes a shared lease on layer `id`; `None` if the layer is gone (evicted meanwhile).
    pub(super) fn lease_layer(&self, pd: &ProjectDirs, id: &LayerId) -> Result<Option<Lease>> {
        let l = pd.layer(id);
        match Lease::acquire(&l.lease_path(), Mode::Shared) {
            Ok(lease) if l.tree().is_dir() => Ok(Some(lease)),
            Ok(_) => Ok(None),
            Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `layercache mount`: looks the key up (see [`Store::lookup`]), waits up to
    /// `req.fill_wait` for a concurrent fill of the same key (then looks up again, usually a
    /// hit), and mounts the overlay (lower = the layer or an empty dir, upper = a fresh
    /// `runs/<run>/upper`). The mount is ready when this returns; its daemon holds the leases
    /// (shared on the lower layer, exclusive fill lock on a miss/restore) for its whole life.
    /// Waiting for another fill is reported through the store's notice callback.
    ///
    /// Errors: [`Error::MountpointBusy`] or [`Error::Invalid`] for a busy or bad mountpoint;
    /// [`Error::Io`]/[`Error::Failed`] when the store or the mount fails (the run directory is
    /// removed then).
    pub fn mount(&self, req: &MountRequest) -> Result<Mount> {
        let span = tracing::info_span!("mount", project = %req.project, cache = %req.cache,
            key = %req.key);
        let _e = span.enter();
        let t0 = Instant::now();
        let mnt = match &req.mountpoint {
            Some(p) => Some(self.free_mountpoint(p)?),
            None => None,
        };
        let pd = self.project(&req.project)?;
        let fill_path = pd.fill_lock(&req.cache, &req.key);
        if let Some(parent) = fill_path.parent() {
            fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        let mut found = self.settle_lookup(&pd, req, &fill_path, t0 + req.fill_wait)?;
        let lookup_ms = ms_since(t0);
        let lazy = found.lazy.take();
        let lazy_report = lazy.as_ref().map(|(l, _)| l.report.clone());
        let (result, matched_key, layer) = match found.lookup {
            Lookup::Hit { layer } => (MountResult::Hit, Some(req.key.clone()), Some(layer)),
            Lookup::Restore { matched_key, layer } => {
                (MountResult::Restore, Some(matched_key), Some(layer))
            }
            Lookup::Miss => (MountResult::Miss, None, None),
        };
        let refused = lazy.as_ref().map(|(l, _)| l.refused.clone());
        let mounted = self.mount_run(RunMount {
            pd: &pd,
            req,
            mnt: mnt.as_deref(),
            result,
            matched_key,
            layer: layer.filter(|_| lazy.is_none()).zip(found.lower_lease),
            fill: found.fill,
            reuse: None,
            lazy,
        });
        let mut m = match mounted {
            // The daemon refused the lazy layer (its manifest breaks the rules; it marked the
            // layer broken): once more without lazy layers (a full pull, or a local miss when
            // the remote's layer is no good).
            Err(e) if req.lazy && refused.is_some_and(|r| r.exists()) => {
                self.notify(Notice::Remote {
                    message: format!(
                        "mounting {} key {} lazily failed: {e}; pulling it whole instead",
                        req.cache, req.key
                    ),
                });
                drop(_e);
                return self.mount(&MountRequest {
                    lazy: false,
                    ..req.clone()
                });
            }
            r => r?,
        };
        m.outcome.waited_ms = found.waited.as_millis() as u64;
        m.outcome.remote = found.pulled.or(lazy_report);
        m.outcome.lookup_ms = lookup_ms;
        m.outcome.total_ms = ms_since(t0);
        tracing::info!(result = ?m.outcome.result, run = %m.outcome.run,
            ms = m.outcome.total_ms, "mounted");
        Ok(m)
    }

    /// The canonical form of `mountpoint`, cleared of what a killed mount or commit left
    /// there.
    ///
    /// Errors: [`Error::Invalid`] for a bad mountpoint; [`Error::MountpointBusy`] when
    /// something else is mounted there.
    fn free_mountpoint(&self, mountpoint: &Path) -> Result<PathBuf> {
        let mnt = canonical_mountpoint(mountpoint)?;
        if overlay::is_mountpoint_busy(&mnt)? {
            self.clear_leftover_mounts(&mnt, false)?;
        }
        if overlay::is_mountpoint_busy(&mnt)? {
            return Err(Error::MountpointBusy { mountpoint: mnt });
        }
        Ok(mnt)
    }

    /// The lookup phase of [`Store::mount`]: looks `req`'s key up until the answer is one to
    /// mount. A hit is leased and mounted; otherwise the key's fill lock (`fill_path`) is
    /// taken, waiting until `deadline` for another run's fill (then this run fills too), the
    /// lookup repeated under it, the remote tier asked once, and a restore match leased.
    ///
    /// Errors: [`Error::Io`] reading keys or taking leases.
    fn settle_lookup(
        &self,
        pd: &ProjectDirs,
        req: &MountRequest,
        fill_path: &Path,
        deadline: Instant,
    ) -> Result<Settled> {
        let mut fill: Option<Lease> = None;
        let mut gave_up = false;
        // Set when this run got the fill lock by waiting for another run that held it: said
        // ([`Notice::FillTakenOver`]) only if this run then fills the key itself — the other
        // run may have mounted a remote layer lazily (publishing nothing here), and this one
        // then does so too.
        let mut after_other_fill = false;
        let mut waited = Duration::ZERO;
        let (mut remote_tried, mut pulled) = (false, None);
        loop {
            let found = self.lookup(pd, &req.cache, &req.key, &req.restore_keys)?;
            if let Lookup::Hit { layer } = &found {
                match self.lease_layer(pd, layer)? {
                    Some(l) => {
                        // A hit needs no fill: a lock taken for one (then a pull published
                        // the key) goes with its file, as when a fill ends.
                        if let Some(f) = fill.take() {
                            f.remove();
                        }
                        return Ok(Settled::new(found, Some(l), fill, waited, pulled));
                    }
                    None => continue,
                }
            }
            if fill.is_none() && !gave_up {
                if let Some(l) = Lease::try_acquire(fill_path, Mode::Exclusive)? {
                    fill = Some(l);
                    continue; // look up again under the lock: the filler may have published
                }
                let w = Instant::now();
                fill = self.wait_for_fill(req, fill_path, deadline)?;
                gave_up = fill.is_none();
                after_other_fill = fill.is_some();
                waited += w.elapsed();
                continue;
            }
            // Remote tier: the exact key missed here; ask the remote once (under the
            // fill lock), and look up again once a pull has published the layer locally. A
            // local restore match is kept rather than pulling another restore match.
            if !remote_tried && let Some(r) = &self.remote {
                remote_tried = true;
                let restore: &[CacheKey] = match found {
                    Lookup::Restore { .. } => &[],
                    _ => &req.restore_keys,
                };
                match r.fetch_for_mount(self, pd, &req.cache, &req.key, restore, req.lazy) {
                    Some(super::Fetched::Pulled(rep)) => {
                        pulled = Some(rep);
                        continue;
                    }
                    Some(super::Fetched::Lazy(lazy)) => {
                        let lease = Lease::acquire(&lazy.dir.join("lease"), Mode::Shared)?;
                        // A hit needs no fill: the lock goes with its file.
                        if let Some(f) = fill.take() {
                            f.remove();
                        }
                        let found = Lookup::Hit {
                            layer: lazy.layer.clone(),
                        };
                        let mut s = Settled::new(found, None, None, waited, None);
                        s.lazy = Some((lazy, lease));
                        return Ok(s);
                    }
                    None => {}
                }
            }
            let lower = match &found {
                Lookup::Restore { layer, .. } => match self.lease_layer(pd, layer)? {
                    Some(l) => Some(l),
                    None => continue,
                },
                _ => None,
            };
            if fill.is_some() && std::mem::take(&mut after_other_fill) {
                // The other run let go of the lock and nothing was published: say why we fill.
                self.notify(Notice::FillTakenOver {
                    key: req.key.clone(),
                });
            }
            return Ok(Settled::new(found, lower, fill, waited, pulled));
        }
    }

    /// Waits until `deadline` for the fill lock at `fill_path` that another run of `req`'s
    /// key holds, telling [`Notice::WaitingForFill`] (and [`Notice::FillTimedOut`] when it
    /// gives up). Returns the lock, or `None` when the wait timed out.
    ///
    /// Errors: [`Error::Io`] taking the lock.
    fn wait_for_fill(
        &self,
        req: &MountRequest,
        fill_path: &Path,
        deadline: Instant,
    ) -> Result<Option<Lease>> {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if !remaining.is_zero() {
            self.notify(Notice::WaitingForFill {
                project: req.project.clone(),
                cache: req.cache.clone(),
                key: req.key.clone(),
                wait: remaining,
            });
        }
        let fill = Lease::acquire_timeout(fill_path, Mode::Exclusive, remaining)?;
        if fill.is_none() {
            self.notify(Notice::FillTimedOut {
                key: req.key.clone(),
            });
        }
        Ok(fill)
    }

    /// Creates (or reuses, when `m.reuse` names an existing run dir) a run and mounts it.
    ///
    /// Errors: as [`Store::mount`]; a new run directory is removed on error.
    pub(super) fn mount_run(&self, m: RunMount<'_>) -> Result<Mount> {
        let t0 = Instant::now();
        // An exact local hit's first opens are recorded (for fresh runners' lazy mounts of
        // this key) until the layer's trace was stored once.
        let tracing = self.remote.is_some()
            && m.result == MountResult::Hit
            && m.layer
                .as_ref()
                .is_some_and(|(id, _)| !m.pd.layer(id).trace_stored_path().exists());
        let warm = m.reuse.is_none()
            && super::warm::capable(
                m.result,
                m.layer.is_some() && m.lazy.is_none(),
                m.mnt.is_none(),
                m.req.owner.is_some(),
                tracing,
            );
        let wanted = |owner| super::warm::Wanted {
            owner,
            squash: m.req.squash,
            passthrough: m.req.passthrough,
            key: &m.req.key,
            restore_keys: &m.req.restore_keys,
        };
        if warm
            && let (Some((id, _)), Some(owner)) = (&m.layer, m.req.owner)
            && let Some(a) = self.adopt_warm(m.pd, id, wanted(owner))
        {
            return self.adopted(m, a, t0);
        }
        let (run_id, run_dir) = match m.reuse {
            Some(d) => (
                d.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                d.to_path_buf(),
            ),
            None => {
                let id = format!("{:012x}-{}", now_ms(), sys::random_hex(6));
                let d = m.pd.runs().join(&id);
                mkdir_mode(&d, 0o700)?;
                (id, d)
            }
        };
        let started = start_daemon(&m, &run_id, &run_dir, tracing, warm).inspect_err(|_| {
            if m.reuse.is_none() {
                let _ = remove_tree(&run_dir);
            }
        })?;
        let lazy_layer = m.lazy.as_ref().map(|(l, _)| l.layer.clone());
        let layer = m.layer.as_ref().map(|(id, _)| id.clone());
        if let Some(id) = &layer
            && let Err(e) = m.pd.layer(id).touch_used()
        {
            tracing::warn!(error = %e, "could not record the layer's last use");
        }
        let mut others = vec![started.run_lease];
        others.extend(m.layer.map(|(_, l)| l));
        others.extend(m.lazy.map(|(_, l)| l));
        let has_fill = m.fill.is_some();
        Ok(Mount {
            outcome: MountOutcome {
                result: m.result,
                project: m.pd.project.clone(),
                cache: m.req.cache.clone(),
                key: m.req.key.clone(),
                matched_key: m.matched_key,
                layer: layer.or(lazy_layer),
                bytes: started.counts.bytes,
                files: started.counts.files,
                mountpoint: started.mnt,
                run: run_id,
                daemon_pid: started.pid,
                fill_lock: has_fill,
                remote: None,
                waited_ms: 0,
                lookup_ms: 0,
                mount_ms: started.mount_ms,
                total_ms: ms_since(t0),
                warm: false,
            },
            leases: Leases {
                fill: m.fill,
                others,
            },
        })
    }
}

impl Store {
    /// The [`Mount`] of warm mount `a` that `m`'s run adopted: the layer's lease is this
    /// process's (the daemon holds its own and the run's).
    ///
    /// Errors: [`Error::Io`] reading the layer's manifest.
    fn adopted(&self, m: RunMount<'_>, a: super::warm::Adopted, t0: Instant) -> Result<Mount> {
        let (id, lease) = m.layer.expect("an adopted mount is of a layer");
        let l = m.pd.layer(&id);
        if let Err(e) = l.touch_used() {
            tracing::warn!(error = %e, "could not record the layer's last use");
        }
        let counts = l.manifest()?.counts;
        let ms = ms_since(t0);
        Ok(Mount {
            outcome: MountOutcome {
                result: MountResult::Hit,
                project: m.pd.project.clone(),
                cache: m.req.cache.clone(),
                key: m.req.key.clone(),
                matched_key: m.matched_key,
                layer: Some(id),
                bytes: counts.bytes,
                files: counts.files,
                mountpoint: a.rec.mountpoint.clone(),
                run: a.rec.run.clone(),
                daemon_pid: a.rec.daemon_pid,
                fill_lock: false,
                remote: None,
                waited_ms: 0,
                lookup_ms: 0,
                mount_ms: ms,
                total_ms: ms,
                warm: true,
            },
            leases: Leases {
                fill: m.fill,
                others: vec![lease],
            },
        })
    }
}

/// What the lookup phase of [`Store::mount`] settled on: the answer, the lease on its layer
/// (a hit or restore), the fill lock (a miss or restore), the time waited for another fill
/// and what the remote tier pulled.
struct Settled {
    lookup: Lookup,
    lower_lease: Option<Lease>,
    fill: Option<Lease>,
    waited: Duration,
    pulled: Option<PullReport>,
    /// A remote hit to mount lazily, with the lease on its partial directory.
    lazy: Option<(super::LazyLower, Lease)>,
}

impl Settled {
    fn new(
        lookup: Lookup,
        lower_lease: Option<Lease>,
        fill: Option<Lease>,
        waited: Duration,
        pulled: Option<PullReport>,
    ) -> Settled {
        Settled {
            lookup,
            lower_lease,
            fill,
            waited,
            pulled,
            lazy: None,
        }
    }
}

/// An overlay daemon [`start_daemon`] started for a run.
struct Started {
    /// Where it is mounted.
    mnt: PathBuf,
    /// The run's lease (the daemon holds a duplicate).
    run_lease: Lease,
    /// The daemon's pid.
    pid: u32,
    /// Milliseconds until the overlay was ready.
    mount_ms: u64,
    /// The lower layer's counts (zero for an empty lower).
    counts: TreeCounts,
}

/// The mount of [`Store::mount_run`] in the run directory `run_dir` (run `run_id`): creates
/// its upper, work dir and (for a private mount) `mnt`, takes the run lease, writes the run
/// record and starts the overlay daemon over `m`'s layer (or the empty lower), handing it
/// duplicates of the leases, then records the daemon's pid. With a `remote` tier, an exact
/// hit's daemon records its first opens ([`super::runs::OPEN_TRACE`]) until the layer's trace
/// was stored once. The caller removes a new run directory on error.
///
/// Errors: as [`Store::mount`].
fn start_daemon(
    m: &RunMount<'_>,
    run_id: &str,
    run_dir: &Path,
    tracing: bool,
    warm: bool,
) -> Result<Started> {
    let upper = run_dir.join("upper");
    let work = run_dir.join("work");
    let mnt = match m.mnt {
        Some(p) => p.to_path_buf(),
        None => {
            let p = run_dir.join("mnt");
            mkdir_mode(&p, 0o755)?;
            p
        }
    };
    mkdir_mode(&upper, 0o755)?;
    mkdir_mode(&work, 0o700)?;
    let run_lease = Lease::acquire(&run_dir.join("lease"), Mode::Exclusive)?;
    let (lower_dir, counts) = match (&m.layer, &m.lazy) {
        (Some((id, _)), _) => {
            let l = m.pd.layer(id);
            (l.tree(), l.manifest()?.counts)
        }
        (None, Some((lazy, _))) => (lazy.dir.clone(), lazy.counts),
        (None, None) => (m.pd.empty(), TreeCounts::default()),
    };
    let raw = overlay::options::RawOptions {
        lowerdirs: vec![lower_dir],
        upperdir: Some(upper),
        workdir: Some(work),
        squash: m.req.squash,
        passthrough: m.req.passthrough.decide(counts.large_bytes, counts.files),
        ..Default::default()
    };
    let mut cfg = overlay::options::validate(&raw, &mnt)?;
    // The upper is this run's alone: no file handle outlives its mount.
    cfg.persist_handles = false;
    // A layer's files are all object links: show the links its promoted tree had.
    if let Some((id, _)) = &m.layer {
        let links = overlay::links::LowerLinks::Recorded(m.pd.layer(id).links_path());
        cfg.lower_links = vec![links];
        // An exact hit's first opens, for fresh runners' lazy mounts of this key (stored
        // once per layer: `trace-stored`).
        if tracing {
            cfg.open_trace = Some(run_dir.join(super::runs::OPEN_TRACE));
        }
    }
    if let Some((lazy, _)) = &m.lazy {
        let links = overlay::links::LowerLinks::Recorded(lazy.dir.join("links"));
        cfg.lower_links = vec![links];
        let mut spec = lazy.spec.clone();
        spec["run_dir"] = serde_json::Value::String(run_dir.to_string_lossy().into_owned());
        cfg.made_lowers = vec![overlay::options::MadeLower { index: 0, spec }];
    }
    let mut hold: Vec<OwnedFd> = Vec::new();
    let mut fill_lock_fd = None;
    if let Some(f) = &m.fill {
        let d = f.dup_fd()?;
        fill_lock_fd = Some(d.as_raw_fd());
        hold.push(d);
    }
    if let Some((_, l)) = &m.layer {
        hold.push(l.dup_fd()?);
    }
    if let Some((_, l)) = &m.lazy {
        hold.push(l.dup_fd()?);
    }
    hold.push(run_lease.dup_fd()?);
    let mut rec = RunRecord {
        run: run_id.to_string(),
        project: m.pd.project.clone(),
        cache: m.req.cache.clone(),
        key: m.req.key.clone(),
        restore_keys: m.req.restore_keys.clone(),
        result: m.result,
        matched_key: m.matched_key.clone(),
        lower: m.layer.as_ref().map(|(id, _)| id.clone()),
        lazy_layer: m.lazy.as_ref().map(|(l, _)| l.layer.clone()),
        mountpoint: mnt.clone(),
        daemon_pid: 0,
        fill_lock_fd,
        mounted_ms: now_ms(),
        private: m.mnt.is_none(),
        owner_pid: m.req.owner,
        squash: m.req.squash,
        passthrough: m.req.passthrough,
        mounter_pid: Some(std::process::id()),
        warm,
    };
    if warm {
        cfg.control = Some(run_dir.join(super::warm::CONTROL));
    }
    write_record(run_dir, &rec)?;
    let tm = Instant::now();
    let pid = overlay::mount_daemon(&cfg, &mnt, hold, m.req.owner)?;
    let mount_ms = ms_since(tm);
    rec.daemon_pid = pid;
    rec.mounter_pid = None;
    if let Err(e) = write_record(run_dir, &rec) {
        let _ = overlay::unmount(&mnt, Some(pid), UNMOUNT_WAIT);
        return Err(e);
    }
    if warm {
        super::warm::record_baseline(run_dir);
    }
    Ok(Started {
        mnt,
        run_lease,
        pid,
        mount_ms,
        counts,
    })
}

impl Mount {
    /// The run's private upper directory (`runs/<run>/upper`) in `store`.
    pub fn upper(&self, store: &Store) -> PathBuf {
        store
            .project_dirs(&self.outcome.project)
            .runs()
            .join(&self.outcome.run)
            .join("upper")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run that waited for another run's fill, which then ended without publishing (a
    /// failed setup, a killed run), says it takes the fill over.
    #[test]
    fn a_waiter_says_it_takes_over_a_fill_that_published_nothing() {
        let t = tempfile::tempdir().unwrap();
        let notices = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
        let n = std::sync::Arc::clone(&notices);
        let store = Store::open(Some(&t.path().join("store")))
            .unwrap()
            .with_notify(std::sync::Arc::new(move |x: &Notice| {
                n.lock().push(x.to_string())
            }));
        let req = MountRequest {
            project: ProjectId::new("p").unwrap(),
            cache: CacheId::new("c").unwrap(),
            key: CacheKey::new("k").unwrap(),
            restore_keys: vec![],
            fill_wait: Duration::from_secs(60),
            mountpoint: None,
            owner: None,
            squash: Default::default(),
            passthrough: crate::overlay::options::PassthroughChoice::Auto,
            lazy: false,
        };
        let pd = store.project(&req.project).unwrap();
        let fill_path = pd.fill_lock(&req.cache, &req.key);
        fs::create_dir_all(fill_path.parent().unwrap()).unwrap();
        // The other filler: holds the lock a moment, then goes without publishing.
        let other = Lease::acquire(&fill_path, Mode::Exclusive).unwrap();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(other);
        });
        let s = store
            .settle_lookup(&pd, &req, &fill_path, Instant::now() + req.fill_wait)
            .unwrap();
        h.join().unwrap();
        assert_eq!(s.lookup, Lookup::Miss);
        assert!(s.fill.is_some(), "this run fills");
        let said = notices.lock().clone();
        assert!(
            said.iter()
                .any(|l| l.contains("ended without publishing it")),
            "{said:?}"
        );
    }
}
