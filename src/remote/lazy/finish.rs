//! The run's side of a lazy layer: laying out its partial directory before the mount
//! ([`Remote::prepare_lazy`]) and, after the mount, storing the run's trace and publishing the
//! layer once it is complete ([`Remote::finish_lazy_layer`]).

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Instant;

use object_store::{ObjectStoreExt, PutPayload};

use super::super::Remote;
use super::super::manifest::KeyRecord;
use super::super::pull::Found;
use super::tree::Tree;
use super::{
    BROKEN, HELD, LazyReport, LazySpec, MANIFEST, OLD_MANIFEST, REPLAY, REPORT, TRACE, TREE,
};
use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey, LayerId, ObjectId};
use crate::store::{LazyLower, ProjectDirs, PullReport, Store};
use crate::units::fmt_bytes;

/// `key.json` of a partial directory: the key record the layer was found by.
const KEY_RECORD: &str = "key.json";

/// `cache` of a partial directory: the id of the cache the layer is of (what `ls` shows).
const CACHE: &str = "cache";

/// `publish.lock` of a partial directory: the runs that found the layer complete publish it
/// one at a time (flock), the later one finding it published (the completing pull moves the
/// files of `held/` into the store: two at once would take them from under each other).
const PUBLISH_LOCK: &str = "publish.lock";

/// Writes `body` to `path` through a temporary file beside it and a rename (readers see the
/// old file or the new one, never a part).
///
/// Errors: [`Error::Io`] naming the path.
pub(super) fn replace_file(path: &Path, body: &[u8]) -> Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(
        ".{}.{}",
        name.unwrap_or_default(),
        crate::sys::random_hex(6)
    ));
    // Mode 0644 whatever the umask (the daemon's is 0): what a partial directory keeps is
    // written by its owner only.
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&tmp)
        .and_then(|mut f| std::io::Write::write_all(&mut f, body))
        .at(&tmp)?;
    fs::rename(&tmp, path).at(path).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// A manifest a lazy mount starts from: the remote's path when fetched now (`None`: the
/// partial directory had it), and its bytes.
enum Got {
    /// The compact or JSON manifest.
    Manifest(Option<object_store::path::Path>, bytes::Bytes),
    /// The tree manifest.
    Tree(Option<object_store::path::Path>, bytes::Bytes),
}

