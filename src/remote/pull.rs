//! Lookup and pull: find a key on the remote (exact, then restore prefixes, newest first), fetch
//! its manifest and only the objects missing locally (bounded parallel, streamed, blake3-verified
//! on arrival into a temp file renamed into place), rebuild the tree exactly as `promote` made it
//! and publish it through the store's normal publish path.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use serde::Serialize;

use super::Remote;
use super::manifest::{Entry, KeyRecord, Kind, RemoteManifest};
use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey, LayerId, ObjectId, ProjectId};
use crate::store::object::{ObjectStore as LocalObjects, meta_tag};
use crate::store::promote::{TreeStats, undo_created_objects};
use crate::store::{CommitResult, ProjectDirs, PublishSpec, Store};
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

/// What a pull did.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct PullReport {
    /// The key pulled.
    pub key: String,
    /// The layer now published locally under it.
    pub layer: String,
    /// `published`, or `exists` when a local run published the key meanwhile.
    pub result: String,
    /// Distinct objects the layer needs.
    pub objects: u64,
    /// Objects downloaded.
    pub pulled_objects: u64,
    /// Bytes downloaded (object bytes; the manifest excluded).
    pub pulled_bytes: u64,
    /// Objects made from a local object with the same bytes (other metadata), not downloaded.
    pub copied_objects: u64,
    /// Manifest bytes.
    pub manifest_bytes: u64,
    /// Milliseconds for the whole pull.
    pub ms: u64,
}

