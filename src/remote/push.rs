//! Push: the objects the remote lacks, then the manifest, then the key with a conditional
//! create — so a key never exists without its manifest and objects, and is never overwritten.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::Serialize;

use super::Remote;
use super::error::{self, classify};
use super::manifest::{KeyRecord, Kind, RemoteManifest, from_layer};
use super::pieces;
use crate::error::{Error, IoContext, Result};
use crate::ids::{CacheId, CacheKey, LayerId, ObjectId, ProjectId};
use crate::store::ProjectDirs;

/// Files up to this size are uploaded with one PUT; larger ones stream as a multipart upload.
const SINGLE_PUT_MAX: u64 = 8 << 20;

/// What a push did.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct PushReport {
    /// The key.
    pub key: String,
    /// The layer.
    pub layer: String,
    /// `pushed`, or `exists` when the remote already had the key (another machine won).
    pub result: String,
    /// Distinct objects of the layer.
    pub objects: u64,
    /// Objects uploaded (the rest were on the remote already).
    pub uploaded_objects: u64,
    /// Bytes uploaded (objects only).
    pub uploaded_bytes: u64,
    /// Manifest bytes.
    pub manifest_bytes: u64,
    /// Milliseconds.
    pub ms: u64,
    /// The remote's key salt of the project is not this store's (the remote had one before
    /// this store's first push there): runners that use the remote key with its salt, so they
    /// compute other keys than this store did and do not find this one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub salt_differs: bool,
}

impl PushReport {
    /// One human line.
    pub fn summary(&self, url: &str) -> String {
        let line = self.outcome(url);
        match self.salt_differs {
            true => format!(
                "{line}; but the remote's key salt of the project is not this store's, so \
                 runners of the remote compute other keys and do not find this one"
            ),
            false => line,
        }
    }

    /// What happened to the key, in words.
    fn outcome(&self, url: &str) -> String {
        match self.result.as_str() {
            "exists" => format!(
                "remote {url} already has key {} (another runner published it first); nothing \
                 pushed but {} object(s) ({} bytes) already sent",
                self.key, self.uploaded_objects, self.uploaded_bytes
            ),
            _ => format!(
                "pushed key {} to remote {url}: {} of {} object(s) uploaded ({} bytes) in {} ms",
                self.key, self.uploaded_objects, self.objects, self.uploaded_bytes, self.ms
            ),
        }
    }
}

/// The objects a layer's regular files link, one local path each (the tree's file).
struct LayerObjects {
    /// Object id → (its file in the layer's tree, bytes).
    files: HashMap<ObjectId, (PathBuf, u64)>,
    /// The ids in tree order: a pack then holds neighbouring files.
    order: Vec<ObjectId>,
}

impl LayerObjects {
    /// The objects of manifest `m`, whose tree is at `tree`.
    ///
    /// Errors: [`Error::Failed`] for an entry with a malformed object id.
    fn of(m: &RemoteManifest, tree: &Path) -> Result<LayerObjects> {
        let mut files: HashMap<ObjectId, (PathBuf, u64)> = HashMap::new();
        let mut order = Vec::new();
        for e in &m.entries {
            if let (Kind::File { size, .. }, Some((id, _))) = (&e.kind, e.object()?) {
                files.entry(id).or_insert_with(|| {
                    order.push(id);
                    (tree.join(&e.path), *size)
                });
            }
        }
        Ok(LayerObjects { files, order })
    }
}