impl Remote {
    /// Lays out the partial directory of the exact hit `found` in `pd` for a lazy mount: the
    /// tree manifest (`<layer>.tree`: the entries without the object table, which the daemon
    /// fetches after the mount; only its header is checked here, the daemon checks the rest
    /// and marks the directory broken if it must), or for a layer pushed without one the
    /// compact (or JSON) manifest, checked whole, and its link groups; the key's recorded
    /// trace (fetched each time: the newest) and `held/`. A partial directory an earlier run
    /// made keeps its manifests. The fetches are bounded by `lookup_timeout`.
    ///
    /// Errors: [`Error::Failed`] when an earlier run found the layer broken (it is not used
    /// again); the remote's errors ([`super::super::RemoteError::Corrupt`] for a manifest of
    /// another layer or one that does not parse); [`Error::Io`] locally.
    pub(in crate::remote) fn prepare_lazy(
        &self,
        pd: &ProjectDirs,
        cache: &CacheId,
        found: &Found,
    ) -> Result<LazyLower> {
        let t0 = Instant::now();
        let layer = &found.record.layer;
        let dir = pd.partial(layer);
        if let Ok(why) = fs::read_to_string(dir.join(BROKEN)) {
            return Err(Error::Failed(format!(
                "remote layer {layer} is marked broken ({}); it is not used",
                why.trim()
            )));
        }
        let held = dir.join(HELD);
        let mpath = dir.join(MANIFEST);
        let tpath = dir.join(TREE);
        // A partial directory of an earlier version keeps its manifest as JSON: moved to
        // the name the daemon reads (either form parses).
        let old = dir.join(OLD_MANIFEST);
        if !mpath.exists() && old.exists() {
            fs::rename(&old, &mpath).at(&old)?;
        }
        // The tree manifest when an earlier run kept it (the daemon reads the compact one
        // kept beside it, if any, after the mount).
        let have = match fs::read(&tpath) {
            Ok(b) => Some(Got::Tree(None, b.into())),
            Err(_) => fs::read(&mpath).ok().map(|b| Got::Manifest(None, b.into())),
        };
        let trace_path = self.layout.trace(&pd.project, cache, &found.key);
        let asked = Instant::now();
        let (got, trace) = self.block_on(Some(self.cfg.lookup_timeout), async {
            let manifest = async {
                if have.is_some() {
                    return Ok(None);
                }
                let path = self.layout.tree_manifest(&pd.project, layer);
                let what = format!("reading the tree manifest of layer {layer}");
                match self.store.get(&path).await {
                    Ok(g) => {
                        let b = g.bytes().await.map_err(|e| self.error(&what, e))?;
                        Ok(Some(Got::Tree(Some(path), b)))
                    }
                    Err(e) if super::super::is_not_found(&e) => {
                        let (path, b) = self.manifest_object(&pd.project, layer).await?;
                        Ok(Some(Got::Manifest(Some(path), b)))
                    }
                    Err(e) => Err(self.error(&what, e)),
                }
            };
            let trace = async {
                match self.store.get(&trace_path).await {
                    Ok(g) => Ok(g.bytes().await.ok()),
                    Err(e) if super::super::is_not_found(&e) => Ok(None),
                    Err(e) => Err(self.error("reading the key's access trace", e)),
                }
            };
            futures::try_join!(manifest, trace)
        })?;
        // What the link gave the manifest, at least (the time includes the request's delay):
        // the daemon's first guess of how long its prefetch would take. A small manifest's
        // time is mostly delay: no guess from it.
        let secs = asked.elapsed().as_secs_f64();
        let link_rate = match &got {
            Some(Got::Manifest(_, b) | Got::Tree(_, b))
                if b.len() as u64 >= super::prefetch::RATE_SAMPLE && secs > 0.0 =>
            {
                Some((b.len() as f64 / secs) as u64)
            }
            _ => None,
        };
        let got = got.or(have).expect("fetched when not here");
        let (fetched, bytes) = match &got {
            Got::Manifest(p, b) | Got::Tree(p, b) => (p.clone(), b.clone()),
        };
        let local = match got {
            Got::Manifest(..) => &mpath,
            Got::Tree(..) => &tpath,
        };
        let corrupt = |detail: String| match &fetched {
            Some(path) => self.corrupt_manifest(path, detail),
            None => Error::Failed(format!("{}: {detail}", local.display())),
        };
        let check = |header: &crate::store::Manifest| {
            if header.project != pd.project || &header.cache != cache || &header.layer != layer {
                return Err(corrupt(format!(
                    "it is of {}/{} layer {}, not {}/{cache} layer {layer}",
                    header.project, header.cache, header.layer, pd.project
                )));
            }
            Ok(())
        };
        let (counts, objects, missing) = match got {
            Got::Tree(..) => {
                let (prefix, header) = super::super::compact::tree_prefix(&bytes)
                    .map_err(|e| corrupt(format!("it does not parse: {e}")))?;
                check(&header)?;
                // Made only once the remote has answered: a remote that is down at mount
                // time leaves no partial directory behind (the run is a local miss).
                fs::create_dir_all(&held).at(&held)?;
                if fetched.is_some() {
                    replace_file(&tpath, &bytes)?;
                }
                // What earlier runs fetched is here (held/ holds only the layer's objects).
                let here: u64 = fs::read_dir(&held)
                    .at(&held)?
                    .filter_map(|e| e.ok()?.metadata().ok())
                    .map(|m| m.len())
                    .sum();
                let missing = prefix.object_bytes.saturating_sub(here);
                (header.counts, found.record.objects, missing)
            }
            Got::Manifest(..) => {
                let wire = super::super::compact::wire(&bytes)
                    .map_err(|e| corrupt(format!("it does not parse: {e}")))?;
                let header =
                    super::super::compact::header(&wire).map_err(|e| corrupt(e.to_string()))?;
                check(&header)?;
                let tree = Tree::new(&wire, 0).map_err(|e| corrupt(e.to_string()))?;
                fs::create_dir_all(&held).at(&held)?;
                if fetched.is_some() {
                    // Kept compact, whatever form the remote had (the daemon parses it again).
                    if bytes.starts_with(super::super::compact::MAGIC) {
                        replace_file(&mpath, &bytes)?;
                    } else {
                        replace_file(&mpath, &super::super::compact::encode_wire(&wire)?)?;
                    }
                }
                let here: HashSet<[u8; 32]> = fs::read_dir(&held)
                    .at(&held)?
                    .filter_map(|e| ObjectId::from_hex(e.ok()?.file_name().to_str()?).ok())
                    .map(|id| id.0)
                    .collect();
                let missing: u64 = (tree.objects.iter())
                    .filter(|(w, _)| !here.contains(&wire.objects[*w as usize]))
                    .map(|(_, s)| *s)
                    .sum();
                let objects = tree.objects.len() as u64;
                drop(here);
                // Their 100k allocations take tens of ms to free: not on the way to the mount.
                std::thread::spawn(move || drop((wire, tree)));
                (header.counts, objects, missing)
            }
        };
        replace_file(&dir.join(REPLAY), trace.as_deref().unwrap_or_default())?;
        let record = serde_json::to_vec(&found.record).unwrap_or_default();
        replace_file(&dir.join(KEY_RECORD), &record)?;
        replace_file(&dir.join(CACHE), cache.as_str().as_bytes())?;
        let spec = LazySpec {
            remote: self.cfg.clone(),
            project: pd.project.clone(),
            dir: dir.clone(),
            objects: pd.objects().dir().to_path_buf(),
            run_dir: Default::default(),
            prefetch_ms: Some(
                (super::prefetch_deadline().saturating_duration_since(Instant::now())).as_millis()
                    as u64,
            ),
            link_rate,
        };
        let report = PullReport {
            key: found.key.to_string(),
            layer: layer.to_string(),
            result: "lazy".into(),
            objects,
            manifest_bytes: fetched.map_or(0, |_| bytes.len() as u64),
            ms: t0.elapsed().as_millis() as u64,
            lazy: true,
            lazy_bytes: missing,
            ..Default::default()
        };
        tracing::info!(ms = report.ms, missing, "lazy: partial directory ready");
        Ok(LazyLower {
            layer: layer.clone(),
            refused: dir.join(BROKEN),
            dir,
            spec: serde_json::to_value(&spec)
                .map_err(|e| Error::Failed(format!("lazy layer spec: {e}")))?,
            counts,
            report,
        })
    }

