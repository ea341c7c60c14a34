//! Run records: `runs/<run>/run.json` says which key and layer a store mount serves, where it
//! is mounted and which daemon serves it. `commit` and `umount` find a mount by its record;
//! `gc` removes the directories of runs that are gone.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::lease::{self, Mode};
use super::paths::{ProjectDirs, canonical_mountpoint, read_names, remove_tree};
use super::{Notice, RUN_GRACE, Store, UNMOUNT_WAIT};
use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey, LayerId, ProjectId};
use crate::{overlay, sys};

/// `open-trace` in a run's directory: the order in which an exact local hit's run first opened
/// the layer's files (the overlay's `open_trace`), stored beside the key in the remote tier
/// once per layer ([`super::RemoteTier::store_trace`]) for fresh runners' lazy mounts.
pub const OPEN_TRACE: &str = "open-trace";

/// What a mount found for its key, `hit`, `restore` or `miss` (GitHub `actions/cache`: exact
/// hit, restore-key hit, miss); serialised lowercase, as events and `--json` show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MountResult {
    /// The exact key's layer is mounted; nothing to fill (a run runs maintenance, or nothing).
    Hit,
    /// An older layer matched by a restore key is mounted; fill incrementally (a run's restore
    /// setup), then commit.
    Restore,
    /// An empty lower is mounted; fill (a run's setup), then commit.
    Miss,
}

impl MountResult {
    /// `hit`, `restore` or `miss`.
    pub fn as_str(self) -> &'static str {
        match self {
            MountResult::Hit => "hit",
            MountResult::Restore => "restore",
            MountResult::Miss => "miss",
        }
    }
}

/// `runs/<run>/run.json`: how to find and undo a mount.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunRecord {
    /// Run id.
    pub run: String,
    /// Project.
    pub project: ProjectId,
    /// Cache.
    pub cache: CacheId,
    /// Primary key.
    pub key: CacheKey,
    /// Restore keys given at mount.
    pub restore_keys: Vec<CacheKey>,
    /// hit | restore | miss.
    pub result: MountResult,
    /// Key of the mounted layer.
    pub matched_key: Option<CacheKey>,
    /// Mounted (lower) layer.
    pub lower: Option<LayerId>,
    /// Canonical mountpoint.
    pub mountpoint: PathBuf,
    /// Overlay daemon pid (0 until mounted).
    pub daemon_pid: u32,
    /// The daemon's descriptor number holding the fill lock, if it holds one.
    pub fill_lock_fd: Option<i32>,
    /// Mount time, ms since the epoch.
    pub mounted_ms: u64,
    /// Mounted at the run's own `runs/<run>/mnt` (see [`super::MountRequest::mountpoint`]).
    #[serde(default)]
    pub private: bool,
    /// The process the mount belongs to (see [`super::MountRequest::owner`]).
    #[serde(default)]
    pub owner_pid: Option<u32>,
    /// The ownership mapping (see [`super::MountRequest::squash`]), kept for the remount.
    #[serde(default)]
    pub squash: crate::overlay::options::Squash,
    /// The passthrough choice of the mount (see [`super::MountRequest::passthrough`]), kept for the
    /// remount.
    #[serde(default)]
    pub passthrough: crate::overlay::options::PassthroughChoice,
    /// The process mounting this run, while `daemon_pid` is still 0 (a `mount` or a
    /// `commit`'s remount under way); `None` once the daemon pid is recorded. A record with
    /// no daemon pid whose mounter is gone belongs to a killed mount: its mount is a leftover
    /// (see [`Store::clear_leftover_mounts`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mounter_pid: Option<u32>,
    /// The remote layer mounted lazily as the lower (`lower` is `None` then): when the mount
    /// ends, [`super::RemoteTier::finish_lazy`] stores its trace and publishes it if complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lazy_layer: Option<LayerId>,
    /// The mount may outlive its run as an idle warm mount (`warm.rs`): its daemon listens
    /// on the run directory's control socket.
    #[serde(default)]
    pub warm: bool,
}

