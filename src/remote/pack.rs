//! Packs: small objects uploaded back to back in one remote object (`packs/<pack>.pack`, named
//! by the blake3 of its bytes) with an index (`packs/<pack>.idx`, written after the pack), so a
//! layer of many small files costs a few requests each way (restic/kopia/git packfiles). A pull
//! fetches only the byte ranges of the objects it lacks (object_store coalesces near ranges)
//! and verifies each object's blake3 on arrival.

use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;

use bytes::{Buf, Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use object_store::{GetOptions, GetRange, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use super::Remote;
use super::error::RemoteError;
use super::manifest::Location;
use super::unpack::{Arrived, writers_stopped};
use crate::error::{Error, IoContext, Result};
use crate::ids::{ObjectId, ProjectId};

/// `packs/<pack>.idx`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PackIndex {
    /// `(object hex, offset, length)` in pack order.
    pub objects: Vec<(String, u64, u64)>,
}

/// Pack ranges downloading at once.
const PACK_PARALLEL: usize = 8;

/// Wanted ranges of a pack at most this many bytes apart are fetched as one range (the gap is
/// read and dropped), as object_store's `get_ranges` coalesces.
const COALESCE: u64 = 1 << 20;

impl Remote {
    /// Where every packed object of `project` is, from the index of every pack (a pack counts
    /// only once its bytes and its index are both there: the index is written after the pack).
    ///
    /// Errors: [`RemoteError`] naming the remote.
    pub async fn pack_locations(&self, project: &ProjectId) -> Result<HashMap<ObjectId, Location>> {
        let listed = self.list_dir(&self.layout.packs(project)).await?;
        let names: std::collections::HashSet<String> = listed
            .iter()
            .filter_map(|m| m.location.filename().map(str::to_string))
            .collect();
        let packs: Vec<String> = names
            .iter()
            .filter_map(|n| n.strip_suffix(".idx"))
            .filter(|p| names.contains(&format!("{p}.pack")))
            .map(str::to_string)
            .collect();
        let indexes = futures::stream::iter(packs.into_iter().map(|pack| async move {
            let path = self.layout.pack_index(project, &pack);
            let bytes = self
                .store
                .get(&path)
                .await
                .map_err(|e| self.error("reading a pack index", e))?
                .bytes()
                .await
                .map_err(|e| self.error("reading a pack index", e))?;
            let idx: PackIndex =
                serde_json::from_slice(&bytes).map_err(|e| RemoteError::Corrupt {
                    url: self.cfg.url.clone(),
                    what: format!("pack index {path}"),
                    detail: format!("it does not parse: {e}"),
                })?;
            Ok::<_, Error>((pack, idx))
        }))
        .buffer_unordered(self.cfg.concurrency)
        .try_collect::<Vec<_>>()
        .await?;
        let mut out = HashMap::new();
        for (pack, idx) in indexes {
            for (hex, offset, len) in idx.objects {
                if let Ok(id) = ObjectId::from_hex(&hex) {
                    let loc = Location {
                        pack: pack.clone(),
                        offset,
                        len,
                    };
                    out.entry(id).or_insert(loc);
                }
            }
        }
        Ok(out)
    }

    /// Uploads `objects` (id, local file, size; in the order given) in packs of about
    /// `pack_size`, each pack before its index; returns where each object now is. Every file is
    /// checked to still hash to its id while it is read (a damaged local file is never sent).
    ///
    /// Errors: [`Error::Io`] reading a file, [`Error::Failed`] for a local file that no longer
    /// matches its id, [`RemoteError`] naming the remote.
    pub async fn upload_packs(
        &self,
        project: &ProjectId,
        objects: &[(ObjectId, PathBuf, u64)],
    ) -> Result<HashMap<ObjectId, Location>> {
        let mut groups: Vec<&[(ObjectId, PathBuf, u64)]> = Vec::new();
        let (mut start, mut bytes) = (0, 0u64);
        for (i, o) in objects.iter().enumerate() {
            if bytes > 0 && bytes + o.2 > self.cfg.pack_size {
                groups.push(&objects[start..i]);
                (start, bytes) = (i, 0);
            }
            bytes += o.2;
        }
        if start < objects.len() {
            groups.push(&objects[start..]);
        }
        let placed =
            futures::stream::iter(groups.into_iter().map(|g| self.upload_pack(project, g)))
                .buffer_unordered(PACK_PARALLEL.min(self.cfg.concurrency))
                .try_collect::<Vec<_>>()
                .await?;
        Ok(placed.into_iter().flatten().collect())
    }

    async fn upload_pack(
        &self,
        project: &ProjectId,
        group: &[(ObjectId, PathBuf, u64)],
    ) -> Result<Vec<(ObjectId, Location)>> {
        let mut buf = Vec::with_capacity(group.iter().map(|g| g.2 as usize).sum());
        let mut index = PackIndex::default();
        for (id, path, _) in group {
            let bytes = fs::read(path).at(path)?;
            if blake3::hash(&bytes).as_bytes() != &id.0 {
                return Err(Error::Failed(format!(
                    "{}: its bytes no longer hash to object {id}; not pushed (run `layercache \
                     verify`)",
                    path.display()
                )));
            }
            index
                .objects
                .push((id.to_hex(), buf.len() as u64, bytes.len() as u64));
            buf.extend_from_slice(&bytes);
        }
        let pack = blake3::hash(&buf).to_hex().to_string();
        let what = format!("uploading pack {pack}");
        self.store
            .put(&self.layout.pack(project, &pack), PutPayload::from(buf))
            .await
            .map_err(|e| self.error(&what, e))?;
        let idx = serde_json::to_vec(&index).map_err(|e| Error::Failed(e.to_string()))?;
        self.store
            .put(
                &self.layout.pack_index(project, &pack),
                PutPayload::from(idx),
            )
            .await
            .map_err(|e| self.error(&what, e))?;
        Ok(index
            .objects
            .into_iter()
            .zip(group)
            .map(|((_, offset, len), (id, _, _))| {
                let loc = Location {
                    pack: pack.clone(),
                    offset,
                    len,
                };
                (*id, loc)
            })
            .collect())
    }

    /// Fetches the packed objects `wanted` (id, where): the ranges of one pack that lie
    /// within [`COALESCE`] bytes of each other are one streamed ranged GET, `PACK_PARALLEL`
    /// GETs at once; each object's bytes go to the writers on `tx` as soon as they have arrived
    /// (the writers verify blake3 and length).
    ///
    /// Errors: a remote error; [`RemoteError::Corrupt`] when a pack ends early;
    /// [`Error::Failed`] when the writers stopped.
    pub(super) async fn download_packed(
        &self,
        project: &ProjectId,
        wanted: &[(ObjectId, Location)],
        tx: tokio::sync::mpsc::Sender<Arrived>,
    ) -> Result<()> {
        let mut by_pack: HashMap<&str, Vec<&(ObjectId, Location)>> = HashMap::new();
        for w in wanted {
            by_pack.entry(w.1.pack.as_str()).or_default().push(w);
        }
        let mut groups: Vec<Vec<&(ObjectId, Location)>> = Vec::new();
        for (_, mut objs) in by_pack {
            // An empty object sits at the offset of the object after it: it sorts first.
            objs.sort_by_key(|o| (o.1.offset, o.1.len));
            let mut end = 0;
            for o in objs {
                match groups.last_mut() {
                    Some(g) if g[0].1.pack == o.1.pack && o.1.offset <= end + COALESCE => g.push(o),
                    _ => groups.push(vec![o]),
                }
                end = end.max(o.1.offset + o.1.len);
            }
        }
        futures::stream::iter(groups.into_iter().map(|g| {
            let tx = tx.clone();
            async move { self.stream_group(project, &g, &tx).await }
        }))
        .buffer_unordered(PACK_PARALLEL.min(self.cfg.concurrency))
        .try_collect::<Vec<()>>()
        .await
        .map(|_| ())
    }

    /// One ranged GET over the objects `g` (of one pack, by offset then length, not
    /// overlapping; an empty object may share the offset of the next), cut into objects as the
    /// bytes arrive.
    ///
    /// Errors: a remote error; [`RemoteError::Corrupt`] when the pack ends early or its index
    /// makes two objects overlap; [`Error::Failed`] when the writers stopped.
    async fn stream_group(
        &self,
        project: &ProjectId,
        g: &[&(ObjectId, Location)],
        tx: &tokio::sync::mpsc::Sender<Arrived>,
    ) -> Result<()> {
        let pack = g[0].1.pack.as_str();
        let start = g[0].1.offset;
        let end = g
            .iter()
            .map(|o| o.1.offset + o.1.len)
            .max()
            .unwrap_or(start);
        let send = |id: ObjectId, b: Bytes| async move {
            tx.send(Arrived::Bytes(id, b))
                .await
                .map_err(|_| writers_stopped())
        };
        if start == end {
            for o in g {
                send(o.0, Bytes::new()).await?;
            }
            return Ok(());
        }
        let what = format!("downloading pack {pack}");
        let t = std::time::Instant::now();
        let opts = GetOptions {
            range: Some(GetRange::Bounded(start..end)),
            ..Default::default()
        };
        let mut stream = self
            .store
            .get_opts(&self.layout.pack(project, pack), opts)
            .await
            .map_err(|e| self.error(&what, e))?
            .into_stream();
        let mut buf = BytesMut::new();
        let mut pos = start; // pack offset of buf[0]
        let mut next = g.iter().peekable();
        while let Some(chunk) = stream.next().await {
            buf.extend_from_slice(&chunk.map_err(|e| self.error(&what, e))?);
            while let Some(o) = next.peek() {
                if o.1.len == 0 {
                    send(o.0, Bytes::new()).await?;
                    next.next();
                    continue;
                }
                // Objects of one pack never overlap: an index that says so is corrupt.
                let Some(skip) = o.1.offset.checked_sub(pos) else {
                    return Err(RemoteError::Corrupt {
                        url: self.cfg.url.clone(),
                        what: format!("pack {pack}"),
                        detail: format!("object {} overlaps the one before it", o.0),
                    }
                    .into());
                };
                let skip = skip as usize;
                if buf.len() < skip + o.1.len as usize {
                    break;
                }
                buf.advance(skip);
                let bytes = buf.split_to(o.1.len as usize).freeze();
                pos = o.1.offset + o.1.len;
                send(o.0, bytes).await?;
                next.next();
            }
        }
        if next.peek().is_some() {
            return Err(RemoteError::Corrupt {
                url: self.cfg.url.clone(),
                what: format!("pack {pack}"),
                detail: format!("it ended before byte {end}"),
            }
            .into());
        }
        tracing::debug!(
            pack,
            objects = g.len(),
            ms = t.elapsed().as_millis() as u64,
            "pack range fetched"
        );
        Ok(())
    }
}