    /// Stores a run's access `trace` (paths, one per line) beside `cache`/`key` of `pd`'s
    /// project (`caches/<cache>/traces/<key>`): replacing the one there (a lazy run's: the
    /// newest), or with `create_only` only where there is none (a local hit's: a trace a lazy
    /// run recorded from an empty cache is kept), unless the remote failed earlier in this
    /// process; within the lookup timeout. Returns whether the key has a trace now (stored, or
    /// there already); a failure is logged.
    pub(in crate::remote) fn put_trace(
        &self,
        pd: &ProjectDirs,
        cache: &CacheId,
        key: &CacheKey,
        trace: Vec<u8>,
        create_only: bool,
    ) -> bool {
        if !self.healthy.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        let path = self.layout.trace(&pd.project, cache, key);
        let opts = object_store::PutOptions {
            mode: match create_only {
                true => object_store::PutMode::Create,
                false => object_store::PutMode::Overwrite,
            },
            ..Default::default()
        };
        let put = async {
            (self
                .store
                .put_opts(&path, PutPayload::from(trace), opts)
                .await)
                .map_err(|e| self.error("storing the run's access trace", e))
        };
        match self.block_on(Some(self.cfg.lookup_timeout), put) {
            Ok(_) => true,
            Err(Error::Remote {
                kind: crate::error::RemoteKind::Conflict,
                ..
            }) => true,
            Err(e) => {
                tracing::warn!("storing the run's access trace in the remote: {e}");
                false
            }
        }
    }

