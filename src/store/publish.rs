//! `layercache commit` and publishing: unmount a store mount, promote its lower ⊕ upper into a
//! new layer (hardlinks into objects, no byte copies), publish it under the key with
//! `renameat2(RENAME_NOREPLACE)` (a lost race reports `exists`), and mount the published layer
//! again as a hit. Publishing is durable before the key appears (syncfs, then fsync of
//! `layers/` and of the keys directory); a failure publishes nothing.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::layer::{self, Layer, Manifest, write_synced};
use super::lease::{Lease, Mode};
use super::mount::{Leases, Mount, MountRequest, RunMount};
use super::object::ObjectStore;
use super::paths::{ProjectDirs, mkdir_mode, remove_tree};
use super::runs::{RunRecord, StoreMount, unmount_and_wait};
use super::{
    GcOptions, GcReport, MountOutcome, MountResult, Notice, Store, eviction, ms_since, promote,
};
use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey, LayerId, ProjectId};
use crate::overlay::links::LinkGroups;
use crate::sys;
use crate::units::now_ms;

/// `published`, `exists` or `noop`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CommitResult {
    /// A new layer was published under the key.
    Published,
    /// The key was already published (another run won); our copy was discarded and the
    /// published layer is mounted instead.
    Exists,
    /// The mount was a hit: nothing to promote.
    Noop,
}

/// The JSON line `layercache commit` prints; also returned to `layercache run`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CommitOutcome {
    /// published | exists | noop.
    pub result: CommitResult,
    /// The mount's primary key.
    pub key: CacheKey,
    /// The layer now published under the key (ours or the winner's).
    pub layer: Option<LayerId>,
    /// The lower layer promoted on top of (restore), if any.
    pub parent: Option<LayerId>,
    /// Apparent bytes of the promoted tree.
    pub bytes: u64,
    /// Regular files in the promoted tree.
    pub files: u64,
    /// Objects added to the store.
    pub new_objects: u64,
    /// Bytes added to the store.
    pub new_bytes: u64,
    /// Credential files dropped (paths relative to the mount).
    pub dropped: Vec<String>,
    /// Sockets/device nodes dropped.
    pub skipped: Vec<String>,
    /// The mount made afterwards (a hit on the published layer), when there was a remount.
    pub remount: Option<MountOutcome>,
    /// Milliseconds to unmount (daemon exit included).
    pub unmount_ms: u64,
    /// Milliseconds to build the new tree.
    pub promote_ms: u64,
    /// Milliseconds to sync and publish.
    pub publish_ms: u64,
    /// Total milliseconds.
    pub total_ms: u64,
    /// The automatic gc run, if the store was over a limit.
    pub gc: Option<GcReport>,
}

/// Result of a publish without a mount ([`super::Store::promote_dirs`]).
#[derive(Clone, Debug, Serialize)]
pub struct Published {
    /// published | exists.
    pub result: CommitResult,
    /// The layer published under the key (ours, or the winner's on `exists`).
    pub layer: LayerId,
    /// Our manifest (discarded on `exists`).
    pub manifest: Manifest,
    /// Sockets/devices skipped.
    pub skipped: Vec<String>,
    /// Milliseconds to build the tree.
    pub promote_ms: u64,
    /// Milliseconds to sync and publish.
    pub publish_ms: u64,
}

/// What [`super::Store::publish_built`] publishes.
#[derive(Clone, Debug)]
pub struct PublishSpec {
    /// Cache.
    pub cache: CacheId,
    /// The key to publish under.
    pub key: CacheKey,
    /// The layer id to use (a pulled layer keeps its remote id); `None` = a fresh one.
    pub layer: Option<LayerId>,
    /// The parent recorded in the manifest.
    pub parent: Option<LayerId>,
    /// Creation time for the manifest, ms since the epoch; `None` = now.
    pub created_ms: Option<u64>,
}