/// A store mount found by [`Store::store_mount`]: its canonical mountpoint, run record and
/// run directory.
#[derive(Clone, Debug)]
pub struct StoreMount {
    pub(super) mnt: PathBuf,
    pub(super) rec: RunRecord,
    pub(super) run_dir: PathBuf,
    pub(super) pd: ProjectDirs,
}

// (Read access for `sandbox-args --run`, which binds a run's mount into a sandbox.)
impl StoreMount {
    /// The run's record (project, cache, key, daemon pid).
    pub fn record(&self) -> &RunRecord {
        &self.rec
    }

    /// Where the run is mounted on the host (canonical).
    pub fn mountpoint(&self) -> &Path {
        &self.mnt
    }
}

impl Store {
    /// Finds the run mounted at `mnt` (canonical): the newest record naming it, preferring one
    /// whose daemon is alive.
    pub(super) fn find_run(&self, mnt: &Path) -> Result<Option<StoreMount>> {
        let mut best: Option<(bool, u64, StoreMount)> = None;
        for pd in self.projects(None)? {
            for name in read_names(&pd.runs())? {
                let dir = pd.runs().join(&name);
                let Some(rec) = read_record(&dir) else {
                    continue;
                };
                if rec.mountpoint != mnt {
                    continue;
                }
                let alive = sys::pid_alive(rec.daemon_pid);
                let rank = (alive, rec.mounted_ms);
                if best.as_ref().is_none_or(|b| (b.0, b.1) < rank) {
                    let m = StoreMount {
                        mnt: mnt.to_path_buf(),
                        rec,
                        run_dir: dir,
                        pd: pd.clone(),
                    };
                    best = Some((rank.0, rank.1, m));
                }
            }
        }
        Ok(best.map(|(_, _, m)| m))
    }

    /// The store mount of run `run` (`runs/<run>/run.json` in any project), if there is one.
    ///
    /// Errors: [`Error::Io`] reading the store's projects.
    pub fn find_run_id(&self, run: &str) -> Result<Option<StoreMount>> {
        if run.is_empty() || run.starts_with('.') || run.contains('/') {
            return Ok(None);
        }
        for pd in self.projects(None)? {
            let dir = pd.runs().join(run);
            if let Some(rec) = read_record(&dir) {
                return Ok(Some(StoreMount {
                    mnt: rec.mountpoint.clone(),
                    rec,
                    run_dir: dir,
                    pd,
                }));
            }
        }
        Ok(None)
    }

    /// The store mount a `commit`/`umount` argument names: a run id (`runs/<run>`), or the
    /// path of a store mount. A path that exists is taken as a path; never is a run picked by
    /// the name of a path that only exists in another mount namespace.
    ///
    /// Errors: [`Error::Io`] reading the store.
    pub fn resolve(&self, target: &Path) -> Result<Option<StoreMount>> {
        if !target.exists()
            && let Some(id) = target.to_str()
        {
            return self.find_run_id(id);
        }
        self.store_mount(target)
    }

