//! The [`Mounter`]s a run is given: [`StoreMounter`] over the layer store, and [`NoMounts`] for
//! a run that declares no caches.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;

use super::{Committed, LazyFetched, Mounted, Mounter, Prefetched};
use crate::error::{Error, Result};
use crate::ids::{CacheId, CacheKey, ProjectId};
use crate::store::{Notice, Store};

/// [`Mounter`] over the layer store ([`crate::store::Store`]). Keeps the [`crate::store::Mount`]
/// handle of every mount it made (and so its leases) until it commits or unmounts it.
pub struct StoreMounter {
    store: crate::store::Store,
    fill_wait: Duration,
    mounts: parking_lot::Mutex<BTreeMap<PathBuf, crate::store::Mount>>,
    /// Ownership mapping of every mount (`--user`).
    squash: crate::overlay::options::Squash,
    /// The passthrough choice of each cache (spec field `passthrough`, or `--passthrough`);
    /// a cache not listed is mounted with `Auto`.
    passthrough: BTreeMap<CacheId, crate::overlay::options::PassthroughChoice>,
    /// A key salt provisioned outside the store (`LAYERCACHE_KEY_SALT`), used instead of the
    /// project's.
    salt: Option<crate::key::KeySalt>,
    /// Caches whose layer must be local when mounted (their view is promoted again after
    /// the run, `save = "success"`): a remote hit of theirs is pulled whole, never lazily.
    whole: std::collections::BTreeSet<CacheId>,
    /// What lazily mounted layers fetched, from the store's [`Notice::LazyFetched`]s, until
    /// [`Mounter::take_lazy_fetched`] takes it.
    lazy_fetched: Arc<parking_lot::Mutex<Vec<LazyFetched>>>,
}

impl StoreMounter {
    /// Wraps an open store; a mount waits up to `fill_wait` for another run filling the same
    /// key. The store's notices still go where they went ([`Store::with_notify`]); what a
    /// lazily mounted layer fetched is also kept for the run's event log.
    pub fn new(store: Store, fill_wait: Duration) -> Self {
        let lazy_fetched = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let (sink, earlier) = (Arc::clone(&lazy_fetched), store.notifier());
        let store = store.with_notify(Arc::new(move |n: &Notice| {
            if let Notice::LazyFetched { cache, end, .. } = n {
                sink.lock().push(LazyFetched {
                    cache: cache.clone(),
                    bytes: end.fetched_bytes,
                    objects: end.fetched_objects,
                });
            }
            match &earlier {
                Some(f) => f(n),
                None => tracing::info!("{n}"),
            }
        }));
        StoreMounter {
            lazy_fetched,
            store,
            fill_wait,
            mounts: parking_lot::Mutex::new(BTreeMap::new()),
            squash: Default::default(),
            passthrough: BTreeMap::new(),
            salt: None,
            whole: Default::default(),
        }
    }

    /// Pulls a remote hit of each listed cache whole before mounting it (never lazily).
    pub fn with_whole_layers(mut self, caches: std::collections::BTreeSet<CacheId>) -> Self {
        self.whole = caches;
        self
    }

    /// Keys every project with `salt` (provisioned outside the store, e.g. from a secret
    /// manager: `LAYERCACHE_KEY_SALT`) instead of the project's own or the remote's.
    pub fn with_key_salt(mut self, salt: Option<crate::key::KeySalt>) -> Self {
        self.salt = salt;
        self
    }

    /// Mounts each listed cache with its passthrough choice (others: `Auto`).
    pub fn with_passthrough(
        mut self,
        choices: BTreeMap<CacheId, crate::overlay::options::PassthroughChoice>,
    ) -> Self {
        self.passthrough = choices;
        self
    }

    /// Mounts every cache with this ownership mapping (`--user UID:GID`).
    pub fn with_squash(mut self, squash: crate::overlay::options::Squash) -> Self {
        self.squash = squash;
        self
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }
}