impl Store {
    /// `layercache commit`: promotes the merged view of the store mount at `mountpoint`
    /// (lower ⊕ upper) into a new layer published under the mount's key, then mounts the
    /// published layer there again as a hit (fresh upper), so the caller keeps a working
    /// mount. Sequence: syncfs, unmount (waits for the daemon), promote (hardlinks upper files
    /// into objects; no byte copies), publish (`renameat2(RENAME_NOREPLACE)`; `exists` when
    /// another run won), release the fill lock, gc if over a limit. After a hit: a no-op.
    /// The fill lock is kept from the daemon through publish by adopting the daemon's
    /// descriptor (`pidfd_getfd(2)`).
    ///
    /// Errors: [`Error::NotAStoreMount`] when `mountpoint` is not a store mount;
    /// [`Error::Unmount`] when it is busy (nothing changed). If promotion fails (e.g.
    /// `ENOSPC`) nothing is published, the store is unchanged and the previous mount (same
    /// upper) is restored.
    pub fn commit(&self, target: &Path) -> Result<CommitOutcome> {
        let sm = self.resolve(target)?.ok_or_else(|| Error::NotAStoreMount {
            mountpoint: target.to_path_buf(),
            detail: " (not a run id or mountpoint of this store; see `layercache ls`)".into(),
        })?;
        let mut held = Leases::default();
        if sm.rec.result != MountResult::Hit
            && let Some(fd) = sm.rec.fill_lock_fd
        {
            let fill_path = sm.pd.fill_lock(&sm.rec.cache, &sm.rec.key);
            held.fill = Lease::adopt(sm.rec.daemon_pid, fd, &fill_path);
        }
        self.commit_run(sm, held, None, true).map(|(out, _)| out)
    }

    /// [`Store::commit`] of a mount this process made: its own leases (the fill lock above
    /// all) are kept through publish. When it publishes, `inputs` are recorded as the key's
    /// inputs ([`ProjectDirs::record_inputs`]) before the push to the remote starts, so the remote key
    /// record carries them. Returns the outcome and the new mount (the published layer as a
    /// hit; the same mount back after a hit).
    ///
    /// Errors: as [`Store::commit`], except that a failed promotion (e.g. `ENOSPC`) does not
    /// mount the same upper again for a retry: the run directory (upper and all) is removed
    /// at once and the fill lock released — its caller, a run, ends there.
    pub fn commit_mount(
        &self,
        m: Mount,
        inputs: Option<&super::Inputs>,
    ) -> Result<(CommitOutcome, Option<Mount>)> {
        let Some(sm) = self.find_run_id(&m.outcome.run)? else {
            return Err(Error::NotAStoreMount {
                mountpoint: m.outcome.mountpoint.clone(),
                detail: format!(" (run {} has no record)", m.outcome.run),
            });
        };
        if sm.rec.result == MountResult::Hit {
            let (out, _) = self.commit_run(sm, Leases::default(), None, true)?;
            return Ok((out, Some(m)));
        }
        self.commit_run(sm, m.leases, inputs, false)
    }

    fn commit_run(
        &self,
        sm: StoreMount,
        mut held: Leases,
        inputs: Option<&super::Inputs>,
        remount_on_failure: bool,
    ) -> Result<(CommitOutcome, Option<Mount>)> {
        let t0 = Instant::now();
        let StoreMount {
            mnt,
            rec,
            run_dir,
            pd,
        } = sm;
        let _span = tracing::info_span!("commit", run = %rec.run, key = %rec.key).entered();
        if rec.result == MountResult::Hit {
            return Ok((CommitOutcome::noop(&rec, ms_since(t0)), None));
        }
        let fill_path = pd.fill_lock(&rec.cache, &rec.key);
        let unmount_ms = unmount_run(&mnt, &run_dir, rec.daemon_pid)?;
        if held.fill.is_none() && rec.fill_lock_fd.is_some() {
            held.fill = Lease::try_acquire(&fill_path, Mode::Exclusive)?;
        }
        let parent = rec.lower.as_ref().map(|id| pd.layer(id));
        let upper = run_dir.join("upper");
        let published = match unpinned(&upper, || {
            self.promote_into(&pd, &rec.cache, &rec.key, parent.as_ref(), Some(&upper))
        }) {
            Ok(p) => p,
            Err(e) if remount_on_failure => {
                // Nothing was published: put the previous mount back (same lower and upper).
                self.mount_again(&pd, &rec, &mnt, &run_dir, held)?;
                return Err(e);
            }
            Err(e) => {
                // Nothing was published and nobody retries: the upper goes now (its space
                // may be what the store lacks), the fill lock with it.
                drop(held.others);
                if let Err(e2) = remove_tree(&run_dir) {
                    tracing::warn!(error = %e2, "removing a failed commit's run directory");
                }
                if let Some(f) = held.fill {
                    f.remove();
                }
                return Err(e);
            }
        };
        // The old run is done: its upper's files now live in the store.
        drop(held.others);
        self.remove_run_dir(&pd, &run_dir)?;
        let remount = self.mount_published(&pd, &rec, &published.layer)?;
        // The fill is over; its lock file goes with it.
        if let Some(f) = held.fill {
            f.remove();
        }
        if published.result == CommitResult::Published {
            self.after_publish(&pd, &rec, &published.layer, inputs);
        }
        let gc = self.auto_gc();
        let m = &published.manifest;
        let out = CommitOutcome {
            result: published.result,
            key: rec.key,
            layer: Some(published.layer.clone()),
            parent: rec.lower,
            bytes: m.counts.bytes,
            files: m.counts.files,
            new_objects: m.counts.new_objects,
            new_bytes: m.counts.new_bytes,
            dropped: m.dropped.clone(),
            skipped: published.skipped.clone(),
            remount: remount.as_ref().map(|r| r.outcome.clone()),
            unmount_ms,
            promote_ms: published.promote_ms,
            publish_ms: published.publish_ms,
            total_ms: ms_since(t0),
            gc,
        };
        tracing::info!(result = ?out.result, ms = out.total_ms, "committed");
        Ok((out, remount))
    }