impl Remote {
    /// Reads the key record of `key`, if the remote has it.
    ///
    /// Errors: [`Error::Failed`] naming the remote (unreachable, denied, corrupt record).
    pub async fn key_record(
        &self,
        project: &ProjectId,
        cache: &CacheId,
        key: &CacheKey,
    ) -> Result<Option<KeyRecord>> {
        let path = self.layout.key(project, cache, key);
        let got = match self.store.get(&path).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.error(&format!("reading key {key}"), e)),
        };
        let bytes = got
            .bytes()
            .await
            .map_err(|e| self.error(&format!("reading key {key}"), e))?;
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Error::Failed(format!(
                "remote {}: key {key}: corrupt record: {e}",
                self.cfg.url
            ))
        })
    }

    /// Every key of `cache` on the remote with its last-modified time (ms), unordered.
    ///
    /// Errors: [`Error::Failed`] naming the remote.
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
    /// Errors: [`Error::Failed`] naming the remote.
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
    /// Errors: [`Error::Failed`] naming the remote, or the manifest when it is corrupt or
    /// belongs to another project/cache.
    pub async fn manifest(
        &self,
        project: &ProjectId,
        cache: &CacheId,
        layer: &LayerId,
    ) -> Result<(RemoteManifest, u64)> {
        let path = self.layout.manifest(project, layer);
        let what = format!("reading the manifest of layer {layer}");
        let bytes = self
            .store
            .get(&path)
            .await
            .map_err(|e| self.error(&what, e))?
            .bytes()
            .await
            .map_err(|e| self.error(&what, e))?;
        let m: RemoteManifest = serde_json::from_slice(&bytes).map_err(|e| {
            Error::Failed(format!(
                "remote {}: layer {layer}: corrupt manifest: {e}",
                self.cfg.url
            ))
        })?;
        m.validate()?;
        if &m.layer.project != project || &m.layer.cache != cache || &m.layer.layer != layer {
            return Err(Error::Failed(format!(
                "remote {}: manifest {path} is of {}/{} layer {}, not {project}/{cache} layer {layer}",
                self.cfg.url, m.layer.project, m.layer.cache, m.layer.layer
            )));
        }
        Ok((m, bytes.len() as u64))
    }

    /// Pulls the layer `found` names into `store` and publishes it locally under
    /// `found.key`. Objects already in the project (same bytes and metadata) are linked; same
    /// bytes with other metadata are copied locally; only the rest is downloaded.
    ///
    /// Errors: [`Error::Failed`] naming the remote or a corrupt object; [`Error::Io`] locally.
    /// On error nothing is published and the objects this pull created are removed.
    pub fn pull(
        &self,
        store: &Store,
        pd: &ProjectDirs,
        cache: &CacheId,
        found: &Found,
    ) -> Result<PullReport> {
        let t0 = Instant::now();
        let layer = &found.record.layer;
        let (manifest, manifest_bytes) =
            self.block_on(None, self.manifest(&pd.project, cache, layer))?;
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
            self.build(pd, objects, &manifest, tree, &mut report)
        })?;
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
        m: &RemoteManifest,
        tree: &Path,
        report: &mut PullReport,
    ) -> Result<TreeStats> {
        let mut stats = TreeStats {
            counts: m.layer.counts,
            dropped: m.layer.dropped.clone(),
            ..Default::default()
        };
        stats.counts.new_objects = 0;
        stats.counts.new_bytes = 0;
        let r = self.build_inner(pd, objects, m, tree, report, &mut stats);
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
        m: &RemoteManifest,
        tree: &Path,
        report: &mut PullReport,
        stats: &mut TreeStats,
    ) -> Result<()> {
        // What the project holds: by (content, tag) and by content alone.
        let mut exact: HashMap<(ObjectId, u64), PathBuf> = HashMap::new();
        let mut by_content: HashMap<ObjectId, PathBuf> = HashMap::new();
        for (path, id, _) in objects.list()? {
            if let Some(tag) = object_tag(&path) {
                exact.entry((id, tag)).or_insert_with(|| path.clone());
            }
            by_content.entry(id).or_insert(path);
        }
        // What the tree needs: (content, tag) → the first entry with that metadata.
        let mut need: HashMap<(ObjectId, u64), &Entry> = HashMap::new();
        let mut sizes: HashMap<ObjectId, u64> = HashMap::new();
        for e in &m.entries {
            if let Some((id, size)) = e.object()? {
                need.entry((id, e.meta_tag()?)).or_insert(e);
                sizes.insert(id, size);
            }
        }
        report.objects = sizes.len() as u64;
        let mut missing: Vec<(ObjectId, u64)> = sizes
            .iter()
            .filter(|(id, _)| !by_content.contains_key(id))
            .map(|(id, s)| (*id, *s))
            .collect();
        missing.sort();
        // Download into temp files in objects/ (same filesystem: renamed into place below).
        let tmp_dir = objects.dir().to_path_buf();
        let downloads = TempFiles::default();
        let t = Instant::now();
        let packed_at = m.pack_locations()?;
        let (packed, alone): (Vec<_>, Vec<_>) = missing
            .iter()
            .copied()
            .partition(|(id, _)| packed_at.contains_key(id));
        let packed: Vec<_> = packed
            .into_iter()
            .map(|(id, _)| (id, packed_at[&id].clone()))
            .collect();
        let temp = |id: &ObjectId| downloads.path(&tmp_dir, id);
        let mut fetched = self.block_on(
            None,
            self.download_all(&pd.project, &alone, &tmp_dir, &downloads),
        )?;
        tracing::debug!(
            objects = alone.len(),
            ms = t.elapsed().as_millis() as u64,
            "large objects fetched"
        );
        fetched.extend(self.block_on(None, self.download_packed(&pd.project, &packed, &temp))?);
        tracing::info!(
            objects = missing.len(),
            ms = t.elapsed().as_millis() as u64,
            "pull: downloaded"
        );
        let t = Instant::now();
        for (id, _) in &missing {
            report.pulled_objects += 1;
            report.pulled_bytes += sizes[id];
        }
        let mut fresh: HashMap<ObjectId, PathBuf> = fetched.into_iter().collect();
        // Create every (content, tag) object the project lacks, on several threads: first one
        // object per downloaded or locally held content, then the other metadata variants of
        // downloaded content (copies of the first).
        let mut keys: Vec<_> = need
            .keys()
            .copied()
            .filter(|k| !exact.contains_key(k))
            .collect();
        keys.sort();
        let (mut first, mut later) = (Vec::new(), Vec::new());
        for (id, tag) in keys {
            match fresh.remove(&id) {
                Some(t) => first.push((id, tag, Source::Temp(t))),
                None => match by_content.get(&id) {
                    Some(p) => first.push((id, tag, Source::Copy(p.clone()))),
                    None => later.push((id, tag)),
                },
            }
        }
        let place = |(id, tag, src): &(ObjectId, u64, Source)| -> Result<(ObjectId, u64, bool)> {
            let tmp = match src {
                Source::Temp(t) => t.clone(),
                Source::Copy(from) => {
                    let t = downloads.path(&tmp_dir, id);
                    fs::copy(from, &t).at(&t)?;
                    t
                }
            };
            let made = make_object(objects, id, *tag, &tmp, need[&(*id, *tag)])?;
            Ok((*id, *tag, made))
        };
        let threads = std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(2, 8);
        let mut placed = par_try(&first, threads, place)?;
        for (id, _, src) in &first {
            if matches!(src, Source::Copy(_)) {
                report.copied_objects += 1;
            }
            by_content
                .entry(*id)
                .or_insert_with(|| objects.path_for(id, first_tag(&first, id)));
        }
        let later: Vec<_> = later
            .into_iter()
            .map(|(id, tag)| {
                let from = by_content
                    .get(&id)
                    .cloned()
                    .ok_or_else(|| Error::Failed(format!("object {id}: not fetched")))?;
                Ok((id, tag, Source::Copy(from)))
            })
            .collect::<Result<_>>()?;
        placed.extend(par_try(&later, threads, place)?);
        report.copied_objects += later.len() as u64;
        for (id, tag, made) in placed {
            let dst = objects.path_for(&id, tag);
            if made {
                stats.counts.new_objects += 1;
                stats.counts.new_bytes += sizes[&id];
                stats.created_objects.push(dst.clone());
            }
            exact.insert((id, tag), dst);
        }
        tracing::info!(
            ms = t.elapsed().as_millis() as u64,
            "pull: objects in place"
        );
        let t = Instant::now();
        // The tree, parents first; directories get their final metadata last (deepest first),
        // so creating children does not disturb their times or need write permission.
        let path_of = |e: &Entry| {
            if e.path.is_empty() {
                tree.to_path_buf()
            } else {
                tree.join(&e.path)
            }
        };
        let mut dirs = Vec::new();
        let mut rest = Vec::new();
        for e in &m.entries {
            if e.kind == Kind::Dir {
                let dst = path_of(e);
                fs::create_dir(&dst).at(&dst)?;
                dirs.push((dst, e));
            } else {
                rest.push(e);
            }
        }
        par_try(&rest, threads, |e: &&Entry| -> Result<()> {
            let dst = path_of(e);
            match &e.kind {
                Kind::File { .. } => {
                    let (id, _) = e.object()?.expect("a file has an object");
                    let obj = &exact[&(id, e.meta_tag()?)];
                    objects.link_object(obj, &dst)?;
                }
                Kind::Symlink { target } => {
                    std::os::unix::fs::symlink(target, &dst).at(&dst)?;
                    apply_meta(&dst, e)?;
                }
                Kind::Fifo => {
                    sys::mkfifo(&dst, e.mode).at(&dst)?;
                    apply_meta(&dst, e)?;
                }
                Kind::Dir => {}
            }
            Ok(())
        })?;
        for (dst, e) in dirs.iter().rev() {
            apply_meta(dst, e)?;
        }
        tracing::info!(ms = t.elapsed().as_millis() as u64, "pull: tree built");
        Ok(())
    }

    /// Downloads `ids` (with their sizes) into temp files under `dir`, at most
    /// `concurrency` at once; returns where each landed.
    async fn download_all(
        &self,
        project: &ProjectId,
        ids: &[(ObjectId, u64)],
        dir: &Path,
        temps: &TempFiles,
    ) -> Result<Vec<(ObjectId, PathBuf)>> {
        futures::stream::iter(ids.iter().map(|(id, size)| {
            let dst = temps.path(dir, id);
            async move {
                self.download(project, id, *size, &dst).await?;
                Ok::<_, Error>((*id, dst))
            }
        }))
        .buffer_unordered(self.cfg.concurrency)
        .try_collect()
        .await
    }

    /// Streams object `id` into `dst` (created, must not exist), hashing on arrival.
    ///
    /// Errors: [`Error::Failed`] when the bytes do not hash to `id` or their length is not
    /// `size` (a corrupt or truncated remote object; `dst` is removed), or on a remote error.
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
            return Err(Error::Failed(format!(
                "remote {}: object {id}: the bytes received ({n} of {size}) do not match its id \
                 (a corrupt remote object; `layercache remote gc` does not repair it: delete it \
                 and push again)",
                self.cfg.url
            )));
        }
        Ok(())
    }
}

