//! Lookup and pull: find a key on the remote (exact, then restore prefixes, newest first), fetch
//! its manifest and only the objects missing locally (bounded parallel, streamed, blake3-verified
//! on arrival into a temp file renamed into place), rebuild the tree exactly as `promote` made it
//! and publish it through the store's normal publish path.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use serde::Serialize;

use super::Remote;
use super::error::RemoteError;
use super::manifest::{Entry, KeyRecord, Kind, RemoteManifest};
use super::unpack::{Arrived, Plan, Temps, Unpack, apply_meta, writers_stopped};
use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey, LayerId, ObjectId, ProjectId};
use crate::store::ObjectStore as LocalObjects;
use crate::store::{
    CommitResult, ProjectDirs, PublishSpec, PullReport, Store, TreeStats, undo_created_objects,
};
use crate::sys;

/// A key found on the remote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Found {
    /// The published key (the exact key, or the newest match of a restore prefix).
    pub key: CacheKey,
    /// True when it is the exact key.
    pub exact: bool,
    /// Its record.
    pub record: KeyRecord,
}

impl Remote {
    /// Reads the key record of `key`, if the remote has it.
    ///
    /// Errors: [`RemoteError`] naming the remote (unreachable, denied, a corrupt record).
    pub async fn key_record(
        &self,
        project: &ProjectId,
        cache: &CacheId,
        key: &CacheKey,
    ) -> Result<Option<KeyRecord>> {
        let path = self.layout.key(project, cache, key);
        let got = match self.store.get(&path).await {
            Ok(g) => g,
            Err(e) if super::is_not_found(&e) => return Ok(None),
            Err(e) => return Err(self.error(&format!("reading key {key}"), e)),
        };
        let bytes = got
            .bytes()
            .await
            .map_err(|e| self.error(&format!("reading key {key}"), e))?;
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            RemoteError::Corrupt {
                url: self.cfg.url.clone(),
                what: format!("key {key}"),
                detail: format!("its record does not parse: {e}"),
            }
            .into()
        })
    }

    /// Every key of `cache` on the remote with its last-modified time (ms), unordered.
    ///
    /// Errors: [`RemoteError`] naming the remote.
    pub async fn list_keys(
        &self,
        project: &ProjectId,
        cache: &CacheId,
    ) -> Result<Vec<(CacheKey, i64)>> {
        let dir = self.layout.keys(project, cache);
        let metas = self.list_dir(&dir).await?;
        Ok(metas
            .into_iter()
            .filter_map(|m| {
                let name = m.location.filename()?;
                let key = CacheKey::new(name).ok()?;
                Some((key, m.last_modified.timestamp_millis()))
            })
            .collect())
    }

    /// Finds `key` on the remote, else (when `restore_keys` is given) the newest key starting
    /// with each prefix in turn (actions/cache order).
    ///
    /// Errors: [`RemoteError`] naming the remote.
    pub async fn find(
        &self,
        project: &ProjectId,
        cache: &CacheId,
        key: &CacheKey,
        restore_keys: &[CacheKey],
    ) -> Result<Option<Found>> {
        if let Some(record) = self.key_record(project, cache, key).await? {
            return Ok(Some(Found {
                key: key.clone(),
                exact: true,
                record,
            }));
        }
        if restore_keys.is_empty() {
            return Ok(None);
        }
        let keys = self.list_keys(project, cache).await?;
        for prefix in restore_keys {
            let mut matching: Vec<&(CacheKey, i64)> = keys
                .iter()
                .filter(|(k, _)| k.as_str().starts_with(prefix.as_str()))
                .collect();
            matching.sort_by_key(|(k, t)| std::cmp::Reverse((*t, k.clone())));
            for (k, _) in matching {
                if let Some(record) = self.key_record(project, cache, k).await? {
                    return Ok(Some(Found {
                        key: k.clone(),
                        exact: false,
                        record,
                    }));
                }
            }
        }
        Ok(None)
    }

    /// Reads and validates the manifest of `layer`.
    ///
    /// Errors: [`RemoteError`] naming the remote; [`RemoteError::Corrupt`] naming the manifest
    /// when it does not parse, is invalid or belongs to another project/cache.
    pub async fn manifest(
        &self,
        project: &ProjectId,
        cache: &CacheId,
        layer: &LayerId,
    ) -> Result<(RemoteManifest, u64)> {
        let (m, bytes) = self.manifest_bytes(project, cache, layer).await?;
        Ok((m, bytes.len() as u64))
    }

    /// [`Remote::manifest`] with the bytes it was read from: the compact form
    /// (`manifests/<layer>.compact`, see `compact.rs`) when the remote has it, else the JSON
    /// one (a layer pushed by an older version). [`super::compact::parse`] reads either.
    ///
    /// Errors: as [`Remote::manifest`].
    pub async fn manifest_bytes(
        &self,
        project: &ProjectId,
        cache: &CacheId,
        layer: &LayerId,
    ) -> Result<(RemoteManifest, bytes::Bytes)> {
        let (path, bytes) = self.manifest_object(project, layer).await?;
        let m = checked_manifest(&bytes, (project, cache, layer))
            .map_err(|detail| self.corrupt_manifest(&path, detail))?;
        Ok((m, bytes))
    }

    /// The manifest object of `layer` of `project` as stored: its path and bytes, the compact
    /// form when the remote has it, else the JSON one. Not parsed.
    ///
    /// Errors: [`RemoteError`] naming the remote (not found when neither form exists).
    pub async fn manifest_object(
        &self,
        project: &ProjectId,
        layer: &LayerId,
    ) -> Result<(object_store::path::Path, bytes::Bytes)> {
        let what = format!("reading the manifest of layer {layer}");
        let get = async |path: &object_store::path::Path| {
            let got = self.store.get(path).await?;
            got.bytes().await
        };
        let compact = self.layout.compact_manifest(project, layer);
        let (path, bytes) = match get(&compact).await {
            Ok(b) => (compact, b),
            Err(e) if super::is_not_found(&e) => {
                let path = self.layout.manifest(project, layer);
                let b = get(&path).await.map_err(|e| self.error(&what, e))?;
                (path, b)
            }
            Err(e) => return Err(self.error(&what, e)),
        };
        Ok((path, bytes))
    }

    /// The error for the manifest at `path` that is wrong as `detail` says
    /// ([`RemoteError::Corrupt`]).
    pub fn corrupt_manifest(&self, path: &object_store::path::Path, detail: String) -> Error {
        RemoteError::Corrupt {
            url: self.cfg.url.clone(),
            what: format!("manifest {path}"),
            detail,
        }
        .into()
    }

    /// Pulls the layer `found` names into `store` and publishes it locally under
    /// `found.key`. Objects already in the project (same bytes and metadata) are linked; same
    /// bytes with other metadata are copied locally; only the rest is downloaded.
    ///
    /// Errors: [`RemoteError`] naming the remote ([`RemoteError::Corrupt`] for an object whose
    /// bytes do not match its id); [`Error::Io`] locally.
    /// On error nothing is published and the objects this pull created are removed.
    pub fn pull(
        &self,
        store: &Store,
        pd: &ProjectDirs,
        cache: &CacheId,
        found: &Found,
    ) -> Result<PullReport> {
        self.pull_with(store, pd, cache, found, (None, None))
    }

    /// [`Remote::pull`], taking the objects a lazy mount fetched from `held` (its `held/`
    /// directory: verified bytes by hex id, moved or copied into the store's objects) before
    /// downloading anything, and the manifest from `local` (the compact manifest a lazy mount
    /// kept, its digest checked against the tree manifest's when it was fetched) instead of
    /// the remote's when given: a lazy layer that is complete is published without asking the
    /// remote anything. Nothing is asked of a remote that is down in this process
    /// ([`Remote::is_down`]).
    ///
    /// Errors: as [`Remote::pull`]; [`super::RemoteError::Down`] (kind `Unreachable`) when the
    /// remote is down in this process and something must be asked of it; [`Error::Failed`]
    /// naming `local`'s file when it does not parse or is another layer's.
    pub fn pull_with(
        &self,
        store: &Store,
        pd: &ProjectDirs,
        cache: &CacheId,
        found: &Found,
        (held, local): (Option<&Path>, Option<(&Path, &[u8])>),
    ) -> Result<PullReport> {
        let t0 = Instant::now();
        let layer = &found.record.layer;
        let (manifest, manifest_bytes) = match local {
            Some((path, bytes)) => {
                let m = checked_manifest(bytes, (&pd.project, cache, layer))
                    .map_err(|e| Error::Failed(format!("{}: {e}", path.display())))?;
                // Read here, not fetched: no bytes came from the remote.
                (m, 0)
            }
            None if self.is_down() => return Err(self.down_error()),
            None => self.block_on(None, self.manifest(&pd.project, cache, layer))?,
        };
        tracing::info!(
            bytes = manifest_bytes,
            ms = t0.elapsed().as_millis() as u64,
            "pull: manifest fetched"
        );
        let spec = PublishSpec {
            cache: cache.clone(),
            key: found.key.clone(),
            // Keep the remote id unless this store has a layer of that id already.
            layer: (!pd.layer(layer).dir.exists()).then(|| layer.clone()),
            parent: manifest.layer.parent.clone(),
            created_ms: Some(manifest.layer.created_ms),
        };
        let mut report = PullReport {
            key: found.key.to_string(),
            manifest_bytes,
            ..Default::default()
        };
        let published = store.publish_built(pd, &spec, |objects, tree| {
            self.build(pd, objects, (&manifest, held), tree, &mut report)
        })?;
        tracing::info!(
            ms = published.publish_ms,
            "pull: published (manifest, syncfs, rename, key)"
        );
        // The key's inputs come with it, so a later miss here says what changed.
        if published.result == CommitResult::Published
            && let Some(inputs) = &found.record.inputs
        {
            pd.record_inputs(cache, found.key.as_str(), inputs);
        }
        report.layer = published.layer.to_string();
        report.result = match published.result {
            CommitResult::Exists => "exists",
            _ => "published",
        }
        .to_string();
        report.ms = t0.elapsed().as_millis() as u64;
        Ok(report)
    }

    /// Materialises `m` at `tree` with objects of `objects` (runs under the project lock).
    fn build(
        &self,
        pd: &ProjectDirs,
        objects: &LocalObjects,
        (m, held): (&RemoteManifest, Option<&Path>),
        tree: &Path,
        report: &mut PullReport,
    ) -> Result<TreeStats> {
        let mut stats = TreeStats {
            counts: m.layer.counts,
            dropped: m.layer.dropped.clone(),
            // Written to the staged layer's `links` by publish, as a promotion's are.
            links: m
                .links
                .iter()
                .map(|g| g.iter().map(PathBuf::from).collect())
                .collect(),
            ..Default::default()
        };
        stats.counts.new_objects = 0;
        stats.counts.new_bytes = 0;
        let r = self.build_inner(pd, objects, (m, held), tree, report, &mut stats);
        if let Err(e) = r {
            undo_created_objects(&stats);
            return Err(e);
        }
        Ok(stats)
    }

    fn build_inner(
        &self,
        pd: &ProjectDirs,
        objects: &LocalObjects,
        (m, held): (&RemoteManifest, Option<&Path>),
        tree: &Path,
        report: &mut PullReport,
        stats: &mut TreeStats,
    ) -> Result<()> {
        let t = Instant::now();
        let plan = Plan::new(objects, m, held)?;
        report.objects = plan.sizes.len() as u64;
        report.pulled_objects = plan.missing.len() as u64;
        report.pulled_bytes = plan.missing.iter().map(|(_, s)| s).sum();
        // The tree's directories first (parents come first in the manifest; made while the
        // downloads start), so the writers can link each file as soon as its object is in
        // place; directories get their final metadata last (deepest first), so creating
        // children does not disturb their times or need write permission.
        let path_of = |e: &Entry| {
            if e.path.is_empty() {
                tree.to_path_buf()
            } else {
                tree.join(&e.path)
            }
        };
        let dirs: Vec<_> = m
            .entries
            .iter()
            .filter(|e| e.kind == Kind::Dir)
            .map(|e| (path_of(e), e))
            .collect();
        let make_dirs = || -> Result<()> {
            for (d, _) in &dirs {
                fs::create_dir(d).at(d)?;
            }
            Ok(())
        };
        let packed_at = m.pack_locations()?;
        let (packed, alone): (Vec<_>, Vec<_>) = plan
            .missing
            .iter()
            .copied()
            .partition(|(id, _)| packed_at.contains_key(id));
        let packed: Vec<_> = packed
            .into_iter()
            .map(|(id, _)| (id, packed_at[&id].clone()))
            .collect();
        let temps = Temps::new();
        let unpack = Unpack::new(objects, tree, &plan, &temps, &self.cfg.url)?;
        tracing::info!(ms = t.elapsed().as_millis() as u64, "pull: planned");
        let t = Instant::now();
        // Writers: about two per core (they wait on the filesystem as much as they hash).
        let threads = std::thread::available_parallelism()
            .map_or(2, |n| n.get() * 2)
            .clamp(2, 8);
        let r = unpack.run(threads, make_dirs, |tx| {
            self.block_on(None, async {
                futures::try_join!(
                    self.download_all(&pd.project, &alone, objects, &temps, tx.clone()),
                    self.download_packed(&pd.project, &packed, tx),
                )
                .map(|_| ())
            })
        });
        // What was created is undone by the caller on error: record it either way.
        for (path, bytes) in unpack.made.into_inner() {
            stats.counts.new_objects += 1;
            stats.counts.new_bytes += bytes;
            stats.created_objects.push(path);
        }
        report.copied_objects = unpack.copied.into_inner();
        r?;
        tracing::info!(
            objects = plan.missing.len(),
            ms = t.elapsed().as_millis() as u64,
            "pull: downloaded, objects in place, files linked"
        );
        let t = Instant::now();
        for e in &m.entries {
            let dst = path_of(e);
            match &e.kind {
                Kind::Symlink { target } => {
                    std::os::unix::fs::symlink(target, &dst).at(&dst)?;
                    apply_meta(&dst, e)?;
                }
                Kind::Fifo => {
                    sys::mkfifo(&dst, e.mode).at(&dst)?;
                    apply_meta(&dst, e)?;
                }
                Kind::Dir | Kind::File { .. } => {}
            }
        }
        for (dst, e) in dirs.iter().rev() {
            apply_meta(dst, e)?;
        }
        tracing::info!(ms = t.elapsed().as_millis() as u64, "pull: tree finished");
        Ok(())
    }

    /// Streams the large objects `ids` (with their sizes) into temporary files beside where
    /// they go in `objects`, at most `concurrency` at once, and hands each to the writers.
    ///
    /// Errors: as [`Remote::download`]; [`Error::Failed`] when the writers stopped (their
    /// error is the one reported).
    async fn download_all(
        &self,
        project: &ProjectId,
        ids: &[(ObjectId, u64)],
        objects: &LocalObjects,
        temps: &Temps,
        tx: tokio::sync::mpsc::Sender<Arrived>,
    ) -> Result<()> {
        futures::stream::iter(ids.iter().map(|(id, size)| {
            let dst = temps.tracked(&objects.path_for(id, 0));
            let tx = tx.clone();
            async move {
                self.download(project, id, *size, &dst).await?;
                tx.send(Arrived::File(*id, dst))
                    .await
                    .map_err(|_| writers_stopped())
            }
        }))
        .buffer_unordered(self.cfg.concurrency)
        .try_collect::<Vec<()>>()
        .await
        .map(|_| ())
    }

    /// Streams object `id` into `dst` (created, must not exist), hashing on arrival.
    ///
    /// Errors: [`RemoteError::Corrupt`] when the bytes do not hash to `id` or their length is
    /// not `size` (a corrupt or truncated remote object; `dst` is removed); a remote error.
    async fn download(
        &self,
        project: &ProjectId,
        id: &ObjectId,
        size: u64,
        dst: &Path,
    ) -> Result<()> {
        let path = self.layout.object(project, id);
        let what = format!("downloading object {id}");
        let t = Instant::now();
        let mut stream = self
            .store
            .get(&path)
            .await
            .map_err(|e| self.error(&what, e))?
            .into_stream();
        let mut f = fs::File::create_new(dst).at(dst)?;
        let mut h = blake3::Hasher::new();
        let mut n = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.error(&what, e))?;
            h.update(&chunk);
            n += chunk.len() as u64;
            f.write_all(&chunk).at(dst)?;
        }
        tracing::debug!(%id, size, ms = t.elapsed().as_millis() as u64, "object fetched");
        if n != size || h.finalize().as_bytes() != &id.0 {
            let _ = fs::remove_file(dst);
            return Err(RemoteError::Corrupt {
                url: self.cfg.url.clone(),
                what: format!("object {id}"),
                detail: format!(
                    "{n} of {size} bytes received, not matching its id; `layercache remote gc` \
                     does not repair it: delete it and push again"
                ),
            }
            .into());
        }
        Ok(())
    }
}

/// The manifest `bytes` (compact or JSON form) of `layer` of `cache` in `project`, parsed and
/// validated as a pull validates it.
///
/// Errors: what is wrong with it ("it does not parse: …", "it is of p/c layer L, not …").
fn checked_manifest(
    bytes: &[u8],
    (project, cache, layer): (&ProjectId, &CacheId, &LayerId),
) -> std::result::Result<RemoteManifest, String> {
    let m = super::compact::parse(bytes).map_err(|e| format!("it does not parse: {e}"))?;
    m.validate().map_err(|e| e.to_string())?;
    if &m.layer.project != project || &m.layer.cache != cache || &m.layer.layer != layer {
        return Err(format!(
            "it is of {}/{} layer {}, not {project}/{cache} layer {layer}",
            m.layer.project, m.layer.cache, m.layer.layer
        ));
    }
    Ok(m)
}