    /// `save = "success"`: after a run's COMMAND exited 0, promotes the view of the mount `m`
    /// (a hit: its layer ⊕ what maintenance and COMMAND wrote) as a newer layer of the same
    /// key, replacing the layer the key names, so the next run hits it. Objects already
    /// stored are linked, not copied (the normal promotion). Nothing is promoted when the
    /// upper is empty (nothing changed): `Ok(None)`. Either way the mount is unmounted and
    /// its run directory removed. Saves of one key are serialised by its fill lock (waiting
    /// up to `wait`; when it cannot be had, nothing is saved: `Ok(None)`). A layer published
    /// goes the way a miss's does: it is pushed to the remote tier in the background, which
    /// keeps a key it already holds (remote keys are create-only), so a remote that missed
    /// the key's first layer gets the saved one.
    ///
    /// Errors: [`Error::NotAStoreMount`] when `m` has no record; [`Error::Unmount`] when busy;
    /// [`Error::Io`] promoting (e.g. `ENOSPC`): nothing is published, the key keeps its layer
    /// and the run directory is removed.
    pub fn save_mount(&self, m: Mount, wait: std::time::Duration) -> Result<Option<Published>> {
        let Some(sm) = self.find_run_id(&m.outcome.run)? else {
            return Err(Error::NotAStoreMount {
                mountpoint: m.outcome.mountpoint.clone(),
                detail: format!(" (run {} has no record)", m.outcome.run),
            });
        };
        let upper = sm.run_dir.join("upper");
        let changed = fs::read_dir(&upper).at(&upper)?.next().is_some();
        let fill_path = sm.pd.fill_lock(&sm.rec.cache, &sm.rec.key);
        if let Some(parent) = fill_path.parent() {
            fs::create_dir_all(parent).at(parent)?;
        }
        let lock = match changed {
            true => Lease::acquire_timeout(&fill_path, Mode::Exclusive, wait)?,
            false => None,
        };
        let Some(lock) = lock else {
            self.umount_run(sm)?;
            m.end_fill();
            return Ok(None);
        };
        let StoreMount {
            mnt,
            rec,
            run_dir,
            pd,
        } = sm;
        let _span = tracing::info_span!("save", run = %rec.run, key = %rec.key).entered();
        unmount_run(&mnt, &run_dir, rec.daemon_pid)?;
        let parent = rec.lower.as_ref().map(|id| pd.layer(id));
        let lower = parent.as_ref().map(|p| p.tree());
        let spec = PublishSpec {
            cache: rec.cache.clone(),
            key: rec.key.clone(),
            layer: None,
            parent: rec.lower.clone(),
            created_ms: None,
        };
        let published = unpinned(&upper, || {
            self.publish_built_as(
                &pd,
                &spec,
                |objects, tree| promote::build_tree(objects, lower.as_deref(), Some(&upper), tree),
                true,
            )
        });
        drop(m.leases);
        let removed = self.remove_run_dir(&pd, &run_dir);
        lock.remove();
        let published = published?;
        removed?;
        if published.result == CommitResult::Published {
            self.after_publish(&pd, &rec, &published.layer, None);
        }
        Ok(Some(published))
    }