impl Mounter for StoreMounter {
    fn key_salt(&self, project: &ProjectId) -> Result<Option<crate::key::KeySalt>> {
        if let Some(s) = self.salt {
            return Ok(Some(s));
        }
        Ok(Some(crate::key::KeySalt(
            self.store.local_key_salt(project)?,
        )))
    }

    fn agreed_key_salt(&self, project: &ProjectId) -> Result<Option<crate::key::KeySalt>> {
        if let Some(s) = self.salt {
            return Ok(Some(s));
        }
        Ok(Some(crate::key::KeySalt(self.store.key_salt(project)?)))
    }

    fn mount(
        &self,
        project: &ProjectId,
        cache: &CacheId,
        key: &CacheKey,
        restore_keys: &[CacheKey],
        view: &Path,
    ) -> Result<Mounted> {
        use crate::store::MountRequest;
        let m = self.store.mount(&MountRequest {
            project: project.clone(),
            cache: cache.clone(),
            key: key.clone(),
            restore_keys: restore_keys.to_vec(),
            fill_wait: self.fill_wait,
            mountpoint: None,
            owner: Some(std::process::id()),
            squash: self.squash,
            passthrough: (self.passthrough.get(cache).copied())
                .unwrap_or(crate::overlay::options::PassthroughChoice::Auto),
            lazy: !self.whole.contains(cache),
        })?;
        let upper = Some(m.upper(&self.store));
        let out = m.outcome.clone();
        self.mounts.lock().insert(view.to_path_buf(), m);
        Ok(Mounted {
            result: out.result,
            matched_key: out.matched_key.map(|k| k.to_string()),
            upper,
            bytes: out.bytes,
            files: out.files,
            source: out.mountpoint,
            run: out.run,
            pulled: out.remote,
            warm: out.warm,
        })
    }

    fn commit(&self, view: &Path, inputs: &crate::why::Inputs) -> Result<Committed> {
        let held = self.mounts.lock().remove(view).ok_or_else(|| {
            Error::Failed(format!("{}: no mount of this run there", view.display()))
        })?;
        // A failed promotion removes the run's upper at once (nothing to retry in a run).
        let (out, remount) = self.store.commit_mount(held, Some(inputs))?;
        let remount = remount.map(|r| {
            let at = (
                r.outcome.mountpoint.clone(),
                r.outcome.run.clone(),
                Some(r.upper(&self.store)),
            );
            self.mounts.lock().insert(view.to_path_buf(), r);
            at
        });
        if !out.dropped.is_empty() {
            eprintln!(
                "layercache: kept out of the layer (credentials): {}",
                out.dropped.join(", ")
            );
        }
        if let Some(line) = out.gc.as_ref().and_then(|g| auto_gc_line(g, &out.key)) {
            eprintln!("{line}");
        }
        Ok(Committed {
            published: out.result == crate::store::CommitResult::Published,
            bytes: out.bytes,
            files: out.files,
            remount,
            new_files: out.new_objects,
            new_bytes: out.new_bytes,
        })
    }

    fn save(&self, view: &Path) -> Result<Option<Committed>> {
        let Some(m) = self.mounts.lock().remove(view) else {
            return Ok(None);
        };
        let Some(p) = self.store.save_mount(m, self.fill_wait)? else {
            return Ok(None);
        };
        let c = &p.manifest.counts;
        Ok(Some(Committed {
            published: true,
            bytes: c.bytes,
            files: c.files,
            remount: None,
            new_files: c.new_objects,
            new_bytes: c.new_bytes,
        }))
    }

    fn umount(&self, view: &Path) -> Result<()> {
        let Some(m) = self.mounts.lock().remove(view) else {
            return Ok(()); // never mounted, or its commit failed and put nothing back
        };
        let r = match self.store.find_run_id(&m.outcome.run)? {
            Some(sm) => self.store.end_run(sm),
            None => Ok(()),
        };
        // Once unmounted, a discarded fill's lock file goes.
        if r.is_ok() {
            m.end_fill();
        }
        r
    }