/// The tag part of an object file name (`<hex>-<tag>[.<n>]`).
fn object_tag(p: &Path) -> Option<u64> {
    let name = p.file_name()?.to_str()?;
    let tag = name.get(65..81)?;
    u64::from_str_radix(tag, 16).ok()
}

/// Sets owner, xattrs, permission bits and times of `p` from `e` (not following a symlink;
/// permission bits and xattrs are skipped for symlinks). Owner first: chown clears setuid bits.
///
/// Errors: [`Error::Io`] naming `p` (EPERM for another owner when not root).
fn apply_meta(p: &Path, e: &Entry) -> Result<()> {
    std::os::unix::fs::lchown(p, Some(e.uid), Some(e.gid)).at(p)?;
    if !matches!(e.kind, Kind::Symlink { .. }) {
        for (n, v) in e.xattr_bytes()? {
            sys::set_xattr(p, &n, &v).at(p)?;
        }
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(p, fs::Permissions::from_mode(e.mode & 0o7777)).at(p)?;
    }
    sys::set_times_nofollow(p, e.atime, e.mtime).at(p)
}

/// Temp files of one pull (`objects/.pull-<hex>-<random>`), removed on drop if still there.
#[derive(Default)]
struct TempFiles {
    made: parking_lot::Mutex<Vec<PathBuf>>,
}