    /// After a failed promotion of run `rec` (nothing was published): mounts its previous
    /// lower and upper (`run_dir`) again at `mnt`, with the fill lock of `held`. A failed
    /// mount is told as [`Notice::RemountFailed`] (the files stay in the run directory until
    /// gc).
    ///
    /// Errors: [`Error::Io`] taking the lease on the lower layer.
    fn mount_again(
        &self,
        pd: &ProjectDirs,
        rec: &RunRecord,
        mnt: &Path,
        run_dir: &Path,
        held: Leases,
    ) -> Result<()> {
        let req = MountRequest::remount(rec);
        let layer = match &rec.lower {
            Some(id) => self.lease_layer(pd, id)?.map(|l| (id.clone(), l)),
            None => None,
        };
        drop(held.others);
        if let Err(e2) = self.mount_run(RunMount {
            pd,
            req: &req,
            mnt: req.mountpoint.as_deref(),
            result: rec.result,
            matched_key: rec.matched_key.clone(),
            layer,
            fill: held.fill,
            reuse: Some(run_dir),
            lazy: None,
        }) {
            self.notify(Notice::RemountFailed {
                mountpoint: mnt.to_path_buf(),
                error: e2.to_string(),
            });
        }
        Ok(())
    }

    /// Mounts `layer`, just published under run `rec`'s key, as a hit where `rec` was
    /// mounted; `None` when the layer is gone already (a gc between publish and lease).
    ///
    /// Errors: as [`Store::mount`].
    fn mount_published(
        &self,
        pd: &ProjectDirs,
        rec: &RunRecord,
        layer: &LayerId,
    ) -> Result<Option<Mount>> {
        let req = MountRequest::remount(rec);
        let Some(lease) = self.lease_layer(pd, layer)? else {
            return Ok(None);
        };
        self.mount_run(RunMount {
            pd,
            req: &req,
            mnt: req.mountpoint.as_deref(),
            result: MountResult::Hit,
            matched_key: Some(rec.key.clone()),
            layer: Some((layer.clone(), lease)),
            fill: None,
            reuse: None,
            lazy: None,
        })
        .map(Some)
    }

    /// What follows a publish of `layer` under run `rec`'s key: the key's `inputs` are
    /// recorded first, so the remote tier's push (in the background: a run's exit or
    /// `layercache commit` waits for it, [`super::RemoteTier::wait_pushes`]) sends them with
    /// the key.
    fn after_publish(
        &self,
        pd: &ProjectDirs,
        rec: &RunRecord,
        layer: &LayerId,
        inputs: Option<&super::Inputs>,
    ) {
        if let Some(inputs) = inputs {
            pd.record_inputs(&rec.cache, rec.key.as_str(), inputs);
        }
        if let Some(r) = &self.remote {
            Arc::clone(r).push_background(
                pd.clone(),
                rec.cache.clone(),
                rec.key.clone(),
                layer.clone(),
            );
        }
    }

    /// Removes a finished run's directory off the commit's path: it is renamed into
    /// `staging/` (where no lookup reaches it) and deleted by a background thread that holds
    /// the project lock shared, so gc (exclusive) never removes it at the same time. Deleting
    /// even a restore's small upper can wait on the filesystem's journal right after the
    /// publish's syncfs (measured: 1.4 s for 440 files on a busy ext4), and the commit's
    /// caller need not wait for it. [`Store::wait_background`] joins the thread; what a killed
    /// process leaves in `staging/` is garbage gc removes.
    ///
    /// Errors: [`Error::Io`] removing the directory in place when the rename fails.
    fn remove_run_dir(&self, pd: &ProjectDirs, run_dir: &Path) -> Result<()> {
        let name = run_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let gone = pd.staging().join(format!("{name}.done"));
        if fs::rename(run_dir, &gone).is_err() {
            return remove_tree(run_dir);
        }
        let lock = pd.lock();
        let h = std::thread::spawn(move || {
            let _shared = Lease::acquire(&lock, Mode::Shared);
            if let Err(e) = remove_tree(&gone) {
                tracing::warn!(error = %e, "could not remove a finished run's directory");
            }
        });
        self.background
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(h);
        Ok(())
    }