impl Remote {
    /// Pushes local layer `layer` of `pd` under `cache`/`key` (see the module docs), after
    /// making the store's key salt of the project the remote's when the remote has none
    /// ([`Remote::establish_salt`]).
    ///
    /// Errors: [`super::RemoteError`] naming the remote; [`Error::Io`] reading the layer;
    /// [`Error::Failed`] when a local file no longer matches its object id (it is never sent).
    pub fn push_layer(
        &self,
        pd: &ProjectDirs,
        cache: &CacheId,
        key: &CacheKey,
        layer: &LayerId,
    ) -> Result<PushReport> {
        let t0 = Instant::now();
        let mut m = from_layer(pd, layer)?;
        let project = &pd.project;
        let mut report = PushReport {
            key: key.to_string(),
            layer: layer.to_string(),
            ..Default::default()
        };
        let objects = LayerObjects::of(&m, &pd.layer(layer).tree())?;
        report.objects = objects.files.len() as u64;
        let record = KeyRecord {
            layer: layer.clone(),
            created_ms: m.layer.created_ms,
            bytes: m.layer.counts.bytes,
            files: m.layer.counts.files,
            objects: objects.files.len() as u64,
            inputs: pd.read_inputs(cache, key.as_str()),
        };
        self.block_on(None, async {
            // The salt the key was made with goes first, when the remote has none: a fresh
            // runner adopts the remote's salt, and must compute the keys pushed here.
            report.salt_differs = self.establish_salt(pd).await? == Some(false);
            if self.key_record(project, cache, key).await?.is_some() {
                report.result = "exists".into();
                return Ok(());
            }
            let (n, bytes) = self.upload_objects(project, &objects, &mut m).await?;
            report.uploaded_objects = n;
            report.uploaded_bytes = bytes;
            let pieces = self.piece_table(&objects)?;
            let body = serde_json::to_vec(&m).map_err(|e| Error::Failed(e.to_string()))?;
            let wire = super::compact::to_wire(&m)?;
            let compact = super::compact::encode_wire(&wire)?;
            let tree = super::compact::encode_tree(&wire, &compact)?;
            drop(wire);
            report.manifest_bytes = body.len() as u64;
            // JSON first (every version reads it), then the compact form (what a pull of
            // this version reads first), then the tree (what a lazy mount reads first: it
            // names the compact form), then the piece table of its big objects if it has
            // any, then the key.
            for (path, body, what) in [
                (
                    self.layout.manifest(project, layer),
                    body,
                    "writing the manifest",
                ),
                (
                    self.layout.compact_manifest(project, layer),
                    compact,
                    "writing the compact manifest",
                ),
                (
                    self.layout.tree_manifest(project, layer),
                    tree,
                    "writing the tree manifest",
                ),
            ]
            .into_iter()
            .chain(pieces.map(|p| {
                (
                    self.layout.pieces(project, layer),
                    p,
                    "writing the piece table",
                )
            })) {
                self.store
                    .put(&path, PutPayload::from(body))
                    .await
                    .map_err(|e| self.error(what, e))?;
            }
            report.result = self.create_key(project, cache, key, &record).await?.into();
            Ok(())
        })?;
        report.ms = t0.elapsed().as_millis() as u64;
        Ok(report)
    }

    /// Uploads the `objects` of manifest `m` the remote lacks, small ones (up to a quarter of
    /// the pack size) in packs (reusing any pack that holds them already), large ones alone,
    /// `concurrency` at a time; records in `m` the pack that holds each small object. Returns
    /// the objects and bytes uploaded.
    ///
    /// Errors: [`super::RemoteError`] naming the remote; [`Error::Failed`] when a local file
    /// no longer matches its object id.
    async fn upload_objects(
        &self,
        project: &ProjectId,
        objects: &LayerObjects,
        m: &mut RemoteManifest,
    ) -> Result<(u64, u64)> {
        let LayerObjects { files, order } = objects;
        let small = |size: u64| size <= self.cfg.pack_size / 4;
        // Small objects: reuse any pack that holds them, pack the rest.
        let mut located = self.pack_locations(project).await?;
        let new_small: Vec<(ObjectId, PathBuf, u64)> = order
            .iter()
            .filter(|id| small(files[*id].1) && !located.contains_key(*id))
            .map(|id| (*id, files[id].0.clone(), files[id].1))
            .collect();
        located.extend(self.upload_packs(project, &new_small).await?);
        // Large objects: alone, uploaded unless the remote has them.
        let large: Vec<&ObjectId> = order.iter().filter(|id| !small(files[*id].1)).collect();
        let have = self.remote_objects(project, large.iter().copied()).await?;
        let mut todo: Vec<(ObjectId, PathBuf, u64)> = large
            .into_iter()
            .filter(|id| !have.contains(*id))
            .map(|id| (*id, files[id].0.clone(), files[id].1))
            .collect();
        todo.sort_by_key(|t| t.0);
        futures::stream::iter(
            todo.iter()
                .map(|(id, p, s)| self.upload(project, id, p, *s)),
        )
        .buffer_unordered(self.cfg.concurrency)
        .try_collect::<Vec<()>>()
        .await?;
        for id in order.iter().filter(|id| small(files[*id].1)) {
            let loc = &located[id];
            m.packs
                .entry(loc.pack.clone())
                .or_default()
                .push((id.to_hex(), loc.offset, loc.len));
        }
        let n = (todo.len() + new_small.len()) as u64;
        Ok((n, todo.iter().chain(&new_small).map(|t| t.2).sum()))
    }