    /// Run directories of `project` whose owner and daemon are gone (a `layercache run` killed
    /// with `kill -9`, say), removed: their mounts are unmounted first if still listed.
    /// Returns how many were removed. Runs without a recorded owner follow [`RUN_GRACE`]
    /// (see `gc`).
    ///
    /// Errors: [`Error::Io`] reading or removing run directories.
    pub fn reap_runs(&self, pd: &ProjectDirs) -> Result<u64> {
        let mut n = 0;
        for name in read_names(&pd.runs())? {
            let dir = pd.runs().join(&name);
            if self.run_is_stale(&dir)? {
                remove_stale_run(&dir)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// The store mount at `mountpoint` (a mount made by `layercache mount`/`run` in this
    /// store), found by one scan of the run records; `None` when `mountpoint` is not one (or
    /// does not resolve to a directory). Unmount it with [`Store::umount_run`].
    ///
    /// Errors: [`Error::Io`] reading the store's run records.
    pub fn store_mount(&self, mountpoint: &Path) -> Result<Option<StoreMount>> {
        let Ok(mnt) = canonical_mountpoint(mountpoint) else {
            return Ok(None);
        };
        self.find_run(&mnt)
    }

    /// `layercache umount`: unmounts the store mount `mountpoint` names (its path or run id,
    /// see [`Store::resolve`]), waiting for its daemon, and deletes its run directory (the
    /// private upper is discarded).
    ///
    /// Errors: [`Error::NotAStoreMount`] when it is not a store mount; [`Error::Unmount`] when
    /// busy.
    pub fn umount(&self, mountpoint: &Path) -> Result<()> {
        let Some(m) = self.resolve(mountpoint)? else {
            // No record names it, but a killed mount or commit may have left mounts of this
            // store's runs there: those go.
            if self.clear_leftover_mounts(mountpoint, true)? > 0 {
                return Ok(());
            }
            return Err(Error::NotAStoreMount {
                mountpoint: mountpoint.to_path_buf(),
                detail: String::new(),
            });
        };
        self.umount_run(m)
    }

    /// Unmounts the mounts of this store's runs stacked at `mnt` (canonicalised here; found in
    /// /proc/self/mountinfo as `fuse.layercache` mounts whose source `layercache:<upperdir>`
    /// names an upper in this store's `runs/`), top first, and removes their run directories.
    /// With `all`, every such mount goes (`umount`); otherwise only leftovers of a process
    /// killed while mounting (`mount`, `gc`): a run whose record is gone, whose daemon is
    /// dead, or whose record has no daemon pid and a dead mounter
    /// ([`RunRecord::mounter_pid`]). Stops at the first mount that is not cleared (what it covers
    /// cannot be reached by path). Returns how many mounts were unmounted.
    ///
    /// Errors: [`Error::Io`] reading mountinfo or the store; [`Error::Unmount`] when a
    /// leftover is busy (files open in it).
    pub fn clear_leftover_mounts(&self, mnt: &Path, all: bool) -> Result<u32> {
        let canon = canonical_mountpoint(mnt).unwrap_or_else(|_| mnt.to_path_buf());
        let mnt = canon.as_path();
        let pds = self.projects(None)?;
        let mut n = 0;
        // Bounded: each pass unmounts one mount or stops.
        for _ in 0..64 {
            let mounts = sys::mounts().at("/proc/self/mountinfo")?;
            let Some(top) = mounts.iter().rev().find(|m| m.mount_point == mnt) else {
                break;
            };
            let Some(run_dir) = (top.fs_type == "fuse.layercache")
                .then(|| top.source.strip_prefix("layercache:"))
                .flatten()
                .map(|u| {
                    Path::new(u)
                        .parent()
                        .unwrap_or(Path::new("/"))
                        .to_path_buf()
                })
                .filter(|d| pds.iter().any(|pd| d.parent() == Some(pd.runs().as_path())))
            else {
                break; // not a mount of this store
            };
            let rec = read_record(&run_dir);
            let leftover = all
                || rec.as_ref().is_none_or(|r| {
                    (r.daemon_pid != 0 && !sys::pid_alive(r.daemon_pid))
                        || (r.daemon_pid == 0 && !r.mounter_pid.is_some_and(sys::pid_alive))
                });
            if !leftover {
                break;
            }
            tracing::info!(mountpoint = %mnt.display(), run = %run_dir.display(),
                "unmounting a leftover mount");
            let daemon = rec.as_ref().map_or(0, |r| r.daemon_pid);
            let pidfd = (daemon != 0)
                .then(|| sys::pidfd_open(daemon).ok())
                .flatten();
            use rustix::mount::{UnmountFlags, unmount};
            if let Err(e) = unmount(mnt, UnmountFlags::empty()) {
                // A dead daemon's mount (ENOTCONN) or a transient EBUSY: detach it; nobody
                // else has a use for it. EINVAL: it is gone already (a daemon whose starter
                // died unmounts itself), so look again.
                match unmount(mnt, UnmountFlags::DETACH) {
                    Ok(()) => {}
                    Err(rustix::io::Errno::INVAL) => continue,
                    Err(_) => {
                        return Err(Error::Unmount {
                            mountpoint: mnt.to_path_buf(),
                            source: e.into(),
                        });
                    }
                }
            }
            if let Some(fd) = pidfd {
                let _ = overlay::wait_pidfd(&fd, daemon, UNMOUNT_WAIT);
            }
            n += 1;
            // The run is over; a record still naming another live mount stays.
            if rec.as_ref().is_none_or(|r| r.mountpoint == mnt) && run_dir.exists() {
                remove_tree(&run_dir)?;
            }
        }
        Ok(n)
    }

    /// The end of a run's mount: hands it back as an idle warm mount when its run changed
    /// nothing in it ([`Store::release_warm`], `warm.rs`), else [`Store::umount_run`].
    ///
    /// Errors: as [`Store::umount_run`].
    pub fn end_run(&self, m: StoreMount) -> Result<()> {
        if self.release_warm(&m) {
            return Ok(());
        }
        self.umount_run(m)
    }

    /// Unmounts a store mount found by [`Store::store_mount`] (waiting for its daemon) and
    /// deletes its run directory (the private upper is discarded); every other mount of this
    /// store's runs stacked at its mountpoint goes too ([`Store::clear_leftover_mounts`]).
    ///
    /// Errors: [`Error::Unmount`] when busy (nothing changed); [`Error::Io`] removing the run.
    pub fn umount_run(&self, m: StoreMount) -> Result<()> {
        let _span = tracing::info_span!("umount", run = %m.rec.run).entered();
        unmount_and_wait(&m.mnt, m.rec.daemon_pid)?;
        if let (Some(layer), Some(r)) = (&m.rec.lazy_layer, &self.remote)
            && let Some(end) =
                r.finish_lazy(self, &m.pd, &m.rec.cache, &m.rec.key, layer, &m.run_dir)
        {
            self.notify(Notice::LazyFetched {
                cache: m.rec.cache.clone(),
                key: m.rec.key.clone(),
                end,
            });
        }
        if let (Some(layer), Some(r), MountResult::Hit) = (&m.rec.lower, &self.remote, m.rec.result)
        {
            let marker = m.pd.layer(layer).trace_stored_path();
            let trace = m.run_dir.join(OPEN_TRACE);
            if !marker.exists() && r.store_trace(&m.pd, &m.rec.cache, &m.rec.key, &trace) {
                let _ = std::fs::write(&marker, b"");
            }
        }
        // Whatever else of this store is still mounted there (a dead commit's remount stacked
        // under or over the recorded one) goes too: after `umount`, nothing of ours is left.
        self.clear_leftover_mounts(&m.mnt, true)?;
        // A discarded fill leaves no lock file (unless this process's own Mount
        // handle still holds it: Mount::end_fill removes it then).
        if m.rec.fill_lock_fd.is_some()
            && let Some(l) = lease::Lease::try_acquire(
                &m.pd.fill_lock(&m.rec.cache, &m.rec.key),
                Mode::Exclusive,
            )?
        {
            l.remove();
        }
        remove_tree(&m.run_dir)
    }

    /// A run dir is stale when nobody holds its lease and its daemon is gone, and either its
    /// recorded owner has exited (a dead mount of it is then unmounted by the reaper) or
    /// nothing is mounted at its mountpoint and it has not changed for [`RUN_GRACE`].
    pub(super) fn run_is_stale(&self, dir: &Path) -> Result<bool> {
        let lease_path = dir.join("lease");
        if let Some(rec) = read_record(dir)
            && let Some(owner) = rec.owner_pid
        {
            let gone = !sys::pid_alive(owner) && !sys::pid_alive(rec.daemon_pid);
            return Ok(gone && !lease::is_held(&lease_path, Mode::Exclusive)?);
        }
        let recent = fs::metadata(&lease_path)
            .or_else(|_| fs::metadata(dir))
            .and_then(|m| m.modified())
            .map(|t| t.elapsed().unwrap_or_default() < RUN_GRACE)
            .unwrap_or(false);
        if recent || lease::is_held(&lease_path, Mode::Exclusive)? {
            return Ok(false);
        }
        if let Some(rec) = read_record(dir)
            && (sys::pid_alive(rec.daemon_pid) || overlay::is_mountpoint_busy(&rec.mountpoint)?)
        {
            return Ok(false);
        }
        Ok(true)
    }
}

/// Removes a stale run directory (see [`Store::run_is_stale`]), unmounting a dead mount of it
/// first (its daemon is gone, so the mount only answers ENOTCONN).
///
/// Errors: [`Error::Io`] removing the directory.
pub(super) fn remove_stale_run(dir: &Path) -> Result<()> {
    if let Some(rec) = read_record(dir)
        && rec.private
        && overlay::is_mountpoint_busy(&rec.mountpoint)?
    {
        let _ = rustix::mount::unmount(&rec.mountpoint, rustix::mount::UnmountFlags::DETACH);
    }
    remove_tree(dir)
}

/// Reads `run.json` of `run_dir`; `None` when it is missing or unreadable (a run being set
/// up, or garbage).
pub(super) fn read_record(run_dir: &Path) -> Option<RunRecord> {
    let text = fs::read(run_dir.join("run.json")).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Unmounts `mnt` (if mounted) and waits until its daemon `pid` has exited, so the upper dir
/// is quiescent. Waits on a pidfd: the daemon counts as gone once it exits, even while its
/// new parent (init) has not reaped it yet.
///
/// Errors: as [`overlay::unmount`] ([`Error::Unmount`] for EBUSY, nothing changed);
/// [`Error::Failed`] when the daemon outlives [`UNMOUNT_WAIT`].
pub(super) fn unmount_and_wait(mnt: &Path, pid: u32) -> Result<()> {
    let daemon = (pid != 0).then_some(pid);
    let gone = if overlay::is_mountpoint_busy(mnt)? {
        match overlay::unmount(mnt, daemon, UNMOUNT_WAIT) {
            // Gone meanwhile (the daemon of a killed commit's remount unmounts itself); a busy
            // mount stays listed, so EBUSY is still reported.
            Err(_) if !overlay::is_mountpoint_busy(mnt)? => true,
            r => r?,
        }
    } else {
        // Already unmounted (by `umount`, say): its daemon may still be finishing.
        daemon
            .and_then(|pid| Some((pid, sys::pidfd_open(pid).ok()?)))
            .is_none_or(|(pid, fd)| overlay::wait_pidfd(&fd, pid, UNMOUNT_WAIT))
    };
    if !gone {
        return Err(Error::Failed(format!(
            "{}: overlay daemon {pid} did not exit within {}s of unmounting",
            mnt.display(),
            UNMOUNT_WAIT.as_secs()
        )));
    }
    Ok(())
}

/// Writes `run.json` atomically (temp file + rename).
///
/// Errors: [`Error::Io`] naming the file.
pub(super) fn write_record(run_dir: &Path, rec: &RunRecord) -> Result<()> {
    let tmp = run_dir.join(".run.json.tmp");
    let body = serde_json::to_vec_pretty(rec).map_err(|e| Error::Failed(e.to_string()))?;
    fs::write(&tmp, body).at(&tmp)?;
    let dst = run_dir.join("run.json");
    fs::rename(&tmp, &dst).at(&dst)
}