    /// Runs gc when the store is over a byte or inode limit; logs and swallows errors. The
    /// layer manifests' bound ([`Store::usage_bound`]) decides first: when it is at most half
    /// of every limit, no object is stat'ed (the exact count stats them all — the largest part
    /// of a small restore's commit).
    fn auto_gc(&self) -> Option<GcReport> {
        if let Ok(b) = self.usage_bound()
            && eviction::well_below_limits(&b, &self.limits)
        {
            return None;
        }
        match self.quick_usage() {
            Ok(u) if eviction::over_limits(&u, &self.limits) => {
                match self.gc(&GcOptions::default()) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        tracing::warn!(error = %e, "automatic gc failed");
                        None
                    }
                }
            }
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, "could not measure the store");
                None
            }
        }
    }

    /// Builds lower ⊕ `upper` into a new layer and publishes it under `key` — what `commit`
    /// does after unmounting, without any mount (for tests, benchmarks and tools). `parent`
    /// is the lower layer id, if any.
    ///
    /// The upper's regular files become objects **by hardlink** (same inode): the caller must
    /// not modify them afterwards (delete the upper, as `commit` does, or replace files by
    /// rename, never write in place).
    ///
    /// Errors: as [`Store::commit`]'s promotion: nothing is published on error.
    pub fn promote_dirs(
        &self,
        project: &ProjectId,
        cache: &CacheId,
        key: &CacheKey,
        parent: Option<&LayerId>,
        upper: Option<&Path>,
    ) -> Result<Published> {
        let pd = self.project(project)?;
        let parent = parent.map(|id| pd.layer(id));
        if let Some(p) = &parent
            && !p.tree().is_dir()
        {
            return Err(Error::invalid(format!(
                "layer {} does not exist in project {project}",
                p.id
            )));
        }
        self.promote_into(&pd, cache, key, parent.as_ref(), upper)
    }

    pub(super) fn promote_into(
        &self,
        pd: &ProjectDirs,
        cache: &CacheId,
        key: &CacheKey,
        parent: Option<&Layer>,
        upper: Option<&Path>,
    ) -> Result<Published> {
        let _span =
            tracing::info_span!("promote", project = %pd.project, cache = %cache, key = %key)
                .entered();
        let spec = PublishSpec {
            cache: cache.clone(),
            key: key.clone(),
            layer: None,
            parent: parent.map(|p| p.id.clone()),
            created_ms: None,
        };
        let lower = parent.map(|p| p.tree());
        self.publish_built(pd, &spec, |objects, tree| {
            promote::build_tree(objects, lower.as_deref(), upper, tree)
        })
    }

    /// Builds a layer tree with `build` (given the project's objects and the tree path to
    /// create, `staging/<id>/tree`) and publishes it under `spec.key` the way every layer is
    /// published: manifest, syncfs, rename into `layers/`, key with `renameat2(NOREPLACE)`
    /// (`exists` when another run won; our copy is then discarded). The project lock is held
    /// shared throughout, so gc never sweeps objects `build` has created but not linked yet.
    /// Used by promotion and by the remote tier's pull.
    ///
    /// Errors: whatever `build` returns (it must remove the objects it created, as
    /// `promote::build_tree` does) and [`Error::Io`] publishing; nothing is published on error
    /// and the staging directory is removed. A full filesystem (`ENOSPC`, `EDQUOT`) is an
    /// [`Error::NoSpace`] with its room before that removal.
    pub fn publish_built(
        &self,
        pd: &ProjectDirs,
        spec: &PublishSpec,
        build: impl FnOnce(&ObjectStore, &Path) -> Result<promote::TreeStats>,
    ) -> Result<Published> {
        self.publish_built_as(pd, spec, build, false)
    }

    /// [`Store::publish_built`]; with `replace` the key is pointed at the new layer even
    /// when it names another one already (a `save = "success"` run's newer layer of its key:
    /// [`Store::save_mount`]).
    fn publish_built_as(
        &self,
        pd: &ProjectDirs,
        spec: &PublishSpec,
        build: impl FnOnce(&ObjectStore, &Path) -> Result<promote::TreeStats>,
        replace: bool,
    ) -> Result<Published> {
        let (cache, key) = (&spec.cache, &spec.key);
        let _shared = Lease::acquire(&pd.lock(), Mode::Shared)?;
        let tp = Instant::now();
        let (id, stage) = new_stage(pd, spec.layer.as_ref())?;
        let objects = pd.objects();
        let built = build(&objects, &stage.tree());
        let stats = match built {
            Ok(s) => s,
            Err(e) => {
                // A full store's room as the build left it (build_tree notes it earlier).
                let e = e.noting_room(&stage.dir);
                let _ = remove_tree(&stage.dir);
                // build_tree removed the objects it created.
                return Err(e);
            }
        };
        let undo = |e: Error, stats: &promote::TreeStats, dir: &Path| {
            let e = e.noting_room(&pd.root);
            let _ = remove_tree(dir);
            promote::undo_created_objects(stats);
            e
        };
        let promote_ms = ms_since(tp);
        let tpub = Instant::now();
        let manifest = Manifest {
            format: layer::MANIFEST_FORMAT,
            layer: id.clone(),
            project: pd.project.clone(),
            cache: cache.clone(),
            key: key.clone(),
            parent: spec.parent.clone(),
            created_ms: spec.created_ms.unwrap_or_else(now_ms),
            counts: stats.counts,
            dropped: stats.dropped.clone(),
        };
        if let Err(e) = seal(&stage, &manifest, &stats) {
            return Err(undo(e, &stats, &stage.dir));
        }
        let final_layer = pd.layer(&id);
        if let Err(e) = fs::rename(&stage.dir, &final_layer.dir) {
            return Err(undo(Error::io(&final_layer.dir, e), &stats, &stage.dir));
        }
        // The rename must be durable before a key names the layer.
        if let Err(e) = sys::fsync_dir(&pd.layers()) {
            return Err(undo(Error::io(pd.layers(), e), &stats, &final_layer.dir));
        }
        let published = if replace {
            replace_key(pd, cache, key, &id).map(|()| None)
        } else {
            publish_key(pd, cache, key, &id)
        };
        let (result, layer) = match published {
            Ok(None) => (CommitResult::Published, id),
            Ok(Some(winner)) => {
                // Someone else published the key first: ours is discarded (actions/cache:
                // keys are immutable). Its new objects become unreferenced; gc sweeps them.
                remove_tree(&final_layer.dir)?;
                (CommitResult::Exists, winner)
            }
            Err(e) => return Err(undo(e, &stats, &final_layer.dir)),
        };
        Ok(Published {
            result,
            layer,
            manifest,
            skipped: stats.skipped,
            promote_ms,
            publish_ms: ms_since(tpub),
        })
    }
}