    /// The piece table (`pieces.rs`) of the `objects` stored alone that are longer than one
    /// piece, encoded; `None` when there is none. Reads each such file once more.
    ///
    /// Errors: [`Error::Io`] reading a file; [`Error::Failed`] when a file no longer matches
    /// its object id (it is never described).
    fn piece_table(&self, objects: &LayerObjects) -> Result<Option<Vec<u8>>> {
        let alone = |size: u64| size > self.cfg.pack_size / 4 && size > pieces::PIECE_LEN;
        let mut table = pieces::Table::new();
        for id in objects
            .order
            .iter()
            .filter(|id| alone(objects.files[*id].1))
        {
            let (path, size) = &objects.files[id];
            let f = std::fs::File::open(path).at(path)?;
            let cvs =
                pieces::cvs_of(std::io::BufReader::with_capacity(1 << 20, f), *size).at(path)?;
            if !pieces::matches(&cvs, *size, &id.0) {
                return Err(Error::Failed(format!(
                    "{}: its bytes no longer hash to object {id}; not pushed (run `layercache verify`)",
                    path.display()
                )));
            }
            table.push((id.0, cvs));
        }
        if table.is_empty() {
            return Ok(None);
        }
        pieces::encode(&table).map(Some)
    }

    /// Creates the key `cache`/`key` of `project` on the remote with `record`, create-only:
    /// `pushed`, or `exists` when another runner's key is there already (409/412).
    ///
    /// Errors: [`super::RemoteError`] naming the remote and the key.
    async fn create_key(
        &self,
        project: &ProjectId,
        cache: &CacheId,
        key: &CacheKey,
        record: &KeyRecord,
    ) -> Result<&'static str> {
        let kpath = self.layout.key(project, cache, key);
        let rec = serde_json::to_vec(record).map_err(|e| Error::Failed(e.to_string()))?;
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&kpath, PutPayload::from(rec), opts)
            .await
        {
            Ok(_) => Ok("pushed"),
            // Create-only: 409/412 means another runner's key is there already.
            Err(e) if classify(&e) == error::Kind::Conflict => Ok("exists"),
            Err(e) => Err(self.error(&format!("creating key {key}"), e)),
        }
    }

    /// Which of `ids` the remote has: one listing per fan-out directory they fall in (at most
    /// 256, `concurrency` at a time), not one request per object.
    ///
    /// Errors: [`super::RemoteError`] naming the remote.
    pub async fn remote_objects(
        &self,
        project: &ProjectId,
        ids: impl Iterator<Item = &ObjectId>,
    ) -> Result<HashSet<ObjectId>> {
        let fans: HashSet<String> = ids.map(|id| id.to_hex()[..2].to_string()).collect();
        let lists = futures::stream::iter(fans.into_iter().map(|fan| {
            let dir = self.layout.object_fan(project, &fan);
            async move {
                let metas = self.list_dir(&dir).await?;
                Ok::<_, Error>(
                    metas
                        .into_iter()
                        .filter_map(|m| ObjectId::from_hex(m.location.filename()?).ok())
                        .collect::<Vec<_>>(),
                )
            }
        }))
        .buffer_unordered(self.cfg.concurrency)
        .try_collect::<Vec<_>>()
        .await?;
        Ok(lists.into_iter().flatten().collect())
    }

    /// Uploads the file at `path` as object `id`, checking on the way that its bytes still
    /// hash to `id` (a file changed or damaged locally is never sent; a multipart upload is
    /// aborted then).
    async fn upload(
        &self,
        project: &ProjectId,
        id: &ObjectId,
        path: &PathBuf,
        size: u64,
    ) -> Result<()> {
        let dst = self.layout.object(project, id);
        let what = format!("uploading object {id}");
        let mismatch = || {
            Error::Failed(format!(
                "{}: its bytes no longer hash to object {id}; not pushed (run `layercache verify`)",
                path.display()
            ))
        };
        if size <= SINGLE_PUT_MAX {
            let bytes = std::fs::read(path).at(path)?;
            if blake3::hash(&bytes).as_bytes() != &id.0 {
                return Err(mismatch());
            }
            self.store
                .put(&dst, PutPayload::from(bytes))
                .await
                .map_err(|e| self.error(&what, e))?;
            return Ok(());
        }
        let mut f = std::fs::File::open(path).at(path)?;
        let mut up = self
            .store
            .put_multipart(&dst)
            .await
            .map_err(|e| self.error(&what, e))?;
        let mut h = blake3::Hasher::new();
        let part = 8 << 20;
        loop {
            let mut buf = Vec::with_capacity(part);
            let n = (&mut f).take(part as u64).read_to_end(&mut buf).at(path)?;
            if n == 0 {
                break;
            }
            h.update(&buf);
            if let Err(e) = up.put_part(PutPayload::from(buf)).await {
                let _ = up.abort().await;
                return Err(self.error(&what, e));
            }
        }
        if h.finalize().as_bytes() != &id.0 {
            let _ = up.abort().await;
            return Err(mismatch());
        }
        up.complete().await.map_err(|e| self.error(&what, e))?;
        Ok(())
    }
}