impl TempFiles {
    fn path(&self, dir: &Path, id: &ObjectId) -> PathBuf {
        let p = dir.join(format!(
            ".pull-{}-{}",
            &id.to_hex()[..16],
            sys::random_hex(6)
        ));
        self.made.lock().push(p.clone());
        p
    }
}

impl Drop for TempFiles {
    fn drop(&mut self) {
        for p in self.made.lock().drain(..) {
            let _ = fs::remove_file(p);
        }
    }
}

impl Remote {
    /// The mount's remote step: find `key` (then `restore_keys`) on the remote within
    /// `lookup_timeout` and pull what was found. Never fails: an unreachable, slow or refusing
    /// remote, or a broken layer, costs one warning and the mount goes on as a local miss.
    pub fn fetch_for_mount(
        &self,
        store: &Store,
        pd: &ProjectDirs,
        cache: &CacheId,
        key: &CacheKey,
        restore_keys: &[CacheKey],
    ) -> Option<PullReport> {
        let found = self.block_on(
            Some(self.cfg.lookup_timeout),
            self.find(&pd.project, cache, key, restore_keys),
        );
        let r = found.and_then(|f| match f {
            Some(f) => self.pull(store, pd, cache, &f).map(Some),
            None => Ok(None),
        });
        match r {
            Ok(rep) => rep,
            Err(e) => {
                self.mark_unhealthy();
                self.warn_once(&format!(
                    "{e}; going on without the remote (a local miss; nothing is pushed this run)"
                ));
                None
            }
        }
    }
}

/// Where the bytes of a new local object come from.
enum Source {
    /// A verified download (moved into place).
    Temp(PathBuf),
    /// A local object with the same bytes (copied).
    Copy(PathBuf),
}

/// The tag of the first object made for `id` in `first`.
fn first_tag(first: &[(ObjectId, u64, Source)], id: &ObjectId) -> u64 {
    first.iter().find(|f| &f.0 == id).map_or(0, |f| f.1)
}

/// Gives the file `tmp` (bytes of object `id`) the metadata of `entry`, checks it now has
/// `tag`, and renames it into place as object (`id`, `tag`) of `objects`. `Ok(false)` when that
/// object existed already (another pull or promotion made it; `tmp` is removed).
///
/// Errors: [`Error::Failed`] when the metadata cannot be reproduced (e.g. another owner when not
/// root); [`Error::Io`] naming the path.
fn make_object(
    objects: &LocalObjects,
    id: &ObjectId,
    tag: u64,
    tmp: &Path,
    entry: &Entry,
) -> Result<bool> {
    apply_meta(tmp, entry)?;
    let got = meta_tag(tmp, &fs::symlink_metadata(tmp).at(tmp)?).at(tmp)?;
    if got != tag {
        return Err(Error::Failed(format!(
            "{}: metadata of {:?} could not be reproduced (owner {}:{} mode {:o}; run as root?)",
            tmp.display(),
            entry.path,
            entry.uid,
            entry.gid,
            entry.mode
        )));
    }
    let dst = objects.path_for(id, tag);
    // The fan-out directory is made on the first ENOENT only (not one mkdir per object).
    let renamed = match sys::rename_noreplace(tmp, &dst) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) && tmp.exists() => {
            if let Some(parent) = dst.parent() {
                fs::create_dir_all(parent).at(parent)?;
            }
            sys::rename_noreplace(tmp, &dst)
        }
        r => r,
    };
    match renamed {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            let _ = fs::remove_file(tmp);
            Ok(false)
        }
        Err(e) => Err(Error::io(&dst, e)),
    }
}

/// Runs `f` over `items` on up to `threads` threads (filesystem work that waits on the disk
/// more than on the CPU); the first error wins and stops the others early.
fn par_try<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results: Vec<Result<Vec<R>>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    while !failed.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        match f(item) {
                            Ok(r) => out.push(r),
                            Err(e) => {
                                failed.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                        }
                    }
                    Ok(out)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(Error::Failed("a pull thread panicked".into())))
            })
            .collect()
    });
    let mut all = Vec::new();
    for r in results {
        all.extend(r?);
    }
    Ok(all)
}