/// A fresh staging directory `staging/<id>` for a layer build, with the id asked for (a pulled
/// layer keeps its remote id) or a new one. The staging directory is ours alone: one of the
/// asked-for id already there is a crashed or concurrent build of that layer (a pull); this
/// build then takes a fresh id.
///
/// Errors: [`Error::Io`] creating it.
fn new_stage(pd: &ProjectDirs, want: Option<&LayerId>) -> Result<(LayerId, Layer)> {
    let mut id = want.cloned().unwrap_or_else(layer::new_layer_id);
    let mut stage = Layer::new(&pd.staging(), id.clone());
    match fs::DirBuilder::new().mode(0o755).create(&stage.dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && want.is_some() => {
            id = layer::new_layer_id();
            stage = Layer::new(&pd.staging(), id.clone());
            mkdir_mode(&stage.dir, 0o755)?;
        }
        Err(e) => return Err(Error::io(&stage.dir, e)),
    }
    Ok((id, stage))
}

/// Writes a built layer's manifest, link groups, lease and `used` files into `stage`, then
/// makes it all durable with one syncfs.
///
/// Errors: [`Error::Io`] naming the file.
fn seal(stage: &Layer, manifest: &Manifest, stats: &promote::TreeStats) -> Result<()> {
    stage.write_manifest(manifest)?;
    let groups: Vec<Vec<&[u8]>> = stats
        .links
        .iter()
        .map(|g| g.iter().map(|p| p.as_os_str().as_bytes()).collect())
        .collect();
    LinkGroups::write(&stage.links_path(), &groups).at(stage.links_path())?;
    fs::File::create(stage.lease_path()).at(stage.lease_path())?;
    stage.touch_used()?;
    // One syncfs makes every new object, directory and the manifest durable.
    sys::syncfs(&stage.dir).at(&stage.dir)
}