    /// See [`crate::store::RemoteTier::finish_lazy`]: what the run fetched and the line for
    /// the user (`None`: no report of the daemon in `run_dir`). Runs
    /// that find the layer complete publish it one at a time ([`PUBLISH_LOCK`]); one that
    /// finds it published meanwhile says so. Once the layer is published, the temporary files
    /// of fetches that no daemon holds go from its partial directory.
    pub(in crate::remote) fn finish_lazy_layer(
        &self,
        store: &Store,
        pd: &ProjectDirs,
        cache: &CacheId,
        key: &CacheKey,
        layer: &LayerId,
        run_dir: &Path,
    ) -> Option<crate::store::LazyEnd> {
        let report: LazyReport =
            serde_json::from_slice(&fs::read(run_dir.join(REPORT)).ok()?).ok()?;
        let message = self.finish_reported(store, pd, (cache, key, layer), run_dir, &report);
        Some(crate::store::LazyEnd {
            message,
            fetched_bytes: report.fetched_bytes,
            fetched_objects: report.fetched_objects,
        })
    }

    /// [`Remote::finish_lazy_layer`] once the daemon's report is read: the line for the user.
    fn finish_reported(
        &self,
        store: &Store,
        pd: &ProjectDirs,
        (cache, key, layer): (&CacheId, &CacheKey, &LayerId),
        run_dir: &Path,
        report: &LazyReport,
    ) -> String {
        let dir = pd.partial(layer);
        let failed = match report.failed.is_empty() {
            true => String::new(),
            false => format!("; reads that failed (EIO): {}", report.failed.join("; ")),
        };
        if let Some(why) = &report.broken {
            let _ = replace_file(&dir.join(BROKEN), why.as_bytes());
            return format!(
                "{cache}: the remote layer {layer} is broken ({why}); it is not used again \
                 (`layercache remote gc` does not repair it: push the key again){failed}"
            );
        }
        // The remote stopped answering the daemon (and no probe found it back): this run asks
        // it nothing more (no wait for the trace or the publish).
        if report.remote_down {
            self.mark_unhealthy();
        }
        let trace = fs::read(run_dir.join(TRACE)).unwrap_or_default();
        if !trace.is_empty() {
            self.put_trace(pd, cache, key, trace, false);
        }
        let before = match report.prefetched_bytes {
            0 => String::new(),
            b => format!(
                "; {} of {} likely-mmapped file(s) before COMMAND",
                fmt_bytes(b),
                report.prefetched_objects
            ),
        };
        let fetched = format!(
            "{cache}: fetched lazily {} of {} ({} objects, {} GETs{before}) while the run \
             lasted{failed}",
            fmt_bytes(report.fetched_bytes),
            fmt_bytes(report.bytes),
            report.fetched_objects,
            report.gets
        );
        if !report.complete {
            return format!(
                "{fetched}; {} of the layer's objects are here, the next run fetches the rest",
                report.local_objects
            );
        }
        let record: Option<KeyRecord> = fs::read(dir.join(KEY_RECORD))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let Some(record) = record else {
            return fetched;
        };
        let found = Found {
            key: key.clone(),
            exact: true,
            record,
        };
        // Held until this function returns; without the lock file, publish as before.
        let lock_path = dir.join(PUBLISH_LOCK);
        let _turn = (fs::OpenOptions::new().read(true).write(true).create(true))
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&lock_path)
            .ok()
            .filter(|f| crate::sys::flock(f, libc::LOCK_EX).is_ok());
        let published = pd.read_key(cache, key).ok().flatten().as_ref() == Some(layer)
            && pd.layer(layer).tree().is_dir();
        if published {
            super::fetch::remove_stale_temps(&dir);
            return format!(
                "{fetched}; the layer is complete and now local (another run published it)"
            );
        }
        // The compact manifest the daemon kept (checked against the tree manifest's digest
        // when it came): the publish asks the remote nothing.
        let mpath = dir.join(MANIFEST);
        let kept = fs::read(&mpath).ok();
        let local = kept.as_deref().map(|b| (mpath.as_path(), b));
        match self.pull_with(store, pd, cache, &found, (Some(&dir.join(HELD)), local)) {
            Ok(r) => {
                // The partial directory is garbage now (gc removes it once no run holds
                // it); what a fetch cut off by a daemon's end left in it goes at once.
                super::fetch::remove_stale_temps(&dir);
                format!(
                    "{fetched}; the layer is complete and now local ({} in {} ms)",
                    r.result, r.ms
                )
            }
            Err(e) => format!("{fetched}; publishing the complete layer locally failed: {e}"),
        }
    }
}
