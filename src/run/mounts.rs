//! The run's mounts ([`Mounts`]): every cache mounted for this run by its view path, the host
//! directories its views need (made without following a planted symlink, held with a shared
//! flock while the run lasts, removed when it ends if still empty and nobody else holds them),
//! and the unmounts on every exit path (Drop).

use std::path::{Path, PathBuf};

use super::{Mounter, Prep, hostpath};
use crate::error::{Error, IoContext, Result};
use crate::ids::CacheId;
use crate::sandbox::Sandbox;
use crate::spec::Paths;

/// Every mount of this run (by view path); Drop unmounts what is left, in reverse order, then
/// removes the view directories the run made on the host ([`Mounts::remove_made`]).
pub(super) struct Mounts<'a> {
    pub(super) mounter: &'a dyn Mounter,
    /// The store root and run id the made view directories are recorded under
    /// ([`crate::store::record_made_views`]), so `gc` removes them after a `kill -9`.
    pub(super) store: &'a Path,
    pub(super) run_id: &'a str,
    /// The view paths mounted now, in mount order.
    pub(super) points: Vec<PathBuf>,
    /// The host view directories of [`Mounts::prepare_views`], each open with a shared flock
    /// for the whole run, and whether this run created it.
    view_dirs: Vec<(PathBuf, Option<std::fs::File>, bool)>,
}

impl<'a> Mounts<'a> {
    /// No mounts yet, through `mounter`, the made view directories recorded under `store`
    /// and `run_id`.
    pub(super) fn new(mounter: &'a dyn Mounter, store: &'a Path, run_id: &'a str) -> Self {
        Mounts {
            mounter,
            store,
            run_id,
            points: Vec::new(),
            view_dirs: Vec::new(),
        }
    }

    /// Unmounts every mount left, newest first.
    ///
    /// Errors: the first unmount's error (the others are warnings; every one is tried).
    pub(super) fn unmount_all(&mut self) -> Result<()> {
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
    pub(super) fn check_all(&self) -> Result<()> {
        self.points.iter().try_for_each(|v| self.mounter.check(v))
    }

    /// Creates on the host what the views need to exist: the mount root, the workdir view
    /// directory, and each view below the workdir (a tmpfs holds those below the mount root).
    /// Each is held open with a shared flock(2) while the run lasts; those this run created
    /// are removed when it ends if still empty and no other run holds them
    /// ([`Mounts::remove_made`]): removing a directory another run's namespace has a mount on
    /// would detach that mount (rmdir(2) of a mountpoint in another namespace, Linux 3.18+).
    pub(super) fn prepare_views(
        &mut self,
        paths: &Paths,
        sandbox: &Sandbox,
        preps: &[Prep],
    ) -> Result<()> {
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