/// Publishes `key` of `cache` as naming layer `id` (durable in `layers/` already): a temp
/// file renamed with `renameat2(NOREPLACE)`, then an fsync of `keys/`. `Ok(None)` when ours
/// is published; `Ok(Some(winner))` when another publish of the key won.
///
/// Errors: [`Error::Io`]; a key that could not be made durable is taken back first, so no key
/// ever names a layer the caller then removes.
fn publish_key(
    pd: &ProjectDirs,
    cache: &CacheId,
    key: &CacheKey,
    id: &LayerId,
) -> Result<Option<LayerId>> {
    let keys = pd.keys_dir(cache);
    fs::create_dir_all(&keys).at(&keys)?;
    let tmp = keys.join(format!(".tmp-{}", sys::random_hex(8)));
    write_synced(&tmp, format!("{id}\n").as_bytes())?;
    let dst = keys.join(key.as_str());
    match sys::rename_noreplace(&tmp, &dst) {
        Ok(()) => match sys::fsync_dir(&keys) {
            Ok(()) => Ok(None),
            // The key is visible but maybe not durable. Take it back before the layer
            // is undone, so no key ever names a missing layer; if it cannot be taken
            // back, it stays published and so does its layer.
            Err(e) => match fs::remove_file(&dst) {
                Ok(()) => Err(Error::io(&keys, e)),
                Err(_) => {
                    tracing::warn!(key = %dst.display(), "published, but fsync of its directory failed: {e}");
                    Ok(None)
                }
            },
        },
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            let _ = fs::remove_file(&tmp);
            let winner = pd
                .read_key(cache, key)?
                .ok_or_else(|| Error::Failed(format!("{}: vanished", dst.display())))?;
            Ok(Some(winner))
        }
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(Error::io(&dst, e))
        }
    }
}

/// Runs `promote` (a promotion of `upper`); when it fails with EPERM because a file of the
/// upper is immutable or append-only (`chattr +i`/`+a` in a setup: link(2) of it is refused),
/// clears those flags in the upper ([`super::paths::clear_inode_flags`]) and runs it once more.
/// The flags never reach a layer: they are not copied, and a linked object is the upper's
/// inode with its flags cleared.
fn unpinned<T>(upper: &Path, promote: impl Fn() -> Result<T>) -> Result<T> {
    match promote() {
        Err(Error::Io { source, .. })
            if source.raw_os_error() == Some(libc::EPERM)
                && super::paths::clear_inode_flags(upper) > 0 =>
        {
            promote()
        }
        r => r,
    }
}

/// Points `key` of `cache` at layer `id` (durable in `layers/` already), replacing what it
/// named: a temp file renamed over the key (rename(2) is atomic: a reader sees the old layer
/// or the new one), then an fsync of `keys/`.
///
/// Errors: [`Error::Io`] (the key then still names its previous layer).
fn replace_key(pd: &ProjectDirs, cache: &CacheId, key: &CacheKey, id: &LayerId) -> Result<()> {
    let keys = pd.keys_dir(cache);
    fs::create_dir_all(&keys).at(&keys)?;
    let tmp = keys.join(format!(".tmp-{}", sys::random_hex(8)));
    write_synced(&tmp, format!("{id}\n").as_bytes())?;
    let dst = keys.join(key.as_str());
    if let Err(e) = fs::rename(&tmp, &dst) {
        let _ = fs::remove_file(&tmp);
        return Err(Error::io(&dst, e));
    }
    sys::fsync_dir(&keys).at(&keys)
}

impl CommitOutcome {
    /// The outcome of a commit of a hit (`rec`): nothing to promote.
    fn noop(rec: &RunRecord, total_ms: u64) -> CommitOutcome {
        CommitOutcome {
            result: CommitResult::Noop,
            key: rec.key.clone(),
            layer: rec.lower.clone(),
            parent: None,
            bytes: 0,
            files: 0,
            new_objects: 0,
            new_bytes: 0,
            dropped: vec![],
            skipped: vec![],
            remount: None,
            unmount_ms: 0,
            promote_ms: 0,
            publish_ms: 0,
            total_ms,
            gc: None,
        }
    }
}