    fn take_lazy_fetched(&self) -> Vec<LazyFetched> {
        std::mem::take(&mut *self.lazy_fetched.lock())
    }

    fn await_prefetch(&self, view: &Path) -> Option<Prefetched> {
        let run_dir = {
            let mounts = self.mounts.lock();
            let m = mounts.get(view)?;
            if !m.outcome.remote.as_ref().is_some_and(|r| r.lazy) {
                return None;
            }
            (self.store.project_dirs(&m.outcome.project).runs()).join(&m.outcome.run)
        };
        let until = crate::remote::lazy::prefetch_deadline();
        let p = crate::remote::lazy::wait_prefetched(&run_dir, until)?;
        Some(Prefetched {
            objects: p.objects,
            bytes: p.bytes,
            skipped: p.skipped,
        })
    }

    fn check(&self, view: &Path) -> Result<()> {
        let mounts = self.mounts.lock();
        let Some(m) = mounts.get(view) else {
            return Ok(());
        };
        let pid = m.outcome.daemon_pid;
        // Reap it if it is our exited child, so the probe below does not see a zombie.
        crate::sys::reap_nohang(pid);
        if crate::sys::pid_alive(pid) {
            return Ok(());
        }
        Err(Error::Failed(format!(
            "cache {}: its overlay mount died (daemon {pid} is gone), so what was written to it \
             is lost; the mount was cleaned up",
            m.outcome.cache
        )))
    }
}

/// What the automatic gc after a publish evicted, as one line (`None` when nothing): the store
/// is shared by every project, so a run may evict another project's least recently used
/// layers; the line says how many were whose. `evicted` entries are `project/layer`.
fn auto_gc_line(gc: &crate::store::GcReport, key: &CacheKey) -> Option<String> {
    if gc.evicted.is_empty() {
        return None;
    }
    let mut projects: BTreeMap<&str, usize> = BTreeMap::new();
    for e in &gc.evicted {
        *projects
            .entry(e.split('/').next().unwrap_or(""))
            .or_default() += 1;
    }
    let whose: Vec<String> = (projects.iter())
        .map(|(p, n)| format!("{n} of project {p}"))
        .collect();
    Some(format!(
        "layercache: the store was over its limits after publishing {key}: gc evicted {} least \
         recently used layer(s) ({}); `layercache ls` shows what is left, v1/config.toml sets \
         the limits",
        gc.evicted.len(),
        whose.join(", ")
    ))
}

/// A [`Mounter`] for runs that declare no caches: every operation fails.
pub struct NoMounts;

impl Mounter for NoMounts {
    fn mount(
        &self,
        _: &ProjectId,
        c: &CacheId,
        _: &CacheKey,
        _: &[CacheKey],
        _: &Path,
    ) -> Result<Mounted> {
        Err(Error::Failed(format!("cache {c}: no store opened")))
    }
    fn commit(&self, view: &Path, _: &crate::why::Inputs) -> Result<Committed> {
        Err(Error::Failed(format!(
            "{}: no store opened",
            view.display()
        )))
    }
    fn umount(&self, mp: &Path) -> Result<()> {
        Err(Error::Failed(format!("{}: no store opened", mp.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_automatic_gc_says_whose_layers_it_evicted() {
        let key = CacheKey::new("k").unwrap();
        let mut gc = crate::store::GcReport::default();
        assert_eq!(auto_gc_line(&gc, &key), None);
        gc.evicted = vec!["web/l1".into(), "api/l2".into(), "web/l3".into()];
        let line = auto_gc_line(&gc, &key).unwrap();
        assert!(
            line.contains(
                "gc evicted 3 least recently used layer(s) (1 of project api, 2 of project web)"
            ),
            "{line}"
        );
    }
}