/// Unmounts a run's mount at `mnt` (served by `daemon_pid`) for its commit: marks the run
/// directory `run_dir` recently active (gc's grace period), syncs, unmounts and waits for the
/// daemon. Returns the milliseconds it took to unmount.
///
/// Errors: as [`unmount_and_wait`].
fn unmount_run(mnt: &Path, run_dir: &Path, daemon_pid: u32) -> Result<u64> {
    let _ = fs::File::open(run_dir.join("lease"))
        .and_then(|f| f.set_modified(std::time::SystemTime::now()));
    let _ = sys::syncfs(mnt);
    let tu = Instant::now();
    unmount_and_wait(mnt, daemon_pid)?;
    Ok(ms_since(tu))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Lookup;

    #[test]
    fn automatic_gc_runs_only_over_a_limit() {
        let t = tempfile::tempdir().unwrap();
        let mut store = Store::open(Some(&t.path().join("store"))).unwrap();
        let (p, c) = (ProjectId::new("p").unwrap(), CacheId::new("c").unwrap());
        for (i, k) in ["k1", "k2"].into_iter().enumerate() {
            let upper = t.path().join(k);
            fs::create_dir_all(&upper).unwrap();
            fs::write(upper.join("f"), vec![i as u8; 1000]).unwrap();
            let key = CacheKey::new(k).unwrap();
            store
                .promote_dirs(&p, &c, &key, None, Some(&upper))
                .unwrap();
            fs::remove_dir_all(&upper).unwrap();
        }
        let exact = store.quick_usage().unwrap();
        let bound = store.usage_bound().unwrap();
        assert_eq!((exact.bytes, bound.bytes, bound.layers), (2000, 2000, 2));
        assert!(bound.inodes >= exact.inodes, "{bound:?} {exact:?}");
        // Far below the default limits: the manifests' bound answers.
        assert!(store.auto_gc().is_none());
        // The bound is over half of the limit, the exact usage is under it: no gc.
        store.limits.max_size = Some(3000);
        assert!(store.auto_gc().is_none());
        // Over the limit: gc evicts the least recently used layer.
        store.limits.max_size = Some(1500);
        let r = store.auto_gc().expect("gc ran");
        assert_eq!((r.evicted.len(), r.after.bytes), (1, 1000), "{r:?}");
    }

    #[test]
    fn eight_threads_race_to_publish_one_key() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::open(Some(&t.path().join("store"))).unwrap();
        let (p, c, k) = (
            ProjectId::new("p").unwrap(),
            CacheId::new("c").unwrap(),
            CacheKey::new("k").unwrap(),
        );
        let results: Vec<Published> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|i| {
                    let (store, p, c, k) = (&store, &p, &c, &k);
                    let upper = t.path().join(format!("upper{i}"));
                    s.spawn(move || {
                        for f in 0..50 {
                            let d = upper.join(format!("d{}", f % 5));
                            fs::create_dir_all(&d).unwrap();
                            fs::write(d.join(format!("f{f}")), format!("{i}:{f}")).unwrap();
                        }
                        store.promote_dirs(p, c, k, None, Some(&upper)).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners: Vec<_> = results
            .iter()
            .filter(|r| r.result == CommitResult::Published)
            .collect();
        assert_eq!(winners.len(), 1);
        assert!(results.iter().all(|r| r.layer == winners[0].layer));
        let pd = store.project(&p).unwrap();
        assert_eq!(pd.layer_ids().unwrap(), vec![winners[0].layer.clone()]);
        assert_eq!(
            store.lookup(&pd, &c, &k, &[]).unwrap(),
            Lookup::Hit {
                layer: winners[0].layer.clone()
            }
        );
        // Once the uppers are gone (commit deletes the run), the losers' objects are
        // unreferenced garbage for gc; the winner's stay.
        for i in 0..8 {
            fs::remove_dir_all(t.path().join(format!("upper{i}"))).unwrap();
        }
        let r = store.gc(&GcOptions::default()).unwrap();
        assert_eq!(r.removed_objects, 7 * 50);
        assert_eq!(pd.objects().list().unwrap().len(), 50);
    }
}
